#include "text/chat_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ts_status chat_buf_put(chat_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return ts_error(TS_ERR_NOMEM, "chat: out of memory (%zu bytes)", cap);
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return TS_OK;
}

ts_status chat_buf_puts(chat_buf *b, const char *s) { return chat_buf_put(b, s, strlen(s)); }

/* Python's float repr: the shortest digit string that reads back as x, in positional notation
 * when the decimal exponent lies in [-4, 16), else as d.ddde±XX. */
void chat_json_repr_double(double x, char out[32]) {
    if (isnan(x)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(x)) {
        strcpy(out, x < 0 ? "-inf" : "inf");
        return;
    }
    if (x == 0) {
        strcpy(out, signbit(x) ? "-0.0" : "0.0");
        return;
    }
    /* glibc's printf rounds correctly, so the first precision that round-trips is the
     * shortest; that is how Python picks its digits too. */
    char tmp[48];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, x);
        if (strtod(tmp, NULL) == x) break;
    }
    char dig[24];
    int nd = 0;
    const char *p = tmp;
    if (*p == '-') p++;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') dig[nd++] = *p;
    int exp10 = *p == 'e' ? atoi(p + 1) : 0;
    while (nd > 1 && dig[nd - 1] == '0')
        nd--;
    dig[nd] = '\0';
    int decpt = exp10 + 1; /* x = 0.dig * 10^decpt */

    char *o = out;
    if (x < 0) *o++ = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -decpt; i++)
                *o++ = '0';
            memcpy(o, dig, (size_t)nd);
            o += nd;
        } else if (decpt >= nd) {
            memcpy(o, dig, (size_t)nd);
            o += nd;
            for (int i = nd; i < decpt; i++)
                *o++ = '0';
            *o++ = '.';
            *o++ = '0';
        } else {
            memcpy(o, dig, (size_t)decpt);
            o += decpt;
            *o++ = '.';
            memcpy(o, dig + decpt, (size_t)(nd - decpt));
            o += nd - decpt;
        }
        *o = '\0';
    } else {
        *o++ = dig[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, dig + 1, (size_t)(nd - 1));
            o += nd - 1;
        }
        int e = decpt - 1; /* |e| <= 324 for doubles; the clamp tells the compiler so */
        if (e < -999) e = -999;
        if (e > 999) e = 999;
        snprintf(o, 8, "e%+03d", e);
    }
}

/* json.dumps string escaping with ensure_ascii=False: only '"', '\\' and C0 controls. */
static ts_status dump_string(const char *s, size_t n, chat_buf *b) {
    TS_TRY(chat_buf_put(b, "\"", 1));
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        default:
            if (c < 0x20) {
                snprintf(u, sizeof u, "\\u%04x", c);
                esc = u;
            }
        }
        if (!esc) continue;
        TS_TRY(chat_buf_put(b, s + run, i - run));
        TS_TRY(chat_buf_puts(b, esc));
        run = i + 1;
    }
    TS_TRY(chat_buf_put(b, s + run, n - run));
    return chat_buf_put(b, "\"", 1);
}

static ts_status dump_scalar(const json_t *v, chat_buf *b, int python_str) {
    char num[48];
    switch (json_typeof(v)) {
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return chat_buf_puts(b, num);
    case JSON_REAL: chat_json_repr_double(json_real_value(v), num); return chat_buf_puts(b, num);
    case JSON_TRUE: return chat_buf_puts(b, python_str ? "True" : "true");
    case JSON_FALSE: return chat_buf_puts(b, python_str ? "False" : "false");
    case JSON_NULL: return chat_buf_puts(b, python_str ? "None" : "null");
    case JSON_STRING:
        if (python_str) return chat_buf_put(b, json_string_value(v), json_string_length(v));
        return dump_string(json_string_value(v), json_string_length(v), b);
    default: return ts_error(TS_ERR_INVALID, "chat: unexpected JSON value type");
    }
}

ts_status chat_json_dumps(const json_t *v, chat_buf *b) {
    if (json_is_object(v)) {
        const char *key;
        json_t *item;
        int first = 1;
        TS_TRY(chat_buf_put(b, "{", 1));
        json_object_foreach((json_t *)v, key, item) {
            if (!first) TS_TRY(chat_buf_put(b, ", ", 2));
            first = 0;
            TS_TRY(dump_string(key, strlen(key), b));
            TS_TRY(chat_buf_put(b, ": ", 2));
            TS_TRY(chat_json_dumps(item, b));
        }
        return chat_buf_put(b, "}", 1);
    }
    if (json_is_array(v)) {
        TS_TRY(chat_buf_put(b, "[", 1));
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) TS_TRY(chat_buf_put(b, ", ", 2));
            TS_TRY(chat_json_dumps(json_array_get(v, i), b));
        }
        return chat_buf_put(b, "]", 1);
    }
    return dump_scalar(v, b, 0);
}

ts_status chat_json_str(const json_t *v, chat_buf *b) {
    if (json_is_object(v) || json_is_array(v)) return chat_json_dumps(v, b);
    return dump_scalar(v, b, 1);
}
