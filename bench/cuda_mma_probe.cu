/* The tensor-core instructions of a Hopper GPU, measured apart from tessera (a probe for the
 * design of cuda_gemm_skinny.cu, not built with the project):
 *
 *   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -o cuda_mma_probe bench/cuda_mma_probe.cu
 *   ./cuda_mma_probe
 *
 * 1. Layout: wgmma.mma_async m64n64k16 (bf16 in, fp32 sums) with both operands in shared memory,
 *    K-major, no swizzle - 8 x 16-byte "core matrices", those adjacent along K 128 bytes apart,
 *    those of the next 8 rows K/8 x 128 bytes apart - against a double-precision product, with
 *    the descriptor's two offsets one way round and the other: the one that matches is the
 *    layout a wgmma form of the GEMM stages its tiles in. The activations go in as a hi and a
 *    lo bf16 part into the same sums, as the GEMM's do.
 * 2. Rates: the skinny GEMM's work for 64 tokens (a block's 128 rows x 64 tokens, hi and lo),
 *    repeated from shared memory with no global traffic, as wgmma and as mma.sync m16n8k16 in
 *    k_skinny's pattern (a warp 2 row tiles x 8 token groups, fragments read from shared
 *    memory), one and two blocks a multiprocessor. */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_bf16.h>
#include <vector>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__);                           \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

__device__ inline uint64_t make_desc(const void *smem, uint32_t lbo, uint32_t sbo) {
    uint32_t addr = (uint32_t)__cvta_generic_to_shared(smem);
    uint64_t d = 0;
    d |= (uint64_t)((addr & 0x3FFFF) >> 4);
    d |= (uint64_t)((lbo & 0x3FFFF) >> 4) << 16;
    d |= (uint64_t)((sbo & 0x3FFFF) >> 4) << 32;
    return d;
}
__device__ inline void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ inline void wg_wait0() {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

__device__ inline void wg64(float (&d)[32], uint64_t da, uint64_t db) {
    asm volatile("{\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%"
                 "22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, 1, 1, 1, 0, 0;\n"
                 "}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db));
}

__device__ inline void mma16816(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* core matrix (rg, kg) of a 64 x K K-major tile at ((rg * (K/8) + kg) * 64) elements: cores
 * adjacent along K are 128 bytes apart, along M/N K/8 * 128 bytes */
template <int K> __device__ inline void stage(uint16_t *dst, const uint16_t *src) {
    for (int i = threadIdx.x; i < 64 * K / 8; i += blockDim.x) {
        int r = i / (K / 8), kg = i % (K / 8);
        *(uint4 *)(dst + ((r / 8) * (K / 8) + kg) * 64 + (r % 8) * 8) =
            *(const uint4 *)(src + r * K + kg * 8);
    }
}

template <int K>
__global__ void k_check(const uint16_t *W, const uint16_t *Xh, const uint16_t *Xl, float *Y,
                        int mode) {
    extern __shared__ __align__(128) unsigned char sm[];
    uint16_t *A = (uint16_t *)sm, *Bh = A + 64 * K, *Bl = Bh + 64 * K;
    stage<K>(A, W);
    stage<K>(Bh, Xh);
    stage<K>(Bl, Xl);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    float d[32];
    for (int i = 0; i < 32; i++)
        d[i] = 0.0f;
    uint32_t ck = 128, cmn = (K / 8) * 128;
    uint32_t lbo = mode == 0 ? ck : cmn, sbo = mode == 0 ? cmn : ck;
    wg_fence();
    for (int s = 0; s < K / 16; s++) {
        uint64_t da = make_desc(A + s * 128, lbo, sbo);
        wg64(d, da, make_desc(Bh + s * 128, lbo, sbo));
        wg64(d, da, make_desc(Bl + s * 128, lbo, sbo));
    }
    wg_commit();
    wg_wait0();
    int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int j = 0; j < 8; j++)
        for (int e = 0; e < 4; e++) {
            int row = 16 * w + g + (e >= 2 ? 8 : 0), tok = 8 * j + 2 * t + (e & 1);
            Y[tok * 64 + row] = d[j * 4 + e];
        }
}

/* peak: each warpgroup repeats `reps` x 8 k16 steps of two m64n64k16 (hi, lo) over 2 m-tiles
 * (128 rows) from shared memory - the skinny GEMM's work for 64 tokens */
__global__ void k_rate_wg(float *out, int reps) {
    extern __shared__ __align__(128) unsigned char sm[];
    uint16_t *A = (uint16_t *)sm, *B = A + 128 * 128; /* 128 rows x 128 k, 2 x 64 tokens x 128 k */
    for (int i = threadIdx.x; i < (128 * 128 + 128 * 128) / 8; i += blockDim.x)
        ((uint4 *)sm)[i] = make_uint4(i, i * 3, i * 5, i * 7);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    float d0[32], d1[32];
    for (int i = 0; i < 32; i++)
        d0[i] = d1[i] = 0.0f;
    uint32_t lbo = 128, sbo = 16 * 128;
    wg_fence();
    for (int r = 0; r < reps; r++) {
        for (int s = 0; s < 8; s++) {
            uint64_t a0 = make_desc(A + s * 128, lbo, sbo),
                     a1 = make_desc(A + 64 * 128 + s * 128, lbo, sbo);
            uint64_t bh = make_desc(B + s * 128, lbo, sbo),
                     bl = make_desc(B + 64 * 128 + s * 128, lbo, sbo);
            wg64(d0, a0, bh);
            wg64(d1, a1, bh);
            wg64(d0, a0, bl);
            wg64(d1, a1, bl);
        }
        wg_commit();
        wg_wait0();
    }
    float s = 0;
    for (int i = 0; i < 32; i++)
        s += d0[i] + d1[i];
    if (s == 1234.5f) out[threadIdx.x] = s;
}

/* the same work by mma.sync as k_skinny does it: a warp 2 m-tiles x 8 token groups, fragments
 * from shared memory each k16 */
__global__ void k_rate_mma(float *out, int reps) {
    extern __shared__ __align__(128) unsigned char sm[];
    uint32_t *S = (uint32_t *)sm;
    for (int i = threadIdx.x; i < 16384; i += blockDim.x)
        S[i] = i * 2654435761u;
    __syncthreads();
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float acc[2][8][4];
    for (int m = 0; m < 2; m++)
        for (int q = 0; q < 8; q++)
            for (int i = 0; i < 4; i++)
                acc[m][q][i] = 0.0f;
    for (int r = 0; r < reps; r++) {
        for (int s = 0; s < 8; s++) {
            uint4 a[2];
            for (int m = 0; m < 2; m++)
                a[m] = ((const uint4 *)S)[((warp * 2 + m) * 8 + s) * 32 + lane];
            for (int q = 0; q < 8; q++) {
                uint2 hi = ((const uint2 *)S)[4096 + (q * 8 + s) * 32 + lane];
                uint2 lo = ((const uint2 *)S)[6144 + (q * 8 + s) * 32 + lane];
                for (int m = 0; m < 2; m++) {
                    mma16816(acc[m][q], a[m].x, a[m].y, a[m].z, a[m].w, hi.x, hi.y);
                    mma16816(acc[m][q], a[m].x, a[m].y, a[m].z, a[m].w, lo.x, lo.y);
                }
            }
        }
    }
    float sum = 0;
    for (int m = 0; m < 2; m++)
        for (int q = 0; q < 8; q++)
            for (int i = 0; i < 4; i++)
                sum += acc[m][q][i];
    if (sum == 1234.5f) out[threadIdx.x] = sum;
}

static uint16_t bf(float f) {
    __nv_bfloat16 h = __float2bfloat16(f);
    return *(uint16_t *)&h;
}
static float fb(uint16_t u) {
    uint32_t v = (uint32_t)u << 16;
    float f;
    memcpy(&f, &v, 4);
    return f;
}

int main() {
    const int K = 128;
    std::vector<uint16_t> W(64 * K), Xh(64 * K), Xl(64 * K);
    srand(1);
    for (auto &v : W)
        v = bf((rand() / (float)RAND_MAX - 0.5f));
    std::vector<float> X(64 * K);
    for (int i = 0; i < 64 * K; i++) {
        X[i] = rand() / (float)RAND_MAX - 0.5f;
        Xh[i] = bf(X[i]);
        Xl[i] = bf(X[i] - fb(Xh[i]));
    }
    std::vector<double> ref(64 * 64);
    for (int t = 0; t < 64; t++)
        for (int r = 0; r < 64; r++) {
            double s = 0;
            for (int k = 0; k < K; k++)
                s += (double)fb(W[r * K + k]) * ((double)fb(Xh[t * K + k]) + fb(Xl[t * K + k]));
            ref[t * 64 + r] = s;
        }
    uint16_t *dW, *dXh, *dXl;
    float *dY;
    CK(cudaMalloc(&dW, 64 * K * 2));
    CK(cudaMalloc(&dXh, 64 * K * 2));
    CK(cudaMalloc(&dXl, 64 * K * 2));
    CK(cudaMalloc(&dY, 64 * 64 * 4));
    CK(cudaMemcpy(dW, W.data(), 64 * K * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dXh, Xh.data(), 64 * K * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dXl, Xl.data(), 64 * K * 2, cudaMemcpyHostToDevice));
    int smem = 3 * 64 * K * 2;
    CK(cudaFuncSetAttribute(k_check<K>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    for (int mode = 0; mode < 2; mode++) {
        CK(cudaMemset(dY, 0, 64 * 64 * 4));
        k_check<K><<<1, 128, smem>>>(dW, dXh, dXl, dY, mode);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        std::vector<float> Y(64 * 64);
        CK(cudaMemcpy(Y.data(), dY, 64 * 64 * 4, cudaMemcpyDeviceToHost));
        double num = 0, den = 0;
        for (int i = 0; i < 64 * 64; i++)
            num += (Y[i] - ref[i]) * (Y[i] - ref[i]), den += ref[i] * ref[i];
        printf("layout check mode %d (%s): rel L2 %.3g  y[0]=%g ref %g\n", mode,
               mode == 0 ? "LBO=K-step SBO=8-row step" : "LBO=8-row step SBO=K-step",
               sqrt(num / den), Y[0], ref[0]);
    }
    float *dout;
    CK(cudaMalloc(&dout, 4096));
    int sm_count;
    CK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
    int smw = (128 * 128 + 128 * 128) * 2, smm = 65536;
    CK(cudaFuncSetAttribute(k_rate_wg, cudaFuncAttributeMaxDynamicSharedMemorySize, smw));
    CK(cudaFuncSetAttribute(k_rate_mma, cudaFuncAttributeMaxDynamicSharedMemorySize, smm));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    int reps = 2000;
    for (int bps = 1; bps <= 2; bps++) {
        int blocks = sm_count * bps;
        /* per block per rep: 128 rows x 64 tokens x 128 k x 2 (hi, lo) x 2 flops */
        double flop = (double)blocks * reps * 128.0 * 64 * 128 * 2 * 2;
        for (int kind = 0; kind < 2; kind++) {
            for (int it = 0; it < 2; it++) {
                cudaEventRecord(e0);
                if (kind == 0)
                    k_rate_wg<<<blocks, 128, smw>>>(dout, reps);
                else
                    k_rate_mma<<<blocks, 128, smm>>>(dout, reps);
                cudaEventRecord(e1);
                CK(cudaEventSynchronize(e1));
                CK(cudaGetLastError());
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                if (it == 1)
                    printf("%s, %d block(s) of 4 warps a multiprocessor: %.1f TFLOP/s (%.3f ms)\n",
                           kind == 0 ? "wgmma m64n64k16 from smem"
                                     : "mma.sync m16n8k16 (k_skinny's pattern)",
                           bps, flop / ms / 1e9, ms);
            }
        }
    }
    return 0;
}
