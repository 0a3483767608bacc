/* serve/draft.c: the guesses of speculative decoding - the prediction's rest after an answer's
 * first token that is its first, its place found again after the answer left it (an edit), the
 * place after the last guess preferred among repeats; prompt lookup's most recent occurrence,
 * never from one token; max and the sequence's end bound every guess. */
#include "serve/draft.h"
#include "testutil.h"

#include <string.h>

static int guess(serve_draft *g, const int32_t *seq, int n, int n_answer, int max, int32_t *out) {
    memset(out, 0xff, 16 * sizeof *out);
    return serve_draft_guess(g, seq, n, n_answer, max, out);
}

static bool same(const int32_t *a, const int32_t *b, int n) {
    return memcmp(a, b, (size_t)n * sizeof *a) == 0;
}

int main(void) {
    int32_t out[16];
    /* prediction: 10 11 12 13 14 15 10 11 20 21 */
    const int32_t pred[] = {10, 11, 12, 13, 14, 15, 10, 11, 20, 21};
    serve_draft g = {pred, 10, 0, false};
    int32_t seq[32] = {1, 2, 3, 10}; /* the prompt: 1 2 3; the answer's first token: 10 */
    CHECK(guess(&g, seq, 4, 1, 4, out) == 4 && same(out, pred + 1, 4));
    seq[4] = 11; /* the answer took 10 11 */
    CHECK(guess(&g, seq, 5, 2, 3, out) == 3 && same(out, (int32_t[]){12, 13, 14}, 3));
    CHECK(g.pred_at == 2);
    /* the answer leaves the prediction (99), then comes back to it (14): what follows 14 */
    seq[5] = 12, seq[6] = 99, seq[7] = 14;
    CHECK(guess(&g, seq, 8, 5, 8, out) == 5 && same(out, (int32_t[]){15, 10, 11, 20, 21}, 5));
    /* the longest run decides: "14 15 10 11" is only at 4..7 */
    seq[8] = 15, seq[9] = 10, seq[10] = 11;
    CHECK(guess(&g, seq, 11, 8, 1, out) == 1 && out[0] == 20);
    /* "10 11" (after 77, which is not in it) is at 0..1 and 6..7: the first place at or after
     * the last guess's, else the last one before it */
    int32_t s1[] = {1, 2, 3, 77, 10, 11};
    g.pred_at = 5;
    CHECK(guess(&g, s1, 6, 3, 2, out) == 2 && same(out, (int32_t[]){20, 21}, 2));
    g.pred_at = 0;
    CHECK(guess(&g, s1, 6, 3, 2, out) == 2 && same(out, (int32_t[]){12, 13}, 2));
    g.pred_at = 9;
    CHECK(guess(&g, s1, 6, 3, 2, out) == 2 && same(out, (int32_t[]){20, 21}, 2));
    /* at the prediction's end: nothing to guess */
    seq[11] = 20, seq[12] = 21;
    CHECK(guess(&g, seq, 13, 10, 8, out) == 0);
    /* nothing of the answer in it, no lookup: nothing */
    seq[13] = 77;
    CHECK(guess(&g, seq, 14, 11, 8, out) == 0);
    /* max 0: nothing, and nothing written */
    CHECK(guess(&g, seq, 4, 1, 0, out) == 0 && out[0] == -1);

    /* prompt lookup: 5 6 7 8 9 | 5 6 7 -> 8 9 5 6 (the tokens after the earlier 5 6 7) */
    serve_draft l = {NULL, 0, 0, true};
    const int32_t s2[] = {5, 6, 7, 8, 9, 5, 6, 7};
    CHECK(guess(&l, s2, 8, 3, 4, out) == 4 && same(out, (int32_t[]){8, 9, 5, 6}, 4));
    CHECK(guess(&l, s2, 8, 3, 16, out) == 5); /* up to the sequence's end */
    /* the most recent occurrence: 1 2 a | 1 2 b | 1 2 -> b */
    const int32_t s3[] = {1, 2, 30, 1, 2, 40, 1, 2};
    CHECK(guess(&l, s3, 8, 2, 1, out) == 1 && out[0] == 40);
    /* one token in common is not enough: 4 x | 9 4 -> nothing */
    const int32_t s4[] = {4, 50, 9, 4};
    CHECK(guess(&l, s4, 4, 1, 4, out) == 0);
    /* a prediction with no guess falls back to lookup */
    serve_draft both = {pred, 10, 0, true};
    CHECK(guess(&both, s3, 8, 2, 1, out) == 1 && out[0] == 40);
    /* ... and one with a guess is preferred: the answer's last token 11 is in it */
    const int32_t s5[] = {1, 2, 30, 1, 2, 40, 11};
    CHECK(guess(&both, s5, 7, 1, 2, out) == 2 && same(out, (int32_t[]){12, 13}, 2));
    return tu_report("test_serve_draft");
}
