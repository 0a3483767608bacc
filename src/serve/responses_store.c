/* A list of kept responses, oldest first, under one mutex; looked up by a scan (a store of
 * 64 MiB holds some thousands of conversations, and a scan of their ids costs microseconds
 * against a request's milliseconds). */
#include "serve/responses_store.h"

#include "base/status.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *id;
    json_t *messages, *input;
    char *object;
    size_t bytes;
} entry;

struct serve_rsp_store {
    pthread_mutex_t mu;
    entry *e;
    int n, cap;
    size_t bytes, max_bytes;
};

ts_status serve_rsp_store_create(size_t max_bytes, serve_rsp_store **out) {
    serve_rsp_store *s = calloc(1, sizeof *s);
    if (!s) return ts_error(TS_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&s->mu, NULL);
    s->max_bytes = max_bytes;
    *out = s;
    return TS_OK;
}

static void entry_free(entry *e) {
    free(e->id);
    json_decref(e->messages);
    json_decref(e->input);
    free(e->object);
}

void serve_rsp_store_free(serve_rsp_store *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++)
        entry_free(&s->e[i]);
    free(s->e);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* The bytes an entry holds, about: its texts as JSON (a parsed tree takes a few times more,
 * which the bound's documentation says). */
static size_t entry_bytes(json_t *messages, json_t *input, const char *object, const char *id) {
    char *m = json_dumps(messages, JSON_COMPACT),
         *i = input ? json_dumps(input, JSON_COMPACT) : NULL;
    size_t n = (m ? strlen(m) : 0) + (i ? strlen(i) : 0) + strlen(object) + strlen(id) + 64;
    free(m), free(i);
    return n;
}

void serve_rsp_store_put(serve_rsp_store *s, const char *id, json_t *messages, json_t *input,
                         const char *object) {
    size_t bytes = entry_bytes(messages, input, object, id);
    if (bytes > s->max_bytes) return;
    entry e = {strdup(id), json_incref(messages), json_incref(input), strdup(object), bytes};
    if (!e.id || !e.object) {
        entry_free(&e);
        return;
    }
    pthread_mutex_lock(&s->mu);
    int drop = 0; /* the oldest, until it fits */
    size_t held = s->bytes;
    while (drop < s->n && held + bytes > s->max_bytes)
        held -= s->e[drop++].bytes;
    for (int i = 0; i < drop; i++)
        entry_free(&s->e[i]);
    if (drop) memmove(s->e, s->e + drop, (size_t)(s->n - drop) * sizeof *s->e);
    s->n -= drop;
    s->bytes = held;
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        entry *p = realloc(s->e, (size_t)cap * sizeof *p);
        if (!p) {
            pthread_mutex_unlock(&s->mu);
            entry_free(&e);
            return;
        }
        s->e = p, s->cap = cap;
    }
    s->e[s->n++] = e;
    s->bytes += bytes;
    pthread_mutex_unlock(&s->mu);
}

static entry *find(serve_rsp_store *s, const char *id) {
    for (int i = s->n - 1; i >= 0; i--) /* the newest first: a conversation goes on */
        if (strcmp(s->e[i].id, id) == 0) return &s->e[i];
    return NULL;
}

bool serve_rsp_store_get(serve_rsp_store *s, const char *id, json_t **messages, json_t **input,
                         char **object) {
    pthread_mutex_lock(&s->mu);
    entry *e = find(s, id);
    if (e && messages) *messages = json_incref(e->messages);
    if (e && input) *input = json_incref(e->input);
    if (e && object) *object = strdup(e->object);
    pthread_mutex_unlock(&s->mu);
    return e != NULL;
}

bool serve_rsp_store_delete(serve_rsp_store *s, const char *id) {
    pthread_mutex_lock(&s->mu);
    entry *e = find(s, id);
    if (e) {
        s->bytes -= e->bytes;
        entry_free(e);
        memmove(e, e + 1, (size_t)(s->e + s->n - (e + 1)) * sizeof *e);
        s->n--;
    }
    pthread_mutex_unlock(&s->mu);
    return e != NULL;
}
