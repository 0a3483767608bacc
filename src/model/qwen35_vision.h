/* Qwen3.5's vision tower (specs/models.md Part C): a ViT over 2x2-merged patches whose output
 * rows stand in for the text model's image-pad tokens, and the processor settings that cut an
 * image into those patches. Loaded from `model.visual.*` of a composite checkpoint. */
#ifndef TS_MODEL_QWEN35_VISION_H
#define TS_MODEL_QWEN35_VISION_H

#include "model/qwen35.h"

typedef struct {
    int depth, hidden, n_heads, head_dim, n_ff, out_hidden;
    int patch, temporal, merge, in_ch;
    int grid_side; /* the learned position table is grid_side x grid_side */
    float rope_theta;
    ts_vision_info info; /* processor settings and the vision token ids */
    float mean[3], std[3];
    double rescale; /* 1/255: pixels to [0, 1] */
} qwen35_vision_hp;

typedef struct {
    float *n1w, *n1b, *n2w, *n2b, *qkv_b, *proj_b, *fc1_b, *fc2_b;
    const ts_tensor *qkv, *proj, *fc1, *fc2;
} qwen35_vblock;

struct qwen35_vision {
    qwen35_vision_hp hp;
    ts_tensor patch_w; /* [hidden][in_ch * temporal * patch * patch]: the Conv3d weight, flat */
    float *patch_b;    /* [hidden] */
    float *pos;        /* [grid_side^2][hidden] */
    qwen35_vblock *blocks;
    float *mnw, *mnb, *mfc1_b, *mfc2_b; /* the merger */
    const ts_tensor *mfc1, *mfc2;
    float *host;   /* one allocation behind every float* above */
    size_t n_host; /* floats in it */
    int64_t n_params;
};

/* Loads the tower when the checkpoint has one (*out NULL, TS_OK when it has none: a text-only
 * checkpoint, or a composite one whose vision weights were left out). text_hidden is the
 * decoder's width, which the merger must produce. */
ts_status qwen35_vision_load(const ts_model *m, int text_hidden, qwen35_vision **out);
void qwen35_vision_free(qwen35_vision *v);
/* Encodes an image already resized to plan's size into plan->n_tokens rows of out_hidden
 * floats (host memory), on be (which must have the vision ops of backend.h). */
ts_status qwen35_vision_encode(const qwen35_vision *v, ts_backend *be, const ts_image *img,
                               const ts_image_plan *plan, float *out);

#endif
