#include "serve/base64.h"

#include <stdint.h>
#include <stdlib.h>

/* the 6-bit value of an alphabet character, -1 for others */
static int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

static bool b64_space(unsigned char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

bool serve_base64_decode(const char *s, size_t n, unsigned char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    unsigned char *buf = malloc(n / 4 * 3 + 3);
    if (!buf) {
        *len = SIZE_MAX;
        return false;
    }
    size_t o = 0, pad = 0;
    uint32_t acc = 0;
    int bits = 0, chars = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (b64_space(c)) continue;
        if (c == '=') {
            pad++;
            continue;
        }
        int v = b64_value(c);
        if (v < 0 || pad) { /* a stranger, or data after the padding */
            free(buf);
            return false;
        }
        acc = acc << 6 | (uint32_t)v;
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
    int rest = chars % 4;
    if (rest == 1 || (pad && (size_t)rest + pad != 4) || pad > 2) {
        free(buf);
        return false;
    }
    *out = buf;
    *len = o;
    return true;
}
