/* Tool calls in generated content, in the Qwen3.5 format the chat template teaches:
 *
 *   <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>
 *
 * Each complete, well-formed block becomes one OpenAI tool call: the function's name and its
 * arguments as a JSON object (a VALUE that parses as JSON stays that value, any other VALUE is
 * a string). A block that is malformed, or still open when the generation ends, stays content.
 *
 * The streaming filter sits on the content channel: text from "<tool_call>" on is held back
 * until the block closes, so a client never sees half a call as content; whitespace right in
 * front of a call (the template's separator) is dropped - and given back with the block where
 * that turns out malformed or unfinished. */
#ifndef TS_SERVE_TOOLCALL_H
#define TS_SERVE_TOOLCALL_H

#include <stdbool.h>
#include <stddef.h>

#include "text/utf8.h"

/* Parses the text between <tool_call> and </tool_call>. On success returns true and appends
 * the call as compact JSON {"name": NAME, "arguments": "<JSON object text>"} to out. */
bool serve_toolcall_parse(const char *block, size_t n, ts_strbuf *out);

/* The other form (serve/toolcall_py.c): a reply that is nothing but a Python list of calls,
 * [name(key=value, ...), ...] (in a ``` fence or not), the form a model without a tool format
 * of its own (Gemma 3) is asked for. On success appends each call's JSON, as
 * serve_toolcall_parse writes it, followed by a NUL, to out. */
bool serve_toolcall_parse_list(const char *s, size_t n, ts_strbuf *out);

/* Receives what the filter decided: content text (call == false) or one call's JSON. */
typedef ts_status (*serve_toolcall_sink)(void *ctx, bool call, const char *s, size_t n);

typedef struct {
    bool in_call;   /* inside <tool_call>, waiting for </tool_call> */
    ts_strbuf held; /* undecided text: a possible "<tool_call>" prefix, newlines, an open call */
    ts_strbuf scratch;
    ts_strbuf sep; /* the whitespace in front of the open call: content again if it is not one */
    int n_calls;
    /* the list form (serve_toolcall_parse_list): a reply whose first non-space character is
     * '[' or '`' is held whole and read at the end (decided: it was not, it streams) */
    bool list_form, decided;
    serve_toolcall_sink sink;
    void *ctx;
} serve_toolcall_filter;

/* list_form: calls in the list form, else in the Qwen3.5 blocks. */
void serve_toolcall_filter_init(serve_toolcall_filter *f, bool list_form, serve_toolcall_sink sink,
                                void *ctx);
void serve_toolcall_filter_free(serve_toolcall_filter *f);
/* Feeds content text. */
ts_status serve_toolcall_filter_push(serve_toolcall_filter *f, const char *s, size_t n);
/* The generation ended: what is still held (an unfinished call, trailing newlines) is
 * released as content. */
ts_status serve_toolcall_filter_finish(serve_toolcall_filter *f);

#endif
