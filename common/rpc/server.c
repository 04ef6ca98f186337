/* server.c - the ferry.v1.Ferry gRPC server on the completion-queue API. Methods
 * with a handler are registered so that the request arrives with the call;
 * one catch-all slot answers every other path with UNIMPLEMENTED. N threads
 * poll one queue and run handlers inline. Shutdown is asynchronous: stop
 * accepting, drain, cancel what is left after the grace period, and let the
 * threads exit once gRPC reports the queue empty (spec/grpc-core.md §3). */
#include <assert.h>
#include <errno.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/support/alloc.h>

#include "common/core/log.h"
#include "common/rpc/sched.h"
#include "common/rpc/transport-grpc.h"

#include "ferry.pb-c.h"
#include "health.pb-c.h"

#define CATCH_ALL       (-1) /* server_call.method of the unregistered slot */
#define CATCH_ALL_SLOTS 2
/* grpc.health.v1.Health, served here for every daemon: methods after ferry's own. */
#define HEALTH_CHECK  FERRY_RPC_METHOD_COUNT
#define HEALTH_WATCH  (FERRY_RPC_METHOD_COUNT + 1)
#define SESSION_LEASE (FERRY_RPC_METHOD_COUNT + 2) /* the Session stream (lease ops) */
#define NMETHODS      (FERRY_RPC_METHOD_COUNT + 3)
#define HEALTH_SLOTS  2
#define LEASE_SLOTS   2
static const char *const health_paths[2] = {"/grpc.health.v1.Health/Check",
                                            "/grpc.health.v1.Health/Watch"};

#define MAX_WATCHERS 64    /* open Health/Watch streams; later ones get one answer */
#define PEND_MIN_BYTES   4096  /* replies counted against the unread-reply limits */
#define REFUSAL_WINDOW_S 10.0  /* refusal log: a window ... */
#define REFUSAL_LINES    20    /* ... logs this many in full ... */
#define REFUSAL_KINDS    16    /* ... and counts the rest by this many (status, identity) */
#define MAX_LEASES   65536 /* open Session streams, all sessions (each session caps its own) */

/* The bytes of replies one connection has not taken yet. */
typedef struct pend_peer {
    char *peer; /* grpc_call_get_peer's text: "ipv4:10.0.0.2:53122" */
    int64_t bytes;
    int calls;
    struct pend_peer *next;
} pend_peer;

/* One line of the token table, owned. */
typedef struct srv_identity {
    char name[FERRY_RPC_IDENTITY_MAX];
    ferry_rpc_role role;
    char *token;
    size_t token_len;
} srv_identity;

struct ferry_rpc_server {
    grpc_server *server;
    grpc_completion_queue *cq;
    void *registered[NMETHODS]; /* NULL: no handler, served by the catch-all */
    ferry_rpc_handler handlers[FERRY_RPC_METHOD_COUNT];
    void *user;
    uint64_t incarnation; /* 0: not checked */
    srv_identity *ids;    /* the token table; none: no token checks */
    int nids;
    ferry_rpc_role method_role[FERRY_RPC_METHOD_COUNT];
    ferry_rpc_lease_ops lease;
    unsigned char cheap[FERRY_RPC_METHOD_COUNT]; /* answered on the polling threads */
    ferry__rpc_sched *sched; /* every other method: the fair work queue (sched.c) */
    int mtls;             /* clients present certificates */
    atomic_int serving;   /* grpc.health.v1: 1 SERVING, 0 NOT_SERVING */
    struct server_call *watchers[MAX_WATCHERS]; /* open Health/Watch streams (mu) */
    int nwatchers;
    struct server_call *leases; /* open Session streams, a list through lease_next (mu) */
    int nleases;
    ferry__rpc_meter meter[FERRY_RPC_STATS_SLOTS];
    ferry__rpc_limits lim;
    int port;
    int slots;
    int grpc_inited, started;
    char shutdown_tag; /* its address is the tag of grpc_server_shutdown_and_notify */

    pthread_t *threads;
    int nthreads;       /* threads started */
    pthread_mutex_t mu; /* guards alive and cancel_at */
    pthread_cond_t cv;  /* signalled when alive drops to 0 */
    int alive;
    gpr_timespec cancel_at; /* when in-flight calls are cancelled; valid once shutting_down */
    atomic_int shutting_down, cancelled;
    atomic_int tag_fired; /* gRPC reported the server shut down */
    atomic_int live;      /* server_call objects in existence (posted or in flight) */
    atomic_int cq_closed;

    atomic_uint_fast64_t calls, errors, bytes_in, bytes_out;
    atomic_int_fast64_t in_flight;

    /* Replies sent but not yet taken by their client (held until gRPC has written them),
     * per connection and in all (pend_mu), and the calls holding them: refused past
     * max_pending_*, cancelled once older than reply_timeout_s (ferry_rpc_server_reap). */
    /* Refusals in the log: the first REFUSAL_LINES of each REFUSAL_WINDOW_S window in
     * full, the rest counted by status and identity into one summary line (log_mu). */
    pthread_mutex_t log_mu;
    double log_window_start;
    int log_lines;
    struct refusal_count {
        int code;
        char identity[FERRY_RPC_IDENTITY_MAX];
        uint64_t n;
    } log_counts[REFUSAL_KINDS];
    int log_nkinds;
    uint64_t log_other; /* refusals of kinds past REFUSAL_KINDS */

    pthread_mutex_t pend_mu;
    struct pend_peer *peers;
    struct server_call *pending; /* replies in flight, a list through pend_next */
    int64_t pend_total, pend_max_total, pend_max_peer;
    double reply_timeout_s;
    atomic_uint_fast64_t pend_refused, pend_cancelled;

    /* FERRY_RPC_RECORD=DIR: the first RECORD_MAX requests of each method are written
     * to DIR/<Method>-<n>.bin as they arrived (the fuzz targets' seeds). */
    char record_dir[512];
    atomic_int recorded[FERRY_RPC_METHOD_COUNT];
};

#define RECORD_MAX 16

typedef enum call_state {
    CALL_WAIT_NEW,    /* posted, waiting for a client */
    CALL_REPLYING,    /* reply batch started */
    CALL_WATCH_FIRST, /* Health/Watch: the first status is being sent */
    CALL_WATCHING,    /* Health/Watch: open, in srv->watchers, no batch running */
    CALL_LEASE_FIRST, /* Session: the "open" event is being sent */
    CALL_LEASE_OPEN,  /* Session: open, in srv->leases, waiting for the client to go */
} call_state;

/* Everything a call's batches point to lives here until the last one completes. */
typedef struct server_call {
    ferry_rpc_server *srv;
    int method; /* ferry_rpc_method, or CATCH_ALL */
    call_state state;
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array req_md;
    grpc_call_details details; /* CATCH_ALL only */
    grpc_byte_buffer *req_bb;
    grpc_byte_buffer *reply_bb;
    grpc_status_code code;
    grpc_slice status_details;
    grpc_metadata trailer; /* FERRY_RPC_STATUS_KEY on errors */
    char status_text[16];
    int cancelled;
    int deferred;     /* the handler called ferry_rpc_defer: the reply comes later */
    int early;        /* the handler called ferry_rpc_reply_now: answered, still running */
    atomic_int holds; /* owners: the reply batch, and the handler's thread while it runs */
    ferry_rpc_caller_info caller;                 /* ferry_rpc_caller */
    void *lease_handle;                           /* Session: what lease.open returned */
    struct server_call *lease_next, **lease_prev; /* srv->leases (mu) */
    double t0;        /* when the call arrived */
    /* Its reply while unread (pend_charge .. pend_release; srv->pend_mu). */
    int64_t pend_bytes;
    struct pend_peer *pend_peer;
    double pend_since;
    struct server_call *pend_next, **pend_prev;
    grpc_op ops[4];
} server_call;

/* The server whose poll loop runs on this thread, to catch destroy from a handler. */
static _Thread_local ferry_rpc_server *poll_thread_server;

/* ---- Call slots ---------------------------------------------------------------- */

/* The queue may be shut down only when no call can start another batch on it.
 * gRPC's shutdown tag is not enough: after grpc_server_cancel_all_calls it
 * fires while a handler may still be running, and that handler's reply would
 * then hit a closed queue. So we also wait for every server_call to be freed.
 * Both conditions are checked by whoever changes one of them last. */
static void cq_maybe_close(ferry_rpc_server *srv) {
    if (atomic_load(&srv->tag_fired) && atomic_load(&srv->live) == 0 &&
        !atomic_exchange(&srv->cq_closed, 1))
        grpc_completion_queue_shutdown(srv->cq);
}

/* The reply's bytes leave the count (its batch completed or failed). */
static void pend_release(server_call *c) {
    ferry_rpc_server *srv = c->srv;
    pthread_mutex_lock(&srv->pend_mu);
    if (c->pend_peer == NULL) {
        pthread_mutex_unlock(&srv->pend_mu);
        return;
    }
    srv->pend_total -= c->pend_bytes;
    pend_peer *p = c->pend_peer;
    p->bytes -= c->pend_bytes;
    if (--p->calls == 0) { /* the connection holds nothing: forget it */
        pend_peer **pp = &srv->peers;
        while (*pp != p)
            pp = &(*pp)->next;
        *pp = p->next;
        gpr_free(p->peer);
        free(p);
    }
    if (c->pend_prev != NULL) {
        *c->pend_prev = c->pend_next;
        if (c->pend_next != NULL)
            c->pend_next->pend_prev = c->pend_prev;
    }
    c->pend_prev = NULL;
    c->pend_peer = NULL;
    pthread_mutex_unlock(&srv->pend_mu);
}

/* Counts a reply of n bytes against its connection's and the server's limits before it
 * is sent: FERRY_ERR_RESOURCE when they would be passed (a connection may always hold
 * one reply). */
static ferry_status pend_charge(server_call *c, size_t n) {
    ferry_rpc_server *srv = c->srv;
    if (srv->pend_max_total <= 0)
        return FERRY_OK;
    char *peer = grpc_call_get_peer(c->call);
    if (peer == NULL)
        return FERRY_OK;
    pthread_mutex_lock(&srv->pend_mu);
    pend_peer *p = srv->peers;
    while (p != NULL && strcmp(p->peer, peer) != 0)
        p = p->next;
    int64_t held = p != NULL ? p->bytes : 0;
    ferry_status st = FERRY_OK;
    if ((held > 0 && held + (int64_t)n > srv->pend_max_peer) ||
        srv->pend_total + (int64_t)n > srv->pend_max_total) {
        st = ferry_errorf(FERRY_ERR_RESOURCE,
                          "reply of %.1f MiB refused: %s replies not yet read hold %.1f MiB (at "
                          "most %.0f MiB per connection, %.0f MiB in all; --max-pending-reply-mb)",
                          (double)n / 1048576.0, held > 0 ? "this connection's" : "the",
                          (double)(held > 0 ? held : srv->pend_total) / 1048576.0,
                          (double)srv->pend_max_peer / 1048576.0,
                          (double)srv->pend_max_total / 1048576.0);
    } else if (p == NULL && (p = calloc(1, sizeof *p)) == NULL) {
        st = FERRY_NOMEM();
    } else {
        if (p->peer == NULL) {
            p->peer = peer;
            peer = NULL;
            p->next = srv->peers;
            srv->peers = p;
        }
        p->bytes += (int64_t)n;
        p->calls++;
        srv->pend_total += (int64_t)n;
        c->pend_bytes = (int64_t)n;
        c->pend_peer = p;
        c->pend_since = ferry_now();
        c->pend_next = srv->pending;
        if (srv->pending != NULL)
            srv->pending->pend_prev = &c->pend_next;
        c->pend_prev = &srv->pending;
        srv->pending = c;
    }
    pthread_mutex_unlock(&srv->pend_mu);
    if (peer != NULL)
        gpr_free(peer);
    if (st != FERRY_OK)
        atomic_fetch_add(&srv->pend_refused, 1);
    return st;
}

static void call_free(server_call *c) {
    ferry_rpc_server *srv = c->srv;
    pend_release(c);
    grpc_metadata_array_destroy(&c->req_md);
    if (c->method == CATCH_ALL)
        grpc_call_details_destroy(&c->details);
    if (c->req_bb != NULL)
        grpc_byte_buffer_destroy(c->req_bb);
    if (c->reply_bb != NULL)
        grpc_byte_buffer_destroy(c->reply_bb);
    grpc_slice_unref(c->status_details);
    if (c->call != NULL)
        grpc_call_unref(c->call);
    free(c);
    if (atomic_fetch_sub(&srv->live, 1) == 1)
        cq_maybe_close(srv);
}

/* The reply batch's end, or the end of the handler's run, lets go of c; the last
 * owner frees it. A handler's reply may go out before the handler returns (early, or
 * deferred and finished by another call), so both own it while the handler runs. */
static void call_drop(server_call *c) {
    if (atomic_fetch_sub(&c->holds, 1) == 1)
        call_free(c);
}

/* Offers one slot for the next call of `method`. Failure only loses a slot. */
static void call_post(ferry_rpc_server *srv, int method) {
    server_call *c = calloc(1, sizeof *c);
    if (c == NULL) {
        FERRY_LOG_ERROR("rpc server: no memory to post a call slot");
        return;
    }
    atomic_fetch_add(&srv->live, 1);
    atomic_init(&c->holds, 1); /* the reply batch's */
    c->srv = srv;
    c->method = method;
    c->state = CALL_WAIT_NEW;
    c->status_details = grpc_empty_slice();
    grpc_metadata_array_init(&c->req_md);
    grpc_call_error e;
    if (method == CATCH_ALL) {
        grpc_call_details_init(&c->details);
        e = grpc_server_request_call(srv->server, &c->call, &c->details, &c->req_md, srv->cq,
                                     srv->cq, c);
    } else {
        e = grpc_server_request_registered_call(srv->server, srv->registered[method], &c->call,
                                                &c->deadline, &c->req_md, &c->req_bb, srv->cq,
                                                srv->cq, c);
    }
    if (e != GRPC_CALL_OK) {
        FERRY_LOG_ERROR("rpc server: cannot post a call slot: %s", grpc_call_error_to_string(e));
        call_free(c);
    }
}

/* Sends the status (code, detail, and st as trailing metadata) and the reply,
 * if any, in one batch, always with initial metadata: a trailers-only answer
 * never reached 1.51 clients (spec/grpc-core.md §9, pitfall 1). */
static void call_reply(server_call *c, ferry_status st, grpc_status_code code, const char *detail) {
    grpc_op *op = c->ops;
    size_t n = 0;
    memset(c->ops, 0, sizeof c->ops);
    c->code = code;
    op[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (c->reply_bb != NULL && st == FERRY_OK) {
        op[n].op = GRPC_OP_SEND_MESSAGE;
        op[n++].data.send_message.send_message = c->reply_bb;
    }
    op[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    op[n].data.send_status_from_server.status = c->code;
    if (st != FERRY_OK) {
        c->status_details = grpc_slice_from_copied_string(detail);
        op[n].data.send_status_from_server.status_details = &c->status_details;
        int len = snprintf(c->status_text, sizeof c->status_text, "%d", (int)st);
        c->trailer.key = grpc_slice_from_static_string(FERRY_RPC_STATUS_KEY);
        c->trailer.value = grpc_slice_from_static_buffer(c->status_text, (size_t)len);
        op[n].data.send_status_from_server.trailing_metadata_count = 1;
        op[n].data.send_status_from_server.trailing_metadata = &c->trailer;
    }
    n++;
    op[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op[n++].data.recv_close_on_server.cancelled = &c->cancelled;
    c->state = CALL_REPLYING;
    /* Counted before sending, so a client that has its answer sees it counted. */
    int slot = c->method == HEALTH_CHECK || c->method == HEALTH_WATCH ? FERRY_RPC_STATS_HEALTH
               : c->method == CATCH_ALL                               ? FERRY_RPC_STATS_OTHER
               : c->method == SESSION_LEASE                           ? FERRY_RPC_STATS_SESSION
                                                                      : c->method;
    ferry__rpc_meter_add(&c->srv->meter[slot], (int)code, ferry_now() - c->t0);
    atomic_fetch_add(&c->srv->calls, 1);
    if (code != GRPC_STATUS_OK)
        atomic_fetch_add(&c->srv->errors, 1);
    grpc_call_error e = grpc_call_start_batch(c->call, c->ops, n, c, NULL);
    if (e != GRPC_CALL_OK) {
        FERRY_LOG_ERROR("rpc server: cannot send a reply: %s", grpc_call_error_to_string(e));
        atomic_fetch_sub(&c->srv->in_flight, 1);
        call_drop(c);
    }
}

/* ---- Serving one call ---------------------------------------------------------------- */

/* Encodes the handler's reply into c->reply_bb, handing its tensors to gRPC. */
static ferry_status reply_encode(server_call *c, const ferry__rpc_method_info *mi,
                                 ferry_rpc_msg *reply) {
    for (int i = 0; i < reply->ntensors; i++) {
        const ferry_rpc_tensor *t = &reply->tensors[i];
        if (t->nbytes > 0 && t->release == NULL)
            return ferry_errorf(FERRY_ERR_INVALID,
                                "%s handler returned borrowed tensor '%s' (use ferry_rpc_msg_alloc,"
                                " _add_copy, or a release function)",
                                mi->name, t->name);
    }
    ferry__rpc_wire w;
    ferry__rpc_wire_init(&w);
    ferry_status st = ferry__rpc_encode(reply, mi->reply, FERRY_RPC_INLINE_MAX, &w);
    if (st == FERRY_OK && w.total > c->srv->lim.max_message_bytes)
        st = ferry_errorf(FERRY_ERR_RANGE, "%s reply of %zu bytes exceeds the %zu-byte limit",
                          mi->name, w.total, c->srv->lim.max_message_bytes);
    if (st == FERRY_OK && w.total >= PEND_MIN_BYTES)
        st = pend_charge(c, w.total);
    if (st == FERRY_OK) {
        c->reply_bb = ferry__grpc_bb_owned(&w, reply);
        atomic_fetch_add(&c->srv->bytes_out, w.total);
    }
    ferry__rpc_wire_deinit(&w);
    return st;
}

/* The value of request metadata `key`, or NULL when absent. */
static const grpc_slice *md_find(const server_call *c, const char *key) {
    for (size_t i = 0; i < c->req_md.count; i++) {
        if (grpc_slice_str_cmp(c->req_md.metadata[i].key, key) == 0)
            return &c->req_md.metadata[i].value;
    }
    return NULL;
}

/* The value of request metadata `key` copied into buf ("" when absent or longer than
 * cap - 1 bytes: never truncated into another value); 1 if copied. */
static int md_get(const server_call *c, const char *key, char *buf, size_t cap) {
    buf[0] = '\0';
    const grpc_slice *v = md_find(c, key);
    if (v == NULL || GRPC_SLICE_LENGTH(*v) >= cap)
        return 0;
    memcpy(buf, GRPC_SLICE_START_PTR(*v), GRPC_SLICE_LENGTH(*v));
    buf[GRPC_SLICE_LENGTH(*v)] = '\0';
    return 1;
}

/* a[0..na) == b[0..nb) in time that depends on the lengths only, not on where they
 * differ. */
static int same_secret(const uint8_t *a, size_t na, const char *b, size_t nb) {
    unsigned char diff = (unsigned char)(na != nb);
    for (size_t i = 0; i < na; i++)
        diff |= (unsigned char)(a[i] ^ (unsigned char)b[i % (nb ? nb : 1)]);
    return diff == 0 && nb > 0;
}

/* Ends the refusal log's window: one line with what it counted. log_mu held. */
static void refusal_flush_locked(ferry_rpc_server *srv, double now) {
    uint64_t total = srv->log_other;
    for (int i = 0; i < srv->log_nkinds; i++)
        total += srv->log_counts[i].n;
    if (total > 0) {
        char line[1024];
        size_t n = (size_t)snprintf(line, sizeof line,
                                    "rpc server: %llu more refused calls in "
                                    "the last %.0f s:",
                                    (unsigned long long)total, now - srv->log_window_start);
        for (int i = 0; i < srv->log_nkinds && n < sizeof line - 96; i++)
            n += (size_t)snprintf(line + n, sizeof line - n, "%s %s x%llu (%s)", i ? "," : "",
                                  ferry__grpc_code_name((grpc_status_code)srv->log_counts[i].code),
                                  (unsigned long long)srv->log_counts[i].n,
                                  srv->log_counts[i].identity);
        if (srv->log_other > 0 && n < sizeof line - 48)
            (void)snprintf(line + n, sizeof line - n, ", others x%llu",
                           (unsigned long long)srv->log_other);
        FERRY_LOG_WARN("%s", line);
    }
    srv->log_window_start = now;
    srv->log_lines = 0;
    srv->log_nkinds = 0;
    srv->log_other = 0;
}

/* Logs a refused call, at a bounded rate: a client sending refused calls in a loop
 * costs the log one summary line per window, not a line per call. */
static void refusal_log(ferry_rpc_server *srv, grpc_status_code code, const char *identity,
                        const char *fmt, const char *a, const char *b) {
    double now = ferry_now();
    pthread_mutex_lock(&srv->log_mu);
    if (now - srv->log_window_start > REFUSAL_WINDOW_S)
        refusal_flush_locked(srv, now);
    int full = srv->log_lines < REFUSAL_LINES;
    if (full) {
        srv->log_lines++;
    } else {
        int i = 0;
        while (i < srv->log_nkinds && (srv->log_counts[i].code != (int)code ||
                                       strcmp(srv->log_counts[i].identity, identity) != 0))
            i++;
        if (i == srv->log_nkinds && i < REFUSAL_KINDS) {
            srv->log_counts[i].code = (int)code;
            (void)snprintf(srv->log_counts[i].identity, sizeof srv->log_counts[i].identity, "%s",
                           identity);
            srv->log_counts[i].n = 0;
            srv->log_nkinds++;
        }
        if (i < srv->log_nkinds)
            srv->log_counts[i].n++;
        else
            srv->log_other++;
    }
    pthread_mutex_unlock(&srv->log_mu);
    if (full)
        FERRY_LOG_WARN(fmt, a, b);
}

/* A name that may stand for an identity: 1..63 printable bytes, no spaces. */
static int identity_ok(const char *s, size_t n) {
    if (n == 0 || n >= FERRY_RPC_IDENTITY_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] <= ' ' || s[i] > '~')
            return 0;
    }
    return 1;
}

/* The client certificate's subject into buf: its CN, else its first DNS, else URI
 * subject alternative name. 0 (buf "") when it has none that identity_ok accepts. */
static int cert_identity(const server_call *c, char *buf, size_t cap) {
    buf[0] = '\0';
    grpc_auth_context *ac = grpc_call_auth_context(c->call);
    if (ac == NULL)
        return 0;
    static const char *const props[] = {GRPC_X509_CN_PROPERTY_NAME, GRPC_PEER_DNS_PROPERTY_NAME,
                                        GRPC_PEER_URI_PROPERTY_NAME};
    for (size_t k = 0; k < sizeof props / sizeof props[0] && buf[0] == '\0'; k++) {
        grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(ac, props[k]);
        const grpc_auth_property *p = grpc_auth_property_iterator_next(&it);
        if (p != NULL && identity_ok(p->value, p->value_length) && p->value_length < cap) {
            memcpy(buf, p->value, p->value_length);
            buf[p->value_length] = '\0';
        }
    }
    grpc_auth_context_release(ac);
    return buf[0] != '\0';
}

/* Establishes who makes the call (c->caller): the identity from the bearer token or
 * the client certificate, the role from the token, the session and label from
 * metadata; refuses an unknown token, a certificate without a subject, or a role below
 * what `need` asks for. Refusals name what was wrong, never the token. */
static ferry_status authorize(server_call *c, const char *mname, ferry_rpc_role need, char *detail,
                              size_t cap) {
    ferry_rpc_server *srv = c->srv;
    ferry_rpc_caller_info *who = &c->caller;
    memset(who, 0, sizeof *who);
    (void)snprintf(who->identity, sizeof who->identity, "anonymous");
    who->role = FERRY_RPC_ROLE_ADMIN;
    if (srv->nids > 0) {
        const grpc_slice *v = md_find(c, "authorization");
        const uint8_t *tok = NULL;
        size_t n = 0;
        if (v != NULL && GRPC_SLICE_LENGTH(*v) > 7 &&
            memcmp(GRPC_SLICE_START_PTR(*v), "Bearer ", 7) == 0) {
            tok = GRPC_SLICE_START_PTR(*v) + 7;
            n = GRPC_SLICE_LENGTH(*v) - 7;
        }
        const srv_identity *match = NULL;
        for (int i = 0; tok != NULL && i < srv->nids; i++) { /* every entry: no early exit */
            if (same_secret(tok, n, srv->ids[i].token, srv->ids[i].token_len))
                match = &srv->ids[i];
        }
        if (match == NULL) {
            (void)snprintf(detail, cap, "%s: %s", mname,
                           tok == NULL ? "no bearer token (metadata authorization: Bearer <token>)"
                                       : "unknown token");
            refusal_log(srv, GRPC_STATUS_UNAUTHENTICATED, "?", "%s refused: %s", mname, detail);
            return FERRY_ERR_AUTH;
        }
        (void)snprintf(who->identity, sizeof who->identity, "%s", match->name);
        who->role = match->role;
        who->authority = match->role == FERRY_RPC_ROLE_ADMIN;
    }
    if (srv->mtls && !cert_identity(c, who->identity, sizeof who->identity)) {
        (void)snprintf(detail, cap,
                       "%s: the client certificate names no subject (a CN, or a DNS or URI "
                       "subject alternative name of at most %d printable bytes)",
                       mname, FERRY_RPC_IDENTITY_MAX - 1);
        refusal_log(srv, GRPC_STATUS_UNAUTHENTICATED, "?", "%s refused: %s", mname, detail);
        return FERRY_ERR_AUTH;
    }
    if (who->role < need) {
        (void)snprintf(detail, cap, "%s needs role %s; identity '%s' has role %s", mname,
                       ferry_rpc_role_name(need), who->identity, ferry_rpc_role_name(who->role));
        refusal_log(srv, GRPC_STATUS_PERMISSION_DENIED, who->identity, "%s refused: %s", mname,
                    detail);
        return FERRY_ERR_DENIED;
    }
    (void)md_get(c, FERRY_RPC_SESSION_KEY, who->session, sizeof who->session);
    if (!md_get(c, FERRY_RPC_CLIENT_KEY, who->label, sizeof who->label))
        (void)snprintf(who->label, sizeof who->label, "-");
    for (char *p = who->label; *p != '\0'; p++) /* a label goes into logs: printable only */
        if (*p < ' ' || *p > '~')
            *p = '?';
    return FERRY_OK;
}

/* Whether the call names an incarnation other than this server's (its client spoke
 * to an earlier process on this address); then detail says so. */
static int stale_incarnation(const server_call *c, char *detail, size_t cap) {
    for (size_t i = 0; i < c->req_md.count; i++) {
        const grpc_metadata *md = &c->req_md.metadata[i];
        if (grpc_slice_str_cmp(md->key, FERRY_RPC_INCARNATION_KEY) != 0)
            continue;
        char v[24];
        size_t n = GRPC_SLICE_LENGTH(md->value);
        n = n < sizeof v - 1 ? n : sizeof v - 1;
        memcpy(v, GRPC_SLICE_START_PTR(md->value), n);
        v[n] = '\0';
        unsigned long long want = strtoull(v, NULL, 16);
        if (want == c->srv->incarnation)
            return 0;
        (void)snprintf(detail, cap,
                       "this ferry-ps restarted: it is incarnation %016llx, the caller spoke to "
                       "%s (the contexts and job state it refers to are gone)",
                       (unsigned long long)c->srv->incarnation, v);
        FERRY_LOG_INFO("%s refused: %s", ferry__rpc_method((ferry_rpc_method)c->method)->name,
                       detail);
        return 1;
    }
    return 0;
}

/* Decodes the request, runs the handler and answers (or leaves the answer to a
 * deferred or early reply): on a worker of the fair queue, or in place for a cheap
 * method. */
static void call_execute(void *user, void *item) {
    (void)user;
    server_call *c = item;
    ferry_rpc_server *srv = c->srv;
    const ferry__rpc_method_info *mi = ferry__rpc_method((ferry_rpc_method)c->method);
    atomic_fetch_add(&c->holds, 1); /* before any reply: this thread owns c too */
    char detail[512];
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    reply.max_bytes = srv->lim.max_message_bytes; /* refused before it is built */
    ferry_status st = ferry__grpc_decode(c->req_bb, mi->request, &srv->lim, &req);
    grpc_byte_buffer_destroy(c->req_bb); /* the payloads were copied out */
    c->req_bb = NULL;
    grpc_status_code code;
    if (st != FERRY_OK) {
        (void)snprintf(detail, sizeof detail, "%s %s request: %s",
                       st == FERRY_ERR_FORMAT ? "malformed" : "rejected", mi->name,
                       ferry_error_last());
        code =
            st == FERRY_ERR_FORMAT ? GRPC_STATUS_INVALID_ARGUMENT : GRPC_STATUS_RESOURCE_EXHAUSTED;
    } else {
        ferry_error_clear();
        reply.call = c;
        st = srv->handlers[c->method](srv->user, (ferry_rpc_method)c->method, &req, &reply);
        if (c->early) { /* answered already: what came after is only logged */
            if (st != FERRY_OK)
                FERRY_LOG_ERROR("%s: after its reply: %s", mi->name, ferry_error_last());
            ferry_rpc_msg_deinit(&req);
            ferry_rpc_msg_deinit(&reply);
            call_drop(c);
            return;
        }
        if (c->deferred) { /* ferry_rpc_pending_finish answers, maybe already has */
            /* rpc.h: a handler that deferred returns FERRY_OK. Answering its error here
             * as well would answer twice once the pending's owner finishes it (and
             * touch c after that frees it): the reply stays with the pending. */
            assert(st == FERRY_OK);
            if (st != FERRY_OK)
                FERRY_LOG_ERROR("%s: the handler deferred its reply, then returned an error "
                                "(a bug; the reply is left to the deferred one): %s",
                                mi->name, ferry_error_last());
            ferry_rpc_msg_deinit(&req);
            ferry_rpc_msg_deinit(&reply);
            call_drop(c);
            return;
        }
        code = ferry__grpc_code_from_status(st);
        if (st == FERRY_OK && (st = reply_encode(c, mi, &reply)) != FERRY_OK)
            code = st == FERRY_ERR_RANGE ? GRPC_STATUS_RESOURCE_EXHAUSTED : GRPC_STATUS_INTERNAL;
        if (st != FERRY_OK) {
            const char *msg = ferry_error_last();
            (void)snprintf(detail, sizeof detail, "%s",
                           msg[0] != '\0' ? msg : ferry_status_str(st));
            refusal_log(srv, code, c->caller.identity, "%s rejected: %s", mi->name, detail);
        }
    }
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
    call_reply(c, st, code, st == FERRY_OK ? "" : detail);
    call_drop(c);
}

/* A call of one of ferry's methods: who makes it (refused here when the credentials or
 * the incarnation are wrong), then the cheap methods at once and every other one
 * through the fair queue. */
static void call_serve(server_call *c) {
    ferry_rpc_server *srv = c->srv;
    const ferry__rpc_method_info *mi = ferry__rpc_method((ferry_rpc_method)c->method);
    char detail[512];
    if (c->req_bb == NULL) { /* the client half-closed without a message */
        (void)snprintf(detail, sizeof detail, "%s call without a request message", mi->name);
        call_reply(c, FERRY_ERR_FORMAT, GRPC_STATUS_INVALID_ARGUMENT, detail);
        return;
    }
    atomic_fetch_add(&srv->bytes_in, grpc_byte_buffer_length(c->req_bb));
    if (srv->record_dir[0] != '\0') {
        int n = atomic_fetch_add(&srv->recorded[c->method], 1);
        if (n < RECORD_MAX) {
            char path[640];
            (void)snprintf(path, sizeof path, "%s/%s-%02d.bin", srv->record_dir, mi->name, n);
            if (ferry__grpc_bb_save(c->req_bb, path) != FERRY_OK)
                FERRY_LOG_WARN("rpc server: cannot record %s", path);
        }
    }
    ferry_status auth = authorize(c, mi->name, srv->method_role[c->method], detail, sizeof detail);
    if (auth != FERRY_OK) {
        call_reply(c, auth, ferry__grpc_code_from_status(auth), detail);
        return;
    }
    if (srv->incarnation != 0 && stale_incarnation(c, detail, sizeof detail)) {
        call_reply(c, FERRY_ERR_NOT_FOUND, GRPC_STATUS_NOT_FOUND, detail);
        return;
    }
    if (srv->cheap[c->method] || srv->sched == NULL) {
        call_execute(srv, c);
        return;
    }
    int q = ferry__rpc_sched_push(srv->sched, c->caller.identity, c);
    if (q == FERRY__RPC_SCHED_QUEUED)
        return;
    if (q == FERRY__RPC_SCHED_STOPPED) { /* the server stops: nothing is run any more */
        (void)snprintf(detail, sizeof detail, "%s: the server is shutting down", mi->name);
        call_reply(c, FERRY_ERR_UNAVAILABLE, GRPC_STATUS_UNAVAILABLE, detail);
        return;
    }
    (void)snprintf(detail, sizeof detail,
                   "%s refused: the server's work queue is full (too many calls waiting, or too "
                   "many of identity '%s'); try again later",
                   mi->name, c->caller.identity);
    call_reply(c, FERRY_ERR_RESOURCE, GRPC_STATUS_RESOURCE_EXHAUSTED, detail);
}

const ferry_rpc_caller_info *ferry_rpc_caller(const ferry_rpc_msg *reply) {
    const server_call *c = reply->call;
    return c != NULL ? &c->caller : NULL;
}

const char *ferry_rpc_role_name(ferry_rpc_role role) {
    return role == FERRY_RPC_ROLE_READER    ? "reader"
           : role == FERRY_RPC_ROLE_TRAINER ? "trainer"
           : role == FERRY_RPC_ROLE_ADMIN   ? "admin"
                                            : "?";
}

ferry_status ferry_rpc_role_parse(const char *name, ferry_rpc_role *out) {
    for (int r = FERRY_RPC_ROLE_READER; r <= FERRY_RPC_ROLE_ADMIN; r++) {
        if (strcmp(name, ferry_rpc_role_name((ferry_rpc_role)r)) == 0) {
            *out = (ferry_rpc_role)r;
            return FERRY_OK;
        }
    }
    return ferry_errorf(FERRY_ERR_INVALID, "unknown role '%.32s' (reader | trainer | admin)", name);
}

void ferry_rpc_server_method_stats(ferry_rpc_server *s, int slot, ferry_rpc_method_stats *out) {
    memset(out, 0, sizeof *out);
    if (slot >= 0 && slot < FERRY_RPC_STATS_SLOTS)
        ferry__rpc_meter_read(&s->meter[slot], out);
}

static void watchers_end(ferry_rpc_server *srv);

void ferry_rpc_server_set_serving(ferry_rpc_server *s, int serving) {
    if (atomic_exchange(&s->serving, serving != 0) != (serving != 0))
        watchers_end(s); /* the status changed: watchers get it, then the stream ends */
}

/* The packed HealthCheckResponse for the server's current status (known service) or
 * SERVICE_UNKNOWN, as a byte buffer. */
static grpc_byte_buffer *health_reply(ferry_rpc_server *srv, int known) {
    Grpc__Health__V1__HealthCheckResponse r;
    grpc__health__v1__health_check_response__init(&r);
    r.status = !known ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN
               : atomic_load(&srv->serving) && !atomic_load(&srv->shutting_down)
                   ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                   : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    uint8_t buf[16];
    size_t n = grpc__health__v1__health_check_response__pack(&r, buf);
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)buf, n);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    atomic_fetch_add(&srv->bytes_out, n);
    return bb;
}

/* Ends an open Watch: the status as it is now, then OK. Its completion frees c. */
static void watch_end(server_call *c) {
    if (c->reply_bb != NULL)
        grpc_byte_buffer_destroy(c->reply_bb);
    c->reply_bb = health_reply(c->srv, 1);
    grpc_op *op = c->ops;
    size_t n = 0;
    memset(c->ops, 0, sizeof c->ops);
    op[n].op = GRPC_OP_SEND_MESSAGE;
    op[n++].data.send_message.send_message = c->reply_bb;
    op[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    op[n++].data.send_status_from_server.status = GRPC_STATUS_OK;
    op[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op[n++].data.recv_close_on_server.cancelled = &c->cancelled;
    c->state = CALL_REPLYING;
    ferry__rpc_meter_add(&c->srv->meter[FERRY_RPC_STATS_HEALTH], GRPC_STATUS_OK,
                         ferry_now() - c->t0);
    if (grpc_call_start_batch(c->call, c->ops, n, c, NULL) != GRPC_CALL_OK) {
        atomic_fetch_sub(&c->srv->in_flight, 1);
        call_free(c);
    }
}

/* Sends every open Watch its last status and ends it (the status changed, or the
 * server stops). */
static void watchers_end(ferry_rpc_server *srv) {
    server_call *w[MAX_WATCHERS];
    pthread_mutex_lock(&srv->mu);
    int n = srv->nwatchers;
    memcpy(w, srv->watchers, (size_t)n * sizeof w[0]);
    srv->nwatchers = 0;
    pthread_mutex_unlock(&srv->mu);
    for (int i = 0; i < n; i++)
        watch_end(w[i]);
}

/* The first status of a Watch is out: keep the stream open until the status changes
 * (or answer it at once if the server is already going, or too many are open). */
static void watch_opened(server_call *c, int ok) {
    ferry_rpc_server *srv = c->srv;
    if (!ok) { /* the client went away */
        atomic_fetch_sub(&srv->in_flight, 1);
        call_free(c);
        return;
    }
    pthread_mutex_lock(&srv->mu);
    int keep = srv->nwatchers < MAX_WATCHERS && atomic_load(&srv->serving) &&
               !atomic_load(&srv->shutting_down);
    if (keep) {
        c->state = CALL_WATCHING;
        srv->watchers[srv->nwatchers++] = c;
    }
    pthread_mutex_unlock(&srv->mu);
    if (!keep)
        watch_end(c);
}

/* grpc.health.v1.Health/Check and /Watch: no token, answered here. "" and
 * "ferry.v1.Ferry" are this server; Watch sends the status once and ends (clients
 * watch again). */
static void call_health(server_call *c) {
    ferry_rpc_server *srv = c->srv;
    atomic_fetch_add(&srv->bytes_in, c->req_bb != NULL ? grpc_byte_buffer_length(c->req_bb) : 0);
    Grpc__Health__V1__HealthCheckRequest *q = NULL;
    if (c->req_bb != NULL) {
        grpc_byte_buffer_reader rd;
        if (grpc_byte_buffer_reader_init(&rd, c->req_bb)) {
            grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
            q = grpc__health__v1__health_check_request__unpack(NULL, GRPC_SLICE_LENGTH(all),
                                                               GRPC_SLICE_START_PTR(all));
            grpc_slice_unref(all);
            grpc_byte_buffer_reader_destroy(&rd);
        }
    }
    if (q == NULL) {
        call_reply(c, FERRY_ERR_FORMAT, GRPC_STATUS_INVALID_ARGUMENT,
                   "malformed grpc.health.v1.HealthCheckRequest");
        return;
    }
    int known = q->service[0] == '\0' || strcmp(q->service, "ferry.v1.Ferry") == 0;
    char service[80];
    (void)snprintf(service, sizeof service, "%s", q->service);
    grpc__health__v1__health_check_request__free_unpacked(q, NULL);
    if (!known && c->method == HEALTH_CHECK) {
        char detail[160];
        (void)snprintf(detail, sizeof detail,
                       "unknown service '%s' (this server: \"\" or "
                       "ferry.v1.Ferry)",
                       service);
        call_reply(c, FERRY_ERR_NOT_FOUND, GRPC_STATUS_NOT_FOUND, detail);
        return;
    }
    c->reply_bb = health_reply(srv, known);
    if (c->method == HEALTH_CHECK || !known) {
        call_reply(c, FERRY_OK, GRPC_STATUS_OK, "");
        return;
    }
    /* Watch: initial metadata and the first status; the stream stays open. */
    grpc_op *op = c->ops;
    memset(c->ops, 0, sizeof c->ops);
    op[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    op[1].op = GRPC_OP_SEND_MESSAGE;
    op[1].data.send_message.send_message = c->reply_bb;
    c->state = CALL_WATCH_FIRST;
    if (grpc_call_start_batch(c->call, c->ops, 2, c, NULL) != GRPC_CALL_OK) {
        atomic_fetch_sub(&srv->in_flight, 1);
        call_free(c);
    }
}

/* ---- Session streams (leases) ----------------------------------------------------- */

/* Unlinks an open lease from srv->leases; mu held. */
static void lease_unlink_locked(ferry_rpc_server *srv, server_call *c) {
    if (c->lease_prev == NULL)
        return;
    *c->lease_prev = c->lease_next;
    if (c->lease_next != NULL)
        c->lease_next->lease_prev = c->lease_prev;
    c->lease_prev = NULL;
    c->lease_next = NULL;
    srv->nleases--;
}

/* The "open" event is out: wait for the client to go away (RECV_CLOSE_ON_SERVER
 * completes when it cancels or its connection breaks), unless it went already. */
static void lease_opened(server_call *c, int ok) {
    ferry_rpc_server *srv = c->srv;
    c->state = CALL_LEASE_OPEN;
    memset(c->ops, 0, sizeof c->ops);
    c->ops[0].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    c->ops[0].data.recv_close_on_server.cancelled = &c->cancelled;
    if (!ok || grpc_call_start_batch(c->call, c->ops, 1, c, NULL) != GRPC_CALL_OK) {
        pthread_mutex_lock(&srv->mu);
        lease_unlink_locked(srv, c);
        pthread_mutex_unlock(&srv->mu);
        srv->lease.close(srv->user, c->lease_handle);
        call_free(c);
    }
}

/* The client is gone (or the server ended the stream): the lease ends. */
static void lease_closed(server_call *c) {
    ferry_rpc_server *srv = c->srv;
    pthread_mutex_lock(&srv->mu);
    lease_unlink_locked(srv, c);
    pthread_mutex_unlock(&srv->mu);
    ferry__rpc_meter_add(&srv->meter[FERRY_RPC_STATS_SESSION], GRPC_STATUS_OK, ferry_now() - c->t0);
    srv->lease.close(srv->user, c->lease_handle);
    call_free(c);
}

/* A Session stream: authorize, let the application check the session, send "open" and
 * keep the stream. It never counts as in flight (it lasts as long as its client). */
static void call_lease(server_call *c) {
    ferry_rpc_server *srv = c->srv;
    char detail[512];
    atomic_fetch_sub(&srv->in_flight, 1);
    atomic_fetch_add(&srv->bytes_in, c->req_bb != NULL ? grpc_byte_buffer_length(c->req_bb) : 0);
    ferry_status st = authorize(c, "Session", FERRY_RPC_ROLE_READER, detail, sizeof detail);
    if (st == FERRY_OK && srv->incarnation != 0 && stale_incarnation(c, detail, sizeof detail))
        st = FERRY_ERR_NOT_FOUND;
    if (st == FERRY_OK) {
        pthread_mutex_lock(&srv->mu);
        int full = srv->nleases >= MAX_LEASES || atomic_load(&srv->shutting_down);
        pthread_mutex_unlock(&srv->mu);
        if (full)
            st = ferry_errorf(FERRY_ERR_RESOURCE, "Session: %s",
                              atomic_load(&srv->shutting_down) ? "the server is stopping"
                                                               : "too many open Session streams");
        else
            st = srv->lease.open(srv->user, &c->caller, &c->lease_handle);
        if (st != FERRY_OK)
            (void)snprintf(detail, sizeof detail, "%s", ferry_error_last());
    }
    if (st != FERRY_OK) {
        atomic_fetch_add(&srv->in_flight, 1); /* call_reply's completion takes it off */
        call_reply(c, st, ferry__grpc_code_from_status(st), detail);
        return;
    }
    pthread_mutex_lock(&srv->mu);
    c->lease_next = srv->leases;
    if (srv->leases != NULL)
        srv->leases->lease_prev = &c->lease_next;
    c->lease_prev = &srv->leases;
    srv->leases = c;
    srv->nleases++;
    pthread_mutex_unlock(&srv->mu);
    Ferry__V1__SessionEvent ev;
    ferry__v1__session_event__init(&ev);
    ev.state = "open";
    uint8_t buf[32];
    size_t n = ferry__v1__session_event__pack(&ev, buf);
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)buf, n);
    c->reply_bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    atomic_fetch_add(&srv->bytes_out, n);
    memset(c->ops, 0, sizeof c->ops);
    c->ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    c->ops[1].op = GRPC_OP_SEND_MESSAGE;
    c->ops[1].data.send_message.send_message = c->reply_bb;
    c->state = CALL_LEASE_FIRST;
    if (grpc_call_start_batch(c->call, c->ops, 2, c, NULL) != GRPC_CALL_OK)
        lease_opened(c, 0);
}

/* Ends every open Session stream (the server stops): each gets UNAVAILABLE, and its
 * completion closes the lease. */
static void leases_end(ferry_rpc_server *srv) {
    pthread_mutex_lock(&srv->mu);
    int n = srv->nleases, k = 0;
    grpc_call **calls = n > 0 ? calloc((size_t)n, sizeof *calls) : NULL;
    for (server_call *c = srv->leases; c != NULL && calls != NULL && k < n; c = c->lease_next) {
        grpc_call_ref(c->call); /* c may be freed once mu is released */
        calls[k++] = c->call;
    }
    pthread_mutex_unlock(&srv->mu);
    for (int i = 0; i < k; i++) {
        grpc_call_cancel_with_status(calls[i], GRPC_STATUS_UNAVAILABLE, "ferry-ps is shutting down",
                                     NULL);
        grpc_call_unref(calls[i]);
    }
    free(calls);
}

ferry_rpc_pending *ferry_rpc_defer(ferry_rpc_msg *reply) {
    server_call *c = reply->call;
    if (c == NULL)
        return NULL;
    c->deferred = 1;
    return (ferry_rpc_pending *)c;
}

void ferry_rpc_pending_finish(ferry_rpc_pending *p, ferry_status st, ferry_rpc_msg *reply) {
    server_call *c = (server_call *)p;
    const ferry__rpc_method_info *mi = ferry__rpc_method((ferry_rpc_method)c->method);
    char detail[512];
    grpc_status_code code = ferry__grpc_code_from_status(st);
    if (st == FERRY_OK) {
        if (reply == NULL)
            st = ferry_errorf(FERRY_ERR_INVALID, "%s: a deferred reply finished without one",
                              mi->name);
        else
            st = reply_encode(c, mi, reply);
        if (st != FERRY_OK)
            code = st == FERRY_ERR_RANGE ? GRPC_STATUS_RESOURCE_EXHAUSTED : GRPC_STATUS_INTERNAL;
    }
    if (st != FERRY_OK) {
        const char *msg = ferry_error_last();
        (void)snprintf(detail, sizeof detail, "%s", msg[0] != '\0' ? msg : ferry_status_str(st));
        refusal_log(c->srv, code, c->caller.identity, "%s rejected: %s", mi->name, detail);
    }
    if (reply != NULL)
        ferry_rpc_msg_deinit(reply);
    call_reply(c, st, code, st == FERRY_OK ? "" : detail);
}

int ferry_rpc_can_reply_now(const ferry_rpc_msg *reply) {
    const server_call *c = reply->call;
    return c != NULL && !c->deferred && !c->early;
}

ferry_status ferry_rpc_reply_now(ferry_rpc_msg *reply) {
    server_call *c = reply->call;
    if (!ferry_rpc_can_reply_now(reply))
        return ferry_errorf(FERRY_ERR_UNSUPPORTED, "this reply cannot be sent before its "
                            "handler returns");
    ferry_status st = reply_encode(c, ferry__rpc_method((ferry_rpc_method)c->method), reply);
    if (st != FERRY_OK)
        return st;
    c->early = 1;
    call_reply(c, FERRY_OK, GRPC_STATUS_OK, "");
    return FERRY_OK;
}

/* A path without a handler: answer without reading the request. */
static void call_unimplemented(server_call *c) {
    char path[128], detail[512];
    size_t n = GRPC_SLICE_LENGTH(c->details.method);
    if (n >= sizeof path)
        n = sizeof path - 1;
    memcpy(path, GRPC_SLICE_START_PTR(c->details.method), n);
    path[n] = '\0';
    int known = 0;
    for (int m = 0; m < FERRY_RPC_METHOD_COUNT; m++)
        known |= strcmp(path, ferry__rpc_method((ferry_rpc_method)m)->path) == 0;
    known |= strcmp(path, FERRY_RPC_SESSION_PATH) == 0;
    if (strncmp(path, "/ferry.Ferry/", 13) == 0)
        (void)snprintf(detail, sizeof detail,
                       "%s: this ferry-ps speaks contract 1 (service ferry.v1.Ferry, "
                       "proto/ferry.proto of ferry 0.3 or later); the client speaks the pre-v1 "
                       "service ferry.Ferry: upgrade the client",
                       path);
    else
        (void)snprintf(detail, sizeof detail,
                       known ? "method %s has no handler on this server" : "unknown method %s",
                       path);
    call_reply(c, FERRY_ERR_UNSUPPORTED, GRPC_STATUS_UNIMPLEMENTED, detail);
}

static void call_event(server_call *c, int ok) {
    ferry_rpc_server *srv = c->srv;
    if (c->state == CALL_REPLYING) {
        atomic_fetch_sub(&srv->in_flight, 1);
        pend_release(c); /* written (or failed): no longer held for the client */
        /* A handler's reply (early or deferred) may end before the handler: last frees. */
        call_drop(c);
        return;
    }
    if (c->state == CALL_WATCH_FIRST) {
        watch_opened(c, ok);
        return;
    }
    if (c->state == CALL_LEASE_FIRST) {
        lease_opened(c, ok);
        return;
    }
    if (c->state == CALL_LEASE_OPEN) {
        lease_closed(c);
        return;
    }
    if (!ok) { /* shutting down: the slot was never matched with a call */
        call_free(c);
        return;
    }
    atomic_fetch_add(&srv->in_flight, 1);
    c->t0 = ferry_now();
    /* Re-arm first, so the next call of this method is not kept waiting. This
     * call keeps `live` above zero, so the queue is still open. */
    if (!atomic_load(&srv->shutting_down))
        call_post(srv, c->method);
    if (c->method == CATCH_ALL)
        call_unimplemented(c);
    else if (c->method == HEALTH_CHECK || c->method == HEALTH_WATCH)
        call_health(c);
    else if (c->method == SESSION_LEASE)
        call_lease(c);
    else
        call_serve(c);
}

/* ---- Poll threads ------------------------------------------------------------------------ */

static void poll_loop(ferry_rpc_server *srv) {
    for (;;) {
        gpr_timespec until = gpr_inf_future(GPR_CLOCK_MONOTONIC);
        if (atomic_load(&srv->shutting_down) && !atomic_load(&srv->cancelled)) {
            pthread_mutex_lock(&srv->mu);
            until = srv->cancel_at;
            pthread_mutex_unlock(&srv->mu);
        }
        grpc_event ev = ferry__grpc_cq_next(srv->cq, until);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            return;
        if (ev.type == GRPC_QUEUE_TIMEOUT) {
            if (!atomic_exchange(&srv->cancelled, 1)) {
                long long n = (long long)atomic_load(&srv->in_flight);
                if (n > 0)
                    FERRY_LOG_INFO("rpc server: grace period over, cancelling %lld call(s)", n);
                grpc_server_cancel_all_calls(srv->server);
            }
            continue;
        }
        if (ev.tag == &srv->shutdown_tag) {
            atomic_store(&srv->tag_fired, 1);
            cq_maybe_close(srv);
            continue;
        }
        call_event(ev.tag, ev.success);
    }
}

static void *poll_main(void *arg) {
    ferry_rpc_server *srv = arg;
    poll_thread_server = srv;
    poll_loop(srv);
    pthread_mutex_lock(&srv->mu);
    if (--srv->alive == 0)
        pthread_cond_broadcast(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
    return NULL;
}

/* ---- Lifetime -------------------------------------------------------------------------------- */

static ferry_status config_check(const ferry_rpc_server_config *cfg, int *threads, int *slots,
                                 size_t *max_bytes) {
    *threads = cfg->threads > 0 ? cfg->threads : 2;
    *slots = cfg->slots > 0 ? cfg->slots : 4;
    *max_bytes =
        cfg->max_message_bytes > 0 ? cfg->max_message_bytes : FERRY_RPC_DEFAULT_MAX_MESSAGE_BYTES;
    if (cfg->listen == NULL || cfg->listen[0] == '\0')
        return ferry_errorf(FERRY_ERR_INVALID, "rpc server: no listen address");
    if (cfg->threads < 0 || *threads > 64 || cfg->slots < 0 || *slots > 64)
        return ferry_errorf(FERRY_ERR_INVALID, "rpc server: threads %d / slots %d outside 1..64",
                            cfg->threads, cfg->slots);
    if (*max_bytes > INT32_MAX)
        return ferry_errorf(FERRY_ERR_INVALID, "rpc server: max message of %zu bytes above 2 GiB",
                            *max_bytes);
    return FERRY_OK;
}

/* Why binding listen failed, found by binding it once more with a plain socket. */
static const char *bind_reason(const char *listen) {
    const char *colon = strrchr(listen, ':');
    if (colon == NULL || strncmp(listen, "unix:", 5) == 0)
        return "bad address";
    char host[256];
    size_t hl = (size_t)(colon - listen);
    if (listen[0] == '[' && hl >= 2 && listen[hl - 1] == ']') {
        listen++;
        hl -= 2;
    }
    if (hl >= sizeof host)
        return "bad address";
    memcpy(host, listen, hl);
    host[hl] = '\0';
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    if (getaddrinfo(hl > 0 ? host : NULL, colon + 1, &hints, &ai) != 0 || ai == NULL)
        return "the host is not an address of this machine, or does not resolve";
    int fd = socket(ai->ai_family, SOCK_STREAM, 0), e = 0;
    if (fd >= 0 && bind(fd, ai->ai_addr, ai->ai_addrlen) != 0)
        e = errno;
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    return e == EADDRINUSE      ? "the port is in use (another process listens on it)"
           : e == EADDRNOTAVAIL ? "the host is not an address of this machine"
           : e == EACCES        ? "permission denied (a port below 1024 needs privileges)"
                                : "bad address";
}

/* Creates the gRPC server, registers the queue and methods, and binds. */
static ferry_status server_bind(ferry_rpc_server *srv, const ferry_rpc_server_config *cfg) {
    grpc_arg args[FERRY__GRPC_MAX_ARGS];
    grpc_channel_args ca = {ferry__grpc_fill_args(args, srv->lim.max_message_bytes, 0), args};
    srv->server = grpc_server_create(&ca, NULL);
    srv->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(srv->server, srv->cq, NULL);
    for (int m = 0; m < FERRY_RPC_METHOD_COUNT; m++) {
        srv->handlers[m] = cfg->handlers[m];
        if (cfg->handlers[m] == NULL)
            continue;
        srv->registered[m] =
            grpc_server_register_method(srv->server, ferry__rpc_method((ferry_rpc_method)m)->path,
                                        NULL, GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
        if (srv->registered[m] == NULL)
            return ferry_errorf(FERRY_ERR_INVALID, "rpc server: cannot register %s",
                                ferry_rpc_method_name((ferry_rpc_method)m));
    }
    for (int h = 0; h < 2; h++) {
        srv->registered[HEALTH_CHECK + h] = grpc_server_register_method(
            srv->server, health_paths[h], NULL, GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
        if (srv->registered[HEALTH_CHECK + h] == NULL)
            return ferry_errorf(FERRY_ERR_INVALID, "rpc server: cannot register %s",
                                health_paths[h]);
    }
    if (cfg->lease.open != NULL) {
        srv->lease = cfg->lease;
        srv->registered[SESSION_LEASE] =
            grpc_server_register_method(srv->server, FERRY_RPC_SESSION_PATH, NULL,
                                        GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
        if (srv->registered[SESSION_LEASE] == NULL)
            return ferry_errorf(FERRY_ERR_INVALID, "rpc server: cannot register %s",
                                FERRY_RPC_SESSION_PATH);
    }
    grpc_server_credentials *creds;
    if (cfg->tls_cert_pem != NULL) {
        grpc_ssl_pem_key_cert_pair pair = {cfg->tls_key_pem, cfg->tls_cert_pem};
        creds = grpc_ssl_server_credentials_create_ex(
            cfg->tls_ca_pem, &pair, 1,
            cfg->tls_ca_pem != NULL ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                    : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            NULL);
        if (creds == NULL)
            return ferry_errorf(FERRY_ERR_INVALID, "rpc server: the TLS certificate or key is "
                                                   "not usable");
        srv->mtls = cfg->tls_ca_pem != NULL;
    } else {
        creds = grpc_insecure_server_credentials_create();
    }
    ferry__grpc_quiet = 1; /* a failure is said below, in one line */
    srv->port = grpc_server_add_http2_port(srv->server, cfg->listen, creds);
    ferry__grpc_quiet = 0;
    grpc_server_credentials_release(creds); /* the server keeps its own reference */
    if (srv->port == 0)
        return ferry_errorf(FERRY_ERR_IO, "cannot listen on %s: %s", cfg->listen,
                            bind_reason(cfg->listen));
    return FERRY_OK;
}

/* Copies the token table, checking names, roles, tokens and that no two tokens or
 * names repeat. */
static ferry_status identities_copy(ferry_rpc_server *srv, const ferry_rpc_server_config *cfg) {
    if (cfg->nidentities < 0 || (cfg->nidentities > 0 && cfg->identities == NULL))
        return ferry_errorf(FERRY_ERR_INVALID, "rpc server: bad token table");
    if (cfg->nidentities == 0)
        return FERRY_OK;
    if ((srv->ids = calloc((size_t)cfg->nidentities, sizeof *srv->ids)) == NULL)
        return ferry_errorf(FERRY_ERR_NOMEM, "rpc server: out of memory");
    for (int i = 0; i < cfg->nidentities; i++) {
        const ferry_rpc_identity *e = &cfg->identities[i];
        size_t tl = e->token != NULL ? strlen(e->token) : 0;
        if (e->name == NULL || !identity_ok(e->name, strlen(e->name)) || tl == 0 ||
            tl > FERRY_RPC_TOKEN_MAX || e->role < FERRY_RPC_ROLE_READER ||
            e->role > FERRY_RPC_ROLE_ADMIN)
            return ferry_errorf(FERRY_ERR_INVALID,
                                "token table entry %d: a name of 1..%d printable bytes, a role "
                                "and a token of 1..%d bytes",
                                i + 1, FERRY_RPC_IDENTITY_MAX - 1, FERRY_RPC_TOKEN_MAX);
        for (int k = 0; k < i; k++) {
            if (strcmp(srv->ids[k].name, e->name) == 0 ||
                (srv->ids[k].token_len == tl && memcmp(srv->ids[k].token, e->token, tl) == 0))
                return ferry_errorf(FERRY_ERR_INVALID, "token table: entries %d and %d share a %s",
                                    k + 1, i + 1,
                                    strcmp(srv->ids[k].name, e->name) == 0 ? "name" : "token");
        }
        (void)snprintf(srv->ids[i].name, sizeof srv->ids[i].name, "%s", e->name);
        srv->ids[i].role = e->role;
        srv->ids[i].token_len = tl;
        if ((srv->ids[i].token = malloc(tl + 1)) == NULL)
            return ferry_errorf(FERRY_ERR_NOMEM, "rpc server: out of memory");
        memcpy(srv->ids[i].token, e->token, tl + 1);
        srv->nids = i + 1;
    }
    return FERRY_OK;
}

ferry_status ferry_rpc_server_create(const ferry_rpc_server_config *cfg, ferry_rpc_server **out) {
    int threads, slots;
    size_t max_bytes;
    ferry_status st = config_check(cfg, &threads, &slots, &max_bytes);
    if (st != FERRY_OK)
        return st;
    ferry_rpc_server *srv = calloc(1, sizeof *srv);
    if (srv == NULL || (srv->threads = calloc((size_t)threads, sizeof *srv->threads)) == NULL) {
        free(srv);
        return ferry_errorf(FERRY_ERR_NOMEM, "rpc server: out of memory");
    }
    FERRY_ASSERT(pthread_mutex_init(&srv->mu, NULL) == 0);
    FERRY_ASSERT(pthread_cond_init(&srv->cv, NULL) == 0);
    FERRY_ASSERT(pthread_mutex_init(&srv->pend_mu, NULL) == 0);
    FERRY_ASSERT(pthread_mutex_init(&srv->log_mu, NULL) == 0);
    srv->log_window_start = ferry_now();
    srv->pend_max_total = cfg->max_pending_bytes > 0 ? cfg->max_pending_bytes : (int64_t)1 << 30;
    srv->pend_max_peer = cfg->max_pending_bytes_per_connection > 0
                             ? cfg->max_pending_bytes_per_connection
                             : (int64_t)max_bytes;
    srv->reply_timeout_s = cfg->reply_timeout_s > 0.0 ? cfg->reply_timeout_s : 60.0;
    srv->user = cfg->user;
    srv->incarnation = cfg->incarnation;
    atomic_init(&srv->serving, 1);
    memcpy(srv->method_role, cfg->method_role, sizeof srv->method_role);
    memcpy(srv->cheap, cfg->cheap, sizeof srv->cheap);
    if ((st = identities_copy(srv, cfg)) != FERRY_OK) {
        ferry_rpc_server_destroy(srv);
        return st;
    }
    srv->slots = slots;
    const char *record = getenv("FERRY_RPC_RECORD");
    if (record != NULL && record[0] != '\0' && strlen(record) < sizeof srv->record_dir) {
        memcpy(srv->record_dir, record, strlen(record) + 1);
        FERRY_LOG_INFO("rpc server: recording requests into %s (FERRY_RPC_RECORD)", record);
    }
    srv->lim =
        (ferry__rpc_limits){.max_message_bytes = max_bytes, .max_tensors = FERRY_RPC_MAX_TENSORS};
    ferry__grpc_init();
    srv->grpc_inited = 1;
    ferry__rpc_sched_config sc = {.workers = cfg->workers > 0 ? cfg->workers : threads,
                                  .per_key = cfg->max_calls_per_identity,
                                  .max_queued = cfg->max_queued_calls,
                                  .max_queued_key = cfg->max_queued_calls_per_identity,
                                  .run = call_execute,
                                  .user = srv};
    if ((st = ferry__rpc_sched_create(&sc, &srv->sched)) != FERRY_OK)
        goto fail;
    if ((st = server_bind(srv, cfg)) != FERRY_OK)
        goto fail;
    grpc_server_start(srv->server);
    srv->started = 1;
    for (int m = 0; m < FERRY_RPC_METHOD_COUNT; m++) {
        for (int i = 0; srv->registered[m] != NULL && i < slots; i++)
            call_post(srv, m);
    }
    for (int i = 0; i < CATCH_ALL_SLOTS; i++)
        call_post(srv, CATCH_ALL);
    for (int i = 0; i < HEALTH_SLOTS; i++) {
        call_post(srv, HEALTH_CHECK);
        call_post(srv, HEALTH_WATCH);
    }
    for (int i = 0; srv->registered[SESSION_LEASE] != NULL && i < LEASE_SLOTS; i++)
        call_post(srv, SESSION_LEASE);
    srv->alive = threads;
    for (; srv->nthreads < threads; srv->nthreads++) {
        int e = pthread_create(&srv->threads[srv->nthreads], NULL, poll_main, srv);
        if (e != 0) {
            srv->alive -= threads - srv->nthreads;
            st =
                ferry_errorf(FERRY_ERR_NOMEM, "rpc server: cannot start a thread: %s", strerror(e));
            goto fail;
        }
    }
    *out = srv;
    return FERRY_OK;
fail:
    ferry_rpc_server_destroy(srv);
    return st;
}

int ferry_rpc_server_port(const ferry_rpc_server *s) {
    return s->port;
}

void ferry_rpc_server_shutdown(ferry_rpc_server *s, int grace_ms) {
    if (!s->started)
        return;
    pthread_mutex_lock(&s->mu);
    if (atomic_load(&s->shutting_down)) {
        pthread_mutex_unlock(&s->mu);
        return;
    }
    s->cancel_at = ferry__grpc_deadline_in(grace_ms > 0 ? grace_ms : 0);
    if (grace_ms <= 0)
        atomic_store(&s->cancelled, 1); /* done below, not by a poll thread */
    atomic_store(&s->shutting_down, 1);
    pthread_mutex_unlock(&s->mu);
    watchers_end(s); /* before gRPC cancels them: they end with NOT_SERVING */
    leases_end(s);   /* a lease lasts as long as its client: never wait for one */
    grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
    if (grace_ms <= 0)
        grpc_server_cancel_all_calls(s->server);
}

ferry_status ferry_rpc_server_wait(ferry_rpc_server *s, int timeout_ms) {
    FERRY_ASSERT(poll_thread_server != s);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    if (timeout_ms >= 0) {
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
    }
    ferry_status st = FERRY_OK;
    pthread_mutex_lock(&s->mu);
    while (s->alive > 0 && st == FERRY_OK) {
        if (timeout_ms < 0)
            pthread_cond_wait(&s->cv, &s->mu);
        else if (pthread_cond_timedwait(&s->cv, &s->mu, &until) == ETIMEDOUT && s->alive > 0)
            st =
                ferry_errorf(FERRY_ERR_TIMEOUT, "rpc server still running after %d ms", timeout_ms);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

void ferry_rpc_server_destroy(ferry_rpc_server *s) {
    if (s == NULL)
        return;
    FERRY_ASSERT(poll_thread_server != s);
    if (s->started) {
        ferry_rpc_server_shutdown(s, 0);
        ferry__rpc_sched_stop(s->sched); /* runs what is queued (cancelled: quick) */
        if (s->nthreads == 0)
            poll_loop(s); /* no thread ever started: drain here */
        for (int i = 0; i < s->nthreads; i++)
            pthread_join(s->threads[i], NULL);
    } else if (s->cq != NULL) {
        grpc_completion_queue_shutdown(s->cq);
        while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
               GRPC_QUEUE_SHUTDOWN) {
        }
    }
    ferry__rpc_sched_destroy(s->sched);
    if (s->server != NULL)
        grpc_server_destroy(s->server);
    if (s->cq != NULL)
        grpc_completion_queue_destroy(s->cq);
    if (s->grpc_inited)
        ferry__grpc_shutdown();
    for (int i = 0; i < s->nids; i++) {
        if (s->ids[i].token != NULL) /* no copy of a secret left in freed memory */
            explicit_bzero(s->ids[i].token, s->ids[i].token_len);
        free(s->ids[i].token);
    }
    free(s->ids);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_lock(&s->log_mu);
    refusal_flush_locked(s, ferry_now()); /* what the last window counted */
    pthread_mutex_unlock(&s->log_mu);
    pthread_mutex_destroy(&s->log_mu);
    pthread_mutex_destroy(&s->pend_mu);
    free(s->threads);
    free(s);
}

int ferry_rpc_server_reap(ferry_rpc_server *s) {
    double now = ferry_now();
    pthread_mutex_lock(&s->log_mu); /* a window with refusals ends even if no more come */
    if (now - s->log_window_start > REFUSAL_WINDOW_S)
        refusal_flush_locked(s, now);
    pthread_mutex_unlock(&s->log_mu);
    if (s->reply_timeout_s <= 0.0)
        return 0;
    grpc_call *late[64];
    int n = 0;
    pthread_mutex_lock(&s->pend_mu);
    for (server_call *c = s->pending; c != NULL && n < 64; c = c->pend_next) {
        if (now - c->pend_since > s->reply_timeout_s) {
            grpc_call_ref(c->call); /* c may be freed once the lock is released */
            late[n++] = c->call;
        }
    }
    pthread_mutex_unlock(&s->pend_mu);
    for (int i = 0; i < n; i++) {
        grpc_call_cancel_with_status(late[i], GRPC_STATUS_DEADLINE_EXCEEDED,
                                     "the reply was not read in time (--reply-timeout)", NULL);
        grpc_call_unref(late[i]);
    }
    if (n > 0) {
        atomic_fetch_add(&s->pend_cancelled, (uint64_t)n);
        FERRY_LOG_WARN("rpc server: %d replies not read within %g s cancelled", n,
                       s->reply_timeout_s);
    }
    return n;
}

void ferry_rpc_server_pending_stats(ferry_rpc_server *s, ferry_rpc_pending_stats *out) {
    pthread_mutex_lock(&s->pend_mu);
    out->bytes = s->pend_total;
    out->max_bytes = s->pend_max_total;
    out->max_bytes_per_connection = s->pend_max_peer;
    int64_t worst = 0;
    for (const pend_peer *p = s->peers; p != NULL; p = p->next)
        worst = p->bytes > worst ? p->bytes : worst;
    out->worst_connection_bytes = worst;
    pthread_mutex_unlock(&s->pend_mu);
    out->refused = atomic_load(&s->pend_refused);
    out->cancelled = atomic_load(&s->pend_cancelled);
}

void ferry_rpc_server_queue_stats(ferry_rpc_server *s, ferry_rpc_queue_stats *out) {
    memset(out, 0, sizeof *out);
    if (s->sched == NULL)
        return;
    ferry__rpc_sched_stats_t st;
    ferry__rpc_sched_stats(s->sched, &st);
    out->queued = st.queued;
    out->running = st.running;
    out->workers = st.workers;
    out->served = st.served;
    out->refused = st.refused;
    out->wait_mean_s = st.wait_mean_s;
    out->wait_max_s = st.wait_max_s;
}

void ferry_rpc_server_get_stats(const ferry_rpc_server *s, ferry_rpc_server_stats *out) {
    ferry_rpc_server *m = (ferry_rpc_server *)(uintptr_t)s; /* atomics are read-only here */
    out->calls = atomic_load(&m->calls);
    out->errors = atomic_load(&m->errors);
    out->bytes_in = atomic_load(&m->bytes_in);
    out->bytes_out = atomic_load(&m->bytes_out);
    out->in_flight = atomic_load(&m->in_flight);
}
