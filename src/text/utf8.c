#include "text/utf8.h"

#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

ts_status ts_strbuf_printf(ts_strbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return ts_error(TS_ERR_INVALID, "bad format '%s'", fmt);
    TS_TRY(ts_strbuf_reserve(b, (size_t)n));
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
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
        size_t good = ts_utf8_valid_prefix(s + i, n - i);
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

ts_status ts_utf8_append_byte_run(ts_strbuf *out, const char *run, size_t n) {
    if (ts_utf8_valid(run, n)) return ts_strbuf_append(out, run, n);
    TS_TRY(ts_strbuf_reserve(out, 3 * n));
    for (size_t i = 0; i < n; i++)
        TS_TRY(ts_strbuf_append(out, TS_UTF8_REPLACEMENT, 3));
    return TS_OK;
}

/* ---- incremental detokenizer ------------------------------------------------------------- */

struct ts_detok {
    ts_token_source src;
    bool skip_special;
    char held[4]; /* a character's first bytes, waiting for the rest (at most 3) */
    size_t n_held;
    ts_strbuf run;  /* with src.is_byte: the byte tokens since the last other token */
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
    ts_strbuf_free(&d->run);
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
    if (d->src.is_byte) {
        /* ByteFallback: a run's bytes count only as a whole, so it waits for its end. */
        if (d->src.is_byte(d->src.ctx, id)) return ts_strbuf_append(&d->run, bytes, n);
        if (d->run.len) {
            TS_TRY(ts_utf8_append_byte_run(&d->out, d->run.data, d->run.len));
            d->run.len = 0;
        }
    }
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
    if (d->run.len) TS_TRY(ts_utf8_append_byte_run(&d->out, d->run.data, d->run.len));
    d->run.len = 0;
    if (d->n_held) TS_TRY(utf8_lossy(&d->out, d->held, d->n_held, false, NULL));
    d->n_held = 0;
    *text = d->out.data;
    *len = d->out.len;
    return TS_OK;
}

/* Whether s ends inside a character: its last lead byte wants more bytes than follow it. */
static bool ends_mid_char(const unsigned char *s, size_t n) {
    for (size_t k = 1; k <= 4 && k <= n; k++) {
        unsigned c = s[n - k];
        if ((c & 0xC0) == 0x80) continue; /* a continuation byte */
        size_t want = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return want > k;
    }
    return false;
}

bool ts_detok_mid_char(const ts_detok *d) {
    return d->n_held > 0 || ends_mid_char((const unsigned char *)d->run.data, d->run.len);
}

void ts_detok_reset(ts_detok *d) {
    d->n_held = 0;
    d->run.len = 0;
}
