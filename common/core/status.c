/* status.c - status strings generated from FERRY_STATUS_MAP, and the per-thread
 * detail message that lets a caller print one precise line. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ferry/status.h"

static _Thread_local char last_error[1024];

const char *ferry_status_str(ferry_status s) {
    switch (s) {
#define FERRY_STATUS_CASE_(name, code, text)                                   \
    case FERRY_##name:                                                          \
        return text;
        FERRY_STATUS_MAP(FERRY_STATUS_CASE_)
#undef FERRY_STATUS_CASE_
    }
    return "unknown status";
}

ferry_status ferry_errorf(ferry_status st, const char *fmt, ...) {
    /* Format into a scratch buffer first: callers may pass ferry_error_last() as an
     * argument to prefix context ("step 12: %s"). */
    char msg[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(last_error, msg, sizeof msg);
    return st;
}

const char *ferry_error_last(void) {
    return last_error;
}

void ferry_error_clear(void) {
    last_error[0] = '\0';
}
