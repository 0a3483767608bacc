/* Internals of the BPE tokenizer (byte-level, or over characters with byte fallback), shared by
 * bpe.c, bpe_load.c and its unit test. */
#ifndef TS_TEXT_BPE_INT_H
#define TS_TEXT_BPE_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "base/byte_piece.h"
#include "text/bpe.h"
#include "text/space_cut.h"

#include <pcre2.h>
#include <pthread.h>
#include <string.h>

#define BPE_MAX_ID     (1 << 24) /* ids at or above this are refused at load */
#define BPE_MAX_SPLITS 4         /* pre-tokenizer regexes applied one after another */
#define BPE_MAX_NORM   4         /* normalizer steps */

enum {
    BPE_TOK_PRESENT = 1, /* the id has a token */
    BPE_TOK_BYTES = 2,   /* a regular token spelled in the byte-level alphabet (mergeable) */
    BPE_TOK_ADDED = 4,
    BPE_TOK_SPECIAL = 8,
    BPE_TOK_BYTE = 16, /* decodes to one byte through the ByteFallback decoder (<0xXX>) */
};

/* A normalizer step: NFC, or every occurrence of a literal string replaced by another. */
typedef struct {
    bool nfc;
    char *from, *to; /* Replace: from non-empty */
    size_t from_len, to_len;
} bpe_norm_step;

typedef struct {
    uint64_t key; /* (left id << 32) | right id; BPE_EMPTY_KEY when the slot is free */
    int32_t rank; /* position in model.merges: lower merges first */
    int32_t new_id;
} bpe_merge;

#define BPE_EMPTY_KEY UINT64_MAX

typedef struct {
    char *content; /* as in the file (what token_id looks up) */
    char *pattern; /* what is matched: content, NFC'd when the token is "normalized" */
    size_t pattern_len;
    int32_t id;
    bool special;
    bool normalized;
} bpe_added;

/* Leftmost-longest matcher over a set of added tokens (Gemma has ~6,400, most starting with
 * '<'): the patterns in a hash table, and for each first byte the distinct lengths of the
 * patterns that start with it, longest first; a position costs one lookup per length. */
typedef struct {
    int n;
    int32_t *slots; /* indices into ts_bpe.added by pattern hash; -1 = free */
    size_t mask;
    uint32_t *lens;     /* distinct pattern lengths, by first byte, each run longest first */
    int32_t first[257]; /* lens[first[b] .. first[b+1]) for patterns starting with byte b */
    /* A filter before the lookups: the second bytes of the patterns starting with byte b (a
     * bit each), and whether one of them is b alone. Gemma has ~30 whitespace runs as added
     * tokens: without it every space of a text would cost ~30 lookups. */
    uint64_t second[256][4];
    bool single[256];
} bpe_matcher;

typedef struct bpe_scratch bpe_scratch;

struct ts_bpe {
    char *path;
    int32_t n_ids; /* highest id + 1 */

    /* Per id [n_ids]: decoded bytes (in blob), vocabulary spelling (in keys), flags. */
    uint32_t *tok_off;
    uint32_t *tok_len;
    uint32_t *key_off;
    uint32_t *key_len;
    uint8_t *tok_flags;
    char *blob;
    char *keys;

    /* model.vocab spelling -> id, open addressing; -1 = free. */
    int32_t *vocab_slots;
    size_t vocab_mask;

    bpe_merge *merges; /* open addressing over (left, right) */
    size_t merge_mask;

    /* Byte-level (GPT-2, Qwen): pieces are spelled in the byte alphabet and merging starts
     * from the single-byte tokens. Otherwise (SentencePiece converted, Gemma): merging starts
     * from the pieces' characters, a character missing from the vocab becomes its bytes' <0xXX>
     * pieces (byte_fallback) or unk_id (consecutive ones fused with fuse_unk). */
    bool byte_level;
    int32_t byte_id[256]; /* byte-level: the single-byte tokens BPE starts from */
    bool byte_fallback;
    int32_t fallback_id[256]; /* the <0xXX> pieces; -1 when absent */
    int32_t unk_id;           /* -1 = none */
    bool fuse_unk;
    bool ignore_merges; /* a whole pre-token found in the vocab is emitted as is */
    /* Characters-and-fallback files: where a word may be cut before a U+2581 (space_cut.h);
     * off for byte-level files, with ignore_merges, or where U+2581 is no piece. */
    ts_space_glue space_glue;

    bpe_norm_step norm[BPE_MAX_NORM];
    int n_norm;

    /* The decoder, when not byte-level: Replace (dec_from -> dec_to; none when dec_from_len is
     * 0), then ByteFallback. Applied to every token once, at load (tok_off / tok_len). */
    char *dec_from, *dec_to;
    size_t dec_from_len, dec_to_len;
    bool dec_byte_fallback;

    int32_t post_bos, post_eos; /* what the post-processor puts around a sequence; -1 = none */

    bpe_added *added;
    int n_added;
    bpe_matcher raw_match;  /* tokens matched in the text as given (normalized: false) */
    bpe_matcher norm_match; /* tokens matched after normalization (normalized: true) */

    pcre2_code *split[BPE_MAX_SPLITS];
    bool split_jit[BPE_MAX_SPLITS];
    int n_split;
    uint32_t max_captures;

    /* Per-call work memory and the pre-token cache live in scratch objects; a call borrows
     * one from this free list (or makes one), so concurrent calls never share them. */
    pthread_mutex_t pool_lock;
    bpe_scratch *pool;
    int pool_n;
};

/* Merges one pre-token (raw bytes, n >= 1) and appends its ids. method: 0 = automatic,
 * 1 = always the quadratic scan used for short words, 2 = always the heap. Exposed so the
 * unit test can check that the two give the same ids. */
ts_status bpe_merge_word(const ts_bpe *t, bpe_scratch *s, const uint8_t *p, size_t n, int method,
                         ts_ids *out);

/* Test hook: runs ts_bpe_encode's pipeline but hands each pre-token (normalized bytes) to fn
 * instead of merging it, and each added token as (NULL, 0, id). */
typedef ts_status (*bpe_piece_fn)(void *ctx, const char *p, size_t n, int32_t added_id);
ts_status bpe_pretokenize(const ts_bpe *t, const char *text, size_t len, bool parse_special,
                          bpe_piece_fn fn, void *ctx);

bpe_scratch *bpe_scratch_get(const ts_bpe *t);
void bpe_scratch_put(const ts_bpe *t, bpe_scratch *s);

/* ---- helpers shared by bpe_load.c and bpe.c ------------------------------------------------ */

/* GPT-2's reversible byte -> character map: the printable Latin-1 bytes stand for themselves,
 * the 68 others (controls, space, DEL..NBSP, soft hyphen) take U+0100.. in byte order. */
static inline uint32_t bpe_byte_to_cp(uint8_t b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    if (b <= 0x20) return 0x100u + b;
    if (b >= 0x7F && b <= 0xA0) return 0x121u + (b - 0x7Fu);
    return 0x143; /* 0xAD */
}

static inline uint64_t bpe_mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

static inline uint64_t bpe_hash(const void *data, size_t n) {
    const uint8_t *p = data;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0x100000001b3ull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 31;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    return bpe_mix(h ^ w);
}

/* The merge rank of the pair (a, b), INT32_MAX when the pair never merges. */
static inline int32_t bpe_pair(const ts_bpe *t, int32_t a, int32_t b, int32_t *new_id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = bpe_mix(key) & t->merge_mask;
    for (;;) {
        const bpe_merge *m = &t->merges[i];
        if (m->key == key) {
            *new_id = m->new_id;
            return m->rank;
        }
        if (m->key == BPE_EMPTY_KEY) return INT32_MAX;
        i = (i + 1) & t->merge_mask;
    }
}

/* Decodes an alphabet spelling into bytes (out has room for n bytes). False when s contains a
 * character outside the alphabet. */
bool bpe_spelling_to_bytes(const char *s, size_t n, char *out, size_t *out_len);
/* Spells bytes in the alphabet; out needs 2 * n bytes. Returns the spelling's length. */
size_t bpe_bytes_to_spelling(const uint8_t *p, size_t n, char *out);
/* The model.vocab id of a spelling, -1 when absent. */
int32_t bpe_vocab_find(const ts_bpe *t, const char *key, size_t n);
/* NFC of s[0..n) (valid UTF-8) into a malloc'd *out. */
ts_status bpe_nfc(const char *s, size_t n, char **out, size_t *out_len);
/* The normalizer's steps over s[0..n), appended to out (work: scratch for the steps between). */
ts_status bpe_normalize(const ts_bpe *t, const char *s, size_t n, ts_strbuf *out, ts_strbuf *work);
/* Appends s[0..n) to out with every occurrence of from replaced by to (left to right, not
 * overlapping: HF's Replace with a String pattern). */
ts_status bpe_replace_append(const char *s, size_t n, const char *from, size_t from_len,
                             const char *to, size_t to_len, ts_strbuf *out);
/* Frees the idle scratch objects (at ts_bpe_free, when no call is running). */
void bpe_pool_free(ts_bpe *t);

#endif
