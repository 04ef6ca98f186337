/* job.c - the client side of a training job (the Job method): join on every server
 * (the servers hold the membership and compare what each rank says about the model),
 * rank 0's "ready", the other ranks' wait for it, Leave, and the job's checkpoints. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/dist/dist.h"
#include "ferry.pb-c.h"
#include "common/core/log.h"

ferry_status ferry_sync_parse(const char *text, ferry_sync_mode *mode, int *staleness) {
    *staleness = 0;
    if (strcmp(text, "bsp") == 0) {
        *mode = FERRY_SYNC_BSP;
    } else if (strcmp(text, "async") == 0) {
        *mode = FERRY_SYNC_ASYNC;
    } else if (strncmp(text, "ssp:", 4) == 0) {
        char *end;
        long k = strtol(text + 4, &end, 10);
        if (end == text + 4 || *end != '\0' || k < 0 || k > 1000000)
            return ferry_errorf(FERRY_ERR_INVALID,
                                "--sync %s: ssp needs a staleness bound K in [0, 1e6] (ssp:K)",
                                text);
        *mode = FERRY_SYNC_SSP;
        *staleness = (int)k;
    } else {
        return ferry_errorf(FERRY_ERR_INVALID, "--sync '%s': expected bsp, ssp:K or async", text);
    }
    return FERRY_OK;
}

/* A Job request under construction: the member description (the model signature split
 * into keys) and the action's message, all pointing into this struct. */
typedef struct job_msg {
    Ferry__V1__JobRequest q;
    Ferry__V1__JobMember member;
    Ferry__V1__ModelKey keys[64], *kp[64];
    char model[sizeof((ferry_job *)0)->model];
    Ferry__V1__JobJoin join;
    Ferry__V1__JobReady ready;
    Ferry__V1__JobLeave leave;
    Ferry__V1__JobProbe probe;
    Ferry__V1__JobRecover recover;
    Ferry__V1__JobCheckpoint checkpoint;
    Ferry__V1__JobStatus status;
    Ferry__V1__JobFetch fetch;
    Ferry__V1__JobInstall install;
    Ferry__V1__JobElastic elastic;
} job_msg;

/* The member description of this rank: world, rank, sync mode, and the model as
 * keys ("k=v k=v" split at spaces). */
static void job_member(ferry_job *job, job_msg *m) {
    ferry__v1__job_member__init(&m->member);
    m->member.world = (uint32_t)job->cfg.world;
    m->member.rank = (uint32_t)job->cfg.rank;
    m->member.sync = job->cfg.sync == FERRY_SYNC_SSP     ? FERRY__V1__SYNC_MODE__SSP
                     : job->cfg.sync == FERRY_SYNC_ASYNC ? FERRY__V1__SYNC_MODE__ASYNC
                                                         : FERRY__V1__SYNC_MODE__BSP;
    m->member.staleness = (uint32_t)job->cfg.staleness;
    m->member.sync_timeout_ms = (uint32_t)job->cfg.sync_timeout_ms;
    m->member.elastic_min = (uint32_t)(job->cfg.elastic_min > 0 ? job->cfg.elastic_min : 0);
    memcpy(m->model, job->model, sizeof m->model);
    size_t n = 0;
    char *save = NULL;
    for (char *kv = strtok_r(m->model, " ", &save); kv != NULL && n < 64;
         kv = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(kv, '=');
        ferry__v1__model_key__init(&m->keys[n]);
        if (eq != NULL)
            *eq = '\0';
        m->keys[n].key = kv;
        m->keys[n].value = eq != NULL ? eq + 1 : (char *)"";
        m->kp[n] = &m->keys[n];
        n++;
    }
    m->member.n_model = n;
    m->member.model = m->kp;
}

/* The request of `action` (a FERRY__V1__JOB_REQUEST__ACTION_* value) for this rank. */
static void job_request(ferry_job *job, int action, job_msg *m) {
    ferry__v1__job_request__init(&m->q);
    m->q.job = job->name;
    m->q.action_case = (Ferry__V1__JobRequest__ActionCase)action;
    switch (action) {
    case FERRY__V1__JOB_REQUEST__ACTION_JOIN:
        ferry__v1__job_join__init(&m->join);
        job_member(job, m);
        m->join.member = &m->member;
        m->q.join = &m->join;
        break;
    case FERRY__V1__JOB_REQUEST__ACTION_READY:
        ferry__v1__job_ready__init(&m->ready);
        m->ready.rank = (uint32_t)job->cfg.rank;
        m->q.ready = &m->ready;
        break;
    case FERRY__V1__JOB_REQUEST__ACTION_LEAVE:
        ferry__v1__job_leave__init(&m->leave);
        m->leave.rank = (uint32_t)job->cfg.rank;
        m->q.leave = &m->leave;
        break;
    case FERRY__V1__JOB_REQUEST__ACTION_PROBE:
        ferry__v1__job_probe__init(&m->probe);
        m->q.probe = &m->probe;
        break;
    case FERRY__V1__JOB_REQUEST__ACTION_RECOVER:
        ferry__v1__job_recover__init(&m->recover);
        job_member(job, m);
        m->recover.member = &m->member;
        m->recover.last_step = job->last_step;
        m->q.recover = &m->recover;
        break;
    case FERRY__V1__JOB_REQUEST__ACTION_CHECKPOINT:
        ferry__v1__job_checkpoint__init(&m->checkpoint);
        m->checkpoint.rank = (uint32_t)job->cfg.rank;
        m->q.checkpoint = &m->checkpoint;
        break;
    case FERRY__V1__JOB_REQUEST__ACTION_FETCH:
        ferry__v1__job_fetch__init(&m->fetch);
        m->fetch.rank = (uint32_t)job->cfg.rank;
        m->q.fetch = &m->fetch;
        break;
    case FERRY__V1__JOB_REQUEST__ACTION_INSTALL:
        ferry__v1__job_install__init(&m->install);
        m->install.rank = (uint32_t)job->cfg.rank;
        m->q.install = &m->install;
        break;
    case FERRY__V1__JOB_REQUEST__ACTION_ELASTIC:
        ferry__v1__job_elastic__init(&m->elastic);
        m->elastic.rank = (uint32_t)job->cfg.rank;
        m->elastic.epoch = job->el_epoch;
        m->elastic.batch = (uint32_t)job->el_batch;
        m->elastic.rank_columns = (uint32_t)job->el_rank_cols;
        m->q.elastic = &m->elastic;
        break;
    default:
        ferry__v1__job_status__init(&m->status);
        m->q.status = &m->status;
        break;
    }
}

/* Job actions that may be sent again after a failure in transit (a stalled server, a
 * lost reply): a status query reads, and a repeated ready or leave changes nothing.
 * A join, a recover or an elastic call is answered once; their callers decide. */
static int job_retry_safe(int action) {
    return action == FERRY__V1__JOB_REQUEST__ACTION_STATUS ||
           action == FERRY__V1__JOB_REQUEST__ACTION_READY ||
           action == FERRY__V1__JOB_REQUEST__ACTION_LEAVE;
}

/* q on every server of the job's cluster, concurrently; replies[c->n] are
 * initialised here and deinitialised by the caller. An action safe to repeat goes again
 * after a failure in transit within the cluster's retry window, and within window_ms
 * of it when that is > 0. */
static ferry_status job_all_within(ferry_job *job, const Ferry__V1__JobRequest *q, int deadline_ms,
                                   int window_ms, ferry_rpc_msg *replies) {
    ferry_cluster *c = job->c;
    int servers[FERRY_DIST_MAX_SERVERS];
    ferry_rpc_msg req;
    ferry_rpc_msg_init(&req);
    for (int i = 0; i < c->n; i++) {
        servers[i] = i;
        ferry_rpc_msg_init(&replies[i]);
    }
    ferry_status st = ferry_rpc_msg_set_head(&req, &q->base);
    if (st == FERRY_OK && job_retry_safe(q->action_case))
        st = ferry__dist_fanout_retry_deadline(c, FERRY_RPC_JOB, c->n, servers, &req, 1, replies,
                                               deadline_ms, window_ms);
    else if (st == FERRY_OK)
        st = ferry__dist_fanout_deadline(c, FERRY_RPC_JOB, c->n, servers, &req, 1, replies,
                                         deadline_ms);
    ferry_rpc_msg_deinit(&req);
    return st;
}

static ferry_status job_all(ferry_job *job, const Ferry__V1__JobRequest *q, int deadline_ms,
                            ferry_rpc_msg *replies) {
    return job_all_within(job, q, deadline_ms, 0, replies);
}

static void replies_deinit(ferry_rpc_msg *replies, int n) {
    for (int i = 0; i < n; i++)
        ferry_rpc_msg_deinit(&replies[i]);
}

/* `action` on every server (each call, and what is sent again, within limit_ms when
 * that is > 0); reply fields of the servers combined: ready when every server says
 * so, min_step the smallest. */
static ferry_status job_call_within(ferry_job *job, int action, int limit_ms, int *ready,
                                    uint64_t *min_step) {
    ferry_cluster *c = job->c;
    job_msg *m = calloc(1, sizeof *m);
    if (m == NULL)
        return FERRY_NOMEM();
    job_request(job, action, m);
    ferry_rpc_msg replies[FERRY_DIST_MAX_SERVERS];
    int deadline_ms = c->cfg.deadline_ms;
    if (limit_ms > 0 && (deadline_ms <= 0 || limit_ms < deadline_ms))
        deadline_ms = limit_ms;
    ferry_status st = job_all_within(job, &m->q, deadline_ms, limit_ms, replies);
    free(m);
    int all_ready = 1;
    uint64_t min = UINT64_MAX;
    for (int i = 0; st == FERRY_OK && i < c->n; i++) {
        const Ferry__V1__JobReply *r = replies[i].head;
        all_ready &= r->ready != 0;
        min = r->min_step < min ? r->min_step : min;
    }
    replies_deinit(replies, c->n);
    if (st == FERRY_OK && ready != NULL)
        *ready = all_ready;
    if (st == FERRY_OK && min_step != NULL)
        *min_step = min;
    return st;
}

static ferry_status job_call(ferry_job *job, int action, int *ready, uint64_t *min_step) {
    return job_call_within(job, action, 0, ready, min_step);
}

ferry_status ferry_job_create(ferry_cluster *c, const ferry_job_config *cfg, ferry_job **out) {
    if (cfg->name == NULL || cfg->name[0] == '\0' || strlen(cfg->name) >= FERRY_RPC_NAME_MAX)
        return ferry_errorf(FERRY_ERR_INVALID, "job name must have 1..%d bytes",
                            FERRY_RPC_NAME_MAX - 1);
    if (cfg->world < 1 || cfg->world > 65536 || cfg->rank < 0 || cfg->rank >= cfg->world)
        return ferry_errorf(FERRY_ERR_INVALID, "rank %d outside [0, %d) (--rank, --world)",
                            cfg->rank, cfg->world);
    if ((int)cfg->sync < 0 || cfg->sync > FERRY_SYNC_ASYNC || cfg->staleness < 0 ||
        cfg->sync_timeout_ms < 0)
        return ferry_errorf(FERRY_ERR_INVALID, "job '%s': bad sync mode, staleness or timeout",
                            cfg->name);
    if (cfg->model != NULL && strlen(cfg->model) >= sizeof((ferry_job *)0)->model)
        return ferry_errorf(FERRY_ERR_INVALID, "job '%s': model description over %zu bytes",
                            cfg->name, sizeof((ferry_job *)0)->model - 1);
    ferry_job *job = calloc(1, sizeof *job);
    if (job == NULL)
        return FERRY_NOMEM();
    job->c = c;
    job->cfg = *cfg;
    (void)snprintf(job->name, sizeof job->name, "%s", cfg->name);
    (void)snprintf(job->model, sizeof job->model, "%s", cfg->model != NULL ? cfg->model : "");
    job->cfg.name = job->name;
    job->cfg.model = job->model;
    if (cfg->sync == FERRY_SYNC_BSP && c->cfg.replication == FERRY_REPLICATION_PRIMARY_BACKUP)
        ferry__dist_set_passive(c, 1);
    *out = job;
    return FERRY_OK;
}

ferry_status ferry_job_join(ferry_cluster *c, const ferry_job_config *cfg, ferry_job **out) {
    ferry_job *job = NULL;
    ferry_status st = ferry_job_create(c, cfg, &job);
    if (st == FERRY_OK &&
        (st = job_call(job, FERRY__V1__JOB_REQUEST__ACTION_JOIN, NULL, NULL)) != FERRY_OK) {
        free(job);
        job = NULL;
    }
    *out = job;
    return st;
}

ferry_status ferry_job_probe(ferry_job *job, int server, ferry_job_probe_result *out) {
    ferry_cluster *c = job->c;
    memset(out, 0, sizeof *out);
    if (server < 0 || server >= c->n)
        return ferry_errorf(FERRY_ERR_INVALID, "probe: server %d of %d", server, c->n);
    job_msg *m = calloc(1, sizeof *m);
    if (m == NULL)
        return FERRY_NOMEM();
    job_request(job, FERRY__V1__JOB_REQUEST__ACTION_PROBE, m);
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    ferry_status st = ferry_rpc_msg_set_head(&req, &m->q.base);
    free(m);
    if (st == FERRY_OK)
        st = ferry__dist_fanout(c, FERRY_RPC_JOB, 1, &server, &req, 1, &reply);
    if (st == FERRY_OK) {
        const Ferry__V1__JobReply *r = reply.head;
        out->n = r->n_checkpoints;
        out->steps = malloc((out->n ? out->n : 1) * sizeof *out->steps);
        if (out->steps == NULL)
            st = FERRY_NOMEM();
        else if (out->n > 0) /* an empty repeated field is a NULL array */
            memcpy(out->steps, r->checkpoints, out->n * sizeof *out->steps);
        out->has_state = r->has_state;
        out->state_step = r->state_step;
        out->rolling_back = r->rolling_back;
        out->finished = r->finished;
        out->completed_step = r->completed_step;
        out->can_checkpoint = r->can_checkpoint;
    }
    ferry_rpc_msg_deinit(&reply);
    ferry_rpc_msg_deinit(&req);
    return st;
}

void ferry_job_probe_free(ferry_job_probe_result *p) {
    free(p->steps);
    p->steps = NULL;
    p->n = 0;
}

ferry_status ferry_job_recover(ferry_job *job, const uint64_t *offer, size_t n, int deadline_ms,
                               uint64_t *resume_step) {
    ferry_cluster *c = job->c;
    job_msg *m = calloc(1, sizeof *m);
    if (m == NULL)
        return FERRY_NOMEM();
    job_request(job, FERRY__V1__JOB_REQUEST__ACTION_RECOVER, m);
    m->recover.checkpoints = (uint64_t *)(uintptr_t)offer;
    m->recover.n_checkpoints = n;
    ferry_rpc_msg replies[FERRY_DIST_MAX_SERVERS];
    ferry_status st = job_all(job, &m->q, deadline_ms, replies);
    free(m);
    uint64_t step = 0;
    for (int i = 0; st == FERRY_OK && i < c->n; i++) {
        const Ferry__V1__JobReply *r = replies[i].head;
        if (i > 0 && r->resume_step != step)
            st = ferry_errorf(FERRY_ERR_EXISTS,
                              "job '%s': the servers rolled back to different steps (%llu on "
                              "server 0, %llu on %s): their checkpoint directories differ",
                              job->name, (unsigned long long)step,
                              (unsigned long long)r->resume_step,
                              ferry_rpc_client_target(c->clients[i]));
        step = r->resume_step;
    }
    replies_deinit(replies, c->n);
    if (st == FERRY_OK)
        *resume_step = step;
    return st;
}

ferry_status ferry_job_ready(ferry_job *job) {
    return job_call(job, FERRY__V1__JOB_REQUEST__ACTION_READY, NULL, NULL);
}

ferry_status ferry_job_wait_ready(ferry_job *job) {
    double limit = (job->cfg.sync_timeout_ms > 0 ? job->cfg.sync_timeout_ms : 60000) / 1000.0;
    double t0 = ferry_now();
    for (int polls = 0;; polls++) {
        /* Each poll, and what a retry window sends again, ends within the limit: a
         * stalled server makes the wait time out on time, not a retry window later. */
        int ready = 0;
        double left_ms = (limit - (ferry_now() - t0)) * 1000.0;
        ferry_status st = job_call_within(job, FERRY__V1__JOB_REQUEST__ACTION_STATUS,
                                          left_ms > 100.0 ? (int)left_ms : 100, &ready, NULL);
        if (st == FERRY_OK && ready)
            return FERRY_OK;
        /* A server's answer (even an error) is final, and so is a failure in transit
         * without a retry window; with one (the caller asked that calls lost in
         * transit go again), the query is polled again until the limit. */
        int transit = (st == FERRY_ERR_UNAVAILABLE || st == FERRY_ERR_TIMEOUT) &&
                      atomic_load(&job->c->retry_ms) > 0;
        if (st != FERRY_OK && !transit)
            return st;
        if (ferry_now() - t0 > limit) {
            if (st == FERRY_OK)
                return ferry_errorf(FERRY_ERR_TIMEOUT,
                                    "job '%s': rank 0 did not say ready within %.1f s "
                                    "(--sync-timeout): is rank 0 running against the same "
                                    "servers?",
                                    job->name, limit);
            char last[256];
            (void)snprintf(last, sizeof last, "%s", ferry_error_last());
            return ferry_errorf(FERRY_ERR_TIMEOUT,
                                "job '%s': no answer to say rank 0 is ready within %.1f s "
                                "(--sync-timeout); the last query: %s",
                                job->name, limit, last);
        }
        struct timespec ts = {0, polls < 20 ? 20000000L : 100000000L};
        nanosleep(&ts, NULL);
    }
}

ferry_status ferry_job_leave(ferry_job *job) {
    return ferry_job_leave_after(job, 0, NULL);
}

ferry_status ferry_job_leave_after(ferry_job *job, uint64_t step, const char *reason) {
    ferry_cluster *c = job->c;
    job_msg *m = calloc(1, sizeof *m);
    if (m == NULL)
        return FERRY_NOMEM();
    char why[256];
    (void)snprintf(why, sizeof why, "%s", reason != NULL ? reason : "");
    job_request(job, FERRY__V1__JOB_REQUEST__ACTION_LEAVE, m);
    m->leave.step = step;
    m->leave.reason = why;
    ferry_rpc_msg replies[FERRY_DIST_MAX_SERVERS];
    ferry_status st = job_all(job, &m->q, c->cfg.deadline_ms, replies);
    free(m);
    replies_deinit(replies, c->n);
    return st;
}

void ferry_job_set_last_step(ferry_job *job, uint64_t step) {
    job->last_step = step;
}

ferry_status ferry_job_rejoin(ferry_job *job) {
    return job_call(job, FERRY__V1__JOB_REQUEST__ACTION_JOIN, NULL, NULL);
}

ferry_status ferry_job_min_step(ferry_job *job, uint64_t *min_step) {
    return job_call(job, FERRY__V1__JOB_REQUEST__ACTION_STATUS, NULL, min_step);
}

ferry_status ferry_job_checkpoint(ferry_job *job, uint64_t step) {
    ferry_cluster *c = job->c;
    job_msg *m = calloc(1, sizeof *m);
    if (m == NULL)
        return FERRY_NOMEM();
    job_request(job, FERRY__V1__JOB_REQUEST__ACTION_CHECKPOINT, m);
    m->checkpoint.step = step;
    int P = c->n * c->R;
    ferry_rpc_msg *reqs = calloc((size_t)P, sizeof *reqs);
    ferry_rpc_msg replies[FERRY_DIST_MAX_SERVERS];
    int servers[FERRY_DIST_MAX_SERVERS];
    ferry_status st = reqs != NULL ? FERRY_OK : FERRY_NOMEM();
    for (int i = 0; i < c->n; i++) {
        servers[i] = i;
        ferry_rpc_msg_init(&replies[i]);
    }
    for (int p = 0; reqs != NULL && p < P; p++) {
        ferry_rpc_msg_init(&reqs[p]);
        /* Each server's own incarnation: a server restarted since the step refuses. */
        m->checkpoint.incarnation = c->incarnation[p];
        if (st == FERRY_OK)
            st = ferry_rpc_msg_set_head(&reqs[p], &m->q.base);
    }
    free(m);
    /* Sent again after a stall or a lost reply: the server answers a repeat of the file
     * it wrote last with that file. */
    if (st == FERRY_OK)
        st = ferry__dist_fanout_retry(c, FERRY_RPC_JOB, c->n, servers, reqs,
                                      FERRY__DIST_PER_REPLICA, replies);
    for (int i = 0; i < c->n; i++)
        ferry_rpc_msg_deinit(&replies[i]);
    for (int p = 0; reqs != NULL && p < P; p++)
        ferry_rpc_msg_deinit(&reqs[p]);
    free(reqs);
    return st;
}

/* ---- re-admitting a dropped replica (--replicas) ---- */

ferry_status ferry_job_offer_readmit(ferry_job *job, int probe_ms, uint64_t *mask) {
    ferry_cluster *c = job->c;
    uint64_t offer = 0;
    for (int p = 0; c->R > 1 && p < c->n * c->R && p < 64; p++) {
        if (ferry__dist_replica_live(c, p))
            continue;
        /* A frozen replica costs this rank probe_ms here, once per checkpoint. */
        if (ferry__dist_replica_hello(c, p, probe_ms) == FERRY_OK)
            offer |= 1ull << p;
    }
    if (offer != 0)
        atomic_store(&job->readmit_request, offer);
    if (mask != NULL)
        *mask = offer;
    return FERRY_OK;
}

/* One Job request to replica p alone; *reply initialised here. */
static ferry_status replica_job(ferry_job *job, int p, const job_msg *m, int deadline_ms,
                                ferry_rpc_msg *reply) {
    ferry_rpc_msg req;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(reply);
    ferry_status st = ferry_rpc_msg_set_head(&req, &m->q.base);
    if (st == FERRY_OK)
        st = ferry__dist_replica_call(job->c, p, FERRY_RPC_JOB, &req, reply, deadline_ms);
    ferry_rpc_msg_deinit(&req);
    return st;
}

/* Rank 0: the shard's checkpoint of `step`, from its primary to replica p. */
static ferry_status readmit_copy(ferry_job *job, int p, uint64_t step, uint64_t *bytes) {
    ferry_cluster *c = job->c;
    int src = ferry__dist_replica_primary(c, p / c->R);
    job_msg *m = calloc(1, sizeof *m);
    if (m == NULL)
        return FERRY_NOMEM();
    ferry_rpc_msg data, ack;
    job_request(job, FERRY__V1__JOB_REQUEST__ACTION_FETCH, m);
    m->fetch.step = step;
    ferry_status st = replica_job(job, src, m, c->cfg.deadline_ms, &data);
    ferry_rpc_msg_init(&ack);
    if (st == FERRY_OK) {
        const Ferry__V1__JobReply *r = data.head;
        job_request(job, FERRY__V1__JOB_REQUEST__ACTION_INSTALL, m);
        m->install.step = step;
        m->install.data = r->checkpoint_data;
        *bytes = r->checkpoint_data.len;
        ferry_rpc_msg_deinit(&ack);
        st = replica_job(job, p, m, c->cfg.deadline_ms, &ack);
        if (st == FERRY_OK)
            FERRY_LOG_INFO("job '%s': checkpoint of step %llu copied from %s to %s (%.2f MB)",
                           job->name, (unsigned long long)step,
                           ferry_rpc_client_target(c->all[src]), ferry_rpc_client_target(c->all[p]),
                           (double)*bytes / 1e6);
    }
    ferry_rpc_msg_deinit(&data);
    ferry_rpc_msg_deinit(&ack);
    free(m);
    return st;
}

ferry_status ferry_job_readmit(ferry_job *job, uint64_t mask, uint64_t step, int *readmitted,
                               uint64_t *bytes) {
    ferry_cluster *c = job->c;
    int back = 0;
    uint64_t moved = 0;
    /* Rank 0's copy takes at most two deadlines (fetch, install) before it joins the
     * barrier; a rank that gives up on it sooner than the sync timeout is at the next
     * step's barrier in time for the others. */
    int wait_ms = 3 * c->cfg.deadline_ms + 1000;
    for (int p = 0; p < c->n * c->R && p < 64; p++) {
        if (!(mask >> p & 1))
            continue;
        /* Every rank the offer reached takes part, so no barrier waits for one that
         * stayed away: a replica this rank still calls is dropped first (in bsp it is
         * not: rank 0 dropped it, so its barrier stopped), and a failure here offers
         * nothing rather than skipping the barrier. */
        if (ferry__dist_replica_live(c, p))
            ferry__dist_replica_drop(c, p, "re-admitted from a copy, as rank 0 offered");
        const char *target = ferry_rpc_client_target(c->all[p]);
        double t0 = ferry_now();
        uint64_t n = 0;
        ferry_status st = ferry__dist_replica_hello(c, p, c->cfg.deadline_ms);
        if (st == FERRY_OK && job->cfg.rank == 0)
            st = readmit_copy(job, p, step, &n);
        char why[512] = "";
        if (st != FERRY_OK)
            (void)snprintf(why, sizeof why, "%s", ferry_error_last());
        /* The recover barrier there: every rank takes its rank on the replica, and it
         * restores the checkpoint rank 0 copied. A rank offers nothing when its part
         * failed (rank 0: the copy), so the others' wait ends with that refusal. */
        job_msg *m = calloc(1, sizeof *m);
        ferry_rpc_msg reply;
        ferry_rpc_msg_init(&reply);
        ferry_status rs = m != NULL ? FERRY_OK : FERRY_NOMEM();
        if (m != NULL) {
            job_request(job, FERRY__V1__JOB_REQUEST__ACTION_RECOVER, m);
            m->recover.checkpoints = &step;
            m->recover.n_checkpoints = st == FERRY_OK ? 1 : 0;
            rs = replica_job(job, p, m, wait_ms, &reply);
            const Ferry__V1__JobReply *r = reply.head;
            if (rs == FERRY_OK && r->resume_step != step)
                rs = ferry_errorf(FERRY_ERR_EXISTS, "%s restored step %llu, not %llu", target,
                                  (unsigned long long)r->resume_step, (unsigned long long)step);
            if (rs != FERRY_OK && why[0] == '\0')
                (void)snprintf(why, sizeof why, "%s", ferry_error_last());
        }
        ferry_rpc_msg_deinit(&reply);
        free(m);
        if (st == FERRY_OK && rs == FERRY_OK) {
            ferry__dist_replica_readmit(c, p);
            back++;
            moved += n;
            FERRY_LOG_INFO("replica %s of shard %d re-admitted after step %llu: %s%.2f s; it is "
                           "called from the next step on",
                           target, p / c->R, (unsigned long long)step,
                           job->cfg.rank == 0 ? "checkpoint copied, " : "", ferry_now() - t0);
        } else {
            FERRY_LOG_WARN("replica %s of shard %d stays out after step %llu: %s", target, p / c->R,
                           (unsigned long long)step, why);
        }
    }
    if (readmitted != NULL)
        *readmitted = back;
    if (bytes != NULL)
        *bytes = moved;
    return FERRY_OK;
}

const ferry_job_config *ferry_job_get_config(const ferry_job *job) {
    return &job->cfg;
}

void ferry_job_destroy(ferry_job *job) {
    if (job != NULL) {
        free(job->el_members);
        free(job->srv_list);
    }
    free(job);
}

/* ---- elastic jobs ---- */

/* The coordinator: the first server of the cluster. */
#define EL_COORDINATOR 0

/* q on server `server` alone; reply initialised here, deinitialised by the caller. */
static ferry_status job_one(ferry_job *job, int server, const Ferry__V1__JobRequest *q,
                            int deadline_ms, ferry_rpc_msg *reply) {
    ferry_rpc_msg req;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(reply);
    ferry_status st = ferry_rpc_msg_set_head(&req, &q->base);
    if (st == FERRY_OK)
        st = ferry__dist_fanout_deadline(job->c, FERRY_RPC_JOB, 1, &server, &req, 1, reply,
                                         deadline_ms);
    ferry_rpc_msg_deinit(&req);
    return st;
}

ferry_status ferry_job_join_elastic(ferry_cluster *c, const ferry_job_config *cfg, int batch,
                                    ferry_job **out) {
    *out = NULL;
    if (cfg->elastic_min < 1 || cfg->elastic_min > cfg->world)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "elastic job '%s': 1 <= MIN (%d) <= MAX (%d) (--elastic "
                            "MIN:MAX)",
                            cfg->name != NULL ? cfg->name : "", cfg->elastic_min, cfg->world);
    if (batch < cfg->world || batch > (1 << 20))
        return ferry_errorf(FERRY_ERR_INVALID,
                            "elastic job '%s': a global batch of %d columns cannot be split over "
                            "up to %d members (--batch-size at least MAX)",
                            cfg->name, batch, cfg->world);
    ferry_job_config jc = *cfg;
    jc.rank = 0;
    ferry_job *job = NULL;
    ferry_status st = ferry_job_create(c, &jc, &job);
    if (st != FERRY_OK)
        return st;
    job->el_batch = batch;
    job_msg *m = calloc(1, sizeof *m);
    if (m == NULL) {
        ferry_job_destroy(job);
        return FERRY_NOMEM();
    }
    /* Rank 0 makes the job's modules: it is taken only while the job is not ready. */
    ferry_rpc_msg reply;
    job_request(job, FERRY__V1__JOB_REQUEST__ACTION_STATUS, m);
    int ready = 0;
    st = job_one(job, EL_COORDINATOR, &m->q, c->cfg.deadline_ms, &reply);
    if (st == FERRY_OK) {
        const Ferry__V1__JobReply *r = reply.head;
        ready = r->ready && !r->finished;
        if (!r->finished && r->elastic_min == 0)
            st = ferry_errorf(FERRY_ERR_EXISTS,
                              "job '%s' is not elastic (world %u); this trainer says --elastic "
                              "%d:%d",
                              cfg->name, r->world, cfg->elastic_min, cfg->world);
        else if (!r->finished && (r->elastic_min != (uint32_t)cfg->elastic_min ||
                                  r->world != (uint32_t)cfg->world))
            st = ferry_errorf(FERRY_ERR_EXISTS,
                              "job '%s' is elastic with %u..%u members; this trainer says "
                              "--elastic %d:%d",
                              cfg->name, r->elastic_min, r->world, cfg->elastic_min, cfg->world);
    } else if (st == FERRY_ERR_NOT_FOUND) {
        st = FERRY_OK; /* a new job */
    }
    ferry_rpc_msg_deinit(&reply);
    int rank = 0, search = st == FERRY_OK;
    /* The lowest rank free: another rank's join is refused as held by a live session,
     * or as a member whose trainer is gone (the job drops it first); any other refusal
     * (another model) ends the search. */
    for (st = search ? FERRY_ERR_EXISTS : st; search && rank < cfg->world && st == FERRY_ERR_EXISTS;
         rank++) {
        job->cfg.rank = rank;
        job_request(job, FERRY__V1__JOB_REQUEST__ACTION_JOIN, m);
        st = job_one(job, EL_COORDINATOR, &m->q, c->cfg.deadline_ms, &reply);
        ferry_rpc_msg_deinit(&reply);
        if (st == FERRY_ERR_EXISTS && strstr(ferry_error_last(), "live session") == NULL &&
            strstr(ferry_error_last(), "trainer is gone") == NULL)
            break;
    }
    free(m);
    if (st == FERRY_ERR_EXISTS && rank == cfg->world)
        st = ferry_errorf(FERRY_ERR_EXISTS,
                          "elastic job '%s': all %d ranks are held (--elastic "
                          "MIN:MAX)",
                          jc.name, cfg->world);
    job->el_creator = st == FERRY_OK && job->cfg.rank == 0 && !ready;
    /* The same rank everywhere (the coordinator answers its holder's join again). */
    if (st == FERRY_OK)
        st = job_call(job, FERRY__V1__JOB_REQUEST__ACTION_JOIN, NULL, NULL);
    if (st != FERRY_OK) {
        ferry_job_destroy(job);
        return st;
    }
    *out = job;
    return FERRY_OK;
}

void ferry_job_membership_free(ferry_job_membership *m) {
    if (m == NULL)
        return;
    free(m->members);
    free(m->state);
    free(m->progress);
    memset(m, 0, sizeof *m);
}

/* The coordinator's JobReply r into *m, and with `own` into the job's own membership
 * (what its GradNorms and Steps carry). */
static ferry_status membership_read(ferry_job *job, const Ferry__V1__JobReply *r,
                                    ferry_job_membership *m, int own) {
    memset(m, 0, sizeof *m);
    m->epoch = r->epoch;
    m->first_step = r->epoch_step;
    m->index = -1;
    m->n = r->n_members;
    if ((m->members = malloc((r->n_members + 1) * sizeof *m->members)) == NULL)
        return FERRY_NOMEM();
    for (size_t i = 0; i < r->n_members; i++) {
        m->members[i] = r->members[i];
        if (r->members[i] == (uint32_t)job->cfg.rank)
            m->index = (int)i;
    }
    if (m->index >= 0 && job->el_rank_cols > 0) { /* per rank: its own columns */
        m->col0 = job->cfg.rank * job->el_rank_cols;
        m->col1 = m->col0 + job->el_rank_cols;
    } else if (m->index >= 0) {
        int64_t B = job->el_batch, n = (int64_t)m->n;
        m->col0 = (int)(m->index * B / n);
        m->col1 = (int)((m->index + 1) * B / n);
    }
    if (r->n_columns > 0) {
        size_t len = r->columns[0].len;
        if (m->index < 0 || r->col0 != (uint32_t)m->col0 ||
            r->n_columns != (size_t)(m->col1 - m->col0))
            return ferry_errorf(FERRY_ERR_FORMAT,
                                "elastic job '%s': the coordinator sent columns [%u, %zu) for "
                                "columns [%d, %d)",
                                job->name, r->col0, r->col0 + r->n_columns, m->col0, m->col1);
        if ((m->state = malloc(len * r->n_columns)) == NULL)
            return FERRY_NOMEM();
        for (size_t i = 0; i < r->n_columns; i++) {
            if (r->columns[i].len != len)
                return ferry_errorf(FERRY_ERR_FORMAT,
                                    "elastic job '%s': columns of unequal sizes", job->name);
            memcpy(m->state + i * len, r->columns[i].data, len);
        }
        m->col_bytes = len;
    }
    if (r->progress.len > 0) {
        if ((m->progress = malloc(r->progress.len)) == NULL)
            return FERRY_NOMEM();
        memcpy(m->progress, r->progress.data, r->progress.len);
        m->progress_len = r->progress.len;
    }
    size_t len = 1;
    for (size_t i = 0; i < r->n_servers; i++)
        len += strlen(r->servers[i]) + 1;
    char *list = malloc(len);
    if (list == NULL)
        return FERRY_NOMEM();
    size_t k = 0;
    list[0] = '\0';
    for (size_t i = 0; i < r->n_servers; i++)
        k += (size_t)snprintf(list + k, len - k, "%s%s", i ? "," : "", r->servers[i]);
    free(job->srv_list);
    job->srv_list = list;
    job->srv_epoch = r->servers_epoch;
    job->srv_moving = r->moving;
    job->srv_step = r->move_step;
    if (!own)
        return FERRY_OK;
    uint32_t *copy = malloc((m->n + 1) * sizeof *copy);
    if (copy == NULL)
        return FERRY_NOMEM();
    memcpy(copy, m->members, m->n * sizeof *copy);
    free(job->el_members);
    job->el_members = copy;
    job->el_n = m->n;
    job->el_epoch = m->epoch;
    job->el_col0 = m->col0;
    job->el_col1 = m->col1;
    return FERRY_OK;
}

/* One JobElastic call of `op` on the coordinator (op < 0: a status), *m from its
 * answer. */
static ferry_status elastic_call(ferry_job *job, int op, uint64_t step, int deadline_ms,
                                 ferry_job_membership *m) {
    memset(m, 0, sizeof *m);
    job_msg *q = calloc(1, sizeof *q);
    if (q == NULL)
        return FERRY_NOMEM();
    job_request(job,
                op < 0 ? FERRY__V1__JOB_REQUEST__ACTION_STATUS
                       : FERRY__V1__JOB_REQUEST__ACTION_ELASTIC,
                q);
    q->elastic.op = op < 0 ? 0 : (Ferry__V1__JobElastic__Op)op;
    q->elastic.step = step;
    ferry_rpc_msg reply;
    ferry_status st = job_one(job, EL_COORDINATOR, &q->q, deadline_ms, &reply);
    free(q);
    if (st == FERRY_OK) {
        st = membership_read(job, reply.head, m, op >= 0);
        if (st != FERRY_OK)
            ferry_job_membership_free(m);
    }
    ferry_rpc_msg_deinit(&reply);
    return st;
}

ferry_status ferry_job_set_rank_columns(ferry_job *job, int columns) {
    if (job->cfg.elastic_min < 1 || columns < 0 ||
        (columns > 0 && (int64_t)columns * job->cfg.world != job->el_batch))
        return ferry_errorf(FERRY_ERR_INVALID,
                            "job '%s': %d columns per rank do not tile its global batch of %d "
                            "over %d ranks (an elastic job)",
                            job->name, columns, job->el_batch, job->cfg.world);
    job->el_rank_cols = columns;
    return FERRY_OK;
}

int ferry_job_servers(const ferry_job *job, uint64_t *epoch, uint64_t *step, const char **list) {
    if (epoch != NULL)
        *epoch = job->srv_epoch;
    if (step != NULL)
        *step = job->srv_step;
    if (list != NULL)
        *list = job->srv_list != NULL ? job->srv_list : "";
    return job->srv_moving;
}

int ferry_job_makes_modules(const ferry_job *job) {
    return job->cfg.elastic_min > 0 ? job->el_creator : job->cfg.rank == 0;
}

ferry_status ferry_job_members(ferry_job *job, ferry_job_membership *m) {
    return elastic_call(job, -1, 0, job->c->cfg.deadline_ms, m);
}

static int job_wait_ms(const ferry_job *job) {
    return job->cfg.sync_timeout_ms > 0 ? job->cfg.sync_timeout_ms : 60000;
}

/* Waits until every server applied step `step` (at most the sync timeout). */
static ferry_status wait_applied(ferry_job *job, uint64_t step) {
    ferry_cluster *c = job->c;
    job_msg *m = calloc(1, sizeof *m);
    if (m == NULL)
        return FERRY_NOMEM();
    job_request(job, FERRY__V1__JOB_REQUEST__ACTION_STATUS, m);
    double t0 = ferry_now();
    ferry_status st = FERRY_OK;
    for (int polls = 0;; polls++) {
        ferry_rpc_msg replies[FERRY_DIST_MAX_SERVERS];
        uint64_t least = UINT64_MAX;
        st = job_all(job, &m->q, c->cfg.deadline_ms, replies);
        for (int i = 0; st == FERRY_OK && i < c->n; i++) {
            uint64_t a = ((const Ferry__V1__JobReply *)replies[i].head)->applied;
            least = a < least ? a : least;
        }
        replies_deinit(replies, c->n);
        if (st != FERRY_OK || least >= step)
            break;
        if ((ferry_now() - t0) * 1000.0 > job_wait_ms(job)) {
            st = ferry_errorf(FERRY_ERR_TIMEOUT,
                              "elastic job '%s': admitted after step %llu, but a server has "
                              "applied only step %llu after %d ms",
                              job->name, (unsigned long long)step, (unsigned long long)least,
                              job_wait_ms(job));
            break;
        }
        struct timespec ts = {0, polls < 50 ? 1000000L : 20000000L};
        nanosleep(&ts, NULL);
    }
    free(m);
    return st;
}

/* ssp, async: START on every server but the coordinator, before the ADMIT there. */
static ferry_status elastic_start(ferry_job *job) {
    job_msg *q = calloc(1, sizeof *q);
    if (q == NULL)
        return FERRY_NOMEM();
    job_request(job, FERRY__V1__JOB_REQUEST__ACTION_ELASTIC, q);
    q->elastic.op = FERRY__V1__JOB_ELASTIC__OP__START;
    ferry_status st = FERRY_OK;
    for (int i = 0; i < job->c->n && st == FERRY_OK; i++) {
        ferry_rpc_msg reply;
        if (i != EL_COORDINATOR) {
            st = job_one(job, i, &q->q, job->c->cfg.deadline_ms, &reply);
            ferry_rpc_msg_deinit(&reply);
        }
    }
    free(q);
    return st;
}

ferry_status ferry_job_admit(ferry_job *job, ferry_job_membership *m) {
    if (job->cfg.elastic_min < 1)
        return ferry_errorf(FERRY_ERR_INVALID, "job '%s' is not elastic", job->name);
    if (job->cfg.sync != FERRY_SYNC_BSP) {
        ferry_status st = elastic_start(job);
        if (st != FERRY_OK) {
            memset(m, 0, sizeof *m);
            return ferry_errorf(st, "elastic job '%s': starting rank %d on the servers: %s",
                                job->name, job->cfg.rank, ferry_error_last());
        }
    }
    ferry_status st = elastic_call(job, FERRY__V1__JOB_ELASTIC__OP__ADMIT, 0,
                                   job_wait_ms(job) + job->c->cfg.deadline_ms, m);
    /* Admitted at the boundary after step first_step - 1: the coordinator applied it,
     * the other servers may still be applying it (the members' Steps are in flight),
     * and this rank's first pull must see it everywhere. */
    if (st == FERRY_OK && m->first_step > 1 && job->cfg.sync == FERRY_SYNC_BSP &&
        (st = wait_applied(job, m->first_step - 1)) != FERRY_OK)
        ferry_job_membership_free(m);
    return st;
}

ferry_status ferry_job_sync_membership(ferry_job *job, uint64_t step, ferry_job_membership *m) {
    return elastic_call(job, FERRY__V1__JOB_ELASTIC__OP__SYNC, step, job->c->cfg.deadline_ms, m);
}

ferry_status ferry_job_redo(ferry_job *job, uint64_t step, int wait_ms, ferry_job_membership *m) {
    uint64_t epoch = job->el_epoch;
    double t0 = ferry_now();
    for (int polls = 0;; polls++) {
        ferry_status st = elastic_call(job, FERRY__V1__JOB_ELASTIC__OP__REDO, step,
                                       job->c->cfg.deadline_ms, m);
        if (st != FERRY_OK || m->epoch != epoch)
            return st;
        ferry_job_membership_free(m);
        if ((ferry_now() - t0) * 1000.0 > wait_ms)
            return ferry_errorf(FERRY_ERR_TIMEOUT,
                                "elastic job '%s': step %llu failed, and no member is gone at "
                                "the coordinator after %d ms",
                                job->name, (unsigned long long)step, wait_ms);
        struct timespec ts = {0, polls < 10 ? 10000000L : 50000000L};
        nanosleep(&ts, NULL);
    }
}

ferry_status ferry_job_put_state(ferry_job *job, uint64_t step, const void *state,
                                 size_t col_bytes, const void *progress, size_t progress_len,
                                 int leaving) {
    size_t n = state != NULL ? (size_t)(job->el_col1 - job->el_col0) : 0;
    job_msg *q = calloc(1, sizeof *q);
    ProtobufCBinaryData *cols = calloc(n + 1, sizeof *cols);
    if (q == NULL || cols == NULL) {
        free(q);
        free(cols);
        return FERRY_NOMEM();
    }
    for (size_t i = 0; i < n; i++) {
        cols[i].data = (uint8_t *)(uintptr_t)state + i * col_bytes;
        cols[i].len = col_bytes;
    }
    job_request(job, FERRY__V1__JOB_REQUEST__ACTION_ELASTIC, q);
    q->elastic.op = FERRY__V1__JOB_ELASTIC__OP__PUT;
    q->elastic.step = step;
    q->elastic.col0 = (uint32_t)job->el_col0;
    q->elastic.columns = cols;
    q->elastic.n_columns = n;
    q->elastic.progress.data = (uint8_t *)(uintptr_t)progress;
    q->elastic.progress.len = progress != NULL ? progress_len : 0;
    q->elastic.leaving = leaving != 0;
    ferry_rpc_msg reply;
    ferry_status st = job_one(job, EL_COORDINATOR, &q->q, job->c->cfg.deadline_ms, &reply);
    ferry_rpc_msg_deinit(&reply);
    free(q);
    free(cols);
    return st;
}
