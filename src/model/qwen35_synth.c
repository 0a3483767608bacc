/* Random Qwen3.5 checkpoints with the real shapes of the published sizes, for speed work: the
 * weights' values do not change the speed, and real weights cannot be downloaded everywhere.
 * Values are scaled like an initialised model (so activations stay finite), from a seeded
 * generator, so the same command writes the same file. */
#include "base/half.h"
#include "model/qwen35.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    const char *name;
    int n_vocab, n_embd, n_ff, n_layers;
    int n_head, n_kv_head, head_dim, lin_heads, lin_dim;
} preset;

/* specs/models.md A.1: 0.8B and 2B differ only in width. "tiny" has the same structure at a
 * toy size (a vocabulary room for small test tokenizers), for end-to-end tests of the tools. */
static const preset presets[] = {
    {"0.8b", 248320, 1024, 3584, 24, 8, 2, 256, 16, 128},
    {"2b", 248320, 2048, 6144, 24, 8, 2, 256, 16, 128},
    {"tiny", 4096, 64, 128, 4, 4, 2, 16, 2, 16},
};

/* The vision towers of the "-vl" presets (specs/models.md C.1; the published checkpoints are
 * the composite form with one). The tiny one takes the small test tokenizer's vision ids. */
typedef struct {
    int depth, hidden, heads, n_ff, n_pos;
    int32_t image, start, end, video;
} vision_preset;

static const vision_preset vision_presets[] = {
    {12, 768, 12, 3072, 2304, 248056, 248053, 248054, 248057},
    {24, 1024, 16, 4096, 2304, 248056, 248053, 248054, 248057},
    {2, 32, 2, 64, 16, 1012, 1009, 1010, 1013},
};

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}
static float rng_uniform(uint64_t *s) { /* [-1, 1) */
    return (float)((double)(rng_next(s) >> 40) / (double)(1ULL << 23) - 1.0);
}

typedef struct {
    ts_st_writer *w;
    ts_dtype dtype;
    const vision_preset *vp; /* NULL: the text-only form */
    uint64_t rng;
    unsigned char *buf; /* one chunk of converted values */
    size_t buf_elems;
} synth;

typedef enum { FILL_UNIFORM, FILL_CONST, FILL_LOG_A } fill_kind;

static ts_status emit(synth *s, int64_t n, fill_kind kind, float scale, bool force_f32) {
    ts_dtype dt = force_f32 ? TS_DTYPE_F32 : s->dtype;
    size_t esz = dt == TS_DTYPE_F32 ? 4 : 2;
    for (int64_t done = 0; done < n;) {
        size_t k = (size_t)(n - done) < s->buf_elems ? (size_t)(n - done) : s->buf_elems;
        for (size_t i = 0; i < k; i++) {
            float v = kind == FILL_CONST   ? scale
                      : kind == FILL_LOG_A ? logf(1.0f + 7.5f * (rng_uniform(&s->rng) + 1.0f))
                                           : scale * rng_uniform(&s->rng);
            if (dt == TS_DTYPE_F32) {
                memcpy(s->buf + 4 * i, &v, 4);
            } else {
                uint16_t h = dt == TS_DTYPE_BF16 ? ts_f32_to_bf16(v) : ts_f32_to_f16(v);
                memcpy(s->buf + 2 * i, &h, 2);
            }
        }
        TS_TRY(ts_st_writer_write(s->w, s->buf, k * esz));
        done += (int64_t)k;
    }
    return TS_OK;
}

/* A tensor of the list: declared (data false) or its values written (data true). The macros
 * read the caller's s and data. */
#define T2(nm, r, c, sc)                                                                           \
    do {                                                                                           \
        int64_t shp[2] = {(r), (c)};                                                               \
        if (data)                                                                                  \
            TS_TRY(emit(s, (int64_t)(r) * (c), FILL_UNIFORM, (sc), false));                        \
        else                                                                                       \
            TS_TRY(ts_st_writer_add(s->w, nm, s->dtype, 2, shp));                                  \
    } while (0)
#define T1(nm, len, kind, sc, f32)                                                                 \
    do {                                                                                           \
        int64_t shp[1] = {(len)};                                                                  \
        if (data)                                                                                  \
            TS_TRY(emit(s, (len), (kind), (sc), (f32)));                                           \
        else                                                                                       \
            TS_TRY(ts_st_writer_add(s->w, nm, (f32) ? TS_DTYPE_F32 : s->dtype, 1, shp));           \
    } while (0)

/* A decoder block's tensors under the prefix lp ("model.layers.3.", "mtp.layers.0."): a
 * full-attention block (full) or a linear-attention one. */
static ts_status layer(synth *s, const qwen35_hparams *h, bool data, const char *lp, bool full) {
    char name[192];
    int D = h->n_embd;
    int cd = qwen35_conv_dim(h), vd = h->lin_hv * h->lin_dv, kvw = h->n_kv_head * h->head_dim;
    int qrows = h->n_head * h->head_dim * 2;
    float sD = 1.0f / sqrtf((float)D);
#define NM(fmt) (snprintf(name, sizeof name, "%s" fmt, lp), name)
    T1(NM("input_layernorm.weight"), D, FILL_UNIFORM, 0.1f, false);
    T1(NM("post_attention_layernorm.weight"), D, FILL_UNIFORM, 0.1f, false);
    T2(NM("mlp.gate_proj.weight"), h->n_ff, D, sD);
    T2(NM("mlp.up_proj.weight"), h->n_ff, D, sD);
    T2(NM("mlp.down_proj.weight"), D, h->n_ff, 1.0f / sqrtf((float)h->n_ff));
    if (full) {
        T2(NM("self_attn.q_proj.weight"), qrows, D, sD);
        T2(NM("self_attn.k_proj.weight"), kvw, D, sD);
        T2(NM("self_attn.v_proj.weight"), kvw, D, sD);
        T2(NM("self_attn.o_proj.weight"), D, h->n_head * h->head_dim, sD);
        T1(NM("self_attn.q_norm.weight"), h->head_dim, FILL_UNIFORM, 0.1f, false);
        T1(NM("self_attn.k_norm.weight"), h->head_dim, FILL_UNIFORM, 0.1f, false);
    } else {
        T2(NM("linear_attn.in_proj_qkv.weight"), cd, D, sD);
        T2(NM("linear_attn.in_proj_z.weight"), vd, D, sD);
        T2(NM("linear_attn.in_proj_b.weight"), h->lin_hv, D, sD);
        T2(NM("linear_attn.in_proj_a.weight"), h->lin_hv, D, sD);
        {
            int64_t shp[3] = {cd, 1, h->conv_k};
            if (data)
                TS_TRY(emit(s, (int64_t)cd * h->conv_k, FILL_UNIFORM, 0.5f, false));
            else
                TS_TRY(ts_st_writer_add(s->w, NM("linear_attn.conv1d.weight"), s->dtype, 3, shp));
        }
        /* as in the published checkpoints, A_log and the gated norm are F32 */
        T1(NM("linear_attn.A_log"), h->lin_hv, FILL_LOG_A, 0, true);
        T1(NM("linear_attn.dt_bias"), h->lin_hv, FILL_CONST, 1.0f, false);
        T1(NM("linear_attn.norm.weight"), h->lin_dv, FILL_CONST, 1.0f, true);
        T2(NM("linear_attn.out_proj.weight"), D, vd, 1.0f / sqrtf((float)vd));
    }
#undef NM
    return TS_OK;
}

/* The tensor list, walked twice: once to declare (data == false), once to write. */
static ts_status walk(synth *s, const qwen35_hparams *h, bool data) {
    char name[160];
    int D = h->n_embd;
    const char *pre = s->vp ? "model.language_model." : "model.";
#define NM0(fmt) (snprintf(name, sizeof name, "%s" fmt, pre), name)
    T2(NM0("embed_tokens.weight"), h->n_vocab, D, 0.05f);
    T1(NM0("norm.weight"), D, FILL_UNIFORM, 0.1f, false);
#undef NM0
    for (int i = 0; i < h->n_layers; i++) {
        char lp[96];
        snprintf(lp, sizeof lp, "%slayers.%d.", pre, i);
        TS_TRY(layer(s, h, data, lp, h->is_full[i]));
    }
    if (s->vp) { /* the vision tower (qwen35_vision.c) */
        const vision_preset *v = s->vp;
        int H = v->hidden, M = 4 * H;
        float sH = 1.0f / sqrtf((float)H);
        int64_t pshape[5] = {H, 3, 2, 16, 16};
        if (data)
            TS_TRY(emit(s, (int64_t)H * 1536, FILL_UNIFORM, 1.0f / sqrtf(1536.0f), false));
        else
            TS_TRY(ts_st_writer_add(s->w, "model.visual.patch_embed.proj.weight", s->dtype, 5,
                                    pshape));
        T1("model.visual.patch_embed.proj.bias", H, FILL_UNIFORM, 0.02f, false);
        T2("model.visual.pos_embed.weight", v->n_pos, H, 0.5f);
        for (int j = 0; j < v->depth; j++) {
#define VN(fmt) (snprintf(name, sizeof name, "model.visual.blocks.%d." fmt, j), name)
            T1(VN("norm1.weight"), H, FILL_CONST, 1.0f, false);
            T1(VN("norm1.bias"), H, FILL_UNIFORM, 0.02f, false);
            T1(VN("norm2.weight"), H, FILL_CONST, 1.0f, false);
            T1(VN("norm2.bias"), H, FILL_UNIFORM, 0.02f, false);
            T2(VN("attn.qkv.weight"), 3 * H, H, sH);
            T1(VN("attn.qkv.bias"), 3 * H, FILL_UNIFORM, 0.02f, false);
            T2(VN("attn.proj.weight"), H, H, sH);
            T1(VN("attn.proj.bias"), H, FILL_UNIFORM, 0.02f, false);
            T2(VN("mlp.linear_fc1.weight"), v->n_ff, H, sH);
            T1(VN("mlp.linear_fc1.bias"), v->n_ff, FILL_UNIFORM, 0.02f, false);
            T2(VN("mlp.linear_fc2.weight"), H, v->n_ff, 1.0f / sqrtf((float)v->n_ff));
            T1(VN("mlp.linear_fc2.bias"), H, FILL_UNIFORM, 0.02f, false);
#undef VN
        }
        T1("model.visual.merger.norm.weight", H, FILL_CONST, 1.0f, false);
        T1("model.visual.merger.norm.bias", H, FILL_UNIFORM, 0.02f, false);
        T2("model.visual.merger.linear_fc1.weight", M, M, 1.0f / sqrtf((float)M));
        T1("model.visual.merger.linear_fc1.bias", M, FILL_UNIFORM, 0.02f, false);
        T2("model.visual.merger.linear_fc2.weight", D, M, 1.0f / sqrtf((float)M));
        T1("model.visual.merger.linear_fc2.bias", D, FILL_UNIFORM, 0.02f, false);
    }
    /* the multi-token-prediction block, as the published checkpoints carry it (after all
     * the rest, so that the other tensors' values do not depend on it) */
    T2("mtp.fc.weight", D, 2 * D, 1.0f / sqrtf(2.0f * D));
    T1("mtp.pre_fc_norm_embedding.weight", D, FILL_UNIFORM, 0.1f, false);
    T1("mtp.pre_fc_norm_hidden.weight", D, FILL_UNIFORM, 0.1f, false);
    T1("mtp.norm.weight", D, FILL_UNIFORM, 0.1f, false);
    TS_TRY(layer(s, h, data, "mtp.layers.0.", true));
#undef T1
#undef T2
    return TS_OK;
}

static ts_status write_config(const char *dir, const qwen35_hparams *h, ts_dtype dtype,
                              const vision_preset *vp) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return ts_error(TS_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    /* the composite form: the text model's fields in text_config, the tower's in vision_config */
    if (vp)
        fprintf(f,
                "{\n  \"architectures\": [\"Qwen3_5ForConditionalGeneration\"],\n"
                "  \"model_type\": \"qwen3_5\",\n  \"image_token_id\": %d,\n"
                "  \"vision_start_token_id\": %d,\n  \"vision_end_token_id\": %d,\n"
                "  \"video_token_id\": %d,\n"
                "  \"tie_word_embeddings\": true,\n"
                "  \"vision_config\": {\"model_type\": \"qwen3_5_vision\", \"depth\": %d, "
                "\"hidden_size\": %d, \"num_heads\": %d, \"intermediate_size\": %d, "
                "\"hidden_act\": \"gelu_pytorch_tanh\", \"patch_size\": 16, "
                "\"temporal_patch_size\": 2, \"spatial_merge_size\": 2, \"in_channels\": 3, "
                "\"num_position_embeddings\": %d, \"out_hidden_size\": %d},\n"
                "  \"text_config\": ",
                vp->image, vp->start, vp->end, vp->video, vp->depth, vp->hidden, vp->heads,
                vp->n_ff, vp->n_pos, h->n_embd);
    fprintf(
        f,
        "{\n  \"architectures\": [\"Qwen3_5ForCausalLM\"],\n  \"model_type\": \"qwen3_5_text\",\n"
        "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n"
        "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
        "  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n  \"attn_output_gate\": true,\n"
        "  \"linear_num_key_heads\": %d,\n  \"linear_num_value_heads\": %d,\n"
        "  \"linear_key_head_dim\": %d,\n  \"linear_value_head_dim\": %d,\n"
        "  \"linear_conv_kernel_dim\": %d,\n  \"full_attention_interval\": 4,\n"
        "  \"mtp_num_hidden_layers\": 1,\n"
        "  \"rms_norm_eps\": 1e-06,\n  \"max_position_embeddings\": %d,\n"
        "  \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000, "
        "\"partial_rotary_factor\": 0.25, \"mrope_section\": [11, 11, 10], "
        "\"mrope_interleaved\": true},\n"
        "  \"tie_word_embeddings\": true,\n  \"hidden_act\": \"silu\",\n"
        "  \"eos_token_id\": 248044,\n  \"dtype\": \"%s\",\n"
        "  \"tessera_synthetic\": true\n}\n%s",
        h->n_vocab, h->n_embd, h->n_ff, h->n_layers, h->n_head, h->n_kv_head, h->head_dim,
        h->lin_hk, h->lin_hv, h->lin_dk, h->lin_dv, h->conv_k, h->n_ctx_train,
        dtype == TS_DTYPE_BF16  ? "bfloat16"
        : dtype == TS_DTYPE_F16 ? "float16"
                                : "float32",
        vp ? "}\n" : "");
    if (fclose(f) != 0) return ts_error(TS_ERR_IO, "%s: write failed", path);
    return TS_OK;
}

ts_status qwen35_synth(const char *preset_name, ts_dtype dtype, uint64_t seed, const char *dir) {
    /* "<size>-vl": the composite checkpoint, with the vision tower */
    const preset *p = NULL;
    const vision_preset *vp = NULL;
    size_t nl = strlen(preset_name);
    bool vl = nl > 3 && strcmp(preset_name + nl - 3, "-vl") == 0;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strncmp(presets[i].name, preset_name, vl ? nl - 3 : nl) == 0 &&
            strlen(presets[i].name) == (vl ? nl - 3 : nl))
            p = &presets[i], vp = vl ? &vision_presets[i] : NULL;
    if (!p)
        return ts_error(TS_ERR_INVALID,
                        "unknown preset '%s' (known: 0.8b, 2b, tiny, and each "
                        "with -vl for the vision tower)",
                        preset_name);
    if (dtype != TS_DTYPE_BF16 && dtype != TS_DTYPE_F16 && dtype != TS_DTYPE_F32)
        return ts_error(TS_ERR_INVALID, "synth writes bf16, f16 or f32 weights");
    qwen35_hparams h = {
        .n_vocab = p->n_vocab,
        .n_embd = p->n_embd,
        .n_layers = p->n_layers,
        .n_ff = p->n_ff,
        .n_head = p->n_head,
        .n_kv_head = p->n_kv_head,
        .head_dim = p->head_dim,
        .attn_gate = true,
        .lin_hk = p->lin_heads,
        .lin_hv = p->lin_heads,
        .lin_dk = p->lin_dim,
        .lin_dv = p->lin_dim,
        .conv_k = 4,
        .n_ctx_train = 262144,
    };
    for (int i = 0; i < h.n_layers; i++)
        h.is_full[i] = (i + 1) % 4 == 0;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return ts_error(TS_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
    TS_TRY(write_config(dir, &h, dtype, vp));

    synth s = {
        .dtype = dtype, .vp = vp, .rng = seed * 0x9E3779B97F4A7C15ULL + 1, .buf_elems = 1 << 20};
    s.buf = malloc(s.buf_elems * 4);
    if (!s.buf) return ts_error(TS_ERR_NOMEM, "out of memory");
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ts_status st = ts_st_writer_new(&s.w);
    if (st == TS_OK) st = walk(&s, &h, false);
    if (st == TS_OK) st = ts_st_writer_begin(s.w, path);
    if (st == TS_OK) st = walk(&s, &h, true);
    if (st == TS_OK) st = ts_st_writer_end(s.w);
    ts_st_writer_free(s.w);
    free(s.buf);
    return st;
}
