/* backend-impl.h - what a backend implements. Each backend fills one
 * ferry_backend_ops table; backend.c's dispatchers check arguments and forward.
 * A NULL entry marks an op the backend lacks (the dispatcher reports
 * FERRY_ERR_UNSUPPORTED). */
#ifndef FERRY_BACKEND_IMPL_H
#define FERRY_BACKEND_IMPL_H

#include "common/tensor/backend.h"

typedef struct ferry_backend_ops {
    const char *name;
    int is_host;
    ferry_status (*alloc)(ferry_backend *be, size_t nbytes, void **out);
    void (*free)(ferry_backend *be, void *ptr);
    ferry_status (*copy)(ferry_backend *be, void *dst, const void *src, size_t n,
                         ferry_copy_kind kind);
    ferry_status (*sync)(ferry_backend *be);
    void (*destroy)(ferry_backend *be);

    ferry_status (*gemm)(ferry_backend *be, int ta, int tb, int64_t M, int64_t N, int64_t K,
                         float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                         float beta, float *C, int64_t ldc);
    ferry_status (*fill)(ferry_backend *be, float *x, int64_t n, float v);
    ferry_status (*axpy)(ferry_backend *be, int64_t n, float alpha, const float *x, float *y);
    ferry_status (*scale)(ferry_backend *be, int64_t n, float alpha, float *x);
    ferry_status (*mul)(ferry_backend *be, int64_t n, const float *x, const float *y, float *out);
    ferry_status (*sumsq)(ferry_backend *be, int64_t n, const float *x, double *out);
    ferry_status (*add_bias)(ferry_backend *be, int64_t N, int64_t D, const float *b, float *y);
    ferry_status (*sum_rows)(ferry_backend *be, int64_t N, int64_t D, const float *x, float *out);

    ferry_status (*lstm_cell_forward)(ferry_backend *be, int64_t N, int64_t H, float *gates,
                                      const float *c_prev, float *c, float *h);
    ferry_status (*lstm_cell_backward)(ferry_backend *be, int64_t N, int64_t H,
                                       const float *gates, const float *c_prev, const float *c,
                                       const float *dh, float *dc, float *dgates);
    ferry_status (*xent_forward)(ferry_backend *be, int64_t N, int64_t V, float *logits,
                                 const int32_t *targets, float *loss_rows);
    ferry_status (*xent_backward)(ferry_backend *be, int64_t N, int64_t V, float *probs,
                                  const int32_t *targets, float scale);
    ferry_status (*softmax_partials)(ferry_backend *be, int64_t N, int64_t V, float *z,
                                     const int32_t *targets, float *row_max, double *row_sumexp,
                                     float *target_logit);
    ferry_status (*softmax_grad)(ferry_backend *be, int64_t N, int64_t V, float *e,
                                 const float *factor, const int32_t *targets,
                                 const float *row_scale, float scale);
    ferry_status (*gather_rows)(ferry_backend *be, int64_t count, int64_t D, const int32_t *idx,
                                const float *src, float *dst);
    ferry_status (*scatter_add_rows)(ferry_backend *be, int64_t count, int64_t D,
                                     const int32_t *idx, const float *src, float *dst);
    ferry_status (*dropout_mask)(ferry_backend *be, int64_t n, float p, uint64_t seed,
                                 uint64_t offset, float *mask);
    ferry_status (*optim_update)(ferry_backend *be, const ferry_optim_update *u);
} ferry_backend_ops;

struct ferry_backend {
    const ferry_backend_ops *ops;
    int device;  /* device ordinal (CUDA); 0 on the CPU */
    void *impl;  /* backend-private state */
};

/* Constructors, one per backend; registry code in backend.c picks by name. */
ferry_status ferry__backend_cpu_create(ferry_backend **out);

/* Makes the backend for device ordinal N ("cuda:N"). */
typedef ferry_status (*ferry__backend_factory)(int ordinal, ferry_backend **out);
/* Called by libferry-cuda's ferry_cuda_register (include/ferry/cuda.h). */
void ferry__backend_register_cuda(ferry__backend_factory create);

#endif /* FERRY_BACKEND_IMPL_H */
