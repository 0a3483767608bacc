/* What json_grammar.c (JSON text as grammar rules) and json_schema.c (the JSON Schema keywords,
 * compiled into those rules) share: the compiler's context, the builder shorthands, the shared
 * rules and the object/array/string layouts. Internal to the two files. */
#ifndef TS_TEXT_JSON_SCHEMA_INT_H
#define TS_TEXT_JSON_SCHEMA_INT_H

#include "base/status.h"
#include "text/grammar.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#define JS_PATH_MAX 512 /* room for the JSON pointer in messages; longer ones are cut short */
/* Numbers: -?(0|[1-9][0-9]{0,15})(\.[0-9]{1,16})?([eE][-+]?[0-9]{1,2})?. 16 significant digits
 * is a double's precision; the bounds keep a model from writing digits without end, and a
 * 2-digit exponent keeps every number a finite double (below 1e116): strict parsers refuse
 * 1e400, and the fuzzer found that a 3-digit exponent made texts jansson cannot read. */
#define JS_INT_DIGITS  16
#define JS_FRAC_DIGITS 16
#define JS_EXP_DIGITS  2
#define JS_DIGIT_CHAIN 15 /* the longest [0-9]{0,k} the above need */
/* The largest magnitude of an integer of JS_INT_DIGITS digits: integer bounds are clamped to
 * it, since the grammar writes no longer integer anyway. */
#define JS_INT_MAX 9999999999999999LL

/* A $ref target: the rule for its values, made before its schema is compiled. */
typedef struct {
    const json_t *node;
    int rule;
    int nest;   /* c->nest when its compilation began */
    bool busy;  /* its schema is being compiled */
    bool empty; /* it allows no value (the rule matches nothing) */
} js_target;

/* The compiler's state: json_grammar.c's shared rules (made on first use), json_schema.c's $ref
 * targets, nesting and place in the schema. */
typedef struct {
    ts_gbuild *b;
    json_t *root;
    js_target *targets; /* memo of $ref targets by node */
    int n_targets, cap_targets;
    /* Shared rules, -1 until first needed. */
    int r_ws, r_lead, r_char, r_esc;
    int r_strtail; /* any characters, then the closing quote */
    int r_string, r_integer, r_number, r_bool, r_value, r_object, r_array;
    int digits[JS_DIGIT_CHAIN + 1]; /* digits[k]: [0-9]{0,k} */
    int exact[JS_INT_DIGITS];       /* exact[k]: [0-9]{k}, for bounded integers */
    int *strtail_n;                 /* strtail_n[k]: at most k characters, then the closing quote */
    int n_strtail_n, cap_strtail_n;
    int depth; /* js_compile recursion */
    int nest;  /* objects and arrays entered: a $ref cycle through one consumes input */
    char path[JS_PATH_MAX]; /* JSON pointer of the subschema being compiled (for messages) */
    size_t path_len;
    /* Values as Python literals (the list form of tool calls, tool_grammar_py.c): True, False
     * and None for the JSON words, and only the string escapes Python reads the same way. */
    bool python;
} js_ctx;

/* ---- builder shorthands: ts_gbuild_* on c->b, so the compilers read as the rules they write */

/* A rule may be referred to before it has an alternative: that is how recursion is built. */
int js_rule(js_ctx *c);
/* The handle the calls below append to; a rule's alternatives may be built interleaved. */
int js_alt(js_ctx *c, int rule);
/* As an alternative's last element this is a tail call: repetition ends in one. */
void js_ref(js_ctx *c, int alt, int rule);
/* s is C text: keys, dumped values and punctuation never hold a raw NUL byte. */
void js_lit(js_ctx *c, int alt, const char *s);
/* For a rule whose schema allows no value: the builder wants every rule to have an alternative. */
void js_never(js_ctx *c, int rule);
/* "true", "false" or "null" as the value's syntax writes it (Python: True, False, None). */
const char *js_word(const js_ctx *c, const char *json_word);

/* ---- shared rules: each made once per grammar, on first use ------------------------------ */

/* Whitespace before the root value only; after it there is nothing (generation stops). */
int js_lead(js_ctx *c);
/* What `true`, {} and annotation-only schemas allow, and items when `items` is absent. */
int js_value(js_ctx *c);
/* JSON mode's root, and object schemas that name no properties. */
int js_object_any(js_ctx *c);
/* Array schemas with no items, prefixItems or bounds. */
int js_array_any(js_ctx *c);
/* String schemas without minLength / maxLength (bounded ones go through js_emit_string). */
int js_string_any(js_ctx *c);
/* Integers have their own rule because type integer must not admit a fraction or exponent. */
int js_integer(js_ctx *c);
/* The canonical integers in [lo, hi] (-JS_INT_MAX <= lo <= hi <= JS_INT_MAX): a new rule. */
int js_integer_range(js_ctx *c, long long lo, long long hi);
/* Includes the integers, so a type list with both needs only this one. */
int js_number(js_ctx *c);
/* Shared by every boolean schema rather than two literals in each. */
int js_bool(js_ctx *c);

/* ---- layouts: alternatives added to `into` ----------------------------------------------- */

/* An object whose known properties json_schema.c has compiled: rules is scratch for the F/C
 * families, which keep the commas right whichever optional properties are skipped. */
void js_emit_object(js_ctx *c, int into, int n, char **keys, const int *vals, const bool *req,
                    int addl, int *rules);
/* Returns a status because it allocates; *n_alts lets the caller see that no array fits. */
ts_status js_emit_array(js_ctx *c, int into, const int *prefix, int k, int items, long lo, long hi,
                        int *n_alts);
/* Returns a status: the shared chain of bounded string tails grows (allocates) to maxLength. */
ts_status js_emit_string(js_ctx *c, int into, long lo, long hi, int *n_alts);

#endif
