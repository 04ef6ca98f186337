/* xent.c - softmax cross-entropy on the CPU: a numerically stable softmax per
 * row (max subtracted, sum in double) and the (p - onehot) gradient.
 * Rows are walked in blocks of FERRY_VLANES with per-lane partial maxima and
 * sums (vmath.h's idiom), so the exp pass vectorises; the lanes are combined in
 * a fixed order, so results do not depend on anything but the input. */
#include "cpu.h"
#include "vmath.h"

/* Max of z[0..V). */
static float row_max(const float *z, int64_t V) {
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
static double row_exp_sum(float *z, int64_t V, float mx) {
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
static void row_scale(float *z, int64_t V, float s) {
    int64_t v = 0;
    for (; v + FERRY_VLANES <= V; v += FERRY_VLANES)
        for (int k = 0; k < FERRY_VLANES; k++)
            z[v + k] *= s;
    for (; v < V; v++)
        z[v] *= s;
}

ferry_status ferry__cpu_xent_forward(ferry_backend *be, int64_t N, int64_t V, float *logits,
                                     const int32_t *targets, float *loss_rows) {
    (void)be;
    for (int64_t n = 0; n < N; n++) {
        float *z = logits + n * V; /* (V) logits in, probabilities out */
        float mx = row_max(z, V);
        float zt = z[targets[n]];
        double sum = row_exp_sum(z, V, mx);
        row_scale(z, V, (float)(1.0 / sum));
        loss_rows[n] = (float)(log(sum) + (double)mx - (double)zt);
    }
    return FERRY_OK;
}

ferry_status ferry__cpu_xent_backward(ferry_backend *be, int64_t N, int64_t V, float *probs,
                                      const int32_t *targets, float scale) {
    (void)be;
    for (int64_t n = 0; n < N; n++) {
        float *p = probs + n * V; /* (V) probabilities in, gradient out */
        p[targets[n]] -= 1.0f;
        row_scale(p, V, scale);
    }
    return FERRY_OK;
}
