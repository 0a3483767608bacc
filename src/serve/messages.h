/* The Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens) on the chat path:
 * a request is read as the chat request it means (messages_request.c: system, content blocks,
 * tool_use / tool_result, thinking, tools, tool_choice, stop_sequences), run as a chat, and
 * answered as a message (messages.c: content blocks, stop_reason, usage; a stream of
 * message_start, content_block_* and message_delta / message_stop events). Errors on these
 * routes come in Anthropic's envelope. */
#ifndef TS_SERVE_MESSAGES_H
#define TS_SERVE_MESSAGES_H

#include "serve/job.h"
#include "serve/respond.h"

#include <jansson.h>

/* A Messages request read: the chat request body it means (owned), and for each chat message
 * the request's message it came from (-1: the system prompt), to name it in chat's errors. */
typedef struct {
    json_t *chat;
    int *from;
    int n_from, cap_from;
} serve_msg_read;

void serve_msg_read_free(serve_msg_read *rd);

/* Reads a Messages request body (count: /v1/messages/count_tokens, which has no max_tokens).
 * False with e set for what the translation refuses; chat's checks come after, on rd->chat. */
bool serve_msg_request(const json_t *body, bool count, serve_msg_read *rd, serve_error *e);

/* Rewrites a chat check's param and message into the Messages request's names (messages[i]
 * -> the request's message, stop -> stop_sequences, tools[i].function.parameters ->
 * tools[i].input_schema, ...). */
void serve_msg_error(const serve_msg_read *rd, serve_error *e);

/* Anthropic's error envelope {"type": "error", "error": {"type", "message"}} (malloc'd). */
char *serve_msg_error_json(const serve_error *e);

/* The whole message for finished job j (its mutex held), as a JSON string. */
char *serve_msg_full(const serve_resp *r, const serve_job *j);

/* What a stream has sent: content blocks opened and the one open now. */
typedef struct {
    int n_blocks;
    int open; /* the channel of the open text or thinking block (SERVE_CH_*), -1 none */
} serve_msg_stream;

/* Stream events ("event: TYPE\ndata: {...}\n\n") appended to out. */
ts_status serve_msg_stream_start(const serve_resp *r, serve_msg_stream *s, const serve_job *j,
                                 ts_strbuf *out);
ts_status serve_msg_stream_text(serve_msg_stream *s, serve_channel ch, const char *text, size_t n,
                                ts_strbuf *out);
ts_status serve_msg_stream_tool(const serve_resp *r, serve_msg_stream *s, int call,
                                const char *text, size_t n, ts_strbuf *out);
/* After the job's last output: the open block closed, message_delta, message_stop. */
ts_status serve_msg_stream_finish(serve_msg_stream *s, const serve_job *j, ts_strbuf *out);
/* A failure after the stream started: an error event. */
ts_status serve_msg_stream_error(const serve_error *e, ts_strbuf *out);

#endif
