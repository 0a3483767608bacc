#include "serve/budget.h"

#include <time.h>

void serve_budget_init(serve_budget *b, size_t cap) {
    pthread_mutex_init(&b->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&b->cv, &ca);
    pthread_condattr_destroy(&ca);
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
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_mutex_lock(&b->mu);
    pthread_cond_timedwait(&b->cv, &b->mu, &ts);
    pthread_mutex_unlock(&b->mu);
}
