/* The idle worker's work after an answer (decode.h): the prefix a chat's next request will
 * start with, or a raw completion's own state, kept as snapshots. */
#include "base/status.h"
#include "serve/decode_int.h"
#include "serve/openai.h"
#include "serve/prep.h"

#include <stdlib.h>
#include <string.h>

/* Runs seq[from, to) through the lane's slot (which must hold exactly `from` tokens), in
 * chunks of `chunk` so that an interruption (stop, may be NULL) is seen between them. No logits:
 * this only builds state to keep. */
static ts_status lane_prefill(serve_decoder *d, serve_lane *ln, const serve_images *im,
                              serve_interrupt_fn stop, void *ctx, int chunk, int from, int to) {
    for (int a = from; a < to;) {
        if (stop && stop(ctx)) return TS_ERR_CANCELLED;
        int n = to - a < chunk ? to - a : chunk;
        for (int i = 0; i < n; i++) /* seq holds image tokens as their keys */
            d->tok[i] = serve_images_token(im, ln->seq[a + i]), d->pos[i] = a + i,
            d->slot[i] = ln->slot;
        /* an explicit "no logits" list: without one the engine computes the last token's */
        memset(d->want, 0, (size_t)n);
        ts_batch b = {n, d->tok, d->pos, d->slot, d->want, NULL, NULL};
        if (serve_images_rows(im, a, n, d->o.n_embd, d->embd, d->rope))
            b.embd = (const float *const *)d->embd, b.rope_pos = d->rope;
        TS_TRY(ts_engine_forward(d->o.engine, &b, NULL));
        a += n;
    }
    return TS_OK;
}

/* Keeps the lane's slot (holding seq[0, len)) as a snapshot. */
static void lane_snapshot(serve_decoder *d, serve_lane *ln, int len) {
    serve_snap_fill(d, ln, serve_snap_reserve(d, ln, len, NULL), len);
}

/* After a raw completion: runs the answer's last token and keeps the state as a snapshot. */
static void snapshot_answer(serve_decoder *d, serve_lane *ln, const serve_job *j) {
    if (!ln->answer_pending || d->o.cache->n == 0) return;
    ln->answer_pending = false;
    /* the slot holds the answer but its last token - or less, after speculative decoding
     * took guesses back to a mark (speculate.c): the rest runs here */
    int held = ts_engine_slot_len(d->o.engine, ln->slot);
    if (!ln->slot_known || held > ln->n_seq - 1 || ln->n_seq > d->n_ctx) return;
    if (lane_prefill(d, ln, &j->images, NULL, NULL, d->o.prefill_chunk, held, ln->n_seq) != TS_OK) {
        ln->slot_known = false;
        return;
    }
    lane_snapshot(d, ln, ln->n_seq);
}

/* The conversation as the next request will carry it: the messages, this answer as the client
 * got it (content, reasoning_content when there was any, tool calls), then a placeholder turn
 * (a tool result after tool calls, else a user message), tokenized without a generation
 * prompt. *cut: where the placeholder's turn starts (after the answer's "<|im_end|>\n"). */
static ts_status render_next_turn(serve_decoder *d, const serve_job *j, int32_t **ids, size_t *n,
                                  int *cut) {
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
        ts_chat_params cp = serve_chat_params(r, &j->images);
        cp.add_generation_prompt = cp.continue_final = false;
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

/* After a chat answer: prefills the prefix the conversation's next request will start with and
 * keeps it as a snapshot. Checks interrupt between small prefill chunks and gives up as soon as
 * it says so. *prefilled: the tokens run through the model. Returns true when the prefix is
 * held (already, or now). */
static bool prepare_next_turn(serve_decoder *d, serve_lane *ln, serve_job *j,
                              serve_interrupt_fn interrupt, void *ctx, int *prefilled) {
    *prefilled = 0;
    if (!j->req || d->o.cache->n == 0 || d->turn_start < 0) return false;
    /* a prompt without the usual generation prompt, or one that continued its last message:
     * the next request's prefix cannot be told from it */
    if (!j->req->add_generation_prompt || j->req->continue_final) return false;
    int32_t *ids = NULL;
    size_t n = 0;
    int cut = -1;
    if (render_next_turn(d, j, &ids, &n, &cut) != TS_OK || cut <= 0 || cut >= d->n_ctx ||
        !serve_images_rekey(&j->images, ids, cut)) {
        free(ids);
        return false;
    }
    /* start from whichever holds more of the prefix: a snapshot, or the lane's slot itself (it
     * holds the prompt and answer, a prefix when the template renders the answer back as it
     * was generated, e.g. tool calls after thinking) */
    int held = ts_engine_slot_len(d->o.engine, ln->slot), start = 0;
    bool slot_ok = ln->slot_known && held > 0 && held <= cut && held <= ln->n_seq &&
                   memcmp(ln->seq, ids, (size_t)held * sizeof *ids) == 0;
    const serve_snapshot *s = serve_prefix_cache_find(d->o.cache, ln->lora_tag, ids, cut, cut);
    ln->answer_pending = false;
    if (s && s->len == cut) {
        free(ids);
        return true; /* already held */
    }
    if (s && s->len > (slot_ok ? held : 0) &&
        ts_engine_snap_restore(d->o.engine, s->id, ln->slot) == TS_OK) {
        start = s->len;
    } else if (slot_ok) {
        start = held;
    } else {
        ts_engine_slot_clear(d->o.engine, ln->slot);
    }
    ln->slot_known = true;
    memcpy(ln->seq, ids, (size_t)cut * sizeof *ids);
    ln->n_seq = cut;
    free(ids);
    /* image tokens to run (their snapshot was evicted): the images' rows, encoded now if they
     * never were */
    ts_status st = TS_OK;
    if (serve_images_needed_after(&j->images, start, cut < j->n_ids ? cut : j->n_ids))
        st = serve_decoder_encode_images(d, &j->images);
    if (st == TS_OK)
        st = lane_prefill(d, ln, &j->images, interrupt, ctx, d->o.next_turn_chunk, start, cut);
    *prefilled = ts_engine_slot_len(d->o.engine, ln->slot) - start;
    if (st != TS_OK) {
        ln->slot_known = st == TS_ERR_CANCELLED; /* interrupted between chunks: still a prefix */
        return false;
    }
    lane_snapshot(d, ln, cut);
    return true;
}

bool serve_decoder_has_idle_work(const serve_decoder *d) {
    for (int l = 0; l < d->o.n_lanes; l++)
        if (d->lane[l].ended) return true;
    return false;
}

void serve_decoder_idle_work(serve_decoder *d, serve_interrupt_fn interrupt, void *ctx) {
    for (;;) {
        serve_lane *ln = NULL;
        for (int l = 0; l < d->o.n_lanes; l++)
            if (d->lane[l].ended && (!ln || d->lane[l].ended_at > ln->ended_at)) ln = &d->lane[l];
        if (!ln || interrupt(ctx)) return;
        serve_job *j = ln->ended;
        ln->ended = NULL;
        if (j->req) {
            int n = 0;
            if (d->o.cache->n > 0) {
                bool ready = prepare_next_turn(d, ln, j, interrupt, ctx, &n);
                serve_metrics_next_turn(d->o.metrics, ready, n);
            }
        } else {
            snapshot_answer(d, ln, j);
        }
        serve_job_unref(j);
    }
}
