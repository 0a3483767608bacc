/* libFuzzer target for the OpenAI request path that runs before a request is admitted, without
 * a server or a model: body -> serve_json_parse -> serve_request_parse (chat or completions) ->
 * the stop strings (serve_parse_stop) -> the prompt rendered with the chat template and
 * tokenized (ts_chat_tokenize / ts_tokenize with the small Qwen3.5 stand-in tokenizer, loaded
 * once), as serve_prepare does. A refusal must come with a 4xx/5xx status and an error envelope
 * that can be written out (serve_error_json); a NULL envelope turns into a 500 "out of memory"
 * in http.c, so it is checked here.
 *
 * Before all that, the body parsed with its long strings cut out (serve/json_load.c, at a
 * threshold of 1-8 bytes so that short inputs take that way) must give jansson's value or
 * jansson's error.
 *
 * With bit 4 of byte 0 the body is a Responses API request (serve/responses.h): read as the
 * chat request it means, and chat's refusals renamed into its fields, which must stay
 * writable envelopes too.
 *
 * With bit 5 it is an embeddings request (serve/embeddings.h): read, its inputs tokenized and
 * checked and shared out over jobs - every input once, in order, each within the context - and
 * the answer to those jobs written and read back as JSON.
 *
 * With bit 6 it is llama-server's /infill (serve/infill.h): framed into the completion it
 * means, whose refusals are renamed into the /infill fields.
 *
 * Input: byte 0 = flags (bit 0: completions instead of chat, bits 1-3: the threshold, bit 4:
 * the Responses API, bit 5: embeddings, bit 6: /infill), then the body. */
#include "fuzz_util.h"
#include "serve/embeddings.h"
#include "serve/infill.h"
#include "serve/json_load.h"
#include "serve/messages.h"
#include "serve/openai.h"
#include "serve/prep.h"
#include "serve/responses.h"
#include "text/utf8.h"

#include <jansson.h>
#include <stdint.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The engine's definition (engine/sampler.c) would pull in the CPU backend; this is its body. */
void ts_sampler_params_default(ts_sampler_params *p) {
    *p = (ts_sampler_params){
        .temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 0};
}

static ts_tokenizer *tok;
static serve_rsp_store *store;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    if (ts_tokenizer_open(fz_tokenizer_path(), &tok) != TS_OK) {
        fprintf(stderr, "fuzz_openai: %s\n", ts_last_error());
        abort();
    }
    if (serve_rsp_store_create(1 << 20, &store) != TS_OK) abort();
    return 0;
}

static void check_error(const serve_error *e) {
    FZ_ASSERT(e->status >= 400 && e->status < 600 && e->type && e->code && e->message[0]);
    char *s = serve_error_json(e);
    if (!s) fprintf(stderr, "fuzz_openai: no error envelope for: %s\n", e->message);
    FZ_ASSERT(s);
    json_error_t je;
    json_t *v = json_loads(s, 0, &je);
    FZ_ASSERT(v);
    const char *msg = json_string_value(json_object_get(json_object_get(v, "error"), "message"));
    /* the message as given, or with a character cut by a %.Ns repaired to U+FFFD */
    FZ_ASSERT(msg &&
              (strcmp(msg, e->message) == 0 || !ts_utf8_valid(e->message, strlen(e->message))));
    json_decref(v);
    free(s);
    /* the Messages API's envelope for the same error */
    s = serve_msg_error_json(e);
    FZ_ASSERT(s);
    v = json_loads(s, 0, &je);
    FZ_ASSERT(v && json_is_string(json_object_get(json_object_get(v, "error"), "message")));
    json_decref(v);
    free(s);
}

/* An embeddings body, read and made into jobs as the server does (root taken over). */
static void embeddings(json_t *root, const char *const *ids) {
    serve_runtime rt = {.tok = tok,
                        .n_ctx = 64,
                        .n_vocab = ts_tokenizer_vocab_size(tok),
                        .n_embd = 4,
                        .n_embd_out = 3, /* not the width: the Dense layers' */
                        .n_parallel = 3};
    serve_embed_request r;
    serve_error e;
    serve_job **jobs = NULL;
    int n = 0;
    if (!serve_embed_parse(root, ids, &rt, &r, &e) ||
        !serve_embed_jobs(&rt, &r, SERVE_POOL_LAST, 3, &jobs, &n, &e)) {
        check_error(&e);
    } else {
        FZ_ASSERT(n >= 1 && n <= 3 && n <= r.n_inputs);
        int inputs = 0, tokens = 0;
        for (int g = 0; g < n; g++) {
            serve_job *j = jobs[g];
            FZ_ASSERT(j->n_inputs >= 1 && j->input_at[0] == 0 &&
                      j->input_at[j->n_inputs] == j->n_ids);
            for (int i = 0; i < j->n_inputs; i++) {
                int len = j->input_at[i + 1] - j->input_at[i];
                FZ_ASSERT(len >= 1 && len <= rt.n_ctx);
            }
            for (int i = 0; i < j->n_ids; i++)
                FZ_ASSERT(j->ids[i] >= 0 && j->ids[i] < rt.n_vocab);
            for (int i = 0; i < j->n_inputs * rt.n_embd_out; i++)
                j->embedding[i] = 0.5f;
            inputs += j->n_inputs, tokens += j->n_ids;
        }
        FZ_ASSERT(inputs == r.n_inputs);
        char *body = serve_embed_answer(jobs, n, rt.n_embd_out, r.dims, "tessera", r.base64);
        json_t *v = body ? json_loads(body, 0, NULL) : NULL;
        FZ_ASSERT(v && (int)json_array_size(json_object_get(v, "data")) == inputs);
        FZ_ASSERT(json_integer_value(
                      json_object_get(json_object_get(v, "usage"), "prompt_tokens")) == tokens);
        json_decref(v);
        free(body);
    }
    for (int g = 0; g < n; g++)
        serve_job_unref(jobs[g]);
    free(jobs);
    serve_embed_request_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    bool messages = (data[0] & 80) == 80; /* the Messages API: both bits */
    bool responses = data[0] & 16 && !messages;
    serve_api api = data[0] & 1 && !(data[0] & 16) ? SERVE_API_COMPLETION : SERVE_API_CHAT;
    static const char *const ids[] = {"tessera", "qwen", NULL};
    serve_error e;
    json_t *root;
    {
        const char *body = (const char *)data + 1;
        json_error_t e1, e2;
        bool deep;
        json_t *a = serve_json_load(body, size - 1, 1 + (data[0] >> 1 & 7), SERVE_MAX_JSON_DEPTH,
                                    &deep, &e1, NULL);
        json_t *b = deep ? NULL : json_loadb(body, size - 1, JSON_REJECT_DUPLICATES, &e2);
        FZ_ASSERT(deep || (a && b && json_equal(a, b)) ||
                  (!a && !b && e1.position == e2.position && !strcmp(e1.text, e2.text)));
        json_decref(a);
        json_decref(b);
    }
    if (!serve_json_parse((const char *)data + 1, size - 1, &root, &e)) {
        check_error(&e);
        return 0;
    }
    if (data[0] & 32) {
        embeddings(root, ids);
        return 0;
    }
    bool infill = data[0] & 64 && !(data[0] & 16);
    if (infill) {
        serve_runtime rt = {.tok = tok, .n_ctx = 64, .n_vocab = ts_tokenizer_vocab_size(tok)};
        int keep_at;
        json_t *b = serve_infill_request(root, &rt, &keep_at, &e);
        json_decref(root);
        if (!b) {
            check_error(&e);
            return 0;
        }
        root = b, api = SERVE_API_COMPLETION;
    }
    serve_rsp_map map = {0};
    serve_msg_read md = {0};
    if (messages) {
        bool ok = serve_msg_request(root, data[0] & 1, &md, &e);
        json_decref(root);
        if (!ok) {
            check_error(&e);
            return 0;
        }
        root = md.chat, md.chat = NULL;
    }
    if (responses) {
        serve_rsp_read rd;
        bool ok = serve_rsp_request(root, store, &rd, &e);
        json_decref(root);
        if (!ok) {
            check_error(&e);
            return 0;
        }
        root = rd.chat, rd.chat = NULL;
        map = rd.map, rd.map = (serve_rsp_map){0};
        /* what a stored answer leaves behind: a conversation a later body may name */
        if (rd.conversation) serve_rsp_store_put(store, "resp_1", rd.conversation, rd.input, "{}");
        serve_rsp_read_free(&rd);
    }
    serve_request r;
    if (!serve_request_parse(api, root, ids, 4096, &r, &e)) {
        if (responses) serve_rsp_error(&map, &e);
        if (infill) serve_infill_error(&e);
        if (messages) serve_msg_error(&md, &e);
        serve_rsp_map_free(&map);
        serve_msg_read_free(&md);
        check_error(&e);
        serve_request_free(&r);
        return 0;
    }
    serve_rsp_map_free(&map);
    serve_msg_read_free(&md);
    /* 0 only for a completion that echoes its prompt (its log-probabilities, no answer) */
    FZ_ASSERT(r.max_tokens == -1 || (r.max_tokens >= 1 && r.max_tokens <= 4096) ||
              (r.max_tokens == 0 && api == SERVE_API_COMPLETION && r.echo));
    FZ_ASSERT(r.top_logprobs >= -1 && r.top_logprobs <= 20);
    FZ_ASSERT(r.min_tokens >= 0 && r.n_stop_ids >= 0 && r.n_stop_ids <= SERVE_MAX_STOP_IDS);
    for (int i = 0; i < r.n_stop_ids; i++)
        FZ_ASSERT(r.stop_ids[i] >= 0);
    char *stops[SERVE_MAX_STOPS];
    int n_stops = 0;
    if (serve_parse_stop(r.stop, stops, &n_stops, &e)) {
        FZ_ASSERT(n_stops >= 0 && n_stops <= SERVE_MAX_STOPS);
        for (int i = 0; i < n_stops; i++) {
            FZ_ASSERT(stops[i][0]);
            free(stops[i]);
        }
    } else {
        check_error(&e);
        for (int i = 0; i < n_stops; i++)
            free(stops[i]);
    }
    FZ_ASSERT(r.n >= 1 && r.n <= SERVE_MAX_N);
    /* best_of: at least n, equal to it on a chat or a stream */
    FZ_ASSERT(r.best_of >= r.n && r.best_of <= SERVE_MAX_N);
    FZ_ASSERT(r.best_of == r.n || (api == SERVE_API_COMPLETION && !r.stream));
    FZ_ASSERT(api == SERVE_API_CHAT || (r.n_prompts >= 1 && r.n_prompts <= SERVE_MAX_PROMPTS));
    for (int p = 0; p < (api == SERVE_API_CHAT ? 1 : r.n_prompts); p++) {
        int32_t *tids = NULL;
        size_t n = 0;
        ts_status st = TS_OK;
        if (api == SERVE_API_CHAT) {
            ts_chat_params cp = {r.add_generation_prompt, r.enable_thinking, r.tools_json, NULL, 0,
                                 r.continue_final};
            st = ts_chat_tokenize(tok, r.msgs, r.n_msgs, &cp, &tids, &n);
        } else if (r.prompts[p].text) {
            st = ts_tokenize(tok, r.prompts[p].text, strlen(r.prompts[p].text), true, &tids, &n);
        } else {
            for (int i = 0; i < r.prompts[p].n_ids; i++)
                FZ_ASSERT(r.prompts[p].ids[i] >= 0);
        }
        if (st == TS_OK)
            for (size_t i = 0; i < n; i++)
                FZ_ASSERT(tids[i] >= 0 && tids[i] < ts_tokenizer_vocab_size(tok));
        else
            FZ_ASSERT(ts_last_error()[0]);
        free(tids);
    }
    serve_request_free(&r);
    return 0;
}
