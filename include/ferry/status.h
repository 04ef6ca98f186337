/* status.h - status codes shared by every fallible ferry function.
 * One X-macro table holds each code and its text so the two cannot drift apart.
 * A failing function may attach a detail message (ferry_errorf); callers print
 * ferry_error_last() next to ferry_status_str() for a one-line diagnosis. */
#ifndef FERRY_STATUS_H
#define FERRY_STATUS_H

#include "ferry/export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_STATUS_MAP(X)                                                                        \
    X(OK, 0, "success")                                                                            \
    X(ERR_NOMEM, -1, "out of memory")                                                              \
    X(ERR_INVALID, -2, "invalid argument")                                                         \
    X(ERR_SHAPE, -3, "tensor shape mismatch")                                                      \
    X(ERR_IO, -4, "I/O error")                                                                     \
    X(ERR_RPC, -5, "remote call failed")                                                           \
    X(ERR_TIMEOUT, -6, "deadline exceeded")                                                        \
    X(ERR_BUSY, -7, "object still in use")                                                         \
    X(ERR_BACKEND, -8, "backend (BLAS/CUDA) failure")                                              \
    X(ERR_NOT_FOUND, -9, "not found")                                                              \
    X(ERR_RANGE, -10, "value out of range")                                                        \
    X(ERR_FORMAT, -11, "malformed input")                                                          \
    X(ERR_EXISTS, -12, "already exists with a different configuration")                            \
    X(ERR_UNAVAILABLE, -13, "peer unavailable")                                                    \
    X(ERR_UNSUPPORTED, -14, "not supported")                                                       \
    X(ERR_NUMERIC, -15, "non-finite value")                                                        \
    X(ERR_RESOURCE, -16, "resource budget exhausted")                                              \
    X(ERR_AUTH, -17, "not authenticated")                                                          \
    X(ERR_DENIED, -18, "permission denied")                                                        \
    X(ERR_SESSION, -19, "session unknown or expired")                                              \
    X(ERR_ABORTED, -20, "aborted: a party it depends on left for good")

typedef enum ferry_status {
#define FERRY_STATUS_ENUM_(name, code, text) FERRY_##name = code,
    FERRY_STATUS_MAP(FERRY_STATUS_ENUM_)
#undef FERRY_STATUS_ENUM_
} ferry_status;

#if defined(__GNUC__)
#define FERRY_PRINTF(fmt_idx, arg_idx) __attribute__((format(printf, fmt_idx, arg_idx)))
#define FERRY_NORETURN __attribute__((noreturn))
#else
#define FERRY_PRINTF(fmt_idx, arg_idx)
#define FERRY_NORETURN
#endif

/* The fixed text of a status ("tensor shape mismatch"). Never NULL. */
FERRY_API const char *ferry_status_str(ferry_status s);

/* Records a detail message for the calling thread and returns st, so that
 * `return ferry_errorf(FERRY_ERR_IO, "cannot open %s", path);` reads naturally.
 * The message replaces the previous one; thread-safe (thread-local storage). */
FERRY_API ferry_status ferry_errorf(ferry_status st, const char *fmt, ...) FERRY_PRINTF(2, 3);

/* The calling thread's last detail message, or "" if none was set since
 * ferry_error_clear(). The pointer stays valid until the next ferry_errorf. */
FERRY_API const char *ferry_error_last(void);
FERRY_API void ferry_error_clear(void);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_STATUS_H */
