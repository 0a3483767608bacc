/* JSON Schema `pattern` as grammar rules for a JSON string's content (regex_grammar.h).
 *
 * Two passes. The parser turns the pattern into a small tree (sets of code points, sequences,
 * alternatives, repetitions), checking the subset as it goes, so that every refusal happens
 * before the builder is touched. The compiler then writes rules in continuation-passing style:
 * compile(node, k) returns a rule for "node, then k", k being the rule of what follows. A
 * sequence is compiled from its end, a set becomes one alternative per byte-level spelling each
 * ending in a reference to k, and `x*` becomes S ::= k | x-then-S - right recursion whose last
 * element is a reference, which the matcher runs as a tail call, so stacks stay flat however
 * long the repetition runs.
 *
 * Loops must read a byte per round: a rule that can reach itself without one is left recursion,
 * which the builder refuses. So a repeated x that can match "" is repeated as ne(x), x without
 * the empty match: x{n,m} = ne(x){0,m} when x can match "", since empty rounds add nothing.
 * compile_ne writes ne(x) from x's tree (ne(ab) = ne(a) b | ne(b) when a can match "", ne(a|b)
 * = ne(a) | ne(b), ne(x{0,m}) = ne(x) x{0,m-1}), so a loop's body never matches "", and the
 * alternatives that used to match "" stay reachable through k.
 *
 * Counted repetition x{n,m} (other than ?, *, + and {1}) compiles x once, as a sub-rule X ending
 * in the empty rule, and chains references to it: R_j ::= X R_(j-1) for the n required rounds,
 * then R_j ::= k | X R_(j-1) for the optional ones. A bound costs one small rule per unit and
 * nested bounds add instead of multiplying; the price is one stack level per nested bound while
 * inside x, which the matcher's stacks share.
 *
 * The compiler runs twice: first without the builder, counting the elements the rules would
 * take (a pattern over the limit is refused, not half written), then for real. */
#include "text/regex_grammar.h"

#include "base/status.h"
#include "text/utf8.h"
#include "text/utf8_ranges.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RX_MAX_DEPTH 64     /* groups nested */
#define RX_MAX_COUNT 1000   /* largest {n,m} bound: each unit costs a rule */
#define RX_MAX_COST  100000 /* rules, alternatives and elements one pattern may add */
#define RX_INF       (-1)   /* no upper bound */
#define CP_MAX       0x10FFFF

typedef struct {
    uint32_t lo, hi;
} rx_iv;

typedef enum { RX_EMPTY, RX_SET, RX_CAT, RX_ALT, RX_REP } rx_kind;

typedef struct {
    rx_kind kind;
    bool nullable; /* can match "" */
    int off, n;    /* SET: intervals iv[off, off+n); CAT, ALT: children kid[off, off+n);
                      REP: the child is node off */
    int min, max;  /* REP: bounds, max RX_INF when open */
} rx_node;

typedef struct {
    int node;
    bool caret, dollar; /* anchored at the start / end */
} rx_branch;

typedef struct {
    const uint8_t *p;
    size_t len, pos;
    ts_status st; /* the first error */
    rx_node *node;
    int n_node, cap_node;
    rx_iv *iv; /* every set's intervals */
    int n_iv, cap_iv;
    int *kid; /* children lists */
    int n_kid, cap_kid;
    int *stk; /* children of the sequences and alternatives being parsed */
    int n_stk, cap_stk;
    rx_iv *tmp; /* the class being parsed */
    int n_tmp, cap_tmp;
    rx_branch *br; /* top-level alternatives */
    int n_br, cap_br;
    /* compiling */
    bool raw;     /* plain text, the whole of it matched (guided_regex), not a JSON string */
    bool python;  /* a JSON string that Python reads the same: no "\/", no surrogate escapes */
    ts_gbuild *b; /* NULL on the counting pass */
    long cost;
    int n_rules; /* rules made on the counting pass */
    int eps;     /* ::= "" */
    int any;     /* any string content, -1 until needed */
} rx;

#define RX_FAIL(c, code, ...) ((c)->st = ts_error((code), "pattern: " __VA_ARGS__), -1)

static bool grow(rx *c, void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return true;
    int n = *cap ? *cap : 16;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, (size_t)n * elem);
    if (!q) {
        c->st = ts_error(TS_ERR_NOMEM, "pattern: out of memory");
        return false;
    }
    *p = q, *cap = n;
    return true;
}

/* ---- code point sets --------------------------------------------------------------------- */

static const rx_iv DIGIT[] = {{'0', '9'}};
static const rx_iv WORD[] = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
static const rx_iv SPACE[] = {
    {0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
    {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
static const rx_iv LINE_END[] = {{0x0A, 0x0A}, {0x0D, 0x0D}, {0x2028, 0x2029}}; /* not `.` */

static bool tmp_add(rx *c, uint32_t lo, uint32_t hi) {
    if (!grow(c, (void **)&c->tmp, &c->cap_tmp, c->n_tmp + 1, sizeof *c->tmp)) return false;
    c->tmp[c->n_tmp++] = (rx_iv){lo, hi};
    return true;
}

/* Adds a sorted list of intervals, or its complement. */
static bool tmp_add_list(rx *c, const rx_iv *iv, int n, bool negate) {
    uint32_t next = 0; /* the first code point not yet covered by the complement */
    for (int i = 0; i < n; i++) {
        if (!negate && !tmp_add(c, iv[i].lo, iv[i].hi)) return false;
        if (negate && iv[i].lo > next && !tmp_add(c, next, iv[i].lo - 1)) return false;
        next = iv[i].hi + 1;
    }
    return !negate || next > CP_MAX || tmp_add(c, next, CP_MAX);
}

static bool tmp_add_escape(rx *c, int letter) {
    switch (letter) {
    case 'd':
    case 'D': return tmp_add_list(c, DIGIT, 1, letter == 'D');
    case 'w':
    case 'W': return tmp_add_list(c, WORD, 4, letter == 'W');
    default: return tmp_add_list(c, SPACE, 10, letter == 'S');
    }
}

static int iv_cmp(const void *a, const void *b) {
    uint32_t x = ((const rx_iv *)a)->lo, y = ((const rx_iv *)b)->lo;
    return x < y ? -1 : x > y;
}

/* The set node of tmp (sorted, merged, complemented when negate); tmp is emptied. */
static int tmp_node(rx *c, bool negate) {
    if (c->n_tmp) qsort(c->tmp, (size_t)c->n_tmp, sizeof *c->tmp, iv_cmp);
    int n = 0;
    for (int i = 0; i < c->n_tmp; i++) {
        if (n && c->tmp[i].lo <= c->tmp[n - 1].hi + 1) {
            if (c->tmp[i].hi > c->tmp[n - 1].hi) c->tmp[n - 1].hi = c->tmp[i].hi;
        } else
            c->tmp[n++] = c->tmp[i];
    }
    c->n_tmp = 0;
    int off = c->n_iv;
    if (negate) { /* the list is read from tmp while the complement is written to iv */
        if (!grow(c, (void **)&c->iv, &c->cap_iv, c->n_iv + n + 1, sizeof *c->iv)) return -1;
        uint32_t next = 0;
        for (int i = 0; i < n; i++) {
            if (c->tmp[i].lo > next) c->iv[c->n_iv++] = (rx_iv){next, c->tmp[i].lo - 1};
            next = c->tmp[i].hi + 1;
        }
        if (next <= CP_MAX) c->iv[c->n_iv++] = (rx_iv){next, CP_MAX};
    } else {
        if (!grow(c, (void **)&c->iv, &c->cap_iv, c->n_iv + n, sizeof *c->iv)) return -1;
        if (n) memcpy(c->iv + c->n_iv, c->tmp, (size_t)n * sizeof *c->iv);
        c->n_iv += n;
    }
    if (!grow(c, (void **)&c->node, &c->cap_node, c->n_node + 1, sizeof *c->node)) return -1;
    c->node[c->n_node] = (rx_node){RX_SET, false, off, c->n_iv - off, 0, 0};
    return c->n_node++;
}

static int char_node(rx *c, uint32_t cp) { return tmp_add(c, cp, cp) ? tmp_node(c, false) : -1; }

/* ---- parsing ----------------------------------------------------------------------------- */

static int peek(const rx *c, size_t i) { return c->pos + i < c->len ? c->p[c->pos + i] : -1; }

static int hexval(int ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* n hex digits at c->pos + i, or -1. */
static long hex_at(const rx *c, size_t i, int n) {
    long v = 0;
    for (int j = 0; j < n; j++) {
        int h = hexval(peek(c, i + (size_t)j));
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

/* One UTF-8 character of the pattern into *cp. */
static int read_char(rx *c, uint32_t *cp) {
    size_t n;
    if (ts_utf8_next((const char *)c->p + c->pos, c->len - c->pos, cp, &n) != TS_UTF8_CHAR)
        return RX_FAIL(c, TS_ERR_INVALID, "invalid UTF-8 at byte %zu", c->pos);
    c->pos += n;
    return 0;
}

/* The escape whose backslash is at c->pos. Returns 0 with the character in *cp, the letter of a
 * class escape (d D w W s S), or -1. */
static int read_escape(rx *c, bool in_class, uint32_t *cp) {
    size_t at = c->pos++;
    int e = peek(c, 0);
    long v;
    switch (e) {
    case -1: return RX_FAIL(c, TS_ERR_INVALID, "\\ at the end (byte %zu)", at);
    case 'd':
    case 'D':
    case 'w':
    case 'W':
    case 's':
    case 'S': return c->pos++, e;
    case 'n': return *cp = '\n', c->pos++, 0;
    case 't': return *cp = '\t', c->pos++, 0;
    case 'r': return *cp = '\r', c->pos++, 0;
    case 'f': return *cp = '\f', c->pos++, 0;
    case 'v': return *cp = '\v', c->pos++, 0;
    case 'b':
        if (in_class) return *cp = '\b', c->pos++, 0; /* backspace inside a class */
        /* fall through */
    case 'B':
        return RX_FAIL(c, TS_ERR_UNSUPPORTED, "word boundary \\%c at byte %zu is not supported", e,
                       at);
    case 'k':
        return RX_FAIL(c, TS_ERR_UNSUPPORTED,
                       "named backreference \\k at byte %zu is not supported", at);
    case 'p':
    case 'P':
        return RX_FAIL(c, TS_ERR_UNSUPPORTED,
                       "Unicode property escape \\%c at byte %zu is not supported", e, at);
    case 'x':
        if ((v = hex_at(c, 1, 2)) < 0)
            return RX_FAIL(c, TS_ERR_INVALID, "bad \\x escape at byte %zu", at);
        return *cp = (uint32_t)v, c->pos += 3, 0;
    case 'u':
        if (peek(c, 1) == '{')
            return RX_FAIL(c, TS_ERR_UNSUPPORTED, "\\u{...} at byte %zu is not supported", at);
        if ((v = hex_at(c, 1, 4)) < 0)
            return RX_FAIL(c, TS_ERR_INVALID, "bad \\u escape at byte %zu", at);
        c->pos += 5;
        if (v >= 0xD800 && v <= 0xDBFF && peek(c, 0) == '\\' && peek(c, 1) == 'u') {
            long lo = hex_at(c, 2, 4); /* a pair of escapes is one code point, as in JSON */
            if (lo >= 0xDC00 && lo <= 0xDFFF) {
                c->pos += 6;
                return *cp = (uint32_t)(0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00)), 0;
            }
        }
        if (v >= 0xD800 && v <= 0xDFFF)
            return RX_FAIL(c, TS_ERR_UNSUPPORTED,
                           "lone surrogate \\u%04lX at byte %zu is not supported", v, at);
        return *cp = (uint32_t)v, 0;
    case '0':
        if (!(peek(c, 1) >= '0' && peek(c, 1) <= '9')) return *cp = 0, c->pos++, 0;
        /* fall through */
    default:
        if (e >= '0' && e <= '9')
            return RX_FAIL(c, TS_ERR_UNSUPPORTED,
                           "backreference or octal escape \\%c at byte %zu is not supported", e,
                           at);
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) /* \a \cX \e: no meaning here */
            return RX_FAIL(c, TS_ERR_UNSUPPORTED, "escape \\%c at byte %zu is not supported", e,
                           at);
        return read_char(c, cp); /* punctuation or non-ASCII: the character itself */
    }
}

/* Reads {n}, {n,} or {n,m} at c->pos into lo and hi (RX_INF when open) and returns its
 * length, or 0 when the text there is not one (then '{' is a literal, as in Annex B). Numbers
 * saturate above the largest bound, which is refused anyway. */
static size_t read_bounds(const rx *c, long *lo, long *hi) {
    size_t i = 1;
    long *v = lo;
    *lo = 0, *hi = RX_INF;
    for (int part = 0; part < 2; part++) {
        size_t start = i;
        for (; peek(c, i) >= '0' && peek(c, i) <= '9'; i++)
            if (*v <= 10L * RX_MAX_COUNT) *v = *v * 10 + (peek(c, i) - '0');
        if (i == start && part == 0) return 0;
        if (part == 0) {
            if (peek(c, i) == '}') return *hi = *lo, i + 1;
            if (peek(c, i) != ',') return 0;
            i++, *hi = 0, v = hi;
        } else if (i == start)
            *hi = RX_INF;
    }
    return peek(c, i) == '}' ? i + 1 : 0;
}

static bool at_quantifier(const rx *c) {
    long lo, hi;
    int ch = peek(c, 0);
    return ch == '*' || ch == '+' || ch == '?' || (ch == '{' && read_bounds(c, &lo, &hi));
}

static int new_node(rx *c, rx_node nd) {
    if (!grow(c, (void **)&c->node, &c->cap_node, c->n_node + 1, sizeof *c->node)) return -1;
    c->node[c->n_node] = nd;
    return c->n_node++;
}

/* The quantifier after atom, if any. */
static int parse_quant(rx *c, int atom) {
    size_t at = c->pos;
    long lo, hi;
    int ch = peek(c, 0);
    if (ch == '*' || ch == '+' || ch == '?') {
        lo = ch == '+', hi = ch == '?' ? 1 : RX_INF;
        c->pos++;
    } else if (ch == '{' && (c->pos += read_bounds(c, &lo, &hi)) > at) {
        if (lo > RX_MAX_COUNT || hi > RX_MAX_COUNT)
            return RX_FAIL(c, TS_ERR_UNSUPPORTED,
                           "bound over %d in the quantifier at byte %zu is not supported",
                           RX_MAX_COUNT, at);
        if (hi != RX_INF && lo > hi)
            return RX_FAIL(c, TS_ERR_INVALID, "quantifier {%ld,%ld} at byte %zu is out of order",
                           lo, hi, at);
    } else
        return atom;
    if (peek(c, 0) == '?') c->pos++; /* lazy: the same set of strings */
    if (at_quantifier(c))
        return RX_FAIL(c, TS_ERR_INVALID, "quantifier at byte %zu has nothing to repeat", c->pos);
    bool nullable = lo == 0 || c->node[atom].nullable;
    return new_node(c, (rx_node){RX_REP, nullable, atom, 1, (int)lo, (int)hi});
}

/* A class atom at c->pos: 0 with *cp, a class escape's letter, or -1. */
static int class_atom(rx *c, uint32_t *cp) {
    return peek(c, 0) == '\\' ? read_escape(c, true, cp) : read_char(c, cp);
}

static int parse_class(rx *c) {
    size_t at = c->pos++;
    bool negate = peek(c, 0) == '^';
    c->pos += negate;
    c->n_tmp = 0;
    for (;;) {
        if (peek(c, 0) < 0) return RX_FAIL(c, TS_ERR_INVALID, "unclosed class at byte %zu", at);
        if (peek(c, 0) == ']') break;
        uint32_t a, z;
        int ka = class_atom(c, &a);
        if (ka < 0) return -1;
        if (peek(c, 0) == '-' && peek(c, 1) >= 0 && peek(c, 1) != ']') {
            size_t dash = c->pos++;
            int kz = class_atom(c, &z);
            if (kz < 0) return -1;
            if (ka || kz)
                return RX_FAIL(c, TS_ERR_UNSUPPORTED,
                               "class escape as a range end at byte %zu is not supported", dash);
            if (a > z)
                return RX_FAIL(c, TS_ERR_INVALID, "class range out of order at byte %zu", dash);
            if (!tmp_add(c, a, z)) return -1;
        } else if (!(ka ? tmp_add_escape(c, ka) : tmp_add(c, a, a)))
            return -1;
    }
    c->pos++;
    return tmp_node(c, negate);
}

static int parse_alt(rx *c, int depth);

static int parse_group(rx *c, int depth) {
    size_t at = c->pos++;
    if (peek(c, 0) == '?') {
        int q = peek(c, 1), r = peek(c, 2);
        const char *what = q == '=' || q == '!'                 ? "lookahead"
                           : q == '<' && (r == '=' || r == '!') ? "lookbehind"
                           : q == '<'                           ? "named group"
                           : q == ':'                           ? NULL
                                                                : "group flag";
        if (what)
            return RX_FAIL(c, TS_ERR_UNSUPPORTED, "%s at byte %zu is not supported", what, at);
        c->pos += 2;
    }
    if (depth >= RX_MAX_DEPTH)
        return RX_FAIL(c, TS_ERR_UNSUPPORTED, "groups nested over %d deep at byte %zu",
                       RX_MAX_DEPTH, at);
    int n = parse_alt(c, depth + 1);
    if (n < 0) return -1;
    if (peek(c, 0) != ')') return RX_FAIL(c, TS_ERR_INVALID, "unclosed group at byte %zu", at);
    c->pos++;
    return n;
}

static int parse_atom(rx *c, int depth) {
    size_t at = c->pos;
    int ch = peek(c, 0);
    uint32_t cp;
    switch (ch) {
    case '(': return parse_group(c, depth);
    case '[': return parse_class(c);
    case '.':
        c->pos++;
        c->n_tmp = 0;
        return tmp_add_list(c, LINE_END, 3, true) ? tmp_node(c, false) : -1;
    case '\\': {
        int k = read_escape(c, false, &cp);
        if (k > 0) return c->n_tmp = 0, tmp_add_escape(c, k) ? tmp_node(c, false) : -1;
        return k < 0 ? -1 : char_node(c, cp);
    }
    case '*':
    case '+':
    case '?': return RX_FAIL(c, TS_ERR_INVALID, "quantifier at byte %zu has nothing to repeat", at);
    case '{':
        if (at_quantifier(c))
            return RX_FAIL(c, TS_ERR_INVALID, "quantifier at byte %zu has nothing to repeat", at);
        if (peek(c, 1) == ',') { /* {,n}: text to ECMA-262, {0,n} to Python: ambiguous */
            size_t i = 2;
            while (peek(c, i) >= '0' && peek(c, i) <= '9')
                i++;
            if (i > 2 && peek(c, i) == '}')
                return RX_FAIL(c, TS_ERR_UNSUPPORTED, "{,n} at byte %zu is not supported", at);
        }
        c->pos++;
        return char_node(c, '{');
    default: return read_char(c, &cp) < 0 ? -1 : char_node(c, cp);
    }
}

/* Makes a CAT or ALT node of the children on stk above base (one child is itself). */
static int pop_list(rx *c, int base, rx_kind kind) {
    int n = c->n_stk - base;
    if (n == 1) return c->n_stk = base, c->stk[base];
    if (n == 0) return new_node(c, (rx_node){RX_EMPTY, true, 0, 0, 0, 0});
    if (!grow(c, (void **)&c->kid, &c->cap_kid, c->n_kid + n, sizeof *c->kid)) return -1;
    bool nullable = kind == RX_CAT;
    for (int i = 0; i < n; i++) {
        bool ni = c->node[c->stk[base + i]].nullable;
        nullable = kind == RX_CAT ? nullable && ni : nullable || ni;
    }
    memcpy(c->kid + c->n_kid, c->stk + base, (size_t)n * sizeof *c->kid);
    c->n_stk = base;
    int id = new_node(c, (rx_node){kind, nullable, c->n_kid, n, 0, 0});
    c->n_kid += n;
    return id;
}

static bool push(rx *c, int id) {
    if (!grow(c, (void **)&c->stk, &c->cap_stk, c->n_stk + 1, sizeof *c->stk)) return false;
    c->stk[c->n_stk++] = id;
    return true;
}

/* A sequence, up to '|', ')' or the end. Top-level ones (anchors non-NULL) may start with ^ and
 * end with $. */
static int parse_seq(rx *c, int depth, bool *caret, bool *dollar) {
    int base = c->n_stk;
    if (caret && peek(c, 0) == '^') c->pos++, *caret = true;
    for (int ch; (ch = peek(c, 0)) >= 0 && ch != '|' && ch != ')';) {
        if (ch == '$' && dollar && (peek(c, 1) < 0 || peek(c, 1) == '|')) {
            c->pos++, *dollar = true;
            break;
        }
        if (ch == '^' || ch == '$')
            return RX_FAIL(c, TS_ERR_UNSUPPORTED,
                           "anchor %c at byte %zu is not supported (only ^ at the start and $ at "
                           "the end of the pattern or of a top-level alternative)",
                           ch, c->pos);
        int atom = parse_atom(c, depth);
        if (atom < 0 || (atom = parse_quant(c, atom)) < 0 || !push(c, atom)) return -1;
    }
    return pop_list(c, base, RX_CAT);
}

static int parse_alt(rx *c, int depth) {
    int base = c->n_stk;
    for (;;) {
        int s = parse_seq(c, depth, NULL, NULL);
        if (s < 0 || !push(c, s)) return -1;
        if (peek(c, 0) != '|') break;
        c->pos++;
    }
    return pop_list(c, base, RX_ALT);
}

static ts_status parse(rx *c) {
    for (;;) {
        rx_branch br = {0, false, false};
        if ((br.node = parse_seq(c, 0, &br.caret, &br.dollar)) < 0) return c->st;
        if (!grow(c, (void **)&c->br, &c->cap_br, c->n_br + 1, sizeof *c->br)) return c->st;
        c->br[c->n_br++] = br;
        if (peek(c, 0) != '|') break;
        c->pos++;
    }
    if (peek(c, 0) >= 0) /* only ')' stops a top-level sequence early */
        c->st = ts_error(TS_ERR_INVALID, "pattern: unmatched ) at byte %zu", c->pos);
    return c->st;
}

/* ---- writing rules ----------------------------------------------------------------------- */

/* The builder calls, counted; on the counting pass (no builder) only counted. */
static int g_rule(rx *c) {
    c->cost++;
    return c->b ? ts_gbuild_rule(c->b) : c->n_rules++;
}
static int g_alt(rx *c, int rule) {
    c->cost++;
    return c->b ? ts_gbuild_alt(c->b, rule) : 0;
}
static void g_ref(rx *c, int alt, int rule) {
    c->cost++;
    if (c->b) ts_gbuild_ref(c->b, alt, rule);
}
static void g_set(rx *c, int alt, const uint64_t set[4]) {
    c->cost++;
    if (c->b) ts_gbuild_set(c->b, alt, set);
}
static void g_range(rx *c, int alt, uint8_t lo, uint8_t hi) {
    c->cost++;
    if (c->b) ts_gbuild_range(c->b, alt, lo, hi);
}
static void g_lit(rx *c, int alt, const char *s) {
    for (; *s; s++)
        g_range(c, alt, (uint8_t)*s, (uint8_t)*s);
}

static void set_add(uint64_t s[4], int ch) { s[ch >> 6] |= 1ull << (ch & 63); }
static bool set_empty(const uint64_t s[4]) { return !(s[0] | s[1] | s[2] | s[3]); }

/* An alternative of r that matches nothing: for a rule no text reaches the end of. */
static void g_never(rx *c, int r) {
    const uint64_t none[4] = {0, 0, 0, 0};
    g_set(c, g_alt(c, r), none);
}

/* prefix, a byte of s, then k; nothing when s is empty. */
static int g_set_alt(rx *c, int r, const char *prefix, const uint64_t s[4], int k) {
    if (set_empty(s)) return 0;
    int a = g_alt(c, r);
    g_lit(c, a, prefix);
    g_set(c, a, s);
    g_ref(c, a, k);
    return 1;
}

/* Alternatives of r for each character of the set iv[0, n), in its one JSON spelling, then k.
 * ASCII characters written as themselves share one byte set; the escapes share "\" and a byte
 * set; the rest is one alternative per UTF-8 byte-range sequence. */
static void emit_set(rx *c, int r, const rx_iv *iv, int n, int k) {
    static const char short_esc[32] = {
        ['\b'] = 'b', ['\t'] = 't', ['\n'] = 'n', ['\f'] = 'f', ['\r'] = 'r'};
    uint64_t raw[4] = {0}, esc[4] = {0}, u0[4] = {0}, u1[4] = {0};
    int alts = 0;
    for (int i = 0; i < n; i++) {
        for (uint32_t cp = iv[i].lo; cp <= iv[i].hi && cp < 0x80; cp++) {
            if (c->raw) /* plain text: every character as itself */
                set_add(raw, (int)cp);
            else if (cp == '"' || cp == '\\')
                set_add(esc, (int)cp);
            else if (cp >= 0x20)
                set_add(raw, (int)cp);
            else if (short_esc[cp])
                set_add(esc, short_esc[cp]);
            else
                set_add(cp < 0x10 ? u0 : u1, "0123456789abcdef"[cp & 15]);
        }
        if (iv[i].hi < 0x80) continue;
        ts_utf8_seq seq[TS_UTF8_SEQ_MAX];
        int ns = ts_utf8_ranges(iv[i].lo < 0x80 ? 0x80 : iv[i].lo, iv[i].hi, seq);
        for (int s = 0; s < ns; s++, alts++) {
            int a = g_alt(c, r);
            for (int j = 0; j < seq[s].n; j++)
                g_range(c, a, seq[s].lo[j], seq[s].hi[j]);
            g_ref(c, a, k);
        }
    }
    alts += g_set_alt(c, r, "", raw, k) + g_set_alt(c, r, "\\", esc, k);
    alts += g_set_alt(c, r, "\\u000", u0, k) + g_set_alt(c, r, "\\u001", u1, k);
    if (!alts) g_never(c, r);
}

/* Alternatives of r for any one character in any JSON spelling, then k: what comes before and
 * after an unanchored match is not the pattern's, so it is as free as a plain string. */
static void emit_any_char(rx *c, int r, int k) {
    static const rx_iv plain[] = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, CP_MAX}};
    static const rx_iv all[] = {{0, CP_MAX}};
    if (c->raw) {
        emit_set(c, r, all, 1, k);
        return;
    }
    emit_set(c, r, plain, 3, k);
    uint64_t esc[4] = {0}, hex[4] = {0};
    for (const char *p = c->python ? "\"\\bfnrt" : "\"\\/bfnrt"; *p; p++)
        set_add(esc, *p);
    for (const char *p = "0123456789abcdefABCDEF"; *p; p++)
        set_add(hex, *p);
    g_set_alt(c, r, "\\", esc, k);
    int a = g_alt(c, r);
    g_lit(c, a, "\\u");
    if (c->python) { /* [0-9a-cA-Ce-fE-F] hex hex hex | [dD] [0-7] hex hex */
        uint64_t lead[4] = {0}, d[4] = {0}, low[4] = {0};
        for (const char *p = "0123456789abcABCefEF"; *p; p++)
            set_add(lead, *p);
        set_add(d, 'd'), set_add(d, 'D');
        for (const char *p = "01234567"; *p; p++)
            set_add(low, *p);
        g_set(c, a, lead);
        for (int i = 0; i < 3; i++)
            g_set(c, a, hex);
        g_ref(c, a, k);
        a = g_alt(c, r);
        g_lit(c, a, "\\u");
        g_set(c, a, d);
        g_set(c, a, low);
        g_set(c, a, hex);
        g_set(c, a, hex);
    } else {
        for (int i = 0; i < 4; i++)
            g_set(c, a, hex);
    }
    g_ref(c, a, k);
}

/* any ::= "" | char any */
static int any_rule(rx *c) {
    if (c->any >= 0) return c->any;
    c->any = g_rule(c);
    g_alt(c, c->any);
    emit_any_char(c, c->any, c->any);
    return c->any;
}

static int compile(rx *c, int id, int k);
static int compile_ne(rx *c, int id, int k);

/* r ::= ref1 | ref2 */
static int either(rx *c, int ref1, int ref2) {
    int r = g_rule(c);
    g_ref(c, g_alt(c, r), ref1);
    g_ref(c, g_alt(c, r), ref2);
    return r;
}

/* x{lo,hi} then k (nonempty: without the empty match). The body is x, or ne(x) when x can match
 * "": then x{lo,hi} = ne(x){0,hi}, and loops over the body always read a byte. */
static int compile_rep(rx *c, const rx_node *nd, bool nonempty, int k) {
    int x = nd->off;
    bool body_ne = c->node[x].nullable;
    long lo = body_ne ? 0 : nd->min, hi = nd->max;
    if (nonempty && lo == 0) lo = 1;
    if (hi == 0 && nonempty) {
        int never = g_rule(c);
        g_never(c, never);
        return never;
    }
    if (hi == 0) return k;
    int (*body)(rx *, int, int) = body_ne ? compile_ne : compile;
    if (hi == 1) return lo == 1 ? body(c, x, k) : either(c, k, body(c, x, k));
    if (hi == RX_INF && lo <= 1) { /* S ::= k | P, P ::= body S */
        int s = g_rule(c), p = body(c, x, s);
        g_ref(c, g_alt(c, s), k);
        g_ref(c, g_alt(c, s), p);
        return lo == 0 ? s : p;
    }
    int sub = body(c, x, c->eps); /* the body alone, called from the chain */
    int t = k;
    if (hi == RX_INF) { /* t ::= k | sub t */
        t = g_rule(c);
        g_ref(c, g_alt(c, t), k);
        int a = g_alt(c, t);
        g_ref(c, a, sub);
        g_ref(c, a, t);
    }
    for (long j = lo; hi != RX_INF && j < hi; j++) { /* optional rounds: r ::= k | sub t */
        int r = g_rule(c);
        g_ref(c, g_alt(c, r), k);
        int a = g_alt(c, r);
        g_ref(c, a, sub);
        g_ref(c, a, t);
        t = r;
    }
    for (long j = 0; j < lo; j++) { /* required rounds: r ::= sub t */
        int r = g_rule(c), a = g_alt(c, r);
        g_ref(c, a, sub);
        g_ref(c, a, t);
        t = r;
    }
    return t;
}

/* A rule for node id, then k. */
static int compile(rx *c, int id, int k) {
    if (c->cost > RX_MAX_COST) return k; /* counting pass: refused anyway */
    const rx_node *nd = &c->node[id];
    const int *kid = c->kid ? c->kid + nd->off : NULL; /* no lists at all: NULL + 0 is UB */
    int r;
    switch (nd->kind) {
    case RX_EMPTY: return k;
    case RX_SET: emit_set(c, r = g_rule(c), c->iv ? c->iv + nd->off : NULL, nd->n, k); return r;
    case RX_CAT:
        for (int i = nd->n - 1; i >= 0; i--)
            k = compile(c, kid[i], k);
        return k;
    case RX_ALT:
        r = g_rule(c);
        for (int i = 0; i < nd->n; i++)
            g_ref(c, g_alt(c, r), compile(c, kid[i], k));
        return r;
    default: return compile_rep(c, nd, false, k);
    }
}

/* A rule for node id without its empty match, then k: what a loop repeats. */
static int compile_ne(rx *c, int id, int k) {
    if (c->cost > RX_MAX_COST) return k;
    const rx_node *nd = &c->node[id];
    const int *kid = c->kid ? c->kid + nd->off : NULL; /* no lists at all: NULL + 0 is UB */
    if (!nd->nullable) return compile(c, id, k);
    int r;
    switch (nd->kind) {
    case RX_CAT: { /* ne(a_0 .. a_n-1) = ne(a_i) a_i+1 .. a_n-1 for each i (a_0 .. a_i-1 "") */
        r = g_rule(c);
        for (int i = nd->n - 1; i >= 0; i--) {
            g_ref(c, g_alt(c, r), compile_ne(c, kid[i], k));
            if (i > 0) k = compile(c, kid[i], k);
        }
        return r;
    }
    case RX_ALT:
        r = g_rule(c);
        for (int i = 0; i < nd->n; i++)
            g_ref(c, g_alt(c, r), compile_ne(c, kid[i], k));
        return r;
    case RX_REP: return compile_rep(c, nd, true, k);
    default: return g_never(c, r = g_rule(c)), r; /* RX_EMPTY */
    }
}

/* content ::= the anchored branches | S, S ::= the unanchored ones | any-char S */
static int compile_top(rx *c) {
    c->cost = 0, c->n_rules = 0, c->any = -1;
    c->eps = g_rule(c);
    g_alt(c, c->eps);
    int content = g_rule(c), s = -1;
    for (int i = 0; i < c->n_br; i++) {
        const rx_branch *br = &c->br[i];
        bool caret = br->caret || c->raw, dollar = br->dollar || c->raw; /* raw: a full match */
        int r = compile(c, br->node, dollar ? c->eps : any_rule(c));
        if (!caret && s < 0) s = g_rule(c);
        g_ref(c, g_alt(c, caret ? content : s), r);
    }
    if (s >= 0) {
        emit_any_char(c, s, s);
        g_ref(c, g_alt(c, content), s);
    }
    return content;
}

static ts_status regex_rule(ts_gbuild *b, const char *pattern, size_t len, bool raw, bool python,
                            int *rule) {
    rx c = {.p = (const uint8_t *)pattern, .len = len, .raw = raw, .python = python};
    ts_status st = parse(&c);
    if (st == TS_OK) {
        compile_top(&c); /* counting */
        if (c.cost > RX_MAX_COST)
            st = ts_error(TS_ERR_UNSUPPORTED,
                          "pattern: its grammar would need over %d elements (bounds too large)",
                          RX_MAX_COST);
    }
    if (st == TS_OK) {
        c.b = b;
        *rule = compile_top(&c);
    }
    free(c.node), free(c.iv), free(c.kid), free(c.stk), free(c.tmp), free(c.br);
    return st;
}

ts_status ts_regex_rule(ts_gbuild *b, const char *pattern, size_t len, bool python, int *rule) {
    return regex_rule(b, pattern, len, false, python, rule);
}

ts_status ts_grammar_from_regex(const char *pattern, size_t len, ts_grammar **out) {
    *out = NULL;
    ts_gbuild *b;
    TS_TRY(ts_gbuild_create(&b));
    int rule = -1;
    ts_status st = regex_rule(b, pattern, len, true, false, &rule);
    if (st == TS_OK) st = ts_gbuild_finish(b, rule, out);
    ts_gbuild_free(b);
    return st;
}
