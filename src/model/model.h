/* The model factory's internals: ts_model and the per-architecture vtable (ts_arch).
 *
 * Adding a model family = one new file in model/ that defines a ts_arch, plus one line in the
 * registry (registry.c). The engine drives a model only through this vtable; the model drives
 * the hardware only through the backend ops (backend/backend.h). */
#ifndef TS_MODEL_MODEL_H
#define TS_MODEL_MODEL_H

#include <stdbool.h>

#include "backend/backend.h"
#include "format/gguf.h"
#include "format/hfconfig.h"
#include "format/safetensors.h"
#include "tessera.h"

/* One forward step as the engine hands it to a model: every array has n_tokens entries, and
 * slot_state[s] is the state blob of slot s (layout owned by the model). */
typedef struct {
    int n_tokens;
    /* NULL with fed: the tokens are the ids the previous step's held argmax left on the backend
     * (row i's for token i), gathered there (get_rows_fed: decoding ahead, backend.h) */
    const int32_t *tokens;
    bool fed;
    /* the argmax below is queued only (argmax_held), or with sample the draws (sample_held,
     * their ids to argmax): the ids land when the step has run */
    bool held;
    const int32_t *pos;
    const int32_t *slot;
    const uint8_t *wants_logits;
    void *const *slot_state;
    /* NULL: write logits. Else, for each wanted token, the id of its largest logit (greedy
     * decoding without moving the logits to the host). */
    int32_t *argmax;
    /* NULL: as above. Else, for each wanted token, the backend's sampling op is asked for its
     * next token with sample[k] and answers in sample_res[k] (the backend must have the op);
     * the logits, with the requests' adjustments applied, are also written where the forward's
     * logits argument is not NULL (for log-probabilities). */
    const ts_sample_req *sample;
    ts_sample_res *sample_res;
    /* NULL: nothing more. Else (with sample), after the draw a second pass of the sampling op
     * over the adjusted logits with lp_req[k] (ts_sampler_logprob_request) answering in
     * lp_res[k], and where the draw gave a token id, that token's logit in lp_chosen[k]: the
     * log-probabilities' inputs without the logits leaving the backend. */
    const ts_sample_req *lp_req;
    ts_sample_res *lp_res;
    float *lp_chosen;
    /* NULL: as above. Else, for each wanted token, its final hidden state - the final norm's
     * output, the output head's input: n_embd host floats - and no logits at all
     * (ts_engine_forward_hidden: embeddings) */
    float *hidden;
    /* NULL, or per token NULL or n_embd host floats in place of its embedding (ts_batch.embd) */
    const float *const *embd;
    /* NULL, or 3 rotary positions per token (ts_batch.rope_pos) */
    const int32_t *rope_pos;
    /* NULL, or TS_MAX_LORA adapter scales a slot: a token of slot s takes LoRA adapter a at
     * lora[s * TS_MAX_LORA + a] (ts_engine_slot_lora; model/lora.h) */
    const float *lora;
} ts_fwd_batch;

/* An embedding model's layers after the pooling (embed_head.c): each out = act(W in + b) */
#define TS_MAX_DENSE 4
typedef struct {
    int in, out;
    float *w;  /* [out][in] */
    float *b;  /* [out], or NULL */
    bool tanh; /* else the identity */
} ts_dense;

typedef struct {
    int n_dense;
    ts_dense dense[TS_MAX_DENSE];
} ts_embed_head;

typedef struct ts_arch ts_arch;

/* A weight the architecture lets LoRA adapters change (model/lora.h): its decoder layer, its
 * module's name under the layer in Hugging Face's model (PEFT's names: "self_attn.q_proj",
 * "mlp.down_proj"), its name in llama.cpp's GGUF (between "blk.N." and ".weight": "attn_q";
 * NULL where a GGUF adapter's pair could not be used as it is) and the weight its forward
 * multiplies by through the ts_lora_matmul* helpers. */
typedef struct {
    int layer;
    const char *module, *gguf;
    const ts_tensor *w;
} ts_lora_target;

struct ts_lora_set; /* model/lora.h */

struct ts_model {
    const ts_arch *arch;
    char *path;
    ts_hfconfig *cfg; /* HF directory form: config.json + safetensors */
    ts_st *st;
    ts_gguf *gguf; /* GGUF form: metadata and tensors in one file */
    void *impl; /* the architecture's hyper-parameters and weight views */
    ts_model_info info;
    ts_embed_head head; /* an embedding model's Dense layers (none for the others) */
    struct ts_lora_set *lora; /* LoRA adapters loaded (ts_model_lora_load), or NULL */
    int n_engines;            /* engines made for the model and not freed */
    /* ts_model_mtp_enable: the engines run the MTP block on every forward (its KV rows and
     * the last hidden state are part of a slot's state) so that they can draft */
    bool mtp_on;
};

/* A run of per-position rows in a sequence's state (ts_arch.state_rows). */
typedef struct {
    size_t off, row_bytes;
} ts_state_rows;

struct ts_arch {
    const char *name;
    /* Whether this architecture reads an HF config of this (text section) model_type. */
    bool (*matches_hf)(const char *model_type);
    /* Reads hyper-parameters and binds weights; validates every shape and dtype. Fills m->impl
     * and m->info. On error, leaves nothing allocated in m->impl. */
    ts_status (*load_hf)(ts_model *m);
    /* The GGUF `general.architecture` this family reads, and its loader (NULL: none). */
    const char *gguf_arch;
    ts_status (*load_gguf)(ts_model *m);
    void (*unload)(ts_model *m);
    /* Bytes of one sequence's state (KV cache, conv and recurrent state) for n_ctx tokens. */
    size_t (*state_bytes)(const ts_model *m, int n_ctx);
    /* Bytes at the start of that state that sum up the whole sequence so far (conv and
     * recurrent state), as opposed to rows kept per position (a KV cache, which a shorter
     * sequence simply stops reading): what a mark must save for a rewind (ts_engine_slot_mark).
     * NULL: none, the state is all per-position rows. */
    size_t (*seq_state_bytes)(const ts_model *m);
    /* The state's per-position rows (KV caches) for n_ctx tokens: up to max runs, each row p
     * at off + p * row_bytes; returns how many. With seq_state_bytes they make up the whole
     * state, so what a sequence of len tokens uses is its first seq_state_bytes and the first
     * len rows of each run (a snapshot keeps only that: engine/snapshot.c). NULL: not known,
     * the whole state is copied. */
    int (*state_rows)(const ts_model *m, int n_ctx, ts_state_rows *out, int max);
    /* Scratch buffers and device copies of small parameters for batches of up to n_batch tokens. */
    ts_status (*runtime_create)(const ts_model *m, ts_backend *be, int n_batch, int n_ctx,
                                void **rt);
    void (*runtime_free)(void *rt);
    /* Runs one batch (n_tokens <= n_batch); logits rows for wanted tokens go to logits (host). */
    ts_status (*forward)(void *rt, const ts_fwd_batch *b, float *logits);
    /* Multi-token prediction (NULL: the architecture has none; ts_engine_draft): runs the
     * model's MTP block once for each of b's tokens, one a slot, and writes their logits to
     * logits or (b->argmax) their argmax. Token i follows the position b->pos[i], whose final
     * hidden state it is paired with: the slot's last one (kept in its state) or, with chain,
     * the block's own output for row i in the previous call. The block's KV row at b->pos[i]
     * is written. Only with m->mtp_on. */
    ts_status (*draft)(void *rt, const ts_fwd_batch *b, bool chain, float *logits);
    /* Vision (NULL, or false from vision: the model takes no images; see tessera.h). */
    bool (*vision)(const ts_model *m, ts_vision_info *out);
    /* Encodes an image already resized to plan's size into plan->n_tokens rows of n_embd floats
     * (host) on the runtime's backend: one frame (a still image) or a video step's
     * temporal_patch_size frames; the runtime may keep the tower's parameters and working
     * buffers there for the next image. */
    ts_status (*encode_image)(void *rt, const ts_image *const *frames, int n_frames,
                              const ts_image_plan *plan, float *out);
    /* The weights LoRA adapters may change: up to max of them into out (out may be NULL to
     * count), returns how many there are. NULL: the architecture takes no adapters. */
    int (*lora_targets)(const ts_model *m, ts_lora_target *out, int max);
    /* Writes a random checkpoint of a named size; NULL when not provided. */
    ts_status (*synth)(const char *preset, ts_dtype dtype, uint64_t seed, const char *dir);
};

/* The registry (registry.c). */
const ts_arch *ts_arch_find_hf(const char *model_type);
const ts_arch *ts_arch_find_name(const char *name);
const ts_arch *ts_arch_find_gguf(const char *general_architecture);

/* Helpers for loaders (either format): look up a weight and check its rank and shape; the
 * error names the file and tensor. shape entries < 0 are not checked. */
ts_status ts_model_tensor(const ts_model *m, const char *name, int n_dims, const int64_t *shape,
                          const ts_tensor **out);
/* Copies a small float tensor (any float dtype) into dst as fp32 (n elements). */
/* The file that holds a tensor, for messages. */
const char *ts_model_file_of(const ts_model *m, const char *name);
ts_status ts_model_tensor_f32(const ts_model *m, const char *name, int64_t n, float *dst);

/* The pooling and Dense layers of an embedding model (embed_head.c), into m->info.pooling,
 * m->info.n_embd_out and m->head: from a sentence-transformers directory's modules.json (none:
 * nothing to read), or from a GGUF's {arch}.pooling_type and dense_2 / dense_3 tensors. Called
 * after the architecture's loader has filled m->info.n_embd. */
ts_status ts_embed_head_load_st(ts_model *m);
ts_status ts_embed_head_load_gguf(ts_model *m, const char *arch);
void ts_embed_head_free(ts_embed_head *h);

#endif
