/* constraint.h - the Stiefel-manifold pieces the layers apply (cdopt's constraint
 * dissolving approach, spec/stiefel.md): the dissolving map A(W) and its
 * vector-Jacobian product, the constraint C(W) and its feasibility metric, and the
 * orthogonal polar-factor initialisation. The penalty beta ||C(W)||_F^2 and its
 * gradient belong to the optimizer step: optim/stiefel.h.
 *
 * W is a row-major n x p matrix in backend memory; "cols" (the default, the LSTM's
 * weight_hh of shape (4H, H)) means C(W) = W^T W - I_p; the "_rows" variants handle a
 * wide weight through its transpose, C = W W^T - I_n. A(W) = 1.5 W - 0.5 W W^T W and its
 * vector-Jacobian product are the same polynomial in both conventions; the map functions
 * form whichever Gram matrix is smaller. All products go through ferry_backend_gemm, so
 * every function runs on any backend.
 *
 * Scratch: `scratch` is backend memory of ferry_stiefel_scratch_floats(k) floats, where
 * k = p for the cols functions (the map functions need only min(n, p) <= p) and k = n for
 * the _rows ones; NULL makes the function allocate (and free) its own. Outputs must not
 * alias inputs, except that C_out may be the scratch itself. Thread-safety: as the
 * backend's. */
#ifndef FERRY_NN_CONSTRAINT_H
#define FERRY_NN_CONSTRAINT_H

#include <stdint.h>

#include "common/tensor/backend.h"

/* Floats of scratch for Gram size k: 2 k^2 + k + 1. */
int64_t ferry_stiefel_scratch_floats(int64_t k);

/* A_out (n, p) = A(W) = W (1.5 I - 0.5 W^T W). */
ferry_status ferry_stiefel_map(ferry_backend *be, int64_t n, int64_t p, const float *W,
                               float *A_out, float *scratch);
/* dW_out (n, p) = d<G, A(W)>/dW = G K - W sym(W^T G), K = I - 0.5 C(W); that is
 * 1.5 G - 0.5 (G W^T W + W W^T G + W G^T W). G (n, p) is dLoss/dA(W). */
ferry_status ferry_stiefel_map_backward(ferry_backend *be, int64_t n, int64_t p, const float *W,
                                        const float *G, float *dW_out, float *scratch);

/* C_out (p, p) = W^T W - I_p. */
ferry_status ferry_stiefel_constraint(ferry_backend *be, int64_t n, int64_t p, const float *W,
                                      float *C_out, float *scratch);
/* The rows convention: C_out (n, n) = W W^T - I_n. */
ferry_status ferry_stiefel_constraint_rows(ferry_backend *be, int64_t n, int64_t p, const float *W,
                                           float *C_out, float *scratch);
/* *out = ||W^T W - I||_F (cdopt's constraint violation of one matrix). */
ferry_status ferry_stiefel_feasibility(ferry_backend *be, int64_t n, int64_t p, const float *W,
                                       double *out, float *scratch);

/* Replaces the host matrix W (n, p), n >= p, by its orthogonal polar factor U V^T
 * (thin SVD W = U S V^T), computed in double: S = W^T W, S^(-1/2) by the coupled
 * Newton-Schulz iteration, W <- W S^(-1/2). As cdopt, W is left unchanged when
 * ||W^T W - I||_F <= 1e-6 already. FERRY_ERR_SHAPE for n < p, FERRY_ERR_NUMERIC for a
 * non-finite or (numerically) rank-deficient W, whose polar factor is not unique;
 * FERRY_ERR_NOMEM. Cost: about 4 n p^2 + 55 p^3 flops through OpenBLAS dgemm (1.4 s for
 * a (2600, 650) matrix on two busy cores), and 5 p^2 + 2 n p doubles. */
ferry_status ferry_stiefel_polar(int64_t n, int64_t p, float *W);

#endif /* FERRY_NN_CONSTRAINT_H */
