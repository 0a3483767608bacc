/* Qwen3.5 text decoder (hybrid Gated DeltaNet + gated full attention): private definitions
 * shared by the loader (qwen35.c), the forward pass (qwen35_forward.c) and the synthetic
 * checkpoint writer (qwen35_synth.c). Math: specs/models.md Part A. */
#ifndef TS_MODEL_QWEN35_H
#define TS_MODEL_QWEN35_H

#include "model/model.h"

#define QWEN35_MAX_LAYERS 256
#define QWEN35_MAX_ROT    512 /* rotary dims: at most the head size (checked at load) */

typedef struct qwen35_vision qwen35_vision;

typedef struct {
    int n_vocab, n_embd, n_layers, n_ff;
    int n_head, n_kv_head, head_dim, rot_dim; /* full attention */
    bool attn_gate;                           /* q_proj also yields a sigmoid output gate */
    int lin_hk, lin_hv, lin_dk, lin_dv, conv_k; /* Gated DeltaNet */
    float rope_theta, eps;
    /* MRoPE: frequency slots per axis (time, height, width) and whether they interleave
     * (THWTHW...; else three runs); with text alone every axis is the token's place */
    int mrope_section[3];
    bool mrope_interleaved;
    int n_ctx_train;
    bool tied;
    bool is_full[QWEN35_MAX_LAYERS];
} qwen35_hparams;

static inline int qwen35_conv_dim(const qwen35_hparams *h) {
    return 2 * h->lin_hk * h->lin_dk + h->lin_hv * h->lin_dv;
}

/* Weights of one layer: views into the checkpoint (big matrices) and fp32 copies of the small
 * vectors. Decoder norms are stored as (1 + w), folded here. */
typedef struct {
    float *ln1, *ln2; /* [n_embd], already 1 + w */
    const ts_tensor *gate, *up, *down;
    /* linear attention */
    const ts_tensor *in_qkv, *in_z, *in_b, *in_a, *out_proj;
    float *conv_w;    /* [conv_dim][conv_k] */
    float *neg_exp_a; /* [Hv]: -exp(A_log) */
    float *dt_bias;   /* [Hv] */
    float *gnorm;     /* [lin_dv], plain w */
    /* full attention */
    const ts_tensor *wq, *wk, *wv, *wo;
    float *q_norm, *k_norm; /* [head_dim], 1 + w */
} qwen35_layer;

/* tensors a GGUF load rearranged into memory of its own (qwen35_regroup_v) */
#define QWEN35_MAX_OWNED (5 * QWEN35_MAX_LAYERS)

typedef struct {
    qwen35_hparams hp;
    const ts_tensor *embed, *lm_head;
    float *final_norm; /* 1 + w */
    qwen35_layer layers[QWEN35_MAX_LAYERS];
    float *host_params; /* one allocation behind every float* above */
    ts_tensor *owned[QWEN35_MAX_OWNED];
    int n_owned;
    qwen35_vision *vision; /* NULL: text only */
} qwen35_model;

/* Byte offsets of a layer's pieces inside one slot's state blob. */
typedef struct {
    size_t conv, rec;   /* linear layers */
    size_t kc, vc;      /* full layers */
} qwen35_state_off;

void qwen35_state_layout(const qwen35_hparams *h, int n_ctx, qwen35_state_off *offs, size_t *total,
                         size_t *seq_total);

size_t qwen35_state_bytes(const ts_model *m, int n_ctx);
size_t qwen35_seq_state_bytes(const ts_model *m);
int qwen35_state_rows(const ts_model *m, int n_ctx, ts_state_rows *out, int max);
ts_status qwen35_runtime_create(const ts_model *m, ts_backend *be, int n_batch, int n_ctx,
                                void **rt);
void qwen35_runtime_free(void *rt);
ts_status qwen35_forward(void *rt, const ts_fwd_batch *b, float *logits);
/* The vision tower on the runtime's backend (the arch's encode_image; qwen35_vision.h). */
ts_status qwen35_encode_image(void *rt, const ts_image *const *frames, int n_frames,
                              const ts_image_plan *plan, float *out);
/* GGUF (llama.cpp's qwen35 conventions, qwen35_gguf.c): hyper-parameters from the metadata, and
 * the value heads of a linear layer put back into Hugging Face's order after loading. */
ts_status qwen35_read_gguf_hparams(const ts_model *m, qwen35_hparams *h);
ts_status qwen35_regroup_v(qwen35_model *q, int layer);

ts_status qwen35_synth(const char *preset, ts_dtype dtype, uint64_t seed, const char *dir);

#endif
