/* gradcheck.h - finite-difference gradient checks for float implementations.
 * The caller provides a scalar loss computed in double from the current float
 * inputs (usually sum(y * R) for fixed random R); the checker perturbs one input
 * element at a time by +-eps, takes the central difference in double using the
 * perturbation actually representable in float, and compares it elementwise with
 * the analytic gradient: |fd - analytic| <= atol + satol * max|fd| + rtol * |fd|,
 * where max|fd| is the largest over the checked elements (satol scales the
 * absolute floor to the tensor's gradients, since float32 forward rounding puts a
 * noise floor under FD). The worst element is reported on stderr (what, index,
 * both values, max|fd|) whether or not it passes.
 *
 *     static double loss(void *u) { ... forward, return sum(y * R) ... }
 *     ferry_gradcheck_opts o = ferry_gradcheck_defaults();
 *     CHECK(ferry_gradcheck("linear dW", loss, &state, W, nW, dW, &o));
 */
#ifndef FERRY_GRADCHECK_H
#define FERRY_GRADCHECK_H

#include <stdint.h>

/* Recomputes the loss from the current inputs; must be deterministic. */
typedef double (*ferry_gradcheck_loss)(void *user);

typedef struct ferry_gradcheck_opts {
    double eps;       /* perturbation (default 1e-2) */
    double atol;      /* absolute tolerance (default 1e-3) */
    double satol;     /* absolute tolerance as a fraction of max|fd| (default 0) */
    double rtol;      /* relative tolerance, of |fd| (default 1e-2) */
    int64_t max_elem; /* check at most this many elements, evenly strided (0: all) */
} ferry_gradcheck_opts;

ferry_gradcheck_opts ferry_gradcheck_defaults(void);

/* Checks analytic[i] = d loss / d x[i] for i < n (x is perturbed in place and
 * restored exactly). Returns 1 if every checked element passes, else 0. */
int ferry_gradcheck(const char *what, ferry_gradcheck_loss loss, void *user, float *x, int64_t n,
                    const float *analytic, const ferry_gradcheck_opts *opts);

/* Deterministic pseudo-random floats in [lo, hi) from (seed, i) for test inputs. */
void ferry_gradcheck_fill(float *x, int64_t n, float lo, float hi, uint64_t seed);

/* sum_i a[i] * r[i] in double: the usual loss wrapper. */
double ferry_gradcheck_dot(const float *a, const float *r, int64_t n);

#endif /* FERRY_GRADCHECK_H */
