/* WebP with libwebp: decoded to straight (not premultiplied) RGBA with the decoder's default
 * options (fancy upsampling of the chroma, no dithering), which is what PIL's WebPAnimDecoder
 * gives for a still image; alpha is then composited over white. Animated files are refused:
 * their frames need libwebpdemux, and a single image is what a prompt holds. */
#include "base/status.h"
#include "image/image_int.h"

#include <stdlib.h>
#include <webp/decode.h>

static ts_status webp_status(VP8StatusCode s) {
    switch (s) {
    case VP8_STATUS_NOT_ENOUGH_DATA: return ts_error(TS_ERR_FORMAT, "WebP: truncated file");
    case VP8_STATUS_UNSUPPORTED_FEATURE:
        return ts_error(TS_ERR_UNSUPPORTED, "WebP: a feature libwebp does not decode");
    case VP8_STATUS_OUT_OF_MEMORY: return ts_error(TS_ERR_NOMEM, "WebP: out of memory");
    default: return ts_error(TS_ERR_FORMAT, "WebP: damaged data (libwebp status %d)", (int)s);
    }
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
    ts_status st = s == VP8_STATUS_OK ? img_alloc(w, h, out) : webp_status(s);
    if (st == TS_OK) {
        uint8_t *o = (*out)->rgb;
        for (size_t i = 0, n = (size_t)w * (size_t)h; i < n; i++) {
            const uint8_t *p = rgba + 4 * i;
            for (int k = 0; k < 3; k++)
                o[3 * i + k] = img_over_white(p[k], p[3]);
        }
    }
    free(rgba);
    return st;
}
