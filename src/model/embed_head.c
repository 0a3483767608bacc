/* An embedding model's own pooling and the layers after it, read beside the transformer:
 * a sentence-transformers directory's modules.json (its Pooling module's mode, its Dense
 * modules' weights, a Normalize module) or a GGUF's pooling_type and dense_2 / dense_3 tensors
 * (llama.cpp's converter writes those from the same modules). The dense layers run on the host:
 * one pooled vector an input, a few million multiply-adds. */
#include "backend/cpu/matmul.h"
#include "backend/cpu/ops_seq.h"
#include "backend/cpu/quant.h"
#include "base/mmapfile.h"
#include "model/model.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void ts_embed_head_free(ts_embed_head *h) {
    for (int i = 0; i < h->n_dense; i++) {
        free(h->dense[i].w);
        free(h->dense[i].b);
    }
    memset(h, 0, sizeof *h);
}

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && strcmp(s + n - k, tail) == 0;
}

/* sentence-transformers' Pooling config: exactly one of the modes we run */
static ts_status read_pooling(const char *dir, const char *sub, ts_pooling *out) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, sub);
    ts_hfconfig *c;
    TS_TRY(ts_hfconfig_load_file(path, "config.json", &c));
    static const struct {
        const char *key;
        ts_pooling mode;
    } modes[] = {{"pooling_mode_mean_tokens", TS_POOL_MEAN},
                 {"pooling_mode_lasttoken", TS_POOL_LAST},
                 {"pooling_mode_cls_token", TS_POOL_FIRST},
                 {"pooling_mode_max_tokens", TS_POOL_UNSET},
                 {"pooling_mode_mean_sqrt_len_tokens", TS_POOL_UNSET},
                 {"pooling_mode_weightedmean_tokens", TS_POOL_UNSET}};
    ts_status st = TS_OK;
    int n_on = 0;
    *out = TS_POOL_UNSET;
    for (size_t i = 0; st == TS_OK && i < sizeof modes / sizeof modes[0]; i++) {
        bool on;
        st = ts_hfconfig_bool_opt(c, modes[i].key, false, &on);
        if (st != TS_OK || !on) continue;
        n_on++;
        if (modes[i].mode == TS_POOL_UNSET)
            st = ts_error(TS_ERR_UNSUPPORTED,
                          "%s: '%s' pooling not supported (mean, last token "
                          "and cls are)",
                          ts_hfconfig_path(c), modes[i].key);
        *out = modes[i].mode;
    }
    if (st == TS_OK && n_on != 1)
        st = ts_error(TS_ERR_UNSUPPORTED, "%s: %d pooling modes on; one is supported",
                      ts_hfconfig_path(c), n_on);
    ts_hfconfig_free(c);
    return st;
}

/* A tensor of a Dense module's own safetensors file as fp32 */
static ts_status st_f32(const ts_st *st, const char *file, const char *name, int64_t rows,
                        int64_t cols, float **out) {
    const ts_tensor *t = ts_st_find(st, name);
    if (!t) return ts_error(TS_ERR_FORMAT, "%s: missing tensor '%s'", file, name);
    int64_t n = rows * cols;
    bool shape_ok = cols == 1 ? t->n_dims == 1 && t->shape[0] == rows
                              : t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols;
    if (!shape_ok)
        return ts_error(TS_ERR_FORMAT, "%s: tensor '%s': expected %lld x %lld", file, name,
                        (long long)rows, (long long)cols);
    if (!(*out = malloc((size_t)n * sizeof **out))) return ts_error(TS_ERR_NOMEM, "out of memory");
    if (ts_tensor_to_f32(t, *out, n)) return TS_OK;
    return ts_error(TS_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s not supported", file, name,
                    ts_dtype_name(t->dtype));
}

/* A Dense module: config.json (in_features, out_features, bias, activation_function) and
 * model.safetensors (linear.weight [out][in], linear.bias [out]) */
static ts_status read_dense(const char *dir, const char *sub, int in_expected, ts_dense *d) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, sub);
    ts_hfconfig *c;
    TS_TRY(ts_hfconfig_load_file(path, "config.json", &c));
    int64_t fin, fout;
    bool bias;
    const char *act;
    ts_status st = ts_hfconfig_int(c, "in_features", 1, 1 << 20, &fin);
    if (st == TS_OK) st = ts_hfconfig_int(c, "out_features", 1, 1 << 20, &fout);
    if (st == TS_OK) st = ts_hfconfig_bool_opt(c, "bias", true, &bias);
    if (st == TS_OK)
        st =
            ts_hfconfig_str_opt(c, "activation_function", "torch.nn.modules.activation.Tanh", &act);
    if (st == TS_OK && fin != in_expected)
        st = ts_error(TS_ERR_FORMAT, "%s: in_features %lld, but the vector before it has %d",
                      ts_hfconfig_path(c), (long long)fin, in_expected);
    if (st == TS_OK) {
        if (ends_with(act, ".Identity"))
            d->tanh = false;
        else if (ends_with(act, ".Tanh"))
            d->tanh = true;
        else
            st = ts_error(TS_ERR_UNSUPPORTED,
                          "%s: activation_function '%s' not supported "
                          "(Identity and Tanh are)",
                          ts_hfconfig_path(c), act);
    }
    ts_hfconfig_free(c);
    TS_TRY(st);
    d->in = (int)fin, d->out = (int)fout;
    char file[4200];
    snprintf(file, sizeof file, "%s/model.safetensors", path);
    ts_st *w;
    TS_TRY(ts_st_open(file, &w));
    st = st_f32(w, file, "linear.weight", fout, fin, &d->w);
    if (st == TS_OK && bias) st = st_f32(w, file, "linear.bias", fout, 1, &d->b);
    ts_st_close(w);
    return st;
}

/* modules.json: the Transformer (this directory), then Pooling, Dense and Normalize modules */
ts_status ts_embed_head_load_st(ts_model *m) {
    char path[4096];
    snprintf(path, sizeof path, "%s/modules.json", m->path);
    struct stat sb;
    if (stat(path, &sb) != 0) return TS_OK; /* not a sentence-transformers directory */
    char *text;
    size_t len;
    TS_TRY(ts_read_file(path, 1u << 20, &text, &len));
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!json_is_array(root)) {
        json_decref(root);
        return ts_error(TS_ERR_FORMAT, "%s: not a JSON array of modules", path);
    }
    ts_embed_head *h = &m->head;
    ts_status st = TS_OK;
    int width = m->info.n_embd;
    size_t i;
    json_t *mod;
    json_array_foreach(root, i, mod) {
        const char *type = json_string_value(json_object_get(mod, "type"));
        const char *sub = json_string_value(json_object_get(mod, "path"));
        if (!type || !sub) {
            st = ts_error(TS_ERR_FORMAT, "%s: module %zu: 'type' and 'path' strings expected", path,
                          i);
        } else if (sub[0] == '/' || strstr(sub, "..")) { /* a module is a folder of the model */
            st = ts_error(TS_ERR_FORMAT,
                          "%s: module %zu: path '%s' is not inside the model's "
                          "directory",
                          path, i, sub);
        } else if (ends_with(type, ".Transformer")) {
            continue;
        } else if (ends_with(type, ".Pooling")) {
            st = read_pooling(m->path, sub, &m->info.pooling);
        } else if (ends_with(type, ".Dense")) {
            if (h->n_dense == TS_MAX_DENSE)
                st = ts_error(TS_ERR_UNSUPPORTED, "%s: more than %d Dense modules", path,
                              TS_MAX_DENSE);
            else if ((st = read_dense(m->path, sub, width, &h->dense[h->n_dense])) == TS_OK)
                width = h->dense[h->n_dense++].out;
        } else if (!ends_with(type, ".Normalize")) { /* the server normalizes every vector */
            st = ts_error(TS_ERR_UNSUPPORTED, "%s: module '%s' not supported", path, type);
        }
        if (st != TS_OK) break;
    }
    json_decref(root);
    if (st != TS_OK) {
        ts_embed_head_free(h);
        return st;
    }
    m->info.n_embd_out = width;
    return TS_OK;
}

/* llama.cpp's pooling_type values: 0 none, 1 mean, 2 cls, 3 last, 4 rank */
ts_status ts_embed_head_load_gguf(ts_model *m, const char *arch) {
    char key[160];
    snprintf(key, sizeof key, "%s.pooling_type", arch);
    uint32_t pt;
    TS_TRY(ts_gguf_get_u32_opt(m->gguf, key, 0, &pt));
    static const ts_pooling by_type[] = {TS_POOL_UNSET, TS_POOL_MEAN, TS_POOL_FIRST, TS_POOL_LAST};
    if (pt >= sizeof by_type / sizeof by_type[0])
        return ts_error(TS_ERR_UNSUPPORTED, "%s: %s %u not supported (0-3 are)", m->path, key, pt);
    m->info.pooling = by_type[pt];
    ts_embed_head *h = &m->head;
    int width = m->info.n_embd;
    static const char *const names[] = {"dense_2", "dense_3"};
    for (int i = 0; i < 2; i++) {
        char wn[64], bn[64];
        snprintf(wn, sizeof wn, "%s.weight", names[i]);
        snprintf(bn, sizeof bn, "%s.bias", names[i]);
        if (!ts_gguf_find(m->gguf, wn)) break;
        const ts_tensor *w, *b = NULL;
        ts_status st = ts_model_tensor(m, wn, 2, (int64_t[2]){-1, width}, &w);
        if (st == TS_OK && ts_gguf_find(m->gguf, bn))
            st = ts_model_tensor(m, bn, 1, (int64_t[1]){w ? w->shape[0] : 0}, &b);
        ts_dense *d = &h->dense[h->n_dense];
        d->in = width, d->out = st == TS_OK ? (int)w->shape[0] : 0;
        if (st == TS_OK && !(d->w = malloc((size_t)d->in * d->out * sizeof *d->w)))
            st = ts_error(TS_ERR_NOMEM, "out of memory");
        if (st == TS_OK && b && !(d->b = malloc((size_t)d->out * sizeof *d->b)))
            st = ts_error(TS_ERR_NOMEM, "out of memory");
        if (st == TS_OK) /* any type, a Q8_0 file's too: its rows are whole blocks, in a row */
            st = ts_dequantize_row(w->dtype, w->data, d->w, (int64_t)d->in * d->out);
        if (st == TS_OK && b) st = ts_model_tensor_f32(m, bn, d->out, d->b);
        h->n_dense++;
        if (st != TS_OK) {
            ts_embed_head_free(h);
            return st;
        }
        width = d->out;
    }
    m->info.n_embd_out = width;
    return TS_OK;
}

/* y = act(x W^T + b) for n rows of x: one pass over the weights for all of them, in the CPU
 * backend's register-tiled kernels (the best ISA here; a scalar double loop took 4.9 ms a
 * 768 -> 3072 -> 768 vector, most of a short input's time on a GPU). */
static void dense_apply(const ts_dense *d, const cpu_seq_kernels *K, int n, const float *x,
                        float *y) {
    K->gemm_nt(n, d->out, d->in, x, d->in, d->w, d->in, y, d->out);
    for (int j = 0; j < n; j++) {
        float *r = y + (size_t)j * d->out;
        for (int o = 0; o < d->out; o++) {
            float v = r[o] + (d->b ? d->b[o] : 0.0f);
            r[o] = d->tanh ? tanhf(v) : v;
        }
    }
}

ts_status ts_model_embed_project(const ts_model *m, int n, const float *in, float *out) {
    const ts_embed_head *h = &m->head;
    int w = m->info.n_embd;
    if (h->n_dense == 0) {
        memcpy(out, in, (size_t)n * w * sizeof *out);
        return TS_OK;
    }
    int widest = w;
    for (int i = 0; i < h->n_dense; i++)
        widest = h->dense[i].out > widest ? h->dense[i].out : widest;
    float *a = h->n_dense > 1 ? malloc(2 * (size_t)n * widest * sizeof *a) : NULL;
    if (h->n_dense > 1 && !a) return ts_error(TS_ERR_NOMEM, "out of memory");
    const cpu_seq_kernels *K = cpu_seq_pick(cpu_isa_best());
    const float *cur = in;
    for (int i = 0; i < h->n_dense; i++) { /* the last layer straight into out */
        float *next = i + 1 == h->n_dense ? out : a + (size_t)(i & 1) * n * widest;
        dense_apply(&h->dense[i], K, n, cur, next);
        cur = next;
    }
    free(a);
    return TS_OK;
}

ts_status ts_model_embed_finish(const ts_model *m, int n, const float *pooled, float *out) {
    TS_TRY(ts_model_embed_project(m, n, pooled, out));
    int w = m->info.n_embd_out, bad = -1;
    for (int j = 0; j < n; j++) {
        float *r = out + (size_t)j * w;
        double ss = 0;
        for (int i = 0; i < w; i++)
            ss += (double)r[i] * r[i];
        float inv = isfinite(ss) ? ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f : NAN;
        if (!isfinite(ss) && bad < 0) bad = j;
        for (int i = 0; i < w; i++)
            r[i] = isfinite(ss) ? r[i] * inv : NAN;
    }
    if (bad >= 0)
        return ts_error(TS_ERR_RANGE, "vector %d: the model's hidden state is not a number", bad);
    return TS_OK;
}
