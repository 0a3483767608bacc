#include "text/utf8.h"

#include "base/status.h"

#include <stdlib.h>
#include <string.h>

ts_utf8_kind ts_utf8_next(const char *s, size_t n, uint32_t *cp, size_t *len) {
    const uint8_t *p = (const uint8_t *)s;
    uint8_t b0 = p[0];
    if (b0 < 0x80) {
        *cp = b0;
        *len = 1;
        return TS_UTF8_CHAR;
    }
    /* The allowed range of the second byte excludes overlong forms (E0, F0), surrogates (ED)
     * and code points above U+10FFFF (F4); later bytes are plain continuation bytes. */
    size_t need;
    uint32_t c;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 1;
        c = b0 & 0x1Fu;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 2;
        c = b0 & 0x0Fu;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 3;
        c = b0 & 0x07u;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else {
        *cp = 0xFFFD;
        *len = 1;
        return TS_UTF8_INVALID;
    }
    for (size_t i = 1; i <= need; i++) {
        if (i >= n) {
            *cp = 0xFFFD;
            *len = n;
            return TS_UTF8_TRUNCATED;
        }
        uint8_t b = p[i];
        if (b < lo || b > hi) {
            *cp = 0xFFFD;
            *len = i;
            return TS_UTF8_INVALID;
        }
        lo = 0x80;
        hi = 0xBF;
        c = (c << 6) | (b & 0x3Fu);
    }
    *cp = c;
    *len = need + 1;
    return TS_UTF8_CHAR;
}

/* Length of the longest prefix of s[0..n) that is whole, valid characters. */
static size_t utf8_valid_prefix(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        /* ASCII dominates real text: skip it eight bytes at a time. */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if ((uint8_t)s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        size_t len;
        if (ts_utf8_next(s + i, n - i, &cp, &len) != TS_UTF8_CHAR) return i;
        i += len;
    }
    return n;
}

bool ts_utf8_valid(const char *s, size_t n) { return utf8_valid_prefix(s, n) == n; }

size_t ts_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp > 0x10FFFF) return 0;
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- growable byte buffer ------------------------------------------------------------------ */

ts_status ts_strbuf_reserve(ts_strbuf *b, size_t extra) {
    if (extra > SIZE_MAX / 2 - b->len - 1) return ts_error(TS_ERR_NOMEM, "string too long");
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return TS_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) return ts_error(TS_ERR_NOMEM, "out of memory (%zu bytes)", cap);
    b->data = p;
    b->cap = cap;
    b->data[b->len] = '\0';
    return TS_OK;
}

ts_status ts_strbuf_append(ts_strbuf *b, const char *s, size_t n) {
    TS_TRY(ts_strbuf_reserve(b, n));
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return TS_OK;
}

void ts_strbuf_free(ts_strbuf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* Appends the whole characters of s[0..n) with ill-formed subparts replaced. When keep_tail
 * is set, a truncated sequence at the end is not emitted; its length goes to *tail. */
static ts_status utf8_lossy(ts_strbuf *out, const char *s, size_t n, bool keep_tail, size_t *tail) {
    size_t i = 0;
    if (tail) *tail = 0;
    while (i < n) {
        size_t good = utf8_valid_prefix(s + i, n - i);
        TS_TRY(ts_strbuf_append(out, s + i, good));
        i += good;
        if (i >= n) break;
        uint32_t cp;
        size_t len;
        ts_utf8_kind kind = ts_utf8_next(s + i, n - i, &cp, &len);
        if (kind == TS_UTF8_TRUNCATED && keep_tail) {
            *tail = len;
            break;
        }
        TS_TRY(ts_strbuf_append(out, TS_UTF8_REPLACEMENT, 3));
        i += len;
    }
    return TS_OK;
}

ts_status ts_utf8_append_lossy(ts_strbuf *out, const char *s, size_t n) {
    TS_TRY(ts_strbuf_reserve(out, n));
    return utf8_lossy(out, s, n, false, NULL);
}

/* ---- incremental detokenizer ------------------------------------------------------------- */

struct ts_detok {
    ts_token_source src;
    bool skip_special;
    char held[4]; /* a character's first bytes, waiting for the rest (at most 3) */
    size_t n_held;
    ts_strbuf work; /* held bytes + the new token's bytes */
    ts_strbuf out;  /* text returned by the last call */
};

ts_status ts_detok_create(const ts_token_source *src, bool skip_special, ts_detok **out) {
    *out = NULL;
    if (!src || !src->token_bytes) return ts_error(TS_ERR_INVALID, "detokenizer: no token source");
    ts_detok *d = calloc(1, sizeof *d);
    if (!d) return ts_error(TS_ERR_NOMEM, "detokenizer: out of memory");
    d->src = *src;
    d->skip_special = skip_special;
    ts_status st = ts_strbuf_reserve(&d->out, 256);
    if (st == TS_OK) st = ts_strbuf_reserve(&d->work, 256);
    if (st != TS_OK) {
        ts_detok_free(d);
        return st;
    }
    *out = d;
    return TS_OK;
}

void ts_detok_free(ts_detok *d) {
    if (!d) return;
    ts_strbuf_free(&d->work);
    ts_strbuf_free(&d->out);
    free(d);
}

ts_status ts_detok_push(ts_detok *d, int32_t id, const char **text, size_t *len) {
    d->out.len = 0;
    d->out.data[0] = '\0';
    *text = d->out.data;
    *len = 0;
    size_t n;
    const char *bytes = d->src.token_bytes(d->src.ctx, id, &n);
    if (!bytes) return ts_error(TS_ERR_RANGE, "detokenizer: token id %d out of range", (int)id);
    /* A skipped token leaves held bytes waiting: a one-shot decode drops the token before
     * joining the bytes, so the next token may still complete the character. */
    if (d->skip_special && d->src.is_special && d->src.is_special(d->src.ctx, id)) return TS_OK;
    const char *s = bytes;
    if (d->n_held) {
        d->work.len = 0;
        TS_TRY(ts_strbuf_append(&d->work, d->held, d->n_held));
        TS_TRY(ts_strbuf_append(&d->work, bytes, n));
        s = d->work.data;
        n = d->work.len;
    }
    size_t tail;
    TS_TRY(ts_strbuf_reserve(&d->out, n + 8));
    TS_TRY(utf8_lossy(&d->out, s, n, true, &tail));
    memcpy(d->held, s + n - tail, tail);
    d->n_held = tail;
    *text = d->out.data;
    *len = d->out.len;
    return TS_OK;
}

ts_status ts_detok_flush(ts_detok *d, const char **text, size_t *len) {
    d->out.len = 0;
    d->out.data[0] = '\0';
    if (d->n_held) TS_TRY(utf8_lossy(&d->out, d->held, d->n_held, false, NULL));
    d->n_held = 0;
    *text = d->out.data;
    *len = d->out.len;
    return TS_OK;
}

void ts_detok_reset(ts_detok *d) { d->n_held = 0; }
