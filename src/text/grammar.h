/* Byte-level context-free grammars, and matching a token stream against one: the core of
 * constrained decoding (JSON mode, JSON Schema). The public side is in tessera.h (ts_grammar,
 * ts_grammar_vocab, ts_grammar_matcher); this header is the builder the schema compiler
 * (json_schema.c) writes rules with, and byte-level entry points for tests.
 *
 * A grammar is a list of rules; a rule is a list of alternatives; an alternative is a sequence
 * of elements, each a set of bytes (one byte of input from the set) or a reference to a rule.
 * An empty alternative matches nothing (the rule is optional). Matching runs the grammar as a
 * nondeterministic pushdown automaton over bytes: the state is a set of stacks of positions
 * (grammar.c). Left recursion is not allowed (a rule whose expansion reaches itself without
 * consuming a byte): ts_gbuild_finish refuses it (the matcher would also stop such an
 * expansion at a fixed depth rather than loop). */
#ifndef TS_TEXT_GRAMMAR_H
#define TS_TEXT_GRAMMAR_H

#include "tessera.h"

#include <stddef.h>
#include <stdint.h>

/* ---- building ---------------------------------------------------------------------------- */

typedef struct ts_gbuild ts_gbuild;

/* At most this many elements in a grammar: a schema that would need more is refused. */
#define TS_GRAMMAR_MAX_ELEMS (1 << 20)

ts_status ts_gbuild_create(ts_gbuild **out);
void ts_gbuild_free(ts_gbuild *b);
/* A new rule with no alternatives yet; returns its id. Rules may be referenced before they
 * get their alternatives (recursion). */
int ts_gbuild_rule(ts_gbuild *b);
/* A new, empty alternative of rule; returns its handle, to which the calls below append.
 * Alternatives of different rules may be built interleaved. */
int ts_gbuild_alt(ts_gbuild *b, int rule);
void ts_gbuild_ref(ts_gbuild *b, int alt, int rule);
/* One byte out of [lo, hi]. */
void ts_gbuild_range(ts_gbuild *b, int alt, uint8_t lo, uint8_t hi);
/* One byte out of a set: bit i of set[i / 64] says whether byte i is in it. */
void ts_gbuild_set(ts_gbuild *b, int alt, const uint64_t set[4]);
/* The exact bytes s[0, n). */
void ts_gbuild_literal(ts_gbuild *b, int alt, const char *s, size_t n);
/* A chain of k + 1 rules for up to k bytes of a set (optional) or exactly k: rule j is
 * [set]{0,j} or [set]{j}, built as r_j ::= "" | set r_{j-1} (the "" only when optional), so
 * a run stays a tail call. Returns rule k; ids, when not NULL, receives rules 0..k. */
int ts_gbuild_set_chain(ts_gbuild *b, const uint64_t set[4], int k, bool optional, int *ids);
/* A rule that can reach itself without reading a byte (left recursion), or -1: the matcher
 * cannot run such a grammar. -1 also when out of memory (finish then fails on it anyway). */
int ts_gbuild_left_recursive(const ts_gbuild *b);
/* The grammar with its start rule; fails (naming the limit) when the builder ran out of memory
 * or elements, a rule has no alternative, or a rule is left-recursive. b stays the caller's to
 * free. */
ts_status ts_gbuild_finish(ts_gbuild *b, int root, ts_grammar **out);

/* ---- byte-level matching (tests; the decoder goes through token ids) -------------------- */

/* Advances m by the bytes s[0, n); false (m unchanged) when some byte is not allowed. */
bool ts_grammar_matcher_accept_bytes(ts_grammar_matcher *m, const char *s, size_t n);
/* True when the whole text is a sentence of g. */
bool ts_grammar_matches(const ts_grammar *g, const char *s, size_t n);

#endif
