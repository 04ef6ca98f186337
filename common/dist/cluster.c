/* cluster.c - the set of ferry-ps servers a client talks to: one RPC client per
 * server, Hello (incarnations, to notice restarts), the concurrent fan-out every
 * other file uses, and the admin calls (Stats, Checkpoint, Shutdown). */
#include <ctype.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/dist/dist.h"
#include "ferry.pb-c.h"
#include "common/core/log.h"
#include "common/core/secret.h"
#include "common/rpc/probe.h" /* ferry_rpc_probe_tls */

void ferry_cluster_config_default(ferry_cluster_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->deadline_ms = FERRY_RPC_DEFAULT_DEADLINE_MS;
}

/* ---- shared helpers ---- */

ferry_rpc_tensor ferry__dist_tensor_as(const char *name, int dtype, int ndim, const int64_t *dim,
                                       const void *data) {
    ferry_rpc_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dtype;
    t.ndim = ndim;
    size_t n = ferry_rpc_dtype_size(dtype);
    for (int k = 0; k < ndim; k++) {
        t.dim[k] = dim[k];
        n *= (size_t)dim[k];
    }
    t.nbytes = n;
    t.data = n > 0 ? (void *)(uintptr_t)data : NULL; /* borrowed: only read while sending */
    (void)snprintf(t.name, sizeof t.name, "%s", name);
    return t;
}

ferry_rpc_tensor ferry__dist_tensor(ferry_wire_tensor_id id, const int64_t *dim, const void *data) {
    const ferry_wire_tensor *w = &ferry_wire_tensors[id];
    /* Requests carry ids as I32, the width of ferry's own ids. */
    int dtype = w->dtype == FERRY_WIRE_DTYPE_INDEX ? FERRY_RPC_DTYPE_I32 : w->dtype;
    FERRY_ASSERT(w->dir == FERRY_WIRE_FWD_IN || w->dir == FERRY_WIRE_BWD_IN);
    return ferry__dist_tensor_as(w->name, dtype, w->rank, dim, data);
}

ferry_status ferry__dist_fanout(ferry_cluster *c, ferry_rpc_method method, int n,
                                const int *servers, const ferry_rpc_msg *reqs, int shared,
                                ferry_rpc_msg *replies) {
    return ferry__dist_fanout_deadline(c, method, n, servers, reqs, shared, replies,
                                       c->cfg.deadline_ms);
}

static ferry_status rehello(ferry_cluster *c, int p);
static ferry_status hello_one(ferry_cluster *c, int p, int deadline_ms);

/* Methods a caller may send again after a failure in transit: each is applied once
 * on the server however often it arrives (or changes nothing). */
static int retry_safe(ferry_rpc_method m) {
    return m == FERRY_RPC_FORWARD || m == FERRY_RPC_BACKWARD || m == FERRY_RPC_GRAD_NORM ||
           m == FERRY_RPC_STEP || m == FERRY_RPC_GET_PARAMS || m == FERRY_RPC_STATS;
}

/* ---- replicas ---- */

/* Replica p (shard p / R) failed a call (m, why) that a sibling answered (stale 0), or
 * answered behind its sibling (1), or is dropped for `why` alone (2), or failed a call
 * that the next replica takes over (3, primary-backup): the shard's calls
 * go to the others from now on, first among them the one whose answers count. */
static void replica_drop(ferry_cluster *c, int p, ferry_rpc_method m, const char *why, int stale) {
    int g = p / c->R, left = 0;
    pthread_mutex_lock(&c->hello_mu);
    int was = c->live[p];
    c->live[p] = 0;
    for (int r = c->R - 1; r >= 0; r--) {
        if (c->live[g * c->R + r]) {
            c->clients[g] = c->all[g * c->R + r];
            left++;
        }
    }
    char line[sizeof c->last_drop] = "";
    if (was) {
        atomic_fetch_add(&c->dropped, 1);
        char what[200];
        if (stale == 2) /* why says it all */
            (void)snprintf(what, sizeof what, "%.190s", why);
        else if (stale == 3) /* primary-backup: the next replica takes over */
            (void)snprintf(what, sizeof what, "its %s failed (%.150s)", ferry_rpc_method_name(m),
                           why);
        else
            (void)snprintf(what, sizeof what, "its %s %s (%.120s)%s", ferry_rpc_method_name(m),
                           stale ? "answer is behind its sibling's" : "failed", why,
                           stale ? "" : " while a sibling answered");
        (void)snprintf(c->last_drop, sizeof c->last_drop,
                       "replica %s of shard %d dropped: %s; shard %d goes on with %s (%d of %d "
                       "replicas)",
                       ferry_rpc_client_target(c->all[p]), g, what, g,
                       ferry_rpc_client_target(c->clients[g]), left, c->R);
        memcpy(line, c->last_drop, sizeof line);
    }
    pthread_mutex_unlock(&c->hello_mu);
    if (was)
        FERRY_LOG_WARN("%s", line);
}

void ferry__dist_replica_drop(ferry_cluster *c, int p, const char *why) {
    if (p >= 0 && p < c->n * c->R)
        replica_drop(c, p, FERRY_RPC_JOB, why, 2);
}

/* Job replies of a shard's replicas (entries [a, b) that answered OK) that must not
 * be taken as alike. A recover restores, on each replica, the newest offered step it
 * holds: a replica that missed steps (it was frozen, or restarted from an older
 * checkpoint, and a restarted trainer that did not know it was dropped called it)
 * restores an older one. The newest is the job's; the others are dropped. A probe
 * is answered by the replica that holds the newest checkpoint, so the roll-back
 * offers what the shard can restore. Returns the entry whose answer counts; sets
 * stale[e] for the replicas to drop. */
static int job_pick(const ferry_rpc_fanout *calls, int a, int b, unsigned char *stale) {
    int best = -1;
    uint64_t best_resume = 0, best_ck = 0;
    for (int e = a; e < b; e++) {
        const Ferry__V1__JobReply *r = calls[e].reply->head;
        if (calls[e].status != FERRY_OK || r == NULL)
            continue;
        uint64_t resume = r->resume_file[0] != '\0' ? r->resume_step + 1 : 0;
        uint64_t ck = r->n_checkpoints > 0 ? r->checkpoints[r->n_checkpoints - 1] + 1 : 0;
        if (best < 0 || resume > best_resume || (resume == best_resume && ck > best_ck))
            best = e, best_resume = resume, best_ck = ck;
    }
    for (int e = a; e < b && best >= 0; e++) {
        const Ferry__V1__JobReply *r = calls[e].reply->head;
        if (calls[e].status == FERRY_OK && r != NULL && r->resume_file[0] != '\0' &&
            r->resume_step + 1 < best_resume)
            stale[e] = 1;
    }
    return best;
}

int ferry__dist_replica_live(ferry_cluster *c, int p) {
    pthread_mutex_lock(&c->hello_mu);
    int live = p >= 0 && p < c->n * c->R && c->live[p];
    pthread_mutex_unlock(&c->hello_mu);
    return live;
}

int ferry__dist_replica_primary(ferry_cluster *c, int g) {
    int p = g * c->R;
    pthread_mutex_lock(&c->hello_mu);
    for (int r = c->R - 1; r >= 0; r--)
        p = c->live[g * c->R + r] ? g * c->R + r : p;
    pthread_mutex_unlock(&c->hello_mu);
    return p;
}

void ferry__dist_replica_readmit(ferry_cluster *c, int p) {
    int g = p / c->R;
    pthread_mutex_lock(&c->hello_mu);
    c->live[p] = 1;
    for (int r = c->R - 1; r >= 0; r--) {
        if (c->live[g * c->R + r])
            c->clients[g] = c->all[g * c->R + r];
    }
    pthread_mutex_unlock(&c->hello_mu);
}

ferry_status ferry__dist_replica_call(ferry_cluster *c, int p, ferry_rpc_method m,
                                      const ferry_rpc_msg *req, ferry_rpc_msg *reply,
                                      int deadline_ms) {
    if (p < 0 || p >= c->n * c->R)
        return ferry_errorf(FERRY_ERR_INVALID, "replica %d outside [0, %d)", p, c->n * c->R);
    return ferry_rpc_call(c->all[p], m, req, reply, deadline_ms);
}

/* ---- primary-backup ---- */

/* A shard's calls of open contexts since their last Step (struct ferry_cluster): each
 * with its context id, to replay on the next replica when the primary fails. */
typedef struct ferry__dist_replay {
    struct replay_call {
        ferry_rpc_method m;
        ferry_rpc_msg req;
        uint64_t ctx;
    } * call;
    int n, cap;
    size_t bytes;
    /* Contexts whose calls could not all be kept (0: a free slot); lost_all: more than
     * the slots hold, so none may be replayed until the log is empty. */
    uint64_t lost[8];
    int lost_all;
} ferry__dist_replay;

static int lost_has(const ferry__dist_replay *L, uint64_t ctx) {
    for (int i = 0; i < 8; i++) {
        if (L->lost[i] == ctx)
            return 1;
    }
    return L->lost_all;
}

static void lost_add(ferry__dist_replay *L, uint64_t ctx) {
    for (int i = 0; i < 8; i++) {
        if (L->lost[i] == ctx)
            return;
    }
    for (int i = 0; i < 8; i++) {
        if (L->lost[i] == 0) {
            L->lost[i] = ctx;
            return;
        }
    }
    L->lost_all = 1;
}

#define REPLAY_MAX       1024        /* calls kept per shard */
#define REPLAY_MAX_BYTES (512 << 20) /* and their bytes */

void ferry__dist_set_passive(ferry_cluster *c, int on) {
    int minor = ferry__dist_min_minor(c);
    int old = minor < 3; /* servers before contract 1.3 know no install */
    if (on && c->R > 1 && old)
        FERRY_LOG_WARN("a ferry-ps of contract 1.%d (before 1.3) knows no primary-backup: the "
                       "replicas stay active (every call to each)",
                       minor);
    atomic_store(&c->passive, on && c->R > 1 && c->log != NULL && !old);
}

int ferry__dist_min_minor(ferry_cluster *c) {
    pthread_mutex_lock(&c->hello_mu);
    int minor = c->min_minor;
    pthread_mutex_unlock(&c->hello_mu);
    return minor;
}

int ferry__dist_passive(ferry_cluster *c) {
    return atomic_load(&c->passive);
}

int ferry__dist_backups(ferry_cluster *c, int g) {
    int k = 0;
    pthread_mutex_lock(&c->hello_mu);
    for (int r = 0; r < c->R; r++)
        k += c->live[g * c->R + r];
    pthread_mutex_unlock(&c->hello_mu);
    return k > 0 ? k - 1 : 0;
}

/* The methods that go to the primary alone under primary-backup: a context's calls
 * (their effects are the context's, summed at the barrier and shipped with the Step
 * to the backups) and evaluation. */
static int primary_only(ferry_cluster *c, ferry_rpc_method m) {
    return (m == FERRY_RPC_FORWARD || m == FERRY_RPC_BACKWARD || m == FERRY_RPC_GRAD_NORM ||
            m == FERRY_RPC_RELEASE_CONTEXT) &&
           atomic_load(&c->passive);
}

/* The context request req of method m acts in (0: none, or nothing kept there: an
 * evaluation's Forward). */
static uint64_t req_ctx(ferry_rpc_method m, const ferry_rpc_msg *req) {
    if (req->head_bytes == NULL)
        return 0;
    ProtobufCMessage *h =
        protobuf_c_message_unpack(req->head_desc, NULL, req->head_len, req->head_bytes);
    if (h == NULL)
        return 0;
    uint64_t ctx = 0;
    switch (m) {
    case FERRY_RPC_FORWARD:
        if (!((Ferry__V1__ForwardRequest *)h)->no_grad)
            ctx = ((Ferry__V1__ForwardRequest *)h)->ctx_id;
        break;
    case FERRY_RPC_BACKWARD:
        ctx = ((Ferry__V1__BackwardRequest *)h)->ctx_id;
        break;
    case FERRY_RPC_GRAD_NORM:
        ctx = ((Ferry__V1__GradNormRequest *)h)->ctx_id;
        break;
    case FERRY_RPC_STEP:
        ctx = ((Ferry__V1__StepRequest *)h)->ctx_id;
        break;
    case FERRY_RPC_RELEASE_CONTEXT:
        ctx = ((Ferry__V1__ReleaseContextRequest *)h)->ctx_id;
        break;
    default:
        break;
    }
    protobuf_c_message_free_unpacked(h, NULL);
    return ctx;
}

static size_t msg_bytes(const ferry_rpc_msg *m) {
    size_t n = m->head_len;
    for (int i = 0; i < m->ntensors; i++)
        n += m->tensors[i].nbytes;
    return n;
}

/* Drops the kept calls of context ctx (0: of every context); log_mu held. */
static void log_drop_locked(ferry__dist_replay *L, uint64_t ctx) {
    int k = 0;
    for (int i = 0; i < L->n; i++) {
        if (ctx == 0 || L->call[i].ctx == ctx) {
            L->bytes -= msg_bytes(&L->call[i].req);
            ferry_rpc_msg_deinit(&L->call[i].req);
            continue;
        }
        L->call[k++] = L->call[i];
    }
    L->n = k;
    for (int i = 0; i < 8; i++) {
        if (ctx == 0 || L->lost[i] == ctx)
            L->lost[i] = 0;
    }
    if (ctx == 0 || L->n == 0)
        L->lost_all = 0;
}

static void log_clear(ferry_cluster *c, int g, uint64_t ctx) {
    pthread_mutex_lock(&c->log_mu);
    log_drop_locked(&c->log[g], ctx);
    pthread_mutex_unlock(&c->log_mu);
}

void ferry__dist_forget_context(ferry_cluster *c, uint64_t ctx) {
    for (int g = 0; c->log != NULL && g < c->n; g++)
        log_clear(c, g, ctx);
}

static int log_full(const ferry__dist_replay *L, size_t nb) {
    return L->n == REPLAY_MAX || L->bytes + nb > (size_t)REPLAY_MAX_BYTES;
}

static void log_keep(ferry_cluster *c, int g, ferry_rpc_method m, const ferry_rpc_msg *req,
                     uint64_t ctx) {
    pthread_mutex_lock(&c->log_mu);
    ferry__dist_replay *L = &c->log[g];
    size_t nb = msg_bytes(req);
    /* Full: other contexts' calls go first (abandoned ones that nothing ended); they
     * are lost for a replay. */
    for (int i = 0; i < L->n && log_full(L, nb) && !lost_has(L, ctx); i++) {
        if (L->call[i].ctx != ctx) {
            uint64_t other = L->call[i].ctx;
            log_drop_locked(L, other);
            lost_add(L, other);
            i = -1;
        }
    }
    int ok = !lost_has(L, ctx) && !log_full(L, nb);
    if (ok && L->n == L->cap) {
        int cap = L->cap ? 2 * L->cap : 8;
        struct replay_call *grown = realloc(L->call, (size_t)cap * sizeof *grown);
        if (grown != NULL) {
            L->call = grown;
            L->cap = cap;
        }
        ok = grown != NULL;
    }
    if (ok && ferry_rpc_msg_clone(&L->call[L->n].req, req) == FERRY_OK) {
        L->call[L->n].m = m;
        L->call[L->n++].ctx = ctx;
        L->bytes += nb;
    } else {
        lost_add(L, ctx); /* this context cannot fail over: a replay would miss calls */
    }
    pthread_mutex_unlock(&c->log_mu);
}

static void log_free(ferry_cluster *c) {
    for (int g = 0; c->log != NULL && g < c->n; g++) {
        log_clear(c, g, 0);
        free(c->log[g].call);
    }
    free(c->log);
}

/* One call on replica p, its outcome in *f (status, transport, error). */
static void call_one(ferry_cluster *c, int p, ferry_rpc_method m, const ferry_rpc_msg *req,
                     ferry_rpc_msg *reply, int deadline_ms, ferry_rpc_fanout *f) {
    ferry_rpc_msg_deinit(reply);
    memset(f, 0, sizeof *f);
    f->client = c->all[p];
    f->method = m;
    f->req = req;
    f->reply = reply;
    (void)ferry_rpc_call_many(f, 1, deadline_ms);
}

/* Whether shard g's calls of context ctx were all kept (a replay can redo them). */
static int log_whole(ferry_cluster *c, int g, uint64_t ctx) {
    pthread_mutex_lock(&c->log_mu);
    int whole = ctx == 0 || !lost_has(&c->log[g], ctx);
    pthread_mutex_unlock(&c->log_mu);
    return whole;
}

/* Replays shard g's kept calls of context ctx on replica p, in order, each with a
 * deadline of its own; a GradNorm the barrier holds (`pending`) goes again, for up to
 * budget_ms. */
static ferry_status replay(ferry_cluster *c, int g, int p, uint64_t ctx, int budget_ms,
                           ferry_rpc_fanout *out) {
    ferry_rpc_fanout one, *f = &one; /* out keeps its request and reply */
    memset(f, 0, sizeof *f);
    /* The context's calls, copied out: the calls go without log_mu held. */
    pthread_mutex_lock(&c->log_mu);
    ferry__dist_replay *L = &c->log[g];
    int n = 0;
    for (int i = 0; i < L->n; i++)
        n += ctx != 0 && L->call[i].ctx == ctx;
    ferry_rpc_msg *reqs = calloc((size_t)n + 1, sizeof *reqs);
    ferry_rpc_method *ms = calloc((size_t)n + 1, sizeof *ms);
    ferry_status st = reqs != NULL && ms != NULL ? FERRY_OK : FERRY_NOMEM();
    for (int i = 0, k = 0; i < L->n && st == FERRY_OK && k < n; i++) {
        if (L->call[i].ctx != ctx)
            continue;
        ms[k] = L->call[i].m;
        st = ferry_rpc_msg_clone(&reqs[k++], &L->call[i].req);
    }
    pthread_mutex_unlock(&c->log_mu);
    if (st != FERRY_OK) {
        f->status = st;
        (void)snprintf(f->error, sizeof f->error, "%s", ferry_error_last());
    }
    double t0 = ferry_now();
    for (int i = 0; i < n && st == FERRY_OK; i++) {
        ferry_rpc_msg r;
        ferry_rpc_msg_init(&r);
        const Ferry__V1__GradNormReply *gr;
        do {
            call_one(c, p, ms[i], &reqs[i], &r, c->cfg.deadline_ms, f);
            gr = ms[i] == FERRY_RPC_GRAD_NORM && f->status == FERRY_OK ? r.head : NULL;
        } while (gr != NULL && gr->pending && (ferry_now() - t0) * 1000.0 < budget_ms);
        if (gr != NULL && gr->pending) {
            f->status = FERRY_ERR_TIMEOUT;
            (void)snprintf(f->error, sizeof f->error,
                           "replayed GradNorm: the barrier on %s is still open after %.1f s",
                           ferry_rpc_client_target(c->all[p]), budget_ms / 1000.0);
        }
        ferry_rpc_msg_deinit(&r);
        st = f->status;
    }
    for (int i = 0; reqs != NULL && i < n; i++)
        ferry_rpc_msg_deinit(&reqs[i]);
    free(reqs);
    free(ms);
    out->status = f->status;
    out->transport = f->transport;
    memcpy(out->error, f->error, sizeof out->error);
    if (n > 0 && st == FERRY_OK)
        FERRY_LOG_INFO("%s: replayed %d call%s of context %#llx of shard %d",
                       ferry_rpc_client_target(c->all[p]), n, n == 1 ? "" : "s",
                       (unsigned long long)ctx, g);
    return st;
}

/* A replay on replica q that failed part way: q may hold some of the context's calls
 * and not others, so no call of the context may go there now (not even once more after
 * a failure in transit: the status is the client's own, not one to retry). */
static void replay_failed(ferry_cluster *c, int q, ferry_rpc_fanout *f) {
    char why[sizeof f->error];
    (void)snprintf(why, sizeof why, "%s", f->error);
    (void)snprintf(f->error, sizeof f->error,
                   "the context's calls could not all be replayed on %s (%.150s): its step "
                   "cannot go on",
                   ferry_rpc_client_target(c->all[q]), why);
    f->status = FERRY_ERR_BUSY;
    f->transport = 0;
}

/* A failure the next replica does not share: the primary is gone, stalled past the
 * deadline, or restarted (a stale incarnation; or an unknown session, when a new Hello
 * finds another incarnation). Anything else (an error in the request, a session that
 * merely expired) it would answer alike, or is no reason to leave it. */
static int failover_worthy(ferry_cluster *c, int p, const ferry_rpc_fanout *f) {
    if (f->transport || f->status == FERRY_ERR_TIMEOUT || f->status == FERRY_ERR_UNAVAILABLE)
        return 1;
    if (f->status == FERRY_ERR_NOT_FOUND)
        return strstr(f->error, "this ferry-ps restarted") != NULL;
    if (f->status != FERRY_ERR_SESSION)
        return 0;
    pthread_mutex_lock(&c->hello_mu);
    uint64_t was = c->incarnation[p];
    pthread_mutex_unlock(&c->hello_mu);
    if (hello_one(c, p, c->cfg.deadline_ms) != FERRY_OK)
        return 1;
    pthread_mutex_lock(&c->hello_mu);
    int restarted = c->incarnation[p] != was;
    pthread_mutex_unlock(&c->hello_mu);
    return restarted;
}

/* The first live replica of shard g other than `not`, or -1. */
static int other_live(ferry_cluster *c, int g, int not ) {
    int q = -1;
    pthread_mutex_lock(&c->hello_mu);
    for (int r = c->R - 1; r >= 0; r--) {
        if (c->live[g * c->R + r] && g * c->R + r != not )
            q = g * c->R + r;
    }
    pthread_mutex_unlock(&c->hello_mu);
    return q;
}

/* A GradNorm (req) answered `pending` by replica p of shard g: the later live replica
 * of the shard where ranks wait at the barrier of the same job step (they failed over
 * to it: p stalled for them, and came back before this rank's calls found it out), or
 * -1. The shard's ranks then meet there. */
static int moved_to(ferry_cluster *c, int g, int p, const ferry_rpc_msg *req) {
    Ferry__V1__GradNormRequest *h = (Ferry__V1__GradNormRequest *)protobuf_c_message_unpack(
        req->head_desc, NULL, req->head_len, req->head_bytes);
    if (h == NULL)
        return -1;
    int found = -1;
    Ferry__V1__JobStatus js;
    Ferry__V1__JobRequest jq;
    ferry__v1__job_status__init(&js);
    ferry__v1__job_request__init(&jq);
    if (h->job != NULL)
        jq.job = h->job->job;
    jq.action_case = FERRY__V1__JOB_REQUEST__ACTION_STATUS;
    jq.status = &js;
    ferry_rpc_msg q, r;
    ferry_rpc_msg_init(&q);
    ferry_rpc_msg_init(&r);
    int dl = c->cfg.deadline_ms < 1000 ? c->cfg.deadline_ms : 1000;
    for (int x = p + 1; x < (g + 1) * c->R && found < 0 && h->job != NULL; x++) {
        ferry_rpc_fanout f;
        if (!ferry__dist_replica_live(c, x) ||
            (q.head_bytes == NULL && ferry_rpc_msg_set_head(&q, &jq.base) != FERRY_OK))
            continue;
        call_one(c, x, FERRY_RPC_JOB, &q, &r, dl, &f);
        const Ferry__V1__JobReply *jr = r.head;
        if (f.status == FERRY_OK && jr != NULL && jr->bsp_step == h->job->step &&
            jr->bsp_arrived > 0)
            found = x;
    }
    ferry_rpc_msg_deinit(&q);
    ferry_rpc_msg_deinit(&r);
    protobuf_c_message_free_unpacked(&h->base, NULL);
    return found;
}

void ferry__dist_lose_reply(ferry_cluster *c, int method, int p, int ms) {
    atomic_store(&c->lose_p, p);
    atomic_store(&c->lose_ms, ms);
    atomic_store(&c->lose_method, method);
}

/* The answer ferry__dist_lose_reply asked to lose, if this is it: dropped, and the call
 * failed in transit. */
static void maybe_lose(ferry_cluster *c, ferry_rpc_method m, int p, ferry_rpc_msg *reply,
                       ferry_rpc_fanout *f) {
    if (f->status != FERRY_OK || atomic_load(&c->lose_method) != (int)m ||
        atomic_load(&c->lose_p) != p)
        return;
    if (m == FERRY_RPC_GRAD_NORM && reply->head != NULL &&
        ((const Ferry__V1__GradNormReply *)reply->head)->pending)
        return; /* the barrier's answer, not yet the step's */
    atomic_store(&c->lose_method, -1);
    ferry_rpc_msg_deinit(reply);
    ferry_rpc_msg_init(reply);
    int ms = atomic_load(&c->lose_ms);
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    f->status = FERRY_ERR_TIMEOUT;
    f->transport = 1;
    (void)snprintf(f->error, sizeof f->error,
                   "%s %s: the answer was lost (a test's "
                   "ferry__dist_lose_reply)",
                   ferry_rpc_client_target(c->all[p]), ferry_rpc_method_name(m));
}

/* Primary-backup, after a primary-only call (*f, on replica *p of shard g) came back:
 * a GradNorm the barrier holds (`pending`) goes again, within budget_ms from t0 (a
 * resend the budget cut short that times out is the barrier's time-out, not the
 * server's); a failure the next replica does not share drops the primary, replays the
 * context's kept calls on the next live replica and sends the call there, each with a
 * deadline of its own (*p becomes it). */
static void passive_settle(ferry_cluster *c, ferry_rpc_method m, int g, int *p,
                           const ferry_rpc_msg *req, ferry_rpc_msg *reply, ferry_rpc_fanout *f,
                           int budget_ms, double t0) {
    uint64_t ctx = req_ctx(m, req);
    int cut = 0;
    for (;;) {
        maybe_lose(c, m, *p, reply, f);
        int left = budget_ms - (int)((ferry_now() - t0) * 1000.0);
        if (f->status == FERRY_OK) {
            const Ferry__V1__GradNormReply *r = reply->head;
            if (m != FERRY_RPC_GRAD_NORM || r == NULL || !r->pending)
                return;
            int q = moved_to(c, g, *p, req);
            if (q >= 0 && log_whole(c, g, ctx)) { /* the other ranks went on there */
                char why[200];
                (void)snprintf(why, sizeof why,
                               "the job's other ranks went on with %s (their calls here failed)",
                               ferry_rpc_client_target(c->all[q]));
                for (int x = *p; x < q; x++)
                    replica_drop(c, x, m, why, 2);
                *p = q;
                cut = 0;
                if (replay(c, g, q, ctx, left > 100 ? left : 100, f) != FERRY_OK) {
                    replay_failed(c, q, f);
                    return;
                }
                call_one(c, q, m, req, reply, c->cfg.deadline_ms, f);
                continue;
            }
            if (left < 100) {
                f->status = FERRY_ERR_TIMEOUT;
                f->transport = 0;
                (void)snprintf(f->error, sizeof f->error,
                               "bsp barrier on %s still open after %.1f s (the job's sync "
                               "timeout)",
                               ferry_rpc_client_target(c->all[*p]), budget_ms / 1000.0);
                return;
            }
            cut = left < c->cfg.deadline_ms;
            call_one(c, *p, m, req, reply, cut ? left : c->cfg.deadline_ms, f);
            continue;
        }
        if (cut && f->status == FERRY_ERR_TIMEOUT)
            return; /* the barrier outlived the budget: the sync timeout, not a stall */
        int q = other_live(c, g, *p);
        if (q < 0 || !log_whole(c, g, ctx) || !failover_worthy(c, *p, f))
            return;
        replica_drop(c, *p, m, f->error, 3);
        *p = q;
        cut = 0;
        if (replay(c, g, q, ctx, left > 100 ? left : 100, f) != FERRY_OK) {
            replay_failed(c, q, f);
            return;
        }
        call_one(c, q, m, req, reply, c->cfg.deadline_ms, f);
    }
}

/* Primary-backup, a Step round: a replica that answered that the step's barrier opened
 * there without this rank (the primary that summed it died after answering this
 * rank's GradNorm, and a rank that had no answer re-sums the step there) gets this
 * rank's calls of the step replayed, its GradNorm included, then the Step again; the
 * replicas whose Step failed in transit are dropped first. */
static void step_rejoin(ferry_cluster *c, int g, ferry_rpc_fanout *calls, const int *phys, int a,
                        int b, int budget_ms) {
    for (int e = a; e < b; e++) {
        if (calls[e].status != FERRY_ERR_BUSY ||
            strstr(calls[e].error, "replay the step here") == NULL)
            continue;
        uint64_t ctx = req_ctx(FERRY_RPC_STEP, calls[e].req);
        if (!log_whole(c, g, ctx))
            return;
        for (int x = a; x < b; x++) {
            if (x != e && calls[x].status != FERRY_OK && failover_worthy(c, phys[x], &calls[x]))
                replica_drop(c, phys[x], FERRY_RPC_STEP, calls[x].error, 3);
        }
        ferry_rpc_msg *reply = calls[e].reply;
        const ferry_rpc_msg *req = calls[e].req;
        if (replay(c, g, phys[e], ctx, budget_ms, &calls[e]) != FERRY_OK)
            replay_failed(c, phys[e], &calls[e]);
        else
            call_one(c, phys[e], FERRY_RPC_STEP, req, reply, c->cfg.deadline_ms, &calls[e]);
        return;
    }
}

/* The live replicas of shard g into out (at most R), in order. */
static int replicas_live(ferry_cluster *c, int g, int *out) {
    int k = 0;
    pthread_mutex_lock(&c->hello_mu);
    for (int r = 0; r < c->R; r++) {
        if (c->live[g * c->R + r])
            out[k++] = g * c->R + r;
    }
    pthread_mutex_unlock(&c->hello_mu);
    return k;
}

/* One round of a fan-out: logical entry at[j] (server servers[at[j]], request
 * reqs[shared ? 0 : at[j]], or with FERRY__DIST_PER_REPLICA reqs[p] for replica p)
 * to every live replica of its shard, concurrently. The
 * first replica's answer lands in replies[at[j]], unless only a later one succeeded:
 * then that one's. res[at[j]] gets the entry's result: OK when some replica answered
 * OK (the replicas that did not are dropped), else the first replica's failure,
 * preferring an answer from a server to a failure in transit. pst[p]: each replica's
 * own status. */
static ferry_status fan_round(ferry_cluster *c, ferry_rpc_method method, int k, const int *at,
                              const int *servers, const ferry_rpc_msg *reqs, int shared,
                              ferry_rpc_msg *replies, int deadline_ms, void (*during)(void *arg),
                              void *arg, ferry_rpc_fanout *res, ferry_status *pst) {
    int cap = k * c->R;
    ferry_rpc_fanout *calls = calloc((size_t)cap, sizeof *calls);
    ferry_rpc_msg *extra = calloc((size_t)cap, sizeof *extra);
    int *phys = calloc((size_t)cap, sizeof *phys), *first = calloc((size_t)k + 1, sizeof *first);
    unsigned char *stale = calloc((size_t)cap, 1);
    if (calls == NULL || extra == NULL || phys == NULL || first == NULL || stale == NULL) {
        free(calls);
        free(extra);
        free(phys);
        free(first);
        free(stale);
        return FERRY_NOMEM();
    }
    int m = 0, pas = primary_only(c, method);
    for (int j = 0; j < k; j++) {
        int i = at[j], nl = replicas_live(c, servers[i], &phys[m]);
        first[j] = m;
        if (nl == 0) /* every replica dropped: the shard's primary (it failed alone) */
            phys[m] = servers[i] * c->R, nl = 1;
        if (pas)
            nl = 1;
        for (int e = m; e < m + nl; e++) {
            ferry_rpc_msg_init(&extra[e]);
            calls[e].client = c->all[phys[e]];
            calls[e].method = method;
            calls[e].req = shared == FERRY__DIST_PER_REPLICA ? &reqs[phys[e]]
                           : shared                          ? &reqs[0]
                                                             : &reqs[i];
            calls[e].reply = e == m ? &replies[i] : &extra[e];
            calls[e].group = c->R > 1 ? j + 1 : 0;
        }
        m += nl;
    }
    first[k] = m;
    /* A replica that a peer stopped calling holds a bsp GradNorm until the sync
     * timeout; once a sibling answered, it gets one deadline more. */
    /* Primary-backup: a GradNorm's barrier answers `pending` within the deadline. */
    double t0 = ferry_now();
    int dl = pas && method == FERRY_RPC_GRAD_NORM && deadline_ms > c->cfg.deadline_ms
                 ? c->cfg.deadline_ms
                 : deadline_ms;
    (void)ferry_rpc_call_many_grace(calls, m, dl, c->R > 1 ? c->cfg.deadline_ms : 0, during, arg);
    for (int j = 0; pas && j < k; j++) {
        int e = first[j], g = servers[at[j]];
        const ferry_rpc_msg *req = calls[e].req;
        passive_settle(c, method, g, &phys[e], req, calls[e].reply, &calls[e], deadline_ms, t0);
        uint64_t ctx = calls[e].status == FERRY_OK ? req_ctx(method, req) : 0;
        if (ctx != 0 && method == FERRY_RPC_RELEASE_CONTEXT)
            log_clear(c, g, ctx);
        else if (ctx != 0)
            log_keep(c, g, method, req, ctx);
    }
    for (int j = 0; j < k && method == FERRY_RPC_STEP && atomic_load(&c->passive); j++)
        step_rejoin(c, servers[at[j]], calls, phys, first[j], first[j + 1], deadline_ms);
    for (int j = 0; j < k && method == FERRY_RPC_STEP && atomic_load(&c->passive); j++) {
        for (int e = first[j]; e < first[j + 1]; e++) {
            uint64_t ctx;
            if (calls[e].status == FERRY_OK && (ctx = req_ctx(method, calls[e].req)) != 0) {
                log_clear(c, servers[at[j]], ctx); /* the context ended on the shard */
                break;
            }
        }
    }
    for (int j = 0; j < k; j++) {
        int i = at[j], ok = -1, pick = first[j];
        for (int e = first[j]; e < first[j + 1]; e++) {
            pst[phys[e]] = calls[e].status;
            if (calls[e].status == FERRY_OK && ok < 0)
                ok = e;
        }
        if (ok >= 0 && method == FERRY_RPC_JOB && first[j + 1] - first[j] > 1)
            ok = job_pick(calls, first[j], first[j + 1], stale);
        if (ok < 0) {
            for (int e = first[j]; e < first[j + 1]; e++) {
                if (!calls[e].transport) {
                    pick = e;
                    break;
                }
            }
        } else {
            pick = ok;
            if (ok != first[j]) { /* its answer is the entry's */
                ferry_rpc_msg t = replies[i];
                replies[i] = extra[ok];
                extra[ok] = t;
            }
            for (int e = first[j]; e < first[j + 1]; e++) {
                if (calls[e].status != FERRY_OK)
                    replica_drop(c, phys[e], method, calls[e].error, 0);
                else if (stale[e])
                    replica_drop(c, phys[e], method,
                                 "a recover restored an older step: it missed steps", 1);
            }
        }
        res[i].client = c->all[phys[pick]];
        res[i].status = calls[pick].status;
        res[i].transport = calls[pick].transport;
        memcpy(res[i].error, calls[pick].error, sizeof res[i].error);
    }
    for (int e = 0; e < m; e++)
        ferry_rpc_msg_deinit(&extra[e]);
    free(calls);
    free(extra);
    free(phys);
    free(first);
    free(stale);
    return FERRY_OK;
}

/* The first failed entry's status (its detail in ferry_error_last), or FERRY_OK. */
static ferry_status fan_first(const ferry_rpc_fanout *res, int n) {
    for (int i = 0; i < n; i++) {
        if (res[i].status != FERRY_OK)
            return ferry_errorf(res[i].status, "%s", res[i].error);
    }
    return FERRY_OK;
}

/* The fan-out behind every ferry__dist_fanout*: calls that failed in transit go again
 * within the cluster's retry window when retry_ok, and when window_ms > 0 (a caller
 * with a limit of its own) only within window_ms of the call's start. */
static ferry_status fanout(ferry_cluster *c, ferry_rpc_method method, int n, const int *servers,
                           const ferry_rpc_msg *reqs, int shared, ferry_rpc_msg *replies,
                           int deadline_ms, void (*during)(void *arg), void *arg, int retry_ok,
                           int window_ms) {
    if (n == 0) {
        if (during != NULL)
            during(arg);
        return FERRY_OK;
    }
    int P = c->n * c->R;
    ferry_rpc_fanout *res = calloc((size_t)n, sizeof *res);
    int *idx = calloc((size_t)n, sizeof *idx);
    ferry_status *pst = calloc((size_t)P, sizeof *pst);
    unsigned char *said = calloc((size_t)P, 1);
    if (res == NULL || idx == NULL || pst == NULL || said == NULL) {
        free(res);
        free(idx);
        free(pst);
        free(said);
        return FERRY_NOMEM();
    }
    for (int i = 0; i < n; i++) {
        if (servers[i] < 0 || servers[i] >= c->n) {
            free(res);
            free(idx);
            free(pst);
            free(said);
            return ferry_errorf(FERRY_ERR_INVALID, "server %d outside [0, %d)", servers[i], c->n);
        }
        idx[i] = i;
    }
    double t_call = ferry_now(); /* a caller's window_ms counts from here */
    ferry_status st = fan_round(c, method, n, idx, servers, reqs, shared, replies, deadline_ms,
                                during, arg, res, pst);
    if (st == FERRY_OK)
        st = fan_first(res, n);
    /* A server that no longer knows this client's session (it restarted, or the session
     * expired) refused the call before running it: say Hello there again and send the
     * call once more. What the old session held is gone; the server says so then. */
    if (st == FERRY_ERR_SESSION && method != FERRY_RPC_HELLO) {
        int m = 0;
        ferry_status hs = FERRY_OK;
        for (int i = 0; i < n && hs == FERRY_OK; i++) {
            if (res[i].status != FERRY_ERR_SESSION)
                continue;
            for (int r = 0; r < c->R && hs == FERRY_OK; r++) {
                int p = servers[i] * c->R + r;
                if (pst[p] == FERRY_ERR_SESSION && !said[p]) { /* one Hello per server */
                    said[p] = 1;
                    hs = rehello(c, p);
                }
            }
            idx[m++] = i;
        }
        if (hs == FERRY_OK) {
            st = fan_round(c, method, m, idx, servers, reqs, shared, replies, deadline_ms, NULL,
                           NULL, res, pst);
            if (st == FERRY_OK)
                st = fan_first(res, n); /* the first entry that still failed, if any */
        }
    }
    int retry_ms = atomic_load(&c->retry_ms);
    double t0 = ferry_now();
    if (window_ms > 0 && window_ms < retry_ms) { /* the first round's time counts too */
        retry_ms = window_ms;
        t0 = t_call;
    }
    long pause_ms = 50;
    for (int attempt = 1; st != FERRY_OK && retry_ms > 0 && retry_ok; attempt++) {
        /* Only the calls that failed in transit go again; an answer from a server
         * (even an error) is final. */
        int m = 0;
        for (int i = 0; i < n; i++) {
            if (res[i].status == FERRY_OK)
                continue;
            if (!res[i].transport)
                m = -1;
            if (m < 0)
                break;
            idx[m++] = i;
        }
        double spent = ferry_now() - t0;
        if (m <= 0 || spent * 1000.0 + (double)pause_ms > retry_ms)
            break;
        if (attempt == 1)
            FERRY_LOG_WARN("%s; sending it again (same ids) for up to %.0f s", ferry_error_last(),
                           retry_ms / 1000.0);
        struct timespec ts = {pause_ms / 1000, (pause_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        /* Short pauses: a restarted server is reached within a second of listening
         * (the channel reconnects within 250 ms, transport-grpc.c). */
        pause_ms = pause_ms * 2 > 250 ? 250 : pause_ms * 2;
        atomic_fetch_add(&c->retries, (uint64_t)m);
        /* No attempt runs past the window. */
        int dl = deadline_ms > 0 ? deadline_ms : c->cfg.deadline_ms;
        double left_ms = retry_ms - (ferry_now() - t0) * 1000.0;
        if (left_ms < dl)
            dl = left_ms > 100.0 ? (int)left_ms : 100;
        st = fan_round(c, method, m, idx, servers, reqs, shared, replies, dl, NULL, NULL, res, pst);
        if (st == FERRY_OK)
            st = fan_first(res, n);
        if (st == FERRY_OK)
            FERRY_LOG_WARN("%s %s answered after %d %s (%.1f s)",
                           ferry_rpc_client_target(res[idx[0]].client),
                           ferry_rpc_method_name(method), attempt,
                           attempt == 1 ? "retry" : "retries", ferry_now() - t0);
    }
    free(res);
    free(idx);
    free(pst);
    free(said);
    return st;
}

ferry_status ferry__dist_fanout_during(ferry_cluster *c, ferry_rpc_method method, int n,
                                       const int *servers, const ferry_rpc_msg *reqs, int shared,
                                       ferry_rpc_msg *replies, int deadline_ms,
                                       void (*during)(void *arg), void *arg) {
    return fanout(c, method, n, servers, reqs, shared, replies, deadline_ms, during, arg,
                  retry_safe(method), 0);
}

ferry_status ferry__dist_fanout_retry(ferry_cluster *c, ferry_rpc_method method, int n,
                                      const int *servers, const ferry_rpc_msg *reqs, int shared,
                                      ferry_rpc_msg *replies) {
    return fanout(c, method, n, servers, reqs, shared, replies, c->cfg.deadline_ms, NULL, NULL, 1,
                  0);
}

ferry_status ferry__dist_fanout_retry_deadline(ferry_cluster *c, ferry_rpc_method method, int n,
                                               const int *servers, const ferry_rpc_msg *reqs,
                                               int shared, ferry_rpc_msg *replies, int deadline_ms,
                                               int window_ms) {
    return fanout(c, method, n, servers, reqs, shared, replies, deadline_ms, NULL, NULL, 1,
                  window_ms);
}

ferry_status ferry__dist_fanout_deadline(ferry_cluster *c, ferry_rpc_method method, int n,
                                         const int *servers, const ferry_rpc_msg *reqs, int shared,
                                         ferry_rpc_msg *replies, int deadline_ms) {
    return ferry__dist_fanout_during(c, method, n, servers, reqs, shared, replies, deadline_ms,
                                     NULL, NULL);
}

ferry_status ferry__dist_output_as(ferry_cluster *c, int server, const ferry_rpc_msg *reply,
                                   const char *name, int dtype, int ndim, const int64_t *want,
                                   const ferry_rpc_tensor **out) {
    const ferry_rpc_tensor *t = ferry_rpc_msg_find(reply, name);
    int ok = t != NULL && t->dtype == dtype && t->ndim == ndim;
    for (int k = 0; ok && k < ndim; k++)
        ok = want[k] < 0 || t->dim[k] == want[k];
    if (!ok)
        return ferry_errorf(FERRY_ERR_FORMAT,
                            "%s: the reply %s tensor '%s' of the expected type and shape",
                            ferry_rpc_client_target(c->clients[server]),
                            t == NULL ? "lacks" : "has a mismatched", name);
    *out = t;
    return FERRY_OK;
}

/* ---- connect, Hello ---- */

/* The Hello request every server gets. */
static void hello_request(ferry_cluster *c, Ferry__V1__HelloRequest *q) {
    ferry__v1__hello_request__init(q);
    q->label = c->client_id;
    q->worker_id = c->cfg.worker_id;
    q->version = (char *)FERRY_VERSION;
    q->contract_major = FERRY_CONTRACT_MAJOR;
}

/* Takes server i's Hello reply: the contract it speaks, its incarnation (a change:
 * it restarted) and the session it opened or renewed, which the server's RPC client
 * sends from now on (holding its Session stream open). *changed += 1 on a restart. */
static ferry_status hello_apply(ferry_cluster *c, int i, const Ferry__V1__HelloReply *r,
                                int *changed) {
    const char *target = ferry_rpc_client_target(c->all[i]);
    if (r->contract_major != FERRY_CONTRACT_MAJOR)
        return ferry_errorf(FERRY_ERR_UNSUPPORTED,
                            "%s speaks contract %u.%u; this client speaks %d.%d (ferry.v1)", target,
                            r->contract_major, r->contract_minor, FERRY_CONTRACT_MAJOR,
                            FERRY_CONTRACT_MINOR);
    if (atomic_load(&c->passive) && r->contract_minor < 3)
        return ferry_errorf(FERRY_ERR_UNSUPPORTED,
                            "%s speaks contract %u.%u: it cannot be a replica of this "
                            "primary-backup job (1.3 or later)",
                            target, r->contract_major, r->contract_minor);
    if (c->incarnation[i] != 0 && c->incarnation[i] != r->incarnation) {
        FERRY_LOG_WARN("%s restarted: incarnation %016llx, was %016llx", target,
                       (unsigned long long)r->incarnation, (unsigned long long)c->incarnation[i]);
        ++*changed;
    }
    c->incarnation[i] = r->incarnation;
    c->min_minor = (int)r->contract_minor < c->min_minor ? (int)r->contract_minor : c->min_minor;
    (void)snprintf(c->identity, sizeof c->identity, "%s", r->identity);
    /* Context calls now name it: a later restart refuses them instead of serving them
     * from a new state. */
    ferry_rpc_client_set_incarnation(c->all[i], r->incarnation);
    return ferry_rpc_client_set_session(c->all[i], r->session, 1);
}

ferry_status ferry_cluster_hello(ferry_cluster *c, int *restarted) {
    Ferry__V1__HelloRequest q;
    hello_request(c, &q);
    int P = c->n * c->R, m = 0;
    ferry_rpc_msg req, *replies = calloc((size_t)P, sizeof *replies);
    ferry_rpc_fanout *calls = calloc((size_t)P, sizeof *calls);
    int *phys = calloc((size_t)P, sizeof *phys);
    ferry_rpc_msg_init(&req);
    ferry_status st =
        replies && calls && phys ? ferry_rpc_msg_set_head(&req, &q.base) : FERRY_NOMEM();
    for (int g = 0; st == FERRY_OK && g < c->n; g++) /* every replica still called */
        m += replicas_live(c, g, &phys[m]);
    for (int e = 0; st == FERRY_OK && e < m; e++) {
        ferry_rpc_msg_init(&replies[e]);
        calls[e] = (ferry_rpc_fanout){.client = c->all[phys[e]],
                                      .method = FERRY_RPC_HELLO,
                                      .req = &req,
                                      .reply = &replies[e]};
    }
    if (st == FERRY_OK)
        st = ferry_rpc_call_many(calls, m, c->cfg.deadline_ms);
    int changed = 0;
    pthread_mutex_lock(&c->hello_mu);
    for (int e = 0; st == FERRY_OK && e < m; e++)
        st = hello_apply(c, phys[e], replies[e].head, &changed);
    pthread_mutex_unlock(&c->hello_mu);
    for (int e = 0; replies != NULL && e < m; e++)
        ferry_rpc_msg_deinit(&replies[e]);
    ferry_rpc_msg_deinit(&req);
    free(replies);
    free(calls);
    free(phys);
    if (st == FERRY_OK && restarted != NULL)
        *restarted = changed;
    return st;
}

/* Hello to replica p alone, after a call found its session gone (the server restarted
 * or the session expired): a new session for the calls that follow. */
static ferry_status rehello(ferry_cluster *c, int p) {
    ferry_status st = hello_one(c, p, c->cfg.deadline_ms);
    if (st == FERRY_OK)
        FERRY_LOG_INFO("%s: a new session (the last one was gone)",
                       ferry_rpc_client_target(c->all[p]));
    return st;
}

/* Hello to replica p alone, within deadline_ms. */
static ferry_status hello_one(ferry_cluster *c, int p, int deadline_ms) {
    Ferry__V1__HelloRequest q;
    hello_request(c, &q);
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    ferry_status st = ferry_rpc_msg_set_head(&req, &q.base);
    if (st == FERRY_OK)
        st = ferry_rpc_call(c->all[p], FERRY_RPC_HELLO, &req, &reply, deadline_ms);
    int changed = 0;
    pthread_mutex_lock(&c->hello_mu);
    if (st == FERRY_OK)
        st = hello_apply(c, p, reply.head, &changed);
    pthread_mutex_unlock(&c->hello_mu);
    ferry_rpc_msg_deinit(&reply);
    ferry_rpc_msg_deinit(&req);
    return st;
}

static void free_list(char **list, int n) {
    for (int i = 0; list != NULL && i < n; i++)
        free(list[i]);
    free(list);
}

/* Splits "a:1, b:2" into trimmed targets; FERRY_ERR_INVALID for an empty entry. */
static ferry_status parse_targets(const char *targets, char ***out, int *n) {
    const char *text = targets != NULL ? targets : "";
    int count = 1;
    for (const char *p = text; *p != '\0'; p++)
        count += *p == ',';
    if (count > FERRY_DIST_MAX_SERVERS)
        return ferry_errorf(FERRY_ERR_INVALID, "server list has %d entries, at most %d", count,
                            FERRY_DIST_MAX_SERVERS);
    char **list = calloc((size_t)count, sizeof *list);
    if (list == NULL)
        return FERRY_NOMEM();
    const char *p = text;
    for (int i = 0; i < count; i++) {
        const char *end = strchr(p, ',');
        if (end == NULL)
            end = p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && isspace((unsigned char)*a))
            a++;
        while (b > a && isspace((unsigned char)b[-1]))
            b--;
        if (a == b) {
            free_list(list, count);
            return ferry_errorf(FERRY_ERR_INVALID,
                                "server list '%s' has an empty entry (HOST:PORT[,HOST:PORT...])",
                                text);
        }
        if ((list[i] = strndup(a, (size_t)(b - a))) == NULL) {
            free_list(list, count);
            return FERRY_NOMEM();
        }
        p = end + 1;
    }
    *out = list;
    *n = count;
    return FERRY_OK;
}

/* A target gRPC would take as HOST:PORT (or a scheme of its own: unix:, dns:, ...).
 * *host receives the host part when it should be resolved here. */
static ferry_status check_target(const char *t, char *host, size_t cap) {
    host[0] = '\0';
    if (strncmp(t, "unix:", 5) == 0 || strncmp(t, "dns:", 4) == 0 ||
        strncmp(t, "ipv4:", 5) == 0 || strncmp(t, "ipv6:", 5) == 0)
        return FERRY_OK;
    const char *colon = strrchr(t, ':');
    if (colon == NULL || colon == t)
        return ferry_errorf(FERRY_ERR_INVALID, "server '%s': want HOST:PORT", t);
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (colon[1] == '\0' || *end != '\0' || port < 1 || port > 65535)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "server '%s': port '%s' is not a number in 1..65535 (HOST:PORT)", t,
                            colon + 1);
    const char *h = t;
    size_t hl = (size_t)(colon - t);
    if (h[0] == '[' && hl >= 2 && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    if (hl >= cap)
        return ferry_errorf(FERRY_ERR_INVALID, "server '%s': host name too long", t);
    memcpy(host, h, hl);
    host[hl] = '\0';
    return FERRY_OK;
}

/* Resolves host: FERRY_OK; FERRY_ERR_NOT_FOUND for a name the resolver says does not
 * exist; FERRY_ERR_UNAVAILABLE for a temporary failure (no answer from DNS). */
static ferry_status resolve(const char *target, const char *host) {
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    int e = getaddrinfo(host, NULL, &hints, &ai);
    if (ai != NULL)
        freeaddrinfo(ai);
    if (e == 0)
        return FERRY_OK;
    if (e == EAI_AGAIN)
        return ferry_errorf(FERRY_ERR_UNAVAILABLE, "server '%s': cannot resolve host '%s' (%s)",
                            target, host, gai_strerror(e));
    return ferry_errorf(FERRY_ERR_NOT_FOUND, "server '%s': cannot resolve host '%s' (%s)", target,
                        host, gai_strerror(e));
}

/* ---- TLS failures, told apart ---- */

/* The reason OpenSSL gave inside gRPC's message ("... SSL routines::certificate verify
 * failed"), into out; "" when there is none. */
ferry_status ferry__dist_replica_hello(ferry_cluster *c, int p, int deadline_ms) {
    if (p < 0 || p >= c->n * c->R)
        return ferry_errorf(FERRY_ERR_INVALID, "replica %d outside [0, %d)", p, c->n * c->R);
    /* A dropped replica's channel may still be backing off from the connection it lost:
     * this Hello waits for it to connect (within deadline_ms) instead of failing at once,
     * so that every rank that re-admits it reaches it alike. */
    ferry_rpc_client_set_wait_for_ready(c->all[p], 1);
    ferry_status st = hello_one(c, p, deadline_ms);
    ferry_rpc_client_set_wait_for_ready(c->all[p], atomic_load(&c->wait_ready));
    return st;
}

static void ssl_reason(const char *why, char *out, size_t cap) {
    const char *p = strstr(why, "routines::");
    p = p != NULL ? p + strlen("routines::") : NULL;
    (void)snprintf(out, cap, "%.*s", p != NULL ? (int)strcspn(p, ";,)") : 0, p != NULL ? p : "");
}

/* A call to server i that failed in transit (st, with ferry_error_last): when TLS on
 * one side only, or a certificate the other side refused, is the cause, a
 * FERRY_ERR_AUTH that says so and what to do; otherwise st unchanged. gRPC reports a
 * plaintext client on a TLS port, and a client certificate the server refuses, only
 * as "Socket closed": one probe of the port (ferry_rpc_probe_tls) tells whether it
 * speaks TLS. A refused connection is not probed. */
static ferry_status explain_tls(ferry_cluster *c, int i, ferry_status st) {
    char why[512], host[256], reason[128];
    (void)snprintf(why, sizeof why, "%s", ferry_error_last());
    const char *target = ferry_rpc_client_target(c->all[i]);
    const char *colon = strrchr(target, ':');
    int handshake = strstr(why, "andshake") != NULL, closed = strstr(why, "Socket closed") != NULL;
    if (st != FERRY_ERR_UNAVAILABLE || (!handshake && !closed) || colon == NULL ||
        check_target(target, host, sizeof host) != FERRY_OK || host[0] == '\0')
        return st;
    int tls = 0;
    if (ferry_rpc_probe_tls(host, colon + 1, 1000, &tls) != FERRY_OK) {
        (void)ferry_errorf(st, "%s", why); /* the probe's own failure is not the story */
        return st;
    }
    ssl_reason(why, reason, sizeof reason);
    if (c->tls == 0 && tls)
        return ferry_errorf(FERRY_ERR_AUTH,
                            "%s: TLS mismatch: the server speaks TLS and this client connected "
                            "without it; connect with TLS, trusting the CA that signed the "
                            "server's certificate (and, for mutual TLS, with a client "
                            "certificate and key that the server's CA signed)",
                            target);
    if (c->tls != 0 && !tls && handshake)
        return ferry_errorf(FERRY_ERR_AUTH,
                            "%s: TLS mismatch: this client connected with TLS and the server "
                            "does not speak it (%s); connect without TLS, or start the server "
                            "with a certificate and key",
                            target, reason[0] != '\0' ? reason : "TLS handshake failed");
    if (c->tls != 0 && tls && handshake)
        return ferry_errorf(FERRY_ERR_AUTH,
                            "%s: TLS: this client refused the server's certificate (%s): it must "
                            "be signed by the CA this client trusts and name the host it "
                            "connects to",
                            target, reason[0] != '\0' ? reason : "handshake failed");
    if (c->tls != 0 && tls && closed)
        return ferry_errorf(FERRY_ERR_AUTH,
                            "%s: TLS: the server closed the connection right after the TLS "
                            "handshake: it wants mutual TLS, a client certificate signed by its "
                            "own CA, and %s",
                            target,
                            c->tls == 2 ? "refused the one this client sent (another CA?)"
                                        : "this client sent none");
    (void)ferry_errorf(st, "%s", why);
    return st;
}

/* Says Hello until every server answers or connect_timeout_ms passes, telling apart
 * a host that does not resolve (retried only for resolve_timeout_ms), a refused
 * connection, a TLS mismatch (never retried) and a server that does not answer. */
static ferry_status connect_all(ferry_cluster *c, char **list) {
    double t0 = ferry_now(), limit = c->cfg.connect_timeout_ms / 1000.0;
    double resolve_limit = c->cfg.resolve_timeout_ms / 1000.0;
    char waiting[600] = "";
    ferry_status st;
    for (;;) {
        st = FERRY_OK;
        char host[256];
        for (int i = 0; i < c->n * c->R && st == FERRY_OK; i++) {
            if ((st = check_target(list[i], host, sizeof host)) == FERRY_OK && host[0] != '\0')
                st = resolve(list[i], host);
        }
        if (st == FERRY_OK) {
            ferry_cluster_set_wait_for_ready(c, 0); /* a refusal comes back at once */
            st = ferry_cluster_hello(c, NULL);
            ferry_cluster_set_wait_for_ready(c, c->cfg.wait_for_ready);
        }
        for (int i = 0; st == FERRY_ERR_UNAVAILABLE && i < c->n * c->R; i++) {
            if (strncmp(ferry_error_last(), list[i], strlen(list[i])) == 0 &&
                ferry_error_last()[strlen(list[i])] == ' ')
                st = explain_tls(c, i, st); /* "<target> Hello: ..." */
        }
        double waited = ferry_now() - t0;
        if (st != FERRY_ERR_UNAVAILABLE && st != FERRY_ERR_NOT_FOUND)
            break;
        char why[512];
        (void)snprintf(why, sizeof why, "%s", ferry_error_last());
        char what[600];
        if (strstr(why, "onnection refused") != NULL) {
            const char *sp = strchr(why, ' '); /* "<target> Hello: ..." */
            (void)snprintf(what, sizeof what, "cannot connect to %.*s: connection refused "
                           "(nothing listens on that port)", (int)(sp != NULL ? sp - why : 0), why);
        } else {
            (void)snprintf(what, sizeof what, "%s", why);
        }
        /* A name that does not resolve is a typo unless resolve_limit says otherwise. */
        double lim = st == FERRY_ERR_NOT_FOUND ? resolve_limit : limit;
        if (waited >= lim)
            return lim > 0 ? ferry_errorf(st, "%s (still, after waiting %g s for the servers)",
                                          what, lim)
                           : ferry_errorf(st, "%s", what);
        if (strcmp(waiting, what) != 0) {
            FERRY_LOG_WARN("waiting for the servers: %s; trying again for up to %.3g s", what,
                           lim - waited);
            (void)snprintf(waiting, sizeof waiting, "%s", what);
        }
        struct timespec ts = {0, 250000000L};
        nanosleep(&ts, NULL);
    }
    if (st == FERRY_ERR_TIMEOUT) {
        char why[512];
        (void)snprintf(why, sizeof why, "%s", ferry_error_last());
        return ferry_errorf(st, "%s: the server took the connection but did not answer in time",
                            why);
    }
    return st;
}

/* Parses targets and makes one RPC client per server, without any call. */
static ferry_status cluster_open(const char *targets, const ferry_cluster_config *cfg,
                                 ferry_cluster **out, char ***list_out) {
    char **list = NULL;
    int n = 0;
    ferry_status st = parse_targets(targets, &list, &n);
    if (st != FERRY_OK)
        return st;
    ferry_cluster *c = calloc(1, sizeof *c);
    if (c == NULL) {
        st = FERRY_NOMEM();
        goto done;
    }
    pthread_mutex_init(&c->hello_mu, NULL);
    pthread_mutex_init(&c->log_mu, NULL);
    if (cfg != NULL)
        c->cfg = *cfg;
    else
        ferry_cluster_config_default(&c->cfg);
    if (c->cfg.deadline_ms <= 0)
        c->cfg.deadline_ms = FERRY_RPC_DEFAULT_DEADLINE_MS;
    char host[64] = "localhost";
    (void)gethostname(host, sizeof host - 1);
    (void)snprintf(c->client_id, sizeof c->client_id, "%s",
                   cfg != NULL && cfg->client_id != NULL ? cfg->client_id : "");
    if (c->client_id[0] == '\0')
        (void)snprintf(c->client_id, sizeof c->client_id, "ferry@%s:%d", host, (int)getpid());
    c->cfg.client_id = NULL;
    /* Context ids: the clock in microseconds seeds the counter, so a restarted client
     * never reuses the id of a context its previous run may have left on a server. */
    struct timespec ts;
    (void)clock_gettime(CLOCK_REALTIME, &ts);
    atomic_init(&c->next_ctx, (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u);
    atomic_init(&c->retry_ms, c->cfg.retry_ms > 0 ? c->cfg.retry_ms : 0);
    atomic_init(&c->retries, 0);
    c->R = c->cfg.replicas > 1 ? c->cfg.replicas : 1;
    if (n % c->R != 0) {
        st = ferry_errorf(FERRY_ERR_INVALID,
                          "%d servers for %d replicas per shard: list each shard's %d replicas "
                          "side by side (a multiple of %d servers)",
                          n, c->R, c->R, c->R);
        goto done;
    }
    for (int i = 0; i < n && c->R > 1; i++) {
        for (int k = 0; k < i; k++) {
            if (strcmp(list[i], list[k]) == 0) {
                st = ferry_errorf(FERRY_ERR_INVALID,
                                  "server %s is listed twice: each replica is a server of its own",
                                  list[i]);
                goto done;
            }
        }
    }
    c->clients = calloc((size_t)(n / c->R), sizeof *c->clients);
    c->all = calloc((size_t)n, sizeof *c->all);
    c->live = calloc((size_t)n, sizeof *c->live);
    c->incarnation = calloc((size_t)n, sizeof *c->incarnation);
    if (c->R > 1)
        c->log = calloc((size_t)(n / c->R), sizeof *c->log);
    atomic_init(&c->dropped, 0);
    atomic_init(&c->passive, 0);
    atomic_init(&c->wait_ready, c->cfg.wait_for_ready);
    c->min_minor = INT32_MAX;
    atomic_store(&c->lose_method, -1);
    if (c->clients == NULL || c->all == NULL || c->live == NULL || c->incarnation == NULL) {
        st = FERRY_NOMEM();
        goto done;
    }
    ferry_rpc_client_config rc = {.max_message_bytes = c->cfg.max_message_bytes,
                                  .deadline_ms = c->cfg.deadline_ms,
                                  .wait_for_ready = c->cfg.wait_for_ready};
    rc.token = c->cfg.token;
    rc.client_name = c->client_id;
    char *pem[3] = {NULL, NULL, NULL};
    const char *files[3] = {c->cfg.tls_ca_file, c->cfg.tls_cert_file, c->cfg.tls_key_file};
    if ((files[1] != NULL) != (files[2] != NULL) || (files[1] != NULL && files[0] == NULL))
        st = ferry_errorf(FERRY_ERR_INVALID, "TLS: a client certificate and key go together, "
                                             "and with a CA to verify the servers");
    for (int i = 0; i < 3 && st == FERRY_OK; i++) {
        if (files[i] != NULL)
            st = ferry_file_read_text(files[i], 1 << 20, &pem[i]);
    }
    c->tls = files[0] == NULL ? 0 : files[1] == NULL ? 1 : 2;
    rc.tls_ca_pem = pem[0];
    rc.tls_cert_pem = pem[1];
    rc.tls_key_pem = pem[2];
    int made = 0;
    for (; st == FERRY_OK && made < n; made++) {
        if ((st = ferry_rpc_client_create(list[made], &rc, &c->all[made])) != FERRY_OK)
            break;
        c->live[made] = 1;
    }
    if (st != FERRY_OK) {
        for (int i = 0; i < made; i++)
            ferry_rpc_client_destroy(c->all[i]);
        made = 0;
    }
    c->n = made / c->R;
    for (int g = 0; g < c->n; g++)
        c->clients[g] = c->all[g * c->R];
    for (int i = 0; i < 3; i++)
        ferry_secret_free(pem[i]);
    c->cfg.token = NULL; /* the rpc clients keep their own copies */
    c->cfg.tls_ca_file = c->cfg.tls_cert_file = c->cfg.tls_key_file = NULL;
    if (st != FERRY_OK)
        goto done;
    *out = c;
    c = NULL;
    if (list_out != NULL) {
        *list_out = list;
        list = NULL;
    }
done:
    ferry_cluster_destroy(c);
    free_list(list, n);
    return st;
}

ferry_status ferry_ps_open(const char *targets, const ferry_cluster_config *cfg,
                           ferry_cluster **out) {
    ferry_cluster *c = NULL;
    char **list = NULL;
    ferry_status st = cluster_open(targets, cfg, &c, &list);
    char host[256];
    for (int i = 0; st == FERRY_OK && i < c->n * c->R; i++) {
        if ((st = check_target(list[i], host, sizeof host)) == FERRY_OK && host[0] != '\0')
            st = resolve(list[i], host);
    }
    int n = c != NULL ? c->n * c->R : 0;
    free_list(list, n);
    if (st != FERRY_OK) {
        ferry_cluster_destroy(c);
        return st;
    }
    *out = c;
    return FERRY_OK;
}

ferry_status ferry_ps_connect(const char *targets, const ferry_cluster_config *cfg,
                              ferry_cluster **out) {
    ferry_cluster *c = NULL;
    char **list = NULL;
    ferry_status st = cluster_open(targets, cfg, &c, &list);
    if (st != FERRY_OK)
        return st;
    int n = c->n * c->R;
    if ((st = connect_all(c, list)) == FERRY_OK) {
        FERRY_LOG_DEBUG("connected to %d ferry-ps servers (%s)", n, targets);
        *out = c;
        c = NULL;
    }
    free_list(list, n);
    ferry_cluster_destroy(c);
    return st;
}

ferry_status ferry_cluster_retarget(ferry_cluster *c, const char *targets,
                                    const ferry_cluster_config *cfg) {
    if (c->R > 1)
        return ferry_errorf(FERRY_ERR_UNSUPPORTED,
                            "the servers of a cluster with replicas (--replicas) do not change");
    ferry_cluster *d = NULL;
    char **list = NULL;
    ferry_cluster_config dc = *cfg;
    dc.client_id = c->client_id; /* the same label on the new servers */
    dc.replicas = 1;
    ferry_status st = cluster_open(targets, &dc, &d, &list);
    if (st != FERRY_OK)
        return st;
    int *from = malloc(((size_t)d->n + 1) * sizeof *from); /* c's index of each kept one */
    if (from == NULL)
        st = FERRY_NOMEM();
    /* A server of both lists keeps its connection and its session (the job's rank is
     * held by that session there). */
    for (int i = 0; st == FERRY_OK && i < d->n; i++) {
        from[i] = -1;
        for (int k = 0; k < c->n && from[i] < 0; k++) {
            if (c->all[k] == NULL || strcmp(ferry_rpc_client_target(c->all[k]), list[i]) != 0)
                continue;
            ferry_rpc_client_destroy(d->all[i]);
            d->all[i] = c->all[k];
            d->incarnation[i] = c->incarnation[k];
            c->all[k] = NULL;
            from[i] = k;
        }
    }
    d->min_minor = c->min_minor;
    for (int i = 0; st == FERRY_OK && i < d->n; i++) {
        d->clients[i] = d->all[i];
        ferry_rpc_client_set_wait_for_ready(d->all[i], atomic_load(&c->wait_ready));
        if (from[i] < 0)
            st = hello_one(d, i, c->cfg.deadline_ms);
    }
    if (st != FERRY_OK) { /* c keeps its servers: the kept clients go back */
        for (int i = 0; from != NULL && i < d->n; i++) {
            if (from[i] >= 0) {
                c->all[from[i]] = d->all[i];
                d->all[i] = NULL;
            }
        }
        free(from);
        free_list(list, d->n);
        ferry_cluster_destroy(d);
        return st;
    }
    /* The servers left behind: their bytes stay counted. */
    for (int k = 0; k < c->n; k++) {
        uint64_t a = 0, b = 0;
        if (c->all[k] != NULL)
            ferry_rpc_client_bytes(c->all[k], &a, &b);
        atomic_fetch_add(&c->gone_sent, a);
        atomic_fetch_add(&c->gone_received, b);
    }
    pthread_mutex_lock(&c->hello_mu);
#define SWAP_(f)                                                                                   \
    do {                                                                                           \
        __typeof__(c->f) tmp_ = c->f;                                                              \
        c->f = d->f;                                                                               \
        d->f = tmp_;                                                                               \
    } while (0)
    SWAP_(n);
    SWAP_(clients);
    SWAP_(all);
    SWAP_(live);
    SWAP_(incarnation);
#undef SWAP_
    c->min_minor = d->min_minor < c->min_minor ? d->min_minor : c->min_minor;
    pthread_mutex_unlock(&c->hello_mu);
    FERRY_LOG_INFO("servers now %s (%d)", targets, c->n);
    free(from);
    free_list(list, c->n);
    ferry_cluster_destroy(d); /* the servers left: their connections close */
    return FERRY_OK;
}

void ferry_cluster_destroy(ferry_cluster *c) {
    if (c == NULL)
        return;
    for (int i = 0; c->all != NULL && i < c->n * c->R; i++)
        ferry_rpc_client_destroy(c->all[i]);
    free(c->clients);
    free(c->all);
    free(c->live);
    free(c->incarnation);
    log_free(c);
    pthread_mutex_destroy(&c->log_mu);
    pthread_mutex_destroy(&c->hello_mu);
    free(c);
}

int ferry_cluster_size(const ferry_cluster *c) {
    return c->n;
}

void ferry_cluster_set_retry(ferry_cluster *c, int retry_ms) {
    if (c != NULL)
        atomic_store(&c->retry_ms, retry_ms > 0 ? retry_ms : 0);
}

const double ferry_call_latency_bounds[FERRY_CALL_LATENCY_BUCKETS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0};
_Static_assert(FERRY_CALL_LATENCY_BUCKETS == FERRY_RPC_LATENCY_BUCKETS, "one set of buckets");

ferry_status ferry_cluster_call_stats(ferry_cluster *c, int server, const char *method,
                                      ferry_call_stats *out) {
    memset(out, 0, sizeof *out);
    if (server < 0 || server >= c->n)
        return ferry_errorf(FERRY_ERR_INVALID, "server %d outside [0, %d)", server, c->n);
    for (int m = 0; m < FERRY_RPC_METHOD_COUNT; m++) {
        if (strcmp(ferry_rpc_method_name((ferry_rpc_method)m), method) != 0)
            continue;
        ferry_rpc_method_stats ms;
        ferry_rpc_client_method_stats(c->clients[server], m, &ms);
        for (int k = 0; k < FERRY_RPC_CODES; k++) {
            out->calls += ms.calls[k];
            out->errors += k != 0 ? ms.calls[k] : 0;
        }
        memcpy(out->buckets, ms.buckets, sizeof out->buckets);
        out->over = ms.over;
        out->sum_s = ms.sum_s;
        return FERRY_OK;
    }
    return ferry_errorf(FERRY_ERR_INVALID, "no method '%s'", method);
}

ferry_status ferry_cluster_health(ferry_cluster *c, int server, int *serving) {
    if (server < 0 || server >= c->n)
        return ferry_errorf(FERRY_ERR_INVALID, "server %d outside [0, %d)", server, c->n);
    ferry_rpc_client *cl = c->clients[server];
    ferry_status st = ferry_rpc_health_check(cl, c->cfg.deadline_ms, serving);
    for (int p = 0; p < c->n * c->R; p++) {
        if (c->all[p] == cl)
            st = explain_tls(c, p, st);
    }
    return st;
}

uint64_t ferry_cluster_retries(const ferry_cluster *c) {
    return atomic_load(&((ferry_cluster *)(uintptr_t)c)->retries);
}

void ferry_cluster_set_wait_for_ready(ferry_cluster *c, int on) {
    if (c != NULL)
        atomic_store(&c->wait_ready, on);
    for (int i = 0; c != NULL && i < c->n * c->R; i++) {
        if (c->all[i] != NULL)
            ferry_rpc_client_set_wait_for_ready(c->all[i], on);
    }
}

const char *ferry_cluster_target(const ferry_cluster *c, int server) {
    return server >= 0 && server < c->n ? ferry_rpc_client_target(c->clients[server]) : "?";
}

uint64_t ferry_cluster_incarnation(const ferry_cluster *c, int server) {
    for (int p = 0; server >= 0 && server < c->n && p < c->n * c->R; p++) {
        if (c->all[p] == c->clients[server])
            return c->incarnation[p];
    }
    return 0;
}

int ferry_cluster_replicas(const ferry_cluster *c, int server, int *live) {
    ferry_cluster *w = (ferry_cluster *)(uintptr_t)c;
    int k = 0;
    pthread_mutex_lock(&w->hello_mu);
    for (int r = 0; server >= 0 && server < c->n && r < c->R; r++)
        k += c->live[server * c->R + r];
    pthread_mutex_unlock(&w->hello_mu);
    if (live != NULL)
        *live = k;
    return c->R;
}

uint64_t ferry_cluster_replicas_dropped(ferry_cluster *c, char *last, size_t cap) {
    pthread_mutex_lock(&c->hello_mu);
    if (last != NULL && cap > 0)
        (void)snprintf(last, cap, "%s", c->last_drop);
    uint64_t n = atomic_load(&c->dropped);
    pthread_mutex_unlock(&c->hello_mu);
    return n;
}

void ferry_cluster_bytes(ferry_cluster *c, uint64_t *sent, uint64_t *received) {
    uint64_t s = atomic_load(&c->gone_sent), r = atomic_load(&c->gone_received);
    for (int i = 0; i < c->n * c->R; i++) {
        uint64_t a, b;
        ferry_rpc_client_bytes(c->all[i], &a, &b);
        s += a;
        r += b;
    }
    *sent = s;
    *received = r;
}

/* ---- admin calls ---- */

ferry_status ferry_cluster_metrics(ferry_cluster *c, int server, const char *prefix,
                                   void (*fn)(void *user, const char *name, double value),
                                   void *user) {
    if (server < 0 || server >= c->n)
        return ferry_errorf(FERRY_ERR_INVALID, "server %d outside [0, %d)", server, c->n);
    Ferry__V1__StatsRequest q;
    ferry__v1__stats_request__init(&q);
    q.prefix = (char *)(uintptr_t)(prefix != NULL ? prefix : "");
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    ferry_status st = ferry_rpc_msg_set_head(&req, &q.base);
    if (st == FERRY_OK)
        st = ferry_rpc_call(c->clients[server], FERRY_RPC_STATS, &req, &reply, c->cfg.deadline_ms);
    if (st == FERRY_OK) {
        const Ferry__V1__StatsReply *r = reply.head;
        for (size_t i = 0; i < r->n_metrics; i++)
            fn(user, r->metrics[i]->name, r->metrics[i]->value);
    }
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
    return st;
}

ferry_status ferry_cluster_stats(ferry_cluster *c, int server, ferry_ps_stats *out) {
    if (server < 0 || server >= c->n)
        return ferry_errorf(FERRY_ERR_INVALID, "server %d outside [0, %d)", server, c->n);
    Ferry__V1__StatsRequest q;
    ferry__v1__stats_request__init(&q);
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    ferry_status st = ferry_rpc_msg_set_head(&req, &q.base);
    if (st == FERRY_OK)
        st = ferry_rpc_call(c->clients[server], FERRY_RPC_STATS, &req, &reply, c->cfg.deadline_ms);
    if (st == FERRY_OK) {
        const Ferry__V1__StatsReply *r = reply.head;
        memset(out, 0, sizeof *out);
        static const struct {
            const char *name;
            size_t off;
        } fields[] = {
            {"contexts_live", offsetof(ferry_ps_stats, contexts_live)},
            {"context_bytes", offsetof(ferry_ps_stats, context_bytes)},
            {"contexts_created", offsetof(ferry_ps_stats, contexts_created)},
            {"contexts_stepped", offsetof(ferry_ps_stats, contexts_stepped)},
            {"contexts_released", offsetof(ferry_ps_stats, contexts_released)},
            {"contexts_swept", offsetof(ferry_ps_stats, contexts_swept)},
            {"modules", offsetof(ferry_ps_stats, modules)},
            {"calls", offsetof(ferry_ps_stats, calls)},
            {"errors", offsetof(ferry_ps_stats, errors)},
        };
        for (size_t i = 0; i < r->n_metrics; i++) {
            for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
                if (strcmp(r->metrics[i]->name, fields[f].name) == 0)
                    *(int64_t *)((char *)out + fields[f].off) = (int64_t)r->metrics[i]->value;
            }
        }
    }
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
    return st;
}

/* One header to the given servers (or all, for server < 0), replies discarded. */
static ferry_status broadcast(ferry_cluster *c, int server, ferry_rpc_method method,
                              const ProtobufCMessage *head, int retry_ok) {
    if (server >= c->n)
        return ferry_errorf(FERRY_ERR_INVALID, "server %d outside [0, %d)", server, c->n);
    int n = server < 0 ? c->n : 1;
    int *servers = calloc((size_t)n, sizeof *servers);
    ferry_rpc_msg req, *replies = calloc((size_t)n, sizeof *replies);
    ferry_rpc_msg_init(&req);
    ferry_status st = servers && replies ? ferry_rpc_msg_set_head(&req, head) : FERRY_NOMEM();
    for (int i = 0; servers != NULL && replies != NULL && i < n; i++) {
        servers[i] = server < 0 ? i : server;
        ferry_rpc_msg_init(&replies[i]);
    }
    if (st == FERRY_OK)
        st = fanout(c, method, n, servers, &req, 1, replies, c->cfg.deadline_ms, NULL, NULL,
                    retry_ok, 0);
    for (int i = 0; replies != NULL && i < n; i++)
        ferry_rpc_msg_deinit(&replies[i]);
    ferry_rpc_msg_deinit(&req);
    free(servers);
    free(replies);
    return st;
}

ferry_status ferry_cluster_checkpoint(ferry_cluster *c, const char *name, uint64_t step) {
    Ferry__V1__CheckpointRequest q;
    ferry__v1__checkpoint_request__init(&q);
    q.path = (char *)(uintptr_t)(name != NULL ? name : "");
    q.step = step;
    /* A named checkpoint (a job's step) may be sent again after a stall or a lost
     * reply: ferry-ps answers a repeat of the file it wrote last with that file. An
     * unnamed one is not (its BUSY answer to a repeat would be final). */
    return broadcast(c, -1, FERRY_RPC_CHECKPOINT, &q.base, name != NULL && name[0] != '\0');
}

const char *ferry_cluster_identity(const ferry_cluster *c) {
    return c->identity;
}

/* The sizes of a module config as ferry_remote_config.dims orders them, and its kind. */
static const char *config_dims(const Ferry__V1__ModuleConfig *mc, int64_t *dims) {
    ferry_wire_kind_config k;
    if (ferry__wire_kind_config_read(&mc->base, &k) != FERRY_OK) {
        dims[0] = dims[1] = 0;
        return "?";
    }
    dims[0] = k.dims[0], dims[1] = k.dims[1];
    return ferry_wire_kinds[k.kind].name;
}

ferry_status ferry__dist_list_modules(ferry_cluster *c, int server, const char *prefix,
                                      ferry_rpc_msg *reply) {
    if (server < 0 || server >= c->n)
        return ferry_errorf(FERRY_ERR_INVALID, "server %d outside [0, %d)", server, c->n);
    Ferry__V1__ListModulesRequest q;
    ferry__v1__list_modules_request__init(&q);
    q.prefix = (char *)(uintptr_t)(prefix != NULL ? prefix : "");
    ferry_rpc_msg req;
    ferry_rpc_msg_init(&req);
    ferry_status st = ferry_rpc_msg_set_head(&req, &q.base);
    if (st == FERRY_OK)
        st = ferry__dist_fanout(c, FERRY_RPC_LIST_MODULES, 1, &server, &req, 1, reply);
    ferry_rpc_msg_deinit(&req);
    return st;
}

ferry_status ferry_cluster_list_modules(ferry_cluster *c, int server, const char *prefix,
                                        void (*fn)(void *user, const ferry_module_info *m),
                                        void *user) {
    ferry_rpc_msg reply;
    ferry_rpc_msg_init(&reply);
    ferry_status st = ferry__dist_list_modules(c, server, prefix, &reply);
    const Ferry__V1__ListModulesReply *r = reply.head;
    for (size_t i = 0; st == FERRY_OK && i < r->n_modules; i++) {
        const Ferry__V1__ModuleInfo *m = r->modules[i];
        ferry_module_info info = {.name = m->name,
                                  .owner = m->owner,
                                  .version = m->version,
                                  .num_params = m->num_params,
                                  .bytes = m->bytes};
        if (m->config != NULL) {
            info.kind = config_dims(m->config, info.dims);
            info.row_begin = m->config->row_begin;
            info.row_count = m->config->row_count;
        } else {
            info.kind = "?";
        }
        fn(user, &info);
    }
    ferry_rpc_msg_deinit(&reply);
    return st;
}

/* Sends req (method m) to server i alone; the reply is not kept. */
static ferry_status send_one(ferry_cluster *c, ferry_rpc_method m, int i,
                             const ferry_rpc_msg *req) {
    ferry_rpc_msg reply;
    ferry_rpc_msg_init(&reply);
    ferry_status st = ferry__dist_fanout(c, m, 1, &i, req, 1, &reply);
    ferry_rpc_msg_deinit(&reply);
    return st;
}

ferry_status ferry__dist_delete_module_on(ferry_cluster *c, int server, const char *name) {
    Ferry__V1__DeleteModuleRequest q;
    ferry__v1__delete_module_request__init(&q);
    q.name = (char *)(uintptr_t)name;
    ferry_rpc_msg req;
    ferry_rpc_msg_init(&req);
    ferry_status st = ferry_rpc_msg_set_head(&req, &q.base);
    if (st == FERRY_OK)
        st = send_one(c, FERRY_RPC_DELETE_MODULE, server, &req);
    ferry_rpc_msg_deinit(&req);
    return st;
}

/* Sends req (method m) to every server: how many had the thing (answered OK), the
 * first refusal or failure other than NOT_FOUND, or NOT_FOUND naming it when none had
 * it. */
static ferry_status drop_everywhere(ferry_cluster *c, ferry_rpc_method m, const ProtobufCMessage *q,
                                    const char *what, const char *name, int *servers) {
    ferry_rpc_msg req;
    ferry_rpc_msg_init(&req);
    ferry_status st = ferry_rpc_msg_set_head(&req, q);
    int had = 0;
    char first[512] = "";
    for (int i = 0; i < c->n && st == FERRY_OK; i++) {
        ferry_status s = send_one(c, m, i, &req);
        if (s == FERRY_OK)
            had++;
        else if (s != FERRY_ERR_NOT_FOUND)
            st = s; /* a refusal or a failure: say it */
        else if (first[0] == '\0')
            (void)snprintf(first, sizeof first, "%s", ferry_error_last());
    }
    ferry_rpc_msg_deinit(&req);
    if (servers != NULL)
        *servers = had;
    if (st == FERRY_OK && had == 0)
        st = ferry_errorf(FERRY_ERR_NOT_FOUND, "no server has %s '%s' (%s)", what, name, first);
    return st;
}

ferry_status ferry_cluster_delete_module(ferry_cluster *c, const char *name, int *servers) {
    Ferry__V1__DeleteModuleRequest q;
    ferry__v1__delete_module_request__init(&q);
    q.name = (char *)(uintptr_t)name;
    return drop_everywhere(c, FERRY_RPC_DELETE_MODULE, &q.base, "module", name, servers);
}

ferry_status ferry_cluster_drop_job(ferry_cluster *c, const char *job, int *servers) {
    Ferry__V1__JobDrop drop;
    ferry__v1__job_drop__init(&drop);
    Ferry__V1__JobRequest q;
    ferry__v1__job_request__init(&q);
    q.job = (char *)(uintptr_t)job;
    q.action_case = FERRY__V1__JOB_REQUEST__ACTION_DROP;
    q.drop = &drop;
    return drop_everywhere(c, FERRY_RPC_JOB, &q.base, "job", job, servers);
}

ferry_status ferry_cluster_shutdown(ferry_cluster *c, int server, int grace_ms) {
    Ferry__V1__ShutdownRequest q;
    ferry__v1__shutdown_request__init(&q);
    q.grace_ms = grace_ms > 0 ? (uint32_t)grace_ms : 0;
    q.reason = c->client_id;
    return broadcast(c, server, FERRY_RPC_SHUTDOWN, &q.base, 0);
}

ferry_status ferry__dist_output(ferry_cluster *c, int server, const ferry_rpc_msg *reply,
                                ferry_wire_tensor_id id, const int64_t *want,
                                const ferry_rpc_tensor **out) {
    const ferry_wire_tensor *w = &ferry_wire_tensors[id];
    FERRY_ASSERT(w->dir == FERRY_WIRE_FWD_OUT || w->dir == FERRY_WIRE_BWD_OUT);
    return ferry__dist_output_as(c, server, reply, w->name, w->dtype, w->rank, want, out);
}
