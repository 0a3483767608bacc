/* Gemma 3 text decoder (specs/models.md Part D) from a Hugging Face checkpoint.
 *
 * Scaled embeddings, (1 + w) RMSNorms before and after attention and the MLP, q/k norms,
 * sliding-window layers and global layers with their own RoPE bases, GELU-tanh gated MLP,
 * optional logit soft-capping, tied output head. The embedding scale is sqrt(hidden_size) in
 * fp32, matching an fp32 computation of the stored weights. Every sliding layer keeps a full
 * KV cache for now (the window only limits what attention reads). */
#include "model/layers.h"
#include "model/lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GEMMA3_MAX_LAYERS 256

typedef struct {
    int n_vocab, n_embd, n_layers, n_ff, n_head, n_kv_head, head_dim, window, n_ctx_train;
    float eps, scale, embed_scale, theta_local, theta_global, final_softcap, attn_softcap;
    bool tied;
    bool lm_head_separate; /* an output head of its own was loaded */
    /* an encoder (use_bidirectional_attention: EmbeddingGemma): attention without the causal
     * mask, a sliding layer's keys within enc_window - 1 positions on either side
     * (transformers' sliding_window // 2 + 1, exclusive) */
    bool encoder;
    int enc_window;
    bool is_global[GEMMA3_MAX_LAYERS];
} gemma3_hparams;

typedef struct {
    float *ln_in, *ln_post_attn, *ln_pre_ff, *ln_post_ff, *q_norm, *k_norm; /* all 1 + w */
    const ts_tensor *wq, *wk, *wv, *wo, *gate, *up, *down;
} gemma3_layer;

typedef struct {
    gemma3_hparams hp;
    const ts_tensor *embed, *lm_head;
    float *final_norm;
    gemma3_layer layers[GEMMA3_MAX_LAYERS];
    float *host_params;
    size_t n_host_params;
} gemma3_model;

static bool gemma3_matches_hf(const char *model_type) {
    return strcmp(model_type, "gemma3_text") == 0 || strcmp(model_type, "gemma3") == 0;
}

static ts_status geti(const ts_hfconfig *c, const char *k, int64_t lo, int64_t hi, int *out) {
    int64_t v;
    TS_TRY(ts_hfconfig_int(c, k, lo, hi, &v));
    *out = (int)v;
    return TS_OK;
}

/* RoPE bases: newer configs nest them per layer type in rope_parameters, older ones use
 * rope_theta (global) and rope_local_base_freq (sliding). Only unscaled RoPE is supported. */
static ts_status read_rope(const ts_hfconfig *c, gemma3_hparams *h) {
    const char *path = ts_hfconfig_path(c);
    static const char *const kinds[2] = {"sliding_attention", "full_attention"};
    double theta[2] = {10000.0, 1000000.0};
    for (int i = 0; i < 2; i++) {
        char key[96];
        snprintf(key, sizeof key, "rope_parameters.%s.rope_type", kinds[i]);
        if (ts_hfconfig_has(c, key)) {
            const char *type;
            TS_TRY(ts_hfconfig_str(c, key, &type));
            if (strcmp(type, "default") != 0)
                return ts_error(TS_ERR_UNSUPPORTED, "%s: field '%s': '%s' not supported", path, key,
                                type);
        }
        snprintf(key, sizeof key, "rope_parameters.%s.rope_theta", kinds[i]);
        if (ts_hfconfig_has(c, key)) {
            TS_TRY(ts_hfconfig_float(c, key, &theta[i]));
        } else {
            TS_TRY(ts_hfconfig_float_opt(c, i ? "rope_theta" : "rope_local_base_freq", theta[i],
                                         &theta[i]));
        }
        if (!(theta[i] > 0))
            return ts_error(TS_ERR_FORMAT, "%s: RoPE base %g out of range", path, theta[i]);
    }
    if (ts_hfconfig_has(c, "rope_scaling"))
        return ts_error(TS_ERR_UNSUPPORTED, "%s: field 'rope_scaling': scaled RoPE not supported",
                        path);
    h->theta_local = (float)theta[0];
    h->theta_global = (float)theta[1];
    return TS_OK;
}

static ts_status read_hparams(const ts_hfconfig *c, gemma3_hparams *h) {
    const char *path = ts_hfconfig_path(c);
    TS_TRY(geti(c, "vocab_size", 1, 1 << 24, &h->n_vocab));
    TS_TRY(geti(c, "hidden_size", 1, 1 << 16, &h->n_embd));
    TS_TRY(geti(c, "num_hidden_layers", 1, GEMMA3_MAX_LAYERS, &h->n_layers));
    TS_TRY(geti(c, "intermediate_size", 1, 1 << 20, &h->n_ff));
    TS_TRY(geti(c, "num_attention_heads", 1, 1024, &h->n_head));
    TS_TRY(geti(c, "num_key_value_heads", 1, 1024, &h->n_kv_head));
    int64_t v;
    TS_TRY(ts_hfconfig_int_opt(c, "head_dim", 1, 512, 256, &v));
    h->head_dim = (int)v;
    TS_TRY(ts_hfconfig_int_opt(c, "query_pre_attn_scalar", 1, 1 << 20, h->head_dim, &v));
    h->scale = (float)(1.0 / sqrt((double)v));
    TS_TRY(ts_hfconfig_int_opt(c, "sliding_window", 1, INT32_MAX, 4096, &v));
    h->window = (int)v;
    TS_TRY(ts_hfconfig_int_opt(c, "max_position_embeddings", 1, INT32_MAX, 32768, &v));
    h->n_ctx_train = (int)v;
    double d;
    TS_TRY(ts_hfconfig_float_opt(c, "rms_norm_eps", 1e-6, &d));
    h->eps = (float)d;
    TS_TRY(ts_hfconfig_float_opt(c, "final_logit_softcapping", 0.0, &d));
    h->final_softcap = (float)d;
    /* attn_logit_softcapping is read by Gemma 2 but ignored by transformers' Gemma 3: so is it
     * here, or outputs would differ from the reference for configs that carry it. */
    h->attn_softcap = 0.0f;
    TS_TRY(ts_hfconfig_bool_opt(c, "tie_word_embeddings", true, &h->tied));
    const char *act;
    TS_TRY(ts_hfconfig_str_opt(c, "hidden_activation", "gelu_pytorch_tanh", &act));
    if (strcmp(act, "gelu_pytorch_tanh") != 0)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: field 'hidden_activation': '%s' not supported",
                        path, act);
    TS_TRY(ts_hfconfig_bool_opt(c, "use_bidirectional_attention", false, &h->encoder));
    h->enc_window = h->window / 2 + 1;
    if (h->n_head % h->n_kv_head)
        return ts_error(TS_ERR_FORMAT, "%s: num_attention_heads %d is not a multiple of "
                        "num_key_value_heads %d", path, h->n_head, h->n_kv_head);
    h->embed_scale = sqrtf((float)h->n_embd);
    if (ts_hfconfig_has(c, "layer_types")) {
        const char *items[GEMMA3_MAX_LAYERS];
        int n;
        TS_TRY(ts_hfconfig_str_array(c, "layer_types", items, GEMMA3_MAX_LAYERS, &n));
        if (n != h->n_layers)
            return ts_error(TS_ERR_FORMAT, "%s: field 'layer_types': %d entries for %d layers",
                            path, n, h->n_layers);
        for (int i = 0; i < n; i++) {
            if (strcmp(items[i], "full_attention") == 0)
                h->is_global[i] = true;
            else if (strcmp(items[i], "sliding_attention") == 0)
                h->is_global[i] = false;
            else
                return ts_error(TS_ERR_UNSUPPORTED, "%s: field 'layer_types[%d]': unknown '%s'",
                                path, i, items[i]);
        }
    } else {
        int64_t pat;
        TS_TRY(ts_hfconfig_int_opt(c, "sliding_window_pattern", 1, 1 << 20, 6, &pat));
        for (int i = 0; i < h->n_layers; i++) h->is_global[i] = (i + 1) % pat == 0;
    }
    return read_rope(c, h);
}

static void gemma3_unload(ts_model *m) {
    gemma3_model *g = m->impl;
    if (!g) return;
    free(g->host_params);
    free(g);
    m->impl = NULL;
}

/* Tensor names in the two containers. GGUF (llama.cpp's converter) stores the norms with the
 * 1 already added, so they are read as they are; Hugging Face stores w of (1 + w). */
typedef struct {
    const char *embed, *final_norm, *head;
    const char *ln_in, *ln_post_attn, *ln_pre_ff, *ln_post_ff, *q_norm, *k_norm;
    const char *wq, *wk, *wv, *wo, *gate, *up, *down;
    bool norms_plus_one; /* add 1 to the norm weights at load */
} gemma3_names;

static const gemma3_names hf_names = {
    "embed_tokens.weight", "norm.weight", "lm_head.weight",
    "layers.%d.input_layernorm.weight", "layers.%d.post_attention_layernorm.weight",
    "layers.%d.pre_feedforward_layernorm.weight", "layers.%d.post_feedforward_layernorm.weight",
    "layers.%d.self_attn.q_norm.weight", "layers.%d.self_attn.k_norm.weight",
    "layers.%d.self_attn.q_proj.weight", "layers.%d.self_attn.k_proj.weight",
    "layers.%d.self_attn.v_proj.weight", "layers.%d.self_attn.o_proj.weight",
    "layers.%d.mlp.gate_proj.weight", "layers.%d.mlp.up_proj.weight",
    "layers.%d.mlp.down_proj.weight", true,
};

static const gemma3_names gguf_names = {
    "token_embd.weight", "output_norm.weight", "output.weight",
    "blk.%d.attn_norm.weight", "blk.%d.post_attention_norm.weight", "blk.%d.ffn_norm.weight",
    "blk.%d.post_ffw_norm.weight", "blk.%d.attn_q_norm.weight", "blk.%d.attn_k_norm.weight",
    "blk.%d.attn_q.weight", "blk.%d.attn_k.weight", "blk.%d.attn_v.weight",
    "blk.%d.attn_output.weight", "blk.%d.ffn_gate.weight", "blk.%d.ffn_up.weight",
    "blk.%d.ffn_down.weight", false,
};

typedef struct {
    const ts_model *m;
    const char *prefix; /* "" for GGUF and for the output head */
    const gemma3_names *nm;
    float *cur;
    int64_t n_params;
    uint64_t bytes;
} loader;

static void tensor_name(const loader *L, const char *fmt, int layer, char *out, size_t cap) {
    char tail[160];
    snprintf(tail, sizeof tail, fmt, layer);
    snprintf(out, cap, "%s%s", L->prefix, tail);
}

static ts_status mat(loader *L, const char *fmt, int layer, int64_t rows, int64_t cols,
                     const ts_tensor **out) {
    char name[256];
    tensor_name(L, fmt, layer, name, sizeof name);
    int64_t shape[2] = {rows, cols};
    TS_TRY(ts_model_tensor(L->m, name, 2, shape, out));
    TS_TRY(ts_check_matmul_dtype(L->m, name, *out));
    L->n_params += rows * cols;
    L->bytes += (*out)->nbytes;
    return TS_OK;
}

/* a norm weight, as the effective multiplier (1 + w) */
static ts_status norm(loader *L, const char *fmt, int layer, int n, float **out) {
    char name[256];
    tensor_name(L, fmt, layer, name, sizeof name);
    *out = L->cur;
    L->cur += n;
    L->n_params += n;
    TS_TRY(ts_model_tensor_f32(L->m, name, n, *out));
    if (L->nm->norms_plus_one)
        for (int i = 0; i < n; i++) (*out)[i] += 1.0f;
    return TS_OK;
}

static ts_status load_weights(ts_model *m, gemma3_model *g, loader *L) {
    const gemma3_hparams *h = &g->hp;
    const gemma3_names *nm = L->nm;
    int D = h->n_embd, hd = h->head_dim;
    TS_TRY(mat(L, nm->embed, 0, h->n_vocab, D, &g->embed));
    TS_TRY(norm(L, nm->final_norm, 0, D, &g->final_norm));
    for (int i = 0; i < h->n_layers; i++) {
        gemma3_layer *ly = &g->layers[i];
        TS_TRY(norm(L, nm->ln_in, i, D, &ly->ln_in));
        TS_TRY(norm(L, nm->ln_post_attn, i, D, &ly->ln_post_attn));
        TS_TRY(norm(L, nm->ln_pre_ff, i, D, &ly->ln_pre_ff));
        TS_TRY(norm(L, nm->ln_post_ff, i, D, &ly->ln_post_ff));
        TS_TRY(norm(L, nm->q_norm, i, hd, &ly->q_norm));
        TS_TRY(norm(L, nm->k_norm, i, hd, &ly->k_norm));
        TS_TRY(mat(L, nm->wq, i, (int64_t)h->n_head * hd, D, &ly->wq));
        TS_TRY(mat(L, nm->wk, i, (int64_t)h->n_kv_head * hd, D, &ly->wk));
        TS_TRY(mat(L, nm->wv, i, (int64_t)h->n_kv_head * hd, D, &ly->wv));
        TS_TRY(mat(L, nm->wo, i, D, (int64_t)h->n_head * hd, &ly->wo));
        TS_TRY(mat(L, nm->gate, i, h->n_ff, D, &ly->gate));
        TS_TRY(mat(L, nm->up, i, h->n_ff, D, &ly->up));
        TS_TRY(mat(L, nm->down, i, D, h->n_ff, &ly->down));
    }
    /* the output head is never under the HF model prefix */
    L->prefix = "";
    const ts_tensor *lm = NULL;
    ts_status st = ts_model_tensor(m, nm->head, 2, (int64_t[2]){h->n_vocab, D}, &lm);
    if (h->tied || st != TS_OK) {
        if (!h->tied)
            return ts_error(TS_ERR_FORMAT, "%s: missing tensor '%s' (the output head is not tied)",
                            m->path, nm->head);
        g->lm_head = g->embed;
        return TS_OK;
    }
    g->hp.lm_head_separate = true;
    return mat(L, nm->head, 0, h->n_vocab, D, &g->lm_head);
}

static size_t host_param_count(const gemma3_hparams *h) {
    return (size_t)h->n_embd * (1 + 4 * (size_t)h->n_layers) +
           2 * (size_t)h->head_dim * h->n_layers;
}

/* Binds the weights and fills m->info; frees everything on error. */
static ts_status finish_load(ts_model *m, gemma3_model *g, loader *L) {
    const gemma3_hparams *h = &g->hp;
    g->n_host_params = host_param_count(h);
    g->host_params = malloc(g->n_host_params * sizeof(float));
    if (!g->host_params) return ts_error(TS_ERR_NOMEM, "out of memory");
    L->cur = g->host_params;
    TS_TRY(load_weights(m, g, L));
    m->info = (ts_model_info){
        .arch = "gemma3",
        .weight_dtype = ts_dtype_name(g->layers[0].gate->dtype),
        .n_vocab = h->n_vocab,
        .n_embd = h->n_embd,
        .n_layers = h->n_layers,
        .n_ctx_train = h->n_ctx_train,
        .n_params = L->n_params,
        .weight_bytes = L->bytes - (h->lm_head_separate ? g->embed->nbytes : 0) +
                        ts_dtype_row_bytes(g->embed->dtype, h->n_embd),
        .encoder = h->encoder,
    };
    return TS_OK;
}

static ts_status gemma3_load_hf(ts_model *m) {
    gemma3_model *g = calloc(1, sizeof *g);
    if (!g) return ts_error(TS_ERR_NOMEM, "out of memory");
    m->impl = g;
    ts_status st = read_hparams(m->cfg, &g->hp);
    if (st == TS_OK) {
        loader L = {.m = m, .nm = &hf_names};
        /* a Gemma3ForCausalLM's, a multimodal wrapper's, or a bare Gemma3TextModel's
         * (EmbeddingGemma) */
        L.prefix = ts_st_find(m->st, "model.language_model.embed_tokens.weight")
                       ? "model.language_model."
                   : ts_st_find(m->st, "embed_tokens.weight") ? ""
                                                              : "model.";
        st = finish_load(m, g, &L);
    }
    if (st != TS_OK) gemma3_unload(m);
    return st;
}

/* Hyper-parameters from GGUF metadata (llama.cpp's keys, under the architecture's name:
 * "gemma3", or "gemma-embedding" for EmbeddingGemma, an encoder whose sliding_window is the
 * Hugging Face config's, keys within half of it on either side). The sliding-layer RoPE base
 * and the 5:1 layer pattern are not in the metadata; llama.cpp fixes them for both. */
static ts_status read_gguf_hparams(const ts_model *m, const char *arch, gemma3_hparams *h) {
    const ts_gguf *g = m->gguf;
    uint32_t u;
    char key[128];
#define K(name) (snprintf(key, sizeof key, "%s." name, arch), key)
#define U32(name, dst, lo, hi)                                                                     \
    do {                                                                                           \
        TS_TRY(ts_gguf_get_u32(g, K(name), &u));                                                   \
        if (u < (lo) || u > (hi))                                                                  \
            return ts_error(TS_ERR_FORMAT, "%s: key '%s': %u out of range [%u, %u]", m->path, key, \
                            u, (unsigned)(lo), (unsigned)(hi));                                    \
        dst = (int)u;                                                                              \
    } while (0)
    U32("embedding_length", h->n_embd, 1, 1 << 16);
    U32("block_count", h->n_layers, 1, GEMMA3_MAX_LAYERS);
    U32("feed_forward_length", h->n_ff, 1, 1 << 20);
    U32("attention.head_count", h->n_head, 1, 1024);
    U32("attention.head_count_kv", h->n_kv_head, 1, 1024);
    U32("attention.key_length", h->head_dim, 1, 512);
    U32("context_length", h->n_ctx_train, 1, INT32_MAX);
    U32("attention.sliding_window", h->window, 1, INT32_MAX);
#undef U32
    uint32_t vlen;
    TS_TRY(ts_gguf_get_u32_opt(g, K("attention.value_length"), (uint32_t)h->head_dim, &vlen));
    if ((int)vlen != h->head_dim)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: value_length %u differs from key_length %d",
                        m->path, vlen, h->head_dim);
    TS_TRY(ts_gguf_get_f32_opt(g, K("attention.layer_norm_rms_epsilon"), 1e-6f, &h->eps));
    TS_TRY(ts_gguf_get_f32_opt(g, K("rope.freq_base"), 1000000.0f, &h->theta_global));
    TS_TRY(ts_gguf_get_f32_opt(g, K("final_logit_softcapping"), 0.0f, &h->final_softcap));
    bool embedding = strcmp(arch, "gemma-embedding") == 0, causal;
    TS_TRY(ts_gguf_get_bool_opt(g, K("attention.causal"), !embedding, &causal));
#undef K
    if (causal == embedding)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: %s with attention.causal %s not supported",
                        m->path, arch, causal ? "true" : "false");
    h->encoder = embedding;
    h->enc_window = h->window / 2 + 1;
    h->theta_local = 10000.0f;
    if (h->n_head % h->n_kv_head)
        return ts_error(TS_ERR_FORMAT, "%s: head_count %d is not a multiple of head_count_kv %d",
                        m->path, h->n_head, h->n_kv_head);
    h->scale = 1.0f / sqrtf((float)h->head_dim);
    h->embed_scale = sqrtf((float)h->n_embd);
    for (int i = 0; i < h->n_layers; i++) h->is_global[i] = (i + 1) % 6 == 0;
    const ts_tensor *emb;
    TS_TRY(ts_model_tensor(m, "token_embd.weight", 2, (int64_t[2]){-1, h->n_embd}, &emb));
    h->n_vocab = (int)emb->shape[0];
    h->tied = ts_gguf_find(g, "output.weight") == NULL;
    return TS_OK;
}

static ts_status load_gguf_as(ts_model *m, const char *arch) {
    gemma3_model *g = calloc(1, sizeof *g);
    if (!g) return ts_error(TS_ERR_NOMEM, "out of memory");
    m->impl = g;
    ts_status st = read_gguf_hparams(m, arch, &g->hp);
    if (st == TS_OK) {
        loader L = {.m = m, .prefix = "", .nm = &gguf_names};
        st = finish_load(m, g, &L);
    }
    if (st != TS_OK) gemma3_unload(m);
    return st;
}

static ts_status gemma3_load_gguf(ts_model *m) { return load_gguf_as(m, "gemma3"); }
static ts_status gemma_embedding_load_gguf(ts_model *m) {
    return load_gguf_as(m, "gemma-embedding");
}

/* ---- the forward pass ------------------------------------------------------------------ */

typedef struct {
    const gemma3_model *g;
    ts_backend *be;
    int n_batch, n_ctx;
    float *x, *h, *q, *k, *v, *o, *f1, *f2, *lh, *logits, *params;
    int32_t *sel;
    ts_run *runs;
    ts_seq_run *sruns; /* [n_batch] the runs with one layer's caches */
    ts_lora_rt lora;
} gemma3_rt;

static size_t kv_bytes(const gemma3_hparams *h, int n_ctx) {
    return (size_t)n_ctx * h->n_kv_head * h->head_dim * sizeof(float);
}

static size_t gemma3_state_bytes(const ts_model *m, int n_ctx) {
    const gemma3_model *g = m->impl;
    if (g->hp.encoder) return 0; /* nothing is kept from one call to the next */
    return 2 * kv_bytes(&g->hp, n_ctx) * (size_t)g->hp.n_layers;
}

/* Each layer's K rows, then its V rows (the layout gemma3_forward's runs point into). */
static int gemma3_state_rows(const ts_model *m, int n_ctx, ts_state_rows *out, int max) {
    const gemma3_model *g = m->impl;
    if (g->hp.encoder || 2 * g->hp.n_layers > max) return 0;
    size_t kvb = kv_bytes(&g->hp, n_ctx), row = kv_bytes(&g->hp, 1);
    for (int il = 0; il < g->hp.n_layers; il++) {
        out[2 * il] = (ts_state_rows){2 * kvb * (size_t)il, row};
        out[2 * il + 1] = (ts_state_rows){2 * kvb * (size_t)il + kvb, row};
    }
    return 2 * g->hp.n_layers;
}

static void gemma3_runtime_free(void *p) {
    gemma3_rt *rt = p;
    if (!rt) return;
    float *bufs[] = {rt->x, rt->h, rt->q, rt->k, rt->v, rt->o, rt->f1, rt->f2, rt->lh, rt->logits,
                     rt->params};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) rt->be->ops->free(rt->be, bufs[i]);
    free(rt->sel);
    free(rt->runs);
    free(rt->sruns);
    ts_lora_rt_free(&rt->lora);
    free(rt);
}

static ts_status gemma3_runtime_create(const ts_model *m, ts_backend *be, int n_batch, int n_ctx,
                                       void **out) {
    const gemma3_model *g = m->impl;
    const gemma3_hparams *h = &g->hp;
    *out = NULL;
    gemma3_rt *rt = calloc(1, sizeof *rt);
    if (!rt) return ts_error(TS_ERR_NOMEM, "out of memory");
    rt->g = g;
    rt->be = be;
    rt->n_batch = n_batch;
    rt->n_ctx = n_ctx;
    size_t nb = (size_t)n_batch, qw = (size_t)h->n_head * h->head_dim;
    size_t kvw = (size_t)h->n_kv_head * h->head_dim;
    struct {
        float **p;
        size_t n;
    } plan[] = {{&rt->x, nb * h->n_embd},
                {&rt->h, nb * h->n_embd},
                {&rt->q, nb * qw},
                {&rt->k, nb * kvw},
                {&rt->v, nb * kvw},
                {&rt->o, nb * qw},
                {&rt->f1, nb * h->n_ff},
                {&rt->f2, nb * h->n_ff},
                {&rt->lh, (size_t)ts_logit_rows(n_batch) * h->n_embd},
                /* an encoder writes no logits */
                {&rt->logits, h->encoder ? 1 : (size_t)ts_logit_rows(n_batch) * h->n_vocab},
                {&rt->params, g->n_host_params}};
    for (size_t i = 0; i < sizeof plan / sizeof plan[0]; i++)
        if (!(*plan[i].p = be->ops->alloc(be, plan[i].n * sizeof(float)))) {
            gemma3_runtime_free(rt);
            return ts_error(TS_ERR_NOMEM, "out of memory for activations (%d tokens)", n_batch);
        }
    rt->sel = malloc(nb * sizeof *rt->sel);
    rt->runs = malloc(nb * sizeof *rt->runs);
    rt->sruns = malloc(nb * sizeof *rt->sruns);
    if (!rt->sel || !rt->runs || !rt->sruns) {
        gemma3_runtime_free(rt);
        return ts_error(TS_ERR_NOMEM, "out of memory");
    }
    ts_status st = ts_lora_rt_init(&rt->lora, m, be, n_batch);
    if (st != TS_OK) {
        gemma3_runtime_free(rt);
        return st;
    }
    be->ops->upload(be, rt->params, g->host_params, g->n_host_params * sizeof(float));
    *out = rt;
    return TS_OK;
}

static const float *P(const gemma3_rt *rt, const float *host) {
    return rt->params + (host - rt->g->host_params);
}

static void attention(gemma3_rt *rt, int il, const ts_fwd_batch *b, const ts_run *runs, int nr) {
    const gemma3_hparams *hp = &rt->g->hp;
    const gemma3_layer *ly = &rt->g->layers[il];
    ts_backend *be = rt->be;
    const ts_backend_ops *op = be->ops;
    int n = b->n_tokens, D = hp->n_embd, hd = hp->head_dim;
    int qw = hp->n_head * hd, kvw = hp->n_kv_head * hd;
    float theta = hp->is_global[il] ? hp->theta_global : hp->theta_local;
    {
        const ts_tensor *W[3] = {ly->wq, ly->wk, ly->wv};
        float *y[3] = {rt->q, rt->k, rt->v};
        int64_t ldy[3] = {qw, kvw, kvw};
        ts_lora_matmul_n(&rt->lora, W, 3, rt->h, D, n, NULL, y, ldy);
    }
    ts_attn_dims dims = {hp->n_head, hp->n_kv_head, hd, hp->scale,
                         hp->is_global[il] ? 0 : hp->window, hp->attn_softcap};
    if (hp->encoder) { /* every token of a run sees the run's keys, before and after it */
        ts_qk_norm_rope(be, rt->q, qw, hd, hp->n_head, P(rt, ly->q_norm), rt->k, kvw, hp->n_kv_head,
                        P(rt, ly->k_norm), n, hd, hp->eps, hd, b->pos, theta);
        dims.window = hp->is_global[il] ? 0 : hp->enc_window;
        for (int r = 0; r < nr; r++) {
            size_t s = (size_t)runs[r].start;
            op->attention_full(be, rt->q + s * qw, qw, rt->k + s * kvw, rt->v + s * kvw, kvw,
                               runs[r].len, &dims, rt->o + s * qw, qw);
        }
        ts_lora_matmul(&rt->lora, ly->wo, rt->o, qw, n, rt->h, D);
        return;
    }
    size_t kvb = kv_bytes(hp, rt->n_ctx);
    ts_seq_run *sr = rt->sruns;
    for (int r = 0; r < nr; r++) {
        char *st = (char *)b->slot_state[runs[r].slot] + 2 * kvb * (size_t)il;
        sr[r] = (ts_seq_run){.start = runs[r].start,
                             .len = runs[r].len,
                             .pos0 = runs[r].pos0,
                             .a = (float *)st,
                             .b = (float *)(st + kvb)};
    }
    /* a decode step: the backend's whole attention step where it has one */
    if (!ts_attention_step(be, rt->q, qw, hd, P(rt, ly->q_norm), rt->k, P(rt, ly->k_norm), rt->v,
                           hp->eps, hd, theta, &dims, sr, nr, NULL, rt->o, qw)) {
        ts_qk_norm_rope(be, rt->q, qw, hd, hp->n_head, P(rt, ly->q_norm), rt->k, kvw, hp->n_kv_head,
                        P(rt, ly->k_norm), n, hd, hp->eps, hd, b->pos, theta);
        ts_attend_runs(be, rt->q, qw, hd, rt->k, rt->v, &dims, sr, nr, rt->o, qw);
    }
    ts_lora_matmul(&rt->lora, ly->wo, rt->o, qw, n, rt->h, D);
}

static ts_status gemma3_forward(void *p, const ts_fwd_batch *b, float *logits) {
    gemma3_rt *rt = p;
    const gemma3_model *g = rt->g;
    const gemma3_hparams *hp = &g->hp;
    ts_backend *be = rt->be;
    const ts_backend_ops *op = be->ops;
    int n = b->n_tokens, D = hp->n_embd, F = hp->n_ff;
    if (n < 1 || n > rt->n_batch)
        return ts_error(TS_ERR_INVALID, "batch of %d tokens (limit %d)", n, rt->n_batch);
    int nr = ts_batch_runs(b, rt->runs);
    ts_lora_rt_begin(&rt->lora, b);
    if (hp->encoder) {
        if (!op->attention_full)
            return ts_error(TS_ERR_UNSUPPORTED,
                            "the %s backend has no attention without a mask "
                            "(an encoder's)",
                            op->name);
        for (int r = 0; r < nr; r++)
            if (rt->runs[r].pos0 != 0)
                return ts_error(TS_ERR_INVALID,
                                "an encoder takes a sequence's whole input in one "
                                "call: slot %d goes on at position %d",
                                rt->runs[r].slot, rt->runs[r].pos0);
    }
    TS_TRY(ts_embed(be, g->embed, b, hp->embed_scale, rt->x));
    op->rmsnorm(be, rt->x, D, n, D, P(rt, g->layers[0].ln_in), hp->eps, rt->h, D);
    for (int il = 0; il < hp->n_layers; il++) {
        const gemma3_layer *ly = &g->layers[il];
        attention(rt, il, b, rt->runs, nr);
        ts_norm_add_rmsnorm(be, rt->x, rt->h, n, D, D, P(rt, ly->ln_post_attn),
                            P(rt, ly->ln_pre_ff), hp->eps, rt->h);
        ts_lora_matmul_glu(&rt->lora, ly->gate, ly->up, rt->h, D, n, NULL, true, rt->f1, rt->f2, F,
                           rt->f1, F);
        ts_lora_matmul(&rt->lora, ly->down, rt->f1, F, n, rt->h, D);
        /* the residual add, fused with the next layer's input norm (none after the last) */
        ts_norm_add_rmsnorm(be, rt->x, rt->h, n, D, D, P(rt, ly->ln_post_ff),
                            il + 1 < hp->n_layers ? P(rt, g->layers[il + 1].ln_in) : NULL, hp->eps,
                            rt->h);
    }
    ts_output_head oh = {P(rt, g->final_norm),       hp->eps, g->lm_head, D, hp->n_vocab,
                         ts_logit_rows(rt->n_batch), hp->final_softcap};
    ts_output_logits(be, &oh, b, rt->x, rt->sel, rt->lh, rt->logits, logits);
    return TS_OK;
}

/* The weights LoRA adapters may change: every decoder layer's projections. */
static int gemma3_lora_targets(const ts_model *m, ts_lora_target *out, int max) {
    const gemma3_model *g = m->impl;
    int n = 0;
    for (int il = 0; il < g->hp.n_layers; il++) {
        const gemma3_layer *ly = &g->layers[il];
        const ts_lora_target t[] = {{il, "self_attn.q_proj", "attn_q", ly->wq},
                                    {il, "self_attn.k_proj", "attn_k", ly->wk},
                                    {il, "self_attn.v_proj", "attn_v", ly->wv},
                                    {il, "self_attn.o_proj", "attn_output", ly->wo},
                                    {il, "mlp.gate_proj", "ffn_gate", ly->gate},
                                    {il, "mlp.up_proj", "ffn_up", ly->up},
                                    {il, "mlp.down_proj", "ffn_down", ly->down}};
        for (size_t k = 0; k < sizeof t / sizeof t[0]; k++, n++)
            if (out && n < max) out[n] = t[k];
    }
    return n;
}

/* What the two GGUF names of the model share: everything after the loading */
#define GEMMA3_RUNTIME_OPS                                                                         \
    .unload = gemma3_unload, .state_bytes = gemma3_state_bytes, .state_rows = gemma3_state_rows,   \
    .runtime_create = gemma3_runtime_create, .runtime_free = gemma3_runtime_free,                  \
    .forward = gemma3_forward, .lora_targets = gemma3_lora_targets, .synth = NULL

const ts_arch ts_arch_gemma3 = {
    .name = "gemma3",
    .matches_hf = gemma3_matches_hf,
    .load_hf = gemma3_load_hf,
    .gguf_arch = "gemma3",
    .load_gguf = gemma3_load_gguf,
    GEMMA3_RUNTIME_OPS,
};

/* EmbeddingGemma as llama.cpp writes it: its own GGUF architecture name, the same model (an
 * HF EmbeddingGemma is a gemma3_text config: ts_arch_gemma3's) */
const ts_arch ts_arch_gemma_embedding = {
    .name = "gemma3",
    .gguf_arch = "gemma-embedding",
    .load_gguf = gemma_embedding_load_gguf,
    GEMMA3_RUNTIME_OPS,
};
