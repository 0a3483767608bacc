#include "serve/draft.h"

#include <string.h>

static int min_i(int a, int b) { return a < b ? a : b; }

/* Whether the g tokens of a ending at e equal the g tokens of b ending at f. */
static bool same_run(const int32_t *a, int e, const int32_t *b, int f, int g) {
    return memcmp(a + e - g, b + f - g, (size_t)g * sizeof *a) == 0;
}

static int copy_from(const int32_t *src, int n_src, int at, int max, int32_t *out) {
    int k = min_i(max, n_src - at);
    if (k <= 0) return 0;
    memcpy(out, src + at, (size_t)k * sizeof *out);
    return k;
}

static int from_prediction(serve_draft *g, const int32_t *seq, int n, int n_answer, int max,
                           int32_t *out) {
    /* a run of the answer's own tokens (one is enough: the prediction is the answer's draft,
     * so the place matters more than the run's length) */
    for (int len = min_i(SERVE_DRAFT_NGRAM, n_answer); len >= 1; len--) {
        int after = -1, before = -1; /* the run's end: the guess starts there */
        for (int e = len; e < g->n_pred; e++) {
            if (!same_run(g->pred, e, seq, n, len)) continue;
            if (e >= g->pred_at) {
                after = e;
                break;
            }
            before = e;
        }
        int at = after >= 0 ? after : before;
        if (at < 0) continue;
        g->pred_at = at;
        return copy_from(g->pred, g->n_pred, at, max, out);
    }
    return 0;
}

static int from_sequence(const int32_t *seq, int n, int max, int32_t *out) {
    int32_t last = seq[n - 1]; /* compared first: most places end otherwise */
    for (int len = min_i(SERVE_DRAFT_NGRAM, n - 1); len >= SERVE_DRAFT_LOOKUP_MIN; len--)
        for (int e = n - 1; e >= len; e--) /* the most recent earlier occurrence */
            if (seq[e - 1] == last && same_run(seq, e, seq, n, len))
                return copy_from(seq, n, e, max, out);
    return 0;
}

int serve_draft_guess(serve_draft *g, const int32_t *seq, int n, int n_answer, int max,
                      int32_t *out) {
    if (max <= 0) return 0;
    int k = g->pred ? from_prediction(g, seq, n, n_answer, max, out) : 0;
    if (k == 0 && g->lookup) k = from_sequence(seq, n, max, out);
    return k;
}
