/* How an image enters a model with a vision tower: the size it is resized to and its patch
 * grid (the Qwen2-VL processor's smart_resize), and the rotary positions of a prompt that holds
 * images (Qwen3.5's MRoPE). specs/models.md C.3, C.7. Pure arithmetic on ts_vision_info, so
 * preparation can plan a request's images before the model runs. */
#include "base/status.h"
#include "tessera.h"

#include <math.h>
#include <stdlib.h>

ts_status ts_vision_plan(const ts_vision_info *v, int width, int height, ts_image_plan *out) {
    if (width < 1 || height < 1)
        return ts_error(TS_ERR_RANGE, "image of %dx%d pixels", width, height);
    int lo = width < height ? width : height, hi = width < height ? height : width;
    if ((double)hi / lo > 200)
        return ts_error(TS_ERR_RANGE, "image of %dx%d: aspect ratio %.0f is over 200", width,
                        height, (double)hi / lo);
    int f = v->patch_size * v->merge_size;
    /* Python's round() is to the nearest, ties to even: nearbyint in the default mode */
    double h = nearbyint((double)height / f) * f, w = nearbyint((double)width / f) * f;
    double px = (double)height * width;
    if (h * w > (double)v->max_pixels) {
        double beta = sqrt(px / (double)v->max_pixels);
        h = fmax(f, floor(height / beta / f) * f);
        w = fmax(f, floor(width / beta / f) * f);
    } else if (h * w < (double)v->min_pixels) {
        double beta = sqrt((double)v->min_pixels / px);
        h = ceil(height * beta / f) * f;
        w = ceil(width * beta / f) * f;
    }
    if (h > TS_IMAGE_MAX_SIDE || w > TS_IMAGE_MAX_SIDE || h * w > TS_IMAGE_MAX_PIXELS)
        return ts_error(TS_ERR_RANGE,
                        "image of %dx%d would be resized to %.0fx%.0f, over the "
                        "limits",
                        width, height, w, h);
    *out = (ts_image_plan){.width = (int)w,
                           .height = (int)h,
                           .grid_h = (int)h / v->patch_size,
                           .grid_w = (int)w / v->patch_size};
    out->n_tokens = out->grid_h * out->grid_w / (v->merge_size * v->merge_size);
    return TS_OK;
}

ts_status ts_vision_rope_positions(const ts_vision_info *v, const int32_t *ids, int n,
                                   const ts_image_plan *plans, int n_images, int32_t *rope_pos,
                                   int32_t *delta) {
    int64_t p = 0; /* the next position */
    int k = 0;
    for (int i = 0; i < n;) {
        if (ids[i] != v->image_token) {
            rope_pos[3 * i] = rope_pos[3 * i + 1] = rope_pos[3 * i + 2] = (int32_t)p++;
            i++;
            continue;
        }
        if (k >= n_images)
            return ts_error(TS_ERR_INVALID, "token %d: an image token past the %d image(s)", i,
                            n_images);
        const ts_image_plan *pl = &plans[k];
        int gh = pl->grid_h / v->merge_size, gw = pl->grid_w / v->merge_size;
        if (pl->n_tokens != gh * gw || i + pl->n_tokens > n)
            return ts_error(TS_ERR_INVALID, "image %d: %d tokens do not fit the prompt", k,
                            pl->n_tokens);
        for (int j = 0; j < pl->n_tokens; j++) {
            if (ids[i + j] != v->image_token)
                return ts_error(TS_ERR_INVALID,
                                "image %d: %d image tokens where its plan takes "
                                "%d",
                                k, j, pl->n_tokens);
            int32_t *r = rope_pos + 3 * (size_t)(i + j);
            r[0] = (int32_t)p, r[1] = (int32_t)(p + j / gw), r[2] = (int32_t)(p + j % gw);
        }
        p += gh > gw ? gh : gw;
        i += pl->n_tokens;
        k++;
    }
    if (k != n_images)
        return ts_error(TS_ERR_INVALID, "%d image(s) given, %d in the prompt", n_images, k);
    if (p > INT32_MAX) return ts_error(TS_ERR_RANGE, "rotary positions past 2^31");
    *delta = (int32_t)(p - n);
    return TS_OK;
}
