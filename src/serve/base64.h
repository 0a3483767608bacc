/* Base64 (RFC 4648, the standard alphabet) for the images clients send as data: URLs, and the
 * embeddings sent as base64 (encoding_format). */
#ifndef TS_SERVE_BASE64_H
#define TS_SERVE_BASE64_H

#include <stdbool.h>
#include <stddef.h>

/* Decodes n characters of s into a malloc'd buffer (*out, *len bytes). Whitespace is skipped
 * (some clients wrap long lines); '=' padding may be left out. False for any other character,
 * data after the padding, or a length no encoder produces; false with *out NULL also when out
 * of memory (*len then SIZE_MAX). */
bool serve_base64_decode(const char *s, size_t n, unsigned char **out, size_t *len);

/* Writes the encoding of n bytes, padded, to out (4 * ceil(n / 3) characters and a NUL): out
 * must have room for them. */
void serve_base64_encode(const void *data, size_t n, char *out);
#define SERVE_BASE64_LEN(n) (((n) + 2) / 3 * 4)

#endif
