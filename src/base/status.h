/* Status codes and the thread-local error message.
 *
 * Every fallible function returns a ts_status (TS_OK == 0, errors negative). On error the
 * callee records one human-readable line naming the file, tensor, field or byte offset with
 * ts_error(); the caller reads it with ts_last_error(). The message is thread-local, so the
 * serving worker and the HTTP threads never see each other's errors. */
#ifndef TS_BASE_STATUS_H
#define TS_BASE_STATUS_H

#include "tessera.h"

#if defined(__GNUC__)
#define TS_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TS_PRINTF(a, b)
#endif

/* Records the message (printf-style) and returns code, so callers can write
 * `return ts_error(TS_ERR_FORMAT, "%s: tensor %s: ...", path, name);`. */
ts_status ts_error(ts_status code, const char *fmt, ...) TS_PRINTF(2, 3);

/* Prefixes the current message with "prefix: " (used to add the file name higher up). */
ts_status ts_error_prefix(ts_status code, const char *prefix);

#define TS_TRY(expr)                                                                               \
    do {                                                                                           \
        ts_status ts_try_st_ = (expr);                                                             \
        if (ts_try_st_ != TS_OK) return ts_try_st_;                                                \
    } while (0)

#endif
