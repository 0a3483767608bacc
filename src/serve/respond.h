/* OpenAI response bodies: chat.completion, text_completion, their stream chunks, usage and
 * logprobs, built from a job's output. */
#ifndef TS_SERVE_RESPOND_H
#define TS_SERVE_RESPOND_H

#include "serve/job.h"
#include "serve/openai.h"
#include "serve/serve.h"

#include <jansson.h>

typedef struct {
    serve_api api;
    char id[48];
    long long created;
    const char *model;
    bool logprobs;
    bool token_ids;
    const ts_tokenizer *tok;
    /* the Responses API (serve/responses.h): its request's settings the answer echoes (owned;
     * NULL for chat and completions), and the thinking's tags, whose span it counts */
    json_t *settings;
    int32_t think_open, think_close;
    /* the conversation to keep with the answer (owned; NULL: not stored), the request's input
     * items to keep with it (owned), and the store */
    json_t *conversation, *input;
    struct serve_rsp_store *store;
    bool infill;   /* llama-server's /infill (serve/infill.h): its own answer's shape */
    bool messages; /* the Anthropic Messages API (serve/messages.h): its own answer's shape */
    /* the chat fields the thinking goes in (SERVE_REASONING_*): llama-server's and DeepSeek's
     * reasoning_content, vLLM's and OpenRouter's reasoning, or both (the default) */
    int reasoning_fields;
} serve_resp;

void serve_resp_init(serve_resp *r, serve_api api, const char *model, bool logprobs,
                     const ts_tokenizer *tok);

/* The answer's id in another API's form, PREFIX_<the id's hex> (resp_..., msg_...). */
void serve_resp_set_id_prefix(serve_resp *r, const char *prefix);
/* An id made from the answer's, KIND_<its hex>_K: a Responses output item's, a Messages
 * tool_use block's (k: its place in the answer), the same in a stream and in the whole. */
json_t *serve_resp_part_id(const serve_resp *r, const char *kind, int k);

/* The whole non-streaming response from n jobs (all finished, the caller holds their mutexes),
 * per_prompt of them a prompt (whose prompt the usage counts once). Of each prompt's jobs the
 * first keep are its choices: choice p * keep + k is job p * per_prompt + k. The usage counts
 * every job's answer. */
char *serve_resp_full(const serve_resp *r, serve_job *const *jobs, int n, int per_prompt, int keep);

/* llama-server's timings of an answer (its prompt's prefill and its decoding: counts, ms,
 * per token, per second), which its clients show: in /infill's and /completion's answers, and
 * in a chat or completion's (of its first choice; a stream's in each choice's final chunk). */
json_t *serve_job_timings(const serve_job *j);

/* Stream pieces, each "data: {...}\n\n" appended to out; index: the choice. */
ts_status serve_resp_chunk_role(const serve_resp *r, int index, ts_strbuf *out);
/* A delta of one channel; lp/n_lp: the logprobs that go with it (may be 0). */
ts_status serve_resp_chunk_text(const serve_resp *r, int index, serve_channel ch, const char *s,
                                size_t n, const serve_logprob *lp, int n_lp, ts_strbuf *out);
/* A completion's echo: its prompt's text, with logprobs the prompt tokens' (the first null). */
ts_status serve_resp_chunk_echo(const serve_resp *r, int index, const serve_job *j, ts_strbuf *out);
/* A delta with one complete tool call (call: its place among the answer's calls). */
ts_status serve_resp_chunk_tool(const serve_resp *r, int index, int call, const char *s, size_t n,
                                const serve_logprob *lp, int n_lp, ts_strbuf *out);
/* A choice's final chunk (empty delta + finish_reason). */
ts_status serve_resp_chunk_finish(const serve_resp *r, int index, const serve_job *j,
                                  const serve_logprob *lp, int n_lp, ts_strbuf *out);
/* After every choice's final chunk: the usage chunk when asked (as serve_resp_full's), then
 * [DONE]. */
ts_status serve_resp_chunk_done(const serve_resp *r, serve_job *const *jobs, int n, int per_prompt,
                                bool include_usage, ts_strbuf *out);
/* An error event after the stream started, then [DONE]. */
ts_status serve_resp_chunk_error(const serve_error *e, ts_strbuf *out);

const char *serve_finish_name(serve_finish f);

/* "data: " v "\n\n" appended to out (v's reference taken; NULL: out of memory). */
ts_status serve_sse_data(ts_strbuf *out, json_t *v);
/* A typed event, "event: TYPE\ndata: " v "\n\n", v given "type": TYPE (the Responses and
 * Messages APIs' streams; v's reference taken, NULL: out of memory). */
ts_status serve_sse_event(ts_strbuf *out, const char *type, json_t *v);

/* Chat's log-probability entries ({token, logprob, bytes, top_logprobs}) of n tokens, a list. */
json_t *serve_resp_logprob_list(const serve_resp *r, const serve_logprob *lp, int n);

#endif
