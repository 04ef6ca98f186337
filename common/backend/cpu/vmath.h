/* vmath.h - branch-free float exp, sigmoid and tanh that GCC vectorises inside the
 * CPU ops' loops (libm's expf/tanhf are calls, so a loop using them stays scalar).
 * Cephes-style range reduction and polynomials; measured against double libm by
 * tests/test_nn_cpu_ops.c: exp within 1 ulp, tanh 1.5 ulp, sigmoid 2.5 ulp.
 *
 * Vectorising idiom used by the callers: loops run in blocks of FERRY_VLANES with a
 * constant inner trip count, so GCC's -O2 ("very cheap") vectoriser takes them (the
 * selects below need -fno-trapping-math, set for every C file, to become blends);
 * results go through a small local array first, so possibly aliasing outputs need
 * no restrict. A scalar tail finishes each row with the same inline functions. */
#ifndef FERRY_CPU_VMATH_H
#define FERRY_CPU_VMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define FERRY_VLANES 16

/* e^x. Inputs below -87 give 0 (true result < 1.7e-38) and inputs above 88 give
 * e^88 = 1.65e38 instead of overflowing; in between the result is within 1 ulp. */
static inline float ferry__vexpf(float x) {
    float xc = x < -87.0f ? -87.0f : x;
    xc = xc > 88.0f ? 88.0f : xc;
    /* n = round(x / ln 2) by the 1.5 * 2^23 trick (round to nearest even). */
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    /* r = x - n ln 2 with ln 2 split in two, so r carries no rounding of n ln 2. */
    float r = fmaf(n, -0.693359375f, xc);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    float e = fmaf(p, r * r, r) + 1.0f;
    /* 2^n from its bit pattern; n is in [-126, 127] after the clamp. */
    int32_t bits = ((int32_t)n + 127) * (1 << 23);
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x < -87.0f ? 0.0f : e * scale;
}

/* 1 / (1 + e^-x). */
static inline float ferry__vsigmoidf(float x) {
    return 1.0f / (1.0f + ferry__vexpf(-x));
}

/* tanh(x): an odd polynomial below |x| = 0.625 (where 1 - e^-2|x| would cancel),
 * (1 - e^-2|x|) / (1 + e^-2|x|) with the sign of x above. */
static inline float ferry__vtanhf(float x) {
    float ax = fabsf(x);
    float s = x * x;
    float p = -5.70498872745e-3f;
    p = fmaf(p, s, 2.06390887954e-2f);
    p = fmaf(p, s, -5.37397155531e-2f);
    p = fmaf(p, s, 1.33314422036e-1f);
    p = fmaf(p, s, -3.33332819422e-1f);
    float small = fmaf(p * s, x, x);
    float e = ferry__vexpf(-2.0f * ax);
    float big = (1.0f - e) / (1.0f + e);
    big = x < 0.0f ? -big : big;
    return ax < 0.625f ? small : big;
}

#endif /* FERRY_CPU_VMATH_H */
