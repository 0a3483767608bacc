/* Embedding jobs on the decoder's lanes (POST /v1/embeddings): each input of a job is run
 * through the model from an empty slot, and the final hidden states of its tokens (the output
 * head's input, ts_engine_forward_hidden) are pooled into the input's embedding, which an
 * embedding model's Dense layers then take to its own width. An input goes in in chunks of
 * --prefill-chunk tokens, as a prompt does, so a long one neither holds up the other lanes'
 * answers for longer than a chunk nor misses its cancellation (an encoder's goes in whole: the
 * worker makes its chunk the context); the embedding lanes' chunks share a forward call of
 * their own, beside the prompts' (whose outputs are logits). Worker thread only. */
#include "base/status.h"
#include "serve/decode_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The lane's next input (ln->input) begins: from an empty slot, its sums from zero (the lane's
 * last input or job may have left its own in them). */
static void input_begin(serve_decoder *d, serve_lane *ln) {
    ln->prefill_at = ln->job->input_at[ln->input];
    ts_engine_slot_clear(d->o.engine, ln->slot);
    if (ln->pool_sum) memset(ln->pool_sum, 0, (size_t)d->o.n_embd * sizeof *ln->pool_sum);
}

void serve_embed_start(serve_decoder *d, serve_lane *ln) {
    serve_job *j = ln->job;
    /* the slot will hold the last input alone: nothing a later job could take as its prefix */
    ln->n_seq = 0;
    ln->slot_known = true;
    ln->decoding = ln->encoding = false;
    ln->input = 0;
    input_begin(d, ln);
    pthread_mutex_lock(&j->mu);
    j->prompt_tokens = j->n_ids;
    j->cached_tokens = 0;
    pthread_mutex_unlock(&j->mu);
}

/* The room an embedding call needs; false (the lane's job then fails) when out of memory. */
static bool embed_room(serve_decoder *d, serve_lane *ln) {
    size_t D = (size_t)d->o.n_embd, L = (size_t)d->o.n_lanes;
    if (!d->hidden) {
        d->hidden = malloc((size_t)d->o.prefill_chunk * D * sizeof *d->hidden);
        d->e_pooled = malloc(L * D * sizeof *d->e_pooled);
        d->e_out = malloc(L * (size_t)d->o.n_embd_out * sizeof *d->e_out);
        d->e_lane = malloc(L * sizeof *d->e_lane);
        if (!d->hidden || !d->e_pooled || !d->e_out || !d->e_lane) {
            free(d->hidden), free(d->e_pooled), free(d->e_out), free(d->e_lane);
            d->hidden = d->e_pooled = d->e_out = NULL, d->e_lane = NULL;
            return false;
        }
    }
    /* the sums (mean), then the first row (cls) as floats */
    if (!ln->pool_sum && !(ln->pool_sum = calloc(2 * D, sizeof *ln->pool_sum))) return false;
    return true;
}

/* The rows of an input's piece the pooling wants: all (mean), the input's first, or its last */
static bool row_wanted(serve_pool pool, int at, int start, int end) {
    return pool == SERVE_POOL_MEAN || at == (pool == SERVE_POOL_FIRST ? start : end - 1);
}

/* The lane's input is in: its pooled state (the sums' mean, the first row, or the last row)
 * becomes the call's k-th to finish. */
static void input_pooled(serve_decoder *d, serve_lane *ln, const float *last, int k) {
    serve_job *j = ln->job;
    int D = d->o.n_embd, n = j->input_at[ln->input + 1] - j->input_at[ln->input];
    const float *first = (const float *)(ln->pool_sum + D);
    float *p = d->e_pooled + (size_t)k * D;
    for (int i = 0; i < D; i++)
        p[i] = j->pool == SERVE_POOL_MEAN    ? (float)(ln->pool_sum[i] / n)
               : j->pool == SERVE_POOL_FIRST ? first[i]
                                             : last[i];
    d->e_lane[k] = ln;
}

/* The call's k finished inputs through the model's Dense layers together (an embedding
 * model's: its weights read once for all of them; else as they are), to unit length (OpenAI's
 * embeddings are), into their jobs; then each lane's next input from an empty slot, or its job
 * ends. A state that is not a number (a model whose activations overflowed) fails its job: an
 * error, not a vector of NaN. */
static void inputs_finish(serve_decoder *d, int k) {
    int W = d->o.n_embd_out;
    ts_status st = ts_model_embed_finish(d->o.model, k, d->e_pooled, d->e_out);
    for (int e = 0; e < k; e++) {
        serve_lane *ln = d->e_lane[e];
        serve_job *j = ln->job;
        const float *v = d->e_out + (size_t)e * W;
        if (st != TS_OK && (st != TS_ERR_RANGE || isnan(v[0]))) {
            serve_lane_end(d, ln, SERVE_FINISH_ERROR,
                           ts_error(st, "input %d: %s", ln->input,
                                    st == TS_ERR_RANGE ? "the model's hidden state is not a number"
                                                       : "out of memory"));
            continue;
        }
        memcpy(j->embedding + (size_t)ln->input * W, v, (size_t)W * sizeof *v);
        if (++ln->input < j->n_inputs) {
            input_begin(d, ln);
            continue;
        }
        serve_metrics_tokens(d->o.metrics, j->n_ids, 0, j->n_ids, 0);
        serve_lane_end(d, ln, SERVE_FINISH_STOP, TS_OK);
    }
}

void serve_embed_step(serve_decoder *d) {
    int n = 0, n_in = 0, n_rows = 0, D = d->o.n_embd;
    uint64_t after = 0;
    for (;;) { /* the embedding lanes in start order, as many chunks as fit one call */
        serve_lane *next = serve_lane_prefilling(d, after, true);
        if (!next) break;
        serve_job *j = next->job;
        int start = j->input_at[next->input], end = j->input_at[next->input + 1];
        int left = end - next->prefill_at;
        int piece = left < d->o.prefill_chunk ? left : d->o.prefill_chunk;
        if (n + piece > d->o.prefill_chunk) break;
        if (!embed_room(d, next)) {
            serve_lane_end(d, next, SERVE_FINISH_ERROR, ts_error(TS_ERR_NOMEM, "out of memory"));
            continue;
        }
        after = next->used;
        int wanted = 0;
        for (int i = 0; i < piece; i++) {
            d->tok[n + i] = j->ids[next->prefill_at + i];
            d->pos[n + i] = next->prefill_at + i - start;
            d->slot[n + i] = next->slot;
            d->want[n + i] = row_wanted(j->pool, next->prefill_at + i, start, end);
            wanted += d->want[n + i];
        }
        d->b_row[n_in] = n_rows;
        n_rows += wanted;
        n += piece;
        d->b_in[n_in] = next, d->b_piece[n_in++] = piece;
    }
    if (n_in == 0) return;
    serve_decoder_step_delay(d);
    ts_batch b = {n, d->tok, d->pos, d->slot, d->want, NULL, NULL};
    ts_status st = n_rows ? ts_engine_forward_hidden(d->o.engine, &b, d->hidden)
                          : ts_engine_forward(d->o.engine, &b, NULL);
    if (d->o.metrics) serve_metrics_prefill_call(d->o.metrics);
    int done = 0;
    for (int i = 0; i < n_in; i++) {
        serve_lane *ln = d->b_in[i];
        serve_job *j = ln->job;
        if (st != TS_OK) {
            serve_lane_fail(d, ln, st);
            continue;
        }
        int piece = d->b_piece[i];
        const float *rows = d->hidden + (size_t)d->b_row[i] * D;
        if (j->pool == SERVE_POOL_MEAN)
            for (int r = 0; r < piece; r++)
                for (int k = 0; k < D; k++)
                    ln->pool_sum[k] += rows[(size_t)r * D + k];
        else if (j->pool == SERVE_POOL_FIRST && ln->prefill_at == j->input_at[ln->input])
            memcpy(ln->pool_sum + D, rows, (size_t)D * sizeof *rows);
        ln->prefill_at += piece;
        if (ln->prefill_at == j->input_at[ln->input + 1]) input_pooled(d, ln, rows, done++);
    }
    if (done) inputs_finish(d, done);
}
