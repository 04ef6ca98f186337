/* job.c - the client side of a training job: Join on every server (the servers hold
 * the membership and compare what each rank says about the model), rank 0's
 * "ready", the other ranks' wait for it, and Leave. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/dist/dist.h"
#include "ferry.pb-c.h"
#include "common/core/log.h"

static const char *const sync_names[] = {"bsp", "ssp", "async"};

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

static void join_request(ferry_job *job, const char *action, Ferry__V1__JoinRequest *q) {
    ferry__v1__join_request__init(q);
    q->job = job->name;
    q->world = (uint32_t)job->cfg.world;
    q->rank = (uint32_t)job->cfg.rank;
    q->sync = (char *)(uintptr_t)sync_names[job->cfg.sync];
    q->staleness = (uint32_t)job->cfg.staleness;
    q->sync_timeout_ms = (uint32_t)job->cfg.sync_timeout_ms;
    q->model = job->model;
    q->client_id = job->c->client_id;
    q->action = (char *)(uintptr_t)action;
}

/* q on every server of the job's cluster, concurrently; replies[c->n] are
 * initialised here and deinitialised by the caller. */
static ferry_status join_all(ferry_job *job, const Ferry__V1__JoinRequest *q, int deadline_ms,
                             ferry_rpc_msg *replies) {
    ferry_cluster *c = job->c;
    int servers[FERRY_DIST_MAX_SERVERS];
    ferry_rpc_msg req;
    ferry_rpc_msg_init(&req);
    for (int i = 0; i < c->n; i++) {
        servers[i] = i;
        ferry_rpc_msg_init(&replies[i]);
    }
    ferry_status st = ferry_rpc_msg_set_head(&req, &q->base);
    if (st == FERRY_OK)
        st = ferry__dist_fanout_deadline(c, FERRY_RPC_JOIN, c->n, servers, &req, 1, replies,
                                         deadline_ms);
    ferry_rpc_msg_deinit(&req);
    return st;
}

static void replies_deinit(ferry_rpc_msg *replies, int n) {
    for (int i = 0; i < n; i++)
        ferry_rpc_msg_deinit(&replies[i]);
}

/* Join with `action` on every server; reply fields of the servers combined: ready
 * when every server says so, min_step the smallest. */
static ferry_status job_call(ferry_job *job, const char *action, int *ready, uint64_t *min_step) {
    ferry_cluster *c = job->c;
    Ferry__V1__JoinRequest q;
    join_request(job, action, &q);
    ferry_rpc_msg replies[FERRY_DIST_MAX_SERVERS];
    ferry_status st = join_all(job, &q, c->cfg.deadline_ms, replies);
    int all_ready = 1;
    uint64_t min = UINT64_MAX;
    for (int i = 0; st == FERRY_OK && i < c->n; i++) {
        const Ferry__V1__JoinReply *r = replies[i].head;
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
        return FERRY_ERR_NOMEM;
    job->c = c;
    job->cfg = *cfg;
    (void)snprintf(job->name, sizeof job->name, "%s", cfg->name);
    (void)snprintf(job->model, sizeof job->model, "%s", cfg->model != NULL ? cfg->model : "");
    job->cfg.name = job->name;
    job->cfg.model = job->model;
    *out = job;
    return FERRY_OK;
}

ferry_status ferry_job_join(ferry_cluster *c, const ferry_job_config *cfg, ferry_job **out) {
    ferry_job *job = NULL;
    ferry_status st = ferry_job_create(c, cfg, &job);
    if (st == FERRY_OK && (st = job_call(job, "join", NULL, NULL)) != FERRY_OK) {
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
    Ferry__V1__JoinRequest q;
    join_request(job, "probe", &q);
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    ferry_status st = ferry_rpc_msg_set_head(&req, &q.base);
    if (st == FERRY_OK)
        st = ferry__dist_fanout(c, FERRY_RPC_JOIN, 1, &server, &req, 1, &reply);
    if (st == FERRY_OK) {
        const Ferry__V1__JoinReply *r = reply.head;
        out->n = r->n_checkpoints;
        out->steps = malloc((out->n ? out->n : 1) * sizeof *out->steps);
        if (out->steps == NULL)
            st = FERRY_ERR_NOMEM;
        else if (out->n > 0) /* an empty repeated field is a NULL array */
            memcpy(out->steps, r->checkpoints, out->n * sizeof *out->steps);
        out->has_state = r->has_state;
        out->state_step = r->state_step;
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
    Ferry__V1__JoinRequest q;
    join_request(job, "recover", &q);
    q.checkpoints = (uint64_t *)(uintptr_t)offer;
    q.n_checkpoints = n;
    ferry_rpc_msg replies[FERRY_DIST_MAX_SERVERS];
    ferry_status st = join_all(job, &q, deadline_ms, replies);
    uint64_t step = 0;
    for (int i = 0; st == FERRY_OK && i < c->n; i++) {
        const Ferry__V1__JoinReply *r = replies[i].head;
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
    return job_call(job, "ready", NULL, NULL);
}

ferry_status ferry_job_wait_ready(ferry_job *job) {
    double limit = (job->cfg.sync_timeout_ms > 0 ? job->cfg.sync_timeout_ms : 60000) / 1000.0;
    double t0 = ferry_now();
    for (int polls = 0;; polls++) {
        int ready = 0;
        ferry_status st = job_call(job, "join", &ready, NULL);
        if (st != FERRY_OK || ready)
            return st;
        if (ferry_now() - t0 > limit)
            return ferry_errorf(FERRY_ERR_TIMEOUT,
                                "job '%s': rank 0 did not say ready within %.1f s "
                                "(--sync-timeout): is rank 0 running against the same servers?",
                                job->name, limit);
        struct timespec ts = {0, polls < 20 ? 20000000L : 100000000L};
        nanosleep(&ts, NULL);
    }
}

ferry_status ferry_job_leave(ferry_job *job) {
    return job_call(job, "leave", NULL, NULL);
}

ferry_status ferry_job_min_step(ferry_job *job, uint64_t *min_step) {
    return job_call(job, "join", NULL, min_step);
}

const ferry_job_config *ferry_job_get_config(const ferry_job *job) {
    return &job->cfg;
}

void ferry_job_destroy(ferry_job *job) {
    free(job);
}
