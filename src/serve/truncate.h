/* The Responses API's truncation "auto": a conversation whose prompt is too long for the
 * context loses its oldest turns, as OpenAI describes it ("dropping items from the beginning
 * of the conversation"), instead of being refused.
 *
 * What is dropped: whole turns after the leading system messages (the instructions), each
 * from a user message up to the next user message - so a tool's output never loses the call
 * it answers, nor an answer its question - with the images and videos they hold. As few as
 * make the prompt fit; the last user message and everything after it are always kept. When
 * even that does not fit, the request is refused as an over-long one is. */
#ifndef TS_SERVE_TRUNCATE_H
#define TS_SERVE_TRUNCATE_H

#include "serve/openai.h"
#include "serve/worker.h"

/* The chat r rendered to *ids (*n tokens, with im read for all of r's images) is longer than
 * room tokens: drops r's oldest turns (its messages and images; im read again for those kept)
 * and renders the rest into *ids. False with e set (context_length_exceeded) when no cut fits,
 * or on running out of memory. */
bool serve_truncate_turns(const serve_runtime *rt, serve_request *r, serve_images *im, int room,
                          int32_t **ids, size_t *n, serve_error *e);

#endif
