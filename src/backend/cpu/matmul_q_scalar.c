/* Scalar kernels for the quantized weight types: the oracle for the SIMD ones, and the
 * activation quantizer that every ISA shares. Same arithmetic as the SIMD kernels (exact
 * integer dot per block, scales applied per block in fp32), summed in block order. */
#include <assert.h>
#include <string.h>

#include "backend/cpu/matmul_q.h"
#include "backend/cpu/quant.h"
#include "base/half.h"

/* Rounds to nearest even without a libm call (the baseline x86-64 build has no roundss):
 * adding 1.5 * 2^23 leaves the integer part in the mantissa (IEEE arithmetic forbids folding
 * the two operations away). Valid for |v| < 2^22; same result as cvtps2dq. */
static inline int round_even(float v) {
    return (int)((v + 12582912.0f) - 12582912.0f);
}

void cpu_q8act_quantize(const float *x, int64_t n, void *buf) {
    cpu_q8act a = cpu_q8act_view(buf, n);
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) {
            float v = xb[i] < 0.0f ? -xb[i] : xb[i];
            amax = v > amax ? v : amax;
        }
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int s0 = 0, s1 = 0;
        for (int i = 0; i < 32; i++) {
            int q = round_even(xb[i] * id);
            a.q[32 * b + i] = (int8_t)q;
            if (i < 16)
                s0 += q;
            else
                s1 += q;
        }
        a.d[b] = d;
        a.s[b] = d * (float)(s0 + s1);
        a.s16[2 * b] = d * (float)s0;
        a.s16[2 * b + 1] = d * (float)s1;
    }
}

void cpu_q8act_interleave(int64_t n, void *buf) {
    int8_t *q = buf;
    for (int64_t c = 0; c + 256 <= n; c += 256) {
        int8_t natural[256];
        memcpy(natural, q + c, sizeof natural);
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < 16; i++)
                memcpy(q + c + 4 * (16 * k + i), natural + 4 * (8 * (i % 8) + 2 * k + i / 8), 4);
    }
}

void cpu_q8act_interleave_q8(int64_t n, void *buf) {
    int8_t *q = buf;
    for (int64_t c = 0; c + 256 <= n; c += 256) {
        int8_t natural[256];
        memcpy(natural, q + c, sizeof natural);
        for (int k = 0; k < 4; k++)
            for (int j = 0; j < 8; j++) memcpy(q + c + 64 * k + 8 * j, natural + 32 * j + 8 * k, 8);
    }
}

static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return ts_f16_to_f32(h);
}

/* sum_i u[i] * a[i] over n elements */
static inline int idot(const uint8_t *u, const int8_t *a, int n) {
    int s = 0;
    for (int i = 0; i < n; i++) s += (int)u[i] * (int)a[i];
    return s;
}

static float dot_row(ts_dtype dt, const uint8_t *row, int64_t n, const cpu_q8act *a) {
    float y = 0.0f;
    uint8_t u[256];
    switch (dt) {
    case TS_DTYPE_Q8_0:
        for (int64_t b = 0; b < n / 32; b++) {
            const ts_block_q8_0 *blk = (const ts_block_q8_0 *)(row + 34 * b);
            int s = 0;
            for (int i = 0; i < 32; i++) s += (int)blk->qs[i] * (int)a->q[32 * b + i];
            y += f16(row + 34 * b) * (a->d[b] * (float)s);
        }
        break;
    case TS_DTYPE_Q4_0:
    case TS_DTYPE_Q5_0: {
        const int bb = dt == TS_DTYPE_Q4_0 ? 18 : 22, off = dt == TS_DTYPE_Q4_0 ? 8 : 16;
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = row + (size_t)bb * (size_t)b, *qs = blk + bb - 16;
            uint32_t qh = 0;
            if (dt == TS_DTYPE_Q5_0) memcpy(&qh, blk + 2, 4);
            for (int j = 0; j < 16; j++) {
                u[j] = (uint8_t)((qs[j] & 15) | ((qh >> j) & 1) << 4);
                u[j + 16] = (uint8_t)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
            }
            int s = idot(u, a->q + 32 * b, 32);
            y += f16(blk) * (a->d[b] * (float)s - (float)off * a->s[b]);
        }
        break;
    }
    case TS_DTYPE_Q4_K:
        for (int64_t sb = 0; sb < n / 256; sb++) {
            const ts_block_q4_K *blk = (const ts_block_q4_K *)(row + 144 * sb);
            float d = ts_f16_to_f32(blk->d), dmin = ts_f16_to_f32(blk->dmin);
            for (int j = 0; j < 8; j++) {
                int sc, m;
                ts_q4k_scale_min(blk->scales, j, &sc, &m);
                const uint8_t *q = blk->qs + 32 * (j / 2);
                for (int l = 0; l < 32; l++) u[l] = (uint8_t)(j & 1 ? q[l] >> 4 : q[l] & 15);
                int64_t ab = 8 * sb + j;
                int s = idot(u, a->q + 32 * ab, 32);
                y += d * (float)sc * (a->d[ab] * (float)s) - dmin * (float)m * a->s[ab];
            }
        }
        break;
    case TS_DTYPE_Q6_K:
        for (int64_t sb = 0; sb < n / 256; sb++) {
            const ts_block_q6_K *blk = (const ts_block_q6_K *)(row + 210 * sb);
            float d = ts_f16_to_f32(blk->d);
            for (int j = 0; j < 8; j++) { /* 32-element activation block j */
                int h = j / 4, k = j % 4;
                const uint8_t *ql = blk->ql + 64 * h + 32 * (k & 1), *qh = blk->qh + 32 * h;
                for (int l = 0; l < 32; l++)
                    u[l] = (uint8_t)((k >= 2 ? ql[l] >> 4 : ql[l] & 15) |
                                     ((qh[l] >> (2 * k)) & 3) << 4);
                int64_t ab = 8 * sb + j;
                for (int half = 0; half < 2; half++) {
                    int s = idot(u + 16 * half, a->q + 32 * ab + 16 * half, 16);
                    y += d * (float)blk->scales[2 * j + half] *
                         (a->d[ab] * (float)s - 32.0f * a->s16[2 * ab + half]);
                }
            }
        }
        break;
    default: assert(!"dot_row: not a quantized dtype"); break;
    }
    return y;
}

static void mmq_rows(ts_dtype dt, const cpu_mm_job *j, int64_t r0, int64_t r1) {
    _Alignas(64) uint8_t buf[CPU_MMQ_ACT_BYTES];
    const int64_t n = j->cols;
    assert(n % ts_dtype_block_elems(dt) == 0 && n <= CPU_MMQ_MAX_COLS);
    const size_t ab = cpu_q8act_bytes(n);
    const int tt = cpu_mmq_tok_tile(n);
    for (int t0 = 0; t0 < j->n_tok; t0 += tt) {
        int nt = j->n_tok - t0 < tt ? j->n_tok - t0 : tt;
        for (int t = 0; t < nt; t++)
            cpu_q8act_quantize(j->x + (int64_t)(t0 + t) * j->ldx, n, buf + (size_t)t * ab);
        for (int64_t o = r0; o < r1; o++) {
            const uint8_t *row = j->w + (size_t)o * j->row_bytes;
            for (int t = 0; t < nt; t++) {
                cpu_q8act a = cpu_q8act_view(buf + (size_t)t * ab, n);
                j->y[(int64_t)(t0 + t) * j->ldy + o] = dot_row(dt, row, n, &a);
            }
        }
    }
}

static void mmq_q8_0(const cpu_mm_job *j, int64_t r0, int64_t r1) {
    mmq_rows(TS_DTYPE_Q8_0, j, r0, r1);
}
static void mmq_q4_0(const cpu_mm_job *j, int64_t r0, int64_t r1) {
    mmq_rows(TS_DTYPE_Q4_0, j, r0, r1);
}
static void mmq_q5_0(const cpu_mm_job *j, int64_t r0, int64_t r1) {
    mmq_rows(TS_DTYPE_Q5_0, j, r0, r1);
}
static void mmq_q4_K(const cpu_mm_job *j, int64_t r0, int64_t r1) {
    mmq_rows(TS_DTYPE_Q4_K, j, r0, r1);
}
static void mmq_q6_K(const cpu_mm_job *j, int64_t r0, int64_t r1) {
    mmq_rows(TS_DTYPE_Q6_K, j, r0, r1);
}

const cpu_mm_kernel cpu_mmq_scalar[TS_DTYPE_COUNT] = {
    [TS_DTYPE_Q8_0] = {mmq_q8_0, 1}, [TS_DTYPE_Q4_0] = {mmq_q4_0, 1},
    [TS_DTYPE_Q5_0] = {mmq_q5_0, 1}, [TS_DTYPE_Q4_K] = {mmq_q4_K, 1},
    [TS_DTYPE_Q6_K] = {mmq_q6_K, 1},
};
