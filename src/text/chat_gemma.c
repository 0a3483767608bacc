/* Gemma 3 chat format: what the Jinja chat template of google/gemma-3-*-it renders, as segments
 * (see chat.h). Checked against jinja2 renderings of that template by tests/unit/test_chat_gemma.c.
 *
 * The template: `<bos>`; a first system message is not a turn, its text (untrimmed) + "\n\n" is
 * put before the first user turn's content; the remaining messages must start with a user
 * message and then alternate user / non-user (its exact test), each rendered as
 * `<start_of_turn>{role}\n{content trimmed}<end_of_turn>\n` with assistant named "model" and
 * other roles by their name; content parts: text trimmed, images as `<start_of_image>`, other
 * kinds nothing; then `<start_of_turn>model\n` when a generation prompt is wanted. Reasoning is
 * not part of the format and is left out, as the template leaves it out. Tools and an
 * assistant's tool calls are not part of it either; the template leaves them out too, but a
 * model that never saw them cannot call them, so here they are refused (TS_ERR_UNSUPPORTED)
 * rather than dropped without a word. */
#include "text/chat.h"
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

/* Whether tools_json lists any tool (NULL and "[]" none; anything else unread counts as some:
 * refused, not dropped). */
static bool has_tools(const char *tools_json) {
    if (!tools_json) return false;
    json_t *t = json_loads(tools_json, 0, NULL);
    bool none = json_is_array(t) && json_array_size(t) == 0;
    json_decref(t);
    return !none;
}

static ts_status gemma_render(const ts_chat_msg *msgs, int n, const ts_chat_opts *o, gemma_out *g) {
    if (has_tools(o->tools_json))
        return ts_error(TS_ERR_UNSUPPORTED, "the Gemma 3 chat format has no tools (its template "
                                            "leaves them out, so the model would never see them)");
    for (int i = 0; i < n; i++)
        if (msgs[i].n_tool_calls > 0)
            return ts_error(TS_ERR_UNSUPPORTED,
                            "chat: message %d: the Gemma 3 chat format has no tool calls", i);
    TS_TRY(gemma_control(g, "<bos>"));
    const char *prefix = NULL; /* the system text, before the first turn's content */
    int first = 0;
    if (msgs[0].role == TS_ROLE_SYSTEM) {
        const ts_chat_msg *s = &msgs[0];
        if (s->content)
            prefix = s->content;
        else if (s->n_parts > 0 && s->parts[0].kind == TS_PART_TEXT)
            prefix = s->parts[0].text;
        else
            return ts_error(TS_ERR_INVALID, "chat: message 0: a system message's first part "
                                            "must be text");
        first = 1;
    }
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
        if (m->content) {
            TS_TRY(gemma_trimmed(g, m->content));
        } else {
            for (int k = 0; k < m->n_parts; k++) {
                if (m->parts[k].kind == TS_PART_IMAGE)
                    TS_TRY(gemma_control(g, "<start_of_image>"));
                else if (m->parts[k].kind == TS_PART_TEXT)
                    TS_TRY(gemma_trimmed(g, m->parts[k].text));
                else /* the Gemma template drops a video; never silently */
                    return ts_error(TS_ERR_UNSUPPORTED, "videos in the Gemma chat format are not "
                                                        "supported");
            }
        }
        TS_TRY(gemma_control(g, "<end_of_turn>"));
        TS_TRY(gemma_text(g, "\n"));
    }
    if (o->add_generation_prompt) {
        TS_TRY(gemma_control(g, "<start_of_turn>"));
        TS_TRY(gemma_text(g, "model\n"));
    }
    return TS_OK;
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
