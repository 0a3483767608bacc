/* libFuzzer target for the GGUF reader: any input must be refused with a status or opened and then
 * survive every accessor. Built and run by scripts/fuzz.sh (clang, -fsanitize=fuzzer,address,
 * undefined); libFuzzer hands over an exact-size buffer, so ASan sees any read past its end. */
#include "format/gguf.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static volatile unsigned long sink; /* keeps the reads below from being optimised away */

static void touch(const void *p, size_t n) {
    if (p && n) sink += ((const unsigned char *)p)[0] + ((const unsigned char *)p)[n - 1];
}

static void poke_key(const ts_gguf *g, const char *key) {
    uint32_t u32;
    int32_t i32;
    uint64_t u64, n;
    int64_t i64;
    float f, fa[4];
    double d;
    bool b;
    const char *s;
    size_t len;
    int32_t ia[4];
    ts_gguf_type et;
    const void *data;
    ts_gguf_get_u32(g, key, &u32);
    ts_gguf_get_i32(g, key, &i32);
    ts_gguf_get_u64(g, key, &u64);
    ts_gguf_get_i64(g, key, &i64);
    ts_gguf_get_f32(g, key, &f);
    ts_gguf_get_f64(g, key, &d);
    ts_gguf_get_bool(g, key, &b);
    if (ts_gguf_get_str(g, key, &s, &len) == TS_OK) sink += strlen(s) + len;
    ts_gguf_get_u32_opt(g, key, 1, &u32);
    if (ts_gguf_get_str_opt(g, key, "x", &s) == TS_OK) sink += strlen(s);
    if (ts_gguf_get_arr(g, key, &et, &n, &data) == TS_OK && data && n)
        touch(data, (size_t)n); /* at least n bytes: every element is >= 1 byte */
    ts_gguf_get_arr_i32(g, key, ia, 4, &n);
    ts_gguf_get_arr_f32(g, key, fa, 4, &n);
    uint64_t items = 0;
    if (ts_gguf_get_str_arr_item(g, key, 0, &s, &len, &items) == TS_OK) touch(s, len);
    if (items && ts_gguf_get_str_arr_item(g, key, items - 1, &s, &len, NULL) == TS_OK)
        touch(s, len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ts_gguf *g;
    if (ts_gguf_open_buffer(data, size, "fuzz.gguf", &g) != TS_OK) return 0;
    for (size_t i = 0; i < ts_gguf_n_kv(g); i++) {
        const char *key = ts_gguf_kv_key(g, (int64_t)i);
        sink += strlen(key) + (unsigned)ts_gguf_kv_type(g, (int64_t)i);
        ts_gguf_value v;
        if (ts_gguf_kv_value(g, (int64_t)i, &v) != TS_OK) continue;
        if (v.type == TS_GGUF_STR) {
            touch(v.data, (size_t)v.n + 1); /* the copy is NUL-terminated */
        } else if (v.type == TS_GGUF_ARR && v.elem == TS_GGUF_STR) {
            for (uint64_t j = 0; j < v.n; j++) {
                const char *s;
                size_t len;
                if (ts_gguf_kv_str_item(g, (int64_t)i, j, &s, &len) == TS_OK) touch(s, len);
            }
        } else if (v.type != TS_GGUF_ARR) {
            touch(v.data, 1);
        }
        poke_key(g, key);
    }
    for (size_t i = 0; i < ts_gguf_n_tensors(g); i++) {
        ts_gguf_tensor_info info;
        if (ts_gguf_tensor_info_at(g, i, &info) != TS_OK) continue;
        const ts_tensor *t;
        if (ts_gguf_tensor(g, info.name, &t) == TS_OK) {
            touch(t->data, (size_t)t->nbytes);
            if (t->n_dims) sink += ts_dtype_row_bytes(t->dtype, ts_tensor_cols(t));
        }
        sink += ts_gguf_find(g, info.name) != NULL;
    }
    ts_gguf_close(g);
    return 0;
}
