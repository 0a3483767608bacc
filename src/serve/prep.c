#include "serve/prep.h"

#include "serve/truncate.h"
#include "text/json_schema.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

bool serve_read_images(const serve_runtime *rt, const serve_request *r, serve_images *im,
                       serve_error *e) {
    for (int k = 0; k < r->n_images; k++) {
        const serve_image_data *d = &r->images[k];
        if (!rt->vision)
            return serve_fail(e, 400, "unsupported_feature", d->param, "%s: %s", d->param,
                              rt->vision_model ? "this device runs no vision tower"
                              : d->video       ? "this model takes no videos"
                                               : "this model takes no images");
        if (d->video && rt->vinfo.video_token < 0)
            return serve_fail(e, 400, "unsupported_feature", d->param,
                              "%s: this model takes no videos%s%s", d->param,
                              rt->vinfo.video_refused[0] ? ": " : "", rt->vinfo.video_refused);
        ts_status st =
            d->video ? serve_images_add_video(im, &rt->vinfo, r->video_fps, d->data, d->len)
                     : serve_images_add(im, &rt->vinfo, rt->image_max_pixels, d->data, d->len);
        if (st == TS_ERR_NOMEM)
            return serve_fail(e, 500, "internal_error", NULL, "%s: %s", d->param, ts_last_error());
        if (st != TS_OK)
            return serve_fail(e, 400, "invalid_value", d->param, "%s: %s", d->param,
                              ts_last_error());
    }
    return true;
}

/* "prompt i: " for messages about one prompt of several; "" otherwise. */
static const char *which_prompt(const serve_request *r, int prompt, char at[24]) {
    at[0] = 0;
    if (r->api == SERVE_API_COMPLETION && r->n_prompts > 1) snprintf(at, 24, "prompt %d: ", prompt);
    return at;
}

ts_chat_params serve_chat_params(const serve_request *r, const serve_images *im) {
    return (ts_chat_params){.add_generation_prompt = r->add_generation_prompt,
                            .enable_thinking = r->enable_thinking,
                            .tools_json = r->tools_json,
                            .image_tokens = im->tokens,
                            .n_images = im->n_images,
                            .videos = im->videos,
                            .n_videos = im->n_videos,
                            .continue_final = r->continue_final};
}

bool serve_chat_ids(const serve_runtime *rt, const serve_request *r, serve_images *im,
                    int32_t **ids, size_t *n, serve_error *e) {
    /* a chat format without tools of its own (Gemma 3's): the functions and the calls are
     * written in the list form (text/chat_gemma.c); an assistant's calls without tools would
     * be left out: refused, never dropped */
    if (!ts_tokenizer_chat_tools(rt->tok)) {
        for (int i = 0; !r->tools_json && i < r->n_msgs; i++)
            if (r->msgs[i].n_tool_calls > 0) {
                char param[48];
                snprintf(param, sizeof param, "messages[%d].tool_calls", i);
                return serve_fail(e, 400, "unsupported_feature", param,
                                  "%s: this model's chat format has tool calls only in a request "
                                  "that offers tools",
                                  param);
            }
    }
    if (!serve_read_images(rt, r, im, e)) return false;
    ts_chat_params cp = serve_chat_params(r, im);
    if (ts_chat_tokenize(rt->tok, r->msgs, r->n_msgs, &cp, ids, n) != TS_OK)
        return serve_fail(e, 400, "invalid_value", "messages", "%s", ts_last_error());
    return true;
}

/* Forced calls (tool_choice required or named) for a chat format without calls of its own:
 * the request's grammar, made for Qwen3.5's calls when it was read, becomes the list form's. */
static bool list_form_grammar(const serve_runtime *rt, serve_request *r, serve_error *e) {
    if (!r->tools_forced || r->tools_list_grammar || ts_tokenizer_chat_tools(rt->tok)) return true;
    ts_grammar *g = NULL;
    ts_status st = ts_grammar_tool_list(r->tools_json, r->tool_only, r->tools_parallel, &g);
    if (st == TS_ERR_NOMEM) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    if (st != TS_OK) return serve_fail(e, 400, "invalid_value", "tools", "%s", ts_last_error());
    ts_grammar_free(r->grammar);
    r->grammar = g;
    r->tools_list_grammar = true;
    return true;
}

static bool tokenize(const serve_runtime *rt, serve_request *r, int prompt, serve_images *im,
                     int32_t **ids, int *n, serve_error *e) {
    const serve_prompt *p = r->api == SERVE_API_CHAT ? NULL : &r->prompts[prompt];
    char at[24];
    which_prompt(r, prompt, at);
    size_t nn = 0;
    *ids = NULL;
    for (int i = 0; p && !p->text && i < p->n_ids; i++) /* a prompt of ids, framed or not */
        if (p->ids[i] >= rt->n_vocab)
            return serve_fail(e, 400, "invalid_value", "prompt",
                              "%sprompt[%d]: token id %d is not in the vocabulary of %d", at, i,
                              p->ids[i], rt->n_vocab);
    if (r->api == SERVE_API_CHAT) {
        if (!list_form_grammar(rt, r, e) || !serve_chat_ids(rt, r, im, ids, &nn, e)) return false;
        /* the most prompt tokens that leave the answer its room (the checks below) */
        long long room = r->max_tokens >= 0 ? (long long)rt->n_ctx - r->max_tokens : rt->n_ctx - 1;
        if (r->truncate_auto && room > 0 && nn > (size_t)room &&
            !serve_truncate_turns(rt, r, im, (int)room, ids, &nn, e))
            return false;
    } else if (r->suffix) { /* the prompt is the text before a hole, the suffix after it */
        ts_status st = ts_tokenize_fim(rt->tok, p->text, p->text ? strlen(p->text) : 0,
                                       p->text ? NULL : p->ids, p->text ? 0 : (size_t)p->n_ids,
                                       r->suffix, strlen(r->suffix), ids, &nn);
        if (st == TS_ERR_UNSUPPORTED)
            return serve_fail(e, 400, "unsupported_feature", "suffix", "suffix: %s",
                              ts_last_error());
        if (st != TS_OK)
            return serve_fail(e, 400, "invalid_value", "suffix", "%s%s", at, ts_last_error());
    } else if (p->text) {
        /* a raw prompt may spell control tokens on purpose (llama-server and vLLM do too) */
        if (ts_tokenize(rt->tok, p->text, strlen(p->text), true, ids, &nn) != TS_OK)
            return serve_fail(e, 400, "invalid_value", "prompt", "%s%s", at, ts_last_error());
    } else {
        nn = (size_t)p->n_ids;
        *ids = malloc((nn ? nn : 1) * sizeof **ids);
        if (!*ids) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
        memcpy(*ids, p->ids, nn * sizeof **ids);
    }
    if (nn > (size_t)INT32_MAX / 2) nn = (size_t)INT32_MAX / 2; /* caught by the context check */
    *n = (int)nn;
    if (nn == 0)
        return serve_fail(e, 400, "invalid_value", r->api == SERVE_API_CHAT ? "messages" : "prompt",
                          "%sthe prompt is empty", at);
    if (im->n && serve_images_bind(im, &rt->vinfo, *ids, *n) != TS_OK)
        return serve_fail(e, 400, "invalid_value", "messages", "%s", ts_last_error());
    return true;
}

bool serve_parse_stop(const json_t *stop, char **out, int *n, serve_error *e) {
    *n = 0;
    if (!stop || json_is_null(stop)) return true;
    const json_t *one[1] = {stop};
    size_t count = 1;
    if (json_is_array(stop)) {
        count = json_array_size(stop);
        if (count > SERVE_MAX_STOPS)
            return serve_fail(e, 400, "invalid_stop", "stop", "at most %d stop sequences, not %zu",
                              SERVE_MAX_STOPS, count);
    } else if (!json_is_string(stop)) {
        return serve_fail(e, 400, "invalid_stop", "stop", "'stop' must be a string or a list of "
                          "strings");
    }
    for (size_t i = 0; i < count; i++) {
        const json_t *s = json_is_array(stop) ? json_array_get(stop, i) : one[0];
        if (!json_is_string(s))
            return serve_fail(e, 400, "invalid_stop", "stop", "stop[%zu] must be a string", i);
        if (json_string_length(s) == 0)
            return serve_fail(e, 400, "invalid_stop", "stop", "stop[%zu] is empty", i);
        if (json_string_length(s) > 1024)
            return serve_fail(e, 400, "invalid_stop", "stop", "stop[%zu] is longer than 1024 "
                              "bytes", i);
        out[*n] = strdup(json_string_value(s));
        if (!out[*n]) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
        (*n)++;
    }
    return true;
}

static uint64_t random_seed(void) {
    static _Atomic uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t z = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ (counter++ << 48);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    return z ^ (z >> 31);
}

/* An echo's text, made valid UTF-8 here once (ill-formed bytes as U+FFFD, as the answer's
 * text shows them): the prompt's text, or for token ids their text - a token the tokenizer
 * cannot decode (a model's vocabulary may be larger) shows nothing. False without memory. */
static bool echo_text(const serve_runtime *rt, const serve_prompt *p, serve_job *j) {
    ts_strbuf raw = {0}, b = {0};
    ts_status st = TS_OK;
    char *whole = NULL;
    size_t n = 0;
    if (p->text) {
        st = ts_strbuf_append(&raw, p->text, strlen(p->text));
    } else if (ts_detokenize(rt->tok, j->ids, (size_t)j->n_ids, false, &whole, &n) == TS_OK) {
        st = ts_strbuf_append(&raw, whole, n);
    } else { /* a token it cannot decode: the others, one by one */
        for (int i = 0; i < j->n_ids && st == TS_OK; i++) {
            char *t = NULL;
            size_t len = 0;
            if (ts_detokenize(rt->tok, &j->ids[i], 1, false, &t, &len) == TS_OK)
                st = ts_strbuf_append(&raw, t, len);
            free(t);
        }
    }
    if (st == TS_OK) st = ts_utf8_append_lossy(&b, raw.data ? raw.data : "", raw.len);
    if (st == TS_OK) st = ts_strbuf_append(&b, "", 0); /* never NULL */
    ts_strbuf_free(&raw);
    free(whole);
    if (st != TS_OK) {
        ts_strbuf_free(&b);
        return false;
    }
    j->echo_text = b.data, j->echo_len = b.len;
    return true;
}

/* A fill in the middle (unless ignore_eos) also ends where a model trained on repositories
 * ends a middle: <|fim_pad|>, <|repo_name|>, <|file_sep|> (llama.cpp ends every answer there). */
static void end_ids(const serve_runtime *rt, const serve_request *r, serve_job *j) {
    ts_fim_tokens f;
    if (!r->suffix || r->ignore_eos || !ts_tokenizer_fim(rt->tok, &f)) return;
    int32_t all[3] = {f.pad, f.repo, f.file_sep};
    for (int i = 0; i < 3; i++)
        if (all[i] >= 0 && !ts_tokenizer_is_eog(rt->tok, all[i]))
            j->end_ids[j->n_end_ids++] = all[i];
}

/* The thinking budget - the request's thinking_token_budget, else the one its
 * reasoning_effort gives (--reasoning-effort-budgets), else the server's --reasoning-budget -
 * and what ends the thinking when it runs out: the server's message, tokenized as text, then
 * </think>. A model without the tags has no thinking to bound. False without memory (or a
 * message the tokenizer refuses). */
static bool think_budget(const serve_runtime *rt, const serve_request *r, const serve_prep_opts *po,
                         serve_job *j) {
    int b = r->think_budget;
    if (b == SERVE_THINK_BUDGET_UNSET && r->effort >= 0 && po->effort_budget)
        b = po->effort_budget[r->effort];
    if (b == SERVE_THINK_BUDGET_UNSET) b = po->reasoning_budget;
    if (b < 0 || rt->think_open < 0 || rt->think_close < 0) return true;
    const char *m = po->reasoning_message ? po->reasoning_message : "";
    int32_t *ids = NULL;
    size_t n = 0;
    if (*m && ts_tokenize(rt->tok, m, strlen(m), false, &ids, &n) != TS_OK) return false;
    int32_t *all = realloc(ids, (n + 1) * sizeof *all);
    if (!all) {
        free(ids);
        return false;
    }
    all[n] = rt->think_close;
    j->think_end = all;
    j->n_think_end = (int)n + 1;
    j->think_budget = b;
    return true;
}

bool serve_prepare(const serve_runtime *rt, serve_request *r, int prompt, int choice,
                   const serve_prep_opts *po, serve_job *j, serve_error *e) {
    int max_tokens_cap = po->max_tokens_cap;
    int n = 0;
    char at[24];
    int32_t top_id = r->n_logit_bias ? r->logit_bias[r->n_logit_bias - 1].id : -1; /* sorted */
    if (top_id >= rt->n_vocab)
        return serve_fail(e, 400, "invalid_value", "logit_bias",
                          "logit_bias: token id %d is not in the vocabulary of %d", top_id,
                          rt->n_vocab);
    if (!tokenize(rt, r, prompt, &j->images, &j->ids, &n, e)) return false;
    j->n_ids = n;
    const char *mt = r->api == SERVE_API_CHAT && !json_object_get(r->root, "max_tokens")
                         ? "max_completion_tokens"
                         : "max_tokens";
    if (r->max_tokens >= 0) {
        if ((long long)n + r->max_tokens > rt->n_ctx)
            return serve_fail(e, 400, "context_length_exceeded", mt,
                              "%sthis model's maximum context length is %d tokens, but %d tokens "
                              "were requested (%d in the prompt, %d for the completion); "
                              "shorten the prompt or lower %s",
                              which_prompt(r, prompt, at), rt->n_ctx, n + r->max_tokens, n,
                              r->max_tokens, mt);
        j->max_tokens = r->max_tokens;
    } else {
        if (n >= rt->n_ctx)
            return serve_fail(e, 400, "context_length_exceeded",
                              r->api == SERVE_API_CHAT ? "messages" : "prompt",
                              "%sthis model's maximum context length is "
                              "%d tokens, but the prompt has %d tokens and leaves no room for "
                              "a completion",
                              which_prompt(r, prompt, at), rt->n_ctx, n);
        /* OpenAI's default for completions is 16; a chat answer may use the rest */
        int room = rt->n_ctx - n;
        j->max_tokens = r->api == SERVE_API_COMPLETION ? (room < 16 ? room : 16) : room;
        if (max_tokens_cap > 0 && j->max_tokens > max_tokens_cap) j->max_tokens = max_tokens_cap;
    }
    if (!serve_parse_stop(r->stop, j->stops, &j->n_stops, e)) return false;
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] >= rt->n_vocab)
            return serve_fail(e, 400, "invalid_value", "stop_token_ids",
                              "stop_token_ids: token id %d is not in the vocabulary of %d",
                              r->stop_ids[i], rt->n_vocab);
    if (r->min_tokens > j->max_tokens)
        return serve_fail(e, 400, "invalid_value", "min_tokens",
                          "min_tokens (%d) is more than the answer may have (max_tokens %d)",
                          r->min_tokens, j->max_tokens);
    /* a grammar may allow nothing but its end, which min_tokens would ban */
    if (r->min_tokens > 0 && r->grammar)
        return serve_fail(e, 400, "unsupported_feature", "min_tokens",
                          "min_tokens cannot be combined with a response format, a grammar or "
                          "forced tool calls");
    if (r->n_stop_ids) {
        if (!(j->stop_ids = malloc((size_t)r->n_stop_ids * sizeof *j->stop_ids)))
            return serve_fail(e, 500, "internal_error", NULL, "out of memory");
        memcpy(j->stop_ids, r->stop_ids, (size_t)r->n_stop_ids * sizeof *j->stop_ids);
        j->n_stop_ids = r->n_stop_ids;
    }
    end_ids(rt, r, j);
    j->min_tokens = r->min_tokens;
    j->keep_stop = r->include_stop;
    if (r->prediction) { /* text as the answer would be: control tokens are not spelled */
        size_t np = 0;
        if (ts_tokenize(rt->tok, r->prediction, strlen(r->prediction), false, &j->pred_ids, &np) !=
            TS_OK)
            return serve_fail(e, 400, "invalid_value", "prediction", "prediction: %s",
                              ts_last_error());
        j->n_pred = (int)np;
    }

    j->sp = r->sp;
    j->sp.seed = r->has_seed ? r->sp.seed + (uint64_t)choice : random_seed();
    j->presence_penalty = r->presence_penalty;
    j->frequency_penalty = r->frequency_penalty;
    j->repetition_penalty = r->repetition_penalty;
    if (r->n_logit_bias) {
        j->bias = malloc((size_t)r->n_logit_bias * sizeof *j->bias);
        if (!j->bias) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
        memcpy(j->bias, r->logit_bias, (size_t)r->n_logit_bias * sizeof *j->bias);
        j->n_bias = r->n_logit_bias;
    }
    j->top_logprobs = r->top_logprobs;
    j->ignore_eos = r->ignore_eos;
    /* thinking is open when the prompt's last <think> is after its last </think> */
    int last_open = -1, last_close = -1;
    for (int i = 0; i < n; i++) {
        if (j->ids[i] == rt->think_open) last_open = i;
        if (j->ids[i] == rt->think_close) last_close = i;
    }
    j->in_think = rt->think_open >= 0 && last_open > last_close;
    j->reasoning_inline = r->reasoning_inline == 1;
    if (!think_budget(rt, r, po, j))
        return serve_fail(e, 500, "internal_error", NULL, "the thinking budget's end: %s",
                          ts_last_error());
    j->parse_tools = r->parse_tools;
    if (r->api == SERVE_API_COMPLETION && r->echo) { /* the prompt's text as the client gets it */
        if (!echo_text(rt, &r->prompts[prompt], j))
            return serve_fail(e, 500, "internal_error", NULL, "out of memory");
        if (r->top_logprobs >= 0 && !(j->prompt_lp = calloc((size_t)n, sizeof *j->prompt_lp)))
            return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    }
    return true;
}
