/* LoRA adapters: low-rank corrections to a model's linear weights, applied as it runs.
 *
 * An adapter holds, for some of the decoder layers' linear weights W [out, in], a pair A [r, in]
 * and B [out, r]; with it a layer computes W x + s * B (A x), where s is the adapter's scale for
 * the token's sequence (ts_engine_slot_lora) times the pair's own (PEFT's lora_alpha / r, folded
 * into B at load). Several adapters may be loaded; each token of a batch takes each of them at
 * its sequence's scale, so requests with different adapters share a step. The weights
 * themselves are never changed: a quantized model keeps its quantized weights, and an adapter at
 * scale 0 costs nothing.
 *
 * Loading (ts_lora_load, the model's): an adapter names weights by decoder layer and module -
 * PEFT's `model.layers.3.self_attn.q_proj` - and the model's architecture lists the weights it
 * can adapt under those names (ts_arch.lora_targets), whatever the model's own file calls them,
 * so an adapter trained on the Hugging Face model also fits its GGUF file.
 *
 * Running (ts_lora_rt, a runtime's): the architecture's forward calls the ts_lora_matmul*
 * helpers below in place of layers.h's; they are those where no adapter of the batch touches
 * the weights. */
#ifndef TS_MODEL_LORA_H
#define TS_MODEL_LORA_H

#include "model/layers.h"
#include "model/model.h"

/* One adapter's pair for one weight, as fp32 copies: A [rp, in], B [out, rp] with the pair's
 * scale folded in, rp the rank padded to a multiple of TS_LORA_RANK_ALIGN with zero rows of A
 * and columns of B (the matmul kernels' row widths). */
#define TS_LORA_RANK_ALIGN 16
typedef struct {
    int adapter;
    ts_tensor A, B;
} ts_lora_pair;

typedef struct {
    const ts_tensor *w; /* NULL: an empty place of the table */
    int n;
    ts_lora_pair *pairs;
} ts_lora_weight;

typedef struct {
    char *path;
    int rank, n_weights;
} ts_lora_adapter;

struct ts_lora_set {
    int n;
    ts_lora_adapter ad[TS_MAX_LORA];
    ts_lora_weight *tab; /* open addressing by weight pointer, cap a power of two */
    int cap;
    int max_rank;     /* padded */
    int64_t max_rows; /* of an adapted weight */
};

/* Loads the adapter at path (a PEFT directory, or a GGUF LoRA file: blk.N.NAME.weight.lora_a /
 * lora_b, scaled by adapter.lora.alpha / r as llama.cpp does, matched by ts_lora_target.gguf)
 * into m->lora; *id its index. Before any engine is made for the model (the runtimes size their
 * buffers by the adapters). */
ts_status ts_lora_load(ts_model *m, const char *path, int *id);
void ts_lora_set_free(struct ts_lora_set *s);
const ts_lora_weight *ts_lora_find(const struct ts_lora_set *s, const ts_tensor *w);

/* A runtime's side: the batch's per-token scales on the backend and the scratch of the pairs'
 * products. */
typedef struct {
    ts_backend *be;
    const struct ts_lora_set *set; /* NULL: no adapters, every helper is layers.h's */
    int n_batch;
    float *scale;         /* backend [TS_MAX_LORA][n_batch]: adapter a's scale for each token */
    float *host;          /* the same, host */
    float *t, *u;         /* backend [n_batch][max_rank], [n_batch][max_rows] */
    bool on[TS_MAX_LORA]; /* this batch: some token takes adapter a */
    bool any;
} ts_lora_rt;

ts_status ts_lora_rt_init(ts_lora_rt *lr, const ts_model *m, ts_backend *be, int n_batch);
void ts_lora_rt_free(ts_lora_rt *lr);
/* At the start of a forward: each token's scales from its slot's (b->lora). */
void ts_lora_rt_begin(ts_lora_rt *lr, const ts_fwd_batch *b);

/* layers.h's ts_matmul_n, ts_matmul_add and ts_matmul_glu, and the backend's plain matmul, each
 * output then corrected by the batch's adapters of its weight. With adapters, a norm the
 * backend would fold into its matmul is applied first (pre->scratch), for the pairs read the
 * normed rows too. */
void ts_lora_matmul_n(ts_lora_rt *lr, const ts_tensor *const *W, int nw, const float *x,
                      int64_t ldx, int n, const ts_prenorm *pre, float *const *y,
                      const int64_t *ldy);
void ts_lora_matmul_add(ts_lora_rt *lr, const ts_tensor *W, const float *x, int64_t ldx, int n,
                        float *y, int64_t ldy, float *tmp);
void ts_lora_matmul(ts_lora_rt *lr, const ts_tensor *W, const float *x, int64_t ldx, int n,
                    float *y, int64_t ldy);
void ts_lora_matmul_glu(ts_lora_rt *lr, const ts_tensor *Wg, const ts_tensor *Wu, const float *x,
                        int64_t ldx, int n, const ts_prenorm *pre, bool gelu, float *tg, float *tu,
                        int64_t ldt, float *out, int64_t ldo);

#endif
