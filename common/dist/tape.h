/* tape.h - remote modules as nodes of a local autograd tape (ARCHITECTURE.md §3):
 * a remote Forward runs now and records a node whose backward is the Backward RPC
 * with the same (context, call id), so ferry_ctx_backward walks local layers and
 * remote calls alike. This is how ferry-trainer runs embedding -> LSTM -> decoder
 * with the embedding and decoder on ferry-ps:
 *
 *     ferry_ctx_reset(ctx, step);  ferry_dist_ctx_begin(dc);
 *     ferry_dist_embedding_forward(emb, dc, ctx, inputs, &x);        // (T, B) -> (T, B, E)
 *     ferry_lstm_forward(&rnn, ctx, x, h0, c0, NULL, &y, &hn, &cn);  // local
 *     ferry_dist_xent_forward(dec, dc, ctx, y, targets, 1.0f / N, &loss, &sum);
 *     ferry_ctx_backward(ctx, loss);          // Backward RPCs to the decoder, then embedding
 *     ferry_dist_ctx_clip_step(dc, local_sumsq, clip, lr, &coef, &norm);
 *     ferry_optim_step(opt, &P, G, coef);      // the local block with the same coefficient
 *
 * In eval mode (ferry_ctx_set_training(ctx, 0)) the calls carry no context and
 * nothing is recorded or saved; dc may then be NULL. */
#ifndef FERRY_DIST_TAPE_H
#define FERRY_DIST_TAPE_H

#include "ferry/ferry.h"
#include "nn/ctx.h"

/* Embedding lookup: ids is a HOST int32 tensor of any shape with ids in [0, V);
 * *out is (ids shape..., E) on ctx's backend (arena memory of ctx). Training mode
 * needs an open dc. Errors as ferry_remote_embedding_forward; FERRY_ERR_INVALID
 * for a rank above 3 or a training ctx without an open dc. */
ferry_status ferry_dist_embedding_forward(ferry_remote *emb, ferry_dist_ctx *dc, ferry_ctx *ctx,
                                          const ferry_tensor *ids, ferry_tensor **out);

/* Sharded softmax cross-entropy of the remote decoder: hidden (..., H) on ctx's
 * backend; targets a HOST int32 tensor of hidden's leading shape. *loss is a
 * scalar (1) tensor holding scale * the summed per-row loss (like ferry_xent_forward);
 * *loss_sum (may be NULL) the unscaled sum in double. The node's backward sends
 * the loss gradient times scale to the shards and accumulates dh into hidden's
 * gradient when hidden requires one. */
ferry_status ferry_dist_xent_forward(ferry_remote *dec, ferry_dist_ctx *dc, ferry_ctx *ctx,
                                     const ferry_tensor *hidden, const ferry_tensor *targets,
                                     float scale, ferry_tensor **loss, double *loss_sum);

/* The classic decoder: logits (..., V) of the remote decoder come back to the trainer
 * (N x V floats on the wire each way); the node's backward sends dlogits and
 * accumulates the returned dh into hidden's gradient. Pair it with a local
 * ferry_xent_forward. */
ferry_status ferry_dist_logits_forward(ferry_remote *dec, ferry_dist_ctx *dc, ferry_ctx *ctx,
                                       const ferry_tensor *hidden, ferry_tensor **logits);

#endif /* FERRY_DIST_TAPE_H */
