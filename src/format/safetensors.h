/* safetensors checkpoints over mmap: one file or a sharded set with model.safetensors.index.json.
 *
 * Every header is validated before any tensor is used: header length against a size cap and the
 * file size, well-formed JSON, known dtype, shape × dtype size == byte span, offsets inside the
 * data area and ordered, no 64-bit overflow. Errors name the file, the tensor and the field. */
#ifndef TS_FORMAT_SAFETENSORS_H
#define TS_FORMAT_SAFETENSORS_H

#include <stddef.h>

#include "base/status.h"
#include "base/tensor.h"

typedef struct ts_st ts_st; /* an open checkpoint (all its shards) */

/* path: a .safetensors file, or a directory holding model.safetensors or
 * model.safetensors.index.json (+ shards). */
ts_status ts_st_open(const char *path, ts_st **out);
void ts_st_close(ts_st *st);

/* NULL when absent. The tensor's data stays valid until ts_st_close. */
const ts_tensor *ts_st_find(const ts_st *st, const char *name);
/* Which file holds the tensor (for error messages); NULL when absent. */
const char *ts_st_file_of(const ts_st *st, const char *name);
size_t ts_st_count(const ts_st *st);
/* i-th tensor name in a stable order (sorted by name), i < ts_st_count. */
const char *ts_st_name(const ts_st *st, size_t i);

/* Writer: streams one .safetensors file, so a multi-GB checkpoint never sits in memory.
 * Declare every tensor (add), then begin (writes the header), then write each tensor's bytes in
 * the order declared (any number of write calls per tensor), then end (checks that every byte
 * was written, renames the temp file into place). free discards an unfinished file. */
typedef struct ts_st_writer ts_st_writer;
ts_status ts_st_writer_new(ts_st_writer **out);
ts_status ts_st_writer_add(ts_st_writer *w, const char *name, ts_dtype dtype, int n_dims,
                           const int64_t *shape);
ts_status ts_st_writer_begin(ts_st_writer *w, const char *path);
ts_status ts_st_writer_write(ts_st_writer *w, const void *data, size_t nbytes);
ts_status ts_st_writer_end(ts_st_writer *w);
void ts_st_writer_free(ts_st_writer *w);

#endif
