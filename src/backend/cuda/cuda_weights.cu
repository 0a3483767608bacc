/* Weights on the device: each tensor is uploaded the first time an op uses it and kept until the
 * backend is destroyed, keyed by its host data pointer (a model's tensors stay put while it is
 * open), its host pages then given back to the model file (ts_mmap_release). Every weight type
 * keeps its blocks on the device - the kernels decode them as they stream them - and Q6_K's,
 * Q8_0's, Q4_0's and Q5_0's are regrouped for alignment (cuda_int.cuh, q6k_dev_block,
 * q32_dev_codes). */
#include "backend/cuda/cuda_int.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unordered_map>

extern "C" {
#include "backend/cpu/matmul.h"
#include "base/mmapfile.h"
}

struct cuda_wentry {
    cuda_wview view;
    ts_dtype src_dtype;
    uint64_t src_bytes;
};

struct cuda_weight_cache {
    std::unordered_map<const void *, cuda_wentry> map;
};

/* The dtypes the device kernels read in their own layout (cuda_matmul.cu); any other would be
 * widened to F32 at upload. */
static bool native_dtype(ts_dtype t) {
    switch (t) {
    case TS_DTYPE_F32: case TS_DTYPE_F16: case TS_DTYPE_BF16: case TS_DTYPE_Q8_0:
    case TS_DTYPE_Q4_0: case TS_DTYPE_Q5_0: case TS_DTYPE_Q4_K: case TS_DTYPE_Q6_K: return true;
    default: return false;
    }
}

/* Writes host row r of W in the device's layout at dst (row_bytes bytes). */
typedef void (*row_fill)(const ts_tensor *W, int64_t r, int64_t cols, uint8_t *dst);

/* rows of W in a layout of the host's making (fill), row_bytes each, to dev: in slices of about
 * 64 MiB through one host buffer, so that the staging stays small. */
static bool upload_rows(cuda_ctx *c, const ts_tensor *W, int64_t rows, int64_t cols,
                        size_t row_bytes, row_fill fill, uint8_t *dev) {
    if (rows <= 0) return true;
    int64_t per = ((int64_t)1 << 26) / (int64_t)(row_bytes ? row_bytes : 1);
    if (per < 1) per = 1;
    if (per > rows) per = rows;
    uint8_t *host = (uint8_t *)malloc((size_t)per * row_bytes);
    if (!host) return cuda_check(c, cudaErrorMemoryAllocation, "weight staging");
    bool ok = true;
    for (int64_t r0 = 0; ok && r0 < rows; r0 += per) {
        int64_t n = rows - r0 < per ? rows - r0 : per;
        for (int64_t r = 0; r < n; r++)
            fill(W, r0 + r, cols, host + (size_t)r * row_bytes);
        /* complete before the staging buffer is refilled */
        ok = cuda_upload_now(c, dev + (size_t)r0 * row_bytes, host, (size_t)n * row_bytes,
                             "weight upload");
    }
    free(host);
    return ok;
}

/* a type the kernels do not read, widened to F32 */
static void fill_f32(const ts_tensor *W, int64_t r, int64_t cols, uint8_t *dst) {
    (void)cols;
    cpu_dequant_row(W, r, (float *)dst);
}

/* Q6_K in the device's layout: each block's ql, qh and scales (its first 208 bytes) where
 * q6k_dev_block puts them, its d where q6k_dev_d does; padding zero. */
static void fill_q6k(const ts_tensor *W, int64_t r, int64_t cols, uint8_t *dst) {
    size_t hrb = ts_dtype_row_bytes(TS_DTYPE_Q6_K, cols);
    const uint8_t *src = (const uint8_t *)W->data + (size_t)r * hrb;
    memset(dst, 0, cuda_row_bytes(TS_DTYPE_Q6_K, cols));
    for (int64_t b = 0; b < cols / 256; b++) {
        memcpy(dst + q6k_dev_block(b), src + b * 210, Q6K_DEV_BLOCK);
        memcpy(dst + q6k_dev_d(b), src + b * 210 + Q6K_DEV_BLOCK, 2);
    }
}

/* Q8_0, Q4_0, Q5_0 in the device's layout: each block's d, (Q5_0) qh and codes where q32_dev_d,
 * q32_dev_qh and q32_dev_codes put them; unused slots zero. A group at a time, the sizes and
 * offsets constants of the type, so that the copies compile to plain moves: 8-13 GB/s on one
 * core, where block-by-block copies of sizes known at run time made ~4 (a 0.8B Q8_0 file's
 * upload ~0.2 s sooner). */
template <ts_dtype DT>
static void fill_q32(const ts_tensor *W, int64_t r, int64_t cols, uint8_t *dst) {
    constexpr int qh = q32_qh_bytes(DT), nc = q32_code_bytes(DT);
    constexpr size_t blk = 2 + qh + nc; /* the file's block: d, then qh (Q5_0), then the codes */
    const uint8_t *src = (const uint8_t *)W->data + (size_t)r * ts_dtype_row_bytes(DT, cols);
    int64_t nb = cols / 32, tail = nb & 7;
    /* whole groups are written through; a partial last group leaves d and qh slots unused */
    if (tail) memset(dst + q32_dev_d(DT, nb - tail), 0, (size_t)q32_dev_codes(DT, tail));
    for (int64_t g0 = 0; g0 < nb; g0 += 8) { /* a group: its blocks' offsets are constants */
        const uint8_t *s = src + g0 * blk;
        uint8_t *d = dst + q32_dev_d(DT, g0);
        int n = nb - g0 < 8 ? (int)(nb - g0) : 8;
        for (int i = 0; i < n; i++) {
            memcpy(d + 2 * i, s + i * blk, 2);
            if constexpr (qh > 0) memcpy(d + 16 + qh * i, s + i * blk + 2, qh);
            memcpy(d + 16 + 8 * qh + nc * i, s + i * blk + 2 + qh, nc);
        }
    }
}

/* The row filler of a regrouped type (cuda_regrouped). */
static row_fill regroup_fill(ts_dtype dt) {
    switch (dt) {
    case TS_DTYPE_Q8_0: return fill_q32<TS_DTYPE_Q8_0>;
    case TS_DTYPE_Q4_0: return fill_q32<TS_DTYPE_Q4_0>;
    case TS_DTYPE_Q5_0: return fill_q32<TS_DTYPE_Q5_0>;
    default: return fill_q6k;
    }
}

/* Whether the cached entry e is W's copy (not a stale one of another tensor that reused W's
 * host memory). */
static bool entry_is(const cuda_wentry &e, const ts_tensor *W) {
    return e.src_dtype == W->dtype && e.src_bytes == W->nbytes;
}

size_t cuda_weight_bytes(const ts_tensor *W) {
    ts_dtype dt = native_dtype(W->dtype) ? W->dtype : TS_DTYPE_F32;
    int64_t rows = ts_tensor_rows(W), cols = ts_tensor_cols(W);
    return cuda_regrouped(dt) ? (size_t)rows * cuda_row_bytes(dt, cols)
           : dt == W->dtype   ? (size_t)W->nbytes
                              : (size_t)(rows * cols) * sizeof(float);
}

bool cuda_weight(cuda_ctx *c, const ts_tensor *W, cuda_wview *out) {
    if (!c->weights) {
        c->weights = new (std::nothrow) cuda_weight_cache;
        if (!c->weights) return cuda_check(c, cudaErrorMemoryAllocation, "weight cache");
    }
    auto it = c->weights->map.find(W->data);
    if (it != c->weights->map.end()) {
        const cuda_wentry &e = it->second;
        if (entry_is(e, W)) {
            *out = e.view;
            return true;
        }
        /* the host memory was reused for another tensor: replace the stale copy */
        cq_flush(c); /* queued work may still read the stale copy */
        cuda_free_dev(c, (void *)e.view.data);
        c->weights->map.erase(it);
    }
    cuda_wview v;
    v.rows = ts_tensor_rows(W);
    v.cols = ts_tensor_cols(W);
    v.dtype = native_dtype(W->dtype) ? W->dtype : TS_DTYPE_F32;
    size_t bytes = cuda_weight_bytes(W);
    void *dev = NULL;
    if (!cuda_check(c, cudaMalloc(&dev, bytes ? bytes : 256), "weight alloc")) return false;
    bool ok;
    if (cuda_regrouped(v.dtype))
        ok = upload_rows(c, W, v.rows, v.cols, cuda_row_bytes(v.dtype, v.cols),
                         regroup_fill(v.dtype), (uint8_t *)dev);
    else if (v.dtype == W->dtype)
        ok = cuda_upload_now(c, dev, W->data, bytes, "weight upload");
    else
        ok = upload_rows(c, W, v.rows, v.cols, (size_t)v.cols * sizeof(float), fill_f32,
                         (uint8_t *)dev);
    if (!ok) {
        cudaFree(dev);
        return false;
    }
    v.data = dev;
    c->weights->map[W->data] = cuda_wentry{v, W->dtype, W->nbytes};
    /* the kernels read the device's copy from now on: the host's pages go back to the model file
     * (read from there again if the host's embedding lookup wants rows of them), so that the
     * host does not hold a second copy of the model */
    ts_mmap_release(W->data, W->nbytes);
    *out = v;
    return true;
}

bool cuda_weight_resident(cuda_ctx *c, const ts_tensor *W) {
    if (!c->weights) return false;
    auto it = c->weights->map.find(W->data);
    return it != c->weights->map.end() && entry_is(it->second, W);
}

void cuda_weights_free(cuda_ctx *c) {
    if (!c->weights) return;
    for (auto &kv : c->weights->map) cudaFree((void *)kv.second.view.data);
    delete c->weights;
    c->weights = NULL;
}
