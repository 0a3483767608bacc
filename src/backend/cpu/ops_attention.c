/* Causal (optionally sliding-window) attention over a sequence's KV cache, on the CPU.
 *
 * Work items are tiles of query rows that share a KV head: up to the whole GQA group of heads
 * times a block of consecutive positions. Each item walks its keys a block at a time (the
 * flash-attention order): scores S = Q K^T for the block (gemm_nt straight from the cache), the
 * causal / window mask, an online softmax per row (running max m and sum l; when the max grows
 * the row's output so far is rescaled by e^(m_old - m_new)), then O = corr * O + P V (gemm_nn).
 * So K and V rows are read once per item rather than once per query, no buffer grows with the
 * context, and the products run in the ISA's register-tiled kernels (ops_seq.h). Items are
 * dealt to the threads round-robin, which evens out the causal triangle. The same tiles
 * serve attention without a mask (an image encoder's: every query sees all n keys). */
#include "backend/cpu/cpu_int.h"
#include "backend/cpu/ops_seq.h"

#include <float.h>

enum {
    ATT_BK = 64,           /* keys per block */
    ATT_TILE = 64 * 256,   /* floats of a Q or O tile: 64 rows at head size 256 */
    ATT_MAX_ROWS = 128,    /* rows per tile at small head sizes (bounds the score tile) */
    ATT_STEPWISE_MAX = 16, /* runs up to this many tokens are tiled as single-token steps */
};

typedef struct {
    const float *q;
    int64_t ldq, q_head_stride;
    int n, pos0;
    const float *k_cache, *v_cache;
    const ts_attn_dims *d;
    float *out;
    int64_t ldo;
    const cpu_seq_kernels *kern;
    int heads_per_item; /* gh: heads of one KV group per item */
    int pos_per_item;   /* bq: positions per item */
    int head_blocks;    /* ceil(group / gh) */
    int pos_blocks;     /* ceil(n / bq) */
    int64_t ldkv;       /* row stride of the keys and values */
    int n_keys; /* > 0: no causal mask (attention_full): query i sees keys 0..n_keys-1, within
                 * window - 1 of i on either side where the window is set */
} attn_job;

/* Per-thread tiles; static TLS rather than the stack, whose size the pool's threads do not
 * promise, and rather than a per-call allocation. */
static _Thread_local float att_q[ATT_TILE], att_o[ATT_TILE], att_s[ATT_MAX_ROWS * ATT_BK];

/* The first key a query at position qpos sees, and one past the last (causal: itself; without
 * the mask: n_keys, or a window's reach ahead) */
static int first_key(const ts_attn_dims *d, int qpos) {
    return d->window > 0 && qpos - d->window + 1 > 0 ? qpos - d->window + 1 : 0;
}
static int key_end(const attn_job *j, int qpos) {
    if (!j->n_keys) return qpos + 1;
    int w = j->d->window;
    return w > 0 && qpos + w < j->n_keys ? qpos + w : j->n_keys;
}

/* Scales, caps and masks row r of the score tile (keys p0..p0+nk-1 for a query at qpos),
 * folds it into the row's running max/sum and turns it into probabilities. Returns the factor
 * the row's output so far must be multiplied by. */
static float softmax_row(const attn_job *j, float *s, int nk, int p0, int qpos, float *m,
                         float *l) {
    const ts_attn_dims *d = j->d;
    int lo = first_key(d, qpos) - p0, hi = key_end(j, qpos) - p0; /* visible: [lo, hi) */
    if (lo < 0) lo = 0;
    if (hi > nk) hi = nk;
    if (lo >= hi) { /* nothing visible in this block */
        for (int c = 0; c < nk; c++)
            s[c] = 0.0f;
        return 1.0f;
    }
    float mx = -FLT_MAX;
    for (int c = lo; c < hi; c++) {
        float v = s[c] * d->scale;
        if (d->softcap > 0) v = d->softcap * tanhf(v / d->softcap);
        s[c] = v;
        mx = v > mx ? v : mx;
    }
    float m_new = mx > *m ? mx : *m;
    float corr = *m == -INFINITY ? 0.0f : expf(*m - m_new);
    for (int c = 0; c < lo; c++)
        s[c] = -INFINITY;
    for (int c = lo; c < hi; c++)
        s[c] -= m_new;
    for (int c = hi; c < nk; c++)
        s[c] = -INFINITY;
    float sum = j->kern->exp_sum(s, nk);
    *l = *l * corr + sum;
    *m = m_new;
    return corr;
}

/* One item: KV head kvh, heads h0..h0+gh-1, positions i0..i0+bq-1; row r = (i - i0) * gh + hh. */
static void attend_item(const attn_job *j, int kvh, int h0, int gh, int i0, int bq) {
    const ts_attn_dims *d = j->d;
    const cpu_seq_kernels *K = j->kern;
    int hd = d->head_dim, R = gh * bq;
    int64_t ldkv = j->ldkv;
    float *Q = att_q, *O = att_o, *S = att_s;
    float m[ATT_MAX_ROWS], l[ATT_MAX_ROWS], corr[ATT_MAX_ROWS];
    for (int r = 0; r < R; r++) {
        const float *src = j->q + (i0 + r / gh) * j->ldq + (h0 + r % gh) * j->q_head_stride;
        for (int c = 0; c < hd; c++)
            Q[r * hd + c] = src[c];
        for (int c = 0; c < hd; c++)
            O[r * hd + c] = 0.0f;
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    int qpos0 = j->pos0 + i0, qpos1 = j->pos0 + i0 + bq - 1;
    int p_end = key_end(j, qpos1); /* keys [first, p_end) */
    const float *kc = j->k_cache + (int64_t)kvh * hd, *vc = j->v_cache + (int64_t)kvh * hd;
    for (int p0 = first_key(d, qpos0); p0 < p_end; p0 += ATT_BK) {
        int nk = p_end - p0 < ATT_BK ? p_end - p0 : ATT_BK;
        K->gemm_nt(R, nk, hd, Q, hd, kc + p0 * ldkv, ldkv, S, ATT_BK);
        for (int r = 0; r < R; r++)
            corr[r] = softmax_row(j, S + r * ATT_BK, nk, p0, j->pos0 + i0 + r / gh, &m[r], &l[r]);
        K->gemm_nn(R, hd, nk, S, ATT_BK, vc + p0 * ldkv, ldkv, O, hd, corr);
    }
    for (int r = 0; r < R; r++) {
        float *o = j->out + (i0 + r / gh) * j->ldo + (int64_t)(h0 + r % gh) * hd;
        float inv = 1.0f / l[r];
        for (int c = 0; c < hd; c++)
            o[c] = O[r * hd + c] * inv;
    }
}

static void attn_task(void *p, int ith, int nth) {
    const attn_job *j = p;
    int group = j->d->n_heads / j->d->n_kv_heads;
    long per_pos = (long)j->d->n_kv_heads * j->head_blocks;
    long total = per_pos * j->pos_blocks;
    for (long w = ith; w < total; w += nth) {
        int ib = (int)(w / per_pos), rest = (int)(w % per_pos);
        int kvh = rest / j->head_blocks, hb = rest % j->head_blocks;
        int h0 = kvh * group + hb * j->heads_per_item;
        int gh = group - hb * j->heads_per_item < j->heads_per_item ? group - hb * j->heads_per_item
                                                                    : j->heads_per_item;
        int i0 = ib * j->pos_per_item;
        int bq = j->n - i0 < j->pos_per_item ? j->n - i0 : j->pos_per_item;
        attend_item(j, kvh, h0, gh, i0, bq);
    }
}

static long ceil_div(long a, long b) { return (a + b - 1) / b; }

/* Tiles the work (the whole group and as many positions as fill a tile, then smaller items
 * until every thread has one - decode: one position, so the group is split) and runs it. */
static void attention_run(ts_backend *be, const float *q, int64_t ldq, int64_t q_head_stride, int n,
                          int pos0, const float *k, const float *v, int64_t ldkv, int n_keys,
                          const ts_attn_dims *dims, float *out, int64_t ldo) {
    if (n <= 0) return;
    cpu_ctx *ctx = cpu_of(be);
    int group = dims->n_heads / dims->n_kv_heads, hd = dims->head_dim;
    int rows = ATT_TILE / hd < ATT_MAX_ROWS ? ATT_TILE / hd : ATT_MAX_ROWS;
    int gh = group < rows ? group : rows;
    int bq = rows / gh < n ? rows / gh : n;
    /* A run of a few tokens (speculative decoding's guesses checked in one step) goes a
     * position an item, as single-token steps go: each row's keys then come in the same blocks
     * and its sums in the same order, so its output is a decode step's to the bit (a block of
     * several positions ends at the last one's key, and a key's place in the kernels' 4-wide
     * tiles moves with it). The answer with guesses is then the one without. */
    if (!n_keys && n <= ATT_STEPWISE_MAX) bq = 1;
    /* a decode step over a short context is less work than waking the threads */
    int keys = n_keys ? n_keys : pos0 + n;
    bool one_thread = (double)dims->n_heads * n * keys * hd < 65536.0;
    int nth = one_thread ? 1 : ts_pool_size(ctx->pool);
    while (bq > 1 && dims->n_kv_heads * ceil_div(group, gh) * ceil_div(n, bq) < nth)
        bq = (bq + 1) / 2;
    while (gh > 1 && dims->n_kv_heads * ceil_div(group, gh) * ceil_div(n, bq) < nth)
        gh = (gh + 1) / 2;
    attn_job j = {.q = q,
                  .ldq = ldq,
                  .q_head_stride = q_head_stride,
                  .n = n,
                  .pos0 = pos0,
                  .k_cache = k,
                  .v_cache = v,
                  .d = dims,
                  .out = out,
                  .ldo = ldo,
                  .kern = cpu_seq_pick(ctx->isa),
                  .heads_per_item = gh,
                  .pos_per_item = bq,
                  .head_blocks = (int)ceil_div(group, gh),
                  .pos_blocks = (int)ceil_div(n, bq),
                  .ldkv = ldkv,
                  .n_keys = n_keys};
    if (one_thread)
        attn_task(&j, 0, 1);
    else
        ts_pool_run(ctx->pool, attn_task, &j);
}

void cpu_op_attention(ts_backend *be, const float *q, int64_t ldq, int64_t q_head_stride, int n,
                      int pos0, const float *k_cache, const float *v_cache,
                      const ts_attn_dims *dims, float *out, int64_t ldo) {
    attention_run(be, q, ldq, q_head_stride, n, pos0, k_cache, v_cache,
                  (int64_t)dims->n_kv_heads * dims->head_dim, 0, dims, out, ldo);
}

/* The same tiles without the causal mask: keys and values are the n tokens' own rows, a window
 * (dims->window > 0) symmetric about each query. */
void cpu_op_attention_full(ts_backend *be, const float *q, int64_t ldq, const float *k,
                           const float *v, int64_t ldkv, int n, const ts_attn_dims *dims,
                           float *out, int64_t ldo) {
    attention_run(be, q, ldq, dims->head_dim, n, 0, k, v, ldkv, n, dims, out, ldo);
}
