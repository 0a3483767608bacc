/* ts_quantize_model: a Hugging Face checkpoint or a GGUF file to a GGUF file in llama.cpp's
 * conventions, with weights in F32 / F16 / BF16, Q8_0, Q4_0 or the Q4_K_M mixture.
 *
 * Each tensor's type is picked by llama.cpp's rules (llama-quant.cpp): only 2-D tensors whose
 * names end in "weight" are quantized (not norms, not ssm_conv1d); the output head (the token
 * embedding when tied) goes to Q6_K unless the file is Q8_0; Q4_K_M adds Q6_K for attn_v /
 * attn_qkv and ffn_down on the layers use_more_bits picks; a row length that is not a whole
 * number of blocks falls back (Q4_K -> Q5_0, Q6_K -> Q8_0, else F16). The conversion runs over
 * a thread pool in chunks of rows, so memory stays bounded whatever the model's size. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/cpu/quant.h"
#include "base/threadpool.h"
#include "model/quantize.h"
#include "model/quantize_vocab.h"

#define QZ_CHUNK_BYTES (16u << 20)
#define QZ_MAX_THREADS 256

enum { GGML_F32 = 0, GGML_F16 = 1 };

typedef struct {
    const char *name;
    ts_dtype base;       /* the type of most weights */
    bool k_mix;          /* Q4_K_M's extra rules */
    uint32_t file_type;  /* llama.cpp's llama_ftype, for general.file_type */
} qz_ftype;

static const qz_ftype ftypes[] = {
    {"f32", TS_DTYPE_F32, false, 0},     {"f16", TS_DTYPE_F16, false, 1},
    {"bf16", TS_DTYPE_BF16, false, 32},  {"q8_0", TS_DTYPE_Q8_0, false, 7},
    {"q4_0", TS_DTYPE_Q4_0, false, 2},   {"q4_k_m", TS_DTYPE_Q4_K, true, 15},
};

/* ---- the plan ------------------------------------------------------------------------------ */

int64_t *qz_new_map(int64_t n) { return malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t)); }

void qz_tiled_from_grouped(int64_t *map, int n_k_heads, int n_v_heads, int hd) {
    int r = n_v_heads / n_k_heads;
    for (int64_t i = 0; i < (int64_t)n_v_heads * hd; i++) {
        int64_t head = i / hd; /* tiled: head = j * Hk + g */
        int64_t g = head % n_k_heads, j = head / n_k_heads;
        map[i] = (g * r + j) * hd + i % hd;
    }
}

ts_status qz_add(qz_plan *p, const char *name, int layer, const ts_tensor *src, int n_dims,
                 int64_t rows, int64_t cols, qz_op op, qz_tensor **out) {
    if (src && ts_tensor_nelems(src) != rows * cols)
        return ts_error(TS_ERR_FORMAT, "tensor for '%s': %lld elements, expected %lld x %lld",
                        name, (long long)ts_tensor_nelems(src), (long long)rows,
                        (long long)cols);
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 256;
        qz_tensor *t = realloc(p->t, (size_t)cap * sizeof *t);
        if (!t) return ts_error(TS_ERR_NOMEM, "out of memory");
        p->t = t;
        p->cap = cap;
    }
    qz_tensor *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->src = src;
    t->layer = layer;
    t->n_dims = n_dims;
    t->rows = rows;
    t->cols = cols;
    if (n_dims == 1) {
        t->shape[0] = cols;
    } else {
        t->shape[0] = rows;
        t->shape[1] = cols;
    }
    t->op = op;
    if (out) *out = t;
    return TS_OK;
}

static void plan_free(qz_plan *p) {
    for (int i = 0; i < p->n; i++) {
        free(p->t[i].row_map);
        free(p->t[i].col_map);
        free(p->t[i].own);
    }
    free(p->t);
    ts_gguf_writer_free(p->w);
}

ts_status qz_add_f32(qz_plan *p, const char *name, const float *data, int64_t rows, int64_t cols,
                     qz_tensor **out) {
    ts_tensor *v = malloc(sizeof *v);
    if (!v) return ts_error(TS_ERR_NOMEM, "out of memory");
    *v = (ts_tensor){.dtype = TS_DTYPE_F32,
                     .n_dims = 2,
                     .shape = {rows, cols, 1, 1, 1, 1},
                     .data = data,
                     .nbytes = (uint64_t)(rows * cols) * sizeof(float)};
    ts_status st = qz_add(p, name, -1, v, 2, rows, cols, QZ_OP_NONE, out);
    if (st != TS_OK) {
        free(v);
        return st;
    }
    p->t[p->n - 1].own = v;
    return TS_OK;
}

/* ---- choosing types ------------------------------------------------------------------------ */

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && strcmp(s + n - k, tail) == 0;
}

static bool quantizable(const qz_tensor *t) {
    return t->n_dims >= 2 && ends_with(t->name, "weight") && !strstr(t->name, "_norm.weight") &&
           !strstr(t->name, "ssm_conv1d") &&
           strncmp(t->name, "dense_", 6) != 0; /* kept F32:
                                                * an embedding model's Dense layers */
}

static bool use_more_bits(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static bool fits(ts_dtype t, int64_t cols) { return cols % ts_dtype_block_elems(t) == 0; }

/* The type of one quantizable tensor; the counters are llama.cpp's (attn_v-like tensors and
 * ffn_down tensors seen so far, in layer order). */
static ts_dtype choose(const qz_tensor *t, const qz_ftype *ft, bool tied, int *i_wv, int n_wv,
                       int *i_down, int n_down) {
    ts_dtype ty = ft->base;
    if (ty == TS_DTYPE_F32 || ty == TS_DTYPE_F16 || ty == TS_DTYPE_BF16) return ty;
    bool is_output = strcmp(t->name, "output.weight") == 0;
    bool is_embd = strcmp(t->name, "token_embd.weight") == 0;
    if (is_output || (tied && is_embd)) {
        if (!fits(ty, t->cols))
            ty = TS_DTYPE_Q8_0;
        else if (ty != TS_DTYPE_Q8_0)
            ty = TS_DTYPE_Q6_K;
    } else if (strstr(t->name, "attn_qkv.weight") || strstr(t->name, "attn_v.weight")) {
        if (ft->k_mix && use_more_bits(*i_wv, n_wv)) ty = TS_DTYPE_Q6_K;
        ++*i_wv;
    } else if (strstr(t->name, "ffn_down")) {
        if (ft->k_mix && use_more_bits(*i_down, n_down)) ty = TS_DTYPE_Q6_K;
        ++*i_down;
    }
    if (!fits(ty, t->cols)) {
        /* llama.cpp's fallbacks; where it has none (Q8_0, Q4_0) it stops, we write F16 */
        ty = ty == TS_DTYPE_Q4_K ? TS_DTYPE_Q5_0 : ty == TS_DTYPE_Q6_K ? TS_DTYPE_Q8_0
                                                                       : TS_DTYPE_F16;
        if (!fits(ty, t->cols)) ty = TS_DTYPE_F16;
    }
    return ty;
}

static bool dtype_of_ggml(uint32_t ggml, ts_dtype *out) {
    for (int d = 0; d < TS_DTYPE_COUNT; d++)
        if (ts_gguf_ggml_type_of((ts_dtype)d) == ggml) {
            *out = (ts_dtype)d;
            return true;
        }
    return false;
}

/* Fills out_type for every tensor. from_gguf: tensors that are not quantized keep their type
 * (else they become F32, as llama.cpp's converter writes them). */
static void choose_types(qz_plan *p, const qz_ftype *ft, bool from_gguf) {
    bool tied = true;
    int n_wv = 0, i_wv = 0, i_down = 0;
    for (int i = 0; i < p->n; i++) {
        if (strcmp(p->t[i].name, "output.weight") == 0) tied = false;
        if (strstr(p->t[i].name, "attn_qkv.weight") || strstr(p->t[i].name, "attn_v.weight"))
            n_wv++;
    }
    for (int i = 0; i < p->n; i++) {
        qz_tensor *t = &p->t[i];
        if (quantizable(t))
            t->out_type = ts_gguf_ggml_type_of(
                choose(t, ft, tied, &i_wv, n_wv, &i_down, p->n_layers));
        else
            t->out_type = from_gguf ? t->raw_type : GGML_F32;
    }
}

/* ---- converting ---------------------------------------------------------------------------- */

typedef struct {
    const qz_tensor *t;
    ts_dtype in, out;
    size_t in_rb, out_rb;
    int64_t r0, n;
    unsigned char *dst;
    float *scratch; /* 2 rows per thread */
    ts_status st[QZ_MAX_THREADS];
} qz_job;

static void convert_rows(void *ctx, int ith, int nth) {
    qz_job *j = ctx;
    const qz_tensor *t = j->t;
    long lo, hi;
    ts_split_range((long)j->n, ith, nth, &lo, &hi);
    float *a = j->scratch + (size_t)ith * 2 * (size_t)t->cols, *b = a + t->cols;
    ts_status st = TS_OK;
    for (long i = lo; st == TS_OK && i < hi; i++) {
        int64_t r = j->r0 + i, sr = t->row_map ? t->row_map[r] : r;
        const unsigned char *s = (const unsigned char *)t->src->data + (size_t)sr * j->in_rb;
        st = ts_dequantize_row(j->in, s, a, t->cols);
        float *x = a;
        if (t->col_map) {
            for (int64_t c = 0; c < t->cols; c++) b[c] = a[t->col_map[c]];
            x = b;
        }
        if (t->op == QZ_OP_ADD_ONE)
            for (int64_t c = 0; c < t->cols; c++) x[c] += 1.0f;
        else if (t->op == QZ_OP_NEG_EXP)
            for (int64_t c = 0; c < t->cols; c++) x[c] = -expf(x[c]);
        if (st == TS_OK) st = ts_quantize_row(j->out, x, j->dst + (size_t)i * j->out_rb, t->cols);
    }
    j->st[ith] = st;
}

static bool is_identity(const qz_tensor *t) {
    return !t->row_map && !t->col_map && t->op == QZ_OP_NONE;
}

static ts_status write_tensor(qz_plan *p, const qz_tensor *t, ts_pool *pool, unsigned char *buf,
                              float *scratch) {
    if (t->raw && t->out_type == t->raw_type && is_identity(t))
        return ts_gguf_writer_write(p->w, t->raw, t->raw_bytes);
    qz_job j = {.t = t, .dst = buf, .scratch = scratch};
    if (!t->src || !dtype_of_ggml(t->out_type, &j.out))
        return ts_error(TS_ERR_UNSUPPORTED, "tensor '%s': its type (ggml %u) cannot be converted",
                        t->name, t->raw_type);
    j.in = t->src->dtype;
    j.in_rb = ts_dtype_row_bytes(j.in, t->cols);
    j.out_rb = ts_dtype_row_bytes(j.out, t->cols);
    if (!j.in_rb || !j.out_rb)
        return ts_error(TS_ERR_FORMAT, "tensor '%s': rows of %lld do not fit %s", t->name,
                        (long long)t->cols, ts_dtype_name(j.out));
    int64_t step = (int64_t)(QZ_CHUNK_BYTES / j.out_rb);
    if (step < 1) step = 1;
    for (j.r0 = 0; j.r0 < t->rows; j.r0 += step) {
        j.n = t->rows - j.r0 < step ? t->rows - j.r0 : step;
        int nth = ts_pool_size(pool);
        if (j.n * t->cols < 65536) {
            convert_rows(&j, 0, 1); /* small: not worth waking the workers */
            nth = 1;
        } else {
            ts_pool_run(pool, convert_rows, &j);
        }
        for (int i = 0; i < nth; i++)
            if (j.st[i] != TS_OK) return ts_error_prefix(j.st[i], t->name);
        TS_TRY(ts_gguf_writer_write(p->w, buf, (size_t)j.n * j.out_rb));
    }
    return TS_OK;
}

static ts_status write_all(qz_plan *p, const char *out, int n_threads) {
    for (int i = 0; i < p->n; i++) {
        const qz_tensor *t = &p->t[i];
        TS_TRY(ts_gguf_writer_add_tensor_ggml(p->w, t->name, t->out_type, t->n_dims, t->shape));
    }
    TS_TRY(ts_gguf_writer_begin(p->w, out));
    int64_t max_cols = 1;
    size_t max_buf = 1;
    for (int i = 0; i < p->n; i++) {
        ts_dtype d;
        if (p->t[i].cols > max_cols) max_cols = p->t[i].cols;
        if (!dtype_of_ggml(p->t[i].out_type, &d)) continue;
        size_t rb = ts_dtype_row_bytes(d, p->t[i].cols);
        size_t need = rb > QZ_CHUNK_BYTES ? rb : QZ_CHUNK_BYTES;
        if (need > max_buf) max_buf = need;
    }
    ts_pool *pool = NULL;
    TS_TRY(ts_pool_create(n_threads, &pool));
    unsigned char *buf = malloc(max_buf);
    float *scratch = malloc((size_t)n_threads * 2 * (size_t)max_cols * sizeof(float));
    ts_status st = buf && scratch ? TS_OK : ts_error(TS_ERR_NOMEM, "out of memory");
    for (int i = 0; st == TS_OK && i < p->n; i++)
        st = write_tensor(p, &p->t[i], pool, buf, scratch);
    free(buf);
    free(scratch);
    ts_pool_free(pool);
    TS_TRY(st);
    return ts_gguf_writer_end(p->w);
}

/* ---- inputs -------------------------------------------------------------------------------- */

static ts_status write_general(qz_plan *p, const char *arch, const char *in) {
    TS_TRY(ts_gguf_writer_kv_str(p->w, "general.architecture", arch));
    char name[256];
    snprintf(name, sizeof name, "%s", in);
    size_t n = strlen(name);
    while (n > 1 && name[n - 1] == '/') name[--n] = '\0';
    const char *base = strrchr(name, '/');
    return ts_gguf_writer_kv_str(p->w, "general.name", base ? base + 1 : name);
}

static ts_status write_file_type(qz_plan *p, const qz_ftype *ft) {
    TS_TRY(ts_gguf_writer_kv_u32(p->w, "general.file_type", ft->file_type));
    return ts_gguf_writer_kv_u32(p->w, "general.quantization_version", 2);
}

static ts_status from_hf(const char *in, const char *out, const qz_ftype *ft, int n_threads) {
    ts_model *m;
    TS_TRY(ts_model_open(in, &m));
    qz_plan p = {0};
    ts_status st = ts_gguf_writer_new(&p.w, 0);
    const char *arch = m->info.arch;
    if (st == TS_OK)
        st = write_general(&p, strcmp(arch, "gemma3") == 0 ? gemma3_gguf_arch(m) : arch, in);
    if (st == TS_OK) {
        if (strcmp(arch, "qwen35") == 0)
            st = qwen35_gguf_plan(m, &p);
        else if (strcmp(arch, "gemma3") == 0)
            st = gemma3_gguf_plan(m, &p);
        else
            st = ts_error(TS_ERR_UNSUPPORTED, "%s: no GGUF form for architecture '%s'", in, arch);
    }
    if (st == TS_OK) st = write_file_type(&p, ft);
    if (st == TS_OK && p.tok_pre) st = qz_write_vocab(p.w, in, p.tok_pre, m->info.n_vocab);
    if (st == TS_OK) {
        choose_types(&p, ft, false);
        st = write_all(&p, out, n_threads);
    }
    plan_free(&p);
    ts_model_close(m);
    return st;
}

/* One metadata entry copied as it is. */
static ts_status copy_kv(const ts_gguf *g, int64_t i, ts_gguf_writer *w) {
    const char *key = ts_gguf_kv_key(g, i);
    ts_gguf_value v;
    TS_TRY(ts_gguf_kv_value(g, i, &v));
    if (v.type == TS_GGUF_STR) return ts_gguf_writer_kv_strn(w, key, v.data, (size_t)v.n);
    if (v.type == TS_GGUF_ARR && v.elem == TS_GGUF_STR) {
        const char **items = malloc((size_t)(v.n ? v.n : 1) * sizeof *items);
        size_t *lens = malloc((size_t)(v.n ? v.n : 1) * sizeof *lens);
        ts_status st = items && lens ? TS_OK : ts_error(TS_ERR_NOMEM, "out of memory");
        for (uint64_t k = 0; st == TS_OK && k < v.n; k++)
            st = ts_gguf_kv_str_item(g, i, k, &items[k], &lens[k]);
        if (st == TS_OK) st = ts_gguf_writer_kv_str_arr(w, key, items, lens, v.n);
        free(items);
        free(lens);
        return st;
    }
    static const size_t size[TS_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    ts_gguf_type t = v.type == TS_GGUF_ARR ? v.elem : v.type;
    if ((unsigned)t >= TS_GGUF_TYPE_COUNT || !size[t])
        return ts_error(TS_ERR_UNSUPPORTED, "key '%s': arrays of %s not copied", key,
                        ts_gguf_type_name(t));
    /* the bytes in the file are unaligned little-endian values: copy into aligned memory */
    uint64_t n = v.type == TS_GGUF_ARR ? v.n : 1;
    void *tmp = malloc((size_t)(n ? n : 1) * 8);
    if (!tmp) return ts_error(TS_ERR_NOMEM, "out of memory");
    memcpy(tmp, v.data, (size_t)n * size[t]);
    ts_status st;
    if (v.type == TS_GGUF_ARR) {
        if (t == TS_GGUF_BOOL) {
            bool *bv = tmp; /* one byte each on the wire; host bool too, but be exact */
            const uint8_t *raw = v.data;
            for (uint64_t k = n; k-- > 0;) bv[k] = raw[k] != 0;
        }
        st = ts_gguf_writer_kv_arr(w, key, t, tmp, n);
    } else {
        switch (t) {
        case TS_GGUF_U8: st = ts_gguf_writer_kv_u8(w, key, *(uint8_t *)tmp); break;
        case TS_GGUF_I8: st = ts_gguf_writer_kv_i8(w, key, *(int8_t *)tmp); break;
        case TS_GGUF_U16: st = ts_gguf_writer_kv_u16(w, key, *(uint16_t *)tmp); break;
        case TS_GGUF_I16: st = ts_gguf_writer_kv_i16(w, key, *(int16_t *)tmp); break;
        case TS_GGUF_U32: st = ts_gguf_writer_kv_u32(w, key, *(uint32_t *)tmp); break;
        case TS_GGUF_I32: st = ts_gguf_writer_kv_i32(w, key, *(int32_t *)tmp); break;
        case TS_GGUF_F32: st = ts_gguf_writer_kv_f32(w, key, *(float *)tmp); break;
        case TS_GGUF_BOOL: st = ts_gguf_writer_kv_bool(w, key, *(uint8_t *)tmp != 0); break;
        case TS_GGUF_U64: st = ts_gguf_writer_kv_u64(w, key, *(uint64_t *)tmp); break;
        case TS_GGUF_I64: st = ts_gguf_writer_kv_i64(w, key, *(int64_t *)tmp); break;
        default: st = ts_gguf_writer_kv_f64(w, key, *(double *)tmp); break;
        }
    }
    free(tmp);
    return st;
}

static ts_status plan_gguf(const ts_gguf *g, qz_plan *p, const qz_ftype *ft) {
    const char *arch;
    TS_TRY(ts_gguf_get_str(g, "general.architecture", &arch, NULL));
    if (strcmp(arch, "qwen35") != 0 && strcmp(arch, "gemma3") != 0)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: unsupported architecture '%s' (qwen35, gemma3)",
                        ts_gguf_path(g), arch);
    char key[64];
    uint32_t n_layers;
    snprintf(key, sizeof key, "%s.block_count", arch);
    TS_TRY(ts_gguf_get_u32(g, key, &n_layers));
    p->n_layers = (int)n_layers;
    for (size_t i = 0; i < ts_gguf_n_kv(g); i++) {
        const char *k = ts_gguf_kv_key(g, (int64_t)i);
        if (strcmp(k, "general.alignment") == 0 || strcmp(k, "general.file_type") == 0 ||
            strcmp(k, "general.quantization_version") == 0)
            continue;
        TS_TRY(copy_kv(g, (int64_t)i, p->w));
    }
    TS_TRY(write_file_type(p, ft));
    for (size_t i = 0; i < ts_gguf_n_tensors(g); i++) {
        ts_gguf_tensor_info ti;
        TS_TRY(ts_gguf_tensor_info_at(g, i, &ti));
        int64_t rows = 1;
        for (int d = 1; d < ti.n_dims; d++) rows *= ti.ne[d];
        int layer = -1;
        if (sscanf(ti.name, "blk.%d.", &layer) != 1) layer = -1;
        qz_tensor *t;
        TS_TRY(qz_add(p, ti.name, layer, ti.tensor, ti.n_dims < 1 ? 1 : ti.n_dims, rows,
                      ti.ne[0], QZ_OP_NONE, &t));
        for (int d = 0; d < ti.n_dims; d++) t->shape[d] = ti.ne[ti.n_dims - 1 - d];
        t->n_dims = ti.n_dims;
        t->raw = ti.data;
        t->raw_type = ti.ggml_type;
        t->raw_bytes = ti.nbytes;
    }
    choose_types(p, ft, true);
    return TS_OK;
}

static ts_status from_gguf(const char *in, const char *out, const qz_ftype *ft, int n_threads) {
    ts_gguf *g;
    TS_TRY(ts_gguf_open(in, &g));
    qz_plan p = {0};
    ts_status st = ts_gguf_writer_new(&p.w, 0);
    if (st == TS_OK) st = plan_gguf(g, &p, ft);
    if (st == TS_OK) st = write_all(&p, out, n_threads);
    plan_free(&p);
    ts_gguf_close(g);
    return st;
}

ts_status ts_quantize_model(const char *in, const char *out, const char *type, int n_threads) {
    const qz_ftype *ft = NULL;
    for (size_t i = 0; i < sizeof ftypes / sizeof ftypes[0]; i++)
        if (strcmp(type, ftypes[i].name) == 0) ft = &ftypes[i];
    if (!ft)
        return ts_error(TS_ERR_INVALID, "unknown quantization type '%s' (q8_0, q4_0, q4_k_m, "
                        "f16, bf16 or f32)", type);
    if (n_threads <= 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = nc > 0 ? (int)nc : 1;
    }
    if (n_threads > QZ_MAX_THREADS) n_threads = QZ_MAX_THREADS;
    struct stat sb;
    if (stat(in, &sb) != 0) return ts_error(TS_ERR_IO, "%s: no such file or directory", in);
    return S_ISDIR(sb.st_mode) ? from_hf(in, out, ft, n_threads)
                               : from_gguf(in, out, ft, n_threads);
}
