#include "serve/textout.h"

#include "base/status.h"

#include <string.h>

void serve_textout_init(serve_textout *t, int32_t think_open, int32_t think_close, bool in_think,
                        char *const *stops, int n_stops, serve_text_sink sink, void *ctx) {
    memset(t, 0, sizeof *t);
    t->think_open = think_open;
    t->think_close = think_close;
    t->ch = in_think ? SERVE_CH_REASONING : SERVE_CH_CONTENT;
    t->strip_lead = in_think;
    serve_stop_init(&t->stop, stops, n_stops);
    t->sink = sink;
    t->sink_ctx = ctx;
}

void serve_textout_free(serve_textout *t) {
    serve_stop_free(&t->stop);
    serve_toolcall_filter_free(&t->tc);
    ts_strbuf_free(&t->dec);
}

static ts_status tool_sink(void *ctx, bool call, const char *s, size_t n) {
    serve_textout *t = ctx;
    return t->sink(t->sink_ctx, call ? SERVE_CH_TOOL : SERVE_CH_CONTENT, s, n);
}

void serve_textout_enable_tools(serve_textout *t, bool list_form) {
    t->tools = true;
    serve_toolcall_filter_init(&t->tc, list_form, tool_sink, t);
}

static ts_status write_channel(serve_textout *t, const char *s, size_t n) {
    if (t->strip_lead && !t->started)
        while (n && *s == '\n') s++, n--;
    if (!n) return TS_OK;
    if (t->ch == SERVE_CH_CONTENT) {
        t->started = true;
        if (t->tools) return serve_toolcall_filter_push(&t->tc, s, n);
        return t->sink(t->sink_ctx, t->ch, s, n);
    }
    /* reasoning: newlines at the end wait until more text shows they are inside */
    size_t body = n;
    while (body && s[body - 1] == '\n') body--;
    if (body) {
        static const char nl[16] = "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n";
        for (size_t k = t->pending_nl; k;) {
            size_t c = k < sizeof nl ? k : sizeof nl;
            TS_TRY(t->sink(t->sink_ctx, t->ch, nl, c));
            k -= c;
        }
        t->pending_nl = 0;
        t->started = true;
        TS_TRY(t->sink(t->sink_ctx, t->ch, s, body));
    }
    t->pending_nl += n - body;
    return TS_OK;
}

static ts_status release_held(serve_textout *t) {
    t->dec.len = 0;
    TS_TRY(serve_stop_flush(&t->stop, &t->dec));
    TS_TRY(write_channel(t, t->dec.data, t->dec.len));
    /* a call still open when the content ends (or thinking reopens) is content after all */
    return t->tools && t->ch == SERVE_CH_CONTENT ? serve_toolcall_filter_finish(&t->tc) : TS_OK;
}

static void switch_channel(serve_textout *t, serve_channel ch) {
    t->ch = ch;
    t->started = false;
    t->strip_lead = true;
    t->pending_nl = 0; /* trailing newlines of the reasoning are dropped */
}

ts_status serve_textout_token(serve_textout *t, int32_t id, const char *text, size_t len,
                              bool *stopped) {
    *stopped = false;
    if (id >= 0 && (id == t->think_open || id == t->think_close)) {
        TS_TRY(release_held(t));
        switch_channel(t, id == t->think_open ? SERVE_CH_REASONING : SERVE_CH_CONTENT);
        return TS_OK;
    }
    if (!len) return TS_OK;
    t->dec.len = 0;
    ts_status st;
    *stopped = serve_stop_push(&t->stop, text, len, &t->dec, &st);
    TS_TRY(st);
    return write_channel(t, t->dec.data, t->dec.len);
}

ts_status serve_textout_finish(serve_textout *t) { return release_held(t); }

void serve_textout_keep_stops(serve_textout *t) { t->stop.keep = true; }

void serve_textout_start_stops(serve_textout *t, char *const *stops, int n_stops) {
    bool keep = t->stop.keep;
    serve_stop_free(&t->stop); /* without stops it held nothing back */
    serve_stop_init(&t->stop, stops, n_stops);
    t->stop.keep = keep;
}
