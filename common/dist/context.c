/* context.c - distributed-autograd contexts on the client side: ids (worker id in the
 * high 16 bits), the servers a context touched, the records of Forward calls
 * awaiting their Backward, and the distributed step: GradNorm on every touched
 * server, one global clipping coefficient, then Step everywhere at once. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dist/dist.h"
#include "ferry.pb-c.h"
#include "common/core/log.h"
#include "ferry/optim.h"

#define CTX_COUNTER_MASK ((UINT64_C(1) << 48) - 1)

/* ---- call records ---- */

ferry__dist_call *ferry__dist_call_new(ferry_dist_ctx *dc, const ferry_remote *m, int op) {
    ferry__dist_call *call = calloc(1, sizeof *call);
    if (call == NULL)
        return NULL;
    call->m = m;
    call->op = op;
    pthread_mutex_lock(&dc->mu);
    call->call_id = dc->next_call++;
    call->next = dc->calls;
    dc->calls = call;
    pthread_mutex_unlock(&dc->mu);
    return call;
}

void ferry__dist_touch(ferry_dist_ctx *dc, int server) {
    if (dc == NULL)
        return;
    pthread_mutex_lock(&dc->mu);
    dc->touched[server] = 1;
    pthread_mutex_unlock(&dc->mu);
}

ferry__dist_call *ferry__dist_call_find(ferry_dist_ctx *dc, const ferry_remote *m, uint64_t call_id,
                                        int op) {
    pthread_mutex_lock(&dc->mu);
    for (ferry__dist_call *call = dc->calls; call != NULL; call = call->next) {
        if (call->m == m && call->call_id == call_id && call->op == op) {
            pthread_mutex_unlock(&dc->mu);
            return call;
        }
    }
    pthread_mutex_unlock(&dc->mu);
    (void)ferry_errorf(FERRY_ERR_NOT_FOUND,
                       "module '%s': no pending Forward with call id %llu in context %#llx "
                       "(already backpropagated, another kind of call, or another context)",
                       m->name, (unsigned long long)call_id, (unsigned long long)dc->id);
    return NULL;
}

static void call_free(ferry__dist_call *call) {
    free(call->shard_count);
    free(call->slot);
    free(call->factor);
    free(call->loc_h);
    free(call->loc_e);
    free(call->loc_t);
    free(call);
}

void ferry__dist_call_drop(ferry_dist_ctx *dc, ferry__dist_call *call) {
    pthread_mutex_lock(&dc->mu);
    ferry__dist_call **pp = &dc->calls;
    while (*pp != call)
        pp = &(*pp)->next;
    *pp = call->next;
    pthread_mutex_unlock(&dc->mu);
    call_free(call);
}

/* Forgets the open context here (the servers are told by the caller). */
static void ctx_close(ferry_dist_ctx *dc) {
    while (dc->calls != NULL) {
        ferry__dist_call *next = dc->calls->next;
        call_free(dc->calls);
        dc->calls = next;
    }
    memset(dc->touched, 0, (size_t)dc->c->n);
    for (int i = 0; i < dc->c->n; i++)
        ferry_rpc_msg_deinit(&dc->sums[i]);
    dc->id = 0;
}

/* Forgets the last Step's metrics: a new Step (or a clipped step that never sends
 * one) replaces them. */
static void metrics_clear(ferry_dist_ctx *dc) {
    free(dc->metrics);
    dc->metrics = NULL;
    dc->nmetrics = 0;
}

/* ---- lifetime ---- */

ferry_status ferry_dist_ctx_create(ferry_cluster *c, ferry_dist_ctx **out) {
    ferry_dist_ctx *dc = calloc(1, sizeof *dc);
    /* Sized for the most servers a cluster has: its servers may change between
     * contexts (ferry_cluster_retarget). */
    size_t n = FERRY_DIST_MAX_SERVERS;
    if (dc == NULL || (dc->touched = calloc(n, 1)) == NULL ||
        (dc->sums = calloc(n, sizeof *dc->sums)) == NULL ||
        (dc->sum_src = calloc(n, sizeof *dc->sum_src)) == NULL) {
        if (dc != NULL) {
            free(dc->touched);
            free(dc->sums);
        }
        free(dc);
        return FERRY_NOMEM();
    }
    dc->c = c;
    pthread_mutex_init(&dc->mu, NULL);
    *out = dc;
    return FERRY_OK;
}

static int touched_any(const ferry_dist_ctx *dc) {
    for (int i = 0; i < dc->c->n; i++) {
        if (dc->touched[i])
            return 1;
    }
    return 0;
}

static void step_settle(ferry_dist_ctx *dc);

void ferry_dist_ctx_abandon(ferry_dist_ctx *dc) {
    if (dc == NULL)
        return;
    step_settle(dc);
    if (dc->id != 0)
        ferry__dist_forget_context(dc->c, dc->id);
    ctx_close(dc);
    dc->job = NULL;
    dc->job_step = 0;
}

void ferry_dist_ctx_destroy(ferry_dist_ctx *dc) {
    if (dc == NULL)
        return;
    step_settle(dc);
    if (dc->id != 0 && touched_any(dc) && ferry_dist_ctx_release(dc) != FERRY_OK)
        FERRY_LOG_WARN("context left to the servers' sweep: %s", ferry_error_last());
    ctx_close(dc);
    free(dc->touched);
    free(dc->sums);
    free(dc->sum_src);
    metrics_clear(dc);
    pthread_mutex_destroy(&dc->mu);
    free(dc);
}

/* A Step started and never waited for: wait for it now (its outcome is logged), so no
 * other call touches the context while the step thread does. */
static void step_settle(ferry_dist_ctx *dc) {
    if (dc->step_pending == 0)
        return;
    if (dc->step_pending == 1)
        pthread_join(dc->step_thread, NULL);
    dc->step_pending = 0;
    if (dc->step_st != FERRY_OK)
        FERRY_LOG_WARN("a Step nobody waited for failed: %s", dc->step_err);
}

uint64_t ferry_dist_ctx_begin(ferry_dist_ctx *dc) {
    step_settle(dc);
    if (dc->id != 0 && touched_any(dc) && ferry_dist_ctx_release(dc) != FERRY_OK)
        FERRY_LOG_WARN("context %#llx left to the servers' sweep: %s", (unsigned long long)dc->id,
                       ferry_error_last());
    ctx_close(dc);
    dc->job = NULL;
    dc->job_step = 0;
    uint64_t low = 0;
    while (low == 0) /* a zero id means "no context" */
        low = atomic_fetch_add(&dc->c->next_ctx, 1) & CTX_COUNTER_MASK;
    dc->id = (uint64_t)dc->c->cfg.worker_id << 48 | low;
    dc->next_call = 1;
    return dc->id;
}

uint64_t ferry_dist_ctx_id(const ferry_dist_ctx *dc) {
    return dc->id;
}

/* ---- GradNorm, Step, Release ---- */

/* A job step's GradNorm and Step may wait for the other ranks: their deadline
 * grows by the job's sync timeout. */
static int ctx_deadline(const ferry_dist_ctx *dc) {
    int d = dc->c->cfg.deadline_ms;
    if (dc->job != NULL)
        d += dc->job->cfg.sync_timeout_ms > 0 ? dc->job->cfg.sync_timeout_ms : 60000;
    return d;
}

/* The (job, rank, step) of the open context, or NULL. */
static Ferry__V1__JobStep *ctx_job(const ferry_dist_ctx *dc, Ferry__V1__JobStep *js) {
    if (dc->job == NULL)
        return NULL;
    ferry__v1__job_step__init(js);
    js->job = (char *)(uintptr_t)dc->job->name;
    js->rank = (uint32_t)dc->job->cfg.rank;
    js->step = dc->job_step;
    js->loss_sum = dc->job_loss;
    js->tokens = dc->job_tokens;
    js->checkpoint = atomic_load(&dc->job->ck_request) != 0;
    js->readmit = atomic_load(&dc->job->readmit_request);
    js->epoch = dc->job->el_epoch;
    js->members = dc->job->el_members;
    js->n_members = dc->job->el_n;
    return js;
}

ferry_status ferry_dist_ctx_set_job(ferry_dist_ctx *dc, ferry_job *job, uint64_t step,
                                    double loss_sum, double tokens) {
    if (job != NULL && (dc->id == 0 || step == 0))
        return ferry_errorf(FERRY_ERR_INVALID, "ferry_dist_ctx_set_job: %s",
                            dc->id == 0 ? "no context is open" : "job steps count from 1");
    if (job != NULL && job->c != dc->c)
        return ferry_errorf(FERRY_ERR_INVALID, "ferry_dist_ctx_set_job: the job belongs to "
                                               "another cluster");
    dc->job = job;
    dc->job_step = step;
    dc->job_loss = loss_sum;
    dc->job_tokens = tokens;
    dc->job_loss_out = loss_sum;
    dc->job_tokens_out = tokens;
    dc->job_ck_out = 0;
    dc->job_readmit_out = 0;
    return FERRY_OK;
}

void ferry_job_request_checkpoint(ferry_job *job) {
    atomic_store(&job->ck_request, 1);
}

int ferry_dist_ctx_job_checkpoint(const ferry_dist_ctx *dc) {
    return dc->job_ck_out;
}

uint64_t ferry_dist_ctx_job_readmit(const ferry_dist_ctx *dc) {
    return dc->job_readmit_out;
}

void ferry_dist_ctx_job_loss(const ferry_dist_ctx *dc, double *loss_sum, double *tokens) {
    if (loss_sum != NULL)
        *loss_sum = dc->job_loss_out;
    if (tokens != NULL)
        *tokens = dc->job_tokens_out;
}

/* Whether this rank installs shard g's sum on its backups (primary-backup): the
 * shards are dealt out to the ranks round robin. */
static int installs(const ferry_dist_ctx *dc, int g) {
    return dc->job != NULL && dc->job->cfg.sync == FERRY_SYNC_BSP && ferry__dist_passive(dc->c) &&
           dc->job->cfg.world > 0 && g % dc->job->cfg.world == dc->job->cfg.rank;
}

/* One header to every touched server; replies[i] answers servers[i]. */
static ferry_status ctx_fanout(ferry_dist_ctx *dc, ferry_rpc_method method,
                               const ProtobufCMessage *head, int *servers, ferry_rpc_msg *replies,
                               int *n) {
    *n = 0;
    for (int i = 0; i < dc->c->n; i++) {
        if (dc->touched[i]) {
            servers[*n] = i;
            ferry_rpc_msg_init(&replies[(*n)++]);
        }
    }
    ferry_rpc_msg req;
    ferry_rpc_msg_init(&req);
    ferry_status st = ferry_rpc_msg_set_head(&req, head);
    if (st == FERRY_OK)
        st = ferry__dist_fanout_deadline(dc->c, method, *n, servers, &req, 1, replies,
                                         ctx_deadline(dc));
    ferry_rpc_msg_deinit(&req);
    return st;
}

static void replies_deinit(ferry_rpc_msg *replies, int n) {
    for (int i = 0; i < n; i++)
        ferry_rpc_msg_deinit(&replies[i]);
}

static ferry_status no_context(void) {
    return ferry_errorf(FERRY_ERR_INVALID, "no distributed context is open "
                                           "(call ferry_dist_ctx_begin first)");
}

ferry_status ferry_dist_ctx_grad_sumsq(ferry_dist_ctx *dc, double *sumsq) {
    step_settle(dc);
    if (dc->id == 0)
        return no_context();
    Ferry__V1__GradNormRequest q;
    ferry__v1__grad_norm_request__init(&q);
    q.ctx_id = dc->id;
    Ferry__V1__JobStep js;
    q.job = ctx_job(dc, &js);
    int servers[FERRY_DIST_MAX_SERVERS], n;
    ferry_rpc_msg replies[FERRY_DIST_MAX_SERVERS];
    ferry_status st;
    if (q.job != NULL && ferry__dist_passive(dc->c)) {
        /* Primary-backup: the barrier answers within the deadline (a stalled primary is
         * told from ranks that are late), and the rank that installs a shard's sum on
         * its backups asks for it. */
        js.hold_ms = (uint32_t)(dc->c->cfg.deadline_ms / 3 > 0 ? dc->c->cfg.deadline_ms / 3 : 1);
        ferry_rpc_msg reqs[FERRY_DIST_MAX_SERVERS];
        n = 0;
        st = FERRY_OK;
        for (int i = 0; i < dc->c->n && st == FERRY_OK; i++) {
            if (!dc->touched[i])
                continue;
            js.want_sum = installs(dc, i) && ferry__dist_backups(dc->c, i) > 0;
            servers[n] = i;
            ferry_rpc_msg_init(&replies[n]);
            ferry_rpc_msg_init(&reqs[n]);
            st = ferry_rpc_msg_set_head(&reqs[n++], &q.base);
        }
        if (st == FERRY_OK)
            st = ferry__dist_fanout_deadline(dc->c, FERRY_RPC_GRAD_NORM, n, servers, reqs, 0,
                                             replies, ctx_deadline(dc));
        for (int i = 0; i < n; i++)
            ferry_rpc_msg_deinit(&reqs[i]);
    } else {
        st = ctx_fanout(dc, FERRY_RPC_GRAD_NORM, &q.base, servers, replies, &n);
    }
    double total = 0.0;
    for (int i = 0; st == FERRY_OK && i < n; i++) /* in server order: deterministic */
        total += ((const Ferry__V1__GradNormReply *)replies[i].head)->sum_squares;
    if (st == FERRY_OK && n > 0 && dc->job != NULL) { /* every server sums the same */
        const Ferry__V1__GradNormReply *r0 = replies[0].head;
        dc->job_loss_out = r0->loss_sum;
        dc->job_tokens_out = r0->tokens;
        dc->job_ck_out = r0->checkpoint;
        dc->job_readmit_out = r0->readmit;
        if (js.checkpoint) /* delivered: the answer carries it from now on */
            atomic_store(&dc->job->ck_request, 0);
        if (js.readmit != 0)
            atomic_store(&dc->job->readmit_request, 0);
    }
    for (int i = 0; i < n && st == FERRY_OK; i++) { /* sums, kept for the Step */
        const Ferry__V1__GradNormReply *r = replies[i].head;
        if (r->n_sum == 0)
            continue;
        ferry_rpc_msg_deinit(&dc->sums[servers[i]]);
        dc->sums[servers[i]] = replies[i];
        ferry_rpc_msg_init(&replies[i]);
        dc->sum_src[servers[i]] = ferry__dist_replica_primary(dc->c, servers[i]);
    }
    replies_deinit(replies, n);
    if (st == FERRY_OK)
        *sumsq = total;
    return st;
}

/* Keeps the metrics of every Step reply (server order) in one block: the array, then
 * the names. Out of memory loses the metrics, not the step. */
static void metrics_keep(ferry_dist_ctx *dc, const ferry_rpc_msg *replies, int n) {
    size_t count = 0, bytes = 0;
    for (int i = 0; i < n; i++) {
        const Ferry__V1__StepReply *r = replies[i].head;
        for (size_t k = 0; k < r->n_metrics; k++)
            bytes += strlen(r->metrics[k]->name) + 1;
        count += r->n_metrics;
    }
    if (count == 0 || count > INT32_MAX)
        return;
    ferry_dist_metric *out = malloc(count * sizeof *out + bytes);
    if (out == NULL) {
        FERRY_LOG_WARN("out of memory keeping %zu Step metrics", count);
        return;
    }
    char *names = (char *)(out + count);
    size_t j = 0;
    for (int i = 0; i < n; i++) {
        const Ferry__V1__StepReply *r = replies[i].head;
        for (size_t k = 0; k < r->n_metrics; k++, j++) {
            size_t len = strlen(r->metrics[k]->name) + 1;
            memcpy(names, r->metrics[k]->name, len);
            out[j].name = names;
            out[j].value = r->metrics[k]->value;
            names += len;
        }
    }
    dc->metrics = out;
    dc->nmetrics = (int)count;
}

int ferry_dist_ctx_metrics(const ferry_dist_ctx *dc, const ferry_dist_metric **out) {
    *out = dc->metrics;
    return dc->nmetrics;
}

ferry_status ferry_dist_ctx_metric(const ferry_dist_ctx *dc, const char *name, double *value) {
    for (int i = 0; i < dc->nmetrics; i++) {
        if (strcmp(dc->metrics[i].name, name) == 0) {
            *value = dc->metrics[i].value;
            return FERRY_OK;
        }
    }
    return ferry_errorf(FERRY_ERR_NOT_FOUND, "the last Step reported no metric '%s' (%d metrics)",
                        name, dc->nmetrics);
}

/* The Step of a rank that installs sums (primary-backup): each replica of a shard it
 * holds the sum of, but the one that summed it, gets the Step with the sum (its
 * SummedModules and tensors, borrowed from the GradNorm reply); every other replica
 * the plain Step. */
static ferry_status step_install(ferry_dist_ctx *dc, Ferry__V1__StepRequest *q, int *servers,
                                 ferry_rpc_msg *replies, int *n) {
    int P = dc->c->n * dc->c->R;
    *n = 0;
    ferry_rpc_msg *reqs = calloc((size_t)P, sizeof *reqs);
    if (reqs == NULL)
        return FERRY_NOMEM();
    ferry_status st = FERRY_OK;
    for (int p = 0; p < P && st == FERRY_OK; p++) {
        int g = p / dc->c->R;
        const Ferry__V1__GradNormReply *r = dc->sums[g].head;
        if (p % dc->c->R == 0 && dc->touched[g]) {
            servers[*n] = g;
            ferry_rpc_msg_init(&replies[(*n)++]);
        }
        int with = r != NULL && dc->touched[g] && p != dc->sum_src[g];
        Ferry__V1__GradNormReply answer; /* the primary's answer to this rank, sum aside */
        if (with) {
            answer = *r;
            answer.n_sum = 0;
            answer.sum = NULL;
            answer.pending = 0;
            answer.n_tensors = 0;
            answer.tensors = NULL;
        }
        q->install = with;
        q->n_summed = with ? r->n_sum : 0;
        q->summed = with ? r->sum : NULL;
        q->installed = with ? &answer : NULL;
        if ((st = ferry_rpc_msg_set_head(&reqs[p], &q->base)) != FERRY_OK)
            break;
        for (int t = 0; with && t < dc->sums[g].ntensors && st == FERRY_OK; t++) {
            ferry_rpc_tensor b = dc->sums[g].tensors[t];
            b.release = NULL; /* borrowed: the sum outlives the call */
            b.release_user = NULL;
            st = ferry_rpc_msg_add(&reqs[p], &b);
        }
    }
    q->install = 0;
    q->n_summed = 0;
    q->summed = NULL;
    q->installed = NULL;
    if (st == FERRY_OK)
        st = ferry__dist_fanout_deadline(dc->c, FERRY_RPC_STEP, *n, servers, reqs,
                                         FERRY__DIST_PER_REPLICA, replies, ctx_deadline(dc));
    for (int p = 0; p < P; p++)
        ferry_rpc_msg_deinit(&reqs[p]);
    free(reqs);
    return st;
}

/* The Step itself; the split step's thread runs it. */
static ferry_status step_now(ferry_dist_ctx *dc, float grad_scale, double lr) {
    metrics_clear(dc);
    if (dc->id == 0)
        return no_context();
    if (!(grad_scale > 0.0f) || !isfinite(grad_scale) || !(lr >= 0.0) || !isfinite(lr)) {
        (void)ferry_dist_ctx_release(dc); /* the step is off: free the servers' state */
        return ferry_errorf(FERRY_ERR_INVALID,
                            "step: grad_scale %g must be > 0 and lr %g >= 0 (context released)",
                            (double)grad_scale, lr);
    }
    Ferry__V1__StepRequest q;
    ferry__v1__step_request__init(&q);
    q.ctx_id = dc->id;
    q.scale = (double)grad_scale;
    q.lr = lr;
    Ferry__V1__JobStep js;
    q.job = ctx_job(dc, &js);
    int servers[FERRY_DIST_MAX_SERVERS], n;
    ferry_rpc_msg replies[FERRY_DIST_MAX_SERVERS];
    int any_sum = 0;
    for (int i = 0; i < dc->c->n; i++)
        any_sum |= dc->touched[i] && dc->sums[i].head != NULL;
    ferry_status st = any_sum ? step_install(dc, &q, servers, replies, &n)
                              : ctx_fanout(dc, FERRY_RPC_STEP, &q.base, servers, replies, &n);
    if (st == FERRY_OK)
        metrics_keep(dc, replies, n);
    replies_deinit(replies, n);
    ctx_close(dc);
    return st;
}

ferry_status ferry_dist_ctx_step(ferry_dist_ctx *dc, float grad_scale, double lr) {
    step_settle(dc);
    return step_now(dc, grad_scale, lr);
}

/* The global norm over local_sumsq and the servers' GradNorm, and the clipping
 * coefficient; on failure the context is released and the status says why. */
static ferry_status clip_coef(ferry_dist_ctx *dc, double local_sumsq, float max_norm, float *coef,
                              double *norm) {
    double remote = 0.0, total, nrm;
    float k = 1.0f;
    metrics_clear(dc);
    ferry_status st = ferry_dist_ctx_grad_sumsq(dc, &remote);
    if (st != FERRY_OK)
        return st;
    total = local_sumsq + remote;
    if (max_norm > 0.0f) {
        st = ferry_clip_coef(total, max_norm, &k, &nrm);
    } else {
        nrm = sqrt(total);
        if (!isfinite(nrm))
            st = ferry_errorf(FERRY_ERR_NUMERIC, "gradient norm is %g", nrm);
    }
    if (norm != NULL)
        *norm = nrm;
    if (coef != NULL)
        *coef = k;
    if (st != FERRY_OK) {
        ferry_status err = st;
        char msg[256];
        (void)snprintf(msg, sizeof msg, "%s", ferry_error_last());
        (void)ferry_dist_ctx_release(dc);
        return ferry_errorf(err, "%s (global norm over local %g + remote %g): context released",
                            msg, local_sumsq, remote);
    }
    return FERRY_OK;
}

ferry_status ferry_dist_ctx_clip_step(ferry_dist_ctx *dc, double local_sumsq, float max_norm,
                                      double lr, float *coef, double *norm) {
    float k = 1.0f;
    ferry_status st = clip_coef(dc, local_sumsq, max_norm, &k, norm);
    if (coef != NULL)
        *coef = k;
    return st != FERRY_OK ? st : step_now(dc, k, lr);
}

static void *step_thread_run(void *arg) {
    ferry_dist_ctx *dc = arg;
    dc->step_st = step_now(dc, dc->step_coef, dc->step_lr);
    (void)snprintf(dc->step_err, sizeof dc->step_err, "%s",
                   dc->step_st != FERRY_OK ? ferry_error_last() : "");
    return NULL;
}

ferry_status ferry_dist_ctx_step_start(ferry_dist_ctx *dc, double local_sumsq, float max_norm,
                                       double lr, float *coef, double *norm) {
    if (dc->step_pending)
        return ferry_errorf(FERRY_ERR_BUSY, "a Step is in flight: ferry_dist_ctx_step_wait first");
    float k = 1.0f;
    ferry_status st = clip_coef(dc, local_sumsq, max_norm, &k, norm);
    if (coef != NULL)
        *coef = k;
    if (st != FERRY_OK)
        return st;
    dc->step_coef = k;
    dc->step_lr = lr;
    if (pthread_create(&dc->step_thread, NULL, step_thread_run, dc) == 0) {
        dc->step_pending = 1;
    } else { /* no thread: step now, and wait returns the outcome */
        (void)step_thread_run(dc);
        dc->step_pending = 2;
    }
    return FERRY_OK;
}

ferry_status ferry_dist_ctx_step_wait(ferry_dist_ctx *dc) {
    if (!dc->step_pending)
        return ferry_errorf(FERRY_ERR_INVALID, "no Step was started (ferry_dist_ctx_step_start)");
    if (dc->step_pending == 1)
        pthread_join(dc->step_thread, NULL);
    dc->step_pending = 0;
    if (dc->step_st != FERRY_OK)
        return ferry_errorf(dc->step_st, "%s", dc->step_err);
    return FERRY_OK;
}

ferry_status ferry_dist_ctx_release(ferry_dist_ctx *dc) {
    step_settle(dc);
    if (dc->id == 0)
        return FERRY_OK;
    Ferry__V1__ReleaseContextRequest q;
    ferry__v1__release_context_request__init(&q);
    q.ctx_id = dc->id;
    int servers[FERRY_DIST_MAX_SERVERS], n;
    ferry_rpc_msg replies[FERRY_DIST_MAX_SERVERS];
    ferry_status st = ctx_fanout(dc, FERRY_RPC_RELEASE_CONTEXT, &q.base, servers, replies, &n);
    replies_deinit(replies, n);
    ctx_close(dc);
    return st;
}
