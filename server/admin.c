/* admin.c - the calls that concern the whole server rather than one context: Hello,
 * CreateModule, Stats, Checkpoint and Shutdown. Like every handler they work on the
 * server's state (ferry__ps_state) and nothing else; Shutdown asks the server to stop
 * through the state's stop callback. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/core/log.h"
#include "ferry/version.h"
#include "ferry/backend.h"
#include "server/ps-impl.h"

/* The bound port, 0 without the network. */
static int state_port(ferry__ps_state *s) {
    ferry_rpc_server *rpc = atomic_load(&s->rpc);
    return rpc != NULL ? ferry_rpc_server_port(rpc) : 0;
}

/* The id is completed once the port is known, possibly after the first call. */
static void server_id_copy(ferry__ps_state *s, char *out) {
    pthread_mutex_lock(&s->id_mu);
    memcpy(out, s->server_id, sizeof s->server_id);
    pthread_mutex_unlock(&s->id_mu);
}

ferry_status ferry__ps_on_hello(ferry__ps_state *s, ferry__ps_session *none,
                                const Ferry__V1__HelloRequest *q, ferry_rpc_msg *req,
                                ferry_rpc_msg *reply) {
    (void)req; /* the header says it all */
    (void)none; /* Hello runs before any session: it opens one */
    if (q->contract_major != 0 && q->contract_major != FERRY_CONTRACT_MAJOR)
        return ferry_errorf(FERRY_ERR_UNSUPPORTED,
                            "Hello: this ferry-ps speaks contract %d.%d (ferry.v1); the client "
                            "speaks contract %u: use a client of contract %d",
                            FERRY_CONTRACT_MAJOR, FERRY_CONTRACT_MINOR, q->contract_major,
                            FERRY_CONTRACT_MAJOR);
    const ferry_rpc_caller_info *who = ferry_rpc_caller(reply);
    ferry__ps_session *sess = NULL;
    ferry_status st;
    if (who == NULL)
        sess = &s->sessions.local;
    else if ((st = ferry__ps_session_open(&s->sessions, who, &sess)) != FERRY_OK)
        return st;
    FERRY_LOG_DEBUG("hello from %s as '%s' (worker %u, version %s): session #%llu",
                    q->label[0] ? q->label : "?", sess->identity, q->worker_id, q->version,
                    (unsigned long long)sess->serial);
    int n;
    ferry__ps_module **mods = ferry__ps_registry_list(&s->reg, &n);
    char **names = malloc((size_t)(n > 0 ? n : 1) * sizeof *names);
    if (names == NULL) {
        ferry__ps_registry_list_free(mods, n);
        ferry__ps_session_leave(&s->sessions, sess);
        return FERRY_NOMEM();
    }
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        if (ferry__ps_may_use(sess, mods[i]->owner))
            names[k++] = mods[i]->name;
    }
    char id[sizeof s->server_id];
    server_id_copy(s, id);
    Ferry__V1__HelloReply r;
    ferry__v1__hello_reply__init(&r);
    r.server_id = id;
    r.incarnation = s->incarnation;
    r.version = (char *)FERRY_VERSION;
    r.n_modules = k;
    r.modules = names;
    r.max_message_bytes = s->max_message_bytes;
    r.session = sess->id;
    r.identity = sess->identity;
    r.role = (char *)(uintptr_t)ferry_rpc_role_name(sess->role);
    r.contract_major = FERRY_CONTRACT_MAJOR;
    r.contract_minor = FERRY_CONTRACT_MINOR;
    r.session_ttl_ms = (uint32_t)(s->sessions.ttl_s * 1000.0);
    st = ferry_rpc_msg_set_head(reply, &r.base);
    free(names);
    ferry__ps_registry_list_free(mods, n);
    ferry__ps_session_leave(&s->sessions, sess);
    return st;
}

ferry_status ferry__ps_on_create_module(ferry__ps_state *s, ferry__ps_session *sess,
                                        const Ferry__V1__CreateModuleRequest *q, ferry_rpc_msg *req,
                                        ferry_rpc_msg *reply) {
    ferry__ps_module *m;
    int created = 0;
    ferry_status st = ferry__ps_registry_create(&s->reg, sess->identity, sess->quota, q->name,
                                                q->config, req, &created, &m);
    if (st != FERRY_OK)
        return st;
    Ferry__V1__CreateModuleReply r;
    ferry__v1__create_module_reply__init(&r);
    r.created = created;
    pthread_rwlock_rdlock(&m->lock);
    r.version = m->version;
    pthread_rwlock_unlock(&m->lock);
    for (int p = 0; p < m->P.count; p++)
        r.num_params += (uint64_t)m->P.items[p].numel;
    ferry__ps_module_put(m);
    return ferry_rpc_msg_set_head(reply, &r.base);
}

#define STATS_MAX 512

typedef struct stats_builder {
    Ferry__V1__Metric items[STATS_MAX];
    Ferry__V1__Metric *ptrs[STATS_MAX];
    char names[STATS_MAX][FERRY_RPC_NAME_MAX + 32];
    size_t n;
    const char *prefix;
} stats_builder;

static void stat_add(stats_builder *b, const char *name, double value) {
    if (b->n == STATS_MAX || strncmp(name, b->prefix, strlen(b->prefix)) != 0)
        return;
    (void)snprintf(b->names[b->n], sizeof b->names[b->n], "%s", name);
    ferry__v1__metric__init(&b->items[b->n]);
    b->items[b->n].name = b->names[b->n];
    b->items[b->n].value = value;
    b->ptrs[b->n] = &b->items[b->n];
    b->n++;
}

static void stat_add_fn(void *user, const char *name, double value) {
    stat_add(user, name, value);
}

ferry_status ferry__ps_on_stats(ferry__ps_state *s, ferry__ps_session *sess,
                                const Ferry__V1__StatsRequest *q, ferry_rpc_msg *req,
                                ferry_rpc_msg *reply) {
    (void)req; /* the header says it all */
    stats_builder *b = calloc(1, sizeof *b);
    if (b == NULL)
        return FERRY_NOMEM();
    b->prefix = q->prefix;
    ferry_rpc_server_stats rs;
    memset(&rs, 0, sizeof rs);
    ferry_rpc_server *rpc = atomic_load(&s->rpc);
    if (rpc != NULL)
        ferry_rpc_server_get_stats(rpc, &rs);
    int64_t bytes = 0;
    int64_t live = ferry__ps_ctx_live(&s->ctxs, &bytes);
    int nmods = ferry__ps_registry_count(&s->reg);
    stat_add(b, "contexts_live", (double)live);
    stat_add(b, "context_bytes", (double)bytes);
    stat_add(b, "contexts_created", (double)atomic_load(&s->ctxs.created));
    stat_add(b, "contexts_stepped", (double)atomic_load(&s->ctxs.stepped));
    stat_add(b, "contexts_released", (double)atomic_load(&s->ctxs.released));
    stat_add(b, "contexts_swept", (double)atomic_load(&s->ctxs.swept));
    stat_add(b, "backward_early_replies", (double)atomic_load(&s->ctxs.early));
    stat_add(b, "backward_overlapped", (double)atomic_load(&s->ctxs.overlapped));
    stat_add(b, "modules", (double)nmods);
    pthread_mutex_lock(&s->reg.mu);
    stat_add(b, "module_bytes", (double)s->reg.bytes);
    pthread_mutex_unlock(&s->reg.mu);
    stat_add(b, "budget_module_bytes", (double)s->lim.module_bytes);
    stat_add(b, "budget_model_bytes", (double)s->lim.model_bytes);
    stat_add(b, "budget_context_bytes", (double)s->lim.context_bytes);
    stat_add(b, "budget_contexts_bytes", (double)s->lim.contexts_bytes);
    stat_add(b, "budget_contexts", (double)s->lim.contexts);
    stat_add(b, "rss_bytes", (double)ferry__ps_rss_bytes());
    stat_add(b, "heap_in_use_bytes", (double)ferry__ps_heap_bytes());
    stat_add(b, "memory_trims", (double)atomic_load(&s->memory_trims));
    stat_add(b, "wide_calls", (double)atomic_load(&s->wide_calls));
    stat_add(b, "gemm_splits", (double)ferry_cpu_gemm_splits());
    stat_add(b, "blas_threads", (double)ferry_cpu_threads());
    stat_add(b, "calls", (double)rs.calls);
    stat_add(b, "errors", (double)rs.errors);
    stat_add(b, "in_flight", (double)rs.in_flight);
    stat_add(b, "bytes_in", (double)rs.bytes_in);
    stat_add(b, "bytes_out", (double)rs.bytes_out);
    stat_add(b, "uptime_s", ferry_now() - s->t_start);
    int64_t slive, sopened, sexpired, sleases;
    ferry__ps_sessions_counts(&s->sessions, &slive, &sopened, &sexpired, &sleases);
    stat_add(b, "sessions_live", (double)slive);
    stat_add(b, "sessions_opened", (double)sopened);
    stat_add(b, "sessions_expired", (double)sexpired);
    stat_add(b, "session_streams", (double)sleases);
    ferry_rpc_queue_stats qs;
    memset(&qs, 0, sizeof qs);
    if (rpc != NULL)
        ferry_rpc_server_queue_stats(rpc, &qs);
    stat_add(b, "queue_waiting", (double)qs.queued);
    stat_add(b, "queue_running", (double)qs.running);
    stat_add(b, "queue_refused", (double)qs.refused);
    stat_add(b, "queue_wait_max_s", qs.wait_max_s);
    ferry_rpc_pending_stats ps_;
    memset(&ps_, 0, sizeof ps_);
    if (rpc != NULL)
        ferry_rpc_server_pending_stats(rpc, &ps_);
    pthread_mutex_lock(&s->manifest.mu);
    stat_add(b, "probe_files_verified", (double)s->manifest.verified);
    stat_add(b, "probe_files_from_manifest", (double)s->manifest.reused);
    stat_add(b, "probe_bytes_read", (double)s->manifest.bytes_read);
    pthread_mutex_unlock(&s->manifest.mu);
    stat_add(b, "unread_reply_bytes", (double)ps_.bytes);
    stat_add(b, "unread_reply_bytes_worst_connection", (double)ps_.worst_connection_bytes);
    stat_add(b, "budget_unread_reply_bytes", (double)ps_.max_bytes);
    stat_add(b, "replies_refused_unread", (double)ps_.refused);
    stat_add(b, "replies_cancelled_unread", (double)ps_.cancelled);
    stat_add(b, "budget_contexts_per_identity", (double)s->lim.id_contexts);
    stat_add(b, "budget_contexts_bytes_per_identity", (double)s->lim.id_contexts_bytes);
    stat_add(b, "budget_modules_per_identity", (double)s->lim.id_modules);
    stat_add(b, "budget_model_bytes_per_identity", (double)s->lim.id_model_bytes);
    stat_add(b, "budget_jobs", (double)s->lim.jobs);
    stat_add(b, "budget_jobs_per_identity", (double)s->lim.id_jobs);
    /* Each identity's account (a trainer sees its own). */
    pthread_mutex_lock(&s->quotas.mu);
    for (int i = 0; i < s->quotas.n; i++) {
        const ferry__ps_quota *qa = s->quotas.q[i];
        if (sess->role == FERRY_RPC_ROLE_TRAINER && !sess->authority &&
            strcmp(qa->identity, sess->identity) != 0)
            continue;
        char name[FERRY_RPC_IDENTITY_MAX + 40];
        const atomic_llong *v[] = {&qa->contexts, &qa->context_bytes, &qa->modules,
                                   &qa->model_bytes, &qa->jobs};
        static const char *const what[] = {"contexts", "context_bytes", "modules", "model_bytes",
                                           "jobs"};
        for (int w = 0; w < 5; w++) {
            (void)snprintf(name, sizeof name, "identity/%s/%s", qa->identity, what[w]);
            stat_add(b, name, (double)atomic_load(v[w]));
        }
    }
    pthread_mutex_unlock(&s->quotas.mu);
    /* A trainer sees its own identity's modules and jobs; readers and admins all. */
    const char *only =
        sess->authority || sess->role != FERRY_RPC_ROLE_TRAINER ? NULL : sess->identity;
    int n;
    ferry__ps_module **mods = ferry__ps_registry_list(&s->reg, &n);
    for (int i = 0; i < n && b->n < sizeof b->items / sizeof b->items[0]; i++) {
        if (only != NULL && strcmp(mods[i]->owner, only) != 0)
            continue;
        char name[FERRY_RPC_NAME_MAX + 16];
        double penalty = 0.0, feasibility = 0.0;
        pthread_rwlock_rdlock(&mods[i]->lock);
        uint64_t version = mods[i]->version;
        /* A constrained module's penalty and ||W^T W - I||_F at its current weight. */
        ferry_status pst = ferry__ps_constraint_metrics(mods[i], &penalty, &feasibility);
        pthread_rwlock_unlock(&mods[i]->lock);
        (void)snprintf(name, sizeof name, "version/%s", mods[i]->name);
        stat_add(b, name, (double)version);
        if (ferry__ps_constrained(mods[i]) && pst == FERRY_OK) {
            (void)snprintf(name, sizeof name, "penalty/%s", mods[i]->name);
            stat_add(b, name, penalty);
            (void)snprintf(name, sizeof name, "feasibility/%s", mods[i]->name);
            stat_add(b, name, feasibility);
        }
    }
    ferry__ps_registry_list_free(mods, n);
    ferry__ps_jobs_metrics(&s->jobs, only, stat_add_fn, b);
    char text[512], id[sizeof s->server_id];
    server_id_copy(s, id);
    (void)snprintf(text, sizeof text,
                   "%s: %d modules, %lld contexts live holding %lld bytes, %llu calls, "
                   "%llu errors, up %.0f s",
                   id, nmods, (long long)live, (long long)bytes, (unsigned long long)rs.calls,
                   (unsigned long long)rs.errors, ferry_now() - s->t_start);
    Ferry__V1__StatsReply r;
    ferry__v1__stats_reply__init(&r);
    r.n_metrics = b->n;
    r.metrics = b->ptrs;
    r.text = text;
    ferry_status st = ferry_rpc_msg_set_head(reply, &r.base);
    free(b);
    return st;
}

/* The file name a Checkpoint writes inside --checkpoint-dir: the requested name, or
 * a default. Names are plain file names ([A-Za-z0-9._-], not starting with '.'), so
 * no request can reach outside the directory. */
static ferry_status checkpoint_name(ferry__ps_state *s, const char *name, uint64_t step, char *out,
                                    size_t cap) {
    if (s->checkpoint_dir[0] == '\0')
        return ferry_errorf(FERRY_ERR_UNSUPPORTED,
                            "this ferry-ps has no --checkpoint-dir: it cannot write checkpoints");
    size_t n = strlen(name);
    int ok = n < 128 && name[0] != '.';
    for (size_t i = 0; ok && i < n; i++) {
        unsigned char ch = (unsigned char)name[i];
        ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
             ch == '.' || ch == '_' || ch == '-';
    }
    if (!ok)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "checkpoint path '%.64s' must be a file name inside --checkpoint-dir "
                            "(up to 127 of [A-Za-z0-9._-], not starting with '.')",
                            name);
    int k = n > 0 ? snprintf(out, cap, "%s", name)
                  : snprintf(out, cap, "ferry-ps-%d-step%llu.ckpt", state_port(s),
                             (unsigned long long)step);
    if (k < 0 || (size_t)k >= cap)
        return ferry_errorf(FERRY_ERR_INVALID, "checkpoint name too long");
    return FERRY_OK;
}

/* A fingerprint of every module's name and version (Step and SetParams bump it):
 * equal fingerprints mean no parameter changed in between. */
static uint64_t modules_fingerprint(ferry__ps_registry *r) {
    int n;
    ferry__ps_module **mods = ferry__ps_registry_list(r, &n);
    uint64_t h = 1469598103934665603ull ^ (uint64_t)n;
    for (int i = 0; i < n; i++) {
        for (const char *p = mods[i]->name; *p != '\0'; p++)
            h = (h ^ (unsigned char)*p) * 1099511628211ull;
        pthread_rwlock_rdlock(&mods[i]->lock);
        uint64_t v = mods[i]->version;
        pthread_rwlock_unlock(&mods[i]->lock);
        h = (h ^ v) * 1099511628211ull;
    }
    ferry__ps_registry_list_free(mods, n);
    return h;
}

/* Writes a checkpoint, one at a time: a second request while one is being written
 * is refused with FERRY_ERR_BUSY rather than queued, except a named one (a job's
 * checkpoint of a step), which waits for it. A named request for the file this
 * process last wrote whole, at the same step, with no module stepped or set since
 * and the file still there, is a retry of that call: it is answered with that file,
 * neither written again nor charged to the rate (it holds what a new write would). */
ferry_status ferry__ps_checkpoint_take_token(ferry__ps_state *s) {
    /* A token bucket: ck_rate per minute, in bursts of as many. */
    double now = ferry_now();
    s->ck_tokens += (now - s->ck_last) * s->ck_rate / 60.0;
    s->ck_tokens = s->ck_tokens > s->ck_rate ? s->ck_rate : s->ck_tokens;
    s->ck_last = now;
    if (s->ck_tokens < 1.0)
        return ferry_errorf(FERRY_ERR_BUSY,
                            "Checkpoint refused: more than %g per minute "
                            "(--checkpoint-rate); try again in %.1f s",
                            s->ck_rate, (1.0 - s->ck_tokens) * 60.0 / s->ck_rate);
    s->ck_tokens -= 1.0;
    return FERRY_OK;
}

ferry_status ferry__ps_checkpoint_named(ferry__ps_state *s, const char *name, const char *owner,
                                        uint64_t step, char *path, size_t cap, uint64_t *bytes) {
    char file[160];
    ferry_status st = checkpoint_name(s, name, step, file, sizeof file);
    if (st != FERRY_OK)
        return st;
    if (snprintf(path, cap, "%s/%s", s->checkpoint_dir, file) >= (int)cap)
        return ferry_errorf(FERRY_ERR_INVALID, "checkpoint path too long");
    int named = name[0] != '\0';
    if (named)
        pthread_mutex_lock(&s->checkpoint_mu);
    else if (pthread_mutex_trylock(&s->checkpoint_mu) != 0)
        return ferry_errorf(FERRY_ERR_BUSY, "a checkpoint is being written; try again when it "
                                            "is done");
    struct stat sb;
    uint64_t fp = named ? modules_fingerprint(&s->reg) : 0;
    if (named && step == s->ck_done_step && strcmp(file, s->ck_done) == 0 && fp == s->ck_done_fp &&
        stat(path, &sb) == 0 && (uint64_t)sb.st_size == s->ck_done_bytes) {
        *bytes = s->ck_done_bytes;
        pthread_mutex_unlock(&s->checkpoint_mu);
        FERRY_LOG_INFO("Checkpoint %s (step %llu) asked again: already written", file,
                       (unsigned long long)step);
        return FERRY_OK;
    }
    if ((st = ferry__ps_checkpoint_take_token(s)) != FERRY_OK) {
        pthread_mutex_unlock(&s->checkpoint_mu);
        return st;
    }
    st = ferry__ps_checkpoint_write(&s->reg, s->checkpoint_dir, file, owner, step,
                                    s->checkpoint_keep, bytes);
    s->ck_done[0] = '\0';
    if (st == FERRY_OK && named) {
        (void)snprintf(s->ck_done, sizeof s->ck_done, "%s", file);
        s->ck_done_step = step;
        s->ck_done_bytes = *bytes;
        s->ck_done_fp = fp; /* the versions it was written at (read before it) */
    }
    pthread_mutex_unlock(&s->checkpoint_mu);
    return st;
}

ferry_status ferry__ps_on_checkpoint(ferry__ps_state *s, ferry__ps_session *sess,
                                     const Ferry__V1__CheckpointRequest *q, ferry_rpc_msg *req,
                                     ferry_rpc_msg *reply) {
    (void)req; /* the header says it all */
    (void)sess; /* role admin: the RPC layer checked it */
    char path[1280];
    uint64_t bytes = 0;
    ferry_status st =
        ferry__ps_checkpoint_named(s, q->path, NULL, q->step, path, sizeof path, &bytes);
    if (st != FERRY_OK)
        return st;
    Ferry__V1__CheckpointReply r;
    ferry__v1__checkpoint_reply__init(&r);
    r.path = path;
    r.bytes = bytes;
    return ferry_rpc_msg_set_head(reply, &r.base);
}

ferry_status ferry__ps_on_shutdown(ferry__ps_state *s, ferry__ps_session *sess,
                                   const Ferry__V1__ShutdownRequest *q, ferry_rpc_msg *req,
                                   ferry_rpc_msg *reply) {
    (void)req; /* the header says it all */
    (void)sess; /* role admin: the RPC layer checked it */
    if (q->checkpoint) {
        char path[1280];
        uint64_t bytes;
        ferry_status st = ferry__ps_checkpoint_named(s, "", NULL, 0, path, sizeof path, &bytes);
        if (st != FERRY_OK) {
            char why[256]; /* copied: ferry_errorf writes where ferry_error_last points */
            (void)snprintf(why, sizeof why, "%s", ferry_error_last());
            return ferry_errorf(st, "Shutdown refused: %s", why);
        }
    }
    FERRY_LOG_INFO("Shutdown requested (%s), grace %u ms",
                   q->reason[0] ? q->reason : "no reason given", q->grace_ms);
    Ferry__V1__ShutdownReply r;
    ferry__v1__shutdown_reply__init(&r);
    ferry_status st = ferry_rpc_msg_set_head(reply, &r.base);
    /* At least 250 ms, so that this call's own reply still goes out before the
     * server cancels what is in flight. */
    uint32_t grace = q->grace_ms < 250 ? 250 : q->grace_ms > 600000 ? 600000 : q->grace_ms;
    if (st == FERRY_OK)
        s->stop(s->stop_user, (int)grace);
    return st;
}

/* ---- module lifecycle: ListModules, DeleteModule ---- */

ferry_status ferry__ps_on_list_modules(ferry__ps_state *s, ferry__ps_session *sess,
                                       const Ferry__V1__ListModulesRequest *q, ferry_rpc_msg *req,
                                       ferry_rpc_msg *reply) {
    (void)req; /* the header says it all */
    int n;
    ferry__ps_module **mods = ferry__ps_registry_list(&s->reg, &n);
    Ferry__V1__ModuleInfo *info = calloc((size_t)n + 1, sizeof *info);
    Ferry__V1__ModuleInfo **ptrs = calloc((size_t)n + 1, sizeof *ptrs);
    Ferry__V1__ModuleConfig **cfgs = calloc((size_t)n + 1, sizeof *cfgs);
    ferry_status st = info != NULL && ptrs != NULL && cfgs != NULL ? FERRY_OK : FERRY_NOMEM();
    size_t k = 0, plen = strlen(q->prefix);
    for (int i = 0; st == FERRY_OK && i < n; i++) {
        ferry__ps_module *m = mods[i];
        if (!ferry__ps_may_use(sess, m->owner) || strncmp(m->name, q->prefix, plen) != 0 ||
            (q->owner[0] != '\0' && (!sess->authority || strcmp(m->owner, q->owner) != 0)))
            continue;
        /* The config it was created with: CreateModule with it finds this module. */
        cfgs[k] = ferry__v1__module_config__unpack(NULL, m->config_len, m->config_packed);
        if (cfgs[k] == NULL) {
            st = FERRY_NOMEM();
            break;
        }
        ferry__v1__module_info__init(&info[k]);
        info[k].name = m->name;
        info[k].config = cfgs[k];
        pthread_rwlock_rdlock(&m->lock);
        info[k].version = m->version;
        pthread_rwlock_unlock(&m->lock);
        for (int p = 0; p < m->P.count; p++)
            info[k].num_params += (uint64_t)m->P.items[p].numel;
        info[k].bytes = (uint64_t)m->bytes;
        info[k].owner = sess->authority ? m->owner : (char *)"";
        ptrs[k] = &info[k];
        k++;
    }
    Ferry__V1__ListModulesReply r;
    ferry__v1__list_modules_reply__init(&r);
    r.n_modules = k;
    r.modules = ptrs;
    if (st == FERRY_OK)
        st = ferry_rpc_msg_set_head(reply, &r.base); /* packs a copy while it all lives */
    for (size_t i = 0; cfgs != NULL && i < k; i++)
        ferry__v1__module_config__free_unpacked(cfgs[i], NULL);
    free(cfgs);
    free(ptrs);
    free(info);
    ferry__ps_registry_list_free(mods, n);
    return st;
}

ferry_status ferry__ps_on_delete_module(ferry__ps_state *s, ferry__ps_session *sess,
                                        const Ferry__V1__DeleteModuleRequest *q, ferry_rpc_msg *req,
                                        ferry_rpc_msg *reply) {
    (void)req; /* the header says it all */
    ferry__ps_module *m = ferry__ps_module_find(s, sess, q->name);
    if (m == NULL)
        return FERRY_ERR_NOT_FOUND;
    int64_t bytes = 0;
    ferry_status st = ferry__ps_registry_delete(&s->reg, m, &bytes);
    ferry__ps_module_put(m);
    if (st != FERRY_OK)
        return st;
    pthread_mutex_lock(&s->checkpoint_mu);
    s->ck_done[0] = '\0'; /* the modules changed: no Checkpoint is a repeat now */
    pthread_mutex_unlock(&s->checkpoint_mu);
    Ferry__V1__DeleteModuleReply r;
    ferry__v1__delete_module_reply__init(&r);
    r.bytes = (uint64_t)bytes;
    return ferry_rpc_msg_set_head(reply, &r.base);
}
