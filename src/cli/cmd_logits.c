/* tessera logits: one prefill of the given ids; every position's logits to a file, or with
 * --hidden its final hidden state (the output head's input, what embeddings are pooled from). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/common_model.h"

int cmd_logits(int argc, char **argv) {
    cli_engine_args ea = {.model_path = cli_default_model()};
    const char *ids_arg = NULL, *out_path = NULL, *v;
    bool hidden = false;
    for (int i = 1; i < argc; i++) {
        int r = cli_engine_opt(argc, argv, &i, &ea);
        if (r < 0) return CLI_EXIT_USAGE;
        if (r > 0) continue;
        if ((v = cli_opt_value(argc, argv, &i, NULL, "--ids")))
            ids_arg = v;
        else if ((v = cli_opt_value(argc, argv, &i, "-o", "--output")))
            out_path = v;
        else if (strcmp(argv[i], "--hidden") == 0)
            hidden = true;
        else
            return cli_usage("logits: unknown option '%s'", argv[i]);
    }
    int32_t *ids;
    int n;
    if (!cli_parse_ids(ids_arg, &ids, &n))
        return cli_usage("logits: --ids needs a comma-separated list of token ids");
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
    int V = hidden ? info.n_embd : ts_engine_n_vocab(engine);
    float *logits = malloc((size_t)n * V * sizeof(float));
    if (!logits) {
        fprintf(stderr, "tessera: logits: out of memory\n");
        rc = CLI_EXIT_ERROR;
        goto done;
    }
    double t0 = cli_now();
    if (!cli_forward_all(engine, ids, n, hidden, logits)) {
        rc = CLI_EXIT_ERROR;
        goto done;
    }
    double dt = cli_now() - t0;
    if (out_path) {
        FILE *f = fopen(out_path, "wb");
        if (!f || fwrite(logits, sizeof(float), (size_t)n * V, f) != (size_t)n * V) {
            fprintf(stderr, "tessera: logits: cannot write %s: %s\n", out_path, strerror(errno));
            if (f) fclose(f);
            rc = CLI_EXIT_ERROR;
            goto done;
        }
        if (fclose(f) != 0) {
            fprintf(stderr, "tessera: logits: cannot write %s\n", out_path);
            rc = CLI_EXIT_ERROR;
            goto done;
        }
    }
    const float *last = logits + (size_t)(n - 1) * V;
    int best = 0;
    double sumsq = 0;
    for (int j = 0; j < V; j++) {
        if (last[j] > last[best]) best = j;
        sumsq += (double)last[j] * last[j];
    }
    printf("tokens %d, %s %d, %.1f ms (%s); last position: argmax %d (%.4f), rms %.4f%s%s\n", n,
           hidden ? "width" : "vocab", V, dt * 1e3, ts_engine_describe(engine), best, last[best],
           sqrt(sumsq / V), out_path ? ", written to " : "", out_path ? out_path : "");
done:
    free(ids);
    free(logits);
    ts_engine_free(engine);
    ts_model_close(model);
    return rc;
}
