/* The serving worker: owns the runtime and runs jobs on its own thread.
 *
 * The model, engine and tokenizer are built ON the worker thread (by the model factory, via
 * the public API); the HTTP side never names a model family and only sees what the worker
 * publishes once loading is done (serve_runtime). Admission is bounded: queued + running jobs
 * never exceed max_pending, and a refused job is refused at once. Every admitted job ends with
 * exactly one terminal state, and its admission slot is released exactly once, at that moment.
 *
 * Several jobs run at once, one on each of n_parallel lanes (working slots of the engine): a
 * new job's prompt is prefilled between two decode steps, and every decode step is one
 * batched forward over all running jobs, each drawing its token with its own sampler
 * (serve/decode.h). A job waits in the queue only while every lane is busy. */
#ifndef TS_SERVE_WORKER_H
#define TS_SERVE_WORKER_H

#include "serve/job.h"
#include "serve/metrics.h"

typedef struct {
    const char *model_path;
    int n_ctx;         /* 0 = min(model's training context, 4096) */
    int n_threads;     /* 0 = all cores */
    ts_device device;
    int max_pending;   /* queued + running */
    int n_parallel;    /* jobs decoded together; 0 = SERVE_PARALLEL_CPU or _GPU by device */
    size_t cache_bytes; /* memory for prefix snapshots; 0 = no prefix reuse */
    int step_delay_ms;  /* testing aid: sleep before each decode step and embedding call */
    int load_delay_ms; /* testing aid: sleep before loading */
    /* Prompt tokens a forward call takes (a prompt is prefilled in chunks of this many, and a
     * cancellation is seen between them); 0: SERVE_PREFILL_CHUNK_CPU on the CPU, where a chunk
     * of 256 is already compute-bound and takes ~1 s for the 0.8B on 2 cores, and
     * SERVE_PREFILL_CHUNK_GPU on a GPU, where every forward call has a fixed cost of a few
     * milliseconds (its ops launched one by one) and 256-token chunks took twice the time of
     * one piece (bench/RESULTS.md). */
    int prefill_chunk;
    /* images are resized to at most this many pixels (0: SERVE_IMAGE_MAX_PIXELS); the model's
     * own limit still applies when lower */
    int64_t image_max_pixels;
    int draft_max;     /* speculative decoding (serve/speculate.c): guesses a step, 0 none */
    bool draft_lookup; /* guesses by prompt lookup too */
    ts_pooling pooling; /* embeddings' pooling; TS_POOL_UNSET: the model's own, else last */
    ts_matryoshka matryoshka; /* --matryoshka; none (n 0): the model's config */
    /* LoRA adapters to load with the model (ts_model_lora_load), ids in this order */
    int n_lora;
    const char *const *lora_path;
    int draft_mtp; /* guesses a step from the model's MTP block (0: none; it is turned on) */
} serve_worker_opts;

/* Jobs run together by default. On 2 CPU cores 4 clients of the 0.8B get ~2.9x the tokens of
 * one lane, of Gemma 3 270M ~2x; on an H200 16 clients of the 0.8B ~7.5x (bench/RESULTS.md,
 * "Several requests at once"). Every lane holds a whole sequence's state (KV cache for n_ctx
 * tokens, recurrent state), allocated at start. */
#define SERVE_PARALLEL_CPU 4
#define SERVE_PARALLEL_GPU 16

/* The default bound on an image's pixels: 1 MiB of pixels is 1024 tokens of Qwen3.5 (16-pixel
 * patches merged 2x2), a few seconds of its vision tower on 2 CPU cores; the model's own
 * processor allows 16 MiB (16384 tokens, quadratic attention in the tower). */
#define SERVE_IMAGE_MAX_PIXELS (1 << 20)

#define SERVE_PREFILL_CHUNK_CPU 256
#define SERVE_PREFILL_CHUNK_GPU 2048
/* The idle worker's next-turn prefill (decode.c) yields to a request between two forward
 * calls of this many tokens: a few tens of milliseconds on the CPU (16 tokens of the 0.8B on 2
 * cores), and on a GPU, where 16 tokens cost a forward call's fixed few milliseconds as 256 do,
 * 256 (bench/RESULTS.md). */
#define SERVE_NEXT_TURN_CHUNK_CPU 16
#define SERVE_NEXT_TURN_CHUNK_GPU 256

typedef enum { SERVE_LOADING, SERVE_READY, SERVE_FAILED } serve_state;

/* What the HTTP side may use once the worker is ready. The tokenizer is thread-safe for
 * encode/decode and lives until the worker is freed. */
typedef struct {
    const ts_tokenizer *tok;
    int n_ctx;
    int n_vocab;
    int n_embd;     /* the model's width */
    int n_embd_out; /* an embedding's length (the width after an embedding model's Dense layers) */
    /* an encoder (an embedding model: it answers /v1/embeddings, never text), and how an
     * embedding pools its input's hidden states (--pooling, else the model's own, else last) */
    bool encoder;
    serve_pool pooling;
    /* the shorter lengths an embedding may be cut to (`dimensions`): --matryoshka, else the
     * model's config */
    ts_matryoshka matryoshka;
    int32_t think_open, think_close, turn_start; /* token ids, -1 when absent */
    int n_parallel; /* lanes: jobs decoded together */
    size_t state_bytes; /* a lane's state, for the whole context */
    /* prefix snapshots: the engine's pool (0: none), and what a snapshot takes of it: fixed
     * (the summed-up state) and a token's KV rows */
    size_t snap_pool_bytes, snap_fixed_bytes;
    double snap_token_bytes;
    /* images: whether the engine takes them, how the model cuts them, and the most pixels an
     * image is given (--image-max-pixels, within the model's range) */
    bool vision, vision_model; /* vision_model: the model has a tower (the device may not run it) */
    ts_vision_info vinfo;
    int64_t image_max_pixels;
    char describe[64];
    /* a GPU's warm-up before ready (worker.c, warm_up): how long, and whether it ran the vision
     * tower too */
    double warm_ms;
    bool warmed_vision;
} serve_runtime;

typedef struct serve_worker serve_worker;

ts_status serve_worker_start(const serve_worker_opts *o, serve_metrics *m, serve_worker **out);
serve_state serve_worker_state(serve_worker *w);
/* The load error when FAILED. */
const char *serve_worker_error(serve_worker *w);
/* NULL while loading. */
const serve_runtime *serve_worker_runtime(serve_worker *w);

/* Admits the n jobs together (taking a reference to each: the choices of one request) or
 * refuses them all at once with TS_ERR_BUSY (over the cap or shutting down). */
ts_status serve_worker_submit(serve_worker *w, serve_job *const *jobs, int n);
/* Queued + running jobs. */
int serve_worker_active(serve_worker *w);

/* Stops admission, waits up to drain_ms for the admitted jobs, cancels what is left, and joins
 * the worker thread (waiting at most join_ms more). Returns false when the thread could not
 * be joined in time (its resources are then left to the process exit). */
bool serve_worker_shutdown(serve_worker *w, int drain_ms, int join_ms);
void serve_worker_free(serve_worker *w);

#endif
