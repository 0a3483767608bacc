/* Decoding ahead on the device (backend.h, step_can_hold and the six ops after it): a greedy
 * step's argmax keeps its ids on the device, the next step's embedding rows are gathered there
 * from them, and the launch queue holds that next step until the engine launches or drops it
 * (cq_launch in cuda_queue.cuh). */
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_int.cuh"

/* Rows the fed keys hold before they must grow; growing frees the old buffer, which a held
 * step may read, so it flushes (and breaks a held step). */
#define FED_MIN_ROWS 256

static bool ahead_can_hold(ts_backend *be) {
    cuda_ctx *c = cuda_of(be);
    return !c->failed && cq_can_hold(c);
}

/* The next n_rows fed keys of the step being queued (NULL on failure). */
static unsigned long long *fed_take(cuda_ctx *c, int n_rows) {
    int need = c->fed_rows + n_rows;
    if (need > c->fed_cap) {
        int cap = need < FED_MIN_ROWS ? FED_MIN_ROWS : 2 * need;
        cq_flush(c); /* queued work may read the old keys */
        cuda_free_dev(c, c->fed_keys);
        c->fed_keys = NULL;
        c->fed_cap = 0;
        if (!cuda_check(c,
                        cudaMalloc((void **)&c->fed_keys, (size_t)cap * sizeof(unsigned long long)),
                        "fed keys"))
            return NULL;
        c->fed_cap = cap;
    }
    unsigned long long *keys = c->fed_keys + c->fed_rows;
    c->fed_rows = need;
    return keys;
}

/* argmax_held; the keys it writes (device) returned, null where nothing was queued. */
static unsigned long long *argmax_held_keys(cuda_ctx *c, const float *x, int64_t ldx, int n_rows,
                                            int n_cols, int32_t *out_host) {
    if (!cuda_argmax_ready(c, n_rows, n_cols)) return NULL; /* before the staging: it may flush */
    unsigned long long *keys = fed_take(c, n_rows);
    size_t bytes = (size_t)n_rows * sizeof(unsigned long long);
    unsigned long long *h = (unsigned long long *)cq_stage(c, bytes);
    if (!h) { /* the staging arena is full (or the held step broken): flushing empties it */
        cq_flush(c);
        h = (unsigned long long *)cq_stage(c, bytes);
    }
    if (!keys || !h) { /* a broken held step is dropped whole: not a failure of the device */
        if (!cq_broken(c)) cuda_check(c, cudaErrorMemoryAllocation, "argmax staging");
        return NULL;
    }
    if (!cuda_argmax_keys(c, x, ldx, n_rows, n_cols, keys, h)) return NULL;
    cq_defer d = {cuda_keys_done, h, out_host, n_rows, NULL};
    cq_defer_add(c, &d);
    return keys;
}

static void ahead_argmax_held(ts_backend *be, const float *x, int64_t ldx, int n_rows, int n_cols,
                              int32_t *out_host) {
    if (n_rows > 0) argmax_held_keys(cuda_of(be), x, ldx, n_rows, n_cols, out_host);
}

/* sample_held's draws; the keys they write (device) returned, null where nothing was queued. */
static unsigned long long *sample_held_keys(cuda_ctx *c, float *x, int64_t ldx, int n_rows,
                                            int n_cols, const ts_sample_req *req,
                                            int32_t *out_host) {
    bool draw = false;
    for (int r = 0; r < n_rows; r++)
        draw |= req[r].temperature > 0;
    /* the penalties first, as the sample op applies them; the engine gives the held step the
     * lists as they are at its launch (ahead_sample_held_adjust) */
    cuda_sample_adjust(c, x, ldx, n_rows, n_cols, req);
    if (!draw) /* greedy rows only: the argmax, as the sample op does */
        return argmax_held_keys(c, x, ldx, n_rows, n_cols, out_host);
    unsigned long long *keys = fed_take(c, n_rows);
    return keys && cuda_sample_held(c, x, ldx, n_rows, n_cols, req, keys, out_host) ? keys : NULL;
}

static bool ahead_sample_held(ts_backend *be, float *x, int64_t ldx, int n_rows, int n_cols,
                              const ts_sample_req *req, int32_t *out_host) {
    return n_rows <= 0 || sample_held_keys(cuda_of(be), x, ldx, n_rows, n_cols, req, out_host);
}

static bool ahead_sample_fits(ts_backend *be, const ts_sample_req *r, const ts_sample_req *lp,
                              int n_cols) {
    cuda_ctx *c = cuda_of(be);
    return (r->n_adjust <= 0 || c->held_adjust) && cuda_sample_ends(c, r, n_cols) &&
           (!lp || cuda_logprobs_fit(c, lp, n_cols));
}

static bool ahead_sample_held_logprobs(ts_backend *be, float *x, int64_t ldx, int n_rows,
                                       int n_cols, const ts_sample_req *req,
                                       const ts_sample_req *lp_req, int32_t *out_host,
                                       ts_sample_res *lp, float *chosen) {
    cuda_ctx *c = cuda_of(be);
    if (n_rows <= 0) return true;
    for (int r = 0; r < n_rows; r++)
        if (!ahead_sample_fits(be, &req[r], &lp_req[r], n_cols)) return false;
    /* before anything is queued: growing the parts flushes, which breaks a held step */
    if (!cuda_logprobs_ready(c, n_rows, n_cols)) return false;
    const unsigned long long *keys = sample_held_keys(c, x, ldx, n_rows, n_cols, req, out_host);
    return keys && cuda_logprobs_held(c, x, ldx, n_rows, n_cols, lp_req, keys, lp, chosen);
}

/* out[i] = W[id_i] * scale with id_i the argmax of key i: one block a row, the CPU
 * dequantizer's values (group8 is its formulas term for term; test_cuda compares the bits
 * with get_rows for every weight type). A key of 0 (a row of NaN) reads row 0, as the host's
 * argmax answers. */
template <ts_dtype DT>
__global__ static void k_get_rows_fed(const uint8_t *W, size_t row_bytes, int64_t rows,
                                      int64_t cols, const unsigned long long *keys, float scale,
                                      float *out) {
    cuda_pdl_entry();
    int64_t id = cuda_argmax_key_index(keys[blockIdx.x]);
    if (id >= rows) id = 0; /* never a key the argmax wrote */
    const uint8_t *row = W + (size_t)id * row_bytes;
    float *o = out + (size_t)blockIdx.x * cols;
    for (int64_t e = 8 * (int64_t)threadIdx.x; e < cols; e += 8 * (int64_t)blockDim.x) {
        float w[8];
        group8<DT>(row, e, w);
#pragma unroll
        for (int i = 0; i < 8; i++)
            o[e + i] = scale != 1.0f ? w[i] * scale : w[i];
    }
}

static bool ahead_get_rows_fed(ts_backend *be, const ts_tensor *W, int n, float scale, float *out) {
    cuda_ctx *c = cuda_of(be);
    if (n <= 0) return true;
    if (!c->fed_keys || n > c->fed_cap || ts_tensor_cols(W) % 8 != 0) return false;
    if (!cuda_weight_resident(c, W)) {
        /* an embedding that is not also the output head goes to the device at its first
         * gather - only where it leaves room: an optimisation must not run the device out of
         * memory (a failed allocation would fail the backend) */
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
            cudaGetLastError();
            return false;
        }
        if (cuda_weight_bytes(W) > free_b / 2) return false;
    }
    cuda_wview w;
    if (!cuda_weight(c, W, &w)) return false;
    size_t rb = cuda_row_bytes(w.dtype, w.cols);
    const uint8_t *d = (const uint8_t *)w.data;
    const unsigned long long *k = c->fed_keys;
    int th = w.cols >= 1024 ? 128 : 32;
    switch (w.dtype) {
#define FED(DT)                                                                                    \
    case DT:                                                                                       \
        cuda_launch(c, "get_rows_fed", k_get_rows_fed<DT>, n, th, 0, d, rb, w.rows, w.cols, k,     \
                    scale, out);                                                                   \
        return true;
        FED(TS_DTYPE_F32)
        FED(TS_DTYPE_F16)
        FED(TS_DTYPE_BF16)
        FED(TS_DTYPE_Q8_0)
        FED(TS_DTYPE_Q4_0)
        FED(TS_DTYPE_Q5_0)
        FED(TS_DTYPE_Q4_K)
        FED(TS_DTYPE_Q6_K)
#undef FED
    default: return false;
    }
}

static bool ahead_sample_held_adjust(ts_backend *be, const ts_sample_req *req, int n_rows) {
    /* with TESSERA_CUDA_HELD_ADJUST=0 no held step has adjustments (ahead_sample_fits): only
     * requests without them are the held one's */
    return cuda_sample_held_adjust(cuda_of(be), req, n_rows);
}

static void ahead_step_launch(ts_backend *be) {
    cuda_ctx *c = cuda_of(be);
    c->held_adj.on = false; /* what is held next records its own */
    cq_launch(c, true);
    c->fed_rows = 0;
}

static bool ahead_step_seal(ts_backend *be) { return cq_seal(cuda_of(be)); }

static void ahead_step_wait(ts_backend *be) { cq_wait(cuda_of(be)); }

static void ahead_step_drop(ts_backend *be) {
    cuda_ctx *c = cuda_of(be);
    cq_drop(c);
    c->fed_rows = 0;
    c->held_adj.on = false;
}

void cuda_ahead_ops(ts_backend_ops *o) {
    o->step_can_hold = ahead_can_hold;
    o->argmax_held = ahead_argmax_held;
    o->sample_held_fits = ahead_sample_fits;
    o->sample_held = ahead_sample_held;
    o->sample_held_logprobs = ahead_sample_held_logprobs;
    o->sample_held_adjust = ahead_sample_held_adjust;
    o->get_rows_fed = ahead_get_rows_fed;
    o->step_launch = ahead_step_launch;
    o->step_seal = ahead_step_seal;
    o->step_wait = ahead_step_wait;
    o->step_drop = ahead_step_drop;
}
