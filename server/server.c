/* server.c - the ferry-ps server object: the RPC server with one dispatcher for every
 * method, the calls that concern the whole server (Hello, CreateModule, Stats,
 * Checkpoint, Shutdown), and a libuv loop that owns the lease-sweep timer, the
 * signals of the daemon and the wake-up that ends the loop once a stop is asked. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <uv.h>

#include "ferry/version.h"
#include "common/core/log.h"
#include "server/ps-impl.h"

struct ferry_ps_server {
    ferry_ps_config cfg;
    char address[160]; /* "HOST:PORT" as bound */
    char server_id[192];
    char checkpoint_dir[1024];
    ferry_rpc_server *rpc;
    ferry__ps_registry reg;
    ferry__ps_ctx_table ctxs;
    ferry__ps_limits lim;
    pthread_mutex_t checkpoint_mu; /* one checkpoint written at a time */
    uint64_t incarnation;
    double t_start;
    pthread_mutex_t mu;       /* guards everything below */
    int stopping, loop_state; /* loop_state: 0 never ran, 1 running, 2 done */
    int signals;              /* this run handles SIGINT/SIGTERM */
    uv_loop_t loop;
    uv_async_t wake;
    uv_timer_t sweep;
    uv_signal_t sigint, sigterm;
    pthread_t thread;
    int thread_started;
};

void ferry_ps_config_default(ferry_ps_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->listen = "127.0.0.1:7000";
    cfg->threads = 2;
    cfg->context_ttl_s = 60.0;
    cfg->shutdown_grace_ms = 5000;
}

ferry__ps_registry *ferry__ps_server_registry(ferry_ps_server *s) {
    return &s->reg;
}

ferry__ps_ctx_table *ferry__ps_server_contexts(ferry_ps_server *s) {
    return &s->ctxs;
}

/* ---- whole-server calls ---- */

/* The id is completed once the port is known, possibly after the first call. */
static void server_id_copy(ferry_ps_server *s, char *out) {
    pthread_mutex_lock(&s->mu);
    memcpy(out, s->server_id, sizeof s->server_id);
    pthread_mutex_unlock(&s->mu);
}

static ferry_status on_hello(ferry_ps_server *s, ferry_rpc_msg *req, ferry_rpc_msg *reply) {
    const Ferry__HelloRequest *q = req->head;
    FERRY_LOG_DEBUG("hello from %s (worker %u, version %s)", q->client_id[0] ? q->client_id : "?",
                    q->worker_id, q->version);
    int n;
    ferry__ps_module **mods = ferry__ps_registry_list(&s->reg, &n);
    char **names = malloc((size_t)(n > 0 ? n : 1) * sizeof *names);
    if (names == NULL) {
        free(mods);
        return FERRY_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++)
        names[i] = mods[i]->name;
    char id[sizeof s->server_id];
    server_id_copy(s, id);
    Ferry__HelloReply r;
    ferry__hello_reply__init(&r);
    r.server_id = id;
    r.incarnation = s->incarnation;
    r.version = (char *)FERRY_VERSION;
    r.n_modules = (size_t)n;
    r.modules = names;
    r.max_message_bytes =
        s->cfg.max_message_bytes ? s->cfg.max_message_bytes : FERRY_RPC_DEFAULT_MAX_MESSAGE_BYTES;
    ferry_status st = ferry_rpc_msg_set_head(reply, &r.base);
    free(names);
    free(mods);
    return st;
}

static ferry_status on_create_module(ferry_ps_server *s, ferry_rpc_msg *req, ferry_rpc_msg *reply) {
    const Ferry__CreateModuleRequest *q = req->head;
    ferry__ps_module *m;
    int created = 0;
    ferry_status st = ferry__ps_registry_create(&s->reg, q->name, q->config, req, &created, &m);
    if (st != FERRY_OK)
        return st;
    Ferry__CreateModuleReply r;
    ferry__create_module_reply__init(&r);
    r.created = created;
    pthread_rwlock_rdlock(&m->lock);
    r.version = m->version;
    pthread_rwlock_unlock(&m->lock);
    for (int p = 0; p < m->P.count; p++)
        r.num_params += (uint64_t)m->P.items[p].numel;
    return ferry_rpc_msg_set_head(reply, &r.base);
}

typedef struct stats_builder {
    Ferry__Metric items[64];
    Ferry__Metric *ptrs[64];
    char names[64][FERRY_RPC_NAME_MAX + 16];
    size_t n;
    const char *prefix;
} stats_builder;

static void stat_add(stats_builder *b, const char *name, double value) {
    if (b->n == 64 || strncmp(name, b->prefix, strlen(b->prefix)) != 0)
        return;
    (void)snprintf(b->names[b->n], sizeof b->names[b->n], "%s", name);
    ferry__metric__init(&b->items[b->n]);
    b->items[b->n].name = b->names[b->n];
    b->items[b->n].value = value;
    b->ptrs[b->n] = &b->items[b->n];
    b->n++;
}

static ferry_status on_stats(ferry_ps_server *s, ferry_rpc_msg *req, ferry_rpc_msg *reply) {
    const Ferry__StatsRequest *q = req->head;
    stats_builder *b = calloc(1, sizeof *b);
    if (b == NULL)
        return FERRY_ERR_NOMEM;
    b->prefix = q->prefix;
    ferry_rpc_server_stats rs;
    memset(&rs, 0, sizeof rs);
    if (s->rpc != NULL)
        ferry_rpc_server_get_stats(s->rpc, &rs);
    int64_t live = ferry__ps_ctx_live(&s->ctxs);
    long long bytes = atomic_load(&s->ctxs.bytes);
    int nmods = ferry__ps_registry_count(&s->reg);
    stat_add(b, "contexts_live", (double)live);
    stat_add(b, "context_bytes", (double)bytes);
    stat_add(b, "contexts_created", (double)atomic_load(&s->ctxs.created));
    stat_add(b, "contexts_stepped", (double)atomic_load(&s->ctxs.stepped));
    stat_add(b, "contexts_released", (double)atomic_load(&s->ctxs.released));
    stat_add(b, "contexts_swept", (double)atomic_load(&s->ctxs.swept));
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
    stat_add(b, "calls", (double)rs.calls);
    stat_add(b, "errors", (double)rs.errors);
    stat_add(b, "in_flight", (double)rs.in_flight);
    stat_add(b, "bytes_in", (double)rs.bytes_in);
    stat_add(b, "bytes_out", (double)rs.bytes_out);
    stat_add(b, "uptime_s", ferry_now() - s->t_start);
    int n;
    ferry__ps_module **mods = ferry__ps_registry_list(&s->reg, &n);
    for (int i = 0; i < n && b->n < sizeof b->items / sizeof b->items[0]; i++) {
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
    free(mods);
    char text[512], id[sizeof s->server_id];
    server_id_copy(s, id);
    (void)snprintf(text, sizeof text,
                   "%s: %d modules, %lld contexts live holding %lld bytes, %llu calls, "
                   "%llu errors, up %.0f s",
                   id, nmods, (long long)live, bytes, (unsigned long long)rs.calls,
                   (unsigned long long)rs.errors, ferry_now() - s->t_start);
    Ferry__StatsReply r;
    ferry__stats_reply__init(&r);
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
static ferry_status checkpoint_name(ferry_ps_server *s, const char *name, uint64_t step, char *out,
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
                  : snprintf(out, cap, "ferry-ps-%d-step%llu.ckpt", ferry__ps_server_port(s),
                             (unsigned long long)step);
    if (k < 0 || (size_t)k >= cap)
        return ferry_errorf(FERRY_ERR_INVALID, "checkpoint name too long");
    return FERRY_OK;
}

/* Writes a checkpoint, one at a time: a second request while one is being written
 * is refused with FERRY_ERR_BUSY rather than queued. */
static ferry_status checkpoint_write(ferry_ps_server *s, const char *name, uint64_t step,
                                     char *path, size_t cap, uint64_t *bytes) {
    char file[160];
    ferry_status st = checkpoint_name(s, name, step, file, sizeof file);
    if (st != FERRY_OK)
        return st;
    if (snprintf(path, cap, "%s/%s", s->checkpoint_dir, file) >= (int)cap)
        return ferry_errorf(FERRY_ERR_INVALID, "checkpoint path too long");
    if (pthread_mutex_trylock(&s->checkpoint_mu) != 0)
        return ferry_errorf(FERRY_ERR_BUSY, "a checkpoint is being written; try again when it "
                                            "is done");
    st =
        ferry__ps_checkpoint_write(&s->reg, s->checkpoint_dir, file, s->cfg.checkpoint_keep, bytes);
    pthread_mutex_unlock(&s->checkpoint_mu);
    return st;
}

static ferry_status on_checkpoint(ferry_ps_server *s, ferry_rpc_msg *req, ferry_rpc_msg *reply) {
    const Ferry__CheckpointRequest *q = req->head;
    char path[1280];
    uint64_t bytes = 0;
    ferry_status st = checkpoint_write(s, q->path, q->step, path, sizeof path, &bytes);
    if (st != FERRY_OK)
        return st;
    Ferry__CheckpointReply r;
    ferry__checkpoint_reply__init(&r);
    r.path = path;
    r.bytes = bytes;
    return ferry_rpc_msg_set_head(reply, &r.base);
}

static ferry_status on_shutdown(ferry_ps_server *s, ferry_rpc_msg *req, ferry_rpc_msg *reply) {
    const Ferry__ShutdownRequest *q = req->head;
    if (q->checkpoint) {
        char path[1280];
        uint64_t bytes;
        ferry_status st = checkpoint_write(s, "", 0, path, sizeof path, &bytes);
        if (st != FERRY_OK) {
            char why[256]; /* copied: ferry_errorf writes where ferry_error_last points */
            (void)snprintf(why, sizeof why, "%s", ferry_error_last());
            return ferry_errorf(st, "Shutdown refused: %s", why);
        }
    }
    FERRY_LOG_INFO("Shutdown requested (%s), grace %u ms",
                   q->reason[0] ? q->reason : "no reason given", q->grace_ms);
    Ferry__ShutdownReply r;
    ferry__shutdown_reply__init(&r);
    ferry_status st = ferry_rpc_msg_set_head(reply, &r.base);
    if (st == FERRY_OK)
        ferry_ps_server_stop(s, (int)(q->grace_ms > 600000 ? 600000 : q->grace_ms));
    return st;
}

ferry_status ferry__ps_dispatch(void *user, ferry_rpc_method method, ferry_rpc_msg *req,
                                ferry_rpc_msg *reply) {
    ferry_ps_server *s = user;
    ferry_status st;
    ferry_error_clear();
    switch (method) {
    case FERRY_RPC_HELLO:
        st = on_hello(s, req, reply);
        break;
    case FERRY_RPC_CREATE_MODULE:
        st = on_create_module(s, req, reply);
        break;
    case FERRY_RPC_FORWARD:
        st = ferry__ps_on_forward(s, req, reply);
        break;
    case FERRY_RPC_BACKWARD:
        st = ferry__ps_on_backward(s, req, reply);
        break;
    case FERRY_RPC_GRAD_NORM:
        st = ferry__ps_on_grad_norm(s, req, reply);
        break;
    case FERRY_RPC_STEP:
        st = ferry__ps_on_step(s, req, reply);
        break;
    case FERRY_RPC_RELEASE_CONTEXT:
        st = ferry__ps_on_release(s, req, reply);
        break;
    case FERRY_RPC_GET_PARAMS:
        st = ferry__ps_on_get_params(s, req, reply);
        break;
    case FERRY_RPC_SET_PARAMS:
        st = ferry__ps_on_set_params(s, req, reply);
        break;
    case FERRY_RPC_CHECKPOINT:
        st = on_checkpoint(s, req, reply);
        break;
    case FERRY_RPC_STATS:
        st = on_stats(s, req, reply);
        break;
    case FERRY_RPC_SHUTDOWN:
        st = on_shutdown(s, req, reply);
        break;
    default:
        st = ferry_errorf(FERRY_ERR_UNSUPPORTED, "method %d", (int)method);
        break;
    }
    if (st != FERRY_OK) {
        if (ferry_error_last()[0] == '\0')
            (void)ferry_errorf(st, "%s", ferry_status_str(st));
        FERRY_LOG_WARN("%s rejected: %s (%s)", ferry_rpc_method_name(method), ferry_status_str(st),
                       ferry_error_last());
    }
    return st;
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
    if (!(cfg->context_ttl_s > 0.0) || cfg->context_ttl_s > 1e7)
        return ferry_errorf(FERRY_ERR_INVALID, "context ttl %g s must be in (0, 1e7]",
                            cfg->context_ttl_s);
    if (cfg->shutdown_grace_ms < 0)
        return ferry_errorf(FERRY_ERR_INVALID, "negative shutdown grace");
    if (cfg->max_contexts < 0 || cfg->checkpoint_keep < 0)
        return ferry_errorf(FERRY_ERR_INVALID, "negative max_contexts or checkpoint_keep");
    if (cfg->checkpoint_dir != NULL && cfg->checkpoint_dir[0] != '\0') {
        if (strlen(cfg->checkpoint_dir) >= 1024)
            return ferry_errorf(FERRY_ERR_INVALID, "checkpoint directory name too long");
        if (access(cfg->checkpoint_dir, W_OK | X_OK) != 0)
            return ferry_errorf(FERRY_ERR_IO, "checkpoint directory %s is not writable",
                                cfg->checkpoint_dir);
    }
    return FERRY_OK;
}

/* Everything but the network: registry, contexts, budgets, a restored checkpoint. */
static ferry_status server_new(const ferry_ps_config *cfg, int network, ferry_ps_server **out) {
    ferry_status st = config_check(cfg, network);
    if (st != FERRY_OK)
        return st;
    ferry_ps_server *s = calloc(1, sizeof *s);
    if (s == NULL)
        return FERRY_ERR_NOMEM;
    s->cfg = *cfg;
    s->cfg.listen = NULL; /* the caller's strings may go away: copies below */
    s->cfg.checkpoint_dir = NULL;
    s->cfg.server_id = NULL;
    s->cfg.restore = NULL;
    if (s->cfg.checkpoint_keep == 0)
        s->cfg.checkpoint_keep = 4;
    if (cfg->checkpoint_dir != NULL)
        (void)snprintf(s->checkpoint_dir, sizeof s->checkpoint_dir, "%s", cfg->checkpoint_dir);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->checkpoint_mu, NULL);
    ferry__ps_limits_resolve(cfg, &s->lim);
    ferry__ps_registry_init(&s->reg, &s->lim); /* both point at s->lim */
    if ((st = ferry__ps_ctx_table_init(&s->ctxs, cfg->context_ttl_s, &s->lim)) != FERRY_OK) {
        ferry__ps_registry_deinit(&s->reg);
        pthread_mutex_destroy(&s->checkpoint_mu);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return st;
    }
    s->incarnation = random_u64();
    s->t_start = ferry_now();
    (void)snprintf(s->server_id, sizeof s->server_id, "%s", cfg->server_id ? cfg->server_id : "");
    if (cfg->restore != NULL &&
        (st = ferry__ps_checkpoint_read(&s->reg, cfg->restore)) != FERRY_OK) {
        ferry_ps_server_destroy(s);
        return st;
    }
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
    rc.user = s;
    for (int m = 0; m < FERRY_RPC_METHOD_COUNT; m++)
        rc.handlers[m] = ferry__ps_dispatch;
    if ((st = ferry_rpc_server_create(&rc, &s->rpc)) != FERRY_OK) {
        ferry_ps_server_destroy(s);
        return st;
    }
    const char *colon = strrchr(cfg->listen, ':');
    int host_len = colon != NULL ? (int)(colon - cfg->listen) : (int)strlen(cfg->listen);
    (void)snprintf(s->address, sizeof s->address, "%.*s:%d", host_len, cfg->listen,
                   ferry_rpc_server_port(s->rpc));
    pthread_mutex_lock(&s->mu);
    if (s->server_id[0] == '\0')
        (void)snprintf(s->server_id, sizeof s->server_id, "ferry-ps@%s", s->address);
    pthread_mutex_unlock(&s->mu);
    FERRY_LOG_INFO("listening on %s (id %s, incarnation %016llx, %d threads, context ttl %g s)",
                   s->address, s->server_id, (unsigned long long)s->incarnation, cfg->threads,
                   cfg->context_ttl_s);
    FERRY_LOG_INFO("budgets: module %.0f MiB, all modules %.0f MiB, context %.0f MiB, all "
                   "contexts %.0f MiB, %lld contexts, message %.0f MiB",
                   (double)s->lim.module_bytes / 1048576.0, (double)s->lim.model_bytes / 1048576.0,
                   (double)s->lim.context_bytes / 1048576.0,
                   (double)s->lim.contexts_bytes / 1048576.0, (long long)s->lim.contexts,
                   (double)(cfg->max_message_bytes ? cfg->max_message_bytes
                                                   : FERRY_RPC_DEFAULT_MAX_MESSAGE_BYTES) /
                       1048576.0);
    *out = s;
    return FERRY_OK;
}

int ferry_ps_server_port(const ferry_ps_server *s) {
    return s->rpc != NULL ? ferry_rpc_server_port(s->rpc) : 0;
}

int ferry__ps_server_port(const ferry_ps_server *s) {
    return ferry_ps_server_port(s);
}

const char *ferry_ps_server_address(const ferry_ps_server *s) {
    return s->address;
}

int ferry_ps_server_sweep(ferry_ps_server *s) {
    return ferry__ps_ctx_sweep(&s->ctxs);
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
    if (s->loop_state == 1)
        uv_async_send(&s->wake);
    pthread_mutex_unlock(&s->mu);
    if (first && s->rpc != NULL) {
        FERRY_LOG_INFO("shutting down: no new calls, %d ms for the calls in flight", grace_ms);
        ferry_rpc_server_shutdown(s->rpc, grace_ms);
    }
}

static void close_handle(uv_handle_t *h, void *arg) {
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

static void on_wake(uv_async_t *a) {
    ferry_ps_server *s = a->data;
    pthread_mutex_lock(&s->mu);
    int stop = s->stopping;
    if (stop)
        s->loop_state = 2; /* no uv_async_send after this point */
    pthread_mutex_unlock(&s->mu);
    if (stop)
        uv_walk(a->loop, close_handle, NULL);
}

static void on_sweep(uv_timer_t *t) {
    ferry_ps_server *s = t->data;
    (void)ferry__ps_ctx_sweep(&s->ctxs);
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
    if (rc == 0 && (rc = uv_async_init(&s->loop, &s->wake, on_wake)) == 0)
        rc = uv_timer_init(&s->loop, &s->sweep);
    if (rc == 0 && signals && (rc = uv_signal_init(&s->loop, &s->sigint)) == 0)
        rc = uv_signal_init(&s->loop, &s->sigterm);
    if (rc != 0) {
        pthread_mutex_unlock(&s->mu);
        return ferry_errorf(FERRY_ERR_IO, "libuv: %s", uv_strerror(rc));
    }
    s->wake.data = s->sweep.data = s->sigint.data = s->sigterm.data = s;
    s->loop_state = 1;
    if (s->stopping)
        uv_async_send(&s->wake);
    pthread_mutex_unlock(&s->mu);
    /* Sweep often enough that a context never outlives its TTL by much. */
    double every = s->cfg.context_ttl_s * 250.0;
    uint64_t every_ms = every < 50.0 ? 50 : every > 1000.0 ? 1000 : (uint64_t)every;
    (void)uv_timer_start(&s->sweep, on_sweep, every_ms, every_ms);
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
                   ferry_now() - s->t_start, (unsigned long long)rs.calls,
                   (unsigned long long)rs.errors, (long long)ferry__ps_ctx_live(&s->ctxs));
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
    ferry__ps_ctx_table_deinit(&s->ctxs);
    ferry__ps_registry_deinit(&s->reg);
    pthread_mutex_destroy(&s->checkpoint_mu);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
