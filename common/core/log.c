/* log.c - one formatted line per call on stderr, written with a single fwrite
 * so that lines from several threads never interleave. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/core/log.h"

static _Atomic int log_level = FERRY_LOG_LEVEL_INFO;
static _Atomic int log_json; /* ferry_log_set_json */
static char log_prog[32] = "ferry";
/* The host program's sink, if any. Lines read it under the read lock, so a sink (and
 * its user pointer) is never swapped while a line is being handed to it. */
static pthread_rwlock_t log_route_lock = PTHREAD_RWLOCK_INITIALIZER;
static ferry_log_sink log_sink;
static void *log_sink_user;

void ferry_log_set_sink(ferry_log_sink sink, void *user) {
    pthread_rwlock_wrlock(&log_route_lock);
    log_sink = sink;
    log_sink_user = user;
    pthread_rwlock_unlock(&log_route_lock);
}

ferry_status ferry_log_parse_level(const char *s, ferry_log_level *out) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = (ferry_log_level)i;
            return FERRY_OK;
        }
    }
    return ferry_errorf(FERRY_ERR_INVALID, "unknown log level '%s' (error|warn|info|debug)", s);
}

void ferry_log_init(const char *progname) {
    if (progname != NULL)
        (void)snprintf(log_prog, sizeof log_prog, "%s", progname);
    const char *env = getenv("FERRY_LOG");
    ferry_log_level lv;
    if (env != NULL && ferry_log_parse_level(env, &lv) == FERRY_OK)
        ferry_log_set_level(lv);
    const char *fmt = getenv("FERRY_LOG_FORMAT");
    if (fmt != NULL && strcmp(fmt, "json") == 0)
        ferry_log_set_json(1);
}

void ferry_log_set_json(int on) {
    atomic_store(&log_json, on != 0);
}

void ferry_log_set_level(ferry_log_level level) {
    atomic_store(&log_level, (int)level);
}

ferry_log_level ferry_log_get_level(void) {
    return (ferry_log_level)atomic_load(&log_level);
}

static int log_prefix(char *buf, size_t cap, ferry_log_level level) {
    static const char tag[] = "EWID";
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    return snprintf(buf, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %c %s: ", tm.tm_year + 1900,
                    tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                    ts.tv_nsec / 1000000, tag[level], log_prog);
}

/* {"ts":"...","level":"info","prog":"ferry-ps","msg":"..."}: one JSON object per line,
 * the message escaped (quote, backslash, control bytes). */
static void log_write_json(ferry_log_level level, const char *fmt, va_list ap) {
    static const char *const names[] = {"error", "warn", "info", "debug"};
    char msg[2048], line[4600];
    (void)vsnprintf(msg, sizeof msg, fmt, ap);
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line,
                     "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"level\":\"%s\","
                     "\"prog\":\"%s\",\"msg\":\"",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, names[level], log_prog);
    size_t len = n > 0 ? (size_t)n : 0;
    for (const unsigned char *c = (const unsigned char *)msg; *c != '\0' && len < sizeof line - 16;
         c++) {
        if (*c == '"' || *c == '\\') {
            line[len++] = '\\';
            line[len++] = (char)*c;
        } else if (*c < 0x20) {
            len += (size_t)snprintf(line + len, sizeof line - len, "\\u%04x", *c);
        } else {
            line[len++] = (char)*c;
        }
    }
    memcpy(line + len, "\"}\n", 3);
    (void)fwrite(line, 1, len + 3, stderr);
}

static void log_json_line(ferry_log_level level, const char *fmt, ...) FERRY_PRINTF(2, 3);
static void log_json_line(ferry_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_write_json(level, fmt, ap);
    va_end(ap);
}

static void log_write(ferry_log_level level, const char *fmt, va_list ap) {
    char line[2048];
    pthread_rwlock_rdlock(&log_route_lock);
    if (log_sink != NULL) {
        (void)vsnprintf(line, sizeof line, fmt, ap);
        log_sink(log_sink_user, level, line);
        pthread_rwlock_unlock(&log_route_lock);
        return;
    }
    pthread_rwlock_unlock(&log_route_lock);
    if (atomic_load(&log_json)) {
        log_write_json(level, fmt, ap);
        return;
    }
    int n = log_prefix(line, sizeof line, level);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    (void)fwrite(line, 1, len, stderr);
}

void ferry_log(ferry_log_level level, const char *fmt, ...) {
    if ((int)level > atomic_load(&log_level))
        return;
    va_list ap;
    va_start(ap, fmt);
    log_write(level, fmt, ap);
    va_end(ap);
}

void ferry_log_fatal(const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_rwlock_rdlock(&log_route_lock);
    if (log_sink != NULL) {
        log_sink(log_sink_user, FERRY_LOG_LEVEL_ERROR, msg);
        pthread_rwlock_unlock(&log_route_lock);
        return;
    }
    pthread_rwlock_unlock(&log_route_lock);
    if (atomic_load(&log_json)) {
        log_json_line(FERRY_LOG_LEVEL_ERROR, "%s", msg);
        return;
    }
    char line[2200];
    int n = snprintf(line, sizeof line, "%s: %s\n", log_prog, msg);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    if (len > 0 && line[len - 1] != '\n')
        line[len - 1] = '\n'; /* cut: still one whole line */
    (void)fwrite(line, 1, len, stderr);
}

void ferry_panic(const char *file, int line, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ferry_log(FERRY_LOG_LEVEL_ERROR, "panic at %s:%d: %s", file, line, msg);
    abort();
}

ferry_status ferry__nomem(const char *func, const char *file, int line) {
    const char *base = strrchr(file, '/');
    return ferry_errorf(FERRY_ERR_NOMEM, "out of memory in %s (%s:%d)", func,
                        base != NULL ? base + 1 : file, line);
}

double ferry_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
