/* Internals shared by the CPU backend's op files. */
#ifndef TS_BACKEND_CPU_INT_H
#define TS_BACKEND_CPU_INT_H

#include <math.h>

#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "base/threadpool.h"

typedef struct {
    ts_pool *pool;
    cpu_isa isa;
    cpu_wcache *wc; /* weights regrouped for the kernels that read them so */
} cpu_ctx;

static inline cpu_ctx *cpu_of(ts_backend *be) { return (cpu_ctx *)be->ctx; }

static inline float cpu_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float cpu_silu(float x) { return x / (1.0f + expf(-x)); }
/* softplus as torch computes it: x when x > 20, else log1p(exp(x)). */
static inline float cpu_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Sum of squares of x[0..n) in double (the reference sums in fp32, pairwise) for the norms, as
 * four interleaved partial sums: one chain of dependent double adds made the norms ~5% of a
 * Gemma 3 prefill. */
static inline double cpu_sum_squares(const float *x, int n) {
    double s[4] = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) s[k] += (double)x[i + k] * x[i + k];
    for (; i < n; i++) s[0] += (double)x[i] * x[i];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

/* fn(job, ith, nth) over the pool when there are at least min_rows rows, else on this thread:
 * below that, waking the pool costs more than the rows. */
static inline void cpu_run_rows(ts_backend *be, ts_pool_fn fn, void *job, long rows,
                                long min_rows) {
    if (rows >= min_rows)
        ts_pool_run(cpu_of(be)->pool, fn, job);
    else
        fn(job, 0, 1);
}

/* Largest head sizes the stack-buffered sequence kernels accept (checked at model load). */
#define CPU_MAX_HEAD_DIM 512
#define CPU_GDN_CHUNK 64

/* Op implementations, grouped by file. */
void cpu_op_get_rows(ts_backend *be, const ts_tensor *W, const int32_t *ids, int n, float scale,
                     float *out);
void cpu_op_matmul(ts_backend *be, const ts_tensor *W, const float *x, int64_t ldx, int n,
                   float *y, int64_t ldy);
void cpu_op_rmsnorm(ts_backend *be, const float *x, int64_t ldx, int n_rows, int dim,
                    const float *w, float eps, float *out, int64_t ldo);
void cpu_op_l2norm(ts_backend *be, float *x, int64_t ldx, int n_rows, int dim, float eps,
                   float scale);
void cpu_op_rope(ts_backend *be, float *x, int64_t ldx, int n_tok, int n_heads,
                 int64_t head_stride, int rot_dim, const int32_t *pos, float theta);
void cpu_op_add(ts_backend *be, float *dst, const float *src, int64_t n);
/* The fusions of backend.h the CPU has: a stack of projections, or a gated MLP's two and its
 * activation, as one job of the pool (cpu_matmul_n). */
void cpu_op_matmul_n(ts_backend *be, const ts_tensor *const *W, int nw, const float *x, int64_t ldx,
                     int n, const ts_prenorm *pre, float *const *y, const int64_t *ldy);
void cpu_op_matmul_glu(ts_backend *be, const ts_tensor *Wg, const ts_tensor *Wu, const float *x,
                       int64_t ldx, int n, const ts_prenorm *pre, bool gelu, float *tg, float *tu,
                       int64_t ldt, float *out, int64_t ldo);
void cpu_op_swiglu(ts_backend *be, const float *gate, const float *up, int64_t ldg, int n_tok,
                   int dim, float *out, int64_t ldo);
void cpu_op_gelu_mul(ts_backend *be, const float *gate, const float *up, int64_t ldg, int n_tok,
                     int dim, float *out, int64_t ldo);
void cpu_op_softcap(ts_backend *be, float *x, int64_t n, float cap);
void cpu_op_scale_rows(ts_backend *be, float *x, int64_t ldx, int n_rows, int dim, const float *s);
bool cpu_op_lora_add(ts_backend *be, const ts_tensor *A, const ts_tensor *B, const float *x,
                     int64_t ldx, int n, const float *s, float *y, int64_t ldy, float *u);
void cpu_op_sigmoid_gate(ts_backend *be, float *x, int64_t ldx, const float *g, int64_t ldg,
                         int n_tok, int n_heads, int head_dim, int64_t gstride);
void cpu_op_argmax(ts_backend *be, const float *x, int64_t ldx, int n_rows, int n_cols,
                   int32_t *out_host);
void cpu_op_copy_rows(ts_backend *be, float *dst, int64_t ldd, const float *src, int64_t lds,
                      int n, int dim);
void cpu_op_attention(ts_backend *be, const float *q, int64_t ldq, int64_t q_head_stride, int n,
                      int pos0, const float *k_cache, const float *v_cache,
                      const ts_attn_dims *dims, float *out, int64_t ldo);
void cpu_op_attention_full(ts_backend *be, const float *q, int64_t ldq, const float *k,
                           const float *v, int64_t ldkv, int n, const ts_attn_dims *dims,
                           float *out, int64_t ldo);
void cpu_op_rope_cs(ts_backend *be, float *x, int64_t ldx, int n_tok, int n_heads,
                    int64_t head_stride, int half, const float *cs);
void cpu_op_layernorm(ts_backend *be, const float *x, int64_t ldx, int n_rows, int dim,
                      const float *w, const float *b, float eps, float *out, int64_t ldo);
void cpu_op_bias_act(ts_backend *be, float *x, int64_t ldx, int n_rows, int dim, const float *bias,
                     int act);
void cpu_op_vision_patches(ts_backend *be, const uint8_t *rgb, const ts_patch_dims *d,
                           const float *lut, float *out);
void cpu_op_vision_positions(ts_backend *be, const float *table, int side, int dim, int grid_h,
                             int grid_w, int merge, float *out);
void cpu_op_conv1d_silu(ts_backend *be, const float *x, int64_t ldx, int n, int C, int K,
                        const float *w, float *state, float *out, int64_t ldo);
void cpu_op_gdn_gates(ts_backend *be, const float *a, int64_t lda, const float *b, int64_t ldb,
                      int n, int Hv, const float *neg_exp_a, const float *dt_bias, float *g,
                      float *beta);
void cpu_op_gdn(ts_backend *be, const float *q, const float *k, int64_t ldqk, const float *v,
                int64_t ldv, const float *g, const float *beta, int n, const ts_gdn_dims *dims,
                float *state, float *out, bool chunked);
void cpu_op_gated_rmsnorm(ts_backend *be, const float *x, const float *z, int n_tok,
                          int n_heads, int dv, const float *w, float eps, float *out);

#endif
