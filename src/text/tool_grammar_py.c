/* The grammar of an answer that is tool calls in the list form (tool_choice "required" or a
 * named function, for a chat format without calls of its own - Gemma 3's):
 *
 *   [NAME(KEY=VALUE, KEY=VALUE), NAME(...)]
 *
 * as text/chat_gemma.c asks the model to write them and renders earlier calls, and as
 * serve/toolcall_py.c reads them. NAME is one of the offered functions; its keyword arguments
 * come in the order of its schema's `properties`, the required ones always, the others or not
 * (a function without `properties` takes any keys). A VALUE is a Python literal valid against
 * the parameter's schema - the schema compiled as for response_format, in Python's spelling
 * (True, False, None) - or any literal where the compiler does not take the schema (tools
 * often carry keywords like `pattern`: the call is still constrained, only that value is
 * not). Arguments and calls are separated by "," or ", ". */
#include "base/status.h"
#include "text/grammar.h"
#include "text/json_schema.h"
#include "text/tool_grammar_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define TL_ANY_KEY 63  /* the longest key after its first byte, for functions without properties */
#define TL_KEY_MAX 255 /* the reader's longest keyword */

typedef struct {
    tool_format f; /* first: the shared driver's hooks (tool_grammar_int.h) */
    ts_gbuild *b;
    int sep;       /* "," | ", " */
    int any_value; /* any Python literal, -1 until first needed */
} tl_ctx;

static void set_add(uint64_t s[4], int lo, int hi) {
    for (int c = lo; c <= hi; c++)
        s[c >> 6] |= 1ull << (c & 63);
}

/* What serve/toolcall_py.c reads as a name: [A-Za-z_][A-Za-z0-9_.-]* (tool names hold '-'
 * and '.'). */
static bool name_ok(const char *s, size_t max) {
    size_t n = strlen(s);
    if (n == 0 || n > max) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool alpha = c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        bool more = (c >= '0' && c <= '9') || c == '-' || c == '.';
        if (!alpha && (i == 0 || !more)) return false;
    }
    return true;
}

static int any_value(tl_ctx *t) {
    if (t->any_value < 0 && ts_json_schema_rule(t->b, "true", 4, true, &t->any_value) != TS_OK)
        t->any_value = -1; /* out of memory: ts_gbuild_finish fails on it */
    return t->any_value;
}

/* The rule of a parameter's value: its schema's literals, or any literal when the compiler
 * does not take the schema - tried alone first, so that a refusal leaves b as it was. */
static int value(tl_ctx *t, const json_t *schema) {
    char *text = schema ? json_dumps(schema, JSON_COMPACT) : NULL;
    ts_grammar *probe = NULL;
    bool ok = text && ts_grammar_from_json_schema(text, strlen(text), &probe) == TS_OK;
    ts_grammar_free(probe);
    int r = -1;
    ok = ok && ts_json_schema_rule(t->b, text, strlen(text), true, &r) == TS_OK;
    free(text);
    return ok ? r : any_value(t);
}

/* KEY "=" VALUE */
static int argument(tl_ctx *t, const char *key, const json_t *schema) {
    int v = value(t, schema);
    int r = ts_gbuild_rule(t->b), a = ts_gbuild_alt(t->b, r);
    ts_gbuild_literal(t->b, a, key, strlen(key));
    ts_gbuild_literal(t->b, a, "=", 1);
    ts_gbuild_ref(t->b, a, v);
    return r;
}

/* Any keyword arguments: "" | kv more; more ::= "" | sep kv more; kv ::= KEY "=" any. */
static int any_arguments(tl_ctx *t) {
    ts_gbuild *b = t->b;
    uint64_t first[4] = {0}, rest[4] = {0};
    set_add(first, 'a', 'z'), set_add(first, 'A', 'Z'), set_add(first, '_', '_');
    memcpy(rest, first, sizeof rest);
    set_add(rest, '0', '9'), set_add(rest, '-', '.');
    int kv = ts_gbuild_rule(b), a = ts_gbuild_alt(b, kv);
    ts_gbuild_set(b, a, first);
    ts_gbuild_ref(b, a, ts_gbuild_set_chain(b, rest, TL_ANY_KEY, true, NULL));
    ts_gbuild_literal(b, a, "=", 1);
    ts_gbuild_ref(b, a, any_value(t));
    int more = ts_gbuild_rule(b), any = ts_gbuild_rule(b);
    ts_gbuild_alt(b, more);
    a = ts_gbuild_alt(b, more);
    ts_gbuild_ref(b, a, t->sep);
    ts_gbuild_ref(b, a, kv);
    ts_gbuild_ref(b, a, more);
    ts_gbuild_alt(b, any);
    a = ts_gbuild_alt(b, any);
    ts_gbuild_ref(b, a, kv);
    ts_gbuild_ref(b, a, more);
    return any;
}

/* A function's arguments: its properties in order, the required ones always. Two families
 * keep the separators right whichever optional ones are left out: F_i (none written yet)
 * ::= arg_i C_{i+1} | F_{i+1}, C_i (some written) ::= sep arg_i C_{i+1} | C_{i+1}, the
 * second alternatives only for an optional arg_i; F_n ::= C_n ::= "". */
static ts_status arguments(tl_ctx *t, const char *fn, const json_t *params, int *out) {
    const json_t *props = json_is_object(params) ? json_object_get(params, "properties") : NULL;
    if (!json_is_object(props)) {
        *out = any_arguments(t);
        return TS_OK;
    }
    tool_params tp;
    TS_TRY(tool_params_read(params, &tp));
    ts_status st = TS_OK;
    for (size_t i = 0; i < tp.n && st == TS_OK; i++)
        if (!name_ok(tp.keys[i], TL_KEY_MAX))
            st = ts_error(TS_ERR_INVALID,
                          "tool '%.100s': parameter '%.100s' cannot be a keyword argument of a "
                          "call in this model's tool format (a Python call)",
                          fn, tp.keys[i]);
    ts_gbuild *b = t->b;
    int f = ts_gbuild_rule(b), c = ts_gbuild_rule(b);
    ts_gbuild_alt(b, f);
    ts_gbuild_alt(b, c);
    for (size_t i = tp.n; st == TS_OK && i-- > 0;) {
        int arg = argument(t, tp.keys[i], tp.vals[i]);
        int f2 = ts_gbuild_rule(b), c2 = ts_gbuild_rule(b);
        int a = ts_gbuild_alt(b, f2);
        ts_gbuild_ref(b, a, arg);
        ts_gbuild_ref(b, a, c);
        a = ts_gbuild_alt(b, c2);
        ts_gbuild_ref(b, a, t->sep);
        ts_gbuild_ref(b, a, arg);
        ts_gbuild_ref(b, a, c);
        if (!tp.required[i]) {
            ts_gbuild_ref(b, ts_gbuild_alt(b, f2), f);
            ts_gbuild_ref(b, ts_gbuild_alt(b, c2), c);
        }
        f = f2, c = c2;
    }
    tool_params_free(&tp);
    *out = f;
    return st;
}

static void list_begin(tool_format *f, ts_gbuild *b) {
    tl_ctx *t = (tl_ctx *)f;
    t->b = b;
    t->any_value = -1;
    t->sep = f->sep = ts_gbuild_rule(b);
    ts_gbuild_literal(b, ts_gbuild_alt(b, t->sep), ",", 1);
    ts_gbuild_literal(b, ts_gbuild_alt(b, t->sep), ", ", 2);
}

static ts_status list_call(tool_format *f, ts_gbuild *b, int call, const char *nm,
                           const json_t *fn) {
    if (!name_ok(nm, SIZE_MAX))
        return ts_error(TS_ERR_INVALID,
                        "tool '%.100s': the name cannot be called in this model's tool format "
                        "(a Python call: letters, digits, '_', '-' and '.', not first a digit)",
                        nm);
    int args = -1;
    TS_TRY(arguments((tl_ctx *)f, nm, json_object_get(fn, "parameters"), &args));
    int a = ts_gbuild_alt(b, call);
    ts_gbuild_literal(b, a, nm, strlen(nm));
    ts_gbuild_literal(b, a, "(", 1);
    ts_gbuild_ref(b, a, args);
    ts_gbuild_literal(b, a, ")", 1);
    return TS_OK;
}

ts_status ts_grammar_tool_list(const char *tools_json, const char *only, bool parallel,
                               ts_grammar **out) {
    tl_ctx t = {.f = {.open = "[", .close = "]", .begin = list_begin, .call = list_call}};
    return tool_grammar_build(tools_json, only, parallel, &t.f, out);
}
