/* Runs one job on the engine's working slot: prefix reuse, prefill, sampling with penalties
 * and logprobs, text output, and the snapshots that later requests reuse. Worker thread only.
 *
 * Prefix reuse: slot 0 is the working sequence; slots 1..n hold snapshots (serve/prefix_cache).
 * A job restores the longest snapshot that is a prefix of its prompt and prefills only the
 * rest, in one piece: on a bandwidth-bound CPU every extra forward call is one more pass over
 * the weights, so the request path never splits a prompt for a snapshot. The state at the end
 * of the prompt is kept with its last logits row (a slot copy made once the first token is
 * out, no compute), so the same prompt again is restored whole and samples from the stored
 * row with no prefill at all. After the answer, while the worker is idle: for a raw
 * completion, the answer's own state (continued by the client); for a chat, the next turn's
 * prefix. The chat template re-renders an earlier answer without its think block (and without
 * the empty one of non-thinking mode), so the state after generation is never a prefix of the
 * next prompt; instead the conversation is rendered as the next request will render it (the
 * messages, this answer as the client gets it, and a placeholder turn) and everything up to
 * the placeholder is prefilled from the best snapshot and kept. The follow-up then prefills
 * only its new turn. */
#ifndef TS_SERVE_DECODE_H
#define TS_SERVE_DECODE_H

#include "serve/job.h"
#include "serve/metrics.h"
#include "serve/prefix_cache.h"

typedef struct {
    ts_engine *engine;
    const ts_tokenizer *tok;
    serve_prefix_cache *cache;
    serve_metrics *metrics;
    int step_delay_ms;
    int prefill_chunk; /* prompt tokens a forward call (at most the engine's batch) */
    /* tokens a forward call of the idle worker's next-turn prefill, which yields to a new
     * request between two calls (serve_decoder_init caps it at prefill_chunk) */
    int next_turn_chunk;
} serve_decoder_opts;

typedef struct {
    serve_decoder_opts o;
    int32_t think_open, think_close, turn_start;
    int n_vocab, n_ctx;
    float *logits;      /* [n_vocab] */
    int32_t *gen_count; /* [n_vocab] occurrences in the answer (presence/frequency penalty) */
    /* the penalties as logit adjustments (decode.c), for the host's draws and the forward's
     * (ts_sampler_set_adjust): n_adj entries, adj_at[id] the entry of a token or -1 */
    ts_logit_adjust *adj;
    int32_t *adj_at;
    int n_adj;
    int32_t *seq;       /* [n_ctx] the working sequence: prompt then answer */
    int n_seq;          /* tokens in seq; the state holds the first ts_engine_slot_len(0) */
    int32_t *pos, *slot;
    uint8_t *want; /* [prefill chunk] */
    bool answer_pending; /* seq holds an answer whose state may be snapshotted */
    bool slot_known;     /* slot 0 holds seq[0, slot_len(0)) (false after a failed forward) */
    int pending_snap;    /* snapshot slot still to receive the prompt's state, or -1 */
} serve_decoder;

ts_status serve_decoder_init(serve_decoder *d, const serve_decoder_opts *o);
void serve_decoder_free(serve_decoder *d);

/* Runs the job to its end; *how is the terminal state, err a message for SERVE_FINISH_ERROR.
 * Output goes into the job as it is decided. */
void serve_decoder_run(serve_decoder *d, serve_job *j, serve_finish *how, char *err,
                       size_t err_size);

/* After the job's terminal state was published: runs the answer's last token and keeps the
 * state as a snapshot. */
void serve_decoder_snapshot_answer(serve_decoder *d);

/* True when background work must stop (a request is waiting, or shutdown). */
typedef bool (*serve_interrupt_fn)(void *ctx);

/* After a chat job ended (STOP or LENGTH) and while nothing waits: prefills the prefix the
 * conversation's next request will start with and keeps it as a snapshot. Checks interrupt
 * between small prefill chunks and gives up as soon as it says so. *prefilled: the tokens run
 * through the model. Returns true when the prefix is held (already, or now). */
bool serve_decoder_prepare_next_turn(serve_decoder *d, const serve_job *j,
                                     serve_interrupt_fn interrupt, void *ctx, int *prefilled);

#endif
