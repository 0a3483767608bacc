#include "serve/budget.h"

#include "base/clock.h"

void serve_budget_init(serve_budget *b, size_t cap) {
    pthread_mutex_init(&b->mu, NULL);
    ts_cond_init_monotonic(&b->cv);
    b->used = 0;
    b->cap = cap;
}

void serve_budget_free(serve_budget *b) {
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
}

bool serve_budget_try(serve_budget *b, size_t n) {
    pthread_mutex_lock(&b->mu);
    bool fits = b->used == 0 || (n <= b->cap && b->used <= b->cap - n);
    if (fits) b->used += n;
    pthread_mutex_unlock(&b->mu);
    return fits;
}

void serve_budget_give(serve_budget *b, size_t n) {
    pthread_mutex_lock(&b->mu);
    b->used -= n < b->used ? n : b->used;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

void serve_budget_wait(serve_budget *b, int ms) {
    struct timespec ts;
    ts_deadline_in_ms(&ts, ms);
    pthread_mutex_lock(&b->mu);
    pthread_cond_timedwait(&b->cv, &b->mu, &ts);
    pthread_mutex_unlock(&b->mu);
}
