/* serve/budget.c: takes fit beside those held or wait; one larger than the whole budget goes
 * alone; and under eight threads taking and giving at random, what is held never passes the
 * budget and every take eventually gets through. */
#include "serve/budget.h"
#include "testutil.h"

#include <stdatomic.h>
#include <stdint.h>

#define CAP 1000

static serve_budget budget;
static atomic_long held, peak;
static atomic_int done_takes;

static uint64_t rng_next(uint64_t *r) {
    *r ^= *r << 13, *r ^= *r >> 7, *r ^= *r << 17;
    return *r;
}

static void *worker(void *arg) {
    uint64_t r = 0x9E3779B97F4A7C15ull * (uint64_t)(uintptr_t)arg + 1;
    for (int i = 0; i < 2000; i++) {
        size_t n = rng_next(&r) % 400 + 1;
        while (!serve_budget_try(&budget, n))
            serve_budget_wait(&budget, 1);
        long h = atomic_fetch_add(&held, (long)n) + (long)n, p = atomic_load(&peak);
        while (h > p && !atomic_compare_exchange_weak(&peak, &p, h)) {
        }
        atomic_fetch_sub(&held, (long)n);
        serve_budget_give(&budget, n);
        atomic_fetch_add(&done_takes, 1);
    }
    return NULL;
}

int main(void) {
    serve_budget_init(&budget, CAP);
    CHECK(serve_budget_try(&budget, 600));
    CHECK(!serve_budget_try(&budget, 401)); /* 1001 held would pass the budget */
    CHECK(serve_budget_try(&budget, 400));  /* exactly the budget */
    CHECK(!serve_budget_try(&budget, 1));
    serve_budget_give(&budget, 600);
    CHECK(!serve_budget_try(&budget, 601));
    serve_budget_give(&budget, 400);
    CHECK(serve_budget_try(&budget, 5000)); /* larger than the budget: alone, once empty */
    CHECK(!serve_budget_try(&budget, 1));
    serve_budget_give(&budget, 5000);
    CHECK(serve_budget_try(&budget, 0) && serve_budget_try(&budget, CAP));
    serve_budget_give(&budget, CAP);

    pthread_t t[8];
    for (uintptr_t i = 0; i < 8; i++)
        pthread_create(&t[i], NULL, worker, (void *)(i + 1));
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    /* (how much was held at once depends on the scheduling: under a sanitizer beside other
     * tests the threads can run one after another) */
    CHECKF(atomic_load(&peak) <= CAP, "held %ld at once", atomic_load(&peak));
    CHECK(atomic_load(&done_takes) == 8 * 2000);
    CHECK(serve_budget_try(&budget, CAP)); /* all given back */
    serve_budget_free(&budget);
    return tu_report("test_serve_budget");
}
