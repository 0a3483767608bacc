/* The grammar of an answer that is tool calls, in the Qwen3.5 chat format (tool_choice
 * "required" or a named function):
 *
 *   <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>
 *
 * exactly as the template renders a call back (chat.c, put_tool_call) and serve/toolcall.c
 * parses it. NAME is one of the offered functions; its parameters come in the order of its
 * schema's `properties`, the required ones always, the others or not (a function without
 * `properties` takes any keys). A VALUE is written as the template writes it: a parameter whose
 * schema asks for a number, an integer, a boolean, null, an array or an object is that JSON value
 * (its schema compiled as for response_format), a string enum one of its values, any other
 * is free text up to the "\n</parameter>" that ends it - as is a typed one whose schema the
 * compiler does not take (tools often carry keywords like `pattern`: the call is still constrained,
 * only that value is not). Several calls, when allowed, follow each other separated by a newline,
 * as the template renders them. */
#include "base/status.h"
#include "text/grammar.h"
#include "text/json_schema.h"
#include "text/tool_grammar_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define TG_END_VALUE "\n</parameter>"

/* Free text up to and including the first "\n</parameter>": the states of a string matcher
 * (Knuth-Morris-Pratt) over that terminator, a rule each: R_k = "k bytes of the terminator
 * are matched; the rest of the value and the terminator follow". Returns R_0. */
static int free_value(ts_gbuild *b) {
    const char *t = TG_END_VALUE;
    int n = (int)strlen(t), fail[32], r[32];
    fail[0] = -1;
    for (int k = 1; k <= n; k++) { /* fail[k]: the longest proper border of t[0, k) */
        int f = fail[k - 1];
        while (f >= 0 && t[f] != t[k - 1])
            f = fail[f];
        fail[k] = f + 1;
    }
    for (int k = 0; k < n; k++)
        r[k] = ts_gbuild_rule(b);
    for (int k = 0; k < n; k++) {
        int a = ts_gbuild_alt(b, r[k]); /* the terminator goes on */
        ts_gbuild_literal(b, a, t + k, 1);
        if (k + 1 < n) ts_gbuild_ref(b, a, r[k + 1]);
        /* any other byte: the state the matcher falls back to, bytes grouped by it */
        uint64_t to[32][4];
        memset(to, 0, sizeof to);
        for (int c = 0; c < 256; c++) {
            if (c == (unsigned char)t[k]) continue;
            int s = k;
            while (s > 0 && (unsigned char)t[s] != c)
                s = fail[s];
            if ((unsigned char)t[s] == c) s++;
            to[s][c >> 6] |= 1ull << (c & 63);
        }
        for (int s = 0; s < n; s++)
            if (to[s][0] | to[s][1] | to[s][2] | to[s][3]) {
                a = ts_gbuild_alt(b, r[k]);
                ts_gbuild_set(b, a, to[s]);
                ts_gbuild_ref(b, a, r[s]);
            }
    }
    return r[0];
}

/* Whether a parameter's value is a JSON text rather than free text: the template writes
 * strings raw and everything else as JSON. */
static bool typed_value(const json_t *schema) {
    const json_t *t = json_is_object(schema) ? json_object_get(schema, "type") : NULL;
    if (!json_is_string(t)) return false; /* no type, a list of types, a string type */
    return strcmp(json_string_value(t), "string") != 0;
}

/* A string enum's values, raw as the template writes strings: true when schema is one and its
 * alternatives went into rule r. */
static bool raw_enum(ts_gbuild *b, const json_t *schema, int r) {
    const json_t *e = json_is_object(schema) ? json_object_get(schema, "enum") : NULL;
    if (!json_is_array(e) || json_array_size(e) == 0) return false;
    size_t i;
    const json_t *v;
    json_array_foreach(e, i, v) if (!json_is_string(v)) return false;
    json_array_foreach(e, i, v) {
        int a = ts_gbuild_alt(b, r);
        ts_gbuild_literal(b, a, json_string_value(v), json_string_length(v));
        ts_gbuild_literal(b, a, TG_END_VALUE, strlen(TG_END_VALUE));
    }
    return true;
}

/* The JSON value of a typed parameter and the terminator, in rule r; false (r untouched) when
 * the schema compiler does not take the schema - tried alone first, so that a refusal leaves
 * b as it was. */
static bool json_value(ts_gbuild *b, const json_t *schema, int r) {
    char *text = json_dumps(schema, JSON_COMPACT);
    ts_grammar *probe = NULL;
    bool ok = text && ts_grammar_from_json_schema(text, strlen(text), &probe) == TS_OK;
    ts_grammar_free(probe);
    int value = -1;
    ok = ok && ts_json_schema_rule(b, text, strlen(text), false, &value) == TS_OK;
    free(text);
    if (!ok) return false; /* out of memory here also fails ts_gbuild_finish */
    int a = ts_gbuild_alt(b, r);
    ts_gbuild_ref(b, a, value);
    ts_gbuild_literal(b, a, TG_END_VALUE, strlen(TG_END_VALUE));
    return true;
}

/* The rule of one parameter: "<parameter=KEY>\n" VALUE "\n</parameter>\n". */
static int parameter(ts_gbuild *b, const char *key, const json_t *schema, int free_text) {
    int value = ts_gbuild_rule(b);
    if (!raw_enum(b, schema, value) && !(typed_value(schema) && json_value(b, schema, value)))
        ts_gbuild_ref(b, ts_gbuild_alt(b, value), free_text);
    int r = ts_gbuild_rule(b), a = ts_gbuild_alt(b, r);
    ts_gbuild_literal(b, a, "<parameter=", 11);
    ts_gbuild_literal(b, a, key, strlen(key));
    ts_gbuild_literal(b, a, ">\n", 2);
    ts_gbuild_ref(b, a, value);
    ts_gbuild_literal(b, a, "\n", 1);
    return r;
}

/* A function's parameters: its properties in order, the required ones always; any keys when
 * it declares none. */
static ts_status parameters(ts_gbuild *b, const json_t *params, int free_text, int *out) {
    const json_t *props = json_is_object(params) ? json_object_get(params, "properties") : NULL;
    if (!json_is_object(props)) { /* any keys: [^<>\n]+ */
        int any = ts_gbuild_rule(b), key = ts_gbuild_rule(b), more = ts_gbuild_rule(b);
        uint64_t kc[4] = {~0ull, ~0ull, ~0ull, ~0ull};
        kc['<' >> 6] &= ~(1ull << ('<' & 63));
        kc['>' >> 6] &= ~(1ull << ('>' & 63));
        kc['\n' >> 6] &= ~(1ull << ('\n' & 63));
        int a = ts_gbuild_alt(b, key);
        ts_gbuild_set(b, a, kc);
        ts_gbuild_ref(b, a, more);
        ts_gbuild_alt(b, more);
        ts_gbuild_ref(b, ts_gbuild_alt(b, more), key);
        ts_gbuild_alt(b, any);
        a = ts_gbuild_alt(b, any);
        ts_gbuild_literal(b, a, "<parameter=", 11);
        ts_gbuild_ref(b, a, key);
        ts_gbuild_literal(b, a, ">\n", 2);
        ts_gbuild_ref(b, a, free_text);
        ts_gbuild_literal(b, a, "\n", 1);
        ts_gbuild_ref(b, a, any);
        *out = any;
        return TS_OK;
    }
    /* P_i ::= param_i P_{i+1} | P_{i+1} (when optional); P_n ::= "" */
    tool_params tp;
    TS_TRY(tool_params_read(params, &tp));
    int next = ts_gbuild_rule(b);
    ts_gbuild_alt(b, next);
    for (size_t i = tp.n; i-- > 0;) {
        int p = ts_gbuild_rule(b), a = ts_gbuild_alt(b, p);
        ts_gbuild_ref(b, a, parameter(b, tp.keys[i], tp.vals[i], free_text));
        ts_gbuild_ref(b, a, next);
        if (!tp.required[i]) ts_gbuild_ref(b, ts_gbuild_alt(b, p), next);
        next = p;
    }
    tool_params_free(&tp);
    *out = next;
    return TS_OK;
}

ts_status tool_params_read(const json_t *params, tool_params *p) {
    const json_t *props = json_object_get(params, "properties");
    const json_t *req = json_object_get(params, "required");
    size_t n = json_object_size(props), at = 0;
    *p = (tool_params){.n = n,
                       .keys = malloc((n ? n : 1) * sizeof *p->keys),
                       .vals = malloc((n ? n : 1) * sizeof *p->vals),
                       .required = calloc(n ? n : 1, sizeof *p->required)};
    if (!p->keys || !p->vals || !p->required) {
        tool_params_free(p);
        return ts_error(TS_ERR_NOMEM, "out of memory for a tool grammar");
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)props, k, v) {
        for (size_t q = 0; json_is_array(req) && q < json_array_size(req); q++) {
            const json_t *e = json_array_get(req, q);
            p->required[at] |= json_is_string(e) && strcmp(json_string_value(e), k) == 0;
        }
        p->keys[at] = k, p->vals[at++] = v;
    }
    return TS_OK;
}

void tool_params_free(tool_params *p) {
    free(p->keys), free(p->vals), free(p->required);
    *p = (tool_params){0};
}

#define TG_LEAD_WS 8 /* [ \t\n]{0,8} before the first call (newlines after </think>) */

ts_status tool_grammar_build(const char *tools_json, const char *only, bool parallel,
                             tool_format *f, ts_grammar **out) {
    *out = NULL;
    json_error_t err;
    json_t *tools = json_loads(tools_json, 0, &err);
    if (!json_is_array(tools)) {
        json_decref(tools);
        return ts_error(TS_ERR_INVALID, "tools: not a JSON array");
    }
    ts_gbuild *b;
    ts_status st = ts_gbuild_create(&b);
    if (st != TS_OK) {
        json_decref(tools);
        return st;
    }
    f->begin(f, b);
    int call = ts_gbuild_rule(b), n_fn = 0;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *fn = json_object_get(t, "function");
        const json_t *name = json_object_get(fn, "name");
        if (!json_is_string(name)) continue;
        const char *nm = json_string_value(name);
        if (only && strcmp(only, nm) != 0) continue;
        if ((st = f->call(f, b, call, nm, fn)) != TS_OK) break;
        n_fn++;
    }
    json_decref(tools);
    if (st == TS_OK && n_fn == 0)
        st = only ? ts_error(TS_ERR_INVALID, "no tool named '%.100s'", only)
                  : ts_error(TS_ERR_INVALID, "no function among the tools");
    if (st == TS_OK) {
        int root = ts_gbuild_rule(b), a = ts_gbuild_alt(b, root);
        uint64_t ws[4] = {(1ull << ' ') | (1ull << '\t') | (1ull << '\n'), 0, 0, 0};
        ts_gbuild_ref(b, a, ts_gbuild_set_chain(b, ws, TG_LEAD_WS, true, NULL));
        if (*f->open) ts_gbuild_literal(b, a, f->open, strlen(f->open));
        ts_gbuild_ref(b, a, call);
        if (parallel) {
            int more = ts_gbuild_rule(b);
            ts_gbuild_alt(b, more);
            int m = ts_gbuild_alt(b, more);
            ts_gbuild_ref(b, m, f->sep);
            ts_gbuild_ref(b, m, call);
            ts_gbuild_ref(b, m, more);
            ts_gbuild_ref(b, a, more);
        }
        if (*f->close) ts_gbuild_literal(b, a, f->close, strlen(f->close));
        st = ts_gbuild_finish(b, root, out);
    }
    ts_gbuild_free(b);
    return st;
}

/* Qwen3.5's blocks: free text's matcher shared by the parameters, calls one a line. */
typedef struct {
    tool_format f;
    int free_text;
} qwen_format;

static void qwen_begin(tool_format *f, ts_gbuild *b) {
    qwen_format *q = (qwen_format *)f;
    q->free_text = free_value(b);
    f->sep = ts_gbuild_rule(b);
    ts_gbuild_literal(b, ts_gbuild_alt(b, f->sep), "\n", 1);
}

static ts_status qwen_call(tool_format *f, ts_gbuild *b, int call, const char *nm,
                           const json_t *fn) {
    int params = -1;
    TS_TRY(
        parameters(b, json_object_get(fn, "parameters"), ((qwen_format *)f)->free_text, &params));
    int a = ts_gbuild_alt(b, call);
    ts_gbuild_literal(b, a, "<tool_call>\n<function=", 22);
    ts_gbuild_literal(b, a, nm, strlen(nm));
    ts_gbuild_literal(b, a, ">\n", 2);
    ts_gbuild_ref(b, a, params);
    ts_gbuild_literal(b, a, "</function>\n</tool_call>", 24);
    return TS_OK;
}

ts_status ts_grammar_tool_calls(const char *tools_json, const char *only, bool parallel,
                                ts_grammar **out) {
    qwen_format q = {.f = {.open = "", .close = "", .begin = qwen_begin, .call = qwen_call}};
    return tool_grammar_build(tools_json, only, parallel, &q.f, out);
}
