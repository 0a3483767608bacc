/* A byte piece's spelling, "<0xXX>": SentencePiece's byte fallback, read by the tokenizers
 * (text/spm.c, text/bpe*.c) and by the GGUF vocabulary writer (model/quantize_vocab.c). */
#ifndef TS_BASE_BYTE_PIECE_H
#define TS_BASE_BYTE_PIECE_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

static inline int ts_hex_digit(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* The byte s[0..n) spells ("<0x" two hex digits ">"), -1 when it spells none. plus: also "+X"
 * for the digits - Hugging Face's ByteFallback decoder reads them with Rust's
 * u8::from_str_radix, which takes a sign. */
static inline int ts_byte_piece(const char *s, size_t n, bool plus) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int lo = ts_hex_digit(s[4]), hi = plus && s[3] == '+' ? 0 : ts_hex_digit(s[3]);
    return lo < 0 || hi < 0 ? -1 : hi * 16 + lo;
}

#endif
