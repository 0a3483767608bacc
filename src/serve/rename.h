/* Chat's error names rewritten into another wire's (the Responses and Messages APIs read a
 * request as the chat request it means, and chat's checks name chat's fields): the pieces both
 * translations share. */
#ifndef TS_SERVE_RENAME_H
#define TS_SERVE_RENAME_H

#include <stddef.h>

typedef struct {
    const char *from, *to; /* a name starting with '.' is renamed only right after a ']' */
} serve_rename_pair;

/* Appends s[0..n) to out (cap bytes, NUL-terminated, cut at the end; *len its length). */
void serve_rename_put(char *out, size_t cap, size_t *len, const char *s, size_t n);

/* At p (within in): the first pair whose name starts there appended as its new name; the bytes
 * it matched, or 0 when none does. */
size_t serve_rename_step(const serve_rename_pair *pairs, size_t n_pairs, const char *in,
                         const char *p, char *out, size_t cap, size_t *len);

#endif
