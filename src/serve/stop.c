#include "serve/stop.h"

#include "base/status.h"

#include <string.h>

void serve_stop_init(serve_stop *m, char *const *stops, int n_stops) {
    memset(m, 0, sizeof *m);
    m->hit = -1;
    for (int i = 0; i < n_stops && i < SERVE_MAX_STOPS; i++) {
        m->stops[m->n_stops] = stops[i];
        m->stop_len[m->n_stops++] = strlen(stops[i]);
    }
}

void serve_stop_free(serve_stop *m) { ts_strbuf_free(&m->held); }

/* Length of the longest suffix of s[0..n) that is a proper prefix of some stop. */
static size_t undecided_tail(const serve_stop *m, const char *s, size_t n) {
    size_t best = 0;
    for (int k = 0; k < m->n_stops; k++) {
        size_t max = m->stop_len[k] - 1 < n ? m->stop_len[k] - 1 : n;
        for (size_t l = max; l > best; l--)
            if (memcmp(s + n - l, m->stops[k], l) == 0) {
                best = l;
                break;
            }
    }
    return best;
}

bool serve_stop_push(serve_stop *m, const char *text, size_t len, ts_strbuf *out, ts_status *st) {
    *st = TS_OK;
    if (m->n_stops == 0) {
        *st = ts_strbuf_append(out, text, len);
        return false;
    }
    if ((*st = ts_strbuf_append(&m->held, text, len)) != TS_OK) return false;
    const char *h = m->held.data;
    size_t n = m->held.len, first = (size_t)-1, stop_len = 0;
    /* the earliest occurrence of any stop wins, so the shown text is as short as possible
     * (of two at the same place, the first listed) */
    for (int k = 0; k < m->n_stops; k++) {
        const char *p = memmem(h, n, m->stops[k], m->stop_len[k]);
        if (p && (size_t)(p - h) < first)
            first = (size_t)(p - h), stop_len = m->stop_len[k], m->hit = k;
    }
    if (first != (size_t)-1) {
        *st = ts_strbuf_append(out, h, first + (m->keep ? stop_len : 0));
        m->held.len = 0;
        return true;
    }
    size_t keep = undecided_tail(m, h, n);
    if ((*st = ts_strbuf_append(out, h, n - keep)) != TS_OK) return false;
    memmove(m->held.data, h + n - keep, keep);
    m->held.len = keep;
    m->held.data[keep] = 0;
    return false;
}

ts_status serve_stop_flush(serve_stop *m, ts_strbuf *out) {
    ts_status st = TS_OK;
    if (m->held.len) st = ts_strbuf_append(out, m->held.data, m->held.len);
    m->held.len = 0;
    return st;
}
