#include "serve/fetch.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void serve_fetch_global_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

typedef struct {
    unsigned char *data;
    size_t len, cap, max;
    bool too_big, oom;
} sink;

static size_t on_bytes(char *p, size_t size, size_t n, void *ctx) {
    sink *s = ctx;
    size_t k = size * n;
    if (k > s->max - s->len) {
        s->too_big = true;
        return 0; /* ends the transfer */
    }
    if (s->len + k > s->cap) {
        size_t cap = s->cap ? s->cap : 64 * 1024;
        while (cap < s->len + k)
            cap *= 2;
        if (cap > s->max) cap = s->max;
        unsigned char *d = realloc(s->data, cap);
        if (!d) {
            s->oom = true;
            return 0;
        }
        s->data = d, s->cap = cap;
    }
    memcpy(s->data + s->len, p, k);
    s->len += k;
    return k;
}

/* One URL's bytes into d, or e set. */
static bool fetch_one(serve_image_data *d, const serve_fetch_opts *o, serve_error *e) {
    const char *what = d->video ? "video" : "image";
    CURL *c = curl_easy_init();
    if (!c) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    sink s = {.max = o->max_bytes};
    char err[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(c, CURLOPT_URL, d->url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, (long)o->timeout_s);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L); /* threads: no SIGALRM for name lookups */
    curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)o->max_bytes);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "tessera");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_bytes);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, err);
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    if (rc == CURLE_OK && s.len > 0) {
        d->data = s.data, d->len = s.len;
        return true;
    }
    free(s.data);
    if (s.oom) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    if (s.too_big || rc == CURLE_FILESIZE_EXCEEDED)
        return serve_fail(e, 400, "invalid_value", d->param,
                          "%s: the %s at the URL is larger than this server fetches (%zu bytes, "
                          "--media-url-max-mb)",
                          d->param, what, o->max_bytes);
    if (rc == CURLE_OK)
        return serve_fail(e, 400, "invalid_value", d->param, "%s: the URL's %s is empty", d->param,
                          what);
    if (rc == CURLE_HTTP_RETURNED_ERROR)
        return serve_fail(e, 400, "invalid_value", d->param,
                          "%s: fetching the %s failed: the URL answered HTTP %ld", d->param, what,
                          status);
    if (rc == CURLE_OPERATION_TIMEDOUT)
        return serve_fail(e, 400, "invalid_value", d->param,
                          "%s: fetching the %s took longer than %d s (--media-url-timeout)",
                          d->param, what, o->timeout_s);
    return serve_fail(e, 400, "invalid_value", d->param, "%s: fetching the %s failed: %s", d->param,
                      what, err[0] ? err : curl_easy_strerror(rc));
}

bool serve_fetch_media(serve_request *r, const serve_fetch_opts *o, serve_error *e) {
    for (int k = 0; k < r->n_images; k++) {
        serve_image_data *d = &r->images[k];
        if (!d->url) continue;
        if (!o->allow)
            return serve_fail(e, 400, "invalid_value", d->param,
                              "%s: this server fetches no URLs (it would, started with "
                              "--allow-media-urls): send the %s inline, as a data: URL "
                              "(data:<type>;base64,<data>)",
                              d->param, d->video ? "video" : "image");
        if (!fetch_one(d, o, e)) return false;
        d->url = NULL; /* its bytes are in */
    }
    return true;
}
