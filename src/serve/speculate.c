/* Speculative decoding: a lane that can guess its next tokens (serve/draft.h: from the
 * request's prediction, or by prompt lookup) puts them in the decode step after its last token,
 * and the one forward call gives a row of logits for each. The lane then draws its tokens from
 * those rows in order, exactly as the plain steps would - the same draw, from the same
 * generator, with the adjustments, grammar and log-probabilities of each token in turn - and
 * goes on to the next row only while the token drawn is the one guessed (the row after a guess
 * was computed with that guess as its input). So the answer is the one decoding without guesses
 * gives; a right guess saves a step, a wrong one costs the rows that were not used.
 *
 * The slot then holds the guesses that were not drawn; it is rewound to the answer
 * (ts_engine_slot_rewind, from the mark taken before the step): an attention-only model just
 * stops reading those rows, a model with linear-attention layers goes back to its mark and the
 * tokens from there run again in the lane's next step, ahead of its last token.
 *
 * With draft_mtp the model's multi-token-prediction block guesses too (ts_engine_draft), for
 * lanes whose request brought no prediction and whose prompt lookup found nothing: one call
 * for all such lanes before the step. It guesses from the slot's last hidden state, so a lane
 * with tokens to run again (after a wrong guess) does not ask it that step. */
#include "base/status.h"
#include "serve/decode_int.h"

#include <stdlib.h>
#include <string.h>

int serve_spec_lane_tokens(const serve_decoder *d) { return 2 * d->o.draft_max + 2; }

ts_status serve_spec_init(serve_decoder *d) {
    size_t n = (size_t)d->o.n_lanes * (size_t)serve_spec_lane_tokens(d);
    d->s_tok = malloc(n * sizeof *d->s_tok);
    d->s_pos = malloc(n * sizeof *d->s_pos);
    d->s_slot = malloc(n * sizeof *d->s_slot);
    d->s_rope = malloc(3 * n * sizeof *d->s_rope);
    d->s_ids = malloc(n * sizeof *d->s_ids);
    d->s_want = malloc(n);
    /* a row of logits for every lane's last token and guesses (pages are taken as rows are
     * written: a greedy step's rows stay on the device) */
    size_t rows = (size_t)d->o.n_lanes * (size_t)(d->o.draft_max + 1);
    d->s_rows = malloc(rows * (size_t)d->n_vocab * sizeof *d->s_rows);
    if (d->o.draft_mtp > 0) {
        size_t nl = (size_t)d->o.n_lanes;
        d->m_lane = malloc(nl * sizeof *d->m_lane);
        d->m_slot = malloc(nl * sizeof *d->m_slot);
        d->m_tok = malloc(nl * sizeof *d->m_tok);
        d->m_shift = malloc(nl * sizeof *d->m_shift);
        d->m_ids = malloc(nl * (size_t)d->o.draft_mtp * sizeof *d->m_ids);
        if (!d->m_lane || !d->m_slot || !d->m_tok || !d->m_shift || !d->m_ids)
            return ts_error(TS_ERR_NOMEM, "out of memory for the MTP block's guesses");
    }
    if (!d->s_tok || !d->s_pos || !d->s_slot || !d->s_rope || !d->s_ids || !d->s_want || !d->s_rows)
        return ts_error(TS_ERR_NOMEM,
                        "out of memory for speculative decoding's rows (%zu of %d floats): "
                        "lower --draft-max or --parallel",
                        rows, d->n_vocab);
    return TS_OK;
}

void serve_spec_free(serve_decoder *d) {
    free(d->s_tok), free(d->s_pos), free(d->s_slot), free(d->s_rope), free(d->s_ids);
    free(d->s_want), free(d->s_rows);
    free(d->m_lane), free(d->m_slot), free(d->m_tok), free(d->m_shift), free(d->m_ids);
}

void serve_spec_start(serve_decoder *d, serve_lane *ln) {
    const serve_job *j = ln->job;
    ln->guess = (serve_draft){j->pred_ids, j->n_pred, 0, d->o.draft_lookup};
    ln->n_draft = 0;
    ln->draft_cap = d->o.draft_max;
    ln->draft_wait = ln->draft_misses = 0;
}

static int min_i(int a, int b) { return a < b ? a : b; }

/* The lane's guesses for this step into ln->draft: as many as the answer may still take after
 * the step's first token (max_tokens, the context) and the step's share allow. From the
 * prediction or prompt lookup; where they have none, ln->mtp_want says how many to ask of the
 * MTP block (mtp_guesses). */
static int lane_guess(serve_decoder *d, serve_lane *ln, int redo) {
    const serve_job *j = ln->job;
    ln->mtp_want = 0;
    bool mtp = d->o.draft_mtp > 0 && redo == 0 && ln->n_seq >= 2;
    if (!ln->guess.pred && !ln->guess.lookup && !mtp) return 0;
    if (ln->draft_wait > 0) {
        ln->draft_wait--;
        return 0;
    }
    int max = min_i(ln->draft_cap, j->max_tokens - ln->k - 1);
    max = min_i(max, d->n_ctx - ln->n_seq);
    max = min_i(max, serve_spec_lane_tokens(d) - redo - 1);
    int k = serve_draft_guess(&ln->guess, ln->seq, ln->n_seq, ln->k, max, ln->draft);
    for (int i = 0; i < k; i++) /* the prompt's image tokens are keys, not ids */
        if (ln->draft[i] < 0 || ln->draft[i] >= d->n_vocab) return i;
    if (k == 0 && mtp) ln->mtp_want = min_i(max, d->o.draft_mtp);
    return k;
}

/* The MTP block's guesses for every lane that asks (ln->mtp_want), in one call; a lane gets
 * none where the call fails (guesses are never needed: the step runs without them). */
static void mtp_guesses(serve_decoder *d) {
    int n = 0, k = 0;
    for (int l = 0; l < d->o.n_lanes; l++) {
        serve_lane *ln = &d->lane[l];
        if (!ln->job || !ln->decoding || ln->mtp_want <= 0) continue;
        d->m_lane[n] = l, d->m_slot[n] = ln->slot, d->m_tok[n] = ln->last;
        d->m_shift[n] = ln->job->images.delta;
        k = ln->mtp_want > k ? ln->mtp_want : k;
        n++;
    }
    if (n == 0) return;
    bool ok = ts_engine_draft(d->o.engine, n, d->m_slot, d->m_tok, d->m_shift, k, d->m_ids, NULL) ==
              TS_OK;
    for (int i = 0; i < n; i++) {
        serve_lane *ln = &d->lane[d->m_lane[i]];
        ln->n_draft = ok ? ln->mtp_want : 0;
        memcpy(ln->draft, d->m_ids + (size_t)i * k, (size_t)ln->n_draft * sizeof *ln->draft);
    }
}

/* A lane whose draws the engine's argmax gives: greedy, nothing that adjusts or masks the
 * logits, no log-probabilities. A step of only such lanes keeps its logits where they are. */
static bool plain_greedy(const serve_lane *ln) {
    return ln->job->sp.temperature <= 0.0f && !ln->penalised && !ln->gm && !ln->want_lp;
}

/* Adds acc accepted and rej rejected guesses to the job's counts. They are read with its usage
 * once it ended, so they must be right before the token that ends it is handed over: a step's
 * guesses are all counted rejected when they are made, and each one drawn moves over. */
static void count_guesses(serve_job *j, int acc, int rej) {
    pthread_mutex_lock(&j->mu);
    j->draft_accepted += acc;
    j->draft_rejected += rej;
    pthread_mutex_unlock(&j->mu);
}

/* Draws the lane's tokens from its rows of the step (ids for a greedy step, else logits), the
 * first from its last token's row, each next one while the token drawn was the guess; returns
 * how many guesses were drawn. Each token's latency is its share of the step's dt. */
static int lane_draws(serve_decoder *d, serve_lane *ln, bool greedy, double dt) {
    serve_job *j = ln->job;
    int k = ln->n_draft, right_ones = 0, out = 0;
    for (int r = 0; r <= k; r++) {
        int32_t tok;
        ts_logprobs tl = {0};
        if (greedy) { /* a token put in for the lane (no log-probabilities in such a step) */
            tok = serve_lane_forced(ln);
            if (tok < 0) tok = d->s_ids[ln->b_row + r];
        } else {
            float *row = d->s_rows + (size_t)(ln->b_row + r) * d->n_vocab;
            ts_status st = serve_lane_draw_row(d, ln, row, &tok, &tl);
            if (st != TS_OK) {
                serve_lane_end(d, ln, SERVE_FINISH_ERROR, st);
                break;
            }
        }
        bool right = r < k && tok == ln->draft[r];
        right_ones += right;
        out++;
        if (right) count_guesses(j, 1, -1);
        serve_lane_token(d, ln, tok, &tl);
        if (ln->job != j || !right) break;
    }
    for (int i = 0; i < out; i++)
        serve_metrics_token_latency(d->o.metrics, dt / out);
    return right_ones;
}

/* How much the lane guesses next, from how its guesses of this step went: as many as were
 * right and one more, twice as many after a step of only right ones; none for 1, 2, 4 .. 16
 * steps after each step in a row whose first guess was wrong. On 2 CPU cores a row costs ~40%
 * of a single-token step of Gemma 3 270M (bench/RESULTS.md): guessing on where guesses are
 * mostly wrong would slow the answer down. */
static void lane_adapt(serve_decoder *d, serve_lane *ln, int right) {
    if (ln->n_draft == 0) return;
    if (right == ln->n_draft) { /* (the MTP block's guesses are capped apart: lane_guess) */
        ln->draft_cap = min_i(d->o.draft_max, 2 * ln->draft_cap);
    } else {
        ln->draft_cap = right + 1;
    }
    if (right > 0) {
        ln->draft_misses = 0;
    } else {
        ln->draft_wait = 1 << min_i(ln->draft_misses, 4);
        ln->draft_misses++;
    }
}

/* After the lane's draws: its slot holds the answer but its last token (and nothing after):
 * the guesses not drawn are taken back. */
static void lane_rewind(serve_decoder *d, serve_lane *ln) {
    int keep = ln->n_seq - 1, got = 0;
    if (!ln->slot_known || ts_engine_slot_len(d->o.engine, ln->slot) <= keep) return;
    ts_status st = ts_engine_slot_rewind(d->o.engine, ln->slot, keep, &got);
    if (st == TS_OK) return;
    ln->slot_known = false;
    if (ln->job) serve_lane_end(d, ln, SERVE_FINISH_ERROR, st);
}

bool serve_spec_step(serve_decoder *d) {
    ts_engine *e = d->o.engine;
    bool any = false, greedy = true, any_shift = false;
    int n = 0, rows = 0;
    for (int l = 0; l < d->o.n_lanes; l++) { /* the guesses */
        serve_lane *ln = &d->lane[l];
        ln->n_draft = ln->mtp_want = 0;
        if (!ln->job || !ln->decoding) continue;
        int from = ts_engine_slot_len(e, ln->slot);
        ln->n_draft = lane_guess(d, ln, ln->n_seq - 1 - from);
    }
    if (d->o.draft_mtp > 0) mtp_guesses(d);
    for (int l = 0; l < d->o.n_lanes; l++) {
        serve_lane *ln = &d->lane[l];
        if (!ln->job || !ln->decoding) continue;
        int from = ts_engine_slot_len(e, ln->slot), redo = ln->n_seq - 1 - from;
        int k = ln->n_draft;
        if (k > 0 && ts_engine_slot_mark(e, ln->slot) != TS_OK) k = 0; /* no memory: no guess */
        ln->n_draft = k;
        if (k > 0) count_guesses(ln->job, 0, k);
        any |= k > 0 || redo > 0;
        greedy &= plain_greedy(ln);
        ln->b_row = rows;
        int shift = ln->job->images.delta; /* rotary positions after an image */
        any_shift |= shift != 0;
        for (int p = from; p < ln->n_seq + k; p++, n++) {
            int32_t t = p < ln->n_seq - 1    ? serve_images_token(&ln->job->images, ln->seq[p])
                        : p == ln->n_seq - 1 ? ln->last
                                             : ln->draft[p - ln->n_seq];
            d->s_tok[n] = t, d->s_pos[n] = p, d->s_slot[n] = ln->slot;
            d->s_want[n] = p >= ln->n_seq - 1;
            d->s_rope[3 * n] = d->s_rope[3 * n + 1] = d->s_rope[3 * n + 2] = p + shift;
        }
        rows += k + 1;
    }
    if (!any) return false;
    ts_batch b = {n, d->s_tok, d->s_pos, d->s_slot, d->s_want, NULL, any_shift ? d->s_rope : NULL};
    serve_decoder_step_delay(d);
    double t0 = serve_now();
    ts_status st =
        greedy ? ts_engine_forward_greedy(e, &b, d->s_ids) : ts_engine_forward(e, &b, d->s_rows);
    double dt = serve_now() - t0;
    int drafted = 0, accepted = 0;
    for (int l = 0; l < d->o.n_lanes; l++) {
        serve_lane *ln = &d->lane[l];
        if (!ln->job || !ln->decoding) continue;
        drafted += ln->n_draft;
        if (st != TS_OK) {
            serve_lane_fail(d, ln, st);
            continue;
        }
        int right = lane_draws(d, ln, greedy, dt);
        accepted += right;
        lane_adapt(d, ln, right);
        lane_rewind(d, ln);
    }
    serve_metrics_decode_call(d->o.metrics, drafted, accepted);
    return true;
}
