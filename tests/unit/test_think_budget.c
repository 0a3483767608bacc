/* The thinking budget (ts_think_budget): counting inside <think> ... </think>, the end put in
 * token by token, the wait for a character's bytes (3 tokens at most), thinking opened again,
 * and the cases that bound nothing. Ids: 1 <think>, 2 </think>, 7 the message, others text. */
#include "tessera.h"
#include "testutil.h"

enum { OPEN = 1, CLOSE = 2, MSG = 7, TEXT = 9 };

static const int32_t END[] = {MSG, CLOSE};

/* Feeds n free tokens of text (none forced may come in between). */
static void think(ts_think_budget *b, int n, bool mid_char) {
    for (int i = 0; i < n; i++) {
        CHECK(ts_think_budget_forced(b) == -1);
        ts_think_budget_token(b, TEXT, mid_char);
    }
}

/* Takes the end's tokens as the caller does: each forced one out. */
static void take_end(ts_think_budget *b) {
    for (int k = 0; k < 2; k++) {
        CHECK(ts_think_budget_forced(b) == END[k]);
        ts_think_budget_token(b, END[k], false);
    }
    CHECK(ts_think_budget_forced(b) == -1 && !b->thinking);
}

int main(void) {
    ts_think_budget b;
    /* the prompt ends inside <think>: 5 tokens, then the end, then free text */
    ts_think_budget_init(&b, OPEN, CLOSE, 5, END, 2, true);
    think(&b, 5, false);
    take_end(&b);
    think(&b, 10, false); /* the answer: no bound outside the thinking */
    /* thinking opened again counts on: its budget is spent, the end comes at once */
    ts_think_budget_token(&b, OPEN, false);
    take_end(&b);

    /* a budget that runs out inside a character waits for its bytes, 3 tokens at most */
    ts_think_budget_init(&b, OPEN, CLOSE, 2, END, 2, true);
    think(&b, 2, true);
    think(&b, 1, false); /* the character completes on the third */
    take_end(&b);
    ts_think_budget_init(&b, OPEN, CLOSE, 2, END, 2, true);
    think(&b, 5, true); /* never completes: the end after 3 more */
    take_end(&b);

    /* the model's own </think> ends the thinking before the budget: nothing put in */
    ts_think_budget_init(&b, OPEN, CLOSE, 5, END, 2, true);
    think(&b, 2, false);
    ts_think_budget_token(&b, CLOSE, false);
    think(&b, 10, false);
    CHECK(b.thought == 3); /* its </think> was thought too */

    /* budget 0: inside <think> at the start the end comes first; opened by the model, right
     * after its <think> */
    ts_think_budget_init(&b, OPEN, CLOSE, 0, END, 2, true);
    take_end(&b);
    ts_think_budget_init(&b, OPEN, CLOSE, 0, END, 2, false);
    think(&b, 3, false);
    ts_think_budget_token(&b, OPEN, false);
    take_end(&b);

    /* no bound: a negative budget, no end, no tags; the thinking is still followed */
    int32_t none[][3] = {{-1, 2, OPEN}, {5, 0, OPEN}, {5, 2, -1}};
    for (int k = 0; k < 3; k++) {
        ts_think_budget_init(&b, none[k][2], CLOSE, none[k][0], END, none[k][1], true);
        think(&b, 20, false);
        CHECK(b.budget == -1 && b.thinking);
    }
    return tu_report("test_think_budget");
}
