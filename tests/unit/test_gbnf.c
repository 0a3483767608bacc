/* GBNF grammars (text/gbnf.c) and choices: what llama.cpp's notation means here, checked on
 * texts each grammar must take and must refuse, and the mistakes it names by line and column. */
#include "testutil.h"
#include "text/grammar.h"

#include <string.h>

static ts_grammar *gbnf(const char *text) {
    ts_grammar *g = NULL;
    ts_status st = ts_grammar_from_gbnf(text, strlen(text), &g);
    CHECKF(st == TS_OK, "%s: %s", text, ts_last_error());
    return g;
}

static void expect(const ts_grammar *g, const char *text, bool ok) {
    CHECKF(ts_grammar_matches(g, text, strlen(text)) == ok, "'%s' should %s", text,
           ok ? "match" : "not match");
}

static void refused(const char *text, const char *words) {
    ts_grammar *g = NULL;
    ts_status st = ts_grammar_from_gbnf(text, strlen(text), &g);
    CHECKF(st == TS_ERR_INVALID && g == NULL, "%s: %d", text, st);
    CHECKF(strstr(ts_last_error(), words) != NULL, "%s: '%s' lacks '%s'", text, ts_last_error(),
           words);
}

int main(void) {
    /* llama.cpp's JSON-ish example, multi-line, comments, groups across lines */
    ts_grammar *g = gbnf("# a list of items\n"
                         "root ::= \"[\" ws ( item (\",\" ws item)* )? \"]\"\n"
                         "item ::=\n"
                         "  [a-z]+ | num   # a word or a number\n"
                         "num  ::= \"-\"? [1-9] [0-9]{0,3}\n"
                         "ws   ::= [ \\t\\n]*\n");
    if (g) {
        expect(g, "[]", true);
        expect(g, "[abc, -12,\n x]", true);
        expect(g, "[ 9999]", true);
        expect(g, "[99999]", false); /* {0,3} */
        expect(g, "[Abc]", false);
        expect(g, "[abc,]", false);
        expect(g, "[-0]", false);
        ts_grammar_free(g);
    }
    /* alternatives on continuation lines, quantifiers on groups and classes, escapes */
    g = gbnf("root ::= (\"ab\" | \"c\")+ tail?\n"
             "tail ::= \"\\x41\" [^\\n\\]]{2} \"\\u00e9\" [\\u00e0-\\u00ff]\n");
    if (g) {
        expect(g, "abcab", true);
        expect(g, "cA]xéà", false); /* ] is excluded */
        expect(g, "cAxyéà", true);
        expect(g, "cAxyéA", false);
        expect(g, "", false);
        ts_grammar_free(g);
    }
    /* `.` is any character as UTF-8, never an ill-formed byte; bounds */
    g = gbnf("root ::= . .{1,2} \"!\"");
    if (g) {
        expect(g, "ab!", true);
        expect(g, "\xf0\x9f\x98\x80\xe2\x82\xac!", true); /* 4- and 3-byte characters */
        expect(g, "\xff\x61!", false);
        expect(g, "abcd!", false);
        ts_grammar_free(g);
    }
    /* a rule used before it is defined, and recursion on the right */
    g = gbnf("root ::= list\nlist ::= \"(\" list \")\" | \"x\"");
    if (g) {
        expect(g, "((x))", true);
        expect(g, "((x)", false);
        ts_grammar_free(g);
    }
    /* mistakes, named */
    refused("root ::= foo", "'foo' is used but not defined");
    refused("item ::= \"a\"", "no rule 'root'");
    refused("root ::= \"a", "line 1, column 10: an unterminated string");
    refused("root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: a rule defined twice");
    refused("root ::= [b-a]", "below its start");
    refused("root ::= (\"a\"", "without its ')'");
    refused("root ::= \"a\"{2,1}", "below m");
    refused("root ::= \"a\"{1,5000}", "over 1000");
    refused("root ::= <[1000]>", "token terminals");
    refused("root ::= root \"a\" | \"b\"", "left-recursive");
    refused("root ::= \"\\q\"", "unknown escape");
    refused("root ::= \"\\ud800\"", "not a Unicode scalar value");
    refused("root = \"a\"", "'::=' was expected");
    /* deep nesting is refused, not a stack overflow */
    char deep[2000] = "root ::= ";
    for (int i = 0; i < 600; i++)
        strcat(deep, "(");
    refused(deep, "nested too deep");
    /* choices */
    const char *c[] = {"yes", "no", "not sure"};
    ts_grammar *ch = NULL;
    CHECK(ts_grammar_from_choices(c, 3, &ch) == TS_OK);
    if (ch) {
        expect(ch, "not sure", true);
        expect(ch, "no", true);
        expect(ch, "not", false);
        expect(ch, "yes ", false);
        ts_grammar_free(ch);
    }
    return tu_report("test_gbnf");
}
