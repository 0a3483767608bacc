/* Writing GGUF files from a model (ts_quantize_model): the plan that a model family fills in.
 *
 * A family's hook (qwen35_gguf_plan, gemma3_gguf_plan) writes its metadata keys straight into
 * the writer and declares every output tensor: its llama.cpp name, where its values come from and
 * how they are rearranged on the way (rows and columns picked through index maps, an elementwise
 * op). quantize.c then picks each tensor's type the way llama.cpp's quantizer does, streams the
 * file and does the (multithreaded) conversion. docs/GGUF.md lists the conventions. */
#ifndef TS_MODEL_QUANTIZE_H
#define TS_MODEL_QUANTIZE_H

#include "model/model.h"

typedef enum {
    QZ_OP_NONE,
    QZ_OP_ADD_ONE, /* (1 + w) norms stored as the multiplier itself */
    QZ_OP_NEG_EXP, /* A_log stored as -exp(A_log) */
} qz_op;

typedef struct {
    char name[64];
    /* Values: src viewed as rows x cols (cols = its innermost dimension), read as floats. For a
     * GGUF input, raw/raw_type/raw_bytes let a tensor whose type does not change be copied
     * byte for byte (src may then be NULL: a type tessera cannot decode). */
    const ts_tensor *src;
    const void *raw;
    uint32_t raw_type;
    uint64_t raw_bytes;
    int n_dims;
    int64_t shape[TS_GGUF_MAX_DIMS]; /* output shape, outermost first */
    int64_t rows, cols;
    int64_t *row_map; /* output row r = source row row_map[r]; NULL: identity (owned) */
    int64_t *col_map; /* output col c = source col col_map[c]; NULL: identity (owned) */
    qz_op op;
    int layer; /* blk index, -1 outside the blocks */
    ts_tensor *own;    /* src when the plan made it (qz_add_f32), freed with the plan */
    uint32_t out_type; /* ggml type chosen by quantize.c */
} qz_tensor;

typedef struct {
    ts_gguf_writer *w;
    qz_tensor *t;
    int n, cap;
    int n_layers;
    const char *tok_pre; /* tokenizer.ggml.pre for a tokenizer.json beside the weights, or NULL */
} qz_plan;

/* Declares an output tensor of n_dims (1 or 2) dimensions, rows x cols (rows 1 for 1-D), taking
 * values from src, which must hold rows * cols elements. *out (may be NULL) gets the entry so
 * the caller can attach index maps (qz_new_map). */
ts_status qz_add(qz_plan *p, const char *name, int layer, const ts_tensor *src, int n_dims,
                 int64_t rows, int64_t cols, qz_op op, qz_tensor **out);
/* The same for host floats (rows x cols, row-major) that outlive the plan: a view of them is
 * made, owned by the plan. */
ts_status qz_add_f32(qz_plan *p, const char *name, const float *data, int64_t rows, int64_t cols,
                     qz_tensor **out);
/* A malloc'd index map of n entries, owned by the plan (freed with it). */
int64_t *qz_new_map(int64_t n);

/* llama.cpp's value-head order for Hv > Hk: heads of hd values, grouped by key head in Hugging
 * Face checkpoints (head g*r + j), tiled in GGUF (head j*Hk + g). map[i] = the grouped index of
 * tiled element i, for n_heads * hd elements. */
void qz_tiled_from_grouped(int64_t *map, int n_k_heads, int n_v_heads, int hd);

ts_status qwen35_gguf_plan(const ts_model *m, qz_plan *p);
ts_status gemma3_gguf_plan(const ts_model *m, qz_plan *p);
/* The GGUF architecture a Gemma 3 model is written as: "gemma3", or "gemma-embedding" for an
 * encoder (llama.cpp's name for EmbeddingGemma). */
const char *gemma3_gguf_arch(const ts_model *m);

#endif
