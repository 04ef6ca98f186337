/* ctx-table.c - the distributed-autograd contexts a ferry-ps holds: per context, the
 * gradients of every module it touched and the Forward calls awaiting their
 * Backward. A context lives from its first saving Forward until Step or
 * ReleaseContext retires it, or until the sweep frees it after `ttl` seconds without
 * a call (its trainer died). Contexts are reference-counted so that a sweep or a
 * retire never frees one a handler is still using.
 *
 * Budgets: a context's memory is charged before it is allocated (ferry__ps_ctx_charge:
 * saved inputs, gradient growth), against the per-context and the all-contexts
 * budget; when a call ends the charge is replaced by what the context really holds
 * (Stats reports that). The number of live contexts is bounded too. */
#include <stdlib.h>
#include <string.h>

#include "common/core/log.h"
#include "server/ps-impl.h"

#define CTX_BUCKETS 1024 /* power of two; chains stay short for thousands of contexts */

static uint64_t ctx_hash(uint64_t sess, uint64_t id) {
    id ^= sess * 0x9E3779B97F4A7C15ull;
    id ^= id >> 33;
    id *= 0xff51afd7ed558ccdull;
    id ^= id >> 33;
    return id;
}

ferry_status ferry__ps_ctx_table_init(ferry__ps_ctx_table *t, double ttl_s,
                                      const ferry__ps_limits *lim) {
    memset(t, 0, sizeof *t);
    t->lim = lim;
    t->buckets = calloc(CTX_BUCKETS, sizeof *t->buckets);
    if (t->buckets == NULL)
        return FERRY_NOMEM();
    t->nbuckets = CTX_BUCKETS;
    t->ttl_s = ttl_s;
    pthread_mutex_init(&t->mu, NULL);
    atomic_init(&t->bytes, 0);
    atomic_init(&t->created, 0);
    atomic_init(&t->swept, 0);
    atomic_init(&t->stepped, 0);
    atomic_init(&t->released, 0);
    atomic_init(&t->replayed, 0);
    atomic_init(&t->early, 0);
    atomic_init(&t->overlapped, 0);
    return FERRY_OK;
}

static void call_free(ferry__ps_call *call) {
    ferry__ps_saved_free(&call->saved);
    for (int i = 0; i < call->nreply; i++)
        ferry_buf_free(call->reply[i].data);
    free(call->reply);
    free(call);
}

/* Takes c's bytes and its place out of the table's and its identity's accounts, once.
 * Done under the table lock where c is freed (swept, dropped with its session, released
 * by its last holder), so that a Stats reply, which reads the count and the bytes under
 * that lock, does not see a swept context gone from the count with its bytes still
 * charged. (A retired or dropped context still held by a call keeps its bytes until
 * that call releases it.) */
static void ctx_uncharge(ferry__ps_ctx_table *t, ferry__ps_ctx *c) {
    atomic_fetch_sub(&t->bytes, c->bytes);
    if (c->quota != NULL) {
        atomic_fetch_sub(&c->quota->context_bytes, c->bytes);
        atomic_fetch_sub(&c->quota->contexts, 1);
    }
    c->bytes = 0;
    c->quota = NULL;
}

static void ctx_free(ferry__ps_ctx_table *t, ferry__ps_ctx *c) {
    ctx_uncharge(t, c);
    for (ferry__ps_call *call = c->calls, *next; call != NULL; call = next) {
        next = call->next;
        call_free(call);
    }
    for (int i = 0; i < c->nmods; i++) {
        ferry_grads_deinit(&c->mods[i].G);
        ferry__ps_module_put(c->mods[i].mod); /* the context's reference */
    }
    free(c->mods);
    pthread_cond_destroy(&c->late_cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void ferry__ps_ctx_table_deinit(ferry__ps_ctx_table *t) {
    if (t->buckets == NULL)
        return;
    for (int64_t b = 0; b < t->nbuckets; b++) {
        for (ferry__ps_ctx *c = t->buckets[b], *next; c != NULL; c = next) {
            next = c->next;
            ctx_free(t, c);
        }
    }
    free(t->buckets);
    for (int i = 0; i < FERRY__PS_STEPPED_KEEP; i++)
        free(t->stepped_ring[i].head);
    pthread_mutex_destroy(&t->mu);
    memset(t, 0, sizeof *t);
}

/* Unlinks c from its chain; table lock held. */
static void unlink_locked(ferry__ps_ctx_table *t, ferry__ps_ctx *c) {
    ferry__ps_ctx **pp = &t->buckets[ctx_hash(c->sess, c->id) & (uint64_t)(t->nbuckets - 1)];
    while (*pp != c)
        pp = &(*pp)->next;
    *pp = c->next;
    c->next = NULL;
    t->count--;
}

ferry_status ferry__ps_ctx_acquire(ferry__ps_ctx_table *t, uint64_t sess, uint64_t id, int flags,
                                   ferry__ps_ctx **out) {
    return ferry__ps_ctx_acquire_q(t, sess, NULL, id, flags, out);
}

/* A new context's first bytes and its place in the count of its identity's contexts;
 * table lock held. */
static ferry_status ctx_quota(ferry__ps_ctx_table *t, ferry__ps_quota *q, uint64_t id) {
    if (q == NULL)
        return FERRY_OK;
    char what[64];
    (void)snprintf(what, sizeof what, "contexts (a new one, %#llx)", (unsigned long long)id);
    ferry_status st = ferry__ps_quota_take(&q->contexts, t->lim->id_contexts, what, q->identity,
                                           "--max-contexts-per-identity");
    if (st == FERRY_OK &&
        (st = ferry__ps_quota_charge(&q->context_bytes, (int64_t)sizeof(ferry__ps_ctx),
                                     t->lim->id_contexts_bytes, "a new context", q->identity,
                                     "--max-contexts-mb-per-identity")) != FERRY_OK)
        atomic_fetch_sub(&q->contexts, 1);
    return st;
}

/* Whether c (locked, referenced) was retired while this call waited for it; if so it
 * is released. */
static ferry_status still_live(ferry__ps_ctx_table *t, ferry__ps_ctx *c) {
    pthread_mutex_lock(&t->mu);
    int dead = c->dead;
    pthread_mutex_unlock(&t->mu);
    if (!dead)
        return FERRY_OK;
    uint64_t id = c->id;
    ferry__ps_ctx_release(t, c);
    return ferry_errorf(FERRY_ERR_NOT_FOUND,
                        "context %#llx was stepped or released while this call waited",
                        (unsigned long long)id);
}

ferry_status ferry__ps_ctx_settle(ferry__ps_ctx_table *t, ferry__ps_ctx *c) {
    while (c->late_done != c->late_next)
        pthread_cond_wait(&c->late_cv, &c->mu);
    return still_live(t, c);
}

void ferry__ps_ctx_late_begin(ferry__ps_ctx *c) {
    uint64_t turn = c->late_next++;
    while (c->late_done != turn)
        pthread_cond_wait(&c->late_cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

void ferry__ps_ctx_late_end(ferry__ps_ctx *c) {
    pthread_mutex_lock(&c->mu);
    c->late_done++;
    pthread_cond_broadcast(&c->late_cv);
}

ferry_status ferry__ps_ctx_acquire_q(ferry__ps_ctx_table *t, uint64_t sess, ferry__ps_quota *quota,
                                     uint64_t id, int flags, ferry__ps_ctx **out) {
    int create = flags & FERRY__PS_CTX_CREATE;
    if (id == 0)
        return ferry_errorf(FERRY_ERR_INVALID, "context id 0 means no context: this call "
                                               "needs one");
    pthread_mutex_lock(&t->mu);
    ferry__ps_ctx **head = &t->buckets[ctx_hash(sess, id) & (uint64_t)(t->nbuckets - 1)];
    ferry__ps_ctx *c = *head;
    while (c != NULL && (c->id != id || c->sess != sess))
        c = c->next;
    if (c == NULL && create) {
        if (t->count >= t->lim->contexts) {
            pthread_mutex_unlock(&t->mu);
            return ferry_errorf(FERRY_ERR_RESOURCE,
                                "context %#llx: %lld contexts are live, the most this server "
                                "holds (--max-contexts); idle ones are swept after %g s",
                                (unsigned long long)id, (long long)t->count, t->ttl_s);
        }
        long long used = atomic_fetch_add(&t->bytes, (long long)sizeof *c);
        if (used + (long long)sizeof *c > t->lim->contexts_bytes) {
            atomic_fetch_sub(&t->bytes, (long long)sizeof *c);
            pthread_mutex_unlock(&t->mu);
            return ferry__ps_over_budget("a new context", (int64_t)sizeof *c,
                                         "the budget of all contexts", t->lim->contexts_bytes, used,
                                         "--max-contexts-mb");
        }
        ferry_status qs = ctx_quota(t, quota, id);
        if (qs != FERRY_OK || (c = calloc(1, sizeof *c)) == NULL) {
            atomic_fetch_sub(&t->bytes, (long long)sizeof *c);
            if (qs == FERRY_OK && quota != NULL) {
                atomic_fetch_sub(&quota->contexts, 1);
                atomic_fetch_sub(&quota->context_bytes, (long long)sizeof *c);
            }
            pthread_mutex_unlock(&t->mu);
            return qs != FERRY_OK ? qs : FERRY_NOMEM();
        }
        c->bytes = (int64_t)sizeof *c;
        c->id = id;
        c->sess = sess;
        c->quota = quota;
        pthread_mutex_init(&c->mu, NULL);
        pthread_cond_init(&c->late_cv, NULL);
        c->next = *head;
        *head = c;
        t->count++;
        atomic_fetch_add(&t->created, 1);
    }
    if (c != NULL) {
        c->refs++;
        c->last_used = ferry_now();
    }
    pthread_mutex_unlock(&t->mu);
    /* Another session's context with this id is never found: the same answer as for
     * one that does not exist. */
    if (c == NULL)
        return ferry_errorf(FERRY_ERR_NOT_FOUND,
                            "unknown context %#llx: never opened here by a Forward, already "
                            "stepped or released, or swept after %g s idle",
                            (unsigned long long)id, t->ttl_s);
    pthread_mutex_lock(&c->mu);
    ferry_status st =
        flags & FERRY__PS_CTX_UNSETTLED ? still_live(t, c) : ferry__ps_ctx_settle(t, c);
    if (st == FERRY_OK)
        *out = c;
    return st;
}

int ferry__ps_ctx_drop_session(ferry__ps_ctx_table *t, uint64_t sess) {
    ferry__ps_ctx *gone = NULL;
    int n = 0;
    pthread_mutex_lock(&t->mu);
    for (int64_t b = 0; b < t->nbuckets; b++) {
        for (ferry__ps_ctx *c = t->buckets[b], *next; c != NULL; c = next) {
            next = c->next;
            if (c->sess != sess)
                continue;
            unlink_locked(t, c);
            c->dead = 1;
            n++;
            if (c->refs == 0) { /* else its last holder frees it */
                ctx_uncharge(t, c);
                c->next = gone;
                gone = c;
            }
        }
    }
    atomic_fetch_add(&t->swept, n); /* its trainer went away: as if swept */
    pthread_mutex_unlock(&t->mu);
    for (ferry__ps_ctx *c = gone, *next; c != NULL; c = next) {
        next = c->next;
        ctx_free(t, c);
    }
    return n;
}

ferry_status ferry__ps_ctx_charge(ferry__ps_ctx_table *t, ferry__ps_ctx *c, int64_t bytes,
                                  const char *what, const char *name) {
    if (bytes <= 0)
        return FERRY_OK;
    const char *budget = NULL, *flag = NULL;
    int64_t limit = 0, used = 0;
    if (bytes > t->lim->context_bytes - c->bytes) {
        budget = "the per-context budget", flag = "--max-context-mb";
        limit = t->lim->context_bytes, used = c->bytes;
    } else {
        used = atomic_fetch_add(&t->bytes, (long long)bytes);
        if (used + bytes <= t->lim->contexts_bytes && used + bytes >= used) {
            char w[FERRY_RPC_NAME_MAX + 64];
            (void)snprintf(w, sizeof w, "%s", what);
            ferry_status st = c->quota == NULL
                                  ? FERRY_OK
                                  : ferry__ps_quota_charge(
                                        &c->quota->context_bytes, bytes, t->lim->id_contexts_bytes,
                                        w, c->quota->identity, "--max-contexts-mb-per-identity");
            if (st == FERRY_OK) {
                c->bytes += bytes;
                return FERRY_OK;
            }
            atomic_fetch_sub(&t->bytes, (long long)bytes);
            return st;
        }
        atomic_fetch_sub(&t->bytes, (long long)bytes);
        budget = "the budget of all contexts", flag = "--max-contexts-mb";
        limit = t->lim->contexts_bytes;
    }
    char w[FERRY_RPC_NAME_MAX + 64];
    if (name != NULL)
        (void)snprintf(w, sizeof w, "%s '%s'", what, name);
    else
        (void)snprintf(w, sizeof w, "%s", what);
    return ferry__ps_over_budget(w, bytes, budget, limit, used, flag);
}

ferry_status ferry__ps_ctx_charge_grads(ferry__ps_ctx_table *t, ferry__ps_ctx *c,
                                        const ferry_grads *G, int64_t new_rows) {
    return ferry__ps_ctx_charge(t, c, ferry_grads_growth_bound(G, new_rows), "gradient storage",
                                NULL);
}

/* What c really holds: itself, its module list, gradients, saved Forwards and the
 * operands of weight gradients still to form. */
static int64_t ctx_bytes(const ferry__ps_ctx *c) {
    int64_t bytes = (int64_t)sizeof *c + c->cap * (int64_t)sizeof *c->mods + c->late_bytes;
    for (int i = 0; i < c->nmods; i++)
        bytes += ferry_grads_bytes(&c->mods[i].G);
    for (const ferry__ps_call *call = c->calls; call != NULL; call = call->next)
        bytes += (int64_t)(sizeof *call + call->saved.bytes) + call->reply_bytes;
    return bytes;
}

void ferry__ps_ctx_release(ferry__ps_ctx_table *t, ferry__ps_ctx *c) {
    int64_t bytes = ctx_bytes(c);
    atomic_fetch_add(&t->bytes, bytes - c->bytes);
    if (c->quota != NULL)
        atomic_fetch_add(&c->quota->context_bytes, bytes - c->bytes);
    c->bytes = bytes;
    /* The reference is dropped before c's mutex, so that a call that waited for this
     * one (a Step waits for a late weight gradient) finds it dropped: that Step's
     * retire then frees c, and its reply goes out with c's bytes already uncharged.
     * (Lock order: a context's mutex, then the table's, as in retire.) c's mutex is
     * let go while the table's is still held: from refs 0 on, a sweep or a dropped
     * session may free c, and each decides that under the table's lock. */
    pthread_mutex_lock(&t->mu);
    c->refs--;
    c->last_used = ferry_now();
    int free_it = c->dead && c->refs == 0;
    if (free_it)
        ctx_uncharge(t, c);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_unlock(&t->mu);
    if (free_it)
        ctx_free(t, c);
}

void ferry__ps_ctx_retire(ferry__ps_ctx_table *t, ferry__ps_ctx *c, int stepped) {
    pthread_mutex_lock(&t->mu);
    if (!c->dead) {
        unlink_locked(t, c);
        c->dead = 1;
    }
    pthread_mutex_unlock(&t->mu);
    atomic_fetch_add(stepped ? &t->stepped : &t->released, 1);
}

ferry_grads *ferry__ps_ctx_find_grads(ferry__ps_ctx *c, const ferry__ps_module *m) {
    for (int i = 0; i < c->nmods; i++) {
        if (c->mods[i].mod == m)
            return &c->mods[i].G;
    }
    return NULL;
}

ferry_status ferry__ps_ctx_grads(ferry__ps_ctx_table *t, ferry__ps_ctx *c, ferry__ps_module *m,
                                 ferry_grads **out) {
    if ((*out = ferry__ps_ctx_find_grads(c, m)) != NULL)
        return FERRY_OK;
    /* The list entry, gradient flags and per-parameter tables: a few hundred bytes
     * (the gradient storage is charged as it grows). */
    ferry_status st = ferry__ps_ctx_charge(
        t, c, (int64_t)sizeof *c->mods + m->P.count * (int64_t)(1 + sizeof(ferry_rowgrad)),
        "a module's gradient table", NULL);
    if (st != FERRY_OK)
        return st;
    if (c->nmods == c->cap) {
        int cap = c->cap ? 2 * c->cap : 4;
        ferry__ps_ctx_mod *mods = realloc(c->mods, (size_t)cap * sizeof *mods);
        if (mods == NULL)
            return FERRY_NOMEM();
        c->mods = mods;
        c->cap = cap;
    }
    ferry__ps_ctx_mod *cm = &c->mods[c->nmods];
    memset(cm, 0, sizeof *cm);
    cm->mod = m;
    if ((st = ferry_grads_init(&cm->G, &m->P)) != FERRY_OK)
        return st;
    ferry__ps_module_ref(m); /* held while the context holds its gradient */
    c->nmods++;
    *out = &cm->G;
    return FERRY_OK;
}

ferry__ps_call *ferry__ps_ctx_find_call(ferry__ps_ctx *c, const ferry__ps_module *m,
                                        uint64_t call_id) {
    for (ferry__ps_call *call = c->calls; call != NULL; call = call->next) {
        if (call->mod == m && call->call_id == call_id)
            return call;
    }
    return NULL;
}

ferry_status ferry__ps_ctx_save(ferry__ps_ctx *c, ferry__ps_module *m, uint64_t call_id,
                                ferry__ps_saved *sv) {
    if (ferry__ps_ctx_find_call(c, m, call_id) != NULL)
        return ferry_errorf(FERRY_ERR_EXISTS,
                            "%s '%s': context %#llx already has a Forward with call id %llu",
                            ferry__ps_kind_name(m->kind), m->name, (unsigned long long)c->id,
                            (unsigned long long)call_id);
    ferry__ps_call *call = calloc(1, sizeof *call);
    if (call == NULL)
        return FERRY_NOMEM();
    call->call_id = call_id;
    call->mod = m;
    call->saved = *sv;
    memset(sv, 0, sizeof *sv);
    call->next = c->calls;
    c->calls = call;
    return FERRY_OK;
}

void ferry__ps_ctx_drop_call(ferry__ps_ctx *c, ferry__ps_call *call) {
    ferry__ps_call **pp = &c->calls;
    while (*pp != call)
        pp = &(*pp)->next;
    *pp = call->next;
    call_free(call);
}

ferry_status ferry__ps_ctx_finish_call(ferry__ps_ctx *c, ferry__ps_call *call,
                                       const ferry_rpc_msg *reply) {
    (void)c;
    ferry_rpc_tensor *kept = calloc((size_t)reply->ntensors + 1, sizeof *kept);
    if (kept == NULL)
        return FERRY_NOMEM();
    int64_t bytes = 0;
    for (int i = 0; i < reply->ntensors; i++) {
        kept[i] = reply->tensors[i];
        kept[i].release = NULL;
        kept[i].release_user = NULL;
        kept[i].data = ferry_buf_alloc(kept[i].nbytes);
        if (kept[i].data == NULL) {
            for (int k = 0; k < i; k++)
                ferry_buf_free(kept[k].data);
            free(kept);
            return FERRY_NOMEM();
        }
        if (kept[i].nbytes > 0)
            memcpy(kept[i].data, reply->tensors[i].data, kept[i].nbytes);
        bytes += (int64_t)kept[i].nbytes;
    }
    ferry__ps_saved_free(&call->saved);
    call->done = 1;
    call->reply = kept;
    call->nreply = reply->ntensors;
    call->reply_bytes = bytes;
    return FERRY_OK;
}

ferry_status ferry__ps_ctx_replay_call(ferry__ps_ctx_table *t, const ferry__ps_call *call,
                                       ferry_rpc_msg *reply) {
    ferry_status st = FERRY_OK;
    for (int i = 0; i < call->nreply && st == FERRY_OK; i++) {
        ferry_rpc_tensor v = call->reply[i];
        if (v.nbytes == 0)
            v.data = NULL;
        st = ferry_rpc_msg_add_copy(reply, &v);
    }
    if (st == FERRY_OK)
        atomic_fetch_add(&t->replayed, 1);
    return st;
}

void ferry__ps_ctx_remember_step(ferry__ps_ctx_table *t, uint64_t sess, uint64_t id,
                                 const ferry_rpc_msg *reply) {
    uint8_t *head = malloc(reply->head_len + 1);
    if (head == NULL)
        return; /* a retry of this Step will be told the context is gone */
    if (reply->head_len > 0)
        memcpy(head, reply->head_bytes, reply->head_len);
    pthread_mutex_lock(&t->mu);
    ferry__ps_stepped *e = &t->stepped_ring[t->stepped_next];
    t->stepped_next = (t->stepped_next + 1) % FERRY__PS_STEPPED_KEEP;
    free(e->head);
    e->sess = sess;
    e->id = id;
    e->head = head;
    e->len = reply->head_len;
    pthread_mutex_unlock(&t->mu);
}

ferry_status ferry__ps_ctx_stepped_reply(ferry__ps_ctx_table *t, uint64_t sess, uint64_t id,
                                         ferry_rpc_msg *reply) {
    Ferry__V1__StepReply *r = NULL;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < FERRY__PS_STEPPED_KEEP && id != 0; i++) {
        const ferry__ps_stepped *e = &t->stepped_ring[i];
        if (e->id == id && e->sess == sess && e->head != NULL) {
            r = ferry__v1__step_reply__unpack(NULL, e->len, e->head);
            break;
        }
    }
    pthread_mutex_unlock(&t->mu);
    if (r == NULL)
        return FERRY_ERR_NOT_FOUND;
    ferry_status st = ferry_rpc_msg_set_head(reply, &r->base);
    ferry__v1__step_reply__free_unpacked(r, NULL);
    if (st == FERRY_OK)
        atomic_fetch_add(&t->replayed, 1);
    return st;
}

int ferry__ps_ctx_sweep(ferry__ps_ctx_table *t) {
    double now = ferry_now();
    ferry__ps_ctx *expired = NULL;
    pthread_mutex_lock(&t->mu);
    for (int64_t b = 0; b < t->nbuckets; b++) {
        for (ferry__ps_ctx *c = t->buckets[b], *next; c != NULL; c = next) {
            next = c->next;
            if (c->refs == 0 && now - c->last_used > t->ttl_s) {
                unlink_locked(t, c);
                c->dead = 1;
                c->next = expired;
                expired = c;
                ctx_uncharge(t, c);
                atomic_fetch_add(&t->swept, 1);
            }
        }
    }
    pthread_mutex_unlock(&t->mu);
    int n = 0;
    for (ferry__ps_ctx *c = expired, *next; c != NULL; c = next, n++) {
        next = c->next;
        int ncalls = 0;
        for (const ferry__ps_call *call = c->calls; call != NULL; call = call->next)
            ncalls++;
        FERRY_LOG_INFO("swept context %#llx: idle %.1f s (ttl %g s), %d modules, %d pending "
                       "calls, %lld bytes freed",
                       (unsigned long long)c->id, now - c->last_used, t->ttl_s, c->nmods, ncalls,
                       (long long)ctx_bytes(c));
        ctx_free(t, c);
    }
    /* The contexts of dead trainers are gone: give their pages back to the system
     * rather than keep them for steps that may never come. */
    if (n > 0)
        ferry_rpc_release_idle_memory();
    return n;
}

int64_t ferry__ps_ctx_live(ferry__ps_ctx_table *t, int64_t *bytes) {
    pthread_mutex_lock(&t->mu);
    int64_t n = t->count;
    if (bytes != NULL)
        *bytes = atomic_load(&t->bytes);
    pthread_mutex_unlock(&t->mu);
    return n;
}
