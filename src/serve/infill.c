#include "serve/infill.h"

#include "base/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* llama-server's names for the repository and the current file (it takes none from the
 * request either) */
#define INFILL_REPO "myproject"
#define INFILL_FILE "filename"

/* An optional string field ("" when absent or null). */
static bool text_field(const json_t *body, const char *name, const char **s, size_t *n,
                       serve_error *e) {
    const json_t *v = json_object_get(body, name);
    *s = "", *n = 0;
    if (!v || json_is_null(v)) return true;
    if (!json_is_string(v))
        return serve_fail(e, 400, "invalid_value", name, "'%s' must be a string", name);
    *s = json_string_value(v), *n = json_string_length(v);
    return true;
}

/* input_extra: [{"filename": string, "text": string}...] (filename "tmp" when absent, as
 * llama-server names it). *files malloc'd. */
static bool extra_files(const json_t *body, ts_fim_file **files, int *n, serve_error *e) {
    *files = NULL, *n = 0;
    const json_t *x = json_object_get(body, "input_extra");
    if (!x || json_is_null(x)) return true;
    if (!json_is_array(x))
        return serve_fail(e, 400, "invalid_value", "input_extra",
                          "'input_extra' must be a list of {\"filename\", \"text\"} objects");
    size_t k = json_array_size(x), i;
    if (k > SERVE_MAX_PROMPTS)
        return serve_fail(e, 400, "invalid_value", "input_extra",
                          "at most %d input_extra chunks, not %zu", SERVE_MAX_PROMPTS, k);
    if (k && !(*files = calloc(k, sizeof **files)))
        return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    const json_t *c;
    json_array_foreach(x, i, c) {
        const json_t *name = json_object_get(c, "filename"), *text = json_object_get(c, "text");
        if (!json_is_object(c) || !json_is_string(text) ||
            (name && !json_is_null(name) && !json_is_string(name)))
            return serve_fail(e, 400, "invalid_value", "input_extra",
                              "input_extra[%zu] must be {\"filename\": string, \"text\": string}",
                              i);
        ts_fim_file *f = &(*files)[(*n)++];
        f->name = json_is_string(name) ? json_string_value(name) : "tmp";
        f->name_len = strlen(f->name);
        f->text = json_string_value(text), f->text_len = json_string_length(text);
    }
    return true;
}

/* Renames field from to to in b (to given as well: both must agree, as two spellings of one
 * field). */
static bool rename_field(json_t *b, const char *from, const char *to, serve_error *e) {
    json_t *v = json_object_get(b, from);
    if (!v) return true;
    json_t *w = json_object_get(b, to);
    if (w && !json_equal(v, w))
        return serve_fail(e, 400, "invalid_value", from, "'%s' and '%s' differ", from, to);
    json_object_set(b, to, v);
    json_object_del(b, from);
    return true;
}

/* One answer: llama-server's object has no choices. */
static bool one_answer(const json_t *body, const char *route, serve_error *e) {
    for (const char *k = "n\0best_of\0"; *k; k += strlen(k) + 1) {
        const json_t *v = json_object_get(body, k);
        if (v && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 1))
            return serve_fail(e, 400, "invalid_value", k, "%s gives one answer: '%s' must be 1",
                              route, k);
    }
    return true;
}

/* llama-server's names of a completion's fields as the completion's: n_predict -1 (or absent:
 * until the end of generation or the context) and the renames. */
static bool completion_names(json_t *out, serve_error *e) {
    const json_t *np = json_object_get(out, "n_predict");
    if (np && json_is_integer(np) && json_integer_value(np) < 0) json_object_del(out, "n_predict");
    return rename_field(out, "n_predict", "max_tokens", e) &&
           rename_field(out, "repeat_penalty", "repetition_penalty", e);
}

json_t *serve_infill_request(const json_t *body, const serve_runtime *rt, int *keep_at,
                             serve_error *e) {
    ts_fim_frame f = {.repo = INFILL_REPO, .file = INFILL_FILE};
    ts_fim_file *files = NULL;
    int32_t *ids = NULL;
    size_t n = 0, n_context = 0;
    json_t *out = NULL;
    *keep_at = 0;
    bool ok = text_field(body, "input_prefix", &f.prefix, &f.prefix_len, e) &&
              text_field(body, "input_suffix", &f.suffix, &f.suffix_len, e) &&
              extra_files(body, &files, &f.n_files, e) &&
              text_field(body, "prompt", &f.middle, &f.middle_len, e) &&
              one_answer(body, "/infill", e);
    f.files = files;
    if (ok) {
        ts_status st = ts_tokenize_fim_frame(rt->tok, &f, &ids, &n, &n_context);
        if (f.n_files > 0 && n_context < (size_t)INT32_MAX) *keep_at = (int)n_context;
        if (st == TS_ERR_UNSUPPORTED)
            ok = serve_fail(e, 400, "unsupported_feature", "input_prefix", "/infill: %s",
                            ts_last_error());
        else if (st != TS_OK)
            ok = serve_fail(e, 400, "invalid_value", "input_prefix", "%s", ts_last_error());
    }
    if (ok && !(out = json_deep_copy(body)))
        ok = serve_fail(e, 500, "internal_error", NULL, "out of memory");
    if (ok) {
        /* the frame is the prompt; nothing of the completion's own fill in the middle */
        json_t *p = json_array();
        for (size_t i = 0; p && i < n; i++)
            json_array_append_new(p, json_integer(ids[i]));
        json_object_set_new(out, "prompt", p);
        for (const char *k = "input_prefix\0input_suffix\0input_extra\0suffix\0"; *k;
             k += strlen(k) + 1)
            json_object_del(out, k);
        ok = p && completion_names(out, e);
    }
    free(files);
    free(ids);
    if (!ok) {
        json_decref(out);
        return NULL;
    }
    return out;
}

json_t *serve_llama_completion_request(const json_t *body, serve_error *e) {
    const json_t *p = json_object_get(body, "prompt");
    bool ids = json_is_array(p) && json_array_size(p) > 0;
    for (size_t i = 0; ids && i < json_array_size(p); i++)
        ids = json_is_integer(json_array_get(p, i));
    if (!json_is_string(p) && !ids) {
        serve_fail(e, 400, "invalid_value", "prompt",
                   "/completion's 'prompt' must be a string or a list of token ids (one prompt: "
                   "/v1/completions takes several)");
        return NULL;
    }
    if (!one_answer(body, "/completion", e)) return NULL;
    json_t *out = json_deep_copy(body);
    if (!out) {
        serve_fail(e, 500, "internal_error", NULL, "out of memory");
        return NULL;
    }
    if (!completion_names(out, e)) {
        json_decref(out);
        return NULL;
    }
    return out;
}

void serve_infill_error(serve_error *e) {
    static const char *const names[][2] = {{"max_tokens", "n_predict"},
                                           {"repetition_penalty", "repeat_penalty"},
                                           {"prompt", "input_prefix"}};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        if (strcmp(e->param, names[i][0]) != 0) continue;
        snprintf(e->param, sizeof e->param, "%s", names[i][1]);
        /* and the message's 'max_tokens' quoted the same */
        char quoted[32], *at;
        snprintf(quoted, sizeof quoted, "'%s'", names[i][0]);
        if ((at = strstr(e->message, quoted))) {
            char rest[sizeof e->message];
            snprintf(rest, sizeof rest, "%s", at + strlen(quoted));
            snprintf(at, sizeof e->message - (size_t)(at - e->message), "'%s'%s", names[i][1],
                     rest);
        }
    }
}

/* The answer's content: its text (a completion's is all content). */
static json_t *content_of(const serve_job *j) {
    return json_stringn(j->text.data ? j->text.data : "", j->text.len);
}

/* llama-server's stop_type: "eos" (the end of generation), "word" (a stop string), "limit". */
static const char *stop_type(const serve_job *j) {
    if (j->finish == SERVE_FINISH_LENGTH) return "limit";
    return j->stop_str >= 0 ? "word" : "eos";
}

/* The whole object; content NULL: the text's (a stream's end has none). */
static json_t *infill_json(const serve_resp *r, const serve_job *j, json_t *content) {
    bool nl = j->text.data && memchr(j->text.data, '\n', j->text.len);
    const char *word = j->stop_str >= 0 && j->stop_str < j->n_stops ? j->stops[j->stop_str] : "";
    return json_pack("{s:i, s:o, s:b, s:s, s:i, s:i, s:i, s:b, s:b, s:s, s:s, s:o}", "index", 0,
                     "content", content ? content : content_of(j), "stop", 1, "model", r->model,
                     "tokens_predicted", j->completion_tokens, "tokens_evaluated", j->prompt_tokens,
                     "tokens_cached", j->cached_tokens, "has_new_line", nl, "truncated", 0,
                     "stop_type", stop_type(j), "stopping_word", word, "timings",
                     serve_job_timings(j));
}

char *serve_infill_full(const serve_resp *r, const serve_job *j) {
    json_t *v = infill_json(r, j, NULL);
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    return s;
}

ts_status serve_infill_chunk_text(const char *s, size_t n, ts_strbuf *out) {
    return serve_sse_data(out,
                          json_pack("{s:i, s:s%, s:b}", "index", 0, "content", s, n, "stop", 0));
}

ts_status serve_infill_chunk_finish(const serve_resp *r, const serve_job *j, ts_strbuf *out) {
    return serve_sse_data(out, infill_json(r, j, json_string("")));
}

ts_status serve_infill_chunk_error(const serve_error *e, ts_strbuf *out) {
    char *s = serve_error_json(e);
    if (!s) return TS_ERR_NOMEM;
    ts_status st = ts_strbuf_printf(out, "data: %s\n\n", s);
    free(s);
    return st;
}
