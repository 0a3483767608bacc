/* The geometry of a vision tower's patch grid, shared by the backends' vision_patches and
 * vision_positions ops (backend.h) so that the CPU and the GPU place and weigh each patch with
 * the same fp32 arithmetic. Patches are enumerated merge x merge block by block (the patches a
 * merger joins are consecutive), row-major over the blocks and within each. */
#ifndef TS_BACKEND_VISION_GRID_H
#define TS_BACKEND_VISION_GRID_H

#include <math.h>

#ifdef __CUDACC__
#define TS_GRID_FN static inline __host__ __device__
#else
#define TS_GRID_FN static inline
#endif

/* Patch n's grid row and column, of a grid grid_w patches wide. */
TS_GRID_FN void ts_grid_patch_rc(int n, int grid_w, int merge, int *row, int *col) {
    int bw = grid_w / merge, blk = n / (merge * merge), in = n % (merge * merge);
    *row = blk / bw * merge + in / merge;
    *col = blk % bw * merge + in % merge;
}

/* One axis of the bilinear resampling of a side x side table to `size` places (align_corners):
 * place `index`'s two taps and their weights, in fp32 as transformers computes them. */
TS_GRID_FN void ts_grid_taps(int index, int size, int side, int tap[2], float w[2]) {
    float src = (float)index * (float)(side - 1) / (float)(size > 1 ? size - 1 : 1);
    float f = floorf(src);
    tap[0] = (int)f < side - 1 ? (int)f : side - 1;
    tap[1] = (int)f + 1 < side - 1 ? (int)f + 1 : side - 1;
    w[0] = fmaxf(1.0f - fabsf(src - f), 0.0f);
    w[1] = fmaxf(1.0f - fabsf(src - f - 1.0f), 0.0f);
}

#endif
