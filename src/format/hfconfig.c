/* config.json access: the JSON tree is kept (jansson) and queried by dotted key. */
#include "format/hfconfig.h"

#include "base/mmapfile.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Real configs are a few KiB; 4 MiB leaves room for long vocab-ish lists and nothing worse. */
#define HFC_FILE_CAP ((size_t)4 << 20)
#define HFC_KEY_MAX  256

struct ts_hfconfig {
    char *path;
    json_t *root;
    json_t *text; /* the text_config object, or root when not composite */
};

ts_status ts_hfconfig_load(const char *dir, ts_hfconfig **out) {
    return ts_hfconfig_load_file(dir, "config.json", out);
}

ts_status ts_hfconfig_load_file(const char *dir, const char *name, ts_hfconfig **out) {
    *out = NULL;
    ts_hfconfig *c = calloc(1, sizeof *c);
    size_t dl = strlen(dir), nl = strlen(name);
    if (c) c->path = malloc(dl + nl + 2);
    if (!c || !c->path) {
        free(c);
        return ts_error(TS_ERR_NOMEM, "%s/%s: out of memory", dir, name);
    }
    memcpy(c->path, dir, dl);
    snprintf(c->path + dl, nl + 2, "%s%s", dl && dir[dl - 1] == '/' ? "" : "/", name);

    char *buf;
    size_t len;
    ts_status rc = ts_read_file(c->path, HFC_FILE_CAP, &buf, &len);
    if (rc != TS_OK) {
        ts_hfconfig_free(c);
        return rc;
    }
    json_error_t jerr;
    c->root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    free(buf);
    if (!c->root) {
        rc = ts_error(TS_ERR_FORMAT, "%s: malformed JSON at line %d, column %d: %s", c->path,
                      jerr.line, jerr.column, jerr.text);
    } else if (!json_is_object(c->root)) {
        rc = ts_error(TS_ERR_FORMAT, "%s: not a JSON object", c->path);
    } else {
        json_t *tc = json_object_get(c->root, "text_config");
        if (json_is_object(tc))
            c->text = tc;
        else if (!tc || json_is_null(tc))
            c->text = c->root;
        else
            rc = ts_error(TS_ERR_FORMAT, "%s: field 'text_config': expected an object", c->path);
    }
    if (rc != TS_OK) {
        ts_hfconfig_free(c);
        return rc;
    }
    *out = c;
    return TS_OK;
}

void ts_hfconfig_free(ts_hfconfig *c) {
    if (!c) return;
    json_decref(c->root);
    free(c->path);
    free(c);
}

const char *ts_hfconfig_path(const ts_hfconfig *c) { return c->path; }

bool ts_hfconfig_is_composite(const ts_hfconfig *c) { return c->text != c->root; }

const char *ts_hfconfig_model_type(const ts_hfconfig *c) {
    return json_string_value(json_object_get(c->text, "model_type"));
}

const char *ts_hfconfig_top_model_type(const ts_hfconfig *c) {
    return json_string_value(json_object_get(c->root, "model_type"));
}

/* Follows a dotted path from obj; NULL when any step is absent or not an object. */
static json_t *hfc_walk(json_t *obj, const char *key) {
    char part[HFC_KEY_MAX];
    const char *p = key;
    for (;;) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        if (n >= sizeof part || !json_is_object(obj)) return NULL;
        memcpy(part, p, n);
        part[n] = 0;
        obj = json_object_get(obj, part);
        if (!dot || !obj) return obj;
        p = dot + 1;
    }
}

/* Text section first, then the top level; JSON null is treated as absent. */
static json_t *hfc_find(const ts_hfconfig *c, const char *key) {
    json_t *v = hfc_walk(c->text, key);
    if ((!v || json_is_null(v)) && c->text != c->root) v = hfc_walk(c->root, key);
    return v && !json_is_null(v) ? v : NULL;
}

bool ts_hfconfig_has(const ts_hfconfig *c, const char *key) { return hfc_find(c, key) != NULL; }

static const char *hfc_brief(const json_t *v, char *buf, size_t size) {
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!s)
        snprintf(buf, size, "?");
    else if (strlen(s) >= size && size > 4)
        snprintf(buf, size, "%.*s...", (int)(size - 4), s);
    else
        snprintf(buf, size, "%s", s);
    free(s);
    return buf;
}

static ts_status hfc_missing(const ts_hfconfig *c, const char *key) {
    return ts_error(TS_ERR_FORMAT, "%s: field '%s': missing", c->path, key);
}

static ts_status hfc_wrong(const ts_hfconfig *c, const char *key, const char *want,
                           const json_t *v) {
    char got[64];
    return ts_error(TS_ERR_FORMAT, "%s: field '%s': expected %s, got %s", c->path, key, want,
                    hfc_brief(v, got, sizeof got));
}

static ts_status hfc_int_of(const ts_hfconfig *c, const char *key, const json_t *v, int64_t min,
                            int64_t max, int64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max) {
        char want[96];
        snprintf(want, sizeof want, "an integer in [%" PRId64 ", %" PRId64 "]", min, max);
        return hfc_wrong(c, key, want, v);
    }
    *out = (int64_t)json_integer_value(v);
    return TS_OK;
}

static ts_status hfc_float_of(const ts_hfconfig *c, const char *key, const json_t *v, double *out) {
    if (!json_is_number(v)) return hfc_wrong(c, key, "a number", v);
    *out = json_number_value(v);
    return TS_OK;
}

static ts_status hfc_bool_of(const ts_hfconfig *c, const char *key, const json_t *v, bool *out) {
    if (!json_is_boolean(v)) return hfc_wrong(c, key, "true or false", v);
    *out = json_is_true(v);
    return TS_OK;
}

static ts_status hfc_str_of(const ts_hfconfig *c, const char *key, const json_t *v,
                            const char **out) {
    if (!json_is_string(v)) return hfc_wrong(c, key, "a string", v);
    *out = json_string_value(v);
    return TS_OK;
}

ts_status ts_hfconfig_int(const ts_hfconfig *c, const char *key, int64_t min, int64_t max,
                          int64_t *out) {
    const json_t *v = hfc_find(c, key);
    return v ? hfc_int_of(c, key, v, min, max, out) : hfc_missing(c, key);
}

ts_status ts_hfconfig_float(const ts_hfconfig *c, const char *key, double *out) {
    const json_t *v = hfc_find(c, key);
    return v ? hfc_float_of(c, key, v, out) : hfc_missing(c, key);
}

ts_status ts_hfconfig_bool(const ts_hfconfig *c, const char *key, bool *out) {
    const json_t *v = hfc_find(c, key);
    return v ? hfc_bool_of(c, key, v, out) : hfc_missing(c, key);
}

ts_status ts_hfconfig_str(const ts_hfconfig *c, const char *key, const char **out) {
    const json_t *v = hfc_find(c, key);
    return v ? hfc_str_of(c, key, v, out) : hfc_missing(c, key);
}

ts_status ts_hfconfig_int_opt(const ts_hfconfig *c, const char *key, int64_t min, int64_t max,
                              int64_t dflt, int64_t *out) {
    const json_t *v = hfc_find(c, key);
    if (!v) {
        *out = dflt;
        return TS_OK;
    }
    return hfc_int_of(c, key, v, min, max, out);
}

ts_status ts_hfconfig_float_opt(const ts_hfconfig *c, const char *key, double dflt, double *out) {
    const json_t *v = hfc_find(c, key);
    if (!v) {
        *out = dflt;
        return TS_OK;
    }
    return hfc_float_of(c, key, v, out);
}

ts_status ts_hfconfig_bool_opt(const ts_hfconfig *c, const char *key, bool dflt, bool *out) {
    const json_t *v = hfc_find(c, key);
    if (!v) {
        *out = dflt;
        return TS_OK;
    }
    return hfc_bool_of(c, key, v, out);
}

ts_status ts_hfconfig_str_opt(const ts_hfconfig *c, const char *key, const char *dflt,
                              const char **out) {
    const json_t *v = hfc_find(c, key);
    if (!v) {
        *out = dflt;
        return TS_OK;
    }
    return hfc_str_of(c, key, v, out);
}

/* The typed array readers' shared part: v (key's value) must be an array whose every item
 * passes ok; the error names the first item that does not (expected `item`). */
static bool hfc_is_string(const json_t *x) { return json_is_string(x); }
static bool hfc_is_integer(const json_t *x) { return json_is_integer(x); }
static bool hfc_is_number(const json_t *x) { return json_is_number(x); }

static ts_status hfc_items(const ts_hfconfig *c, const char *key, const json_t *v,
                           const char *whole, bool (*ok)(const json_t *), const char *item) {
    if (!json_is_array(v)) return hfc_wrong(c, key, whole, v);
    if (json_array_size(v) > INT32_MAX) return hfc_wrong(c, key, "a shorter array", v);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *x = json_array_get(v, i);
        if (!ok(x)) {
            char got[64];
            return ts_error(TS_ERR_FORMAT, "%s: field '%s': item %zu: expected %s, got %s", c->path,
                            key, i, item, hfc_brief(x, got, sizeof got));
        }
    }
    return TS_OK;
}

ts_status ts_hfconfig_str_array(const ts_hfconfig *c, const char *key, const char **items, int cap,
                                int *n) {
    *n = 0;
    const json_t *v = hfc_find(c, key);
    if (!v) return hfc_missing(c, key);
    TS_TRY(hfc_items(c, key, v, "an array of strings", hfc_is_string, "a string"));
    *n = (int)json_array_size(v);
    for (int i = 0; i < *n && i < cap; i++)
        items[i] = json_string_value(json_array_get(v, i));
    return TS_OK;
}

ts_status ts_hfconfig_int_array(const ts_hfconfig *c, const char *key, int64_t *items, int cap,
                                int *n) {
    *n = 0;
    const json_t *v = hfc_find(c, key);
    if (!v) return hfc_missing(c, key);
    if (json_is_integer(v)) {
        if (cap > 0) items[0] = (int64_t)json_integer_value(v);
        *n = 1;
        return TS_OK;
    }
    TS_TRY(
        hfc_items(c, key, v, "an integer or an array of integers", hfc_is_integer, "an integer"));
    *n = (int)json_array_size(v);
    for (int i = 0; i < *n && i < cap; i++)
        items[i] = (int64_t)json_integer_value(json_array_get(v, i));
    return TS_OK;
}

ts_status ts_hfconfig_float_array(const ts_hfconfig *c, const char *key, double *items, int cap,
                                  int *n) {
    *n = 0;
    const json_t *v = hfc_find(c, key);
    if (!v) return hfc_missing(c, key);
    TS_TRY(hfc_items(c, key, v, "an array of numbers", hfc_is_number, "a number"));
    *n = (int)json_array_size(v);
    for (int i = 0; i < *n && i < cap; i++)
        items[i] = json_number_value(json_array_get(v, i));
    return TS_OK;
}
