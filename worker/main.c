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
#include "worker/cli.h"
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
    const char *load_auto = NULL;
    static char ck_strings[8192]; /* the checkpoint's strings: --stages, --job, --data, ... */
    static ferry_trainer_cli cli;
    ferry_trainer_cli_init(&cli, &cfg);
    cli.preset = preset;
    ferry_flag *all = cli.flags;
    int n = cli.nflags;
    ferry_flags fs = {.prog = "ferry-trainer",
                      .summary = "trains an LSTM language model (locally or with ferry-ps)",
                      .flags = all,
                      .nflags = n,
                      .env = ferry_trainer_env};
    bool help = false;
    if (ferry_flags_parse(&fs, argc, argv, &help) != FERRY_OK)
        return usage_error("%s", ferry_error_last());
    if (help)
        return 0;
    ferry_log_set_level((ferry_log_level)cli.log_level);
    if (cli.log_format == 1)
        ferry_log_set_json(1);
    if (cli.local && cfg.ps != NULL)
        return usage_error("--local and --ps exclude each other");
    char membership[160];
    if (ferry_trainer_membership(&cfg, cli.world, cli.rank, env_get, membership,
                                 sizeof membership) != FERRY_OK)
        return usage_error("%s", ferry_error_last());
    if (cli.elastic != NULL) {
        char *end;
        long lo = strtol(cli.elastic, &end, 10), hi = *end == ':' ? strtol(end + 1, &end, 10) : 0;
        if (*end != '\0' || lo < 1 || hi < lo || hi > 65536)
            return usage_error("--elastic %s: expected MIN:MAX with 1 <= MIN <= MAX <= 65536",
                               cli.elastic);
        if (cli.world >= 0 || cli.rank >= 0)
            return usage_error("--elastic picks each trainer's rank and sizes the job by MAX: "
                               "drop --world and --rank");
        int async = cfg.sync != NULL && strcmp(cfg.sync, "bsp") != 0;
        if (async && cli.elastic_batch < 0) /* no common step to split a global batch */
            cli.elastic_batch = 1;
        const char *why = cfg.ps == NULL ? "needs --ps (the servers hold the job)"
                          : async && cli.elastic_batch == 0
                              ? "--elastic-batch global needs --sync bsp: ssp and async have no "
                                "common step to split a global batch over (per-rank is their "
                                "policy)"
                          : cfg.replicas > 1 ? "does not take --replicas yet"
                          : cfg.checkpoint_every > 0 || cfg.save != NULL || cfg.load != NULL
                              ? "does not write or read checkpoints yet (--save, --load, "
                                "--checkpoint-every): a member's death costs no roll-back"
                          : cfg.stages != NULL && cfg.stages[0] != '\0'
                              ? "keeps the LSTM in the trainers (no --stages)"
                          : cli.elastic_batch != 1 && hi > cfg.batch_size
                              ? "needs --batch-size of at least MAX (a column per member)"
                          : cli.elastic_batch == 1 && (int64_t)hi * cfg.batch_size > (1 << 20)
                              ? "--elastic-batch per-rank: MAX x --batch-size is more than "
                                "1048576 columns"
                              : NULL;
        if (why != NULL)
            return usage_error("--elastic %s %s", cli.elastic, why);
        cfg.elastic_min = (int)lo;
        cfg.elastic_max = (int)hi;
        if (cli.elastic_batch == 1) { /* each rank's own columns of MAX x b */
            cfg.elastic_rank_batch = cfg.batch_size;
            cfg.batch_size = (int)hi * cfg.batch_size;
        }
        cfg.world = (int)hi;
        cfg.rank = 0;
        cfg.membership = "elastic: picked at join";
    }
    if (cli.elastic_batch >= 0 && cli.elastic == NULL)
        return usage_error("--elastic-batch is the batch policy of an elastic job (--elastic "
                           "MIN:MAX)");
    if ((cfg.world > 1 || cfg.sync != NULL) && cfg.ps == NULL)
        return usage_error("a job of %d trainers%s needs --ps (the servers hold the job's model)",
                           cfg.world, cfg.sync != NULL ? " with --sync" : "");
    if (cfg.micro_batches > 1 && (cfg.ps == NULL || cfg.decoder_mode != 1))
        return usage_error("--micro-batches %d needs --ps and --decoder-mode sharded-softmax (the "
                           "pipeline overlaps the trainer's LSTM with ferry-ps's decoder)",
                           cfg.micro_batches);
    if (cfg.replicas > 1 && cfg.ps == NULL)
        return usage_error("--replicas %d needs --ps (the servers that hold each shard)",
                           cfg.replicas);
    if (cfg.replicas > 1 && cfg.sync != NULL && strcmp(cfg.sync, "bsp") != 0)
        return usage_error(
            "--replicas %d needs --sync bsp: the replicas of a shard apply the ranks' "
            "updates in the same order only when a barrier orders them (--sync "
            "%s applies each on arrival)",
            cfg.replicas, cfg.sync);
    if (cfg.wire_dtype != 0 && cfg.ps == NULL)
        return usage_error("--wire-dtype bf16 needs --ps (it is how tensors travel to ferry-ps)");
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
        if (cli.preset != NULL)
            (void)ferry_trainer_config_preset(&now, cli.preset);
        for (int i = 0; i < n; i++) { /* the same flags, over the checkpoint's values */
            char *p = all[i].ptr;
            if (p >= (char *)&cfg && p < (char *)(&cfg + 1))
                all[i].ptr = (char *)&now + (p - (char *)&cfg);
        }
        if (ferry_flags_parse(&fs, argc, argv, &help) != FERRY_OK ||
            ferry_trainer_membership(&now, cli.world, cli.rank, env_get, membership,
                                     sizeof membership) != FERRY_OK ||
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
