/* pipeline.h - the micro-batched distributed step (pipeline.c): the window's time
 * steps in M chunks, the trainer's LSTM on one chunk while the servers run the
 * decoder on another. Used by ferry_lm_train_step when the model has more than one
 * micro-batch. */
#ifndef FERRY_WORKER_PIPELINE_H
#define FERRY_WORKER_PIPELINE_H

#include <stdint.h>

#include "ferry/ferry.h"

#define FERRY_LM_MAX_MICRO 64

typedef struct ferry_lm ferry_lm;
typedef struct ferry_lm_pipe ferry_lm_pipe;

/* Where a pipeline's time went, summed over the steps since it was last taken. */
typedef struct ferry_lm_pipe_stats {
    int64_t steps;
    double wall_s;         /* forward + backward of the steps (embedding included) */
    double trainer_busy_s; /* the trainer computing its stage (LSTM forward, backward) */
    double servers_busy_s; /* the decoder's calls in flight (server compute and wire) */
} ferry_lm_pipe_stats;

ferry_status ferry_lm_pipe_create(int M, ferry_lm_pipe **out);
void ferry_lm_pipe_destroy(ferry_lm_pipe *p);
int ferry_lm_pipe_micro(const ferry_lm_pipe *p);
/* Copies the totals into *out and zeroes them. */
void ferry_lm_pipe_take_stats(ferry_lm_pipe *p, ferry_lm_pipe_stats *out);

/* Forward and backward of one training window in micro-batches: afterwards the
 * servers hold the embedding's and decoder's gradients in dc's context, ctx holds
 * the LSTM's (ferry_ctx_grads(ctx, &lm->P)), the carried state has moved on, and
 * *loss_sum is the window's summed cross-entropy. ctx must have been reset with the
 * step's id and seed, in training mode. batch, col0: a job's global batch and this
 * rank's first column of it (the masks are those columns of the whole batch's); 0, 0
 * for a batch of the inputs alone. */
ferry_status ferry_lm_pipe_forward_backward(ferry_lm *lm, ferry_lm_pipe *p, ferry_ctx *ctx,
                                            ferry_dist_ctx *dc, const ferry_tensor *inputs,
                                            const ferry_tensor *targets, float loss_scale,
                                            uint64_t seed, int64_t batch, int64_t col0,
                                            double *loss_sum);

#endif /* FERRY_WORKER_PIPELINE_H */
