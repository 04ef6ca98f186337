/* backend.h - the compute ops every layer calls (lifetime and memory are public:
 * include/ferry/backend.h).
 * A backend owns memory and runs the ops below on it. Layers validate shapes and
 * then call ferry_backend_*; they never know whether the CPU (OpenBLAS plus plain
 * loops) or CUDA runs the op. All pointers are backend memory, all matrices
 * row-major float32, and `ld*` are row strides in elements.
 * Thread-safety: a backend may be used by one thread at a time per stream; the CPU
 * backend is reentrant. */
#ifndef FERRY_BACKEND_H
#define FERRY_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/backend.h"
#include "ferry/tensor.h"

/* One optimizer update over n floats (dense) or over U rows of width D (rows != NULL),
 * with torch 1.13's single-tensor formulas (see include/ferry/optim.h). Slots hold the optimizer
 * state with the parameter's layout (rows index param and both slots). The kernel first
 * multiplies the gradient by grad_scale (the clipping scale). Hyper-parameters are double,
 * as Python floats are in torch; the kernel derives its float32 constants from them the way
 * torch does and computes in float32. Rows must be distinct and inside the table (the
 * caller checks); untouched rows and their state are not read or written. */
typedef struct ferry_optim_update {
    ferry_optim_kind kind;
    double lr, weight_decay;
    float grad_scale;
    double momentum, dampening; /* SGD */
    int nesterov;
    int buf_fresh;              /* SGD dense: 1 on the first momentum update (buf = d) */
    double lr_decay;            /* Adagrad: effective lr = lr / (1 + (t-1) lr_decay) */
    double rho;                 /* Adadelta */
    double beta1, beta2;        /* Adam(W) */
    double eps;
    int64_t step;               /* t, 1-based, counted per optimizer step */
    float *param;               /* dense: n floats; rows: table (R, D) */
    const float *grad;          /* dense: n floats; rows: (U, D) */
    float *slot0, *slot1;       /* state, param layout; NULL when the kind needs none */
    int64_t n;                  /* dense element count */
    const int64_t *rows;        /* NULL for dense; else U row ids into the table (host memory) */
    int64_t nrows, D;           /* U and D for the row form */
    uint8_t *row_seen;          /* rows form, SGD momentum: backend memory, one byte per table
                                   row, 1 once the row's buffer exists (0: buf = d, set 1) */
} ferry_optim_update;

/* ---- dense math ---- */

/* C(M,N) = alpha * op(A)(M,K) * op(B)(K,N) + beta * C, row-major. */
ferry_status ferry_backend_gemm(ferry_backend *be, int trans_a, int trans_b, int64_t M,
                                int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                                const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
ferry_status ferry_backend_fill(ferry_backend *be, float *x, int64_t n, float v);
ferry_status ferry_backend_axpy(ferry_backend *be, int64_t n, float alpha, const float *x,
                                float *y); /* y += alpha x */
ferry_status ferry_backend_scale(ferry_backend *be, int64_t n, float alpha, float *x);
ferry_status ferry_backend_mul(ferry_backend *be, int64_t n, const float *x, const float *y,
                               float *out); /* out = x * y elementwise */
/* *out = sum x^2 accumulated in double. */
ferry_status ferry_backend_sumsq(ferry_backend *be, int64_t n, const float *x, double *out);
/* y(N,D) += b(D) broadcast over rows. */
ferry_status ferry_backend_add_bias(ferry_backend *be, int64_t N, int64_t D, const float *b,
                                    float *y);
/* out(D) += sum over rows of x(N,D). */
ferry_status ferry_backend_sum_rows(ferry_backend *be, int64_t N, int64_t D, const float *x,
                                    float *out);

/* ---- fused layer ops ---- */

/* LSTM cell, one time step for N rows. gates (N,4H) holds pre-activations
 * z = x W_ih^T + b_ih + h W_hh^T + b_hh on entry (blocks i,f,g,o) and the
 * activations sigma(i), sigma(f), tanh(g), sigma(o) on return.
 * c = f*c_prev + i*g; h = o*tanh(c). c_prev (N,H), c and h (N,H) outputs;
 * h has row stride ldh (to write into a (T,N,H) sequence slot or elsewhere). */
ferry_status ferry_backend_lstm_cell_forward(ferry_backend *be, int64_t N, int64_t H, float *gates,
                                             const float *c_prev, float *c, float *h);
/* Backward of one step. gates: activations saved by forward; c_prev, c as in forward.
 * dh (N,H): gradient reaching h_t; dc (N,H): on entry the gradient reaching c_t from
 * step t+1, on return the gradient for c_{t-1}. dgates (N,4H) written (pre-activation
 * gradients, blocks i,f,g,o). */
ferry_status ferry_backend_lstm_cell_backward(ferry_backend *be, int64_t N, int64_t H,
                                              const float *gates, const float *c_prev,
                                              const float *c, const float *dh, float *dc,
                                              float *dgates);
/* Softmax cross-entropy over rows. logits (N,V) are overwritten with softmax
 * probabilities; loss_rows[n] = -log p[n, targets[n]] (float64 on the host side is
 * the caller's business; here float). Targets must be in [0,V) (checked by layers). */
ferry_status ferry_backend_xent_forward(ferry_backend *be, int64_t N, int64_t V, float *logits,
                                        const int32_t *targets, float *loss_rows);
/* probs (N,V) → gradient in place: (probs - onehot(targets)) * scale. */
ferry_status ferry_backend_xent_backward(ferry_backend *be, int64_t N, int64_t V, float *probs,
                                         const int32_t *targets, float scale);
/* Sharded-softmax partials over a vocabulary slice: for each row, row_max[n] = max z,
 * z overwritten with e = exp(z - row_max), row_sumexp[n] = sum e in double (the same
 * arithmetic as xent_forward, so one slice reproduces the local loss bit for bit),
 * and target_logit[n] = z[targets[n]] before the exp, or 0 where targets[n] < 0
 * (the target lies in another slice). */
ferry_status ferry_backend_softmax_partials(ferry_backend *be, int64_t N, int64_t V, float *z,
                                            const int32_t *targets, float *row_max,
                                            double *row_sumexp, float *target_logit);
/* Gradient of the sharded softmax cross-entropy in place over e from
 * softmax_partials: p = e * factor[n] (factor = exp(max_slice - max_all) / sumexp_all,
 * so p is the exact softmax), p[targets[n]] -= 1 where targets[n] >= 0, then
 * p *= scale * (row_scale ? row_scale[n] : 1). */
ferry_status ferry_backend_softmax_grad(ferry_backend *be, int64_t N, int64_t V, float *e,
                                        const float *factor, const int32_t *targets,
                                        const float *row_scale, float scale);
/* dst(n,D) = src[idx[n], :] for n < count. */
ferry_status ferry_backend_gather_rows(ferry_backend *be, int64_t count, int64_t D,
                                       const int32_t *idx, const float *src, float *dst);
/* dst[idx[n], :] += src(n, :) for n < count (serial over n; repeats accumulate). */
ferry_status ferry_backend_scatter_add_rows(ferry_backend *be, int64_t count, int64_t D,
                                            const int32_t *idx, const float *src, float *dst);
/* Inverted-dropout mask: mask[i] = (u_i >= p) / (1-p) with u_i uniform in [0,1)
 * from a counter-based generator of (seed, offset + i), so every backend draws the
 * same mask. */
ferry_status ferry_backend_dropout_mask(ferry_backend *be, int64_t n, float p, uint64_t seed,
                                        uint64_t offset, float *mask);
/* One optimizer update (see ferry_optim_update). */
ferry_status ferry_backend_optim_update(ferry_backend *be, const ferry_optim_update *u);

/* The counter-based uniform generator behind dropout_mask and parameter init:
 * a float in [0,1) from (seed, index). Same on every backend. */
float ferry_rand_uniform(uint64_t seed, uint64_t index);

#endif /* FERRY_BACKEND_H */
