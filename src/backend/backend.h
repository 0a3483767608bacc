/* The backend op interface: what a model's forward pass is written against.
 *
 * A backend is a small vtable plus a context (ggml style). Models allocate activation and
 * state buffers through it and call its ops with those buffers; a model never dereferences an
 * activation buffer itself, so the same model code can run on the CPU or a GPU. All activations
 * are fp32, row-major; "ld" arguments are row strides in floats. Kernels never know which model
 * calls them.
 *
 * Sequence-mixing ops (attention, conv, gated delta) act on a *run*: consecutive tokens of one
 * sequence, positions pos0 .. pos0+n-1, with that sequence's state buffers. */
#ifndef TS_BACKEND_BACKEND_H
#define TS_BACKEND_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/tensor.h"

typedef struct ts_backend ts_backend;

/* Geometry of one Gated DeltaNet head group for ts_backend_ops.gdn. */
typedef struct {
    int n_k_heads; /* Hk: heads of q and k */
    int n_v_heads; /* Hv: heads of v, outputs and states; a multiple of Hk */
    int d_k, d_v;
} ts_gdn_dims;

/* Geometry of one attention run for ts_backend_ops.attention. */
typedef struct {
    int n_heads, n_kv_heads, head_dim;
    float scale;
    int window;    /* sliding window in keys (key j visible to query i iff i-window < j <= i;
                    * attention_full: iff |i - j| < window); 0 = none */
    float softcap; /* scores -> softcap * tanh(scores / softcap) when > 0 */
} ts_attn_dims;

/* The RMSNorm a matmul's input still needs (matmul_n, matmul_glu): rows x are read as
 * rmsnorm(x) * w over the weight's column count, so a backend can fold the norm into its
 * reading of x instead of a kernel of its own. scratch (rows of x's stride) is where it may write
 * the normed rows when it does not fold it. */
typedef struct {
    const float *w;
    float eps;
    float *scratch;
} ts_prenorm;

/* The delta rule's input preparation (gdn_prep, conv_gdn_prep): n tokens, Hk q and k heads of dk
 * values, gates of Hv heads from the gate projections a, b (rows of ldab); qn, kn, g, beta are
 * written (gdn_prep below says what they hold). */
typedef struct {
    int n, Hk, dk, Hv;
    float eps, q_scale;
    const float *a, *b;
    int64_t ldab;
    const float *neg_exp_a, *dt_bias;
    float *qn, *kn, *g, *beta;
} ts_gdn_prep_args;

/* The gated RMSNorm that follows the delta rule (gated_rmsnorm's z, w and eps), for gdn_runs to
 * apply to its output. */
typedef struct {
    const float *z, *w;
    float eps;
} ts_gated_norm;

/* One run of a batch for the *_runs ops: tokens [start, start + len) of the batch at positions
 * pos0 .. pos0 + len - 1 of one sequence, and that sequence's state buffers for the op (conv:
 * a = conv state; gdn: a = recurrent state; attention: a = K cache, b = V cache). rope_shift
 * (attention_step): the tokens' rotary positions are their positions plus it - the text after
 * an image in Qwen3.5's MRoPE, whose three positions are equal; 0 otherwise. */
typedef struct {
    int start, len, pos0, rope_shift;
    float *a, *b;
} ts_seq_run;

/* One row's sampling for ts_backend_ops.sample: the sampler's parameters (temperature 0 =
 * greedy), the uniform number in [0, 1) its generator gave for this draw, and the adjustments
 * to apply to the row's logits first (n_adjust entries of a host array; ts_logit_adjust).
 * list: the candidates are the answer (ts_sample_res's list, never a drawn id): a request for
 * the top_k best, such as log-probabilities' alternatives (ts_sampler_logprob_request). */
typedef struct {
    float temperature, top_p, min_p;
    int top_k;
    double u;
    int n_adjust;
    const ts_logit_adjust *adjust;
    int list;
} ts_sample_req;

/* What ts_backend_ops.sample gives back for a row: the drawn token (id >= 0), or (id < 0, only
 * with top-k or top-p, which need an order) a subset of the row's candidates that holds every
 * token those filters could keep - n logits with their token ids in logit[] and tok[] (host
 * arrays of n_cols entries, the caller's), in no particular order - and total, the sum over
 * the whole row of exp(l / T - max / T), for the caller to finish the draw with. */
typedef struct {
    int32_t id;
    int n;
    float *logit;
    int32_t *tok;
    double total;
} ts_sample_res;

/* An image's cut into patches for ts_backend_ops.vision_patches: the image's size in pixels,
 * the patch side, the merge side (patches go merge x merge block by block), the patch
 * embedding's time axis (temporal frames a patch) and the frames the bytes hold, one after
 * another: 1 for a still image, which fills every place of the time axis, else temporal (a
 * video's step; 0 is taken as 1). */
typedef struct {
    int width, height;
    int patch, merge, temporal;
    int frames;
} ts_patch_dims;

typedef struct {
    const char *name;
    /* Frees the backend and its context. */
    void (*destroy)(ts_backend *be);

    /* Buffers: zeroed on allocation. NULL on failure. */
    void *(*alloc)(ts_backend *be, size_t bytes);
    void (*free)(ts_backend *be, void *buf);
    /* Host <-> buffer copies (plain memcpy on the CPU). */
    void (*upload)(ts_backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(ts_backend *be, void *dst, const void *src, size_t bytes);
    void (*copy)(ts_backend *be, void *dst, const void *src, size_t bytes);
    void (*zero)(ts_backend *be, void *dst, size_t bytes);
    /* Optional (NULL where ops run as they come): runs everything queued and waits for it -
     * for a forward that asks for no output, whose work would otherwise wait in the queue
     * for the next call that needs a result. */
    void (*finish)(ts_backend *be);

    /* out[i, :] = W[ids[i], :] * scale */
    void (*get_rows)(ts_backend *be, const ts_tensor *W, const int32_t *ids, int n, float scale,
                     float *out);
    /* y[t, o] = sum_i W[o, i] x[t, i] */
    void (*matmul)(ts_backend *be, const ts_tensor *W, const float *x, int64_t ldx, int n,
                   float *y, int64_t ldy);
    /* out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w  for n_rows rows of dim values.
     * (Models fold "1 + w" norms into w at load.) out may equal x. */
    void (*rmsnorm)(ts_backend *be, const float *x, int64_t ldx, int n_rows, int dim,
                    const float *w, float eps, float *out, int64_t ldo);
    /* x[r, :] *= scale / sqrt(sum(x[r, :]^2) + eps) (L2 normalisation), in place. */
    void (*l2norm)(ts_backend *be, float *x, int64_t ldx, int n_rows, int dim, float eps,
                   float scale);
    /* Rotate-half RoPE on the first rot_dim dims of each head, in place. Token t's head h starts
     * at x + t*ldx + h*head_stride. Angle j = pos[t] * theta^(-2j/rot_dim). */
    void (*rope)(ts_backend *be, float *x, int64_t ldx, int n_tok, int n_heads,
                 int64_t head_stride, int rot_dim, const int32_t *pos, float theta);
    /* dst[i] += src[i] */
    void (*add)(ts_backend *be, float *dst, const float *src, int64_t n);
    /* out[t, i] = silu(gate[t, i]) * up[t, i] */
    void (*swiglu)(ts_backend *be, const float *gate, const float *up, int64_t ldg, int n_tok,
                   int dim, float *out, int64_t ldo);
    /* out[t, i] = gelu_tanh(gate[t, i]) * up[t, i] */
    void (*gelu_mul)(ts_backend *be, const float *gate, const float *up, int64_t ldg, int n_tok,
                     int dim, float *out, int64_t ldo);
    /* x[t, i] *= s[t] for i < dim, s a backend buffer of n_rows floats (LoRA's per-token
     * adapter scales) */
    void (*scale_rows)(ts_backend *be, float *x, int64_t ldx, int n_rows, int dim, const float *s);
    /* A LoRA pair's product, added: y[t, :] += s[t] * B (A x[t, :]) for n tokens, A [r, in] and
     * B [out, r] F32 weights (r a multiple of 16), s a backend buffer of n scales, u scratch of
     * n * r floats. False where the backend leaves it to matmul, scale_rows and matmul (then
     * nothing was done). NULL: always so. */
    bool (*lora_add)(ts_backend *be, const ts_tensor *A, const ts_tensor *B, const float *x,
                     int64_t ldx, int n, const float *s, float *y, int64_t ldy, float *u);
    /* x[i] = cap * tanh(x[i] / cap) (logit soft-capping) */
    void (*softcap)(ts_backend *be, float *x, int64_t n, float cap);
    /* x[t, h*hd + d] *= sigmoid(g[t, h*gstride + d]): the gated-attention output gate. */
    void (*sigmoid_gate)(ts_backend *be, float *x, int64_t ldx, const float *g, int64_t ldg,
                         int n_tok, int n_heads, int head_dim, int64_t gstride);
    /* out_host[r] = the index of the largest of x[r, 0..n_cols) (the first one on ties; NaN never
     * wins), for n_rows rows; synchronises like download. */
    void (*argmax)(ts_backend *be, const float *x, int64_t ldx, int n_rows, int n_cols,
                   int32_t *out_host);
    /* Optional (NULL: the caller downloads the logits and samples on the host). Samples the
     * next token of each of n_rows rows of logits where they lie, so that a decode step moves
     * a token id instead of a vocabulary of floats: temperature, min-p and the draw itself on
     * the device, top-k / top-p narrowed there to a small superset (ts_sample_res). A draw
     * reads the uniform u in vocabulary order exactly as ts_sampler_sample does, so both give
     * the same token up to float rounding at a boundary. The rows' adjustments are written
     * into x. Synchronises like download. */
    void (*sample)(ts_backend *be, float *x, int64_t ldx, int n_rows, int n_cols,
                   const ts_sample_req *req, ts_sample_res *res);
    /* Optional (NULL, or false with nothing queued - the caller then calls sample twice, the
     * second time with the log-probability requests, and downloads the drawn logits):
     * sample's draws and, from the same submission, each row's log-probability answer. In
     * lp[r] (id -1): a list in no particular order that holds the row's lp_req[r].top_k best
     * (logit, id) - top_k at most 20 - and total, the sum over the row of exp(l - max); in
     * chosen[r] the drawn token's logit. The rows' adjustments are written into x first, as
     * sample does. */
    bool (*sample_logprobs)(ts_backend *be, float *x, int64_t ldx, int n_rows, int n_cols,
                            const ts_sample_req *req, const ts_sample_req *lp_req,
                            ts_sample_res *res, ts_sample_res *lp, float *chosen);
    /* Optional, all nine or none (NULL where ops run as they come, as on the CPU): decoding
     * ahead. The engine queues step t + 1 of a greedy decode while step t runs - its tokens
     * the ids step t's argmax leaves on the device - and launches it once its caller has seen
     * step t's ids and asked for exactly that step; otherwise it drops it, and nothing of it
     * ran. The host's work between two steps then overlaps the device's.
     * step_can_hold: whether ops can be held at all (false: they would run as they come).
     * argmax_held: argmax queued only: the ids reach out_host when the step_wait after the
     * step's launch returns, and stay on the device for the next step's get_rows_fed.
     * sample_held: sample, queued the same way, for rows whose draw ends on the device
     * (sample_held_fits): their ids to out_host; false, with nothing queued, for other rows.
     * sample_held_fits: whether sample_held ends the draw of a row of n_cols with request r on
     * the device (the engine asks before it decodes such rows ahead); with lp (not NULL) the
     * row's log-probability request too: whether sample_held_logprobs answers both.
     * get_rows_fed: get_rows with ids[i] = row i of the ids that the last launched step's
     * argmax_held calls made (in call order); false, with nothing queued, where it cannot.
     * step_launch: submits what is queued without waiting; the ops queued after it are held
     * (nothing runs them but the next step_launch) until step_drop.
     * step_seal: the held ops are a whole step: get its launch ready now; false where they
     * cannot be held after all (the caller drops them).
     * step_wait: waits for the launched step; its argmax_held ids land.
     * step_drop: forgets the held ops and stops holding. */
    bool (*step_can_hold)(ts_backend *be);
    void (*argmax_held)(ts_backend *be, const float *x, int64_t ldx, int n_rows, int n_cols,
                        int32_t *out_host);
    bool (*sample_held)(ts_backend *be, float *x, int64_t ldx, int n_rows, int n_cols,
                        const ts_sample_req *req, int32_t *out_host);
    bool (*sample_held_fits)(ts_backend *be, const ts_sample_req *r, const ts_sample_req *lp,
                             int n_cols);
    bool (*get_rows_fed)(ts_backend *be, const ts_tensor *W, int n, float scale, float *out);
    void (*step_launch)(ts_backend *be);
    bool (*step_seal)(ts_backend *be);
    void (*step_wait)(ts_backend *be);
    void (*step_drop)(ts_backend *be);
    /* Optional (NULL: steps with log-probabilities are not decoded ahead): sample_held with
     * sample_logprobs' answers - lp[r] and chosen[r] filled when the step_wait after the step's
     * launch returns, as out_host is. False, with nothing queued, where sample_held_fits with
     * the log-probability request says no. */
    bool (*sample_held_logprobs)(ts_backend *be, float *x, int64_t ldx, int n_rows, int n_cols,
                                 const ts_sample_req *req, const ts_sample_req *lp_req,
                                 int32_t *out_host, ts_sample_res *lp, float *chosen);
    /* Optional (NULL: draws with logit adjustments are not decoded ahead): the held step's
     * draws given the adjustments of req (n_rows rows) - the lists as they are at its launch,
     * each grown by the token drawn since the step was held - in place of those it was queued
     * with. False where they do not fit what the held step has (adjustments where it was
     * queued without, more entries than it has room for): the caller drops it. */
    bool (*sample_held_adjust)(ts_backend *be, const ts_sample_req *req, int n_rows);
    /* Copies n rows of dim floats (row r of src at src + r*lds) to dst (row stride ldd). */
    void (*copy_rows)(ts_backend *be, float *dst, int64_t ldd, const float *src, int64_t lds,
                      int n, int dim);

    /* Causal attention for a run of n queries at positions pos0..pos0+n-1. The run's keys and
     * values must already be in the caches (row p = position p, n_kv_heads*head_dim floats).
     * q rows have ldq stride and head h at q + h*q_head_stride; out is [n][n_heads*head_dim]. */
    void (*attention)(ts_backend *be, const float *q, int64_t ldq, int64_t q_head_stride, int n,
                      int pos0, const float *k_cache, const float *v_cache,
                      const ts_attn_dims *dims, float *out, int64_t ldo);

    /* Depthwise causal conv over time + SiLU for a run of n tokens of C channels.
     * state holds the K-1 previous inputs [K-1][C] (zero at sequence start) and is updated.
     * w is [C][K], w[c][K-1] multiplies the current token. */
    void (*conv1d_silu)(ts_backend *be, const float *x, int64_t ldx, int n, int C, int K,
                        const float *w, float *state, float *out, int64_t ldo);

    /* Gated DeltaNet gates: beta = sigmoid(b), g = neg_exp_a[h] * softplus(a + dt_bias[h]),
     * n tokens of Hv heads each (a, b rows with lda/ldb stride, outputs [n][Hv]). */
    void (*gdn_gates)(ts_backend *be, const float *a, int64_t lda, const float *b, int64_t ldb,
                      int n, int Hv, const float *neg_exp_a, const float *dt_bias, float *g,
                      float *beta);
    /* The gated delta rule for a run of n tokens (q, k already L2-normalised and q scaled).
     * q, k: [n] rows of Hk*d_k (stride ldqk); v: rows of Hv*d_v (stride ldv); g, beta: [n][Hv];
     * state: [Hv][d_k][d_v] fp32, updated; out: [n][Hv*d_v]. chunked selects the chunked
     * (prefill) form; both forms compute the same thing. */
    void (*gdn)(ts_backend *be, const float *q, const float *k, int64_t ldqk, const float *v,
                int64_t ldv, const float *g, const float *beta, int n, const ts_gdn_dims *dims,
                float *state, float *out, bool chunked);
    /* Optional fusions (NULL: the model composes them from the ops above; see model/layers.h).
     * They exist because on a GPU every op is a kernel launch (on the CPU a hand-over of the
     * thread pool), and decode is hundreds of them.
     * matmul_n: y_j = W_j x for up to 4 weights of one column count sharing x (their dtypes
     * may differ: a Q4_K_M file keeps some of a stack in a wider type);
     * with pre (not NULL), x is read as rmsnorm(x) * pre->w (ts_prenorm).
     * matmul_add: y += W x (the residual add in the product's epilogue).
     * add_rmsnorm: x += h, then out = rmsnorm(x) * w (rows of dim, stride ld for all three).
     * norm_add_rmsnorm: x += rmsnorm(h) * wh, then out = rmsnorm(x) * w, or (w NULL) the add
     * alone: a post-norm block's output norm, residual add and next input norm (Gemma 3).
     * h is left as it was; out may be h.
     * l2norm_heads: dst[t, h, :] = l2norm(src[t*lds + h*dim ...]) * scale for n_heads heads of
     * dim values per token (a strided gather plus l2norm).
     * matmul_glu: out[t, o] = act((Wg x)[t, o]) * (Wu x)[t, o], act SiLU or (gelu) tanh-GELU:
     * a gated MLP's two projections and its activation in one. tg and tu (rows of ldt floats)
     * are scratch the backend may use for the two products; out may be tg. pre as matmul_n's.
     * gdn_prep: the delta rule's inputs from the conv output (rows of ldc: Hk q heads, then Hk
     * k heads of dk) and p's gate projections a, b (Hv each): p->qn = l2norm(q heads) * q_scale
     * and p->kn = l2norm(k heads) ([n][Hk*dk] each), and gdn_gates' g and beta.
     * qk_norm_rope: attention's per-head RMSNorm (weights wq / wk over hd values) and RoPE
     * (as the rope op, over rot_dim) of nq q heads (token t's head h at q + t*ldq +
     * h*q_head_stride) and nk k heads (at k + t*ldk + h*hd), in place. */
    void (*matmul_n)(ts_backend *be, const ts_tensor *const *W, int nw, const float *x,
                     int64_t ldx, int n, const ts_prenorm *pre, float *const *y,
                     const int64_t *ldy);
    void (*matmul_add)(ts_backend *be, const ts_tensor *W, const float *x, int64_t ldx, int n,
                       float *y, int64_t ldy);
    void (*add_rmsnorm)(ts_backend *be, float *x, const float *h, int n_rows, int dim, int64_t ld,
                        const float *w, float eps, float *out);
    void (*norm_add_rmsnorm)(ts_backend *be, float *x, const float *h, int n_rows, int dim,
                             int64_t ld, const float *wh, const float *w, float eps, float *out);
    void (*l2norm_heads)(ts_backend *be, const float *src, int64_t lds, int n_tok, int n_heads,
                         int dim, float eps, float scale, float *dst);
    void (*matmul_glu)(ts_backend *be, const ts_tensor *Wg, const ts_tensor *Wu, const float *x,
                       int64_t ldx, int n, const ts_prenorm *pre, bool gelu, float *tg,
                       float *tu, int64_t ldt, float *out, int64_t ldo);
    void (*gdn_prep)(ts_backend *be, const float *conv, int64_t ldc, const ts_gdn_prep_args *p);
    void (*qk_norm_rope)(ts_backend *be, float *q, int64_t ldq, int64_t q_head_stride, int nq,
                         const float *wq, float *k, int64_t ldk, int nk, const float *wk,
                         int n_tok, int hd, float eps, int rot_dim, const int32_t *pos,
                         float theta);
    /* Optional (NULL: the model calls the single-run op once per run): the same ops over all
     * runs of a batch at once, so that B sequences decoding together cost one launch, not B.
     * attention_runs also stores the runs' new K and V rows (k, v: [n_tokens][n_kv_heads *
     * head_dim]) into the caches at their positions first. gdn_runs with gn (not NULL) also
     * applies gated_rmsnorm to its output, in place; it takes one run too. */
    void (*conv1d_silu_runs)(ts_backend *be, const float *x, int64_t ldx, int C, int K,
                             const float *w, const ts_seq_run *runs, int nr, float *out,
                             int64_t ldo);
    void (*gdn_runs)(ts_backend *be, const float *q, const float *k, int64_t ldqk,
                     const float *v, int64_t ldv, const float *g, const float *beta,
                     const ts_gdn_dims *dims, const ts_seq_run *runs, int nr,
                     const ts_gated_norm *gn, float *out);
    void (*attention_runs)(ts_backend *be, const float *q, int64_t ldq, int64_t q_head_stride,
                           const float *k, const float *v, const ts_attn_dims *dims,
                           const ts_seq_run *runs, int nr, float *out, int64_t ldo);
    /* Optional: conv1d_silu_runs over x's C channels (the q heads, the k heads, then the v
     * channels), then gdn_prep (p) on its output. */
    void (*conv_gdn_prep)(ts_backend *be, const float *x, int64_t ldx, int C, int K,
                          const float *w, const ts_seq_run *runs, int nr, float *out,
                          int64_t ldo, const ts_gdn_prep_args *p);
    /* Optional: a decode step of a delta-rule layer after its input projection, in one call,
     * for nr runs of one token each (run r's token at row runs[r].start of x, C channels, and of
     * out; its conv state runs[r].a, its recurrent state runs[r].b): conv_gdn_prep (p's qn, kn,
     * g, beta are not written), then gdn_runs with gn into out. False, with nothing done, where
     * the backend does not take these shapes: the model then calls the two. */
    bool (*conv_gdn_step)(ts_backend *be, const float *x, int C, int K, const float *w,
                          const ts_seq_run *runs, int nr, const ts_gdn_prep_args *p,
                          const ts_gdn_dims *dims, const ts_gated_norm *gn, float *out);
    /* Optional: a one-token attention step after the projections, in one call, for nr runs of
     * one token each (run r's token at row runs[r].start of q (ldq), of k and v (n_kv_heads x
     * head_dim a row), of gate (ldq) and of out (ldo); its caches runs[r].a, .b, its position
     * runs[r].pos0): qk_norm_rope on the q row (heads q_head_stride apart; q itself is not
     * written) and the new k row (wq, wk, eps, rot_dim, theta as qk_norm_rope's, at position
     * pos0 + rope_shift; the row stored at pos0), the normed and
     * rotated k and the v row stored in the run's caches, attention_runs for the one query, then
     * out *= sigmoid(gate) where gate is not NULL (q's layout: head h's at h * q_head_stride).
     * False, with nothing done, where the backend does not take these shapes: the model then
     * calls the three. */
    bool (*attention_step)(ts_backend *be, const float *q, int64_t ldq, int64_t q_head_stride,
                           const float *wq, const float *k, const float *wk, const float *v,
                           float eps, int rot_dim, float theta, const ts_attn_dims *dims,
                           const ts_seq_run *runs, int nr, const float *gate, float *out,
                           int64_t ldo);
    /* out[t, h*dv + d] = rmsnorm(x[t, h*dv:...])[d] * w[d] * silu(z[t, h*dv + d]) */
    void (*gated_rmsnorm)(ts_backend *be, const float *x, const float *z, int n_tok, int n_heads,
                          int dv, const float *w, float eps, float *out);

    /* Optional, all six or none (NULL: the backend runs no vision tower and no multi-axis
     * rotary positions; the engine then refuses images): the ops of an image encoder and of
     * image positions in a decoder.
     * rope_cs: rotate-half rotary with the angles given per token - for token t, pair (j, j +
     * half) of each head rotated by cs[t][j] (cosine) and cs[t][half + j] (sine), j < half;
     * cs has 2 * half floats a token (the model computes them: two-axis or MRoPE angles).
     * layernorm: out[r, :] = (x[r, :] - mean) / sqrt(var + eps) * w + b (out may be x).
     * bias_act: x[r, i] = act(x[r, i] + bias[i]) (bias NULL: none), act TS_ACT_*.
     * attention_full: attention without the causal mask among n tokens (an image encoder's,
     * a text encoder's): every query sees every key, or with dims->window > 0 the keys within
     * window - 1 positions of it on either side; q, k, v rows of n_heads * head_dim (head h at
     * h * head_dim), q with stride ldq, k and v rows of n_kv_heads heads (a divisor of n_heads:
     * query head h reads kv head h / (n_heads / n_kv_heads)) with stride ldkv; out [n][n_heads
     * * head_dim]. A model with an encoder's attention needs this op even without images.
     * vision_patches: the rows of an image's patch embedding - patch n (vision_grid.h's order)
     * is, channel by channel and frame by frame (the still image repeated temporal times), its
     * patch x patch pixels row by row, byte b of channel c given as lut[c * 256 + b]; rgb is the
     * image's bytes on the device (height rows of width RGB pixels, both multiples of patch *
     * merge), out [n_patches][3 * temporal * patch * patch].
     * vision_positions: a learned table [side * side][dim] resampled to a grid_h x grid_w grid
     * (vision_grid.h's taps): patch n's row is the sum, from zero, of its four taps' rows times
     * their weights (row tap a, column tap b, in the order a then b), each product and sum
     * rounded to fp32 - out [grid_h * grid_w][dim]. */
    void (*rope_cs)(ts_backend *be, float *x, int64_t ldx, int n_tok, int n_heads,
                    int64_t head_stride, int half, const float *cs);
    void (*layernorm)(ts_backend *be, const float *x, int64_t ldx, int n_rows, int dim,
                      const float *w, const float *b, float eps, float *out, int64_t ldo);
    void (*bias_act)(ts_backend *be, float *x, int64_t ldx, int n_rows, int dim, const float *bias,
                     int act);
    void (*attention_full)(ts_backend *be, const float *q, int64_t ldq, const float *k,
                           const float *v, int64_t ldkv, int n, const ts_attn_dims *dims,
                           float *out, int64_t ldo);
    void (*vision_patches)(ts_backend *be, const uint8_t *rgb, const ts_patch_dims *d,
                           const float *lut, float *out);
    void (*vision_positions)(ts_backend *be, const float *table, int side, int dim, int grid_h,
                             int grid_w, int merge, float *out);
} ts_backend_ops;

/* bias_act's activations */
enum { TS_ACT_NONE, TS_ACT_GELU_TANH, TS_ACT_GELU_ERF };

struct ts_backend {
    const ts_backend_ops *ops;
    void *ctx;
};

/* The CPU backend. n_threads 0 = one per core; isa is a cpu_isa value or -1 for the best. */
ts_status ts_backend_cpu_create(int n_threads, int isa, ts_backend **out);
/* The name of the CPU kernel set in use ("scalar", "avx2", "avx512"); NULL if not a CPU backend. */
const char *ts_backend_cpu_isa_name(const ts_backend *be);
static inline void ts_backend_free(ts_backend *be) {
    if (be) be->ops->destroy(be);
}

#endif
