#include "serve/decode.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/status.h"
#include "serve/openai.h"

ts_status serve_decoder_init(serve_decoder *d, const serve_decoder_opts *o) {
    memset(d, 0, sizeof *d);
    d->o = *o;
    d->think_open = d->think_close = -1;
    d->n_vocab = ts_engine_n_vocab(o->engine);
    d->n_ctx = ts_engine_n_ctx(o->engine);
    d->logits = malloc((size_t)d->n_vocab * sizeof *d->logits);
    d->gen_count = calloc((size_t)d->n_vocab, sizeof *d->gen_count);
    d->adj = malloc((size_t)d->n_vocab * sizeof *d->adj);
    d->adj_at = malloc((size_t)d->n_vocab * sizeof *d->adj_at);
    for (int t = 0; d->adj_at && t < d->n_vocab; t++) d->adj_at[t] = -1;
    d->seq = malloc((size_t)d->n_ctx * sizeof *d->seq);
    d->pos = malloc((size_t)d->n_ctx * sizeof *d->pos);
    d->slot = calloc((size_t)d->n_ctx, sizeof *d->slot);
    if (d->o.prefill_chunk < 1 || d->o.next_turn_chunk < 1)
        return ts_error(TS_ERR_INVALID, "prefill chunks of %d and %d tokens", d->o.prefill_chunk,
                        d->o.next_turn_chunk);
    if (d->o.next_turn_chunk > d->o.prefill_chunk) d->o.next_turn_chunk = d->o.prefill_chunk;
    d->want = malloc((size_t)d->o.prefill_chunk);
    d->pending_snap = -1;
    d->slot_known = false;
    if (!d->want || !d->logits || !d->gen_count || !d->seq || !d->pos || !d->slot ||
        !d->adj || !d->adj_at)
        return ts_error(TS_ERR_NOMEM, "out of memory for the decoder");
    return TS_OK;
}

void serve_decoder_free(serve_decoder *d) {
    free(d->logits);
    free(d->gen_count);
    free(d->adj);
    free(d->adj_at);
    free(d->seq);
    free(d->pos);
    free(d->slot);
    free(d->want);
    memset(d, 0, sizeof *d);
}

static bool cancelled(const serve_job *j) { return atomic_load(&j->cancel); }

static bool job_cancelled(void *j) { return cancelled(j); }

/* Runs seq[from, to) through slot 0 (which must hold exactly `from` tokens), in chunks of
 * `chunk` so an interruption is seen between them; logits of the last token when
 * want_logits. */
static ts_status prefill_chunked(serve_decoder *d, serve_interrupt_fn stop, void *ctx, int chunk,
                                 int from, int to, bool want_logits, bool count) {
    for (int a = from; a < to;) {
        if (stop && stop(ctx)) return TS_ERR_CANCELLED;
        int n = to - a < chunk ? to - a : chunk;
        for (int i = 0; i < n; i++) d->pos[i] = a + i;
        bool logits = want_logits && a + n == to;
        /* an explicit "no logits" list: without one the engine computes the last token's */
        memset(d->want, 0, (size_t)n);
        if (logits) d->want[n - 1] = 1;
        ts_batch b = {n, d->seq + a, d->pos, d->slot, d->want};
        TS_TRY(ts_engine_forward(d->o.engine, &b, logits ? d->logits : NULL));
        if (count && d->o.metrics) serve_metrics_prefill_call(d->o.metrics);
        a += n;
    }
    return TS_OK;
}

static ts_status prefill(serve_decoder *d, serve_job *j, int from, int to, bool want_logits) {
    return prefill_chunked(d, j ? job_cancelled : NULL, j, d->o.prefill_chunk, from, to,
                           want_logits, j != NULL);
}

/* Copies slot 0 (holding seq[0, len)) into a snapshot slot. */
static void snapshot(serve_decoder *d, int len) {
    int dst = serve_prefix_cache_store(d->o.cache, d->seq, len, NULL);
    if (dst < 0) return;
    if (ts_engine_slot_copy(d->o.engine, 0, dst) != TS_OK) serve_prefix_cache_drop(d->o.cache, dst);
}

static ts_status sink(void *ctx, serve_channel ch, const char *s, size_t n) {
    serve_job *j = ctx;
    if (!n) return TS_OK;
    pthread_mutex_lock(&j->mu);
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
    pthread_mutex_unlock(&j->mu);
    return st;
}

static bool has_penalties(const serve_job *j) {
    return j->repetition_penalty != 1.0f || j->frequency_penalty != 0.0f ||
           j->presence_penalty != 0.0f;
}

/* The penalties are kept as a list of logit adjustments (ts_logit_adjust), one per token they
 * touch: with a repetition penalty every token of the prompt and the answer, else the answer's.
 * A draw in the forward hands the list to the sampler (ts_sampler_set_adjust); the first token,
 * drawn here from the prompt's logits, gets it applied here, with the same float operations. */

/* The penalties on the logits a draw on the host reads (d->logits). */
static void apply_penalties(serve_decoder *d, const serve_job *j) {
    float rep = j->repetition_penalty;
    for (int i = 0; i < d->n_adj; i++) {
        float *l = &d->logits[d->adj[i].id];
        if (rep != 1.0f) *l = *l > 0 ? *l / rep : *l * rep;
        *l -= d->adj[i].sub;
    }
}

/* Sets token t's adjustment: its frequency and presence terms once it is in the answer. */
static void adjust_token(serve_decoder *d, const serve_job *j, int32_t t) {
    float sub = d->gen_count[t] ? j->frequency_penalty * (float)d->gen_count[t] +
                                      j->presence_penalty
                                : 0.0f;
    if (d->adj_at[t] < 0) d->adj_at[t] = d->n_adj++;
    d->adj[d->adj_at[t]] = (ts_logit_adjust){t, sub};
}

/* The list of a new job: every token of the prompt when the repetition penalty applies (answer
 * tokens join as they come); empty without penalties. */
static void adjust_reset(serve_decoder *d, const serve_job *j) {
    for (int i = 0; i < d->n_adj; i++) d->adj_at[d->adj[i].id] = -1;
    d->n_adj = 0;
    if (has_penalties(j) && j->repetition_penalty != 1.0f)
        for (int i = 0; i < j->n_ids; i++) adjust_token(d, j, j->ids[i]);
}

/* A token's log-probabilities as the job keeps them (the k best, at most
 * SERVE_MAX_TOP_LOGPROBS). */
static void to_job_logprob(int32_t chosen, const ts_logprobs *tl, serve_logprob *out) {
    out->id = chosen;
    out->logprob = tl->logprob;
    out->n_top = tl->n_top < SERVE_MAX_TOP_LOGPROBS ? tl->n_top : SERVE_MAX_TOP_LOGPROBS;
    for (int i = 0; i < out->n_top; i++)
        out->top_id[i] = tl->top_id[i], out->top_lp[i] = tl->top_logprob[i];
}

static ts_status push_logprob(serve_job *j, const serve_logprob *lp) {
    ts_status st = TS_OK;
    pthread_mutex_lock(&j->mu);
    if (j->n_lp == j->cap_lp) {
        int cap = j->cap_lp ? 2 * j->cap_lp : 64;
        serve_logprob *p = realloc(j->lp, (size_t)cap * sizeof *p);
        if (!p) st = ts_error(TS_ERR_NOMEM, "out of memory");
        else j->lp = p, j->cap_lp = cap;
    }
    if (st == TS_OK) j->lp[j->n_lp++] = *lp;
    pthread_mutex_unlock(&j->mu);
    return st;
}

static void wake(serve_job *j) {
    pthread_mutex_lock(&j->mu);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* How much of the new prompt the working slot already holds: slot 0 keeps seq[0, slot_len)
 * of the previous job (its prompt and answer, or the prefix prepared for the next turn). A
 * follow-up that was already waiting when that job ended - before its state could be kept as
 * a snapshot - still starts there when it extends it (a continued completion, a chat turn
 * whose template renders the answer back as it was generated). Shorter than the prompt: its
 * last token must run for the logits. */
static int held_prefix(const serve_decoder *d, const serve_job *j) {
    if (!d->slot_known || d->o.cache->n == 0) return 0; /* --cache-mb 0: no prefix reuse */
    int held = ts_engine_slot_len(d->o.engine, 0);
    if (held <= 0 || held > d->n_seq || held >= j->n_ids) return 0;
    return memcmp(d->seq, j->ids, (size_t)held * sizeof *j->ids) == 0 ? held : 0;
}

/* Puts the longest reusable prefix into slot 0 - a snapshot (which, for the whole prompt, comes
 * with its logits that replace the prefill), or the held tokens already there - or clears it;
 * returns the tokens reused. */
static int restore_prefix(serve_decoder *d, const serve_job *j, int held) {
    const serve_snapshot *s = serve_prefix_cache_find_prompt(d->o.cache, j->ids, j->n_ids);
    if (s && s->len >= held) {
        if (ts_engine_slot_copy(d->o.engine, s->slot, 0) == TS_OK) {
            if (s->len == j->n_ids)
                memcpy(d->logits, s->logits, (size_t)d->n_vocab * sizeof *d->logits);
            return s->len;
        }
    } else if (held > 0) {
        return held;
    }
    ts_engine_slot_clear(d->o.engine, 0);
    return 0;
}

/* Prefills the prompt after `start` in one piece (chunks only for cancellation: every extra
 * forward call is one more pass over the weights) and reserves the snapshot of the whole
 * prompt with its logits row. The state itself is copied once the first token is out
 * (flush_snapshot): slot 0 holds the prompt until the first decode step. */
static ts_status prefill_prompt(serve_decoder *d, serve_job *j, int start) {
    if (start == j->n_ids) return TS_OK; /* restored with its logits */
    TS_TRY(prefill(d, j, start, j->n_ids, true));
    d->pending_snap = serve_prefix_cache_store(d->o.cache, d->seq, j->n_ids, d->logits);
    return TS_OK;
}

/* Copies slot 0 into the snapshot reserved by prefill_prompt, before anything moves it on. */
static void flush_snapshot(serve_decoder *d) {
    if (d->pending_snap < 0) return;
    if (ts_engine_slot_copy(d->o.engine, 0, d->pending_snap) != TS_OK)
        serve_prefix_cache_drop(d->o.cache, d->pending_snap);
    d->pending_snap = -1;
}

static ts_status decode(serve_decoder *d, serve_job *j, serve_finish *how) {
    ts_sampler *smp = NULL;
    ts_detokenizer *dt = NULL;
    serve_textout to;
    serve_textout_init(&to, d->think_open, d->think_close, j->in_think, j->stops, j->n_stops,
                       sink, j);
    if (j->parse_tools) serve_textout_enable_tools(&to);
    ts_status st = ts_sampler_create(&j->sp, d->n_vocab, &smp);
    if (st == TS_OK) st = ts_detokenizer_create(d->o.tok, true, &dt);
    *how = SERVE_FINISH_LENGTH;
    /* Each decode step draws its token where the logits are (on a GPU: a token id comes back,
     * not a vocabulary of floats), the penalties going along as logit adjustments; with
     * log-probabilities those are computed there too (a short list comes back), so the tokens
     * drawn do not depend on whether they were asked for. The first token still comes from the
     * prompt's logits, drawn here. */
    const bool want_lp = j->top_logprobs >= 0, penalised = has_penalties(j);
    const int n_top = j->top_logprobs < TS_MAX_TOP_LOGPROBS ? j->top_logprobs : TS_MAX_TOP_LOGPROBS;
    int32_t drawn = -1;
    ts_logprobs tl; /* the drawn token's, from the step that drew it */
    adjust_reset(d, j);
    for (int k = 0; st == TS_OK && k < j->max_tokens; k++) {
        if (cancelled(j)) {
            *how = SERVE_FINISH_CANCELLED;
            break;
        }
        double t0 = serve_now();
        int32_t tok = drawn;
        if (tok < 0) {
            apply_penalties(d, j);
            tok = ts_sampler_sample(smp, d->logits);
            if (want_lp) ts_sampler_logprobs(smp, d->logits, tok, n_top, &tl);
        }
        drawn = -1;
        serve_logprob lp;
        if (want_lp) to_job_logprob(tok, &tl, &lp);
        d->seq[d->n_seq++] = tok;
        d->gen_count[tok]++;
        if (penalised) {
            adjust_token(d, j, tok);
            ts_sampler_set_adjust(smp, j->repetition_penalty, d->adj, d->n_adj);
        }
        d->answer_pending = true;
        pthread_mutex_lock(&j->mu);
        if (k == 0) j->t_first_token = serve_now();
        if (k == j->cap_ids) {
            int cap = j->cap_ids ? 2 * j->cap_ids : 64;
            int32_t *p = realloc(j->out_ids, (size_t)cap * sizeof *p);
            if (p) j->out_ids = p, j->cap_ids = cap;
        }
        if (k < j->cap_ids) j->out_ids[k] = tok;
        else st = ts_error(TS_ERR_NOMEM, "out of memory");
        j->completion_tokens = k + 1;
        pthread_mutex_unlock(&j->mu);
        if (k == 0) serve_metrics_ttft(d->o.metrics, j->t_first_token - j->t_submit);
        bool stopped = false;
        if (!j->ignore_eos && ts_tokenizer_is_eog(d->o.tok, tok)) {
            stopped = true;
        } else {
            const char *text = NULL;
            size_t len = 0;
            if (ts_detokenizer_push(dt, tok, &text, &len) != TS_OK) len = 0;
            st = serve_textout_token(&to, tok, text, len, &stopped);
        }
        if (st == TS_OK && want_lp) st = push_logprob(j, &lp);
        wake(j);
        if (stopped) {
            *how = SERVE_FINISH_STOP;
            break;
        }
        if (k + 1 == j->max_tokens || d->n_seq >= d->n_ctx) break; /* length */
        if (d->o.step_delay_ms > 0) sleep_ms(d->o.step_delay_ms);
        int32_t p = d->n_seq - 1;
        ts_batch b = {1, &tok, &p, d->slot, NULL};
        flush_snapshot(d);
        if (st == TS_OK)
            st = want_lp ? ts_engine_forward_sample_logprobs(d->o.engine, &b, &smp, n_top,
                                                             &drawn, &tl)
                         : ts_engine_forward_sample(d->o.engine, &b, &smp, &drawn);
        serve_metrics_token_latency(d->o.metrics, serve_now() - t0);
    }
    if (st == TS_OK && (*how == SERVE_FINISH_LENGTH)) {
        const char *text = NULL;
        size_t len = 0;
        if (ts_detokenizer_flush(dt, &text, &len) == TS_OK && len) {
            bool stopped = false;
            st = serve_textout_token(&to, -1, text, len, &stopped);
        }
        if (st == TS_OK) st = serve_textout_finish(&to);
    } else if (st == TS_OK && *how == SERVE_FINISH_STOP) {
        st = serve_textout_finish(&to); /* held text that was not a stop (end of generation) */
    }
    serve_textout_free(&to);
    ts_detokenizer_free(dt);
    ts_sampler_free(smp);
    return st;
}

void serve_decoder_run(serve_decoder *d, serve_job *j, serve_finish *how, char *err,
                       size_t err_size) {
    *how = SERVE_FINISH_ERROR;
    d->answer_pending = false;
    d->pending_snap = -1;
    int held = held_prefix(d, j); /* before seq becomes the new prompt */
    memcpy(d->seq, j->ids, (size_t)j->n_ids * sizeof *j->ids);
    d->n_seq = j->n_ids;
    memset(d->gen_count, 0, (size_t)d->n_vocab * sizeof *d->gen_count);

    int start = restore_prefix(d, j, held);
    pthread_mutex_lock(&j->mu);
    j->prompt_tokens = j->n_ids;
    j->cached_tokens = start;
    pthread_mutex_unlock(&j->mu);
    ts_status st = cancelled(j) ? TS_ERR_CANCELLED : prefill_prompt(d, j, start);
    if (st == TS_OK && cancelled(j)) st = TS_ERR_CANCELLED;
    if (st == TS_OK) {
        serve_metrics_tokens(d->o.metrics, j->n_ids, start, j->n_ids - start, 0);
        st = decode(d, j, how);
        serve_metrics_tokens(d->o.metrics, 0, 0, 0, j->completion_tokens);
    }
    flush_snapshot(d); /* when decoding never stepped (one token, or cancelled at once) */
    if (st == TS_ERR_CANCELLED) {
        *how = SERVE_FINISH_CANCELLED;
    } else if (st != TS_OK) {
        *how = SERVE_FINISH_ERROR;
        snprintf(err, err_size, "%s", ts_last_error());
    }
    if (*how == SERVE_FINISH_CANCELLED || *how == SERVE_FINISH_ERROR) d->answer_pending = false;
    /* cancelled work stops between forward calls: slot 0 still holds a prefix of seq */
    d->slot_known = st == TS_OK || st == TS_ERR_CANCELLED;
}

void serve_decoder_snapshot_answer(serve_decoder *d) {
    if (!d->answer_pending || d->o.cache->n == 0) return;
    d->answer_pending = false;
    int held = ts_engine_slot_len(d->o.engine, 0);
    if (held != d->n_seq - 1 || d->n_seq > d->n_ctx) return;
    if (prefill(d, NULL, held, d->n_seq, false) != TS_OK) {
        d->slot_known = false;
        return;
    }
    snapshot(d, d->n_seq);
}

/* ---- the next turn's prefix ------------------------------------------------------------- */

/* The conversation as the next request will carry it: the messages, this answer as the client
 * got it (content, reasoning_content when there was any, tool calls), then a placeholder turn
 * (a tool result after tool calls, else a user message), tokenized without a generation
 * prompt. *cut: where the placeholder's turn starts (after the answer's "<|im_end|>\n"). */
static ts_status render_next_turn(serve_decoder *d, const serve_job *j, int32_t **ids,
                                  size_t *n, int *cut) {
    const serve_request *r = j->req;
    ts_strbuf text[2] = {{0}, {0}};
    json_t *parsed = json_array();
    int n_calls = 0;
    for (int i = 0; i < j->n_seg; i++)
        if (j->seg[i].ch == SERVE_CH_TOOL) n_calls++;
    ts_chat_message *m = calloc((size_t)r->n_msgs + 2, sizeof *m);
    ts_tool_call *calls = calloc((size_t)n_calls + 1, sizeof *calls);
    ts_status st = m && calls && parsed ? TS_OK : ts_error(TS_ERR_NOMEM, "out of memory");
    for (int i = 0, c = 0; st == TS_OK && i < j->n_seg; i++) {
        const char *p = j->text.data + j->seg[i].off;
        if (j->seg[i].ch != SERVE_CH_TOOL) {
            st = ts_strbuf_append(&text[j->seg[i].ch], p, j->seg[i].len);
            continue;
        }
        json_t *call = json_loadb(p, j->seg[i].len, 0, NULL);
        json_array_append_new(parsed, call);
        calls[c].name = json_string_value(json_object_get(call, "name"));
        calls[c++].arguments_json = json_string_value(json_object_get(call, "arguments"));
    }
    for (int c = 0; st == TS_OK && c < n_calls; c++)
        if (!calls[c].name) st = ts_error(TS_ERR_INVALID, "a tool call segment is malformed");
    if (st == TS_OK) {
        memcpy(m, r->msgs, (size_t)r->n_msgs * sizeof *m);
        m[r->n_msgs] = (ts_chat_message){.role = "assistant",
                                         .content = text[0].data ? text[0].data : "",
                                         .reasoning_content = text[1].len ? text[1].data : NULL,
                                         .tool_calls = calls,
                                         .n_tool_calls = n_calls};
        m[r->n_msgs + 1] = (ts_chat_message){.role = n_calls ? "tool" : "user", .content = "x"};
        ts_chat_params cp = {false, r->enable_thinking, r->tools_json};
        st = ts_chat_tokenize(d->o.tok, m, r->n_msgs + 2, &cp, ids, n);
    }
    *cut = -1;
    for (size_t i = 0; st == TS_OK && i < *n; i++)
        if ((*ids)[i] == d->turn_start) *cut = (int)i;
    free(m);
    free(calls);
    json_decref(parsed);
    ts_strbuf_free(&text[0]);
    ts_strbuf_free(&text[1]);
    return st;
}

bool serve_decoder_prepare_next_turn(serve_decoder *d, const serve_job *j,
                                     serve_interrupt_fn interrupt, void *ctx, int *prefilled) {
    *prefilled = 0;
    if (!j->req || d->o.cache->n == 0 || d->turn_start < 0) return false;
    int32_t *ids = NULL;
    size_t n = 0;
    int cut = -1;
    if (render_next_turn(d, j, &ids, &n, &cut) != TS_OK || cut <= 0 || cut >= d->n_ctx) {
        free(ids);
        return false;
    }
    /* start from whichever holds more of the prefix: a snapshot, or the working slot itself
     * (it holds the prompt and answer, a prefix when the template renders the answer back as
     * it was generated, e.g. tool calls after thinking) */
    int held = ts_engine_slot_len(d->o.engine, 0), start = 0;
    bool slot_ok = held > 0 && held <= cut && held <= d->n_seq &&
                   memcmp(d->seq, ids, (size_t)held * sizeof *ids) == 0;
    const serve_snapshot *s = serve_prefix_cache_find(d->o.cache, ids, cut, cut);
    d->answer_pending = false;
    if (s && s->len == cut) {
        free(ids);
        return true; /* already held */
    }
    if (s && s->len > (slot_ok ? held : 0) &&
        ts_engine_slot_copy(d->o.engine, s->slot, 0) == TS_OK) {
        start = s->len;
    } else if (slot_ok) {
        start = held;
    } else {
        ts_engine_slot_clear(d->o.engine, 0);
    }
    memcpy(d->seq, ids, (size_t)cut * sizeof *ids);
    d->n_seq = cut;
    free(ids);
    ts_status st =
        prefill_chunked(d, interrupt, ctx, d->o.next_turn_chunk, start, cut, false, false);
    *prefilled = ts_engine_slot_len(d->o.engine, 0) - start;
    if (st != TS_OK) {
        d->slot_known = st == TS_ERR_CANCELLED; /* interrupted between chunks: still a prefix */
        return false;
    }
    snapshot(d, cut);
    return true;
}
