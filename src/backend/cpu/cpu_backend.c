/* The CPU backend: the vtable, buffers, and the thread pool and ISA it runs with. */
#include "backend/cpu/cpu_int.h"
#include "base/cpu.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define CPU_BUF_ALIGN 64
/* Buffers from this size on are mapped: the kernel's zero pages, given memory as they are
 * first touched. A sequence's state is allocated for the whole context and the prefix
 * snapshots' pool for all of --cache-mb; zeroed by hand they took all of it at start (a
 * server of Gemma 3 270M held 2.0 GB before its first request), mapped only what is used. */
#define CPU_BUF_MAP (1u << 20)

/* A buffer's header, CPU_BUF_ALIGN bytes before it: the mapping's length, 0 when it came
 * from the heap. */
static void *cpu_alloc(ts_backend *be, size_t bytes) {
    (void)be;
    size_t n = (bytes + CPU_BUF_ALIGN - 1) / CPU_BUF_ALIGN * CPU_BUF_ALIGN + CPU_BUF_ALIGN;
    char *base;
    if (n >= CPU_BUF_MAP) {
        base = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) return NULL;
        *(size_t *)base = n;
    } else {
        if (!(base = aligned_alloc(CPU_BUF_ALIGN, n))) return NULL;
        memset(base, 0, n);
    }
    return base + CPU_BUF_ALIGN;
}

static void cpu_free(ts_backend *be, void *buf) {
    (void)be;
    if (!buf) return;
    char *base = (char *)buf - CPU_BUF_ALIGN;
    size_t mapped = *(size_t *)base;
    if (mapped)
        munmap(base, mapped);
    else
        free(base);
}

static void cpu_memcpy(ts_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memmove(dst, src, bytes);
}

static void cpu_zero(ts_backend *be, void *dst, size_t bytes) {
    (void)be;
    memset(dst, 0, bytes);
}

static void cpu_destroy(ts_backend *be);

static const ts_backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_memcpy,
    .download = cpu_memcpy,
    .copy = cpu_memcpy,
    .zero = cpu_zero,
    .get_rows = cpu_op_get_rows,
    .matmul = cpu_op_matmul,
    .rmsnorm = cpu_op_rmsnorm,
    .l2norm = cpu_op_l2norm,
    .rope = cpu_op_rope,
    .add = cpu_op_add,
    .swiglu = cpu_op_swiglu,
    .gelu_mul = cpu_op_gelu_mul,
    .softcap = cpu_op_softcap,
    .scale_rows = cpu_op_scale_rows,
    .lora_add = cpu_op_lora_add,
    .sigmoid_gate = cpu_op_sigmoid_gate,
    .copy_rows = cpu_op_copy_rows,
    .argmax = cpu_op_argmax,
    .attention = cpu_op_attention,
    .conv1d_silu = cpu_op_conv1d_silu,
    .gdn_gates = cpu_op_gdn_gates,
    .gdn = cpu_op_gdn,
    .gated_rmsnorm = cpu_op_gated_rmsnorm,
    .matmul_n = cpu_op_matmul_n,
    .matmul_glu = cpu_op_matmul_glu,
    .rope_cs = cpu_op_rope_cs,
    .layernorm = cpu_op_layernorm,
    .bias_act = cpu_op_bias_act,
    .attention_full = cpu_op_attention_full,
    .vision_patches = cpu_op_vision_patches,
    .vision_positions = cpu_op_vision_positions,
};

ts_status ts_backend_cpu_create(int n_threads, int isa, ts_backend **out) {
    *out = NULL;
    if (n_threads <= 0) n_threads = ts_cpu_count();
    cpu_isa chosen = cpu_isa_best();
    if (isa >= 0) {
        if (isa >= CPU_ISA_COUNT || !cpu_isa_supported((cpu_isa)isa))
            return ts_error(TS_ERR_UNSUPPORTED, "kernel set %s is not supported by this CPU",
                            isa < CPU_ISA_COUNT ? cpu_isa_name((cpu_isa)isa) : "?");
        chosen = (cpu_isa)isa;
    }
    ts_backend *be = calloc(1, sizeof *be);
    cpu_ctx *ctx = calloc(1, sizeof *ctx);
    if (!be || !ctx) {
        free(be);
        free(ctx);
        return ts_error(TS_ERR_NOMEM, "cpu backend: out of memory");
    }
    ts_status st = ts_pool_create(n_threads, &ctx->pool);
    if (st != TS_OK) {
        free(be);
        free(ctx);
        return st;
    }
    ctx->wc = cpu_wcache_new();
    if (!ctx->wc) {
        ts_pool_free(ctx->pool);
        free(be);
        free(ctx);
        return ts_error(TS_ERR_NOMEM, "cpu backend: out of memory");
    }
    /* TESSERA_CPU_REGROUP=0: no regrouped copies of quantized weights (less memory; those
     * weights then take the AVX2 kernels, which read the file's layout) */
    const char *rg = getenv("TESSERA_CPU_REGROUP");
    if (rg && !strcmp(rg, "0")) cpu_wcache_set_limit(ctx->wc, 0);
    ctx->isa = chosen;
    be->ops = &cpu_ops;
    be->ctx = ctx;
    *out = be;
    return TS_OK;
}

const char *ts_backend_cpu_isa_name(const ts_backend *be) {
    if (!be || be->ops != &cpu_ops) return NULL;
    return cpu_isa_name(((const cpu_ctx *)be->ctx)->isa);
}

static void cpu_destroy(ts_backend *be) {
    cpu_ctx *ctx = be->ctx;
    if (ctx) {
        ts_pool_free(ctx->pool);
        cpu_wcache_free(ctx->wc);
    }
    free(ctx);
    free(be);
}
