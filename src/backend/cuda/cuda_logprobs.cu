/* Log-probabilities where the logits are, in the step's own submission
 * (ts_backend_ops.sample_logprobs). A request with `logprobs` wants, for each drawn token, its
 * log-probability and the top n (at most 20) alternatives': log softmax of the step's adjusted
 * logits. The general path runs the sampling kernels a second time with a top-k request for the
 * list, then reads the drawn token's logit - three submissions, three waits, and the top-k's
 * radix passes over the vocabulary (~42 us on an H200 for a random model's flat row). Here one
 * kernel after the draw reads the drawn id the draw left on the device and does it all:
 *
 *   each block takes LP_COLS logits of a row in registers (LP_VALS a thread) and writes a part:
 *   its largest logit, the sum of exp(l - that), and its k best as cuda_argmax_key (value, then
 *   the lower id: the host's order). A thread sorts its keys; a warp takes its k best in k
 *   rounds of two 32-bit reductions over the lanes' heads (keys are distinct: one lane wins and
 *   shifts its list); warp 0 then does the same over the warps' lists. The row's last block
 *   (a ticket) merges the parts the same way - a part's list a lane - and writes the answer,
 *   then a nonzero word the host's wait may end on (cq_wait_keys).
 *
 * Only rows whose draw ends on the device qualify (the drawn id must be there); others, and rows
 * over LP_MAX_PARTS * LP_COLS logits, take the general path (false, nothing queued). */
#include "backend/cuda/cuda_int.cuh"

#include <math.h>

#define LP_THREADS 256
#define LP_WARPS   (LP_THREADS / 32)
#define LP_VALS    8
#define LP_COLS    (LP_THREADS * LP_VALS)
#define LP_K       20 /* TS_MAX_TOP_LOGPROBS */
/* the merge gives each lane of each warp one part's list */
#define LP_MAX_PARTS (LP_WARPS * 32)

/* The parts (blocks) of a row of n_cols logits. */
static int lp_parts(int n_cols) { return (n_cols + LP_COLS - 1) / LP_COLS; }

/* A block's part of a row. */
typedef struct {
    unsigned long long key[LP_K]; /* best first; 0: none */
    double sum;                   /* of exp(l - max) over its candidates */
    float max;                    /* -inf: no candidate */
    int pad;
} lp_part;

/* A row's answer, where the host reads it. */
typedef struct {
    unsigned long long done; /* written last, nonzero */
    double total;            /* sum over the row of exp(l - max) */
    float chosen;            /* the drawn token's logit */
    int n;                   /* entries in the list */
    float logit[LP_K];
    int32_t tok[LP_K];
} lp_out;

/* a[] in descending order (a network: the indices are fixed, the keys stay in registers) */
template <int V> __device__ static inline void lp_sort(unsigned long long (&a)[V]) {
#pragma unroll
    for (int i = 0; i < V; i++)
#pragma unroll
        for (int j = 0; j + 1 < V - i; j++)
            if (a[j] < a[j + 1]) {
                unsigned long long t = a[j];
                a[j] = a[j + 1], a[j + 1] = t;
            }
}

/* The k best keys of a warp whose lanes each hold V keys in descending order: the j-th best in
 * lane j (0 in the other lanes, and where fewer than k keys are nonzero). The whole warp calls. */
template <int V>
__device__ static inline unsigned long long lp_warp_top(unsigned long long (&a)[V], int k) {
    const unsigned lane = threadIdx.x & 31;
    unsigned long long mine = 0;
    for (int r = 0; r < k; r++) {
        const unsigned long long h = a[0];
        const unsigned hi = (unsigned)(h >> 32);
        const unsigned mhi = __reduce_max_sync(0xffffffffu, hi);
        const unsigned mlo = __reduce_max_sync(0xffffffffu, hi == mhi ? (unsigned)h : 0u);
        const unsigned long long best = ((unsigned long long)mhi << 32) | mlo;
        if (best == 0) break; /* the same in every lane */
        if (lane == (unsigned)r) mine = best;
        if (h == best) { /* this lane's head was taken */
#pragma unroll
            for (int i = 0; i + 1 < V; i++)
                a[i] = a[i + 1];
            a[V - 1] = 0;
        }
    }
    return mine;
}

/* The k best of the block's warps' lists (w: lp_warp_top's answer in each warp), in warp 0's
 * lanes as lp_warp_top gives them. The whole block calls. */
__device__ static inline unsigned long long lp_block_top(unsigned long long w, int k,
                                                         unsigned long long (*s)[LP_K]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane < LP_K) s[warp][lane] = w;
    __syncthreads();
    unsigned long long best = 0;
    if (warp == 0) {
        unsigned long long b[LP_K];
#pragma unroll
        for (int i = 0; i < LP_K; i++)
            b[i] = lane < LP_WARPS ? s[lane][i] : 0ull;
        best = lp_warp_top<LP_K>(b, k);
    }
    __syncthreads(); /* s is free again */
    return best;
}

__device__ static inline float lp_block_max(float v, float *s) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = s[0];
#pragma unroll
    for (int i = 1; i < LP_WARPS; i++)
        m = fmaxf(m, s[i]);
    __syncthreads();
    return m;
}

__device__ static inline double lp_block_sum(double v, double *s) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = v;
    __syncthreads();
    double t = 0;
#pragma unroll
    for (int i = 0; i < LP_WARPS; i++)
        t += s[i];
    __syncthreads();
    return t;
}

/* grid (parts, rows): keys holds each row's drawn id (the draw before this kernel); out is
 * the host's staging memory (the wait ends on done) or device memory copied after. */
__global__ static void __launch_bounds__(LP_THREADS)
    k_lp(const float *x, int64_t ldx, int n_cols, int k, const unsigned long long *keys,
         lp_part *parts, unsigned *tickets, lp_out *out) {
    cuda_pdl_entry();
    __shared__ unsigned long long s_list[LP_WARPS][LP_K];
    __shared__ float s_f[LP_WARPS];
    __shared__ double s_d[LP_WARPS];
    const int row = blockIdx.y, nb = gridDim.x, lane = threadIdx.x & 31;
    const float *xr = x + (size_t)row * ldx;
    lp_part *rp = parts + (size_t)row * nb;
    float v[LP_VALS];
    unsigned long long a[LP_VALS];
    float tm = -INFINITY;
#pragma unroll
    for (int i = 0; i < LP_VALS; i++) {
        const int col = blockIdx.x * LP_COLS + i * LP_THREADS + threadIdx.x;
        const float l = col < n_cols ? xr[col] : -INFINITY;
        const bool cand = cuda_logit_candidate(l);
        v[i] = cand ? l : -INFINITY;
        a[i] = cand ? cuda_argmax_key(l, col) : 0ull;
        tm = fmaxf(tm, v[i]);
    }
    const float bm = lp_block_max(tm, s_f);
    float ts = 0.0f;
#pragma unroll
    for (int i = 0; i < LP_VALS; i++)
        if (v[i] != -INFINITY) ts += expf(v[i] - bm);
    const double bs = lp_block_sum((double)ts, s_d);
    lp_sort(a);
    unsigned long long best = lp_block_top(lp_warp_top(a, k), k, s_list);
    if (threadIdx.x < LP_K) rp[blockIdx.x].key[threadIdx.x] = best;
    if (threadIdx.x == 0) rp[blockIdx.x].max = bm, rp[blockIdx.x].sum = bs;
    __syncthreads();
    if (!cuda_last_block(&tickets[row])) return;

    /* the row's last block: every part is visible */
    float pm = -INFINITY;
    for (int b = threadIdx.x; b < nb; b += LP_THREADS)
        pm = fmaxf(pm, rp[b].max);
    const float M = lp_block_max(pm, s_f);
    double ps = 0;
    for (int b = threadIdx.x; b < nb; b += LP_THREADS)
        if (rp[b].max != -INFINITY) ps += rp[b].sum * exp((double)rp[b].max - (double)M);
    const double S = lp_block_sum(ps, s_d);
    unsigned long long c[LP_K];
    const int pb = (threadIdx.x >> 5) + LP_WARPS * lane; /* this lane's part */
#pragma unroll
    for (int i = 0; i < LP_K; i++)
        c[i] = pb < nb ? rp[pb].key[i] : 0ull;
    best = lp_block_top(lp_warp_top(c, k), k, s_list);
    lp_out *o = out + row;
    if (threadIdx.x < 32) {
        const bool has = best != 0;
        if (threadIdx.x < LP_K) {
            o->logit[threadIdx.x] = has ? cuda_argmax_key_value(best) : 0.0f;
            o->tok[threadIdx.x] = has ? cuda_argmax_key_index(best) : -1;
        }
        const unsigned m = __ballot_sync(0xffffffffu, has);
        if (threadIdx.x == 0) {
            const int id = cuda_argmax_key_index(keys[row]);
            o->n = __popc(m);
            o->chosen = id >= 0 && id < n_cols ? xr[id] : -INFINITY;
            o->total = M == -INFINITY ? 0.0 : S;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence_system(); /* the answer before the word that says it is there */
        *(volatile unsigned long long *)&o->done = 1;
    }
}

/* A row's answer as the engine takes it (nothing, where the step failed). */
static void lp_take(const lp_out *o, bool ok, ts_sample_res *lp, float *chosen) {
    lp->id = -1, lp->n = 0, lp->total = 0, *chosen = -INFINITY;
    if (!ok) return;
    lp->n = o->n < 0 ? 0 : o->n > LP_K ? LP_K : o->n;
    memcpy(lp->logit, o->logit, (size_t)lp->n * sizeof(float));
    memcpy(lp->tok, o->tok, (size_t)lp->n * sizeof(int32_t));
    lp->total = o->total, *chosen = o->chosen;
}

/* A held step's answers (d->src: staged, d->n rows) into d->dst (ts_sample_res) and d->aux
 * (the drawn logits) once the step has run (a cq_defer's done). */
static void lp_done(cuda_ctx *c, const cq_defer *d, bool ok) {
    (void)c;
    const lp_out *o = (const lp_out *)d->src;
    for (int r = 0; r < d->n; r++)
        lp_take(&o[r], ok, (ts_sample_res *)d->dst + r, (float *)d->aux + r);
}

/* Whether k_lp answers these rows' log-probability requests (plain top-k lists, k up to LP_K,
 * rows of at most LP_MAX_PARTS parts); the longest list in *k. */
static bool lp_fits(const cuda_ctx *c, const ts_sample_req *lp_req, int n_rows, int n_cols,
                    int *k) {
    if (!c->logprobs_one || n_cols <= 0 || lp_parts(n_cols) > LP_MAX_PARTS) return false;
    *k = 1;
    for (int r = 0; r < n_rows; r++) {
        const ts_sample_req &q = lp_req[r]; /* ts_sampler_logprob_request's */
        if (!(q.temperature == 1.0f && q.top_p >= 1.0f && q.min_p <= 0.0f && q.n_adjust <= 0 &&
              q.top_k >= 1 && q.top_k <= LP_K))
            return false;
        *k = q.top_k > *k ? q.top_k : *k;
    }
    return true;
}

bool cuda_logprobs_fit(const cuda_ctx *c, const ts_sample_req *lp_req, int n_cols) {
    int k;
    return lp_fits(c, lp_req, 1, n_cols, &k);
}

/* The parts (and without zero_copy the answers) live in the argmax's parts, which a draw uses
 * before k_lp runs: words of the parts, before the answers. */
static int64_t lp_part_words(int n_rows, int n_cols) {
    return (int64_t)lp_parts(n_cols) * n_rows * (int64_t)(sizeof(lp_part) / 8);
}

bool cuda_logprobs_ready(cuda_ctx *c, int n_rows, int n_cols) {
    return cuda_parts_ready(
        c, lp_part_words(n_rows, n_cols) + (int64_t)(n_rows * sizeof(lp_out) + 7) / 8, n_rows);
}

/* Queues k_lp after the draw whose ids are keys (device): the answers at the staging memory
 * returned, where the wait may end on them; null (nothing queued) where the staging arena is
 * full. The parts must be ready (cuda_logprobs_ready). */
static lp_out *lp_queue(cuda_ctx *c, const float *x, int64_t ldx, int n_rows, int n_cols, int k,
                        const unsigned long long *keys) {
    const size_t out_bytes = (size_t)n_rows * sizeof(lp_out);
    lp_out *st = (lp_out *)cq_stage(c, out_bytes);
    if (!st) return nullptr;
    const int nb = lp_parts(n_cols);
    lp_out *dout = (lp_out *)(c->argmax_parts + lp_part_words(n_rows, n_cols));
    cuda_launch(c, "logprobs", k_lp, dim3((unsigned)nb, (unsigned)n_rows), LP_THREADS, 0, x, ldx,
                n_cols, k, keys, (lp_part *)c->argmax_parts, c->argmax_tickets,
                c->zero_copy ? st : dout);
    if (c->zero_copy)
        for (int r = 0; r < n_rows; r++)
            cq_wait_keys(c, &st[r].done, 1);
    else
        cuda_copy_async(c, st, dout, out_bytes, cudaMemcpyDeviceToHost, "logprobs download");
    return st;
}

bool cuda_op_sample_logprobs(ts_backend *be, float *x, int64_t ldx, int n_rows, int n_cols,
                             const ts_sample_req *req, const ts_sample_req *lp_req,
                             ts_sample_res *res, ts_sample_res *lp, float *chosen) {
    cuda_ctx *c = cuda_of(be);
    if (n_rows <= 0) return true;
    int k;
    if (!lp_fits(c, lp_req, n_rows, n_cols, &k) || !cuda_sample_all_end(c, req, n_rows, n_cols))
        return false;
    /* the buffers first: each may flush the queue, which empties the staging arena */
    if (!cuda_logprobs_ready(c, n_rows, n_cols)) return false;
    unsigned long long *keys =
        (unsigned long long *)cuda_scratch(c, 2, (size_t)n_rows * sizeof *keys);
    if (!keys) return false;
    /* queued from here on: the call has to answer (a failure as sample reports one) */
    const unsigned long long *h = cuda_sample_queue_ids(c, x, ldx, n_rows, n_cols, req, keys);
    for (int r = 0; r < n_rows; r++)
        lp_take(nullptr, false, &lp[r], &chosen[r]);
    if (!h) {
        cuda_keys_drawn(h, n_rows, false, res);
        return true;
    }
    bool ids_taken = false;
    lp_out *st = lp_queue(c, x, ldx, n_rows, n_cols, k, keys);
    if (!st) { /* the staging arena is full: the draw runs now, its keys read before the next */
        cq_flush(c);
        cuda_keys_drawn(h, n_rows, !c->failed, res);
        ids_taken = true;
        st = lp_queue(c, x, ldx, n_rows, n_cols, k, keys);
        if (!st) {
            if (!cq_broken(c)) cuda_check(c, cudaErrorMemoryAllocation, "logprobs staging");
            return true;
        }
    }
    cq_flush(c);
    const bool ok = !c->failed;
    if (!ids_taken) cuda_keys_drawn(h, n_rows, ok, res);
    for (int r = 0; r < n_rows; r++)
        lp_take(&st[r], ok, &lp[r], &chosen[r]);
    return true;
}

bool cuda_logprobs_held(cuda_ctx *c, const float *x, int64_t ldx, int n_rows, int n_cols,
                        const ts_sample_req *lp_req, const unsigned long long *keys,
                        ts_sample_res *lp, float *chosen) {
    int k;
    if (!lp_fits(c, lp_req, n_rows, n_cols, &k)) return false;
    lp_out *st = lp_queue(c, x, ldx, n_rows, n_cols, k, keys);
    if (!st) { /* the staging arena is full: flushing empties it (and breaks a held step) */
        cq_flush(c);
        st = lp_queue(c, x, ldx, n_rows, n_cols, k, keys);
    }
    if (!st) {
        if (!cq_broken(c)) cuda_check(c, cudaErrorMemoryAllocation, "logprobs staging");
        return false;
    }
    cq_defer d = {lp_done, st, lp, n_rows, chosen};
    cq_defer_add(c, &d);
    return true;
}
