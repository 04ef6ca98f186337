/* xent.c - softmax cross-entropy on the CPU: a numerically stable softmax per
 * row (max subtracted, sum in double) and the (p - onehot) gradient.
 * Rows are walked in blocks of FERRY_VLANES with per-lane partial maxima and
 * sums (vmath.h's idiom), so the exp pass vectorises; the lanes are combined in
 * a fixed order, so results do not depend on anything but the input. */
#include "common/backend/cpu/cpu.h"
#include "common/backend/cpu/vmath.h"
#include "common/core/simd.h"

/* Max of z[0..V). */
FERRY_HOT_LOOP static float row_max_of(const float *z, int64_t V) {
    float lane[FERRY_VLANES];
    for (int k = 0; k < FERRY_VLANES; k++)
        lane[k] = z[0];
    int64_t v = 0;
    for (; v + FERRY_VLANES <= V; v += FERRY_VLANES)
        for (int k = 0; k < FERRY_VLANES; k++)
            lane[k] = z[v + k] > lane[k] ? z[v + k] : lane[k];
    float mx = lane[0];
    for (int k = 1; k < FERRY_VLANES; k++)
        mx = lane[k] > mx ? lane[k] : mx;
    for (; v < V; v++)
        mx = z[v] > mx ? z[v] : mx;
    return mx;
}

/* z[v] = e^(z[v] - mx); returns the sum in double. */
FERRY_HOT_LOOP static double row_exp_sum(float *z, int64_t V, float mx) {
    double lane[FERRY_VLANES] = {0};
    int64_t v = 0;
    for (; v + FERRY_VLANES <= V; v += FERRY_VLANES) {
        float e[FERRY_VLANES];
        for (int k = 0; k < FERRY_VLANES; k++)
            e[k] = ferry__vexpf(z[v + k] - mx);
        for (int k = 0; k < FERRY_VLANES; k++) {
            z[v + k] = e[k];
            lane[k] += (double)e[k];
        }
    }
    double sum = 0.0;
    for (int k = 0; k < FERRY_VLANES; k++)
        sum += lane[k];
    for (; v < V; v++) {
        z[v] = ferry__vexpf(z[v] - mx);
        sum += (double)z[v];
    }
    return sum;
}

/* z[v] *= s. */
FERRY_HOT_LOOP static void row_scale_by(float *z, int64_t V, float s) {
    int64_t v = 0;
    for (; v + FERRY_VLANES <= V; v += FERRY_VLANES)
        for (int k = 0; k < FERRY_VLANES; k++)
            z[v + k] *= s;
    for (; v < V; v++)
        z[v] *= s;
}

/* z[v] = (z[v] * f) * s: row_scale_by by f, then by s, rounded alike in one pass. */
FERRY_HOT_LOOP static void row_scale_twice(float *z, int64_t V, float f, float s) {
    int64_t v = 0;
    for (; v + FERRY_VLANES <= V; v += FERRY_VLANES)
        for (int k = 0; k < FERRY_VLANES; k++)
            z[v + k] = (z[v + k] * f) * s;
    for (; v < V; v++)
        z[v] = (z[v] * f) * s;
}

FERRY_HOT_LOOP ferry_status ferry__cpu_xent_forward(ferry_backend *be, int64_t N, int64_t V,
                                                    float *logits, const int32_t *targets,
                                                    float *loss_rows) {
    (void)be;
    for (int64_t n = 0; n < N; n++) {
        float *z = logits + n * V; /* (V) logits in, probabilities out */
        float mx = row_max_of(z, V);
        float zt = z[targets[n]];
        double sum = row_exp_sum(z, V, mx);
        row_scale_by(z, V, (float)(1.0 / sum));
        loss_rows[n] = (float)(log(sum) + (double)mx - (double)zt);
    }
    return FERRY_OK;
}

FERRY_HOT_LOOP ferry_status ferry__cpu_xent_backward(ferry_backend *be, int64_t N, int64_t V,
                                                     float *probs, const int32_t *targets,
                                                     float scale) {
    (void)be;
    for (int64_t n = 0; n < N; n++) {
        float *p = probs + n * V; /* (V) probabilities in, gradient out */
        p[targets[n]] -= 1.0f;
        row_scale_by(p, V, scale);
    }
    return FERRY_OK;
}

/* ---- sharded softmax: the same kernels over one vocabulary slice ---- */

FERRY_HOT_LOOP ferry_status ferry__cpu_softmax_partials(ferry_backend *be, int64_t N, int64_t V,
                                                        float *z, const int32_t *targets,
                                                        float *row_max, double *row_sumexp,
                                                        float *target_logit) {
    (void)be;
    for (int64_t n = 0; n < N; n++) {
        float *zr = z + n * V; /* (V) logits in, exp(z - max) out */
        target_logit[n] = targets[n] >= 0 ? zr[targets[n]] : 0.0f;
        row_max[n] = row_max_of(zr, V);
        row_sumexp[n] = row_exp_sum(zr, V, row_max[n]);
    }
    return FERRY_OK;
}

FERRY_HOT_LOOP ferry_status ferry__cpu_softmax_grad(ferry_backend *be, int64_t N, int64_t V,
                                                    float *e, const float *factor,
                                                    const int32_t *targets, const float *row_scale,
                                                    float scale) {
    (void)be;
    for (int64_t n = 0; n < N; n++) {
        float *p = e + n * V; /* (V) exp(z - max_slice) in, gradient out */
        float f = factor[n], s = row_scale != NULL ? row_scale[n] * scale : scale;
        float pt = targets[n] >= 0 ? p[targets[n]] * f : 0.0f;
        pt -= 1.0f;                  /* a statement of its own: no compiler fuses it into an FMA */
        row_scale_twice(p, V, f, s); /* one pass, the two products of two passes */
        if (targets[n] >= 0)
            p[targets[n]] = pt * s;
    }
    return FERRY_OK;
}
