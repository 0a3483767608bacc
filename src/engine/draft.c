/* Drafts for speculative decoding from the model's multi-token-prediction block
 * (ts_engine_draft; the block itself: model/qwen35_mtp.c). */
#include "base/argmax.h"
#include "engine/engine_int.h"

#include <stdlib.h>
#include <string.h>

static ts_status check_draft(const ts_engine *e, int n, const int32_t *slots, const int32_t *tokens,
                             int k) {
    if (!e->model->mtp_on || !e->model->arch->draft)
        return ts_error(TS_ERR_INVALID, "drafts need the model's MTP block on "
                                        "(ts_model_mtp_enable before the engine is made)");
    if (n < 1 || n > e->n_batch || k < 1)
        return ts_error(TS_ERR_INVALID, "a draft of %d tokens for %d slots (at most %d)", k, n,
                        e->n_batch);
    for (int i = 0; i < n; i++) {
        int s = slots[i];
        TS_TRY(engine_check_slot(e, s));
        for (int j = 0; j < i; j++)
            if (slots[j] == s) return ts_error(TS_ERR_INVALID, "slot %d drafted twice", s);
        if (e->slot_len[s] < 1)
            return ts_error(TS_ERR_INVALID, "slot %d holds no token to draft after", s);
        /* the block's rows at len - 1 .. len + k - 2 */
        if (e->slot_len[s] + k > e->n_ctx)
            return ts_error(TS_ERR_RANGE,
                            "slot %d: %d tokens and %d drafted pass the context of "
                            "%d",
                            s, e->slot_len[s], k, e->n_ctx);
        if (tokens[i] < 0 || tokens[i] >= e->n_vocab)
            return ts_error(TS_ERR_RANGE, "token id %d out of range [0, %d)", tokens[i],
                            e->n_vocab);
    }
    return TS_OK;
}

ts_status ts_engine_draft(ts_engine *e, int n, const int32_t *slots, const int32_t *tokens,
                          const int32_t *rope_shift, int k, int32_t *ids, float *logits) {
    TS_TRY(check_draft(e, n, slots, tokens, k));
    engine_ahead_drop(e);
    /* per row: its position, rotary positions, input token and guess */
    int32_t *pos = malloc((size_t)n * 6 * sizeof *pos);
    uint8_t *want = malloc((size_t)n);
    if (!pos || !want) {
        free(pos), free(want);
        return ts_error(TS_ERR_NOMEM, "out of memory");
    }
    int32_t *rope = pos + n, *in = rope + 3 * n, *out = in + n;
    memset(want, 1, (size_t)n);
    memcpy(in, tokens, (size_t)n * sizeof *in);
    ts_status st = TS_OK;
    for (int j = 0; j < k && st == TS_OK; j++) {
        for (int i = 0; i < n; i++) {
            pos[i] = e->slot_len[slots[i]] - 1 + j;
            int r = pos[i] + (rope_shift ? rope_shift[i] : 0);
            rope[3 * i] = rope[3 * i + 1] = rope[3 * i + 2] = r;
        }
        ts_fwd_batch fb = {.n_tokens = n,
                           .tokens = in,
                           .pos = pos,
                           .slot = slots,
                           .wants_logits = want,
                           .slot_state = e->slot_state,
                           .rope_pos = rope_shift ? rope : NULL};
        float *lg = logits ? logits + (size_t)j * n * e->n_vocab : NULL;
        if (!lg) fb.argmax = out;
        st = e->model->arch->draft(e->rt, &fb, j > 0, lg);
        for (int i = 0; st == TS_OK && i < n; i++) {
            if (lg) out[i] = ts_argmax_f32(lg + (size_t)i * e->n_vocab, e->n_vocab);
            ids[(size_t)i * k + j] = in[i] = out[i];
        }
    }
    free(pos), free(want);
    return st;
}
