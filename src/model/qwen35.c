/* Qwen3.5 text decoder: configuration and weights from a Hugging Face checkpoint.
 *
 * Reads both config forms (text-only `qwen3_5_text`, and composite `qwen3_5` with a
 * `text_config`), both tensor prefixes (`model.language_model.` and `model.`), `layer_types`
 * or `full_attention_interval`, and tied or untied output heads. Every tensor's shape is
 * checked before use; an error names the file and the tensor or field. */
#include "model/qwen35.h"

#include "model/layers.h"
#include "model/qwen35_vision.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool qwen35_matches_hf(const char *model_type) {
    return strcmp(model_type, "qwen3_5_text") == 0 || strcmp(model_type, "qwen3_5") == 0;
}

static ts_status cfg_int(const ts_hfconfig *c, const char *key, int64_t lo, int64_t hi, int *out) {
    int64_t v;
    TS_TRY(ts_hfconfig_int(c, key, lo, hi, &v));
    *out = (int)v;
    return TS_OK;
}

static ts_status read_layer_types(const ts_hfconfig *c, qwen35_hparams *h) {
    if (ts_hfconfig_has(c, "layer_types")) {
        const char *items[QWEN35_MAX_LAYERS];
        int n = 0;
        TS_TRY(ts_hfconfig_str_array(c, "layer_types", items, QWEN35_MAX_LAYERS, &n));
        if (n != h->n_layers)
            return ts_error(TS_ERR_FORMAT,
                            "%s: field 'layer_types': %d entries for num_hidden_layers %d",
                            ts_hfconfig_path(c), n, h->n_layers);
        for (int i = 0; i < n; i++) {
            if (strcmp(items[i], "full_attention") == 0)
                h->is_full[i] = true;
            else if (strcmp(items[i], "linear_attention") == 0)
                h->is_full[i] = false;
            else
                return ts_error(TS_ERR_UNSUPPORTED,
                                "%s: field 'layer_types[%d]': unknown layer type '%s'",
                                ts_hfconfig_path(c), i, items[i]);
        }
        return TS_OK;
    }
    int64_t interval;
    TS_TRY(ts_hfconfig_int_opt(c, "full_attention_interval", 1, 1 << 20, 4, &interval));
    for (int i = 0; i < h->n_layers; i++) h->is_full[i] = (i + 1) % interval == 0;
    return TS_OK;
}

/* MRoPE's split of the rotary frequency slots among time, height and width (used only when a
 * prompt holds images: with text alone the three positions are equal). */
static ts_status read_mrope(const ts_hfconfig *c, qwen35_hparams *h) {
    h->mrope_section[0] = 11, h->mrope_section[1] = 11, h->mrope_section[2] = 10;
    h->mrope_interleaved = true;
    if (ts_hfconfig_has(c, "rope_parameters.mrope_section")) {
        int64_t sec[3];
        int n;
        TS_TRY(ts_hfconfig_int_array(c, "rope_parameters.mrope_section", sec, 3, &n));
        if (n != 3 || sec[0] < 0 || sec[1] < 0 || sec[2] < 0 || sec[0] + sec[1] + sec[2] > 4096)
            return ts_error(TS_ERR_FORMAT,
                            "%s: field 'rope_parameters.mrope_section': expected "
                            "three counts",
                            ts_hfconfig_path(c));
        for (int i = 0; i < 3; i++)
            h->mrope_section[i] = (int)sec[i];
    }
    TS_TRY(
        ts_hfconfig_bool_opt(c, "rope_parameters.mrope_interleaved", true, &h->mrope_interleaved));
    return TS_OK;
}

static ts_status read_hparams(const ts_hfconfig *c, qwen35_hparams *h) {
    const char *path = ts_hfconfig_path(c);
    TS_TRY(cfg_int(c, "vocab_size", 1, 1 << 24, &h->n_vocab));
    TS_TRY(cfg_int(c, "hidden_size", 1, 1 << 16, &h->n_embd));
    TS_TRY(cfg_int(c, "num_hidden_layers", 1, QWEN35_MAX_LAYERS, &h->n_layers));
    TS_TRY(cfg_int(c, "intermediate_size", 1, 1 << 20, &h->n_ff));
    TS_TRY(cfg_int(c, "num_attention_heads", 1, 1024, &h->n_head));
    TS_TRY(cfg_int(c, "num_key_value_heads", 1, 1024, &h->n_kv_head));
    int64_t hd;
    TS_TRY(ts_hfconfig_int_opt(c, "head_dim", 1, 512, h->n_embd / h->n_head, &hd));
    h->head_dim = (int)hd;
    TS_TRY(cfg_int(c, "linear_num_key_heads", 1, 1024, &h->lin_hk));
    TS_TRY(cfg_int(c, "linear_num_value_heads", 1, 1024, &h->lin_hv));
    TS_TRY(cfg_int(c, "linear_key_head_dim", 1, 512, &h->lin_dk));
    TS_TRY(cfg_int(c, "linear_value_head_dim", 1, 512, &h->lin_dv));
    TS_TRY(cfg_int(c, "linear_conv_kernel_dim", 1, 64, &h->conv_k));
    double eps;
    TS_TRY(ts_hfconfig_float_opt(c, "rms_norm_eps", 1e-6, &eps));
    h->eps = (float)eps;
    int64_t ctx;
    TS_TRY(ts_hfconfig_int_opt(c, "max_position_embeddings", 1, INT32_MAX, 262144, &ctx));
    h->n_ctx_train = (int)ctx;
    TS_TRY(ts_hfconfig_bool_opt(c, "attn_output_gate", true, &h->attn_gate));
    TS_TRY(ts_hfconfig_bool_opt(c, "tie_word_embeddings", true, &h->tied));
    int64_t n_mtp;
    TS_TRY(ts_hfconfig_int_opt(c, "mtp_num_hidden_layers", 0, 64, 0, &n_mtp));
    h->n_mtp = (int)n_mtp;

    /* RoPE: newer configs nest it in rope_parameters, older ones keep top-level keys. */
    double theta, prf;
    const char *rope_type = "default";
    if (ts_hfconfig_has(c, "rope_parameters.rope_type"))
        TS_TRY(ts_hfconfig_str(c, "rope_parameters.rope_type", &rope_type));
    if (strcmp(rope_type, "default") != 0)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: field 'rope_parameters.rope_type': '%s' not "
                        "supported (only 'default')", path, rope_type);
    if (ts_hfconfig_has(c, "rope_parameters.rope_theta"))
        TS_TRY(ts_hfconfig_float(c, "rope_parameters.rope_theta", &theta));
    else
        TS_TRY(ts_hfconfig_float_opt(c, "rope_theta", 10000000.0, &theta));
    if (ts_hfconfig_has(c, "rope_parameters.partial_rotary_factor"))
        TS_TRY(ts_hfconfig_float(c, "rope_parameters.partial_rotary_factor", &prf));
    else
        TS_TRY(ts_hfconfig_float_opt(c, "partial_rotary_factor", 0.25, &prf));
    if (!(theta > 0) || !(prf > 0 && prf <= 1))
        return ts_error(TS_ERR_FORMAT, "%s: rope_theta %g / partial_rotary_factor %g out of range",
                        path, theta, prf);
    h->rope_theta = (float)theta;
    h->rot_dim = (int)(h->head_dim * prf);
    h->rot_dim -= h->rot_dim % 2;
    TS_TRY(read_mrope(c, h));

    if (h->n_head % h->n_kv_head)
        return ts_error(TS_ERR_FORMAT, "%s: num_attention_heads %d is not a multiple of "
                        "num_key_value_heads %d", path, h->n_head, h->n_kv_head);
    if (h->lin_hv % h->lin_hk)
        return ts_error(TS_ERR_FORMAT, "%s: linear_num_value_heads %d is not a multiple of "
                        "linear_num_key_heads %d", path, h->lin_hv, h->lin_hk);
    return read_layer_types(c, h);
}

/* Counts the fp32 values of small parameters kept on the host. */
static size_t host_param_count(const qwen35_hparams *h) {
    size_t n = (size_t)h->n_embd; /* final norm */
    for (int i = 0; i < h->n_layers; i++) {
        n += 2 * (size_t)h->n_embd;
        if (h->is_full[i])
            n += 2 * (size_t)h->head_dim;
        else
            n += (size_t)qwen35_conv_dim(h) * h->conv_k + 2 * (size_t)h->lin_hv + h->lin_dv;
    }
    /* an MTP block: its three norms, a full-attention layer's two and q / k norms */
    if (h->n_mtp > 0) n += 5 * (size_t)h->n_embd + 2 * (size_t)h->head_dim;
    return n;
}

static void add_one(float *w, int n) {
    for (int i = 0; i < n; i++) w[i] += 1.0f;
}

/* Tensor names in the two containers. GGUF (llama.cpp's converter) stores the (1 + w) norms with
 * the 1 added, A_log as -exp(A_log), conv1d squeezed to [C, K], and (when Hv > Hk) the value
 * heads in another order (qwen35_regroup_v); Hugging Face stores them as the model defines them. */
typedef struct {
    const char *embed, *final_norm, *head;
    const char *ln1, *ln2, *gate, *up, *down;
    const char *in_qkv, *in_z, *in_b, *in_a, *out_proj, *conv, *a, *dt_bias, *gnorm;
    const char *wq, *wk, *wv, *wo, *q_norm, *k_norm;
    bool hf; /* Hugging Face forms: add 1 to norms, A_log, conv1d [C, 1, K] */
} qwen35_names;

static const qwen35_names hf_names = {
    "embed_tokens.weight%.0d", "norm.weight%.0d", "lm_head.weight",
    "layers.%d.input_layernorm.weight", "layers.%d.post_attention_layernorm.weight",
    "layers.%d.mlp.gate_proj.weight", "layers.%d.mlp.up_proj.weight",
    "layers.%d.mlp.down_proj.weight", "layers.%d.linear_attn.in_proj_qkv.weight",
    "layers.%d.linear_attn.in_proj_z.weight", "layers.%d.linear_attn.in_proj_b.weight",
    "layers.%d.linear_attn.in_proj_a.weight", "layers.%d.linear_attn.out_proj.weight",
    "layers.%d.linear_attn.conv1d.weight", "layers.%d.linear_attn.A_log",
    "layers.%d.linear_attn.dt_bias", "layers.%d.linear_attn.norm.weight",
    "layers.%d.self_attn.q_proj.weight", "layers.%d.self_attn.k_proj.weight",
    "layers.%d.self_attn.v_proj.weight", "layers.%d.self_attn.o_proj.weight",
    "layers.%d.self_attn.q_norm.weight", "layers.%d.self_attn.k_norm.weight", true,
};

static const qwen35_names gguf_names = {
    "token_embd.weight%.0d", "output_norm.weight%.0d", "output.weight",
    "blk.%d.attn_norm.weight", "blk.%d.post_attention_norm.weight", "blk.%d.ffn_gate.weight",
    "blk.%d.ffn_up.weight", "blk.%d.ffn_down.weight", "blk.%d.attn_qkv.weight",
    "blk.%d.attn_gate.weight", "blk.%d.ssm_beta.weight", "blk.%d.ssm_alpha.weight",
    "blk.%d.ssm_out.weight", "blk.%d.ssm_conv1d.weight", "blk.%d.ssm_a", "blk.%d.ssm_dt.bias",
    "blk.%d.ssm_norm.weight", "blk.%d.attn_q.weight", "blk.%d.attn_k.weight",
    "blk.%d.attn_v.weight", "blk.%d.attn_output.weight", "blk.%d.attn_q_norm.weight",
    "blk.%d.attn_k_norm.weight", false,
};

typedef struct {
    const ts_model *m;
    const qwen35_names *nm;
    char prefix[64];
    int64_t n_params;
    uint64_t bytes;
} loader;

static ts_status mat(loader *L, const char *fmt, int layer, int64_t rows, int64_t cols,
                     const ts_tensor **out) {
    char name[256];
    char tail[160];
    snprintf(tail, sizeof tail, fmt, layer);
    snprintf(name, sizeof name, "%s%s", L->prefix, tail);
    int64_t shape[2] = {rows, cols};
    TS_TRY(ts_model_tensor(L->m, name, 2, shape, out));
    const ts_tensor *t = *out;
    TS_TRY(ts_check_matmul_dtype(L->m, name, t));
    L->n_params += rows * cols;
    L->bytes += t->nbytes;
    return TS_OK;
}

static ts_status vec(loader *L, const char *fmt, int layer, int64_t n, float **cursor,
                     float **out) {
    char name[256], tail[160];
    snprintf(tail, sizeof tail, fmt, layer);
    snprintf(name, sizeof name, "%s%s", L->prefix, tail);
    *out = *cursor;
    *cursor += n;
    L->n_params += n;
    return ts_model_tensor_f32(L->m, name, n, *out);
}

/* a (1 + w) norm: Hugging Face stores w, GGUF the sum */
static ts_status norm(loader *L, const char *fmt, int layer, int64_t n, float **cursor,
                      float **out) {
    TS_TRY(vec(L, fmt, layer, n, cursor, out));
    if (L->nm->hf) add_one(*out, (int)n);
    return TS_OK;
}

/* A decoder block's weights: a full-attention one (full) or a linear-attention one. */
static ts_status load_block(loader *L, const qwen35_hparams *h, qwen35_layer *ly, int i, bool full,
                            float **cur) {
    const qwen35_names *nm = L->nm;
    int D = h->n_embd;
    TS_TRY(norm(L, nm->ln1, i, D, cur, &ly->ln1));
    TS_TRY(norm(L, nm->ln2, i, D, cur, &ly->ln2));
    TS_TRY(mat(L, nm->gate, i, h->n_ff, D, &ly->gate));
    TS_TRY(mat(L, nm->up, i, h->n_ff, D, &ly->up));
    TS_TRY(mat(L, nm->down, i, D, h->n_ff, &ly->down));
    if (full) {
        int qrows = h->n_head * h->head_dim * (h->attn_gate ? 2 : 1);
        TS_TRY(mat(L, nm->wq, i, qrows, D, &ly->wq));
        TS_TRY(mat(L, nm->wk, i, h->n_kv_head * h->head_dim, D, &ly->wk));
        TS_TRY(mat(L, nm->wv, i, h->n_kv_head * h->head_dim, D, &ly->wv));
        TS_TRY(mat(L, nm->wo, i, D, h->n_head * h->head_dim, &ly->wo));
        TS_TRY(norm(L, nm->q_norm, i, h->head_dim, cur, &ly->q_norm));
        TS_TRY(norm(L, nm->k_norm, i, h->head_dim, cur, &ly->k_norm));
        return TS_OK;
    }
    int cd = qwen35_conv_dim(h), vd = h->lin_hv * h->lin_dv;
    TS_TRY(mat(L, nm->in_qkv, i, cd, D, &ly->in_qkv));
    TS_TRY(mat(L, nm->in_z, i, vd, D, &ly->in_z));
    TS_TRY(mat(L, nm->in_b, i, h->lin_hv, D, &ly->in_b));
    TS_TRY(mat(L, nm->in_a, i, h->lin_hv, D, &ly->in_a));
    TS_TRY(mat(L, nm->out_proj, i, D, vd, &ly->out_proj));
    /* conv1d.weight is [C, 1, K] (GGUF: [C, K]): check the shape, then read it flat as [C][K] */
    {
        char name[256];
        char tail[160];
        snprintf(tail, sizeof tail, nm->conv, i);
        snprintf(name, sizeof name, "%s%s", L->prefix, tail);
        int64_t shape3[3] = {cd, 1, h->conv_k}, shape2[2] = {cd, h->conv_k};
        const ts_tensor *t;
        TS_TRY(nm->hf ? ts_model_tensor(L->m, name, 3, shape3, &t)
                      : ts_model_tensor(L->m, name, 2, shape2, &t));
    }
    TS_TRY(vec(L, nm->conv, i, (int64_t)cd * h->conv_k, cur, &ly->conv_w));
    TS_TRY(vec(L, nm->a, i, h->lin_hv, cur, &ly->neg_exp_a));
    if (nm->hf)
        for (int k = 0; k < h->lin_hv; k++) ly->neg_exp_a[k] = -expf(ly->neg_exp_a[k]);
    TS_TRY(vec(L, nm->dt_bias, i, h->lin_hv, cur, &ly->dt_bias));
    TS_TRY(vec(L, nm->gnorm, i, h->lin_dv, cur, &ly->gnorm));
    return TS_OK;
}

static ts_status load_layer(loader *L, qwen35_model *q, int i, float **cur) {
    TS_TRY(load_block(L, &q->hp, &q->layers[i], i, q->hp.is_full[i], cur));
    return L->nm->hf || q->hp.is_full[i] ? TS_OK : qwen35_regroup_v(q, i);
}

/* The MTP block, where the file has one: Hugging Face's `mtp.fc`, `mtp.pre_fc_norm_embedding`,
 * `mtp.pre_fc_norm_hidden`, `mtp.norm` and `mtp.layers.0.*`; llama.cpp's GGUF puts it in
 * block n_layers (`nextn.eh_proj`, `nextn.enorm`, `nextn.hnorm`, `nextn.shared_head_norm` -
 * else the output norm - beside a full-attention block's tensors). A file that declares one
 * and does not hold its projection has none (converters may drop it); one that holds it must
 * hold all of it, in the right shapes. Its weights are not counted as the model's: they are
 * read only while drafting. */
static ts_status load_mtp(loader *L, qwen35_model *q, float **cur) {
    const qwen35_hparams *h = &q->hp;
    qwen35_mtp *mt = &q->mtp;
    const ts_model *m = L->m;
    bool hf = L->nm->hf;
    int D = h->n_embd, at = hf ? 0 : h->n_layers;
    char fc[64];
    snprintf(fc, sizeof fc, hf ? "mtp.fc.weight" : "blk.%d.nextn.eh_proj.weight", at);
    if (h->n_mtp < 1 || !(m->gguf ? ts_gguf_find(m->gguf, fc) : ts_st_find(m->st, fc)))
        return TS_OK;
    loader M = *L;
    snprintf(M.prefix, sizeof M.prefix, "%s", hf ? "mtp." : "");
    TS_TRY(
        mat(&M, hf ? "fc.weight" : "blk.%d.nextn.eh_proj.weight", at, D, 2 * (int64_t)D, &mt->fc));
    TS_TRY(norm(&M, hf ? "pre_fc_norm_embedding.weight" : "blk.%d.nextn.enorm.weight", at, D, cur,
                &mt->enorm));
    TS_TRY(norm(&M, hf ? "pre_fc_norm_hidden.weight" : "blk.%d.nextn.hnorm.weight", at, D, cur,
                &mt->hnorm));
    char hn[64];
    snprintf(hn, sizeof hn, "blk.%d.nextn.shared_head_norm.weight", at);
    if (hf || ts_gguf_find(m->gguf, hn)) {
        TS_TRY(norm(&M, hf ? "norm.weight" : "blk.%d.nextn.shared_head_norm.weight", at, D, cur,
                    &mt->norm));
    } else { /* the model's final norm, as llama.cpp falls back to */
        mt->norm = *cur;
        *cur += D;
        memcpy(mt->norm, q->final_norm, (size_t)D * sizeof(float));
    }
    TS_TRY(load_block(&M, h, &mt->layer, at, true, cur));
    mt->present = true;
    return TS_OK;
}

static void qwen35_unload(ts_model *m) {
    qwen35_model *q = m->impl;
    if (!q) return;
    qwen35_vision_free(q->vision);
    for (int i = 0; i < q->n_owned; i++) {
        free((void *)q->owned[i]->data);
        free(q->owned[i]);
    }
    free(q->host_params);
    free(q);
    m->impl = NULL;
}

/* Binds the weights for hyper-parameters already read and fills m->info; frees everything on
 * error. */
static ts_status finish_load(ts_model *m, qwen35_model *q, loader *L) {
    qwen35_hparams *h = &q->hp;
    const qwen35_names *nm = L->nm;
    ts_status st = TS_OK;
    if (h->head_dim > 512 || h->lin_dk > 512 || h->lin_dv > 512)
        st = ts_error(TS_ERR_UNSUPPORTED, "%s: head sizes above 512 are not supported", m->path);
    if (st == TS_OK) {
        q->host_params = malloc(host_param_count(h) * sizeof(float));
        if (!q->host_params) st = ts_error(TS_ERR_NOMEM, "out of memory");
    }
    float *cur = q->host_params;
    if (st == TS_OK) st = mat(L, nm->embed, 0, h->n_vocab, h->n_embd, &q->embed);
    if (st == TS_OK) st = norm(L, nm->final_norm, 0, h->n_embd, &cur, &q->final_norm);
    for (int i = 0; st == TS_OK && i < h->n_layers; i++) st = load_layer(L, q, i, &cur);
    if (st == TS_OK) {
        int64_t params = L->n_params;
        uint64_t bytes = L->bytes;
        st = load_mtp(L, q, &cur);
        L->n_params = params, L->bytes = bytes;
    }
    if (st == TS_OK) {
        /* the output head is never under the HF model prefix */
        const ts_tensor *lm =
            m->gguf ? ts_gguf_find(m->gguf, nm->head) : ts_st_find(m->st, nm->head);
        if (h->tied || !lm) {
            if (!h->tied)
                st = ts_error(TS_ERR_FORMAT, "%s: missing tensor '%s' "
                              "(tie_word_embeddings is false)", m->path, nm->head);
            q->lm_head = q->embed;
        } else {
            int64_t shape[2] = {h->n_vocab, h->n_embd};
            st = ts_model_tensor(m, nm->head, 2, shape, &q->lm_head);
            if (st == TS_OK) st = ts_check_matmul_dtype(m, nm->head, q->lm_head);
            if (st == TS_OK) {
                L->n_params += (int64_t)h->n_vocab * h->n_embd;
                L->bytes += q->lm_head->nbytes;
            }
        }
    }
    if (st != TS_OK) {
        qwen35_unload(m);
        return st;
    }
    q->n_host_params = (size_t)(cur - q->host_params);
    m->info = (ts_model_info){
        .arch = "qwen35",
        .weight_dtype = ts_dtype_name(q->layers[0].gate->dtype),
        .n_vocab = h->n_vocab,
        .n_embd = h->n_embd,
        .n_layers = h->n_layers,
        .n_ctx_train = h->n_ctx_train,
        .n_params = L->n_params,
        /* per decoded token: every matrix once; the embedding only as the output head (one
         * row is read for the input), or both when untied */
        .weight_bytes = L->bytes - (h->tied ? 0 : q->embed->nbytes) +
                        ts_dtype_row_bytes(q->embed->dtype, h->n_embd),
        .mtp = q->mtp.present,
    };
    return TS_OK;
}

static ts_status qwen35_load_hf(ts_model *m) {
    qwen35_model *q = calloc(1, sizeof *q);
    if (!q) return ts_error(TS_ERR_NOMEM, "out of memory");
    m->impl = q;
    ts_status st = read_hparams(m->cfg, &q->hp);
    if (st != TS_OK) {
        qwen35_unload(m);
        return st;
    }
    loader L = {.m = m, .nm = &hf_names};
    snprintf(L.prefix, sizeof L.prefix, "%s",
             ts_st_find(m->st, "model.language_model.embed_tokens.weight") ? "model.language_model."
                                                                          : "model.");
    TS_TRY(finish_load(m, q, &L));
    st = qwen35_vision_load(m, q->hp.n_embd, &q->vision);
    if (st != TS_OK) qwen35_unload(m);
    return st;
}

static bool qwen35_vision_info(const ts_model *m, ts_vision_info *out) {
    const qwen35_model *q = m->impl;
    if (!q->vision) return false;
    if (out) *out = q->vision->hp.info;
    return true;
}

static ts_status qwen35_load_gguf(ts_model *m) {
    qwen35_model *q = calloc(1, sizeof *q);
    if (!q) return ts_error(TS_ERR_NOMEM, "out of memory");
    m->impl = q;
    ts_status st = qwen35_read_gguf_hparams(m, &q->hp);
    if (st != TS_OK) {
        qwen35_unload(m);
        return st;
    }
    loader L = {.m = m, .nm = &gguf_names};
    return finish_load(m, q, &L);
}

/* The weights LoRA adapters may change: every decoder layer's projections, as PEFT names the
 * modules of Hugging Face's Qwen3.5 (a GGUF's linear layers are back in that order at load).
 * The linear attention's have no GGUF name here: llama.cpp's GGUF orders their value heads
 * otherwise (qwen35_regroup_v), and so would a GGUF adapter's pairs. */
static int qwen35_lora_targets(const ts_model *m, ts_lora_target *out, int max) {
    const qwen35_model *q = m->impl;
    int n = 0;
    for (int il = 0; il < q->hp.n_layers; il++) {
        const qwen35_layer *ly = &q->layers[il];
        const ts_lora_target full[] = {{il, "self_attn.q_proj", "attn_q", ly->wq},
                                       {il, "self_attn.k_proj", "attn_k", ly->wk},
                                       {il, "self_attn.v_proj", "attn_v", ly->wv},
                                       {il, "self_attn.o_proj", "attn_output", ly->wo}};
        const ts_lora_target lin[] = {{il, "linear_attn.in_proj_qkv", NULL, ly->in_qkv},
                                      {il, "linear_attn.in_proj_z", NULL, ly->in_z},
                                      {il, "linear_attn.in_proj_b", NULL, ly->in_b},
                                      {il, "linear_attn.in_proj_a", NULL, ly->in_a},
                                      {il, "linear_attn.out_proj", NULL, ly->out_proj}};
        const ts_lora_target mlp[] = {{il, "mlp.gate_proj", "ffn_gate", ly->gate},
                                      {il, "mlp.up_proj", "ffn_up", ly->up},
                                      {il, "mlp.down_proj", "ffn_down", ly->down}};
        const ts_lora_target *mix = q->hp.is_full[il] ? full : lin;
        int nmix = q->hp.is_full[il] ? 4 : 5;
        for (int k = 0; k < nmix + 3; k++, n++)
            if (out && n < max) out[n] = k < nmix ? mix[k] : mlp[k - nmix];
    }
    return n;
}

const ts_arch ts_arch_qwen35 = {
    .name = "qwen35",
    .matches_hf = qwen35_matches_hf,
    .load_hf = qwen35_load_hf,
    .gguf_arch = "qwen35",
    .load_gguf = qwen35_load_gguf,
    .unload = qwen35_unload,
    .state_bytes = qwen35_state_bytes,
    .seq_state_bytes = qwen35_seq_state_bytes,
    .state_rows = qwen35_state_rows,
    .runtime_create = qwen35_runtime_create,
    .runtime_free = qwen35_runtime_free,
    .forward = qwen35_forward,
    .draft = qwen35_draft,
    .vision = qwen35_vision_info,
    .encode_image = qwen35_encode_image,
    .lora_targets = qwen35_lora_targets,
    .synth = qwen35_synth,
};
