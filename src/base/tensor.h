/* Weight tensors as the loaders hand them to models and kernels.
 *
 * A ts_tensor is a view: `data` points into an mmap'd model file (or an arena the model
 * owns) and stays valid while the model is open. Shapes are outermost-first, as safetensors and
 * Hugging Face write them: a linear layer's weight is [out_features, in_features], row-major.
 * Quantized types store each row as whole blocks (GGUF layouts), so a row is
 * ts_dtype_row_bytes(dtype, in_features) bytes and rows are contiguous. */
#ifndef TS_BASE_TENSOR_H
#define TS_BASE_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    TS_DTYPE_F32,
    TS_DTYPE_F16,
    TS_DTYPE_BF16,
    TS_DTYPE_Q8_0,
    TS_DTYPE_Q4_0,
    TS_DTYPE_Q4_K,
    TS_DTYPE_Q6_K,
    TS_DTYPE_Q5_0,
    TS_DTYPE_COUNT
} ts_dtype;

#define TS_MAX_DIMS 6

typedef struct {
    ts_dtype dtype;
    int n_dims;
    int64_t shape[TS_MAX_DIMS]; /* outermost first; unused dims are 1 */
    const void *data;
    uint64_t nbytes;
} ts_tensor;

const char *ts_dtype_name(ts_dtype t);
/* Elements per block (1 for float types) and bytes per block. */
int ts_dtype_block_elems(ts_dtype t);
int ts_dtype_block_bytes(ts_dtype t);
/* Bytes of one row of n elements; 0 when n is not a whole number of blocks. */
size_t ts_dtype_row_bytes(ts_dtype t, int64_t n);

/* The first n elements of a float tensor (F32, F16 or BF16) as fp32; false for other dtypes. */
bool ts_tensor_to_f32(const ts_tensor *t, float *dst, int64_t n);

static inline int64_t ts_tensor_rows(const ts_tensor *t) {
    int64_t r = 1;
    for (int i = 0; i + 1 < t->n_dims; i++) r *= t->shape[i];
    return r;
}
static inline int64_t ts_tensor_cols(const ts_tensor *t) {
    return t->n_dims ? t->shape[t->n_dims - 1] : 1;
}
static inline int64_t ts_tensor_nelems(const ts_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->n_dims; i++) n *= t->shape[i];
    return n;
}

#endif
