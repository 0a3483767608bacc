/* Building blocks shared by the model families. */
#ifndef TS_MODEL_LAYERS_H
#define TS_MODEL_LAYERS_H

#include "model/model.h"

/* A run: consecutive tokens of one sequence with consecutive positions. */
typedef struct {
    int start, len, slot, pos0;
} ts_run;

/* Splits a batch into maximal runs, in batch order; runs has room for b->n_tokens entries. */
int ts_batch_runs(const ts_fwd_batch *b, ts_run *runs);

/* Logits rows for runs of a batch, at most `rows` tokens at a time: gathers the wanted rows of
 * x [n][D], applies the final norm and the output head (and a soft cap when cap > 0), and
 * downloads them to logits (host, n_vocab floats per wanted token). sel: scratch of n ints,
 * lh: [rows][D] scratch, lg: [rows][n_vocab] scratch. */
typedef struct {
    const float *final_norm; /* backend buffer, the effective weight */
    float eps;
    const ts_tensor *head;
    int n_embd, n_vocab, rows;
    float softcap;
} ts_output_head;

void ts_output_logits(ts_backend *be, const ts_output_head *oh, const ts_fwd_batch *b,
                      const float *x, int32_t *sel, float *lh, float *lg, float *logits);

/* Checks a weight's dtype is one the backends multiply with. */
ts_status ts_check_matmul_dtype(const ts_model *m, const char *name, const ts_tensor *t);

#endif
