/* JSON text as grammar rules (constrained decoding; the builder is text/grammar.h): the builder
 * shorthands, the rules every schema shares (whitespace, strings, numbers, booleans, any value)
 * and the layouts of objects, arrays and strings. This file knows JSON's syntax but not JSON
 * Schema's keywords: json_schema.c reads the keywords and calls these to write the rules;
 * json_schema_int.h holds the context and declarations the two share.
 *
 * Layout of the generated text: up to 8 whitespace bytes before the value, and nothing after
 * it (the generation stops right after the value). Between tokens inside a value the text may
 * hold `ws ::= "" | " " | "\n" [ \t]{0,20}`, enough for compact and pretty-printed JSON but
 * bounded, so a model cannot loop on whitespace forever. Numbers are bounded the same way.
 *
 * Shape of the rules. The matcher (grammar.c) keeps one stack per live alternative and does
 * tail calls, so repetition is right recursion ending in a reference (`rep ::= "" | item rep`),
 * every construct that has a continuation takes it as its last element (the object and array
 * rules end with the rule for "what may follow"), and the rules every schema needs (ws, string,
 * number, any value, ...) exist once per grammar, made on first use. */
#include "text/json_schema_int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JS_LEAD_WS 8  /* [ \t\n]{0,8} before the value */
#define JS_INDENT  20 /* "\n" [ \t]{0,20} between tokens */

/* ---- builder shorthands ------------------------------------------------------------------ */

int js_rule(js_ctx *c) { return ts_gbuild_rule(c->b); }
int js_alt(js_ctx *c, int rule) { return ts_gbuild_alt(c->b, rule); }
void js_ref(js_ctx *c, int alt, int rule) { ts_gbuild_ref(c->b, alt, rule); }
void js_lit(js_ctx *c, int alt, const char *s) { ts_gbuild_literal(c->b, alt, s, strlen(s)); }
static void js_range(js_ctx *c, int alt, int lo, int hi) {
    ts_gbuild_range(c->b, alt, (uint8_t)lo, (uint8_t)hi);
}

static void js_set_add(uint64_t set[4], int lo, int hi) {
    for (int i = lo; i <= hi; i++)
        set[i / 64] |= (uint64_t)1 << (i % 64);
}

/* An alternative that matches nothing (one byte out of the empty set): what a rule gets when
 * its schema allows no value, since the builder wants every rule to have an alternative. */
void js_never(js_ctx *c, int rule) {
    const uint64_t none[4] = {0, 0, 0, 0};
    ts_gbuild_set(c->b, js_alt(c, rule), none);
}

const char *js_word(const js_ctx *c, const char *json_word) {
    if (!c->python) return json_word;
    return !strcmp(json_word, "true") ? "True" : !strcmp(json_word, "false") ? "False" : "None";
}

/* Rules for set{0,k}: ids[j] ::= "" | set ids[j-1], ids[0] ::= "". Returns ids[k]. */
static int js_chain(js_ctx *c, const uint64_t set[4], int k, int *ids) {
    return ts_gbuild_set_chain(c->b, set, k, true, ids);
}

/* ---- shared rules ------------------------------------------------------------------------ */

/* ws ::= "" | " " | "\n" [ \t]{0,20} */
static int js_ws(js_ctx *c) {
    if (c->r_ws >= 0) return c->r_ws;
    uint64_t blank[4] = {0};
    js_set_add(blank, ' ', ' ');
    js_set_add(blank, '\t', '\t');
    int indent = js_chain(c, blank, JS_INDENT, NULL);
    int r = c->r_ws = js_rule(c);
    js_alt(c, r);
    js_lit(c, js_alt(c, r), " ");
    int a = js_alt(c, r);
    js_lit(c, a, "\n");
    js_ref(c, a, indent);
    return r;
}

/* [ \t\n]{0,8}: before the value, e.g. the newline a model writes after a reasoning block. */
int js_lead(js_ctx *c) {
    if (c->r_lead >= 0) return c->r_lead;
    uint64_t blank[4] = {0};
    js_set_add(blank, ' ', ' ');
    js_set_add(blank, '\t', '\t');
    js_set_add(blank, '\n', '\n');
    return c->r_lead = js_chain(c, blank, JS_LEAD_WS, NULL);
}

/* One character of a string: a UTF-8 encoded code point other than '"', '\' and U+0000-U+001F,
 * or an escape. UTF-8 validity is exact (no overlong forms, surrogates or code points above
 * U+10FFFF). The matcher keeps a stack per live alternative, so the single-byte characters
 * are one byte set rather than one alternative each. */
static int js_char(js_ctx *c) {
    if (c->r_char >= 0) return c->r_char;
    /* esc ::= ["\\/bfnrt] | "u" hex hex hex hex. Python reads "\/" as two characters and
     * "\ud83d\ude00" as two lone surrogates (which the list form's reader refuses): there,
     * esc ::= ["\\bfnrt] | "u" a hex value outside U+D800-U+DFFF. */
    int esc = c->r_esc = js_rule(c);
    uint64_t simple[4] = {0};
    for (const char *p = c->python ? "\"\\bfnrt" : "\"\\/bfnrt"; *p; p++)
        js_set_add(simple, (unsigned char)*p, (unsigned char)*p);
    ts_gbuild_set(c->b, js_alt(c, esc), simple);
    uint64_t hex[4] = {0};
    js_set_add(hex, '0', '9');
    js_set_add(hex, 'a', 'f');
    js_set_add(hex, 'A', 'F');
    int a = js_alt(c, esc);
    js_lit(c, a, "u");
    if (c->python) { /* [0-9a-cA-Ce-fE-F] hex hex hex | [dD] [0-7] hex hex */
        uint64_t lead[4] = {0}, d[4] = {0}, low[4] = {0};
        js_set_add(lead, '0', '9');
        js_set_add(lead, 'a', 'c');
        js_set_add(lead, 'A', 'C');
        js_set_add(lead, 'e', 'f');
        js_set_add(lead, 'E', 'F');
        js_set_add(d, 'd', 'd');
        js_set_add(d, 'D', 'D');
        js_set_add(low, '0', '7');
        ts_gbuild_set(c->b, a, lead);
        for (int i = 0; i < 3; i++)
            ts_gbuild_set(c->b, a, hex);
        a = js_alt(c, esc);
        js_lit(c, a, "u");
        ts_gbuild_set(c->b, a, d);
        ts_gbuild_set(c->b, a, low);
        ts_gbuild_set(c->b, a, hex);
        ts_gbuild_set(c->b, a, hex);
    } else {
        for (int i = 0; i < 4; i++)
            ts_gbuild_set(c->b, a, hex);
    }

    int r = c->r_char = js_rule(c);
    uint64_t ascii[4] = {0};
    js_set_add(ascii, 0x20, 0x21);
    js_set_add(ascii, 0x23, 0x5b);
    js_set_add(ascii, 0x5d, 0x7f);
    ts_gbuild_set(c->b, js_alt(c, r), ascii);
    a = js_alt(c, r); /* "\" esc */
    js_lit(c, a, "\\");
    js_ref(c, a, esc);
    a = js_alt(c, r); /* U+0080-U+07FF */
    js_range(c, a, 0xc2, 0xdf);
    js_range(c, a, 0x80, 0xbf);
    a = js_alt(c, r); /* U+0800-U+0FFF */
    js_range(c, a, 0xe0, 0xe0);
    js_range(c, a, 0xa0, 0xbf);
    js_range(c, a, 0x80, 0xbf);
    a = js_alt(c, r); /* U+1000-U+CFFF, U+E000-U+FFFF */
    uint64_t e3[4] = {0};
    js_set_add(e3, 0xe1, 0xec);
    js_set_add(e3, 0xee, 0xef);
    ts_gbuild_set(c->b, a, e3);
    js_range(c, a, 0x80, 0xbf);
    js_range(c, a, 0x80, 0xbf);
    a = js_alt(c, r); /* U+D000-U+D7FF (not the surrogates) */
    js_range(c, a, 0xed, 0xed);
    js_range(c, a, 0x80, 0x9f);
    js_range(c, a, 0x80, 0xbf);
    a = js_alt(c, r); /* U+10000-U+3FFFF */
    js_range(c, a, 0xf0, 0xf0);
    js_range(c, a, 0x90, 0xbf);
    js_range(c, a, 0x80, 0xbf);
    js_range(c, a, 0x80, 0xbf);
    a = js_alt(c, r); /* U+40000-U+FFFFF */
    js_range(c, a, 0xf1, 0xf3);
    js_range(c, a, 0x80, 0xbf);
    js_range(c, a, 0x80, 0xbf);
    js_range(c, a, 0x80, 0xbf);
    a = js_alt(c, r); /* U+100000-U+10FFFF */
    js_range(c, a, 0xf4, 0xf4);
    js_range(c, a, 0x80, 0x8f);
    js_range(c, a, 0x80, 0xbf);
    js_range(c, a, 0x80, 0xbf);
    return r;
}

/* strtail ::= '"' | char strtail: the rest of a string of any length. */
static int js_strtail(js_ctx *c) {
    if (c->r_strtail >= 0) return c->r_strtail;
    int ch = js_char(c);
    int r = c->r_strtail = js_rule(c);
    js_lit(c, js_alt(c, r), "\"");
    int a = js_alt(c, r);
    js_ref(c, a, ch);
    js_ref(c, a, r);
    return r;
}

/* The rest of a string of at most k more characters: T_k ::= '"' | char T_{k-1}, T_0 ::= '"'.
 * The chain depends on k only, so all bounded strings share one, grown to the largest k. */
static ts_status js_strtail_n(js_ctx *c, int k, int *rule) {
    if (k >= c->cap_strtail_n) {
        int cap = c->cap_strtail_n ? c->cap_strtail_n : 64;
        while (cap <= k)
            cap *= 2;
        int *p = realloc(c->strtail_n, (size_t)cap * sizeof *p);
        if (!p) return ts_error(TS_ERR_NOMEM, "JSON Schema: out of memory");
        c->strtail_n = p;
        c->cap_strtail_n = cap;
    }
    int ch = js_char(c);
    for (int j = c->n_strtail_n; j <= k; j++) {
        int r = c->strtail_n[j] = js_rule(c);
        js_lit(c, js_alt(c, r), "\"");
        if (j > 0) {
            int a = js_alt(c, r);
            js_ref(c, a, ch);
            js_ref(c, a, c->strtail_n[j - 1]);
        }
    }
    if (k >= c->n_strtail_n) c->n_strtail_n = k + 1;
    *rule = c->strtail_n[k];
    return TS_OK;
}

int js_string_any(js_ctx *c) {
    if (c->r_string >= 0) return c->r_string;
    int tail = js_strtail(c);
    int r = c->r_string = js_rule(c);
    int a = js_alt(c, r);
    js_lit(c, a, "\"");
    js_ref(c, a, tail);
    return r;
}

/* digits[k] ::= [0-9]{0,k} */
static int js_digits(js_ctx *c, int k) {
    if (c->digits[0] < 0) {
        uint64_t d[4] = {0};
        js_set_add(d, '0', '9');
        js_chain(c, d, JS_DIGIT_CHAIN, c->digits);
    }
    return c->digits[k];
}

/* integer ::= -?(0|[1-9][0-9]{0,15}) */
int js_integer(js_ctx *c) {
    if (c->r_integer >= 0) return c->r_integer;
    int more = js_digits(c, JS_INT_DIGITS - 1);
    int r = c->r_integer = js_rule(c);
    for (int neg = 0; neg < 2; neg++) {
        int a = js_alt(c, r);
        js_lit(c, a, neg ? "-0" : "0");
        a = js_alt(c, r);
        if (neg) js_lit(c, a, "-");
        js_range(c, a, '1', '9');
        js_ref(c, a, more);
    }
    return r;
}

/* ---- bounded integers -------------------------------------------------------------------- */

/* exact[k] ::= [0-9]{k}: exact[k] ::= [0-9] exact[k-1], exact[0] ::= "". Shared by every
 * bounded integer, since the free digits after the first differing one are all alike. */
static int js_exact(js_ctx *c, int k) {
    if (c->exact[0] < 0) {
        uint64_t d[4] = {0};
        js_set_add(d, '0', '9');
        ts_gbuild_set_chain(c->b, d, JS_INT_DIGITS - 1, false, c->exact);
    }
    return c->exact[k];
}

static bool js_all(const char *s, int n, char ch) {
    for (int i = 0; i < n; i++)
        if (s[i] != ch) return false;
    return true;
}

static void js_span(js_ctx *c, int into, const char *x, const char *y, int n);

static int js_span_rule(js_ctx *c, const char *x, const char *y, int n) {
    int r = js_rule(c);
    js_span(c, r, x, y, n);
    return r;
}

/* Adds to `into` the n-digit strings from x to y (x <= y; for strings of one length the text
 * order is the numeric one): the common prefix, then at the first differing digit x's digit
 * followed by x's rest up to 9...9, the digits in between followed by any n-p-1 digits, and
 * y's digit followed by 0...0 up to y's rest. A rest of all 0s (x) or all 9s (y) would cover
 * every string after its digit, so that digit joins the middle range instead, which keeps
 * e.g. 100..999 one alternative, [1-9][0-9][0-9]. */
static void js_span(js_ctx *c, int into, const char *x, const char *y, int n) {
    int p = 0;
    while (p < n && x[p] == y[p])
        p++;
    if (p == n) {
        ts_gbuild_literal(c->b, js_alt(c, into), x, (size_t)n);
        return;
    }
    int r = into;
    if (p > 0) { /* one alternative through the prefix, splitting after it */
        int a = js_alt(c, into);
        ts_gbuild_literal(c->b, a, x, (size_t)p);
        r = js_rule(c);
        js_ref(c, a, r);
    }
    int m = n - p - 1;
    const char *xs = x + p + 1, *ys = y + p + 1;
    char nines[JS_INT_DIGITS + 1], zeros[JS_INT_DIGITS + 1];
    memset(nines, '9', sizeof nines); /* only the first m are read */
    memset(zeros, '0', sizeof zeros);
    bool x_low = js_all(xs, m, '0'), y_high = js_all(ys, m, '9');
    int from = x[p] + !x_low, to = y[p] - !y_high;
    if (!x_low) {
        int a = js_alt(c, r);
        js_range(c, a, x[p], x[p]);
        js_ref(c, a, js_span_rule(c, xs, nines, m));
    }
    if (from <= to) {
        int a = js_alt(c, r);
        js_range(c, a, from, to);
        if (m > 0) js_ref(c, a, js_exact(c, m));
    }
    if (!y_high) {
        int a = js_alt(c, r);
        js_range(c, a, y[p], y[p]);
        js_ref(c, a, js_span_rule(c, zeros, ys, m));
    }
}

static int js_ndigits(unsigned long long v) {
    int n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

/* Adds to `into` the magnitudes a..b (a <= b <= JS_INT_MAX) written without leading zeros: one
 * span per digit count, since only strings of one length compare as text. */
static void js_magnitudes(js_ctx *c, int into, unsigned long long a, unsigned long long b) {
    unsigned long long first = 1; /* 10^(L-1) */
    for (int len = 1; len <= js_ndigits(b); len++, first *= 10) {
        unsigned long long lo = len == 1 ? 0 : first, hi = first * 10 - 1;
        if (lo < a) lo = a;
        if (hi > b) hi = b;
        if (lo > hi) continue;
        char x[24], y[24];
        snprintf(x, sizeof x, "%llu", lo);
        snprintf(y, sizeof y, "%llu", hi);
        js_span(c, into, x, y, len);
    }
}

/* The canonical integers from lo to hi: no leading zeros, no "-0", no fraction or exponent. The
 * negative ones are "-" then the magnitudes max(1, -hi)..-lo; the others the magnitudes
 * max(0, lo)..hi. Negated in unsigned arithmetic, which cannot overflow. */
int js_integer_range(js_ctx *c, long long lo, long long hi) {
    int r = js_rule(c);
    if (lo < 0) {
        unsigned long long a = hi < 0 ? 0ULL - (unsigned long long)hi : 1;
        int mag = js_rule(c);
        js_magnitudes(c, mag, a, 0ULL - (unsigned long long)lo);
        int alt = js_alt(c, r);
        js_lit(c, alt, "-");
        js_ref(c, alt, mag);
    }
    if (hi >= 0) js_magnitudes(c, r, lo > 0 ? (unsigned long long)lo : 0, (unsigned long long)hi);
    return r;
}

/* number ::= integer frac exp; frac ::= "" | "." [0-9]{1,16}; exp ::= "" | [eE] [-+]? [0-9]{1,2} */
int js_number(js_ctx *c) {
    if (c->r_number >= 0) return c->r_number;
    int in = js_integer(c);
    int frac = js_rule(c);
    js_alt(c, frac);
    int a = js_alt(c, frac);
    js_lit(c, a, ".");
    js_range(c, a, '0', '9');
    js_ref(c, a, js_digits(c, JS_FRAC_DIGITS - 1));
    int exp = js_rule(c);
    js_alt(c, exp);
    uint64_t e[4] = {0}, sign[4] = {0};
    js_set_add(e, 'e', 'e');
    js_set_add(e, 'E', 'E');
    js_set_add(sign, '-', '-');
    js_set_add(sign, '+', '+');
    for (int s = 0; s < 2; s++) {
        a = js_alt(c, exp);
        ts_gbuild_set(c->b, a, e);
        if (s) ts_gbuild_set(c->b, a, sign);
        js_range(c, a, '0', '9');
        js_ref(c, a, js_digits(c, JS_EXP_DIGITS - 1));
    }
    int r = c->r_number = js_rule(c);
    a = js_alt(c, r);
    js_ref(c, a, in);
    js_ref(c, a, frac);
    js_ref(c, a, exp);
    return r;
}

int js_bool(js_ctx *c) {
    if (c->r_bool >= 0) return c->r_bool;
    int r = c->r_bool = js_rule(c);
    js_lit(c, js_alt(c, r), js_word(c, "true"));
    js_lit(c, js_alt(c, r), js_word(c, "false"));
    return r;
}

/* Any JSON value: object | array | string | number | true | false | null. */
int js_value(js_ctx *c) {
    if (c->r_value >= 0) return c->r_value;
    int r = c->r_value = js_rule(c); /* set first: objects and arrays refer back to it */
    int parts[4] = {js_object_any(c), js_array_any(c), js_string_any(c), js_number(c)};
    for (int i = 0; i < 4; i++)
        js_ref(c, js_alt(c, r), parts[i]);
    js_lit(c, js_alt(c, r), js_word(c, "true"));
    js_lit(c, js_alt(c, r), js_word(c, "false"));
    js_lit(c, js_alt(c, r), js_word(c, "null"));
    return r;
}

/* Any object: no known properties, any extra ones. */
int js_object_any(js_ctx *c) {
    if (c->r_object >= 0) return c->r_object;
    int r = c->r_object = js_rule(c);
    int rules[2];
    js_emit_object(c, r, 0, NULL, NULL, NULL, js_value(c), rules);
    return r;
}

/* Any array: "[" ws "]" | "[" ws value B; B ::= ws "]" | ws "," ws value B (js_emit_array's
 * layout, written out here because that one allocates and may fail). */
int js_array_any(js_ctx *c) {
    if (c->r_array >= 0) return c->r_array;
    int r = c->r_array = js_rule(c);
    int ws = js_ws(c), value = js_value(c), more = js_rule(c);
    int a = js_alt(c, more);
    js_ref(c, a, ws);
    js_lit(c, a, "]");
    a = js_alt(c, more);
    js_ref(c, a, ws);
    js_lit(c, a, ",");
    js_ref(c, a, ws);
    js_ref(c, a, value);
    js_ref(c, a, more);
    a = js_alt(c, r);
    js_lit(c, a, "[");
    js_ref(c, a, ws);
    js_lit(c, a, "]");
    a = js_alt(c, r);
    js_lit(c, a, "[");
    js_ref(c, a, ws);
    js_ref(c, a, value);
    js_ref(c, a, more);
    return r;
}

/* ---- object, array and string layouts ---------------------------------------------------- */

/* `{` ws, the n known properties in order (req[i]: must be present), then (addl >= 0) any number
 * of extra "string": addl pairs, then ws `}`. keys[i] is the key as a JSON string, vals[i] the
 * rule of its value. rules has room for 2 (n + 1) ids.
 *
 * Two families of rules keep the commas right whichever optional properties are skipped, in
 * rules linear in n: F_i (nothing written yet; next is property i) and C_i (something written,
 * so a comma comes before the next). Each ends with the closing brace, so the object ends in a
 * tail call:
 *   F_i ::= pair_i C_{i+1} [| F_{i+1} when optional]
 *   C_i ::= ws "," ws pair_i C_{i+1} [| C_{i+1} when optional]
 *   F_n ::= "}" [| extra C_n]            C_n ::= ws "}" [| ws "," ws extra C_n] */
void js_emit_object(js_ctx *c, int into, int n, char **keys, const int *vals, const bool *req,
                    int addl, int *rules) {
    int ws = js_ws(c);
    int *f = rules, *cm = rules + n + 1;
    for (int i = 0; i <= n; i++) {
        f[i] = js_rule(c);
        cm[i] = js_rule(c);
    }
    js_lit(c, js_alt(c, f[n]), "}");
    int a = js_alt(c, cm[n]);
    js_ref(c, a, ws);
    js_lit(c, a, "}");
    if (addl >= 0) {
        int str = js_string_any(c);
        for (int comma = 0; comma < 2; comma++) {
            a = js_alt(c, comma ? cm[n] : f[n]);
            if (comma) {
                js_ref(c, a, ws);
                js_lit(c, a, ",");
                js_ref(c, a, ws);
            }
            js_ref(c, a, str);
            js_ref(c, a, ws);
            js_lit(c, a, ":");
            js_ref(c, a, ws);
            js_ref(c, a, addl);
            js_ref(c, a, cm[n]);
        }
    }
    for (int i = 0; i < n; i++) {
        for (int comma = 0; comma < 2; comma++) {
            int r = comma ? cm[i] : f[i];
            a = js_alt(c, r);
            if (comma) {
                js_ref(c, a, ws);
                js_lit(c, a, ",");
                js_ref(c, a, ws);
            }
            js_lit(c, a, keys[i]);
            js_ref(c, a, ws);
            js_lit(c, a, ":");
            js_ref(c, a, ws);
            js_ref(c, a, vals[i]);
            js_ref(c, a, cm[i + 1]);
            if (!req[i]) js_ref(c, js_alt(c, r), comma ? cm[i + 1] : f[i + 1]);
        }
    }
    a = js_alt(c, into);
    js_lit(c, a, "{");
    js_ref(c, a, ws);
    js_ref(c, a, f[0]);
}

/* `[` ws (item (ws `,` ws item)*)? ws `]` with lo..hi items (hi < 0: no limit): item j is
 * prefix[j] for j < k, else items (< 0: none). B_j (j items written) ::= ws "]" when j >= lo |
 * ws "," ws item_j B_{j+1} when j < hi. Without an upper bound the last B is its own
 * continuation; with one there are hi of them. Adds 0 alternatives when no array fits. */
ts_status js_emit_array(js_ctx *c, int into, const int *prefix, int k, int items, long lo, long hi,
                        int *n_alts) {
    for (int j = 0; j < k; j++)
        if (prefix[j] < 0) { /* item j allows nothing: at most j items */
            k = j;
            items = -1;
        }
    if (items < 0 && (hi < 0 || hi > k)) hi = k;
    if (hi >= 0 && lo > hi) return TS_OK;
    int ws = js_ws(c);
    long last; /* B_1 .. B_last */
    if (hi >= 0) {
        last = hi;
    } else { /* from B_last on, items may close and the item is `items` */
        last = lo > k ? lo : k;
        if (last < 1) last = 1;
    }
    int *b = NULL;
    if (last > 0) {
        b = malloc((size_t)(last + 1) * sizeof *b);
        if (!b) return ts_error(TS_ERR_NOMEM, "JSON Schema: out of memory");
        for (long j = 1; j <= last; j++)
            b[j] = js_rule(c);
    }
    for (long j = 1; j <= last; j++) {
        if (j >= lo) {
            int a = js_alt(c, b[j]);
            js_ref(c, a, ws);
            js_lit(c, a, "]");
        }
        if (hi < 0 || j < hi) {
            int a = js_alt(c, b[j]);
            js_ref(c, a, ws);
            js_lit(c, a, ",");
            js_ref(c, a, ws);
            js_ref(c, a, j < k ? prefix[j] : items);
            js_ref(c, a, j < last ? b[j + 1] : b[last]); /* j == last only when unbounded */
        }
    }
    if (lo == 0) {
        int a = js_alt(c, into);
        js_lit(c, a, "[");
        js_ref(c, a, ws);
        js_lit(c, a, "]");
        (*n_alts)++;
    }
    if (hi != 0) {
        int a = js_alt(c, into);
        js_lit(c, a, "[");
        js_ref(c, a, ws);
        js_ref(c, a, k > 0 ? prefix[0] : items);
        js_ref(c, a, b[1]);
        (*n_alts)++;
    }
    free(b);
    return TS_OK;
}

/* '"' char{lo} then at most hi - lo more (hi < 0: any number) and '"'. */
ts_status js_emit_string(js_ctx *c, int into, long lo, long hi, int *n_alts) {
    int tail = -1;
    if (hi < 0)
        tail = js_strtail(c);
    else
        TS_TRY(js_strtail_n(c, (int)(hi - lo), &tail));
    int ch = js_char(c);
    int a = js_alt(c, into);
    js_lit(c, a, "\"");
    for (long i = 0; i < lo; i++)
        js_ref(c, a, ch);
    js_ref(c, a, tail);
    (*n_alts)++;
    return TS_OK;
}
