/* SentencePiece-style BPE as llama.cpp runs it for "llama" vocabularies (see spm.h). */
#include "text/spm.h"

#include "base/byte_piece.h"
#include "base/status.h"
#include "text/space_cut.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPM_SPACE     "\xE2\x96\x81" /* U+2581, SentencePiece's visible space */
#define SPM_SPACE_LEN 3

/* Lengths of the special tokens that start with a given byte, longest first, and which second
 * bytes occur (so a position is rejected without hashing in the common case). */
typedef struct {
    int32_t first[257]; /* lens[first[b] .. first[b+1]) */
    uint32_t *lens;
    uint8_t second[256][32]; /* bit c of second[b]: some token of length >= 2 is "bc..." */
} spm_starts;

struct ts_spm {
    char *name;
    int32_t n;
    uint32_t *off, *len;   /* piece of id: pieces + off[id], len[id] bytes */
    uint32_t *doff, *dlen; /* decoded bytes of id in dec */
    char *pieces, *dec;
    float *score;
    uint8_t *type;
    int32_t *slots; /* piece -> id, open addressing, -1 free */
    size_t mask;
    int32_t *sslots; /* special piece -> id (control, user-defined, unknown) */
    size_t smask;
    spm_starts user; /* user-defined tokens only (parse_special off) */
    spm_starts all;  /* every special token (parse_special on) */
    int32_t byte_id[256];
    bool add_space_prefix;
    ts_space_glue space_glue; /* where a fragment may be cut before a U+2581 (space_cut.h) */
};

static uint64_t spm_hash(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
}

static int32_t spm_find(const ts_spm *t, const int32_t *slots, size_t mask, const char *s,
                        size_t n) {
    size_t i = spm_hash(s, n) & mask;
    for (;;) {
        int32_t id = slots[i];
        if (id < 0) return -1;
        if (t->len[id] == n && memcmp(t->pieces + t->off[id], s, n) == 0) return id;
        i = (i + 1) & mask;
    }
}

/* Inserts id; on an equal piece, replace says whether the new id wins. */
static void spm_insert(ts_spm *t, int32_t *slots, size_t mask, int32_t id, bool replace) {
    const char *s = t->pieces + t->off[id];
    size_t n = t->len[id];
    size_t i = spm_hash(s, n) & mask;
    while (slots[i] >= 0) {
        int32_t o = slots[i];
        if (t->len[o] == n && memcmp(t->pieces + t->off[o], s, n) == 0) {
            if (replace) slots[i] = id;
            return;
        }
        i = (i + 1) & mask;
    }
    slots[i] = id;
}

static size_t spm_table(size_t n) {
    size_t size = 16;
    while (size < 2 * n)
        size *= 2;
    return size;
}

static bool spm_special_type(uint8_t type) {
    return type == TS_SPM_CONTROL || type == TS_SPM_USER_DEFINED || type == TS_SPM_UNKNOWN;
}

static int spm_cmp_u32_desc(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static ts_status spm_build_starts(ts_spm *t, spm_starts *st, bool user_only) {
    /* (first byte, length) pairs, deduplicated, longest first within a byte. */
    size_t cap = 0;
    for (int32_t id = 0; id < t->n; id++)
        if (spm_special_type(t->type[id])) cap++;
    uint32_t *keys = malloc((cap ? cap : 1) * sizeof *keys);
    if (!keys) return ts_error(TS_ERR_NOMEM, "%s: out of memory", t->name);
    size_t k = 0;
    memset(st->second, 0, sizeof st->second);
    for (int32_t id = 0; id < t->n; id++) {
        uint8_t ty = t->type[id];
        if (!spm_special_type(ty) || (user_only && ty != TS_SPM_USER_DEFINED)) continue;
        const uint8_t *p = (const uint8_t *)t->pieces + t->off[id];
        uint32_t len = t->len[id];
        if (len > 0xFFFFFF) continue;
        keys[k++] = ((uint32_t)p[0] << 24) | (0xFFFFFF - len); /* sorts byte asc, len desc */
        if (len >= 2) st->second[p[0]][p[1] >> 3] |= (uint8_t)(1u << (p[1] & 7));
    }
    qsort(keys, k, sizeof *keys, spm_cmp_u32_desc);
    /* descending order gave byte desc; reverse to byte asc, len desc */
    for (size_t i = 0; i < k / 2; i++) {
        uint32_t x = keys[i];
        keys[i] = keys[k - 1 - i];
        keys[k - 1 - i] = x;
    }
    size_t m = 0;
    for (size_t i = 0; i < k; i++)
        if (m == 0 || keys[m - 1] != keys[i]) keys[m++] = keys[i];
    st->lens = malloc((m ? m : 1) * sizeof *st->lens);
    if (!st->lens) {
        free(keys);
        return ts_error(TS_ERR_NOMEM, "%s: out of memory", t->name);
    }
    size_t j = 0;
    for (int b = 0; b <= 256; b++) {
        while (j < m && (keys[j] >> 24) < (uint32_t)b)
            j++;
        st->first[b] = (int32_t)j;
    }
    for (size_t i = 0; i < m; i++)
        st->lens[i] = 0xFFFFFF - (keys[i] & 0xFFFFFF);
    free(keys);
    return TS_OK;
}

static ts_status spm_fill(ts_spm *t, const ts_spm_spec *spec) {
    size_t n = (size_t)spec->n_tokens, total = 0, dtotal = 0;
    for (size_t i = 0; i < n; i++) {
        if (!spec->text[i] || spec->len[i] == 0 || spec->len[i] > UINT32_MAX / 4)
            return ts_error(TS_ERR_FORMAT, "%s: token %zu: empty piece", t->name, i);
        total += spec->len[i];
        if (total > UINT32_MAX / 2)
            return ts_error(TS_ERR_RANGE, "%s: vocabulary too large", t->name);
    }
    t->off = malloc(n * sizeof *t->off);
    t->len = malloc(n * sizeof *t->len);
    t->doff = malloc(n * sizeof *t->doff);
    t->dlen = malloc(n * sizeof *t->dlen);
    t->score = malloc(n * sizeof *t->score);
    t->type = malloc(n);
    t->pieces = malloc(total + 1);
    t->dec = malloc(total + 1); /* decoding never lengthens a piece (U+2581 -> ' ') */
    t->mask = spm_table(n) - 1;
    t->slots = malloc((t->mask + 1) * sizeof *t->slots);
    if (!t->off || !t->len || !t->doff || !t->dlen || !t->score || !t->type || !t->pieces ||
        !t->dec || !t->slots)
        return ts_error(TS_ERR_NOMEM, "%s: out of memory for %zu tokens", t->name, n);
    total = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t ty = spec->types ? spec->types[i] : TS_SPM_NORMAL;
        if (ty < TS_SPM_UNDEFINED || ty > TS_SPM_BYTE)
            return ts_error(TS_ERR_FORMAT, "%s: token %zu: unknown token type %d", t->name, i,
                            (int)ty);
        const char *s = spec->text[i];
        size_t len = spec->len[i];
        t->type[i] = (uint8_t)ty;
        t->score[i] = spec->scores ? spec->scores[i] : 0.0f;
        t->off[i] = (uint32_t)total;
        t->len[i] = (uint32_t)len;
        memcpy(t->pieces + total, s, len);
        total += len;
        char *d = t->dec + dtotal;
        size_t dl = 0;
        if (ty == TS_SPM_NORMAL) {
            for (size_t j = 0; j < len;) {
                if (j + SPM_SPACE_LEN <= len && memcmp(s + j, SPM_SPACE, SPM_SPACE_LEN) == 0) {
                    d[dl++] = ' ';
                    j += SPM_SPACE_LEN;
                } else {
                    d[dl++] = s[j++];
                }
            }
        } else if (ty == TS_SPM_BYTE) {
            int b = ts_byte_piece(s, len, false);
            if (b < 0)
                return ts_error(TS_ERR_FORMAT, "%s: token %zu: byte token '%.*s' is not <0xXX>",
                                t->name, i, (int)(len > 16 ? 16 : len), s);
            d[dl++] = (char)b;
        } else if (ty != TS_SPM_UNUSED && ty != TS_SPM_UNDEFINED) {
            memcpy(d, s, len);
            dl = len;
        }
        t->doff[i] = (uint32_t)dtotal;
        t->dlen[i] = (uint32_t)dl;
        dtotal += dl;
    }
    t->pieces[total] = 0;
    t->dec[dtotal] = 0;
    memset(t->slots, 0xff, (t->mask + 1) * sizeof *t->slots);
    for (int32_t id = 0; id < t->n; id++)
        spm_insert(t, t->slots, t->mask, id, true); /* a later id wins, as llama.cpp's map */
    size_t n_special = 0;
    for (int32_t id = 0; id < t->n; id++)
        if (spm_special_type(t->type[id])) n_special++;
    t->smask = spm_table(n_special) - 1;
    t->sslots = malloc((t->smask + 1) * sizeof *t->sslots);
    if (!t->sslots) return ts_error(TS_ERR_NOMEM, "%s: out of memory", t->name);
    memset(t->sslots, 0xff, (t->smask + 1) * sizeof *t->sslots);
    for (int32_t id = 0; id < t->n; id++)
        if (spm_special_type(t->type[id])) spm_insert(t, t->sslots, t->smask, id, false);
    TS_TRY(spm_build_starts(t, &t->user, true));
    TS_TRY(spm_build_starts(t, &t->all, false));
    for (int b = 0; b < 256; b++) {
        char hex[7], one = (char)b;
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        int32_t id = spm_find(t, t->slots, t->mask, hex, 6);
        if (id < 0) id = spm_find(t, t->slots, t->mask, &one, 1);
        if (id < 0) id = spec->unk_id;
        if (id < 0 || id >= t->n)
            return ts_error(TS_ERR_UNSUPPORTED,
                            "%s: no token for byte 0x%02x (no <0x%02X> piece, no unknown token)",
                            t->name, b, b);
        t->byte_id[b] = id;
    }
    return TS_OK;
}

ts_status ts_spm_build(const ts_spm_spec *spec, ts_spm **out) {
    *out = NULL;
    const char *name = spec->name ? spec->name : "tokenizer";
    if (spec->n_tokens <= 0 || !spec->text || !spec->len)
        return ts_error(TS_ERR_FORMAT, "%s: empty vocabulary", name);
    if (spec->n_tokens >= (1 << 30))
        return ts_error(TS_ERR_RANGE, "%s: %d tokens is too many", name, (int)spec->n_tokens);
    ts_spm *t = calloc(1, sizeof *t);
    if (!t) return ts_error(TS_ERR_NOMEM, "%s: out of memory", name);
    t->name = strdup(name);
    t->n = spec->n_tokens;
    t->add_space_prefix = spec->add_space_prefix;
    ts_status st = t->name ? spm_fill(t, spec) : ts_error(TS_ERR_NOMEM, "out of memory");
    t->space_glue.on = true;
    for (int32_t id = 0; st == TS_OK && id < t->n; id++)
        ts_space_glue_add(&t->space_glue, t->pieces + t->off[id], t->len[id]);
    if (st != TS_OK) {
        ts_spm_free(t);
        return st;
    }
    *out = t;
    return TS_OK;
}

void ts_spm_free(ts_spm *t) {
    if (!t) return;
    free(t->user.lens);
    free(t->all.lens);
    free(t->sslots);
    free(t->slots);
    free(t->dec);
    free(t->pieces);
    free(t->type);
    free(t->score);
    free(t->dlen);
    free(t->doff);
    free(t->len);
    free(t->off);
    free(t->name);
    free(t);
}

int ts_spm_vocab_size(const ts_spm *t) { return t->n; }

int32_t ts_spm_token_id(const ts_spm *t, const char *text) {
    size_t n = strlen(text);
    return n ? spm_find(t, t->slots, t->mask, text, n) : -1;
}

ts_spm_type ts_spm_token_type(const ts_spm *t, int32_t id) {
    return id >= 0 && id < t->n ? (ts_spm_type)t->type[id] : TS_SPM_UNDEFINED;
}

const char *ts_spm_token_piece(const ts_spm *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n) return NULL;
    *len = t->len[id];
    return t->pieces + t->off[id];
}

const char *ts_spm_token_bytes(const ts_spm *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n) return NULL;
    *len = t->dlen[id];
    return t->dec + t->doff[id];
}

bool ts_spm_is_special(const ts_spm *t, int32_t id) {
    return id >= 0 && id < t->n && (t->type[id] == TS_SPM_CONTROL || t->type[id] == TS_SPM_UNKNOWN);
}

/* ---- encoding: special tokens -------------------------------------------------------------- */

typedef struct {
    uint32_t pos, len;
    int32_t id;
} spm_occ;

typedef struct {
    spm_occ *v;
    size_t n, cap;
} spm_occs;

static ts_status spm_occ_push(spm_occs *o, uint32_t pos, uint32_t len, int32_t id) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 64;
        spm_occ *p = realloc(o->v, cap * sizeof *p);
        if (!p) return ts_error(TS_ERR_NOMEM, "out of memory");
        o->v = p;
        o->cap = cap;
    }
    o->v[o->n++] = (spm_occ){pos, len, id};
    return TS_OK;
}

/* llama.cpp's order: longer tokens first over the whole text; ties by id (its sort leaves
 * equal lengths in an unspecified order, which only matters for overlapping equal-length
 * tokens), then left to right. */
static int spm_occ_priority(const void *a, const void *b) {
    const spm_occ *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static int spm_occ_position(const void *a, const void *b) {
    const spm_occ *x = a, *y = b;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* Finds the special tokens that split the text, in text order. Taking each token in llama.cpp's
 * order and keeping the occurrences that do not overlap a kept one is what its repeated
 * fragment splitting amounts to. A kept occurrence is at least as long as a later candidate, so
 * an overlap always covers one of the candidate's end bytes. */
static ts_status spm_split_special(const ts_spm *t, const char *s, size_t n, bool parse_special,
                                   spm_occs *o) {
    const spm_starts *st = parse_special ? &t->all : &t->user;
    for (size_t p = 0; p < n; p++) {
        uint8_t b = (uint8_t)s[p];
        int32_t k0 = st->first[b], k1 = st->first[b + 1];
        if (k0 == k1) continue;
        bool second =
            p + 1 < n && (st->second[b][(uint8_t)s[p + 1] >> 3] >> ((uint8_t)s[p + 1] & 7)) & 1;
        for (int32_t k = k0; k < k1; k++) {
            uint32_t len = st->lens[k];
            if (len > n - p || (len >= 2 && !second)) continue;
            int32_t id = spm_find(t, t->sslots, t->smask, s + p, len);
            if (id < 0) continue;
            if (!parse_special && t->type[id] != TS_SPM_USER_DEFINED) continue;
            TS_TRY(spm_occ_push(o, (uint32_t)p, len, id));
        }
    }
    if (o->n < 2) return TS_OK;
    qsort(o->v, o->n, sizeof *o->v, spm_occ_priority);
    uint8_t *taken = calloc(n, 1);
    if (!taken) return ts_error(TS_ERR_NOMEM, "out of memory");
    size_t kept = 0;
    for (size_t i = 0; i < o->n; i++) {
        spm_occ c = o->v[i];
        if (taken[c.pos] || taken[c.pos + c.len - 1]) continue;
        memset(taken + c.pos, 1, c.len);
        o->v[kept++] = c;
    }
    free(taken);
    o->n = kept;
    qsort(o->v, o->n, sizeof *o->v, spm_occ_position);
    return TS_OK;
}

/* ---- encoding: merging one fragment --------------------------------------------------------- */

typedef struct {
    uint32_t off, n; /* bytes of the escaped fragment; n = 0 once merged away */
    int32_t prev, next;
} spm_sym;

typedef struct {
    float score;
    int32_t left, right;
    uint32_t size;
} spm_pair;

typedef struct {
    ts_strbuf text; /* the fragment with spaces escaped */
    spm_sym *sym;
    size_t sym_cap;
    spm_pair *heap;
    size_t heap_n, heap_cap;
} spm_work;

/* Heap order: highest score first, then leftmost. */
static bool spm_before(const spm_pair *a, const spm_pair *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static ts_status spm_heap_push(spm_work *w, spm_pair p) {
    if (w->heap_n == w->heap_cap) {
        size_t cap = w->heap_cap ? 2 * w->heap_cap : 256;
        spm_pair *h = realloc(w->heap, cap * sizeof *h);
        if (!h) return ts_error(TS_ERR_NOMEM, "out of memory");
        w->heap = h;
        w->heap_cap = cap;
    }
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!spm_before(&p, &w->heap[up])) break;
        w->heap[i] = w->heap[up];
        i = up;
    }
    w->heap[i] = p;
    return TS_OK;
}

static spm_pair spm_heap_pop(spm_work *w) {
    spm_pair top = w->heap[0], last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && spm_before(&w->heap[c + 1], &w->heap[c])) c++;
        if (!spm_before(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

static ts_status spm_try_pair(const ts_spm *t, spm_work *w, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return TS_OK;
    const spm_sym *l = &w->sym[left], *r = &w->sym[right];
    uint32_t size = l->n + r->n;
    int32_t id = spm_find(t, t->slots, t->mask, w->text.data + l->off, size);
    if (id < 0) return TS_OK;
    return spm_heap_push(w, (spm_pair){t->score[id], left, right, size});
}

/* Merges w->text[base .. base + n) (symbols keep offsets into w->text). */
static ts_status spm_merge_fragment(const ts_spm *t, spm_work *w, size_t base, size_t n,
                                    ts_ids *out) {
    const char *s = w->text.data;
    if (n > w->sym_cap) {
        spm_sym *p = realloc(w->sym, n * sizeof *p);
        if (!p) return ts_error(TS_ERR_NOMEM, "out of memory");
        w->sym = p;
        w->sym_cap = n;
    }
    int32_t count = 0;
    for (size_t i = base; i < base + n;) {
        uint32_t cp;
        size_t cl;
        ts_utf8_next(s + i, base + n - i, &cp, &cl); /* the text is valid UTF-8 here */
        w->sym[count] = (spm_sym){(uint32_t)i, (uint32_t)cl, count - 1, -1};
        if (count > 0) w->sym[count - 1].next = count;
        count++;
        i += cl;
    }
    w->heap_n = 0;
    for (int32_t i = 1; i < count; i++)
        TS_TRY(spm_try_pair(t, w, i - 1, i));
    while (w->heap_n) {
        spm_pair p = spm_heap_pop(w);
        spm_sym *l = &w->sym[p.left], *r = &w->sym[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) w->sym[r->next].prev = p.left;
        TS_TRY(spm_try_pair(t, w, l->prev, p.left));
        TS_TRY(spm_try_pair(t, w, p.left, l->next));
    }
    for (int32_t i = count ? 0 : -1; i >= 0; i = w->sym[i].next) {
        const spm_sym *y = &w->sym[i];
        int32_t id = spm_find(t, t->slots, t->mask, s + y->off, y->n);
        if (id >= 0) {
            TS_TRY(ts_ids_push(out, id));
            continue;
        }
        /* Only a single character can be missing from the vocabulary (merges make pieces). */
        TS_TRY(ts_ids_reserve(out, y->n));
        for (uint32_t j = 0; j < y->n; j++)
            out->data[out->len++] = t->byte_id[(uint8_t)s[y->off + j]];
    }
    return TS_OK;
}

static ts_status spm_fragment(const ts_spm *t, spm_work *w, const char *s, size_t n, bool prefix,
                              ts_ids *out) {
    w->text.len = 0;
    if (prefix) TS_TRY(ts_strbuf_append(&w->text, SPM_SPACE, SPM_SPACE_LEN));
    size_t run = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && s[i] != ' ') continue;
        TS_TRY(ts_strbuf_append(&w->text, s + run, i - run));
        if (i < n) TS_TRY(ts_strbuf_append(&w->text, SPM_SPACE, SPM_SPACE_LEN));
        run = i + 1;
    }
    /* merged in parts cut before its spaces: the same ids, smaller work lists */
    for (size_t start = 0, end; start < w->text.len; start = end) {
        end = ts_space_part_end(&t->space_glue, w->text.data, w->text.len, start);
        TS_TRY(spm_merge_fragment(t, w, start, end - start, out));
    }
    return TS_OK;
}

ts_status ts_spm_encode(const ts_spm *t, const char *text, size_t len, bool parse_special,
                        ts_ids *out) {
    size_t start = out->len;
    ts_strbuf fixed = {0};
    if (len && !ts_utf8_valid(text, len)) {
        ts_status st = ts_utf8_append_lossy(&fixed, text, len);
        if (st != TS_OK) {
            ts_strbuf_free(&fixed);
            return st;
        }
        text = fixed.data;
        len = fixed.len;
    }
    if (len > UINT32_MAX / 4) {
        ts_strbuf_free(&fixed);
        return ts_error(TS_ERR_RANGE, "text of %zu bytes is too long to tokenize", len);
    }
    spm_occs occ = {0};
    spm_work w = {0};
    ts_status st = spm_split_special(t, text, len, parse_special, &occ);
    size_t pos = 0;
    bool after_special = true; /* the text start counts, for the space prefix */
    for (size_t i = 0; st == TS_OK && i <= occ.n; i++) {
        size_t end = i < occ.n ? occ.v[i].pos : len;
        if (end > pos) {
            st = spm_fragment(t, &w, text + pos, end - pos, t->add_space_prefix && after_special,
                              out);
            after_special = false;
        }
        if (st == TS_OK && i < occ.n) {
            st = ts_ids_push(out, occ.v[i].id);
            after_special = true;
            pos = occ.v[i].pos + occ.v[i].len;
        }
    }
    free(occ.v);
    ts_strbuf_free(&w.text);
    free(w.sym);
    free(w.heap);
    ts_strbuf_free(&fixed);
    if (st != TS_OK) out->len = start;
    return st;
}

/* ---- decoding -------------------------------------------------------------------------------- */

ts_status ts_spm_decode(const ts_spm *t, const int32_t *ids, size_t n, bool skip_special,
                        char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    ts_strbuf raw = {0}, text = {0};
    ts_status st = ts_strbuf_reserve(&raw, 16);
    for (size_t i = 0; st == TS_OK && i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n) {
            st = ts_error(TS_ERR_RANGE, "token id %d is outside the vocabulary (0..%d)",
                          (int)ids[i], (int)t->n - 1);
            break;
        }
        if (skip_special && ts_spm_is_special(t, ids[i])) continue;
        st = ts_strbuf_append(&raw, t->dec + t->doff[ids[i]], t->dlen[ids[i]]);
    }
    if (st == TS_OK) st = ts_strbuf_reserve(&text, raw.len + 1);
    if (st == TS_OK) st = ts_utf8_append_lossy(&text, raw.data, raw.len);
    ts_strbuf_free(&raw);
    if (st != TS_OK) {
        ts_strbuf_free(&text);
        return st;
    }
    *out = text.data;
    *len = text.len;
    return TS_OK;
}

static const char *spm_src_bytes(const void *ctx, int32_t id, size_t *len) {
    return ts_spm_token_bytes(ctx, id, len);
}

static bool spm_src_special(const void *ctx, int32_t id) { return ts_spm_is_special(ctx, id); }

void ts_spm_token_source(const ts_spm *t, ts_token_source *src) {
    src->ctx = t;
    src->token_bytes = spm_src_bytes;
    src->is_special = spm_src_special;
    src->is_byte = NULL; /* llama.cpp joins all the bytes: the lossy decode of the whole */
}
