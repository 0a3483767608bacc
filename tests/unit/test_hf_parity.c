/* Every model family against Hugging Face transformers (tests/fixtures/<family>/<model>/):
 * logits for every prompt position, greedy continuations with the cache, decode-after-prefill
 * against full prefill, and several sequences in one batch against each alone. Runs every
 * fixture model with the scalar kernels and with the best kernels this CPU has. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture_util.h"
#include "testutil.h"
#include "tessera.h"

#define MAX_MODELS 16
#define N_PROMPTS 4
#define N_GREEDY 2
#define LOGIT_TOL 1e-4

static ts_engine *make_engine(ts_model *m, ts_isa isa, int n_slots, int n_batch) {
    ts_engine_opts o;
    ts_engine_opts_default(&o);
    o.n_slots = n_slots;
    o.n_ctx = 512;
    o.n_batch = n_batch;
    o.n_threads = 2;
    o.isa = isa;
    ts_engine *e = NULL;
    if (ts_engine_create(m, &o, &e) != TS_OK) fprintf(stderr, "engine: %s\n", ts_last_error());
    return e;
}

static void check_logits(const char *dir, const char *model, ts_engine *e, const char *label) {
    int V = ts_engine_n_vocab(e);
    for (int p = 0; p < N_PROMPTS; p++) {
        char path[8192];
        int32_t *ids;
        int n;
        snprintf(path, sizeof path, "%s/%s/ref/prompt_%d.ids", dir, model, p);
        if (fx_read_ids(path, 0, &ids, &n) != 0) continue;
        snprintf(path, sizeof path, "%s/%s/ref/prompt_%d.logits", dir, model, p);
        float *ref = fx_read_floats(path, (long)n * V);
        CHECKF(ref != NULL, "%s: cannot read %s", model, path);
        float *got = fx_prefill_all(e, 0, ids, n);
        CHECK(got != NULL);
        if (ref && got) {
            double rel = tu_rel_l2(got, ref, (long)n * V);
            CHECKF(rel <= LOGIT_TOL, "%s %s prompt %d (%d tokens): rel L2 %.3g", model, label, p, n,
                   rel);
            int mism = 0;
            for (int t = 0; t < n; t++) {
                int a = 0, b = 0;
                for (int j = 1; j < V; j++) {
                    if (got[(size_t)t * V + j] > got[(size_t)t * V + a]) a = j;
                    if (ref[(size_t)t * V + j] > ref[(size_t)t * V + b]) b = j;
                }
                mism += a != b;
            }
            CHECKF(mism == 0, "%s %s prompt %d: %d argmax mismatches", model, label, p, mism);
        }
        /* decode after prefill: first half prefilled, the rest one token at a time */
        if (got && n > 2) {
            int half = n / 2;
            float *step = malloc((size_t)V * sizeof *step);
            int32_t *pos = malloc((size_t)half * 4), *sl = calloc((size_t)half, 4);
            for (int i = 0; i < half; i++) pos[i] = i;
            ts_engine_slot_clear(e, 0);
            ts_batch b = {half, ids, pos, sl, NULL, NULL, NULL};
            CHECK(ts_engine_forward(e, &b, step) == TS_OK);
            double worst = tu_rel_l2(step, got + (size_t)(half - 1) * V, V);
            for (int t = half; t < n; t++) {
                int32_t s0 = 0, pt = t;
                ts_batch d = {1, &ids[t], &pt, &s0, NULL, NULL, NULL};
                CHECK(ts_engine_forward(e, &d, step) == TS_OK);
                double r = tu_rel_l2(step, got + (size_t)t * V, V);
                if (r > worst) worst = r;
            }
            CHECKF(worst <= 5e-5, "%s %s prompt %d: decode vs prefill rel %.3g", model, label, p,
                   worst);
            free(step);
            free(pos);
            free(sl);
        }
        free(ref);
        free(got);
        free(ids);
    }
}

static void check_greedy(const char *dir, const char *model, ts_engine *e, const char *label) {
    int V = ts_engine_n_vocab(e);
    for (int g = 0; g < N_GREEDY; g++) {
        char path[8192];
        int32_t *prompt, *want = NULL;
        int np = 0, nw = 0;
        snprintf(path, sizeof path, "%s/%s/ref/greedy_%d.txt", dir, model, g);
        if (fx_read_ids(path, 0, &prompt, &np) != 0) continue;
        CHECK(fx_read_ids(path, 1, &want, &nw) == 0);
        float *logits = malloc((size_t)V * sizeof *logits);
        int32_t *pos = malloc((size_t)np * 4), *sl = calloc((size_t)np, 4);
        for (int i = 0; i < np; i++) pos[i] = i;
        ts_engine_slot_clear(e, 0);
        ts_batch b = {np, prompt, pos, sl, NULL, NULL, NULL};
        CHECK(ts_engine_forward(e, &b, logits) == TS_OK);
        ts_sampler_params sp;
        ts_sampler_params_default(&sp);
        ts_sampler *s;
        CHECK(ts_sampler_create(&sp, V, &s) == TS_OK);
        int same = 1;
        for (int k = 0; k < nw; k++) {
            int32_t tok = ts_sampler_sample(s, logits);
            if (tok != want[k]) {
                fprintf(stderr, "%s %s greedy %d: step %d got %d want %d\n", model, label, g, k,
                        tok, want[k]);
                same = 0;
                break;
            }
            int32_t p = np + k, s0 = 0;
            ts_batch d = {1, &tok, &p, &s0, NULL, NULL, NULL};
            CHECK(ts_engine_forward(e, &d, logits) == TS_OK);
        }
        CHECK(same);
        /* the engine's own greedy path (argmax where the logits are) follows the same tokens */
        ts_engine_slot_clear(e, 0);
        int32_t tok = -1;
        CHECK(ts_engine_forward_greedy(e, &b, &tok) == TS_OK);
        for (int k = 0; k < nw; k++) {
            CHECKF(tok == want[k], "%s %s greedy %d: forward_greedy step %d got %d want %d",
                   model, label, g, k, tok, want[k]);
            if (tok != want[k]) break;
            int32_t p = np + k, s0 = 0;
            ts_batch d = {1, &tok, &p, &s0, NULL, NULL, NULL};
            CHECK(ts_engine_forward_greedy(e, &d, &tok) == TS_OK);
        }
        /* the sampling forward draws what the sampler draws from the downloaded logits, from
         * the same seed (temperature 1 and top-p: the generator and the filters in play) */
        ts_sampler_params tp = {1.0f, 0, 0.95f, 0.0f, 100 + (uint64_t)g};
        int32_t seq[2][8];
        for (int pass = 0; pass < 2; pass++) {
            ts_sampler *ts = NULL;
            CHECK(ts_sampler_create(&tp, V, &ts) == TS_OK);
            ts_engine_slot_clear(e, 0);
            CHECK(ts_engine_forward(e, &b, logits) == TS_OK);
            seq[pass][0] = ts_sampler_sample(ts, logits);
            for (int k = 0; ts && k < 7; k++) {
                int32_t p = np + k, s0 = 0;
                ts_batch d = {1, &seq[pass][k], &p, &s0, NULL, NULL, NULL};
                if (pass == 0) {
                    CHECK(ts_engine_forward_sample(e, &d, &ts, &seq[pass][k + 1]) == TS_OK);
                } else {
                    CHECK(ts_engine_forward(e, &d, logits) == TS_OK);
                    seq[pass][k + 1] = ts_sampler_sample(ts, logits);
                }
            }
            ts_sampler_free(ts);
        }
        CHECKF(memcmp(seq[0], seq[1], sizeof seq[0]) == 0,
               "%s %s: forward_sample drew other tokens than forward + sample", model, label);
        ts_sampler_free(s);
        free(logits);
        free(pos);
        free(sl);
        free(prompt);
        free(want);
    }
}

/* The sampling forward for two sequences in one batch: row k drawn with samplers[k] must be the
 * draw that sampler makes from the logits of the same step (run on copies of both slots). Every
 * third step asks for the logits too (ts_engine_forward_sample_logits): they must be the step's
 * logits with the row's adjustments applied, bit for bit; every third for log-probabilities
 * (ts_engine_forward_sample_logprobs): ts_sampler_logprobs of those logits. */
static void check_sample_batch(const char *model, ts_model *m) {
    ts_engine *e = make_engine(m, TS_ISA_AUTO, 4, 64);
    CHECK(e != NULL);
    if (!e) return;
    int V = ts_engine_n_vocab(e);
    const ts_sampler_params ps[2] = {{1.0f, 0, 1.0f, 0.0f, 31}, {0.8f, 5, 0.9f, 0.0f, 32}};
    ts_sampler *sa[2] = {NULL, NULL}, *sb[2] = {NULL, NULL};
    for (int r = 0; r < 2; r++)
        CHECK(ts_sampler_create(&ps[r], V, &sa[r]) == TS_OK &&
              ts_sampler_create(&ps[r], V, &sb[r]) == TS_OK);
    /* two different one-token prompts on slots 0 and 1; slots 2 and 3 follow them by copies */
    int32_t tok[2] = {1 % V, 7 % V}, pos[2] = {0, 0}, on_a[2] = {0, 1}, on_b[2] = {2, 3};
    const uint8_t both[2] = {1, 1};
    float *lg = malloc((size_t)2 * V * sizeof *lg), *la = malloc((size_t)2 * V * sizeof *la);
    int diff = 0, ldiff = 0, lpdiff = 0;
    for (int r = 0; r < 2; r++) ts_engine_slot_clear(e, on_a[r]);
    /* row 1 with penalties (and every fourth token a bias) as adjustments on every token, which
     * the reference applies by hand */
    ts_logit_adjust *adj = malloc((size_t)V * sizeof *adj);
    for (int i = 0; i < V; i++)
        adj[i] = (ts_logit_adjust){i, i % 4 ? 0.0f : 0.5f, 1.2f, 0.7f * (float)(i % 3)};
    if (sa[1]) ts_sampler_set_adjust(sa[1], adj, V);
    for (int step = 0; sa[0] && sa[1] && sb[0] && sb[1] && step < 6; step++) {
        for (int r = 0; r < 2; r++)
            CHECK(ts_engine_slot_copy(e, on_a[r], on_b[r]) == TS_OK);
        int32_t drawn[2] = {-1, -1};
        ts_batch ba = {2, tok, pos, on_a, both, NULL, NULL},
                 bb = {2, tok, pos, on_b, both, NULL, NULL};
        ts_logprobs lp[2];
        if (step % 3 == 1)
            CHECK(ts_engine_forward_sample_logits(e, &ba, sa, drawn, la) == TS_OK);
        else if (step % 3 == 2)
            CHECK(ts_engine_forward_sample_logprobs(e, &ba, sa, 4, drawn, lp) == TS_OK);
        else
            CHECK(ts_engine_forward_sample(e, &ba, sa, drawn) == TS_OK);
        CHECK(ts_engine_forward(e, &bb, lg) == TS_OK);
        for (int i = 0; i < V; i++) {
            float *l = &lg[(size_t)V + adj[i].id], v = *l + adj[i].bias;
            *l = (v > 0 ? v / 1.2f : v * 1.2f) - adj[i].sub;
        }
        if (step % 3 == 1) ldiff += memcmp(la, lg, (size_t)2 * V * sizeof *la) != 0;
        for (int r = 0; step % 3 == 2 && r < 2; r++) {
            ts_logprobs want;
            ts_sampler_logprobs(sb[r], lg + (size_t)r * V, drawn[r], 4, &want);
            bool same = lp[r].logprob == want.logprob && lp[r].n_top == want.n_top;
            for (int k = 0; same && k < want.n_top; k++)
                same = lp[r].top_id[k] == want.top_id[k] &&
                       lp[r].top_logprob[k] == want.top_logprob[k];
            lpdiff += !same;
        }
        for (int r = 0; r < 2; r++) {
            diff += drawn[r] != ts_sampler_sample(sb[r], lg + (size_t)r * V);
            tok[r] = drawn[r] >= 0 ? drawn[r] : 0;
            pos[r]++;
        }
    }
    CHECKF(diff == 0, "%s: %d of 12 draws of a two-sequence sampling forward differ", model, diff);
    CHECKF(ldiff == 0, "%s: %d of 2 steps' adjusted logits differ from the step's", model, ldiff);
    CHECKF(lpdiff == 0, "%s: %d of 4 rows' log-probabilities differ from the step's", model,
           lpdiff);
    CHECK(ts_engine_forward_sample_logits(e, &(ts_batch){1, tok, pos, on_a, NULL, NULL, NULL}, sa,
                                          tok, NULL) == TS_ERR_INVALID);
    for (int r = 0; r < 2; r++) ts_sampler_free(sa[r]), ts_sampler_free(sb[r]);
    free(lg), free(la), free(adj);
    ts_engine_free(e);
}

/* Two sequences interleaved in one batch (and split by a small n_batch) give the same logits
 * as each sequence alone. */
static void check_multi_sequence(const char *dir, const char *model, ts_model *m) {
    char path[8192];
    int32_t *a, *b;
    int na, nb;
    snprintf(path, sizeof path, "%s/%s/ref/prompt_1.ids", dir, model);
    if (fx_read_ids(path, 0, &a, &na) != 0) return;
    snprintf(path, sizeof path, "%s/%s/ref/prompt_2.ids", dir, model);
    if (fx_read_ids(path, 0, &b, &nb) != 0) {
        free(a);
        return;
    }
    ts_engine *e = make_engine(m, TS_ISA_AUTO, 3, 37);
    CHECK(e != NULL);
    if (!e) return;
    int V = ts_engine_n_vocab(e);
    float *ra = fx_prefill_all(e, 0, a, na), *rb = fx_prefill_all(e, 0, b, nb);
    /* batch: a's tokens on slot 2 and b's on slot 1, alternating runs of 5 */
    int n = na + nb, ia = 0, ib = 0, k = 0;
    int32_t *tok = malloc((size_t)n * 4), *pos = malloc((size_t)n * 4), *sl = malloc((size_t)n * 4);
    uint8_t *want = malloc((size_t)n);
    int *which = malloc((size_t)n * sizeof(int));
    while (ia < na || ib < nb) {
        for (int r = 0; r < 5 && ia < na; r++, k++)
            tok[k] = a[ia], pos[k] = ia, sl[k] = 2, want[k] = 1, which[k] = ia++;
        for (int r = 0; r < 5 && ib < nb; r++, k++)
            tok[k] = b[ib], pos[k] = ib, sl[k] = 1, want[k] = 1, which[k] = -1 - ib++;
    }
    float *out = malloc((size_t)n * V * sizeof *out);
    ts_engine_slot_clear(e, 1);
    ts_engine_slot_clear(e, 2);
    ts_batch bt = {n, tok, pos, sl, want, NULL, NULL};
    CHECK(ts_engine_forward(e, &bt, out) == TS_OK);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        const float *ref = which[i] >= 0 ? ra + (size_t)which[i] * V : rb + (size_t)(-1 - which[i]) * V;
        double r = tu_rel_l2(out + (size_t)i * V, ref, V);
        if (r > worst) worst = r;
    }
    CHECKF(worst <= 5e-5, "%s: interleaved batch vs separate: rel %.3g", model, worst);
    CHECK(ts_engine_slot_len(e, 1) == nb && ts_engine_slot_len(e, 2) == na);
    /* a position that does not continue its slot is refused and changes nothing */
    int32_t t0 = a[0], p5 = 5, s2 = 2;
    ts_batch bad = {1, &t0, &p5, &s2, NULL, NULL, NULL};
    CHECK(ts_engine_forward(e, &bad, out) == TS_ERR_INVALID);
    CHECK(ts_engine_slot_len(e, 2) == na);
    free(tok), free(pos), free(sl), free(want), free(which), free(out), free(ra), free(rb);
    free(a), free(b);
    ts_engine_free(e);
}

/* Taking tokens back (ts_engine_slot_mark / ts_engine_slot_rewind), as speculative decoding
 * does: after a mark, two rounds of the prompt's next tokens with wrong ones after them, each
 * rewound to just after the right ones, then the rest of the prompt: every row of logits as in
 * one prefill. An attention-only model (expect_exact) rewinds to the length asked; one with
 * linear-attention layers to its mark, the tokens between run again. */
static void check_rewind(const char *dir, const char *model, ts_model *m, bool expect_exact) {
    char path[8192];
    int32_t *a;
    int na;
    snprintf(path, sizeof path, "%s/%s/ref/prompt_1.ids", dir, model);
    if (fx_read_ids(path, 0, &a, &na) != 0) return;
    CHECK(na >= 10);
    ts_engine *e = make_engine(m, TS_ISA_AUTO, 2, 64);
    CHECK(e != NULL);
    if (!e || na < 10) {
        free(a);
        ts_engine_free(e);
        return;
    }
    int V = ts_engine_n_vocab(e);
    float *ref = fx_prefill_all(e, 0, a, na);
    float *rows = malloc((size_t)na * V * sizeof *rows);
    int32_t tok[16], pos[16], sl[16];
    uint8_t want[16];
    int h = na - 8, len = h;
    ts_engine_slot_clear(e, 1);
    for (int i = 0; i < h; i++) { /* the prompt's head, token by token (no rows: a[i] in tok) */
        pos[0] = i, sl[0] = 1, want[0] = 0;
        CHECK(ts_engine_forward(e, &(ts_batch){1, &a[i], pos, sl, want, NULL, NULL}, NULL) ==
              TS_OK);
    }
    /* the next two tokens one step each, on a copy: the rows a check of guesses must match
     * to the bit (its few tokens are tiled and summed as single steps are) */
    float *steps = malloc(2 * (size_t)V * sizeof *steps);
    CHECK(ts_engine_slot_copy(e, 1, 0) == TS_OK);
    for (int i = 0; i < 2; i++) {
        pos[0] = h + i, sl[0] = 0, want[0] = 1;
        CHECK(ts_engine_forward(e, &(ts_batch){1, &a[h + i], pos, sl, want, NULL, NULL},
                                steps + (size_t)i * V) == TS_OK);
    }
    double worst = 0;
    for (int round = 0; round < 2; round++) {
        CHECK(ts_engine_slot_mark(e, 1) == TS_OK);
        /* the tokens the slot still lacks up to len, two right ones, then three wrong ones */
        int n = 0, from = ts_engine_slot_len(e, 1);
        for (int p = from; p < len + 2; p++, n++)
            tok[n] = a[p], pos[n] = p, sl[n] = 1, want[n] = p >= len;
        for (int w = 0; w < 3; w++, n++)
            tok[n] = (a[len + 2 + w] + 7 + w) % V, pos[n] = len + 2 + w, sl[n] = 1, want[n] = 1;
        CHECK(ts_engine_forward(e, &(ts_batch){n, tok, pos, sl, want, NULL, NULL}, rows) == TS_OK);
        if (round == 0)
            CHECKF(memcmp(rows, steps, 2 * (size_t)V * sizeof *rows) == 0,
                   "%s: a run of a few tokens gives other bits than single steps", model);
        for (int r = 0; r < 2; r++) { /* the right tokens' rows are the prefill's */
            double d = tu_rel_l2(rows + (size_t)r * V, ref + (size_t)(len + r) * V, V);
            if (d > worst) worst = d;
        }
        int got = -1;
        CHECK(ts_engine_slot_rewind(e, 1, len + 2, &got) == TS_OK);
        CHECKF(got == (expect_exact ? len + 2 : h), "%s: rewound to %d of %d (mark %d)", model, got,
               len + 2, h);
        CHECK(ts_engine_slot_len(e, 1) == got);
        len += 2;
    }
    int n = 0;
    for (int p = ts_engine_slot_len(e, 1); p < na; p++, n++)
        tok[n] = a[p], pos[n] = p, sl[n] = 1, want[n] = 1;
    CHECK(ts_engine_forward(e, &(ts_batch){n, tok, pos, sl, want, NULL, NULL}, rows) == TS_OK);
    for (int r = 0; r < n; r++) {
        double d = tu_rel_l2(rows + (size_t)r * V, ref + (size_t)(na - n + r) * V, V);
        if (d > worst) worst = d;
    }
    CHECKF(worst <= 5e-5, "%s: rows after rewinds vs one prefill: rel %.3g", model, worst);
    int got = -1;
    CHECK(ts_engine_slot_rewind(e, 1, na + 1, &got) == TS_ERR_INVALID);
    CHECK(ts_engine_slot_rewind(e, 1, na, &got) == TS_OK && got == na);
    /* a copy into the slot forgets its mark: only an attention-only model rewinds without one */
    CHECK(ts_engine_slot_copy(e, 0, 1) == TS_OK);
    CHECK((ts_engine_slot_rewind(e, 1, ts_engine_slot_len(e, 1) - 1, &got) == TS_OK) ==
          expect_exact);
    free(ref), free(rows), free(steps), free(a);
    ts_engine_free(e);
}

/* Runs ids[from, to) into slot one token at a time, the logits of the last into row (if not
 * NULL). */
static bool run_tokens(ts_engine *e, int slot, const int32_t *ids, int from, int to, float *row) {
    for (int p = from; p < to; p++) {
        int32_t pos = p, sl = slot;
        uint8_t want = p == to - 1 && row;
        ts_batch b = {1, &ids[p], &pos, &sl, &want, NULL, NULL};
        if (ts_engine_forward(e, &b, want ? row : NULL) != TS_OK) return false;
    }
    return true;
}

/* Prefix snapshots (engine/snapshot.c): a prompt's head saved from one slot and restored into
 * another that held a longer, different sequence goes on exactly as the slot it came from;
 * a snapshot takes the pool's room by its length; a full pool refuses, a drop frees. */
static void check_snapshots(const char *dir, const char *model, ts_model *m) {
    char path[8192];
    int32_t *a;
    int na;
    snprintf(path, sizeof path, "%s/%s/ref/prompt_1.ids", dir, model);
    if (fx_read_ids(path, 0, &a, &na) != 0) return;
    ts_engine_opts o;
    ts_engine_opts_default(&o);
    o.n_slots = 2, o.n_ctx = 512, o.n_batch = 64, o.n_threads = 2;
    size_t slot_bytes = ts_model_state_bytes(m, o.n_ctx);
    o.snap_bytes = slot_bytes / 4, o.n_snaps = 64; /* a few short snapshots, not one whole slot */
    ts_engine *e = NULL;
    CHECKF(ts_engine_create(m, &o, &e) == TS_OK, "%s", ts_last_error());
    if (!e || na < 10) {
        free(a);
        ts_engine_free(e);
        return;
    }
    int V = ts_engine_n_vocab(e), h = na - 4;
    float *want = malloc((size_t)V * sizeof *want), *got = malloc((size_t)V * sizeof *got);
    CHECK(ts_engine_slot_clear(e, 0) == TS_OK && run_tokens(e, 0, a, 0, h, NULL));
    CHECK(ts_engine_snap_save(e, 0, 3) == TS_OK && ts_engine_snap_len(e, 3) == h);
    size_t pool = ts_engine_snap_pool_bytes(e), one = ts_engine_snap_bytes(e, h);
    CHECKF(pool > 0 && one > 0 && one < slot_bytes / 4 && ts_engine_snap_bytes(e, 2 * h) >= one,
           "%s: pool %zu, a snapshot of %d tokens %zu, a slot %zu", model, pool, h, one,
           slot_bytes);
    /* slot 1 holds something longer and different, then the snapshot */
    int32_t *other = malloc((size_t)na * sizeof *other);
    for (int i = 0; i < na; i++)
        other[i] = (a[i] * 7 + 3) % V;
    CHECK(ts_engine_slot_clear(e, 1) == TS_OK && run_tokens(e, 1, other, 0, na, NULL));
    CHECK(ts_engine_snap_restore(e, 3, 1) == TS_OK && ts_engine_slot_len(e, 1) == h);
    CHECK(run_tokens(e, 0, a, h, na, want) && run_tokens(e, 1, a, h, na, got));
    CHECKF(memcmp(want, got, (size_t)V * sizeof *want) == 0,
           "%s: a restored snapshot goes on other than the slot it was taken from", model);
    /* the pool fills: a save that does not fit leaves its id empty; a drop makes room */
    int saved = 0;
    ts_status st = TS_OK;
    for (int k = 4; k < 64 && st == TS_OK; k++)
        if ((st = ts_engine_snap_save(e, 0, k)) == TS_OK) saved++;
    CHECKF(st == TS_ERR_NOMEM, "%s: %d saved, then %d", model, saved, (int)st);
    CHECK(ts_engine_snap_len(e, 4 + saved) == -1);
    size_t whole = ts_engine_snap_bytes(e, na), head = one;
    CHECKF(saved * whole + head <= pool && (saved + 1) * whole + head > pool,
           "%s: %d snapshots of %zu and one of %zu in a pool of %zu", model, saved, whole, head,
           pool);
    ts_engine_snap_drop(e, 3);
    if (saved > 0) ts_engine_snap_drop(e, 4);
    CHECK(ts_engine_snap_save(e, 0, 4 + saved) == TS_OK);
    CHECK(ts_engine_snap_restore(e, 3, 1) == TS_ERR_INVALID); /* dropped: empty */
    CHECK(ts_engine_snap_restore(e, 4 + saved, 1) == TS_OK && ts_engine_slot_len(e, 1) == na);
    free(want), free(got), free(other), free(a);
    ts_engine_free(e);
}

/* The same weights with an alternative form of config.json (config.<form>.json beside the
 * real one: older RoPE keys, a layer pattern instead of layer_types, ...) give the same logits. */
static void check_config_forms(const char *dir, const char *model) {
    static const char *const forms[] = {"interval", "legacy_rope", "pattern"};
    char src[PATH_MAX], tmp[64], path[8192], link[8192];
    int32_t *ids;
    int n;
    snprintf(path, sizeof path, "%s/%s/ref/prompt_1.ids", dir, model);
    if (fx_read_ids(path, 0, &ids, &n) != 0) return;
    for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
        snprintf(path, sizeof path, "%s/%s/config.%s.json", dir, model, forms[f]);
        if (access(path, R_OK) != 0 || !realpath(path, src)) continue;
        snprintf(tmp, sizeof tmp, "/tmp/ts_cfgform_XXXXXX");
        CHECK(mkdtemp(tmp) != NULL);
        snprintf(link, sizeof link, "%s/config.json", tmp);
        CHECK(symlink(src, link) == 0);
        snprintf(path, sizeof path, "%s/%s/model.safetensors", dir, model);
        snprintf(link, sizeof link, "%s/model.safetensors", tmp);
        CHECK(realpath(path, src) && symlink(src, link) == 0);
        ts_model *a, *b;
        snprintf(path, sizeof path, "%s/%s", dir, model);
        CHECK(ts_model_open(path, &a) == TS_OK);
        ts_status st = ts_model_open(tmp, &b);
        CHECKF(st == TS_OK, "%s config.%s.json: %s", model, forms[f], ts_last_error());
        if (st == TS_OK) {
            ts_engine *ea = make_engine(a, TS_ISA_AUTO, 1, 512), *eb = make_engine(b, TS_ISA_AUTO, 1, 512);
            float *la = fx_prefill_all(ea, 0, ids, n), *lb = fx_prefill_all(eb, 0, ids, n);
            CHECKF(la && lb && tu_rel_l2(lb, la, (long)n * ts_engine_n_vocab(ea)) == 0.0,
                   "%s: config.%s.json gives other logits", model, forms[f]);
            free(la), free(lb);
            ts_engine_free(ea), ts_engine_free(eb);
            ts_model_close(b);
            printf("%s: config.%s.json ok\n", model, forms[f]);
        }
        ts_model_close(a);
        snprintf(link, sizeof link, "%s/config.json", tmp);
        unlink(link);
        snprintf(link, sizeof link, "%s/model.safetensors", tmp);
        unlink(link);
        rmdir(tmp);
    }
    free(ids);
}

static void check_family(const char *family, int min_models, bool attention_only) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", tu_env("TS_FIXTURES", "tests/fixtures"), family);
    char *models[MAX_MODELS];
    int nm = fx_list_models(dir, models, MAX_MODELS);
    CHECKF(nm >= min_models, "expected at least %d fixture models in %s, found %d", min_models,
           dir, nm);
    ts_isa isas[] = {TS_ISA_SCALAR, TS_ISA_AUTO};
    const char *labels[] = {"scalar", "best"};
    for (int i = 0; i < nm; i++) {
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, models[i]);
        ts_model *m;
        ts_status st = ts_model_open(path, &m);
        CHECKF(st == TS_OK, "%s: %s", models[i], ts_last_error());
        if (st == TS_OK) {
            for (int k = 0; k < 2; k++) {
                ts_engine *e = make_engine(m, isas[k], 1, k ? 64 : 512);
                CHECK(e != NULL);
                if (!e) continue;
                check_logits(dir, models[i], e, labels[k]);
                check_greedy(dir, models[i], e, labels[k]);
                ts_engine_free(e);
            }
            check_multi_sequence(dir, models[i], m);
            check_rewind(dir, models[i], m, attention_only);
            check_snapshots(dir, models[i], m);
            check_sample_batch(models[i], m);
            check_config_forms(dir, models[i]);
            ts_model_close(m);
            printf("%s/%s: checked\n", family, models[i]);
        }
        free(models[i]);
    }
}

int main(void) {
    check_family("qwen35", 3, false);
    check_family("gemma3", 3, true);
    return tu_report("test_hf_parity");
}
