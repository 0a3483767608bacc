/* ts_image_resize: PIL's Image.resize(size, BICUBIC) on an RGB image, byte for byte (Pillow 13's
 * libImaging/Resample.c, the same arithmetic in the same order):
 *   - the kernel is the bicubic convolution with a = -0.5 and support 2, widened by the scale
 *     factor when shrinking (so it averages every source pixel under an output pixel: PIL's
 *     antialiasing); weights are computed in double, divided by their sum, then rounded to
 *     fixed point with 22 fractional bits (half away from zero);
 *   - two separable passes, each rounding to 8 bits (add half, shift, clamp to 0..255); a pass
 *     whose side keeps its size is skipped, as PIL skips it;
 *   - the horizontal pass goes first unless the height shrinks by more than twice as many
 *     pixels as the width does (Pillow 13 then runs the vertical pass first, to make the
 *     other one cheaper; Pillow 12 and older always go horizontal first, so for such sizes
 *     their bytes differ from these: the 8-bit rounding between the passes is not the same).
 * Unlike PIL, the first pass does not fill a whole intermediate image: horizontal-first, its
 * rows are made when the vertical pass first needs them and kept in a ring of as many rows as
 * one output row reads; vertical-first, each output row is made from one intermediate row.
 * The values are the same; the memory is a few rows instead of an intermediate image. */
#include "base/status.h"
#include "image/image_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define RS_FRAC 22 /* fixed-point bits of a weight: 32 - 8 (sample) - 2 (overshoot + sign) */

typedef struct {
    int n;      /* weights per output sample (room for the widest window), k's stride */
    int *first; /* [n_out] first source sample of each window */
    int *count; /* [n_out] samples in each window (<= n) */
    int32_t *k; /* [n_out][n] fixed-point weights */
} rs_taps;

static double rs_bicubic(double x) {
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

static void rs_taps_free(rs_taps *t) {
    free(t->first);
    free(t->count);
    free(t->k);
}

/* The windows and weights that take n_in samples to n_out (Resample.c: precompute_coeffs and
 * normalize_coeffs_8bpc). */
static ts_status rs_taps_make(int n_in, int n_out, rs_taps *t) {
    double scale = (double)n_in / n_out;
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 2.0 * filterscale;
    t->n = (int)ceil(support) * 2 + 1;
    t->first = malloc((size_t)n_out * sizeof *t->first);
    t->count = malloc((size_t)n_out * sizeof *t->count);
    t->k = calloc((size_t)n_out * (size_t)t->n, sizeof *t->k);
    double *w = malloc((size_t)t->n * sizeof *w);
    if (!t->first || !t->count || !t->k || !w) {
        free(w);
        rs_taps_free(t);
        return ts_error(TS_ERR_NOMEM, "image resize: no memory for the filter weights");
    }
    const double ss = 1.0 / filterscale;
    for (int xx = 0; xx < n_out; xx++) {
        double center = (xx + 0.5) * scale;
        int xmin = (int)(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        int xmax = (int)(center + support + 0.5);
        if (xmax > n_in) xmax = n_in;
        int cnt = xmax - xmin;
        if (cnt > t->n) cnt = t->n; /* cannot happen (the window is at most 2 * support + 1) */
        double ww = 0.0;
        for (int x = 0; x < cnt; x++) {
            w[x] = rs_bicubic((x + xmin - center + 0.5) * ss);
            ww += w[x];
        }
        int32_t *k = t->k + (size_t)xx * t->n;
        for (int x = 0; x < cnt; x++) {
            double v = ww != 0.0 ? w[x] / ww : w[x];
            k[x] =
                v < 0 ? (int32_t)(-0.5 + v * (1 << RS_FRAC)) : (int32_t)(0.5 + v * (1 << RS_FRAC));
        }
        t->first[xx] = xmin;
        t->count[xx] = cnt < 0 ? 0 : cnt;
    }
    free(w);
    return TS_OK;
}

/* A fixed-point sum (with its half already added) back to a sample: PIL's clip8. */
static inline uint8_t rs_clip8(int32_t v) {
    if (v < 0) return 0;
    v >>= RS_FRAC;
    return v > 255 ? 255 : (uint8_t)v;
}

/* One row of the horizontal pass: src has the source width, dst n_out pixels. */
static void rs_row_h(const uint8_t *src, uint8_t *dst, int n_out, const rs_taps *t) {
    for (int xx = 0; xx < n_out; xx++) {
        const int32_t *k = t->k + (size_t)xx * t->n;
        const uint8_t *s = src + (size_t)t->first[xx] * 3;
        int32_t s0 = 1 << (RS_FRAC - 1), s1 = s0, s2 = s0;
        for (int x = 0; x < t->count[xx]; x++) {
            s0 += s[3 * x] * k[x];
            s1 += s[3 * x + 1] * k[x];
            s2 += s[3 * x + 2] * k[x];
        }
        dst[3 * xx] = rs_clip8(s0);
        dst[3 * xx + 1] = rs_clip8(s1);
        dst[3 * xx + 2] = rs_clip8(s2);
    }
}

/* One row of the vertical pass: rows[y] are the count source rows of the window (n bytes
 * each), acc is scratch for n sums. Integer sums, so the order of the terms does not matter. */
static void rs_row_v(const uint8_t *const *rows, const int32_t *k, int count, size_t n,
                     int32_t *acc, uint8_t *dst) {
    for (size_t i = 0; i < n; i++)
        acc[i] = 1 << (RS_FRAC - 1);
    for (int y = 0; y < count; y++) {
        const uint8_t *r = rows[y];
        int32_t ky = k[y];
        for (size_t i = 0; i < n; i++)
            acc[i] += r[i] * ky;
    }
    for (size_t i = 0; i < n; i++)
        dst[i] = rs_clip8(acc[i]);
}

static ts_status rs_check(const ts_image *src, int width, int height, ts_image **out) {
    if (!src || !src->rgb || !out) return ts_error(TS_ERR_INVALID, "image resize: no image");
    if (src->width < 1 || src->height < 1)
        return ts_error(TS_ERR_INVALID, "image resize: source size %dx%d has no pixels", src->width,
                        src->height);
    if (width < 1 || height < 1)
        return ts_error(TS_ERR_INVALID, "image resize: target size %dx%d has no pixels", width,
                        height);
    TS_TRY(img_check_size("image resize source", (uint64_t)src->width, (uint64_t)src->height));
    return img_check_size("image resize target", (uint64_t)width, (uint64_t)height);
}

ts_status ts_image_resize(const ts_image *src, int width, int height, ts_image **out) {
    TS_TRY(rs_check(src, width, height, out));
    const int sw = src->width, sh = src->height;
    const bool need_h = width != sw, need_v = height != sh;
    rs_taps th = {0}, tv = {0};
    uint8_t *ring = NULL;
    const uint8_t **rows = NULL;
    int32_t *acc = NULL;
    ts_image *img = NULL;
    ts_status st = img_alloc(width, height, &img);
    if (st == TS_OK && need_h) st = rs_taps_make(sw, width, &th);
    if (st == TS_OK && need_v) st = rs_taps_make(sh, height, &tv);
    if (st != TS_OK) goto done;

    const size_t in_row = (size_t)sw * 3, out_row = (size_t)width * 3;
    /* Pillow 13's choice of order (Resample.c, ImagingResampleInner: horizontal_first) */
    const bool vertical_first = sh - height > 0 && sh - height > (sw - width) * 2;
    if (need_v && need_h && vertical_first) {
        uint8_t *mid = malloc(in_row);
        const uint8_t **win = malloc((size_t)tv.n * sizeof *win);
        acc = malloc(in_row * sizeof *acc);
        if (!mid || !win || !acc) {
            free(mid);
            free(win);
            st = ts_error(TS_ERR_NOMEM, "image resize: no memory for %dx%d", width, height);
            goto done;
        }
        for (int yy = 0; yy < height; yy++) {
            for (int y = 0; y < tv.count[yy]; y++)
                win[y] = src->rgb + (size_t)(tv.first[yy] + y) * in_row;
            rs_row_v(win, tv.k + (size_t)yy * tv.n, tv.count[yy], in_row, acc, mid);
            rs_row_h(mid, img->rgb + yy * out_row, width, &th);
        }
        free(mid);
        free(win);
        goto done;
    }
    if (!need_v) { /* also the plain copy when neither side changes, as PIL copies */
        for (int y = 0; y < sh; y++) {
            if (need_h)
                rs_row_h(src->rgb + y * in_row, img->rgb + y * out_row, width, &th);
            else
                memcpy(img->rgb + y * out_row, src->rgb + y * in_row, out_row);
        }
        goto done;
    }
    /* ring of horizontally resampled rows: source row y lives in slot y % tv.n while a window
     * needs it (windows only move down and hold at most tv.n rows) */
    rows = malloc((size_t)tv.n * sizeof *rows);
    acc = malloc(out_row * sizeof *acc);
    if (need_h) ring = malloc((size_t)tv.n * out_row);
    if (!rows || !acc || (need_h && !ring)) {
        st = ts_error(TS_ERR_NOMEM, "image resize: no memory for %dx%d", width, height);
        goto done;
    }
    int next = 0; /* the first source row not yet in the ring */
    for (int yy = 0; yy < height; yy++) {
        const int lo = tv.first[yy], cnt = tv.count[yy];
        if (need_h) {
            if (next < lo) next = lo;
            for (; next < lo + cnt; next++)
                rs_row_h(src->rgb + next * in_row, ring + (size_t)(next % tv.n) * out_row, width,
                         &th);
        }
        for (int y = 0; y < cnt; y++)
            rows[y] = need_h ? ring + (size_t)((lo + y) % tv.n) * out_row
                             : src->rgb + (size_t)(lo + y) * in_row;
        rs_row_v(rows, tv.k + (size_t)yy * tv.n, cnt, out_row, acc, img->rgb + yy * out_row);
    }

done:
    rs_taps_free(&th);
    rs_taps_free(&tv);
    free(ring);
    free(rows);
    free(acc);
    if (st != TS_OK) {
        ts_image_free(img);
        return st;
    }
    *out = img;
    return TS_OK;
}
