/* linear.c - the `linear` module kind (y = x W^T + b, optionally with a
 * Stiefel-constrained weight used through cdopt's A(W)) and the helpers every kind
 * uses to read and check its inputs and to keep what Backward needs. The decoder's
 * "logits" mode (decoder.c) is this same computation over a vocabulary slice. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/tensor/backend.h"
#include "common/core/log.h"
#include "common/core/simd.h"
#include "common/nn/affine.h"
#include "optim/stiefel.h" /* ferry_stiefel_add_penalty_grads, ferry_stiefel_penalty */
#include "server/ps-impl.h"

/* ---- saved state ---- */

void ferry__ps_saved_free(ferry__ps_saved *sv) {
    if (sv == NULL)
        return;
    for (int i = 0; i < sv->nt; i++) {
        if (sv->t[i].release != NULL)
            sv->t[i].release(sv->t[i].release_user);
    }
    if (sv->obj != NULL && sv->obj_free != NULL)
        sv->obj_free(sv->obj);
    memset(sv, 0, sizeof *sv);
}

/* Charges n bytes kept past the call to the context (its budgets). */
static ferry_status saved_charge(ferry__ps_saved *sv, size_t n, const char *name) {
    return sv->ctx != NULL
               ? ferry__ps_ctx_charge(sv->table, sv->ctx, (int64_t)n, "saved tensor", name)
               : FERRY_OK;
}

ferry_status ferry__ps_saved_take(ferry__ps_saved *sv, ferry_rpc_msg *req, int i) {
    FERRY_ASSERT(sv->nt < 3 && i >= 0 && i < req->ntensors); /* i from ferry__ps_input */
    ferry_status st = saved_charge(sv, req->tensors[i].nbytes, req->tensors[i].name);
    if (st != FERRY_OK)
        return st;
    ferry_rpc_tensor *t = &sv->t[sv->nt];
    if ((st = ferry_rpc_msg_take(req, i, t)) != FERRY_OK)
        return st;
    if (t->release == NULL) {
        /* A borrowed tensor cannot be kept past the call: copy it. */
        void *copy = ferry_buf_alloc(t->nbytes);
        if (copy == NULL)
            return FERRY_NOMEM();
        memcpy(copy, t->data, t->nbytes);
        t->data = copy;
        t->release = ferry_buf_free;
        t->release_user = copy;
    }
    sv->bytes += t->nbytes;
    sv->nt++;
    return FERRY_OK;
}

ferry_status ferry__ps_saved_alloc(ferry__ps_saved *sv, size_t n, const char *name, void **data) {
    FERRY_ASSERT(sv->nt < 3);
    ferry_status st = saved_charge(sv, n, name);
    if (st != FERRY_OK)
        return st;
    void *p = ferry_buf_alloc(n);
    if (p == NULL)
        return ferry_errorf(FERRY_ERR_NOMEM, "cannot allocate %zu bytes for a saved activation", n);
    ferry_rpc_tensor *t = &sv->t[sv->nt++];
    memset(t, 0, sizeof *t);
    t->data = p;
    t->nbytes = n;
    t->release = ferry_buf_free;
    t->release_user = p;
    sv->bytes += n;
    *data = p;
    return FERRY_OK;
}

/* ---- input checks ---- */

static const char *shape_str(int ndim, const int64_t *dim, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "(");
    for (int k = 0; k < ndim && n < cap; k++) {
        if (dim[k] < 0)
            n += (size_t)snprintf(buf + n, cap - n, "%s*", k ? ", " : "");
        else
            n += (size_t)snprintf(buf + n, cap - n, "%s%lld", k ? ", " : "", (long long)dim[k]);
    }
    if (n < cap)
        (void)snprintf(buf + n, cap - n, ")");
    return buf;
}

ferry_status ferry__ps_input_as(const ferry__ps_module *m, const ferry_rpc_msg *req,
                                const char *name, int dtype, int ndim, const int64_t *want,
                                int *i) {
    const ferry_rpc_tensor *t = ferry_rpc_msg_find(req, name);
    if (t == NULL)
        return ferry_errorf(FERRY_ERR_INVALID, "%s '%s': missing input tensor '%s'",
                            ferry__ps_kind_name(m->kind), m->name, name);
    /* FERRY_WIRE_DTYPE_INDEX accepts either integer type. */
    int ok_type = dtype != FERRY_WIRE_DTYPE_INDEX
                      ? t->dtype == dtype
                      : t->dtype == FERRY_RPC_DTYPE_I32 || t->dtype == FERRY_RPC_DTYPE_I64;
    if (!ok_type)
        return ferry_errorf(FERRY_ERR_INVALID, "%s '%s': tensor '%s' must be %s, got %s",
                            ferry__ps_kind_name(m->kind), m->name, name,
                            ferry_wire_dtype_name(dtype), ferry_wire_dtype_name(t->dtype));
    int ok_shape = t->ndim == ndim;
    for (int k = 0; ok_shape && k < ndim; k++)
        ok_shape = want[k] < 0 || t->dim[k] == want[k];
    if (!ok_shape) {
        char a[96], b[96];
        return ferry_errorf(FERRY_ERR_SHAPE, "%s '%s': tensor '%s' must be %s, got %s",
                            ferry__ps_kind_name(m->kind), m->name, name,
                            shape_str(ndim, want, a, sizeof a),
                            shape_str(t->ndim, t->dim, b, sizeof b));
    }
    *i = (int)(t - req->tensors);
    return FERRY_OK;
}

ferry_status ferry__ps_input(const ferry__ps_module *m, const ferry_rpc_msg *req,
                             ferry_wire_tensor_id id, const int64_t *want, int *i) {
    const ferry_wire_tensor *w = &ferry_wire_tensors[id];
    FERRY_ASSERT(w->dir == FERRY_WIRE_FWD_IN || w->dir == FERRY_WIRE_BWD_IN);
    FERRY_ASSERT(ferry_wire_modes[w->mode].kind == m->kind->wire);
    if (w->optional && ferry_rpc_msg_find(req, w->name) == NULL) {
        *i = -1;
        return FERRY_OK;
    }
    return ferry__ps_input_as(m, req, w->name, w->dtype, w->rank, want, i);
}

ferry_status ferry__ps_output(ferry_rpc_msg *reply, ferry_wire_tensor_id id, const int64_t *dim,
                              void **data) {
    const ferry_wire_tensor *w = &ferry_wire_tensors[id];
    FERRY_ASSERT(w->dir == FERRY_WIRE_FWD_OUT || w->dir == FERRY_WIRE_BWD_OUT);
    return ferry_rpc_msg_alloc(reply, w->dtype, w->rank, dim, w->name, data);
}

/* Whether x[0..FINITE_BLOCK) holds a NaN or an infinity (exponent bits all ones): no
 * branch and a fixed count, so the loop vectorises; a loop that stops at the first bad
 * element does not, and ran at a scalar element per cycle over every dense gradient. */
enum { FINITE_BLOCK = 4096 };
static FERRY_HOT_LOOP int block_has_nonfinite(const float *x) {
    uint32_t bad = 0;
    for (int k = 0; k < FINITE_BLOCK; k++) {
        uint32_t u;
        memcpy(&u, &x[k], sizeof u);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return bad != 0;
}

ferry_status ferry__ps_check_finite(const ferry__ps_module *m, const char *what, const float *x,
                                    int64_t n) {
    for (int64_t b = 0; b < n; b += FINITE_BLOCK) {
        int64_t e = n - b < FINITE_BLOCK ? n : b + FINITE_BLOCK;
        if (e - b == FINITE_BLOCK && !block_has_nonfinite(x + b))
            continue;
        for (int64_t k = b; k < e; k++) /* the block with one, or the tail */
            if (!isfinite(x[k]))
                return ferry_errorf(FERRY_ERR_NUMERIC, "%s '%s': %s[%lld] is %g",
                                    ferry__ps_kind_name(m->kind), m->name, what, (long long)k,
                                    (double)x[k]);
    }
    return FERRY_OK;
}

void ferry__ps_read_ids(const ferry_rpc_tensor *t, int64_t n, int64_t *dst) {
    if (t->dtype == FERRY_RPC_DTYPE_I64) {
        memcpy(dst, t->data, (size_t)n * sizeof *dst);
        return;
    }
    const int32_t *src = t->data;
    for (int64_t k = 0; k < n; k++)
        dst[k] = src[k];
}

/* ---- the Stiefel-constrained weight ----
 * Conventions (spec/stiefel.md): the manifold variable is the weight as stored,
 * W (D, C) with n = D rows >= p = C columns, constraint W^T W = I_C (orthonormal
 * columns; a linear layer that maps C inputs to D >= C outputs). Every Forward and
 * Backward computes A(W) = W (1.5 I - 0.5 W^T W) afresh from the current raw W into
 * memory of its own that is freed when the call ends; W is written only by Step and
 * SetParams. Backward maps dL/dA to the raw gradient with the map's vector-Jacobian
 * product G K - W sym(W^T G). The penalty beta ||W^T W - I||_F^2 is added by the
 * handlers once per context (ferry__ps_constraint_penalty), never per call. */

ferry_status ferry__ps_saved_keep(ferry__ps_saved *sv, void *obj, void (*obj_free)(void *),
                                  size_t n, const char *name) {
    ferry_status st = saved_charge(sv, n, name);
    if (st != FERRY_OK || sv->obj != NULL) {
        obj_free(obj);
        return st != FERRY_OK ? st : ferry_errorf(FERRY_ERR_INVALID, "%s kept twice", name);
    }
    sv->obj = obj;
    sv->obj_free = obj_free;
    sv->bytes += n;
    return FERRY_OK;
}

int ferry__ps_constrained(const ferry__ps_module *m) {
    return m->cfg.constraint != FERRY_CONSTRAINT_NONE;
}

ferry_status ferry__ps_constraint_penalty(const ferry__ps_module *m, ferry_grads *G,
                                          double *penalty, double *feasibility) {
    *penalty = *feasibility = 0.0;
    if (!ferry__ps_constrained(m))
        return FERRY_OK;
    if (m->kind->penalty != NULL) {
        float *g = ferry_grads_dense(G, m->w);
        return g != NULL ? m->kind->penalty(m, g, penalty, feasibility) : FERRY_NOMEM_SAID;
    }
    /* The block's only constrained parameter is the weight: the block-wide pass adds
     * 4 beta W C(W) to its gradient (creating it when no Backward reached it). */
    return ferry_stiefel_add_penalty_grads(&m->P, G, penalty, feasibility);
}

ferry_status ferry__ps_constraint_metrics(const ferry__ps_module *m, double *penalty,
                                          double *feasibility) {
    *penalty = *feasibility = 0.0;
    if (!ferry__ps_constrained(m))
        return FERRY_OK;
    if (m->kind->penalty != NULL)
        return m->kind->penalty(m, NULL, penalty, feasibility);
    double sq = 0.0;
    ferry_status st =
        ferry_stiefel_penalty(m->P.be, m->rows, m->cols, ferry_params_data(&m->P, m->w),
                              m->P.items[m->w].beta, penalty, &sq, NULL);
    *feasibility = sqrt(sq);
    return st;
}

/* ---- the linear map shared with the decoder's logits mode ---- */

/* The affine map of common/nn/affine.c, the local Linear's own, with scratch from the
 * backend for the duration of the call, one block: A(W) of a constrained weight and
 * the map's scratch, then (backward) the map's gradient buffers. */
static ferry_status affine_scratch(const ferry__ps_module *m, int backward, float **buf) {
    int c = ferry__ps_constrained(m);
    int64_t n = ferry_affine_scratch_floats(m->cols, m->rows, c, 1) +
                (backward ? ferry_affine_scratch_floats(m->cols, m->rows, c, 0) : 0);
    *buf = NULL;
    if (n == 0)
        return FERRY_OK;
    if (ferry_backend_alloc(m->P.be, (size_t)n * sizeof(float), (void **)buf) != FERRY_OK)
        return ferry_errorf(FERRY_ERR_NOMEM, "%s '%s': cannot allocate %lld floats for A(W)",
                            ferry__ps_kind_name(m->kind), m->name, (long long)n);
    return FERRY_OK;
}

/* y (N, D) = x (N, C) W_eff^T + b, with W_eff (D, C) the raw W or A(W), b (D) or none. */
ferry_status ferry__ps_affine_apply(const ferry__ps_module *m, int64_t N, const float *x,
                                    float *y) {
    ferry_backend *be = m->P.be;
    const float *w;
    float *buf;
    ferry_status st = affine_scratch(m, 0, &buf);
    if (st == FERRY_OK)
        st = ferry_affine_weight(be, m->cols, m->rows, ferry_params_data(&m->P, m->w),
                                 ferry__ps_constrained(m), buf, &w);
    if (st == FERRY_OK)
        st = ferry_affine_forward(be, N, m->cols, m->rows, x, w,
                                  m->b >= 0 ? ferry_params_data(&m->P, m->b) : NULL, y);
    ferry_backend_free(be, buf);
    return st;
}

/* dW (D, C) += dy^T x (constrained: += the map backward of dA = dy^T x); db (D) +=
 * column sums of dy; dx (N, C) = dy W_eff. */
ferry_status ferry__ps_affine_grad(const ferry__ps_module *m, int64_t N, const float *x,
                                   const float *dy, ferry_grads *G, float *dx,
                                   ferry__ps_saved *sv) {
    ferry_backend *be = m->P.be;
    float *dW = ferry_grads_dense(G, m->w);
    float *db = m->b >= 0 ? ferry_grads_dense(G, m->b) : NULL;
    if (dW == NULL || (m->b >= 0 && db == NULL))
        return FERRY_NOMEM_SAID;
    if (N == 0)
        return FERRY_OK;
    int constrained = ferry__ps_constrained(m);
    const float *W = ferry_params_data(&m->P, m->w), *w;
    if (sv != NULL && sv->late_ok && !constrained) {
        /* The input gradient now (it goes back first), the weight's after the reply. */
        sv->late.pending = 1;
        sv->late.N = N;
        sv->late.x = x;
        sv->late.dy = dy;
        return ferry_affine_backward(be, N, m->cols, m->rows, x, dy, W, W, 0, NULL, NULL, dx, 0,
                                     NULL);
    }
    float *buf; /* A(W) and its scratch, then the backward's (none when unconstrained) */
    ferry_status st = affine_scratch(m, 1, &buf);
    if (st == FERRY_OK)
        st = ferry_affine_weight(be, m->cols, m->rows, W, constrained, buf, &w);
    if (st == FERRY_OK)
        st = ferry_affine_backward(
            be, N, m->cols, m->rows, x, dy, W, w, constrained, dW, db, dx, 0,
            buf != NULL ? buf + ferry_affine_scratch_floats(m->cols, m->rows, constrained, 1)
                        : NULL);
    ferry_backend_free(be, buf);
    return st;
}

ferry_status ferry__ps_affine_grad_weights(const ferry__ps_module *m, ferry__ps_saved *sv,
                                           ferry_grads *G) {
    if (!sv->late.pending)
        return FERRY_OK;
    sv->late.pending = 0;
    float *dW = ferry_grads_dense(G, m->w);
    float *db = m->b >= 0 ? ferry_grads_dense(G, m->b) : NULL;
    if (dW == NULL || (m->b >= 0 && db == NULL))
        return FERRY_NOMEM_SAID;
    const float *W = ferry_params_data(&m->P, m->w);
    return ferry_affine_backward(m->P.be, sv->late.N, m->cols, m->rows, sv->late.x, sv->late.dy, W,
                                 W, 0, dW, db, NULL, 0, NULL);
}

/* Forward of the affine map: input `in_name` (N, C) -> output `out_name` (N, D).
 * Saves the input for backward. */
ferry_status ferry__ps_affine_forward(ferry__ps_module *m, ferry_wire_tensor_id in,
                                      ferry_wire_tensor_id out, ferry_rpc_msg *req,
                                      ferry_rpc_msg *reply, ferry__ps_saved *save) {
    int64_t want[2] = {-1, m->cols};
    int ix;
    ferry_status st = ferry__ps_input(m, req, in, want, &ix);
    if (st != FERRY_OK)
        return st;
    const ferry_rpc_tensor *x = &req->tensors[ix];
    int64_t N = x->dim[0];
    if ((st = ferry__ps_check_finite(m, ferry_wire_tensors[in].name, x->data, N * m->cols)) !=
        FERRY_OK)
        return st;
    int64_t dim[2] = {N, m->rows};
    float *y;
    if ((st = ferry__ps_output(reply, out, dim, (void **)&y)) != FERRY_OK)
        return st;
    if ((st = ferry__ps_affine_apply(m, N, x->data, y)) != FERRY_OK)
        return st;
    if (save != NULL) {
        save->N = N;
        st = ferry__ps_saved_take(save, req, ix); /* x (N, C) */
    }
    return st;
}

/* Backward of the affine map: `grad_name` (N, D) -> `out_name` (N, C); the saved
 * input is save->t[0]. */
ferry_status ferry__ps_affine_backward(ferry__ps_module *m, ferry_wire_tensor_id grad,
                                       ferry_wire_tensor_id out, ferry__ps_saved *saved,
                                       ferry_rpc_msg *req, ferry_grads *G, ferry_rpc_msg *reply) {
    int64_t want[2] = {saved->N, m->rows};
    int idy;
    ferry_status st = ferry__ps_input(m, req, grad, want, &idy);
    if (st != FERRY_OK)
        return st;
    const float *dy = req->tensors[idy].data;
    if ((st = ferry__ps_check_finite(m, ferry_wire_tensors[grad].name, dy, saved->N * m->rows)) !=
        FERRY_OK)
        return st;
    int64_t dim[2] = {saved->N, m->cols};
    float *dx;
    if ((st = ferry__ps_output(reply, out, dim, (void **)&dx)) != FERRY_OK)
        return st;
    return ferry__ps_affine_grad(m, saved->N, saved->t[0].data, dy, G, dx, saved);
}

/* ---- the linear kind: dims [C, D], W (D, C), optional b (D) ---- */

static ferry_status linear_declare(ferry__ps_module *m) {
    const ferry__ps_module_config *c = &m->cfg;
    int64_t C = c->dims[0], D = c->dims[1];
    if (c->row_begin != 0 || c->row_count != D)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "linear '%s': row sharding is not supported (row_begin %lld, "
                            "row_count %lld; leave both 0)",
                            m->name, (long long)c->row_begin, (long long)c->row_count);
    if (c->constraint == FERRY_CONSTRAINT_STIEFEL && D < C)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "linear '%s': a Stiefel constraint needs D >= C (the weight (D, C) "
                            "= (%lld, %lld) gets orthonormal columns, W^T W = I_C), got D < C",
                            m->name, (long long)D, (long long)C);
    m->rows = D;
    m->cols = C;
    m->b = -1;
    ferry_status st =
        ferry_params_add(&m->P, FERRY_WIRE_PARAM_NAME(WEIGHT), ferry_shape_2d(D, C), 0, &m->w);
    if (st == FERRY_OK && c->constraint != FERRY_CONSTRAINT_NONE)
        st = ferry_params_set_constraint(&m->P, m->w, c->constraint, (float)c->beta);
    if (st == FERRY_OK && c->bias)
        st = ferry_params_add(&m->P, FERRY_WIRE_PARAM_NAME(BIAS), ferry_shape_1d(D), 0, &m->b);
    return st;
}

static ferry_status linear_forward(ferry__ps_module *m, ferry_wire_mode mode, ferry_rpc_msg *req,
                                   ferry_rpc_msg *reply, ferry__ps_saved *save) {
    (void)mode; /* one mode */
    return ferry__ps_affine_forward(m, FERRY_WIRE_LINEAR_FWD_X, FERRY_WIRE_LINEAR_FWD_Y, req, reply,
                                    save);
}

static ferry_status linear_backward(ferry__ps_module *m, const Ferry__V1__BackwardRequest *q,
                                    ferry__ps_saved *saved, ferry_rpc_msg *req, ferry_grads *G,
                                    ferry_rpc_msg *reply) {
    (void)q;
    return ferry__ps_affine_backward(m, FERRY_WIRE_LINEAR_BWD_DY, FERRY_WIRE_LINEAR_BWD_DX, saved,
                                     req, G, reply);
}

const ferry__ps_kind ferry__ps_kind_linear = {
    .wire = FERRY_WIRE_KIND_LINEAR,
    .declare = linear_declare,
    .forward = linear_forward,
    .backward = linear_backward,
    .late_dw = 1,
};
