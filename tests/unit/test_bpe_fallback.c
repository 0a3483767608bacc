/* BPE over characters with byte fallback (SentencePiece models converted to tokenizer.json,
 * Gemma's form): the initial symbols (a character's piece, its <0xXX> pieces, unk - fused or
 * not, in HF's order), the normalizer's Replace and a token matched after it, the decoder's
 * byte runs, the post-processor's BOS, and the configurations refused at load. The expected
 * ids and texts were produced by Hugging Face tokenizers 0.23.3 from the same file; exact
 * parity on the real Gemma 3 vocabulary is tests/py/test_tokenizer_parity.py. */
#include "testutil.h"
#include "text/bpe_int.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[64];

/* vocab 0..9, added tokens 10 (special "<s>") and 11 (" x", matched after normalization) */
static const char base_json[] =
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":["
    "{\"id\":10,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true},"
    "{\"id\":11,\"content\":\" x\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":true,\"special\":false}],"
    "\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\" "
    "\"},\"content\":\"\xE2\x96\x81\"},"
    "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},"
    "\"behavior\":\"MergedWithPrevious\",\"invert\":false},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":"
    "\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[],"
    "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[10],\"tokens\":[\"<s>\"]}}},"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{"
    "\"String\":"
    "\"\xE2\x96\x81\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]},"
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":\"<unk>\",\"fuse_unk\":true,"
    "\"byte_fallback\":true,\"ignore_merges\":false,\"vocab\":{\"<unk>\":0,\"a\":1,\"b\":2,"
    "\"<0xC3>\":3,\"<0xA9>\":4,\"ab\":5,\"<0xE2>\":6,\"\xE2\x96\x81\":7,\"\xE2\x96\x81"
    "a\":8,"
    "\"<0x+A>\":9},\"merges\":[[\"a\",\"b\"],[\"\xE2\x96\x81\",\"a\"]]}}";

/* base_json with the first occurrence of `from` replaced by `to`. */
static char *variant(const char *from, const char *to) {
    const char *at = strstr(base_json, from);
    CHECKF(at != NULL, "variant: '%s' not in the file", from);
    if (!at) return NULL;
    size_t head = (size_t)(at - base_json), n = strlen(base_json) - strlen(from) + strlen(to);
    char *s = malloc(n + 1);
    memcpy(s, base_json, head);
    strcpy(s + head, to);
    strcat(s, at + strlen(from));
    return s;
}

static ts_status load_text(const char *json, ts_bpe **t) {
    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer.json", tmpdir);
    FILE *f = fopen(path, "wb");
    fwrite(json, 1, strlen(json), f);
    fclose(f);
    *t = NULL;
    return ts_bpe_load(path, t);
}

static ts_bpe *load_ok(const char *json) {
    ts_bpe *t;
    ts_status st = load_text(json, &t);
    CHECKF(st == TS_OK, "%s", ts_last_error());
    return st == TS_OK ? t : NULL;
}

static void expect_ids(const ts_bpe *t, const char *text, bool special, const int32_t *want,
                       size_t n) {
    ts_ids v = {0};
    ts_status st = ts_bpe_encode(t, text, strlen(text), special, &v);
    bool same = st == TS_OK && v.len == n && memcmp(v.data, want, n * sizeof *want) == 0;
    CHECKF(same, "'%s': status %d, %zu ids (first %d), want %zu", text, (int)st, v.len,
           v.len ? v.data[0] : -1, n);
    ts_ids_free(&v);
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__}), (sizeof((const int32_t[]){__VA_ARGS__}) / 4)

static void test_initial_symbols(void) {
    ts_bpe *t = load_ok(base_json);
    if (!t) return;
    expect_ids(t,
               "a\xC3\xA9"
               "b",
               true, IDS(1, 3, 4, 2)); /* é: its two byte pieces */
    expect_ids(t,
               "a\xC3\xBC\xC3\xBC"
               "b",
               true, IDS(1, 0, 2)); /* üü: one fused unk */
    /* a pending unk waits for the next character found in the vocab: byte pieces go first */
    expect_ids(t, "\xC3\xBC\xC3\xA9\xC3\xBC", true, IDS(3, 4, 0));
    expect_ids(t, "\xC3\xBC\xC3\xBC\xC3\xA9", true, IDS(3, 4, 0));
    expect_ids(t, "ab\xE2\x82\xAC", true, IDS(5, 0)); /* €: only one of its bytes has a piece */
    expect_ids(t, " a ab", true, IDS(8, 7, 5));       /* spaces are U+2581 before merging */
    expect_ids(t, "a x b", true, IDS(1, 11, 7, 2));   /* " x" found after normalization */
    expect_ids(t, "<s>a", true, IDS(10, 1));
    int32_t bos, eos;
    ts_bpe_post_tokens(t, &bos, &eos);
    CHECK(bos == 10 && eos == -1);
    CHECK(ts_bpe_token_id(t, " ") == 7 && ts_bpe_token_id(t, "a") == 1);
    CHECK(ts_bpe_token_id(t, "<0xC3>") == -1); /* decodes to a byte, not to that text */
    ts_bpe_free(t);

    char *s = variant("\"fuse_unk\":true", "\"fuse_unk\":false");
    t = s ? load_ok(s) : NULL;
    if (t) {
        expect_ids(t,
                   "a\xC3\xBC\xC3\xBC"
                   "b",
                   true, IDS(1, 0, 0, 2));
        expect_ids(t, "\xC3\xBC\xC3\xA9\xC3\xBC", true, IDS(3, 4, 0, 0));
        expect_ids(t, "\xC3\xBC\xC3\xBC\xC3\xA9", true, IDS(0, 3, 4, 0));
        ts_bpe_free(t);
    }
    free(s);

    /* A piece that joins a character to the U+2581 after it ("b▁", merged before "▁a"): long
     * text is merged in parts cut before U+2581, but never after such a character. */
    s = variant("\"<0x+A>\":9},\"merges\":[[\"a\",\"b\"],",
                "\"b\xE2\x96\x81\":9},\"merges\":[[\"a\",\"b\"],[\"b\",\"\xE2\x96\x81\"],");
    t = s ? load_ok(s) : NULL;
    if (t) {
        expect_ids(t, "b a", true, IDS(9, 1));
        expect_ids(t, "ab a", true, IDS(5, 8));
        expect_ids(t, "a b a", true, IDS(1, 7, 9, 1));
        expect_ids(t, "bb  a", true, IDS(2, 9, 8));
        ts_bpe_free(t);
    }
    free(s);

    /* No unk token: HF drops the character; we refuse the text instead of losing it. */
    s = variant("\"unk_token\":\"<unk>\"", "\"unk_token\":null");
    t = s ? load_ok(s) : NULL;
    if (t) {
        ts_ids v = {0};
        CHECK(ts_bpe_encode(t, "a\xC3\xBC", 3, true, &v) == TS_ERR_UNSUPPORTED && v.len == 0);
        CHECK(strstr(ts_last_error(), "U+00FC") != NULL);
        expect_ids(t, "a\xC3\xA9", true, IDS(1, 3, 4));
        ts_ids_free(&v);
        ts_bpe_free(t);
    }
    free(s);
}

static void expect_decode(const ts_bpe *t, const int32_t *ids, size_t n, bool skip,
                          const char *want) {
    char *text;
    size_t len;
    CHECK(ts_bpe_decode(t, ids, n, skip, &text, &len) == TS_OK);
    CHECKF(len == strlen(want) && memcmp(text, want, len) == 0, "decode gave '%s'", text);
    free(text);
    /* the streamed decode gives the same text */
    ts_token_source src;
    ts_bpe_token_source(t, &src);
    ts_detok *d;
    CHECK(ts_detok_create(&src, skip, &d) == TS_OK);
    ts_strbuf all = {0};
    const char *piece;
    size_t pl;
    for (size_t i = 0; i < n; i++) {
        CHECK(ts_detok_push(d, ids[i], &piece, &pl) == TS_OK);
        ts_strbuf_append(&all, piece, pl);
    }
    CHECK(ts_detok_flush(d, &piece, &pl) == TS_OK);
    ts_strbuf_append(&all, piece, pl);
    CHECKF(all.len == strlen(want) && memcmp(all.data, want, all.len) == 0, "streamed '%s'",
           all.data);
    ts_strbuf_free(&all);
    ts_detok_free(d);
}

#define R "\xEF\xBF\xBD"

static void test_decode(void) {
    ts_bpe *t = load_ok(base_json);
    if (!t) return;
    /* each run of byte pieces on its own: valid, or one U+FFFD a byte */
    expect_decode(t, IDS(3, 4, 1, 3, 1, 6, 6, 3), false,
                  "\xC3\xA9"
                  "a" R "a" R R R);
    expect_decode(t, IDS(6, 4, 1), false, R R "a"); /* E2 A9 starts a character: still two */
    /* U+2581 back to a space; "<0x+A>" is byte 0x0A (Rust's from_str_radix takes the '+') */
    expect_decode(t, IDS(9, 7, 1, 9, 11), false, "\n a\n x");
    /* a skipped special token does not end a run */
    expect_decode(t, IDS(10, 3, 10, 4), true, "\xC3\xA9");
    expect_decode(t, IDS(10, 3, 10, 4), false, "<s>" R "<s>" R);
    ts_bpe_free(t);
}

static void expect_refused(const char *what, const char *from, const char *to, ts_status code,
                           const char *msg) {
    char *s = variant(from, to);
    if (!s) return;
    ts_bpe *t;
    ts_status st = load_text(s, &t);
    CHECKF(st == code && strstr(ts_last_error(), msg), "%s: status %d, '%s'", what, (int)st,
           ts_last_error());
    ts_bpe_free(t);
    free(s);
}

static void test_refused(void) {
    expect_refused("regex Replace", "\"pattern\":{\"String\":\" \"},\"content\"",
                   "\"pattern\":{\"Regex\":\" \"},\"content\"", TS_ERR_UNSUPPORTED,
                   "only a String pattern");
    /* the split on " " finds something once the normalizer no longer replaces spaces */
    expect_refused("live MergedWithPrevious",
                   "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"}",
                   "{\"type\":\"Replace\",\"pattern\":{\"String\":\"q\"}", TS_ERR_UNSUPPORTED,
                   "only Isolated");
    expect_refused("decoder order", "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}",
                   "{\"type\":\"Fuse\"},{\"type\":\"ByteFallback\"}", TS_ERR_UNSUPPORTED,
                   "in that order");
    expect_refused("ByteLevel pre-tokenizer", "\"pre_tokenizer\":{\"type\":\"Split\"",
                   "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"x\":{\"type\":\"Split\"}",
                   TS_ERR_UNSUPPORTED, "needs the ByteLevel decoder");
    expect_refused("unk not in vocab", "\"unk_token\":\"<unk>\"", "\"unk_token\":\"<unknown>\"",
                   TS_ERR_FORMAT, "not in model.vocab");
    expect_refused("two specials before $A", "\"single\":[",
                   "\"single\":[{\"SpecialToken\":{\"id\":"
                   "\"<s>\",\"type_id\":0}},",
                   TS_ERR_UNSUPPORTED, "[special] $A [special]");
    expect_refused("post id of no token", "\"ids\":[10]", "\"ids\":[12]", TS_ERR_FORMAT,
                   "is no token");
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ts_test_bpefb_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    test_initial_symbols();
    test_decode();
    test_refused();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) return 1;
    return tu_report("test_bpe_fallback");
}
