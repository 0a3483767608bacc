/* serve_run: starts the worker (which loads the model on its own thread) and the HTTP daemon,
 * then waits for SIGTERM/SIGINT and shuts down in order: stop accepting, drain with a
 * deadline, cancel the rest, join, exit 0. */
#include "serve/fetch.h"
#include "serve/http.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void serve_opts_default(serve_opts *o) {
    *o = (serve_opts){.host = "127.0.0.1",
                      .cors_origins = "*",
                      .port = 8080,
                      .max_pending = 32,
                      .max_body = 4u << 20,
                      .idle_timeout_s = 30,
                      .send_timeout_s = 600,
                      .request_timeout_s = 60,
                      .max_connections = 1024,
                      .cache_mb = 1024,
                      .responses_store_mb = 64,
                      .draft_max = 8,
                      .reasoning_budget = -1,
                      .effort_budget = {SERVE_THINK_BUDGET_UNSET, SERVE_THINK_BUDGET_UNSET,
                                        SERVE_THINK_BUDGET_UNSET, SERVE_THINK_BUDGET_UNSET,
                                        SERVE_THINK_BUDGET_UNSET},
                      .media_url_max_mb = 32,
                      .media_url_timeout_s = 10,
                      .drain_ms = 10000};
}

/* The model's name: the last component of its path. */
static void base_name(const char *path, char *out, size_t size) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    snprintf(out, size, "%.*s", (int)(n - b), path + b);
}

int serve_run(const serve_opts *opts) {
    serve_server *s = calloc(1, sizeof *s);
    if (!s) return 2;
    s->o = *opts;
    serve_fetch_global_init(); /* before any thread: libcurl's global state */
    static char dir_name[256];
    base_name(opts->model_path, dir_name, sizeof dir_name);
    int n = 0;
    for (int i = 0; i < opts->n_alias; i++)
        s->model_ids[n++] = opts->alias[i];
    bool dir_too = true;
    for (int i = 0; i < n; i++)
        dir_too &= strcmp(s->model_ids[i], dir_name) != 0;
    if (dir_too) s->model_ids[n++] = dir_name;
    serve_lora_init(&s->lora, &opts->lora);
    for (int a = 0; a < s->lora.n; a++) /* --lora-modules: a name a request may ask for */
        if (s->lora.model_name[a]) s->model_ids[n++] = s->lora.name[a];
    if (opts->any_model) s->model_ids[n++] = "*";
    s->model_ids[n] = NULL;
    s->started = (long long)time(NULL);
    atomic_init(&s->shutting_down, false);
    atomic_init(&s->open_jobs, 0);
    serve_metrics_init(&s->metrics);
    serve_budget_init(&s->prep, SERVE_PREP_BODIES * opts->max_body);
    serve_budget_init(&s->recv, SERVE_RECV_BODIES * opts->max_body);
    if (serve_rsp_store_create(opts->responses_store_mb << 20, &s->rsp_store) != TS_OK) {
        serve_lora_free(&s->lora);
        free(s);
        return 2;
    }

    /* every thread started from here on inherits the mask; only sigtimedwait below sees them */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    serve_worker_opts wo = {
        opts->model_path,    opts->n_ctx,         opts->n_threads,        opts->device,
        opts->max_pending,   opts->n_parallel,    opts->cache_mb << 20,   opts->step_delay_ms,
        opts->load_delay_ms, opts->prefill_chunk, opts->image_max_pixels, opts->draft_max,
        opts->draft_lookup,  opts->pooling,       opts->matryoshka,       opts->lora.n,
        opts->lora.path,     opts->draft_mtp};
    int rc = 0;
    bool deadlines_on = false;
    if (serve_worker_start(&wo, &s->metrics, &s->worker) != TS_OK) {
        fprintf(stderr, "tessera: serve: %s\n", ts_last_error());
        rc = 2;
        goto out;
    }
    unsigned port = 0;
    deadlines_on = true;
    if (!serve_deadlines_start(&s->deadlines, opts->request_timeout_s, &s->metrics)) {
        fprintf(stderr, "tessera: serve: cannot start the request deadlines' thread\n");
        rc = 2;
        goto out;
    }
    s->daemon = serve_http_start(s, &port);
    if (!s->daemon) {
        rc = 2;
        goto out;
    }
    fprintf(stderr, "tessera: serving '%s' on http://%s:%u (loading the model)\n", s->model_ids[0],
            opts->host, port);
    bool announced = false;
    for (;;) {
        struct timespec slice = {0, 100 * 1000000L};
        int sig = sigtimedwait(&set, NULL, &slice);
        if (sig == SIGTERM || sig == SIGINT) {
            fprintf(stderr, "tessera: serve: %s, shutting down\n", sig == SIGTERM ? "SIGTERM"
                                                                                 : "SIGINT");
            break;
        }
        serve_state st = serve_worker_state(s->worker);
        if (st == SERVE_FAILED) {
            fprintf(stderr, "tessera: serve: cannot load the model: %s\n",
                    serve_worker_error(s->worker));
            rc = 2;
            break;
        }
        if (st == SERVE_READY && !announced) {
            const serve_runtime *rt = serve_worker_runtime(s->worker);
            fprintf(stderr,
                    "tessera: ready: context %d, %s, %d requests at once, prefix snapshots in "
                    "%.0f MiB (each %.0f KiB + %.1f KiB a token)",
                    rt->n_ctx, rt->describe, rt->n_parallel, rt->snap_pool_bytes / 1048576.0,
                    rt->snap_fixed_bytes / 1024.0, rt->snap_token_bytes / 1024.0);
            if (rt->warm_ms > 0)
                fprintf(stderr, "; warmed up in %.0f ms%s", rt->warm_ms,
                        rt->warmed_vision ? " (the vision tower too)" : "");
            fprintf(stderr, "\n");
            announced = true;
        }
    }
    /* stop accepting connections; requests on open connections now get 503 */
    int lfd = MHD_quiesce_daemon(s->daemon);
    if (lfd >= 0) close(lfd);
    bool joined = serve_worker_shutdown(s->worker, opts->drain_ms, 2000);
    atomic_store(&s->shutting_down, true);
    /* let the connections send their jobs' final events before the sockets close */
    for (int i = 0; i < 100 && atomic_load(&s->open_jobs) > 0; i++) usleep(10000);
    MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
    if (!joined) {
        fprintf(stderr, "tessera: serve: the worker did not stop in time; exiting anyway\n");
        _exit(rc);
    }
out:
    if (s->daemon) MHD_stop_daemon(s->daemon);
    if (deadlines_on) serve_deadlines_stop(&s->deadlines); /* after the daemon's connections */
    serve_worker_free(s->worker);
    serve_metrics_free(&s->metrics);
    serve_budget_free(&s->prep);
    serve_budget_free(&s->recv);
    serve_rsp_store_free(s->rsp_store);
    serve_lora_free(&s->lora);
    free(s);
    return rc;
}
