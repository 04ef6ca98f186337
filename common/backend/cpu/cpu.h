/* cpu.h - the CPU backend's ops, one file per group (math.c, lstm.c, xent.c,
 * rows.c, optim.c); cpu.c assembles them into the backend table. */
#ifndef FERRY_CPU_H
#define FERRY_CPU_H

#include "common/tensor/backend-impl.h"

ferry_status ferry__cpu_gemm(ferry_backend *be, int ta, int tb, int64_t M, int64_t N, int64_t K,
                             float alpha, const float *A, int64_t lda, const float *B,
                             int64_t ldb, float beta, float *C, int64_t ldc);
ferry_status ferry__cpu_fill(ferry_backend *be, float *x, int64_t n, float v);
ferry_status ferry__cpu_axpy(ferry_backend *be, int64_t n, float alpha, const float *x, float *y);
ferry_status ferry__cpu_scale(ferry_backend *be, int64_t n, float alpha, float *x);
ferry_status ferry__cpu_mul(ferry_backend *be, int64_t n, const float *x, const float *y,
                            float *out);
ferry_status ferry__cpu_sumsq(ferry_backend *be, int64_t n, const float *x, double *out);
ferry_status ferry__cpu_add_bias(ferry_backend *be, int64_t N, int64_t D, const float *b,
                                 float *y);
ferry_status ferry__cpu_sum_rows(ferry_backend *be, int64_t N, int64_t D, const float *x,
                                 float *out);
ferry_status ferry__cpu_lstm_cell_forward(ferry_backend *be, int64_t N, int64_t H, float *gates,
                                          const float *c_prev, float *c, float *h);
ferry_status ferry__cpu_lstm_cell_backward(ferry_backend *be, int64_t N, int64_t H,
                                           const float *gates, const float *c_prev,
                                           const float *c, const float *dh, float *dc,
                                           float *dgates);
ferry_status ferry__cpu_xent_forward(ferry_backend *be, int64_t N, int64_t V, float *logits,
                                     const int32_t *targets, float *loss_rows);
ferry_status ferry__cpu_xent_backward(ferry_backend *be, int64_t N, int64_t V, float *probs,
                                      const int32_t *targets, float scale);
ferry_status ferry__cpu_softmax_partials(ferry_backend *be, int64_t N, int64_t V, float *z,
                                         const int32_t *targets, float *row_max,
                                         double *row_sumexp, float *target_logit);
ferry_status ferry__cpu_softmax_grad(ferry_backend *be, int64_t N, int64_t V, float *e,
                                     const float *factor, const int32_t *targets,
                                     const float *row_scale, float scale);
ferry_status ferry__cpu_gather_rows(ferry_backend *be, int64_t count, int64_t D,
                                    const int32_t *idx, const float *src, float *dst);
ferry_status ferry__cpu_scatter_add_rows(ferry_backend *be, int64_t count, int64_t D,
                                         const int32_t *idx, const float *src, float *dst);
ferry_status ferry__cpu_dropout_mask(ferry_backend *be, int64_t n, float p, uint64_t seed,
                                     uint64_t offset, float *mask);
ferry_status ferry__cpu_optim_update(ferry_backend *be, const ferry_optim_update *u);

#endif /* FERRY_CPU_H */
