/* WebP with libwebp: decoded to straight (not premultiplied) RGBA with the decoder's default
 * options (fancy upsampling of the chroma, no dithering), which is what PIL's WebPAnimDecoder
 * gives for a still image; alpha is then composited over white. Animated files are refused: a
 * single image is what a prompt holds.
 *
 * Orientation (transformers' load_image applies exif_transpose): PIL takes info["exif"] and
 * info["xmp"] from libwebp's demuxer, WebPDemuxGetChunk(..., 1, ...) of "EXIF" and "XMP ": the
 * first such chunk, which the demuxer stores only in an extended (VP8X) file whose header flags
 * say it has one, and an empty one is not set. We ask the same demuxer, then read them as
 * image_orient.c reads an EXIF block and an XMP packet. A file the demuxer refuses (PIL cannot
 * open it) and an EXIF block whose header is not TIFF (PIL's exif_transpose raises) are read as
 * having no EXIF; never an error. */
#include "base/status.h"
#include "image/image_int.h"

#include <stdlib.h>
#include <webp/decode.h>
#include <webp/demux.h>

static ts_status webp_status(VP8StatusCode s) {
    switch (s) {
    case VP8_STATUS_NOT_ENOUGH_DATA: return ts_error(TS_ERR_FORMAT, "WebP: truncated file");
    case VP8_STATUS_UNSUPPORTED_FEATURE:
        return ts_error(TS_ERR_UNSUPPORTED, "WebP: a feature libwebp does not decode");
    case VP8_STATUS_OUT_OF_MEMORY: return ts_error(TS_ERR_NOMEM, "WebP: out of memory");
    default: return ts_error(TS_ERR_FORMAT, "WebP: damaged data (libwebp status %d)", (int)s);
    }
}

/* The orientation exif_transpose applies (see the top of the file). */
static int webp_orientation(const uint8_t *data, size_t len) {
    WebPData wd = {data, len};
    WebPDemuxer *dmux = WebPDemux(&wd);
    if (!dmux) return 1;
    WebPChunkIterator it;
    int exif = IMG_EXIF_ABSENT;
    if (WebPDemuxGetChunk(dmux, "EXIF", 1, &it)) {
        exif = img_exif_orientation(it.chunk.bytes, it.chunk.size);
        WebPDemuxReleaseChunkIterator(&it);
    }
    if (exif == IMG_EXIF_UNREADABLE) exif = IMG_EXIF_ABSENT;
    WebPChunkIterator xmp = {0}; /* no chunk: no bytes */
    if (exif == IMG_EXIF_ABSENT) WebPDemuxGetChunk(dmux, "XMP ", 1, &xmp);
    int o = img_orientation(exif, xmp.chunk.bytes, xmp.chunk.size);
    WebPDemuxReleaseChunkIterator(&xmp);
    WebPDemuxDelete(dmux);
    return o;
}

ts_status img_decode_webp(const uint8_t *data, size_t len, ts_image **out) {
    WebPDecoderConfig cfg;
    if (!WebPInitDecoderConfig(&cfg)) return ts_error(TS_ERR_UNSUPPORTED, "WebP: libwebp mismatch");
    VP8StatusCode s = WebPGetFeatures(data, len, &cfg.input);
    if (s != VP8_STATUS_OK) return webp_status(s);
    if (cfg.input.has_animation)
        return ts_error(TS_ERR_UNSUPPORTED, "WebP: animated files are not read");
    TS_TRY(img_check_size("WebP", (uint64_t)cfg.input.width, (uint64_t)cfg.input.height));
    int w = cfg.input.width, h = cfg.input.height;
    size_t stride = (size_t)w * 4;
    uint8_t *rgba = malloc(stride * (size_t)h);
    if (!rgba) return ts_error(TS_ERR_NOMEM, "WebP: no memory for %dx%d pixels", w, h);
    cfg.output.colorspace = MODE_RGBA;
    cfg.output.is_external_memory = 1;
    cfg.output.u.RGBA.rgba = rgba;
    cfg.output.u.RGBA.stride = (int)stride;
    cfg.output.u.RGBA.size = stride * (size_t)h;
    s = WebPDecode(data, len, &cfg);
    WebPFreeDecBuffer(&cfg.output); /* frees nothing of ours: the memory is external */
    ts_image *img = NULL;
    ts_status st = s == VP8_STATUS_OK ? img_alloc(w, h, &img) : webp_status(s);
    if (st == TS_OK) {
        uint8_t *o = img->rgb;
        for (size_t i = 0, n = (size_t)w * (size_t)h; i < n; i++) {
            const uint8_t *p = rgba + 4 * i;
            for (int k = 0; k < 3; k++)
                o[3 * i + k] = img_over_white(p[k], p[3]);
        }
    }
    free(rgba);
    if (st == TS_OK) st = img_apply_orientation(img, webp_orientation(data, len));
    if (st == TS_OK)
        *out = img;
    else
        ts_image_free(img);
    return st;
}
