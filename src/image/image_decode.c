/* ts_image_decode: recognise the format by its magic bytes and hand the file to its reader;
 * the limits, allocation and freeing every reader shares. */
#include "base/status.h"
#include "image/image_int.h"

#include <stdlib.h>
#include <string.h>

ts_status img_check_size(const char *format, uint64_t width, uint64_t height) {
    if (width == 0 || height == 0)
        return ts_error(TS_ERR_FORMAT, "%s: image size %llux%llu has no pixels", format,
                        (unsigned long long)width, (unsigned long long)height);
    if (width > TS_IMAGE_MAX_SIDE || height > TS_IMAGE_MAX_SIDE ||
        width * height > (uint64_t)TS_IMAGE_MAX_PIXELS)
        return ts_error(TS_ERR_RANGE,
                        "%s: image size %llux%llu is over the limit (%d pixels a side, %d in all)",
                        format, (unsigned long long)width, (unsigned long long)height,
                        TS_IMAGE_MAX_SIDE, TS_IMAGE_MAX_PIXELS);
    return TS_OK;
}

ts_status img_alloc(int width, int height, ts_image **out) {
    ts_image *img = malloc(sizeof *img);
    uint8_t *rgb = malloc((size_t)width * (size_t)height * 3);
    if (!img || !rgb) {
        free(img);
        free(rgb);
        return ts_error(TS_ERR_NOMEM, "image: no memory for %dx%d pixels", width, height);
    }
    img->width = width;
    img->height = height;
    img->rgb = rgb;
    *out = img;
    return TS_OK;
}

void ts_image_free(ts_image *img) {
    if (!img) return;
    free(img->rgb);
    free(img);
}

typedef struct {
    const char *name;
    const char *magic;
    size_t len;
    ts_status (*decode)(const uint8_t *data, size_t len, ts_image **out);
} img_format;

/* Formats we read, then formats we only name in the refusal. WebP is "RIFF", a 4-byte size,
 * "WEBP": its entry checks the first 4 bytes, the form type is checked below. */
static const img_format formats[] = {
    {"PNG", "\x89PNG\r\n\x1a\n", 8, img_decode_png},
    {"JPEG", "\xff\xd8\xff", 3, img_decode_jpeg},
    {"WebP", "RIFF", 4, img_decode_webp},
    {"GIF", "GIF8", 4, NULL},
    {"BMP", "BM", 2, NULL},
    {"TIFF", "II*\0", 4, NULL},
    {"TIFF", "MM\0*", 4, NULL},
    {"JPEG 2000", "\0\0\0\x0cjP  ", 8, NULL},
    {"JPEG XL", "\xff\x0a", 2, NULL},
    {"QOI", "qoif", 4, NULL},
    {"ICO", "\0\0\1\0", 4, NULL},
    {"PSD", "8BPS", 4, NULL},
};

static ts_status refuse(const char *what) {
    return ts_error(TS_ERR_UNSUPPORTED, "image: %s is not read (PNG, JPEG and WebP are)", what);
}

ts_status ts_image_decode(const void *data, size_t len, ts_image **out) {
    if (!out || (!data && len)) return ts_error(TS_ERR_INVALID, "image: no data or no output");
    if (len == 0) return ts_error(TS_ERR_FORMAT, "image: empty data");
    const uint8_t *p = data;
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
        const img_format *f = &formats[i];
        size_t n = len < f->len ? len : f->len;
        if (memcmp(p, f->magic, n) != 0 || (n < f->len && !f->decode)) continue;
        if (n < f->len) /* the start of a signature we read: a cut-off file */
            return ts_error(TS_ERR_FORMAT, "image: %zu bytes, cut off inside the %s signature", len,
                            f->name);
        if (!f->decode) return refuse(f->name);
        if (f->decode == img_decode_webp) {
            if (len < 12) return ts_error(TS_ERR_FORMAT, "WebP: truncated RIFF header");
            if (memcmp(p + 8, "WEBP", 4) != 0) return refuse("a RIFF file that is not WebP");
        }
        return f->decode(p, len, out);
    }
    /* AVIF / HEIF: an ISO-BMFF "ftyp" box first */
    if (len >= 12 && memcmp(p + 4, "ftyp", 4) == 0) return refuse("AVIF/HEIF (ISO-BMFF)");
    return refuse("an unknown format");
}
