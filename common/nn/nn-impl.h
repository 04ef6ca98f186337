/* nn-impl.h - helpers shared by the layers in common/nn/, not part of nn.h. */
#ifndef FERRY_NN_IMPL_H
#define FERRY_NN_IMPL_H

#include "common/tensor/backend.h"

/* y(N, D) = b broadcast over rows (the bias before a GEMM with beta = 1). */
ferry_status ferry__nn_broadcast_rows(ferry_backend *be, int64_t N, int64_t D, const float *b,
                                      float *y);

/* Deferred gradient work of a context (ferry_ctx_set_deferred): fn(arg) runs on the
 * context's helper thread, after every job deferred before it, or at once on this
 * thread when deferral is off. arg and everything fn reads must outlive the step
 * (context scratch does); fn may write only gradients no other code touches before
 * ferry_ctx_sync (a layer's weight gradients). */
typedef struct ferry__ctx_job {
    ferry_status (*fn)(void *arg);
    void *arg;
} ferry__ctx_job;
struct ferry_ctx;
int ferry__ctx_deferred(const struct ferry_ctx *ctx);
ferry_status ferry__ctx_defer(struct ferry_ctx *ctx, ferry__ctx_job job);

#endif /* FERRY_NN_IMPL_H */
