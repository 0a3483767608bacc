/* Byte-level BPE: loading and refusing configurations, encoding rules, merge order, the cost
 * of huge pre-tokens, thread safety. Exact parity with Hugging Face on a large corpus is
 * tests/py/test_tokenizer_parity.py; the expected ids here were produced by HF tokenizers. */
#include "tessera.h"
#include "testutil.h"
#include "text/bpe_int.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char tmpdir[64];

static bool ids_are(const ts_ids *v, const int32_t *want, size_t n) {
    if (v->len != n) return false;
    return n == 0 || memcmp(v->data, want, n * sizeof *want) == 0;
}

static ts_status encode(const ts_bpe *t, const char *s, size_t n, bool special, ts_ids *out) {
    out->len = 0;
    return ts_bpe_encode(t, s, n, special, out);
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__}), (sizeof((const int32_t[]){__VA_ARGS__}) / 4)

/* ---- synthetic tokenizer.json files --------------------------------------------------------- */

/* GPT-2 byte alphabet, written out independently of bpe.c. */
static void append_byte_spelling(ts_strbuf *b, int byte) {
    int cp = byte, shifted = 0;
    bool printable =
        (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
    if (!printable) {
        for (int x = 0; x < byte; x++)
            shifted += !((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE);
        cp = 0x100 + shifted;
    }
    char u[4];
    if (cp == '"' || cp == '\\') ts_strbuf_append(b, "\\", 1);
    ts_strbuf_append(b, u, ts_utf8_encode((uint32_t)cp, u));
}

typedef struct {
    const char *truncation, *normalizer, *pretok, *decoder, *model_type, *ignore_merges,
        *extra_vocab, *merges, *added, *dropout;
    int skip_byte;
} synth;

static const synth synth_default = {
    "null",
    "{\"type\":\"NFC\"}",
    "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":true}",
    "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":true}",
    "\"BPE\"",
    "false",
    ",\"ab\":256,\"bc\":257,\"abc\":258,\"xyz\":259",
    "\"a b\",\"b c\",\"ab c\"",
    "",
    "null",
    -1,
};

static const char *write_file(const char *name, const char *text, size_t n) {
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    fwrite(text, 1, n, f);
    fclose(f);
    return path;
}

static const char *write_synth(const synth *s) {
    ts_strbuf b = {0};
    char head[1024];
    snprintf(head, sizeof head,
             "{\"version\":\"1.0\",\"truncation\":%s,\"padding\":null,\"added_tokens\":[%s],"
             "\"normalizer\":%s,\"pre_tokenizer\":%s,\"post_processor\":null,\"decoder\":%s,"
             "\"model\":{\"type\":%s,\"dropout\":%s,\"unk_token\":null,\"ignore_merges\":%s,"
             "\"vocab\":{",
             s->truncation, s->added, s->normalizer, s->pretok, s->decoder, s->model_type,
             s->dropout, s->ignore_merges);
    ts_strbuf_append(&b, head, strlen(head));
    bool first = true;
    for (int byte = 0; byte < 256; byte++) {
        if (byte == s->skip_byte) continue;
        if (!first) ts_strbuf_append(&b, ",", 1);
        first = false;
        ts_strbuf_append(&b, "\"", 1);
        append_byte_spelling(&b, byte);
        char tail[16];
        snprintf(tail, sizeof tail, "\":%d", byte);
        ts_strbuf_append(&b, tail, strlen(tail));
    }
    ts_strbuf_append(&b, s->extra_vocab, strlen(s->extra_vocab));
    ts_strbuf_append(&b, "},\"merges\":[", 12);
    ts_strbuf_append(&b, s->merges, strlen(s->merges));
    ts_strbuf_append(&b, "]}}", 3);
    const char *path = write_file("synth.json", b.data, b.len);
    ts_strbuf_free(&b);
    return path;
}

static ts_bpe *load_synth(const synth *s) {
    ts_bpe *t = NULL;
    ts_status st = ts_bpe_load(write_synth(s), &t);
    CHECKF(st == TS_OK, "%s", ts_last_error());
    return t;
}

static ts_bpe *load_small(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer/small/tokenizer.json",
             tu_env("TS_FIXTURES", "tests/fixtures"));
    ts_bpe *t = NULL;
    ts_status st = ts_bpe_load(path, &t);
    CHECKF(st == TS_OK, "%s", ts_last_error());
    return t;
}

/* ---- merge order and encoding rules --------------------------------------------------------- */

static void test_merge_rules(void) {
    ts_ids v = {0};
    synth s = synth_default;
    ts_bpe *t = load_synth(&s);
    if (!t) return;
    CHECK(encode(t, "abc xyz", 7, true, &v) == TS_OK && ids_are(&v, IDS(258, 32, 120, 121, 122)));
    ts_bpe_free(t);

    s.merges = "\"b c\",\"a b\",\"ab c\""; /* rank decides: "bc" first, then nothing applies */
    t = load_synth(&s);
    CHECK(t && encode(t, "abc", 3, true, &v) == TS_OK && ids_are(&v, IDS(97, 257)));
    ts_bpe_free(t);

    s.merges = "\"a b\",\"b c\",\"a b\""; /* a pair listed twice keeps its later rank (HF) */
    t = load_synth(&s);
    CHECK(t && encode(t, "abc", 3, true, &v) == TS_OK && ids_are(&v, IDS(97, 257)));
    ts_bpe_free(t);

    s.merges = "[\"a\",\"b\"],[\"b\",\"c\"],[\"ab\",\"c\"]"; /* the pair form */
    t = load_synth(&s);
    CHECK(t && encode(t, "abc", 3, true, &v) == TS_OK && ids_are(&v, IDS(258)));
    ts_bpe_free(t);

    s.merges = "";
    s.ignore_merges = "true"; /* whole pre-tokens found in the vocab skip merging */
    t = load_synth(&s);
    CHECK(t && encode(t, "abc ab", 6, true, &v) == TS_OK && ids_are(&v, IDS(258, 32, 97, 98)));
    ts_bpe_free(t);

    /* Added tokens: leftmost-longest; a skipped special token stays text and the scan goes on
     * after it; a normalized token matches after NFC. Ids as HF assigns them. */
    s = synth_default;
    s.added = "{\"id\":233,\"content\":\"\xC3\xA9\",\"normalized\":true,\"special\":false},"
              "{\"id\":260,\"content\":\"<s>\",\"normalized\":false,\"special\":true},"
              "{\"id\":261,\"content\":\"<s>x\",\"normalized\":false,\"special\":false}";
    t = load_synth(&s);
    if (t) {
        CHECK(encode(t, "e\xCC\x81", 3, true, &v) == TS_OK && ids_are(&v, IDS(233)));
        CHECK(encode(t, "<s>x", 4, false, &v) == TS_OK && ids_are(&v, IDS(261)));
        CHECK(encode(t, "<s>y", 4, true, &v) == TS_OK && ids_are(&v, IDS(260, 121)));
        CHECK(encode(t, "<s>y", 4, false, &v) == TS_OK && ids_are(&v, IDS(60, 115, 62, 121)));
        CHECK(encode(t, "<s><s>x", 7, false, &v) == TS_OK && ids_are(&v, IDS(60, 115, 62, 261)));
        CHECK(ts_bpe_vocab_size(t) == 262);
        CHECK(ts_bpe_token_id(t, "<s>x") == 261 && ts_bpe_is_special(t, 260));
        CHECK(!ts_bpe_is_special(t, 261) && !ts_bpe_is_special(t, 233));
    }
    ts_bpe_free(t);
    /* the text of a skipped special token is not searched again for other added tokens */
    s.added = "{\"id\":260,\"content\":\"<s>\",\"normalized\":false,\"special\":true},"
              "{\"id\":261,\"content\":\"s>x\",\"normalized\":false,\"special\":false}";
    t = load_synth(&s);
    CHECK(t && encode(t, "a<s>xs>x", 8, false, &v) == TS_OK &&
          ids_are(&v, IDS(97, 60, 115, 62, 120, 261)));
    CHECK(t && encode(t, "a<s>xs>x", 8, true, &v) == TS_OK && ids_are(&v, IDS(97, 260, 120, 261)));
    ts_bpe_free(t);
    ts_ids_free(&v);
}

/* ---- refused and malformed files ------------------------------------------------------------ */

static void expect_load_error(const char *what, const char *path, ts_status want,
                              const char *needle) {
    ts_bpe *t = NULL;
    ts_status st = ts_bpe_load(path, &t);
    CHECKF(st == want && t == NULL && strstr(ts_last_error(), needle),
           "%s: got %s '%s', want %s containing '%s'", what, ts_status_name(st), ts_last_error(),
           ts_status_name(want), needle);
    ts_bpe_free(t);
}

static void expect_synth_error(const char *what, const synth *s, ts_status want,
                               const char *needle) {
    expect_load_error(what, write_synth(s), want, needle);
}

static void test_load_errors(void) {
    char path[160];
    snprintf(path, sizeof path, "%s/missing.json", tmpdir);
    expect_load_error("missing", path, TS_ERR_IO, "missing.json");
    expect_load_error("directory", tmpdir, TS_ERR_IO, "not a regular file");
    expect_load_error("bad json", write_file("bad.json", "{\"model\": [", 11), TS_ERR_FORMAT,
                      "line 1");
    expect_load_error("not an object", write_file("arr.json", "[1]", 3), TS_ERR_FORMAT,
                      "not a JSON object");

    /* larger than the cap: a sparse file, refused before reading */
    snprintf(path, sizeof path, "%s/huge.json", tmpdir);
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    CHECK(fd >= 0 && ftruncate(fd, (off_t)TS_BPE_MAX_FILE_BYTES + 1) == 0);
    close(fd);
    expect_load_error("huge", path, TS_ERR_RANGE, "bytes");

    synth s = synth_default;
    s.merges = "\"a q\"";
    expect_synth_error("merge result unknown", &s, TS_ERR_FORMAT, "model.merges[0]");
    s.merges = "\"a b c\"";
    expect_synth_error("merge with 2 spaces", &s, TS_ERR_FORMAT, "model.merges[0]");
    s.merges = "[\"a\"]";
    expect_synth_error("merge pair of 1", &s, TS_ERR_FORMAT, "model.merges[0]");
    s = synth_default;
    s.extra_vocab = ",\"ab\":98";
    expect_synth_error("duplicate id", &s, TS_ERR_FORMAT, "id 98");
    s.extra_vocab = ",\"ab\":-1";
    expect_synth_error("negative id", &s, TS_ERR_FORMAT, "model.vocab");
    s = synth_default;
    s.skip_byte = 'A';
    expect_synth_error("missing byte", &s, TS_ERR_UNSUPPORTED, "byte 0x41");
    s = synth_default;
    s.normalizer = "{\"type\":\"NFKC\"}";
    expect_synth_error("NFKC", &s, TS_ERR_UNSUPPORTED, "normalizer.type 'NFKC'");
    s.normalizer = "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Lowercase\"}]}";
    expect_synth_error("Lowercase", &s, TS_ERR_UNSUPPORTED, "normalizer.normalizers[0]");
    s = synth_default;
    s.truncation = "{\"max_length\":5}";
    expect_synth_error("truncation", &s, TS_ERR_UNSUPPORTED, "truncation");
    s = synth_default;
    s.model_type = "\"WordPiece\"";
    expect_synth_error("WordPiece", &s, TS_ERR_UNSUPPORTED, "model.type 'WordPiece'");
    s = synth_default;
    s.dropout = "0.1";
    expect_synth_error("dropout", &s, TS_ERR_UNSUPPORTED, "model.dropout");
    s = synth_default;
    s.decoder = "{\"type\":\"Metaspace\"}";
    expect_synth_error("decoder", &s, TS_ERR_UNSUPPORTED, "decoder.type 'Metaspace'");
    s = synth_default;
    s.pretok = "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true}";
    expect_synth_error("prefix space", &s, TS_ERR_UNSUPPORTED, "add_prefix_space");
    s.pretok = "{\"type\":\"Whitespace\"}";
    expect_synth_error("Whitespace", &s, TS_ERR_UNSUPPORTED, "pre_tokenizer.type 'Whitespace'");
    s.pretok = "null";
    expect_synth_error("no pre-tokenizer", &s, TS_ERR_UNSUPPORTED, "pre_tokenizer");
    s.pretok = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
               "{\"Regex\":\"\\\\s+\"},\"behavior\":\"Removed\",\"invert\":false},"
               "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]}";
    expect_synth_error("Removed", &s, TS_ERR_UNSUPPORTED, "pretokenizers[0].behavior");
    s.pretok = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
               "{\"Regex\":\"\\\\w+\"},\"behavior\":\"Isolated\",\"invert\":false},"
               "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]}";
    expect_synth_error("\\w", &s, TS_ERR_UNSUPPORTED, "escape \\w");
    s.pretok = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
               "{\"Regex\":\"(unclosed\"},\"behavior\":\"Isolated\",\"invert\":false},"
               "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]}";
    expect_synth_error("bad regex", &s, TS_ERR_FORMAT, "does not compile");
    s.pretok = "{\"type\":\"Sequence\",\"pretokenizers\":["
               "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false},"
               "{\"type\":\"Split\",\"pattern\":{\"String\":\"x\"},\"behavior\":\"Isolated\"}]}";
    expect_synth_error("split after ByteLevel", &s, TS_ERR_UNSUPPORTED, "follow ByteLevel");
    s = synth_default;
    s.added = "{\"id\":260,\"content\":\"<s>\",\"lstrip\":true,\"special\":true,"
              "\"normalized\":false}";
    expect_synth_error("lstrip", &s, TS_ERR_UNSUPPORTED, "added_tokens[0].lstrip");
    s.added = "{\"id\":265,\"content\":\"<s>\",\"special\":true,\"normalized\":false}";
    expect_synth_error("added id", &s, TS_ERR_FORMAT, "Hugging Face gives '<s>' id 260");
    s.added = "{\"id\":260,\"content\":\"<s>\",\"special\":true,\"normalized\":false},"
              "{\"id\":261,\"content\":\"<s>\",\"special\":true,\"normalized\":false}";
    expect_synth_error("added twice", &s, TS_ERR_FORMAT, "listed twice");
    s.added = "{\"id\":260,\"content\":\"\"}";
    expect_synth_error("empty content", &s, TS_ERR_FORMAT, "added_tokens[0].content");
    s.added = "{\"id\":260,\"content\":\"<s>\",\"special\":true}";
    expect_synth_error("no normalized flag", &s, TS_ERR_FORMAT, "needs \"special\"");
}

/* Truncated and bit-flipped copies of a real file: each load fails cleanly or gives a
 * tokenizer that works (run under the sanitizers, this is the crash check). */
static void test_load_corrupt(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer/small/tokenizer.json",
             tu_env("TS_FIXTURES", "tests/fixtures"));
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (!f) return;
    static char orig[1 << 16], copy[1 << 16];
    size_t n = fread(orig, 1, sizeof orig, f);
    fclose(f);
    unsigned long long rng = 77;
    int loaded = 0, refused = 0;
    ts_ids v = {0};
    for (int iter = 0; iter < 400; iter++) {
        size_t len = n;
        memcpy(copy, orig, n);
        if (iter < 100) {
            len = (size_t)(tu_rng_next(&rng) % n);
        } else {
            for (int k = 0; k < 1 + iter % 3; k++)
                copy[tu_rng_next(&rng) % n] ^= (char)(1u << (tu_rng_next(&rng) % 8));
        }
        ts_bpe *t = NULL;
        ts_status st = ts_bpe_load(write_file("corrupt.json", copy, len), &t);
        if (st == TS_OK) {
            loaded++;
            const char *probe = "Hello <|im_end|> w\xC3\xB6rld 123";
            CHECK(encode(t, probe, strlen(probe), true, &v) == TS_OK);
            char *text;
            size_t tl;
            if (ts_bpe_decode(t, v.data, v.len, false, &text, &tl) == TS_OK) free(text);
            ts_bpe_free(t);
        } else {
            refused++;
            CHECK(t == NULL && strstr(ts_last_error(), "corrupt.json"));
        }
    }
    CHECK(refused >= 100); /* every truncation is refused */
    printf("corrupt copies: %d loaded, %d refused\n", loaded, refused);
    ts_ids_free(&v);
}

/* ---- the small stand-in tokenizer ----------------------------------------------------------- */

static void test_small(void) {
    ts_bpe *t = load_small();
    if (!t) return;
    ts_ids v = {0};
    CHECK(ts_bpe_vocab_size(t) == 1033);
    const char *hello = "Hello world, <|im_start|>user 12345 \xC3\xBCn\xC3\xAF"
                        "c\xC3\xB6"
                        "d\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87";
    CHECK(encode(t, hello, strlen(hello), true, &v) == TS_OK &&
          ids_are(&v, IDS(39, 570, 78, 268, 728, 11, 220, 1001, 357, 264, 220, 16, 17, 18, 19, 20,
                          220, 127, 120, 77, 127, 107, 66, 127, 114, 67, 127, 102, 220, 160, 116,
                          255, 162, 244, 229)));
    const char *chat = "a<|im_end|>\n<think>x</think>";
    CHECK(encode(t, chat, strlen(chat), true, &v) == TS_OK &&
          ids_are(&v, IDS(64, 1002, 198, 1024, 87, 1025)));
    CHECK(encode(t, chat, strlen(chat), false, &v) == TS_OK &&
          ids_are(&v, IDS(64, 27, 91, 329, 62, 68, 274, 91, 29, 198, 1024, 87, 1025)));
    /* out keeps what it held: encode appends */
    v.len = 0;
    CHECK(ts_bpe_encode(t, "\n", 1, true, &v) == TS_OK &&
          ts_bpe_encode(t, " the", 4, true, &v) == TS_OK && ids_are(&v, IDS(198, 261)));
    CHECK(encode(t, "", 0, true, &v) == TS_OK && v.len == 0);
    CHECK(ts_bpe_encode(t, NULL, 3, true, &v) == TS_ERR_INVALID);

    /* ill-formed UTF-8: each maximal subpart becomes U+FFFD (HF on the lossy string) */
    CHECK(encode(t, "ok \xFF ok", 7, true, &v) == TS_OK &&
          ids_are(&v, IDS(677, 220, 171, 123, 121, 270, 74)));
    CHECK(encode(t,
                 "a\xE2\x82"
                 "b",
                 4, true, &v) == TS_OK &&
          ids_are(&v, IDS(64, 171, 123, 121, 65)));
    CHECK(encode(t,
                 "a\xC0\x80"
                 "b",
                 4, true, &v) == TS_OK &&
          ids_are(&v, IDS(64, 171, 123, 121, 171, 123, 121, 65)));

    CHECK(ts_bpe_token_id(t, "<|im_end|>") == 1002 && ts_bpe_token_id(t, "<think>") == 1024);
    CHECK(ts_bpe_token_id(t, "\n") == 198 && ts_bpe_token_id(t, " the") == 261);
    CHECK(ts_bpe_token_id(t, "no such token") == -1 && ts_bpe_token_id(t, "") == -1);
    CHECK(ts_bpe_is_special(t, 1002) && !ts_bpe_is_special(t, 1024));
    CHECK(!ts_bpe_is_special(t, 5) && !ts_bpe_is_special(t, -1) && !ts_bpe_is_special(t, 5000));
    size_t n;
    const char *b = ts_bpe_token_bytes(t, 1002, &n);
    CHECK(b && n == 10 && !memcmp(b, "<|im_end|>", 10));
    b = ts_bpe_token_bytes(t, 220, &n);
    CHECK(b && n == 1 && b[0] == ' ');
    CHECK(ts_bpe_token_bytes(t, 1033, &n) == NULL && ts_bpe_token_bytes(t, -1, &n) == NULL);

    /* decode(encode(x)) == x for NFC text; skip_special drops special tokens only */
    char *text;
    size_t len;
    CHECK(encode(t, hello, strlen(hello), true, &v) == TS_OK);
    CHECK(ts_bpe_decode(t, v.data, v.len, false, &text, &len) == TS_OK && len == strlen(hello) &&
          !memcmp(text, hello, len) && text[len] == '\0');
    free(text);
    CHECK(encode(t, chat, strlen(chat), true, &v) == TS_OK);
    CHECK(ts_bpe_decode(t, v.data, v.len, true, &text, &len) == TS_OK &&
          !strcmp(text, "a\n<think>x</think>"));
    free(text);
    int32_t bad_ids[] = {64, 1033};
    CHECK(ts_bpe_decode(t, bad_ids, 2, false, &text, &len) == TS_ERR_RANGE && text == NULL);
    CHECK(ts_bpe_decode(t, NULL, 0, false, &text, &len) == TS_OK && len == 0 && text[0] == 0);
    free(text);
    ts_ids_free(&v);
    ts_bpe_free(t);
}

/* The short-word scan and the heap give the same ids; random words over a small alphabet so
 * that many merges apply, lengths on both sides of the switch-over. */
static void test_merge_methods_agree(void) {
    ts_bpe *t = load_small();
    if (!t) return;
    bpe_scratch *s = bpe_scratch_get(t);
    ts_ids a = {0}, b = {0};
    unsigned long long rng = 5;
    static const char letters[] = "etaoinshrdlu eeettthhh";
    int bad = 0;
    for (int iter = 0; iter < 3000; iter++) {
        uint8_t w[400];
        size_t n = 1 + (size_t)(tu_rng_next(&rng) % (iter < 2500 ? 60 : sizeof w));
        for (size_t i = 0; i < n; i++)
            w[i] = (uint8_t)letters[tu_rng_next(&rng) % 22];
        a.len = b.len = 0;
        bpe_merge_word(t, s, w, n, 1, &a);
        bpe_merge_word(t, s, w, n, 2, &b);
        bad += a.len != b.len || memcmp(a.data, b.data, a.len * sizeof *a.data) != 0;
    }
    CHECKF(bad == 0, "%d words merge differently", bad);
    bpe_scratch_put(t, s);
    ts_ids_free(&a);
    ts_ids_free(&b);
    ts_bpe_free(t);
}

/* 200 kB of one character class is one pre-token: merging must stay O(n log n). A quadratic
 * merge takes minutes here; the bound is generous for sanitizer builds. */
static void test_huge_pretokens(void) {
    ts_bpe *t = load_small();
    if (!t) return;
    static const char *const units[] = {" ",
                                        "a",
                                        "ab",
                                        "!",
                                        "7",
                                        "\n",
                                        " \t",
                                        "\xC3\xA9",
                                        "e\xCC\x81",
                                        "\xE4\xB8\xAD",
                                        "\xF0\x9F\x98\x80",
                                        "\xFF"};
    size_t total = 200000;
    char *text = malloc(total + 8);
    ts_ids v = {0};
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        size_t ul = strlen(units[u]), n = 0;
        while (n + ul <= total) {
            memcpy(text + n, units[u], ul);
            n += ul;
        }
        double t0 = ts_now_s();
        ts_status st = encode(t, text, n, true, &v);
        double dt = ts_now_s() - t0;
        CHECKF(st == TS_OK && v.len > 0, "unit %zu: %s", u, ts_last_error());
        CHECKF(dt < 2.0, "200 kB of unit %zu took %.2f s", u, dt);
        char *back;
        size_t blen;
        if (st == TS_OK && ts_bpe_decode(t, v.data, v.len, false, &back, &blen) == TS_OK) {
            /* NFC composes e + U+0301, ill-formed bytes become U+FFFD */
            if (u != 8 && u != 11) CHECK(blen == n && !memcmp(back, text, n));
            free(back);
        }
    }
    free(text);
    ts_ids_free(&v);
    ts_bpe_free(t);
}

/* ---- several threads encoding at once ------------------------------------------------------- */

#define N_TEXTS 64

typedef struct {
    const ts_bpe *t;
    const char **texts;
    const ts_ids *want;
    int errors;
} worker_arg;

static void *worker(void *p) {
    worker_arg *w = p;
    ts_ids v = {0};
    for (int rep = 0; rep < 30; rep++)
        for (int i = 0; i < N_TEXTS; i++) {
            v.len = 0;
            if (ts_bpe_encode(w->t, w->texts[i], strlen(w->texts[i]), i % 2, &v) != TS_OK ||
                v.len != w->want[i].len ||
                memcmp(v.data, w->want[i].data, v.len * sizeof *v.data) != 0)
                w->errors++;
        }
    ts_ids_free(&v);
    return NULL;
}

static void test_threads(void) {
    ts_bpe *t = load_small();
    if (!t) return;
    static const char *const parts[] = {
        "The ", "tower",        " of ", "<|im_end|>", "caf\xC3\xA9 ", "e\xCC\x81", "1234",
        "  \n", "\xE4\xB8\xAD", "\xFF", "don't ",     "<think>",      "\t\t",      "!!! "};
    const char *texts[N_TEXTS];
    ts_ids want[N_TEXTS];
    unsigned long long rng = 11;
    for (int i = 0; i < N_TEXTS; i++) {
        char buf[512] = "";
        int k = 1 + (int)(tu_rng_next(&rng) % 30);
        for (int j = 0; j < k; j++)
            strcat(buf, parts[tu_rng_next(&rng) % 14]);
        texts[i] = strdup(buf);
        want[i] = (ts_ids){0};
        CHECK(ts_bpe_encode(t, texts[i], strlen(texts[i]), i % 2, &want[i]) == TS_OK);
    }
    pthread_t th[4];
    worker_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (worker_arg){t, texts, want, 0};
        pthread_create(&th[i], NULL, worker, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECKF(args[i].errors == 0, "thread %d: %d wrong encodings", i, args[i].errors);
    }
    for (int i = 0; i < N_TEXTS; i++) {
        free((char *)texts[i]);
        ts_ids_free(&want[i]);
    }
    ts_bpe_free(t);
}

/* A directory whose path leaves no room for the names joined to it (tokenizer.json, the
 * optional generation_config.json) is refused by name, not read under a path cut short. */
static void test_long_path(void) {
    char path[4096];
    size_t n = (size_t)snprintf(path, sizeof path, "%s", tmpdir);
    while (n + 200 < 4070) { /* components of 199 bytes, then one to reach ~4070 */
        size_t k = n + 200 < 4000 ? 199 : 4070 - n - 1;
        path[n++] = '/';
        memset(path + n, 'd', k);
        n += k;
        path[n] = 0;
        if (mkdir(path, 0700) != 0) {
            CHECKF(false, "mkdir at %zu bytes", n);
            return;
        }
    }
    ts_tokenizer *tok = NULL;
    ts_status st = ts_tokenizer_open(path, &tok);
    CHECKF(st == TS_ERR_INVALID && tok == NULL && strstr(ts_last_error(), "too long"),
           "a path of %zu bytes: %d %s", strlen(path), st, ts_last_error());
    ts_tokenizer_free(tok);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ts_test_bpe_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    test_merge_rules();
    test_load_errors();
    test_load_corrupt();
    test_small();
    test_merge_methods_agree();
    test_huge_pretokens();
    test_threads();
    test_long_path();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) return 1;
    return tu_report("test_bpe");
}
