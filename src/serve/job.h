/* A generation job: what preparation produced, and what the worker sends back.
 *
 * The HTTP thread fills the input, submits the job and then only reads the output under the
 * job's mutex; the worker appends output and finally sets exactly one terminal state. The job
 * is shared by reference count (the HTTP side and the worker each hold one). */
#ifndef TS_SERVE_JOB_H
#define TS_SERVE_JOB_H

#include "serve/images.h"
#include "serve/stop.h"
#include "serve/textout.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#define SERVE_MAX_TOP_LOGPROBS 20

typedef enum {
    SERVE_RUNNING = 0,
    SERVE_FINISH_STOP,      /* end-of-generation token or a stop string */
    SERVE_FINISH_LENGTH,    /* max_tokens or the context window */
    SERVE_FINISH_CANCELLED, /* the client left or the server shut down */
    SERVE_FINISH_ERROR,
} serve_finish;

/* How an embedding job pools the final hidden states of an input's tokens (--pooling) */
typedef enum {
    SERVE_POOL_NONE = 0, /* not an embedding job: an answer */
    SERVE_POOL_LAST,     /* the last token's: the only one that has seen the whole input */
    SERVE_POOL_MEAN,     /* the mean over the input's tokens */
    SERVE_POOL_FIRST,    /* the first token's (an encoder's "cls" pooling) */
} serve_pool;

typedef struct {
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_id[SERVE_MAX_TOP_LOGPROBS];
    float top_lp[SERVE_MAX_TOP_LOGPROBS];
} serve_logprob;

/* A run of output text of one channel: bytes [off, off+len) of serve_job.text. */
typedef struct {
    serve_channel ch;
    size_t off, len;
} serve_segment;

typedef struct serve_job {
    /* ---- input: set before submit, read-only afterwards ---- */
    int32_t *ids; /* the whole prompt, owned */
    int n_ids;
    int max_tokens;
    ts_sampler_params sp;
    float presence_penalty, frequency_penalty, repetition_penalty;
    ts_logit_adjust *bias; /* owned: the request's logit_bias, distinct ids in the vocabulary */
    int n_bias;
    char *stops[SERVE_MAX_STOPS]; /* owned */
    int n_stops;
    bool keep_stop;    /* a stop string that ends the answer is part of it */
    int32_t *stop_ids; /* owned: tokens that end the answer (vLLM's stop_token_ids) */
    int n_stop_ids;
    /* tokens that end the answer as end-of-generation ones do (their text not shown; none with
     * ignore_eos): a fill in the middle's <|fim_pad|>, <|repo_name|>, <|file_sep|> */
    int32_t end_ids[3];
    int n_end_ids;
    /* the answer's first min_tokens tokens cannot end it: end-of-generation tokens (unless
     * ignore_eos) and stop_ids are banned from the draws, stop strings not yet matched */
    int min_tokens;
    bool in_think;     /* the prompt ends inside <think> */
    bool reasoning_inline; /* the thinking stays in the content, tags and all */
    /* the thinking budget: once the answer has thought this many tokens (-1: no bound), the
     * decoder puts in think_end (owned: the server's --reasoning-budget-message, then
     * </think>) for it, one token a step, instead of what it would draw (serve/decode.c) */
    int think_budget;
    int32_t *think_end;
    int n_think_end;
    bool ignore_eos;
    int top_logprobs;  /* -1 = no logprobs */
    bool parse_tools;  /* tool calls in the content become SERVE_CH_TOOL segments */
    /* echo (completions): the prompt's text, valid UTF-8, sent before the answer's (owned;
     * NULL without) */
    char *echo_text;
    size_t echo_len;
    /* echo with logprobs: the prompt's tokens' log-probabilities, entry i token i's given those
     * before it (entry 0 has none), written by the worker as the prompt is prefilled (whole
     * once prompt_lp_done, under mu); NULL otherwise */
    serve_logprob *prompt_lp;
    /* a request's later choice (n > 1): the idle work keeps no state after it - a conversation
     * goes on from the first choice, and the others' snapshots would evict useful ones */
    bool no_idle_work;
    ts_grammar *grammar; /* owned; NULL = free text; else the content must follow it */
    /* the request's prediction (OpenAI's Predicted Outputs) as tokens, owned, that the decoder
     * guesses the answer from (serve/speculate.c); NULL without */
    int32_t *pred_ids;
    int n_pred;
    /* /infill: the prompt's first keep_at tokens (the project's files) are kept as a snapshot
     * once they are in - the editor's next requests about the same files start from it - so
     * the prompt goes in in two pieces at least; 0: none (serve/infill.h) */
    int keep_at;
    /* the LoRA adapters' scales for this job's sequence (ts_engine_slot_lora; all 0: none),
     * and the tag prefix reuse keys its state by (serve_lora_tag) */
    float lora[TS_MAX_LORA];
    uint64_t lora_tag;
    /* the prompt's images (n 0: none): decoded and planned here, encoded by the worker when
     * their tokens must run; their keys are what prefix reuse compares (serve/images.h) */
    serve_images images;
    /* an embedding (POST /v1/embeddings) instead of an answer: ids holds n_inputs inputs one
     * after another, input i at [input_at[i], input_at[i + 1]); each runs from an empty slot
     * and its tokens' final hidden states are pooled into embedding[i * n_embd ...], scaled to
     * unit length; written by the worker before the job ends. SERVE_POOL_NONE: an answer. */
    serve_pool pool;
    int n_inputs;
    int *input_at;    /* owned, [n_inputs + 1] */
    float *embedding; /* owned, [n_inputs * n_embd] */
    /* chat: the request, owned; after the answer the worker renders the next turn's prefix
     * from it (read-only on both sides) */
    struct serve_request *req;

    /* ---- shared: under mu ---- */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_bool cancel; /* set by the HTTP side (client left) or at shutdown */
    ts_strbuf text;
    serve_segment *seg;
    int n_seg, cap_seg;
    serve_logprob *lp;
    int n_lp, cap_lp;
    int32_t *out_ids; /* generated ids, [completion_tokens] */
    int cap_ids;
    serve_finish finish;
    /* what ended an answer that stopped (vLLM's stop_reason): the index of its stop string,
     * or the stop_token_ids entry drawn; -1 for neither (an end-of-generation token, ...) */
    int stop_str;
    int32_t stop_token;
    char error[256];
    int prompt_tokens, cached_tokens, completion_tokens;
    /* tokens guessed ahead (speculative decoding) that the model drew as guessed (accepted),
     * and that it did not or that came after the answer's end (rejected) */
    int draft_accepted, draft_rejected;
    bool started; /* the worker dequeued it */
    bool prompt_lp_done;
    double t_submit, t_first_token, t_done;

    atomic_int refs;
} serve_job;

/* A job with one reference (the caller's). */
/* What a sequence's state depends on beyond its tokens, for prefix reuse: 0 for no adapters
 * (every scale 0), else a hash of the n scales (never 0). */
uint64_t serve_lora_tag(const float *scales, int n);
ts_status serve_job_create(serve_job **out);
void serve_job_ref(serve_job *j);
void serve_job_unref(serve_job *j);

/* Waits up to timeout_ms for the output to grow past (n_seg, n_lp) or for the job to end;
 * called with mu held (cond wait). */
void serve_job_wait_locked(serve_job *j, int n_seg, int n_lp, int timeout_ms);

/* The piece of a finished answer that starts at segment i - a Responses output item, a
 * Messages content block: a tool call is one segment, the consecutive segments of a text
 * channel are one piece of adjacent text. Its text (*off, *len) and the segment after it. */
int serve_job_piece_end(const serve_job *j, int i, size_t *off, size_t *len);

double serve_now(void);

#endif
