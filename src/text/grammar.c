/* Grammars: the builder, and matching bytes against a grammar as a nondeterministic pushdown
 * automaton (the approach of llama.cpp's GBNF matcher, written for byte sets and shared,
 * immutable stacks).
 *
 * The state is a set of stacks (grammar_int.h). A stack's top is a byte set; a byte that is in
 * it moves the top one element on, and the new position is "expanded" until the top is a byte
 * set again: the end of an alternative pops to the node below, a rule reference pushes where to
 * return and forks into one stack per alternative of the rule. A reference that ends its
 * alternative pushes nothing (a tail call), so right-recursive repetition (rep ::= "" | x rep)
 * keeps stacks flat however long it runs. Equal stacks are merged, so the set stays as small as
 * the grammar's ambiguity at that point. */
#include "base/status.h"
#include "text/grammar_int.h"

#include <stdlib.h>
#include <string.h>

/* ---- the builder ------------------------------------------------------------------------ */

typedef struct {
    int rule;
    uint32_t *e;
    int n, cap;
} gb_alt;

struct ts_gbuild {
    gb_alt *alt;
    int n_alt, cap_alt;
    int n_rules;
    uint64_t (*set)[4];
    int n_sets, cap_sets;
    long n_elems; /* elements so far, against TS_GRAMMAR_MAX_ELEMS */
    bool oom, too_big;
};

ts_status ts_gbuild_create(ts_gbuild **out) {
    *out = calloc(1, sizeof **out);
    return *out ? TS_OK : ts_error(TS_ERR_NOMEM, "out of memory for a grammar");
}

void ts_gbuild_free(ts_gbuild *b) {
    if (!b) return;
    for (int i = 0; i < b->n_alt; i++)
        free(b->alt[i].e);
    free(b->alt), free(b->set), free(b);
}

static bool grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return true;
    int c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return false;
    *p = q, *cap = c;
    return true;
}

int ts_gbuild_rule(ts_gbuild *b) { return b->n_rules++; }

int ts_gbuild_alt(ts_gbuild *b, int rule) {
    if (!grow((void **)&b->alt, &b->cap_alt, b->n_alt + 1, sizeof *b->alt)) {
        b->oom = true;
        return -1;
    }
    b->alt[b->n_alt] = (gb_alt){rule, NULL, 0, 0};
    return b->n_alt++;
}

static void push_elem(ts_gbuild *b, int alt, uint32_t e) {
    if (alt < 0 || alt >= b->n_alt) {
        b->oom = true; /* a failed ts_gbuild_alt */
        return;
    }
    if (++b->n_elems > TS_GRAMMAR_MAX_ELEMS) {
        b->too_big = true;
        return;
    }
    gb_alt *a = &b->alt[alt];
    if (!grow((void **)&a->e, &a->cap, a->n + 1, sizeof *a->e)) {
        b->oom = true;
        return;
    }
    a->e[a->n++] = e;
}

void ts_gbuild_ref(ts_gbuild *b, int alt, int rule) { push_elem(b, alt, GE_MAKE(GE_REF, rule)); }

/* Byte sets are kept once each: grammars repeat a few of them (digits, string bytes) often. */
void ts_gbuild_set(ts_gbuild *b, int alt, const uint64_t set[4]) {
    int i = 0;
    while (i < b->n_sets && memcmp(b->set[i], set, sizeof b->set[i]) != 0)
        i++;
    if (i == b->n_sets) {
        if (!grow((void **)&b->set, &b->cap_sets, b->n_sets + 1, sizeof *b->set)) {
            b->oom = true;
            return;
        }
        memcpy(b->set[b->n_sets++], set, sizeof b->set[0]);
    }
    push_elem(b, alt, GE_MAKE(GE_SET, i));
}

void ts_gbuild_range(ts_gbuild *b, int alt, uint8_t lo, uint8_t hi) {
    uint64_t s[4] = {0, 0, 0, 0};
    for (int c = lo; c <= hi; c++)
        s[c >> 6] |= 1ull << (c & 63);
    ts_gbuild_set(b, alt, s);
}

void ts_gbuild_literal(ts_gbuild *b, int alt, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        ts_gbuild_range(b, alt, (uint8_t)s[i], (uint8_t)s[i]);
}

/* Left recursion: a rule that can reach itself through the first elements of its alternatives
 * without reading a byte (only through rules that can match nothing). The matcher would expand
 * it without end (it cuts such an expansion at a depth, which changes the language), so a
 * grammar with one is refused. Found as a cycle of the "may start with" graph over rules. */
int ts_gbuild_left_recursive(const ts_gbuild *b) {
    int n = b->n_rules, found = -1;
    bool *nullable = calloc((size_t)n + 1, sizeof *nullable);
    int *head = malloc(((size_t)n + 1) * sizeof *head), *next = NULL, *to = NULL;
    uint8_t *color = calloc((size_t)n + 1, 1);
    int *stack = malloc(((size_t)n + 1) * sizeof *stack), *edge_at = NULL;
    long n_edges = 0;
    for (int a = 0; a < b->n_alt; a++)
        n_edges += b->alt[a].n;
    next = malloc(((size_t)n_edges + 1) * sizeof *next);
    to = malloc(((size_t)n_edges + 1) * sizeof *to);
    edge_at = malloc(((size_t)n + 1) * sizeof *edge_at);
    if (!nullable || !head || !color || !stack || !next || !to || !edge_at) goto done;
    for (bool changed = true; changed;) { /* which rules can match nothing */
        changed = false;
        for (int a = 0; a < b->n_alt; a++) {
            const gb_alt *al = &b->alt[a];
            if (nullable[al->rule]) continue;
            bool all = true;
            for (int i = 0; i < al->n && all; i++)
                all = GE_KIND(al->e[i]) == GE_REF && nullable[GE_VAL(al->e[i])];
            if (all) nullable[al->rule] = changed = true;
        }
    }
    for (int r = 0; r < n; r++)
        head[r] = -1;
    int ne = 0;
    for (int a = 0; a < b->n_alt; a++) { /* r -> s: s may come first in r */
        const gb_alt *al = &b->alt[a];
        for (int i = 0; i < al->n && GE_KIND(al->e[i]) == GE_REF; i++) {
            int s = (int)GE_VAL(al->e[i]);
            to[ne] = s, next[ne] = head[al->rule], head[al->rule] = ne++;
            if (!nullable[s]) break;
        }
    }
    for (int r0 = 0; r0 < n && found < 0; r0++) { /* depth first, iteratively: 1 open, 2 done */
        if (color[r0]) continue;
        int sp = 0;
        stack[sp++] = r0, color[r0] = 1, edge_at[r0] = head[r0];
        while (sp > 0 && found < 0) {
            int r = stack[sp - 1], e = edge_at[r];
            if (e < 0) {
                color[r] = 2, sp--;
                continue;
            }
            edge_at[r] = next[e];
            int s = to[e];
            if (color[s] == 1)
                found = s;
            else if (!color[s])
                stack[sp++] = s, color[s] = 1, edge_at[s] = head[s];
        }
    }
done:
    free(nullable), free(head), free(next), free(to), free(color), free(stack), free(edge_at);
    return found;
}

int ts_gbuild_set_chain(ts_gbuild *b, const uint64_t set[4], int k, bool optional, int *ids) {
    int prev = ts_gbuild_rule(b);
    ts_gbuild_alt(b, prev);
    if (ids) ids[0] = prev;
    for (int j = 1; j <= k; j++) {
        int r = ts_gbuild_rule(b);
        if (optional) ts_gbuild_alt(b, r);
        int a = ts_gbuild_alt(b, r);
        ts_gbuild_set(b, a, set);
        ts_gbuild_ref(b, a, prev);
        prev = r;
        if (ids) ids[j] = r;
    }
    return prev;
}

ts_status ts_gbuild_finish(ts_gbuild *b, int root, ts_grammar **out) {
    *out = NULL;
    if (b->too_big)
        return ts_error(TS_ERR_RANGE, "the grammar would need over %d elements",
                        TS_GRAMMAR_MAX_ELEMS);
    if (b->oom) return ts_error(TS_ERR_NOMEM, "out of memory building a grammar");
    if (root < 0 || root >= b->n_rules)
        return ts_error(TS_ERR_INVALID, "grammar start rule %d of %d", root, b->n_rules);
    int lr = ts_gbuild_left_recursive(b);
    if (lr >= 0)
        return ts_error(TS_ERR_INVALID,
                        "grammar rule %d is left-recursive (it can reach itself "
                        "without reading a byte)",
                        lr);
    ts_grammar *g = calloc(1, sizeof *g);
    if (!g) return ts_error(TS_ERR_NOMEM, "out of memory for a grammar");
    g->n_rules = b->n_rules, g->root = root, g->n_sets = b->n_sets;
    long n_elem = b->n_elems + b->n_alt; /* every alternative's elements and its terminator */
    g->elem = malloc((size_t)(n_elem + 1) * sizeof *g->elem);
    g->alt_first = calloc((size_t)b->n_rules + 1, sizeof *g->alt_first);
    g->alt_pos = malloc(((size_t)b->n_alt + 1) * sizeof *g->alt_pos);
    g->set = malloc(((size_t)b->n_sets + 1) * sizeof *g->set);
    if (!g->elem || !g->alt_first || !g->alt_pos || !g->set) {
        ts_grammar_free(g);
        return ts_error(TS_ERR_NOMEM, "out of memory for a grammar");
    }
    if (b->n_sets) memcpy(g->set, b->set, (size_t)b->n_sets * sizeof *g->set);
    /* alternatives grouped by rule, in the order they were made */
    for (int a = 0; a < b->n_alt; a++)
        g->alt_first[b->alt[a].rule + 1]++;
    for (int r = 0; r < b->n_rules; r++) {
        if (g->alt_first[r + 1] == 0) {
            ts_grammar_free(g);
            return ts_error(TS_ERR_INVALID, "grammar rule %d has no alternative", r);
        }
        g->alt_first[r + 1] += g->alt_first[r];
    }
    int *fill = malloc(((size_t)b->n_rules + 1) * sizeof *fill);
    int *order = malloc(((size_t)b->n_alt + 1) * sizeof *order);
    if (!fill || !order) {
        free(fill), free(order), ts_grammar_free(g);
        return ts_error(TS_ERR_NOMEM, "out of memory for a grammar");
    }
    memcpy(fill, g->alt_first, (size_t)b->n_rules * sizeof *fill);
    for (int a = 0; a < b->n_alt; a++)
        order[fill[b->alt[a].rule]++] = a;
    int n = 0;
    for (int r = 0; r < b->n_rules; r++)
        for (int k = g->alt_first[r]; k < g->alt_first[r + 1]; k++) {
            const gb_alt *a = &b->alt[order[k]];
            g->alt_pos[k] = (uint32_t)n;
            if (a->n) memcpy(g->elem + n, a->e, (size_t)a->n * sizeof *a->e);
            n += a->n;
            g->elem[n++] = GE_MAKE(k + 1 < g->alt_first[r + 1] ? GE_ALT : GE_END, 0);
        }
    g->n_elem = n;
    free(fill), free(order);
    *out = g;
    return TS_OK;
}

void ts_grammar_free(ts_grammar *g) {
    if (!g) return;
    free(g->elem), free(g->alt_first), free(g->alt_pos), free(g->set), free(g);
}

static void *dup_bytes(const void *p, size_t n) {
    void *q = malloc(n ? n : 1);
    if (q && n) memcpy(q, p, n);
    return q;
}

ts_status ts_grammar_copy(const ts_grammar *g, ts_grammar **out) {
    *out = NULL;
    ts_grammar *c = calloc(1, sizeof *c);
    if (!c) return ts_error(TS_ERR_NOMEM, "out of memory for a grammar");
    *c = *g;
    c->elem = dup_bytes(g->elem, (size_t)g->n_elem * sizeof *g->elem);
    c->alt_first = dup_bytes(g->alt_first, ((size_t)g->n_rules + 1) * sizeof *g->alt_first);
    c->alt_pos = dup_bytes(g->alt_pos, (size_t)g->alt_first[g->n_rules] * sizeof *g->alt_pos);
    c->set = dup_bytes(g->set, (size_t)g->n_sets * sizeof *g->set);
    if (!c->elem || !c->alt_first || !c->alt_pos || !c->set) {
        ts_grammar_free(c);
        return ts_error(TS_ERR_NOMEM, "out of memory for a grammar");
    }
    *out = c;
    return TS_OK;
}

/* ---- the automaton ---------------------------------------------------------------------- */

/* How deep one expansion may recurse through rules without taking a byte: deeper means a left
 * recursion (or a rule that loops on nothing), which is cut off there instead of looping. */
#define GM_MAX_EXPAND 256
/* Stacks in one state at most; more would mean a pathologically ambiguous grammar (an enum of
 * 60,000 strings still fits: its values part ways after their first bytes). */
#define GM_MAX_STACKS 65536
/* Sets up to this size are checked for repeats stack by stack, larger ones by a hash of their
 * top nodes, so that building a set stays linear in its size. */
#define GM_LINEAR_MAX 32

int32_t gm_new_node(ts_grammar_matcher *m, uint32_t pos, int32_t parent) {
    if (!grow((void **)&m->node, &m->cap_node, m->n_node + 1, sizeof *m->node)) {
        m->oom = true;
        return GM_EMPTY;
    }
    m->node[m->n_node] = (gm_node){pos, parent};
    return m->n_node++;
}

static bool stack_equal(const ts_grammar_matcher *m, int32_t a, int32_t b) {
    while (a != b) {
        if (a < 0 || b < 0 || m->node[a].pos != m->node[b].pos) return false;
        a = m->node[a].parent, b = m->node[b].parent;
    }
    return true;
}

/* A hash of stack s's positions, top to bottom: equal stacks built from different nodes (each
 * expansion makes its own) hash alike. */
static uint64_t stack_hash(const ts_grammar_matcher *m, int32_t s) {
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (; s >= 0; s = m->node[s].parent)
        h = (h ^ m->node[s].pos) * 0x100000001B3ull;
    return h ^ (h >> 29);
}

/* Whether a stack equal to s is in the set being built, recording s when none is; false out of
 * memory (m->oom). */
static bool seen_before(ts_grammar_matcher *m, int32_t s) {
    if (!m->seen) {
        m->cap_seen = 2 * GM_MAX_STACKS;
        m->seen = calloc((size_t)m->cap_seen, sizeof *m->seen);
        if (!m->seen) {
            m->oom = true;
            return false;
        }
    }
    uint64_t h = stack_hash(m, s);
    size_t mask = (size_t)m->cap_seen - 1;
    for (size_t at = (size_t)h & mask;; at = (at + 1) & mask) {
        gm_seen *e = &m->seen[at];
        if (e->gen != m->gen) { /* a stale entry is an empty slot */
            *e = (gm_seen){h, s, m->gen};
            return false;
        }
        if (e->hash == h && stack_equal(m, e->stack, s)) return true;
    }
}

/* Adds stack s to the set being built at buf[from, n_buf), unless an equal one is there: a small
 * set compares stack by stack, a large one through a hash of each stack. Equal stacks must
 * merge however they were built: a sequence of optional items reaches each position along many
 * paths, and unmerged repeats multiply at every byte (40 of "[a-z]?" then hung a request). */
static void emit(ts_grammar_matcher *m, int from, int32_t s) {
    int n = m->n_buf - from;
    if (n < GM_LINEAR_MAX) {
        for (int i = from; i < m->n_buf; i++)
            if (stack_equal(m, m->buf[i], s)) return;
    } else {
        if (m->seen_gen != m->gen) { /* the set just grew large: its stacks so far */
            m->seen_gen = m->gen;
            for (int i = from; i < m->n_buf; i++)
                seen_before(m, m->buf[i]);
        }
        if (seen_before(m, s) || m->oom) return;
    }
    if (n >= GM_MAX_STACKS) {
        m->oom = m->overflow = true; /* not cut silently: the language would change */
        return;
    }
    if (!grow((void **)&m->buf, &m->cap_buf, m->n_buf + 1, sizeof *m->buf)) {
        m->oom = true;
        return;
    }
    m->buf[m->n_buf++] = s;
}

/* Expands "next, match the element at pos, then go on with stack parent" into stacks whose top
 * is a byte set, adding them to the set being built from buf[from]. */
static void expand(ts_grammar_matcher *m, int from, uint32_t pos, int32_t parent, int depth) {
    const ts_grammar *g = m->g;
    if (depth > GM_MAX_EXPAND || m->oom) return; /* spent: nothing more to build */
    for (;;) {
        uint32_t e = g->elem[pos];
        switch (GE_KIND(e)) {
        case GE_END:
        case GE_ALT: /* the alternative is done: on with what lies below */
            if (parent == GM_EMPTY) {
                emit(m, from, GM_EMPTY);
                return;
            }
            pos = m->node[parent].pos;
            parent = m->node[parent].parent;
            continue;
        case GE_SET: emit(m, from, gm_new_node(m, pos, parent)); return;
        default: { /* GE_REF */
            int r = (int)GE_VAL(e);
            uint32_t k = GE_KIND(g->elem[pos + 1]);
            int32_t ret = k == GE_END || k == GE_ALT ? parent : gm_new_node(m, pos + 1, parent);
            for (int a = g->alt_first[r]; a < g->alt_first[r + 1] && !m->oom; a++)
                expand(m, from, g->alt_pos[a], ret, depth + 1);
            return;
        }
        }
    }
}

ts_status gm_spent(const ts_grammar_matcher *m) {
    if (m->overflow)
        return ts_error(TS_ERR_UNSUPPORTED,
                        "the grammar is too ambiguous: over %d ways to go on "
                        "at once",
                        GM_MAX_STACKS);
    return ts_error(TS_ERR_NOMEM, "out of memory in a grammar matcher");
}

int gm_advance(ts_grammar_matcher *m, int off, int n, uint8_t b) {
    int from = m->n_buf;
    if (++m->gen == 0) { /* a new set: the hash of a large one starts empty */
        if (m->seen) memset(m->seen, 0, (size_t)m->cap_seen * sizeof *m->seen);
        m->gen = 1, m->seen_gen = 0;
    }
    for (int i = 0; i < n; i++) {
        int32_t s = m->buf[off + i];
        if (s == GM_EMPTY) continue;
        gm_node nd = m->node[s];
        const uint64_t *set = m->g->set[GE_VAL(m->g->elem[nd.pos])];
        if ((set[b >> 6] >> (b & 63)) & 1) expand(m, from, nd.pos + 1, nd.parent, 0);
    }
    return m->n_buf - from;
}

void gm_first_bytes(const ts_grammar_matcher *m, int off, int n, uint64_t out[4]) {
    out[0] = out[1] = out[2] = out[3] = 0;
    for (int i = 0; i < n; i++) {
        int32_t s = m->buf[off + i];
        if (s == GM_EMPTY) continue;
        const uint64_t *set = m->g->set[GE_VAL(m->g->elem[m->node[s].pos])];
        out[0] |= set[0], out[1] |= set[1], out[2] |= set[2], out[3] |= set[3];
    }
}

/* Copies the stacks of the current state into a fresh node array, leaving the nodes that only
 * dead stacks or finished scratch work used behind. */
static void compact(ts_grammar_matcher *m) {
    int32_t *map = malloc((size_t)m->n_node * sizeof *map);
    int32_t *path = malloc((size_t)m->n_node * sizeof *path);
    gm_node *nn = malloc((size_t)m->n_node * sizeof *nn);
    if (!map || !path || !nn) { /* not now: the old nodes still serve */
        free(map), free(path), free(nn);
        return;
    }
    memset(map, 0xff, (size_t)m->n_node * sizeof *map);
    int n = 0;
    for (int i = 0; i < m->n_cur; i++) {
        int32_t s = m->buf[i], np = 0;
        while (s >= 0 && map[s] < 0)
            path[np++] = s, s = m->node[s].parent;
        int32_t below = s < 0 ? s : map[s];
        while (np > 0) {
            int32_t o = path[--np];
            nn[n] = (gm_node){m->node[o].pos, below};
            map[o] = below = n++;
        }
        if (m->buf[i] >= 0) m->buf[i] = map[m->buf[i]];
    }
    free(m->node);
    m->cap_node = m->n_node; /* nn's size */
    m->node = nn, m->n_node = n;
    free(map), free(path);
}

void gm_set_current(ts_grammar_matcher *m, int off, int n) {
    memmove(m->buf, m->buf + off, (size_t)n * sizeof *m->buf);
    m->n_cur = m->n_buf = n;
    if (m->n_node > m->compact_at) {
        compact(m);
        m->compact_at = 2 * m->n_node + 4096;
    }
}

ts_status ts_grammar_matcher_create(const ts_grammar *g, const ts_grammar_vocab *v,
                                    ts_grammar_matcher **out) {
    ts_grammar_matcher *m = calloc(1, sizeof *m);
    if (!m) return ts_error(TS_ERR_NOMEM, "out of memory for a grammar matcher");
    m->g = g, m->v = v;
    m->compact_at = 4096;
    m->gen = 1;
    /* the root rule's alternatives over the empty stack: once one is done, the text is */
    for (int a = g->alt_first[g->root]; a < g->alt_first[g->root + 1]; a++)
        expand(m, 0, g->alt_pos[a], GM_EMPTY, 0);
    m->n_cur = m->n_buf;
    if (m->oom) {
        ts_status st = gm_spent(m);
        ts_grammar_matcher_free(m);
        return st;
    }
    *out = m;
    return TS_OK;
}

void ts_grammar_matcher_free(ts_grammar_matcher *m) {
    if (!m) return;
    for (int i = 0; i < GM_MASK_CACHE; i++)
        free(m->cache[i].sig), free(m->cache[i].allowed);
    gm_dfa_free(m);
    free(m->seen);
    free(m->node), free(m->buf), free(m->sig_tmp), free(m);
}

bool ts_grammar_matcher_accept_bytes(ts_grammar_matcher *m, const char *s, size_t n) {
    int mark = m->n_node, off = 0, cnt = m->n_cur;
    for (size_t i = 0; i < n && cnt > 0; i++) {
        int next = m->n_buf;
        cnt = gm_advance(m, off, cnt, (uint8_t)s[i]);
        off = next;
    }
    if (cnt == 0 || m->oom) {
        m->n_node = mark, m->n_buf = m->n_cur;
        return false;
    }
    if (off != 0) gm_set_current(m, off, cnt);
    return true;
}

bool ts_grammar_matcher_can_end(const ts_grammar_matcher *m) {
    for (int i = 0; i < m->n_cur; i++)
        if (m->buf[i] == GM_EMPTY) return true;
    return false;
}

bool ts_grammar_matcher_done(const ts_grammar_matcher *m) {
    return m->n_cur == 1 && m->buf[0] == GM_EMPTY;
}

bool ts_grammar_matches(const ts_grammar *g, const char *s, size_t n) {
    ts_grammar_matcher *m;
    if (ts_grammar_matcher_create(g, NULL, &m) != TS_OK) return false;
    bool ok = ts_grammar_matcher_accept_bytes(m, s, n) && ts_grammar_matcher_can_end(m);
    ts_grammar_matcher_free(m);
    return ok;
}
