#include "serve/http.h"

#include "serve/messages.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

static const struct {
    const char *path;
    const char *method;
} routes[] = {
    [ROUTE_CHAT] = {"/v1/chat/completions", "POST"},
    [ROUTE_COMPLETIONS] = {"/v1/completions", "POST"},
    [ROUTE_MODELS] = {"/v1/models", "GET"},
    [ROUTE_HEALTH] = {"/health", "GET"},
    [ROUTE_METRICS] = {"/metrics", "GET"},
    [ROUTE_TOKENIZE] = {"/tokenize", "POST"},
    [ROUTE_DETOKENIZE] = {"/detokenize", "POST"},
    [ROUTE_RESPONSES] = {"/v1/responses", "POST"},
    [ROUTE_MODEL] = {"/v1/models/{id}", "GET"},
    [ROUTE_RESPONSE] = {"/v1/responses/{id}", "GET, DELETE"},
    [ROUTE_EMBEDDINGS] = {"/v1/embeddings", "POST"},
    [ROUTE_INFILL] = {"/infill", "POST"},
    [ROUTE_RESPONSE_ITEMS] = {"/v1/responses/{id}/input_items", "GET"},
    [ROUTE_PROPS] = {"/props", "GET"},
    [ROUTE_APPLY_TEMPLATE] = {"/apply-template", "POST"},
    [ROUTE_MESSAGES] = {"/v1/messages", "POST"},
    [ROUTE_MESSAGES_COUNT] = {"/v1/messages/count_tokens", "POST"},
    [ROUTE_COMPLETION] = {"/completion", "POST"},
    [ROUTE_LORA_ADAPTERS] = {"/lora-adapters", "GET, POST"},
};

/* The origin a web page must have for the browser to hand it this response (CORS), or NULL:
 * "*" for any, else the request's Origin when --cors-origins lists it. */
static const char *allowed_origin(serve_server *s, struct MHD_Connection *c) {
    const char *list = s->o.cors_origins;
    if (!list || !*list) return NULL;
    if (strcmp(list, "*") == 0) return "*";
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!origin || !*origin) return NULL;
    size_t n = strlen(origin);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len && *p == ' ')
            p++, len--;
        while (len && p[len - 1] == ' ')
            len--;
        if (len == n && strncasecmp(p, origin, n) == 0) return origin;
        if (!end) break;
        p = end + 1;
    }
    return NULL;
}

enum MHD_Result serve_queue(serve_conn *cn, struct MHD_Connection *c, int status,
                            struct MHD_Response *r) {
    serve_server *s = cn->srv;
    const char *origin = allowed_origin(s, c);
    if (origin) MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
    /* a listed origin is echoed: caches must keep the answers of different origins apart */
    if (s->o.cors_origins && *s->o.cors_origins && strcmp(s->o.cors_origins, "*") != 0)
        MHD_add_response_header(r, "Vary", "Origin");
    cn->status = status;
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

/* A CORS preflight (OPTIONS): which method and headers a page may send to the route. It comes
 * before the API key check - browsers send no credentials with it. */
static enum MHD_Result send_preflight(serve_conn *cn, struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    char allow[48];
    snprintf(allow, sizeof allow, "%s, OPTIONS", routes[cn->route].method);
    MHD_add_response_header(r, "Allow", allow);
    if (allowed_origin(cn->srv, c)) {
        const char *asked =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
        MHD_add_response_header(r, "Access-Control-Allow-Methods", allow);
        MHD_add_response_header(r, "Access-Control-Allow-Headers",
                                asked && *asked ? asked : "Authorization, Content-Type");
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    }
    return serve_queue(cn, c, 204, r);
}

enum MHD_Result serve_send_json(serve_conn *cn, struct MHD_Connection *c, int status,
                                char *json) {
    if (!json) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                  "\"server_error\",\"param\":null,\"code\":\"internal_error\"}}";
        json = strdup(oom);
        status = 500;
        if (!json) return MHD_NO;
    }
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(json), json, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(json);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (status == 503) MHD_add_response_header(r, "Retry-After", "1");
    if (status == 405) MHD_add_response_header(r, "Allow", routes[cn->route].method);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    return serve_queue(cn, c, status, r);
}

enum MHD_Result serve_send_error(serve_conn *cn, struct MHD_Connection *c, const serve_error *e) {
    /* the Messages API's routes answer in Anthropic's envelope, whatever refused the request */
    bool anthropic = cn->route == ROUTE_MESSAGES || cn->route == ROUTE_MESSAGES_COUNT;
    return serve_send_json(cn, c, e->status,
                           anthropic ? serve_msg_error_json(e) : serve_error_json(e));
}

/* libmicrohttpd counts a timeout from the last byte moved, and setting one over none starts the
 * count again. */
void serve_timeout_restart(serve_server *s, struct MHD_Connection *c) {
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->o.send_timeout_s);
}

bool serve_client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd p = {ci->connect_fd, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    char b;
    return recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* Constant-time: the time taken does not depend on where the strings differ. */
static bool key_equal(const char *given, const char *want) {
    size_t lg = strlen(given), lw = strlen(want);
    unsigned diff = (unsigned)(lg ^ lw);
    for (size_t i = 0; i < lw; i++) diff |= (unsigned char)want[i] ^ (unsigned char)given[i % (lg ? lg : 1)];
    return diff == 0 && lg == lw;
}

static bool authorized(serve_server *s, struct MHD_Connection *c) {
    if (!s->o.api_key) return true;
    /* Anthropic's clients send the key as x-api-key */
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (x) return key_equal(x, s->o.api_key);
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    h += 7;
    while (*h == ' ') h++;
    return key_equal(h, s->o.api_key);
}

static bool json_content_type(struct MHD_Connection *c) {
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    if (!ct) return false;
    while (*ct == ' ') ct++;
    size_t n = strlen("application/json");
    return strncasecmp(ct, "application/json", n) == 0 &&
           (ct[n] == 0 || ct[n] == ';' || ct[n] == ' ');
}

/* Whether the route takes the method (its list: "GET" or "GET, DELETE"). */
static bool route_takes(int route, const char *method) {
    const char *list = routes[route].method;
    size_t n = strlen(method);
    for (const char *p = list; (p = strstr(p, method)); p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == 0 || p[n] == ',')) return true;
    return false;
}

/* The route of url; for a route with an id in its path, the id (*id, *id_len). */
static int find_route_v1(const char *url, const char **id, size_t *id_len);

/* As find_route_v1, and the OpenAI routes without their /v1 too (/chat/completions,
 * /completions, /embeddings, /models, ...): clients configured with a base URL that lacks it
 * send those, and llama-server and vLLM answer them. */
static int find_route(const char *url, const char **id, size_t *id_len) {
    int r = find_route_v1(url, id, id_len);
    char v1[512];
    if (r != ROUTE_UNKNOWN || strncmp(url, "/v1/", 4) == 0 || strlen(url) + 4 > sizeof v1) return r;
    snprintf(v1, sizeof v1, "/v1%s", url);
    const char *vid = NULL;
    r = find_route_v1(v1, &vid, id_len);
    if (vid) *id = url + (vid - v1) - 3; /* the id where it lies in url */
    return r;
}

static int find_route_v1(const char *url, const char **id, size_t *id_len) {
    static const char models[] = "/v1/models/", responses[] = "/v1/responses/",
                      items[] = "/input_items";
    size_t n = strlen(url), m = sizeof models - 1, r = sizeof responses - 1, k = sizeof items - 1;
    /* a model's id may hold slashes (an alias "org/name"): the rest of the path is the id */
    if (n > m && strncmp(url, models, m) == 0) {
        *id = url + m, *id_len = n - m;
        return ROUTE_MODEL;
    }
    if (n <= r || strncmp(url, responses, r) != 0) {
        for (int i = 0; i < ROUTE_UNKNOWN; i++) /* the routes without an id */
            if (strcmp(url, routes[i].path) == 0) return i;
        return ROUTE_UNKNOWN;
    }
    *id = url + r, *id_len = n - r;
    if (n <= r + k || strcmp(url + n - k, items) != 0) return ROUTE_RESPONSE;
    *id_len -= k;
    return ROUTE_RESPONSE_ITEMS;
}

/* 503 for a body that did not fit beside the others held as received (its bytes read and
 * dropped). */
static enum MHD_Result send_too_many(serve_conn *cn, struct MHD_Connection *c) {
    serve_server *s = cn->srv;
    serve_error e;
    serve_metrics_event(&s->metrics, 0);
    serve_fail(&e, 503, "server_busy", NULL,
               "the server holds %zu bytes of request bodies "
               "already; retry later",
               s->recv.cap);
    return serve_send_error(cn, c, &e);
}

void serve_recv_done(serve_conn *cn) {
    serve_budget_give(&cn->srv->recv, cn->recv_held);
    cn->recv_held = 0;
}

/* Everything decided from the request line and headers, in the documented order:
 * route, a CORS preflight, method, API key, loading, content type, declared body size. */
static enum MHD_Result check_headers(serve_conn *cn, struct MHD_Connection *c, const char *url,
                                     const char *method, bool *done) {
    serve_server *s = cn->srv;
    serve_error e;
    *done = true;
    if (cn->route == ROUTE_UNKNOWN) {
        serve_fail(&e, 404, "not_found", NULL, "no route %.100s %.200s", method, url);
        return serve_send_error(cn, c, &e);
    }
    if (strcmp(method, "OPTIONS") == 0) return send_preflight(cn, c);
    if (!route_takes(cn->route, method)) {
        serve_fail(&e, 405, "method_not_allowed", NULL, "%.200s takes %s, not %.20s",
                   routes[cn->route].path, routes[cn->route].method, method);
        return serve_send_error(cn, c, &e);
    }
    if (cn->route != ROUTE_HEALTH && !authorized(s, c)) {
        serve_fail(&e, 401, "invalid_api_key", NULL,
                   "missing or wrong API key (send "
                   "'Authorization: Bearer KEY' or 'x-api-key: KEY')");
        return serve_send_error(cn, c, &e);
    }
    if (serve_worker_state(s->worker) != SERVE_READY) {
        serve_fail(&e, 503, "model_loading", NULL, "the model is still loading");
        return serve_send_error(cn, c, &e);
    }
    if (strcmp(method, "POST") == 0) {
        if (!json_content_type(c)) {
            serve_fail(&e, 415, "unsupported_media_type", NULL,
                       "the body must be sent as Content-Type: application/json");
            return serve_send_error(cn, c, &e);
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            unsigned long long n = strtoull(cl, &end, 10);
            if (n > s->o.max_body) {
                serve_fail(&e, 413, "request_body_too_large", NULL,
                           "the body of %llu bytes is over the limit of %zu bytes", n,
                           s->o.max_body);
                return serve_send_error(cn, c, &e);
            }
        }
    }
    *done = false;
    return MHD_YES;
}

/* The connection's request deadline (serve/deadline.h), NULL when it has none. */
static serve_deadline *conn_deadline(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* A connection opens (its first request is expected from now) or closes; libmicrohttpd calls
 * the closing before it closes the socket. */
static void connection_event(void *cls, struct MHD_Connection *c, void **socket_context,
                             enum MHD_ConnectionNotificationCode code) {
    serve_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_context = ci ? serve_deadline_open(&s->deadlines, ci->connect_fd) : NULL;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        serve_deadline_close(&s->deadlines, *socket_context);
        *socket_context = NULL;
    }
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls) {
    (void)version;
    serve_server *s = cls;
    serve_conn *cn = *con_cls;
    if (!cn) {
        cn = calloc(1, sizeof *cn);
        if (!cn) return MHD_NO;
        cn->srv = s;
        const char *id = NULL;
        size_t n = 0;
        cn->route = find_route(url, &id, &n);
        if (id && n < sizeof cn->model_asked)
            memcpy(cn->model_asked, id, n), cn->model_asked[n] = 0;
        cn->del = strcmp(method, "DELETE") == 0;
        *con_cls = cn;
        bool done;
        enum MHD_Result r = check_headers(cn, c, url, method, &done);
        if (!done) cn->phase = 1;
        return r;
    }
    if (cn->phase != 1) return MHD_YES; /* a response is already queued: ignore the body */
    if (*upload_size) {
        serve_deadline_body(&s->deadlines, conn_deadline(c), *upload_size);
        /* a body without Content-Length (chunked) is bounded while it streams in; past twice
         * the cap the connection is dropped rather than read to its end */
        cn->received += *upload_size;
        /* the body takes its receive budget as its bytes come (not as declared: connections
         * that declare large bodies and send nothing must not hold the budget) */
        if (!cn->too_large && !cn->too_many && cn->received > cn->recv_held) {
            if (serve_budget_try(&s->recv, cn->received - cn->recv_held))
                cn->recv_held = cn->received;
            else
                cn->too_many = true;
        }
        if (cn->received > s->o.max_body || cn->too_many) {
            cn->too_large = cn->received > s->o.max_body;
            ts_strbuf_free(&cn->body);
            serve_recv_done(cn);
            if (cn->received > 2 * s->o.max_body + (1u << 20)) return MHD_NO;
        } else if (ts_strbuf_append(&cn->body, upload, *upload_size) != TS_OK) {
            return MHD_NO;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    cn->phase = 2;
    /* the whole request is in: the time its answer takes is not its client's */
    serve_deadline_disarm(&s->deadlines, conn_deadline(c));
    if (cn->too_many && !cn->too_large) return send_too_many(cn, c);
    if (cn->too_large) {
        serve_error e;
        serve_fail(&e, 413, "request_body_too_large", NULL, "the body is over the limit of %zu "
                   "bytes", s->o.max_body);
        return serve_send_error(cn, c, &e);
    }
    /* The answer's bytes get the send timeout, counted from when it is queued (while a job
     * runs the handler blocks here, and no timeout is looked at: the job watches its client). */
    enum MHD_Result r =
        strcmp(method, "POST") == 0 ? serve_route_post(cn, c) : serve_route_get(cn, c);
    serve_timeout_restart(s, c);
    return r;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
    (void)toe;
    serve_server *s = cls;
    serve_conn *cn = *con_cls;
    /* a kept-alive connection waits for its next request under the idle timeout and a new
     * deadline */
    if (c) {
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->o.idle_timeout_s);
        serve_deadline_arm(&s->deadlines, conn_deadline(c));
    }
    if (!cn) return;
    if (cn->status) serve_metrics_request(&s->metrics, cn->route, cn->status);
    ts_strbuf_free(&cn->body);
    serve_recv_done(cn);
    free(cn);
    *con_cls = NULL;
}

/* libmicrohttpd's messages (mostly a connection that closed halfway through a request), at
 * most LOG_BURST every LOG_WINDOW_S seconds: clients that come and go cannot flood the log.
 * What was left out is counted in the next message that gets through. */
#define LOG_BURST    10
#define LOG_WINDOW_S 10

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static time_t window;
    static int shown;
    static long dropped;
    time_t now = time(NULL);
    pthread_mutex_lock(&mu);
    if (now - window >= LOG_WINDOW_S) { /* a new window */
        window = now;
        shown = 0;
    }
    bool show = shown < LOG_BURST;
    long before = 0;
    if (show) {
        shown++;
        before = dropped;
        dropped = 0;
    } else {
        dropped++;
    }
    pthread_mutex_unlock(&mu);
    if (!show) return;
    if (before)
        fprintf(stderr, "tessera: serve: %ld more libmicrohttpd messages not shown\n", before);
    vfprintf(stderr, fmt, ap);
}

/* Files the process keeps open besides its connections' sockets: the standard streams, the
 * listening socket, the daemon's wake-up pipe, a model's files, a GPU driver's devices. */
#define FD_RESERVE 64

/* The connection limit the open-file limit can hold: the soft limit is raised towards the hard
 * one as far as want connections need; past what it allows, fewer connections. Without it
 * accept() would fail with EMFILE once the files ran out, and new clients would wait unserved
 * in the listening queue instead of being refused at once. */
static unsigned connection_limit(int want) {
    struct rlimit rl;
    rlim_t need = (rlim_t)want + FD_RESERVE;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need)
        return (unsigned)want;
    struct rlimit up = {rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need ? rl.rlim_max : need,
                        rl.rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &up) == 0) rl.rlim_cur = up.rlim_cur;
    if (rl.rlim_cur >= need) return (unsigned)want;
    unsigned cap = rl.rlim_cur > 2 * FD_RESERVE ? (unsigned)(rl.rlim_cur - FD_RESERVE)
                                                : (unsigned)(rl.rlim_cur / 2);
    fprintf(stderr,
            "tessera: serve: at most %u connections, not %d (the open-file limit is "
            "%llu; raise it with ulimit -n)\n",
            cap, want, (unsigned long long)rl.rlim_cur);
    return cap;
}

struct MHD_Daemon *serve_http_start(serve_server *s, unsigned *port) {
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", s->o.port);
    if (getaddrinfo(s->o.host, ps, &hints, &ai) != 0 || !ai) {
        fprintf(stderr, "tessera: serve: cannot resolve host '%s'\n", s->o.host);
        return NULL;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    /* the logger first: libmicrohttpd prints with its own until it has read this option */
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)s->o.port, NULL, NULL, handler, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
        NULL, MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, connection_event, s, MHD_OPTION_CONNECTION_LIMIT,
        connection_limit(s->o.max_connections),
        /* one client (address) cannot take every connection; 0 = no limit (behind a proxy
         * every connection comes from its address) */
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->o.max_connections_per_ip,
        /* request line + headers must fit in this per-connection pool: the header cap */
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
        /* until a request is in (its answer then gets the send timeout, and completed() sets
         * this one back): a client that opens connections and sends nothing holds none long */
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->o.idle_timeout_s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) {
        fprintf(stderr, "tessera: serve: cannot listen on %s:%d\n", s->o.host, s->o.port);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *port = di ? di->port : (unsigned)s->o.port;
    return d;
}
