/* Request bodies parsed with jansson, their long plain strings kept out of its lexer.
 *
 * jansson reads a string a character at a time (its UTF-8 checked, each byte appended to a
 * growing buffer): ~20 ns a byte, so the 3.7 MB body of one 1024x1024 image as a base64 data
 * URL took 70-80 ms to parse - more than the GPU's vision tower for that image. Such strings
 * need none of that work: printable ASCII without escapes is already its own value. */
#ifndef TS_SERVE_JSON_LOAD_H
#define TS_SERVE_JSON_LOAD_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* The server's threshold: strings of at least this many bytes take the short way. */
#define SERVE_JSON_LONG 4096

/* json_loadb(body, len, JSON_REJECT_DUPLICATES, err), bit for bit the same value: every string
 * value (not an object key) of at least min_long bytes of printable ASCII (0x20-0x7E) without
 * a backslash is cut out of the text before jansson parses it and set into the parsed tree
 * afterwards. NULL with *too_deep when the text nests arrays and objects deeper than max_depth
 * (counted outside strings, so nothing recurses that deep; err is not set), else NULL where
 * the text is not JSON, err as jansson gives it for the whole body. n_long (may be NULL): how
 * many strings took the short way (0 where the body was parsed whole). */
json_t *serve_json_load(const char *body, size_t len, size_t min_long, int max_depth,
                        bool *too_deep, json_error_t *err, size_t *n_long);

#endif
