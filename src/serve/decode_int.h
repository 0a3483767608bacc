/* The decoder's internals that its files share (decode.c, speculate.c, embed_lane.c). Worker thread
 * only. */
#ifndef TS_SERVE_DECODE_INT_H
#define TS_SERVE_DECODE_INT_H

#include "serve/decode.h"

/* decode.c */
/* Ends the lane's job (how; st: the error, for SERVE_FINISH_ERROR) and reports it (done()). */
void serve_lane_end(serve_decoder *d, serve_lane *ln, serve_finish how, ts_status st);
/* The oldest lane started after `after` (lanes' `used` grows and is distinct) whose prompt -
 * or, with embedding, whose embedding job's inputs - still has tokens to put in; NULL when
 * none. */
serve_lane *serve_lane_prefilling(serve_decoder *d, uint64_t after, bool embedding);
/* A forward or a state change of the lane's slot failed: what the slot holds is no longer
 * known (no prefix is taken from it), and the lane's job ends with st. */
void serve_lane_fail(serve_decoder *d, serve_lane *ln, ts_status st);
/* Hands the lane's job its next token (with its log-probabilities tl when it wants them); the
 * job may end on it (then ln->job is NULL). */
void serve_lane_token(serve_decoder *d, serve_lane *ln, int32_t tok, const ts_logprobs *tl);
/* Whether the lane's next draw is constrained by its grammar. */
bool serve_lane_constrained(const serve_lane *ln);
/* The token the lane's next draw must give (the end of a thinking that used its budget, put in
 * a token a step), -1 when the draw is free. */
int32_t serve_lane_forced(const serve_lane *ln);
/* The lane's next token drawn on the host from the model's row (raw logits; the lane's
 * adjustments are applied to it in place): the same draw, from the same generator, as a decode
 * step makes where the logits are, the grammar's mask included, and its log-probabilities
 * when the job wants them. */
ts_status serve_lane_draw_row(serve_decoder *d, serve_lane *ln, float *row, int32_t *tok,
                              ts_logprobs *lp);
/* Prefix snapshots: reserves one of the lane's seq[0, len), under its adapters' tag, in the
 * cache (logits: its last row, or NULL)
 * at the room the engine says it takes; -1 when none is made. */
int serve_snap_reserve(serve_decoder *d, const serve_lane *ln, int len, const float *logits);
/* Saves the lane's slot, holding exactly len tokens, into the reserved snapshot id (-1:
 * nothing to do); drops the reservation when it cannot. */
void serve_snap_fill(serve_decoder *d, const serve_lane *ln, int id, int len);
/* The testing aid --debug-step-delay-ms: a sleep before a decode step's forward. */
void serve_decoder_step_delay(const serve_decoder *d);

/* speculate.c */
/* Tokens one lane may put in a speculative step: those to run again after a rewind to its
 * mark (at most draft_max + 1), its last token and its guesses. */
int serve_spec_lane_tokens(const serve_decoder *d);
/* The step's batch arrays (with draft_max > 0), and their release. */
ts_status serve_spec_init(serve_decoder *d);
void serve_spec_free(serve_decoder *d);
/* The lane's job starts decoding: where its guesses come from. */
void serve_spec_start(serve_decoder *d, serve_lane *ln);
/* The decode step when some lane guesses tokens or has tokens to run again; false (nothing
 * done) when none has: the plain step then runs. */
bool serve_spec_step(serve_decoder *d);

/* embed_lane.c */
/* Starts embedding job j on lane ln (serve_decoder_start for a job with pool set): its first
 * input from an empty slot; the lane keeps no prefix for later jobs. */
void serve_embed_start(serve_decoder *d, serve_lane *ln);
/* One forward call over the next chunk of every embedding lane's running input (a chunk of
 * their own: its outputs are hidden states, not logits); an input that is in is pooled into
 * its job's embedding, and a job whose inputs are all in ends. Part of serve_decoder_step. */
void serve_embed_step(serve_decoder *d);

#endif
