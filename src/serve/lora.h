/* The server's LoRA adapters: which a request gets, at what scales, and the routes that list and
 * set them.
 *
 * Adapters come from the command line, loaded by the worker with the model: `--lora PATH` and
 * `--lora-scaled PATH SCALE` (llama-server's) apply to every request that says nothing else, at
 * scale 1 or SCALE (`--lora-init-without-apply`: 0); `--lora-modules NAME=PATH` (vLLM's) is a
 * model name of its own: a request whose "model" is NAME gets that adapter alone, at 1. A
 * request's `lora` field (llama-server's, [{"id", "scale"}]) sets every adapter's scale for it,
 * those it leaves out at 0. `GET /lora-adapters` lists them, `POST /lora-adapters` sets the
 * scales requests get by default (llama-server's routes). Ids are the order on the command
 * line. Each job carries its scales (serve_job.lora) to the decoder, which keys prefix reuse by
 * them. */
#ifndef TS_SERVE_LORA_H
#define TS_SERVE_LORA_H

#include "serve/openai.h"
#include "serve/serve.h"
#include "tessera.h"

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>

typedef struct {
    int n;
    const char *path[TS_MAX_LORA];
    const char *name[TS_MAX_LORA];
    bool model_name[TS_MAX_LORA]; /* a --lora-modules name: a request's "model" may be it */
    pthread_mutex_t mu;           /* over scale: POST /lora-adapters changes it */
    float scale[TS_MAX_LORA];     /* what a request that says nothing gets */
    char *owned[TS_MAX_LORA];     /* names made here */
} serve_lora;

void serve_lora_init(serve_lora *l, const serve_lora_opts *o);
void serve_lora_free(serve_lora *l);
/* The scales of request r's jobs (TS_MAX_LORA floats into out): its `lora` field, else the
 * adapter its model names, else the defaults. An id the server has not → 400 invalid_value. */
bool serve_lora_scales(serve_lora *l, const serve_request *r, float *out, serve_error *e);
/* The default scales alone (requests without fields of their own: embeddings). */
void serve_lora_defaults(serve_lora *l, float *out);
/* GET /lora-adapters: [{"id", "name", "path", "scale"}] */
json_t *serve_lora_list(serve_lora *l);
/* POST /lora-adapters: a list of {"id", "scale"}; every adapter it leaves out goes to 0. */
bool serve_lora_set(serve_lora *l, const json_t *body, serve_error *e);
/* Reads a `lora` list ([{"id", "scale"}]) into ids and scales (*n entries): ids 0 ..
 * TS_MAX_LORA - 1, each once, scales finite; param names the field in errors. */
bool serve_lora_parse(const json_t *list, const char *param, int *n, int *ids, float *scales,
                      serve_error *e);

#endif
