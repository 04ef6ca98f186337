/* stiefel.c - the quadratic penalty beta ||C(W)||_F^2 of cdopt's constraint dissolving
 * approach and its gradient on any backend, and the per-block penalty pass of an
 * optimizer step (spec/stiefel.md). The map A(W), C(W) and the polar initialisation
 * are the layers' (common/nn/constraint.c). */
#include <math.h>
#include <stdlib.h>

#include "common/core/log.h"
#include "common/nn/constraint.h"
#include "optim/stiefel.h"

/* C (k, k) of W in the given convention into the first k^2 floats of a scratch block of
 * ferry_stiefel_scratch_floats(k) floats (given, or allocated into *owned). */
static ferry_status constraint_in_scratch(ferry_backend *be, int rows, int64_t n, int64_t p,
                                          const float *W, float *given, float **C, float **owned) {
    int64_t k = rows ? n : p;
    *owned = NULL;
    if (given == NULL) {
        ferry_status st = ferry_backend_alloc(
            be, (size_t)ferry_stiefel_scratch_floats(k) * sizeof(float), (void **)owned);
        if (st != FERRY_OK)
            return st;
        given = *owned;
    }
    *C = given;
    return rows ? ferry_stiefel_constraint_rows(be, n, p, W, given, given)
                : ferry_stiefel_constraint(be, n, p, W, given, given);
}

static ferry_status penalty(ferry_backend *be, int rows, int64_t n, int64_t p, const float *W,
                            float beta, double *penalty_out, double *sqnorm_out,
                            float *scratch_mem) {
    int64_t k = rows ? n : p;
    float *C, *owned;
    double sq = 0.0;
    ferry_status st = constraint_in_scratch(be, rows, n, p, W, scratch_mem, &C, &owned);
    if (st == FERRY_OK)
        st = ferry_backend_sumsq(be, k * k, C, &sq);
    ferry_backend_free(be, owned);
    if (penalty_out != NULL)
        *penalty_out = (double)beta * sq;
    if (sqnorm_out != NULL)
        *sqnorm_out = sq;
    return st;
}

static ferry_status penalty_grad(ferry_backend *be, int rows, int64_t n, int64_t p, const float *W,
                                 float beta, float *dW, float *scratch_mem) {
    if (dW == NULL || dW == W)
        return ferry_errorf(FERRY_ERR_INVALID, "stiefel penalty gradient: bad output");
    float *C, *owned;
    ferry_status st = constraint_in_scratch(be, rows, n, p, W, scratch_mem, &C, &owned);
    /* d/dW beta ||C||^2 = 4 beta W C (cols) or 4 beta C W (rows). */
    if (st == FERRY_OK && !rows)
        st = ferry_backend_gemm(be, 0, 0, n, p, p, 4.0f * beta, W, p, C, p, 1.0f, dW, p);
    else if (st == FERRY_OK)
        st = ferry_backend_gemm(be, 0, 0, n, p, n, 4.0f * beta, C, n, W, p, 1.0f, dW, p);
    ferry_backend_free(be, owned);
    return st;
}

ferry_status ferry_stiefel_penalty(ferry_backend *be, int64_t n, int64_t p, const float *W,
                                   float beta, double *penalty_out, double *sqnorm_C,
                                   float *scratch_mem) {
    return penalty(be, 0, n, p, W, beta, penalty_out, sqnorm_C, scratch_mem);
}

ferry_status ferry_stiefel_penalty_grad(ferry_backend *be, int64_t n, int64_t p, const float *W,
                                        float beta, float *dW_accumulate, float *scratch_mem) {
    return penalty_grad(be, 0, n, p, W, beta, dW_accumulate, scratch_mem);
}

ferry_status ferry_stiefel_penalty_rows(ferry_backend *be, int64_t n, int64_t p, const float *W,
                                        float beta, double *penalty_out, double *sqnorm_C,
                                        float *scratch_mem) {
    return penalty(be, 1, n, p, W, beta, penalty_out, sqnorm_C, scratch_mem);
}

ferry_status ferry_stiefel_penalty_grad_rows(ferry_backend *be, int64_t n, int64_t p,
                                             const float *W, float beta, float *dW_accumulate,
                                             float *scratch_mem) {
    return penalty_grad(be, 1, n, p, W, beta, dW_accumulate, scratch_mem);
}

/* ---- the per-block penalty pass ---- */

/* The pass over P's Stiefel parameters: their values at data + offset (P->data when
 * NULL), their gradients in G (created when missing) or, without G, at grad + offset. */
static ferry_status penalty_pass(const ferry_params *P, const float *data, ferry_grads *G,
                                 float *grad, double *penalty_out, double *drift_out) {
    ferry_backend *be = P->be;
    double pen = 0.0, sq_total = 0.0;
    int64_t kmax = 0;
    for (int i = 0; i < P->count; i++)
        if (P->items[i].constraint == FERRY_CONSTRAINT_STIEFEL && P->items[i].shape.dim[1] > kmax)
            kmax = P->items[i].shape.dim[1];
    float *C = NULL;
    ferry_status st = FERRY_OK;
    if (kmax > 0)
        st = ferry_backend_alloc(be, (size_t)ferry_stiefel_scratch_floats(kmax) * sizeof(float),
                                 (void **)&C);
    for (int i = 0; i < P->count && st == FERRY_OK; i++) {
        const ferry_param *p = &P->items[i];
        if (p->constraint != FERRY_CONSTRAINT_STIEFEL)
            continue;
        if (p->shape.ndim != 2 || (p->flags & FERRY_PARAM_ROW_SPARSE)) {
            st = ferry_errorf(FERRY_ERR_INVALID,
                              "Stiefel parameter '%s' must be a dense n x p matrix", p->name);
            break;
        }
        int64_t n = p->shape.dim[0], k = p->shape.dim[1];
        const float *W = (data != NULL ? data : P->data) + p->offset;
        float *g = G != NULL ? ferry_grads_dense(G, i) : grad != NULL ? grad + p->offset : NULL;
        double sq = 0.0;
        if (g == NULL && (G != NULL || grad != NULL)) {
            st = FERRY_NOMEM();
            break;
        }
        /* One C per matrix serves the metric and the gradient. */
        if ((st = ferry_stiefel_constraint(be, n, k, W, C, C)) != FERRY_OK ||
            (st = ferry_backend_sumsq(be, k * k, C, &sq)) != FERRY_OK)
            break;
        if (g != NULL)
            st = ferry_backend_gemm(be, 0, 0, n, k, k, 4.0f * p->beta, W, k, C, k, 1.0f, g, k);
        pen += (double)p->beta * sq;
        sq_total += sq;
    }
    ferry_backend_free(be, C);
    if (penalty_out != NULL)
        *penalty_out = pen;
    if (drift_out != NULL)
        *drift_out = sqrt(sq_total);
    return st;
}

ferry_status ferry_stiefel_add_penalty_grads(const ferry_params *P, ferry_grads *G,
                                             double *penalty_out, double *drift_out) {
    FERRY_ASSERT(G->P != NULL && G->P->numel == P->numel && G->P->count == P->count);
    return penalty_pass(P, NULL, G, NULL, penalty_out, drift_out);
}

ferry_status ferry_stiefel_add_penalty_block(const ferry_params *P, const float *data, float *grad,
                                             double *penalty_out, double *drift_out) {
    return penalty_pass(P, data, NULL, grad, penalty_out, drift_out);
}
