/* UTF-8 code points, well-formed as the Unicode standard (and Python's strict codec) defines
 * them: no overlong forms, surrogates or code points past U+10FFFF. Text (tokenizers, chat,
 * grammars: text/utf8.h adds the lossy policy, a byte buffer and the detokenizer) and images
 * (a PNG's iTXt chunks) read UTF-8 through these. */
#ifndef TS_BASE_UTF8_H
#define TS_BASE_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    TS_UTF8_CHAR,      /* a whole, valid character */
    TS_UTF8_INVALID,   /* an ill-formed maximal subpart (becomes one U+FFFD) */
    TS_UTF8_TRUNCATED, /* the input ends inside a sequence that could still become valid */
} ts_utf8_kind;

/* Classifies the bytes at s[0..n), n >= 1. *len gets the bytes consumed: the character's
 * length, the maximal subpart's length, or n when truncated. *cp gets the code point for
 * TS_UTF8_CHAR (U+FFFD otherwise). */
ts_utf8_kind ts_utf8_next(const char *s, size_t n, uint32_t *cp, size_t *len);

/* The length of the longest prefix of s[0..n) that is whole, valid characters. */
size_t ts_utf8_valid_prefix(const char *s, size_t n);

/* True when s[0..n) is entirely well-formed UTF-8. */
bool ts_utf8_valid(const char *s, size_t n);

/* Writes cp (<= 0x10FFFF, not a surrogate) as UTF-8 into out; returns the length (1-4), or 0
 * for an invalid code point. */
size_t ts_utf8_encode(uint32_t cp, char out[4]);

#endif
