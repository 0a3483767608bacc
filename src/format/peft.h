/* A PEFT LoRA adapter's adapter_config.json: what the scaling of its pairs depends on.
 *
 * PEFT (Hugging Face's parameter-efficient fine-tuning library) saves a LoRA adapter as a
 * directory: adapter_config.json and adapter_model.safetensors, whose tensors are named
 * `base_model.model.<module>.lora_A.weight` ([r, in]) and `....lora_B.weight` ([out, r]). A
 * module's output gains scale * B (A x), scale = lora_alpha / r, or lora_alpha / sqrt(r) with
 * use_rslora, lora_alpha replaced for the modules an `alpha_pattern` key names. The tensors in
 * the file are the truth about which modules are adapted and at what rank (target_modules,
 * rank_pattern and layers_to_transform only decided what was trained).
 *
 * Variants whose forward is not the plain one are refused with a message naming the field:
 * DoRA, fan_in_fan_out (GPT-2's Conv1D layout), trained biases, modules_to_save (whole modules
 * replaced), other PEFT types. */
#ifndef TS_FORMAT_PEFT_H
#define TS_FORMAT_PEFT_H

#include "base/status.h"

#include <stdbool.h>

typedef struct {
    char *pattern; /* a module name or the end of one, after a '.' */
    double alpha;
} ts_peft_alpha;

typedef struct {
    char *path; /* the config file, for messages */
    int r;
    double alpha;
    bool rslora;
    int n_alpha;
    ts_peft_alpha *alpha_pattern;
} ts_peft_config;

/* Reads dir/adapter_config.json. */
ts_status ts_peft_config_load(const char *dir, ts_peft_config *out);
void ts_peft_config_free(ts_peft_config *c);
/* The scale of the pair of module (its name without "base_model.model.") at rank r. */
double ts_peft_scale(const ts_peft_config *c, const char *module, int r);

#endif
