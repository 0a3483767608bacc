/* LoRA adapters (lora.h): loading a PEFT directory or a GGUF adapter onto the architecture's
 * targets, and the matmul helpers that add the pairs' products as the model runs. */
#include "model/lora.h"

#include "format/gguf.h"
#include "format/peft.h"
#include "format/safetensors.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- the table of adapted weights ------------------------------------------------------ */

static size_t slot_of(const struct ts_lora_set *s, const ts_tensor *w) {
    uintptr_t h = (uintptr_t)w;
    h ^= h >> 17, h *= (uintptr_t)0x9E3779B97F4A7C15ull, h ^= h >> 29;
    return (size_t)h & (size_t)(s->cap - 1);
}

const ts_lora_weight *ts_lora_find(const struct ts_lora_set *s, const ts_tensor *w) {
    if (!s || !s->tab) return NULL;
    for (size_t i = slot_of(s, w);; i = (i + 1) & (size_t)(s->cap - 1)) {
        if (!s->tab[i].w) return NULL;
        if (s->tab[i].w == w) return &s->tab[i];
    }
}

static ts_lora_weight *table_add(struct ts_lora_set *s, const ts_tensor *w) {
    size_t i = slot_of(s, w);
    while (s->tab[i].w && s->tab[i].w != w)
        i = (i + 1) & (size_t)(s->cap - 1);
    s->tab[i].w = w;
    return &s->tab[i];
}

static void pair_free(ts_lora_pair *p) {
    free((void *)p->A.data);
    free((void *)p->B.data);
}

void ts_lora_set_free(struct ts_lora_set *s) {
    if (!s) return;
    for (int i = 0; s->tab && i < s->cap; i++) {
        for (int k = 0; k < s->tab[i].n; k++)
            pair_free(&s->tab[i].pairs[k]);
        free(s->tab[i].pairs);
    }
    free(s->tab);
    for (int a = 0; a < s->n; a++)
        free(s->ad[a].path);
    free(s);
}

/* The targets of the model's architecture, into the set's table (once). */
static ts_status set_targets(const ts_model *m, struct ts_lora_set *s, ts_lora_target **out,
                             int *n_out) {
    int n = m->arch->lora_targets(m, NULL, 0);
    ts_lora_target *t = calloc(n ? (size_t)n : 1, sizeof *t);
    if (!t) return ts_error(TS_ERR_NOMEM, "out of memory");
    m->arch->lora_targets(m, t, n);
    if (!s->tab) {
        s->cap = 16;
        while (s->cap < 2 * n)
            s->cap *= 2;
        s->tab = calloc((size_t)s->cap, sizeof *s->tab);
        if (!s->tab) {
            free(t);
            return ts_error(TS_ERR_NOMEM, "out of memory");
        }
    }
    *out = t, *n_out = n;
    return TS_OK;
}

/* ---- PEFT names ------------------------------------------------------------------------ */

/* Splits a module name (without "base_model.model.") into its decoder layer and the module under
 * it: "model.layers.3.self_attn.q_proj" -> 3, "self_attn.q_proj". The layers must be the
 * language model's, under one of the prefixes its Hugging Face classes use (a vision tower's
 * "...encoder.layers.0.self_attn.q_proj" is not one). */
static bool split_layer(const char *module, int *layer, const char **rest) {
    static const char *const prefixes[] = {"model.layers.", "model.language_model.layers.",
                                           "language_model.model.layers.", "language_model.layers.",
                                           "layers."};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        size_t pl = strlen(prefixes[i]);
        if (strncmp(module, prefixes[i], pl) != 0) continue;
        const char *p = module + pl;
        if (*p < '0' || *p > '9') return false;
        long v = 0;
        while (*p >= '0' && *p <= '9' && v < 1000000)
            v = v * 10 + (*p++ - '0');
        if (*p != '.' || !p[1]) return false;
        *layer = (int)v, *rest = p + 1;
        return true;
    }
    return false;
}

/* An fp32 copy of a float tensor's rows [rows, cols] into a [rows_to, cols_to] block (zeros
 * around), times scale. */
static ts_status padded_copy(const ts_tensor *src, int64_t rows, int64_t cols, int64_t rows_to,
                             int64_t cols_to, float scale, ts_tensor *out) {
    float *tmp = malloc((size_t)(rows * cols) * sizeof *tmp);
    float *dst = calloc((size_t)(rows_to * cols_to), sizeof *dst);
    if (!tmp || !dst || !ts_tensor_to_f32(src, tmp, rows * cols)) {
        free(tmp), free(dst);
        return ts_error(tmp && dst ? TS_ERR_UNSUPPORTED : TS_ERR_NOMEM,
                        tmp && dst ? "a LoRA tensor must be F32, F16 or BF16, not %s"
                                   : "out of memory",
                        ts_dtype_name(src->dtype));
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            dst[r * cols_to + c] = tmp[r * cols + c] * scale;
    free(tmp);
    *out = (ts_tensor){.dtype = TS_DTYPE_F32,
                       .n_dims = 2,
                       .shape = {rows_to, cols_to, 1, 1, 1, 1},
                       .data = dst,
                       .nbytes = (uint64_t)(rows_to * cols_to) * sizeof *dst};
    return TS_OK;
}

#define SUFFIX_A ".lora_A.weight"
#define SUFFIX_B ".lora_B.weight"

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* A pair for target tg from the file's A [r, in] and B [out, r] (name: A's, for messages): the
 * shapes checked, fp32 copies with the rank padded, and scale_of(ctx, module, r) folded into B
 * (module: the adapted module's name as the file gives it). */
typedef double (*pair_scale_fn)(const void *ctx, const char *module, int r);

static ts_status make_pair(const char *file, const char *name, const char *module,
                           const ts_tensor *A, const ts_tensor *B, const ts_lora_target *tg, int id,
                           pair_scale_fn scale_of, const void *ctx, ts_lora_pair *out) {
    int64_t out_dim = ts_tensor_rows(tg->w), in_dim = ts_tensor_cols(tg->w);
    int64_t r = A->n_dims == 2 ? A->shape[0] : -1;
    if (A->n_dims != 2 || B->n_dims != 2 || A->shape[1] != in_dim || B->shape[0] != out_dim ||
        B->shape[1] != r || r < 1 || r > 65536)
        return ts_error(TS_ERR_FORMAT,
                        "%s: '%s' is [%lld, %lld] and its B [%lld, %lld]: the weight it "
                        "adapts is [%lld, %lld], so they must be [r, %lld] and [%lld, r]",
                        file, name, (long long)A->shape[0],
                        (long long)(A->n_dims > 1 ? A->shape[1] : 0), (long long)B->shape[0],
                        (long long)(B->n_dims > 1 ? B->shape[1] : 0), (long long)out_dim,
                        (long long)in_dim, (long long)in_dim, (long long)out_dim);
    int64_t rp = (r + TS_LORA_RANK_ALIGN - 1) / TS_LORA_RANK_ALIGN * TS_LORA_RANK_ALIGN;
    float scale = (float)scale_of(ctx, module, (int)r);
    *out = (ts_lora_pair){.adapter = id};
    TS_TRY(padded_copy(A, r, in_dim, rp, in_dim, 1.0f, &out->A));
    ts_status st = padded_copy(B, out_dim, r, out_dim, rp, scale, &out->B);
    if (st != TS_OK) pair_free(out);
    return st;
}

static double peft_scale(const void *cfg, const char *module, int r) {
    return ts_peft_scale(cfg, module, r);
}

/* One pair of a PEFT adapter file: A's tensor name given. */
static ts_status load_pair(const ts_st *st, const ts_peft_config *cfg, const char *file,
                           const char *name_a, const ts_lora_target *t, int nt, int id,
                           ts_lora_pair *out, const ts_tensor **target) {
    static const char root[] = "base_model.model.";
    size_t len = strlen(name_a) - strlen(SUFFIX_A);
    char module[512], name_b[600];
    if (strncmp(name_a, root, sizeof root - 1) != 0 || len - (sizeof root - 1) >= sizeof module)
        return ts_error(TS_ERR_FORMAT, "%s: tensor '%s': not a PEFT name (base_model.model.*)",
                        file, name_a);
    memcpy(module, name_a + sizeof root - 1, len - (sizeof root - 1));
    module[len - (sizeof root - 1)] = 0;
    snprintf(name_b, sizeof name_b, "%.*s%s", (int)len, name_a, SUFFIX_B);
    int layer;
    const char *rest;
    const ts_lora_target *tg = NULL;
    if (split_layer(module, &layer, &rest))
        for (int i = 0; i < nt && !tg; i++)
            if (t[i].layer == layer && strcmp(t[i].module, rest) == 0) tg = &t[i];
    if (!tg)
        return ts_error(TS_ERR_UNSUPPORTED,
                        "%s: tensor '%s' adapts '%s', which is not a linear weight of this "
                        "model's decoder layers that LoRA can change here",
                        file, name_a, module);
    const ts_tensor *A = ts_st_find(st, name_a), *B = ts_st_find(st, name_b);
    if (!B) return ts_error(TS_ERR_FORMAT, "%s: '%s' has no '%s'", file, name_a, name_b);
    /* alpha_pattern's keys match the module's whole name, as PEFT's do */
    TS_TRY(make_pair(file, name_a, module, A, B, tg, id, peft_scale, cfg, out));
    *target = tg->w;
    return TS_OK;
}

typedef struct {
    const ts_tensor *w;
    ts_lora_pair p;
} pending_pair;

/* The pairs an adapter's reader made: freed once by ts_lora_load when anything fails. */
static void pending_free(pending_pair *pend, int np) {
    for (int i = 0; i < np; i++)
        pair_free(&pend[i].p);
    free(pend);
}

/* Every pair of a PEFT directory's adapter_model.safetensors, into pend (on error, those made
 * so far, for the caller to free). */
static ts_status load_peft(const char *dir, const ts_lora_target *t, int nt, int id,
                           pending_pair **pend_out, int *n_out) {
    ts_peft_config cfg;
    TS_TRY(ts_peft_config_load(dir, &cfg));
    char file[4096];
    snprintf(file, sizeof file, "%s%sadapter_model.safetensors", dir,
             dir[0] && dir[strlen(dir) - 1] == '/' ? "" : "/");
    ts_st *st = NULL;
    ts_status rc = ts_st_open(file, &st);
    size_t n = st ? ts_st_count(st) : 0;
    pending_pair *pend = calloc(n ? n : 1, sizeof *pend);
    if (rc == TS_OK && !pend) rc = ts_error(TS_ERR_NOMEM, "out of memory");
    int np = 0;
    for (size_t i = 0; rc == TS_OK && i < n; i++) {
        const char *name = ts_st_name(st, i);
        if (ends_with(name, SUFFIX_B)) { /* with its A, which must be there */
            char a[600];
            snprintf(a, sizeof a, "%.*s%s", (int)(strlen(name) - strlen(SUFFIX_B)), name, SUFFIX_A);
            if (!ts_st_find(st, a))
                rc = ts_error(TS_ERR_FORMAT, "%s: '%s' has no '%s'", file, name, a);
            continue;
        }
        if (!ends_with(name, SUFFIX_A)) {
            rc = ts_error(TS_ERR_UNSUPPORTED,
                          "%s: tensor '%s': only LoRA pairs (lora_A / lora_B of linear "
                          "modules) are supported; an adapter of embeddings or a module saved "
                          "whole is not",
                          file, name);
            break;
        }
        rc = load_pair(st, &cfg, file, name, t, nt, id, &pend[np].p, &pend[np].w);
        if (rc == TS_OK) np++;
    }
    ts_st_close(st);
    ts_peft_config_free(&cfg);
    *pend_out = pend, *n_out = np;
    return rc;
}

/* ---- llama.cpp's GGUF adapters ----------------------------------------------------------- */

static double gguf_scale(const void *alpha, const char *module, int r) {
    (void)module;
    float a = *(const float *)alpha; /* llama.cpp's rule: alpha / r, or 1 without an alpha */
    return a != 0.0f ? a / r : 1.0;
}

/* Every pair of a GGUF LoRA file (convert_lora_to_gguf.py's: general.type "adapter",
 * adapter.type "lora", adapter.lora.alpha, tensors blk.N.NAME.weight.lora_a [r, in] and
 * .lora_b [out, r]), into pend (on error, those made so far). */
static ts_status load_gguf(const ts_model *m, const char *path, const ts_lora_target *t, int nt,
                           int id, pending_pair **pend_out, int *n_out) {
    ts_gguf *g = NULL;
    TS_TRY(ts_gguf_open(path, &g));
    const char *type = NULL, *atype = NULL, *arch = NULL;
    float alpha = 0.0f;
    ts_status rc = ts_gguf_get_str_opt(g, "general.type", "", &type);
    if (rc == TS_OK) rc = ts_gguf_get_str_opt(g, "adapter.type", "", &atype);
    if (rc == TS_OK) rc = ts_gguf_get_str_opt(g, "general.architecture", "", &arch);
    if (rc == TS_OK) rc = ts_gguf_get_f32_opt(g, "adapter.lora.alpha", 0.0f, &alpha);
    if (rc == TS_OK && (strcmp(type, "adapter") != 0 || strcmp(atype, "lora") != 0))
        rc = ts_error(TS_ERR_FORMAT,
                      "%s: not a LoRA adapter (general.type '%s', adapter.type '%s'; a GGUF "
                      "adapter has \"adapter\" and \"lora\")",
                      path, type, atype);
    if (rc == TS_OK && (!m->arch->gguf_arch || strcmp(arch, m->arch->gguf_arch) != 0))
        rc = ts_error(TS_ERR_FORMAT, "%s: an adapter of a '%s' model, not of this '%s' one", path,
                      arch, m->arch->gguf_arch ? m->arch->gguf_arch : m->arch->name);
    size_t n = rc == TS_OK ? ts_gguf_n_tensors(g) : 0;
    pending_pair *pend = calloc(n ? n : 1, sizeof *pend);
    if (rc == TS_OK && !pend) rc = ts_error(TS_ERR_NOMEM, "out of memory");
    int np = 0;
    for (size_t i = 0; rc == TS_OK && i < n; i++) {
        const char *name = ts_gguf_tensor_name(g, i);
        if (ends_with(name, ".weight.lora_b")) continue; /* with its lora_a */
        int layer = -1, at = 0;
        char kind[64] = "";
        const ts_lora_target *tg = NULL;
        if (ends_with(name, ".weight.lora_a") &&
            sscanf(name, "blk.%d.%63[^.].weight.lora_a%n", &layer, kind, &at) == 2 && name[at] == 0)
            for (int k = 0; k < nt && !tg; k++)
                if (t[k].layer == layer && t[k].gguf && strcmp(t[k].gguf, kind) == 0) tg = &t[k];
        if (!tg) {
            bool some = false; /* weights without a GGUF name: PEFT directories only */
            for (int k = 0; k < nt && !some; k++)
                some = t[k].gguf == NULL;
            rc = ts_error(TS_ERR_UNSUPPORTED,
                          "%s: tensor '%s': not a pair this model's decoder layers can take "
                          "from a GGUF adapter (blk.N.NAME.weight.lora_a / lora_b of a linear "
                          "weight%s)",
                          path, name,
                          some ? "; some of this model's weights take pairs from a PEFT "
                                 "directory only"
                               : "");
            break;
        }
        char name_b[128];
        snprintf(name_b, sizeof name_b, "blk.%d.%s.weight.lora_b", layer, kind);
        const ts_tensor *A = ts_gguf_find(g, name), *B = ts_gguf_find(g, name_b);
        if (!B) {
            rc = ts_error(TS_ERR_FORMAT, "%s: '%s' has no '%s'", path, name, name_b);
            break;
        }
        rc = make_pair(path, name, tg->module, A, B, tg, id, gguf_scale, &alpha, &pend[np].p);
        if (rc == TS_OK) pend[np++].w = tg->w;
    }
    ts_gguf_close(g);
    *pend_out = pend, *n_out = np;
    return rc;
}

ts_status ts_lora_load(ts_model *m, const char *path, int *id) {
    if (m->n_engines > 0)
        return ts_error(TS_ERR_INVALID, "%s: LoRA adapters are loaded before an engine is made",
                        path);
    if (!m->arch->lora_targets)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: the %s architecture takes no LoRA adapters", path,
                        m->arch->name);
    struct stat sb;
    if (stat(path, &sb) != 0) return ts_error(TS_ERR_IO, "%s: no such file or directory", path);
    if (!S_ISDIR(sb.st_mode)) { /* a GGUF file, by its magic */
        char magic[4] = {0};
        FILE *f = fopen(path, "rb");
        size_t got = f ? fread(magic, 1, 4, f) : 0;
        if (f) fclose(f);
        if (got != 4 || memcmp(magic, "GGUF", 4) != 0)
            return ts_error(TS_ERR_FORMAT,
                            "%s: neither a PEFT directory (adapter_config.json and "
                            "adapter_model.safetensors) nor a GGUF LoRA file",
                            path);
    }
    struct ts_lora_set *s = m->lora;
    if (!s && !(s = m->lora = calloc(1, sizeof *s))) return ts_error(TS_ERR_NOMEM, "out of memory");
    if (s->n == TS_MAX_LORA)
        return ts_error(TS_ERR_RANGE, "%s: at most %d LoRA adapters", path, TS_MAX_LORA);
    ts_lora_target *t = NULL;
    int nt = 0;
    TS_TRY(set_targets(m, s, &t, &nt));
    int a = s->n;
    pending_pair *pend = NULL;
    int np = 0;
    ts_status rc = S_ISDIR(sb.st_mode) ? load_peft(path, t, nt, a, &pend, &np)
                                       : load_gguf(m, path, t, nt, a, &pend, &np);
    free(t);
    for (int i = 0; rc == TS_OK && i < np; i++) /* one pair a weight */
        for (int k = 0; rc == TS_OK && k < i; k++)
            if (pend[k].w == pend[i].w)
                rc = ts_error(TS_ERR_FORMAT, "%s: two pairs adapt the same weight", path);
    if (rc == TS_OK && np == 0)
        rc = ts_error(TS_ERR_FORMAT, "%s: no LoRA pairs in the adapter", path);
    char *copy = rc == TS_OK ? strdup(path) : NULL;
    if (rc == TS_OK && !copy) rc = ts_error(TS_ERR_NOMEM, "out of memory");
    /* each weight's list grows by one; the room first, so that nothing is half added */
    for (int i = 0; rc == TS_OK && i < np; i++) {
        ts_lora_weight *e = table_add(s, pend[i].w);
        ts_lora_pair *grown = realloc(e->pairs, (size_t)(e->n + 1) * sizeof *grown);
        if (!grown) {
            rc = ts_error(TS_ERR_NOMEM, "out of memory");
            break;
        }
        e->pairs = grown;
    }
    if (rc != TS_OK) {
        pending_free(pend, np);
        free(copy);
        return rc;
    }
    int rank = 0;
    for (int i = 0; i < np; i++) {
        ts_lora_weight *e = table_add(s, pend[i].w);
        e->pairs[e->n++] = pend[i].p;
        int r = (int)pend[i].p.A.shape[0];
        if (r > rank) rank = r;
        if (r > s->max_rank) s->max_rank = r;
        if (ts_tensor_rows(pend[i].w) > s->max_rows) s->max_rows = ts_tensor_rows(pend[i].w);
    }
    free(pend);
    s->ad[a] = (ts_lora_adapter){.path = copy, .rank = rank, .n_weights = np};
    s->n++;
    *id = a;
    return TS_OK;
}

/* ---- running ---------------------------------------------------------------------------- */

ts_status ts_lora_rt_init(ts_lora_rt *lr, const ts_model *m, ts_backend *be, int n_batch) {
    memset(lr, 0, sizeof *lr);
    lr->be = be;
    if (!m->lora || m->lora->n == 0) return TS_OK;
    const struct ts_lora_set *s = m->lora;
    lr->n_batch = n_batch;
    lr->host = calloc((size_t)TS_MAX_LORA * n_batch, sizeof *lr->host);
    lr->scale = be->ops->alloc(be, (size_t)TS_MAX_LORA * n_batch * sizeof(float));
    lr->t = be->ops->alloc(be, (size_t)n_batch * s->max_rank * sizeof(float));
    lr->u = be->ops->alloc(be, (size_t)n_batch * s->max_rows * sizeof(float));
    if (!lr->host || !lr->scale || !lr->t || !lr->u) {
        ts_lora_rt_free(lr);
        return ts_error(TS_ERR_NOMEM, "out of memory for the LoRA adapters' buffers");
    }
    lr->set = s;
    return TS_OK;
}

void ts_lora_rt_free(ts_lora_rt *lr) {
    if (!lr->be) return;
    ts_backend *be = lr->be;
    if (lr->scale) be->ops->free(be, lr->scale);
    if (lr->t) be->ops->free(be, lr->t);
    if (lr->u) be->ops->free(be, lr->u);
    free(lr->host);
    memset(lr, 0, sizeof *lr);
}

void ts_lora_rt_begin(ts_lora_rt *lr, const ts_fwd_batch *b) {
    lr->any = false;
    if (!lr->set) return;
    int n = b->n_tokens;
    for (int a = 0; a < lr->set->n; a++) {
        float *h = lr->host + (size_t)a * lr->n_batch;
        bool on = false;
        for (int i = 0; i < n; i++) {
            h[i] = b->lora ? b->lora[(size_t)b->slot[i] * TS_MAX_LORA + a] : 0.0f;
            on = on || h[i] != 0.0f;
        }
        lr->on[a] = on;
        lr->any = lr->any || on;
        if (on)
            lr->be->ops->upload(lr->be, lr->scale + (size_t)a * lr->n_batch, h,
                                (size_t)n * sizeof *h);
    }
}

/* W's entry when an adapter of this batch has a pair for it, else NULL. */
static const ts_lora_weight *touched(const ts_lora_rt *lr, const ts_tensor *W) {
    if (!lr->any) return NULL;
    const ts_lora_weight *e = ts_lora_find(lr->set, W);
    for (int k = 0; e && k < e->n; k++)
        if (lr->on[e->pairs[k].adapter]) return e;
    return NULL;
}

/* y += s_token * B (A x) for each pair of e whose adapter the batch takes. */
static void add_pairs(ts_lora_rt *lr, const ts_lora_weight *e, const float *x, int64_t ldx, int n,
                      float *y, int64_t ldy) {
    ts_backend *be = lr->be;
    assert(ldy <= lr->set->max_rows);
    for (int k = 0; k < e->n; k++) {
        const ts_lora_pair *p = &e->pairs[k];
        if (!lr->on[p->adapter]) continue;
        int64_t r = p->A.shape[0];
        const float *s = lr->scale + (size_t)p->adapter * lr->n_batch;
        if (be->ops->lora_add && be->ops->lora_add(be, &p->A, &p->B, x, ldx, n, s, y, ldy, lr->t))
            continue; /* one op where the backend has it */
        be->ops->matmul(be, &p->A, x, ldx, n, lr->t, r);
        be->ops->scale_rows(be, lr->t, r, n, (int)r, s);
        ts_matmul_add(be, &p->B, lr->t, r, n, y, ldy, lr->u);
    }
}

/* The input rows the pairs read: x normed first where a norm comes with it. */
static const float *normed(ts_lora_rt *lr, const float *x, int64_t ldx, int n,
                           const ts_prenorm *pre, int64_t dim) {
    if (!pre) return x;
    lr->be->ops->rmsnorm(lr->be, x, ldx, n, (int)dim, pre->w, pre->eps, pre->scratch, ldx);
    return pre->scratch;
}

void ts_lora_matmul_n(ts_lora_rt *lr, const ts_tensor *const *W, int nw, const float *x,
                      int64_t ldx, int n, const ts_prenorm *pre, float *const *y,
                      const int64_t *ldy) {
    bool any = false;
    for (int j = 0; j < nw && !any; j++)
        any = touched(lr, W[j]) != NULL;
    if (!any) {
        ts_matmul_n(lr->be, W, nw, x, ldx, n, pre, y, ldy);
        return;
    }
    x = normed(lr, x, ldx, n, pre, ts_tensor_cols(W[0]));
    ts_matmul_n(lr->be, W, nw, x, ldx, n, NULL, y, ldy);
    for (int j = 0; j < nw; j++) {
        const ts_lora_weight *e = touched(lr, W[j]);
        if (e) add_pairs(lr, e, x, ldx, n, y[j], ldy[j]);
    }
}

void ts_lora_matmul_add(ts_lora_rt *lr, const ts_tensor *W, const float *x, int64_t ldx, int n,
                        float *y, int64_t ldy, float *tmp) {
    ts_matmul_add(lr->be, W, x, ldx, n, y, ldy, tmp);
    const ts_lora_weight *e = touched(lr, W);
    if (e) add_pairs(lr, e, x, ldx, n, y, ldy);
}

void ts_lora_matmul(ts_lora_rt *lr, const ts_tensor *W, const float *x, int64_t ldx, int n,
                    float *y, int64_t ldy) {
    lr->be->ops->matmul(lr->be, W, x, ldx, n, y, ldy);
    const ts_lora_weight *e = touched(lr, W);
    if (e) add_pairs(lr, e, x, ldx, n, y, ldy);
}

void ts_lora_matmul_glu(ts_lora_rt *lr, const ts_tensor *Wg, const ts_tensor *Wu, const float *x,
                        int64_t ldx, int n, const ts_prenorm *pre, bool gelu, float *tg, float *tu,
                        int64_t ldt, float *out, int64_t ldo) {
    if (!touched(lr, Wg) && !touched(lr, Wu)) {
        ts_matmul_glu(lr->be, Wg, Wu, x, ldx, n, pre, gelu, tg, tu, ldt, out, ldo);
        return;
    }
    const ts_tensor *W[2] = {Wg, Wu};
    float *y[2] = {tg, tu};
    int64_t ldy[2] = {ldt, ldt};
    ts_lora_matmul_n(lr, W, 2, x, ldx, n, pre, y, ldy);
    ts_glu(lr->be, gelu, tg, tu, ldt, n, (int)ts_tensor_rows(Wg), out, ldo);
}

/* ---- the public calls (tessera.h) ------------------------------------------------------- */

ts_status ts_model_lora_load(ts_model *m, const char *path, int *id) {
    int got = -1;
    ts_status st = ts_lora_load(m, path, &got);
    if (id) *id = got;
    return st;
}

int ts_model_lora_count(const ts_model *m) { return m->lora ? m->lora->n : 0; }

ts_status ts_model_lora_info(const ts_model *m, int id, ts_lora_info *out) {
    if (id < 0 || id >= ts_model_lora_count(m))
        return ts_error(TS_ERR_INVALID, "no LoRA adapter %d (the model has %d)", id,
                        ts_model_lora_count(m));
    const ts_lora_adapter *a = &m->lora->ad[id];
    *out = (ts_lora_info){.path = a->path, .rank = a->rank, .n_weights = a->n_weights};
    return TS_OK;
}
