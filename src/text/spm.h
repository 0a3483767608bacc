/* SentencePiece-style BPE tokenizer (GGUF `tokenizer.ggml.model` = "llama": Llama 1/2, Mistral,
 * Gemma), reproducing llama.cpp's tokenization of such vocabularies exactly.
 *
 * Encoding:
 *   1. Ill-formed UTF-8 is repaired first (utf8.h policy: each maximal ill-formed subpart
 *      becomes U+FFFD).
 *   2. Special tokens are split out of the raw text the way llama.cpp does: user-defined tokens
 *      always, control and unknown tokens only with parse_special. Longer tokens are taken
 *      first over the whole text (then lower ids, then leftmost), each occurrence kept when it
 *      does not overlap one already taken.
 *   3. Each remaining fragment: a U+2581 prefix when add_space_prefix is set and the fragment
 *      starts the text or follows a special token; every ASCII space becomes U+2581; the text
 *      is split into UTF-8 characters; then, repeatedly, the adjacent pair whose concatenation
 *      is a vocabulary entry (any type) with the highest score is merged (leftmost on ties),
 *      with a heap, O(n log n).
 *   4. A final piece that is not a vocabulary entry is spelled as byte tokens `<0xXX>`.
 * Never adds BOS/EOS (the caller does).
 *
 * Decoding: normal tokens with U+2581 turned back into spaces, byte tokens as their byte,
 * control/unknown/user-defined tokens as their text (control and unknown are "special": dropped
 * by skip_special), unused tokens as nothing; the bytes joined, ill-formed UTF-8 replaced.
 *
 * A built ts_spm is immutable; every function may be called from several threads at once. */
#ifndef TS_TEXT_SPM_H
#define TS_TEXT_SPM_H

#include "text/bpe.h"
#include "text/utf8.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Token types, numbered as GGUF's tokenizer.ggml.token_type (and SentencePiece's). */
typedef enum {
    TS_SPM_UNDEFINED = 0,
    TS_SPM_NORMAL = 1,
    TS_SPM_UNKNOWN = 2,
    TS_SPM_CONTROL = 3,
    TS_SPM_USER_DEFINED = 4,
    TS_SPM_UNUSED = 5,
    TS_SPM_BYTE = 6,
} ts_spm_type;

typedef struct {
    const char *name;        /* for messages (e.g. the file) */
    int32_t n_tokens;        /* ids 0 .. n_tokens-1 */
    const char *const *text; /* [n_tokens] the pieces as stored (U+2581 for spaces) */
    const size_t *len;       /* [n_tokens] their lengths in bytes */
    const float *scores;     /* [n_tokens] merge priorities; NULL = all 0 */
    const int32_t *types;    /* [n_tokens] ts_spm_type values; NULL = all normal */
    int32_t unk_id;          /* -1 when none */
    bool add_space_prefix;
} ts_spm_spec;

typedef struct ts_spm ts_spm;

/* Copies what it needs from spec. TS_ERR_FORMAT for an empty vocabulary, a bad type, an empty
 * piece or a byte token not spelled <0xXX>; TS_ERR_UNSUPPORTED when some byte has no token to
 * fall back to (no <0xXX> piece, no single-byte piece, no unknown token). */
ts_status ts_spm_build(const ts_spm_spec *spec, ts_spm **out);
void ts_spm_free(ts_spm *t);

int ts_spm_vocab_size(const ts_spm *t);
/* Appends the ids of text[0..len) to out (keeping its earlier contents). On error out keeps its
 * earlier length. */
ts_status ts_spm_encode(const ts_spm *t, const char *text, size_t len, bool parse_special,
                        ts_ids *out);
/* The id whose piece is exactly text (any type; the highest id when two share a piece, as
 * llama.cpp's lookup), -1 when none. */
int32_t ts_spm_token_id(const ts_spm *t, const char *text);
ts_spm_type ts_spm_token_type(const ts_spm *t, int32_t id); /* UNDEFINED when out of range */
/* The piece as stored (not decoded); NULL when id is out of range. */
const char *ts_spm_token_piece(const ts_spm *t, int32_t id, size_t *len);
/* The bytes id decodes to (see above); NULL out of range, "" for unused ids. */
const char *ts_spm_token_bytes(const ts_spm *t, int32_t id, size_t *len);
/* Control and unknown tokens (dropped by skip_special). */
bool ts_spm_is_special(const ts_spm *t, int32_t id);
/* Decodes ids into a malloc'd NUL-terminated string; TS_ERR_RANGE for an id out of range. */
ts_status ts_spm_decode(const ts_spm *t, const int32_t *ids, size_t n, bool skip_special,
                        char **out, size_t *len);
void ts_spm_token_source(const ts_spm *t, ts_token_source *src);

#endif
