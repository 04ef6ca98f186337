/* loss.c - softmax cross-entropy over the last axis: a scalar loss
 * scale * sum_n (logsumexp(z_n) - z_n[target_n]) and its gradient
 * (softmax(z) - onehot(target)) * scale * g for the upstream scalar g.
 *
 * The backend op overwrites the logits with the softmax probabilities in
 * forward, and backward turns those probabilities into the gradient in place and
 * hands that storage to the context as the logits' gradient (no zero-filled
 * buffer, no extra pass: this matters for a language model's decoder output of
 * N = T*B rows by V = 10000 words). It is safe because nothing else reads the
 * logits after the loss and the node runs backward once; callers that still need
 * the logits must copy them first. */
#include <stdint.h>
#include <string.h>

#include "common/tensor/backend.h"
#include "common/core/log.h"
#include "ferry/nn.h"

typedef struct xent_saved {
    const ferry_tensor *logits; /* the gradient goes to this tensor */
    float *probs;               /* backend (N, V): the caller's logits, now probabilities */
    const int32_t *targets;     /* backend (N) */
    int64_t N, V;
    float scale;
} xent_saved;

static ferry_status xent_backward(ferry_ctx *ctx, void *saved, ferry_tensor *const *grad_out,
                                  ferry_tensor **grad_in) {
    (void)grad_in; /* the logits are no recorded input: see ferry_ctx_grad_accumulate */
    xent_saved *s = saved;
    ferry_backend *be = ferry_ctx_backend(ctx);
    float g;
    ferry_status st = ferry_tensor_to_host(grad_out[0], &g);
    if (st != FERRY_OK)
        return st;
    ferry_tensor *dlogits = ferry_ctx_host_alloc(ctx, sizeof *dlogits);
    if (dlogits == NULL)
        return FERRY_NOMEM();
    /* probs -> (probs - onehot) * scale * g in place: the logits' gradient. */
    if ((st = ferry_backend_xent_backward(be, s->N, s->V, s->probs, s->targets, s->scale * g)) !=
        FERRY_OK)
        return st;
    *dlogits = ferry_tensor_wrap(be, FERRY_DTYPE_F32, s->logits->shape, s->probs);
    return ferry_ctx_grad_accumulate(ctx, s->logits, dlogits);
}

/* Validates shapes, dtypes and target range; stores N and V. */
static ferry_status xent_check(const ferry_tensor *logits, const ferry_tensor *targets, int64_t *N,
                               int64_t *V) {
    char ls[64], ts[64];
    int ok = logits->dtype == FERRY_DTYPE_F32 && targets->dtype == FERRY_DTYPE_I32 &&
             logits->shape.ndim >= 1 && targets->shape.ndim == logits->shape.ndim - 1 &&
             (targets->be == NULL || ferry_backend_is_host(targets->be));
    for (int d = 0; ok && d < targets->shape.ndim; d++)
        ok = targets->shape.dim[d] == logits->shape.dim[d];
    if (!ok || logits->shape.dim[logits->shape.ndim - 1] < 1)
        return ferry_errorf(FERRY_ERR_SHAPE,
                            "xent: logits %s (float32, (..., V)) and targets %s (host int32, "
                            "the leading shape) do not match",
                            ferry_shape_str(logits->shape, ls, sizeof ls),
                            ferry_shape_str(targets->shape, ts, sizeof ts));
    *V = logits->shape.dim[logits->shape.ndim - 1];
    *N = ferry_tensor_numel(targets);
    const int32_t *t = ferry_tensor_i32(targets);
    for (int64_t n = 0; n < *N; n++)
        if (t[n] < 0 || t[n] >= *V)
            return ferry_errorf(FERRY_ERR_RANGE,
                                "xent: target %d at position %lld outside [0, %lld)", (int)t[n],
                                (long long)n, (long long)*V);
    return FERRY_OK;
}

ferry_status ferry_xent_forward(ferry_ctx *ctx, const ferry_tensor *logits,
                                const ferry_tensor *targets, float scale, ferry_tensor **loss,
                                double *loss_sum) {
    int64_t N = 0, V = 0;
    ferry_status st = xent_check(logits, targets, &N, &V);
    if (st != FERRY_OK)
        return st;
    ferry_backend *be = ferry_ctx_backend(ctx);
    /* Targets: a host copy kept for backward, and a backend copy for the op. */
    int32_t *htargets = ferry_ctx_host_alloc(ctx, (size_t)(N ? N : 1) * sizeof(int32_t));
    float *hrows = ferry_ctx_host_alloc(ctx, (size_t)(N ? N : 1) * sizeof(float));
    if (htargets == NULL || hrows == NULL)
        return FERRY_NOMEM();
    memcpy(htargets, ferry_tensor_i32(targets), (size_t)N * sizeof(int32_t));
    const int32_t *dtargets = htargets;
    ferry_tensor *rows, *out, *dt;
    if ((st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, ferry_shape_1d(N), &rows)) != FERRY_OK)
        return st;
    if (!ferry_backend_is_host(be)) {
        if ((st = ferry_ctx_tensor(ctx, FERRY_DTYPE_I32, ferry_shape_1d(N), &dt)) != FERRY_OK ||
            (st = ferry_tensor_from_host(dt, htargets)) != FERRY_OK)
            return st;
        dtargets = ferry_tensor_i32(dt);
    }
    float *probs = ferry_tensor_f32(logits); /* (N, V), overwritten: see the file comment */
    if ((st = ferry_backend_xent_forward(be, N, V, probs, dtargets, ferry_tensor_f32(rows))) !=
        FERRY_OK)
        return st;
    if ((st = ferry_tensor_to_host(rows, hrows)) != FERRY_OK)
        return st;
    double sum = 0.0;
    for (int64_t n = 0; n < N; n++)
        sum += (double)hrows[n];
    float value = (float)((double)scale * sum);
    if ((st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, ferry_shape_1d(1), &out)) != FERRY_OK ||
        (st = ferry_tensor_from_host(out, &value)) != FERRY_OK)
        return st;
    if (ferry_ctx_training(ctx)) {
        xent_saved *s = ferry_ctx_host_alloc(ctx, sizeof *s);
        if (s == NULL)
            return FERRY_NOMEM();
        s->logits = logits;
        s->probs = probs;
        s->targets = dtargets;
        s->N = N;
        s->V = V;
        s->scale = scale;
        if ((st = ferry_ctx_record(ctx, xent_backward, s, 0, NULL, 1, &out)) != FERRY_OK)
            return st;
    }
    *loss = out;
    if (loss_sum != NULL)
        *loss_sum = sum;
    return FERRY_OK;
}
