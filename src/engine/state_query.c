/* Sizing queries a server needs before it creates an engine (e.g. how many snapshot slots fit
 * in a memory budget). */
#include "model/model.h"

size_t ts_model_state_bytes(const ts_model *model, int n_ctx) {
    return model && n_ctx > 0 ? model->arch->state_bytes(model, n_ctx) : 0;
}
