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
        /* the final norm gathers the wanted rows: consecutive ones (every row of a decode
         * step) in one call */
        for (int i = 0, run; i < k; i += run) {
            for (run = 1; i + run < k && sel[s0 + i + run] == sel[s0 + i] + run; run++) {}
            op->rmsnorm(be, x + (size_t)sel[s0 + i] * D, D, run, D, oh->final_norm, oh->eps,
                        lh + (size_t)i * D, D);
        }
        if (b->hidden) { /* embeddings: the head's input is the answer */
            op->download(be, b->hidden + (size_t)s0 * D, lh, (size_t)k * D * sizeof(float));
            continue;
        }
        op->matmul(be, oh->head, lh, D, k, lg, oh->n_vocab);
        if (oh->softcap > 0) op->softcap(be, lg, (int64_t)k * oh->n_vocab, oh->softcap);
        if (b->sample && b->held && b->lp_req) { /* engine/ahead.c: draws that end on the */
            op->sample_held_logprobs(be, lg, oh->n_vocab, k, oh->n_vocab, b->sample + s0,
                                     b->lp_req + s0, b->argmax + s0, b->lp_res + s0,
                                     b->lp_chosen + s0);
        } else if (b->sample && b->held) { /* device, with log-probabilities or without */
            op->sample_held(be, lg, oh->n_vocab, k, oh->n_vocab, b->sample + s0, b->argmax + s0);
        } else if (b->lp_req && op->sample_logprobs &&
                   op->sample_logprobs(be, lg, oh->n_vocab, k, oh->n_vocab, b->sample + s0,
                                       b->lp_req + s0, b->sample_res + s0, b->lp_res + s0,
                                       b->lp_chosen + s0)) {
            /* the draws and their log-probabilities in one submission */
        } else if (b->sample) {
            op->sample(be, lg, oh->n_vocab, k, oh->n_vocab, b->sample + s0, b->sample_res + s0);
            if (b->lp_req) {
                op->sample(be, lg, oh->n_vocab, k, oh->n_vocab, b->lp_req + s0, b->lp_res + s0);
                for (int i = 0; i < k; i++) {
                    int32_t id = b->sample_res[s0 + i].id;
                    if (id >= 0 && id < oh->n_vocab)
                        op->download(be, &b->lp_chosen[s0 + i], lg + (size_t)i * oh->n_vocab + id,
                                     sizeof(float));
                }
            }
        } else if (b->argmax) {
            (b->held ? op->argmax_held : op->argmax)(be, lg, oh->n_vocab, k, oh->n_vocab,
                                                     b->argmax + s0);
        }
        if (logits && !b->argmax) /* after a draw, with its adjustments (made in place) */
            op->download(be, logits + (size_t)s0 * oh->n_vocab, lg,
                         (size_t)k * oh->n_vocab * sizeof(float));
    }
}

ts_status ts_embed(ts_backend *be, const ts_tensor *W, const ts_fwd_batch *b, float scale,
                   float *out) {
    if (!b->fed) {
        be->ops->get_rows(be, W, b->tokens, b->n_tokens, scale, out);
        return TS_OK;
    }
    if (be->ops->get_rows_fed && be->ops->get_rows_fed(be, W, b->n_tokens, scale, out))
        return TS_OK;
    return ts_error(TS_ERR_UNSUPPORTED, "%s: no embedding from the device's own ids for %s",
                    be->ops->name, ts_dtype_name(W->dtype));
}

ts_status ts_check_matmul_dtype(const ts_model *m, const char *name, const ts_tensor *t) {
    if ((unsigned)t->dtype < TS_DTYPE_COUNT) return TS_OK; /* every dtype has a CPU kernel */
    return ts_error(TS_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s not supported",
                    ts_model_file_of(m, name), name, ts_dtype_name(t->dtype));
}

void ts_conv_runs(ts_backend *be, const float *x, int64_t ldx, int C, int K, const float *w,
                  const ts_seq_run *sr, int nr, float *out, int64_t ldo) {
    if (be->ops->conv1d_silu_runs && nr > 1) {
        be->ops->conv1d_silu_runs(be, x, ldx, C, K, w, sr, nr, out, ldo);
        return;
    }
    for (int r = 0; r < nr; r++)
        be->ops->conv1d_silu(be, x + (size_t)sr[r].start * ldx, ldx, sr[r].len, C, K, w, sr[r].a,
                             out + (size_t)sr[r].start * ldo, ldo);
}

void ts_gdn_runs(ts_backend *be, const float *q, const float *k, int64_t ldqk, const float *v,
                 int64_t ldv, const float *g, const float *beta, const ts_gdn_dims *d,
                 const ts_seq_run *sr, int nr, const ts_gated_norm *gn, float *out) {
    if (be->ops->gdn_runs && (nr > 1 || gn)) {
        be->ops->gdn_runs(be, q, k, ldqk, v, ldv, g, beta, d, sr, nr, gn, out);
        return;
    }
    int Hv = d->n_v_heads;
    for (int r = 0; r < nr; r++) {
        size_t s0 = (size_t)sr[r].start;
        be->ops->gdn(be, q + s0 * ldqk, k + s0 * ldqk, ldqk, v + s0 * ldv, ldv, g + s0 * Hv,
                     beta + s0 * Hv, sr[r].len, d, sr[r].a, out + s0 * Hv * d->d_v,
                     sr[r].len > TS_GDN_RECURRENT_MAX);
    }
    if (gn) {
        int n = sr[nr - 1].start + sr[nr - 1].len;
        be->ops->gated_rmsnorm(be, out, gn->z, n, Hv, d->d_v, gn->w, gn->eps, out);
    }
}

void ts_attend_runs(ts_backend *be, const float *q, int64_t ldq, int64_t q_head_stride,
                    const float *k, const float *v, const ts_attn_dims *d, const ts_seq_run *sr,
                    int nr, float *out, int64_t ldo) {
    if (be->ops->attention_runs) {
        be->ops->attention_runs(be, q, ldq, q_head_stride, k, v, d, sr, nr, out, ldo);
        return;
    }
    int64_t kvw = (int64_t)d->n_kv_heads * d->head_dim;
    for (int r = 0; r < nr; r++) {
        size_t s0 = (size_t)sr[r].start;
        be->ops->copy_rows(be, sr[r].a + (size_t)sr[r].pos0 * kvw, kvw, k + s0 * kvw, kvw,
                           sr[r].len, (int)kvw);
        be->ops->copy_rows(be, sr[r].b + (size_t)sr[r].pos0 * kvw, kvw, v + s0 * kvw, kvw,
                           sr[r].len, (int)kvw);
        be->ops->attention(be, q + s0 * ldq, ldq, q_head_stride, sr[r].len, sr[r].pos0, sr[r].a,
                           sr[r].b, d, out + s0 * ldo, ldo);
    }
}

void ts_matmul_n(ts_backend *be, const ts_tensor *const *W, int nw, const float *x, int64_t ldx,
                 int n, const ts_prenorm *pre, float *const *y, const int64_t *ldy) {
    if (be->ops->matmul_n) {
        be->ops->matmul_n(be, W, nw, x, ldx, n, pre, y, ldy);
        return;
    }
    if (pre) {
        int dim = (int)ts_tensor_cols(W[0]);
        be->ops->rmsnorm(be, x, ldx, n, dim, pre->w, pre->eps, pre->scratch, ldx);
        x = pre->scratch;
    }
    for (int j = 0; j < nw; j++) be->ops->matmul(be, W[j], x, ldx, n, y[j], ldy[j]);
}

void ts_matmul_add(ts_backend *be, const ts_tensor *W, const float *x, int64_t ldx, int n,
                   float *y, int64_t ldy, float *tmp) {
    if (be->ops->matmul_add) {
        be->ops->matmul_add(be, W, x, ldx, n, y, ldy);
        return;
    }
    be->ops->matmul(be, W, x, ldx, n, tmp, ldy);
    be->ops->add(be, y, tmp, (int64_t)n * ldy);
}

void ts_add_rmsnorm(ts_backend *be, float *x, const float *h, int n_rows, int dim, int64_t ld,
                    const float *w, float eps, float *out) {
    if (!w) { /* after the last layer: the output head brings its own norm */
        be->ops->add(be, x, h, (int64_t)n_rows * ld);
        return;
    }
    if (be->ops->add_rmsnorm) {
        be->ops->add_rmsnorm(be, x, h, n_rows, dim, ld, w, eps, out);
        return;
    }
    be->ops->add(be, x, h, (int64_t)n_rows * ld);
    be->ops->rmsnorm(be, x, ld, n_rows, dim, w, eps, out, ld);
}

void ts_norm_add_rmsnorm(ts_backend *be, float *x, float *h, int n_rows, int dim, int64_t ld,
                         const float *wh, const float *w, float eps, float *out) {
    if (be->ops->norm_add_rmsnorm) {
        be->ops->norm_add_rmsnorm(be, x, h, n_rows, dim, ld, wh, w, eps, out);
        return;
    }
    be->ops->rmsnorm(be, h, ld, n_rows, dim, wh, eps, h, ld);
    ts_add_rmsnorm(be, x, h, n_rows, dim, ld, w, eps, out);
}

void ts_l2norm_heads(ts_backend *be, const float *src, int64_t lds, int n_tok, int n_heads,
                     int dim, float eps, float scale, float *dst) {
    if (be->ops->l2norm_heads) {
        be->ops->l2norm_heads(be, src, lds, n_tok, n_heads, dim, eps, scale, dst);
        return;
    }
    be->ops->copy_rows(be, dst, (int64_t)n_heads * dim, src, lds, n_tok, n_heads * dim);
    be->ops->l2norm(be, dst, dim, n_tok * n_heads, dim, eps, scale);
}

void ts_matmul_glu(ts_backend *be, const ts_tensor *Wg, const ts_tensor *Wu, const float *x,
                   int64_t ldx, int n, const ts_prenorm *pre, bool gelu, float *tg, float *tu,
                   int64_t ldt, float *out, int64_t ldo) {
    if (be->ops->matmul_glu) {
        be->ops->matmul_glu(be, Wg, Wu, x, ldx, n, pre, gelu, tg, tu, ldt, out, ldo);
        return;
    }
    const ts_tensor *W[2] = {Wg, Wu};
    float *y[2] = {tg, tu};
    int64_t ldy[2] = {ldt, ldt};
    ts_matmul_n(be, W, 2, x, ldx, n, pre, y, ldy);
    ts_glu(be, gelu, tg, tu, ldt, n, (int)ts_tensor_rows(Wg), out, ldo);
}

void ts_glu(ts_backend *be, bool gelu, const float *tg, const float *tu, int64_t ldt, int n,
            int dim, float *out, int64_t ldo) {
    if (gelu)
        be->ops->gelu_mul(be, tg, tu, ldt, n, dim, out, ldo);
    else
        be->ops->swiglu(be, tg, tu, ldt, n, dim, out, ldo);
}

void ts_gdn_prep(ts_backend *be, const float *conv, int64_t ldc, const ts_gdn_prep_args *p) {
    if (be->ops->gdn_prep) {
        be->ops->gdn_prep(be, conv, ldc, p);
        return;
    }
    ts_l2norm_heads(be, conv, ldc, p->n, p->Hk, p->dk, p->eps, p->q_scale, p->qn);
    ts_l2norm_heads(be, conv + (size_t)p->Hk * p->dk, ldc, p->n, p->Hk, p->dk, p->eps, 1.0f,
                    p->kn);
    be->ops->gdn_gates(be, p->a, p->ldab, p->b, p->ldab, p->n, p->Hv, p->neg_exp_a, p->dt_bias,
                       p->g, p->beta);
}

void ts_qk_norm_rope(ts_backend *be, float *q, int64_t ldq, int64_t q_head_stride, int nq,
                     const float *wq, float *k, int64_t ldk, int nk, const float *wk, int n_tok,
                     int hd, float eps, int rot_dim, const int32_t *pos, float theta) {
    if (be->ops->qk_norm_rope) {
        be->ops->qk_norm_rope(be, q, ldq, q_head_stride, nq, wq, k, ldk, nk, wk, n_tok, hd, eps,
                              rot_dim, pos, theta);
        return;
    }
    /* row t * nq + h of q at q + (t * nq + h) * q_head_stride: ldq = nq * q_head_stride */
    be->ops->rmsnorm(be, q, q_head_stride, n_tok * nq, hd, wq, eps, q, q_head_stride);
    be->ops->rmsnorm(be, k, hd, n_tok * nk, hd, wk, eps, k, hd);
    be->ops->rope(be, q, ldq, n_tok, nq, q_head_stride, rot_dim, pos, theta);
    be->ops->rope(be, k, ldk, n_tok, nk, hd, rot_dim, pos, theta);
}

/* Whether the batch is a decode step: at least one run, every run one token (the layer steps) */
static bool decode_step(const ts_seq_run *sr, int nr) {
    if (nr < 1) return false;
    for (int r = 0; r < nr; r++)
        if (sr[r].len != 1) return false;
    return true;
}

bool ts_conv_gdn_step(ts_backend *be, const float *x, int C, int K, const float *w,
                      const ts_seq_run *sr, int nr, const ts_gdn_prep_args *p, const ts_gdn_dims *d,
                      const ts_gated_norm *gn, float *out) {
    return be->ops->conv_gdn_step && decode_step(sr, nr) &&
           be->ops->conv_gdn_step(be, x, C, K, w, sr, nr, p, d, gn, out);
}

bool ts_attention_step(ts_backend *be, const float *q, int64_t ldq, int64_t q_head_stride,
                       const float *wq, const float *k, const float *wk, const float *v, float eps,
                       int rot_dim, float theta, const ts_attn_dims *d, const ts_seq_run *sr,
                       int nr, const float *gate, float *out, int64_t ldo) {
    return be->ops->attention_step && decode_step(sr, nr) &&
           be->ops->attention_step(be, q, ldq, q_head_stride, wq, k, wk, v, eps, rot_dim, theta, d,
                                   sr, nr, gate, out, ldo);
}

void ts_conv_gdn_prep(ts_backend *be, const float *x, int64_t ldx, int C, int K, const float *w,
                      const ts_seq_run *sr, int nr, float *out, int64_t ldo,
                      const ts_gdn_prep_args *p) {
    if (be->ops->conv_gdn_prep) {
        be->ops->conv_gdn_prep(be, x, ldx, C, K, w, sr, nr, out, ldo, p);
        return;
    }
    ts_conv_runs(be, x, ldx, C, K, w, sr, nr, out, ldo);
    ts_gdn_prep(be, out, ldo, p);
}
