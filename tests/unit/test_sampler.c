/* The sampler: greedy picks the argmax; top-k, top-p and min-p never pick outside their sets;
 * the empirical distribution follows softmax(logits / T); a seed reproduces a sequence. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler_int.h"
#include "tessera.h"
#include "testutil.h"

#define V 50

static ts_sampler *make(float t, int k, float p, float minp, uint64_t seed) {
    ts_sampler_params sp = {t, k, p, minp, seed};
    ts_sampler *s = NULL;
    CHECK(ts_sampler_create(&sp, V, &s) == TS_OK);
    return s;
}

static int by_value_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

int main(void) {
    float logits[V];
    for (int i = 0; i < V; i++) logits[i] = -0.1f * (float)((i * 7) % V); /* id 0 is best */
    logits[13] = 0.5f;                                                   /* the argmax */

    ts_sampler *g = make(0.0f, 0, 1.0f, 0.0f, 1);
    for (int i = 0; i < 5; i++) CHECK(ts_sampler_sample(g, logits) == 13);
    { /* greedy never takes a NaN logit, wherever it stands; ties go to the first */
        float row[V];
        memcpy(row, logits, sizeof row);
        row[0] = NAN, row[40] = NAN, row[49] = 0.5f;
        CHECKF(ts_sampler_sample(g, row) == 13, "greedy with NaN at 0: %d",
               ts_sampler_sample(g, row));
    }
    ts_sampler_free(g);

    /* order of the ids by logit, for checking set membership */
    int order[V];
    for (int i = 0; i < V; i++) order[i] = i;
    for (int i = 0; i < V; i++)
        for (int j = i + 1; j < V; j++)
            if (logits[order[j]] > logits[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    int rank[V];
    for (int i = 0; i < V; i++) rank[order[i]] = i;

    /* top-k = 3: only the three best ever come out */
    ts_sampler *k3 = make(1.5f, 3, 1.0f, 0.0f, 42);
    int seen[V] = {0};
    for (int i = 0; i < 3000; i++) seen[ts_sampler_sample(k3, logits)]++;
    for (int i = 0; i < V; i++) CHECKF(rank[i] < 3 || seen[i] == 0, "top-k leaked id %d", i);
    CHECK(seen[order[0]] > 0 && seen[order[1]] > 0 && seen[order[2]] > 0);
    ts_sampler_free(k3);

    /* the distribution at T = 1 follows softmax: compare frequencies of the top 5 */
    ts_sampler *full = make(1.0f, 0, 1.0f, 0.0f, 7);
    memset(seen, 0, sizeof seen);
    int N = 200000;
    for (int i = 0; i < N; i++) seen[ts_sampler_sample(full, logits)]++;
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(logits[i]);
    for (int r = 0; r < 5; r++) {
        int id = order[r];
        double p = exp(logits[id]) / z, f = (double)seen[id] / N;
        CHECKF(fabs(f - p) < 4 * sqrt(p * (1 - p) / N) + 1e-3, "id %d: freq %.4f vs p %.4f", id, f,
               p);
    }
    ts_sampler_free(full);

    /* top-p: the smallest prefix of the sorted distribution whose mass reaches p */
    double probs[V], cum = 0;
    for (int i = 0; i < V; i++) probs[i] = exp(logits[i]) / z;
    int nucleus = 0;
    while (cum < 0.5) cum += probs[order[nucleus++]];
    ts_sampler *tp = make(1.0f, 0, 0.5f, 0.0f, 9);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 5000; i++) seen[ts_sampler_sample(tp, logits)]++;
    for (int i = 0; i < V; i++) CHECKF(rank[i] < nucleus || seen[i] == 0, "top-p leaked id %d", i);
    ts_sampler_free(tp);

    /* min-p: nothing below min_p × the best probability */
    ts_sampler *mp = make(1.0f, 0, 1.0f, 0.6f, 11);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 5000; i++) seen[ts_sampler_sample(mp, logits)]++;
    double pmax = probs[order[0]];
    for (int i = 0; i < V; i++)
        CHECKF(probs[i] >= 0.6 * pmax || seen[i] == 0, "min-p leaked id %d", i);
    ts_sampler_free(mp);

    /* seeds: the same seed repeats the sequence, another seed does not */
    ts_sampler *a = make(1.0f, 0, 1.0f, 0.0f, 5), *b = make(1.0f, 0, 1.0f, 0.0f, 5),
               *c = make(1.0f, 0, 1.0f, 0.0f, 6);
    int same_ab = 1, same_ac = 1;
    for (int i = 0; i < 64; i++) {
        int x = ts_sampler_sample(a, logits), y = ts_sampler_sample(b, logits),
            w = ts_sampler_sample(c, logits);
        same_ab &= x == y;
        same_ac &= x == w;
    }
    CHECK(same_ab);
    CHECK(!same_ac);
    ts_sampler_free(a), ts_sampler_free(b), ts_sampler_free(c);

    /* top-p over a large vocabulary (the sampler buckets the probabilities instead of sorting
     * them all): groups of 1000 tokens of equal logit, the nucleus ending inside a group; no
     * token outside it ever comes out, and the part of the boundary group inside it does */
    {
        enum { BV = 100000, G = 1000 };
        float *big = malloc(sizeof(float) * BV);
        for (int i = 0; i < BV; i++) big[i] = -0.05f * (float)(i / G);
        double zb = 0;
        for (int gi = 0; gi < BV / G; gi++) zb += G * exp(-0.05 * gi);
        /* rank of token i by (probability desc, id asc) is i itself */
        double tpv = 0.35, cumb = 0;
        int nuc = 0;
        for (int gi = 0; gi < BV / G && cumb < tpv; gi++)
            for (int j = 0; j < G && cumb < tpv; j++) cumb += exp(-0.05 * gi) / zb, nuc++;
        CHECKF(nuc % G > G / 10 && nuc % G < G - G / 10, "boundary inside a group (%d)", nuc);
        ts_sampler_params sp = {1.0f, 0, (float)tpv, 0.0f, 3};
        ts_sampler *bs = NULL;
        CHECK(ts_sampler_create(&sp, BV, &bs) == TS_OK);
        int leaked = 0, boundary = 0;
        for (int i = 0; i < 600; i++) {
            int id = ts_sampler_sample(bs, big);
            leaked += id > nuc; /* one of slack: the float sums may end a token apart */
            boundary += id >= nuc / G * G;
        }
        CHECKF(leaked == 0, "top-p over %d tokens leaked %d draws", BV, leaked);
        CHECKF(boundary > 0, "the nucleus's boundary group never drawn");
        ts_sampler_free(bs);
        free(big);
    }
    /* top-k over rows of 16 lengths in a row (whatever the selection's blocks of 16 line up
     * with, one row ends on a block's end), with huge values just past the end: nothing beyond
     * the row is read, and every draw is one of the k best (ids 0..41: the row falls with the
     * id, but for a NaN and a -inf among the first) */
    for (int KV = 4090; KV < 4106; KV++) {
        enum { TK = 40 };
        float *row = malloc((size_t)(KV + 16) * sizeof *row);
        for (int i = 0; i < KV; i++) row[i] = 5.0f - 0.001f * (float)i;
        for (int i = KV; i < KV + 16; i++) row[i] = 1e30f;
        row[3] = NAN, row[7] = -INFINITY;
        ts_sampler_params sp = {0.7f, TK, 1.0f, 0.0f, 5};
        ts_sampler *ks = NULL;
        CHECK(ts_sampler_create(&sp, KV, &ks) == TS_OK);
        int outside = 0, top = 0;
        for (int i = 0; i < 100; i++) {
            int id = ts_sampler_sample(ks, row);
            outside += id < 0 || id > TK + 1 || id == 3 || id == 7;
            top += id == 0;
        }
        CHECKF(outside == 0, "top-k %d over %d tokens: %d draws outside the k best", TK, KV,
               outside);
        CHECKF(top > 0, "top-k over %d tokens never drew the best token", KV);
        ts_sampler_free(ks);
        free(row);
    }

    /* the host's half of a draw on the device: with top-k / top-p the backend hands back a
     * subset of the candidates (in any order) that holds every token the filters can keep,
     * and the sum of all weights; ts_sampler_finish over it, with the uniform number that
     * ts_sampler_request took, must draw what ts_sampler_sample draws from the whole row */
    {
        enum { SV = 20000, KEEP = 3000 };
        float *row = malloc(SV * sizeof *row), *sub = malloc(SV * sizeof *sub);
        int32_t *tok = malloc(SV * sizeof *tok), *ord = malloc(SV * sizeof *ord);
        unsigned long long st = 99;
        for (int i = 0; i < SV; i++) row[i] = 20.0f * tu_rng_uniform(&st), ord[i] = i;
        row[77] = NAN, row[78] = -INFINITY; /* never candidates */
        /* the KEEP-th largest logit: every token at or above it goes into the subset */
        float *srt = malloc(SV * sizeof *srt);
        int nc = 0;
        for (int i = 0; i < SV; i++)
            if (!isnan(row[i]) && row[i] != -INFINITY) srt[nc++] = row[i];
        qsort(srt, (size_t)nc, sizeof *srt, by_value_desc);
        const struct { float t; int k; float p, minp; } cfg[] = {
            {0.8f, 40, 1.0f, 0.0f}, {1.0f, 0, 0.9f, 0.0f}, {0.6f, 50, 0.95f, 0.02f},
            {1.3f, 0, 0.5f, 0.05f}, {1.0f, 0, 0.3f, 0.0f}};
        for (size_t ci = 0; ci < 2 * sizeof cfg / sizeof *cfg; ci++) {
            /* the second round: a list of 600 (sorted by id, not scattered), top-k only */
            bool small = ci >= sizeof cfg / sizeof *cfg;
            size_t cj = ci % (sizeof cfg / sizeof *cfg);
            if (small && cfg[cj].k == 0) continue;
            ts_sampler_params sp = {cfg[cj].t, cfg[cj].k, cfg[cj].p, cfg[cj].minp, 1234 + ci};
            ts_sampler *sa = NULL, *sb = NULL;
            CHECK(ts_sampler_create(&sp, SV, &sa) == TS_OK &&
                  ts_sampler_create(&sp, SV, &sb) == TS_OK);
            if (!sa || !sb) break;
            float mx = srt[0], cut = srt[small ? 600 : KEEP];
            double total = 0;
            for (int i = 0; i < SV; i++)
                if (!isnan(row[i]) && row[i] != -INFINITY)
                    total += expf(row[i] / sp.temperature - mx / sp.temperature);
            int diff = 0, n = 0;
            /* the subset back to front, as a device's list comes in no particular order */
            for (int i = SV - 1; i >= 0; i--)
                if (!isnan(row[i]) && row[i] >= cut) sub[n] = row[i], tok[n++] = i;
            for (int d = 0; d < 300; d++) {
                int32_t want = ts_sampler_sample(sa, row);
                ts_sample_req rq = ts_sampler_request(sb);
                ts_sample_res rs = {-1, n, sub, tok, total};
                diff += ts_sampler_finish(sb, &rq, &rs) != want;
            }
            CHECKF(diff == 0, "config %zu: %d of 300 draws from the subset differ", ci, diff);
            ts_sampler_free(sa);
            ts_sampler_free(sb);
        }
        /* a token the backend drew itself comes through as it is */
        ts_sampler *g2 = make(1.0f, 0, 1.0f, 0.0f, 5);
        ts_sample_req rq = ts_sampler_request(g2);
        ts_sample_res rs = {17, 0, NULL, NULL, 0};
        CHECK(ts_sampler_finish(g2, &rq, &rs) == 17);
        CHECK(!ts_sampler_is_greedy(g2) && rq.temperature == 1.0f && rq.u >= 0 && rq.u < 1);
        ts_sampler_free(g2);
        free(row), free(sub), free(tok), free(ord), free(srt);
    }

    /* logsumexp (the server's log-probabilities) against a float64 sum, NaN left out */
    {
        enum { LV = 248320 };
        float *row = malloc(LV * sizeof *row);
        unsigned long long st = 7;
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < LV; i++) row[i] = 15.0f * tu_rng_uniform(&st);
        row[5] = NAN, row[6] = -INFINITY;
        for (int i = 0; i < LV; i++)
            if (!isnan(row[i]) && row[i] > mx) mx = row[i];
        for (int i = 0; i < LV; i++)
            if (!isnan(row[i])) sum += exp((double)row[i] - mx);
        ts_sampler_params sp = {1.0f, 0, 1.0f, 0.0f, 1};
        ts_sampler *ls = NULL;
        CHECK(ts_sampler_create(&sp, LV, &ls) == TS_OK);
        double got = ls ? ts_sampler_logsumexp(ls, row) : 0, want = mx + log(sum);
        CHECKF(fabs(got - want) <= 1e-5, "logsumexp %.9f against %.9f", got, want);
        for (int i = 0; i < LV; i++) row[i] = -INFINITY;
        CHECK(!ls || ts_sampler_logsumexp(ls, row) == -INFINITY);
        ts_sampler_free(ls);
        free(row);
    }

    /* ts_sampler_top (log-probabilities' alternatives) against the definition: every candidate
     * ordered by logit, then the lower id; NaN and -inf never. Rows of many ties (logits from
     * 12 values), a huge value in the last block, rows with fewer candidates than k, and lengths
     * that are no multiple of the 16-logit blocks the selection skips over. */
    {
        unsigned long long st = 11;
        for (int cs = 0; cs < 60; cs++) {
            int n = 1000 + 37 * cs, k = 1 + cs % 20;
            float *row = malloc((size_t)n * sizeof *row);
            for (int i = 0; i < n; i++) {
                double u = tu_rng_uniform(&st);
                row[i] = cs % 3 == 0 ? (float)(int)(12 * u) : (float)(40 * u - 20);
                if (u < 0.05) row[i] = NAN;
                else if (u < 0.1) row[i] = -INFINITY;
            }
            if (cs % 4 == 1) row[n - 1] = 1e30f; /* in the last, partial block */
            if (cs % 5 == 2) /* fewer candidates than k */
                for (int i = 3; i < n; i++) row[i] = i % 2 ? NAN : -INFINITY;
            int32_t want_id[20];
            float want_v[20];
            int nw = 0;
            for (int i = 0; i < n; i++) { /* insertion into the k best, by (logit desc, id) */
                float l = row[i];
                if (!(l > -INFINITY)) continue;
                int j = nw < k ? nw++ : k;
                if (j == k && !(l > want_v[k - 1])) continue;
                if (j == k) j = k - 1;
                while (j > 0 && l > want_v[j - 1]) {
                    want_v[j] = want_v[j - 1], want_id[j] = want_id[j - 1];
                    j--;
                }
                want_v[j] = l, want_id[j] = i;
            }
            ts_sampler_params sp = {1.0f, 0, 1.0f, 0.0f, 1};
            ts_sampler *ts = NULL;
            CHECK(ts_sampler_create(&sp, n, &ts) == TS_OK);
            int32_t got_id[20];
            float got_v[20];
            int ng = ts ? ts_sampler_top(ts, row, k, got_id, got_v) : -1;
            bool same = ng == nw;
            for (int i = 0; same && i < nw; i++)
                same = got_id[i] == want_id[i] && got_v[i] == want_v[i];
            CHECKF(same, "top %d of %d logits (case %d): %d entries, %d wanted%s", k, n, cs, ng, nw,
                   ng == nw ? ", other ids" : "");
            ts_sampler_free(ts);
            free(row);
        }
    }

    /* ts_sampler_logprobs (log-probabilities): the drawn token's and the k best's against the
     * float64 definition; ts_sampler_logprobs_list, from what a backend answers (a candidate
     * list holding the k best in no order, two entries outside the vocabulary, the row's sum of
     * exp(l - max)), must give the same; an empty list is refused. */
    {
        unsigned long long st = 23;
        for (int cs = 0; cs < 10; cs++) {
            int n = 5000 + 311 * cs, k = 2 * cs, chosen = (97 * cs + 5) % n;
            float *row = malloc((size_t)n * sizeof *row), *ll = malloc((size_t)n * sizeof *ll);
            int32_t *lt = malloc((size_t)n * sizeof *lt);
            for (int i = 0; i < n; i++) {
                double u = tu_rng_uniform(&st);
                row[i] = u < 0.02 ? NAN : u < 0.04 ? -INFINITY : (float)(30 * u - 10);
            }
            row[chosen] = 3.0f;
            double mx = -INFINITY, sum = 0;
            for (int i = 0; i < n; i++)
                if (row[i] > mx) mx = row[i];
            for (int i = 0; i < n; i++)
                if (row[i] > -INFINITY) sum += exp((double)row[i] - mx);
            double lse = mx + log(sum);
            ts_sampler_params sp = {1.0f, 0, 1.0f, 0.0f, 1};
            ts_sampler *ts = NULL;
            CHECK(ts_sampler_create(&sp, n, &ts) == TS_OK);
            ts_logprobs la = {0}, lb = {0};
            int32_t top_id[20];
            float top_v[20];
            int nt = ts ? ts_sampler_top(ts, row, k, top_id, top_v) : 0;
            if (ts) ts_sampler_logprobs(ts, row, chosen, k, &la);
            bool ok = fabs(la.logprob - (row[chosen] - lse)) <= 1e-5 && la.n_top == nt;
            for (int i = 0; ok && i < nt; i++)
                ok = la.top_id[i] == top_id[i] &&
                     fabs(la.top_logprob[i] - (top_v[i] - lse)) <= 1e-5;
            CHECKF(ok, "logprobs case %d: %g against %g, %d alternatives against %d", cs,
                   la.logprob, row[chosen] - lse, la.n_top, nt);
            /* the list: every token above the k-th best's logit less 1, and every 50th, from
             * the end, with two ids outside the vocabulary among them */
            float floor_v = nt ? top_v[nt - 1] - 1.0f : (float)mx;
            int nl = 0;
            ll[nl] = 50.0f, lt[nl++] = -1;
            for (int i = n - 1; i >= 0; i--)
                if (row[i] >= floor_v || i % 50 == 0) ll[nl] = row[i], lt[nl++] = i;
            ll[nl] = 60.0f, lt[nl++] = n + 5;
            ts_sample_res res = {-1, nl, ll, lt, sum};
            CHECK(ts && ts_sampler_logprobs_list(ts, &res, row[chosen], k, &lb));
            ok = fabs(lb.logprob - la.logprob) <= 1e-6 && lb.n_top == la.n_top;
            for (int i = 0; ok && i < la.n_top; i++)
                ok = lb.top_id[i] == la.top_id[i] &&
                     fabs(lb.top_logprob[i] - la.top_logprob[i]) <= 1e-6;
            CHECKF(ok, "logprobs from a list, case %d: %g against %g, %d alternatives against %d",
                   cs, lb.logprob, la.logprob, lb.n_top, la.n_top);
            res.n = 0;
            CHECK(!ts || !ts_sampler_logprobs_list(ts, &res, 0.0f, k, &lb));
            ts_sampler_free(ts);
            free(row), free(ll), free(lt);
        }
    }

    /* logit adjustments (logit_bias, penalties): the bias added first, then the entry's
     * repetition penalty (one that is not a positive finite number taken as none), then sub;
     * out-of-range ids skipped; n 0 removes them */
    {
        ts_sampler *as = make(1.0f, 0, 1.0f, 0.0f, 1);
        float row[V], want[V];
        for (int rep_i = 0; as && rep_i < 4; rep_i++) {
            float rep = (float[]){1.5f, 1.0f, 0.0f, NAN}[rep_i];
            float eff = rep_i < 2 ? rep : 1.0f;
            const ts_logit_adjust adj[6] = {{3, 0.0f, rep, 0.5f},   {13, 0.0f, rep, 0.0f},
                                            {5, -2.5f, 1.0f, 0.0f}, {7, 4.0f, rep, 0.25f},
                                            {-1, 9.0f, rep, 9.0f},  {V, 9.0f, rep, 9.0f}};
            memcpy(row, logits, sizeof row), memcpy(want, logits, sizeof want);
            want[3] = (want[3] > 0 ? want[3] / eff : want[3] * eff) - 0.5f;
            want[13] = want[13] > 0 ? want[13] / eff : want[13] * eff;
            want[5] = want[5] - 2.5f;
            float b7 = want[7] + 4.0f;
            want[7] = (b7 > 0 ? b7 / eff : b7 * eff) - 0.25f;
            ts_sampler_set_adjust(as, adj, 6);
            ts_sampler_adjust(as, row);
            CHECKF(memcmp(row, want, sizeof row) == 0, "adjustments with rep %g", rep);
            memcpy(row, logits, sizeof row);
            ts_logit_adjust_apply(adj, 6, row, V);
            CHECKF(memcmp(row, want, sizeof row) == 0, "ts_logit_adjust_apply with rep %g", rep);
            if (rep_i == 0) { /* a bias moves the greedy draw */
                const ts_logit_adjust up = {2, 100.0f, 1.0f, 0.0f};
                memcpy(row, logits, sizeof row);
                ts_logit_adjust_apply(&up, 1, row, V);
                CHECK(ts_sampler_sample(as, row) == 2);
            }
        }
        if (as) {
            const ts_logit_adjust adj[1] = {{3, 1.0f, 1.5f, 0.5f}};
            memcpy(row, logits, sizeof row);
            ts_sampler_set_adjust(as, adj, 0);
            ts_sampler_adjust(as, row);
            CHECK(memcmp(row, logits, sizeof row) == 0);
        }
        ts_sampler_free(as);
    }

    /* bad parameters are refused */
    ts_sampler_params bad = {1.0f, 0, 0.0f, 0.0f, 0};
    ts_sampler *s;
    CHECK(ts_sampler_create(&bad, V, &s) == TS_ERR_INVALID);
    bad.top_p = 1.0f;
    bad.temperature = -1.0f;
    CHECK(ts_sampler_create(&bad, V, &s) == TS_ERR_INVALID);
    return tu_report("test_sampler");
}
