/* libFuzzer target for the tokenizer.json loader: any input must be refused with a status or
 * give a tokenizer that then encodes and decodes text (the input itself) within its vocabulary.
 * ts_bpe_load takes a path, so each input is written to a scratch file (fuzz_util.h). The
 * pre-tokenizer regex is the file's own, so a slow pattern shows up here as a timeout. */
#include "fuzz_util.h"
#include "text/bpe.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void exercise(const ts_bpe *t, const char *text, size_t len) {
    int vocab = ts_bpe_vocab_size(t);
    FZ_ASSERT(vocab > 0);
    for (int sp = 0; sp < 2; sp++) {
        ts_ids ids = {0};
        if (ts_bpe_encode(t, text, len, sp, &ids) == TS_OK) {
            for (size_t i = 0; i < ids.len; i++)
                FZ_ASSERT(ids.data[i] >= 0 && ids.data[i] < vocab);
            char *out;
            size_t n;
            FZ_ASSERT(ts_bpe_decode(t, ids.data, ids.len, sp, &out, &n) == TS_OK);
            FZ_ASSERT(ts_utf8_valid(out, n) && strlen(out) <= n);
            free(out);
        }
        ts_ids_free(&ids);
    }
    /* every id decodes to something (or "" when unused), ids outside are refused */
    int step = vocab > 4096 ? vocab / 4096 : 1;
    for (int id = 0; id < vocab; id += step) {
        size_t n;
        const char *b = ts_bpe_token_bytes(t, id, &n);
        FZ_ASSERT(b);
        fz_touch(b, n);
        fz_sink += ts_bpe_is_special(t, id);
    }
    size_t n;
    FZ_ASSERT(ts_bpe_token_bytes(t, vocab, &n) == NULL && ts_bpe_token_bytes(t, -1, &n) == NULL);
    static const char *const probes[] = {"<|im_end|>", "<think>", "\n", " ", "a", "", "\xC4\xA0"};
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        int32_t id = ts_bpe_token_id(t, probes[i]);
        FZ_ASSERT(id >= -1 && id < vocab);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fz_write("tokenizer.json", data, size);
    ts_bpe *t;
    if (ts_bpe_load(path, &t) != TS_OK) return 0;
    exercise(t, (const char *)data, size < 4096 ? size : 4096);
    ts_bpe_free(t);
    return 0;
}
