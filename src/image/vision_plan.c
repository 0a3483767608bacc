/* How an image enters a model with a vision tower: the size it is resized to and its patch
 * grid (the Qwen2-VL processor's smart_resize), and the rotary positions of a prompt that holds
 * images (Qwen3.5's MRoPE). specs/models.md C.3, C.7. Pure arithmetic on ts_vision_info, so
 * preparation can plan a request's images before the model runs. */
#include "base/status.h"
#include "tessera.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* smart_resize's arithmetic, the image processor's and the video processor's: n frames of h x w
 * (an image: one frame, steps of one), the sides rounded to multiples of f, then scaled down
 * or up so that the frames (their count rounded to steps of tf) hold min_px..max_px pixels. */
static void fit_pixels(double h, double w, int n, int tf, int f, double min_px, double max_px,
                       double *h_out, double *w_out) {
    /* Python's round() is to the nearest, ties to even: nearbyint in the default mode */
    double hb = nearbyint(h / f) * f, wb = nearbyint(w / f) * f,
           tb = nearbyint((double)n / tf) * tf;
    double px = (double)n * h * w;
    if (tb * hb * wb > max_px) {
        double beta = sqrt(px / max_px);
        hb = fmax(f, floor(h / beta / f) * f);
        wb = fmax(f, floor(w / beta / f) * f);
    } else if (tb * hb * wb < min_px) {
        double beta = sqrt(min_px / px);
        hb = ceil(h * beta / f) * f;
        wb = ceil(w * beta / f) * f;
    }
    *h_out = hb, *w_out = wb;
}

ts_status ts_vision_plan(const ts_vision_info *v, int width, int height, ts_image_plan *out) {
    if (width < 1 || height < 1)
        return ts_error(TS_ERR_RANGE, "image of %dx%d pixels", width, height);
    int lo = width < height ? width : height, hi = width < height ? height : width;
    if ((double)hi / lo > 200)
        return ts_error(TS_ERR_RANGE, "image of %dx%d: aspect ratio %.0f is over 200", width,
                        height, (double)hi / lo);
    double h, w;
    fit_pixels(height, width, 1, 1, v->patch_size * v->merge_size, (double)v->min_pixels,
               (double)v->max_pixels, &h, &w);
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

/* np.linspace(0, last, n).round(): i * (last / (n - 1)) in double, the last place exactly
 * `last`, rounded half to even (numpy's round) */
static void linspace_round(int64_t last, int n, int64_t *out) {
    double step = n > 1 ? (double)last / (n - 1) : 0;
    for (int i = 0; i < n; i++)
        out[i] = (int64_t)nearbyint(i == n - 1 && n > 1 ? (double)last : i * step);
}

/* The video processor's smart_resize: the frames' size, for n frames of width x height, into
 * *w_out, *h_out (sides under the factor first scaled up, as the video processor does) */
static ts_status video_resize(const ts_vision_info *v, int n, int width, int height,
                              int64_t max_pixels, int *w_out, int *h_out) {
    int f = v->patch_size * v->merge_size, tf = v->temporal_patch_size;
    double h = height, w = width;
    if (h < f || w < f) { /* Python's int() of the scaled sides: toward zero */
        double scale = fmax(f / h, f / w);
        h = trunc(h * scale), w = trunc(w * scale);
    }
    double lo = fmin(h, w), hi = fmax(h, w);
    if (hi / lo > 200)
        return ts_error(TS_ERR_RANGE, "video of %dx%d: aspect ratio %.0f is over 200", width,
                        height, hi / lo);
    double hb, wb;
    fit_pixels(h, w, n, tf, f, (double)v->video_min_pixels, (double)max_pixels, &hb, &wb);
    if (hb > TS_IMAGE_MAX_SIDE || wb > TS_IMAGE_MAX_SIDE || hb * wb > TS_IMAGE_MAX_PIXELS)
        return ts_error(TS_ERR_RANGE,
                        "video of %dx%d would be resized to %.0fx%.0f, over the limits", width,
                        height, wb, hb);
    *w_out = (int)wb, *h_out = (int)hb;
    return TS_OK;
}

void ts_video_plan_free(ts_video_plan *p) {
    if (!p) return;
    free(p->indices);
    free(p->seconds);
    memset(p, 0, sizeof *p);
}

ts_status ts_video_plan_make(const ts_vision_info *v, const ts_video_info *vid, double fps,
                             ts_video_plan *out) {
    memset(out, 0, sizeof *out);
    if (v->video_token < 0 || v->temporal_patch_size < 1)
        return ts_error(TS_ERR_UNSUPPORTED, "the model takes no videos");
    int tf = v->temporal_patch_size;
    if (vid->n_frames < 1 || vid->width < 1 || vid->height < 1)
        return ts_error(TS_ERR_RANGE, "a video of %lld frames of %dx%d", (long long)vid->n_frames,
                        vid->width, vid->height);
    /* sample_frames: the stream's rate (24 where it has none, as the processor assumes) */
    double rate = vid->fps > 0 ? vid->fps : 24.0, want = fps > 0 ? fps : v->video_fps;
    double nd = trunc((double)vid->n_frames / rate * want); /* Python's int() */
    int64_t n = nd > INT32_MAX ? INT32_MAX : (int64_t)nd;
    if (n < v->video_min_frames) n = v->video_min_frames;
    if (n > v->video_max_frames) n = v->video_max_frames;
    if (n > vid->n_frames) n = vid->n_frames;
    if (n < tf)
        return ts_error(TS_ERR_RANGE, "a video of %lld frame(s): the model takes at least %d",
                        (long long)vid->n_frames, tf);
    int nf = (int)n, steps = (nf + tf - 1) / tf;
    int64_t max_pixels = v->video_max_pixels;
    if (v->video_max_frame_tokens > 0) { /* cap_pixels_per_frame */
        int64_t f = v->patch_size * v->merge_size, cap = (int64_t)v->video_max_frame_tokens * f * f;
        int64_t share = v->video_max_pixels / nf, floor_px = (int64_t)(v->video_min_pixels * 1.05);
        int64_t per = share < cap ? share : cap;
        max_pixels = (per > floor_px ? per : floor_px) * nf;
    }
    int w = 0, h = 0;
    TS_TRY(video_resize(v, nf, vid->width, vid->height, max_pixels, &w, &h));
    out->indices = malloc((size_t)nf * sizeof *out->indices);
    out->seconds = malloc((size_t)steps * sizeof *out->seconds);
    if (!out->indices || !out->seconds) {
        ts_video_plan_free(out);
        return ts_error(TS_ERR_NOMEM, "out of memory");
    }
    linspace_round(vid->n_frames - 1, nf, out->indices);
    /* the processor's _calculate_timestamps: the last index repeated to fill the last step,
     * each step's time the mean of its first and last frames' */
    for (int s = 0; s < steps; s++) {
        int a = s * tf, b = a + tf - 1 < nf ? a + tf - 1 : nf - 1;
        out->seconds[s] = (out->indices[a] / rate + out->indices[b] / rate) / 2;
    }
    out->n_frames = nf, out->n_steps = steps;
    out->step = (ts_image_plan){.width = w,
                                .height = h,
                                .grid_h = h / v->patch_size,
                                .grid_w = w / v->patch_size,
                                .video = true};
    out->step.n_tokens = out->step.grid_h * out->step.grid_w / (v->merge_size * v->merge_size);
    return TS_OK;
}

ts_status ts_vision_rope_positions(const ts_vision_info *v, const int32_t *ids, int n,
                                   const ts_image_plan *plans, int n_images, int32_t *rope_pos,
                                   int32_t *delta) {
    int64_t p = 0; /* the next position */
    int k = 0;
    for (int i = 0; i < n;) {
        if (ids[i] != v->image_token && (v->video_token < 0 || ids[i] != v->video_token)) {
            rope_pos[3 * i] = rope_pos[3 * i + 1] = rope_pos[3 * i + 2] = (int32_t)p++;
            i++;
            continue;
        }
        if (k >= n_images)
            return ts_error(TS_ERR_INVALID, "token %d: an image token past the %d image(s)", i,
                            n_images);
        const ts_image_plan *pl = &plans[k];
        int32_t tok = pl->video ? v->video_token : v->image_token;
        int gh = pl->grid_h / v->merge_size, gw = pl->grid_w / v->merge_size;
        if (pl->n_tokens != gh * gw || i + pl->n_tokens > n)
            return ts_error(TS_ERR_INVALID, "image %d: %d tokens do not fit the prompt", k,
                            pl->n_tokens);
        for (int j = 0; j < pl->n_tokens; j++) {
            if (ids[i + j] != tok)
                return ts_error(TS_ERR_INVALID,
                                "image %d: %d %s tokens where its plan takes "
                                "%d",
                                k, j, pl->video ? "video" : "image", pl->n_tokens);
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
