/* See tensor_stream.h. */
#include "format/tensor_stream.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/mmapfile.h"

ts_status ts_tstream_open(ts_tstream *s, const char *path, const ts_tstream_tensor *t, size_t n,
                          uint64_t align, const char *kind) {
    memset(s, 0, sizeof *s);
    size_t pl = strlen(path);
    s->path = malloc(pl + 1);
    s->tmp = malloc(pl + 5);
    s->t = malloc((n ? n : 1) * sizeof *s->t);
    if (!s->path || !s->tmp || !s->t) {
        ts_tstream_free(s);
        return ts_error(TS_ERR_NOMEM, "%s: out of memory", kind);
    }
    memcpy(s->path, path, pl + 1);
    memcpy(s->tmp, path, pl);
    memcpy(s->tmp + pl, ".tmp", 5);
    if (n) memcpy(s->t, t, n * sizeof *t);
    s->n = n;
    s->align = align ? align : 1;
    for (size_t i = 0; i < n; i++) s->total += t[i].nbytes;
    s->f = fopen(s->tmp, "wb");
    if (!s->f) return ts_error(TS_ERR_IO, "%s: cannot create: %s", s->tmp, strerror(errno));
    return TS_OK;
}

void ts_tstream_abort(ts_tstream *s) {
    if (!s->f) return;
    fclose(s->f);
    s->f = NULL;
    unlink(s->tmp);
}

void ts_tstream_free(ts_tstream *s) {
    ts_tstream_abort(s);
    free(s->path);
    free(s->tmp);
    free(s->t);
    memset(s, 0, sizeof *s);
}

static ts_status io_fail(ts_tstream *s, const char *what) {
    int e = errno;
    ts_tstream_abort(s);
    return ts_error(TS_ERR_IO, "%s: %s: write failed: %s", s->tmp, what, strerror(e));
}

ts_status ts_tstream_put(ts_tstream *s, const void *p, size_t n, const char *what) {
    if (!s->f) return ts_error(TS_ERR_INVALID, "%s: the file is not open", s->path);
    if (n && fwrite(p, 1, n, s->f) != n) return io_fail(s, what);
    return TS_OK;
}

ts_status ts_tstream_zeros(ts_tstream *s, uint64_t n, const char *what) {
    static const unsigned char zeros[256];
    while (n) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        TS_TRY(ts_tstream_put(s, zeros, k, what));
        n -= k;
    }
    return TS_OK;
}

/* Steps past finished tensors, writing the padding that follows each. */
static ts_status advance(ts_tstream *s) {
    while (s->cur < s->n && s->cur_done == s->t[s->cur].nbytes) {
        uint64_t nb = s->t[s->cur].nbytes;
        TS_TRY(ts_tstream_zeros(s, (s->align - nb % s->align) % s->align, "padding"));
        s->cur++;
        s->cur_done = 0;
    }
    return TS_OK;
}

ts_status ts_tstream_write(ts_tstream *s, const void *data, size_t nbytes) {
    if (!s->f) return ts_error(TS_ERR_INVALID, "%s: write outside begin/end", s->path);
    const unsigned char *p = data;
    while (nbytes) {
        TS_TRY(advance(s));
        if (s->cur == s->n) {
            ts_tstream_abort(s);
            return ts_error(TS_ERR_INVALID,
                            "%s: %zu bytes written beyond the declared tensors (%" PRIu64
                            " bytes)",
                            s->path, nbytes, s->total);
        }
        uint64_t left = s->t[s->cur].nbytes - s->cur_done;
        size_t take = left < nbytes ? (size_t)left : nbytes;
        TS_TRY(ts_tstream_put(s, p, take, s->t[s->cur].name));
        p += take;
        nbytes -= take;
        s->cur_done += take;
    }
    return TS_OK;
}

ts_status ts_tstream_end(ts_tstream *s) {
    if (!s->f) return ts_error(TS_ERR_INVALID, "%s: end without begin", s->path);
    TS_TRY(advance(s));
    if (s->cur < s->n) {
        const ts_tstream_tensor *t = &s->t[s->cur];
        ts_status rc = ts_error(
            TS_ERR_INVALID, "%s: tensor '%s': only %" PRIu64 " of %" PRIu64 " bytes were written",
            s->path, t->name, s->cur_done, t->nbytes);
        ts_tstream_abort(s);
        return rc;
    }
    ts_status st = ts_file_commit(s->f, s->tmp, s->path);
    s->f = NULL;
    return st;
}
