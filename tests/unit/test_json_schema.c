/* JSON Schema → grammar (text/json_schema.c): JSON mode, each supported keyword accepting the
 * texts it should and rejecting the others byte for byte, and the refusals (unsupported
 * keywords named with their place, invalid schemas, bounds too large). */
#include "testutil.h"
#include "text/grammar.h"

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

static ts_grammar *compile(const char *schema) {
    ts_grammar *g = NULL;
    ts_status st = ts_grammar_from_json_schema(schema, schema ? strlen(schema) : 0, &g);
    CHECKF(st == TS_OK && g, "schema %s: %d %s", schema ? schema : "(JSON mode)", (int)st,
           ts_last_error());
    return st == TS_OK ? g : NULL;
}

static bool match(const ts_grammar *g, const char *text) {
    return g && ts_grammar_matches(g, text, strlen(text));
}

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Each text of yes is a sentence of the schema's grammar and none of no is. */
static void expect(const char *schema, const char *const *yes, const char *const *no) {
    ts_grammar *g = compile(schema);
    if (!g) return;
    for (; yes && *yes; yes++)
        CHECKF(match(g, *yes), "schema %s should accept [%s]", schema ? schema : "(JSON mode)",
               *yes);
    for (; no && *no; no++)
        CHECKF(!match(g, *no), "schema %s should reject [%s]", schema ? schema : "(JSON mode)",
               *no);
    ts_grammar_free(g);
}

/* The schema is refused with code and a message that contains want. */
static void refused(const char *schema, ts_status code, const char *want) {
    ts_grammar *g = (ts_grammar *)&g; /* must come back NULL */
    ts_status st = ts_grammar_from_json_schema(schema, strlen(schema), &g);
    CHECKF(st == code, "schema %s: status %d, want %d (%s)", schema, (int)st, (int)code,
           st ? ts_last_error() : "accepted");
    CHECKF(g == NULL, "schema %s: output not NULL", schema);
    if (st != TS_OK)
        CHECKF(strstr(ts_last_error(), want), "schema %s: message [%s] lacks [%s]", schema,
               ts_last_error(), want);
    if (st == TS_OK) ts_grammar_free(g);
}

static void test_json_mode(void) {
    expect(
        NULL,
        LIST("{}", "{ }", "{\"a\":1}", "{\"a\":{\"b\":[1,2,{\"c\":null}]},\"d\":\"x\"}",
             "{\"a\": true, \"b\": false, \"c\": null}", "\n\n{\"a\":[]}", " \t{}",
             "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": {}\n}",
             "{\"s\":\"\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf\"}", /* 2,3,4 bytes */
             "{\"e\":\"\\u00e9\\n\\t\\\"\\\\\\/\\b\\f\\r\\uABCD\"}",
             "{\"n\":[-0.5e+10,0,12,1.25,3E-2,-0,1e5,9999999999999999,1.5e-99,9e99]}",
             "{\"x\":[[],[[]],{}]}", "{\"\":\"\"}", "{\"a\":\"\x7f\"}",
             "{\n                    \"a\":1}", /* newline and 20 spaces */
             "\n\n\n\n\n\n\n\n{}"),             /* 8 leading newlines */
        LIST("[1]", "\"x\"", "1", "null", "", "{}x", "{} ", "{}\n", "{} {}", "{\"a\":1}}",
             "{\"a\":\"\xc0\xaf\"}",                 /* overlong */
             "{\"a\":\"\xed\xa0\x80\"}",             /* surrogate */
             "{\"a\":\"\xf5\x80\x80\x80\"}",         /* beyond U+10FFFF */
             "{\"a\":\"\xf4\x90\x80\x80\"}",         /* beyond U+10FFFF */
             "{\"a\":\"\xe0\x80\xaf\"}",             /* overlong */
             "{\"a\":\"\x80\"}", "{\"a\":\"\xc3\"}", /* lone continuation, truncated */
             "{\"a\":\"line\nbreak\"}", "{\"a\":\"tab\there\"}", "{\"a\":01}", "{\"a\":1.}",
             "{\"a\":.5}", "{\"a\":+1}", "{\"a\":1e}", "{\"a\":--1}", "{\"a\":0x1}",
             "{\"a\":12345678901234567}",   /* 17 integer digits */
             "{\"a\":1.12345678901234567}", /* 17 fraction digits */
             "{\"a\":1e123}",               /* 3 exponent digits: not a finite double */
             "{\"a\":\"\\x\"}", "{\"a\":\"\\u12g4\"}", "{\"a\":\"\\u12\"}", "{\"a\":\"x}",
             "{  }",                             /* two spaces */
             "{\n                     \"a\":1}", /* newline and 21 spaces */
             "\n\n\n\n\n\n\n\n\n{}",             /* 9 leading newlines */
             "{\"a\":1,}", "{,\"a\":1}", "{\"a\"}", "{'a':1}", "{a:1}", "{\"a\":tru}",
             "{\"a\":True}", "{\"a\":[1,]}", "{\"a\":[,1]}", "{\"a\":1 \"b\":2}", "{\"a\":NaN}"));

    /* a long string and a long array: right recursion, no stack growth */
    ts_grammar *g = compile(NULL);
    static char big[20010];
    memcpy(big, "{\"s\":\"", 6);
    memset(big + 6, 'x', 20000);
    memcpy(big + 20006, "\"}", 3);
    CHECK(match(g, big));
    for (int i = 0; i < 20000; i += 2) /* {"s":[1,1,...,1]} */
        big[6 + i] = '1', big[7 + i] = ',';
    big[5] = '[', big[20005] = ']', big[20006] = '}', big[20007] = 0;
    CHECK(match(g, big));
    ts_grammar_free(g);
}

static const char *const props[3] = {"\"a\":1", "\"b\":\"x\"", "\"c\":true"};

/* {"a": integer, "b": string, "c": boolean} with the properties in req required: every subset
 * of them in order is accepted iff it holds the required ones, compact and pretty-printed. */
static void test_optional_combinations(void) {
    for (int req = 0; req < 8; req++) {
        char schema[512], list[64] = "";
        for (int i = 0; i < 3; i++)
            if (req >> i & 1) {
                if (list[0]) strcat(list, ",");
                strcat(list, i == 0 ? "\"a\"" : i == 1 ? "\"b\"" : "\"c\"");
            }
        snprintf(schema, sizeof schema,
                 "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
                 "\"b\":{\"type\":\"string\"},\"c\":{\"type\":\"boolean\"}},\"required\":[%s]}",
                 list);
        ts_grammar *g = compile(schema);
        if (!g) continue;
        for (int sub = 0; sub < 8; sub++) {
            char compact[128] = "{", pretty[128] = "{";
            bool first = true;
            for (int i = 0; i < 3; i++)
                if (sub >> i & 1) {
                    strcat(compact, first ? "" : ",");
                    strcat(pretty, first ? "\n  " : ",\n  ");
                    strcat(compact, props[i]);
                    strcat(pretty, props[i]);
                    first = false;
                }
            strcat(compact, "}");
            strcat(pretty, first ? "}" : "\n}");
            bool want = (sub & req) == req;
            CHECKF(match(g, compact) == want, "%s: [%s] %s", schema, compact,
                   want ? "rejected" : "accepted");
            CHECKF(match(g, pretty) == want, "%s: [%s] %s", schema, pretty,
                   want ? "rejected" : "accepted");
        }
        /* wrong order, misplaced commas, an extra key: never */
        const char *bad[] = {"{\"b\":\"x\",\"a\":1,\"c\":true}",
                             "{\"c\":true,\"a\":1}",
                             "{\"a\":1,,\"c\":true}",
                             "{,\"a\":1,\"b\":\"x\",\"c\":true}",
                             "{\"a\":1,\"b\":\"x\",\"c\":true,}",
                             "{\"a\":1,\"b\":\"x\",\"c\":true,\"d\":1}",
                             "{\"a\":1\"b\":\"x\"\"c\":true}",
                             "{\"a\":1.5,\"b\":\"x\",\"c\":true}",
                             "{\"a\":1,\"b\":2,\"c\":true}",
                             "{\"a\":1,\"a\":1,\"b\":\"x\",\"c\":true}"};
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
            CHECKF(!match(g, bad[i]), "%s: [%s] accepted", schema, bad[i]);
        ts_grammar_free(g);
    }
}

static void test_objects(void) {
    /* additionalProperties absent with properties: no extra keys (deliberate) */
    expect("{\"properties\":{\"a\":{\"type\":\"integer\"}}}", LIST("{}", "{\"a\":1}"),
           LIST("{\"a\":1,\"b\":2}", "{\"b\":2}", "[]"));
    expect("{\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":false}",
           LIST("{\"a\":1}"), LIST("{\"a\":1,\"b\":2}"));
    expect("{\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":true}",
           LIST("{}", "{\"a\":1}", "{\"a\":1,\"x\":[1,{\"y\":null}]}", "{\"x\":1}",
                "{\"a\":1, \"x\":\"s\", \"y\":2}"),
           /* not rejected: {"a":"s"}, where "a" is read as an extra key (extra keys are any
            * string, known ones included; json_schema.c says so) */
           LIST("{\"a\":1,}", "{\"a\":1 \"x\":1}", "{\"x\":1,\"a\":1,}"));
    expect("{\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"],"
           "\"additionalProperties\":{\"type\":\"string\"}}",
           LIST("{\"a\":1}", "{\"a\":1,\"x\":\"s\",\"y\":\"t\"}"),
           LIST("{}", "{\"a\":1,\"x\":2}", "{\"x\":\"s\"}"));
    expect("{\"additionalProperties\":{\"type\":\"integer\"}}", LIST("{}", "{\"x\":1,\"y\":2}"),
           LIST("{\"x\":\"s\"}", "[]"));
    /* an object with no properties keyword: any object */
    expect("{\"type\":\"object\"}", LIST("{}", "{\"k\":[1,\"v\"]}"), LIST("[]", "1"));
    /* keys are matched as jansson encodes them; keys needing escapes, unicode keys */
    expect("{\"properties\":{\"q\\\"k\":{\"type\":\"null\"},\"\xc3\xa9\":{\"type\":\"null\"}},"
           "\"required\":[\"q\\\"k\",\"\xc3\xa9\"]}",
           LIST("{\"q\\\"k\":null,\"\xc3\xa9\":null}"), LIST("{\"qk\":null,\"\xc3\xa9\":null}"));
    /* a property whose schema is false may not appear */
    expect("{\"properties\":{\"a\":false,\"b\":{\"type\":\"null\"}}}", LIST("{}", "{\"b\":null}"),
           LIST("{\"a\":1}", "{\"a\":null,\"b\":null}"));
    /* properties without type: object implied; nested objects */
    expect("{\"properties\":{\"p\":{\"properties\":{\"q\":{\"type\":\"integer\"}},"
           "\"required\":[\"q\"]}},\"required\":[\"p\"]}",
           LIST("{\"p\":{\"q\":1}}", "{ \"p\" : { \"q\" : 1 } }"),
           LIST("{\"p\":{}}", "{\"p\":1}", "{}"));
    /* 200 optional properties: the last one alone is reachable */
    static char big[16384];
    strcpy(big, "{\"properties\":{");
    for (int i = 0; i < 200; i++)
        snprintf(big + strlen(big), sizeof big - strlen(big), "%s\"p%d\":{\"type\":\"integer\"}",
                 i ? "," : "", i);
    strcat(big, "}}");
    expect(big, LIST("{}", "{\"p199\":1}", "{\"p0\":1,\"p199\":2}", "{\"p5\":1,\"p100\":2}"),
           LIST("{\"p199\":1,\"p0\":1}", "{\"p200\":1}"));
}

static void test_literals(void) {
    expect("{\"enum\":[\"red\",\"green\",1,null,{\"a\":[1,2]},0.1,true,-2.5,\"\xc3\xa9\"]}",
           LIST("\"red\"", "\"green\"", "1", "null", "{\"a\":[1,2]}", "0.1", "true", "-2.5",
                "\"\xc3\xa9\"", " \"red\""),
           LIST("\"blue\"", "\"Red\"", "{\"a\": [1,2]}", "{ \"a\":[1,2]}", "0.10", "1.0", "false",
                "\"red\" ", "\"\\u00e9\""));
    expect("{\"const\":{\"k\":\"v\",\"n\":[1,null]}}", LIST("{\"k\":\"v\",\"n\":[1,null]}"),
           LIST("{\"n\":[1,null],\"k\":\"v\"}", "{\"k\": \"v\",\"n\":[1,null]}", "{}"));
    expect("{\"const\":\"a/b\"}", LIST("\"a/b\""), LIST("\"a\\/b\""));
    /* type filters enum values; const must also be in enum */
    expect("{\"type\":\"string\",\"enum\":[\"a\",1]}", LIST("\"a\""), LIST("1"));
    expect("{\"type\":\"integer\",\"enum\":[1,2.5,3.0]}", LIST("1", "3.0"), LIST("2.5"));
    expect("{\"const\":\"x\",\"enum\":[\"x\",\"y\"]}", LIST("\"x\""), LIST("\"y\""));
}

static void test_combinators_and_refs(void) {
    expect("{\"anyOf\":[{\"type\":\"string\",\"maxLength\":2},{\"type\":\"integer\"}]}",
           LIST("\"ab\"", "5", "-3"), LIST("\"abc\"", "1.5", "null"));
    /* oneOf is compiled as anyOf */
    expect("{\"oneOf\":[{\"type\":\"number\"},{\"type\":\"integer\"}]}", LIST("1", "1.5"),
           LIST("\"1\""));
    expect("{\"allOf\":[{\"type\":\"boolean\"}],\"description\":\"d\"}", LIST("true", "false"),
           LIST("null"));
    expect("{\"$defs\":{\"pt\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"},"
           "\"y\":{\"type\":\"number\"}},\"required\":[\"x\",\"y\"]}},"
           "\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/pt\"}}",
           LIST("[]", "[{\"x\":1,\"y\":2}]", "[{\"x\":1,\"y\":2}, {\"x\":0.5,\"y\":-1e3}]"),
           LIST("[{\"x\":1}]", "[{\"y\":1,\"x\":2}]", "{\"x\":1,\"y\":2}"));
    /* recursive tree */
    expect("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"value\":{\"type\":"
           "\"integer\"},\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},"
           "\"required\":[\"value\",\"children\"]}},\"$ref\":\"#/$defs/node\"}",
           LIST("{\"value\":1,\"children\":[]}",
                "{\"value\":1,\"children\":[{\"value\":2,\"children\":[]},{\"value\":3,"
                "\"children\":[{\"value\":4,\"children\":[]}]}]}"),
           LIST("{\"value\":1}",
                "{\"value\":1,\"children\":[{\"value\":2,\"children\":[{\"value\":3}]}]}",
                "{\"value\":1,\"children\":[1]}"));
    /* "#" and definitions with an escaped name, a $ref beside annotations */
    expect("{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#\"}}}",
           LIST("{}", "{\"next\":{\"next\":{}}}"), LIST("{\"next\":1}"));
    expect("{\"definitions\":{\"a/b~\":{\"type\":\"null\"}},\"properties\":{\"x\":{\"$ref\":"
           "\"#/definitions/a~1b~0\",\"description\":\"d\"}},\"required\":[\"x\"]}",
           LIST("{\"x\":null}"), LIST("{\"x\":1}", "{}"));
    /* Optional[T] as Pydantic writes it */
    expect(
        "{\"$defs\":{\"M\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},"
        "\"required\":[\"id\"]}},\"type\":\"object\",\"properties\":{\"m\":{\"anyOf\":[{\"$ref\":"
        "\"#/$defs/M\"},{\"type\":\"null\"}],\"default\":null}},\"required\":[\"m\"]}",
        LIST("{\"m\":null}", "{\"m\":{\"id\":7}}"), LIST("{\"m\":{}}", "{}"));
}

static void test_arrays(void) {
    expect("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],"
           "\"items\":false}",
           LIST("[]", "[\"a\"]", "[\"a\",1]", "[ \"a\" , 1 ]"),
           LIST("[\"a\",1,2]", "[1]", "[\"a\",\"b\"]", "[\"a\",]"));
    expect("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],"
           "\"items\":{\"type\":\"boolean\"},\"minItems\":2}",
           LIST("[\"a\",1]", "[\"a\",1,true,false]"), LIST("[\"a\"]", "[\"a\",1,1]", "[]"));
    expect("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"}]}",
           LIST("[]", "[\"a\"]", "[\"a\",1,{}]"), LIST("[1]"));
    /* draft 7's tuple form */
    expect("{\"items\":[{\"type\":\"string\"}],\"additionalItems\":false}", LIST("[\"a\"]", "[]"),
           LIST("[\"a\",\"b\"]"));
    expect("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}",
           LIST("[1,2]", "[1,2,3]", "[ 1, 2 ]", "[\n  1,\n  2\n]"),
           LIST("[1]", "[1,2,3,4]", "[]", "[1,2.5]"));
    expect("{\"items\":{\"type\":\"integer\"},\"minItems\":1}", LIST("[1]", "[1,2,3,4,5,6,7]"),
           LIST("[]"));
    expect("{\"type\":\"array\",\"maxItems\":0}", LIST("[]", "[ ]"), LIST("[1]"));
    expect("{\"type\":\"array\",\"minItems\":3}", LIST("[1,\"a\",null]", "[[],{},1,2]"),
           LIST("[1,2]"));
    expect("{\"type\":\"array\",\"items\":false}", LIST("[]"), LIST("[1]"));
}

static void test_strings_and_scalars(void) {
    /* lengths in characters: an escape and a multi-byte character count one each */
    expect("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
           LIST("\"ab\"", "\"abc\"", "\"a\\n\"", "\"\\u00e9x\"",
                "\"\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\""),
           LIST("\"a\"", "\"abcd\"", "\"\"", "\"\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80x\"",
                "\"\\n\\n\\n\\n\""));
    expect("{\"maxLength\":1}", LIST("\"\"", "\"a\""), LIST("\"ab\"", "1"));
    expect("{\"type\":\"string\",\"minLength\":3}", LIST("\"abc\"", "\"abcdefgh\""),
           LIST("\"ab\""));
    expect("{\"type\":[\"string\",\"null\"]}", LIST("\"x\"", "null", "\"\""),
           LIST("1", "{}", "nul"));
    expect("{\"type\":\"integer\"}", LIST("12", "-7", "0", "  5"),
           LIST("1.5", "1e3", "01", "12 ", "\"1\""));
    expect("{\"type\":\"number\"}", LIST("12", "1.5", "1e3", "-0.25E-7"), LIST("1.", "\"1\""));
    expect("{\"type\":[\"integer\",\"number\"]}", LIST("1", "1.5"), LIST("true"));
    expect("{\"type\":\"boolean\"}", LIST("true", "false"), LIST("1", "null"));
    expect("{\"type\":\"null\",\"title\":\"t\",\"format\":\"x\"}", LIST("null"), LIST("0"));
    expect("true", LIST("1", "\"s\"", "[1,{}]", "{\"a\":null}", "null"), LIST("1 ", "nul"));
    expect("{}", LIST("1", "\"s\"", "[]"), LIST(""));
    expect("{\"description\":\"anything\",\"x-vendor\":1}", LIST("false", "{}"), LIST("x"));
    /* minLength on a number type is not about numbers: ignored */
    expect("{\"type\":\"number\",\"minLength\":3}", LIST("1"), LIST("\"abc\""));
}

/* ---- integer bounds ---------------------------------------------------------------------- */

#define INT_MAX16 9999999999999999LL /* the largest integer the grammar writes (16 digits) */

/* One integer text against g: a mismatch is reported, the first few per grammar in full. */
static void int_text(const ts_grammar *g, const char *schema, const char *text, bool want,
                     int *bad) {
    if (match(g, text) == want) return;
    if ((*bad)++ < 5)
        CHECKF(false, "schema %s should %s [%s]", schema, want ? "accept" : "reject", text);
    else
        tu_failures++;
}

static void int_value(const ts_grammar *g, const char *schema, long long v, long long lo,
                      long long hi, int *bad) {
    char t[32];
    snprintf(t, sizeof t, "%lld", v);
    int_text(g, schema, t, v >= lo && v <= hi, bad);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rng(void) { /* xorshift64: the same values on every run */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* A value in [lo, hi]; the span fits in unsigned long long for bounds within ±INT_MAX16. */
static long long rng_in(long long lo, long long hi) {
    unsigned long long span = (unsigned long long)(hi - lo) + 1;
    return lo + (long long)(rng() % span);
}

/* The schema's grammar accepts exactly the canonical integers in [lo, hi]: every integer in a
 * window around the range when it is small, else around each end, and random values inside
 * and outside; non-canonical spellings of values inside never. */
static void int_range(const char *schema, long long lo, long long hi) {
    ts_grammar *g = compile(schema);
    if (!g) return;
    int bad = 0;
    if (hi - lo <= 2000) {
        for (long long v = lo - 30; v <= hi + 30; v++)
            int_value(g, schema, v, lo, hi, &bad);
    } else {
        for (long long d = -30; d <= 30; d++) {
            int_value(g, schema, lo + d, lo, hi, &bad);
            int_value(g, schema, hi + d, lo, hi, &bad);
        }
    }
    for (int i = 0; i < 40; i++) {
        int_value(g, schema, rng_in(lo, hi), lo, hi, &bad);
        if (lo > -INT_MAX16) int_value(g, schema, rng_in(-INT_MAX16, lo - 1), lo, hi, &bad);
        if (hi < INT_MAX16) int_value(g, schema, rng_in(hi + 1, INT_MAX16), lo, hi, &bad);
    }
    /* 17 digits: never, whatever the bounds */
    int_text(g, schema, "10000000000000000", false, &bad);
    int_text(g, schema, "-10000000000000000", false, &bad);
    long long in[3] = {lo, hi, lo + (hi - lo) / 2};
    for (int i = 0; i < 3; i++) {
        long long v = in[i];
        unsigned long long mag = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
        const char *sign = v < 0 ? "-" : "";
        char t[48];
        snprintf(t, sizeof t, "%s0%llu", sign, mag); /* a leading zero */
        int_text(g, schema, t, false, &bad);
        snprintf(t, sizeof t, "%lld.0", v);
        int_text(g, schema, t, false, &bad);
        snprintf(t, sizeof t, "%lld.5", v);
        int_text(g, schema, t, false, &bad);
        snprintf(t, sizeof t, "%llde0", v);
        int_text(g, schema, t, false, &bad);
        snprintf(t, sizeof t, "%lldE1", v);
        int_text(g, schema, t, false, &bad);
        snprintf(t, sizeof t, "+%llu", mag);
        int_text(g, schema, t, false, &bad);
        snprintf(t, sizeof t, "%lld ", v); /* nothing may follow the value */
        int_text(g, schema, t, false, &bad);
        snprintf(t, sizeof t, "\"%lld\"", v);
        int_text(g, schema, t, false, &bad);
        snprintf(t, sizeof t, " %lld", v); /* leading whitespace, as for any root value */
        int_text(g, schema, t, true, &bad);
    }
    static const char *const never[] = {"",     "-",   "-0",  "+0", "00", "-00",  "0.0",
                                        "-0.0", "0e0", "--1", "1-", " ",  "null", "0x1"};
    for (size_t i = 0; i < sizeof never / sizeof *never; i++)
        int_text(g, schema, never[i], false, &bad);
    ts_grammar_free(g);
}

/* minimum/maximum given as JSON integers; INT_MAX16 at either end stands for "absent". */
static void int_bounds(long long lo, long long hi) {
    char schema[160] = "{\"type\":\"integer\"";
    if (lo > -INT_MAX16)
        snprintf(schema + strlen(schema), sizeof schema - strlen(schema), ",\"minimum\":%lld", lo);
    if (hi < INT_MAX16)
        snprintf(schema + strlen(schema), sizeof schema - strlen(schema), ",\"maximum\":%lld", hi);
    strcat(schema, "}");
    int_range(schema, lo, hi);
}

static void test_integer_bounds(void) {
    /* clang-format off */
    static const long long ranges[][2] = {
        {0, 0}, {0, 9}, {1, 10}, {7, 123}, {-5, 5}, {-123, -7}, {-10, 0}, {99, 100},
        {1000, 1000}, {0, 1}, {-1, 0}, {-1, -1}, {9, 10}, {10, 99}, {-99, -10}, {100, 999},
        {101, 998}, {-1001, 1001}, {190, 210}, {1999, 2001},
        {5, INT_MAX16}, {-3, INT_MAX16}, {0, INT_MAX16}, {1, INT_MAX16}, /* min */
        {-INT_MAX16, 42}, {-INT_MAX16, -1}, {-INT_MAX16, 0}, {-INT_MAX16, INT_MAX16 - 1}, /* max */
        {123456789, 987654321}, {-987654321, -123456789}, {-5000000000000000, 5000000000000000},
        {1000000000000000, INT_MAX16}, {INT_MAX16 - 10, INT_MAX16}, {-INT_MAX16, -INT_MAX16 + 10},
        {1234567890123456, 1234567890123499},
    };
    /* clang-format on */
    for (size_t i = 0; i < sizeof ranges / sizeof *ranges; i++)
        int_bounds(ranges[i][0], ranges[i][1]);

    /* every range between values where the digit count or a digit turns over */
    static const long long ends[] = {-1001, -1000, -999, -550, -123, -101, -100, -99, -11,
                                     -10,   -9,    -1,   0,    1,    9,    10,   11,  99,
                                     100,   101,   123,  550,  999,  1000, 1001};
    size_t n_ends = sizeof ends / sizeof *ends;
    for (size_t i = 0; i < n_ends; i++)
        for (size_t j = i; j < n_ends; j++)
            int_bounds(ends[i], ends[j]);

    /* random ranges of every digit count and sign */
    for (int i = 0; i < 150; i++) {
        long long v[2];
        for (int k = 0; k < 2; k++) {
            int digits = 1 + (int)(rng() % 16);
            long long m = 1;
            for (int d = 1; d < digits; d++)
                m *= 10;
            v[k] = rng_in(m == 1 ? 0 : m, m * 10 - 1 < INT_MAX16 ? m * 10 - 1 : INT_MAX16);
            if (rng() % 2) v[k] = -v[k];
        }
        int_bounds(v[0] < v[1] ? v[0] : v[1], v[0] < v[1] ? v[1] : v[0]);
    }

    /* exclusive bounds, fractional bounds (rounded inward), both kinds of bound at once */
    int_range("{\"type\":\"integer\",\"exclusiveMinimum\":3,\"maximum\":20}", 4, 20);
    int_range("{\"type\":\"integer\",\"exclusiveMaximum\":10,\"minimum\":-10}", -10, 9);
    int_range("{\"type\":\"integer\",\"exclusiveMinimum\":-3,\"exclusiveMaximum\":3}", -2, 2);
    int_range("{\"type\":\"integer\",\"exclusiveMinimum\":0}", 1, INT_MAX16);
    int_range("{\"type\":\"integer\",\"exclusiveMaximum\":0}", -INT_MAX16, -1);
    int_range("{\"type\":\"integer\",\"minimum\":5,\"exclusiveMinimum\":3,\"maximum\":30}", 5, 30);
    int_range("{\"type\":\"integer\",\"minimum\":2,\"exclusiveMinimum\":3,\"maximum\":30}", 4, 30);
    int_range("{\"type\":\"integer\",\"maximum\":9,\"exclusiveMaximum\":9}", -INT_MAX16, 8);
    int_range("{\"type\":\"integer\",\"minimum\":1.5,\"maximum\":2.5}", 2, 2);
    int_range("{\"type\":\"integer\",\"minimum\":-1.5,\"maximum\":7.9}", -1, 7);
    int_range("{\"type\":\"integer\",\"minimum\":-20.5,\"maximum\":-2.5}", -20, -3);
    int_range("{\"type\":\"integer\",\"exclusiveMinimum\":2.5,\"exclusiveMaximum\":7.5}", 3, 7);
    int_range("{\"type\":\"integer\",\"exclusiveMinimum\":-5.5,\"exclusiveMaximum\":-0.5}", -5, -1);
    int_range("{\"type\":\"integer\",\"minimum\":3.0,\"exclusiveMaximum\":12.0}", 3, 11);
    int_range("{\"type\":\"integer\",\"exclusiveMinimum\":-0.5,\"exclusiveMaximum\":99.5}", 0, 99);
    int_range("{\"type\":\"integer\",\"minimum\":-0.0,\"maximum\":0.0}", 0, 0);
    int_range("{\"type\":\"integer\",\"minimum\":1e2,\"maximum\":1.5e2}", 100, 150);
    /* bounds beyond 16 digits: clamped */
    int_range("{\"type\":\"integer\",\"maximum\":1e20}", -INT_MAX16, INT_MAX16);
    int_range("{\"type\":\"integer\",\"minimum\":-1e20,\"maximum\":1e300}", -INT_MAX16, INT_MAX16);
    int_range("{\"type\":\"integer\",\"minimum\":0,\"maximum\":1e20}", 0, INT_MAX16);
    int_range("{\"type\":\"integer\",\"minimum\":-9223372036854775808,\"maximum\":"
              "9223372036854775807}",
              -INT_MAX16, INT_MAX16);
    int_range("{\"type\":\"integer\",\"minimum\":9999999999999999}", INT_MAX16, INT_MAX16);
    int_range("{\"type\":\"integer\",\"exclusiveMaximum\":-9999999999999998}", -INT_MAX16,
              -INT_MAX16);

    /* in context: a property (not the shared integer rule), items, a type list */
    expect("{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":1,"
           "\"maximum\":12}},\"required\":[\"n\"]}",
           LIST("{\"n\":12}", "{\"n\":1}", "{ \"n\" : 7 }"),
           LIST("{\"n\":13}", "{\"n\":0}", "{\"n\":-1}", "{\"n\":012}", "{\"n\":1.0}", "{}"));
    expect("{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":-2,\"maximum\":3}}",
           LIST("[]", "[-2,3,0]", "[ 1 ]"), LIST("[4]", "[-3]", "[1,-0]"));
    expect("{\"type\":[\"integer\",\"null\"],\"minimum\":10,\"maximum\":20}",
           LIST("null", "10", "20"), LIST("9", "21", "\"10\""));
    expect("{\"type\":[\"integer\",\"string\"],\"exclusiveMinimum\":3}",
           LIST("\"x\"", "4", "\"2\""), LIST("3", "2"));
    /* beside types that are not numbers: checked, then ignored, as JSON Schema does */
    expect("{\"type\":\"string\",\"minimum\":5,\"maximum\":1}", LIST("\"a\""), LIST("7"));
    /* const and enum: values outside the bounds are dropped (and are not held to 16 digits) */
    expect("{\"type\":\"integer\",\"enum\":[1,5,10,7.0,\"x\"],\"minimum\":3,\"maximum\":8}",
           LIST("5", "7.0"), LIST("1", "10", "\"x\""));
    expect("{\"type\":\"integer\",\"enum\":[100000000000000000,-1],\"minimum\":0}",
           LIST("100000000000000000"), LIST("-1", "0"));
    refused("{\"type\":\"integer\",\"const\":2,\"minimum\":3}", TS_ERR_INVALID, "allows no value");
}

static void test_refusals(void) {
    /* clang-format off */
    static const char *const kw[] = {
        "patternProperties", "multipleOf", "uniqueItems", "contains", "minContains",
        "maxContains", "minProperties", "maxProperties", "propertyNames", "dependentRequired",
        "dependentSchemas", "dependencies", "if", "then", "else", "not", "unevaluatedProperties",
        "unevaluatedItems", "$dynamicRef", "$recursiveRef",
    };
    /* clang-format on */
    for (size_t i = 0; i < sizeof kw / sizeof *kw; i++) {
        char schema[256], want[64];
        snprintf(schema, sizeof schema,
                 "{\"type\":\"object\",\"properties\":{\"zip\":{\"type\":\"string\",\"%s\":true}}}",
                 kw[i]);
        snprintf(want, sizeof want, "'%s' at /properties/zip", kw[i]);
        refused(schema, TS_ERR_UNSUPPORTED, want);
    }
    /* pattern: the regex subset's refusals name where they are */
    refused("{\"type\":\"object\",\"properties\":{\"zip\":{\"type\":\"string\","
            "\"pattern\":\"(?=a)\"}}}",
            TS_ERR_UNSUPPORTED, "at /properties/zip: pattern:");
    refused("{\"type\":\"string\",\"pattern\":\"^a+$\",\"maxLength\":3}", TS_ERR_UNSUPPORTED,
            "together with minLength or maxLength");
    refused("{\"type\":\"string\",\"pattern\":5}", TS_ERR_INVALID, "must be a string");
    refused("{\"type\":\"string\",\"pattern\":\"(a\"}", TS_ERR_INVALID, "pattern:");
    /* bounds: on integers only; numbers (or no type, which admits them) are refused */
    static const char *const bounds[] = {"minimum", "maximum", "exclusiveMinimum",
                                         "exclusiveMaximum"};
    for (size_t i = 0; i < sizeof bounds / sizeof *bounds; i++) {
        char schema[256], want[64];
        snprintf(schema, sizeof schema,
                 "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\",\"%s\":1}}}",
                 bounds[i]);
        snprintf(want, sizeof want, "'%s' at /properties/x", bounds[i]);
        refused(schema, TS_ERR_UNSUPPORTED, want);
        refused(schema, TS_ERR_UNSUPPORTED, "integers only");
        snprintf(schema, sizeof schema, "{\"type\":[\"integer\",\"number\"],\"%s\":1}", bounds[i]);
        refused(schema, TS_ERR_UNSUPPORTED, "integers only");
        snprintf(schema, sizeof schema, "{\"%s\":1}", bounds[i]);
        refused(schema, TS_ERR_UNSUPPORTED, "integers only");
        snprintf(schema, sizeof schema, "{\"type\":\"integer\",\"%s\":\"5\"}", bounds[i]);
        refused(schema, TS_ERR_INVALID, bounds[i]);
        snprintf(schema, sizeof schema, "{\"type\":\"integer\",\"%s\":null}", bounds[i]);
        refused(schema, TS_ERR_INVALID, bounds[i]);
        snprintf(schema, sizeof schema, "{\"type\":\"string\",\"%s\":[1]}", bounds[i]);
        refused(schema, TS_ERR_INVALID, bounds[i]);
    }
    refused("{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", TS_ERR_UNSUPPORTED,
            "'minimum' at the root");
    refused("{\"enum\":[1,2],\"minimum\":2}", TS_ERR_UNSUPPORTED, "integers only");
    refused("{\"type\":\"integer\",\"minimum\":\"5\"}", TS_ERR_INVALID,
            "'minimum' at the root must be a number");
    /* draft 4's boolean form: named, not misread */
    refused("{\"type\":\"integer\",\"minimum\":0,\"exclusiveMinimum\":true}", TS_ERR_UNSUPPORTED,
            "'exclusiveMinimum' at the root is a boolean");
    refused("{\"type\":\"integer\",\"maximum\":9,\"exclusiveMaximum\":false}", TS_ERR_UNSUPPORTED,
            "'exclusiveMaximum'");
    refused("{\"type\":\"integer\",\"minimum\":true}", TS_ERR_INVALID, "'minimum'");
    /* no integer left */
    refused("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", TS_ERR_INVALID,
            "allows no value");
    refused("{\"type\":\"integer\",\"minimum\":3.2,\"maximum\":3.8}", TS_ERR_INVALID,
            "allows no value");
    refused("{\"type\":\"integer\",\"exclusiveMinimum\":3,\"exclusiveMaximum\":4}", TS_ERR_INVALID,
            "allows no value");
    refused("{\"type\":\"integer\",\"exclusiveMinimum\":9223372036854775807}", TS_ERR_INVALID,
            "allows no value");
    refused("{\"type\":\"integer\",\"exclusiveMaximum\":-9223372036854775808}", TS_ERR_INVALID,
            "allows no value");
    refused("{\"type\":\"integer\",\"minimum\":1e300}", TS_ERR_INVALID, "allows no value");
    refused("{\"type\":\"integer\",\"minimum\":1e20}", TS_ERR_INVALID, "allows no value");
    /* integers exist there, but none of at most 16 digits */
    refused("{\"type\":\"integer\",\"minimum\":1e18}", TS_ERR_INVALID, "16 digits");
    refused("{\"type\":\"integer\",\"maximum\":-10000000000000000}", TS_ERR_INVALID, "16 digits");
    refused("{\"items\":{\"minimum\":0}}", TS_ERR_UNSUPPORTED, "'minimum' at /items");
    refused("{\"$defs\":{\"a\":{\"not\":{}}},\"$ref\":\"#/$defs/a\"}", TS_ERR_UNSUPPORTED,
            "'not' at /$defs/a");
    refused("{\"allOf\":[{\"type\":\"string\"},{\"maxLength\":3}]}", TS_ERR_UNSUPPORTED, "allOf");
    refused("{\"$ref\":\"https://example.com/s.json\"}", TS_ERR_UNSUPPORTED, "$ref");
    refused("{\"$ref\":\"#anchor\"}", TS_ERR_UNSUPPORTED, "$ref");
    refused("{\"type\":\"object\",\"anyOf\":[{\"required\":[\"a\"]}]}", TS_ERR_UNSUPPORTED,
            "anyOf");
    /* uniqueItems false is the default: fine */
    expect("{\"type\":\"array\",\"uniqueItems\":false}", LIST("[1,1]"), NULL);

    refused("false", TS_ERR_INVALID, "allows no value");
    refused("{\"enum\":[]}", TS_ERR_INVALID, "enum");
    refused("{\"type\":\"string\",\"enum\":[1]}", TS_ERR_INVALID, "allows no value");
    refused("{\"properties\":{\"a\":false},\"required\":[\"a\"]}", TS_ERR_INVALID,
            "allows no value");
    refused("{\"properties\":{\"a\":{}},\"required\":[\"b\"]}", TS_ERR_INVALID, "'b'");
    refused("{\"properties\":{\"a\":{}},\"required\":\"a\"}", TS_ERR_INVALID, "required");
    refused("{\"properties\":{\"a\":{}},\"required\":[1]}", TS_ERR_INVALID, "required");
    refused("{\"properties\":[]}", TS_ERR_INVALID, "properties");
    refused("not json", TS_ERR_INVALID, "not valid JSON");
    refused("{\"type\":", TS_ERR_INVALID, "not valid JSON");
    refused("{\"type\":\"string\",\"type\":\"null\"}", TS_ERR_INVALID, "not valid JSON");
    refused("[1]", TS_ERR_INVALID, "object or a boolean");
    refused("1", TS_ERR_INVALID, "object or a boolean");
    refused("{\"items\":1}", TS_ERR_INVALID, "items");
    refused("{\"type\":\"strin\"}", TS_ERR_INVALID, "type");
    refused("{\"type\":[]}", TS_ERR_INVALID, "type");
    refused("{\"type\":\"string\",\"minLength\":-1}", TS_ERR_INVALID, "minLength");
    refused("{\"type\":\"string\",\"maxLength\":\"3\"}", TS_ERR_INVALID, "maxLength");
    refused("{\"type\":\"string\",\"minLength\":4,\"maxLength\":3}", TS_ERR_INVALID, "minLength");
    refused("{\"anyOf\":[]}", TS_ERR_INVALID, "anyOf");
    refused("{\"$ref\":\"#/$defs/missing\"}", TS_ERR_INVALID, "points to nothing");
    refused("{\"$ref\":\"#\"}", TS_ERR_INVALID, "$ref cycle that matches nothing");
    refused("{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}", TS_ERR_INVALID, "$ref cycle");
    refused(
        "{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"allOf\":[{\"$ref\":\"#/$defs/a\"}]}},"
        "\"$ref\":\"#/$defs/a\"}",
        TS_ERR_INVALID, "$ref cycle");

    /* sizes: bounds over 10000 named; a grammar over the element limit */
    refused("{\"type\":\"array\",\"maxItems\":20000}", TS_ERR_RANGE, "maxItems");
    refused("{\"type\":\"string\",\"maxLength\":1000000000}", TS_ERR_RANGE, "maxLength");
    refused("{\"type\":\"array\",\"minItems\":10001}", TS_ERR_RANGE, "minItems");
    static char huge[1200000];
    strcpy(huge, "{\"const\":\"");
    memset(huge + 10, 'a', sizeof huge - 13);
    strcpy(huge + sizeof huge - 3, "\"}");
    refused(huge, TS_ERR_RANGE, "elements");
    /* 201 optional properties in a row: more than the matcher can skip without a byte */
    static char big[16384];
    strcpy(big, "{\"properties\":{");
    for (int i = 0; i < 201; i++)
        snprintf(big + strlen(big), sizeof big - strlen(big), "%s\"p%d\":{}", i ? "," : "", i);
    strcat(big, "}}");
    refused(big, TS_ERR_UNSUPPORTED, "optional properties");
}

/* pattern (regex_grammar.c has the regex subset's own tests): inside the quotes of a string
 * property, searched for unless anchored, the type inferred from the keyword. */
static void test_pattern(void) {
    expect("{\"type\":\"object\",\"properties\":{\"zip\":{\"type\":\"string\","
           "\"pattern\":\"^[0-9]{5}(-[0-9]{4})?$\"}},\"required\":[\"zip\"]}",
           LIST("{\"zip\":\"12345\"}", "{\"zip\": \"12345-6789\"}"),
           LIST("{\"zip\":\"1234\"}", "{\"zip\":\"12345-\"}", "{\"zip\":12345}",
                "{\"zip\":\"a12345\"}"));
    expect("{\"pattern\":\"ab\"}", LIST("\"ab\"", "\"xxaby\"", "\"\\\"ab\\n\""),
           LIST("\"a b\"", "\"\"", "5"));
    expect("{\"type\":[\"string\",\"null\"],\"pattern\":\"^(yes|no)$\"}",
           LIST("\"yes\"", "\"no\"", "null"), LIST("\"maybe\"", "\"yesno\""));
}

/* format: the enforced ones as anchored patterns, inside objects too (not the shared plain
 * string rule); unknown formats and formats beside length bounds stay annotations. */
static void test_format(void) {
    expect("{\"type\":\"string\",\"format\":\"date\"}", LIST("\"2024-02-29\"", "\"1999-12-31\""),
           LIST("\"2024-13-01\"", "\"24-01-01\"", "\"2024-01-32\"", "\"x2024-01-01\""));
    expect("{\"type\":\"object\",\"properties\":{\"at\":{\"type\":\"string\","
           "\"format\":\"date-time\"}},\"required\":[\"at\"]}",
           LIST("{\"at\":\"2024-05-06T07:08:09Z\"}", "{\"at\":\"2024-05-06T23:59:60.123+05:30\"}"),
           LIST("{\"at\":\"2024-05-06 07:08:09Z\"}", "{\"at\":\"2024-05-06T24:00:00Z\"}",
                "{\"at\":\"2024-05-06T07:08:09\"}"));
    expect("{\"type\":\"string\",\"format\":\"time\"}", LIST("\"07:08:09-01:00\""),
           LIST("\"7:08:09Z\""));
    expect(
        "{\"type\":\"string\",\"format\":\"uuid\"}",
        LIST("\"123e4567-e89b-12d3-a456-426614174000\""),
        LIST("\"123e4567e89b12d3a456426614174000\"", "\"123e4567-e89b-12d3-a456-42661417400g\""));
    expect("{\"type\":\"string\",\"format\":\"ipv4\"}", LIST("\"192.168.0.255\"", "\"0.0.0.0\""),
           LIST("\"256.1.1.1\"", "\"1.2.3\"", "\"01.2.3.4\""));
    expect("{\"type\":\"string\",\"format\":\"email\"}",
           LIST("\"a.b+c@example.co.uk\"", "\"x@y.io\""),
           LIST("\"a@b\"", "\"@b.io\"", "\"a b@c.io\"", "\"a..b@c.io\""));
    expect("{\"type\":\"string\",\"format\":\"hostname\"}", LIST("\"a-b.example\"", "\"x\""),
           LIST("\"-a.example\"", "\"a_b\""));
    expect("{\"type\":\"string\",\"format\":\"colour\"}", LIST("\"anything\""), LIST("1"));
    expect("{\"type\":\"string\",\"format\":\"date\",\"maxLength\":3}", LIST("\"abc\""),
           LIST("\"2024-01-01\""));
}

int main(void) {
    test_format();
    test_pattern();
    test_json_mode();
    test_optional_combinations();
    test_objects();
    test_literals();
    test_combinators_and_refs();
    test_arrays();
    test_strings_and_scalars();
    test_integer_bounds();
    test_refusals();
    return tu_report("test_json_schema");
}
