/* linear.c - the fully connected layer y = x W^T + b over the last axis of x.
 * Forward is one GEMM over all leading rows; backward is two GEMMs (dW += g^T x,
 * dx += g W) and a column sum for db, all accumulating (beta = 1), through the affine
 * map ferry-ps's dense kinds share (affine.c, which also applies a Stiefel-constrained
 * weight through cdopt's dissolving map A(W)). */
#include <stdio.h>
#include <string.h>

#include "common/core/log.h"
#include "ferry/nn.h"
#include "common/nn/affine.h"

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

/* Arena floats for the affine map's scratch (none for an unconstrained weight). */
static ferry_status ctx_floats(ferry_ctx *ctx, int64_t n, float **out) {
    ferry_tensor *t;
    *out = NULL;
    if (n == 0)
        return FERRY_OK;
    ferry_status st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, ferry_shape_1d(n), &t);
    if (st == FERRY_OK)
        *out = ferry_tensor_f32(t);
    return st;
}

/* 1 for a Stiefel-constrained weight; FERRY_ERR_UNSUPPORTED for an unknown constraint. */
static ferry_status linear_constrained(const ferry_linear *m, int *constrained) {
    const ferry_param *p = &m->P->items[m->weight];
    *constrained = p->constraint == FERRY_CONSTRAINT_STIEFEL;
    if (p->constraint != FERRY_CONSTRAINT_NONE && !*constrained)
        return ferry_errorf(FERRY_ERR_UNSUPPORTED, "%s: unknown constraint kind %d", p->name,
                            (int)p->constraint);
    return FERRY_OK;
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
        return FERRY_NOMEM();
    float *dW = ferry_grads_dense(G, m->weight); /* (D, C) */
    if (dW == NULL)
        return FERRY_NOMEM_SAID;
    float *db = m->bias >= 0 ? ferry_grads_dense(G, m->bias) : NULL; /* (D) */
    if (m->bias >= 0 && db == NULL)
        return FERRY_NOMEM_SAID;
    float *scratch;
    ferry_status st =
        ctx_floats(ctx, ferry_affine_scratch_floats(m->C, m->D, s->constrained, 0), &scratch);
    if (st == FERRY_OK) /* dx (N, C) += g W_eff */
        st = ferry_affine_backward(
            be, s->N, m->C, m->D, x, g, ferry_params_data(m->P, m->weight), s->w, s->constrained,
            dW, db, grad_in[0] != NULL ? ferry_tensor_f32(grad_in[0]) : NULL, 1, scratch);
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
    float *scratch;
    if ((st = linear_constrained(m, &constrained)) != FERRY_OK ||
        (st = ctx_floats(ctx, ferry_affine_scratch_floats(m->C, m->D, constrained, 1), &scratch)) !=
            FERRY_OK ||
        (st = ferry_affine_weight(be, m->C, m->D, ferry_params_data(m->P, m->weight), constrained,
                                  scratch, &w)) != FERRY_OK ||
        (st = ferry_affine_forward(be, N, m->C, m->D, ferry_tensor_f32(x), w,
                                   m->bias >= 0 ? ferry_params_data(m->P, m->bias) : NULL, yd)) !=
            FERRY_OK)
        return st;
    if (ferry_ctx_training(ctx)) {
        linear_saved *s = ferry_ctx_host_alloc(ctx, sizeof *s);
        if (s == NULL)
            return FERRY_NOMEM();
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
