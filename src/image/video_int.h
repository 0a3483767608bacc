/* What video_decode.c (container, decoder, frame selection) shares with video_rgb.c (a decoded
 * frame turned into RGB as PyAV turns it). Both use the system's libav* (FFmpeg 5.1 on Debian
 * 12); src/image/README.md, "Video", says what is matched and how. */
#ifndef TS_VIDEO_INT_H
#define TS_VIDEO_INT_H

#include "image/image_int.h"

#include <stdint.h>

struct AVFrame;

/* code with "video: what (libav's message for err)"; returns code. */
ts_status vid_averror(ts_status code, const char *what, int err);

/* A decoded frame as packed 8-bit RGB, at its own size, exactly as PyAV 18's
 * VideoFrame.to_ndarray(format="rgb24") converts it (libswscale, bilinear, the frame's colour
 * matrix, range and chroma siting; an interlaced frame field by field). *out is a new image
 * (ts_image_free). TS_ERR_RANGE for a frame over the image limits, TS_ERR_UNSUPPORTED for a
 * colour space or pixel format PyAV's conversion refuses or swscale cannot read, TS_ERR_NOMEM. */
ts_status vid_frame_rgb(const struct AVFrame *f, ts_image **out);

/* Planes standing in for a frame's (video_chroma.c): what swscale 6 is given instead of a 4:2:0
 * frame (or field) that it would convert differently from swscale 9. buf[] are owned (freed by
 * vid_planes_free); data[0] may point into the frame. */
typedef struct {
    uint8_t *data[3];
    int linesize[3];
    int format; /* enum AVPixelFormat */
    int h_pos;  /* the chroma siting swscale is to be told (src_h_chr_pos) */
    uint8_t *buf[3];
} vid_planes;

/* The planes (src, stride) of a w x h frame or field whose chroma is halved vertically (4:2:0,
 * sub_x 1, or 4:4:0, sub_x 0), of the given depth (8, 9, 10, 12 or 14 bits, native endian), its
 * chroma sited at h_pos / v_pos (swscale's src_h/v_chr_pos), as a 4:2:2 (odd width: 4:2:2 or
 * 4:4:4) frame whose conversion by swscale 6 is swscale 9's conversion of the original, exactly
 * for an even width (video_chroma.c says how close for an odd one). 0 and *out filled; 1 when
 * the frame is not one of those (nothing allocated); -1 out of memory. */
int vid_chroma_vsub(const uint8_t *const src[3], const int stride[3], int w, int h, int depth,
                    int sub_x, int h_pos, int v_pos, vid_planes *out);
void vid_planes_free(vid_planes *p);

#endif
