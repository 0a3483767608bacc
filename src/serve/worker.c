#include "serve/worker.h"

#include "base/clock.h"
#include "base/status.h"
#include "serve/decode.h"
#include "serve/prefix_cache.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SERVE_MAX_SNAPSHOTS  256 /* prefix cache entries (their state is bounded by bytes) */
#define SERVE_MAX_LOGIT_ROWS 64  /* prompts' last logits rows kept with their snapshots */
/* Idle work after an answer (a chat's next-turn prefix, a completion's answer state) waits this
 * long for another request first: a client that sends its next request straight away (a
 * benchmark, a batch script) then never waits behind a forward call it does not need. A
 * person reading the answer takes far longer. */
#define SERVE_IDLE_GRACE_MS 100

struct serve_worker {
    serve_worker_opts o;
    serve_metrics *metrics;
    pthread_t thread;
    bool thread_started, joined;

    pthread_mutex_t mu; /* guards everything below up to `rt` */
    pthread_cond_t cv;  /* queue grew, a job ended, or state changed */
    serve_job **queue;  /* ring of max_pending */
    int q_head, q_len;
    int active; /* queued + running: the admission count */
    serve_job **running; /* [n_lanes] the jobs on the lanes (NULL: free), for shutdown */
    int n_running, n_lanes;
    bool accepting, stop;
    serve_state state;
    char error[512];

    serve_runtime rt; /* published when state becomes READY, then read-only */

    /* ---- owned by the worker thread ---- */
    ts_tokenizer *tok;
    ts_model *model;
    ts_engine *engine;
    serve_prefix_cache cache;
    serve_decoder dec;
};

static void publish_gauges(serve_worker *w) {
    serve_metrics_gauges(w->metrics, w->q_len, w->n_running);
}

/* Worker thread only (the cache is its own): after the steps that may keep snapshots. */
static void publish_snapshots(serve_worker *w) {
    serve_metrics_snapshots(w->metrics, w->cache.n_held, w->cache.held, w->cache.stores);
}

static int32_t single_token(const ts_tokenizer *tok, const char *text) {
    int32_t *ids, id = -1;
    size_t n;
    if (ts_tokenize(tok, text, strlen(text), true, &ids, &n) != TS_OK) return -1;
    if (n == 1) id = ids[0];
    free(ids);
    return id;
}

/* The size of the warm-up's call after one of c tokens: down from a chunk by an eighth of the
 * power of two at or below c (2048, 1792, 1536, 1280, 1024, 896, ...), 0 after 64. */
static int warm_next(int c) {
    if (c <= 64) return 0;
    int p = 1;
    while (2 * p <= c)
        p *= 2;
    int next = c - (c > p ? p / 4 : p / 8);
    return next < 64 ? 64 : next;
}

/* Runs prompts through slot 0 as requests would - calls of a chunk, 7/8, 6/8 and 5/8 of it, half
 * a chunk, 7/16 ... down to 64 tokens, each attending to the ones before it (the slot cleared
 * when the context is full): prompt lengths of each kind the backend treats apart (the GPU's
 * GEMMs keep an algorithm for each quarter of a doubling of the token count) - their last
 * logits to the host - three decode steps drawn by a greedy sampler, and one decode step of
 * each number of sequences from 2 to n_lanes (each a step of its own on a GPU), then clears
 * the slots,
 * so that what a GPU backend does once (loading its kernels, growing its scratch to a whole
 * chunk, choosing the GEMMs' algorithms, building the decode step's graph) happens before the
 * server says it is ready instead of in its first requests: on an H200 the first 2890-token
 * prompt took 208 ms to its first token against 104 for the next ones, and later a prompt of a
 * length not seen before ~20-50 ms more than the next of that length (bench/RESULTS.md). */
static ts_status warm_up(ts_engine *e, int chunk, int n_lanes) {
    int V = ts_engine_n_vocab(e), n_ctx = ts_engine_n_ctx(e);
    int n = chunk < n_ctx - 3 ? chunk : n_ctx - 3; /* the longest call */
    if (n < 1) return TS_OK;
    size_t cap = (size_t)(n > n_lanes ? n : n_lanes);
    int32_t *ids = calloc(cap, sizeof *ids), *pos = malloc(cap * sizeof *pos),
            *slot = calloc(cap, sizeof *slot), tok = 0, at = 0;
    float *logits = malloc((size_t)V * sizeof *logits);
    ts_sampler_params sp;
    ts_sampler_params_default(&sp);
    ts_sampler *smp = NULL;
    ts_status st = ids && pos && slot && logits ? ts_sampler_create(&sp, V, &smp)
                                                : ts_error(TS_ERR_NOMEM, "out of memory");
    for (int c = n; st == TS_OK && c > 0; c = warm_next(c)) {
        if (at + c > n_ctx - 3) { /* the context is full: start again */
            st = ts_engine_slot_clear(e, 0);
            at = 0;
        }
        for (int i = 0; i < c; i++)
            pos[i] = at + i, slot[i] = 0;
        ts_batch b = {c, ids, pos, slot, NULL, NULL, NULL};
        if (st == TS_OK) st = ts_engine_forward(e, &b, logits);
        at += c;
    }
    for (int k = 0; st == TS_OK && k < 3; k++) {
        int32_t p = at + k;
        ts_batch b = {1, &tok, &p, slot, NULL, NULL, NULL};
        st = ts_engine_forward_sample(e, &b, &smp, &tok);
    }
    /* a decode step of each number of lanes the server may run together (a batch of 2..n
     * sequences is a step of its own on the device), from empty slots */
    ts_sampler **smps = calloc((size_t)n_lanes, sizeof *smps);
    uint8_t *want = malloc((size_t)n_lanes);
    if (st == TS_OK && (!smps || !want)) st = ts_error(TS_ERR_NOMEM, "out of memory");
    for (int l = 0; st == TS_OK && l < n_lanes; l++) {
        want[l] = 1;
        slot[l] = l;
        st = ts_engine_slot_clear(e, l);
        if (st == TS_OK) st = ts_sampler_create(&sp, V, &smps[l]);
    }
    for (int m = 2; st == TS_OK && m <= n_lanes; m++) {
        for (int l = 0; l < m; l++)
            ids[l] = 0, pos[l] = ts_engine_slot_len(e, l);
        ts_batch b = {m, ids, pos, slot, want, NULL, NULL};
        st = ts_engine_forward_sample(e, &b, smps, ids);
    }
    for (int l = 0; l < n_lanes; l++) {
        ts_engine_slot_clear(e, l);
        if (smps) ts_sampler_free(smps[l]);
    }
    free(smps), free(want);
    ts_sampler_free(smp);
    free(ids), free(pos), free(slot), free(logits);
    return st;
}

/* The vision tower's first image on a GPU pays once for what later ones do not - its weights'
 * upload, its kernels' loading, its GEMMs' algorithms: ~70 ms of the 0.8B's tower on an H100,
 * for an image of any size (bench/RESULTS.md) - so one image of the smallest size the model
 * takes (a grey square) goes through it before the server says it is ready. */
/* An encoder's warm-up: one input of each length the prompts' warm-up takes, from an empty slot
 * (its forward has no logits and no decode step). */
static ts_status warm_up_encoder(ts_engine *e, int chunk, int n_embd) {
    int n = chunk;
    int32_t *ids = calloc((size_t)n, sizeof *ids), *pos = malloc((size_t)n * sizeof *pos),
            *slot = calloc((size_t)n, sizeof *slot);
    uint8_t *want = malloc((size_t)n);
    float *hidden = malloc((size_t)n * n_embd * sizeof *hidden);
    ts_status st =
        ids && pos && slot && want && hidden ? TS_OK : ts_error(TS_ERR_NOMEM, "out of memory");
    for (int c = n; st == TS_OK && c > 0; c = warm_next(c)) {
        for (int i = 0; i < c; i++)
            pos[i] = i, want[i] = 1;
        ts_batch b = {c, ids, pos, slot, want, NULL, NULL};
        st = ts_engine_slot_clear(e, 0);
        if (st == TS_OK) st = ts_engine_forward_hidden(e, &b, hidden);
    }
    if (st == TS_OK) st = ts_engine_slot_clear(e, 0);
    free(ids), free(pos), free(slot), free(want), free(hidden);
    return st;
}

static ts_status warm_up_vision(ts_engine *e, const ts_model *m) {
    ts_vision_info vi;
    ts_model_info mi;
    if (!ts_model_vision(m, &vi)) return TS_OK;
    ts_model_get_info(m, &mi);
    int side = 1;
    while ((int64_t)side * side < vi.min_pixels)
        side++;
    ts_image_plan plan;
    TS_TRY(ts_vision_plan(&vi, side, side, &plan));
    ts_image img = {plan.width, plan.height, malloc((size_t)plan.width * plan.height * 3)};
    float *rows = malloc((size_t)plan.n_tokens * mi.n_embd * sizeof *rows);
    ts_status st = img.rgb && rows ? TS_OK : ts_error(TS_ERR_NOMEM, "out of memory");
    if (st == TS_OK) {
        memset(img.rgb, 128, (size_t)plan.width * plan.height * 3);
        st = ts_engine_encode_image(e, &img, &plan, rows);
    }
    free(img.rgb), free(rows);
    return st;
}

static void job_done(void *ctx, serve_job *j, serve_finish how, const char *err);

/* The prefix cache's entries are the engine's snapshot ids: a dropped one's room goes back. */
static void drop_snapshot(void *engine, int id) { ts_engine_snap_drop(engine, id); }

/* Builds the runtime on this thread: tokenizer, model (through the factory), engine with a
 * slot a lane and a snapshot pool of the cache budget. */
static ts_status load(serve_worker *w) {
    if (w->o.load_delay_ms > 0) {
        struct timespec ts = {w->o.load_delay_ms / 1000, (long)(w->o.load_delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    TS_TRY(ts_tokenizer_open(w->o.model_path, &w->tok));
    TS_TRY(ts_model_open(w->o.model_path, &w->model));
    for (int a = 0; a < w->o.n_lora; a++)
        TS_TRY(ts_model_lora_load(w->model, w->o.lora_path[a], NULL));
    ts_model_info info;
    ts_model_get_info(w->model, &info);
    if (w->o.draft_mtp > 0 && ts_model_mtp_enable(w->model) != TS_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", ts_last_error());
        return ts_error(TS_ERR_UNSUPPORTED, "--draft-mtp: %s", why);
    }
    if (ts_tokenizer_vocab_size(w->tok) > info.n_vocab)
        return ts_error(TS_ERR_FORMAT, "%s: the tokenizer has %d tokens but the model only %d",
                        w->o.model_path, ts_tokenizer_vocab_size(w->tok), info.n_vocab);
    int n_ctx = w->o.n_ctx > 0 ? w->o.n_ctx
                               : (info.n_ctx_train < 4096 ? info.n_ctx_train : 4096);
    size_t sb = ts_model_state_bytes(w->model, n_ctx);
    /* --cache-mb: the snapshots' pool on the device, and an eighth of it (at most 64 rows) for
     * the prompts' last logits rows they keep in host memory */
    size_t row = (size_t)info.n_vocab * sizeof(float);
    size_t rows = sb ? w->o.cache_bytes / 8 / row : 0;
    if (rows > SERVE_MAX_LOGIT_ROWS) rows = SERVE_MAX_LOGIT_ROWS;
    size_t snap_budget = sb ? w->o.cache_bytes - rows * row : 0;
    bool gpu = w->o.device == TS_DEVICE_CUDA;
    int lanes = w->n_lanes;
    int chunk = w->o.prefill_chunk > 0 ? w->o.prefill_chunk
                : gpu                  ? SERVE_PREFILL_CHUNK_GPU
                                       : SERVE_PREFILL_CHUNK_CPU;
    if (chunk > n_ctx) chunk = n_ctx; /* no prompt is longer */
    if (info.encoder) chunk = n_ctx;  /* an encoder's input goes in whole */
    ts_engine_opts eo;
    ts_engine_opts_default(&eo);
    eo.n_ctx = n_ctx;
    eo.n_threads = w->o.n_threads;
    eo.device = w->o.device;
    eo.n_slots = lanes;
    eo.snap_bytes = snap_budget;
    eo.n_snaps = snap_budget ? SERVE_MAX_SNAPSHOTS : 0;
    if (eo.n_batch < chunk) eo.n_batch = chunk;
    if (eo.n_batch < lanes) eo.n_batch = lanes;
    ts_status st = ts_engine_create(w->model, &eo, &w->engine);
    if (st != TS_OK) { /* most likely memory: say what took it and what sets that */
        char why[384];
        snprintf(why, sizeof why, "%s", ts_last_error());
        return ts_error(st,
                        "%s (%d lanes of %.1f MiB of state each and a snapshot pool of "
                        "%zu MiB: --parallel, --ctx and --cache-mb set these)",
                        why, lanes, (double)sb / 1048576.0, snap_budget >> 20);
    }
    if (gpu) {
        double t0 = ts_now_s();
        TS_TRY(info.encoder ? warm_up_encoder(w->engine, chunk, info.n_embd)
                            : warm_up(w->engine, chunk, lanes));
        w->rt.warmed_vision = ts_engine_vision(w->engine);
        if (w->rt.warmed_vision) TS_TRY(warm_up_vision(w->engine, w->model));
        w->rt.warm_ms = (ts_now_s() - t0) * 1e3;
    }
    size_t snap_pool = ts_engine_snap_pool_bytes(w->engine);
    TS_TRY(serve_prefix_cache_init(&w->cache, snap_pool ? SERVE_MAX_SNAPSHOTS : 0, snap_pool,
                                   info.n_vocab, (int)rows, drop_snapshot, w->engine));
    int next_turn = gpu ? SERVE_NEXT_TURN_CHUNK_GPU : SERVE_NEXT_TURN_CHUNK_CPU;
    serve_decoder_opts dopts = {
        w->engine,          w->tok,         &w->cache,         w->metrics,  lanes,
        w->o.step_delay_ms, chunk,          next_turn,         info.n_embd, w->model,
        info.n_embd_out,    w->o.draft_max, w->o.draft_lookup, w->o.n_lora, w->o.draft_mtp};
    TS_TRY(serve_decoder_init(&w->dec, &dopts, job_done, w));
    serve_runtime *rt = &w->rt;
    rt->tok = w->tok;
    rt->n_ctx = n_ctx;
    rt->n_vocab = info.n_vocab;
    rt->n_embd = info.n_embd;
    rt->n_embd_out = info.n_embd_out;
    rt->encoder = info.encoder;
    const ts_matryoshka *own = &w->o.matryoshka;
    for (int i = 0; i < own->n; i++)
        if (own->len[i] > info.n_embd_out)
            return ts_error(TS_ERR_INVALID, "--matryoshka %d: the embeddings have %d dimensions",
                            own->len[i], info.n_embd_out);
    rt->matryoshka = own->n ? *own : info.matryoshka;
    ts_pooling pool = w->o.pooling ? w->o.pooling : info.pooling ? info.pooling : TS_POOL_LAST;
    rt->pooling = pool == TS_POOL_MEAN    ? SERVE_POOL_MEAN
                  : pool == TS_POOL_FIRST ? SERVE_POOL_FIRST
                                          : SERVE_POOL_LAST;
    rt->think_open = single_token(w->tok, "<think>");
    rt->think_close = single_token(w->tok, "</think>");
    rt->turn_start = single_token(w->tok, "<|im_start|>");
    rt->n_parallel = lanes;
    rt->state_bytes = sb;
    rt->snap_pool_bytes = snap_pool;
    if (snap_pool) { /* pages round each up; the rate is over a long sequence */
        rt->snap_fixed_bytes = ts_engine_snap_bytes(w->engine, 0);
        rt->snap_token_bytes =
            (double)(ts_engine_snap_bytes(w->engine, n_ctx) - rt->snap_fixed_bytes) / n_ctx;
    }
    rt->vision_model = ts_model_vision(w->model, &rt->vinfo);
    rt->vision = rt->vision_model && ts_engine_vision(w->engine);
    /* videos only where the tokenizer's <|video_pad|> is the model's video token: the chat
     * format writes the one, the rotary positions look for the other */
    int32_t video_pad = single_token(w->tok, "<|video_pad|>");
    if (rt->vision_model && rt->vinfo.video_token >= 0 && video_pad != rt->vinfo.video_token) {
        snprintf(rt->vinfo.video_refused, sizeof rt->vinfo.video_refused,
                 "the model's video token %d is not the tokenizer's <|video_pad|> (%d)",
                 rt->vinfo.video_token, video_pad);
        rt->vinfo.video_token = -1;
    }
    if (rt->vision_model && rt->vinfo.video_refused[0])
        fprintf(stderr, "tessera: serve: videos are refused: %s\n", rt->vinfo.video_refused);
    rt->image_max_pixels =
        w->o.image_max_pixels > 0 ? w->o.image_max_pixels : SERVE_IMAGE_MAX_PIXELS;
    snprintf(rt->describe, sizeof rt->describe, "%s", ts_engine_describe(w->engine));
    w->dec.think_open = rt->think_open;
    w->dec.think_close = rt->think_close;
    w->dec.turn_start = rt->turn_start;
    return TS_OK;
}

/* Background work yields to any admitted request, and to shutdown. */
static bool worker_interrupted(void *ctx) {
    serve_worker *w = ctx;
    pthread_mutex_lock(&w->mu);
    bool stop = w->q_len > 0 || w->stop || !w->accepting;
    pthread_mutex_unlock(&w->mu);
    return stop;
}

/* Waits up to SERVE_IDLE_GRACE_MS for a request (or shutdown); true when one came. */
static bool request_soon(serve_worker *w) {
    struct timespec dl;
    ts_deadline_in_ms(&dl, SERVE_IDLE_GRACE_MS);
    pthread_mutex_lock(&w->mu);
    while (w->q_len == 0 && !w->stop && w->accepting)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &dl) == ETIMEDOUT) break;
    bool stop = w->q_len > 0 || w->stop || !w->accepting;
    pthread_mutex_unlock(&w->mu);
    return stop;
}

/* The one place a job ends: release the admission slot, then terminal state and wake its
 * reader. In that order, so that a client holding its answer never sees itself still counted
 * as running in /metrics or refused by a cap it no longer occupies. */
static void finish_job(serve_worker *w, serve_job *j, serve_finish how, const char *error) {
    pthread_mutex_lock(&w->mu);
    w->active--;
    for (int l = 0; l < w->n_lanes; l++)
        if (w->running[l] == j) w->running[l] = NULL, w->n_running--;
    publish_gauges(w);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_lock(&j->mu);
    if (j->finish == SERVE_RUNNING) {
        j->finish = how;
        if (error) snprintf(j->error, sizeof j->error, "%s", error);
        j->t_done = serve_now();
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* The decoder's report of a job's end (decode.h). */
static void job_done(void *ctx, serve_job *j, serve_finish how, const char *err) {
    serve_worker *w = ctx;
    if (how == SERVE_FINISH_CANCELLED) serve_metrics_event(w->metrics, 1);
    if (how == SERVE_FINISH_ERROR) serve_metrics_event(w->metrics, 3);
    finish_job(w, j, how, err);
}

/* Takes the next queued job onto lane l (mu held; returns with it held). */
static void start_next(serve_worker *w, int l) {
    serve_job *j = w->queue[w->q_head];
    w->q_head = (w->q_head + 1) % w->o.max_pending;
    w->q_len--;
    w->running[l] = j;
    w->n_running++;
    publish_gauges(w);
    pthread_mutex_unlock(&w->mu);

    pthread_mutex_lock(&j->mu);
    j->started = true;
    pthread_mutex_unlock(&j->mu);
    if (atomic_load(&j->cancel) || w->state != SERVE_READY) {
        /* the client left while the job waited: never prefilled */
        serve_metrics_event(w->metrics, 2);
        finish_job(w, j, SERVE_FINISH_CANCELLED, NULL);
    } else {
        serve_decoder_start(&w->dec, l, j); /* the decoder holds the job while it runs */
    }
    serve_job_unref(j); /* the queue's reference */
    pthread_mutex_lock(&w->mu);
}

/* The scheduler: queued jobs start as soon as a lane is free (their prompts prefilled one at a
 * time, between two decode steps); the running ones take one batched decode step together;
 * with nothing to run, the ended jobs' idle work (after a grace for a request that comes at
 * once), else it sleeps until a request or shutdown. */
static void *worker_main(void *arg) {
    serve_worker *w = arg;
    ts_status st = load(w);
    pthread_mutex_lock(&w->mu);
    if (st != TS_OK) {
        snprintf(w->error, sizeof w->error, "%s", ts_last_error());
        w->state = SERVE_FAILED;
        w->accepting = false;
    } else {
        w->state = SERVE_READY;
    }
    pthread_cond_broadcast(&w->cv);
    bool ready = st == TS_OK;
    for (;;) {
        while (ready && w->q_len > 0) {
            int l = serve_decoder_pick_lane(&w->dec, w->queue[w->q_head]);
            if (l < 0) break;
            start_next(w, l);
        }
        if (w->n_running > 0) {
            pthread_mutex_unlock(&w->mu);
            serve_decoder_step(&w->dec);
            publish_snapshots(w);
            pthread_mutex_lock(&w->mu);
            continue;
        }
        if (w->q_len > 0) continue;
        if (w->stop) break; /* stop requested and nothing left */
        if (ready && w->accepting && serve_decoder_has_idle_work(&w->dec)) {
            pthread_mutex_unlock(&w->mu);
            /* after the clients have their answers, unless a request comes: keep the states the
             * next turns start from (a chat's next prefix, or a completion's own state) */
            if (!request_soon(w)) serve_decoder_idle_work(&w->dec, worker_interrupted, w);
            publish_snapshots(w);
            pthread_mutex_lock(&w->mu);
            continue;
        }
        pthread_cond_wait(&w->cv, &w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

ts_status serve_worker_start(const serve_worker_opts *o, serve_metrics *m, serve_worker **out) {
    *out = NULL;
    if (o->max_pending < 1) return ts_error(TS_ERR_INVALID, "max_pending must be >= 1");
    serve_worker *w = calloc(1, sizeof *w);
    if (!w) return ts_error(TS_ERR_NOMEM, "out of memory");
    w->o = *o;
    w->metrics = m;
    w->n_lanes = o->n_parallel > 0             ? o->n_parallel
                 : o->device == TS_DEVICE_CUDA ? SERVE_PARALLEL_GPU
                                               : SERVE_PARALLEL_CPU;
    /* no more jobs run than are admitted: a lane beyond that would hold state for nothing */
    if (w->n_lanes > o->max_pending) w->n_lanes = o->max_pending;
    w->queue = calloc((size_t)o->max_pending, sizeof *w->queue);
    w->running = calloc((size_t)w->n_lanes, sizeof *w->running);
    if (!w->queue || !w->running) {
        free(w->queue), free(w->running), free(w);
        return ts_error(TS_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&w->mu, NULL);
    ts_cond_init_monotonic(&w->cv);
    w->accepting = true;
    w->state = SERVE_LOADING;
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
        serve_worker_free(w);
        return ts_error(TS_ERR_NOMEM, "cannot start the worker thread");
    }
    w->thread_started = true;
    *out = w;
    return TS_OK;
}

serve_state serve_worker_state(serve_worker *w) {
    pthread_mutex_lock(&w->mu);
    serve_state s = w->state;
    pthread_mutex_unlock(&w->mu);
    return s;
}

const char *serve_worker_error(serve_worker *w) { return w->error; }

const serve_runtime *serve_worker_runtime(serve_worker *w) {
    return serve_worker_state(w) == SERVE_READY ? &w->rt : NULL;
}

ts_status serve_worker_submit(serve_worker *w, serve_job *const *jobs, int n) {
    pthread_mutex_lock(&w->mu);
    if (!w->accepting || w->state != SERVE_READY || n > w->o.max_pending - w->active) {
        pthread_mutex_unlock(&w->mu);
        return TS_ERR_BUSY;
    }
    double now = serve_now();
    for (int i = 0; i < n; i++) {
        serve_job_ref(jobs[i]);
        jobs[i]->t_submit = now;
        w->queue[(w->q_head + w->q_len) % w->o.max_pending] = jobs[i];
        w->q_len++;
        w->active++;
    }
    publish_gauges(w);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return TS_OK;
}

int serve_worker_active(serve_worker *w) {
    pthread_mutex_lock(&w->mu);
    int n = w->active;
    pthread_mutex_unlock(&w->mu);
    return n;
}

/* Waits (mu held) until no job is admitted or the deadline passes. */
static void wait_idle(serve_worker *w, int ms) {
    struct timespec dl;
    ts_deadline_in_ms(&dl, ms);
    while (w->active > 0)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &dl) == ETIMEDOUT) break;
}

bool serve_worker_shutdown(serve_worker *w, int drain_ms, int join_ms) {
    if (!w->thread_started || w->joined) return true;
    pthread_mutex_lock(&w->mu);
    w->accepting = false;
    wait_idle(w, drain_ms);
    /* past the deadline: cancel what is left; each job still ends exactly once */
    for (int i = 0; i < w->q_len; i++)
        atomic_store(&w->queue[(w->q_head + i) % w->o.max_pending]->cancel, true);
    for (int l = 0; l < w->n_lanes; l++)
        if (w->running[l]) atomic_store(&w->running[l]->cancel, true);
    wait_idle(w, join_ms);
    w->stop = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += join_ms / 1000 + 1;
    if (pthread_timedjoin_np(w->thread, NULL, &dl) != 0) return false;
    w->joined = true;
    return true;
}

void serve_worker_free(serve_worker *w) {
    if (!w) return;
    if (w->thread_started && !w->joined) {
        if (!serve_worker_shutdown(w, 0, 1000)) return; /* still running: leave it be */
    }
    serve_decoder_free(&w->dec);
    serve_prefix_cache_free(&w->cache);
    ts_engine_free(w->engine);
    ts_model_close(w->model);
    ts_tokenizer_free(w->tok);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->queue);
    free(w->running);
    free(w);
}
