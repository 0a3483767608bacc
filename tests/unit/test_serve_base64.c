/* serve/base64.c: the decoder of data: URLs' images, against an encoder written here - random
 * bytes of every length up to 300 and one of 3 MB, with and without their padding, wrapped by
 * whitespace at random places; a character outside the alphabet anywhere, data after the
 * padding and lengths no encoder produces refused. And the encoder of embeddings sent as
 * base64, against the one written here, and against RFC 4648's examples. */
#include "serve/base64.h"
#include "testutil.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char ALPHABET[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Standard base64 of b[0, n) with '=' padding; malloc'd, NUL-terminated. */
static char *encode(const unsigned char *b, size_t n) {
    char *s = malloc((n + 2) / 3 * 4 + 1), *o = s;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)b[i] << 16 | (i + 1 < n ? (uint32_t)b[i + 1] << 8 : 0) |
                     (i + 2 < n ? b[i + 2] : 0);
        *o++ = ALPHABET[v >> 18 & 63];
        *o++ = ALPHABET[v >> 12 & 63];
        *o++ = i + 1 < n ? ALPHABET[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? ALPHABET[v & 63] : '=';
    }
    *o = 0;
    return s;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* s with `k` whitespace characters put in at random places (malloc'd). */
static char *with_spaces(const char *s, int k) {
    size_t n = strlen(s);
    char *o = malloc(n + (size_t)k + 1);
    memcpy(o, s, n + 1);
    for (int j = 0; j < k; j++, n++) {
        size_t at = next() % (n + 1);
        memmove(o + at + 1, o + at, n - at + 1);
        o[at] = " \n\r\t"[next() % 4];
    }
    return o;
}

static bool decodes_to(const char *s, const unsigned char *want, size_t n) {
    unsigned char *got = NULL;
    size_t len = 0;
    bool ok = serve_base64_decode(s, strlen(s), &got, &len);
    bool same = ok && len == n && (n == 0 || memcmp(got, want, n) == 0);
    free(got);
    return same;
}

static bool refused(const char *s, size_t n) {
    unsigned char *got = (unsigned char *)1;
    size_t len = 0;
    bool ok = serve_base64_decode(s, n, &got, &len);
    if (ok) free(got);
    return !ok && got == NULL;
}

static void test_round_trips(void) {
    unsigned char b[300];
    for (size_t n = 0; n <= 300; n++) {
        for (int rep = 0; rep < 4; rep++) {
            for (size_t i = 0; i < n; i++)
                b[i] = (unsigned char)next();
            char *s = encode(b, n), mine[SERVE_BASE64_LEN(300) + 1];
            CHECKF(decodes_to(s, b, n), "length %zu: '%s'", n, s);
            serve_base64_encode(b, n, mine);
            CHECKF(strcmp(mine, s) == 0, "length %zu encoded '%s', not '%s'", n, mine, s);
            char *bare = strdup(s), *eq = strchr(bare, '=');
            if (eq) *eq = 0; /* the padding left out */
            CHECKF(decodes_to(bare, b, n), "length %zu without padding", n);
            char *sp = with_spaces(rep & 1 ? bare : s, 1 + (int)(next() % 9));
            CHECKF(decodes_to(sp, b, n), "length %zu with whitespace: '%s'", n, sp);
            if (n > 0) { /* a stranger anywhere */
                size_t len = strlen(s), at = next() % (len + 1);
                char *bad = malloc(len + 2);
                memcpy(bad, s, at);
                bad[at] = "-_@.:%\x80\xff\0*"[next() % 10];
                memcpy(bad + at + 1, s + at, len - at + 1);
                CHECKF(refused(bad, len + 1), "length %zu with 0x%02x at %zu", n,
                       (unsigned char)bad[at], at);
                free(bad);
            }
            free(s), free(bare), free(sp);
        }
    }
}

static void test_edges(void) {
    CHECK(decodes_to("", (const unsigned char *)"", 0));
    CHECK(decodes_to("QQ", (const unsigned char *)"A", 1));
    CHECK(decodes_to("QQ==", (const unsigned char *)"A", 1));
    CHECK(decodes_to("QUI=", (const unsigned char *)"AB", 2));
    CHECK(decodes_to("QUJD", (const unsigned char *)"ABC", 3));
    CHECK(decodes_to("QUJD\r\nQUJD", (const unsigned char *)"ABCABC", 6));
    CHECK(decodes_to("QQ== \n", (const unsigned char *)"A", 1));
    CHECK(decodes_to("Q Q = =", (const unsigned char *)"A", 1));
    const char *bad[] = {"Q",        "QUJDQ", "Q===", "QQ=",  "QQ===",  "QUI==",
                         "QQ==QQ==", "QUJD=", "QQ=Q", "====", "QUJ\x01"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECKF(refused(bad[i], strlen(bad[i])), "'%s' taken", bad[i]);
}

static void test_encoder_rfc4648(void) {
    const char *in[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    const char *out[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (int i = 0; i < 7; i++) {
        char got[16];
        serve_base64_encode(in[i], strlen(in[i]), got);
        CHECKF(strcmp(got, out[i]) == 0, "'%s' encoded '%s'", in[i], got);
        CHECK(strlen(got) == SERVE_BASE64_LEN(strlen(in[i])));
    }
}

static void test_large(void) {
    size_t n = 3u << 20;
    unsigned char *b = malloc(n);
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)next();
    char *s = encode(b, n);
    CHECK(decodes_to(s, b, n));
    s[strlen(s) / 2 + 1] = '!';
    CHECK(refused(s, strlen(s)));
    free(b), free(s);
}

int main(void) {
    test_round_trips();
    test_edges();
    test_encoder_rfc4648();
    test_large();
    return tu_report("test_serve_base64");
}
