/* affine.h - the affine map y = x W_eff^T + b behind every dense layer: the local
 * Linear (linear.c) and ferry-ps's linear kind and decoder logits (server/linear.c,
 * server/decoder.c) all compute through these functions, so a remote layer rounds
 * exactly as the local one. W (D, C) is the raw weight; W_eff is W, or cdopt's A(W) when
 * the weight is Stiefel-constrained (common/nn/constraint.h). Callers own the memory:
 * scratch comes from a context arena locally and from the backend on the server.
 * All pointers are backend memory. */
#ifndef FERRY_NN_AFFINE_H
#define FERRY_NN_AFFINE_H

#include <stdint.h>

#include "common/tensor/backend.h"

/* Floats of scratch ferry_affine_weight (forward = 1) or ferry_affine_backward
 * (forward = 0) needs: 0 for an unconstrained weight. */
int64_t ferry_affine_scratch_floats(int64_t C, int64_t D, int constrained, int forward);

/* *w_eff = W, or A(W) formed in scratch (ferry_affine_scratch_floats(C, D, 1, 1)
 * floats) when constrained. */
ferry_status ferry_affine_weight(ferry_backend *be, int64_t C, int64_t D, const float *W,
                                 int constrained, float *scratch, const float **w_eff);

/* y (N, D) = x (N, C) w_eff^T + b; b (D) may be NULL. With a bias, y starts as the
 * broadcast bias and the GEMM accumulates onto it. */
ferry_status ferry_affine_forward(ferry_backend *be, int64_t N, int64_t C, int64_t D,
                                  const float *x, const float *w_eff, const float *b, float *y);

/* Backward of ferry_affine_forward for the upstream gradient dy (N, D):
 * dW (D, C) += dy^T x when dW != NULL, or for a constrained W the map's vector-Jacobian product of it
 * (W the raw weight; scratch of ferry_affine_scratch_floats(C, D, 1, 0) floats);
 * db (D) += column sums of dy when db != NULL; dx (N, C) += dy w_eff when dx != NULL
 * (dx_accumulate = 0 overwrites it instead). */
ferry_status ferry_affine_backward(ferry_backend *be, int64_t N, int64_t C, int64_t D,
                                   const float *x, const float *dy, const float *W,
                                   const float *w_eff, int constrained, float *dW, float *db,
                                   float *dx, int dx_accumulate, float *scratch);

#endif /* FERRY_NN_AFFINE_H */
