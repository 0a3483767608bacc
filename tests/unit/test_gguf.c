/* GGUF: writer -> reader round trip (every value type, every ts_dtype, byte-identical rewrite),
 * writer misuse, a corpus of hostile files built byte by byte (each refused with its own message),
 * every truncation of a valid file, and random single-byte mutations that must never crash.
 * Buffers handed to ts_gguf_open_buffer are exact-size heap copies, so an ASan build catches any
 * read past the end. */
#include "fixture_util.h"
#include "format/gguf.h"
#include "testutil.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[64];

static const char *tmp_path(const char *name) {
    static char buf[8][512];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", tmpdir, name);
    return p;
}

static bool has(const char *msg, const char *frag) { return !frag || strstr(msg, frag) != NULL; }

/* ---- a byte builder for hostile files ------------------------------------------------------ */

typedef tu_bytes buf;

static void b_raw(buf *b, const void *p, size_t n) { tu_put(b, p, n); }

static void b_le(buf *b, uint64_t v, int size) {
    unsigned char x[8];
    for (int i = 0; i < size; i++)
        x[i] = (unsigned char)(v >> (8 * i));
    b_raw(b, x, (size_t)size);
}
static void b_u32(buf *b, uint32_t v) { b_le(b, v, 4); }
static void b_u64(buf *b, uint64_t v) { b_le(b, v, 8); }
static void b_str(buf *b, const char *s) {
    b_u64(b, strlen(s));
    b_raw(b, s, strlen(s));
}
static void b_zeros(buf *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        b_le(b, 0, 1);
}
static void b_pad(buf *b, size_t align) {
    while (b->n % align)
        b_le(b, 0, 1);
}
static buf b_header(uint32_t version, uint64_t n_t, uint64_t n_kv) {
    buf b = {0};
    b_raw(&b, "GGUF", 4);
    b_u32(&b, version);
    b_u64(&b, n_t);
    b_u64(&b, n_kv);
    return b;
}
static void b_kv_u32(buf *b, const char *key, uint32_t v) {
    b_str(b, key);
    b_u32(b, TS_GGUF_U32);
    b_u32(b, v);
}
static void b_tensor(buf *b, const char *name, uint32_t nd, const uint64_t *ne, uint32_t type,
                     uint64_t off) {
    b_str(b, name);
    b_u32(b, nd);
    for (uint32_t i = 0; i < nd; i++)
        b_u64(b, ne[i]);
    b_u32(b, type);
    b_u64(b, off);
}

/* Opens an exact-size copy of data. */
static ts_status open_copy(const unsigned char *data, size_t n, const char *name, ts_gguf **g,
                           unsigned char **copy) {
    *copy = malloc(n ? n : 1);
    if (n) memcpy(*copy, data, n);
    return ts_gguf_open_buffer(*copy, n, name, g);
}

static void expect_refused(const char *what, buf *b, ts_status code, const char *f1,
                           const char *f2) {
    ts_gguf *g = NULL;
    unsigned char *copy;
    ts_status rc = open_copy(b->p, b->n, "hostile.gguf", &g, &copy);
    const char *msg = rc == TS_OK ? "opened" : ts_last_error();
    CHECKF(rc == code, "%s: status %s, expected %s (%s)", what, ts_status_name(rc),
           ts_status_name(code), msg);
    if (rc != TS_OK)
        CHECKF(has(msg, "hostile.gguf") && has(msg, f1) && has(msg, f2),
               "%s: message '%s' lacks '%s' / '%s'", what, msg, f1 ? f1 : "", f2 ? f2 : "");
    CHECK(rc == TS_OK || g == NULL);
    ts_gguf_close(g);
    free(copy);
    free(b->p);
    b->p = NULL;
}

static ts_gguf *expect_ok(const char *what, buf *b, unsigned char **copy) {
    ts_gguf *g = NULL;
    ts_status rc = open_copy(b->p, b->n, "ok.gguf", &g, copy);
    CHECKF(rc == TS_OK, "%s: refused: %s", what, ts_last_error());
    return g;
}

/* ---- round trip ---------------------------------------------------------------------------- */

static const ts_dtype all_dtypes[] = {TS_DTYPE_F32,  TS_DTYPE_F16,  TS_DTYPE_BF16, TS_DTYPE_Q8_0,
                                      TS_DTYPE_Q4_0, TS_DTYPE_Q5_0, TS_DTYPE_Q4_K, TS_DTYPE_Q6_K};
#define N_DTYPES (sizeof all_dtypes / sizeof all_dtypes[0])

typedef struct {
    const char *name;
    ts_dtype dtype;
    uint32_t ggml; /* used when dtype is TS_DTYPE_COUNT */
    int n_dims;
    int64_t shape[4];
    uint64_t nbytes;
} spec_tensor;

static spec_tensor specs[16];
static int n_specs;

static void add_spec(const char *name, ts_dtype dt, uint32_t ggml, int nd, int64_t a, int64_t b,
                     int64_t c, uint64_t nbytes) {
    spec_tensor s = {name, dt, ggml, nd, {a, b, c, 1}, nbytes};
    specs[n_specs++] = s;
}

static void make_specs(void) {
    n_specs = 0;
    add_spec("f32.weight", TS_DTYPE_F32, 0, 2, 3, 5, 0, 60);
    add_spec("f16.weight", TS_DTYPE_F16, 0, 2, 2, 7, 0, 28);
    add_spec("bf16.weight", TS_DTYPE_BF16, 0, 1, 9, 0, 0, 18);
    add_spec("q8_0.weight", TS_DTYPE_Q8_0, 0, 2, 2, 64, 0, 2 * 2 * 34);
    add_spec("q4_0.weight", TS_DTYPE_Q4_0, 0, 2, 3, 32, 0, 3 * 18);
    add_spec("q5_0.weight", TS_DTYPE_Q5_0, 0, 2, 2, 64, 0, 2 * 2 * 22);
    add_spec("q4_k.weight", TS_DTYPE_Q4_K, 0, 2, 2, 256, 0, 2 * 144);
    add_spec("q6_k.weight", TS_DTYPE_Q6_K, 0, 2, 1, 512, 0, 2 * 210);
    add_spec("cube", TS_DTYPE_F32, 0, 3, 2, 3, 4, 96);
    add_spec("empty", TS_DTYPE_F32, 0, 2, 0, 32, 0, 0);
    add_spec("scalar", TS_DTYPE_F32, 0, 0, 0, 0, 0, 4);
    add_spec("q5_k.weight", TS_DTYPE_COUNT, 13, 2, 2, 256, 0, 2 * 176);
}

static unsigned char pattern(size_t t, uint64_t i) { return (unsigned char)(t * 31 + i * 7 + 1); }

static const char *const str_items[] = {"hello", "", "w\xc3\xb6rld", "a b", "tok\nen"};
static const size_t str_lens[] = {5, 0, 6, 3, 6};

static void write_sample(const char *path, uint32_t alignment) {
    ts_gguf_writer *w;
    CHECK(ts_gguf_writer_new(&w, alignment) == TS_OK);
    CHECK(ts_gguf_writer_kv_str(w, "general.architecture", "test") == TS_OK);
    CHECK(ts_gguf_writer_kv_u8(w, "v.u8", 200) == TS_OK);
    CHECK(ts_gguf_writer_kv_i8(w, "v.i8", -100) == TS_OK);
    CHECK(ts_gguf_writer_kv_u16(w, "v.u16", 60000) == TS_OK);
    CHECK(ts_gguf_writer_kv_i16(w, "v.i16", -30000) == TS_OK);
    CHECK(ts_gguf_writer_kv_u32(w, "v.u32", 4000000000u) == TS_OK);
    CHECK(ts_gguf_writer_kv_i32(w, "v.i32", -2000000000) == TS_OK);
    CHECK(ts_gguf_writer_kv_u64(w, "v.u64", UINT64_MAX - 5) == TS_OK);
    CHECK(ts_gguf_writer_kv_i64(w, "v.i64", INT64_MIN + 7) == TS_OK);
    CHECK(ts_gguf_writer_kv_f32(w, "v.f32", 1e-6f) == TS_OK);
    CHECK(ts_gguf_writer_kv_f64(w, "v.f64", 10000.0) == TS_OK);
    CHECK(ts_gguf_writer_kv_bool(w, "v.bool", true) == TS_OK);
    CHECK(ts_gguf_writer_kv_strn(w, "v.nul", "a\0b", 3) == TS_OK);
    CHECK(ts_gguf_writer_kv_str(w, "v.empty", "") == TS_OK);
    uint8_t a8[] = {1, 2, 255};
    int8_t ai8[] = {-1, 0, 127};
    uint16_t a16[] = {1, 65535};
    int16_t ai16[] = {-32768, 5};
    uint32_t a32[] = {7, 8, 9, 4000000000u};
    int32_t ai32[] = {1, 2, 3, -4, 6};
    uint64_t a64[] = {UINT64_MAX};
    int64_t ai64[] = {-3, 1LL << 40};
    float af[] = {0.5f, -1.25f, 3e38f};
    double ad[] = {1.0 / 3.0, -2.0};
    bool ab[] = {true, false, true};
    CHECK(ts_gguf_writer_kv_arr(w, "a.u8", TS_GGUF_U8, a8, 3) == TS_OK);
    CHECK(ts_gguf_writer_kv_arr(w, "a.i8", TS_GGUF_I8, ai8, 3) == TS_OK);
    CHECK(ts_gguf_writer_kv_arr(w, "a.u16", TS_GGUF_U16, a16, 2) == TS_OK);
    CHECK(ts_gguf_writer_kv_arr(w, "a.i16", TS_GGUF_I16, ai16, 2) == TS_OK);
    CHECK(ts_gguf_writer_kv_arr(w, "a.u32", TS_GGUF_U32, a32, 4) == TS_OK);
    CHECK(ts_gguf_writer_kv_arr(w, "a.i32", TS_GGUF_I32, ai32, 5) == TS_OK);
    CHECK(ts_gguf_writer_kv_arr(w, "a.u64", TS_GGUF_U64, a64, 1) == TS_OK);
    CHECK(ts_gguf_writer_kv_arr(w, "a.i64", TS_GGUF_I64, ai64, 2) == TS_OK);
    CHECK(ts_gguf_writer_kv_arr(w, "a.f32", TS_GGUF_F32, af, 3) == TS_OK);
    CHECK(ts_gguf_writer_kv_arr(w, "a.f64", TS_GGUF_F64, ad, 2) == TS_OK);
    CHECK(ts_gguf_writer_kv_arr(w, "a.bool", TS_GGUF_BOOL, ab, 3) == TS_OK);
    CHECK(ts_gguf_writer_kv_arr(w, "a.none", TS_GGUF_I32, NULL, 0) == TS_OK);
    CHECK(ts_gguf_writer_kv_str_arr(w, "a.str", str_items, str_lens, 5) == TS_OK);
    const char *const merges[] = {"a b", "c d", "ab cd"};
    CHECK(ts_gguf_writer_kv_str_arr(w, "a.str2", merges, NULL, 3) == TS_OK);

    make_specs();
    for (int i = 0; i < n_specs; i++) {
        const spec_tensor *s = &specs[i];
        ts_status rc =
            s->dtype == TS_DTYPE_COUNT
                ? ts_gguf_writer_add_tensor_ggml(w, s->name, s->ggml, s->n_dims, s->shape)
                : ts_gguf_writer_add_tensor(w, s->name, s->dtype, s->n_dims, s->shape);
        CHECKF(rc == TS_OK, "add %s: %s", s->name, ts_last_error());
    }
    CHECKF(ts_gguf_writer_begin(w, path) == TS_OK, "%s", ts_last_error());
    /* Stream in odd-sized pieces so writes span tensors. */
    unsigned char chunk[37];
    size_t k = 0;
    for (int i = 0; i < n_specs; i++)
        for (uint64_t j = 0; j < specs[i].nbytes; j++) {
            chunk[k++] = pattern((size_t)i, j);
            if (k == sizeof chunk) {
                CHECK(ts_gguf_writer_write(w, chunk, k) == TS_OK);
                k = 0;
            }
        }
    CHECK(ts_gguf_writer_write(w, chunk, k) == TS_OK);
    CHECKF(ts_gguf_writer_end(w) == TS_OK, "%s", ts_last_error());
    ts_gguf_writer_free(w);
}

static void check_values(const ts_gguf *g) {
    const char *s;
    size_t len;
    CHECK(ts_gguf_get_str(g, "general.architecture", &s, &len) == TS_OK && len == 4 &&
          strcmp(s, "test") == 0);
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    int64_t i64;
    float f;
    double d;
    bool bv;
    CHECK(ts_gguf_get_u32(g, "v.u8", &u32) == TS_OK && u32 == 200);
    CHECK(ts_gguf_get_i32(g, "v.i8", &i32) == TS_OK && i32 == -100);
    CHECK(ts_gguf_get_u32(g, "v.u16", &u32) == TS_OK && u32 == 60000);
    CHECK(ts_gguf_get_i32(g, "v.i16", &i32) == TS_OK && i32 == -30000);
    CHECK(ts_gguf_get_u32(g, "v.u32", &u32) == TS_OK && u32 == 4000000000u);
    CHECK(ts_gguf_get_i32(g, "v.i32", &i32) == TS_OK && i32 == -2000000000);
    CHECK(ts_gguf_get_u64(g, "v.u64", &u64) == TS_OK && u64 == UINT64_MAX - 5);
    CHECK(ts_gguf_get_i64(g, "v.i64", &i64) == TS_OK && i64 == INT64_MIN + 7);
    CHECK(ts_gguf_get_i64(g, "v.u32", &i64) == TS_OK && i64 == 4000000000LL);
    CHECK(ts_gguf_get_f32(g, "v.f32", &f) == TS_OK && f == 1e-6f);
    CHECK(ts_gguf_get_f64(g, "v.f64", &d) == TS_OK && d == 10000.0);
    CHECK(ts_gguf_get_f32(g, "v.f64", &f) == TS_OK && f == 10000.0f);
    CHECK(ts_gguf_get_bool(g, "v.bool", &bv) == TS_OK && bv);
    CHECK(ts_gguf_get_str(g, "v.empty", &s, &len) == TS_OK && len == 0 && s[0] == 0);

    /* Typed errors name the file and key. */
    CHECK(ts_gguf_get_u32(g, "v.i8", &u32) == TS_ERR_FORMAT && has(ts_last_error(), "'v.i8'") &&
          has(ts_last_error(), "out of range"));
    CHECK(ts_gguf_get_i32(g, "v.u32", &i32) == TS_ERR_FORMAT && has(ts_last_error(), "range"));
    CHECK(ts_gguf_get_u32(g, "v.u64", &u32) == TS_ERR_FORMAT);
    CHECK(ts_gguf_get_u32(g, "v.f32", &u32) == TS_ERR_FORMAT &&
          has(ts_last_error(), "expected an integer, got FLOAT32"));
    CHECK(ts_gguf_get_f32(g, "v.u8", &f) == TS_ERR_FORMAT);
    CHECK(ts_gguf_get_bool(g, "v.u8", &bv) == TS_ERR_FORMAT);
    CHECK(ts_gguf_get_str(g, "v.u8", &s, NULL) == TS_ERR_FORMAT &&
          has(ts_last_error(), "expected STRING, got UINT8"));
    CHECK(ts_gguf_get_str(g, "v.nul", &s, NULL) == TS_ERR_FORMAT && has(ts_last_error(), "NUL"));
    CHECK(ts_gguf_get_u32(g, "no.such.key", &u32) == TS_ERR_FORMAT &&
          has(ts_last_error(), "'no.such.key': missing") && has(ts_last_error(), ts_gguf_path(g)));
    CHECK(ts_gguf_get_u32_opt(g, "no.such.key", 17, &u32) == TS_OK && u32 == 17);
    CHECK(ts_gguf_get_u32_opt(g, "v.u16", 17, &u32) == TS_OK && u32 == 60000);
    CHECK(ts_gguf_get_u32_opt(g, "v.f32", 17, &u32) == TS_ERR_FORMAT);
    CHECK(ts_gguf_get_f32_opt(g, "nope", 2.5f, &f) == TS_OK && f == 2.5f);
    CHECK(ts_gguf_get_bool_opt(g, "nope", true, &bv) == TS_OK && bv);
    CHECK(ts_gguf_get_str_opt(g, "nope", "dflt", &s) == TS_OK && strcmp(s, "dflt") == 0);
    CHECK(ts_gguf_get_str_opt(g, "v.u8", "dflt", &s) == TS_ERR_FORMAT);

    /* The raw value of the NUL string is whole. */
    ts_gguf_value v;
    int64_t ki = ts_gguf_find_key(g, "v.nul");
    CHECK(ki >= 0 && ts_gguf_kv_value(g, ki, &v) == TS_OK && v.type == TS_GGUF_STR && v.n == 3 &&
          memcmp(v.data, "a\0b", 3) == 0);
    CHECK(ts_gguf_find_key(g, "nope") == -1);
    CHECK(ts_gguf_kv_key(g, -1) == NULL && ts_gguf_kv_type(g, 1000) == TS_GGUF_TYPE_COUNT);

    /* Arrays. */
    ts_gguf_type et;
    uint64_t n;
    const void *data;
    CHECK(ts_gguf_get_arr(g, "a.u16", &et, &n, &data) == TS_OK && et == TS_GGUF_U16 && n == 2);
    uint16_t r16[2];
    memcpy(r16, data, 4);
    CHECK(r16[0] == 1 && r16[1] == 65535);
    CHECK(ts_gguf_get_arr(g, "a.f64", &et, &n, &data) == TS_OK && et == TS_GGUF_F64 && n == 2);
    double rd[2];
    memcpy(rd, data, 16);
    CHECK(rd[0] == 1.0 / 3.0 && rd[1] == -2.0);
    CHECK(ts_gguf_get_arr(g, "a.bool", &et, &n, &data) == TS_OK && et == TS_GGUF_BOOL && n == 3 &&
          memcmp(data, "\1\0\1", 3) == 0);
    CHECK(ts_gguf_get_arr(g, "a.str", &et, &n, &data) == TS_OK && et == TS_GGUF_STR && n == 5 &&
          data == NULL);
    int32_t ri[8];
    CHECK(ts_gguf_get_arr_i32(g, "a.i32", ri, 8, &n) == TS_OK && n == 5 && ri[3] == -4);
    CHECK(ts_gguf_get_arr_i32(g, "a.i8", ri, 2, &n) == TS_OK && n == 3 && ri[0] == -1);
    CHECK(ts_gguf_get_arr_i32(g, "a.u16", ri, 8, &n) == TS_OK && ri[1] == 65535);
    CHECK(ts_gguf_get_arr_i32(g, "a.u32", ri, 2, &n) == TS_ERR_FORMAT &&
          has(ts_last_error(), "item 3") && has(ts_last_error(), "int32"));
    CHECK(ts_gguf_get_arr_i32(g, "a.f32", ri, 8, &n) == TS_ERR_FORMAT &&
          has(ts_last_error(), "array of FLOAT32"));
    CHECK(ts_gguf_get_arr_i32(g, "a.none", NULL, 0, &n) == TS_OK && n == 0);
    float rf[3];
    CHECK(ts_gguf_get_arr_f32(g, "a.f32", rf, 3, &n) == TS_OK && n == 3 && rf[1] == -1.25f &&
          rf[2] == 3e38f);
    CHECK(ts_gguf_get_arr_f32(g, "a.f64", rf, 3, &n) == TS_OK && rf[1] == -2.0f);
    CHECK(ts_gguf_get_arr_f32(g, "a.i32", rf, 3, &n) == TS_ERR_FORMAT);
    CHECK(ts_gguf_get_arr(g, "v.u8", &et, &n, &data) == TS_ERR_FORMAT &&
          has(ts_last_error(), "expected ARRAY"));
    uint64_t items;
    for (uint64_t i = 0; i < 5; i++) {
        CHECK(ts_gguf_get_str_arr_item(g, "a.str", i, &s, &len, &items) == TS_OK && items == 5 &&
              len == str_lens[i] && memcmp(s, str_items[i], len) == 0);
    }
    CHECK(ts_gguf_get_str_arr_item(g, "a.str", 5, &s, &len, NULL) == TS_ERR_RANGE);
    CHECK(ts_gguf_get_str_arr_item(g, "a.str2", 2, &s, &len, &items) == TS_OK && items == 3 &&
          len == 5 && memcmp(s, "ab cd", 5) == 0);
    CHECK(ts_gguf_get_str_arr_item(g, "a.str2", 0, &s, &len, &items) == TS_OK && len == 3 &&
          memcmp(s, "a b", 3) == 0);
    CHECK(ts_gguf_get_str_arr_item(g, "a.u8", 0, &s, &len, NULL) == TS_ERR_FORMAT &&
          has(ts_last_error(), "array of strings"));
}

static void check_tensors(const ts_gguf *g, uint32_t alignment) {
    CHECK(ts_gguf_n_tensors(g) == (size_t)n_specs);
    for (int i = 0; i < n_specs; i++) {
        const spec_tensor *s = &specs[i];
        CHECK(strcmp(ts_gguf_tensor_name(g, (size_t)i), s->name) == 0);
        ts_gguf_tensor_info info;
        CHECK(ts_gguf_tensor_info_at(g, (size_t)i, &info) == TS_OK);
        CHECK(info.offset % alignment == 0 && info.nbytes == s->nbytes);
        CHECK(info.n_dims == s->n_dims);
        for (int d = 0; d < s->n_dims; d++)
            CHECK(info.ne[d] == s->shape[s->n_dims - 1 - d]);
        const ts_tensor *t;
        ts_status rc = ts_gguf_tensor(g, s->name, &t);
        if (s->dtype == TS_DTYPE_COUNT) {
            CHECKF(rc == TS_ERR_UNSUPPORTED && has(ts_last_error(), s->name) &&
                       has(ts_last_error(), "Q5_K"),
                   "%s: %s", s->name, ts_last_error());
            CHECK(ts_gguf_find(g, s->name) == NULL && info.tensor == NULL);
            CHECK(strcmp(info.type_name, "Q5_K") == 0);
            continue;
        }
        CHECKF(rc == TS_OK, "%s: %s", s->name, ts_last_error());
        if (rc != TS_OK) continue;
        CHECK(ts_gguf_find(g, s->name) == t && info.tensor == t);
        CHECK(t->dtype == s->dtype && t->n_dims == s->n_dims && t->nbytes == s->nbytes);
        for (int d = 0; d < s->n_dims; d++)
            CHECK(t->shape[d] == s->shape[d]);
        if (s->n_dims >= 1 && s->nbytes)
            CHECK(ts_dtype_row_bytes(t->dtype, ts_tensor_cols(t)) * (uint64_t)ts_tensor_rows(t) ==
                  t->nbytes);
        bool same = true;
        for (uint64_t j = 0; j < s->nbytes; j++)
            same &= ((const unsigned char *)t->data)[j] == pattern((size_t)i, j);
        CHECKF(same, "%s: data differs", s->name);
    }
    const ts_tensor *t;
    CHECK(ts_gguf_tensor(g, "absent", &t) == TS_ERR_FORMAT && has(ts_last_error(), "missing"));
    CHECK(ts_gguf_find(g, "absent") == NULL && ts_gguf_tensor_name(g, 99) == NULL);
}

static size_t wire_size(ts_gguf_type t) {
    switch (t) {
    case TS_GGUF_U8:
    case TS_GGUF_I8:
    case TS_GGUF_BOOL: return 1;
    case TS_GGUF_U16:
    case TS_GGUF_I16: return 2;
    case TS_GGUF_U32:
    case TS_GGUF_I32:
    case TS_GGUF_F32: return 4;
    default: return 8;
    }
}

/* Rewrites everything the reader sees through the writer; the bytes must come out identical. */
static void rewrite(const ts_gguf *g, const char *path) {
    ts_gguf_writer *w;
    CHECK(ts_gguf_writer_new(&w, ts_gguf_alignment(g)) == TS_OK);
    for (size_t i = 0; i < ts_gguf_n_kv(g); i++) {
        const char *key = ts_gguf_kv_key(g, (int64_t)i);
        if (strcmp(key, "general.alignment") == 0) continue;
        ts_gguf_value v;
        CHECK(ts_gguf_kv_value(g, (int64_t)i, &v) == TS_OK);
        unsigned char raw[8] = {0};
        ts_status rc = TS_OK;
        if (v.type == TS_GGUF_STR) {
            rc = ts_gguf_writer_kv_strn(w, key, v.data, (size_t)v.n);
        } else if (v.type == TS_GGUF_ARR && v.elem == TS_GGUF_STR) {
            const char **it = malloc((size_t)v.n * sizeof *it + 1);
            size_t *ln = malloc((size_t)v.n * sizeof *ln + 1);
            for (uint64_t j = 0; j < v.n; j++)
                CHECK(ts_gguf_kv_str_item(g, (int64_t)i, j, &it[j], &ln[j]) == TS_OK);
            rc = ts_gguf_writer_kv_str_arr(w, key, it, ln, v.n);
            free(it);
            free(ln);
        } else if (v.type == TS_GGUF_ARR) {
            size_t sz = wire_size(v.elem);
            void *copy = malloc((size_t)v.n * sz + 1);
            if (v.n) memcpy(copy, v.data, (size_t)v.n * sz); /* little-endian host */
            rc = ts_gguf_writer_kv_arr(w, key, v.elem, copy, v.n);
            free(copy);
        } else {
            memcpy(raw, v.data, wire_size(v.type));
            uint64_t u;
            memcpy(&u, raw, 8);
            float fv;
            double dv;
            memcpy(&fv, raw, 4);
            memcpy(&dv, raw, 8);
            switch (v.type) {
            case TS_GGUF_U8: rc = ts_gguf_writer_kv_u8(w, key, (uint8_t)u); break;
            case TS_GGUF_I8: rc = ts_gguf_writer_kv_i8(w, key, (int8_t)u); break;
            case TS_GGUF_U16: rc = ts_gguf_writer_kv_u16(w, key, (uint16_t)u); break;
            case TS_GGUF_I16: rc = ts_gguf_writer_kv_i16(w, key, (int16_t)u); break;
            case TS_GGUF_U32: rc = ts_gguf_writer_kv_u32(w, key, (uint32_t)u); break;
            case TS_GGUF_I32: rc = ts_gguf_writer_kv_i32(w, key, (int32_t)u); break;
            case TS_GGUF_U64: rc = ts_gguf_writer_kv_u64(w, key, u); break;
            case TS_GGUF_I64: rc = ts_gguf_writer_kv_i64(w, key, (int64_t)u); break;
            case TS_GGUF_F32: rc = ts_gguf_writer_kv_f32(w, key, fv); break;
            case TS_GGUF_F64: rc = ts_gguf_writer_kv_f64(w, key, dv); break;
            case TS_GGUF_BOOL: rc = ts_gguf_writer_kv_bool(w, key, u != 0); break;
            default: rc = TS_ERR_INVALID;
            }
        }
        CHECKF(rc == TS_OK, "rewrite %s: %s", key, ts_last_error());
    }
    for (size_t i = 0; i < ts_gguf_n_tensors(g); i++) {
        ts_gguf_tensor_info info;
        CHECK(ts_gguf_tensor_info_at(g, i, &info) == TS_OK);
        int64_t shape[4];
        for (int d = 0; d < info.n_dims; d++)
            shape[d] = info.ne[info.n_dims - 1 - d];
        CHECK(ts_gguf_writer_add_tensor_ggml(w, info.name, info.ggml_type, info.n_dims, shape) ==
              TS_OK);
    }
    CHECK(ts_gguf_writer_begin(w, path) == TS_OK);
    for (size_t i = 0; i < ts_gguf_n_tensors(g); i++) {
        ts_gguf_tensor_info info;
        ts_gguf_tensor_info_at(g, i, &info);
        CHECK(info.data != NULL);
        CHECK(ts_gguf_writer_write(w, info.data, (size_t)info.nbytes) == TS_OK);
    }
    CHECKF(ts_gguf_writer_end(w) == TS_OK, "%s", ts_last_error());
    ts_gguf_writer_free(w);
}

static void test_round_trip(uint32_t alignment) {
    const char *p1 = tmp_path(alignment == 32 ? "a.gguf" : "b.gguf");
    const char *p2 = tmp_path(alignment == 32 ? "a2.gguf" : "b2.gguf");
    write_sample(p1, alignment);
    CHECK(access(tmp_path(alignment == 32 ? "a.gguf.tmp" : "b.gguf.tmp"), F_OK) != 0);
    ts_gguf *g;
    ts_status rc = ts_gguf_open(p1, &g);
    CHECKF(rc == TS_OK, "open: %s", ts_last_error());
    if (rc != TS_OK) return;
    CHECK(ts_gguf_version(g) == 3 && ts_gguf_alignment(g) == alignment);
    CHECK(ts_gguf_data_offset(g) % alignment == 0);
    CHECK(ts_gguf_has(g, "general.alignment") == (alignment != 32));
    CHECK(ts_gguf_n_kv(g) == 28u + (alignment != 32));
    check_values(g);
    check_tensors(g, alignment);
    /* Every ts_dtype is in the sample, and maps to a ggml type and back. */
    CHECK(N_DTYPES == TS_DTYPE_COUNT);
    for (size_t i = 0; i < N_DTYPES; i++) {
        bool found = false;
        for (int k = 0; k < n_specs; k++)
            found |= specs[k].dtype == all_dtypes[i];
        CHECKF(found, "dtype %s missing from the sample", ts_dtype_name(all_dtypes[i]));
        const char *gn = ts_gguf_ggml_type_name(ts_gguf_ggml_type_of(all_dtypes[i]));
        CHECK(gn && strcmp(gn, ts_dtype_name(all_dtypes[i])) == 0);
    }
    rewrite(g, p2);
    ts_gguf_close(g);
    size_t n1, n2;
    unsigned char *b1 = fx_read_file(p1, &n1), *b2 = fx_read_file(p2, &n2);
    CHECKF(b1 && b2 && n1 == n2 && memcmp(b1, b2, n1) == 0, "rewrite of %s differs", p1);
    /* The file ends at an alignment boundary (the last tensor is padded too). */
    CHECK(n1 % alignment == 0);
    free(b1);
    free(b2);
}

/* ---- writer misuse ------------------------------------------------------------------------- */

static void test_writer_errors(void) {
    ts_gguf_writer *w;
    CHECK(ts_gguf_writer_new(&w, 48) == TS_ERR_INVALID && has(ts_last_error(), "power of two"));
    CHECK(ts_gguf_writer_new(&w, 1u << 21) == TS_ERR_INVALID);
    CHECK(ts_gguf_writer_new(&w, 0) == TS_OK);
    CHECK(ts_gguf_writer_kv_u32(w, "a", 1) == TS_OK);
    CHECK(ts_gguf_writer_kv_u32(w, "a", 2) == TS_ERR_INVALID && has(ts_last_error(), "twice"));
    CHECK(ts_gguf_writer_kv_u32(w, "has space", 2) == TS_ERR_INVALID);
    CHECK(ts_gguf_writer_kv_u32(w, "", 2) == TS_ERR_INVALID);
    CHECK(ts_gguf_writer_kv_u32(w, "general.alignment", 64) == TS_ERR_INVALID);
    CHECK(ts_gguf_writer_kv_arr(w, "s", TS_GGUF_STR, "x", 1) == TS_ERR_INVALID);
    int64_t sh[2] = {2, 100};
    CHECK(ts_gguf_writer_add_tensor(w, "q", TS_DTYPE_Q4_K, 2, sh) == TS_ERR_INVALID &&
          has(ts_last_error(), "block size 256"));
    char longname[80];
    memset(longname, 'n', 64);
    longname[64] = 0;
    int64_t sh1[1] = {4};
    CHECK(ts_gguf_writer_add_tensor(w, longname, TS_DTYPE_F32, 1, sh1) == TS_ERR_INVALID);
    longname[63] = 0;
    CHECK(ts_gguf_writer_add_tensor(w, longname, TS_DTYPE_F32, 1, sh1) == TS_OK);
    CHECK(ts_gguf_writer_add_tensor(w, longname, TS_DTYPE_F32, 1, sh1) == TS_ERR_INVALID);
    CHECK(ts_gguf_writer_add_tensor(w, "five", TS_DTYPE_F32, 5, sh1) == TS_ERR_INVALID);
    int64_t neg[1] = {-1};
    CHECK(ts_gguf_writer_add_tensor(w, "neg", TS_DTYPE_F32, 1, neg) == TS_ERR_INVALID);
    CHECK(ts_gguf_writer_add_tensor_ggml(w, "odd", 77, 1, sh1) == TS_ERR_INVALID);
    CHECK(ts_gguf_writer_write(w, "x", 1) == TS_ERR_INVALID);
    const char *p = tmp_path("short.gguf");
    CHECK(ts_gguf_writer_begin(w, p) == TS_OK);
    CHECK(ts_gguf_writer_kv_u32(w, "late", 1) == TS_ERR_INVALID);
    CHECK(ts_gguf_writer_write(w, "abc", 3) == TS_OK);
    CHECK(ts_gguf_writer_end(w) == TS_ERR_INVALID && has(ts_last_error(), "only 3 of 16"));
    CHECK(access(p, F_OK) != 0 && access(tmp_path("short.gguf.tmp"), F_OK) != 0);
    ts_gguf_writer_free(w);

    /* Too many bytes; then free before end removes the temp file. */
    CHECK(ts_gguf_writer_new(&w, 0) == TS_OK);
    CHECK(ts_gguf_writer_add_tensor(w, "t", TS_DTYPE_F32, 1, sh1) == TS_OK);
    CHECK(ts_gguf_writer_begin(w, p) == TS_OK);
    unsigned char z[20] = {0};
    CHECK(ts_gguf_writer_write(w, z, 20) == TS_ERR_INVALID && has(ts_last_error(), "beyond"));
    CHECK(access(tmp_path("short.gguf.tmp"), F_OK) != 0);
    ts_gguf_writer_free(w);
    CHECK(ts_gguf_writer_new(&w, 0) == TS_OK);
    CHECK(ts_gguf_writer_begin(w, p) == TS_OK);
    CHECK(access(tmp_path("short.gguf.tmp"), F_OK) == 0);
    ts_gguf_writer_free(w);
    CHECK(access(tmp_path("short.gguf.tmp"), F_OK) != 0 && access(p, F_OK) != 0);

    /* No tensors, no keys: the 24-byte header, padded to the alignment. */
    CHECK(ts_gguf_writer_new(&w, 0) == TS_OK);
    CHECK(ts_gguf_writer_begin(w, p) == TS_OK && ts_gguf_writer_end(w) == TS_OK);
    ts_gguf_writer_free(w);
    size_t n;
    unsigned char *b = fx_read_file(p, &n);
    CHECK(n == 32); /* header padded to the alignment */
    free(b);
    ts_gguf *g;
    CHECK(ts_gguf_open(p, &g) == TS_OK && ts_gguf_n_kv(g) == 0 && ts_gguf_n_tensors(g) == 0);
    ts_gguf_close(g);
    CHECK(ts_gguf_open(tmp_path("does-not-exist.gguf"), &g) == TS_ERR_IO);
}

/* ---- hostile files ------------------------------------------------------------------------- */

static const uint64_t ne16[1] = {16};

/* A valid file: one u32 kv, tensors as given (F32 [16] at the offsets), data zeroed. */
static buf valid_with(int n_t, const uint64_t *offs, uint32_t align) {
    buf b = b_header(3, (uint64_t)n_t, align ? 2 : 1);
    b_kv_u32(&b, "x.k", 5);
    if (align) b_kv_u32(&b, "general.alignment", align);
    uint64_t end = 0;
    for (int i = 0; i < n_t; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", i);
        b_tensor(&b, name, 1, ne16, 0, offs[i]);
        if (offs[i] + 64 > end) end = offs[i] + 64;
    }
    b_pad(&b, align ? align : 32);
    b_zeros(&b, (size_t)end);
    return b;
}

static void test_hostile(void) {
    buf b;
    unsigned char *copy;

    b = b_header(3, 0, 0);
    b.n = 10;
    expect_refused("short", &b, TS_ERR_FORMAT, "10 bytes", "24-byte GGUF header");
    b = b_header(3, 0, 0);
    b.p[3] = 'X';
    expect_refused("magic", &b, TS_ERR_FORMAT, "not a GGUF file", "47 47 55 58");
    b = b_header(1, 0, 0);
    expect_refused("v1", &b, TS_ERR_UNSUPPORTED, "version 1", NULL);
    b = b_header(0x03000000u, 0, 0);
    expect_refused("big-endian", &b, TS_ERR_UNSUPPORTED, "big-endian", NULL);
    b = b_header(7, 0, 0);
    expect_refused("v7", &b, TS_ERR_UNSUPPORTED, "unsupported GGUF version 7", NULL);
    b = b_header(0, 0, 0);
    expect_refused("v0", &b, TS_ERR_FORMAT, "unsupported GGUF version 0", NULL);

    b = b_header(2, 0, 0);
    ts_gguf *g = expect_ok("v2, empty", &b, &copy);
    CHECK(g && ts_gguf_version(g) == 2);
    ts_gguf_close(g);
    free(copy);
    free(b.p);

    b = b_header(3, 0, 1ull << 40);
    expect_refused("kv count", &b, TS_ERR_FORMAT, "1099511627776 keys", "cannot fit");
    b = b_header(3, UINT64_MAX, 0);
    expect_refused("tensor count", &b, TS_ERR_FORMAT, "18446744073709551615 tensors", "cannot fit");
    b = b_header(3, 1, 1); /* each needs more bytes than the 24 that follow */
    b_zeros(&b, 24);
    expect_refused("counts vs size", &b, TS_ERR_FORMAT, "cannot fit", NULL);

    b = b_header(3, 0, 1);
    b_u64(&b, 1ull << 40);
    b_raw(&b, "abc", 3);
    b_zeros(&b, 16);
    expect_refused("key length", &b, TS_ERR_FORMAT, "byte 24", "string length 1099511627776");
    b = b_header(3, 0, 1);
    b_str(&b, "bad key");
    b_u32(&b, TS_GGUF_U8);
    b_zeros(&b, 8);
    expect_refused("key with space", &b, TS_ERR_FORMAT, "invalid key", "key #0");
    b = b_header(3, 0, 1);
    b_str(&b, "");
    b_u32(&b, TS_GGUF_U8);
    b_zeros(&b, 8);
    expect_refused("empty key", &b, TS_ERR_FORMAT, "invalid key", NULL);
    b = b_header(3, 0, 1);
    b_str(&b, "k.t");
    b_u32(&b, 13);
    b_zeros(&b, 8);
    expect_refused("value type", &b, TS_ERR_FORMAT, "'k.t'", "unknown value type 13");
    b = b_header(3, 0, 1);
    b_str(&b, "k.u32");
    b_u32(&b, TS_GGUF_U32);
    b_raw(&b, "\1\2", 2);
    expect_refused("truncated value", &b, TS_ERR_FORMAT, "'k.u32': value: truncated",
                   "needs 4 bytes");
    b = b_header(3, 0, 1);
    b_str(&b, "k.s");
    b_u32(&b, TS_GGUF_STR);
    b_u64(&b, 100);
    b_raw(&b, "short", 5);
    expect_refused("string value", &b, TS_ERR_FORMAT, "'k.s'", "string length 100");
    b = b_header(3, 0, 1);
    b_str(&b, "k.b");
    b_u32(&b, TS_GGUF_BOOL);
    b_le(&b, 2, 1);
    expect_refused("bool", &b, TS_ERR_FORMAT, "'k.b'", "bool value 2 is not 0 or 1");

    /* Arrays. */
    b = b_header(3, 0, 1);
    b_str(&b, "k.a");
    b_u32(&b, TS_GGUF_ARR);
    b_u32(&b, 42);
    b_u64(&b, 0);
    expect_refused("array elem type", &b, TS_ERR_FORMAT, "'k.a'", "unknown array element type 42");
    b = b_header(3, 0, 1);
    b_str(&b, "k.a");
    b_u32(&b, TS_GGUF_ARR);
    b_u32(&b, TS_GGUF_U32);
    b_u64(&b, 1ull << 62); /* x 4 bytes overflows 64 bits */
    b_zeros(&b, 64);
    expect_refused("array count", &b, TS_ERR_FORMAT, "array of 4611686018427387904 UINT32",
                   "cannot fit");
    b = b_header(3, 0, 1);
    b_str(&b, "k.a");
    b_u32(&b, TS_GGUF_ARR);
    b_u32(&b, TS_GGUF_STR);
    b_u64(&b, 1000);
    b_str(&b, "one");
    b_zeros(&b, 64);
    expect_refused("string array count", &b, TS_ERR_FORMAT, "array of 1000 STRING", "cannot fit");
    b = b_header(3, 0, 1);
    b_str(&b, "k.a");
    b_u32(&b, TS_GGUF_ARR);
    b_u32(&b, TS_GGUF_STR);
    b_u64(&b, 2);
    b_str(&b, "one");
    b_u64(&b, 999);
    b_raw(&b, "two", 3);
    expect_refused("string array item", &b, TS_ERR_FORMAT, "array item", "string length 999");
    b = b_header(3, 0, 1);
    b_str(&b, "k.a");
    b_u32(&b, TS_GGUF_ARR);
    b_u32(&b, TS_GGUF_BOOL);
    b_u64(&b, 3);
    b_raw(&b, "\1\0\7", 3);
    expect_refused("bool array", &b, TS_ERR_FORMAT, "'k.a'", "bool value 7");
    b = b_header(3, 0, 2);
    b_str(&b, "k.nest");
    b_u32(&b, TS_GGUF_ARR);
    b_u32(&b, TS_GGUF_ARR);
    b_u64(&b, 2);
    b_u32(&b, TS_GGUF_U8);
    b_u64(&b, 2);
    b_raw(&b, "\1\2", 2);
    b_u32(&b, TS_GGUF_STR);
    b_u64(&b, 1);
    b_str(&b, "x");
    b_kv_u32(&b, "k.after", 1);
    expect_refused("nested array", &b, TS_ERR_UNSUPPORTED, "'k.nest'",
                   "arrays of arrays are not supported");
    /* ... but corruption after it is still reported as such. */
    b = b_header(3, 0, 2);
    b_str(&b, "k.nest");
    b_u32(&b, TS_GGUF_ARR);
    b_u32(&b, TS_GGUF_ARR);
    b_u64(&b, 0);
    b_str(&b, "k.after");
    b_u32(&b, 99);
    b_zeros(&b, 8);
    expect_refused("nested array, then corruption", &b, TS_ERR_FORMAT, "unknown value type 99",
                   NULL);
    b = b_header(3, 0, 1);
    b_str(&b, "k.deep");
    b_u32(&b, TS_GGUF_ARR);
    for (int i = 0; i < 12; i++) {
        b_u32(&b, TS_GGUF_ARR);
        b_u64(&b, 1);
    }
    b_u32(&b, TS_GGUF_U8);
    b_u64(&b, 0);
    expect_refused("deep nesting", &b, TS_ERR_FORMAT, "'k.deep'", "nested deeper than 8");

    b = b_header(3, 0, 3);
    b_kv_u32(&b, "k.dup", 1);
    b_kv_u32(&b, "k.other", 1);
    b_kv_u32(&b, "k.dup", 2);
    expect_refused("duplicate key", &b, TS_ERR_FORMAT, "key 'k.dup' appears twice", "bytes 24 and");

    /* Alignment. */
    uint64_t off0[2] = {0, 64};
    b = valid_with(1, off0, 64);
    g = expect_ok("alignment 64", &b, &copy);
    CHECK(g && ts_gguf_alignment(g) == 64 && ts_gguf_data_offset(g) % 64 == 0);
    ts_gguf_close(g);
    free(copy);
    free(b.p);
    uint32_t bad_aligns[] = {0, 48, 1u << 21};
    for (int i = 0; i < 3; i++) {
        b = b_header(3, 0, 1);
        b_kv_u32(&b, "general.alignment", bad_aligns[i]);
        expect_refused("alignment value", &b, TS_ERR_FORMAT, "'general.alignment'",
                       "is not a power of two");
    }
    b = b_header(3, 0, 1);
    b_str(&b, "general.alignment");
    b_u32(&b, TS_GGUF_STR);
    b_str(&b, "32");
    expect_refused("alignment type", &b, TS_ERR_FORMAT, "'general.alignment'",
                   "expected an integer, got STRING");
    b = b_header(3, 0, 1);
    b_str(&b, "general.alignment");
    b_u32(&b, TS_GGUF_U64);
    b_u64(&b, 16);
    g = expect_ok("alignment as u64", &b, &copy);
    CHECK(g && ts_gguf_alignment(g) == 16);
    ts_gguf_close(g);
    free(copy);
    free(b.p);

    /* Tensor infos. */
    b = b_header(3, 1, 0);
    b_str(&b, "");
    b_u32(&b, 1);
    b_u64(&b, 4);
    b_u32(&b, 0);
    b_u64(&b, 0);
    expect_refused("empty name", &b, TS_ERR_FORMAT, "tensor #0", "name length 0");
    b = b_header(3, 1, 0);
    b_u64(&b, 3);
    b_raw(&b, "a\0b", 3);
    b_u32(&b, 1);
    b_u64(&b, 4);
    b_u32(&b, 0);
    b_u64(&b, 0);
    expect_refused("NUL in name", &b, TS_ERR_FORMAT, "tensor #0", "NUL byte");
    b = b_header(3, 1, 0);
    b_u64(&b, 2000);
    b_zeros(&b, 2000 + 64);
    expect_refused("long name", &b, TS_ERR_FORMAT, "tensor #0", "name length 2000");
    uint64_t ne5[5] = {1, 1, 1, 1, 1};
    b = b_header(3, 1, 0);
    b_tensor(&b, "w", 5, ne5, 0, 0);
    b_zeros(&b, 64);
    expect_refused("n_dims", &b, TS_ERR_FORMAT, "tensor 'w'", "n_dims 5 exceeds 4");
    uint64_t neh[2] = {4, 1ull << 63};
    b = b_header(3, 1, 0);
    b_tensor(&b, "w", 2, neh, 0, 0);
    b_zeros(&b, 64);
    expect_refused("huge dim", &b, TS_ERR_FORMAT, "tensor 'w'", "dimension 1 is");
    uint64_t neo[2] = {1ull << 32, 1ull << 32};
    b = b_header(3, 1, 0);
    b_tensor(&b, "w", 2, neo, 0, 0);
    b_zeros(&b, 64);
    expect_refused("element overflow", &b, TS_ERR_FORMAT, "tensor 'w'", "overflows 63 bits");
    uint64_t neb[1] = {1ull << 62};
    b = b_header(3, 1, 0);
    b_tensor(&b, "w", 1, neb, 0, 0);
    b_zeros(&b, 64);
    expect_refused("byte overflow", &b, TS_ERR_FORMAT, "tensor 'w'", "byte size overflows");
    uint64_t neq[2] = {100, 2};
    b = b_header(3, 1, 0);
    b_tensor(&b, "w", 2, neq, 12, 0);
    b_zeros(&b, 64);
    expect_refused("row vs block", &b, TS_ERR_FORMAT, "tensor 'w'",
                   "row of 100 elements is not a multiple of the Q4_K block size 256");
    b = b_header(3, 2, 0);
    b_tensor(&b, "w", 1, ne16, 0, 0);
    b_tensor(&b, "w", 1, ne16, 0, 64);
    b_pad(&b, 32);
    b_zeros(&b, 128);
    expect_refused("duplicate tensor", &b, TS_ERR_FORMAT, "tensor 'w' appears twice", NULL);
    b = b_header(3, 2, 0);
    b_tensor(&b, "w", 1, ne16, 99, 0);
    b_tensor(&b, "v", 1, ne16, 0, 64);
    b_pad(&b, 32);
    b_zeros(&b, 128);
    expect_refused("unknown ggml type", &b, TS_ERR_UNSUPPORTED, "tensor 'w'",
                   "unknown ggml type 99");
    b = b_header(3, 2, 0); /* unknown type, but another tensor runs off the end: format wins */
    b_tensor(&b, "w", 1, ne16, 99, 0);
    b_tensor(&b, "v", 1, ne16, 0, 640);
    b_pad(&b, 32);
    b_zeros(&b, 128);
    expect_refused("unknown type + corruption", &b, TS_ERR_FORMAT, "tensor 'v'", "past the end");

    /* Data section. */
    uint64_t off_mis[1] = {8};
    b = valid_with(1, off_mis, 0);
    expect_refused("misaligned", &b, TS_ERR_FORMAT, "tensor 't0'",
                   "offset 8 is not a multiple of the alignment 32");
    uint64_t off_far[1] = {4096};
    b = valid_with(1, off_far, 0);
    b.n -= 4096; /* keep the file short */
    expect_refused("past the end", &b, TS_ERR_FORMAT, "tensor 't0'", "runs past the end");
    uint64_t off_ov[2] = {0, 32};
    b = valid_with(2, off_ov, 0);
    expect_refused("overlap", &b, TS_ERR_FORMAT, "overlaps tensor", "'t0' [0, 64)");
    uint64_t off_sh[3] = {128, 0, 64};
    b = valid_with(3, off_sh, 0);
    g = expect_ok("unordered, adjacent", &b, &copy);
    ts_gguf_close(g);
    free(copy);
    free(b.p);
    uint64_t ne0[2] = {0, 16};
    b = b_header(3, 1, 0);
    b_tensor(&b, "empty", 2, ne0, 0, 0);
    expect_refused("data section past EOF", &b, TS_ERR_FORMAT, "data section starts at byte",
                   "past the end of the file");
    b = b_header(3, 1, 0);
    b_tensor(&b, "empty", 2, ne0, 0, 0);
    b_pad(&b, 32);
    g = expect_ok("empty tensor", &b, &copy);
    const ts_tensor *t;
    CHECK(g && ts_gguf_tensor(g, "empty", &t) == TS_OK && t->nbytes == 0 && t->shape[0] == 16 &&
          t->shape[1] == 0);
    ts_gguf_close(g);
    free(copy);
    free(b.p);
    b = b_header(3, 1, 0);
    b_tensor(&b, "scalar", 0, NULL, 0, 0);
    b_pad(&b, 32);
    b_zeros(&b, 4);
    g = expect_ok("scalar tensor", &b, &copy);
    CHECK(g && ts_gguf_tensor(g, "scalar", &t) == TS_OK && t->n_dims == 0 && t->nbytes == 4);
    ts_gguf_close(g);
    free(copy);
    free(b.p);
    b = b_header(3, 1, 1);
    b_kv_u32(&b, "x", 1);
    b_tensor(&b, "q", 1, ne16, 0, 0);
    b.n -= 3; /* cut inside the offset field */
    expect_refused("truncated info", &b, TS_ERR_FORMAT, "tensor 'q': offset: truncated", NULL);

    /* A hostile file on disk: messages carry its path. */
    b = b_header(3, 0, 0);
    b.p[0] = 'g';
    const char *p = tmp_path("bad.gguf");
    FILE *f = fopen(p, "wb");
    fwrite(b.p, 1, b.n, f);
    fclose(f);
    free(b.p);
    CHECK(ts_gguf_open(p, &g) == TS_ERR_FORMAT && has(ts_last_error(), p) && g == NULL);
}

/* The metadata cap, with a sparse file larger than it: a string claims most of it. */
static void test_meta_cap(void) {
    const char *p = tmp_path("huge.gguf");
    buf b = b_header(3, 0, 1);
    b_str(&b, "k.big");
    b_u32(&b, TS_GGUF_STR);
    b_u64(&b, (uint64_t)130 << 20);
    FILE *f = fopen(p, "wb");
    fwrite(b.p, 1, b.n, f);
    fclose(f);
    free(b.p);
    CHECK(truncate(p, (off_t)140 << 20) == 0);
    ts_gguf *g;
    ts_status rc = ts_gguf_open(p, &g);
    CHECKF(rc == TS_ERR_FORMAT && has(ts_last_error(), "exceeds the 134217728-byte cap") &&
               has(ts_last_error(), "'k.big'"),
           "cap: %s", ts_last_error());
    unlink(p);
}

/* ---- truncations and mutations ------------------------------------------------------------- */

/* Opens data; on success, touches everything the API exposes (so ASan sees any bad pointer). */
static void exercise(const unsigned char *data, size_t n, int *opened) {
    unsigned char *copy;
    ts_gguf *g = NULL;
    ts_status rc = open_copy(data, n, "m.gguf", &g, &copy);
    if (rc == TS_OK) {
        (*opened)++;
        unsigned long sum = 0;
        for (size_t i = 0; i < ts_gguf_n_kv(g); i++) {
            ts_gguf_value v;
            ts_gguf_kv_value(g, (int64_t)i, &v);
            sum += strlen(ts_gguf_kv_key(g, (int64_t)i));
            if (v.type == TS_GGUF_ARR && v.elem == TS_GGUF_STR) {
                for (uint64_t j = 0; j < v.n; j++) {
                    const char *s;
                    size_t len;
                    if (ts_gguf_kv_str_item(g, (int64_t)i, j, &s, &len) == TS_OK && len)
                        sum += (unsigned char)s[len - 1];
                }
            } else if (v.type == TS_GGUF_ARR && v.data && v.n) {
                sum += ((const unsigned char *)v.data)[v.n - 1];
            } else if (v.type == TS_GGUF_STR) {
                sum += strlen(v.data);
            }
        }
        for (size_t i = 0; i < ts_gguf_n_tensors(g); i++) {
            ts_gguf_tensor_info info;
            ts_gguf_tensor_info_at(g, i, &info);
            if (info.tensor && info.tensor->nbytes)
                sum += ((const unsigned char *)info.tensor->data)[info.tensor->nbytes - 1];
        }
        (void)sum;
        ts_gguf_close(g);
    } else {
        CHECK(rc == TS_ERR_FORMAT || rc == TS_ERR_UNSUPPORTED);
        CHECK(g == NULL);
    }
    free(copy);
}

static void test_truncations(void) {
    size_t n;
    unsigned char *full = fx_read_file(tmp_path("b.gguf"), &n);
    CHECK(full != NULL);
    if (!full) return;
    ts_gguf *g;
    CHECK(ts_gguf_open(tmp_path("b.gguf"), &g) == TS_OK);
    /* The file is complete once the last tensor's bytes are in; its trailing padding is not
     * needed. */
    uint64_t need = 0;
    for (size_t i = 0; i < ts_gguf_n_tensors(g); i++) {
        ts_gguf_tensor_info info;
        ts_gguf_tensor_info_at(g, i, &info);
        if (info.offset + info.nbytes > need) need = info.offset + info.nbytes;
    }
    ts_gguf_close(g);
    int refused = 0, accepted = 0;
    for (size_t len = 0; len < n; len++) {
        unsigned char *copy;
        ts_status rc = open_copy(full, len, "cut.gguf", &g, &copy);
        if (len < need) {
            CHECKF(rc == TS_ERR_FORMAT && has(ts_last_error(), "cut.gguf"),
                   "truncated to %zu: %s (%s)", len, ts_status_name(rc), ts_last_error());
            refused += rc != TS_OK;
        } else {
            CHECKF(rc == TS_OK, "truncated to %zu (>= %" PRIu64 "): %s", len, need,
                   ts_last_error());
            accepted += rc == TS_OK;
        }
        ts_gguf_close(g);
        free(copy);
    }
    CHECK(refused == (int)need && accepted == (int)(n - need));
    free(full);
}

static void test_mutations(int rounds) {
    size_t n;
    unsigned char *full = fx_read_file(tmp_path("a.gguf"), &n);
    CHECK(full != NULL);
    if (!full) return;
    ts_gguf *g;
    CHECK(ts_gguf_open(tmp_path("a.gguf"), &g) == TS_OK);
    size_t header = (size_t)ts_gguf_data_offset(g);
    ts_gguf_close(g);
    unsigned long long rng = 0x9e3779b97f4a7c15ull;
    unsigned char *m = malloc(n);
    int opened = 0;
    for (int r = 0; r < rounds; r++) {
        memcpy(m, full, n);
        /* Mostly the header, where the structure is; sometimes anywhere. */
        size_t pos = (size_t)(tu_rng_next(&rng) % (r % 8 ? header : n));
        unsigned char v = (unsigned char)tu_rng_next(&rng);
        if (r % 3 == 0) v = (unsigned char)(m[pos] ^ (1u << (tu_rng_next(&rng) % 8)));
        m[pos] = v;
        exercise(m, n, &opened);
        /* And a cut at a random length of the mutated file. */
        if (r % 10 == 0) exercise(m, (size_t)(tu_rng_next(&rng) % n), &opened);
    }
    printf("mutations: %d rounds, %d opened\n", rounds, opened);
    CHECK(opened > 0);
    free(m);
    free(full);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ts_gguf_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    test_round_trip(32);
    test_round_trip(64);
    test_writer_errors();
    test_hostile();
    test_meta_cap();
    test_truncations();
    test_mutations(atoi(tu_env("TS_GGUF_MUTATIONS", "5000")));

    const char *names[] = {"a.gguf", "a2.gguf", "b.gguf", "b2.gguf", "short.gguf", "bad.gguf"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        unlink(tmp_path(names[i]));
    rmdir(tmpdir);
    return tu_report("test_gguf");
}
