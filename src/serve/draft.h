/* Guessing the next tokens of an answer without the model (the drafts that speculative
 * decoding checks, serve/speculate.c): from the prediction a request brought (OpenAI's
 * Predicted Outputs), or by prompt lookup - the tokens that followed an earlier occurrence of
 * the sequence's last few tokens in the prompt or the answer (text that is copied: code being
 * edited, a document quoted, a summary's names). Pure functions, no model. */
#ifndef TS_SERVE_DRAFT_H
#define TS_SERVE_DRAFT_H

#include <stdbool.h>
#include <stdint.h>

/* The longest run of the sequence's last tokens looked for (then shorter ones). */
#define SERVE_DRAFT_NGRAM 4
/* The shortest for prompt lookup: one token repeats too often to say what comes next. */
#define SERVE_DRAFT_LOOKUP_MIN 2

typedef struct {
    const int32_t *pred; /* the prediction's tokens (NULL, 0: none) */
    int n_pred;
    int pred_at; /* where in pred the last guess from it started (kept between calls) */
    bool lookup; /* prompt lookup when the prediction has no guess */
} serve_draft;

/* Up to max tokens that may follow seq[0, n), whose last n_answer tokens are the answer so far,
 * into out; returns how many. From the prediction: what follows the longest run of the
 * answer's last tokens found in it (the first place at or after the last guess's, else the
 * last before it; an answer whose first token is the prediction's goes on from there). Then,
 * with lookup, what follows the most recent earlier occurrence in seq of its last tokens (at
 * least SERVE_DRAFT_LOOKUP_MIN). */
int serve_draft_guess(serve_draft *g, const int32_t *seq, int n, int n_answer, int max,
                      int32_t *out);

#endif
