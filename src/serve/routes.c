/* The route handlers: generation (streaming and not), embeddings, tokenize/detokenize, models,
 * health, metrics. */
#include <stdio.h>
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include "base/status.h"
#include "serve/embeddings.h"
#include "serve/fetch.h"
#include "serve/http.h"
#include "serve/infill.h"
#include "serve/messages.h"
#include "serve/prep.h"
#include "serve/respond.h"
#include "serve/responses.h"

#include <string.h>

#define WAIT_SLICE_MS 20
/* After a body this large, the memory its JSON tree took goes back to the system: glibc keeps
 * a thread's freed memory in that thread's arena, so without it every arena would keep the
 * largest tree parsed in it. */
#define PREP_TRIM_BYTES (1u << 20)

/* ---- generation ------------------------------------------------------------------------- */

/* The jobs of one request: per_prompt answers for each of its prompts (a completion may carry
 * several), prompt i / per_prompt; of each prompt's answers the keep best are its choices
 * (best_of; without it all are, in order). The HTTP side holds a reference to each. */
typedef struct {
    serve_job **job;
    int n, per_prompt, keep;
} serve_choices;

static void choices_cancel(const serve_choices *cs) {
    for (int i = 0; i < cs->n; i++)
        atomic_store(&cs->job[i]->cancel, true);
}

static void choices_free(serve_choices *cs) {
    for (int i = 0; i < cs->n; i++)
        serve_job_unref(cs->job[i]);
    free(cs->job);
    cs->job = NULL, cs->n = 0;
}

/* What a stream has sent of one choice. */
typedef struct {
    int n_seg, n_lp; /* job output already formatted */
    int n_tool;      /* tool calls sent */
    bool echoed;     /* its echo (the prompt's text) is out, or it has none */
    bool done;       /* its final chunk is out */
} serve_stream_choice;

typedef struct {
    serve_server *srv;
    struct MHD_Connection *conn;
    serve_choices cs;
    serve_stream_choice *at; /* [cs.n] */
    serve_resp resp;
    serve_rsp_stream rs; /* the Responses API's (resp.settings set) */
    serve_msg_stream ms; /* the Messages API's (resp.messages set) */
    bool include_usage;
    int phase;     /* 0 role chunks, 1 deltas, 2 all formatted */
    ts_strbuf out; /* formatted, not yet handed to MHD */
    size_t out_off;
} serve_stream;

static void shutdown_error(serve_error *e) {
    serve_fail(e, 503, "server_shutting_down", NULL, "the server is shutting down");
}

/* The error a job that did not finish (cancelled or failed) answers with. */
static void job_error(const serve_job *j, serve_error *e) {
    if (j->finish == SERVE_FINISH_CANCELLED)
        shutdown_error(e);
    else
        serve_fail(e, 500, "internal_error", NULL, "generation failed: %s", j->error);
}

/* Formats choice i's new output (its job's mutex held); a choice that failed ends the stream
 * with its error (phase 2). */
static ts_status format_new(serve_stream *s, int i) {
    serve_job *j = s->cs.job[i];
    serve_stream_choice *c = &s->at[i];
    int lp_end = j->n_lp;
    if (!c->echoed && j->echo_text && j->finish != SERVE_FINISH_CANCELLED &&
        j->finish != SERVE_FINISH_ERROR) {
        /* the prompt's text first; with logprobs once the prompt is scored */
        if (j->prompt_lp && !j->prompt_lp_done && j->finish == SERVE_RUNNING) return TS_OK;
        TS_TRY(serve_resp_chunk_echo(&s->resp, i, j, &s->out));
    }
    c->echoed = true;
    while (c->n_seg < j->n_seg) {
        /* merge consecutive segments of one channel into one delta */
        serve_channel ch = j->seg[c->n_seg].ch;
        size_t off = j->seg[c->n_seg].off, len = 0;
        if (ch == SERVE_CH_TOOL && s->resp.messages) {
            TS_TRY(serve_msg_stream_tool(&s->resp, &s->ms, c->n_tool++, j->text.data + off,
                                         j->seg[c->n_seg++].len, &s->out));
            continue;
        }
        if (ch == SERVE_CH_TOOL) { /* one chunk per call */
            TS_TRY(s->resp.settings
                       ? serve_rsp_stream_tool(&s->resp, &s->rs, c->n_tool++, j->text.data + off,
                                               j->seg[c->n_seg++].len, j->lp + c->n_lp,
                                               lp_end - c->n_lp, &s->out)
                       : serve_resp_chunk_tool(&s->resp, i, c->n_tool++, j->text.data + off,
                                               j->seg[c->n_seg++].len, j->lp + c->n_lp,
                                               lp_end - c->n_lp, &s->out));
            c->n_lp = lp_end;
            continue;
        }
        while (c->n_seg < j->n_seg && j->seg[c->n_seg].ch == ch)
            len += j->seg[c->n_seg++].len;
        if (s->resp.infill) { /* a completion's text is all content */
            TS_TRY(serve_infill_chunk_text(j->text.data + off, len, &s->out));
            continue;
        }
        if (s->resp.messages) {
            TS_TRY(serve_msg_stream_text(&s->ms, ch, j->text.data + off, len, &s->out));
            continue;
        }
        TS_TRY(s->resp.settings
                   ? serve_rsp_stream_text(&s->resp, &s->rs, ch, j->text.data + off, len,
                                           j->lp + c->n_lp, lp_end - c->n_lp, &s->out)
                   : serve_resp_chunk_text(&s->resp, i, ch, j->text.data + off, len,
                                           j->lp + c->n_lp, lp_end - c->n_lp, &s->out));
        c->n_lp = lp_end;
    }
    if (j->finish == SERVE_RUNNING) return TS_OK;
    c->done = true;
    bool ok = j->finish == SERVE_FINISH_STOP || j->finish == SERVE_FINISH_LENGTH;
    if (ok && s->resp.infill) return serve_infill_chunk_finish(&s->resp, j, &s->out);
    if (ok && s->resp.messages) return serve_msg_stream_finish(&s->ms, j, &s->out);
    if (ok && s->resp.settings)
        return serve_rsp_stream_finish(&s->resp, &s->rs, j, j->lp + c->n_lp, lp_end - c->n_lp,
                                       &s->out);
    if (ok)
        return serve_resp_chunk_finish(&s->resp, i, j, j->lp + c->n_lp, lp_end - c->n_lp, &s->out);
    s->phase = 2;
    serve_error e;
    job_error(j, &e);
    if (s->resp.infill) return serve_infill_chunk_error(&e, &s->out);
    if (s->resp.messages) return serve_msg_stream_error(&e, &s->out);
    return s->resp.settings ? serve_rsp_stream_error(&s->resp, &s->rs, &e, &s->out)
                            : serve_resp_chunk_error(&e, &s->out);
}

/* Waits for new output of the first choice still running (the choices of a request decode in
 * the same steps), then formats every choice's. */
static ts_status stream_poll(serve_stream *s) {
    int w = 0;
    while (w < s->cs.n && s->at[w].done)
        w++;
    serve_job *j = s->cs.job[w];
    pthread_mutex_lock(&j->mu);
    serve_job_wait_locked(j, s->at[w].n_seg, s->at[w].n_lp, WAIT_SLICE_MS);
    pthread_mutex_unlock(&j->mu);
    bool all_done = true;
    for (int i = 0; i < s->cs.n && s->phase == 1; i++) {
        if (s->at[i].done) continue;
        j = s->cs.job[i];
        pthread_mutex_lock(&j->mu);
        ts_status st = format_new(s, i);
        pthread_mutex_unlock(&j->mu);
        if (st != TS_OK) return st;
        all_done &= s->at[i].done;
    }
    if (s->phase == 2) { /* a choice failed: the others have no reader left */
        choices_cancel(&s->cs);
        return TS_OK;
    }
    if (!all_done) return TS_OK;
    s->phase = 2;
    /* the Responses API's final event, /infill's and the Messages API's went with the answer's
     * end */
    if (s->resp.settings || s->resp.infill || s->resp.messages) return TS_OK;
    for (int i = 0; i < s->cs.n; i++)
        pthread_mutex_lock(&s->cs.job[i]->mu);
    ts_status st = serve_resp_chunk_done(&s->resp, s->cs.job, s->cs.n, s->cs.per_prompt,
                                         s->include_usage, &s->out);
    for (int i = 0; i < s->cs.n; i++)
        pthread_mutex_unlock(&s->cs.job[i]->mu);
    return st;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    serve_stream *s = cls;
    for (;;) {
        if (s->out_off < s->out.len) {
            size_t n = s->out.len - s->out_off < max ? s->out.len - s->out_off : max;
            memcpy(buf, s->out.data + s->out_off, n);
            s->out_off += n;
            return (ssize_t)n;
        }
        s->out.len = s->out_off = 0;
        if (s->phase == 2) return MHD_CONTENT_READER_END_OF_STREAM;
        if (s->phase == 0) {
            s->phase = 1;
            if (s->resp.settings && serve_rsp_stream_start(&s->resp, &s->rs, &s->out) != TS_OK)
                return MHD_CONTENT_READER_END_WITH_ERROR;
            if (s->resp.messages &&
                serve_msg_stream_start(&s->resp, &s->ms, s->cs.job[0], &s->out) != TS_OK)
                return MHD_CONTENT_READER_END_WITH_ERROR;
            for (int i = 0;
                 i < s->cs.n && !s->resp.settings && !s->resp.infill && !s->resp.messages; i++)
                if (serve_resp_chunk_role(&s->resp, i, &s->out) != TS_OK)
                    return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        if (stream_poll(s) != TS_OK) return MHD_CONTENT_READER_END_WITH_ERROR;
        /* the send timeout counts the client's silence from when there is something to send,
         * not across a long wait for the first token */
        if (s->out.len) serve_timeout_restart(s->srv, s->conn);
        if (s->out.len == 0 && serve_client_gone(s->conn)) {
            choices_cancel(&s->cs);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls) {
    serve_stream *s = cls;
    /* the connection is gone (finished or not): a job still running has no reader left */
    choices_cancel(&s->cs);
    choices_free(&s->cs);
    atomic_fetch_sub(&s->srv->open_jobs, 1);
    ts_strbuf_free(&s->out);
    serve_rsp_stream_free(&s->rs);
    json_decref(s->resp.settings);
    json_decref(s->resp.conversation);
    json_decref(s->resp.input);
    free(s->at);
    free(s);
}

static enum MHD_Result start_stream(serve_conn *cn, struct MHD_Connection *c, serve_choices *cs,
                                    const serve_resp *resp, bool include_usage) {
    serve_stream *s = calloc(1, sizeof *s);
    serve_stream_choice *at = calloc((size_t)cs->n, sizeof *at);
    if (!s || !at) {
        choices_cancel(cs);
        choices_free(cs);
        atomic_fetch_sub(&cn->srv->open_jobs, 1);
        free(s), free(at);
        json_decref(resp->settings);
        json_decref(resp->conversation);
        json_decref(resp->input);
        return MHD_NO;
    }
    *s = (serve_stream){.srv = cn->srv,
                        .conn = c,
                        .cs = *cs,
                        .at = at,
                        .resp = *resp,
                        .include_usage = include_usage};
    *cs = (serve_choices){0};
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024,
                                                               stream_read, s, stream_free);
    if (!r) {
        stream_free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    return serve_queue(cn, c, 200, r);
}

/* An answer's mean log-probability a token (best_of's measure, OpenAI's "highest log
 * probability per token"); an answer of no tokens scores 0. */
static double answer_score(const serve_job *j) {
    double sum = 0;
    for (int i = 0; i < j->n_lp; i++)
        sum += j->lp[i].logprob;
    return j->n_lp ? sum / j->n_lp : 0;
}

/* best_of: orders each prompt's answers best first (ties keep their order), so that its first
 * keep are its choices. */
static void rank_best(serve_choices *cs) {
    int per = cs->per_prompt;
    double score[SERVE_MAX_N];
    for (int p = 0; p < cs->n / per; p++) {
        serve_job **g = cs->job + p * per;
        for (int i = 0; i < per; i++)
            score[i] = answer_score(g[i]);
        for (int i = 1; i < per; i++) { /* insertion sort: stable */
            serve_job *j = g[i];
            double s = score[i];
            int k = i;
            for (; k > 0 && score[k - 1] < s; k--) {
                g[k] = g[k - 1];
                score[k] = score[k - 1];
            }
            g[k] = j;
            score[k] = s;
        }
    }
}

/* Waits for every job of a request answered in one piece, watching for the client leaving:
 * false when it left (its jobs cancelled and let go, its open_jobs count given back: nobody to
 * answer). *failed: the first job that ended without an answer (the others then cancelled:
 * the answer is an error), or NULL. */
static bool wait_jobs(serve_conn *cn, struct MHD_Connection *c, serve_choices *cs,
                      const serve_job **failed) {
    *failed = NULL;
    for (int i = 0; i < cs->n; i++) {
        serve_job *j = cs->job[i];
        pthread_mutex_lock(&j->mu);
        while (j->finish == SERVE_RUNNING) {
            serve_job_wait_locked(j, j->n_seg, j->n_lp, WAIT_SLICE_MS);
            if (j->finish == SERVE_RUNNING && serve_client_gone(c)) {
                pthread_mutex_unlock(&j->mu);
                choices_cancel(cs);
                choices_free(cs);
                atomic_fetch_sub(&cn->srv->open_jobs, 1);
                return false;
            }
        }
        if (!*failed && j->finish != SERVE_FINISH_STOP && j->finish != SERVE_FINISH_LENGTH) {
            *failed = j;
            choices_cancel(cs);
        }
        pthread_mutex_unlock(&j->mu);
    }
    return true;
}

/* Waits for every choice of a non-streaming request and answers. */
static enum MHD_Result finish_blocking(serve_conn *cn, struct MHD_Connection *c, serve_choices *cs,
                                       const serve_resp *resp) {
    const serve_job *failed;
    if (!wait_jobs(cn, c, cs, &failed)) return MHD_NO;
    enum MHD_Result ret;
    if (!failed) {
        for (int i = 0; i < cs->n; i++)
            pthread_mutex_lock(&cs->job[i]->mu);
        if (cs->keep < cs->per_prompt) rank_best(cs);
        char *body = resp->settings   ? serve_rsp_full(resp, cs->job[0])
                     : resp->messages ? serve_msg_full(resp, cs->job[0])
                     : resp->infill
                         ? serve_infill_full(resp, cs->job[0])
                         : serve_resp_full(resp, cs->job, cs->n, cs->per_prompt, cs->keep);
        for (int i = 0; i < cs->n; i++)
            pthread_mutex_unlock(&cs->job[i]->mu);
        ret = serve_send_json(cn, c, 200, body);
    } else {
        serve_error e;
        job_error(failed, &e);
        ret = serve_send_error(cn, c, &e);
    }
    choices_free(cs);
    atomic_fetch_sub(&cn->srv->open_jobs, 1);
    return ret;
}

/* A request's share of the prep budget, given back once its job is admitted or refused (the
 * job then holds what it needs: token ids, and for a chat the request, within --max-pending). */
static void prep_done(serve_conn *cn) {
    if (!cn->prep_held) return;
    serve_budget_give(&cn->srv->prep, cn->prep_held);
#ifdef __GLIBC__
    if (cn->prep_held >= PREP_TRIM_BYTES) malloc_trim(0);
#endif
    cn->prep_held = 0;
}

/* Takes the body's bytes of the prep budget, waiting while other bodies hold it; false with an
 * answer to send (e) or none (the client left). */
static bool prep_take(serve_conn *cn, struct MHD_Connection *c, serve_error *e) {
    serve_server *s = cn->srv;
    size_t n = cn->body.len;
    bool waited = false;
    while (!serve_budget_try(&s->prep, n)) {
        waited = true;
        if (serve_client_gone(c)) return false;
        if (atomic_load(&s->shutting_down)) {
            shutdown_error(e);
            return false;
        }
        serve_budget_wait(&s->prep, WAIT_SLICE_MS);
    }
    if (waited) serve_metrics_event(&s->metrics, 4);
    cn->prep_held = n;
    return true;
}

/* The request's jobs, prepared: choice c of prompt p is job p * n + c. Each owns its inputs
 * (the grammar copied for all but the first); a chat's first choice owns the request, from
 * which the worker renders the next turn's prefix (a conversation goes on from one answer),
 * and the later choices of a prompt leave no state behind (no_idle_work). */
static bool prepare_choices(serve_server *s, const serve_runtime *rt, serve_request *req,
                            serve_choices *cs, serve_error *e) {
    int n_prompts = req->api == SERVE_API_CHAT ? 1 : req->n_prompts;
    int per = req->best_of, n = n_prompts * per;
    if (n > s->o.max_pending)
        return serve_fail(e, 400, "invalid_value",
                          per > req->n ? "best_of"
                          : req->n > 1 ? "n"
                                       : "prompt",
                          "%d answers (%d prompts x %s = %d) are more than this server admits at "
                          "once (--max-pending %d)",
                          n, n_prompts, per > req->n ? "best_of" : "n", per, s->o.max_pending);
    cs->job = calloc((size_t)n, sizeof *cs->job);
    if (!cs->job) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    cs->per_prompt = per;
    cs->keep = req->n;
    serve_prep_opts po = {s->o.max_tokens_cap, s->o.reasoning_budget, s->o.reasoning_message,
                          s->o.effort_budget};
    float lora[TS_MAX_LORA];
    if (!serve_lora_scales(&s->lora, req, lora, e)) return false;
    uint64_t tag = serve_lora_tag(lora, s->lora.n);
    for (int i = 0; i < n; i++) {
        if (serve_job_create(&cs->job[i]) != TS_OK)
            return serve_fail(e, 500, "internal_error", NULL, "out of memory");
        cs->n++;
        serve_job *j = cs->job[i];
        if (!serve_prepare(rt, req, i / per, i % per, &po, j, e)) return false;
        j->no_idle_work = i % per > 0;
        memcpy(j->lora, lora, sizeof lora);
        j->lora_tag = tag;
        /* best_of ranks the answers by their tokens' log-probabilities: each records them */
        if (per > req->n && j->top_logprobs < 0) j->top_logprobs = 0;
        if (req->grammar && i > 0 && ts_grammar_copy(req->grammar, &j->grammar) != TS_OK)
            return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    }
    cs->job[0]->grammar = req->grammar; /* the answer's grammar goes with the job */
    req->grammar = NULL;
    if (req->api == SERVE_API_CHAT) {
        /* the job owns the request from here on (read-only on both sides; freed with it) */
        serve_job *j = cs->job[0];
        if (!(j->req = malloc(sizeof *j->req)))
            return serve_fail(e, 500, "internal_error", NULL, "out of memory");
        *j->req = *req;
        memset(req, 0, sizeof *req);
        /* what is kept for the next turn: the messages, not the JSON tree they came in */
        if (serve_request_detach(j->req) != TS_OK)
            return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    }
    return true;
}

/* The name an answer gives the model: the one the request used (its id when none), as a string
 * that outlives the request: the server's own, or a name only --any-model accepts, kept in the
 * connection's buffer (serve_check_model refuses one too long for it). */
static const char *answer_model(serve_conn *cn, const char *asked) {
    const char *const *ids = cn->srv->model_ids;
    if (!asked) return ids[0];
    for (int i = 0; ids[i]; i++)
        if (!strcmp(asked, ids[i])) return ids[i];
    snprintf(cn->model_asked, sizeof cn->model_asked, "%s", asked);
    return cn->model_asked;
}

/* Admits a request's jobs together, or refuses them all at once (503 server_busy in e). */
static bool admit(serve_server *s, serve_choices *cs, serve_error *e) {
    if (serve_worker_submit(s->worker, cs->job, cs->n) == TS_OK) return true;
    serve_metrics_event(&s->metrics, 0);
    return serve_fail(e, 503, "server_busy", NULL,
                      "the server is busy (%d requests admitted); retry later", s->o.max_pending);
}

/* The images and videos of a parsed request given by URL, fetched as the server allows. */
static bool fetch_media(const serve_server *s, serve_request *r, serve_error *e) {
    serve_fetch_opts o = {s->o.allow_media_urls || s->o.media_hosts,
                          (size_t)s->o.media_url_max_mb << 20, s->o.media_url_timeout_s,
                          s->o.media_dir, s->o.media_hosts};
    return serve_fetch_media(r, &o, e);
}

/* The shape a generation request came in: OpenAI's chat or completions, the Responses API
 * (read as the chat request it means), llama-server's /infill (read as the completion it
 * means) and /completion (its own names of a completion's fields), Anthropic's Messages API
 * (read as the chat request it means). /infill and /completion answer in llama-server's
 * shape. */
typedef enum { WIRE_OPENAI, WIRE_RESPONSES, WIRE_INFILL, WIRE_LLAMA, WIRE_MESSAGES } serve_wire;

/* A generation request of any wire shape. */
static enum MHD_Result generate(serve_conn *cn, struct MHD_Connection *c, serve_api api,
                                json_t *root, serve_wire wire) {
    bool responses = wire == WIRE_RESPONSES, infill = wire == WIRE_INFILL || wire == WIRE_LLAMA;
    bool messages = wire == WIRE_MESSAGES;
    int keep_at = 0; /* /infill: the frame's files part (serve_job.keep_at) */
    serve_server *s = cn->srv;
    const serve_runtime *rt = serve_worker_runtime(s->worker);
    serve_request req;
    memset(&req, 0, sizeof req);
    serve_error e;
    serve_choices cs = {0};
    serve_rsp_read rd = {0};
    serve_msg_read md = {0};
    bool ok = true;
    if (messages) {
        ok = serve_msg_request(root, false, &md, &e);
        json_decref(root);
        root = md.chat; /* the parse takes it over */
        md.chat = NULL;
    } else if (responses) {
        ok = serve_rsp_request(root, s->rsp_store, &rd, &e);
        json_decref(root);
        root = rd.chat; /* the parse takes it over */
        rd.chat = NULL;
    } else if (infill) {
        json_t *body = wire == WIRE_LLAMA ? serve_llama_completion_request(root, &e)
                                          : serve_infill_request(root, rt, &keep_at, &e);
        json_decref(root);
        root = body;
        ok = body != NULL;
        infill = ok; /* from here on the completion's checks, named as /infill names them */
    }
    if (ok) ok = serve_request_parse(api, root, s->model_ids, s->o.max_tokens_cap, &req, &e);
    req.truncate_auto = responses && rd.truncate_auto;
    /* --reasoning-format: OpenAI's chat (the Responses and Messages APIs keep the thinking in
     * blocks of its own) */
    if (ok && wire == WIRE_OPENAI && req.reasoning_inline < 0)
        req.reasoning_inline = s->o.reasoning_inline;
    if (ok) ok = fetch_media(s, &req, &e);
    if (ok && rt->encoder)
        ok = serve_fail(&e, 400, "unsupported_feature", "model",
                        "the model is an embedding model (an encoder): it answers POST "
                        "/v1/embeddings, not text");
    const char *model = answer_model(cn, req.model);
    if (ok) ok = prepare_choices(s, rt, &req, &cs, &e);
    if (ok && keep_at > 0 && keep_at < cs.job[0]->n_ids) cs.job[0]->keep_at = keep_at;
    const serve_request *rq = cs.n && cs.job[0]->req ? cs.job[0]->req : &req;
    if (ok) ok = admit(s, &cs, &e);
    if (!ok && responses) serve_rsp_error(&rd.map, &e);
    if (!ok && messages) serve_msg_error(&md, &e);
    if (!ok && infill) serve_infill_error(&e);
    if (!ok) {
        serve_msg_read_free(&md);
        serve_rsp_read_free(&rd);
        serve_request_free(&req);
        choices_free(&cs);
        prep_done(cn);
        return serve_send_error(cn, c, &e);
    }
    serve_resp resp;
    serve_resp_init(&resp, api, model, rq->top_logprobs >= 0, rt->tok);
    resp.token_ids = rq->return_token_ids;
    if (responses) {
        serve_resp_set_id_prefix(&resp, "resp");
        resp.settings = rd.settings, resp.conversation = rd.conversation, resp.input = rd.input;
        resp.store = s->rsp_store;
        rd.settings = rd.conversation = rd.input = NULL; /* the answer's now */
        resp.think_open = rt->think_open, resp.think_close = rt->think_close;
    }
    resp.infill = wire == WIRE_INFILL || wire == WIRE_LLAMA;
    if (s->o.reasoning_fields) resp.reasoning_fields = s->o.reasoning_fields;
    if (messages) {
        resp.messages = true;
        serve_resp_set_id_prefix(&resp, "msg");
    }
    serve_rsp_read_free(&rd); /* what is left of it: the map */
    serve_msg_read_free(&md);
    bool stream = rq->stream, include_usage = rq->include_usage;
    serve_request_free(&req);
    prep_done(cn);
    atomic_fetch_add(&s->open_jobs, 1);
    if (stream) return start_stream(cn, c, &cs, &resp, include_usage); /* owns resp's JSON */
    enum MHD_Result r = finish_blocking(cn, c, &cs, &resp);
    json_decref(resp.settings);
    json_decref(resp.conversation);
    json_decref(resp.input);
    return r;
}

/* ---- embeddings --------------------------------------------------------------------------- */

/* POST /v1/embeddings: the inputs' jobs admitted together (or refused at once, as a request's
 * choices are), waited for while the client stays, answered in one piece. */
static enum MHD_Result embeddings(serve_conn *cn, struct MHD_Connection *c, json_t *root) {
    serve_server *s = cn->srv;
    const serve_runtime *rt = serve_worker_runtime(s->worker);
    serve_embed_request req;
    serve_error e;
    serve_choices cs = {0};
    int lanes = rt->n_parallel < s->o.max_pending ? rt->n_parallel : s->o.max_pending;
    bool ok = serve_embed_parse(root, s->model_ids, rt, &req, &e) &&
              serve_embed_jobs(rt, &req, rt->pooling, lanes, &cs.job, &cs.n, &e);
    const char *model = answer_model(cn, req.model);
    if (ok) { /* the adapters an embedding runs with: its model's, else the defaults */
        serve_request named = {.model = req.model};
        float lora[TS_MAX_LORA];
        ok = serve_lora_scales(&s->lora, &named, lora, &e);
        for (int i = 0; ok && i < cs.n; i++) {
            memcpy(cs.job[i]->lora, lora, sizeof lora);
            cs.job[i]->lora_tag = serve_lora_tag(lora, s->lora.n);
        }
    }
    bool base64 = req.base64;
    int dims = req.dims;
    serve_embed_request_free(&req);
    prep_done(cn); /* the jobs hold their token ids: the body and its tree are gone */
    if (ok) ok = admit(s, &cs, &e);
    if (!ok) {
        choices_free(&cs);
        return serve_send_error(cn, c, &e);
    }
    atomic_fetch_add(&s->open_jobs, 1);
    const serve_job *failed;
    if (!wait_jobs(cn, c, &cs, &failed)) return MHD_NO;
    enum MHD_Result r;
    if (failed) {
        job_error(failed, &e);
        r = serve_send_error(cn, c, &e);
    } else {
        char *body = serve_embed_answer(cs.job, cs.n, rt->n_embd_out, dims, model, base64);
        r = body ? serve_send_json(cn, c, 200, body)
                 : (serve_fail(&e, 500, "internal_error", NULL, "out of memory"),
                    serve_send_error(cn, c, &e));
    }
    choices_free(&cs);
    atomic_fetch_sub(&s->open_jobs, 1);
    return r;
}

/* ---- tokenize / detokenize ---------------------------------------------------------------- */

/* A chat request's prompt as /v1/chat/completions renders and tokenizes it, images as the
 * tokens their plans take (root is borrowed). False with *e set. */
static bool chat_prompt_ids(serve_server *s, const serve_runtime *rt, json_t *root, int32_t **ids,
                            size_t *n, serve_error *e) {
    serve_request req;
    json_incref(root);
    bool ok = serve_request_parse(SERVE_API_CHAT, root, s->model_ids, 0, &req, e);
    serve_images im = {0};
    if (ok) ok = fetch_media(s, &req, e);
    if (ok) ok = serve_chat_ids(rt, &req, &im, ids, n, e);
    serve_images_free(&im);
    serve_request_free(&req);
    return ok;
}

/* llama-server's with_pieces: each token as {"id", "piece"}, the piece its text, or its bytes
 * as a list of numbers where they are not whole UTF-8 (a part of a character). */
static json_t *token_pieces(const ts_tokenizer *tok, const int32_t *ids, size_t n) {
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
        size_t len = 0;
        const char *t = ts_tokenizer_token_bytes(tok, ids[i], &len);
        if (!t) len = 0;
        json_t *piece = ts_utf8_valid(t, len) ? json_stringn(t ? t : "", len) : json_array();
        for (size_t k = 0; json_is_array(piece) && k < len; k++)
            json_array_append_new(piece, json_integer((unsigned char)t[k]));
        if (json_array_append_new(
                arr, json_pack("{s:i, s:o}", "id", (int)ids[i], "piece", piece)) != 0) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

/* An optional boolean field; false with *e set when it is there and not a boolean. */
static bool opt_bool(const json_t *root, const char *name, bool *v, serve_error *e) {
    const json_t *f = json_object_get(root, name);
    if (f && !json_is_boolean(f))
        return serve_fail(e, 400, "invalid_value", name, "'%s' must be a boolean", name);
    if (f) *v = json_is_true(f);
    return true;
}

static enum MHD_Result tokenize(serve_conn *cn, struct MHD_Connection *c, json_t *root) {
    serve_server *s = cn->srv;
    const serve_runtime *rt = serve_worker_runtime(s->worker);
    serve_error e;
    int32_t *ids = NULL;
    size_t n = 0;
    /* llama-server's {"content"} adds no BOS/EOS unless add_special; vLLM's {"prompt"} adds
     * them unless add_special_tokens is false */
    const json_t *text = json_object_get(root, "content");
    bool llama_form = text != NULL;
    if (!text) text = json_object_get(root, "prompt");
    const json_t *msgs = json_object_get(root, "messages");
    bool parse_special = true, add_special = !llama_form, pieces = false;
    if (!opt_bool(root, "parse_special", &parse_special, &e) ||
        !opt_bool(root, "add_special", &add_special, &e) ||
        !opt_bool(root, "add_special_tokens", &add_special, &e) ||
        !opt_bool(root, "with_pieces", &pieces, &e)) {
        /* e is set */
    } else if (json_is_string(text)) {
        const char *t = json_string_value(text);
        size_t len = json_string_length(text);
        ts_status st = add_special ? ts_tokenize(rt->tok, t, len, parse_special, &ids, &n)
                                   : ts_tokenize_bare(rt->tok, t, len, parse_special, &ids, &n);
        if (st != TS_OK)
            serve_fail(&e, 400, "invalid_value", llama_form ? "content" : "prompt", "%s",
                       ts_last_error());
        else
            e.status = 0;
    } else if (msgs && !text) {
        if (chat_prompt_ids(s, rt, root, &ids, &n, &e)) e.status = 0;
    } else {
        serve_fail(&e, 400, "invalid_value", "content", "give 'content' (a string) or 'messages'");
    }
    json_decref(root);
    if (e.status) {
        free(ids);
        return serve_send_error(cn, c, &e);
    }
    json_t *arr = pieces ? token_pieces(rt->tok, ids, n) : json_array();
    for (size_t i = 0; !pieces && arr && i < n; i++)
        json_array_append_new(arr, json_integer(ids[i]));
    free(ids);
    json_t *out = arr ? json_pack("{s:o, s:i, s:i}", "tokens", arr, "count", (int)n,
                                  "max_model_len", rt->n_ctx)
                      : NULL;
    char *body = out ? json_dumps(out, JSON_COMPACT) : NULL;
    json_decref(out);
    return serve_send_json(cn, c, 200, body);
}

static enum MHD_Result detokenize(serve_conn *cn, struct MHD_Connection *c, json_t *root) {
    serve_server *s = cn->srv;
    const serve_runtime *rt = serve_worker_runtime(s->worker);
    serve_error e;
    const json_t *arr = json_object_get(root, "tokens");
    if (!json_is_array(arr)) {
        json_decref(root);
        serve_fail(&e, 400, "invalid_value", "tokens", "'tokens' must be a list of token ids");
        return serve_send_error(cn, c, &e);
    }
    size_t n = json_array_size(arr), i;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    const json_t *v;
    bool ok = ids != NULL;
    json_array_foreach(arr, i, v) {
        if (!ok) break;
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= rt->n_vocab) {
            ok = serve_fail(&e, 400, "invalid_value", "tokens", "tokens[%zu] is not a token id "
                            "in [0, %d)", i, rt->n_vocab);
            break;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    if (!ids) serve_fail(&e, 500, "internal_error", NULL, "out of memory");
    json_decref(root);
    char *text = NULL;
    size_t len = 0;
    if (ok && ts_detokenize(rt->tok, ids, n, false, &text, &len) != TS_OK)
        ok = serve_fail(&e, 400, "invalid_value", "tokens", "%s", ts_last_error());
    free(ids);
    if (!ok) {
        free(text);
        return serve_send_error(cn, c, &e);
    }
    ts_strbuf clean = {0};
    ts_utf8_append_lossy(&clean, text ? text : "", len);
    free(text);
    json_t *out = json_pack("{s:s%}", "content", clean.data ? clean.data : "", clean.len);
    ts_strbuf_free(&clean);
    char *body = out ? json_dumps(out, JSON_COMPACT) : NULL;
    json_decref(out);
    return serve_send_json(cn, c, 200, body);
}

/* POST /v1/messages/count_tokens (Anthropic's): {"input_tokens": N}, the tokens of the prompt a
 * Messages request becomes (its images' as they take). */
static enum MHD_Result count_tokens(serve_conn *cn, struct MHD_Connection *c, json_t *root) {
    serve_server *s = cn->srv;
    const serve_runtime *rt = serve_worker_runtime(s->worker);
    serve_error e;
    serve_msg_read md;
    int32_t *ids = NULL;
    size_t n = 0;
    bool ok = serve_msg_request(root, true, &md, &e);
    json_decref(root);
    if (ok && !chat_prompt_ids(s, rt, md.chat, &ids, &n, &e)) {
        serve_msg_error(&md, &e);
        ok = false;
    }
    serve_msg_read_free(&md);
    free(ids);
    if (!ok) return serve_send_error(cn, c, &e);
    json_t *out = json_pack("{s:I}", "input_tokens", (json_int_t)n);
    char *body = out ? json_dumps(out, JSON_COMPACT) : NULL;
    json_decref(out);
    return serve_send_json(cn, c, 200, body);
}

/* POST /apply-template (llama-server's): the prompt text a chat request becomes, without
 * running it - the template's rendering as the model reads it (each image as the image tokens
 * its plan takes, as /tokenize counts them). */
static enum MHD_Result apply_template(serve_conn *cn, struct MHD_Connection *c, json_t *root) {
    serve_server *s = cn->srv;
    const serve_runtime *rt = serve_worker_runtime(s->worker);
    serve_error e;
    int32_t *ids = NULL;
    size_t n = 0;
    char *text = NULL;
    size_t len = 0;
    bool ok = chat_prompt_ids(s, rt, root, &ids, &n, &e);
    json_decref(root);
    if (ok && ts_detokenize(rt->tok, ids, n, false, &text, &len) != TS_OK)
        ok = serve_fail(&e, 500, "internal_error", NULL, "%s", ts_last_error());
    free(ids);
    if (!ok) return serve_send_error(cn, c, &e);
    json_t *out = json_pack("{s:s%}", "prompt", text, len);
    free(text);
    char *body = out ? json_dumps(out, JSON_COMPACT) : NULL;
    json_decref(out);
    return serve_send_json(cn, c, 200, body);
}

/* POST /lora-adapters (llama-server's): the scales every request that says nothing gets. */
static enum MHD_Result set_lora_adapters(serve_conn *cn, struct MHD_Connection *c, json_t *root) {
    serve_error e;
    bool ok = serve_lora_set(&cn->srv->lora, root, &e);
    json_decref(root);
    if (!ok) return serve_send_error(cn, c, &e);
    json_t *out = serve_lora_list(&cn->srv->lora);
    char *body = out ? json_dumps(out, JSON_COMPACT) : NULL;
    json_decref(out);
    return serve_send_json(cn, c, 200, body);
}

enum MHD_Result serve_route_post(serve_conn *cn, struct MHD_Connection *c) {
    serve_error e = {0};
    json_t *root;
    if (!prep_take(cn, c, &e)) return e.status ? serve_send_error(cn, c, &e) : MHD_NO;
    enum MHD_Result r;
    bool parsed = cn->route == ROUTE_LORA_ADAPTERS /* its body is a list */
                      ? serve_json_parse_value(cn->body.data, cn->body.len, &root, &e)
                      : serve_json_parse(cn->body.data, cn->body.len, &root, &e);
    if (!parsed) {
        r = serve_send_error(cn, c, &e);
    } else {
        ts_strbuf_free(&cn->body);
        serve_recv_done(cn);
        switch (cn->route) {
        case ROUTE_CHAT: r = generate(cn, c, SERVE_API_CHAT, root, WIRE_OPENAI); break;
        case ROUTE_COMPLETIONS: r = generate(cn, c, SERVE_API_COMPLETION, root, WIRE_OPENAI); break;
        case ROUTE_RESPONSES: r = generate(cn, c, SERVE_API_CHAT, root, WIRE_RESPONSES); break;
        case ROUTE_INFILL: r = generate(cn, c, SERVE_API_COMPLETION, root, WIRE_INFILL); break;
        case ROUTE_COMPLETION: r = generate(cn, c, SERVE_API_COMPLETION, root, WIRE_LLAMA); break;
        case ROUTE_LORA_ADAPTERS: r = set_lora_adapters(cn, c, root); break;
        case ROUTE_TOKENIZE: r = tokenize(cn, c, root); break;
        case ROUTE_EMBEDDINGS: r = embeddings(cn, c, root); break;
        case ROUTE_APPLY_TEMPLATE: r = apply_template(cn, c, root); break;
        case ROUTE_MESSAGES: r = generate(cn, c, SERVE_API_CHAT, root, WIRE_MESSAGES); break;
        case ROUTE_MESSAGES_COUNT: r = count_tokens(cn, c, root); break;
        default: r = detokenize(cn, c, root); break;
        }
    }
    prep_done(cn); /* generate() gave it back already; tokenize and the rest here */
    return r;
}

/* ---- GET routes ------------------------------------------------------------------------- */

static json_t *model_json(const serve_server *s, const serve_runtime *rt, const char *id) {
    return json_pack("{s:s, s:s, s:I, s:s, s:i}", "id", id, "object", "model", "created",
                     (json_int_t)s->started, "owned_by", "tessera", "context_length", rt->n_ctx);
}

/* GET /props (llama-server's): what a client may want to know of the server before it asks -
 * the model's names, the context, how many requests decode together, the defaults a request
 * leaves out gets, and what the model reads besides text. */
static json_t *props_json(const serve_server *s, const serve_runtime *rt) {
    json_t *params = json_pack(
        "{s:f, s:f, s:i, s:f, s:f, s:f, s:f}", "temperature", SERVE_DEFAULT_TEMPERATURE, "top_p",
        SERVE_DEFAULT_TOP_P, "top_k", SERVE_DEFAULT_TOP_K, "min_p", SERVE_DEFAULT_MIN_P,
        "presence_penalty", SERVE_DEFAULT_PRESENCE_PENALTY, "frequency_penalty",
        SERVE_DEFAULT_FREQUENCY_PENALTY, "repetition_penalty", SERVE_DEFAULT_REPETITION_PENALTY);
    if (params)
        json_object_set_new(params, "max_tokens",
                            s->o.max_tokens_cap > 0 ? json_integer(s->o.max_tokens_cap)
                                                    : json_null());
    if (params) { /* -1: no bound; the efforts that give a budget of their own */
        json_object_set_new(params, "thinking_token_budget", json_integer(s->o.reasoning_budget));
        json_t *eb = json_object();
        for (int k = SERVE_EFFORT_MINIMAL; eb && k < SERVE_EFFORTS; k++)
            if (s->o.effort_budget[k] != SERVE_THINK_BUDGET_UNSET)
                json_object_set_new(eb, serve_effort_names[k], json_integer(s->o.effort_budget[k]));
        if (eb) json_object_set_new(params, "reasoning_effort_budgets", eb);
        json_object_set_new(params, "reasoning_format",
                            json_string(s->o.reasoning_inline ? "none" : "deepseek"));
    }
    return json_pack("{s:s, s:s, s:i, s:{s:i, s:o}, s:{s:b, s:b, s:b}, s:b, s:s}", "model_alias",
                     s->model_ids[0], "model_path", s->o.model_path, "total_slots", rt->n_parallel,
                     "default_generation_settings", "n_ctx", rt->n_ctx, "params", params,
                     "modalities", "vision", rt->vision, "video",
                     rt->vision && rt->vinfo.video_token >= 0, "audio", 0, "embeddings",
                     rt->encoder, "device", rt->describe);
}

/* GET /v1/responses/{id}: a stored response, as it was answered; DELETE: forgotten, answered
 * with OpenAI's deletion object. 404 for one not kept. */
static enum MHD_Result stored_response(serve_conn *cn, struct MHD_Connection *c) {
    serve_server *s = cn->srv;
    const char *id = cn->model_asked;
    if (id[0] && cn->del && serve_rsp_store_delete(s->rsp_store, id)) {
        json_t *out = json_pack("{s:s, s:s, s:b}", "id", id, "object", "response", "deleted", 1);
        char *body = out ? json_dumps(out, JSON_COMPACT) : NULL;
        json_decref(out);
        return serve_send_json(cn, c, 200, body); /* NULL body: a 500 "out of memory" */
    }
    char *o = NULL;
    if (id[0] && !cn->del && serve_rsp_store_get(s->rsp_store, id, NULL, NULL, &o))
        return serve_send_json(cn, c, 200, o);
    serve_error e;
    serve_fail(&e, 404, "not_found", NULL,
               "Response with id '%.100s' not found (kept are the latest responses stored, up "
               "to --responses-store-mb, until a restart or a deletion)",
               id);
    return serve_send_error(cn, c, &e);
}

/* A query argument of the request as an integer in [lo, hi] (dflt when absent); false for one
 * that is not. */
static bool query_int(struct MHD_Connection *c, const char *name, long lo, long hi, long dflt,
                      long *out) {
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    char *end;
    *out = v ? strtol(v, &end, 10) : dflt;
    return !v || (*v && !*end && *out >= lo && *out <= hi);
}

/* GET /v1/responses/{id}/input_items: the stored response's input items, a page of them:
 * limit (1-100, default 20), order (desc, the default: the last item first; or asc), after /
 * before (an item id: the page starts after it, or ends before it, in that order). */
static enum MHD_Result input_items(serve_conn *cn, struct MHD_Connection *c) {
    serve_server *s = cn->srv;
    serve_error e;
    json_t *items = NULL;
    long limit;
    const char *order = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "order");
    const char *after = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after");
    const char *before = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "before");
    if (!query_int(c, "limit", 1, 100, 20, &limit))
        serve_fail(&e, 400, "invalid_value", "limit", "'limit' must be an integer in [1, 100]");
    else if (order && strcmp(order, "asc") != 0 && strcmp(order, "desc") != 0)
        serve_fail(&e, 400, "invalid_value", "order", "'order' must be 'asc' or 'desc'");
    else if (!cn->model_asked[0] ||
             !serve_rsp_store_get(s->rsp_store, cn->model_asked, NULL, &items, NULL))
        serve_fail(&e, 404, "not_found", NULL, "Response with id '%.100s' not found",
                   cn->model_asked);
    else
        e.status = 0;
    if (e.status) return serve_send_error(cn, c, &e);
    bool asc = order && !strcmp(order, "asc");
    long n = (long)json_array_size(items), from = after ? -1 : 0, to = before ? -1 : n;
    for (long k = 0; k < n; k++) { /* in the page's order */
        json_t *it = json_array_get(items, asc ? k : n - 1 - k);
        const char *id = json_string_value(json_object_get(it, "id"));
        if (after && id && !strcmp(id, after)) from = k + 1;
        if (before && id && !strcmp(id, before)) to = k;
    }
    if (from < 0 || to < 0) {
        json_decref(items);
        serve_fail(&e, 400, "invalid_value", from < 0 ? "after" : "before",
                   "'%s' names no input item of this response", from < 0 ? "after" : "before");
        return serve_send_error(cn, c, &e);
    }
    json_t *data = json_array();
    for (long k = from; k < to && k - from < limit; k++)
        json_array_append(data, json_array_get(items, asc ? k : n - 1 - k));
    long got = (long)json_array_size(data);
    const json_t *first = json_object_get(json_array_get(data, 0), "id");
    const json_t *last = json_object_get(json_array_get(data, (size_t)(got ? got - 1 : 0)), "id");
    json_t *out =
        json_pack("{s:s, s:o, s:O?, s:O?, s:b}", "object", "list", "data", data, "first_id",
                  got ? first : NULL, "last_id", got ? last : NULL, "has_more", from + got < to);
    json_decref(items);
    char *body = out ? json_dumps(out, JSON_COMPACT) : NULL;
    json_decref(out);
    return serve_send_json(cn, c, 200, body);
}

enum MHD_Result serve_route_get(serve_conn *cn, struct MHD_Connection *c) {
    serve_server *s = cn->srv;
    if (cn->route == ROUTE_HEALTH) return serve_send_json(cn, c, 200, strdup("{\"status\":\"ok\"}"));
    if (cn->route == ROUTE_METRICS) {
        ts_strbuf b = {0};
        if (serve_metrics_render(&s->metrics, &b) != TS_OK) {
            ts_strbuf_free(&b);
            return serve_send_json(cn, c, 500, NULL);
        }
        struct MHD_Response *r = MHD_create_response_from_buffer(b.len, b.data,
                                                                 MHD_RESPMEM_MUST_FREE);
        if (!r) {
            ts_strbuf_free(&b);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4");
        return serve_queue(cn, c, 200, r);
    }
    if (cn->route == ROUTE_RESPONSE) return stored_response(cn, c);
    if (cn->route == ROUTE_RESPONSE_ITEMS) return input_items(cn, c);
    const serve_runtime *rt = serve_worker_runtime(s->worker);
    json_t *out;
    if (cn->route == ROUTE_MODEL) { /* OpenAI's retrieve: the model, by a name it answers to */
        const char *id = NULL;      /* a name longer than the buffer left it empty: none */
        for (int i = 0; !id && cn->model_asked[0] && s->model_ids[i]; i++)
            if (!strcmp(cn->model_asked, s->model_ids[i]))
                id = s->model_ids[i];
            else if (!strcmp(s->model_ids[i], "*")) /* --any-model: the name asked */
                id = cn->model_asked;
        if (!id) {
            serve_error e;
            serve_fail(&e, 404, "model_not_found", "model",
                       "the model '%.100s' does not exist; this server runs '%s'", cn->model_asked,
                       s->model_ids[0]);
            return serve_send_error(cn, c, &e);
        }
        out = model_json(s, rt, id);
    } else if (cn->route == ROUTE_PROPS) {
        out = props_json(s, rt);
    } else if (cn->route == ROUTE_LORA_ADAPTERS) {
        out = serve_lora_list(&s->lora);
    } else {
        out =
            json_pack("{s:s, s:[o]}", "object", "list", "data", model_json(s, rt, s->model_ids[0]));
        /* vLLM's way: each adapter a request may name as its model, with the model its parent */
        for (int a = 0; out && a < s->lora.n; a++) {
            if (!s->lora.model_name[a]) continue;
            json_t *m = model_json(s, rt, s->lora.name[a]);
            if (m) {
                json_object_set_new(m, "parent", json_string(s->model_ids[0]));
                json_object_set_new(m, "root", json_string(s->lora.path[a]));
            }
            json_array_append_new(json_object_get(out, "data"), m);
        }
    }
    char *body = out ? json_dumps(out, JSON_COMPACT) : NULL;
    json_decref(out);
    return serve_send_json(cn, c, 200, body);
}
