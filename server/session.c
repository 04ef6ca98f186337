/* session.c - the sessions of a ferry-ps (proto/ferry.proto section 2). Hello opens
 * one: a 128-bit random id, bound to the caller's identity as the RPC layer
 * established it from its credentials. Every later call names its session in
 * metadata, and the handler adapter (handlers.c) looks it up here before the handler
 * runs; a session unknown, expired or presented with another identity's credentials
 * is refused with FERRY_ERR_SESSION, the same answer for all three.
 *
 * A session lives while its client calls within the TTL or holds a Session stream
 * open (a lease). When it ends, what belongs to it goes: its contexts, its waiting
 * job calls, its job ranks (the state's end hook). Contexts, ranks and remembered
 * replies refer to a session by its serial, a number never reused in this process, so
 * no pointer outlives the session it names.
 *
 * Locking: the table's mutex guards every session's fields; it is never held while
 * calling out (the end hook runs after it is released). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/core/log.h"
#include "server/ps-impl.h"

#define SESSION_BUCKETS 1024 /* power of two */

static uint64_t id_hash(const char *id) {
    uint64_t h = 1469598103934665603ull;
    for (const char *p = id; *p != '\0'; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return h;
}

ferry_status ferry__ps_sessions_init(ferry__ps_sessions *S, double ttl_s, int max, int max_per_id,
                                     ferry__ps_quotas *quotas) {
    memset(S, 0, sizeof *S);
    S->quotas = quotas;
    if ((S->buckets = calloc(SESSION_BUCKETS, sizeof *S->buckets)) == NULL)
        return FERRY_NOMEM();
    pthread_mutex_init(&S->mu, NULL);
    S->ttl_s = ttl_s;
    S->max = max;
    S->max_per_identity = max_per_id;
    S->next_serial = 1;
    /* In-process calls (ferry__ps_dispatch: fuzz targets, tools) run as this one. */
    S->local.serial = FERRY__PS_LOCAL_SESSION;
    (void)snprintf(S->local.identity, sizeof S->local.identity, "local");
    S->local.role = FERRY_RPC_ROLE_ADMIN;
    S->local.authority = 1;
    S->local.refs = 1;
    S->local.quota = ferry__ps_quota_of(quotas, "local");
    return FERRY_OK;
}

void ferry__ps_sessions_deinit(ferry__ps_sessions *S) {
    for (int b = 0; S->buckets != NULL && b < SESSION_BUCKETS; b++) {
        for (ferry__ps_session *s = S->buckets[b], *next; s != NULL; s = next) {
            next = s->next;
            free(s);
        }
    }
    free(S->buckets);
    if (S->buckets != NULL)
        pthread_mutex_destroy(&S->mu);
    memset(S, 0, sizeof *S);
}

static ferry__ps_session *find_locked(ferry__ps_sessions *S, const char *id) {
    ferry__ps_session *s = S->buckets[id_hash(id) & (SESSION_BUCKETS - 1)];
    while (s != NULL && strcmp(s->id, id) != 0)
        s = s->next;
    return s;
}

static void unlink_locked(ferry__ps_sessions *S, ferry__ps_session *s) {
    ferry__ps_session **pp = &S->buckets[id_hash(s->id) & (SESSION_BUCKETS - 1)];
    while (*pp != s)
        pp = &(*pp)->next;
    *pp = s->next;
    s->next = NULL;
    S->count--;
}

/* The caller's credentials match the session's: same identity, same authority. */
static int same_caller(const ferry__ps_session *s, const ferry_rpc_caller_info *who) {
    return strcmp(s->identity, who->identity) == 0 && s->authority == who->authority &&
           s->role == who->role;
}

static int count_identity_locked(ferry__ps_sessions *S, const char *identity) {
    int n = 0;
    for (int b = 0; b < SESSION_BUCKETS; b++)
        for (const ferry__ps_session *s = S->buckets[b]; s != NULL; s = s->next)
            n += !s->dead && strcmp(s->identity, identity) == 0;
    return n;
}

ferry_status ferry__ps_session_open(ferry__ps_sessions *S, const ferry_rpc_caller_info *who,
                                    ferry__ps_session **out) {
    pthread_mutex_lock(&S->mu);
    ferry__ps_session *s = who->session[0] != '\0' ? find_locked(S, who->session) : NULL;
    if (s != NULL && !s->dead && same_caller(s, who)) { /* renewed: the same session */
        s->refs++;
        s->last_used = ferry_now();
        pthread_mutex_unlock(&S->mu);
        *out = s;
        return FERRY_OK;
    }
    if (S->count >= S->max) {
        int n = S->count;
        pthread_mutex_unlock(&S->mu);
        return ferry_errorf(FERRY_ERR_RESOURCE,
                            "Hello: %d sessions are live, the most this server holds "
                            "(--max-sessions); idle ones expire after %g s",
                            n, S->ttl_s);
    }
    if (count_identity_locked(S, who->identity) >= S->max_per_identity) {
        pthread_mutex_unlock(&S->mu);
        return ferry_errorf(FERRY_ERR_RESOURCE,
                            "Hello: identity '%s' holds %d live sessions, the most one identity "
                            "may (--max-sessions-per-identity); reuse a session",
                            who->identity, S->max_per_identity);
    }
    if ((s = calloc(1, sizeof *s)) == NULL) {
        pthread_mutex_unlock(&S->mu);
        return FERRY_NOMEM();
    }
    uint8_t raw[FERRY_RPC_SESSION_LEN / 2];
    do {
        if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) {
            free(s);
            pthread_mutex_unlock(&S->mu);
            return ferry_errorf(FERRY_ERR_IO, "Hello: no randomness for a session id");
        }
        for (size_t i = 0; i < sizeof raw; i++)
            (void)snprintf(s->id + 2 * i, 3, "%02x", raw[i]);
    } while (find_locked(S, s->id) != NULL);
    s->serial = S->next_serial++;
    (void)snprintf(s->identity, sizeof s->identity, "%s", who->identity);
    (void)snprintf(s->label, sizeof s->label, "%s", who->label);
    s->role = who->role;
    s->authority = who->authority;
    s->quota = ferry__ps_quota_of(S->quotas, who->identity); /* NULL (no memory): uncharged */
    s->created = s->last_used = ferry_now();
    s->refs = 2; /* the table's and the caller's */
    ferry__ps_session **head = &S->buckets[id_hash(s->id) & (SESSION_BUCKETS - 1)];
    s->next = *head;
    *head = s;
    S->count++;
    S->opened++;
    pthread_mutex_unlock(&S->mu);
    FERRY_LOG_DEBUG("session #%llu opened for '%s' (%s)", (unsigned long long)s->serial,
                    s->identity, s->label);
    *out = s;
    return FERRY_OK;
}

ferry_status ferry__ps_session_enter(ferry__ps_sessions *S, const ferry_rpc_caller_info *who,
                                     const char *method, ferry__ps_session **out) {
    if (who == NULL) { /* an in-process call */
        *out = &S->local;
        return FERRY_OK;
    }
    pthread_mutex_lock(&S->mu);
    ferry__ps_session *s = who->session[0] != '\0' ? find_locked(S, who->session) : NULL;
    int ok = s != NULL && !s->dead && same_caller(s, who);
    if (ok) {
        s->refs++;
        s->last_used = ferry_now();
    }
    pthread_mutex_unlock(&S->mu);
    if (!ok)
        return ferry_errorf(FERRY_ERR_SESSION,
                            who->session[0] == '\0'
                                ? "%s: no session (say Hello first, then send its session as "
                                  "metadata ferry-session)"
                                : "%s: unknown or expired session (this server restarted, the "
                                  "session expired, or it is not this caller's): say Hello again",
                            method);
    *out = s;
    return FERRY_OK;
}

void ferry__ps_session_leave(ferry__ps_sessions *S, ferry__ps_session *s) {
    if (s == NULL || s == &S->local)
        return;
    pthread_mutex_lock(&S->mu);
    s->last_used = ferry_now();
    int free_it = --s->refs == 0;
    pthread_mutex_unlock(&S->mu);
    if (free_it)
        free(s);
}

/* Called lately: a call in flight (a reference beyond the table's), however long it
 * has queued or run, or one within the TTL. Table lock held. */
static int calling_locked(const ferry__ps_sessions *S, const ferry__ps_session *s, double now) {
    return s->refs > 1 || now - s->last_used <= S->ttl_s;
}

/* Alive for the purpose of holding a job rank: a lease open, or (for a client that
 * never opened one) calling. Table lock held. */
static int holds_locked(const ferry__ps_sessions *S, const ferry__ps_session *s, double now) {
    if (s->dead)
        return 0;
    if (s->leases > 0)
        return 1;
    return !s->had_lease && calling_locked(S, s, now);
}

int ferry__ps_session_holds(ferry__ps_sessions *S, uint64_t serial) {
    if (serial == FERRY__PS_LOCAL_SESSION)
        return 1;
    double now = ferry_now();
    int live = 0;
    pthread_mutex_lock(&S->mu);
    for (int b = 0; b < SESSION_BUCKETS && !live; b++)
        for (const ferry__ps_session *s = S->buckets[b]; s != NULL; s = s->next)
            if (s->serial == serial) {
                live = holds_locked(S, s, now);
                break;
            }
    pthread_mutex_unlock(&S->mu);
    return live;
}

ferry_status ferry__ps_session_lease_open(ferry__ps_sessions *S, const ferry_rpc_caller_info *who,
                                          ferry__ps_session **out) {
    ferry__ps_session *s;
    ferry_status st = ferry__ps_session_enter(S, who, "Session", &s);
    if (st != FERRY_OK)
        return st;
    pthread_mutex_lock(&S->mu);
    if (s->leases >= FERRY__PS_SESSION_LEASES) {
        pthread_mutex_unlock(&S->mu);
        ferry__ps_session_leave(S, s);
        return ferry_errorf(FERRY_ERR_RESOURCE,
                            "Session: this session holds %d open streams, "
                            "the most one may",
                            FERRY__PS_SESSION_LEASES);
    }
    s->leases++;
    s->had_lease = 1;
    pthread_mutex_unlock(&S->mu);
    *out = s; /* the stream keeps the reference until it closes */
    return FERRY_OK;
}

uint64_t ferry__ps_session_lease_close(ferry__ps_sessions *S, ferry__ps_session *s) {
    pthread_mutex_lock(&S->mu);
    s->leases--;
    int last = s->leases == 0;
    uint64_t serial = s->serial;
    pthread_mutex_unlock(&S->mu);
    if (last)
        FERRY_LOG_DEBUG("session #%llu ('%s'): its Session stream closed",
                        (unsigned long long)serial, s->identity);
    ferry__ps_session_leave(S, s);
    return last ? serial : 0;
}

int ferry__ps_sessions_sweep(ferry__ps_sessions *S, uint64_t *ended, int cap) {
    double now = ferry_now();
    int n = 0;
    ferry__ps_session *gone = NULL;
    pthread_mutex_lock(&S->mu);
    for (int b = 0; b < SESSION_BUCKETS && n < cap; b++) {
        for (ferry__ps_session *s = S->buckets[b], *next; s != NULL && n < cap; s = next) {
            next = s->next;
            if (s->leases > 0 || calling_locked(S, s, now))
                continue;
            unlink_locked(S, s);
            s->dead = 1;
            S->expired++;
            ended[n++] = s->serial;
            if (--s->refs == 0) { /* the table's reference */
                s->next = gone;
                gone = s;
            }
        }
    }
    pthread_mutex_unlock(&S->mu);
    for (ferry__ps_session *s = gone, *next; s != NULL; s = next) {
        next = s->next;
        FERRY_LOG_DEBUG("session #%llu ('%s') expired after %.0f s idle",
                        (unsigned long long)s->serial, s->identity, now - s->last_used);
        free(s);
    }
    return n;
}

void ferry__ps_sessions_counts(ferry__ps_sessions *S, int64_t *live, int64_t *opened,
                               int64_t *expired, int64_t *leases) {
    pthread_mutex_lock(&S->mu);
    *live = S->count;
    *opened = (int64_t)S->opened;
    *expired = (int64_t)S->expired;
    int64_t l = 0;
    for (int b = 0; b < SESSION_BUCKETS; b++)
        for (const ferry__ps_session *s = S->buckets[b]; s != NULL; s = s->next)
            l += s->leases;
    *leases = l;
    pthread_mutex_unlock(&S->mu);
}

#define PROBE_RATE  10.0 /* Job probes per second and session ... */
#define PROBE_BURST 20.0 /* ... in bursts of this many */

ferry_status ferry__ps_session_probe_rate(ferry__ps_sessions *S, ferry__ps_session *s) {
    if (s == &S->local)
        return FERRY_OK;
    double now = ferry_now();
    pthread_mutex_lock(&S->mu);
    if (s->probe_last == 0.0)
        s->probe_tokens = PROBE_BURST;
    else
        s->probe_tokens += (now - s->probe_last) * PROBE_RATE;
    s->probe_tokens = s->probe_tokens > PROBE_BURST ? PROBE_BURST : s->probe_tokens;
    s->probe_last = now;
    int ok = s->probe_tokens >= 1.0;
    if (ok)
        s->probe_tokens -= 1.0;
    pthread_mutex_unlock(&S->mu);
    if (!ok)
        return ferry_errorf(FERRY_ERR_RESOURCE,
                            "Job probe refused: more than %.0f a second from this session; try "
                            "again shortly",
                            PROBE_RATE);
    return FERRY_OK;
}
