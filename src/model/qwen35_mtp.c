/* Qwen3.5's multi-token-prediction (MTP) block: the drafts of speculative decoding.
 *
 * The block guesses the token after next. For a position p with final hidden state h_p (the
 * final norm's output, what the output head reads) and the token t_{p+1} after it:
 *     u = fc [enorm(embed(t_{p+1})); hnorm(h_p)]
 * then one full-attention decoder layer over u, rotated at p and attending to the block's own
 * rows 0..p, then norm and the model's output head: logits for t_{p+2}. A second guess runs
 * the block again at p + 1 with its own output (after norm) in place of h and the token it
 * guessed.
 *
 * So that the block's attention sees the whole sequence, every forward of the decoder also
 * runs it over its tokens (qwen35_mtp_follow): token i at position p > 0 is paired with h_{p-1}
 * - the token before it in the batch, or the slot's last hidden state, which the state keeps
 * (qwen35_state_layout) - and its row at p - 1 is written. A draft (qwen35_draft) then starts
 * from the slot's last hidden state and the next token. Rows a draft writes past the slot's
 * length are garbage until the decoder's forward reaches them and writes them again: the block
 * reads rows up to its own position only, so a rewind needs nothing more than the decoder's
 * (the last hidden state is part of the summed-up state a mark saves). */
#include "model/qwen35_rt.h"

#include <stdlib.h>
#include <string.h>

ts_status qwen35_mtp_rt_init(qwen35_rt *rt, int n_batch) {
    qwen35_mtp_rt *m = &rt->mtp_rt;
    ts_backend *be = rt->be;
    size_t D = (size_t)rt->q->hp.n_embd, nb = (size_t)n_batch;
    m->e = be->ops->alloc(be, nb * D * sizeof(float));
    m->h = be->ops->alloc(be, (nb + 1) * D * sizeof(float));
    m->c = be->ops->alloc(be, nb * 2 * D * sizeof(float));
    m->g = be->ops->alloc(be, nb * D * sizeof(float));
    m->pos = malloc(nb * sizeof *m->pos);
    m->rpos = malloc(nb * sizeof *m->rpos);
    m->runs = malloc(nb * sizeof *m->runs);
    if (!m->e || !m->h || !m->c || !m->g || !m->pos || !m->rpos || !m->runs)
        return ts_error(TS_ERR_NOMEM, "out of memory for the MTP block (%d tokens)", n_batch);
    return TS_OK;
}

void qwen35_mtp_rt_free(qwen35_rt *rt) {
    qwen35_mtp_rt *m = &rt->mtp_rt;
    float *bufs[] = {m->e, m->h, m->c, m->g};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) rt->be->ops->free(rt->be, bufs[i]);
    free(m->pos);
    free(m->rpos);
    free(m->runs);
}

/* The block over n rows whose embeddings are in e and hidden states in hid (rows of D): fc,
 * then the layer for the runs given (positions m->pos, rotary m->rpos), into rt->x. */
static void block(qwen35_rt *rt, const ts_fwd_batch *b, const float *e, const float *hid,
                  const ts_run *runs, int nr) {
    const qwen35_model *q = rt->q;
    const qwen35_mtp *mt = &q->mtp;
    const qwen35_hparams *hp = &q->hp;
    qwen35_mtp_rt *m = &rt->mtp_rt;
    ts_backend *be = rt->be;
    int n = b->n_tokens, D = hp->n_embd;
    be->ops->rmsnorm(be, e, D, n, D, qwen35_param(rt, mt->enorm), hp->eps, m->c, 2 * D);
    be->ops->rmsnorm(be, hid, D, n, D, qwen35_param(rt, mt->hnorm), hp->eps, m->c + D, 2 * D);
    be->ops->matmul(be, mt->fc, m->c, 2 * D, n, rt->x, D);
    ts_fwd_batch mb = *b;
    mb.pos = m->pos;
    rt->rpos = m->rpos, rt->mrope = false;
    const qwen35_layer *ly = &mt->layer;
    ts_prenorm pre1 = {qwen35_param(rt, ly->ln1), hp->eps, rt->h};
    ts_prenorm pre2 = {qwen35_param(rt, ly->ln2), hp->eps, rt->h};
    qwen35_full_attention(rt, ly, &m->off, &mb, runs, nr, &pre1);
    qwen35_mlp(rt, ly, n, &pre2);
}

void qwen35_mtp_follow(qwen35_rt *rt, const ts_fwd_batch *b, const ts_run *runs, int nr) {
    const qwen35_model *q = rt->q;
    const qwen35_hparams *hp = &q->hp;
    qwen35_mtp_rt *m = &rt->mtp_rt;
    ts_backend *be = rt->be;
    int n = b->n_tokens, D = hp->n_embd;
    size_t row = (size_t)D * sizeof(float);
    /* every token's final hidden state, one row down: row i then holds the state before token
     * i wherever token i - 1 is of the same run */
    be->ops->rmsnorm(be, rt->x, D, n, D, qwen35_param(rt, q->final_norm), hp->eps, m->h + D, D);
    int nm = 0;
    for (int r = 0; r < nr; r++) {
        const ts_run *ru = &runs[r];
        float *last = (float *)((char *)b->slot_state[ru->slot] + m->off.conv);
        /* in run order: the run's first row takes the slot's last state (its row held the
         * previous run's last token's, kept by then), then the slot keeps the run's last */
        be->ops->copy(be, m->h + (size_t)ru->start * D, last, row);
        be->ops->copy(be, last, m->h + (size_t)(ru->start + ru->len) * D, row);
        int skip = ru->pos0 == 0; /* a sequence's first token follows nothing */
        if (ru->len > skip)
            m->runs[nm++] =
                (ts_run){ru->start + skip, ru->len - skip, ru->slot, ru->pos0 + skip - 1};
    }
    if (nm == 0) return;
    for (int i = 0; i < n; i++) { /* each row at the position before its token's */
        int p = b->pos[i] - 1, rp = rt->mrope ? b->rope_pos[3 * i] - 1 : rt->rpos[i] - 1;
        m->pos[i] = p < 0 ? 0 : p;
        m->rpos[i] = rp < 0 ? 0 : rp;
    }
    block(rt, b, m->e, m->h, m->runs, nm);
}

ts_status qwen35_draft(void *p, const ts_fwd_batch *b, bool chain, float *logits) {
    qwen35_rt *rt = p;
    const qwen35_model *q = rt->q;
    const qwen35_hparams *hp = &q->hp;
    qwen35_mtp_rt *m = &rt->mtp_rt;
    ts_backend *be = rt->be;
    int n = b->n_tokens, D = hp->n_embd;
    if (!rt->mtp)
        return ts_error(TS_ERR_INVALID, "the model's MTP block is not on (ts_model_mtp_enable)");
    if (b->fed) return ts_error(TS_ERR_INVALID, "a draft takes its tokens from the host");
    TS_TRY(qwen35_check_batch(rt, b));
    for (int i = 0; i < n; i++) {
        m->runs[i] = (ts_run){i, 1, b->slot[i], b->pos[i]};
        m->pos[i] = b->pos[i];
        m->rpos[i] = b->rope_pos ? b->rope_pos[3 * i] : b->pos[i];
    }
    size_t row = (size_t)D * sizeof(float);
    if (!chain) /* the slots' last hidden states */
        for (int i = 0; i < n; i++)
            be->ops->copy(be, m->h + (size_t)i * D, (char *)b->slot_state[b->slot[i]] + m->off.conv,
                          row);
    else
        be->ops->copy(be, m->h, m->g, (size_t)n * row);
    TS_TRY(ts_embed(be, q->embed, b, 1.0f, m->e));
    block(rt, b, m->e, m->h, m->runs, n);
    const qwen35_mtp *mt = &q->mtp;
    /* the output, normed, is the next draft's hidden state; its logits the guess */
    be->ops->rmsnorm(be, rt->x, D, n, D, qwen35_param(rt, mt->norm), hp->eps, m->g, D);
    ts_output_head oh = {qwen35_param(rt, mt->norm), hp->eps, q->lm_head, D, hp->n_vocab,
                         ts_logit_rows(rt->n_batch), 0};
    ts_output_logits(be, &oh, b, rt->x, rt->sel, rt->lh, rt->logits, logits);
    return TS_OK;
}
