#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define TS_ERRMSG_MAX 1024

static _Thread_local char errmsg[TS_ERRMSG_MAX];

ts_status ts_error(ts_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg, sizeof errmsg, fmt, ap);
    va_end(ap);
    return code;
}

ts_status ts_error_prefix(ts_status code, const char *prefix) {
    char tmp[TS_ERRMSG_MAX];
    size_t lp = strlen(prefix);
    if (lp > TS_ERRMSG_MAX / 2) lp = TS_ERRMSG_MAX / 2;
    memcpy(tmp, prefix, lp);
    memcpy(tmp + lp, ": ", 2);
    size_t room = TS_ERRMSG_MAX - lp - 3, lm = strlen(errmsg);
    if (lm > room) lm = room;
    memcpy(tmp + lp + 2, errmsg, lm);
    tmp[lp + 2 + lm] = 0;
    memcpy(errmsg, tmp, sizeof errmsg);
    return code;
}

const char *ts_last_error(void) { return errmsg[0] ? errmsg : "no error"; }

const char *ts_status_name(ts_status st) {
    switch (st) {
    case TS_OK: return "ok";
    case TS_ERR_IO: return "io_error";
    case TS_ERR_FORMAT: return "format_error";
    case TS_ERR_UNSUPPORTED: return "unsupported";
    case TS_ERR_NOMEM: return "out_of_memory";
    case TS_ERR_INVALID: return "invalid_argument";
    case TS_ERR_RANGE: return "out_of_range";
    case TS_ERR_CANCELLED: return "cancelled";
    case TS_ERR_BUSY: return "busy";
    }
    return "unknown";
}
