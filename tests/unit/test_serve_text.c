/* serve/: the stop-string matcher (across pieces, hold-back), the reasoning/content splitter,
 * the prefix-cache LRU, and the request validation of openai.c. */
#include <string.h>

#include "serve/openai.h"
#include "serve/prefix_cache.h"
#include "serve/textout.h"
#include "testutil.h"

/* ---- stop matcher ---- */

/* Feeds text in pieces of `step` bytes; returns what was shown and whether a stop hit. */
static bool run_stop(const char *text, size_t step, char *const *stops, int n, ts_strbuf *out,
                     int *pushes_after_stop) {
    serve_stop m;
    serve_stop_init(&m, stops, n);
    bool hit = false;
    *pushes_after_stop = 0;
    size_t len = strlen(text);
    for (size_t i = 0; i < len; i += step) {
        size_t k = len - i < step ? len - i : step;
        if (hit) {
            (*pushes_after_stop)++;
            break;
        }
        ts_status st;
        hit = serve_stop_push(&m, text + i, k, out, &st);
        CHECK(st == TS_OK);
    }
    if (!hit) serve_stop_flush(&m, out);
    serve_stop_free(&m);
    return hit;
}

static void test_stop(void) {
    char *stops[] = {"END", "xyz"};
    for (size_t step = 1; step <= 5; step++) {
        ts_strbuf out = {0};
        int after;
        bool hit = run_stop("hello wENorld END tail", step, stops, 2, &out, &after);
        CHECKF(hit, "step %zu", step);
        CHECKF(out.len == 14 && memcmp(out.data, "hello wENorld ", 14) == 0, "step %zu: '%.*s'",
               step, (int)out.len, out.data);
        ts_strbuf_free(&out);
        out = (ts_strbuf){0};
        hit = run_stop("no stop here, EN", step, stops, 2, &out, &after);
        CHECK(!hit);
        CHECKF(out.len == 16, "flush releases the held 'EN' (step %zu)", step);
        ts_strbuf_free(&out);
    }
    /* hold-back: a possible prefix is not shown until decided */
    serve_stop m;
    serve_stop_init(&m, stops, 2);
    ts_strbuf out = {0};
    ts_status st;
    CHECK(!serve_stop_push(&m, "abcE", 4, &out, &st));
    CHECK(out.len == 3);
    CHECK(!serve_stop_push(&m, "N", 1, &out, &st));
    CHECK(out.len == 3);
    CHECK(!serve_stop_push(&m, "x", 1, &out, &st)); /* "ENx" is no stop: "EN" released */
    CHECKF(out.len == 5 && memcmp(out.data, "abcEN", 5) == 0, "'%.*s'", (int)out.len, out.data);
    /* the earliest stop wins even if a later-listed one started first */
    CHECK(serve_stop_push(&m, "yzEND", 5, &out, &st));
    CHECKF(out.len == 5, "'x' was part of 'xyz': '%.*s'", (int)out.len, out.data);
    serve_stop_free(&m);
    ts_strbuf_free(&out);
    /* keep (include_stop_str_in_output): the stop that completes is shown, what follows it in
     * the same piece is not; the earliest wins as without it */
    out = (ts_strbuf){0};
    serve_stop_init(&m, stops, 2);
    m.keep = true;
    CHECK(!serve_stop_push(&m, "ab xy", 5, &out, &st));
    CHECK(serve_stop_push(&m, "zEND tail", 9, &out, &st));
    CHECKF(out.len == 6 && memcmp(out.data, "ab xyz", 6) == 0, "'%.*s'", (int)out.len, out.data);
    serve_stop_free(&m);
    ts_strbuf_free(&out);
}

/* ---- reasoning / content splitter ---- */

typedef struct {
    ts_strbuf ch[2];
    int switches;
    int last;
} capture;

static ts_status cap_sink(void *ctx, serve_channel ch, const char *s, size_t n) {
    capture *c = ctx;
    if (c->last != (int)ch) c->switches++;
    c->last = (int)ch;
    return ts_strbuf_append(&c->ch[ch], s, n);
}

enum { OPEN = 100, CLOSE = 101 };

static void feed(serve_textout *t, int32_t id, const char *s, bool *stopped) {
    CHECK(serve_textout_token(t, id, s, s ? strlen(s) : 0, stopped) == TS_OK);
}

static void test_split(void) {
    capture c = {{{0}}, 0, -1};
    serve_textout t;
    bool stop;
    serve_textout_init(&t, OPEN, CLOSE, true, NULL, 0, cap_sink, &c);
    feed(&t, 1, "\n", &stop);
    feed(&t, 2, "I think", &stop);
    feed(&t, 3, "\n\n", &stop);
    feed(&t, 4, "so.\n", &stop);
    feed(&t, CLOSE, "</think>", &stop);
    feed(&t, 5, "\n\n", &stop);
    feed(&t, 6, "Answer", &stop);
    feed(&t, 7, "\n", &stop);
    CHECK(serve_textout_finish(&t) == TS_OK);
    CHECKF(c.ch[1].len == 12 && memcmp(c.ch[1].data, "I think\n\nso.", 12) == 0,
           "reasoning '%.*s'", (int)c.ch[1].len, c.ch[1].data);
    CHECKF(c.ch[0].len == 7 && memcmp(c.ch[0].data, "Answer\n", 7) == 0, "content '%.*s'",
           (int)c.ch[0].len, c.ch[0].data);
    CHECK(c.switches == 2);
    serve_textout_free(&t);
    ts_strbuf_free(&c.ch[0]);
    ts_strbuf_free(&c.ch[1]);

    /* thinking off: all content, but a <think> the model writes opens reasoning; a stop string
     * is matched inside each channel */
    capture d = {{{0}}, 0, -1};
    char *stops[] = {"STOP"};
    serve_textout_init(&t, OPEN, CLOSE, false, stops, 1, cap_sink, &d);
    feed(&t, 1, "\nhi ST", &stop);
    feed(&t, OPEN, "<think>", &stop);
    feed(&t, 2, "why", &stop);
    feed(&t, CLOSE, NULL, &stop);
    feed(&t, 3, "ok ST", &stop);
    CHECK(!stop);
    feed(&t, 4, "OP more", &stop);
    CHECK(stop);
    CHECKF(d.ch[0].len == 9 && memcmp(d.ch[0].data, "\nhi STok ", 9) == 0, "content '%.*s'",
           (int)d.ch[0].len, d.ch[0].data);
    CHECK(d.ch[1].len == 3);
    serve_textout_free(&t);
    ts_strbuf_free(&d.ch[0]);
    ts_strbuf_free(&d.ch[1]);
}

/* ---- prefix cache ---- */

/* The drop callback's record: which ids were given back, in order. */
static int dropped[32], n_dropped;
static void record_drop(void *ctx, int id) {
    (void)ctx;
    if (n_dropped < 32) dropped[n_dropped++] = id;
}

static void test_cache(void) {
    serve_prefix_cache c;
    CHECK(serve_prefix_cache_init(&c, 2, 100, 4, 8, record_drop, NULL) == TS_OK);
    int32_t a[] = {1, 2, 3, 4, 5, 6}, b[] = {1, 2, 9, 9};
    int s1 = serve_prefix_cache_store(&c, 0, a, 3, NULL, 30);
    int s2 = serve_prefix_cache_store(&c, 0, a, 5, NULL, 50);
    CHECK(s1 == 0 && s2 == 1 && c.held == 80);
    CHECK(serve_prefix_cache_store(&c, 0, a, 5, NULL, 50) == -1); /* already held */
    const serve_snapshot *s = serve_prefix_cache_find(&c, 0, a, 6, 5);
    CHECK(s && s->len == 5);
    s = serve_prefix_cache_find(&c, 0, a, 6, 4);
    CHECK(s && s->len == 3);
    CHECK(serve_prefix_cache_find(&c, 0, b, 4, 3) == NULL);
    /* a prompt equal to a snapshot without logits: only a shorter one will do */
    s = serve_prefix_cache_find_prompt(&c, 0, a, 5);
    CHECK(s && s->len == 3 && !s->logits);
    /* ... and once that snapshot has the row (the same sequence stored again), the whole one */
    float row[4] = {0.5f, -1.0f, 2.0f, 3.5f};
    CHECK(serve_prefix_cache_store(&c, 0, a, 5, row, 50) == -1);
    s = serve_prefix_cache_find_prompt(&c, 0, a, 5);
    CHECK(s && s->len == 5 && s->logits && memcmp(s->logits, row, sizeof row) == 0);
    s = serve_prefix_cache_find_prompt(&c, 0, a, 6); /* a longer prompt: a proper prefix */
    CHECK(s && s->len == 5);
    /* LRU: a[0..5) was used last, so a[0..3) is evicted; the row goes with its entry */
    n_dropped = 0;
    int s3 = serve_prefix_cache_store(&c, 0, b, 2, NULL, 20);
    CHECK(s3 == s1 && n_dropped == 1 && dropped[0] == s1 && c.held == 70);
    s = serve_prefix_cache_find(&c, 0, a, 6, 6);
    CHECK(s && s->len == 5 && s->logits);
    s = serve_prefix_cache_find(&c, 0, b, 4, 4); /* now b[0..2) was used last */
    CHECK(s && s->len == 2);
    int s4 = serve_prefix_cache_store(&c, 0, b, 4, row, 40); /* evicts a[0..5) and its row */
    CHECK(s4 == s2 && c.n_rows == 1);
    s = serve_prefix_cache_find_prompt(&c, 0, a, 5); /* only b[0..2) = a[0..2) is left */
    CHECK(s && s->len == 2);
    s = serve_prefix_cache_find_prompt(&c, 0, b, 4);
    CHECK(s && s->len == 4 && s->logits && s->logits[3] == 3.5f);
    n_dropped = 0;
    serve_prefix_cache_drop(&c, s4);
    CHECK(n_dropped == 1 && dropped[0] == s4 && c.held == 20 && c.n_rows == 0);
    s = serve_prefix_cache_find_prompt(&c, 0, b, 4);
    CHECK(s && s->len == 2 && !s->logits);
    /* more bytes than the budget: nothing is made, nothing dropped */
    n_dropped = 0;
    CHECK(serve_prefix_cache_store(&c, 0, a, 6, NULL, 101) == -1 && n_dropped == 0);
    serve_prefix_cache_free(&c);
    CHECK(serve_prefix_cache_init(&c, 0, 100, 4, 8, NULL, NULL) == TS_OK);
    CHECK(serve_prefix_cache_store(&c, 0, a, 3, row, 1) == -1);
    CHECK(serve_prefix_cache_find_prompt(&c, 0, a, 3) == NULL);
    serve_prefix_cache_free(&c);
}

/* The budget is bytes, not entries: many small snapshots fit where few large ones do, and a
 * large one drops as many of the least recently used as it needs; logits rows are bounded on
 * their own, the oldest row going first. */
static void test_cache_budget(void) {
    serve_prefix_cache c;
    CHECK(serve_prefix_cache_init(&c, 16, 100, 1, 2, record_drop, NULL) == TS_OK);
    int32_t ids[16][2];
    float row = 1.0f;
    for (int i = 0; i < 10; i++) {
        ids[i][0] = i, ids[i][1] = 100 + i;
        CHECK(serve_prefix_cache_store(&c, 0, ids[i], 2, &row, 10) == i);
    }
    CHECK(c.held == 100 && c.n_rows == 2);
    CHECK(serve_prefix_cache_find_prompt(&c, 0, ids[9], 2)->logits != NULL); /* the newest rows */
    CHECK(serve_prefix_cache_find_prompt(&c, 0, ids[8], 2)->logits != NULL);
    CHECK(serve_prefix_cache_find(&c, 0, ids[0], 2, 2) != NULL); /* 0 is now the newest used */
    int32_t big[] = {7, 7, 7};
    n_dropped = 0;
    int id = serve_prefix_cache_store(&c, 0, big, 3, NULL, 35); /* 1, 2, 3 and 4 go */
    CHECKF(n_dropped == 4 && dropped[0] == 1 && dropped[1] == 2 && dropped[2] == 3 &&
               dropped[3] == 4 && id >= 10 && c.held == 95,
           "%d dropped, id %d, held %zu", n_dropped, id, c.held);
    CHECK(serve_prefix_cache_find(&c, 0, ids[0], 2, 2) != NULL);
    CHECK(serve_prefix_cache_find(&c, 0, ids[1], 2, 2) == NULL);
    /* a reservation dropped for room, its id given to another sequence: it no longer holds
     * the first one's tokens, so the first one's state must not be saved there */
    CHECK(serve_prefix_cache_holds(&c, id, 0, big, 3) &&
          !serve_prefix_cache_holds(&c, id, 0, big, 2));
    CHECK(!serve_prefix_cache_holds(&c, 1, 0, ids[1], 2)); /* dropped above */
    int32_t huge[] = {8, 8, 8, 8};
    int hid = serve_prefix_cache_store(&c, 0, huge, 4, NULL, 100); /* drops everything */
    CHECK(hid >= 0 && !serve_prefix_cache_holds(&c, id, 0, big, 3));
    CHECK(serve_prefix_cache_holds(&c, hid, 0, huge, 4));
    /* tags: the same tokens under other adapters are another entry, found only by their tag */
    CHECK(!serve_prefix_cache_holds(&c, hid, 7, huge, 4));
    CHECK(serve_prefix_cache_find_prompt(&c, 7, huge, 4) == NULL);
    int tid = serve_prefix_cache_store(&c, 7, huge, 3, NULL, 10);
    CHECK(tid >= 0 && serve_prefix_cache_holds(&c, tid, 7, huge, 3));
    const serve_snapshot *ts = serve_prefix_cache_find_prompt(&c, 7, huge, 4);
    CHECK(ts && ts->id == tid);
    CHECK(serve_prefix_cache_find(&c, 0, huge, 4, 3) == NULL); /* tag 0 holds only all 4 */
    serve_prefix_cache_free(&c);
}

/* ---- request validation ---- */

static const char *parse_code(serve_api api, const char *body) {
    static const char *ids[] = {"m", NULL};
    static char code[64];
    serve_error e;
    json_t *root;
    if (!serve_json_parse(body, strlen(body), &root, &e)) {
        snprintf(code, sizeof code, "%s", e.code);
        return code;
    }
    serve_request r;
    bool ok = serve_request_parse(api, root, ids, 100, &r, &e);
    snprintf(code, sizeof code, "%s", ok ? "ok" : e.code);
    serve_request_free(&r);
    return code;
}

static void test_validation(void) {
    const serve_api C = SERVE_API_CHAT, P = SERVE_API_COMPLETION;
    const char *u = "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
    char b[512];
#define BODY(...) (snprintf(b, sizeof b, __VA_ARGS__), b)
    CHECK(!strcmp(parse_code(C, BODY("{%s}", u)), "ok"));
    CHECK(!strcmp(parse_code(C, "[1]"), "invalid_request_body"));
    CHECK(!strcmp(parse_code(C, "{\"a\":1,\"a\":1}"), "invalid_request_body"));
    CHECK(!strcmp(parse_code(C, BODY("{%s,\"model\":\"x\"}", u)), "model_not_found"));
    CHECK(!strcmp(parse_code(C, "{\"messages\":[{\"role\":\"x\",\"content\":\"y\"}]}"),
                  "invalid_role"));
    CHECK(!strcmp(parse_code(C, BODY("{%s,\"temperature\":\"hot\"}", u)), "invalid_value"));
    CHECK(!strcmp(parse_code(C, BODY("{%s,\"max_tokens\":101}", u)), "invalid_value"));
    CHECK(!strcmp(parse_code(C, BODY("{%s,\"max_tokens\":5,\"max_completion_tokens\":6}", u)),
                  "invalid_value"));
    CHECK(!strcmp(parse_code(C, BODY("{%s,\"n\":2}", u)), "ok"));
    CHECK(!strcmp(parse_code(C, BODY("{%s,\"n\":129}", u)), "invalid_value"));
    CHECK(!strcmp(parse_code(C, BODY("{%s,\"top_logprobs\":21,\"logprobs\":true}", u)),
                  "invalid_value"));
    CHECK(!strcmp(parse_code(C, BODY("{%s,\"response_format\":{\"type\":\"json_object\"}}", u)),
                  "ok"));
    CHECK(!strcmp(parse_code(C, BODY("{%s,\"response_format\":{\"type\":\"json_schema\","
                                     "\"json_schema\":{\"schema\":{\"minimum\":1}}}}",
                                     u)),
                  "unsupported_feature"));
    /* the first failing check wins: the model before the sampling fields */
    CHECK(!strcmp(parse_code(C, BODY("{%s,\"temperature\":9,\"model\":\"zz\"}", u)),
                  "model_not_found"));
    CHECK(!strcmp(parse_code(P, "{\"prompt\":[1,2,3]}"), "ok"));
    CHECK(!strcmp(parse_code(P, "{\"prompt\":[\"a\",\"b\"]}"), "ok"));
    CHECK(!strcmp(parse_code(P, "{\"prompt\":[\"a\",[1,2]]}"), "ok"));
    CHECK(!strcmp(parse_code(P, "{\"prompt\":[\"a\",5]}"), "invalid_value"));
    CHECK(!strcmp(parse_code(P, "{\"prompt\":[[1],[-1]]}"), "invalid_value"));
    CHECK(!strcmp(parse_code(P, "{\"prompt\":{}}"), "invalid_value"));
#undef BODY
}

/* Found by fuzz_openai: an unknown role quoted with '%.40s' cut U+1E99 (3 bytes) in two, so the
 * message was ill-formed UTF-8, serve_error_json returned NULL and the client got a 500 "out of
 * memory" instead of the 400. The envelope must always be written, the cut byte as U+FFFD. */
static void test_error_envelope_utf8(void) {
    char body[160];
    /* 38 ASCII bytes, then U+1E99 (E1 BA 99): the 40-byte cut falls inside it */
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"%s\xE1\xBA\x99\",\"content\":\"x\"}]}",
             "abcdefghijklmnopqrstuvwxyzabcdefghijkl");
    serve_error e;
    json_t *root;
    serve_request r;
    CHECK(serve_json_parse(body, strlen(body), &root, &e));
    CHECK(!serve_request_parse(SERVE_API_CHAT, root, (const char *const[]){"m", NULL}, 0, &r, &e));
    serve_request_free(&r);
    CHECK(e.status == 400 && !strcmp(e.code, "invalid_role"));
    char *s = serve_error_json(&e);
    CHECKF(s != NULL, "no envelope for: %s", e.message);
    CHECK(s && strstr(s, "\"invalid_role\"") && strstr(s, "abcdefghijkl\xEF\xBF\xBD'"));
    free(s);
    /* jansson's error text quotes what it read up to the error: of a "\é", the backslash and
     * the first byte of the é */
    static const char bad_json[] = "{\"a\":\"\\\xc3\xa9\"}";
    CHECK(!serve_json_parse(bad_json, sizeof bad_json - 1, &root, &e));
    CHECK(e.status == 400 && !strcmp(e.code, "invalid_request_body"));
    s = serve_error_json(&e);
    CHECKF(s != NULL, "no envelope for: %s", e.message);
    free(s);
    /* the same at the end of the buffer: a message cut inside a character by vsnprintf */
    memset(e.message, 'a', sizeof e.message - 2);
    e.message[sizeof e.message - 2] = (char)0xE1;
    e.message[sizeof e.message - 1] = 0;
    s = serve_error_json(&e);
    CHECK(s && strstr(s, "aa\xEF\xBF\xBD\""));
    free(s);
}

int main(void) {
    test_stop();
    test_split();
    test_cache();
    test_cache_budget();
    test_validation();
    test_error_envelope_utf8();
    return tu_report("test_serve_text");
}
