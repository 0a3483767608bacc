/* Matmul dispatch: picks the kernel for (isa, dtype) from the per-ISA tables, falling back to
 * lower ISAs for missing entries, and splits the output rows over the pool's threads. */
#include "backend/cpu/matmul.h"

#include "backend/cpu/matmul_int.h"
#include "backend/cpu/matmul_q.h"
#include "backend/cpu/quant.h"
#include "base/cpu.h"
#include "base/half.h"

#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static const cpu_mm_kernel *const mm_tables[CPU_ISA_COUNT] = {
    [CPU_ISA_SCALAR] = cpu_mm_scalar_kernels,
    [CPU_ISA_AVX2] = cpu_mm_avx2_kernels,
    [CPU_ISA_AVX512] = cpu_mm_avx512_kernels,
};

const char *cpu_isa_name(cpu_isa isa) {
    switch (isa) {
    case CPU_ISA_SCALAR: return "scalar";
    case CPU_ISA_AVX2: return "avx2";
    case CPU_ISA_AVX512: return "avx512";
    default: return "?";
    }
}

bool cpu_isa_supported(cpu_isa isa) {
    const ts_cpu_features *f = ts_cpu_get_features();
    switch (isa) {
    case CPU_ISA_SCALAR: return true;
    case CPU_ISA_AVX2: return f->avx2 && f->fma && f->f16c;
    case CPU_ISA_AVX512:
        return f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->fma && f->f16c;
    default: return false;
    }
}

/* Written once under best_once, read-only afterwards. */
static cpu_isa best_isa;
static size_t mmq_prefetch[2]; /* types of 32-element blocks, of 256 (the K-quants) */
static unsigned seq_rows;      /* a mask of (1u << cpu_seq_path) */
#define SEQ_ROWS_ALL ((1u << CPU_SEQ_PATHS) - 1)
static pthread_once_t best_once = PTHREAD_ONCE_INIT;

/* How far ahead the quantized decode kernels prefetch their weights, by the CPU, as measured
 * (bench/RESULTS.md): 8 KB on a Zen 4 VM (16 and 32 KB were slower there); on a Zen 5 VM 16 KB
 * for the K-quants (0.8B Q4_K_M tg +4-8%, 8 ABBA rounds of 8; the Q6_K head of a Q4_0 file
 * +0.6-5%) while the Gemma 3 270M GGUF, mostly Q8_0 and Q5_0, was slower with it; on an
 * Intel Xeon VM (AVX-512, AMX) the next row block (one Q4_K core 12.9 GB/s against 11.9 with
 * 8 KB ahead; 0.8B tg128 +2-6% by type): 2048 bytes, which the tiles round up to whole row
 * blocks and the AVX-512 decode stream (mmq_il_stream, Intel's one to eight tokens) takes as it
 * is into L1 and three times as far into L2 (1024, 1536 and 3072 into L1 were no better
 * there). TESSERA_CPU_PREFETCH=bytes sets it for every type, for comparisons. */
static void mmq_prefetch_init(void) {
    const ts_cpu_features *f = ts_cpu_get_features();
    const char *env = getenv("TESSERA_CPU_PREFETCH");
    if (env && *env && atol(env) > 0) {
        mmq_prefetch[0] = mmq_prefetch[1] = (size_t)atol(env);
    } else if (f->vendor == TS_CPU_VENDOR_INTEL) {
        mmq_prefetch[0] = mmq_prefetch[1] = 2048;
    } else {
        mmq_prefetch[0] = 8192;
        mmq_prefetch[1] = f->vendor == TS_CPU_VENDOR_AMD && f->family >= 0x1a ? 16384 : 8192;
    }
}

/* Which decode paths sum a row block a row (or two) after another - the float kernels' one token
 * and the AVX-512 quantized tile's one or two, each pass prefetching its share of the next row
 * block - so that the weights reach the core as one or two streams instead of 4-8 interleaved
 * ones. The same operations per row, so the same bits. Measured in ABBA order
 * (bench/RESULTS.md): on the Intel Xeon VM every path gains (0.8B tg BF16 +21%, AVX2 +11%;
 * Q4_0 +8%, Q4_K_M +4%, Q8_0 +6%, the Gemma 3 270M GGUF +5%); on the Zen 5 VM the AVX-512 float
 * kernels gain (BF16 +19%, 7 rounds of 8) while AVX2's lose 3% and the quantized tile is level
 * (-0.2 to +2.2% by type, mixed rounds), so AMD takes the AVX-512 float path alone.
 * TESSERA_CPU_SEQ_ROWS=0 / 1 sets every path, for comparisons. */
static unsigned seq_rows_init(void) {
    const char *env = getenv("TESSERA_CPU_SEQ_ROWS");
    if (env && (strcmp(env, "0") == 0 || strcmp(env, "1") == 0))
        return env[0] == '1' ? SEQ_ROWS_ALL : 0;
    return ts_cpu_get_features()->vendor == TS_CPU_VENDOR_INTEL ? SEQ_ROWS_ALL
                                                                : 1u << CPU_SEQ_FLOAT_AVX512;
}

static void best_init(void) {
    cpu_isa best = CPU_ISA_SCALAR;
    for (int i = CPU_ISA_COUNT - 1; i > CPU_ISA_SCALAR; i--) {
        if (cpu_isa_supported((cpu_isa)i)) {
            best = (cpu_isa)i;
            break;
        }
    }
    const char *env = getenv("TESSERA_ISA");
    if (env && *env) {
        for (int i = 0; i < CPU_ISA_COUNT; i++) {
            /* the variable may lower the choice, never raise it past what cpuid allows */
            if (strcmp(env, cpu_isa_name((cpu_isa)i)) == 0 && i < (int)best) best = (cpu_isa)i;
        }
    }
    best_isa = best;
    mmq_prefetch_init();
    seq_rows = seq_rows_init();
}

cpu_isa cpu_isa_best(void) {
    pthread_once(&best_once, best_init);
    return best_isa;
}

size_t cpu_mmq_prefetch_bytes(ts_dtype dt) {
    pthread_once(&best_once, best_init);
    return mmq_prefetch[ts_dtype_block_elems(dt) == 256];
}

bool cpu_seq_rows(cpu_seq_path path) {
    pthread_once(&best_once, best_init);
    return (seq_rows >> path) & 1u;
}

unsigned cpu_seq_rows_mask(void) {
    pthread_once(&best_once, best_init);
    return seq_rows;
}

void cpu_seq_rows_set_mask(unsigned mask) {
    pthread_once(&best_once, best_init);
    seq_rows = mask & SEQ_ROWS_ALL;
}

/* The quantized kernels (integer dot products over 8-bit activations) live in their own tables;
 * their AVX-512 versions use VNNI, so they also need that feature. */
static const cpu_mm_kernel *const mmq_tables[CPU_ISA_COUNT] = {
    [CPU_ISA_SCALAR] = cpu_mmq_scalar,
    [CPU_ISA_AVX2] = cpu_mmq_avx2,
    [CPU_ISA_AVX512] = cpu_mmq_avx512,
};

bool cpu_matmul_supports(ts_dtype dtype) {
    return (unsigned)dtype < TS_DTYPE_COUNT &&
           (cpu_mm_scalar_kernels[dtype].fn != NULL || cpu_mmq_scalar[dtype].fn != NULL);
}

/* The kernel for dtype at isa or the nearest lower ISA that has one; scalar when isa is not
 * supported by this CPU. NULL only for dtypes without a scalar kernel. */
static const cpu_mm_kernel *mm_pick_from(cpu_isa isa, ts_dtype dtype, bool plain_only) {
    if ((unsigned)dtype >= TS_DTYPE_COUNT) return NULL;
    int i = (unsigned)isa < CPU_ISA_COUNT ? (int)isa : CPU_ISA_SCALAR;
    while (i > CPU_ISA_SCALAR && !cpu_isa_supported((cpu_isa)i)) i--;
    for (; i >= CPU_ISA_SCALAR; i--) {
        const cpu_mm_kernel *k = NULL;
        if (mm_tables[i][dtype].fn)
            k = &mm_tables[i][dtype];
        else if (mmq_tables[i][dtype].fn &&
                 (i != CPU_ISA_AVX512 || ts_cpu_get_features()->avx512vnni))
            k = &mmq_tables[i][dtype];
        if (k && !(plain_only && k->repack)) return k;
    }
    return NULL;
}

static const cpu_mm_kernel *mm_pick(cpu_isa isa, ts_dtype dtype) {
    return mm_pick_from(isa, dtype, false);
}

/* The weight bytes kernel k reads for W: W's own, or regrouped (k->repack) - from the cache,
 * or with no cache into *tmp for this call. NULL when that copy cannot be had. */
static const uint8_t *mm_weights(ts_pool *pool, cpu_wcache *wc, const cpu_mm_kernel *k,
                                 const ts_tensor *W, size_t row_bytes, int64_t rows,
                                 uint8_t **tmp) {
    const uint8_t *src = W->data;
    const size_t bytes = row_bytes * (size_t)rows;
    if (!k->repack) return src;
    if (wc) return cpu_wcache_get(wc, pool, src, bytes, row_bytes, k->repack);
    *tmp = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (*tmp) cpu_repack_run(pool, src, *tmp, bytes, row_bytes, k->repack);
    return *tmp;
}

/* One weight of a matmul job: its kernel, and the blocks of `align` rows the threads divide. */
typedef struct {
    cpu_mm_job job;
    cpu_mm_fn fn;
    const cpu_mm_kernel *k;
    int64_t rows;
    int64_t align; /* thread ranges start at multiples of this */
    long blocks;   /* rows / align, rounded up */
} mm_part;

/* A pool job over one or more weights that share x. The threads divide the parts' row blocks as
 * one sequence of units - part j's blocks weigh `weight[j]` units each (their bytes, for a mix
 * of dtypes; 1 for a lone weight) and take units [cum[j], cum[j + 1]) - so that each thread
 * streams one run of weights and a stack costs one hand-over of the pool instead of one per
 * weight. With pair, parts 0 and 1 have the same rows and are one part of the split: a thread
 * multiplies its rows of both, then runs pair on them (a gated MLP's activation). */
typedef struct {
    mm_part part[CPU_MATMUL_MAX_N];
    int parts; /* what the threads divide: the weights, or (pair) the pair as one */
    long weight[CPU_MATMUL_MAX_N], cum[CPU_MATMUL_MAX_N + 1];
    /* rows divided by the threads' measured speed (ts_pool_run_balanced), for a few tokens:
     * there a thread's time is its rows. With many, each thread also quantizes every token's
     * activations (a cost its share of the rows does not change, so a thread given fewer rows
     * would look slower and be given fewer still): equal parts. */
    const ts_pool *pool;
    bool balanced;
    const cpu_mm_pair *pair;
} mm_task;

/* The block of part j where unit u falls: every thread computes it from the same u, so one
 * thread's last block is the next one's first. */
static long mm_block_at(const mm_task *t, int j, long u) {
    if (u <= t->cum[j]) return 0;
    if (u >= t->cum[j + 1]) return t->part[j].blocks;
    return (u - t->cum[j]) / t->weight[j];
}

static void mm_worker(void *ctx, int ith, int nth) {
    const mm_task *t = ctx;
    long lo, hi, units = t->cum[t->parts];
    if (t->balanced)
        ts_pool_share(t->pool, units, ith, nth, &lo, &hi);
    else
        ts_split_range(units, ith, nth, &lo, &hi);
    for (int j = 0; j < t->parts; j++) {
        const mm_part *p = &t->part[j];
        int64_t r0 = mm_block_at(t, j, lo) * p->align, r1 = mm_block_at(t, j, hi) * p->align;
        if (r1 > p->rows) r1 = p->rows;
        if (r0 >= r1) continue;
        p->fn(&p->job, r0, r1);
        if (t->pair) {
            t->part[1].fn(&t->part[1].job, r0, r1);
            t->pair->fn(t->pair->ctx, r0, r1);
        }
    }
}

static int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Prefill through quantized kernels: x quantized once, by all threads, for every weight of the
 * call (matmul_act.c) - when the quantized weights agree on the layout (a Q8_0 weight beside a
 * K-quant one on AVX-512 does not: each kernel then quantizes for itself, as before). */
enum { CPU_MM_ACT_MIN_TOK = 8 };
static void act_share(ts_pool *pool, mm_task *task, int nw, const float *x, int64_t ldx,
                      int n_tok) {
    const cpu_mm_kernel *k = NULL;
    int layout = -1;
    int64_t cols = 0;
    for (int j = 0; j < nw; j++) {
        const mm_part *p = &task->part[j];
        if (!p->fn || !p->k->act_layout) continue;
        int l = p->k->act_layout(p->job.cols);
        if (k && (l != layout || p->k->act_quantize != k->act_quantize || p->job.cols != cols))
            return;
        k = p->k, layout = l, cols = p->job.cols;
    }
    if (!k) return;
    const uint8_t *xq = cpu_mm_act_prepare(pool, k, layout, x, ldx, cols, n_tok);
    for (int j = 0; j < nw; j++)
        if (task->part[j].fn && task->part[j].k->act_layout) task->part[j].job.xq = xq;
}

void cpu_matmul_n(ts_pool *pool, cpu_wcache *wc, cpu_isa isa, const ts_tensor *const *W, int nw,
                  const float *x, int64_t ldx, int n_tok, float *const *y, const int64_t *ldy,
                  const cpu_mm_pair *pair) {
    assert(nw >= 1 && nw <= CPU_MATMUL_MAX_N && (!pair || nw == 2));
    if (n_tok <= 0) return;
    mm_task task = {.parts = pair ? 1 : nw, .pool = pool, .balanced = true, .pair = pair};
    uint8_t *tmp[CPU_MATMUL_MAX_N] = {NULL};
    double work = 0.0;
    for (int j = 0; j < nw; j++) {
        int64_t rows = ts_tensor_rows(W[j]), cols = ts_tensor_cols(W[j]);
        const cpu_mm_kernel *k = mm_pick(isa, W[j]->dtype);
        assert(k && "cpu_matmul: unsupported weight dtype (check cpu_matmul_supports)");
        if (!k || cols == 0) { /* !k: a caller bug; NaNs make it visible instead of stale values */
            for (int t = 0; t < n_tok; t++)
                for (int64_t o = 0; o < rows; o++)
                    y[j][t * ldy[j] + o] = k ? 0.0f : NAN;
            continue;
        }
        const size_t rb = ts_dtype_row_bytes(W[j]->dtype, cols);
        const uint8_t *w = mm_weights(pool, wc, k, W[j], rb, rows, &tmp[j]);
        if (!w) { /* no memory for the regrouped copy: the file's layout, a kernel set lower */
            k = mm_pick_from(isa, W[j]->dtype, true);
            w = W[j]->data;
        }
        task.part[j] = (mm_part){
            .job = {.w = w,
                    .row_bytes = rb,
                    .cols = cols,
                    .x = x,
                    .ldx = ldx,
                    .n_tok = n_tok,
                    .y = y[j],
                    .ldy = ldy[j]},
            .fn = k->fn,
            .k = k,
            .rows = rows,
            .align = n_tok <= k->few_tok ? k->few_align : k->row_align,
        };
        task.balanced &= n_tok <= (k->few_tok > 1 ? k->few_tok : 1);
        work += (double)rows * (double)cols * n_tok;
    }
    if (pair && (!task.part[0].fn || !task.part[1].fn)) { /* one product filled in above */
        int j = task.part[0].fn ? 0 : 1;
        if (task.part[j].fn)
            cpu_matmul_n(pool, wc, isa, &W[j], 1, x, ldx, n_tok, &y[j], &ldy[j], NULL);
        pair->fn(pair->ctx, 0, ts_tensor_rows(W[0]));
        goto out;
    }
    if (!task.balanced && n_tok >= CPU_MM_ACT_MIN_TOK) act_share(pool, &task, nw, x, ldx, n_tok);
    if (pair) { /* one split for both: blocks of the larger alignment (powers of two) */
        assert(task.part[0].rows == task.part[1].rows);
        int64_t a = max_i64(task.part[0].align, task.part[1].align);
        task.part[0].align = task.part[1].align = a;
    }
    int64_t biggest = 0;
    for (int j = 0; j < task.parts; j++) {
        mm_part *p = &task.part[j];
        if (!p->fn) { /* left out above: no blocks */
            task.weight[j] = 1;
            task.cum[j + 1] = task.cum[j];
            continue;
        }
        p->blocks = (long)((p->rows + p->align - 1) / p->align);
        size_t bytes = (size_t)p->align * p->job.row_bytes;
        if (pair) bytes += (size_t)p->align * task.part[1].job.row_bytes;
        task.weight[j] = nw == 1 ? 1 : (long)(bytes / 256 + 1);
        task.cum[j + 1] = task.cum[j] + p->blocks * task.weight[j];
        biggest = max_i64(biggest, p->rows - p->align);
    }
    /* below a few thousand multiply-adds the wake-up of the workers costs more than it saves */
    if (work < 32768.0 || biggest <= 0)
        mm_worker(&task, 0, 1);
    else if (task.balanced)
        ts_pool_run_balanced(pool, mm_worker, &task, task.cum[task.parts]);
    else
        ts_pool_run(pool, mm_worker, &task);
out:
    for (int j = 0; j < nw; j++)
        free(tmp[j]);
}

void cpu_matmul(ts_pool *pool, cpu_wcache *wc, cpu_isa isa, const ts_tensor *W, const float *x,
                int64_t ldx, int n_tok, float *y, int64_t ldy) {
    cpu_matmul_n(pool, wc, isa, &W, 1, x, ldx, n_tok, &y, &ldy, NULL);
}

void cpu_dequant_row(const ts_tensor *W, int64_t row, float *out) {
    int64_t cols = ts_tensor_cols(W);
    const uint8_t *p = (const uint8_t *)W->data + (size_t)row * ts_dtype_row_bytes(W->dtype, cols);
    uint16_t h;
    switch (W->dtype) {
    case TS_DTYPE_F32: memcpy(out, p, (size_t)cols * sizeof(float)); break;
    case TS_DTYPE_F16:
        for (int64_t j = 0; j < cols; j++) {
            memcpy(&h, p + 2 * j, 2);
            out[j] = ts_f16_to_f32(h);
        }
        break;
    case TS_DTYPE_BF16:
        for (int64_t j = 0; j < cols; j++) {
            memcpy(&h, p + 2 * j, 2);
            out[j] = ts_bf16_to_f32(h);
        }
        break;
    default:
        if (ts_dtype_is_quantized(W->dtype) &&
            ts_dequantize_row(W->dtype, p, out, cols) == TS_OK)
            break;
        assert(!"cpu_dequant_row: unsupported dtype");
        for (int64_t j = 0; j < cols; j++) out[j] = NAN;
        break;
    }
}
