/* libFuzzer target for constrained decoding: a JSON Schema (hostile or not) compiled into a
 * grammar, then text and tokens run through it. Promises checked:
 *   - a schema is compiled or refused with a message, never a crash or a hang;
 *   - every text the grammar takes whole is valid JSON (jansson parses it) after at most 8
 *     whitespace bytes, and in JSON mode it is an object;
 *   - with the small Qwen3.5 stand-in vocabulary, the mask of a state allows exactly the tokens
 *     that ts_grammar_matcher_allows allows, and taking an allowed token keeps the matcher
 *     alive.
 *
 * Input: byte 0 = flags (bit 0: JSON mode, no schema; bit 1: check the tokens; bits 2-3: 1 =
 * the "schema" is a GBNF grammar, 2 = a regular expression for plain text, 3 = a choice among
 * the NUL-free lines of it - then only the matcher's own promises are checked, not JSON), then
 * the schema, a NUL byte, then the text to feed (bytes). */
#include "base/status.h"
#include "fuzz_util.h"
#include "text/grammar.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ts_tokenizer *tok;
static ts_grammar_vocab *vocab;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    if (ts_tokenizer_open(fz_tokenizer_path(), &tok) != TS_OK ||
        ts_grammar_vocab_create(tok, NULL, 0, &vocab) != TS_OK) {
        fprintf(stderr, "fuzz_grammar: %s\n", ts_last_error());
        abort();
    }
    return 0;
}

/* Mask and allows() agree on every id; returns an allowed text token (or -1). */
static int32_t check_mask(ts_grammar_matcher *m, float *row, int n) {
    for (int i = 0; i < n; i++)
        row[i] = 0.0f;
    if (ts_grammar_matcher_mask(m, row, n) != TS_OK) return -1;
    int32_t pick = -1;
    for (int32_t id = 0; id < n; id++) {
        bool a = ts_grammar_matcher_allows(m, id);
        FZ_ASSERT(a == (row[id] == 0.0f));
        if (a && !ts_tokenizer_is_eog(tok, id) && (pick < 0 || id % 7 == 3)) pick = id;
    }
    return pick;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t flags = data[0];
    const char *body = (const char *)data + 1;
    size_t n = size - 1;
    const char *nul = memchr(body, 0, n);
    size_t schema_len = nul ? (size_t)(nul - body) : n;
    const char *text = nul ? nul + 1 : body + n;
    size_t text_len = nul ? n - schema_len - 1 : 0;

    ts_grammar *g = NULL;
    int kind = (flags >> 2) & 3;
    ts_status st;
    if (kind == 1) {
        st = ts_grammar_from_gbnf(body, schema_len, &g);
    } else if (kind == 2) {
        st = ts_grammar_from_regex(body, schema_len, &g);
    } else if (kind == 3) { /* lines as choices */
        char *copy = malloc(schema_len + 1);
        const char *lines[64];
        int n_lines = 0;
        if (!copy) return 0;
        memcpy(copy, body, schema_len);
        copy[schema_len] = 0;
        for (char *line = strtok(copy, "\n"); line && n_lines < 64; line = strtok(NULL, "\n"))
            lines[n_lines++] = line;
        st = n_lines ? ts_grammar_from_choices(lines, n_lines, &g) : TS_ERR_INVALID;
        if (st == TS_ERR_INVALID && !n_lines) ts_error(st, "no lines");
        free(copy);
    } else {
        st = ts_grammar_from_json_schema(flags & 1 ? NULL : body, schema_len, &g);
    }
    if (st != TS_OK) {
        FZ_ASSERT(g == NULL && ts_last_error()[0]);
        return 0;
    }
    ts_grammar_matcher *m = NULL;
    if (ts_grammar_matcher_create(g, (flags & 2) ? vocab : NULL, &m) != TS_OK) {
        ts_grammar_free(g);
        return 0;
    }
    /* the longest prefix of the text the grammar takes */
    size_t taken = 0;
    while (taken < text_len && ts_grammar_matcher_accept_bytes(m, text + taken, 1))
        taken++;
    if (kind == 0 && taken == text_len && ts_grammar_matcher_can_end(m)) {
        size_t lead = 0;
        while (lead < taken && strchr(" \t\n", text[lead]) && text[lead])
            lead++;
        FZ_ASSERT(lead <= 8);
        json_error_t err;
        json_t *v = json_loadb(text + lead, taken - lead, JSON_DECODE_ANY, &err);
        FZ_ASSERT(v != NULL);
        FZ_ASSERT(!(flags & 1) || json_is_object(v));
        json_decref(v);
    }
    if (flags & 2) { /* a few steps of tokens */
        int nv = ts_tokenizer_vocab_size(tok);
        float *row = malloc((size_t)nv * sizeof *row);
        for (int step = 0; row && step < 4 && !ts_grammar_matcher_done(m); step++) {
            int32_t id = check_mask(m, row, nv);
            if (id < 0) break;
            FZ_ASSERT(ts_grammar_matcher_accept(m, id) == TS_OK);
        }
        free(row);
    }
    ts_grammar_matcher_free(m);
    ts_grammar_free(g);
    return 0;
}
