/* Internals shared by the CUDA backend's files: the context, error recording, launch helpers.
 *
 * The ops of the vtable return nothing, so a failing CUDA call is recorded in the context (the
 * first one wins) and printed once; download() reports it again and poisons the host copy with
 * NaN so a failure can never pass for a result. */
#ifndef TS_BACKEND_CUDA_CUDA_INT_CUH
#define TS_BACKEND_CUDA_CUDA_INT_CUH

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_block_trace.cuh"
#include "backend/cuda/cuda_queue.cuh"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The backend's structs that kernels take by value, packed field by field (cq_pack_fields), so
 * that no padding byte reaches the arguments: ts_gated_norm has 4 after eps (ts_seq_run has
 * none since rope_shift filled its hole; it stays listed). The sizes are checked so that a
 * field added later is not left out. */
static_assert(sizeof(ts_seq_run) == 32 && sizeof(ts_gated_norm) == 24, "cq_pack lists every field");
template <> inline void cq_pack<ts_seq_run>(cq_op *op, const ts_seq_run &v) {
    cq_pack_fields(op, v, &ts_seq_run::start, &ts_seq_run::len, &ts_seq_run::pos0,
                   &ts_seq_run::rope_shift, &ts_seq_run::a, &ts_seq_run::b);
}
template <> inline void cq_pack<ts_gated_norm>(cq_op *op, const ts_gated_norm &v) {
    cq_pack_fields(op, v, &ts_gated_norm::z, &ts_gated_norm::w, &ts_gated_norm::eps);
}

/* Whether two T's with the same fields (fill), one whose padding held 0xab bytes, pack into the
 * same argument bytes, and those the struct's own with zero padding - the layout the kernel
 * reads (ts_backend_cuda_args_pack_clean; the GEMV's norm: cuda_matmul.cu). */
template <typename T, typename F> static bool cuda_packs_clean(F fill) {
    T a, b;
    memset((void *)&a, 0xab, sizeof a);
    memset((void *)&b, 0, sizeof b);
    fill(a), fill(b);
    cq_op oa{}, ob{};
    cq_pack(&oa, a), cq_pack(&ob, b);
    unsigned char raw[CQ_ARG_BYTES] = {0};
    memcpy(raw, (const void *)&b, sizeof b);
    return memcmp(oa.args, ob.args, CQ_ARG_BYTES) == 0 && memcmp(ob.args, raw, CQ_ARG_BYTES) == 0;
}
bool cuda_gemv_norm_packs_clean(void);

struct cuda_weight_cache; /* the uploaded weights (cuda_weights.cu) */
struct cq_state;          /* the launch queue and its graphs (cuda_queue.cu) */

typedef struct cuda_ctx_s {
    int device;
    char name[256];
    /* read once at creation: multiprocessors, and the shared memory a block may opt in to */
    int sm_count, smem_optin;
    int cc; /* compute capability, major * 10 + minor */
    /* switches for comparisons, read once at creation (each =0 turns it off): GEMVs and the
     * tensor-core GEMM of quantized weights prefetch their rows into L2
     * (TESSERA_CUDA_PREFETCH), 9..64 tokens take the tensor-core GEMM (TESSERA_CUDA_SKINNY),
     * attention splits long key ranges (TESSERA_CUDA_ATTN_SPLIT), GEMVs fold their input's
     * RMSNorm in (TESSERA_CUDA_FOLD_NORM), prompts take the tiled attention kernel
     * (TESSERA_CUDA_ATTN_TILE) */
    bool prefetch, skinny, attn_split, fold_norm, attn_tile;
    /* runs at least this long take the chunked delta rule (TESSERA_CUDA_GDN_CHUNK_MIN, for
     * comparisons: a huge value keeps every run recurrent; default 32) */
    int gdn_chunk_min;
    /* one token's GEMV of 16-bit weights takes cuda_gemv_one.cu's kernel, its grid capped at
     * gemv_one_waves times the blocks the GPU holds at once (TESSERA_CUDA_GEMV1=waves, default
     * 1; 0: the general GEMV of cuda_matmul.cu) */
    int gemv_one_waves;
    /* and loads its first weights before the programmatic wait (TESSERA_CUDA_GEMV1_EARLY=0:
     * after it, for comparisons) */
    bool gemv_one_early;
    /* the single-token GEMV's x staged in each block's shared memory: 1 (default) where
     * g1_xs_takes says (cuda_gemv_one.cu), 0 never, 2 wherever the form can (16-bit weights, a
     * row a warp) (TESSERA_CUDA_GEMV1_XSMEM); quantized rows that go round stage x's int8 runs
     * where g1_x8_takes says (not with 0) */
    int gemv_one_xsmem;
    /* that kernel takes one token of quantized weights too (TESSERA_CUDA_GEMV1_KQUANT=0: the
     * general GEMV, for comparisons) */
    bool gemv_one_kquant;
    /* and up to this many tokens at once, each weight loaded once for all (1..G1_TOKENS,
     * default 3; quantized weights at most G1_QTOKENS; TESSERA_CUDA_GEMV1_TOKENS=1: one token
     * only, more take the general GEMV, for comparisons) */
    int gemv_one_tokens;
    long gemv_few_launches; /* its launches for more than one token (tests) */
    /* a stack of two quantized types in one launch (cuda_gemv_pair.cu; TESSERA_CUDA_GEMV1_PAIR=0:
     * two, for comparisons), and how many such launches were queued (tests) */
    bool gemv_one_pair;
    long gemv_pair_launches;
    /* and takes the quantized types by integer dot products against x quantized to int8 a
     * 16-element run: 1 (default) for GEMVs of many rows (G1_I8_ROWS), 2 for all, 0 never - the
     * float decode, whose sums are the general GEMV's bits (TESSERA_CUDA_GEMV1_INT8) */
    int gemv_one_int8;
    /* and takes Q6_K rows that go round (the output head) by half warps, 16 lanes a row, in that
     * form (cuda_gemv_one.cu's g1_try_half; TESSERA_CUDA_GEMV1_HALF=0: whole warps, for
     * comparisons) */
    bool gemv_one_half;
    long gemv_half_launches; /* its launches in that form (tests) */
    /* launches of quantized rows that go round with x's int8 runs staged in shared memory
     * (cuda_gemv_one.cu's g1_x8_takes; TESSERA_CUDA_GEMV1_XSMEM=0: never) (tests) */
    long gemv_x8_staged_launches;
    /* the tensor-core GEMM from this many tokens for every weight type (TESSERA_CUDA_SKINNY_MIN,
     * 2..9, for comparisons; 0: per type, cuda_matmul.cu's skinny_from) */
    int skinny_min;
    /* chunks of 32 columns a step of that GEMM: 2 (twice the weights in flight per
     * synchronisation) where the columns allow, TESSERA_CUDA_SKINNY_KC=1 for comparisons */
    int skinny_kc;
    /* where 16-bit weights take that GEMM's form with a ring of stages in shared memory:
     * 2 (default) for 17-32 tokens, where it measured faster on an H200 (32 sequences +4-5%;
     * 64 sequences -6%, 8 about -3%) but for the grids clusters of 8 leave short, which take
     * clusters of 16 (skinny_ks16); TESSERA_CUDA_SKINNY_RING=1 wherever the columns allow,
     * =0 never */
    int skinny_ring;
    /* blocks of half the rows where clusters of 8 leave the GPU short (TESSERA_CUDA_SKINNY_MT1=0:
     * never, for comparisons) */
    bool skinny_mt1;
    /* those 64-row blocks of 16-bit weights and 9-16 tokens through a ring of 8 stages
     * (TESSERA_CUDA_SKINNY_DEEP=0: the register kernel, for comparisons); the kernels allowed
     * their shared memory so far, a bit per weight type (BF16, F16) */
    bool skinny_deep;
    unsigned skinny_deep_opted;
    /* 64-row blocks of 17-64 tokens in clusters of 16 (non-portable: allowed per kernel, a bit
     * per weight type and token groups in skinny_ks16_opted) where clusters of 8 leave the GPU
     * short
     * (TESSERA_CUDA_SKINNY_KS16=0: clusters of 8, for comparisons) */
    bool skinny_ks16;
    unsigned skinny_ks16_opted;
    /* 9-64 tokens of 16-bit weights through wgmma fed by bulk tensor copies (cuda_gemm_wg.cu;
     * TESSERA_CUDA_SKINNY_WG=0: the mma.sync kernels, for comparisons), and its tensor maps
     * once it has run */
    bool skinny_wg;
    int wg_min; /* from this many tokens (TESSERA_CUDA_WG_MIN, 9..64) */
    struct cuda_wg_maps *wg_maps;
    long wg_launches;
    /* conv_gdn_prep's threads a block: 0 chooses by the sequences (cuda_ops_fused.cu);
     * TESSERA_CUDA_PREP_THREADS=128 or 256 fixes it, for comparisons */
    int prep_threads;
    /* conv_gdn_prep's runs a block: -1 (default) two where one would take more than a wave
     * (cuda_ops_fused.cu); TESSERA_CUDA_PREP_PAIRS=0 / 1: never / wherever there are two */
    int prep_pairs;
    /* quantized prefill above 64 tokens decodes the weights to bf16 for the tensor cores
     * (TESSERA_CUDA_QPREFILL_BF16=0: to fp32 for an exact fp32 GEMM) */
    bool qprefill_bf16;
    /* whether the tiled attention kernels may use their dynamic shared memory */
    bool attn_tile_opted;
    /* an image encoder's attention on the tensor cores (cuda_attn_tc.cu; TESSERA_CUDA_ATTN_TC=0:
     * the fp32 tiled kernel), and whether its shared memory was granted */
    bool attn_tc, attn_tc_opted;
    /* prompt attention on the tensor cores (cuda_attn_mma.cu; TESSERA_CUDA_ATTN_MMA=0: the
     * fp32 tiled kernel) */
    bool attn_mma;
    bool attn_mma_opted; /* whether its kernels' shared memory was allowed */
    /* ... and the tensor-core GEMM's ring kernels theirs */
    bool skinny_ring_opted;
    /* the recurrent delta rule's 128 x 128 heads through its kernel with a constant row stride
     * (TESSERA_CUDA_GDN_DV=0: the general one, for comparisons) */
    bool gdn_dv_const;
    /* one sequence's delta-rule decode step in one kernel from the input projection on: conv,
     * norms, gates, delta rule, gated norm (TESSERA_CUDA_GDN_STEP=0: conv_gdn_prep and the
     * delta rule apart, for comparisons) */
    bool gdn_step;
    /* ... which stores its state and shifts its conv state as soon as they are final, so that
     * the stores drain under its norm (TESSERA_CUDA_GDN_EARLY_STORE=0: at its end) */
    bool gdn_early_store;
    /* many sequences' step in one kernel too (cuda_gdn_step_runs.cu; TESSERA_CUDA_GDN_STEP_RUNS=0:
     * conv_gdn_prep, the delta rule and gated_rmsnorm apart, for comparisons) */
    bool gdn_step_runs;
    /* the most sequences whose attention step takes one kernel (attention_step with runs): 16,
     * above which the four kernels were faster on an H200 (TESSERA_CUDA_ATTN_STEP_RUNS=N; 0 or
     * 1: qk_norm_rope, kv_store, attention and sigmoid_gate apart for every batch) */
    int attn_step_runs;
    /* L2 set aside for the single-sequence delta-rule step's recurrent state (cuda_l2_keep):
     * the bytes wanted (0: never; TESSERA_CUDA_L2_KEEP=MB), whether the set-aside is in place
     * now, and the steps queued in the form that keeps the state there (tests) */
    size_t l2_keep_want;
    bool l2_keep_on;
    long gdn_keep_launches;
    /* one sequence's attention step in one kernel from the projections on: q / k norms and
     * rotation, the new row's store, attention, the output gate (TESSERA_CUDA_ATTN_STEP=0:
     * qk_norm_rope, attention_runs and sigmoid_gate apart, for comparisons) */
    bool attn_step;
    /* the dynamic shared memory the chunked delta rule's kernels are allowed so far */
    size_t gdnc_smem_opted;
    cudaStream_t stream;
    cublasHandle_t blas;
    /* cuBLASLt for the GEMMs of more than 64 tokens, with their algorithms cached a bucket of
     * token counts (cuda_gemm_lt.cu); made at the first such GEMM */
    cublasLtHandle_t lt;
    struct cuda_lt_cache *lt_cache;
    bool failed;
    /* growable device scratch: 0 converted activations and 1 weights for GEMM, 2 argmax keys,
     * 3 attention's partial softmaxes, 4 the chunked delta rule's per-chunk factors, 5 sampling,
     * 6 sampling's logit adjustments, 7 the prompt attention's bf16 operands */
    void *scratch[8];
    size_t scratch_bytes[8];
    struct cuda_weight_cache *weights;
    /* device buffers freed so far (cuda_free_dev): graphs compare it (cuda_queue.cu) */
    unsigned long frees;
    /* the positions last uploaded for rope: one forward's rope calls share one upload */
    int32_t *pos_dev, *pos_host;
    int pos_n, pos_cap;
    unsigned long pos_epoch; /* cq_epoch of that upload */
    /* the cache position of a single sequence's attention run (attention_runs with one run),
     * last uploaded: once a decode step, so that the attention kernels' arguments stay the same
     * from one step to the next and the step's graph replays without updates */
    int32_t *kv_pos_dev;
    int32_t kv_pos_host;
    unsigned long kv_pos_epoch; /* cq_epoch of that upload + 1; 0: none yet */
    const int32_t *kv_pos_at;   /* where the kernels read it: kv_pos_dev, or the staging arena */
    /* a decode step's few host bytes without copy nodes (TESSERA_CUDA_ZERO_COPY=0: copies, for
     * comparisons): the kernels read the single run's position from the pinned staging arena,
     * and the argmax's last block writes the keys there, instead of a copy at each end of the
     * step's graph (a root copy cost a 0.8B BF16 step ~10 us on an H200) */
    bool zero_copy;
    /* TESSERA_CUDA_SAMPLE_ONE=0 (for comparisons): plain draws go through the four sampling
     * kernels and the header's copy, as lists do, instead of k_smp_draw */
    bool sample_one;
    /* TESSERA_CUDA_SAMPLE_END=0 (for comparisons): top-k and top-p rows hand the host their
     * candidate list (and are not decoded ahead) instead of being drawn by k_smp_finish */
    bool sample_end;
    /* TESSERA_CUDA_LOGPROBS_ONE=0 (for comparisons): a step with log-probabilities is three
     * submissions (the draw, the list as a top-k request, the drawn logit) instead of one
     * (cuda_logprobs.cu) */
    bool logprobs_one;
    /* the argmax's per-block maxima and per-row tickets (zeroed; the last block of a row resets
     * its ticket): room for argmax_cap parts */
    unsigned long long *argmax_parts;
    unsigned *argmax_tickets;
    int64_t argmax_cap;
    int argmax_rows_cap;
    /* decoding ahead (cuda_ahead.cu): the argmax keys that argmax_held writes and the next
     * step's get_rows_fed reads (fed_cap rows), and the rows held so far in the step queued */
    unsigned long long *fed_keys;
    int fed_cap, fed_rows;
    /* draws with logit adjustments (penalties) decoded ahead (TESSERA_CUDA_HELD_ADJUST=0: not,
     * for comparisons) */
    bool held_adjust;
    /* The held step's adjustments (cuda_sample_adjust): where their entries (cap of them) and
     * their rows' headers lie in the host bytes its launch copies up, so that the engine can
     * give it the lists as they are at its launch (cuda_sample_held_adjust); on: false where
     * the held step has none */
    struct {
        bool on;
        void *entries, *rows;
        size_t cap;
        int n_rows, n_cols;
    } held_adj;
    struct cq_state *q;
    /* ops submitted so far (cq_submit, cuda_upload_now): what tells a fused split still fresh */
    unsigned long ops_submitted;
    /* The bf16 hi / lo split of an activation (x: n rows of cols values, row stride ldx) that
     * the op submitted as number op wrote into scratch slot 0 beside its fp32 values, for the
     * tensor-core GEMM that reads x next (cuda_split_target). TESSERA_CUDA_SPLIT_FUSED=0: never
     * written, every GEMM splits its x itself, for comparisons. */
    bool split_fused;
    struct {
        const float *x;
        int64_t ldx, cols;
        int n;
        const void *parts;
        unsigned long op;
    } split_made;
    void *blas_workspace; /* cuBLAS's own, so that it never allocates while being captured */
} cuda_ctx;

static inline cuda_ctx *cuda_of(ts_backend *be) { return (cuda_ctx *)be->ctx; }

/* Whether the environment variable name is set to "0" (a switch turned off). */
static inline bool cuda_env_off(const char *name) {
    const char *v = getenv(name);
    return v && strcmp(v, "0") == 0;
}

/* The first statement of every kernel: programmatic dependent launch (cuda_queue.cu links the
 * kernels of a graph with programmatic edges, so a kernel is launched while its predecessor
 * still runs). Wait until the predecessor has finished and its writes are visible - before
 * reading or writing anything, and before any early return, so that completion stays
 * transitive down the chain - then let the successor launch. Outside such a graph both are
 * no-ops. */
__device__ __forceinline__ void cuda_pdl_entry(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned long long t0;
    cuda_trace_wait_start(&t0); /* cuda_block_trace.cuh: nothing in a plain build */
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    cuda_trace_wait_end(t0);
#endif
}

/* Whether this block is the last of its row's gridDim.x blocks to arrive (*ticket counts them,
 * from zero; the last sets it back to zero for the next launch). Each thread 0 makes its block's
 * stores before the call visible first, so the last block sees every block's. The whole block
 * calls it (the argmax's and the plain draw's merge of their parts). */
__device__ __forceinline__ bool cuda_last_block(unsigned *ticket) {
    __shared__ bool last;
    if (threadIdx.x == 0) {
        __threadfence(); /* the block's parts before the ticket that counts them */
        last = atomicAdd(ticket, 1u) == gridDim.x - 1;
        if (last) *ticket = 0; /* every block has counted itself */
    }
    __syncthreads();
    if (last) __threadfence(); /* every part counted is visible */
    return last;
}

/* 16 bytes from global to shared memory without a trip through registers (cp.async): the loads
 * of a whole tile are in flight at once. valid false: the 16 bytes are zeroed, nothing is read
 * (gmem must still be a valid address). Commit a group, then wait until at most N groups are
 * pending; a __syncthreads() after the wait makes the tile visible to the whole block. */
__device__ static inline void cp_async16(void *smem, const void *gmem, bool valid) {
    unsigned d = (unsigned)__cvta_generic_to_shared(smem);
    int nb = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(gmem), "r"(nb));
}
/* 4 bytes the same way, for rows that are not 16-byte aligned (an element at a time). */
__device__ static inline void cp_async4(void *smem, const void *gmem, bool valid) {
    unsigned d = (unsigned)__cvta_generic_to_shared(smem);
    int nb = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(gmem), "r"(nb));
}
__device__ static inline void cp_async_commit(void) { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ static inline void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

/* Asks the L2 cache for the bytes [p, p + n): a hint that returns nothing, each lane of the
 * warp taking every 32nd 128-byte line. For data no kernel writes (weights) it may come before
 * cuda_pdl_entry(): the lines then stream in while the predecessor kernel still runs, and the
 * whole range is in flight at once instead of the few loads a lane keeps in registers. */
__device__ __forceinline__ void cuda_prefetch_l2(const void *p, size_t n, int lane) {
    uintptr_t b = (uintptr_t)p, e = b + n;
    for (uintptr_t a = (b & ~(uintptr_t)127) + 128 * (uintptr_t)lane; a < e; a += 32 * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a < b ? b : a));
}

/* The gated activations, one definition for the elementwise kernel and the fused GEMV so that
 * both give the same bits: act(g) * u, act SiLU or tanh-GELU. */
__device__ static inline float cuda_gelu_tanh(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}
template <bool GELU> __device__ static inline float cuda_glu(float g, float u) {
    float a = GELU ? cuda_gelu_tanh(g) : g / (1.0f + expf(-g));
    return a * u;
}

/* The sum of s over the 32 lanes of a warp, in every lane (a butterfly of shuffles). */
/* The 64-bit key of an argmax (k_argmax, the sampler's): ordered by the value (its float bits
 * mapped to an order-preserving unsigned) and then by the lower index, so atomicMax merges
 * blocks' bests. A key of 0 is "nothing seen" (NaN alone), read as index 0 as the CPU does. */
__device__ static inline unsigned long long cuda_argmax_key(float v, int i) {
    uint32_t b = __float_as_uint(v);
    uint32_t ord = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((unsigned long long)ord << 32) | (uint32_t)(0xffffffffu - (uint32_t)i);
}
__host__ __device__ static inline int cuda_argmax_key_index(unsigned long long k) {
    return k ? (int)(0xffffffffu - (uint32_t)(k & 0xffffffffu)) : 0;
}
/* The value of a cuda_argmax_key. */
__device__ static inline float cuda_argmax_key_value(unsigned long long k) {
    uint32_t ord = (uint32_t)(k >> 32);
    return __uint_as_float((ord & 0x80000000u) ? (ord & 0x7fffffffu) : ~ord);
}

/* Whether a logit can be drawn at all (NaN and -inf have no probability): the sampler's and
 * the log-probabilities' kernels. */
__device__ static inline bool cuda_logit_candidate(float l) { return !(l != l || l == -INFINITY); }

/* n keys that came back to the host, as token ids (-1, never a token, where the step failed). */
static inline void cuda_argmax_ids(const unsigned long long *keys, int n, bool ok, int32_t *ids) {
    for (int r = 0; r < n; r++)
        ids[r] = ok ? cuda_argmax_key_index(keys[r]) : -1;
}
/* The same as draws that ended on the device: res[r].id, no list (id -1 and no list: failed). */
static inline void cuda_keys_drawn(const unsigned long long *keys, int n, bool ok,
                                   ts_sample_res *res) {
    for (int r = 0; r < n; r++)
        res[r].id = ok ? cuda_argmax_key_index(keys[r]) : -1, res[r].n = 0, res[r].total = 0;
}

/* A held step's keys (d->src: staged, d->n of them) to ids at d->dst once the step has run
 * (a cq_defer's done). */
static inline void cuda_keys_done(struct cuda_ctx_s *c, const cq_defer *d, bool ok) {
    (void)c;
    cuda_argmax_ids((const unsigned long long *)d->src, d->n, ok, (int32_t *)d->dst);
}

/* A key that cuda_argmax_key_index reads as token id (a drawn token, for get_rows_fed). */
__host__ __device__ static inline unsigned long long cuda_id_key(int id) {
    return (1ull << 32) | (uint32_t)(0xffffffffu - (uint32_t)id);
}

/* The sum of s over each group of L neighbouring lanes (L a power of two up to 32), every lane
 * of the group getting it (a butterfly: offsets L / 2, ..., 1); the whole warp calls it. */
template <int L> __device__ static inline float cuda_lanes_sum(float s) {
#pragma unroll
    for (int off = L / 2; off > 0; off >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, off);
    return s;
}

__device__ static inline float cuda_warp_sum(float s) { return cuda_lanes_sum<32>(s); }

/* Row kernels run a block of ROW_THREADS per row. Sum of squares of a row in double, reduced
 * over the block; every thread gets the total. */
#define ROW_THREADS 256
/* Elementwise kernels run blocks of EW_THREADS, a thread an element. */
#define EW_THREADS 256
/* The block's sums of its threads' partial sums s[j] for N rows at once (s[j] becomes row j's),
 * each in a fixed order (warps' shuffles, then the warps in turn), in one pair of barriers:
 * row_sumsq's second half, for kernels that hold their rows' values in registers. */
template <int N> __device__ static inline void row_sum_blocks(double *s) {
    __shared__ double part[N][ROW_THREADS / 32];
    __shared__ double total[N];
#pragma unroll
    for (int j = 0; j < N; j++) {
        for (int o = 16; o > 0; o >>= 1)
            s[j] += __shfl_xor_sync(0xffffffffu, s[j], o);
        if ((threadIdx.x & 31) == 0) part[j][threadIdx.x >> 5] = s[j];
    }
    __syncthreads();
    if (threadIdx.x < N) {
        double t = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++)
            t += part[threadIdx.x][w];
        total[threadIdx.x] = t;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < N; j++)
        s[j] = total[j];
}
__device__ static inline double row_sum_block(double s) {
    row_sum_blocks<1>(&s);
    return s;
}
__device__ static inline double row_sumsq(const float *x, int dim) {
    double s = 0.0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        s += (double)x[i] * x[i];
    return row_sum_block(s);
}

/* dst = x / |x| * scale for one row of dim values, by the whole block (l2norm_heads). */
__device__ static inline void cuda_l2norm_row(const float *x, int dim, float eps, float scale,
                                              float *dst) {
    double ss = row_sumsq(x, dim);
    float inv = 1.0f / sqrtf((float)ss + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = (x[i] * inv) * scale;
}

/* Rotate-half RoPE of the pair (x0, x1) = dims (j, j + rot_dim / 2) at position pos, the angle
 * as the reference computes it: fp32 inv_freq times an fp32 position. */
__device__ static inline void cuda_rope_pair(float x0, float x1, int32_t pos, int j, int rot_dim,
                                             float theta, float *y0, float *y1) {
    float inv_freq = (float)(1.0 / pow((double)theta, (double)(2 * j) / rot_dim));
    float a = (float)pos * inv_freq;
    float cs = cosf(a), sn = sinf(a);
    *y0 = x0 * cs - x1 * sn;
    *y1 = x1 * cs + x0 * sn;
}

/* Gated DeltaNet gates of one head and token: beta = sigmoid(b), g = neg_exp_a *
 * softplus(a + dt_bias), softplus as torch computes it. */
__device__ static inline void cuda_gdn_gate(float a, float b, float neg_exp_a, float dt_bias,
                                            float *g, float *beta) {
    *beta = 1.0f / (1.0f + expf(-b));
    float x = a + dt_bias;
    float sp = x > 20.0f ? x : log1pf(expf(x));
    *g = neg_exp_a * sp;
}

/* Records the first failure and returns false when err is not cudaSuccess. */
bool cuda_check(cuda_ctx *c, cudaError_t err, const char *what);
/* Allows each of the n kernels bytes of dynamic shared memory (beyond the default 48 KB); false,
 * with the refusal cleared and nothing recorded as failed, where the device cannot: the caller
 * then takes a kernel that needs less. */
bool cuda_allow_smem(const cuda_ctx *c, const void *const *kernels, int n, int bytes);
bool cuda_check_blas(cuda_ctx *c, cublasStatus_t st, const char *what);
/* cuBLAS's workspace (c->blas_workspace), which cuBLASLt's GEMMs share */
#define CUDA_BLAS_WORKSPACE ((size_t)32 << 20)
/* cuda_gemm_lt.cu: Y^T (rows x n, ld ldy; += with accumulate) = W (cols x rows, ld cols)^T *
 * X^T (cols x n, ld ldx) in fp32 on stream s, through cuBLASLt with the algorithm its heuristic
 * gave for n's bucket (four a doubling of the token count) - cuBLAS's heuristic and a kernel's
 * first use cost ~0.15-3 ms of host time for each new shape, so a prompt of a length not seen
 * before paid ~20 ms more for its first token; and the cache freed */
void cuda_gemm_lt(cuda_ctx *c, cudaStream_t s, const void *W, cudaDataType wt, int64_t rows,
                  int64_t cols, const void *x, cudaDataType xt, int64_t ldx, int n, float *y,
                  int64_t ldy, bool accumulate);
void cuda_gemm_lt_free(cuda_ctx *c);
/* cudaFree, counted in c->frees. */
void cuda_free_dev(cuda_ctx *c, void *p);
/* A device scratch buffer of at least bytes (slot 0 .. 7), grown as needed; NULL on failure.
 * Contents are not kept across calls. */
void *cuda_scratch(cuda_ctx *c, int slot, size_t bytes);
/* The same where the caller has another way: NULL without the backend's failure when the
 * device has not the memory. */
void *cuda_scratch_try(cuda_ctx *c, int slot, size_t bytes);
/* Where an op about to write n rows of cols fp32 values may also write their bf16 split for the
 * matmul that reads them next (split_bf16_store's layout, in scratch slot 0), saving that
 * matmul's own split kernel: NULL where the tensor-core GEMM would not take n tokens. After the
 * op's launch, cuda_split_made(c, x, ldx, n, cols, parts) tells the matmul (cuda_matmul.cu). */
void *cuda_split_target(cuda_ctx *c, int n, int64_t cols);
void cuda_split_made(cuda_ctx *c, const float *x, int64_t ldx, int n, int64_t cols,
                     const void *parts);

/* Element idx of an activation split in two bf16 parts, hi = round(v) and lo = round(v - hi):
 * hi at idx, lo at idx + lo_off (the lo rows follow the hi rows). */
__device__ static inline void split_bf16_store(void *parts, int64_t idx, int64_t lo_off, float v) {
    __nv_bfloat16 h = __float2bfloat16_rn(v);
    ((__nv_bfloat16 *)parts)[idx] = h;
    ((__nv_bfloat16 *)parts)[idx + lo_off] = __float2bfloat16_rn(v - __bfloat162float(h));
}

/* The device copy of a weight tensor, uploaded on first use. Float types keep their dtype;
 * Q8_0 stays Q8_0; other quantized types are dequantized to F32 at upload. NULL on failure. */
typedef struct {
    ts_dtype dtype; /* dtype of the device copy */
    const void *data;
    int64_t rows, cols;
} cuda_wview;
bool cuda_weight(cuda_ctx *c, const ts_tensor *W, cuda_wview *out);
void cuda_weights_free(cuda_ctx *c);
/* Whether W is on the device already, and the device bytes its upload takes. */
bool cuda_weight_resident(cuda_ctx *c, const ts_tensor *W);
size_t cuda_weight_bytes(const ts_tensor *W);

/* Q6_K on the device: the file's 210-byte blocks (ql 128 bytes, qh 64, scales 16, d 2) leave
 * every odd block only 2-byte aligned, so a lane's codes took sixteen 2-byte loads where two
 * 16-byte ones would do. The upload (cuda_weights.cu) regroups each row: groups of up to 8
 * blocks, each the blocks' d values (16 bytes, 2 each) and then the blocks without their d (208
 * bytes each, 16-byte aligned). A row of 1024 columns is 848 bytes instead of 840. */
#define Q6K_DEV_BLOCK 208
#define Q6K_DEV_GROUP (16 + 8 * Q6K_DEV_BLOCK)
/* where block b's ql, qh and scales start in its row, and where its d lies */
__host__ __device__ static inline int64_t q6k_dev_block(int64_t b) {
    return (b >> 3) * Q6K_DEV_GROUP + 16 + (b & 7) * Q6K_DEV_BLOCK;
}
__host__ __device__ static inline int64_t q6k_dev_d(int64_t b) {
    return (b >> 3) * Q6K_DEV_GROUP + 2 * (b & 7);
}

/* Q8_0, Q4_0 and Q5_0 (blocks of 32 elements: d, then Q5_0's 4 qh bytes, then the codes: 34, 18
 * and 22 bytes, so that in the file's rows most blocks' codes are only 2-byte aligned) on the
 * device: the same regrouping, in groups of 8 blocks - the group's 8 d values (16 bytes), then
 * (Q5_0) its 8 qh words, then its 8 blocks' codes, each 16-byte aligned. A group is as long as
 * its 8 blocks in the file; a row's last, partial group keeps a whole group's offsets (unused d
 * and qh slots zero). q32_*: where block b's parts lie in its row. */
__host__ __device__ static inline bool q32_type(ts_dtype dt) {
    return dt == TS_DTYPE_Q8_0 || dt == TS_DTYPE_Q4_0 || dt == TS_DTYPE_Q5_0;
}
__host__ __device__ static constexpr int q32_code_bytes(ts_dtype dt) {
    return dt == TS_DTYPE_Q8_0 ? 32 : 16;
}
__host__ __device__ static constexpr int q32_qh_bytes(ts_dtype dt) {
    return dt == TS_DTYPE_Q5_0 ? 4 : 0;
}
__host__ __device__ static inline int64_t q32_group(ts_dtype dt) {
    return 16 + 8 * (q32_qh_bytes(dt) + q32_code_bytes(dt));
}
__host__ __device__ static inline int64_t q32_dev_d(ts_dtype dt, int64_t b) {
    return (b >> 3) * q32_group(dt) + 2 * (b & 7);
}
__host__ __device__ static inline int64_t q32_dev_qh(ts_dtype dt, int64_t b) {
    return (b >> 3) * q32_group(dt) + 16 + 4 * (b & 7);
}
__host__ __device__ static inline int64_t q32_dev_codes(ts_dtype dt, int64_t b) {
    return (b >> 3) * q32_group(dt) + 16 + 8 * q32_qh_bytes(dt) + q32_code_bytes(dt) * (b & 7);
}

/* Bytes of a row of cols elements of dtype on the device: the file's, but for the regrouped
 * types (Q6_K, Q8_0, Q4_0, Q5_0). */
static inline size_t cuda_row_bytes(ts_dtype dt, int64_t cols) {
    if (q32_type(dt)) {
        int64_t nb = cols / 32, tail = nb & 7;
        return (size_t)((nb >> 3) * q32_group(dt) + (tail ? q32_dev_codes(dt, tail) : 0));
    }
    if (dt != TS_DTYPE_Q6_K) return ts_dtype_row_bytes(dt, cols);
    int64_t nb = cols / 256, tail = nb & 7;
    return (size_t)((nb >> 3) * Q6K_DEV_GROUP + (tail ? 16 + tail * Q6K_DEV_BLOCK : 0));
}

/* Whether the device keeps dtype in a layout of its own (cuda_row_bytes), made at upload. */
static inline bool cuda_regrouped(ts_dtype dt) { return dt == TS_DTYPE_Q6_K || q32_type(dt); }

/* A GEMV kernel's name in profiles (TESSERA_CUDA_PROFILE, _DROP), the same for the general and
 * the single-token kernel: an output head (64k rows or more), a GEMV with its input norm folded
 * in, and Q6_K weights apart from the rest. */
static inline const char *cuda_gemv_name(int64_t rows, bool norm, ts_dtype dt) {
    return rows >= 65536         ? "gemv_head"
           : norm                ? "gemv_norm"
           : dt == TS_DTYPE_Q6_K ? "gemv_q6_k"
                                 : "gemv";
}

static inline unsigned cuda_blocks(int64_t n, int threads) {
    return (unsigned)((n + threads - 1) / threads);
}

/* Op implementations, grouped by file. */
void cuda_op_get_rows(ts_backend *be, const ts_tensor *W, const int32_t *ids, int n, float scale,
                      float *out);
void cuda_op_matmul(ts_backend *be, const ts_tensor *W, const float *x, int64_t ldx, int n,
                    float *y, int64_t ldy);
void cuda_op_rmsnorm(ts_backend *be, const float *x, int64_t ldx, int n_rows, int dim,
                     const float *w, float eps, float *out, int64_t ldo);
void cuda_op_l2norm(ts_backend *be, float *x, int64_t ldx, int n_rows, int dim, float eps,
                    float scale);
void cuda_op_rope(ts_backend *be, float *x, int64_t ldx, int n_tok, int n_heads,
                  int64_t head_stride, int rot_dim, const int32_t *pos, float theta);
void cuda_op_add(ts_backend *be, float *dst, const float *src, int64_t n);
void cuda_op_swiglu(ts_backend *be, const float *gate, const float *up, int64_t ldg, int n_tok,
                    int dim, float *out, int64_t ldo);
void cuda_op_gelu_mul(ts_backend *be, const float *gate, const float *up, int64_t ldg, int n_tok,
                      int dim, float *out, int64_t ldo);
void cuda_op_softcap(ts_backend *be, float *x, int64_t n, float cap);
void cuda_op_scale_rows(ts_backend *be, float *x, int64_t ldx, int n_rows, int dim, const float *s);
void cuda_op_sigmoid_gate(ts_backend *be, float *x, int64_t ldx, const float *g, int64_t ldg,
                          int n_tok, int n_heads, int head_dim, int64_t gstride);
/* The argmax of n_rows rows of n_cols values as keys (cuda_argmax_key), queued: each block's
 * maximum of its chunk of the row, the row's last block to finish merging them into keys[row]
 * and into host[row] (pinned staging memory the host reads after the step: no copy node behind
 * the kernel, and the wait after the launch may end as soon as they have come: cq_wait_keys;
 * with zero_copy off a copy of keys to host instead). False (nothing queued) where
 * its buffers have no room (cuda_argmax_ready first: it makes the room, and may flush the queue
 * too). */
bool cuda_argmax_ready(cuda_ctx *c, int n_rows, int n_cols);
/* The parts (n_words 64-bit words) and zeroed tickets (n_rows) of a kernel whose blocks write a
 * part each and whose last block a row merges them (the argmax, the sample op's plain draw). */
bool cuda_parts_ready(cuda_ctx *c, int64_t n_words, int n_rows);
/* The keys a kernel just queued wrote to keys (device) and, with zero_copy, to host (pinned
 * staging): the wait may end on them (cq_wait_keys); without zero_copy, a copy to host. */
void cuda_keys_to_host(cuda_ctx *c, unsigned long long *keys, unsigned long long *host, int n);
bool cuda_argmax_keys(cuda_ctx *c, const float *x, int64_t ldx, int n_rows, int n_cols,
                      unsigned long long *keys, unsigned long long *host);
/* Whether the sample op ends a row's draw on the device (ids as keys, no list for the host):
 * greedy and plain rows, top-k up to 1024 (with top-p, min-p) and top-p (with min-p) (unless
 * TESSERA_CUDA_SAMPLE_END=0). */
bool cuda_sample_ends(const cuda_ctx *c, const ts_sample_req *r, int n_cols);
/* Whether the device ends the draw of every one of n_rows rows (cuda_sample_ends). */
bool cuda_sample_all_end(const cuda_ctx *c, const ts_sample_req *req, int n_rows, int n_cols);
/* The draws of n_rows rows the device ends (cuda_sample_all_end), queued after the rows'
 * adjustments (written into x): the drawn ids as keys into keys (device; null: scratch) and
 * the staging memory returned, where the wait may end on them; null on failure. */
unsigned long long *cuda_sample_queue_ids(cuda_ctx *c, float *x, int64_t ldx, int n_rows,
                                          int n_cols, const ts_sample_req *req,
                                          unsigned long long *keys);
/* cuda_logprobs.cu: whether sample_logprobs' kernel answers a row of n_cols with this
 * log-probability request; the buffers it needs for n_rows rows (false: the device failed;
 * growing them flushes); and for a held step the kernel queued after a draw whose ids are keys
 * (device), its answers to lp and chosen when the step has run (false, and a held step broken,
 * where the staging arena is full) */
bool cuda_logprobs_fit(const cuda_ctx *c, const ts_sample_req *lp_req, int n_cols);
bool cuda_logprobs_ready(cuda_ctx *c, int n_rows, int n_cols);
bool cuda_logprobs_held(cuda_ctx *c, const float *x, int64_t ldx, int n_rows, int n_cols,
                        const ts_sample_req *lp_req, const unsigned long long *keys,
                        ts_sample_res *lp, float *chosen);
/* ts_backend_ops.sample_logprobs (cuda_logprobs.cu) */
bool cuda_op_sample_logprobs(ts_backend *be, float *x, int64_t ldx, int n_rows, int n_cols,
                             const ts_sample_req *req, const ts_sample_req *lp_req,
                             ts_sample_res *res, ts_sample_res *lp, float *chosen);
/* The rows' logit adjustments (penalties: ts_logit_adjust) applied to x in place, queued; in a
 * held step the place of their host bytes is kept (c->held_adj). */
void cuda_sample_adjust(cuda_ctx *c, float *x, int64_t ldx, int n_rows, int n_cols,
                        const ts_sample_req *req);
/* The held step's logit adjustments rewritten from req (n_rows rows, the lists as they are now:
 * a list grows by the token drawn since the step was held); false where they do not fit what
 * the held step has (a held step without adjustments, other rows, more entries than it
 * reserved) - the engine then drops it. */
bool cuda_sample_held_adjust(cuda_ctx *c, const ts_sample_req *req, int n_rows);
/* Draws (x already adjusted: cuda_sample_adjust, ahead_sample_held) for n_rows rows, queued: each
 * drawn id also as a key in fed[r], and into out_ids when the step has run (cq_wait; the keys may
 * end the wait as the argmax's do). False, with nothing queued, for rows the device does not end
 * (cuda_sample_ends) and where the sampling buffers could not be had (cuda_sample.cu). */
bool cuda_sample_held(cuda_ctx *c, const float *x, int64_t ldx, int n_rows, int n_cols,
                      const ts_sample_req *req, unsigned long long *fed, int32_t *out_ids);
/* decoding ahead (cuda_ahead.cu): the backend's ops of it */
void cuda_ahead_ops(ts_backend_ops *o);
void cuda_op_argmax(ts_backend *be, const float *x, int64_t ldx, int n_rows, int n_cols,
                    int32_t *out_host);
void cuda_op_sample(ts_backend *be, float *x, int64_t ldx, int n_rows, int n_cols,
                    const ts_sample_req *req, ts_sample_res *res);
void cuda_op_copy_rows(ts_backend *be, float *dst, int64_t ldd, const float *src, int64_t lds,
                       int n, int dim);
void cuda_op_attention(ts_backend *be, const float *q, int64_t ldq, int64_t q_head_stride, int n,
                       int pos0, const float *k_cache, const float *v_cache,
                       const ts_attn_dims *dims, float *out, int64_t ldo);
void cuda_op_conv1d_silu(ts_backend *be, const float *x, int64_t ldx, int n, int C, int K,
                         const float *w, float *state, float *out, int64_t ldo);
void cuda_op_gdn_gates(ts_backend *be, const float *a, int64_t lda, const float *b, int64_t ldb,
                       int n, int Hv, const float *neg_exp_a, const float *dt_bias, float *g,
                       float *beta);
void cuda_op_gdn(ts_backend *be, const float *q, const float *k, int64_t ldqk, const float *v,
                 int64_t ldv, const float *g, const float *beta, int n, const ts_gdn_dims *dims,
                 float *state, float *out, bool chunked);
void cuda_op_conv1d_silu_runs(ts_backend *be, const float *x, int64_t ldx, int C, int K,
                              const float *w, const ts_seq_run *runs, int nr, float *out,
                              int64_t ldo);
void cuda_op_gdn_runs(ts_backend *be, const float *q, const float *k, int64_t ldqk, const float *v,
                      int64_t ldv, const float *g, const float *beta, const ts_gdn_dims *dims,
                      const ts_seq_run *runs, int nr, const ts_gated_norm *gn, float *out);
void cuda_op_attention_runs(ts_backend *be, const float *q, int64_t ldq, int64_t q_head_stride,
                            const float *k, const float *v, const ts_attn_dims *dims,
                            const ts_seq_run *runs, int nr, float *out, int64_t ldo);
/* the image encoder's ops (cuda_ops_vision.cu; attention_full in cuda_ops_seq.cu) */
void cuda_op_rope_cs(ts_backend *be, float *x, int64_t ldx, int n_tok, int n_heads,
                     int64_t head_stride, int half, const float *cs);
void cuda_op_layernorm(ts_backend *be, const float *x, int64_t ldx, int n_rows, int dim,
                       const float *w, const float *b, float eps, float *out, int64_t ldo);
void cuda_op_bias_act(ts_backend *be, float *x, int64_t ldx, int n_rows, int dim, const float *bias,
                      int act);
void cuda_op_vision_patches(ts_backend *be, const uint8_t *rgb, const ts_patch_dims *d,
                            const float *lut, float *out);
void cuda_op_vision_positions(ts_backend *be, const float *table, int side, int dim, int grid_h,
                              int grid_w, int merge, float *out);
void cuda_op_attention_full(ts_backend *be, const float *q, int64_t ldq, const float *k,
                            const float *v, int64_t ldkv, int n, const ts_attn_dims *dims,
                            float *out, int64_t ldo);
void cuda_op_matmul_n(ts_backend *be, const ts_tensor *const *W, int nw, const float *x,
                      int64_t ldx, int n, const ts_prenorm *pre, float *const *y,
                      const int64_t *ldy);
void cuda_op_matmul_add(ts_backend *be, const ts_tensor *W, const float *x, int64_t ldx, int n,
                        float *y, int64_t ldy);
void cuda_op_norm_add_rmsnorm(ts_backend *be, float *x, const float *h, int n_rows, int dim,
                              int64_t ld, const float *wh, const float *w, float eps, float *out);
void cuda_op_add_rmsnorm(ts_backend *be, float *x, const float *h, int n_rows, int dim, int64_t ld,
                         const float *w, float eps, float *out);
void cuda_op_matmul_glu(ts_backend *be, const ts_tensor *Wg, const ts_tensor *Wu, const float *x,
                        int64_t ldx, int n, const ts_prenorm *pre, bool gelu, float *tg,
                        float *tu, int64_t ldt, float *out, int64_t ldo);
void cuda_op_conv_gdn_prep(ts_backend *be, const float *x, int64_t ldx, int C, int K,
                           const float *w, const ts_seq_run *runs, int nr, float *out,
                           int64_t ldo, const ts_gdn_prep_args *p);
/* The L2 set-aside for the recurrent state on (the single-sequence step keeps its state there)
 * or off (other delta-rule paths: batches, prompts); whether it is on afterwards. */
bool cuda_l2_keep(cuda_ctx *c, bool on);
bool cuda_op_conv_gdn_step(ts_backend *be, const float *x, int C, int K, const float *w,
                           const ts_seq_run *runs, int nr, const ts_gdn_prep_args *p,
                           const ts_gdn_dims *dims, const ts_gated_norm *gn, float *out);
/* A query-key dot product as the softmax sees it: scaled, then soft-capped where the model
 * has a cap (softcap > 0). One definition for every attention kernel. */
__device__ static inline float attn_logit(float qk, const ts_attn_dims &d) {
    float s = qk * d.scale;
    return d.softcap > 0 ? d.softcap * tanhf(s / d.softcap) : s;
}

/* One sequence's prompt attention (n >= 32 queries at pos0 over its caches) on the tensor
 * cores, bf16x3 (cuda_attn_mma.cu); false where it does not take the shape (heads of 64, 128
 * or 256 dims) or TESSERA_CUDA_ATTN_MMA=0, and the caller's kernels run instead. */
bool cuda_attention_mma(cuda_ctx *c, const float *q, int64_t ldq, int64_t qhs, int n, int pos0,
                        const float *kc, const float *vc, const ts_attn_dims *d, float *out,
                        int64_t ldo);
/* Prompts of fewer queries take the fp32 kernels */
#define CUDA_ATTN_MMA_MIN 32
/* The same for several sequences' runs (host table; caches a and b, K/V rows stored): those of
 * CUDA_ATTN_MMA_MIN queries or more, run by run; the number taken (0 where the kernel does not
 * take the heads or the scratch is short). Where it takes any, rest (nr entries, host) gets the
 * runs with those taken as runs of none: the ones the caller's kernels must still do. */
int cuda_attention_mma_runs(cuda_ctx *c, const float *q, int64_t ldq, int64_t qhs,
                            const ts_seq_run *runs, int nr, const ts_attn_dims *d, float *out,
                            int64_t ldo, ts_seq_run *rest);
/* attention_full for heads of 64 dims on the tensor cores (cuda_attn_tc.cu); false where it
 * does not take the shapes (the caller's fp32 kernel then does). */
bool cuda_attention_full_tc(cuda_ctx *c, const float *q, int64_t ldq, const float *k,
                            const float *v, int64_t ldkv, int n, const ts_attn_dims *d, float *out,
                            int64_t ldo);
/* Many sequences' delta-rule decode step (cuda_gdn_step_runs.cu): conv_gdn_step's nr > 1 runs
 * of one token for H heads of d_k = d_v = 128, one v-head a k-head (the caller checks those);
 * false where it does not take them (TESSERA_CUDA_GDN_STEP_RUNS=0, C or K). */
bool cuda_gdn_step_runs(cuda_ctx *c, const float *x, int C, int K, const float *w,
                        const ts_seq_run *runs, int nr, const ts_gdn_prep_args *p, int H,
                        const ts_gated_norm *gn, float *out);
bool cuda_op_attention_step(ts_backend *be, const float *q, int64_t ldq, int64_t q_head_stride,
                            const float *wq, const float *k, const float *wk, const float *v,
                            float eps, int rot_dim, float theta, const ts_attn_dims *dims,
                            const ts_seq_run *runs, int nr, const float *gate, float *out,
                            int64_t ldo);
void cuda_op_l2norm_heads(ts_backend *be, const float *src, int64_t lds, int n_tok, int n_heads,
                          int dim, float eps, float scale, float *dst);
/* The chunked delta rule (cuda_gdn_chunked.cu): whether it fits the device for heads of d_k
 * keys (setting the kernels' shared-memory limits; any number of values), and its launch (runs
 * NULL: one run of n tokens on state; else the runs' own lengths and states, max_len the
 * longest). */
bool cuda_gdn_chunked_fits(cuda_ctx *c, int d_k);
void cuda_gdn_chunked_launch(cuda_ctx *c, const float *q, const float *k, int64_t ldqk,
                             const float *v, int64_t ldv, const float *g, const float *beta, int n,
                             int max_len, const ts_gdn_dims *dims, float *state, float *out,
                             const ts_seq_run *runs_dev, int nr);
/* The tensor-core GEMM for 9..SK_MAX_TOK tokens of F16/BF16 weights (cuda_gemm_skinny.cu):
 * whether it takes weight w for n tokens, and y_j = W_j x for up to SK_SET weights of one dtype
 * and column count, x the activations split by k_split_half ([2n][cols]: hi rows, lo rows; for
 * F16 weights each token scaled by a power of two that unscale[t] undoes, else unscale NULL);
 * acc: y_j += the product. */
#define SK_MAX_TOK 64
#define SK_SET 4
bool cuda_skinny_fits(const cuda_wview *w, int n);
void cuda_wg_free(cuda_ctx *c); /* cuda_gemm_wg.cu's tensor maps */
void cuda_skinny_gemm(cuda_ctx *c, const cuda_wview *w, int nw, const uint16_t *x,
                      const float *unscale, int n, float *const *y, const int64_t *ldy, bool acc);
/* A few tokens' (n, up to gemv_one_tokens) y_j = W_j x (y_j += with acc) for up to 4 stacked
 * weights, x normed on the fly where norm_w is set, and the gated MLP's act(W_g x) * (W_u x)
 * (cuda_gemv_one.cu); token t's x at x + t * ldx, its outputs at y_j + t * ldy[j] (out + t *
 * ldo). False where they do not apply (then nothing was queued). */
bool cuda_gemv_one(cuda_ctx *c, const cuda_wview *w, int nw, const float *x, int64_t ldx, int n,
                   float *const *y, const int64_t *ldy, const float *norm_w, float eps, bool acc);
bool cuda_gemv_one_glu(cuda_ctx *c, const cuda_wview *g, const cuda_wview *u, const float *x,
                       int64_t ldx, int n, const float *norm_w, float eps, bool gelu, float *out,
                       int64_t ldo);
/* One token's y_j = W_j x for a stack of two quantized types (wa's na weights of one, wb's nb
 * of the other) in one launch, x normed on the fly where norm_w is set; false where it does not
 * apply (then nothing was queued) (cuda_gemv_pair.cu). */
bool cuda_gemv_pair(cuda_ctx *c, const cuda_wview *wa, int na, const cuda_wview *wb, int nb,
                    const float *x, float *const *ya, float *const *yb, const float *norm_w,
                    float eps);
/* The positions of a forward on the device (uploaded when they change; NULL on failure). */
const int32_t *cuda_positions(cuda_ctx *c, const int32_t *pos, int n_tok);
void cuda_op_gdn_prep(ts_backend *be, const float *conv, int64_t ldc, const ts_gdn_prep_args *p);
void cuda_op_qk_norm_rope(ts_backend *be, float *q, int64_t ldq, int64_t q_head_stride, int nq,
                          const float *wq, float *k, int64_t ldk, int nk, const float *wk,
                          int n_tok, int hd, float eps, int rot_dim, const int32_t *pos,
                          float theta);
void cuda_op_gated_rmsnorm(ts_backend *be, const float *x, const float *z, int n_tok,
                           int n_heads, int dv, const float *w, float eps, float *out);

#endif
