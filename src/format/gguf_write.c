/* GGUF v3 writer: metadata is serialised as it is set, tensor infos at begin, tensor bytes
 * streamed with the alignment padding inserted between them, and the file appears under its name
 * only when complete (temp file + rename). */
#include "format/gguf_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/tensor_stream.h"

typedef struct {
    char *name;
    uint32_t ggml_type;
    int n_dims;
    uint64_t ne[TS_GGUF_MAX_DIMS];
    uint64_t nbytes, offset; /* offset relative to the data section */
} ggw_tensor;

enum { GGW_DECLARING, GGW_WRITING, GGW_DONE, GGW_FAILED };

struct ts_gguf_writer {
    uint32_t alignment;
    unsigned char *kv; /* the serialised kvs, in the order set */
    size_t kv_len, kv_cap;
    char **keys;
    uint64_t n_kv, cap_keys;
    ggw_tensor *t;
    size_t n, cap;
    uint64_t total; /* bytes of the data section, padding included */
    int state;
    ts_tstream out; /* the file, from begin */
};

static char *ggw_strdup(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

static uint64_t align_up(uint64_t x, uint32_t a) { return x + (a - x % a) % a; }

ts_status ts_gguf_writer_new(ts_gguf_writer **out, uint32_t alignment) {
    *out = NULL;
    if (alignment == 0) alignment = TS_GGUF_DEFAULT_ALIGNMENT;
    if ((alignment & (alignment - 1)) || alignment > GGUF_ALIGN_MAX)
        return ts_error(TS_ERR_INVALID,
                        "gguf writer: alignment %u is not a power of two in [1, %u]", alignment,
                        GGUF_ALIGN_MAX);
    ts_gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return ts_error(TS_ERR_NOMEM, "gguf writer: out of memory");
    w->alignment = alignment;
    *out = w;
    return TS_OK;
}

void ts_gguf_writer_free(ts_gguf_writer *w) {
    if (!w) return;
    ts_tstream_free(&w->out);
    for (uint64_t i = 0; i < w->n_kv; i++)
        free(w->keys[i]);
    free(w->keys);
    free(w->kv);
    for (size_t i = 0; i < w->n; i++)
        free(w->t[i].name);
    free(w->t);
    free(w);
}

/* ---- metadata ------------------------------------------------------------------------------ */

static ts_status put(ts_gguf_writer *w, const void *p, size_t n) {
    if (n > w->kv_cap - w->kv_len) {
        size_t nc = w->kv_cap ? w->kv_cap : 4096;
        while (n > nc - w->kv_len) {
            if (nc > SIZE_MAX / 2) return ts_error(TS_ERR_NOMEM, "gguf writer: out of memory");
            nc *= 2;
        }
        unsigned char *nb = realloc(w->kv, nc);
        if (!nb) return ts_error(TS_ERR_NOMEM, "gguf writer: out of memory");
        w->kv = nb;
        w->kv_cap = nc;
    }
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return TS_OK;
}

static ts_status put_le(ts_gguf_writer *w, uint64_t v, unsigned size) {
    unsigned char b[8];
    for (unsigned i = 0; i < size; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    return put(w, b, size);
}

static ts_status put_str(ts_gguf_writer *w, const char *s, size_t len) {
    TS_TRY(put_le(w, len, 8));
    return put(w, s, len);
}

/* Checks the key and writes it with the value type; the caller writes the value. On a failure
 * after this, the writer is marked failed (the buffer holds a partial kv). */
static ts_status begin_kv(ts_gguf_writer *w, const char *key, ts_gguf_type type) {
    if (w->state != GGW_DECLARING)
        return ts_error(TS_ERR_INVALID, "gguf writer: key '%s' set after begin or a failure", key);
    size_t kl = strlen(key);
    if (!gguf_key_ok((const unsigned char *)key, kl))
        return ts_error(TS_ERR_INVALID,
                        "gguf writer: invalid key '%s' (1-%u printable ASCII bytes, no spaces)",
                        key, GGUF_KEY_MAX);
    if (strcmp(key, GGUF_KEY_ALIGNMENT) == 0)
        return ts_error(TS_ERR_INVALID,
                        "gguf writer: '" GGUF_KEY_ALIGNMENT "' is set by ts_gguf_writer_new");
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0)
            return ts_error(TS_ERR_INVALID, "gguf writer: key '%s' set twice", key);
    if (w->n_kv == w->cap_keys) {
        uint64_t nc = w->cap_keys ? w->cap_keys * 2 : 32;
        char **nk = realloc(w->keys, (size_t)nc * sizeof *nk);
        if (!nk) return ts_error(TS_ERR_NOMEM, "gguf writer: out of memory");
        w->keys = nk;
        w->cap_keys = nc;
    }
    char *k = ggw_strdup(key, kl);
    if (!k) return ts_error(TS_ERR_NOMEM, "gguf writer: out of memory");
    w->keys[w->n_kv++] = k;
    ts_status rc = put_str(w, key, kl);
    if (rc == TS_OK) rc = put_le(w, (uint64_t)type, 4);
    if (rc != TS_OK) w->state = GGW_FAILED;
    return rc;
}

static ts_status kv_scalar(ts_gguf_writer *w, const char *key, ts_gguf_type type, uint64_t bits) {
    TS_TRY(begin_kv(w, key, type));
    ts_status rc = put_le(w, bits, gguf_scalar_size(type));
    if (rc != TS_OK) w->state = GGW_FAILED;
    return rc;
}

ts_status ts_gguf_writer_kv_u8(ts_gguf_writer *w, const char *key, uint8_t v) {
    return kv_scalar(w, key, TS_GGUF_U8, v);
}
ts_status ts_gguf_writer_kv_i8(ts_gguf_writer *w, const char *key, int8_t v) {
    return kv_scalar(w, key, TS_GGUF_I8, (uint64_t)(int64_t)v);
}
ts_status ts_gguf_writer_kv_u16(ts_gguf_writer *w, const char *key, uint16_t v) {
    return kv_scalar(w, key, TS_GGUF_U16, v);
}
ts_status ts_gguf_writer_kv_i16(ts_gguf_writer *w, const char *key, int16_t v) {
    return kv_scalar(w, key, TS_GGUF_I16, (uint64_t)(int64_t)v);
}
ts_status ts_gguf_writer_kv_u32(ts_gguf_writer *w, const char *key, uint32_t v) {
    return kv_scalar(w, key, TS_GGUF_U32, v);
}
ts_status ts_gguf_writer_kv_i32(ts_gguf_writer *w, const char *key, int32_t v) {
    return kv_scalar(w, key, TS_GGUF_I32, (uint64_t)(int64_t)v);
}
ts_status ts_gguf_writer_kv_u64(ts_gguf_writer *w, const char *key, uint64_t v) {
    return kv_scalar(w, key, TS_GGUF_U64, v);
}
ts_status ts_gguf_writer_kv_i64(ts_gguf_writer *w, const char *key, int64_t v) {
    return kv_scalar(w, key, TS_GGUF_I64, (uint64_t)v);
}
ts_status ts_gguf_writer_kv_f32(ts_gguf_writer *w, const char *key, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return kv_scalar(w, key, TS_GGUF_F32, u);
}
ts_status ts_gguf_writer_kv_f64(ts_gguf_writer *w, const char *key, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    return kv_scalar(w, key, TS_GGUF_F64, u);
}
ts_status ts_gguf_writer_kv_bool(ts_gguf_writer *w, const char *key, bool v) {
    return kv_scalar(w, key, TS_GGUF_BOOL, v ? 1 : 0);
}

ts_status ts_gguf_writer_kv_strn(ts_gguf_writer *w, const char *key, const char *s, size_t len) {
    TS_TRY(begin_kv(w, key, TS_GGUF_STR));
    ts_status rc = put_str(w, s, len);
    if (rc != TS_OK) w->state = GGW_FAILED;
    return rc;
}

ts_status ts_gguf_writer_kv_str(ts_gguf_writer *w, const char *key, const char *s) {
    return ts_gguf_writer_kv_strn(w, key, s, strlen(s));
}

/* The host value at p (of elem's C type) as little-endian bits. */
static uint64_t host_bits(const unsigned char *p, ts_gguf_type elem) {
    switch (elem) {
    case TS_GGUF_U8: return *p;
    case TS_GGUF_I8: return (uint64_t)(int64_t) * (const int8_t *)p;
    case TS_GGUF_BOOL: return *(const bool *)p ? 1 : 0;
    case TS_GGUF_U16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case TS_GGUF_I16: {
        int16_t v;
        memcpy(&v, p, 2);
        return (uint64_t)(int64_t)v;
    }
    case TS_GGUF_U32:
    case TS_GGUF_I32:
    case TS_GGUF_F32: {
        uint32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    default: {
        uint64_t v;
        memcpy(&v, p, 8);
        return v;
    }
    }
}

ts_status ts_gguf_writer_kv_arr(ts_gguf_writer *w, const char *key, ts_gguf_type elem,
                                const void *data, uint64_t n) {
    unsigned sz = gguf_scalar_size(elem);
    if (!sz)
        return ts_error(TS_ERR_INVALID,
                        "gguf writer: key '%s': %s is not a numeric or bool element type", key,
                        ts_gguf_type_name(elem));
    if (n && !data) return ts_error(TS_ERR_INVALID, "gguf writer: key '%s': no data", key);
    TS_TRY(begin_kv(w, key, TS_GGUF_ARR));
    ts_status rc = put_le(w, (uint64_t)elem, 4);
    if (rc == TS_OK) rc = put_le(w, n, 8);
    unsigned hsz = elem == TS_GGUF_BOOL ? (unsigned)sizeof(bool) : sz;
    const unsigned char *p = data;
    for (uint64_t i = 0; i < n && rc == TS_OK; i++)
        rc = put_le(w, host_bits(p + i * hsz, elem), sz);
    if (rc != TS_OK) w->state = GGW_FAILED;
    return rc;
}

ts_status ts_gguf_writer_kv_str_arr(ts_gguf_writer *w, const char *key, const char *const *items,
                                    const size_t *lens, uint64_t n) {
    if (n && !items) return ts_error(TS_ERR_INVALID, "gguf writer: key '%s': no items", key);
    TS_TRY(begin_kv(w, key, TS_GGUF_ARR));
    ts_status rc = put_le(w, TS_GGUF_STR, 4);
    if (rc == TS_OK) rc = put_le(w, n, 8);
    for (uint64_t i = 0; i < n && rc == TS_OK; i++)
        rc = put_str(w, items[i], lens ? lens[i] : strlen(items[i]));
    if (rc != TS_OK) w->state = GGW_FAILED;
    return rc;
}

/* ---- tensors ------------------------------------------------------------------------------- */

ts_status ts_gguf_writer_add_tensor_ggml(ts_gguf_writer *w, const char *name, uint32_t ggml_type,
                                         int n_dims, const int64_t *shape) {
    if (w->state != GGW_DECLARING)
        return ts_error(TS_ERR_INVALID, "gguf writer: tensor added after begin or a failure");
    size_t nl = name ? strlen(name) : 0;
    if (nl == 0 || nl > GGUF_NAME_MAX_WRITE)
        return ts_error(TS_ERR_INVALID, "gguf writer: tensor name '%s' is not 1..%u bytes",
                        name ? name : "(null)", GGUF_NAME_MAX_WRITE);
    const gguf_ggml_type *ti = gguf_ggml_type_info(ggml_type);
    if (!ti)
        return ts_error(TS_ERR_INVALID, "gguf writer: tensor '%s': unknown ggml type %u", name,
                        ggml_type);
    if (n_dims < 0 || n_dims > TS_GGUF_MAX_DIMS || (n_dims > 0 && !shape))
        return ts_error(TS_ERR_INVALID, "gguf writer: tensor '%s': %d dimensions (0..%d)", name,
                        n_dims, TS_GGUF_MAX_DIMS);
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return ts_error(TS_ERR_INVALID, "gguf writer: tensor '%s' declared twice", name);
    ggw_tensor t = {.ggml_type = ggml_type, .n_dims = n_dims};
    uint64_t elems = 1;
    for (int d = 0; d < TS_GGUF_MAX_DIMS; d++) {
        int64_t v = d < n_dims ? shape[n_dims - 1 - d] : 1; /* ne is innermost first */
        if (v < 0)
            return ts_error(TS_ERR_INVALID, "gguf writer: tensor '%s': dimension %d is %" PRId64,
                            name, n_dims - 1 - d, v);
        t.ne[d] = (uint64_t)v;
        if (v && elems > (uint64_t)INT64_MAX / (uint64_t)v)
            return ts_error(TS_ERR_INVALID, "gguf writer: tensor '%s': size overflows", name);
        elems *= (uint64_t)v;
    }
    if (t.ne[0] % (uint64_t)ti->block_elems)
        return ts_error(TS_ERR_INVALID,
                        "gguf writer: tensor '%s': innermost dimension %" PRIu64
                        " is not a multiple of the %s block size %d",
                        name, t.ne[0], ti->name, ti->block_elems);
    uint64_t blocks = elems / (uint64_t)ti->block_elems;
    if (blocks > (uint64_t)INT64_MAX / (uint64_t)ti->block_bytes)
        return ts_error(TS_ERR_INVALID, "gguf writer: tensor '%s': size overflows", name);
    t.nbytes = blocks * (uint64_t)ti->block_bytes;
    t.offset = align_up(w->total, w->alignment);
    if (t.offset > (uint64_t)INT64_MAX - w->alignment ||
        t.nbytes > (uint64_t)INT64_MAX - w->alignment - t.offset)
        return ts_error(TS_ERR_INVALID, "gguf writer: tensor '%s': file size overflows", name);
    if (w->n == w->cap) {
        size_t nc = w->cap ? w->cap * 2 : 64;
        ggw_tensor *nt = realloc(w->t, nc * sizeof *nt);
        if (!nt) return ts_error(TS_ERR_NOMEM, "gguf writer: out of memory");
        w->t = nt;
        w->cap = nc;
    }
    t.name = ggw_strdup(name, nl);
    if (!t.name) return ts_error(TS_ERR_NOMEM, "gguf writer: out of memory");
    w->t[w->n++] = t;
    w->total = t.offset + t.nbytes;
    return TS_OK;
}

ts_status ts_gguf_writer_add_tensor(ts_gguf_writer *w, const char *name, ts_dtype dtype, int n_dims,
                                    const int64_t *shape) {
    if ((unsigned)dtype >= TS_DTYPE_COUNT)
        return ts_error(TS_ERR_INVALID, "gguf writer: tensor '%s': invalid dtype %d",
                        name ? name : "(null)", (int)dtype);
    return ts_gguf_writer_add_tensor_ggml(w, name, ts_gguf_ggml_type_of(dtype), n_dims, shape);
}

/* ---- the file ------------------------------------------------------------------------------ */

/* The header and tensor infos, padded to the alignment, into a fresh buffer (reusing put). */
static ts_status write_header(ts_gguf_writer *w) {
    bool extra = w->alignment != TS_GGUF_DEFAULT_ALIGNMENT;
    unsigned char head[GGUF_HEADER_LEN] = {'G', 'G', 'U', 'F', 3};
    for (int i = 0; i < 8; i++) {
        head[8 + i] = (unsigned char)((uint64_t)w->n >> (8 * i));
        head[16 + i] = (unsigned char)((w->n_kv + extra) >> (8 * i));
    }
    uint64_t pos = sizeof head;
    TS_TRY(ts_tstream_put(&w->out, head, sizeof head, "header"));
    if (extra) {
        unsigned char a[8 + sizeof GGUF_KEY_ALIGNMENT - 1 + 8];
        size_t kl = sizeof GGUF_KEY_ALIGNMENT - 1, k = 0;
        for (int i = 0; i < 8; i++)
            a[k++] = (unsigned char)((uint64_t)kl >> (8 * i));
        memcpy(a + k, GGUF_KEY_ALIGNMENT, kl);
        k += kl;
        for (int i = 0; i < 4; i++)
            a[k++] = (unsigned char)((uint32_t)TS_GGUF_U32 >> (8 * i));
        for (int i = 0; i < 4; i++)
            a[k++] = (unsigned char)(w->alignment >> (8 * i));
        TS_TRY(ts_tstream_put(&w->out, a, k, "metadata"));
        pos += k;
    }
    TS_TRY(ts_tstream_put(&w->out, w->kv, w->kv_len, "metadata"));
    pos += w->kv_len;
    for (size_t i = 0; i < w->n; i++) {
        const ggw_tensor *t = &w->t[i];
        unsigned char b[8 + GGUF_NAME_MAX_WRITE + 4 + 8 * TS_GGUF_MAX_DIMS + 4 + 8];
        size_t k = 0, nl = strlen(t->name);
        for (int j = 0; j < 8; j++)
            b[k++] = (unsigned char)((uint64_t)nl >> (8 * j));
        memcpy(b + k, t->name, nl);
        k += nl;
        for (int j = 0; j < 4; j++)
            b[k++] = (unsigned char)((uint32_t)t->n_dims >> (8 * j));
        for (int d = 0; d < t->n_dims; d++)
            for (int j = 0; j < 8; j++)
                b[k++] = (unsigned char)(t->ne[d] >> (8 * j));
        for (int j = 0; j < 4; j++)
            b[k++] = (unsigned char)(t->ggml_type >> (8 * j));
        for (int j = 0; j < 8; j++)
            b[k++] = (unsigned char)(t->offset >> (8 * j));
        TS_TRY(ts_tstream_put(&w->out, b, k, "tensor infos"));
        pos += k;
    }
    return ts_tstream_zeros(&w->out, align_up(pos, w->alignment) - pos, "padding");
}

ts_status ts_gguf_writer_begin(ts_gguf_writer *w, const char *path) {
    if (w->state == GGW_FAILED)
        return ts_error(TS_ERR_INVALID, "gguf writer: an earlier call failed");
    if (w->state != GGW_DECLARING)
        return ts_error(TS_ERR_INVALID, "gguf writer: begin called twice");
    ts_tstream_tensor *ts = malloc((w->n ? w->n : 1) * sizeof *ts);
    if (!ts) return ts_error(TS_ERR_NOMEM, "gguf writer: out of memory");
    for (size_t i = 0; i < w->n; i++) ts[i] = (ts_tstream_tensor){w->t[i].name, w->t[i].nbytes};
    ts_status st = ts_tstream_open(&w->out, path, ts, w->n, w->alignment, "gguf writer");
    free(ts);
    if (st == TS_OK) st = write_header(w);
    w->state = st == TS_OK ? GGW_WRITING : GGW_FAILED;
    return st;
}

ts_status ts_gguf_writer_write(ts_gguf_writer *w, const void *data, size_t nbytes) {
    if (w->state != GGW_WRITING)
        return ts_error(TS_ERR_INVALID, "gguf writer: write outside begin/end");
    ts_status st = ts_tstream_write(&w->out, data, nbytes);
    if (st != TS_OK) w->state = GGW_FAILED;
    return st;
}

ts_status ts_gguf_writer_end(ts_gguf_writer *w) {
    if (w->state != GGW_WRITING) return ts_error(TS_ERR_INVALID, "gguf writer: end without begin");
    ts_status st = ts_tstream_end(&w->out);
    w->state = st == TS_OK ? GGW_DONE : GGW_FAILED;
    return st;
}
