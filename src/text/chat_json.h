/* JSON values rendered the way the Jinja chat templates of transformers render them.
 *
 * transformers replaces Jinja's `tojson` filter with Python's json.dumps(x, ensure_ascii=False)
 * (keys in insertion order, ", " and ": " separators, no HTML escaping), and the `string` filter
 * is Python's str(). Both print floats with Python's shortest round-trip repr ("0.1", "1e-07",
 * "100.0") and str() prints true/false/null as True/False/None. jansson parses the values (it
 * keeps object key order, and a repeated key keeps its first position and last value, as Python
 * does); this module only prints them. */
#ifndef TS_TEXT_CHAT_JSON_H
#define TS_TEXT_CHAT_JSON_H

#include "base/status.h"

#include <jansson.h>
#include <stddef.h>

/* A growable byte string, always NUL-terminated once anything was appended. Zero-initialise;
 * free p with free(). */
typedef struct {
    char *p;
    size_t len, cap;
} chat_buf;

ts_status chat_buf_put(chat_buf *b, const char *s, size_t n);
ts_status chat_buf_puts(chat_buf *b, const char *s);

/* Appends json.dumps(v, ensure_ascii=False). */
ts_status chat_json_dumps(const json_t *v, chat_buf *b);

/* Appends str(v) for a scalar (string as-is, 3, 0.5, True, None); containers go through
 * chat_json_dumps, as the Qwen3.5 template does for mapping and sequence argument values. */
ts_status chat_json_str(const json_t *v, chat_buf *b);

/* Python repr(float) of a finite x into out (at most 32 bytes with the NUL). */
void chat_json_repr_double(double x, char out[32]);

#endif
