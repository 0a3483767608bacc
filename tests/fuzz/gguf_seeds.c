/* Writes the seed corpus for fuzz_gguf: small valid GGUF files made with our writer that between
 * them use every value type, every ts_dtype, a non-default alignment, an unsupported tensor type
 * and version 2. Usage: gguf_seeds DIR (run by scripts/fuzz.sh). */
#include "format/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failed;

static void ok(ts_status rc, const char *what) {
    if (rc != TS_OK) {
        fprintf(stderr, "gguf_seeds: %s: %s\n", what, ts_last_error());
        failed = 1;
    }
}

static void kvs(ts_gguf_writer *w) {
    static const uint8_t a8[] = {1, 2, 3};
    static const int32_t a32[] = {-1, 0, 1, 100000};
    static const float af[] = {0.5f, -2.0f};
    static const double ad[] = {1e300};
    static const bool ab[] = {true, false};
    static const uint64_t a64[] = {1, 2};
    static const char *const toks[] = {"<s>", "</s>", "hello", " world", ""};
    ok(ts_gguf_writer_kv_str(w, "general.architecture", "llama"), "str");
    ok(ts_gguf_writer_kv_u8(w, "k.u8", 7), "u8");
    ok(ts_gguf_writer_kv_i8(w, "k.i8", -7), "i8");
    ok(ts_gguf_writer_kv_u16(w, "k.u16", 700), "u16");
    ok(ts_gguf_writer_kv_i16(w, "k.i16", -700), "i16");
    ok(ts_gguf_writer_kv_u32(w, "k.u32", 70000), "u32");
    ok(ts_gguf_writer_kv_i32(w, "k.i32", -70000), "i32");
    ok(ts_gguf_writer_kv_u64(w, "k.u64", 1ull << 40), "u64");
    ok(ts_gguf_writer_kv_i64(w, "k.i64", -(1ll << 40)), "i64");
    ok(ts_gguf_writer_kv_f32(w, "k.f32", 1e-5f), "f32");
    ok(ts_gguf_writer_kv_f64(w, "k.f64", 1e6), "f64");
    ok(ts_gguf_writer_kv_bool(w, "k.bool", true), "bool");
    ok(ts_gguf_writer_kv_arr(w, "a.u8", TS_GGUF_U8, a8, 3), "a.u8");
    ok(ts_gguf_writer_kv_arr(w, "a.i32", TS_GGUF_I32, a32, 4), "a.i32");
    ok(ts_gguf_writer_kv_arr(w, "a.f32", TS_GGUF_F32, af, 2), "a.f32");
    ok(ts_gguf_writer_kv_arr(w, "a.f64", TS_GGUF_F64, ad, 1), "a.f64");
    ok(ts_gguf_writer_kv_arr(w, "a.bool", TS_GGUF_BOOL, ab, 2), "a.bool");
    ok(ts_gguf_writer_kv_arr(w, "a.u64", TS_GGUF_U64, a64, 2), "a.u64");
    ok(ts_gguf_writer_kv_str_arr(w, "tokenizer.ggml.tokens", toks, NULL, 5), "a.str");
}

/* Declares the tensors, begins, and writes a byte pattern into each. */
static void tensors(ts_gguf_writer *w, const char *path, int with_unsupported) {
    static const struct {
        const char *name;
        ts_dtype dt;
        int nd;
        int64_t shape[2];
    } ts[] = {
        {"f32", TS_DTYPE_F32, 2, {2, 3}},    {"f16", TS_DTYPE_F16, 1, {5}},
        {"bf16", TS_DTYPE_BF16, 1, {3}},     {"q8_0", TS_DTYPE_Q8_0, 1, {32}},
        {"q4_0", TS_DTYPE_Q4_0, 2, {2, 32}}, {"q4_k", TS_DTYPE_Q4_K, 1, {256}},
        {"q6_k", TS_DTYPE_Q6_K, 1, {256}},   {"empty", TS_DTYPE_F32, 2, {0, 4}},
        {"q5_0", TS_DTYPE_Q5_0, 1, {64}},
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        ok(ts_gguf_writer_add_tensor(w, ts[i].name, ts[i].dt, ts[i].nd, ts[i].shape), ts[i].name);
        size_t n = ts_dtype_row_bytes(ts[i].dt, ts[i].shape[ts[i].nd - 1]);
        total += ts[i].nd == 2 ? n * (size_t)ts[i].shape[0] : n;
    }
    if (with_unsupported) {
        int64_t s[1] = {256};
        ok(ts_gguf_writer_add_tensor_ggml(w, "q5_k", 13, 1, s), "q5_k");
        total += 176;
    }
    ok(ts_gguf_writer_begin(w, path), path);
    unsigned char *b = malloc(total + 1);
    for (size_t i = 0; i < total; i++)
        b[i] = (unsigned char)(i * 13 + 5);
    ok(ts_gguf_writer_write(w, b, total), "write");
    free(b);
    ok(ts_gguf_writer_end(w), "end");
}

static void path_in(char *buf, size_t size, const char *dir, const char *name) {
    snprintf(buf, size, "%s/%s", dir, name);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: gguf_seeds DIR\n");
        return 2;
    }
    char p[4096];
    ts_gguf_writer *w;

    path_in(p, sizeof p, argv[1], "full.gguf");
    ok(ts_gguf_writer_new(&w, 0), "new");
    kvs(w);
    tensors(w, p, 0);
    ts_gguf_writer_free(w);

    path_in(p, sizeof p, argv[1], "align64_unsupported.gguf");
    ok(ts_gguf_writer_new(&w, 64), "new");
    ok(ts_gguf_writer_kv_str(w, "general.architecture", "gemma3"), "arch");
    tensors(w, p, 1);
    ts_gguf_writer_free(w);

    path_in(p, sizeof p, argv[1], "meta_only.gguf");
    ok(ts_gguf_writer_new(&w, 0), "new");
    kvs(w);
    ok(ts_gguf_writer_begin(w, p), p);
    ok(ts_gguf_writer_end(w), "end");
    ts_gguf_writer_free(w);

    path_in(p, sizeof p, argv[1], "empty.gguf");
    ok(ts_gguf_writer_new(&w, 0), "new");
    ok(ts_gguf_writer_begin(w, p), p);
    ok(ts_gguf_writer_end(w), "end");
    ts_gguf_writer_free(w);

    /* Version 2: the same file with the version field changed (identical layout). */
    char src[4096];
    path_in(src, sizeof src, argv[1], "meta_only.gguf");
    path_in(p, sizeof p, argv[1], "v2.gguf");
    FILE *in = fopen(src, "rb"), *out = fopen(p, "wb");
    if (!in || !out) return 1;
    int c;
    long k = 0;
    while ((c = fgetc(in)) != EOF)
        fputc(k++ == 4 ? 2 : c, out);
    fclose(in);
    fclose(out);
    return failed;
}
