/* Server counters, gauges and latency histograms, rendered as Prometheus text (GET /metrics).
 * Updated from the HTTP threads and the worker; one mutex, held only for a few adds. */
#ifndef TS_SERVE_METRICS_H
#define TS_SERVE_METRICS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/utf8.h"

#define SERVE_METRICS_ROUTES   20
#define SERVE_METRICS_STATUSES 10
#define SERVE_HIST_BUCKETS     14

typedef struct {
    uint64_t count[SERVE_HIST_BUCKETS + 1]; /* last = +Inf */
    double sum;
    uint64_t n;
} serve_hist;

typedef struct {
    pthread_mutex_t mu;
    uint64_t requests[SERVE_METRICS_ROUTES][SERVE_METRICS_STATUSES];
    uint64_t prompt_tokens, completion_tokens, cached_tokens, prefill_tokens;
    uint64_t prefill_calls; /* forward calls that ran a request's prompt tokens */
    uint64_t rejected, cancelled, cancelled_queued, errors, prep_waits;
    uint64_t late_requests; /* connections closed by their request's deadline */
    uint64_t decode_calls;  /* forward calls of decode steps */
    uint64_t draft_tokens, draft_accepted; /* speculative decoding's guesses, and the right ones */
    uint64_t next_turn_ready, next_turn_abandoned, next_turn_tokens;
    int queued, running;
    int snapshots;         /* prefix snapshots held */
    size_t snapshot_bytes; /* and the room they take of the pool */
    uint64_t snapshot_stores;
    serve_hist ttft, token_latency;
} serve_metrics;

/* route names, in the order of the index the HTTP side passes */
extern const char *const serve_metrics_route_names[SERVE_METRICS_ROUTES];

void serve_metrics_init(serve_metrics *m);
void serve_metrics_free(serve_metrics *m);
void serve_metrics_request(serve_metrics *m, int route, int status);
void serve_metrics_tokens(serve_metrics *m, int prompt, int cached, int prefilled,
                          int completion);
void serve_metrics_ttft(serve_metrics *m, double seconds);
/* One forward call of a request's prompt (a chunk of its prefill). */
void serve_metrics_prefill_call(serve_metrics *m);
void serve_metrics_token_latency(serve_metrics *m, double seconds);
/* The prefix cache as it stands: snapshots held, their bytes, snapshots made so far. */
void serve_metrics_snapshots(serve_metrics *m, int held, size_t bytes, uint64_t stores);
/* One forward call of a decode step, which checked `drafted` guessed tokens (speculative
 * decoding) of which `accepted` were right. */
void serve_metrics_decode_call(serve_metrics *m, int drafted, int accepted);
void serve_metrics_gauges(serve_metrics *m, int queued, int running);
/* what: 0 rejected (busy), 1 cancelled while running, 2 cancelled while queued, 3 error,
 * 4 a body that waited for the prep budget, 5 a connection closed by its request's deadline */
void serve_metrics_event(serve_metrics *m, int what);
/* The worker prepared (or gave up preparing, for a waiting request) the state a chat's next
 * turn starts from; prefilled: tokens it ran through the model for that. */
void serve_metrics_next_turn(serve_metrics *m, bool ready, int prefilled);
ts_status serve_metrics_render(serve_metrics *m, ts_strbuf *out);

#endif
