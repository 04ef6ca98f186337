/* clip.h - global-norm gradient clipping, as torch.nn.utils.clip_grad_norm_ (norm type 2).
 * The scale is not applied here: pass it to ferry_optim_step (or each owner's Step), whose
 * kernel multiplies the gradient first. In the distributed step every owner reports the
 * sum of squares of the gradients it holds (ferry_clip_sumsq); the trainer adds them up
 * and computes one scale for all:
 *
 *     double ss;  float scale;  double norm;
 *     ferry_clip_sumsq(grads, n_grads, &ss);          // + remote owners' sums
 *     ferry_clip_coef(ss, max_norm, &scale, &norm);
 *     ferry_optim_step(opt, &P, G, scale);
 */
#ifndef FERRY_CLIP_H
#define FERRY_CLIP_H

#include "nn/params.h" /* ferry_grads */

/* From the global sum of squares of all gradients: *norm_out = sqrt(total_sumsq) and
 * *scale_out = min(1, max_norm / (norm + 1e-6)), computed in float32 as torch does
 * (torch multiplies by the clamped coefficient even when it is 1; so may the caller).
 * FERRY_ERR_INVALID (scale 1) for max_norm <= 0 or non-finite; FERRY_ERR_NUMERIC (scale 1,
 * norm as computed) when the norm is NaN or infinite: the step should be skipped or the
 * run stopped. norm_out may be NULL. */
ferry_status ferry_clip_coef(double total_sumsq, float max_norm, float *scale_out,
                             double *norm_out);

/* Sum of squares, in double, of every gradient held by the count gradient sets G[0..count)
 * (dense and row-sparse; a context may have touched several blocks, each with its own
 * ferry_grads). NULL entries are skipped. Errors from the backend pass through. */
ferry_status ferry_clip_sumsq(const ferry_grads *const *G, int count, double *out);

#endif /* FERRY_CLIP_H */
