/* tessera bench: prefill (pp) and decode (tg) tokens/s, llama-bench style: each test runs on a
 * fresh sequence, several repetitions, the median is reported. Decode is also set against the
 * memory-bandwidth roofline (weight bytes read per token ÷ measured read bandwidth), and against
 * one that also counts what a token reads and writes of the sequence's state.
 * --parallel B1,B2,... adds aggregate decode throughput with B sequences decoding together (one
 * token each per forward step, as a server running B streams does). Decode is greedy unless
 * sampling options are given (--temp T, --top-k, --top-p, --min-p, --seed: what a request that
 * names them draws with), so that a sampled step's cost can be measured too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/common_model.h"
#include "cli/generate.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Bytes a decoded token moves besides the weights, averaged over tokens at positions depth ..
 * depth + n_tg - 1: the recurrent state (conv and delta rule) read and written back, and the KV
 * cache read up to the token and its own entry written. A slot's state is R + n K bytes for n
 * positions of context, so R = 2 S(1) - S(2) and K = S(2) - S(1). Every layer's cache counts
 * in full: a sliding-window layer (Gemma 3's local ones) reads only its window, so past that
 * depth this is an upper bound on the bytes and the second roofline a lower one. */
static double state_bytes_per_token(const ts_model *m, long depth, long n_tg) {
    double s1 = (double)ts_model_state_bytes(m, 1), s2 = (double)ts_model_state_bytes(m, 2);
    double rec = 2 * s1 - s2, kv = s2 - s1, pos = depth + (n_tg - 1) / 2.0;
    return 2 * rec + (pos + 2) * kv;
}

/* Empties slot s and, for depth > 0, fills it with depth tokens of context (untimed), so that
 * the timed work that follows attends over a long cache as it does deep into a conversation. */
static bool fill_context(ts_engine *e, int s, const int32_t *ids, int32_t *pos, int32_t *slot,
                         int depth, float *logits) {
    if (ts_engine_slot_clear(e, s) != TS_OK) return false;
    if (depth <= 0) return true;
    for (int i = 0; i < depth; i++) pos[i] = i, slot[i] = s;
    ts_batch b = {depth, ids, pos, slot, NULL, NULL, NULL};
    return ts_engine_forward(e, &b, logits) == TS_OK;
}

/* Prefill of n tokens on slot 0 after depth tokens of context; returns seconds or < 0 on error.
 * ids holds depth + n tokens. */
static double time_prefill(ts_engine *e, const int32_t *ids, int32_t *pos, int32_t *slot, int n,
                           int depth, float *logits) {
    if (!fill_context(e, 0, ids, pos, slot, depth, logits)) return -1;
    for (int i = 0; i < n; i++) pos[i] = depth + i, slot[i] = 0;
    ts_batch b = {n, ids + depth, pos, slot, NULL, NULL, NULL};
    double t0 = cli_now();
    if (ts_engine_forward(e, &b, logits) != TS_OK) return -1;
    return cli_now() - t0;
}

/* n decode steps of B sequences at once (slots 0..B-1, each first given depth tokens of
 * context), one token each per step; returns seconds or < 0 on error. Each step's input is the
 * token the step before chose, as in real decoding: the argmax, or with samplers (one a
 * sequence) their draws - either taken where the logits are (on the device for a GPU). */
static double time_decode(ts_engine *e, int n, int B, const int32_t *ids, int32_t *ctx_pos,
                          int32_t *ctx_slot, int depth, float *logits,
                          ts_sampler *const *samplers) {
    int32_t tok[256], pos[256], slot[256];
    uint8_t want[256];
    for (int s = 0; s < B; s++) {
        if (!fill_context(e, s, ids, ctx_pos, ctx_slot, depth, logits)) return -1;
        tok[s] = 1 + s, slot[s] = s, want[s] = 1;
    }
    double t0 = cli_now();
    for (int i = 0; i < n; i++) {
        for (int s = 0; s < B; s++) pos[s] = depth + i;
        ts_batch b = {B, tok, pos, slot, want, NULL, NULL};
        if ((samplers ? ts_engine_forward_sample(e, &b, samplers, tok)
                      : ts_engine_forward_greedy(e, &b, tok)) != TS_OK)
            return -1;
    }
    return cli_now() - t0;
}

/* Where the time of a decode with guesses goes: the drafts, the steps that check them (and run
 * again what a wrong guess took back), the rewinds. */
typedef struct {
    long made, taken, drafts, steps;
    double draft_s, step_s, rewind_s;
} mtp_tally;

/* n tokens of greedy decode of slot 0 (given depth tokens of context first) with speculative
 * decoding as the server runs it: each step the MTP block guesses up to k tokens after the
 * last one (ts_engine_draft) and the step checks them with it; the right ones are kept, the
 * slot goes back to its mark past them, and the tokens from the mark run again in the next
 * step, which guesses nothing (the block drafts from the slot's last hidden state). Returns
 * seconds or < 0 on error; adds the guesses and the time's parts to *tl. */
static double time_decode_mtp(ts_engine *e, int n, int k, const int32_t *ids, int32_t *ctx_pos,
                              int32_t *ctx_slot, int depth, float *logits, mtp_tally *tl) {
    int32_t *hist = malloc(((size_t)n + (size_t)k + 2) * sizeof *hist);
    int32_t tok[130], pos[130], out[65], guess[64], slot[130];
    uint8_t want[130];
    if (!hist || k > 64 || !fill_context(e, 0, ids, ctx_pos, ctx_slot, depth, logits)) {
        free(hist);
        return -1;
    }
    int have = 1, slot0 = 0; /* the answer's tokens known (the last one not yet run) */
    hist[0] = 1;
    double t0 = cli_now();
    while (have - 1 < n) {
        int held = ts_engine_slot_len(e, 0), last = depth + have - 1;
        int g = held == last && held > 0 ? k : 0, m = 0;
        if (g > n - have) g = n - have > 0 ? n - have : 0;
        double t1 = cli_now();
        if (g > 0 &&
            (ts_engine_draft(e, 1, &slot0, &hist[have - 1], NULL, g, guess, NULL) != TS_OK ||
             ts_engine_slot_mark(e, 0) != TS_OK))
            goto fail;
        double t2 = cli_now();
        if (g > 0) tl->draft_s += t2 - t1, tl->drafts++;
        for (int p = held; p <= last + g; p++, m++) {
            tok[m] = p <= last ? hist[p - depth] : guess[p - last - 1];
            pos[m] = p, slot[m] = 0, want[m] = p >= last;
        }
        ts_batch b = {m, tok, pos, slot, want, NULL, NULL};
        if (ts_engine_forward_greedy(e, &b, out) != TS_OK) goto fail;
        double t3 = cli_now();
        tl->step_s += t3 - t2, tl->steps++;
        int right = 0;
        while (right < g && out[right] == guess[right])
            hist[have + right] = guess[right], right++;
        hist[have + right] = out[right];
        have += right + 1;
        tl->made += g, tl->taken += right;
        int keep = depth + have - 1, got;
        if (ts_engine_slot_len(e, 0) > keep && ts_engine_slot_rewind(e, 0, keep, &got) != TS_OK)
            goto fail;
        tl->rewind_s += cli_now() - t3;
    }
    free(hist);
    return cli_now() - t0;
fail:
    free(hist);
    return -1;
}

/* milliseconds per event, 0 for none */
static double per_ms(double s, long n) { return n > 0 ? s * 1e3 / (double)n : 0; }

/* "1,8,32": at most max values in [1, 256]; their count, or -1. */
static int parse_batches(const char *s, int *out, int max) {
    int n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 256 || n == max) return -1;
        out[n++] = (int)v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

int cmd_bench(int argc, char **argv) {
    cli_engine_args ea = {.model_path = cli_default_model()};
    long n_pp = 512, n_tg = 128, reps = 3, depth = 0, mtp = 0;
    bool json = false, no_bw = false;
    int batches[16], n_batches = 0;
    const char *v;
    ts_sampler_params sp;
    ts_sampler_params_default(&sp);
    for (int i = 1; i < argc; i++) {
        int r = cli_engine_opt(argc, argv, &i, &ea);
        if (r == 0) r = cli_sampler_opt(argc, argv, &i, &sp);
        if (r < 0) return CLI_EXIT_USAGE;
        if (r > 0) continue;
        if ((v = cli_opt_value(argc, argv, &i, "-p", "--n-prompt"))) {
            if (!cli_parse_int(v, 0, 1 << 20, &n_pp)) return cli_usage("bad -p '%s'", v);
        } else if ((v = cli_opt_value(argc, argv, &i, "-n", "--n-gen"))) {
            if (!cli_parse_int(v, 0, 1 << 20, &n_tg)) return cli_usage("bad -n '%s'", v);
        } else if ((v = cli_opt_value(argc, argv, &i, "-d", "--depth"))) {
            if (!cli_parse_int(v, 0, 1 << 20, &depth)) return cli_usage("bad --depth '%s'", v);
        } else if ((v = cli_opt_value(argc, argv, &i, "-r", "--repetitions"))) {
            if (!cli_parse_int(v, 1, 1000, &reps)) return cli_usage("bad -r '%s'", v);
        } else if ((v = cli_opt_value(argc, argv, &i, NULL, "--draft-mtp"))) {
            if (!cli_parse_int(v, 1, 64, &mtp)) return cli_usage("bad --draft-mtp '%s'", v);
        } else if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (strcmp(argv[i], "--no-bandwidth") == 0) {
            no_bw = true;
        } else if ((v = cli_opt_value(argc, argv, &i, "-P", "--parallel"))) {
            if ((n_batches = parse_batches(v, batches, 16)) <= 0)
                return cli_usage("bad --parallel '%s' (e.g. 1,8,32; each 1..256)", v);
        } else {
            return cli_usage("bench: unknown option '%s'", argv[i]);
        }
    }
    int max_b = 1;
    for (int i = 0; i < n_batches; i++) max_b = batches[i] > max_b ? batches[i] : max_b;
    if (!ea.n_ctx) ea.n_ctx = (int)(depth + (n_pp > n_tg ? n_pp : n_tg) + 1);
    /* a forward's tokens in one step: the prompt, the sequences decoded together, or a token
     * and its guesses checked with it (split into steps of fewer, a check costs a step a token) */
    long batch_need = n_pp > depth ? n_pp : depth;
    if (batch_need < max_b) batch_need = max_b;
    if (batch_need < mtp + 1) batch_need = mtp + 1;
    if (!ea.n_batch) ea.n_batch = (int)batch_need;
    if (ea.n_slots < max_b) ea.n_slots = max_b;
    if (mtp) ea.n_ctx += (int)mtp + 1, ea.mtp = true;
    if (mtp && sp.temperature > 0)
        return cli_usage("--draft-mtp: the speculative decode measured is greedy");
    ts_model *model;
    ts_engine *e;
    int rc = cli_open(&ea, &model, &e);
    if (rc) return rc;
    ts_model_info info;
    ts_model_get_info(model, &info);
    int V = ts_engine_n_vocab(e);
    size_t np = (size_t)depth + (n_pp > 0 ? (size_t)n_pp : 1);
    int32_t *ids = malloc(np * 4), *pos = malloc(np * 4), *slot = malloc(np * 4);
    float *logits = malloc((size_t)V * sizeof(float));
    double *pp = calloc((size_t)reps, sizeof(double)), *tg = calloc((size_t)reps, sizeof(double));
    /* sampled decode: a sampler a sequence, each with its own seed (NULL: greedy) */
    bool sampled = sp.temperature > 0;
    ts_sampler **smp = sampled ? calloc((size_t)max_b, sizeof *smp) : NULL;
    if (!ids || !pos || !slot || !logits || !pp || !tg || (sampled && !smp)) {
        fprintf(stderr, "tessera: bench: out of memory\n");
        rc = CLI_EXIT_ERROR;
        goto done;
    }
    for (int s = 0; sampled && s < max_b; s++) {
        ts_sampler_params q = sp;
        q.seed = sp.seed + (uint64_t)s;
        if (ts_sampler_create(&q, V, &smp[s]) != TS_OK) {
            rc = cli_fail("sampler");
            goto done;
        }
    }
    uint64_t x = 12345;
    for (size_t i = 0; i < np; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        ids[i] = (int32_t)((x >> 33) % (uint64_t)V);
    }
    /* warm-up: page the weights in, let the threads spin up and pay what a first prefill of
     * this length pays once (on a GPU: lazily loaded library kernels, scratch growing). A
     * 16-token warm-up left that in the first measured prefill: a median of two repetitions
     * read 6-10k t/s on an H200 where the warm runs take 19-21k. */
    if (time_prefill(e, ids, pos, slot, n_pp > 0 ? (int)n_pp : 1, 0, logits) < 0 ||
        time_decode(e, 2, 1, ids, pos, slot, 0, logits, smp) < 0) {
        rc = cli_fail("bench");
        goto done;
    }
    for (long r = 0; r < reps; r++) {
        double a = n_pp > 0 ? time_prefill(e, ids, pos, slot, (int)n_pp, (int)depth, logits) : 0;
        double b =
            n_tg > 0 ? time_decode(e, (int)n_tg, 1, ids, pos, slot, (int)depth, logits, smp) : 0;
        if (a < 0 || b < 0) {
            rc = cli_fail("bench");
            goto done;
        }
        pp[r] = a;
        tg[r] = b;
    }
    /* aggregate decode with B sequences: tokens of all sequences per second */
    double agg[16] = {0};
    for (int bi = 0; bi < n_batches && n_tg > 0; bi++) {
        if (time_decode(e, 2, batches[bi], ids, pos, slot, 0, logits, smp) < 0) { /* warm-up */
            rc = cli_fail("bench");
            goto done;
        }
        double *t = calloc((size_t)reps, sizeof *t);
        for (long r = 0; t && r < reps; r++)
            if ((t[r] = time_decode(e, (int)n_tg, batches[bi], ids, pos, slot, (int)depth, logits,
                                    smp)) < 0) {
                free(t);
                rc = cli_fail("bench");
                goto done;
            }
        if (t) agg[bi] = (double)batches[bi] * n_tg / median(t, (int)reps);
        free(t);
    }
    /* greedy decode with the MTP block's guesses checked in each step */
    double mtp_tps = 0;
    mtp_tally tl = {0};
    if (mtp && n_tg > 0) {
        double *t = calloc((size_t)reps, sizeof *t);
        for (long r = 0; t && r < reps; r++)
            if ((t[r] = time_decode_mtp(e, (int)n_tg, (int)mtp, ids, pos, slot, (int)depth, logits,
                                        &tl)) < 0) {
                free(t);
                rc = cli_fail("bench");
                goto done;
            }
        if (t) mtp_tps = n_tg / median(t, (int)reps);
        free(t);
    }
    double t_pp = median(pp, (int)reps), t_tg = median(tg, (int)reps);
    double pp_tps = n_pp > 0 ? n_pp / t_pp : 0, tg_tps = n_tg > 0 ? n_tg / t_tg : 0;
    /* the roofline of the memory the weights are read from */
    double bw = no_bw                            ? 0
                : ea.device == TS_DEVICE_CUDA ? ts_measure_device_bandwidth(0)
                                                 : ts_measure_read_bandwidth(ea.n_threads);
    double bound = bw > 0 ? bw * 1e9 / (double)info.weight_bytes : 0;
    double sb = state_bytes_per_token(model, depth, n_tg > 0 ? n_tg : 1);
    double bound_all = bw > 0 ? bw * 1e9 / ((double)info.weight_bytes + sb) : 0;
    if (json) {
        printf("{\"model\": \"%s\", \"arch\": \"%s\", \"dtype\": \"%s\", \"params\": %lld, "
               "\"weight_bytes_per_token\": %llu, \"backend\": \"%s\", \"repetitions\": %ld, "
               "\"depth\": %ld, "
               "\"pp\": {\"n\": %ld, \"tokens_per_s\": %.2f, \"ttft_ms\": %.2f}, "
               "\"tg\": {\"n\": %ld, \"tokens_per_s\": %.3f, \"ms_per_token\": %.3f}, "
               "\"read_bandwidth_gbs\": %.2f, \"tg_bound_tokens_per_s\": %.2f, "
               "\"tg_fraction_of_bound\": %.3f, \"state_bytes_per_token\": %.0f, "
               "\"tg_bound_with_state_tokens_per_s\": %.2f, "
               "\"tg_fraction_of_bound_with_state\": %.3f, ",
               ea.model_path, info.arch, info.weight_dtype, (long long)info.n_params,
               (unsigned long long)info.weight_bytes, ts_engine_describe(e), reps, depth, n_pp,
               pp_tps, t_pp * 1e3, n_tg, tg_tps, n_tg > 0 ? t_tg * 1e3 / n_tg : 0, bw, bound,
               bound > 0 ? tg_tps / bound : 0, sb, bound_all,
               bound_all > 0 ? tg_tps / bound_all : 0);
        if (sampled)
            printf("\"sampling\": {\"temperature\": %g, \"top_k\": %d, \"top_p\": %g, "
                   "\"min_p\": %g, \"seed\": %llu}, ",
                   sp.temperature, sp.top_k, sp.top_p, sp.min_p, (unsigned long long)sp.seed);
        else
            printf("\"sampling\": null, ");
        printf("\"batched\": [");
        for (int bi = 0; bi < n_batches; bi++)
            printf("%s{\"sequences\": %d, \"tokens_per_s\": %.2f}", bi ? ", " : "", batches[bi],
                   agg[bi]);
        printf("]");
        if (mtp)
            printf(", \"draft_mtp\": {\"max\": %ld, \"tokens_per_s\": %.3f, \"drafted\": %ld, "
                   "\"accepted\": %ld, \"drafts\": %ld, \"ms_per_draft\": %.3f, \"steps\": %ld, "
                   "\"ms_per_step\": %.3f, \"ms_rewinds\": %.3f}",
                   mtp, mtp_tps, tl.made, tl.taken, tl.drafts, per_ms(tl.draft_s, tl.drafts),
                   tl.steps, per_ms(tl.step_s, tl.steps), tl.rewind_s * 1e3);
        printf("}\n");
    } else {
        char at[32] = ""; /* llama-bench's notation for tests after some context */
        if (depth > 0) snprintf(at, sizeof at, " @ d%ld", depth);
        printf("| model | dtype | params | weights/token | backend | test | t/s |\n");
        printf("|---|---|---|---|---|---|---|\n");
        if (n_pp > 0)
            printf("| %s | %s | %.0fM | %.0f MB | %s | pp%ld%s | %.2f |\n", info.arch,
                   info.weight_dtype, info.n_params / 1e6, info.weight_bytes / 1e6,
                   ts_engine_describe(e), n_pp, at, pp_tps);
        if (n_tg > 0)
            printf("| %s | %s | %.0fM | %.0f MB | %s | tg%ld%s | %.2f |\n", info.arch,
                   info.weight_dtype, info.n_params / 1e6, info.weight_bytes / 1e6,
                   ts_engine_describe(e), n_tg, at, tg_tps);
        for (int bi = 0; bi < n_batches && n_tg > 0; bi++)
            printf("| %s | %s | %.0fM | %.0f MB | %s | tg%ld%s x %d seqs | %.2f |\n", info.arch,
                   info.weight_dtype, info.n_params / 1e6, info.weight_bytes / 1e6,
                   ts_engine_describe(e), n_tg, at, batches[bi], agg[bi]);
        if (mtp && n_tg > 0)
            printf("| %s | %s | %.0fM | %.0f MB | %s | tg%ld%s mtp %ld | %.2f |\n", info.arch,
                   info.weight_dtype, info.n_params / 1e6, info.weight_bytes / 1e6,
                   ts_engine_describe(e), n_tg, at, mtp, mtp_tps);
        if (n_pp > 0) printf("\ntime to first token (pp%ld): %.1f ms\n", n_pp, t_pp * 1e3);
        if (mtp && n_tg > 0) {
            printf("%sMTP guesses (tg%ld mtp %ld, greedy): %ld made, %ld taken (%.0f%%); the other "
                   "rows run with the block on (each forward also runs it)\n",
                   n_pp > 0 ? "" : "\n", n_tg, mtp, tl.made, tl.taken,
                   tl.made ? 100.0 * tl.taken / tl.made : 0.0);
            printf("its time over %ld repetitions: %ld drafts of %.2f ms, %ld steps of %.2f ms "
                   "(checking the guesses, or running again what a wrong one took back), "
                   "rewinds %.1f ms in all\n",
                   reps, tl.drafts, per_ms(tl.draft_s, tl.drafts), tl.steps,
                   per_ms(tl.step_s, tl.steps), tl.rewind_s * 1e3);
        }
        if (sampled && n_tg > 0)
            printf("%sdecode draws at temperature %g, top-k %d, top-p %g, min-p %g (seed %llu, "
                   "one more a sequence)\n",
                   n_pp > 0 ? "" : "\n", sp.temperature, sp.top_k, sp.top_p, sp.min_p,
                   (unsigned long long)sp.seed);
        if (bw > 0) {
            printf("memory read bandwidth %.1f GB/s -> decode bound %.2f t/s; tg reaches %.0f%%\n",
                   bw, bound, 100 * tg_tps / bound);
            if (sb > 0)
                printf("with the sequence's state (%.1f MB a token more: recurrent state read and "
                       "written, KV cache read): bound %.2f t/s; tg reaches %.0f%%\n",
                       sb / 1e6, bound_all, 100 * tg_tps / bound_all);
        }
    }
done:
    free(ids);
    free(pos);
    free(slot);
    free(logits);
    free(pp);
    free(tg);
    for (int s = 0; smp && s < max_b; s++)
        ts_sampler_free(smp[s]);
    free(smp);
    ts_engine_free(e);
    ts_model_close(model);
    return rc;
}
