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
/* The encoder's place on one backend: the tower's small parameters (uploaded at the first image
 * and kept: ~7 MB for the 0.8B's tower, most of it the learned position table) and the working
 * buffers of the largest image so far, kept while they stay under QWEN35_VENC_KEEP bytes (a
 * 1024x1024 image's are ~170 MB) and freed after an image that needs more. A device backend
 * otherwise paid its allocations, frees and the parameters' upload on every image: ~2 of a
 * 256x256 image's ~5 ms on a GPU. Owned by the text model's runtime (one a backend). */
typedef struct qwen35_venc qwen35_venc;
#define QWEN35_VENC_KEEP ((size_t)256 << 20)
void qwen35_venc_free(qwen35_venc *ws);

/* Encodes an image already resized to plan's size into plan->n_tokens rows of out_hidden
 * floats (host memory), on be (which must have the vision ops of backend.h): one frame (a still
 * image, which fills the patch's whole time axis) or temporal frames (a video's step). *ws: the
 * workspace on be (NULL: made here, and kept in *ws for the next image). */
ts_status qwen35_vision_encode(const qwen35_vision *v, ts_backend *be, qwen35_venc **ws,
                               const ts_image *const *frames, int n_frames,
                               const ts_image_plan *plan, float *out);

#endif
