/* 4:2:0 chroma upsampled as FFmpeg 8's libswscale upsamples it, for the frames Debian's
 * libswscale 6 would upsample differently.
 *
 * Both versions convert 8-bit 4:2:0 of even height to RGB with the same special converter, and
 * 4:2:2, 4:4:4 and grey with the same general path, byte for byte. They differ in one place: on
 * the general path (4:2:0 of odd height, or deeper than 8 bits) the vertical chroma filter has
 * two taps per output row, and swscale 6's yuv2packed1 output then uses one chroma row or the
 * average of two (its uvalpha < 2048 test), where swscale 9's blends the two rows with the
 * filter's weights: U = (hf0 * c0 + hf1 * c1 + (1 << 18)) >> 19, hf the 15-bit horizontally
 * filtered chroma. So for those frames we compute swscale 9's U ourselves and hand swscale 6 a
 * 4:2:2 frame of the same depth whose chroma is U << (depth - 8): its 4:2:2 path then reads
 * exactly U back ((v << (15 - depth)) + 64) >> 7, clamped at 32767 as both versions clamp), and
 * the luma, untouched, goes the same way in both versions.
 *
 * The filters are those libswscale's initFilter makes for SWS_BILINEAR without user vectors
 * (the generic branch: three taps reduced to two, borders folded in, normalised with error
 * diffusion), reimplemented to give the same coefficients, x86's filter alignment (2 vertical,
 * 4 horizontal) included. Checked against
 * PyAV's swscale on 10-bit and odd-height streams of every chroma siting (src/image/README.md).
 *
 * An odd width makes swscale interpolate chroma horizontally inside its output function
 * (SWS_FULL_CHR_H_INT), with two bits more than a 15-bit chroma sample can carry through the
 * 4:2:2 route; there the vertical blend is handed over at 14 bits and the result is close to
 * swscale 9's, not equal (measured in the README). */
#include "base/status.h"
#include "image/video_int.h"

#include <libavutil/mem.h>
#include <libavutil/pixfmt.h>
#include <stdlib.h>
#include <string.h>

#define CUTOFF 0.002 /* SWS_MAX_REDUCE_CUTOFF */

typedef struct {
    int size;      /* taps a row */
    int32_t *pos;  /* [dst_n] first source sample */
    int16_t *coef; /* [dst_n][size], summing to `one` */
} chr_filter;

static void chr_filter_free(chr_filter *f) {
    free(f->pos);
    free(f->coef);
}

static int64_t rounded_div(int64_t a, int64_t b) {
    return (a >= 0 ? a + (b >> 1) : a - (b >> 1)) / b;
}

/* get_local_pos of libswscale/utils.c: a siting in 1/256 of a sample of the subsampled plane */
static int local_pos(int subsample, int pos) {
    if (pos == -1 || pos <= -513) pos = (128 << subsample) - 128;
    return (pos + 128) >> subsample;
}

static int ilog2(unsigned v) {
    int n = 0;
    while (v >>= 1)
        n++;
    return n;
}

/* initFilter (libswscale/utils.c) for SWS_BILINEAR without user filter vectors. */
static int chr_filter_init(chr_filter *f, int src_n, int dst_n, int xinc, int src_pos, int dst_pos,
                           int one, int align) {
    const int ratio = ilog2((unsigned)(src_n / dst_n));
    const int64_t fone = (int64_t)1 << (54 - (ratio < 8 ? ratio : 8));
    int size = 1;
    memset(f, 0, sizeof *f);
    if (abs(xinc - 0x10000) >= 10 || src_pos != dst_pos) {
        size = xinc <= 1 << 16 ? 3 : 1 + (2 * src_n + dst_n - 1) / dst_n; /* bilinear: 2 */
        if (size > src_n - 2) size = src_n - 2;
    }
    if (size < 1) size = 1;
    int64_t *filter = calloc((size_t)dst_n * size + 4, sizeof *filter);
    f->pos = malloc(((size_t)dst_n + 3) * sizeof *f->pos);
    if (!filter || !f->pos) {
        free(filter);
        return -1;
    }
    if (abs(xinc - 0x10000) < 10 && src_pos == dst_pos) { /* unscaled */
        for (int i = 0; i < dst_n; i++) {
            filter[i] = fone;
            f->pos[i] = i;
        }
    } else {
        int64_t x = ((dst_pos * (int64_t)xinc) >> 7) - ((src_pos * 0x10000LL) >> 7);
        for (int i = 0; i < dst_n; i++) {
            int xx = (int)((x - (size - 2) * (1LL << 16)) / (1 << 17));
            f->pos[i] = xx;
            for (int j = 0; j < size; j++, xx++) {
                int64_t d = llabs((int64_t)xx * (1 << 17) - x) << 13;
                if (xinc > 1 << 16) d = d * dst_n / src_n;
                int64_t c = (1 << 30) - d;
                filter[i * size + j] = (c < 0 ? 0 : c) * (fone >> 30);
            }
            x += 2 * (int64_t)xinc;
        }
    }
    /* reduce: drop near-zero taps on the left (shifting), count those on the right */
    int min_size = 0;
    for (int i = dst_n - 1; i >= 0; i--) {
        int64_t cut = 0;
        int min = size;
        for (int j = 0; j < size; j++) {
            cut += llabs(filter[i * size]);
            if (cut > CUTOFF * fone || (i < dst_n - 1 && f->pos[i] >= f->pos[i + 1])) break;
            memmove(filter + i * size, filter + i * size + 1, (size_t)(size - 1) * sizeof *filter);
            filter[i * size + size - 1] = 0;
            f->pos[i]++;
        }
        cut = 0;
        for (int j = size - 1; j > 0; j--) {
            cut += llabs(filter[i * size + j]);
            if (cut > CUTOFF * fone) break;
            min--;
        }
        if (min > min_size) min_size = min;
    }
    if (min_size == 1 && align == 2) align = 1; /* x86's unscaled vertical case */
    const int fs = (min_size + align - 1) & ~(align - 1);
    int64_t *g = calloc((size_t)dst_n * fs, sizeof *g);
    f->coef = calloc((size_t)dst_n * fs, sizeof *f->coef);
    if (!g || !f->coef) {
        free(filter);
        free(g);
        chr_filter_free(f);
        return -1;
    }
    for (int i = 0; i < dst_n; i++)
        for (int j = 0; j < fs && j < size; j++)
            g[i * fs + j] = filter[i * size + j];
    free(filter);
    f->size = fs;
    for (int i = 0; i < dst_n; i++) { /* fix borders */
        int64_t *row = g + i * fs;
        if (f->pos[i] < 0) {
            for (int j = 1; j < fs; j++) {
                int left = j + f->pos[i] > 0 ? j + f->pos[i] : 0;
                row[left] += row[j];
                row[j] = 0;
            }
            f->pos[i] = 0;
        }
        if (f->pos[i] + fs > src_n) {
            int shift = f->pos[i] + (fs - src_n < 0 ? fs - src_n : 0);
            int64_t acc = 0;
            for (int j = fs - 1; j >= 0; j--)
                if (f->pos[i] + j >= src_n) {
                    acc += row[j];
                    row[j] = 0;
                }
            for (int j = fs - 1; j >= 0; j--)
                row[j] = j < shift ? 0 : row[j - shift];
            f->pos[i] -= shift;
            row[src_n - 1 - f->pos[i]] += acc;
        }
        int64_t sum = 0, error = 0;
        for (int j = 0; j < fs; j++)
            sum += row[j];
        sum = (sum + one / 2) / one;
        if (!sum) sum = 1;
        for (int j = 0; j < fs; j++) {
            int64_t v = row[j] + error;
            int iv = (int)rounded_div(v, sum);
            f->coef[i * fs + j] = (int16_t)iv;
            error = v - iv * sum;
        }
    }
    free(g);
    return 0;
}

static inline int sample(const uint8_t *row, int x, int depth) {
    return depth > 8 ? ((const uint16_t *)row)[x] : row[x];
}

static inline void put(uint8_t *row, int x, int depth, int v) {
    if (depth > 8)
        ((uint16_t *)row)[x] = (uint16_t)v;
    else
        row[x] = (uint8_t)v;
}

static enum AVPixelFormat fmt_422(int depth) {
    switch (depth) {
    case 8: return AV_PIX_FMT_YUV422P;
    case 9: return AV_PIX_FMT_YUV422P9;
    case 10: return AV_PIX_FMT_YUV422P10;
    case 12: return AV_PIX_FMT_YUV422P12;
    case 14: return AV_PIX_FMT_YUV422P14;
    default: return AV_PIX_FMT_NONE;
    }
}

void vid_planes_free(vid_planes *p) {
    for (int i = 0; i < 3; i++)
        av_freep(&p->buf[i]);
}

static int plane_alloc(vid_planes *p, int i, int w, int h, int bytes) {
    p->linesize[i] = (w * bytes + 63) & ~63;
    p->buf[i] = av_mallocz((size_t)p->linesize[i] * h + 64); /* SIMD reads past a row */
    p->data[i] = p->buf[i];
    return p->buf[i] ? 0 : -1;
}

/* Even width: swscale 9's U and V (the horizontal filter to half width: of the frame's siting
 * for 4:2:0, halving for 4:4:0; then the vertical blend), as same-depth 4:2:2 samples. */
static int chroma_exact(const uint8_t *const src[3], const int stride[3], int w, int h, int depth,
                        int sub_x, int h_pos, const chr_filter *vf, vid_planes *out) {
    const int src_cw = sub_x ? w / 2 : w, cw = w / 2, ch = (h + 1) / 2;
    chr_filter hf;
    if (chr_filter_init(&hf, src_cw, cw, (int)((((int64_t)src_cw << 16) + (cw >> 1)) / cw),
                        local_pos(sub_x, h_pos), local_pos(1, -513), 1 << 14, 4))
        return -1;
    int16_t *rows = malloc((size_t)2 * ch * cw * sizeof *rows); /* [plane][row][x] 15-bit */
    int r = rows ? 0 : -1;
    for (int c = 0; c < 2 && !r; c++)
        for (int k = 0; k < ch; k++)
            for (int x = 0; x < cw; x++) {
                int val = 0;
                for (int j = 0; j < hf.size; j++)
                    val += sample(src[c + 1] + (size_t)k * stride[c + 1], hf.pos[x] + j, depth) *
                           hf.coef[x * hf.size + j];
                val >>= depth > 8 ? depth - 1 : 7;
                rows[((size_t)c * ch + k) * cw + x] = (int16_t)(val < 32767 ? val : 32767);
            }
    const int bytes = depth > 8 ? 2 : 1;
    for (int c = 0; c < 2 && !r; c++) {
        if (plane_alloc(out, c + 1, cw, h, bytes)) r = -1;
        for (int y = 0; y < h && !r; y++) {
            const int p = vf->pos[y];
            const int16_t *c0 = rows + ((size_t)c * ch + p) * cw;
            const int16_t *c1 = vf->size == 2 ? c0 + cw : c0;
            const int w0 = vf->size == 2 ? vf->coef[2 * y] : 4096, w1 = 4096 - w0;
            for (int x = 0; x < cw; x++) {
                int u = (c0[x] * w0 + c1[x] * w1 + (1 << 18)) >> 19;
                put(out->data[c + 1] + (size_t)y * out->linesize[c + 1], x, depth,
                    u << (depth - 8));
            }
        }
    }
    free(rows);
    chr_filter_free(&hf);
    out->data[0] = (uint8_t *)src[0];
    out->linesize[0] = stride[0];
    out->format = fmt_422(depth);
    out->h_pos = -513;
    return r;
}

/* Odd width: the vertical blend at 14 bits (4:2:2 or 4:4:4, 14-bit, the luma scaled to 14
 * bits); swscale 6 interpolates horizontally at the frame's siting. */
static int chroma_close(const uint8_t *const src[3], const int stride[3], int w, int h, int depth,
                        int sub_x, int h_pos, const chr_filter *vf, vid_planes *out) {
    const int cw = sub_x ? (w + 1) / 2 : w, up = 14 - depth;
    if (plane_alloc(out, 0, w, h, 2) || plane_alloc(out, 1, cw, h, 2) ||
        plane_alloc(out, 2, cw, h, 2))
        return -1;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            put(out->data[0] + (size_t)y * out->linesize[0], x, 14,
                sample(src[0] + (size_t)y * stride[0], x, depth) << up);
    for (int c = 1; c < 3; c++)
        for (int y = 0; y < h; y++) {
            const int p = vf->pos[y];
            const uint8_t *r0 = src[c] + (size_t)p * stride[c];
            const uint8_t *r1 = vf->size == 2 ? r0 + stride[c] : r0;
            const int w0 = vf->size == 2 ? vf->coef[2 * y] : 4096, w1 = 4096 - w0;
            for (int x = 0; x < cw; x++) {
                int64_t s = (int64_t)sample(r0, x, depth) * w0 + (int64_t)sample(r1, x, depth) * w1;
                put(out->data[c] + (size_t)y * out->linesize[c], x, 14,
                    (int)(((s << up) + 2048) >> 12));
            }
        }
    out->format = sub_x ? AV_PIX_FMT_YUV422P14 : AV_PIX_FMT_YUV444P14;
    out->h_pos = h_pos;
    return 0;
}

int vid_chroma_vsub(const uint8_t *const src[3], const int stride[3], int w, int h, int depth,
                    int sub_x, int h_pos, int v_pos, vid_planes *out) {
    memset(out, 0, sizeof *out);
    if (fmt_422(depth) == AV_PIX_FMT_NONE || w < 1 || h < 1 || sub_x < 0 || sub_x > 1) return 1;
    const int ch = (h + 1) / 2;
    chr_filter vf;
    if (chr_filter_init(&vf, ch, h, (int)((((int64_t)ch << 16) + (h >> 1)) / h),
                        local_pos(1, v_pos), local_pos(0, -513), 1 << 12, 2))
        return -1;
    /* swscale takes its one-row-or-blend output path only for 1 or 2 taps summing to 4096 */
    int ok = vf.size <= 2;
    for (int y = 0; y < h && ok && vf.size == 2; y++)
        ok = vf.coef[2 * y] + vf.coef[2 * y + 1] == 4096 && (unsigned)vf.coef[2 * y + 1] <= 4096 &&
             vf.pos[y] + 1 < ch;
    int r = !ok          ? 1
            : w % 2 == 0 ? chroma_exact(src, stride, w, h, depth, sub_x, h_pos, &vf, out)
                         : chroma_close(src, stride, w, h, depth, sub_x, h_pos, &vf, out);
    chr_filter_free(&vf);
    if (r) vid_planes_free(out);
    return r;
}
