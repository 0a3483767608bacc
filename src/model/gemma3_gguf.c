/* Gemma 3 in llama.cpp's GGUF conventions (arch "gemma3"), for `tessera quantize`: metadata keys,
 * tensor names, and the norms stored as (1 + w). llama.cpp fixes three things that a Hugging
 * Face config may set otherwise: the 5:1 sliding/global layer pattern, the sliding layers' RoPE
 * base 10000, and the query scale 1/sqrt(head_dim) (the 62-layer 27B: 1/sqrt(hidden/heads)). A
 * checkpoint that differs cannot be described in the metadata and is refused. docs/GGUF.md. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/quantize.h"

typedef struct {
    int64_t n_vocab, n_embd, n_layers, n_ff, n_head, n_kv_head, head_dim, window, ctx, qpas;
    double eps, theta_global, theta_local, softcap;
    bool tied;
    const char *arch; /* "gemma3", or "gemma-embedding" for an encoder (EmbeddingGemma) */
} g3_cfg;

static ts_status read_theta(const ts_hfconfig *c, const char *kind, const char *legacy,
                            double dflt, double *out) {
    char key[96];
    snprintf(key, sizeof key, "rope_parameters.%s.rope_theta", kind);
    if (ts_hfconfig_has(c, key)) return ts_hfconfig_float(c, key, out);
    return ts_hfconfig_float_opt(c, legacy, dflt, out);
}

/* Whether layer i is a global (full attention) layer, as the config says. */
static ts_status layer_is_global(const ts_hfconfig *c, int64_t n_layers, bool *global) {
    if (ts_hfconfig_has(c, "layer_types")) {
        const char *items[256];
        int n;
        TS_TRY(ts_hfconfig_str_array(c, "layer_types", items, 256, &n));
        if (n != n_layers || n > 256)
            return ts_error(TS_ERR_FORMAT, "%s: field 'layer_types': %d entries for %lld layers",
                            ts_hfconfig_path(c), n, (long long)n_layers);
        for (int i = 0; i < n; i++) global[i] = strcmp(items[i], "full_attention") == 0;
        return TS_OK;
    }
    int64_t pat;
    TS_TRY(ts_hfconfig_int_opt(c, "sliding_window_pattern", 1, 1 << 20, 6, &pat));
    for (int64_t i = 0; i < n_layers; i++) global[i] = (i + 1) % pat == 0;
    return TS_OK;
}

const char *gemma3_gguf_arch(const ts_model *m) {
    return m->info.encoder ? "gemma-embedding" : "gemma3";
}

static ts_status read_cfg(const ts_model *m, g3_cfg *g) {
    const ts_hfconfig *c = m->cfg;
    const char *path = ts_hfconfig_path(c);
    ts_model_info info;
    ts_model_get_info(m, &info);
    g->n_vocab = info.n_vocab;
    g->n_embd = info.n_embd;
    g->n_layers = info.n_layers;
    g->ctx = info.n_ctx_train;
    g->arch = gemma3_gguf_arch(m);
    TS_TRY(ts_hfconfig_int(c, "intermediate_size", 1, 1 << 20, &g->n_ff));
    TS_TRY(ts_hfconfig_int(c, "num_attention_heads", 1, 1024, &g->n_head));
    TS_TRY(ts_hfconfig_int(c, "num_key_value_heads", 1, 1024, &g->n_kv_head));
    TS_TRY(ts_hfconfig_int_opt(c, "head_dim", 1, 512, 256, &g->head_dim));
    TS_TRY(ts_hfconfig_int_opt(c, "query_pre_attn_scalar", 1, 1 << 20, g->head_dim, &g->qpas));
    TS_TRY(ts_hfconfig_int_opt(c, "sliding_window", 1, INT32_MAX, 4096, &g->window));
    TS_TRY(ts_hfconfig_float_opt(c, "rms_norm_eps", 1e-6, &g->eps));
    TS_TRY(ts_hfconfig_float_opt(c, "final_logit_softcapping", 0.0, &g->softcap));
    TS_TRY(ts_hfconfig_bool_opt(c, "tie_word_embeddings", true, &g->tied));
    TS_TRY(read_theta(c, "full_attention", "rope_theta", 1000000.0, &g->theta_global));
    TS_TRY(read_theta(c, "sliding_attention", "rope_local_base_freq", 10000.0, &g->theta_local));
    bool global[256];
    if (g->n_layers > 256)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: more than 256 layers", path);
    TS_TRY(layer_is_global(c, g->n_layers, global));
    for (int64_t i = 0; i < g->n_layers; i++)
        if (global[i] != ((i + 1) % 6 == 0))
            return ts_error(TS_ERR_UNSUPPORTED,
                            "%s: layer %lld is %s attention, but llama.cpp's "
                            "%s GGUF fixes every 6th layer as the global one",
                            path, (long long)i, global[i] ? "full" : "sliding", g->arch);
    if (g->theta_local != 10000.0)
        return ts_error(TS_ERR_UNSUPPORTED,
                        "%s: sliding-layer RoPE base %g: llama.cpp's %s "
                        "GGUF fixes it at 10000",
                        path, g->theta_local, g->arch);
    int64_t scale_dim = g->n_layers == 62 ? g->n_embd / g->n_head : g->head_dim;
    if (g->qpas != scale_dim)
        return ts_error(TS_ERR_UNSUPPORTED,
                        "%s: query_pre_attn_scalar %lld: llama.cpp's %s "
                        "GGUF implies %lld",
                        path, (long long)g->qpas, g->arch, (long long)scale_dim);
    return TS_OK;
}

static ts_status write_metadata(const g3_cfg *g, ts_gguf_writer *w) {
    char key[128];
#define K(name)   (snprintf(key, sizeof key, "%s." name, g->arch), key)
#define U32(k, v) TS_TRY(ts_gguf_writer_kv_u32(w, K(k), (uint32_t)(v)))
    U32("context_length", g->ctx);
    U32("embedding_length", g->n_embd);
    U32("block_count", g->n_layers);
    U32("feed_forward_length", g->n_ff);
    U32("attention.head_count", g->n_head);
    TS_TRY(ts_gguf_writer_kv_f32(w, K("attention.layer_norm_rms_epsilon"), (float)g->eps));
    U32("attention.key_length", g->head_dim);
    U32("attention.value_length", g->head_dim);
    TS_TRY(ts_gguf_writer_kv_f32(w, K("rope.freq_base"), (float)g->theta_global));
    U32("attention.sliding_window", g->window); /* an encoder's too: the config's, not halved */
    U32("attention.head_count_kv", g->n_kv_head);
#undef U32
    if (g->softcap > 0)
        TS_TRY(ts_gguf_writer_kv_f32(w, K("final_logit_softcapping"), (float)g->softcap));
    if (strcmp(g->arch, "gemma-embedding") == 0)
        TS_TRY(ts_gguf_writer_kv_bool(w, K("attention.causal"), false));
#undef K
    return TS_OK;
}

/* An encoder's pooling and Dense layers in llama.cpp's gemma-embedding form: pooling_type
 * (1 mean, 2 cls, 3 last), dense_2 and dense_3 without bias or activation (all the form
 * holds; F32, as quantize.c keeps them). */
static ts_status plan_embed_head(const ts_model *m, const g3_cfg *g, qz_plan *p) {
    ts_model_info info;
    ts_model_get_info(m, &info);
    static const uint32_t types[] = {
        [TS_POOL_UNSET] = 0, [TS_POOL_MEAN] = 1, [TS_POOL_FIRST] = 2, [TS_POOL_LAST] = 3};
    char key[128];
    snprintf(key, sizeof key, "%s.pooling_type", g->arch);
    TS_TRY(ts_gguf_writer_kv_u32(p->w, key, types[info.pooling]));
    const ts_embed_head *h = &m->head;
    if (h->n_dense > 2)
        return ts_error(TS_ERR_UNSUPPORTED,
                        "%s: %d Dense modules: llama.cpp's gemma-embedding "
                        "GGUF holds two",
                        m->path, h->n_dense);
    for (int i = 0; i < h->n_dense; i++) {
        const ts_dense *d = &h->dense[i];
        if (d->b || d->tanh)
            return ts_error(TS_ERR_UNSUPPORTED,
                            "%s: Dense module %d has a %s: llama.cpp's "
                            "gemma-embedding GGUF holds plain matrices",
                            m->path, i + 1, d->b ? "bias" : "Tanh");
        char name[64];
        snprintf(name, sizeof name, "dense_%d.weight", i + 2);
        qz_tensor *t;
        TS_TRY(qz_add_f32(p, name, d->w, d->out, d->in, &t));
        snprintf(key, sizeof key, "%s.dense_%d_feat_in", g->arch, i + 2);
        TS_TRY(ts_gguf_writer_kv_u32(p->w, key, (uint32_t)d->in));
        snprintf(key, sizeof key, "%s.dense_%d_feat_out", g->arch, i + 2);
        TS_TRY(ts_gguf_writer_kv_u32(p->w, key, (uint32_t)d->out));
    }
    return TS_OK;
}

typedef struct {
    const ts_model *m;
    qz_plan *p;
    const char *prefix;
} planner;

static ts_status add(planner *P, const char *gguf_fmt, const char *hf_fmt, int layer, int n_dims,
                     int64_t rows, int64_t cols, qz_op op) {
    char tail[160], hf[256], name[64];
    snprintf(tail, sizeof tail, hf_fmt, layer < 0 ? 0 : layer);
    snprintf(hf, sizeof hf, "%s%s", P->prefix, tail);
    const ts_tensor *src = ts_st_find(P->m->st, hf);
    if (!src) return ts_error(TS_ERR_FORMAT, "%s: missing tensor '%s'", P->m->path, hf);
    snprintf(name, sizeof name, gguf_fmt, layer < 0 ? 0 : layer);
    return qz_add(P->p, name, layer, src, n_dims, rows, cols, op, NULL);
}

ts_status gemma3_gguf_plan(const ts_model *m, qz_plan *p) {
    g3_cfg g;
    TS_TRY(read_cfg(m, &g));
    TS_TRY(write_metadata(&g, p->w));
    p->n_layers = (int)g.n_layers;
    p->tok_pre = "default"; /* Gemma's SentencePiece tokenizer.json: written as "llama" */
    planner P = {m, p,
                 ts_st_find(m->st, "model.language_model.embed_tokens.weight")
                     ? "model.language_model."
                 : ts_st_find(m->st, "embed_tokens.weight") ? ""
                                                            : "model."};
    int64_t D = g.n_embd, hd = g.head_dim, qw = g.n_head * hd, kvw = g.n_kv_head * hd;
    TS_TRY(add(&P, "token_embd.weight%.0d", "embed_tokens.weight%.0d", -1, 2, g.n_vocab, D,
               QZ_OP_NONE));
    for (int i = 0; i < (int)g.n_layers; i++) {
        static const struct {
            const char *gguf, *hf;
            int n; /* 0: D, 1: head_dim */
        } norms[] = {
            {"blk.%d.attn_norm.weight", "layers.%d.input_layernorm.weight", 0},
            {"blk.%d.attn_q_norm.weight", "layers.%d.self_attn.q_norm.weight", 1},
            {"blk.%d.attn_k_norm.weight", "layers.%d.self_attn.k_norm.weight", 1},
            {"blk.%d.post_attention_norm.weight", "layers.%d.post_attention_layernorm.weight", 0},
            {"blk.%d.ffn_norm.weight", "layers.%d.pre_feedforward_layernorm.weight", 0},
            {"blk.%d.post_ffw_norm.weight", "layers.%d.post_feedforward_layernorm.weight", 0},
        };
        for (size_t k = 0; k < sizeof norms / sizeof norms[0]; k++)
            TS_TRY(add(&P, norms[k].gguf, norms[k].hf, i, 1, 1, norms[k].n ? hd : D,
                       QZ_OP_ADD_ONE));
        TS_TRY(add(&P, "blk.%d.attn_q.weight", "layers.%d.self_attn.q_proj.weight", i, 2, qw, D,
                   QZ_OP_NONE));
        TS_TRY(add(&P, "blk.%d.attn_k.weight", "layers.%d.self_attn.k_proj.weight", i, 2, kvw, D,
                   QZ_OP_NONE));
        TS_TRY(add(&P, "blk.%d.attn_v.weight", "layers.%d.self_attn.v_proj.weight", i, 2, kvw, D,
                   QZ_OP_NONE));
        TS_TRY(add(&P, "blk.%d.attn_output.weight", "layers.%d.self_attn.o_proj.weight", i, 2, D,
                   qw, QZ_OP_NONE));
        TS_TRY(add(&P, "blk.%d.ffn_gate.weight", "layers.%d.mlp.gate_proj.weight", i, 2, g.n_ff,
                   D, QZ_OP_NONE));
        TS_TRY(add(&P, "blk.%d.ffn_up.weight", "layers.%d.mlp.up_proj.weight", i, 2, g.n_ff, D,
                   QZ_OP_NONE));
        TS_TRY(add(&P, "blk.%d.ffn_down.weight", "layers.%d.mlp.down_proj.weight", i, 2, D,
                   g.n_ff, QZ_OP_NONE));
    }
    TS_TRY(add(&P, "output_norm.weight%.0d", "norm.weight%.0d", -1, 1, 1, D, QZ_OP_ADD_ONE));
    if (!g.tied && ts_st_find(m->st, "lm_head.weight")) {
        P.prefix = "";
        TS_TRY(add(&P, "output.weight%.0d", "lm_head.weight%.0d", -1, 2, g.n_vocab, D,
                   QZ_OP_NONE));
    }
    if (strcmp(g.arch, "gemma-embedding") == 0) TS_TRY(plan_embed_head(m, &g, p));
    return TS_OK;
}
