/* Tool calls written as a Python list of calls, [name(key=value, ...), ...]: the form
 * text/chat_gemma.c asks a model without a tool format of its own (Gemma 3) to reply in.
 * The values are Python literals (strings in either quotes with their escapes, numbers,
 * True / False / None, lists, tuples, dicts with string keys), read into JSON. */
#include "base/byte_piece.h"
#include "base/status.h"
#include "serve/toolcall.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PY_MAX_DEPTH 64

typedef struct {
    const char *p, *end;
} py_in;

static void ws(py_in *in) {
    while (in->p < in->end && (*in->p == ' ' || *in->p == '\n' || *in->p == '\t' || *in->p == '\r'))
        in->p++;
}

static bool eat(py_in *in, char c) {
    ws(in);
    if (in->p < in->end && *in->p == c) {
        in->p++;
        return true;
    }
    return false;
}

static bool ident_char(char c, bool first) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (!first && ((c >= '0' && c <= '9') || c == '-' || c == '.'));
}

/* An identifier (a function name may hold '-' and '.' as tool names do); its length, 0 none. */
static size_t ident(py_in *in) {
    ws(in);
    size_t n = 0;
    while (in->p + n < in->end && ident_char(in->p[n], n == 0))
        n++;
    return n;
}

static bool put_utf8(ts_strbuf *b, unsigned long cp) {
    char u[4];
    size_t n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return false;
    if (n == 1)
        u[0] = (char)cp;
    else if (n == 2)
        u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3F));
    else if (n == 3)
        u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | ((cp >> 6) & 0x3F)),
        u[2] = (char)(0x80 | (cp & 0x3F));
    else
        u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | ((cp >> 12) & 0x3F)),
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[3] = (char)(0x80 | (cp & 0x3F));
    return ts_strbuf_append(b, u, n) == TS_OK;
}

/* A quoted string (' or ", no triple quotes) with Python's escapes. */
static json_t *py_string(py_in *in) {
    char q = *in->p++;
    ts_strbuf b = {0};
    bool ok = ts_strbuf_append(&b, "", 0) == TS_OK;
    while (ok && in->p < in->end && *in->p != q) {
        char c = *in->p++;
        if (c == '\n')
            ok = false;
        else if (c != '\\')
            ok = ts_strbuf_append(&b, &c, 1) == TS_OK;
        else if (in->p == in->end)
            ok = false;
        else {
            char e = *in->p++;
            const char *simple = strchr("nrtbf0\\'\"", e);
            static const char out[] = "\n\r\t\b\f\0\\'\"";
            if (simple && e)
                ok = ts_strbuf_append(&b, &out[simple - "nrtbf0\\'\""], 1) == TS_OK;
            else if (e == 'x' || e == 'u' || e == 'U') {
                int len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
                unsigned long cp = 0;
                for (int k = 0; ok && k < len; k++) {
                    int h = in->p < in->end ? ts_hex_digit(*in->p++) : -1;
                    ok = h >= 0;
                    cp = cp * 16 + (unsigned long)(h < 0 ? 0 : h);
                }
                ok = ok && put_utf8(&b, cp);
            } else {
                ok = false;
            }
        }
    }
    ok = ok && in->p < in->end; /* the closing quote */
    if (ok) in->p++;
    json_t *v = ok ? json_stringn(b.data, b.len) : NULL; /* NULL for invalid UTF-8 too */
    ts_strbuf_free(&b);
    return v;
}

static json_t *py_number(py_in *in) {
    char buf[64];
    size_t n = 0;
    bool real = false;
    while (in->p + n < in->end && n < sizeof buf - 1 && strchr("+-0123456789.eE_", in->p[n]) &&
           in->p[n]) {
        real |= in->p[n] == '.' || in->p[n] == 'e' || in->p[n] == 'E';
        n++;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) /* Python allows 1_000 */
        if (in->p[i] != '_') buf[k++] = in->p[i];
    buf[k] = 0;
    char *end;
    json_t *v = NULL;
    if (real) {
        double d = strtod(buf, &end);
        if (k && *end == 0) v = json_real(d);
    } else {
        long long x = strtoll(buf, &end, 10);
        if (k && *end == 0) v = json_integer(x);
    }
    if (v) in->p += n;
    return v;
}

static json_t *py_value(py_in *in, int depth);

/* Items up to close, each a value ({key: value} pairs for a dict). */
static json_t *py_items(py_in *in, char close, bool dict, int depth) {
    json_t *c = dict ? json_object() : json_array();
    while (c && !eat(in, close)) {
        json_t *k = NULL, *v = NULL;
        if (dict) {
            ws(in);
            k = in->p < in->end && (*in->p == '"' || *in->p == '\'') ? py_string(in) : NULL;
            if (!k || !eat(in, ':')) {
                json_decref(k);
                json_decref(c);
                return NULL;
            }
        }
        v = py_value(in, depth + 1);
        bool ok = v && (dict ? json_object_set(c, json_string_value(k), v) == 0
                             : json_array_append(c, v) == 0);
        json_decref(k);
        json_decref(v);
        ws(in);
        if (!ok || (!eat(in, ',') && !(in->p < in->end && *in->p == close))) {
            json_decref(c);
            return NULL;
        }
    }
    return c;
}

static json_t *py_value(py_in *in, int depth) {
    ws(in);
    if (in->p == in->end || depth > PY_MAX_DEPTH) return NULL;
    char c = *in->p;
    if (c == '"' || c == '\'') return py_string(in);
    if (c == '[' || c == '(') {
        in->p++;
        return py_items(in, c == '[' ? ']' : ')', false, depth);
    }
    if (c == '{') {
        in->p++;
        return py_items(in, '}', true, depth);
    }
    static const struct {
        const char *word;
        size_t len;
    } words[] = {{"True", 4}, {"False", 5}, {"None", 4}};
    for (int k = 0; k < 3; k++)
        if ((size_t)(in->end - in->p) >= words[k].len &&
            !memcmp(in->p, words[k].word, words[k].len) &&
            (in->p + words[k].len == in->end || !ident_char(in->p[words[k].len], false))) {
            in->p += words[k].len;
            return k == 0 ? json_true() : k == 1 ? json_false() : json_null();
        }
    return py_number(in);
}

/* One call, name(key=value, ...), as {"name", "arguments": "<JSON object text>"}. */
static json_t *py_call(py_in *in) {
    size_t n = ident(in);
    if (!n) return NULL;
    json_t *name = json_stringn(in->p, n);
    in->p += n;
    json_t *args = json_object();
    bool ok = name && args && eat(in, '(');
    while (ok && !eat(in, ')')) {
        size_t k = ident(in);
        ok = k > 0;
        char key[256];
        if (ok) ok = k < sizeof key;
        if (ok) memcpy(key, in->p, k), key[k] = 0, in->p += k;
        ok = ok && eat(in, '=');
        json_t *v = ok ? py_value(in, 1) : NULL;
        ok = v && json_object_set_new(args, key, v) == 0;
        ws(in);
        ok = ok && (eat(in, ',') || (in->p < in->end && *in->p == ')'));
    }
    char *a = ok ? json_dumps(args, JSON_COMPACT) : NULL;
    json_t *call = a ? json_pack("{s:o, s:s}", "name", name, "arguments", a) : NULL;
    if (!call) json_decref(name);
    free(a);
    json_decref(args);
    return call;
}

bool serve_toolcall_parse_list(const char *s, size_t n, ts_strbuf *out) {
    py_in in = {s, s + n};
    ws(&in);
    /* a list in a code fence (```python, ```tool_code) is the same list */
    bool fenced = in.end - in.p >= 3 && !memcmp(in.p, "```", 3);
    if (fenced) {
        const char *nl = memchr(in.p, '\n', (size_t)(in.end - in.p));
        if (!nl) return false;
        in.p = nl + 1;
        while (in.end > in.p && strchr(" \n\t\r", in.end[-1]))
            in.end--;
        if (in.end - in.p < 3 || memcmp(in.end - 3, "```", 3) != 0) return false;
        in.end -= 3;
    }
    if (!eat(&in, '[')) return false;
    size_t start = out->len;
    int calls = 0;
    bool ok = true;
    while (ok && !eat(&in, ']')) {
        json_t *c = py_call(&in);
        char *t = c ? json_dumps(c, JSON_COMPACT) : NULL;
        json_decref(c);
        ok = t && ts_strbuf_append(out, t, strlen(t) + 1) == TS_OK; /* NUL-separated */
        free(t);
        calls += ok;
        ws(&in);
        ok = ok && (eat(&in, ',') || (in.p < in.end && *in.p == ']'));
    }
    ws(&in);
    if (!ok || calls == 0 || in.p != in.end) {
        out->len = start;
        return false;
    }
    return true;
}
