/* The thinking budget (tessera.h): a count of the tokens inside <think> ... </think>, and the
 * end put in once it reaches the budget. Shared by the server's lanes and `tessera chat`. */
#include "tessera.h"

void ts_think_budget_init(ts_think_budget *b, int32_t open, int32_t close, int budget,
                          const int32_t *end, int n_end, bool thinking) {
    bool on = budget >= 0 && n_end > 0 && open >= 0 && close >= 0;
    *b = (ts_think_budget){.open = open,
                           .close = close,
                           .budget = on ? budget : -1,
                           .end = end,
                           .n_end = n_end,
                           .thinking = thinking,
                           .end_at = on && thinking && budget == 0 ? 0 : -1};
}

int32_t ts_think_budget_forced(const ts_think_budget *b) {
    return b->end_at >= 0 ? b->end[b->end_at] : -1;
}

void ts_think_budget_token(ts_think_budget *b, int32_t id, bool mid_char) {
    bool was = b->thinking;
    if (id == b->open) b->thinking = true;
    if (id == b->close) b->thinking = false;
    if (b->budget < 0) return;
    if (b->end_at >= 0) { /* a token of the end, put in */
        if (++b->end_at == b->n_end) b->end_at = -1;
        return;
    }
    if (was) b->thought++;
    /* the budget spent, and the thinking goes on: the end, once the text is between two
     * characters (or 3 tokens later at most) */
    if (b->thinking && b->thought >= b->budget && (b->thought >= b->budget + 3 || !mid_char))
        b->end_at = 0;
}
