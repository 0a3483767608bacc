/* libFuzzer target for encoding and decoding with two fixed, valid tokenizers, loaded once: the
 * small Qwen3.5 stand-in (byte-level, tests/fixtures/tokenizer/small) and the small Gemma-style
 * one (characters with byte fallback, tests/fixtures/tokenizer/small_gemma). Arbitrary bytes
 * must encode to ids in the vocabulary; decoding gives valid UTF-8; text without added tokens
 * comes back as its NFC form (Gemma: as itself, U+2581 read as a space); and the streaming
 * detokenizer (text/utf8.h), fed the ids one by one, gives exactly the one-shot decode. The
 * same is checked for arbitrary id sequences (the input read as 16-bit ids), which reach byte
 * sequences no encoding produces.
 *
 * Input: byte 0 = flags (bit 0 parse_special, bit 1 skip_special, bit 2 the rest is ids rather
 * than text, bit 3 the Gemma-style tokenizer). TS_FUZZ_TOKENIZER overrides the byte-level
 * tokenizer.json used. */
#include "fuzz_util.h"
#include "text/bpe.h"

#include <stdint.h>
#include <utf8proc.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ts_bpe *byte_level, *gemma, *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    if (ts_bpe_load(fz_tokenizer_path(), &byte_level) != TS_OK ||
        ts_bpe_load(TS_SOURCE_DIR "/tests/fixtures/tokenizer/small_gemma/tokenizer.json", &gemma) !=
            TS_OK) {
        fprintf(stderr, "fuzz_bpe_encode: %s\n", ts_last_error());
        abort();
    }
    return 0;
}

/* What decoding gives back for text of one segment: NFC (byte-level, Qwen's normalizer), or
 * the text with every U+2581 a space (Gemma's normalizer and decoder). malloc'd. */
static char *round_trip(const char *text, size_t len, size_t *n) {
    if (tok == gemma) {
        ts_strbuf b = {0};
        FZ_ASSERT(ts_strbuf_reserve(&b, len) == TS_OK);
        for (size_t i = 0; i < len; i++) {
            bool space = i + 2 < len && !memcmp(text + i, "\xE2\x96\x81", 3);
            FZ_ASSERT(ts_strbuf_append(&b, space ? " " : text + i, 1) == TS_OK);
            i += space ? 2 : 0;
        }
        *n = b.len;
        return b.data;
    }
    utf8proc_uint8_t *nfc = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &nfc,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    FZ_ASSERT(r >= 0);
    *n = (size_t)r;
    return (char *)nfc;
}

/* The one-shot decode against the streaming detokenizer. */
static void check_decode(const int32_t *ids, size_t n, bool skip) {
    char *one;
    size_t one_len;
    FZ_ASSERT(ts_bpe_decode(tok, ids, n, skip, &one, &one_len) == TS_OK);
    FZ_ASSERT(ts_utf8_valid(one, one_len));
    ts_token_source src;
    ts_bpe_token_source(tok, &src);
    ts_detok *d;
    FZ_ASSERT(ts_detok_create(&src, skip, &d) == TS_OK);
    ts_strbuf streamed = {0};
    const char *piece;
    size_t len;
    for (size_t i = 0; i < n; i++) {
        FZ_ASSERT(ts_detok_push(d, ids[i], &piece, &len) == TS_OK);
        FZ_ASSERT(ts_utf8_valid(piece, len)); /* only whole characters come out */
        FZ_ASSERT(ts_strbuf_append(&streamed, piece, len) == TS_OK);
    }
    FZ_ASSERT(ts_detok_push(d, ts_bpe_vocab_size(tok), &piece, &len) == TS_ERR_RANGE);
    FZ_ASSERT(ts_detok_flush(d, &piece, &len) == TS_OK);
    FZ_ASSERT(ts_strbuf_append(&streamed, piece, len) == TS_OK);
    FZ_ASSERT(streamed.len == one_len &&
              memcmp(streamed.data ? streamed.data : "", one, one_len) == 0);
    ts_strbuf_free(&streamed);
    ts_detok_free(d);
    free(one);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    bool parse_special = data[0] & 1, skip = data[0] & 2;
    tok = data[0] & 8 ? gemma : byte_level;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int vocab = ts_bpe_vocab_size(tok);
    if (data[0] & 4) {
        size_t n = len / 2;
        int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
        FZ_ASSERT(ids);
        for (size_t i = 0; i < n; i++)
            ids[i] = (int32_t)((data[1 + 2 * i] | data[2 + 2 * i] << 8) % vocab);
        check_decode(ids, n, skip);
        free(ids);
        return 0;
    }
    ts_ids ids = {0};
    FZ_ASSERT(ts_bpe_encode(tok, text, len, parse_special, &ids) == TS_OK);
    for (size_t i = 0; i < ids.len; i++)
        FZ_ASSERT(ids.data[i] >= 0 && ids.data[i] < vocab);
    FZ_ASSERT((ids.len == 0) == (len == 0));
    check_decode(ids.data, ids.len, skip);
    /* One segment (no '<' starts an added token) of valid UTF-8 decodes to its NFC form. */
    if (!skip && ts_utf8_valid(text, len) && !memchr(text, '<', len) && !memchr(text, 0, len)) {
        char *out, *want;
        size_t n, want_len;
        FZ_ASSERT(ts_bpe_decode(tok, ids.data, ids.len, false, &out, &n) == TS_OK);
        want = round_trip(text, len, &want_len);
        FZ_ASSERT(want_len == n && (n == 0 || memcmp(want, out, n) == 0));
        free(want);
        free(out);
    }
    ts_ids_free(&ids);
    return 0;
}
