/* libFuzzer target for the image readers (ts_image_decode: PNG, JPEG, WebP) and, on what
 * decodes, the resampler (ts_image_resize). The input is the file itself. Invariants: a refusal
 * is one of the documented statuses with a message; an image is within the limits; a resize of
 * it to a small size derived from its own size succeeds, and a resize to its own size is a
 * copy. */
#include "fuzz_util.h"
#include "tessera.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ts_image *img = NULL;
    ts_status st = ts_image_decode(data, size, &img);
    if (st != TS_OK) {
        FZ_ASSERT(st == TS_ERR_FORMAT || st == TS_ERR_UNSUPPORTED || st == TS_ERR_RANGE ||
                  st == TS_ERR_NOMEM);
        FZ_ASSERT(ts_last_error()[0]);
        return 0;
    }
    FZ_ASSERT(img && img->rgb && img->width > 0 && img->height > 0);
    FZ_ASSERT(img->width <= TS_IMAGE_MAX_SIDE && img->height <= TS_IMAGE_MAX_SIDE);
    FZ_ASSERT((int64_t)img->width * img->height <= TS_IMAGE_MAX_PIXELS);
    size_t n = (size_t)img->width * img->height * 3;
    fz_touch(img->rgb, n);

    /* down or up to a few dozen pixels a side: every branch of the resampler (both pass
     * orders, one pass, a copy) at a cost that stays small */
    int w = 1 + (img->width * 7 + 3) % 40, h = 1 + (img->height * 5 + 1) % 40;
    ts_image *out = NULL;
    FZ_ASSERT(ts_image_resize(img, w, h, &out) == TS_OK);
    FZ_ASSERT(out->width == w && out->height == h);
    fz_touch(out->rgb, (size_t)w * h * 3);
    ts_image_free(out);
    if (n <= 3 * 4096) {
        FZ_ASSERT(ts_image_resize(img, img->width, img->height, &out) == TS_OK);
        FZ_ASSERT(memcmp(out->rgb, img->rgb, n) == 0);
        ts_image_free(out);
    }
    ts_image_free(img);
    return 0;
}
