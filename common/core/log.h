/* log.h - leveled, timestamped log lines on stderr, and release-mode asserts.
 * The level comes from FERRY_LOG (error|warn|info|debug) or ferry_log_set_level. */
#ifndef FERRY_LOG_H
#define FERRY_LOG_H

#include "ferry/status.h"

typedef enum ferry_log_level {
    FERRY_LOG_LEVEL_ERROR = 0,
    FERRY_LOG_LEVEL_WARN  = 1,
    FERRY_LOG_LEVEL_INFO  = 2,
    FERRY_LOG_LEVEL_DEBUG = 3,
} ferry_log_level;

/* Sets the process name printed on every line ("ferry-ps") and the level. */
void ferry_log_init(const char *progname);
void ferry_log_set_level(ferry_log_level level);
ferry_log_level ferry_log_get_level(void);
/* Parses "error", "warn", "info" or "debug"; FERRY_ERR_INVALID otherwise. */
ferry_status ferry_log_parse_level(const char *s, ferry_log_level *out);

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

/* Monotonic clock in seconds, for timing and progress. */
double ferry_now(void);

#endif /* FERRY_LOG_H */
