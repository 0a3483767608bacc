#include "cli/images.h"

#include <stdio.h>
#include <stdlib.h>

int cli_images_read(cli_images *ci, int k) {
    char *data;
    size_t len;
    if (!cli_read_file(ci->path[k], (size_t)256 << 20, &data, &len)) {
        fprintf(stderr, "tessera: cannot read '%s'\n", ci->path[k]);
        return CLI_EXIT_USAGE;
    }
    ts_status st = ts_image_decode(data, len, &ci->img[k]);
    free(data);
    if (st == TS_OK)
        st = ts_vision_plan(&ci->vinfo, ci->img[k]->width, ci->img[k]->height, &ci->plan[k]);
    if (st != TS_OK) {
        fprintf(stderr, "tessera: %s: %s\n", ci->path[k], ts_last_error());
        ts_image_free(ci->img[k]);
        ci->img[k] = NULL;
        return CLI_EXIT_ERROR;
    }
    ci->tokens[k] = ci->plan[k].n_tokens;
    return 0;
}

int cli_images_load(cli_images *ci, const char *model_path) {
    ts_model *m;
    if (!model_path) return cli_usage("missing -m MODEL");
    if (ts_model_open(model_path, &m) != TS_OK) return cli_fail("cannot load model");
    bool vision = ts_model_vision(m, &ci->vinfo);
    ts_model_close(m);
    if (!vision) return cli_usage("--image: the model %s takes no images", model_path);
    for (int k = 0; k < ci->n; k++) {
        int rc = cli_images_read(ci, k);
        if (rc) return rc;
    }
    return 0;
}

int cli_images_prompt(const cli_images *ci, const ts_tokenizer *tok, const char *text,
                      int32_t **ids, size_t *n) {
    ts_content_part parts[CLI_MAX_IMAGES + 1];
    for (int k = 0; k < ci->n; k++)
        parts[k].text = NULL;
    parts[ci->n].text = text;
    ts_chat_message msg = {.role = "user", .parts = parts, .n_parts = ci->n + 1};
    ts_chat_params cp = {.add_generation_prompt = true,
                         .enable_thinking = -1,
                         .image_tokens = ci->tokens,
                         .n_images = ci->n};
    if (ts_chat_tokenize(tok, &msg, 1, &cp, ids, n) != TS_OK) return cli_fail("chat template");
    return 0;
}

int cli_images_bind(cli_images *ci, ts_engine *e, int n_embd, const int32_t *ids, int n,
                    int32_t at) {
    size_t rows = 0;
    for (int k = 0; k < ci->n; k++)
        rows += (size_t)ci->plan[k].n_tokens;
    ci->embd = malloc((rows ? rows : 1) * n_embd * sizeof *ci->embd);
    ci->rows = calloc((size_t)n, sizeof *ci->rows);
    ci->rope = malloc((size_t)n * 3 * sizeof *ci->rope);
    if (!ci->embd || !ci->rows || !ci->rope) return cli_usage("out of memory");
    if (ts_vision_rope_positions(&ci->vinfo, ids, n, ci->plan, ci->n, ci->rope, &ci->delta) !=
        TS_OK)
        return cli_fail("--image");
    for (int i = 0; i < 3 * n; i++) /* the positions continue what the slot holds */
        ci->rope[i] += at;
    size_t row = 0;
    double t0 = cli_now();
    for (int k = 0; k < ci->n; k++) {
        if (ts_engine_encode_image(e, ci->img[k], &ci->plan[k], ci->embd + row * n_embd) != TS_OK)
            return cli_fail(ci->path[k]);
        row += (size_t)ci->plan[k].n_tokens;
    }
    for (int i = 0, r = 0; i < n; i++)
        if (ids[i] == ci->vinfo.image_token) ci->rows[i] = ci->embd + (size_t)r++ * n_embd;
    fprintf(stderr, "%d image(s), %zu tokens, encoded in %.1f ms\n", ci->n, rows,
            (cli_now() - t0) * 1e3);
    return 0;
}

void cli_images_free(cli_images *ci) {
    for (int k = 0; k < ci->n; k++)
        ts_image_free(ci->img[k]);
    free(ci->embd);
    free(ci->rows);
    free(ci->rope);
    ci->n = 0;
    ci->embd = NULL, ci->rows = NULL, ci->rope = NULL;
}
