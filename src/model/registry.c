/* The architecture registry: one line per model family. */
#include <string.h>

#include "model/model.h"

extern const ts_arch ts_arch_qwen35;
extern const ts_arch ts_arch_gemma3;
extern const ts_arch ts_arch_gemma_embedding;

static const ts_arch *const archs[] = {
    &ts_arch_qwen35, &ts_arch_gemma3,
    &ts_arch_gemma_embedding, /* after gemma3: ts_arch_find_name finds that one */
};

const ts_arch *ts_arch_find_hf(const char *model_type) {
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (archs[i]->matches_hf && archs[i]->matches_hf(model_type)) return archs[i];
    return NULL;
}

const ts_arch *ts_arch_find_name(const char *name) {
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (strcmp(archs[i]->name, name) == 0) return archs[i];
    return NULL;
}

const ts_arch *ts_arch_find_gguf(const char *general_architecture) {
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (archs[i]->gguf_arch && strcmp(archs[i]->gguf_arch, general_architecture) == 0)
            return archs[i];
    return NULL;
}
