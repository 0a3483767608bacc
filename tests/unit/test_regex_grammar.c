/* JSON Schema patterns as grammar rules (text/regex_grammar.c) and the UTF-8 range split under
 * it (text/utf8_ranges.c): for each pattern, JSON string texts that must and must not match;
 * the refusals and their messages; a long value with flat stacks; the split checked against
 * every code point; and agreement with PCRE2 on random values for the patterns whose meaning
 * PCRE2 shares. Texts are written as JSON string content (between the quotes). */
#include "testutil.h"
#include "text/grammar_int.h"
#include "text/regex_grammar.h"
#include "text/utf8.h"
#include "text/utf8_ranges.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <string.h>

/* root ::= '"' content '"', or NULL with *st when the pattern is refused. */
static ts_grammar *string_grammar(const char *pat, size_t len, ts_status *st) {
    ts_gbuild *b;
    ts_grammar *g = NULL;
    CHECK(ts_gbuild_create(&b) == TS_OK);
    int root = ts_gbuild_rule(b), content = -1;
    *st = ts_regex_rule(b, pat, len, false, &content);
    if (*st == TS_OK) {
        int a = ts_gbuild_alt(b, root);
        ts_gbuild_literal(b, a, "\"", 1);
        ts_gbuild_ref(b, a, content);
        ts_gbuild_literal(b, a, "\"", 1);
        *st = ts_gbuild_finish(b, root, &g);
        CHECKF(*st == TS_OK, "/%s/: %s", pat, ts_last_error());
    } else /* nothing written: the next rule is the one after root */
        CHECKF(ts_gbuild_rule(b) == root + 1, "/%s/ wrote rules before failing", pat);
    ts_gbuild_free(b);
    return g;
}

static bool matches(const ts_grammar *g, const char *content) {
    static char buf[1 << 16];
    size_t n = strlen(content);
    buf[0] = '"';
    memcpy(buf + 1, content, n);
    buf[n + 1] = '"';
    return ts_grammar_matches(g, buf, n + 2);
}

typedef struct {
    const char *pattern;
    const char *yes[8], *no[10];
} rx_case;

/* clang-format off */
static const rx_case CASES[] = {
    {"^\\d{3}-\\d{4}$", {"555-1234", "000-9999"},
     {"55-1234", "555-12345", "5551234", "a555-1234", "555-1234\\n", "", "555-123a"}},
    {"^[A-Z][a-z]+$", {"Hello", "Ab"}, {"hello", "A", "HeLlo", "Hello ", "\xc3\x89lan"}},
    {"^[a-z0-9._%+-]+@[a-z0-9.-]+\\.[a-z]{2,}$",
     {"john.doe+x@example.com", "a@b.co", "x_y%z@sub-d.example.org"},
     {"john@example", "@example.com", "john@example.c", "John@example.com", "a@b.c0m"}},
    {"^(\\+\\d{1,3} )?\\(?\\d{3}\\)?[ -]?\\d{3}-\\d{4}$",
     {"+1 (555) 123-4567", "555-123-4567", "(555)123-4567", "+44 555 123-4567"},
     {"+1234 555 123-4567", "555-1234-567", "(555) 123 4567", "+1 555123-456", "+1 "}},
    {"^\\d{4}-\\d{2}-\\d{2}$", {"2024-01-31"},
     {"2024-1-31", "24-01-31", "2024/01/31", "2024-01-31x", " 2024-01-31"}},
    /* unanchored: a search, with any JSON string content around the match */
    {"abc", {"abc", "xxabcyy", "\\\"abc\\\\", "\xc3\xa9\xf0\x9f\x98\x80" "abc\\n", "\\u0041abc"},
     {"ab", "", "abx c", "ABC", "a\\nbc"}},
    {"^abc", {"abc", "abcxyz", "abc\\\""}, {"xabc", "ab", "Abc", " abc"}},
    {"abc$", {"abc", "xyzabc", "\\nabc"}, {"abcx", "abc\\n", "abc "}},
    {"^(cat|dog)s?$", {"cat", "dogs", "cats"}, {"catdog", "cas", "dogss", "", "Cat"}},
    {"^a|b$", {"a", "ab", "axx", "xb", "b"}, {"xa", "bx", ""}},
    /* '"' and '\' exist only as their escapes; a class without them cannot produce them */
    {"^[^\"]*$", {"", "abc", "it's", "a\\\\b", "tab\\there", "\\u0001"},
     {"\\\"", "say \\\"hi\\\"", "\"", "a\\"}},
    {"^\"\\\\$", {"\\\"\\\\"}, {"\\\"", "\\\\", "\\\"\\\\\\\\", "\\\\\\\""}},
    /* `.` is anything but a line terminator */
    {"^.*$", {"", "any thing", "\xc3\xa9\xf0\x9f\x98\x80", "\\t", "\\\""},
     {"\\n", "a\\nb", "\\r", "\xe2\x80\xa8", "\xe2\x80\xa9"}},
    {"^.$", {"a", "\\\\", "\\u0001", "\xf4\x8f\xbf\xbf"}, {"", "ab", "\\n"}},
    {"^[\\s\\S]*$", {"", "\\n", "a\\r\\nb", "\\u0001", "\\\"\\\\", "\\u001f\\b\\f"},
     {"\\x", "\n", "\xff", "\\u000A", "\\u000a"}},
    /* controls: the short escape where JSON has one, else \u00xx in lowercase */
    {"^[\\x00-\\x1f]$", {"\\u0000", "\\u001f", "\\n", "\\b", "\\u000b", "\\t", "\\u001a"},
     {"\\u000B", "\\u000a", "\x01", "\t", "\\u0020", "\\u001A"}},
    {"^a\tb$", {"a\\tb"}, {"a\tb", "a\\u0009b", "ab"}},
    {"^a\\tb$", {"a\\tb"}, {"a\tb", "a\\u0009b"}},
    /* non-ASCII: exact UTF-8 */
    {"^\xc3\xa9+$", {"\xc3\xa9", "\xc3\xa9\xc3\xa9\xc3\xa9"},
     {"", "e", "\xc3\xa9" "a", "\xc3", "\\u00e9"}},
    {"^[\xd0\xb0-\xd1\x8f]+$", {"\xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82", "\xd1\x8f"},
     {"\xd0\x9f\xd1\x80\xd0\xb8", "\xd1\x91", "abc", ""}},
    {"^[^a-z]+$", {"\xc3\x80\xc3\x89\xe2\x82\xac\xf0\x9f\x98\x80", "ABC 123", "\\n\\t", "\\\"\\\\"},
     {"abc", "Aa", "", "\xc3\x28", "\xed\xa0\x80", "\xc0\x80", "\xf4\x90\x80\x80", "\xe0\x9f\xbf",
      "\xf0\x9f\x98"}},
    {"^\\u00e9$", {"\xc3\xa9"}, {"e", "\\u00e9", "\xc3\xa9\xc3\xa9"}},
    {"^\\uD83D\\uDE00$", {"\xf0\x9f\x98\x80"}, {"\\ud83d\\ude00", "\xed\xa0\xbd\xed\xb8\x80"}},
    {"^[\xf0\x9f\x98\x80-\xf0\x9f\x98\x82]$", {"\xf0\x9f\x98\x80", "\xf0\x9f\x98\x82"},
     {"\xf0\x9f\x98\x83", "\xf0\x9f\x98\xbf"}},
    /* ECMA-262's \s: Unicode spaces too, so \S leaves them out */
    {"\\s", {" ", "a\\tb", "\xc2\xa0", "\xe3\x80\x80", "\\u000b"}, {"abc", "", "\\u0001"}},
    {"^\\S+$", {"abc", "\xc3\xa9"}, {"a b", "a\xc2\xa0" "b", "\xef\xbb\xbf", "\\n"}},
    /* quantifiers, counts, empty loops */
    {"^a{2,4}$", {"aa", "aaa", "aaaa"}, {"a", "aaaaa", ""}},
    {"^a{3}$", {"aaa"}, {"aa", "aaaa"}},
    {"^a{3,}$", {"aaa", "aaaaaaa"}, {"aa", ""}},
    {"^(ab)*$", {"", "ab", "ababab"}, {"a", "aba", "ba"}},
    {"^(a|)+$", {"", "a", "aaa"}, {"b", "ab"}},
    {"^(a*)*$", {"", "aaa"}, {"b"}},
    {"^(a*b*)*c$", {"c", "abbac", "bc"}, {"ab", "ca", ""}},
    {"^(a?){2,3}$", {"", "a", "aa", "aaa"}, {"aaaa", "b"}},
    {"^(|a)*b$", {"b", "aab"}, {"", "ba"}},
    {"^a*?b$", {"b", "aaab"}, {"", "ba", "aaa"}},
    {"^(?:a|bc)+?$", {"a", "bca", "abcbc"}, {"", "b", "cb"}},
    {"^(a{1,3}b{2}){2,4}$", {"abbaabb", "aaabbabbabbabb"}, {"abb", "aaaabbabb", "abbabbabbabbabb"}},
    {"^x(y{3,}z|w{0,2})+$", {"x", "xyyyz", "xwwyyyyz", "xwwwwww"}, {"xyyz", "xy", "y"}},
    {"a{0}b", {"b", "ab"}, {"a", ""}},
    /* classes and escapes */
    {"^[\\w.-]{2,5}@", {"a.b@", "ab@x", "_-@"}, {"a@", "abcdef@", ".@"}},
    {"^[]a$", {NULL}, {"a", "", "]a"}},
    {"^[^]$", {"\\n", "x"}, {"", "xy"}},
    {"^[\\b]$", {"\\b"}, {"b", "\\u0008"}},
    {"^[-a]+[a-]*[\\--/]?$", {"a--/", "-", "a."}, {"b", "a0"}},
    {"^\\/\\-\\.\\*\\{\\}\\[\\]\\(\\)\\|\\?\\+\\^\\$$", {"/-.*{}[]()|?+^$"}, {"\\/-.*{}[]()|?+^$"}},
    {"^[{}]}{$", {"}}{"}, {"{}", "}{"}},
    {"^\\x41\\0?$", {"A", "A\\u0000"}, {"a", "A\\u0001"}},
    {"", {"", "anything"}, {"\\q", "\x80"}},
    {"^$", {""}, {"a", "\\n"}},
};
/* clang-format on */

static void test_cases(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        const rx_case *t = &CASES[i];
        ts_status st;
        ts_grammar *g = string_grammar(t->pattern, strlen(t->pattern), &st);
        CHECKF(g, "/%s/: %s", t->pattern, ts_last_error());
        if (!g) continue;
        for (int j = 0; j < 8 && t->yes[j]; j++)
            CHECKF(matches(g, t->yes[j]), "/%s/ refused \"%s\"", t->pattern, t->yes[j]);
        for (int j = 0; j < 10 && t->no[j]; j++)
            CHECKF(!matches(g, t->no[j]), "/%s/ took \"%s\"", t->pattern, t->no[j]);
        ts_grammar_free(g);
    }
}

static void test_spelling(void) {
    /* One spelling per matched character: "abc" written with an escape decodes to a match, but
     * the grammar only writes the plain one (a model never needs another). Outside the match
     * the content is free, escapes included. */
    ts_status st;
    ts_grammar *g = string_grammar("^abc$", 5, &st);
    CHECK(g && matches(g, "abc") && !matches(g, "a\\u0062c") && !matches(g, "\\u0061bc"));
    ts_grammar_free(g);
    g = string_grammar("b", 1, &st);
    CHECK(g && matches(g, "\\u0061b\\/\\uD83D\\uDE00\\u00E9") && !matches(g, "\\u0062"));
    ts_grammar_free(g);
}

typedef struct {
    const char *pattern;
    ts_status st;
    const char *msg; /* part of the message */
} rx_refusal;

static void test_refusals(void) {
    static const rx_refusal R[] = {
        {"ab(?=c)", TS_ERR_UNSUPPORTED, "lookahead at byte 2"},
        {"(?!a)", TS_ERR_UNSUPPORTED, "lookahead"},
        {"(?<=a)b", TS_ERR_UNSUPPORTED, "lookbehind"},
        {"(?<!a)b", TS_ERR_UNSUPPORTED, "lookbehind"},
        {"(?<n>a)", TS_ERR_UNSUPPORTED, "named group"},
        {"(?i)a", TS_ERR_UNSUPPORTED, "group flag"},
        {"(a)\\1", TS_ERR_UNSUPPORTED, "backreference or octal escape \\1 at byte 3"},
        {"\\k<n>", TS_ERR_UNSUPPORTED, "named backreference"},
        {"\\bword", TS_ERR_UNSUPPORTED, "word boundary \\b at byte 0"},
        {"a\\B", TS_ERR_UNSUPPORTED, "word boundary \\B at byte 1"},
        {"\\p{L}", TS_ERR_UNSUPPORTED, "property escape \\p"},
        {"[\\P{L}]", TS_ERR_UNSUPPORTED, "property escape \\P"},
        {"\\cJ", TS_ERR_UNSUPPORTED, "escape \\c"},
        {"\\u{1F600}", TS_ERR_UNSUPPORTED, "\\u{...}"},
        {"\\uD800", TS_ERR_UNSUPPORTED, "lone surrogate"},
        {"\\01", TS_ERR_UNSUPPORTED, "octal"},
        {"[\\d-z]", TS_ERR_UNSUPPORTED, "range end at byte 3"},
        {"a{1,5000}", TS_ERR_UNSUPPORTED, "bound over 1000 in the quantifier at byte 1"},
        {"a{1001}", TS_ERR_UNSUPPORTED, "bound over 1000"},
        {"a{,3}", TS_ERR_UNSUPPORTED, "{,n} at byte 1"},
        {"a^b", TS_ERR_UNSUPPORTED, "anchor ^ at byte 1"},
        {"a$b", TS_ERR_UNSUPPORTED, "anchor $ at byte 1"},
        {"(^a)", TS_ERR_UNSUPPORTED, "anchor ^ at byte 1"},
        {"(a$)|b", TS_ERR_UNSUPPORTED, "anchor $ at byte 2"},
        {"[z-a]", TS_ERR_INVALID, "out of order at byte 2"},
        {"(abc", TS_ERR_INVALID, "unclosed group at byte 0"},
        {"a(b(c)", TS_ERR_INVALID, "unclosed group at byte 1"},
        {"abc)", TS_ERR_INVALID, "unmatched ) at byte 3"},
        {"[abc", TS_ERR_INVALID, "unclosed class at byte 0"},
        {"*a", TS_ERR_INVALID, "nothing to repeat"},
        {"a**", TS_ERR_INVALID, "nothing to repeat"},
        {"a{2}{3}", TS_ERR_INVALID, "nothing to repeat"},
        {"^*", TS_ERR_INVALID, "nothing to repeat"},
        {"(|*)", TS_ERR_INVALID, "nothing to repeat"},
        {"a{3,2}", TS_ERR_INVALID, "out of order"},
        {"\\u12", TS_ERR_INVALID, "bad \\u escape"},
        {"\\x4", TS_ERR_INVALID, "bad \\x escape"},
        {"ab\\", TS_ERR_INVALID, "at the end (byte 2)"},
        {"a\xff", TS_ERR_INVALID, "invalid UTF-8 at byte 1"},
    };
    for (size_t i = 0; i < sizeof R / sizeof *R; i++) {
        ts_status st;
        ts_grammar *g = string_grammar(R[i].pattern, strlen(R[i].pattern), &st);
        CHECKF(!g && st == R[i].st, "/%s/: %d", R[i].pattern, (int)st);
        CHECKF(strstr(ts_last_error(), R[i].msg), "/%s/: \"%s\"", R[i].pattern, ts_last_error());
        ts_grammar_free(g);
    }
    /* nesting and size limits */
    char deep[200] = {0};
    memset(deep, '(', 65), memset(deep + 65, ')', 65);
    ts_status st;
    ts_grammar *g = string_grammar(deep, strlen(deep), &st);
    CHECK(!g && st == TS_ERR_UNSUPPORTED && strstr(ts_last_error(), "nested"));
    deep[64] = 'a', deep[129] = 0; /* 64 deep is fine */
    g = string_grammar(deep, strlen(deep), &st);
    CHECK(g && matches(g, "a"));
    ts_grammar_free(g);
    char big[400] = {0};
    for (int i = 0; i < 30; i++)
        strcat(big, "a{0,1000}");
    g = string_grammar(big, strlen(big), &st);
    CHECK(!g && st == TS_ERR_UNSUPPORTED && strstr(ts_last_error(), "elements"));
    /* nested bounds add, not multiply */
    g = string_grammar("^((a{2,1000}b){1,1000}c){1000}$", 30, &st);
    CHECK(g != NULL);
    ts_grammar_free(g);
}

static int deepest_stack(const ts_grammar_matcher *m) {
    int most = 0;
    for (int i = 0; i < m->n_cur; i++) {
        int depth = 0;
        for (int32_t s = m->buf[i]; s >= 0; s = m->node[s].parent)
            depth++;
        if (depth > most) most = depth;
    }
    return most;
}

static void test_long_values(void) {
    enum { N = 10000 };
    static char text[N + 8];
    ts_status st;
    ts_grammar *g = string_grammar("^[a-z]*$", 8, &st);
    memset(text, 'q', N);
    text[N] = 0;
    CHECK(g && matches(g, text));
    ts_grammar_matcher *m;
    CHECK(ts_grammar_matcher_create(g, NULL, &m) == TS_OK);
    CHECK(ts_grammar_matcher_accept_bytes(m, "\"", 1));
    int most = 0;
    for (int i = 0; i < N; i++) {
        CHECK(ts_grammar_matcher_accept_bytes(m, "q", 1));
        int d = deepest_stack(m);
        most = d > most ? d : most;
    }
    CHECKF(most <= 3, "a stack %d deep", most);
    CHECK(!ts_grammar_matcher_accept_bytes(m, "A", 1));
    CHECK(ts_grammar_matcher_accept_bytes(m, "\"", 1) && ts_grammar_matcher_done(m));
    ts_grammar_matcher_free(m);
    text[N / 2] = '0';
    CHECK(!matches(g, text));
    ts_grammar_free(g);
    /* unanchored, the match at the end of a long value; and counted repetition */
    g = string_grammar("abc", 3, &st);
    memcpy(text + N, "abc", 4);
    CHECK(g && matches(g, text));
    text[N + 2] = 'C';
    CHECK(g && !matches(g, text));
    ts_grammar_free(g);
    g = string_grammar("^(ab){0,1000}$", 14, &st);
    for (int i = 0; i < 2000; i++)
        text[i] = "ab"[i % 2];
    text[2000] = 0;
    CHECK(g && matches(g, text) && !matches(g, text + 1));
    memcpy(text + 2000, "ab", 3);
    CHECK(g && !matches(g, text));
    ts_grammar_free(g);
}

/* Every code point of [lo, hi] but the surrogates is matched by exactly one sequence, and the
 * sequences hold no more byte strings than that: nothing else (ill-formed UTF-8) matches. */
static void check_ranges(uint32_t lo, uint32_t hi) {
    ts_utf8_seq seq[TS_UTF8_SEQ_MAX];
    int n = ts_utf8_ranges(lo, hi, seq);
    CHECK(n < TS_UTF8_SEQ_MAX);
    long strings = 0, points = 0;
    for (int s = 0; s < n; s++) {
        long k = 1;
        for (int j = 0; j < seq[s].n; j++)
            k *= seq[s].hi[j] - seq[s].lo[j] + 1;
        strings += k;
    }
    for (uint32_t cp = lo; cp <= hi && cp <= 0x10FFFF; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        points++;
        char e[4];
        int len = (int)ts_utf8_encode(cp, e), hits = 0;
        for (int s = 0; s < n; s++) {
            bool in = seq[s].n == len;
            for (int j = 0; in && j < len; j++)
                in = (uint8_t)e[j] >= seq[s].lo[j] && (uint8_t)e[j] <= seq[s].hi[j];
            hits += in;
        }
        if (hits != 1) {
            CHECKF(hits == 1, "U+%04X in [%X, %X]: %d sequences", cp, lo, hi, hits);
            return;
        }
    }
    CHECKF(strings == points, "[%X, %X]: %ld byte strings for %ld code points", lo, hi, strings,
           points);
}

static void test_utf8_ranges(void) {
    check_ranges(0, 0x10FFFF);
    check_ranges(0x80, 0x10FFFF);
    check_ranges(0x7F, 0x800);
    check_ranges(0xD000, 0xE0FF);
    check_ranges(0x10000, 0x10FFFF);
    check_ranges(0x430, 0x44F);
    CHECK(ts_utf8_ranges(0xD800, 0xDFFF, (ts_utf8_seq[TS_UTF8_SEQ_MAX]){0}) == 0);
    unsigned long long rng = 12345;
    for (int i = 0; i < 40; i++) {
        uint32_t a = (uint32_t)(tu_rng_next(&rng) % 0x110000);
        uint32_t span = (uint32_t)(tu_rng_next(&rng) % (i < 20 ? 0x1000 : 0x110000));
        check_ranges(a, a + span > 0x10FFFF ? 0x10FFFF : a + span);
    }
}

typedef struct {
    const char *pattern, *seed[3]; /* seeds: values that match, mutated into near misses */
} rx_diff;

/* A random value: random characters, or a seed with up to 3 characters inserted, dropped or
 * replaced. Returns the length in code points. */
static int draw(const rx_diff *d, unsigned long long *rng, uint32_t *v) {
    static const uint32_t A[] = {'a',  'b',   'c',   'd',    '0',     '1',    '2',      '9',
                                 '.',  '@',   '-',   ':',    '"',     '\\',   '\n',     0x01,
                                 0xE9, 0x431, 0x44F, 0x20AC, 0x1F600, 0xFFFF, 0x10FFFF, ' '};
    int n = 0, k = (int)(tu_rng_next(rng) % 4);
    if (k < 3 && d->seed[k]) { /* a seed's code points */
        const char *s = d->seed[k];
        for (size_t i = 0, len, m = strlen(s); i < m && n < 16; i += len)
            ts_utf8_next(s + i, m - i, &v[n++], &len);
    } else
        k = 3;
    for (int i = 0, steps = k < 3 ? (int)(tu_rng_next(rng) % 4) : (int)(tu_rng_next(rng) % 9);
         i < steps; i++) {
        uint32_t c = A[tu_rng_next(rng) % (tu_rng_next(rng) % 2 ? 8 : 24)];
        int at = n ? (int)(tu_rng_next(rng) % (unsigned)(n + 1)) : 0,
            op = k < 3 ? (int)(tu_rng_next(rng) % 3) : 0;
        if (op == 0 && n < 16) { /* insert */
            memmove(v + at + 1, v + at, (size_t)(n - at) * sizeof *v);
            v[at] = c, n++;
        } else if (op == 1 && at < n) /* drop */
            memmove(v + at, v + at + 1, (size_t)(n - at - 1) * sizeof *v), n--;
        else if (at < n)
            v[at] = c;
    }
    return n;
}

/* value (code points) as JSON string content, in the one spelling the grammar writes */
static size_t json_content(const uint32_t *v, int n, char *out) {
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        uint32_t c = v[i];
        const char *sh = c == '"'    ? "\\\""
                         : c == '\\' ? "\\\\"
                         : c == '\n' ? "\\n"
                         : c == '\r' ? "\\r"
                         : c == '\t' ? "\\t"
                         : c == '\b' ? "\\b"
                         : c == '\f' ? "\\f"
                                     : NULL;
        if (sh)
            len += (size_t)sprintf(out + len, "%s", sh);
        else if (c < 0x20)
            len += (size_t)sprintf(out + len, "\\u%04x", c);
        else
            len += ts_utf8_encode(c, out + len);
    }
    return len;
}

static void test_against_pcre2(void) {
    /* Patterns where PCRE2 (UTF, $ only at the very end) means what ECMA-262 does: no `.`, no
     * \s, no dialect-specific escapes. */
    static const rx_diff P[] = {
        {"^\\d{3}-\\d{4}$", {"555-1234"}},
        {"^[a-c]+@[a-c.]+\\.[a-c]{2,}$", {"ab@c.ab", "a.b@b.c.cc"}},
        {"abc", {"abc", "xabcx"}},
        {"^ab", {"ab", "abc"}},
        {"bc$", {"bc", "abc"}},
        {"^(ab|a)(bc|c)?$", {"abc", "a", "ab"}},
        {"^(a|b?){0,3}c{2,}$", {"abcc", "ccc"}},
        {"(a|ab)(c|bcd)(d*)", {"abcd", "ac"}},
        {"^[^a\"\\\\]{1,3}\\\\?$", {"b\\", "\xc3\xa9\"", "bcd"}},
        {"^(a*b*)*c$", {"abbac", "c"}},
        {"((a?)*)*b", {"aab", "b"}},
        {"^(?:[01]\\d|2[0-3]):[0-5]\\d$", {"23:59", "09:00"}},
        {"^[^\\x00-\\x7f]+\\d?$",
         {"\xc3\xa9\xe2\x82\xac"
          "1",
          "\xf0\x9f\x98\x80"}},
        {"^\\w+\\W\\w*$", {"ab-c", "a\xc3\xa9"}},
        {"^(a{1,2}b){2,3}|c$", {"abaab", "c", "ababab"}},
        {"^[\xd0\xb0-\xd1\x8f\\d]{2,}$",
         {"\xd0\xb1\xd1\x8f"
          "1",
          "12"}},
        {"^(\\d+(\\.\\d+)?|x)$", {"3.14", "x", "10"}},
        {"^[^a-c]{2}(d|\\\\)+$",
         {"\n\"d", "\xf4\x8f\xbf\xbf"
                   "0\\\\"}},
    };
    unsigned long long rng = 777;
    static uint32_t v[17];
    static char text[256], utf8[128];
    for (size_t p = 0; p < sizeof P / sizeof *P; p++) {
        const char *pat = P[p].pattern;
        ts_status st;
        ts_grammar *g = string_grammar(pat, strlen(pat), &st);
        int err;
        PCRE2_SIZE off;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &err, &off, NULL);
        pcre2_match_data *md = re ? pcre2_match_data_create_from_pattern(re, NULL) : NULL;
        CHECKF(g && re && md, "/%s/", pat);
        int hits = 0, t = 0;
        for (; g && md && t < 3000; t++) {
            int n = draw(&P[p], &rng, v);
            size_t len = json_content(v, n, text), ulen = 0;
            text[len] = 0;
            for (int i = 0; i < n; i++)
                ulen += ts_utf8_encode(v[i], utf8 + ulen);
            bool want = pcre2_match(re, (PCRE2_SPTR)utf8, ulen, 0, 0, md, NULL) >= 0;
            bool got = matches(g, text);
            hits += want;
            if (got != want) {
                CHECKF(got == want, "/%s/ \"%s\": grammar %d, PCRE2 %d", pat, text, got, want);
                break;
            }
        }
        CHECKF(hits > 100 && hits < t - 100, "/%s/: %d of %d values match", pat, hits, t);
        pcre2_match_data_free(md);
        pcre2_code_free(re);
        ts_grammar_free(g);
    }
}

/* ts_grammar_from_regex: plain text (vLLM's guided_regex), the whole text matched, every
 * character as itself - quotes, backslashes and controls too. */
static void test_plain_text(void) {
    static const struct {
        const char *pattern, *text;
        bool ok;
    } cases[] = {
        {"(yes|no), [0-9]+", "no, 42", true},
        {"(yes|no), [0-9]+", "x no, 42", false},
        {"(yes|no), [0-9]+", "no, 42 ", false},
        {"\"[^\"]*\"", "\"a\\b\"", true},
        {"a\nb", "a\nb", true},
        {".+", "line\nbreak", false},
        {"[\\s\\S]{2}", "\t\x01", true},
        {"^é+$", "ééé", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ts_grammar *g = NULL;
        ts_status st = ts_grammar_from_regex(cases[i].pattern, strlen(cases[i].pattern), &g);
        CHECKF(st == TS_OK, "%s: %s", cases[i].pattern, ts_last_error());
        if (!g) continue;
        CHECKF(ts_grammar_matches(g, cases[i].text, strlen(cases[i].text)) == cases[i].ok,
               "/%s/ on '%s'", cases[i].pattern, cases[i].text);
        ts_grammar_free(g);
    }
    ts_grammar *g = NULL;
    CHECK(ts_grammar_from_regex("(?=a)", 5, &g) == TS_ERR_UNSUPPORTED && g == NULL);
}

int main(void) {
    test_plain_text();
    test_cases();
    test_spelling();
    test_refusals();
    test_long_values();
    test_utf8_ranges();
    test_against_pcre2();
    return tu_report("test_regex_grammar");
}
