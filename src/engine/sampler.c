/* Token sampling: greedy, or temperature then top-k, top-p and min-p (the order Hugging Face
 * generate applies them), drawn from a seeded generator so a seed reproduces a sequence.
 * Scratch for the candidates is allocated once per sampler, not per token. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops_seq.h"
#include "base/argmax.h"
#include "base/status.h"
#include "engine/sampler_int.h"

typedef struct {
    float logit;
    int32_t id;
} cand;

struct ts_sampler {
    ts_sampler_params p;
    int n_vocab;
    uint64_t rng;
    cand *c;      /* [n_vocab]: candidates being ordered (top-k, top-p) */
    float *pv;    /* [n_vocab]: the candidates' scaled logits, then probabilities */
    int32_t *pid; /* [n_vocab]: their token ids */
    const cpu_seq_kernels *k; /* the CPU's vector exp */
    /* ts_sampler_set_adjust's: the caller's array */
    const ts_logit_adjust *adj;
    int n_adj;
};

void ts_sampler_params_default(ts_sampler_params *p) {
    *p = (ts_sampler_params){.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                             .seed = 0};
}

ts_status ts_sampler_create(const ts_sampler_params *p, int n_vocab, ts_sampler **out) {
    *out = NULL;
    if (n_vocab < 1) return ts_error(TS_ERR_INVALID, "vocabulary of %d tokens", n_vocab);
    if (!(p->temperature >= 0.0f) || !(p->top_p > 0.0f && p->top_p <= 1.0f) ||
        !(p->min_p >= 0.0f && p->min_p <= 1.0f) || p->top_k < 0)
        return ts_error(TS_ERR_INVALID, "sampler parameters out of range (temperature %g, top_k "
                        "%d, top_p %g, min_p %g)", p->temperature, p->top_k, p->top_p, p->min_p);
    ts_sampler *s = calloc(1, sizeof *s);
    if (!s) return ts_error(TS_ERR_NOMEM, "out of memory");
    s->c = malloc((size_t)n_vocab * sizeof *s->c);
    s->pv = malloc((size_t)n_vocab * sizeof *s->pv);
    s->pid = malloc((size_t)n_vocab * sizeof *s->pid);
    if (!s->c || !s->pv || !s->pid) {
        ts_sampler_free(s);
        return ts_error(TS_ERR_NOMEM, "out of memory");
    }
    s->k = cpu_seq_pick(cpu_isa_best());
    s->p = *p;
    s->n_vocab = n_vocab;
    s->rng = p->seed;
    *out = s;
    return TS_OK;
}

void ts_sampler_free(ts_sampler *s) {
    if (!s) return;
    free(s->c);
    free(s->pv);
    free(s->pid);
    free(s);
}

/* splitmix64: a full-period generator with good mixing, so nearby seeds differ at once */
static double next_uniform(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

static int by_logit_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Whether a logit can be drawn at all: NaN and -inf are never candidates (both fail the
 * comparison, which the compiler vectorises in a loop). */
static inline bool is_candidate(float l) { return l > -INFINITY; }

/* The k best candidates of a row (fewer if it has fewer) into c[0..): by logit, the lower id
 * first among equals, NaN and -inf never; then divided by the temperature t > 0 and sorted by
 * (logit / t, id), the order the draw walks them in. A min-heap of size k over the row in which
 * each logit is first compared, as it is, with the heap's worst (a division by t > 0 keeps the
 * order), 16 at a time: most of a large vocabulary costs a vector compare. (Every logit divided
 * into the candidate array first, and that heaped, took 0.45-0.78 ms for a 262144-token row.) */
static int top_k_of(cand *c, const float *logits, const int32_t *tok, int n_in, int k, float t) {
    int size = 0;
    float worst = -INFINITY; /* the heap root's logit, once the heap is full */
    for (int i = 0; i < n_in; i++) {
        if (size == k) /* whole blocks of 16 below the worst skipped (a vectorised compare) */
            for (; i + 16 <= n_in; i += 16) {
                int in = 0;
                for (int j = 0; j < 16; j++) in |= !(logits[i + j] < worst);
                if (in) break;
            }
        if (i == n_in) break;
        float l = logits[i];
        if (size == k && l < worst) continue;
        if (!is_candidate(l)) continue;
        cand x = {l, tok ? tok[i] : (int32_t)i};
        if (size == k) {
            if (by_logit_desc(&x, &c[0]) >= 0) continue; /* not better than the heap's worst */
            int j = 0; /* replace the root and sift down */
            for (;;) {
                int lc = 2 * j + 1, rc = lc + 1, m = j;
                const cand *mv = &x;
                if (lc < k && by_logit_desc(&c[lc], mv) > 0) m = lc, mv = &c[lc];
                if (rc < k && by_logit_desc(&c[rc], mv) > 0) m = rc, mv = &c[rc];
                if (m == j) break;
                c[j] = c[m];
                j = m;
            }
            c[j] = x;
        } else {
            int j = size++; /* sift up */
            while (j > 0 && by_logit_desc(&x, &c[(j - 1) / 2]) > 0) {
                c[j] = c[(j - 1) / 2];
                j = (j - 1) / 2;
            }
            c[j] = x;
        }
        if (size == k) worst = c[0].logit;
    }
    for (int i = 0; i < size; i++) c[i].logit /= t;
    qsort(c, (size_t)size, sizeof *c, by_logit_desc);
    return size;
}

/* Keeps the smallest set of the most probable candidates whose mass reaches target at the front
 * of (pv, pid) and returns its size: the set a sort of all n would give as its prefix, without
 * sorting all n. The weights (pv[], >= 0) are bucketed by their float bits' top 12 (sign 0,
 * exponent, 3 mantissa bits: monotone in the value); the buckets are summed from the top until
 * they reach target. Every candidate of a bucket above that one is kept, in vocabulary order;
 * only the last bucket's candidates (gathered in c) are sorted, to find where the prefix ends
 * inside it. (A flat distribution - a high temperature, a random model - keeps most of the
 * vocabulary, and sorting all of it took ~25 ms a token for 248k.) The bucket masses go into four
 * histograms in turn, so that a run of candidates in one bucket is not one chain of dependent
 * adds; one pass then both keeps the upper buckets and gathers the last one. (Copying every
 * candidate into c first, one histogram, and a pass for each took 1.26 ms for a real Gemma 3
 * row of 262144 at top-p 0.95.) */
#define SAMPLER_BUCKETS 2048
static inline int bucket_of(float w) {
    uint32_t b;
    memcpy(&b, &w, 4);
    return (int)(b >> 20);
}

static int nucleus(float *pv, int32_t *pid, cand *c, int n, double target) {
    static _Thread_local double mass[4][SAMPLER_BUCKETS];
    memset(mass, 0, sizeof mass);
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int h = 0; h < 4; h++)
            mass[h][bucket_of(pv[i + h])] += pv[i + h];
    for (; i < n; i++)
        mass[0][bucket_of(pv[i])] += pv[i];
    double above = 0; /* the mass of the buckets above the last one */
    int low = 0;      /* the last bucket needed */
    for (int k = SAMPLER_BUCKETS - 1; k >= 0; k--) {
        double mk = (mass[0][k] + mass[1][k]) + (mass[2][k] + mass[3][k]);
        if (above + mk >= target) {
            low = k;
            break;
        }
        above += mk;
    }
    int m = 0, e = 0;
    for (i = 0; i < n; i++) {
        int b = bucket_of(pv[i]);
        if (b > low)
            pv[m] = pv[i], pid[m++] = pid[i];
        else if (b == low)
            c[e++] = (cand){pv[i], pid[i]};
    }
    qsort(c, (size_t)e, sizeof *c, by_logit_desc);
    double cum = above;
    for (int j = 0; j < e; j++) {
        pv[m + j] = c[j].logit, pid[m + j] = c[j].id;
        cum += c[j].logit;
        if (cum >= target) return m + j + 1;
    }
    return m + e > 0 ? m + e : n;
}

/* The sum of e[0 .. n) with eight partial sums (independent adds, not one chain). */
static double sum_fast(const float *e, int n) {
    float a[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            a[k] += e[i + k];
    double t = 0;
    for (int k = 0; k < 8; k++)
        t += a[k];
    for (; i < n; i++)
        t += e[i];
    return t;
}

/* The first i with e[0] + ... + e[i] > r (else n - 1): whole blocks of 256 skipped by their sums,
 * so that few of the additions depend on each other. */
static int draw_index(const float *e, int n, double r) {
    double acc = 0;
    int i = 0;
    for (; i + 256 <= n; i += 256) {
        double b = sum_fast(e + i, 256);
        if (acc + b > r) break;
        acc += b;
    }
    for (; i < n; i++) {
        acc += e[i];
        if (r < acc) return i;
    }
    return n - 1;
}

bool ts_sampler_is_greedy(const ts_sampler *s) {
    return s->p.temperature <= 0.0f || s->p.top_k == 1;
}

/* Temperature, then top-k, top-p and min-p, then a draw in proportion to what is left. Only
 * top-k and top-p need an order: without them the candidates stay in vocabulary order (a full
 * sort of a 248k vocabulary took 32 ms a token, more than a decode step). The weights are
 * exp(logit / T - max) through the CPU backend's vector exp, left unnormalized (top-p compares
 * with top_p times their sum, min-p with min_p times the largest, which is 1).
 *
 * Over a whole row of n logits when tok is NULL. Else over a subset of a row that a backend's
 * sampling op kept (ts_sample_res): logits[i] is token tok[i]'s, and total is the sum of the
 * weights over the whole row, which top-p without top-k needs. u: the draw's uniform number,
 * or NULL to take the next one from the generator. */
static int32_t pick(ts_sampler *s, const float *logits, const int32_t *tok, int n_in,
                    double total_row, const double *u) {
    const ts_sampler_params *p = &s->p;
#define ID(i) (tok ? tok[(i)] : (int32_t)(i))
    if (ts_sampler_is_greedy(s)) return ID(ts_argmax_f32(logits, n_in));
    float *pv = s->pv;
    int32_t *pid = s->pid;
    int n = 0;
    const float t = p->temperature;
    if (p->top_k > 0 && p->top_k < s->n_vocab) { /* the k best, ordered (fewer if fewer) */
        n = top_k_of(s->c, logits, tok, n_in, p->top_k, t);
        if (n == 0) return ID(ts_argmax_f32(logits, n_in));
        for (int i = 0; i < n; i++)
            pv[i] = s->c[i].logit - s->c[0].logit, pid[i] = s->c[i].id;
        double total = s->k->exp_sum(pv, n), cum = 0;
        for (int i = 0; p->top_p < 1.0f && i < n; i++) {
            cum += pv[i];
            if (cum >= p->top_p * total) {
                n = i + 1;
                break;
            }
        }
    } else { /* every candidate, in vocabulary order */
        /* the largest logit and the count of those that are no candidate, each a loop the
         * compiler vectorises (one loop of both was left scalar and took half of a
         * temperature-1 draw) */
        float mx = ts_max_f32(logits, n_in);
        int good = 0;
        for (int i = 0; i < n_in; i++)
            good += is_candidate(logits[i]);
        int bad = n_in - good;
        if (bad == n_in) return ID(ts_argmax_f32(logits, n_in));
        const float top = mx / t;
        if (!bad) { /* the usual case, in loops the compiler vectorizes */
            for (int i = 0; i < n_in; i++)
                pv[i] = logits[i] / t - top;
            for (int i = 0; i < n_in; i++)
                pid[i] = ID(i);
            n = n_in;
        } else {
            for (int i = 0; i < n_in; i++)
                if (is_candidate(logits[i]))
                    pv[n] = logits[i] / t - top, pid[n++] = ID(i);
        }
        double total = s->k->exp_sum(pv, n);
        if (tok) total = total_row;
        if (p->top_p < 1.0f) n = nucleus(pv, pid, s->c, n, p->top_p * total);
    }
#undef ID
    if (p->min_p > 0.0f) { /* nothing below min_p times the best weight (e^0 = 1) */
        int keep = 0;
        for (int i = 0; i < n; i++)
            if (pv[i] >= p->min_p) pv[keep] = pv[i], pid[keep++] = pid[i];
        n = keep > 0 ? keep : 1;
    }
    double r = (u ? *u : next_uniform(&s->rng)) * sum_fast(pv, n);
    return pid[draw_index(pv, n, r)];
}

int32_t ts_sampler_sample(ts_sampler *s, const float *logits) {
    return pick(s, logits, NULL, s->n_vocab, 0, NULL);
}

double ts_sampler_logsumexp(ts_sampler *s, const float *logits) {
    float mx = ts_max_f32(logits, s->n_vocab); /* NaN never wins */
    if (mx == -INFINITY) return -INFINITY;
    /* a non-candidate's term is exp(-inf) = 0: a select the compiler vectorises instead of a
     * scalar loop gathering the candidates; in chunks that stay in L1 rather than a whole row's
     * terms (1 MB for 262144 tokens) out to L3 and back. 0.26 -> 0.21 ms for a real Gemma 3
     * row on the 2-core VM: the exps themselves are the rest. */
    enum { CHUNK = 2048 };
    float *pv = s->pv;
    double sum = 0;
    for (int c0 = 0; c0 < s->n_vocab; c0 += CHUNK) {
        int n = s->n_vocab - c0 < CHUNK ? s->n_vocab - c0 : CHUNK;
        const float *l = logits + c0;
        for (int i = 0; i < n; i++)
            pv[i] = is_candidate(l[i]) ? l[i] - mx : -INFINITY;
        sum += s->k->exp_sum(pv, n);
    }
    return (double)mx + log(sum);
}

int ts_sampler_top(ts_sampler *s, const float *logits, int k, int32_t *ids, float *vals) {
    if (k <= 0) return 0;
    if (k > s->n_vocab) k = s->n_vocab;
    int n = top_k_of(s->c, logits, NULL, s->n_vocab, k, 1.0f);
    for (int i = 0; i < n; i++)
        ids[i] = s->c[i].id, vals[i] = s->c[i].logit;
    return n;
}

/* The n_top best of n (logit, id) pairs into out, made log-probabilities by lse. */
static void top_logprobs(ts_sampler *s, const float *logit, const int32_t *tok, int n, int n_top,
                         double lse, ts_logprobs *out) {
    if (n_top > TS_MAX_TOP_LOGPROBS) n_top = TS_MAX_TOP_LOGPROBS;
    out->n_top = n_top > 0 ? top_k_of(s->c, logit, tok, n, n_top, 1.0f) : 0;
    for (int i = 0; i < out->n_top; i++)
        out->top_id[i] = s->c[i].id, out->top_logprob[i] = (float)(s->c[i].logit - lse);
}

void ts_sampler_logprobs(ts_sampler *s, const float *logits, int32_t id, int n_top,
                         ts_logprobs *out) {
    double lse = ts_sampler_logsumexp(s, logits);
    out->logprob = id >= 0 && id < s->n_vocab ? (float)(logits[id] - lse) : -INFINITY;
    top_logprobs(s, logits, NULL, s->n_vocab, n_top, lse, out);
}

bool ts_sampler_logprobs_list(ts_sampler *s, const ts_sample_res *res, float chosen, int n_top,
                              ts_logprobs *out) {
    int n = 0; /* entries outside the vocabulary (a broken list) are dropped */
    float mx = -INFINITY;
    for (int i = 0; i < res->n; i++) {
        if (res->tok[i] < 0 || res->tok[i] >= s->n_vocab) continue;
        res->logit[n] = res->logit[i], res->tok[n] = res->tok[i];
        if (res->logit[n] > mx) mx = res->logit[n];
        n++;
    }
    if (mx == -INFINITY || !(res->total > 0)) return false;
    double lse = (double)mx + log(res->total);
    out->logprob = (float)(chosen - lse);
    top_logprobs(s, res->logit, res->tok, n, n_top, lse, out);
    return true;
}

int ts_sampler_n_vocab(const ts_sampler *s) { return s->n_vocab; }

void ts_sampler_set_adjust(ts_sampler *s, const ts_logit_adjust *adj, int n) {
    s->adj = n > 0 ? adj : NULL;
    s->n_adj = n > 0 ? n : 0;
}

void ts_logit_adjust_apply(const ts_logit_adjust *adj, int n, float *logits, int n_vocab) {
    for (int i = 0; i < n; i++) {
        const ts_logit_adjust a = adj[i];
        if (a.id < 0 || a.id >= n_vocab) continue;
        float v = logits[a.id] + a.bias;
        if (a.rep != 1.0f && a.rep > 0.0f && isfinite(a.rep)) v = v > 0 ? v / a.rep : v * a.rep;
        logits[a.id] = v - a.sub;
    }
}

void ts_sampler_adjust(const ts_sampler *s, float *logits) {
    ts_logit_adjust_apply(s->adj, s->n_adj, logits, s->n_vocab);
}

ts_sample_req ts_sampler_request(ts_sampler *s) {
    ts_sample_req r = {0.0f, 1.0f, 0.0f, 0, 0.0, s->n_adj, s->adj, 0};
    if (ts_sampler_is_greedy(s)) return r;
    r.temperature = s->p.temperature, r.top_p = s->p.top_p, r.min_p = s->p.min_p;
    r.top_k = s->p.top_k < s->n_vocab ? s->p.top_k : 0;
    r.u = next_uniform(&s->rng);
    return r;
}

ts_sample_req ts_sampler_peek(const ts_sampler *s) {
    ts_sampler copy = *s; /* only its generator moves */
    return ts_sampler_request(&copy);
}

ts_sample_req ts_sampler_logprob_request(int n_top) {
    ts_sample_req r = {1.0f, 1.0f, 0.0f, n_top > 1 ? n_top : 1, 0.0, 0, NULL, 1};
    return r;
}

static int by_id(const void *a, const void *b) {
    const cand *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* Puts a backend's candidate list (in no particular order) into vocabulary order, the order
 * pick walks a whole row in: draws then do not depend on the order the device wrote the list
 * in, and equal the whole row's. A short list is sorted; a long one is scattered into a row
 * and gathered back. */
static int vocabulary_order(ts_sampler *s, float *logit, int32_t *tok, int n) {
    int v = 0; /* ids outside the vocabulary (a broken list) are dropped, never returned */
    for (int i = 0; i < n; i++)
        if (tok[i] >= 0 && tok[i] < s->n_vocab) logit[v] = logit[i], tok[v++] = tok[i];
    n = v;
    if ((int64_t)n * 16 < s->n_vocab) {
        for (int i = 0; i < n; i++)
            s->c[i] = (cand){logit[i], tok[i]};
        qsort(s->c, (size_t)n, sizeof *s->c, by_id);
        for (int i = 0; i < n; i++)
            logit[i] = s->c[i].logit, tok[i] = s->c[i].id;
        return n;
    }
    float *row = s->pv; /* NaN: not in the list (a listed logit is never NaN) */
    for (int i = 0; i < s->n_vocab; i++)
        row[i] = NAN;
    for (int i = 0; i < n; i++)
        row[tok[i]] = logit[i];
    int m = 0;
    for (int i = 0; i < s->n_vocab; i++)
        if (row[i] == row[i]) logit[m] = row[i], tok[m++] = i;
    return m;
}

int32_t ts_sampler_finish(ts_sampler *s, const ts_sample_req *req, const ts_sample_res *res) {
    if (res->id >= 0) return res->id;
    int n = vocabulary_order(s, res->logit, res->tok, res->n);
    if (n == 0) return -1;
    return pick(s, res->logit, res->tok, n, res->total, &req->u);
}
