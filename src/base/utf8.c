/* UTF-8 code points (base/utf8.h). */
#include "base/utf8.h"

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

size_t ts_utf8_valid_prefix(const char *s, size_t n) {
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

bool ts_utf8_valid(const char *s, size_t n) { return ts_utf8_valid_prefix(s, n) == n; }

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
