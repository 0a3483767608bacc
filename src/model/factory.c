/* ts_model_open: detect the format, read the architecture, bind it through the registry. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/half.h"
#include "model/model.h"

ts_status ts_model_open(const char *path, ts_model **out) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) return ts_error(TS_ERR_IO, "%s: no such file or directory", path);
    if (!S_ISDIR(sb.st_mode))
        return ts_error(TS_ERR_UNSUPPORTED,
                        "%s: not a model directory (expected a Hugging Face directory with "
                        "config.json)",
                        path);
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
    ts_st_close(m->st);
    ts_hfconfig_free(m->cfg);
    free(m->path);
    free(m);
}

void ts_model_get_info(const ts_model *m, ts_model_info *info) { *info = m->info; }

ts_status ts_model_tensor(const ts_model *m, const char *name, int n_dims, const int64_t *shape,
                          const ts_tensor **out) {
    const ts_tensor *t = ts_st_find(m->st, name);
    *out = NULL;
    if (!t) return ts_error(TS_ERR_FORMAT, "%s: missing tensor '%s'", m->path, name);
    const char *file = ts_st_file_of(m->st, name);
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
    const ts_tensor *t = ts_st_find(m->st, name);
    if (!t) return ts_error(TS_ERR_FORMAT, "%s: missing tensor '%s'", m->path, name);
    if (ts_tensor_nelems(t) != n)
        return ts_error(TS_ERR_FORMAT, "%s: tensor '%s': expected %lld elements, got %lld",
                        ts_st_file_of(m->st, name), name, (long long)n,
                        (long long)ts_tensor_nelems(t));
    const unsigned char *p = t->data;
    for (int64_t i = 0; i < n; i++) {
        switch (t->dtype) {
        case TS_DTYPE_F32: memcpy(&dst[i], p + 4 * i, 4); break;
        case TS_DTYPE_F16: {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = ts_f16_to_f32(h);
            break;
        }
        case TS_DTYPE_BF16: {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = ts_bf16_to_f32(h);
            break;
        }
        default:
            return ts_error(TS_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s not supported here",
                            ts_st_file_of(m->st, name), name, ts_dtype_name(t->dtype));
        }
    }
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
