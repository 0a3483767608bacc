/* The sampler as the engine uses it for sampling on the device (ts_backend_ops.sample): the
 * request a draw makes of the backend, and the host's part of the draw when the backend gives
 * back a subset of candidates instead of a token. */
#ifndef TS_ENGINE_SAMPLER_INT_H
#define TS_ENGINE_SAMPLER_INT_H

#include <stdbool.h>

#include "backend/backend.h"
#include "tessera.h"

/* The vocabulary the sampler was made for. */
int ts_sampler_n_vocab(const ts_sampler *s);
/* Applies the adjustments of ts_sampler_set_adjust to a row of logits (the host's side of what
 * a backend's sampling op does on the device). */
void ts_sampler_adjust(const ts_sampler *s, float *logits);
/* Temperature 0 or top-k 1: the argmax, no generator involved. */
bool ts_sampler_is_greedy(const ts_sampler *s);
/* The next draw's parameters; takes its uniform number from the generator (as
 * ts_sampler_sample would for this draw), so device and host draws follow one sequence. */
ts_sample_req ts_sampler_request(ts_sampler *s);
/* The request the next draw will make, the generator left as it is (decoding ahead queues a
 * draw before its caller asks for it). */
ts_sample_req ts_sampler_peek(const ts_sampler *s);
/* The token for a backend's answer to req: its id, or the host's draw over the subset it kept
 * (the same steps as ts_sampler_sample on the whole row, with req's uniform number; the list
 * is put into vocabulary order in place first). -1 when the list holds no valid token. */
int32_t ts_sampler_finish(ts_sampler *s, const ts_sample_req *req, const ts_sample_res *res);

/* The request for the log-probabilities of a row whose draw is done (ts_engine_forward_sample
 * _logprobs): a top-k list of n_top (at least 1) at temperature 1 and no adjustments - the
 * backend answers with a candidate list holding the row's n_top best and the row's sum of
 * exp(l - max). */
ts_sample_req ts_sampler_logprob_request(int n_top);
/* ts_sampler_logprobs from such an answer (res: the list and the sum) and the drawn token's
 * logit chosen: lse = max + log(total), the alternatives the list's best. False when the
 * answer holds no candidate. */
bool ts_sampler_logprobs_list(ts_sampler *s, const ts_sample_res *res, float chosen, int n_top,
                              ts_logprobs *out);

#endif
