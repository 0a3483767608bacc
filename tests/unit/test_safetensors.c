/* safetensors: writer -> reader round trip, sharded sets, and a corpus of corrupt files built
 * byte by byte, each of which must be refused with its own precise message. */
#include "fixture_util.h"
#include "format/safetensors.h"
#include "testutil.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64];

static char *path_in(const char *dir, const char *name) {
    static char buf[8][512];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", dir, name);
    return p;
}

/* Directories live for the whole run (path_in's buffers rotate). */
static char *dirs[32];
static int n_dirs;

static char *make_dir(const char *name) {
    size_t n = strlen(tmpdir) + strlen(name) + 2;
    char *p = malloc(n);
    if (!p) exit(2);
    snprintf(p, n, "%s/%s", tmpdir, name);
    mkdir(p, 0755);
    if (n_dirs < 32) dirs[n_dirs++] = p;
    return p;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(2);
    }
    if (n && fwrite(data, 1, n, f) != n) exit(2);
    fclose(f);
}

static void write_text(const char *path, const char *s) { write_bytes(path, s, strlen(s)); }

/* A file with the given header length field (not necessarily the header's real length), the
 * header text and dlen zero bytes of data. */
static void write_raw_len(const char *path, uint64_t hlen, const char *hdr, size_t dlen) {
    size_t hl = strlen(hdr), n = 8 + hl + dlen;
    unsigned char *b = calloc(1, n);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(b + 8, hdr, hl);
    write_bytes(path, b, n);
    free(b);
}

static void write_raw(const char *path, const char *hdr, size_t dlen) {
    write_raw_len(path, strlen(hdr), hdr, dlen);
}

/* Opening must fail with code and a message holding the path and every fragment. */
static void expect_refused(const char *what, const char *path, ts_status code, const char *f1,
                           const char *f2, const char *f3) {
    ts_st *st = (ts_st *)1;
    ts_status rc = ts_st_open(path, &st);
    const char *msg = ts_last_error();
    if (getenv("TS_VERBOSE")) printf("%-36s %s\n", what, msg);
    CHECKF(rc == code, "%s: got %s, want %s (%s)", what, ts_status_name(rc), ts_status_name(code),
           msg);
    CHECKF(st == NULL, "%s: handle not cleared", what);
    CHECKF(strstr(msg, path) != NULL, "%s: message lacks the path: %s", what, msg);
    const char *frags[3] = {f1, f2, f3};
    for (int i = 0; i < 3; i++)
        if (frags[i])
            CHECKF(strstr(msg, frags[i]) != NULL, "%s: no '%s' in: %s", what, frags[i], msg);
    if (rc == TS_OK) ts_st_close(st);
}

/* ---- round trip ------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    ts_dtype dtype;
    int n_dims;
    int64_t shape[TS_MAX_DIMS];
    size_t nbytes;
    unsigned char *data;
} spec;

static spec specs[] = {
    {"model.layers.0.mlp.weight", TS_DTYPE_F32, 2, {3, 5}, 0, NULL},
    {"a.bias", TS_DTYPE_BF16, 1, {7}, 0, NULL},
    {"c.scalar", TS_DTYPE_F32, 0, {0}, 0, NULL},
    {"d.empty", TS_DTYPE_F16, 2, {0, 4}, 0, NULL},
    {"e.f16", TS_DTYPE_F16, 3, {2, 3, 4}, 0, NULL},
    {"z.four", TS_DTYPE_BF16, 4, {2, 1, 2, 3}, 0, NULL},
#if TS_MAX_DIMS >= 5 /* the shape of a vision patch-embedding convolution */
    {"z.patch_embed", TS_DTYPE_F32, 5, {2, 3, 2, 2, 2}, 0, NULL},
#endif
};
#define N_SPECS (sizeof specs / sizeof specs[0])

static void make_specs(void) {
    unsigned long long rng = 42;
    for (size_t i = 0; i < N_SPECS; i++) {
        spec *s = &specs[i];
        size_t n = (size_t)ts_dtype_block_bytes(s->dtype);
        for (int d = 0; d < s->n_dims; d++)
            n *= (size_t)s->shape[d];
        s->nbytes = n;
        s->data = malloc(n + 1);
        for (size_t j = 0; j < n; j++)
            s->data[j] = (unsigned char)tu_rng_next(&rng);
    }
}

/* Writes specs[lo..hi) to path; chunk 0 = one write per tensor, else a stream cut every chunk
 * bytes regardless of tensor boundaries. */
static void write_specs(const char *path, size_t lo, size_t hi, size_t chunk) {
    ts_st_writer *w;
    CHECK(ts_st_writer_new(&w) == TS_OK);
    for (size_t i = lo; i < hi; i++)
        CHECK(ts_st_writer_add(w, specs[i].name, specs[i].dtype, specs[i].n_dims, specs[i].shape) ==
              TS_OK);
    CHECK(ts_st_writer_begin(w, path) == TS_OK);
    if (chunk == 0) {
        for (size_t i = lo; i < hi; i++)
            CHECK(ts_st_writer_write(w, specs[i].data, specs[i].nbytes) == TS_OK);
    } else {
        size_t total = 0;
        for (size_t i = lo; i < hi; i++)
            total += specs[i].nbytes;
        unsigned char *all = malloc(total + 1);
        size_t k = 0;
        for (size_t i = lo; i < hi; i++) {
            memcpy(all + k, specs[i].data, specs[i].nbytes);
            k += specs[i].nbytes;
        }
        for (size_t off = 0; off < total; off += chunk)
            CHECK(ts_st_writer_write(w, all + off, off + chunk > total ? total - off : chunk) ==
                  TS_OK);
        free(all);
    }
    ts_status rc = ts_st_writer_end(w);
    CHECKF(rc == TS_OK, "writer end: %s", ts_last_error());
    ts_st_writer_free(w);
}

static void check_tensor(const ts_st *st, const spec *s, const char *file) {
    const ts_tensor *t = ts_st_find(st, s->name);
    CHECKF(t != NULL, "tensor %s not found", s->name);
    if (!t) return;
    CHECKF(t->dtype == s->dtype, "%s dtype", s->name);
    CHECKF(t->n_dims == s->n_dims, "%s n_dims %d", s->name, t->n_dims);
    for (int d = 0; d < TS_MAX_DIMS; d++)
        CHECKF(t->shape[d] == (d < s->n_dims ? s->shape[d] : 1), "%s shape[%d]", s->name, d);
    CHECKF(t->nbytes == s->nbytes, "%s nbytes %llu", s->name, (unsigned long long)t->nbytes);
    CHECKF(s->nbytes == 0 || memcmp(t->data, s->data, s->nbytes) == 0, "%s data", s->name);
    const char *f = ts_st_file_of(st, s->name);
    CHECKF(f && strcmp(f, file) == 0, "%s file_of %s", s->name, f ? f : "(null)");
}

static void test_round_trip(void) {
    for (size_t chunk = 0; chunk <= 7; chunk += 7) {
        const char *path = path_in(tmpdir, chunk ? "rt7.safetensors" : "rt.safetensors");
        write_specs(path, 0, N_SPECS, chunk);
        CHECKF(access(path_in(tmpdir, chunk ? "rt7.safetensors.tmp" : "rt.safetensors.tmp"),
                      F_OK) != 0,
               "temp file left behind");

        size_t n;
        unsigned char *raw = fx_read_file(path, &n);
        CHECK(raw && n >= 8);
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--)
            hlen = hlen << 8 | raw[i];
        size_t total = 0;
        for (size_t i = 0; i < N_SPECS; i++)
            total += specs[i].nbytes;
        CHECKF(hlen % 8 == 0, "header length %llu not a multiple of 8", (unsigned long long)hlen);
        CHECKF(n == 8 + hlen + total, "file size %zu", n);
        /* Declaration order in the header, offsets contiguous. */
        char *hdr = calloc(1, hlen + 1);
        memcpy(hdr, raw + 8, hlen);
        const char *prev = hdr;
        for (size_t i = 0; i < N_SPECS; i++) {
            char key[128];
            snprintf(key, sizeof key, "\"%s\"", specs[i].name);
            const char *at = strstr(hdr, key);
            CHECKF(at && at > prev, "header order at %s", specs[i].name);
            if (at) prev = at;
        }
        CHECK(strstr(hdr, "\"data_offsets\":[0,60]") != NULL); /* first tensor: 15 F32 */
        CHECK(strstr(hdr, "\"data_offsets\":[60,74]") != NULL);
        free(hdr);
        free(raw);

        ts_st *st = NULL;
        ts_status rc = ts_st_open(path, &st);
        CHECKF(rc == TS_OK, "open: %s", ts_last_error());
        if (rc != TS_OK) continue;
        CHECK(ts_st_count(st) == N_SPECS);
        for (size_t i = 0; i < N_SPECS; i++)
            check_tensor(st, &specs[i], path);
        for (size_t i = 1; i < ts_st_count(st); i++)
            CHECK(strcmp(ts_st_name(st, i - 1), ts_st_name(st, i)) < 0);
        CHECK(strcmp(ts_st_name(st, 0), "a.bias") == 0);
        CHECK(ts_st_name(st, N_SPECS) == NULL);
        CHECK(ts_st_find(st, "nope") == NULL);
        CHECK(ts_st_find(st, "a.bia") == NULL);
        CHECK(ts_st_file_of(st, "nope") == NULL);
        const ts_tensor *sc = ts_st_find(st, "c.scalar");
        CHECK(sc && sc->n_dims == 0 && ts_tensor_nelems(sc) == 1 && sc->nbytes == 4);
        ts_st_close(st);
    }
}

static void test_writer_misuse(void) {
    ts_st_writer *w;
    int64_t shape[TS_MAX_DIMS + 1];
    for (int i = 0; i <= TS_MAX_DIMS; i++)
        shape[i] = 2;
    int64_t neg[1] = {-3};
    CHECK(ts_st_writer_new(&w) == TS_OK);
    CHECK(ts_st_writer_add(w, "x", TS_DTYPE_F32, 1, shape) == TS_OK);
    CHECK(ts_st_writer_add(w, "x", TS_DTYPE_F32, 1, shape) == TS_ERR_INVALID);
    CHECK(strstr(ts_last_error(), "'x' declared twice") != NULL);
    CHECK(ts_st_writer_add(w, "q", TS_DTYPE_Q8_0, 1, shape) == TS_ERR_UNSUPPORTED);
    CHECK(ts_st_writer_add(w, "rank", TS_DTYPE_F32, TS_MAX_DIMS + 1, shape) == TS_ERR_INVALID);
    CHECK(ts_st_writer_add(w, "neg", TS_DTYPE_F32, 1, neg) == TS_ERR_INVALID);
    CHECK(ts_st_writer_add(w, "__metadata__", TS_DTYPE_F32, 1, shape) == TS_ERR_INVALID);
    CHECK(ts_st_writer_add(w, "", TS_DTYPE_F32, 1, shape) == TS_ERR_INVALID);
    CHECK(ts_st_writer_add(w, "y", TS_DTYPE_BF16, 2, shape) == TS_OK);
    CHECK(ts_st_writer_write(w, "abc", 3) == TS_ERR_INVALID); /* before begin */

    /* Too few bytes: end fails, naming the short tensor, and nothing appears on disk. */
    const char *short_path = path_in(tmpdir, "short.safetensors");
    CHECK(ts_st_writer_begin(w, short_path) == TS_OK);
    CHECK(ts_st_writer_add(w, "late", TS_DTYPE_F32, 1, shape) == TS_ERR_INVALID);
    float eight[4] = {1, 2, 3, 4};
    CHECK(ts_st_writer_write(w, eight, 8) == TS_OK);
    CHECK(ts_st_writer_write(w, eight, 2) == TS_OK);
    CHECK(ts_st_writer_end(w) == TS_ERR_INVALID);
    CHECKF(strstr(ts_last_error(), "tensor 'y': only 2 of 8 bytes") != NULL, "%s", ts_last_error());
    CHECK(access(short_path, F_OK) != 0);
    CHECK(access(path_in(tmpdir, "short.safetensors.tmp"), F_OK) != 0);
    ts_st_writer_free(w);

    /* Too many bytes. */
    const char *long_path = path_in(tmpdir, "long.safetensors");
    CHECK(ts_st_writer_new(&w) == TS_OK);
    CHECK(ts_st_writer_add(w, "x", TS_DTYPE_F32, 1, shape) == TS_OK);
    CHECK(ts_st_writer_begin(w, long_path) == TS_OK);
    CHECK(ts_st_writer_write(w, eight, 12) == TS_ERR_INVALID);
    CHECK(strstr(ts_last_error(), "beyond the declared") != NULL);
    CHECK(ts_st_writer_end(w) == TS_ERR_INVALID);
    CHECK(access(long_path, F_OK) != 0);
    ts_st_writer_free(w);

    /* Abandoned writer: free discards the temp file. */
    CHECK(ts_st_writer_new(&w) == TS_OK);
    CHECK(ts_st_writer_add(w, "x", TS_DTYPE_F32, 1, shape) == TS_OK);
    CHECK(ts_st_writer_begin(w, long_path) == TS_OK);
    CHECK(access(path_in(tmpdir, "long.safetensors.tmp"), F_OK) == 0);
    ts_st_writer_free(w);
    CHECK(access(path_in(tmpdir, "long.safetensors.tmp"), F_OK) != 0);

    /* An empty checkpoint is valid. */
    const char *empty = path_in(tmpdir, "empty.safetensors");
    CHECK(ts_st_writer_new(&w) == TS_OK);
    CHECK(ts_st_writer_begin(w, empty) == TS_OK);
    CHECK(ts_st_writer_end(w) == TS_OK);
    ts_st_writer_free(w);
    ts_st *st = NULL;
    CHECK(ts_st_open(empty, &st) == TS_OK && ts_st_count(st) == 0);
    CHECK(ts_st_find(st, "x") == NULL);
    ts_st_close(st);
}

/* ---- corrupt single files ----------------------------------------------------------------- */

#define W16 "\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]"

typedef struct {
    const char *what;
    const char *header;
    size_t dlen;
    ts_status code;
    const char *frag[3];
} bad_case;

static const bad_case bad_cases[] = {
    {"malformed JSON", "{\"w\":{\"dtype\":\"F32\"", 16, TS_ERR_FORMAT, {"malformed", "byte"}},
    {"trailing garbage", "{\"w\":{" W16 "}} x", 16, TS_ERR_FORMAT, {"malformed"}},
    {"not an object", "[1,2]", 16, TS_ERR_FORMAT, {"not an object"}},
    {"entry not object", "{\"w\":5}", 16, TS_ERR_FORMAT, {"tensor 'w'", "not an object"}},
    {"dtype missing",
     "{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}",
     16,
     TS_ERR_FORMAT,
     {"tensor 'w'", "field 'dtype': missing"}},
    {"dtype not string",
     "{\"w\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}",
     16,
     TS_ERR_FORMAT,
     {"tensor 'w'", "field 'dtype'", "expected a string"}},
    {"dtype unknown",
     "{\"w\":{\"dtype\":\"Q9\",\"shape\":[2],\"data_offsets\":[0,8]}}",
     16,
     TS_ERR_FORMAT,
     {"tensor 'w'", "unknown dtype \"Q9\""}},
    {"dtype I8",
     "{\"w\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[0,2]}}",
     16,
     TS_ERR_UNSUPPORTED,
     {"tensor 'w'", "dtype I8"}},
    {"dtype F64",
     "{\"w\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}}",
     16,
     TS_ERR_UNSUPPORTED,
     {"tensor 'w'", "dtype F64"}},
    {"dtype U8",
     "{\"m\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}",
     16,
     TS_ERR_UNSUPPORTED,
     {"tensor 'm'", "dtype U8"}},
    {"shape missing",
     "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,16]}}",
     16,
     TS_ERR_FORMAT,
     {"tensor 'w'", "field 'shape': missing"}},
    {"shape not array",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}",
     16,
     TS_ERR_FORMAT,
     {"tensor 'w'", "field 'shape'", "expected an array"}},
    {"shape negative",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-2],\"data_offsets\":[0,16]}}",
     16,
     TS_ERR_FORMAT,
     {"tensor 'w'", "field 'shape'", "dimension 1 is -2"}},
    {"shape fraction",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,16]}}",
     16,
     TS_ERR_FORMAT,
     {"tensor 'w'", "field 'shape'", "dimension 0 is 2.5"}},
    {"shape string",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"4\"],\"data_offsets\":[0,16]}}",
     16,
     TS_ERR_FORMAT,
     {"tensor 'w'", "field 'shape'", "dimension 0 is \"4\""}},
    {"elements overflow",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,2],\"data_offsets\":[0,16]}}",
     16,
     TS_ERR_FORMAT,
     {"tensor 'w'", "field 'shape'", "element count overflows"}},
    {"bytes overflow",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,16]}}",
     16,
     TS_ERR_FORMAT,
     {"tensor 'w'", "field 'shape'", "byte size overflows"}},
    {"offsets missing",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2]}}",
     16,
     TS_ERR_FORMAT,
     {"tensor 'w'", "field 'data_offsets': missing"}},
    {"offsets not array",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":16}}",
     16,
     TS_ERR_FORMAT,
     {"tensor 'w'", "field 'data_offsets'", "expected [begin, end]"}},
    {"offsets three",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,8,16]}}",
     16,
     TS_ERR_FORMAT,
     {"tensor 'w'", "field 'data_offsets'", "expected [begin, end]"}},
    {"begin negative",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[-4,12]}}",
     16,
     TS_ERR_FORMAT,
     {"tensor 'w'", "field 'data_offsets'", "begin is -4"}},
    {"end string",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,\"16\"]}}",
     16,
     TS_ERR_FORMAT,
     {"tensor 'w'", "field 'data_offsets'", "end is \"16\""}},
    {"end before begin",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[16,0]}}",
     32,
     TS_ERR_FORMAT,
     {"tensor 'w'", "field 'data_offsets'", "end 0 is before begin 16"}},
    {"end beyond data",
     "{\"w\":{" W16 "}}",
     12,
     TS_ERR_FORMAT,
     {"tensor 'w'", "field 'data_offsets'", "end 16 is beyond the data area (12 bytes"}},
    {"span mismatch",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}",
     16,
     TS_ERR_FORMAT,
     {"tensor 'w'", "field 'data_offsets'", "span of 12 bytes does not match"}},
    {"overlap",
     "{\"a\":{" W16 "},\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[14,22]}}",
     32,
     TS_ERR_FORMAT,
     {"tensor 'b' [14, 22) overlaps tensor 'a' [0, 16)"}},
    {"overlap hidden behind a long tensor",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
     "\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[20,24]}}",
     32,
     TS_ERR_FORMAT,
     {"overlaps tensor 'a'"}},
    {"duplicate name",
     "{\"w\":{" W16 "},\"w\":{" W16 "}}",
     16,
     TS_ERR_FORMAT,
     {"names a tensor twice", "'\"w\"'"}},
};

/* Files the reader must accept: metadata, space padding, empty tensors touching others. */
static const char *good_headers[] = {
    "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{" W16 "}}",
    "{\"w\":{" W16 "}}        ",
    "{\"w\":{" W16 ",\"extra\":1},\"e\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[8,8]}}",
    "{\"w\":{" W16 "},\"z\":{\"dtype\":\"F32\",\"shape\":[0,4294967296,4294967296],"
    "\"data_offsets\":[16,16]}}",
};

static void test_corrupt_files(void) {
    const char *p = path_in(tmpdir, "bad.safetensors");

    write_bytes(p, "\x10\0\0\0\0", 5);
    expect_refused("5-byte file", p, TS_ERR_FORMAT, "5 bytes", "shorter than the 8-byte", NULL);
    write_bytes(p, "", 0);
    expect_refused("empty file", p, TS_ERR_FORMAT, "0 bytes", NULL, NULL);
    write_raw_len(p, (uint64_t)200 << 20, "{}", 0);
    expect_refused("header over cap", p, TS_ERR_FORMAT, "header length 209715200", "cap", NULL);
    write_raw_len(p, UINT64_MAX, "{}", 0);
    expect_refused("header length 2^64-1", p, TS_ERR_FORMAT, "cap", NULL, NULL);
    write_raw_len(p, 1000, "{\"w\":{" W16 "}}", 16);
    expect_refused("header past EOF", p, TS_ERR_FORMAT, "header length 1000 exceeds", NULL, NULL);

    /* One dimension more than a ts_tensor holds: well-formed, but not loadable. */
    char hdr[256], frag[32];
    int k = snprintf(hdr, sizeof hdr, "{\"v\":{\"dtype\":\"F32\",\"shape\":[2,2");
    for (int d = 2; d <= TS_MAX_DIMS; d++)
        k += snprintf(hdr + k, sizeof hdr - (size_t)k, ",1");
    snprintf(hdr + k, sizeof hdr - (size_t)k, "],\"data_offsets\":[0,16]}}");
    snprintf(frag, sizeof frag, "%d dimensions", TS_MAX_DIMS + 1);
    write_raw(p, hdr, 16);
    expect_refused("too many dims", p, TS_ERR_UNSUPPORTED, "tensor 'v'", frag, NULL);

    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *c = &bad_cases[i];
        write_raw(p, c->header, c->dlen);
        expect_refused(c->what, p, c->code, c->frag[0], c->frag[1], c->frag[2]);
    }
    for (size_t i = 0; i < sizeof good_headers / sizeof good_headers[0]; i++) {
        write_raw(p, good_headers[i], 16);
        ts_st *st = NULL;
        ts_status rc = ts_st_open(p, &st);
        CHECKF(rc == TS_OK, "good header %zu refused: %s", i, ts_last_error());
        if (rc != TS_OK) continue;
        const ts_tensor *t = ts_st_find(st, "w");
        CHECK(t && t->dtype == TS_DTYPE_F32 && t->nbytes == 16 && t->shape[1] == 2);
        CHECK(ts_st_find(st, "__metadata__") == NULL);
        ts_st_close(st);
    }
    /* No tensors at all: opens empty. Found by fuzz_safetensors: the overlap check was handed
     * NULL + 0 (undefined behaviour; UBSan stops the sanitized build here). */
    static const char *const no_tensors[] = {"{}", "{\"__metadata__\":{\"format\":\"pt\"}}"};
    for (size_t i = 0; i < sizeof no_tensors / sizeof no_tensors[0]; i++) {
        write_raw(p, no_tensors[i], 0);
        ts_st *st = NULL;
        ts_status rc = ts_st_open(p, &st);
        CHECKF(rc == TS_OK, "header %s refused: %s", no_tensors[i], ts_last_error());
        CHECK(ts_st_count(st) == 0 && ts_st_name(st, 0) == NULL && ts_st_find(st, "w") == NULL);
        ts_st_close(st);
    }
    expect_refused("missing file", path_in(tmpdir, "nonexistent.safetensors"), TS_ERR_IO,
                   "cannot open", NULL, NULL);
}

/* Every proper prefix of a valid file is refused cleanly; so is every single-byte mutation of
 * the header into a structural character (no crash, and any accepted result stays in bounds). */
static void test_truncations(void) {
    const char *src = path_in(tmpdir, "rt.safetensors");
    size_t n;
    unsigned char *raw = fx_read_file(src, &n);
    CHECK(raw != NULL);
    if (!raw) return;
    const char *p = path_in(tmpdir, "trunc.safetensors");
    int refused = 0;
    for (size_t len = 0; len < n; len++) {
        write_bytes(p, raw, len);
        ts_st *st = NULL;
        ts_status rc = ts_st_open(p, &st);
        CHECKF(rc == TS_ERR_FORMAT && st == NULL, "prefix of %zu/%zu bytes: %s (%s)", len, n,
               ts_status_name(rc), ts_last_error());
        if (rc == TS_ERR_FORMAT) refused++;
        if (st) ts_st_close(st);
    }
    CHECK(refused == (int)n);

    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | raw[i];
    static const char subst[] = "\"-9}],.: e0";
    volatile unsigned sink = 0;
    unsigned char *m = malloc(n);
    for (size_t pos = 8; pos < 8 + hlen; pos++) {
        for (size_t k = 0; k < sizeof subst - 1; k++) {
            memcpy(m, raw, n);
            m[pos] = (unsigned char)subst[k];
            write_bytes(p, m, n);
            ts_st *st = NULL;
            if (ts_st_open(p, &st) != TS_OK) continue;
            /* Whatever was accepted must be readable end to end. */
            for (size_t i = 0; i < ts_st_count(st); i++) {
                const ts_tensor *t = ts_st_find(st, ts_st_name(st, i));
                const unsigned char *d = t->data;
                CHECK(t->nbytes <= n);
                for (uint64_t j = 0; j < t->nbytes; j++)
                    sink += d[j];
            }
            ts_st_close(st);
        }
    }
    free(m);
    free(raw);
}

/* ---- directories and shards -------------------------------------------------------------- */

static const char *SHARD1 = "model-00001-of-00002.safetensors";
static const char *SHARD2 = "model-00002-of-00002.safetensors";

/* specs[0..3) in shard 1, specs[3..6) in shard 2. */
static char *make_sharded(const char *name) {
    char *dir = make_dir(name);
    write_specs(path_in(dir, SHARD1), 0, 3, 0);
    write_specs(path_in(dir, SHARD2), 3, N_SPECS, 0);
    return dir;
}

static void write_index(const char *dir, const char *weight_map) {
    char buf[4096];
    snprintf(buf, sizeof buf, "{\"metadata\":{\"total_size\":1},\"weight_map\":%s}", weight_map);
    write_text(path_in(dir, "model.safetensors.index.json"), buf);
}

static void full_map(char *buf, size_t size, const char *override_key, const char *override_shard) {
    size_t k = (size_t)snprintf(buf, size, "{");
    for (size_t i = 0; i < N_SPECS; i++) {
        const char *shard = i < 3 ? SHARD1 : SHARD2;
        if (override_key && strcmp(specs[i].name, override_key) == 0) shard = override_shard;
        k += (size_t)snprintf(buf + k, size - k, "%s\"%s\":\"%s\"", i ? "," : "", specs[i].name,
                              shard);
    }
    snprintf(buf + k, size - k, "}");
}

static void test_sharded(void) {
    char map[2048];
    char *dir = make_sharded("sharded");
    full_map(map, sizeof map, NULL, NULL);
    write_index(dir, map);
    /* A stray model.safetensors must lose to the index. */
    write_specs(path_in(dir, "model.safetensors"), 0, 1, 0);
    ts_st *st = NULL;
    ts_status rc = ts_st_open(dir, &st);
    CHECKF(rc == TS_OK, "sharded open: %s", ts_last_error());
    if (rc == TS_OK) {
        CHECK(ts_st_count(st) == N_SPECS);
        for (size_t i = 0; i < N_SPECS; i++)
            check_tensor(st, &specs[i], path_in(dir, i < 3 ? SHARD1 : SHARD2));
        ts_st_close(st);
    }

    /* A lone model.safetensors in a directory. */
    char *one = make_dir("single");
    write_specs(path_in(one, "model.safetensors"), 0, N_SPECS, 0);
    rc = ts_st_open(one, &st);
    CHECKF(rc == TS_OK, "single-file dir: %s", ts_last_error());
    if (rc == TS_OK) {
        CHECK(ts_st_count(st) == N_SPECS);
        check_tensor(st, &specs[4], path_in(one, "model.safetensors"));
        ts_st_close(st);
    }

    char *empty = make_dir("emptydir");
    expect_refused("empty directory", empty, TS_ERR_IO, "no model.safetensors", NULL, NULL);

    const char *ipath;
    dir = make_sharded("wrongshard");
    full_map(map, sizeof map, "e.f16", SHARD1);
    write_index(dir, map);
    ipath = path_in(dir, "model.safetensors.index.json");
    expect_refused("tensor mapped to the wrong shard", dir, TS_ERR_FORMAT, ipath,
                   "tensor 'e.f16' is mapped to model-00001", "stored in model-00002");

    dir = make_sharded("ghost");
    full_map(map, sizeof map, NULL, NULL);
    map[strlen(map) - 1] = 0;
    strcat(map, ",\"ghost.weight\":\"model-00002-of-00002.safetensors\"}");
    write_index(dir, map);
    expect_refused("mapped tensor absent", dir, TS_ERR_FORMAT, "tensor 'ghost.weight'",
                   "does not contain it", NULL);

    dir = make_sharded("traversal");
    full_map(map, sizeof map, "a.bias", "../traversal/model-00001-of-00002.safetensors");
    write_index(dir, map);
    expect_refused("shard path with ..", dir, TS_ERR_FORMAT, "tensor 'a.bias'",
                   "not a plain file name", NULL);
    full_map(map, sizeof map, "a.bias", "..");
    write_index(dir, map);
    expect_refused("shard named ..", dir, TS_ERR_FORMAT, "not a plain file name", NULL, NULL);
    full_map(map, sizeof map, "a.bias", "/etc/passwd");
    write_index(dir, map);
    expect_refused("absolute shard path", dir, TS_ERR_FORMAT, "not a plain file name", NULL, NULL);
    full_map(map, sizeof map, "a.bias", "");
    write_index(dir, map);
    expect_refused("empty shard name", dir, TS_ERR_FORMAT, "not a plain file name", NULL, NULL);

    dir = make_sharded("missingshard");
    full_map(map, sizeof map, "a.bias", "model-00003-of-00002.safetensors");
    write_index(dir, map);
    expect_refused("missing shard file", dir, TS_ERR_IO, "model-00003-of-00002.safetensors",
                   "cannot open", NULL);

    /* Shard 3 repeats a tensor of shard 1. */
    dir = make_sharded("twice");
    write_specs(path_in(dir, "model-extra.safetensors"), 2, 3, 0);
    full_map(map, sizeof map, NULL, NULL);
    map[strlen(map) - 1] = 0;
    strcat(map, ",\"other\":\"model-extra.safetensors\"}");
    write_index(dir, map);
    expect_refused("tensor in two shards", dir, TS_ERR_FORMAT, "tensor 'c.scalar' appears in both",
                   "model-extra.safetensors", SHARD1);

    dir = make_sharded("badindex");
    ipath = path_in(dir, "model.safetensors.index.json");
    write_text(ipath, "{\"weight_map\": {\"a\": ");
    expect_refused("index malformed", dir, TS_ERR_FORMAT, ipath, "malformed", NULL);
    write_text(ipath, "{\"metadata\": {}}");
    expect_refused("index without weight_map", dir, TS_ERR_FORMAT, "field 'weight_map': missing",
                   NULL, NULL);
    write_text(ipath, "{\"weight_map\": [1]}");
    expect_refused("weight_map not object", dir, TS_ERR_FORMAT, "field 'weight_map'",
                   "expected an object", NULL);
    write_text(ipath, "{\"weight_map\": {}}");
    expect_refused("weight_map empty", dir, TS_ERR_FORMAT, "lists no tensors", NULL, NULL);
    write_text(ipath, "{\"weight_map\": {\"a.bias\": 3}}");
    expect_refused("shard not string", dir, TS_ERR_FORMAT, "tensor 'a.bias'",
                   "expected a shard file name", NULL);
    write_text(ipath, "[]");
    expect_refused("index not object", dir, TS_ERR_FORMAT, "not a JSON object", NULL, NULL);

    /* A corrupt shard is reported with the shard's own path. */
    dir = make_sharded("corruptshard");
    full_map(map, sizeof map, NULL, NULL);
    write_index(dir, map);
    write_raw(path_in(dir, SHARD2), "{\"w\":{" W16 "}}", 8);
    expect_refused("corrupt shard", path_in(dir, SHARD2), TS_ERR_FORMAT, "beyond the data area",
                   NULL, NULL);
    rc = ts_st_open(dir, &st);
    CHECK(rc == TS_ERR_FORMAT && strstr(ts_last_error(), SHARD2) != NULL);
}

/* ---- cleanup ------------------------------------------------------------------------------ */

static void rm_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
            rm_tree(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ts_safetensors_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    make_specs();
    test_round_trip();
    test_writer_misuse();
    test_corrupt_files();
    test_truncations();
    test_sharded();
    for (size_t i = 0; i < N_SPECS; i++)
        free(specs[i].data);
    for (int i = 0; i < n_dirs; i++)
        free(dirs[i]);
    if (!tu_failures)
        rm_tree(tmpdir);
    else
        fprintf(stderr, "test files kept in %s\n", tmpdir);
    return tu_report("test_safetensors");
}
