/* dropout.c - inverted dropout: y = x * mask with mask in {0, 1/(1-p)}, drawn by
 * the backend's counter-based generator from the context's (seed, offset) stream
 * so that a step can be replayed exactly. Backward is dx += g * mask. */
#include <stdint.h>
#include <string.h>

#include "common/tensor/backend.h"
#include "common/core/log.h"
#include "ferry/nn.h"

typedef struct dropout_saved {
    const float *mask; /* backend, numel floats */
    int64_t numel;
} dropout_saved;

static ferry_status dropout_backward(ferry_ctx *ctx, void *saved, ferry_tensor *const *grad_out,
                                     ferry_tensor **grad_in) {
    dropout_saved *s = saved;
    if (grad_in[0] == NULL)
        return FERRY_OK;
    ferry_backend *be = ferry_ctx_backend(ctx);
    ferry_tensor *tmp; /* (numel) g * mask, then added into dx */
    ferry_status st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, ferry_shape_1d(s->numel), &tmp);
    if (st == FERRY_OK)
        st = ferry_backend_mul(be, s->numel, ferry_tensor_f32(grad_out[0]), s->mask,
                               ferry_tensor_f32(tmp));
    if (st == FERRY_OK)
        st = ferry_backend_axpy(be, s->numel, 1.0f, ferry_tensor_f32(tmp),
                                ferry_tensor_f32(grad_in[0]));
    return st;
}

/* y = x * mask for a mask already on the backend; records the node. */
static ferry_status dropout_apply(ferry_ctx *ctx, const ferry_tensor *x, const float *mask,
                                  ferry_tensor **y) {
    ferry_tensor *out;
    int64_t n = ferry_tensor_numel(x);
    ferry_status st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, x->shape, &out);
    if (st == FERRY_OK)
        st = ferry_backend_mul(ferry_ctx_backend(ctx), n, ferry_tensor_f32(x), mask,
                               ferry_tensor_f32(out));
    if (st != FERRY_OK)
        return st;
    if (ferry_ctx_training(ctx)) {
        dropout_saved *s = ferry_ctx_host_alloc(ctx, sizeof *s);
        if (s == NULL)
            return FERRY_NOMEM();
        s->mask = mask;
        s->numel = n;
        ferry_tensor *in[1] = {(ferry_tensor *)(uintptr_t)x};
        if ((st = ferry_ctx_record(ctx, dropout_backward, s, 1, in, 1, &out)) != FERRY_OK)
            return st;
    }
    *y = out;
    return FERRY_OK;
}

static ferry_status check_input(const ferry_tensor *x) {
    char xs[64];
    if (x->dtype != FERRY_DTYPE_F32)
        return ferry_errorf(FERRY_ERR_SHAPE, "dropout: input %s must be float32",
                            ferry_shape_str(x->shape, xs, sizeof xs));
    return FERRY_OK;
}

ferry_status ferry_dropout_forward(ferry_ctx *ctx, float p, const ferry_tensor *x,
                                   ferry_tensor **y) {
    ferry_status st;
    if (!(p >= 0.0f && p < 1.0f))
        return ferry_errorf(FERRY_ERR_INVALID, "dropout: p = %g outside [0, 1)", (double)p);
    if ((st = check_input(x)) != FERRY_OK)
        return st;
    if (!ferry_ctx_training(ctx) || p == 0.0f) {
        *y = (ferry_tensor *)(uintptr_t)x; /* identity: no copy, no node */
        return FERRY_OK;
    }
    int64_t n = ferry_tensor_numel(x);
    ferry_tensor *mask; /* (numel) in {0, 1/(1-p)} */
    if ((st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, ferry_shape_1d(n), &mask)) != FERRY_OK)
        return st;
    if ((st = ferry_ctx_dropout_mask(ctx, n, p, ferry_tensor_f32(mask))) != FERRY_OK)
        return st;
    return dropout_apply(ctx, x, ferry_tensor_f32(mask), y);
}

ferry_status ferry_dropout_forward_mask(ferry_ctx *ctx, const ferry_tensor *x, const float *mask,
                                        ferry_tensor **y) {
    ferry_status st = check_input(x);
    if (st != FERRY_OK)
        return st;
    if (mask == NULL)
        return ferry_errorf(FERRY_ERR_INVALID, "dropout: NULL mask");
    /* The mask is host memory; keep a backend copy for forward and backward. */
    ferry_tensor *dmask;
    if ((st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, x->shape, &dmask)) != FERRY_OK)
        return st;
    if ((st = ferry_tensor_from_host(dmask, mask)) != FERRY_OK)
        return st;
    return dropout_apply(ctx, x, ferry_tensor_f32(dmask), y);
}
