#include "base/tensor.h"

#include "base/half.h"

#include <string.h>

static const struct {
    const char *name;
    int block_elems;
    int block_bytes;
} dtype_info[TS_DTYPE_COUNT] = {
    [TS_DTYPE_F32] = {"F32", 1, 4},      [TS_DTYPE_F16] = {"F16", 1, 2},
    [TS_DTYPE_BF16] = {"BF16", 1, 2},    [TS_DTYPE_Q8_0] = {"Q8_0", 32, 34},
    [TS_DTYPE_Q4_0] = {"Q4_0", 32, 18},  [TS_DTYPE_Q4_K] = {"Q4_K", 256, 144},
    [TS_DTYPE_Q6_K] = {"Q6_K", 256, 210}, [TS_DTYPE_Q5_0] = {"Q5_0", 32, 22},
};

const char *ts_dtype_name(ts_dtype t) {
    return (unsigned)t < TS_DTYPE_COUNT ? dtype_info[t].name : "?";
}
int ts_dtype_block_elems(ts_dtype t) { return dtype_info[t].block_elems; }
int ts_dtype_block_bytes(ts_dtype t) { return dtype_info[t].block_bytes; }

size_t ts_dtype_row_bytes(ts_dtype t, int64_t n) {
    int be = dtype_info[t].block_elems;
    if (n < 0 || n % be) return 0;
    return (size_t)(n / be) * (size_t)dtype_info[t].block_bytes;
}

bool ts_tensor_to_f32(const ts_tensor *t, float *dst, int64_t n) {
    const unsigned char *p = t->data;
    uint16_t h;
    for (int64_t i = 0; i < n; i++) {
        switch (t->dtype) {
        case TS_DTYPE_F32: memcpy(&dst[i], p + 4 * i, 4); break;
        case TS_DTYPE_F16:
            memcpy(&h, p + 2 * i, 2);
            dst[i] = ts_f16_to_f32(h);
            break;
        case TS_DTYPE_BF16:
            memcpy(&h, p + 2 * i, 2);
            dst[i] = ts_bf16_to_f32(h);
            break;
        default: return false;
        }
    }
    return true;
}
