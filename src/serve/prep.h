/* Preparation, on the HTTP thread before admission: render the chat -> tokenize the whole
 * prompt -> check prompt + max_tokens against the context window -> parse the stop strings.
 * Bound to the tokenizer and context size the worker published, so what is checked here is
 * exactly what will run. Nothing is truncated unless the request asks for it (the Responses
 * API's truncation "auto", serve/truncate.h): an over-long prompt is a 400. */
#ifndef TS_SERVE_PREP_H
#define TS_SERVE_PREP_H

#include "serve/job.h"
#include "serve/openai.h"
#include "serve/worker.h"

/* What the server's options add to every answer's preparation. */
typedef struct {
    int max_tokens_cap; /* bounds the default max_tokens of a chat request; 0 = none */
    /* --reasoning-budget: the thinking budget of a request that gives none (-1: no bound),
     * and --reasoning-budget-message: the text put in before </think> when a budget ends the
     * thinking (NULL or "": </think> alone) */
    int reasoning_budget;
    const char *reasoning_message;
    /* --reasoning-effort-budgets: the budget each reasoning_effort gives (by SERVE_EFFORT_*;
     * SERVE_THINK_BUDGET_UNSET: that effort gives none, the default budget holds) */
    const int *effort_budget;
} serve_prep_opts;

/* Fills the job's input from the request: the answer to its prompt number `prompt` (0 for a
 * chat; completions may carry several), choice `choice` of the request's n (its seed, when the
 * request gives one, is seed + choice). A chat that asks for truncation and is too long loses
 * its oldest turns here (r's messages and images; the later choices find it done). */
bool serve_prepare(const serve_runtime *rt, serve_request *r, int prompt, int choice,
                   const serve_prep_opts *po, serve_job *j, serve_error *e);

/* The request's images, decoded and planned into im (before the chat is rendered: each takes
 * the number of tokens its plan says); a 400 naming the part for a bad one, or for any image
 * when the model (or its device) takes none. */
bool serve_read_images(const serve_runtime *rt, const serve_request *r, serve_images *im,
                       serve_error *e);

/* A chat request's prompt ids (malloc'd), its images decoded and planned into im: rendered in
 * the model's chat format and tokenized, as its answer's prompt and /tokenize both take it.
 * Tools, or an assistant's tool calls, for a chat format without them (Gemma 3's) are a 400
 * unsupported_feature. */
bool serve_chat_ids(const serve_runtime *rt, const serve_request *r, serve_images *im,
                    int32_t **ids, size_t *n, serve_error *e);

/* How the request's chat is rendered (generation prompt, thinking, tools, continuing the final
 * message), with its images' token counts: for its prompt and for /tokenize alike. */
ts_chat_params serve_chat_params(const serve_request *r, const serve_images *im);

/* Stop strings: null, a string, or a list of at most SERVE_MAX_STOPS non-empty strings. */
bool serve_parse_stop(const json_t *stop, char **out, int *n, serve_error *e);

#endif
