/* rows.c - row gathers and scatter-adds (embedding lookup and its gradient),
 * and the inverted-dropout mask from the shared counter-based generator. */
#include <string.h>

#include "common/backend/cpu/cpu.h"
#include "common/core/simd.h"
#include "common/backend/cpu/vmath.h" /* FERRY_VLANES */

ferry_status ferry__cpu_gather_rows(ferry_backend *be, int64_t count, int64_t D, const int32_t *idx,
                                    const float *src, float *dst) {
    (void)be;
    for (int64_t n = 0; n < count; n++)
        memcpy(dst + n * D, src + (int64_t)idx[n] * D, (size_t)D * sizeof(float));
    return FERRY_OK;
}

FERRY_HOT_LOOP ferry_status ferry__cpu_scatter_add_rows(ferry_backend *be, int64_t count, int64_t D,
                                                        const int32_t *idx, const float *src,
                                                        float *dst) {
    (void)be;
    for (int64_t n = 0; n < count; n++) {
        float *row = dst + (int64_t)idx[n] * D; /* (D) += src[n, :] */
        const float *s = src + n * D;
        int64_t d = 0;
        for (; d + FERRY_VLANES <= D; d += FERRY_VLANES) {
            float t[FERRY_VLANES]; /* staged: lets GCC vectorise without restrict */
            for (int k = 0; k < FERRY_VLANES; k++)
                t[k] = row[d + k] + s[d + k];
            for (int k = 0; k < FERRY_VLANES; k++)
                row[d + k] = t[k];
        }
        for (; d < D; d++)
            row[d] += s[d];
    }
    return FERRY_OK;
}

ferry_status ferry__cpu_dropout_mask(ferry_backend *be, int64_t n, float p, uint64_t seed,
                                     uint64_t offset, float *mask) {
    (void)be;
    float keep = 1.0f / (1.0f - p);
    for (int64_t i = 0; i < n; i++)
        mask[i] = ferry_rand_uniform(seed, offset + (uint64_t)i) >= p ? keep : 0.0f;
    return FERRY_OK;
}
