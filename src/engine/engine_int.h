/* The engine's internals: the runtime bound to a model, and the slot pool. */
#ifndef TS_ENGINE_ENGINE_INT_H
#define TS_ENGINE_ENGINE_INT_H

#include "backend/backend.h"
#include "model/model.h"

struct ts_engine {
    ts_model *model;
    ts_backend *be;
    void *rt; /* the model's runtime (scratch, device parameters) */
    int n_slots, n_ctx, n_batch, n_vocab;
    size_t state_bytes;
    void **slot_state; /* [n_slots] state blobs, allocated at creation */
    int *slot_len;     /* tokens held per slot */
    int *pending_len;  /* scratch: per-slot length while checking a batch */
    char desc[64];
    uint8_t *want_scratch; /* [n_batch]: "last token only" when a batch gives no flags */
    /* ts_engine_forward_sample's host side, grown to the most rows asked for so far */
    void *sample_buf;
    ts_sample_req *sample_req;
    ts_sample_res *sample_res;
    float *sample_chosen; /* with log-probabilities: the drawn tokens' logits */
    int sample_rows;
};

#endif
