/* Decoding ahead (engine_int.h, ts_ahead): decode steps queued one step early.
 *
 * A decode step's input is the previous step's output, so without this the device waits while
 * the host reads step t's ids, hands them back and the model queues step t + 1 (~50 us of a
 * ~700 us step of the 0.8B on an H200). Here the engine queues step t + 1 right after launching
 * step t, fed from step t's ids where they lie, and the backend holds it; the next call launches
 * it if it asks for exactly that step (the same slots at the next positions, fed the ids step t
 * gave), else drops it. A stop, a different token or any other use of the engine drops it, and
 * nothing of a dropped step ran: the sequences' state is as if it was never queued. */
#include "engine/engine_int.h"
#include "engine/sampler_int.h"

#include <stdlib.h>
#include <string.h>

ts_status engine_ahead_init(ts_engine *e) {
    ts_ahead *a = &e->ahead;
    const ts_backend_ops *op = e->be->ops;
    const char *env = getenv("TESSERA_DECODE_AHEAD");
    /* Not with the MTP block on: on an H100 its forwards held ahead (the block following each
     * step) made a later step fault on the device (an illegal address; CUDA graphs on, not
     * found with graphs off, launches blocking or under compute-sanitizer), not yet
     * root-caused. A speculative step, which the block is there for, is not held anyway. */
    a->off = (env && strcmp(env, "0") == 0) || e->model->mtp_on || !op->step_can_hold ||
             !op->argmax_held || !op->sample_held || !op->sample_held_fits || !op->get_rows_fed ||
             !op->step_launch || !op->step_seal || !op->step_wait || !op->step_drop;
    if (a->off) return TS_OK;
    size_t n = (size_t)e->n_batch;
    a->pos = malloc(n * sizeof *a->pos);
    a->slot = malloc(n * sizeof *a->slot);
    a->rope3 = malloc(3 * n * sizeof *a->rope3);
    a->want = malloc(n);
    a->ids[0] = malloc(n * sizeof *a->ids[0]);
    a->ids[1] = malloc(n * sizeof *a->ids[1]);
    a->req = malloc(n * sizeof *a->req);
    a->req_now = malloc(n * sizeof *a->req_now);
    a->lp_req = malloc(n * sizeof *a->lp_req);
    a->lp_logit = malloc(2 * n * TS_MAX_TOP_LOGPROBS * sizeof *a->lp_logit);
    a->lp_tok = malloc(2 * n * TS_MAX_TOP_LOGPROBS * sizeof *a->lp_tok);
    bool lp_ok = a->lp_req && a->lp_logit && a->lp_tok;
    for (int h = 0; h < 2; h++) {
        a->lp_res[h] = malloc(n * sizeof *a->lp_res[h]);
        a->lp_chosen[h] = malloc(n * sizeof *a->lp_chosen[h]);
        lp_ok = lp_ok && a->lp_res[h] && a->lp_chosen[h];
        for (size_t i = 0; lp_ok && i < n; i++) {
            size_t at = ((size_t)h * n + i) * TS_MAX_TOP_LOGPROBS;
            a->lp_res[h][i] = (ts_sample_res){-1, 0, a->lp_logit + at, a->lp_tok + at, 0};
        }
    }
    if (!a->pos || !a->slot || !a->rope3 || !a->want || !a->ids[0] || !a->ids[1] || !a->req ||
        !a->req_now || !lp_ok)
        return ts_error(TS_ERR_NOMEM, "out of memory");
    memset(a->want, 1, n);
    a->lp_top = -1;
    return TS_OK;
}

void engine_ahead_free(ts_engine *e) {
    ts_ahead *a = &e->ahead;
    free(a->pos), free(a->slot), free(a->rope3), free(a->want), free(a->ids[0]), free(a->ids[1]);
    free(a->req), free(a->req_now);
    free(a->lp_req), free(a->lp_logit), free(a->lp_tok);
    for (int h = 0; h < 2; h++)
        free(a->lp_res[h]), free(a->lp_chosen[h]);
}

void engine_ahead_drop(ts_engine *e) {
    if (!e->ahead.held) return;
    e->be->ops->step_drop(e->be);
    e->ahead.held = false;
}

/* Token i's rotary position minus its position. */
static int32_t rope_shift(const ts_batch *b, int i) {
    return b->rope_pos ? b->rope_pos[3 * i] - b->pos[i] : 0;
}

bool engine_ahead_fits(const ts_engine *e, const ts_batch *b) {
    const ts_ahead *a = &e->ahead;
    int n = b->n_tokens;
    if (a->off || n < 1 || n > e->n_batch || !b->tokens || !b->pos || !b->slot ||
        (!b->wants_logits && n != 1) || b->embd)
        return false;
    for (int i = 0; b->rope_pos && i < n; i++) {
        const int32_t *r3 = b->rope_pos + 3 * i;
        if (r3[1] != r3[0] || r3[2] != r3[0]) return false;
    }
    for (int i = 0; i < n; i++) {
        int s = b->slot[i];
        /* a slot's first token here continues it; a second one of the same slot would not */
        if ((b->wants_logits && !b->wants_logits[i]) || s < 0 || s >= e->n_slots ||
            b->pos[i] != e->slot_len[s])
            return false;
    }
    return e->be->ops->step_can_hold(e->be);
}

/* Whether draw y is the held draw x: the same parameters and uniform number. Adjustments are
 * not compared: the held step is given them at its launch (engine_ahead_step), and a backend
 * without sample_held_adjust holds no draw with any (engine.c). */
static bool same_draw(const ts_sample_req *x, const ts_sample_req *y) {
    return x->temperature == y->temperature && x->top_p == y->top_p && x->min_p == y->min_p &&
           x->top_k == y->top_k && x->u == y->u;
}

/* Whether b is the held step: its slots at its positions, fed the ids the step before gave,
 * and with samplers the draws it holds are theirs next (the same parameters and uniform
 * numbers: the caller drew nothing else in between). Their adjustments (penalties), which the
 * caller changes between steps, are given to the held step at its launch (engine_ahead_step). */
static bool is_held_step(const ts_ahead *a, const ts_batch *b, ts_sampler *const *samplers,
                         int n_top) {
    if (!a->held || a->n != b->n_tokens || a->sampled != (samplers != NULL) || a->lp_top != n_top)
        return false;
    for (int i = 0; i < a->n; i++) {
        if (b->slot[i] != a->slot[i] || b->pos[i] != a->pos[i] ||
            b->tokens[i] != a->ids[a->cur][i] || rope_shift(b, i) != a->rope3[3 * i] - a->pos[i])
            return false;
        if (samplers) {
            ts_sample_req next = ts_sampler_peek(samplers[i]);
            if (!same_draw(&next, &a->req[i])) return false;
        }
    }
    return true;
}

/* A held forward of n tokens: the argmax (req NULL) or the draws req, into ids[h]; with lp
 * their log-probability answers into lp_res[h] and lp_chosen[h]. */
static ts_fwd_batch held_batch(ts_engine *e, int n, const int32_t *pos, const int32_t *slot,
                               const ts_sample_req *req, int h, bool lp) {
    ts_ahead *a = &e->ahead;
    ts_fwd_batch fb = {0};
    fb.n_tokens = n, fb.pos = pos, fb.slot = slot, fb.wants_logits = a->want;
    fb.slot_state = e->slot_state, fb.argmax = a->ids[h], fb.sample = req, fb.held = true;
    fb.lora = e->slot_lora;
    if (lp) fb.lp_req = a->lp_req, fb.lp_res = a->lp_res[h], fb.lp_chosen = a->lp_chosen[h];
    return fb;
}

ts_status engine_ahead_step(ts_engine *e, const ts_batch *b, ts_sampler *const *samplers,
                            int32_t *ids, int n_top, ts_logprobs *lps) {
    ts_ahead *a = &e->ahead;
    const ts_backend_ops *op = e->be->ops;
    int n = b->n_tokens;
    const bool lp = lps && samplers;
    if (!lp) n_top = -1;
    ts_status st = engine_check_batch(e, b);
    if (st != TS_OK) {
        engine_ahead_drop(e);
        return st;
    }
    for (int i = 0; lp && i < n; i++)
        a->lp_req[i] = ts_sampler_logprob_request(n_top);
    bool held = is_held_step(a, b, samplers, n_top);
    for (int i = 0; samplers && i < n; i++) /* the held draw, if held (is_held_step) */
        a->req_now[i] = ts_sampler_request(samplers[i]);
    /* the held step's adjustments: the lists as they are now, each grown by the token the
     * caller has seen since (the step is dropped where they do not fit) */
    if (held && samplers && op->sample_held_adjust)
        held = op->sample_held_adjust(e->be, a->req_now, n);
    if (held) {
        a->launched_held++;
    } else {
        engine_ahead_drop(e);
        ts_fwd_batch fb =
            held_batch(e, n, b->pos, b->slot, samplers ? a->req_now : NULL, !a->cur, lp);
        fb.tokens = b->tokens, fb.rope_pos = b->rope_pos;
        st = e->model->arch->forward(e->rt, &fb, NULL);
        if (st != TS_OK) { /* nothing of it runs */
            op->step_drop(e->be);
            return st;
        }
    }
    a->cur = !a->cur; /* the launched step's ids land in ids[cur] */
    for (int i = 0; i < n; i++)
        a->ids[a->cur][i] = -1; /* until they do */
    a->held = false;
    op->step_launch(e->be);
    for (int i = 0; i < n; i++)
        e->slot_len[b->slot[i]]++;
    /* the step after it, held until the next call: the same slots one position on */
    bool room = true, shifted = false;
    for (int i = 0; i < n; i++) {
        a->slot[i] = b->slot[i];
        a->pos[i] = b->pos[i] + 1;
        int32_t s = rope_shift(b, i);
        for (int k = 0; k < 3; k++)
            a->rope3[3 * i + k] = a->pos[i] + s;
        shifted = shifted || s;
        room = room && a->pos[i] < e->n_ctx;
    }
    if (room) {
        for (int i = 0; samplers && i < n; i++)
            a->req[i] = ts_sampler_peek(samplers[i]);
        a->sampled = samplers != NULL;
        a->lp_top = n_top;
        ts_fwd_batch fb = held_batch(e, n, a->pos, a->slot, samplers ? a->req : NULL, !a->cur, lp);
        fb.fed = true;
        if (shifted) fb.rope_pos = a->rope3;
        st = e->model->arch->forward(e->rt, &fb, NULL);
        a->held = st == TS_OK && op->step_seal(e->be);
        a->n = n;
        a->off = st != TS_OK; /* the model or backend cannot feed itself: not again */
    }
    if (!a->held) op->step_drop(e->be);
    op->step_wait(e->be);
    memcpy(ids, a->ids[a->cur], (size_t)n * sizeof *ids);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0)
            return ts_error(TS_ERR_IO, "%s: the step's tokens did not come back from the device",
                            op->name);
    for (int i = 0; lp && i < n; i++)
        if (!ts_sampler_logprobs_list(samplers[i], &a->lp_res[a->cur][i], a->lp_chosen[a->cur][i],
                                      n_top, &lps[i]))
            return ts_error(TS_ERR_IO, "%s: no log-probabilities came back from the device",
                            op->name);
    return TS_OK;
}
