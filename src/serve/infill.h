/* llama-server's POST /infill, which code editors' completion plugins speak: the text before
 * the cursor (input_prefix), after it (input_suffix), other files of the project (input_extra)
 * and the start of the middle already typed (prompt) become a fill-in-the-middle prompt
 * (ts_tokenize_fim_frame: the repo-level pattern), which runs as the completion it means; the
 * answer is llama-server's own shape (content, stop_type, tokens_*, timings), whole or as a
 * stream of content pieces. docs/API.md, "llama-server's /infill". HTTP side. */
#ifndef TS_SERVE_INFILL_H
#define TS_SERVE_INFILL_H

#include "serve/job.h"
#include "serve/openai.h"
#include "serve/respond.h"
#include "serve/worker.h"

#include <jansson.h>

/* The completion request body an /infill body means: its prompt the frame's token ids, its
 * generation fields under the completion's names (n_predict -> max_tokens, repeat_penalty ->
 * repetition_penalty; the others as they are). *keep_at: the frame's tokens before the
 * prefix - the project's files, which an editor's next requests share - where there are
 * files, else 0 (serve_job.keep_at). NULL with e set for an /infill field's refusal;
 * the completion's checks come after, on the body returned (owned by the caller). */
json_t *serve_infill_request(const json_t *body, const serve_runtime *rt, int *keep_at,
                             serve_error *e);
/* The completion request body llama-server's POST /completion body means: one prompt (a string
 * or token ids), its fields under the completion's names as for /infill; answered in the same
 * shape as /infill. NULL with e set. */
json_t *serve_llama_completion_request(const json_t *body, serve_error *e);

/* A completion check's param renamed back into the /infill request's names. */
void serve_infill_error(serve_error *e);

/* The answer of finished job j (its mutex held) as llama-server's /infill object. */
char *serve_infill_full(const serve_resp *r, const serve_job *j);
/* Stream events, "data: {...}\n\n" each: a piece of the content; the end (the whole object
 * with an empty content and stop true); a failure after the stream started. */
ts_status serve_infill_chunk_text(const char *s, size_t n, ts_strbuf *out);
ts_status serve_infill_chunk_finish(const serve_resp *r, const serve_job *j, ts_strbuf *out);
ts_status serve_infill_chunk_error(const serve_error *e, ts_strbuf *out);

#endif
