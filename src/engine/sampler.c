/* Token sampling: greedy, or temperature then top-k, top-p and min-p (the order Hugging Face
 * generate applies them), drawn from a seeded generator so a seed reproduces a sequence.
 * Scratch for the candidates is allocated once per sampler, not per token. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

typedef struct {
    float logit;
    int32_t id;
} cand;

struct ts_sampler {
    ts_sampler_params p;
    int n_vocab;
    uint64_t rng;
    cand *c; /* [n_vocab] */
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
    if (!s->c) {
        free(s);
        return ts_error(TS_ERR_NOMEM, "out of memory");
    }
    s->p = *p;
    s->n_vocab = n_vocab;
    s->rng = p->seed;
    *out = s;
    return TS_OK;
}

void ts_sampler_free(ts_sampler *s) {
    if (!s) return;
    free(s->c);
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

static int32_t argmax(const float *logits, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

/* Keeps the k largest candidates (sorted, descending) in c[0..k). */
static int keep_top_k(cand *c, int n, int k) {
    if (k <= 0 || k >= n) {
        qsort(c, (size_t)n, sizeof *c, by_logit_desc);
        return n;
    }
    /* min-heap of size k over the candidates: O(n log k) */
    for (int i = 0; i < n; i++) {
        cand x = c[i];
        int size = i < k ? i : k;
        if (size == k) {
            if (by_logit_desc(&x, &c[0]) >= 0) continue; /* not better than the heap's worst */
            int j = 0; /* replace the root and sift down */
            for (;;) {
                int l = 2 * j + 1, r = l + 1, m = j;
                const cand *mv = &x;
                if (l < k && by_logit_desc(&c[l], mv) > 0) m = l, mv = &c[l];
                if (r < k && by_logit_desc(&c[r], mv) > 0) m = r, mv = &c[r];
                if (m == j) break;
                c[j] = c[m];
                j = m;
            }
            c[j] = x;
        } else {
            int j = size; /* sift up */
            while (j > 0 && by_logit_desc(&x, &c[(j - 1) / 2]) > 0) {
                c[j] = c[(j - 1) / 2];
                j = (j - 1) / 2;
            }
            c[j] = x;
        }
    }
    qsort(c, (size_t)k, sizeof *c, by_logit_desc);
    return k;
}

int32_t ts_sampler_sample(ts_sampler *s, const float *logits) {
    const ts_sampler_params *p = &s->p;
    if (p->temperature <= 0.0f || p->top_k == 1) return argmax(logits, s->n_vocab);
    int n = 0;
    for (int i = 0; i < s->n_vocab; i++) {
        if (isnan(logits[i]) || logits[i] == -INFINITY) continue;
        s->c[n++] = (cand){logits[i] / p->temperature, i};
    }
    if (n == 0) return argmax(logits, s->n_vocab);
    n = keep_top_k(s->c, n, p->top_k);
    /* probabilities of the survivors, stored back in .logit */
    float mx = s->c[0].logit;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        s->c[i].logit = expf(s->c[i].logit - mx);
        sum += s->c[i].logit;
    }
    for (int i = 0; i < n; i++) s->c[i].logit = (float)(s->c[i].logit / sum);
    if (p->top_p < 1.0f) { /* smallest prefix whose mass reaches top_p */
        double cum = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += s->c[i].logit;
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (p->min_p > 0.0f) {
        float floor_p = p->min_p * s->c[0].logit;
        int keep = 1;
        while (keep < n && s->c[keep].logit >= floor_p) keep++;
        n = keep;
    }
    double total = 0;
    for (int i = 0; i < n; i++) total += s->c[i].logit;
    double r = next_uniform(&s->rng) * total, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += s->c[i].logit;
        if (r < acc) return s->c[i].id;
    }
    return s->c[n - 1].id;
}
