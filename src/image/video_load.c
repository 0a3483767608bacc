/* A video file to the frames a vision tower takes: ts_video_probe, ts_video_plan_make and
 * ts_video_decode in one call, with the processor's padding of a short last step. */
#include "base/status.h"
#include "image/image_int.h"

#include <stdlib.h>
#include <string.h>

/* A copy of an image, from img_alloc as every image of this module is */
static ts_status image_copy(const ts_image *src, ts_image **out) {
    TS_TRY(img_alloc(src->width, src->height, out));
    memcpy((*out)->rgb, src->rgb, (size_t)src->width * src->height * 3);
    return TS_OK;
}

ts_status ts_video_load(const void *data, size_t len, const ts_vision_info *v, double fps,
                        ts_video_plan *plan, ts_image ***frames) {
    *frames = NULL;
    memset(plan, 0, sizeof *plan);
    ts_video_info info;
    TS_TRY(ts_video_probe(data, len, &info));
    TS_TRY(ts_video_plan_make(v, &info, fps, plan));
    int n = plan->n_steps * v->temporal_patch_size;
    ts_image **f = calloc((size_t)n, sizeof *f);
    ts_status st = f ? ts_video_decode(data, len, plan->indices, plan->n_frames, plan->step.width,
                                       plan->step.height, f)
                     : ts_error(TS_ERR_NOMEM, "out of memory");
    for (int i = plan->n_frames; st == TS_OK && i < n; i++) /* the processor's padding */
        st = image_copy(f[plan->n_frames - 1], &f[i]);
    if (st != TS_OK) {
        for (int i = 0; f && i < n; i++)
            ts_image_free(f[i]);
        free(f);
        ts_video_plan_free(plan);
        return st;
    }
    *frames = f;
    return TS_OK;
}
