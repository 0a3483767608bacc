/* The CPU's ops for an image encoder and for image positions in a decoder (backend.h:
 * rope_cs, layernorm, bias_act, vision_patches, vision_positions; attention_full is in
 * ops_attention.c with the causal op it shares its tiles with). Rows are split over the thread
 * pool. */
#include "backend/cpu/cpu_int.h"
#include "backend/cpu/ops_seq.h"
#include "backend/vision_grid.h"

typedef struct {
    float *x;
    int64_t ldx, head_stride;
    int n_tok, n_heads, half;
    const float *cs;
} rope_cs_job;

static void rope_cs_task(void *p, int ith, int nth) {
    const rope_cs_job *j = p;
    long lo, hi;
    ts_split_range(j->n_tok, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++) {
        const float *c = j->cs + t * 2 * j->half, *s = c + j->half;
        for (int h = 0; h < j->n_heads; h++) {
            float *v = j->x + t * j->ldx + h * j->head_stride;
            for (int k = 0; k < j->half; k++) {
                float x0 = v[k], x1 = v[k + j->half];
                v[k] = x0 * c[k] - x1 * s[k];
                v[k + j->half] = x1 * c[k] + x0 * s[k];
            }
        }
    }
}

void cpu_op_rope_cs(ts_backend *be, float *x, int64_t ldx, int n_tok, int n_heads,
                    int64_t head_stride, int half, const float *cs) {
    rope_cs_job j = {x, ldx, head_stride, n_tok, n_heads, half, cs};
    cpu_run_rows(be, rope_cs_task, &j, n_tok, 16);
}

typedef struct {
    const float *x;
    int64_t ldx;
    int n_rows, dim;
    const float *w, *b;
    float eps;
    float *out;
    int64_t ldo;
} layernorm_job;

/* mean and variance in double (the reference computes them in fp32 over the row; the double
 * sums keep our result within its rounding) */
static void layernorm_task(void *p, int ith, int nth) {
    const layernorm_job *j = p;
    long lo, hi;
    ts_split_range(j->n_rows, ith, nth, &lo, &hi);
    for (long r = lo; r < hi; r++) {
        const float *x = j->x + r * j->ldx;
        float *o = j->out + r * j->ldo;
        double s = 0;
        for (int i = 0; i < j->dim; i++)
            s += x[i];
        double mean = s / j->dim, v = 0;
        for (int i = 0; i < j->dim; i++)
            v += ((double)x[i] - mean) * ((double)x[i] - mean);
        float inv = (float)(1.0 / sqrt(v / j->dim + j->eps)), m = (float)mean;
        for (int i = 0; i < j->dim; i++)
            o[i] = (x[i] - m) * inv * j->w[i] + j->b[i];
    }
}

void cpu_op_layernorm(ts_backend *be, const float *x, int64_t ldx, int n_rows, int dim,
                      const float *w, const float *b, float eps, float *out, int64_t ldo) {
    layernorm_job j = {x, ldx, n_rows, dim, w, b, eps, out, ldo};
    cpu_run_rows(be, layernorm_task, &j, n_rows, 8);
}

typedef struct {
    float *x;
    int64_t ldx;
    int n_rows, dim;
    const float *bias;
    int act;
    const cpu_seq_kernels *k;
} bias_act_job;

static void bias_act_task(void *p, int ith, int nth) {
    const bias_act_job *j = p;
    long lo, hi;
    ts_split_range(j->n_rows, ith, nth, &lo, &hi);
    for (long r = lo; r < hi; r++) {
        float *x = j->x + r * j->ldx;
        if (j->bias)
            for (int i = 0; i < j->dim; i++)
                x[i] += j->bias[i];
        if (j->act == TS_ACT_GELU_TANH) /* as the decoders' gated MLPs compute it */
            cpu_gelu_tanh_mul(j->k, x, NULL, x, j->dim);
        else if (j->act == TS_ACT_GELU_ERF) /* PyTorch's exact GELU: x/2 (1 + erf(x / sqrt 2)) */
            for (int i = 0; i < j->dim; i++)
                x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
    }
}

void cpu_op_bias_act(ts_backend *be, float *x, int64_t ldx, int n_rows, int dim, const float *bias,
                     int act) {
    bias_act_job j = {x, ldx, n_rows, dim, bias, act, cpu_seq_pick(cpu_of(be)->isa)};
    cpu_run_rows(be, bias_act_task, &j, n_rows, 8);
}

typedef struct {
    const uint8_t *rgb;
    ts_patch_dims d;
    const float *lut;
    float *out;
} patches_job;

/* The patches of [lo, hi): each byte looked up in its channel's table (the processor's
 * arithmetic, done once a byte value by the model) */
static void patches_task(void *p, int ith, int nth) {
    const patches_job *j = p;
    const ts_patch_dims *d = &j->d;
    int P = d->patch, grid_w = d->width / P, K = 3 * d->temporal * P * P;
    long lo, hi;
    ts_split_range((long)(d->height / P) * grid_w, ith, nth, &lo, &hi);
    for (long n = lo; n < hi; n++) {
        int row, col;
        ts_grid_patch_rc((int)n, grid_w, d->merge, &row, &col);
        float *v = j->out + n * K;
        size_t frame = (size_t)d->width * d->height * 3;
        for (int c = 0; c < 3; c++)
            for (int t = 0; t < d->temporal; t++)
                for (int y = 0; y < P; y++) {
                    const uint8_t *px = j->rgb + (d->frames > 1 ? t * frame : 0) +
                                        ((size_t)(row * P + y) * d->width + col * P) * 3;
                    for (int x = 0; x < P; x++)
                        *v++ = j->lut[c * 256 + px[3 * x + c]];
                }
    }
}

void cpu_op_vision_patches(ts_backend *be, const uint8_t *rgb, const ts_patch_dims *d,
                           const float *lut, float *out) {
    patches_job j = {rgb, *d, lut, out};
    cpu_run_rows(be, patches_task, &j, (d->height / d->patch) * (d->width / d->patch), 64);
}

typedef struct {
    const float *table;
    int side, dim, grid_h, grid_w, merge;
    float *out;
} positions_job;

static void positions_task(void *p, int ith, int nth) {
    const positions_job *j = p;
    long lo, hi;
    ts_split_range((long)j->grid_h * j->grid_w, ith, nth, &lo, &hi);
    for (long n = lo; n < hi; n++) {
        int row, col, th[2], tw[2];
        float wh[2], ww[2];
        ts_grid_patch_rc((int)n, j->grid_w, j->merge, &row, &col);
        ts_grid_taps(row, j->grid_h, j->side, th, wh);
        ts_grid_taps(col, j->grid_w, j->side, tw, ww);
        float *o = j->out + n * j->dim;
        for (int i = 0; i < j->dim; i++)
            o[i] = 0.0f;
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++) {
                float wt = wh[a] * ww[b];
                const float *src = j->table + (size_t)(th[a] * j->side + tw[b]) * j->dim;
                for (int i = 0; i < j->dim; i++)
                    o[i] += src[i] * wt;
            }
    }
}

void cpu_op_vision_positions(ts_backend *be, const float *table, int side, int dim, int grid_h,
                             int grid_w, int merge, float *out) {
    positions_job j = {table, side, dim, grid_h, grid_w, merge, out};
    cpu_run_rows(be, positions_task, &j, grid_h * grid_w, 32);
}
