/* The Anthropic Messages API's answers: the message object, and its stream of events. A job's
 * output segments become content blocks in order: consecutive reasoning one thinking block,
 * consecutive content one text block, each tool call a tool_use block (its id
 * toolu_<the message's hex>_<block index>, the same in the stream and in the object). */
#include "serve/messages.h"

#include "base/status.h"
#include "text/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *serve_msg_error_json(const serve_error *e) {
    /* Anthropic's error types by status; the message made valid UTF-8 (it may quote the
     * request, cut mid-character), as serve_error_json does */
    const char *type = e->status == 401   ? "authentication_error"
                       : e->status == 403 ? "permission_error"
                       : e->status == 404 ? "not_found_error"
                       : e->status == 413 ? "request_too_large"
                       : e->status == 429 ? "rate_limit_error"
                       : e->status == 503 ? "overloaded_error"
                       : e->status >= 500 ? "api_error"
                                          : "invalid_request_error";
    ts_strbuf msg = {0};
    if (ts_utf8_append_lossy(&msg, e->message, strlen(e->message)) != TS_OK) {
        ts_strbuf_free(&msg);
        return NULL;
    }
    json_t *root = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", type,
                             "message", msg.data ? msg.data : "");
    ts_strbuf_free(&msg);
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return s;
}

/* A tool_use block from a call segment's JSON {"name", "arguments"}: input the parsed
 * arguments (an object), {} while open in a stream. */
static json_t *tool_block(const serve_resp *r, int k, const char *s, size_t n, bool whole) {
    json_t *c = json_loadb(s, n, 0, NULL);
    const json_t *args = json_object_get(c, "arguments");
    json_t *input = whole && json_is_string(args)
                        ? json_loads(json_string_value(args), JSON_DECODE_ANY, NULL)
                        : NULL;
    if (!json_is_object(input)) json_decref(input), input = json_object();
    json_t *b = json_pack("{s:s, s:o, s:O?, s:o}", "type", "tool_use", "id",
                          serve_resp_part_id(r, "toolu", k), "name", json_object_get(c, "name"),
                          "input", input);
    json_decref(c);
    return b;
}

static json_t *text_block(serve_channel ch, const char *s, size_t n) {
    if (ch == SERVE_CH_REASONING)
        return json_pack("{s:s, s:s%, s:s}", "type", "thinking", "thinking", s ? s : "", n,
                         "signature", "");
    return json_pack("{s:s, s:s%}", "type", "text", "text", s ? s : "", n);
}

static bool has_calls(const serve_job *j) {
    for (int i = 0; i < j->n_seg; i++)
        if (j->seg[i].ch == SERVE_CH_TOOL) return true;
    return false;
}

/* stop_reason and stop_sequence of a finished job. */
static json_t *stop_reason(const serve_job *j, json_t **seq) {
    *seq = j->stop_str >= 0 && j->stop_str < j->n_stops ? json_string(j->stops[j->stop_str])
                                                        : json_null();
    if (j->finish == SERVE_FINISH_LENGTH) return json_string("max_tokens");
    if (j->stop_str >= 0) return json_string("stop_sequence");
    return json_string(has_calls(j) ? "tool_use" : "end_turn");
}

/* Anthropic counts the prompt's tokens read from the cache apart from input_tokens. Before the
 * job ran (a stream's start) the prompt's tokens are known, what the cache held is not. */
static json_t *usage(const serve_job *j, bool done) {
    int cached = done ? j->cached_tokens : 0;
    return json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", j->n_ids - cached,
                     "cache_creation_input_tokens", 0, "cache_read_input_tokens", cached,
                     "output_tokens", done ? j->completion_tokens : 0);
}

static json_t *message_json(const serve_resp *r, json_t *content, const serve_job *j, bool done) {
    json_t *seq = json_null(), *reason = done ? stop_reason(j, &seq) : json_null();
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:o, s:o, s:o}", "id", r->id, "type", "message",
                     "role", "assistant", "model", r->model, "content", content, "stop_reason",
                     reason, "stop_sequence", seq, "usage", usage(j, done));
}

char *serve_msg_full(const serve_resp *r, const serve_job *j) {
    json_t *content = json_array();
    size_t off, len;
    for (int i = 0, next, k = 0; i < j->n_seg; i = next, k++) {
        serve_channel ch = j->seg[i].ch;
        next = serve_job_piece_end(j, i, &off, &len);
        json_array_append_new(content, ch == SERVE_CH_TOOL
                                           ? tool_block(r, k, j->text.data + off, len, true)
                                           : text_block(ch, j->text.data + off, len));
    }
    json_t *m = message_json(r, content, j, true);
    char *s = m ? json_dumps(m, JSON_COMPACT) : NULL;
    json_decref(m);
    return s;
}

/* ---- the stream ------------------------------------------------------------------------- */

/* One of the stream's events (serve_sse_event, in this file's argument order). */
static ts_status event(const char *type, json_t *v, ts_strbuf *out) {
    return serve_sse_event(out, type, v);
}

ts_status serve_msg_stream_start(const serve_resp *r, serve_msg_stream *s, const serve_job *j,
                                 ts_strbuf *out) {
    *s = (serve_msg_stream){0, -1};
    return event("message_start",
                 json_pack("{s:o}", "message", message_json(r, json_array(), j, false)), out);
}

static ts_status close_block(serve_msg_stream *s, ts_strbuf *out) {
    if (s->open < 0) return TS_OK;
    if (s->open == SERVE_CH_REASONING) /* a thinking block ends with its signature: none here */
        TS_TRY(event("content_block_delta",
                     json_pack("{s:i, s:{s:s, s:s}}", "index", s->n_blocks - 1, "delta", "type",
                               "signature_delta", "signature", ""),
                     out));
    s->open = -1;
    return event("content_block_stop", json_pack("{s:i}", "index", s->n_blocks - 1), out);
}

ts_status serve_msg_stream_text(serve_msg_stream *s, serve_channel ch, const char *text, size_t n,
                                ts_strbuf *out) {
    if (s->open != (int)ch) {
        TS_TRY(close_block(s, out));
        s->open = (int)ch;
        TS_TRY(event(
            "content_block_start",
            json_pack("{s:i, s:o}", "index", s->n_blocks++, "content_block", text_block(ch, "", 0)),
            out));
    }
    bool th = ch == SERVE_CH_REASONING;
    return event("content_block_delta",
                 json_pack("{s:i, s:{s:s, s:s%}}", "index", s->n_blocks - 1, "delta", "type",
                           th ? "thinking_delta" : "text_delta", th ? "thinking" : "text", text, n),
                 out);
}

ts_status serve_msg_stream_tool(const serve_resp *r, serve_msg_stream *s, int call,
                                const char *text, size_t n, ts_strbuf *out) {
    (void)call;
    TS_TRY(close_block(s, out));
    int k = s->n_blocks++;
    json_t *whole = tool_block(r, k, text, n, true);
    char *args = whole ? json_dumps(json_object_get(whole, "input"), JSON_COMPACT) : NULL;
    json_decref(whole);
    if (!args) return TS_ERR_NOMEM;
    ts_status st = event(
        "content_block_start",
        json_pack("{s:i, s:o}", "index", k, "content_block", tool_block(r, k, text, n, false)),
        out);
    if (st == TS_OK)
        st = event("content_block_delta",
                   json_pack("{s:i, s:{s:s, s:s}}", "index", k, "delta", "type", "input_json_delta",
                             "partial_json", args),
                   out);
    free(args);
    if (st == TS_OK) st = event("content_block_stop", json_pack("{s:i}", "index", k), out);
    return st;
}

ts_status serve_msg_stream_finish(serve_msg_stream *s, const serve_job *j, ts_strbuf *out) {
    TS_TRY(close_block(s, out));
    json_t *seq, *reason = stop_reason(j, &seq);
    TS_TRY(event("message_delta",
                 json_pack("{s:{s:o, s:o}, s:o}", "delta", "stop_reason", reason, "stop_sequence",
                           seq, "usage", usage(j, true)),
                 out));
    return event("message_stop", json_object(), out);
}

ts_status serve_msg_stream_error(const serve_error *e, ts_strbuf *out) {
    char *body = serve_msg_error_json(e);
    json_t *v = body ? json_loads(body, 0, NULL) : NULL;
    free(body);
    if (!v) return TS_ERR_NOMEM;
    json_object_del(v, "type");
    return event("error", v, out);
}
