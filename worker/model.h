/* model.h - the word-level LSTM language model of the PTB literature:
 * embedding -> dropout -> multi-layer LSTM -> dropout -> linear decoder ->
 * softmax cross-entropy, trained with truncated BPTT. h and c are carried across
 * windows and detached. All parameters live in one block (ferry_params). */
#ifndef FERRY_MODEL_H
#define FERRY_MODEL_H

#include <stdint.h>

#include "nn/nn.h"

typedef struct ferry_lm_config {
    int64_t V;        /* vocabulary */
    int64_t E;        /* embedding size */
    int64_t H;        /* hidden size */
    int L;            /* LSTM layers */
    float dropout;    /* on embeddings, between layers and before the decoder */
    float init_scale; /* parameters ~ U(-s, s) (Zaremba et al. use 0.1) */
    float stiefel_beta; /* > 0: every weight_hh is Stiefel-constrained */
    uint64_t seed;
} ferry_lm_config;

typedef struct ferry_lm {
    ferry_lm_config cfg;
    ferry_backend *be;
    ferry_params P;
    ferry_embedding emb;
    ferry_lstm rnn;
    ferry_linear dec;
    int64_t B;           /* batch size of the carried state */
    ferry_tensor *h, *c; /* (L, B, H) carried state, owned */
} ferry_lm;

/* Builds and initialises the model on be. */
ferry_status ferry_lm_create(ferry_backend *be, const ferry_lm_config *cfg, ferry_lm **out);
void ferry_lm_destroy(ferry_lm *lm);
/* Zeroes the carried state, resizing it for batch B. */
ferry_status ferry_lm_reset_state(ferry_lm *lm, int64_t B);
/* One window: inputs and targets are HOST int32 (T, B). Records on ctx when it
 * is training. *loss = loss_scale * summed cross-entropy (a scalar on the ctx
 * backend); *loss_sum = unscaled sum over the T*B tokens. The final h, c are
 * copied into the carried state (detached). */
ferry_status ferry_lm_forward(ferry_lm *lm, ferry_ctx *ctx, const ferry_tensor *inputs,
                              const ferry_tensor *targets, float loss_scale, ferry_tensor **loss,
                              double *loss_sum);
/* ||W^T W - I||_F of every layer's raw weight_hh, into out[0..L). */
ferry_status ferry_lm_feasibility(const ferry_lm *lm, double *out);
/* Analytic FLOPs of one training step (forward + backward) on a (T, B) window:
 * 2·M·N·K per GEMM, forward and the two backward GEMMs. */
double ferry_lm_step_flops(const ferry_lm_config *cfg, int64_t T, int64_t B);

#endif /* FERRY_MODEL_H */
