/* y[t, o] = sum_i W[o, i] x[t, i] for 9-64 tokens of 16-bit weights on Hopper's warpgroup MMA
 * (wgmma, sm_90a): the batched decode of many sequences. cuda_gemm_skinny.cu's mma.sync kernel
 * holds its weights in registers, one step of them in flight, and with one or two blocks of 4
 * warps a multiprocessor it waits on every step's loads (ncu: 7-12% occupancy, DRAM ~10% busy,
 * the tensor pipe 13-29%); the hi and lo parts of 64 tokens also take as many mma.sync issues as
 * that instruction's rate allows at the weights' bandwidth.
 *
 * Here the copy engine does the loading: a block of one warpgroup owns 64 rows and walks its
 * share of the columns in stages of 64 (a 128-byte row of 16-bit values, the 128-byte swizzle's
 * span). Each stage's weight tile (64 rows) and activation tile (the tokens' hi rows, then their
 * lo rows: for NT token groups of 8, 16 NT rows of B) come by bulk tensor copies (TMA) into a
 * ring of WG_D stages, completing on an mbarrier; the first stages' weights are asked for before
 * the programmatic wait. A stage is 4 wgmma.m64nNk16 (four 16-column slices, N = 16 NT: 128, 64
 * or 32), both operands read from shared memory, B's first 8 NT columns the hi parts of the
 * tokens and the next 8 NT their lo parts. Each token's hi and lo sums are added at the end
 * (k_skinny adds them into one accumulator slice by slice: other bits, the same within fp32
 * rounding). A cluster of KS blocks splits the columns where the row blocks alone would leave
 * the GPU short, and sk_finish sums the blocks' parts in a fixed order, as for k_skinny. From 9
 * tokens by default (TESSERA_CUDA_WG_MIN): 12-32 sequences of the 0.8B BF16 +5-17%, 48-64 +23%
 * on an H200. (Blocks of 128 rows - two m64 tiles sharing each activation
 * tile - made a 64-sequence step of the 0.8B 2409 us against 2160 on an H200; 4 stages instead of
 * 3, or up to 3 or 4 blocks a multiprocessor in the column split, were slower too:
 * bench/RESULTS.md.)
 *
 * The tensor maps (one per weight and per activation buffer and token count) are encoded once
 * on the host and kept in device memory (the kernel's arguments would not hold them), indexed by
 * slot. wgmma needs the sm_90a target: this file alone is built for it (CMakeLists.txt), and a
 * probe kernel tells at run time whether the device runs that code (else k_skinny stays). */
#include "backend/cuda/cuda_gemm_skinny.cuh"

#include <cuda.h> /* CUtensorMap and the encoder's types; the function comes from the runtime */
#include <cuda_bf16.h>

#define WG_ROWS  64                   /* rows a block: one m64 tile */
#define WG_K     64                   /* columns a stage */
#define WG_D     3                    /* stages in the ring: two in flight while one computes */
#define WG_WTILE (WG_ROWS * WG_K * 2) /* bytes of a stage's weights */
#define WG_MAPS  4096                 /* tensor map slots */

/* For NT token groups of 8 (B: 8 NT hi rows, then 8 NT lo rows): a stage's activation bytes, the
 * whole stage's, and the shared memory (the ring 1024-aligned, then its barriers) */
template <int NT> __host__ __device__ constexpr int wg_xtile() { return 16 * NT * WG_K * 2; }
template <int NT> __host__ __device__ constexpr int wg_stage() { return WG_WTILE + wg_xtile<NT>(); }
template <int NT> __host__ __device__ constexpr int wg_smem() {
    return WG_D * wg_stage<NT>() + 1024 + 64;
}

typedef struct {
    int w[SK_SET]; /* the tensor map slot of each weight of the set */
    int x;         /* of the activations */
} wg_slots;

__device__ static inline uint32_t wg_saddr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ static inline void wg_bar_init(uint64_t *b) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(wg_saddr(b)) : "memory");
}

/* the one arrival of the stage's phase, with the bytes its copies will bring */
__device__ static inline void wg_bar_expect(uint64_t *b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(wg_saddr(b)),
                 "r"(bytes)
                 : "memory");
}

__device__ static inline void wg_bar_wait(uint64_t *b, uint32_t parity) {
    uint32_t done;
    do
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(wg_saddr(b)), "r"(parity)
                     : "memory");
    while (!done);
}

/* the box of map at (column x, row y) into dst, completing on bar */
__device__ static inline void wg_tma(void *dst, const CUtensorMap *map, int x, int y,
                                     uint64_t *bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3}], [%4];" ::"r"(wg_saddr(dst)),
                 "l"((uint64_t)map), "r"(x), "r"(y), "r"(wg_saddr(bar))
                 : "memory");
}

/* A K-major operand in shared memory with the 128-byte swizzle: rows of 128 bytes, 8-row atoms
 * 1024 bytes apart (the stride offset; the leading offset is unused for this layout). A
 * 16-column slice starts 32 bytes into the rows. */
__device__ static inline uint64_t wg_desc(const void *p) {
    return (uint64_t)((wg_saddr(p) & 0x3FFFF) >> 4) | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) |
           (1ull << 62);
}

__device__ static inline void wg_fence(void) {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ static inline void wg_commit(void) {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N> __device__ static inline void wg_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

/* d (64 rows x N columns, fp32) += A (64 x 16) B^T (N x 16), both from shared memory, N = 128, 64
 * or 32: the N / 2 accumulators as operands %0.., then the two descriptors */
#define WG_D8(i)                                                                                   \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),    \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_ACC16 WG_D8(0), WG_D8(8)
#define WG_ACC32 WG_ACC16, WG_D8(16), WG_D8(24)
#define WG_ACC64 WG_ACC32, WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56)
#define WG_R16   "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
#define WG_R32   WG_R16 ",%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define WG_R64                                                                                     \
    WG_R32 ",%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52," \
           "%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define WG_MMA(shape, ty, regs, a, b)                                                              \
    "wgmma.mma_async.sync.aligned." shape ".f32." ty "." ty " {" regs "}, " a ", " b               \
    ", 1, 1, 1, 0, 0;"
template <bool BF, int N>
__device__ static inline void wg_mma(float (&d)[N / 2], uint64_t a, uint64_t b) {
    // clang-format off
    if constexpr (N == 128) {
        if (BF) asm volatile(WG_MMA("m64n128k16", "bf16", WG_R64, "%64", "%65") : WG_ACC64 : "l"(a), "l"(b));
        else asm volatile(WG_MMA("m64n128k16", "f16", WG_R64, "%64", "%65") : WG_ACC64 : "l"(a), "l"(b));
    } else if constexpr (N == 64) {
        if (BF) asm volatile(WG_MMA("m64n64k16", "bf16", WG_R32, "%32", "%33") : WG_ACC32 : "l"(a), "l"(b));
        else asm volatile(WG_MMA("m64n64k16", "f16", WG_R32, "%32", "%33") : WG_ACC32 : "l"(a), "l"(b));
    } else {
        static_assert(N == 32, "N = 128, 64 or 32");
        if (BF) asm volatile(WG_MMA("m64n32k16", "bf16", WG_R16, "%16", "%17") : WG_ACC16 : "l"(a), "l"(b));
        else asm volatile(WG_MMA("m64n32k16", "f16", WG_R16, "%16", "%17") : WG_ACC16 : "l"(a), "l"(b));
    }
    // clang-format on
}

/* Whether this build's device code has the sm_90a instructions (set by the probe) */
__global__ static void k_wg_probe(int *ok) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    *ok = 1;
#endif
}

/* x: [2n][cols] 16-bit, the hi parts of n tokens then their lo parts (fp16 ones scaled by 1 /
 * unscale[t]), 8 NT - 7 <= n <= 8 NT; maps: the slots of the set's weights (boxes of 64 columns x
 * 64 rows) and of x (64 x 8 NT); set: its row blocks of WG_ROWS rows. */
template <ts_dtype DT, int KS, int NT>
__global__ static void __cluster_dims__(1, KS, 1) __launch_bounds__(128, 2)
    k_wg(sk_set set, const CUtensorMap *maps, wg_slots slot, int64_t cols, const float *unscale,
         int n) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr bool BF = DT != TS_DTYPE_F16, US = !BF;
    constexpr int N = 16 * NT, XTILE = wg_xtile<NT>(), STAGE = wg_stage<NT>();
    extern __shared__ __align__(16) unsigned char wg_dyn[];
    unsigned char *ring = (unsigned char *)(((uintptr_t)wg_dyn + 1023) & ~(uintptr_t)1023);
    uint64_t *full = (uint64_t *)(ring + WG_D * STAGE);
    int j = sk_weight_of(set, blockIdx.x);
    int r0 = (blockIdx.x - set.first[j]) * WG_ROWS;
    int nch = (int)(cols / WG_K), c0 = nch * (int)blockIdx.y / KS;
    int steps = nch * ((int)blockIdx.y + 1) / KS - c0;
    const CUtensorMap *wm = maps + slot.w[j], *xm = maps + slot.x;
    bool lead = threadIdx.x == 0;
    auto load_w = [&](int s) {
        wg_bar_expect(&full[s % WG_D], STAGE);
        wg_tma(ring + (s % WG_D) * STAGE, wm, (c0 + s) * WG_K, r0, &full[s % WG_D]);
    };
    /* B rows 0..8 NT - 1 the hi parts, the next 8 NT the lo parts (rows past 2n come as zeros;
     * hi rows past n are lo rows: their columns of the product are never stored) */
    auto load_x = [&](int s) {
        unsigned char *b = ring + (s % WG_D) * STAGE + WG_WTILE;
        wg_tma(b, xm, (c0 + s) * WG_K, 0, &full[s % WG_D]);
        wg_tma(b + XTILE / 2, xm, (c0 + s) * WG_K, n, &full[s % WG_D]);
    };
    if (lead) {
        /* both maps asked for now: x's before the wait too (the map, not the data) */
        asm volatile("prefetch.tensormap [%0];" ::"l"((uint64_t)wm) : "memory");
        asm volatile("prefetch.tensormap [%0];" ::"l"((uint64_t)xm) : "memory");
        for (int i = 0; i < WG_D; i++)
            wg_bar_init(&full[i]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        /* the weights before the programmatic wait: no kernel before this one writes them */
        for (int s = 0; s < WG_D && s < steps; s++)
            load_w(s);
    }
    cuda_pdl_entry();
    if (lead)
        for (int s = 0; s < WG_D && s < steps; s++)
            load_x(s);
    __syncthreads(); /* the barriers initialised, for every thread */

    float d[N / 2];
#pragma unroll
    for (int e = 0; e < N / 2; e++)
        d[e] = 0.0f;
    for (int s = 0; s < steps; s++) {
        unsigned char *st = ring + (s % WG_D) * STAGE;
        wg_bar_wait(&full[s % WG_D], (uint32_t)(s / WG_D) & 1);
        wg_fence();
#pragma unroll
        for (int k = 0; k < WG_K / 16; k++)
            wg_mma<BF, N>(d, wg_desc(st + k * 32), wg_desc(st + WG_WTILE + k * 32));
        wg_commit();
        wg_wait<1>(); /* step s - 1's mmas are done: its stage takes step s - 1 + WG_D */
        if (lead && s >= 1 && s - 1 + WG_D < steps) {
            load_w(s - 1 + WG_D);
            load_x(s - 1 + WG_D);
        }
    }
    wg_wait<0>();
    /* token t's hi sums in column t, its lo sums in 8 NT + t: n8 blocks q and q + NT, the same
     * thread's registers */
    float acc[1][NT][4];
    sk_each<NT, 1>([&](int, int q, int i) { acc[0][q][i] = d[q * 4 + i] + d[(q + NT) * 4 + i]; });
    static_assert(SK_WARPS * NT * 128 * 4 <= WG_D * STAGE, "room for the sums");
    sk_finish<US, NT, KS, 1, true>(acc, (float *)ring, set, j, r0, n, unscale);
#endif
}

typedef CUresult (*wg_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                 const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                 const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

typedef struct {
    const void *p;
    int64_t rows, cols;
    int dtype, box; /* box: rows of a box */
} wg_key;

struct cuda_wg_maps {
    wg_encode_fn encode;
    CUtensorMap *dev; /* WG_MAPS slots; a slot once written is never rewritten */
    wg_key key[WG_MAPS]; /* each slot's matrix; p NULL: the slot is free */
    unsigned opted; /* kernels allowed their shared memory (and clusters of 16), a bit each */
};

/* Ready to run k_wg: the device runs sm_90a code, the encoder is found, the slots exist. Once a
 * backend; false turns the form off. */
static bool wg_ready(cuda_ctx *c) {
    if (c->wg_maps) return true;
    if (!c->skinny_wg) return false;
    int *dev_ok = NULL, ok = 0;
    bool runs = cudaMalloc(&dev_ok, sizeof(int)) == cudaSuccess &&
                cudaMemset(dev_ok, 0, sizeof(int)) == cudaSuccess;
    if (runs) {
        k_wg_probe<<<1, 1>>>(dev_ok);
        runs = cudaGetLastError() == cudaSuccess &&
               cudaMemcpy(&ok, dev_ok, sizeof ok, cudaMemcpyDeviceToHost) == cudaSuccess && ok;
    }
    cudaFree(dev_ok);
    cudaGetLastError(); /* a device without sm_90a code refuses the probe: not a failure */
    cuda_wg_maps *w = runs ? (cuda_wg_maps *)calloc(1, sizeof *w) : NULL;
    cudaDriverEntryPointQueryResult q;
    if (w && (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&w->encode, 12000,
                                               cudaEnableDefault, &q) != cudaSuccess ||
              q != cudaDriverEntryPointSuccess || !w->encode ||
              cudaMalloc(&w->dev, WG_MAPS * sizeof(CUtensorMap)) != cudaSuccess)) {
        cudaGetLastError();
        free(w);
        w = NULL;
    }
    if (!w) {
        c->skinny_wg = false;
        return false;
    }
    c->wg_maps = w;
    return true;
}

/* The slot of the tensor map of a rows x cols 16-bit matrix at p, boxes of 64 columns x box rows
 * with the 128-byte swizzle; encoded and uploaded the first time. -1 when none can be had. */
static int wg_map(cuda_ctx *c, const void *p, int64_t rows, int64_t cols, ts_dtype dt, int box) {
    cuda_wg_maps *w = c->wg_maps;
    wg_key k = {p, rows, cols, (int)dt, box};
    uint64_t h = ((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull ^
                 (uint64_t)rows * 0xC2B2AE3D27D4EB4Full ^ (uint64_t)cols * 31 ^ (uint64_t)box;
    for (int probe = 0; probe < WG_MAPS; probe++) {
        int i = (int)((h + (uint64_t)probe) % WG_MAPS);
        if (w->key[i].p) {
            const wg_key &u = w->key[i];
            if (u.p == k.p && u.rows == k.rows && u.cols == k.cols && u.dtype == k.dtype &&
                u.box == k.box)
                return i;
            continue;
        }
        CUtensorMap m;
        cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows},
                   stride[1] = {(cuuint64_t)cols * 2};
        cuuint32_t boxd[2] = {WG_K, (cuuint32_t)box}, es[2] = {1, 1};
        CUresult r = w->encode(&m,
                               dt == TS_DTYPE_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                  : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                               2, (void *)p, dims, stride, boxd, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
        /* a synchronous copy to a slot no launched kernel reads yet */
        if (r != CUDA_SUCCESS ||
            cudaMemcpy(w->dev + i, &m, sizeof m, cudaMemcpyHostToDevice) != cudaSuccess) {
            cudaGetLastError();
            return -1;
        }
        w->key[i] = k;
        return i;
    }
    return -1; /* every slot taken */
}

/* The kernel allowed its shared memory (and a cluster of 16), once a backend. */
template <ts_dtype DT, int KS, int NT> static bool wg_allow(cuda_ctx *c) {
    constexpr int ksb = KS == 16 ? 4 : KS == 8 ? 3 : KS == 4 ? 2 : KS == 2 ? 1 : 0;
    constexpr int ntb = NT == 8 ? 2 : NT == 4 ? 1 : 0;
    constexpr unsigned bit = 1u << (ksb + 5 * ntb + (DT == TS_DTYPE_F16 ? 15 : 0));
    if (c->wg_maps->opted & bit) return true;
    const void *k = (const void *)k_wg<DT, KS, NT>;
    if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, wg_smem<NT>()) !=
            cudaSuccess ||
        (KS == 16 && cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
                         cudaSuccess)) {
        cudaGetLastError();
        return false;
    }
    c->wg_maps->opted |= bit;
    return true;
}

template <ts_dtype DT, int KS, int NT>
static bool wg_go(cuda_ctx *c, const sk_set &set, const wg_slots &slot, int64_t cols,
                  const float *us, int n) {
    if constexpr (KS > 4 * NT) { /* sk_finish: a whole element a thread at least */
        return false;
    } else {
        if (!wg_allow<DT, KS, NT>(c)) return false;
        c->wg_launches++;
        cuda_launch(c, "gemm_wg", k_wg<DT, KS, NT>, dim3((unsigned)set.first[set.nw], KS), 128,
                    wg_smem<NT>(), set, (const CUtensorMap *)c->wg_maps->dev, slot, cols, us, n);
        return true;
    }
}

/* The column split: the most blocks a cluster (up to 16, and 4 NT: sk_finish's slices) that
 * still fit the GPU at two blocks a multiprocessor, with two stages a block at least. */
template <ts_dtype DT, int NT>
static bool wg_split(cuda_ctx *c, const sk_set &set, const wg_slots &slot, int64_t cols,
                     const float *us, int n) {
    int64_t bx = set.first[set.nw], nch = cols / WG_K;
    int ks = 1;
    while (ks < 16 && ks < 4 * NT && bx * ks * 2 <= 2 * (int64_t)c->sm_count && 4 * ks <= nch)
        ks *= 2;
    switch (ks) {
    case 1: return wg_go<DT, 1, NT>(c, set, slot, cols, us, n);
    case 2: return wg_go<DT, 2, NT>(c, set, slot, cols, us, n);
    case 4: return wg_go<DT, 4, NT>(c, set, slot, cols, us, n);
    case 8: return wg_go<DT, 8, NT>(c, set, slot, cols, us, n);
    default: return wg_go<DT, 16, NT>(c, set, slot, cols, us, n);
    }
}

template <ts_dtype DT>
static bool wg_tokens(cuda_ctx *c, const sk_set &set, const wg_slots &slot, int64_t cols,
                      const float *us, int n) {
    if (n > 32) return wg_split<DT, 8>(c, set, slot, cols, us, n);
    if (n > 16) return wg_split<DT, 4>(c, set, slot, cols, us, n);
    return wg_split<DT, 2>(c, set, slot, cols, us, n);
}

bool cuda_wg_gemm(cuda_ctx *c, const sk_set &skinny_set, ts_dtype dt, int64_t cols,
                  const uint16_t *x, const float *us, int n) {
    if ((dt != TS_DTYPE_BF16 && dt != TS_DTYPE_F16) || n < c->wg_min || n > 64 || cols % WG_K ||
        (uintptr_t)x % 16 || !wg_ready(c))
        return false;
    sk_set set = skinny_set;
    sk_blocks(set, WG_ROWS);
    wg_slots slot = {};
    for (int j = 0; j < set.nw; j++)
        if ((uintptr_t)set.W[j] % 16 ||
            (slot.w[j] = wg_map(c, set.W[j], set.rows[j], cols, dt, WG_ROWS)) < 0)
            return false;
    /* x in boxes of the token groups' rows: 8 NT = 64, 32 or 16 */
    int box = n > 32 ? 64 : n > 16 ? 32 : 16;
    if ((slot.x = wg_map(c, x, 2 * (int64_t)n, cols, dt, box)) < 0) return false;
    if (dt == TS_DTYPE_F16) return wg_tokens<TS_DTYPE_F16>(c, set, slot, cols, us, n);
    return wg_tokens<TS_DTYPE_BF16>(c, set, slot, cols, us, n);
}

void cuda_wg_free(cuda_ctx *c) {
    if (!c->wg_maps) return;
    cudaFree(c->wg_maps->dev);
    free(c->wg_maps);
    c->wg_maps = NULL;
}
