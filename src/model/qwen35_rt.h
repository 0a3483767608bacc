/* Qwen3.5's runtime: the scratch of a forward pass on one backend, shared by the decoder's
 * forward (qwen35_forward.c) and the multi-token-prediction block's (qwen35_mtp.c). */
#ifndef TS_MODEL_QWEN35_RT_H
#define TS_MODEL_QWEN35_RT_H

#include "model/layers.h"
#include "model/lora.h"
#include "model/qwen35.h"

typedef struct qwen35_venc qwen35_venc;

/* The MTP block's working buffers (with ts_model.mtp_on). */
typedef struct {
    qwen35_state_off off; /* its KV rows (kc, vc) and the last hidden state (conv) */
    float *e;             /* [n_batch][D] the batch's input embeddings */
    float *h;             /* [n_batch + 1][D] hidden states, row i + 1 token i's */
    float *c;             /* [n_batch][2D] the normed embedding and hidden state side by side */
    float *g;             /* [n_batch][D] the block's last output (a draft's, for the next) */
    int32_t *pos, *rpos;  /* [n_batch] positions and rotary positions of the block's rows */
    ts_run *runs;         /* [n_batch] */
} qwen35_mtp_rt;

typedef struct {
    const qwen35_model *q;
    ts_backend *be;
    int n_batch, n_ctx;
    qwen35_state_off offs[QWEN35_MAX_LAYERS];
    /* scratch, [n_batch][width] each */
    float *x, *h, *t1, *t2, *t3, *t4, *t5, *t6;
    float *g, *beta; /* [n_batch][Hv] */
    float *lh;       /* [ts_logit_rows(n_batch)][n_embd] */
    float *logits;   /* [ts_logit_rows(n_batch)][n_vocab] */
    /* backend copies of the small parameters (same layout as the host block) */
    float *params;
    int32_t *sel;      /* [n_batch] indices of tokens whose logits are wanted */
    ts_run *runs;      /* [n_batch] */
    ts_seq_run *sruns; /* [n_batch] the runs with one layer's state buffers */
    /* a batch with rotary positions of its own (images): each token's cosines and sines,
     * [n_batch][rot_dim] on the backend and its host copy; NULL where the backend has no
     * rope_cs */
    float *rope_cs, *rope_cs_host;
    /* this forward's rotary positions: the batch's pos, or one a token where its three MRoPE
     * positions are equal (rope_one, host); mrope: they are not, rope_cs rotates */
    const int32_t *rpos;
    int32_t *rope_one;
    bool mrope;
    qwen35_venc *venc; /* the vision tower's workspace on be (NULL until the first image) */
    ts_lora_rt lora;
    bool mtp; /* the MTP block runs (ts_model.mtp_on, and the model has one) */
    qwen35_mtp_rt mtp_rt;
} qwen35_rt;

/* The backend copy of a host parameter vector. */
static inline const float *qwen35_param(const qwen35_rt *rt, const float *host) {
    return rt->params + (host - rt->q->host_params);
}

/* A batch's size, token ids (unless fed) and positions within the runtime's (qwen35_forward.c). */
ts_status qwen35_check_batch(const qwen35_rt *rt, const ts_fwd_batch *b);

/* A full-attention block's mixer and a block's gated MLP over the batch in rt->x (its residual
 * stream, to which they add), the mixer's KV rows at off's: for the nr runs given, rotated at
 * rt->rpos (or rt->mrope's table). */
void qwen35_full_attention(qwen35_rt *rt, const qwen35_layer *ly, const qwen35_state_off *off,
                           const ts_fwd_batch *b, const ts_run *runs, int nr,
                           const ts_prenorm *pre);
void qwen35_mlp(qwen35_rt *rt, const qwen35_layer *ly, int n, const ts_prenorm *pre);

/* qwen35_mtp.c: the MTP block's buffers (made and freed with the runtime), and its rows for a
 * forward's tokens - each token at p > 0 paired with the final hidden state of p - 1, run
 * through the block so that its KV rows follow the sequence (rt->x: the final layer's output;
 * rt->mtp_rt.e: the batch's embeddings) */
ts_status qwen35_mtp_rt_init(qwen35_rt *rt, int n_batch);
void qwen35_mtp_rt_free(qwen35_rt *rt);
void qwen35_mtp_follow(qwen35_rt *rt, const ts_fwd_batch *b, const ts_run *runs, int nr);

#endif
