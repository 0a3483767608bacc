/* Runs jobs on the engine's working slots ("lanes"), several at once: prefix reuse, prefill,
 * sampling with penalties and logprobs, text output, and the snapshots that later requests
 * reuse. Worker thread only.
 *
 * Lanes: engine slots 0 .. n_lanes-1 each hold one running sequence; slots n_lanes .. hold
 * snapshots (serve/prefix_cache). A job is started on a free lane (serve_decoder_start:
 * restore the longest reusable prefix), then every serve_decoder_step runs one chunk of the
 * oldest unfinished prompt, with the next chunks of younger ones while the call stays within a
 * chunk (a prompt's last chunk draws its first token from the prompt's logits), and
 * one forward over the last token of every decoding lane - one batched decode step, each lane
 * drawing its next token with its own sampler - and hands each lane its token; a lane whose
 * job ends is free again. A long prompt so never stops the others' answers for longer than
 * one chunk (--prefill-chunk).
 *
 * Prefix reuse: a job restores the longest snapshot that is a prefix of its prompt (or keeps
 * what its lane already holds, when that is longer) and prefills only the rest, in one piece:
 * on a bandwidth-bound CPU every extra forward call is one more pass over the weights, so the
 * request path never splits a prompt for a snapshot. The state at the end of the prompt is
 * kept with its last logits row (a slot copy made once the first token is out, no compute), so
 * the same prompt again is restored whole and samples from the stored row with no prefill at
 * all. After the answer, while the worker is idle (serve_decoder_idle_work, next_turn.c): for
 * a raw completion, the answer's own state (continued by the client); for a chat, the next
 * turn's prefix. The chat template re-renders an earlier answer without its think block (and
 * without the empty one of non-thinking mode), so the state after generation is never a prefix
 * of the next prompt; instead the conversation is rendered as the next request will render it
 * (the messages, this answer as the client gets it, and a placeholder turn) and everything up
 * to the placeholder is prefilled from the best snapshot and kept. The follow-up then prefills
 * only its new turn. */
#ifndef TS_SERVE_DECODE_H
#define TS_SERVE_DECODE_H

#include "serve/draft.h"
#include "serve/job.h"
#include "serve/metrics.h"
#include "serve/prefix_cache.h"

typedef struct {
    ts_engine *engine;
    const ts_tokenizer *tok;
    serve_prefix_cache *cache;
    serve_metrics *metrics;
    int n_lanes; /* sequences decoded together (engine slots 0 .. n_lanes-1) */
    int step_delay_ms;
    int prefill_chunk; /* prompt tokens a forward call (at most the engine's batch) */
    /* tokens a forward call of the idle worker's next-turn prefill, which yields to a new
     * request between two calls (serve_decoder_init caps it at prefill_chunk) */
    int next_turn_chunk;
    int n_embd; /* the model's width: rows of an image's embeddings */
    const ts_model *model; /* its Dense layers after an embedding's pooling */
    int n_embd_out;        /* an embedding's length after them */
    /* speculative decoding (speculate.c): the most tokens a lane guesses a step (0: none),
     * and whether it guesses by prompt lookup too (else only from a request's prediction) */
    int draft_max;
    bool draft_lookup;
    int n_lora; /* LoRA adapters the model has (a job's scales for each: serve_job.lora) */
    /* guesses a step from the model's multi-token-prediction block (0: none) */
    int draft_mtp;
} serve_decoder_opts;

/* One working slot and the job running on it. */
typedef struct {
    int slot;            /* the engine slot */
    int32_t *seq;        /* [n_ctx] the sequence: prompt then answer */
    int n_seq;           /* tokens in seq; the slot holds the first ts_engine_slot_len(slot) */
    bool slot_known;     /* the slot holds seq[0, slot_len) (false after a failed forward) */
    uint64_t lora_tag;   /* the adapters the slot's state was computed with (serve_lora_tag) */
    bool answer_pending; /* seq holds an answer whose state may be snapshotted */
    int pending_snap;    /* snapshot still to receive the prompt's state, or -1 */
    int pending_len;     /* its tokens */
    uint64_t used;       /* when it last took a job (the least recently used is reused first) */
    /* the penalties as logit adjustments (decode.c), for the host's draw and the forward's
     * (ts_sampler_set_adjust): n_adj entries, adj_at[id] the entry of a token or -1 */
    int32_t *gen_count; /* [n_vocab] occurrences in the answer (presence/frequency penalty) */
    ts_logit_adjust *adj;
    int32_t *adj_at;
    int n_adj;

    /* ---- the running job: NULL when the lane is free ---- */
    serve_job *job; /* a reference of its own */
    ts_sampler *smp;
    ts_detokenizer *dt;
    serve_textout to;
    /* the job's grammar (response_format): it constrains every draw of the content channel -
     * the reasoning stays free; NULL without one */
    ts_grammar_matcher *gm;
    bool want_lp, penalised;
    int n_top;      /* alternatives the job wants (when want_lp) */
    int prefill_at; /* the next prompt token to run through the model */
    bool decoding;  /* the prompt is in and the first token out: in the decode steps */
    bool encoding;  /* the job's images still need the vision tower (one a step) */
    int k;          /* tokens out */
    int32_t last;   /* the last token out: the next step's input */
    ts_think_budget think; /* the job's thinking budget (think_budget, think_end) */
    /* speculative decoding: where the guesses come from, and this step's (n_draft of them in
     * draft[draft_max]) and its first row of the step's logits */
    serve_draft guess;
    int32_t *draft;
    int n_draft, b_row;
    /* how many it may guess now (what was right and one more after a miss, twice as many after
     * a step of only right guesses), steps it sits out before guessing again, and the steps in a
     * row whose first guess was wrong (each doubles the next wait): a wrong guess costs a row of
     * compute, which on a CPU is not free (speculate.c) */
    int draft_cap, draft_wait, draft_misses;
    int mtp_want; /* guesses asked of the MTP block this step (0: none) */

    /* an embedding job (embed_lane.c): the input running, and its tokens' hidden states summed
     * so far (mean pooling; [n_embd], made with the lane's first such job) */
    int input;
    double *pool_sum;

    /* a job that ended (stop or length) whose idle work - its next turn's prefix, or its
     * answer's state - has not run yet: a reference, NULL when none */
    serve_job *ended;
    uint64_t ended_at; /* when it ended (the most recent's idle work runs first) */
} serve_lane;

/* A job's end, reported by the decoder to its owner (the worker): the job's terminal state
 * and, for SERVE_FINISH_ERROR, a message. Called once a job, on the worker thread. */
typedef void (*serve_job_done_fn)(void *ctx, serve_job *j, serve_finish how, const char *err);

/* The most prompt tokens of an echo with logprobs in one prefill call (a logits row each). */
#define SERVE_ECHO_ROWS 64

typedef struct {
    serve_decoder_opts o;
    int32_t think_open, think_close, turn_start;
    int n_vocab, n_ctx;
    serve_lane *lane; /* [n_lanes] */
    uint64_t clock;   /* lane use order */
    serve_job_done_fn done;
    void *done_ctx;
    /* [n_lanes][n_vocab] the last rows of the prompts a prefill call finished; a decode step
     * with a constrained lane takes its rows here too */
    float *logits;
    /* the vocabulary as grammars see it, made when the first job with a grammar starts, and a
     * row to mask a copy of the logits in */
    ts_grammar_vocab *gvocab;
    float *gm_row;
    int32_t *tok, *pos, *slot;
    uint8_t *want; /* [prefill chunk] (the idle work's prefill uses pos, slot and want too) */
    /* [prefill chunk] a prefill call's image rows (NULL for text) and [3 x chunk] rotary
     * positions, given to the engine when a prompt of the call holds images */
    const float **embd;
    int32_t *rope;
    /* one decode step's batch, a row per running lane */
    int32_t *b_tok, *b_pos, *b_slot, *b_drawn;
    int32_t *b_rope; /* [3 x n_lanes]: rotary positions when a job's images shift them */
    int *b_lane;
    ts_sampler **b_smp;
    ts_logprobs *b_lp;
    serve_lane **b_in; /* the lanes of one prefill call */
    int *b_piece;      /* and the tokens each puts in */
    int *b_row;        /* and its first logits row */
    /* an echo with logprobs (a completion's prompt scored token by token) takes a row for each
     * token it puts in: [SERVE_ECHO_ROWS + n_lanes] rows, made for the first such job, and a
     * sampler that computes log-probabilities from them */
    float *echo_rows;
    ts_sampler *echo_smp;
    int32_t *eog; /* the vocabulary's end-of-generation tokens (min_tokens bans them) */
    int n_eog;
    /* a speculative step's batch (speculate.c), [n_lanes x serve_spec_lane_tokens] each, its
     * greedy ids a row, and its rows of logits ([n_lanes x (draft_max + 1)] x n_vocab) */
    int32_t *s_tok, *s_pos, *s_slot, *s_rope, *s_ids;
    uint8_t *s_want;
    float *s_rows;
    /* the step's guesses from the MTP block (with draft_mtp): the lanes asking, their slots,
     * last tokens and rotary shifts [n_lanes], and the guesses [n_lanes x draft_mtp] */
    int *m_lane;
    int32_t *m_slot, *m_tok, *m_shift, *m_ids;
    /* [prefill chunk x n_embd] an embedding call's hidden states (embed_lane.c), made for the
     * first embedding job; the inputs a call completes (a lane's at most): their pooled states
     * [n_lanes x n_embd], embeddings [n_lanes x n_embd_out] and lanes, taken through the
     * model's Dense layers together */
    float *hidden, *e_pooled, *e_out;
    serve_lane **e_lane;
} serve_decoder;

ts_status serve_decoder_init(serve_decoder *d, const serve_decoder_opts *o, serve_job_done_fn done,
                             void *done_ctx);
/* Ends nothing: the worker has ended every job first. Drops the idle work's references. */
void serve_decoder_free(serve_decoder *d);

/* Runs the vision tower over the next image of im (the job's) not yet encoded, into its rows
 * of im->embd, and frees that picture; serve_decoder_encode_images: every one left. */
ts_status serve_decoder_encode_next(serve_decoder *d, serve_images *im);
ts_status serve_decoder_encode_images(serve_decoder *d, serve_images *im);
/* The free lane for j: the one already holding the longest prefix of its prompt, else one
 * without idle work pending, the least recently used first; -1 when every lane is busy, or
 * while another lane prefills j's very prompt (j then starts from its snapshot). */
int serve_decoder_pick_lane(serve_decoder *d, const serve_job *j);
/* Starts j on lane l (from serve_decoder_pick_lane): the prefix restore, and when that was the
 * whole prompt (restored with its logits), the first token; the job may end here (then done()
 * was called). The rest of the prompt goes in in the next steps. */
void serve_decoder_start(serve_decoder *d, int l, serve_job *j);
/* One step: the jobs that were cancelled end first; then one prefill call (the oldest unfinished
 * prompt's next chunk, and the younger ones' that fit beside it), and one decode step of every
 * decoding lane: each gets its next token, and the jobs that end on it are reported through
 * done(). */
void serve_decoder_step(serve_decoder *d);

/* ---- idle work (next_turn.c) ------------------------------------------------------------ */

/* True when background work must stop (a request is waiting, or shutdown). */
typedef bool (*serve_interrupt_fn)(void *ctx);

/* True when a lane has an ended job whose idle work has not run. */
bool serve_decoder_has_idle_work(const serve_decoder *d);
/* Runs the idle work of the lanes' ended jobs, the most recently ended first, each dropped
 * once tried: for a chat, the prefix the conversation's next request starts with (prefilled
 * in small chunks, interrupt checked between them, kept as a snapshot); for a raw completion,
 * the answer's own state. Stops as soon as interrupt says so. */
void serve_decoder_idle_work(serve_decoder *d, serve_interrupt_fn interrupt, void *ctx);

#endif
