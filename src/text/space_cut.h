/* Cutting a SentencePiece-style word before its spaces, for the two BPE tokenizers that merge
 * characters (bpe.c over a converted tokenizer.json, spm.c over a GGUF "llama" vocabulary).
 *
 * Without a pre-tokenizer, a whole text between added tokens is one word, merged as one list of
 * symbols. But a merge only ever makes a piece of the vocabulary, so a U+2581 (the visible
 * space) starts a part that merges on its own unless some piece holds the character before it
 * followed by U+2581 - a "glue" character. Gemma 3's 262,144 pieces have one ('>', in ">▁</");
 * runs of U+2581 stay together. Cutting there gives exactly the ids of the whole word, and
 * lets long text merge word by word (and through bpe.c's word cache). */
#ifndef TS_TEXT_SPACE_CUT_H
#define TS_TEXT_SPACE_CUT_H

#include "base/utf8.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TS_SPACE_CP       0x2581u
#define TS_SPACE_GLUE_MAX 16

typedef struct {
    bool on; /* false: never cut (too many glue characters) */
    int n;
    uint32_t cp[TS_SPACE_GLUE_MAX];
} ts_space_glue;

/* Adds the glue characters of one piece (valid UTF-8 or not: it stops at the first bad byte);
 * turns cutting off when there are more than TS_SPACE_GLUE_MAX. */
static inline void ts_space_glue_add(ts_space_glue *g, const char *piece, size_t n) {
    uint32_t cp, before = TS_SPACE_CP;
    size_t len;
    for (size_t at = 0; g->on && at < n; at += len) {
        if (ts_utf8_next(piece + at, n - at, &cp, &len) != TS_UTF8_CHAR) return;
        if (cp == TS_SPACE_CP && before != TS_SPACE_CP) {
            int k = 0;
            while (k < g->n && g->cp[k] != before)
                k++;
            if (k == TS_SPACE_GLUE_MAX)
                g->on = false;
            else if (k == g->n)
                g->cp[g->n++] = before;
        }
        before = cp;
    }
}

/* The end of the part of p[0..n) (valid UTF-8) that starts at from: the next U+2581 after
 * from whose preceding character is neither U+2581 nor glue, else n. */
static inline size_t ts_space_part_end(const ts_space_glue *g, const char *p, size_t n,
                                       size_t from) {
    if (!g->on) return n;
    uint32_t cp, before = TS_SPACE_CP;
    size_t len;
    for (size_t at = from; at < n; at += len) {
        ts_utf8_next(p + at, n - at, &cp, &len);
        if (cp == TS_SPACE_CP && at > from && before != TS_SPACE_CP) {
            bool glued = false;
            for (int k = 0; k < g->n; k++)
                glued |= g->cp[k] == before;
            if (!glued) return at;
        }
        before = cp;
    }
    return n;
}

#endif
