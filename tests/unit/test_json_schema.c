/* JSON Schema → grammar (text/json_schema.c): JSON mode, each supported keyword accepting the
 * texts it should and rejecting the others byte for byte, and the refusals (unsupported
 * keywords named with their place, invalid schemas, bounds too large). */
#include "testutil.h"
#include "text/grammar.h"

#include <stdbool.h>
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

static void test_refusals(void) {
    /* clang-format off */
    static const char *const kw[] = {
        "pattern", "patternProperties", "minimum", "maximum", "exclusiveMinimum",
        "exclusiveMaximum", "multipleOf", "uniqueItems", "contains", "minContains", "maxContains",
        "minProperties", "maxProperties", "propertyNames", "dependentRequired",
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
    refused("{\"pattern\":\"^a\"}", TS_ERR_UNSUPPORTED, "'pattern' at the root");
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

int main(void) {
    test_json_mode();
    test_optional_combinations();
    test_objects();
    test_literals();
    test_combinators_and_refs();
    test_arrays();
    test_strings_and_scalars();
    test_refusals();
    return tu_report("test_json_schema");
}
