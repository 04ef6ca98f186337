/* linear.c - the fully connected layer y = x W^T + b over the last axis of x.
 * Forward is one GEMM over all leading rows; backward is two GEMMs (dW += g^T x,
 * dx += g W) and a column sum for db, all accumulating (beta = 1). A weight with a
 * Stiefel constraint is used through cdopt's dissolving map A(W) (section below). */
#include <stdio.h>
#include <string.h>

#include "common/core/log.h"
#include "common/nn/nn-impl.h"
#include "ferry/nn.h"
#include "common/nn/constraint.h" /* ferry_stiefel_map, ferry_stiefel_map_backward */

typedef struct linear_saved {
    ferry_linear *m;
    const ferry_tensor *x; /* (N, C) rows of the input; must not change before backward */
    const float *w;        /* (D, C) the weight forward used: the raw W, or A(W) (arena) */
    int constrained;       /* 1: w is A(W) of a Stiefel-constrained raw W */
    int64_t N;
} linear_saved;

/* Length of the layer prefix of a parameter name ("decoder" of "decoder.weight"). */
static int prefix_len(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot ? (int)(dot - name) : (int)strlen(name);
}

ferry_status ferry_linear_init(ferry_linear *m, ferry_params *P, const char *prefix, int64_t C,
                               int64_t D, int bias) {
    char name[FERRY_PARAM_NAME_MAX + 16];
    ferry_status st;
    memset(m, 0, sizeof *m);
    if (C <= 0 || D <= 0)
        return ferry_errorf(FERRY_ERR_SHAPE, "linear %s: sizes must be positive (C=%lld, D=%lld)",
                            prefix, (long long)C, (long long)D);
    m->P = P;
    m->C = C;
    m->D = D;
    m->bias = -1;
    (void)snprintf(name, sizeof name, "%s.weight", prefix);
    if ((st = ferry_params_add(P, name, ferry_shape_2d(D, C), 0, &m->weight)) != FERRY_OK)
        return st;
    if (bias) {
        (void)snprintf(name, sizeof name, "%s.bias", prefix);
        if ((st = ferry_params_add(P, name, ferry_shape_1d(D), 0, &m->bias)) != FERRY_OK)
            return st;
    }
    return FERRY_OK;
}

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

/* ---- the effective weight (Stiefel-constrained W) ----
 * As in the LSTM (lstm.c) and cdopt's layers (spec/stiefel.md §1, §4): the weight
 * (D, C) is the manifold variable as stored, n = D rows >= p = C columns (orthonormal
 * columns, W^T W = I_C; ferry_params_set_constraint refuses D < C). Forward multiplies
 * by A(W) = W (1.5 I - 0.5 W^T W), computed from the current raw W into arena memory
 * on every call (training and evaluation alike); W is never written. Backward forms
 * dL/dA = g^T x in the arena and adds its vector-Jacobian product
 * G K - W sym(W^T G) into the raw gradient; dx uses the same A(W) as forward. The
 * penalty beta ||W^T W - I||_F^2 is the owner's business, once per optimizer step
 * (ferry_stiefel_add_penalty_grads), never added here. An unconstrained weight takes
 * none of these paths. */

static ferry_status ctx_floats(ferry_ctx *ctx, int64_t n, float **out) {
    ferry_tensor *t;
    ferry_status st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, ferry_shape_1d(n), &t);
    if (st == FERRY_OK)
        *out = ferry_tensor_f32(t);
    return st;
}

/* The (D, C) weight the layer multiplies by: the raw parameter, or A(W) in arena
 * memory with *constrained = 1. FERRY_ERR_UNSUPPORTED for an unknown constraint. */
static ferry_status linear_weight_effective(const ferry_linear *m, ferry_ctx *ctx, const float **w,
                                            int *constrained) {
    const ferry_param *p = &m->P->items[m->weight];
    const float *W = ferry_params_data(m->P, m->weight); /* (D, C) raw */
    *constrained = 0;
    if (p->constraint == FERRY_CONSTRAINT_NONE) {
        *w = W;
        return FERRY_OK;
    }
    if (p->constraint != FERRY_CONSTRAINT_STIEFEL)
        return ferry_errorf(FERRY_ERR_UNSUPPORTED, "%s: unknown constraint kind %d", p->name,
                            (int)p->constraint);
    float *A; /* (D, C) A(W), then the map's scratch */
    ferry_status st = ctx_floats(ctx, m->D * m->C + ferry_stiefel_scratch_floats(m->C), &A);
    if (st == FERRY_OK)
        st = ferry_stiefel_map(ferry_ctx_backend(ctx), m->D, m->C, W, A, A + m->D * m->C);
    if (st != FERRY_OK)
        return st;
    *w = A;
    *constrained = 1;
    return FERRY_OK;
}

/* dW_raw (D, C) += the map backward of dA = g^T x for a constrained weight. */
static ferry_status linear_weight_grad_constrained(const ferry_linear *m, ferry_ctx *ctx,
                                                   const linear_saved *s, const float *g,
                                                   const float *x, float *dW) {
    ferry_backend *be = ferry_ctx_backend(ctx);
    int64_t n = m->D * m->C;
    float *buf; /* dA (D, C), its map backward (D, C), the map's scratch */
    ferry_status st = ctx_floats(ctx, 2 * n + ferry_stiefel_scratch_floats(m->C), &buf);
    if (st == FERRY_OK)
        st =
            ferry_backend_gemm(be, 1, 0, m->D, m->C, s->N, 1.0f, g, m->D, x, m->C, 0.0f, buf, m->C);
    if (st == FERRY_OK)
        st = ferry_stiefel_map_backward(be, m->D, m->C, ferry_params_data(m->P, m->weight), buf,
                                        buf + n, buf + 2 * n);
    return st != FERRY_OK ? st : ferry_backend_axpy(be, n, 1.0f, buf + n, dW);
}

/* ---- forward and backward ---- */

static ferry_status linear_backward(ferry_ctx *ctx, void *saved, ferry_tensor *const *grad_out,
                                    ferry_tensor **grad_in) {
    linear_saved *s = saved;
    ferry_linear *m = s->m;
    ferry_backend *be = ferry_ctx_backend(ctx);
    const float *g = ferry_tensor_f32(grad_out[0]); /* (N, D) */
    const float *x = ferry_tensor_f32(s->x);        /* (N, C) */
    ferry_grads *G = ferry_ctx_grads(ctx, m->P);
    if (G == NULL)
        return FERRY_ERR_NOMEM;
    float *dW = ferry_grads_dense(G, m->weight); /* (D, C) */
    if (dW == NULL)
        return FERRY_ERR_NOMEM;
    ferry_status st = s->constrained ? linear_weight_grad_constrained(m, ctx, s, g, x, dW)
                                     : ferry_backend_gemm(be, 1, 0, m->D, m->C, s->N, 1.0f, g, m->D,
                                                          x, m->C, 1.0f, dW, m->C);
    if (st == FERRY_OK && m->bias >= 0) {
        float *db = ferry_grads_dense(G, m->bias); /* (D) */
        st = db ? ferry_backend_sum_rows(be, s->N, m->D, g, db) : FERRY_ERR_NOMEM;
    }
    if (st == FERRY_OK && grad_in[0] != NULL) /* dx(N, C) += g W_eff */
        st = ferry_backend_gemm(be, 0, 0, s->N, m->C, m->D, 1.0f, g, m->D, s->w, m->C, 1.0f,
                                ferry_tensor_f32(grad_in[0]), m->C);
    return st;
}

ferry_status ferry_linear_forward(ferry_linear *m, ferry_ctx *ctx, const ferry_tensor *x,
                                  ferry_tensor **y) {
    const char *name = m->P->items[m->weight].name;
    char xs[64];
    if (m->P->data == NULL)
        return ferry_errorf(FERRY_ERR_INVALID, "linear %.*s: parameters are not allocated",
                            prefix_len(name), name);
    if (x->dtype != FERRY_DTYPE_F32 || x->shape.ndim < 1 || x->shape.dim[x->shape.ndim - 1] != m->C)
        return ferry_errorf(FERRY_ERR_SHAPE,
                            "linear %.*s: input %s%s does not match weight (%lld, %lld): want "
                            "(..., %lld) float32",
                            prefix_len(name), name, ferry_shape_str(x->shape, xs, sizeof xs),
                            x->dtype == FERRY_DTYPE_F32 ? "" : " (not float32)", (long long)m->D,
                            (long long)m->C, (long long)m->C);
    ferry_backend *be = ferry_ctx_backend(ctx);
    int64_t N = ferry_tensor_numel(x) / m->C;
    ferry_shape ys = x->shape;
    ys.dim[ys.ndim - 1] = m->D;
    ferry_tensor *out;
    ferry_status st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, ys, &out);
    if (st != FERRY_OK)
        return st;
    float *yd = ferry_tensor_f32(out); /* (N, D) */
    const float *w = NULL;             /* (D, C) raw W, or A(W) for a constrained weight */
    int constrained = 0;
    if ((st = linear_weight_effective(m, ctx, &w, &constrained)) != FERRY_OK)
        return st;
    /* With a bias, y starts as the broadcast bias and the GEMM accumulates onto it:
     * one pass over y instead of BLAS zeroing it and a second pass adding b. */
    float beta = 0.0f;
    if (m->bias >= 0 && N > 0) {
        if ((st = ferry__nn_broadcast_rows(be, N, m->D, ferry_params_data(m->P, m->bias), yd)) !=
            FERRY_OK)
            return st;
        beta = 1.0f;
    }
    if ((st = ferry_backend_gemm(be, 0, 1, N, m->D, m->C, 1.0f, ferry_tensor_f32(x), m->C, w, m->C,
                                 beta, yd, m->D)) != FERRY_OK)
        return st;
    if (ferry_ctx_training(ctx)) {
        linear_saved *s = ferry_ctx_host_alloc(ctx, sizeof *s);
        if (s == NULL)
            return FERRY_ERR_NOMEM;
        s->m = m;
        s->x = x;
        s->w = w;
        s->constrained = constrained;
        s->N = N;
        ferry_tensor *in[1] = {(ferry_tensor *)(uintptr_t)x};
        if ((st = ferry_ctx_record(ctx, linear_backward, s, 1, in, 1, &out)) != FERRY_OK)
            return st;
    }
    *y = out;
    return FERRY_OK;
}
