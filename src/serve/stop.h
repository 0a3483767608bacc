/* Stop strings matched across token boundaries.
 *
 * Generated text arrives in pieces (whole UTF-8 characters from the streaming detokenizer). A
 * stop string may straddle pieces, so the tail of the text that could still become a stop is
 * held back until it is decided: either a stop completes (generation ends and the stop itself
 * is never shown) or the tail stops being a prefix of any stop (it is released). */
#ifndef TS_SERVE_STOP_H
#define TS_SERVE_STOP_H

#include <stdbool.h>
#include <stddef.h>

#include "text/utf8.h"

#define SERVE_MAX_STOPS 4

typedef struct {
    char *stops[SERVE_MAX_STOPS]; /* borrowed, NUL-terminated, non-empty */
    size_t stop_len[SERVE_MAX_STOPS];
    int n_stops;
    bool keep;      /* a stop that completes is shown (vLLM's include_stop_str_in_output) */
    int hit;        /* the stop that completed (its index), -1 before */
    ts_strbuf held; /* undecided text */
} serve_stop;

/* stops are borrowed for the matcher's lifetime. */
void serve_stop_init(serve_stop *m, char *const *stops, int n_stops);
void serve_stop_free(serve_stop *m);

/* Feeds text; appends the text that is now decided and not part of a stop to out. Returns
 * true when a stop string completed (everything before it has been appended, and the stop
 * itself when keep is set; the matcher must not be fed again). */
bool serve_stop_push(serve_stop *m, const char *text, size_t len, ts_strbuf *out, ts_status *st);

/* Releases the held-back text (the generation ended for another reason). */
ts_status serve_stop_flush(serve_stop *m, ts_strbuf *out);

#endif
