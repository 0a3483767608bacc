/* Qwen3.5 in llama.cpp's GGUF conventions (arch "qwen35"): the metadata and tensor layout that
 * its converter writes, for `tessera quantize` (qwen35_gguf_plan), and reading them back
 * (qwen35_read_gguf_hparams, qwen35_regroup_v). Facts and sources: docs/GGUF.md. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/quant.h"
#include "model/qwen35.h"
#include "model/quantize.h"

/* ---- writing ------------------------------------------------------------------------------- */

/* The interval n when layer i is full attention exactly when (i + 1) % n == 0; 0 when the
 * layer types follow no such pattern. */
static int full_interval(const qwen35_hparams *h) {
    for (int n = 1; n <= h->n_layers; n++) {
        bool ok = true;
        for (int i = 0; ok && i < h->n_layers; i++) ok = h->is_full[i] == ((i + 1) % n == 0);
        if (ok) return n;
    }
    return 0;
}

/* n_mtp: MTP blocks written after the layers (llama.cpp counts them in block_count and says
 * how many in nextn_predict_layers) */
static ts_status write_metadata(const ts_model *m, const qwen35_hparams *h, int n_mtp,
                                ts_gguf_writer *w) {
#define U32(k, v) TS_TRY(ts_gguf_writer_kv_u32(w, "qwen35." k, (uint32_t)(v)))
    U32("block_count", h->n_layers + n_mtp);
    if (n_mtp) U32("nextn_predict_layers", n_mtp);
    U32("context_length", h->n_ctx_train);
    U32("embedding_length", h->n_embd);
    U32("feed_forward_length", h->n_ff);
    U32("attention.head_count", h->n_head);
    U32("attention.head_count_kv", h->n_kv_head);
    TS_TRY(ts_gguf_writer_kv_f32(w, "qwen35.rope.freq_base", h->rope_theta));
    TS_TRY(ts_gguf_writer_kv_f32(w, "qwen35.attention.layer_norm_rms_epsilon", h->eps));
    U32("attention.key_length", h->head_dim);
    U32("attention.value_length", h->head_dim);
    U32("ssm.conv_kernel", h->conv_k);
    U32("ssm.state_size", h->lin_dk);
    U32("ssm.group_count", h->lin_hk);
    U32("ssm.time_step_rank", h->lin_hv);
    U32("ssm.inner_size", h->lin_hv * h->lin_dv);
    int interval = full_interval(h);
    U32("full_attention_interval", interval ? interval : 4);
    U32("rope.dimension_count", h->rot_dim);
#undef U32
    /* no interval describes the layers: the per-layer list newer llama.cpp reads first */
    if (!interval) {
        bool rec[QWEN35_MAX_LAYERS + 1] = {0}; /* an MTP block is attention */
        for (int i = 0; i < h->n_layers; i++) rec[i] = !h->is_full[i];
        TS_TRY(ts_gguf_writer_kv_arr(w, "qwen35.attention.recurrent_layers", TS_GGUF_BOOL, rec,
                                     (uint64_t)(h->n_layers + n_mtp)));
    }
    /* interleaved M-RoPE sections; with text-only positions they do not change the result */
    int32_t sec[4] = {11, 11, 10, 0};
    if (ts_hfconfig_has(m->cfg, "rope_parameters.mrope_section")) {
        int64_t v[4];
        int n;
        TS_TRY(ts_hfconfig_int_array(m->cfg, "rope_parameters.mrope_section", v, 4, &n));
        for (int i = 0; i < 4; i++) sec[i] = i < n && i < 4 ? (int32_t)v[i] : 0;
    }
    return ts_gguf_writer_kv_arr(w, "qwen35.rope.dimension_sections", TS_GGUF_I32, sec, 4);
}

typedef struct {
    const ts_model *m;
    qz_plan *p;
    const char *prefix;
    int hf_shift; /* a GGUF block's Hugging Face index is its own minus this (the MTP block's) */
} planner;

static ts_status src_of(const planner *P, const char *fmt, int layer, const ts_tensor **out) {
    char tail[160], name[256];
    snprintf(tail, sizeof tail, fmt, layer < 0 ? 0 : layer - P->hf_shift);
    snprintf(name, sizeof name, "%s%s", P->prefix, tail);
    *out = ts_st_find(P->m->st, name);
    if (!*out) return ts_error(TS_ERR_FORMAT, "%s: missing tensor '%s'", P->m->path, name);
    return TS_OK;
}

static ts_status add(planner *P, const char *gguf_fmt, const char *hf_fmt, int layer, int n_dims,
                     int64_t rows, int64_t cols, qz_op op, qz_tensor **out) {
    const ts_tensor *src;
    char name[64];
    TS_TRY(src_of(P, hf_fmt, layer, &src));
    snprintf(name, sizeof name, gguf_fmt, layer < 0 ? 0 : layer);
    return qz_add(P->p, name, layer, src, n_dims, rows, cols, op, out);
}

/* Maps for llama.cpp's tiled value-head order (Hv > Hk only; NULL otherwise). */
static ts_status v_map(const qwen35_hparams *h, int64_t offset, int64_t total, int hd,
                       int64_t **out) {
    *out = NULL;
    if (h->lin_hv == h->lin_hk) return TS_OK;
    int64_t *map = qz_new_map(total);
    if (!map) return ts_error(TS_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < offset; i++) map[i] = i;
    qz_tiled_from_grouped(map + offset, h->lin_hk, h->lin_hv, hd);
    for (int64_t i = offset; i < total; i++) map[i] += offset;
    *out = map;
    return TS_OK;
}

static ts_status plan_linear(planner *P, const qwen35_hparams *h, int i) {
    int64_t D = h->n_embd, cd = qwen35_conv_dim(h), kd2 = 2 * (int64_t)h->lin_hk * h->lin_dk;
    int64_t vd = (int64_t)h->lin_hv * h->lin_dv, Hv = h->lin_hv;
    qz_tensor *t;
    TS_TRY(add(P, "blk.%d.attn_qkv.weight", "layers.%d.linear_attn.in_proj_qkv.weight", i, 2, cd,
               D, QZ_OP_NONE, &t));
    TS_TRY(v_map(h, kd2, cd, h->lin_dv, &t->row_map));
    TS_TRY(add(P, "blk.%d.attn_gate.weight", "layers.%d.linear_attn.in_proj_z.weight", i, 2, vd, D,
               QZ_OP_NONE, &t));
    TS_TRY(v_map(h, 0, vd, h->lin_dv, &t->row_map));
    TS_TRY(add(P, "blk.%d.ssm_beta.weight", "layers.%d.linear_attn.in_proj_b.weight", i, 2, Hv, D,
               QZ_OP_NONE, &t));
    TS_TRY(v_map(h, 0, Hv, 1, &t->row_map));
    TS_TRY(add(P, "blk.%d.ssm_alpha.weight", "layers.%d.linear_attn.in_proj_a.weight", i, 2, Hv, D,
               QZ_OP_NONE, &t));
    TS_TRY(v_map(h, 0, Hv, 1, &t->row_map));
    /* [C, 1, K] squeezed to [C, K] */
    TS_TRY(add(P, "blk.%d.ssm_conv1d.weight", "layers.%d.linear_attn.conv1d.weight", i, 2, cd,
               h->conv_k, QZ_OP_NONE, &t));
    TS_TRY(v_map(h, kd2, cd, h->lin_dv, &t->row_map));
    TS_TRY(add(P, "blk.%d.ssm_a", "layers.%d.linear_attn.A_log", i, 1, 1, Hv, QZ_OP_NEG_EXP, &t));
    TS_TRY(v_map(h, 0, Hv, 1, &t->col_map));
    TS_TRY(add(P, "blk.%d.ssm_dt.bias", "layers.%d.linear_attn.dt_bias", i, 1, 1, Hv, QZ_OP_NONE,
               &t));
    TS_TRY(v_map(h, 0, Hv, 1, &t->col_map));
    TS_TRY(add(P, "blk.%d.ssm_norm.weight", "layers.%d.linear_attn.norm.weight", i, 1, 1,
               h->lin_dv, QZ_OP_NONE, NULL));
    TS_TRY(add(P, "blk.%d.ssm_out.weight", "layers.%d.linear_attn.out_proj.weight", i, 2, D, vd,
               QZ_OP_NONE, &t));
    return v_map(h, 0, vd, h->lin_dv, &t->col_map);
}

static ts_status plan_full(planner *P, const qwen35_hparams *h, int i) {
    int64_t D = h->n_embd, hd = h->head_dim;
    int64_t qrows = h->n_head * hd * (h->attn_gate ? 2 : 1), kv = h->n_kv_head * hd;
    /* q_proj keeps its per-head [query | gate] interleave: llama.cpp splits it with views */
    TS_TRY(add(P, "blk.%d.attn_q.weight", "layers.%d.self_attn.q_proj.weight", i, 2, qrows, D,
               QZ_OP_NONE, NULL));
    TS_TRY(add(P, "blk.%d.attn_k.weight", "layers.%d.self_attn.k_proj.weight", i, 2, kv, D,
               QZ_OP_NONE, NULL));
    TS_TRY(add(P, "blk.%d.attn_v.weight", "layers.%d.self_attn.v_proj.weight", i, 2, kv, D,
               QZ_OP_NONE, NULL));
    TS_TRY(add(P, "blk.%d.attn_output.weight", "layers.%d.self_attn.o_proj.weight", i, 2, D,
               h->n_head * hd, QZ_OP_NONE, NULL));
    TS_TRY(add(P, "blk.%d.attn_q_norm.weight", "layers.%d.self_attn.q_norm.weight", i, 1, 1, hd,
               QZ_OP_ADD_ONE, NULL));
    return add(P, "blk.%d.attn_k_norm.weight", "layers.%d.self_attn.k_norm.weight", i, 1, 1, hd,
               QZ_OP_ADD_ONE, NULL);
}

/* A decoder block: its norms, its mixer, its MLP. */
static ts_status plan_block(planner *P, const qwen35_hparams *h, int i, bool full) {
    int64_t D = h->n_embd;
    TS_TRY(add(P, "blk.%d.attn_norm.weight", "layers.%d.input_layernorm.weight", i, 1, 1, D,
               QZ_OP_ADD_ONE, NULL));
    TS_TRY(add(P, "blk.%d.post_attention_norm.weight", "layers.%d.post_attention_layernorm.weight",
               i, 1, 1, D, QZ_OP_ADD_ONE, NULL));
    TS_TRY(full ? plan_full(P, h, i) : plan_linear(P, h, i));
    TS_TRY(add(P, "blk.%d.ffn_gate.weight", "layers.%d.mlp.gate_proj.weight", i, 2, h->n_ff, D,
               QZ_OP_NONE, NULL));
    TS_TRY(add(P, "blk.%d.ffn_up.weight", "layers.%d.mlp.up_proj.weight", i, 2, h->n_ff, D,
               QZ_OP_NONE, NULL));
    return add(P, "blk.%d.ffn_down.weight", "layers.%d.mlp.down_proj.weight", i, 2, D, h->n_ff,
               QZ_OP_NONE, NULL);
}

/* The MTP block as llama.cpp's converter writes it: block n_layers, a full-attention block's
 * tensors and the nextn ones (its norms with the 1 added, as every (1 + w) norm). */
static ts_status plan_mtp(planner *P, const qwen35_hparams *h) {
    int64_t D = h->n_embd;
    int i = h->n_layers;
    P->prefix = "mtp.";
    P->hf_shift = i;
    TS_TRY(plan_block(P, h, i, true));
    TS_TRY(
        add(P, "blk.%d.nextn.eh_proj.weight", "fc.weight%.0d", i, 2, D, 2 * D, QZ_OP_NONE, NULL));
    TS_TRY(add(P, "blk.%d.nextn.enorm.weight", "pre_fc_norm_embedding.weight%.0d", i, 1, 1, D,
               QZ_OP_ADD_ONE, NULL));
    TS_TRY(add(P, "blk.%d.nextn.hnorm.weight", "pre_fc_norm_hidden.weight%.0d", i, 1, 1, D,
               QZ_OP_ADD_ONE, NULL));
    return add(P, "blk.%d.nextn.shared_head_norm.weight", "norm.weight%.0d", i, 1, 1, D,
               QZ_OP_ADD_ONE, NULL);
}

ts_status qwen35_gguf_plan(const ts_model *m, qz_plan *p) {
    const qwen35_model *q = m->impl;
    const qwen35_hparams *h = &q->hp;
    if (!h->attn_gate)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: attn_output_gate false has no llama.cpp qwen35 "
                        "form", m->path);
    TS_TRY(write_metadata(m, h, q->mtp.present, p->w));
    p->n_layers = h->n_layers;
    p->tok_pre = "qwen35";
    planner P = {m, p,
                 ts_st_find(m->st, "model.language_model.embed_tokens.weight")
                     ? "model.language_model."
                     : "model.",
                 0};
    int64_t D = h->n_embd;
    TS_TRY(add(&P, "token_embd.weight%.0d", "embed_tokens.weight%.0d", -1, 2, h->n_vocab, D,
               QZ_OP_NONE, NULL));
    for (int i = 0; i < h->n_layers; i++)
        TS_TRY(plan_block(&P, h, i, h->is_full[i]));
    TS_TRY(add(&P, "output_norm.weight%.0d", "norm.weight%.0d", -1, 1, 1, D, QZ_OP_ADD_ONE, NULL));
    if (q->lm_head != q->embed) {
        P.prefix = "";
        TS_TRY(add(&P, "output.weight%.0d", "lm_head.weight%.0d", -1, 2, h->n_vocab, D,
                   QZ_OP_NONE, NULL));
    }
    return q->mtp.present ? plan_mtp(&P, h) : TS_OK;
}

/* ---- reading ------------------------------------------------------------------------------- */

ts_status qwen35_read_gguf_hparams(const ts_model *m, qwen35_hparams *h) {
    const ts_gguf *g = m->gguf;
    uint32_t u;
#define U32(key, dst, lo, hi)                                                                      \
    do {                                                                                           \
        TS_TRY(ts_gguf_get_u32(g, "qwen35." key, &u));                                             \
        if (u < (lo) || u > (hi))                                                                  \
            return ts_error(TS_ERR_FORMAT, "%s: key 'qwen35.%s': %u out of range [%u, %u]",        \
                            m->path, key, u, (unsigned)(lo), (unsigned)(hi));                      \
        dst = (int)u;                                                                              \
    } while (0)
    U32("block_count", h->n_layers, 1, QWEN35_MAX_LAYERS);
    /* MTP blocks come after the decoder's, counted in block_count */
    uint32_t nextn;
    TS_TRY(ts_gguf_get_u32_opt(g, "qwen35.nextn_predict_layers", 0, &nextn));
    if (nextn >= (uint32_t)h->n_layers)
        return ts_error(TS_ERR_FORMAT,
                        "%s: nextn_predict_layers %u leaves no decoder blocks of "
                        "block_count %d",
                        m->path, nextn, h->n_layers);
    h->n_layers -= (int)nextn;
    h->n_mtp = (int)nextn;
    U32("embedding_length", h->n_embd, 1, 1 << 16);
    U32("feed_forward_length", h->n_ff, 1, 1 << 20);
    U32("attention.head_count", h->n_head, 1, 1024);
    U32("attention.head_count_kv", h->n_kv_head, 1, 1024);
    U32("attention.key_length", h->head_dim, 1, 512);
    U32("context_length", h->n_ctx_train, 1, INT32_MAX);
    U32("rope.dimension_count", h->rot_dim, 2, 512);
    U32("ssm.conv_kernel", h->conv_k, 1, 64);
    U32("ssm.state_size", h->lin_dk, 1, 512);
    U32("ssm.group_count", h->lin_hk, 1, 1024);
    U32("ssm.time_step_rank", h->lin_hv, 1, 1024);
    int inner;
    U32("ssm.inner_size", inner, 1, 1 << 20);
#undef U32
    uint32_t vlen;
    TS_TRY(ts_gguf_get_u32_opt(g, "qwen35.attention.value_length", (uint32_t)h->head_dim, &vlen));
    if ((int)vlen != h->head_dim)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: value_length %u differs from key_length %d",
                        m->path, vlen, h->head_dim);
    if (inner % h->lin_hv || inner / h->lin_hv > 512)
        return ts_error(TS_ERR_FORMAT, "%s: ssm.inner_size %d is not time_step_rank %d heads of "
                        "at most 512", m->path, inner, h->lin_hv);
    h->lin_dv = inner / h->lin_hv;
    if (h->rot_dim > h->head_dim || h->rot_dim % 2)
        return ts_error(TS_ERR_FORMAT, "%s: rope.dimension_count %d for heads of %d", m->path,
                        h->rot_dim, h->head_dim);
    TS_TRY(ts_gguf_get_f32_opt(g, "qwen35.attention.layer_norm_rms_epsilon", 1e-6f, &h->eps));
    TS_TRY(ts_gguf_get_f32_opt(g, "qwen35.rope.freq_base", 10000000.0f, &h->rope_theta));
    if (!(h->rope_theta > 0) || !(h->eps > 0))
        return ts_error(TS_ERR_FORMAT, "%s: rope.freq_base %g / rms epsilon %g out of range",
                        m->path, h->rope_theta, h->eps);
    if (h->n_head % h->n_kv_head || h->lin_hv % h->lin_hk)
        return ts_error(TS_ERR_FORMAT, "%s: head_count %d / head_count_kv %d or time_step_rank %d "
                        "/ group_count %d is not a whole multiple", m->path, h->n_head,
                        h->n_kv_head, h->lin_hv, h->lin_hk);
    if (ts_gguf_has(g, "qwen35.attention.recurrent_layers")) {
        ts_gguf_type elem;
        uint64_t n;
        const void *data;
        TS_TRY(ts_gguf_get_arr(g, "qwen35.attention.recurrent_layers", &elem, &n, &data));
        if (elem != TS_GGUF_BOOL || n < (uint64_t)h->n_layers)
            return ts_error(TS_ERR_FORMAT, "%s: key 'qwen35.attention.recurrent_layers': expected "
                            "%d booleans", m->path, h->n_layers);
        for (int i = 0; i < h->n_layers; i++) h->is_full[i] = ((const uint8_t *)data)[i] == 0;
    } else {
        uint32_t interval;
        TS_TRY(ts_gguf_get_u32_opt(g, "qwen35.full_attention_interval", 4, &interval));
        if (interval < 1)
            return ts_error(TS_ERR_FORMAT, "%s: full_attention_interval 0", m->path);
        for (int i = 0; i < h->n_layers; i++) h->is_full[i] = (i + 1) % interval == 0;
    }
    const ts_tensor *emb;
    TS_TRY(ts_model_tensor(m, "token_embd.weight", 2, (int64_t[2]){-1, h->n_embd}, &emb));
    h->n_vocab = (int)emb->shape[0];
    h->tied = ts_gguf_find(g, "output.weight") == NULL;
    /* attn_q holds queries and output gates (2 x) or queries only */
    h->attn_gate = true;
    for (int i = 0; i < h->n_layers; i++) {
        if (!h->is_full[i]) continue;
        char name[64];
        snprintf(name, sizeof name, "blk.%d.attn_q.weight", i);
        const ts_tensor *t = ts_gguf_find(g, name);
        if (t && t->n_dims == 2 && t->shape[0] == (int64_t)h->n_head * h->head_dim)
            h->attn_gate = false;
        break;
    }
    return TS_OK;
}

/* GGUF stores the value heads tiled (head j*Hk + g) where Hugging Face groups them by key head
 * (head g*r + j), which is what the forward pass computes with. Row permutations of the
 * matrices become owned copies (rows are whole blocks in every dtype); out_proj's columns move in
 * whole head-sized runs, by blocks when a head is whole blocks, else through an fp16 copy. */
static int64_t grouped_to_tiled(int64_t h, int hk, int r) { return (h % r) * hk + h / r; }

static ts_status own_tensor(qwen35_model *q, const ts_tensor *src, ts_dtype dtype,
                            ts_tensor **out) {
    if (q->n_owned == QWEN35_MAX_OWNED)
        return ts_error(TS_ERR_NOMEM, "too many regrouped tensors");
    ts_tensor *t = malloc(sizeof *t);
    size_t nb = ts_dtype_row_bytes(dtype, ts_tensor_cols(src)) * (size_t)ts_tensor_rows(src);
    void *data = t ? malloc(nb ? nb : 1) : NULL;
    if (!data) {
        free(t);
        return ts_error(TS_ERR_NOMEM, "out of memory regrouping value heads");
    }
    *t = *src;
    t->dtype = dtype;
    t->data = data;
    t->nbytes = nb;
    q->owned[q->n_owned++] = t;
    *out = t;
    return TS_OK;
}

/* rows [off, off + Hv*hd) of *pt regrouped */
static ts_status regroup_rows(qwen35_model *q, const ts_tensor **pt, int64_t off, int hd) {
    const qwen35_hparams *h = &q->hp;
    const ts_tensor *src = *pt;
    ts_tensor *t;
    TS_TRY(own_tensor(q, src, src->dtype, &t));
    size_t rb = ts_dtype_row_bytes(src->dtype, ts_tensor_cols(src));
    int r = h->lin_hv / h->lin_hk;
    const char *s = src->data;
    char *d = (char *)t->data;
    memcpy(d, s, (size_t)off * rb);
    for (int64_t row = 0; row < (int64_t)h->lin_hv * hd; row++) {
        int64_t from = grouped_to_tiled(row / hd, h->lin_hk, r) * hd + row % hd;
        memcpy(d + (size_t)(off + row) * rb, s + (size_t)(off + from) * rb, rb);
    }
    *pt = t;
    return TS_OK;
}

static ts_status regroup_cols(qwen35_model *q, const ts_tensor **pt) {
    const qwen35_hparams *h = &q->hp;
    const ts_tensor *src = *pt;
    int dv = h->lin_dv, r = h->lin_hv / h->lin_hk, be = ts_dtype_block_elems(src->dtype);
    int64_t rows = ts_tensor_rows(src), cols = ts_tensor_cols(src);
    ts_dtype dt = dv % be == 0 ? src->dtype : TS_DTYPE_F16;
    ts_tensor *t;
    TS_TRY(own_tensor(q, src, dt, &t));
    size_t srb = ts_dtype_row_bytes(src->dtype, cols), drb = ts_dtype_row_bytes(dt, cols);
    float *row = dt == src->dtype ? NULL : malloc((size_t)cols * sizeof *row);
    if (dt != src->dtype && !row) return ts_error(TS_ERR_NOMEM, "out of memory");
    size_t hb = ts_dtype_row_bytes(dt, dv); /* bytes of one head's run in the output row */
    for (int64_t i = 0; i < rows; i++) {
        const char *s = (const char *)src->data + (size_t)i * srb;
        char *d = (char *)t->data + (size_t)i * drb;
        if (row) {
            ts_status st = ts_dequantize_row(src->dtype, s, row, cols);
            if (st != TS_OK) {
                free(row);
                return st;
            }
        }
        for (int hh = 0; hh < h->lin_hv; hh++) {
            int64_t from = grouped_to_tiled(hh, h->lin_hk, r);
            if (row)
                ts_quantize_row(dt, row + from * dv, d + (size_t)hh * hb, dv);
            else
                memcpy(d + (size_t)hh * hb, s + (size_t)from * hb, hb);
        }
    }
    free(row);
    *pt = t;
    return TS_OK;
}

static void regroup_vec(const qwen35_hparams *h, float *v, int64_t off, int hd, float *tmp) {
    int r = h->lin_hv / h->lin_hk;
    int64_t n = (int64_t)h->lin_hv * hd;
    memcpy(tmp, v + off, (size_t)n * sizeof *tmp);
    for (int64_t e = 0; e < n; e++)
        v[off + e] = tmp[grouped_to_tiled(e / hd, h->lin_hk, r) * hd + e % hd];
}

ts_status qwen35_regroup_v(qwen35_model *q, int layer) {
    const qwen35_hparams *h = &q->hp;
    qwen35_layer *ly = &q->layers[layer];
    if (h->lin_hv == h->lin_hk || h->is_full[layer]) return TS_OK;
    int64_t kd2 = 2 * (int64_t)h->lin_hk * h->lin_dk;
    TS_TRY(regroup_rows(q, &ly->in_qkv, kd2, h->lin_dv));
    TS_TRY(regroup_rows(q, &ly->in_z, 0, h->lin_dv));
    TS_TRY(regroup_rows(q, &ly->in_a, 0, 1));
    TS_TRY(regroup_rows(q, &ly->in_b, 0, 1));
    TS_TRY(regroup_cols(q, &ly->out_proj));
    float *tmp = malloc((size_t)h->lin_hv * h->lin_dv * h->conv_k * sizeof *tmp);
    if (!tmp) return ts_error(TS_ERR_NOMEM, "out of memory");
    /* conv rows are [channel][K]: regroup runs of dv*K values */
    regroup_vec(h, ly->conv_w, kd2 * h->conv_k, h->lin_dv * h->conv_k, tmp);
    regroup_vec(h, ly->neg_exp_a, 0, 1, tmp);
    regroup_vec(h, ly->dt_bias, 0, 1, tmp);
    free(tmp);
    return TS_OK;
}
