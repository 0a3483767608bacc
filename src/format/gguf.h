/* GGUF files (llama.cpp's single-file model format) over mmap: a validating reader and a
 * streaming writer.
 *
 * Reading: ts_gguf_open maps the file and checks the whole header before anything is handed out:
 * magic, version (2 and 3, which are the same on the wire for little-endian files), counts
 * against the file size, every string and array length, value types, duplicate keys and tensor
 * names, dimensions, element and byte counts (no 64-bit overflow), row lengths against the
 * quantization block size, `general.alignment`, and every tensor's offset, extent and overlap.
 * The first problem is TS_ERR_FORMAT with the file, the byte offset and the key or tensor.
 *
 * Tensor types: a tensor of a ggml type that tessera computes with (one per ts_dtype: F32, F16,
 * BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q6_K) gets a ts_tensor. A tensor of another *known* ggml type
 * (Q5_K, IQ2_XS, I32, ...) is fully validated but not loadable: the open succeeds (so metadata and
 * the other tensors stay usable) and only asking for that tensor fails, with TS_ERR_UNSUPPORTED
 * naming it and its type. A type id this reader does not know at all fails the open with
 * TS_ERR_UNSUPPORTED, because its size (and so the file's integrity) cannot be checked. Arrays of
 * arrays (allowed by the spec, refused by llama.cpp, written by nobody) fail the open with
 * TS_ERR_UNSUPPORTED naming the key.
 *
 * Shapes: ts_tensor.shape is outermost-first like safetensors, i.e. GGUF's ne[] reversed: a
 * linear weight stored with ne = {in, out} is shape {out, in}, and each row (ne[0] elements) is
 * ts_dtype_row_bytes(dtype, in) bytes of whole blocks.
 *
 * Lifetimes: every pointer returned (keys, strings, tensor names, ts_tensor, array data) points
 * into the handle or the mapping and stays valid until ts_gguf_close. */
#ifndef TS_FORMAT_GGUF_H
#define TS_FORMAT_GGUF_H

#include "base/status.h"
#include "base/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Metadata value types, numbered as on the wire. */
typedef enum {
    TS_GGUF_U8 = 0,
    TS_GGUF_I8 = 1,
    TS_GGUF_U16 = 2,
    TS_GGUF_I16 = 3,
    TS_GGUF_U32 = 4,
    TS_GGUF_I32 = 5,
    TS_GGUF_F32 = 6,
    TS_GGUF_BOOL = 7,
    TS_GGUF_STR = 8,
    TS_GGUF_ARR = 9,
    TS_GGUF_U64 = 10,
    TS_GGUF_I64 = 11,
    TS_GGUF_F64 = 12,
    TS_GGUF_TYPE_COUNT
} ts_gguf_type;

#define TS_GGUF_DEFAULT_ALIGNMENT 32u
#define TS_GGUF_MAX_DIMS          4

/* "UINT32", "STRING", ...; "?" for anything else. */
const char *ts_gguf_type_name(ts_gguf_type t);
/* "Q4_K", "IQ2_XS", ... for a ggml type id; NULL when unknown. */
const char *ts_gguf_ggml_type_name(uint32_t ggml_type);
/* The ggml type id of a ts_dtype (F32 -> 0, Q4_K -> 12, BF16 -> 30, ...). */
uint32_t ts_gguf_ggml_type_of(ts_dtype dtype);

/* ---- reading ------------------------------------------------------------------------------- */

typedef struct ts_gguf ts_gguf;

ts_status ts_gguf_open(const char *path, ts_gguf **out);
/* Same checks over a buffer the caller keeps alive (and unchanged) until ts_gguf_close; name is
 * used in messages. Tests and the fuzzer use it; so can a GGUF embedded in another file. */
ts_status ts_gguf_open_buffer(const void *data, size_t size, const char *name, ts_gguf **out);
void ts_gguf_close(ts_gguf *g); /* NULL is fine */

const char *ts_gguf_path(const ts_gguf *g);
uint32_t ts_gguf_version(const ts_gguf *g);
uint32_t ts_gguf_alignment(const ts_gguf *g);
uint64_t ts_gguf_data_offset(const ts_gguf *g); /* file offset of the tensor data section */

/* Metadata by index, in file order (for dumps and generic tools). */
size_t ts_gguf_n_kv(const ts_gguf *g);
int64_t ts_gguf_find_key(const ts_gguf *g, const char *key); /* index, or -1 when absent */
const char *ts_gguf_kv_key(const ts_gguf *g, int64_t i);     /* NULL when out of range */
ts_gguf_type ts_gguf_kv_type(const ts_gguf *g, int64_t i);   /* TS_GGUF_TYPE_COUNT if bad i */

/* A value as stored. Scalars: data points at the little-endian bytes in the file (unaligned; n is
 * 1). Strings: data is a NUL-terminated copy, n its length in bytes (it may hold NULs). Arrays:
 * elem and n give the element type and count; numeric and bool elements are the raw
 * little-endian bytes in the file (unaligned: copy with memcpy); string arrays have data NULL
 * (use ts_gguf_kv_str_item). */
typedef struct {
    ts_gguf_type type;
    ts_gguf_type elem; /* arrays only */
    uint64_t n;
    const void *data;
} ts_gguf_value;
ts_status ts_gguf_kv_value(const ts_gguf *g, int64_t i, ts_gguf_value *out);
/* Item j of the string array at index i, O(1): bytes in the mapping, not NUL-terminated. */
ts_status ts_gguf_kv_str_item(const ts_gguf *g, int64_t i, uint64_t j, const char **s, size_t *len);

/* Typed metadata by key. Required getters fail with TS_ERR_FORMAT naming the file and the key
 * when it is missing, of the wrong type or out of range:
 *   model.gguf: key 'gemma3.block_count': expected an integer, got STRING
 * Integer getters accept any integer type whose value fits; float getters FLOAT32 or FLOAT64.
 * _opt getters store dflt only when the key is absent; a present value must still be right. */
bool ts_gguf_has(const ts_gguf *g, const char *key);
ts_status ts_gguf_get_u32(const ts_gguf *g, const char *key, uint32_t *out);
ts_status ts_gguf_get_i32(const ts_gguf *g, const char *key, int32_t *out);
ts_status ts_gguf_get_u64(const ts_gguf *g, const char *key, uint64_t *out);
ts_status ts_gguf_get_i64(const ts_gguf *g, const char *key, int64_t *out);
ts_status ts_gguf_get_f32(const ts_gguf *g, const char *key, float *out);
ts_status ts_gguf_get_f64(const ts_gguf *g, const char *key, double *out);
ts_status ts_gguf_get_bool(const ts_gguf *g, const char *key, bool *out);
/* NUL-terminated; len (may be NULL) gets the byte length. A string holding a NUL byte is refused
 * here (a caller would see it cut short); ts_gguf_kv_value still returns it whole. */
ts_status ts_gguf_get_str(const ts_gguf *g, const char *key, const char **out, size_t *len);
ts_status ts_gguf_get_u32_opt(const ts_gguf *g, const char *key, uint32_t dflt, uint32_t *out);
ts_status ts_gguf_get_f32_opt(const ts_gguf *g, const char *key, float dflt, float *out);
ts_status ts_gguf_get_bool_opt(const ts_gguf *g, const char *key, bool dflt, bool *out);
ts_status ts_gguf_get_str_opt(const ts_gguf *g, const char *key, const char *dflt,
                              const char **out);

/* Any array: element type, count, and for numeric/bool elements the raw little-endian bytes
 * (unaligned; NULL for string arrays). */
ts_status ts_gguf_get_arr(const ts_gguf *g, const char *key, ts_gguf_type *elem, uint64_t *n,
                          const void **data);
/* Numeric arrays converted: *n gets the length, dst[0..min(n, cap)) the values (dst may be NULL
 * when cap is 0). _i32 takes any integer element type and checks every element fits, even past
 * cap; _f32 takes FLOAT32 or FLOAT64. */
ts_status ts_gguf_get_arr_i32(const ts_gguf *g, const char *key, int32_t *dst, uint64_t cap,
                              uint64_t *n);
ts_status ts_gguf_get_arr_f32(const ts_gguf *g, const char *key, float *dst, uint64_t cap,
                              uint64_t *n);
/* Item i of a string array (tokenizer vocabularies, merges), O(1); not NUL-terminated. *n_items
 * (may be NULL) gets the array length. i past the end is TS_ERR_RANGE. */
ts_status ts_gguf_get_str_arr_item(const ts_gguf *g, const char *key, uint64_t i, const char **s,
                                   size_t *len, uint64_t *n_items);

/* Tensors. Index order is file order; lookups by name are binary searches. */
size_t ts_gguf_n_tensors(const ts_gguf *g);
const char *ts_gguf_tensor_name(const ts_gguf *g, size_t i); /* NULL when out of range */
/* NULL when absent or of a type tessera does not compute with. */
const ts_tensor *ts_gguf_find(const ts_gguf *g, const char *name);
/* Like ts_gguf_find, but says why: TS_ERR_FORMAT "tensor 'x': missing", or TS_ERR_UNSUPPORTED
 * naming the tensor and its ggml type. */
ts_status ts_gguf_tensor(const ts_gguf *g, const char *name, const ts_tensor **out);

typedef struct {
    const char *name;
    uint32_t ggml_type;
    const char *type_name; /* ts_gguf_ggml_type_name(ggml_type) */
    int n_dims;
    int64_t ne[TS_GGUF_MAX_DIMS]; /* innermost first, as stored; unused are 1 */
    uint64_t offset;              /* absolute byte offset of the data in the file */
    uint64_t nbytes;
    const void *data;        /* the bytes in the file, whatever the type (copying through) */
    const ts_tensor *tensor; /* NULL when the type is not loadable */
} ts_gguf_tensor_info;
ts_status ts_gguf_tensor_info_at(const ts_gguf *g, size_t i, ts_gguf_tensor_info *out);

/* ---- writing ------------------------------------------------------------------------------- */

/* Streams one GGUF v3 file. Set metadata (kv_*) and declare every tensor (add_tensor), then
 * begin (writes the header and the tensor infos), then write each tensor's bytes in declaration
 * order (any number of write calls; a call may span tensors; the writer inserts the alignment
 * padding), then end (checks that every byte came, fsyncs, renames path.tmp to path). Any
 * failure, or free before end, deletes the temp file. Keys are written in the order set, tensor
 * infos in the order declared. alignment 0 means the default 32; another value is written as
 * `general.alignment` (UINT32) and must be a power of two up to 1 MiB. */
typedef struct ts_gguf_writer ts_gguf_writer;
ts_status ts_gguf_writer_new(ts_gguf_writer **out, uint32_t alignment);
void ts_gguf_writer_free(ts_gguf_writer *w);

/* Keys: 1..65535 printable ASCII bytes, no spaces, each set once; `general.alignment` belongs to
 * the writer. */
ts_status ts_gguf_writer_kv_u8(ts_gguf_writer *w, const char *key, uint8_t v);
ts_status ts_gguf_writer_kv_i8(ts_gguf_writer *w, const char *key, int8_t v);
ts_status ts_gguf_writer_kv_u16(ts_gguf_writer *w, const char *key, uint16_t v);
ts_status ts_gguf_writer_kv_i16(ts_gguf_writer *w, const char *key, int16_t v);
ts_status ts_gguf_writer_kv_u32(ts_gguf_writer *w, const char *key, uint32_t v);
ts_status ts_gguf_writer_kv_i32(ts_gguf_writer *w, const char *key, int32_t v);
ts_status ts_gguf_writer_kv_u64(ts_gguf_writer *w, const char *key, uint64_t v);
ts_status ts_gguf_writer_kv_i64(ts_gguf_writer *w, const char *key, int64_t v);
ts_status ts_gguf_writer_kv_f32(ts_gguf_writer *w, const char *key, float v);
ts_status ts_gguf_writer_kv_f64(ts_gguf_writer *w, const char *key, double v);
ts_status ts_gguf_writer_kv_bool(ts_gguf_writer *w, const char *key, bool v);
ts_status ts_gguf_writer_kv_str(ts_gguf_writer *w, const char *key, const char *s);
ts_status ts_gguf_writer_kv_strn(ts_gguf_writer *w, const char *key, const char *s, size_t len);
/* Numeric or bool array: data holds n host values of elem's C type (uint8_t ... double; bool as
 * bool). */
ts_status ts_gguf_writer_kv_arr(ts_gguf_writer *w, const char *key, ts_gguf_type elem,
                                const void *data, uint64_t n);
/* String array; lens may be NULL (then each item is NUL-terminated). */
ts_status ts_gguf_writer_kv_str_arr(ts_gguf_writer *w, const char *key, const char *const *items,
                                    const size_t *lens, uint64_t n);

/* shape is outermost-first (written as ne reversed); 0..4 dims; the innermost dimension must be
 * a whole number of blocks for quantized types. Names: 1..63 bytes, no NUL (llama.cpp's limit). */
ts_status ts_gguf_writer_add_tensor(ts_gguf_writer *w, const char *name, ts_dtype dtype, int n_dims,
                                    const int64_t *shape);
/* The same for any ggml type id the reader knows (Q5_K, I32, ...), e.g. to copy a tensor through
 * unchanged. */
ts_status ts_gguf_writer_add_tensor_ggml(ts_gguf_writer *w, const char *name, uint32_t ggml_type,
                                         int n_dims, const int64_t *shape);
ts_status ts_gguf_writer_begin(ts_gguf_writer *w, const char *path);
ts_status ts_gguf_writer_write(ts_gguf_writer *w, const void *data, size_t nbytes);
ts_status ts_gguf_writer_end(ts_gguf_writer *w);

#endif
