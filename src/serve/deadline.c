#include "serve/deadline.h"

#include "base/clock.h"

#include <stdlib.h>
#include <sys/socket.h>

/* How often the thread looks: a late request is closed within this of its deadline. */
#define SERVE_DEADLINE_TICK_MS 250

struct serve_deadline {
    serve_deadline *prev, *next;
    int fd;
    bool armed, shut;
    double since; /* when the request became expected */
    size_t body;  /* its body's bytes so far */
};

static bool late(const serve_deadlines *d, const serve_deadline *e, double now) {
    return e->armed && !e->shut &&
           now > e->since + d->timeout_s + (double)e->body / SERVE_DEADLINE_RATE;
}

/* A socket shut down in both directions wakes the connection's thread with an end of file:
 * libmicrohttpd then closes the connection as one whose client left. The fd stays the
 * connection's until serve_deadline_close (called before libmicrohttpd closes it), and both
 * run under the mutex, so the fd shut is never another's. */
static void *watch(void *arg) {
    serve_deadlines *d = arg;
    pthread_mutex_lock(&d->mu);
    while (!d->stop) {
        double now = ts_now_s();
        for (serve_deadline *e = d->head; e; e = e->next) {
            if (!late(d, e, now)) continue;
            shutdown(e->fd, SHUT_RDWR);
            e->shut = true;
            serve_metrics_event(d->metrics, 5);
        }
        struct timespec ts;
        ts_deadline_in_ms(&ts, SERVE_DEADLINE_TICK_MS);
        pthread_cond_timedwait(&d->cv, &d->mu, &ts);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

bool serve_deadlines_start(serve_deadlines *d, int timeout_s, serve_metrics *m) {
    pthread_mutex_init(&d->mu, NULL);
    ts_cond_init_monotonic(&d->cv);
    d->started = d->stop = false;
    d->timeout_s = timeout_s > 0 ? timeout_s : 0;
    d->head = NULL;
    d->metrics = m;
    if (d->timeout_s == 0) return true;
    d->started = pthread_create(&d->thread, NULL, watch, d) == 0;
    return d->started;
}

void serve_deadlines_stop(serve_deadlines *d) {
    if (d->started) {
        pthread_mutex_lock(&d->mu);
        d->stop = true;
        pthread_cond_signal(&d->cv);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->thread, NULL);
        d->started = false;
    }
    while (d->head) { /* none are left once the daemon has stopped; in case */
        serve_deadline *e = d->head;
        d->head = e->next;
        free(e);
    }
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
}

serve_deadline *serve_deadline_open(serve_deadlines *d, int fd) {
    if (d->timeout_s == 0 || fd < 0) return NULL;
    serve_deadline *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->fd = fd;
    e->armed = true;
    e->since = ts_now_s();
    pthread_mutex_lock(&d->mu);
    e->next = d->head;
    if (d->head) d->head->prev = e;
    d->head = e;
    pthread_mutex_unlock(&d->mu);
    return e;
}

void serve_deadline_close(serve_deadlines *d, serve_deadline *e) {
    if (!e) return;
    pthread_mutex_lock(&d->mu);
    if (e->prev)
        e->prev->next = e->next;
    else
        d->head = e->next;
    if (e->next) e->next->prev = e->prev;
    pthread_mutex_unlock(&d->mu);
    free(e);
}

void serve_deadline_arm(serve_deadlines *d, serve_deadline *e) {
    if (!e) return;
    double now = ts_now_s();
    pthread_mutex_lock(&d->mu);
    e->armed = true;
    e->since = now;
    e->body = 0;
    pthread_mutex_unlock(&d->mu);
}

void serve_deadline_body(serve_deadlines *d, serve_deadline *e, size_t n) {
    if (!e) return;
    pthread_mutex_lock(&d->mu);
    e->body += n;
    pthread_mutex_unlock(&d->mu);
}

void serve_deadline_disarm(serve_deadlines *d, serve_deadline *e) {
    if (!e) return;
    pthread_mutex_lock(&d->mu);
    e->armed = false;
    pthread_mutex_unlock(&d->mu);
}
