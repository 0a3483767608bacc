/* Code point intervals as UTF-8 byte-range sequences (utf8_ranges.h). */
#include "text/utf8_ranges.h"

#include "text/utf8.h"

#include <string.h>

/* cp as UTF-8 into b (utf8.c's encoder; the split never hands it a surrogate). */
static int encode(uint32_t cp, uint8_t b[4]) {
    char c[4];
    int n = (int)ts_utf8_encode(cp, c);
    memcpy(b, c, (size_t)n);
    return n;
}

/* Splits [lo, hi] (no surrogates, all one encoded length or not) into pieces, each one
 * sequence. A work stack of pending intervals keeps the pieces in code point order: the lower
 * part of a split is worked on first, the upper part waits. */
static int split(uint32_t lo, uint32_t hi, ts_utf8_seq *out, int n) {
    static const uint32_t len_max[] = {0x7F, 0x7FF, 0xFFFF}; /* largest code point of 1-3 bytes */
    uint32_t stack[2 * TS_UTF8_SEQ_MAX][2];
    int sp = 0;
    stack[sp][0] = lo, stack[sp][1] = hi, sp++;
    while (sp > 0) {
        sp--;
        uint32_t s = stack[sp][0], e = stack[sp][1];
    again:
        for (int i = 0; i < 3; i++) /* one encoded length per piece */
            if (s <= len_max[i] && e > len_max[i]) {
                stack[sp][0] = len_max[i] + 1, stack[sp][1] = e, sp++;
                e = len_max[i];
                goto again;
            }
        if (e >= 0x80)
            for (int i = 1; i < 4; i++) { /* the low 6i bits must span all values or agree */
                uint32_t m = (1u << (6 * i)) - 1;
                if ((s & ~m) == (e & ~m)) continue;
                if ((s & m) != 0) {
                    stack[sp][0] = (s | m) + 1, stack[sp][1] = e, sp++;
                    e = s | m;
                    goto again;
                }
                if ((e & m) != m) {
                    stack[sp][0] = e & ~m, stack[sp][1] = e, sp++;
                    e = (e & ~m) - 1;
                    goto again;
                }
            }
        if (n == TS_UTF8_SEQ_MAX) return n; /* cannot happen: the bound covers the worst case */
        ts_utf8_seq *q = &out[n++];
        q->n = encode(s, q->lo);
        encode(e, q->hi);
    }
    return n;
}

int ts_utf8_ranges(uint32_t lo, uint32_t hi, ts_utf8_seq out[TS_UTF8_SEQ_MAX]) {
    if (hi > 0x10FFFF) hi = 0x10FFFF;
    if (lo > hi) return 0;
    int n = 0;
    if (lo < 0xD800) n = split(lo, hi < 0xD7FF ? hi : 0xD7FF, out, n);
    if (hi > 0xDFFF) n = split(lo > 0xE000 ? lo : 0xE000, hi, out, n);
    return n;
}
