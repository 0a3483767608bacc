/* The loader refuses every kind of broken checkpoint with TS_ERR_* and one line that names the
 * file and the tensor or field: missing files, unknown architecture, a missing tensor, a wrong
 * shape, an unsupported dtype, truncated weights, a bad config value, an absent untied head.
 * Broken copies of a fixture model are written with the project's own safetensors writer. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/safetensors.h"
#include "testutil.h"
#include "tessera.h"

static char src[1024], tmp[1024];

/* Copies the fixture's tensors into tmp/model.safetensors, letting edit() drop (return 0),
 * rename or reshape them. */
typedef int (*edit_fn)(const char *name, char *new_name, ts_dtype *dt, int *nd, int64_t *shape);

static void write_model(edit_fn edit) {
    ts_st *st;
    if (ts_st_open(src, &st) != TS_OK) {
        fprintf(stderr, "%s\n", ts_last_error());
        exit(1);
    }
    ts_st_writer *w;
    CHECK(ts_st_writer_new(&w) == TS_OK);
    size_t n = ts_st_count(st);
    const ts_tensor **keep = calloc(n, sizeof *keep);
    for (size_t i = 0; i < n; i++) {
        const char *name = ts_st_name(st, i);
        const ts_tensor *t = ts_st_find(st, name);
        char nn[512];
        snprintf(nn, sizeof nn, "%s", name);
        ts_dtype dt = t->dtype;
        int nd = t->n_dims;
        int64_t shape[TS_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        if (edit && !edit(name, nn, &dt, &nd, shape)) continue;
        CHECK(ts_st_writer_add(w, nn, dt, nd, shape) == TS_OK);
        keep[i] = t;
    }
    char path[2048];
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    CHECK(ts_st_writer_begin(w, path) == TS_OK);
    for (size_t i = 0; i < n; i++)
        if (keep[i]) CHECK(ts_st_writer_write(w, keep[i]->data, keep[i]->nbytes) == TS_OK);
    CHECK(ts_st_writer_end(w) == TS_OK);
    ts_st_writer_free(w);
    free(keep);
    ts_st_close(st);
}

static void write_config(const char *from, const char *to) {
    char path[2048];
    snprintf(path, sizeof path, "%s/config.json", src);
    FILE *f = fopen(path, "r");
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    snprintf(path, sizeof path, "%s/config.json", tmp);
    f = fopen(path, "w");
    char *hit = from ? strstr(buf, from) : NULL;
    if (from && !hit) {
        fprintf(stderr, "config edit: '%s' not found\n", from);
        tu_failures++;
    }
    if (hit) {
        fwrite(buf, 1, (size_t)(hit - buf), f);
        fputs(to, f);
        fputs(hit + strlen(from), f);
    } else {
        fputs(buf, f);
    }
    fclose(f);
}

static void expect_fail(const char *label, ts_status want, const char *frag1, const char *frag2) {
    ts_model *m = NULL;
    ts_status st = ts_model_open(tmp, &m);
    const char *msg = ts_last_error();
    CHECKF(st == want, "%s: status %d (%s), want %d", label, st, msg, want);
    CHECKF(!frag1 || strstr(msg, frag1), "%s: message '%s' lacks '%s'", label, msg, frag1);
    CHECKF(!frag2 || strstr(msg, frag2), "%s: message '%s' lacks '%s'", label, msg, frag2);
    CHECK(strchr(msg, '\n') == NULL);
    if (m) ts_model_close(m);
    printf("%-22s -> %s\n", label, msg);
}

static int drop_gate(const char *name, char *nn, ts_dtype *dt, int *nd, int64_t *shape) {
    (void)nn, (void)dt, (void)nd, (void)shape;
    return strcmp(name, "model.layers.1.mlp.gate_proj.weight") != 0;
}
static int reshape_up(const char *name, char *nn, ts_dtype *dt, int *nd, int64_t *shape) {
    (void)nn, (void)dt;
    /* same byte size, different shape: only the shape check can catch it */
    if (strcmp(name, "model.layers.0.mlp.up_proj.weight") == 0) {
        shape[0] *= 2;
        shape[1] /= 2;
        (void)nd;
    }
    return 1;
}
static int rename_head(const char *name, char *nn, ts_dtype *dt, int *nd, int64_t *shape) {
    (void)dt, (void)nd, (void)shape;
    if (strcmp(name, "lm_head.weight") == 0) strcpy(nn, "lm_head_renamed.weight");
    return 1;
}

/* the multi-token-prediction block's (tests/fixtures/qwen35_mtp) */
static int drop_mtp_up(const char *name, char *nn, ts_dtype *dt, int *nd, int64_t *shape) {
    (void)nn, (void)dt, (void)nd, (void)shape;
    return strcmp(name, "mtp.layers.0.mlp.up_proj.weight") != 0;
}
static int drop_mtp_fc(const char *name, char *nn, ts_dtype *dt, int *nd, int64_t *shape) {
    (void)nn, (void)dt, (void)nd, (void)shape;
    return strcmp(name, "mtp.fc.weight") != 0;
}
static int reshape_mtp_fc(const char *name, char *nn, ts_dtype *dt, int *nd, int64_t *shape) {
    (void)nn, (void)dt, (void)nd;
    if (strcmp(name, "mtp.fc.weight") == 0) { /* [D, 2D] read as [2D, D] */
        int64_t r = shape[0];
        shape[0] = shape[1], shape[1] = r;
    }
    return 1;
}

int main(void) {
    snprintf(src, sizeof src, "%s/qwen35/tiny_c_f32_untied_hv2x",
             tu_env("TS_FIXTURES", "tests/fixtures"));
    snprintf(tmp, sizeof tmp, "/tmp/ts_model_errors_XXXXXX");
    CHECK(mkdtemp(tmp) != NULL);

    /* sanity: an unedited copy loads */
    write_config(NULL, NULL);
    write_model(NULL);
    ts_model *m;
    CHECKF(ts_model_open(tmp, &m) == TS_OK, "clean copy: %s", ts_last_error());
    ts_model_close(m);

    write_config("\"qwen3_5_text\"", "\"llama9\"");
    expect_fail("unknown architecture", TS_ERR_UNSUPPORTED, "config.json", "llama9");
    write_config("\"hidden_size\": 64", "\"hidden_size\": \"64\"");
    expect_fail("wrong-typed field", TS_ERR_FORMAT, "config.json", "hidden_size");
    write_config("\"hidden_size\": 64,", "");
    expect_fail("missing field", TS_ERR_FORMAT, "config.json", "hidden_size");
    write_config("\"hidden_size\": 64", "\"hidden_size\": 48");
    expect_fail("config/weights mismatch", TS_ERR_FORMAT, "embed_tokens", "shape");
    write_config(NULL, NULL);

    write_model(drop_gate);
    expect_fail("missing tensor", TS_ERR_FORMAT, "missing tensor", "layers.1.mlp.gate_proj");
    write_model(reshape_up);
    expect_fail("wrong shape", TS_ERR_FORMAT, "model.safetensors", "layers.0.mlp.up_proj");
    write_model(rename_head);
    expect_fail("untied head absent", TS_ERR_FORMAT, "lm_head.weight", NULL);

    /* an MTP block that is there must be whole, in its shapes; one without its projection is
     * none (converters drop the block) */
    char qsrc[1024];
    snprintf(qsrc, sizeof qsrc, "%s", src);
    snprintf(src, sizeof src, "%s/qwen35_mtp/tiny_mtp", tu_env("TS_FIXTURES", "tests/fixtures"));
    write_config(NULL, NULL);
    write_model(drop_mtp_up);
    expect_fail("MTP block incomplete", TS_ERR_FORMAT, "missing tensor",
                "mtp.layers.0.mlp.up_proj");
    write_model(reshape_mtp_fc);
    expect_fail("MTP fc's shape", TS_ERR_FORMAT, "model.safetensors", "mtp.fc.weight");
    write_model(drop_mtp_fc);
    CHECKF(ts_model_open(tmp, &m) == TS_OK, "MTP block without fc: %s", ts_last_error());
    if (m) {
        ts_model_info info;
        ts_model_get_info(m, &info);
        CHECK(!info.mtp);
        CHECK(ts_model_mtp_enable(m) == TS_ERR_UNSUPPORTED);
        ts_model_close(m);
    }
    snprintf(src, sizeof src, "%s", qsrc);
    write_config(NULL, NULL);

    /* truncated weights file */
    write_model(NULL);
    char path[2048];
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    struct stat sb;
    stat(path, &sb);
    CHECK(truncate(path, sb.st_size - 1000) == 0);
    expect_fail("truncated weights", TS_ERR_FORMAT, "model.safetensors", NULL);
    unlink(path);
    expect_fail("no weights", TS_ERR_IO, NULL, NULL);
    snprintf(path, sizeof path, "%s/config.json", tmp);
    unlink(path);
    expect_fail("no config", TS_ERR_IO, "config.json", NULL);
    rmdir(tmp);
    CHECK(ts_model_open("/nonexistent/model", &m) == TS_ERR_IO);
    return tu_report("test_model_errors");
}
