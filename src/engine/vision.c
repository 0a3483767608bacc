/* Images in a prompt: the vision tower run on the engine's backend (specs/models.md C.3-C.6).
 * How an image is cut and where its tokens sit is image/vision_plan.c. */

#include "engine/engine_int.h"

#include <math.h>

/* The backend ops a vision tower runs on (backend.h: all six or none). */
static bool backend_runs_vision(const ts_backend_ops *op) {
    return op->rope_cs && op->layernorm && op->bias_act && op->attention_full &&
           op->vision_patches && op->vision_positions;
}

bool ts_engine_vision(const ts_engine *e) {
    return e->model->arch->encode_image && ts_model_vision(e->model, NULL) &&
           backend_runs_vision(e->be->ops);
}

/* The tower over frames already at the plan's size; the rows checked finite */
static ts_status encode(ts_engine *e, const ts_image *const *frames, int n_frames,
                        const ts_image_plan *plan, float *out) {
    engine_ahead_drop(e);
    ts_status st = e->model->arch->encode_image(e->rt, frames, n_frames, plan, out);
    if (st == TS_OK) { /* a failed device gives NaN (it says why on stderr): never rows of it */
        ts_model_info mi;
        ts_model_get_info(e->model, &mi);
        size_t n = (size_t)plan->n_tokens * mi.n_embd;
        for (size_t i = 0; i < n; i++)
            if (!isfinite(out[i]))
                return ts_error(TS_ERR_RANGE, "the vision tower's output is not finite (row %zu)",
                                i / mi.n_embd);
    }
    return st;
}

static ts_status vision_check(const ts_engine *e, ts_vision_info *vi) {
    if (!e->model->arch->encode_image || !ts_model_vision(e->model, vi))
        return ts_error(TS_ERR_UNSUPPORTED, "the model takes no images");
    if (!backend_runs_vision(e->be->ops))
        return ts_error(TS_ERR_UNSUPPORTED, "the %s backend runs no vision tower",
                        e->be->ops->name);
    return TS_OK;
}

ts_status ts_engine_encode_image(ts_engine *e, const ts_image *img, const ts_image_plan *p,
                                 float *out) {
    ts_vision_info vi;
    TS_TRY(vision_check(e, &vi));
    if (!img || !img->rgb || img->width < 1 || img->height < 1)
        return ts_error(TS_ERR_INVALID, "no image");
    ts_image_plan plan;
    if (p)
        plan = *p;
    else
        TS_TRY(ts_vision_plan(&vi, img->width, img->height, &plan));
    ts_image *sized = NULL;
    if (plan.width != img->width || plan.height != img->height)
        TS_TRY(ts_image_resize(img, plan.width, plan.height, &sized));
    const ts_image *frame = sized ? sized : img;
    ts_status st = encode(e, &frame, 1, &plan, out);
    ts_image_free(sized);
    return st;
}

ts_status ts_engine_encode_frames(ts_engine *e, const ts_image *const *frames, int n_frames,
                                  const ts_image_plan *plan, float *out) {
    ts_vision_info vi;
    TS_TRY(vision_check(e, &vi));
    if (vi.video_token < 0) return ts_error(TS_ERR_UNSUPPORTED, "the model takes no videos");
    if (!frames || !plan || n_frames != vi.temporal_patch_size)
        return ts_error(TS_ERR_INVALID, "a video step takes %d frames", vi.temporal_patch_size);
    for (int f = 0; f < n_frames; f++)
        if (!frames[f] || !frames[f]->rgb || frames[f]->width != plan->width ||
            frames[f]->height != plan->height)
            return ts_error(TS_ERR_INVALID, "frame %d is not at its plan's size %dx%d", f,
                            plan->width, plan->height);
    return encode(e, frames, n_frames, plan, out);
}
