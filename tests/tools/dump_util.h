/* What the tokenizer dump tools (bpe_dump.c, tok_dump.c) share: strings travel through their
 * files hex-encoded, one per line, so a line can hold any bytes (newlines, ill-formed UTF-8). */
#ifndef TS_TESTS_TOOLS_DUMP_UTIL_H
#define TS_TESTS_TOOLS_DUMP_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <time.h>

static inline double dump_clock_s(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double dump_now_s(void) { return dump_clock_s(CLOCK_MONOTONIC); }

static inline void dump_print_hex(const char *s, size_t n) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        putchar(digits[(uint8_t)s[i] >> 4]);
        putchar(digits[(uint8_t)s[i] & 15]);
    }
}

static inline int dump_hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes a hex line in place (a trailing newline is ignored); returns the byte count, or -1
 * on a malformed line. */
static inline long dump_unhex(char *line, size_t n) {
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        n--;
    if (n % 2) return -1;
    for (size_t i = 0; i < n; i += 2) {
        int hi = dump_hexval(line[i]), lo = dump_hexval(line[i + 1]);
        if (hi < 0 || lo < 0) return -1;
        line[i / 2] = (char)(hi * 16 + lo);
    }
    return (long)(n / 2);
}

#endif
