/* OpenAI response bodies: chat.completion, text_completion, their stream chunks, usage and
 * logprobs, built from a job's output. */
#ifndef TS_SERVE_RESPOND_H
#define TS_SERVE_RESPOND_H

#include <jansson.h>

#include "serve/job.h"
#include "serve/openai.h"

typedef struct {
    serve_api api;
    char id[48];
    long long created;
    const char *model;
    bool logprobs;
    bool token_ids;
    const ts_tokenizer *tok;
} serve_resp;

void serve_resp_init(serve_resp *r, serve_api api, const char *model, bool logprobs,
                     const ts_tokenizer *tok);

/* The whole non-streaming response (job finished, caller holds its mutex). */
char *serve_resp_full(const serve_resp *r, const serve_job *j);

/* Stream pieces, each "data: {...}\n\n" appended to out. */
ts_status serve_resp_chunk_role(const serve_resp *r, ts_strbuf *out);
/* A delta of one channel; lp/n_lp: the logprobs that go with it (may be 0). */
ts_status serve_resp_chunk_text(const serve_resp *r, serve_channel ch, const char *s, size_t n,
                                const serve_logprob *lp, int n_lp, ts_strbuf *out);
/* A delta with one complete tool call (index: its place among the answer's calls). */
ts_status serve_resp_chunk_tool(const serve_resp *r, int index, const char *s, size_t n,
                                const serve_logprob *lp, int n_lp, ts_strbuf *out);
/* Final chunk (empty delta + finish_reason), then the usage chunk when asked, then [DONE]. */
ts_status serve_resp_chunk_end(const serve_resp *r, const serve_job *j, bool include_usage,
                               const serve_logprob *lp, int n_lp, ts_strbuf *out);
/* An error event after the stream started, then [DONE]. */
ts_status serve_resp_chunk_error(const serve_error *e, ts_strbuf *out);

const char *serve_finish_name(serve_finish f);

#endif
