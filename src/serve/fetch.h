/* Images and videos named by URL, read for a request when the server allows it: http(s) URLs
 * fetched (--allow-media-urls; off by default: a server that fetches what clients name
 * reaches whatever its own network reaches, so only trusted clients should get one), file:
 * URLs read from under one directory (--allowed-media-dir; none by default). Runs on the
 * request's own HTTP thread after the request is parsed and before it is prepared (its URLs
 * fetched at the same time, up to 8, each on a thread of its own), each bounded in bytes (and
 * a fetch in time). */
#ifndef TS_SERVE_FETCH_H
#define TS_SERVE_FETCH_H

#include "serve/openai.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    bool allow;       /* fetch at all; else a URL is a 400 saying how to send the file */
    size_t max_bytes; /* a file's bytes at most */
    int timeout_s;    /* a file's whole transfer, redirects included */
    const char *dir;  /* file: URLs are read from under it (a canonical path); NULL: none */
    /* the only hosts fetched from, each redirect's too (a comma-separated list, compared
     * without regard to case; --allowed-media-domains); NULL: any */
    const char *hosts;
} serve_fetch_opts;

/* dir as the canonical path serve_fetch_opts.dir wants, into out (PATH_MAX bytes); false
 * (errno set) when it does not resolve to a directory. */
bool serve_fetch_media_dir(const char *dir, char *out);

/* Once, before the server's threads start (libcurl's global state). */
void serve_fetch_global_init(void);

/* Reads the bytes of every image or video of r given by URL (serve_image_data.url) into its
 * data. Fetches follow http and https only, redirects included (at most 5). A file: URL's
 * path (percent-escapes decoded) must resolve, links followed, to a regular file under
 * o->dir. A refusal, a failure (the host, a status of 400 or more, the time, the size, no
 * such file, a path outside the directory) is a 400 invalid_value naming the part. */
bool serve_fetch_media(serve_request *r, const serve_fetch_opts *o, serve_error *e);

#endif
