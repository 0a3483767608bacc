/* UTF-8 text: the invalid-input policy over base/utf8.h's code points, a growable byte buffer,
 * and the incremental detokenizer.
 *
 * Invalid input policy (used by the tokenizers and by every decode path): each *maximal
 * subpart* of an ill-formed sequence becomes one U+FFFD. A maximal subpart is the longest
 * prefix of a well-formed sequence that the input contains (e.g. E2 82 followed by 'A' is one
 * subpart; C0 80 is two, since C0 can never start a sequence). This is the Unicode standard's
 * recommended practice, and what Python's bytes.decode('utf-8', errors='replace') and Rust's
 * String::from_utf8_lossy (hence Hugging Face tokenizers' decode) do. */
#ifndef TS_TEXT_UTF8_H
#define TS_TEXT_UTF8_H

#include "base/utf8.h"
#include "tessera.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TS_UTF8_REPLACEMENT "\xEF\xBF\xBD" /* U+FFFD */

/* ---- growable byte buffer ------------------------------------------------------------------ */

/* Zero-initialise ({0}) before use; the owner frees data with ts_strbuf_free. data is kept
 * NUL-terminated whenever it is non-NULL (the NUL is not counted in len). */
typedef struct {
    char *data;
    size_t len;
    size_t cap;
} ts_strbuf;

ts_status ts_strbuf_reserve(ts_strbuf *b, size_t extra);
ts_status ts_strbuf_append(ts_strbuf *b, const char *s, size_t n);
/* Appends printf's output, whole (however long). */
ts_status ts_strbuf_printf(ts_strbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void ts_strbuf_free(ts_strbuf *b);

/* Appends s[0..n) to out with the invalid-input policy above applied. */
ts_status ts_utf8_append_lossy(ts_strbuf *out, const char *s, size_t n);

/* Appends a run of byte tokens as Hugging Face's ByteFallback decoder joins them: the bytes
 * when the whole run is valid UTF-8, else one U+FFFD for each byte of the run. */
ts_status ts_utf8_append_byte_run(ts_strbuf *out, const char *run, size_t n);

/* ---- incremental detokenizer ------------------------------------------------------------- */

/* Where the detokenizer reads token bytes; implemented by each tokenizer (BPE, SentencePiece).
 * token_bytes returns the raw bytes of id (NULL when id is out of range; a valid id with no
 * bytes returns "" and 0). is_special says whether skip_special drops the id. is_byte, where
 * set, names the byte tokens that Hugging Face's ByteFallback decoder joins in runs
 * (ts_utf8_append_byte_run); the other tokens' bytes are then whole UTF-8 text. */
typedef struct {
    const void *ctx;
    const char *(*token_bytes)(const void *ctx, int32_t id, size_t *len);
    bool (*is_special)(const void *ctx, int32_t id);
    bool (*is_byte)(const void *ctx, int32_t id);
} ts_token_source;

/* The token source of a tokenizer (tokenizer.c). */
void ts_tokenizer_token_source(const ts_tokenizer *t, ts_token_source *src);

/* Streams text out of token ids, one id at a time: emits only whole UTF-8 characters, holds
 * back the bytes of a character that a later token may complete, and replaces ill-formed
 * bytes by U+FFFD as soon as they are known to be ill-formed. Pushing ids one by one and then
 * flushing yields exactly the text of a one-shot lossy decode of all their bytes. With a
 * source's is_byte, a run of byte tokens is held until the next other token (or the flush)
 * and then joined by ts_utf8_append_byte_run, as the tokenizer's one-shot decode joins it. */
typedef struct ts_detok ts_detok;

/* src is copied; the tokenizer behind it must outlive the detokenizer. */
ts_status ts_detok_create(const ts_token_source *src, bool skip_special, ts_detok **out);
void ts_detok_free(ts_detok *d);

/* Feeds one id. *text and *len receive the newly completed text (possibly empty), which stays
 * valid until the next call on d. TS_ERR_RANGE for an id the tokenizer does not know (the
 * state is unchanged). */
ts_status ts_detok_push(ts_detok *d, int32_t id, const char **text, size_t *len);

/* Ends the stream: held-back bytes come out as U+FFFD. d is then ready for a new stream. */
ts_status ts_detok_flush(ts_detok *d, const char **text, size_t *len);

/* Whether the ids so far end inside a character: bytes held for a later id to complete. */
bool ts_detok_mid_char(const ts_detok *d);

/* Forgets held-back bytes without emitting them. */
void ts_detok_reset(ts_detok *d);

#endif
