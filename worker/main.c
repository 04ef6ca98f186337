/* main.c - ferry-trainer: parses flags into a ferry_trainer_config, checks what the
 * command line alone can tell, then runs. Exit codes: 0 done, 1 training failed, 2 bad
 * command line; the last line says why (JSON with --log-format json). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

#ifdef FERRY_WITH_CUDA
#include "ferry/cuda.h"
#endif
#include "common/backend/cpu/cpu.h"
#include "common/rpc/rpc.h"
#include "common/core/flags.h"
#include "worker/checkpoint.h"
#include "common/core/log.h"
#include "worker/model.h" /* ferry_lm_check_stages */
#include "worker/trainer.h"

/* The last line of a bad command line; returns the exit code. */
static int usage_error(const char *fmt, ...) FERRY_PRINTF(1, 2);
static int usage_error(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ferry_log_fatal("%s", msg);
    return FERRY_EXIT_USAGE;
}

/* What the command line alone can tell is wrong, found before anything runs (the
 * trainer checks the same again where it uses the values). */
static ferry_status check_usage(const ferry_trainer_config *cfg) {
    int nservers = 1;
    for (const char *p = cfg->ps != NULL ? cfg->ps : ""; *p != '\0'; p++)
        nservers += *p == ',';
    if (cfg->ps != NULL) {
        if (ferry_trainer_check_name("--job", cfg->job, "job") != FERRY_OK ||
            (cfg->model != NULL &&
             ferry_trainer_check_name("--model", cfg->model, "model") != FERRY_OK))
            return FERRY_ERR_INVALID;
        if (cfg->model != NULL && ferry_trainer_is_job(cfg))
            return ferry_errorf(FERRY_ERR_INVALID,
                                "--model %s: this run is job '%s' (--world, --sync, --save, "
                                "--load or --checkpoint-every), whose modules carry the job's "
                                "name: name it with --job",
                                cfg->model, cfg->job);
        ferry_sync_mode mode;
        int staleness;
        if (cfg->sync != NULL && ferry_sync_parse(cfg->sync, &mode, &staleness) != FERRY_OK)
            return FERRY_ERR_INVALID;
        if (cfg->stages != NULL && cfg->stages[0] != '\0' &&
            ferry_lm_check_stages(cfg->stages, cfg->nlayers, nservers) != FERRY_OK)
            return FERRY_ERR_INVALID;
    }
    if (cfg->continue_run && cfg->ps == NULL)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "--continue needs --ps (it trains the modules the servers hold)");
    if (cfg->model != NULL && cfg->ps == NULL)
        return ferry_errorf(FERRY_ERR_INVALID, "--model needs --ps (it names modules on the "
                                               "servers)");
    if (cfg->micro_batches > cfg->bptt)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "--micro-batches %d: a window has %d time steps (--bptt), at most "
                            "one micro-batch per step",
                            cfg->micro_batches, cfg->bptt);
    return FERRY_OK;
}

static const char *env_get(const char *name) {
    return getenv(name);
}

/* First signal: finish the step, checkpoint, exit 0. Second: exit at once. */
static void on_signal(int sig) {
    if (ferry_trainer_stop_requested())
        _exit(128 + sig);
    ferry_trainer_request_stop();
}

/* SIGUSR1: a checkpoint after the next step (a job's: every rank's, one step). */
static void on_checkpoint_signal(int sig) {
    (void)sig;
    ferry_trainer_request_checkpoint();
}

static void install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    (void)sigaction(SIGINT, &sa, NULL);
    (void)sigaction(SIGTERM, &sa, NULL);
    sa.sa_handler = on_checkpoint_signal;
    (void)sigaction(SIGUSR1, &sa, NULL);
}

int main(int argc, char **argv) {
    ferry_cpu_ensure_blas_kernels(argv);
#ifdef FERRY_WITH_CUDA
    ferry_cuda_register(); /* --device cuda[:N] */
#endif
    ferry_log_init("ferry-trainer");
    /* Large RPC payloads: keep freed pages instead of faulting them in again. */
    (void)ferry_rpc_tune_malloc(0);
    ferry_trainer_config cfg;
    ferry_trainer_config_default(&cfg);
    const char *lf = ferry_flags_peek(argc, argv, "log-format");
    if (lf != NULL)
        ferry_log_set_json(strcmp(lf, "json") == 0); /* a bad command line's line too */
    const char *preset = ferry_flags_peek(argc, argv, "preset");
    if (preset != NULL && !ferry_trainer_config_preset(&cfg, preset))
        return usage_error("--preset: '%s' is not one of small|medium|large", preset);
    bool local = false;
    const char *load_auto = NULL;
    static char ck_strings[8192]; /* the checkpoint's strings: --stages, --job, --data, ... */
    int log_level = 2, world = -1, rank = -1, log_format = 0;
    /* clang-format off */
    const ferry_flag flags[] = {
        {.name = "local", .type = FERRY_FLAG_BOOL, .ptr = &local,
         .help = "train the whole model in this process, as without --ps"},
        {.name = "ps", .type = FERRY_FLAG_STRING, .ptr = &cfg.ps, .metavar = "HOST:PORT[,...]",
         .help = "ferry-ps shards hosting the embedding and decoder"},
        {.name = "decoder-mode", .type = FERRY_FLAG_ENUM, .ptr = &cfg.decoder_mode,
         .choices = "logits|sharded-softmax",
         .help = "with --ps: logits cross the wire, or only per-row softmax partials"},
        {.name = "data", .type = FERRY_FLAG_STRING, .ptr = &cfg.data, .metavar = "DIR",
         .help = "corpus directory with train.txt, valid.txt, test.txt"},
        {.name = "device", .type = FERRY_FLAG_STRING, .ptr = &cfg.device,
         .help = "compute device: cpu | cuda[:N]"},
        {.name = "preset", .type = FERRY_FLAG_STRING, .ptr = &preset,
         .help = "Zaremba et al. configuration: small | medium | large (applied first)"},
        {.name = "emsize", .type = FERRY_FLAG_INT, .ptr = &cfg.emsize, .min = 1, .max = 1 << 16,
         .help = "embedding size"},
        {.name = "nhid", .type = FERRY_FLAG_INT, .ptr = &cfg.nhid, .min = 1, .max = 1 << 16,
         .help = "LSTM hidden size"},
        {.name = "nlayers", .type = FERRY_FLAG_INT, .ptr = &cfg.nlayers, .min = 1, .max = 8,
         .help = "LSTM layers"},
        {.name = "dropout", .type = FERRY_FLAG_FLOAT, .ptr = &cfg.dropout, .min = 0,
         .max = 0.99, .help = "dropout on embeddings, between layers and before the decoder"},
        {.name = "init-scale", .type = FERRY_FLAG_FLOAT, .ptr = &cfg.init_scale, .min = 0,
         .max = 10, .help = "parameters start uniform in [-s, s]"},
        {.name = "stiefel", .type = FERRY_FLAG_FLOAT, .ptr = &cfg.stiefel, .min = 0, .max = 1e6,
         .metavar = "BETA", .help = "constrain every weight_hh to the Stiefel manifold (0 = off)"},
        {.name = "batch-size", .type = FERRY_FLAG_INT, .ptr = &cfg.batch_size, .min = 1,
         .max = 1 << 20, .help = "training batch size (columns)"},
        {.name = "bptt", .type = FERRY_FLAG_INT, .ptr = &cfg.bptt, .min = 1, .max = 1 << 16,
         .help = "truncated-BPTT window length"},
        {.name = "eval-batch-size", .type = FERRY_FLAG_INT, .ptr = &cfg.eval_batch_size,
         .min = 1, .max = 1 << 20, .help = "batch size for validation and test"},
        {.name = "train-tokens", .type = FERRY_FLAG_INT64, .ptr = &cfg.train_tokens, .min = 0,
         .max = 1e15, .help = "train on the first N tokens only (0 = all)"},
        {.name = "eval-tokens", .type = FERRY_FLAG_INT64, .ptr = &cfg.eval_tokens, .min = 0,
         .max = 1e15, .help = "evaluate on the first N tokens only (0 = all)"},
        {.name = "eval-batches", .type = FERRY_FLAG_INT64, .ptr = &cfg.eval_batches, .min = 0,
         .max = 1e15, .metavar = "N", .defval = "all; 10 after --max-steps",
         .help = "evaluate valid and test on at most N windows each (0 = all)"},
        {.name = "epochs", .type = FERRY_FLAG_INT, .ptr = &cfg.epochs, .min = 1, .max = 1000000,
         .help = "epochs"},
        {.name = "max-steps", .type = FERRY_FLAG_INT64, .ptr = &cfg.max_steps, .min = 0,
         .max = 1e15, .metavar = "N",
         .help = "stop after N optimizer steps in total (0 = no limit); the progress bar counts "
                 "to N, and a run it cuts short evaluates on --eval-batches windows"},
        {.name = "optimizer", .type = FERRY_FLAG_ENUM, .ptr = &cfg.optimizer,
         .choices = "sgd|adagrad|adadelta|adam|adamw", .help = "update rule"},
        {.name = "clip", .type = FERRY_FLAG_FLOAT, .ptr = &cfg.clip, .min = 0, .max = 1e9,
         .help = "clip the global gradient norm to this (0 = off)"},
        {.name = "loss-scale", .type = FERRY_FLAG_ENUM, .ptr = &cfg.loss_scale,
         .choices = "mean|sum-time",
         .help = "loss = mean over tokens, or sum over time and mean over batch"},
        {.name = "schedule", .type = FERRY_FLAG_ENUM, .ptr = &cfg.schedule,
         .choices = "none|step|plateau", .help = "learning-rate schedule"},
        {.name = "lr-decay", .type = FERRY_FLAG_FLOAT, .ptr = &cfg.lr_decay, .min = 0, .max = 1,
         .help = "factor applied by the schedule"},
        {.name = "lr-decay-start", .type = FERRY_FLAG_INT, .ptr = &cfg.lr_decay_start,
         .min = 0, .max = 1000000, .help = "step schedule: first epoch after which lr decays"},
        {.name = "lr-decay-every", .type = FERRY_FLAG_INT, .ptr = &cfg.lr_decay_every,
         .min = 1, .max = 1000000, .help = "step schedule: decay every N epochs"},
        {.name = "patience", .type = FERRY_FLAG_INT, .ptr = &cfg.patience, .min = 0,
         .max = 1000000, .help = "plateau schedule: epochs without improvement tolerated"},
        {.name = "seed", .type = FERRY_FLAG_INT64, .ptr = &cfg.seed, .min = 0, .max = 9e15,
         .help = "seed for initialisation and dropout"},
        {.name = "save", .type = FERRY_FLAG_STRING, .ptr = &cfg.save, .metavar = "PATH",
         .help = "checkpoint as PATH.<step> (a job's rank r: PATH.r<r>.<step>) after every "
                 "epoch, on SIGTERM, on SIGUSR1 (training goes on; a job: every rank after "
                 "the same step) and every --checkpoint-every steps"},
        {.name = "load", .type = FERRY_FLAG_STRING, .ptr = &cfg.load, .metavar = "PATH",
         .help = "resume from the newest complete checkpoint PATH.<step> (or the file PATH), "
                 "with its configuration"},
        {.name = "metrics-out", .type = FERRY_FLAG_STRING, .ptr = &cfg.metrics_out,
         .metavar = "FILE", .help = "JSON lines: train and eval events"},
        {.name = "log-interval", .type = FERRY_FLAG_INT, .ptr = &cfg.log_interval, .min = 1,
         .max = 1 << 30, .help = "steps between log lines and metrics records"},
        {.name = "progress", .type = FERRY_FLAG_ENUM, .ptr = &cfg.progress,
         .choices = "auto|tty|plain|off", .help = "progress display"},
        {.name = "threads", .type = FERRY_FLAG_INT, .ptr = &cfg.threads, .min = 1, .max = 1024,
         .help = "OpenBLAS threads"},
        {.name = "micro-batches", .type = FERRY_FLAG_INT, .ptr = &cfg.micro_batches, .min = 1,
         .max = 64, .metavar = "M",
         .help = "with --ps: split each window's time steps into M micro-batches that "
                 "pipeline through the trainer's LSTM and ferry-ps's decoder (1: none)"},
        {.name = "stages", .type = FERRY_FLAG_STRING, .ptr = &cfg.stages, .metavar = "SPEC",
         .help = "with --ps: where the LSTM's layers run, as groups from layer 0 up, e.g. "
                 "ps1:2,local:1 (layers 0-1 on the second server, layer 2 here)"},
        {.name = "local-vocab", .type = FERRY_FLAG_INT64, .ptr = &cfg.local_vocab, .min = 0,
         .max = 1 << 30, .metavar = "N",
         .help = "with --ps: the decoder's last N vocabulary rows are the trainer's, "
                 "computed here while ferry-ps computes the rest (balances the cores when "
                 "the decoder dominates, e.g. --preset small)"},
        {.name = "grad-thread", .type = FERRY_FLAG_ENUM, .ptr = &cfg.grad_thread,
         .choices = "auto|on|off",
         .help = "form the LSTM's weight gradients on a helper thread (bit-identical): auto "
                 "does when the model is distributed; on also for --local with a core to spare"},
        {.name = "deadline-ms", .type = FERRY_FLAG_INT64, .ptr = &cfg.deadline_ms, .min = 1,
         .max = 3.6e6, .help = "deadline of every remote call"},
        {.name = "log-level", .type = FERRY_FLAG_ENUM, .ptr = &log_level,
         .choices = "error|warn|info|debug", .help = "log verbosity"},
        {.name = "log-format", .type = FERRY_FLAG_ENUM, .ptr = &log_format,
         .choices = "text|json", .help = "log lines as text or as JSON objects"},
        {.name = "world", .type = FERRY_FLAG_INT, .ptr = &world, .min = 1, .max = 65536,
         .defval = "FERRY_WORLD, SLURM_NTASKS, or 1", .help = "trainers in the job"},
        {.name = "rank", .type = FERRY_FLAG_INT, .ptr = &rank, .min = 0, .max = 65535,
         .defval = "FERRY_RANK, SLURM_PROCID, JOB_COMPLETION_INDEX, or 0",
         .help = "this trainer's rank"},
        {.name = "job", .type = FERRY_FLAG_STRING, .ptr = &cfg.job, .metavar = "NAME",
         .defval = "FERRY_JOB, or ferry", .help = "the job's name on the servers"},
        {.name = "model", .type = FERRY_FLAG_STRING, .ptr = &cfg.model, .metavar = "NAME",
         .help = "outside a job: the prefix of this model's module names on the servers "
                 "(NAME/encoder), so that models share a server"},
        {.name = "continue", .type = FERRY_FLAG_BOOL, .ptr = &cfg.continue_run,
         .help = "train the modules ferry-ps already holds (an earlier run's parameters); "
                 "without it a new run refuses them"},
        {.name = "sync", .type = FERRY_FLAG_STRING, .ptr = &cfg.sync, .metavar = "MODE",
         .help = "bsp | ssp:K | async: a data-parallel job with the LSTM on the servers "
                 "(default bsp when --world > 1)"},
        {.name = "checkpoint-every", .type = FERRY_FLAG_INT64, .ptr = &cfg.checkpoint_every,
         .min = 0, .max = 1e15, .metavar = "N",
         .help = "checkpoint every N steps (with --save; with --ps: the job recovers from "
                 "crashes, and a restarted trainer resumes by itself)"},
        {.name = "keep-checkpoints", .type = FERRY_FLAG_INT, .ptr = &cfg.keep_checkpoints,
         .min = 1, .max = 1000000, .help = "checkpoints kept beside --save"},
        {.name = "connect-timeout", .type = FERRY_FLAG_DOUBLE, .ptr = &cfg.connect_timeout_s,
         .min = 0, .max = 86400, .metavar = "SECONDS",
         .help = "wait this long for ferry-ps to accept connections (0: one try)"},
        {.name = "resolve-timeout", .type = FERRY_FLAG_DOUBLE, .ptr = &cfg.resolve_timeout_s,
         .min = 0, .max = 86400, .metavar = "SECONDS",
         .help = "wait this long for a --ps host name to resolve (0: an unknown host fails at "
                 "once; a Kubernetes headless Service names a pod once it is ready)"},
        {.name = "metrics-listen", .type = FERRY_FLAG_STRING, .ptr = &cfg.metrics_listen,
         .metavar = "HOST:PORT", .help = "serve Prometheus /metrics and /healthz over HTTP here"},
        {.name = "token-file", .type = FERRY_FLAG_STRING, .ptr = &cfg.token_file,
         .metavar = "FILE",
         .help = "bearer token for ferry-ps (env FERRY_TOKEN_FILE names the file too)"},
        {.name = "tls-ca", .type = FERRY_FLAG_STRING, .ptr = &cfg.tls_ca, .metavar = "PEM",
         .help = "connect to ferry-ps with TLS, verifying it against this CA"},
        {.name = "tls-cert", .type = FERRY_FLAG_STRING, .ptr = &cfg.tls_cert, .metavar = "PEM",
         .help = "mutual TLS: this trainer's certificate ..."},
        {.name = "tls-key", .type = FERRY_FLAG_STRING, .ptr = &cfg.tls_key, .metavar = "PEM",
         .help = "... and its key"},
        {.name = "recovery-timeout", .type = FERRY_FLAG_DOUBLE, .ptr = &cfg.recovery_timeout_s,
         .min = 0.1, .max = 86400, .metavar = "SECONDS",
         .help = "how long a recovering job waits for its processes to come back"},
        {.name = "sync-timeout", .type = FERRY_FLAG_DOUBLE, .ptr = &cfg.sync_timeout_s,
         .min = 0.001, .max = 86400, .metavar = "SECONDS",
         .help = "how long a rank waits for the others before the job fails"},
    };
    /* clang-format on */
    /* The optimizer's fields come from its one list (FERRY_OPTIM_FIELD_MAP), after
     * --optimizer. */
    enum { NBASE = (int)(sizeof flags / sizeof flags[0]) };
    ferry_flag all[NBASE + FERRY_OPTIM_FIELD_COUNT];
    char help_text[FERRY_OPTIM_FIELD_COUNT][160];
    int n = 0;
    for (int i = 0; i < NBASE; i++) {
        all[n++] = flags[i];
        if (strcmp(flags[i].name, "optimizer") != 0)
            continue;
        for (int k = 0; k < FERRY_OPTIM_FIELD_COUNT; k++) {
            const ferry_optim_field *f = &ferry_optim_fields[k];
            (void)snprintf(help_text[k], sizeof help_text[k], "%s%s", f->help,
                           f->is_int ? "" : " (unset: the optimizer's default)");
            all[n++] = (ferry_flag){.name = f->flag,
                                    .type = f->is_int ? FERRY_FLAG_BOOL : FERRY_FLAG_DOUBLE,
                                    .ptr = f->is_int ? (void *)&cfg.optim_switch[k]
                                                     : (void *)&cfg.optim[k],
                                    .help = help_text[k]};
            /* A bounded field's range is checked here; every field's again, with the
             * rest of the configuration, by ferry_optim_config_check. */
            if (!f->is_int && isfinite(f->lo) && isfinite(f->hi)) {
                all[n - 1].min = f->lo;
                all[n - 1].max = f->hi;
            }
        }
    }
    /* clang-format off */
    static const char *const env[] = {
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
        NULL};
    /* clang-format on */
    ferry_flags fs = {.prog = "ferry-trainer",
                      .summary = "trains an LSTM language model (locally or with ferry-ps)",
                      .flags = all,
                      .nflags = n,
                      .env = env};
    bool help = false;
    if (ferry_flags_parse(&fs, argc, argv, &help) != FERRY_OK)
        return usage_error("%s", ferry_error_last());
    if (help)
        return 0;
    ferry_log_set_level((ferry_log_level)log_level);
    if (log_format == 1)
        ferry_log_set_json(1);
    if (local && cfg.ps != NULL)
        return usage_error("--local and --ps exclude each other");
    char membership[160];
    if (ferry_trainer_membership(&cfg, world, rank, env_get, membership, sizeof membership) !=
        FERRY_OK)
        return usage_error("%s", ferry_error_last());
    if ((cfg.world > 1 || cfg.sync != NULL) && cfg.ps == NULL)
        return usage_error("a job of %d trainers%s needs --ps (the servers hold the job's model)",
                           cfg.world, cfg.sync != NULL ? " with --sync" : "");
    if (cfg.micro_batches > 1 && (cfg.ps == NULL || cfg.decoder_mode != 1))
        return usage_error("--micro-batches %d needs --ps and --decoder-mode sharded-softmax (the "
                           "pipeline overlaps the trainer's LSTM with ferry-ps's decoder)",
                           cfg.micro_batches);
    if (cfg.local_vocab > 0 && (cfg.ps == NULL || cfg.decoder_mode != 1))
        return usage_error("--local-vocab %lld needs --ps and --decoder-mode sharded-softmax (it "
                           "keeps a slice of ferry-ps's decoder here)",
                           (long long)cfg.local_vocab);
    if (cfg.stages != NULL && cfg.stages[0] != '\0' && cfg.ps == NULL)
        return usage_error("--stages %s needs --ps (the servers that run the layers placed on "
                           "them)",
                           cfg.stages);
    if (cfg.checkpoint_every > 0 && cfg.save == NULL)
        return usage_error("--checkpoint-every needs --save PATH (where this trainer keeps its "
                           "part of each checkpoint)");
    /* A restarted trainer of a recovering run resumes by itself. */
    int as_job = ferry_trainer_is_job(&cfg);
    char resolved[2048];
    int found = 0;
    if (cfg.load == NULL && cfg.checkpoint_every > 0 &&
        ferry_checkpoint_resolve(cfg.save, as_job ? cfg.rank : -1, resolved, sizeof resolved,
                                 &found) == FERRY_OK &&
        found) {
        FERRY_LOG_INFO("%s holds checkpoints of this run: resuming from them (delete them to "
                       "start afresh)",
                       cfg.save);
        load_auto = cfg.save;
    }
    const char *load = cfg.load != NULL ? cfg.load : load_auto;
    if (load != NULL) {
        /* The checkpoint's configuration is the base; the flags given must agree with
         * what it fixes. */
        /* (an automatic resume has resolved and verified it already) */
        if (load_auto == NULL &&
            (ferry_checkpoint_resolve(load, as_job ? cfg.rank : -1, resolved, sizeof resolved,
                                      &found) != FERRY_OK ||
             !found)) {
            if (found)
                ferry_log_fatal("--load %s: %s", load, ferry_error_last());
            else
                ferry_log_fatal("cannot open checkpoint %s: no such file, and no complete "
                                "%s.<step>",
                                load, load);
            return FERRY_EXIT_RUNTIME;
        }
        ferry_trainer_config file, now;
        ferry_trainer_config_default(&file);
        if (ferry_checkpoint_read_config(resolved, &file, ck_strings, sizeof ck_strings) !=
            FERRY_OK) {
            ferry_log_fatal("%s", ferry_error_last());
            return FERRY_EXIT_RUNTIME;
        }
        now = file;
        if (preset != NULL)
            (void)ferry_trainer_config_preset(&now, preset);
        for (int i = 0; i < n; i++) { /* the same flags, over the checkpoint's values */
            char *p = all[i].ptr;
            if (p >= (char *)&cfg && p < (char *)(&cfg + 1))
                all[i].ptr = (char *)&now + (p - (char *)&cfg);
        }
        if (ferry_flags_parse(&fs, argc, argv, &help) != FERRY_OK ||
            ferry_trainer_membership(&now, world, rank, env_get, membership, sizeof membership) !=
                FERRY_OK ||
            ferry_checkpoint_check_config(resolved, &file, &now) != FERRY_OK)
            return usage_error("%s", ferry_error_last());
        now.load = load;
        cfg = now;
    }
    if (check_usage(&cfg) != FERRY_OK)
        return usage_error("%s", ferry_error_last());
    install_signals();
    ferry_status st = ferry_trainer_run(&cfg);
    if (st != FERRY_OK) {
        const char *detail = ferry_error_last();
        ferry_log_fatal("%s", detail[0] ? detail : ferry_status_str(st));
        return FERRY_EXIT_RUNTIME;
    }
    return 0;
}
