/* The Responses API's answers: the response object, and its stream of typed events. A job's
 * output segments become output items in order: consecutive reasoning text one reasoning
 * item, consecutive content one message, each tool call a function_call item; the item at
 * output index k is named <kind>_<the response's hex>_<k> in the stream and in the object
 * alike. */
#include "serve/responses.h"

#include "base/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void serve_rsp_stream_free(serve_rsp_stream *s) {
    ts_strbuf_free(&s->text);
    json_decref(s->lps);
    s->lps = NULL;
}

/* Tokens inside the thinking (its tags included), from the answer's ids. */
static int reasoning_tokens(const serve_resp *r, const serve_job *j) {
    bool in = j->in_think;
    int n = 0;
    for (int i = 0; i < j->completion_tokens; i++) {
        int32_t id = j->out_ids[i];
        if (id == r->think_open) in = true;
        n += in;
        if (id == r->think_close) in = false;
    }
    return n;
}

static json_t *usage(const serve_resp *r, const serve_job *j) {
    return json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", j->prompt_tokens,
                     "input_tokens_details", "cached_tokens", j->cached_tokens, "output_tokens",
                     j->completion_tokens, "output_tokens_details", "reasoning_tokens",
                     reasoning_tokens(r, j), "total_tokens",
                     j->prompt_tokens + j->completion_tokens);
}

static json_t *text_part(serve_channel ch, const char *s, size_t n, json_t *lps) {
    if (ch == SERVE_CH_REASONING)
        return json_pack("{s:s, s:s%}", "type", "reasoning_text", "text", s ? s : "", n);
    json_t *p =
        json_pack("{s:s, s:s%, s:[]}", "type", "output_text", "text", s ? s : "", n, "annotations");
    if (p && lps) json_object_set(p, "logprobs", lps);
    return p;
}

/* An item of text, whole (content: its parts) or just opened (content []). */
static json_t *text_item(const serve_resp *r, serve_channel ch, int k, json_t *part,
                         const char *status) {
    json_t *content = part ? json_pack("[o]", part) : json_array();
    if (ch == SERVE_CH_REASONING)
        return json_pack("{s:s, s:o, s:[], s:o}", "type", "reasoning", "id",
                         serve_resp_part_id(r, "rs", k), "summary", "content", content);
    return json_pack("{s:s, s:o, s:s, s:s, s:o}", "type", "message", "id",
                     serve_resp_part_id(r, "msg", k), "status", status, "role", "assistant",
                     "content", content);
}

/* A tool call's item from its segment's JSON {"name", "arguments"}; arguments "" while open. */
static json_t *call_item(const serve_resp *r, int k, const char *s, size_t n, bool whole) {
    json_t *c = json_loadb(s, n, 0, NULL);
    json_t *it = json_pack("{s:s, s:o, s:o, s:O?, s:O?, s:s}", "type", "function_call", "id",
                           serve_resp_part_id(r, "fc", k), "call_id",
                           serve_resp_part_id(r, "call", k), "name", json_object_get(c, "name"),
                           "arguments", whole ? json_object_get(c, "arguments") : NULL, "status",
                           whole ? "completed" : "in_progress");
    if (it && !whole) json_object_set_new(it, "arguments", json_string(""));
    json_decref(c);
    return it;
}

/* The response object; output NULL: none yet (a stream's first events). */
static json_t *response_json(const serve_resp *r, const char *status, json_t *output,
                             const serve_job *j) {
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:n, s:n, s:s, s:o, s:o}", "id", r->id, "object",
                          "response", "created_at", (json_int_t)r->created, "status", status,
                          "error", "incomplete_details", "model", r->model, "output",
                          output ? output : json_array(), "usage", j ? usage(r, j) : json_null());
    if (!o) return NULL;
    if (r->settings) json_object_update(o, r->settings);
    if (j && j->finish == SERVE_FINISH_LENGTH)
        json_object_set_new(o, "incomplete_details",
                            json_pack("{s:s}", "reason", "max_output_tokens"));
    return o;
}

static const char *job_status(const serve_job *j) {
    return j->finish == SERVE_FINISH_LENGTH ? "incomplete" : "completed";
}

/* The output items of a finished job. */
static json_t *output_json(const serve_resp *r, const serve_job *j) {
    json_t *out = json_array();
    int last_msg = -1; /* the answer's log-probabilities go with its last message */
    size_t off, len;
    for (int i = 0, k = 0; i < j->n_seg; i = serve_job_piece_end(j, i, &off, &len), k++)
        if (j->seg[i].ch == SERVE_CH_CONTENT) last_msg = k;
    for (int i = 0, next, k = 0; i < j->n_seg; i = next, k++) {
        serve_channel ch = j->seg[i].ch;
        next = serve_job_piece_end(j, i, &off, &len);
        if (ch == SERVE_CH_TOOL) {
            json_array_append_new(out, call_item(r, k, j->text.data + off, len, true));
            continue;
        }
        json_t *lps =
            r->logprobs && k == last_msg ? serve_resp_logprob_list(r, j->lp, j->n_lp) : NULL;
        json_array_append_new(
            out, text_item(r, ch, k, text_part(ch, j->text.data + off, len, lps), job_status(j)));
        json_decref(lps);
    }
    return out;
}

json_t *serve_rsp_answer_message(const serve_resp *r, const serve_job *j) {
    ts_strbuf text[2] = {{0}, {0}}; /* content, reasoning */
    json_t *calls = json_array();
    size_t off, len;
    for (int i = 0, next, k = 0; i < j->n_seg; i = next, k++) {
        serve_channel ch = j->seg[i].ch;
        next = serve_job_piece_end(j, i, &off, &len);
        if (ch != SERVE_CH_TOOL) {
            ts_strbuf_append(&text[ch == SERVE_CH_REASONING], j->text.data + off, len);
            continue;
        }
        json_t *it = call_item(r, k, j->text.data + off, len, true);
        json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id",
                                               json_object_get(it, "call_id"), "type", "function",
                                               "function", "name", json_object_get(it, "name"),
                                               "arguments", json_object_get(it, "arguments")));
        json_decref(it);
    }
    json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content",
                          text[0].len || !json_array_size(calls)
                              ? json_stringn(text[0].data ? text[0].data : "", text[0].len)
                              : json_null());
    if (m && text[1].len)
        json_object_set_new(m, "reasoning_content", json_stringn(text[1].data, text[1].len));
    if (m && json_array_size(calls)) json_object_set(m, "tool_calls", calls);
    json_decref(calls);
    ts_strbuf_free(&text[0]);
    ts_strbuf_free(&text[1]);
    return m;
}

/* The listed input items' ids where the client gave none: the response's, then the item's
 * place ("item_<hex>_<i>" for response "resp_<hex>"), each unique within the response. */
static void item_ids(const serve_resp *r, json_t *items) {
    const char *hex = strchr(r->id, '_') ? strchr(r->id, '_') + 1 : r->id;
    size_t i;
    json_t *it;
    json_array_foreach(items, i, it) {
        if (json_is_string(json_object_get(it, "id"))) continue;
        char id[96];
        snprintf(id, sizeof id, "item_%s_%zu", hex, i);
        json_object_set_new(it, "id", json_string(id));
    }
}

/* Keeps a stored request's conversation, its answer appended, and its input items with the
 * response object. */
static void keep(const serve_resp *r, const serve_job *j, const char *object) {
    if (!r->conversation || !r->store || !object) return;
    json_t *conv = json_copy(r->conversation); /* the same messages, one more */
    json_t *input = r->input ? json_deep_copy(r->input) : NULL;
    if (input) item_ids(r, input);
    if (conv && json_array_append_new(conv, serve_rsp_answer_message(r, j)) == 0)
        serve_rsp_store_put(r->store, r->id, conv, input, object);
    json_decref(conv);
    json_decref(input);
}

char *serve_rsp_full(const serve_resp *r, const serve_job *j) {
    json_t *o = response_json(r, job_status(j), output_json(r, j), j);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    keep(r, j, s);
    return s;
}

/* ---- the stream ----------------------------------------------------------------------- */

static ts_status event(serve_rsp_stream *s, const char *type, json_t *v, ts_strbuf *out) {
    if (v) json_object_set_new(v, "sequence_number", json_integer(s->seq++));
    return serve_sse_event(out, type, v);
}

ts_status serve_rsp_stream_start(const serve_resp *r, serve_rsp_stream *s, ts_strbuf *out) {
    s->open = -1;
    if (r->logprobs && !(s->lps = json_array())) return TS_ERR_NOMEM;
    TS_TRY(event(s, "response.created",
                 json_pack("{s:o}", "response", response_json(r, "in_progress", NULL, NULL)), out));
    return event(s, "response.in_progress",
                 json_pack("{s:o}", "response", response_json(r, "in_progress", NULL, NULL)), out);
}

/* Keeps the step's log-probabilities (they go with the message's text). */
static void hold_lps(const serve_resp *r, serve_rsp_stream *s, const serve_logprob *lp, int n) {
    if (!s->lps || !n) return;
    json_t *more = serve_resp_logprob_list(r, lp, n);
    json_array_extend(s->lps, more);
    json_decref(more);
}

/* The log-probabilities not yet sent, as a list. */
static json_t *take_lps(serve_rsp_stream *s) {
    json_t *l = json_array();
    for (size_t i = (size_t)s->lp_held; s->lps && i < json_array_size(s->lps); i++)
        json_array_append(l, json_array_get(s->lps, i));
    s->lp_held = s->lps ? (int)json_array_size(s->lps) : 0;
    return l;
}

static ts_status close_item(const serve_resp *r, serve_rsp_stream *s, const char *status,
                            ts_strbuf *out) {
    if (s->open < 0) return TS_OK;
    serve_channel ch = (serve_channel)s->open;
    int k = s->n_items - 1;
    const char *text = s->text.data ? s->text.data : "";
    bool msg = ch == SERVE_CH_CONTENT;
    json_t *lps = msg && s->lps ? s->lps : NULL;
    if (lps && (size_t)s->lp_held < json_array_size(lps)) {
        /* tokens that showed no text (an end-of-generation token): their log-probabilities
         * still come in a delta, so that the deltas' add up to the done event's */
        json_t *d =
            json_pack("{s:o, s:i, s:i, s:s, s:o}", "item_id", serve_resp_part_id(r, "msg", k),
                      "output_index", k, "content_index", 0, "delta", "", "logprobs", take_lps(s));
        TS_TRY(event(s, "response.output_text.delta", d, out));
    }
    json_t *done =
        json_pack("{s:o, s:i, s:i, s:s%}", "item_id", serve_resp_part_id(r, msg ? "msg" : "rs", k),
                  "output_index", k, "content_index", 0, "text", text, s->text.len);
    if (done && lps) json_object_set(done, "logprobs", lps);
    TS_TRY(event(s, msg ? "response.output_text.done" : "response.reasoning_text.done", done, out));
    TS_TRY(event(s, "response.content_part.done",
                 json_pack("{s:o, s:i, s:i, s:o}", "item_id",
                           serve_resp_part_id(r, msg ? "msg" : "rs", k), "output_index", k,
                           "content_index", 0, "part", text_part(ch, text, s->text.len, lps)),
                 out));
    TS_TRY(event(s, "response.output_item.done",
                 json_pack("{s:i, s:o}", "output_index", k, "item",
                           text_item(r, ch, k, text_part(ch, text, s->text.len, lps), status)),
                 out));
    s->open = -1;
    s->text.len = 0;
    return TS_OK;
}

ts_status serve_rsp_stream_text(const serve_resp *r, serve_rsp_stream *s, serve_channel ch,
                                const char *text, size_t n, const serve_logprob *lp, int n_lp,
                                ts_strbuf *out) {
    hold_lps(r, s, lp, n_lp);
    bool msg = ch == SERVE_CH_CONTENT;
    if (s->open != (int)ch) {
        TS_TRY(close_item(r, s, "completed", out));
        int k = s->n_items++;
        s->open = (int)ch;
        TS_TRY(event(s, "response.output_item.added",
                     json_pack("{s:i, s:o}", "output_index", k, "item",
                               text_item(r, ch, k, NULL, "in_progress")),
                     out));
        TS_TRY(event(s, "response.content_part.added",
                     json_pack("{s:o, s:i, s:i, s:o}", "item_id",
                               serve_resp_part_id(r, msg ? "msg" : "rs", k), "output_index", k,
                               "content_index", 0, "part", text_part(ch, "", 0, NULL)),
                     out));
    }
    int k = s->n_items - 1;
    TS_TRY(ts_strbuf_append(&s->text, text, n));
    json_t *d =
        json_pack("{s:o, s:i, s:i, s:s%}", "item_id", serve_resp_part_id(r, msg ? "msg" : "rs", k),
                  "output_index", k, "content_index", 0, "delta", text, n);
    if (d && msg && s->lps) json_object_set_new(d, "logprobs", take_lps(s));
    return event(s, msg ? "response.output_text.delta" : "response.reasoning_text.delta", d, out);
}

ts_status serve_rsp_stream_tool(const serve_resp *r, serve_rsp_stream *s, int call,
                                const char *text, size_t n, const serve_logprob *lp, int n_lp,
                                ts_strbuf *out) {
    (void)call;
    hold_lps(r, s, lp, n_lp);
    TS_TRY(close_item(r, s, "completed", out));
    int k = s->n_items++;
    json_t *whole = call_item(r, k, text, n, true);
    if (!whole) return TS_ERR_NOMEM;
    json_t *args = json_object_get(whole, "arguments");
    ts_status st = event(
        s, "response.output_item.added",
        json_pack("{s:i, s:o}", "output_index", k, "item", call_item(r, k, text, n, false)), out);
    if (st == TS_OK)
        st = event(s, "response.function_call_arguments.delta",
                   json_pack("{s:o, s:i, s:O}", "item_id", serve_resp_part_id(r, "fc", k),
                             "output_index", k, "delta", args),
                   out);
    if (st == TS_OK)
        st = event(s, "response.function_call_arguments.done",
                   json_pack("{s:o, s:i, s:O?, s:O}", "item_id", serve_resp_part_id(r, "fc", k),
                             "output_index", k, "name", json_object_get(whole, "name"), "arguments",
                             args),
                   out);
    if (st == TS_OK)
        st = event(s, "response.output_item.done",
                   json_pack("{s:i, s:O}", "output_index", k, "item", whole), out);
    json_decref(whole);
    return st;
}

ts_status serve_rsp_stream_finish(const serve_resp *r, serve_rsp_stream *s, const serve_job *j,
                                  const serve_logprob *lp, int n_lp, ts_strbuf *out) {
    hold_lps(r, s, lp, n_lp);
    const char *status = job_status(j);
    TS_TRY(close_item(r, s, status, out));
    json_t *o = response_json(r, status, output_json(r, j), j);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    keep(r, j, text);
    free(text);
    return event(s, j->finish == SERVE_FINISH_LENGTH ? "response.incomplete" : "response.completed",
                 json_pack("{s:o}", "response", o), out);
}

ts_status serve_rsp_stream_error(const serve_resp *r, serve_rsp_stream *s, const serve_error *e,
                                 ts_strbuf *out) {
    TS_TRY(event(s, "error",
                 json_pack("{s:s, s:s, s:s?}", "code", e->code, "message", e->message, "param",
                           e->param[0] ? e->param : NULL),
                 out));
    json_t *resp = response_json(r, "failed", NULL, NULL);
    if (resp)
        json_object_set_new(resp, "error",
                            json_pack("{s:s, s:s}", "code", e->code, "message", e->message));
    return event(s, "response.failed", json_pack("{s:o}", "response", resp), out);
}
