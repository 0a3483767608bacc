#include "serve/embeddings.h"

#include "base/status.h"
#include "serve/base64.h"
#include "text/utf8.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool serve_embed_parse(json_t *root, const char *const *model_ids, const serve_runtime *rt,
                       serve_embed_request *r, serve_error *e) {
    memset(r, 0, sizeof *r);
    r->root = root;
    if (!serve_check_model(root, model_ids, &r->model, e)) return false;
    if (!serve_parse_prompts(root, "input", SERVE_MAX_EMBED_INPUTS, &r->inputs, &r->n_inputs, e))
        return false;
    const json_t *f = json_object_get(root, "encoding_format");
    if (f && !json_is_null(f)) {
        const char *v = json_is_string(f) ? json_string_value(f) : "";
        if (strcmp(v, "base64") != 0 && strcmp(v, "float") != 0)
            return serve_fail(e, 400, "invalid_value", "encoding_format",
                              "'encoding_format' must be \"float\" or \"base64\"");
        r->base64 = strcmp(v, "base64") == 0;
    }
    /* dimensions shortens the vectors of models trained for it (Matryoshka: the first values
     * of a vector are a vector of their own), to the lengths the model declares */
    r->dims = rt->n_embd_out;
    const json_t *d = json_object_get(root, "dimensions");
    if (d && !json_is_null(d)) {
        if (!json_is_integer(d) || json_integer_value(d) < 1)
            return serve_fail(e, 400, "invalid_value", "dimensions",
                              "'dimensions' must be a positive integer");
        json_int_t want = json_integer_value(d);
        if (want > rt->n_embd_out)
            return serve_fail(e, 400, "invalid_value", "dimensions",
                              "this model's embeddings have %d dimensions", rt->n_embd_out);
        bool ok = want == rt->n_embd_out || rt->matryoshka.n < 0;
        for (int i = 0; i < rt->matryoshka.n; i++)
            ok |= want == rt->matryoshka.len[i];
        if (!ok) {
            char lens[16 * (TS_MAX_MATRYOSHKA + 1)] = "";
            for (int i = 0; i < rt->matryoshka.n; i++)
                if (rt->matryoshka.len[i] != rt->n_embd_out)
                    snprintf(lens + strlen(lens), sizeof lens - strlen(lens), "%d, ",
                             rt->matryoshka.len[i]);
            return serve_fail(e, 400, "unsupported_feature", "dimensions",
                              rt->matryoshka.n ? "this model's embeddings may be cut to %s%d "
                                                 "dimensions"
                                               : "%sthis model's embeddings have %d dimensions; "
                                                 "it was not trained for shorter ones",
                              lens, rt->n_embd_out);
        }
        r->dims = (int)want;
    }
    return true;
}

void serve_embed_request_free(serve_embed_request *r) {
    serve_prompts_free(r->inputs, r->n_inputs);
    json_decref(r->root);
    memset(r, 0, sizeof *r);
}

/* Input i's token ids (malloc'd, *n of them), checked. */
static bool input_ids(const serve_runtime *rt, const serve_embed_request *r, int i, int32_t **ids,
                      int *n, serve_error *e) {
    const serve_prompt *p = &r->inputs[i];
    char at[32] = "";
    if (r->n_inputs > 1 || !p->text) snprintf(at, sizeof at, "input[%d]: ", i);
    size_t nn = 0;
    *ids = NULL;
    if (p->text) {
        /* spelt control tokens count as such, as a completion's prompt's do */
        if (p->text_len && ts_tokenize(rt->tok, p->text, p->text_len, true, ids, &nn) != TS_OK)
            return serve_fail(e, 400, "invalid_value", "input", "%s%s", at, ts_last_error());
    } else {
        for (int k = 0; k < p->n_ids; k++)
            if (p->ids[k] >= rt->n_vocab)
                return serve_fail(e, 400, "invalid_value", "input",
                                  "%stoken id %d is not in the vocabulary of %d", at, p->ids[k],
                                  rt->n_vocab);
        nn = (size_t)p->n_ids;
        if (!(*ids = malloc((nn ? nn : 1) * sizeof **ids)))
            return serve_fail(e, 500, "internal_error", NULL, "out of memory");
        memcpy(*ids, p->ids, nn * sizeof **ids);
    }
    if (nn == 0)
        return serve_fail(e, 400, "invalid_value", "input", "%san input must not be empty", at);
    if (nn > (size_t)rt->n_ctx)
        return serve_fail(e, 400, "context_length_exceeded", "input",
                          "%sthe input has %zu tokens, more than the context window of %d", at, nn,
                          rt->n_ctx);
    *n = (int)nn;
    return true;
}

bool serve_embed_jobs(const serve_runtime *rt, const serve_embed_request *r, serve_pool pool,
                      int max_jobs, serve_job ***jobs, int *n_jobs, serve_error *e) {
    int k = r->n_inputs, m = k < max_jobs ? k : max_jobs;
    *n_jobs = 0;
    int32_t **ids = calloc((size_t)k, sizeof *ids);
    int *len = calloc((size_t)k, sizeof *len);
    *jobs = calloc((size_t)(m > 0 ? m : 1), sizeof **jobs);
    bool ok = ids && len && *jobs;
    if (!ok) serve_fail(e, 500, "internal_error", NULL, "out of memory");
    long long total = 0;
    for (int i = 0; ok && i < k; i++) {
        ok = input_ids(rt, r, i, &ids[i], &len[i], e);
        if (ok) total += len[i];
    }
    /* the inputs in order, cut into m runs of about equal tokens (each of one input at least):
     * the jobs run on separate lanes, side by side, and end about together */
    long long acc = 0; /* the tokens of the inputs taken so far */
    for (int g = 0, i = 0; ok && g < m; g++) {
        int first = i;
        long long target = total * (g + 1) / m;
        do { /* the next input while its middle is within this job's share, and the jobs after
              * this one have an input each */
            acc += len[i++];
        } while (i < k && k - i > m - g - 1 && acc + len[i] / 2 <= target);
        if (g == m - 1) i = k;
        serve_job *j;
        if (serve_job_create(&j) != TS_OK) {
            ok = serve_fail(e, 500, "internal_error", NULL, "out of memory");
            break;
        }
        (*jobs)[(*n_jobs)++] = j;
        int n_in = i - first, n_ids = 0;
        for (int x = first; x < i; x++)
            n_ids += len[x];
        j->pool = pool;
        j->no_idle_work = true;
        j->n_inputs = n_in;
        j->n_ids = n_ids;
        j->ids = malloc((size_t)n_ids * sizeof *j->ids);
        j->input_at = malloc((size_t)(n_in + 1) * sizeof *j->input_at);
        j->embedding = malloc((size_t)n_in * rt->n_embd_out * sizeof *j->embedding);
        if (!j->ids || !j->input_at || !j->embedding) {
            ok = serve_fail(e, 500, "internal_error", NULL, "out of memory");
            break;
        }
        for (int x = first, at = 0; x < i; x++) {
            j->input_at[x - first] = at;
            memcpy(j->ids + at, ids[x], (size_t)len[x] * sizeof *j->ids);
            at += len[x];
        }
        j->input_at[n_in] = n_ids;
    }
    for (int i = 0; ids && i < k; i++)
        free(ids[i]);
    free(ids), free(len);
    return ok;
}

/* One vector: 9 significant digits give back the same float32; or base64 of its float32
 * bytes (little-endian, as OpenAI's clients decode it) into enc's room. */
/* The first n values of a unit vector of n_embd, scaled back to unit length where n is shorter
 * (into cut), in JSON or base64. */
static ts_status put_vector(ts_strbuf *b, const float *v, int n_embd, int n, float *cut,
                            char *enc) {
    if (n < n_embd) {
        double ss = 0;
        for (int k = 0; k < n; k++)
            ss += (double)v[k] * v[k];
        double scale = ss > 0 ? 1.0 / sqrt(ss) : 0.0;
        for (int k = 0; k < n; k++)
            cut[k] = (float)(v[k] * scale);
        v = cut;
    }
    if (enc) {
        serve_base64_encode(v, (size_t)n * sizeof(float), enc);
        return ts_strbuf_printf(b, "\"%s\"", enc);
    }
    TS_TRY(ts_strbuf_append(b, "[", 1));
    for (int k = 0; k < n; k++)
        TS_TRY(ts_strbuf_printf(b, k ? ",%.9g" : "%.9g", (double)v[k]));
    return ts_strbuf_append(b, "]", 1);
}

char *serve_embed_answer(serve_job *const *jobs, int n, int n_embd, int dims, const char *model,
                         bool base64) {
    ts_strbuf b = {0};
    char *enc = base64 ? malloc(SERVE_BASE64_LEN((size_t)dims * sizeof(float)) + 1) : NULL;
    float *cut = malloc((size_t)dims * sizeof *cut);
    json_t *m = json_string(model);
    char *mj = m ? json_dumps(m, JSON_ENCODE_ANY) : NULL;
    json_decref(m);
    ts_status st = (base64 && !enc) || !mj || !cut ? TS_ERR_NOMEM : TS_OK;
    if (st == TS_OK) st = ts_strbuf_printf(&b, "{\"object\":\"list\",\"data\":[");
    int index = 0, tokens = 0;
    for (int g = 0; st == TS_OK && g < n; g++) {
        const serve_job *j = jobs[g];
        tokens += j->n_ids;
        for (int i = 0; st == TS_OK && i < j->n_inputs; i++, index++) {
            st = ts_strbuf_printf(&b, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":",
                                  index ? "," : "", index);
            if (st == TS_OK)
                st = put_vector(&b, j->embedding + (size_t)i * n_embd, n_embd, dims, cut, enc);
            if (st == TS_OK) st = ts_strbuf_append(&b, "}", 1);
        }
    }
    if (st == TS_OK)
        st = ts_strbuf_printf(&b,
                              "],\"model\":%s,\"usage\":{\"prompt_tokens\":%d,"
                              "\"total_tokens\":%d}}",
                              mj, tokens, tokens);
    free(enc);
    free(cut);
    free(mj);
    if (st != TS_OK) {
        ts_strbuf_free(&b);
        return NULL;
    }
    return b.data;
}
