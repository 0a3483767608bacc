#include "serve/fetch.h"

#include "base/byte_piece.h"
#include "base/clock.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* Whether url's host is one o->hosts names (a comma-separated list, hosts compared without
 * regard to case; NULL: any host); host receives it for the refusal's message. */
static bool host_allowed(const char *url, const serve_fetch_opts *o, char *host, size_t cap) {
    snprintf(host, cap, "?");
    if (!o->hosts) return true;
    CURLU *u = curl_url();
    char *h = NULL;
    bool ok = false;
    if (u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_HOST, &h, 0) == CURLUE_OK) {
        snprintf(host, cap, "%s", h);
        size_t n = strlen(h);
        for (const char *p = o->hosts; *p && !ok;) {
            size_t k = strcspn(p, ",");
            ok = k == n && !strncasecmp(p, h, n);
            p += k + (p[k] == ',');
        }
    }
    curl_free(h);
    curl_url_cleanup(u);
    return ok;
}

#define SERVE_FETCH_REDIRECTS 5
#define SERVE_FETCH_PARALLEL  8 /* URLs of one request fetched at once */

/* One URL's bytes into d, or e set. Redirects are followed here, not by libcurl, so that each
 * URL's host is checked against the allowed hosts before anything connects to it. */
static bool fetch_one(serve_image_data *d, const serve_fetch_opts *o, serve_error *e) {
    const char *what = d->video ? "video" : "image";
    CURL *c = curl_easy_init();
    char *url = strdup(d->url);
    if (!c || !url) {
        curl_easy_cleanup(c);
        free(url);
        return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    }
    sink s = {.max = o->max_bytes};
    char err[CURL_ERROR_SIZE] = "", host[256];
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L); /* threads: no SIGALRM for name lookups */
    curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)o->max_bytes);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "tessera");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_bytes);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, err);
    double end = ts_now_s() + o->timeout_s; /* the whole transfer, redirects included */
    CURLcode rc = CURLE_OK;
    long status = 0;
    bool refused = false, too_many = false;
    for (int hop = 0;; hop++) {
        if ((refused = !host_allowed(url, o, host, sizeof host))) break;
        long ms = (long)((end - ts_now_s()) * 1000);
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, ms > 1 ? ms : 1L);
        s.len = 0; /* a redirect's own body is not the file */
        rc = curl_easy_perform(c);
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        char *next = NULL;
        if (rc != CURLE_OK || status < 300 || status >= 400 ||
            curl_easy_getinfo(c, CURLINFO_REDIRECT_URL, &next) != CURLE_OK || !next)
            break;
        if ((too_many = hop == SERVE_FETCH_REDIRECTS)) break;
        free(url);
        if (!(url = strdup(next))) {
            s.oom = true;
            break;
        }
    }
    curl_easy_cleanup(c);
    free(url);
    if (refused || too_many) {
        free(s.data);
        if (refused)
            return serve_fail(e, 400, "invalid_value", d->param,
                              "%s: this server fetches no %ss from '%.200s' (only from the hosts "
                              "of --allowed-media-domains)",
                              d->param, what, host);
        return serve_fail(e, 400, "invalid_value", d->param,
                          "%s: fetching the %s took more than %d redirects", d->param, what,
                          SERVE_FETCH_REDIRECTS);
    }
    if (rc == CURLE_OK && s.len > 0 && !s.oom) {
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

bool serve_fetch_media_dir(const char *dir, char *out) {
    struct stat st;
    if (!realpath(dir, out)) return false;
    if (stat(out, &st) != 0 || !S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return false;
    }
    return true;
}

/* A file: URL's path (file:///p or file://localhost/p), percent-escapes decoded, into out;
 * false for another host, a relative path, a bad escape or a NUL. */
static bool file_path(const char *url, char *out, size_t cap) {
    const char *p = url + 7; /* after "file://" */
    if (!strncasecmp(p, "localhost/", 10)) p += 9;
    if (*p != '/') return false;
    size_t n = 0;
    for (; *p; p++) {
        int c = (unsigned char)*p;
        if (c == '%') {
            int hi = ts_hex_digit(p[1]), lo = hi < 0 ? -1 : ts_hex_digit(p[2]);
            if (lo < 0 || (hi == 0 && lo == 0)) return false;
            c = hi * 16 + lo, p += 2;
        }
        if (n + 1 >= cap) return false;
        out[n++] = (char)c;
    }
    out[n] = 0;
    return true;
}

/* A file: URL's bytes, from under o->dir, into d; or e set. */
static bool read_local(serve_image_data *d, const serve_fetch_opts *o, serve_error *e) {
    const char *what = d->video ? "video" : "image";
    if (!o->dir)
        return serve_fail(e, 400, "invalid_value", d->param,
                          "%s: this server reads no local files (it would, from under one "
                          "directory, started with --allowed-media-dir DIR): send the %s "
                          "inline, as a data: URL",
                          d->param, what);
    char path[PATH_MAX], *real = NULL;
    if (!file_path(d->url, path, sizeof path))
        return serve_fail(e, 400, "invalid_value", d->param,
                          "%s: a file: URL must name an absolute path on this host "
                          "(file:///path)",
                          d->param);
    real = realpath(path, NULL);
    size_t nd = strlen(o->dir);
    /* under the directory once every link is followed: a link out of it is outside */
    bool inside = real && !strncmp(real, o->dir, nd) && (real[nd] == '/' || o->dir[nd - 1] == '/');
    int fd = inside ? open(real, O_RDONLY | O_CLOEXEC) : -1;
    free(real);
    if (!inside)
        return serve_fail(e, 400, "invalid_value", d->param,
                          "%s: no %s at that path under the directory this server reads "
                          "(--allowed-media-dir)",
                          d->param, what);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0) close(fd);
        return serve_fail(e, 400, "invalid_value", d->param, "%s: the path is not a readable file",
                          d->param);
    }
    if ((uint64_t)st.st_size > o->max_bytes) {
        close(fd);
        return serve_fail(e, 400, "invalid_value", d->param,
                          "%s: the %s file is larger than this server reads (%zu bytes, "
                          "--media-url-max-mb)",
                          d->param, what, o->max_bytes);
    }
    size_t len = (size_t)st.st_size, got = 0;
    unsigned char *data = malloc(len ? len : 1);
    if (!data) {
        close(fd);
        return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    }
    while (got < len) {
        ssize_t k = read(fd, data + got, len - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        got += (size_t)k;
    }
    close(fd);
    if (got != len || len == 0) {
        free(data);
        return serve_fail(e, 400, "invalid_value", d->param, "%s: the %s file %s", d->param, what,
                          len == 0 ? "is empty" : "could not be read whole");
    }
    d->data = data, d->len = len;
    return true;
}

/* One URL's fetch on a thread of its own. */
typedef struct {
    serve_image_data *d;
    const serve_fetch_opts *o;
    serve_error e;
    bool ok;
    pthread_t th;
} fetch_job;

static void *fetch_thread(void *p) {
    fetch_job *f = p;
    f->ok = fetch_one(f->d, f->o, &f->e);
    return NULL;
}

bool serve_fetch_media(serve_request *r, const serve_fetch_opts *o, serve_error *e) {
    /* the URLs are fetched at the same time (up to SERVE_FETCH_PARALLEL), so that a request
     * with several waits for the slowest, not for their sum; a file is read on this thread.
     * Whatever fails, the error of the first part that failed is the answer, as if they had
     * been read in order. */
    fetch_job *jobs = calloc((size_t)(r->n_images ? r->n_images : 1), sizeof *jobs);
    if (!jobs) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    for (int k = 0; k < r->n_images; k++) {
        fetch_job *f = &jobs[k];
        serve_image_data *d = f->d = &r->images[k];
        f->o = o;
        f->ok = true;
        if (!d->url) continue;
        if (!strncasecmp(d->url, "file://", 7))
            f->ok = read_local(d, o, &f->e);
        else if (!o->allow)
            f->ok = serve_fail(&f->e, 400, "invalid_value", d->param,
                               "%s: this server fetches no URLs (it would, started with "
                               "--allow-media-urls): send the %s inline, as a data: URL "
                               "(data:<type>;base64,<data>)",
                               d->param, d->video ? "video" : "image");
        else
            continue;
        d->url = NULL;
    }
    int started[SERVE_FETCH_PARALLEL], n = 0;
    for (int k = 0; k <= r->n_images; k++) {
        /* a full round, or the last: wait for the round's fetches */
        if (n == SERVE_FETCH_PARALLEL || (k == r->n_images && n > 0)) {
            for (int i = 0; i < n; i++) {
                pthread_join(jobs[started[i]].th, NULL);
                jobs[started[i]].d->url = NULL; /* its bytes are in, or its error is */
            }
            n = 0;
        }
        if (k == r->n_images) break;
        fetch_job *f = &jobs[k];
        if (!f->d->url) continue;
        if (pthread_create(&f->th, NULL, fetch_thread, f) == 0) {
            started[n++] = k;
        } else { /* no thread to be had: on this one */
            fetch_thread(f);
            f->d->url = NULL;
        }
    }
    bool ok = true;
    for (int k = 0; k < r->n_images && ok; k++)
        if (!jobs[k].ok) *e = jobs[k].e, ok = false;
    free(jobs);
    return ok;
}
