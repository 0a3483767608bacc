/* ts_model_open: detect the format, read the architecture, bind it through the registry. */
#include "base/half.h"
#include "model/lora.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A GGUF file mixes weight types (Q4_K_M keeps some tensors in Q6_K, small rows in Q5_0):
 * name the mixture by general.file_type (llama.cpp's llama_ftype) when it is a known one. */
static const char *gguf_file_type_name(const ts_gguf *g) {
    static const struct {
        uint32_t id;
        const char *name;
    } names[] = {{0, "F32"},     {1, "F16"},    {2, "Q4_0"},   {7, "Q8_0"},  {8, "Q5_0"},
                 {14, "Q4_K_S"}, {15, "Q4_K_M"}, {18, "Q6_K"}, {32, "BF16"}};
    uint32_t ft;
    if (!ts_gguf_has(g, "general.file_type") ||
        ts_gguf_get_u32(g, "general.file_type", &ft) != TS_OK)
        return NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].id == ft) return names[i].name;
    return NULL;
}

/* A single .gguf file: the architecture comes from general.architecture. */
static ts_status open_gguf(const char *path, ts_model **out) {
    ts_model *m = calloc(1, sizeof *m);
    if (!m) return ts_error(TS_ERR_NOMEM, "out of memory");
    m->path = strdup(path);
    ts_status st = m->path ? TS_OK : ts_error(TS_ERR_NOMEM, "out of memory");
    if (st == TS_OK) st = ts_gguf_open(path, &m->gguf);
    const char *arch = NULL;
    if (st == TS_OK) st = ts_gguf_get_str(m->gguf, "general.architecture", &arch, NULL);
    if (st == TS_OK) {
        m->arch = ts_arch_find_gguf(arch);
        if (!m->arch || !m->arch->load_gguf)
            st = ts_error(TS_ERR_UNSUPPORTED, "%s: unknown architecture: general.architecture '%s'",
                          path, arch);
    }
    if (st == TS_OK) {
        st = m->arch->load_gguf(m);
        if (st == TS_OK) m->info.n_embd_out = m->info.n_embd;
        if (st == TS_OK && m->info.encoder && (st = ts_embed_head_load_gguf(m, arch)) != TS_OK)
            m->arch->unload(m);
    }
    if (st != TS_OK) {
        m->arch = NULL;
        ts_model_close(m);
        return st;
    }
    const char *label = gguf_file_type_name(m->gguf);
    if (label) m->info.weight_dtype = label;
    *out = m;
    return TS_OK;
}

/* config.json's Matryoshka lengths (ts_model_info.matryoshka): each in [1, the embedding's
 * width], at most TS_MAX_MATRYOSHKA of them. */
static ts_status read_matryoshka(ts_model *m) {
    ts_model_info *in = &m->info;
    ts_matryoshka *mt = &in->matryoshka;
    bool any = false;
    TS_TRY(ts_hfconfig_bool_opt(m->cfg, "is_matryoshka", false, &any));
    if (!ts_hfconfig_has(m->cfg, "matryoshka_dimensions")) {
        mt->n = any ? -1 : 0;
        return TS_OK;
    }
    int64_t dims[TS_MAX_MATRYOSHKA];
    int n;
    TS_TRY(ts_hfconfig_int_array(m->cfg, "matryoshka_dimensions", dims, TS_MAX_MATRYOSHKA, &n));
    if (n > TS_MAX_MATRYOSHKA)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: matryoshka_dimensions: more than %d lengths",
                        ts_hfconfig_path(m->cfg), TS_MAX_MATRYOSHKA);
    for (int i = 0; i < n; i++) {
        if (dims[i] < 1 || dims[i] > in->n_embd_out)
            return ts_error(TS_ERR_FORMAT,
                            "%s: matryoshka_dimensions: %lld is not a length of the %d-wide "
                            "embeddings",
                            ts_hfconfig_path(m->cfg), (long long)dims[i], in->n_embd_out);
        mt->len[i] = (int)dims[i];
    }
    mt->n = n;
    return TS_OK;
}

ts_status ts_model_open(const char *path, ts_model **out) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) return ts_error(TS_ERR_IO, "%s: no such file or directory", path);
    if (!S_ISDIR(sb.st_mode)) return open_gguf(path, out);
    ts_model *m = calloc(1, sizeof *m);
    if (!m) return ts_error(TS_ERR_NOMEM, "out of memory");
    m->path = strdup(path);
    ts_status st = m->path ? TS_OK : ts_error(TS_ERR_NOMEM, "out of memory");
    if (st == TS_OK) st = ts_hfconfig_load(path, &m->cfg);
    if (st == TS_OK) {
        const char *mt = ts_hfconfig_model_type(m->cfg);
        m->arch = mt ? ts_arch_find_hf(mt) : NULL;
        if (!m->arch)
            st = ts_error(TS_ERR_UNSUPPORTED, "%s: unknown architecture: model_type '%s'",
                          ts_hfconfig_path(m->cfg), mt ? mt : "(missing)");
    }
    if (st == TS_OK) st = ts_st_open(path, &m->st);
    if (st == TS_OK) st = m->arch->load_hf(m);
    if (st == TS_OK) {
        m->info.n_embd_out = m->info.n_embd;
        st = ts_embed_head_load_st(m);
        if (st == TS_OK) st = read_matryoshka(m);
        if (st != TS_OK) m->arch->unload(m);
    }
    if (st != TS_OK) {
        m->arch = NULL; /* load_hf cleans up after itself */
        ts_model_close(m);
        return st;
    }
    *out = m;
    return TS_OK;
}

void ts_model_close(ts_model *m) {
    if (!m) return;
    if (m->arch && m->arch->unload) m->arch->unload(m);
    ts_lora_set_free(m->lora);
    ts_embed_head_free(&m->head);
    ts_st_close(m->st);
    ts_gguf_close(m->gguf);
    ts_hfconfig_free(m->cfg);
    free(m->path);
    free(m);
}

void ts_model_get_info(const ts_model *m, ts_model_info *info) { *info = m->info; }

const char *ts_model_file_of(const ts_model *m, const char *name) {
    const char *f = m->st ? ts_st_file_of(m->st, name) : NULL;
    return f ? f : m->path;
}

/* The tensor in whichever container the model came in; NULL when absent. For GGUF, a tensor
 * of a type we cannot compute with is an error of its own. */
static ts_status find_tensor(const ts_model *m, const char *name, const ts_tensor **t) {
    if (m->gguf) {
        *t = ts_gguf_find(m->gguf, name);
        if (*t) return TS_OK;
        ts_status st = ts_gguf_tensor(m->gguf, name, t); /* absent, or a type we cannot use? */
        *t = NULL;
        return st == TS_ERR_FORMAT ? TS_OK : st;
    }
    *t = ts_st_find(m->st, name);
    return TS_OK;
}

ts_status ts_model_tensor(const ts_model *m, const char *name, int n_dims, const int64_t *shape,
                          const ts_tensor **out) {
    const ts_tensor *t;
    *out = NULL;
    TS_TRY(find_tensor(m, name, &t));
    if (!t) return ts_error(TS_ERR_FORMAT, "%s: missing tensor '%s'", m->path, name);
    const char *file = ts_model_file_of(m, name);
    if (t->n_dims != n_dims)
        return ts_error(TS_ERR_FORMAT, "%s: tensor '%s': expected %d dimensions, got %d", file,
                        name, n_dims, t->n_dims);
    for (int i = 0; i < n_dims; i++)
        if (shape[i] >= 0 && t->shape[i] != shape[i]) {
            char want[96] = "", got[96] = "";
            for (int k = 0; k < n_dims; k++) {
                size_t lw = strlen(want), lg = strlen(got);
                snprintf(want + lw, sizeof want - lw, "%s%lld", k ? ", " : "",
                         (long long)shape[k]);
                snprintf(got + lg, sizeof got - lg, "%s%lld", k ? ", " : "",
                         (long long)t->shape[k]);
            }
            return ts_error(TS_ERR_FORMAT, "%s: tensor '%s': wrong shape [%s], expected [%s]", file,
                            name, got, want);
        }
    *out = t;
    return TS_OK;
}

ts_status ts_model_tensor_f32(const ts_model *m, const char *name, int64_t n, float *dst) {
    const ts_tensor *t;
    TS_TRY(find_tensor(m, name, &t));
    if (!t) return ts_error(TS_ERR_FORMAT, "%s: missing tensor '%s'", m->path, name);
    if (ts_tensor_nelems(t) != n)
        return ts_error(TS_ERR_FORMAT, "%s: tensor '%s': expected %lld elements, got %lld",
                        ts_model_file_of(m, name), name, (long long)n,
                        (long long)ts_tensor_nelems(t));
    if (!ts_tensor_to_f32(t, dst, n))
        return ts_error(TS_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s not supported here",
                        ts_model_file_of(m, name), name, ts_dtype_name(t->dtype));
    return TS_OK;
}

ts_status ts_synth_write(const char *arch, const char *preset, const char *dtype, uint64_t seed,
                         const char *dir) {
    const ts_arch *a = ts_arch_find_name(arch);
    if (!a || !a->synth)
        return ts_error(TS_ERR_INVALID, "no synthetic checkpoints for architecture '%s'", arch);
    ts_dtype dt;
    if (strcmp(dtype, "bf16") == 0)
        dt = TS_DTYPE_BF16;
    else if (strcmp(dtype, "f16") == 0)
        dt = TS_DTYPE_F16;
    else if (strcmp(dtype, "f32") == 0)
        dt = TS_DTYPE_F32;
    else
        return ts_error(TS_ERR_INVALID, "unknown dtype '%s' (bf16, f16 or f32)", dtype);
    return a->synth(preset, dt, seed, dir);
}

bool ts_model_vision(const ts_model *m, ts_vision_info *out) {
    return m->arch->vision && m->arch->vision(m, out);
}

ts_status ts_model_mtp_enable(ts_model *m) {
    if (!m->info.mtp || !m->arch->draft)
        return ts_error(TS_ERR_UNSUPPORTED, "%s has no multi-token-prediction block (MTP)",
                        m->path);
    if (m->n_engines > 0 && !m->mtp_on)
        return ts_error(TS_ERR_INVALID, "the MTP block is turned on before any engine is made for "
                                        "the model");
    m->mtp_on = true;
    return TS_OK;
}
