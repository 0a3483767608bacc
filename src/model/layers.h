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

/* How many tokens the output head handles at once for batches of up to n_batch tokens: each
 * pass reads the whole head matrix, so batched decode wants them all in one pass; 64 keeps the
 * [rows][n_vocab] scratch at tens of MB for the largest vocabularies. */
static inline int ts_logit_rows(int n_batch) {
    return n_batch < 1 ? 1 : n_batch < 64 ? n_batch : 64;
}

/* Logits rows for runs of a batch, at most `rows` tokens at a time: gathers the wanted rows of
 * x [n][D], applies the final norm and the output head (and a soft cap when cap > 0), and
 * downloads them to logits (host, n_vocab floats per wanted token) - or, when b->argmax is set,
 * only each row's argmax to b->argmax, or (b->sample) each row's draw by the backend's sampling
 * op to b->sample_res. sel: scratch of n ints, lh: [rows][D] scratch, lg:
 * [rows][n_vocab] scratch. */
typedef struct {
    const float *final_norm; /* backend buffer, the effective weight */
    float eps;
    const ts_tensor *head;
    int n_embd, n_vocab, rows;
    float softcap;
} ts_output_head;

void ts_output_logits(ts_backend *be, const ts_output_head *oh, const ts_fwd_batch *b,
                      const float *x, int32_t *sel, float *lh, float *lg, float *logits);

/* The batch's token embeddings, rows of W times scale, into out ([n][cols]): from b->tokens, or
 * with b->fed from the ids the backend holds (TS_ERR_UNSUPPORTED where it cannot). */
ts_status ts_embed(ts_backend *be, const ts_tensor *W, const ts_fwd_batch *b, float scale,
                   float *out);

/* The sequence ops over all runs of a batch: one call of the backend's *_runs op when it has
 * one, else the single-run op once per run (ts_seq_run in backend.h says which state is a, b).
 * ts_gdn_runs with gn applies the gated RMSNorm to its output (gated_rmsnorm after the runs
 * where the backend does not fold it in).
 * ts_attend_runs stores the runs' new K/V rows (k, v: [n][n_kv_heads * head_dim]) in their
 * caches, then attends. */
void ts_conv_runs(ts_backend *be, const float *x, int64_t ldx, int C, int K, const float *w,
                  const ts_seq_run *sr, int nr, float *out, int64_t ldo);
/* Runs of up to this many tokens take the delta rule token by token (the recurrent form),
 * longer ones the chunked form: a run of a few tokens - speculative decoding's guesses checked
 * in one step - then gives each token the bits single-token steps give it (the chunked form
 * sums in another order), and for so few tokens the two cost about the same on the CPU (the
 * 0.8B: bench/RESULTS.md). */
#define TS_GDN_RECURRENT_MAX 16
void ts_gdn_runs(ts_backend *be, const float *q, const float *k, int64_t ldqk, const float *v,
                 int64_t ldv, const float *g, const float *beta, const ts_gdn_dims *d,
                 const ts_seq_run *sr, int nr, const ts_gated_norm *gn, float *out);
void ts_attend_runs(ts_backend *be, const float *q, int64_t ldq, int64_t q_head_stride,
                    const float *k, const float *v, const ts_attn_dims *d, const ts_seq_run *sr,
                    int nr, float *out, int64_t ldo);

/* The fused ops of backend.h, or their composition where the backend has none. */
/* y_j = W_j x, or W_j (rmsnorm(x) * pre->w) with pre: where the backend cannot fold the norm
 * into its matmul, the normed rows go to pre->scratch first (the ops of the norm, then the
 * matmuls). */
void ts_matmul_n(ts_backend *be, const ts_tensor *const *W, int nw, const float *x, int64_t ldx,
                 int n, const ts_prenorm *pre, float *const *y, const int64_t *ldy);
/* y += W x: the backend's matmul_add, or the matmul into tmp (rows of ldy) and the add. */
void ts_matmul_add(ts_backend *be, const ts_tensor *W, const float *x, int64_t ldx, int n,
                   float *y, int64_t ldy, float *tmp);
/* x += rmsnorm(h) * wh, then out = rmsnorm(x) * w (w NULL: the add alone): the backend's
 * norm_add_rmsnorm, or rmsnorm in place on h and ts_add_rmsnorm. */
void ts_norm_add_rmsnorm(ts_backend *be, float *x, float *h, int n_rows, int dim, int64_t ld,
                         const float *wh, const float *w, float eps, float *out);
/* x += h, then out = rmsnorm(x) with weights w; w NULL: the add alone. */
void ts_add_rmsnorm(ts_backend *be, float *x, const float *h, int n_rows, int dim, int64_t ld,
                    const float *w, float eps, float *out);
/* out = act(tg) * tu over n rows of dim (act: SiLU, or tanh-GELU when gelu): the gated MLP's
 * activation once its two products are made. */
void ts_glu(ts_backend *be, bool gelu, const float *tg, const float *tu, int64_t ldt, int n,
            int dim, float *out, int64_t ldo);
/* out = act(Wg x) * (Wu x) (act: SiLU, or tanh-GELU when gelu; x normed first with pre, as
 * ts_matmul_n), tg/tu scratch for the two products (rows of ldt; out may be tg): the backend's
 * matmul_glu, or matmul_n + swiglu/gelu_mul. */
void ts_matmul_glu(ts_backend *be, const ts_tensor *Wg, const ts_tensor *Wu, const float *x,
                   int64_t ldx, int n, const ts_prenorm *pre, bool gelu, float *tg, float *tu,
                   int64_t ldt, float *out, int64_t ldo);
/* The backend's gdn_prep / qk_norm_rope (backend.h), or the ops they fuse. qk_norm_rope's
 * composition needs ldq == nq * q_head_stride and ldk == nk * hd (heads packed in rows). */
void ts_gdn_prep(ts_backend *be, const float *conv, int64_t ldc, const ts_gdn_prep_args *p);
/* The causal conv of the delta rule's q, k, v channels over all runs, then gdn_prep on its
 * output: the backend's conv_gdn_prep, or ts_conv_runs and ts_gdn_prep. */
void ts_conv_gdn_prep(ts_backend *be, const float *x, int64_t ldx, int C, int K, const float *w,
                      const ts_seq_run *sr, int nr, float *out, int64_t ldo,
                      const ts_gdn_prep_args *p);
/* A decode step of a layer in one call of the backend's; false where the batch is not such a
 * step, or the backend has no such op or does not take these shapes, and the caller composes
 * it.
 * ts_conv_gdn_step: the delta rule's, after the input projection, for nr runs of one token each
 * (run r's row runs[r].start of x and out; conv state sr[r].a, recurrent state sr[r].b) -
 * conv_gdn_step; else ts_conv_gdn_prep and ts_gdn_runs.
 * ts_attention_step: attention's, after the projections, for nr runs of one token each (run r's
 * row runs[r].start of q and gate (ldq), k, v and out (ldo); caches sr[r].a, .b; rotated at
 * sr[r].pos0 + sr[r].rope_shift) -
 * attention_step; else ts_qk_norm_rope, ts_attend_runs and sigmoid_gate. */
bool ts_conv_gdn_step(ts_backend *be, const float *x, int C, int K, const float *w,
                      const ts_seq_run *sr, int nr, const ts_gdn_prep_args *p, const ts_gdn_dims *d,
                      const ts_gated_norm *gn, float *out);
bool ts_attention_step(ts_backend *be, const float *q, int64_t ldq, int64_t q_head_stride,
                       const float *wq, const float *k, const float *wk, const float *v, float eps,
                       int rot_dim, float theta, const ts_attn_dims *d, const ts_seq_run *sr,
                       int nr, const float *gate, float *out, int64_t ldo);
void ts_qk_norm_rope(ts_backend *be, float *q, int64_t ldq, int64_t q_head_stride, int nq,
                     const float *wq, float *k, int64_t ldk, int nk, const float *wk, int n_tok,
                     int hd, float eps, int rot_dim, const int32_t *pos, float theta);
void ts_l2norm_heads(ts_backend *be, const float *src, int64_t lds, int n_tok, int n_heads,
                     int dim, float eps, float scale, float *dst);

/* Checks a weight's dtype is one the backends multiply with. */
ts_status ts_check_matmul_dtype(const ts_model *m, const char *name, const ts_tensor *t);

#endif
