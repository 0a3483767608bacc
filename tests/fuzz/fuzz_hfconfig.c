/* libFuzzer target for the config.json reader: any input must be refused with a status or
 * loaded and then answer every accessor with a value or a one-line error. ts_hfconfig_load
 * takes a directory, so each input is written as <scratch dir>/config.json (fuzz_util.h). The
 * keys asked for are the ones the model loaders read, plain and dotted, at both levels of a
 * composite config. */
#include "format/hfconfig.h"
#include "fuzz_util.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const keys[] = {
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "rms_norm_eps",
    "rope_theta",
    "tie_word_embeddings",
    "eos_token_id",
    "layer_types",
    "rope_scaling",
    "rope_parameters.rope_theta",
    "rope_scaling.factor",
    "rope_parameters.partial_rotary_factor",
    "text_config",
    "text_config.hidden_size",
    "a.b.c.d",
    "",
    ".",
    "..",
    "head_dim",
    "vocab_size",
    "linear_num_value_heads",
    "sliding_window",
    "final_logit_softcapping",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_write("config.json", data, size);
    ts_hfconfig *c;
    if (ts_hfconfig_load(fz_tmpdir(), &c) != TS_OK) {
        FZ_ASSERT(ts_last_error()[0]);
        return 0;
    }
    fz_sink += strlen(ts_hfconfig_path(c)) + ts_hfconfig_is_composite(c);
    const char *s = ts_hfconfig_model_type(c);
    if (s) fz_sink += strlen(s);
    s = ts_hfconfig_top_model_type(c);
    if (s) fz_sink += strlen(s);
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const char *key = keys[k];
        int64_t i, ia[4];
        double x;
        bool b;
        const char *sa[4];
        int n;
        fz_sink += ts_hfconfig_has(c, key);
        ts_hfconfig_int(c, key, 1, 1 << 20, &i);
        ts_hfconfig_int(c, key, INT64_MIN, INT64_MAX, &i);
        ts_hfconfig_float(c, key, &x);
        ts_hfconfig_bool(c, key, &b);
        if (ts_hfconfig_str(c, key, &s) == TS_OK) fz_sink += strlen(s);
        ts_hfconfig_int_opt(c, key, 0, 100, 7, &i);
        ts_hfconfig_float_opt(c, key, 0.5, &x);
        ts_hfconfig_bool_opt(c, key, true, &b);
        if (ts_hfconfig_str_opt(c, key, "d", &s) == TS_OK) fz_sink += strlen(s);
        if (ts_hfconfig_str_array(c, key, sa, 4, &n) == TS_OK)
            for (int j = 0; j < n && j < 4; j++)
                fz_sink += strlen(sa[j]);
        ts_hfconfig_str_array(c, key, NULL, 0, &n);
        if (ts_hfconfig_int_array(c, key, ia, 4, &n) == TS_OK)
            for (int j = 0; j < n && j < 4; j++)
                fz_sink += (unsigned long)ia[j];
    }
    ts_hfconfig_free(c);
    return 0;
}
