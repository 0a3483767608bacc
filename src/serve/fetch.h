/* Images and videos named by http(s) URLs, fetched for a request when the server allows it
 * (--allow-media-urls; off by default: a server that fetches what clients name reaches
 * whatever its own network reaches, so only trusted clients should get one). Runs on the
 * request's own HTTP thread after the request is parsed and before it is prepared, one URL
 * after another, each bounded in bytes and time. */
#ifndef TS_SERVE_FETCH_H
#define TS_SERVE_FETCH_H

#include "serve/openai.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    bool allow;       /* fetch at all; else a URL is a 400 saying how to send the file */
    size_t max_bytes; /* a file's bytes at most */
    int timeout_s;    /* a file's whole transfer, redirects included */
} serve_fetch_opts;

/* Once, before the server's threads start (libcurl's global state). */
void serve_fetch_global_init(void);

/* Fetches the bytes of every image or video of r given by URL (serve_image_data.url) into its
 * data. Only http and https are followed, redirects included (at most 5). A refusal, a
 * failure (the host, a status of 400 or more, the time, the size) is a 400 invalid_value
 * naming the part. */
bool serve_fetch_media(serve_request *r, const serve_fetch_opts *o, serve_error *e);

#endif
