/* The engine: a model's runtime, its slot pool of per-sequence state, and the batched forward.
 *
 * All state is allocated when the engine is created (n_slots × the model's state size for
 * n_ctx tokens), so serving never allocates per request. A batch larger than n_batch is run
 * in pieces; positions are checked against what each slot holds, so a sequence can only be
 * continued, never silently corrupted. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <stdio.h>

#include "backend/cuda/cuda_backend.h"
#include "base/cpu.h"
#include "engine/engine_int.h"
#include "engine/sampler_int.h"

void ts_engine_opts_default(ts_engine_opts *o) {
    *o = (ts_engine_opts){.n_slots = 1, .n_ctx = 4096, .n_batch = 512, .n_threads = 0,
                          .isa = TS_ISA_AUTO, .device = TS_DEVICE_CPU};
}

void ts_engine_free(ts_engine *e) {
    if (!e) return;
    engine_ahead_drop(e);
    engine_ahead_free(e);
    engine_snap_free(e);
    if (e->slot_state)
        for (int i = 0; i < e->n_slots; i++)
            if (e->slot_state[i]) e->be->ops->free(e->be, e->slot_state[i]);
    if (e->mark_state)
        for (int i = 0; i < e->n_slots; i++)
            if (e->mark_state[i]) e->be->ops->free(e->be, e->mark_state[i]);
    if (e->rt) e->model->arch->runtime_free(e->rt);
    ts_backend_free(e->be);
    e->model->n_engines--;
    free(e->slot_lora);
    free(e->slot_state);
    free(e->slot_len);
    free(e->pending_len);
    free(e->mark_state);
    free(e->mark_len);
    free(e->want_scratch);
    free(e->sample_buf);
    free(e->sample_req);
    free(e->sample_res);
    free(e->sample_chosen);
    free(e);
}

ts_status ts_engine_create(ts_model *model, const ts_engine_opts *opts, ts_engine **out) {
    *out = NULL;
    ts_engine_opts o;
    if (opts)
        o = *opts;
    else
        ts_engine_opts_default(&o);
    if (o.n_slots < 1 || o.n_slots > 4096)
        return ts_error(TS_ERR_INVALID, "slots %d out of range 1..4096", o.n_slots);
    if (o.n_ctx < 1 || o.n_ctx > model->info.n_ctx_train)
        return ts_error(TS_ERR_INVALID, "context %d out of range 1..%d (the model's)", o.n_ctx,
                        model->info.n_ctx_train);
    if (o.n_batch < 1 || o.n_batch > 65536)
        return ts_error(TS_ERR_INVALID, "batch %d out of range 1..65536", o.n_batch);
    if (o.device != TS_DEVICE_CPU && o.device != TS_DEVICE_CUDA)
        return ts_error(TS_ERR_INVALID, "unknown device %d", (int)o.device);
    int isa = o.isa == TS_ISA_AUTO ? -1 : (int)o.isa - 1; /* ts_isa -> cpu_isa */
    ts_engine *e = calloc(1, sizeof *e);
    if (!e) return ts_error(TS_ERR_NOMEM, "out of memory");
    e->model = model;
    model->n_engines++; /* no adapters load from now on (lora.c) */
    e->n_slots = o.n_slots;
    e->n_ctx = o.n_ctx;
    e->n_batch = o.n_batch;
    e->n_vocab = model->info.n_vocab;
    e->n_embd = model->info.n_embd;
    ts_status st = o.device == TS_DEVICE_CUDA ? ts_backend_cuda_create(0, &e->be)
                                              : ts_backend_cpu_create(o.n_threads, isa, &e->be);
    if (st == TS_OK) st = model->arch->runtime_create(model, e->be, o.n_batch, o.n_ctx, &e->rt);
    if (st == TS_OK) {
        e->state_bytes = model->arch->state_bytes(model, o.n_ctx);
        e->slot_state = calloc((size_t)o.n_slots, sizeof *e->slot_state);
        e->slot_len = calloc((size_t)o.n_slots, sizeof *e->slot_len);
        e->pending_len = calloc((size_t)o.n_slots, sizeof *e->pending_len);
        e->want_scratch = calloc((size_t)o.n_batch, 1);
        e->seq_bytes = model->arch->seq_state_bytes ? model->arch->seq_state_bytes(model) : 0;
        e->mark_state = calloc((size_t)o.n_slots, sizeof *e->mark_state);
        e->mark_len = malloc((size_t)o.n_slots * sizeof *e->mark_len);
        if (!e->slot_state || !e->slot_len || !e->pending_len || !e->want_scratch ||
            !e->mark_state || !e->mark_len)
            st = ts_error(TS_ERR_NOMEM, "out of memory");
        for (int i = 0; st == TS_OK && i < o.n_slots; i++)
            e->mark_len[i] = -1;
        if (st == TS_OK && ts_model_lora_count(model) > 0 &&
            !(e->slot_lora = calloc((size_t)o.n_slots * TS_MAX_LORA, sizeof *e->slot_lora)))
            st = ts_error(TS_ERR_NOMEM, "out of memory");
    }
    if (st == TS_OK) st = engine_ahead_init(e);
    /* an encoder keeps nothing between calls: no state at all */
    for (int i = 0; st == TS_OK && e->state_bytes && i < o.n_slots; i++) {
        e->slot_state[i] = e->be->ops->alloc(e->be, e->state_bytes);
        if (!e->slot_state[i])
            st = ts_error(TS_ERR_NOMEM, "out of memory for the state of %d sequences of %d tokens "
                          "(%zu MiB each)", o.n_slots, o.n_ctx, e->state_bytes >> 20);
        /* zeroed by the allocation: a clear then zeroes only the summed-up state, and the KV
         * rows past a slot's length, never read, are at worst an earlier sequence's values */
    }
    if (st == TS_OK) st = engine_snap_init(e, o.snap_bytes, o.n_snaps);
    if (st != TS_OK) {
        ts_engine_free(e);
        return st;
    }
    if (ts_backend_cuda_device_name(e->be))
        snprintf(e->desc, sizeof e->desc, "cuda %s", ts_backend_cuda_device_name(e->be));
    else
        snprintf(e->desc, sizeof e->desc, "%s %s x%d", e->be->ops->name,
                 ts_backend_cpu_isa_name(e->be) ? ts_backend_cpu_isa_name(e->be) : "",
                 o.n_threads > 0 ? o.n_threads : ts_cpu_count());
    *out = e;
    return TS_OK;
}

const char *ts_engine_describe(const ts_engine *e) { return e->desc; }

int ts_engine_n_vocab(const ts_engine *e) { return e->n_vocab; }
int ts_engine_n_ctx(const ts_engine *e) { return e->n_ctx; }

ts_status engine_check_slot(const ts_engine *e, int slot) {
    if (slot < 0 || slot >= e->n_slots)
        return ts_error(TS_ERR_INVALID, "slot %d out of range 0..%d", slot, e->n_slots - 1);
    return TS_OK;
}

ts_status ts_engine_slot_clear(ts_engine *e, int slot) {
    TS_TRY(engine_check_slot(e, slot));
    engine_ahead_drop(e);
    /* KV rows past the length are never read, but conv and recurrent state must be zero */
    size_t summed = e->whole_state ? e->state_bytes : e->seq_bytes;
    if (summed) e->be->ops->zero(e->be, e->slot_state[slot], summed);
    e->slot_len[slot] = 0;
    e->mark_len[slot] = -1;
    return TS_OK;
}

int ts_engine_slot_len(const ts_engine *e, int slot) {
    return engine_check_slot(e, slot) == TS_OK ? e->slot_len[slot] : -1;
}

ts_status ts_engine_slot_copy(ts_engine *e, int src, int dst) {
    TS_TRY(engine_check_slot(e, src));
    TS_TRY(engine_check_slot(e, dst));
    engine_ahead_drop(e);
    if (src != dst) {
        if (e->state_bytes)
            engine_copy_used(e, e->slot_state[dst], e->slot_state[src], e->slot_len[src]);
        e->slot_len[dst] = e->slot_len[src];
        e->mark_len[dst] = -1;
        if (e->slot_lora)
            memcpy(e->slot_lora + (size_t)dst * TS_MAX_LORA,
                   e->slot_lora + (size_t)src * TS_MAX_LORA, TS_MAX_LORA * sizeof *e->slot_lora);
    }
    return TS_OK;
}

ts_status ts_engine_slot_lora(ts_engine *e, int slot, const float *scales, int n) {
    TS_TRY(engine_check_slot(e, slot));
    int have = ts_model_lora_count(e->model);
    if (n < 0 || n > have)
        return ts_error(TS_ERR_INVALID, "%d adapter scales for a model with %d LoRA adapters", n,
                        have);
    for (int a = 0; a < n; a++)
        if (!isfinite(scales[a]))
            return ts_error(TS_ERR_INVALID, "LoRA adapter %d: a scale must be a finite number", a);
    if (!e->slot_lora) return TS_OK; /* no adapters: nothing to set */
    float want[TS_MAX_LORA] = {0};
    if (n) memcpy(want, scales, (size_t)n * sizeof *want);
    float *have_s = e->slot_lora + (size_t)slot * TS_MAX_LORA;
    if (memcmp(want, have_s, sizeof want) != 0) {
        engine_ahead_drop(e); /* a held step read the old scales */
        memcpy(have_s, want, sizeof want);
    }
    return TS_OK;
}

ts_status ts_engine_slot_mark(ts_engine *e, int slot) {
    TS_TRY(engine_check_slot(e, slot));
    /* at the mark's length the slot is in the mark's state: a mark again copies nothing (the
     * state only moves on by a forward, which moves the length, or a rewind back to it) */
    if (e->mark_len[slot] == e->slot_len[slot]) return TS_OK;
    engine_ahead_drop(e);
    if (e->seq_bytes) {
        if (!e->mark_state[slot] && !(e->mark_state[slot] = e->be->ops->alloc(e->be, e->seq_bytes)))
            return ts_error(TS_ERR_NOMEM, "out of memory for a mark of slot %d (%zu KiB)", slot,
                            e->seq_bytes >> 10);
        e->be->ops->copy(e->be, e->mark_state[slot], e->slot_state[slot], e->seq_bytes);
    }
    e->mark_len[slot] = e->slot_len[slot];
    return TS_OK;
}

ts_status ts_engine_slot_rewind(ts_engine *e, int slot, int len, int *got) {
    TS_TRY(engine_check_slot(e, slot));
    int mark = e->mark_len[slot];
    if (len > e->slot_len[slot] || len < 0)
        return ts_error(TS_ERR_INVALID, "slot %d holds %d tokens: cannot rewind to %d", slot,
                        e->slot_len[slot], len);
    if (e->seq_bytes && (mark < 0 || len < mark))
        return ts_error(TS_ERR_INVALID, "slot %d: no mark at or before %d tokens to rewind to",
                        slot, len);
    if (len == e->slot_len[slot]) {
        *got = len;
        return TS_OK;
    }
    engine_ahead_drop(e);
    if (e->seq_bytes) { /* the summed-up state goes back to the mark's */
        e->be->ops->copy(e->be, e->slot_state[slot], e->mark_state[slot], e->seq_bytes);
        len = mark;
    }
    e->slot_len[slot] = len;
    if (mark > len) e->mark_len[slot] = -1; /* an attention-only slot cut before its mark */
    *got = len;
    return TS_OK;
}

/* Every token must continue its slot: position == tokens held (plus earlier tokens of the
 * same slot in this batch), inside the context. Checked before any state changes. */
ts_status engine_check_batch(ts_engine *e, const ts_batch *b) {
    if (b->n_tokens < 1) return ts_error(TS_ERR_INVALID, "empty batch");
    if (!b->tokens || !b->pos || !b->slot)
        return ts_error(TS_ERR_INVALID, "batch without tokens, positions or slots");
    memcpy(e->pending_len, e->slot_len, (size_t)e->n_slots * sizeof *e->pending_len);
    for (int i = 0; i < b->n_tokens; i++) {
        TS_TRY(engine_check_slot(e, b->slot[i]));
        int s = b->slot[i];
        if (b->pos[i] != e->pending_len[s])
            return ts_error(TS_ERR_INVALID, "token %d: position %d does not continue slot %d "
                            "(holds %d tokens)", i, b->pos[i], s, e->pending_len[s]);
        if (b->pos[i] >= e->n_ctx)
            return ts_error(TS_ERR_RANGE, "slot %d: position %d is past the context of %d tokens",
                            s, b->pos[i], e->n_ctx);
        if (b->tokens[i] < 0 || b->tokens[i] >= e->n_vocab)
            return ts_error(TS_ERR_RANGE, "token %d: id %d out of range [0, %d)", i, b->tokens[i],
                            e->n_vocab);
        e->pending_len[s]++;
    }
    if ((b->embd || b->rope_pos) && !ts_model_vision(e->model, NULL))
        return ts_error(TS_ERR_UNSUPPORTED, "the model takes no images");
    return TS_OK;
}

/* An encoder's forward has no output head: hidden states only (ts_engine_forward_hidden). */
static ts_status engine_no_text(const ts_engine *e) {
    return ts_error(TS_ERR_UNSUPPORTED,
                    "%s is an embedding model (an encoder): it gives hidden "
                    "states for embeddings, not logits or text",
                    e->model->path);
}

/* logits, or the output fields of o (the model's batch: argmax ids, or draws with their
 * log-probability passes; its input fields are ignored) receive the wanted tokens' outputs:
 * n_vocab floats, one id, or the backend's answer to one sampling request each. */
static ts_status forward(ts_engine *e, const ts_batch *b, float *logits, ts_fwd_batch o) {
    engine_ahead_drop(e);
    TS_TRY(engine_check_batch(e, b));
    if (e->model->info.encoder) {
        if (logits || o.argmax || o.sample) return engine_no_text(e);
        /* every token sees the tokens after it: an input cannot be cut into steps */
        if (b->n_tokens > e->n_batch)
            return ts_error(TS_ERR_INVALID,
                            "an encoder takes its inputs in one call: %d tokens, "
                            "more than the batch of %d",
                            b->n_tokens, e->n_batch);
    }
    for (int start = 0; start < b->n_tokens; start += e->n_batch) {
        int n = b->n_tokens - start < e->n_batch ? b->n_tokens - start : e->n_batch;
        /* without a wants_logits array only the batch's last token gets logits */
        const uint8_t *want;
        if (b->wants_logits) {
            want = b->wants_logits + start;
        } else {
            memset(e->want_scratch, 0, (size_t)n);
            if (start + n == b->n_tokens) e->want_scratch[n - 1] = 1;
            want = e->want_scratch;
        }
        int produced = 0;
        for (int i = 0; i < n; i++) produced += want[i] != 0;
        if (produced && !logits && !o.argmax && !o.sample && !o.hidden)
            return ts_error(TS_ERR_INVALID, "logits wanted but no buffer");
        ts_fwd_batch fb = o;
        fb.n_tokens = n, fb.tokens = b->tokens + start, fb.pos = b->pos + start;
        fb.slot = b->slot + start, fb.wants_logits = want, fb.slot_state = e->slot_state;
        fb.embd = b->embd ? b->embd + start : NULL;
        fb.rope_pos = b->rope_pos ? b->rope_pos + 3 * (size_t)start : NULL;
        fb.lora = e->slot_lora;
        ts_status st = e->model->arch->forward(e->rt, &fb, logits);
        if (st != TS_OK) return st;
        for (int i = 0; i < n; i++) e->slot_len[fb.slot[i]]++;
        if (logits) logits += (size_t)produced * e->n_vocab;
        if (o.argmax) o.argmax += produced;
        if (o.hidden) o.hidden += (size_t)produced * e->n_embd;
        if (o.sample) o.sample += produced, o.sample_res += produced;
        if (o.lp_req) o.lp_req += produced, o.lp_res += produced, o.lp_chosen += produced;
    }
    /* A forward with no output (a prompt's chunk) is done when this returns, as one with
     * output is: on a backend that queues its ops they would otherwise wait for the next call
     * that needs a result, so a caller that checks for a cancellation or a new request between
     * chunks (the server) checked nothing - it queued every chunk at once, and the request it
     * meant to let in waited behind all of them (bench/RESULTS.md). */
    if (!logits && !o.argmax && !o.sample && !o.hidden && e->be->ops->finish)
        e->be->ops->finish(e->be);
    return TS_OK;
}

ts_status ts_engine_forward(ts_engine *e, const ts_batch *b, float *logits) {
    return forward(e, b, logits, (ts_fwd_batch){0});
}

ts_status ts_engine_forward_hidden(ts_engine *e, const ts_batch *b, float *hidden) {
    if (!hidden) return ts_error(TS_ERR_INVALID, "hidden states wanted but no buffer");
    return forward(e, b, NULL, (ts_fwd_batch){.hidden = hidden});
}

ts_status ts_engine_forward_greedy(ts_engine *e, const ts_batch *b, int32_t *ids) {
    if (e->model->info.encoder) return engine_no_text(e);
    if (engine_ahead_fits(e, b)) return engine_ahead_step(e, b, NULL, ids, -1, NULL);
    return forward(e, b, NULL, (ts_fwd_batch){.argmax = ids});
}

/* Host memory for n rows of sampling output: logits when the backend cannot sample, else the
 * rows' candidate subsets (a float and an id per vocabulary entry, the most a row can need);
 * with log-probabilities a draw takes two rows (its own and its log-probability pass). */
static ts_status sample_room(ts_engine *e, int n) {
    size_t per_row = (size_t)e->n_vocab * (sizeof(float) + sizeof(int32_t));
    if (e->sample_rows >= n) return TS_OK;
    void *p = realloc(e->sample_buf, (size_t)n * per_row);
    if (p) e->sample_buf = p;
    ts_sample_req *rq = realloc(e->sample_req, (size_t)n * sizeof *rq);
    if (rq) e->sample_req = rq;
    ts_sample_res *rs = realloc(e->sample_res, (size_t)n * sizeof *rs);
    if (rs) e->sample_res = rs;
    float *ch = realloc(e->sample_chosen, (size_t)n * sizeof *ch);
    if (ch) e->sample_chosen = ch;
    if (!p || !rq || !rs || !ch)
        return ts_error(TS_ERR_NOMEM, "out of memory for %d sampled rows", n);
    e->sample_rows = n;
    return TS_OK;
}

/* The logit the k-th draw took: read back by the backend where the draw gave an id, else in
 * the candidate list the host drew from. */
static float drawn_logit(const ts_engine *e, int k, int32_t id) {
    const ts_sample_res *r = &e->sample_res[k];
    if (r->id >= 0) return e->sample_chosen[k];
    for (int i = 0; i < r->n; i++)
        if (r->tok[i] == id) return r->logit[i];
    return -INFINITY;
}

/* ts_engine_forward_sample; with logits (not NULL) ts_engine_forward_sample_logits, with lps
 * ts_engine_forward_sample_logprobs. */
static ts_status forward_sample(ts_engine *e, const ts_batch *b, ts_sampler *const *samplers,
                                int32_t *ids, float *logits, int n_top, ts_logprobs *lps) {
    if (e->model->info.encoder) return engine_no_text(e);
    int n_want = 0;
    for (int i = 0; b->wants_logits && i < b->n_tokens; i++)
        n_want += b->wants_logits[i] != 0;
    if (!b->wants_logits) n_want = b->n_tokens > 0;
    for (int k = 0; k < n_want; k++)
        if (!samplers || !samplers[k] || ts_sampler_n_vocab(samplers[k]) != e->n_vocab)
            return ts_error(TS_ERR_INVALID, "sampled token %d: no sampler for a vocabulary of "
                            "%d", k, e->n_vocab);
    if (lps && (n_top < 0 || n_top > TS_MAX_TOP_LOGPROBS))
        return ts_error(TS_ERR_INVALID, "log-probabilities: %d alternatives asked (0 .. %d)",
                        n_top, TS_MAX_TOP_LOGPROBS);
    /* draws that end on the device can be decoded ahead (engine/ahead.c), with their
     * log-probabilities where the backend answers those with the held step */
    bool on_device = !logits && e->be->ops->sample && engine_ahead_fits(e, b) &&
                     (!lps || e->be->ops->sample_held_logprobs);
    ts_sample_req lpq = ts_sampler_logprob_request(n_top);
    for (int k = 0; on_device && k < n_want; k++) {
        ts_sample_req next = ts_sampler_peek(samplers[k]);
        on_device = e->be->ops->sample_held_fits(e->be, &next, lps ? &lpq : NULL, e->n_vocab) &&
                    (next.n_adjust <= 0 || e->be->ops->sample_held_adjust);
    }
    if (on_device) return engine_ahead_step(e, b, samplers, ids, lps ? n_top : -1, lps);
    int rows = n_want > 0 ? n_want : 1;
    TS_TRY(sample_room(e, lps ? 2 * rows : rows));
    if (!e->be->ops->sample) { /* the logits come to the host, where the sampler runs */
        if (!logits) logits = e->sample_buf;
        TS_TRY(forward(e, b, logits, (ts_fwd_batch){0}));
        for (int k = 0; k < n_want; k++) {
            float *row = logits + (size_t)k * e->n_vocab;
            ts_sampler_adjust(samplers[k], row);
            ids[k] = ts_sampler_sample(samplers[k], row);
            if (lps) ts_sampler_logprobs(samplers[k], row, ids[k], n_top, &lps[k]);
        }
        return TS_OK;
    }
    /* rows [0, n_want): the draws; [n_want, 2 n_want): their log-probability passes */
    int all = lps ? 2 * n_want : n_want;
    float *lg = e->sample_buf;
    int32_t *tk = (int32_t *)(lg + (size_t)all * e->n_vocab);
    for (int k = 0; k < all; k++) {
        e->sample_req[k] = k < n_want ? ts_sampler_request(samplers[k])
                                      : ts_sampler_logprob_request(n_top);
        e->sample_res[k] = (ts_sample_res){.id = -1,
                                           .logit = lg + (size_t)k * e->n_vocab,
                                           .tok = tk + (size_t)k * e->n_vocab};
    }
    ts_fwd_batch o = {.sample = e->sample_req, .sample_res = e->sample_res};
    if (lps)
        o.lp_req = e->sample_req + n_want, o.lp_res = e->sample_res + n_want,
        o.lp_chosen = e->sample_chosen;
    TS_TRY(forward(e, b, logits, o));
    for (int k = 0; k < n_want; k++) {
        const ts_sample_res *r = &e->sample_res[k];
        if (r->id < 0 && r->n <= 0) /* the backend recorded why; nothing to draw from */
            return ts_error(TS_ERR_IO, "%s: sampling on the device failed (see the message above)",
                            e->be->ops->name);
        ids[k] = ts_sampler_finish(samplers[k], &e->sample_req[k], r);
        if (ids[k] < 0)
            return ts_error(TS_ERR_IO, "%s: the device's candidate list held no valid token",
                            e->be->ops->name);
        if (lps && !ts_sampler_logprobs_list(samplers[k], &e->sample_res[n_want + k],
                                             drawn_logit(e, k, ids[k]), n_top, &lps[k]))
            return ts_error(TS_ERR_IO, "%s: the device's log-probability list held no token",
                            e->be->ops->name);
    }
    return TS_OK;
}

ts_status ts_engine_forward_sample(ts_engine *e, const ts_batch *b, ts_sampler *const *samplers,
                                   int32_t *ids) {
    return forward_sample(e, b, samplers, ids, NULL, 0, NULL);
}

ts_status ts_engine_forward_sample_logits(ts_engine *e, const ts_batch *b,
                                          ts_sampler *const *samplers, int32_t *ids,
                                          float *logits) {
    if (!logits) return ts_error(TS_ERR_INVALID, "forward_sample_logits without a logits buffer");
    return forward_sample(e, b, samplers, ids, logits, 0, NULL);
}

ts_status ts_engine_forward_sample_logprobs(ts_engine *e, const ts_batch *b,
                                            ts_sampler *const *samplers, int n_top, int32_t *ids,
                                            ts_logprobs *lps) {
    if (!lps) return ts_error(TS_ERR_INVALID, "forward_sample_logprobs without an output array");
    return forward_sample(e, b, samplers, ids, NULL, n_top, lps);
}
