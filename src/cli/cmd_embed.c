/* tessera embed: one input's embedding, as the server's /v1/embeddings makes it - the final
 * hidden states of its tokens pooled (the model's own pooling, else the last token's), through
 * an embedding model's Dense layers, to unit length - printed as a JSON array. */
#include "cli/common_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The input's ids: --ids as given, or -p's text through the model's tokenizer (a BOS, and an
 * EOS where the tokenizer adds them, as the server's inputs get them). */
static bool input_ids(const char *model, const char *ids_arg, const char *text, bool special,
                      int32_t **ids, int *n) {
    if (ids_arg) return cli_parse_ids(ids_arg, ids, n);
    ts_tokenizer *tok;
    if (ts_tokenizer_open(model, &tok) != TS_OK) return cli_fail("cannot load tokenizer"), false;
    size_t nn = 0;
    ts_status st = ts_tokenize(tok, text, strlen(text), special, ids, &nn);
    ts_tokenizer_free(tok);
    if (st != TS_OK) return cli_fail("cannot tokenize the input"), false;
    *n = (int)nn;
    return true;
}

int cmd_embed(int argc, char **argv) {
    cli_engine_args ea = {.model_path = cli_default_model()};
    const char *ids_arg = NULL, *text = NULL, *v;
    bool special = false;
    ts_pooling pool = TS_POOL_UNSET;
    for (int i = 1; i < argc; i++) {
        int r = cli_engine_opt(argc, argv, &i, &ea);
        if (r < 0) return CLI_EXIT_USAGE;
        if (r > 0) continue;
        if ((v = cli_opt_value(argc, argv, &i, NULL, "--ids")))
            ids_arg = v;
        else if ((v = cli_opt_value(argc, argv, &i, "-p", "--prompt")))
            text = v;
        else if (strcmp(argv[i], "--special") == 0)
            special = true;
        else if ((v = cli_opt_value(argc, argv, &i, NULL, "--pooling"))) {
            if (!cli_parse_pooling(v, &pool))
                return cli_usage("embed: bad --pooling '%s' (last, mean or cls)", v);
        } else
            return cli_usage("embed: unknown option '%s'", argv[i]);
    }
    if (!ids_arg == !text) return cli_usage("embed: give the input as -p TEXT or --ids 1,2,3");
    int32_t *ids = NULL;
    int n = 0;
    if (!input_ids(ea.model_path, ids_arg, text, special, &ids, &n)) {
        free(ids);
        return ids_arg ? cli_usage("embed: --ids needs a comma-separated list of token ids")
                       : CLI_EXIT_ERROR;
    }
    if (n < 1) {
        free(ids);
        return cli_usage("embed: the input is empty");
    }
    if (!ea.n_ctx) ea.n_ctx = n;
    ts_model *model;
    ts_engine *engine;
    int rc = cli_open(&ea, &model, &engine);
    if (rc) {
        free(ids);
        return rc;
    }
    ts_model_info info;
    ts_model_get_info(model, &info);
    if (!pool) pool = info.pooling ? info.pooling : TS_POOL_LAST;
    int D = info.n_embd, W = info.n_embd_out;
    float *hidden = malloc((size_t)n * D * sizeof *hidden), *pooled = calloc((size_t)D, 4),
          *out = malloc((size_t)W * sizeof *out);
    if (!hidden || !pooled || !out) {
        rc = cli_fail("out of memory");
        goto done;
    }
    double t0 = cli_now();
    if (!cli_forward_all(engine, ids, n, true, hidden)) {
        rc = CLI_EXIT_ERROR;
        goto done;
    }
    for (int k = 0; k < D; k++) { /* the mean in double, as the server sums it */
        double s = 0;
        for (int i = 0; pool == TS_POOL_MEAN && i < n; i++)
            s += hidden[(size_t)i * D + k];
        pooled[k] = pool == TS_POOL_MEAN    ? (float)(s / n)
                    : pool == TS_POOL_FIRST ? hidden[k]
                                            : hidden[(size_t)(n - 1) * D + k];
    }
    if (ts_model_embed_finish(model, 1, pooled, out) != TS_OK) {
        rc = cli_fail("embedding failed");
        goto done;
    }
    double dt = cli_now() - t0;
    for (int k = 0; k < W; k++)
        printf(k ? ",%.9g" : "[%.9g", (double)out[k]);
    printf("]\n");
    static const char *const names[] = {"", "last", "mean", "cls"};
    fprintf(stderr, "tokens %d, width %d, pooling %s, %.1f ms (%s)\n", n, W, names[pool], dt * 1e3,
            ts_engine_describe(engine));
done:
    free(ids), free(hidden), free(pooled), free(out);
    ts_engine_free(engine);
    ts_model_close(model);
    return rc;
}
