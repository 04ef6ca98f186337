/* recovery.c - a run's checkpoints and its recovery: this rank's part written at
 * the steps due (with the servers' checkpoint of the job's step), the progress a
 * resume restores, and, when a server or a rank of the job failed, the roll-back of
 * every rank to the newest checkpoint they all hold (or none when the job is at its
 * last step), bounded by --recovery-timeout. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/core/log.h"
#include "worker/trainer-impl.h"

/* A checkpoint of the whole job at this step boundary, under one id (the step):
 * rank 0 (or the only trainer) asks every ferry-ps to write its modules as
 * "<job>-step<N>.ckpt"; then every rank writes its own part (configuration, where it
 * is, carried state, its parameter block and optimizer) with the list of server
 * files, which commits the checkpoint for this rank. (epoch, window): where to go
 * on, window 0 meaning the start of `epoch`. */
ferry_status ferry__trainer_save_checkpoint(trainer *t, int epoch, int64_t window) {
    const ferry_trainer_config *cfg = t->cfg;
    if (cfg->save == NULL)
        return FERRY_OK;
    if (t->op_t0 == 0.0)
        t->op_t0 = ferry_now();
    ferry_status st = ferry_lm_pull_dense(t->lm);
    if (st != FERRY_OK)
        return st;
    char manifest[4096] = "", name[160] = "";
    if (t->job != NULL) {
        (void)snprintf(name, sizeof name, "%s-step%lld.ckpt", cfg->job, (long long)t->step);
        for (char *p = name; *p != '\0'; p++)
            if (*p == '/' || *p == ':')
                *p = '_';
    }
    if (t->cluster != NULL && (t->job == NULL || cfg->rank == 0)) {
        /* A job's checkpoint is the job's own (its owner's modules, by a member); a run
         * outside a job checkpoints the whole server, which takes the admin token. */
        st = t->job != NULL ? ferry_job_checkpoint(t->job, (uint64_t)t->step)
                            : ferry_cluster_checkpoint(t->cluster, NULL, (uint64_t)t->step);
        if (st == FERRY_ERR_UNSUPPORTED && !t->recover) {
            FERRY_LOG_WARN("ferry-ps shards were not checkpointed (%s): start them with "
                           "--checkpoint-dir DIR to keep the embedding and decoder too",
                           ferry_error_last());
            st = FERRY_OK;
        } else if (st == FERRY_ERR_DENIED) {
            char why[512];
            (void)snprintf(why, sizeof why, "%s", ferry_error_last());
            if (t->recover)
                return ferry_errorf(st,
                                    "%s: a job that checkpoints ferry-ps needs the admin token "
                                    "(--token-file)",
                                    why);
            FERRY_LOG_WARN("ferry-ps shards were not checkpointed (%s): give this trainer the "
                           "admin token to keep the embedding and decoder too",
                           why);
            st = FERRY_OK;
        } else if (st != FERRY_OK) {
            return st;
        }
    }
    for (int i = 0; t->cluster != NULL && i < ferry_cluster_size(t->cluster); i++) {
        size_t n = strlen(manifest);
        /* by index, not address: a job may come back on other hosts */
        (void)snprintf(manifest + n, sizeof manifest - n, "server %d %s\n", i,
                       name[0] ? name : "(default name)");
    }
    ferry_ck_progress pr;
    memset(&pr, 0, sizeof pr);
    pr.epoch = epoch;
    pr.window = window;
    pr.step = t->step;
    pr.lr = t->lr;
    pr.sched = t->sched;
    pr.vocab_hash = ferry_vocab_hash(ferry_corpus_vocab(t->corpus));
    pr.has_state = window > 0;
    char path[2048];
    int rank = t->job != NULL ? cfg->rank : -1;
    ferry_checkpoint_part(cfg->save, rank, t->step, path, sizeof path);
    st = ferry_checkpoint_save(path, cfg, t->lm, t->opt, &pr, manifest);
    if (st == FERRY_OK) {
        ferry_checkpoint_retain(cfg->save, rank, cfg->keep_checkpoints);
        t->op_t0 = 0.0;
    }
    return st;
}

/* Takes a loaded part's progress. */
ferry_status ferry__trainer_apply_progress(trainer *t, const ferry_ck_progress *pr) {
    t->epoch = pr->epoch;
    t->win0 = pr->window;
    t->carried = pr->has_state;
    t->step = pr->step;
    t->lr = pr->lr;
    t->sched.best = pr->sched.best;
    t->sched.bad_epochs = pr->sched.bad_epochs;
    t->sched.cooldown_left = pr->sched.cooldown_left;
    return ferry_optim_set_lr(t->opt, t->lr);
}

static void steps_text(const int64_t *s, size_t n, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && k + 24 < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? "," : "", (long long)s[i]);
    if (n == 0)
        (void)snprintf(buf, cap, "none");
}

/* What a roll-back found (rollback's *outcome). */
enum {
    ROLLED_BACK,  /* every rank went back to a common checkpoint */
    AT_LAST_STEP, /* every server and this rank's part are at the run's last step */
    JOB_COMPLETE  /* the job completed its run without this rank: nothing left to do */
};

/* The roll-back proper: the whole job goes back to the newest checkpoint every
 * process has. Probes (each server's complete files, and where its copy of the job
 * stands: fresh, older, newer) and the recover barrier, until every server answers
 * and agrees on a step (*resume), within the recovery timeout from t0. `all`: this
 * rank's complete checkpoints, ascending. At the run's last step no roll-back may be
 * needed (*outcome). Servers that are down are waited for. */
static ferry_status rollback(trainer *t, const int64_t *all, size_t nall, double t0,
                             uint64_t *resume, int *outcome) {
    const ferry_trainer_config *cfg = t->cfg;
    double limit = cfg->recovery_timeout_s;
    int n = ferry_cluster_size(t->cluster), waiting = -1;
    ferry_status st = FERRY_OK;
    char text[512], have[256];
    uint64_t last = (uint64_t)t->last_step;
    int have_last = nall > 0 && all[nall - 1] == t->last_step;
    int64_t *mine = malloc((nall ? nall : 1) * sizeof *mine);
    if (mine == NULL)
        return FERRY_NOMEM();
    *outcome = ROLLED_BACK;
    for (int attempt = 0;; attempt++) {
        if (attempt > 0) {
            if (ferry_now() - t0 > limit) {
                st = ferry_errorf(FERRY_ERR_TIMEOUT,
                                  "recovery failed after %.0f s (--recovery-timeout %g): %s",
                                  ferry_now() - t0, limit, text);
                break;
            }
            struct timespec ts = {0, 100000000L};
            nanosleep(&ts, NULL);
        }
        /* offer = this rank's ∩ every server's */
        memcpy(mine, all, nall * sizeof *mine);
        size_t nmine = nall;
        int down = -1, at_last = last > 0, rolling = 0, finished = 0;
        uint64_t completed = 0;
        for (int s = 0; s < n; s++) {
            ferry_job_probe_result pr;
            if (ferry_job_probe(t->job, s, &pr) != FERRY_OK) {
                down = s;
                (void)snprintf(text, sizeof text, "%s", ferry_error_last());
                break;
            }
            size_t m = 0;
            for (size_t i = 0; i < nmine; i++) {
                for (size_t k = 0; k < pr.n; k++) {
                    if ((uint64_t)mine[i] == pr.steps[k]) {
                        mine[m++] = mine[i];
                        break;
                    }
                }
            }
            nmine = m;
            at_last &= pr.has_state && pr.state_step == last;
            rolling |= pr.rolling_back;
            finished |= pr.finished;
            completed = pr.completed_step > completed ? pr.completed_step : completed;
            if (attempt == 0 || waiting == s) {
                if (!pr.has_state)
                    (void)snprintf(have, sizeof have, "fresh (no state of the job)");
                else
                    (void)snprintf(have, sizeof have, "at step %llu",
                                   (unsigned long long)pr.state_step);
                FERRY_LOG_INFO("recovery: server %d (%s) is %s, holds %zu complete checkpoints "
                               "of the job",
                               s, ferry_cluster_target(t->cluster, s), have, pr.n);
            }
            ferry_job_probe_free(&pr);
        }
        if (down >= 0) {
            if (waiting != down)
                FERRY_LOG_WARN("recovery: waiting for %s to come back (%s)",
                               ferry_cluster_target(t->cluster, down), text);
            waiting = down;
            continue;
        }
        /* Every server is at the run's last step: the job's training is done. Either
         * it completed without this rank (which stopped before writing its part of the
         * last step), or this rank's part of it is here and nothing needs to roll
         * back: it takes its rank again and finishes (unless a roll-back is under
         * way, which it joins). */
        if (at_last && (finished || (!have_last && completed == last))) {
            *outcome = JOB_COMPLETE;
            break;
        }
        if (at_last && have_last && !rolling) {
            if ((st = ferry_job_rejoin(t->job)) == FERRY_OK) {
                *resume = last;
                *outcome = AT_LAST_STEP;
                break;
            }
            FERRY_LOG_INFO("recovery: rank %d cannot take its place at the last step again "
                           "(%s): the job rolls back",
                           cfg->rank, ferry_error_last());
        }
        if (nmine == 0) {
            steps_text(all, nall, have, sizeof have);
            st = ferry_errorf(FERRY_ERR_NOT_FOUND,
                              "recovery impossible: no checkpoint that this rank (steps %s in "
                              "%s.r%d.*) and every ferry-ps hold (start the servers with the "
                              "same --checkpoint-dir they had)",
                              have, t->ck_base, cfg->rank);
            break;
        }
        uint64_t offer[1024];
        size_t no = nmine < 1024 ? nmine : 1024;
        for (size_t i = 0; i < no; i++)
            offer[i] = (uint64_t)mine[nmine - no + i];
        double left = limit - (ferry_now() - t0);
        st = ferry_job_recover(t->job, offer, no, (int)(left > 1.0 ? left * 1000.0 : 1000.0),
                               resume);
        if (st == FERRY_OK)
            break;
        (void)snprintf(text, sizeof text, "%s", ferry_error_last());
        if (st == FERRY_ERR_NOT_FOUND || st == FERRY_ERR_EXISTS || st == FERRY_ERR_INVALID ||
            st == FERRY_ERR_ABORTED) {
            st = ferry_errorf(st, "recovery failed: %s", text);
            break;
        }
        FERRY_LOG_INFO("recovery: retrying the roll-back (%s)", text);
    }
    free(mine);
    return st;
}

ferry_status ferry__trainer_recover(trainer *t, const char *why) {
    const ferry_trainer_config *cfg = t->cfg;
    /* The recovery counts from the start of the server work that failed: its calls may
     * have spent part of the time being sent again. */
    double t0 = t->op_t0 > 0.0 ? t->op_t0 : ferry_now();
    t->op_t0 = 0.0;
    FERRY_LOG_WARN("recovering: %s; the job rolls back to its newest complete checkpoint "
                   "(waiting up to %.0f s more, --recovery-timeout %g)",
                   why, fmax(0.0, cfg->recovery_timeout_s - (ferry_now() - t0)),
                   cfg->recovery_timeout_s);
    ferry_dist_ctx_abandon(t->dc); /* no cleanup calls to a dead peer */
    ferry_cluster_set_wait_for_ready(t->cluster, 0);
    /* This rank's parts do not change while it waits: read and verify them once. */
    int64_t *all = NULL;
    size_t nall = 0;
    uint64_t resume = 0;
    int outcome = ROLLED_BACK;
    ferry_status st = ferry_checkpoint_steps(t->ck_base, cfg->rank, &all, &nall);
    if (st == FERRY_OK)
        st = rollback(t, all, nall, t0, &resume, &outcome);
    int64_t newest = nall > 0 ? all[nall - 1] : -1;
    free(all);
    if (st != FERRY_OK)
        return st;
    ferry_checkpoint_sweep_temps(t->ck_base, cfg->rank);
    if (outcome == JOB_COMPLETE) {
        t->complete = 1;
        FERRY_LOG_WARN("job '%s' is complete: every server is at its last step (%lld) and the "
                       "ranks that finished it have left; this rank's newest part is %s%lld: "
                       "nothing is left for it to do",
                       cfg->job, (long long)t->last_step,
                       newest == t->last_step ? "that step, " : "step ", (long long)newest);
        return FERRY_OK;
    }
    /* Learn the servers' incarnations anew: later context calls name them, so that a
     * server restarting again is noticed at once. */
    int restarted = 0;
    if ((st = ferry_cluster_hello(t->cluster, &restarted)) != FERRY_OK)
        return st;
    char path[2048];
    ferry_checkpoint_part(t->ck_base, cfg->rank, (int64_t)resume, path, sizeof path);
    ferry_ck_progress pr;
    if ((st = ferry_checkpoint_load(path, t->lm, t->opt,
                                    ferry_vocab_hash(ferry_corpus_vocab(t->corpus)), &pr)) !=
            FERRY_OK ||
        (st = ferry__trainer_apply_progress(t, &pr)) != FERRY_OK ||
        (st = ferry_lm_pull_dense(t->lm)) != FERRY_OK)
        return st;
    if (outcome == AT_LAST_STEP)
        FERRY_LOG_WARN("recovered in %.1f s without a roll-back: every server is at the run's "
                       "last step (%llu) and this rank's part of it is complete (%s); epoch %d "
                       "finishes",
                       ferry_now() - t0, (unsigned long long)resume, path, t->epoch);
    else
        FERRY_LOG_WARN("recovered in %.1f s: the job rolled back to step %llu (%s); epoch %d "
                       "continues at window %lld",
                       ferry_now() - t0, (unsigned long long)resume, path, t->epoch,
                       (long long)t->win0);
    if (t->metrics != NULL) {
        const char *keys[] = {"step", "epoch", "window", "seconds"};
        double vals[] = {(double)t->step, t->epoch, (double)t->win0, ferry_now() - t0};
        st = ferry_metrics_write_kv(t->metrics, "recover", 4, keys, vals);
    }
    return st;
}

/* A failure recovery can repair: a peer died, stalled or restarted (its state is
 * gone: unknown contexts, modules or job), or the job is rolling back. */
int ferry__trainer_recoverable(ferry_status st) {
    /* SESSION: a call sent again reached the server restarted (its sessions are gone);
     * the roll-back says Hello there anew. */
    return st == FERRY_ERR_UNAVAILABLE || st == FERRY_ERR_TIMEOUT || st == FERRY_ERR_BUSY ||
           st == FERRY_ERR_RPC || st == FERRY_ERR_NOT_FOUND || st == FERRY_ERR_INVALID ||
           st == FERRY_ERR_IO || st == FERRY_ERR_SESSION;
}
