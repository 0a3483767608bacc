#include "serve/respond.h"

#include "base/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *serve_finish_name(serve_finish f) {
    return f == SERVE_FINISH_STOP ? "stop" : f == SERVE_FINISH_LENGTH ? "length" : "error";
}

void serve_resp_init(serve_resp *r, serve_api api, const char *model, bool logprobs,
                     const ts_tokenizer *tok) {
    static _Atomic uint64_t counter;
    uint64_t z = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ULL + ++counter * 0xBF58476D1CE4E5B9ULL;
    z ^= z >> 29;
    z *= 0x94D049BB133111EBULL;
    z ^= z >> 32;
    *r = (serve_resp){0}; /* every wire's field off, settings and the rest NULL */
    r->api = api;
    snprintf(r->id, sizeof r->id, "%s-%016llx%08llx", api == SERVE_API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)z, (unsigned long long)(counter & 0xffffffffu));
    r->created = (long long)time(NULL);
    r->model = model;
    r->logprobs = logprobs;
    r->tok = tok;
    r->think_open = r->think_close = -1;
    r->reasoning_fields = SERVE_REASONING_CONTENT | SERVE_REASONING_FIELD;
}

/* "tool_calls" when the answer ended after the model called tools. */
/* vLLM's stop_reason: the stop string or stop token id that ended the answer, else null. */
static json_t *stop_reason(const serve_job *j) {
    if (j->finish != SERVE_FINISH_STOP) return json_null();
    if (j->stop_str >= 0 && j->stop_str < j->n_stops) return json_string(j->stops[j->stop_str]);
    if (j->stop_token >= 0) return json_integer(j->stop_token);
    return json_null();
}

static const char *finish_reason(const serve_job *j) {
    if (j->finish == SERVE_FINISH_STOP)
        for (int i = 0; i < j->n_seg; i++)
            if (j->seg[i].ch == SERVE_CH_TOOL) return "tool_calls";
    return serve_finish_name(j->finish);
}

/* One OpenAI tool call from its segment text {"name", "arguments"}; index < 0: no "index". */
static json_t *tool_call_json(const serve_resp *r, int index, const char *s, size_t n) {
    json_t *c = json_loadb(s, n, 0, NULL);
    const char *hex = strchr(r->id, '-');
    char id[64];
    snprintf(id, sizeof id, "call_%s%d", hex ? hex + 1 : r->id, index < 0 ? -index - 1 : index);
    json_t *out = json_pack("{s:s, s:s, s:{s:O, s:O}}", "id", id, "type", "function", "function",
                            "name", json_object_get(c, "name"), "arguments",
                            json_object_get(c, "arguments"));
    json_decref(c);
    if (out && index >= 0) json_object_set_new(out, "index", json_integer(index));
    return out;
}

/* The usage of a request's jobs: each prompt's tokens once, the answers' tokens all. A prompt's
 * cached tokens are its answers' fewest: the one that prefilled it (the others start from its
 * state), whatever order best_of put them in. */
static json_t *usage_json(serve_job *const *jobs, int n, int per_prompt) {
    long long prompt = 0, cached = 0, completion = 0;
    for (int i = 0; i < n; i += per_prompt) {
        int fewest = jobs[i]->cached_tokens;
        for (int k = 1; k < per_prompt; k++)
            if (jobs[i + k]->cached_tokens < fewest) fewest = jobs[i + k]->cached_tokens;
        prompt += jobs[i]->prompt_tokens;
        cached += fewest;
    }
    long long accepted = 0, rejected = 0;
    bool guessed = false; /* a prediction, or guesses by prompt lookup */
    for (int i = 0; i < n; i++) {
        completion += jobs[i]->completion_tokens;
        accepted += jobs[i]->draft_accepted;
        rejected += jobs[i]->draft_rejected;
        guessed |= jobs[i]->pred_ids != NULL || jobs[i]->draft_accepted + jobs[i]->draft_rejected;
    }
    json_t *u = json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)prompt,
                          "completion_tokens", (json_int_t)completion, "total_tokens",
                          (json_int_t)(prompt + completion), "prompt_tokens_details",
                          "cached_tokens", (json_int_t)cached);
    /* OpenAI's counts of Predicted Outputs: guessed tokens the answer took, and those it did
     * not (the guesses are part of no answer's count) */
    if (u && guessed)
        json_object_set_new(u, "completion_tokens_details",
                            json_pack("{s:I, s:I}", "accepted_prediction_tokens",
                                      (json_int_t)accepted, "rejected_prediction_tokens",
                                      (json_int_t)rejected));
    return u;
}

/* A token as log-probabilities show it: its bytes as text (a part of a character as U+FFFD)
 * and, as OpenAI's `bytes`, the bytes themselves, so that a client can join the tokens that
 * split a character. */
static void token_text(const serve_resp *r, int32_t id, json_t **str, json_t **bytes) {
    size_t n = 0;
    const char *t = ts_tokenizer_token_bytes(r->tok, id, &n);
    if (!t) n = 0;
    ts_strbuf b = {0};
    ts_utf8_append_lossy(&b, t ? t : "", n);
    *str = json_stringn(b.data ? b.data : "", b.len);
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; i < n; i++) json_array_append_new(*bytes, json_integer((unsigned char)t[i]));
    }
    ts_strbuf_free(&b);
}

/* One token's entries of a completion's logprobs; lp NULL: the prompt's first token, which
 * has none (null, as OpenAI and vLLM give it), of id first. */
static void completion_logprob(const serve_resp *r, const serve_logprob *lp, int32_t first,
                               json_t *tokens, json_t *lps, json_t *tops) {
    json_t *s;
    token_text(r, lp ? lp->id : first, &s, NULL);
    json_array_append_new(tokens, s);
    if (!lp) {
        json_array_append_new(lps, json_null());
        json_array_append_new(tops, json_null());
        return;
    }
    json_t *top = json_object();
    json_array_append_new(lps, json_real(lp->logprob));
    for (int k = 0; k < lp->n_top; k++) {
        json_t *ts;
        token_text(r, lp->top_id[k], &ts, NULL);
        json_object_set_new(top, json_string_value(ts), json_real(lp->top_lp[k]));
        json_decref(ts);
    }
    json_array_append_new(tops, top);
}

/* A completion's logprobs: the echoed prompt's n_prompt tokens (its first with none), then the
 * answer's n. */
static json_t *completion_logprobs(const serve_resp *r, const serve_job *echo, int n_prompt,
                                   const serve_logprob *lp, int n) {
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array();
    for (int i = 0; i < n_prompt; i++)
        completion_logprob(r, i ? &echo->prompt_lp[i] : NULL, echo->ids[0], tokens, lps, tops);
    for (int i = 0; i < n; i++)
        completion_logprob(r, &lp[i], 0, tokens, lps, tops);
    return json_pack("{s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs",
                     tops);
}

json_t *serve_resp_logprob_list(const serve_resp *r, const serve_logprob *lp, int n) {
    json_t *content = json_array();
    for (int i = 0; i < n; i++) {
        json_t *s, *b, *top = json_array();
        for (int k = 0; k < lp[i].n_top; k++) {
            json_t *ts, *tb;
            token_text(r, lp[i].top_id[k], &ts, &tb);
            json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token", ts, "logprob",
                                                 (double)lp[i].top_lp[k], "bytes", tb));
        }
        token_text(r, lp[i].id, &s, &b);
        json_array_append_new(content,
                              json_pack("{s:o, s:f, s:o, s:o}", "token", s, "logprob",
                                        (double)lp[i].logprob, "bytes", b, "top_logprobs", top));
    }
    return content;
}

static json_t *logprobs_json(const serve_resp *r, const serve_logprob *lp, int n) {
    if (r->api == SERVE_API_CHAT)
        return json_pack("{s:o}", "content", serve_resp_logprob_list(r, lp, n));
    return completion_logprobs(r, NULL, 0, lp, n);
}

/* The thinking's text in the fields the server gives it (--reasoning-field): a message's or
 * a delta's. */
static void put_reasoning(const serve_resp *r, json_t *obj, const char *s, size_t n) {
    if (r->reasoning_fields & SERVE_REASONING_CONTENT)
        json_object_set_new(obj, "reasoning_content", json_stringn(s, n));
    if (r->reasoning_fields & SERVE_REASONING_FIELD)
        json_object_set_new(obj, "reasoning", json_stringn(s, n));
}

/* Job j's choice of a non-streaming response, at index. */
static json_t *choice_json(const serve_resp *r, const serve_job *j, int index) {
    ts_strbuf text[2] = {{0}, {0}};
    json_t *calls = json_array();
    if (j->echo_text) ts_strbuf_append(&text[0], j->echo_text, j->echo_len); /* a completion's */
    for (int i = 0; i < j->n_seg; i++) {
        const char *p = j->text.data + j->seg[i].off;
        if (j->seg[i].ch == SERVE_CH_TOOL)
            json_array_append_new(calls, tool_call_json(r, -(int)json_array_size(calls) - 1, p,
                                                        j->seg[i].len));
        else
            ts_strbuf_append(&text[j->seg[i].ch], p, j->seg[i].len);
    }
    json_t *lp = !r->logprobs   ? json_null()
                 : j->prompt_lp ? completion_logprobs(r, j, j->n_ids, j->lp, j->n_lp)
                                : logprobs_json(r, j->lp, j->n_lp);
    json_t *choice;
    if (r->api == SERVE_API_CHAT) {
        /* OpenAI: content is null when the answer is only tool calls */
        json_t *content = text[0].len || !json_array_size(calls)
                              ? json_stringn(text[0].data ? text[0].data : "", text[0].len)
                              : json_null();
        json_t *msg = json_pack("{s:s, s:o}", "role", "assistant", "content", content);
        if (text[1].len) put_reasoning(r, msg, text[1].data, text[1].len);
        if (json_array_size(calls)) json_object_set(msg, "tool_calls", calls);
        choice = json_pack("{s:i, s:o, s:o, s:s}", "index", index, "message", msg, "logprobs", lp,
                           "finish_reason", finish_reason(j));
    } else {
        choice = json_pack("{s:i, s:s%, s:o, s:s}", "index", index, "text",
                           text[0].data ? text[0].data : "", text[0].len, "logprobs", lp,
                           "finish_reason", serve_finish_name(j->finish));
    }
    if (choice) json_object_set_new(choice, "stop_reason", stop_reason(j));
    if (r->token_ids && choice) {
        json_t *ids = json_array();
        for (int i = 0; i < j->completion_tokens; i++)
            json_array_append_new(ids, json_integer(j->out_ids[i]));
        json_object_set_new(choice, "token_ids", ids);
    }
    json_decref(calls);
    ts_strbuf_free(&text[0]);
    ts_strbuf_free(&text[1]);
    return choice;
}

json_t *serve_job_timings(const serve_job *j) {
    int pn = j->prompt_tokens - j->cached_tokens, gn = j->completion_tokens;
    double first = j->t_first_token > 0 ? j->t_first_token : j->t_done;
    double pms = (first - j->t_submit) * 1e3, gms = (j->t_done - first) * 1e3;
    return json_pack("{s:i, s:f, s:f, s:f, s:i, s:f, s:f, s:f}", "prompt_n", pn, "prompt_ms", pms,
                     "prompt_per_token_ms", pn ? pms / pn : 0.0, "prompt_per_second",
                     pms > 0 ? pn * 1e3 / pms : 0.0, "predicted_n", gn, "predicted_ms", gms,
                     "predicted_per_token_ms", gn ? gms / gn : 0.0, "predicted_per_second",
                     gms > 0 ? gn * 1e3 / gms : 0.0);
}

char *serve_resp_full(const serve_resp *r, serve_job *const *jobs, int n, int per_prompt,
                      int keep) {
    json_t *choices = json_array();
    for (int p = 0; p < n / per_prompt; p++)
        for (int k = 0; k < keep; k++)
            json_array_append_new(choices, choice_json(r, jobs[p * per_prompt + k], p * keep + k));
    json_t *root = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", r->id, "object",
                             r->api == SERVE_API_CHAT ? "chat.completion" : "text_completion",
                             "created", (json_int_t)r->created, "model", r->model, "choices",
                             choices, "usage", usage_json(jobs, n, per_prompt));
    if (root && n > 0) json_object_set_new(root, "timings", serve_job_timings(jobs[0]));
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return s;
}

/* The id's hex: what follows its prefix ("chatcmpl-", "resp_", "msg_"). */
static const char *id_hex(const serve_resp *r) {
    size_t n = strcspn(r->id, "-_");
    return r->id[n] ? r->id + n + 1 : r->id;
}

void serve_resp_set_id_prefix(serve_resp *r, const char *prefix) {
    char id[sizeof r->id];
    /* the prefixes are as short as chat's: the id fits (cut at worst) */
    if (snprintf(id, sizeof id, "%s_%s", prefix, id_hex(r)) < 0) return;
    memcpy(r->id, id, sizeof id);
}

json_t *serve_resp_part_id(const serve_resp *r, const char *kind, int k) {
    char id[96];
    snprintf(id, sizeof id, "%s_%s_%d", kind, id_hex(r), k);
    return json_string(id);
}

ts_status serve_sse_event(ts_strbuf *out, const char *type, json_t *v) {
    if (!v) return TS_ERR_NOMEM;
    json_object_set_new(v, "type", json_string(type));
    ts_status st = ts_strbuf_append(out, "event: ", 7);
    if (st == TS_OK) st = ts_strbuf_append(out, type, strlen(type));
    if (st == TS_OK) st = ts_strbuf_append(out, "\n", 1);
    if (st != TS_OK) {
        json_decref(v);
        return st;
    }
    return serve_sse_data(out, v);
}

ts_status serve_sse_data(ts_strbuf *out, json_t *v) {
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    if (!s) return TS_ERR_NOMEM;
    ts_status st = ts_strbuf_append(out, "data: ", 6);
    if (st == TS_OK) st = ts_strbuf_append(out, s, strlen(s));
    if (st == TS_OK) st = ts_strbuf_append(out, "\n\n", 2);
    free(s);
    return st;
}

static json_t *chunk(const serve_resp *r, json_t *choice) {
    return json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", r->id, "object",
                     r->api == SERVE_API_CHAT ? "chat.completion.chunk" : "text_completion",
                     "created", (json_int_t)r->created, "model", r->model, "choices", choice);
}

ts_status serve_resp_chunk_role(const serve_resp *r, int index, ts_strbuf *out) {
    if (r->api != SERVE_API_CHAT) return TS_OK;
    return serve_sse_data(
        out, chunk(r, json_pack("{s:i, s:{s:s, s:s}, s:n, s:n}", "index", index, "delta", "role",
                                "assistant", "content", "", "logprobs", "finish_reason")));
}

ts_status serve_resp_chunk_text(const serve_resp *r, int index, serve_channel ch, const char *s,
                                size_t n, const serve_logprob *lp, int n_lp, ts_strbuf *out) {
    json_t *lpj = r->logprobs && n_lp ? logprobs_json(r, lp, n_lp) : json_null();
    json_t *choice;
    if (r->api == SERVE_API_CHAT && ch == SERVE_CH_REASONING) {
        json_t *d = json_object();
        if (d) put_reasoning(r, d, s, n);
        choice = json_pack("{s:i, s:o, s:o, s:n}", "index", index, "delta", d, "logprobs", lpj,
                           "finish_reason");
    } else if (r->api == SERVE_API_CHAT)
        choice = json_pack("{s:i, s:{s:s%}, s:o, s:n}", "index", index, "delta", "content", s, n,
                           "logprobs", lpj, "finish_reason");
    else
        choice = json_pack("{s:i, s:s%, s:o, s:n}", "index", index, "text", s, n, "logprobs", lpj,
                           "finish_reason");
    return serve_sse_data(out, chunk(r, choice));
}

ts_status serve_resp_chunk_echo(const serve_resp *r, int index, const serve_job *j,
                                ts_strbuf *out) {
    json_t *lpj =
        r->logprobs && j->prompt_lp ? completion_logprobs(r, j, j->n_ids, NULL, 0) : json_null();
    json_t *choice = json_pack("{s:i, s:s%, s:o, s:n}", "index", index, "text", j->echo_text,
                               j->echo_len, "logprobs", lpj, "finish_reason");
    return serve_sse_data(out, chunk(r, choice));
}

ts_status serve_resp_chunk_tool(const serve_resp *r, int index, int call, const char *s, size_t n,
                                const serve_logprob *lp, int n_lp, ts_strbuf *out) {
    json_t *lpj = r->logprobs && n_lp ? logprobs_json(r, lp, n_lp) : json_null();
    json_t *choice = json_pack("{s:i, s:{s:[o]}, s:o, s:n}", "index", index, "delta", "tool_calls",
                               tool_call_json(r, call, s, n), "logprobs", lpj, "finish_reason");
    return serve_sse_data(out, chunk(r, choice));
}

ts_status serve_resp_chunk_finish(const serve_resp *r, int index, const serve_job *j,
                                  const serve_logprob *lp, int n_lp, ts_strbuf *out) {
    json_t *lpj = r->logprobs && n_lp ? logprobs_json(r, lp, n_lp) : json_null();
    json_t *choice;
    if (r->api == SERVE_API_CHAT)
        choice = json_pack("{s:i, s:{}, s:o, s:s}", "index", index, "delta", "logprobs", lpj,
                           "finish_reason", finish_reason(j));
    else
        choice = json_pack("{s:i, s:s, s:o, s:s}", "index", index, "text", "", "logprobs", lpj,
                           "finish_reason", serve_finish_name(j->finish));
    if (choice) json_object_set_new(choice, "stop_reason", stop_reason(j));
    json_t *c = chunk(r, choice);
    if (c) json_object_set_new(c, "timings", serve_job_timings(j));
    return serve_sse_data(out, c);
}

ts_status serve_resp_chunk_done(const serve_resp *r, serve_job *const *jobs, int n, int per_prompt,
                                bool include_usage, ts_strbuf *out) {
    if (include_usage) {
        json_t *u =
            json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", r->id, "object",
                      r->api == SERVE_API_CHAT ? "chat.completion.chunk" : "text_completion",
                      "created", (json_int_t)r->created, "model", r->model, "choices", "usage",
                      usage_json(jobs, n, per_prompt));
        TS_TRY(serve_sse_data(out, u));
    }
    return ts_strbuf_append(out, "data: [DONE]\n\n", 14);
}

ts_status serve_resp_chunk_error(const serve_error *e, ts_strbuf *out) {
    char *s = serve_error_json(e);
    if (!s) return TS_ERR_NOMEM;
    ts_status st = ts_strbuf_append(out, "data: ", 6);
    if (st == TS_OK) st = ts_strbuf_append(out, s, strlen(s));
    if (st == TS_OK) st = ts_strbuf_append(out, "\n\ndata: [DONE]\n\n", 16);
    free(s);
    return st;
}
