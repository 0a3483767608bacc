/* JSON Schema → byte-level grammar (constrained decoding; the builder is text/grammar.h): the
 * keywords. This file reads the schema and decides, keyword by keyword, which rules each value
 * gets; json_grammar.c writes those rules (JSON's syntax: whitespace, strings, numbers, the
 * object, array and string layouts), and json_schema_int.h holds what the two share.
 *
 * The schema is read with jansson and compiled, one subschema at a time, into rules whose
 * sentences are the JSON texts valid against it (a subset of JSON Schema 2020-12):
 *
 *   kept      type, const, enum, properties, required, additionalProperties, items,
 *             prefixItems (and draft-7 array-form items + additionalItems), minItems, maxItems,
 *             minLength, maxLength, minimum, maximum, exclusiveMinimum, exclusiveMaximum (on
 *             integers: the range is written digit by digit), pattern (an ECMA-262 subset,
 *             regex_grammar.c; not together with minLength / maxLength), anyOf, oneOf (as anyOf),
 *             allOf of one schema, $ref into this document ("#", "#/$defs/x", any JSON pointer)
 *   format    date, time, date-time, uuid, ipv4, hostname, email enforced on strings (as
 *             patterns) unless beside pattern / minLength / maxLength; other formats ignored
 *   ignored   annotations (title, description, default, examples, $comment, ...), $defs
 *             and definitions (read only through $ref), and unknown keywords, as JSON Schema
 *             itself ignores them
 *   refused   the assertions we do not implement (multipleOf, uniqueItems, not, if,
 *             ..., and the bounds where the type allows non-integral numbers, i.e. number or no
 *             type: a range of decimals with fractions and exponents is not a simple grammar):
 *             TS_ERR_UNSUPPORTED naming the keyword and where it is, because silently dropping
 *             them would let the model write values the caller's validator then rejects
 *
 * Each subschema is compiled once: a $ref target gets one rule, made before its schema is
 * compiled, so recursive schemas refer back to it. The layout of the generated text and the
 * shape of the rules are described in json_grammar.c. */
#include "text/json_schema.h"

#include "text/json_schema_int.h"
#include "text/regex_grammar.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The largest minLength / maxLength / minItems / maxItems we compile: a bound costs one rule
 * (or one element) per unit, so 10^9 would exhaust TS_GRAMMAR_MAX_ELEMS anyway; refusing it
 * up front gives a message that names the keyword. */
#define JS_MAX_BOUND 10000
/* Subschemas nested deeper than this (directly or through $ref chains) are refused, so the
 * compiler's own recursion stays bounded. */
#define JS_MAX_DEPTH 256
/* Skipping a run of optional properties is a chain of rules taken without reading a byte
 * (F_i ::= ... | F_{i+1}); the matcher cuts such expansions off at a depth of 256 (grammar.c's
 * GM_MAX_EXPAND), so a longer run would silently lose its later properties: refused instead. */
#define JS_MAX_OPTIONAL_RUN 200

/* The kinds of JSON value, as bits of a mask. */
enum {
    JS_OBJECT = 1 << 0,
    JS_ARRAY = 1 << 1,
    JS_STRING = 1 << 2,
    JS_NUMBER = 1 << 3,
    JS_INTEGER = 1 << 4,
    JS_BOOLEAN = 1 << 5,
    JS_NULL = 1 << 6,
    JS_ANY = (1 << 7) - 1,
};

static const struct {
    const char *name;
    int kind;
} js_types[] = {
    {"object", JS_OBJECT},   {"array", JS_ARRAY},     {"string", JS_STRING}, {"number", JS_NUMBER},
    {"integer", JS_INTEGER}, {"boolean", JS_BOOLEAN}, {"null", JS_NULL},
};

/* Assertions we do not implement: refused wherever they appear (even where they could not
 * apply, e.g. pattern beside type integer), so what is accepted is simple to state. */
/* clang-format off */
static const char *const js_refused[] = {
    "patternProperties", "multipleOf", "uniqueItems", "contains", "minContains",
    "maxContains", "minProperties", "maxProperties", "propertyNames", "dependentRequired",
    "dependentSchemas", "dependencies", "if", "then", "else", "not", "unevaluatedProperties",
    "unevaluatedItems", "$dynamicRef", "$recursiveRef",
};
/* clang-format on */

/* Keywords that constrain the value themselves (as opposed to the combinators $ref, anyOf,
 * oneOf, allOf, which delegate to other schemas). */
/* clang-format off */
static const char *const js_own[] = {
    "type", "const", "enum", "properties", "required", "additionalProperties", "items",
    "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "pattern",
};
/* clang-format on */

static ts_status js_compile(js_ctx *c, json_t *s, int into, int *n_alts);
static ts_status js_sub(js_ctx *c, json_t *s, int *rule);

/* Whether x is a whole number (1.0 is an integer to JSON Schema), without the undefined
 * behaviour of casting a double outside long long's range. */
static bool js_integral(double x) { return x > -9e18 && x < 9e18 && x == (double)(long long)x; }

/* ---- paths and messages ------------------------------------------------------------------ */

static const char *js_where(const js_ctx *c) { return c->path_len ? c->path : "the root"; }

/* Appends "/" and seg (escaped as in a JSON pointer: ~ → ~0, / → ~1); returns the old length
 * for js_path_pop. A path too long for the buffer is cut short (it only feeds messages). */
static void js_path_putc(js_ctx *c, char ch) {
    if (c->path_len + 1 < sizeof c->path) c->path[c->path_len++] = ch;
    c->path[c->path_len] = 0;
}

static size_t js_path_push(js_ctx *c, const char *seg) {
    size_t old = c->path_len;
    js_path_putc(c, '/');
    for (; *seg; seg++) {
        if (*seg == '~' || *seg == '/') {
            js_path_putc(c, '~');
            js_path_putc(c, *seg == '~' ? '0' : '1');
        } else {
            js_path_putc(c, *seg);
        }
    }
    return old;
}

static size_t js_path_push_index(js_ctx *c, const char *key, size_t i) {
    char num[32];
    snprintf(num, sizeof num, "%zu", i);
    size_t old = js_path_push(c, key);
    js_path_push(c, num);
    return old;
}

static void js_path_pop(js_ctx *c, size_t old) {
    c->path_len = old;
    c->path[old] = 0;
}

/* A bound (minLength, maxItems, ...): a non-negative integer up to JS_MAX_BOUND; *v = dflt when
 * the keyword is absent. */
static ts_status js_bound(js_ctx *c, const json_t *s, const char *key, long dflt, long *v) {
    const json_t *j = json_object_get(s, key);
    *v = dflt;
    if (!j) return TS_OK;
    double x;
    if (json_is_integer(j))
        x = (double)json_integer_value(j);
    else if (json_is_real(j) && js_integral(json_real_value(j)))
        x = json_real_value(j);
    else
        return ts_error(TS_ERR_INVALID,
                        "JSON Schema keyword '%s' at %s must be a non-negative integer", key,
                        js_where(c));
    if (x < 0)
        return ts_error(TS_ERR_INVALID,
                        "JSON Schema keyword '%s' at %s must be a non-negative integer", key,
                        js_where(c));
    if (x > JS_MAX_BOUND)
        return ts_error(TS_ERR_RANGE,
                        "JSON Schema keyword '%s' at %s is %.0f, more than the %d supported; "
                        "lower it or remove it",
                        key, js_where(c), x, JS_MAX_BOUND);
    *v = (long)x;
    return TS_OK;
}

/* ---- integer bounds ---------------------------------------------------------------------- */

/* The integers minimum / maximum / exclusiveMinimum / exclusiveMaximum allow: on says whether
 * any is there, and empty that no integer is within them. lo..hi is in long long, not clamped
 * to the integers the grammar writes, since const and enum values may be longer. */
typedef struct {
    bool on, empty;
    long long lo, hi;
} js_irange;

/* A bound as the least (lower) or greatest integer it allows, rounding a non-integral bound
 * inward; false when no long long is allowed. Floor and ceiling go through a truncation, which
 * is exact for doubles inside long long's range (and no libm is needed). */
static bool js_int_bound(const json_t *v, bool lower, bool exclusive, long long *out) {
    if (json_is_integer(v)) {
        long long n = json_integer_value(v);
        if (exclusive && n == (lower ? LLONG_MAX : LLONG_MIN)) return false;
        *out = !exclusive ? n : lower ? n + 1 : n - 1;
        return true;
    }
    const double two63 = 9223372036854775808.0; /* exact; LLONG_MAX + 1 */
    double x = json_real_value(v);
    if (x >= two63 || x < -two63) { /* beyond long long: every one allowed or none */
        if (lower == (x >= two63)) return false;
        *out = lower ? LLONG_MIN : LLONG_MAX;
        return true;
    }
    long long t = (long long)x; /* toward zero */
    long long fl = t - ((double)t > x), ce = t + ((double)t < x);
    if (lower) {
        *out = exclusive ? fl + 1 : ce; /* fl < LLONG_MAX: doubles near 2^63 are integral */
        return true;
    }
    if (exclusive && ce == LLONG_MIN) return false;
    *out = exclusive ? ce - 1 : fl;
    return true;
}

/* Reads the four bounds. They must be numbers; draft 4's boolean exclusiveMinimum /
 * exclusiveMaximum (a flag on minimum / maximum) is refused rather than misread. Where the
 * kinds allow non-integral numbers (type number, or no type) they are refused: only integer
 * ranges are compiled. Beside types that are not numbers they are checked and ignored, as
 * JSON Schema applies them to numbers only. */
static ts_status js_int_bounds(js_ctx *c, const json_t *s, int kinds, js_irange *ir) {
    static const char *const keys[] = {"minimum", "exclusiveMinimum", "maximum",
                                       "exclusiveMaximum"};
    const char *first = NULL;
    *ir = (js_irange){.lo = LLONG_MIN, .hi = LLONG_MAX};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        const json_t *v = json_object_get(s, keys[i]);
        if (!v) continue;
        bool exclusive = i % 2, lower = i < 2;
        if (exclusive && json_is_boolean(v))
            return ts_error(TS_ERR_UNSUPPORTED,
                            "JSON Schema keyword '%s' at %s is a boolean (draft 4's form), which "
                            "is not supported; give the bound itself as a number instead "
                            "(\"%s\": N, draft 6 and later)",
                            keys[i], js_where(c), keys[i]);
        if (!json_is_number(v))
            return ts_error(TS_ERR_INVALID, "JSON Schema keyword '%s' at %s must be a number",
                            keys[i], js_where(c));
        if (!first) first = keys[i];
        long long b;
        if (!js_int_bound(v, lower, exclusive, &b))
            ir->empty = true;
        else if (lower && b > ir->lo)
            ir->lo = b;
        else if (!lower && b < ir->hi)
            ir->hi = b;
    }
    ir->on = first != NULL;
    if (ir->lo > ir->hi) ir->empty = true;
    if (ir->on && (kinds & JS_NUMBER))
        return ts_error(TS_ERR_UNSUPPORTED,
                        "JSON Schema keyword '%s' at %s is not supported on numbers: bounds are "
                        "supported on integers only; make the type \"integer\" or remove it",
                        first, js_where(c));
    if (ir->empty && (kinds & JS_INTEGER))
        return ts_error(TS_ERR_INVALID,
                        "JSON Schema at %s allows no value: no integer is within its bounds "
                        "(minimum, maximum, exclusiveMinimum, exclusiveMaximum); widen them",
                        js_where(c));
    return TS_OK;
}

/* ---- const and enum ---------------------------------------------------------------------- */

static bool js_has_real(const json_t *v) {
    if (json_is_real(v)) return true;
    size_t i;
    const char *k;
    json_t *e;
    if (json_is_array(v)) {
        json_array_foreach(v, i, e) {
            if (js_has_real(e)) return true;
        }
    }
    if (json_is_object(v)) {
        json_object_foreach((json_t *)v, k, e) {
            if (js_has_real(e)) return true;
        }
    }
    return false;
}

/* v as compact JSON text (jansson's: `{"a":1}`, no spaces), which the value must then be
 * exactly. Reals get the fewest significant digits that read back as the same doubles: with
 * jansson's default of 17, 0.1 would have to be written 0.10000000000000001. */
static char *js_dump_json(const json_t *v) {
    size_t flags = JSON_COMPACT | JSON_ENCODE_ANY;
    if (!js_has_real(v)) return json_dumps(v, flags);
    for (int prec = 1; prec < 17; prec++) {
        char *s = json_dumps(v, flags | JSON_REAL_PRECISION(prec));
        if (!s) return NULL;
        json_t *back = json_loads(s, JSON_DECODE_ANY, NULL);
        bool same = back && json_equal(back, (json_t *)v);
        json_decref(back);
        if (same) return s;
        free(s);
    }
    return json_dumps(v, flags | JSON_REAL_PRECISION(17));
}

/* The same text as the value's syntax writes it: in Python, true / false / null outside the
 * strings are True / False / None (the same lengths, so in place); jansson's strings are
 * already Python's (it escapes no '/' and writes no surrogate). */
static char *js_dump(const js_ctx *c, const json_t *v) {
    char *text = js_dump_json(v);
    bool in_string = false;
    for (char *p = text; c->python && p && *p; p++) {
        if (in_string) {
            if (*p == '\\')
                p++; /* the escaped byte, never the NUL: jansson escapes whole */
            else if (*p == '"')
                in_string = false;
        } else if (*p == '"') {
            in_string = true;
        } else if (!strncmp(p, "true", 4) || !strncmp(p, "false", 5)) {
            *p = (char)(*p - 'a' + 'A');
        } else if (!strncmp(p, "null", 4)) {
            memcpy(p, "None", 4);
        }
    }
    return text;
}

static bool js_is_kind(const json_t *v, int kinds) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return kinds & JS_OBJECT;
    case JSON_ARRAY: return kinds & JS_ARRAY;
    case JSON_STRING: return kinds & JS_STRING;
    case JSON_INTEGER: return kinds & (JS_NUMBER | JS_INTEGER);
    case JSON_REAL: {
        double x = json_real_value(v);
        return (kinds & JS_NUMBER) || ((kinds & JS_INTEGER) && js_integral(x));
    }
    case JSON_TRUE:
    case JSON_FALSE: return kinds & JS_BOOLEAN;
    case JSON_NULL: return kinds & JS_NULL;
    }
    return false;
}

/* Whether v, a value of the schema's kinds, is within the integer bounds: only numbers are
 * bounded, and they are integers here (bounds beside type number were refused). */
static bool js_in_range(const json_t *v, const js_irange *ir) {
    if (!ir->on || !json_is_number(v)) return true;
    long long n = json_is_integer(v) ? json_integer_value(v) : (long long)json_real_value(v);
    return !ir->empty && n >= ir->lo && n <= ir->hi;
}

/* const and/or enum: each allowed value as a literal. Of the other keywords only `type` and
 * the integer bounds are applied to them (a value outside is dropped); the values are fixed
 * texts anyway. */
static ts_status js_literals(js_ctx *c, const json_t *s, int kinds, const js_irange *ir, int into,
                             int *n_alts) {
    const json_t *cst = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    if (en && !json_is_array(en))
        return ts_error(TS_ERR_INVALID, "JSON Schema keyword 'enum' at %s must be an array",
                        js_where(c));
    if (en && json_array_size(en) == 0)
        return ts_error(TS_ERR_INVALID,
                        "JSON Schema keyword 'enum' at %s is empty, so no value is allowed; "
                        "list at least one value",
                        js_where(c));
    size_t n = cst ? 1 : json_array_size(en);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = cst ? cst : json_array_get(en, i);
        if (!js_is_kind(v, kinds) || !js_in_range(v, ir)) continue;
        if (cst && en) { /* both: the const must be one of the enum values */
            bool in = false;
            for (size_t j = 0; j < json_array_size(en) && !in; j++)
                in = json_equal((json_t *)v, json_array_get(en, j));
            if (!in) continue;
        }
        bool dup = false; /* the same value twice would be two identical alternatives */
        for (size_t j = 0; j < i && !dup; j++)
            dup = json_equal((json_t *)v, json_array_get(en, j));
        if (dup) continue;
        char *text = js_dump(c, v);
        if (!text) return ts_error(TS_ERR_NOMEM, "JSON Schema: out of memory");
        js_lit(c, js_alt(c, into), text);
        free(text);
        (*n_alts)++;
    }
    return TS_OK;
}

/* ---- $ref -------------------------------------------------------------------------------- */

static int js_hexval(char h) {
    if (h >= '0' && h <= '9') return h - '0';
    if (h >= 'a' && h <= 'f') return h - 'a' + 10;
    if (h >= 'A' && h <= 'F') return h - 'A' + 10;
    return -1;
}

/* The node a "#..." reference points at, or NULL. The fragment is percent-decoded, then read
 * as a JSON pointer (~1 → /, ~0 → ~; array elements by index). */
static const json_t *js_resolve(const json_t *root, const char *ref, bool *oom) {
    size_t n = strlen(ref);
    char *buf = malloc(n + 1), *o = buf;
    *oom = !buf;
    if (!buf) return NULL;
    for (const char *p = ref + 1; *p; p++) { /* after the '#' */
        if (*p == '%' && js_hexval(p[1]) >= 0 && js_hexval(p[2]) >= 0) {
            *o++ = (char)(js_hexval(p[1]) * 16 + js_hexval(p[2]));
            p += 2;
        } else {
            *o++ = *p;
        }
    }
    *o = 0;
    const json_t *node = root;
    char *p = buf;
    while (node && *p == '/') {
        char *tok = ++p, *w = tok;
        for (; *p && *p != '/'; p++) {
            if (*p == '~' && p[1] == '1') {
                *w++ = '/';
                p++;
            } else if (*p == '~' && p[1] == '0') {
                *w++ = '~';
                p++;
            } else {
                *w++ = *p;
            }
        }
        char next = *p;
        *w = 0;
        if (json_is_object(node)) {
            node = json_object_get(node, tok);
        } else if (json_is_array(node)) {
            char *end;
            unsigned long i = strtoul(tok, &end, 10);
            bool ok = *tok >= '0' && *tok <= '9' && !*end && (tok[0] != '0' || !tok[1]);
            node = ok ? json_array_get(node, i) : NULL;
        } else {
            node = NULL;
        }
        *p = next;
    }
    if (*p) node = NULL; /* a fragment that is not a pointer: "#name" is checked by the caller */
    free(buf);
    return node;
}

/* The rule for a $ref's target (-1: it allows nothing). Each target is compiled once; its rule
 * exists before its schema is compiled, so a recursive schema refers back to it. A reference
 * back to a target still being compiled with no object or array entered since would be a rule
 * that expands to itself before reading a byte (e.g. {"$ref": "#"} at the root): refused. */
static ts_status js_ref_rule(js_ctx *c, const json_t *ref, int *rule) {
    if (!json_is_string(ref))
        return ts_error(TS_ERR_INVALID, "JSON Schema keyword '$ref' at %s must be a string",
                        js_where(c));
    const char *r = json_string_value(ref);
    if (r[0] != '#' || (r[1] && r[1] != '/'))
        return ts_error(TS_ERR_UNSUPPORTED,
                        "JSON Schema $ref '%s' at %s is not supported: only references into the "
                        "same document ('#', '#/$defs/name') are",
                        r, js_where(c));
    bool oom;
    const json_t *node = js_resolve(c->root, r, &oom);
    if (oom) return ts_error(TS_ERR_NOMEM, "JSON Schema: out of memory");
    if (!node)
        return ts_error(TS_ERR_INVALID,
                        "JSON Schema $ref '%s' at %s points to nothing in the schema", r,
                        js_where(c));
    for (int i = 0; i < c->n_targets; i++) {
        js_target *t = &c->targets[i];
        if (t->node != node) continue;
        if (t->busy && t->nest == c->nest)
            return ts_error(TS_ERR_INVALID,
                            "JSON Schema $ref '%s' at %s is a $ref cycle that matches nothing: it "
                            "refers back to itself without an object or array in between",
                            r, js_where(c));
        *rule = t->empty ? -1 : t->rule;
        return TS_OK;
    }
    if (c->n_targets == c->cap_targets) {
        int cap = c->cap_targets ? 2 * c->cap_targets : 16;
        js_target *p = realloc(c->targets, (size_t)cap * sizeof *p);
        if (!p) return ts_error(TS_ERR_NOMEM, "JSON Schema: out of memory");
        c->targets = p;
        c->cap_targets = cap;
    }
    int idx = c->n_targets++;
    int rr = js_rule(c);
    c->targets[idx] = (js_target){.node = node, .rule = rr, .nest = c->nest, .busy = true};

    /* Messages inside the target name its own place in the document. */
    char *saved = malloc(c->path_len + 1);
    if (!saved) return ts_error(TS_ERR_NOMEM, "JSON Schema: out of memory");
    memcpy(saved, c->path, c->path_len + 1);
    size_t saved_len = c->path_len;
    snprintf(c->path, sizeof c->path, "%s", r + 1);
    c->path_len = strlen(c->path);
    int n = 0;
    ts_status st = js_compile(c, (json_t *)node, rr, &n);
    memcpy(c->path, saved, saved_len + 1);
    c->path_len = saved_len;
    free(saved);
    TS_TRY(st);
    c->targets[idx].busy = false;
    if (n == 0) {
        js_never(c, rr);
        c->targets[idx].empty = true;
    }
    *rule = n ? rr : -1;
    return TS_OK;
}

/* ---- schemas ----------------------------------------------------------------------------- */

static bool js_in(const char *key, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(key, list[i])) return true;
    return false;
}

#define JS_COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* What a schema object holds: refuses the unsupported assertions, and names the first two
 * of the "parts" that would have to be intersected ($ref, anyOf, oneOf, allOf, and the value's
 * own keywords), since intersection is not implemented. */
typedef struct {
    const char *part[2];
    int n_parts;
    bool own;
} js_scan_t;

static ts_status js_scan(js_ctx *c, json_t *s, js_scan_t *sc) {
    const char *key;
    json_t *v;
    memset(sc, 0, sizeof *sc);
    const char *own_first = NULL;
    json_object_foreach(s, key, v) {
        if (js_in(key, js_refused, JS_COUNT(js_refused))) {
            if (!strcmp(key, "uniqueItems") && json_is_false(v)) continue; /* the default */
            return ts_error(TS_ERR_UNSUPPORTED,
                            "JSON Schema keyword '%s' at %s is not supported; remove it", key,
                            js_where(c));
        }
        const char *part = NULL;
        if (!strcmp(key, "$ref") || !strcmp(key, "anyOf") || !strcmp(key, "oneOf") ||
            !strcmp(key, "allOf"))
            part = key;
        else if (js_in(key, js_own, JS_COUNT(js_own))) {
            sc->own = true;
            if (!own_first) part = own_first = key;
        }
        if (part && sc->n_parts < 2) sc->part[sc->n_parts] = part;
        if (part) sc->n_parts++;
    }
    if (sc->n_parts > 1)
        return ts_error(TS_ERR_UNSUPPORTED,
                        "JSON Schema keywords '%s' and '%s' side by side at %s are not supported "
                        "(their intersection is not implemented); move '%s' into the schema "
                        "that '%s' leads to, or the other way round",
                        sc->part[0], sc->part[1], js_where(c), sc->part[1], sc->part[0]);
    return TS_OK;
}

/* The kinds `type` allows (JS_ANY without it); *explicit says whether it was there. */
static ts_status js_type(js_ctx *c, const json_t *s, int *kinds, bool *explicit) {
    const json_t *t = json_object_get(s, "type");
    *kinds = JS_ANY;
    *explicit = t != NULL;
    if (!t) return TS_OK;
    size_t n = json_is_array(t) ? json_array_size(t) : 1;
    if (json_is_array(t) && n == 0) goto bad;
    *kinds = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_is_array(t) ? json_array_get(t, i) : t;
        if (!json_is_string(e)) goto bad;
        size_t k = 0;
        while (k < JS_COUNT(js_types) && strcmp(json_string_value(e), js_types[k].name))
            k++;
        if (k == JS_COUNT(js_types)) goto bad;
        *kinds |= js_types[k].kind;
    }
    return TS_OK;
bad:
    return ts_error(TS_ERR_INVALID,
                    "JSON Schema keyword 'type' at %s must be one of object, array, string, "
                    "number, integer, boolean, null, or a non-empty array of them",
                    js_where(c));
}

/* properties / required / additionalProperties. additionalProperties ABSENT MEANS FALSE when
 * there are properties (JSON Schema says true): a generation should not invent keys the caller
 * did not ask for, and OpenAI's structured outputs require `false` anyway. Without properties
 * an absent additionalProperties keeps its JSON Schema meaning (any object), since `false`
 * would leave only {}. Extra keys are matched as any string, so one may repeat a known key. */
static ts_status js_object(js_ctx *c, json_t *s, int into, int *n_alts) {
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return ts_error(TS_ERR_INVALID, "JSON Schema keyword 'properties' at %s must be an object",
                        js_where(c));
    if (addl && !json_is_object(addl) && !json_is_boolean(addl))
        return ts_error(TS_ERR_INVALID,
                        "JSON Schema keyword 'additionalProperties' at %s must be a schema or a "
                        "boolean",
                        js_where(c));
    if (req && !json_is_array(req)) goto bad_required;
    for (size_t i = 0; i < json_array_size(req); i++) {
        const json_t *name = json_array_get(req, i);
        if (!json_is_string(name)) goto bad_required;
        if (!json_object_get(props, json_string_value(name)))
            return ts_error(TS_ERR_INVALID,
                            "JSON Schema keyword 'required' at %s names '%s', which is not in "
                            "'properties'; add it to 'properties' or drop it from 'required'",
                            js_where(c), json_string_value(name));
    }
    if (!props && (!addl || json_is_true(addl))) {
        js_ref(c, js_alt(c, into), js_object_any(c));
        (*n_alts)++;
        return TS_OK;
    }

    int addl_rule = -1;
    if (addl && !json_is_false(addl)) {
        size_t old = js_path_push(c, "additionalProperties");
        c->nest++;
        ts_status st = js_sub(c, addl, &addl_rule);
        c->nest--;
        js_path_pop(c, old);
        TS_TRY(st);
    }
    size_t np = json_object_size(props);
    char **keys = calloc(np + 1, sizeof *keys);
    int *vals = malloc((np + 1) * sizeof *vals), *rules = malloc(2 * (np + 1) * sizeof *rules);
    bool *required = malloc((np + 1) * sizeof *required);
    ts_status st = TS_OK;
    int n = 0;
    bool none = false; /* a required property allows no value */
    if (!keys || !vals || !rules || !required) {
        st = ts_error(TS_ERR_NOMEM, "JSON Schema: out of memory");
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(props, key, v) { /* jansson iterates in the document's order */
        bool is_req = false;
        for (size_t i = 0; i < json_array_size(req) && !is_req; i++)
            is_req = !strcmp(key, json_string_value(json_array_get(req, i)));
        size_t old = js_path_push(c, "properties");
        js_path_push(c, key);
        c->nest++;
        int rule;
        st = js_sub(c, v, &rule);
        c->nest--;
        js_path_pop(c, old);
        if (st != TS_OK) goto done;
        if (rule < 0) { /* e.g. "x": false: an optional x is left out, a required one is fatal */
            none = none || is_req;
            continue;
        }
        json_t *ks = json_string(key);
        keys[n] = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
        json_decref(ks);
        if (!keys[n]) {
            st = ts_error(TS_ERR_NOMEM, "JSON Schema: out of memory");
            goto done;
        }
        vals[n] = rule;
        required[n] = is_req;
        n++;
    }
    int run = 0;
    for (int i = 0; i < n && !none; i++) {
        run = required[i] ? 0 : run + 1;
        if (run > JS_MAX_OPTIONAL_RUN) {
            st = ts_error(TS_ERR_UNSUPPORTED,
                          "JSON Schema object at %s has more than %d optional properties in a "
                          "row; make some of them required or split the object",
                          js_where(c), JS_MAX_OPTIONAL_RUN);
            goto done;
        }
    }
    if (!none) {
        js_emit_object(c, into, n, keys, vals, required, addl_rule, rules);
        (*n_alts)++;
    }
done:
    for (size_t i = 0; keys && i < np; i++)
        free(keys[i]);
    free(keys);
    free(vals);
    free(rules);
    free(required);
    return st;
bad_required:
    return ts_error(TS_ERR_INVALID,
                    "JSON Schema keyword 'required' at %s must be an array of property names",
                    js_where(c));
}

/* items / prefixItems / minItems / maxItems, and draft 7's tuple form (items: [..] with
 * additionalItems for the rest). */
static ts_status js_array(js_ctx *c, json_t *s, int into, int *n_alts) {
    json_t *prefix = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items");
    const char *prefix_key = "prefixItems", *items_key = "items";
    if (json_is_array(items) && !prefix) {
        prefix = items;
        prefix_key = "items";
        items = json_object_get(s, "additionalItems");
        items_key = "additionalItems";
    }
    if (prefix && !json_is_array(prefix))
        return ts_error(TS_ERR_INVALID, "JSON Schema keyword 'prefixItems' at %s must be an array",
                        js_where(c));
    if (items && !json_is_object(items) && !json_is_boolean(items))
        return ts_error(TS_ERR_INVALID,
                        "JSON Schema keyword '%s' at %s must be a schema or a boolean", items_key,
                        js_where(c));
    long lo, hi;
    TS_TRY(js_bound(c, s, "minItems", 0, &lo));
    TS_TRY(js_bound(c, s, "maxItems", -1, &hi));
    if (hi >= 0 && lo > hi)
        return ts_error(TS_ERR_INVALID,
                        "JSON Schema at %s has minItems %ld above maxItems %ld, so no array is "
                        "allowed",
                        js_where(c), lo, hi);
    if (!prefix && (!items || json_is_true(items)) && lo == 0 && hi < 0) {
        js_ref(c, js_alt(c, into), js_array_any(c));
        (*n_alts)++;
        return TS_OK;
    }
    size_t k = json_array_size(prefix);
    int *pr = malloc((k + 1) * sizeof *pr);
    if (!pr) return ts_error(TS_ERR_NOMEM, "JSON Schema: out of memory");
    ts_status st = TS_OK;
    c->nest++;
    for (size_t i = 0; i < k && st == TS_OK; i++) {
        size_t old = js_path_push_index(c, prefix_key, i);
        st = js_sub(c, json_array_get(prefix, i), &pr[i]);
        js_path_pop(c, old);
    }
    int it = -1;
    if (st == TS_OK && (!items || !json_is_false(items))) {
        size_t old = js_path_push(c, items_key);
        st = items ? js_sub(c, items, &it) : TS_OK;
        if (!items) it = js_value(c);
        js_path_pop(c, old);
    }
    c->nest--;
    if (st == TS_OK) st = js_emit_array(c, into, pr, (int)k, it, lo, hi, n_alts);
    free(pr);
    return st;
}

/* The `format`s enforced on strings, as anchored patterns: the ones OpenAI's structured
 * outputs enforce that a regular grammar can say (JSON Schema 2020-12 leaves it to the
 * implementation whether format asserts). Dates and times by their fields' ranges (Feb 31 is
 * a date here; a calendar is not a grammar); email is the practical dot-atom@domain form.
 * Other formats stay annotations. */
/* clang-format off */
#define JS_DATE "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
#define JS_TIME "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]{1,9})?" \
                "([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
#define JS_OCTET "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
#define JS_LABEL "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
static const struct {
    const char *name, *pattern;
} js_formats[] = {
    {"date", "^" JS_DATE "$"},
    {"time", "^" JS_TIME "$"},
    {"date-time", "^" JS_DATE "[Tt]" JS_TIME "$"},
    {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
    {"ipv4", "^(" JS_OCTET "\\.){3}" JS_OCTET "$"},
    {"hostname", "^" JS_LABEL "(\\." JS_LABEL ")*$"},
    {"email", "^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@"
              JS_LABEL "(\\." JS_LABEL ")+$"},
};
/* clang-format on */

/* The pattern of an enforced format, or NULL (an annotation, or a format beside pattern,
 * minLength or maxLength, where it stays one: the intersection is not a rule). */
static const char *js_format_pattern(const json_t *s) {
    const json_t *f = json_object_get(s, "format");
    if (!json_is_string(f) || json_object_get(s, "pattern") || json_object_get(s, "minLength") ||
        json_object_get(s, "maxLength"))
        return NULL;
    for (size_t i = 0; i < JS_COUNT(js_formats); i++)
        if (!strcmp(json_string_value(f), js_formats[i].name)) return js_formats[i].pattern;
    return NULL;
}

/* A string matching a regular expression (regex_grammar.c: an ECMA-262 subset, searched for
 * unless anchored): `pattern`, or an enforced format's. */
static ts_status js_regex_string(js_ctx *c, const char *re, size_t len, int into, int *n_alts) {
    int content;
    ts_status st = ts_regex_rule(c->b, re, len, c->python, &content);
    if (st != TS_OK) {
        char where[JS_PATH_MAX + 32];
        snprintf(where, sizeof where, "JSON Schema at %s", js_where(c));
        return ts_error_prefix(st, where);
    }
    int a = js_alt(c, into);
    js_lit(c, a, "\"");
    js_ref(c, a, content);
    js_lit(c, a, "\"");
    (*n_alts)++;
    return TS_OK;
}

/* `pattern`. With minLength / maxLength too it would be the intersection of two languages,
 * which the rules cannot say: refused. */
static ts_status js_pattern(js_ctx *c, const json_t *s, const json_t *pat, int into, int *n_alts) {
    if (!json_is_string(pat))
        return ts_error(TS_ERR_INVALID, "JSON Schema at %s: 'pattern' must be a string",
                        js_where(c));
    if (json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
        return ts_error(TS_ERR_UNSUPPORTED,
                        "JSON Schema at %s: 'pattern' together with minLength or maxLength is not "
                        "supported; put the length into the pattern",
                        js_where(c));
    return js_regex_string(c, json_string_value(pat), json_string_length(pat), into, n_alts);
}

static ts_status js_string(js_ctx *c, json_t *s, int into, int *n_alts) {
    const json_t *pat = json_object_get(s, "pattern");
    if (pat) return js_pattern(c, s, pat, into, n_alts);
    const char *fmt = js_format_pattern(s);
    if (fmt) return js_regex_string(c, fmt, strlen(fmt), into, n_alts);
    long lo, hi;
    TS_TRY(js_bound(c, s, "minLength", 0, &lo));
    TS_TRY(js_bound(c, s, "maxLength", -1, &hi));
    if (hi >= 0 && lo > hi)
        return ts_error(TS_ERR_INVALID,
                        "JSON Schema at %s has minLength %ld above maxLength %ld, so no string is "
                        "allowed",
                        js_where(c), lo, hi);
    if (lo == 0 && hi < 0) {
        js_ref(c, js_alt(c, into), js_string_any(c));
        (*n_alts)++;
        return TS_OK;
    }
    return js_emit_string(c, into, lo, hi, n_alts);
}

/* anyOf / oneOf / allOf: the branches' alternatives go straight into `into`. oneOf is compiled
 * as anyOf: that exactly one branch matches is not enforced (it would need the complement of
 * the others), so a value matching two branches is accepted. */
static ts_status js_branches(js_ctx *c, json_t *s, const char *key, int into, int *n_alts) {
    json_t *br = json_object_get(s, key);
    if (!json_is_array(br) || json_array_size(br) == 0)
        return ts_error(TS_ERR_INVALID,
                        "JSON Schema keyword '%s' at %s must be a non-empty array of schemas", key,
                        js_where(c));
    if (!strcmp(key, "allOf") && json_array_size(br) != 1)
        return ts_error(TS_ERR_UNSUPPORTED,
                        "JSON Schema keyword 'allOf' at %s has %zu schemas; only one is "
                        "supported: merge them into one schema",
                        js_where(c), json_array_size(br));
    for (size_t i = 0; i < json_array_size(br); i++) {
        size_t old = js_path_push_index(c, key, i);
        ts_status st = js_compile(c, json_array_get(br, i), into, n_alts);
        js_path_pop(c, old);
        TS_TRY(st);
    }
    return TS_OK;
}

/* The value's own keywords: const/enum, else `type` (or, without it, the kinds its keywords
 * are about), one set of alternatives per kind. */
static ts_status js_own_kw(js_ctx *c, json_t *s, int into, int *n_alts) {
    int kinds;
    bool explicit;
    TS_TRY(js_type(c, s, &kinds, &explicit));
    js_irange ir; /* before the kinds are narrowed: without `type` a bound may meet a number */
    TS_TRY(js_int_bounds(c, s, kinds, &ir));
    if (json_object_get(s, "const") || json_object_get(s, "enum"))
        return js_literals(c, s, kinds, &ir, into, n_alts);
    if (!explicit) {
        static const struct {
            const char *key;
            int kind;
        } implies[] = {{"properties", JS_OBJECT},
                       {"required", JS_OBJECT},
                       {"additionalProperties", JS_OBJECT},
                       {"items", JS_ARRAY},
                       {"prefixItems", JS_ARRAY},
                       {"minItems", JS_ARRAY},
                       {"maxItems", JS_ARRAY},
                       {"minLength", JS_STRING},
                       {"maxLength", JS_STRING},
                       {"pattern", JS_STRING}};
        kinds = 0;
        for (size_t i = 0; i < JS_COUNT(implies); i++)
            if (json_object_get(s, implies[i].key)) kinds |= implies[i].kind;
        if (!kinds) kinds = JS_ANY;
    }
    if (kinds == JS_ANY) {
        js_ref(c, js_alt(c, into), js_value(c));
        (*n_alts)++;
        return TS_OK;
    }
    if (kinds & JS_OBJECT) TS_TRY(js_object(c, s, into, n_alts));
    if (kinds & JS_ARRAY) TS_TRY(js_array(c, s, into, n_alts));
    if (kinds & JS_STRING) TS_TRY(js_string(c, s, into, n_alts));
    if (kinds & (JS_NUMBER | JS_INTEGER)) { /* number includes integer: one alternative */
        int r;
        if (kinds & JS_NUMBER) {
            r = js_number(c);
        } else if (ir.on) { /* the grammar's integers have at most JS_INT_DIGITS digits */
            long long lo = ir.lo > -JS_INT_MAX ? ir.lo : -JS_INT_MAX;
            long long hi = ir.hi < JS_INT_MAX ? ir.hi : JS_INT_MAX;
            if (lo > hi)
                return ts_error(TS_ERR_INVALID,
                                "JSON Schema at %s allows no value that can be generated: its "
                                "bounds leave no integer of at most %d digits, the longest "
                                "written here",
                                js_where(c), JS_INT_DIGITS);
            r = js_integer_range(c, lo, hi);
        } else {
            r = js_integer(c);
        }
        js_ref(c, js_alt(c, into), r);
        (*n_alts)++;
    }
    if (kinds & JS_BOOLEAN) {
        js_ref(c, js_alt(c, into), js_bool(c));
        (*n_alts)++;
    }
    if (kinds & JS_NULL) {
        js_lit(c, js_alt(c, into), js_word(c, "null"));
        (*n_alts)++;
    }
    return TS_OK;
}

/* Adds the alternatives of schema s to rule `into`, counting them in *n_alts (none: s allows
 * no value). */
static ts_status js_compile(js_ctx *c, json_t *s, int into, int *n_alts) {
    if (json_is_true(s)) {
        js_ref(c, js_alt(c, into), js_value(c));
        (*n_alts)++;
        return TS_OK;
    }
    if (json_is_false(s)) return TS_OK;
    if (!json_is_object(s))
        return ts_error(TS_ERR_INVALID, "JSON Schema at %s is not an object or a boolean",
                        js_where(c));
    if (c->depth >= JS_MAX_DEPTH)
        return ts_error(TS_ERR_UNSUPPORTED,
                        "JSON Schema at %s is nested more than %d levels deep; flatten it",
                        js_where(c), JS_MAX_DEPTH);
    js_scan_t sc;
    TS_TRY(js_scan(c, s, &sc));
    c->depth++;
    ts_status st;
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        int rule;
        st = js_ref_rule(c, ref, &rule);
        if (st == TS_OK && rule >= 0) {
            js_ref(c, js_alt(c, into), rule);
            (*n_alts)++;
        }
    } else if (json_object_get(s, "anyOf")) {
        st = js_branches(c, s, "anyOf", into, n_alts);
    } else if (json_object_get(s, "oneOf")) {
        st = js_branches(c, s, "oneOf", into, n_alts);
    } else if (json_object_get(s, "allOf")) {
        st = js_branches(c, s, "allOf", into, n_alts);
    } else if (sc.own) {
        st = js_own_kw(c, s, into, n_alts);
    } else { /* only annotations: any value */
        js_ref(c, js_alt(c, into), js_value(c));
        (*n_alts)++;
        st = TS_OK;
    }
    c->depth--;
    return st;
}

/* The shared rule schema s is exactly, or -1: `true`, {} (annotations only), {"type": T} with
 * nothing that narrows T. Saves a rule per such property or item. */
static int js_shared(js_ctx *c, json_t *s) {
    if (json_is_true(s)) return js_value(c);
    if (!json_is_object(s)) return -1;
    const char *key;
    json_t *v;
    const char *type = NULL;
    json_object_foreach(s, key, v) {
        if (!strcmp(key, "type") && json_is_string(v))
            type = json_string_value(v);
        else if (js_in(key, js_own, JS_COUNT(js_own)) ||
                 js_in(key, js_refused, JS_COUNT(js_refused)) || !strcmp(key, "$ref") ||
                 !strcmp(key, "anyOf") || !strcmp(key, "oneOf") || !strcmp(key, "allOf"))
            return -1;
    }
    if (!type) return json_object_get(s, "type") ? -1 : js_value(c);
    if (!strcmp(type, "string")) return js_format_pattern(s) ? -1 : js_string_any(c);
    if (!strcmp(type, "number")) return js_number(c);
    if (!strcmp(type, "integer")) return js_integer(c);
    if (!strcmp(type, "boolean")) return js_bool(c);
    if (!strcmp(type, "object")) return js_object_any(c);
    if (!strcmp(type, "array")) return js_array_any(c);
    return -1;
}

/* The rule for the values of subschema s (a property's, an item's): a shared rule, a $ref's
 * target, or a new rule; -1 when s allows no value. */
static ts_status js_sub(js_ctx *c, json_t *s, int *rule) {
    *rule = js_shared(c, s);
    if (*rule >= 0) return TS_OK;
    json_t *ref = json_object_get(s, "$ref");
    if (ref) { /* $ref beside annotations only: its target's rule, no wrapper */
        js_scan_t sc;
        TS_TRY(js_scan(c, s, &sc));
        if (sc.n_parts == 1) return js_ref_rule(c, ref, rule);
    }
    int r = js_rule(c), n = 0;
    TS_TRY(js_compile(c, s, r, &n));
    if (n == 0) js_never(c, r); /* unreferenced; the builder wants an alternative */
    *rule = n ? r : -1;
    return TS_OK;
}

/* The value rule of a schema (NULL: any object) in the builder b - the part the stand-alone
 * grammar and one embedded in another grammar share - and, when lead is not NULL, the rule of
 * the whitespace allowed before a stand-alone value. */
static ts_status schema_value(ts_gbuild *b, const char *schema, size_t len, bool python, int *value,
                              int *lead) {
    js_ctx c;
    memset(&c, 0, sizeof c);
    c.b = b;
    c.python = python;
    c.r_ws = c.r_lead = c.r_char = c.r_esc = c.r_strtail = -1;
    c.r_string = c.r_integer = c.r_number = c.r_bool = c.r_value = c.r_object = c.r_array = -1;
    for (int i = 0; i <= JS_DIGIT_CHAIN; i++)
        c.digits[i] = -1;
    for (int i = 0; i < JS_INT_DIGITS; i++)
        c.exact[i] = -1;
    ts_status st = TS_OK;
    if (!schema) {
        *value = js_object_any(&c); /* JSON mode: any object */
    } else {
        json_error_t err;
        c.root = json_loadb(schema, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &err);
        if (!c.root)
            return ts_error(TS_ERR_INVALID,
                            "JSON Schema is not valid JSON: %s (line %d, column %d)", err.text,
                            err.line, err.column);
        if (!json_is_object(c.root) && !json_is_boolean(c.root))
            st = ts_error(TS_ERR_INVALID, "JSON Schema must be an object or a boolean");
        /* The root is a $ref target like any other, so "#" refers to it. */
        json_t *ref = st == TS_OK ? json_string("#") : NULL;
        if (st == TS_OK)
            st = ref ? js_ref_rule(&c, ref, value)
                     : ts_error(TS_ERR_NOMEM, "JSON Schema: out of memory");
        json_decref(ref);
        if (st == TS_OK && *value < 0)
            st = ts_error(TS_ERR_INVALID,
                          "JSON Schema allows no value (e.g. it is false, or a required property "
                          "is false); nothing could be generated");
    }
    if (st == TS_OK && lead) *lead = js_lead(&c);
    json_decref(c.root);
    free(c.targets);
    free(c.strtail_n);
    return st;
}

ts_status ts_json_schema_rule(ts_gbuild *b, const char *schema, size_t len, bool python,
                              int *rule) {
    return schema_value(b, schema, len, python, rule, NULL);
}

ts_status ts_grammar_from_json_schema(const char *schema, size_t len, ts_grammar **out) {
    *out = NULL;
    ts_gbuild *b;
    TS_TRY(ts_gbuild_create(&b));
    int root = ts_gbuild_rule(b), value, lead;
    ts_status st = schema_value(b, schema, len, false, &value, &lead);
    if (st == TS_OK) {
        int a = ts_gbuild_alt(b, root);
        ts_gbuild_ref(b, a, lead);
        ts_gbuild_ref(b, a, value);
        st = ts_gbuild_finish(b, root, out);
    }
    ts_gbuild_free(b);
    return st;
}
