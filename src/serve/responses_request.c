/* A Responses API request read as the chat request it means. The Responses fields' own shape is
 * checked here (input's items, tools, text, reasoning, what a stateless server cannot do);
 * everything else is chat's to check, on the chat body this builds, and serve_rsp_error names
 * the Responses fields in chat's errors. */
#include "serve/rename.h"
#include "serve/responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    json_t *msgs;
    serve_rsp_map *map;
    int cap_msgs, cap_calls;
    char *reasoning; /* a reasoning item's text, for the next assistant turn (owned) */
} builder;

static const json_t *field(const json_t *o, const char *name) {
    const json_t *v = json_object_get(o, name);
    return v && !json_is_null(v) ? v : NULL;
}

void serve_rsp_map_free(serve_rsp_map *m) {
    free(m->item);
    free(m->call_at);
    free(m->call);
    free(m->tool_output);
    *m = (serve_rsp_map){0};
}

static bool oom(serve_error *e) {
    return serve_fail(e, 500, "internal_error", NULL, "out of memory");
}

/* Appends message m (new reference taken) that came from input item `item`. */
static bool push_msg(builder *b, json_t *m, int item, bool tool_output, serve_error *e) {
    serve_rsp_map *map = b->map;
    if (map->n_msgs == b->cap_msgs) {
        int cap = b->cap_msgs ? 2 * b->cap_msgs : 16;
        int *a = realloc(map->item, (size_t)cap * sizeof *a);
        if (a) map->item = a;
        int *c = a ? realloc(map->call_at, (size_t)cap * sizeof *c) : NULL;
        if (c) map->call_at = c;
        bool *k = c ? realloc(map->tool_output, (size_t)cap * sizeof *k) : NULL;
        if (k) map->tool_output = k;
        if (!k) {
            json_decref(m);
            return oom(e);
        }
        b->cap_msgs = cap;
    }
    map->item[map->n_msgs] = item;
    map->call_at[map->n_msgs] = map->n_calls;
    map->tool_output[map->n_msgs] = tool_output;
    map->n_msgs++;
    if (!m || json_array_append_new(b->msgs, m) != 0) return oom(e);
    return true;
}

/* The pending reasoning goes to assistant message m. */
static void take_reasoning(builder *b, json_t *m) {
    if (!b->reasoning) return;
    json_object_set_new(m, "reasoning_content", json_string(b->reasoning));
    free(b->reasoning);
    b->reasoning = NULL;
}

/* A message item's content: a string as it is, a list of parts as chat's parts. */
static bool content_parts(const json_t *content, const char *at, json_t **out, serve_error *e) {
    if (!json_is_array(content)) {
        *out = json_deep_copy(content); /* chat checks what it is */
        return *out || oom(e);
    }
    json_t *parts = json_array();
    size_t k;
    const json_t *p;
    json_array_foreach(content, k, p) {
        char param[80];
        snprintf(param, sizeof param, "%s.content[%zu]", at, k);
        const json_t *type = json_object_get(p, "type");
        const char *t = json_is_string(type) ? json_string_value(type) : "";
        json_t *part = NULL;
        if (!strcmp(t, "input_text") || !strcmp(t, "output_text") || !strcmp(t, "refusal")) {
            const json_t *text = json_object_get(p, strcmp(t, "refusal") ? "text" : "refusal");
            if (!json_is_string(text)) {
                json_decref(parts);
                return serve_fail(e, 400, "invalid_value", param,
                                  "%s: a part of type %s needs its %s", param, t,
                                  strcmp(t, "refusal") ? "text" : "refusal");
            }
            part = json_pack("{s:s, s:O}", "type", "text", "text", text);
        } else if (!strcmp(t, "input_image")) {
            const json_t *url = field(p, "image_url");
            if (!url) {
                json_decref(parts);
                return serve_fail(e, 400, "unsupported_feature", param,
                                  "%s: only images inline as an image_url data URL are read "
                                  "(nothing is uploaded to this server: no file_id)",
                                  param);
            }
            part = json_pack("{s:s, s:{s:O}}", "type", "image_url", "image_url", "url", url);
        } else if (!strcmp(t, "input_file") || !strcmp(t, "input_audio")) {
            json_decref(parts);
            return serve_fail(e, 400, "unsupported_feature", param,
                              "%s: %s parts are not read "
                              "here",
                              param, t);
        } else {
            json_decref(parts);
            return serve_fail(e, 400, "invalid_value", param,
                              "%s: unknown part type '%.40s' (input_text, output_text, refusal, "
                              "input_image)",
                              param, t);
        }
        if (!part || json_array_append_new(parts, part) != 0) {
            json_decref(parts);
            return oom(e);
        }
    }
    *out = parts;
    return true;
}

/* The text of a reasoning item: its reasoning_text parts, else its summary's texts. */
static bool reasoning_item(builder *b, const json_t *it, const char *at, serve_error *e) {
    ts_strbuf t = {0};
    const char *keys[2] = {"content", "summary"};
    for (int k = 0; k < 2 && t.len == 0; k++) {
        const json_t *list = field(it, keys[k]);
        if (list && !json_is_array(list)) {
            ts_strbuf_free(&t);
            return serve_fail(e, 400, "invalid_value", at, "%s.%s must be a list", at, keys[k]);
        }
        size_t i;
        const json_t *p;
        json_array_foreach(list, i, p) {
            const json_t *text = json_object_get(p, "text");
            if (!json_is_string(text)) continue;
            if (t.len) ts_strbuf_append(&t, "\n\n", 2);
            ts_strbuf_append(&t, json_string_value(text), json_string_length(text));
        }
    }
    ts_strbuf_append(&t, "", 0);
    if (!t.data) return oom(e);
    if (b->reasoning) { /* two in a row: one text */
        size_t n = strlen(b->reasoning);
        char *s = realloc(b->reasoning, n + 2 + t.len + 1);
        if (!s) {
            ts_strbuf_free(&t);
            return oom(e);
        }
        memcpy(s + n, "\n\n", 2);
        memcpy(s + n + 2, t.data, t.len + 1);
        b->reasoning = s;
        ts_strbuf_free(&t);
    } else {
        b->reasoning = t.data;
    }
    return true;
}

/* A function_call item: a tool call of the assistant turn before it, or of a new one. */
static bool call_item(builder *b, const json_t *it, int j, const char *at, serve_error *e) {
    const json_t *id = json_object_get(it, "call_id");
    if (!json_is_string(id))
        return serve_fail(e, 400, "invalid_value", at, "%s.call_id must be a string", at);
    json_t *call =
        json_pack("{s:O, s:s, s:{s:O?, s:O?}}", "id", id, "type", "function", "function", "name",
                  json_object_get(it, "name"), "arguments", json_object_get(it, "arguments"));
    if (!call) return oom(e);
    size_t n = json_array_size(b->msgs);
    json_t *last = n ? json_array_get(b->msgs, n - 1) : NULL;
    const json_t *role = json_object_get(last, "role");
    if (!last || !json_is_string(role) || strcmp(json_string_value(role), "assistant") != 0) {
        json_t *m = json_pack("{s:s, s:n, s:[]}", "role", "assistant", "content", "tool_calls");
        if (m) take_reasoning(b, m);
        if (!push_msg(b, m, j, false, e)) {
            json_decref(call);
            return false;
        }
        last = m;
    }
    json_t *calls = json_object_get(last, "tool_calls");
    if (!calls) {
        calls = json_array();
        json_object_set_new(last, "tool_calls", calls);
    }
    serve_rsp_map *map = b->map;
    if (map->n_calls == b->cap_calls) {
        int cap = b->cap_calls ? 2 * b->cap_calls : 16;
        int *c = realloc(map->call, (size_t)cap * sizeof *c);
        if (!c) {
            json_decref(call);
            return oom(e);
        }
        map->call = c, b->cap_calls = cap;
    }
    map->call[map->n_calls++] = j;
    if (json_array_append_new(calls, call) != 0) return oom(e);
    return true;
}

/* A function_call_output item: a tool message (the output a string, or text parts joined). */
static bool output_item(builder *b, const json_t *it, int j, const char *at, serve_error *e) {
    const json_t *id = json_object_get(it, "call_id");
    if (!json_is_string(id))
        return serve_fail(e, 400, "invalid_value", at, "%s.call_id must be a string", at);
    const json_t *out = json_object_get(it, "output");
    json_t *content;
    if (json_is_array(out)) {
        ts_strbuf t = {0};
        size_t k;
        const json_t *p;
        json_array_foreach(out, k, p) {
            const json_t *text = json_object_get(p, "text");
            const json_t *type = json_object_get(p, "type");
            if (!json_is_string(text) || !json_is_string(type) ||
                strcmp(json_string_value(type), "input_text") != 0) {
                ts_strbuf_free(&t);
                return serve_fail(e, 400, "unsupported_feature", at,
                                  "%s.output[%zu]: only input_text parts are read in a tool's "
                                  "output",
                                  at, k);
            }
            ts_strbuf_append(&t, json_string_value(text), json_string_length(text));
        }
        content = json_stringn(t.data ? t.data : "", t.len);
        ts_strbuf_free(&t);
    } else {
        content = out ? json_deep_copy(out) : json_null(); /* chat checks it */
    }
    json_t *m =
        json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content", content);
    return push_msg(b, m, j, true, e);
}

static bool input_items(builder *b, const json_t *input, serve_error *e) {
    size_t j;
    const json_t *it;
    json_array_foreach(input, j, it) {
        char at[48];
        snprintf(at, sizeof at, "input[%zu]", j);
        if (!json_is_object(it))
            return serve_fail(e, 400, "invalid_value", at, "%s must be an object (an item)", at);
        const json_t *type = field(it, "type");
        if (type && !json_is_string(type))
            return serve_fail(e, 400, "invalid_value", at, "%s.type must be a string", at);
        const char *t = type ? json_string_value(type) : "message";
        if (!strcmp(t, "message")) {
            json_t *m = json_deep_copy(it), *parts = NULL;
            if (!m) return oom(e);
            json_object_del(m, "type");
            json_object_del(m, "id");
            json_object_del(m, "status");
            const json_t *c = json_object_get(it, "content");
            if (c) {
                if (!content_parts(c, at, &parts, e)) {
                    json_decref(m);
                    return false;
                }
                json_object_set_new(m, "content", parts);
            }
            const json_t *role = json_object_get(m, "role");
            if (json_is_string(role) && !strcmp(json_string_value(role), "assistant"))
                take_reasoning(b, m);
            if (!push_msg(b, m, (int)j, false, e)) return false;
        } else if (!strcmp(t, "function_call")) {
            if (!call_item(b, it, (int)j, at, e)) return false;
        } else if (!strcmp(t, "function_call_output")) {
            if (!output_item(b, it, (int)j, at, e)) return false;
        } else if (!strcmp(t, "reasoning")) {
            if (!reasoning_item(b, it, at, e)) return false;
        } else {
            char param[64];
            snprintf(param, sizeof param, "%s.type", at);
            return serve_fail(e, 400, "unsupported_feature", param,
                              "%s: items of type '%.40s' are not read here (message, "
                              "function_call, function_call_output, reasoning; nothing is "
                              "stored, so no item_reference)",
                              param, t);
        }
    }
    return true;
}

/* tools: the Responses form {type, name, description, parameters, strict} as chat's. */
static bool tools_field(const json_t *tools, json_t *chat, serve_error *e) {
    if (!json_is_array(tools))
        return json_object_set(chat, "tools", (json_t *)tools) == 0 || oom(e);
    json_t *out = json_array();
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        char param[48];
        snprintf(param, sizeof param, "tools[%zu].type", i);
        const json_t *type = json_object_get(t, "type");
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0) {
            json_decref(out);
            return serve_fail(e, 400, "unsupported_feature", param,
                              "%s: only function tools are run here, not '%.40s'", param,
                              json_is_string(type) ? json_string_value(type) : "?");
        }
        json_t *fn = json_object();
        const char *keys[] = {"name", "description", "parameters", "strict"};
        for (int k = 0; k < 4; k++)
            if (json_object_get(t, keys[k]))
                json_object_set(fn, keys[k], json_object_get(t, keys[k]));
        json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn));
    }
    return json_object_set_new(chat, "tools", out) == 0 || oom(e);
}

static bool tool_choice_field(const json_t *tc, json_t *chat, serve_error *e) {
    if (json_is_object(tc)) {
        const json_t *type = json_object_get(tc, "type");
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0)
            return serve_fail(e, 400, "unsupported_feature", "tool_choice",
                              "tool_choice: only auto, none, required or {\"type\": \"function\", "
                              "\"name\"} are read here");
        json_t *c = json_pack("{s:s, s:{s:O?}}", "type", "function", "function", "name",
                              json_object_get(tc, "name"));
        return json_object_set_new(chat, "tool_choice", c) == 0 || oom(e);
    }
    return json_object_set(chat, "tool_choice", (json_t *)tc) == 0 || oom(e);
}

/* text.format as chat's response_format. */
static bool text_field(const json_t *text, json_t *chat, serve_error *e) {
    if (!json_is_object(text))
        return serve_fail(e, 400, "invalid_value", "text", "'text' must be an object");
    const json_t *f = field(text, "format");
    if (!f) return true;
    if (!json_is_object(f))
        return serve_fail(e, 400, "invalid_value", "text.format",
                          "'text.format' must be an object");
    const json_t *type = json_object_get(f, "type");
    json_t *rf;
    if (json_is_string(type) && !strcmp(json_string_value(type), "json_schema")) {
        json_t *js = json_object();
        const char *keys[] = {"name", "description", "schema", "strict"};
        for (int k = 0; k < 4; k++)
            if (json_object_get(f, keys[k]))
                json_object_set(js, keys[k], json_object_get(f, keys[k]));
        rf = json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js);
    } else {
        rf = json_pack("{s:O?}", "type", type); /* text, json_object; chat refuses the rest */
    }
    return json_object_set_new(chat, "response_format", rf) == 0 || oom(e);
}

/* The Responses fields a server that keeps only responses cannot honour, and the shape of
 * those it reads here. */
static bool refused(const json_t *body, serve_error *e) {
    static const char *const stored[] = {"conversation", "prompt"};
    for (size_t i = 0; i < sizeof stored / sizeof stored[0]; i++)
        if (field(body, stored[i]))
            return !serve_fail(e, 400, "unsupported_feature", stored[i],
                               "'%s' is not supported: this server keeps no conversations or "
                               "prompts (send the conversation as input, or name a stored "
                               "response as previous_response_id)",
                               stored[i]);
    if (json_is_true(field(body, "background")))
        return !serve_fail(e, 400, "unsupported_feature", "background",
                           "background responses are not supported (nothing is stored to poll)");
    /* it counts calls of the built-in tools, of which there are none here: nothing to cap */
    const json_t *mtc = field(body, "max_tool_calls");
    if (mtc && !json_is_null(mtc) && !(json_is_integer(mtc) && json_integer_value(mtc) >= 0))
        return !serve_fail(e, 400, "invalid_value", "max_tool_calls",
                           "'max_tool_calls' must be an integer >= 0 or null");
    const json_t *tr = field(body, "truncation");
    if (tr && !(json_is_string(tr) && (!strcmp(json_string_value(tr), "disabled") ||
                                       !strcmp(json_string_value(tr), "auto"))))
        return !serve_fail(e, 400, "invalid_value", "truncation",
                           "'truncation' must be 'auto' or 'disabled'");
    return false;
}

/* include: message.output_text.logprobs asks for the log-probabilities. */
static bool wants_logprobs(const json_t *body, bool *on, serve_error *e) {
    *on = false;
    const json_t *inc = field(body, "include");
    if (!inc) return true;
    if (!json_is_array(inc))
        return serve_fail(e, 400, "invalid_value", "include",
                          "'include' must be a list of strings");
    size_t i;
    const json_t *s;
    json_array_foreach(inc, i, s) {
        if (!json_is_string(s))
            return serve_fail(e, 400, "invalid_value", "include", "include[%zu] must be a string",
                              i);
        *on |= strcmp(json_string_value(s), "message.output_text.logprobs") == 0;
    }
    return true;
}

static json_t *settings_of(const json_t *body, bool stored) {
    json_t *s = json_object();
    struct {
        const char *key;
        json_t *dflt;
    } echo[] = {{"instructions", json_null()},
                {"max_output_tokens", json_null()},
                {"temperature", json_real(SERVE_DEFAULT_TEMPERATURE)},
                {"top_p", json_real(SERVE_DEFAULT_TOP_P)},
                {"tools", json_array()},
                {"tool_choice", json_string("auto")},
                {"parallel_tool_calls", json_true()},
                {"text", json_pack("{s:{s:s}}", "format", "type", "text")},
                {"reasoning", json_pack("{s:n, s:n}", "effort", "summary")},
                {"metadata", json_object()},
                {"max_tool_calls", json_null()},
                {"top_logprobs", json_integer(0)}};
    for (size_t i = 0; i < sizeof echo / sizeof echo[0]; i++) {
        const json_t *v = field(body, echo[i].key);
        if (v)
            json_object_set(s, echo[i].key, (json_t *)v), json_decref(echo[i].dflt);
        else
            json_object_set_new(s, echo[i].key, echo[i].dflt);
    }
    const json_t *tr = field(body, "truncation");
    json_object_set_new(s, "truncation", json_string(tr ? json_string_value(tr) : "disabled"));
    json_object_set_new(s, "store", json_boolean(stored));
    const json_t *prev = field(body, "previous_response_id");
    json_object_set(s, "previous_response_id", prev ? (json_t *)prev : json_null());
    return s;
}

/* The conversation a previous_response_id names, first (a copy: the request's own turns may
 * join its last message, and the store's is shared). */
static bool previous(builder *b, const json_t *body, serve_rsp_store *store, serve_error *e) {
    const json_t *prev = field(body, "previous_response_id");
    if (!prev) return true;
    if (!json_is_string(prev))
        return serve_fail(e, 400, "invalid_value", "previous_response_id",
                          "'previous_response_id' must be a string");
    json_t *kept = NULL;
    if (!store || !serve_rsp_store_get(store, json_string_value(prev), &kept, NULL, NULL))
        return serve_fail(e, 400, "previous_response_not_found", "previous_response_id",
                          "Previous response with id '%.100s' not found (kept are the latest "
                          "responses stored, up to --responses-store-mb, until a restart)",
                          json_string_value(prev));
    size_t i;
    json_t *m;
    bool ok = true;
    json_array_foreach(kept, i, m) {
        if (ok) ok = push_msg(b, json_deep_copy(m), -2, false, e);
    }
    json_decref(kept);
    return ok;
}

void serve_rsp_read_free(serve_rsp_read *rd) {
    json_decref(rd->chat);
    json_decref(rd->settings);
    json_decref(rd->conversation);
    json_decref(rd->input);
    serve_rsp_map_free(&rd->map);
    *rd = (serve_rsp_read){0};
}

/* The request's input as the items GET /v1/responses/{id}/input_items lists (its ids given
 * when it is stored, responses.c item_ids): a string is one user message; a message's text
 * content becomes its one part (input_text, output_text for the assistant's), and an item
 * without a type is a message. The input has been read whole (every item checked). */
static json_t *listed_items(const json_t *input) {
    if (json_is_string(input))
        return json_pack("[{s:s, s:s, s:[{s:s, s:O}]}]", "type", "message", "role", "user",
                         "content", "type", "input_text", "text", input);
    json_t *out = json_deep_copy(input), *it;
    size_t i;
    json_array_foreach(out, i, it) {
        const json_t *type = json_object_get(it, "type");
        if (type && strcmp(json_string_value(type), "message") != 0) continue;
        json_object_set_new(it, "type", json_string("message"));
        const json_t *c = json_object_get(it, "content"), *role = json_object_get(it, "role");
        bool out_text = json_is_string(role) && !strcmp(json_string_value(role), "assistant");
        if (json_is_string(c))
            json_object_set_new(it, "content",
                                json_pack("[{s:s, s:O}]", "type",
                                          out_text ? "output_text" : "input_text", "text", c));
    }
    return out;
}

bool serve_rsp_request(const json_t *body, serve_rsp_store *store, serve_rsp_read *rd,
                       serve_error *e) {
    *rd = (serve_rsp_read){0};
    serve_rsp_map *map = &rd->map;
    if (refused(body, e)) return false;
    const json_t *input = field(body, "input"), *instr = field(body, "instructions");
    if (!input)
        return serve_fail(e, 400, "invalid_value", "input",
                          "'input' is required (a string or a "
                          "list of items)");
    if (!json_is_string(input) && !json_is_array(input))
        return serve_fail(e, 400, "invalid_value", "input",
                          "'input' must be a string or a list of items");
    if (instr && !json_is_string(instr))
        return serve_fail(e, 400, "invalid_value", "instructions",
                          "'instructions' must be a string");
    const json_t *reasoning = field(body, "reasoning");
    if (reasoning && !json_is_object(reasoning))
        return serve_fail(e, 400, "invalid_value", "reasoning", "'reasoning' must be an object");
    const json_t *tlp = field(body, "top_logprobs");
    if (tlp && !(json_is_integer(tlp) && json_integer_value(tlp) >= 0 &&
                 json_integer_value(tlp) <= SERVE_MAX_TOP_LOGPROBS))
        return serve_fail(e, 400, "invalid_value", "top_logprobs",
                          "'top_logprobs' must be an integer in [0, %d]", SERVE_MAX_TOP_LOGPROBS);
    bool logprobs;
    if (!wants_logprobs(body, &logprobs, e)) return false;

    builder b = {json_array(), map, 0, 0, NULL};
    json_t *c = json_object();
    bool ok = b.msgs && c;
    if (!ok) oom(e);
    if (ok && instr)
        ok =
            push_msg(&b, json_pack("{s:s, s:O}", "role", "system", "content", instr), -1, false, e);
    /* a previous response's instructions are not carried over (OpenAI's rule): its
     * conversation was kept without them */
    if (ok) ok = previous(&b, body, store, e);
    if (ok && json_is_string(input))
        ok = push_msg(&b, json_pack("{s:s, s:O}", "role", "user", "content", input), 0, false, e);
    else if (ok)
        ok = input_items(&b, input, e);
    if (ok) ok = json_object_set(c, "messages", b.msgs) == 0 || oom(e);
    /* chat's own fields, as they are */
    static const char *const same[] = {"model",
                                       "stream",
                                       "temperature",
                                       "top_p",
                                       "parallel_tool_calls",
                                       "top_k",
                                       "min_p",
                                       "seed",
                                       "presence_penalty",
                                       "frequency_penalty",
                                       "repetition_penalty",
                                       "logit_bias",
                                       "stop",
                                       "stop_token_ids",
                                       "min_tokens",
                                       "thinking_token_budget",
                                       "ignore_eos",
                                       "chat_template_kwargs",
                                       "lora"};
    for (size_t i = 0; ok && i < sizeof same / sizeof same[0]; i++) {
        const json_t *v = json_object_get(body, same[i]);
        if (v) ok = json_object_set(c, same[i], (json_t *)v) == 0 || oom(e);
    }
    const json_t *v;
    if (ok && (v = json_object_get(body, "max_output_tokens")))
        ok = json_object_set(c, "max_completion_tokens", (json_t *)v) == 0 || oom(e);
    if (ok && reasoning && (v = json_object_get(reasoning, "effort")))
        ok = json_object_set(c, "reasoning_effort", (json_t *)v) == 0 || oom(e);
    if (ok && logprobs) {
        json_object_set_new(c, "logprobs", json_true());
        json_object_set_new(c, "top_logprobs", json_integer(tlp ? json_integer_value(tlp) : 0));
    }
    if (ok && (v = field(body, "tools"))) ok = tools_field(v, c, e);
    if (ok && (v = field(body, "tool_choice"))) ok = tool_choice_field(v, c, e);
    if (ok && (v = field(body, "text"))) ok = text_field(v, c, e);
    const json_t *st = field(body, "store");
    if (ok && st && !json_is_boolean(st))
        ok = serve_fail(e, 400, "invalid_value", "store", "'store' must be a boolean");
    bool stored = !st || json_is_true(st); /* OpenAI's default: stored */
    if (ok && stored) {                    /* what is kept: the messages after the instructions' */
        rd->conversation = json_array();
        for (size_t i = instr ? 1 : 0; rd->conversation && i < json_array_size(b.msgs); i++)
            json_array_append(rd->conversation, json_array_get(b.msgs, i));
        rd->input = listed_items(input);
        if (!rd->conversation || !rd->input) ok = oom(e);
    }
    free(b.reasoning);
    json_decref(b.msgs);
    rd->chat = c;
    if (!ok) {
        serve_rsp_read_free(rd);
        return false;
    }
    rd->settings = settings_of(body, stored);
    const json_t *tr = field(body, "truncation");
    rd->truncate_auto = tr && !strcmp(json_string_value(tr), "auto");
    return true;
}

/* ---- chat's errors in the Responses request's names ------------------------------------- */

static void rename_in(const serve_rsp_map *map, const char *in, char *out, size_t cap) {
    static const serve_rename_pair names[] = {{"max_completion_tokens", "max_output_tokens"},
                                              {"max_tokens", "max_output_tokens"},
                                              {"response_format.json_schema", "text.format"},
                                              {"response_format", "text.format"},
                                              {"reasoning_effort", "reasoning.effort"},
                                              {"tool_choice.function", "tool_choice"},
                                              {".function.", "."},
                                              {".function", ""}};
    size_t len = 0;
    out[0] = 0;
    for (const char *p = in; *p;) {
        int i, k;
        char tail[32];
        /* messages[i].tool_calls[k] -> the function_call item; messages[i] -> its item */
        int used = 0; /* %n is set only once the whole pattern matched (a message may quote
                       * the client's text, which may look like one) */
        if (sscanf(p, "messages[%d].tool_calls[%d]%n", &i, &k, &used) == 2 && used && i >= 0 &&
            i < map->n_msgs && map->item[i] != -2 && k >= 0 && map->call_at[i] + k < map->n_calls) {
            snprintf(tail, sizeof tail, "input[%d]", map->call[map->call_at[i] + k]);
            serve_rename_put(out, cap, &len, tail, strlen(tail));
            p += used;
            continue;
        }
        used = 0;
        if (sscanf(p, "messages[%d]%n", &i, &used) == 1 && used && i >= 0 && i < map->n_msgs) {
            if (map->item[i] == -2)
                snprintf(tail, sizeof tail, "previous_response_id");
            else if (map->item[i] < 0)
                snprintf(tail, sizeof tail, "instructions");
            else
                snprintf(tail, sizeof tail, "input[%d]", map->item[i]);
            serve_rename_put(out, cap, &len, tail, strlen(tail));
            p += used;
            if (map->tool_output[i] && !strncmp(p, ".content", 8)) { /* the item's names */
                serve_rename_put(out, cap, &len, ".output", 7);
                p += 8;
            } else if (map->tool_output[i] && !strncmp(p, ".tool_call_id", 13)) {
                serve_rename_put(out, cap, &len, ".call_id", 8);
                p += 13;
            }
            continue;
        }
        if (!strncmp(p, "messages", 8)) {
            serve_rename_put(out, cap, &len, "input", 5);
            p += 8;
            continue;
        }
        size_t used_name =
            serve_rename_step(names, sizeof names / sizeof names[0], in, p, out, cap, &len);
        if (used_name)
            p += used_name;
        else
            serve_rename_put(out, cap, &len, p++, 1);
    }
}

void serve_rsp_error(const serve_rsp_map *map, serve_error *e) {
    char buf[sizeof e->message];
    rename_in(map, e->param, buf, sizeof e->param);
    memcpy(e->param, buf, sizeof e->param); /* NUL-terminated within it */
    rename_in(map, e->message, buf, sizeof buf);
    memcpy(e->message, buf, sizeof e->message);
}
