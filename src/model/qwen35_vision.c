/* Qwen3.5's vision tower: loading (`model.visual.*`, `vision_config`, the optional
 * preprocessor_config.json) and the encoder's forward pass, written against the backend ops
 * (specs/models.md C.3-C.6).
 *
 * An image, resized to its plan, is cut into patch x patch squares, enumerated 2x2 block by
 * block (the four patches that the merger joins are consecutive); each patch is a vector of
 * in_ch x temporal x patch x patch values (the still image is its own second frame), so the
 * Conv3d patch embedding is one matmul. Learned positions are resampled bilinearly to the grid,
 * attention is unmasked with two-axis rotary angles (row, column), and the merger turns each
 * block of four rows into one row of the decoder's width. */
#include "model/qwen35_vision.h"

#include "backend/vision_grid.h"
#include "model/layers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VIS_PREFIX "model.visual."

static ts_status vcfg_int(const ts_hfconfig *c, const char *key, int64_t lo, int64_t hi,
                          int64_t dflt, int *out) {
    char k[128];
    snprintf(k, sizeof k, "vision_config.%s", key);
    int64_t v;
    TS_TRY(dflt < 0 ? ts_hfconfig_int(c, k, lo, hi, &v)
                    : ts_hfconfig_int_opt(c, k, lo, hi, dflt, &v));
    *out = (int)v;
    return TS_OK;
}

static ts_status read_vision_hp(const ts_hfconfig *c, int text_hidden, qwen35_vision_hp *h) {
    const char *path = ts_hfconfig_path(c);
    TS_TRY(vcfg_int(c, "depth", 1, 256, -1, &h->depth));
    TS_TRY(vcfg_int(c, "hidden_size", 1, 1 << 14, -1, &h->hidden));
    TS_TRY(vcfg_int(c, "num_heads", 1, 1024, -1, &h->n_heads));
    TS_TRY(vcfg_int(c, "intermediate_size", 1, 1 << 18, -1, &h->n_ff));
    TS_TRY(vcfg_int(c, "patch_size", 1, 1024, 16, &h->patch));
    TS_TRY(vcfg_int(c, "temporal_patch_size", 1, 16, 2, &h->temporal));
    TS_TRY(vcfg_int(c, "spatial_merge_size", 1, 16, 2, &h->merge));
    TS_TRY(vcfg_int(c, "in_channels", 3, 3, 3, &h->in_ch));
    int n_pos;
    TS_TRY(vcfg_int(c, "num_position_embeddings", 1, 1 << 20, 2304, &n_pos));
    TS_TRY(vcfg_int(c, "out_hidden_size", 1, 1 << 16, text_hidden, &h->out_hidden));
    const char *act;
    TS_TRY(ts_hfconfig_str_opt(c, "vision_config.hidden_act", "gelu_pytorch_tanh", &act));
    if (strcmp(act, "gelu_pytorch_tanh") != 0)
        return ts_error(TS_ERR_UNSUPPORTED,
                        "%s: field 'vision_config.hidden_act': '%s' not "
                        "supported (only 'gelu_pytorch_tanh')",
                        path, act);
    double theta = 10000.0;
    if (ts_hfconfig_has(c, "vision_config.rope_parameters.rope_theta"))
        TS_TRY(ts_hfconfig_float(c, "vision_config.rope_parameters.rope_theta", &theta));
    h->rope_theta = (float)theta;
    int side = (int)lround(sqrt((double)n_pos));
    if (side * side != n_pos)
        return ts_error(TS_ERR_FORMAT,
                        "%s: field 'vision_config.num_position_embeddings': %d is "
                        "not a square",
                        path, n_pos);
    h->grid_side = side;
    if (h->hidden % h->n_heads || (h->hidden / h->n_heads) % 4)
        return ts_error(TS_ERR_FORMAT,
                        "%s: vision hidden_size %d over %d heads is not a head "
                        "size divisible by 4",
                        path, h->hidden, h->n_heads);
    h->head_dim = h->hidden / h->n_heads;
    if (h->head_dim > 512)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: vision head size %d above 512", path, h->head_dim);
    if (h->out_hidden != text_hidden)
        return ts_error(TS_ERR_FORMAT,
                        "%s: vision out_hidden_size %d is not the text model's "
                        "hidden_size %d",
                        path, h->out_hidden, text_hidden);
    int64_t id;
    TS_TRY(ts_hfconfig_int_opt(c, "image_token_id", 0, INT32_MAX, 248056, &id));
    h->info.image_token = (int32_t)id;
    TS_TRY(ts_hfconfig_int_opt(c, "vision_start_token_id", 0, INT32_MAX, 248053, &id));
    h->info.vision_start = (int32_t)id;
    TS_TRY(ts_hfconfig_int_opt(c, "vision_end_token_id", 0, INT32_MAX, 248054, &id));
    h->info.vision_end = (int32_t)id;
    /* the processor's defaults (Qwen3.5's preprocessor_config.json; specs/models.md C.3) */
    h->info.patch_size = h->patch;
    h->info.merge_size = h->merge;
    h->info.min_pixels = 65536;
    h->info.max_pixels = 16777216;
    for (int i = 0; i < 3; i++)
        h->mean[i] = h->std[i] = 0.5f;
    h->rescale = 1.0 / 255.0;
    /* videos: the Qwen3-VL video processor's defaults */
    TS_TRY(ts_hfconfig_int_opt(c, "video_token_id", 0, INT32_MAX, 248057, &id));
    h->info.video_token = (int32_t)id;
    h->info.temporal_patch_size = h->temporal;
    h->info.video_min_pixels = 128 * 32 * 32;
    h->info.video_max_pixels = 768 * 32 * 32;
    h->info.video_fps = 2.0;
    h->info.video_min_frames = 4;
    h->info.video_max_frames = 768;
    h->info.video_max_frame_tokens = 0;
    return TS_OK;
}

/* What an image processor's file and a video processor's file both say: the pixel range (as
 * size.shortest_edge / longest_edge, which are pixel counts, or the older min_pixels /
 * max_pixels), mean, std and rescale factor; its patch and merge sizes (and a video
 * processor's temporal_patch_size) must be the tower's. */
typedef struct {
    int64_t min_pixels, max_pixels;
    float mean[3], std[3];
    double rescale;
} vproc;

static ts_status read_vproc(const ts_hfconfig *c, const qwen35_vision_hp *h, bool video, vproc *p) {
    const char *path = ts_hfconfig_path(c);
    int64_t v;
    const char *lo = ts_hfconfig_has(c, "size.shortest_edge") ? "size.shortest_edge" : "min_pixels";
    const char *hi = ts_hfconfig_has(c, "size.longest_edge") ? "size.longest_edge" : "max_pixels";
    TS_TRY(ts_hfconfig_int_opt(c, lo, 1, INT64_C(1) << 40, p->min_pixels, &p->min_pixels));
    TS_TRY(ts_hfconfig_int_opt(c, hi, 1, INT64_C(1) << 40, p->max_pixels, &p->max_pixels));
    const char *keys[3] = {"patch_size", "merge_size", "temporal_patch_size"};
    int want[3] = {h->patch, h->merge, h->temporal};
    for (int k = 0; k < (video ? 3 : 2); k++) {
        TS_TRY(ts_hfconfig_int_opt(c, keys[k], 1, 1024, want[k], &v));
        if (v != want[k])
            return ts_error(TS_ERR_FORMAT, "%s: field '%s': %lld, but the vision tower's is %d",
                            path, keys[k], (long long)v, want[k]);
    }
    const char *arrays[2] = {"image_mean", "image_std"};
    float *dst[2] = {p->mean, p->std};
    for (int k = 0; k < 2; k++) {
        if (!ts_hfconfig_has(c, arrays[k])) continue;
        double a[3];
        int n;
        TS_TRY(ts_hfconfig_float_array(c, arrays[k], a, 3, &n));
        if (n != 3)
            return ts_error(TS_ERR_FORMAT, "%s: field '%s': %d values, expected 3", path, arrays[k],
                            n);
        for (int i = 0; i < 3; i++) {
            if (k == 1 && !(a[i] > 0))
                return ts_error(TS_ERR_FORMAT, "%s: field 'image_std': %g is not positive", path,
                                a[i]);
            dst[k][i] = (float)a[i];
        }
    }
    TS_TRY(ts_hfconfig_float_opt(c, "rescale_factor", p->rescale, &p->rescale));
    if (!(p->rescale > 0 && p->rescale <= 1))
        return ts_error(TS_ERR_FORMAT, "%s: field 'rescale_factor': %g out of range", path,
                        p->rescale);
    if (p->min_pixels > p->max_pixels)
        return ts_error(TS_ERR_FORMAT, "%s: the pixel range [%lld, %lld] is empty", path,
                        (long long)p->min_pixels, (long long)p->max_pixels);
    return TS_OK;
}

/* The directory's file `name`, loaded into *c when it exists (else *c is NULL) */
static ts_status load_optional(const char *dir, const char *name, ts_hfconfig **c) {
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/%s", dir, name);
    *c = NULL;
    FILE *f = fopen(probe, "rb");
    if (!f) return TS_OK;
    fclose(f);
    return ts_hfconfig_load_file(dir, name, c);
}

/* preprocessor_config.json beside config.json, when there is one (the image processor) */
static ts_status read_processor(const char *dir, qwen35_vision_hp *h) {
    ts_hfconfig *c;
    TS_TRY(load_optional(dir, "preprocessor_config.json", &c));
    if (!c) return TS_OK;
    vproc p = {h->info.min_pixels, h->info.max_pixels, {0}, {0}, h->rescale};
    memcpy(p.mean, h->mean, sizeof p.mean);
    memcpy(p.std, h->std, sizeof p.std);
    ts_status st = read_vproc(c, h, false, &p);
    ts_hfconfig_free(c);
    TS_TRY(st);
    h->info.min_pixels = p.min_pixels, h->info.max_pixels = p.max_pixels;
    memcpy(h->mean, p.mean, sizeof p.mean);
    memcpy(h->std, p.std, sizeof p.std);
    h->rescale = p.rescale;
    return TS_OK;
}

/* The model takes no videos, for the reason given; its text and images are unaffected. */
static void refuse_videos(ts_vision_info *vi, const char *path, const char *why) {
    vi->video_token = -1;
    const char *base = strrchr(path, '/');
    snprintf(vi->video_refused, sizeof vi->video_refused, "%s: %s", base ? base + 1 : path, why);
}

/* video_preprocessor_config.json, when there is one (the video processor; without it, the
 * Qwen3-VL video processor's own defaults set in read_vision_hp). Its pixels must be normalised
 * as the image processor's are (the one table the patches are looked up in), and frames sampled
 * by frames a second; a file that asks otherwise is a checkpoint whose videos are refused
 * (video_refused), not one that fails to load. A malformed value is a load error. */
static ts_status read_video_processor(const char *dir, qwen35_vision_hp *h) {
    ts_hfconfig *c;
    TS_TRY(load_optional(dir, "video_preprocessor_config.json", &c));
    if (!c) return TS_OK;
    ts_vision_info *vi = &h->info;
    const char *path = ts_hfconfig_path(c);
    vproc p = {vi->video_min_pixels, vi->video_max_pixels, {0}, {0}, h->rescale};
    memcpy(p.mean, h->mean, sizeof p.mean);
    memcpy(p.std, h->std, sizeof p.std);
    ts_status st = read_vproc(c, h, true, &p);
    int64_t lo = vi->video_min_frames, hi = vi->video_max_frames, cap_tokens = 768;
    bool sample = true, cap = false;
    if (st == TS_OK) st = ts_hfconfig_bool_opt(c, "do_sample_frames", true, &sample);
    const char *why = NULL;
    if (st == TS_OK && (memcmp(p.mean, h->mean, sizeof p.mean) ||
                        memcmp(p.std, h->std, sizeof p.std) || p.rescale != h->rescale))
        why = "its mean, std or rescale factor differ from the image processor's, which "
              "tessera's one pixel table follows";
    else if (st == TS_OK && (!sample || ts_hfconfig_has(c, "num_frames")))
        why = "frames sampled other than by 'fps' (do_sample_frames false, or num_frames) are "
              "not supported";
    if (why) {
        refuse_videos(vi, path, why);
        ts_hfconfig_free(c);
        return TS_OK;
    }
    if (st == TS_OK) st = ts_hfconfig_float_opt(c, "fps", vi->video_fps, &vi->video_fps);
    if (st == TS_OK && !(vi->video_fps > 0 && vi->video_fps <= 1000))
        st = ts_error(TS_ERR_FORMAT, "%s: field 'fps': %g out of range", path, vi->video_fps);
    if (st == TS_OK) st = ts_hfconfig_int_opt(c, "min_frames", 1, TS_VIDEO_MAX_FRAMES, lo, &lo);
    if (st == TS_OK) st = ts_hfconfig_int_opt(c, "max_frames", lo, TS_VIDEO_MAX_FRAMES, hi, &hi);
    if (st == TS_OK) st = ts_hfconfig_bool_opt(c, "cap_pixels_per_frame", false, &cap);
    if (st == TS_OK)
        st = ts_hfconfig_int_opt(c, "max_video_tokens", 1, 1 << 20, cap_tokens, &cap_tokens);
    ts_hfconfig_free(c);
    TS_TRY(st);
    vi->video_min_pixels = p.min_pixels, vi->video_max_pixels = p.max_pixels;
    vi->video_min_frames = (int)lo, vi->video_max_frames = (int)hi;
    vi->video_max_frame_tokens = cap ? (int)cap_tokens : 0;
    return TS_OK;
}

typedef struct {
    const ts_model *m;
    float *cur;
    int64_t n_params;
} vloader;

static ts_status vmat(vloader *L, const char *tail, int64_t rows, int64_t cols,
                      const ts_tensor **out) {
    char name[256];
    snprintf(name, sizeof name, VIS_PREFIX "%s", tail);
    int64_t shape[2] = {rows, cols};
    TS_TRY(ts_model_tensor(L->m, name, 2, shape, out));
    TS_TRY(ts_check_matmul_dtype(L->m, name, *out));
    L->n_params += rows * cols;
    return TS_OK;
}

static ts_status vvec(vloader *L, const char *tail, int64_t n, float **out) {
    char name[256];
    snprintf(name, sizeof name, VIS_PREFIX "%s", tail);
    int64_t shape[1] = {n};
    const ts_tensor *t;
    TS_TRY(ts_model_tensor(L->m, name, 1, shape, &t));
    *out = L->cur;
    L->cur += n;
    L->n_params += n;
    return ts_model_tensor_f32(L->m, name, n, *out);
}

static ts_status load_block(vloader *L, const qwen35_vision_hp *h, int j, qwen35_vblock *b) {
    char t[128];
    int H = h->hidden, F = h->n_ff;
#define BLK(s) (snprintf(t, sizeof t, "blocks.%d.%s", j, s), t)
    TS_TRY(vvec(L, BLK("norm1.weight"), H, &b->n1w));
    TS_TRY(vvec(L, BLK("norm1.bias"), H, &b->n1b));
    TS_TRY(vvec(L, BLK("norm2.weight"), H, &b->n2w));
    TS_TRY(vvec(L, BLK("norm2.bias"), H, &b->n2b));
    TS_TRY(vmat(L, BLK("attn.qkv.weight"), 3 * H, H, &b->qkv));
    TS_TRY(vvec(L, BLK("attn.qkv.bias"), 3 * H, &b->qkv_b));
    TS_TRY(vmat(L, BLK("attn.proj.weight"), H, H, &b->proj));
    TS_TRY(vvec(L, BLK("attn.proj.bias"), H, &b->proj_b));
    TS_TRY(vmat(L, BLK("mlp.linear_fc1.weight"), F, H, &b->fc1));
    TS_TRY(vvec(L, BLK("mlp.linear_fc1.bias"), F, &b->fc1_b));
    TS_TRY(vmat(L, BLK("mlp.linear_fc2.weight"), H, F, &b->fc2));
    TS_TRY(vvec(L, BLK("mlp.linear_fc2.bias"), H, &b->fc2_b));
#undef BLK
    return TS_OK;
}

void qwen35_vision_free(qwen35_vision *v) {
    if (!v) return;
    free(v->blocks);
    free(v->host);
    free(v);
}

static ts_status load_weights(const ts_model *m, qwen35_vision *v) {
    const qwen35_vision_hp *h = &v->hp;
    int H = h->hidden, K = h->in_ch * h->temporal * h->patch * h->patch,
        M = H * h->merge * h->merge;
    int G = h->grid_side * h->grid_side;
    /* patch bias, positions, per block four norm vectors and the qkv, proj, fc1, fc2 biases,
     * the merger's norm and biases */
    v->n_host = (size_t)H + (size_t)G * H + (size_t)h->depth * (9 * (size_t)H + h->n_ff) +
                2 * (size_t)H + (size_t)M + (size_t)h->out_hidden;
    v->host = malloc(v->n_host * sizeof(float));
    v->blocks = calloc((size_t)h->depth, sizeof *v->blocks);
    if (!v->host || !v->blocks) return ts_error(TS_ERR_NOMEM, "out of memory");
    vloader L = {m, v->host, 0};
    /* the Conv3d weight [H, in_ch, temporal, patch, patch] read as the matrix [H, K] */
    const ts_tensor *pw;
    int64_t shape[5] = {H, h->in_ch, h->temporal, h->patch, h->patch};
    TS_TRY(ts_model_tensor(m, VIS_PREFIX "patch_embed.proj.weight", 5, shape, &pw));
    v->patch_w = *pw;
    v->patch_w.n_dims = 2;
    v->patch_w.shape[0] = H;
    v->patch_w.shape[1] = K;
    for (int i = 2; i < TS_MAX_DIMS; i++)
        v->patch_w.shape[i] = 1;
    TS_TRY(ts_check_matmul_dtype(m, VIS_PREFIX "patch_embed.proj.weight", &v->patch_w));
    L.n_params += (int64_t)H * K;
    TS_TRY(vvec(&L, "patch_embed.proj.bias", H, &v->patch_b));
    {
        int64_t ps[2] = {G, H};
        const ts_tensor *t;
        TS_TRY(ts_model_tensor(m, VIS_PREFIX "pos_embed.weight", 2, ps, &t));
        v->pos = L.cur;
        L.cur += (size_t)G * H;
        L.n_params += (int64_t)G * H;
        TS_TRY(ts_model_tensor_f32(m, VIS_PREFIX "pos_embed.weight", (int64_t)G * H, v->pos));
    }
    for (int j = 0; j < h->depth; j++)
        TS_TRY(load_block(&L, h, j, &v->blocks[j]));
    TS_TRY(vvec(&L, "merger.norm.weight", H, &v->mnw));
    TS_TRY(vvec(&L, "merger.norm.bias", H, &v->mnb));
    TS_TRY(vmat(&L, "merger.linear_fc1.weight", M, M, &v->mfc1));
    TS_TRY(vvec(&L, "merger.linear_fc1.bias", M, &v->mfc1_b));
    TS_TRY(vmat(&L, "merger.linear_fc2.weight", h->out_hidden, M, &v->mfc2));
    TS_TRY(vvec(&L, "merger.linear_fc2.bias", h->out_hidden, &v->mfc2_b));
    v->n_params = L.n_params;
    return TS_OK;
}

ts_status qwen35_vision_load(const ts_model *m, int text_hidden, qwen35_vision **out) {
    *out = NULL;
    if (!m->st || !m->cfg || !ts_hfconfig_has(m->cfg, "vision_config") ||
        !ts_st_find(m->st, VIS_PREFIX "patch_embed.proj.weight"))
        return TS_OK;
    qwen35_vision *v = calloc(1, sizeof *v);
    if (!v) return ts_error(TS_ERR_NOMEM, "out of memory");
    ts_status st = read_vision_hp(m->cfg, text_hidden, &v->hp);
    if (st == TS_OK) st = read_processor(m->path, &v->hp);
    if (st == TS_OK) st = read_video_processor(m->path, &v->hp);
    if (st == TS_OK) st = load_weights(m, v);
    if (st != TS_OK) {
        qwen35_vision_free(v);
        return st;
    }
    *out = v;
    return TS_OK;
}

/* ---- the encoder ------------------------------------------------------------------------- */

/* Each channel's normalised value of each byte ([3][256], for the backend's vision_patches):
 * rescaled to [0, 1] (the product in double, rounded to float) and normalised with the
 * processor's mean and std in float - the arithmetic of Hugging Face's PIL-backend processor,
 * bit for bit. */
static void patch_lut(const qwen35_vision_hp *h, float *lut) {
    for (int c = 0; c < 3; c++)
        for (int px = 0; px < 256; px++) {
            float r = (float)(px * h->rescale); /* as the processor */
            lut[c * 256 + px] = (r - h->mean[c]) / h->std[c];
        }
}

/* The rotary table (host): for patch n (backend/vision_grid.h's order) and head dimension pair
 * j < hd/2, the angle is row * inv[j] for j < hd/4 and col * inv[j - hd/4] after, inv[k] =
 * theta^(-2k / (hd/2)). */
static void rope_table(const qwen35_vision_hp *h, const ts_image_plan *p, float *cs) {
    int N = p->grid_h * p->grid_w, half = h->head_dim / 2, q = half / 2;
    float inv[256];
    for (int k = 0; k < q; k++)
        inv[k] = (float)(1.0 / pow((double)h->rope_theta, (double)(2 * k) / half));
    for (int n = 0; n < N; n++) {
        int row, col;
        ts_grid_patch_rc(n, p->grid_w, h->merge, &row, &col);
        float *c = cs + (size_t)n * 2 * half, *s = c + half;
        for (int j = 0; j < half; j++) {
            float ang = (float)(j < q ? row : col) * inv[j < q ? j : j - q];
            c[j] = cosf(ang);
            s[j] = sinf(ang);
        }
    }
}

struct qwen35_venc {
    ts_backend *be;
    float *params, *lut; /* kept from the first image on: the host block's copy, patch_lut */
    int cap;             /* patches the working buffers below hold (0: none) */
    float *patches, *x, *t, *qkv, *o, *ff, *cs, *m1, *y;
    uint8_t *rgb;
};

static const float *VP(const qwen35_vision *v, const qwen35_venc *e, const float *host) {
    return e->params + (host - v->host);
}

/* The working buffers for N patches, in the order venc_fit allocates them: floats each, and
 * the image's bytes (3 a pixel, patch x patch pixels a patch). */
#define VENC_BUFS 9
static void venc_sizes(const qwen35_vision_hp *h, size_t N, size_t n[VENC_BUFS], size_t *rgb) {
    size_t H = (size_t)h->hidden, M = H * h->merge * h->merge, T = N / (h->merge * h->merge);
    size_t K = (size_t)h->in_ch * h->temporal * h->patch * h->patch;
    size_t sz[VENC_BUFS] = {N * K,       N * H,           N * H, N * 3 * H,        N * H,
                            N * h->n_ff, N * h->head_dim, T * M, T * h->out_hidden};
    memcpy(n, sz, sizeof sz);
    *rgb = N * h->patch * h->patch * 3 * h->temporal; /* a video step's frames */
}

static float **venc_bufs(qwen35_venc *e, int i) {
    float **b[VENC_BUFS] = {&e->patches, &e->x,  &e->t,  &e->qkv, &e->o,
                            &e->ff,      &e->cs, &e->m1, &e->y};
    return b[i];
}

static size_t venc_bytes(const qwen35_vision_hp *h, size_t N) {
    size_t n[VENC_BUFS], total;
    venc_sizes(h, N, n, &total);
    for (int i = 0; i < VENC_BUFS; i++)
        total += n[i] * sizeof(float);
    return total;
}

static void venc_release(qwen35_venc *e) {
    for (int i = 0; i < VENC_BUFS; i++) {
        float **b = venc_bufs(e, i);
        if (*b) e->be->ops->free(e->be, *b);
        *b = NULL;
    }
    if (e->rgb) e->be->ops->free(e->be, e->rgb);
    e->rgb = NULL;
    e->cap = 0;
}

void qwen35_venc_free(qwen35_venc *e) {
    if (!e) return;
    venc_release(e);
    if (e->params) e->be->ops->free(e->be, e->params);
    if (e->lut) e->be->ops->free(e->be, e->lut);
    free(e);
}

/* The workspace on be, with the parameters up and buffers for N patches. */
static ts_status venc_fit(const qwen35_vision *v, ts_backend *be, qwen35_venc **ws, int N) {
    const ts_backend_ops *op = be->ops;
    qwen35_venc *e = *ws;
    if (e && e->be != be)
        return ts_error(TS_ERR_INVALID, "the tower's workspace is another backend's");
    if (!e) {
        if (!(e = calloc(1, sizeof *e))) return ts_error(TS_ERR_NOMEM, "out of memory");
        e->be = be;
        *ws = e;
    }
    if (!e->params) {
        float host_lut[3 * 256];
        e->params = op->alloc(be, v->n_host * sizeof(float));
        e->lut = op->alloc(be, sizeof host_lut);
        if (!e->params || !e->lut) {
            if (e->params) op->free(be, e->params);
            if (e->lut) op->free(be, e->lut);
            e->params = e->lut = NULL;
            return ts_error(TS_ERR_NOMEM, "out of memory for the vision tower's parameters");
        }
        patch_lut(&v->hp, host_lut);
        op->upload(be, e->params, v->host, v->n_host * sizeof(float));
        op->upload(be, e->lut, host_lut, sizeof host_lut);
    }
    if (e->cap >= N) return TS_OK;
    venc_release(e);
    size_t n[VENC_BUFS], n_rgb;
    venc_sizes(&v->hp, (size_t)N, n, &n_rgb);
    bool ok = (e->rgb = op->alloc(be, n_rgb)) != NULL;
    for (int i = 0; ok && i < VENC_BUFS; i++)
        ok = (*venc_bufs(e, i) = op->alloc(be, n[i] * sizeof(float))) != NULL;
    if (!ok) {
        venc_release(e);
        return ts_error(TS_ERR_NOMEM, "out of memory for an image of %d patches", N);
    }
    e->cap = N;
    return TS_OK;
}

static void block_forward(const qwen35_vision *v, const qwen35_venc *e, const qwen35_vblock *b,
                          int N) {
    const qwen35_vision_hp *h = &v->hp;
    ts_backend *be = e->be;
    const ts_backend_ops *op = be->ops;
    int H = h->hidden, F = h->n_ff, hd = h->head_dim;
    op->layernorm(be, e->x, H, N, H, VP(v, e, b->n1w), VP(v, e, b->n1b), 1e-6f, e->t, H);
    op->matmul(be, b->qkv, e->t, H, N, e->qkv, 3 * H);
    op->bias_act(be, e->qkv, 3 * H, N, 3 * H, VP(v, e, b->qkv_b), TS_ACT_NONE);
    op->rope_cs(be, e->qkv, 3 * H, N, h->n_heads, hd, hd / 2, e->cs);
    op->rope_cs(be, e->qkv + H, 3 * H, N, h->n_heads, hd, hd / 2, e->cs);
    ts_attn_dims d = {h->n_heads, h->n_heads, hd, 1.0f / sqrtf((float)hd), 0, 0};
    op->attention_full(be, e->qkv, 3 * H, e->qkv + H, e->qkv + 2 * H, 3 * H, N, &d, e->o, H);
    op->matmul(be, b->proj, e->o, H, N, e->t, H);
    op->bias_act(be, e->t, H, N, H, VP(v, e, b->proj_b), TS_ACT_NONE);
    op->add(be, e->x, e->t, (int64_t)N * H);
    op->layernorm(be, e->x, H, N, H, VP(v, e, b->n2w), VP(v, e, b->n2b), 1e-6f, e->t, H);
    op->matmul(be, b->fc1, e->t, H, N, e->ff, F);
    op->bias_act(be, e->ff, F, N, F, VP(v, e, b->fc1_b), TS_ACT_GELU_TANH);
    op->matmul(be, b->fc2, e->ff, F, N, e->t, H);
    op->bias_act(be, e->t, H, N, H, VP(v, e, b->fc2_b), TS_ACT_NONE);
    op->add(be, e->x, e->t, (int64_t)N * H);
}

ts_status qwen35_vision_encode(const qwen35_vision *v, ts_backend *be, qwen35_venc **ws,
                               const ts_image *const *frames, int n_frames,
                               const ts_image_plan *plan, float *out) {
    const qwen35_vision_hp *h = &v->hp;
    const ts_backend_ops *op = be->ops; /* with the vision ops: the engine checks */
    int m = h->merge;
    if (n_frames != 1 && n_frames != h->temporal)
        return ts_error(TS_ERR_INVALID, "%d frames for a patch of %d", n_frames, h->temporal);
    for (int f = 0; f < n_frames; f++)
        if (frames[f]->width != plan->width || frames[f]->height != plan->height)
            return ts_error(TS_ERR_INVALID, "frame %d of %dx%d does not fit its plan (%dx%d)", f,
                            frames[f]->width, frames[f]->height, plan->width, plan->height);
    const ts_image *img = frames[0];
    if (plan->grid_h * h->patch != plan->height || plan->grid_w * h->patch != plan->width ||
        plan->grid_h % m || plan->grid_w % m || plan->grid_h < 1 || plan->grid_w < 1)
        return ts_error(TS_ERR_INVALID, "image %dx%d does not fit its plan (%dx%d, grid %dx%d)",
                        img->width, img->height, plan->width, plan->height, plan->grid_w,
                        plan->grid_h);
    int N = plan->grid_h * plan->grid_w, H = h->hidden, hd = h->head_dim;
    int K = h->in_ch * h->temporal * h->patch * h->patch, M = H * m * m, T = N / (m * m);
    size_t n = (size_t)N, n_rgb = (size_t)img->width * img->height * 3;
    float *host_cs = malloc(n * hd * sizeof(float));
    if (!host_cs) return ts_error(TS_ERR_NOMEM, "out of memory");
    ts_status st = venc_fit(v, be, ws, N);
    if (st != TS_OK) {
        free(host_cs);
        return st;
    }
    qwen35_venc *e = *ws;
    /* the image's bytes go up (a quarter of its patches' floats), and the backend cuts the
     * patches and resamples the learned positions where they are used */
    rope_table(h, plan, host_cs);
    for (int f = 0; f < n_frames; f++)
        op->upload(be, e->rgb + f * n_rgb, frames[f]->rgb, n_rgb);
    op->upload(be, e->cs, host_cs, n * hd * sizeof(float));
    ts_patch_dims pd = {img->width, img->height, h->patch, m, h->temporal, n_frames};
    op->vision_patches(be, e->rgb, &pd, e->lut, e->patches);
    op->vision_positions(be, VP(v, e, v->pos), h->grid_side, H, plan->grid_h, plan->grid_w, m,
                         e->t);
    /* patch embedding, plus the resampled learned positions */
    op->matmul(be, &v->patch_w, e->patches, K, N, e->x, H);
    op->bias_act(be, e->x, H, N, H, VP(v, e, v->patch_b), TS_ACT_NONE);
    op->add(be, e->x, e->t, (int64_t)N * H);
    for (int j = 0; j < h->depth; j++)
        block_forward(v, e, &v->blocks[j], N);
    /* the merger: a norm per patch, then each block's m*m rows as one row of M */
    op->layernorm(be, e->x, H, N, H, VP(v, e, v->mnw), VP(v, e, v->mnb), 1e-6f, e->t, H);
    op->matmul(be, v->mfc1, e->t, M, T, e->m1, M);
    op->bias_act(be, e->m1, M, T, M, VP(v, e, v->mfc1_b), TS_ACT_GELU_ERF);
    op->matmul(be, v->mfc2, e->m1, M, T, e->y, h->out_hidden);
    op->bias_act(be, e->y, h->out_hidden, T, h->out_hidden, VP(v, e, v->mfc2_b), TS_ACT_NONE);
    op->download(be, out, e->y, (size_t)T * h->out_hidden * sizeof(float));
    if (venc_bytes(h, (size_t)e->cap) > QWEN35_VENC_KEEP) venc_release(e);
    free(host_cs);
    return TS_OK;
}
