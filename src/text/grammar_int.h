/* The grammar's and the matcher's insides, shared by grammar.c (rules, byte-level matching)
 * and grammar_vocab.c (tokens: the vocabulary trie, masks). */
#ifndef TS_TEXT_GRAMMAR_INT_H
#define TS_TEXT_GRAMMAR_INT_H

#include "text/grammar.h"

#include <stdbool.h>

/* An element: kind in the top two bits, a rule id or a byte-set index below. Each rule's
 * alternatives lie one after another in elem[], each ended by GE_ALT, the last by GE_END. */
enum { GE_END = 0, GE_ALT = 1, GE_REF = 2, GE_SET = 3 };
#define GE_KIND(e)    ((e) >> 30)
#define GE_VAL(e)     ((e)&0x3fffffffu)
#define GE_MAKE(k, v) (((uint32_t)(k) << 30) | (uint32_t)(v))

struct ts_grammar {
    uint32_t *elem;
    int n_elem;
    int n_rules, root;
    int32_t *alt_first; /* [n_rules + 1]: rule r's alternatives are alt_pos[alt_first[r] ..) */
    uint32_t *alt_pos;  /* where each alternative starts in elem[] */
    uint64_t (*set)[4]; /* byte sets */
    int n_sets;
};

/* A stack of the automaton is a chain of nodes: the top says which element (a byte set) the next
 * byte must match, each node below where to go on once the rule above it is done. Nodes are
 * never changed, so stacks share their bottoms; GM_EMPTY is the empty stack (the text is
 * complete). */
typedef struct {
    uint32_t pos;
    int32_t parent;
} gm_node;
#define GM_EMPTY (-1)

/* A stack already in the set being built, by a hash of its positions top to bottom: a large
 * set is checked for repeats through these (grammar.c, emit); gen tells this build's from stale
 * ones. */
typedef struct {
    uint64_t hash;
    int32_t stack;
    uint32_t gen;
} gm_seen;

/* A mask remembered for a state (grammar_vocab.c). */
typedef struct {
    uint64_t hash;
    int32_t *sig; /* the state: each stack's positions top to bottom, each ended by -1 */
    int n_sig;
    uint64_t *allowed; /* a bit per token id */
    int n_allowed;
    uint64_t used;
} gm_mask_entry;
#define GM_MASK_CACHE 16

/* A state of the automaton met while walking the vocabulary, kept with the states each byte
 * leads to as they are found (a DFA built lazily, grammar_vocab.c): walking the trie then
 * mostly follows a table instead of running the stacks. */
typedef struct {
    uint64_t hash;
    int32_t *sig; /* as gm_mask_entry.sig */
    int n_sig;
    uint64_t first[4]; /* the bytes any of its stacks may take */
    int32_t next[256]; /* the state after a byte: GM_DS_UNKNOWN, GM_DS_DEAD or an id */
} gm_dstate;
#define GM_DS_UNKNOWN (-2)
#define GM_DS_DEAD    (-1)

struct ts_grammar_matcher {
    const ts_grammar *g;
    const ts_grammar_vocab *v; /* NULL: bytes only */
    gm_node *node;
    int n_node, cap_node, compact_at;
    /* stack sets, each a run of node ids (or GM_EMPTY) in buf: the current state is buf[0,
     * n_cur); the runs after it are scratch, used like a stack while advancing */
    int32_t *buf;
    int n_buf, cap_buf, n_cur;
    bool oom;      /* a step ran out of memory, or (overflow) of stacks: the matcher is spent */
    bool overflow; /* a state needed over GM_MAX_STACKS stacks (grammar.c) */
    gm_seen *seen; /* made for the first large set */
    int cap_seen;
    uint32_t gen, seen_gen; /* the set build under way; the one seen[] holds */
    gm_mask_entry cache[GM_MASK_CACHE];
    uint64_t clock;
    int32_t *sig_tmp;
    int cap_sig_tmp;
    gm_dstate *ds; /* the lazily built DFA: states by id, and a hash index of them */
    int n_ds, cap_ds;
    int32_t *ds_index;
    int cap_index;
};

/* Advances the stack set buf[off, off + n) by byte b: the new set is appended to buf (its
 * offset is the old n_buf); returns its size (0: b is not allowed). Nodes it makes stay until
 * the caller truncates n_node. */
int gm_advance(ts_grammar_matcher *m, int off, int n, uint8_t b);
/* The union of the byte sets the stacks of a set may take next. */
void gm_first_bytes(const ts_grammar_matcher *m, int off, int n, uint64_t out[4]);
/* A node (pos, parent), GM_EMPTY out of memory (m->oom set). */
int32_t gm_new_node(ts_grammar_matcher *m, uint32_t pos, int32_t parent);
/* The error of a spent matcher (m->oom). */
ts_status gm_spent(const ts_grammar_matcher *m);
/* Frees the lazy DFA of the mask walks (grammar_vocab.c). */
void gm_dfa_free(ts_grammar_matcher *m);
/* Makes buf[off, off + n) the current state (off >= n_cur) and drops nodes no stack uses when
 * there are many. */
void gm_set_current(ts_grammar_matcher *m, int off, int n);

#endif
