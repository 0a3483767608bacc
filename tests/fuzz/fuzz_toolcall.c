/* libFuzzer target for the tool-call parser and its streaming filter (serve/toolcall.h).
 * Model output is untrusted text: the parser must turn a block into {"name": ..., "arguments":
 * "<a JSON object>"} or refuse it, and the filter must give the same content and calls however
 * the text is cut into pieces (the streaming and the blocking response must agree).
 *
 * Both forms: Qwen3.5's blocks, and the list of Python calls (serve_toolcall_parse_list).
 *
 * Input: byte 0 = the piece length for the streamed run (1 + (byte & 0x7f) % 16) and, in its
 * top bit, the list form; then the text. */
#include "base/status.h"
#include "fuzz_util.h"
#include "serve/toolcall.h"

#include <jansson.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    ts_strbuf content;
    ts_strbuf calls; /* each call's JSON, then a NUL */
    int n_calls;
} collected;

static ts_status sink(void *ctx, bool call, const char *s, size_t n) {
    collected *c = ctx;
    FZ_ASSERT(n > 0);
    if (!call) return ts_strbuf_append(&c->content, s, n);
    c->n_calls++;
    TS_TRY(ts_strbuf_append(&c->calls, s, n));
    return ts_strbuf_append(&c->calls, "", 1);
}

/* A call is {"name": non-empty string, "arguments": string holding a JSON object}. */
static void check_call(const char *s, size_t n) {
    json_error_t je;
    json_t *v = json_loadb(s, n, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    FZ_ASSERT(json_is_object(v) && json_object_size(v) == 2);
    const json_t *name = json_object_get(v, "name"), *args = json_object_get(v, "arguments");
    FZ_ASSERT(json_is_string(name) && json_string_length(name) > 0 && json_is_string(args));
    /* U+0000 is valid JSON, but jansson refuses it in an object key: then only the shape */
    json_t *a = json_loadb(json_string_value(args), json_string_length(args), JSON_ALLOW_NUL, &je);
    FZ_ASSERT(json_is_object(a) ||
              (strstr(json_string_value(args), "\\u0000") && json_string_value(args)[0] == '{'));
    json_decref(a);
    json_decref(v);
}

static void run(const char *text, size_t len, size_t piece, bool list, collected *c) {
    serve_toolcall_filter f;
    serve_toolcall_filter_init(&f, list, sink, c);
    for (size_t i = 0; i < len; i += piece)
        FZ_ASSERT(serve_toolcall_filter_push(&f, text + i, len - i < piece ? len - i : piece) ==
                  TS_OK);
    FZ_ASSERT(serve_toolcall_filter_finish(&f) == TS_OK);
    FZ_ASSERT(f.n_calls == c->n_calls);
    serve_toolcall_filter_free(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    size_t piece = 1 + (data[0] & 0x7f) % 16;
    bool list = data[0] & 0x80;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;

    ts_strbuf out = {0};
    if (serve_toolcall_parse(text, len, &out)) check_call(out.data, out.len);
    out.len = 0;
    if (serve_toolcall_parse_list(text, len, &out))
        for (size_t off = 0; off < out.len; off += strlen(out.data + off) + 1)
            check_call(out.data + off, strlen(out.data + off));
    ts_strbuf_free(&out);

    collected whole = {0}, cut = {0};
    run(text, len, len ? len : 1, list, &whole);
    run(text, len, piece, list, &cut);
    for (size_t off = 0; off < whole.calls.len; off += strlen(whole.calls.data + off) + 1)
        check_call(whole.calls.data + off, strlen(whole.calls.data + off));
    FZ_ASSERT(whole.n_calls == cut.n_calls);
    FZ_ASSERT(whole.content.len == cut.content.len);
    FZ_ASSERT(whole.content.len == 0 ||
              memcmp(whole.content.data, cut.content.data, whole.content.len) == 0);
    FZ_ASSERT(whole.calls.len == cut.calls.len);
    FZ_ASSERT(whole.calls.len == 0 ||
              memcmp(whole.calls.data, cut.calls.data, whole.calls.len) == 0);
    ts_strbuf_free(&whole.content);
    ts_strbuf_free(&whole.calls);
    ts_strbuf_free(&cut.content);
    ts_strbuf_free(&cut.calls);
    return 0;
}
