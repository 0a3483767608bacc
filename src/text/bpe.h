/* BPE tokenizer loaded from a Hugging Face tokenizer.json: byte-level (GPT-2 / Qwen style) or
 * over characters with byte fallback (SentencePiece models converted by transformers: Gemma).
 *
 * Encoding reproduces Hugging Face `tokenizers` exactly for the configurations it accepts:
 * added tokens are split out first (leftmost-longest match), the remaining segments are
 * normalized (NFC, Replace, or none), split by the pre-tokenizer regex(es), and merged by
 * rank - from the byte-level alphabet's bytes, or from characters (a character missing from
 * the vocab as its <0xXX> byte pieces, else unk). Anything else in the file (other
 * normalizers, pre-tokenizers, models, truncation, padding, added-token flags) is refused at
 * load with TS_ERR_UNSUPPORTED naming the field, rather than tokenized differently.
 *
 * Input text may be any bytes: ill-formed UTF-8 is first repaired by the policy in utf8.h
 * (each maximal ill-formed subpart becomes U+FFFD), which gives the ids that HF gives for
 * bytes.decode('utf-8', errors='replace').
 *
 * A loaded ts_bpe is immutable; every function here may be called from several threads at
 * once. */
#ifndef TS_TEXT_BPE_H
#define TS_TEXT_BPE_H

#include "tessera.h"
#include "text/utf8.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A growable vector of token ids. Zero-initialise ({0}); free with ts_ids_free. */
typedef struct {
    int32_t *data;
    size_t len;
    size_t cap;
} ts_ids;

ts_status ts_ids_push(ts_ids *v, int32_t id);
ts_status ts_ids_reserve(ts_ids *v, size_t extra);
void ts_ids_free(ts_ids *v);

typedef struct ts_bpe ts_bpe;

/* The largest tokenizer.json accepted (the real Qwen3.5 file is ~15-20 MB). */
#define TS_BPE_MAX_FILE_BYTES (64u << 20)

/* Loads and validates tokenizer.json. Errors name the file and the JSON field at fault:
 * TS_ERR_IO (cannot read), TS_ERR_FORMAT (malformed or inconsistent: a merge naming an
 * unknown token, duplicate ids, ...), TS_ERR_UNSUPPORTED (well-formed but not a byte-level
 * BPE configuration we reproduce exactly), TS_ERR_RANGE (file too large). */
ts_status ts_bpe_load(const char *tokenizer_json_path, ts_bpe **out);
void ts_bpe_free(ts_bpe *t);

/* A tokenizer given as arrays (e.g. GGUF `tokenizer.ggml.*` metadata for model "gpt2") rather
 * than a file. ts_bpe_build turns it into the tokenizer.json structure it stands for and runs
 * the same validation and construction as ts_bpe_load, so both paths build identical
 * tokenizers. Token types are GGUF's: 1 normal, 3 control (an added token flagged special),
 * 4 user-defined (an added token matched in both special modes), 5 unused (no token at that
 * id), 0 and 6 as normal. */
typedef struct {
    const char *name;            /* for messages (e.g. the GGUF file) */
    int32_t n_tokens;            /* ids 0 .. n_tokens-1 */
    const char *const *text;     /* [n_tokens] spellings (byte-level alphabet for normal tokens) */
    const size_t *len;           /* [n_tokens] */
    const int32_t *types;        /* [n_tokens], NULL = all normal */
    const char *const *merges;   /* [n_merges] "left right", highest priority first */
    const size_t *merge_len;     /* [n_merges] */
    size_t n_merges;
    const char *const *split_regex; /* pre-tokenizer regexes (HF syntax), applied in order */
    int n_split;
    bool nfc;                    /* NFC-normalize text before splitting */
} ts_bpe_spec;

ts_status ts_bpe_build(const ts_bpe_spec *spec, ts_bpe **out);

/* Highest token id + 1, counting added tokens. */
int ts_bpe_vocab_size(const ts_bpe *t);

/* Appends the ids of text[0..len) to out (which keeps its earlier contents). parse_special:
 * when true, added tokens flagged special that occur in the text become their ids (chat
 * templates, raw completion opt-in); when false only non-special added tokens (e.g.
 * `<think>`) are matched and special-looking text is tokenized as ordinary text (HF's
 * encode_special_tokens = True). Never adds BOS/EOS. On error out keeps its earlier length. */
ts_status ts_bpe_encode(const ts_bpe *t, const char *text, size_t len, bool parse_special,
                        ts_ids *out);

/* The id of an added token by its exact content; failing that, the id of the regular token
 * whose decoded bytes are exactly token_text (e.g. "\n"). -1 when there is none. */
int32_t ts_bpe_token_id(const ts_bpe *t, const char *token_text);

/* What HF's encode with add_special_tokens=True puts before and after one sequence (the
 * post-processor's template, e.g. Gemma's <bos>); -1 for none. ts_bpe_encode never adds them. */
void ts_bpe_post_tokens(const ts_bpe *t, int32_t *bos, int32_t *eos);

/* True for added tokens flagged "special" (dropped by skip_special decoding). */
bool ts_bpe_is_special(const ts_bpe *t, int32_t id);

/* The bytes a token decodes to (byte-level alphabet undone, or the decoder's Replace and
 * ByteFallback applied; an added token's content likewise). The
 * pointer lives as long as t; the bytes are not NUL-terminated and may be a partial UTF-8
 * character. NULL for an id outside [0, vocab_size); "" with *len = 0 for an unused id. */
const char *ts_bpe_token_bytes(const ts_bpe *t, int32_t id, size_t *len);

/* Decodes ids to text: the tokens' bytes joined, ill-formed UTF-8 replaced by U+FFFD (as HF
 * decode; with ByteFallback, each run of byte pieces on its own, ts_utf8_append_byte_run).
 * skip_special drops special added tokens. *out is malloc'd and NUL-terminated; the caller frees
 * it. TS_ERR_RANGE for an id outside [0, vocab_size) (HF silently skips those; we refuse). */
ts_status ts_bpe_decode(const ts_bpe *t, const int32_t *ids, size_t n, bool skip_special,
                        char **out, size_t *len);

/* Fills src so that a ts_detok can stream this tokenizer's output. */
void ts_bpe_token_source(const ts_bpe *t, ts_token_source *src);

#endif
