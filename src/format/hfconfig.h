/* Typed access to a Hugging Face config.json.
 *
 * A composite config (one with a "text_config" object, e.g. Qwen3.5's vision-language wrapper)
 * is read text-first: every lookup tries the text section, then falls back to the top level, so
 * a key such as tie_word_embeddings that both levels carry resolves to the text model's value.
 * Keys may be dotted paths into nested objects ("rope_parameters.rope_theta"); the fallback applies
 * to the whole path. A JSON null counts as absent everywhere.
 *
 * Errors are TS_ERR_FORMAT with one line naming the file and the key as asked for:
 *   <dir>/config.json: field 'hidden_size': missing
 *   <dir>/config.json: field 'hidden_size': expected an integer in [1, 1048576], got 0
 * Strings returned by the accessors belong to the config and stay valid until ts_hfconfig_free. */
#ifndef TS_FORMAT_HFCONFIG_H
#define TS_FORMAT_HFCONFIG_H

#include "base/status.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct ts_hfconfig ts_hfconfig;

/* Loads dir/config.json (at most 4 MiB; duplicate keys are refused). */
ts_status ts_hfconfig_load(const char *dir, ts_hfconfig **out);
/* The same for another JSON file of the directory (e.g. "preprocessor_config.json"). */
ts_status ts_hfconfig_load_file(const char *dir, const char *name, ts_hfconfig **out);
void ts_hfconfig_free(ts_hfconfig *c);

/* ".../config.json", for the caller's own messages. */
const char *ts_hfconfig_path(const ts_hfconfig *c);
/* model_type of the text section (the top level when not composite), e.g. "qwen3_5_text";
 * NULL when absent or not a string. */
const char *ts_hfconfig_model_type(const ts_hfconfig *c);
/* model_type of the top level, e.g. "qwen3_5"; NULL when absent or not a string. */
const char *ts_hfconfig_top_model_type(const ts_hfconfig *c);
bool ts_hfconfig_is_composite(const ts_hfconfig *c);
/* True when the key resolves to a non-null value. */
bool ts_hfconfig_has(const ts_hfconfig *c, const char *key);

/* Required values: missing, null, wrong type or out of range is an error. */
ts_status ts_hfconfig_int(const ts_hfconfig *c, const char *key, int64_t min, int64_t max,
                          int64_t *out);
ts_status ts_hfconfig_float(const ts_hfconfig *c, const char *key, double *out); /* ints too */
ts_status ts_hfconfig_bool(const ts_hfconfig *c, const char *key, bool *out);
ts_status ts_hfconfig_str(const ts_hfconfig *c, const char *key, const char **out);

/* Optional values: absent or null stores dflt and returns TS_OK; present but of the wrong type
 * (or out of range) is an error, never silently replaced by the default. */
ts_status ts_hfconfig_int_opt(const ts_hfconfig *c, const char *key, int64_t min, int64_t max,
                              int64_t dflt, int64_t *out);
ts_status ts_hfconfig_float_opt(const ts_hfconfig *c, const char *key, double dflt, double *out);
ts_status ts_hfconfig_bool_opt(const ts_hfconfig *c, const char *key, bool dflt, bool *out);
ts_status ts_hfconfig_str_opt(const ts_hfconfig *c, const char *key, const char *dflt,
                              const char **out);

/* Required array of strings (e.g. "layer_types"): *n gets the length, items[0..min(n,cap)) the
 * strings; items may be NULL when cap is 0. Every element is checked, even past cap. */
ts_status ts_hfconfig_str_array(const ts_hfconfig *c, const char *key, const char **items, int cap,
                                int *n);
/* Required integer or array of integers (eos_token_id is either): a lone integer reads as an
 * array of one. Same filling rule as ts_hfconfig_str_array. */
ts_status ts_hfconfig_int_array(const ts_hfconfig *c, const char *key, int64_t *items, int cap,
                                int *n);
/* Required array of numbers (e.g. "image_mean"), filled as ts_hfconfig_str_array. */
ts_status ts_hfconfig_float_array(const ts_hfconfig *c, const char *key, double *items, int cap,
                                  int *n);

#endif
