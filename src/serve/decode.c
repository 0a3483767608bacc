#include "serve/decode.h"

#include "base/status.h"
#include "serve/decode_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static ts_status lane_init(serve_lane *ln, int slot, int n_vocab, int n_ctx, int draft_max) {
    ln->slot = slot;
    ln->pending_snap = -1;
    ln->seq = malloc((size_t)n_ctx * sizeof *ln->seq);
    ln->gen_count = calloc((size_t)n_vocab, sizeof *ln->gen_count);
    ln->adj = malloc((size_t)n_vocab * sizeof *ln->adj);
    ln->adj_at = malloc((size_t)n_vocab * sizeof *ln->adj_at);
    ln->draft = malloc((size_t)(draft_max > 0 ? draft_max : 1) * sizeof *ln->draft);
    if (!ln->seq || !ln->gen_count || !ln->adj || !ln->adj_at || !ln->draft)
        return ts_error(TS_ERR_NOMEM, "out of memory for the decoder's lanes");
    for (int t = 0; t < n_vocab; t++)
        ln->adj_at[t] = -1;
    return TS_OK;
}

ts_status serve_decoder_init(serve_decoder *d, const serve_decoder_opts *o, serve_job_done_fn done,
                             void *done_ctx) {
    memset(d, 0, sizeof *d);
    d->o = *o;
    d->done = done;
    d->done_ctx = done_ctx;
    d->think_open = d->think_close = d->turn_start = -1;
    d->n_vocab = ts_engine_n_vocab(o->engine);
    d->n_ctx = ts_engine_n_ctx(o->engine);
    if (d->o.prefill_chunk < 1 || d->o.next_turn_chunk < 1 || d->o.n_lanes < 1)
        return ts_error(TS_ERR_INVALID, "prefill chunks of %d and %d tokens, %d lanes",
                        d->o.prefill_chunk, d->o.next_turn_chunk, d->o.n_lanes);
    if (d->o.next_turn_chunk > d->o.prefill_chunk) d->o.next_turn_chunk = d->o.prefill_chunk;
    size_t chunk = (size_t)d->o.prefill_chunk, nl = (size_t)d->o.n_lanes;
    d->lane = calloc(nl, sizeof *d->lane);
    d->logits = malloc(nl * (size_t)d->n_vocab * sizeof *d->logits);
    d->tok = malloc(chunk * sizeof *d->tok);
    d->pos = malloc(chunk * sizeof *d->pos);
    d->slot = malloc(chunk * sizeof *d->slot);
    d->want = malloc(chunk > nl ? chunk : nl);
    d->b_tok = malloc(nl * sizeof *d->b_tok);
    d->b_pos = malloc(nl * sizeof *d->b_pos);
    d->b_slot = malloc(nl * sizeof *d->b_slot);
    d->b_drawn = malloc(nl * sizeof *d->b_drawn);
    d->b_lane = malloc(nl * sizeof *d->b_lane);
    d->b_smp = malloc(nl * sizeof *d->b_smp);
    d->b_lp = malloc(nl * sizeof *d->b_lp);
    d->b_in = malloc(nl * sizeof *d->b_in);
    d->b_piece = malloc(nl * sizeof *d->b_piece);
    d->b_row = malloc(nl * sizeof *d->b_row);
    d->embd = malloc(chunk * sizeof *d->embd);
    d->rope = malloc(3 * chunk * sizeof *d->rope);
    d->b_rope = malloc(3 * nl * sizeof *d->b_rope);
    if (!d->lane || !d->logits || !d->tok || !d->pos || !d->slot || !d->want || !d->b_tok ||
        !d->b_pos || !d->b_slot || !d->b_drawn || !d->b_lane || !d->b_smp || !d->b_lp || !d->b_in ||
        !d->b_piece || !d->b_row || !d->embd || !d->rope || !d->b_rope)
        return ts_error(TS_ERR_NOMEM, "out of memory for the decoder");
    for (int l = 0; l < d->o.n_lanes; l++)
        TS_TRY(lane_init(&d->lane[l], l, d->n_vocab, d->n_ctx, d->o.draft_max));
    if (d->o.draft_max > 0) TS_TRY(serve_spec_init(d));
    for (int32_t id = 0; d->o.tok && id < d->n_vocab; id++) {
        if (!ts_tokenizer_is_eog(d->o.tok, id)) continue;
        int32_t *p = realloc(d->eog, (size_t)(d->n_eog + 1) * sizeof *p);
        if (!p) return ts_error(TS_ERR_NOMEM, "out of memory for the decoder");
        d->eog = p;
        d->eog[d->n_eog++] = id;
    }
    return TS_OK;
}

void serve_decoder_free(serve_decoder *d) {
    for (int l = 0; d->lane && l < d->o.n_lanes; l++) {
        serve_lane *ln = &d->lane[l];
        if (ln->ended) serve_job_unref(ln->ended);
        free(ln->seq), free(ln->gen_count), free(ln->adj), free(ln->adj_at), free(ln->draft);
        free(ln->pool_sum);
        ts_grammar_matcher_free(ln->gm);
    }
    ts_grammar_vocab_free(d->gvocab);
    free(d->gm_row);
    free(d->lane), free(d->logits), free(d->tok), free(d->pos), free(d->slot), free(d->want);
    free(d->b_tok), free(d->b_pos), free(d->b_slot), free(d->b_drawn), free(d->b_lane);
    free(d->b_smp), free(d->b_lp), free(d->b_in), free(d->b_piece), free(d->b_row);
    free(d->echo_rows), free(d->hidden), free(d->e_pooled), free(d->e_out), free(d->e_lane);
    ts_sampler_free(d->echo_smp);
    free(d->embd), free(d->rope), free(d->b_rope);
    free(d->eog);
    serve_spec_free(d);
    memset(d, 0, sizeof *d);
}

static bool cancelled(const serve_job *j) { return atomic_load(&j->cancel); }

/* The text output's sink; called with j->mu held, so that a token's text and its
 * log-probability reach a streaming reader together (serve_lane_token). */
static ts_status sink(void *ctx, serve_channel ch, const char *s, size_t n) {
    serve_job *j = ctx;
    if (!n) return TS_OK;
    ts_status st = TS_OK;
    if (j->n_seg == j->cap_seg) {
        int cap = j->cap_seg ? 2 * j->cap_seg : 64;
        serve_segment *p = realloc(j->seg, (size_t)cap * sizeof *p);
        if (!p) st = ts_error(TS_ERR_NOMEM, "out of memory");
        else j->seg = p, j->cap_seg = cap;
    }
    if (st == TS_OK) {
        size_t off = j->text.len;
        st = ts_strbuf_append(&j->text, s, n);
        if (st == TS_OK) j->seg[j->n_seg++] = (serve_segment){ch, off, n};
    }
    return st;
}

static bool has_penalties(const serve_job *j) {
    return j->repetition_penalty != 1.0f || j->frequency_penalty != 0.0f ||
           j->presence_penalty != 0.0f;
}

/* The request's logit_bias and its penalties are kept as a list of logit adjustments
 * (ts_logit_adjust), one per token they touch: the biased tokens; with a repetition penalty
 * every token of the prompt and the answer, else with the other penalties the answer's. A draw
 * in the forward hands the list to the sampler (ts_sampler_set_adjust); the first token, drawn
 * here from the prompt's logits, gets it applied here (ts_logit_adjust_apply, the same float
 * operations). */

/* Token t's entry in the list, made (adjusting nothing) when it has none. */
static ts_logit_adjust *adjust_entry(serve_lane *ln, int32_t t) {
    if (ln->adj_at[t] < 0) {
        ln->adj_at[t] = ln->n_adj++;
        ln->adj[ln->adj_at[t]] = (ts_logit_adjust){t, 0.0f, 1.0f, 0.0f};
    }
    return &ln->adj[ln->adj_at[t]];
}

/* Token t is in the prompt or the answer: the repetition penalty applies to it, and its
 * frequency and presence terms once it is in the answer. A biased token keeps its bias. */
static void adjust_token(serve_lane *ln, int32_t t) {
    const serve_job *j = ln->job;
    float sub = ln->gen_count[t]
                    ? j->frequency_penalty * (float)ln->gen_count[t] + j->presence_penalty
                    : 0.0f;
    ts_logit_adjust *a = adjust_entry(ln, t);
    a->rep = j->repetition_penalty;
    a->sub = sub;
}

static bool in_ids(const int32_t *ids, int n, int32_t t) {
    for (int i = 0; i < n; i++)
        if (ids[i] == t) return true;
    return false;
}

/* min_tokens: the tokens that would end the answer - end-of-generation ones (unless ignore_eos)
 * and stop_token_ids - get a bias of minus infinity while the answer is shorter (ban), then
 * the request's own bias back (a logit_bias token's entry is at its place in j->bias: the
 * list starts with them, adjust_reset). */
static void adjust_min_tokens(const serve_decoder *d, serve_lane *ln, bool ban) {
    const serve_job *j = ln->job;
    int n_ends = d->n_eog + j->n_end_ids; /* the end ids are none with ignore_eos */
    for (int k = 0; k < n_ends + j->n_stop_ids; k++) {
        int32_t t = k < d->n_eog ? d->eog[k]
                    : k < n_ends ? j->end_ids[k - d->n_eog]
                                 : j->stop_ids[k - n_ends];
        if (k < d->n_eog && j->ignore_eos) continue;
        int at = ln->adj_at[t];
        float own = at >= 0 && at < j->n_bias ? j->bias[at].bias : 0.0f;
        adjust_entry(ln, t)->bias = ban ? -INFINITY : own;
    }
}

/* The list of a new job: its biased tokens, then every token of the prompt when the repetition
 * penalty applies (answer tokens join as they come). */
static void adjust_reset(const serve_decoder *d, serve_lane *ln) {
    const serve_job *j = ln->job;
    for (int i = 0; i < ln->n_adj; i++)
        ln->adj_at[ln->adj[i].id] = -1;
    ln->n_adj = 0;
    for (int i = 0; i < j->n_bias; i++) { /* distinct ids in the vocabulary (preparation) */
        ln->adj_at[j->bias[i].id] = ln->n_adj;
        ln->adj[ln->n_adj++] = j->bias[i];
    }
    if (j->repetition_penalty != 1.0f)
        for (int i = 0; i < j->n_ids; i++)
            adjust_token(ln, j->ids[i]);
    if (j->min_tokens > 0) adjust_min_tokens(d, ln, true);
}

/* A token's log-probabilities as the job keeps them: the job's n_top best of those the step
 * computed (a batch computes the most any of its jobs asked for; the list is best first). */
static void to_job_logprob(int32_t chosen, const ts_logprobs *tl, int n_top, serve_logprob *out) {
    out->id = chosen;
    out->logprob = tl->logprob;
    int n = tl->n_top < n_top ? tl->n_top : n_top;
    out->n_top = n < SERVE_MAX_TOP_LOGPROBS ? n : SERVE_MAX_TOP_LOGPROBS;
    for (int i = 0; i < out->n_top; i++)
        out->top_id[i] = tl->top_id[i], out->top_lp[i] = tl->top_logprob[i];
}

/* j->mu held (see serve_lane_token). */
static ts_status push_logprob_locked(serve_job *j, const serve_logprob *lp) {
    ts_status st = TS_OK;
    if (j->n_lp == j->cap_lp) {
        int cap = j->cap_lp ? 2 * j->cap_lp : 64;
        serve_logprob *p = realloc(j->lp, (size_t)cap * sizeof *p);
        if (!p) st = ts_error(TS_ERR_NOMEM, "out of memory");
        else j->lp = p, j->cap_lp = cap;
    }
    if (st == TS_OK) j->lp[j->n_lp++] = *lp;
    return st;
}

static void wake(serve_job *j) {
    pthread_mutex_lock(&j->mu);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void serve_decoder_step_delay(const serve_decoder *d) {
    int ms = d->o.step_delay_ms;
    if (ms <= 0) return;
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The prompt as prefix reuse compares it: the ids, with image tokens as their keys. */
static const int32_t *job_keys(const serve_job *j) {
    return j->images.keys ? j->images.keys : j->ids;
}

/* How much of the new prompt the lane's slot already holds: seq[0, slot_len) of the lane's
 * previous job (its prompt and answer, or the prefix prepared for the next turn). A follow-up
 * that was already waiting when that job ended - before its state could be kept as a snapshot
 * - still starts there when it extends it (a continued completion, a chat turn whose template
 * renders the answer back as it was generated). Shorter than the prompt: its last token must
 * run for the logits. */
static int held_prefix(const serve_decoder *d, const serve_lane *ln, const serve_job *j) {
    if (!ln->slot_known || d->o.cache->n == 0) return 0; /* --cache-mb 0: no prefix reuse */
    if (ln->lora_tag != j->lora_tag) return 0;           /* computed with other adapters */
    int held = ts_engine_slot_len(d->o.engine, ln->slot);
    if (held <= 0 || held > ln->n_seq || held >= j->n_ids) return 0;
    return memcmp(ln->seq, job_keys(j), (size_t)held * sizeof *j->ids) == 0 ? held : 0;
}

/* Whether a lane is prefilling j's prompt now: j then waits for that prompt's snapshot (kept
 * as the other's first token comes out) instead of prefilling it again - the n choices of one
 * request prefill their prompt once. Not without snapshots (--cache-mb 0). */
static bool same_prompt_prefilling(const serve_decoder *d, const serve_job *j) {
    if (d->o.cache->n == 0 || j->pool) return false; /* embeddings keep no snapshot */
    for (int l = 0; l < d->o.n_lanes; l++) {
        const serve_job *o = d->lane[l].job;
        if (o && !o->pool && !d->lane[l].decoding && o->n_ids == j->n_ids &&
            o->lora_tag == j->lora_tag &&
            memcmp(job_keys(o), job_keys(j), (size_t)j->n_ids * sizeof *j->ids) == 0)
            return true;
    }
    return false;
}

int serve_decoder_pick_lane(serve_decoder *d, const serve_job *j) {
    if (same_prompt_prefilling(d, j)) return -1;
    int best = -1, best_held = -1;
    for (int l = 0; l < d->o.n_lanes; l++) {
        const serve_lane *ln = &d->lane[l];
        if (ln->job) continue;
        int held = held_prefix(d, ln, j);
        if (best >= 0) {
            const serve_lane *b = &d->lane[best];
            if (held < best_held) continue;
            /* equal prefixes: a lane without idle work pending, and the least recently used
             * (the others' states are the likelier to be continued) */
            if (held == best_held &&
                ((ln->ended != NULL) > (b->ended != NULL) ||
                 ((ln->ended != NULL) == (b->ended != NULL) && ln->used >= b->used)))
                continue;
        }
        best = l, best_held = held;
    }
    return best;
}

int serve_snap_reserve(serve_decoder *d, const serve_lane *ln, int len, const float *logits) {
    return serve_prefix_cache_store(d->o.cache, ln->lora_tag, ln->seq, len, logits,
                                    ts_engine_snap_bytes(d->o.engine, len));
}

void serve_snap_fill(serve_decoder *d, const serve_lane *ln, int id, int len) {
    /* a reservation is filled right after it is made, but should another have needed its
     * room in between (dropped, the id reused for other tokens), this state is not theirs */
    if (id < 0 || !serve_prefix_cache_holds(d->o.cache, id, ln->lora_tag, ln->seq, len)) return;
    if (ts_engine_slot_len(d->o.engine, ln->slot) != len ||
        ts_engine_snap_save(d->o.engine, ln->slot, id) != TS_OK)
        serve_prefix_cache_drop(d->o.cache, id);
}

/* Puts the longest reusable prefix into the lane's slot - a snapshot (which, for the whole
 * prompt, comes with its logits that replace the prefill), or the held tokens already there -
 * or clears it; returns the tokens reused. */
static int restore_prefix(serve_decoder *d, serve_lane *ln, const serve_job *j, int held) {
    const serve_snapshot *s =
        serve_prefix_cache_find_prompt(d->o.cache, j->lora_tag, job_keys(j), j->n_ids);
    if (s && s->len >= held) {
        if (ts_engine_snap_restore(d->o.engine, s->id, ln->slot) == TS_OK) {
            if (s->len == j->n_ids)
                memcpy(d->logits, s->logits, (size_t)d->n_vocab * sizeof *d->logits);
            return s->len;
        }
    } else if (held > 0) {
        return held;
    }
    ts_engine_slot_clear(d->o.engine, ln->slot);
    return 0;
}

ts_status serve_decoder_encode_next(serve_decoder *d, serve_images *im) {
    int n_embd = d->o.n_embd;
    if (im->n_encoded == im->n) return TS_OK;
    if (!im->embd) {
        im->embd = malloc((size_t)(im->n_rows > 0 ? im->n_rows : 1) * n_embd * sizeof(float));
        if (!im->embd) return ts_error(TS_ERR_NOMEM, "out of memory for the images' rows");
    }
    size_t at = 0;
    for (int k = 0; k < im->n_encoded; k++)
        at += (size_t)im->plan[k].n_tokens;
    int k = im->n_encoded;
    serve_frames *b = &im->block[k];
    if (!b->frames) return ts_error(TS_ERR_INVALID, "image %d is gone", k);
    float *out = im->embd + at * n_embd;
    if (b->n_frames == 1)
        TS_TRY(ts_engine_encode_image(d->o.engine, b->frames[0], &im->plan[k], out));
    else
        TS_TRY(ts_engine_encode_frames(d->o.engine, (const ts_image *const *)b->frames, b->n_frames,
                                       &im->plan[k], out));
    for (int f = 0; f < b->n_frames; f++) /* its rows are all that is needed now */
        ts_image_free(b->frames[f]);
    free(b->frames);
    b->frames = NULL;
    im->n_encoded++;
    return TS_OK;
}

ts_status serve_decoder_encode_images(serve_decoder *d, serve_images *im) {
    while (im->n_encoded < im->n)
        TS_TRY(serve_decoder_encode_next(d, im));
    return TS_OK;
}

/* One image of the oldest lane whose images still need the tower: one image a step, so the
 * other lanes' decode steps go on between the images of a request (each image still holds
 * them for its own time). */
static void encode_step(serve_decoder *d) {
    serve_lane *next = NULL;
    for (int l = 0; l < d->o.n_lanes; l++) {
        serve_lane *ln = &d->lane[l];
        if (ln->job && ln->encoding && (!next || ln->used < next->used)) next = ln;
    }
    if (!next) return;
    ts_status st = serve_decoder_encode_next(d, &next->job->images);
    if (st != TS_OK) {
        serve_lane_fail(d, next, st);
    } else if (next->job->images.n_encoded == next->job->images.n) {
        next->encoding = false;
    }
}

static void lane_first_token(serve_decoder *d, serve_lane *ln, float *logits);

/* ---- grammars (response_format) ---------------------------------------------------------- */

/* Whether the lane's next draw is constrained: it has a grammar and is in the content (the
 * reasoning of a thinking model is free; the answer after it follows the grammar). */
bool serve_lane_constrained(const serve_lane *ln) {
    return ln->gm && ln->to.ch != SERVE_CH_REASONING;
}

/* The token the lane's next draw must give (the end of a thinking that used its budget, put
 * in a token a step: ts_think_budget), -1 when the draw is free. */
int32_t serve_lane_forced(const serve_lane *ln) { return ts_think_budget_forced(&ln->think); }

/* The lane's matcher, and the decoder's vocabulary for grammars when this is the first job
 * that needs it (~0.1 s for a 248k-token vocabulary). The think tags are not text: the text
 * output reads them as the reasoning's bounds, so the content may never hold one. */
static ts_status grammar_start(serve_decoder *d, serve_lane *ln) {
    if (!d->gm_row && !(d->gm_row = malloc((size_t)d->n_vocab * sizeof *d->gm_row)))
        return ts_error(TS_ERR_NOMEM, "out of memory for grammar masks");
    int32_t tags[2] = {d->think_open, d->think_close};
    if (!d->gvocab) TS_TRY(ts_grammar_vocab_create(d->o.tok, tags, 2, &d->gvocab));
    return ts_grammar_matcher_create(ln->job->grammar, d->gvocab, &ln->gm);
}

/* Draws that truncate the distribution (top-k, top-p, min-p) must see the grammar's mask
 * first: filtering then masking is another distribution. Greedy and plain temperature draws
 * may draw first and redo the draw over the masked row only when the grammar refuses the
 * token, which gives exactly the masked distribution (a refused token is drawn again from
 * the allowed ones in proportion, so each allowed token ends with p / P(allowed)), at the
 * cost of a mask only on a refusal. */
static bool mask_first(const ts_sampler_params *sp) {
    return sp->temperature > 0 && (sp->top_k > 0 || sp->top_p < 1.0f || sp->min_p > 0);
}

/* A draw from a copy of the row with the tokens the lane's grammar refuses taken out (the row
 * itself stays as the model gave it, for log-probabilities). */
static ts_status masked_draw(serve_decoder *d, serve_lane *ln, const float *row, int32_t *tok) {
    memcpy(d->gm_row, row, (size_t)d->n_vocab * sizeof *d->gm_row);
    TS_TRY(ts_grammar_matcher_mask(ln->gm, d->gm_row, d->n_vocab));
    *tok = ts_sampler_sample(ln->smp, d->gm_row);
    return TS_OK;
}

/* A decode step whose logits came to the host (a lane in the batch is constrained): the lane's
 * token - the engine's draw, or for a constrained lane the draw its grammar allows - and its
 * log-probabilities, from the row the draw saw before any mask. */
static ts_status host_rows_draw(serve_decoder *d, serve_lane *ln, const float *row, int32_t *tok,
                                ts_logprobs *lp) {
    int32_t forced = serve_lane_forced(ln);
    if (forced >= 0)
        *tok = forced;
    else if (serve_lane_constrained(ln) &&
             (mask_first(&ln->job->sp) || !ts_grammar_matcher_allows(ln->gm, *tok)))
        TS_TRY(masked_draw(d, ln, row, tok));
    if (ln->want_lp) ts_sampler_logprobs(ln->smp, row, *tok, ln->n_top, lp);
    return TS_OK;
}

ts_status serve_lane_draw_row(serve_decoder *d, serve_lane *ln, float *row, int32_t *tok,
                              ts_logprobs *lp) {
    ts_logit_adjust_apply(ln->adj, ln->n_adj, row, d->n_vocab);
    *tok = ts_sampler_sample(ln->smp, row);
    return host_rows_draw(d, ln, row, tok, lp);
}

/* The rows and sampler of echoes with logprobs, made for the first one; false without memory. */
static bool echo_start(serve_decoder *d) {
    if (!d->echo_rows)
        d->echo_rows =
            malloc(((size_t)SERVE_ECHO_ROWS + d->o.n_lanes) * d->n_vocab * sizeof *d->echo_rows);
    ts_sampler_params sp;
    ts_sampler_params_default(&sp);
    if (!d->echo_smp && ts_sampler_create(&sp, d->n_vocab, &d->echo_smp) != TS_OK)
        d->echo_smp = NULL;
    return d->echo_rows && d->echo_smp;
}

/* An echo's prompt scored: the rows of its piece of the prompt (a row a token, from its
 * prefill_at on) give each next prompt token's log-probability and the job's alternatives;
 * once the prompt is whole the job may send them (prompt_lp_done). */
static void echo_logprobs(serve_decoder *d, serve_lane *ln, const float *rows, int piece) {
    serve_job *j = ln->job;
    int n_top = j->top_logprobs < TS_MAX_TOP_LOGPROBS ? j->top_logprobs : TS_MAX_TOP_LOGPROBS;
    for (int k = 0; k < piece; k++) {
        int p = ln->prefill_at + k + 1; /* the token row k predicts */
        if (p >= j->n_ids) break;
        ts_logprobs tl;
        ts_sampler_logprobs(d->echo_smp, rows + (size_t)k * d->n_vocab, j->ids[p], n_top, &tl);
        to_job_logprob(j->ids[p], &tl, n_top, &j->prompt_lp[p]);
    }
    if (ln->prefill_at + piece < j->n_ids) return;
    pthread_mutex_lock(&j->mu);
    j->prompt_lp_done = true;
    pthread_mutex_unlock(&j->mu);
}

serve_lane *serve_lane_prefilling(serve_decoder *d, uint64_t after, bool embedding) {
    serve_lane *next = NULL;
    for (int l = 0; l < d->o.n_lanes; l++) {
        serve_lane *ln = &d->lane[l];
        if (ln->job && (ln->job->pool != SERVE_POOL_NONE) == embedding && !ln->decoding &&
            !ln->encoding && ln->used > after && (!next || ln->used < next->used))
            next = ln;
    }
    return next;
}

/* The lane's prompt is in up to its job's keep_at (an /infill's files): that state is kept as
 * a snapshot at once, for the next requests that start with the same tokens. */
static void keep_part(serve_decoder *d, serve_lane *ln) {
    int keep = ln->job->keep_at;
    serve_snap_fill(d, ln, serve_snap_reserve(d, ln, keep, NULL), keep);
}

/* Runs the next chunk of the prompts still to prefill, in one forward call: the oldest lane's
 * next chunk (at most --prefill-chunk tokens), and with it the next chunks of the lanes after it
 * while the call stays within a chunk - short prompts that arrived together go in together.
 * Each lane's prompt is cut into the chunks it would be cut into alone. A prompt goes in
 * chunks only so that cancellation is seen and the other lanes' answers go on between them:
 * every extra forward call is one more pass over the weights (a job's keep_at ends a piece
 * too: that state is worth a pass). A lane whose prompt is in:
 * reserves the snapshot of the whole prompt with its logits row - the state itself is copied
 * once the first token is out (flush_snapshot, before any other lane can take a snapshot that
 * would evict this one) - and draws its first token. */
static void prefill_lanes(serve_decoder *d) {
    int n = 0, n_in = 0, n_rows = 0;
    bool any_images = false, any_echo = false;
    uint64_t after = 0; /* lanes are taken in start order: `used` grows and is distinct */
    for (;;) {
        serve_lane *next = serve_lane_prefilling(d, after, false);
        if (!next) break;
        bool echo = next->job->prompt_lp != NULL; /* a row for each of its tokens */
        if (echo && any_echo) break; /* one a call: the rows are SERVE_ECHO_ROWS + lanes */
        if (echo && !echo_start(d)) {
            serve_lane_end(d, next, SERVE_FINISH_ERROR, ts_error(TS_ERR_NOMEM, "out of memory"));
            continue;
        }
        int left = next->job->n_ids - next->prefill_at;
        int piece = left < d->o.prefill_chunk ? left : d->o.prefill_chunk;
        if (echo && piece > SERVE_ECHO_ROWS) piece = SERVE_ECHO_ROWS;
        int keep = next->job->keep_at - next->prefill_at; /* a snapshot's end: a piece ends there */
        if (keep > 0 && piece > keep) piece = keep;
        if (n + piece > d->o.prefill_chunk) break;
        any_echo |= echo;
        after = next->used;
        for (int i = 0; i < piece; i++) {
            int p = next->prefill_at + i;
            d->tok[n + i] = serve_images_token(&next->job->images, next->seq[p]);
            d->pos[n + i] = p;
            d->slot[n + i] = next->slot;
            d->want[n + i] = echo;
        }
        any_images |= serve_images_rows(&next->job->images, next->prefill_at, piece, d->o.n_embd,
                                        d->embd + n, d->rope + 3 * (size_t)n);
        d->b_row[n_in] = n_rows;
        if (echo)
            n_rows += piece;
        else if (piece == left)
            d->want[n + piece - 1] = 1, n_rows++;
        n += piece;
        d->b_in[n_in] = next, d->b_piece[n_in++] = piece;
    }
    if (n_in == 0) return;
    ts_batch b = {n, d->tok, d->pos, d->slot, d->want, NULL, NULL};
    if (any_images) b.embd = (const float *const *)d->embd, b.rope_pos = d->rope;
    float *rows = any_echo ? d->echo_rows : d->logits;
    ts_status st = ts_engine_forward(d->o.engine, &b, n_rows ? rows : NULL);
    if (d->o.metrics) serve_metrics_prefill_call(d->o.metrics);
    for (int i = 0; i < n_in; i++) {
        serve_lane *ln = d->b_in[i];
        serve_job *j = ln->job;
        if (st != TS_OK) {
            serve_lane_fail(d, ln, st);
            continue;
        }
        float *row = rows + (size_t)d->b_row[i] * d->n_vocab;
        if (j->prompt_lp) echo_logprobs(d, ln, row, d->b_piece[i]);
        ln->prefill_at += d->b_piece[i];
        if (ln->prefill_at == j->keep_at) keep_part(d, ln);
        if (ln->prefill_at < j->n_ids) continue;
        float *logits = j->prompt_lp ? row + (size_t)(d->b_piece[i] - 1) * d->n_vocab : row;
        ln->pending_snap = serve_snap_reserve(d, ln, j->n_ids, logits);
        ln->pending_len = j->n_ids;
        serve_metrics_tokens(d->o.metrics, j->n_ids, j->cached_tokens,
                             j->n_ids - j->cached_tokens, 0);
        lane_first_token(d, ln, logits);
    }
}

/* Copies the slot into the snapshot reserved by prefill_lanes, before anything moves it on. */
static void flush_snapshot(serve_decoder *d, serve_lane *ln) {
    serve_snap_fill(d, ln, ln->pending_snap, ln->pending_len);
    ln->pending_snap = -1;
}

/* The bytes the detokenizer still holds (a character, or a run of byte tokens, an answer
 * ended in) as the answer's last text. */
static ts_status flush_held(serve_lane *ln) {
    const char *text = NULL;
    size_t len = 0;
    ts_status st = TS_OK;
    if (ln->dt && ts_detokenizer_flush(ln->dt, &text, &len) == TS_OK && len) {
        bool stopped = false;
        pthread_mutex_lock(&ln->job->mu);
        st = serve_textout_token(&ln->to, -1, text, len, &stopped);
        pthread_mutex_unlock(&ln->job->mu);
    }
    return st;
}

/* Ends the lane's job: the text still held back, its sampler and detokenizer freed, the job's
 * terminal state reported. st: the error that ended it, for SERVE_FINISH_ERROR. */
void serve_lane_end(serve_decoder *d, serve_lane *ln, serve_finish how, ts_status st) {
    serve_job *j = ln->job;
    if (how == SERVE_FINISH_LENGTH) st = flush_held(ln);
    /* held text that was not a stop (end of generation, or the length) */
    if ((how == SERVE_FINISH_LENGTH || how == SERVE_FINISH_STOP) && st == TS_OK) {
        pthread_mutex_lock(&j->mu);
        st = serve_textout_finish(&ln->to);
        pthread_mutex_unlock(&j->mu);
    }
    if (st != TS_OK && st != TS_ERR_CANCELLED) how = SERVE_FINISH_ERROR;
    if (st == TS_ERR_CANCELLED) how = SERVE_FINISH_CANCELLED;
    char err[256] = "";
    if (how == SERVE_FINISH_ERROR) snprintf(err, sizeof err, "%s", ts_last_error());
    serve_textout_free(&ln->to);
    /* zeroed: a later job that ends before its first token frees it again */
    memset(&ln->to, 0, sizeof ln->to);
    ts_detokenizer_free(ln->dt);
    ts_sampler_free(ln->smp);
    ts_grammar_matcher_free(ln->gm);
    ln->dt = NULL, ln->smp = NULL, ln->gm = NULL;
    serve_metrics_tokens(d->o.metrics, 0, 0, 0, j->completion_tokens);
    flush_snapshot(d, ln); /* when the job never stepped */
    ln->job = NULL;
    ln->decoding = false;
    if ((how == SERVE_FINISH_STOP || how == SERVE_FINISH_LENGTH) && !j->no_idle_work) {
        ln->ended = j; /* keeps the reference for the idle work */
        ln->ended_at = ++d->clock;
    } else {
        ln->answer_pending = false;
    }
    d->done(d->done_ctx, j, how, err[0] ? err : NULL);
    if (!ln->ended) serve_job_unref(j);
}

void serve_lane_fail(serve_decoder *d, serve_lane *ln, ts_status st) {
    ln->slot_known = false;
    serve_lane_end(d, ln, SERVE_FINISH_ERROR, st);
}

/* Hands the lane's job its next token (drawn with log-probabilities tl when it wants them)
 * and ends the job when the token ends it. */
void serve_lane_token(serve_decoder *d, serve_lane *ln, int32_t tok, const ts_logprobs *tl) {
    serve_job *j = ln->job;
    int k = ln->k;
    bool gm_on = serve_lane_constrained(ln); /* the token was drawn under the grammar */
    serve_logprob lp;
    if (ln->want_lp) to_job_logprob(tok, tl, ln->n_top, &lp);
    ln->seq[ln->n_seq++] = tok;
    ln->gen_count[tok]++;
    /* min_tokens reached: the next draw may end the answer, and this token's text is where
     * stop strings start to be looked for */
    bool min_reached = j->min_tokens > 0 && k + 1 == j->min_tokens;
    if (min_reached) {
        adjust_min_tokens(d, ln, false);
        serve_textout_start_stops(&ln->to, j->stops, j->n_stops);
    }
    if (ln->penalised) {
        if (has_penalties(j)) adjust_token(ln, tok);
        ts_sampler_set_adjust(ln->smp, ln->adj, ln->n_adj);
    }
    ln->answer_pending = true;
    ts_status st = TS_OK;
    pthread_mutex_lock(&j->mu);
    if (k == 0) j->t_first_token = serve_now();
    if (k == j->cap_ids) {
        int cap = j->cap_ids ? 2 * j->cap_ids : 64;
        int32_t *p = realloc(j->out_ids, (size_t)cap * sizeof *p);
        if (p) j->out_ids = p, j->cap_ids = cap;
    }
    if (k < j->cap_ids)
        j->out_ids[k] = tok;
    else
        st = ts_error(TS_ERR_NOMEM, "out of memory");
    j->completion_tokens = k + 1;
    pthread_mutex_unlock(&j->mu);
    if (k == 0) serve_metrics_ttft(d->o.metrics, j->t_first_token - j->t_submit);
    bool stopped = false;
    bool eog = !j->ignore_eos &&
               (ts_tokenizer_is_eog(d->o.tok, tok) || in_ids(j->end_ids, j->n_end_ids, tok));
    const char *text = NULL;
    size_t len = 0;
    /* an end-of-generation token has no text, but it ends the answer: bytes of a character
     * still held (a byte token the answer ended in the middle of) show as U+FFFD, as Hugging
     * Face's decode of the answer shows them */
    ts_status dst = eog ? ts_detokenizer_flush(ln->dt, &text, &len)
                        : ts_detokenizer_push(ln->dt, tok, &text, &len);
    if (dst != TS_OK) len = 0;
    /* the token's text and its log-probability are published in one hold of the job's mutex:
     * a streaming reader that saw the text without it would send the text with the previous
     * tokens' log-probabilities and this one's with the next text */
    pthread_mutex_lock(&j->mu);
    if (st == TS_OK && (!eog || len))
        st = serve_textout_token(&ln->to, eog ? -1 : tok, text, len, &stopped);
    if (eog && stopped) j->stop_str = ln->to.stop.hit; /* the held bytes ended in a stop string */
    if (st == TS_OK && ln->want_lp) st = push_logprob_locked(j, &lp);
    pthread_mutex_unlock(&j->mu);
    ts_think_budget_token(&ln->think, tok, ts_detokenizer_mid_char(ln->dt));
    if (eog) {
        stopped = true;
    } else {
        bool by_string = stopped;
        /* the grammar takes the token; once its text is complete and nothing may follow,
         * the answer is done (as at an end-of-generation token) */
        if (st == TS_OK && gm_on) st = ts_grammar_matcher_accept(ln->gm, tok);
        if (st == TS_OK && gm_on && ts_grammar_matcher_done(ln->gm)) {
            stopped = true;
            /* the grammar's text is complete: a run of byte tokens it ended in (SentencePiece's
             * byte fallback holds one until the next token) is part of it */
            st = flush_held(ln);
        }
        /* a stop token's text is part of the answer (vLLM's rule; special ones have none) */
        bool by_token = !stopped && st == TS_OK && k + 1 > j->min_tokens &&
                        in_ids(j->stop_ids, j->n_stop_ids, tok);
        if (by_string || by_token) {
            pthread_mutex_lock(&j->mu);
            if (by_string) j->stop_str = ln->to.stop.hit;
            if (by_token) j->stop_token = tok;
            pthread_mutex_unlock(&j->mu);
        }
        stopped |= by_token;
    }
    wake(j);
    ln->k = k + 1;
    ln->last = tok;
    if (st != TS_OK)
        serve_lane_end(d, ln, SERVE_FINISH_ERROR, st);
    else if (stopped)
        serve_lane_end(d, ln, SERVE_FINISH_STOP, TS_OK);
    else if (ln->k >= j->max_tokens || ln->n_seq >= d->n_ctx) /* length */
        serve_lane_end(d, ln, SERVE_FINISH_LENGTH, TS_OK);
}

/* After the prompt: the job's sampler, detokenizer and text output, and its first token,
 * drawn here from the prompt's logits (the later ones are drawn in the decode steps). */
static void lane_first_token(serve_decoder *d, serve_lane *ln, float *logits) {
    serve_job *j = ln->job;
    /* before min_tokens no stop string is looked for (serve_textout_start_stops then) */
    /* reasoning_format none: no tag is a channel's switch, all is content as written */
    bool split = !j->reasoning_inline;
    serve_textout_init(&ln->to, split ? d->think_open : -1, split ? d->think_close : -1,
                       split && j->in_think, j->stops, j->min_tokens > 0 ? 0 : j->n_stops, sink, j);
    /* calls in the model's own format, or as a list where its chat format has none */
    if (j->parse_tools) serve_textout_enable_tools(&ln->to, !ts_tokenizer_chat_tools(d->o.tok));
    if (j->keep_stop) serve_textout_keep_stops(&ln->to);
    ts_status st = ts_sampler_create(&j->sp, d->n_vocab, &ln->smp);
    if (st == TS_OK) st = ts_detokenizer_create(d->o.tok, true, &ln->dt);
    if (st != TS_OK) {
        serve_lane_end(d, ln, SERVE_FINISH_ERROR, st);
        return;
    }
    /* Each decode step draws its token where the logits are (on a GPU: a token id comes back,
     * not a vocabulary of floats), the penalties going along as logit adjustments; with
     * log-probabilities those are computed there too (a short list comes back), so the tokens
     * drawn do not depend on whether they were asked for. */
    ln->want_lp = j->top_logprobs >= 0;
    ln->penalised = has_penalties(j) || j->n_bias > 0 || j->min_tokens > 0;
    ln->n_top = j->top_logprobs < TS_MAX_TOP_LOGPROBS ? j->top_logprobs : TS_MAX_TOP_LOGPROBS;
    ln->k = 0;
    ts_think_budget_init(&ln->think, d->think_open, d->think_close, j->think_budget, j->think_end,
                         j->n_think_end, j->in_think);
    adjust_reset(d, ln);
    if (j->max_tokens < 1) {
        serve_lane_end(d, ln, SERVE_FINISH_LENGTH, TS_OK);
        return;
    }
    if (cancelled(j)) {
        serve_lane_end(d, ln, SERVE_FINISH_CANCELLED, TS_OK);
        return;
    }
    if (j->grammar && (st = grammar_start(d, ln)) != TS_OK) {
        serve_lane_end(d, ln, SERVE_FINISH_ERROR, st);
        return;
    }
    ts_logit_adjust_apply(ln->adj, ln->n_adj, logits, d->n_vocab);
    int32_t tok = serve_lane_forced(ln);
    if (tok < 0 && !serve_lane_constrained(ln))
        tok = ts_sampler_sample(ln->smp, logits);
    else if (tok < 0 && (st = masked_draw(d, ln, logits, &tok)) != TS_OK) {
        serve_lane_end(d, ln, SERVE_FINISH_ERROR, st);
        return;
    }
    ts_logprobs tl;
    if (ln->want_lp) ts_sampler_logprobs(ln->smp, logits, tok, ln->n_top, &tl);
    ln->decoding = true;
    serve_spec_start(d, ln);
    serve_lane_token(d, ln, tok, &tl);
    flush_snapshot(d, ln); /* the first token is out: now the prompt's state is kept */
}

void serve_decoder_start(serve_decoder *d, int l, serve_job *j) {
    serve_lane *ln = &d->lane[l];
    if (ln->ended) { /* the lane is reused before its idle work ran: given up */
        if (ln->ended->req && d->o.cache->n > 0) serve_metrics_next_turn(d->o.metrics, false, 0);
        serve_job_unref(ln->ended);
        ln->ended = NULL;
    }
    serve_job_ref(j);
    ln->job = j;
    ln->used = ++d->clock;
    ln->answer_pending = false;
    ln->pending_snap = -1;
    int held = j->pool ? 0 : held_prefix(d, ln, j); /* before seq becomes the new prompt */
    /* the job's adapters from the slot's next token on (a held prefix has the same) */
    if (d->o.n_lora) ts_engine_slot_lora(d->o.engine, ln->slot, j->lora, d->o.n_lora);
    ln->lora_tag = j->lora_tag;
    if (j->pool) {
        serve_embed_start(d, ln);
        return;
    }
    memcpy(ln->seq, job_keys(j), (size_t)j->n_ids * sizeof *j->ids);
    ln->n_seq = j->n_ids;
    memset(ln->gen_count, 0, (size_t)d->n_vocab * sizeof *ln->gen_count);

    /* an echo with logprobs runs its whole prompt: every token's row is wanted */
    int start = 0;
    if (j->prompt_lp)
        ts_engine_slot_clear(d->o.engine, ln->slot);
    else
        start = restore_prefix(d, ln, j, held);
    /* the images run through the vision tower only when their tokens must (a restored prefix
     * that holds them needs none): one image a step (encode_step), before the prompt's prefill */
    ln->encoding = start < j->n_ids && serve_images_needed_after(&j->images, start, j->n_ids) &&
                   j->images.n_encoded < j->images.n;
    pthread_mutex_lock(&j->mu);
    j->prompt_tokens = j->n_ids;
    j->cached_tokens = start;
    pthread_mutex_unlock(&j->mu);
    ln->slot_known = true;
    ln->decoding = false;
    ln->prefill_at = start;
    if (start < j->n_ids) return; /* prefilled by the next steps */
    serve_metrics_tokens(d->o.metrics, j->n_ids, start, 0, 0);
    lane_first_token(d, ln, d->logits);
}

void serve_decoder_step(serve_decoder *d) {
    for (int l = 0; l < d->o.n_lanes; l++) {
        serve_lane *ln = &d->lane[l];
        if (ln->job && cancelled(ln->job)) /* a prompt's cancellation is seen between chunks */
            serve_lane_end(d, ln, SERVE_FINISH_CANCELLED, TS_OK);
    }
    encode_step(d);
    prefill_lanes(d);
    serve_embed_step(d);
    if (d->o.draft_max > 0 && serve_spec_step(d)) return;
    int n = 0, n_top = -1;
    bool any_constrained = false, any_shift = false;
    for (int l = 0; l < d->o.n_lanes; l++) {
        serve_lane *ln = &d->lane[l];
        if (!ln->job || !ln->decoding) continue;
        /* a token put in for the lane is drawn on the host too, for its log-probabilities */
        any_constrained |= serve_lane_constrained(ln) || serve_lane_forced(ln) >= 0;
        d->b_tok[n] = ln->last;
        d->b_pos[n] = ln->n_seq - 1;
        /* after an image a token's rotary positions are its place plus the images' shift */
        int32_t rp = ln->n_seq - 1 + ln->job->images.delta;
        d->b_rope[3 * n] = d->b_rope[3 * n + 1] = d->b_rope[3 * n + 2] = rp;
        any_shift |= ln->job->images.delta != 0;
        d->b_slot[n] = ln->slot;
        d->b_smp[n] = ln->smp;
        d->b_lane[n] = l;
        d->want[n] = 1; /* every row's token is drawn */
        if (ln->want_lp && ln->n_top > n_top) n_top = ln->n_top;
        n++;
    }
    if (n == 0) return;
    serve_decoder_step_delay(d);
    double t0 = serve_now();
    ts_batch b = {n, d->b_tok, d->b_pos, d->b_slot, d->want, NULL, any_shift ? d->b_rope : NULL};
    ts_status st;
    if (any_constrained) /* the rows come over: a draw the grammar refuses is redone here */
        st = ts_engine_forward_sample_logits(d->o.engine, &b, d->b_smp, d->b_drawn, d->logits);
    else if (n_top >= 0)
        st = ts_engine_forward_sample_logprobs(d->o.engine, &b, d->b_smp, n_top, d->b_drawn,
                                               d->b_lp);
    else
        st = ts_engine_forward_sample(d->o.engine, &b, d->b_smp, d->b_drawn);
    double dt = serve_now() - t0;
    serve_metrics_decode_call(d->o.metrics, 0, 0);
    for (int i = 0; i < n; i++) {
        serve_lane *ln = &d->lane[d->b_lane[i]];
        serve_metrics_token_latency(d->o.metrics, dt);
        ts_status lst = st;
        if (lst == TS_OK && any_constrained)
            lst = host_rows_draw(d, ln, d->logits + (size_t)i * d->n_vocab, &d->b_drawn[i],
                                 &d->b_lp[i]);
        if (st != TS_OK) {
            serve_lane_fail(d, ln, st);
        } else if (lst != TS_OK) {
            serve_lane_end(d, ln, SERVE_FINISH_ERROR, lst);
        } else {
            serve_lane_token(d, ln, d->b_drawn[i], &d->b_lp[i]);
        }
    }
}
