/* The grammar automaton (text/grammar.c) and grammars over tokens (text/grammar_vocab.c):
 * alternatives, optional and repeated rules, tail calls that keep stacks flat, left recursion
 * refused, and - with a real BPE vocabulary - that the trie walk's mask agrees token for token
 * with running each token's bytes alone, in every state of a random walk through a grammar. */
#include "testutil.h"
#include "text/grammar_int.h"

#include <math.h>
#include <string.h>

static int lit_alt(ts_gbuild *b, int rule, const char *s) {
    int a = ts_gbuild_alt(b, rule);
    ts_gbuild_literal(b, a, s, strlen(s));
    return a;
}

static bool match(const ts_grammar *g, const char *s) {
    return ts_grammar_matches(g, s, strlen(s));
}

static void test_alternatives(void) {
    /* root ::= "ab" | "a" c ;  c ::= "c" | "" */
    ts_gbuild *b;
    CHECK(ts_gbuild_create(&b) == TS_OK);
    int root = ts_gbuild_rule(b), c = ts_gbuild_rule(b);
    lit_alt(b, root, "ab");
    ts_gbuild_ref(b, lit_alt(b, root, "a"), c);
    lit_alt(b, c, "c");
    ts_gbuild_alt(b, c);
    ts_grammar *g;
    CHECK(ts_gbuild_finish(b, root, &g) == TS_OK);
    ts_gbuild_free(b);
    CHECK(match(g, "ab") && match(g, "ac") && match(g, "a"));
    CHECK(!match(g, "") && !match(g, "abc") && !match(g, "b") && !match(g, "acc"));
    ts_grammar_matcher *m;
    CHECK(ts_grammar_matcher_create(g, NULL, &m) == TS_OK);
    CHECK(!ts_grammar_matcher_can_end(m));
    CHECK(ts_grammar_matcher_accept_bytes(m, "a", 1));
    CHECK(ts_grammar_matcher_can_end(m) && !ts_grammar_matcher_done(m));
    CHECK(!ts_grammar_matcher_accept_bytes(m, "x", 1)); /* refused: nothing changes */
    CHECK(ts_grammar_matcher_accept_bytes(m, "b", 1));
    CHECK(ts_grammar_matcher_done(m));
    ts_grammar_matcher_free(m);
    ts_grammar_free(g);
}

static void test_repetition_stays_flat(void) {
    /* root ::= "[" rep "]" ;  rep ::= "" | "x" rep : a long run must not grow the stacks */
    ts_gbuild *b;
    CHECK(ts_gbuild_create(&b) == TS_OK);
    int root = ts_gbuild_rule(b), rep = ts_gbuild_rule(b);
    int a = lit_alt(b, root, "[");
    ts_gbuild_ref(b, a, rep);
    ts_gbuild_literal(b, a, "]", 1);
    ts_gbuild_alt(b, rep);
    ts_gbuild_ref(b, lit_alt(b, rep, "x"), rep);
    ts_grammar *g;
    CHECK(ts_gbuild_finish(b, root, &g) == TS_OK);
    ts_gbuild_free(b);
    ts_grammar_matcher *m;
    CHECK(ts_grammar_matcher_create(g, NULL, &m) == TS_OK);
    CHECK(ts_grammar_matcher_accept_bytes(m, "[", 1));
    int most = 0;
    for (int i = 0; i < 100000; i++) {
        CHECK(ts_grammar_matcher_accept_bytes(m, "x", 1));
        if (m->n_node > most) most = m->n_node;
    }
    /* nodes are dropped once unused: the live ones are a handful however long the run */
    CHECKF(most < 20000, "%d nodes after a run of 100000", most);
    for (int i = 0; i < m->n_cur; i++) {
        int depth = 0;
        for (int32_t s = m->buf[i]; s >= 0; s = m->node[s].parent)
            depth++;
        CHECKF(depth <= 2, "a stack %d deep", depth);
    }
    CHECK(ts_grammar_matcher_accept_bytes(m, "]", 1) && ts_grammar_matcher_done(m));
    ts_grammar_matcher_free(m);
    ts_grammar_free(g);
}

static void test_left_recursion_is_refused(void) {
    /* r ::= r "a" | "b": the matcher could not expand it without end */
    ts_gbuild *b;
    CHECK(ts_gbuild_create(&b) == TS_OK);
    int r = ts_gbuild_rule(b);
    int a = ts_gbuild_alt(b, r);
    ts_gbuild_ref(b, a, r);
    ts_gbuild_literal(b, a, "a", 1);
    lit_alt(b, r, "b");
    ts_grammar *g = NULL;
    CHECK(ts_gbuild_finish(b, r, &g) == TS_ERR_INVALID && g == NULL);
    CHECK(strstr(ts_last_error(), "left-recursive") != NULL);
    ts_gbuild_free(b);
    /* through a rule that can match nothing: x ::= y "x" ; y ::= "" | "(" | x */
    CHECK(ts_gbuild_create(&b) == TS_OK);
    int x = ts_gbuild_rule(b), y = ts_gbuild_rule(b);
    a = ts_gbuild_alt(b, x);
    ts_gbuild_ref(b, a, y);
    ts_gbuild_literal(b, a, "x", 1);
    ts_gbuild_alt(b, y);
    lit_alt(b, y, "(");
    ts_gbuild_ref(b, ts_gbuild_alt(b, y), x);
    CHECK(ts_gbuild_left_recursive(b) >= 0);
    ts_gbuild_free(b);
    /* but not when a byte comes first: x ::= "(" x | "" is right recursion */
    CHECK(ts_gbuild_create(&b) == TS_OK);
    x = ts_gbuild_rule(b);
    ts_gbuild_ref(b, lit_alt(b, x, "("), x);
    ts_gbuild_alt(b, x);
    CHECK(ts_gbuild_left_recursive(b) < 0);
    CHECK(ts_gbuild_finish(b, x, &g) == TS_OK);
    CHECK(match(g, "(((") && match(g, ""));
    ts_grammar_free(g);
    ts_gbuild_free(b);
}

static void test_ambiguity_is_merged(void) {
    /* root ::= o o ;  o ::= "" | "x": after "x" two paths lead to the same stacks */
    ts_gbuild *b;
    CHECK(ts_gbuild_create(&b) == TS_OK);
    int root = ts_gbuild_rule(b), o = ts_gbuild_rule(b);
    int a = ts_gbuild_alt(b, root);
    ts_gbuild_ref(b, a, o);
    ts_gbuild_ref(b, a, o);
    ts_gbuild_alt(b, o);
    lit_alt(b, o, "x");
    ts_grammar *g;
    CHECK(ts_gbuild_finish(b, root, &g) == TS_OK);
    ts_gbuild_free(b);
    CHECK(match(g, "") && match(g, "x") && match(g, "xx") && !match(g, "xxx"));
    ts_grammar_matcher *m;
    CHECK(ts_grammar_matcher_create(g, NULL, &m) == TS_OK);
    CHECK(ts_grammar_matcher_accept_bytes(m, "x", 1));
    CHECKF(m->n_cur == 2, "%d stacks after x (the empty one and one for the second x)", m->n_cur);
    ts_grammar_matcher_free(m);
    ts_grammar_free(g);
}

/* root ::= o o ... o (60 of them);  o ::= "" | [a-z]. After k letters the state is one stack
 * for each o a letter may still match (60 - k) and the empty one. Each position is reached
 * along many paths, with stacks made of different nodes: past 32 stacks (where repeats are
 * found by hash) they were not merged and multiplied at every byte - 40 such items hung a
 * request. */
static void test_optional_runs_stay_linear(void) {
    enum { N = 60 };
    ts_gbuild *b;
    CHECK(ts_gbuild_create(&b) == TS_OK);
    int root = ts_gbuild_rule(b), o = ts_gbuild_rule(b);
    int a = ts_gbuild_alt(b, root);
    for (int i = 0; i < N; i++)
        ts_gbuild_ref(b, a, o);
    ts_gbuild_alt(b, o);
    ts_gbuild_range(b, ts_gbuild_alt(b, o), 'a', 'z');
    ts_grammar *g;
    CHECK(ts_gbuild_finish(b, root, &g) == TS_OK);
    ts_gbuild_free(b);
    ts_grammar_matcher *m;
    CHECK(ts_grammar_matcher_create(g, NULL, &m) == TS_OK);
    CHECKF(m->n_cur == N + 1, "%d stacks at the start", m->n_cur);
    for (int k = 1; k <= N; k++) {
        CHECK(ts_grammar_matcher_accept_bytes(m, "q", 1));
        if (m->n_cur != N - k + 1) {
            CHECKF(m->n_cur == N - k + 1, "%d stacks after %d letters", m->n_cur, k);
            break;
        }
    }
    CHECK(ts_grammar_matcher_done(m));
    ts_grammar_matcher_free(m);
    ts_grammar_free(g);
}

/* s1 ::= s2 "a" | s2 "b";  s2 ::= s3 "a" | s3 "b"; ... s40 ::= "x": 2^40 different stacks at
 * the start. Refused once over the limit - and at once: the expansion stops there instead of
 * walking every path that remains. */
static void test_overflow_stops_at_once(void) {
    enum { N = 40 };
    ts_gbuild *b;
    CHECK(ts_gbuild_create(&b) == TS_OK);
    int r[N];
    for (int i = 0; i < N; i++)
        r[i] = ts_gbuild_rule(b);
    for (int i = 0; i + 1 < N; i++)
        for (int k = 0; k < 2; k++) {
            int a = ts_gbuild_alt(b, r[i]);
            ts_gbuild_ref(b, a, r[i + 1]);
            ts_gbuild_literal(b, a, k ? "b" : "a", 1);
        }
    ts_gbuild_literal(b, ts_gbuild_alt(b, r[N - 1]), "x", 1);
    ts_grammar *g;
    CHECK(ts_gbuild_finish(b, r[0], &g) == TS_OK);
    ts_gbuild_free(b);
    ts_grammar_matcher *m = NULL;
    double t0 = ts_now_s();
    ts_status st = ts_grammar_matcher_create(g, NULL, &m);
    double took = ts_now_s() - t0;
    CHECKF(st == TS_ERR_UNSUPPORTED && strstr(ts_last_error(), "ambiguous"), "%d: %s", (int)st,
           ts_last_error());
    CHECKF(took < 5.0, "%.1f s to refuse it", took);
    ts_grammar_matcher_free(m);
    ts_grammar_free(g);
}

static void test_limits(void) {
    ts_gbuild *b;
    CHECK(ts_gbuild_create(&b) == TS_OK);
    int r = ts_gbuild_rule(b), a = ts_gbuild_alt(b, r);
    for (int i = 0; i <= TS_GRAMMAR_MAX_ELEMS; i++)
        ts_gbuild_literal(b, a, "y", 1);
    ts_grammar *g = NULL;
    CHECK(ts_gbuild_finish(b, r, &g) == TS_ERR_RANGE && g == NULL);
    ts_gbuild_free(b);
    CHECK(ts_gbuild_create(&b) == TS_OK);
    r = ts_gbuild_rule(b);
    ts_gbuild_ref(b, ts_gbuild_alt(b, r), ts_gbuild_rule(b)); /* a rule without alternatives */
    CHECK(ts_gbuild_finish(b, r, &g) == TS_ERR_INVALID);
    ts_gbuild_free(b);
    /* many ways at once (an enum of 50,000 values): held, and the set is built in linear time
     * (the hash of large sets); more than a state holds: an error, never a silent cut */
    for (int n = 50000; n <= 70000; n += 20000) {
        CHECK(ts_gbuild_create(&b) == TS_OK);
        r = ts_gbuild_rule(b);
        for (int i = 0; i < n; i++) {
            char s[16];
            snprintf(s, sizeof s, "a%d", i);
            lit_alt(b, r, s);
        }
        CHECK(ts_gbuild_finish(b, r, &g) == TS_OK);
        ts_gbuild_free(b);
        ts_grammar_matcher *m = NULL;
        double t0 = ts_now_s();
        ts_status st = ts_grammar_matcher_create(g, NULL, &m);
        if (n == 50000) {
            CHECK(st == TS_OK);
            CHECK(ts_grammar_matcher_accept_bytes(m, "a4999", 5) && ts_grammar_matcher_can_end(m));
            CHECK(ts_grammar_matcher_accept_bytes(m, "9", 1) && /* a49999 is a value too */
                  ts_grammar_matcher_done(m));
            CHECKF(ts_now_s() - t0 < 0.5, "%.2f s for a set of %d stacks", ts_now_s() - t0, n);
            ts_grammar_matcher_free(m);
        } else {
            CHECK(st == TS_ERR_UNSUPPORTED && m == NULL);
            CHECK(strstr(ts_last_error(), "ambiguous") != NULL);
        }
        ts_grammar_free(g);
    }
}

/* A JSON-like grammar over the small vocabulary: {"k": [digits, ...], "s": "text"} with
 * optional spaces, to walk through with tokens. */
static ts_grammar *json_lite(void) {
    ts_gbuild *b;
    CHECK(ts_gbuild_create(&b) == TS_OK);
    int root = ts_gbuild_rule(b), ws = ts_gbuild_rule(b), num = ts_gbuild_rule(b),
        digits = ts_gbuild_rule(b), list = ts_gbuild_rule(b), more = ts_gbuild_rule(b),
        str = ts_gbuild_rule(b);
    ts_gbuild_alt(b, ws);
    lit_alt(b, ws, " ");
    int a = lit_alt(b, root, "{");
    ts_gbuild_ref(b, a, ws);
    ts_gbuild_literal(b, a, "\"k\":", 4);
    ts_gbuild_ref(b, a, ws);
    ts_gbuild_literal(b, a, "[", 1);
    ts_gbuild_ref(b, a, list);
    ts_gbuild_literal(b, a, "],", 2);
    ts_gbuild_ref(b, a, ws);
    ts_gbuild_literal(b, a, "\"s\":", 4);
    ts_gbuild_ref(b, a, ws);
    ts_gbuild_literal(b, a, "\"", 1);
    ts_gbuild_ref(b, a, str);
    ts_gbuild_literal(b, a, "\"}", 2);
    a = ts_gbuild_alt(b, num);
    ts_gbuild_range(b, a, '1', '9');
    ts_gbuild_ref(b, a, digits);
    ts_gbuild_alt(b, digits);
    a = ts_gbuild_alt(b, digits);
    ts_gbuild_range(b, a, '0', '9');
    ts_gbuild_ref(b, a, digits);
    ts_gbuild_ref(b, ts_gbuild_alt(b, list), num);
    a = ts_gbuild_alt(b, list);
    ts_gbuild_ref(b, a, num);
    ts_gbuild_ref(b, a, more);
    a = ts_gbuild_alt(b, more);
    ts_gbuild_literal(b, a, ",", 1);
    ts_gbuild_ref(b, a, ws);
    ts_gbuild_ref(b, a, num);
    ts_gbuild_ref(b, a, more);
    ts_gbuild_alt(b, more);
    ts_gbuild_alt(b, str);
    a = ts_gbuild_alt(b, str);
    ts_gbuild_range(b, a, 'a', 'z');
    ts_gbuild_ref(b, a, str);
    a = ts_gbuild_alt(b, str);
    ts_gbuild_literal(b, a, " ", 1);
    ts_gbuild_ref(b, a, str);
    ts_grammar *g = NULL;
    CHECK(ts_gbuild_finish(b, root, &g) == TS_OK);
    ts_gbuild_free(b);
    return g;
}

static void test_tokens(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer/small/tokenizer.json",
             tu_env("TS_FIXTURES", "tests/fixtures"));
    ts_tokenizer *tok;
    if (ts_tokenizer_open(path, &tok) != TS_OK) {
        CHECKF(0, "%s", ts_last_error());
        return;
    }
    int nv = ts_tokenizer_vocab_size(tok), n_logits = nv + 7; /* a padded model row */
    int32_t eog = -1;
    for (int32_t id = 0; id < nv && eog < 0; id++)
        if (ts_tokenizer_is_eog(tok, id)) eog = id;
    CHECK(eog >= 0);
    /* a token the caller reads as a marker: excluded from the text */
    int32_t *ids;
    size_t n_ids;
    CHECK(ts_tokenize(tok, "{", 1, false, &ids, &n_ids) == TS_OK && n_ids == 1);
    int32_t brace = ids[0];
    free(ids);
    ts_grammar_vocab *v, *v_ex;
    CHECK(ts_grammar_vocab_create(tok, NULL, 0, &v) == TS_OK);
    CHECK(ts_grammar_vocab_create(tok, &brace, 1, &v_ex) == TS_OK);
    ts_grammar *g = json_lite();
    ts_grammar_matcher *m, *m_ex;
    CHECK(ts_grammar_matcher_create(g, v, &m) == TS_OK);
    CHECK(ts_grammar_matcher_create(g, v_ex, &m_ex) == TS_OK);
    CHECK(ts_grammar_matcher_allows(m, brace) && !ts_grammar_matcher_allows(m_ex, brace));
    CHECK(!ts_grammar_matcher_allows(m, eog));
    ts_grammar_matcher_free(m_ex);

    float *row = malloc((size_t)n_logits * sizeof *row);
    uint64_t rng = 12345;
    int steps = 0, states_checked = 0;
    while (!ts_grammar_matcher_done(m) && steps < 400) {
        for (int i = 0; i < n_logits; i++)
            row[i] = 0.0f;
        CHECK(ts_grammar_matcher_mask(m, row, n_logits) == TS_OK);
        int n_ok = 0;
        int32_t *ok = malloc((size_t)nv * sizeof *ok);
        for (int32_t id = 0; id < nv; id++) {
            bool a = ts_grammar_matcher_allows(m, id), mk = row[id] == 0.0f;
            if (a != mk) {
                CHECKF(0, "step %d: token %d: alone %d, mask %d", steps, id, a, mk);
                break;
            }
            if (a) ok[n_ok++] = id;
        }
        for (int i = nv; i < n_logits; i++)
            CHECK(isinf(row[i]) && row[i] < 0);
        CHECK(n_ok > 0);
        if (n_ok == 0) {
            free(ok);
            break;
        }
        states_checked++;
        /* the next token: a random allowed one, longer numbers and strings cut short by
         * preferring, every few steps, a token that closes something */
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int32_t pick = ok[(rng >> 33) % (uint64_t)n_ok];
        if (steps > 60 && ts_grammar_matcher_allows(m, eog)) pick = eog;
        free(ok);
        CHECK(ts_grammar_matcher_accept(m, pick) == TS_OK);
        steps++;
    }
    CHECKF(states_checked > 10, "%d states", states_checked);
    CHECK(ts_grammar_matcher_accept(m, brace) == TS_ERR_INVALID || !ts_grammar_matcher_done(m));
    free(row);
    ts_grammar_matcher_free(m);
    ts_grammar_free(g);
    ts_grammar_vocab_free(v);
    ts_grammar_vocab_free(v_ex);
    ts_tokenizer_free(tok);
}

int main(void) {
    test_alternatives();
    test_repetition_stays_flat();
    test_left_recursion_is_refused();
    test_ambiguity_is_merged();
    test_optional_runs_stay_linear();
    test_overflow_stops_at_once();
    test_limits();
    test_tokens();
    return tu_report("test_grammar");
}
