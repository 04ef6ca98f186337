/* trainer.h - ferry-trainer's configuration and entry point: the training loop
 * over BPTT windows, evaluation, LR schedule, clipping, checkpoints, progress and
 * the metrics file. main.c only parses flags into a ferry_trainer_config. */
#ifndef FERRY_TRAINER_H
#define FERRY_TRAINER_H

#include <stdbool.h>
#include <stdint.h>

#include "ferry/optim.h"
#include "ferry/status.h"

enum { FERRY_LOSS_SCALE_MEAN = 0, FERRY_LOSS_SCALE_SUM_TIME = 1 };

typedef struct ferry_trainer_config {
    const char *data;        /* corpus dir: train.txt, valid.txt, test.txt */
    const char *device;      /* cpu | cuda[:N] */
    const char *ps;          /* host:port[,host:port...] of ferry-ps shards; NULL: local */
    int decoder_mode;        /* ferry_decoder_mode: logits | sharded-softmax */
    /* model */
    int emsize, nhid, nlayers;
    float dropout, init_scale, stiefel;
    /* data */
    int batch_size, bptt, eval_batch_size;
    int64_t train_tokens;    /* > 0: train on the first N tokens only (tests, smoke runs) */
    int64_t eval_tokens;     /* > 0: evaluate on the first N tokens of valid/test */
    /* schedule */
    int epochs;
    int64_t max_steps;       /* > 0: stop after this many steps in total */
    int optimizer;           /* ferry_optim_kind */
    /* Each field of ferry_optim_config (FERRY_OPTIM_FIELD_MAP order): NaN takes the
     * optimizer's default; the 0/1 fields (nesterov) are in optim_switch. */
    double optim[FERRY_OPTIM_FIELD_COUNT];
    bool optim_switch[FERRY_OPTIM_FIELD_COUNT];
    float clip;              /* global-norm clip; 0 = off */
    int loss_scale;          /* FERRY_LOSS_SCALE_* */
    int schedule;            /* ferry_lr_schedule_kind: none, step, plateau */
    float lr_decay;          /* step: factor per decay; plateau: factor */
    int lr_decay_start;      /* step: first epoch after which lr decays */
    int lr_decay_every;      /* step: decay every N epochs after the start */
    int patience;            /* plateau */
    int64_t seed;
    /* io */
    const char *save, *load, *metrics_out;
    int progress;            /* ferry_progress_mode: auto, tty, plain, off */
    int log_interval;
    int threads;
    int64_t deadline_ms;     /* per-RPC deadline (distributed) */
} ferry_trainer_config;

/* The optimizer configuration cfg asks for: the kind's defaults, overridden by every
 * field that is set. */
ferry_optim_config ferry_trainer_optim(const ferry_trainer_config *cfg);

/* Fills the defaults: the "small" configuration of Zaremba et al. (2014). */
void ferry_trainer_config_default(ferry_trainer_config *cfg);
/* Applies a named preset (small | medium | large) over cfg. */
int ferry_trainer_config_preset(ferry_trainer_config *cfg, const char *name);

/* Asks a running ferry_trainer_run to stop after the current step (checkpointing
 * when --save is set) and return FERRY_OK. Async-signal-safe. */
void ferry_trainer_request_stop(void);
int ferry_trainer_stop_requested(void);

/* Runs training and evaluation as configured. Returns FERRY_OK or a status with a
 * one-line ferry_error_last() message. */
ferry_status ferry_trainer_run(const ferry_trainer_config *cfg);

#endif /* FERRY_TRAINER_H */
