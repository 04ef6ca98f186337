/* clip.c - global-norm clipping coefficient (torch.nn.utils.clip_grad_norm_) and the
 * sum of squares over several gradient sets. */
#include <math.h>

#include "ferry/optim.h"

ferry_status ferry_clip_coef(double total_sumsq, float max_norm, float *scale_out,
                             double *norm_out) {
    *scale_out = 1.0f;
    double norm = sqrt(total_sumsq);
    if (norm_out != NULL)
        *norm_out = norm;
    if (!(max_norm > 0.0f) || !isfinite(max_norm))
        return ferry_errorf(FERRY_ERR_INVALID, "clip: max norm %g must be positive and finite",
                            (double)max_norm);
    if (!isfinite(total_sumsq) || total_sumsq < 0.0)
        return ferry_errorf(FERRY_ERR_NUMERIC, "clip: gradient norm is %g", norm);
    /* torch: clip_coef = max_norm / (total_norm + 1e-6) on float32 tensors, then
     * clamp(max=1.0). The norm itself is float32 there; ours is the rounded double. */
    float coef = max_norm / ((float)norm + 1e-6f);
    *scale_out = coef < 1.0f ? coef : 1.0f;
    return FERRY_OK;
}

ferry_status ferry_clip_sumsq(const ferry_grads *const *G, int count, double *out) {
    double total = 0.0;
    for (int i = 0; i < count; i++) {
        if (G[i] == NULL)
            continue;
        double s = 0.0;
        ferry_status st = ferry_grads_sumsq(G[i], &s);
        if (st != FERRY_OK)
            return st;
        total += s;
    }
    *out = total;
    return FERRY_OK;
}
