#include "serve/toolcall.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

static const char open_tag[] = "<tool_call>", close_tag[] = "</tool_call>";
#define OPEN_LEN  (sizeof open_tag - 1)
#define CLOSE_LEN (sizeof close_tag - 1)

static bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static size_t find(const char *s, size_t n, const char *pat) {
    size_t m = strlen(pat);
    for (size_t i = 0; i + m <= n; i++)
        if (memcmp(s + i, pat, m) == 0) return i;
    return (size_t)-1;
}

static bool starts(const char *s, size_t n, const char *pat) {
    size_t m = strlen(pat);
    return n >= m && memcmp(s, pat, m) == 0;
}

static void trim(const char **s, size_t *n) {
    while (*n && is_space(**s)) (*s)++, (*n)--;
    while (*n && is_space((*s)[*n - 1])) (*n)--;
}

/* "<TAG=" NAME ">" at s: the trimmed name and the length consumed; false when malformed. */
static bool tag_name(const char *s, size_t n, const char *tag, const char **name, size_t *len,
                     size_t *used) {
    size_t t = strlen(tag);
    if (!starts(s, n, tag)) return false;
    size_t i = t;
    while (i < n && s[i] != '>' && s[i] != '\n' && s[i] != '<') i++;
    if (i == n || s[i] != '>') return false;
    *name = s + t;
    *len = i - t;
    trim(name, len);
    *used = i + 1;
    /* a control character (a NUL of a byte token, say) makes no name: JSON would carry it as
     * an escape that many readers refuse */
    for (size_t k = 0; k < *len; k++)
        if ((unsigned char)(*name)[k] < 0x20 || (*name)[k] == 0x7f) return false;
    return *len > 0;
}

static bool json_str(ts_strbuf *b, const char *s, size_t n) {
    json_t *v = json_stringn(s, n); /* NULL for invalid UTF-8 */
    char *t = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    json_decref(v);
    bool ok = t && ts_strbuf_append(b, t, strlen(t)) == TS_OK;
    free(t);
    return ok;
}

/* One parameter value: kept as written when it is JSON, else a JSON string. */
static bool put_value(ts_strbuf *b, const char *v, size_t n) {
    if (n && v[0] == '\n') v++, n--;
    if (n && v[n - 1] == '\n') n--;
    const char *t = v;
    size_t tn = n;
    trim(&t, &tn);
    json_error_t err;
    json_t *j = tn ? json_loadb(t, tn, JSON_DECODE_ANY, &err) : NULL;
    if (j) {
        json_decref(j);
        return ts_strbuf_append(b, t, tn) == TS_OK;
    }
    return json_str(b, v, n);
}

/* Builds the arguments object's text; false when the body is malformed. */
static bool parse_body(const char *s, size_t n, ts_strbuf *args) {
    json_t *seen = json_object();
    bool ok = seen && ts_strbuf_append(args, "{", 1) == TS_OK;
    for (int k = 0; ok; k++) {
        while (n && is_space(*s)) s++, n--;
        if (starts(s, n, "</function>")) {
            s += 11, n -= 11;
            while (n && is_space(*s)) s++, n--;
            ok = n == 0 && ts_strbuf_append(args, "}", 1) == TS_OK;
            break;
        }
        const char *key;
        size_t klen, used;
        if (!tag_name(s, n, "<parameter=", &key, &klen, &used)) {
            ok = false;
            break;
        }
        s += used, n -= used;
        size_t end = find(s, n, "</parameter>");
        json_t *kv = json_stringn(key, klen);
        /* a repeated key would make the arguments ambiguous: the block stays content */
        ok = end != (size_t)-1 && kv && !json_object_get(seen, json_string_value(kv)) &&
             json_object_set(seen, json_string_value(kv), json_null()) == 0;
        json_decref(kv);
        if (ok && k > 0) ok = ts_strbuf_append(args, ",", 1) == TS_OK;
        ok = ok && json_str(args, key, klen) && ts_strbuf_append(args, ":", 1) == TS_OK &&
             put_value(args, s, end);
        if (ok) s += end + 12, n -= end + 12;
    }
    json_decref(seen);
    return ok;
}

bool serve_toolcall_parse(const char *block, size_t n, ts_strbuf *out) {
    const char *s = block;
    while (n && is_space(*s)) s++, n--;
    const char *name;
    size_t nlen, used;
    if (!tag_name(s, n, "<function=", &name, &nlen, &used)) return false;
    ts_strbuf args = {0};
    bool ok = parse_body(s + used, n - used, &args);
    json_t *nm = ok ? json_stringn(name, nlen) : NULL;
    json_t *call = nm ? json_pack("{s:o, s:s%}", "name", nm, "arguments", args.data, args.len)
                      : NULL;
    char *t = call ? json_dumps(call, JSON_COMPACT) : NULL;
    ok = t && ts_strbuf_append(out, t, strlen(t)) == TS_OK;
    free(t);
    json_decref(call);
    ts_strbuf_free(&args);
    return ok;
}

/* ---- the streaming filter ---------------------------------------------------------------- */

void serve_toolcall_filter_init(serve_toolcall_filter *f, bool list_form, serve_toolcall_sink sink,
                                void *ctx) {
    memset(f, 0, sizeof *f);
    f->list_form = list_form;
    f->sink = sink;
    f->ctx = ctx;
}

void serve_toolcall_filter_free(serve_toolcall_filter *f) {
    ts_strbuf_free(&f->held);
    ts_strbuf_free(&f->scratch);
    ts_strbuf_free(&f->sep);
}

static void drop_front(ts_strbuf *b, size_t n) {
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
}

/* The length of the longest suffix of s[0, n) that is a proper prefix of the open tag. */
static size_t partial_open(const char *s, size_t n) {
    for (size_t k = OPEN_LEN - 1; k > 0; k--)
        if (k <= n && memcmp(s + n - k, open_tag, k) == 0) return k;
    return 0;
}

static ts_status content(serve_toolcall_filter *f, const char *s, size_t n) {
    return n ? f->sink(f->ctx, false, s, n) : TS_OK;
}

static ts_status close_call(serve_toolcall_filter *f, size_t end) {
    ts_strbuf *sc = &f->scratch;
    sc->len = 0;
    ts_status st;
    if (serve_toolcall_parse(f->held.data, end, sc)) {
        f->n_calls++;
        st = f->sink(f->ctx, true, sc->data, sc->len);
    } else { /* malformed: the client sees what the model wrote */
        st = content(f, f->sep.data, f->sep.len);
        if (st == TS_OK) st = content(f, open_tag, OPEN_LEN);
        if (st == TS_OK) st = content(f, f->held.data, end + CLOSE_LEN);
    }
    f->sep.len = 0;
    drop_front(&f->held, end + CLOSE_LEN);
    f->in_call = false;
    return st;
}

/* The list form: held whole while it may be a list of calls, else streamed. */
static ts_status push_list(serve_toolcall_filter *f, const char *s, size_t n) {
    if (f->decided) return content(f, s, n);
    TS_TRY(ts_strbuf_append(&f->held, s, n));
    size_t i = 0;
    while (i < f->held.len && is_space(f->held.data[i]))
        i++;
    if (i == f->held.len || f->held.data[i] == '[' || f->held.data[i] == '`') return TS_OK;
    f->decided = true;
    ts_status st = content(f, f->held.data, f->held.len);
    f->held.len = 0;
    return st;
}

/* The list form at the end: the calls, or the text as it was. */
static ts_status finish_list(serve_toolcall_filter *f) {
    ts_strbuf *sc = &f->scratch;
    sc->len = 0;
    ts_status st = TS_OK;
    if (!f->decided && f->held.len && serve_toolcall_parse_list(f->held.data, f->held.len, sc)) {
        for (size_t at = 0; st == TS_OK && at < sc->len; at += strlen(sc->data + at) + 1) {
            f->n_calls++;
            st = f->sink(f->ctx, true, sc->data + at, strlen(sc->data + at));
        }
    } else {
        st = content(f, f->held.data, f->held.len);
    }
    f->held.len = 0;
    return st;
}

ts_status serve_toolcall_filter_push(serve_toolcall_filter *f, const char *s, size_t n) {
    if (f->list_form) return push_list(f, s, n);
    TS_TRY(ts_strbuf_append(&f->held, s, n));
    for (;;) {
        char *h = f->held.data;
        size_t len = f->held.len;
        if (f->in_call) {
            size_t end = find(h, len, close_tag);
            if (end == (size_t)-1) return TS_OK;
            TS_TRY(close_call(f, end));
            continue;
        }
        size_t at = find(h, len, open_tag);
        if (at != (size_t)-1) {
            size_t keep = at;
            while (keep && is_space(h[keep - 1])) keep--; /* the separator in front of a call */
            TS_TRY(content(f, h, keep));
            f->sep.len = 0;
            TS_TRY(ts_strbuf_append(&f->sep, h + keep, at - keep));
            drop_front(&f->held, at + OPEN_LEN);
            f->in_call = true;
            continue;
        }
        /* hold a possible start of the tag and the whitespace in front of it */
        size_t end = len - partial_open(h, len);
        while (end && is_space(h[end - 1])) end--;
        TS_TRY(content(f, h, end));
        drop_front(&f->held, end);
        return TS_OK;
    }
}

ts_status serve_toolcall_filter_finish(serve_toolcall_filter *f) {
    if (f->list_form) return finish_list(f);
    ts_status st = TS_OK;
    if (f->in_call) st = content(f, f->sep.data, f->sep.len);
    if (st == TS_OK && f->in_call) st = content(f, open_tag, OPEN_LEN);
    if (st == TS_OK) st = content(f, f->held.data, f->held.len);
    f->held.len = 0, f->sep.len = 0;
    f->in_call = false;
    return st;
}
