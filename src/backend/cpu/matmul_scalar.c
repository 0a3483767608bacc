/* Scalar matmul kernels: the oracle every SIMD variant is tested against, and the fallback for
 * CPUs (or dtypes) without a SIMD kernel. Plain loops, fp32 accumulation in index order. */
#include "backend/cpu/matmul_int.h"
#include "base/half.h"

static inline float load_elem(ts_dtype dt, const uint8_t *row, int64_t i) {
    uint16_t h;
    float f;
    switch (dt) {
    case TS_DTYPE_F16: memcpy(&h, row + 2 * i, 2); return ts_f16_to_f32(h);
    case TS_DTYPE_BF16: memcpy(&h, row + 2 * i, 2); return ts_bf16_to_f32(h);
    default: memcpy(&f, row + 4 * i, 4); return f;
    }
}

static inline void mm_rows(ts_dtype dt, const cpu_mm_job *j, int64_t r0, int64_t r1) {
    for (int64_t o = r0; o < r1; o++) {
        const uint8_t *row = j->w + (size_t)o * j->row_bytes;
        for (int t = 0; t < j->n_tok; t++) {
            const float *x = j->x + t * j->ldx;
            float s = 0.0f;
            for (int64_t i = 0; i < j->cols; i++) s += load_elem(dt, row, i) * x[i];
            j->y[t * j->ldy + o] = s;
        }
    }
}

static void mm_f32(const cpu_mm_job *j, int64_t r0, int64_t r1) {
    mm_rows(TS_DTYPE_F32, j, r0, r1);
}
static void mm_f16(const cpu_mm_job *j, int64_t r0, int64_t r1) {
    mm_rows(TS_DTYPE_F16, j, r0, r1);
}
static void mm_bf16(const cpu_mm_job *j, int64_t r0, int64_t r1) {
    mm_rows(TS_DTYPE_BF16, j, r0, r1);
}

const cpu_mm_kernel cpu_mm_scalar_kernels[TS_DTYPE_COUNT] = {
    [TS_DTYPE_F32] = {mm_f32, 1, 0, 1},
    [TS_DTYPE_F16] = {mm_f16, 1, 0, 1},
    [TS_DTYPE_BF16] = {mm_bf16, 1, 0, 1},
};
