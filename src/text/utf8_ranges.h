/* Code point intervals as UTF-8 byte-range sequences: what a byte-level grammar (or automaton)
 * needs to accept exactly the characters of a set. The algorithm is the standard one of RE2 and
 * Rust's regex-syntax (Utf8Sequences): split the interval where the encoded length changes, then
 * where the lower bytes stop covering their whole range [80, BF], until both ends of each piece
 * differ only in bytes that each span a plain range; each piece is then one sequence of byte
 * ranges. */
#ifndef TS_TEXT_UTF8_RANGES_H
#define TS_TEXT_UTF8_RANGES_H

#include <stdint.h>

/* Enough for any interval: at most 2k - 1 pieces per encoded length k, plus the surrogate cut. */
#define TS_UTF8_SEQ_MAX 32

/* One byte out of [lo[i], hi[i]] for each i < n: the byte strings it matches are exactly the
 * UTF-8 encodings of one sub-interval. */
typedef struct {
    int n; /* 1-4 */
    uint8_t lo[4], hi[4];
} ts_utf8_seq;

/* Writes to out the sequences whose union is exactly the well-formed UTF-8 encodings of the
 * code points in [lo, hi]; surrogates (U+D800-U+DFFF) and anything above U+10FFFF are left
 * out, so no sequence matches an overlong form or an ill-formed byte string. The sequences are
 * disjoint and in code point order. Returns how many (0 when nothing is left). */
int ts_utf8_ranges(uint32_t lo, uint32_t hi, ts_utf8_seq out[TS_UTF8_SEQ_MAX]);

#endif
