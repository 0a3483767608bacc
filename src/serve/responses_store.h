/* The Responses API's stored responses (store: true, OpenAI's default): each kept response's
 * conversation - its messages as the chat request held them, the instructions left out, its
 * answer appended as the assistant's turn - so that a request naming it as
 * previous_response_id goes on from there, and the response object GET /v1/responses/{id}
 * returns. In memory only, bounded in bytes (--responses-store-mb): the oldest go first. */
#ifndef TS_SERVE_RESPONSES_STORE_H
#define TS_SERVE_RESPONSES_STORE_H

#include "tessera.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct serve_rsp_store serve_rsp_store;

/* max_bytes 0: nothing is kept. */
ts_status serve_rsp_store_create(size_t max_bytes, serve_rsp_store **out);
void serve_rsp_store_free(serve_rsp_store *s);

/* Keeps response id: its conversation (a list of chat messages; a reference is taken), its
 * request's input items (a list with their ids; a reference; NULL: none) and its object's JSON
 * text (copied). One larger than the whole store is not kept. */
void serve_rsp_store_put(serve_rsp_store *s, const char *id, json_t *messages, json_t *input,
                         const char *object);
/* Whether response id is kept; then, for each output not NULL, a new reference to its
 * conversation and to its input items (NULL: none), and a malloc'd copy of its object (NULL
 * without memory). */
bool serve_rsp_store_get(serve_rsp_store *s, const char *id, json_t **messages, json_t **input,
                         char **object);
/* Forgets response id; false when it was not kept. */
bool serve_rsp_store_delete(serve_rsp_store *s, const char *id);

#endif
