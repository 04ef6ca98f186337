/* tape.c - remote embedding and sharded softmax cross-entropy as nodes of the local
 * autograd tape: the Forward RPC runs at record time, the node's backward is the
 * Backward RPC under the same (context, call id). Tensors on a device backend are
 * staged through host scratch of the autograd context, since RPC payloads are host
 * memory. */
#include <stdint.h>
#include <string.h>

#include "common/tensor/backend.h"
#include "common/dist/dist.h"
#include "ferry/ferry.h"
#include "common/core/log.h"

typedef struct remote_saved {
    ferry_remote *m;
    ferry_dist_ctx *dc;
    uint64_t ctx_id; /* the distributed context the Forward ran in */
    uint64_t call;
    int64_t n;   /* rows */
    float scale; /* xent: the loss scale */
} remote_saved;

ferry_status ferry__dist_host_floats(ferry_ctx *ctx, const ferry_tensor *t, const float **out) {
    if (ferry_backend_is_host(t->be)) {
        *out = ferry_tensor_f32(t);
        return FERRY_OK;
    }
    float *h = ferry_ctx_host_alloc(ctx, ferry_tensor_nbytes(t));
    if (h == NULL)
        return FERRY_NOMEM();
    *out = h;
    return ferry_tensor_to_host(t, h);
}

ferry_status ferry__dist_check_open(const ferry_remote *m, ferry_dist_ctx *dc, ferry_ctx *ctx) {
    if (ferry_ctx_training(ctx) && (dc == NULL || ferry_dist_ctx_id(dc) == 0))
        return ferry_errorf(FERRY_ERR_INVALID,
                            "remote module '%s' in a training step needs an open distributed "
                            "context (ferry_dist_ctx_begin)",
                            m->name);
    return FERRY_OK;
}

ferry_status ferry__dist_check_same(const ferry_remote *m, ferry_dist_ctx *dc, uint64_t ctx_id) {
    if (ferry_dist_ctx_id(dc) != ctx_id)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "backward of remote module '%s': its distributed context %#llx was "
                            "stepped or released before the tape ran backward",
                            m->name, (unsigned long long)ctx_id);
    return FERRY_OK;
}

/* ---- embedding ---- */

static ferry_status embedding_backward(ferry_ctx *ctx, void *saved, ferry_tensor *const *grad_out,
                                       ferry_tensor **grad_in) {
    (void)grad_in; /* ids take no gradient */
    remote_saved *s = saved;
    const float *g; /* (n, E) */
    ferry_status st = ferry__dist_check_same(s->m, s->dc, s->ctx_id);
    if (st == FERRY_OK)
        st = ferry__dist_host_floats(ctx, grad_out[0], &g);
    if (st == FERRY_OK)
        st = ferry_remote_embedding_backward(s->m, s->dc, s->call, g);
    return st;
}

ferry_status ferry_dist_embedding_forward(ferry_remote *emb, ferry_dist_ctx *dc, ferry_ctx *ctx,
                                          const ferry_tensor *ids, ferry_tensor **out) {
    ferry_status st = ferry__dist_check_open(emb, dc, ctx);
    if (st != FERRY_OK)
        return st;
    if (ids->dtype != FERRY_DTYPE_I32 || ids->shape.ndim > FERRY_MAX_DIMS - 1 ||
        (ids->be != NULL && !ferry_backend_is_host(ids->be)))
        return ferry_errorf(FERRY_ERR_INVALID,
                            "embedding '%s': ids must be a host int32 tensor of rank <= %d",
                            emb->name, FERRY_MAX_DIMS - 1);
    int training = ferry_ctx_training(ctx);
    int64_t n = ferry_tensor_numel(ids);
    ferry_shape shape = ids->shape;
    shape.dim[shape.ndim++] = emb->cols;
    ferry_tensor *x; /* (ids shape..., E) */
    if ((st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, shape, &x)) != FERRY_OK)
        return st;
    int on_host = ferry_backend_is_host(x->be);
    float *h = on_host ? ferry_tensor_f32(x) : ferry_ctx_host_alloc(ctx, ferry_tensor_nbytes(x));
    if (h == NULL)
        return FERRY_NOMEM();
    uint64_t call = 0;
    st = ferry_remote_embedding_forward(emb, training ? dc : NULL, ferry_tensor_i32(ids), n, h,
                                        &call);
    if (st == FERRY_OK && !on_host)
        st = ferry_tensor_from_host(x, h);
    if (st == FERRY_OK && training) {
        remote_saved *s = ferry_ctx_host_alloc(ctx, sizeof *s);
        if (s == NULL)
            return FERRY_NOMEM();
        *s = (remote_saved){emb, dc, ferry_dist_ctx_id(dc), call, n, 1.0f};
        st = ferry_ctx_record(ctx, embedding_backward, s, 0, NULL, 1, &x);
    }
    if (st == FERRY_OK)
        *out = x;
    return st;
}

ferry_status ferry__dist_add_host(ferry_ctx *ctx, ferry_tensor *gin, const float *dh, int64_t n) {
    ferry_backend *be = ferry_ctx_backend(ctx);
    if (ferry_backend_is_host(gin->be))
        return ferry_backend_axpy(be, n, 1.0f, dh, ferry_tensor_f32(gin));
    ferry_tensor *tmp;
    ferry_status st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, gin->shape, &tmp);
    if (st == FERRY_OK && (st = ferry_tensor_from_host(tmp, dh)) == FERRY_OK)
        st = ferry_backend_axpy(be, n, 1.0f, ferry_tensor_f32(tmp), ferry_tensor_f32(gin));
    return st;
}

/* ---- classic decoder: logits cross the wire ---- */

static ferry_status logits_backward(ferry_ctx *ctx, void *saved, ferry_tensor *const *grad_out,
                                    ferry_tensor **grad_in) {
    remote_saved *s = saved;
    int64_t H = s->m->cols;
    const float *dz; /* (N, V) */
    ferry_status st = ferry__dist_check_same(s->m, s->dc, s->ctx_id);
    if (st == FERRY_OK)
        st = ferry__dist_host_floats(ctx, grad_out[0], &dz);
    float *dh = ferry_ctx_host_alloc(ctx, (size_t)(s->n * H + 1) * sizeof *dh); /* (N, H) */
    if (st == FERRY_OK && dh == NULL)
        st = FERRY_NOMEM();
    if (st == FERRY_OK)
        st = ferry_remote_logits_backward(s->m, s->dc, s->call, dz, dh);
    if (st != FERRY_OK || grad_in[0] == NULL)
        return st;
    return ferry__dist_add_host(ctx, grad_in[0], dh, s->n * H);
}

ferry_status ferry_dist_logits_forward(ferry_remote *dec, ferry_dist_ctx *dc, ferry_ctx *ctx,
                                       const ferry_tensor *hidden, ferry_tensor **logits) {
    ferry_status st = ferry__dist_check_open(dec, dc, ctx);
    if (st != FERRY_OK)
        return st;
    if (hidden->dtype != FERRY_DTYPE_F32 || hidden->shape.ndim < 1 ||
        hidden->shape.dim[hidden->shape.ndim - 1] != dec->cols) {
        char hs[64];
        return ferry_errorf(FERRY_ERR_SHAPE, "decoder '%s': hidden %s must be float32 (..., %lld)",
                            dec->name, ferry_shape_str(hidden->shape, hs, sizeof hs),
                            (long long)dec->cols);
    }
    int training = ferry_ctx_training(ctx);
    int64_t N = ferry_tensor_numel(hidden) / dec->cols;
    ferry_shape shape = hidden->shape;
    shape.dim[shape.ndim - 1] = dec->rows;
    const float *h; /* (N, H) */
    ferry_tensor *z; /* (..., V) */
    if ((st = ferry__dist_host_floats(ctx, hidden, &h)) != FERRY_OK ||
        (st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, shape, &z)) != FERRY_OK)
        return st;
    int on_host = ferry_backend_is_host(z->be);
    float *zh = on_host ? ferry_tensor_f32(z) : ferry_ctx_host_alloc(ctx, ferry_tensor_nbytes(z));
    if (zh == NULL)
        return FERRY_NOMEM();
    uint64_t call = 0;
    st = ferry_remote_logits_forward(dec, training ? dc : NULL, h, N, zh, &call);
    if (st == FERRY_OK && !on_host)
        st = ferry_tensor_from_host(z, zh);
    if (st == FERRY_OK && training) {
        remote_saved *s = ferry_ctx_host_alloc(ctx, sizeof *s);
        if (s == NULL)
            return FERRY_NOMEM();
        *s = (remote_saved){dec, dc, ferry_dist_ctx_id(dc), call, N, 1.0f};
        ferry_tensor *in = (ferry_tensor *)(uintptr_t)hidden;
        st = ferry_ctx_record(ctx, logits_backward, s, 1, &in, 1, &z);
    }
    if (st == FERRY_OK)
        *logits = z;
    return st;
}

/* ---- sharded softmax cross-entropy ---- */

static ferry_status xent_backward(ferry_ctx *ctx, void *saved, ferry_tensor *const *grad_out,
                                  ferry_tensor **grad_in) {
    remote_saved *s = saved;
    int64_t H = s->m->cols;
    float g;
    ferry_status st = ferry__dist_check_same(s->m, s->dc, s->ctx_id);
    if (st == FERRY_OK)
        st = ferry_tensor_to_host(grad_out[0], &g);
    float *dh = ferry_ctx_host_alloc(ctx, (size_t)(s->n * H + 1) * sizeof *dh); /* (N, H) */
    if (st == FERRY_OK && dh == NULL)
        st = FERRY_NOMEM();
    /* Always sent, even when hidden needs no gradient: the shards accumulate dW, db. */
    if (st == FERRY_OK)
        st = ferry_remote_xent_backward(s->m, s->dc, s->call, NULL, s->scale * g, dh);
    if (st != FERRY_OK || grad_in[0] == NULL)
        return st;
    return ferry__dist_add_host(ctx, grad_in[0], dh, s->n * H);
}

ferry_status ferry_dist_xent_forward(ferry_remote *dec, ferry_dist_ctx *dc, ferry_ctx *ctx,
                                     const ferry_tensor *hidden, const ferry_tensor *targets,
                                     float scale, ferry_tensor **loss, double *loss_sum) {
    ferry_status st = ferry__dist_check_open(dec, dc, ctx);
    if (st != FERRY_OK)
        return st;
    int ok = hidden->dtype == FERRY_DTYPE_F32 && targets->dtype == FERRY_DTYPE_I32 &&
             hidden->shape.ndim >= 1 && targets->shape.ndim == hidden->shape.ndim - 1 &&
             hidden->shape.dim[hidden->shape.ndim - 1] == dec->cols &&
             (targets->be == NULL || ferry_backend_is_host(targets->be));
    for (int d = 0; ok && d < targets->shape.ndim; d++)
        ok = targets->shape.dim[d] == hidden->shape.dim[d];
    if (!ok) {
        char hs[64], ts[64];
        return ferry_errorf(FERRY_ERR_SHAPE,
                            "decoder '%s': hidden %s must be float32 (..., %lld) and targets %s "
                            "host int32 of its leading shape",
                            dec->name, ferry_shape_str(hidden->shape, hs, sizeof hs),
                            (long long)dec->cols, ferry_shape_str(targets->shape, ts, sizeof ts));
    }
    int training = ferry_ctx_training(ctx);
    int64_t N = ferry_tensor_numel(targets);
    const float *h; /* (N, H) */
    double sum = 0.0;
    uint64_t call = 0;
    if ((st = ferry__dist_host_floats(ctx, hidden, &h)) != FERRY_OK ||
        (st = ferry_remote_xent_forward(dec, training ? dc : NULL, h, ferry_tensor_i32(targets), N,
                                        NULL, &sum, &call)) != FERRY_OK)
        return st;
    float value = (float)((double)scale * sum);
    ferry_tensor *out;
    if ((st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, ferry_shape_1d(1), &out)) != FERRY_OK ||
        (st = ferry_tensor_from_host(out, &value)) != FERRY_OK)
        return st;
    if (training) {
        remote_saved *s = ferry_ctx_host_alloc(ctx, sizeof *s);
        if (s == NULL)
            return FERRY_NOMEM();
        *s = (remote_saved){dec, dc, ferry_dist_ctx_id(dc), call, N, scale};
        ferry_tensor *in = (ferry_tensor *)(uintptr_t)hidden;
        if ((st = ferry_ctx_record(ctx, xent_backward, s, 1, &in, 1, &out)) != FERRY_OK)
            return st;
    }
    *loss = out;
    if (loss_sum != NULL)
        *loss_sum = sum;
    return FERRY_OK;
}
