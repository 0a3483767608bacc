/* OpenAI's Responses API (POST /v1/responses), stateless: a request is read as the chat
 * request it means (responses_request.c) and runs as one; its answer is rendered as a response
 * object and, streaming, as the API's typed events (responses.c). docs/API.md, "The Responses
 * API". */
#ifndef TS_SERVE_RESPONSES_H
#define TS_SERVE_RESPONSES_H

#include "serve/job.h"
#include "serve/openai.h"
#include "serve/respond.h"
#include "serve/responses_store.h"

#include <jansson.h>

/* Where the chat request's messages came from, so that a chat check's param names the field
 * the client sent: message i is input item item[i] (-1: the instructions, -2: the previous
 * response's conversation), and its tool call k is input item call[call_at[i] + k]. */
typedef struct {
    int *item, *call_at, *call;
    bool *tool_output; /* message i is a function_call_output item's */
    int n_msgs, n_calls;
} serve_rsp_map;

void serve_rsp_map_free(serve_rsp_map *m);

/* A Responses request read: the chat request body it means, the map of its messages, the
 * request's settings the answer echoes (instructions, max_output_tokens, temperature, top_p,
 * tools, tool_choice, parallel_tool_calls, text, reasoning, truncation, store, metadata,
 * previous_response_id), and - when it is to be stored - its conversation (the messages but
 * the instructions' system message) for the store to keep with the answer. */
typedef struct {
    json_t *chat, *settings, *conversation; /* owned; conversation NULL: not stored */
    json_t *input; /* owned, with the conversation: the input as its listed items */
    serve_rsp_map map;
    bool truncate_auto; /* truncation "auto": the chat request's truncate_auto */
} serve_rsp_read;

void serve_rsp_read_free(serve_rsp_read *rd);

/* Reads a Responses request body; a previous_response_id is looked up in store (NULL: none
 * kept) and its conversation goes first. False with e set for a request the translation
 * refuses (the Responses fields' own checks); the chat checks come after, on rd->chat. */
bool serve_rsp_request(const json_t *body, serve_rsp_store *store, serve_rsp_read *rd,
                       serve_error *e);

/* The answer of job j as the conversation's next chat message (the assistant's text, its
 * reasoning, its tool calls with the call ids the response gave them). */
json_t *serve_rsp_answer_message(const serve_resp *r, const serve_job *j);

/* Rewrites a chat check's param and message into the Responses request's names
 * (messages[i] -> input[j] or instructions, max_completion_tokens -> max_output_tokens,
 * response_format -> text.format, reasoning_effort -> reasoning.effort, tools[i].function ->
 * tools[i], tool_choice.function -> tool_choice). */
void serve_rsp_error(const serve_rsp_map *map, serve_error *e);

/* What a stream has sent: the events' count and the output item open now. */
typedef struct {
    int seq;        /* the next event's sequence_number */
    int n_items;    /* output items opened */
    int open;       /* the channel of the item open now (SERVE_CH_*), -1 none */
    ts_strbuf text; /* the open item's text so far */
    json_t *lps;    /* the answer's log-probabilities so far (a list), NULL without */
    int lp_held;    /* of them, how many went out with output_text deltas */
} serve_rsp_stream;

void serve_rsp_stream_free(serve_rsp_stream *s);

/* The whole response object for job j (finished, its mutex held) as a JSON string; kept in
 * the store with its conversation when the request is stored. */
char *serve_rsp_full(const serve_resp *r, const serve_job *j);

/* Stream events appended to out ("event: TYPE\ndata: {...}\n\n"). */
ts_status serve_rsp_stream_start(const serve_resp *r, serve_rsp_stream *s, ts_strbuf *out);
ts_status serve_rsp_stream_text(const serve_resp *r, serve_rsp_stream *s, serve_channel ch,
                                const char *text, size_t n, const serve_logprob *lp, int n_lp,
                                ts_strbuf *out);
ts_status serve_rsp_stream_tool(const serve_resp *r, serve_rsp_stream *s, int call,
                                const char *text, size_t n, const serve_logprob *lp, int n_lp,
                                ts_strbuf *out);
/* After the job's last output: the open item closed, then response.completed (or
 * response.incomplete) with the whole response. */
ts_status serve_rsp_stream_finish(const serve_resp *r, serve_rsp_stream *s, const serve_job *j,
                                  const serve_logprob *lp, int n_lp, ts_strbuf *out);
/* A failure after the stream started: an error event, then response.failed. */
ts_status serve_rsp_stream_error(const serve_resp *r, serve_rsp_stream *s, const serve_error *e,
                                 ts_strbuf *out);

#endif
