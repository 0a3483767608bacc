/* serve/toolcall: the Qwen3.5 tool-call block parser, the list form's parser (a Python list of
 * calls, serve/toolcall_py.c), the streaming filter that holds calls back from the content
 * (fed in pieces of every size) in either form, and the content channel of textout with tools
 * on. */
#include <string.h>

#include <jansson.h>
#include <stdlib.h>

#include "serve/respond.h"
#include "serve/textout.h"
#include "serve/toolcall.h"
#include "testutil.h"

static bool parse(const char *block, const char *want) {
    ts_strbuf out = {0};
    bool ok = serve_toolcall_parse(block, strlen(block), &out);
    bool same = ok && want && out.len == strlen(want) && memcmp(out.data, want, out.len) == 0;
    if (ok != (want != NULL) || (ok && !same))
        fprintf(stderr, "  parse '%s' -> %s '%.*s'\n", block, ok ? "ok" : "rejected",
                (int)out.len, out.data ? out.data : "");
    ts_strbuf_free(&out);
    return ok == (want != NULL) && (!ok || same);
}

static void test_parse(void) {
    /* the template's own layout */
    CHECK(parse("\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                "<parameter=days>\n3\n</parameter>\n</function>\n",
                "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\","
                "\\\"days\\\":3}\"}"));
    /* no parameters; JSON values stay JSON, the rest are strings (multi-line kept) */
    CHECK(parse("<function=now>\n</function>", "{\"name\":\"now\",\"arguments\":\"{}\"}"));
    CHECK(parse("<function=f>\n<parameter=o>\n{\"a\": [1, 2.5]}\n</parameter>\n"
                "<parameter=t>\nline 1\nline 2\n</parameter>\n<parameter=b>\ntrue\n</parameter>\n"
                "<parameter=q>\n\"quoted\"\n</parameter>\n</function>",
                "{\"name\":\"f\",\"arguments\":\"{\\\"o\\\":{\\\"a\\\": [1, 2.5]},\\\"t\\\":"
                "\\\"line 1\\\\nline 2\\\",\\\"b\\\":true,\\\"q\\\":\\\"quoted\\\"}\"}"));
    /* malformed: no function, unclosed parameter, junk between parameters, text after the
     * function, an empty name, a repeated key, a name across lines */
    CHECK(parse("just text", NULL));
    CHECK(parse("<function=f>\n<parameter=a>\n1\n</function>", NULL));
    CHECK(parse("<function=f>\n<parameter=a>\n1\n</parameter>\njunk\n</function>", NULL));
    CHECK(parse("<function=f>\n</function>\ntrailing", NULL));
    CHECK(parse("<function=f>\n<parameter=a>\n1\n</parameter>\n", NULL));
    CHECK(parse("<function=>\n</function>", NULL));
    CHECK(parse("<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n"
                "</function>",
                NULL));
    CHECK(parse("<function=f\ng>\n</function>", NULL));
    /* control characters in a function's or a parameter's name */
    CHECK(parse("<function=f\x01g>\n</function>", NULL));
    CHECK(parse("<function=f>\n<parameter=a\x7f>\n1\n</parameter>\n</function>", NULL));
}

typedef struct {
    ts_strbuf content, calls;
    int n_calls;
} capture;

static ts_status cap(void *ctx, bool call, const char *s, size_t n) {
    capture *c = ctx;
    if (call) {
        c->n_calls++;
        ts_strbuf_append(&c->calls, "|", 1);
    }
    return ts_strbuf_append(call ? &c->calls : &c->content, s, n);
}

/* Runs text through the filter in pieces of `step` bytes. */
static void filter_form(const char *text, size_t step, capture *c, bool finish, bool list) {
    serve_toolcall_filter f;
    serve_toolcall_filter_init(&f, list, cap, c);
    size_t n = strlen(text);
    for (size_t i = 0; i < n; i += step)
        CHECK(serve_toolcall_filter_push(&f, text + i, n - i < step ? n - i : step) == TS_OK);
    if (finish) CHECK(serve_toolcall_filter_finish(&f) == TS_OK);
    serve_toolcall_filter_free(&f);
}

static void filter(const char *text, size_t step, capture *c, bool finish) {
    filter_form(text, step, c, finish, false);
}

static bool eq(const ts_strbuf *b, const char *s) {
    return b->len == strlen(s) && (b->len == 0 || memcmp(b->data, s, b->len) == 0);
}

#define CALL_A "<tool_call>\n<function=a>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>"
#define CALL_B "<tool_call>\n<function=b>\n</function>\n</tool_call>"

static void test_filter(void) {
    for (size_t step = 1; step <= 9; step++) {
        capture c = {{0}, {0}, 0};
        /* text, then two calls: the separators in front of the calls are dropped */
        filter("Let me check.\n\n" CALL_A "\n" CALL_B, step, &c, true);
        CHECKF(eq(&c.content, "Let me check."), "step %zu: '%.*s'", step, (int)c.content.len,
               c.content.data);
        CHECKF(c.n_calls == 2 &&
                   eq(&c.calls, "|{\"name\":\"a\",\"arguments\":\"{\\\"x\\\":1}\"}"
                                "|{\"name\":\"b\",\"arguments\":\"{}\"}"),
               "step %zu: '%.*s'", step, (int)c.calls.len, c.calls.data);
        ts_strbuf_free(&c.content);
        ts_strbuf_free(&c.calls);

        /* held back while the call is open: nothing of it is content before it closes */
        c = (capture){{0}, {0}, 0};
        filter("Hi <tool_call>\n<function=a>\n", step, &c, false);
        CHECKF(eq(&c.content, "Hi"), "step %zu: '%.*s'", step, (int)c.content.len,
               c.content.data);
        ts_strbuf_free(&c.content);

        /* a partial call when the generation ends is content after all, the whitespace in
         * front of it too (what the model wrote) */
        c = (capture){{0}, {0}, 0};
        filter("Hi <tool_call>\n<function=a>\n<param", step, &c, true);
        CHECK(c.n_calls == 0);
        CHECKF(eq(&c.content, "Hi <tool_call>\n<function=a>\n<param"), "step %zu: '%.*s'", step,
               (int)c.content.len, c.content.data);
        ts_strbuf_free(&c.content);

        /* a malformed block is content with its separator, a good one after it is still a
         * call */
        c = (capture){{0}, {0}, 0};
        filter("Text.\n\t<tool_call>oops</tool_call> then " CALL_B, step, &c, true);
        CHECKF(eq(&c.content, "Text.\n\t<tool_call>oops</tool_call> then"), "step %zu: '%.*s'",
               step, (int)c.content.len, c.content.data);
        CHECK(c.n_calls == 1);
        ts_strbuf_free(&c.content);
        ts_strbuf_free(&c.calls);

        /* something that only starts like the tag, and trailing newlines, are released */
        c = (capture){{0}, {0}, 0};
        filter("a <tool b <tool_cal\n\n", step, &c, true);
        CHECKF(eq(&c.content, "a <tool b <tool_cal\n\n"), "step %zu: '%.*s'", step,
               (int)c.content.len, c.content.data);
        CHECK(c.n_calls == 0);
        ts_strbuf_free(&c.content);
    }
}

/* textout with tools: calls come out as SERVE_CH_TOOL segments, reasoning is untouched. */
typedef struct {
    ts_strbuf ch[3];
    int n_tool;
} seg_capture;

static ts_status seg_sink(void *ctx, serve_channel ch, const char *s, size_t n) {
    seg_capture *c = ctx;
    if (ch == SERVE_CH_TOOL) c->n_tool++;
    return ts_strbuf_append(&c->ch[ch], s, n);
}

static void test_textout_tools(void) {
    enum { OPEN = 900, CLOSE = 901 };
    seg_capture c = {{{0}}, 0};
    serve_textout t;
    bool stop;
    serve_textout_init(&t, OPEN, CLOSE, true, NULL, 0, seg_sink, &c);
    serve_textout_enable_tools(&t, false);
    const char *pieces[] = {"I should call <tool_call>", "\n", "ok", NULL};
    for (int i = 0; pieces[i]; i++)
        CHECK(serve_textout_token(&t, i, pieces[i], strlen(pieces[i]), &stop) == TS_OK);
    CHECK(serve_textout_token(&t, CLOSE, "", 0, &stop) == TS_OK);
    const char *answer = "\n\nSure.\n\n" CALL_B;
    for (size_t i = 0, n = strlen(answer); i < n; i += 3) {
        size_t k = n - i < 3 ? n - i : 3;
        CHECK(serve_textout_token(&t, 10, answer + i, k, &stop) == TS_OK);
    }
    CHECK(serve_textout_finish(&t) == TS_OK);
    CHECKF(eq(&c.ch[SERVE_CH_REASONING], "I should call <tool_call>\nok"), "reasoning '%.*s'",
           (int)c.ch[1].len, c.ch[1].data);
    CHECKF(eq(&c.ch[SERVE_CH_CONTENT], "Sure."), "content '%.*s'", (int)c.ch[0].len,
           c.ch[0].data);
    CHECK(c.n_tool == 1 && eq(&c.ch[SERVE_CH_TOOL], "{\"name\":\"b\",\"arguments\":\"{}\"}"));
    serve_textout_free(&t);
    for (int i = 0; i < 3; i++) ts_strbuf_free(&c.ch[i]);
}

/* The OpenAI shapes: message.tool_calls (content null when there is none), finish_reason
 * "tool_calls", and one stream delta per call with its index. */
static void add_seg(serve_job *j, serve_channel ch, const char *s) {
    size_t off = j->text.len;
    ts_strbuf_append(&j->text, s, strlen(s));
    j->seg = realloc(j->seg, (size_t)(j->n_seg + 1) * sizeof *j->seg);
    j->seg[j->n_seg++] = (serve_segment){ch, off, strlen(s)};
}

static void test_response(void) {
    serve_job *j;
    CHECK(serve_job_create(&j) == TS_OK);
    add_seg(j, SERVE_CH_REASONING, "hmm");
    add_seg(j, SERVE_CH_TOOL, "{\"name\":\"a\",\"arguments\":\"{\\\"x\\\":1}\"}");
    add_seg(j, SERVE_CH_TOOL, "{\"name\":\"b\",\"arguments\":\"{}\"}");
    j->finish = SERVE_FINISH_STOP;
    serve_resp r;
    serve_resp_init(&r, SERVE_API_CHAT, "m", false, NULL);
    char *body = serve_resp_full(&r, &j, 1, 1, 1);
    json_t *v = json_loads(body, 0, NULL);
    json_t *c = json_array_get(json_object_get(v, "choices"), 0);
    json_t *msg = json_object_get(c, "message"), *calls = json_object_get(msg, "tool_calls");
    CHECK(json_is_null(json_object_get(msg, "content")));
    CHECK(!strcmp(json_string_value(json_object_get(c, "finish_reason")), "tool_calls"));
    CHECK(!strcmp(json_string_value(json_object_get(msg, "reasoning_content")), "hmm"));
    CHECK(json_array_size(calls) == 2);
    json_t *c0 = json_array_get(calls, 0), *f0 = json_object_get(c0, "function");
    CHECK(!strncmp(json_string_value(json_object_get(c0, "id")), "call_", 5));
    CHECK(!strcmp(json_string_value(json_object_get(c0, "type")), "function"));
    CHECK(!strcmp(json_string_value(json_object_get(f0, "name")), "a"));
    CHECK(!strcmp(json_string_value(json_object_get(f0, "arguments")), "{\"x\":1}"));
    CHECK(strcmp(json_string_value(json_object_get(c0, "id")),
                 json_string_value(json_object_get(json_array_get(calls, 1), "id"))) != 0);
    json_decref(v);
    free(body);

    ts_strbuf out = {0};
    CHECK(serve_resp_chunk_tool(&r, 2, 1, j->text.data + j->seg[2].off, j->seg[2].len, NULL, 0,
                                &out) == TS_OK);
    CHECK(out.len > 8 && !memcmp(out.data, "data: ", 6));
    v = json_loadb(out.data + 6, out.len - 6, 0, NULL);
    json_t *ch = json_array_get(json_object_get(v, "choices"), 0); /* choice 2's second call */
    CHECK(json_integer_value(json_object_get(ch, "index")) == 2);
    json_t *d = json_object_get(ch, "delta");
    json_t *t = json_array_get(json_object_get(d, "tool_calls"), 0);
    CHECK(json_integer_value(json_object_get(t, "index")) == 1);
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")), "b"));
    json_decref(v);
    ts_strbuf_free(&out);

    /* no calls: content is "" (not null) and the finish reason is the plain one */
    j->finish = SERVE_FINISH_LENGTH;
    j->n_seg = 1;
    body = serve_resp_full(&r, &j, 1, 1, 1);
    CHECK(strstr(body, "\"finish_reason\":\"length\"") && !strstr(body, "tool_calls"));
    CHECK(strstr(body, "\"content\":\"\""));
    free(body);
    serve_job_unref(j);
}

/* The list's calls, joined by '|', or NULL when it is not a list of calls. */
static bool parse_list(const char *text, const char *want) {
    ts_strbuf out = {0};
    bool ok = serve_toolcall_parse_list(text, strlen(text), &out);
    for (size_t i = 0; i < out.len; i++) /* the NULs between the calls */
        if (out.data[i] == 0) out.data[i] = '|';
    bool same = ok && want && out.len == strlen(want) && memcmp(out.data, want, out.len) == 0;
    if (ok != (want != NULL) || (ok && !same))
        fprintf(stderr, "  parse_list '%s' -> %s '%.*s'\n", text, ok ? "ok" : "rejected",
                (int)out.len, out.data ? out.data : "");
    ts_strbuf_free(&out);
    return ok == (want != NULL) && (!ok || same);
}

static void test_parse_list(void) {
    CHECK(parse_list("[get_weather(city=\"Paris\")]",
                     "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}|"));
    /* two calls, no arguments, Python literals of every kind, spaces and a trailing comma */
    CHECK(parse_list(
        " \n[ a() , b(s='it\\'s\\n\\u00e9', n=-3, x=2.5e1, t=True, f=False, z=None, l=[1, (2,)], "
        "d={'k': [\"v\"]}, ), ]\n",
        "{\"name\":\"a\",\"arguments\":\"{}\"}|{\"name\":\"b\",\"arguments\":\"{\\\"s\\\":"
        "\\\"it's\\\\n\u00e9\\\",\\\"n\\\":-3,\\\"x\\\":25.0,\\\"t\\\":true,\\\"f\\\":"
        "false,\\\"z\\\":null,\\\"l\\\":[1,[2]],\\\"d\\\":{\\\"k\\\":[\\\"v\\\"]}}\"}|"));
    /* in a code fence */
    CHECK(parse_list("```python\n[f(a=1)]\n```",
                     "{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}|"));
    /* not a list of calls: text, an empty list, a bare call, text after the list, positional
     * arguments, an unclosed string, a bad escape, a non-string dict key, an open list */
    const char *bad[] = {"hello",   "[]",         "f(a=1)",         "[f(a=1)] and more",
                         "[f(1)]",  "[f(a=\"x)]", "[f(a=\"\\q\")]", "[f(a={1: 2})]",
                         "[f(a=1)", "[1, 2, 3]",  "```\n[f()]",     "[f(a=1 b=2)]"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
        CHECK(parse_list(bad[k], NULL));
    /* nesting past the bound */
    char deep[400] = "[f(a=";
    for (int k = 0; k < 100; k++)
        strcat(deep, "[");
    CHECK(parse_list(deep, NULL));
}

/* The list form through the filter: a reply that may be a list is held whole and read at
 * the end (the calls, or the text as it was); any other reply streams as it comes. */
static void test_filter_list(void) {
    for (size_t step = 1; step <= 7; step++) {
        capture c = {{0}, {0}, 0};
        filter_form("  [f(a=1), g()]\n", step, &c, false, true);
        CHECK(c.content.len == 0 && c.n_calls == 0); /* held until the end */
        ts_strbuf_free(&c.content), ts_strbuf_free(&c.calls);
        c = (capture){{0}, {0}, 0};
        filter_form("  [f(a=1), g()]\n", step, &c, true, true);
        CHECK(c.n_calls == 2 && c.content.len == 0);
        ts_strbuf_free(&c.content), ts_strbuf_free(&c.calls);
        c = (capture){{0}, {0}, 0};
        filter_form("[1, 2] are numbers", step, &c, true, true);
        CHECK(c.n_calls == 0 && eq(&c.content, "[1, 2] are numbers"));
        ts_strbuf_free(&c.content), ts_strbuf_free(&c.calls);
        c = (capture){{0}, {0}, 0};
        filter_form("Sure: [f()]", step, &c, false, true); /* streams from its first letter */
        CHECK(c.n_calls == 0 && eq(&c.content, "Sure: [f()]"));
        ts_strbuf_free(&c.content), ts_strbuf_free(&c.calls);
    }
}

int main(void) {
    test_parse();
    test_parse_list();
    test_filter_list();
    test_filter();
    test_textout_tools();
    test_response();
    return tu_report("test_serve_toolcall");
}
