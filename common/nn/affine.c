/* affine.c - y = x W_eff^T + b and its backward, for the local Linear and ferry-ps's
 * dense kinds alike; see affine.h. Forward is one GEMM over all rows; backward is two
 * GEMMs (dW += dy^T x, dx += dy W_eff) and a column sum for db.
 *
 * A Stiefel-constrained weight (spec/stiefel.md §1, §4), as in the LSTM and cdopt's
 * layers: W (D, C) is the manifold variable as stored, n = D rows >= p = C columns
 * (orthonormal columns, W^T W = I_C). Forward multiplies by A(W) = W (1.5 I - 0.5 W^T W),
 * formed from the current raw W on every call; W is never written. Backward forms
 * dL/dA = dy^T x and adds its vector-Jacobian product G K - W sym(W^T G) into the raw
 * gradient; dx uses the same A(W) as forward. The penalty beta ||W^T W - I||_F^2 is the
 * owner's business, once per optimizer step, never added here. */
#include "common/nn/affine.h"
#include "common/nn/constraint.h"
#include "common/nn/nn-impl.h"

/* y(N, D) = b broadcast over rows, by doubling copies of the rows done so far, at
 * most about 256 KiB per copy: large copies would bypass the cache (non-temporal
 * stores) right before the GEMM reads y again. Shared with lstm.c (nn-impl.h). */
ferry_status ferry__nn_broadcast_rows(ferry_backend *be, int64_t N, int64_t D, const float *b,
                                      float *y) {
    size_t row = (size_t)D * sizeof(float);
    int64_t cap = (int64_t)((256u << 10) / row) + 1;
    ferry_status st = ferry_backend_copy(be, y, b, row, FERRY_COPY_DEVICE_TO_DEVICE);
    for (int64_t done = 1; done < N && st == FERRY_OK;) {
        int64_t n = done < N - done ? done : N - done;
        n = n < cap ? n : cap;
        st = ferry_backend_copy(be, y + done * D, y, (size_t)n * row, FERRY_COPY_DEVICE_TO_DEVICE);
        done += n;
    }
    return st;
}

int64_t ferry_affine_scratch_floats(int64_t C, int64_t D, int constrained, int forward) {
    if (!constrained)
        return 0;
    /* forward: A (D, C) | the map's scratch; backward: dA (D, C) | its VJP (D, C) | scratch */
    return (forward ? 1 : 2) * D * C + ferry_stiefel_scratch_floats(C);
}

ferry_status ferry_affine_weight(ferry_backend *be, int64_t C, int64_t D, const float *W,
                                 int constrained, float *scratch, const float **w_eff) {
    if (!constrained) {
        *w_eff = W;
        return FERRY_OK;
    }
    ferry_status st = ferry_stiefel_map(be, D, C, W, scratch, scratch + D * C);
    if (st == FERRY_OK)
        *w_eff = scratch;
    return st;
}

ferry_status ferry_affine_forward(ferry_backend *be, int64_t N, int64_t C, int64_t D,
                                  const float *x, const float *w_eff, const float *b, float *y) {
    if (N == 0)
        return FERRY_OK;
    /* With a bias, y starts as the broadcast bias and the GEMM accumulates onto it:
     * one pass over y instead of BLAS zeroing it and a second pass adding b. */
    float beta = 0.0f;
    if (b != NULL) {
        ferry_status st = ferry__nn_broadcast_rows(be, N, D, b, y);
        if (st != FERRY_OK)
            return st;
        beta = 1.0f;
    }
    return ferry_backend_gemm(be, 0, 1, N, D, C, 1.0f, x, C, w_eff, C, beta, y, D);
}

ferry_status ferry_affine_backward(ferry_backend *be, int64_t N, int64_t C, int64_t D,
                                   const float *x, const float *dy, const float *W,
                                   const float *w_eff, int constrained, float *dW, float *db,
                                   float *dx, int dx_accumulate, float *scratch) {
    if (N == 0)
        return FERRY_OK;
    ferry_status st = FERRY_OK;
    if (dW == NULL) { /* the input gradient only */
    } else if (!constrained) {
        st = ferry_backend_gemm(be, 1, 0, D, C, N, 1.0f, dy, D, x, C, 1.0f, dW, C);
    } else {
        int64_t n = D * C;
        st = ferry_backend_gemm(be, 1, 0, D, C, N, 1.0f, dy, D, x, C, 0.0f, scratch, C);
        if (st == FERRY_OK)
            st = ferry_stiefel_map_backward(be, D, C, W, scratch, scratch + n, scratch + 2 * n);
        if (st == FERRY_OK)
            st = ferry_backend_axpy(be, n, 1.0f, scratch + n, dW);
    }
    if (st == FERRY_OK && db != NULL)
        st = ferry_backend_sum_rows(be, N, D, dy, db);
    if (st == FERRY_OK && dx != NULL)
        st = ferry_backend_gemm(be, 0, 0, N, C, D, 1.0f, dy, D, w_eff, C,
                                dx_accumulate ? 1.0f : 0.0f, dx, C);
    return st;
}
