/* Causal (optionally sliding-window) attention over a sequence's KV cache, on the CPU.
 *
 * One pass per query with an online softmax (running max and sum), so no score buffer of
 * context length is needed and nothing is allocated. Work is split over (head, query) pairs. */
#include <float.h>

#include "backend/cpu/cpu_int.h"

typedef struct {
    const float *q;
    int64_t ldq, q_head_stride;
    int n, pos0;
    const float *k_cache, *v_cache;
    const ts_attn_dims *d;
    float *out;
    int64_t ldo;
} attn_job;

static void attend_one(const attn_job *j, int h, int i) {
    const ts_attn_dims *d = j->d;
    int hd = d->head_dim;
    int kvh = h / (d->n_heads / d->n_kv_heads);
    int64_t ldkv = (int64_t)d->n_kv_heads * hd;
    const float *q = j->q + i * j->ldq + h * j->q_head_stride;
    int qpos = j->pos0 + i;
    int first = 0;
    if (d->window > 0 && qpos - d->window + 1 > 0) first = qpos - d->window + 1;
    float acc[CPU_MAX_HEAD_DIM];
    for (int c = 0; c < hd; c++) acc[c] = 0.0f;
    float m = -FLT_MAX, l = 0.0f;
    for (int p = first; p <= qpos; p++) {
        const float *k = j->k_cache + p * ldkv + (int64_t)kvh * hd;
        float s = 0.0f;
        for (int c = 0; c < hd; c++) s += q[c] * k[c];
        s *= d->scale;
        if (d->softcap > 0) s = d->softcap * tanhf(s / d->softcap);
        const float *v = j->v_cache + p * ldkv + (int64_t)kvh * hd;
        if (s > m) {
            float corr = expf(m - s); /* 0 on the first key */
            l = l * corr + 1.0f;
            for (int c = 0; c < hd; c++) acc[c] = acc[c] * corr + v[c];
            m = s;
        } else {
            float e = expf(s - m);
            l += e;
            for (int c = 0; c < hd; c++) acc[c] += e * v[c];
        }
    }
    float *o = j->out + i * j->ldo + (int64_t)h * hd;
    float inv = 1.0f / l;
    for (int c = 0; c < hd; c++) o[c] = acc[c] * inv;
}

static void attn_task(void *p, int ith, int nth) {
    attn_job *j = p;
    long total = (long)j->d->n_heads * j->n, lo, hi;
    ts_split_range(total, ith, nth, &lo, &hi);
    for (long w = lo; w < hi; w++) attend_one(j, (int)(w % j->d->n_heads), (int)(w / j->d->n_heads));
}

void cpu_op_attention(ts_backend *be, const float *q, int64_t ldq, int64_t q_head_stride, int n,
                      int pos0, const float *k_cache, const float *v_cache,
                      const ts_attn_dims *dims, float *out, int64_t ldo) {
    attn_job j = {q, ldq, q_head_stride, n, pos0, k_cache, v_cache, dims, out, ldo};
    ts_pool_run(cpu_of(be)->pool, attn_task, &j);
}
