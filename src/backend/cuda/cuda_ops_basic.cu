/* Row-wise and elementwise ops on the device: norms, RoPE, activations, copies, embedding lookup.
 * Each mirrors the CPU reference (backend/cpu/ops_basic.c) in fp32, with the same order of
 * operations per element; the norms sum squares in double as the CPU does. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_int.cuh"

extern "C" {
#include "backend/cpu/matmul.h"
}

/* o = rmsnorm(xr) * w over one row, by the whole block: one definition for the three norm
 * kernels below, so that they round alike. */
__device__ static inline void row_rmsnorm(const float *xr, int dim, const float *w, float eps,
                                          float *o) {
    double ss = row_sumsq(xr, dim);
    float inv = 1.0f / sqrtf((float)(ss / dim) + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = (xr[i] * inv) * w[i];
}

__global__ static void k_rmsnorm(const float *x, int64_t ldx, int dim, const float *w, float eps,
                                 float *out, int64_t ldo) {
    cuda_pdl_entry();
    row_rmsnorm(x + blockIdx.x * ldx, dim, w, eps, out + blockIdx.x * ldo);
}

void cuda_op_rmsnorm(ts_backend *be, const float *x, int64_t ldx, int n_rows, int dim,
                     const float *w, float eps, float *out, int64_t ldo) {
    cuda_ctx *c = cuda_of(be);
    if (n_rows <= 0) return;
    cuda_launch(c, "rmsnorm", k_rmsnorm, n_rows, ROW_THREADS, 0, x, ldx, dim, w, eps, out, ldo);
}

/* x += h, then out = rmsnorm(x) * w, a block per row: the two passes of the reference. */
__global__ static void k_add_rmsnorm(float *x, const float *h, int dim, int64_t ld, const float *w,
                                     float eps, float *out) {
    cuda_pdl_entry();
    float *xr = x + blockIdx.x * ld;
    const float *hr = h + blockIdx.x * ld;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) xr[i] += hr[i];
    __syncthreads(); /* out may be h: every add has read it */
    row_rmsnorm(xr, dim, w, eps, out + blockIdx.x * ld);
}

void cuda_op_add_rmsnorm(ts_backend *be, float *x, const float *h, int n_rows, int dim, int64_t ld,
                         const float *w, float eps, float *out) {
    cuda_ctx *c = cuda_of(be);
    if (n_rows <= 0) return;
    cuda_launch(c, "add_rmsnorm", k_add_rmsnorm, n_rows, ROW_THREADS, 0, x, h, dim, ld, w, eps, out);
}

/* x += rmsnorm(h) * wh, then out = rmsnorm(x) * w (w NULL: the add alone), a block per row: the
 * float operations of k_rmsnorm on h and then k_add_rmsnorm, so the same bits in one launch. */
__global__ static void k_norm_add_rmsnorm(float *x, const float *h, int dim, int64_t ld,
                                          const float *wh, const float *w, float eps,
                                          float *out) {
    cuda_pdl_entry();
    float *xr = x + blockIdx.x * ld;
    const float *hr = h + blockIdx.x * ld;
    double hs = row_sumsq(hr, dim);
    float hinv = 1.0f / sqrtf((float)(hs / dim) + eps);
    /* the normed h rounded before the add, as k_rmsnorm stores it (no fused multiply-add) */
    for (int i = threadIdx.x; i < dim; i += blockDim.x) xr[i] += __fmul_rn(hr[i] * hinv, wh[i]);
    if (!w) return;
    __syncthreads(); /* out may be h: every add has read it */
    row_rmsnorm(xr, dim, w, eps, out + blockIdx.x * ld);
}

void cuda_op_norm_add_rmsnorm(ts_backend *be, float *x, const float *h, int n_rows, int dim,
                              int64_t ld, const float *wh, const float *w, float eps, float *out) {
    cuda_ctx *c = cuda_of(be);
    if (n_rows <= 0) return;
    cuda_launch(c, "norm_add_rmsnorm", k_norm_add_rmsnorm, n_rows, ROW_THREADS, 0, x, h, dim, ld,
                wh, w, eps, out);
}

/* Row (t, h) of src (token stride lds, heads dim apart) to row t * n_heads + h of dst,
 * L2-normalised and scaled as k_l2norm does. */
__global__ static void k_l2norm_heads(const float *src, int64_t lds, int n_heads, int dim, float eps,
                                      float scale, float *dst) {
    cuda_pdl_entry();
    int t = blockIdx.x / n_heads, hh = blockIdx.x % n_heads;
    cuda_l2norm_row(src + t * lds + (int64_t)hh * dim, dim, eps, scale,
                    dst + (int64_t)blockIdx.x * dim);
}

void cuda_op_l2norm_heads(ts_backend *be, const float *src, int64_t lds, int n_tok, int n_heads,
                          int dim, float eps, float scale, float *dst) {
    cuda_ctx *c = cuda_of(be);
    if (n_tok <= 0 || n_heads <= 0) return;
    cuda_launch(c, "l2norm_heads", k_l2norm_heads, n_tok * n_heads, ROW_THREADS, 0, src, lds,
                n_heads, dim, eps, scale, dst);
}

__global__ static void k_l2norm(float *x, int64_t ldx, int dim, float eps, float scale) {
    cuda_pdl_entry();
    float *xr = x + blockIdx.x * ldx;
    cuda_l2norm_row(xr, dim, eps, scale, xr); /* in place: each thread rewrites what it read */
}

void cuda_op_l2norm(ts_backend *be, float *x, int64_t ldx, int n_rows, int dim, float eps,
                    float scale) {
    cuda_ctx *c = cuda_of(be);
    if (n_rows <= 0) return;
    cuda_launch(c, "l2norm", k_l2norm, n_rows, ROW_THREADS, 0, x, ldx, dim, eps, scale);
}

/* parts: where the values' bf16 split goes too (cuda_split_target), or NULL */
__global__ static void k_gated_rmsnorm(const float *x, const float *z, int dv, const float *w,
                                       float eps, float *out, void *parts) {
    cuda_pdl_entry();
    const float *xr = x + (int64_t)blockIdx.x * dv, *zr = z + (int64_t)blockIdx.x * dv;
    float *o = out + (int64_t)blockIdx.x * dv;
    double ss = row_sumsq(xr, dv);
    float inv = 1.0f / sqrtf((float)(ss / dv) + eps);
    for (int i = threadIdx.x; i < dv; i += blockDim.x) {
        float zi = zr[i];
        float v = w[i] * (xr[i] * inv) * (zi / (1.0f + expf(-zi)));
        o[i] = v;
        if (parts)
            split_bf16_store(parts, (int64_t)blockIdx.x * dv + i, (int64_t)gridDim.x * dv, v);
    }
}

void cuda_op_gated_rmsnorm(ts_backend *be, const float *x, const float *z, int n_tok,
                           int n_heads, int dv, const float *w, float eps, float *out) {
    cuda_ctx *c = cuda_of(be);
    int rows = n_tok * n_heads;
    if (rows <= 0) return;
    /* out's rows are the tokens' rows of n_heads * dv values: the out projection's x */
    int64_t cols = (int64_t)n_heads * dv;
    void *parts = cuda_split_target(c, n_tok, cols);
    cuda_launch(c, "gated_rmsnorm", k_gated_rmsnorm, rows, ROW_THREADS, 0, x, z, dv, w, eps, out,
                parts);
    cuda_split_made(c, out, cols, n_tok, cols, parts);
}

__global__ static void k_rope(float *x, int64_t ldx, int n_tok, int n_heads, int64_t head_stride,
                              int rot_dim, const int32_t *pos, float theta) {
    cuda_pdl_entry();
    int half = rot_dim / 2;
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)n_tok * n_heads * half) return;
    int j = (int)(idx % half);
    int h = (int)((idx / half) % n_heads);
    int t = (int)(idx / ((int64_t)half * n_heads));
    /* the angles as the reference computes them: fp32 inv_freq times an fp32 position */
    float *v = x + t * ldx + h * head_stride;
    cuda_rope_pair(v[j], v[j + half], pos[t], j, rot_dim, theta, &v[j], &v[j + half]);
}

void cuda_op_rope(ts_backend *be, float *x, int64_t ldx, int n_tok, int n_heads,
                  int64_t head_stride, int rot_dim, const int32_t *pos, float theta) {
    cuda_ctx *c = cuda_of(be);
    if (n_tok <= 0 || n_heads <= 0 || rot_dim < 2) return;
    const int32_t *pd = cuda_positions(c, pos, n_tok);
    if (!pd) return;
    int64_t total = (int64_t)n_tok * n_heads * (rot_dim / 2);
    cuda_launch(c, "rope", k_rope, cuda_blocks(total, EW_THREADS), EW_THREADS, 0, x, ldx, n_tok, n_heads, head_stride, rot_dim, pd, theta);
}

const int32_t *cuda_positions(cuda_ctx *c, const int32_t *pos, int n_tok) {
    /* Every rope call of one forward passes the same host positions: upload them only when
     * they change, so one copy serves the whole forward - and at the first use in each
     * submission, so that the copy is its first write there (cuda_upload_fresh). */
    if (n_tok != c->pos_n || memcmp(pos, c->pos_host, (size_t)n_tok * sizeof *pos) != 0 ||
        c->pos_epoch != cq_epoch(c)) {
        if (n_tok > c->pos_cap) {
            int cap = n_tok < 1024 ? 1024 : n_tok;
            int32_t *h = (int32_t *)realloc(c->pos_host, (size_t)cap * sizeof *h);
            if (!h) {
                cuda_check(c, cudaErrorMemoryAllocation, "rope positions");
                return NULL;
            }
            c->pos_host = h;
            cq_flush(c); /* queued ropes read the old buffer */
            cuda_free_dev(c, c->pos_dev);
            c->pos_dev = NULL;
            c->pos_cap = 0;
            if (!cuda_check(c, cudaMalloc(&c->pos_dev, (size_t)cap * sizeof(int32_t)),
                            "rope positions"))
                return NULL;
            c->pos_cap = cap;
        }
        memcpy(c->pos_host, pos, (size_t)n_tok * sizeof *pos);
        c->pos_n = n_tok;
        cuda_upload_fresh(c, c->pos_dev, pos, (size_t)n_tok * sizeof *pos, "rope positions");
        c->pos_epoch = cq_epoch(c);
    }
    return c->pos_dev;
}

__global__ static void k_add(float *dst, const float *src, int64_t n) {
    cuda_pdl_entry();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] += src[i];
}

void cuda_op_add(ts_backend *be, float *dst, const float *src, int64_t n) {
    cuda_ctx *c = cuda_of(be);
    if (n <= 0) return;
    cuda_launch(c, "add", k_add, cuda_blocks(n, EW_THREADS), EW_THREADS, 0, dst, src, n);
}

/* parts: where the values' bf16 split goes too (cuda_split_target), or NULL */
template <bool GELU>
__global__ static void k_glu(const float *gate, const float *up, int64_t ldg, int n_tok, int dim,
                             float *out, int64_t ldo, void *parts) {
    cuda_pdl_entry();
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)n_tok * dim) return;
    int64_t t = idx / dim, i = idx % dim;
    float v = cuda_glu<GELU>(gate[t * ldg + i], up[t * ldg + i]);
    out[t * ldo + i] = v;
    if (parts) split_bf16_store(parts, idx, (int64_t)n_tok * dim, v);
}

template <bool GELU>
static void glu(cuda_ctx *c, const char *what, const float *gate, const float *up, int64_t ldg,
                int n_tok, int dim, float *out, int64_t ldo) {
    int64_t total = (int64_t)n_tok * dim;
    if (total <= 0) return;
    void *parts = cuda_split_target(c, n_tok, dim);
    cuda_launch(c, what, k_glu<GELU>, cuda_blocks(total, EW_THREADS), EW_THREADS, 0, gate, up, ldg,
                n_tok, dim, out, ldo, parts);
    cuda_split_made(c, out, ldo, n_tok, dim, parts);
}

void cuda_op_swiglu(ts_backend *be, const float *gate, const float *up, int64_t ldg, int n_tok,
                    int dim, float *out, int64_t ldo) {
    glu<false>(cuda_of(be), "swiglu", gate, up, ldg, n_tok, dim, out, ldo);
}

void cuda_op_gelu_mul(ts_backend *be, const float *gate, const float *up, int64_t ldg, int n_tok,
                      int dim, float *out, int64_t ldo) {
    glu<true>(cuda_of(be), "gelu_mul", gate, up, ldg, n_tok, dim, out, ldo);
}

__global__ static void k_softcap(float *x, int64_t n, float cap) {
    cuda_pdl_entry();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

void cuda_op_softcap(ts_backend *be, float *x, int64_t n, float cap) {
    cuda_ctx *c = cuda_of(be);
    if (n <= 0) return;
    cuda_launch(c, "softcap", k_softcap, cuda_blocks(n, EW_THREADS), EW_THREADS, 0, x, n, cap);
}

__global__ static void k_scale_rows(float *x, int64_t ldx, int n_rows, int dim, const float *s) {
    cuda_pdl_entry();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n_rows * dim) return;
    int64_t r = i / dim, c = i % dim;
    x[r * ldx + c] *= s[r];
}

void cuda_op_scale_rows(ts_backend *be, float *x, int64_t ldx, int n_rows, int dim,
                        const float *s) {
    cuda_ctx *c = cuda_of(be);
    int64_t n = (int64_t)n_rows * dim;
    if (n <= 0) return;
    cuda_launch(c, "scale_rows", k_scale_rows, cuda_blocks(n, EW_THREADS), EW_THREADS, 0, x, ldx,
                n_rows, dim, s);
}

/* parts: where the values' bf16 split goes too (cuda_split_target), or NULL */
__global__ static void k_sigmoid_gate(float *x, int64_t ldx, const float *g, int64_t ldg, int n_tok,
                                      int n_heads, int head_dim, int64_t gstride, void *parts) {
    cuda_pdl_entry();
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, total;
    if (idx >= (total = (int64_t)n_tok * n_heads * head_dim)) return;
    int d = (int)(idx % head_dim);
    int h = (int)((idx / head_dim) % n_heads);
    int64_t t = idx / ((int64_t)head_dim * n_heads);
    float gv = g[t * ldg + h * gstride + d];
    float *xp = &x[t * ldx + (int64_t)h * head_dim + d];
    float v = *xp * (1.0f / (1.0f + expf(-gv)));
    *xp = v;
    if (parts) split_bf16_store(parts, idx, total, v);
}

void cuda_op_sigmoid_gate(ts_backend *be, float *x, int64_t ldx, const float *g, int64_t ldg,
                          int n_tok, int n_heads, int head_dim, int64_t gstride) {
    cuda_ctx *c = cuda_of(be);
    int64_t total = (int64_t)n_tok * n_heads * head_dim;
    if (total <= 0) return;
    int64_t cols = (int64_t)n_heads * head_dim; /* the output projection's x */
    void *parts = cuda_split_target(c, n_tok, cols);
    cuda_launch(c, "sigmoid_gate", k_sigmoid_gate, cuda_blocks(total, EW_THREADS), EW_THREADS, 0, x,
                ldx, g, ldg, n_tok, n_heads, head_dim, gstride, parts);
    cuda_split_made(c, x, ldx, n_tok, cols, parts);
}

__global__ static void k_copy_rows(float *dst, int64_t ldd, const float *src, int64_t lds,
                                   int n, int dim) {
    cuda_pdl_entry();
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)n * dim) return;
    int64_t r = idx / dim, i = idx % dim;
    dst[r * ldd + i] = src[r * lds + i];
}

void cuda_op_copy_rows(ts_backend *be, float *dst, int64_t ldd, const float *src, int64_t lds,
                       int n, int dim) {
    cuda_ctx *c = cuda_of(be);
    if (n <= 0 || dim <= 0) return;
    int64_t total = (int64_t)n * dim;
    cuda_launch(c, "copy_rows", k_copy_rows, cuda_blocks(total, EW_THREADS), EW_THREADS, 0, dst,
                ldd, src, lds, n, dim);
}

/* The lookup runs on the host (the CPU's dequantizer: every dtype, no device copy of the
 * embedding needed) into the pinned staging arena, then one copy; a replayed decode graph finds
 * the new token's row at the same staging address. */
void cuda_op_get_rows(ts_backend *be, const ts_tensor *W, const int32_t *ids, int n, float scale,
                      float *out) {
    cuda_ctx *c = cuda_of(be);
    if (n <= 0) return;
    int64_t cols = ts_tensor_cols(W);
    size_t bytes = (size_t)n * (size_t)cols * sizeof(float);
    float *staged = (float *)cq_stage(c, bytes);
    float *rows = staged ? (float *)cq_stage_fill(c, staged) : (float *)malloc(bytes);
    if (!rows) {
        cuda_check(c, cudaErrorMemoryAllocation, "get_rows staging");
        return;
    }
    for (int i = 0; i < n; i++) {
        float *o = rows + (size_t)i * cols;
        cpu_dequant_row(W, ids[i], o);
        if (scale != 1.0f)
            for (int64_t j = 0; j < cols; j++) o[j] *= scale;
    }
    if (staged) {
        cuda_copy_async(c, out, staged, bytes, cudaMemcpyHostToDevice, "get_rows upload");
    } else {
        cq_flush(c);
        cuda_upload_now(c, out, rows, bytes, "get_rows upload");
        free(rows);
    }
}

/* argmax over long rows (a vocabulary) with many blocks per row: each block reduces its chunk
 * to a 64-bit key (cuda_argmax_key; NaN is skipped), the row's last block merges them (k_argmax).
 * Before, the blocks merged into a zeroed key with atomicMax: a memset node before the kernel
 * and a copy node after it in the step's graph (bench/RESULTS.md). */
/* 4 values a thread (one 16-byte load): chunks of 8192 gave a 248k vocabulary 31 blocks and
 * took 16.3 us of a 1 ms decode step on an H200 (ncu), 243 blocks of 1024 take 4.3. Many rows
 * (batched decode) take chunks of up to 8 x 1024 so that the grid stays within about two waves:
 * 64 rows of 243 blocks of 1024 were 15 waves, 45 us of a step for 64 MB of logits; in chunks of
 * 7 x 1024 with 16-byte loads, 24 us. */
#define ARGMAX_CHUNK 1024

/* The block's largest of its threads' keys, in thread 0 (part: a key a warp, the block's
 * shared memory, free to reuse when the call returns) */
__device__ static inline unsigned long long argmax_block_max(unsigned long long best,
                                                             unsigned long long *part) {
    for (int off = 16; off > 0; off >>= 1)
        best = max(best, __shfl_xor_sync(0xffffffffu, best, off));
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = best;
    __syncthreads();
    if (threadIdx.x == 0)
        for (unsigned w = 1; w < (blockDim.x >> 5); w++)
            best = max(best, part[w]);
    __syncthreads(); /* part[] read before anyone writes it again */
    return best;
}

/* A block's maximum key over its chunk of row blockIdx.y, then the row's last block to finish
 * (a ticket a row, reset by that block) merges the blocks' maxima: no zeroing of the keys before
 * the kernel and no atomics on them, so the kernel follows the output head by a programmatic
 * edge. The maximum does not depend on which block or thread saw which value. */
__global__ static void k_argmax(const float *x, int64_t ldx, int n_cols, int chunk,
                                unsigned long long *parts, unsigned *tickets,
                                unsigned long long *keys, unsigned long long *host) {
    cuda_pdl_entry();
    __shared__ unsigned long long part[32];
    const float *row = x + blockIdx.y * ldx;
    int j0 = blockIdx.x * chunk, j1 = min(n_cols, j0 + chunk), js = j0;
    unsigned long long best = 0;
    /* 16-byte loads where the rows allow (chunk is a multiple of 4) */
    if (((ldx & 3) | ((uintptr_t)x & 15)) == 0) {
        js = j0 + ((j1 - j0) & ~3);
#pragma unroll 4
        for (int j = j0 + 4 * (int)threadIdx.x; j < js; j += 4 * (int)blockDim.x) {
            float4 v = *(const float4 *)(row + j);
            if (v.x == v.x) best = max(best, cuda_argmax_key(v.x, j));
            if (v.y == v.y) best = max(best, cuda_argmax_key(v.y, j + 1));
            if (v.z == v.z) best = max(best, cuda_argmax_key(v.z, j + 2));
            if (v.w == v.w) best = max(best, cuda_argmax_key(v.w, j + 3));
        }
    }
#pragma unroll 4
    for (int j = js + threadIdx.x; j < j1; j += blockDim.x) {
        float v = row[j];
        if (v == v) best = max(best, cuda_argmax_key(v, j));
    }
    best = argmax_block_max(best, part);
    unsigned long long *rp = parts + (size_t)blockIdx.y * gridDim.x;
    if (threadIdx.x == 0) rp[blockIdx.x] = best;
    if (!cuda_last_block(tickets + blockIdx.y)) return;
    best = 0;
    for (unsigned i = threadIdx.x; i < gridDim.x; i += blockDim.x)
        best = max(best, __ldcg(rp + i));
    best = argmax_block_max(best, part);
    if (threadIdx.x == 0) {
        keys[blockIdx.y] = best;
        if (host) host[blockIdx.y] = best;
    }
}

static dim3 argmax_grid(const cuda_ctx *c, int n_rows, int n_cols, int *chunk) {
    int64_t per_row = (n_cols + ARGMAX_CHUNK - 1) / ARGMAX_CHUNK;
    int64_t m = per_row * n_rows / ((int64_t)c->sm_count * 16); /* 8 blocks an SM, 2 waves */
    *chunk = ARGMAX_CHUNK * (int)(m < 1 ? 1 : m > 8 ? 8 : m);
    return dim3((unsigned)((n_cols + *chunk - 1) / *chunk), (unsigned)n_rows);
}

/* Room for n_words of parts and n_rows tickets, shared by the argmax and the sample op's plain
 * draw, which never run at once (one stream; each kernel's last blocks set the tickets back to
 * zero). Growing frees the old buffers, which queued kernels may use: it flushes first; the
 * tickets start at zero. */
bool cuda_parts_ready(cuda_ctx *c, int64_t n_words, int n_rows) {
    if (n_words <= c->argmax_cap && n_rows <= c->argmax_rows_cap) return true;
    cq_flush(c);
    cuda_free_dev(c, c->argmax_parts);
    cuda_free_dev(c, c->argmax_tickets);
    c->argmax_parts = NULL, c->argmax_tickets = NULL, c->argmax_cap = 0, c->argmax_rows_cap = 0;
    int64_t cap = n_words < 1024 ? 1024 : 2 * n_words;
    int rows = n_rows < 64 ? 64 : 2 * n_rows;
    if (!cuda_check(c,
                    cudaMalloc((void **)&c->argmax_parts, (size_t)cap * sizeof(unsigned long long)),
                    "argmax parts") ||
        !cuda_check(c, cudaMalloc((void **)&c->argmax_tickets, (size_t)rows * sizeof(unsigned)),
                    "argmax tickets") ||
        !cuda_check(
            c, cudaMemsetAsync(c->argmax_tickets, 0, (size_t)rows * sizeof(unsigned), c->stream),
            "argmax tickets") ||
        !cuda_check(c, cudaStreamSynchronize(c->stream), "argmax tickets"))
        return false;
    c->argmax_cap = cap, c->argmax_rows_cap = rows;
    return true;
}

bool cuda_argmax_ready(cuda_ctx *c, int n_rows, int n_cols) {
    int chunk;
    dim3 g = argmax_grid(c, n_rows, n_cols, &chunk);
    return cuda_parts_ready(c, (int64_t)g.x * n_rows, n_rows);
}

void cuda_keys_to_host(cuda_ctx *c, unsigned long long *keys, unsigned long long *host, int n) {
    if (c->zero_copy) /* the kernel writes them there: the wait may end when they have come */
        cq_wait_keys(c, host, n);
    else /* for comparisons: the keys' copy after the kernel, as before */
        cuda_copy_async(c, host, keys, (size_t)n * sizeof *keys, cudaMemcpyDeviceToHost,
                        "keys download");
}

bool cuda_argmax_keys(cuda_ctx *c, const float *x, int64_t ldx, int n_rows, int n_cols,
                      unsigned long long *keys, unsigned long long *host) {
    int chunk;
    dim3 grid = argmax_grid(c, n_rows, n_cols, &chunk);
    if ((int64_t)grid.x * n_rows > c->argmax_cap || n_rows > c->argmax_rows_cap) return false;
    cuda_launch(c, "argmax", k_argmax, grid, 256, 0, x, ldx, n_cols, chunk, c->argmax_parts,
                c->argmax_tickets, keys, c->zero_copy ? host : nullptr);
    cuda_keys_to_host(c, keys, host, n_rows);
    return true;
}

void cuda_op_argmax(ts_backend *be, const float *x, int64_t ldx, int n_rows, int n_cols,
                    int32_t *out_host) {
    cuda_ctx *c = cuda_of(be);
    if (n_rows <= 0) return;
    size_t bytes = (size_t)n_rows * sizeof(unsigned long long);
    if (!cuda_argmax_ready(c, n_rows, n_cols)) return; /* before the staging: it may flush */
    unsigned long long *d = (unsigned long long *)cuda_scratch(c, 2, bytes);
    unsigned long long *h = (unsigned long long *)cq_stage(c, bytes);
    if (!h) { /* the staging arena is full: run what is queued, which empties it */
        cq_flush(c);
        h = (unsigned long long *)cq_stage(c, bytes);
    }
    /* the keys come back through the pinned staging arena, inside a replayed graph too */
    bool ok = d && h && cuda_argmax_keys(c, x, ldx, n_rows, n_cols, d, h);
    cq_flush(c);
    cuda_argmax_ids(h, n_rows, ok && !c->failed, out_host);
}
