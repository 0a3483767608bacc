/* Generated tokens -> the text a client sees, in two channels.
 *
 * Text between <think> and </think> is reasoning (reasoning_content), the rest is content. The
 * tags are recognised by token id, so the tag text never reaches the client. Like the chat
 * template when it reads an answer back, the reasoning is trimmed of the newlines around it
 * and the content after </think> of the newlines in front. Stop strings are matched within
 * each channel (a stop never spans the tag) with undecided text held back (serve/stop.h). */
#ifndef TS_SERVE_TEXTOUT_H
#define TS_SERVE_TEXTOUT_H

#include "serve/stop.h"
#include "serve/toolcall.h"

/* SERVE_CH_TOOL: one segment per tool call, its text the call's JSON (serve/toolcall.h). */
typedef enum { SERVE_CH_CONTENT = 0, SERVE_CH_REASONING = 1, SERVE_CH_TOOL = 2 } serve_channel;

/* Receives decided text in order. */
typedef ts_status (*serve_text_sink)(void *ctx, serve_channel ch, const char *s, size_t n);

typedef struct {
    int32_t think_open, think_close; /* token ids, -1 when the tokenizer has none */
    serve_channel ch;
    bool started;      /* a non-newline byte was written to the current channel */
    bool strip_lead;   /* drop the current channel's leading newlines */
    size_t pending_nl; /* reasoning: trailing newlines not yet known to be inner */
    serve_stop stop;
    bool tools;               /* tool calls are parsed out of the content */
    serve_toolcall_filter tc; /* used when tools */
    ts_strbuf dec; /* scratch: text the stop matcher released */
    serve_text_sink sink;
    void *sink_ctx;
} serve_textout;

/* in_think: the prompt ended inside an open <think> block. stops are borrowed. */
void serve_textout_init(serve_textout *t, int32_t think_open, int32_t think_close, bool in_think,
                        char *const *stops, int n_stops, serve_text_sink sink, void *ctx);
void serve_textout_free(serve_textout *t);
/* Parses tool calls out of the content channel from now on (the request offered tools): in
 * the list form (serve_toolcall_parse_list) or in Qwen3.5's blocks. */
void serve_textout_enable_tools(serve_textout *t, bool list_form);

/* Feeds one generated token and its text (from the streaming detokenizer; may be empty).
 * *stopped is set when a stop string completed. */
ts_status serve_textout_token(serve_textout *t, int32_t id, const char *text, size_t len,
                              bool *stopped);
/* A stop string that completes is shown, not dropped (vLLM's include_stop_str_in_output). */
void serve_textout_keep_stops(serve_textout *t);
/* Stop strings are matched from the next token's text on (none were before: min_tokens). */
void serve_textout_start_stops(serve_textout *t, char *const *stops, int n_stops);
/* The generation ended without a stop string: releases what was held back. */
ts_status serve_textout_finish(serve_textout *t);

#endif
