/* The OpenAI request bodies: JSON -> a plain request struct, validated field by field in a
 * fixed order (the first failing check wins), and the error envelope. No engine here. */
#ifndef TS_SERVE_OPENAI_H
#define TS_SERVE_OPENAI_H

#include "serve/images.h"
#include "serve/serve.h"
#include "tessera.h"

#include <jansson.h>
#include <stdbool.h>

#define SERVE_MAX_JSON_DEPTH 64

typedef struct {
    int status;       /* HTTP status */
    const char *type; /* "invalid_request_error", ... */
    const char *code;
    char param[80]; /* "" = null */
    char message[384];
} serve_error;

/* Fills e and returns false, so validators can `return serve_fail(e, ...)`. */
bool serve_fail(serve_error *e, int status, const char *code, const char *param, const char *fmt,
                ...) __attribute__((format(printf, 5, 6)));

typedef enum { SERVE_API_CHAT, SERVE_API_COMPLETION } serve_api;

/* Images and videos a request carries (data: URLs, decoded from base64, or http(s) URLs
 * fetched by serve/fetch.c before preparation; the bytes are a PNG, JPEG or WebP file, or a
 * video file, read by preparation). At most SERVE_MAX_IMAGES a request. */
typedef struct {
    unsigned char *data; /* owned */
    size_t len;
    const char *url; /* an http(s) or file: URL still to read (borrowed from the request) */
    bool video;
    char param[96]; /* "messages[i].content[k]", for errors */
} serve_image_data;

/* One prompt of a completion request: text (borrowed) or token ids (owned). */
typedef struct {
    const char *text;
    size_t text_len; /* JSON strings may hold NUL characters */
    int32_t *ids;
    int n_ids;
} serve_prompt;

/* The request's "model", when given, is one of model_ids (NULL-terminated; an entry "*"
 * stands for any name: --any-model), else 404
 * model_not_found; *model the name given (borrowed from root), NULL without. */
bool serve_check_model(const json_t *root, const char *const *model_ids, const char **model,
                       serve_error *e);

/* Field name of root as prompts: a string, a list of token ids, or a list of up to max of
 * those (completions' prompt, embeddings' input); errors name the field. *out owned (free with
 * serve_prompts_free, also after a failure). */
bool serve_parse_prompts(const json_t *root, const char *name, int max, serve_prompt **out, int *n,
                         serve_error *e);
void serve_prompts_free(serve_prompt *p, int n);

/* The most token ids stop_token_ids may list. */
#define SERVE_MAX_STOP_IDS 64

/* The most prompts one completion request may carry, and the most choices (n) a prompt. */
#define SERVE_MAX_PROMPTS 128
#define SERVE_MAX_N       128

/* The sampling a request that leaves these fields out gets (OpenAI's defaults; top_k and
 * min_p 0 are off, the penalties neutral); GET /props tells them. */
#define SERVE_DEFAULT_TEMPERATURE        1.0
#define SERVE_DEFAULT_TOP_P              1.0
#define SERVE_DEFAULT_TOP_K              0
#define SERVE_DEFAULT_MIN_P              0.0
#define SERVE_DEFAULT_PRESENCE_PENALTY   0.0
#define SERVE_DEFAULT_FREQUENCY_PENALTY  0.0
#define SERVE_DEFAULT_REPETITION_PENALTY 1.0

/* The longest model name a request may give (what --any-model lets it name; an alias is no
 * longer either) */
#define SERVE_MAX_MODEL_NAME 255

typedef struct serve_request {
    serve_api api;
    json_t *root; /* owned; every string below is borrowed from it unless said otherwise */
    const char *model;
    /* llama-server's `lora` ([{"id", "scale"}]): given, and its n_lora entries (serve/lora.h) */
    bool lora_given;
    int n_lora;
    int lora_id[TS_MAX_LORA];
    float lora_scale[TS_MAX_LORA];
    bool stream, include_usage;
    int max_tokens; /* -1 = not given */
    ts_sampler_params sp;
    bool has_seed;
    float presence_penalty, frequency_penalty, repetition_penalty;
    ts_logit_adjust *logit_bias; /* owned; logit_bias sorted by id, the bias field alone set */
    int n_logit_bias;
    int top_logprobs; /* -1 = no logprobs */
    int enable_thinking;
    int effort; /* reasoning_effort: SERVE_EFFORT_NONE .. _HIGH, -1 not given */
    /* reasoning_format (llama-server's): -1 not given, 0 the thinking apart
     * (reasoning_content; "deepseek", "auto"), 1 left in the content as written ("none") */
    int reasoning_inline;
    /* chat (vLLM's fields): the prompt ends with the assistant's turn opened (true unless
     * continue_final), or continues the final message as transformers renders it */
    bool add_generation_prompt, continue_final;
    bool ignore_eos;
    bool return_token_ids; /* vLLM's extension: the prompt's and the answer's ids */
    /* vLLM's extensions: the answer's first min_tokens tokens cannot end it (end-of-generation
     * tokens and stop_token_ids banned, stop strings not matched); stop_token_ids end it */
    int min_tokens;
    /* vLLM's thinking_token_budget: the tokens the answer may think (between <think> and
     * </think>) before the server closes its thinking for it (serve/decode.c); -1 no bound,
     * SERVE_THINK_BUDGET_UNSET not given (the server's --reasoning-budget then) */
    int think_budget;
    bool include_stop; /* include_stop_str_in_output: a stop string that ends it is shown */
    int32_t *stop_ids; /* owned */
    int n_stop_ids;
    /* chat */
    ts_chat_message *msgs;
    int n_msgs;
    serve_image_data images[SERVE_MAX_IMAGES]; /* in the order the conversation holds them */
    int n_images;
    /* the Responses API's truncation "auto" (set by its reading, not a chat field): a
     * conversation too long for the context loses its oldest turns (serve/truncate.h) */
    bool truncate_auto;
    double
        video_fps; /* mm_processor_kwargs.fps (vLLM's): frames sampled a second; 0: the model's */
    void **owned;  /* strings joined from content parts, tool call lists */
    int n_owned;
    char *tools_json; /* owned; NULL = no tools */
    bool parse_tools; /* tools offered and tool_choice is not "none" */
    bool tools_forced;   /* tool_choice "required" or a named function (a grammar of calls) */
    /* the named function (borrowed), NULL for any; parallel_tool_calls: several calls may
     * follow each other. Kept for preparation, which makes the grammar of the list form for a
     * chat format without calls of its own (this file makes Qwen3.5's). */
    const char *tool_only;
    bool tools_parallel;
    bool tools_list_grammar; /* preparation has made the list form's grammar */
    ts_grammar *grammar; /* owned; the answer's content must follow it (response_format) */
    /* completions: one prompt or several (each answered by n choices) */
    serve_prompt *prompts; /* owned */
    int n_prompts;
    int n;              /* choices a prompt (sampled independently; choice c's seed is seed + c) */
    int best_of; /* answers made a prompt (>= n): the n of highest mean log-probability a token
                  * are returned */
    bool echo; /* the answer's text starts with the prompt's (with logprobs, its tokens') */
    /* fill in the middle: the text after the hole the prompt ends at; NULL without */
    const char *suffix;
    const json_t *stop; /* validated later, by preparation */
    /* prediction's text (OpenAI's Predicted Outputs), tokenized by preparation; NULL without */
    const char *prediction;
} serve_request;

/* Parses a body: rejects invalid JSON, duplicate keys, nesting deeper than
 * SERVE_MAX_JSON_DEPTH, and a non-object top level. */
bool serve_json_parse(const char *body, size_t len, json_t **root, serve_error *e);
/* The same checks, any JSON value at the top (a list: POST /lora-adapters). */
bool serve_json_parse_value(const char *body, size_t len, json_t **root, serve_error *e);

/* Validates the fields of a chat or completion request. model_ids: the names the model
 * answers to (NULL-terminated); max_tokens_cap: 0 = none. Takes ownership of root. */
bool serve_request_parse(serve_api api, json_t *root, const char *const *model_ids,
                         int max_tokens_cap, serve_request *r, serve_error *e);
void serve_request_free(serve_request *r);
/* What a chat's job keeps of its request after preparation: the messages' strings are copied
 * into one block the request owns, and the JSON tree (up to ~75 times the body, whatever
 * fields it carried) and the images' bytes are freed. Afterwards only msgs, tools_json,
 * enable_thinking and the scalar fields are valid. */
ts_status serve_request_detach(serve_request *r);

/* The error envelope as a malloc'd JSON string. */
char *serve_error_json(const serve_error *e);

#endif
