/* The CUDA backend's entry points in a build without CUDA (TESSERA_CUDA=OFF): creation fails with
 * one clear line, so `--device cuda` reports it instead of failing to link. */
#include "backend/cuda/cuda_backend.h"

ts_status ts_backend_cuda_create(int device, ts_backend **out) {
    (void)device;
    *out = NULL;
    return ts_error(TS_ERR_UNSUPPORTED, "tessera was built without CUDA");
}

const char *ts_backend_cuda_device_name(const ts_backend *be) {
    (void)be;
    return NULL;
}

void ts_backend_cuda_graph_stats(const ts_backend *be, long *replays, long *builds,
                                 long *updates) {
    (void)be;
    *replays = *builds = *updates = 0;
}

int ts_backend_cuda_graph_copies(const ts_backend *be) {
    (void)be;
    return -1;
}

long ts_backend_cuda_early_waits(const ts_backend *be) {
    (void)be;
    return 0;
}

long ts_backend_cuda_lt_algos(const ts_backend *be) {
    (void)be;
    return 0;
}

long ts_backend_cuda_queued_ops(const ts_backend *be) {
    (void)be;
    return 0;
}

bool ts_backend_cuda_args_pack_clean(void) { return true; }

long ts_backend_cuda_wg_launches(const ts_backend *be, bool *hopper) {
    (void)be;
    *hopper = false;
    return 0;
}

long ts_backend_cuda_gemv_few_launches(const ts_backend *be) {
    (void)be;
    return 0;
}

long ts_backend_cuda_gemv_pair_launches(const ts_backend *be) {
    (void)be;
    return 0;
}

long ts_backend_cuda_gdn_keep_launches(const ts_backend *be, bool *on) {
    (void)be;
    if (on) *on = false;
    return 0;
}

long ts_backend_cuda_gemv_half_launches(const ts_backend *be) {
    (void)be;
    return 0;
}

long ts_backend_cuda_gemv_x8_staged_launches(const ts_backend *be) {
    (void)be;
    return 0;
}

double ts_backend_cuda_read_bandwidth(int device) {
    (void)device;
    return 0.0;
}
