/* GGUF internals shared by the reader (gguf_read.c), the metadata getters (gguf_meta.c) and the
 * writer (gguf_write.c). Not for use outside format/. */
#ifndef TS_FORMAT_GGUF_INT_H
#define TS_FORMAT_GGUF_INT_H

#include "base/mmapfile.h"
#include "format/gguf.h"

#include <stdint.h>
#include <string.h>

#define GGUF_MAGIC_LEN  4
#define GGUF_HEADER_LEN 24 /* magic, u32 version, u64 tensor count, u64 kv count */

/* Far above any real header (a 262k-token vocabulary with scores and types is ~10 MiB; an embedded
 * tokenizer.json adds tens more), yet small enough that a hostile count can never make the index
 * we build from it large. */
#define GGUF_META_CAP       ((uint64_t)128 << 20)
#define GGUF_KEY_MAX        65535u /* the spec's limit */
#define GGUF_NAME_MAX_READ  1024u  /* sanity cap; llama.cpp itself stops at 63 */
#define GGUF_NAME_MAX_WRITE 63u    /* what llama.cpp will load */
#define GGUF_ALIGN_MAX      (1u << 20)
/* The fewest bytes one kv (8-byte key length, 1-byte key, 4-byte type, 1-byte value) and one
 * tensor info (name length, 1-byte name, n_dims, type, offset) can take: counts are checked
 * against these before anything is allocated. */
#define GGUF_MIN_KV_BYTES     14u
#define GGUF_MIN_TENSOR_BYTES 25u

#define GGUF_KEY_ALIGNMENT "general.alignment"

/* One ggml tensor type: elements and bytes per block, and the ts_dtype (-1: not computed with). */
typedef struct {
    const char *name;
    int block_elems;
    int block_bytes;
    int dtype;
} gguf_ggml_type;

/* NULL when the id is unknown. */
const gguf_ggml_type *gguf_ggml_type_info(uint32_t id);

/* Size in bytes of a scalar wire type (0 for STRING, ARRAY and unknown types). */
static inline unsigned gguf_scalar_size(uint32_t t) {
    static const unsigned char sz[TS_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < TS_GGUF_TYPE_COUNT ? sz[t] : 0;
}

static inline uint64_t gguf_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static inline uint32_t gguf_le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* A printable-ASCII key without spaces (the spec asks for dotted lower_snake_case; we check only
 * what keeps messages and lookups sane). */
static inline int gguf_key_ok(const unsigned char *s, uint64_t len) {
    if (len == 0 || len > GGUF_KEY_MAX) return 0;
    for (uint64_t i = 0; i < len; i++)
        if (s[i] <= 0x20 || s[i] >= 0x7f) return 0;
    return 1;
}

typedef struct {
    const char *key;  /* NUL-terminated, in the names arena (set once parsing ends) */
    uint64_t key_off; /* its offset in the arena while the arena may still move */
    uint32_t type;    /* ts_gguf_type */
    uint32_t elem;    /* arrays: element type */
    uint64_t n;       /* arrays: count; strings: length; scalars: 1 */
    uint64_t at;      /* file offset of the kv (for messages) */
    uint64_t val;     /* file offset of the value payload (scalar, string bytes, array elements) */
    const char *str;  /* strings: NUL-terminated copy in the names arena */
    uint64_t str_off;
    uint64_t items; /* string arrays: first index into ts_gguf.items */
} gguf_kv;

typedef struct {
    const char *name; /* NUL-terminated, in the names arena */
    uint64_t name_off;
    uint32_t ggml_type;
    int n_dims;
    int64_t ne[TS_GGUF_MAX_DIMS];
    uint64_t at;     /* file offset of the tensor info */
    uint64_t offset; /* relative to the data section */
    uint64_t nbytes;
    bool loadable;
    ts_tensor t;
} gguf_tensor;

/* A name and its index, sorted by name for bsearch. */
typedef struct {
    const char *s;
    uint64_t i;
} gguf_ref;

struct ts_gguf {
    char *path;
    ts_mmap map;              /* owned mapping (ts_gguf_open); empty for open_buffer */
    const unsigned char *buf; /* the bytes read */
    uint64_t size;
    uint32_t version, alignment;
    uint64_t data_off;
    gguf_kv *kv;
    uint64_t n_kv;
    gguf_ref *kv_sorted;
    gguf_tensor *t;
    uint64_t n_t;
    gguf_ref *t_sorted;
    uint64_t *items; /* file offsets of every string-array item's bytes, all arrays concatenated */
    uint64_t n_items, cap_items;
    char *names; /* arena: keys, tensor names, top-level string values, each NUL-terminated */
    uint64_t names_len, names_cap;
};

/* Looks a key up; NULL when absent. */
const gguf_kv *gguf_lookup_kv(const ts_gguf *g, const char *key);
/* An integer scalar's value: returns 0 when kv is not of an integer type. *neg says whether it is
 * negative; *v holds the value (two's complement when negative). */
int gguf_kv_integer(const ts_gguf *g, const gguf_kv *kv, uint64_t *v, bool *neg);

#endif
