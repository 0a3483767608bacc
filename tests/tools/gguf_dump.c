/* Test driver for the GGUF reader and writer, used by tests/py/test_gguf_interop.py.
 *
 *   ts_gguf_dump json FILE
 *       Prints the file as one JSON object: version, alignment, data_offset, "kv" (in file order:
 *       key, type, elem for arrays, value) and "tensors" (in file order: name, type, type_id, ne
 *       innermost first, shape outermost first or null when not loadable, offset in the file,
 *       nbytes, fnv1a: FNV-1a 64 of the bytes as 16 hex digits). String bytes below 0x20 or above
 *       0x7e are written as \u00XX, so Python's s.encode('latin-1') gives back the exact bytes.
 *       Non-finite floats are the strings "nan", "inf", "-inf". On a refused file prints
 *       "ERR <status> <message>" on stderr and exits 1.
 *   ts_gguf_dump sample FILE [ALIGNMENT]
 *       Writes a sample file with our writer: every value type, arrays of numbers and strings,
 *       a tensor of every ts_dtype (bytes i*7+t mod 256) and one Q5_K tensor. */
#include "format/gguf.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void put_str(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20 || c > 0x7e)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void put_double(double d, int digits) {
    if (isnan(d))
        printf("\"nan\"");
    else if (isinf(d))
        printf(d > 0 ? "\"inf\"" : "\"-inf\"");
    else
        printf("%.*g", digits, d);
}

/* One element of elem type at p (little-endian, unaligned). */
static void put_scalar(const unsigned char *p, ts_gguf_type t) {
    uint64_t u = 0;
    int size = t == TS_GGUF_U8 || t == TS_GGUF_I8 || t == TS_GGUF_BOOL    ? 1
               : t == TS_GGUF_U16 || t == TS_GGUF_I16                     ? 2
               : t == TS_GGUF_U32 || t == TS_GGUF_I32 || t == TS_GGUF_F32 ? 4
                                                                          : 8;
    for (int i = size - 1; i >= 0; i--)
        u = u << 8 | p[i];
    switch (t) {
    case TS_GGUF_U8:
    case TS_GGUF_U16:
    case TS_GGUF_U32:
    case TS_GGUF_U64: printf("%" PRIu64, u); break;
    case TS_GGUF_I8: printf("%d", (int8_t)u); break;
    case TS_GGUF_I16: printf("%d", (int16_t)u); break;
    case TS_GGUF_I32: printf("%" PRId32, (int32_t)u); break;
    case TS_GGUF_I64: printf("%" PRId64, (int64_t)u); break;
    case TS_GGUF_BOOL: printf(u ? "true" : "false"); break;
    case TS_GGUF_F32: {
        uint32_t b = (uint32_t)u;
        float f;
        memcpy(&f, &b, 4);
        put_double(f, 9);
        break;
    }
    case TS_GGUF_F64: {
        double d;
        memcpy(&d, &u, 8);
        put_double(d, 17);
        break;
    }
    default: printf("null");
    }
}

static unsigned elem_size(ts_gguf_type t) {
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

static uint64_t fnv1a(const unsigned char *p, uint64_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static int dump(const char *path) {
    ts_gguf *g;
    ts_status rc = ts_gguf_open(path, &g);
    if (rc != TS_OK) {
        fprintf(stderr, "ERR %s %s\n", ts_status_name(rc), ts_last_error());
        return 1;
    }
    printf("{\"version\": %u, \"alignment\": %u, \"data_offset\": %" PRIu64 ",\n \"kv\": [",
           ts_gguf_version(g), ts_gguf_alignment(g), ts_gguf_data_offset(g));
    for (size_t i = 0; i < ts_gguf_n_kv(g); i++) {
        ts_gguf_value v;
        ts_gguf_kv_value(g, (int64_t)i, &v);
        const char *key = ts_gguf_kv_key(g, (int64_t)i);
        printf("%s\n  {\"key\": ", i ? "," : "");
        put_str(key, strlen(key));
        printf(", \"type\": \"%s\"", ts_gguf_type_name(v.type));
        if (v.type == TS_GGUF_ARR) printf(", \"elem\": \"%s\"", ts_gguf_type_name(v.elem));
        printf(", \"value\": ");
        if (v.type == TS_GGUF_STR) {
            put_str(v.data, (size_t)v.n);
        } else if (v.type == TS_GGUF_ARR) {
            putchar('[');
            for (uint64_t j = 0; j < v.n; j++) {
                if (j) printf(", ");
                if (v.elem == TS_GGUF_STR) {
                    const char *s;
                    size_t len;
                    ts_gguf_kv_str_item(g, (int64_t)i, j, &s, &len);
                    put_str(s, len);
                } else {
                    put_scalar((const unsigned char *)v.data + j * elem_size(v.elem), v.elem);
                }
            }
            putchar(']');
        } else {
            put_scalar(v.data, v.type);
        }
        putchar('}');
    }
    printf("],\n \"tensors\": [");
    unsigned char *all = NULL;
    FILE *f = fopen(path, "rb");
    if (f) {
        fseek(f, 0, SEEK_END);
        long sz = ftell(f);
        fseek(f, 0, SEEK_SET);
        all = malloc((size_t)sz + 1);
        if (all && fread(all, 1, (size_t)sz, f) != (size_t)sz) {
            free(all);
            all = NULL;
        }
        fclose(f);
    }
    for (size_t i = 0; i < ts_gguf_n_tensors(g); i++) {
        ts_gguf_tensor_info t;
        ts_gguf_tensor_info_at(g, i, &t);
        printf("%s\n  {\"name\": ", i ? "," : "");
        put_str(t.name, strlen(t.name));
        printf(", \"type\": \"%s\", \"type_id\": %u, \"ne\": [", t.type_name, t.ggml_type);
        for (int d = 0; d < t.n_dims; d++)
            printf("%s%" PRId64, d ? ", " : "", t.ne[d]);
        printf("], \"shape\": ");
        if (t.tensor) {
            putchar('[');
            for (int d = 0; d < t.tensor->n_dims; d++)
                printf("%s%" PRId64, d ? ", " : "", t.tensor->shape[d]);
            putchar(']');
        } else {
            printf("null");
        }
        /* The hash comes from an independent read of the file, not from the reader's pointers;
         * the two must agree. */
        uint64_t h = all ? fnv1a(all + t.offset, t.nbytes) : 0;
        if (fnv1a(t.data, t.nbytes) != h ||
            (t.tensor && (t.tensor->data != t.data || t.tensor->nbytes != t.nbytes))) {
            fprintf(stderr, "ERR tensor %s: data pointer disagrees with the file\n", t.name);
            return 1;
        }
        printf(", \"offset\": %" PRIu64 ", \"nbytes\": %" PRIu64 ", \"fnv1a\": \"%016" PRIx64 "\"}",
               t.offset, t.nbytes, h);
    }
    printf("]}\n");
    free(all);
    ts_gguf_close(g);
    return 0;
}

static int fail(const char *what) {
    fprintf(stderr, "ERR %s: %s\n", what, ts_last_error());
    return 1;
}

static int sample(const char *path, uint32_t alignment) {
    ts_gguf_writer *w;
    if (ts_gguf_writer_new(&w, alignment) != TS_OK) return fail("new");
    static const uint8_t a8[] = {0, 1, 255};
    static const int8_t ai8[] = {-128, 0, 127};
    static const uint16_t a16[] = {0, 65535};
    static const int16_t ai16[] = {-32768, 32767};
    static const uint32_t a32[] = {0, 4294967295u};
    static const int32_t ai32[] = {-2147483647 - 1, 2147483647};
    static const uint64_t a64[] = {0, UINT64_MAX};
    static const int64_t ai64[] = {INT64_MIN, INT64_MAX};
    static const float af[] = {0.1f, -1e30f, 1e-40f};
    static const double ad[] = {0.1, -1e300};
    static const bool ab[] = {false, true};
    static const char *const toks[] = {"<bos>", "\xe2\x96\x81hello", "", "tab\there"};
    ts_status rc = ts_gguf_writer_kv_str(w, "general.architecture", "gemma3");
    if (!rc) rc = ts_gguf_writer_kv_str(w, "general.name", "sample \xc3\xa9t\xc3\xa9");
    if (!rc) rc = ts_gguf_writer_kv_u8(w, "s.u8", 250);
    if (!rc) rc = ts_gguf_writer_kv_i8(w, "s.i8", -120);
    if (!rc) rc = ts_gguf_writer_kv_u16(w, "s.u16", 65000);
    if (!rc) rc = ts_gguf_writer_kv_i16(w, "s.i16", -32000);
    if (!rc) rc = ts_gguf_writer_kv_u32(w, "s.u32", 4000000000u);
    if (!rc) rc = ts_gguf_writer_kv_i32(w, "s.i32", -2000000000);
    if (!rc) rc = ts_gguf_writer_kv_u64(w, "s.u64", UINT64_MAX);
    if (!rc) rc = ts_gguf_writer_kv_i64(w, "s.i64", INT64_MIN);
    if (!rc) rc = ts_gguf_writer_kv_f32(w, "s.f32", 1e-6f);
    if (!rc) rc = ts_gguf_writer_kv_f64(w, "s.f64", 1e-300);
    if (!rc) rc = ts_gguf_writer_kv_bool(w, "s.bool", true);
    if (!rc) rc = ts_gguf_writer_kv_arr(w, "a.u8", TS_GGUF_U8, a8, 3);
    if (!rc) rc = ts_gguf_writer_kv_arr(w, "a.i8", TS_GGUF_I8, ai8, 3);
    if (!rc) rc = ts_gguf_writer_kv_arr(w, "a.u16", TS_GGUF_U16, a16, 2);
    if (!rc) rc = ts_gguf_writer_kv_arr(w, "a.i16", TS_GGUF_I16, ai16, 2);
    if (!rc) rc = ts_gguf_writer_kv_arr(w, "a.u32", TS_GGUF_U32, a32, 2);
    if (!rc) rc = ts_gguf_writer_kv_arr(w, "a.i32", TS_GGUF_I32, ai32, 2);
    if (!rc) rc = ts_gguf_writer_kv_arr(w, "a.u64", TS_GGUF_U64, a64, 2);
    if (!rc) rc = ts_gguf_writer_kv_arr(w, "a.i64", TS_GGUF_I64, ai64, 2);
    if (!rc) rc = ts_gguf_writer_kv_arr(w, "a.f32", TS_GGUF_F32, af, 3);
    if (!rc) rc = ts_gguf_writer_kv_arr(w, "a.f64", TS_GGUF_F64, ad, 2);
    if (!rc) rc = ts_gguf_writer_kv_arr(w, "a.bool", TS_GGUF_BOOL, ab, 2);
    if (!rc) rc = ts_gguf_writer_kv_str_arr(w, "tokenizer.ggml.tokens", toks, NULL, 4);
    if (rc) return fail("kv");
    static const struct {
        const char *name;
        uint32_t ggml; /* via ts_gguf_writer_add_tensor_ggml so Q5_K can be in the mix */
        int nd;
        int64_t shape[3];
    } ts[] = {
        {"token_embd.weight", 0, 2, {3, 5}},       {"blk.0.attn_q.weight", 1, 2, {4, 6}},
        {"blk.0.ffn_up.weight", 30, 3, {2, 2, 3}}, {"blk.0.ffn_down.weight", 8, 2, {2, 64}},
        {"blk.0.attn_k.weight", 2, 2, {3, 32}},    {"blk.0.attn_v.weight", 12, 2, {2, 256}},
        {"output.weight", 14, 1, {512}},           {"blk.0.attn_output.weight", 13, 2, {1, 256}},
    };
    size_t nt = sizeof ts / sizeof ts[0];
    for (size_t i = 0; i < nt; i++) {
        if (ts_gguf_writer_add_tensor_ggml(w, ts[i].name, ts[i].ggml, ts[i].nd, ts[i].shape))
            return fail(ts[i].name);
    }
    if (ts_gguf_writer_begin(w, path)) return fail("begin");
    /* Bytes per tensor from the block geometry of the types used above. */
    static const int be[] = {
        [0] = 1, [1] = 1, [30] = 1, [8] = 32, [2] = 32, [12] = 256, [14] = 256, [13] = 256};
    static const int bb[] = {
        [0] = 4, [1] = 2, [30] = 2, [8] = 34, [2] = 18, [12] = 144, [14] = 210, [13] = 176};
    for (size_t i = 0; i < nt; i++) {
        uint64_t el = 1;
        for (int d = 0; d < ts[i].nd; d++)
            el *= (uint64_t)ts[i].shape[d];
        uint64_t nb = el / (uint64_t)be[ts[i].ggml] * (uint64_t)bb[ts[i].ggml];
        for (uint64_t j = 0; j < nb; j++) {
            unsigned char c = (unsigned char)(j * 7 + i);
            if (ts_gguf_writer_write(w, &c, 1)) return fail("write");
        }
    }
    if (ts_gguf_writer_end(w)) return fail("end");
    ts_gguf_writer_free(w);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "json") == 0) return dump(argv[2]);
    if (argc >= 3 && strcmp(argv[1], "sample") == 0)
        return sample(argv[2], argc > 3 ? (uint32_t)strtoul(argv[3], NULL, 10) : 0);
    fprintf(stderr, "usage: ts_gguf_dump json FILE | sample FILE [ALIGNMENT]\n");
    return 2;
}
