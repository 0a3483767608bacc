/* Qwen3.5 text decoder: the forward pass over a batch, written against the backend ops.
 *
 * The batch is processed layer by layer for all its tokens at once (the matmuls see every
 * token), while the sequence-mixing parts (conv, gated delta rule, attention) walk the batch's
 * runs: maximal stretches of consecutive tokens of one sequence. Runs of up to
 * TS_GDN_RECURRENT_MAX tokens use the recurrent form of the delta rule, longer runs the chunked
 * form (layers.h). */
#include "model/qwen35_rt.h"
#include "model/qwen35_vision.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A sequence's state: first every linear-attention layer's conv and recurrent state (what the
 * whole sequence so far sums up to: the prefix ts_engine_slot_mark saves, qwen35_seq_state_bytes),
 * then every full-attention layer's K and V rows, one per position (a rewind just stops reading
 * the rows past it). With the MTP block on (qwen35_mtp.c), the summed-up part ends with the
 * sequence's last final hidden state and the rows with the block's K and V. */
void qwen35_state_layout(const qwen35_hparams *h, bool mtp, int n_ctx, qwen35_state_off *offs,
                         qwen35_state_off *mtp_off, size_t *total, size_t *seq_total) {
    size_t off = 0;
    size_t conv = (size_t)(h->conv_k - 1) * qwen35_conv_dim(h) * sizeof(float);
    size_t rec = (size_t)h->lin_hv * h->lin_dk * h->lin_dv * sizeof(float);
    size_t kv = (size_t)n_ctx * h->n_kv_head * h->head_dim * sizeof(float);
    qwen35_state_off mo = {0};
    for (int i = 0; i < h->n_layers; i++) {
        memset(&offs[i], 0, sizeof offs[i]);
        if (h->is_full[i]) continue;
        offs[i].conv = off;
        off += conv;
        offs[i].rec = off;
        off += rec;
    }
    if (mtp) { /* the last final hidden state: where the block's next row starts */
        mo.conv = off;
        off += (size_t)h->n_embd * sizeof(float);
    }
    if (seq_total) *seq_total = off;
    for (int i = 0; i < h->n_layers; i++) {
        if (!h->is_full[i]) continue;
        offs[i].kc = off;
        off += kv;
        offs[i].vc = off;
        off += kv;
    }
    if (mtp) {
        mo.kc = off;
        off += kv;
        mo.vc = off;
        off += kv;
    }
    if (mtp_off) *mtp_off = mo;
    *total = off;
}

/* Whether the model's engines run its MTP block. */
static bool mtp_runs(const ts_model *m) {
    const qwen35_model *q = m->impl;
    return m->mtp_on && q->mtp.present;
}

size_t qwen35_state_bytes(const ts_model *m, int n_ctx) {
    const qwen35_model *q = m->impl;
    qwen35_state_off offs[QWEN35_MAX_LAYERS];
    size_t total;
    qwen35_state_layout(&q->hp, mtp_runs(m), n_ctx, offs, NULL, &total, NULL);
    return total;
}

size_t qwen35_seq_state_bytes(const ts_model *m) {
    const qwen35_model *q = m->impl;
    qwen35_state_off offs[QWEN35_MAX_LAYERS];
    size_t total, seq;
    qwen35_state_layout(&q->hp, mtp_runs(m), 1, offs, NULL, &total, &seq);
    return seq;
}

int qwen35_state_rows(const ts_model *m, int n_ctx, ts_state_rows *out, int max) {
    const qwen35_model *q = m->impl;
    const qwen35_hparams *h = &q->hp;
    qwen35_state_off offs[QWEN35_MAX_LAYERS], mo;
    size_t total;
    bool mtp = mtp_runs(m);
    qwen35_state_layout(h, mtp, n_ctx, offs, &mo, &total, NULL);
    size_t row = (size_t)h->n_kv_head * h->head_dim * sizeof(float);
    int n = 0;
    for (int i = 0; i <= h->n_layers; i++) {
        const qwen35_state_off *o = i < h->n_layers ? &offs[i] : &mo;
        if (i < h->n_layers ? !h->is_full[i] : !mtp) continue;
        if (n + 2 > max) return 0;
        out[n++] = (ts_state_rows){o->kc, row};
        out[n++] = (ts_state_rows){o->vc, row};
    }
    return n;
}

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

void qwen35_runtime_free(void *p) {
    qwen35_rt *rt = p;
    if (!rt) return;
    ts_backend *be = rt->be;
    float *bufs[] = {rt->x,  rt->h, rt->t1,   rt->t2, rt->t3,     rt->t4,     rt->t5,
                     rt->t6, rt->g, rt->beta, rt->lh, rt->logits, rt->params, rt->rope_cs};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->ops->free(be, bufs[i]);
    free(rt->sel);
    free(rt->runs);
    free(rt->sruns);
    free(rt->rope_cs_host);
    free(rt->rope_one);
    qwen35_venc_free(rt->venc);
    ts_lora_rt_free(&rt->lora);
    qwen35_mtp_rt_free(rt);
    free(rt);
}

ts_status qwen35_encode_image(void *p, const ts_image *const *frames, int n_frames,
                              const ts_image_plan *plan, float *out) {
    qwen35_rt *rt = p;
    if (!rt->q->vision) return ts_error(TS_ERR_UNSUPPORTED, "the model has no vision tower");
    return qwen35_vision_encode(rt->q->vision, rt->be, &rt->venc, frames, n_frames, plan, out);
}

ts_status qwen35_runtime_create(const ts_model *m, ts_backend *be, int n_batch, int n_ctx,
                                void **out) {
    const qwen35_model *q = m->impl;
    const qwen35_hparams *h = &q->hp;
    *out = NULL;
    qwen35_rt *rt = calloc(1, sizeof *rt);
    if (!rt) return ts_error(TS_ERR_NOMEM, "out of memory");
    rt->q = q;
    rt->be = be;
    rt->n_batch = n_batch;
    rt->n_ctx = n_ctx;
    size_t total;
    rt->mtp = mtp_runs(m);
    qwen35_state_layout(h, rt->mtp, n_ctx, rt->offs, &rt->mtp_rt.off, &total, NULL);

    size_t nb = (size_t)n_batch;
    size_t qg = (size_t)h->n_head * h->head_dim * (h->attn_gate ? 2 : 1);
    size_t kvw = (size_t)h->n_kv_head * h->head_dim;
    size_t cd = (size_t)qwen35_conv_dim(h), vd = (size_t)h->lin_hv * h->lin_dv;
    size_t kd = (size_t)h->lin_hk * h->lin_dk;
    /* t1: qkv / q+gate / mlp gate; t2: conv out / k / mlp up; t3: z / v; t4: gdn out / attn out
     * / mlp act; t5, t6: split q and k of the delta rule */
    size_t w1 = max_sz(max_sz(cd, qg), (size_t)h->n_ff);
    size_t w2 = max_sz(max_sz(cd, kvw), (size_t)h->n_ff);
    size_t w3 = max_sz(vd, kvw) + 2 * (size_t)h->lin_hv;
    size_t w4 = max_sz(max_sz(vd, (size_t)h->n_head * h->head_dim), (size_t)h->n_ff);
    struct {
        float **p;
        size_t n;
    } plan[] = {
        {&rt->x, nb * h->n_embd}, {&rt->h, nb * h->n_embd}, {&rt->t1, nb * w1},
        {&rt->t2, nb * w2},       {&rt->t3, nb * w3},       {&rt->t4, nb * w4},
        {&rt->t5, nb * max_sz(kd, vd)}, {&rt->t6, nb * kd}, {&rt->g, nb * h->lin_hv},
        {&rt->beta, nb * h->lin_hv},    {&rt->lh, (size_t)ts_logit_rows(n_batch) * h->n_embd},
        {&rt->logits, (size_t)ts_logit_rows(n_batch) * h->n_vocab},
    };
    for (size_t i = 0; i < sizeof plan / sizeof plan[0]; i++) {
        *plan[i].p = be->ops->alloc(be, plan[i].n * sizeof(float));
        if (!*plan[i].p) {
            qwen35_runtime_free(rt);
            return ts_error(TS_ERR_NOMEM, "out of memory for activations (%d tokens)", n_batch);
        }
    }
    rt->sel = malloc(nb * sizeof *rt->sel);
    rt->runs = malloc(nb * sizeof *rt->runs);
    rt->sruns = malloc(nb * sizeof *rt->sruns);
    /* the small parameters: one upload of the whole host block */
    size_t np = q->n_host_params;
    rt->params = be->ops->alloc(be, np * sizeof(float));
    if (!rt->params || !rt->sel || !rt->runs || !rt->sruns) {
        qwen35_runtime_free(rt);
        return ts_error(TS_ERR_NOMEM, "out of memory");
    }
    be->ops->upload(be, rt->params, q->host_params, np * sizeof(float));
    ts_status lst = ts_lora_rt_init(&rt->lora, m, be, n_batch);
    if (lst == TS_OK && rt->mtp) lst = qwen35_mtp_rt_init(rt, n_batch);
    if (lst != TS_OK) {
        qwen35_runtime_free(rt);
        return lst;
    }
    if (be->ops->rope_cs && h->rot_dim > 0) {
        rt->rope_cs = be->ops->alloc(be, nb * h->rot_dim * sizeof(float));
        rt->rope_cs_host = malloc(nb * h->rot_dim * sizeof(float));
        rt->rope_one = malloc(nb * sizeof *rt->rope_one);
        if (!rt->rope_cs || !rt->rope_cs_host || !rt->rope_one) {
            qwen35_runtime_free(rt);
            return ts_error(TS_ERR_NOMEM, "out of memory");
        }
    }
    *out = rt;
    return TS_OK;
}

static const float *P(const qwen35_rt *rt, const float *host) { return qwen35_param(rt, host); }

static void linear_attention(qwen35_rt *rt, int il, const ts_fwd_batch *b, const ts_run *runs,
                             int nr, const ts_prenorm *pre) {
    const qwen35_hparams *hp = &rt->q->hp;
    const qwen35_layer *ly = &rt->q->layers[il];
    ts_backend *be = rt->be;
    int n = b->n_tokens, D = hp->n_embd;
    int cd = qwen35_conv_dim(hp), kd = hp->lin_hk * hp->lin_dk, vd = hp->lin_hv * hp->lin_dv;
    int Hv = hp->lin_hv;
    float *mqkv = rt->t1, *conv = rt->t2, *z = rt->t3, *ab = rt->t3 + (size_t)n * vd;
    float *qn = rt->t5, *kn = rt->t6, *o = rt->t4;

    float *a = ab, *bb = ab + (size_t)n * Hv;
    {
        const ts_tensor *W[4] = {ly->in_qkv, ly->in_z, ly->in_a, ly->in_b};
        float *y[4] = {mqkv, z, a, bb};
        int64_t ldy[4] = {cd, vd, Hv, Hv};
        ts_lora_matmul_n(&rt->lora, W, 4, rt->x, D, n, pre, y, ldy);
    }
    ts_seq_run *sr = rt->sruns;
    for (int r = 0; r < nr; r++) { /* a: the conv state; b: the recurrent state */
        char *st = b->slot_state[runs[r].slot];
        sr[r] = (ts_seq_run){.start = runs[r].start,
                             .len = runs[r].len,
                             .pos0 = runs[r].pos0,
                             .a = (float *)(st + rt->offs[il].conv),
                             .b = (float *)(st + rt->offs[il].rec)};
    }
    /* the causal conv; then q and k to their own buffers so each head is a row, L2-normalised,
     * q scaled by dk^-1/2; the gates */
    ts_gdn_prep_args pa = {.n = n,
                           .Hk = hp->lin_hk,
                           .dk = hp->lin_dk,
                           .Hv = Hv,
                           .eps = 1e-6f,
                           .q_scale = 1.0f / sqrtf((float)hp->lin_dk),
                           .a = a,
                           .b = bb,
                           .ldab = Hv,
                           .neg_exp_a = P(rt, ly->neg_exp_a),
                           .dt_bias = P(rt, ly->dt_bias),
                           .qn = qn,
                           .kn = kn,
                           .g = rt->g,
                           .beta = rt->beta};
    ts_gdn_dims dims = {hp->lin_hk, hp->lin_hv, hp->lin_dk, hp->lin_dv};
    ts_gated_norm gn = {z, P(rt, ly->gnorm), hp->eps};
    /* a decode step: the backend's whole delta-rule step where it has one */
    if (!ts_conv_gdn_step(be, mqkv, cd, hp->conv_k, P(rt, ly->conv_w), sr, nr, &pa, &dims, &gn,
                          o)) {
        ts_conv_gdn_prep(be, mqkv, cd, cd, hp->conv_k, P(rt, ly->conv_w), sr, nr, conv, cd, &pa);
        for (int r = 0; r < nr; r++)
            sr[r].a = sr[r].b; /* gdn_runs' state */
        ts_gdn_runs(be, qn, kn, kd, conv + 2 * kd, cd, rt->g, rt->beta, &dims, sr, nr, &gn, o);
    }
    ts_lora_matmul_add(&rt->lora, ly->out_proj, o, vd, n, rt->x, D, rt->h);
}

void qwen35_full_attention(qwen35_rt *rt, const qwen35_layer *ly, const qwen35_state_off *off,
                           const ts_fwd_batch *b, const ts_run *runs, int nr,
                           const ts_prenorm *pre) {
    const qwen35_hparams *hp = &rt->q->hp;
    ts_backend *be = rt->be;
    const ts_backend_ops *op = be->ops;
    int n = b->n_tokens, D = hp->n_embd, hd = hp->head_dim;
    int hstride = hd * (hp->attn_gate ? 2 : 1); /* per head: hd query values, then hd gates */
    int qw = hp->n_head * hstride, kvw = hp->n_kv_head * hd, ow = hp->n_head * hd;
    float *qg = rt->t1, *k = rt->t2, *v = rt->t3, *o = rt->t4;

    {
        const ts_tensor *W[3] = {ly->wq, ly->wk, ly->wv};
        float *y[3] = {qg, k, v};
        int64_t ldy[3] = {qw, kvw, kvw};
        ts_lora_matmul_n(&rt->lora, W, 3, rt->x, D, n, pre, y, ldy);
    }
    ts_attn_dims dims = {hp->n_head, hp->n_kv_head, hd, 1.0f / sqrtf((float)hd), 0, 0};
    ts_seq_run *sr = rt->sruns;
    for (int r = 0; r < nr; r++) {
        char *st = b->slot_state[runs[r].slot];
        /* a run of one token (the fused step's) rotates at its own place plus the shift */
        sr[r] = (ts_seq_run){.start = runs[r].start,
                             .len = runs[r].len,
                             .pos0 = runs[r].pos0,
                             .rope_shift = rt->rpos[runs[r].start] - runs[r].pos0,
                             .a = (float *)(st + off->kc),
                             .b = (float *)(st + off->vc)};
    }
    if (rt->mrope) { /* the batch's own rotary angles (mrope_table) */
        ts_qk_norm_rope(be, qg, qw, hstride, hp->n_head, P(rt, ly->q_norm), k, kvw, hp->n_kv_head,
                        P(rt, ly->k_norm), n, hd, hp->eps, 0, b->pos, hp->rope_theta);
        op->rope_cs(be, qg, qw, n, hp->n_head, hstride, hp->rot_dim / 2, rt->rope_cs);
        op->rope_cs(be, k, kvw, n, hp->n_kv_head, hd, hp->rot_dim / 2, rt->rope_cs);
        ts_attend_runs(be, qg, qw, hstride, k, v, &dims, sr, nr, o, ow);
        if (hp->attn_gate) op->sigmoid_gate(be, o, ow, qg + hd, qw, n, hp->n_head, hd, hstride);
    } else if (!ts_attention_step(be, qg, qw, hstride, P(rt, ly->q_norm), k, P(rt, ly->k_norm), v,
                                  hp->eps, hp->rot_dim, hp->rope_theta, &dims, sr, nr,
                                  hp->attn_gate ? qg + hd : NULL, o, ow)) {
        /* (a decode step: the backend's whole attention step where it has one) */
        ts_qk_norm_rope(be, qg, qw, hstride, hp->n_head, P(rt, ly->q_norm), k, kvw, hp->n_kv_head,
                        P(rt, ly->k_norm), n, hd, hp->eps, hp->rot_dim, rt->rpos, hp->rope_theta);
        ts_attend_runs(be, qg, qw, hstride, k, v, &dims, sr, nr, o, ow);
        if (hp->attn_gate) op->sigmoid_gate(be, o, ow, qg + hd, qw, n, hp->n_head, hd, hstride);
    }
    ts_lora_matmul_add(&rt->lora, ly->wo, o, ow, n, rt->x, D, rt->h);
}

void qwen35_mlp(qwen35_rt *rt, const qwen35_layer *ly, int n, const ts_prenorm *pre) {
    const qwen35_hparams *hp = &rt->q->hp;
    int D = hp->n_embd, F = hp->n_ff;
    ts_lora_matmul_glu(&rt->lora, ly->gate, ly->up, rt->x, D, n, pre, false, rt->t1, rt->t2, F,
                       rt->t4, F);
    ts_lora_matmul_add(&rt->lora, ly->down, rt->t4, F, n, rt->x, D, rt->h);
}

/* Which position a rotary frequency slot j takes (0 time, 1 height, 2 width): interleaved
 * THWTHW... while each axis has slots left (Hugging Face writes the height slots j = 1, 4, ...
 * below 3 * section[1] and the width slots j = 2, 5, ... below 3 * section[2] over time's), or
 * three runs of section[0], section[1], section[2] slots. */
static int mrope_axis(const qwen35_hparams *hp, int j) {
    const int *s = hp->mrope_section;
    if (hp->mrope_interleaved) {
        if (j % 3 == 1 && j < 3 * s[1]) return 1;
        if (j % 3 == 2 && j < 3 * s[2]) return 2;
        return 0;
    }
    return j < s[0] ? 0 : j < s[0] + s[1] ? 1 : 2;
}

/* Each token's cosines and sines for its three positions, computed as the plain rope op does
 * (fp32 inverse frequencies times an fp32 position), so that a token whose three positions are
 * equal is rotated exactly as without them. */
static void mrope_table(qwen35_rt *rt, const ts_fwd_batch *b) {
    const qwen35_hparams *hp = &rt->q->hp;
    int half = hp->rot_dim / 2;
    float inv[QWEN35_MAX_ROT / 2];
    int axis[QWEN35_MAX_ROT / 2];
    for (int j = 0; j < half; j++) {
        inv[j] = (float)(1.0 / pow((double)hp->rope_theta, (double)(2 * j) / hp->rot_dim));
        axis[j] = mrope_axis(hp, j);
    }
    for (int t = 0; t < b->n_tokens; t++) {
        float *c = rt->rope_cs_host + (size_t)t * hp->rot_dim, *s = c + half;
        for (int j = 0; j < half; j++) {
            float a = (float)b->rope_pos[3 * t + axis[j]] * inv[j];
            c[j] = cosf(a);
            s[j] = sinf(a);
        }
    }
    rt->be->ops->upload(rt->be, rt->rope_cs, rt->rope_cs_host,
                        (size_t)b->n_tokens * hp->rot_dim * sizeof(float));
}

ts_status qwen35_check_batch(const qwen35_rt *rt, const ts_fwd_batch *b) {
    int n = b->n_tokens;
    if (n < 1 || n > rt->n_batch)
        return ts_error(TS_ERR_INVALID, "batch of %d tokens (limit %d)", n, rt->n_batch);
    for (int i = 0; i < n; i++) {
        if (!b->fed && (b->tokens[i] < 0 || b->tokens[i] >= rt->q->hp.n_vocab))
            return ts_error(TS_ERR_RANGE, "token id %d out of range [0, %d)", b->tokens[i],
                            rt->q->hp.n_vocab);
        if (b->pos[i] < 0 || b->pos[i] >= rt->n_ctx)
            return ts_error(TS_ERR_RANGE, "position %d outside the context of %d", b->pos[i],
                            rt->n_ctx);
    }
    return TS_OK;
}

ts_status qwen35_forward(void *p, const ts_fwd_batch *b, float *logits) {
    qwen35_rt *rt = p;
    const qwen35_model *q = rt->q;
    const qwen35_hparams *hp = &q->hp;
    ts_backend *be = rt->be;
    int n = b->n_tokens, D = hp->n_embd;
    TS_TRY(qwen35_check_batch(rt, b));
    if ((b->rope_pos || b->embd) && !rt->rope_cs)
        return ts_error(TS_ERR_UNSUPPORTED, "the %s backend takes no image input (yet)",
                        be->ops->name);
    if (b->rope_pos)
        for (int i = 0; i < 3 * n; i++)
            if (b->rope_pos[i] < 0)
                return ts_error(TS_ERR_RANGE, "rotary position %d is negative", b->rope_pos[i]);
    ts_run *runs = rt->runs;
    int nr = ts_batch_runs(b, runs);
    ts_lora_rt_begin(&rt->lora, b);

    TS_TRY(ts_embed(be, q->embed, b, 1.0f, rt->x));
    if (b->embd) /* an image's rows in place of its tokens' embeddings */
        for (int i = 0, run; i < n; i += run) {
            /* rows that lie one after another on the host go up in one copy (a GPU's copies
             * cost microseconds each; an image has up to thousands of rows) */
            for (run = 1; b->embd[i] && i + run < n && b->embd[i + run] == b->embd[i] + run * D;)
                run++;
            if (b->embd[i])
                be->ops->upload(be, rt->x + (size_t)i * D, b->embd[i],
                                (size_t)run * D * sizeof(float));
        }
    /* the MTP block pairs each token's input embedding with the hidden state before it */
    if (rt->mtp) be->ops->copy(be, rt->mtp_rt.e, rt->x, (size_t)n * D * sizeof(float));
    /* a token whose three positions are equal (text, also after an image) is rotated as the
     * plain rope does at that one position (mrope_table's angles are the rope op's): a batch of
     * such tokens takes the plain and fused paths, a decode step after an image included */
    rt->rpos = b->pos, rt->mrope = false;
    if (b->rope_pos) {
        for (int i = 0; i < n && !rt->mrope; i++) {
            const int32_t *r3 = b->rope_pos + 3 * i;
            rt->mrope = r3[1] != r3[0] || r3[2] != r3[0];
            rt->rope_one[i] = r3[0];
        }
        if (rt->mrope)
            mrope_table(rt, b);
        else
            rt->rpos = rt->rope_one;
    }
    /* The residual stream x: each block reads it through its input norm (a backend may fold the
     * norm into the matmul that reads it; else it goes to h first) and adds its output to it in
     * the last matmul's epilogue (or through h). */
    for (int il = 0; il < hp->n_layers; il++) {
        const qwen35_layer *ly = &q->layers[il];
        ts_prenorm pre1 = {P(rt, ly->ln1), hp->eps, rt->h}, pre2 = {P(rt, ly->ln2), hp->eps, rt->h};
        if (hp->is_full[il])
            qwen35_full_attention(rt, ly, &rt->offs[il], b, runs, nr, &pre1);
        else
            linear_attention(rt, il, b, runs, nr, &pre1);
        qwen35_mlp(rt, ly, n, &pre2);
    }
    ts_output_head oh = {P(rt, q->final_norm),       hp->eps, q->lm_head, D, hp->n_vocab,
                         ts_logit_rows(rt->n_batch), 0};
    ts_output_logits(be, &oh, b, rt->x, rt->sel, rt->lh, rt->logits, logits);
    if (rt->mtp) qwen35_mtp_follow(rt, b, runs, nr);
    return TS_OK;
}
