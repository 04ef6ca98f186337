/* cli.c - ferry-trainer's command line: every flag, what it sets and its help, in one
 * table over a ferry_trainer_config (and the few values that are the command line's
 * own), the optimizer's fields spliced in after --optimizer from their one list
 * (FERRY_OPTIM_FIELD_MAP), and the environment variables it reads. main.c parses with
 * it and checks what the command line alone can tell. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/core/log.h"
#include "ferry/optim.h"
#include "worker/cli.h"

void ferry_trainer_cli_init(ferry_trainer_cli *cli, ferry_trainer_config *cfg) {
    memset(cli, 0, sizeof *cli);
    cli->log_level = 2;
    cli->world = cli->rank = -1;
    cli->elastic_batch = -1;
    /* clang-format off */
    const ferry_flag flags[] = {
        {.name = "local", .type = FERRY_FLAG_BOOL, .ptr = &cli->local,
         .help = "train the whole model in this process, as without --ps"},
        {.name = "ps", .type = FERRY_FLAG_STRING, .ptr = &cfg->ps, .metavar = "HOST:PORT[,...]",
         .help = "ferry-ps shards hosting the embedding and decoder"},
        {.name = "replicas", .type = FERRY_FLAG_INT, .ptr = &cfg->replicas, .min = 1, .max = 16,
         .metavar = "R", .defval = "1",
         .help = "with --ps: R servers per shard, listed side by side; a shard whose server "
                 "dies or stalls goes on with the others (no roll-back); --sync bsp"},
        {.name = "replication", .type = FERRY_FLAG_ENUM, .ptr = &cfg->replication,
         .choices = "primary-backup|active",
         .help = "with --replicas: the primary computes and ships each step's summed gradient "
                 "to the backups with the Step, or every replica computes every call"},
        {.name = "decoder-mode", .type = FERRY_FLAG_ENUM, .ptr = &cfg->decoder_mode,
         .choices = "logits|sharded-softmax",
         .help = "with --ps: logits cross the wire, or only per-row softmax partials"},
        {.name = "wire-dtype", .type = FERRY_FLAG_ENUM, .ptr = &cfg->wire_dtype,
         .choices = "f32|bf16",
         .help = "with --ps: activations and dense pulls/pushes travel as float32 (exact) or "
                 "bfloat16 (half the bytes; the servers keep float32)"},
        {.name = "data", .type = FERRY_FLAG_STRING, .ptr = &cfg->data, .metavar = "DIR",
         .help = "corpus directory with train.txt, valid.txt, test.txt"},
        {.name = "device", .type = FERRY_FLAG_STRING, .ptr = &cfg->device,
         .help = "compute device: cpu | cuda[:N]"},
        {.name = "preset", .type = FERRY_FLAG_STRING, .ptr = &cli->preset,
         .help = "Zaremba et al. configuration: small | medium | large (applied first)"},
        {.name = "emsize", .type = FERRY_FLAG_INT, .ptr = &cfg->emsize, .min = 1, .max = 1 << 16,
         .help = "embedding size"},
        {.name = "nhid", .type = FERRY_FLAG_INT, .ptr = &cfg->nhid, .min = 1, .max = 1 << 16,
         .help = "LSTM hidden size"},
        {.name = "nlayers", .type = FERRY_FLAG_INT, .ptr = &cfg->nlayers, .min = 1, .max = 8,
         .help = "LSTM layers"},
        {.name = "dropout", .type = FERRY_FLAG_FLOAT, .ptr = &cfg->dropout, .min = 0,
         .max = 0.99, .help = "dropout on embeddings, between layers and before the decoder"},
        {.name = "init-scale", .type = FERRY_FLAG_FLOAT, .ptr = &cfg->init_scale, .min = 0,
         .max = 10, .help = "parameters start uniform in [-s, s]"},
        {.name = "stiefel", .type = FERRY_FLAG_FLOAT, .ptr = &cfg->stiefel, .min = 0, .max = 1e6,
         .metavar = "BETA", .help = "constrain every weight_hh to the Stiefel manifold (0 = off)"},
        {.name = "batch-size", .type = FERRY_FLAG_INT, .ptr = &cfg->batch_size, .min = 1,
         .max = 1 << 20, .help = "training batch size (columns)"},
        {.name = "bptt", .type = FERRY_FLAG_INT, .ptr = &cfg->bptt, .min = 1, .max = 1 << 16,
         .help = "truncated-BPTT window length"},
        {.name = "eval-batch-size", .type = FERRY_FLAG_INT, .ptr = &cfg->eval_batch_size,
         .min = 1, .max = 1 << 20, .help = "batch size for validation and test"},
        {.name = "train-tokens", .type = FERRY_FLAG_INT64, .ptr = &cfg->train_tokens, .min = 0,
         .max = 1e15, .help = "train on the first N tokens only (0 = all)"},
        {.name = "eval-tokens", .type = FERRY_FLAG_INT64, .ptr = &cfg->eval_tokens, .min = 0,
         .max = 1e15, .help = "evaluate on the first N tokens only (0 = all)"},
        {.name = "eval-batches", .type = FERRY_FLAG_INT64, .ptr = &cfg->eval_batches, .min = 0,
         .max = 1e15, .metavar = "N", .defval = "all; 10 after --max-steps",
         .help = "evaluate valid and test on at most N windows each (0 = all)"},
        {.name = "epochs", .type = FERRY_FLAG_INT, .ptr = &cfg->epochs, .min = 1, .max = 1000000,
         .help = "epochs"},
        {.name = "max-steps", .type = FERRY_FLAG_INT64, .ptr = &cfg->max_steps, .min = 0,
         .max = 1e15, .metavar = "N",
         .help = "stop after N optimizer steps in total (0 = no limit); the progress bar counts "
                 "to N, and a run it cuts short evaluates on --eval-batches windows"},
        {.name = "optimizer", .type = FERRY_FLAG_ENUM, .ptr = &cfg->optimizer,
         .choices = "sgd|adagrad|adadelta|adam|adamw", .help = "update rule"},
        {.name = "clip", .type = FERRY_FLAG_FLOAT, .ptr = &cfg->clip, .min = 0, .max = 1e9,
         .help = "clip the global gradient norm to this (0 = off)"},
        {.name = "loss-scale", .type = FERRY_FLAG_ENUM, .ptr = &cfg->loss_scale,
         .choices = "mean|sum-time",
         .help = "loss = mean over tokens, or sum over time and mean over batch"},
        {.name = "schedule", .type = FERRY_FLAG_ENUM, .ptr = &cfg->schedule,
         .choices = "none|step|plateau", .help = "learning-rate schedule"},
        {.name = "lr-decay", .type = FERRY_FLAG_FLOAT, .ptr = &cfg->lr_decay, .min = 0, .max = 1,
         .help = "factor applied by the schedule"},
        {.name = "lr-decay-start", .type = FERRY_FLAG_INT, .ptr = &cfg->lr_decay_start,
         .min = 0, .max = 1000000, .help = "step schedule: first epoch after which lr decays"},
        {.name = "lr-decay-every", .type = FERRY_FLAG_INT, .ptr = &cfg->lr_decay_every,
         .min = 1, .max = 1000000, .help = "step schedule: decay every N epochs"},
        {.name = "patience", .type = FERRY_FLAG_INT, .ptr = &cfg->patience, .min = 0,
         .max = 1000000, .help = "plateau schedule: epochs without improvement tolerated"},
        {.name = "seed", .type = FERRY_FLAG_INT64, .ptr = &cfg->seed, .min = 0, .max = 9e15,
         .help = "seed for initialisation and dropout"},
        {.name = "save", .type = FERRY_FLAG_STRING, .ptr = &cfg->save, .metavar = "PATH",
         .help = "checkpoint as PATH.<step> (a job's rank r: PATH.r<r>.<step>) after every "
                 "epoch, on SIGTERM, on SIGUSR1 (training goes on; a job: every rank after "
                 "the same step) and every --checkpoint-every steps"},
        {.name = "load", .type = FERRY_FLAG_STRING, .ptr = &cfg->load, .metavar = "PATH",
         .help = "resume from the newest complete checkpoint PATH.<step> (or the file PATH), "
                 "with its configuration"},
        {.name = "metrics-out", .type = FERRY_FLAG_STRING, .ptr = &cfg->metrics_out,
         .metavar = "FILE", .help = "JSON lines: train and eval events"},
        {.name = "log-interval", .type = FERRY_FLAG_INT, .ptr = &cfg->log_interval, .min = 1,
         .max = 1 << 30, .help = "steps between log lines and metrics records"},
        {.name = "progress", .type = FERRY_FLAG_ENUM, .ptr = &cfg->progress,
         .choices = "auto|tty|plain|off", .help = "progress display"},
        {.name = "threads", .type = FERRY_FLAG_INT, .ptr = &cfg->threads, .min = 1, .max = 1024,
         .help = "OpenBLAS threads"},
        {.name = "micro-batches", .type = FERRY_FLAG_INT, .ptr = &cfg->micro_batches, .min = 1,
         .max = 64, .metavar = "M",
         .help = "with --ps: split each window's time steps into M micro-batches that "
                 "pipeline through the trainer's LSTM and ferry-ps's decoder (1: none)"},
        {.name = "stages", .type = FERRY_FLAG_STRING, .ptr = &cfg->stages, .metavar = "SPEC",
         .help = "with --ps: where the LSTM's layers run, as groups from layer 0 up, e.g. "
                 "ps1:2,local:1 (layers 0-1 on the second server, layer 2 here)"},
        {.name = "local-vocab", .type = FERRY_FLAG_INT64, .ptr = &cfg->local_vocab, .min = 0,
         .max = 1 << 30, .metavar = "N",
         .help = "with --ps: the decoder's last N vocabulary rows are the trainer's, "
                 "computed here while ferry-ps computes the rest (balances the cores when "
                 "the decoder dominates, e.g. --preset small)"},
        {.name = "grad-thread", .type = FERRY_FLAG_ENUM, .ptr = &cfg->grad_thread,
         .choices = "auto|on|off",
         .help = "form the LSTM's weight gradients on a helper thread (bit-identical): auto "
                 "does when the model is distributed; on also for --local with a core to spare"},
        {.name = "deadline-ms", .type = FERRY_FLAG_INT64, .ptr = &cfg->deadline_ms, .min = 1,
         .max = 3.6e6, .help = "deadline of every remote call"},
        {.name = "log-level", .type = FERRY_FLAG_ENUM, .ptr = &cli->log_level,
         .choices = "error|warn|info|debug", .help = "log verbosity"},
        {.name = "log-format", .type = FERRY_FLAG_ENUM, .ptr = &cli->log_format,
         .choices = "text|json", .help = "log lines as text or as JSON objects"},
        {.name = "world", .type = FERRY_FLAG_INT, .ptr = &cli->world, .min = 1, .max = 65536,
         .defval = "FERRY_WORLD, SLURM_NTASKS, or 1", .help = "trainers in the job"},
        {.name = "rank", .type = FERRY_FLAG_INT, .ptr = &cli->rank, .min = 0, .max = 65535,
         .defval = "FERRY_RANK, SLURM_PROCID, JOB_COMPLETION_INDEX, or 0",
         .help = "this trainer's rank"},
        {.name = "elastic", .type = FERRY_FLAG_STRING, .ptr = &cli->elastic, .metavar = "MIN:MAX",
         .help = "an elastic job: MIN..MAX trainers join (start another) and leave (SIGTERM, "
                 "or die) without a roll-back; bsp admits them between steps and keeps the "
                 "global batch --batch-size, split over the members; ssp and async admit them "
                 "at once at the members' least step, each with --batch-size columns of its "
                 "own (per-rank); the rank is picked"},
        {.name = "elastic-batch", .type = FERRY_FLAG_ENUM, .ptr = &cli->elastic_batch,
         .choices = "global|per-rank", .defval = "global (bsp), per-rank (ssp, async)",
         .help = "an elastic job's batch policy: global keeps the global batch --batch-size "
                 "and splits it over the members (the same optimizer steps whatever the "
                 "membership); per-rank gives each rank --batch-size columns of its own (of "
                 "MAX x --batch-size), so a step covers the members' columns and the learning "
                 "rate scales linearly with the members (lr x members / MAX per column's mean "
                 "gradient)"},
        {.name = "job", .type = FERRY_FLAG_STRING, .ptr = &cfg->job, .metavar = "NAME",
         .defval = "FERRY_JOB, or ferry", .help = "the job's name on the servers"},
        {.name = "model", .type = FERRY_FLAG_STRING, .ptr = &cfg->model, .metavar = "NAME",
         .help = "outside a job: the prefix of this model's module names on the servers "
                 "(NAME/encoder), so that models share a server"},
        {.name = "continue", .type = FERRY_FLAG_BOOL, .ptr = &cfg->continue_run,
         .help = "train the modules ferry-ps already holds (an earlier run's parameters); "
                 "without it a new run refuses them"},
        {.name = "sync", .type = FERRY_FLAG_STRING, .ptr = &cfg->sync, .metavar = "MODE",
         .help = "bsp | ssp:K | async: a data-parallel job with the LSTM on the servers "
                 "(default bsp when --world > 1)"},
        {.name = "checkpoint-every", .type = FERRY_FLAG_INT64, .ptr = &cfg->checkpoint_every,
         .min = 0, .max = 1e15, .metavar = "N",
         .help = "checkpoint every N steps (with --save; with --ps: the job recovers from "
                 "crashes, and a restarted trainer resumes by itself)"},
        {.name = "keep-checkpoints", .type = FERRY_FLAG_INT, .ptr = &cfg->keep_checkpoints,
         .min = 1, .max = 1000000, .help = "checkpoints kept beside --save"},
        {.name = "connect-timeout", .type = FERRY_FLAG_DOUBLE, .ptr = &cfg->connect_timeout_s,
         .min = 0, .max = 86400, .metavar = "SECONDS",
         .help = "wait this long for ferry-ps to accept connections (0: one try)"},
        {.name = "resolve-timeout", .type = FERRY_FLAG_DOUBLE, .ptr = &cfg->resolve_timeout_s,
         .min = 0, .max = 86400, .metavar = "SECONDS",
         .help = "wait this long for a --ps host name to resolve (0: an unknown host fails at "
                 "once; a Kubernetes headless Service names a pod once it is ready)"},
        {.name = "metrics-listen", .type = FERRY_FLAG_STRING, .ptr = &cfg->metrics_listen,
         .metavar = "HOST:PORT", .help = "serve Prometheus /metrics and /healthz over HTTP here"},
        {.name = "token-file", .type = FERRY_FLAG_STRING, .ptr = &cfg->token_file,
         .metavar = "FILE",
         .help = "bearer token for ferry-ps (env FERRY_TOKEN_FILE names the file too)"},
        {.name = "tls-ca", .type = FERRY_FLAG_STRING, .ptr = &cfg->tls_ca, .metavar = "PEM",
         .help = "connect to ferry-ps with TLS, verifying it against this CA"},
        {.name = "tls-cert", .type = FERRY_FLAG_STRING, .ptr = &cfg->tls_cert, .metavar = "PEM",
         .help = "mutual TLS: this trainer's certificate ..."},
        {.name = "tls-key", .type = FERRY_FLAG_STRING, .ptr = &cfg->tls_key, .metavar = "PEM",
         .help = "... and its key"},
        {.name = "recovery-timeout", .type = FERRY_FLAG_DOUBLE, .ptr = &cfg->recovery_timeout_s,
         .min = 0.1, .max = 86400, .metavar = "SECONDS",
         .help = "how long a recovering job waits for its processes to come back"},
        {.name = "sync-timeout", .type = FERRY_FLAG_DOUBLE, .ptr = &cfg->sync_timeout_s,
         .min = 0.001, .max = 86400, .metavar = "SECONDS",
         .help = "how long a rank waits for the others before the job fails"},
    };
    /* clang-format on */
    /* The optimizer's fields come from its one list (FERRY_OPTIM_FIELD_MAP), after
     * --optimizer. */
    enum { NBASE = (int)(sizeof flags / sizeof flags[0]) };
    FERRY_ASSERT(NBASE + FERRY_OPTIM_FIELD_COUNT <= FERRY_TRAINER_MAX_FLAGS);
    ferry_flag *all = cli->flags;
    int n = 0;
    for (int i = 0; i < NBASE; i++) {
        all[n++] = flags[i];
        if (strcmp(flags[i].name, "optimizer") != 0)
            continue;
        for (int k = 0; k < FERRY_OPTIM_FIELD_COUNT; k++) {
            const ferry_optim_field *f = &ferry_optim_fields[k];
            (void)snprintf(cli->optim_help[k], sizeof cli->optim_help[k], "%s%s", f->help,
                           f->is_int ? "" : " (unset: the optimizer's default)");
            all[n++] = (ferry_flag){.name = f->flag,
                                    .type = f->is_int ? FERRY_FLAG_BOOL : FERRY_FLAG_DOUBLE,
                                    .ptr = f->is_int ? (void *)&cfg->optim_switch[k]
                                                     : (void *)&cfg->optim[k],
                                    .help = cli->optim_help[k]};
            /* A bounded field's range is checked here; every field's again, with the
             * rest of the configuration, by ferry_optim_config_check. */
            if (!f->is_int && isfinite(f->lo) && isfinite(f->hi)) {
                all[n - 1].min = f->lo;
                all[n - 1].max = f->hi;
            }
        }
    }
    cli->nflags = n;
}

/* clang-format off */
const char *const ferry_trainer_env[] = {
    "FERRY_TOKEN_FILE", "a file with the bearer token for ferry-ps (--token-file wins)",
    "FERRY_WORLD, FERRY_RANK", "the job's size and this rank (--world/--rank win)",
    "SLURM_NTASKS, SLURM_PROCID", "the same under srun",
    "JOB_COMPLETION_INDEX", "the rank in a Kubernetes Indexed Job",
    "FERRY_JOB", "the job name (--job wins)",
    "FERRY_PROGRESS", "tty | plain | off: the progress display (--progress wins)",
    "FERRY_LOG", "error | warn | info | debug: the log level",
    "FERRY_LOG_FORMAT", "json: log lines as JSON (--log-format wins)",
    "OPENBLAS_CORETYPE", "OpenBLAS kernels to use (else ferry picks the strongest)",
    "FERRY_NO_REEXEC", "set: never re-execute to choose OpenBLAS kernels",
    "FERRY_RPC_SPIN_US", "microseconds a waiting call spins before it sleeps",
    "FERRY_PIPE_TRACE", "N: log the timeline of every Nth pipelined step (--micro-batches)",
    NULL};
/* clang-format on */
