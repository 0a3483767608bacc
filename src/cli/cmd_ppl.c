/* tessera ppl: perplexity of a text file with sliding windows.
 *
 * Windows of --ctx tokens start every --stride tokens; each window is run on a fresh sequence
 * and scores only the tokens the previous window did not, so every token after the first is
 * scored exactly once, with at least ctx - stride tokens of context (all of it in the first
 * window). Prints PPL, its standard error (delta method over the per-token negative
 * log-likelihoods) and the number of tokens scored. */
#include "cli/common_model.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PPL_PIECE 64 /* tokens per forward call, bounding the logits buffer */

static double token_nll(const float *logits, int V, int32_t target) {
    float mx = logits[0];
    for (int j = 1; j < V; j++)
        if (logits[j] > mx) mx = logits[j];
    double sum = 0;
    for (int j = 0; j < V; j++) sum += exp((double)logits[j] - mx);
    return log(sum) + mx - logits[target];
}

int cmd_ppl(int argc, char **argv) {
    cli_engine_args ea = {.model_path = cli_default_model()};
    const char *file = NULL, *v;
    long ctx = 512, stride = 256, max_tokens = 0;
    for (int i = 1; i < argc; i++) {
        int r = cli_engine_opt(argc, argv, &i, &ea);
        if (r < 0) return CLI_EXIT_USAGE;
        if (r > 0) continue;
        if ((v = cli_opt_value(argc, argv, &i, "-f", "--file"))) {
            file = v;
        } else if ((v = cli_opt_value(argc, argv, &i, NULL, "--ctx"))) {
            if (!cli_parse_int(v, 2, 1 << 20, &ctx)) return cli_usage("bad --ctx '%s'", v);
        } else if ((v = cli_opt_value(argc, argv, &i, NULL, "--stride"))) {
            if (!cli_parse_int(v, 1, 1 << 20, &stride)) return cli_usage("bad --stride '%s'", v);
        } else if ((v = cli_opt_value(argc, argv, &i, NULL, "--max-tokens"))) {
            if (!cli_parse_int(v, 2, 1L << 30, &max_tokens))
                return cli_usage("bad --max-tokens '%s'", v);
        } else {
            return cli_usage("ppl: unknown option '%s'", argv[i]);
        }
    }
    if (ea.n_ctx) ctx = ea.n_ctx; /* --ctx was taken by the common engine options */
    if (!file || !*file || !ea.model_path) return cli_usage("ppl needs -m MODEL and -f FILE");
    /* a window's first token has no context inside it, so windows must overlap */
    if (stride >= ctx) return cli_usage("ppl: --stride %ld must be smaller than --ctx %ld", stride, ctx);
    char *text;
    size_t len;
    if (!cli_read_file(file, SIZE_MAX / 4, &text, &len)) {
        fprintf(stderr, "tessera: ppl: cannot open %s\n", file);
        return CLI_EXIT_ERROR;
    }
    ts_tokenizer *tok;
    if (ts_tokenizer_open(ea.model_path, &tok) != TS_OK) {
        free(text);
        return cli_fail("cannot load tokenizer");
    }
    int32_t *ids;
    size_t n_ids;
    ts_status st = ts_tokenize(tok, text, len, false, &ids, &n_ids);
    free(text);
    ts_tokenizer_free(tok);
    if (st != TS_OK) return cli_fail("tokenize");
    if (max_tokens > 0 && n_ids > (size_t)max_tokens) n_ids = (size_t)max_tokens;
    if (n_ids < 2) {
        free(ids);
        fprintf(stderr, "tessera: ppl: %s has fewer than 2 tokens\n", file);
        return CLI_EXIT_ERROR;
    }
    ea.n_ctx = (int)ctx;
    ts_model *model;
    ts_engine *e;
    int rc = cli_open(&ea, &model, &e);
    if (rc) {
        free(ids);
        return rc;
    }
    int V = ts_engine_n_vocab(e);
    float *logits = malloc((size_t)PPL_PIECE * V * sizeof *logits);
    int32_t pos[PPL_PIECE], slot[PPL_PIECE];
    uint8_t want[PPL_PIECE];
    double sum = 0, sum2 = 0;
    long scored = 0, n = (long)n_ids, prev_end = 0;
    double t0 = cli_now();
    for (long begin = 0; prev_end < n && logits; begin += stride) {
        long end = begin + ctx < n ? begin + ctx : n;
        if (ts_engine_slot_clear(e, 0) != TS_OK) break;
        /* token t (begin < t < end) is scored from the logits at t - 1 when t >= prev_end */
        for (long p0 = begin; p0 < end; p0 += PPL_PIECE) {
            int k = end - p0 < PPL_PIECE ? (int)(end - p0) : PPL_PIECE, nw = 0;
            for (int i = 0; i < k; i++) {
                long t = p0 + i + 1; /* the token these logits predict */
                pos[i] = (int32_t)(p0 + i - begin);
                slot[i] = 0;
                want[i] = t < end && t >= prev_end && t >= 1;
            }
            ts_batch b = {k, ids + p0, pos, slot, want, NULL, NULL};
            if ((st = ts_engine_forward(e, &b, logits)) != TS_OK) break;
            for (int i = 0; i < k; i++) {
                if (!want[i]) continue;
                double nll = token_nll(logits + (size_t)nw++ * V, V, ids[p0 + i + 1]);
                sum += nll;
                sum2 += nll * nll;
                scored++;
            }
        }
        if (st != TS_OK) break;
        prev_end = end;
        if (end == n) break;
    }
    if (st != TS_OK || !logits) {
        rc = cli_fail("ppl");
    } else {
        double mean = sum / scored, var = sum2 / scored - mean * mean;
        double se_mean = scored > 1 ? sqrt(var > 0 ? var / (scored - 1) : 0) : 0;
        double ppl = exp(mean);
        printf("PPL = %.4f +/- %.4f (%ld tokens scored, ctx %ld, stride %ld, %.1f s)\n", ppl,
               ppl * se_mean, scored, ctx, stride, cli_now() - t0);
    }
    free(logits);
    free(ids);
    ts_engine_free(e);
    ts_model_close(model);
    return rc;
}
