/* The GEMMs of more than 64 tokens (prefill, wide batches) through cuBLASLt, with one algorithm
 * per bucket of token counts.
 *
 * cublasGemmEx picks an algorithm for every new shape: ~0.15 ms of host time for its heuristic,
 * and ~2.5-3 ms more the first time the kernel it picks runs in the process (an H200, CUDA 13;
 * with every module loaded eagerly as well). A prompt's last chunk has a new token count
 * whenever its length is new, so a server paid ~20 ms more time to first token for each prompt
 * length it had not seen (six weight shapes a layer kind, two calls each). Here the heuristic
 * is asked once per (types, shape, strides, alignments, accumulate, bucket), the bucket being
 * the next quarter of a doubling above the token count (lt_bucket), at the bucket's count; the
 * algorithm serves every count in the bucket, so a process meets at most a few kernels a weight
 * shape, all of which the server's warm-up runs. Where cuBLASLt refuses the cached algorithm for a
 * count, the heuristic is asked for that exact shape, and where that fails too, cublasGemmEx.
 * TESSERA_CUDA_GEMM_BUCKETS=0 asks for every token count (for comparisons). */
#include "backend/cuda/cuda_int.cuh"

#include <map>
#include <new>

typedef struct {
    int wt, xt, acc, bucket;
    int64_t rows, cols, ldx, ldy;
    int align_w, align_x, align_y;
} lt_key;

struct lt_key_less {
    bool operator()(const lt_key &a, const lt_key &b) const { return memcmp(&a, &b, sizeof a) < 0; }
};

struct cuda_lt_cache {
    std::map<lt_key, cublasLtMatmulAlgo_t, lt_key_less> algo;
    /* TESSERA_CUDA_GEMM_BUCKETS=0 (for comparisons): an algorithm for each token count */
    bool exact = cuda_env_off("TESSERA_CUDA_GEMM_BUCKETS");
};

/* The largest power of two, up to 256, that divides the address. */
static int lt_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 1 && a % (uintptr_t)al)
        al >>= 1;
    return al;
}

/* The bucket of n tokens (64 for up to 64): the least of 5p/4, 3p/2, 7p/4 and 2p, p = 64, 128,
 * 256, ..., that holds it - four a doubling, since the algorithm chosen for the next power of
 * two ran a 1500-token prompt's GEMMs ~9% slower than their own. */
static int lt_bucket(int n) {
    if (n <= 64) return 64;
    int p = 64;
    while (2 * p < n)
        p *= 2;
    for (int q = 1; q <= 4; q++)
        if (n <= p + q * (p / 4)) return p + q * (p / 4);
    return 2 * p;
}

/* The operation's descriptors for n tokens. */
typedef struct {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t w, x, y;
} lt_desc;

static bool lt_desc_make(lt_desc *d, cudaDataType wt, cudaDataType xt, int64_t rows, int64_t cols,
                         int64_t ldx, int n, int64_t ldy) {
    memset(d, 0, sizeof *d);
    const cublasOperation_t t = CUBLAS_OP_T;
    return cublasLtMatmulDescCreate(&d->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatrixLayoutCreate(&d->w, wt, (uint64_t)cols, (uint64_t)rows, cols) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatrixLayoutCreate(&d->x, xt, (uint64_t)cols, (uint64_t)n, ldx) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatrixLayoutCreate(&d->y, CUDA_R_32F, (uint64_t)rows, (uint64_t)n, ldy) ==
               CUBLAS_STATUS_SUCCESS;
}

static void lt_desc_free(lt_desc *d) {
    if (d->y) cublasLtMatrixLayoutDestroy(d->y);
    if (d->x) cublasLtMatrixLayoutDestroy(d->x);
    if (d->w) cublasLtMatrixLayoutDestroy(d->w);
    if (d->op) cublasLtMatmulDescDestroy(d->op);
}

/* The heuristic's first algorithm for the descriptors, with the pointers' alignments. */
static bool lt_heuristic(cuda_ctx *c, const lt_desc *d, const lt_key *k,
                         cublasLtMatmulAlgo_t *algo) {
    cublasLtMatmulPreference_t pref = NULL;
    if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return false;
    const size_t ws = CUDA_BLAS_WORKSPACE;
    const uint32_t aw = (uint32_t)k->align_w, ax = (uint32_t)k->align_x, ay = (uint32_t)k->align_y;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof ws);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw,
                                         sizeof aw);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ax,
                                         sizeof ax);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ay,
                                         sizeof ay);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ay,
                                         sizeof ay);
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(c->lt, d->op, d->w, d->x, d->y, d->y, pref, 1, &r, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found < 1) return false;
    *algo = r.algo;
    return true;
}

/* What cuda_gemm_lt stood in for: cuBLAS's own choice for the exact shape. */
static void gemm_ex(cuda_ctx *c, cudaStream_t s, const void *W, cudaDataType wt, int64_t rows,
                    int64_t cols, const void *x, cudaDataType xt, int64_t ldx, int n, float *y,
                    int64_t ldy, bool accumulate) {
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    if (!cuda_check_blas(c, cublasSetStream(c->blas, s), "gemm stream")) return;
    cuda_check_blas(c,
                    cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, n, (int)cols, &one,
                                 W, wt, (int)cols, x, xt, (int)ldx, &beta, y, CUDA_R_32F, (int)ldy,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                    "gemm");
}

void cuda_gemm_lt(cuda_ctx *c, cudaStream_t s, const void *W, cudaDataType wt, int64_t rows,
                  int64_t cols, const void *x, cudaDataType xt, int64_t ldx, int n, float *y,
                  int64_t ldy, bool accumulate) {
    if (!c->lt && cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS) c->lt = NULL;
    if (c->lt && !c->lt_cache) c->lt_cache = new (std::nothrow) cuda_lt_cache;
    if (!c->lt_cache) { /* no cuBLASLt: cuBLAS as before */
        gemm_ex(c, s, W, wt, rows, cols, x, xt, ldx, n, y, ldy, accumulate);
        return;
    }
    lt_key k;
    memset(&k, 0, sizeof k); /* compared as bytes: no stray padding */
    k.wt = (int)wt, k.xt = (int)xt, k.acc = accumulate, k.rows = rows, k.cols = cols;
    k.ldx = ldx, k.ldy = ldy;
    k.align_w = lt_align(W), k.align_x = lt_align(x), k.align_y = lt_align(y);
    k.bucket = c->lt_cache->exact ? n : lt_bucket(n);
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    lt_desc d;
    bool done = false;
    if (lt_desc_make(&d, wt, xt, rows, cols, ldx, n, ldy)) {
        auto it = c->lt_cache->algo.find(k);
        cublasLtMatmulAlgo_t algo;
        bool have = it != c->lt_cache->algo.end();
        if (have) {
            algo = it->second;
        } else { /* asked at the bucket's count, for every count in it */
            lt_desc db;
            have = lt_desc_make(&db, wt, xt, rows, cols, ldx, k.bucket, ldy) &&
                   lt_heuristic(c, &db, &k, &algo);
            lt_desc_free(&db);
            if (have) c->lt_cache->algo[k] = algo;
        }
        done = have &&
               cublasLtMatmul(c->lt, d.op, &one, W, d.w, x, d.x, &beta, y, d.y, y, d.y, &algo,
                              c->blas_workspace, CUDA_BLAS_WORKSPACE, s) == CUBLAS_STATUS_SUCCESS;
        if (!done && lt_heuristic(c, &d, &k, &algo)) /* this count's own algorithm */
            done =
                cublasLtMatmul(c->lt, d.op, &one, W, d.w, x, d.x, &beta, y, d.y, y, d.y, &algo,
                               c->blas_workspace, CUDA_BLAS_WORKSPACE, s) == CUBLAS_STATUS_SUCCESS;
    }
    lt_desc_free(&d);
    if (!done) gemm_ex(c, s, W, wt, rows, cols, x, xt, ldx, n, y, ldy, accumulate);
}

void cuda_gemm_lt_free(cuda_ctx *c) {
    delete c->lt_cache;
    c->lt_cache = NULL;
    if (c->lt) cublasLtDestroy(c->lt);
    c->lt = NULL;
}

extern "C" long ts_backend_cuda_lt_algos(const ts_backend *be) {
    const cuda_ctx *c = (const cuda_ctx *)be->ctx;
    return c->lt_cache ? (long)c->lt_cache->algo.size() : 0;
}
