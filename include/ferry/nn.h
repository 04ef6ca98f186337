/* nn.h - layers with forward and backward, run inside an autograd context.
 * Each layer declares its parameters in a parameter block at init (caller storage,
 * the block allocated afterwards), validates shapes on every call, computes through
 * ferry_backend_* only, and records a backward node on the context's tape when the
 * context is training. Backward accumulates parameter gradients into the
 * context's ferry_grads, never into the block.
 *
 *     ferry_embedding emb;  ferry_lstm rnn;  ferry_linear dec;
 *     ferry_embedding_init(&emb, &P, "encoder", V, E);
 *     ferry_lstm_init(&rnn, &P, "lstm", E, H, 2, 0.0f);
 *     ferry_linear_init(&dec, &P, "decoder", H, V, 1);
 *     ferry_params_alloc(&P);  ... init values ...
 *     ferry_embedding_forward(&emb, ctx, ids, &x);           // (T,B) -> (T,B,E)
 *     ferry_lstm_forward(&rnn, ctx, x, h0, c0, &y, &hn, &cn); // (T,B,E) -> (T,B,H)
 *     ferry_linear_forward(&dec, ctx, y, &logits);           // (T,B,H) -> (T,B,V)
 *     ferry_xent_forward(ctx, logits, targets, 1.0f, &loss, &sum);
 *     ferry_ctx_backward(ctx, loss);
 */
#ifndef FERRY_NN_H
#define FERRY_NN_H

#include "ferry/export.h"
#include "ferry/autograd.h"
#include "ferry/params.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_LSTM_MAX_LAYERS 8

/* ---- Embedding: (…) int32 ids -> (…, E); row-sparse gradient ---- */

typedef struct ferry_embedding {
    ferry_params *P;
    int weight; /* (V, E), FERRY_PARAM_ROW_SPARSE */
    int64_t V, E;
} ferry_embedding;

/* Declares "<prefix>.weight" (V, E). */
FERRY_API ferry_status ferry_embedding_init(ferry_embedding *m, ferry_params *P, const char *prefix,
                                            int64_t V, int64_t E);
/* ids is a HOST int32 tensor of any shape (ids must be in [0, V): FERRY_ERR_RANGE
 * otherwise, naming the offending id); *out is (ids shape…, E) on the ctx backend. */
FERRY_API ferry_status ferry_embedding_forward(ferry_embedding *m, ferry_ctx *ctx,
                                               const ferry_tensor *ids, ferry_tensor **out);

/* ---- Linear: (…, C) -> (…, D), y = x W^T + b with W (D, C) ---- */

typedef struct ferry_linear {
    ferry_params *P;
    int weight, bias; /* weight (D, C) may carry a Stiefel constraint (D >= C): the layer
                         then uses A(W), see linear.c; bias = -1 when absent */
    int64_t C, D;
} ferry_linear;

FERRY_API ferry_status ferry_linear_init(ferry_linear *m, ferry_params *P, const char *prefix,
                                         int64_t C, int64_t D, int bias);
FERRY_API ferry_status ferry_linear_forward(ferry_linear *m, ferry_ctx *ctx, const ferry_tensor *x,
                                            ferry_tensor **y);

/* ---- LSTM: PyTorch nn.LSTM layout and semantics (gates i, f, g, o) ---- */

typedef struct ferry_lstm {
    ferry_params *P;
    int64_t C, H;                    /* input size, hidden size */
    int L;                           /* layers */
    float dropout;                   /* between layers, training only */
    int w_ih[FERRY_LSTM_MAX_LAYERS]; /* (4H, C_l) */
    int w_hh[FERRY_LSTM_MAX_LAYERS]; /* (4H, H); may carry a Stiefel constraint */
    int b_ih[FERRY_LSTM_MAX_LAYERS]; /* (4H) */
    int b_hh[FERRY_LSTM_MAX_LAYERS]; /* (4H) */
} ferry_lstm;

/* Declares "<prefix>.weight_ih_l{k}", "weight_hh_l{k}", "bias_ih_l{k}", "bias_hh_l{k}". */
FERRY_API ferry_status ferry_lstm_init(ferry_lstm *m, ferry_params *P, const char *prefix,
                                       int64_t C, int64_t H, int L, float dropout);
/* The same for layers first .. first+L-1 of a deeper stack whose other layers live
 * elsewhere (a model split across processes): the parameters are named after their
 * layer in the whole stack ("<prefix>.weight_ih_l{first+k}"); C is the input size of
 * layer `first` (the embedding size for 0, else H). */
FERRY_API ferry_status ferry_lstm_init_from(ferry_lstm *m, ferry_params *P, const char *prefix,
                                            int64_t C, int64_t H, int L, float dropout, int first);

typedef struct ferry_lstm_opts {
    /* Optional inter-layer dropout masks, masks[k] (T, B, H) applied to layer k's
     * output for k < L-1 (values 0 or 1/(1-p)); NULL draws them from the context.
     * Host memory (copied); used in training mode only, like the dropout itself. */
    const float *const *masks;
} ferry_lstm_opts;

/* x (T, B, C); h0, c0 (L, B, H) or NULL for zeros. Outputs y (T, B, H) = last
 * layer's h at every step, hn and cn (L, B, H). Full BPTT over T in backward;
 * gradients flow into x, h0 and c0 when they require them. h0 and c0 are copied
 * (the caller may overwrite them before backward); x must stay unchanged until
 * backward. FERRY_ERR_SHAPE for wrong shapes or dtypes (the message names the
 * layer and both shapes).
 * A weight_hh with constraint FERRY_CONSTRAINT_STIEFEL is used as cdopt's LSTM_cdopt
 * does: every call (train and eval) computes A(W) = W (1.5 I - 0.5 W^T W) from the
 * current raw W into context arena memory and runs the cell with it; W is never
 * modified. Backward adds the map's backward of dL/dA into the raw W's gradient.
 * The penalty beta ||W^T W - I||^2 and its gradient 4 beta W C are NOT added here:
 * the parameters' owner adds them once per optimizer step with
 * ferry_stiefel_add_penalty_grads (ferry/optim.h), so several forward calls or
 * trainers do not count them more than once. Parameters must not change between a
 * forward and its backward. FERRY_ERR_UNSUPPORTED for any other constraint kind. */
FERRY_API ferry_status ferry_lstm_forward(ferry_lstm *m, ferry_ctx *ctx, const ferry_tensor *x,
                                          const ferry_tensor *h0, const ferry_tensor *c0,
                                          const ferry_lstm_opts *opts, ferry_tensor **y,
                                          ferry_tensor **hn, ferry_tensor **cn);

/* ---- Dropout (inverted), mask drawn from the context's random stream ---- */

/* In eval mode or with p == 0, *y = x (no copy, no node). */
FERRY_API ferry_status ferry_dropout_forward(ferry_ctx *ctx, float p, const ferry_tensor *x,
                                             ferry_tensor **y);
/* The same with a given mask (tests): numel(x) host floats, copied, applied in
 * every mode. */
FERRY_API ferry_status ferry_dropout_forward_mask(ferry_ctx *ctx, const ferry_tensor *x,
                                                  const float *mask, ferry_tensor **y);

/* ---- Softmax cross-entropy ---- */

/* logits (…, V); targets a HOST int32 tensor with the leading shape (ids in
 * [0, V), FERRY_ERR_RANGE otherwise). *loss is a scalar (1) tensor holding
 * scale * sum over rows of -log softmax(target); *loss_sum (host, may be NULL)
 * receives the unscaled sum in double. scale = 1/N gives the mean.
 * The logits are overwritten with the softmax probabilities, and backward turns
 * that storage into their gradient (no (N, V) copies); copy them first if you
 * need them afterwards. */
FERRY_API ferry_status ferry_xent_forward(ferry_ctx *ctx, const ferry_tensor *logits,
                                          const ferry_tensor *targets, float scale,
                                          ferry_tensor **loss, double *loss_sum);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_NN_H */
