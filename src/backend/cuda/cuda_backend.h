/* The CUDA backend: the same op vtable as the CPU backend, with activations and state in device
 * memory and weights uploaded to the device on first use. Built with -DTESSERA_CUDA=ON; without
 * it (backend/cuda_stub.c) creation fails with TS_ERR_UNSUPPORTED. */
#ifndef TS_BACKEND_CUDA_CUDA_BACKEND_H
#define TS_BACKEND_CUDA_CUDA_BACKEND_H

#ifdef __cplusplus
extern "C" { /* the base/ and backend/ headers are C, without their own guards */
#endif

#include "backend/backend.h"

/* A backend on CUDA device `device`. Fails with one line ("tessera was built without CUDA",
 * "no CUDA device: ...") when there is none. */
ts_status ts_backend_cuda_create(int device, ts_backend **out);
/* The device's name ("NVIDIA H200"); NULL if be is not a CUDA backend. */
const char *ts_backend_cuda_device_name(const ts_backend *be);
/* Read bandwidth of the device's memory in GB/s (0 when it cannot be measured). */
double ts_backend_cuda_read_bandwidth(int device);
/* How many submissions ran as a replayed CUDA graph, how many graphs were built, and how many
 * graph nodes had their arguments updated before a replay. */
void ts_backend_cuda_graph_stats(const ts_backend *be, long *replays, long *builds,
                                 long *updates);
/* For tests: the copy and memset nodes of the graph this backend replayed last (-1: none, or
 * no CUDA). A single sequence's decode step has none (the position and the argmax's keys go
 * through pinned memory the kernels read and write). */
int ts_backend_cuda_graph_copies(const ts_backend *be);
/* For tests: how many waits for a submission returned as soon as the argmax's keys had come
 * into pinned memory, before the stream's end was signalled (cq_wait_keys; 0 without CUDA). */
long ts_backend_cuda_early_waits(const ts_backend *be);
/* For tests: ops queued and not yet submitted (0 without CUDA). */
long ts_backend_cuda_queued_ops(const ts_backend *be);
/* For tests: the GEMM algorithms cuBLASLt has been asked for so far - one per weight shape,
 * accumulate or not and bucket of token counts (cuda_gemm_lt.cu; 0 without CUDA). */
long ts_backend_cuda_lt_algos(const ts_backend *be);
/* For tests: how many launches of the wgmma GEMM (9-64 tokens of 16-bit weights,
 * cuda_gemm_wg.cu) this backend has queued, and whether its device has compute capability 9.0
 * (where that form must run). 0 / false without CUDA. */
long ts_backend_cuda_wg_launches(const ts_backend *be, bool *hopper);
/* For tests: how many launches of the single-token GEMV's kernel for several tokens at once
 * (cuda_gemv_one.cu: 2-3 of 16-bit weights, 2 of quantized ones) this backend has queued. 0
 * without CUDA. */
long ts_backend_cuda_gemv_few_launches(const ts_backend *be);
/* For tests: how many single-token GEMVs of a stack of two quantized types this backend has
 * queued as one launch (cuda_gemv_pair.cu). 0 without CUDA. */
long ts_backend_cuda_gemv_pair_launches(const ts_backend *be);
/* For tests: how many single-token GEMVs this backend has queued by half warps (Q6_K rows that
 * go round, cuda_gemv_one.cu's g1_try_half). 0 without CUDA. */
long ts_backend_cuda_gemv_half_launches(const ts_backend *be);
/* For tests: how many single-sequence delta-rule steps this backend has queued in the form
 * that keeps the recurrent state in the L2 set-aside (cuda_ops_seq.cu's cuda_l2_keep), -1
 * where it makes none (the device's L2 has no set-aside, or TESSERA_CUDA_L2_KEEP=0), and in
 * *on whether the set-aside is in place now. 0 / false without CUDA. */
long ts_backend_cuda_gdn_keep_launches(const ts_backend *be, bool *on);
/* For tests: how many single-token GEMVs of quantized rows that go round this backend has
 * queued with x's int8 runs staged in shared memory (cuda_gemv_one.cu's g1_x8_takes). 0
 * without CUDA. */
long ts_backend_cuda_gemv_x8_staged_launches(const ts_backend *be);
/* For tests, no device needed: whether the structs with padding that kernels take by value
 * (ts_seq_run, ts_gated_norm, the GEMV's norm) reach the launch queue's argument bytes without
 * their padding - the bytes a replayed graph compares between steps. True without CUDA. */
bool ts_backend_cuda_args_pack_clean(void);

#ifdef __cplusplus
}
#endif

#endif
