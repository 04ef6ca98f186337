/* handlers.c - the calls that run inside a distributed-autograd context: Forward
 * (saving what Backward needs under (ctx, call_id, module)), Backward (accumulating
 * parameter gradients into the context, never into the parameters), GradNorm,
 * Step (each touched module's optimizer, then the context is freed) and
 * ReleaseContext. A Stiefel-constrained module's penalty gradient joins the context
 * once, at its first GradNorm or Step. Every input is checked before anything
 * changes, so a rejected call leaves the context as it was. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/core/log.h"
#include "server/ps-impl.h"

/* After a Forward's reply, while its caller computes: the context's zeroed
 * gradient block for the module's dense parameters, so that its first Backward does
 * not wait for the allocation and the page faults of that block. Charged as the
 * Backward would; over the budget it is left to the Backward (which then refuses
 * with the budget's message). */
static void grads_prepare(ferry__ps_ctx_table *t, ferry__ps_ctx *c, ferry_grads *G) {
    for (int i = 0; i < G->P->count; i++) {
        if (G->P->items[i].flags & FERRY_PARAM_ROW_SPARSE)
            continue;
        if (ferry__ps_ctx_charge_grads(t, c, G, 0) != FERRY_OK || ferry_grads_dense(G, i) == NULL) {
            ferry_error_clear();
            return;
        }
    }
}

/* A call marked wide (its caller waits idle for the reply) runs its GEMMs on two
 * threads while a worker of this server is idle and nothing waits in the queue: the
 * core the caller leaves free then does half of each, and the reply is the same bit
 * for bit (ferry_cpu_set_gemm_width). Returns the thread's previous width, for
 * wide_end. */
static int wide_begin(ferry__ps_state *ps, int wide) {
    ferry_rpc_server *rpc = atomic_load(&ps->rpc);
    if (!wide || rpc == NULL || ferry_cpu_threads() > 1) /* OpenBLAS spreads them itself */
        return 0;
    ferry_rpc_queue_stats q;
    ferry_rpc_server_queue_stats(rpc, &q);
    if (q.queued > 0 || q.running >= q.workers) /* this call is one of those running */
        return 0;
    atomic_fetch_add(&ps->wide_calls, 1);
    return ferry_cpu_set_gemm_width(2);
}

static void wide_end(int prev) {
    if (prev > 0)
        (void)ferry_cpu_set_gemm_width(prev);
}

ferry__ps_module *ferry__ps_module_find(ferry__ps_state *ps, const ferry__ps_session *sess,
                                        const char *name) {
    ferry__ps_module *m = ferry__ps_registry_find(&ps->reg, name);
    if (m != NULL && !ferry__ps_may_use(sess, m->owner)) {
        /* Another identity's module: answered as if there were none. */
        ferry__ps_module_put(m);
        (void)ferry_errorf(FERRY_ERR_NOT_FOUND, "unknown module '%s'", name);
        return NULL;
    }
    return m;
}

static ferry_status forward(ferry__ps_state *ps, ferry__ps_session *sess, ferry__ps_module *m,
                            const Ferry__V1__ForwardRequest *q, ferry_rpc_msg *req,
                            ferry_rpc_msg *reply) {
    ferry__ps_ctx_table *t = &ps->ctxs;
    ferry_wire_mode mode;
    if (ferry_wire_mode_find(m->kind->wire, q->mode, &mode) != FERRY_OK) {
        char modes[128];
        return ferry_errorf(FERRY_ERR_UNSUPPORTED, "%s '%s': unknown Forward mode '%s' (%s)",
                            ferry__ps_kind_name(m->kind), m->name, q->mode,
                            ferry_wire_mode_list(m->kind->wire, modes, sizeof modes));
    }
    int saving = q->ctx_id != 0 && !q->no_grad;
    int keep = saving; /* the Forward's state is kept for a Backward */
    ferry__ps_ctx *c = NULL;
    ferry__ps_saved sv;
    memset(&sv, 0, sizeof sv);
    ferry_status st = FERRY_OK;
    if (saving) {
        if ((st = ferry__ps_ctx_acquire_q(t, sess->serial, sess->quota, q->ctx_id,
                                          FERRY__PS_CTX_CREATE, &c)) != FERRY_OK)
            return st;
        /* The same Forward again is a retry whose first reply was lost: it replaces a
         * pending one, and after its Backward it only answers. */
        ferry__ps_call *prev = ferry__ps_ctx_find_call(c, m, q->call_id);
        if (prev != NULL && prev->done)
            keep = 0;
        else if (prev != NULL)
            ferry__ps_ctx_drop_call(c, prev);
        sv.table = t; /* what the Forward keeps is charged to this context */
        sv.ctx = c;
        /* The pending-call record itself. */
        if (keep)
            st =
                ferry__ps_ctx_charge(t, c, (int64_t)sizeof(ferry__ps_call), "a pending call", NULL);
    }
    uint64_t version = 0;
    if (st == FERRY_OK) {
        int w = wide_begin(ps, q->wide);
        pthread_rwlock_rdlock(&m->lock);
        st = m->kind->forward(m, mode, req, reply, keep ? &sv : NULL);
        version = m->version;
        pthread_rwlock_unlock(&m->lock);
        wide_end(w);
    }
    ferry_grads *G = NULL;
    if (st == FERRY_OK && keep) {
        /* The module joins the context now, so that Step advances its optimizer even
         * if no gradient reaches it (the step counter stays in line with the trainer). */
        st = ferry__ps_ctx_grads(t, c, m, &G);
        if (st == FERRY_OK)
            st = ferry__ps_ctx_save(c, m, q->call_id, &sv);
    }
    ferry__ps_saved_free(&sv); /* empty unless something failed */
    Ferry__V1__ForwardReply r;
    ferry__v1__forward_reply__init(&r);
    r.version = version;
    if (st == FERRY_OK)
        st = ferry_rpc_msg_set_head(reply, &r.base);
    if (st == FERRY_OK && G != NULL && G->dense == NULL && ferry_rpc_can_reply_now(reply) &&
        ferry_rpc_reply_now(reply) == FERRY_OK)
        grads_prepare(t, c, G);
    if (c != NULL)
        ferry__ps_ctx_release(t, c);
    return st;
}

/* The end of a Backward whose weight gradient is still to form (saved.late): the
 * reply is kept for a retry and sent, then the weight gradient accumulates in its
 * turn (ferry__ps_ctx_late_begin), without the context's mutex: the context's next
 * Backward of an affine module forms its input gradient meanwhile, and every other
 * call (GradNorm, Step, a Forward, a release) waits for the whole gradient. The
 * operands stay charged to the context until they are freed. Should the weight
 * gradient fail (its reply may have gone, or be kept for a retry to replay, and part
 * of it may be added), the context is dropped: its Step then fails rather than apply
 * part of a gradient. */
static ferry_status backward_late(ferry__ps_ctx_table *t, ferry__ps_ctx *c, ferry__ps_module *m,
                                  ferry__ps_call *call, ferry_grads *G, ferry_rpc_msg *reply) {
    ferry__ps_saved sv = call->saved; /* its buffers hold the operands until the end */
    memset(&call->saved, 0, sizeof call->saved);
    int64_t held = (int64_t)sv.bytes;
    c->late_bytes += held;
    Ferry__V1__BackwardReply r;
    ferry__v1__backward_reply__init(&r);
    ferry_status st = ferry_rpc_msg_set_head(reply, &r.base);
    if (st == FERRY_OK && ferry__ps_ctx_finish_call(c, call, reply) != FERRY_OK)
        ferry__ps_ctx_drop_call(c, call);
    if (st == FERRY_OK && ferry_rpc_reply_now(reply) == FERRY_OK)
        atomic_fetch_add(&t->early, 1);
    if (st == FERRY_OK) {
        ferry__ps_ctx_late_begin(c);
        st = ferry__ps_affine_grad_weights(m, &sv, G);
        ferry__ps_ctx_late_end(c);
        if (st != FERRY_OK) { /* it may have added part of itself: nothing can take it back */
            FERRY_LOG_ERROR("%s '%s': the weight gradient failed after the input gradient; "
                            "context %#llx dropped: %s",
                            ferry__ps_kind_name(m->kind), m->name, (unsigned long long)c->id,
                            ferry_error_last());
            ferry__ps_ctx_retire(t, c, 0);
        }
    } else {
        ferry__ps_ctx_drop_call(c, call); /* not finished: nothing kept, nothing added */
    }
    ferry__ps_saved_free(&sv);
    c->late_bytes -= held;
    ferry__ps_ctx_release(t, c);
    return st;
}

static ferry_status backward(ferry__ps_state *ps, ferry__ps_session *sess, ferry__ps_module *m,
                             const Ferry__V1__BackwardRequest *q, ferry_rpc_msg *req,
                             ferry_rpc_msg *reply) {
    ferry__ps_ctx_table *t = &ps->ctxs;
    ferry__ps_ctx *c;
    ferry_status st =
        ferry__ps_ctx_acquire(t, sess->serial, q->ctx_id, FERRY__PS_CTX_UNSETTLED, &c);
    if (st != FERRY_OK)
        return st;
    /* On a network call an affine kind may leave its weight gradient for after the
     * reply (the caller waits for the input gradient only). Such a Backward, on a
     * module whose gradients the context already holds, touches none of them before
     * that: it goes on while an earlier weight gradient still forms. Any other waits. */
    int late_ok = ferry_rpc_can_reply_now(reply), overlapped = 0;
    if (c->late_done != c->late_next) {
        if (late_ok && m->kind->late_dw && !ferry__ps_constrained(m) &&
            ferry__ps_ctx_find_grads(c, m) != NULL)
            overlapped = 1; /* counted once it has run */
        else if ((st = ferry__ps_ctx_settle(t, c)) != FERRY_OK)
            return st;
    }
    ferry__ps_call *call = ferry__ps_ctx_find_call(c, m, q->call_id);
    ferry_grads *G = NULL;
    if (call != NULL && call->done) { /* a retry: answered alike, applied once */
        st = ferry__ps_ctx_replay_call(t, call, reply);
        ferry__ps_ctx_release(t, c);
        goto answer;
    }
    if (call == NULL)
        st = ferry_errorf(FERRY_ERR_NOT_FOUND,
                          "%s '%s': context %#llx has no pending Forward with call id %llu "
                          "(never made, or run without a context or with no_grad)",
                          ferry__ps_kind_name(m->kind), m->name, (unsigned long long)q->ctx_id,
                          (unsigned long long)q->call_id);
    else
        st = ferry__ps_ctx_grads(t, c, m, &G);
    /* The gradient storage this Backward can add (the rows of the Forward it answers,
     * or a dense block on first use) is charged before it is taken. */
    if (st == FERRY_OK)
        st = ferry__ps_ctx_charge_grads(t, c, G, call->saved.N);
    if (st == FERRY_OK) {
        call->saved.late_ok = late_ok;
        int w = wide_begin(ps, q->wide); /* a weight gradient formed late is not */
        pthread_rwlock_rdlock(&m->lock);
        st = m->kind->backward(m, q, &call->saved, req, G, reply);
        pthread_rwlock_unlock(&m->lock);
        wide_end(w);
        if (st == FERRY_OK && overlapped)
            atomic_fetch_add(&t->overlapped, 1);
    }
    if (st == FERRY_OK && call->saved.late.pending)
        return backward_late(t, c, m, call, G, reply);
    /* One Backward per Forward: the saved state may have been consumed in place. The
     * reply is kept, so that a retry is answered without adding the gradient again. */
    if (st == FERRY_OK && ferry__ps_ctx_finish_call(c, call, reply) != FERRY_OK)
        ferry__ps_ctx_drop_call(c, call);
    ferry__ps_ctx_release(t, c);
answer:
    if (st != FERRY_OK)
        return st;
    Ferry__V1__BackwardReply r;
    ferry__v1__backward_reply__init(&r);
    return ferry_rpc_msg_set_head(reply, &r.base);
}

/* The request's reply_dtype on the reply: F32 or BF16 (proto section 3a). */
static ferry_status reply_dtype(Ferry__V1__DType d, ferry_rpc_msg *reply) {
    if (d != FERRY__V1__DTYPE__F32 && d != FERRY__V1__DTYPE__BF16)
        return ferry_errorf(FERRY_ERR_INVALID, "reply_dtype %d: F32 (0) or BF16 (4)", (int)d);
    return ferry_rpc_msg_set_wire_dtype(reply, d == FERRY__V1__DTYPE__BF16 ? FERRY_RPC_DTYPE_BF16
                                                                           : FERRY_RPC_DTYPE_F32);
}

/* The two context calls on one module: the module is held (referenced) while the call
 * runs, so a DeleteModule meanwhile frees it only afterwards. */
ferry_status ferry__ps_on_forward(ferry__ps_state *ps, ferry__ps_session *sess,
                                  const Ferry__V1__ForwardRequest *q, ferry_rpc_msg *req,
                                  ferry_rpc_msg *reply) {
    ferry_status st0 = reply_dtype(q->reply_dtype, reply);
    if (st0 != FERRY_OK)
        return st0;
    ferry__ps_module *m = ferry__ps_module_find(ps, sess, q->module);
    if (m == NULL)
        return FERRY_ERR_NOT_FOUND;
    ferry_status st = forward(ps, sess, m, q, req, reply);
    ferry__ps_module_put(m);
    return st;
}

ferry_status ferry__ps_on_backward(ferry__ps_state *ps, ferry__ps_session *sess,
                                   const Ferry__V1__BackwardRequest *q, ferry_rpc_msg *req,
                                   ferry_rpc_msg *reply) {
    ferry_status st0 = reply_dtype(q->reply_dtype, reply);
    if (st0 != FERRY_OK)
        return st0;
    ferry__ps_module *m = ferry__ps_module_find(ps, sess, q->module);
    if (m == NULL)
        return FERRY_ERR_NOT_FOUND;
    ferry_status st = backward(ps, sess, m, q, req, reply);
    ferry__ps_module_put(m);
    return st;
}

/* Adds a constrained module's penalty gradient to the context's gradients the first
 * time GradNorm or Step needs them, and never again for this context: however many
 * Forward/Backward calls the context made, and whether or not GradNorm ran first,
 * one Step of one context applies the penalty once (a second trainer's context is a
 * second optimizer step and adds it once more, computed from W as it is then).
 * Context mutex held; `locked`: the caller holds the module's write lock. */
ferry_status ferry__ps_ctx_mod_penalty(ferry__ps_ctx_table *t, ferry__ps_ctx *c,
                                      ferry__ps_ctx_mod *cm, int locked) {
    if (cm->penalty_done || !ferry__ps_constrained(cm->mod))
        return FERRY_OK;
    ferry_status st = t != NULL && c != NULL ? ferry__ps_ctx_charge_grads(t, c, &cm->G, 0) : FERRY_OK;
    if (st != FERRY_OK)
        return st;
    if (!locked)
        pthread_rwlock_rdlock(&cm->mod->lock);
    st = ferry__ps_constraint_penalty(cm->mod, &cm->G, &cm->penalty, &cm->feasibility);
    if (!locked)
        pthread_rwlock_unlock(&cm->mod->lock);
    cm->penalty_done = st == FERRY_OK;
    return st;
}

static int name_listed(const char *name, char **names, size_t n) {
    if (n == 0)
        return 1;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(names[i], name) == 0)
            return 1;
    }
    return 0;
}

ferry_status ferry__ps_on_grad_norm(ferry__ps_state *ps, ferry__ps_session *sess,
                                    const Ferry__V1__GradNormRequest *q, ferry_rpc_msg *req,
                                    ferry_rpc_msg *reply) {
    (void)req; /* the header says it all */
    if (q->job != NULL && q->job->job[0] != '\0')
        return ferry__ps_job_grad_norm(ps, sess, q, reply);
    return ferry__ps_grad_norm_context(ps, sess->serial, q, reply);
}

ferry_status ferry__ps_grad_norm_context(ferry__ps_state *ps, uint64_t sess,
                                         const Ferry__V1__GradNormRequest *q,
                                         ferry_rpc_msg *reply) {
    ferry__ps_ctx_table *t = &ps->ctxs;
    ferry__ps_ctx *c;
    ferry_status st = ferry__ps_ctx_acquire(t, sess, q->ctx_id, 0, &c);
    if (st != FERRY_OK)
        return st;
    Ferry__V1__GradNormReply r;
    ferry__v1__grad_norm_reply__init(&r);
    Ferry__V1__Metric *metrics = calloc((size_t)c->nmods + 1, sizeof *metrics);
    Ferry__V1__Metric **ptrs = calloc((size_t)c->nmods + 1, sizeof *ptrs);
    if (metrics == NULL || ptrs == NULL)
        st = FERRY_NOMEM();
    for (int i = 0; st == FERRY_OK && i < c->nmods; i++) {
        ferry__ps_ctx_mod *cm = &c->mods[i];
        if (!name_listed(cm->mod->name, q->modules, q->n_modules))
            continue;
        double ss = 0.0;
        if ((st = ferry__ps_ctx_mod_penalty(t, c, cm, 0)) != FERRY_OK ||
            (st = ferry_grads_sumsq(&cm->G, &ss)) != FERRY_OK)
            break;
        ferry__v1__metric__init(&metrics[r.n_per_module]);
        metrics[r.n_per_module].name = cm->mod->name;
        metrics[r.n_per_module].value = ss;
        ptrs[r.n_per_module] = &metrics[r.n_per_module];
        r.n_per_module++;
        r.sum_squares += ss;
    }
    r.per_module = ptrs;
    if (q->job != NULL) { /* a job's ssp or async step: this rank's own figures */
        r.loss_sum = q->job->loss_sum;
        r.tokens = q->job->tokens;
        r.checkpoint = q->job->checkpoint;
    }
    if (st == FERRY_OK)
        st = ferry_rpc_msg_set_head(reply, &r.base); /* packs a copy while names live */
    ferry__ps_ctx_release(t, c);
    free(metrics);
    free(ptrs);
    return st;
}

/* Appends metric "<what>/<module>" = value to r (storage: metrics, ptrs, names). */
static void step_metric(Ferry__V1__StepReply *r, Ferry__V1__Metric *metrics, Ferry__V1__Metric **ptrs,
                        char (*names)[FERRY_RPC_NAME_MAX + 16], const char *what,
                        const char *module, double value) {
    size_t i = r->n_metrics++;
    (void)snprintf(names[i], sizeof names[i], "%s/%s", what, module);
    ferry__v1__metric__init(&metrics[i]);
    metrics[i].name = names[i];
    metrics[i].value = value;
    ptrs[i] = &metrics[i];
}

ferry_status ferry__ps_step_module(ferry__ps_ctx_table *t, ferry__ps_ctx *c,
                                   ferry__ps_ctx_mod *cm, double scale, double lr,
                                   uint64_t *version) {
    ferry__ps_module *m = cm->mod;
    ferry_status st = FERRY_OK;
    pthread_rwlock_wrlock(&m->lock);
    if (lr > 0.0)
        st = ferry_optim_set_lr(m->opt, lr);
    if (st == FERRY_OK)
        st = ferry__ps_ctx_mod_penalty(t, c, cm, 1);
    if (st == FERRY_OK)
        st = ferry_optim_step(m->opt, &m->P, &cm->G, (float)scale);
    if (st == FERRY_OK)
        m->version++;
    *version = m->version;
    pthread_rwlock_unlock(&m->lock);
    if (st != FERRY_OK) {
        char why[256]; /* copied: ferry_errorf writes where ferry_error_last points */
        (void)snprintf(why, sizeof why, "%s", ferry_error_last());
        st = ferry_errorf(st, "Step of %s '%s': %s", ferry__ps_kind_name(m->kind), m->name, why);
    }
    return st;
}

static ferry_status step_check(const Ferry__V1__StepRequest *q) {
    double scale = q->scale != 0.0 ? q->scale : 1.0;
    if (!isfinite(scale) || scale < 0.0)
        return ferry_errorf(FERRY_ERR_NUMERIC, "Step: gradient scale %g must be finite and >= 0",
                            q->scale);
    if (!isfinite(q->lr) || q->lr < 0.0)
        return ferry_errorf(FERRY_ERR_INVALID, "Step: learning rate %g must be finite and >= 0",
                            q->lr);
    return FERRY_OK;
}

ferry_status ferry__ps_step_context(ferry__ps_state *ps, uint64_t sess,
                                    const Ferry__V1__StepRequest *q, ferry_rpc_msg *reply) {
    ferry__ps_ctx_table *t = &ps->ctxs;
    double scale = q->scale != 0.0 ? q->scale : 1.0;
    ferry__ps_ctx *c;
    ferry_status st = ferry__ps_ctx_acquire(t, sess, q->ctx_id, 0, &c);
    if (st == FERRY_ERR_NOT_FOUND) { /* stepped already: a retry is answered alike */
        char why[512];
        (void)snprintf(why, sizeof why, "%s", ferry_error_last());
        if (ferry__ps_ctx_stepped_reply(t, sess, q->ctx_id, reply) == FERRY_OK)
            return FERRY_OK;
        return ferry_errorf(st, "%s", why);
    }
    if (st != FERRY_OK)
        return st;
    Ferry__V1__StepReply r;
    ferry__v1__step_reply__init(&r);
    /* Per module: "version/<name>", and for a constrained one "penalty/<name>" and
     * "feasibility/<name>" (beta ||W^T W - I||_F^2 and ||W^T W - I||_F of the W the
     * penalty gradient was computed from, the W before this step). */
    size_t cap = 3 * (size_t)c->nmods + 1;
    Ferry__V1__Metric *metrics = calloc(cap, sizeof *metrics);
    Ferry__V1__Metric **ptrs = calloc(cap, sizeof *ptrs);
    char(*names)[FERRY_RPC_NAME_MAX + 16] = calloc(cap, sizeof *names);
    if (metrics == NULL || ptrs == NULL || names == NULL)
        st = FERRY_NOMEM();
    /* Once stepping has begun the context is retired whatever happens, so that a
     * retry cannot apply the same gradients twice. */
    for (int i = 0; st == FERRY_OK && i < c->nmods; i++) {
        ferry__ps_module *m = c->mods[i].mod;
        uint64_t version = 0;
        if ((st = ferry__ps_step_module(t, c, &c->mods[i], scale, q->lr, &version)) != FERRY_OK)
            break;
        r.version = version > r.version ? version : r.version;
        step_metric(&r, metrics, ptrs, names, "version", m->name, (double)version);
        if (ferry__ps_constrained(m)) {
            step_metric(&r, metrics, ptrs, names, "penalty", m->name, c->mods[i].penalty);
            step_metric(&r, metrics, ptrs, names, "feasibility", m->name, c->mods[i].feasibility);
        }
    }
    if (c->calls != NULL)
        FERRY_LOG_DEBUG("Step of context %#llx with Forward calls never backpropagated",
                        (unsigned long long)c->id);
    ferry__ps_ctx_retire(t, c, 1);
    r.metrics = ptrs;
    if (st == FERRY_OK && (st = ferry_rpc_msg_set_head(reply, &r.base)) == FERRY_OK)
        ferry__ps_ctx_remember_step(t, sess, c->id, reply);
    ferry__ps_ctx_release(t, c);
    free(metrics);
    free(ptrs);
    free(names);
    return st;
}

ferry_status ferry__ps_on_step(ferry__ps_state *ps, ferry__ps_session *sess,
                               const Ferry__V1__StepRequest *q, ferry_rpc_msg *req,
                               ferry_rpc_msg *reply) {
    ferry_status st = step_check(q);
    if (st != FERRY_OK)
        return st;
    if (q->job != NULL && q->job->job[0] != '\0')
        return ferry__ps_job_step(ps, sess, q, req, reply);
    return ferry__ps_step_context(ps, sess->serial, q, reply);
}

ferry_status ferry__ps_on_release_context(ferry__ps_state *ps, ferry__ps_session *sess,
                                          const Ferry__V1__ReleaseContextRequest *q,
                                          ferry_rpc_msg *req, ferry_rpc_msg *reply) {
    (void)req; /* the header says it all */
    ferry__ps_ctx_table *t = &ps->ctxs;
    ferry__ps_ctx *c;
    Ferry__V1__ReleaseContextReply r;
    ferry__v1__release_context_reply__init(&r);
    ferry_status st = ferry__ps_ctx_acquire(t, sess->serial, q->ctx_id, 0, &c);
    if (st == FERRY_OK) {
        ferry__ps_ctx_retire(t, c, 0);
        ferry__ps_ctx_release(t, c);
        r.found = 1;
    } else if (st != FERRY_ERR_NOT_FOUND) {
        return st;
    }
    return ferry_rpc_msg_set_head(reply, &r.base);
}

/* Each method's handler as the RPC layer calls it: the state from the user pointer and
 * the request's header, typed. */
/* Every method but Hello runs in the caller's session, looked up (and checked against
 * the caller's credentials) before the handler runs; Hello opens or renews it. */
#define FERRY__PS_ADAPTER_(id, Name, snake)                                                        \
    static ferry_status handle_##snake(void *user, ferry_rpc_method method, ferry_rpc_msg *req,    \
                                       ferry_rpc_msg *reply) {                                     \
        ferry__ps_state *ps = user;                                                                \
        ferry__ps_session *sess = NULL;                                                            \
        ferry_status st = FERRY_OK;                                                                \
        if (method != FERRY_RPC_HELLO)                                                             \
            st = ferry__ps_session_enter(&ps->sessions, ferry_rpc_caller(reply), #Name, &sess);    \
        if (st == FERRY_OK)                                                                        \
            st = ferry__ps_on_##snake(ps, sess, req->head, req, reply);                            \
        ferry__ps_session_leave(&ps->sessions, sess);                                              \
        return st;                                                                                 \
    }
FERRY_RPC_METHOD_MAP(FERRY__PS_ADAPTER_)
#undef FERRY__PS_ADAPTER_

const ferry_rpc_handler ferry__ps_handlers[FERRY_RPC_METHOD_COUNT] = {
#define FERRY__PS_ENTRY_(id, Name, snake) [FERRY_RPC_##id] = handle_##snake,
    FERRY_RPC_METHOD_MAP(FERRY__PS_ENTRY_)
#undef FERRY__PS_ENTRY_
};
