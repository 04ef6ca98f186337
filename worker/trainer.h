/* trainer.h - ferry-trainer's configuration and entry point: the training loop
 * over BPTT windows, evaluation, LR schedule, clipping, checkpoints, progress and
 * the metrics file. main.c only parses flags into a ferry_trainer_config. */
#ifndef FERRY_TRAINER_H
#define FERRY_TRAINER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/optim.h"
#include "ferry/status.h"

enum { FERRY_LOSS_SCALE_MEAN = 0, FERRY_LOSS_SCALE_SUM_TIME = 1 };

typedef struct ferry_trainer_config {
    const char *data;        /* corpus dir: train.txt, valid.txt, test.txt */
    const char *device;      /* cpu | cuda[:N] */
    const char *ps;          /* host:port[,host:port...] of ferry-ps shards; NULL: local */
    int replicas;            /* > 1: --ps lists each shard's replicas side by side */
    int replication;         /* FERRY_REPLICATION_*: --replication primary-backup|active */
    int decoder_mode;        /* ferry_decoder_mode: logits | sharded-softmax */
    int wire_dtype;          /* 0 f32, 1 bf16: how activations and dense pulls/pushes travel */
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
    int micro_batches;       /* > 1: pipelined step over this many micro-batches (--ps) */
    const char *stages;      /* model parallelism: where the LSTM's layers run (--ps) */
    int64_t local_vocab;     /* the decoder's last rows computed in the trainer (--ps) */
    int grad_thread;         /* ferry_lm_grad_thread: auto, on, off */
    int64_t deadline_ms;     /* per-RPC deadline (distributed) */
    /* A data-parallel job (distributed only): world > 1 or a sync mode given. Rank r
     * trains on batch columns [r*B/N, (r+1)*B/N) of the global batch B (batch_size),
     * with the loss scaled by the global batch. */
    int world, rank;         /* N >= 1, 0 <= rank < N */
    /* An elastic job (--elastic MIN:MAX, bsp): MIN..MAX members come and go between
     * steps; world is MAX and the rank is picked at join (0: not elastic). */
    int elastic_min, elastic_max;
    /* --elastic-batch per-rank: each rank's own columns, b (0: the global batch is
     * split over the members); batch_size is then MAX * b, rank r's columns are
     * [r*b, (r+1)*b), and the learning rate scales with the members (members/MAX). */
    int elastic_rank_batch;
    const char *job;         /* the job's name on the servers */
    /* Outside a job: the prefix of the model's module names on the servers
     * ("NAME/encoder"; NULL: the bare names), so that models share a server. */
    const char *model;
    /* 1: train the modules ferry-ps already holds (an earlier run's parameters); 0:
     * a new run refuses them (FERRY_ERR_EXISTS) unless it resumes (--load). */
    int continue_run;
    const char *sync;        /* bsp | ssp:K | async; NULL: bsp */
    double sync_timeout_s;   /* how long a rank waits for the others */
    const char *membership;  /* where world and rank came from, for the log */
    /* Fault tolerance: a checkpoint every N steps (0: at epoch ends and on SIGTERM
     * only), the newest K kept; a run with --ps and checkpoint_every > 0 is a job
     * (world 1 by default) that recovers from a server's or a rank's crash by
     * rolling back to the newest checkpoint every process has, waiting at most
     * recovery_timeout_s for the processes to come back. */
    int64_t checkpoint_every;
    int keep_checkpoints;
    double recovery_timeout_s;
    /* Security toward ferry-ps (NULL: none): a token file (or $FERRY_TOKEN_FILE), and
     * TLS PEM files: the CA that signed the servers, this trainer's certificate and
     * key for mutual TLS. */
    const char *token_file, *tls_ca, *tls_cert, *tls_key;
    const char *metrics_listen; /* HOST:PORT: Prometheus /metrics and /healthz, or NULL */
    double connect_timeout_s;   /* how long to wait for the servers to come up */
    double resolve_timeout_s;   /* how long to wait for a server's name to resolve */
    /* Windows each valid/test evaluation covers: > 0 at most that many, 0 all, < 0
     * all after a whole epoch and 10 after --max-steps stopped one short. */
    int64_t eval_batches;
} ferry_trainer_config;

/* Fills world, rank and job from the flags or else from the environment a launcher
 * sets: FERRY_WORLD / FERRY_RANK / FERRY_JOB, Slurm's SLURM_NTASKS / SLURM_PROCID /
 * SLURM_JOB_ID, a Kubernetes Indexed Job's JOB_COMPLETION_INDEX (the rank; the world
 * from --world or FERRY_WORLD). world_flag and rank_flag are the flags' values (< 0:
 * not given). getenv_fn is getenv (tests pass their own). FERRY_ERR_INVALID naming
 * the variable for a value that is not a number or a rank outside [0, world).
 * `why` (cap bytes) receives where each came from. */
/* 1 when the run is a job on the servers: --ps with several ranks, a sync mode, or
 * checkpoints (the job protocol ties the servers' checkpoints to the trainers'). */
int ferry_trainer_is_job(const ferry_trainer_config *cfg);
/* A --job or --model name: 1..48 characters of [A-Za-z0-9_.-] (it prefixes module
 * names on the servers); FERRY_ERR_INVALID naming the flag otherwise. */
ferry_status ferry_trainer_check_name(const char *flag, const char *name, const char *what);
ferry_status ferry_trainer_membership(ferry_trainer_config *cfg, int world_flag, int rank_flag,
                                      const char *(*getenv_fn)(const char *), char *why,
                                      size_t cap);

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
/* Async-signal-safe: a checkpoint after the next step (a job: every rank, the same
 * step), and training goes on (SIGUSR1). */
void ferry_trainer_request_checkpoint(void);
int ferry_trainer_stop_requested(void);

/* Runs training and evaluation as configured. Returns FERRY_OK or a status with a
 * one-line ferry_error_last() message. */
ferry_status ferry_trainer_run(const ferry_trainer_config *cfg);

#endif /* FERRY_TRAINER_H */
