/* serve/json_load.c: request bodies parsed with their long plain strings cut out first give
 * what jansson gives for the whole body - the same value (json_equal), or NULL with the same
 * error text and position - for bodies written to hit each rule (long keys, escapes, UTF-8,
 * "\u0000" of the body's own, duplicates, bad JSON after a long string, depth) and for random
 * documents and random damage to them, at thresholds down to one byte; and the count of
 * strings that took the short way is the one each body should give. A 3.7 MB image body parses
 * at least twice as fast as jansson alone parses it (~20x where measured). */
#include "serve/json_load.h"
#include "testutil.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int checked;

/* serve_json_load against json_loadb; want_long < 0: any count */
static void same(const char *body, size_t len, size_t min_long, long want_long) {
    json_error_t e1, e2;
    bool deep;
    size_t n_long;
    json_t *a = serve_json_load(body, len, min_long, 64, &deep, &e1, &n_long);
    json_t *b = json_loadb(body, len, JSON_REJECT_DUPLICATES, &e2);
    checked++;
    CHECKF(!deep, "too deep: %.60s", body);
    if (a && b)
        CHECKF(json_equal(a, b), "values differ (min %zu): %.80s", min_long, body);
    else
        CHECKF(!a && !b && e1.position == e2.position && !strcmp(e1.text, e2.text),
               "%s / %s (min %zu): %.80s: '%s' at %d, jansson '%s' at %d", a ? "value" : "NULL",
               b ? "value" : "NULL", min_long, body, a ? "" : e1.text, e1.position,
               b ? "" : e2.text, e2.position);
    if (want_long >= 0)
        CHECKF((long)n_long == want_long, "%ld long strings, want %ld (min %zu): %.80s",
               (long)n_long, want_long, min_long, body);
    json_decref(a);
    json_decref(b);
}

static void same_s(const char *body, size_t min_long, long want_long) {
    same(body, strlen(body), min_long, want_long);
}

static void crafted(void) {
    /* values, not keys; whitespace before a key's colon */
    same_s("{\"abc\":\"defgh\"}", 4, 1);
    same_s("{\"abcdef\" : \"x\", \"k\":[\"longer\", \"no\", \"longer2\"]}", 5, 2);
    same_s("{\"abcdef\"\n\t:\"abcdef\"}", 3, 1);
    same_s("[\"abcdef\" , \"abcdef\"]", 3, 2); /* an array at the top */
    /* not plain: escapes, UTF-8, DEL, a raw tab (invalid), a raw NUL byte (invalid) */
    same_s("{\"a\":\"line\\nbreak and more\"}", 2, 0);
    same_s("{\"a\":\"caf\xc3\xa9 au lait\"}", 2, 0);
    same_s("{\"a\":\"del\x7f del del\"}", 2, 0);
    same_s("{\"a\":\"tab\there\"}", 2, 0);
    same("{\"a\":\"nul\0here\"}", 15, 2, 0);
    same_s("{\"a\":\"\\\"quoted\\\" text\"}", 2, 0);
    /* the body's own \u0000: refused whole as jansson refuses it; \\u0000 is not one */
    same_s("{\"a\":\"\\u0000\",\"b\":\"plain long\"}", 3, 0);
    same_s("{\"b\":\"plain long\",\"a\":\"x\\u0000\"}", 3, 0);
    same_s("{\"a\":\"\\\\u00000\",\"b\":\"plain long\"}", 3, 1);
    same_s("{\"a\":\"\\\\u0000\"}", 1, 0);
    /* strings that look like markers, written by the client */
    same_s("{\"a\":\"u00000\",\"b\":\"0\"}", 1, 2);
    /* duplicates, bad JSON after long strings, unterminated, trailing bytes, top-level */
    same_s("{\"a\":\"long value\",\"a\":\"long value\"}", 3, 0);
    same_s("{\"a\":\"long value\", }", 3, 0);
    same_s("{\"a\":\"long value\", \"b\": tru}", 3, 0);
    same_s("{\"a\":\"long value", 3, 0);
    same_s("{\"a\":\"long value\"} x", 3, 0);
    same_s("{\"a\":\"long value\"}   ", 3, 1);
    same_s("\"long value\"", 3, 0);
    same_s("{\"a\":\"long value\\", 3, 0);
    same_s("", 3, 0);
    same_s("{\"a\":\"short\"}", SERVE_JSON_LONG, 0);
    /* depth: 64 is parsed, 65 is too deep (brackets inside strings do not count) */
    char deep[300];
    int o = 0;
    for (int i = 0; i < 64; i++)
        deep[o++] = '[';
    o += sprintf(deep + o, "\"[[[[long\"");
    for (int i = 0; i < 64; i++)
        deep[o++] = ']';
    deep[o] = 0;
    same_s(deep, 4, 1);
    char deeper[300] = "[";
    strcat(deeper, deep);
    strcat(deeper, "]");
    json_error_t e;
    bool too;
    CHECK(!serve_json_load(deeper, strlen(deeper), 4, 64, &too, &e, NULL) && too);
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 32) % n;
}

typedef struct {
    char *p;
    size_t n, cap;
} buf;

static void put(buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = 2 * (b->n + n + 1);
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void puts_(buf *b, const char *s) { put(b, s, strlen(s)); }

static void ws(buf *b) {
    static const char *const w[] = {"", "", " ", "\n", "\t ", "\r\n"};
    puts_(b, w[rnd(6)]);
}

static void string(buf *b) {
    static const char *const parts[] = {"a",    "Zq",      "0+/=",     " ",       "\\n",   "\\\"",
                                        "\\\\", "\\u00e9", "\xc3\xa9", "\\u0041", "data:", "\x7f"};
    puts_(b, "\"");
    int n = (int)rnd(4) == 0 ? (int)rnd(40) : (int)rnd(6);
    bool plain = rnd(2);
    for (int i = 0; i < n; i++)
        puts_(b, plain ? parts[rnd(4)] : parts[rnd(12)]);
    puts_(b, "\"");
}

static void value(buf *b, int depth) {
    int k = (int)rnd(depth < 5 ? 9 : 6);
    ws(b);
    if (k <= 2) {
        string(b);
    } else if (k == 3) {
        static const char *const lit[] = {"1", "-2.5e3", "true", "false", "null", "0"};
        puts_(b, lit[rnd(6)]);
    } else if (k <= 5) {
        string(b);
    } else if (k <= 7) {
        puts_(b, "{");
        int n = (int)rnd(4);
        for (int i = 0; i < n; i++) {
            if (i) puts_(b, ",");
            ws(b);
            char key[32];
            /* distinct keys, some long and plain (never cut out: keys) */
            if (rnd(2))
                snprintf(key, sizeof key, "\"k%d\"", i);
            else
                snprintf(key, sizeof key, "\"plain_key_%d_long\"", i);
            puts_(b, key);
            ws(b);
            puts_(b, ":");
            value(b, depth + 1);
        }
        ws(b);
        puts_(b, "}");
    } else {
        puts_(b, "[");
        int n = (int)rnd(5);
        for (int i = 0; i < n; i++) {
            if (i) puts_(b, ",");
            value(b, depth + 1);
        }
        ws(b);
        puts_(b, "]");
    }
    ws(b);
}

static void random_docs(void) {
    static const char junk[] = "\"\\,:{}[] a0\x01\xff";
    for (int it = 0; it < 3000; it++) {
        buf b = {0};
        puts_(&b, "{\"doc\":");
        value(&b, 0);
        puts_(&b, "}");
        size_t min_long = 1 + rnd(10);
        same(b.p, b.n, min_long, -1);
        /* damage: a byte replaced, deleted or duplicated */
        for (int d = 0; d < 3; d++) {
            size_t at = rnd((uint32_t)b.n);
            buf c = {0};
            put(&c, b.p, b.n);
            int how = (int)rnd(3);
            if (how == 0)
                c.p[at] = junk[rnd(sizeof junk - 1)];
            else if (how == 1)
                memmove(c.p + at, c.p + at + 1, c.n - at), c.n--;
            else
                put(&c, "", 0), memmove(c.p + at + 1, c.p + at, c.n - at), c.n++;
            same(c.p, c.n, min_long, -1);
            free(c.p);
        }
        free(b.p);
    }
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* a chat request with one 2.8 MB image as a data URL, the text's 3.7 MB */
static void image_body(void) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    buf b = {0};
    puts_(&b,
          "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
          "\"image_url\":{\"url\":\"data:image/png;base64,");
    size_t n = 3709440;
    char *d = malloc(n);
    for (size_t i = 0; i < n; i++)
        d[i] = A[rnd(64)];
    put(&b, d, n);
    puts_(&b, "\"}},{\"type\":\"text\",\"text\":\"Describe.\"}]}],\"max_tokens\":1}");
    same(b.p, b.n, SERVE_JSON_LONG, 1);
    double fast = 1e9, slow = 1e9;
    for (int r = 0; r < 3; r++) {
        json_error_t e;
        bool deep;
        double t0 = now_ms();
        json_t *v = serve_json_load(b.p, b.n, SERVE_JSON_LONG, 64, &deep, &e, NULL);
        double t1 = now_ms();
        json_t *w = json_loadb(b.p, b.n, JSON_REJECT_DUPLICATES, &e);
        double t2 = now_ms();
        fast = t1 - t0 < fast ? t1 - t0 : fast;
        slow = t2 - t1 < slow ? t2 - t1 : slow;
        json_decref(v);
        json_decref(w);
    }
    printf("a 3.7 MB image body: %.2f ms, jansson alone %.2f ms\n", fast, slow);
    CHECKF(2 * fast < slow, "%.2f ms against jansson's %.2f", fast, slow);
    free(d);
    free(b.p);
}

int main(void) {
    crafted();
    random_docs();
    image_body();
    printf("%d bodies compared with jansson\n", checked);
    return tu_report("test_serve_json_load");
}
