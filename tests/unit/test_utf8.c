/* UTF-8 helpers and the incremental detokenizer. */
#include "testutil.h"
#include "text/utf8.h"

#include <stdbool.h>
#include <string.h>

static bool lossy_is(const char *in, size_t n, const char *want) {
    ts_strbuf out = {0};
    bool ok = ts_utf8_append_lossy(&out, in, n) == TS_OK && out.len == strlen(want) &&
              memcmp(out.data, want, out.len) == 0;
    ts_strbuf_free(&out);
    return ok;
}

#define R TS_UTF8_REPLACEMENT

static void test_next(void) {
    uint32_t cp;
    size_t len;
    CHECK(ts_utf8_next("A", 1, &cp, &len) == TS_UTF8_CHAR && cp == 'A' && len == 1);
    CHECK(ts_utf8_next("\xC3\xA9", 2, &cp, &len) == TS_UTF8_CHAR && cp == 0xE9 && len == 2);
    CHECK(ts_utf8_next("\xE4\xB8\xAD", 3, &cp, &len) == TS_UTF8_CHAR && cp == 0x4E2D);
    CHECK(ts_utf8_next("\xF0\x9F\x98\x80", 4, &cp, &len) == TS_UTF8_CHAR && cp == 0x1F600);
    CHECK(ts_utf8_next("\xF4\x8F\xBF\xBF", 4, &cp, &len) == TS_UTF8_CHAR && cp == 0x10FFFF);
    /* truncated: could still become valid */
    CHECK(ts_utf8_next("\xE2\x82", 2, &cp, &len) == TS_UTF8_TRUNCATED && len == 2);
    CHECK(ts_utf8_next("\xF0", 1, &cp, &len) == TS_UTF8_TRUNCATED && len == 1);
    /* ill-formed: the maximal subpart's length */
    CHECK(ts_utf8_next("\xE2\x82"
                       "A",
                       3, &cp, &len) == TS_UTF8_INVALID &&
          len == 2);
    CHECK(ts_utf8_next("\xC0\x80", 2, &cp, &len) == TS_UTF8_INVALID && len == 1);
    CHECK(ts_utf8_next("\xE0\x80\x80", 3, &cp, &len) == TS_UTF8_INVALID && len == 1);
    CHECK(ts_utf8_next("\xED\xA0\x80", 3, &cp, &len) == TS_UTF8_INVALID && len == 1);
    CHECK(ts_utf8_next("\xF4\x90\x80\x80", 4, &cp, &len) == TS_UTF8_INVALID && len == 1);
    CHECK(ts_utf8_next("\xF5", 1, &cp, &len) == TS_UTF8_INVALID && len == 1);
    CHECK(ts_utf8_next("\x80", 1, &cp, &len) == TS_UTF8_INVALID && len == 1);
    CHECK(ts_utf8_next("\xF0\x9F\x98"
                       "A",
                       4, &cp, &len) == TS_UTF8_INVALID &&
          len == 3);
}

static void test_lossy(void) {
    /* Expected outputs are Python's bytes.decode('utf-8', errors='replace'). */
    CHECK(lossy_is("abc", 3, "abc"));
    CHECK(lossy_is("\xFF", 1, R));
    CHECK(lossy_is("\xC0\x80", 2, R R));
    CHECK(lossy_is("\xE2\x82", 2, R));
    CHECK(lossy_is("\xE2\x82"
                   "A",
                   3, R "A"));
    CHECK(lossy_is("\xED\xA0\x80", 3, R R R));
    CHECK(lossy_is("\xF0\x9F\x98", 3, R));
    CHECK(lossy_is("\xF0\x28\x8C\x28", 4, R "(" R "("));
    CHECK(lossy_is("\xE2\x28\xA1", 3, R "(" R));
    ts_strbuf out = {0};
    CHECK(ts_utf8_append_lossy(&out, "a\x00\xFF", 3) == TS_OK && out.len == 5 &&
          memcmp(out.data, "a\x00" R, 5) == 0);
    ts_strbuf_free(&out);
}

static void test_encode_all(void) {
    int bad = 0;
    for (uint32_t cp = 0; cp <= 0x10FFFF + 10; cp++) {
        char buf[4];
        size_t n = ts_utf8_encode(cp, buf);
        bool valid = cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
        if (!valid) {
            bad += n != 0;
            continue;
        }
        uint32_t back;
        size_t len;
        bad += ts_utf8_next(buf, n, &back, &len) != TS_UTF8_CHAR || back != cp || len != n ||
               !ts_utf8_valid(buf, n);
    }
    CHECKF(bad == 0, "%d code points do not round-trip", bad);
}

/* Independent slow reference: a byte string is valid iff lossy repair leaves it unchanged and
 * adds no U+FFFD of its own. Compared on random byte soup. */
static void test_valid_random(void) {
    unsigned long long rng = 99;
    static const uint8_t pool[] = {'a',  ' ',  0x80, 0xBF, 0xC2, 0xC3, 0xE0, 0xE2, 0xED,
                                   0xEF, 0xF0, 0xF4, 0xF5, 0xFF, 0xA0, 0x9F, 0x8F, 0x90};
    int bad = 0;
    for (int iter = 0; iter < 20000; iter++) {
        char s[12];
        size_t n = (size_t)(tu_rng_next(&rng) % sizeof s);
        for (size_t i = 0; i < n; i++)
            s[i] = (char)pool[tu_rng_next(&rng) % sizeof pool];
        ts_strbuf out = {0};
        ts_utf8_append_lossy(&out, s, n);
        bool same = out.len == n && (n == 0 || memcmp(out.data, s, n) == 0);
        bad += same != ts_utf8_valid(s, n);
        ts_strbuf_free(&out);
    }
    CHECK(bad == 0);
}

/* ---- detokenizer over a fake vocabulary ---------------------------------------------------- */

static const char *const fake_tok[] = {
    "\xE4", "\xB8", "\xAD", "a", "\xF0\x9F", "\x98\x80", "<s>", "\xFF", "", "\xC3", "\xA9 ok",
};
#define N_FAKE ((int)(sizeof fake_tok / sizeof fake_tok[0]))

static const char *fake_bytes(const void *ctx, int32_t id, size_t *len) {
    (void)ctx;
    *len = 0;
    if (id < 0 || id >= N_FAKE) return NULL;
    *len = strlen(fake_tok[id]);
    return fake_tok[id];
}

static bool fake_special(const void *ctx, int32_t id) {
    (void)ctx;
    return id == 6;
}

static const ts_token_source fake_src = {NULL, fake_bytes, fake_special, NULL};

/* The single-byte tokens of the fake vocabulary, as ByteFallback pieces. */
static bool fake_byte(const void *ctx, int32_t id) {
    (void)ctx;
    return id == 0 || id == 1 || id == 2 || id == 7 || id == 9;
}

static const ts_token_source fake_fallback_src = {NULL, fake_bytes, fake_special, fake_byte};

/* Streams ids; concatenates what comes out (push per id, then flush). */
static void stream(ts_detok *d, const int32_t *ids, int n, ts_strbuf *all) {
    const char *text;
    size_t len;
    for (int i = 0; i < n; i++) {
        CHECK(ts_detok_push(d, ids[i], &text, &len) == TS_OK);
        CHECK(ts_utf8_valid(text, len));
        ts_strbuf_append(all, text, len);
    }
    CHECK(ts_detok_flush(d, &text, &len) == TS_OK);
    ts_strbuf_append(all, text, len);
}

static void test_detok_cases(void) {
    ts_detok *d;
    CHECK(ts_detok_create(&fake_src, true, &d) == TS_OK);
    const char *text;
    size_t len;
    /* 中 split over three tokens: nothing until the last byte arrives (mid character until
     * then) */
    CHECK(!ts_detok_mid_char(d));
    CHECK(ts_detok_push(d, 0, &text, &len) == TS_OK && len == 0 && ts_detok_mid_char(d));
    CHECK(ts_detok_push(d, 1, &text, &len) == TS_OK && len == 0 && ts_detok_mid_char(d));
    CHECK(ts_detok_push(d, 2, &text, &len) == TS_OK && len == 3 && !ts_detok_mid_char(d));
    CHECK(!memcmp(text, "\xE4\xB8\xAD", 3));
    /* 😀 split 2 + 2 with a skipped special token in between */
    CHECK(ts_detok_push(d, 4, &text, &len) == TS_OK && len == 0);
    CHECK(ts_detok_push(d, 6, &text, &len) == TS_OK && len == 0);
    CHECK(ts_detok_push(d, 5, &text, &len) == TS_OK && len == 4);
    /* unknown id: error, held bytes kept */
    CHECK(ts_detok_push(d, 9, &text, &len) == TS_OK && len == 0);
    CHECK(ts_detok_push(d, 99, &text, &len) == TS_ERR_RANGE);
    CHECK(ts_detok_push(d, -1, &text, &len) == TS_ERR_RANGE);
    CHECK(ts_detok_push(d, 10, &text, &len) == TS_OK && len == 5);
    CHECK(!memcmp(text, "\xC3\xA9 ok", 5));
    /* an ill-formed byte comes out at once; an unfinished character at flush */
    CHECK(ts_detok_push(d, 7, &text, &len) == TS_OK && len == 3 && !memcmp(text, R, 3));
    CHECK(ts_detok_push(d, 4, &text, &len) == TS_OK && len == 0);
    CHECK(ts_detok_flush(d, &text, &len) == TS_OK && len == 3 && !memcmp(text, R, 3));
    CHECK(ts_detok_flush(d, &text, &len) == TS_OK && len == 0);
    /* reset drops held bytes */
    CHECK(ts_detok_push(d, 0, &text, &len) == TS_OK && len == 0);
    ts_detok_reset(d);
    CHECK(ts_detok_push(d, 3, &text, &len) == TS_OK && len == 1 && text[0] == 'a');
    ts_detok_free(d);

    /* without skipping, the special token's text breaks the pending character */
    CHECK(ts_detok_create(&fake_src, false, &d) == TS_OK);
    CHECK(ts_detok_push(d, 4, &text, &len) == TS_OK && len == 0);
    CHECK(ts_detok_push(d, 6, &text, &len) == TS_OK && len == 6 && !memcmp(text, R "<s>", 6));
    CHECK(ts_detok_push(d, 5, &text, &len) == TS_OK && len == 6 && !memcmp(text, R R, 6));
    ts_detok_free(d);
}

/* ByteFallback runs: a run of byte tokens counts as a whole - its bytes when valid UTF-8, else
 * one U+FFFD a byte (valid ones included), as Hugging Face's decoder joins them. */
static void test_detok_byte_runs(void) {
    ts_strbuf b = {0};
    CHECK(ts_utf8_append_byte_run(&b, "\xE4\xB8\xAD", 3) == TS_OK && b.len == 3);
    b.len = 0;
    CHECK(ts_utf8_append_byte_run(&b, "A\xFF", 2) == TS_OK && b.len == 6 &&
          !memcmp(b.data, R R, 6));
    b.len = 0;
    CHECK(ts_utf8_append_byte_run(&b, "\xE4\xB8", 2) == TS_OK && b.len == 6);
    ts_strbuf_free(&b);

    ts_detok *d;
    const char *text;
    size_t len;
    CHECK(ts_detok_create(&fake_fallback_src, true, &d) == TS_OK);
    /* a complete character: out when the next other token comes (whole, not mid character,
     * as soon as its last byte is in the run) */
    CHECK(ts_detok_push(d, 0, &text, &len) == TS_OK && len == 0 && ts_detok_mid_char(d));
    CHECK(ts_detok_push(d, 1, &text, &len) == TS_OK && len == 0 && ts_detok_mid_char(d));
    CHECK(ts_detok_push(d, 2, &text, &len) == TS_OK && len == 0 && !ts_detok_mid_char(d));
    CHECK(ts_detok_push(d, 3, &text, &len) == TS_OK && len == 4 && !ts_detok_mid_char(d));
    CHECK(!memcmp(text,
                  "\xE4\xB8\xAD"
                  "a",
                  4));
    /* an unfinished run: one U+FFFD a byte, not one for the subpart */
    CHECK(ts_detok_push(d, 0, &text, &len) == TS_OK && len == 0);
    CHECK(ts_detok_push(d, 1, &text, &len) == TS_OK && len == 0);
    CHECK(ts_detok_push(d, 3, &text, &len) == TS_OK && len == 7 && !memcmp(text, R R "a", 7));
    /* a skipped special token does not end the run; the flush does */
    CHECK(ts_detok_push(d, 0, &text, &len) == TS_OK && len == 0);
    CHECK(ts_detok_push(d, 6, &text, &len) == TS_OK && len == 0);
    CHECK(ts_detok_push(d, 1, &text, &len) == TS_OK && len == 0);
    CHECK(ts_detok_push(d, 2, &text, &len) == TS_OK && len == 0);
    CHECK(ts_detok_flush(d, &text, &len) == TS_OK && len == 3);
    /* reset forgets a run */
    CHECK(ts_detok_push(d, 7, &text, &len) == TS_OK && len == 0);
    ts_detok_reset(d);
    CHECK(ts_detok_push(d, 3, &text, &len) == TS_OK && len == 1 && text[0] == 'a');
    ts_detok_free(d);
    /* not skipped, the special token ends the run */
    CHECK(ts_detok_create(&fake_fallback_src, false, &d) == TS_OK);
    CHECK(ts_detok_push(d, 9, &text, &len) == TS_OK && len == 0);
    CHECK(ts_detok_push(d, 6, &text, &len) == TS_OK && len == 6 && !memcmp(text, R "<s>", 6));
    ts_detok_free(d);
}

/* Property: streaming equals a one-shot lossy decode of the joined bytes, and every piece is
 * valid UTF-8, for random id sequences. */
static void test_detok_random(void) {
    unsigned long long rng = 1234;
    int bad = 0;
    for (int iter = 0; iter < 20000; iter++) {
        int32_t ids[16];
        int n = (int)(tu_rng_next(&rng) % 16);
        bool skip = tu_rng_next(&rng) & 1;
        ts_strbuf joined = {0}, want = {0}, got = {0};
        for (int i = 0; i < n; i++) {
            ids[i] = (int32_t)(tu_rng_next(&rng) % N_FAKE);
            if (!(skip && ids[i] == 6))
                ts_strbuf_append(&joined, fake_tok[ids[i]], strlen(fake_tok[ids[i]]));
        }
        ts_utf8_append_lossy(&want, joined.data ? joined.data : "", joined.len);
        ts_detok *d;
        ts_detok_create(&fake_src, skip, &d);
        stream(d, ids, n, &got);
        ts_detok_free(d);
        bad += got.len != want.len || (got.len && memcmp(got.data, want.data, got.len));
        ts_strbuf_free(&joined);
        ts_strbuf_free(&want);
        ts_strbuf_free(&got);
    }
    CHECKF(bad == 0, "%d random streams differ from the one-shot decode", bad);
}

int main(void) {
    test_next();
    test_lossy();
    test_encode_all();
    test_valid_random();
    test_detok_cases();
    test_detok_byte_runs();
    test_detok_random();
    return tu_report("test_utf8");
}
