/* tessera serve: the OpenAI-compatible HTTP server (specs/serving.md), the entry point the
 * CLI calls. */
#ifndef TS_SERVE_SERVE_H
#define TS_SERVE_SERVE_H

#include "tessera.h"

#include <stdbool.h>
#include <stddef.h>

#define SERVE_MAX_ALIASES 8

/* reasoning_effort's values, in order (their names: serve_effort_names) */
enum {
    SERVE_EFFORT_NONE,
    SERVE_EFFORT_MINIMAL,
    SERVE_EFFORT_LOW,
    SERVE_EFFORT_MEDIUM,
    SERVE_EFFORT_HIGH,
    SERVE_EFFORTS
};
extern const char *const serve_effort_names[SERVE_EFFORTS];
/* reasoning_format (llama-server's): 1 for "none" (the thinking left in the content, tags and
 * all), 0 for "deepseek" or "auto" (apart, as reasoning_content), -1 for anything else. */
int serve_reasoning_format(const char *s);

/* The chat fields a thinking goes in (--reasoning-field): llama-server's and DeepSeek's
 * reasoning_content, vLLM's and OpenRouter's reasoning */
#define SERVE_REASONING_CONTENT 1
#define SERVE_REASONING_FIELD   2

/* A thinking budget not given (a request's, or the one an effort gives) */
#define SERVE_THINK_BUDGET_UNSET (-2)

/* The LoRA adapters to load (serve/lora.h): paths in id order, names (NULL: the path's last
 * component), which are model names of their own (--lora-modules), default scales. */
typedef struct {
    int n;
    const char *path[TS_MAX_LORA];
    const char *name[TS_MAX_LORA];
    bool model_name[TS_MAX_LORA];
    float scale[TS_MAX_LORA];
} serve_lora_opts;

typedef struct {
    const char *model_path;
    const char *host; /* default 127.0.0.1 */
    int port;         /* 0 = any free port (printed at start) */
    int n_ctx;        /* 0 = min(model's, 4096) */
    int max_pending;  /* queued + running jobs */
    int n_parallel;   /* jobs decoded together; 0 = by device (serve/worker.h) */
    int max_tokens_cap;
    /* the thinking budget of a request that gives none (-1: no bound), and the text put in
     * before </think> when a budget ends the thinking (NULL: none) */
    int reasoning_budget;
    const char *reasoning_message;
    /* --reasoning-format none: a chat answer's thinking stays in its content, as written, for
     * requests that do not say (OpenAI's chat and completions; the Responses and Messages
     * APIs keep it apart, in their own blocks) */
    bool reasoning_inline;
    /* --reasoning-field: the chat fields the thinking goes in (SERVE_REASONING_*; 0: both) */
    int reasoning_fields;
    /* the budget each reasoning_effort gives (SERVE_EFFORT_*; SERVE_THINK_BUDGET_UNSET: that
     * effort gives none, reasoning_budget holds) */
    int effort_budget[SERVE_EFFORTS];
    int n_threads;
    ts_device device; /* where the model runs (TS_DEVICE_CUDA needs a CUDA build and a GPU) */
    const char *api_key; /* NULL = no key required */
    /* --alias: the names the model answers to, the first its id (none: the model directory's
     * name, which it answers to in any case) */
    const char *alias[SERVE_MAX_ALIASES];
    int n_alias;
    /* --any-model: a request's "model" may name any model (llama-server's way: clients that
     * ask for their vendor's names get this one); the answer names it as the request did */
    bool any_model;
    /* CORS: "*" (the default) lets any web page read the answers, a comma-separated list of
     * origins only those, "" none (no CORS headers) */
    const char *cors_origins;
    size_t max_body;     /* bytes */
    int idle_timeout_s;  /* a connection that sends nothing for this long while a request is
                          * expected (before it, or within its headers or body) is closed */
    int send_timeout_s;  /* a client that takes no byte of its answer for this long is dropped
                          * (the time the answer is being made does not count) */
    int request_timeout_s; /* a request's headers and body must arrive within this (plus a second
                            * a SERVE_DEADLINE_RATE bytes of body), however they trickle; 0 off */
    int max_connections; /* open connections at most (lowered to what the process's file
                          * limit allows); one more is closed at once */
    int max_connections_per_ip; /* open connections from one address at most; 0 = no limit */
    size_t cache_mb;     /* prefix snapshots; 0 = no prefix reuse */
    size_t responses_store_mb; /* the Responses API's stored responses; 0 = none kept */
    int drain_ms;        /* on SIGTERM: how long running jobs may take to finish */
    int prefill_chunk;   /* prompt tokens a forward call; 0 = by the device (worker.h) */
    int64_t image_max_pixels; /* an image's pixels at most; 0 = SERVE_IMAGE_MAX_PIXELS */
    /* images and videos given by URL (serve/fetch.h): http(s) URLs fetched at all, a file's MB
     * at most, a fetch's seconds at most; the directory file: URLs are read from under (a
     * canonical path, serve_fetch_media_dir), NULL: none */
    bool allow_media_urls;
    int media_url_max_mb, media_url_timeout_s;
    const char *media_dir;
    /* --allowed-media-domains: http(s) URLs are fetched from these hosts only (a
     * comma-separated list; fetching on even without allow_media_urls); NULL: any */
    const char *media_hosts;
    /* speculative decoding: tokens guessed a step at most (0: none), from a request's
     * prediction and, with draft_lookup, by prompt lookup (serve/speculate.c) */
    int draft_max;
    bool draft_lookup;
    /* and, up to this many a step (0: none), from the model's multi-token-prediction block
     * (ts_engine_draft) */
    int draft_mtp;
    /* embeddings (POST /v1/embeddings): how an input's tokens' final hidden states become one
     * vector; TS_POOL_UNSET: the model's own pooling (an embedding model's), else the last
     * token's */
    ts_pooling pooling;
    /* the lengths `dimensions` may cut an embedding to (Matryoshka), overriding the model's
     * config; none (n 0): the model's */
    ts_matryoshka matryoshka;
    /* LoRA adapters (serve/lora.h): loaded with the model, in this order (their ids) */
    serve_lora_opts lora;
    int step_delay_ms;   /* testing aid: sleep before every decode step and embedding call */
    int load_delay_ms;   /* testing aid: sleep before loading the model */
} serve_opts;

void serve_opts_default(serve_opts *o);

/* Runs until SIGTERM/SIGINT; returns the process exit status (0 after a clean shutdown). */
int serve_run(const serve_opts *o);

#endif
