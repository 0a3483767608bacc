/* How the long strings are kept out of jansson (json_load.h): one pass over the text finds its
 * depth and its long plain string values; a copy of the text has each one's contents replaced
 * by a marker, "\u0000" and the string's index, which jansson parses with JSON_ALLOW_NUL; a
 * walk of the tree then sets each marker's string to its bytes of the body (nocheck: printable
 * ASCII is valid UTF-8 and, without escapes, equal to its text). Only a body without any
 * "\u0000" of its own takes this way, so a string that starts with NUL is always a marker; a
 * body that is not JSON is parsed again whole, so that its error is the one jansson gives. */
#include "serve/json_load.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    size_t at, len; /* the contents, without the quotes */
} long_str;

typedef struct {
    long_str *v;
    size_t n, cap;
    bool failed; /* out of memory: parsed the plain way */
} long_list;

static void add(long_list *l, size_t at, size_t len) {
    if (l->failed) return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        long_str *v = realloc(l->v, cap * sizeof *v);
        if (!v) {
            l->failed = true;
            return;
        }
        l->v = v, l->cap = cap;
    }
    l->v[l->n++] = (long_str){at, len};
}

static bool plain(unsigned char c) { return c >= 0x20 && c < 0x7F && c != '"' && c != '\\'; }

/* The first byte at or after i that is not plain: eight at a time while none of the eight is a
 * quote, a backslash, a control byte, 0x7F or above (each test says whether some byte is so,
 * never misses one; the byte loop then finds which). */
static size_t skip_plain(const unsigned char *s, size_t i, size_t n) {
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    for (; i + 8 <= n; i += 8) {
        uint64_t x, q, b, d;
        memcpy(&x, s + i, 8);
        q = x ^ (ones * '"'), b = x ^ (ones * '\\'), d = x ^ (ones * 0x7F);
        uint64_t zero = ((q - ones) & ~q) | ((b - ones) & ~b) | ((d - ones) & ~d);
        if ((zero | ((x - ones * 0x20) & ~x) | x) & highs) break;
    }
    while (i < n && plain(s[i]))
        i++;
    return i;
}

static bool space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* One pass: the nesting depth, the long plain string values, and whether any "\u0000" */
static int scan(const unsigned char *s, size_t n, size_t min_long, long_list *l, bool *has_nul) {
    int depth = 0, max = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i++];
        if (c == '[' || c == '{') {
            if (++depth > max) max = depth;
        } else if (c == ']' || c == '}') {
            depth--;
        } else if (c == '"') {
            size_t at = i;
            bool is_plain = true;
            for (;;) {
                i = skip_plain(s, i, n);
                if (i >= n || s[i] == '"') break;
                is_plain = false;
                if (s[i] == '\\') {
                    if (n - i > 5 && memcmp(s + i + 1, "u0000", 5) == 0) *has_nul = true;
                    i += 2;
                } else {
                    i++;
                }
            }
            if (i >= n) break; /* unterminated: jansson says so */
            size_t len = i - at, k = ++i;
            while (k < n && space(s[k]))
                k++;
            if (is_plain && len >= min_long && (k == n || s[k] != ':')) add(l, at, len);
        }
    }
    return max;
}

/* Sets every marker's string in v to its bytes of the body; false for a stranger */
static bool restore(json_t *v, const char *body, const long_list *l, size_t *done) {
    if (json_is_string(v)) {
        const char *p = json_string_value(v);
        size_t n = json_string_length(v), k = 0;
        if (n == 0 || p[0] != '\0') return true;
        if (n < 2) return false;
        for (size_t j = 1; j < n; j++) {
            if (p[j] < '0' || p[j] > '9') return false;
            k = 10 * k + (size_t)(p[j] - '0');
            if (k >= l->n) return false;
        }
        (*done)++;
        return json_string_setn_nocheck(v, body + l->v[k].at, l->v[k].len) == 0;
    }
    const char *key;
    json_t *x;
    size_t i;
    if (json_is_object(v)) {
        json_object_foreach(v, key, x) if (!restore(x, body, l, done)) return false;
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, x) if (!restore(x, body, l, done)) return false;
    }
    return true;
}

/* The text with each long string's contents replaced by its marker; NULL when out of memory */
static char *with_markers(const char *body, size_t len, const long_list *l, size_t *out_len) {
    size_t cut = 0;
    for (size_t k = 0; k < l->n; k++)
        cut += l->v[k].len;
    size_t cap = len - cut + l->n * 32 + 1, o = 0, from = 0;
    char *t = malloc(cap);
    if (!t) return NULL;
    for (size_t k = 0; k < l->n; k++) {
        memcpy(t + o, body + from, l->v[k].at - from);
        o += l->v[k].at - from;
        o += (size_t)snprintf(t + o, cap - o, "\\u0000%zu", k);
        from = l->v[k].at + l->v[k].len;
    }
    memcpy(t + o, body + from, len - from);
    *out_len = o + len - from;
    return t;
}

json_t *serve_json_load(const char *body, size_t len, size_t min_long, int max_depth,
                        bool *too_deep, json_error_t *err, size_t *n_long) {
    long_list l = {0};
    if (n_long) *n_long = 0;
    bool has_nul = false;
    *too_deep =
        scan((const unsigned char *)body, len, min_long ? min_long : 1, &l, &has_nul) > max_depth;
    if (*too_deep) {
        free(l.v);
        return NULL;
    }
    json_t *v = NULL;
    if (l.n && !l.failed && !has_nul) {
        size_t tn;
        char *t = with_markers(body, len, &l, &tn);
        json_error_t terr;
        v = t ? json_loadb(t, tn, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &terr) : NULL;
        free(t);
        size_t done = 0;
        if (v && (!restore(v, body, &l, &done) || done != l.n)) {
            json_decref(v); /* cannot happen; the plain way decides */
            v = NULL;
        }
        if (v && n_long) *n_long = done;
    }
    free(l.v);
    return v ? v : json_loadb(body, len, JSON_REJECT_DUPLICATES, err);
}
