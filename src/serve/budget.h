/* A budget of bytes that threads take from and give back: the memory that requests being
 * parsed and prepared may hold together (serve/routes.c). Thread-safe. */
#ifndef TS_SERVE_BUDGET_H
#define TS_SERVE_BUDGET_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled when bytes are given back */
    size_t used, cap;
} serve_budget;

void serve_budget_init(serve_budget *b, size_t cap);
void serve_budget_free(serve_budget *b);
/* Takes n bytes if they fit beside those taken - or, when none are taken, whatever n is (a
 * take larger than the budget waits for it to be empty rather than forever); false, taking
 * nothing, where they do not fit now. */
bool serve_budget_try(serve_budget *b, size_t n);
void serve_budget_give(serve_budget *b, size_t n);
/* Waits up to ms milliseconds for bytes to be given back (a caller's slice: it then tries again
 * and looks at whatever else it waits on). */
void serve_budget_wait(serve_budget *b, int ms);

#endif
