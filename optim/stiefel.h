/* stiefel.h - the quadratic penalty of cdopt's constraint dissolving approach
 * (spec/stiefel.md), beta ||C(W)||_F^2 with C(W) = W^T W - I ("cols") or W W^T - I
 * ("_rows"), its gradient, and the per-block pass an optimizer step runs. The map A(W),
 * C(W), feasibility and the polar initialisation are in common/nn/constraint.h, whose
 * conventions (shapes, scratch) these functions share. */
#ifndef FERRY_STIEFEL_H
#define FERRY_STIEFEL_H

#include <stdint.h>

#include "common/nn/constraint.h"
#include "ferry/optim.h"
#include "ferry/params.h"

/* *sqnorm_C = ||W^T W - I||_F^2 and *penalty = beta * *sqnorm_C (either may be NULL). */
ferry_status ferry_stiefel_penalty(ferry_backend *be, int64_t n, int64_t p, const float *W,
                                   float beta, double *penalty, double *sqnorm_C, float *scratch);
/* dW_accumulate (n, p) += 4 beta W C(W), the gradient of the penalty. */
ferry_status ferry_stiefel_penalty_grad(ferry_backend *be, int64_t n, int64_t p, const float *W,
                                        float beta, float *dW_accumulate, float *scratch);
/* The same two for the rows convention: C = W W^T - I_n (n, n), gradient 4 beta C W. */
ferry_status ferry_stiefel_penalty_rows(ferry_backend *be, int64_t n, int64_t p, const float *W,
                                        float beta, double *penalty, double *sqnorm_C,
                                        float *scratch);
ferry_status ferry_stiefel_penalty_grad_rows(ferry_backend *be, int64_t n, int64_t p,
                                             const float *W, float beta, float *dW_accumulate,
                                             float *scratch);

/* ferry_stiefel_add_penalty_grads, the pass over a parameter block an optimizer step
 * runs, is public: ferry/optim.h. */

/* The same over a block laid out as P (which need not be allocated): values at
 * data + offset, gradients added at grad + offset (grad NULL: measure only). ferry-ps's lstm module keeps its layers' parameters
 * as one such block. */
ferry_status ferry_stiefel_add_penalty_block(const ferry_params *P, const float *data, float *grad,
                                             double *penalty, double *drift);

#endif /* FERRY_STIEFEL_H */
