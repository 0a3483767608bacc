/* Request deadlines: a request's headers and body must arrive within a time, however its bytes
 * trickle in. libmicrohttpd's own timeout counts silence only, so a client that sends a byte now
 * and then would hold its connection (and one of --max-connections) for ever; and while the
 * headers arrive no handler of ours runs to notice. A thread of its own therefore looks over the
 * open connections and shuts down the socket of one whose request is late.
 *
 * A connection's deadline is armed from when a request is expected (the connection opened, or
 * the previous answer was sent) and disarmed once the whole request is in (the time an answer
 * takes is not its client's doing). It is timeout_s after arming, plus one second for every
 * SERVE_DEADLINE_RATE bytes of body that arrived: a large body on a slow but steady link is
 * not cut short. Thread-safe. */
#ifndef TS_SERVE_DEADLINE_H
#define TS_SERVE_DEADLINE_H

#include "serve/metrics.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SERVE_DEADLINE_RATE (16 * 1024) /* body bytes a second that keep a request in time */

typedef struct serve_deadline serve_deadline; /* one a connection */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* wakes the thread to stop */
    pthread_t thread;
    bool started, stop;
    double timeout_s; /* 0: no deadlines (nothing is registered, no thread runs) */
    serve_deadline *head;
    serve_metrics *metrics; /* counts the connections closed */
} serve_deadlines;

/* timeout_s <= 0 turns deadlines off. Returns false when the thread cannot start. */
bool serve_deadlines_start(serve_deadlines *d, int timeout_s, serve_metrics *m);
/* After the HTTP daemon has stopped (its connections are all closed). */
void serve_deadlines_stop(serve_deadlines *d);

/* A connection opened on socket fd: its first request is expected from now. NULL when deadlines
 * are off or memory ran out (the connection then has no deadline). */
serve_deadline *serve_deadline_open(serve_deadlines *d, int fd);
/* The connection is closing (before its socket is closed: its fd is not shut down after). */
void serve_deadline_close(serve_deadlines *d, serve_deadline *e);
/* A request is expected from now (an answer was sent on a kept-alive connection). */
void serve_deadline_arm(serve_deadlines *d, serve_deadline *e);
/* n more bytes of the request's body arrived. */
void serve_deadline_body(serve_deadlines *d, serve_deadline *e, size_t n);
/* The whole request is in. */
void serve_deadline_disarm(serve_deadlines *d, serve_deadline *e);

#endif
