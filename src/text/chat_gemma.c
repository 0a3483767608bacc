/* Gemma 3 chat format: what the Jinja chat template of google/gemma-3-*-it renders, as segments
 * (see chat.h). Checked against jinja2 renderings of that template by tests/unit/test_chat_gemma.c.
 *
 * The template: `<bos>`; a first system message is not a turn, its text (untrimmed) + "\n\n" is
 * put before the first user turn's content; the remaining messages must start with a user
 * message and then alternate user / non-user (its exact test), each rendered as
 * `<start_of_turn>{role}\n{content trimmed}<end_of_turn>\n` with assistant named "model" and
 * other roles by their name; content parts: text trimmed, images as `<start_of_image>`, other
 * kinds nothing; then `<start_of_turn>model\n` when a generation prompt is wanted. Reasoning is
 * not part of the format and is left out, as the template leaves it out.
 *
 * Tools are not part of the template either (it leaves them out, so a model served with them
 * would never see them). With tools, this file writes its own function-calling form, the one
 * Gemma 3's documentation describes in outline: the first user turn opens with the functions
 * (their JSON) and how to call them - a reply that is nothing but a Python list of calls,
 * [name(arg=value, ...), ...] -, an assistant's tool calls are written so, and tool results go
 * back in the user's turn (the format has only user and model turns), each as a
 * `tool_output` block; consecutive user-side messages share one turn. Without tools, an
 * assistant's tool calls are refused (TS_ERR_UNSUPPORTED) rather than dropped. */
#include "text/chat.h"
#include "text/chat_json.h"
#include "text/utf8.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    ts_strbuf text;
    ts_chat_seg *segs;
    int n, cap;
} gemma_out;

static ts_status gemma_put(gemma_out *g, ts_chat_seg_kind kind, const char *s, size_t n) {
    if (n == 0) return TS_OK;
    size_t off = g->text.len;
    TS_TRY(ts_strbuf_append(&g->text, s, n));
    if (kind == TS_CHAT_SEG_TEXT && g->n > 0 && g->segs[g->n - 1].kind == TS_CHAT_SEG_TEXT) {
        g->segs[g->n - 1].len += n;
        return TS_OK;
    }
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 16;
        ts_chat_seg *p = realloc(g->segs, (size_t)cap * sizeof *p);
        if (!p) return ts_error(TS_ERR_NOMEM, "chat: out of memory");
        g->segs = p;
        g->cap = cap;
    }
    g->segs[g->n++] = (ts_chat_seg){kind, off, n};
    return TS_OK;
}

static ts_status gemma_text(gemma_out *g, const char *s) {
    return gemma_put(g, TS_CHAT_SEG_TEXT, s, strlen(s));
}

static ts_status gemma_control(gemma_out *g, const char *tok) {
    return gemma_put(g, TS_CHAT_SEG_CONTROL, tok, strlen(tok));
}

/* Appends s (valid UTF-8) with Python whitespace stripped from both ends. */
static ts_status gemma_trimmed(gemma_out *g, const char *s) {
    size_t b = 0, e = strlen(s);
    ts_chat_py_strip(s, &b, &e);
    return e > b ? gemma_put(g, TS_CHAT_SEG_TEXT, s + b, e - b) : TS_OK;
}

static ts_status gemma_check(const ts_chat_msg *m, int i) {
    if (m->role < TS_ROLE_SYSTEM || m->role > TS_ROLE_TOOL)
        return ts_error(TS_ERR_INVALID, "chat: message %d: unknown role", i);
    if (m->content && !ts_utf8_valid(m->content, strlen(m->content)))
        return ts_error(TS_ERR_INVALID, "chat: message %d: content is not valid UTF-8", i);
    for (int k = 0; !m->content && k < m->n_parts; k++) {
        const ts_chat_part *p = &m->parts[k];
        if (p->kind == TS_PART_TEXT && (!p->text || !ts_utf8_valid(p->text, strlen(p->text))))
            return ts_error(TS_ERR_INVALID, "chat: message %d: part %d: missing or invalid text", i,
                            k);
    }
    return TS_OK;
}

static const char *gemma_role(ts_chat_role r) {
    switch (r) {
    case TS_ROLE_SYSTEM: return "system";
    case TS_ROLE_USER: return "user";
    case TS_ROLE_ASSISTANT: return "model";
    default: return "tool";
    }
}

/* The system message's text, which goes before the first user turn's content (*t NULL: no
 * system message); TS_ERR_INVALID when its first part is not text. */
static ts_status system_text(const ts_chat_msg *msgs, const char **t) {
    *t = NULL;
    if (msgs[0].role != TS_ROLE_SYSTEM) return TS_OK;
    const ts_chat_msg *s = &msgs[0];
    *t = s->content                                           ? s->content
         : s->n_parts > 0 && s->parts[0].kind == TS_PART_TEXT ? s->parts[0].text
                                                              : NULL;
    return *t ? TS_OK
              : ts_error(TS_ERR_INVALID, "chat: message 0: a system message's first part must "
                                         "be text");
}

/* The model's turn opened for the answer, when wanted. */
static ts_status generation_prompt(gemma_out *g, const ts_chat_opts *o) {
    if (!o->add_generation_prompt) return TS_OK;
    TS_TRY(gemma_control(g, "<start_of_turn>"));
    return gemma_text(g, "model\n");
}

/* ---- function calling (with tools) ---------------------------------------------------------- */

static const char gemma_tools_head[] =
    "You can call the functions below. To call one or more of them, reply with nothing but a "
    "Python list of the calls, like [function_name(argument=value, other_argument=value)], "
    "with the argument values written as Python literals. Otherwise reply as usual.\n\n";

/* A JSON value as a Python literal: strings and numbers as JSON writes them (valid Python),
 * true / false / null as True / False / None, lists and dicts alike inside. */
static ts_status py_literal(const json_t *v, chat_buf *b) {
    if (json_is_true(v)) return chat_buf_puts(b, "True");
    if (json_is_false(v)) return chat_buf_puts(b, "False");
    if (json_is_null(v)) return chat_buf_puts(b, "None");
    if (json_is_array(v)) {
        TS_TRY(chat_buf_puts(b, "["));
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) TS_TRY(chat_buf_puts(b, ", "));
            TS_TRY(py_literal(json_array_get(v, i), b));
        }
        return chat_buf_puts(b, "]");
    }
    if (json_is_object(v)) {
        TS_TRY(chat_buf_puts(b, "{"));
        const char *k;
        const json_t *x;
        bool first = true;
        json_object_foreach((json_t *)v, k, x) {
            if (!first) TS_TRY(chat_buf_puts(b, ", "));
            first = false;
            json_t *key = json_string(k);
            ts_status st = key ? chat_json_dumps(key, b) : TS_ERR_NOMEM;
            json_decref(key);
            TS_TRY(st);
            TS_TRY(chat_buf_puts(b, ": "));
            TS_TRY(py_literal(x, b));
        }
        return chat_buf_puts(b, "}");
    }
    return chat_json_dumps(v, b);
}

/* An assistant's tool calls as the list the model is asked to write. */
static ts_status calls_text(const ts_chat_msg *m, chat_buf *b) {
    TS_TRY(chat_buf_puts(b, "["));
    for (int k = 0; k < m->n_tool_calls; k++) {
        const ts_chat_tool_call *c = &m->tool_calls[k];
        if (k) TS_TRY(chat_buf_puts(b, ", "));
        TS_TRY(chat_buf_puts(b, c->name));
        TS_TRY(chat_buf_puts(b, "("));
        json_t *args = c->arguments_json ? json_loads(c->arguments_json, 0, NULL) : json_object();
        if (!json_is_object(args)) {
            json_decref(args);
            return ts_error(TS_ERR_INVALID, "chat: tool call '%s': arguments must be a JSON object",
                            c->name);
        }
        const char *key;
        json_t *v;
        bool first = true;
        ts_status st = TS_OK;
        json_object_foreach(args, key, v) {
            if (st != TS_OK) break;
            if (!first) st = chat_buf_puts(b, ", ");
            first = false;
            if (st == TS_OK) st = chat_buf_puts(b, key);
            if (st == TS_OK) st = chat_buf_puts(b, "=");
            if (st == TS_OK) st = py_literal(v, b);
        }
        json_decref(args);
        TS_TRY(st);
        TS_TRY(chat_buf_puts(b, ")"));
    }
    return chat_buf_puts(b, "]");
}

/* A message's content (text trimmed, images) into the turn. */
static ts_status gemma_content(gemma_out *g, const ts_chat_msg *m) {
    if (m->content) return gemma_trimmed(g, m->content);
    for (int k = 0; k < m->n_parts; k++) {
        if (m->parts[k].kind == TS_PART_IMAGE)
            TS_TRY(gemma_control(g, "<start_of_image>"));
        else if (m->parts[k].kind == TS_PART_TEXT)
            TS_TRY(gemma_trimmed(g, m->parts[k].text));
        else /* the Gemma template drops a video; never silently */
            return ts_error(TS_ERR_UNSUPPORTED, "videos in the Gemma chat format are not "
                                                "supported");
    }
    return TS_OK;
}

/* tools: the request's, a non-empty array. */
static ts_status gemma_render_tools(const ts_chat_msg *msgs, int n, const json_t *tools,
                                    const ts_chat_opts *o, gemma_out *g) {
    TS_TRY(gemma_control(g, "<bos>"));
    const char *sys;
    TS_TRY(system_text(msgs, &sys));
    int first = sys ? 1 : 0;
    bool user_side = false, head_done = false;
    for (int i = first; i < n; i++) {
        const ts_chat_msg *m = &msgs[i];
        bool side = m->role != TS_ROLE_ASSISTANT; /* user and tool messages: the user's turn */
        if (m->role == TS_ROLE_SYSTEM)
            return ts_error(TS_ERR_INVALID, "chat: message %d: a system message must be first", i);
        if (i == first && !side)
            return ts_error(TS_ERR_INVALID,
                            "chat: message %d: the conversation must start with "
                            "the user",
                            i);
        if (i > first && side && user_side) { /* the same user turn goes on */
            TS_TRY(gemma_text(g, "\n\n"));
        } else {
            if (i > first) {
                TS_TRY(gemma_control(g, "<end_of_turn>"));
                TS_TRY(gemma_text(g, "\n"));
            }
            TS_TRY(gemma_control(g, "<start_of_turn>"));
            TS_TRY(gemma_text(g, side ? "user\n" : "model\n"));
        }
        user_side = side;
        if (side && !head_done) { /* the first user turn: the system text, then the tools */
            head_done = true;
            if (sys) {
                TS_TRY(gemma_text(g, sys));
                TS_TRY(gemma_text(g, "\n\n"));
            }
            TS_TRY(gemma_text(g, gemma_tools_head));
            chat_buf b = {0};
            ts_status st = TS_OK;
            for (size_t k = 0; st == TS_OK && k < json_array_size(tools); k++) {
                st = chat_json_dumps(json_array_get(tools, k), &b);
                if (st == TS_OK) st = chat_buf_puts(&b, "\n");
            }
            if (st == TS_OK && b.p) st = gemma_text(g, b.p);
            free(b.p);
            TS_TRY(st);
            TS_TRY(gemma_text(g, "\n"));
        }
        if (m->role == TS_ROLE_TOOL) {
            TS_TRY(gemma_text(g, "```tool_output\n"));
            TS_TRY(gemma_content(g, m));
            TS_TRY(gemma_text(g, "\n```"));
        } else {
            TS_TRY(gemma_content(g, m));
        }
        if (m->role == TS_ROLE_ASSISTANT && m->n_tool_calls > 0) {
            chat_buf b = {0};
            ts_status st = calls_text(m, &b);
            bool text = m->content ? *m->content : m->n_parts > 0;
            if (st == TS_OK && text) st = gemma_text(g, "\n");
            if (st == TS_OK) st = gemma_text(g, b.p);
            free(b.p);
            TS_TRY(st);
        }
    }
    TS_TRY(gemma_control(g, "<end_of_turn>"));
    TS_TRY(gemma_text(g, "\n"));
    return generation_prompt(g, o);
}

/* ---- the template ---------------------------------------------------------------------------- */

static ts_status gemma_render(const ts_chat_msg *msgs, int n, const ts_chat_opts *o, gemma_out *g) {
    /* tools (a non-empty list; NULL and "[]" are none): this file's own form */
    json_t *tools = o->tools_json ? json_loads(o->tools_json, 0, NULL) : NULL;
    bool any = json_array_size(tools) > 0;
    ts_status st = TS_OK;
    if (o->tools_json && !json_is_array(tools))
        st = ts_error(TS_ERR_INVALID, "chat: tools must be a JSON array");
    else if (any)
        st = gemma_render_tools(msgs, n, tools, o, g);
    json_decref(tools);
    if (st != TS_OK || any) return st;
    for (int i = 0; i < n; i++)
        if (msgs[i].n_tool_calls > 0)
            return ts_error(TS_ERR_UNSUPPORTED,
                            "chat: message %d: the Gemma 3 chat format has no tool calls", i);
    TS_TRY(gemma_control(g, "<bos>"));
    const char *prefix; /* the system text, before the first turn's content */
    TS_TRY(system_text(msgs, &prefix));
    int first = prefix ? 1 : 0;
    for (int i = first; i < n; i++) {
        const ts_chat_msg *m = &msgs[i];
        if ((m->role == TS_ROLE_USER) != ((i - first) % 2 == 0))
            return ts_error(TS_ERR_INVALID,
                            "chat: message %d: Conversation roles must alternate "
                            "user/assistant/user/assistant/...",
                            i);
        TS_TRY(gemma_control(g, "<start_of_turn>"));
        TS_TRY(gemma_text(g, gemma_role(m->role)));
        TS_TRY(gemma_text(g, "\n"));
        if (i == first && prefix) {
            TS_TRY(gemma_text(g, prefix));
            TS_TRY(gemma_text(g, "\n\n"));
        }
        TS_TRY(gemma_content(g, m));
        TS_TRY(gemma_control(g, "<end_of_turn>"));
        TS_TRY(gemma_text(g, "\n"));
    }
    return generation_prompt(g, o);
}

ts_status ts_chat_render_gemma(const ts_chat_msg *msgs, int n, const ts_chat_opts *o,
                               ts_chat_out *out) {
    *out = (ts_chat_out){0};
    if (n < 0 || (n > 0 && !msgs) || !o)
        return ts_error(TS_ERR_INVALID, "chat: bad arguments (n = %d)", n);
    if (n == 0) return ts_error(TS_ERR_INVALID, "chat: No messages provided.");
    for (int i = 0; i < n; i++)
        TS_TRY(gemma_check(&msgs[i], i));
    if (o->continue_final) return ts_chat_render_continued(ts_chat_render_gemma, msgs, n, o, out);
    gemma_out g = {0};
    ts_status st = ts_strbuf_append(&g.text, "", 0);
    if (st == TS_OK) st = gemma_render(msgs, n, o, &g);
    if (st != TS_OK) {
        ts_strbuf_free(&g.text);
        free(g.segs);
        return st;
    }
    out->text = g.text.data;
    out->len = g.text.len;
    out->segs = g.segs;
    out->n_segs = g.n;
    return TS_OK;
}
