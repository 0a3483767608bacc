/* The server's LoRA adapters (lora.h). */
#include "serve/lora.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void serve_lora_init(serve_lora *l, const serve_lora_opts *o) {
    memset(l, 0, sizeof *l);
    pthread_mutex_init(&l->mu, NULL);
    l->n = o->n;
    for (int a = 0; a < o->n; a++) {
        l->path[a] = o->path[a];
        l->model_name[a] = o->model_name[a];
        l->scale[a] = o->scale[a];
        const char *name = o->name[a];
        if (!name) { /* the directory's name (a trailing '/' left out) */
            const char *p = o->path[a];
            size_t n = strlen(p);
            while (n > 1 && p[n - 1] == '/')
                n--;
            size_t b = n;
            while (b > 0 && p[b - 1] != '/')
                b--;
            char *copy = strndup(p + b, n - b);
            name = copy ? copy : p;
            l->owned[a] = copy;
        }
        l->name[a] = name;
    }
}

void serve_lora_free(serve_lora *l) {
    for (int a = 0; a < l->n; a++)
        free(l->owned[a]);
    pthread_mutex_destroy(&l->mu);
}

bool serve_lora_parse(const json_t *list, const char *param, int *n, int *ids, float *scales,
                      serve_error *e) {
    *n = 0;
    if (!json_is_array(list))
        return serve_fail(e, 400, "invalid_value", param,
                          "'%s' must be a list of {\"id\": N, \"scale\": X}", param);
    if (json_array_size(list) > TS_MAX_LORA)
        return serve_fail(e, 400, "invalid_value", param, "'%s' names more than %d adapters", param,
                          TS_MAX_LORA);
    size_t i;
    const json_t *it;
    json_array_foreach(list, i, it) {
        char at[64];
        snprintf(at, sizeof at, "%s[%zu]", param, i);
        const json_t *id = json_object_get(it, "id"), *sc = json_object_get(it, "scale");
        if (!json_is_object(it) || !json_is_integer(id) || !json_is_number(sc))
            return serve_fail(e, 400, "invalid_value", at,
                              "%s must be {\"id\": N, \"scale\": X} with an integer id and a "
                              "number scale",
                              at);
        json_int_t v = json_integer_value(id);
        double s = json_number_value(sc);
        if (v < 0 || v >= TS_MAX_LORA)
            return serve_fail(e, 400, "invalid_value", at, "%s: no LoRA adapter %lld", at,
                              (long long)v);
        if (!isfinite(s) || fabs(s) > 1e6)
            return serve_fail(e, 400, "invalid_value", at, "%s: the scale must be finite", at);
        for (int k = 0; k < *n; k++)
            if (ids[k] == (int)v)
                return serve_fail(e, 400, "invalid_value", at, "%s: adapter %lld is named twice",
                                  at, (long long)v);
        ids[*n] = (int)v, scales[*n] = (float)s;
        (*n)++;
    }
    return true;
}

/* Whether every id of a parsed list is one of the server's adapters. */
static bool known_ids(const serve_lora *l, int n, const int *ids, const char *param,
                      serve_error *e) {
    for (int k = 0; k < n; k++)
        if (ids[k] >= l->n)
            return serve_fail(e, 400, "invalid_value", param,
                              "%s[%d]: no LoRA adapter %d: the server has %d (GET /lora-adapters)",
                              param, k, ids[k], l->n);
    return true;
}

void serve_lora_defaults(serve_lora *l, float *out) {
    memset(out, 0, TS_MAX_LORA * sizeof *out);
    pthread_mutex_lock(&l->mu);
    memcpy(out, l->scale, (size_t)l->n * sizeof *out);
    pthread_mutex_unlock(&l->mu);
}

bool serve_lora_scales(serve_lora *l, const serve_request *r, float *out, serve_error *e) {
    memset(out, 0, TS_MAX_LORA * sizeof *out);
    if (r->lora_given) {
        if (!known_ids(l, r->n_lora, r->lora_id, "lora", e)) return false;
        for (int k = 0; k < r->n_lora; k++)
            out[r->lora_id[k]] = r->lora_scale[k];
        return true;
    }
    for (int a = 0; r->model && a < l->n; a++)
        if (l->model_name[a] && strcmp(r->model, l->name[a]) == 0) {
            out[a] = 1.0f;
            return true;
        }
    serve_lora_defaults(l, out);
    return true;
}

json_t *serve_lora_list(serve_lora *l) {
    json_t *list = json_array();
    pthread_mutex_lock(&l->mu);
    for (int a = 0; list && a < l->n; a++)
        json_array_append_new(list, json_pack("{s:i, s:s, s:s, s:f}", "id", a, "name", l->name[a],
                                              "path", l->path[a], "scale", (double)l->scale[a]));
    pthread_mutex_unlock(&l->mu);
    return list;
}

bool serve_lora_set(serve_lora *l, const json_t *body, serve_error *e) {
    int n, ids[TS_MAX_LORA];
    float scales[TS_MAX_LORA];
    if (!serve_lora_parse(body, "body", &n, ids, scales, e) || !known_ids(l, n, ids, "body", e))
        return false;
    pthread_mutex_lock(&l->mu);
    memset(l->scale, 0, sizeof l->scale);
    for (int k = 0; k < n; k++)
        l->scale[ids[k]] = scales[k];
    pthread_mutex_unlock(&l->mu);
    return true;
}
