#include "serve/base64.h"

#include <stdint.h>
#include <stdlib.h>

/* Each byte's class: its 6-bit value (0-63) for the alphabet, else one of these. */
enum { WS = 0x40, PAD = 0x41, BAD = 0x80 };
/* sixteen bytes a row */
/* clang-format off */
static const uint8_t CLASS[256] = {
    BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, WS, WS, BAD, BAD, WS, BAD, BAD,
    BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD,
    WS, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, 62, BAD, BAD, BAD, 63,
    52, 53, 54, 55, 56, 57, 58, 59, 60, 61, BAD, BAD, BAD, PAD, BAD, BAD,
    BAD, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
    15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, BAD, BAD, BAD, BAD, BAD,
    BAD, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40,
    41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, BAD, BAD, BAD, BAD, BAD,
    BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD,
    BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD,
    BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD,
    BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD,
    BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD,
    BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD,
    BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD,
    BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD,
};
/* clang-format on */

bool serve_base64_decode(const char *s, size_t n, unsigned char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    unsigned char *buf = malloc(n / 4 * 3 + 3);
    if (!buf) {
        *len = SIZE_MAX;
        return false;
    }
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0, pad = 0;
    uint32_t acc = 0;
    int bits = 0;
    size_t chars = 0; /* alphabet characters: a body may hold more than INT_MAX */
    for (size_t i = 0; i < n;) {
        /* four characters of the alphabet at a group's start make three bytes at once (an
         * image's data: URL is megabytes of nothing else) */
        if (bits == 0 && !pad && i + 4 <= n) {
            uint32_t a = CLASS[u[i]], b = CLASS[u[i + 1]], c = CLASS[u[i + 2]], d = CLASS[u[i + 3]];
            if (((a | b | c | d) & 0xc0) == 0) {
                uint32_t v = a << 18 | b << 12 | c << 6 | d;
                buf[o] = (unsigned char)(v >> 16);
                buf[o + 1] = (unsigned char)(v >> 8);
                buf[o + 2] = (unsigned char)v;
                o += 3, i += 4, chars += 4;
                continue;
            }
        }
        uint32_t v = CLASS[u[i++]];
        if (v == WS) continue;
        if (v == PAD) {
            pad++;
            continue;
        }
        if (v == BAD || pad) { /* a stranger, or data after the padding */
            free(buf);
            return false;
        }
        acc = acc << 6 | v;
        bits += 6;
        chars++;
        if (bits >= 8) {
            bits -= 8;
            buf[o++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    /* a last group of 1 character cannot be, 2 or 3 carry 1 or 2 bytes; padding completes the
     * group to 4 and no further */
    int rest = (int)(chars % 4);
    if (rest == 1 || (pad && (size_t)rest + pad != 4) || pad > 2) {
        free(buf);
        return false;
    }
    *out = buf;
    *len = o;
    return true;
}

void serve_base64_encode(const void *data, size_t n, char *out) {
    static const char ALPHA[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const uint8_t *b = data;
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)b[i] << 16 | (uint32_t)b[i + 1] << 8 | b[i + 2];
        *out++ = ALPHA[v >> 18], *out++ = ALPHA[v >> 12 & 63];
        *out++ = ALPHA[v >> 6 & 63], *out++ = ALPHA[v & 63];
    }
    if (i < n) { /* one or two bytes left: padded to four characters */
        uint32_t v = (uint32_t)b[i] << 16 | (i + 1 < n ? (uint32_t)b[i + 1] << 8 : 0);
        *out++ = ALPHA[v >> 18], *out++ = ALPHA[v >> 12 & 63];
        *out++ = i + 1 < n ? ALPHA[v >> 6 & 63] : '=';
        *out++ = '=';
    }
    *out = 0;
}
