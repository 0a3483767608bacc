/* GGUF reader: one bounds-checked pass over the header, then the cross checks (duplicates,
 * alignment, extents, overlap) once everything is indexed.
 *
 * Layout (little-endian): "GGUF", u32 version, u64 tensor count, u64 kv count; the kvs (string
 * key = u64 length + bytes, u32 value type, value; an array value is u32 element type, u64 count,
 * elements); the tensor infos (string name, u32 n_dims, u64 ne[n_dims] innermost first, u32 ggml
 * type, u64 offset relative to the data section); zero padding to the alignment; the data. */
#include "format/gguf_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Nested arrays are only walked (to keep the structural checks complete), never exposed. */
#define GGUF_MAX_DEPTH 8

/* Block geometry of every ggml type id that GGUF files carry (ids 4, 5, 31-33 and 36-38 were
 * retired). Sizes from the GGUF spec / gguf-py's GGML_QUANT_SIZES. */
static const gguf_ggml_type ggml_types[] = {
    [0] = {"F32", 1, 4, TS_DTYPE_F32},
    [1] = {"F16", 1, 2, TS_DTYPE_F16},
    [2] = {"Q4_0", 32, 18, TS_DTYPE_Q4_0},
    [3] = {"Q4_1", 32, 20, -1},
    [6] = {"Q5_0", 32, 22, TS_DTYPE_Q5_0},
    [7] = {"Q5_1", 32, 24, -1},
    [8] = {"Q8_0", 32, 34, TS_DTYPE_Q8_0},
    [9] = {"Q8_1", 32, 40, -1},
    [10] = {"Q2_K", 256, 84, -1},
    [11] = {"Q3_K", 256, 110, -1},
    [12] = {"Q4_K", 256, 144, TS_DTYPE_Q4_K},
    [13] = {"Q5_K", 256, 176, -1},
    [14] = {"Q6_K", 256, 210, TS_DTYPE_Q6_K},
    [15] = {"Q8_K", 256, 292, -1},
    [16] = {"IQ2_XXS", 256, 66, -1},
    [17] = {"IQ2_XS", 256, 74, -1},
    [18] = {"IQ3_XXS", 256, 98, -1},
    [19] = {"IQ1_S", 256, 50, -1},
    [20] = {"IQ4_NL", 32, 18, -1},
    [21] = {"IQ3_S", 256, 110, -1},
    [22] = {"IQ2_S", 256, 82, -1},
    [23] = {"IQ4_XS", 256, 136, -1},
    [24] = {"I8", 1, 1, -1},
    [25] = {"I16", 1, 2, -1},
    [26] = {"I32", 1, 4, -1},
    [27] = {"I64", 1, 8, -1},
    [28] = {"F64", 1, 8, -1},
    [29] = {"IQ1_M", 256, 56, -1},
    [30] = {"BF16", 1, 2, TS_DTYPE_BF16},
    [34] = {"TQ1_0", 256, 54, -1},
    [35] = {"TQ2_0", 256, 66, -1},
    [39] = {"MXFP4", 32, 17, -1},
};
#define GGML_N_TYPES (sizeof ggml_types / sizeof ggml_types[0])

const gguf_ggml_type *gguf_ggml_type_info(uint32_t id) {
    return id < GGML_N_TYPES && ggml_types[id].name ? &ggml_types[id] : NULL;
}

const char *ts_gguf_ggml_type_name(uint32_t id) {
    const gguf_ggml_type *t = gguf_ggml_type_info(id);
    return t ? t->name : NULL;
}

uint32_t ts_gguf_ggml_type_of(ts_dtype dtype) {
    for (uint32_t i = 0; i < GGML_N_TYPES; i++)
        if (ggml_types[i].name && ggml_types[i].dtype == (int)dtype) return i;
    return UINT32_MAX;
}

const char *ts_gguf_type_name(ts_gguf_type t) {
    static const char *const names[TS_GGUF_TYPE_COUNT] = {
        "UINT8", "INT8",   "UINT16", "INT16",  "UINT32", "INT32",  "FLOAT32",
        "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64",  "FLOAT64"};
    return (unsigned)t < TS_GGUF_TYPE_COUNT ? names[t] : "?";
}

/* ---- the cursor: every read of the header goes through these ------------------------------- */

typedef struct {
    ts_gguf *g;
    uint64_t pos;
    uint64_t end;    /* min(file size, metadata cap): nothing at or past it is ever read */
    const char *ctx; /* "key 'x'", "tensor #3", ... for messages */
} gguf_cur;

static ts_status cur_short(const gguf_cur *c, uint64_t need, const char *field) {
    if (c->end < c->g->size)
        return ts_error(TS_ERR_FORMAT,
                        "%s: byte %" PRIu64 ": %s: %s: the metadata (keys and tensor infos) "
                        "exceeds the %" PRIu64 "-byte cap",
                        c->g->path, c->pos, c->ctx, field, GGUF_META_CAP);
    return ts_error(TS_ERR_FORMAT,
                    "%s: byte %" PRIu64 ": %s: %s: truncated: needs %" PRIu64
                    " bytes, the file has %" PRIu64 " left",
                    c->g->path, c->pos, c->ctx, field, need, c->end - c->pos);
}

static ts_status cur_take(gguf_cur *c, uint64_t n, const char *field, const unsigned char **p) {
    if (n > c->end - c->pos) return cur_short(c, n, field);
    *p = c->g->buf + c->pos;
    c->pos += n;
    return TS_OK;
}

static ts_status cur_u32(gguf_cur *c, const char *field, uint32_t *v) {
    const unsigned char *p = NULL;
    TS_TRY(cur_take(c, 4, field, &p));
    *v = gguf_le32(p);
    return TS_OK;
}

static ts_status cur_u64(gguf_cur *c, const char *field, uint64_t *v) {
    const unsigned char *p = NULL;
    TS_TRY(cur_take(c, 8, field, &p));
    *v = gguf_le64(p);
    return TS_OK;
}

/* A GGUF string: u64 length, then the bytes. */
static ts_status cur_str(gguf_cur *c, const char *field, const unsigned char **s, uint64_t *len) {
    uint64_t at = c->pos;
    TS_TRY(cur_u64(c, field, len));
    if (*len > c->end - c->pos) {
        if (c->end < c->g->size) return cur_short(c, *len, field);
        return ts_error(TS_ERR_FORMAT,
                        "%s: byte %" PRIu64 ": %s: %s: string length %" PRIu64
                        " runs past the end of the file (%" PRIu64 " bytes left)",
                        c->g->path, at, c->ctx, field, *len, c->end - c->pos);
    }
    *s = c->g->buf + c->pos;
    c->pos += *len;
    return TS_OK;
}

/* ---- building the index -------------------------------------------------------------------- */

static ts_status arena_add(ts_gguf *g, const unsigned char *s, uint64_t len, uint64_t *off) {
    if (len + 1 > g->names_cap - g->names_len) {
        uint64_t nc = g->names_cap ? g->names_cap : 4096;
        while (len + 1 > nc - g->names_len)
            nc *= 2;
        char *nn = realloc(g->names, (size_t)nc);
        if (!nn) return ts_error(TS_ERR_NOMEM, "%s: out of memory", g->path);
        g->names = nn;
        g->names_cap = nc;
    }
    *off = g->names_len;
    if (len) memcpy(g->names + g->names_len, s, (size_t)len);
    g->names[g->names_len + len] = 0;
    g->names_len += len + 1;
    return TS_OK;
}

static ts_status items_add(ts_gguf *g, uint64_t off) {
    if (g->n_items == g->cap_items) {
        uint64_t nc = g->cap_items ? g->cap_items * 2 : 1024;
        uint64_t *ni = realloc(g->items, (size_t)nc * sizeof *ni);
        if (!ni) return ts_error(TS_ERR_NOMEM, "%s: out of memory", g->path);
        g->items = ni;
        g->cap_items = nc;
    }
    g->items[g->n_items++] = off;
    return TS_OK;
}

/* Fewest bytes one element of a type takes (arrays: type + count). */
static uint64_t min_elem_bytes(uint32_t t) {
    if (t == TS_GGUF_STR) return 8;
    if (t == TS_GGUF_ARR) return 12;
    return gguf_scalar_size(t);
}

static ts_status check_bools(gguf_cur *c, uint64_t from, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        unsigned char b = c->g->buf[from + i];
        if (b > 1)
            return ts_error(TS_ERR_FORMAT, "%s: byte %" PRIu64 ": %s: bool value %u is not 0 or 1",
                            c->g->path, from + i, c->ctx, b);
    }
    return TS_OK;
}

/* Walks the elements of an array whose element type and count were just read. Top-level string
 * arrays (depth 0) get their items indexed; nested arrays are walked to depth GGUF_MAX_DEPTH. */
static ts_status walk_array(gguf_cur *c, uint32_t elem, uint64_t n, int depth) {
    uint64_t at = c->pos;
    if (elem >= TS_GGUF_TYPE_COUNT)
        return ts_error(TS_ERR_FORMAT, "%s: byte %" PRIu64 ": %s: unknown array element type %u",
                        c->g->path, at - 12, c->ctx, elem);
    uint64_t min = min_elem_bytes(elem);
    if (n > (c->end - c->pos) / min) {
        if (c->end < c->g->size && n <= (c->g->size - c->pos) / min)
            return cur_short(c, n, "array");
        return ts_error(TS_ERR_FORMAT,
                        "%s: byte %" PRIu64 ": %s: array of %" PRIu64 " %s elements cannot fit in "
                        "the %" PRIu64 " bytes left",
                        c->g->path, at - 8, c->ctx, n, ts_gguf_type_name((ts_gguf_type)elem),
                        c->end - c->pos);
    }
    if (elem == TS_GGUF_STR) {
        for (uint64_t i = 0; i < n; i++) {
            const unsigned char *s = NULL;
            uint64_t len = 0;
            TS_TRY(cur_str(c, "array item", &s, &len));
            if (depth == 0) TS_TRY(items_add(c->g, (uint64_t)(s - c->g->buf)));
        }
        return TS_OK;
    }
    if (elem == TS_GGUF_ARR) {
        if (depth + 1 >= GGUF_MAX_DEPTH)
            return ts_error(TS_ERR_FORMAT,
                            "%s: byte %" PRIu64 ": %s: arrays nested deeper than %d levels",
                            c->g->path, at, c->ctx, GGUF_MAX_DEPTH);
        for (uint64_t i = 0; i < n; i++) {
            uint32_t sub;
            uint64_t sn;
            TS_TRY(cur_u32(c, "nested array element type", &sub));
            TS_TRY(cur_u64(c, "nested array count", &sn));
            TS_TRY(walk_array(c, sub, sn, depth + 1));
        }
        return TS_OK;
    }
    const unsigned char *p = NULL;
    TS_TRY(cur_take(c, n * min, "array elements", &p)); /* n * min cannot overflow: checked */
    if (elem == TS_GGUF_BOOL) TS_TRY(check_bools(c, at, n));
    return TS_OK;
}

/* One key-value pair. *nested is set when its value is an array of arrays. */
static ts_status parse_kv(gguf_cur *c, uint64_t i, bool *nested) {
    ts_gguf *g = c->g;
    gguf_kv *kv = &g->kv[i];
    char ctx[256];
    snprintf(ctx, sizeof ctx, "key #%" PRIu64, i);
    c->ctx = ctx;
    kv->at = c->pos;
    const unsigned char *key = NULL;
    uint64_t klen = 0;
    TS_TRY(cur_str(c, "key", &key, &klen));
    if (!gguf_key_ok(key, klen))
        return ts_error(TS_ERR_FORMAT,
                        "%s: byte %" PRIu64 ": key #%" PRIu64 ": invalid key (%" PRIu64
                        " bytes; keys are 1-%u printable ASCII bytes without spaces)",
                        g->path, kv->at, i, klen, GGUF_KEY_MAX);
    TS_TRY(arena_add(g, key, klen, &kv->key_off));
    snprintf(ctx, sizeof ctx, "key '%.*s'", klen > 200 ? 200 : (int)klen, (const char *)key);

    uint64_t tat = c->pos;
    TS_TRY(cur_u32(c, "value type", &kv->type));
    if (kv->type >= TS_GGUF_TYPE_COUNT)
        return ts_error(TS_ERR_FORMAT, "%s: byte %" PRIu64 ": %s: unknown value type %u", g->path,
                        tat, ctx, kv->type);
    kv->n = 1;
    if (kv->type == TS_GGUF_STR) {
        const unsigned char *s = NULL;
        TS_TRY(cur_str(c, "value", &s, &kv->n));
        kv->val = (uint64_t)(s - g->buf);
        return arena_add(g, s, kv->n, &kv->str_off);
    }
    if (kv->type == TS_GGUF_ARR) {
        TS_TRY(cur_u32(c, "array element type", &kv->elem));
        TS_TRY(cur_u64(c, "array count", &kv->n));
        kv->val = c->pos;
        kv->items = g->n_items;
        *nested = kv->elem == TS_GGUF_ARR;
        return walk_array(c, kv->elem, kv->n, 0);
    }
    const unsigned char *p = NULL;
    kv->val = c->pos;
    TS_TRY(cur_take(c, gguf_scalar_size(kv->type), "value", &p));
    if (kv->type == TS_GGUF_BOOL) TS_TRY(check_bools(c, kv->val, 1));
    return TS_OK;
}

/* One tensor info: name, dims, type, offset; element and byte counts for known types. */
static ts_status parse_tensor(gguf_cur *c, uint64_t i) {
    ts_gguf *g = c->g;
    gguf_tensor *t = &g->t[i];
    char ctx[160];
    snprintf(ctx, sizeof ctx, "tensor #%" PRIu64, i);
    c->ctx = ctx;
    t->at = c->pos;
    const unsigned char *name = NULL;
    uint64_t nlen = 0;
    TS_TRY(cur_str(c, "name", &name, &nlen));
    if (nlen == 0 || nlen > GGUF_NAME_MAX_READ)
        return ts_error(TS_ERR_FORMAT,
                        "%s: byte %" PRIu64 ": tensor #%" PRIu64 ": name length %" PRIu64
                        " is not in 1..%u",
                        g->path, t->at, i, nlen, GGUF_NAME_MAX_READ);
    if (memchr(name, 0, (size_t)nlen))
        return ts_error(TS_ERR_FORMAT,
                        "%s: byte %" PRIu64 ": tensor #%" PRIu64 ": name contains a NUL byte",
                        g->path, t->at, i);
    TS_TRY(arena_add(g, name, nlen, &t->name_off));
    snprintf(ctx, sizeof ctx, "tensor '%.*s'", (int)nlen > 100 ? 100 : (int)nlen,
             (const char *)name);

    uint32_t nd;
    TS_TRY(cur_u32(c, "n_dims", &nd));
    if (nd > TS_GGUF_MAX_DIMS)
        return ts_error(TS_ERR_FORMAT, "%s: byte %" PRIu64 ": %s: n_dims %u exceeds %d", g->path,
                        c->pos - 4, ctx, nd, TS_GGUF_MAX_DIMS);
    t->n_dims = (int)nd;
    bool any_zero = false;
    for (int d = 0; d < TS_GGUF_MAX_DIMS; d++) {
        uint64_t v = 1;
        if (d < (int)nd) TS_TRY(cur_u64(c, "dimension", &v));
        if (v > (uint64_t)INT64_MAX)
            return ts_error(TS_ERR_FORMAT,
                            "%s: byte %" PRIu64 ": %s: dimension %d is %" PRIu64 ", beyond 2^63-1",
                            g->path, c->pos - 8, ctx, d, v);
        t->ne[d] = (int64_t)v;
        any_zero |= v == 0;
    }
    TS_TRY(cur_u32(c, "type", &t->ggml_type));
    TS_TRY(cur_u64(c, "offset", &t->offset));

    const gguf_ggml_type *ti = gguf_ggml_type_info(t->ggml_type);
    if (!ti) return TS_OK; /* refused once the rest of the file is checked */
    uint64_t elems = 1;
    if (any_zero) {
        elems = 0;
    } else {
        for (int d = 0; d < TS_GGUF_MAX_DIMS; d++) {
            if (elems > (uint64_t)INT64_MAX / (uint64_t)t->ne[d])
                return ts_error(TS_ERR_FORMAT,
                                "%s: byte %" PRIu64 ": %s: element count of [%" PRId64 ", %" PRId64
                                ", %" PRId64 ", %" PRId64 "] overflows 63 bits",
                                g->path, t->at, ctx, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
            elems *= (uint64_t)t->ne[d];
        }
    }
    if (t->ne[0] % ti->block_elems)
        return ts_error(TS_ERR_FORMAT,
                        "%s: byte %" PRIu64 ": %s: row of %" PRId64
                        " elements is not a multiple of the %s block size %d",
                        g->path, t->at, ctx, t->ne[0], ti->name, ti->block_elems);
    uint64_t blocks = elems / (uint64_t)ti->block_elems;
    if (blocks > UINT64_MAX / (uint64_t)ti->block_bytes)
        return ts_error(TS_ERR_FORMAT, "%s: byte %" PRIu64 ": %s: byte size overflows 64 bits",
                        g->path, t->at, ctx);
    t->nbytes = blocks * (uint64_t)ti->block_bytes;
    if (ti->dtype >= 0) {
        t->loadable = true;
        t->t.dtype = (ts_dtype)ti->dtype;
        t->t.n_dims = t->n_dims;
        for (int k = 0; k < TS_MAX_DIMS; k++)
            t->t.shape[k] = k < t->n_dims ? t->ne[t->n_dims - 1 - k] : 1;
        t->t.nbytes = t->nbytes;
    }
    return TS_OK;
}

static int cmp_ref(const void *a, const void *b) {
    return strcmp(((const gguf_ref *)a)->s, ((const gguf_ref *)b)->s);
}

static int cmp_key(const void *key, const void *elem) {
    return strcmp((const char *)key, ((const gguf_ref *)elem)->s);
}

/* Tensors as (offset, index) for the overlap check. */
typedef struct {
    uint64_t begin, end, i;
} gguf_span;

static int cmp_span(const void *a, const void *b) {
    const gguf_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static ts_status check_alignment(ts_gguf *g) {
    g->alignment = TS_GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = gguf_lookup_kv(g, GGUF_KEY_ALIGNMENT);
    if (!kv) return TS_OK;
    uint64_t v = 0;
    bool neg = false;
    if (!gguf_kv_integer(g, kv, &v, &neg))
        return ts_error(TS_ERR_FORMAT,
                        "%s: byte %" PRIu64 ": key '" GGUF_KEY_ALIGNMENT
                        "': expected an integer, got %s",
                        g->path, kv->at, ts_gguf_type_name((ts_gguf_type)kv->type));
    if (neg || v == 0 || (v & (v - 1)) || v > GGUF_ALIGN_MAX)
        return ts_error(TS_ERR_FORMAT,
                        "%s: byte %" PRIu64 ": key '" GGUF_KEY_ALIGNMENT "': alignment %s%" PRIu64
                        " is not a power of two in [1, %u]",
                        g->path, kv->at, neg ? "-" : "", neg ? (uint64_t)0 - v : v, GGUF_ALIGN_MAX);
    g->alignment = (uint32_t)v;
    return TS_OK;
}

/* Offsets, extents and overlap, once the data section's start is known. */
static ts_status check_extents(ts_gguf *g) {
    if (g->n_t == 0) return TS_OK;
    if (g->data_off > g->size)
        return ts_error(TS_ERR_FORMAT,
                        "%s: the tensor data section starts at byte %" PRIu64
                        ", past the end of the file (%" PRIu64 " bytes; truncated?)",
                        g->path, g->data_off, g->size);
    uint64_t data_size = g->size - g->data_off;
    gguf_span *spans = malloc((size_t)g->n_t * sizeof *spans);
    if (!spans) return ts_error(TS_ERR_NOMEM, "%s: out of memory", g->path);
    uint64_t ns = 0;
    ts_status rc = TS_OK;
    for (uint64_t i = 0; i < g->n_t && rc == TS_OK; i++) {
        gguf_tensor *t = &g->t[i];
        if (t->offset % g->alignment)
            rc = ts_error(TS_ERR_FORMAT,
                          "%s: byte %" PRIu64 ": tensor '%s': offset %" PRIu64
                          " is not a multiple of the alignment %u",
                          g->path, t->at, t->name, t->offset, g->alignment);
        else if (t->offset > data_size || t->nbytes > data_size - t->offset)
            rc = ts_error(TS_ERR_FORMAT,
                          "%s: byte %" PRIu64 ": tensor '%s': data [%" PRIu64 ", +%" PRIu64
                          ") runs past the end of the file (the data section has %" PRIu64
                          " bytes; truncated?)",
                          g->path, t->at, t->name, t->offset, t->nbytes, data_size);
        else {
            t->t.data = g->buf + g->data_off + t->offset;
            if (t->nbytes) spans[ns++] = (gguf_span){t->offset, t->offset + t->nbytes, i};
        }
    }
    if (rc == TS_OK && ns > 1) {
        qsort(spans, (size_t)ns, sizeof *spans, cmp_span);
        const gguf_span *reach = &spans[0]; /* the span ending furthest so far */
        for (uint64_t k = 1; k < ns && rc == TS_OK; k++) {
            if (spans[k].begin < reach->end) {
                const gguf_tensor *a = &g->t[spans[k].i], *b = &g->t[reach->i];
                rc = ts_error(TS_ERR_FORMAT,
                              "%s: tensor '%s' [%" PRIu64 ", %" PRIu64
                              ") overlaps tensor '%s' [%" PRIu64 ", %" PRIu64
                              ") in the data section",
                              g->path, a->name, spans[k].begin, spans[k].end, b->name, reach->begin,
                              reach->end);
            }
            if (spans[k].end > reach->end) reach = &spans[k];
        }
    }
    free(spans);
    return rc;
}

/* Sorts refs by name; a name twice is an error naming both byte offsets. */
static ts_status sort_unique(ts_gguf *g, gguf_ref *refs, uint64_t n, bool keys) {
    if (n > 1) qsort(refs, (size_t)n, sizeof *refs, cmp_ref);
    for (uint64_t k = 1; k < n; k++) {
        if (strcmp(refs[k - 1].s, refs[k].s)) continue;
        uint64_t a = keys ? g->kv[refs[k - 1].i].at : g->t[refs[k - 1].i].at;
        uint64_t b = keys ? g->kv[refs[k].i].at : g->t[refs[k].i].at;
        if (a > b) {
            uint64_t x = a;
            a = b;
            b = x;
        }
        return ts_error(TS_ERR_FORMAT,
                        "%s: %s '%s' appears twice (bytes %" PRIu64 " and %" PRIu64 ")", g->path,
                        keys ? "key" : "tensor", refs[k].s, a, b);
    }
    return TS_OK;
}

static ts_status parse(ts_gguf *g) {
    const unsigned char *p = g->buf;
    if (g->size < GGUF_HEADER_LEN)
        return ts_error(TS_ERR_FORMAT,
                        "%s: file is %" PRIu64 " bytes, smaller than the %d-byte GGUF header",
                        g->path, g->size, GGUF_HEADER_LEN);
    if (memcmp(p, "GGUF", GGUF_MAGIC_LEN) != 0)
        return ts_error(TS_ERR_FORMAT,
                        "%s: not a GGUF file (magic bytes %02x %02x %02x %02x, expected 'GGUF')",
                        g->path, p[0], p[1], p[2], p[3]);
    g->version = gguf_le32(p + 4);
    if (g->version != 2 && g->version != 3) {
        uint32_t v = g->version;
        if (v == 0x02000000u || v == 0x03000000u)
            return ts_error(TS_ERR_UNSUPPORTED,
                            "%s: big-endian GGUF file (version field %08x); only little-endian "
                            "files are read",
                            g->path, v);
        if (v == 1)
            return ts_error(TS_ERR_UNSUPPORTED,
                            "%s: GGUF version 1 (32-bit counts) is not supported; convert the file",
                            g->path);
        return ts_error(v > 3 && v < 0x10000 ? TS_ERR_UNSUPPORTED : TS_ERR_FORMAT,
                        "%s: unsupported GGUF version %u (versions 2 and 3 are read)", g->path, v);
    }
    uint64_t n_t = gguf_le64(p + 8), n_kv = gguf_le64(p + 16);

    gguf_cur c = {g, GGUF_HEADER_LEN, g->size < GGUF_META_CAP ? g->size : GGUF_META_CAP, "header"};
    /* Every kv and tensor info takes a minimum number of bytes: counts that cannot fit are
     * refused before anything is allocated. */
    uint64_t room = c.end - c.pos;
    if (n_kv > room / GGUF_MIN_KV_BYTES ||
        n_t > (room - n_kv * GGUF_MIN_KV_BYTES) / GGUF_MIN_TENSOR_BYTES)
        return ts_error(TS_ERR_FORMAT,
                        "%s: header claims %" PRIu64 " tensors and %" PRIu64
                        " keys, which cannot fit in the %" PRIu64 " bytes after the header",
                        g->path, n_t, n_kv, room);
    g->kv = calloc((size_t)n_kv + 1, sizeof *g->kv);
    g->t = calloc((size_t)n_t + 1, sizeof *g->t);
    g->kv_sorted = malloc(((size_t)n_kv + 1) * sizeof *g->kv_sorted);
    g->t_sorted = malloc(((size_t)n_t + 1) * sizeof *g->t_sorted);
    if (!g->kv || !g->t || !g->kv_sorted || !g->t_sorted)
        return ts_error(TS_ERR_NOMEM, "%s: out of memory", g->path);

    const gguf_kv *nested = NULL;
    for (uint64_t i = 0; i < n_kv; i++) {
        bool is_nested = false;
        TS_TRY(parse_kv(&c, i, &is_nested));
        g->n_kv++;
        if (is_nested && !nested) nested = &g->kv[i];
    }
    for (uint64_t i = 0; i < n_t; i++) {
        TS_TRY(parse_tensor(&c, i));
        g->n_t++;
    }

    /* The arena has stopped moving: turn offsets into pointers. */
    for (uint64_t i = 0; i < g->n_kv; i++) {
        gguf_kv *kv = &g->kv[i];
        kv->key = g->names + kv->key_off;
        if (kv->type == TS_GGUF_STR) kv->str = g->names + kv->str_off;
        g->kv_sorted[i] = (gguf_ref){kv->key, i};
    }
    for (uint64_t i = 0; i < g->n_t; i++) {
        g->t[i].name = g->names + g->t[i].name_off;
        g->t_sorted[i] = (gguf_ref){g->t[i].name, i};
    }
    TS_TRY(sort_unique(g, g->kv_sorted, g->n_kv, true));
    TS_TRY(sort_unique(g, g->t_sorted, g->n_t, false));
    TS_TRY(check_alignment(g));
    g->data_off = c.pos + (g->alignment - c.pos % g->alignment) % g->alignment;
    TS_TRY(check_extents(g));

    /* Only a structurally sound file gets here, so "unsupported" never hides corruption. */
    if (nested)
        return ts_error(TS_ERR_UNSUPPORTED,
                        "%s: byte %" PRIu64 ": key '%s': arrays of arrays are not supported",
                        g->path, nested->at, nested->key);
    for (uint64_t i = 0; i < g->n_t; i++)
        if (!gguf_ggml_type_info(g->t[i].ggml_type))
            return ts_error(TS_ERR_UNSUPPORTED,
                            "%s: byte %" PRIu64 ": tensor '%s': unknown ggml type %u (a newer "
                            "GGUF?)",
                            g->path, g->t[i].at, g->t[i].name, g->t[i].ggml_type);
    return TS_OK;
}

static ts_status gguf_new(const char *name, ts_gguf **out) {
    *out = NULL;
    ts_gguf *g = calloc(1, sizeof *g);
    size_t n = strlen(name) + 1;
    if (g) g->path = malloc(n);
    if (!g || !g->path) {
        free(g);
        return ts_error(TS_ERR_NOMEM, "%s: out of memory", name);
    }
    memcpy(g->path, name, n);
    *out = g;
    return TS_OK;
}

static ts_status gguf_finish_open(ts_gguf *g, ts_gguf **out) {
    ts_status rc = parse(g);
    if (rc != TS_OK) {
        ts_gguf_close(g);
        return rc;
    }
    *out = g;
    return TS_OK;
}

ts_status ts_gguf_open(const char *path, ts_gguf **out) {
    *out = NULL;
    ts_gguf *g;
    TS_TRY(gguf_new(path, &g));
    ts_status rc = ts_mmap_open(path, &g->map);
    if (rc != TS_OK) {
        ts_gguf_close(g);
        return rc;
    }
    g->buf = g->map.data;
    g->size = g->map.size;
    return gguf_finish_open(g, out);
}

ts_status ts_gguf_open_buffer(const void *data, size_t size, const char *name, ts_gguf **out) {
    *out = NULL;
    ts_gguf *g;
    TS_TRY(gguf_new(name ? name : "(buffer)", &g));
    g->buf = data;
    g->size = data ? size : 0;
    return gguf_finish_open(g, out);
}

void ts_gguf_close(ts_gguf *g) {
    if (!g) return;
    ts_mmap_close(&g->map);
    free(g->kv);
    free(g->t);
    free(g->kv_sorted);
    free(g->t_sorted);
    free(g->items);
    free(g->names);
    free(g->path);
    free(g);
}

const char *ts_gguf_path(const ts_gguf *g) { return g->path; }
uint32_t ts_gguf_version(const ts_gguf *g) { return g->version; }
uint32_t ts_gguf_alignment(const ts_gguf *g) { return g->alignment; }
uint64_t ts_gguf_data_offset(const ts_gguf *g) { return g->data_off; }

const gguf_kv *gguf_lookup_kv(const ts_gguf *g, const char *key) {
    if (!g || !key || !g->n_kv) return NULL;
    const gguf_ref *r = bsearch(key, g->kv_sorted, (size_t)g->n_kv, sizeof *r, cmp_key);
    return r ? &g->kv[r->i] : NULL;
}

/* ---- tensors ------------------------------------------------------------------------------- */

static const gguf_tensor *lookup_tensor(const ts_gguf *g, const char *name) {
    if (!g || !name || !g->n_t) return NULL;
    const gguf_ref *r = bsearch(name, g->t_sorted, (size_t)g->n_t, sizeof *r, cmp_key);
    return r ? &g->t[r->i] : NULL;
}

size_t ts_gguf_n_tensors(const ts_gguf *g) { return g ? (size_t)g->n_t : 0; }

const char *ts_gguf_tensor_name(const ts_gguf *g, size_t i) {
    return g && i < g->n_t ? g->t[i].name : NULL;
}

const ts_tensor *ts_gguf_find(const ts_gguf *g, const char *name) {
    const gguf_tensor *t = lookup_tensor(g, name);
    return t && t->loadable ? &t->t : NULL;
}

/* "F32, F16, ..." for messages: the ggml types that map to a ts_dtype. */
static const char *loadable_types(char *buf, size_t size) {
    size_t k = 0;
    buf[0] = 0;
    for (size_t i = 0; i < GGML_N_TYPES && k < size; i++)
        if (ggml_types[i].name && ggml_types[i].dtype >= 0)
            k += (size_t)snprintf(buf + k, size - k, "%s%s", k ? ", " : "", ggml_types[i].name);
    return buf;
}

ts_status ts_gguf_tensor(const ts_gguf *g, const char *name, const ts_tensor **out) {
    *out = NULL;
    const gguf_tensor *t = lookup_tensor(g, name);
    if (!t) return ts_error(TS_ERR_FORMAT, "%s: tensor '%s': missing", g->path, name);
    if (!t->loadable) {
        char types[160];
        return ts_error(TS_ERR_UNSUPPORTED,
                        "%s: tensor '%s': ggml type %s (%u) is not supported (%s are)", g->path,
                        name, ts_gguf_ggml_type_name(t->ggml_type), t->ggml_type,
                        loadable_types(types, sizeof types));
    }
    *out = &t->t;
    return TS_OK;
}

ts_status ts_gguf_tensor_info_at(const ts_gguf *g, size_t i, ts_gguf_tensor_info *out) {
    memset(out, 0, sizeof *out);
    if (i >= g->n_t)
        return ts_error(TS_ERR_RANGE, "%s: tensor index %zu out of range (%" PRIu64 " tensors)",
                        g->path, i, g->n_t);
    const gguf_tensor *t = &g->t[i];
    out->name = t->name;
    out->ggml_type = t->ggml_type;
    out->type_name = ts_gguf_ggml_type_name(t->ggml_type);
    out->n_dims = t->n_dims;
    memcpy(out->ne, t->ne, sizeof out->ne);
    out->offset = g->data_off + t->offset;
    out->nbytes = t->nbytes;
    out->data = t->t.data;
    out->tensor = t->loadable ? &t->t : NULL;
    return TS_OK;
}
