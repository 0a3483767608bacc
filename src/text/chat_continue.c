/* continue_final_message: the final message left open, the way transformers' apply_chat_template
 * does it (render_jinja_template): a tag appended to the final message's text marks where the
 * text ends in the rendering, whatever the template wrapped around it, and the rendering is cut
 * there. Doing the same here, rather than leaving out a format's end of turn, keeps the result
 * identical to transformers' for any template rule applied to the text (trimming, the split of
 * inline reasoning) and for any role of the final message. */
#include "text/chat.h"

#include <stdlib.h>
#include <string.h>

/* transformers' continue_final_message_tag, spelled the same: its trailing space tells whether
 * the template trimmed the text. */
#define TAG_WORD "CONTINUE_FINAL_MESSAGE_TAG"
static const char TAG[] = TAG_WORD " ";

/* Cuts out at byte `at`: the text ends there, the segments after it go and the one across it
 * is shortened. */
static void cut(ts_chat_out *out, size_t at) {
    int n = 0;
    while (n < out->n_segs && out->segs[n].off < at)
        n++;
    if (n > 0 && out->segs[n - 1].off + out->segs[n - 1].len > at)
        out->segs[n - 1].len = at - out->segs[n - 1].off;
    out->n_segs = n;
    out->len = at;
    out->text[at] = 0;
}

ts_status ts_chat_render_continued(ts_chat_render_fn render, const ts_chat_msg *msgs, int n,
                                   const ts_chat_opts *o, ts_chat_out *out) {
    *out = (ts_chat_out){0};
    if (o->add_generation_prompt)
        return ts_error(TS_ERR_INVALID, "chat: continue_final_message and add_generation_prompt "
                                        "are not compatible: the one continues the final "
                                        "message, the other starts a new assistant message");
    if (n < 1 || !msgs) return ts_error(TS_ERR_INVALID, "chat: No messages provided.");
    const ts_chat_msg *last = &msgs[n - 1];
    int part = -1; /* the text part that gets the tag, when the content is a list */
    for (int k = last->content ? -1 : last->n_parts - 1; k >= 0 && part < 0; k--)
        if (last->parts[k].kind == TS_PART_TEXT && last->parts[k].text) part = k;
    if (!last->content && part < 0)
        return ts_error(TS_ERR_INVALID, "chat: continue_final_message is set but the final "
                                        "message has no text to continue");
    const char *text = last->content ? last->content : last->parts[part].text;
    size_t tlen = strlen(text);
    ts_chat_msg *m = malloc((size_t)n * sizeof *m);
    char *tagged = malloc(tlen + sizeof TAG);
    ts_chat_part *parts = part >= 0 ? malloc((size_t)last->n_parts * sizeof *parts) : NULL;
    ts_status st =
        m && tagged && (part < 0 || parts) ? TS_OK : ts_error(TS_ERR_NOMEM, "out of memory");
    if (st == TS_OK) {
        memcpy(m, msgs, (size_t)n * sizeof *m);
        memcpy(tagged, text, tlen);
        memcpy(tagged + tlen, TAG, sizeof TAG);
        if (part >= 0) {
            memcpy(parts, last->parts, (size_t)last->n_parts * sizeof *parts);
            parts[part].text = tagged;
            m[n - 1].parts = parts;
        } else {
            m[n - 1].content = tagged;
        }
        ts_chat_opts plain = *o;
        plain.continue_final = false;
        st = render(m, n, &plain, out);
    }
    if (st == TS_OK) {
        size_t b = 0, e = tlen;
        ts_chat_py_strip(text, &b, &e);
        size_t at = ts_chat_rfind(out->text, 0, out->len, TAG_WORD);
        bool found =
            at != (size_t)-1 && (e == b || memmem(out->text, out->len, text + b, e - b) != NULL);
        if (!found) {
            st = ts_error(TS_ERR_INVALID, "chat: continue_final_message is set but the final "
                                          "message does not appear in the chat after applying "
                                          "the chat template (the template changed it)");
        } else {
            if (at + sizeof TAG - 1 > out->len || out->text[at + sizeof TAG - 2] != ' ') {
                size_t lead = 0; /* the template trimmed it: str.rstrip() before the tag */
                ts_chat_py_strip(out->text, &lead, &at);
                if (lead == at) at = 0;
            }
            cut(out, at);
        }
    }
    if (st != TS_OK) ts_chat_out_free(out);
    free(m);
    free(tagged);
    free(parts);
    return st;
}
