/* An Anthropic Messages request read as the chat request it means. The Messages fields' own
 * shape is checked here (roles, content blocks, tools, tool_choice, thinking, what this
 * server does not run); everything else is chat's to check on the chat body this builds, and
 * serve_msg_error names the Messages fields in chat's errors. */
#include "serve/messages.h"
#include "serve/rename.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const json_t *field(const json_t *o, const char *name) {
    const json_t *v = json_object_get(o, name);
    return v && !json_is_null(v) ? v : NULL;
}

static bool oom(serve_error *e) {
    return serve_fail(e, 500, "internal_error", NULL, "out of memory");
}

void serve_msg_read_free(serve_msg_read *rd) {
    json_decref(rd->chat);
    free(rd->from);
    *rd = (serve_msg_read){0};
}

/* Appends chat message m (its reference taken) that came from the request's message `from`. */
static bool push(serve_msg_read *rd, json_t *msgs, json_t *m, int from, serve_error *e) {
    if (rd->n_from == rd->cap_from) {
        int cap = rd->cap_from ? 2 * rd->cap_from : 16;
        int *f = realloc(rd->from, (size_t)cap * sizeof *f);
        if (!f) {
            json_decref(m);
            return oom(e);
        }
        rd->from = f, rd->cap_from = cap;
    }
    if (!m || json_array_append_new(msgs, m) != 0) return oom(e);
    rd->from[rd->n_from++] = from;
    return true;
}

static const char *type_of(const json_t *block) {
    const json_t *t = json_object_get(block, "type");
    return json_is_string(t) ? json_string_value(t) : "";
}

/* The text of a string, or of a list of text blocks (joined); NULL with e set. */
static json_t *text_of(const json_t *v, const char *at, serve_error *e) {
    if (json_is_string(v)) return json_incref((json_t *)v);
    if (!json_is_array(v)) {
        serve_fail(e, 400, "invalid_value", at, "%s must be a string or a list of text blocks", at);
        return NULL;
    }
    ts_strbuf t = {0};
    size_t k;
    const json_t *b;
    json_array_foreach(v, k, b) {
        const json_t *text = json_object_get(b, "text");
        if (strcmp(type_of(b), "text") != 0 || !json_is_string(text)) {
            ts_strbuf_free(&t);
            serve_fail(e, 400, "unsupported_feature", at,
                       "%s.%zu: only text blocks are read here (type '%.40s')", at, k, type_of(b));
            return NULL;
        }
        ts_strbuf_append(&t, json_string_value(text), json_string_length(text));
    }
    json_t *s = json_stringn(t.data ? t.data : "", t.len);
    ts_strbuf_free(&t);
    if (!s) oom(e);
    return s;
}

/* An image block as chat's image_url part: a base64 source as a data: URL, a url source as it
 * is (fetched as the server allows). */
static json_t *image_part(const json_t *b, const char *at, serve_error *e) {
    const json_t *src = json_object_get(b, "source");
    const char *st = json_is_object(src) ? type_of(src) : "";
    const json_t *data = json_object_get(src, "data"), *mt = json_object_get(src, "media_type");
    const json_t *url = json_object_get(src, "url");
    json_t *p = NULL;
    if (!strcmp(st, "base64") && json_is_string(data) && json_is_string(mt)) {
        ts_strbuf u = {0};
        ts_strbuf_append(&u, "data:", 5);
        ts_strbuf_append(&u, json_string_value(mt), json_string_length(mt));
        ts_strbuf_append(&u, ";base64,", 8);
        ts_strbuf_append(&u, json_string_value(data), json_string_length(data));
        if (u.data)
            p = json_pack("{s:s, s:{s:s%}}", "type", "image_url", "image_url", "url", u.data,
                          u.len);
        ts_strbuf_free(&u);
        if (!p) oom(e);
        return p;
    }
    if (!strcmp(st, "url") && json_is_string(url)) {
        p = json_pack("{s:s, s:{s:O}}", "type", "image_url", "image_url", "url", url);
        if (!p) oom(e);
        return p;
    }
    serve_fail(e, 400, "invalid_value", at,
               "%s: an image's source must be {\"type\": \"base64\", \"media_type\", \"data\"} "
               "or {\"type\": \"url\", \"url\"}",
               at);
    return NULL;
}

/* A plain-text document block as chat's text part: its title and context, when given, each on
 * a line before the text. The text is the source's data ({"type": "text"}) or its text blocks
 * joined ({"type": "content"}); PDFs (base64, url, file sources) are not read, and citations -
 * which this server does not write - are refused rather than left out. */
static json_t *document_part(const json_t *b, const char *at, serve_error *e) {
    const json_t *src = json_object_get(b, "source"), *cit = json_object_get(b, "citations");
    const char *st = json_is_object(src) ? type_of(src) : "";
    json_t *text = NULL;
    if (json_is_true(json_object_get(cit, "enabled")))
        serve_fail(e, 400, "unsupported_feature", at,
                   "%s: citations are not written by this server", at);
    else if (!strcmp(st, "text") && json_is_string(json_object_get(src, "data")))
        text = json_incref(json_object_get(src, "data"));
    else if (!strcmp(st, "content") && json_object_get(src, "content"))
        text = text_of(json_object_get(src, "content"), at, e);
    else if (!strcmp(st, "text") || !strcmp(st, "content"))
        serve_fail(e, 400, "invalid_value", at, "%s: a text document's source needs its text", at);
    else
        serve_fail(e, 400, "unsupported_feature", at,
                   "%s: only plain-text documents are read here (source type 'text' or "
                   "'content'), not '%.40s'",
                   at, st);
    if (!text) return NULL;
    ts_strbuf t = {0};
    static const char *const heads[] = {"title", "context"};
    for (int k = 0; k < 2; k++) {
        const json_t *h = json_object_get(b, heads[k]);
        if (json_is_string(h) && json_string_length(h) > 0) {
            ts_strbuf_append(&t, json_string_value(h), json_string_length(h));
            ts_strbuf_append(&t, "\n\n", 2);
        }
    }
    ts_strbuf_append(&t, json_string_value(text), json_string_length(text));
    json_decref(text);
    json_t *p = t.data ? json_pack("{s:s, s:s%}", "type", "text", "text", t.data, t.len) : NULL;
    ts_strbuf_free(&t);
    if (!p) oom(e);
    return p;
}

/* A text, image or document block as chat's content part; NULL with e set for any other block
 * (what says which blocks the content may hold). */
static json_t *content_part(const json_t *b, const char *at, const char *what, serve_error *e) {
    const char *t = type_of(b);
    if (!strcmp(t, "image")) return image_part(b, at, e);
    if (!strcmp(t, "document")) return document_part(b, at, e);
    if (strcmp(t, "text") != 0) {
        serve_fail(e, 400, "unsupported_feature", at,
                   "%s: blocks of type '%.40s' are not read here (%s)", at, t, what);
        return NULL;
    }
    const json_t *text = json_object_get(b, "text");
    if (!json_is_string(text)) {
        serve_fail(e, 400, "invalid_value", at, "%s.text must be a string", at);
        return NULL;
    }
    json_t *p = json_pack("{s:s, s:O}", "type", "text", "text", text);
    if (!p) oom(e);
    return p;
}

/* A tool_result's content with an image or a document among its blocks: chat's parts, in
 * order (a tool's result may show what it read, as a file reader or a screenshot tool does). */
static json_t *result_parts(const json_t *c, const char *at, serve_error *e) {
    json_t *parts = json_array();
    if (!parts) return oom(e), NULL;
    size_t k;
    const json_t *b;
    json_array_foreach(c, k, b) {
        char bat[136];
        snprintf(bat, sizeof bat, "%s.content.%zu", at, k);
        json_t *p = content_part(b, bat, "text, image, document", e);
        if (!p || json_array_append_new(parts, p) != 0) {
            if (p) oom(e);
            json_decref(parts);
            return NULL;
        }
    }
    return parts;
}

static bool beyond_text(const json_t *c) {
    size_t k;
    const json_t *b;
    json_array_foreach(c, k, b) if (strcmp(type_of(b), "text") != 0) return true;
    return false;
}

/* A tool_result block as a chat tool message: its content a string, or text blocks joined,
 * or with images the blocks as parts. */
static json_t *tool_message(const json_t *b, const char *at, serve_error *e) {
    const json_t *id = json_object_get(b, "tool_use_id");
    if (!json_is_string(id)) {
        serve_fail(e, 400, "invalid_value", at, "%s.tool_use_id must be a string", at);
        return NULL;
    }
    const json_t *c = field(b, "content");
    json_t *text = !c                                   ? json_string("")
                   : json_is_array(c) && beyond_text(c) ? result_parts(c, at, e)
                                                        : text_of(c, at, e);
    if (!text) return NULL;
    json_t *m = json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content", text);
    if (!m) oom(e);
    return m;
}

/* A user message's blocks (message i, at: its content's name): its tool results as tool
 * messages first, then its other blocks as one user message (text and images, in order). */
static bool user_message(serve_msg_read *rd, json_t *msgs, const json_t *content, int i,
                         const char *at, serve_error *e) {
    json_t *parts = json_array();
    size_t k;
    const json_t *b;
    bool ok = parts != NULL || oom(e);
    json_array_foreach(content, k, b) {
        if (!ok) break;
        char bat[96];
        snprintf(bat, sizeof bat, "%s.%zu", at, k);
        if (!strcmp(type_of(b), "tool_result")) {
            json_t *m = tool_message(b, bat, e);
            ok = m && push(rd, msgs, m, i, e);
            continue;
        }
        json_t *p = content_part(b, bat, "text, image, document, tool_result", e);
        ok = p != NULL;
        if (ok && json_array_append_new(parts, p) != 0) ok = oom(e);
    }
    if (ok && json_array_size(parts) > 0)
        return push(rd, msgs, json_pack("{s:s, s:o}", "role", "user", "content", parts), i, e);
    json_decref(parts);
    return ok;
}

/* An assistant message's blocks: text blocks its content, thinking blocks its reasoning,
 * tool_use blocks its tool calls. */
static bool assistant_message(serve_msg_read *rd, json_t *msgs, const json_t *content, int i,
                              const char *at, serve_error *e) {
    ts_strbuf text = {0}, thinking = {0};
    json_t *calls = json_array();
    bool ok = calls != NULL || oom(e);
    size_t k;
    const json_t *b;
    json_array_foreach(content, k, b) {
        if (!ok) break;
        char bat[96];
        snprintf(bat, sizeof bat, "%s.%zu", at, k);
        const char *t = type_of(b);
        if (!strcmp(t, "text") || !strcmp(t, "thinking")) {
            bool th = t[1] == 'h';
            const json_t *s = json_object_get(b, th ? "thinking" : "text");
            if (!json_is_string(s)) {
                ok = serve_fail(e, 400, "invalid_value", bat, "%s.%s must be a string", bat,
                                th ? "thinking" : "text");
                break;
            }
            ts_strbuf_append(th ? &thinking : &text, json_string_value(s), json_string_length(s));
        } else if (!strcmp(t, "tool_use")) {
            const json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name");
            const json_t *input = json_object_get(b, "input");
            if (!json_is_string(id) || !json_is_string(name) || (input && !json_is_object(input))) {
                ok = serve_fail(e, 400, "invalid_value", bat,
                                "%s: a tool_use block needs a string id and name and an object "
                                "input",
                                bat);
                break;
            }
            /* no input: no arguments, {} */
            char *args =
                input ? json_dumps(input, JSON_COMPACT | JSON_PRESERVE_ORDER) : strdup("{}");
            json_t *c = args ? json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type", "function",
                                         "function", "name", name, "arguments", args)
                             : NULL;
            free(args);
            ok = (c && json_array_append_new(calls, c) == 0) || oom(e);
        } else if (strcmp(t, "redacted_thinking") != 0) { /* its text is not ours to read */
            ok = serve_fail(e, 400, "unsupported_feature", bat,
                            "%s: blocks of type '%.40s' are not read in an assistant message "
                            "(text, thinking, tool_use)",
                            bat, t);
        }
    }
    json_t *m = NULL;
    if (ok) {
        m = json_pack("{s:s, s:s%}", "role", "assistant", "content", text.data ? text.data : "",
                      text.len);
        if (m && thinking.len)
            json_object_set_new(m, "reasoning_content", json_stringn(thinking.data, thinking.len));
        if (m && json_array_size(calls)) json_object_set(m, "tool_calls", calls);
        ok = push(rd, msgs, m, i, e);
    }
    ts_strbuf_free(&text);
    ts_strbuf_free(&thinking);
    json_decref(calls);
    return ok;
}

static bool messages_field(serve_msg_read *rd, json_t *msgs, const json_t *list, serve_error *e) {
    if (!json_is_array(list) || json_array_size(list) == 0)
        return serve_fail(e, 400, "invalid_value", "messages",
                          "'messages' is required: a non-empty list of messages");
    size_t i;
    const json_t *m;
    json_array_foreach(list, i, m) {
        char at[40];
        snprintf(at, sizeof at, "messages[%zu]", i);
        const json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        const char *r = json_is_string(role) ? json_string_value(role) : "";
        if (!json_is_object(m) || !content)
            return serve_fail(e, 400, "invalid_value", at,
                              "%s must be an object with a role and content", at);
        bool user = !strcmp(r, "user");
        if (!user && strcmp(r, "assistant") != 0)
            return serve_fail(e, 400, "invalid_value", at,
                              "%s.role must be 'user' or 'assistant' (the system prompt is "
                              "'system')",
                              at);
        char cat[48];
        snprintf(cat, sizeof cat, "%s.content", at);
        bool ok;
        if (json_is_string(content)) /* either role's text as it is */
            ok = push(rd, msgs, json_pack("{s:s, s:O}", "role", r, "content", content), (int)i, e);
        else if (!json_is_array(content))
            ok = serve_fail(e, 400, "invalid_value", cat, "%s must be a string or a list of blocks",
                            cat);
        else
            ok = user ? user_message(rd, msgs, content, (int)i, cat, e)
                      : assistant_message(rd, msgs, content, (int)i, cat, e);
        if (!ok) return false;
    }
    return true;
}

/* tools: custom tools {name, description, input_schema} as chat's function tools. */
static bool tools_field(const json_t *tools, json_t *chat, serve_error *e) {
    if (!json_is_array(tools))
        return serve_fail(e, 400, "invalid_value", "tools", "'tools' must be a list");
    json_t *out = json_array();
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const char *type = type_of(t);
        if (*type && strcmp(type, "custom") != 0) {
            json_decref(out);
            return serve_fail(e, 400, "unsupported_feature", "tools",
                              "tools[%zu]: only custom tools (name, description, input_schema) "
                              "are run here, not '%.60s'",
                              i, type);
        }
        json_t *fn = json_object();
        if (json_object_get(t, "name")) json_object_set(fn, "name", json_object_get(t, "name"));
        if (json_object_get(t, "description"))
            json_object_set(fn, "description", json_object_get(t, "description"));
        if (json_object_get(t, "input_schema"))
            json_object_set(fn, "parameters", json_object_get(t, "input_schema"));
        json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn));
    }
    return json_object_set_new(chat, "tools", out) == 0 || oom(e);
}

static bool tool_choice_field(const json_t *tc, json_t *chat, serve_error *e) {
    const char *t = json_is_object(tc) ? type_of(tc) : "";
    json_t *v = NULL;
    if (!strcmp(t, "auto") || !strcmp(t, "none"))
        v = json_string(t);
    else if (!strcmp(t, "any"))
        v = json_string("required");
    else if (!strcmp(t, "tool"))
        v = json_pack("{s:s, s:{s:O?}}", "type", "function", "function", "name",
                      json_object_get(tc, "name"));
    else
        return serve_fail(e, 400, "invalid_value", "tool_choice",
                          "tool_choice must be {\"type\": \"auto\" | \"any\" | \"none\"} or "
                          "{\"type\": \"tool\", \"name\"}");
    if (json_is_true(json_object_get(tc, "disable_parallel_tool_use")))
        json_object_set_new(chat, "parallel_tool_calls", json_false());
    return json_object_set_new(chat, "tool_choice", v) == 0 || oom(e);
}

/* thinking: {"type": "enabled", "budget_tokens"} (or "adaptive", the model's own choice: this
 * model thinks when its template lets it) turns the model's thinking on; left out or
 * {"type": "disabled"}, it is off (Anthropic's default) - unless left out and the extension
 * chat_template_kwargs.enable_thinking says otherwise. budget_tokens bounds the thinking (chat's
 * thinking_token_budget). Anthropic's own limits on it (at least 1024, less than max_tokens)
 * are not kept: a small model may want less, and a budget over max_tokens bounds nothing. */
static bool thinking_field(const json_t *th, json_t *chat, serve_error *e) {
    if (th && !json_is_object(th))
        return serve_fail(e, 400, "invalid_value", "thinking", "'thinking' must be an object");
    const char *t = th ? type_of(th) : "disabled";
    bool on = !strcmp(t, "enabled") || !strcmp(t, "adaptive");
    if (!on && strcmp(t, "disabled") != 0)
        return serve_fail(e, 400, "invalid_value", "thinking",
                          "thinking.type must be 'enabled', 'adaptive' or 'disabled'");
    const json_t *b = !strcmp(t, "enabled") ? json_object_get(th, "budget_tokens") : NULL;
    if (b && !json_is_null(b)) {
        if (!json_is_integer(b) || json_integer_value(b) < 0 || json_integer_value(b) > INT32_MAX)
            return serve_fail(e, 400, "invalid_value", "thinking.budget_tokens",
                              "thinking.budget_tokens must be an integer >= 0");
        if (json_object_set(chat, "thinking_token_budget", (json_t *)b)) return oom(e);
    }
    json_t *kw = json_object_get(chat, "chat_template_kwargs");
    if (!kw) json_object_set_new(chat, "chat_template_kwargs", kw = json_object());
    if (!json_is_object(kw)) return true; /* chat refuses it */
    if (!th && json_object_get(kw, "enable_thinking")) return true;
    return json_object_set_new(kw, "enable_thinking", json_boolean(on)) == 0 || oom(e);
}

static bool read_request(const json_t *body, bool count, serve_msg_read *rd, serve_error *e) {
    const json_t *mt = field(body, "max_tokens");
    if (!count && !mt)
        return serve_fail(e, 400, "invalid_value", "max_tokens", "'max_tokens' is required");
    if (field(body, "mcp_servers"))
        return serve_fail(e, 400, "unsupported_feature", "mcp_servers",
                          "'mcp_servers' is not supported: this server calls no tools itself");
    json_t *chat = json_object(), *msgs = json_array();
    rd->chat = chat;
    if (!chat || !msgs) {
        json_decref(msgs);
        return oom(e);
    }
    json_object_set_new(chat, "messages", msgs);
    const json_t *sys = field(body, "system"), *v;
    if (sys) {
        json_t *text = text_of(sys, "system", e);
        if (!text ||
            !push(rd, msgs, json_pack("{s:s, s:o}", "role", "system", "content", text), -1, e))
            return false;
    }
    if (!messages_field(rd, msgs, field(body, "messages"), e)) return false;
    /* Anthropic's fields chat shares, then this server's chat extensions, as they are */
    static const char *const same[] = {"model",
                                       "max_tokens",
                                       "temperature",
                                       "top_p",
                                       "top_k",
                                       "stream",
                                       "min_p",
                                       "seed",
                                       "presence_penalty",
                                       "frequency_penalty",
                                       "repetition_penalty",
                                       "logit_bias",
                                       "stop_token_ids",
                                       "min_tokens",
                                       "ignore_eos",
                                       "chat_template_kwargs",
                                       "lora"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        if ((v = json_object_get(body, same[i])) && json_object_set(chat, same[i], (json_t *)v))
            return oom(e);
    if ((v = field(body, "stop_sequences"))) {
        if (!json_is_array(v))
            return serve_fail(e, 400, "invalid_value", "stop_sequences",
                              "'stop_sequences' must be a list of strings");
        if (json_object_set(chat, "stop", (json_t *)v)) return oom(e);
    }
    if ((v = field(body, "tools")) && !tools_field(v, chat, e)) return false;
    if ((v = field(body, "tool_choice")) && !tool_choice_field(v, chat, e)) return false;
    return thinking_field(field(body, "thinking"), chat, e);
}

bool serve_msg_request(const json_t *body, bool count, serve_msg_read *rd, serve_error *e) {
    *rd = (serve_msg_read){0};
    if (read_request(body, count, rd, e)) return true;
    serve_msg_read_free(rd);
    return false;
}

/* ---- chat's errors in the Messages request's names -------------------------------------- */

static void rename_in(const serve_msg_read *rd, const char *in, char *out, size_t cap) {
    static const serve_rename_pair names[] = {{"max_completion_tokens", "max_tokens"},
                                              {"chat_template_kwargs.enable_thinking", "thinking"},
                                              {"tool_choice.function.name", "tool_choice.name"},
                                              {".function.parameters", ".input_schema"},
                                              {".function.", "."},
                                              {"'stop'", "'stop_sequences'"},
                                              {"stop[", "stop_sequences["}};
    size_t len = 0;
    out[0] = 0;
    for (const char *p = in; *p;) {
        int i, used = 0;
        char tail[32];
        if (sscanf(p, "messages[%d]%n", &i, &used) == 1 && used && i >= 0 && i < rd->n_from) {
            if (rd->from[i] < 0)
                snprintf(tail, sizeof tail, "system");
            else
                snprintf(tail, sizeof tail, "messages[%d]", rd->from[i]);
            serve_rename_put(out, cap, &len, tail, strlen(tail));
            p += used;
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

void serve_msg_error(const serve_msg_read *rd, serve_error *e) {
    char buf[sizeof e->message];
    rename_in(rd, e->param, buf, sizeof e->param);
    memcpy(e->param, buf, sizeof e->param);
    if (!strcmp(e->param, "stop")) snprintf(e->param, sizeof e->param, "stop_sequences");
    rename_in(rd, e->message, buf, sizeof buf);
    memcpy(e->message, buf, sizeof e->message);
}
