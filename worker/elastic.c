/* elastic.c - a rank of an elastic job (--elastic MIN:MAX): admitted at a step
 * boundary, it takes its share of the fixed global batch under each membership
 * (member i of n: columns [i*B/n, (i+1)*B/n)), puts its columns' carried state on the
 * coordinator before each step's GradNorm, learns the next step's membership after
 * each step, and redoes a step that a member will not finish under the membership
 * without it. The carried LSTM state travels as columns: each column's h then c of
 * every layer, float32. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/core/log.h"
#include "common/core/secret.h"
#include "worker/trainer-impl.h"

/* The trainers' progress after a step, as members share it (little-endian). */
#define PROGRESS_MAGIC 0x31504c45u /* "ELP1" */
#define PROGRESS_BYTES (4 + 4 + 8 + 8 + 4 + 8 + 4 + 4)

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Where the run stands after the step under way: its epoch, the next window, the
 * step count, the learning rate and the schedule's state. */
static void progress_encode(const trainer *t, int64_t next_window, unsigned char *p) {
    float lr = t->lr;
    double best = t->sched.best;
    uint32_t lr_bits;
    uint64_t best_bits;
    memcpy(&lr_bits, &lr, 4);
    memcpy(&best_bits, &best, 8);
    put_u32(p, PROGRESS_MAGIC);
    put_u32(p + 4, (uint32_t)t->epoch);
    put_u64(p + 8, (uint64_t)next_window);
    put_u64(p + 16, (uint64_t)t->step + 1);
    put_u32(p + 24, lr_bits);
    put_u64(p + 28, best_bits);
    put_u32(p + 36, (uint32_t)t->sched.bad_epochs);
    put_u32(p + 40, (uint32_t)t->sched.cooldown_left);
}

/* The learning rate and the schedule's state of progress p into *pr. */
static void progress_schedule(const unsigned char *p, ferry_ck_progress *pr) {
    uint32_t lr_bits = get_u32(p + 24);
    uint64_t best_bits = get_u64(p + 28);
    memcpy(&pr->lr, &lr_bits, 4);
    memcpy(&pr->sched.best, &best_bits, 8);
    pr->sched.bad_epochs = (int)get_u32(p + 36);
    pr->sched.cooldown_left = (int)get_u32(p + 40);
}

static ferry_status progress_decode(trainer *t, const unsigned char *p, size_t n,
                                    uint64_t step) {
    if (n != PROGRESS_BYTES || get_u32(p) != PROGRESS_MAGIC || get_u64(p + 16) != step)
        return ferry_errorf(FERRY_ERR_FORMAT,
                            "elastic job: the members' progress of step %llu is not one this "
                            "trainer reads (%zu bytes; another ferry-trainer version?)",
                            (unsigned long long)step, n);
    ferry_ck_progress pr = {0};
    pr.epoch = (int)get_u32(p + 4);
    pr.window = (int64_t)get_u64(p + 8);
    pr.step = (int64_t)step;
    pr.sched = t->sched;
    progress_schedule(p, &pr);
    pr.has_state = pr.window > 0;
    return ferry__trainer_apply_progress(t, &pr);
}

/* Bytes of one column's carried state: h and c of every layer. */
static size_t column_bytes(const trainer *t) {
    return 2 * (size_t)t->cfg->nlayers * (size_t)t->cfg->nhid * sizeof(float);
}

/* The carried state (L, Br, H) of h and c as columns into buf, or back. */
static ferry_status state_columns(trainer *t, float *buf, int to_columns) {
    int L = t->cfg->nlayers, H = t->cfg->nhid, Br = t->c1 - t->c0;
    ferry_tensor *hc[2] = {ferry_lm_state_h(t->lm), ferry_lm_state_c(t->lm)};
    ferry_backend *be = ferry_lm_backend(t->lm);
    size_t n = (size_t)L * (size_t)Br * (size_t)H;
    float *host = malloc((2 * n + 1) * sizeof *host);
    if (host == NULL)
        return FERRY_NOMEM();
    ferry_status st = FERRY_OK;
    for (int k = 0; k < 2 && to_columns && st == FERRY_OK; k++)
        st = ferry_backend_copy(be, host + k * n, hc[k]->data, n * sizeof(float),
                                FERRY_COPY_DEVICE_TO_HOST);
    for (int b = 0; b < Br && st == FERRY_OK; b++) {
        for (int k = 0; k < 2; k++) {
            for (int l = 0; l < L; l++) {
                float *col = buf + (((size_t)b * 2 + (size_t)k) * (size_t)L + (size_t)l) * H;
                float *row = host + k * n + ((size_t)l * Br + (size_t)b) * H;
                if (to_columns)
                    memcpy(col, row, (size_t)H * sizeof(float));
                else
                    memcpy(row, col, (size_t)H * sizeof(float));
            }
        }
    }
    for (int k = 0; k < 2 && !to_columns && st == FERRY_OK; k++)
        st = ferry_backend_copy(be, hc[k]->data, host + k * n, n * sizeof(float),
                                FERRY_COPY_HOST_TO_DEVICE);
    free(host);
    return st;
}

/* Membership m, under which this rank holds columns [c0, c1): logged and written as a
 * `membership` event when its epoch is new to this rank, and shown on /metrics. */
static ferry_status note_membership(trainer *t, const ferry_job_membership *m, int c0, int c1) {
    ferry_status st = FERRY_OK;
    if (m->epoch != t->el_epoch) {
        char text[256] = "";
        size_t k = 0;
        for (size_t i = 0; i < m->n && k + 16 < sizeof text; i++)
            k += (size_t)snprintf(text + k, sizeof text - k, "%s%u", i ? "," : "", m->members[i]);
        FERRY_LOG_INFO("elastic: epoch %llu from step %llu: members %s (%zu); this rank's "
                       "columns [%d, %d) of %d",
                       (unsigned long long)m->epoch, (unsigned long long)m->first_step, text, m->n,
                       c0, c1, t->cfg->batch_size);
        if (t->metrics != NULL) {
            const char *keys[] = {"epoch", "first_step", "members", "col0", "col1"};
            double vals[] = {(double)m->epoch, (double)m->first_step, (double)m->n, c0, c1};
            st = ferry_metrics_write_kv(t->metrics, "membership", 5, keys, vals);
        }
    }
    t->el_epoch = m->epoch;
    pthread_mutex_lock(&t->live_mu);
    t->live.el_epoch = m->epoch;
    t->live.el_members = m->n;
    t->live.servers = ferry_cluster_size(t->cluster);
    pthread_mutex_unlock(&t->live_mu);
    return st;
}

/* Takes membership m: this rank's columns, and their carried state when m brings it
 * (zeroed instead at an epoch's first window, where every member starts from zero). */
static ferry_status apply(trainer *t, const ferry_job_membership *m, int first_window) {
    if (m->index < 0) {
        t->el_dropped = 1; /* the run asks to be admitted again (ferry_trainer_run) */
        return ferry_errorf(FERRY_ERR_ABORTED,
                            "elastic job '%s': rank %d is not among the members of epoch %llu "
                            "(the coordinator dropped it: its connection to a server broke)",
                            t->cfg->job, ferry_job_get_config(t->job)->rank,
                            (unsigned long long)m->epoch);
    }
    int moved = m->col0 != t->c0 || m->col1 != t->c1 || m->epoch != t->el_epoch;
    ferry_status st = note_membership(t, m, m->col0, m->col1);
    if (st != FERRY_OK)
        return st;
    t->el_first = m->index == 0;
    t->c0 = m->col0;
    t->c1 = m->col1;
    if (!moved && m->state == NULL)
        return FERRY_OK;
    st = ferry_lm_reset_state(t->lm, t->c1 - t->c0);
    if (st != FERRY_OK || first_window || m->state == NULL)
        return st;
    if (m->col_bytes != column_bytes(t))
        return ferry_errorf(FERRY_ERR_FORMAT,
                            "elastic job '%s': a column's carried state has %zu bytes; this "
                            "model's has %zu",
                            t->cfg->job, m->col_bytes, column_bytes(t));
    return state_columns(t, (float *)(void *)m->state, 0);
}

/* Points this rank at `list`: its connections (kept for servers of both lists) and the
 * model's shards placed over them, then its rank joined on every server (what a move
 * waits for: joined means ready). A failure to connect or to join is tried again while
 * the move holds; one after the connections changed is not (the shards would be placed
 * for other servers than the connections'). */
static ferry_status retarget(trainer *t, const char *list) {
    ferry_status st = FERRY_OK;
    if (strcmp(list, t->srv_now) != 0) {
        char *copy = strdup(list);
        ferry_cluster_config cc;
        char *token = NULL;
        if (copy == NULL)
            return FERRY_NOMEM();
        st = ferry__trainer_cluster_config(t, &cc, &token);
        if (st == FERRY_OK) {
            pthread_mutex_lock(&t->route_mu);
            st = ferry_cluster_retarget(t->cluster, list, &cc);
            pthread_mutex_unlock(&t->route_mu);
        }
        ferry_secret_free(token);
        if (st != FERRY_OK) { /* the connections are as they were */
            free(copy);
            return ferry_errorf(st, "elastic job '%s': moving to servers %s: %s", t->cfg->job, list,
                                ferry_error_last());
        }
        free(t->srv_now);
        t->srv_now = copy;
        t->srv_unjoined = 1;
        if (t->lm != NULL && (st = ferry_lm_replace(t->lm)) != FERRY_OK) {
            t->srv_fatal = 1;
            return ferry_errorf(st, "elastic job '%s': placing the model on servers %s: %s",
                                t->cfg->job, list, ferry_error_last());
        }
    }
    if (t->srv_unjoined && (st = ferry_job_rejoin(t->job)) != FERRY_OK)
        return ferry_errorf(st, "elastic job '%s': joining servers %s: %s", t->cfg->job, list,
                            ferry_error_last());
    t->srv_unjoined = 0;
    return FERRY_OK;
}

/* The servers as the coordinator's last answer says. While a move of the job's
 * servers holds the members at a boundary, this rank connects to the servers moved
 * to, joins its rank there and asks again until the move is committed, or called off
 * (back to the servers it came from): the coordinator ends a hold that ferry-ctl did
 * not renew within the sync timeout. */
static ferry_status follow_servers(trainer *t) {
    uint64_t epoch = 0, step = 0;
    const char *list = NULL;
    int moving = ferry_job_servers(t->job, &epoch, &step, &list);
    if (!moving && epoch == t->srv_epoch)
        return FERRY_OK;
    double t0 = ferry_now();
    ferry_status st = FERRY_OK;
    char why[512] = "";
    if (moving)
        FERRY_LOG_INFO("elastic: the job's servers move to %s after step %llu; waiting", list,
                       (unsigned long long)step);
    for (int polls = 0; moving; polls++) {
        if ((strcmp(list, t->srv_now) != 0 || t->srv_unjoined) &&
            (st = retarget(t, list)) != FERRY_OK) {
            if (t->srv_fatal)
                return st;
            (void)snprintf(why, sizeof why, "%s", ferry_error_last()); /* tried again */
            if (polls == 0)
                FERRY_LOG_WARN("%s (trying again while the move holds)", why);
        }
        struct timespec ts = {0, 20000000L};
        nanosleep(&ts, NULL);
        /* *m stays: the first answer carried this rank's columns' state */
        ferry_job_membership p;
        if ((st = ferry_job_sync_membership(t->job, (uint64_t)t->step, &p)) != FERRY_OK)
            return st;
        ferry_job_membership_free(&p);
        moving = ferry_job_servers(t->job, &epoch, &step, &list);
    }
    const char *want = list[0] != '\0' ? list : t->cfg->ps;
    if ((strcmp(want, t->srv_now) != 0 || t->srv_unjoined) && (st = retarget(t, want)) != FERRY_OK)
        return st;
    FERRY_LOG_INFO("elastic: servers %s (move %llu; this rank waited %.2f s)", want,
                   (unsigned long long)epoch, ferry_now() - t0);
    if (t->metrics != NULL) {
        const char *keys[] = {"step", "servers_epoch", "servers", "seconds"};
        double vals[] = {(double)t->step, (double)epoch, (double)ferry_cluster_size(t->cluster),
                         ferry_now() - t0};
        if ((st = ferry_metrics_write_kv(t->metrics, "servers", 4, keys, vals)) != FERRY_OK)
            return st;
    }
    t->srv_epoch = epoch;
    pthread_mutex_lock(&t->live_mu);
    t->live.srv_epoch = epoch;
    t->live.servers = ferry_cluster_size(t->cluster);
    pthread_mutex_unlock(&t->live_mu);
    return FERRY_OK;
}

ferry_status ferry__trainer_elastic_where(trainer *t) {
    ferry_job_membership m;
    ferry_status st = ferry_job_members(t->job, &m);
    ferry_job_membership_free(&m);
    return st == FERRY_OK ? follow_servers(t) : st;
}

/* An elastic ssp or async job: the rank starts after step first_step - 1 (the members'
 * least), at that step's epoch and window, its columns' state from zero, with the
 * learning rate and schedule the members last put (its own while none did). */
static ferry_status async_start(trainer *t, const ferry_job_membership *m) {
    int64_t nwin = ferry_batch_nwindows(t->train, t->cfg->bptt);
    uint64_t s = m->first_step > 0 ? m->first_step - 1 : 0;
    if (nwin < 1)
        return ferry_errorf(FERRY_ERR_INVALID, "elastic job '%s': the training split has no window",
                            t->cfg->job);
    ferry_ck_progress pr = {0};
    pr.epoch = 1 + (int)(s / (uint64_t)nwin);
    pr.window = (int64_t)(s % (uint64_t)nwin);
    pr.step = (int64_t)s;
    pr.lr = t->lr;
    pr.sched = t->sched;
    const unsigned char *p = m->progress;
    if (p != NULL && (m->progress_len != PROGRESS_BYTES || get_u32(p) != PROGRESS_MAGIC))
        return ferry_errorf(FERRY_ERR_FORMAT,
                            "elastic job: the members' progress is not one this trainer reads "
                            "(%zu bytes; another ferry-trainer version?)",
                            m->progress_len);
    if (p != NULL)
        progress_schedule(p, &pr);
    ferry_status st = ferry__trainer_apply_progress(t, &pr);
    if (st == FERRY_OK)
        st = apply(t, m, 1);
    /* Admitted where its run ends (--max-steps, --epochs): it leaves at once, for it
     * will take no Step, and its START holds the others on the other servers until
     * one comes. */
    int64_t last = (int64_t)t->cfg->epochs * nwin;
    if (t->cfg->max_steps > 0 && t->cfg->max_steps < last)
        last = t->cfg->max_steps;
    if (st == FERRY_OK && (int64_t)s >= last) {
        FERRY_LOG_INFO("elastic: admitted at step %llu, where this run ends: leaving",
                       (unsigned long long)s);
        st = ferry_job_leave_after(t->job, s, "");
    }
    return st;
}

ferry_status ferry__trainer_elastic_watch(trainer *t) {
    ferry_job_membership m;
    ferry_status st = ferry_job_members(t->job, &m);
    if (st != FERRY_OK)
        return ferry_errorf(st, "elastic job '%s': asking the coordinator for the members: %s",
                            t->cfg->job, ferry_error_last());
    st = note_membership(t, &m, t->c0, t->c1);
    ferry_job_membership_free(&m);
    return st;
}

ferry_status ferry__trainer_elastic_progress(trainer *t) {
    unsigned char prog[PROGRESS_BYTES];
    progress_encode(t, 0, prog);
    put_u64(prog + 16, (uint64_t)t->step); /* after this rank's step t->step */
    return ferry_job_put_state(t->job, (uint64_t)t->step, NULL, 0, prog, sizeof prog, 0);
}

ferry_status ferry__trainer_elastic_admit(trainer *t) {
    ferry_job_membership m;
    FERRY_LOG_INFO("elastic: rank %d asks to join job '%s' (admitted %s)",
                   ferry_job_get_config(t->job)->rank, t->cfg->job,
                   t->el_async ? "at the members' least step" : "at the next step boundary");
    double t0 = ferry_now();
    ferry_status st = ferry__trainer_elastic_where(t); /* a move may have begun since */
    if (st == FERRY_OK)
        st = ferry_job_admit(t->job, &m);
    if (st != FERRY_OK)
        return st;
    if ((st = follow_servers(t)) != FERRY_OK) {
        ferry_job_membership_free(&m);
        return st;
    }
    if (t->el_async)
        st = async_start(t, &m);
    else if (m.progress != NULL)
        st = progress_decode(t, m.progress, m.progress_len, m.first_step - 1);
    else if (m.first_step > 1)
        st = ferry_errorf(FERRY_ERR_FORMAT,
                          "elastic job '%s': admitted at step %llu without the members' "
                          "progress",
                          t->cfg->job, (unsigned long long)m.first_step);
    if (st == FERRY_OK && !t->el_async)
        st = apply(t, &m, t->win0 == 0);
    t->carried = st == FERRY_OK && m.state != NULL && t->win0 > 0 && !t->el_async;
    if (st == FERRY_OK)
        FERRY_LOG_INFO("elastic: admitted in %.2f s at step %llu (epoch %d, window %lld)",
                       ferry_now() - t0, (unsigned long long)m.first_step, t->epoch,
                       (long long)t->win0);
    ferry_job_membership_free(&m);
    return st;
}

int ferry__trainer_elastic_dropped(trainer *t, ferry_status st) {
    if (t->el_dropped || (t->el_async && st == FERRY_ERR_ABORTED && t->job != NULL))
        return 1; /* ssp, async: a server refused it as not a member's */
    if (t->job == NULL || t->el_left)
        return 0;
    for (int attempt = 0; attempt < 5; attempt++) {
        ferry_job_membership m;
        if (ferry_job_sync_membership(t->job, (uint64_t)t->step, &m) != FERRY_OK)
            return 0; /* the coordinator does not answer, or not for this rank */
        int out = m.index < 0;
        ferry_job_membership_free(&m);
        if (out)
            return 1;
        struct timespec ts = {0, 200000000L};
        nanosleep(&ts, NULL);
    }
    return 0;
}

ferry_status ferry__trainer_elastic_readmit(trainer *t, const char *why) {
    t->el_dropped = 0;
    /* Admissions in a row with no step of this rank between them. */
    t->el_readmits = t->el_readmits > 0 && t->el_readmit_step == t->step ? t->el_readmits + 1 : 1;
    if (t->el_readmits > 3)
        return ferry_errorf(FERRY_ERR_ABORTED,
                            "%s; dropped again before a step after %d admissions, at step %lld: "
                            "giving up",
                            why, t->el_readmits - 1, (long long)t->step);
    FERRY_LOG_WARN("elastic: %s; after step %lld, asking to be admitted again", why,
                   (long long)t->step);
    int64_t at = t->step;
    /* The servers may have moved meanwhile: the rank follows them first. */
    ferry_status where = ferry__trainer_elastic_where(t);
    if (where != FERRY_OK)
        return ferry_errorf(where, "%s; and finding the job's servers: %s", why,
                            ferry_error_last());
    /* Every server learns that the rank's holder is back (a server that saw its
     * connection break counts it gone, and a member gone fails the others' barrier),
     * before the coordinator makes it a member again. */
    ferry_status st = ferry_job_rejoin(t->job);
    if (st == FERRY_OK)
        st = ferry__trainer_elastic_admit(t);
    if (st != FERRY_OK)
        return ferry_errorf(st, "%s; and admitted again: no: %s", why, ferry_error_last());
    t->el_readmit_step = t->step; /* where the admission put the run */
    if (t->metrics != NULL) {
        const char *keys[] = {"after_step", "step", "epoch"};
        double vals[] = {(double)at, (double)t->step + 1, (double)t->el_epoch};
        st = ferry_metrics_write_kv(t->metrics, "elastic_readmit", 3, keys, vals);
    }
    return st;
}

ferry_status ferry__trainer_elastic_put(void *user) {
    trainer *t = user;
    size_t cb = column_bytes(t), n = (size_t)(t->c1 - t->c0);
    float *buf = malloc(n * cb + 1);
    if (buf == NULL)
        return FERRY_NOMEM();
    unsigned char prog[PROGRESS_BYTES];
    progress_encode(t, t->el_window + 1, prog);
    ferry_status st = state_columns(t, buf, 1);
    if (st == FERRY_OK)
        st = ferry_job_put_state(t->job, (uint64_t)t->step + 1, buf, cb, prog, sizeof prog,
                                 ferry_trainer_stop_requested());
    free(buf);
    return st;
}

int ferry__trainer_elastic_lost(trainer *t, ferry_status st) {
    if (t->cfg->elastic_max == 0 || t->cluster == NULL ||
        (st != FERRY_ERR_UNAVAILABLE && st != FERRY_ERR_TIMEOUT))
        return 0;
    char why[1024];
    (void)snprintf(why, sizeof why, "%s", ferry_error_last());
    /* A server counts as gone when it has not answered a health check for a second:
     * a connection that broke and comes back (the channel reconnects within 250 ms)
     * is not a loss. */
    int gone = -1;
    for (int attempt = 0; attempt < 5; attempt++) {
        gone = -1;
        for (int s = 0; s < ferry_cluster_size(t->cluster) && gone < 0; s++) {
            int serving = 0;
            if (ferry_cluster_health(t->cluster, s, &serving) != FERRY_OK || !serving)
                gone = s;
        }
        if (gone < 0)
            break;
        struct timespec ts = {0, 250000000L};
        nanosleep(&ts, NULL);
    }
    if (gone < 0) {
        (void)ferry_errorf(st, "%s", why);
        return 0;
    }
    t->el_lost = 1; /* no re-admission can help: the run stops */
    (void)ferry_errorf(FERRY_ERR_UNAVAILABLE,
                       "%s; ferry-ps %s has not answered (or not served) for a second: the job's "
                       "state there is lost with it, and an elastic job does not outlive a "
                       "server's state (it keeps no checkpoints)",
                       why, ferry_cluster_target(t->cluster, gone));
    return 1;
}

int ferry__trainer_elastic_retry(const trainer *t, ferry_status st) {
    return t->cfg->elastic_max > 0 && !t->el_async &&
           (st == FERRY_ERR_ABORTED || st == FERRY_ERR_UNAVAILABLE);
}

ferry_status ferry__trainer_elastic_redo(trainer *t, int first_window) {
    char why[512];
    (void)snprintf(why, sizeof why, "%s", ferry_error_last());
    double t0 = ferry_now();
    ferry_job_membership m;
    int wait_ms = (int)(t->cfg->sync_timeout_s * 1000.0);
    ferry_status st = ferry_job_redo(t->job, (uint64_t)t->step + 1, wait_ms, &m);
    if (st != FERRY_OK)
        return ferry_errorf(st, "step %lld: %s (and no redo: %s)", (long long)t->step + 1, why,
                            ferry_error_last());
    FERRY_LOG_WARN("elastic: step %lld is redone under epoch %llu (%.2f s): %s",
                   (long long)t->step + 1, (unsigned long long)m.epoch, ferry_now() - t0, why);
    st = follow_servers(t);
    if (st == FERRY_OK)
        st = apply(t, &m, first_window);
    pthread_mutex_lock(&t->live_mu);
    t->live.el_redos++;
    pthread_mutex_unlock(&t->live_mu);
    if (st == FERRY_OK && t->metrics != NULL) {
        const char *keys[] = {"step", "epoch", "seconds"};
        double vals[] = {(double)t->step + 1, (double)m.epoch, ferry_now() - t0};
        st = ferry_metrics_write_kv(t->metrics, "redo", 3, keys, vals);
    }
    ferry_job_membership_free(&m);
    return st;
}

ferry_status ferry__trainer_elastic_sync(trainer *t, int next_first_window) {
    /* The coordinator's Step reply names the next step's epoch: the same one, and this
     * rank keeps its columns, with no call. */
    double epoch = 0.0;
    if (ferry_dist_ctx_metric(t->dc, "elastic/epoch", &epoch) == FERRY_OK &&
        (uint64_t)epoch == t->el_epoch)
        return FERRY_OK;
    ferry_job_membership m;
    ferry_status st = ferry_job_sync_membership(t->job, (uint64_t)t->step, &m);
    if (st == FERRY_OK && (m.index >= 0 || !ferry_trainer_stop_requested()))
        st = follow_servers(t); /* (a rank that left does not follow) */
    if (st != FERRY_OK) {
        ferry_job_membership_free(&m);
        return st;
    }
    if (m.index < 0 && ferry_trainer_stop_requested()) {
        FERRY_LOG_INFO("elastic: left the membership after step %lld (epoch %llu goes on without "
                       "this rank)",
                       (long long)t->step, (unsigned long long)m.epoch);
        t->el_left = 1;
    } else {
        st = apply(t, &m, next_first_window);
    }
    ferry_job_membership_free(&m);
    return st;
}
