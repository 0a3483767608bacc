/* POST /v1/embeddings (OpenAI's embeddings API): the request read and checked, its inputs made
 * into embedding jobs for the worker (serve/embed_lane.c runs them), and the answer. HTTP side.
 *
 * An input is a string, a list of token ids, or a list of either; each becomes one vector of
 * the model's width: its tokens' final hidden states (the output head's input) pooled - the
 * last token's by default, the mean with --pooling mean - and scaled to unit length. A
 * request's inputs are shared out over up to as many jobs as the worker has lanes, in order,
 * so that they run side by side; no input is ever cut to fit the context. */
#ifndef TS_SERVE_EMBEDDINGS_H
#define TS_SERVE_EMBEDDINGS_H

#include "serve/job.h"
#include "serve/openai.h"
#include "serve/worker.h"

/* The most inputs one request may carry (OpenAI's limit). */
#define SERVE_MAX_EMBED_INPUTS 2048

typedef struct {
    json_t *root;         /* owned; input texts are borrowed from it */
    const char *model;    /* the name the request gave (borrowed), NULL without */
    serve_prompt *inputs; /* owned */
    int n_inputs;
    bool base64; /* encoding_format "base64": each vector as its float32 bytes, little-endian */
    int dims;    /* `dimensions`: each vector cut to its first dims values, then to unit length */
} serve_embed_request;

/* Reads root (taken over: freed with r) in the fixed order model, input, encoding_format,
 * dimensions; false with the error in e. */
bool serve_embed_parse(json_t *root, const char *const *model_ids, const serve_runtime *rt,
                       serve_embed_request *r, serve_error *e);
void serve_embed_request_free(serve_embed_request *r);

/* The request's jobs (at most max_jobs, each owning its inputs' ids and its output), every
 * input tokenized and checked: not empty, its ids in the vocabulary, its length within the
 * context. *jobs is owned by the caller, also after a failure (*n of them made). */
bool serve_embed_jobs(const serve_runtime *rt, const serve_embed_request *r, serve_pool pool,
                      int max_jobs, serve_job ***jobs, int *n, serve_error *e);

/* The answer to the finished jobs (in order): OpenAI's list of embeddings of dims values (of
 * the n_embd each job holds: the first dims, scaled back to unit length) and usage; NULL when
 * out of memory. */
char *serve_embed_answer(serve_job *const *jobs, int n, int n_embd, int dims, const char *model,
                         bool base64);

#endif
