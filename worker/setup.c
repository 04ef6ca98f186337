/* setup.c - what a run of ferry-trainer needs before its first step and gives back
 * after its last: the corpus and batches, the backend and BLAS threads (fewer beside
 * servers on the same machine), the model local or placed on servers, the cluster and
 * the data-parallel job, a resume or a recovery from checkpoints, progress, metrics
 * and the /metrics page; and the teardown, which leaves the job and frees it all. */
#include <ifaddrs.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/backend/cpu/cpu.h"
#include "common/core/log.h"
#include "common/core/secret.h"
#include "common/ops/http.h"
#include "ferry/version.h"
#include "worker/trainer-impl.h"

/* --save with --ps makes the run a job: the embedding and decoder live on the
 * servers, so a checkpoint is the servers' files and this trainer's together. Said
 * once, and refused before any step when a server cannot write its part (a --load
 * would find nothing to restore). */
static ferry_status check_can_save(trainer *t) {
    const ferry_trainer_config *cfg = t->cfg;
    if (cfg->world == 1 && cfg->sync == NULL)
        FERRY_LOG_INFO("--save with --ps: this run is job '%s' of one rank; the LSTM's master "
                       "copy lives on the servers too (pulled and pushed every step), and each "
                       "checkpoint is every server's file in its --checkpoint-dir plus %s",
                       cfg->job, cfg->save);
    for (int i = 0; i < ferry_cluster_size(t->cluster); i++) {
        ferry_job_probe_result pr;
        ferry_status st = ferry_job_probe(t->job, i, &pr);
        int can = pr.can_checkpoint;
        ferry_job_probe_free(&pr);
        if (st != FERRY_OK)
            return st;
        if (!can)
            return ferry_errorf(FERRY_ERR_UNSUPPORTED,
                                "--save needs every ferry-ps to write its part of the "
                                "checkpoints, and %s has no --checkpoint-dir: start it with "
                                "--checkpoint-dir DIR (or train without --ps)",
                                ferry_cluster_target(t->cluster, i));
    }
    return FERRY_OK;
}

/* Joins the data-parallel job: the model as this rank builds it goes to the servers,
 * which refuse a rank whose model differs from the job's; this rank's columns of the
 * global batch. */
static ferry_status job_join(trainer *t, const ferry_lm_config *mc, const ferry_optim_config *oc,
                             int resume) {
    const ferry_trainer_config *cfg = t->cfg;
    ferry_job_config jc = {0};
    ferry_status st =
        ferry_sync_parse(cfg->sync != NULL ? cfg->sync : "bsp", &jc.sync, &jc.staleness);
    if (st != FERRY_OK)
        return st;
    if ((st = ferry_trainer_check_name("--job", cfg->job, "job")) != FERRY_OK)
        return st;
    if (!(cfg->sync_timeout_s > 0.0) || cfg->sync_timeout_s > 86400.0)
        return ferry_errorf(FERRY_ERR_INVALID, "--sync-timeout %g s outside (0, 86400]",
                            cfg->sync_timeout_s);
    t->c0 = (int)((int64_t)cfg->rank * cfg->batch_size / cfg->world);
    t->c1 = (int)((int64_t)(cfg->rank + 1) * cfg->batch_size / cfg->world);
    if (cfg->elastic_max > 0) { /* the membership sets them; any share fits the buffers */
        t->c0 = 0;
        t->c1 = cfg->batch_size;
    }
    if (t->c1 <= t->c0)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "--batch-size %d gives rank %d of %d no column: the global batch "
                            "must be at least the world size",
                            cfg->batch_size, cfg->rank, cfg->world);
    size_t n = (size_t)cfg->bptt * (size_t)(t->c1 - t->c0);
    if ((t->in_buf = malloc(n * sizeof *t->in_buf)) == NULL ||
        (t->tg_buf = malloc(n * sizeof *t->tg_buf)) == NULL)
        return FERRY_NOMEM();
    char model[1024];
    (void)snprintf(model, sizeof model,
                   "vocab=%llx V=%lld E=%lld H=%lld L=%d batch=%d bptt=%d dropout=%g "
                   "init=%g stiefel=%g seed=%llu optimizer=%s lr=%g clip=%g loss=%s decoder=%s",
                   (unsigned long long)ferry_vocab_hash(ferry_corpus_vocab(t->corpus)),
                   (long long)mc->V, (long long)mc->E, (long long)mc->H, mc->L, cfg->batch_size,
                   cfg->bptt, (double)mc->dropout, (double)mc->init_scale, (double)mc->stiefel_beta,
                   (unsigned long long)mc->seed, ferry_optim_kind_name(oc->kind), oc->lr,
                   (double)cfg->clip, cfg->loss_scale ? "sum-time" : "mean",
                   cfg->decoder_mode ? "sharded-softmax" : "logits");
    if (cfg->elastic_rank_batch > 0) { /* the batch policy: every trainer's the same */
        size_t len = strlen(model);
        (void)snprintf(model + len, sizeof model - len, " rank_columns=%d",
                       cfg->elastic_rank_batch);
    }
    if (cfg->replicas > 1) { /* every rank must see the same shards */
        size_t len = strlen(model);
        (void)snprintf(model + len, sizeof model - len, " replicas=%d%s", cfg->replicas,
                       cfg->replication == FERRY_REPLICATION_ACTIVE ? " replication=active" : "");
    }
    jc.name = cfg->job;
    jc.world = cfg->world;
    jc.rank = cfg->rank;
    jc.sync_timeout_ms = (int)(cfg->sync_timeout_s * 1000.0);
    jc.model = model;
    if (cfg->elastic_max > 0) {
        jc.elastic_min = cfg->elastic_min;
        if ((st = ferry_job_join_elastic(t->cluster, &jc, cfg->batch_size, &t->job)) != FERRY_OK ||
            (st = ferry_job_set_rank_columns(t->job, cfg->elastic_rank_batch)) != FERRY_OK)
            return st;
        int r = ferry_job_get_config(t->job)->rank, b = cfg->elastic_rank_batch;
        const char *sync = cfg->sync != NULL ? cfg->sync : "bsp";
        t->el_async = jc.sync != FERRY_SYNC_BSP;
        if (b > 0)
            FERRY_LOG_INFO("job '%s': elastic, rank %d (picked) of %d..%d members, --sync %s, "
                           "per-rank batch: columns [%d, %d) of %d (its data shard; the "
                           "learning rate scales with the members: lr x members / %d%s)",
                           cfg->job, r, cfg->elastic_min, cfg->elastic_max, sync, r * b,
                           (r + 1) * b, cfg->batch_size, cfg->elastic_max,
                           t->el_async ? ", each member's step applied on its own" : "");
        else
            FERRY_LOG_INFO("job '%s': elastic, rank %d (picked) of %d..%d members, --sync bsp, "
                           "a share of the global batch of %d columns",
                           cfg->job, r, cfg->elastic_min, cfg->elastic_max, cfg->batch_size);
        return FERRY_OK;
    }
    /* A resuming rank does not join: it recovers (the roll-back makes it a member). */
    if ((st = resume ? ferry_job_create(t->cluster, &jc, &t->job)
                     : ferry_job_join(t->cluster, &jc, &t->job)) != FERRY_OK)
        return st;
    ferry_job_set_last_step(t->job, (uint64_t)t->last_step);
    FERRY_LOG_INFO("job '%s': rank %d of %d (%s), --sync %s, batch columns [%d, %d) of %d",
                   cfg->job, cfg->rank, cfg->world, cfg->membership,
                   cfg->sync != NULL ? cfg->sync : "bsp", t->c0, t->c1, cfg->batch_size);
    return cfg->save != NULL && cfg->rank == 0 ? check_can_save(t) : FERRY_OK;
}

/* ---- BLAS threads beside servers on the same machine ---- */

/* 1 when the host of "HOST:PORT" (or "[v6]:PORT") is this machine: a loopback
 * address, or one of its interfaces' addresses. */
static int target_is_local(const char *target) {
    char host[256];
    const char *colon = strrchr(target, ':');
    size_t n = colon != NULL ? (size_t)(colon - target) : strlen(target);
    if (n >= 2 && target[0] == '[' && target[n - 1] == ']') {
        target++;
        n -= 2;
    }
    if (n == 0 || n >= sizeof host)
        return 0;
    memcpy(host, target, n);
    host[n] = '\0';
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return 0;
    struct ifaddrs *ifs = NULL;
    int local = 0;
    (void)getifaddrs(&ifs);
    for (struct addrinfo *a = res; a != NULL && !local; a = a->ai_next) {
        if (a->ai_family == AF_INET) {
            const struct sockaddr_in *in = (const void *)a->ai_addr;
            local = (ntohl(in->sin_addr.s_addr) >> 24) == 127;
        } else if (a->ai_family == AF_INET6) {
            const struct sockaddr_in6 *in = (const void *)a->ai_addr;
            local = IN6_IS_ADDR_LOOPBACK(&in->sin6_addr);
        }
        for (struct ifaddrs *i = ifs; i != NULL && !local; i = i->ifa_next) {
            if (i->ifa_addr == NULL || i->ifa_addr->sa_family != a->ai_family)
                continue;
            if (a->ai_family == AF_INET)
                local = ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr.s_addr ==
                        ((const struct sockaddr_in *)(const void *)a->ai_addr)->sin_addr.s_addr;
            else if (a->ai_family == AF_INET6)
                local = memcmp(&((const struct sockaddr_in6 *)(const void *)i->ifa_addr)->sin6_addr,
                               &((const struct sockaddr_in6 *)(const void *)a->ai_addr)->sin6_addr,
                               sizeof(struct in6_addr)) == 0;
        }
    }
    freeifaddrs(ifs);
    freeaddrinfo(res);
    return local;
}

static void blas_threads_fn(void *user, const char *name, double value) {
    if (strcmp(name, "blas_threads") == 0)
        *(double *)user = value;
}

/* The trainer's OpenBLAS threads: --threads, but never more than the cores the
 * ferry-ps processes on this machine leave free, so that trainer and servers, which
 * compute at the same time in a pipeline, never fight over a core (an OpenBLAS
 * thread spinning on a server's core slows both). Logs the choice. */
static void place_blas_threads(trainer *t) {
    const ferry_trainer_config *cfg = t->cfg;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int want = cfg->threads, servers = 0;
    double used = 0.0;
    for (int i = 0; t->cluster != NULL && i < ferry_cluster_size(t->cluster); i++) {
        if (!target_is_local(ferry_cluster_target(t->cluster, i)))
            continue;
        double n = 1.0; /* a server too old to say uses one */
        (void)ferry_cluster_metrics(t->cluster, i, "blas_threads", blas_threads_fn, &n);
        used += n;
        servers++;
    }
    int room = cores > 0 ? (int)cores - (int)used : want;
    int use = servers > 0 && want > room ? (room > 1 ? room : 1) : want;
    ferry_cpu_set_threads(use);
    if (use < want)
        FERRY_LOG_INFO("OpenBLAS: %s, %d thread%s (not the %d of --threads: %d ferry-ps on this "
                       "machine use%s %.0f of its %ld cores)",
                       ferry_cpu_blas_kernels(), use, use > 1 ? "s" : "", want, servers,
                       servers == 1 ? "s" : "", used, cores);
    else
        FERRY_LOG_INFO("OpenBLAS: %s, %d thread%s", ferry_cpu_blas_kernels(), use,
                       use > 1 ? "s" : "");
}

/* libferry's connect errors name no flag; the trainer's add the flags that apply. */
static ferry_status connect_hint(ferry_status st) {
    const char *flags = st == FERRY_ERR_AUTH ? "--tls-ca, --tls-cert, --tls-key, --token-file"
                        : st == FERRY_ERR_NOT_FOUND   ? "--resolve-timeout to wait for the name"
                        : st == FERRY_ERR_UNAVAILABLE ? "--connect-timeout"
                                                      : NULL;
    if (flags == NULL)
        return st;
    char why[1024];
    (void)snprintf(why, sizeof why, "%s", ferry_error_last());
    return ferry_errorf(st, "%s [%s]", why, flags);
}

/* The corpus, its batches, and the run's last step. */
static ferry_status setup_data(trainer *t, int64_t *V) {
    const ferry_trainer_config *cfg = t->cfg;
    ferry_status st;
    double t0 = ferry_now();
    if ((st = ferry_corpus_load(cfg->data, &t->corpus)) != FERRY_OK)
        return st;
    *V = ferry_vocab_size(ferry_corpus_vocab(t->corpus));
    FERRY_LOG_INFO("corpus %s: vocabulary %lld, loaded in %.2f s", cfg->data, (long long)*V,
                   ferry_now() - t0);
    if ((st = ferry__trainer_make_batches(cfg, t->corpus, FERRY_SPLIT_TRAIN, cfg->batch_size,
                                          cfg->train_tokens, &t->train)) != FERRY_OK ||
        (st = ferry__trainer_make_batches(cfg, t->corpus, FERRY_SPLIT_VALID, cfg->eval_batch_size,
                                          cfg->eval_tokens, &t->valid)) != FERRY_OK ||
        (st = ferry__trainer_make_batches(cfg, t->corpus, FERRY_SPLIT_TEST, cfg->eval_batch_size,
                                          cfg->eval_tokens, &t->test)) != FERRY_OK)
        return st;
    /* Every window of every epoch is one step, unless --max-steps stops the run first. */
    int64_t total = (int64_t)cfg->epochs * ferry_batch_nwindows(t->train, cfg->bptt);
    t->last_step = cfg->max_steps > 0 && cfg->max_steps < total ? cfg->max_steps : total;
    return FERRY_OK;
}

/* The layers placed on the servers, one line: "layers 0-1 127.0.0.1:7000, layer 2 here". */
static void log_stages(const trainer *t) {
    char line[512];
    int n = 0;
    for (int g = 0; g < ferry_lm_ngroups(t->lm) && n >= 0 && (size_t)n < sizeof line; g++) {
        int first, count, server;
        ferry_lm_group_info(t->lm, g, &first, &count, &server);
        char layers[32];
        if (count == 1)
            (void)snprintf(layers, sizeof layers, "layer %d", first);
        else
            (void)snprintf(layers, sizeof layers, "layers %d-%d", first, first + count - 1);
        n += snprintf(line + n, sizeof line - (size_t)n, "%s%s %s", g ? ", " : "", layers,
                      server < 0 ? "here" : ferry_cluster_target(t->cluster, server));
    }
    FERRY_LOG_INFO("stages: embedding and decoder on the servers, %s", line);
}

ferry_status ferry__trainer_cluster_config(const trainer *t, ferry_cluster_config *cc,
                                           char **token) {
    const ferry_trainer_config *cfg = t->cfg;
    *token = NULL;
    ferry_cluster_config_default(cc);
    cc->deadline_ms = (int)cfg->deadline_ms;
    cc->wait_for_ready = 1; /* ride out daemons that are still starting */
    cc->connect_timeout_ms = (int)(cfg->connect_timeout_s * 1000.0);
    cc->resolve_timeout_ms = (int)(cfg->resolve_timeout_s * 1000.0);
    cc->worker_id = (uint16_t)cfg->rank; /* context ids carry the rank */
    cc->wire_bf16 = cfg->wire_dtype == 1;
    cc->replicas = cfg->replicas;
    cc->replication = cfg->replication;
    ferry_status st = ferry_token_read(cfg->token_file, "FERRY_TOKEN_FILE", token);
    if (st != FERRY_OK)
        return st;
    cc->token = *token;
    cc->tls_ca_file = cfg->tls_ca;
    cc->tls_cert_file = cfg->tls_cert;
    cc->tls_key_file = cfg->tls_key;
    return FERRY_OK;
}

/* With --ps: connects, joins the job (a job: several ranks, a sync mode, or
 * checkpoints), and builds the model placed on the servers. */
static ferry_status setup_distributed(trainer *t, const ferry_lm_config *mcp,
                                      const ferry_optim_config *ocp) {
    const ferry_trainer_config *cfg = t->cfg;
    ferry_lm_config mc = *mcp;
    ferry_optim_config oc = *ocp;
    ferry_status st;
    ferry_cluster_config cc;
    char *token = NULL;
    if ((st = ferry__trainer_cluster_config(t, &cc, &token)) != FERRY_OK)
        return st;
    st = ferry_ps_connect(cfg->ps, &cc, &t->cluster);
    ferry_secret_free(token);
    if (st != FERRY_OK)
        return connect_hint(st);
    if ((t->srv_now = strdup(cfg->ps)) == NULL)
        return FERRY_NOMEM();
    if ((st = ferry_dist_ctx_create(t->cluster, &t->dc)) != FERRY_OK)
        return st;
    /* A job: several ranks, a sync mode, or checkpoints (the job protocol is what
     * ties the servers' checkpoints to the trainers'). */
    int as_job = ferry_trainer_is_job(cfg);
    if (as_job && (st = job_join(t, &mc, &oc, cfg->load != NULL)) != FERRY_OK)
        return st;
    /* An elastic job's servers may have moved since this trainer's --ps was written:
     * its modules are placed over the servers the job runs on now. */
    if (cfg->elastic_max > 0 && (st = ferry__trainer_elastic_where(t)) != FERRY_OK)
        return st;
    t->recover = as_job && cfg->checkpoint_every > 0;
    ferry_lm_placement pl = {.cluster = t->cluster,
                             .decoder_mode = (ferry_decoder_mode)cfg->decoder_mode,
                             .optim = oc,
                             .job = t->job,
                             .resume = t->job != NULL && cfg->load != NULL,
                             .stages = cfg->stages,
                             .local_vocab = cfg->local_vocab,
                             .model = cfg->model,
                             .fresh = !cfg->continue_run && cfg->load == NULL};
    st = ferry_lm_create_placed(t->be, &mc, &pl, &t->lm);
    if (st == FERRY_OK && cfg->continue_run &&
        ferry_remote_created(ferry_lm_embedding_remote(t->lm)) <
            ferry_remote_shards(ferry_lm_embedding_remote(t->lm)))
        FERRY_LOG_INFO("--continue: training from the parameters ferry-ps holds for '%s'",
                       ferry_remote_name(ferry_lm_embedding_remote(t->lm)));
    char reps[64] = "";
    if (cfg->replicas > 1)
        (void)snprintf(reps, sizeof reps, " shards x %d replicas, %s", cfg->replicas,
                       cfg->replication == FERRY_REPLICATION_ACTIVE ? "active" : "primary-backup");
    FERRY_LOG_INFO("distributed: %d ferry-ps%s (%s), decoder %s, wire %s",
                   ferry_cluster_size(t->cluster), reps, cfg->ps,
                   cfg->decoder_mode ? "sharded-softmax" : "logits",
                   cfg->wire_dtype ? "bf16 (activations and dense pulls/pushes rounded)" : "f32");
    if (st == FERRY_OK && cfg->local_vocab > 0)
        FERRY_LOG_INFO("decoder: vocabulary rows %lld-%lld on the servers, %lld-%lld here "
                       "(--local-vocab %lld)",
                       0LL, (long long)(mc.V - cfg->local_vocab - 1),
                       (long long)(mc.V - cfg->local_vocab), (long long)(mc.V - 1),
                       (long long)cfg->local_vocab);
    int first, count, server = -1;
    if (st == FERRY_OK)
        ferry_lm_group_info(t->lm, 0, &first, &count, &server);
    if (st == FERRY_OK && (ferry_lm_ngroups(t->lm) > 1 || server >= 0))
        log_stages(t);
    return st;
}

/* --metrics-out and --metrics-listen. */
static ferry_status setup_outputs(trainer *t) {
    const ferry_trainer_config *cfg = t->cfg;
    ferry_status st;
    if (cfg->metrics_out != NULL &&
        (st = ferry_metrics_open_mode(cfg->metrics_out, cfg->load != NULL, &t->metrics)) !=
            FERRY_OK)
        return st;
    if (cfg->metrics_listen != NULL) {
        if ((st = ferry_http_start(cfg->metrics_listen, ferry__trainer_metrics_page, NULL, t,
                                   &t->http)) != FERRY_OK)
            return st;
        const char *colon = strrchr(cfg->metrics_listen, ':');
        FERRY_LOG_INFO("metrics on http://%.*s:%d (/metrics, /healthz)",
                       (int)(colon - cfg->metrics_listen), cfg->metrics_listen,
                       ferry_http_port(t->http));
    }
    return FERRY_OK;
}

/* Where the run starts: a resume (--load; a job's: the whole job rolls back to the
 * newest checkpoint every process has), else step 0, checkpointed when the job
 * recovers from crashes; then the retries of a recovering job. */
static ferry_status setup_start(trainer *t) {
    const ferry_trainer_config *cfg = t->cfg;
    ferry_status st;
    /* Temporary files of checkpoint writes a kill interrupted (this rank's only). */
    ferry_checkpoint_sweep_temps(cfg->save, t->job != NULL ? cfg->rank : -1);
    if (cfg->load != NULL && t->job != NULL) {
        /* The whole job goes back to the newest checkpoint every process has. */
        char why[1200];
        (void)snprintf(why, sizeof why, "resuming %s", cfg->load);
        if ((st = ferry__trainer_recover(t, why)) != FERRY_OK)
            return st;
    } else if (cfg->load != NULL) {
        char path[2048];
        int found = 0;
        ferry_ck_progress pr;
        if ((st = ferry_checkpoint_resolve(cfg->load, -1, path, sizeof path, &found)) != FERRY_OK)
            return st;
        if (!found)
            return ferry_errorf(FERRY_ERR_IO,
                                "cannot open checkpoint %s: no such file, and no "
                                "complete %s.<step>",
                                cfg->load, cfg->load);
        if ((st = ferry_checkpoint_load(path, t->lm, t->opt,
                                        ferry_vocab_hash(ferry_corpus_vocab(t->corpus)), &pr)) !=
                FERRY_OK ||
            (st = ferry__trainer_apply_progress(t, &pr)) != FERRY_OK)
            return st;
        FERRY_LOG_INFO("resumed from %s: epoch %d at window %lld, step %lld, lr %g", path, t->epoch,
                       (long long)t->win0, (long long)t->step, (double)t->lr);
    }
    if (cfg->load != NULL && t->metrics != NULL) {
        const char *keys[] = {"step", "epoch", "window"};
        double vals[] = {(double)t->step, t->epoch, (double)t->win0};
        if ((st = ferry_metrics_write_kv(t->metrics, "resume", 3, keys, vals)) != FERRY_OK)
            return st;
    }
    /* An elastic job's rank starts where the members are when it is admitted. */
    if (cfg->elastic_max > 0 && (st = ferry__trainer_elastic_admit(t)) != FERRY_OK)
        return st;
    /* A recovering job starts with a checkpoint at step 0: a crash before the first
     * interval rolls back to the start. */
    if (cfg->load == NULL && t->recover &&
        (st = ferry__trainer_save_checkpoint(t, 1, 0)) != FERRY_OK)
        return st;
    /* A dead server fails at once: a replica's sibling goes on without waiting a
     * deadline for it, and an elastic job's members learn that it is lost. */
    if (t->recover || cfg->replicas > 1 || cfg->elastic_max > 0)
        ferry_cluster_set_wait_for_ready(t->cluster, 0);
    /* A call lost in a stall or a broken connection is sent again (the servers apply
     * it once); a restarted server refuses it, and the job rolls back. */
    if (t->recover)
        ferry_cluster_set_retry(t->cluster, (int)(cfg->recovery_timeout_s * 1000.0));
    return FERRY_OK;
}

ferry_status ferry__trainer_setup(trainer *t) {
    const ferry_trainer_config *cfg = t->cfg;
    ferry_status st;
    ferry_cpu_set_threads(cfg->threads);
    if ((st = ferry_backend_create(cfg->device, &t->be)) != FERRY_OK)
        return st;
    int64_t V;
    if ((st = setup_data(t, &V)) != FERRY_OK)
        return st;
    ferry_lm_config mc = {V,
                          cfg->emsize,
                          cfg->nhid,
                          cfg->nlayers,
                          cfg->dropout,
                          cfg->init_scale,
                          cfg->stiefel,
                          (uint64_t)cfg->seed};
    ferry_optim_config oc = ferry_trainer_optim(cfg);
    t->lr = (float)oc.lr;
    ferry_lr_schedule_config sc = ferry_lr_schedule_defaults((ferry_lr_schedule_kind)cfg->schedule);
    sc.gamma = cfg->lr_decay;
    sc.start = cfg->lr_decay_start;
    sc.every = cfg->lr_decay_every;
    sc.patience = cfg->patience;
    if ((st = ferry_lr_schedule_init(&t->sched, &sc)) != FERRY_OK)
        return st;
    t->c0 = 0;
    t->c1 = cfg->batch_size;
    st = cfg->ps != NULL ? setup_distributed(t, &mc, &oc) : ferry_lm_create(t->be, &mc, &t->lm);
    if (st != FERRY_OK)
        return st;
    place_blas_threads(t);
    ferry_lm_set_grad_thread(t->lm, (ferry_lm_grad_thread)cfg->grad_thread);
    if (ferry_lm_uses_grad_thread(t->lm))
        FERRY_LOG_INFO("the LSTM's weight gradients form on a helper thread (--grad-thread %s)",
                       cfg->grad_thread == FERRY_LM_GRAD_THREAD_ON ? "on" : "auto");
    if (cfg->micro_batches > 1) {
        if (cfg->micro_batches > cfg->bptt)
            return ferry_errorf(FERRY_ERR_INVALID,
                                "--micro-batches %d: a window has %d time "
                                "steps (--bptt), at most one micro-batch per step",
                                cfg->micro_batches, cfg->bptt);
        if ((st = ferry_lm_set_micro_batches(t->lm, cfg->micro_batches)) != FERRY_OK)
            return st;
        FERRY_LOG_INFO("pipeline: %d micro-batches of %d-%d time steps: the LSTM on one while "
                       "ferry-ps runs the decoder on another",
                       cfg->micro_batches, cfg->bptt / cfg->micro_batches,
                       (cfg->bptt + cfg->micro_batches - 1) / cfg->micro_batches);
    }
    if ((st = ferry_optim_create(ferry_lm_params(t->lm), &oc, &t->opt)) != FERRY_OK)
        return st;
    if ((st = ferry_ctx_create(t->be, &t->ctx)) != FERRY_OK)
        return st;
    if ((st = setup_outputs(t)) != FERRY_OK)
        return st;
    t->epoch = 1;
    if ((st = setup_start(t)) != FERRY_OK)
        return st;
    char params[160];
    ferry__trainer_describe_params(t, params, sizeof params);
    FERRY_LOG_INFO("model: V=%lld E=%d H=%d L=%d, %s; %s lr %g, batch %d, bptt %d, clip %g, "
                   "loss %s, device %s",
                   (long long)V, cfg->emsize, cfg->nhid, cfg->nlayers, params,
                   ferry_optim_kind_name(oc.kind), (double)oc.lr, cfg->batch_size, cfg->bptt,
                   (double)cfg->clip, cfg->loss_scale ? "sum-time" : "mean",
                   ferry_backend_name(t->be));
    return FERRY_OK;
}

/* Frees the run; ferry_error_last keeps the run's error (leaving the job or closing
 * files must not replace it). */
void ferry__trainer_teardown(trainer *t, ferry_status run) {
    char err[1024];
    (void)snprintf(err, sizeof err, "%s", ferry_error_last());
    ferry_http_stop(t->http); /* before what its page reads */
    t->http = NULL;
    ferry_progress_destroy(t->progress);
    if (t->metrics != NULL && ferry_metrics_close(t->metrics) != FERRY_OK)
        FERRY_LOG_WARN("metrics: %s", ferry_error_last());
    ferry_ctx_destroy(t->ctx);
    ferry_optim_destroy(t->opt);
    ferry_lm_destroy(t->lm);
    /* After a peer failed, no cleanup call waits on it (the servers sweep). */
    int peer_failed = run == FERRY_ERR_UNAVAILABLE || run == FERRY_ERR_TIMEOUT ||
                      run == FERRY_ERR_RPC || run == FERRY_ERR_BUSY;
    if (peer_failed) { /* the LEAVE below goes once: a dead server is not waited for */
        ferry_dist_ctx_abandon(t->dc);
        ferry_cluster_set_wait_for_ready(t->cluster, 0);
        if (t->cluster != NULL)
            ferry_cluster_set_retry(t->cluster, 0);
    }
    ferry_dist_ctx_destroy(t->dc);
    /* The others learn at once that this rank is done, and why when it stops early:
     * their waits for it end with that reason instead of at --sync-timeout. */
    if (t->job != NULL && !t->complete) {
        char reason[256] = "";
        if (run != FERRY_OK)
            (void)snprintf(reason, sizeof reason, "%.255s",
                           err[0] != '\0' ? err : ferry_status_str(run));
        else if (ferry_trainer_stop_requested())
            (void)snprintf(reason, sizeof reason, "stopped by a signal after step %lld",
                           (long long)t->step);
        if (ferry_job_leave_after(t->job, (uint64_t)t->step, reason) != FERRY_OK) {
            if (run == FERRY_OK)
                FERRY_LOG_WARN("leaving job '%s': %s", t->cfg->job, ferry_error_last());
            else
                FERRY_LOG_INFO("leaving job '%s': %s", t->cfg->job, ferry_error_last());
        }
    }
    ferry_job_destroy(t->job);
    ferry_cluster_destroy(t->cluster);
    free(t->srv_now);
    free(t->in_buf);
    free(t->tg_buf);
    if (err[0] != '\0')
        (void)ferry_errorf(FERRY_ERR_INVALID, "%s", err); /* only the text is read */
    ferry_batch_destroy(t->train);
    ferry_batch_destroy(t->valid);
    ferry_batch_destroy(t->test);
    ferry_corpus_destroy(t->corpus);
    ferry_backend_destroy(t->be);
}
