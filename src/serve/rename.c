#include "serve/rename.h"

#include <string.h>

void serve_rename_put(char *out, size_t cap, size_t *len, const char *s, size_t n) {
    if (*len + n >= cap) n = cap - 1 - *len;
    memcpy(out + *len, s, n);
    *len += n;
    out[*len] = 0;
}

size_t serve_rename_step(const serve_rename_pair *pairs, size_t n_pairs, const char *in,
                         const char *p, char *out, size_t cap, size_t *len) {
    for (size_t k = 0; k < n_pairs; k++) {
        size_t fl = strlen(pairs[k].from);
        /* ".function" only right after "tools[i]" */
        if (pairs[k].from[0] == '.' && !(p > in && p[-1] == ']' && *len >= 1)) continue;
        if (strncmp(p, pairs[k].from, fl) != 0) continue;
        serve_rename_put(out, cap, len, pairs[k].to, strlen(pairs[k].to));
        return fl;
    }
    return 0;
}
