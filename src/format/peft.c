/* adapter_config.json (peft.h): jansson, read once at load. */
#include "format/peft.h"

#include "base/mmapfile.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PEFT_FILE_CAP ((size_t)1 << 20)

static ts_status bad(const ts_peft_config *c, const char *field, const char *why) {
    return ts_error(TS_ERR_FORMAT, "%s: field '%s': %s", c->path, field, why);
}

static ts_status unsupported(const ts_peft_config *c, const char *field, const char *what) {
    return ts_error(TS_ERR_UNSUPPORTED, "%s: field '%s': %s is not supported", c->path, field,
                    what);
}

/* A field that must be absent, null, false or empty for the plain LoRA forward. */
static bool set_field(const json_t *v) {
    if (!v || json_is_null(v) || json_is_false(v)) return false;
    if (json_is_array(v)) return json_array_size(v) > 0;
    if (json_is_object(v)) return json_object_size(v) > 0;
    return true;
}

static ts_status read_alpha_pattern(ts_peft_config *c, const json_t *ap) {
    if (!ap || json_is_null(ap)) return TS_OK;
    if (!json_is_object(ap)) return bad(c, "alpha_pattern", "expected an object");
    size_t n = json_object_size(ap);
    c->alpha_pattern = calloc(n ? n : 1, sizeof *c->alpha_pattern);
    if (!c->alpha_pattern) return ts_error(TS_ERR_NOMEM, "out of memory");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)ap, key, v) {
        if (!json_is_number(v)) return bad(c, "alpha_pattern", "expected numbers");
        /* PEFT reads a key as a regular expression; names (dots and all) are what is met in
         * practice, and a dot then stands for itself */
        if (strpbrk(key, "*+?[](){}|^$\\"))
            return unsupported(c, "alpha_pattern", "a regular expression as a key");
        ts_peft_alpha *p = &c->alpha_pattern[c->n_alpha];
        if (!(p->pattern = strdup(key))) return ts_error(TS_ERR_NOMEM, "out of memory");
        p->alpha = json_number_value(v);
        c->n_alpha++;
    }
    return TS_OK;
}

static ts_status read_config(ts_peft_config *c, const json_t *root) {
    if (!json_is_object(root)) return ts_error(TS_ERR_FORMAT, "%s: not a JSON object", c->path);
    const json_t *type = json_object_get(root, "peft_type");
    if (type && !json_is_null(type)) {
        if (!json_is_string(type)) return bad(c, "peft_type", "expected a string");
        if (strcmp(json_string_value(type), "LORA") != 0)
            return ts_error(TS_ERR_UNSUPPORTED,
                            "%s: peft_type '%s': only LoRA adapters are supported", c->path,
                            json_string_value(type));
    }
    const json_t *r = json_object_get(root, "r");
    if (!json_is_integer(r) || json_integer_value(r) < 1 || json_integer_value(r) > 65536)
        return bad(c, "r", "expected an integer in [1, 65536]");
    c->r = (int)json_integer_value(r);
    const json_t *a = json_object_get(root, "lora_alpha");
    c->alpha = c->r; /* PEFT's default is 8; a config always carries it */
    if (a && !json_is_null(a)) {
        if (!json_is_number(a)) return bad(c, "lora_alpha", "expected a number");
        c->alpha = json_number_value(a);
    }
    const json_t *rs = json_object_get(root, "use_rslora");
    if (rs && !json_is_null(rs) && !json_is_boolean(rs))
        return bad(c, "use_rslora", "expected a boolean");
    c->rslora = json_is_true(rs);
    static const struct {
        const char *field, *what;
    } refused[] = {
        {"use_dora", "DoRA (weight-decomposed LoRA)"},
        {"fan_in_fan_out", "fan_in_fan_out (weights stored transposed, as GPT-2's Conv1D)"},
        {"lora_bias", "a trained bias in lora_B"},
        {"modules_to_save", "modules_to_save (whole modules replaced by trained copies)"},
        {"trainable_token_indices", "trainable token embeddings"},
        {"layer_replication", "layer replication"},
        {"target_parameters", "target_parameters (adapted parameters, not modules)"},
        {"use_qalora", "QA-LoRA"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (set_field(json_object_get(root, refused[i].field)))
            return unsupported(c, refused[i].field, refused[i].what);
    const json_t *bias = json_object_get(root, "bias");
    if (bias && !json_is_null(bias) &&
        (!json_is_string(bias) || strcmp(json_string_value(bias), "none") != 0))
        return unsupported(c, "bias", "a bias other than \"none\" (trained biases)");
    return read_alpha_pattern(c, json_object_get(root, "alpha_pattern"));
}

ts_status ts_peft_config_load(const char *dir, ts_peft_config *c) {
    memset(c, 0, sizeof *c);
    size_t dl = strlen(dir);
    const char *name = "adapter_config.json";
    c->path = malloc(dl + strlen(name) + 2);
    if (!c->path) return ts_error(TS_ERR_NOMEM, "out of memory");
    sprintf(c->path, "%s%s%s", dir, dl && dir[dl - 1] == '/' ? "" : "/", name);
    char *buf;
    size_t len;
    ts_status st = ts_read_file(c->path, PEFT_FILE_CAP, &buf, &len);
    if (st != TS_OK) {
        ts_peft_config_free(c);
        return st;
    }
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    free(buf);
    if (!root)
        st = ts_error(TS_ERR_FORMAT, "%s: malformed JSON at line %d, column %d: %s", c->path,
                      jerr.line, jerr.column, jerr.text);
    else
        st = read_config(c, root);
    json_decref(root);
    if (st != TS_OK) ts_peft_config_free(c);
    return st;
}

void ts_peft_config_free(ts_peft_config *c) {
    for (int i = 0; i < c->n_alpha; i++)
        free(c->alpha_pattern[i].pattern);
    free(c->alpha_pattern);
    free(c->path);
    memset(c, 0, sizeof *c);
}

/* Whether pattern names module: all of it, or its end after a '.' */
static bool names(const char *pattern, const char *module) {
    size_t p = strlen(pattern), m = strlen(module);
    if (p > m || strcmp(module + m - p, pattern) != 0) return false;
    return p == m || module[m - p - 1] == '.';
}

double ts_peft_scale(const ts_peft_config *c, const char *module, int r) {
    double alpha = c->alpha;
    for (int i = 0; i < c->n_alpha; i++)
        if (names(c->alpha_pattern[i].pattern, module)) {
            alpha = c->alpha_pattern[i].alpha;
            break;
        }
    return c->rslora ? alpha / sqrt((double)r) : alpha / r;
}
