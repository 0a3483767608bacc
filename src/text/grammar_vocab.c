/* Grammars meet tokens: the vocabulary as a trie of byte strings, which tokens a grammar state
 * allows (a mask), and taking a token.
 *
 * A token is allowed when the automaton can take all of its bytes. The mask walks the trie
 * depth first, advancing the state a byte per edge, so the bytes that tokens share are matched
 * once, and a subtree whose first byte no stack can take is skipped whole. Inside a JSON string
 * nearly every token is allowed and the walk visits most of the trie, so masks are remembered
 * per state (a few per matcher): a long string comes back to the same state after every
 * character. */
#include "base/status.h"
#include "text/grammar_int.h"
#include "text/utf8.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { GV_NEVER = 0, GV_TEXT = 1, GV_EOG = 2 };

struct ts_grammar_vocab {
    int n_vocab;
    uint8_t *kind; /* [n_vocab] GV_* */
    uint32_t *off; /* [n_vocab + 1] each token's bytes in blob */
    char *blob;
    /* the trie, nodes in depth-first order (node 0 the root): a node that has children has its
     * first one right after it */
    int n_nodes;
    uint8_t *byte, *has_child; /* the byte on the edge into a node */
    int32_t *next;             /* the next sibling, 0 when none */
    int32_t *tok;              /* a token whose bytes end here, -1 when none */
    int32_t *tok_next;         /* [n_vocab] the next token with the same bytes, -1 */
};

typedef struct {
    const char *p;
    uint32_t len;
    int32_t id;
} gv_tok;

static int cmp_tok(const void *a, const void *b) {
    const gv_tok *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->p, y->p, n);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

void ts_grammar_vocab_free(ts_grammar_vocab *v) {
    if (!v) return;
    free(v->kind), free(v->off), free(v->blob), free(v->byte), free(v->has_child);
    free(v->next), free(v->tok), free(v->tok_next), free(v);
}

/* Builds the trie from the text tokens sorted by their bytes: a token shares the nodes of its
 * common prefix with the one before it and adds a node for each byte after that; the first of
 * those is the next sibling of the previous token's node at that depth when that one exists. */
static ts_status build_trie(ts_grammar_vocab *v, gv_tok *t, int n) {
    size_t cap = 1;
    for (int i = 0; i < n; i++)
        cap += t[i].len;
    v->byte = calloc(cap, 1);
    v->has_child = calloc(cap, 1);
    v->next = calloc(cap, sizeof *v->next);
    v->tok = malloc(cap * sizeof *v->tok);
    int32_t *path = malloc((cap + 1) * sizeof *path); /* the previous token's nodes by depth */
    if (!v->byte || !v->has_child || !v->next || !v->tok || !path) {
        free(path);
        return ts_error(TS_ERR_NOMEM, "out of memory for the grammar vocabulary");
    }
    int nn = 1, prev_len = 0;
    v->tok[0] = -1;
    path[0] = 0;
    const gv_tok *prev = NULL;
    for (int i = 0; i < n; i++) {
        uint32_t lcp = 0;
        if (prev)
            while (lcp < prev->len && lcp < t[i].len && prev->p[lcp] == t[i].p[lcp])
                lcp++;
        if (prev && lcp == t[i].len && lcp == prev->len) { /* the same bytes */
            int32_t at = path[lcp];
            v->tok_next[t[i].id] = v->tok[at];
            v->tok[at] = t[i].id;
            continue;
        }
        for (uint32_t d = lcp; d < t[i].len; d++) {
            int32_t c = nn++;
            v->byte[c] = (uint8_t)t[i].p[d];
            v->tok[c] = -1;
            if (d == lcp && (int)lcp < prev_len)
                v->next[path[d + 1]] = c; /* after the previous token's node at this depth */
            else
                v->has_child[path[d]] = 1; /* a first child: right after its parent */
            path[d + 1] = c;
        }
        v->tok[path[t[i].len]] = t[i].id;
        prev = &t[i], prev_len = (int)t[i].len;
    }
    v->n_nodes = nn;
    free(path);
    return TS_OK;
}

ts_status ts_grammar_vocab_create(const ts_tokenizer *tok, const int32_t *exclude, int n_exclude,
                                  ts_grammar_vocab **out) {
    *out = NULL;
    ts_grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) return ts_error(TS_ERR_NOMEM, "out of memory for the grammar vocabulary");
    ts_token_source src;
    ts_tokenizer_token_source(tok, &src);
    int nv = v->n_vocab = ts_tokenizer_vocab_size(tok);
    v->kind = calloc((size_t)nv, 1);
    v->off = malloc(((size_t)nv + 1) * sizeof *v->off);
    v->tok_next = malloc((size_t)nv * sizeof *v->tok_next);
    gv_tok *t = malloc((size_t)nv * sizeof *t);
    size_t total = 0;
    if (!v->kind || !v->off || !v->tok_next || !t) goto oom;
    int n = 0;
    for (int32_t id = 0; id < nv; id++) {
        size_t len = 0;
        const char *p = src.token_bytes(src.ctx, id, &len);
        v->tok_next[id] = -1;
        v->off[id] = (uint32_t)total;
        if (ts_tokenizer_is_eog(tok, id)) {
            v->kind[id] = GV_EOG;
        } else if (p && len > 0 && !src.is_special(src.ctx, id)) {
            v->kind[id] = GV_TEXT;
            t[n++] = (gv_tok){p, (uint32_t)len, id};
            total += len;
        }
    }
    v->off[nv] = (uint32_t)total;
    for (int i = 0; i < n_exclude; i++)
        if (exclude[i] >= 0 && exclude[i] < nv && v->kind[exclude[i]] == GV_TEXT)
            v->kind[exclude[i]] = GV_NEVER;
    v->blob = malloc(total ? total : 1);
    if (!v->blob) goto oom;
    for (int i = 0; i < n; i++)
        memcpy(v->blob + v->off[t[i].id], t[i].p, t[i].len);
    /* the trie of the tokens that may match (the excluded ones left out) */
    int k = 0;
    for (int i = 0; i < n; i++)
        if (v->kind[t[i].id] == GV_TEXT) t[k++] = t[i];
    qsort(t, (size_t)k, sizeof *t, cmp_tok);
    ts_status st = build_trie(v, t, k);
    free(t);
    if (st != TS_OK) {
        ts_grammar_vocab_free(v);
        return st;
    }
    *out = v;
    return TS_OK;
oom:
    free(t);
    ts_grammar_vocab_free(v);
    return ts_error(TS_ERR_NOMEM, "out of memory for the grammar vocabulary");
}

/* ---- tokens against a state ------------------------------------------------------------- */

/* Runs the bytes of a text token from the current state; the new state is left at the end of
 * buf (returns its offset, *n its size, 0 when the token is not allowed). The caller keeps it
 * or truncates n_buf and n_node back. */
static int run_token(ts_grammar_matcher *m, int32_t id, int *n) {
    const ts_grammar_vocab *v = m->v;
    const char *p = v->blob + v->off[id];
    uint32_t len = v->off[id + 1] - v->off[id];
    int off = 0, cnt = m->n_cur;
    for (uint32_t i = 0; i < len && cnt > 0; i++) {
        int next = m->n_buf;
        cnt = gm_advance(m, off, cnt, (uint8_t)p[i]);
        off = next;
    }
    *n = m->oom ? 0 : cnt;
    return off;
}

static int token_kind(const ts_grammar_matcher *m, int32_t id) {
    return m->v && id >= 0 && id < m->v->n_vocab ? m->v->kind[id] : GV_NEVER;
}

bool ts_grammar_matcher_allows(ts_grammar_matcher *m, int32_t id) {
    switch (token_kind(m, id)) {
    case GV_EOG: return ts_grammar_matcher_can_end(m);
    case GV_TEXT: {
        int mark = m->n_node, n;
        run_token(m, id, &n);
        m->n_node = mark, m->n_buf = m->n_cur;
        return n > 0;
    }
    default: return false;
    }
}

ts_status ts_grammar_matcher_accept(ts_grammar_matcher *m, int32_t id) {
    switch (token_kind(m, id)) {
    case GV_EOG:
        if (!ts_grammar_matcher_can_end(m)) break;
        m->buf[0] = GM_EMPTY; /* complete: nothing more */
        m->n_cur = m->n_buf = 1;
        return TS_OK;
    case GV_TEXT: {
        int mark = m->n_node, n;
        int off = run_token(m, id, &n);
        if (m->oom) return gm_spent(m);
        if (n == 0) {
            m->n_node = mark, m->n_buf = m->n_cur;
            break;
        }
        gm_set_current(m, off, n);
        return TS_OK;
    }
    default: break;
    }
    return ts_error(TS_ERR_INVALID, "token %d does not fit the grammar here", id);
}

/* ---- masks ------------------------------------------------------------------------------ */

static void allow(uint64_t *bits, int32_t id, int *count) {
    bits[id >> 6] |= 1ull << (id & 63);
    ++*count;
}

/* The stack set buf[off, off + n) written out - each stack's positions from the top, -1 after
 * each - into m->sig_tmp; returns its length, or -1 out of memory. Equal outputs are equal
 * states, whatever nodes hold them. */
static int signature(ts_grammar_matcher *m, int off, int n, uint64_t *hash) {
    int len = 0;
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) {
        for (int32_t s = m->buf[off + i];; s = m->node[s].parent) {
            if (len == m->cap_sig_tmp) {
                int cap = m->cap_sig_tmp ? 2 * m->cap_sig_tmp : 256;
                int32_t *p = realloc(m->sig_tmp, (size_t)cap * sizeof *p);
                if (!p) return -1;
                m->sig_tmp = p, m->cap_sig_tmp = cap;
            }
            int32_t x = s < 0 ? -1 : (int32_t)m->node[s].pos;
            m->sig_tmp[len++] = x;
            h = (h ^ (uint32_t)x) * 1099511628211ull;
            if (s < 0) break;
        }
    }
    *hash = h;
    return len;
}

/* ---- the lazy DFA: states met while walking, and where each byte leads ---- */

/* States kept at most between walks: past this the table starts again (a walk itself may
 * go past it). */
#define GM_DS_MAX 4096

static void ds_clear(ts_grammar_matcher *m) {
    for (int i = 0; i < m->n_ds; i++)
        free(m->ds[i].sig);
    m->n_ds = 0;
    if (m->ds_index) memset(m->ds_index, 0xff, (size_t)m->cap_index * sizeof *m->ds_index);
}

void gm_dfa_free(ts_grammar_matcher *m) {
    ds_clear(m);
    free(m->ds), free(m->ds_index);
}

static bool ds_index_put(ts_grammar_matcher *m, int id) {
    if (2 * (m->n_ds + 1) > m->cap_index) { /* grow and rehash */
        int cap = m->cap_index ? 2 * m->cap_index : 1024;
        int32_t *ix = malloc((size_t)cap * sizeof *ix);
        if (!ix) return false;
        memset(ix, 0xff, (size_t)cap * sizeof *ix);
        free(m->ds_index);
        m->ds_index = ix, m->cap_index = cap;
        for (int i = 0; i < m->n_ds; i++)
            if (i != id) ds_index_put(m, i);
    }
    size_t mask = (size_t)m->cap_index - 1;
    for (size_t at = m->ds[id].hash & mask;; at = (at + 1) & mask)
        if (m->ds_index[at] < 0) {
            m->ds_index[at] = id;
            return true;
        }
}

/* The id of the state buf[off, off + n) (GM_DS_DEAD when n is 0), added when new; -3 out of
 * memory. */
static int ds_intern(ts_grammar_matcher *m, int off, int n) {
    if (n == 0) return GM_DS_DEAD;
    uint64_t h;
    int len = signature(m, off, n, &h);
    if (len < 0) return -3;
    if (m->cap_index) {
        size_t mask = (size_t)m->cap_index - 1;
        for (size_t at = h & mask; m->ds_index[at] >= 0; at = (at + 1) & mask) {
            const gm_dstate *d = &m->ds[m->ds_index[at]];
            if (d->hash == h && d->n_sig == len &&
                memcmp(d->sig, m->sig_tmp, (size_t)len * sizeof *d->sig) == 0)
                return m->ds_index[at];
        }
    }
    if (m->n_ds == m->cap_ds) {
        int cap = m->cap_ds ? 2 * m->cap_ds : 64;
        gm_dstate *p = realloc(m->ds, (size_t)cap * sizeof *p);
        if (!p) return -3;
        m->ds = p, m->cap_ds = cap;
    }
    gm_dstate *d = &m->ds[m->n_ds];
    d->sig = malloc((size_t)len * sizeof *d->sig);
    if (!d->sig) return -3;
    memcpy(d->sig, m->sig_tmp, (size_t)len * sizeof *d->sig);
    d->n_sig = len, d->hash = h;
    gm_first_bytes(m, off, n, d->first);
    for (int b = 0; b < 256; b++)
        d->next[b] = GM_DS_UNKNOWN;
    int id = m->n_ds++;
    if (!ds_index_put(m, id)) {
        free(d->sig);
        m->n_ds--;
        return -3;
    }
    return id;
}

/* Rebuilds state id's stacks as nodes, appended to buf; returns their count. */
static int ds_materialize(ts_grammar_matcher *m, int id) {
    int n = 0;
    for (int i = 0; i < m->ds[id].n_sig;) {
        int end = i;
        while (m->ds[id].sig[end] >= 0)
            end++;
        int32_t s = GM_EMPTY;
        for (int k = end - 1; k >= i; k--) /* bottom up */
            s = gm_new_node(m, (uint32_t)m->ds[id].sig[k], s);
        if (m->n_buf == m->cap_buf) {
            int cap = m->cap_buf ? 2 * m->cap_buf : 256;
            int32_t *p = realloc(m->buf, (size_t)cap * sizeof *p);
            if (!p) {
                m->oom = true;
                return n;
            }
            m->buf = p, m->cap_buf = cap;
        }
        m->buf[m->n_buf++] = s;
        n++;
        i = end + 1;
    }
    return n;
}

/* The state byte b leads to from state id (GM_DS_DEAD when no stack takes it): from the table,
 * or found by running the stacks once. -3 out of memory. */
static int ds_step(ts_grammar_matcher *m, int id, uint8_t b) {
    int nx = m->ds[id].next[b];
    if (nx != GM_DS_UNKNOWN) return nx;
    int node_mark = m->n_node, buf_mark = m->n_buf;
    int n = ds_materialize(m, id);
    int off = m->n_buf;
    int k = gm_advance(m, buf_mark, n, b);
    nx = m->oom ? -3 : ds_intern(m, off, k);
    m->n_node = node_mark, m->n_buf = buf_mark;
    if (nx != -3) m->ds[id].next[b] = nx;
    return nx;
}

/* Marks the tokens below trie node t whose bytes state sid takes. False out of memory. */
static bool walk(ts_grammar_matcher *m, int t, int sid, uint64_t *bits, int *count) {
    const ts_grammar_vocab *v = m->v;
    uint64_t first[4];
    memcpy(first, m->ds[sid].first, sizeof first); /* ds may move as states are added */
    for (int c = v->has_child[t] ? t + 1 : 0; c; c = v->next[c]) {
        uint8_t b = v->byte[c];
        if (!((first[b >> 6] >> (b & 63)) & 1)) continue;
        int nx = ds_step(m, sid, b);
        if (nx == -3) return false;
        if (nx == GM_DS_DEAD) continue;
        for (int32_t id = v->tok[c]; id >= 0; id = v->tok_next[id])
            allow(bits, id, count);
        if (v->has_child[c] && !walk(m, c, nx, bits, count)) return false;
    }
    return true;
}

/* The allowed tokens of the current state: remembered, or walked now into the least recently
 * used entry. NULL out of memory. */
static const gm_mask_entry *state_mask(ts_grammar_matcher *m) {
    uint64_t h;
    int n = signature(m, 0, m->n_cur, &h);
    if (n < 0) return NULL;
    gm_mask_entry *e = NULL, *victim = &m->cache[0];
    for (int i = 0; i < GM_MASK_CACHE; i++) {
        gm_mask_entry *c = &m->cache[i];
        if (c->allowed && c->hash == h && c->n_sig == n &&
            memcmp(c->sig, m->sig_tmp, (size_t)n * sizeof *c->sig) == 0) {
            e = c;
            break;
        }
        if (!c->allowed || (victim->allowed && c->used < victim->used)) victim = c;
    }
    if (!e) {
        e = victim;
        size_t words = ((size_t)m->v->n_vocab + 63) / 64;
        if (!e->allowed) e->allowed = malloc(words * sizeof *e->allowed);
        int32_t *sig = realloc(e->sig, (size_t)n * sizeof *sig);
        if (sig) e->sig = sig;
        if (!e->allowed || !sig) {
            free(e->allowed), e->allowed = NULL;
            return NULL;
        }
        memcpy(e->sig, m->sig_tmp, (size_t)n * sizeof *e->sig);
        e->n_sig = n, e->hash = h;
        memset(e->allowed, 0, words * sizeof *e->allowed);
        int cnt = 0;
        if (ts_grammar_matcher_can_end(m))
            for (int32_t id = 0; id < m->v->n_vocab; id++)
                if (m->v->kind[id] == GV_EOG) allow(e->allowed, id, &cnt);
        if (m->n_ds > GM_DS_MAX) ds_clear(m);
        int root = ds_intern(m, 0, m->n_cur);
        bool ok = root != -3 && (root == GM_DS_DEAD || walk(m, 0, root, e->allowed, &cnt));
        m->n_buf = m->n_cur;
        if (!ok || m->oom) { /* a partial walk is not a mask */
            free(e->allowed), e->allowed = NULL;
            return NULL;
        }
        e->n_allowed = cnt;
    }
    e->used = ++m->clock;
    return e;
}

ts_status ts_grammar_matcher_mask(ts_grammar_matcher *m, float *logits, int n) {
    if (!m->v) return ts_error(TS_ERR_INVALID, "a grammar matcher without a vocabulary");
    const gm_mask_entry *e = m->oom ? NULL : state_mask(m);
    if (!e)
        return m->oom ? gm_spent(m) : ts_error(TS_ERR_NOMEM, "out of memory for a grammar mask");
    if (e->n_allowed == 0) return ts_error(TS_ERR_INVALID, "the grammar allows no token here");
    int nv = m->v->n_vocab < n ? m->v->n_vocab : n;
    for (int id = 0; id < nv; id++)
        if (!((e->allowed[id >> 6] >> (id & 63)) & 1)) logits[id] = -INFINITY;
    for (int id = nv; id < n; id++)
        logits[id] = -INFINITY;
    return TS_OK;
}
