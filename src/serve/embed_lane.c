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

#include <stdlib.h>
#include <string.h>

void serve_embed_start(serve_decoder *d, serve_lane *ln) {
    serve_job *j = ln->job;
    /* the slot will hold the last input alone: nothing a later job could take as its prefix */
    ln->n_seq = 0;
    ln->slot_known = true;
    ln->decoding = ln->encoding = false;
    ln->input = 0;
    ln->prefill_at = j->input_at[0];
    ts_engine_slot_clear(d->o.engine, ln->slot);
    /* the sums start from zero: the lane's last job may have ended with its own in them */
    if (ln->pool_sum) memset(ln->pool_sum, 0, (size_t)d->o.n_embd * sizeof *ln->pool_sum);
    pthread_mutex_lock(&j->mu);
    j->prompt_tokens = j->n_ids;
    j->cached_tokens = 0;
    pthread_mutex_unlock(&j->mu);
}

/* The room an embedding call needs; false (the lane's job then fails) when out of memory. */
static bool embed_room(serve_decoder *d, serve_lane *ln) {
    size_t D = (size_t)d->o.n_embd, W = D > (size_t)d->o.n_embd_out ? D : (size_t)d->o.n_embd_out;
    if (!d->hidden && !(d->hidden = malloc((size_t)d->o.prefill_chunk * D * sizeof *d->hidden)))
        return false;
    if (!ln->pool_sum && !(ln->pool_sum = calloc(D + 2 * W, sizeof *ln->pool_sum))) return false;
    return true;
}

/* The rows of an input's piece the pooling wants: all (mean), the input's first, or its last */
static bool row_wanted(serve_pool pool, int at, int start, int end) {
    return pool == SERVE_POOL_MEAN || at == (pool == SERVE_POOL_FIRST ? start : end - 1);
}

/* The input's embedding from the pooled row (first, last) or the sums (mean), through the
 * model's Dense layers (an embedding model's; else as it is), to unit length (OpenAI's
 * embeddings are). False for a state that is not a number (a model whose activations
 * overflowed): an error, not a vector of NaN. */
static bool embed_finish(serve_decoder *d, serve_lane *ln, const float *row) {
    serve_job *j = ln->job;
    int D = d->o.n_embd;
    int n = j->input_at[ln->input + 1] - j->input_at[ln->input];
    float *pooled = (float *)(ln->pool_sum + D);
    for (int i = 0; i < D; i++)
        pooled[i] = j->pool == SERVE_POOL_MEAN ? (float)(ln->pool_sum[i] / n) : row[i];
    return ts_model_embed_finish(d->o.model, pooled,
                                 j->embedding + (size_t)ln->input * d->o.n_embd_out) == TS_OK;
}

/* The lane's input is in: pooled, then the next input from an empty slot, or the job ends. */
static void input_done(serve_decoder *d, serve_lane *ln, const float *row) {
    serve_job *j = ln->job;
    if (!embed_finish(d, ln, row)) {
        serve_lane_end(d, ln, SERVE_FINISH_ERROR,
                       ts_error(TS_ERR_INVALID,
                                "input %d: the model's hidden state is not a number", ln->input));
        return;
    }
    if (++ln->input < j->n_inputs) {
        ln->prefill_at = j->input_at[ln->input];
        memset(ln->pool_sum, 0, (size_t)d->o.n_embd * sizeof *ln->pool_sum);
        ts_engine_slot_clear(d->o.engine, ln->slot);
        return;
    }
    serve_metrics_tokens(d->o.metrics, j->n_ids, 0, j->n_ids, 0);
    serve_lane_end(d, ln, SERVE_FINISH_STOP, TS_OK);
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
        if (ln->prefill_at == j->input_at[ln->input + 1])
            input_done(d, ln, j->pool == SERVE_POOL_FIRST ? (float *)(ln->pool_sum + D) : rows);
    }
}
