#include "serve/metrics.h"

#include "base/status.h"

#include <stdio.h>
#include <string.h>

const char *const serve_metrics_route_names[SERVE_METRICS_ROUTES] = {
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/health",
    "/metrics",
    "/tokenize",
    "/detokenize",
    "/v1/responses",
    "/v1/models/{id}",
    "/v1/responses/{id}",
    "/v1/embeddings",
    "/infill",
    "/v1/responses/{id}/input_items",
    "/props",
    "/apply-template",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/completion",
    "/lora-adapters",
    "other"};

static const int status_codes[SERVE_METRICS_STATUSES] = {200, 400, 401, 404, 405,
                                                         413, 415, 500, 503, 0};

/* seconds; TTFT and per-token latency share the bounds */
static const double bounds[SERVE_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                  0.25,  0.5,    1,     2.5,  5,     10,   30};

void serve_metrics_init(serve_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void serve_metrics_free(serve_metrics *m) { pthread_mutex_destroy(&m->mu); }

void serve_metrics_request(serve_metrics *m, int route, int status) {
    if (route < 0 || route >= SERVE_METRICS_ROUTES) route = SERVE_METRICS_ROUTES - 1;
    int s = SERVE_METRICS_STATUSES - 1;
    for (int i = 0; i < SERVE_METRICS_STATUSES - 1; i++)
        if (status_codes[i] == status) s = i;
    pthread_mutex_lock(&m->mu);
    m->requests[route][s]++;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_tokens(serve_metrics *m, int prompt, int cached, int prefilled,
                          int completion) {
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (uint64_t)prompt;
    m->cached_tokens += (uint64_t)cached;
    m->prefill_tokens += (uint64_t)prefilled;
    m->completion_tokens += (uint64_t)completion;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_prefill_call(serve_metrics *m) {
    pthread_mutex_lock(&m->mu);
    m->prefill_calls++;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_decode_call(serve_metrics *m, int drafted, int accepted) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->decode_calls++;
    m->draft_tokens += (uint64_t)drafted;
    m->draft_accepted += (uint64_t)accepted;
    pthread_mutex_unlock(&m->mu);
}

static void hist_add(serve_hist *h, double v) {
    int b = 0;
    while (b < SERVE_HIST_BUCKETS && v > bounds[b]) b++;
    h->count[b]++;
    h->sum += v;
    h->n++;
}

void serve_metrics_ttft(serve_metrics *m, double seconds) {
    pthread_mutex_lock(&m->mu);
    hist_add(&m->ttft, seconds);
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_token_latency(serve_metrics *m, double seconds) {
    pthread_mutex_lock(&m->mu);
    hist_add(&m->token_latency, seconds);
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_snapshots(serve_metrics *m, int held, size_t bytes, uint64_t stores) {
    pthread_mutex_lock(&m->mu);
    m->snapshots = held;
    m->snapshot_bytes = bytes;
    m->snapshot_stores = stores;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_gauges(serve_metrics *m, int queued, int running) {
    pthread_mutex_lock(&m->mu);
    m->queued = queued;
    m->running = running;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_event(serve_metrics *m, int what) {
    pthread_mutex_lock(&m->mu);
    if (what == 0) m->rejected++;
    if (what == 1) m->cancelled++;
    if (what == 2) m->cancelled_queued++;
    if (what == 3) m->errors++;
    if (what == 4) m->prep_waits++;
    if (what == 5) m->late_requests++;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_next_turn(serve_metrics *m, bool ready, int prefilled) {
    pthread_mutex_lock(&m->mu);
    if (ready) m->next_turn_ready++;
    else m->next_turn_abandoned++;
    m->next_turn_tokens += (uint64_t)prefilled;
    pthread_mutex_unlock(&m->mu);
}

static ts_status put_hist(ts_strbuf *o, const char *name, const char *help, const serve_hist *h) {
    TS_TRY(ts_strbuf_printf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name));
    uint64_t cum = 0;
    for (int b = 0; b < SERVE_HIST_BUCKETS; b++) {
        cum += h->count[b];
        TS_TRY(ts_strbuf_printf(o, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[b],
                                (unsigned long long)cum));
    }
    cum += h->count[SERVE_HIST_BUCKETS];
    TS_TRY(ts_strbuf_printf(o, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum));
    TS_TRY(ts_strbuf_printf(o, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name,
                            (unsigned long long)h->n));
    return TS_OK;
}

static ts_status counter(ts_strbuf *o, const char *name, const char *help, uint64_t v) {
    return ts_strbuf_printf(o, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name,
                            (unsigned long long)v);
}

ts_status serve_metrics_render(serve_metrics *src, ts_strbuf *o) {
    pthread_mutex_lock(&src->mu);
    serve_metrics m = *src; /* a consistent copy; render without the lock */
    pthread_mutex_unlock(&src->mu);
    TS_TRY(ts_strbuf_printf(o, "# HELP tessera_requests_total HTTP requests by route and status.\n"
                               "# TYPE tessera_requests_total counter\n"));
    for (int r = 0; r < SERVE_METRICS_ROUTES; r++)
        for (int s = 0; s < SERVE_METRICS_STATUSES; s++)
            if (m.requests[r][s])
                TS_TRY(ts_strbuf_printf(
                    o, "tessera_requests_total{route=\"%s\",status=\"%s%d\"} %llu\n",
                    serve_metrics_route_names[r], status_codes[s] ? "" : "other",
                    status_codes[s] ? status_codes[s] : 0, (unsigned long long)m.requests[r][s]));
    TS_TRY(counter(o, "tessera_prompt_tokens_total", "Prompt tokens of admitted requests.",
                   m.prompt_tokens));
    TS_TRY(counter(o, "tessera_prompt_tokens_cached_total",
                   "Prompt tokens served from a prefix snapshot.", m.cached_tokens));
    TS_TRY(counter(o, "tessera_prefill_tokens_total", "Prompt tokens run through the model.",
                   m.prefill_tokens));
    TS_TRY(counter(o, "tessera_prefill_calls_total",
                   "Forward calls that ran prompt tokens (a prompt goes in chunks of "
                   "--prefill-chunk tokens).",
                   m.prefill_calls));
    TS_TRY(counter(o, "tessera_completion_tokens_total", "Generated tokens.",
                   m.completion_tokens));
    TS_TRY(counter(o, "tessera_decode_calls_total",
                   "Forward calls of decode steps (each gives every running answer one token or, "
                   "with speculative decoding, several).",
                   m.decode_calls));
    TS_TRY(counter(o, "tessera_draft_tokens_total",
                   "Tokens guessed ahead and checked by a decode step (speculative decoding: "
                   "from a request's prediction, or by prompt lookup).",
                   m.draft_tokens));
    TS_TRY(counter(o, "tessera_draft_accepted_total",
                   "Guessed tokens the model drew as guessed (each saved a decode step).",
                   m.draft_accepted));
    TS_TRY(counter(o, "tessera_rejected_total", "Requests refused with 503 server_busy.",
                   m.rejected));
    TS_TRY(counter(o, "tessera_cancelled_total",
                   "Running jobs stopped because the client left or the server shut down.",
                   m.cancelled));
    TS_TRY(counter(o, "tessera_cancelled_queued_total",
                   "Queued jobs dropped before prefill because the client left.",
                   m.cancelled_queued));
    TS_TRY(counter(o, "tessera_job_errors_total", "Jobs that failed inside the engine.",
                   m.errors));
    TS_TRY(counter(o, "tessera_prep_waits_total",
                   "Request bodies that waited for others to be parsed and prepared first "
                   "(the memory bodies being prepared may take together is bounded).",
                   m.prep_waits));
    TS_TRY(counter(o, "tessera_late_requests_total",
                   "Connections closed because a request had not arrived whole within "
                   "--request-timeout.",
                   m.late_requests));
    TS_TRY(counter(o, "tessera_next_turn_ready_total",
                   "Chat answers whose next turn's prefix was prefilled and kept (idle worker).",
                   m.next_turn_ready));
    TS_TRY(counter(o, "tessera_next_turn_abandoned_total",
                   "Next-turn prefills given up because a request arrived.",
                   m.next_turn_abandoned));
    TS_TRY(counter(o, "tessera_next_turn_prefill_tokens_total",
                   "Tokens run through the model to prepare next turns.", m.next_turn_tokens));
    TS_TRY(ts_strbuf_printf(o,
                            "# HELP tessera_queue_depth Admitted jobs waiting for a free lane.\n"
                            "# TYPE tessera_queue_depth gauge\ntessera_queue_depth %d\n",
                            m.queued));
    TS_TRY(
        ts_strbuf_printf(o,
                         "# HELP tessera_running Jobs the worker is running (at most --parallel).\n"
                         "# TYPE tessera_running gauge\ntessera_running %d\n",
                         m.running));
    TS_TRY(counter(o, "tessera_prefix_snapshot_stores_total",
                   "Prefix snapshots made (a prompt's, a next turn's, an answer's state kept).",
                   m.snapshot_stores));
    TS_TRY(ts_strbuf_printf(o,
                            "# HELP tessera_prefix_snapshots Prefix snapshots held.\n"
                            "# TYPE tessera_prefix_snapshots gauge\n"
                            "tessera_prefix_snapshots %d\n"
                            "# HELP tessera_prefix_snapshot_bytes The room they take of the "
                            "pool (--cache-mb).\n"
                            "# TYPE tessera_prefix_snapshot_bytes gauge\n"
                            "tessera_prefix_snapshot_bytes %zu\n",
                            m.snapshots, m.snapshot_bytes));
    TS_TRY(put_hist(o, "tessera_ttft_seconds", "Time from admission to the first token.",
                    &m.ttft));
    TS_TRY(put_hist(o, "tessera_token_latency_seconds", "Time per decoded token.",
                    &m.token_latency));
    return TS_OK;
}
