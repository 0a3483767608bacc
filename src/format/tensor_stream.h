/* The data part of a model file being written, shared by the GGUF and safetensors writers:
 * tensors arrive in their declared order as any number of byte chunks, each tensor takes
 * exactly its declared size and is followed by zero padding up to `align` bytes, all into
 * "PATH.tmp", which becomes PATH only once every byte has come (ts_file_commit). Writing more
 * than was declared, ending short, or any I/O error removes the temporary and fails with a
 * message naming the file and the tensor; the stream then refuses further use. */
#ifndef TS_FORMAT_TENSOR_STREAM_H
#define TS_FORMAT_TENSOR_STREAM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"

typedef struct {
    const char *name; /* borrowed from the writer, which keeps it until the end */
    uint64_t nbytes;
} ts_tstream_tensor;

typedef struct {
    FILE *f;                       /* the temporary, open between open and end */
    char *path, *tmp;              /* owned */
    ts_tstream_tensor *t;          /* owned array */
    size_t n, cur;                 /* tensors; the one being written */
    uint64_t cur_done, align;      /* its bytes so far; padding unit (1: none) */
    uint64_t total;                /* declared bytes, padding excluded (for messages) */
} ts_tstream;

/* Creates PATH.tmp for the n tensors (names and sizes copied from t) and leaves it open for
 * the caller's header. kind names the writer in messages ("gguf writer"). */
ts_status ts_tstream_open(ts_tstream *s, const char *path, const ts_tstream_tensor *t, size_t n,
                          uint64_t align, const char *kind);
/* Header bytes (before the tensors), or padding: through here so a failure cleans up. */
ts_status ts_tstream_put(ts_tstream *s, const void *p, size_t n, const char *what);
ts_status ts_tstream_zeros(ts_tstream *s, uint64_t n, const char *what);
/* The next bytes of the tensor data. */
ts_status ts_tstream_write(ts_tstream *s, const void *data, size_t nbytes);
/* Checks every tensor is complete and puts the file in place. */
ts_status ts_tstream_end(ts_tstream *s);
/* Closes and removes the temporary if still open. */
void ts_tstream_abort(ts_tstream *s);
/* Frees what open allocated (aborting first if needed); the struct may then be reused. */
void ts_tstream_free(ts_tstream *s);

#endif
