/* safetensors reader (mmap + strict header validation) and streaming writer.
 *
 * Layout of a file: u64 little-endian header length N, N bytes of JSON (an object mapping tensor
 * name -> {dtype, shape, data_offsets}, plus an optional "__metadata__"), then the data area.
 * data_offsets are relative to the start of the data area. */
#include "format/safetensors.h"

#include "base/mmapfile.h"
#include "format/tensor_stream.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Far above any real header (a few thousand tensors need well under 1 MiB), yet a corrupt length
 * can never make us hand jansson gigabytes. */
#define ST_HEADER_CAP  ((uint64_t)100 << 20)
#define ST_INDEX_CAP   ((size_t)64 << 20)
#define ST_INDEX_NAME  "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"

typedef struct {
    char *path;  /* as opened, for messages and ts_st_file_of */
    char *shard; /* file name as the index spells it (NULL for a lone file) */
    ts_mmap map;
} st_file;

typedef struct {
    char *name;
    int file;            /* index into ts_st.files */
    uint64_t begin, end; /* byte span relative to the file's data area */
    ts_tensor t;
    const char *refusal; /* non-NULL: well-formed but not loadable (dtype or rank) */
    char dtype_name[16];
    size_t n_dims;
} st_entry;

struct ts_st {
    st_file *files;
    int n_files;
    st_entry *entries; /* sorted by name once open succeeds */
    size_t n, cap;
};

/* Every dtype the safetensors format defines, so a foreign-but-valid file is told apart from a
 * corrupt one (TS_ERR_UNSUPPORTED vs TS_ERR_FORMAT). */
static const struct {
    const char *name;
    int size;
    int dtype; /* ts_dtype, or -1 when we cannot compute with it */
} st_dtypes[] = {
    {"F32", 4, TS_DTYPE_F32},
    {"F16", 2, TS_DTYPE_F16},
    {"BF16", 2, TS_DTYPE_BF16},
    {"F64", 8, -1},
    {"I64", 8, -1},
    {"U64", 8, -1},
    {"I32", 4, -1},
    {"U32", 4, -1},
    {"I16", 2, -1},
    {"U16", 2, -1},
    {"I8", 1, -1},
    {"U8", 1, -1},
    {"BOOL", 1, -1},
    {"F8_E4M3", 1, -1},
    {"F8_E5M2", 1, -1},
    {"F8_E8M0", 1, -1},
};

static char *st_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static char *st_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a == 0 || dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

/* A short rendering of a JSON value for "got ..." in messages. */
static const char *st_brief(const json_t *v, char *buf, size_t size) {
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!s) {
        snprintf(buf, size, "?");
        return buf;
    }
    if (strlen(s) >= size && size > 4)
        snprintf(buf, size, "%.*s...", (int)(size - 4), s);
    else
        snprintf(buf, size, "%s", s);
    free(s);
    return buf;
}

static bool st_nonneg_int(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

/* ---- reading ------------------------------------------------------------------------------ */

/* Validates one header entry against the data area; fills e except name/file/data. */
static ts_status st_parse_entry(const char *path, const char *name, const json_t *v,
                                uint64_t data_size, st_entry *e) {
    char got[64];
    memset(e, 0, sizeof *e);
    if (!json_is_object(v))
        return ts_error(TS_ERR_FORMAT, "%s: tensor '%s': entry is not an object (got %s)", path,
                        name, st_brief(v, got, sizeof got));

    const json_t *dt = json_object_get(v, "dtype");
    if (!dt) return ts_error(TS_ERR_FORMAT, "%s: tensor '%s': field 'dtype': missing", path, name);
    if (!json_is_string(dt))
        return ts_error(TS_ERR_FORMAT, "%s: tensor '%s': field 'dtype': expected a string, got %s",
                        path, name, st_brief(dt, got, sizeof got));
    const char *ds = json_string_value(dt);
    int esize = 0, dtype = -1;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) {
        if (strcmp(ds, st_dtypes[i].name) == 0) {
            esize = st_dtypes[i].size;
            dtype = st_dtypes[i].dtype;
            snprintf(e->dtype_name, sizeof e->dtype_name, "%s", st_dtypes[i].name);
            break;
        }
    }
    if (!esize)
        return ts_error(TS_ERR_FORMAT, "%s: tensor '%s': field 'dtype': unknown dtype %s", path,
                        name, st_brief(dt, got, sizeof got));

    const json_t *sh = json_object_get(v, "shape");
    if (!sh) return ts_error(TS_ERR_FORMAT, "%s: tensor '%s': field 'shape': missing", path, name);
    if (!json_is_array(sh))
        return ts_error(TS_ERR_FORMAT, "%s: tensor '%s': field 'shape': expected an array, got %s",
                        path, name, st_brief(sh, got, sizeof got));
    size_t nd = json_array_size(sh);
    uint64_t dims[TS_MAX_DIMS];
    bool any_zero = false;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (!st_nonneg_int(json_array_get(sh, i), &d))
            return ts_error(TS_ERR_FORMAT,
                            "%s: tensor '%s': field 'shape': dimension %zu is %s, expected a "
                            "non-negative integer",
                            path, name, i, st_brief(json_array_get(sh, i), got, sizeof got));
        if (d == 0) any_zero = true;
        if (i < TS_MAX_DIMS) dims[i] = d;
    }
    /* A zero dimension makes the product 0 whatever the others are; otherwise multiply with an
     * overflow check, including the final × element size. */
    uint64_t elems = 1, bytes = 0;
    if (any_zero) {
        elems = 0;
    } else {
        for (size_t i = 0; i < nd; i++) {
            uint64_t d = (uint64_t)json_integer_value(json_array_get(sh, i));
            if (elems > UINT64_MAX / d)
                return ts_error(TS_ERR_FORMAT,
                                "%s: tensor '%s': field 'shape': element count overflows 64 bits",
                                path, name);
            elems *= d;
        }
        if (elems > UINT64_MAX / (uint64_t)esize)
            return ts_error(TS_ERR_FORMAT,
                            "%s: tensor '%s': field 'shape': byte size overflows 64 bits", path,
                            name);
    }
    bytes = elems * (uint64_t)esize;

    const json_t *off = json_object_get(v, "data_offsets");
    if (!off)
        return ts_error(TS_ERR_FORMAT, "%s: tensor '%s': field 'data_offsets': missing", path,
                        name);
    if (!json_is_array(off) || json_array_size(off) != 2)
        return ts_error(TS_ERR_FORMAT,
                        "%s: tensor '%s': field 'data_offsets': expected [begin, end], got %s",
                        path, name, st_brief(off, got, sizeof got));
    uint64_t b, en;
    if (!st_nonneg_int(json_array_get(off, 0), &b))
        return ts_error(TS_ERR_FORMAT,
                        "%s: tensor '%s': field 'data_offsets': begin is %s, expected a "
                        "non-negative integer",
                        path, name, st_brief(json_array_get(off, 0), got, sizeof got));
    if (!st_nonneg_int(json_array_get(off, 1), &en))
        return ts_error(TS_ERR_FORMAT,
                        "%s: tensor '%s': field 'data_offsets': end is %s, expected a "
                        "non-negative integer",
                        path, name, st_brief(json_array_get(off, 1), got, sizeof got));
    if (en < b)
        return ts_error(TS_ERR_FORMAT,
                        "%s: tensor '%s': field 'data_offsets': end %" PRIu64
                        " is before begin %" PRIu64,
                        path, name, en, b);
    if (en > data_size)
        return ts_error(TS_ERR_FORMAT,
                        "%s: tensor '%s': field 'data_offsets': end %" PRIu64
                        " is beyond the data area (%" PRIu64 " bytes; file truncated?)",
                        path, name, en, data_size);
    if (en - b != bytes)
        return ts_error(TS_ERR_FORMAT,
                        "%s: tensor '%s': field 'data_offsets': span of %" PRIu64
                        " bytes does not match the shape (%" PRIu64 " elements x %d bytes)",
                        path, name, en - b, elems, esize);

    e->begin = b;
    e->end = en;
    e->n_dims = nd;
    if (dtype < 0) {
        e->refusal = "dtype";
    } else if (nd > TS_MAX_DIMS) {
        e->refusal = "rank";
    } else {
        e->t.dtype = (ts_dtype)dtype;
        e->t.n_dims = (int)nd;
        for (int i = 0; i < TS_MAX_DIMS; i++)
            e->t.shape[i] = (size_t)i < nd ? (int64_t)dims[i] : 1;
        e->t.nbytes = bytes;
    }
    return TS_OK;
}

static int st_cmp_offset(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Tensors of one file must not share bytes. Empty tensors occupy nothing, so they never clash. */
static ts_status st_check_overlap(const char *path, st_entry *e, size_t n) {
    if (n > 1) qsort(e, n, sizeof *e, st_cmp_offset);
    const st_entry *reach = NULL; /* the non-empty tensor ending furthest so far */
    for (size_t i = 0; i < n; i++) {
        if (e[i].begin == e[i].end) continue;
        if (reach && e[i].begin < reach->end)
            return ts_error(TS_ERR_FORMAT,
                            "%s: tensor '%s' [%" PRIu64 ", %" PRIu64
                            ") overlaps tensor '%s' [%" PRIu64 ", %" PRIu64 ")",
                            path, e[i].name, e[i].begin, e[i].end, reach->name, reach->begin,
                            reach->end);
        if (!reach || e[i].end > reach->end) reach = &e[i];
    }
    return TS_OK;
}

static ts_status st_push(ts_st *st, const st_entry *e, const char *name) {
    if (st->n == st->cap) {
        size_t nc = st->cap ? st->cap * 2 : 64;
        st_entry *ne = realloc(st->entries, nc * sizeof *ne);
        if (!ne) return ts_error(TS_ERR_NOMEM, "safetensors: out of memory");
        st->entries = ne;
        st->cap = nc;
    }
    st_entry *d = &st->entries[st->n];
    *d = *e;
    d->name = st_strdup(name);
    if (!d->name) return ts_error(TS_ERR_NOMEM, "safetensors: out of memory");
    st->n++;
    return TS_OK;
}

/* Maps files[fi] and appends its validated tensors to st->entries. */
static ts_status st_load_file(ts_st *st, int fi) {
    st_file *f = &st->files[fi];
    TS_TRY(ts_mmap_open(f->path, &f->map));
    const unsigned char *p = f->map.data;
    size_t size = f->map.size;
    if (size < 8)
        return ts_error(TS_ERR_FORMAT,
                        "%s: file is %zu bytes, shorter than the 8-byte header length", f->path,
                        size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | p[i];
    if (hlen > ST_HEADER_CAP)
        return ts_error(TS_ERR_FORMAT,
                        "%s: header length %" PRIu64 " exceeds the %" PRIu64 "-byte cap", f->path,
                        hlen, ST_HEADER_CAP);
    if (hlen > size - 8)
        return ts_error(TS_ERR_FORMAT,
                        "%s: header length %" PRIu64
                        " exceeds the %zu bytes after the length field (file truncated?)",
                        f->path, hlen, size - 8);

    json_error_t jerr;
    json_t *root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root && json_error_code(&jerr) == json_error_duplicate_key)
        return ts_error(TS_ERR_FORMAT, "%s: header JSON names a tensor twice (byte %d: %s)",
                        f->path, 8 + jerr.position, jerr.text);
    if (!root)
        return ts_error(TS_ERR_FORMAT, "%s: header JSON is malformed at byte %d: %s", f->path,
                        8 + jerr.position, jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return ts_error(TS_ERR_FORMAT, "%s: header JSON is not an object", f->path);
    }

    const unsigned char *data = p + 8 + hlen;
    uint64_t data_size = size - 8 - hlen;
    size_t first = st->n;
    ts_status rc = TS_OK;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        st_entry e;
        rc = st_parse_entry(f->path, key, val, data_size, &e);
        if (rc != TS_OK) break;
        e.file = fi;
        e.t.data = data + e.begin;
        rc = st_push(st, &e, key);
        if (rc != TS_OK) break;
    }
    json_decref(root);
    if (rc != TS_OK) return rc;
    /* A file of no tensors leaves entries NULL, and NULL + 0 is undefined behaviour in C. */
    if (st->n > first) TS_TRY(st_check_overlap(f->path, st->entries + first, st->n - first));

    /* Only a well-formed file gets this far, so "unsupported" never masks corruption. */
    for (size_t i = first; i < st->n; i++) {
        const st_entry *e = &st->entries[i];
        if (!e->refusal) continue;
        if (strcmp(e->refusal, "dtype") == 0)
            return ts_error(TS_ERR_UNSUPPORTED,
                            "%s: tensor '%s': dtype %s is not supported (F32, F16, BF16 are)",
                            f->path, e->name, e->dtype_name);
        return ts_error(TS_ERR_UNSUPPORTED,
                        "%s: tensor '%s': %zu dimensions, at most %d are supported", f->path,
                        e->name, e->n_dims, TS_MAX_DIMS);
    }
    return TS_OK;
}

static ts_status st_add_file(ts_st *st, const char *path, const char *shard, int *index) {
    st_file *nf = realloc(st->files, (size_t)(st->n_files + 1) * sizeof *nf);
    if (!nf) return ts_error(TS_ERR_NOMEM, "safetensors: out of memory");
    st->files = nf;
    st_file *f = &st->files[st->n_files];
    memset(f, 0, sizeof *f);
    f->path = st_strdup(path);
    f->shard = shard ? st_strdup(shard) : NULL;
    st->n_files++;
    if (!f->path || (shard && !f->shard))
        return ts_error(TS_ERR_NOMEM, "safetensors: out of memory");
    if (index) *index = st->n_files - 1;
    return st_load_file(st, st->n_files - 1);
}

static int st_cmp_name(const void *a, const void *b) {
    return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

static int st_cmp_key(const void *key, const void *elem) {
    return strcmp((const char *)key, ((const st_entry *)elem)->name);
}

/* Sorts by name for bsearch and ts_st_name; a name twice means two shards claim it. */
static ts_status st_finish(ts_st *st) {
    if (st->n > 1) qsort(st->entries, st->n, sizeof *st->entries, st_cmp_name);
    for (size_t i = 1; i < st->n; i++) {
        const st_entry *a = &st->entries[i - 1], *b = &st->entries[i];
        if (strcmp(a->name, b->name) == 0)
            return ts_error(TS_ERR_FORMAT, "tensor '%s' appears in both %s and %s", a->name,
                            st->files[a->file].path, st->files[b->file].path);
    }
    return TS_OK;
}

static const st_entry *st_lookup(const ts_st *st, const char *name) {
    if (!st || !name || !st->n) return NULL;
    return bsearch(name, st->entries, st->n, sizeof *st->entries, st_cmp_key);
}

/* A shard must name a file directly inside the checkpoint directory, never a path out of it. */
static bool st_plain_name(const char *s) {
    return s[0] && strchr(s, '/') == NULL && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static ts_status st_open_index(ts_st *st, const char *dir, const char *ipath) {
    char *buf;
    size_t len;
    TS_TRY(ts_read_file(ipath, ST_INDEX_CAP, &buf, &len));
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    free(buf);
    if (!root)
        return ts_error(TS_ERR_FORMAT, "%s: JSON is malformed at byte %d: %s", ipath, jerr.position,
                        jerr.text);
    ts_status rc = TS_OK;
    char got[64];
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(root)) {
        rc = ts_error(TS_ERR_FORMAT, "%s: not a JSON object", ipath);
    } else if (!wm) {
        rc = ts_error(TS_ERR_FORMAT, "%s: field 'weight_map': missing", ipath);
    } else if (!json_is_object(wm)) {
        rc = ts_error(TS_ERR_FORMAT, "%s: field 'weight_map': expected an object, got %s", ipath,
                      st_brief(wm, got, sizeof got));
    } else if (json_object_size(wm) == 0) {
        rc = ts_error(TS_ERR_FORMAT, "%s: field 'weight_map': lists no tensors", ipath);
    }
    const char *key;
    json_t *val;
    if (rc == TS_OK) {
        /* Check every shard name before opening any file. */
        json_object_foreach(wm, key, val) {
            if (!json_is_string(val)) {
                rc = ts_error(TS_ERR_FORMAT,
                              "%s: weight_map: tensor '%s': expected a shard file name, got %s",
                              ipath, key, st_brief(val, got, sizeof got));
                break;
            }
            if (!st_plain_name(json_string_value(val))) {
                rc = ts_error(TS_ERR_FORMAT,
                              "%s: weight_map: tensor '%s': shard '%s' is not a plain file name "
                              "in the directory",
                              ipath, key, json_string_value(val));
                break;
            }
        }
    }
    if (rc == TS_OK) {
        json_object_foreach(wm, key, val) {
            const char *shard = json_string_value(val);
            bool seen = false;
            for (int i = 0; i < st->n_files && !seen; i++)
                seen = strcmp(st->files[i].shard, shard) == 0;
            if (seen) continue;
            char *spath = st_join(dir, shard);
            if (!spath) {
                rc = ts_error(TS_ERR_NOMEM, "safetensors: out of memory");
                break;
            }
            rc = st_add_file(st, spath, shard, NULL);
            free(spath);
            if (rc != TS_OK) break;
        }
    }
    if (rc == TS_OK) rc = st_finish(st);
    if (rc == TS_OK) {
        json_object_foreach(wm, key, val) {
            const char *shard = json_string_value(val);
            const st_entry *e = st_lookup(st, key);
            if (!e) {
                rc = ts_error(TS_ERR_FORMAT,
                              "%s: weight_map: tensor '%s' is mapped to %s, which does not "
                              "contain it",
                              ipath, key, shard);
                break;
            }
            if (strcmp(st->files[e->file].shard, shard) != 0) {
                rc = ts_error(TS_ERR_FORMAT,
                              "%s: weight_map: tensor '%s' is mapped to %s but is stored in %s",
                              ipath, key, shard, st->files[e->file].shard);
                break;
            }
        }
    }
    json_decref(root);
    return rc;
}

static bool st_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static ts_status st_open_dir(ts_st *st, const char *dir) {
    char *ipath = st_join(dir, ST_INDEX_NAME);
    char *spath = st_join(dir, ST_SINGLE_NAME);
    ts_status rc;
    if (!ipath || !spath)
        rc = ts_error(TS_ERR_NOMEM, "safetensors: out of memory");
    else if (st_exists(ipath))
        rc = st_open_index(st, dir, ipath);
    else if (st_exists(spath)) {
        rc = st_add_file(st, spath, NULL, NULL);
        if (rc == TS_OK) rc = st_finish(st);
    } else
        rc = ts_error(TS_ERR_IO, "%s: no " ST_SINGLE_NAME " or " ST_INDEX_NAME " in the directory",
                      dir);
    free(ipath);
    free(spath);
    return rc;
}

ts_status ts_st_open(const char *path, ts_st **out) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return ts_error(TS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    ts_st *st = calloc(1, sizeof *st);
    if (!st) return ts_error(TS_ERR_NOMEM, "safetensors: out of memory");
    ts_status rc;
    if (S_ISDIR(sb.st_mode)) {
        rc = st_open_dir(st, path);
    } else {
        rc = st_add_file(st, path, NULL, NULL);
        if (rc == TS_OK) rc = st_finish(st);
    }
    if (rc != TS_OK) {
        ts_st_close(st);
        return rc;
    }
    *out = st;
    return TS_OK;
}

void ts_st_close(ts_st *st) {
    if (!st) return;
    for (size_t i = 0; i < st->n; i++)
        free(st->entries[i].name);
    free(st->entries);
    for (int i = 0; i < st->n_files; i++) {
        ts_mmap_close(&st->files[i].map);
        free(st->files[i].path);
        free(st->files[i].shard);
    }
    free(st->files);
    free(st);
}

const ts_tensor *ts_st_find(const ts_st *st, const char *name) {
    const st_entry *e = st_lookup(st, name);
    return e ? &e->t : NULL;
}

const char *ts_st_file_of(const ts_st *st, const char *name) {
    const st_entry *e = st_lookup(st, name);
    return e ? st->files[e->file].path : NULL;
}

size_t ts_st_count(const ts_st *st) { return st ? st->n : 0; }

const char *ts_st_name(const ts_st *st, size_t i) {
    return st && i < st->n ? st->entries[i].name : NULL;
}

/* ---- writing ------------------------------------------------------------------------------ */

typedef struct {
    char *name;
    ts_dtype dtype;
    int n_dims;
    int64_t shape[TS_MAX_DIMS];
    uint64_t nbytes;
} stw_tensor;

enum { STW_DECLARING, STW_WRITING, STW_DONE, STW_FAILED };

struct ts_st_writer {
    stw_tensor *t;
    size_t n, cap;
    uint64_t total; /* bytes of the data area */
    int state;
    ts_tstream out; /* the file, from begin */
};

ts_status ts_st_writer_new(ts_st_writer **out) {
    *out = calloc(1, sizeof **out);
    return *out ? TS_OK : ts_error(TS_ERR_NOMEM, "safetensors writer: out of memory");
}

ts_status ts_st_writer_add(ts_st_writer *w, const char *name, ts_dtype dtype, int n_dims,
                           const int64_t *shape) {
    if (w->state != STW_DECLARING)
        return ts_error(TS_ERR_INVALID, "safetensors writer: add after begin");
    if (!name || !name[0] || strcmp(name, "__metadata__") == 0)
        return ts_error(TS_ERR_INVALID, "safetensors writer: invalid tensor name '%s'",
                        name ? name : "(null)");
    json_t *probe = json_string(name); /* NULL unless valid UTF-8 */
    if (!probe)
        return ts_error(TS_ERR_INVALID, "safetensors writer: tensor name is not valid UTF-8");
    json_decref(probe);
    if (dtype != TS_DTYPE_F32 && dtype != TS_DTYPE_F16 && dtype != TS_DTYPE_BF16)
        return ts_error(TS_ERR_UNSUPPORTED,
                        "safetensors writer: tensor '%s': dtype %s cannot be stored", name,
                        ts_dtype_name(dtype));
    if (n_dims < 0 || n_dims > TS_MAX_DIMS || (n_dims > 0 && !shape))
        return ts_error(TS_ERR_INVALID, "safetensors writer: tensor '%s': %d dimensions", name,
                        n_dims);
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return ts_error(TS_ERR_INVALID, "safetensors writer: tensor '%s' declared twice", name);
    uint64_t bytes = (uint64_t)ts_dtype_block_bytes(dtype);
    for (int i = 0; i < n_dims; i++) {
        if (shape[i] < 0)
            return ts_error(TS_ERR_INVALID,
                            "safetensors writer: tensor '%s': dimension %d is %" PRId64, name, i,
                            shape[i]);
        uint64_t d = (uint64_t)shape[i];
        if (d && bytes > (uint64_t)INT64_MAX / d)
            return ts_error(TS_ERR_INVALID, "safetensors writer: tensor '%s': size overflows",
                            name);
        bytes *= d;
    }
    if (bytes > (uint64_t)INT64_MAX - w->total)
        return ts_error(TS_ERR_INVALID, "safetensors writer: tensor '%s': file size overflows",
                        name);
    if (w->n == w->cap) {
        size_t nc = w->cap ? w->cap * 2 : 64;
        stw_tensor *nt = realloc(w->t, nc * sizeof *nt);
        if (!nt) return ts_error(TS_ERR_NOMEM, "safetensors writer: out of memory");
        w->t = nt;
        w->cap = nc;
    }
    stw_tensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    t->name = st_strdup(name);
    if (!t->name) return ts_error(TS_ERR_NOMEM, "safetensors writer: out of memory");
    t->dtype = dtype;
    t->n_dims = n_dims;
    for (int i = 0; i < n_dims; i++)
        t->shape[i] = shape[i];
    t->nbytes = bytes;
    w->total += bytes;
    w->n++;
    return TS_OK;
}

/* Header JSON in declaration order with contiguous offsets. jansson keeps insertion order. */
static char *stw_header(const ts_st_writer *w) {
    json_t *root = json_object();
    if (!root) return NULL;
    bool ok = json_object_set_new(root, "__metadata__", json_pack("{s:s}", "format", "pt")) == 0;
    uint64_t off = 0;
    for (size_t i = 0; ok && i < w->n; i++) {
        const stw_tensor *t = &w->t[i];
        json_t *shape = json_array();
        ok = shape != NULL;
        for (int d = 0; ok && d < t->n_dims; d++)
            ok = json_array_append_new(shape, json_integer(t->shape[d])) == 0;
        if (!ok) {
            json_decref(shape);
            break;
        }
        json_t *e =
            json_pack("{s:s, s:o, s:[I,I]}", "dtype", ts_dtype_name(t->dtype), "shape", shape,
                      "data_offsets", (json_int_t)off, (json_int_t)(off + t->nbytes));
        ok = e && json_object_set_new(root, t->name, e) == 0;
        off += t->nbytes;
    }
    char *s = ok ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    return s;
}

ts_status ts_st_writer_begin(ts_st_writer *w, const char *path) {
    if (w->state != STW_DECLARING)
        return ts_error(TS_ERR_INVALID, "safetensors writer: begin called twice");
    char *hdr = stw_header(w);
    ts_tstream_tensor *ts = malloc((w->n ? w->n : 1) * sizeof *ts);
    if (!hdr || !ts) {
        free(hdr);
        free(ts);
        return ts_error(TS_ERR_NOMEM, "%s: cannot build the header", path);
    }
    for (size_t i = 0; i < w->n; i++) ts[i] = (ts_tstream_tensor){w->t[i].name, w->t[i].nbytes};
    ts_status st = ts_tstream_open(&w->out, path, ts, w->n, 1, "safetensors writer");
    free(ts);
    /* Padding the header to a multiple of 8 keeps the data area 8-byte aligned in the file. */
    size_t hl = strlen(hdr), padded = (hl + 7) & ~(size_t)7;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    static const char spaces[8] = "        ";
    if (st == TS_OK) st = ts_tstream_put(&w->out, len8, 8, "header");
    if (st == TS_OK) st = ts_tstream_put(&w->out, hdr, hl, "header");
    if (st == TS_OK) st = ts_tstream_put(&w->out, spaces, padded - hl, "header");
    free(hdr);
    w->state = st == TS_OK ? STW_WRITING : STW_FAILED;
    return st;
}

ts_status ts_st_writer_write(ts_st_writer *w, const void *data, size_t nbytes) {
    if (w->state != STW_WRITING)
        return ts_error(TS_ERR_INVALID, "safetensors writer: write outside begin/end");
    ts_status st = ts_tstream_write(&w->out, data, nbytes);
    if (st != TS_OK) w->state = STW_FAILED;
    return st;
}

ts_status ts_st_writer_end(ts_st_writer *w) {
    if (w->state != STW_WRITING)
        return ts_error(TS_ERR_INVALID, "safetensors writer: end without begin");
    ts_status st = ts_tstream_end(&w->out);
    w->state = st == TS_OK ? STW_DONE : STW_FAILED;
    return st;
}

void ts_st_writer_free(ts_st_writer *w) {
    if (!w) return;
    ts_tstream_free(&w->out);
    for (size_t i = 0; i < w->n; i++)
        free(w->t[i].name);
    free(w->t);
    free(w);
}
