/* check.h - the test harness (after libuv's test/task.h). A test file defines
 * TEST(name) functions and lists them in FERRY_TEST_MAIN(...); the runner runs all
 * of them, or only the one named in argv[1]. Checks never depend on NDEBUG.
 * SKIP(msg) exits 77, which ctest reports as skipped (SKIP_RETURN_CODE). Floats are
 * compared bit for bit (CHECK_BITS_EQ, CHECK_SAME_BITS) or within a stated tolerance
 * (CHECK_NEAR, CHECK_CLOSE*), never with CHECK_EQ, which refuses them at compile time
 * (tests/integration/test_check_h.sh). */
#ifndef FERRY_CHECK_H
#define FERRY_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/status.h"

#define TEST(name) static void test_##name(void)

#define CHECK(c)                                                                 \
    do {                                                                         \
        if (!(c)) {                                                              \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #c); \
            abort();                                                             \
        }                                                                        \
    } while (0)

/* 1 when x has a floating type, 0 otherwise; x is not evaluated. */
#define FERRY_IS_FLOATING_(x) _Generic((x), float : 1, double : 1, long double : 1, default : 0)

/* Integers, enums and pointers, compared as long long. A floating-point operand is a
 * compile error: the conversion would truncate it (0.25f would equal 0), so say what
 * is meant with CHECK_BITS_EQ (bit-identical) or CHECK_NEAR (a tolerance). */
#define CHECK_EQ(a, b)                                                                             \
    do {                                                                                           \
        _Static_assert(!FERRY_IS_FLOATING_(a) && !FERRY_IS_FLOATING_(b),                           \
                       "CHECK_EQ on a floating-point operand: use CHECK_BITS_EQ or "               \
                       "CHECK_NEAR");                                                              \
        long long va_ = (long long)(a), vb_ = (long long)(b);                                      \
        if (va_ != vb_) {                                                                          \
            fprintf(stderr, "%s:%d: CHECK_EQ(%s, %s) failed: %lld != %lld\n", __FILE__, __LINE__,  \
                    #a, #b, va_, vb_);                                                             \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Two floats, or two doubles, with the same bits: -0.0 is not 0.0, and a NaN equals
 * only the same NaN. Mixing float and double is a compile error (write 0.25f). */
#define FERRY_FLOAT_KIND_(x) _Generic((x), float : 1, double : 2, default : 0)
#define CHECK_BITS_EQ(a, b)                                                                        \
    do {                                                                                           \
        _Static_assert(FERRY_FLOAT_KIND_(a) != 0 && FERRY_FLOAT_KIND_(a) == FERRY_FLOAT_KIND_(b),  \
                       "CHECK_BITS_EQ compares two floats or two doubles");                        \
        double va_ = (double)(a), vb_ = (double)(b); /* exact for a float */                       \
        if (memcmp(&va_, &vb_, sizeof va_) != 0) {                                                 \
            fprintf(stderr, "%s:%d: CHECK_BITS_EQ(%s, %s) failed: %a != %a\n", __FILE__, __LINE__, \
                    #a, #b, va_, vb_);                                                             \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                    \
    do {                                                                         \
        double va_ = (double)(a), vb_ = (double)(b);                             \
        if (!(fabs(va_ - vb_) <= (double)(tol))) {                               \
            fprintf(stderr, "%s:%d: CHECK_NEAR(%s, %s) failed: %.9g vs %.9g (tol %g)\n", \
                    __FILE__, __LINE__, #a, #b, va_, vb_, (double)(tol));        \
            abort();                                                             \
        }                                                                        \
    } while (0)

#define CHECK_OK(expr)                                                           \
    do {                                                                         \
        ferry_status st_ = (expr);                                               \
        if (st_ != FERRY_OK) {                                                   \
            fprintf(stderr, "%s:%d: %s returned %s (%s)\n", __FILE__, __LINE__,  \
                    #expr, ferry_status_str(st_), ferry_error_last());           \
            abort();                                                             \
        }                                                                        \
    } while (0)

#define CHECK_STATUS(expr, want)                                                 \
    do {                                                                         \
        ferry_status st_ = (expr);                                               \
        if (st_ != (want)) {                                                     \
            fprintf(stderr, "%s:%d: %s returned %s, want %s\n", __FILE__, __LINE__, \
                    #expr, ferry_status_str(st_), ferry_status_str(want));       \
            abort();                                                             \
        }                                                                        \
    } while (0)

#define SKIP(msg)                                                                \
    do {                                                                         \
        fprintf(stderr, "SKIP: %s\n", msg);                                      \
        exit(77);                                                                \
    } while (0)

/* Elementwise |a-b| <= atol + rtol*|b| over n floats; prints the worst element. */
int ferry_check_close(const char *what, const float *a, const double *b, long n, double atol,
                      double rtol);
int ferry_check_close_f(const char *what, const float *a, const float *b, long n, double atol,
                        double rtol);
#define CHECK_CLOSE(what, a, b, n, atol, rtol) CHECK(ferry_check_close(what, a, b, n, atol, rtol))
#define CHECK_CLOSE_F(what, a, b, n, atol, rtol)                                 \
    CHECK(ferry_check_close_f(what, a, b, n, atol, rtol))

/* n floats against n floats, bit for bit; prints the first element that differs and
 * how many do. */
int ferry_check_bits_f(const char *what, const float *a, const float *b, long n);
#define CHECK_SAME_BITS(what, a, b, n) CHECK(ferry_check_bits_f(what, a, b, n))

/* n floats against the float64 tensor at `path` under `node` of a reference-vector
 * file (tests/support/json.h): the element count must match and every element pass
 * ferry_check_close. */
struct ferry_json;
int ferry_check_json(const struct ferry_json *node, const char *path, const float *got, long n,
                     double atol, double rtol);

/* ||a - b|| / ||b|| over n floats, in double (two runs' parameters, say). */
double ferry_norm_rel(const float *a, const float *b, long n);

/* Path of a file in the source tree: ferry_test_path("tests/data/x.json"). */
const char *ferry_test_path(const char *rel);

typedef struct ferry_test_case {
    const char *name;
    void (*fn)(void);
} ferry_test_case;

int ferry_test_run(int argc, char **argv, const ferry_test_case *cases, int n);

#define FERRY_TEST_ENTRY_(name) {#name, test_##name},
#define FERRY_TEST_MAIN(...)                                                     \
    int main(int argc, char **argv) {                                            \
        static const ferry_test_case cases_[] = {__VA_ARGS__};                   \
        return ferry_test_run(argc, argv, cases_,                                \
                              (int)(sizeof cases_ / sizeof cases_[0]));          \
    }
#define T(name) FERRY_TEST_ENTRY_(name)

#endif /* FERRY_CHECK_H */
