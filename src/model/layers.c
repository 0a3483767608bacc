#include "model/layers.h"

int ts_batch_runs(const ts_fwd_batch *b, ts_run *runs) {
    int nr = 0;
    for (int i = 0; i < b->n_tokens; i++) {
        if (nr && runs[nr - 1].slot == b->slot[i] &&
            runs[nr - 1].pos0 + runs[nr - 1].len == b->pos[i])
            runs[nr - 1].len++;
        else
            runs[nr++] = (ts_run){i, 1, b->slot[i], b->pos[i]};
    }
    return nr;
}

void ts_output_logits(ts_backend *be, const ts_output_head *oh, const ts_fwd_batch *b,
                      const float *x, int32_t *sel, float *lh, float *lg, float *logits) {
    const ts_backend_ops *op = be->ops;
    int D = oh->n_embd, ns = 0;
    for (int i = 0; i < b->n_tokens; i++)
        if (b->wants_logits[i]) sel[ns++] = i;
    for (int s0 = 0; s0 < ns; s0 += oh->rows) {
        int k = ns - s0 < oh->rows ? ns - s0 : oh->rows;
        for (int i = 0; i < k; i++)
            op->copy_rows(be, lh + (size_t)i * D, D, x + (size_t)sel[s0 + i] * D, D, 1, D);
        op->rmsnorm(be, lh, D, k, D, oh->final_norm, oh->eps, lh, D);
        op->matmul(be, oh->head, lh, D, k, lg, oh->n_vocab);
        if (oh->softcap > 0) op->softcap(be, lg, (int64_t)k * oh->n_vocab, oh->softcap);
        op->download(be, logits + (size_t)s0 * oh->n_vocab, lg,
                     (size_t)k * oh->n_vocab * sizeof(float));
    }
}

ts_status ts_check_matmul_dtype(const ts_model *m, const char *name, const ts_tensor *t) {
    if ((unsigned)t->dtype < TS_DTYPE_COUNT) return TS_OK; /* every dtype has a CPU kernel */
    return ts_error(TS_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s not supported",
                    ts_model_file_of(m, name), name, ts_dtype_name(t->dtype));
}
