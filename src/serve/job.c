#include "serve/job.h"

#include "base/clock.h"
#include "base/status.h"
#include "serve/openai.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

double serve_now(void) { return ts_now_s(); }

uint64_t serve_lora_tag(const float *scales, int n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over the scales' bits */
    bool any = false;
    for (int a = 0; a < n; a++) {
        uint32_t bits;
        float s = scales[a] == 0.0f ? 0.0f : scales[a]; /* -0 is 0 */
        memcpy(&bits, &s, sizeof bits);
        any = any || bits != 0;
        for (int k = 0; k < 4; k++)
            h = (h ^ ((bits >> (8 * k)) & 0xff)) * 0x100000001b3ull;
    }
    return !any ? 0 : h ? h : 1;
}

ts_status serve_job_create(serve_job **out) {
    serve_job *j = calloc(1, sizeof *j);
    if (!j) return ts_error(TS_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&j->mu, NULL);
    ts_cond_init_monotonic(&j->cv);
    atomic_init(&j->cancel, false);
    atomic_init(&j->refs, 1);
    j->top_logprobs = -1;
    j->repetition_penalty = 1.0f;
    j->stop_str = j->stop_token = -1;
    j->think_budget = -1;
    *out = j;
    return TS_OK;
}

void serve_job_ref(serve_job *j) { atomic_fetch_add(&j->refs, 1); }

void serve_job_unref(serve_job *j) {
    if (!j || atomic_fetch_sub(&j->refs, 1) != 1) return;
    free(j->ids);
    free(j->bias);
    free(j->stop_ids);
    free(j->think_end);
    free(j->pred_ids);
    free(j->echo_text);
    free(j->prompt_lp);
    free(j->input_at);
    free(j->embedding);
    for (int i = 0; i < j->n_stops; i++) free(j->stops[i]);
    ts_strbuf_free(&j->text);
    free(j->seg);
    free(j->lp);
    free(j->out_ids);
    ts_grammar_free(j->grammar);
    serve_images_free(&j->images);
    if (j->req) serve_request_free(j->req);
    free(j->req);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void serve_job_wait_locked(serve_job *j, int n_seg, int n_lp, int timeout_ms) {
    if (j->finish != SERVE_RUNNING || j->n_seg > n_seg || j->n_lp > n_lp) return;
    struct timespec ts;
    ts_deadline_in_ms(&ts, timeout_ms);
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
}

int serve_job_piece_end(const serve_job *j, int i, size_t *off, size_t *len) {
    serve_channel ch = j->seg[i].ch;
    *off = j->seg[i].off, *len = 0;
    do
        *len += j->seg[i++].len;
    while (ch != SERVE_CH_TOOL && i < j->n_seg && j->seg[i].ch == ch);
    return i;
}
