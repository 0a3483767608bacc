/* Reading the Hugging Face reference fixtures (tests/fixtures/qwen35/<model>/ref/), and test
 * files in general. */
#ifndef TS_FIXTURE_UTIL_H
#define TS_FIXTURE_UTIL_H

#include "tessera.h"

#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A whole file into a malloc'd buffer (one byte more than *n, for callers that terminate it);
 * NULL when it cannot be opened. */
static inline unsigned char *fx_read_file(const char *path, size_t *n) {
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(sz > 0 ? (size_t)sz + 1 : 1);
    *n = fread(b, 1, sz > 0 ? (size_t)sz : 0, f);
    fclose(f);
    return b;
}

/* Reads whitespace-separated ints from line `line` (0-based) of a text file. */
static inline int fx_read_ids(const char *path, int line, int32_t **ids, int *n) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char *buf = NULL;
    size_t cap = 0;
    ssize_t len = 0;
    for (int l = 0; l <= line; l++)
        if ((len = getline(&buf, &cap, f)) < 0) {
            free(buf);
            fclose(f);
            return -1;
        }
    fclose(f);
    int k = 0, alloc = 16;
    int32_t *v = malloc(alloc * sizeof *v);
    char *p = buf, *end;
    for (;;) {
        long x = strtol(p, &end, 10);
        if (end == p) break;
        if (k == alloc) v = realloc(v, (alloc *= 2) * sizeof *v);
        v[k++] = (int32_t)x;
        p = end;
    }
    free(buf);
    *ids = v;
    *n = k;
    return 0;
}

static inline float *fx_read_floats(const char *path, long n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    float *v = malloc((size_t)n * sizeof *v);
    long got = (long)fread(v, sizeof *v, (size_t)n, f);
    int extra = fgetc(f);
    fclose(f);
    if (got != n || extra != EOF) {
        free(v);
        return NULL;
    }
    return v;
}

/* Lists the model directories under dir into names (up to cap); returns the count, sorted. */
static int fx_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}
static inline int fx_list_models(const char *dir, char **names, int cap) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < cap) {
        if (e->d_name[0] == '.') continue;
        char p[8192];
        snprintf(p, sizeof p, "%s/%s/config.json", dir, e->d_name);
        FILE *f = fopen(p, "r");
        if (!f) continue;
        fclose(f);
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, fx_cmp);
    return n;
}

/* ||a - ref|| / ||ref|| over n values, in double */
static inline double fx_rel_err(const float *a, const float *ref, long n) {
    double e = 0, d = 0;
    for (long i = 0; i < n; i++)
        e += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]), d += (double)ref[i] * ref[i];
    return sqrt(e / (d > 0 ? d : 1));
}

/* The first index of the largest of n values */
static inline int fx_argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* An engine for m as o asks; NULL with *skip set where o asks for a GPU and none is usable
 * (the test then reports itself skipped), NULL with the reason printed on any other failure. */
static inline ts_engine *fx_engine(ts_model *m, const ts_engine_opts *o, bool *skip) {
    ts_engine *e = NULL;
    ts_status st = ts_engine_create(m, o, &e);
    if (st == TS_ERR_UNSUPPORTED && o->device == TS_DEVICE_CUDA)
        *skip = true;
    else if (st != TS_OK)
        fprintf(stderr, "engine: %s\n", ts_last_error());
    return e;
}

/* Every position's logits of ids run through slot (cleared first) in one forward: n rows of
 * the vocabulary, malloc'd; NULL (the error printed) when the forward fails. */
static inline float *fx_prefill_all(ts_engine *e, int slot, const int32_t *ids, int n) {
    int V = ts_engine_n_vocab(e);
    float *out = malloc((size_t)n * V * sizeof *out);
    int32_t *pos = malloc((size_t)n * 4), *sl = malloc((size_t)n * 4);
    uint8_t *want = malloc((size_t)n);
    for (int i = 0; i < n; i++)
        pos[i] = i, sl[i] = slot, want[i] = 1;
    ts_batch b = {n, ids, pos, sl, want, NULL, NULL};
    ts_engine_slot_clear(e, slot);
    if (ts_engine_forward(e, &b, out) != TS_OK) {
        fprintf(stderr, "forward: %s\n", ts_last_error());
        free(out);
        out = NULL;
    }
    free(pos), free(sl), free(want);
    return out;
}

#endif
