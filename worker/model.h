/* model.h - the word-level LSTM language model of the PTB literature:
 * embedding -> dropout -> multi-layer LSTM -> dropout -> linear decoder ->
 * softmax cross-entropy, trained with truncated BPTT. h and c are carried across
 * windows and detached.
 *
 * Two placements. Local: all parameters in one block of this process. Distributed:
 * the embedding and the decoder live on ferry-ps shards (row-sharded, vocabulary-
 * sliced) and only the LSTM is local; the remote calls are nodes of the same tape, so
 * one ferry_ctx_backward runs the whole model. Both placements draw every initial
 * value from (seed, index in the local layout), so they start from identical
 * parameters and, without dropout, train identically. */
#ifndef FERRY_MODEL_H
#define FERRY_MODEL_H

#include <stdint.h>

#include "ferry/ferry.h"
#include "ferry/nn.h"
#include "ferry/optim.h"
#include "worker/pipeline.h"

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

typedef enum ferry_decoder_mode {
    FERRY_DECODER_LOGITS = 0,  /* logits (N, V) come to the trainer: the classic design */
    FERRY_DECODER_SHARDED = 1, /* sharded softmax: only per-row partials cross the wire */
} ferry_decoder_mode;

/* Where the embedding and decoder live when they are remote. */
typedef struct ferry_lm_placement {
    ferry_cluster *cluster;
    ferry_decoder_mode decoder_mode;
    ferry_optim_config optim; /* the shards' optimizer (the trainer's own config) */
    /* A data-parallel job: the LSTM's master copy and optimizer live on the servers
     * too, as the dense module "lstm" (the local block, rows split over the servers;
     * with a decoder slice, the slice's rows are the module "dec-slice"); each step
     * pulls them, pushes their gradient and steps there. Rank 0
     * creates every module from its own initial values and says ready; the others
     * wait for it. NULL: the LSTM is the trainer's alone. */
    ferry_job *job;
    /* A job resuming from a checkpoint: the modules are made where missing, but no
     * rank initialises, says ready or waits; the roll-back sets their values. */
    int resume;
    /* Model parallelism: where the LSTM's layers run, as consecutive groups
     * "WHERE:K,WHERE:K,..." from layer 0 up, WHERE being "local" (this trainer) or
     * "psI" (server I of the cluster, an lstm module); the counts add up to the
     * layers. NULL or "": all local. */
    const char *stages;
    /* The last local_vocab rows of the decoder (weight and bias) are this trainer's
     * own parameters, computed here while ferry-ps computes the rest of the
     * vocabulary (ferry_remote_decoder_set_local): the decoder's work split over the
     * trainer's core and the servers'. Sharded softmax only; 0: all on the servers. */
    int64_t local_vocab;
    /* The prefix of the module names outside a job ("NAME/encoder", so that two
     * models share a server); NULL or "": the bare names. A job's modules carry the
     * job's name instead. */
    const char *model;
    /* 1: the modules must be new. The creating trainer (rank 0, or a run outside a
     * job) refuses modules that ferry-ps already holds — an earlier run's trained
     * parameters — with FERRY_ERR_EXISTS, before it says ready: continuing them is
     * asked for (fresh = 0), never silent. */
    int fresh;
} ferry_lm_placement;

/* The model; its fields are model.c's and pipeline.c's (worker/model-impl.h). */
typedef struct ferry_lm ferry_lm;

/* Builds and initialises the model on be; placement NULL keeps everything local,
 * otherwise the embedding ("encoder") and decoder ("decoder") are created on the
 * cluster (idempotent: an existing module of the same shape is reused). */
ferry_status ferry_lm_create(ferry_backend *be, const ferry_lm_config *cfg, ferry_lm **out);
ferry_status ferry_lm_create_placed(ferry_backend *be, const ferry_lm_config *cfg,
                                    const ferry_lm_placement *placement, ferry_lm **out);
void ferry_lm_destroy(ferry_lm *lm);
int ferry_lm_is_remote(const ferry_lm *lm);
/* Whether a --stages spec places nlayers layers on nservers servers and the trainer
 * ("ps0:1,local:1"); FERRY_ERR_INVALID with the message ferry_lm_create_placed would
 * give. NULL or "" is every layer here. */
ferry_status ferry_lm_check_stages(const char *spec, int nlayers, int nservers);
/* Training steps split each window's time steps into M micro-batches that flow
 * through the trainer's LSTM and the servers' decoder as a pipeline (pipeline.h); M = 1
 * is the unpipelined step. Distributed, sharded-softmax decoder only (else
 * FERRY_ERR_UNSUPPORTED at the step); FERRY_ERR_RANGE outside 1..FERRY_LM_MAX_MICRO. */
ferry_status ferry_lm_set_micro_batches(ferry_lm *lm, int M);
/* Where training steps form the LSTM's weight gradients (ferry_ctx_set_deferred):
 * AUTO (the default) on the context's helper thread when the model is distributed
 * (the servers' idle time is a core's), ON always, OFF never. Bit-identical either way;
 * host backends only (elsewhere in place). */
typedef enum ferry_lm_grad_thread {
    FERRY_LM_GRAD_THREAD_AUTO = 0,
    FERRY_LM_GRAD_THREAD_ON = 1,
    FERRY_LM_GRAD_THREAD_OFF = 2,
} ferry_lm_grad_thread;
void ferry_lm_set_grad_thread(ferry_lm *lm, ferry_lm_grad_thread mode);
/* 1 when steps of lm form weight gradients on a helper thread. */
int ferry_lm_uses_grad_thread(const ferry_lm *lm);
/* Zeroes the carried state, resizing it for batch B. */
ferry_status ferry_lm_reset_state(ferry_lm *lm, int64_t B);
/* One window: inputs and targets are HOST int32 (T, B). Records on ctx when it
 * is training (a distributed model then needs dc open). *loss = loss_scale * summed
 * cross-entropy (a scalar on the ctx backend); *loss_sum = unscaled sum over the
 * T*B tokens. The final h, c are copied into the carried state (detached). */
ferry_status ferry_lm_forward(ferry_lm *lm, ferry_ctx *ctx, ferry_dist_ctx *dc,
                              const ferry_tensor *inputs, const ferry_tensor *targets,
                              float loss_scale, ferry_tensor **loss, double *loss_sum);

typedef struct ferry_lm_step_args {
    float loss_scale; /* 1/B (sum over time) or 1/(T B) (mean) */
    float clip;       /* global-norm clip; 0 = off */
    double lr;        /* the remote shards' learning rate this step */
    uint64_t ctx_id;  /* the local context's id */
    uint64_t seed;    /* dropout stream of this step */
    /* A job's global batch and this rank's first column of it: the dropout masks are
     * this rank's columns of the masks the whole batch would draw, so they do not
     * depend on how the batch is split (0, 0: the inputs are the whole batch). */
    int64_t batch, col0;
    uint64_t job_step; /* data-parallel job: this step's number (1, 2, ...) */
    /* A job's once-per-step terms (the Stiefel penalty's gradient) are added by rank 0,
     * or, with owner_set, by this rank when owner (an elastic job's first member). */
    int owner_set, owner;
    /* Called after the backward, before the job's GradNorm (NULL: none). */
    ferry_status (*before_sync)(void *user);
    void *user;
} ferry_lm_step_args;

typedef struct ferry_lm_step_result {
    double loss_sum;  /* summed cross-entropy of the window */
    double grad_norm; /* global norm before clipping, local and remote parameters */
    float coef;       /* clip coefficient applied */
    double penalty;   /* Stiefel penalty (beta sum ||C||^2) */
    /* The loss the step's job reports: bsp, every rank's of the step summed (the
     * global batch's); else this rank's (= loss_sum, tokens). */
    double job_loss_sum, job_tokens;
    double sync_s; /* seconds in the job's GradNorm and Step (waiting for the others) */
    double xfer_s; /* seconds pulling the job's dense block and pushing its gradient */
    int checkpoint; /* a job rank asked for a checkpoint after this step */
    uint64_t readmit; /* replicas every rank re-admits after this step (ferry_job_readmit) */
} ferry_lm_step_result;

/* One training step: forward, backward across processes, the Stiefel penalty
 * gradient (once, by its owner), global-norm clipping over every parameter
 * everywhere, and the optimizer step — the remote shards' Step runs concurrently
 * with the local one. On failure the distributed context is released. */
ferry_status ferry_lm_train_step(ferry_lm *lm, ferry_ctx *ctx, ferry_dist_ctx *dc, ferry_optim *opt,
                                 const ferry_tensor *inputs, const ferry_tensor *targets,
                                 const ferry_lm_step_args *args, ferry_lm_step_result *res);

/* Data-parallel job: copies the servers' current LSTM weights into the local block
 * (before evaluating or saving: a step's pull happens at its start). FERRY_OK
 * without a job. */
ferry_status ferry_lm_pull_dense(ferry_lm *lm);

/* The LSTM stack over x (T, B, E) -> y (T, B, H), every group from its rows of h_in,
 * c_in (L, B, H), recorded on ctx; the final state of every layer into hn, cn
 * (L, B, H) tensors of ctx. Dropout between groups as between layers. Flags:
 * FERRY_LM_CARRIED, h_in and c_in are the carried state (a remote group whose server
 * holds it starts from it there, and they are not sent); FERRY_LM_CARRY, remote groups
 * keep their final state for the next window. */
enum { FERRY_LM_CARRIED = 1, FERRY_LM_CARRY = 2 };
ferry_status ferry_lm_stack_forward(ferry_lm *lm, ferry_ctx *ctx, ferry_dist_ctx *dc,
                                    const ferry_tensor *x, const ferry_tensor *h_in,
                                    const ferry_tensor *c_in, int flags, ferry_tensor **y,
                                    ferry_tensor **hn, ferry_tensor **cn);

/* ---- what the rest of the trainer reads of a model ---- */

const ferry_lm_config *ferry_lm_get_config(const ferry_lm *lm);
ferry_backend *ferry_lm_backend(const ferry_lm *lm);
/* The local parameters: everything, or the LSTM alone (distributed). */
ferry_params *ferry_lm_params(ferry_lm *lm);
const ferry_params *ferry_lm_params_const(const ferry_lm *lm);
/* The carried state (L, B, H) (NULL before the first window) and its batch B. */
ferry_tensor *ferry_lm_state_h(const ferry_lm *lm);
ferry_tensor *ferry_lm_state_c(const ferry_lm *lm);
int64_t ferry_lm_state_batch(const ferry_lm *lm);
/* The micro-batch pipeline (ferry_lm_set_micro_batches), or NULL. */
ferry_lm_pipe *ferry_lm_pipeline(const ferry_lm *lm);
/* Distributed: the embedding's remote module ("encoder"); else NULL. */
/* Places the model's remote modules again over its cluster's servers as they are now
 * (after ferry_cluster_retarget; ferry_remote_replace). */
ferry_status ferry_lm_replace(ferry_lm *lm);
ferry_remote *ferry_lm_embedding_remote(const ferry_lm *lm);
/* The LSTM's groups of layers (--stages): how many, and group g's layers
 * [*first, *first + *count) and server (-1: this trainer). */
int ferry_lm_ngroups(const ferry_lm *lm);
void ferry_lm_group_info(const ferry_lm *lm, int g, int *first, int *count, int *server);

/* ||W^T W - I||_F of every layer's raw weight_hh, into out[0..L). */
ferry_status ferry_lm_feasibility(const ferry_lm *lm, double *out);
/* Analytic FLOPs of one training step (forward + backward) on a (T, B) window:
 * 2·M·N·K per GEMM, forward and the two backward GEMMs. */
double ferry_lm_step_flops(const ferry_lm_config *cfg, int64_t T, int64_t B);

#endif /* FERRY_MODEL_H */
