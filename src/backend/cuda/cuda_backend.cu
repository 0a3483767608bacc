/* The CUDA backend: the vtable, device buffers, the stream and cuBLAS handle, error recording.
 *
 * Everything runs in order on one stream, through the launch queue (cuda_queue.cuh): ops are
 * recorded and submitted when the host needs a result; download() submits, synchronises and
 * copies, so the host sees every op issued before it. Host data for uploads is staged in pinned
 * memory before the call returns, so callers may reuse their buffers at once. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_int.cuh"

bool cuda_check(cuda_ctx *c, cudaError_t err, const char *what) {
    if (err == cudaSuccess) return true;
    if (!c->failed)
        fprintf(stderr, "tessera: cuda: %s: %s\n", what, cudaGetErrorString(err));
    c->failed = true;
    return false;
}

bool cuda_allow_smem(const cuda_ctx *c, const void *const *kernels, int n, int bytes) {
    if (bytes > c->smem_optin) return false;
    for (int i = 0; i < n; i++)
        if (cudaFuncSetAttribute(kernels[i], cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) !=
            cudaSuccess) {
            cudaGetLastError();
            return false;
        }
    return true;
}

bool cuda_check_blas(cuda_ctx *c, cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return true;
    if (!c->failed) fprintf(stderr, "tessera: cublas: %s: status %d\n", what, (int)st);
    c->failed = true;
    return false;
}

void cuda_free_dev(cuda_ctx *c, void *p) {
    if (!p) return;
    cudaFree(p);
    c->frees++;
}

/* fatal: a failed allocation is the backend's failure (cuda_check); else only NULL */
static void *scratch_get(cuda_ctx *c, int slot, size_t bytes, bool fatal) {
    void **p = &c->scratch[slot];
    size_t *have = &c->scratch_bytes[slot];
    if (*have >= bytes && *p) return *p;
    /* the old buffer may still be read by queued work: run it before freeing the buffer */
    if (*p) {
        cq_flush(c);
        cuda_free_dev(c, *p);
        *p = NULL;
        *have = 0;
    }
    size_t n = bytes < 4096 ? 4096 : bytes + bytes / 4;
    cudaError_t err = cudaMalloc(p, n);
    if (err != cudaSuccess) {
        *p = NULL;
        if (fatal) cuda_check(c, err, "scratch alloc");
        cudaGetLastError(); /* an allocation's failure is not sticky */
        return NULL;
    }
    *have = n;
    return *p;
}

void *cuda_scratch(cuda_ctx *c, int slot, size_t bytes) {
    return scratch_get(c, slot, bytes, true);
}

void *cuda_scratch_try(cuda_ctx *c, int slot, size_t bytes) {
    return scratch_get(c, slot, bytes, false);
}

static void *cu_alloc(ts_backend *be, size_t bytes) {
    cuda_ctx *c = cuda_of(be);
    void *p = NULL;
    /* plain device memory, never managed memory */
    if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
        cudaGetLastError(); /* an allocation failure is reported as NULL, not a sticky error */
        return NULL;
    }
    cuda_memset_async(c, p, bytes, "alloc memset");
    return p;
}

static void cu_free(ts_backend *be, void *buf) {
    cuda_ctx *c = cuda_of(be);
    if (!buf) return;
    cq_flush(c); /* queued work may still use the buffer */
    cuda_free_dev(c, buf);
}

static void cu_upload(ts_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_ctx *c = cuda_of(be);
    cuda_upload_async(c, dst, src, bytes, "upload");
}

static void cu_download(ts_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_ctx *c = cuda_of(be);
    cq_flush(c);
    if (bytes && !c->failed)
        cuda_check(c, cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "download");
    if (c->failed) {
        float nan = nanf("");
        for (size_t i = 0; i + sizeof nan <= bytes; i += sizeof nan)
            memcpy((char *)dst + i, &nan, sizeof nan);
    }
}

static void cu_copy(ts_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_ctx *c = cuda_of(be);
    if (dst != src) cuda_copy_async(c, dst, src, bytes, cudaMemcpyDeviceToDevice, "copy");
}

static void cu_zero(ts_backend *be, void *dst, size_t bytes) {
    cuda_ctx *c = cuda_of(be);
    cuda_memset_async(c, dst, bytes, "zero");
}

static void cu_finish(ts_backend *be) { cq_flush(cuda_of(be)); }

static void cu_destroy(ts_backend *be);

static ts_backend_ops make_ops(void) {
    ts_backend_ops o;
    memset(&o, 0, sizeof o);
    o.name = "cuda";
    o.destroy = cu_destroy;
    o.alloc = cu_alloc;
    o.free = cu_free;
    o.upload = cu_upload;
    o.download = cu_download;
    o.copy = cu_copy;
    o.zero = cu_zero;
    o.finish = cu_finish;
    o.get_rows = cuda_op_get_rows;
    o.matmul = cuda_op_matmul;
    o.rmsnorm = cuda_op_rmsnorm;
    o.l2norm = cuda_op_l2norm;
    o.rope = cuda_op_rope;
    o.add = cuda_op_add;
    o.swiglu = cuda_op_swiglu;
    o.gelu_mul = cuda_op_gelu_mul;
    o.softcap = cuda_op_softcap;
    o.scale_rows = cuda_op_scale_rows;
    o.sigmoid_gate = cuda_op_sigmoid_gate;
    o.copy_rows = cuda_op_copy_rows;
    o.argmax = cuda_op_argmax;
    cuda_ahead_ops(&o);
    o.sample = cuda_op_sample;
    o.sample_logprobs = cuda_op_sample_logprobs;
    o.attention = cuda_op_attention;
    o.conv1d_silu = cuda_op_conv1d_silu;
    o.gdn_gates = cuda_op_gdn_gates;
    o.gdn = cuda_op_gdn;
    o.gated_rmsnorm = cuda_op_gated_rmsnorm;
    o.matmul_n = cuda_op_matmul_n;
    o.matmul_add = cuda_op_matmul_add;
    o.add_rmsnorm = cuda_op_add_rmsnorm;
    o.norm_add_rmsnorm = cuda_op_norm_add_rmsnorm;
    o.l2norm_heads = cuda_op_l2norm_heads;
    o.matmul_glu = cuda_op_matmul_glu;
    o.gdn_prep = cuda_op_gdn_prep;
    o.conv_gdn_prep = cuda_op_conv_gdn_prep;
    o.conv_gdn_step = cuda_op_conv_gdn_step;
    o.attention_step = cuda_op_attention_step;
    o.qk_norm_rope = cuda_op_qk_norm_rope;
    o.conv1d_silu_runs = cuda_op_conv1d_silu_runs;
    o.gdn_runs = cuda_op_gdn_runs;
    o.attention_runs = cuda_op_attention_runs;
    o.rope_cs = cuda_op_rope_cs;
    o.layernorm = cuda_op_layernorm;
    o.bias_act = cuda_op_bias_act;
    o.attention_full = cuda_op_attention_full;
    o.vision_patches = cuda_op_vision_patches;
    o.vision_positions = cuda_op_vision_positions;
    return o;
}

static const ts_backend_ops cuda_ops = make_ops();

extern "C" ts_status ts_backend_cuda_create(int device, ts_backend **out) {
    *out = NULL;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) return ts_error(TS_ERR_UNSUPPORTED, "no CUDA device: %s",
                                            cudaGetErrorString(err));
    if (device < 0 || device >= count)
        return ts_error(TS_ERR_UNSUPPORTED, "no CUDA device: device %d of %d", device, count);
    if ((err = cudaSetDevice(device)) != cudaSuccess)
        return ts_error(TS_ERR_UNSUPPORTED, "no CUDA device: %s", cudaGetErrorString(err));
    cudaDeviceProp prop;
    if ((err = cudaGetDeviceProperties(&prop, device)) != cudaSuccess)
        return ts_error(TS_ERR_UNSUPPORTED, "no CUDA device: %s", cudaGetErrorString(err));
    if (prop.major < 7)
        return ts_error(TS_ERR_UNSUPPORTED, "CUDA device %s: compute capability %d.%d < 7.0",
                        prop.name, prop.major, prop.minor);
    ts_backend *be = (ts_backend *)calloc(1, sizeof *be);
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return ts_error(TS_ERR_NOMEM, "cuda backend: out of memory");
    }
    c->device = device;
    snprintf(c->name, sizeof c->name, "%s", prop.name);
    c->sm_count = prop.multiProcessorCount;
    c->cc = prop.major * 10 + prop.minor;
    c->smem_optin = (int)prop.sharedMemPerBlockOptin;
    c->prefetch = !cuda_env_off("TESSERA_CUDA_PREFETCH");
    c->skinny = !cuda_env_off("TESSERA_CUDA_SKINNY");
    c->attn_split = !cuda_env_off("TESSERA_CUDA_ATTN_SPLIT");
    c->attn_tc = !cuda_env_off("TESSERA_CUDA_ATTN_TC");
    c->attn_mma = !cuda_env_off("TESSERA_CUDA_ATTN_MMA");
    c->fold_norm = !cuda_env_off("TESSERA_CUDA_FOLD_NORM");
    c->split_fused = !cuda_env_off("TESSERA_CUDA_SPLIT_FUSED");
    c->attn_tile = !cuda_env_off("TESSERA_CUDA_ATTN_TILE");
    const char *chunk_min = getenv("TESSERA_CUDA_GDN_CHUNK_MIN");
    c->gdn_chunk_min = chunk_min && atoi(chunk_min) > 0 ? atoi(chunk_min) : 32;
    const char *g1 = getenv("TESSERA_CUDA_GEMV1");
    c->gemv_one_waves = g1 && atoi(g1) >= 0 ? atoi(g1) : 1;
    c->gemv_one_early = !cuda_env_off("TESSERA_CUDA_GEMV1_EARLY");
    const char *xs = getenv("TESSERA_CUDA_GEMV1_XSMEM");
    c->gemv_one_xsmem = xs && atoi(xs) >= 0 && atoi(xs) <= 2 ? atoi(xs) : 1;
    c->gemv_one_kquant = !cuda_env_off("TESSERA_CUDA_GEMV1_KQUANT");
    c->gemv_one_pair = !cuda_env_off("TESSERA_CUDA_GEMV1_PAIR");
    const char *g1t = getenv("TESSERA_CUDA_GEMV1_TOKENS");
    c->gemv_one_tokens = g1t && atoi(g1t) >= 1 && atoi(g1t) <= 3 ? atoi(g1t) : 3;
    const char *i8 = getenv("TESSERA_CUDA_GEMV1_INT8");
    c->gemv_one_int8 = i8 && atoi(i8) >= 0 && atoi(i8) <= 2 ? atoi(i8) : 1;
    c->gemv_one_half = !cuda_env_off("TESSERA_CUDA_GEMV1_HALF");
    c->held_adjust = !cuda_env_off("TESSERA_CUDA_HELD_ADJUST");
    const char *sm = getenv("TESSERA_CUDA_SKINNY_MIN");
    c->skinny_min = sm && atoi(sm) >= 2 && atoi(sm) <= 9 ? atoi(sm) : 0;
    const char *skc = getenv("TESSERA_CUDA_SKINNY_KC");
    c->skinny_kc = skc && atoi(skc) == 1 ? 1 : 2;
    const char *sr = getenv("TESSERA_CUDA_SKINNY_RING");
    c->skinny_ring = sr && atoi(sr) >= 0 && atoi(sr) <= 2 ? atoi(sr) : 2;
    c->qprefill_bf16 = !cuda_env_off("TESSERA_CUDA_QPREFILL_BF16");
    c->gdn_dv_const = !cuda_env_off("TESSERA_CUDA_GDN_DV");
    c->gdn_step = !cuda_env_off("TESSERA_CUDA_GDN_STEP");
    c->gdn_early_store = !cuda_env_off("TESSERA_CUDA_GDN_EARLY_STORE");
    c->gdn_step_runs = !cuda_env_off("TESSERA_CUDA_GDN_STEP_RUNS");
    const char *asr = getenv("TESSERA_CUDA_ATTN_STEP_RUNS");
    c->attn_step_runs = asr ? atoi(asr) : 16;
    c->zero_copy = !cuda_env_off("TESSERA_CUDA_ZERO_COPY");
    c->sample_one = !cuda_env_off("TESSERA_CUDA_SAMPLE_ONE");
    c->sample_end = !cuda_env_off("TESSERA_CUDA_SAMPLE_END");
    c->logprobs_one = !cuda_env_off("TESSERA_CUDA_LOGPROBS_ONE");
    /* a third of L2 (20 MB of the H200's 60; the 0.8B's state is 18 MB) unless told */
    const char *keep = getenv("TESSERA_CUDA_L2_KEEP");
    size_t keep_max = (size_t)prop.persistingL2CacheMaxSize;
    int keep_mb = keep ? atoi(keep) : 0;
    c->l2_keep_want =
        keep ? (size_t)(keep_mb > 0 ? keep_mb : 0) << 20 : (size_t)prop.l2CacheSize / 3;
    if (c->l2_keep_want > keep_max) c->l2_keep_want = keep_max;
    c->attn_step = !cuda_env_off("TESSERA_CUDA_ATTN_STEP");
    c->skinny_mt1 = !cuda_env_off("TESSERA_CUDA_SKINNY_MT1");
    c->skinny_deep = !cuda_env_off("TESSERA_CUDA_SKINNY_DEEP");
    c->skinny_ks16 = !cuda_env_off("TESSERA_CUDA_SKINNY_KS16");
    c->skinny_wg = !cuda_env_off("TESSERA_CUDA_SKINNY_WG");
    const char *wgm = getenv("TESSERA_CUDA_WG_MIN");
    c->wg_min = wgm && atoi(wgm) >= 9 && atoi(wgm) <= 64 ? atoi(wgm) : 9;
    const char *pt = getenv("TESSERA_CUDA_PREP_THREADS");
    c->prep_threads = pt ? (atoi(pt) == 128 ? 128 : ROW_THREADS) : 0;
    const char *pp = getenv("TESSERA_CUDA_PREP_PAIRS");
    c->prep_pairs = pp ? (atoi(pp) ? 1 : 0) : -1;
    be->ops = &cuda_ops;
    be->ctx = c;
    if ((err = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        free(c);
        free(be);
        return ts_error(TS_ERR_UNSUPPORTED, "cuda: cannot create a stream: %s",
                        cudaGetErrorString(err));
    }
    cublasStatus_t bst = cublasCreate(&c->blas);
    if (bst == CUBLAS_STATUS_SUCCESS) bst = cublasSetStream(c->blas, c->stream);
    /* no TF32: the fp32 GEMMs ask for CUBLAS_COMPUTE_32F explicitly (cuda_matmul.cu) */
    if (bst == CUBLAS_STATUS_SUCCESS) bst = cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);
    /* a workspace of its own, so cuBLAS never allocates while a graph is being captured */
    const size_t ws = CUDA_BLAS_WORKSPACE;
    if (bst == CUBLAS_STATUS_SUCCESS && cudaMalloc(&c->blas_workspace, ws) == cudaSuccess)
        bst = cublasSetWorkspace(c->blas, c->blas_workspace, ws);
    if (bst != CUBLAS_STATUS_SUCCESS) {
        if (c->blas) cublasDestroy(c->blas);
        cudaStreamDestroy(c->stream);
        free(c);
        free(be);
        return ts_error(TS_ERR_UNSUPPORTED, "cuda: cuBLAS initialisation failed (status %d)",
                        (int)bst);
    }
    *out = be;
    return TS_OK;
}

extern "C" const char *ts_backend_cuda_device_name(const ts_backend *be) {
    if (!be || be->ops != &cuda_ops) return NULL;
    return ((const cuda_ctx *)be->ctx)->name;
}

extern "C" void ts_backend_cuda_graph_stats(const ts_backend *be, long *replays, long *builds,
                                            long *updates) {
    *replays = *builds = *updates = 0;
    if (be && be->ops == &cuda_ops) cq_stats((cuda_ctx *)be->ctx, replays, builds, updates);
}

extern "C" int ts_backend_cuda_graph_copies(const ts_backend *be) {
    return be && be->ops == &cuda_ops ? cq_last_copies((cuda_ctx *)be->ctx) : -1;
}

extern "C" long ts_backend_cuda_early_waits(const ts_backend *be) {
    return be && be->ops == &cuda_ops ? cq_early_waits((cuda_ctx *)be->ctx) : 0;
}

extern "C" long ts_backend_cuda_queued_ops(const ts_backend *be) {
    return be && be->ops == &cuda_ops ? cq_queued_ops((cuda_ctx *)be->ctx) : 0;
}

extern "C" long ts_backend_cuda_wg_launches(const ts_backend *be, bool *hopper) {
    *hopper = false;
    if (!be || be->ops != &cuda_ops) return 0;
    const cuda_ctx *c = (const cuda_ctx *)be->ctx;
    *hopper = c->cc == 90;
    return c->wg_launches;
}

extern "C" long ts_backend_cuda_gemv_few_launches(const ts_backend *be) {
    if (!be || be->ops != &cuda_ops) return 0;
    return ((const cuda_ctx *)be->ctx)->gemv_few_launches;
}

extern "C" long ts_backend_cuda_gemv_pair_launches(const ts_backend *be) {
    if (!be || be->ops != &cuda_ops) return 0;
    return ((const cuda_ctx *)be->ctx)->gemv_pair_launches;
}

extern "C" long ts_backend_cuda_gdn_keep_launches(const ts_backend *be, bool *on) {
    if (on) *on = false;
    if (!be || be->ops != &cuda_ops) return 0;
    const cuda_ctx *c = (const cuda_ctx *)be->ctx;
    if (on) *on = c->l2_keep_on;
    return c->l2_keep_want ? c->gdn_keep_launches : -1;
}

extern "C" long ts_backend_cuda_gemv_half_launches(const ts_backend *be) {
    if (!be || be->ops != &cuda_ops) return 0;
    return ((const cuda_ctx *)be->ctx)->gemv_half_launches;
}

extern "C" long ts_backend_cuda_gemv_x8_staged_launches(const ts_backend *be) {
    if (!be || be->ops != &cuda_ops) return 0;
    return ((const cuda_ctx *)be->ctx)->gemv_x8_staged_launches;
}

extern "C" bool ts_backend_cuda_args_pack_clean(void) {
    static float w[1];
    bool run = cuda_packs_clean<ts_seq_run>([](ts_seq_run &r) {
        r.start = 3, r.len = 1, r.pos0 = 7, r.rope_shift = 2, r.a = w, r.b = NULL;
    });
    bool norm =
        cuda_packs_clean<ts_gated_norm>([](ts_gated_norm &g) { g.z = g.w = w, g.eps = 1e-6f; });
    return run && norm && cuda_gemv_norm_packs_clean();
}

#ifdef TESSERA_CUDA_BLOCK_TRACE
/* cuda_block_trace.cuh: each translation unit's buffer writer, run when a backend is destroyed */
static void (*trace_dumps[32])(FILE *);
static int trace_ndumps;
void cuda_trace_register(void (*dump)(FILE *)) {
    if (trace_ndumps < 32) trace_dumps[trace_ndumps++] = dump;
}
static void trace_write(void) {
    const char *path = getenv("TESSERA_CUDA_BLOCK_TRACE_FILE");
    FILE *f = path ? fopen(path, "wb") : NULL;
    if (!f) return;
    cudaDeviceSynchronize();
    for (int i = 0; i < trace_ndumps; i++)
        trace_dumps[i](f);
    fclose(f);
}
#endif

static void cu_destroy(ts_backend *be) {
    cuda_ctx *c = cuda_of(be);
    if (c) {
        cq_flush(c);
        cuda_l2_keep(c, false); /* the set-aside is the context's: give it back */
#ifdef TESSERA_CUDA_BLOCK_TRACE
        trace_write();
#endif
        cq_free(c);
        cuda_weights_free(c);
        cuda_wg_free(c);
        for (int i = 0; i < (int)(sizeof c->scratch / sizeof *c->scratch); i++) cudaFree(c->scratch[i]);
        cudaFree(c->pos_dev);
        free(c->pos_host);
        cudaFree(c->kv_pos_dev);
        cudaFree(c->fed_keys);
        cudaFree(c->argmax_parts);
        cudaFree(c->argmax_tickets);
        cuda_gemm_lt_free(c);
        cublasDestroy(c->blas);
        cudaFree(c->blas_workspace);
        cudaStreamDestroy(c->stream);
    }
    free(c);
    free(be);
}
