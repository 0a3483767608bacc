/* config.json access: text-only and composite configs, dotted keys, text-first lookup, optional
 * values, arrays, and the exact error messages. */
#include "format/hfconfig.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64];
static char dirs[8][128];
static int n_dirs;

/* Writes text as <tmpdir>/<name>/config.json and returns the directory. */
static const char *config_dir(const char *name, const char *text) {
    char *d = dirs[n_dirs++ % 8];
    snprintf(d, sizeof dirs[0], "%s/%s", tmpdir, name);
    mkdir(d, 0755);
    char p[256];
    snprintf(p, sizeof p, "%s/config.json", d);
    FILE *f = fopen(p, "wb");
    if (!f) exit(2);
    fputs(text, f);
    fclose(f);
    return d;
}

static ts_hfconfig *load(const char *dir) {
    ts_hfconfig *c = NULL;
    ts_status rc = ts_hfconfig_load(dir, &c);
    CHECKF(rc == TS_OK && c, "load %s: %s", dir, ts_last_error());
    return c;
}

/* The last error must be FORMAT-like text holding the config path and the fragment. */
static void expect_msg(ts_status rc, ts_status want, const ts_hfconfig *c, const char *frag) {
    const char *msg = ts_last_error();
    if (getenv("TS_VERBOSE")) printf("%s\n", msg);
    CHECKF(rc == want, "got %s, want %s (%s)", ts_status_name(rc), ts_status_name(want), msg);
    if (c) CHECKF(strstr(msg, ts_hfconfig_path(c)) != NULL, "no path in: %s", msg);
    CHECKF(strstr(msg, frag) != NULL, "no '%s' in: %s", frag, msg);
}

static const char *GEMMA = "{\n"
                           "  \"architectures\": [\"Gemma3ForCausalLM\"],\n"
                           "  \"model_type\": \"gemma3_text\",\n"
                           "  \"hidden_size\": 640,\n"
                           "  \"num_hidden_layers\": 18,\n"
                           "  \"rms_norm_eps\": 1e-06,\n"
                           "  \"rope_theta\": 1000000.0,\n"
                           "  \"tie_word_embeddings\": true,\n"
                           "  \"eos_token_id\": [1, 106],\n"
                           "  \"bos_token_id\": 2,\n"
                           "  \"layer_types\": [\"sliding_attention\", \"sliding_attention\",\n"
                           "                    \"full_attention\"],\n"
                           "  \"hidden_act\": \"gelu_pytorch_tanh\",\n"
                           "  \"rope_scaling\": null,\n"
                           "  \"bad_int\": \"12\",\n"
                           "  \"bad_list\": [\"a\", 2],\n"
                           "  \"bad_ids\": [1, \"x\"],\n"
                           "  \"frac\": 2.5\n"
                           "}\n";

static void test_text_only(void) {
    const char *dir = config_dir("gemma", GEMMA);
    ts_hfconfig *c = load(dir);
    if (!c) return;
    char want[256];
    snprintf(want, sizeof want, "%s/config.json", dir);
    CHECK(strcmp(ts_hfconfig_path(c), want) == 0);
    CHECK(!ts_hfconfig_is_composite(c));
    CHECK(strcmp(ts_hfconfig_model_type(c), "gemma3_text") == 0);
    CHECK(strcmp(ts_hfconfig_top_model_type(c), "gemma3_text") == 0);

    int64_t i = 0;
    double x = 0;
    bool b = false;
    const char *s = NULL;
    CHECK(ts_hfconfig_int(c, "hidden_size", 1, 1 << 20, &i) == TS_OK && i == 640);
    CHECK(ts_hfconfig_float(c, "rms_norm_eps", &x) == TS_OK && x == 1e-6);
    CHECK(ts_hfconfig_float(c, "hidden_size", &x) == TS_OK && x == 640.0); /* int as float */
    CHECK(ts_hfconfig_bool(c, "tie_word_embeddings", &b) == TS_OK && b);
    CHECK(ts_hfconfig_str(c, "hidden_act", &s) == TS_OK && strcmp(s, "gelu_pytorch_tanh") == 0);

    /* Required fields: missing / wrong type / out of range. */
    expect_msg(ts_hfconfig_int(c, "num_attention_heads", 1, 1024, &i), TS_ERR_FORMAT, c,
               "config.json: field 'num_attention_heads': missing");
    expect_msg(ts_hfconfig_int(c, "bad_int", 1, 1048576, &i), TS_ERR_FORMAT, c,
               "field 'bad_int': expected an integer in [1, 1048576], got \"12\"");
    expect_msg(ts_hfconfig_int(c, "hidden_size", 1, 512, &i), TS_ERR_FORMAT, c,
               "field 'hidden_size': expected an integer in [1, 512], got 640");
    expect_msg(ts_hfconfig_int(c, "hidden_size", 1000, 2000, &i), TS_ERR_FORMAT, c,
               "expected an integer in [1000, 2000], got 640");
    expect_msg(ts_hfconfig_int(c, "frac", 0, 10, &i), TS_ERR_FORMAT, c, "got 2.5");
    expect_msg(ts_hfconfig_int(c, "tie_word_embeddings", 0, 1, &i), TS_ERR_FORMAT, c, "got true");
    expect_msg(ts_hfconfig_float(c, "hidden_act", &x), TS_ERR_FORMAT, c,
               "field 'hidden_act': expected a number, got \"gelu_pytorch_tanh\"");
    expect_msg(ts_hfconfig_bool(c, "bos_token_id", &b), TS_ERR_FORMAT, c,
               "field 'bos_token_id': expected true or false, got 2");
    expect_msg(ts_hfconfig_str(c, "hidden_size", &s), TS_ERR_FORMAT, c,
               "field 'hidden_size': expected a string, got 640");
    expect_msg(ts_hfconfig_str(c, "rope_scaling", &s), TS_ERR_FORMAT, c,
               "field 'rope_scaling': missing"); /* null is absent */
    expect_msg(ts_hfconfig_float(c, "hidden_size.x", &x), TS_ERR_FORMAT, c,
               "field 'hidden_size.x': missing");

    /* Optional fields: absent or null -> default; present -> value; wrong type -> error. */
    i = -1;
    CHECK(ts_hfconfig_int_opt(c, "sliding_window", 1, 1 << 20, 4096, &i) == TS_OK && i == 4096);
    CHECK(ts_hfconfig_int_opt(c, "hidden_size", 1, 1 << 20, 7, &i) == TS_OK && i == 640);
    expect_msg(ts_hfconfig_int_opt(c, "hidden_size", 1, 100, 7, &i), TS_ERR_FORMAT, c,
               "expected an integer in [1, 100], got 640");
    expect_msg(ts_hfconfig_int_opt(c, "bad_int", 0, 100, 7, &i), TS_ERR_FORMAT, c,
               "field 'bad_int'");
    CHECK(ts_hfconfig_float_opt(c, "rope_scaling", 3.5, &x) == TS_OK && x == 3.5);
    CHECK(ts_hfconfig_float_opt(c, "rope_theta", 3.5, &x) == TS_OK && x == 1e6);
    expect_msg(ts_hfconfig_float_opt(c, "hidden_act", 1.0, &x), TS_ERR_FORMAT, c,
               "expected a number");
    CHECK(ts_hfconfig_bool_opt(c, "attention_bias", true, &b) == TS_OK && b);
    CHECK(ts_hfconfig_bool_opt(c, "tie_word_embeddings", false, &b) == TS_OK && b);
    expect_msg(ts_hfconfig_bool_opt(c, "hidden_size", false, &b), TS_ERR_FORMAT, c,
               "expected true or false");
    CHECK(ts_hfconfig_str_opt(c, "hidden_act", "silu", &s) == TS_OK && strcmp(s, "silu") != 0);
    CHECK(ts_hfconfig_str_opt(c, "nope", "silu", &s) == TS_OK && strcmp(s, "silu") == 0);

    CHECK(ts_hfconfig_has(c, "hidden_size"));
    CHECK(!ts_hfconfig_has(c, "rope_scaling"));
    CHECK(!ts_hfconfig_has(c, "nope"));

    /* Arrays. */
    const char *types[2] = {NULL, NULL};
    int n = -1;
    CHECK(ts_hfconfig_str_array(c, "layer_types", types, 2, &n) == TS_OK && n == 3);
    CHECK(types[0] && strcmp(types[0], "sliding_attention") == 0);
    CHECK(types[1] && strcmp(types[1], "sliding_attention") == 0);
    CHECK(ts_hfconfig_str_array(c, "layer_types", NULL, 0, &n) == TS_OK && n == 3);
    expect_msg(ts_hfconfig_str_array(c, "bad_list", types, 2, &n), TS_ERR_FORMAT, c,
               "field 'bad_list': item 1: expected a string, got 2");
    expect_msg(ts_hfconfig_str_array(c, "hidden_act", types, 2, &n), TS_ERR_FORMAT, c,
               "expected an array of strings");
    expect_msg(ts_hfconfig_str_array(c, "absent_list", types, 2, &n), TS_ERR_FORMAT, c,
               "field 'absent_list': missing");

    int64_t ids[4] = {0, 0, 0, 0};
    CHECK(ts_hfconfig_int_array(c, "eos_token_id", ids, 4, &n) == TS_OK && n == 2);
    CHECK(ids[0] == 1 && ids[1] == 106);
    CHECK(ts_hfconfig_int_array(c, "bos_token_id", ids, 4, &n) == TS_OK && n == 1 && ids[0] == 2);
    CHECK(ts_hfconfig_int_array(c, "eos_token_id", ids, 1, &n) == TS_OK && n == 2);
    expect_msg(ts_hfconfig_int_array(c, "bad_ids", ids, 4, &n), TS_ERR_FORMAT, c,
               "field 'bad_ids': item 1: expected an integer, got \"x\"");
    expect_msg(ts_hfconfig_int_array(c, "hidden_act", ids, 4, &n), TS_ERR_FORMAT, c,
               "expected an integer or an array of integers");
    ts_hfconfig_free(c);
}

static const char *QWEN = "{\n"
                          "  \"architectures\": [\"Qwen3_5ForConditionalGeneration\"],\n"
                          "  \"model_type\": \"qwen3_5\",\n"
                          "  \"image_token_id\": 248056,\n"
                          "  \"tie_word_embeddings\": false,\n"
                          "  \"head_dim\": 99,\n"
                          "  \"rope_parameters\": {\"rope_type\": \"top\", \"top_only\": 5},\n"
                          "  \"text_config\": {\n"
                          "    \"model_type\": \"qwen3_5_text\",\n"
                          "    \"hidden_size\": 1024,\n"
                          "    \"head_dim\": null,\n"
                          "    \"tie_word_embeddings\": true,\n"
                          "    \"eos_token_id\": 248044,\n"
                          "    \"layer_types\": [\"linear_attention\", \"linear_attention\",\n"
                          "                      \"linear_attention\", \"full_attention\"],\n"
                          "    \"rope_parameters\": {\n"
                          "      \"rope_type\": \"default\",\n"
                          "      \"rope_theta\": 10000000,\n"
                          "      \"partial_rotary_factor\": 0.25,\n"
                          "      \"mrope_section\": [11, 11, 10],\n"
                          "      \"mrope_interleaved\": true\n"
                          "    }\n"
                          "  },\n"
                          "  \"vision_config\": {\"depth\": 12, \"hidden_size\": 768}\n"
                          "}\n";

static void test_composite(void) {
    const char *dir = config_dir("qwen", QWEN);
    ts_hfconfig *c = load(dir);
    if (!c) return;
    CHECK(ts_hfconfig_is_composite(c));
    CHECK(strcmp(ts_hfconfig_model_type(c), "qwen3_5_text") == 0);
    CHECK(strcmp(ts_hfconfig_top_model_type(c), "qwen3_5") == 0);

    int64_t i = 0;
    double x = 0;
    bool b = false;
    const char *s = NULL;
    int n = 0;
    CHECK(ts_hfconfig_int(c, "hidden_size", 1, 1 << 20, &i) == TS_OK && i == 1024); /* not 768 */
    CHECK(ts_hfconfig_bool(c, "tie_word_embeddings", &b) == TS_OK && b);            /* text wins */
    CHECK(ts_hfconfig_int(c, "image_token_id", 0, 1 << 30, &i) == TS_OK && i == 248056); /* top */
    CHECK(ts_hfconfig_int(c, "head_dim", 1, 1024, &i) == TS_OK && i == 99); /* null -> top */
    CHECK(ts_hfconfig_float(c, "rope_parameters.rope_theta", &x) == TS_OK && x == 1e7);
    CHECK(ts_hfconfig_int(c, "rope_parameters.rope_theta", 1, 1LL << 40, &i) == TS_OK &&
          i == 10000000);
    CHECK(ts_hfconfig_float(c, "rope_parameters.partial_rotary_factor", &x) == TS_OK && x == 0.25);
    CHECK(ts_hfconfig_bool(c, "rope_parameters.mrope_interleaved", &b) == TS_OK && b);
    CHECK(ts_hfconfig_str(c, "rope_parameters.rope_type", &s) == TS_OK &&
          strcmp(s, "default") == 0);
    /* A dotted key missing in the text section falls back to the same path at the top. */
    CHECK(ts_hfconfig_int(c, "rope_parameters.top_only", 0, 10, &i) == TS_OK && i == 5);
    CHECK(ts_hfconfig_int(c, "vision_config.depth", 1, 100, &i) == TS_OK && i == 12);
    CHECK(ts_hfconfig_int(c, "text_config.hidden_size", 1, 1 << 20, &i) == TS_OK && i == 1024);
    int64_t sec[3] = {0, 0, 0};
    CHECK(ts_hfconfig_int_array(c, "rope_parameters.mrope_section", sec, 3, &n) == TS_OK &&
          n == 3 && sec[0] == 11 && sec[1] == 11 && sec[2] == 10);
    int64_t eos[2] = {0, 0};
    CHECK(ts_hfconfig_int_array(c, "eos_token_id", eos, 2, &n) == TS_OK && n == 1 &&
          eos[0] == 248044);
    const char *types[8];
    CHECK(ts_hfconfig_str_array(c, "layer_types", types, 8, &n) == TS_OK && n == 4 &&
          strcmp(types[3], "full_attention") == 0);

    expect_msg(ts_hfconfig_float(c, "rope_parameters.mrope_theta", &x), TS_ERR_FORMAT, c,
               "field 'rope_parameters.mrope_theta': missing");
    expect_msg(ts_hfconfig_int(c, "rope_parameters.rope_type", 0, 1, &i), TS_ERR_FORMAT, c,
               "field 'rope_parameters.rope_type': expected an integer in [0, 1], got \"default\"");
    ts_hfconfig_free(c);
}

static void test_load_errors(void) {
    ts_hfconfig *c = (ts_hfconfig *)1;
    char missing[128];
    snprintf(missing, sizeof missing, "%s/none", tmpdir);
    expect_msg(ts_hfconfig_load(missing, &c), TS_ERR_IO, NULL, "none/config.json: cannot open");
    CHECK(c == NULL);

    expect_msg(ts_hfconfig_load(config_dir("malformed", "{\"a\": 1,\n \"b\": }"), &c),
               TS_ERR_FORMAT, NULL, "config.json: malformed JSON at line 2");
    CHECK(c == NULL);
    expect_msg(ts_hfconfig_load(config_dir("array", "[1, 2]"), &c), TS_ERR_FORMAT, NULL,
               "config.json: not a JSON object");
    expect_msg(ts_hfconfig_load(config_dir("dup", "{\"a\": 1, \"a\": 2}"), &c), TS_ERR_FORMAT, NULL,
               "duplicate");
    expect_msg(ts_hfconfig_load(config_dir("tc", "{\"text_config\": 3}"), &c), TS_ERR_FORMAT, NULL,
               "field 'text_config': expected an object");
    expect_msg(ts_hfconfig_load(config_dir("empty", ""), &c), TS_ERR_FORMAT, NULL, "malformed");

    /* Over the 4 MiB cap. */
    size_t big = (4u << 20) + 16;
    char *text = malloc(big + 1);
    memset(text, ' ', big);
    text[0] = '{';
    text[big - 1] = '}';
    text[big] = 0;
    expect_msg(ts_hfconfig_load(config_dir("big", text), &c), TS_ERR_FORMAT, NULL, "limit");
    free(text);

    /* text_config null = not composite; a trailing slash on the directory is fine. */
    char slash[160];
    snprintf(slash, sizeof slash, "%s/",
             config_dir("nulltc", "{\"text_config\": null, "
                                  "\"model_type\": \"x\"}"));
    c = load(slash);
    if (c) {
        CHECK(!ts_hfconfig_is_composite(c));
        CHECK(strcmp(ts_hfconfig_model_type(c), "x") == 0);
        CHECK(strstr(ts_hfconfig_path(c), "//") == NULL);
        ts_hfconfig_free(c);
    }
    c = load(config_dir("notype", "{\"text_config\": {}}"));
    if (c) {
        CHECK(ts_hfconfig_is_composite(c));
        CHECK(ts_hfconfig_model_type(c) == NULL && ts_hfconfig_top_model_type(c) == NULL);
        ts_hfconfig_free(c);
    }
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ts_hfconfig_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    test_text_only();
    test_composite();
    test_load_errors();
    if (!tu_failures) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    }
    return tu_report("test_hfconfig");
}
