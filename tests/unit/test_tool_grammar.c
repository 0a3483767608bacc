/* text/tool_grammar_py.c: the grammar of forced tool calls in the list form (a Python list of
 * calls, for a chat format without calls of its own), byte for byte - the arguments in the
 * schema's order, required ones present, values as Python literals valid against their
 * schemas, the refusals - and, by random walks through it, that every sentence it allows is
 * one that serve/toolcall_py.c reads back into calls of the offered functions. */
#include "serve/toolcall.h"
#include "testutil.h"
#include "text/grammar.h"
#include "text/json_schema.h"

#include <jansson.h>
#include <stdint.h>
#include <string.h>

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
    "\"type\":\"object\",\"properties\":{"
    "\"days\":{\"type\":\"integer\"},"
    "\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]},"
    "\"metric\":{\"type\":\"boolean\"},"
    "\"spots\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":2},"
    "\"note\":{\"type\":\"string\",\"maxLength\":12},"
    "\"mode\":{\"enum\":[true,null,\"x/y\"]},"
    "\"code\":{\"type\":\"string\",\"pattern\":\"^[a-z]+$\"},"
    "\"tag\":{\"type\":\"string\",\"pattern\":\"q\"}},"
    "\"required\":[\"days\",\"unit\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"now\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"fs.read-file\",\"parameters\":{"
    "\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\"},"
    "\"odd\":{\"type\":\"string\",\"minLength\":2,\"pattern\":\"a\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"free\"}}]";

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})

static ts_grammar *build(const char *tools, const char *only, bool parallel) {
    ts_grammar *g = NULL;
    ts_status st = ts_grammar_tool_list(tools, only, parallel, &g);
    CHECKF(st == TS_OK && g, "tool list grammar: %d %s", (int)st, ts_last_error());
    return g;
}

static void expect(const ts_grammar *g, const char *what, const char *const *yes,
                   const char *const *no) {
    for (; g && yes && *yes; yes++)
        CHECKF(ts_grammar_matches(g, *yes, strlen(*yes)), "%s should accept [%s]", what, *yes);
    for (; g && no && *no; no++)
        CHECKF(!ts_grammar_matches(g, *no, strlen(*no)), "%s should reject [%s]", what, *no);
}

static void test_sentences(void) {
    ts_grammar *g = build(TOOLS, NULL, true);
    expect(g, "all tools",
           LIST("[now()]", "\n\n[now()]", "[get_weather(days=3, unit=\"celsius\")]",
                "[get_weather(days=3,unit=\"fahrenheit\",metric=True)]",
                "[get_weather(days=-12, unit=\"celsius\", spots=[1,2], note=\"a\\nb\\\"c\")]",
                "[get_weather(days=0, unit=\"celsius\", mode=True)]",
                "[get_weather(days=0, unit=\"celsius\", mode=None)]",
                "[get_weather(days=0, unit=\"celsius\", mode=\"x/y\", code=\"abc\")]",
                "[get_weather(days=0, unit=\"celsius\", tag=\"a/q\\u00e9\\u20ac\")]",
                "[now(), get_weather(days=1, unit=\"celsius\"),now()]",
                "[fs.read-file(path=\"/etc/hosts\")]", "[fs.read-file()]", "[free()]",
                "[free(x=1, y_2=\"s\", z=None, w=[True, {\"a\": False}])]"),
           LIST("", "[]", "now()", "[now()] ", "[now(),]", "[now(x=1)]", "[other()]",
                /* order, a required one missing, values off their schemas */
                "[get_weather(unit=\"celsius\", days=3)]", "[get_weather(days=3)]",
                "[get_weather(days=3, unit=\"kelvin\")]",
                "[get_weather(days=3.5, unit=\"celsius\")]",
                "[get_weather(days=3, unit=\"celsius\", note=\"thirteen char\")]",
                "[get_weather(days=3, unit=\"celsius\", code=\"ab1\")]",
                /* JSON's words and the escapes Python reads otherwise */
                "[get_weather(days=3, unit=\"celsius\", metric=true)]",
                "[get_weather(days=3, unit=\"celsius\", mode=null)]", "[free(z=null)]",
                "[free(w=[true])]", "[get_weather(days=3, unit=\"celsius\", note=\"a\\/b\")]",
                "[get_weather(days=3, unit=\"celsius\", tag=\"q\\/\")]",
                "[get_weather(days=3, unit=\"celsius\", tag=\"q\\ud83d\\ude00\")]",
                "[fs.read-file(path=\"\\uDC00\")]",
                /* keys a call cannot have */
                "[free(1x=2)]", "[free(a b=2)]", "[get_weather(days=1, unit='celsius')]"));
    ts_grammar_free(g);

    g = build(TOOLS, NULL, false);
    expect(g, "one call", LIST("[now()]"), LIST("[now(), now()]", "[now(),now()]"));
    ts_grammar_free(g);
    g = build(TOOLS, "now", true);
    expect(g, "only now", LIST("[now()]", "[now(), now()]"),
           LIST("[get_weather(days=1, unit=\"celsius\")]", "[free()]"));
    ts_grammar_free(g);
}

static void refused(const char *tools, const char *only, const char *want) {
    ts_grammar *g = NULL;
    ts_status st = ts_grammar_tool_list(tools, only, true, &g);
    CHECKF(st == TS_ERR_INVALID && !g && strstr(ts_last_error(), want),
           "tools %s (only %s): %d '%s', want '%s'", tools, only ? only : "-", (int)st,
           ts_last_error(), want);
    ts_grammar_free(g);
}

static void test_refusals(void) {
    refused(TOOLS, "nope", "no tool named 'nope'");
    refused("[{\"type\":\"function\",\"function\":{\"name\":\"my tool\"}}]", NULL, "'my tool'");
    refused("[{\"type\":\"function\",\"function\":{\"name\":\"2go\"}}]", NULL, "'2go'");
    refused("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"
            "\"object\",\"properties\":{\"a b\":{}}}}}]",
            NULL, "parameter 'a b'");
    refused("[]", NULL, "no function");
    refused("{}", NULL, "not a JSON array");
}

/* ---- random walks: whatever the grammar lets a model write, the reader takes -------------- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static unsigned next_rand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (unsigned)(rng >> 32);
}

/* One sentence of g, up to cap bytes: each step a byte the grammar allows, drawn at random;
 * past soft bytes, the bytes that close things are tried first, and the walk ends as soon as
 * it may. Returns its length, or 0 when it did not end within cap. */
static size_t walk(const ts_grammar *g, char *out, size_t cap, size_t soft) {
    ts_grammar_matcher *m;
    if (ts_grammar_matcher_create(g, NULL, &m) != TS_OK) return 0;
    size_t n = 0;
    while (n < cap) {
        if (ts_grammar_matcher_can_end(m) && (n > soft || next_rand() % 16 == 0)) break;
        char c = 0;
        bool moved = false;
        for (const char *p = n > soft ? "\")]}0" : ""; *p && !moved; p++)
            if ((moved = ts_grammar_matcher_accept_bytes(m, p, 1))) c = *p;
        for (int tries = 0; !moved && tries < 64; tries++) { /* printable ASCII mostly */
            c = (char)(tries < 48 ? 0x20 + next_rand() % 0x5f : next_rand() % 256);
            moved = ts_grammar_matcher_accept_bytes(m, &c, 1);
        }
        for (int b = 0; !moved && b < 256; b++) { /* a byte only a few allow (UTF-8, \n) */
            c = (char)b;
            moved = ts_grammar_matcher_accept_bytes(m, &c, 1);
        }
        if (!moved) break;
        out[n++] = c;
    }
    bool ended = ts_grammar_matcher_can_end(m);
    ts_grammar_matcher_free(m);
    return ended ? n : 0;
}

/* Every call read back names an offered function, with arguments that are a JSON object whose
 * values have the types the schemas ask. */
static void check_calls(const char *text, const ts_strbuf *calls) {
    for (size_t at = 0; at < calls->len; at += strlen(calls->data + at) + 1) {
        json_t *c = json_loads(calls->data + at, 0, NULL);
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *a = json_loads(json_string_value(json_object_get(c, "arguments")), 0, NULL);
        CHECKF(name && json_is_object(a), "[%s]: call %s", text, calls->data + at);
        if (name && !strcmp(name, "get_weather")) {
            const json_t *unit = json_object_get(a, "unit"), *metric = json_object_get(a, "metric");
            CHECKF(json_is_integer(json_object_get(a, "days")), "[%s]: days", text);
            CHECKF(json_is_string(unit), "[%s]: unit", text);
            CHECKF(!metric || json_is_boolean(metric), "[%s]: metric", text);
        } else if (name) {
            CHECKF(!strcmp(name, "now") || !strcmp(name, "fs.read-file") || !strcmp(name, "free"),
                   "[%s]: name %s", text, name);
        }
        json_decref(a);
        json_decref(c);
    }
}

static void test_walks_read_back(void) {
    ts_grammar *g = build(TOOLS, NULL, true);
    char text[4096];
    int ended = 0, tried = 400;
    for (int i = 0; g && i < tried; i++) {
        size_t n = walk(g, text, sizeof text - 1, 40 + next_rand() % 200);
        if (!n) continue;
        text[n] = 0;
        ended++;
        ts_strbuf calls = {0};
        bool ok = serve_toolcall_parse_list(text, n, &calls);
        CHECKF(ok && calls.len > 0, "the reader refuses a sentence of the grammar: [%s]", text);
        if (ok) check_calls(text, &calls);
        ts_strbuf_free(&calls);
    }
    CHECKF(ended > tried / 2, "only %d of %d walks ended", ended, tried);
    ts_grammar_free(g);
}

int main(void) {
    test_sentences();
    test_refusals();
    test_walks_read_back();
    return tu_report("test_tool_grammar");
}
