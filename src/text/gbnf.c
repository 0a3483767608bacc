/* GBNF, llama.cpp's grammar notation, read into a grammar (llama-server's `grammar` field,
 * vLLM's `guided_grammar`, `tessera run --grammar FILE`):
 *
 *   root  ::= "yes" | "no" ws item*        # rules; the start is `root`
 *   item  ::= [a-z0-9_-]+ ("," | [^\n]{2,5})?
 *   ws    ::= [ \t\n]*
 *
 * Rules are `name ::= alternatives`, one per line (a line break inside parentheses, or right
 * after `::=` or `|`, continues the rule); names are [a-zA-Z0-9_-]+ and may be used before they
 * are defined. Terms: "strings" and [classes] (negated with ^, ranges a-z) with the escapes \n
 * \r \t \\ \" \' \[ \] \- \^ \xHH \uHHHH \UHHHHHHHH, `.` for any character, rule names,
 * ( groups ), and the quantifiers * + ? {m} {m,} {m,n}; # starts a comment. Characters are
 * Unicode code points: a class or `.` matches the UTF-8 encoding of one (never an ill-formed
 * sequence). Refused with a message naming the line and column: token terminals (<[id]>,
 * <token>), an undefined rule, a bound over 1000, a left-recursive rule (the builder's check). */
#include "base/status.h"
#include "text/grammar.h"
#include "text/utf8.h"
#include "text/utf8_ranges.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GB_MAX_NEST  128  /* parentheses deep */
#define GB_MAX_BOUND 1000 /* {m,n}: a unit of bound costs a rule */
#define GB_MAX_NAME  64

typedef struct {
    char name[GB_MAX_NAME + 1];
    int id;
    bool defined;
    size_t first_use; /* where it was first named, for an undefined rule's message */
} gb_name;

typedef struct {
    const char *s;
    size_t n, at;
    ts_gbuild *b;
    gb_name *names;
    int n_names, cap_names;
    int nest;
} gb_parser;

/* "line L, column C" of byte offset at, for messages. */
static ts_status fail(const gb_parser *p, size_t at, const char *what) {
    int line = 1, col = 1;
    for (size_t i = 0; i < at && i < p->n; i++)
        if (p->s[i] == '\n')
            line++, col = 1;
        else
            col++;
    return ts_error(TS_ERR_INVALID, "GBNF grammar, line %d, column %d: %s", line, col, what);
}

static bool at_end(const gb_parser *p) { return p->at >= p->n; }
static char peek(const gb_parser *p) { return at_end(p) ? 0 : p->s[p->at]; }

/* Spaces and comments; newlines too when the rule goes on (nested, or after ::= and |). */
static void skip_space(gb_parser *p, bool newlines) {
    while (!at_end(p)) {
        char c = p->s[p->at];
        if (c == '#') {
            while (!at_end(p) && p->s[p->at] != '\n')
                p->at++;
        } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
            p->at++;
        } else {
            break;
        }
    }
}

static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

/* The rule id of a name, made on first sight. -1 out of memory or a name too long. */
static int rule_of(gb_parser *p, const char *name, size_t len, size_t at) {
    if (len > GB_MAX_NAME) return -1;
    for (int i = 0; i < p->n_names; i++)
        if (strlen(p->names[i].name) == len && memcmp(p->names[i].name, name, len) == 0)
            return p->names[i].id;
    if (p->n_names == p->cap_names) {
        int cap = p->cap_names ? 2 * p->cap_names : 32;
        gb_name *q = realloc(p->names, (size_t)cap * sizeof *q);
        if (!q) return -1;
        p->names = q, p->cap_names = cap;
    }
    gb_name *e = &p->names[p->n_names++];
    memcpy(e->name, name, len);
    e->name[len] = 0;
    e->id = ts_gbuild_rule(p->b);
    e->defined = false;
    e->first_use = at;
    return e->id;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a string or class (an escape or a UTF-8 sequence) as a code point. */
static ts_status read_char(gb_parser *p, uint32_t *cp) {
    size_t start = p->at;
    unsigned char c = (unsigned char)p->s[p->at++];
    if (c == '\\') {
        if (at_end(p)) return fail(p, start, "an escape at the end");
        char e = p->s[p->at++];
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (digits) {
            uint32_t v = 0;
            for (int i = 0; i < digits; i++) {
                int h = at_end(p) ? -1 : hexval(p->s[p->at]);
                if (h < 0) return fail(p, start, "a \\x, \\u or \\U escape needs hex digits");
                v = v * 16 + (uint32_t)h, p->at++;
            }
            if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
                return fail(p, start, "an escape that is not a Unicode scalar value");
            *cp = v;
            return TS_OK;
        }
        static const char from[] = "nrt\\\"'[]-^/", to[] = "\n\r\t\\\"'[]-^/";
        const char *k = strchr(from, e);
        if (!k || !e) return fail(p, start, "an unknown escape");
        *cp = (unsigned char)to[k - from];
        return TS_OK;
    }
    size_t len;
    if (ts_utf8_next(p->s + start, p->n - start, cp, &len) != TS_UTF8_CHAR)
        return fail(p, start, "ill-formed UTF-8");
    p->at = start + len;
    return TS_OK;
}

/* A set of code points: sorted, disjoint intervals. */
typedef struct {
    uint32_t (*iv)[2];
    int n, cap;
} gb_set;

static ts_status set_add(gb_set *s, uint32_t lo, uint32_t hi) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 8;
        uint32_t(*q)[2] = realloc(s->iv, (size_t)cap * sizeof *q);
        if (!q) return ts_error(TS_ERR_NOMEM, "out of memory reading a grammar");
        s->iv = q, s->cap = cap;
    }
    int i = s->n++; /* insertion, then merging of overlapping or touching neighbours */
    while (i > 0 && s->iv[i - 1][0] > lo) {
        s->iv[i][0] = s->iv[i - 1][0], s->iv[i][1] = s->iv[i - 1][1];
        i--;
    }
    s->iv[i][0] = lo, s->iv[i][1] = hi;
    int w = 0;
    for (int r = 1; r < s->n; r++)
        if (s->iv[r][0] <= s->iv[w][1] + 1) {
            if (s->iv[r][1] > s->iv[w][1]) s->iv[w][1] = s->iv[r][1];
        } else {
            w++, s->iv[w][0] = s->iv[r][0], s->iv[w][1] = s->iv[r][1];
        }
    s->n = w + 1;
    return TS_OK;
}

/* The code points of [0, U+10FFFF] not in s. */
static ts_status set_negate(gb_set *s) {
    gb_set t = {0};
    uint32_t next = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->iv[i][0] > next) TS_TRY(set_add(&t, next, s->iv[i][0] - 1));
        next = s->iv[i][1] + 1;
    }
    ts_status st = next <= 0x10FFFF ? set_add(&t, next, 0x10FFFF) : TS_OK;
    free(s->iv);
    *s = t;
    return st;
}

/* A parsed term before its quantifier: inline bytes, a set of code points, or a rule. */
typedef enum { GT_LIT, GT_CLASS, GT_RULE } gb_kind;
typedef struct {
    gb_kind kind;
    char *lit; /* GT_LIT: UTF-8 bytes */
    size_t n_lit;
    gb_set set; /* GT_CLASS */
    int rule;   /* GT_RULE */
} gb_term;

static void term_free(gb_term *t) {
    free(t->lit);
    free(t->set.iv);
}

/* One character of a set: a byte set inline when the set is ASCII, else a rule with an
 * alternative per UTF-8 byte-range sequence (the ASCII part one byte set). */
static void emit_class(gb_parser *p, int a, const gb_set *s) {
    uint64_t ascii[4] = {0, 0, 0, 0};
    bool wide = false;
    for (int i = 0; i < s->n; i++) {
        for (uint32_t c = s->iv[i][0]; c <= s->iv[i][1] && c < 0x80; c++)
            ascii[c >> 6] |= 1ull << (c & 63);
        wide |= s->iv[i][1] >= 0x80;
    }
    if (!wide) {
        ts_gbuild_set(p->b, a, ascii);
        return;
    }
    int r = ts_gbuild_rule(p->b);
    if (ascii[0] | ascii[1]) ts_gbuild_set(p->b, ts_gbuild_alt(p->b, r), ascii);
    for (int i = 0; i < s->n; i++) {
        ts_utf8_seq seq[TS_UTF8_SEQ_MAX];
        uint32_t lo = s->iv[i][0] < 0x80 ? 0x80 : s->iv[i][0];
        int k = s->iv[i][1] >= 0x80 ? ts_utf8_ranges(lo, s->iv[i][1], seq) : 0;
        for (int j = 0; j < k; j++) {
            int alt = ts_gbuild_alt(p->b, r);
            for (int q = 0; q < seq[j].n; q++)
                ts_gbuild_range(p->b, alt, seq[j].lo[q], seq[j].hi[q]);
        }
    }
    ts_gbuild_ref(p->b, a, r);
}

/* Appends the term to alternative a as it stands (one occurrence). */
static void emit_term(gb_parser *p, int a, const gb_term *t) {
    if (t->kind == GT_LIT)
        ts_gbuild_literal(p->b, a, t->lit, t->n_lit);
    else if (t->kind == GT_CLASS)
        emit_class(p, a, &t->set);
    else
        ts_gbuild_ref(p->b, a, t->rule);
}

static ts_status parse_alternates(gb_parser *p, int rule);

static ts_status parse_string(gb_parser *p, gb_term *t) {
    size_t start = p->at++;
    t->kind = GT_LIT;
    size_t cap = 16;
    t->lit = malloc(cap);
    if (!t->lit) return ts_error(TS_ERR_NOMEM, "out of memory reading a grammar");
    while (peek(p) != '"') {
        if (at_end(p) || peek(p) == '\n') return fail(p, start, "an unterminated string");
        uint32_t cp;
        TS_TRY(read_char(p, &cp));
        if (t->n_lit + 4 > cap) {
            char *q = realloc(t->lit, cap *= 2);
            if (!q) return ts_error(TS_ERR_NOMEM, "out of memory reading a grammar");
            t->lit = q;
        }
        t->n_lit += ts_utf8_encode(cp, t->lit + t->n_lit);
    }
    p->at++;
    return TS_OK;
}

static ts_status parse_class(gb_parser *p, gb_term *t) {
    size_t start = p->at++;
    t->kind = GT_CLASS;
    bool negated = peek(p) == '^';
    if (negated) p->at++;
    while (peek(p) != ']') {
        if (at_end(p) || peek(p) == '\n') return fail(p, start, "an unterminated class");
        uint32_t lo, hi;
        TS_TRY(read_char(p, &lo));
        hi = lo;
        if (peek(p) == '-' && p->at + 1 < p->n && p->s[p->at + 1] != ']') {
            p->at++;
            TS_TRY(read_char(p, &hi));
            if (hi < lo) return fail(p, start, "a class range whose end is below its start");
        }
        TS_TRY(set_add(&t->set, lo, hi));
    }
    p->at++;
    if (negated) TS_TRY(set_negate(&t->set));
    if (t->set.n == 0) return fail(p, start, "a class that matches no character");
    return TS_OK;
}

/* One term: a string, a class, `.`, a rule name, or a group (a rule of its own). */
static ts_status parse_term(gb_parser *p, gb_term *t) {
    memset(t, 0, sizeof *t);
    size_t start = p->at;
    char c = peek(p);
    if (c == '"') return parse_string(p, t);
    if (c == '[') return parse_class(p, t);
    if (c == '.') {
        p->at++;
        t->kind = GT_CLASS;
        return set_add(&t->set, 0, 0x10FFFF); /* surrogates are never encoded */
    }
    if (c == '(') {
        if (++p->nest > GB_MAX_NEST) return fail(p, start, "groups nested too deep");
        p->at++;
        t->kind = GT_RULE;
        t->rule = ts_gbuild_rule(p->b);
        TS_TRY(parse_alternates(p, t->rule));
        if (peek(p) != ')') return fail(p, start, "a group without its ')'");
        p->at++;
        p->nest--;
        return TS_OK;
    }
    if (c == '<' || c == '!') return fail(p, start, "token terminals are not supported");
    if (!name_char(c)) return fail(p, start, "a term was expected");
    size_t b = p->at;
    while (name_char(peek(p)))
        p->at++;
    t->kind = GT_RULE;
    t->rule = rule_of(p, p->s + b, p->at - b, b);
    if (t->rule < 0) return fail(p, b, "a rule name too long (or out of memory)");
    return TS_OK;
}

static ts_status read_count(gb_parser *p, long *v) {
    size_t start = p->at;
    *v = 0;
    if (peek(p) < '0' || peek(p) > '9') return fail(p, start, "a number was expected");
    while (peek(p) >= '0' && peek(p) <= '9') {
        *v = *v * 10 + (peek(p) - '0');
        p->at++;
        if (*v > GB_MAX_BOUND) return fail(p, start, "a repetition bound over 1000");
    }
    return TS_OK;
}

/* The term under a quantifier, appended to alternative a: u{lo,hi} (hi < 0: no upper bound)
 * as lo copies, then a star (rep ::= "" | u rep) or a chain of hi - lo optional ones. */
static void emit_repeat(gb_parser *p, int a, const gb_term *t, long lo, long hi) {
    int u = t->rule;
    if (t->kind != GT_RULE) {
        u = ts_gbuild_rule(p->b);
        emit_term(p, ts_gbuild_alt(p->b, u), t);
    }
    for (long i = 0; i < lo; i++)
        ts_gbuild_ref(p->b, a, u);
    if (hi < 0) {
        int rep = ts_gbuild_rule(p->b);
        ts_gbuild_alt(p->b, rep);
        int r = ts_gbuild_alt(p->b, rep);
        ts_gbuild_ref(p->b, r, u);
        ts_gbuild_ref(p->b, r, rep);
        ts_gbuild_ref(p->b, a, rep);
        return;
    }
    int next = -1; /* the chain from the last optional copy back */
    for (long i = lo; i < hi; i++) {
        int opt = ts_gbuild_rule(p->b);
        ts_gbuild_alt(p->b, opt);
        int r = ts_gbuild_alt(p->b, opt);
        ts_gbuild_ref(p->b, r, u);
        if (next >= 0) ts_gbuild_ref(p->b, r, next);
        next = opt;
    }
    if (next >= 0) ts_gbuild_ref(p->b, a, next);
}

/* A sequence of terms into alternative a, up to `|`, `)` or the end of the rule. */
static ts_status parse_sequence(gb_parser *p, int a) {
    for (;;) {
        skip_space(p, p->nest > 0);
        char c = peek(p);
        if (at_end(p) || c == '|' || c == ')' || c == '\n') return TS_OK;
        gb_term t;
        ts_status st = parse_term(p, &t);
        long lo = 1, hi = 1;
        c = peek(p);
        if (st == TS_OK && (c == '*' || c == '+' || c == '?')) {
            p->at++;
            lo = c == '+', hi = c == '?' ? 1 : -1;
        } else if (st == TS_OK && c == '{') {
            size_t start = p->at++;
            st = read_count(p, &lo);
            hi = lo;
            if (st == TS_OK && peek(p) == ',') {
                p->at++;
                hi = -1;
                if (peek(p) != '}') st = read_count(p, &hi);
            }
            if (st == TS_OK && peek(p) != '}') st = fail(p, start, "a '{' bound without its '}'");
            if (st == TS_OK) p->at++;
            if (st == TS_OK && hi >= 0 && hi < lo)
                st = fail(p, start, "a bound {m,n} with n below m");
        }
        if (st == TS_OK) {
            if (lo == 1 && hi == 1)
                emit_term(p, a, &t);
            else
                emit_repeat(p, a, &t, lo, hi);
        }
        term_free(&t);
        TS_TRY(st);
    }
}

static ts_status parse_alternates(gb_parser *p, int rule) {
    for (;;) {
        skip_space(p, true); /* a rule may start on the line after ::= or | */
        TS_TRY(parse_sequence(p, ts_gbuild_alt(p->b, rule)));
        skip_space(p, p->nest > 0);
        if (peek(p) != '|') return TS_OK;
        p->at++;
    }
}

ts_status ts_grammar_from_gbnf(const char *text, size_t len, ts_grammar **out) {
    *out = NULL;
    gb_parser p = {.s = text, .n = len};
    TS_TRY(ts_gbuild_create(&p.b));
    ts_status st = TS_OK;
    for (;;) {
        skip_space(&p, true);
        if (at_end(&p)) break;
        size_t b = p.at;
        while (name_char(peek(&p)))
            p.at++;
        if (p.at == b) {
            st = fail(&p, b, "a rule name was expected");
            break;
        }
        int rule = rule_of(&p, text + b, p.at - b, b);
        gb_name *e = NULL;
        for (int i = 0; i < p.n_names; i++)
            if (p.names[i].id == rule) e = &p.names[i];
        if (rule < 0 || !e) {
            st = fail(&p, b, "a rule name too long (or out of memory)");
            break;
        }
        if (e->defined) {
            st = fail(&p, b, "a rule defined twice");
            break;
        }
        e->defined = true;
        skip_space(&p, false);
        if (p.at + 3 > len || memcmp(text + p.at, "::=", 3) != 0) {
            st = fail(&p, p.at, "'::=' was expected after the rule name");
            break;
        }
        p.at += 3;
        if ((st = parse_alternates(&p, rule)) != TS_OK) break;
        if (!at_end(&p) && peek(&p) != '\n') {
            st = fail(&p, p.at, peek(&p) == ')' ? "a ')' without its '('" : "unexpected text");
            break;
        }
    }
    int root = -1;
    for (int i = 0; st == TS_OK && i < p.n_names; i++) {
        if (!p.names[i].defined) {
            char msg[GB_MAX_NAME + 40];
            snprintf(msg, sizeof msg, "the rule '%s' is used but not defined", p.names[i].name);
            st = fail(&p, p.names[i].first_use, msg);
        }
        if (strcmp(p.names[i].name, "root") == 0) root = p.names[i].id;
    }
    if (st == TS_OK && root < 0) st = ts_error(TS_ERR_INVALID, "GBNF grammar: no rule 'root'");
    if (st == TS_OK) st = ts_gbuild_finish(p.b, root, out);
    ts_gbuild_free(p.b);
    free(p.names);
    return st;
}

ts_status ts_grammar_from_choices(const char *const *choices, int n, ts_grammar **out) {
    *out = NULL;
    ts_gbuild *b;
    TS_TRY(ts_gbuild_create(&b));
    int root = ts_gbuild_rule(b);
    for (int i = 0; i < n; i++)
        ts_gbuild_literal(b, ts_gbuild_alt(b, root), choices[i], strlen(choices[i]));
    ts_status st = n > 0 ? ts_gbuild_finish(b, root, out)
                         : ts_error(TS_ERR_INVALID, "a choice among no strings");
    ts_gbuild_free(b);
    return st;
}
