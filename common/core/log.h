/* log.h - leveled, timestamped log lines (stderr, or the host program's sink: see
 * include/ferry/log.h), release-mode asserts, and FERRY_NOMEM. */
#ifndef FERRY_LOG_H
#define FERRY_LOG_H

#include "ferry/log.h" /* levels, level setting, sinks */
#include "ferry/status.h"

/* Writes one line: "2026-11-22T04:00:00.123Z I ferry-ps: text". Thread-safe. */
void ferry_log(ferry_log_level level, const char *fmt, ...) FERRY_PRINTF(2, 3);

#define FERRY_LOG_ERROR(...) ferry_log(FERRY_LOG_LEVEL_ERROR, __VA_ARGS__)
#define FERRY_LOG_WARN(...)  ferry_log(FERRY_LOG_LEVEL_WARN, __VA_ARGS__)
#define FERRY_LOG_INFO(...)  ferry_log(FERRY_LOG_LEVEL_INFO, __VA_ARGS__)
#define FERRY_LOG_DEBUG(...)                                                     \
    do {                                                                         \
        if (ferry_log_get_level() >= FERRY_LOG_LEVEL_DEBUG)                      \
            ferry_log(FERRY_LOG_LEVEL_DEBUG, __VA_ARGS__);                       \
    } while (0)

/* The last line of a program that gives up (its main, on a bad command line or a
 * failed run): "prog: message" on stderr, without timestamp or level tag (it is the
 * answer to the command), or, when JSON logging is on (ferry_log_set_json), one JSON
 * object {"ts","level":"error","prog","msg"} like every other line. Written whatever
 * the log level; to the host program's sink when one is set. Thread-safe. */
void ferry_log_fatal(const char *fmt, ...) FERRY_PRINTF(1, 2);

/* Reports file, line and message, then aborts. For broken invariants only:
 * user and network input get a status code instead. */
FERRY_NORETURN void ferry_panic(const char *file, int line, const char *fmt, ...)
    FERRY_PRINTF(3, 4);

/* Stays on in release builds (ggml GGML_ASSERT, redis serverAssert). */
#define FERRY_ASSERT(c)                                                          \
    do {                                                                         \
        if (!(c))                                                                \
            ferry_panic(__FILE__, __LINE__, "assertion failed: %s", #c);         \
    } while (0)

/* An allocation failed: records "out of memory in FUNCTION (FILE:LINE)" as the calling
 * thread's detail (ferry_error_last) and returns FERRY_ERR_NOMEM, so that no
 * out-of-memory path leaves an older, unrelated message behind.
 *     if (buf == NULL)
 *         return FERRY_NOMEM(); */
#define FERRY_NOMEM() ferry__nomem(__func__, __FILE__, __LINE__)
ferry_status ferry__nomem(const char *func, const char *file, int line);
/* The status when a callee that allocates (ferry_grads_dense, ferry_arena_alloc, the
 * backend's alloc) returned NULL having said why itself: its detail stays. */
#define FERRY_NOMEM_SAID FERRY_ERR_NOMEM

/* Monotonic clock in seconds, for timing and progress. */
double ferry_now(void);

#endif /* FERRY_LOG_H */
