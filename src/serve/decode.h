/* Runs one job on the engine's working slot: prefix reuse, prefill, sampling with penalties
 * and logprobs, text output, and the snapshots that later requests reuse. Worker thread only.
 *
 * Prefix reuse: slot 0 is the working sequence; slots 1..n hold snapshots (serve/prefix_cache).
 * A job restores the longest snapshot that is a prefix of its prompt AND shorter than it (at
 * least one prompt token must run through the model, so the first token's logits exist) and
 * prefills only the rest. Snapshots are taken at three points: where the prompt's last turn
 * starts (the prefix the next turn of a chat shares: the template re-renders earlier answers,
 * so the state after an answer is rarely a prefix of the next prompt), one token before the
 * end of the prompt (so the same prompt again prefills only its last token), and after the
 * answer (a raw completion continued by the client). */
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
} serve_decoder_opts;

typedef struct {
    serve_decoder_opts o;
    int32_t think_open, think_close;
    int n_vocab, n_ctx;
    float *logits;      /* [n_vocab] */
    int32_t *gen_count; /* [n_vocab] occurrences in the answer (presence/frequency penalty) */
    uint8_t *seen;      /* [n_vocab] in prompt or answer (repetition penalty) */
    int32_t *seq;       /* [n_ctx] the working sequence: prompt then answer */
    int n_seq;          /* tokens in seq; the state holds the first ts_engine_slot_len(0) */
    int32_t *pos, *slot;
    uint8_t *want; /* [prefill chunk] */
    bool answer_pending; /* seq holds an answer whose state may be snapshotted */
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

#endif
