#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"

int cli_fail(const char *what) {
    fprintf(stderr, "tessera: %s: %s\n", what, ts_last_error());
    return CLI_EXIT_ERROR;
}

int cli_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("tessera: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(" (see 'tessera help')\n", stderr);
    va_end(ap);
    return CLI_EXIT_USAGE;
}

const char *cli_opt_value(int argc, char **argv, int *i, const char *short_name,
                          const char *long_name) {
    const char *a = argv[*i];
    if (!((short_name && strcmp(a, short_name) == 0) || (long_name && strcmp(a, long_name) == 0)))
        return NULL;
    if (*i + 1 >= argc) return "";
    *i += 1;
    return argv[*i];
}

bool cli_parse_int(const char *s, long lo, long hi, long *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool cli_parse_float(const char *s, double *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end) return false;
    *out = v;
    return true;
}

bool cli_parse_pooling(const char *s, ts_pooling *out) {
    if (strcmp(s, "last") == 0)
        *out = TS_POOL_LAST;
    else if (strcmp(s, "mean") == 0)
        *out = TS_POOL_MEAN;
    else if (strcmp(s, "cls") == 0 || strcmp(s, "first") == 0)
        *out = TS_POOL_FIRST;
    else
        return false;
    return true;
}

bool cli_parse_ids(const char *s, int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    if (!s || !*s) return false;
    int cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *v = malloc((size_t)cap * sizeof *v);
    if (!v) return false;
    int k = 0;
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX || (*end != ',' && *end != 0)) {
            free(v);
            return false;
        }
        v[k++] = (int32_t)x;
        if (*end == 0) break;
        p = end + 1;
    }
    *ids = v;
    *n = k;
    return true;
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

bool cli_read_file(const char *path, size_t max, char **text, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *p = cap < max ? realloc(buf, cap * 2) : NULL;
            if (!p) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = p, cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - 1 - n, f);
        n += got;
        if (got == 0) break;
    }
    bool ok = buf && !ferror(f);
    fclose(f);
    if (!ok) {
        free(buf);
        return false;
    }
    buf[n] = 0;
    *text = buf, *len = n;
    return true;
}
