/* Qwen3.5 chat format: renders a conversation exactly as the model's Jinja chat template does
 * (transformers' apply_chat_template with tokenize=False), but as a list of segments instead of
 * one string.
 *
 * A CONTROL segment is one added token written by the template itself (`<|im_start|>`,
 * `<think>`, `<tool_call>`, `<|image_pad|>`, ...); everything else is TEXT, and everything that
 * comes from the caller (message content, reasoning, tool names, arguments, tool schemas) is
 * always TEXT, even when it spells an added token. The tokenizer later maps CONTROL segments to
 * their special ids and encodes TEXT with added-token matching off, so a user typing
 * "<|im_start|>system" cannot open a turn (prompt injection). Concatenating all segments gives
 * exactly the string apply_chat_template returns. */
#ifndef TS_TEXT_CHAT_H
#define TS_TEXT_CHAT_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>

typedef enum { TS_ROLE_SYSTEM, TS_ROLE_USER, TS_ROLE_ASSISTANT, TS_ROLE_TOOL } ts_chat_role;
typedef enum { TS_PART_TEXT, TS_PART_IMAGE, TS_PART_VIDEO } ts_chat_part_kind;

typedef struct {
    ts_chat_part_kind kind;
    const char *text; /* TS_PART_TEXT only (must be non-NULL); ignored for media */
} ts_chat_part;

typedef struct {
    const char *name;           /* required */
    const char *arguments_json; /* a JSON object (key order is kept), or NULL for no parameters */
} ts_chat_tool_call;

typedef struct {
    ts_chat_role role;
    const char *content;       /* plain string content, or NULL when parts are used */
    const ts_chat_part *parts; /* used when content is NULL; NULL/0 = no content */
    int n_parts;
    /* assistant only; NULL = absent, and then an inline "<think>...</think>" in the content
     * is taken as the reasoning (the template's rule) */
    const char *reasoning_content;
    const ts_chat_tool_call *tool_calls; /* assistant only */
    int n_tool_calls;
} ts_chat_msg;

typedef struct {
    bool add_generation_prompt;
    int enable_thinking;    /* -1 = template default, 0 = off, 1 = on */
    bool thinking_default;  /* the per-size default: false for 0.8B/2B, true for >= 4B */
    bool add_vision_id;     /* prefix media with "Picture N: " / "Video N: " (template variable) */
    const char *tools_json; /* JSON array of tool schemas (objects), or NULL; "[]" = no tools */
    /* transformers' continue_final_message: the final message is left open for the answer to
     * continue (chat_continue.c); needs add_generation_prompt false */
    bool continue_final;
} ts_chat_opts;

typedef enum { TS_CHAT_SEG_TEXT, TS_CHAT_SEG_CONTROL } ts_chat_seg_kind;

/* A byte range of ts_chat_out.text. A CONTROL segment is exactly one added token; TEXT
 * segments are never empty and never adjacent to each other (neighbours are merged). */
typedef struct {
    ts_chat_seg_kind kind;
    size_t off;
    size_t len;
} ts_chat_seg;

typedef struct {
    char *text;        /* all segments concatenated, NUL-terminated; owned */
    size_t len;        /* bytes in text, without the NUL */
    ts_chat_seg *segs; /* owned */
    int n_segs;
} ts_chat_out;

/* Defaults: add_generation_prompt = true, enable_thinking = -1, thinking_default = false,
 * add_vision_id = false, tools_json = NULL. */
void ts_chat_opts_default(ts_chat_opts *o);

/* Renders msgs[0..n) into *out, which the caller frees with ts_chat_out_free. All input strings
 * must be valid UTF-8. Conversations the template itself rejects (no messages, system message
 * not first, no user query, media in the system message) and malformed input (bad role, bad
 * JSON, invalid UTF-8) return TS_ERR_INVALID with a message naming the message index; *out is
 * then empty (safe to free). Inputs are only borrowed during the call. */
ts_status ts_chat_render(const ts_chat_msg *msgs, int n, const ts_chat_opts *o, ts_chat_out *out);

/* The rendered string, identical to apply_chat_template(..., tokenize=False). Borrowed from
 * out: valid until ts_chat_out_free. len may be NULL. */
const char *ts_chat_flatten(const ts_chat_out *out, size_t *len);

void ts_chat_out_free(ts_chat_out *out);

/* Gemma 3 chat format (chat_gemma.c): `<bos>`, turns `<start_of_turn>{user|model}\n{content
 * trimmed}<end_of_turn>\n`, a first system message folded into the first user turn as
 * "{system}\n\n{user}", roles alternating (TS_ERR_INVALID otherwise, as the template raises),
 * generation prompt `<start_of_turn>model\n`. CONTROL segments: `<bos>`, `<start_of_turn>`,
 * `<end_of_turn>`, `<start_of_image>`. Only add_generation_prompt and continue_final are read
 * from o. */
ts_status ts_chat_render_gemma(const ts_chat_msg *msgs, int n, const ts_chat_opts *o,
                               ts_chat_out *out);

/* Narrows [*b, *e) of str by Python whitespace on both ends (str.strip()); bytes that are not
 * valid UTF-8 (and the renderer's markers) are not whitespace. */
void ts_chat_py_strip(const char *str, size_t *b, size_t *e);
/* The last occurrence of pat in s[b, e), or (size_t)-1. */
size_t ts_chat_rfind(const char *s, size_t b, size_t e, const char *pat);

/* A renderer (ts_chat_render, ts_chat_render_gemma) with opts->continue_final set: renders as
 * transformers' apply_chat_template(continue_final_message=True) does - the final message's
 * content (its last text part) gets a tag appended, the conversation is rendered without a
 * generation prompt, and the output is cut where the tag's last occurrence starts (where the
 * template trimmed the tag's trailing space, trailing whitespace before it goes too). Errors
 * as transformers': a generation prompt asked for too, no content to continue, the final
 * message's text not found as given in the rendering (the template changed it). */
typedef ts_status (*ts_chat_render_fn)(const ts_chat_msg *msgs, int n, const ts_chat_opts *o,
                                       ts_chat_out *out);
ts_status ts_chat_render_continued(ts_chat_render_fn render, const ts_chat_msg *msgs, int n,
                                   const ts_chat_opts *o, ts_chat_out *out);

#endif
