/* server.c - the ferry-ps server object: start-up (the state every handler works on,
 * each method's handler registered with the RPC server), shutdown, and a libuv loop
 * that owns the lease-sweep timer, the signals of the daemon and the wake-up that ends
 * the loop once a stop is asked. The handlers (handlers.c, params.c, admin.c) never
 * call back into this file: they receive the state, and Shutdown its stop callback. */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <uv.h>

#include "ferry/version.h"
#include "common/core/flags.h" /* ferry_env_int */
#include "common/core/log.h"
#include "ferry/backend.h"
#include "server/ps-impl.h"

struct ferry_ps_server {
    ferry_ps_config cfg;
    char address[160]; /* "HOST:PORT" as bound */
    ferry_rpc_server *rpc;
    ferry__ps_state ps;       /* what the handlers work on (their user pointer) */
    pthread_mutex_t mu;       /* guards everything below */
    int stopping, loop_state; /* loop_state: 0 never ran, 1 running, 2 done */
    int signals;              /* this run handles SIGINT/SIGTERM */
    uv_loop_t loop;
    uv_async_t wake;
    uv_timer_t sweep;
    double last_trim;  /* the last ferry_rpc_release_idle_memory (on_sweep) */
    double last_busy;  /* the last sweep that saw a context made since the one before */
    long long made;    /* contexts made, as that sweep counted them */
    uv_timer_t holds;  /* held bsp GradNorms past their hold_ms */
    uv_timer_t drain;  /* --drain-ms: NOT_SERVING before the rpc server stops */
    int drain_grace;   /* the grace the stop asked for, used when the drain ends; -1: none */
    uv_signal_t sigint, sigterm;
    pthread_t thread;
    int thread_started;
};

void ferry_ps_config_default(ferry_ps_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->listen = "127.0.0.1:7000";
    cfg->threads = 2;
    cfg->context_ttl_s = 60.0;
    cfg->session_ttl_s = 60.0;
    cfg->shutdown_grace_ms = 5000;
}

ferry__ps_ctx_table *ferry__ps_server_contexts(ferry_ps_server *s) {
    return &s->ps.ctxs;
}

ferry_status ferry__ps_dispatch(ferry_ps_server *s, ferry_rpc_method method, ferry_rpc_msg *req,
                                ferry_rpc_msg *reply) {
    ferry_error_clear();
    return ferry__ps_handlers[method](&s->ps, method, req, reply);
}

/* ---- lifecycle ---- */

static uint64_t random_u64(void) {
    uint64_t x = 0;
    if (getrandom(&x, sizeof x, 0) != (ssize_t)sizeof x)
        x = ((uint64_t)getpid() << 32) ^ (uint64_t)(ferry_now() * 1e9);
    return x != 0 ? x : 1;
}

static ferry_status config_check(const ferry_ps_config *cfg, int network) {
    if (network && (cfg->listen == NULL || cfg->listen[0] == '\0' || strlen(cfg->listen) >= 128))
        return ferry_errorf(FERRY_ERR_INVALID, "ferry-ps needs a listen address (HOST:PORT)");
    if (cfg->threads < 1 || cfg->threads > 64)
        return ferry_errorf(FERRY_ERR_INVALID, "threads %d outside 1..64", cfg->threads);
    if (cfg->blas_threads < 0 || cfg->blas_threads > 64)
        return ferry_errorf(FERRY_ERR_INVALID, "BLAS threads %d outside 1..64",
                            cfg->blas_threads);
    if (!(cfg->context_ttl_s > 0.0) || cfg->context_ttl_s > 1e7)
        return ferry_errorf(FERRY_ERR_INVALID, "context ttl %g s must be in (0, 1e7]",
                            cfg->context_ttl_s);
    if (!(cfg->session_ttl_s > 0.0) || cfg->session_ttl_s > 1e7)
        return ferry_errorf(FERRY_ERR_INVALID, "session ttl %g s must be in (0, 1e7]",
                            cfg->session_ttl_s);
    if (cfg->max_sessions < 0 || cfg->max_sessions_per_identity < 0 || cfg->nidentities < 0 ||
        (cfg->nidentities > 0 && cfg->identities == NULL))
        return ferry_errorf(FERRY_ERR_INVALID, "negative session limits or a bad token table");
    if (cfg->shutdown_grace_ms < 0)
        return ferry_errorf(FERRY_ERR_INVALID, "negative shutdown grace");
    if (cfg->max_contexts < 0 || cfg->checkpoint_keep < 0)
        return ferry_errorf(FERRY_ERR_INVALID, "negative max_contexts or checkpoint_keep");
    if (cfg->checkpoint_dir != NULL && cfg->checkpoint_dir[0] != '\0') {
        if (strlen(cfg->checkpoint_dir) >= 1024)
            return ferry_errorf(FERRY_ERR_INVALID, "checkpoint directory name too long");
        if (access(cfg->checkpoint_dir, W_OK | X_OK) != 0)
            return ferry_errorf(FERRY_ERR_IO, "checkpoint directory %s %s", cfg->checkpoint_dir,
                                errno == ENOENT    ? "does not exist (create it first)"
                                : errno == ENOTDIR ? "is not a directory"
                                                   : "is not writable");
    }
    return FERRY_OK;
}

/* The role each method needs (proto/ferry.proto section 2). */
ferry_rpc_role ferry__ps_method_role(ferry_rpc_method m) {
    switch (m) {
    case FERRY_RPC_HELLO:
    case FERRY_RPC_STATS:
        return FERRY_RPC_ROLE_READER;
    case FERRY_RPC_SET_PARAMS:
    case FERRY_RPC_CHECKPOINT:
    case FERRY_RPC_SHUTDOWN:
        return FERRY_RPC_ROLE_ADMIN;
    default:
        return FERRY_RPC_ROLE_TRAINER;
    }
}

/* Session streams: the RPC layer's lease ops over the session table. */
static ferry_status lease_open(void *user, const ferry_rpc_caller_info *who, void **handle) {
    ferry__ps_state *ps = user;
    ferry__ps_session *s;
    ferry_status st = ferry__ps_session_lease_open(&ps->sessions, who, &s);
    if (st == FERRY_OK)
        *handle = s;
    return st;
}

static void lease_close(void *user, void *handle) {
    ferry__ps_state *ps = user;
    uint64_t gone = ferry__ps_session_lease_close(&ps->sessions, handle);
    if (gone != 0) /* its trainer died: the ranks waiting for its ranks learn it now */
        ferry__ps_jobs_holder_gone(&ps->jobs, gone);
}

void ferry__ps_session_ended(ferry__ps_state *ps, uint64_t serial) {
    int n = ferry__ps_ctx_drop_session(&ps->ctxs, serial);
    ferry__ps_jobs_session_ended(&ps->jobs, serial);
    if (n > 0)
        FERRY_LOG_INFO("session #%llu ended: %d contexts dropped", (unsigned long long)serial, n);
}

/* Ends idle sessions, and drops what they held. */
static void sessions_sweep(ferry__ps_state *ps) {
    uint64_t ended[256];
    int n;
    while ((n = ferry__ps_sessions_sweep(&ps->sessions, ended, 256)) > 0) {
        for (int i = 0; i < n; i++)
            ferry__ps_session_ended(ps, ended[i]);
        if (n < 256)
            break;
    }
}

static void stop_from_shutdown(void *user, int grace_ms) {
    ferry_ps_server_stop(user, grace_ms);
}

/* Everything but the network: registry, contexts, budgets, a restored checkpoint. */
static ferry_status server_new(const ferry_ps_config *cfg, int network, ferry_ps_server **out) {
    ferry_status st = config_check(cfg, network);
    if (st != FERRY_OK)
        return st;
    ferry_ps_server *s = calloc(1, sizeof *s);
    if (s == NULL)
        return FERRY_NOMEM();
    s->drain_grace = -1;
    ferry__ps_state *ps = &s->ps;
    s->cfg = *cfg;
    s->cfg.listen = NULL; /* the caller's strings may go away: copies below */
    s->cfg.checkpoint_dir = NULL;
    s->cfg.server_id = NULL;
    s->cfg.restore = NULL;
    ps->checkpoint_keep = cfg->checkpoint_keep != 0 ? cfg->checkpoint_keep : 4;
    ps->ck_rate = cfg->checkpoint_rate > 0 ? cfg->checkpoint_rate : 60;
    ps->ck_tokens = ps->ck_rate;
    ps->ck_last = ferry_now();
    ps->max_message_bytes =
        cfg->max_message_bytes ? cfg->max_message_bytes : FERRY_RPC_DEFAULT_MAX_MESSAGE_BYTES;
    if (cfg->checkpoint_dir != NULL)
        (void)snprintf(ps->checkpoint_dir, sizeof ps->checkpoint_dir, "%s", cfg->checkpoint_dir);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&ps->id_mu, NULL);
    pthread_mutex_init(&ps->checkpoint_mu, NULL);
    ferry__ps_limits_resolve(cfg, &ps->lim);
    ferry__ps_registry_init(&ps->reg, &ps->lim); /* both point at ps->lim */
    ferry__ps_quotas_init(&ps->quotas);
    ferry__ps_manifest_init(&ps->manifest);
    ferry__ps_jobs_init(&ps->jobs);
    ps->jobs.lim = &ps->lim;
    ps->jobs.ttl_s = cfg->job_ttl_s > 0.0 ? cfg->job_ttl_s : 600.0;
    if ((st = ferry__ps_sessions_init(
             &ps->sessions, cfg->session_ttl_s, cfg->max_sessions > 0 ? cfg->max_sessions : 4096,
             cfg->max_sessions_per_identity > 0 ? cfg->max_sessions_per_identity : 1024,
             &ps->quotas)) != FERRY_OK ||
        (st = ferry__ps_ctx_table_init(&ps->ctxs, cfg->context_ttl_s, &ps->lim)) != FERRY_OK) {
        ferry__ps_sessions_deinit(&ps->sessions);
        ferry__ps_jobs_deinit(&ps->jobs);
        ferry__ps_registry_deinit(&ps->reg);
        ferry__ps_quotas_deinit(&ps->quotas);
        ferry__ps_manifest_deinit(&ps->manifest);
        pthread_mutex_destroy(&ps->checkpoint_mu);
        pthread_mutex_destroy(&ps->id_mu);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return st;
    }
    ps->incarnation = random_u64();
    ps->t_start = ferry_now();
    ps->stop = stop_from_shutdown;
    ps->stop_user = s;
    (void)snprintf(ps->server_id, sizeof ps->server_id, "%s", cfg->server_id ? cfg->server_id : "");
    /* --restore FILE, else the newest complete checkpoint of --checkpoint-dir: a
     * restart (by hand, by compose's restart policy, by systemd) needs no flag. */
    char newest[1200];
    const char *restore = cfg->restore;
    int found = 0;
    if (ps->checkpoint_dir[0] != '\0') /* what an earlier run was writing when it died */
        (void)ferry__ps_checkpoint_sweep_temps(ps->checkpoint_dir, NULL);
    (void)ferry__ps_checkpoint_sweep_moves(ps->checkpoint_dir, 3600.0); /* and moving */
    if (restore == NULL && ps->checkpoint_dir[0] != '\0' &&
        (st = ferry__ps_checkpoint_newest(ps->checkpoint_dir, newest, sizeof newest, &found)) !=
            FERRY_OK) {
        ferry_ps_server_destroy(s);
        return st;
    }
    if (found) {
        restore = newest;
        FERRY_LOG_INFO("restoring the newest complete checkpoint of %s: %s",
                       ps->checkpoint_dir, newest);
    }
    if (restore != NULL && (st = ferry__ps_checkpoint_read(&ps->reg, &ps->quotas, restore, NULL,
                                                           &ps->restored_step)) != FERRY_OK) {
        ferry_ps_server_destroy(s);
        return st;
    }
    if (restore != NULL)
        (void)snprintf(ps->restored, sizeof ps->restored, "%s", restore);
    *out = s;
    return FERRY_OK;
}

ferry_status ferry__ps_server_create_local(const ferry_ps_config *cfg, ferry_ps_server **out) {
    return server_new(cfg, 0, out);
}

ferry_status ferry_ps_server_create(const ferry_ps_config *cfg, ferry_ps_server **out) {
    ferry_ps_server *s;
    ferry_status st = server_new(cfg, 1, &s);
    if (st != FERRY_OK)
        return st;
    ferry_rpc_server_config rc;
    memset(&rc, 0, sizeof rc);
    rc.listen = cfg->listen;
    rc.threads = cfg->threads;
    rc.max_message_bytes = cfg->max_message_bytes;
    rc.user = &s->ps;
    rc.incarnation = s->ps.incarnation;
    rc.identities = cfg->identities;
    rc.nidentities = cfg->nidentities;
    for (int m = 0; m < FERRY_RPC_METHOD_COUNT; m++)
        rc.method_role[m] = ferry__ps_method_role((ferry_rpc_method)m);
    rc.lease.open = lease_open;
    rc.lease.close = lease_close;
    /* Hello, Stats and Shutdown never wait on a module or a context: answered at once,
     * however busy the workers are with other calls. */
    rc.cheap[FERRY_RPC_HELLO] = rc.cheap[FERRY_RPC_STATS] = rc.cheap[FERRY_RPC_SHUTDOWN] = 1;
    rc.workers = cfg->threads;
    rc.max_calls_per_identity = cfg->max_calls_per_identity;
    rc.max_pending_bytes = (int64_t)cfg->max_pending_reply_bytes;
    rc.reply_timeout_s = cfg->reply_timeout_s;
    rc.tls_cert_pem = cfg->tls_cert_pem;
    rc.tls_key_pem = cfg->tls_key_pem;
    rc.tls_ca_pem = cfg->tls_ca_pem;
    for (int m = 0; m < FERRY_RPC_METHOD_COUNT; m++) /* each method its own handler */
        rc.handlers[m] = ferry__ps_handlers[m];
    if ((st = ferry_rpc_server_create(&rc, &s->rpc)) != FERRY_OK) {
        ferry_ps_server_destroy(s);
        return st;
    }
    atomic_store(&s->ps.rpc, s->rpc);
    const char *colon = strrchr(cfg->listen, ':');
    int host_len = colon != NULL ? (int)(colon - cfg->listen) : (int)strlen(cfg->listen);
    (void)snprintf(s->address, sizeof s->address, "%.*s:%d", host_len, cfg->listen,
                   ferry_rpc_server_port(s->rpc));
    pthread_mutex_lock(&s->ps.id_mu);
    if (s->ps.server_id[0] == '\0')
        (void)snprintf(s->ps.server_id, sizeof s->ps.server_id, "ferry-ps@%s", s->address);
    pthread_mutex_unlock(&s->ps.id_mu);
    /* BLAS threads: a process-wide setting, so the daemon's (not an in-process server's).
     * One by default: a server's GEMMs are one call's, and a ferry-ps sharing a machine
     * with a trainer must not spin threads on the trainer's cores. */
    int blas = cfg->blas_threads;
    if (blas == 0)
        blas = ferry_env_int("OPENBLAS_NUM_THREADS", 1, 4096, 1);
    ferry_cpu_set_threads(blas > 0 ? blas : 1);
    FERRY_LOG_INFO("listening on %s (id %s, incarnation %016llx, %d threads, context ttl %g s, "
                   "session ttl %g s, %d identities)",
                   s->address, s->ps.server_id, (unsigned long long)s->ps.incarnation, cfg->threads,
                   cfg->context_ttl_s, cfg->session_ttl_s, cfg->nidentities);
    FERRY_LOG_INFO("OpenBLAS: %s, %d thread%s per GEMM (--blas-threads)", ferry_cpu_blas_kernels(),
                   blas > 0 ? blas : 1, blas > 1 ? "s" : "");
    FERRY_LOG_INFO("budgets: module %.0f MiB, all modules %.0f MiB, context %.0f MiB, all "
                   "contexts %.0f MiB, %lld contexts, message %.0f MiB",
                   (double)s->ps.lim.module_bytes / 1048576.0,
                   (double)s->ps.lim.model_bytes / 1048576.0,
                   (double)s->ps.lim.context_bytes / 1048576.0,
                   (double)s->ps.lim.contexts_bytes / 1048576.0, (long long)s->ps.lim.contexts,
                   (double)(cfg->max_message_bytes ? cfg->max_message_bytes
                                                   : FERRY_RPC_DEFAULT_MAX_MESSAGE_BYTES) /
                       1048576.0);
    *out = s;
    return FERRY_OK;
}

void ferry_ps_server_prometheus(ferry_ps_server *s, struct ferry_prom *p) {
    ferry__ps_prometheus(&s->ps, p);
}

int ferry_ps_server_serving(ferry_ps_server *s) {
    pthread_mutex_lock(&s->mu);
    int stopping = s->stopping;
    pthread_mutex_unlock(&s->mu);
    return !stopping;
}

int ferry_ps_server_port(const ferry_ps_server *s) {
    return s->rpc != NULL ? ferry_rpc_server_port(s->rpc) : 0;
}

const char *ferry_ps_server_address(const ferry_ps_server *s) {
    return s->address;
}

int ferry_ps_server_sweep(ferry_ps_server *s) {
    sessions_sweep(&s->ps);
    return ferry__ps_ctx_sweep(&s->ps.ctxs);
}

int ferry_ps_server_stopping(ferry_ps_server *s) {
    pthread_mutex_lock(&s->mu);
    int stopping = s->stopping;
    pthread_mutex_unlock(&s->mu);
    return stopping;
}

void ferry_ps_server_stop(ferry_ps_server *s, int grace_ms) {
    if (grace_ms < 0)
        grace_ms = s->cfg.shutdown_grace_ms;
    pthread_mutex_lock(&s->mu);
    int first = !s->stopping;
    s->stopping = 1;
    /* With --drain-ms and a running loop, health checks see NOT_SERVING (and calls are
     * still served) for that long; then the loop stops the rpc server. */
    int drain = first && s->rpc != NULL && s->cfg.drain_ms > 0 && s->loop_state == 1;
    if (drain)
        s->drain_grace = grace_ms;
    if (s->loop_state == 1)
        uv_async_send(&s->wake);
    pthread_mutex_unlock(&s->mu);
    if (first)
        ferry__ps_jobs_stop(&s->ps.jobs); /* calls waiting in a job barrier fail now */
    if (first && s->rpc != NULL) {
        ferry_rpc_server_set_serving(s->rpc, 0);
        if (drain) {
            FERRY_LOG_INFO("draining: health NOT_SERVING for %d ms, then no new calls", s->cfg.drain_ms);
        } else {
            FERRY_LOG_INFO("shutting down: no new calls, %d ms for the calls in flight", grace_ms);
            ferry_rpc_server_shutdown(s->rpc, grace_ms);
        }
    }
}

static void close_handle(uv_handle_t *h, void *arg);

static void on_drained(uv_timer_t *t) {
    ferry_ps_server *s = t->data;
    pthread_mutex_lock(&s->mu);
    int grace = s->drain_grace;
    s->drain_grace = -1;
    pthread_mutex_unlock(&s->mu);
    FERRY_LOG_INFO("shutting down: no new calls, %d ms for the calls in flight", grace);
    ferry_rpc_server_shutdown(s->rpc, grace);
    uv_walk(t->loop, close_handle, NULL);
}

static void close_handle(uv_handle_t *h, void *arg) {
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

static void on_wake(uv_async_t *a) {
    ferry_ps_server *s = a->data;
    pthread_mutex_lock(&s->mu);
    int stop = s->stopping, drain = s->drain_grace >= 0;
    if (stop)
        s->loop_state = 2; /* no uv_async_send after this point */
    pthread_mutex_unlock(&s->mu);
    if (stop && drain && !uv_is_active((uv_handle_t *)&s->drain))
        (void)uv_timer_start(&s->drain, on_drained, (uint64_t)s->cfg.drain_ms, 0);
    else if (stop && !drain)
        uv_walk(a->loop, close_handle, NULL);
}

#define TRIM_EVERY_S 5.0
#define TRIM_IDLE_S  2.0

static void on_sweep(uv_timer_t *t) {
    ferry_ps_server *s = t->data;
    sessions_sweep(&s->ps);
    (void)ferry__ps_ctx_sweep(&s->ps.ctxs);
    ferry__ps_jobs_expire(&s->ps.jobs, &s->ps.sessions);
    if (s->rpc != NULL)
        (void)ferry_rpc_server_reap(s->rpc); /* replies nobody reads */
    /* What freed jobs, modules and replies held goes back to the system, not only to
     * malloc's free lists (contexts do it as they are swept), once no context has been
     * made for TRIM_IDLE_S: while a job trains, each step reuses the pages the last
     * one freed (received tensors, gradient blocks, saved activations), and handing
     * them back every TRIM_EVERY_S had the steps after it fault them in again (medium:
     * about 7,000 page faults per step, about 5% of ferry-ps's CPU). */
    double now = ferry_now();
    long long made = atomic_load(&s->ps.ctxs.created);
    if (made != s->made) {
        s->made = made;
        s->last_busy = now;
    }
    if (now - s->last_trim > TRIM_EVERY_S && now - s->last_busy >= TRIM_IDLE_S) {
        s->last_trim = now;
        ferry_rpc_release_idle_memory();
        atomic_fetch_add(&s->ps.memory_trims, 1);
    }
}

static void on_holds(uv_timer_t *t) {
    ferry_ps_server *s = t->data;
    ferry__ps_jobs_release_holds(&s->ps.jobs);
}

static void on_signal(uv_signal_t *h, int signum) {
    ferry_ps_server *s = h->data;
    FERRY_LOG_INFO("received %s", signum == SIGINT ? "SIGINT" : "SIGTERM");
    ferry_ps_server_stop(s, -1);
}

static ferry_status server_run(ferry_ps_server *s, int signals) {
    pthread_mutex_lock(&s->mu);
    if (s->loop_state != 0) {
        pthread_mutex_unlock(&s->mu);
        return ferry_errorf(FERRY_ERR_BUSY, "the server loop has already run");
    }
    int rc = uv_loop_init(&s->loop);
    if (rc == 0 && (rc = uv_async_init(&s->loop, &s->wake, on_wake)) == 0 &&
        (rc = uv_timer_init(&s->loop, &s->sweep)) == 0 &&
        (rc = uv_timer_init(&s->loop, &s->holds)) == 0)
        rc = uv_timer_init(&s->loop, &s->drain);
    if (rc == 0 && signals && (rc = uv_signal_init(&s->loop, &s->sigint)) == 0)
        rc = uv_signal_init(&s->loop, &s->sigterm);
    if (rc != 0) {
        pthread_mutex_unlock(&s->mu);
        return ferry_errorf(FERRY_ERR_IO, "libuv: %s", uv_strerror(rc));
    }
    s->wake.data = s->sweep.data = s->holds.data = s->drain.data = s->sigint.data =
        s->sigterm.data = s;
    s->loop_state = 1;
    if (s->stopping)
        uv_async_send(&s->wake);
    pthread_mutex_unlock(&s->mu);
    /* Sweep often enough that a context never outlives its TTL by much. */
    double every = s->cfg.context_ttl_s * 250.0;
    uint64_t every_ms = every < 50.0 ? 50 : every > 1000.0 ? 1000 : (uint64_t)every;
    (void)uv_timer_start(&s->sweep, on_sweep, every_ms, every_ms);
    (void)uv_timer_start(&s->holds, on_holds, 50, 50);
    if (signals) {
        (void)uv_signal_start(&s->sigint, on_signal, SIGINT);
        (void)uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    }
    (void)uv_run(&s->loop, UV_RUN_DEFAULT);
    (void)uv_loop_close(&s->loop);
    ferry_status st = ferry_rpc_server_wait(s->rpc, -1);
    ferry_rpc_server_stats rs;
    ferry_rpc_server_get_stats(s->rpc, &rs);
    FERRY_LOG_INFO("stopped after %.1f s: %llu calls, %llu errors, %lld contexts left",
                   ferry_now() - s->ps.t_start, (unsigned long long)rs.calls,
                   (unsigned long long)rs.errors, (long long)ferry__ps_ctx_live(&s->ps.ctxs, NULL));
    return st;
}

ferry_status ferry_ps_server_run(ferry_ps_server *s) {
    return server_run(s, s->cfg.handle_signals);
}

static void *run_thread(void *arg) {
    ferry_ps_server *s = arg;
    ferry_status st = server_run(s, 0);
    if (st != FERRY_OK)
        FERRY_LOG_ERROR("server loop: %s (%s)", ferry_status_str(st), ferry_error_last());
    return NULL;
}

ferry_status ferry_ps_server_start(ferry_ps_server *s) {
    if (s->thread_started)
        return ferry_errorf(FERRY_ERR_BUSY, "the server loop is already started");
    if (pthread_create(&s->thread, NULL, run_thread, s) != 0)
        return ferry_errorf(FERRY_ERR_NOMEM, "cannot start the server loop thread");
    s->thread_started = 1;
    return FERRY_OK;
}

void ferry_ps_server_destroy(ferry_ps_server *s) {
    if (s == NULL)
        return;
    if (s->rpc != NULL)
        ferry_ps_server_stop(s, -1);
    if (s->thread_started)
        pthread_join(s->thread, NULL);
    ferry_rpc_server_destroy(s->rpc);
    ferry__ps_jobs_deinit(&s->ps.jobs);
    ferry__ps_ctx_table_deinit(&s->ps.ctxs);
    ferry__ps_sessions_deinit(&s->ps.sessions);
    ferry__ps_registry_deinit(&s->ps.reg);
    ferry__ps_quotas_deinit(&s->ps.quotas); /* after everything charged to them */
    ferry__ps_manifest_deinit(&s->ps.manifest);
    pthread_mutex_destroy(&s->ps.checkpoint_mu);
    pthread_mutex_destroy(&s->ps.id_mu);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
