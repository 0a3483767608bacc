/* The HTTP side: libmicrohttpd in thread-per-connection mode (a connection's thread may block
 * while its job runs), routing, limits, auth, and the route handlers. */
#ifndef TS_SERVE_HTTP_H
#define TS_SERVE_HTTP_H

#include "serve/budget.h"
#include "serve/deadline.h"
#include "serve/lora.h"
#include "serve/metrics.h"
#include "serve/openai.h"
#include "serve/responses_store.h"
#include "serve/serve.h"
#include "serve/worker.h"

#include <microhttpd.h>
#include <stdatomic.h>

enum {
    ROUTE_CHAT,
    ROUTE_COMPLETIONS,
    ROUTE_MODELS,
    ROUTE_HEALTH,
    ROUTE_METRICS,
    ROUTE_TOKENIZE,
    ROUTE_DETOKENIZE,
    ROUTE_RESPONSES,
    ROUTE_MODEL,    /* GET /v1/models/{id} */
    ROUTE_RESPONSE, /* GET /v1/responses/{id} */
    ROUTE_EMBEDDINGS,
    ROUTE_INFILL,
    ROUTE_RESPONSE_ITEMS, /* GET /v1/responses/{id}/input_items */
    ROUTE_PROPS,          /* GET /props (llama-server's) */
    ROUTE_APPLY_TEMPLATE, /* POST /apply-template (llama-server's) */
    ROUTE_MESSAGES,       /* POST /v1/messages (Anthropic's) */
    ROUTE_MESSAGES_COUNT, /* POST /v1/messages/count_tokens (Anthropic's) */
    ROUTE_COMPLETION,     /* POST /completion (llama-server's own completion) */
    ROUTE_LORA_ADAPTERS,  /* GET, POST /lora-adapters (llama-server's) */
    ROUTE_UNKNOWN
};

typedef struct {
    serve_opts o;
    serve_worker *worker;
    serve_metrics metrics;
    struct MHD_Daemon *daemon;
    /* the names a request's "model" may use (NULL-terminated; the first is the model's id),
     * ending in "*" with --any-model (serve_check_model) */
    const char *model_ids[SERVE_MAX_ALIASES + TS_MAX_LORA + 3];
    long long started;
    atomic_bool shutting_down;
    atomic_int open_jobs; /* generation requests whose response is not finished */
    /* the bodies being parsed and prepared, in bytes (SERVE_PREP_BODIES times the body cap):
     * a body's JSON tree takes up to ~75 times its bytes, so many large bodies parsed at once
     * could take more memory than the machine has */
    serve_budget prep;
    /* the bodies held in memory as received, in bytes that arrived (SERVE_RECV_BODIES times
     * the body cap): one whose bytes stop fitting is dropped and answered 503 */
    serve_budget recv;
    /* each connection's request must arrive within --request-timeout */
    serve_deadlines deadlines;
    serve_rsp_store *rsp_store; /* the Responses API's stored responses */
    serve_lora lora;            /* LoRA adapters: names, default scales */
} serve_server;

#define SERVE_PREP_BODIES 4
#define SERVE_RECV_BODIES 64

/* Per-request state (MHD's con_cls). */
typedef struct {
    serve_server *srv;
    int route;
    bool del;  /* the method is DELETE (ROUTE_RESPONSE); GET otherwise, unless a body comes */
    int phase; /* 0 headers seen, 1 receiving the body */
    ts_strbuf body;
    size_t received;
    bool too_large;
    bool too_many; /* its body did not fit the receive budget */
    /* ROUTE_MODEL, ROUTE_RESPONSE, ROUTE_RESPONSE_ITEMS: the id in the path ("" when longer
     * than this) */
    char model_asked[256];
    int status;
    size_t recv_held; /* bytes of the server's receive budget this request holds */
    size_t prep_held; /* bytes of the server's prep budget this request holds */
} serve_conn;

struct MHD_Daemon *serve_http_start(serve_server *s, unsigned *port);

/* ---- used by the route handlers (routes.c) ---- */
enum MHD_Result serve_send_json(serve_conn *cn, struct MHD_Connection *c, int status, char *json);
enum MHD_Result serve_send_error(serve_conn *cn, struct MHD_Connection *c, const serve_error *e);
/* Queues response r (status) on the connection and lets go of it; every answer goes through
 * here, so each carries the CORS headers (--cors-origins) and is counted by its status. */
enum MHD_Result serve_queue(serve_conn *cn, struct MHD_Connection *c, int status,
                            struct MHD_Response *r);
/* The body is parsed (or will never be): its bytes go back to the receive budget. */
void serve_recv_done(serve_conn *cn);
/* Starts the count of the send timeout again: a stream's chunk that waited on generation. */
void serve_timeout_restart(serve_server *s, struct MHD_Connection *c);
/* True when the client closed its end of the connection. */
bool serve_client_gone(struct MHD_Connection *c);

enum MHD_Result serve_route_post(serve_conn *cn, struct MHD_Connection *c);
/* GET routes, and DELETE (cn->del) for the one that takes it */
enum MHD_Result serve_route_get(serve_conn *cn, struct MHD_Connection *c);

#endif
