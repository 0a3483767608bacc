/* GGUF metadata access: by index for generic tools, typed by key for model loaders. Values were
 * validated at open, so reads here only convert. */
#include "format/gguf_int.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static const gguf_kv *kv_at(const ts_gguf *g, int64_t i) {
    return g && i >= 0 && (uint64_t)i < g->n_kv ? &g->kv[i] : NULL;
}

size_t ts_gguf_n_kv(const ts_gguf *g) { return g ? (size_t)g->n_kv : 0; }

int64_t ts_gguf_find_key(const ts_gguf *g, const char *key) {
    const gguf_kv *kv = gguf_lookup_kv(g, key);
    return kv ? (int64_t)(kv - g->kv) : -1;
}

const char *ts_gguf_kv_key(const ts_gguf *g, int64_t i) {
    const gguf_kv *kv = kv_at(g, i);
    return kv ? kv->key : NULL;
}

ts_gguf_type ts_gguf_kv_type(const ts_gguf *g, int64_t i) {
    const gguf_kv *kv = kv_at(g, i);
    return kv ? (ts_gguf_type)kv->type : TS_GGUF_TYPE_COUNT;
}

ts_status ts_gguf_kv_value(const ts_gguf *g, int64_t i, ts_gguf_value *out) {
    memset(out, 0, sizeof *out);
    const gguf_kv *kv = kv_at(g, i);
    if (!kv) return ts_error(TS_ERR_RANGE, "%s: key index %" PRId64 " out of range", g->path, i);
    out->type = (ts_gguf_type)kv->type;
    out->n = kv->n;
    if (kv->type == TS_GGUF_STR) {
        out->data = kv->str;
    } else if (kv->type == TS_GGUF_ARR) {
        out->elem = (ts_gguf_type)kv->elem;
        out->data = kv->elem == TS_GGUF_STR || kv->elem == TS_GGUF_ARR ? NULL : g->buf + kv->val;
    } else {
        out->data = g->buf + kv->val;
    }
    return TS_OK;
}

static ts_status str_item(const ts_gguf *g, const gguf_kv *kv, uint64_t j, const char **s,
                          size_t *len) {
    if (kv->type != TS_GGUF_ARR || kv->elem != TS_GGUF_STR)
        return ts_error(TS_ERR_FORMAT, "%s: key '%s': expected an array of strings, got %s%s%s",
                        g->path, kv->key, ts_gguf_type_name((ts_gguf_type)kv->type),
                        kv->type == TS_GGUF_ARR ? " of " : "",
                        kv->type == TS_GGUF_ARR ? ts_gguf_type_name((ts_gguf_type)kv->elem) : "");
    if (j >= kv->n)
        return ts_error(TS_ERR_RANGE,
                        "%s: key '%s': item %" PRIu64 " is past the end (%" PRIu64 " items)",
                        g->path, kv->key, j, kv->n);
    uint64_t off = g->items[kv->items + j];
    *s = (const char *)g->buf + off;
    *len = (size_t)gguf_le64(g->buf + off - 8);
    return TS_OK;
}

ts_status ts_gguf_kv_str_item(const ts_gguf *g, int64_t i, uint64_t j, const char **s,
                              size_t *len) {
    const gguf_kv *kv = kv_at(g, i);
    if (!kv) return ts_error(TS_ERR_RANGE, "%s: key index %" PRId64 " out of range", g->path, i);
    return str_item(g, kv, j, s, len);
}

/* ---- typed getters ------------------------------------------------------------------------- */

int gguf_kv_integer(const ts_gguf *g, const gguf_kv *kv, uint64_t *v, bool *neg) {
    const unsigned char *p = g->buf + kv->val;
    int64_t s;
    switch (kv->type) {
    case TS_GGUF_U8:
        *v = p[0];
        *neg = false;
        return 1;
    case TS_GGUF_U16:
        *v = (uint64_t)p[0] | (uint64_t)p[1] << 8;
        *neg = false;
        return 1;
    case TS_GGUF_U32:
        *v = gguf_le32(p);
        *neg = false;
        return 1;
    case TS_GGUF_U64:
        *v = gguf_le64(p);
        *neg = false;
        return 1;
    case TS_GGUF_I8: s = (int8_t)p[0]; break;
    case TS_GGUF_I16: s = (int16_t)(uint16_t)(p[0] | p[1] << 8); break;
    case TS_GGUF_I32: s = (int32_t)gguf_le32(p); break;
    case TS_GGUF_I64: s = (int64_t)gguf_le64(p); break;
    default: return 0;
    }
    *v = (uint64_t)s;
    *neg = s < 0;
    return 1;
}

static ts_status missing(const ts_gguf *g, const char *key) {
    return ts_error(TS_ERR_FORMAT, "%s: key '%s': missing", g->path, key);
}

static ts_status wrong_type(const ts_gguf *g, const gguf_kv *kv, const char *want) {
    return ts_error(TS_ERR_FORMAT, "%s: key '%s': expected %s, got %s", g->path, kv->key, want,
                    ts_gguf_type_name((ts_gguf_type)kv->type));
}

/* Any integer kv whose value lies in [min, max]. */
static ts_status get_int(const ts_gguf *g, const char *key, int64_t min, uint64_t max, uint64_t *v,
                         bool *neg) {
    const gguf_kv *kv = gguf_lookup_kv(g, key);
    if (!kv) return missing(g, key);
    if (!gguf_kv_integer(g, kv, v, neg)) return wrong_type(g, kv, "an integer");
    bool ok = *neg ? (int64_t)*v >= min : *v <= max;
    if (!ok) {
        if (*neg)
            return ts_error(TS_ERR_FORMAT,
                            "%s: key '%s': value %" PRId64 " is out of range [%" PRId64 ", %" PRIu64
                            "]",
                            g->path, key, (int64_t)*v, min, max);
        return ts_error(TS_ERR_FORMAT,
                        "%s: key '%s': value %" PRIu64 " is out of range [%" PRId64 ", %" PRIu64
                        "]",
                        g->path, key, *v, min, max);
    }
    return TS_OK;
}

ts_status ts_gguf_get_u32(const ts_gguf *g, const char *key, uint32_t *out) {
    uint64_t v = 0;
    bool neg = false;
    TS_TRY(get_int(g, key, 0, UINT32_MAX, &v, &neg));
    *out = (uint32_t)v;
    return TS_OK;
}

ts_status ts_gguf_get_i32(const ts_gguf *g, const char *key, int32_t *out) {
    uint64_t v = 0;
    bool neg = false;
    TS_TRY(get_int(g, key, INT32_MIN, INT32_MAX, &v, &neg));
    *out = (int32_t)(int64_t)v;
    return TS_OK;
}

ts_status ts_gguf_get_u64(const ts_gguf *g, const char *key, uint64_t *out) {
    bool neg = false;
    return get_int(g, key, 0, UINT64_MAX, out, &neg);
}

ts_status ts_gguf_get_i64(const ts_gguf *g, const char *key, int64_t *out) {
    uint64_t v = 0;
    bool neg = false;
    TS_TRY(get_int(g, key, INT64_MIN, INT64_MAX, &v, &neg));
    *out = (int64_t)v;
    return TS_OK;
}

static double float_at(const unsigned char *p, uint32_t type) {
    if (type == TS_GGUF_F32) {
        uint32_t u = gguf_le32(p);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    uint64_t u = gguf_le64(p);
    double d = 0;
    memcpy(&d, &u, 8);
    return d;
}

ts_status ts_gguf_get_f64(const ts_gguf *g, const char *key, double *out) {
    const gguf_kv *kv = gguf_lookup_kv(g, key);
    if (!kv) return missing(g, key);
    if (kv->type != TS_GGUF_F32 && kv->type != TS_GGUF_F64)
        return wrong_type(g, kv, "FLOAT32 or FLOAT64");
    *out = float_at(g->buf + kv->val, kv->type);
    return TS_OK;
}

ts_status ts_gguf_get_f32(const ts_gguf *g, const char *key, float *out) {
    double d = 0;
    TS_TRY(ts_gguf_get_f64(g, key, &d));
    *out = (float)d;
    return TS_OK;
}

ts_status ts_gguf_get_bool(const ts_gguf *g, const char *key, bool *out) {
    const gguf_kv *kv = gguf_lookup_kv(g, key);
    if (!kv) return missing(g, key);
    if (kv->type != TS_GGUF_BOOL) return wrong_type(g, kv, "BOOL");
    *out = g->buf[kv->val] != 0;
    return TS_OK;
}

ts_status ts_gguf_get_str(const ts_gguf *g, const char *key, const char **out, size_t *len) {
    const gguf_kv *kv = gguf_lookup_kv(g, key);
    if (!kv) return missing(g, key);
    if (kv->type != TS_GGUF_STR) return wrong_type(g, kv, "STRING");
    if (memchr(kv->str, 0, (size_t)kv->n))
        return ts_error(TS_ERR_FORMAT, "%s: key '%s': string contains a NUL byte", g->path, key);
    *out = kv->str;
    if (len) *len = (size_t)kv->n;
    return TS_OK;
}

bool ts_gguf_has(const ts_gguf *g, const char *key) { return gguf_lookup_kv(g, key) != NULL; }

ts_status ts_gguf_get_u32_opt(const ts_gguf *g, const char *key, uint32_t dflt, uint32_t *out) {
    if (!ts_gguf_has(g, key)) {
        *out = dflt;
        return TS_OK;
    }
    return ts_gguf_get_u32(g, key, out);
}

ts_status ts_gguf_get_f32_opt(const ts_gguf *g, const char *key, float dflt, float *out) {
    if (!ts_gguf_has(g, key)) {
        *out = dflt;
        return TS_OK;
    }
    return ts_gguf_get_f32(g, key, out);
}

ts_status ts_gguf_get_bool_opt(const ts_gguf *g, const char *key, bool dflt, bool *out) {
    if (!ts_gguf_has(g, key)) {
        *out = dflt;
        return TS_OK;
    }
    return ts_gguf_get_bool(g, key, out);
}

ts_status ts_gguf_get_str_opt(const ts_gguf *g, const char *key, const char *dflt,
                              const char **out) {
    if (!ts_gguf_has(g, key)) {
        *out = dflt;
        return TS_OK;
    }
    return ts_gguf_get_str(g, key, out, NULL);
}

/* ---- arrays -------------------------------------------------------------------------------- */

static ts_status get_array(const ts_gguf *g, const char *key, const gguf_kv **out) {
    const gguf_kv *kv = gguf_lookup_kv(g, key);
    if (!kv) return missing(g, key);
    if (kv->type != TS_GGUF_ARR) return wrong_type(g, kv, "ARRAY");
    *out = kv;
    return TS_OK;
}

ts_status ts_gguf_get_arr(const ts_gguf *g, const char *key, ts_gguf_type *elem, uint64_t *n,
                          const void **data) {
    const gguf_kv *kv = NULL;
    TS_TRY(get_array(g, key, &kv));
    *elem = (ts_gguf_type)kv->elem;
    *n = kv->n;
    *data = kv->elem == TS_GGUF_STR || kv->elem == TS_GGUF_ARR ? NULL : g->buf + kv->val;
    return TS_OK;
}

static ts_status wrong_elem(const ts_gguf *g, const gguf_kv *kv, const char *want) {
    return ts_error(TS_ERR_FORMAT, "%s: key '%s': expected an array of %s, got an array of %s",
                    g->path, kv->key, want, ts_gguf_type_name((ts_gguf_type)kv->elem));
}

ts_status ts_gguf_get_arr_i32(const ts_gguf *g, const char *key, int32_t *dst, uint64_t cap,
                              uint64_t *n) {
    const gguf_kv *kv = NULL;
    TS_TRY(get_array(g, key, &kv));
    unsigned sz = gguf_scalar_size(kv->elem);
    if (kv->elem == TS_GGUF_F32 || kv->elem == TS_GGUF_F64 || kv->elem == TS_GGUF_BOOL || !sz)
        return wrong_elem(g, kv, "integers");
    /* A one-element view of each item lets gguf_kv_integer do the decoding. */
    gguf_kv item = {.key = kv->key, .type = kv->elem, .n = 1};
    for (uint64_t i = 0; i < kv->n; i++) {
        item.val = kv->val + i * sz;
        uint64_t v = 0;
        bool neg = false;
        gguf_kv_integer(g, &item, &v, &neg);
        if (neg ? (int64_t)v < INT32_MIN : v > INT32_MAX)
            return ts_error(TS_ERR_FORMAT,
                            "%s: key '%s': item %" PRIu64 " (%s%" PRIu64 ") does not fit int32",
                            g->path, key, i, neg ? "-" : "", neg ? (uint64_t)0 - v : v);
        if (i < cap) dst[i] = (int32_t)(int64_t)v;
    }
    *n = kv->n;
    return TS_OK;
}

ts_status ts_gguf_get_arr_f32(const ts_gguf *g, const char *key, float *dst, uint64_t cap,
                              uint64_t *n) {
    const gguf_kv *kv = NULL;
    TS_TRY(get_array(g, key, &kv));
    if (kv->elem != TS_GGUF_F32 && kv->elem != TS_GGUF_F64)
        return wrong_elem(g, kv, "FLOAT32 or FLOAT64");
    unsigned sz = gguf_scalar_size(kv->elem);
    uint64_t m = kv->n < cap ? kv->n : cap;
    for (uint64_t i = 0; i < m; i++)
        dst[i] = (float)float_at(g->buf + kv->val + i * sz, kv->elem);
    *n = kv->n;
    return TS_OK;
}

ts_status ts_gguf_get_str_arr_item(const ts_gguf *g, const char *key, uint64_t i, const char **s,
                                   size_t *len, uint64_t *n_items) {
    const gguf_kv *kv = NULL;
    TS_TRY(get_array(g, key, &kv));
    if (n_items) *n_items = kv->n;
    return str_item(g, kv, i, s, len);
}
