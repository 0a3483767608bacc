/* BPE encoding and decoding (see bpe.h); loading is in bpe_load.c.
 *
 * - Merging takes the adjacent pair of lowest merge rank, leftmost on ties, until none
 *   applies; that is the order HF's priority queue produces. Short words rescan an array,
 *   long ones use a heap (O(n log n)), so a 100 kB pre-token costs no more than it should.
 * - Empty regex matches follow HF: an empty match right after the previous match is skipped
 *   and the search moves on by one character.
 * - Per-call memory (PCRE2 match data, merge arrays, a bounded pre-token -> ids cache) lives
 *   in scratch objects borrowed from a pool, so concurrent calls share nothing mutable. */
#include "base/status.h"
#include "text/bpe_int.h"

#include <stdlib.h>
#include <string.h>

#define BPE_SMALL_WORD     48         /* words up to this many bytes use the simple scan */
#define BPE_CACHE_SLOTS    32768      /* per scratch; power of two; half may be used */
#define BPE_CACHE_ARENA    (4u << 20) /* bytes of cached pieces and ids per scratch */
#define BPE_CACHE_MAX_WORD 64         /* longer pre-tokens are not cached */
#define BPE_POOL_KEEP      8          /* idle scratch objects kept for reuse */
#define BPE_MATCH_LIMIT    200000000u /* PCRE2 backtracking steps per match */

/* ---- id vector ----------------------------------------------------------------------------- */

ts_status ts_ids_reserve(ts_ids *v, size_t extra) {
    if (extra > SIZE_MAX / sizeof(int32_t) / 2 - v->len)
        return ts_error(TS_ERR_NOMEM, "token vector too long");
    size_t need = v->len + extra;
    if (need <= v->cap) return TS_OK;
    size_t cap = v->cap ? v->cap : 64;
    while (cap < need)
        cap *= 2;
    int32_t *p = realloc(v->data, cap * sizeof *p);
    if (!p) return ts_error(TS_ERR_NOMEM, "out of memory (%zu token ids)", cap);
    v->data = p;
    v->cap = cap;
    return TS_OK;
}

ts_status ts_ids_push(ts_ids *v, int32_t id) {
    if (v->len == v->cap) TS_TRY(ts_ids_reserve(v, 1));
    v->data[v->len++] = id;
    return TS_OK;
}

void ts_ids_free(ts_ids *v) {
    free(v->data);
    v->data = NULL;
    v->len = v->cap = 0;
}

/* ---- scratch objects ------------------------------------------------------------------------ */

typedef struct {
    int32_t id; /* -1 once merged into its left neighbour */
    int32_t prev, next;
} bpe_sym;

typedef struct {
    uint64_t hash; /* 0 = free */
    uint32_t off;  /* key bytes, then n_ids int32 ids, in the arena */
    uint16_t len;
    uint16_t n_ids;
} bpe_cache_slot;

struct bpe_scratch {
    bpe_scratch *next;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    ts_strbuf clean;       /* the input with ill-formed UTF-8 repaired */
    ts_strbuf norm;        /* a stage-1 gap after the normalizer */
    ts_strbuf norm_work;   /* between normalizer steps */
    ts_strbuf spelling;    /* a pre-token in the alphabet (ignore_merges lookups) */
    bpe_piece_fn piece_fn; /* set only by bpe_pretokenize */
    void *piece_ctx;
    /* merge work, for words of up to cap bytes */
    size_t cap;
    bpe_sym *sym;
    int32_t *ids;
    int32_t *rank;
    int32_t *nid;
    uint64_t *heap; /* [3 * cap]: (rank << 32) | position */
    /* pre-token -> ids cache; emptied when full */
    bpe_cache_slot *slots;
    char *arena;
    size_t arena_len;
    size_t n_cached;
};

#define BPE_SCRATCH_SHRINK (1u << 20) /* words above this many bytes don't keep their memory */

static void bpe_scratch_words_free(bpe_scratch *s) {
    free(s->sym);
    free(s->ids);
    free(s->rank);
    free(s->nid);
    free(s->heap);
    s->sym = NULL;
    s->ids = s->rank = s->nid = NULL;
    s->heap = NULL;
    s->cap = 0;
}

static void bpe_scratch_free(bpe_scratch *s) {
    if (!s) return;
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mctx);
    pcre2_jit_stack_free(s->jit_stack);
    ts_strbuf_free(&s->clean);
    ts_strbuf_free(&s->norm);
    ts_strbuf_free(&s->norm_work);
    ts_strbuf_free(&s->spelling);
    bpe_scratch_words_free(s);
    free(s->slots);
    free(s->arena);
    free(s);
}

static bpe_scratch *bpe_scratch_new(const ts_bpe *t) {
    bpe_scratch *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->md = pcre2_match_data_create(t->max_captures + 1, NULL);
    s->mctx = pcre2_match_context_create(NULL);
    /* Repeated groups keep backtracking frames on the JIT stack; give other tokenizers' patterns
     * more room than the 32 KiB default (Qwen's needs none; on overflow we fall back to the
     * interpreter anyway). */
    s->jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    s->slots = calloc(BPE_CACHE_SLOTS, sizeof *s->slots);
    s->arena = malloc(BPE_CACHE_ARENA);
    if (!s->md || !s->mctx || !s->jit_stack || !s->slots || !s->arena) {
        bpe_scratch_free(s);
        return NULL;
    }
    pcre2_jit_stack_assign(s->mctx, NULL, s->jit_stack);
    /* The default (10 million) stops `\s*[\r\n]+` backtracking over a whitespace run of a few
     * MB; the patterns we run are linear there, so allow more, but keep a bound. */
    pcre2_set_match_limit(s->mctx, BPE_MATCH_LIMIT);
    return s;
}

bpe_scratch *bpe_scratch_get(const ts_bpe *t) {
    ts_bpe *mt = (ts_bpe *)t; /* the pool is the only mutable part, guarded by its lock */
    pthread_mutex_lock(&mt->pool_lock);
    bpe_scratch *s = mt->pool;
    if (s) {
        mt->pool = s->next;
        mt->pool_n--;
    }
    pthread_mutex_unlock(&mt->pool_lock);
    return s ? s : bpe_scratch_new(t);
}

void bpe_scratch_put(const ts_bpe *t, bpe_scratch *s) {
    ts_bpe *mt = (ts_bpe *)t;
    if (s->cap > BPE_SCRATCH_SHRINK) bpe_scratch_words_free(s);
    if (s->clean.cap > BPE_SCRATCH_SHRINK) ts_strbuf_free(&s->clean);
    if (s->norm.cap > BPE_SCRATCH_SHRINK) ts_strbuf_free(&s->norm);
    if (s->norm_work.cap > BPE_SCRATCH_SHRINK) ts_strbuf_free(&s->norm_work);
    pthread_mutex_lock(&mt->pool_lock);
    if (mt->pool_n < BPE_POOL_KEEP) {
        s->next = mt->pool;
        mt->pool = s;
        mt->pool_n++;
        s = NULL;
    }
    pthread_mutex_unlock(&mt->pool_lock);
    bpe_scratch_free(s);
}

void bpe_pool_free(ts_bpe *t) {
    while (t->pool) {
        bpe_scratch *s = t->pool;
        t->pool = s->next;
        bpe_scratch_free(s);
    }
    t->pool_n = 0;
}

static ts_status bpe_scratch_words(bpe_scratch *s, size_t n) {
    if (n <= s->cap) return TS_OK;
    size_t cap = s->cap ? s->cap : 256;
    while (cap < n)
        cap *= 2;
    bpe_scratch_words_free(s);
    s->sym = malloc(cap * sizeof *s->sym);
    s->ids = malloc(cap * sizeof *s->ids);
    s->rank = malloc(cap * sizeof *s->rank);
    s->nid = malloc(cap * sizeof *s->nid);
    s->heap = malloc(3 * cap * sizeof *s->heap);
    if (!s->sym || !s->ids || !s->rank || !s->nid || !s->heap) {
        bpe_scratch_words_free(s);
        return ts_error(TS_ERR_NOMEM, "out of memory for a %zu-byte pre-token", n);
    }
    s->cap = cap;
    return TS_OK;
}

/* ---- pre-token cache ------------------------------------------------------------------------ */

static bool bpe_cache_get(bpe_scratch *s, uint64_t h, const uint8_t *p, size_t n, ts_ids *out,
                          ts_status *st) {
    size_t i = h & (BPE_CACHE_SLOTS - 1);
    for (;;) {
        const bpe_cache_slot *c = &s->slots[i];
        if (!c->hash) return false;
        if (c->hash == h && c->len == n && memcmp(s->arena + c->off, p, n) == 0) {
            *st = ts_ids_reserve(out, c->n_ids);
            if (*st == TS_OK) {
                memcpy(out->data + out->len, s->arena + c->off + ((n + 3) & ~(size_t)3),
                       c->n_ids * sizeof(int32_t));
                out->len += c->n_ids;
            }
            return true;
        }
        i = (i + 1) & (BPE_CACHE_SLOTS - 1);
    }
}

static void bpe_cache_put(bpe_scratch *s, uint64_t h, const uint8_t *p, size_t n,
                          const int32_t *ids, size_t n_ids) {
    size_t need = ((n + 3) & ~(size_t)3) + n_ids * sizeof(int32_t);
    if (s->n_cached >= BPE_CACHE_SLOTS / 2 || s->arena_len + need > BPE_CACHE_ARENA) {
        memset(s->slots, 0, BPE_CACHE_SLOTS * sizeof *s->slots);
        s->n_cached = 0;
        s->arena_len = 0;
    }
    size_t i = h & (BPE_CACHE_SLOTS - 1);
    while (s->slots[i].hash)
        i = (i + 1) & (BPE_CACHE_SLOTS - 1);
    bpe_cache_slot *c = &s->slots[i];
    c->hash = h;
    c->off = (uint32_t)s->arena_len;
    c->len = (uint16_t)n;
    c->n_ids = (uint16_t)n_ids;
    memcpy(s->arena + s->arena_len, p, n);
    memcpy(s->arena + s->arena_len + ((n + 3) & ~(size_t)3), ids, n_ids * sizeof(int32_t));
    s->arena_len += need;
    s->n_cached++;
}

/* ---- merging -------------------------------------------------------------------------------- */

/* Short words: keep each adjacent pair's rank and rescan for the lowest (leftmost on ties).
 * Quadratic in the word length, but with tiny constants. Starts from s->ids[0..m). */
static ts_status bpe_merge_scan(const ts_bpe *t, bpe_scratch *s, size_t m, ts_ids *out) {
    int32_t *ids = s->ids, *rank = s->rank, *nid = s->nid;
    for (size_t i = 0; i + 1 < m; i++)
        rank[i] = bpe_pair(t, ids[i], ids[i + 1], &nid[i]);
    for (;;) {
        int32_t best = INT32_MAX;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; i++)
            if (rank[i] < best) {
                best = rank[i];
                bi = i;
            }
        if (best == INT32_MAX) break;
        ids[bi] = nid[bi];
        m--; /* element bi + 1 goes; pair j > bi + 1 becomes pair j - 1 */
        memmove(ids + bi + 1, ids + bi + 2, (m - bi - 1) * sizeof *ids);
        if (m >= bi + 3) {
            memmove(rank + bi + 1, rank + bi + 2, (m - bi - 2) * sizeof *rank);
            memmove(nid + bi + 1, nid + bi + 2, (m - bi - 2) * sizeof *nid);
        }
        if (bi > 0) rank[bi - 1] = bpe_pair(t, ids[bi - 1], ids[bi], &nid[bi - 1]);
        if (bi + 1 < m) rank[bi] = bpe_pair(t, ids[bi], ids[bi + 1], &nid[bi]);
    }
    TS_TRY(ts_ids_reserve(out, m));
    memcpy(out->data + out->len, ids, m * sizeof *ids);
    out->len += m;
    return TS_OK;
}

static void bpe_heap_push(uint64_t *heap, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (heap[parent] <= v) break;
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = v;
}

static uint64_t bpe_heap_pop(uint64_t *heap, size_t *n) {
    uint64_t top = heap[0], v = heap[--*n];
    size_t i = 0, len = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= len) break;
        if (c + 1 < len && heap[c + 1] < heap[c]) c++;
        if (v <= heap[c]) break;
        heap[i] = heap[c];
        i = c;
    }
    if (len) heap[i] = v;
    return top;
}

/* Long words: a min-heap of (rank, position) over adjacent pairs, O(n log n). Entries go
 * stale when a neighbour merges; they are recognised on pop because the pair now at that
 * position no longer has that rank. Starts from s->ids[0..n). */
static ts_status bpe_merge_heap(const ts_bpe *t, bpe_scratch *s, size_t n, ts_ids *out) {
    bpe_sym *sym = s->sym;
    uint64_t *heap = s->heap;
    size_t hn = 0;
    if (n == 0) return TS_OK;
    for (size_t i = 0; i < n; i++) {
        sym[i].id = s->ids[i];
        sym[i].prev = (int32_t)i - 1;
        sym[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    int32_t nid;
    for (size_t i = 0; i + 1 < n; i++) {
        int32_t r = bpe_pair(t, sym[i].id, sym[i + 1].id, &nid);
        if (r != INT32_MAX) bpe_heap_push(heap, &hn, ((uint64_t)r << 32) | i);
    }
    size_t m = n;
    while (hn) {
        uint64_t top = bpe_heap_pop(heap, &hn);
        int32_t r = (int32_t)(top >> 32), pos = (int32_t)(uint32_t)top;
        bpe_sym *a = &sym[pos];
        if (a->id < 0 || a->next < 0) continue;
        bpe_sym *b = &sym[a->next];
        if (bpe_pair(t, a->id, b->id, &nid) != r) continue;
        a->id = nid;
        b->id = -1;
        a->next = b->next;
        if (a->next >= 0) sym[a->next].prev = pos;
        m--;
        int32_t nr;
        if (a->prev >= 0 && (nr = bpe_pair(t, sym[a->prev].id, a->id, &nid)) != INT32_MAX)
            bpe_heap_push(heap, &hn, ((uint64_t)nr << 32) | (uint32_t)a->prev);
        if (a->next >= 0 && (nr = bpe_pair(t, a->id, sym[a->next].id, &nid)) != INT32_MAX)
            bpe_heap_push(heap, &hn, ((uint64_t)nr << 32) | (uint32_t)pos);
    }
    TS_TRY(ts_ids_reserve(out, m));
    for (int32_t i = 0; i >= 0; i = sym[i].next)
        out->data[out->len++] = sym[i].id;
    return TS_OK;
}

/* The symbols merging starts from, into s->ids; their count in *m. Byte-level: the bytes'
 * tokens. Otherwise each character's piece, else (byte_fallback) its bytes' <0xXX> pieces,
 * else unk - as HF's BPE, including its order: a pending unk (held to fuse the next one)
 * goes out only before the next character found in the vocab, or at the end, so byte pieces
 * in between come first. */
static ts_status bpe_initial(const ts_bpe *t, bpe_scratch *s, const uint8_t *p, size_t n,
                             size_t *m) {
    int32_t *ids = s->ids;
    size_t k = 0;
    if (t->byte_level) {
        for (size_t i = 0; i < n; i++)
            ids[i] = t->byte_id[p[i]];
        *m = n;
        return TS_OK;
    }
    bool unk_pending = false;
    for (size_t i = 0; i < n;) {
        size_t len = 1;
        while (i + len < n && (p[i + len] & 0xC0) == 0x80)
            len++;
        int32_t id = bpe_vocab_find(t, (const char *)p + i, len);
        bool bytes = id < 0 && t->byte_fallback;
        for (size_t j = 0; bytes && j < len; j++)
            bytes = t->fallback_id[p[i + j]] >= 0;
        if (id >= 0) {
            if (unk_pending) ids[k++] = t->unk_id;
            unk_pending = false;
            ids[k++] = id;
        } else if (bytes) {
            for (size_t j = 0; j < len; j++)
                ids[k++] = t->fallback_id[p[i + j]];
        } else if (t->unk_id >= 0) {
            if (unk_pending && !t->fuse_unk) ids[k++] = t->unk_id;
            unk_pending = true;
        } else {
            /* HF drops the character without a trace; refuse rather than lose text. */
            uint32_t cp = 0;
            size_t cl;
            ts_utf8_next((const char *)p + i, n - i, &cp, &cl);
            return ts_error(TS_ERR_UNSUPPORTED,
                            "the tokenizer has no token for U+%04X (no piece, no byte pieces, no "
                            "unk_token)",
                            (unsigned)cp);
        }
        i += len;
    }
    if (unk_pending) ids[k++] = t->unk_id;
    *m = k;
    return TS_OK;
}

ts_status bpe_merge_word(const ts_bpe *t, bpe_scratch *s, const uint8_t *p, size_t n, int method,
                         ts_ids *out) {
    if (n == 0) return TS_OK;
    if (n >= (size_t)INT32_MAX / 4)
        return ts_error(TS_ERR_RANGE, "a pre-token of %zu bytes is too long", n);
    TS_TRY(bpe_scratch_words(s, n)); /* never more symbols than bytes */
    size_t m = 0;
    TS_TRY(bpe_initial(t, s, p, n, &m));
    bool scan = method == 1 || (method == 0 && m <= BPE_SMALL_WORD);
    return scan ? bpe_merge_scan(t, s, m, out) : bpe_merge_heap(t, s, m, out);
}

/* ---- encoding ------------------------------------------------------------------------------- */

static ts_status bpe_word(const ts_bpe *t, bpe_scratch *s, const uint8_t *p, size_t n,
                          ts_ids *out) {
    if (s->piece_fn) return s->piece_fn(s->piece_ctx, (const char *)p, n, -1);
    if (n == 1 && t->byte_level) return ts_ids_push(out, t->byte_id[p[0]]);
    uint64_t h = 0;
    ts_status st = TS_OK;
    bool cacheable = n <= BPE_CACHE_MAX_WORD;
    if (cacheable) {
        h = bpe_hash(p, n) | 1;
        if (bpe_cache_get(s, h, p, n, out, &st)) return st;
    }
    size_t before = out->len;
    int32_t whole = -1;
    if (t->ignore_merges && !t->byte_level) {
        whole = bpe_vocab_find(t, (const char *)p, n);
    } else if (t->ignore_merges) {
        s->spelling.len = 0;
        TS_TRY(ts_strbuf_reserve(&s->spelling, 2 * n));
        size_t sl = bpe_bytes_to_spelling(p, n, s->spelling.data);
        whole = bpe_vocab_find(t, s->spelling.data, sl);
    }
    if (whole >= 0)
        TS_TRY(ts_ids_push(out, whole));
    else
        TS_TRY(bpe_merge_word(t, s, p, n, 0, out));
    if (cacheable) bpe_cache_put(s, h, p, n, out->data + before, out->len - before);
    return TS_OK;
}

/* A word merged in parts cut before its spaces (space_cut.h). */
static ts_status bpe_space_parts(const ts_bpe *t, bpe_scratch *s, const char *p, size_t n,
                                 ts_ids *out) {
    for (size_t start = 0, end; start < n; start = end) {
        end = ts_space_part_end(&t->space_glue, p, n, start);
        TS_TRY(bpe_word(t, s, (const uint8_t *)p + start, end - start, out));
    }
    return TS_OK;
}

/* Splits p[0..n) with pre-tokenizer regex `level`; the matches and the text between them are
 * pieces, each split further by the next level or, after the last one, merged. */
static ts_status bpe_pretok(const ts_bpe *t, bpe_scratch *s, int level, const char *p, size_t n,
                            ts_ids *out) {
    if (n == 0) return TS_OK;
    if (level == t->n_split)
        return t->space_glue.on && !s->piece_fn ? bpe_space_parts(t, s, p, n, out)
                                                : bpe_word(t, s, (const uint8_t *)p, n, out);
    const pcre2_code *re = t->split[level];
    const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
    size_t start = 0, gap = 0, last_end = SIZE_MAX;
    while (start <= n) {
        int rc = PCRE2_ERROR_JIT_BADOPTION;
        if (t->split_jit[level])
            rc = pcre2_jit_match(re, (PCRE2_SPTR)p, n, start, 0, s->md, s->mctx);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) /* no JIT, or JIT ran out of stack */
            rc = pcre2_match(re, (PCRE2_SPTR)p, n, start, PCRE2_NO_UTF_CHECK, s->md, s->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return ts_error(TS_ERR_RANGE, "%s: pre-tokenizer regex failed on a %zu-byte text: %s",
                            t->path, n, (const char *)msg);
        }
        size_t ms = ov[0], me = ov[1];
        if (ms == me && me == last_end) {
            /* An empty match right after the previous one: step over one character. */
            size_t step = 1;
            while (me + step < n && ((uint8_t)p[me + step] & 0xC0) == 0x80)
                step++;
            start = me + step;
            continue;
        }
        if (gap < ms) TS_TRY(bpe_pretok(t, s, level + 1, p + gap, ms - gap, out));
        if (ms < me) TS_TRY(bpe_pretok(t, s, level + 1, p + ms, me - ms, out));
        gap = start = last_end = me;
    }
    return gap < n ? bpe_pretok(t, s, level + 1, p + gap, n - gap, out) : TS_OK;
}

/* Splits p[0..n) around the added tokens of matcher m (leftmost, longest first). stage 1 is
 * the raw text; its gaps are normalized and go to stage 2 (tokens matched after
 * normalization); stage 2's gaps go to the pre-tokenizer. A special token met while
 * parse_special is off stays part of the text, and the scan resumes after it (as HF). */
static ts_status bpe_added_split(const ts_bpe *t, bpe_scratch *s, int stage, const char *p,
                                 size_t n, bool parse_special, ts_ids *out);

/* NFC of p[0..n) appended to out. Code points below U+0300 (lead byte < 0xCC) are starters
 * that never combine with what precedes them and are already NFC, so text splits into
 * independent pieces before each of them: only runs of code points >= U+0300, together with
 * the one character before the run (which may compose with it), go through utf8proc. */
static ts_status bpe_nfc_append(const char *p, size_t n, ts_strbuf *out) {
    size_t i = 0, copied = 0;
    while (i < n) {
        if ((uint8_t)p[i] < 0xCC) {
            i++;
            continue;
        }
        size_t start = i, end = i;
        if (start > copied) {
            start--;
            while (start > copied && ((uint8_t)p[start] & 0xC0) == 0x80)
                start--;
        }
        while (end < n &&
               !((uint8_t)p[end] < 0x80 || ((uint8_t)p[end] >= 0xC0 && (uint8_t)p[end] < 0xCC)))
            end++;
        TS_TRY(ts_strbuf_append(out, p + copied, start - copied));
        char *q;
        size_t qn;
        TS_TRY(bpe_nfc(p + start, end - start, &q, &qn));
        ts_status st = ts_strbuf_append(out, q, qn);
        free(q);
        TS_TRY(st);
        copied = i = end;
    }
    return ts_strbuf_append(out, p + copied, n - copied);
}

ts_status bpe_replace_append(const char *s, size_t n, const char *from, size_t from_len,
                             const char *to, size_t to_len, ts_strbuf *out) {
    size_t i = 0;
    while (i < n) {
        const char *hit = memmem(s + i, n - i, from, from_len);
        size_t upto = hit ? (size_t)(hit - s) : n;
        TS_TRY(ts_strbuf_append(out, s + i, upto - i));
        if (!hit) break;
        TS_TRY(ts_strbuf_append(out, to, to_len));
        i = upto + from_len;
    }
    return TS_OK;
}

/* One NFC step: text without a code point >= U+0300 (lead byte >= 0xCC) is already NFC. */
static ts_status bpe_nfc_step(const char *p, size_t n, ts_strbuf *out) {
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)p[i] >= 0xCC) return bpe_nfc_append(p, n, out);
    return ts_strbuf_append(out, p, n);
}

ts_status bpe_normalize(const ts_bpe *t, const char *s, size_t n, ts_strbuf *out, ts_strbuf *work) {
    /* Steps alternate between the two buffers so that the last one writes into out. */
    const char *src = s;
    size_t src_len = n;
    for (int i = 0; i < t->n_norm; i++) {
        ts_strbuf *dst = (t->n_norm - 1 - i) % 2 == 0 ? out : work;
        dst->len = 0;
        TS_TRY(ts_strbuf_reserve(dst, src_len));
        const bpe_norm_step *st = &t->norm[i];
        TS_TRY(st->nfc ? bpe_nfc_step(src, src_len, dst)
                       : bpe_replace_append(src, src_len, st->from, st->from_len, st->to,
                                            st->to_len, dst));
        src = dst->data;
        src_len = dst->len;
    }
    if (t->n_norm == 0) {
        out->len = 0;
        TS_TRY(ts_strbuf_append(out, s, n));
    }
    return TS_OK;
}

/* Whether the normalizer leaves p[0..n) as it is: no steps, or only NFC and p has nothing it
 * could change (the common case for Qwen's text, which then needs no copy). */
static bool bpe_norm_identity(const ts_bpe *t, const char *p, size_t n) {
    for (int i = 0; i < t->n_norm; i++)
        if (!t->norm[i].nfc) return false;
    for (size_t i = 0; t->n_norm && i < n; i++)
        if ((uint8_t)p[i] >= 0xCC) return false;
    return true;
}

static ts_status bpe_gap(const ts_bpe *t, bpe_scratch *s, int stage, const char *p, size_t n,
                         bool parse_special, ts_ids *out) {
    if (n == 0) return TS_OK;
    if (stage == 2) return bpe_pretok(t, s, 0, p, n, out);
    if (bpe_norm_identity(t, p, n)) return bpe_added_split(t, s, 2, p, n, parse_special, out);
    /* Gaps are finished one after another and stage 2 never comes back here: one buffer. */
    TS_TRY(bpe_normalize(t, p, n, &s->norm, &s->norm_work));
    return bpe_added_split(t, s, 2, s->norm.data, s->norm.len, parse_special, out);
}

/* The added token of m whose pattern is the longest one starting at p[0..n), or NULL. */
static const bpe_added *bpe_match_at(const ts_bpe *t, const bpe_matcher *m, const char *p,
                                     size_t n) {
    uint8_t b = (uint8_t)p[0];
    for (int32_t k = m->first[b]; k < m->first[b + 1]; k++) {
        size_t len = m->lens[k];
        if (len > n) continue;
        for (size_t i = bpe_hash(p, len) & m->mask; m->slots[i] >= 0; i = (i + 1) & m->mask) {
            const bpe_added *a = &t->added[m->slots[i]];
            if (a->pattern_len == len && memcmp(a->pattern, p, len) == 0) return a;
        }
    }
    return NULL;
}

static ts_status bpe_added_split(const ts_bpe *t, bpe_scratch *s, int stage, const char *p,
                                 size_t n, bool parse_special, ts_ids *out) {
    const bpe_matcher *m = stage == 1 ? &t->raw_match : &t->norm_match;
    if (m->n == 0) return bpe_gap(t, s, stage, p, n, parse_special, out);
    size_t gap = 0, i = 0;
    while (i < n) {
        uint8_t b = (uint8_t)p[i], b1 = i + 1 < n ? (uint8_t)p[i + 1] : 0;
        bool maybe = m->single[b] || (i + 1 < n && (m->second[b][b1 >> 6] >> (b1 & 63) & 1));
        const bpe_added *a = maybe ? bpe_match_at(t, m, p + i, n - i) : NULL;
        if (!a) {
            i++;
            continue;
        }
        if (a->special && !parse_special) {
            i += a->pattern_len;
            continue;
        }
        TS_TRY(bpe_gap(t, s, stage, p + gap, i - gap, parse_special, out));
        TS_TRY(s->piece_fn ? s->piece_fn(s->piece_ctx, NULL, 0, a->id) : ts_ids_push(out, a->id));
        i += a->pattern_len;
        gap = i;
    }
    return bpe_gap(t, s, stage, p + gap, n - gap, parse_special, out);
}

static ts_status bpe_encode(const ts_bpe *t, const char *text, size_t len, bool parse_special,
                            bpe_piece_fn fn, void *ctx, ts_ids *out) {
    if (!t || !out || (!text && len))
        return ts_error(TS_ERR_INVALID, "ts_bpe_encode: null argument");
    if (len == 0) return TS_OK;
    bpe_scratch *s = bpe_scratch_get(t);
    if (!s) return ts_error(TS_ERR_NOMEM, "%s: out of memory for encoder state", t->path);
    s->piece_fn = fn;
    s->piece_ctx = ctx;
    size_t before = out->len;
    ts_status st = TS_OK;
    if (!ts_utf8_valid(text, len)) {
        s->clean.len = 0;
        st = ts_utf8_append_lossy(&s->clean, text, len);
        text = s->clean.data;
        len = s->clean.len;
    }
    if (st == TS_OK) st = bpe_added_split(t, s, 1, text, len, parse_special, out);
    s->piece_fn = NULL;
    bpe_scratch_put(t, s);
    if (st != TS_OK) out->len = before;
    return st;
}

ts_status ts_bpe_encode(const ts_bpe *t, const char *text, size_t len, bool parse_special,
                        ts_ids *out) {
    return bpe_encode(t, text, len, parse_special, NULL, NULL, out);
}

ts_status bpe_pretokenize(const ts_bpe *t, const char *text, size_t len, bool parse_special,
                          bpe_piece_fn fn, void *ctx) {
    ts_ids unused = {0};
    return bpe_encode(t, text, len, parse_special, fn, ctx, &unused);
}

/* ---- lookups and decoding ------------------------------------------------------------------- */

int ts_bpe_vocab_size(const ts_bpe *t) { return t->n_ids; }

bool ts_bpe_is_special(const ts_bpe *t, int32_t id) {
    return id >= 0 && id < t->n_ids && (t->tok_flags[id] & BPE_TOK_SPECIAL);
}

const char *ts_bpe_token_bytes(const ts_bpe *t, int32_t id, size_t *len) {
    *len = 0;
    if (id < 0 || id >= t->n_ids) return NULL;
    if (!(t->tok_flags[id] & BPE_TOK_PRESENT)) return "";
    *len = t->tok_len[id];
    return t->blob + t->tok_off[id];
}

/* The regular token that decodes to text[0..n) exactly, -1 when none. Byte-level: text
 * spelled in the alphabet, or a token outside the alphabet spelled as itself. Otherwise:
 * the decoder's Replace undone, or the text itself. */
static int32_t bpe_regular_id(const ts_bpe *t, const char *text, size_t n, ts_strbuf *tmp) {
    int32_t id = -1;
    if (t->byte_level) {
        if (ts_strbuf_reserve(tmp, 2 * n) != TS_OK) return -1;
        id = bpe_vocab_find(t, tmp->data,
                            bpe_bytes_to_spelling((const uint8_t *)text, n, tmp->data));
    } else if (t->dec_from_len && bpe_replace_append(text, n, t->dec_to, t->dec_to_len, t->dec_from,
                                                     t->dec_from_len, tmp) == TS_OK) {
        id = bpe_vocab_find(t, tmp->data ? tmp->data : "", tmp->len);
    }
    if (id < 0) id = bpe_vocab_find(t, text, n);
    if (id < 0 || t->tok_len[id] != n || memcmp(t->blob + t->tok_off[id], text, n) != 0) return -1;
    return id;
}

int32_t ts_bpe_token_id(const ts_bpe *t, const char *token_text) {
    size_t n = strlen(token_text);
    for (int i = 0; i < t->n_added; i++)
        if (strcmp(t->added[i].content, token_text) == 0) return t->added[i].id;
    if (n == 0 || n > 4096) return -1;
    ts_strbuf tmp = {0};
    int32_t id = bpe_regular_id(t, token_text, n, &tmp);
    ts_strbuf_free(&tmp);
    return id;
}

void ts_bpe_post_tokens(const ts_bpe *t, int32_t *bos, int32_t *eos) {
    *bos = t->post_bos;
    *eos = t->post_eos;
}

static bool bpe_is_byte(const ts_bpe *t, int32_t id) {
    return id >= 0 && id < t->n_ids && (t->tok_flags[id] & BPE_TOK_BYTE);
}

ts_status ts_bpe_decode(const ts_bpe *t, const int32_t *ids, size_t n, bool skip_special,
                        char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    /* Byte-level: all the bytes in raw, made valid at the end. Otherwise every regular token is
     * text already, and raw holds a run of ByteFallback bytes, joined on its own (as HF). */
    ts_strbuf raw = {0}, text = {0};
    ts_status st = TS_OK;
    for (size_t i = 0; i < n && st == TS_OK; i++) {
        size_t bl;
        const char *b = ts_bpe_token_bytes(t, ids[i], &bl);
        if (!b) {
            st = ts_error(TS_ERR_RANGE, "decode: token id %d at index %zu is outside [0, %d)",
                          (int)ids[i], i, t->n_ids);
        } else if (skip_special && ts_bpe_is_special(t, ids[i])) {
            continue;
        } else if (t->byte_level || bpe_is_byte(t, ids[i])) {
            st = ts_strbuf_append(&raw, b, bl);
        } else {
            if (raw.len) st = ts_utf8_append_byte_run(&text, raw.data, raw.len);
            raw.len = 0;
            if (st == TS_OK) st = ts_strbuf_append(&text, b, bl);
        }
    }
    if (st == TS_OK && t->byte_level)
        st = ts_utf8_append_lossy(&text, raw.data ? raw.data : "", raw.len);
    if (st == TS_OK && !t->byte_level && raw.len)
        st = ts_utf8_append_byte_run(&text, raw.data, raw.len);
    if (st == TS_OK && !text.data) st = ts_strbuf_reserve(&text, 0);
    ts_strbuf_free(&raw);
    if (st != TS_OK) {
        ts_strbuf_free(&text);
        return st;
    }
    *out = text.data;
    *len = text.len;
    return TS_OK;
}

static const char *bpe_source_bytes(const void *ctx, int32_t id, size_t *len) {
    return ts_bpe_token_bytes(ctx, id, len);
}

static bool bpe_source_special(const void *ctx, int32_t id) { return ts_bpe_is_special(ctx, id); }

static bool bpe_source_byte(const void *ctx, int32_t id) { return bpe_is_byte(ctx, id); }

void ts_bpe_token_source(const ts_bpe *t, ts_token_source *src) {
    src->ctx = t;
    src->token_bytes = bpe_source_bytes;
    src->is_special = bpe_source_special;
    src->is_byte = t->byte_level ? NULL : bpe_source_byte;
}
