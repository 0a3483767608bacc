/* Reference (scalar) quantization and dequantization of the GGUF block types (layouts in
 * quant.h). Dequantization computes each value with the same fp32 operations in the same order
 * as the format's definition, so results are bit-exact with other GGUF readers; this file is
 * built without FMA so that nothing is contracted. */
#include "backend/cpu/quant.h"

#include <math.h>
#include <string.h>

#include "base/half.h"

bool ts_dtype_is_quantized(ts_dtype t) {
    switch (t) {
    case TS_DTYPE_Q8_0:
    case TS_DTYPE_Q4_0:
    case TS_DTYPE_Q5_0:
    case TS_DTYPE_Q4_K:
    case TS_DTYPE_Q6_K: return true;
    default: return false;
    }
}

/* ---- dequantization ------------------------------------------------------------------ */

static void deq_q8_0(const ts_block_q8_0 *b, float *y) {
    float d = ts_f16_to_f32(b->d);
    for (int i = 0; i < 32; i++) y[i] = (float)b->qs[i] * d;
}

static void deq_q4_0(const ts_block_q4_0 *b, float *y) {
    float d = ts_f16_to_f32(b->d);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((b->qs[j] & 15) - 8) * d;
        y[j + 16] = (float)((b->qs[j] >> 4) - 8) * d;
    }
}

static void deq_q5_0(const ts_block_q5_0 *b, float *y) {
    float d = ts_f16_to_f32(b->d);
    uint32_t qh = (uint32_t)b->qh[0] | (uint32_t)b->qh[1] << 8 | (uint32_t)b->qh[2] << 16 |
                  (uint32_t)b->qh[3] << 24;
    for (int j = 0; j < 16; j++) {
        int lo = (b->qs[j] & 15) | (int)((qh >> j) & 1) << 4;
        int hi = (b->qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = (float)(lo - 16) * d;
        y[j + 16] = (float)(hi - 16) * d;
    }
}

static void deq_q4_K(const ts_block_q4_K *b, float *y) {
    float d = ts_f16_to_f32(b->d), dmin = ts_f16_to_f32(b->dmin);
    for (int g = 0; g < 4; g++) {
        const uint8_t *q = b->qs + 32 * g;
        int sc, m;
        ts_q4k_scale_min(b->scales, 2 * g, &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        ts_q4k_scale_min(b->scales, 2 * g + 1, &sc, &m);
        float d2 = d * (float)sc, m2 = dmin * (float)m;
        for (int l = 0; l < 32; l++) y[64 * g + l] = d1 * (float)(q[l] & 15) - m1;
        for (int l = 0; l < 32; l++) y[64 * g + 32 + l] = d2 * (float)(q[l] >> 4) - m2;
    }
}

static void deq_q6_K(const ts_block_q6_K *b, float *y) {
    float d = ts_f16_to_f32(b->d);
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        const int8_t *sc = b->scales + 8 * h;
        float *yh = y + 128 * h;
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q0 = ((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4) - 32;
            int q1 = ((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32;
            int q2 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
            int q3 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
            yh[l] = d * (float)sc[is + 0] * (float)q0;
            yh[l + 32] = d * (float)sc[is + 2] * (float)q1;
            yh[l + 64] = d * (float)sc[is + 4] * (float)q2;
            yh[l + 96] = d * (float)sc[is + 6] * (float)q3;
        }
    }
}

static ts_status check_row(ts_dtype dtype, int64_t n, const char *what) {
    if ((unsigned)dtype >= TS_DTYPE_COUNT)
        return ts_error(TS_ERR_INVALID, "%s: unknown dtype %d", what, (int)dtype);
    int be = ts_dtype_block_elems(dtype);
    if (n < 0 || n % be)
        return ts_error(TS_ERR_INVALID, "%s: %s row of %lld elements is not whole blocks of %d",
                        what, ts_dtype_name(dtype), (long long)n, be);
    return TS_OK;
}

ts_status ts_dequantize_row(ts_dtype dtype, const void *src, float *dst, int64_t n) {
    TS_TRY(check_row(dtype, n, "ts_dequantize_row"));
    const uint8_t *p = src;
    int be = ts_dtype_block_elems(dtype), bb = ts_dtype_block_bytes(dtype);
    uint16_t h;
    for (int64_t i = 0; i < n; i += be, p += bb) {
        switch (dtype) {
        case TS_DTYPE_F32: memcpy(dst + i, p, 4); break;
        case TS_DTYPE_F16:
            memcpy(&h, p, 2);
            dst[i] = ts_f16_to_f32(h);
            break;
        case TS_DTYPE_BF16:
            memcpy(&h, p, 2);
            dst[i] = ts_bf16_to_f32(h);
            break;
        case TS_DTYPE_Q8_0: deq_q8_0((const ts_block_q8_0 *)p, dst + i); break;
        case TS_DTYPE_Q4_0: deq_q4_0((const ts_block_q4_0 *)p, dst + i); break;
        case TS_DTYPE_Q5_0: deq_q5_0((const ts_block_q5_0 *)p, dst + i); break;
        case TS_DTYPE_Q4_K: deq_q4_K((const ts_block_q4_K *)p, dst + i); break;
        case TS_DTYPE_Q6_K: deq_q6_K((const ts_block_q6_K *)p, dst + i); break;
        default: return ts_error(TS_ERR_UNSUPPORTED, "ts_dequantize_row: dtype %d", (int)dtype);
        }
    }
    return TS_OK;
}

/* ---- quantization: the 32-element types ----------------------------------------------- */

/* The element of largest magnitude, with its sign (the first one on ties). */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    }
    return max;
}

static void quant_q8_0(const float *x, ts_block_q8_0 *b) {
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    b->d = ts_f32_to_f16(d);
    for (int i = 0; i < 32; i++) b->qs[i] = (int8_t)roundf(x[i] * id);
}

/* Q4_0 and Q5_0: the extreme element maps to -2^(bits-1) exactly, so that the sign of the
 * range with more room goes to the largest magnitude. */
static void quant_q4_0(const float *x, ts_block_q4_0 *b) {
    float d = signed_absmax(x, 32) / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    b->d = ts_f32_to_f16(d);
    for (int j = 0; j < 16; j++) {
        int lo = (int)(x[j] * id + 8.5f), hi = (int)(x[j + 16] * id + 8.5f);
        lo = lo > 15 ? 15 : lo;
        hi = hi > 15 ? 15 : hi;
        b->qs[j] = (uint8_t)(lo | hi << 4);
    }
}

static void quant_q5_0(const float *x, ts_block_q5_0 *b) {
    float d = signed_absmax(x, 32) / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    b->d = ts_f32_to_f16(d);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        int lo = (int)(x[j] * id + 16.5f), hi = (int)(x[j + 16] * id + 16.5f);
        lo = lo > 31 ? 31 : lo;
        hi = hi > 31 ? 31 : hi;
        b->qs[j] = (uint8_t)((lo & 15) | (hi & 15) << 4);
        qh |= (uint32_t)(lo >> 4) << j | (uint32_t)(hi >> 4) << (j + 16);
    }
    for (int k = 0; k < 4; k++) b->qh[k] = (uint8_t)(qh >> (8 * k));
}

/* ---- quantization: K-quants ------------------------------------------------------------ */

static int nearest(float f) { return (int)lrintf(f); }

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Fits x[i] ~ scale * L[i] - off with L in [0, nmax] and off >= 0, minimising the w-weighted
 * squared error: starting from the plain min/max mapping, tries 21 stretches of the grid and
 * keeps the least-squares (scale, min) of the best one. Returns scale; *off gets the offset. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L,
                           float *off) {
    float lo = x[0], hi = x[0], sw = 0.0f, swx = 0.0f;
    for (int i = 0; i < n; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
        sw += w[i];
        swx += w[i] * x[i];
    }
    if (lo > 0.0f) lo = 0.0f;
    if (hi == lo) {
        memset(L, 0, (size_t)n);
        *off = -lo;
        return 0.0f;
    }
    float iscale = (float)nmax / (hi - lo), scale = 1.0f / iscale, best = 0.0f;
    for (int i = 0; i < n; i++) {
        int l = clampi(nearest(iscale * (x[i] - lo)), 0, nmax);
        L[i] = (uint8_t)l;
        float e = scale * (float)l + lo - x[i];
        best += w[i] * e * e;
    }
    uint8_t Laux[32];
    for (int step = 0; step <= 20; step++) {
        float is = (-1.0f + 0.1f * (float)step + (float)nmax) / (hi - lo);
        float sl = 0.0f, sl2 = 0.0f, sxl = 0.0f;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest(is * (x[i] - lo)), 0, nmax);
            Laux[i] = (uint8_t)l;
            sl += w[i] * (float)l;
            sl2 += w[i] * (float)(l * l);
            sxl += w[i] * (float)l * x[i];
        }
        float D = sw * sl2 - sl * sl;
        if (D <= 0.0f) continue;
        float s = (sw * sxl - swx * sl) / D, m = (sl2 * swx - sl * sxl) / D;
        if (m > 0.0f) { /* the grid must reach down to the smallest value: offset >= 0 */
            m = 0.0f;
            s = sxl / sl2;
        }
        float err = 0.0f;
        for (int i = 0; i < n; i++) {
            float e = s * (float)Laux[i] + m - x[i];
            err += w[i] * e * e;
        }
        if (err < best) {
            memcpy(L, Laux, (size_t)n);
            best = err;
            scale = s;
            lo = m;
        }
    }
    *off = -lo;
    return scale;
}

static void quant_q4_K(const float *x, ts_block_q4_K *b) {
    uint8_t L[256];
    float w[32], scales[8], mins[8];
    float sum2 = 0.0f;
    for (int i = 0; i < 256; i++) sum2 += x[i] * x[i];
    float av = sqrtf(sum2 / 256.0f);
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; j++) {
        /* larger elements count more: their relative error is what the dot products feel */
        for (int l = 0; l < 32; l++) w[l] = av + fabsf(x[32 * j + l]);
        scales[j] = fit_scale_min(32, 15, x + 32 * j, w, L + 32 * j, &mins[j]);
        max_scale = fmaxf(max_scale, scales[j]);
        max_min = fmaxf(max_min, mins[j]);
    }
    float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    memset(b->scales, 0, sizeof b->scales);
    for (int j = 0; j < 8; j++) {
        int ls = clampi(nearest(inv_scale * scales[j]), 0, 63);
        int lm = clampi(nearest(inv_min * mins[j]), 0, 63);
        if (j < 4) {
            b->scales[j] = (uint8_t)ls;
            b->scales[j + 4] = (uint8_t)lm;
        } else {
            b->scales[j + 4] = (uint8_t)((ls & 15) | (lm & 15) << 4);
            b->scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
            b->scales[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    b->d = ts_f32_to_f16(max_scale / 63.0f);
    b->dmin = ts_f32_to_f16(max_min / 63.0f);
    /* re-quantize against the scales as stored, rounded to 6 bits and fp16 */
    float d = ts_f16_to_f32(b->d), dmin = ts_f16_to_f32(b->dmin);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        ts_q4k_scale_min(b->scales, j, &sc, &m);
        float ds = d * (float)sc, dm = dmin * (float)m;
        for (int l = 0; l < 32; l++)
            L[32 * j + l] =
                ds != 0.0f ? (uint8_t)clampi(nearest((x[32 * j + l] + dm) / ds), 0, 15) : 0;
    }
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++)
            b->qs[32 * g + l] = (uint8_t)(L[64 * g + l] | L[64 * g + 32 + l] << 4);
}

/* Fits x[i] ~ scale * (L[i] - nmax) with L - nmax in [-nmax, nmax - 1], weighting each element
 * by x^2: tries 19 grid stretches around the one that maps the extreme element to -nmax and
 * keeps the least-squares scale of the best. Returns scale. */
static float fit_scale_sym(int n, int nmax, const float *x, uint8_t *L) {
    float max = signed_absmax(x, n);
    if (fabsf(max) < 1e-15f) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = -(float)nmax / max, sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
        int l = clampi(nearest(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (uint8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)(l * l);
    }
    float scale = suml2 > 0.0f ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int step = -9; step <= 9; step++) {
        if (step == 0) continue;
        float is = -((float)nmax + 0.1f * (float)step) / max;
        float slx = 0.0f, sl2 = 0.0f;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest(is * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            slx += w * x[i] * (float)l;
            sl2 += w * (float)(l * l);
        }
        if (sl2 > 0.0f && slx * slx > best * sl2) {
            for (int i = 0; i < n; i++)
                L[i] = (uint8_t)(clampi(nearest(is * x[i]), -nmax, nmax - 1) + nmax);
            scale = slx / sl2;
            best = scale * slx;
        }
    }
    return scale;
}

static void quant_q6_K(const float *x, ts_block_q6_K *b) {
    uint8_t L[256];
    float scales[16], max_scale = 0.0f, max_abs = 0.0f;
    for (int k = 0; k < 16; k++) {
        scales[k] = fit_scale_sym(16, 32, x + 16 * k, L + 16 * k);
        if (fabsf(scales[k]) > max_abs) {
            max_abs = fabsf(scales[k]);
            max_scale = scales[k];
        }
    }
    if (max_abs < 1e-15f) {
        memset(b, 0, sizeof *b);
        return;
    }
    float iscale = -128.0f / max_scale;
    b->d = ts_f32_to_f16(1.0f / iscale);
    for (int k = 0; k < 16; k++) b->scales[k] = (int8_t)clampi(nearest(iscale * scales[k]), -128, 127);
    float d = ts_f16_to_f32(b->d);
    for (int k = 0; k < 16; k++) {
        float ds = d * (float)b->scales[k];
        for (int l = 0; l < 16; l++)
            L[16 * k + l] = ds != 0.0f
                                ? (uint8_t)(clampi(nearest(x[16 * k + l] / ds), -32, 31) + 32)
                                : 32;
    }
    for (int h = 0; h < 2; h++) {
        const uint8_t *Lh = L + 128 * h;
        uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        for (int l = 0; l < 32; l++) {
            ql[l] = (uint8_t)((Lh[l] & 15) | (Lh[l + 64] & 15) << 4);
            ql[l + 32] = (uint8_t)((Lh[l + 32] & 15) | (Lh[l + 96] & 15) << 4);
            qh[l] = (uint8_t)((Lh[l] >> 4) | (Lh[l + 32] >> 4) << 2 | (Lh[l + 64] >> 4) << 4 |
                              (Lh[l + 96] >> 4) << 6);
        }
    }
}

ts_status ts_quantize_row(ts_dtype dtype, const float *src, void *dst, int64_t n) {
    TS_TRY(check_row(dtype, n, "ts_quantize_row"));
    uint8_t *p = dst;
    int be = ts_dtype_block_elems(dtype), bb = ts_dtype_block_bytes(dtype);
    uint16_t h;
    for (int64_t i = 0; i < n; i += be, p += bb) {
        switch (dtype) {
        case TS_DTYPE_F32: memcpy(p, src + i, 4); break;
        case TS_DTYPE_F16:
            h = ts_f32_to_f16(src[i]);
            memcpy(p, &h, 2);
            break;
        case TS_DTYPE_BF16:
            h = ts_f32_to_bf16(src[i]);
            memcpy(p, &h, 2);
            break;
        case TS_DTYPE_Q8_0: quant_q8_0(src + i, (ts_block_q8_0 *)p); break;
        case TS_DTYPE_Q4_0: quant_q4_0(src + i, (ts_block_q4_0 *)p); break;
        case TS_DTYPE_Q5_0: quant_q5_0(src + i, (ts_block_q5_0 *)p); break;
        case TS_DTYPE_Q4_K: quant_q4_K(src + i, (ts_block_q4_K *)p); break;
        case TS_DTYPE_Q6_K: quant_q6_K(src + i, (ts_block_q6_K *)p); break;
        default: return ts_error(TS_ERR_UNSUPPORTED, "ts_quantize_row: dtype %d", (int)dtype);
        }
    }
    return TS_OK;
}
