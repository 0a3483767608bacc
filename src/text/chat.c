/* Qwen3.5 chat template, transcribed from the Jinja source (Qwen3.5-4B tokenizer_config) and
 * checked against transformers' apply_chat_template by tests/unit/test_chat.c.
 *
 * While rendering, the template's control tokens are kept in the working string as two-byte
 * markers (0xFF, 0x80 + index into chat_added). Bytes 0xFF never occur in valid UTF-8 and every
 * caller string is validated first, so a marker can only come from the template, never from a
 * user. The template applies string operations (trim, split on "</think>", startswith) to
 * content that already holds media tokens; the markers behave like the token text does under
 * each of those operations (neither is whitespace or '\n', and no searched pattern can overlap
 * either), so the operations run on the marked string and the result is exact. chat_finish
 * expands the markers into CONTROL segments at the end. */
#include "text/chat.h"

#include "text/chat_json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The Qwen3.5 tokenizer's added tokens (ids 248044..248076, in id order). */
/* clang-format off */
static const char *const chat_added[] = {
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
};
/* clang-format on */
#define CHAT_N_ADDED ((int)(sizeof chat_added / sizeof chat_added[0]))
#define CHAT_MARK    0xFFu

/* The tool-use instructions of the system turn, verbatim from the template (Qwen team,
 * Apache-2.0): the model was trained on this exact text. */
static const char chat_tools_head[] =
    "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>";
static const char chat_tools_tail[] =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n"
    "value_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second "
    "parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- "
    "Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is "
    "no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n</IMPORTANT>";

typedef struct {
    const ts_chat_opts *o;
    int n_images, n_videos; /* the template's image_count / video_count namespaces */
    chat_buf out;           /* the rendering so far, control tokens as markers */
    chat_buf content;       /* scratch: the current message's rendered content */
} chat_ctx;

/* ---- strings ---------------------------------------------------------------------------- */

static int utf8_valid(const char *str) {
    const unsigned char *s = (const unsigned char *)str;
    while (*s) {
        unsigned c = *s;
        int n;
        unsigned cp, min;
        if (c < 0x80) {
            s++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            n = 1, cp = c & 0x1F, min = 0x80;
        } else if (c >= 0xE0 && c <= 0xEF) {
            n = 2, cp = c & 0x0F, min = 0x800;
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return 0;
        }
        for (int i = 1; i <= n; i++) {
            if ((s[i] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i] & 0x3Fu);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        s += n + 1;
    }
    return 1;
}

/* Python's str.isspace() (Jinja's trim is str.strip()). */
static bool py_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* The byte length of the character at s (avail bytes readable) when it is Python whitespace,
 * else 0. Markers and stray bytes are not spaces. */
static size_t space_at(const unsigned char *s, size_t avail) {
    unsigned c = s[0], cp;
    size_t n;
    if (c < 0x80) return py_space(c) ? 1 : 0;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF)
        n = 3, cp = c & 0x0F;
    else
        return 0; /* 4-byte characters are never whitespace; 0xFF is a marker */
    if (n > avail) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3Fu);
    }
    return py_space(cp) ? n : 0;
}

void ts_chat_py_strip(const char *str, size_t *b, size_t *e) {
    const unsigned char *s = (const unsigned char *)str;
    size_t k;
    while (*b < *e && (k = space_at(s + *b, *e - *b)) > 0)
        *b += k;
    while (*e > *b) {
        size_t j = *e - 1, back = 0;
        while (j > *b && (s[j] & 0xC0) == 0x80 && back < 3)
            j--, back++;
        k = space_at(s + j, *e - j);
        if (k == 0 || j + k != *e) break;
        *e = j;
    }
}

size_t ts_chat_rfind(const char *s, size_t b, size_t e, const char *pat) {
    size_t m = strlen(pat);
    for (size_t i = e; i >= b + m; i--)
        if (memcmp(s + i - m, pat, m) == 0) return i - m;
    return (size_t)-1;
}

static size_t find(const char *s, size_t b, size_t e, const char *pat) {
    size_t m = strlen(pat);
    for (size_t i = b; i + m <= e; i++)
        if (memcmp(s + i, pat, m) == 0) return i;
    return (size_t)-1;
}

/* ---- emitting --------------------------------------------------------------------------- */

/* Template literal text: added tokens in it become control markers, the rest stays text. */
static ts_status put_lit(chat_buf *b, const char *s) {
    size_t run = 0, n = strlen(s);
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '<') continue;
        int best = -1;
        size_t best_len = 0;
        for (int k = 0; k < CHAT_N_ADDED; k++) {
            size_t m = strlen(chat_added[k]);
            if (m > best_len && i + m <= n && memcmp(s + i, chat_added[k], m) == 0)
                best = k, best_len = m;
        }
        if (best < 0) continue;
        char mark[2] = {(char)CHAT_MARK, (char)(0x80 + best)};
        TS_TRY(chat_buf_put(b, s + run, i - run));
        TS_TRY(chat_buf_put(b, mark, 2));
        i += best_len - 1;
        run = i + 1;
    }
    return chat_buf_put(b, s + run, n - run);
}

/* render_content(content, do_vision_count, is_system_content) into cx->content. */
static ts_status render_content(chat_ctx *cx, const ts_chat_msg *m, int idx, int do_count,
                                int is_system) {
    chat_buf *d = &cx->content;
    d->len = 0;
    TS_TRY(chat_buf_put(d, "", 0));
    if (m->content) return chat_buf_puts(d, m->content);
    for (int i = 0; i < m->n_parts; i++) {
        const ts_chat_part *p = &m->parts[i];
        if (p->kind == TS_PART_TEXT) {
            TS_TRY(chat_buf_puts(d, p->text));
            continue;
        }
        int image = p->kind == TS_PART_IMAGE;
        if (is_system)
            return ts_error(TS_ERR_INVALID, "chat: message %d: System message cannot contain %s.",
                            idx, image ? "images" : "videos");
        int *count = image ? &cx->n_images : &cx->n_videos;
        if (do_count) ++*count;
        if (cx->o->add_vision_id) {
            char id[48];
            snprintf(id, sizeof id, "%s %d: ", image ? "Picture" : "Video", *count);
            TS_TRY(chat_buf_puts(d, id));
        }
        TS_TRY(put_lit(d, image ? "<|vision_start|><|image_pad|><|vision_end|>"
                                : "<|vision_start|><|video_pad|><|vision_end|>"));
    }
    return TS_OK;
}

static ts_status put_tool_call(chat_ctx *cx, const ts_chat_tool_call *tc, int idx, int j, int first,
                               int content_nonempty) {
    chat_buf *b = &cx->out;
    if (!first)
        TS_TRY(put_lit(b, "\n<tool_call>\n<function="));
    else if (content_nonempty)
        TS_TRY(put_lit(b, "\n\n<tool_call>\n<function="));
    else
        TS_TRY(put_lit(b, "<tool_call>\n<function="));
    TS_TRY(chat_buf_puts(b, tc->name));
    TS_TRY(put_lit(b, ">\n"));
    if (tc->arguments_json) {
        json_error_t err;
        json_t *args = json_loads(tc->arguments_json, 0, &err);
        if (!args)
            return ts_error(TS_ERR_INVALID,
                            "chat: message %d: tool call %d: arguments: %s (line %d, column %d)",
                            idx, j, err.text, err.line, err.column);
        ts_status st = TS_OK;
        if (!json_is_object(args))
            st = ts_error(TS_ERR_INVALID,
                          "chat: message %d: tool call %d: arguments must be a "
                          "JSON object",
                          idx, j);
        const char *key;
        json_t *val;
        json_object_foreach(args, key, val) {
            if (st != TS_OK) break;
            if ((st = put_lit(b, "<parameter=")) != TS_OK) break;
            if ((st = chat_buf_puts(b, key)) != TS_OK) break;
            if ((st = put_lit(b, ">\n")) != TS_OK) break;
            if ((st = chat_json_str(val, b)) != TS_OK) break;
            st = put_lit(b, "\n</parameter>\n");
        }
        json_decref(args);
        TS_TRY(st);
    }
    return put_lit(b, "</function>\n</tool_call>");
}

static ts_status put_assistant(chat_ctx *cx, const ts_chat_msg *m, int idx, int after_query) {
    chat_buf *b = &cx->out;
    const char *c = cx->content.p;
    size_t cb = 0, ce = cx->content.len;
    ts_chat_py_strip(c, &cb, &ce);
    const char *r = "";
    size_t rb = 0, re = 0;
    if (m->reasoning_content) {
        r = m->reasoning_content;
        re = strlen(r);
    } else if (find(c, cb, ce, "</think>") != (size_t)-1) {
        /* reasoning: before the first </think>, after the last <think> before it (the
         * template also strips '\n' around it, which the trim below subsumes); content: after
         * the last </think>, '\n' stripped in front */
        r = c;
        rb = cb;
        re = find(c, cb, ce, "</think>");
        size_t open = ts_chat_rfind(r, rb, re, "<think>");
        if (open != (size_t)-1) rb = open + strlen("<think>");
        cb = ts_chat_rfind(c, cb, ce, "</think>") + strlen("</think>");
        while (cb < ce && c[cb] == '\n')
            cb++;
    }
    ts_chat_py_strip(r, &rb, &re);

    if (after_query) {
        TS_TRY(put_lit(b, "<|im_start|>assistant\n<think>\n"));
        TS_TRY(chat_buf_put(b, r + rb, re - rb));
        TS_TRY(put_lit(b, "\n</think>\n\n"));
    } else {
        TS_TRY(put_lit(b, "<|im_start|>assistant\n"));
    }
    TS_TRY(chat_buf_put(b, c + cb, ce - cb));
    /* the template tests `content|trim`; c[cb, ce) is a suffix of a trimmed string, so it is
     * non-blank exactly when it is non-empty */
    for (int j = 0; j < m->n_tool_calls; j++)
        TS_TRY(put_tool_call(cx, &m->tool_calls[j], idx, j, j == 0, ce > cb));
    return put_lit(b, "<|im_end|>\n");
}

/* ---- validation ------------------------------------------------------------------------- */

static ts_status check_str(const char *s, int idx, const char *what) {
    if (!utf8_valid(s))
        return ts_error(TS_ERR_INVALID, "chat: message %d: %s is not valid UTF-8", idx, what);
    return TS_OK;
}

static ts_status check_msg(const ts_chat_msg *m, int idx) {
    if ((unsigned)m->role > TS_ROLE_TOOL)
        return ts_error(TS_ERR_INVALID, "chat: message %d: unexpected message role %d", idx,
                        (int)m->role);
    if (m->content)
        TS_TRY(check_str(m->content, idx, "content"));
    else if (m->n_parts < 0 || (m->n_parts > 0 && !m->parts))
        return ts_error(TS_ERR_INVALID, "chat: message %d: bad content part list", idx);
    for (int i = 0; !m->content && i < m->n_parts; i++) {
        const ts_chat_part *p = &m->parts[i];
        if ((unsigned)p->kind > TS_PART_VIDEO)
            return ts_error(TS_ERR_INVALID, "chat: message %d: part %d: unexpected item type", idx,
                            i);
        if (p->kind != TS_PART_TEXT) continue;
        if (!p->text)
            return ts_error(TS_ERR_INVALID, "chat: message %d: part %d: text part without text",
                            idx, i);
        TS_TRY(check_str(p->text, idx, "a text part"));
    }
    if (m->role != TS_ROLE_ASSISTANT) return TS_OK;
    if (m->reasoning_content) TS_TRY(check_str(m->reasoning_content, idx, "reasoning_content"));
    if (m->n_tool_calls < 0 || (m->n_tool_calls > 0 && !m->tool_calls))
        return ts_error(TS_ERR_INVALID, "chat: message %d: bad tool call list", idx);
    for (int j = 0; j < m->n_tool_calls; j++) {
        if (!m->tool_calls[j].name)
            return ts_error(TS_ERR_INVALID, "chat: message %d: tool call %d has no name", idx, j);
        TS_TRY(check_str(m->tool_calls[j].name, idx, "a tool call name"));
    }
    return TS_OK;
}

/* ---- rendering -------------------------------------------------------------------------- */

static ts_status put_system(chat_ctx *cx, const ts_chat_msg *msgs, const json_t *tools) {
    chat_buf *b = &cx->out;
    int has_system = msgs[0].role == TS_ROLE_SYSTEM;
    size_t cb = 0, ce = 0;
    if (has_system) {
        TS_TRY(render_content(cx, &msgs[0], 0, 0, 1));
        ce = cx->content.len;
        ts_chat_py_strip(cx->content.p, &cb, &ce);
    }
    if (tools && json_array_size(tools) > 0) {
        TS_TRY(put_lit(b, chat_tools_head));
        for (size_t i = 0; i < json_array_size(tools); i++) {
            TS_TRY(put_lit(b, "\n"));
            TS_TRY(chat_json_dumps(json_array_get(tools, i), b));
        }
        TS_TRY(put_lit(b, chat_tools_tail));
        if (ce > cb) {
            TS_TRY(put_lit(b, "\n\n"));
            TS_TRY(chat_buf_put(b, cx->content.p + cb, ce - cb));
        }
        return put_lit(b, "<|im_end|>\n");
    }
    if (!has_system) return TS_OK;
    TS_TRY(put_lit(b, "<|im_start|>system\n"));
    TS_TRY(chat_buf_put(b, cx->content.p + cb, ce - cb));
    return put_lit(b, "<|im_end|>\n");
}

/* The index of the last user message that is a real query, not tool output the client sent
 * back as a user turn ("<tool_response>...</tool_response>"); assistant turns after it are
 * the current agentic loop and keep their reasoning. -1 when there is none. */
static ts_status last_query(chat_ctx *cx, const ts_chat_msg *msgs, int n, int *out) {
    static const char open[] = "<tool_response>", close[] = "</tool_response>";
    *out = -1;
    for (int i = n - 1; i >= 0; i--) {
        if (msgs[i].role != TS_ROLE_USER) continue;
        TS_TRY(render_content(cx, &msgs[i], i, 0, 0));
        size_t b = 0, e = cx->content.len;
        const char *s = cx->content.p;
        ts_chat_py_strip(s, &b, &e);
        int wrapped = e - b >= sizeof open - 1 && memcmp(s + b, open, sizeof open - 1) == 0 &&
                      e - b >= sizeof close - 1 &&
                      memcmp(s + e - (sizeof close - 1), close, sizeof close - 1) == 0;
        if (!wrapped) {
            *out = i;
            return TS_OK;
        }
    }
    return TS_OK;
}

static ts_status put_messages(chat_ctx *cx, const ts_chat_msg *msgs, int n, int lq) {
    chat_buf *b = &cx->out;
    for (int i = 0; i < n; i++) {
        const ts_chat_msg *m = &msgs[i];
        TS_TRY(render_content(cx, m, i, 1, 0));
        size_t cb = 0, ce = cx->content.len;
        ts_chat_py_strip(cx->content.p, &cb, &ce);
        switch (m->role) {
        case TS_ROLE_SYSTEM:
            if (i != 0)
                return ts_error(TS_ERR_INVALID,
                                "chat: message %d: System message must be at the beginning.", i);
            break;
        case TS_ROLE_USER:
            TS_TRY(put_lit(b, "<|im_start|>user\n"));
            TS_TRY(chat_buf_put(b, cx->content.p + cb, ce - cb));
            TS_TRY(put_lit(b, "<|im_end|>\n"));
            break;
        case TS_ROLE_ASSISTANT: TS_TRY(put_assistant(cx, m, i, i > lq)); break;
        case TS_ROLE_TOOL:
            /* consecutive tool results share one user turn; a leading one opens none */
            if (i > 0 && msgs[i - 1].role != TS_ROLE_TOOL) TS_TRY(put_lit(b, "<|im_start|>user"));
            TS_TRY(put_lit(b, "\n<tool_response>\n"));
            TS_TRY(chat_buf_put(b, cx->content.p + cb, ce - cb));
            TS_TRY(put_lit(b, "\n</tool_response>"));
            if (i == n - 1 || msgs[i + 1].role != TS_ROLE_TOOL) TS_TRY(put_lit(b, "<|im_end|>\n"));
            break;
        }
    }
    if (!cx->o->add_generation_prompt) return TS_OK;
    int think =
        cx->o->enable_thinking == 1 || (cx->o->enable_thinking == -1 && cx->o->thinking_default);
    TS_TRY(put_lit(b, "<|im_start|>assistant\n"));
    return put_lit(b, think ? "<think>\n" : "<think>\n\n</think>\n\n");
}

static ts_status seg_push(ts_chat_out *out, int *cap, ts_chat_seg_kind kind, size_t off,
                          size_t len) {
    if (out->n_segs == *cap) {
        int ncap = *cap ? *cap * 2 : 64;
        ts_chat_seg *s = realloc(out->segs, (size_t)ncap * sizeof *s);
        if (!s) return ts_error(TS_ERR_NOMEM, "chat: out of memory (%d segments)", ncap);
        out->segs = s;
        *cap = ncap;
    }
    out->segs[out->n_segs++] = (ts_chat_seg){kind, off, len};
    return TS_OK;
}

/* Expands the markers of r into out's text and segments. */
static ts_status chat_finish(const chat_buf *r, ts_chat_out *out) {
    chat_buf text = {0};
    int cap = 0;
    ts_status st = chat_buf_put(&text, "", 0);
    const unsigned char *p = (const unsigned char *)r->p;
    size_t i = 0;
    while (st == TS_OK && i < r->len) {
        size_t off = text.len;
        if (p[i] == CHAT_MARK) {
            const char *tok = chat_added[p[i + 1] - 0x80];
            st = chat_buf_puts(&text, tok);
            if (st == TS_OK) st = seg_push(out, &cap, TS_CHAT_SEG_CONTROL, off, strlen(tok));
            i += 2;
        } else {
            size_t j = i;
            while (j < r->len && p[j] != CHAT_MARK)
                j++;
            st = chat_buf_put(&text, r->p + i, j - i);
            if (st == TS_OK) st = seg_push(out, &cap, TS_CHAT_SEG_TEXT, off, j - i);
            i = j;
        }
    }
    out->text = text.p;
    out->len = text.len;
    return st;
}

void ts_chat_opts_default(ts_chat_opts *o) {
    *o = (ts_chat_opts){.add_generation_prompt = true, .enable_thinking = -1};
}

ts_status ts_chat_render(const ts_chat_msg *msgs, int n, const ts_chat_opts *o, ts_chat_out *out) {
    *out = (ts_chat_out){0};
    if (n < 0 || (n > 0 && !msgs) || !o)
        return ts_error(TS_ERR_INVALID, "chat: bad arguments (n = %d)", n);
    if (o->continue_final) return ts_chat_render_continued(ts_chat_render, msgs, n, o, out);
    if (o->enable_thinking < -1 || o->enable_thinking > 1)
        return ts_error(TS_ERR_INVALID, "chat: enable_thinking must be -1, 0 or 1, not %d",
                        o->enable_thinking);
    for (int i = 0; i < n; i++)
        TS_TRY(check_msg(&msgs[i], i));
    if (n == 0) return ts_error(TS_ERR_INVALID, "chat: No messages provided.");

    json_t *tools = NULL;
    if (o->tools_json) {
        json_error_t err;
        tools = json_loads(o->tools_json, 0, &err);
        if (!tools)
            return ts_error(TS_ERR_INVALID, "chat: tools: %s (line %d, column %d)", err.text,
                            err.line, err.column);
        int ok = json_is_array(tools);
        for (size_t i = 0; ok && i < json_array_size(tools); i++)
            ok = json_is_object(json_array_get(tools, i));
        if (!ok) {
            json_decref(tools);
            return ts_error(TS_ERR_INVALID, "chat: tools must be a JSON array of objects");
        }
    }

    chat_ctx cx = {.o = o};
    int lq = -1;
    ts_status st = put_system(&cx, msgs, tools);
    if (st == TS_OK) st = last_query(&cx, msgs, n, &lq);
    if (st == TS_OK && lq < 0)
        st = ts_error(TS_ERR_INVALID, "chat: No user query found in messages.");
    if (st == TS_OK) st = put_messages(&cx, msgs, n, lq);
    if (st == TS_OK) st = chat_finish(&cx.out, out);
    json_decref(tools);
    free(cx.out.p);
    free(cx.content.p);
    if (st != TS_OK) ts_chat_out_free(out);
    return st;
}

const char *ts_chat_flatten(const ts_chat_out *out, size_t *len) {
    if (len) *len = out->len;
    return out->text ? out->text : "";
}

void ts_chat_out_free(ts_chat_out *out) {
    free(out->text);
    free(out->segs);
    *out = (ts_chat_out){0};
}
