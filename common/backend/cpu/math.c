/* math.c - CPU dense math (GEMM in gemm.c): plain loops for the
 * elementwise ops. The loops run in blocks of FERRY_VLANES with a constant inner
 * trip count and stage results in a local array (vmath.h's idiom), which is what
 * lets GCC vectorise them at -O2 without restrict; a scalar tail finishes. */
#include "common/backend/cpu/cpu.h"
#include "common/core/simd.h"
#include "common/backend/cpu/vmath.h"

FERRY_HOT_LOOP ferry_status ferry__cpu_fill(ferry_backend *be, float *x, int64_t n, float v) {
    (void)be;
    int64_t i = 0;
    for (; i + FERRY_VLANES <= n; i += FERRY_VLANES)
        for (int k = 0; k < FERRY_VLANES; k++)
            x[i + k] = v;
    for (; i < n; i++)
        x[i] = v;
    return FERRY_OK;
}

FERRY_HOT_LOOP ferry_status ferry__cpu_axpy(ferry_backend *be, int64_t n, float alpha,
                                            const float *x, float *y) {
    (void)be;
    int64_t i = 0;
    for (; i + FERRY_VLANES <= n; i += FERRY_VLANES) {
        float t[FERRY_VLANES];
        for (int k = 0; k < FERRY_VLANES; k++)
            t[k] = y[i + k] + alpha * x[i + k];
        for (int k = 0; k < FERRY_VLANES; k++)
            y[i + k] = t[k];
    }
    for (; i < n; i++)
        y[i] += alpha * x[i];
    return FERRY_OK;
}

FERRY_HOT_LOOP ferry_status ferry__cpu_scale(ferry_backend *be, int64_t n, float alpha, float *x) {
    (void)be;
    int64_t i = 0;
    for (; i + FERRY_VLANES <= n; i += FERRY_VLANES)
        for (int k = 0; k < FERRY_VLANES; k++)
            x[i + k] *= alpha;
    for (; i < n; i++)
        x[i] *= alpha;
    return FERRY_OK;
}

FERRY_HOT_LOOP ferry_status ferry__cpu_mul(ferry_backend *be, int64_t n, const float *x,
                                           const float *y, float *out) {
    (void)be;
    int64_t i = 0;
    for (; i + FERRY_VLANES <= n; i += FERRY_VLANES) {
        float t[FERRY_VLANES];
        for (int k = 0; k < FERRY_VLANES; k++)
            t[k] = x[i + k] * y[i + k];
        for (int k = 0; k < FERRY_VLANES; k++)
            out[i + k] = t[k];
    }
    for (; i < n; i++)
        out[i] = x[i] * y[i];
    return FERRY_OK;
}

FERRY_HOT_LOOP ferry_status ferry__cpu_sumsq(ferry_backend *be, int64_t n, const float *x,
                                             double *out) {
    (void)be;
    double lane[FERRY_VLANES] = {0}; /* per-lane partial sums, combined in order */
    int64_t i = 0;
    for (; i + FERRY_VLANES <= n; i += FERRY_VLANES)
        for (int k = 0; k < FERRY_VLANES; k++)
            lane[k] += (double)x[i + k] * (double)x[i + k];
    double s = 0.0;
    for (int k = 0; k < FERRY_VLANES; k++)
        s += lane[k];
    for (; i < n; i++)
        s += (double)x[i] * (double)x[i];
    *out = s;
    return FERRY_OK;
}

/* row(D) += v(D), the inner loop of add_bias and sum_rows. */
FERRY_HOT_LOOP static void row_add(int64_t D, const float *v, float *row) {
    int64_t d = 0;
    for (; d + FERRY_VLANES <= D; d += FERRY_VLANES) {
        float t[FERRY_VLANES];
        for (int k = 0; k < FERRY_VLANES; k++)
            t[k] = row[d + k] + v[d + k];
        for (int k = 0; k < FERRY_VLANES; k++)
            row[d + k] = t[k];
    }
    for (; d < D; d++)
        row[d] += v[d];
}

FERRY_HOT_LOOP ferry_status ferry__cpu_add_bias(ferry_backend *be, int64_t N, int64_t D,
                                                const float *b, float *y) {
    (void)be;
    for (int64_t n = 0; n < N; n++)
        row_add(D, b, y + n * D); /* y[n, :] += b */
    return FERRY_OK;
}

FERRY_HOT_LOOP ferry_status ferry__cpu_sum_rows(ferry_backend *be, int64_t N, int64_t D,
                                                const float *x, float *out) {
    (void)be;
    for (int64_t n = 0; n < N; n++)
        row_add(D, x + n * D, out); /* out += x[n, :] */
    return FERRY_OK;
}
