/* libFuzzer target for the safetensors reader: any header must be refused with a status or
 * opened with every tensor inside its file, of the size its shape says, and no two sharing bytes.
 * ts_st_open only takes a path, so each input is written to a scratch file (fuzz_util.h).
 *
 * The first byte picks the layout: even, the rest is one .safetensors file; odd, the rest is a
 * model.safetensors.index.json beside two small valid shards (a.safetensors, b.safetensors)
 * written at start-up, which exercises the index checks (shard names, the weight map). */
#include "format/safetensors.h"
#include "fuzz_util.h"

#include <stdint.h>
#include <sys/stat.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char shard_dir[300];

static void write_shard(const char *name, const char *t1, ts_dtype d1, int nd1, const int64_t *s1,
                        const char *t2, ts_dtype d2, int nd2, const int64_t *s2) {
    char path[400];
    snprintf(path, sizeof path, "%s/%s", shard_dir, name);
    ts_st_writer *w;
    static const unsigned char zeros[64];
    int64_t n1 = 1, n2 = 1;
    for (int i = 0; i < nd1; i++)
        n1 *= s1[i];
    for (int i = 0; i < nd2; i++)
        n2 *= s2[i];
    if (ts_st_writer_new(&w) != TS_OK || ts_st_writer_add(w, t1, d1, nd1, s1) != TS_OK ||
        ts_st_writer_add(w, t2, d2, nd2, s2) != TS_OK || ts_st_writer_begin(w, path) != TS_OK ||
        ts_st_writer_write(w, zeros, (size_t)n1 * (size_t)ts_dtype_block_bytes(d1)) != TS_OK ||
        ts_st_writer_write(w, zeros, (size_t)n2 * (size_t)ts_dtype_block_bytes(d2)) != TS_OK ||
        ts_st_writer_end(w) != TS_OK) {
        fprintf(stderr, "fuzz_safetensors: cannot write %s: %s\n", path, ts_last_error());
        abort();
    }
    ts_st_writer_free(w);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    snprintf(shard_dir, sizeof shard_dir, "%s", fz_tmpdir());
    const int64_t s23[] = {2, 3}, s4[] = {4}, s1[] = {1}, s0[] = {0};
    write_shard("a.safetensors", "x", TS_DTYPE_F32, 2, s23, "y", TS_DTYPE_BF16, 1, s4);
    write_shard("b.safetensors", "z", TS_DTYPE_F16, 1, s1, "w", TS_DTYPE_F32, 1, s0);
    return 0;
}

typedef struct {
    const uint8_t *p;
    uint64_t n;
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->p < y->p ? -1 : x->p > y->p;
}

static void check(const ts_st *st) {
    size_t n = ts_st_count(st);
    span *sp = calloc(n ? n : 1, sizeof *sp);
    FZ_ASSERT(sp);
    for (size_t i = 0; i < n; i++) {
        const char *name = ts_st_name(st, i);
        FZ_ASSERT(name);
        if (i) FZ_ASSERT(strcmp(ts_st_name(st, i - 1), name) < 0); /* sorted, no repeats */
        const ts_tensor *t = ts_st_find(st, name);
        FZ_ASSERT(t && ts_st_file_of(st, name));
        uint64_t elems = 1;
        for (int d = 0; d < t->n_dims; d++)
            elems *= (uint64_t)t->shape[d];
        FZ_ASSERT(t->nbytes == elems * (uint64_t)ts_dtype_block_bytes(t->dtype));
        fz_touch(t->data, (size_t)t->nbytes);
        sp[i] = (span){t->data, t->nbytes};
    }
    qsort(sp, n, sizeof *sp, cmp_span);
    const span *reach = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!sp[i].n) continue;
        FZ_ASSERT(!reach || sp[i].p >= reach->p + reach->n);
        reach = &sp[i];
    }
    free(sp);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *path;
    if (data[0] & 1) {
        fz_write("model.safetensors.index.json", data + 1, size - 1);
        path = shard_dir;
    } else {
        path = fz_write("one.safetensors", data + 1, size - 1);
    }
    ts_st *st;
    if (ts_st_open(path, &st) == TS_OK) {
        check(st);
        ts_st_close(st);
    }
    return 0;
}
