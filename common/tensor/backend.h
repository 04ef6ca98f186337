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

/* ---- the compute ops: one list ----
 * X(op, params, args, empty, check) for each op: ferry_backend_<op>(params), declared
 * below and defined by backend.c's dispatcher, which returns FERRY_OK at once when
 * `empty` holds, then runs `check` (the arguments' checks, the same for every backend),
 * then calls the backend's table entry `op` with `args`. The table
 * (ferry_backend_ops), the CPU backend's ferry__cpu_<op> and the CUDA backend's
 * ferry__cuda_<op> prototypes come from the same list: an op is added in this list
 * and in each backend's file that implements it. */
#define FERRY_BACKEND_OP_MAP(X)                                                                    \
    /* C(M,N) = alpha * op(A)(M,K) * op(B)(K,N) + beta * C, row-major. */                          \
    X(gemm,                                                                                        \
      (ferry_backend * be, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, \
       const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,             \
       int64_t ldc),                                                                               \
      (be, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc), M == 0 || N == 0,      \
      FERRY_OK)                                                                                    \
    /* x[i] = v. */                                                                                \
    X(fill, (ferry_backend * be, float *x, int64_t n, float v), (be, x, n, v), n == 0, FERRY_OK)   \
    /* y += alpha x. */                                                                            \
    X(axpy, (ferry_backend * be, int64_t n, float alpha, const float *x, float *y),                \
      (be, n, alpha, x, y), n == 0, FERRY_OK)                                                      \
    /* x *= alpha. */                                                                              \
    X(scale, (ferry_backend * be, int64_t n, float alpha, float *x), (be, n, alpha, x), n == 0,    \
      FERRY_OK)                                                                                    \
    /* out = x * y elementwise. */                                                                 \
    X(mul, (ferry_backend * be, int64_t n, const float *x, const float *y, float *out),            \
      (be, n, x, y, out), n == 0, FERRY_OK)                                                        \
    /* *out = sum x^2 accumulated in double (0 for n == 0). */                                     \
    X(sumsq, (ferry_backend * be, int64_t n, const float *x, double *out), (be, n, x, out),        \
      (*out = 0.0, n == 0), FERRY_OK)                                                              \
    /* y(N,D) += b(D) broadcast over rows. */                                                      \
    X(add_bias, (ferry_backend * be, int64_t N, int64_t D, const float *b, float *y),              \
      (be, N, D, b, y), N == 0 || D == 0, FERRY_OK)                                                \
    /* out(D) += sum over rows of x(N,D). */                                                       \
    X(sum_rows, (ferry_backend * be, int64_t N, int64_t D, const float *x, float *out),            \
      (be, N, D, x, out), N == 0 || D == 0, FERRY_OK)                                              \
    /* LSTM cell, one time step for N rows. gates (N,4H) holds pre-activations z = x               \
     * W_ih^T + b_ih + h W_hh^T + b_hh on entry (blocks i,f,g,o) and the activations               \
     * sigma(i), sigma(f), tanh(g), sigma(o) on return. c = f*c_prev + i*g; h =                    \
     * o*tanh(c). c_prev (N,H), c and h (N,H) outputs. */                                          \
    X(lstm_cell_forward,                                                                           \
      (ferry_backend * be, int64_t N, int64_t H, float *gates, const float *c_prev, float *c,      \
       float *h),                                                                                  \
      (be, N, H, gates, c_prev, c, h), N == 0, FERRY_OK)                                           \
    /* Backward of one step. gates: activations saved by forward; c_prev, c as in                  \
     * forward. dh (N,H): gradient reaching h_t; dc (N,H): on entry the gradient                   \
     * reaching c_t from step t+1, on return the gradient for c_{t-1}. dgates (N,4H)               \
     * written (pre-activation gradients, blocks i,f,g,o). */                                      \
    X(lstm_cell_backward,                                                                          \
      (ferry_backend * be, int64_t N, int64_t H, const float *gates, const float *c_prev,          \
       const float *c, const float *dh, float *dc, float *dgates),                                 \
      (be, N, H, gates, c_prev, c, dh, dc, dgates), N == 0, FERRY_OK)                              \
    /* Softmax cross-entropy over rows. logits (N,V) are overwritten with softmax                  \
     * probabilities; loss_rows[n] = -log p[n, targets[n]] (float). Targets must be in             \
     * [0,V) (checked by layers). */                                                               \
    X(xent_forward,                                                                                \
      (ferry_backend * be, int64_t N, int64_t V, float *logits, const int32_t *targets,            \
       float *loss_rows),                                                                          \
      (be, N, V, logits, targets, loss_rows), N == 0, FERRY_OK)                                    \
    /* probs (N,V) -> gradient in place: (probs - onehot(targets)) * scale. */                     \
    X(xent_backward,                                                                               \
      (ferry_backend * be, int64_t N, int64_t V, float *probs, const int32_t *targets,             \
       float scale),                                                                               \
      (be, N, V, probs, targets, scale), N == 0, FERRY_OK)                                         \
    /* Sharded-softmax partials over a vocabulary slice: for each row, row_max[n] = max            \
     * z, z overwritten with e = exp(z - row_max), row_sumexp[n] = sum e in double (the            \
     * same arithmetic as xent_forward, so one slice reproduces the local loss bit for             \
     * bit), and target_logit[n] = z[targets[n]] before the exp, or 0 where targets[n]             \
     * < 0 (the target lies in another slice). */                                                  \
    X(softmax_partials,                                                                            \
      (ferry_backend * be, int64_t N, int64_t V, float *z, const int32_t *targets, float *row_max, \
       double *row_sumexp, float *target_logit),                                                   \
      (be, N, V, z, targets, row_max, row_sumexp, target_logit), N == 0, FERRY_OK)                 \
    /* Gradient of the sharded softmax cross-entropy in place over e from                          \
     * softmax_partials: p = e * factor[n] (factor = exp(max_slice - max_all) /                    \
     * sumexp_all, so p is the exact softmax), p[targets[n]] -= 1 where targets[n] >=              \
     * 0, then p *= scale * (row_scale ? row_scale[n] : 1). */                                     \
    X(softmax_grad,                                                                                \
      (ferry_backend * be, int64_t N, int64_t V, float *e, const float *factor,                    \
       const int32_t *targets, const float *row_scale, float scale),                               \
      (be, N, V, e, factor, targets, row_scale, scale), N == 0, FERRY_OK)                          \
    /* dst(n,D) = src[idx[n], :] for n < count. */                                                 \
    X(gather_rows,                                                                                 \
      (ferry_backend * be, int64_t count, int64_t D, const int32_t *idx, const float *src,         \
       float *dst),                                                                                \
      (be, count, D, idx, src, dst), count == 0 || D == 0, FERRY_OK)                               \
    /* dst[idx[n], :] += src(n, :) for n < count (serial over n; repeats accumulate). */           \
    X(scatter_add_rows,                                                                            \
      (ferry_backend * be, int64_t count, int64_t D, const int32_t *idx, const float *src,         \
       float *dst),                                                                                \
      (be, count, D, idx, src, dst), count == 0 || D == 0, FERRY_OK)                               \
    /* Inverted-dropout mask: mask[i] = (u_i >= p) / (1-p) with u_i uniform in [0,1)               \
     * from a counter-based generator of (seed, offset + i), so every backend draws the            \
     * same mask. p in [0, 1) (asserted). */                                                       \
    X(dropout_mask,                                                                                \
      (ferry_backend * be, int64_t n, float p, uint64_t seed, uint64_t offset, float *mask),       \
      (be, n, p, seed, offset, mask), (ferry__backend_check_p(p), n == 0), FERRY_OK)               \
    /* One optimizer update (see ferry_optim_update): its kind known, its state slots              \
     * there, its step >= 1, else FERRY_ERR_INVALID. */                                            \
    X(optim_update, (ferry_backend * be, const ferry_optim_update *u), (be, u),                    \
      (u->rows == NULL && u->n == 0) || (u->rows != NULL && u->nrows == 0),                        \
      ferry__backend_check_optim(u))

#define FERRY_BACKEND_OP_DECLARE_(op, params, args, empty, check)                                  \
    ferry_status ferry_backend_##op params;
FERRY_BACKEND_OP_MAP(FERRY_BACKEND_OP_DECLARE_)
#undef FERRY_BACKEND_OP_DECLARE_

/* The dispatchers' argument checks (backend.c). */
void ferry__backend_check_p(float p);
ferry_status ferry__backend_check_optim(const ferry_optim_update *u);
/* The state slots an optimizer of kind (SGD: with this momentum) keeps: 0, 1 or 2; -1
 * for an unknown kind. The one rule, for the dispatcher's checks and optim/. */
int ferry__optim_kind_slots(ferry_optim_kind kind, double momentum);
/* The same for one update. */
int ferry__optim_slots(const ferry_optim_update *u);

/* The counter-based uniform generator behind dropout_mask and parameter init:
 * a float in [0,1) from (seed, index). Same on every backend. */
float ferry_rand_uniform(uint64_t seed, uint64_t index);

#endif /* FERRY_BACKEND_H */
