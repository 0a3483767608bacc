/* A decoded frame into packed RGB as PyAV 18 (FFmpeg 8.1) makes it with to_ndarray("rgb24"), done
 * with Debian's libswscale 6 (FFmpeg 5.1). Its conversions are the same code as 8.1's but for one
 * step: chroma halved vertically, on swscale's general path (4:2:0 of odd height or more than 8
 * bits, 4:4:0), which video_chroma.c computes as 8.1 does before swscale 6 sees the frame.
 *
 * PyAV's VideoReformatter hands both frames to sws_scale_frame with flags SWS_BILINEAR and
 * nothing else (primaries and transfer are blanked for the call, so no colour mapping runs).
 * FFmpeg 8's sws_scale_frame builds a graph from the frames' tags (libswscale/graph.c,
 * format.c): one legacy swscale context, set up as below, per field. We build that context with
 * the 5.1 API:
 *   - range: the frame's color_range is full only when tagged JPEG, or for the yuvj formats,
 *     grey and RGB-like formats (ff_fmt_from_frame forces those); the output is full range;
 *   - matrix: sws_getCoefficients(frame->colorspace), set after the context is initialised
 *     (sws_setColorspaceDetails); a colour space swscale's graph refuses (sws_test_colorspace)
 *     makes PyAV raise, so it is refused here too;
 *   - chroma siting: the frame's chroma_location (unspecified: centre) as src_h/v_chr_pos
 *     (get_chroma_pos), which the bilinear chroma upsampling of the general path uses;
 *   - an interlaced frame is two fields, each converted alone (every other row, half height,
 *     its chroma siting moved for the field), as the graph converts them;
 *   - the output rows are as long as av_frame_get_buffer(align 16) makes them, as PyAV's are:
 *     the SSSE3 yuv2rgb path converts 8 pixels at a time and skips the last ones of a row when
 *     the stride cannot hold them; with this stride it never does. */
#include "base/status.h"
#include "image/video_int.h"

#include <libavcodec/avcodec.h>
#include <libavutil/frame.h>
#include <libavutil/opt.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
#include <string.h>

static int rgb_full_range(const AVFrame *f, const AVPixFmtDescriptor *desc) {
    if (desc->flags & (AV_PIX_FMT_FLAG_RGB | AV_PIX_FMT_FLAG_PAL | AV_PIX_FMT_FLAG_BAYER)) return 1;
    if (desc->nb_components < 3) return !(desc->flags & AV_PIX_FMT_FLAG_FLOAT); /* grey */
    switch (f->format) {
    case AV_PIX_FMT_YUVJ420P:
    case AV_PIX_FMT_YUVJ411P:
    case AV_PIX_FMT_YUVJ422P:
    case AV_PIX_FMT_YUVJ444P:
    case AV_PIX_FMT_YUVJ440P: return 1;
    default: return f->color_range == AVCOL_RANGE_JPEG;
    }
}

/* sws_test_colorspace of FFmpeg 8 */
static int rgb_colorspace_ok(enum AVColorSpace csp) {
    switch (csp) {
    case AVCOL_SPC_UNSPECIFIED:
    case AVCOL_SPC_RGB:
    case AVCOL_SPC_BT709:
    case AVCOL_SPC_BT470BG:
    case AVCOL_SPC_SMPTE170M:
    case AVCOL_SPC_FCC:
    case AVCOL_SPC_SMPTE240M:
    case AVCOL_SPC_BT2020_NCL: return 1;
    default: return 0;
    }
}

static int rgb_interlaced(const AVFrame *f) {
#ifdef AV_FRAME_FLAG_INTERLACED
    return (f->flags & AV_FRAME_FLAG_INTERLACED) != 0;
#else
    return f->interlaced_frame != 0;
#endif
}

/* get_chroma_pos of libswscale/graph.c: the siting in 1/256 of a luma sample, -513 for a
 * direction that is not subsampled. */
static void rgb_chroma_pos(const AVFrame *f, const AVPixFmtDescriptor *desc, int fields, int field,
                           int *h_pos, int *v_pos) {
    const int sub_x = desc->log2_chroma_w, sub_y = desc->log2_chroma_h;
    enum AVChromaLocation loc = sub_x || sub_y ? f->chroma_location : AVCHROMA_LOC_UNSPECIFIED;
    if (loc == AVCHROMA_LOC_UNSPECIFIED || (unsigned)loc >= AVCHROMA_LOC_NB)
        loc = AVCHROMA_LOC_CENTER;
    int x = 128, y = 128;
    avcodec_enum_to_chroma_pos(&x, &y, loc);
    x *= (1 << sub_x) - 1;
    y *= (1 << sub_y) - 1;
    if (sub_y && fields == 2) { /* a field's chroma rows sit beside its own luma rows */
        if (field == 1) y += (256 << sub_y) - 256;
        y >>= 1;
    }
    *h_pos = sub_x ? x : -513;
    *v_pos = sub_y ? y : -513;
}

typedef struct {
    int format, width, height, full, csp, h_pos, v_pos;
} rgb_src;

static struct SwsContext *rgb_context(const rgb_src *in) {
    struct SwsContext *s = sws_alloc_context();
    if (!s) return NULL;
    if (av_opt_set_int(s, "sws_flags", SWS_BILINEAR, 0) < 0 ||
        av_opt_set_int(s, "srcw", in->width, 0) < 0 ||
        av_opt_set_int(s, "srch", in->height, 0) < 0 ||
        av_opt_set_pixel_fmt(s, "src_format", (enum AVPixelFormat)in->format, 0) < 0 ||
        av_opt_set_int(s, "dstw", in->width, 0) < 0 ||
        av_opt_set_int(s, "dsth", in->height, 0) < 0 ||
        av_opt_set_pixel_fmt(s, "dst_format", AV_PIX_FMT_RGB24, 0) < 0 ||
        av_opt_set_int(s, "src_range", in->full, 0) < 0 ||
        av_opt_set_int(s, "dst_range", 1, 0) < 0 ||
        av_opt_set_int(s, "src_h_chr_pos", in->h_pos, 0) < 0 ||
        av_opt_set_int(s, "src_v_chr_pos", in->v_pos, 0) < 0 ||
        sws_init_context(s, NULL, NULL) < 0) {
        sws_freeContext(s);
        return NULL;
    }
    /* the graph's "set correct color matrices": the frame's matrix, the ranges init settled */
    int *inv, *table, in_full, out_full, brightness, contrast, saturation;
    sws_getColorspaceDetails(s, &inv, &in_full, &table, &out_full, &brightness, &contrast,
                             &saturation);
    sws_setColorspaceDetails(s, sws_getCoefficients(in->csp), in_full,
                             sws_getCoefficients(AVCOL_SPC_RGB), out_full, brightness, contrast,
                             saturation);
    return s;
}

/* Chroma halved vertically (4:2:0, 4:4:0) that swscale converts on its general path (not the
 * 8-bit, even-height special converter), where versions 6 and 9 differ: video_chroma.c stands
 * in. */
static int rgb_general_vsub(const AVPixFmtDescriptor *desc, int format, int height) {
    if (!(desc->flags & AV_PIX_FMT_FLAG_PLANAR) || (desc->flags & AV_PIX_FMT_FLAG_BE) ||
        (desc->flags & AV_PIX_FMT_FLAG_RGB) || desc->nb_components < 3 || desc->log2_chroma_w > 1 ||
        desc->log2_chroma_h != 1)
        return 0;
    const int fast = desc->comp[0].depth == 8 && !(height & 1) &&
                     (format == AV_PIX_FMT_YUV420P || format == AV_PIX_FMT_YUVJ420P ||
                      format == AV_PIX_FMT_YUVA420P);
    return !fast;
}

/* One field (or the whole frame) of f into dst: rows field, field + fields, ... */
static ts_status rgb_field(const AVFrame *f, const AVPixFmtDescriptor *desc, AVFrame *dst,
                           int fields, int field) {
    const int height = fields == 1 ? f->height : (f->height + (field == 0)) >> 1;
    if (height < 1) return TS_OK;
    const int rgb_like =
        (desc->flags & (AV_PIX_FMT_FLAG_RGB | AV_PIX_FMT_FLAG_PAL | AV_PIX_FMT_FLAG_BAYER)) != 0;
    rgb_src in = {.format = f->format,
                  .width = f->width,
                  .height = height,
                  .full = rgb_full_range(f, desc),
                  .csp = rgb_like                  ? AVCOL_SPC_RGB
                         : desc->nb_components < 3 ? AVCOL_SPC_UNSPECIFIED
                                                   : f->colorspace};
    rgb_chroma_pos(f, desc, fields, field, &in.h_pos, &in.v_pos);
    const uint8_t *src[4] = {0};
    int stride[4] = {0};
    for (int i = 0; i < 4 && f->data[i]; i++) {
        /* a palette (data[1]) is not a plane: it is not moved */
        int plane = !(desc->flags & AV_PIX_FMT_FLAG_PAL) || i == 0;
        src[i] = f->data[i] + (plane ? field * f->linesize[i] : 0);
        stride[i] = f->linesize[i] * (plane ? fields : 1);
    }
    vid_planes tmp = {0};
    if (rgb_general_vsub(desc, f->format, height)) {
        int r = vid_chroma_vsub(src, stride, f->width, height, desc->comp[0].depth,
                                desc->log2_chroma_w, in.h_pos, in.v_pos, &tmp);
        if (r < 0) return ts_error(TS_ERR_NOMEM, "video: no memory for a frame's chroma");
        if (r == 0) {
            for (int i = 0; i < 3; i++) {
                src[i] = tmp.data[i];
                stride[i] = tmp.linesize[i];
            }
            src[3] = NULL;
            stride[3] = 0;
            in.format = tmp.format;
            in.h_pos = tmp.h_pos;
            in.v_pos = -513;
        }
    }
    struct SwsContext *s = rgb_context(&in);
    ts_status st = TS_OK;
    if (!s) {
        st = ts_error(TS_ERR_UNSUPPORTED, "video: %s frames are not converted to RGB", desc->name);
    } else {
        uint8_t *out[4] = {dst->data[0] + field * dst->linesize[0]};
        int out_stride[4] = {dst->linesize[0] * fields};
        int r = sws_scale(s, src, stride, 0, height, out, out_stride);
        sws_freeContext(s);
        if (r != height) st = vid_averror(TS_ERR_FORMAT, "a frame cannot be converted", r);
    }
    vid_planes_free(&tmp);
    return st;
}

ts_status vid_frame_rgb(const AVFrame *f, ts_image **out) {
    const AVPixFmtDescriptor *desc = av_pix_fmt_desc_get((enum AVPixelFormat)f->format);
    if (!desc || (desc->flags & AV_PIX_FMT_FLAG_HWACCEL))
        return ts_error(TS_ERR_UNSUPPORTED, "video: frames of pixel format %d are not converted",
                        f->format);
    if (f->width > TS_IMAGE_MAX_SIDE || f->height > TS_IMAGE_MAX_SIDE ||
        (int64_t)f->width * f->height > (int64_t)TS_IMAGE_MAX_PIXELS)
        return ts_error(TS_ERR_RANGE, "video: a frame of %dx%d is over the limit", f->width,
                        f->height);
    if (f->width < 1 || f->height < 1)
        return ts_error(TS_ERR_FORMAT, "video: a frame of %dx%d", f->width, f->height);
    if (!rgb_colorspace_ok(f->colorspace))
        return ts_error(TS_ERR_UNSUPPORTED, "video: colour space %s is not converted to RGB",
                        av_color_space_name(f->colorspace) ? av_color_space_name(f->colorspace)
                                                           : "(unknown)");
    AVFrame *dst = av_frame_alloc();
    if (!dst)
        return ts_error(TS_ERR_NOMEM, "video: no memory for a %dx%d frame", f->width, f->height);
    dst->format = AV_PIX_FMT_RGB24;
    dst->width = f->width;
    dst->height = f->height;
    ts_status st =
        av_frame_get_buffer(dst, 16) < 0
            ? ts_error(TS_ERR_NOMEM, "video: no memory for a %dx%d frame", f->width, f->height)
            : TS_OK;
    const int fields = rgb_interlaced(f) ? 2 : 1;
    for (int field = 0; field < fields && st == TS_OK; field++)
        st = rgb_field(f, desc, dst, fields, field);
    ts_image *img = NULL;
    if (st == TS_OK) st = img_alloc(f->width, f->height, &img);
    if (st == TS_OK) {
        const size_t row = (size_t)f->width * 3;
        for (int y = 0; y < f->height; y++)
            memcpy(img->rgb + y * row, dst->data[0] + (size_t)y * dst->linesize[0], row);
        *out = img;
    }
    av_frame_free(&dst);
    return st;
}
