/* The launch queue: every kernel launch, device copy and memset of the backend goes through it.
 *
 * Why: a decode step of a small model is ~500 tiny kernels, and launching them one by one costs
 * more host time than the GPU needs to run them. So ops are recorded (function, grid, block and
 * a copy of the argument values) and submitted when the host needs a result (download, finish
 * after a forward without output, free, destroy). A step whose shape repeats - the same
 * sequence of kernels and grids as one of the last few submissions, as every decode step after
 * the first - becomes a CUDA graph, built once and then
 * replayed; only nodes whose arguments changed get their parameters updated before the replay
 * (a steady decode step has none: the position and the rows it writes reach the kernels
 * through device memory). Steps that do not repeat (prefill)
 * run op by op as before. TESSERA_CUDA_GRAPHS=0 turns the graphs off (ops still queue).
 *
 * Host data a queued copy reads is first copied into a pinned staging arena, so callers may
 * reuse their buffers at once and a replayed graph finds the new step's data at the same place.
 * Work that cannot be described as a kernel (cuBLAS) is queued as a call, captured into a child
 * graph when its step becomes a graph; a call's arguments are part of the step's shape. */
#ifndef TS_BACKEND_CUDA_CUDA_QUEUE_CUH
#define TS_BACKEND_CUDA_CUDA_QUEUE_CUH

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#define CQ_ARG_BYTES 256
#define CQ_MAX_ARGS 24

typedef enum { CQ_KERNEL, CQ_COPY, CQ_MEMSET, CQ_CALL } cq_kind;

struct cuda_ctx_s;
typedef void (*cq_call_fn)(struct cuda_ctx_s *c, cudaStream_t s, const void *args);

typedef struct {
    cq_kind kind;
    const char *what;
    /* CQ_KERNEL */
    const void *func;
    dim3 grid, block;
    unsigned smem;
    int nargs;
    uint16_t off[CQ_MAX_ARGS];
    /* CQ_COPY / CQ_MEMSET */
    void *dst;
    const void *src;
    size_t bytes;
    cudaMemcpyKind dir;
    /* a host-to-device copy that no op queued before it in the submission reads (or writes)
     * the destination of: a graph may run it at its start, off the chain of kernels (see
     * graph_build in cuda_queue.cu) */
    bool hoist;
    /* CQ_CALL */
    cq_call_fn call;
    size_t args_len; /* bytes of args in use (kernels and calls) */
    alignas(16) unsigned char args[CQ_ARG_BYTES];
} cq_op;

struct cuda_ctx_s;
/* Queues an op (or runs it at once when the queue is off). */
void cq_submit(struct cuda_ctx_s *c, const cq_op *op);
/* Runs everything queued and waits for it; afterwards the staging arena is free again. While
 * ops are held (cq_launch below) it cannot run them: it drops them and marks the held step
 * broken (cq_seal then says no), and ops queued after that are dropped too. */
void cq_flush(struct cuda_ctx_s *c);

/* Decoding ahead: the engine queues step t + 1 while step t runs and launches it only once the
 * caller has seen step t's tokens, so the host's work between two steps (the model queueing
 * its ops, matching them to the cached graph) overlaps the device's instead of following it.
 *   cq_launch(c, hold)  submits what is queued without waiting (waiting first for a submission
 *                       still in flight); with hold, the ops queued after it are held: no
 *                       flush runs them, their host bytes go to shadow arenas (the launched
 *                       step's copies may still be reading the arenas), and only the next
 *                       cq_launch submits them (cq_drop forgets them).
 *   cq_seal(c)          the held ops are a whole step: its graph is matched (or built) now,
 *                       while the device works; false when they cannot be held (a flush came,
 *                       graphs are off, a failure): the caller drops them.
 *   cq_wait(c)          waits for the launched submission and runs its deferred host work.
 *   cq_drop(c)          forgets the queued ops (none of them ran) and ends holding. */
bool cq_can_hold(struct cuda_ctx_s *c); /* ops queue at all: graphs on, no per-op profiling */
void cq_launch(struct cuda_ctx_s *c, bool hold);
bool cq_seal(struct cuda_ctx_s *c);
bool cq_broken(struct cuda_ctx_s *c); /* the held ops were dropped by a flush */
void cq_wait(struct cuda_ctx_s *c);
void cq_drop(struct cuda_ctx_s *c);
/* Host work for after a submission has run (an argmax's keys turned into ids): done is called
 * by the cq_wait after the launch that ran the ops queued before cq_defer, with ok false when
 * the device failed. src / dst / n are the caller's. */
typedef struct cq_defer {
    void (*done)(struct cuda_ctx_s *c, const struct cq_defer *d, bool ok);
    const void *src;
    void *dst;
    int n;
    void *aux; /* a second destination, where done needs one */
} cq_defer;
void cq_defer_add(struct cuda_ctx_s *c, const cq_defer *d);
/* The queued submission's results for the host are (besides any others it declares the same
 * way) the n keys a kernel writes at staged, in the staging arena (cq_stage; an argmax's, see
 * cuda_argmax_keys): they are set to 0 now, and the cq_wait after its launch returns as soon
 * as none is 0 - before the stream's own end is signalled, ~4 us later - rather than waiting
 * for the stream (a key is never 0 but for a row of NaNs; such a wait ends with the stream).
 * Not where the submission copies anything to the host, nor while profiling;
 * TESSERA_CUDA_EARLY_WAIT=0 turns it off, for comparisons. */
void cq_wait_keys(struct cuda_ctx_s *c, unsigned long long *staged, int n);

/* Pinned host memory for bytes of data that a queued copy will read or write; NULL when it
 * cannot fit (the caller then flushes and copies synchronously). The address is the one the
 * copy takes and where a download lands; the host writes upload bytes at cq_stage_fill(c, p),
 * which differs while ops are held. Valid until the next launch. */
void *cq_stage(struct cuda_ctx_s *c, size_t bytes);
void *cq_stage_fill(struct cuda_ctx_s *c, void *staged);
/* While ops are held (a step queued ahead): where the host bytes of the table at table (a
 * cuda_table result of the held ops) lie until the held step's launch copies them into place -
 * rewriting them there changes what the held step reads. NULL when no ops are held, or when
 * tables go up one by one (no graphs, TESSERA_CUDA_HOIST=0). */
void *cq_held_table_fill(struct cuda_ctx_s *c, void *table);
/* Whether the ops queued now are held (a step queued ahead, not broken). */
bool cq_holding(struct cuda_ctx_s *c);
void cq_free(struct cuda_ctx_s *c);
/* Graph replays, builds and nodes updated before a replay so far (tests check that decode
 * replays, and that a single sequence's decode step replays with no node updated). */
void cq_stats(struct cuda_ctx_s *c, long *replays, long *builds, long *updates);
/* The copy and memset nodes of the graph replayed last (-1: none replayed yet). */
int cq_last_copies(struct cuda_ctx_s *c);
/* The waits that returned on their keys (cq_wait_keys) so far. */
long cq_early_waits(struct cuda_ctx_s *c);
/* Ops queued and not yet submitted (tests). */
long cq_queued_ops(struct cuda_ctx_s *c);

/* Where op's next argument, of type T, goes in its bytes (recorded as taken). */
template <typename T> static inline size_t cq_slot(cq_op *op) {
    size_t o = (op->args_len + alignof(T) - 1) & ~(alignof(T) - 1);
    static_assert(sizeof(T) <= CQ_ARG_BYTES, "argument too large");
    if (o + sizeof(T) > CQ_ARG_BYTES) { /* a kernel signature too big for the queue: a bug */
        fprintf(stderr, "tessera: cuda: kernel arguments over %d bytes\n", CQ_ARG_BYTES);
        abort();
    }
    op->off[op->nargs++] = (uint16_t)o;
    op->args_len = o + sizeof(T);
    return o;
}
template <typename T> static inline void cq_pack(cq_op *op, const T &v) {
    memcpy(op->args + cq_slot<T>(op), &v, sizeof(T));
}
/* cq_pack for a struct with padding: its fields f copied one by one into the op's zeroed argument
 * bytes, so that the padding stays zero. A graph's node is updated before a replay when its
 * arguments' bytes differ from the last step's (cuda_queue.cu), and a struct's padding holds
 * whatever the host compiler left there - a struct built by the model's C code carries stack
 * bytes, one passed in registers (16 bytes or less) loses them on the way: a test_cuda built with
 * one compiler saw 6 nodes updated in 10 steady replays, built with another none. Each padded
 * struct a kernel takes by value gets a cq_pack specialization calling this (cuda_int.cuh). */
template <typename T, typename... F>
static inline void cq_pack_fields(cq_op *op, const T &v, F T::*...f) {
    unsigned char *at = op->args + cq_slot<T>(op);
    const char *base = (const char *)&v;
    (memcpy(at + ((const char *)&(v.*f) - base), &(v.*f), sizeof(v.*f)), ...);
}

/* cuda_launch(c, "what", kernel, grid, block, smem, args...): a kernel launch through the queue.
 * The arguments are converted to the kernel's parameter types and copied. */
template <typename... P, typename... A>
static inline void cuda_launch(struct cuda_ctx_s *c, const char *what, void (*k)(P...), dim3 grid,
                               dim3 block, size_t smem, A... a) {
    static_assert(sizeof...(P) == sizeof...(A), "wrong number of kernel arguments");
    static_assert(sizeof...(P) <= CQ_MAX_ARGS, "too many kernel arguments");
    cq_op op{}; /* zeroed, padding included: arguments are compared bytewise */
    op.kind = CQ_KERNEL;
    op.what = what;
    op.func = (const void *)k;
    op.grid = grid;
    op.block = block;
    op.smem = (unsigned)smem;
    (cq_pack<P>(&op, static_cast<P>(a)), ...);
    cq_submit(c, &op);
}

/* A queued call with its argument struct copied (cuBLAS work). */
template <typename T>
static inline void cuda_call(struct cuda_ctx_s *c, const char *what, cq_call_fn fn, const T &args) {
    static_assert(sizeof(T) <= CQ_ARG_BYTES, "call arguments too large");
    cq_op op{}; /* zeroed, padding included: arguments are compared bytewise */
    op.kind = CQ_CALL;
    op.what = what;
    op.call = fn;
    memcpy(op.args, &args, sizeof(T));
    op.args_len = sizeof(T);
    cq_submit(c, &op);
}

void cuda_copy_async(struct cuda_ctx_s *c, void *dst, const void *src, size_t bytes,
                     cudaMemcpyKind dir, const char *what);
void cuda_memset_async(struct cuda_ctx_s *c, void *dst, size_t bytes, const char *what);
/* A device copy of a small host table (run descriptors) for the kernels of this submission, in
 * a device arena that is reused after each flush. While ops queue, the tables are written to a
 * pinned mirror of the arena and the flush copies them all up in one copy ahead of the
 * submission's ops (a graph's root); when ops run as they come, each is a fresh upload. NULL on
 * failure (recorded). */
void *cuda_table(struct cuda_ctx_s *c, const void *host, size_t bytes);
/* Host bytes to the device now, before any op queued after this call runs: the copy goes on the
 * backend's own stream and is waited for. (A plain cudaMemcpy would not do: it runs on the legacy
 * default stream, which does not order the backend's non-blocking stream, and from pageable
 * memory it returns before its last DMA has landed — a kernel could read the old bytes.) The
 * host buffer may be reused at once. False on failure (recorded). */
bool cuda_upload_now(struct cuda_ctx_s *c, void *dst, const void *src, size_t bytes,
                     const char *what);
/* Host bytes to the device through the staging arena (synchronously when they do not fit). */
void cuda_upload_async(struct cuda_ctx_s *c, void *dst, const void *src, size_t bytes,
                       const char *what);
/* The same for data that nothing queued earlier in this submission reads: the caller's promise
 * (a buffer first written in the submission by this copy; cq_epoch tells a caller that keeps a
 * buffer's contents across calls when a new submission began). Lets a graph run the copy at
 * its start instead of between two kernels. */
void cuda_upload_fresh(struct cuda_ctx_s *c, void *dst, const void *src, size_t bytes,
                       const char *what);
/* Submissions flushed so far: a caller that uploads only when its data changes uploads again
 * when this changed, so that its upload is the first write in each submission that uses it. */
unsigned long cq_epoch(struct cuda_ctx_s *c);

#endif
