/* The engine's internals: the runtime bound to a model, and the slot pool. */
#ifndef TS_ENGINE_ENGINE_INT_H
#define TS_ENGINE_ENGINE_INT_H

#include "backend/backend.h"
#include "model/model.h"

/* Decoding ahead (ahead.c): while greedy step t runs on a backend that can hold ops, the
 * engine queues step t + 1 - the same sequences one position on, fed the ids step t's argmax
 * leaves on the device - and launches it when the next call asks for exactly that step (else
 * drops it; nothing of it ran). The host's work for a step then overlaps the device's. */
typedef struct {
    bool off;  /* TESSERA_DECODE_AHEAD=0, no backend support, or the model refused once */
    bool held; /* a step is held on the backend: n tokens, slots slot[], positions pos[] */
    int n;
    int32_t *pos, *slot; /* [n_batch] */
    /* [3 * n_batch] the held step's rotary positions (ts_batch.rope_pos): each token's position
     * plus its shift, three times (text after an image in Qwen3.5) */
    int32_t *rope3;
    uint8_t *want;       /* [n_batch] ones */
    /* [n_batch] each: the held argmax ids of the step launched last (ids[cur]) and of the
     * step held after it (ids[!cur]), which that step was fed */
    int32_t *ids[2];
    int cur;
    /* with samplers: the held step's draws (their uniform numbers taken ahead from copies of
     * the generators: ts_sampler_peek) and the launched step's */
    bool sampled;
    ts_sample_req *req, *req_now; /* [n_batch] */
    /* with log-probabilities: the held step's n_top (-1: none), the requests for its lists
     * ([n_batch]), and as for ids the launched and the held step's answers and drawn logits
     * ([2][n_batch]; the lists' entries in lp_logit / lp_tok) */
    int lp_top;
    ts_sample_req *lp_req;
    ts_sample_res *lp_res[2];
    float *lp_chosen[2], *lp_logit;
    int32_t *lp_tok;
    long launched_held; /* steps launched that had been held (tests check that it happens) */
} ts_ahead;

struct ts_engine {
    ts_model *model; /* counted in model->n_engines while the engine exists */
    ts_backend *be;
    void *rt; /* the model's runtime (scratch, device parameters) */
    int n_slots, n_ctx, n_batch, n_vocab, n_embd;
    size_t state_bytes;
    void **slot_state; /* [n_slots] state blobs, allocated at creation */
    int *slot_len;     /* tokens held per slot */
    int *pending_len;  /* scratch: per-slot length while checking a batch */
    /* [n_slots][TS_MAX_LORA] each slot's LoRA adapter scales (ts_engine_slot_lora); NULL when
     * the model has no adapters */
    float *slot_lora;
    /* marks (ts_engine_slot_mark): the first seq_bytes of a slot's state at mark_len[slot]
     * tokens (-1: no mark), in a buffer made at the slot's first mark */
    size_t seq_bytes;
    void **mark_state;
    int *mark_len;
    /* what a sequence of len tokens uses of a slot's state: the first seq_bytes and the
     * first len rows of each run (n_rows 0 and whole_state: the model does not say; all of
     * it) - engine/snapshot.c */
    ts_state_rows *rows;
    int n_rows;
    bool whole_state;
    /* prefix snapshots: pages of page_bytes in one pool, a stack of the free ones, and each
     * snapshot's length (-1: empty) and pages */
    char *snap_pool;
    size_t page_bytes;
    int n_pages, n_free;
    int *free_pages;
    int n_snaps;
    struct engine_snap {
        int len, n_pages;
        int *pages;
    } * snaps;
    char desc[64];
    uint8_t *want_scratch; /* [n_batch]: "last token only" when a batch gives no flags */
    /* ts_engine_forward_sample's host side, grown to the most rows asked for so far */
    void *sample_buf;
    ts_sample_req *sample_req;
    ts_sample_res *sample_res;
    float *sample_chosen; /* with log-probabilities: the drawn tokens' logits */
    int sample_rows;
    ts_ahead ahead;
};

/* The engine's checks (engine.c): a slot's index; a batch's positions continue their slots,
 * its ids in range. */
ts_status engine_check_slot(const ts_engine *e, int slot);
ts_status engine_check_batch(ts_engine *e, const ts_batch *b);
/* ahead.c */
/* snapshot.c: the state's layout and the snapshot pool, at creation and freeing; the copy
 * of what len tokens use of a slot's state */
ts_status engine_snap_init(ts_engine *e, size_t pool_bytes, int n_snaps);
void engine_snap_free(ts_engine *e);
void engine_copy_used(ts_engine *e, void *dst, const void *src, int len);

ts_status engine_ahead_init(ts_engine *e);
void engine_ahead_free(ts_engine *e);
/* Forgets the held step, if any (before anything else uses the backend). */
void engine_ahead_drop(ts_engine *e);
/* Whether b is a decode step that can go ahead: one token for each of its slots, each
 * wanting its output, within a piece of the batch; no embedding rows, and rotary positions
 * (if any) the same three a token (so one shift a token, which the held step keeps). */
bool engine_ahead_fits(const ts_engine *e, const ts_batch *b);
/* ts_engine_forward_greedy (samplers NULL) or ts_engine_forward_sample (draws that end on the
 * device: the backend's sample_held_fits) for such a batch, holding the step after it; with
 * lps (n_top alternatives; NULL, n_top -1: none) ts_engine_forward_sample_logprobs, where the
 * backend has sample_held_logprobs. */
ts_status engine_ahead_step(ts_engine *e, const ts_batch *b, ts_sampler *const *samplers,
                            int32_t *ids, int n_top, ts_logprobs *lps);

#endif
