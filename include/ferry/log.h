/* log.h - ferry's log lines, as a host program sees them. By default every line goes
 * to stderr as "2026-11-22T04:00:00.123Z I ferry-ps: text"; the level comes from the
 * environment (FERRY_LOG=error|warn|info|debug, read by ferry_log_init) or from
 * ferry_log_set_level. A program with its own logging routes the lines to it:
 *
 *     static void to_syslog(void *user, ferry_log_level lv, const char *line) {
 *         syslog(lv == FERRY_LOG_LEVEL_ERROR ? LOG_ERR : LOG_INFO, "%s", line);
 *     }
 *     ferry_log_set_sink(to_syslog, NULL);
 *     ferry_log_set_level(FERRY_LOG_LEVEL_WARN);
 */
#ifndef FERRY_LOG_PUBLIC_H
#define FERRY_LOG_PUBLIC_H

#include "ferry/export.h"
#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ferry_log_level {
    FERRY_LOG_LEVEL_ERROR = 0,
    FERRY_LOG_LEVEL_WARN = 1,
    FERRY_LOG_LEVEL_INFO = 2,
    FERRY_LOG_LEVEL_DEBUG = 3,
} ferry_log_level;

/* Sets the program name printed on every line ("ferry-ps"; NULL keeps it) and reads
 * the level from FERRY_LOG when set. */
FERRY_API void ferry_log_init(const char *progname);
/* Lines above level are dropped before they are formatted. Default: INFO. */
FERRY_API void ferry_log_set_level(ferry_log_level level);
FERRY_API ferry_log_level ferry_log_get_level(void);
/* Parses "error", "warn", "info" or "debug"; FERRY_ERR_INVALID otherwise. */
FERRY_API ferry_status ferry_log_parse_level(const char *s, ferry_log_level *out);

/* Receives each line that passes the level: the message alone, without timestamp,
 * level tag, program name or newline. Called on the thread that logs, possibly from
 * several threads at once (ferry-ps handlers, RPC threads): it must be thread-safe
 * and must not call back into ferry. */
/* 1: stderr lines are JSON objects {"ts","level","prog","msg"} (--log-format json,
 * or FERRY_LOG_FORMAT=json at ferry_log_init); 0: text (the default). */
FERRY_API void ferry_log_set_json(int on);
typedef void (*ferry_log_sink)(void *user, ferry_log_level level, const char *message);
/* Routes every later line to sink (NULL: back to stderr). Thread-safe: it waits for
 * lines being handed to the previous sink, which receives none afterwards. */
FERRY_API void ferry_log_set_sink(ferry_log_sink sink, void *user);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_LOG_PUBLIC_H */
