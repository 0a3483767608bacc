/* SentencePiece-style BPE (spm.c) on a small hand-made vocabulary: score-ordered merges with
 * leftmost ties, U+2581 spaces and the optional prefix, byte fallback, special-token splitting
 * (user-defined always, control with parse_special, longer first), decoding, ill-formed input,
 * and a long input that a quadratic merge loop would not finish quickly. The real Gemma 3
 * vocabulary is checked against llama.cpp by tests/py/test_gguf_tokenizer_parity.py. */
#include "testutil.h"
#include "text/spm.h"

#include <string.h>
#include <time.h>

#define SP "\xE2\x96\x81"

typedef struct {
    const char *text;
    float score;
    int type;
} tok;

/* ids are positions; bytes <0x00>..<0xFF> follow at BYTE0.. */
static const tok vocab[] = {
    {"<pad>", 0, TS_SPM_CONTROL},     /* 0 */
    {"<eos>", 0, TS_SPM_CONTROL},     /* 1 */
    {"<bos>", 0, TS_SPM_CONTROL},     /* 2 */
    {"<unk>", 0, TS_SPM_UNKNOWN},     /* 3 */
    {"<turn>", 0, TS_SPM_CONTROL},    /* 4 */
    {"\n", 0, TS_SPM_USER_DEFINED},   /* 5 */
    {"\n\n", 0, TS_SPM_USER_DEFINED}, /* 6 */
    {"ab", 0, TS_SPM_USER_DEFINED},   /* 7  overlaps "bcd" */
    {"bcd", 0, TS_SPM_USER_DEFINED},  /* 8 */
    {"a", -1, TS_SPM_NORMAL},         /* 9 */
    {"b", -1, TS_SPM_NORMAL},         /* 10 */
    {"c", -1, TS_SPM_NORMAL},         /* 11 */
    {"x", -1, TS_SPM_NORMAL},         /* 12 */
    {"y", -1, TS_SPM_NORMAL},         /* 13 */
    {"xy", -5, TS_SPM_NORMAL},        /* 14 */
    {"yx", -5, TS_SPM_NORMAL},        /* 15 equal score: leftmost pair wins */
    {"xyx", -2, TS_SPM_NORMAL},       /* 16 */
    {SP, -1, TS_SPM_NORMAL},          /* 17 */
    {SP "x", -3, TS_SPM_NORMAL},      /* 18 */
    {"cc", -4, TS_SPM_NORMAL},        /* 19 */
    {"cccc", -4, TS_SPM_NORMAL},      /* 20 */
    {"<unused0>", 0, TS_SPM_UNUSED},  /* 21 */
    {"<u>", 0, TS_SPM_USER_DEFINED},  /* 22 same first byte and length as 23 */
    {"<u!", 0, TS_SPM_CONTROL},       /* 23 */
};
#define N_WORDS ((int)(sizeof vocab / sizeof vocab[0]))
#define BYTE0   N_WORDS

static ts_spm *make(bool prefix) {
    static char bytes[256][8];
    const char *text[N_WORDS + 256];
    size_t len[N_WORDS + 256];
    float scores[N_WORDS + 256];
    int32_t types[N_WORDS + 256];
    for (int i = 0; i < N_WORDS + 256; i++) {
        if (i < N_WORDS) {
            text[i] = vocab[i].text;
            scores[i] = vocab[i].score;
            types[i] = vocab[i].type;
        } else {
            snprintf(bytes[i - N_WORDS], 8, "<0x%02X>", i - N_WORDS);
            text[i] = bytes[i - N_WORDS];
            scores[i] = 0;
            types[i] = TS_SPM_BYTE;
        }
        len[i] = strlen(text[i]);
    }
    ts_spm_spec spec = {.name = "test",
                        .n_tokens = N_WORDS + 256,
                        .text = text,
                        .len = len,
                        .scores = scores,
                        .types = types,
                        .unk_id = 3,
                        .add_space_prefix = prefix};
    ts_spm *t = NULL;
    ts_status st = ts_spm_build(&spec, &t);
    CHECKF(st == TS_OK, "%s", ts_last_error());
    return t;
}

/* Encodes s and compares with the expected ids (terminated by -1). */
static void expect(const ts_spm *t, const char *s, bool special, const int32_t *want) {
    ts_ids v = {0};
    ts_status st = ts_spm_encode(t, s, strlen(s), special, &v);
    CHECKF(st == TS_OK, "%s", ts_last_error());
    size_t n = 0;
    while (want[n] >= 0)
        n++;
    bool same = v.len == n && (n == 0 || memcmp(v.data, want, n * sizeof *want) == 0);
    if (!same) {
        fprintf(stderr, "encode('%s'):", s);
        for (size_t i = 0; i < v.len; i++)
            fprintf(stderr, " %d", (int)v.data[i]);
        fprintf(stderr, "\n");
    }
    CHECKF(same, "encode('%s') special=%d", s, (int)special);
    ts_ids_free(&v);
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__, -1})

static void test_merges(void) {
    ts_spm *t = make(false);
    if (!t) return;
    /* xyx: pairs xy and yx tie at -5, but xyx (-2) is only reachable from either; leftmost
     * pair xy merges first, then xy+x -> xyx */
    expect(t, "xyx", false, IDS(16));
    expect(t, "xyxy", false, IDS(16, 13)); /* xy(0) first, then xyx, y left */
    expect(t, "yxy", false, IDS(15, 13));  /* yx is leftmost of the tie */
    expect(t, "cccc", false, IDS(20));
    expect(t, "ccc", false, IDS(19, 11));
    /* spaces become U+2581 and merge with what follows; no prefix */
    expect(t, "x x", false, IDS(12, 18));
    expect(t, " x", false, IDS(18));
    /* byte fallback for a character without a piece: é = C3 A9 */
    expect(t, "\xC3\xA9x", false, IDS(BYTE0 + 0xC3, BYTE0 + 0xA9, 12));
    /* ill-formed UTF-8 is read as U+FFFD (EF BF BD, no piece -> bytes) */
    expect(t, "\xFFx", false, IDS(BYTE0 + 0xEF, BYTE0 + 0xBF, BYTE0 + 0xBD, 12));
    expect(t, "", false, (const int32_t[]){-1});
    ts_spm_free(t);
}

static void test_special(void) {
    ts_spm *t = make(false);
    if (!t) return;
    /* user-defined pieces always split out; control ones only with parse_special */
    expect(t, "x\n\nx", false, IDS(12, 6, 12));
    expect(t, "x\n\n\nx", false, IDS(12, 6, 5, 12));
    expect(t, "<turn>", true, IDS(4));
    int32_t lt = BYTE0 + '<';
    expect(t, "<turn>", false,
           IDS(lt, BYTE0 + 't', BYTE0 + 'u', BYTE0 + 'r', BYTE0 + 'n', BYTE0 + '>'));
    expect(t, "<u><u!", false, IDS(22, BYTE0 + '<', BYTE0 + 'u', BYTE0 + '!'));
    expect(t, "<u><u!", true, IDS(22, 23));
    /* longer tokens are taken first over the whole text: "bcd" beats the earlier "ab" */
    expect(t, "abcd", false, IDS(9, 8));
    expect(t, "abab", false, IDS(7, 7));
    ts_spm_free(t);
    /* with add_space_prefix, the text start and each piece after a special token get U+2581 */
    t = make(true);
    if (!t) return;
    expect(t, "x", false, IDS(18));
    expect(t, "x\nx", false, IDS(18, 5, 18));
    ts_spm_free(t);
}

static void test_decode(void) {
    ts_spm *t = make(false);
    if (!t) return;
    int32_t ids[] = {2, 12, 18, BYTE0 + 0xC3, BYTE0 + 0xA9, 6, 21, 7, 4};
    char *s;
    size_t n;
    CHECK(ts_spm_decode(t, ids, 9, false, &s, &n) == TS_OK);
    CHECKF(strcmp(s, "<bos>x x\xC3\xA9\n\nab<turn>") == 0, "[%s]", s);
    free(s);
    CHECK(ts_spm_decode(t, ids, 9, true, &s, &n) == TS_OK);
    CHECKF(strcmp(s, "x x\xC3\xA9\n\nab") == 0, "[%s]", s);
    free(s);
    /* a lone continuation byte decodes to U+FFFD */
    int32_t lone[] = {BYTE0 + 0xA9};
    CHECK(ts_spm_decode(t, lone, 1, false, &s, &n) == TS_OK);
    CHECK(strcmp(s, "\xEF\xBF\xBD") == 0);
    free(s);
    int32_t bad[] = {N_WORDS + 256};
    CHECK(ts_spm_decode(t, bad, 1, false, &s, &n) == TS_ERR_RANGE);
    CHECK(ts_spm_token_id(t, SP "x") == 18 && ts_spm_token_id(t, "zz") == -1);
    CHECK(ts_spm_is_special(t, 4) && !ts_spm_is_special(t, 5) && ts_spm_is_special(t, 3));
    ts_spm_free(t);
}

static void test_long(void) {
    ts_spm *t = make(false);
    if (!t) return;
    size_t n = 400000;
    char *s = malloc(n + 1);
    memset(s, 'c', n);
    s[n] = 0;
    ts_ids v = {0};
    clock_t t0 = clock();
    CHECK(ts_spm_encode(t, s, n, false, &v) == TS_OK);
    double dt = (double)(clock() - t0) / CLOCKS_PER_SEC;
    CHECKF(v.len == n / 4, "%zu ids", v.len);
    CHECKF(dt < 2.0, "400k characters took %.2f s", dt);
    ts_ids_free(&v);
    free(s);
    ts_spm_free(t);
}

static void test_build_errors(void) {
    const char *text[] = {"a", "<0xZZ>"};
    size_t len[] = {1, 6};
    int32_t types[] = {TS_SPM_NORMAL, TS_SPM_BYTE};
    ts_spm_spec spec = {
        .name = "bad", .n_tokens = 2, .text = text, .len = len, .types = types, .unk_id = -1};
    ts_spm *t;
    CHECK(ts_spm_build(&spec, &t) == TS_ERR_FORMAT);
    types[1] = TS_SPM_NORMAL; /* no byte pieces and no unknown token */
    CHECK(ts_spm_build(&spec, &t) == TS_ERR_UNSUPPORTED);
    spec.unk_id = 0;
    CHECK(ts_spm_build(&spec, &t) == TS_OK);
    ts_spm_free(t);
}

int main(void) {
    test_merges();
    test_special();
    test_decode();
    test_long();
    test_build_errors();
    return tu_report("test_spm");
}
