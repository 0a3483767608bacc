/* libFuzzer target for the text a client sees: generated ids -> the streaming detokenizer
 * (text/utf8.h, skip_special as the server runs it) -> serve_textout (the <think> channels, the
 * stop matcher of serve/stop.h, the tool-call filter), driven as serve/decode.c drives them,
 * with the small Qwen3.5 stand-in tokenizer (loaded once). Checks: every segment is non-empty
 * valid UTF-8; a tool segment is a call's JSON; and, where no tool filter rewrites the content,
 * no stop string shows within one channel run (the stop matcher's promise).
 *
 * Input: byte 0 = flags (bit 0 the prompt ended inside <think>, bit 1 tools, bits 2-4 the number
 * of stop strings, at most 4); each stop string: 1 length byte (1 + b % 8), then its bytes
 * (dropped when not valid UTF-8 or holding a NUL, as serve_parse_stop never gives such);
 * then the generated ids, 16 bits each, taken modulo the vocabulary. */
#include "fuzz_util.h"
#include "serve/textout.h"
#include "text/bpe.h"

#include <jansson.h>
#include <stdint.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ts_bpe *tok;
static int32_t think_open, think_close, im_end, eot;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    if (ts_bpe_load(fz_tokenizer_path(), &tok) != TS_OK) {
        fprintf(stderr, "fuzz_textout: %s\n", ts_last_error());
        abort();
    }
    think_open = ts_bpe_token_id(tok, "<think>");
    think_close = ts_bpe_token_id(tok, "</think>");
    im_end = ts_bpe_token_id(tok, "<|im_end|>");
    eot = ts_bpe_token_id(tok, "<|endoftext|>");
    return 0;
}

typedef struct {
    char *const *stops;
    int n_stops;
    bool tools;
    int run_ch;    /* the channel of the current run, -1 before the first segment */
    ts_strbuf run; /* the text of the current run of one channel */
} state;

static void end_run(state *s) {
    if (s->run_ch == SERVE_CH_REASONING || (s->run_ch == SERVE_CH_CONTENT && !s->tools))
        for (int i = 0; i < s->n_stops; i++)
            FZ_ASSERT(!s->run.len ||
                      !memmem(s->run.data, s->run.len, s->stops[i], strlen(s->stops[i])));
    s->run.len = 0;
    s->run_ch = -1;
}

static ts_status sink(void *ctx, serve_channel ch, const char *p, size_t n) {
    state *s = ctx;
    FZ_ASSERT(n > 0);
    if (ch == SERVE_CH_TOOL) {
        json_error_t je;
        json_t *v = json_loadb(p, n, 0, &je);
        FZ_ASSERT(json_is_object(v));
        json_decref(v);
        return TS_OK;
    }
    FZ_ASSERT(ts_utf8_valid(p, n));
    if ((int)ch != s->run_ch) end_run(s);
    s->run_ch = (int)ch;
    return ts_strbuf_append(&s->run, p, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    bool in_think = data[0] & 1, tools = data[0] & 2;
    int want = (data[0] >> 2) & 7;
    size_t at = 1;
    char stop_text[4][9];
    char *stops[4];
    int n_stops = 0;
    for (int i = 0; i < want && i < 4 && at < size; i++) {
        size_t len = 1 + data[at++] % 8;
        if (len > size - at) break;
        memcpy(stop_text[n_stops], data + at, len);
        stop_text[n_stops][len] = 0;
        at += len;
        if (!ts_utf8_valid(stop_text[n_stops], len) || strlen(stop_text[n_stops]) != len) continue;
        stops[n_stops] = stop_text[n_stops];
        n_stops++;
    }
    state s = {stops, n_stops, tools, -1, {0}};
    serve_textout to;
    serve_textout_init(&to, think_open, think_close, in_think, stops, n_stops, sink, &s);
    if (tools) serve_textout_enable_tools(&to, false);
    ts_token_source src;
    ts_bpe_token_source(tok, &src);
    ts_detok *d;
    FZ_ASSERT(ts_detok_create(&src, true, &d) == TS_OK);
    int vocab = ts_bpe_vocab_size(tok);
    bool stopped = false;
    for (; at + 1 < size && !stopped; at += 2) {
        int32_t id = (int32_t)((data[at] | data[at + 1] << 8) % vocab);
        if (id == im_end || id == eot) {
            stopped = true;
            break;
        }
        const char *text;
        size_t len;
        FZ_ASSERT(ts_detok_push(d, id, &text, &len) == TS_OK);
        FZ_ASSERT(serve_textout_token(&to, id, text, len, &stopped) == TS_OK);
        if (id == think_open || id == think_close) end_run(&s); /* held text went out first */
    }
    if (!stopped) {
        const char *text;
        size_t len;
        FZ_ASSERT(ts_detok_flush(d, &text, &len) == TS_OK);
        if (len) FZ_ASSERT(serve_textout_token(&to, -1, text, len, &stopped) == TS_OK);
    }
    FZ_ASSERT(serve_textout_finish(&to) == TS_OK);
    end_run(&s);
    serve_textout_free(&to);
    ts_detok_free(d);
    ts_strbuf_free(&s.run);
    return 0;
}
