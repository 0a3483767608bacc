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
    /* multi-token-prediction blocks the file declares (config mtp_num_hidden_layers, GGUF
     * nextn_predict_layers: extra blocks after the n_layers, not counted in them) */
    int n_mtp;
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

/* The multi-token-prediction block (checkpoints' `mtp.*`, a GGUF's extra block with its
 * `nextn.*` tensors): it drafts the token after next for speculative decoding (qwen35_mtp.c).
 * From the final hidden state h of a position (the final norm's output) and the embedding e of
 * the token after it: u = fc [enorm(e); hnorm(h)], one full-attention decoder layer over u with
 * its own KV rows, then norm and the model's output head. */
typedef struct {
    bool present;
    const ts_tensor *fc;         /* [D, 2D] */
    float *enorm, *hnorm, *norm; /* [D] each, 1 + w */
    qwen35_layer layer;          /* a full-attention layer */
} qwen35_mtp;

/* tensors a GGUF load rearranged into memory of its own (qwen35_regroup_v) */
#define QWEN35_MAX_OWNED (5 * QWEN35_MAX_LAYERS)

typedef struct {
    qwen35_hparams hp;
    const ts_tensor *embed, *lm_head;
    float *final_norm; /* 1 + w */
    qwen35_layer layers[QWEN35_MAX_LAYERS];
    qwen35_mtp mtp;     /* present: false without one */
    float *host_params; /* one allocation behind every float* above */
    size_t n_host_params;
    ts_tensor *owned[QWEN35_MAX_OWNED];
    int n_owned;
    qwen35_vision *vision; /* NULL: text only */
} qwen35_model;

/* Byte offsets of a layer's pieces inside one slot's state blob. */
typedef struct {
    size_t conv, rec;   /* linear layers */
    size_t kc, vc;      /* full layers */
} qwen35_state_off;

/* With mtp (ts_model.mtp_on): the MTP block's KV rows (kc, vc in *mtp_off) and the last final
 * hidden state the sequence's forward made (mtp_off->conv: n_embd floats, in the summed-up
 * part). mtp_off may be NULL without. */
void qwen35_state_layout(const qwen35_hparams *h, bool mtp, int n_ctx, qwen35_state_off *offs,
                         qwen35_state_off *mtp_off, size_t *total, size_t *seq_total);

size_t qwen35_state_bytes(const ts_model *m, int n_ctx);
size_t qwen35_seq_state_bytes(const ts_model *m);
int qwen35_state_rows(const ts_model *m, int n_ctx, ts_state_rows *out, int max);
ts_status qwen35_runtime_create(const ts_model *m, ts_backend *be, int n_batch, int n_ctx,
                                void **rt);
void qwen35_runtime_free(void *rt);
ts_status qwen35_forward(void *rt, const ts_fwd_batch *b, float *logits);
/* The arch's draft (ts_arch.draft; qwen35_mtp.c). */
ts_status qwen35_draft(void *rt, const ts_fwd_batch *b, bool chain, float *logits);
/* The vision tower on the runtime's backend (the arch's encode_image; qwen35_vision.h). */
ts_status qwen35_encode_image(void *rt, const ts_image *const *frames, int n_frames,
                              const ts_image_plan *plan, float *out);
/* GGUF (llama.cpp's qwen35 conventions, qwen35_gguf.c): hyper-parameters from the metadata, and
 * the value heads of a linear layer put back into Hugging Face's order after loading. */
ts_status qwen35_read_gguf_hparams(const ts_model *m, qwen35_hparams *h);
ts_status qwen35_regroup_v(qwen35_model *q, int layer);

ts_status qwen35_synth(const char *preset, ts_dtype dtype, uint64_t seed, const char *dir);

#endif
