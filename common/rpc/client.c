/* client.c - ferry.v1.Ferry clients on gRPC's completion-queue API. A client is a
 * channel with every method registered once. A call (or a fan-out of calls to
 * several clients) encodes its request with payloads borrowed in place, starts
 * one 6-op batch per call on a private completion queue, waits for all of them,
 * decodes the replies and turns gRPC statuses into ferry_status with a
 * message naming peer, method and code. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/support/alloc.h>

#include "common/core/log.h"
#include "common/rpc/testing.h"
#include "common/rpc/transport-grpc.h"
#include "health.pb-c.h"

#define CQ_POOL 4 /* idle completion queues kept per client */

struct ferry_rpc_client {
    char *target;
    grpc_channel *channel;
    void *registered[FERRY_RPC_METHOD_COUNT];
    ferry__rpc_limits lim;
    int deadline_ms;
    _Atomic int wait_for_ready;
    atomic_uint_fast64_t incarnation; /* expected by context calls; 0: not sent */
    char *auth;                       /* "Bearer <token>", or NULL */
    char *name;                       /* ferry-client metadata, or NULL */
    ferry__rpc_meter meter[FERRY_RPC_STATS_SLOTS];
    pthread_mutex_t mu; /* guards the queue pool */
    grpc_completion_queue *cq_idle[CQ_POOL];
    int ncq_idle;
    atomic_int in_flight;
    atomic_uint_fast64_t bytes_sent, bytes_received; /* messages, as encoded */
    /* The session (ferry_rpc_client_set_session) and its Session stream, under
     * lease_mu. The stream's one batch completes on lease_cq, which is only polled
     * without waiting (lease_poll) and drained at destroy. */
    pthread_mutex_t lease_mu;
    char session[FERRY_RPC_SESSION_LEN + 1]; /* "" when none */
    atomic_int want_lease;
    grpc_completion_queue *lease_cq;
    grpc_call *lease_call; /* NULL: no stream open */
    grpc_metadata lease_md[3];
    grpc_op lease_ops[4];
    grpc_metadata_array lease_init_md, lease_trail_md;
    grpc_status_code lease_code;
    grpc_slice lease_details;
    grpc_byte_buffer *lease_req_bb;
    double lease_checked, lease_retry_at; /* ferry_now(): last poll, next (re)open */
    atomic_int lease_up;                  /* 1 while lease_call runs */
};

/* One call's batch state: everything the ops point to, alive until completion. */
typedef struct client_call {
    ferry_rpc_client *cl;
    const char *what; /* method name for messages */
    const ProtobufCMessageDescriptor *reply_desc;
    int deadline_ms;
    grpc_call *call;
    grpc_byte_buffer *req_bb;
    grpc_byte_buffer *reply_bb;
    grpc_metadata_array init_md, trail_md;
    grpc_status_code code;
    grpc_slice details;
    const char *error_string;
    grpc_op ops[6];
    grpc_metadata md[4]; /* incarnation, authorization, ferry-client, ferry-session */
    char md_value[20];
    char md_session[FERRY_RPC_SESSION_LEN + 1];
    int transport;        /* failed in transit, not by the server's answer */
    int prepared; /* the metadata arrays and details are initialized */
    int started;  /* the batch is running: one completion will come */
    int done;     /* its completion came */
    int lagged;   /* cancelled: a replica of its group answered OK grace_ms before */
    double cut;   /* > 0: cancel it at this time (ferry_now) unless done */
    int grace_ms; /* for its message */
} client_call;

/* ---- Completion queues ------------------------------------------------------------ */

static void cq_destroy(grpc_completion_queue *cq) {
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
}

/* A queue with no pending events, reused across calls: creating one per call
 * would cost a pollset each time. */
static grpc_completion_queue *cq_get(ferry_rpc_client *cl) {
    grpc_completion_queue *cq = NULL;
    pthread_mutex_lock(&cl->mu);
    if (cl->ncq_idle > 0)
        cq = cl->cq_idle[--cl->ncq_idle];
    pthread_mutex_unlock(&cl->mu);
    return cq != NULL ? cq : grpc_completion_queue_create_for_next(NULL);
}

static void cq_put(ferry_rpc_client *cl, grpc_completion_queue *cq) {
    pthread_mutex_lock(&cl->mu);
    if (cl->ncq_idle < CQ_POOL) {
        cl->cq_idle[cl->ncq_idle++] = cq;
        cq = NULL;
    }
    pthread_mutex_unlock(&cl->mu);
    if (cq != NULL)
        cq_destroy(cq);
}

/* ---- One call ---------------------------------------------------------------------------- */

/* "<target> <method>: <stage>: <current detail>". The detail is copied first,
 * since it lives in the buffer ferry_errorf writes. */
static ferry_status errorf_wrap(ferry_status st, const char *target, const char *what,
                                const char *stage) {
    char why[384];
    (void)snprintf(why, sizeof why, "%s", ferry_error_last());
    return ferry_errorf(st, "%s %s: %s: %s", target, what, stage, why);
}

/* ---- The session's lease stream ------------------------------------------------- */

/* Frees what the ended stream's batch held; lease_mu held. */
static void lease_reap_locked(ferry_rpc_client *cl) {
    grpc_metadata_array_destroy(&cl->lease_init_md);
    grpc_metadata_array_destroy(&cl->lease_trail_md);
    grpc_slice_unref(cl->lease_details);
    grpc_byte_buffer_destroy(cl->lease_req_bb);
    cl->lease_req_bb = NULL;
    grpc_call_unref(cl->lease_call);
    cl->lease_call = NULL;
    atomic_store(&cl->lease_up, 0);
}

/* Opens the Session stream: initial metadata with the session, one empty
 * SessionRequest, and the receipt of the status, which comes only when the server
 * ends the stream or the connection goes. The client never half-closes it. lease_mu
 * held. */
static void lease_open_locked(ferry_rpc_client *cl) {
    if (cl->lease_cq == NULL &&
        (cl->lease_cq = grpc_completion_queue_create_for_next(NULL)) == NULL)
        return;
    cl->lease_call =
        grpc_channel_create_call(cl->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cl->lease_cq,
                                 grpc_slice_from_static_string(FERRY_RPC_SESSION_PATH), NULL,
                                 gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (cl->lease_call == NULL)
        return;
    grpc_metadata_array_init(&cl->lease_init_md);
    grpc_metadata_array_init(&cl->lease_trail_md);
    cl->lease_details = grpc_empty_slice();
    grpc_slice empty = grpc_empty_slice();
    cl->lease_req_bb = grpc_raw_byte_buffer_create(&empty, 1);
    size_t nmd = 0;
    cl->lease_md[nmd].key = grpc_slice_from_static_string(FERRY_RPC_SESSION_KEY);
    cl->lease_md[nmd++].value = grpc_slice_from_static_buffer(cl->session, strlen(cl->session));
    if (cl->auth != NULL) {
        cl->lease_md[nmd].key = grpc_slice_from_static_string("authorization");
        cl->lease_md[nmd++].value = grpc_slice_from_static_buffer(cl->auth, strlen(cl->auth));
    }
    if (cl->name != NULL) {
        cl->lease_md[nmd].key = grpc_slice_from_static_string(FERRY_RPC_CLIENT_KEY);
        cl->lease_md[nmd++].value = grpc_slice_from_static_buffer(cl->name, strlen(cl->name));
    }
    grpc_op *op = cl->lease_ops;
    memset(cl->lease_ops, 0, sizeof cl->lease_ops);
    op[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    op[0].data.send_initial_metadata.count = nmd;
    op[0].data.send_initial_metadata.metadata = cl->lease_md;
    op[1].op = GRPC_OP_SEND_MESSAGE;
    op[1].data.send_message.send_message = cl->lease_req_bb;
    op[2].op = GRPC_OP_RECV_INITIAL_METADATA;
    op[2].data.recv_initial_metadata.recv_initial_metadata = &cl->lease_init_md;
    op[3].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op[3].data.recv_status_on_client.trailing_metadata = &cl->lease_trail_md;
    op[3].data.recv_status_on_client.status = &cl->lease_code;
    op[3].data.recv_status_on_client.status_details = &cl->lease_details;
    if (grpc_call_start_batch(cl->lease_call, cl->lease_ops, 4, cl, NULL) != GRPC_CALL_OK) {
        lease_reap_locked(cl);
        return;
    }
    atomic_store(&cl->lease_up, 1);
}

/* Notices an ended stream and opens it again (at most once a second) while a session
 * wants one. Cheap enough for every call: it looks at the queue at most every 50 ms,
 * and never waits for the lock. */
static void lease_poll(ferry_rpc_client *cl) {
    double now = ferry_now();
    if (!atomic_load(&cl->want_lease) || pthread_mutex_trylock(&cl->lease_mu) != 0)
        return;
    if (cl->lease_call != NULL && now - cl->lease_checked >= 0.05) {
        cl->lease_checked = now;
        grpc_event ev =
            grpc_completion_queue_next(cl->lease_cq, gpr_time_0(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_OP_COMPLETE) {
            if (cl->lease_code != GRPC_STATUS_OK)
                FERRY_LOG_DEBUG("%s: Session stream ended: %s", cl->target,
                                ferry__grpc_code_name(cl->lease_code));
            lease_reap_locked(cl);
            cl->lease_retry_at = now + 1.0;
        }
    }
    if (atomic_load(&cl->want_lease) && cl->session[0] != '\0' && cl->lease_call == NULL &&
        now >= cl->lease_retry_at) {
        cl->lease_retry_at = now + 1.0;
        lease_open_locked(cl);
    }
    pthread_mutex_unlock(&cl->lease_mu);
}

/* Ends the stream (cancelled from this side) and waits for its batch; lease_mu held. */
static void lease_close_locked(ferry_rpc_client *cl) {
    if (cl->lease_call == NULL)
        return;
    grpc_call_cancel(cl->lease_call, NULL);
    grpc_event ev;
    do
        ev = grpc_completion_queue_next(cl->lease_cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    while (ev.type != GRPC_OP_COMPLETE);
    lease_reap_locked(cl);
}

ferry_status ferry_rpc_client_set_session(ferry_rpc_client *c, const char *session, int lease) {
    size_t n = session != NULL ? strlen(session) : 0;
    if (n != 0 && (n != FERRY_RPC_SESSION_LEN || strspn(session, "0123456789abcdef") != n))
        return ferry_errorf(FERRY_ERR_INVALID, "%s: malformed session id", c->target);
    pthread_mutex_lock(&c->lease_mu);
    int same = n > 0 && strcmp(c->session, session) == 0;
    if (!same) {
        lease_close_locked(c); /* the old session's stream */
        memcpy(c->session, n > 0 ? session : "", n + 1);
    }
    atomic_store(&c->want_lease, lease && n > 0);
    if (!atomic_load(&c->want_lease))
        lease_close_locked(c);
    c->lease_retry_at = 0.0;
    pthread_mutex_unlock(&c->lease_mu);
    lease_poll(c);
    return FERRY_OK;
}

int ferry_rpc_client_lease_open(ferry_rpc_client *c) {
    lease_poll(c);
    return atomic_load(&c->lease_up);
}

/* Starts c's 6-op batch on cq, sending c->req_bb. `reg` is the registered
 * method, or NULL to call `path` by name. */
static ferry_status call_launch(client_call *c, grpc_completion_queue *cq, void *reg,
                                const char *path, int method) {
    ferry_rpc_client *cl = c->cl;
    gpr_timespec deadline = ferry__grpc_deadline_in(c->deadline_ms);
    grpc_metadata_array_init(&c->init_md);
    grpc_metadata_array_init(&c->trail_md);
    c->details = grpc_empty_slice();
    c->prepared = 1;
    if (reg != NULL) {
        c->call = grpc_channel_create_registered_call(cl->channel, NULL, GRPC_PROPAGATE_DEFAULTS,
                                                      cq, reg, deadline, NULL);
    } else {
        c->call =
            grpc_channel_create_call(cl->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                     grpc_slice_from_static_string(path), NULL, deadline, NULL);
    }
    grpc_op *op = c->ops;
    size_t n = 0;
    memset(c->ops, 0, sizeof c->ops);
    op[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    /* Static slices: their bytes live in c and cl, which outlive the batch. */
    size_t nmd = 0;
    uint64_t inc = atomic_load(&cl->incarnation);
    /* Context calls, and Checkpoint (a job's checkpoint of step N must be written by
     * the incarnation that took step N, not by a restarted server that restored an
     * older state, whether sent for the first time or again). */
    if (inc != 0 && (method == FERRY_RPC_FORWARD || method == FERRY_RPC_BACKWARD ||
                     method == FERRY_RPC_GRAD_NORM || method == FERRY_RPC_STEP ||
                     method == FERRY_RPC_CHECKPOINT)) {
        (void)snprintf(c->md_value, sizeof c->md_value, "%016llx", (unsigned long long)inc);
        c->md[nmd].key = grpc_slice_from_static_string(FERRY_RPC_INCARNATION_KEY);
        c->md[nmd++].value = grpc_slice_from_static_buffer(c->md_value, strlen(c->md_value));
    }
    if (cl->auth != NULL) {
        c->md[nmd].key = grpc_slice_from_static_string("authorization");
        c->md[nmd++].value = grpc_slice_from_static_buffer(cl->auth, strlen(cl->auth));
    }
    if (cl->name != NULL) {
        c->md[nmd].key = grpc_slice_from_static_string(FERRY_RPC_CLIENT_KEY);
        c->md[nmd++].value = grpc_slice_from_static_buffer(cl->name, strlen(cl->name));
    }
    { /* calls run in the session (Hello renews it; the health service ignores it) */
        lease_poll(cl);
        pthread_mutex_lock(&cl->lease_mu);
        memcpy(c->md_session, cl->session, sizeof c->md_session);
        pthread_mutex_unlock(&cl->lease_mu);
        if (c->md_session[0] != '\0') {
            c->md[nmd].key = grpc_slice_from_static_string(FERRY_RPC_SESSION_KEY);
            c->md[nmd++].value =
                grpc_slice_from_static_buffer(c->md_session, strlen(c->md_session));
        }
    }
    op[n].data.send_initial_metadata.count = nmd;
    op[n].data.send_initial_metadata.metadata = nmd > 0 ? c->md : NULL;
    op[n++].flags = atomic_load(&cl->wait_for_ready) ? GRPC_INITIAL_METADATA_WAIT_FOR_READY : 0;
    op[n].op = GRPC_OP_SEND_MESSAGE;
    op[n++].data.send_message.send_message = c->req_bb;
    op[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    op[n].op = GRPC_OP_RECV_INITIAL_METADATA;
    op[n++].data.recv_initial_metadata.recv_initial_metadata = &c->init_md;
    op[n].op = GRPC_OP_RECV_MESSAGE;
    op[n++].data.recv_message.recv_message = &c->reply_bb;
    op[n].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op[n].data.recv_status_on_client.trailing_metadata = &c->trail_md;
    op[n].data.recv_status_on_client.status = &c->code;
    op[n].data.recv_status_on_client.status_details = &c->details;
    op[n++].data.recv_status_on_client.error_string = &c->error_string;
    grpc_call_error e = grpc_call_start_batch(c->call, c->ops, n, c, NULL);
    if (e != GRPC_CALL_OK)
        return ferry_errorf(FERRY_ERR_RPC, "%s %s: cannot start the call: %s", cl->target, c->what,
                            grpc_call_error_to_string(e));
    c->started = 1;
    atomic_fetch_add(&cl->in_flight, 1);
    return FERRY_OK;
}

/* Encodes req (borrowing its payloads, counted in pend) into c->req_bb. */
static ferry_status call_encode(client_call *c, const ferry__rpc_method_info *mi,
                                const ferry_rpc_msg *req, ferry__rpc_pending *pend) {
    static const ferry_rpc_msg empty;
    ferry_rpc_client *cl = c->cl;
    ferry__rpc_wire w;
    ferry__rpc_wire_init(&w);
    ferry_status st =
        ferry__rpc_encode(req != NULL ? req : &empty, mi->request, FERRY_RPC_INLINE_MAX, &w);
    if (st != FERRY_OK)
        st = errorf_wrap(st, cl->target, mi->name, "bad request");
    else if (w.total > cl->lim.max_message_bytes)
        st = ferry_errorf(FERRY_ERR_RANGE, "%s %s: request of %zu bytes exceeds the %zu-byte limit",
                          cl->target, mi->name, w.total, cl->lim.max_message_bytes);
    else {
        c->req_bb = ferry__grpc_bb_borrowed(&w, req != NULL ? req : &empty, pend);
        atomic_fetch_add(&cl->bytes_sent, w.total);
    }
    ferry__rpc_wire_deinit(&w);
    return st;
}

/* Turns a completed call into a status and, on success, a decoded reply. */
static ferry_status call_result(client_call *c, ferry_rpc_msg *reply) {
    ferry_rpc_client *cl = c->cl;
    if (c->code == GRPC_STATUS_OK) {
        if (c->reply_bb == NULL)
            return ferry_errorf(FERRY_ERR_FORMAT, "%s %s: OK status without a reply message",
                                cl->target, c->what);
        atomic_fetch_add(&cl->bytes_received, grpc_byte_buffer_length(c->reply_bb));
        ferry_status st = ferry__grpc_decode(c->reply_bb, c->reply_desc, &cl->lim, reply);
        if (st != FERRY_OK)
            return errorf_wrap(st, cl->target, c->what, "bad reply");
        return FERRY_OK;
    }
    ferry_status st = ferry__grpc_status_from_metadata(&c->trail_md);
    int from_server = st != FERRY_OK;
    if (!from_server)
        st = ferry__grpc_status_from_code(c->code);
    c->transport = !from_server && (c->code == GRPC_STATUS_DEADLINE_EXCEEDED ||
                                    c->code == GRPC_STATUS_UNAVAILABLE);
    char details[384];
    size_t n = GRPC_SLICE_LENGTH(c->details);
    if (n >= sizeof details)
        n = sizeof details - 1;
    memcpy(details, GRPC_SLICE_START_PTR(c->details), n);
    details[n] = '\0';
    if (c->error_string != NULL)
        FERRY_LOG_DEBUG("rpc %s %s: %s", cl->target, c->what, c->error_string);
    if (c->lagged)
        return ferry_errorf(st, "%s %s: no answer %d ms after a replica of its shard answered",
                            cl->target, c->what, c->grace_ms);
    if (c->code == GRPC_STATUS_DEADLINE_EXCEEDED && !from_server)
        return ferry_errorf(st, "%s %s: DEADLINE_EXCEEDED (deadline %d ms)", cl->target, c->what,
                            c->deadline_ms);
    return ferry_errorf(st, "%s %s: %s: %s", cl->target, c->what, ferry__grpc_code_name(c->code),
                        details);
}

static void call_cleanup(client_call *c) {
    if (c->req_bb != NULL)
        grpc_byte_buffer_destroy(c->req_bb);
    if (c->reply_bb != NULL)
        grpc_byte_buffer_destroy(c->reply_bb);
    if (c->prepared) {
        grpc_metadata_array_destroy(&c->init_md);
        grpc_metadata_array_destroy(&c->trail_md);
        grpc_slice_unref(c->details);
        gpr_free((void *)(uintptr_t)c->error_string);
    }
    if (c->call != NULL)
        grpc_call_unref(c->call);
    if (c->started)
        atomic_fetch_sub(&c->cl->in_flight, 1);
}

/* Waits for `started` completions on cq. Every call has a deadline, so gRPC
 * completes each batch by then; no timeout is needed here. */
static void cq_wait_all(grpc_completion_queue *cq, int started) {
    for (int i = 0; i < started; i++) {
        grpc_event ev = ferry__grpc_cq_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC));
        FERRY_ASSERT(ev.type == GRPC_OP_COMPLETE);
    }
}

/* Waits for `started` completions, cancelling a group's laggards grace_ms after the
 * first answer of a server in that group. */
static void cq_wait_grace(grpc_completion_queue *cq, client_call *cc, const ferry_rpc_fanout *calls,
                          int n, int started, int grace_ms) {
    for (int left = started; left > 0;) {
        double now = ferry_now(), next = 0.0;
        for (int i = 0; i < n; i++) {
            client_call *c = &cc[i];
            if (!c->started || c->done || c->lagged || c->cut <= 0.0)
                continue;
            if (c->cut <= now) {
                c->lagged = 1;
                grpc_call_cancel_with_status(c->call, GRPC_STATUS_DEADLINE_EXCEEDED,
                                             "a replica of its group answered before", NULL);
            } else if (next == 0.0 || c->cut < next) {
                next = c->cut;
            }
        }
        gpr_timespec until = next > 0.0 ? ferry__grpc_deadline_in((int)((next - now) * 1000.0) + 1)
                                        : gpr_inf_future(GPR_CLOCK_MONOTONIC);
        grpc_event ev = ferry__grpc_cq_next(cq, until);
        FERRY_ASSERT(ev.type == GRPC_OP_COMPLETE || ev.type == GRPC_QUEUE_TIMEOUT);
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        client_call *c = ev.tag;
        c->done = 1;
        left--;
        /* Only a sibling's OK starts the clock, or its ABORTED (BUSY: the step moved
         * there, or the job rolls back): a restarted sibling's instant refusal must not
         * cut short the one replica that holds the step. */
        int i = (int)(c - cc),
            answered = c->code == GRPC_STATUS_OK || c->code == GRPC_STATUS_ABORTED;
        for (int k = 0; answered && calls[i].group > 0 && k < n; k++) {
            if (k != i && calls[k].group == calls[i].group && cc[k].cut <= 0.0) {
                cc[k].cut = ferry_now() + grace_ms / 1000.0;
                cc[k].grace_ms = grace_ms;
            }
        }
    }
}

/* ---- Public calls ------------------------------------------------------------------------ */

static void fanout_fail(ferry_rpc_fanout *fo, ferry_status st) {
    fo->status = st;
    (void)snprintf(fo->error, sizeof fo->error, "%s", ferry_error_last());
}

ferry_status ferry_rpc_call_many(ferry_rpc_fanout *calls, int n, int deadline_ms) {
    return ferry_rpc_call_many_during(calls, n, deadline_ms, NULL, NULL);
}

ferry_status ferry_rpc_call_many_during(ferry_rpc_fanout *calls, int n, int deadline_ms,
                                        void (*during)(void *arg), void *arg) {
    return ferry_rpc_call_many_grace(calls, n, deadline_ms, 0, during, arg);
}

ferry_status ferry_rpc_call_many_grace(ferry_rpc_fanout *calls, int n, int deadline_ms,
                                       int grace_ms, void (*during)(void *arg), void *arg) {
    if (n < 0 || (n > 0 && calls == NULL))
        return ferry_errorf(FERRY_ERR_INVALID, "rpc fan-out of %d calls", n);
    for (int i = 0; i < n; i++) {
        if (calls[i].client == NULL || calls[i].reply == NULL)
            return ferry_errorf(FERRY_ERR_INVALID, "rpc fan-out entry %d without client or reply",
                                i);
    }
    if (n == 0) {
        if (during != NULL)
            during(arg);
        return FERRY_OK;
    }
    client_call stack[4];
    client_call *cc = n <= 4 ? stack : calloc((size_t)n, sizeof *cc);
    if (cc == NULL)
        return ferry_errorf(FERRY_ERR_NOMEM, "no memory for a fan-out of %d calls", n);
    memset(cc, 0, (size_t)n * sizeof *cc);
    ferry__rpc_pending pend;
    ferry__rpc_pending_init(&pend);
    grpc_completion_queue *cq = cq_get(calls[0].client);
    int started = 0;
    for (int i = 0; i < n; i++) {
        ferry_rpc_fanout *fo = &calls[i];
        const ferry__rpc_method_info *mi = ferry__rpc_method(fo->method);
        fo->status = FERRY_OK;
        fo->transport = 0;
        fo->error[0] = '\0';
        ferry_rpc_msg_deinit(fo->reply);
        if (mi == NULL) {
            fanout_fail(fo, ferry_errorf(FERRY_ERR_INVALID, "%s: unknown method %d",
                                         fo->client->target, (int)fo->method));
            continue;
        }
        client_call *c = &cc[i];
        c->cl = fo->client;
        c->what = mi->name;
        c->reply_desc = mi->reply;
        c->deadline_ms = deadline_ms > 0 ? deadline_ms : fo->client->deadline_ms;
        ferry_status st = call_encode(c, mi, fo->req, &pend);
        if (st == FERRY_OK)
            st = call_launch(c, cq, fo->client->registered[fo->method], NULL, (int)fo->method);
        if (st != FERRY_OK)
            fanout_fail(fo, st);
        started += c->started;
    }
    double t0 = ferry_now();
    if (during != NULL)
        during(arg);
    if (grace_ms > 0)
        cq_wait_grace(cq, cc, calls, n, started, grace_ms);
    else
        cq_wait_all(cq, started);
    double took = ferry_now() - t0;
    ferry_status first = FERRY_OK;
    char first_error[sizeof calls[0].error] = "";
    for (int i = 0; i < n; i++) {
        ferry_rpc_fanout *fo = &calls[i];
        if (cc[i].started) {
            if (fo->method >= 0 && fo->method < FERRY_RPC_METHOD_COUNT)
                ferry__rpc_meter_add(&fo->client->meter[fo->method], (int)cc[i].code, took);
            ferry_status st = call_result(&cc[i], fo->reply);
            if (st != FERRY_OK) {
                fanout_fail(fo, st);
                fo->transport = cc[i].transport;
            }
        }
        call_cleanup(&cc[i]);
        if (first == FERRY_OK && fo->status != FERRY_OK) {
            first = fo->status;
            memcpy(first_error, fo->error, sizeof first_error);
        }
    }
    /* gRPC drops its references to the payload slices once the calls are gone;
     * only then are the callers' borrowed tensors theirs again. */
    ferry__rpc_pending_wait(&pend);
    cq_put(calls[0].client, cq);
    if (cc != stack)
        free(cc);
    return first == FERRY_OK ? FERRY_OK : ferry_errorf(first, "%s", first_error);
}

ferry_status ferry_rpc_call(ferry_rpc_client *c, ferry_rpc_method method, const ferry_rpc_msg *req,
                            ferry_rpc_msg *reply, int deadline_ms) {
    ferry_rpc_fanout fo = {.client = c, .method = method, .req = req, .reply = reply};
    return ferry_rpc_call_many(&fo, 1, deadline_ms);
}

ferry_status ferry__rpc_call_raw(ferry_rpc_client *cl, const char *path, const void *bytes,
                                 size_t n, ferry_rpc_method reply_method, ferry_rpc_msg *reply,
                                 int deadline_ms) {
    const ferry__rpc_method_info *mi = ferry__rpc_method(reply_method);
    FERRY_ASSERT(mi != NULL);
    ferry_rpc_msg_deinit(reply);
    client_call c = {.cl = cl, .what = path, .reply_desc = mi->reply};
    c.deadline_ms = deadline_ms > 0 ? deadline_ms : cl->deadline_ms;
    grpc_slice s = grpc_slice_from_copied_buffer(bytes, n);
    c.req_bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    grpc_completion_queue *cq = cq_get(cl);
    ferry_status st = call_launch(&c, cq, NULL, path, -1);
    if (st == FERRY_OK) {
        cq_wait_all(cq, 1);
        st = call_result(&c, reply);
    }
    call_cleanup(&c);
    cq_put(cl, cq);
    return st;
}

/* ---- Lifetime ---------------------------------------------------------------------------- */

ferry_status ferry_rpc_client_create(const char *target, const ferry_rpc_client_config *cfg,
                                     ferry_rpc_client **out) {
    static const ferry_rpc_client_config defaults;
    if (cfg == NULL)
        cfg = &defaults;
    if (target == NULL || target[0] == '\0')
        return ferry_errorf(FERRY_ERR_INVALID, "rpc client: empty target");
    size_t max_bytes =
        cfg->max_message_bytes > 0 ? cfg->max_message_bytes : FERRY_RPC_DEFAULT_MAX_MESSAGE_BYTES;
    if (max_bytes > INT32_MAX || cfg->deadline_ms < 0)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "rpc client %s: max message %zu bytes (max 2 GiB)"
                            " or deadline %d ms out of range",
                            target, max_bytes, cfg->deadline_ms);
    ferry_rpc_client *cl = calloc(1, sizeof *cl);
    if (cl == NULL || (cl->target = strdup(target)) == NULL) {
        free(cl);
        return ferry_errorf(FERRY_ERR_NOMEM, "rpc client: out of memory");
    }
    FERRY_ASSERT(pthread_mutex_init(&cl->mu, NULL) == 0);
    FERRY_ASSERT(pthread_mutex_init(&cl->lease_mu, NULL) == 0);
    cl->lim =
        (ferry__rpc_limits){.max_message_bytes = max_bytes, .max_tensors = FERRY_RPC_MAX_TENSORS};
    cl->deadline_ms = cfg->deadline_ms > 0 ? cfg->deadline_ms : FERRY_RPC_DEFAULT_DEADLINE_MS;
    cl->wait_for_ready = cfg->wait_for_ready != 0;
    if (cfg->token != NULL) {
        size_t n = strlen(cfg->token) + 8;
        if ((cl->auth = malloc(n)) != NULL)
            (void)snprintf(cl->auth, n, "Bearer %s", cfg->token);
    }
    if (cfg->client_name != NULL)
        cl->name = strdup(cfg->client_name);
    if ((cfg->token != NULL && cl->auth == NULL) || (cfg->client_name != NULL && cl->name == NULL)) {
        free(cl->auth);
        free(cl->target);
        free(cl);
        return ferry_errorf(FERRY_ERR_NOMEM, "rpc client: out of memory");
    }
    ferry__grpc_init();
    grpc_arg args[FERRY__GRPC_MAX_ARGS];
    grpc_channel_args ca = {ferry__grpc_fill_args(args, max_bytes, 1), args};
    grpc_channel_credentials *creds;
    if (cfg->tls_ca_pem != NULL) {
        grpc_ssl_pem_key_cert_pair pair = {cfg->tls_key_pem, cfg->tls_cert_pem};
        creds = grpc_ssl_credentials_create(
            cfg->tls_ca_pem, cfg->tls_cert_pem != NULL && cfg->tls_key_pem != NULL ? &pair : NULL,
            NULL, NULL);
    } else {
        creds = grpc_insecure_credentials_create();
    }
    cl->channel = grpc_channel_create(target, creds, &ca); /* a bad target gives a lame channel */
    grpc_channel_credentials_release(creds);
    for (int m = 0; m < FERRY_RPC_METHOD_COUNT; m++)
        cl->registered[m] = grpc_channel_register_call(
            cl->channel, ferry__rpc_method((ferry_rpc_method)m)->path, NULL, NULL);
    *out = cl;
    return FERRY_OK;
}

void ferry_rpc_client_destroy(ferry_rpc_client *c) {
    if (c == NULL)
        return;
    FERRY_ASSERT(atomic_load(&c->in_flight) == 0);
    pthread_mutex_lock(&c->lease_mu);
    lease_close_locked(c);
    pthread_mutex_unlock(&c->lease_mu);
    if (c->lease_cq != NULL)
        cq_destroy(c->lease_cq);
    pthread_mutex_destroy(&c->lease_mu);
    for (int i = 0; i < c->ncq_idle; i++)
        cq_destroy(c->cq_idle[i]);
    grpc_channel_destroy(c->channel);
    ferry__grpc_shutdown();
    pthread_mutex_destroy(&c->mu);
    if (c->auth != NULL)
        explicit_bzero(c->auth, strlen(c->auth));
    free(c->auth);
    free(c->name);
    free(c->target);
    free(c);
}

void ferry_rpc_client_bytes(ferry_rpc_client *c, uint64_t *sent, uint64_t *received) {
    *sent = atomic_load(&c->bytes_sent);
    *received = atomic_load(&c->bytes_received);
}

void ferry_rpc_client_set_wait_for_ready(ferry_rpc_client *c, int on) {
    atomic_store(&c->wait_for_ready, on != 0);
}

void ferry_rpc_client_method_stats(ferry_rpc_client *c, int slot, ferry_rpc_method_stats *out) {
    memset(out, 0, sizeof *out);
    if (slot >= 0 && slot < FERRY_RPC_STATS_SLOTS)
        ferry__rpc_meter_read(&c->meter[slot], out);
}

ferry_status ferry_rpc_health_check(ferry_rpc_client *cl, int deadline_ms, int *serving) {
    *serving = 0;
    uint8_t buf[8];
    Grpc__Health__V1__HealthCheckRequest q;
    grpc__health__v1__health_check_request__init(&q);
    size_t n = grpc__health__v1__health_check_request__pack(&q, buf);
    client_call c = {.cl = cl, .what = "Health/Check"};
    c.deadline_ms = deadline_ms > 0 ? deadline_ms : cl->deadline_ms;
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)buf, n);
    c.req_bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    grpc_completion_queue *cq = cq_get(cl);
    ferry_status st = call_launch(&c, cq, NULL, "/grpc.health.v1.Health/Check", -1);
    if (st == FERRY_OK) {
        cq_wait_all(cq, 1);
        if (c.code == GRPC_STATUS_OK && c.reply_bb != NULL) {
            grpc_byte_buffer_reader rd;
            Grpc__Health__V1__HealthCheckResponse *r = NULL;
            if (grpc_byte_buffer_reader_init(&rd, c.reply_bb)) {
                grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
                r = grpc__health__v1__health_check_response__unpack(
                    NULL, GRPC_SLICE_LENGTH(all), GRPC_SLICE_START_PTR(all));
                grpc_slice_unref(all);
                grpc_byte_buffer_reader_destroy(&rd);
            }
            if (r == NULL) {
                st = ferry_errorf(FERRY_ERR_FORMAT, "%s Health/Check: undecodable reply",
                                  cl->target);
            } else {
                *serving =
                    r->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
                grpc__health__v1__health_check_response__free_unpacked(r, NULL);
            }
        } else {
            ferry_rpc_msg none;
            ferry_rpc_msg_init(&none);
            st = call_result(&c, &none);
            ferry_rpc_msg_deinit(&none);
        }
    }
    call_cleanup(&c);
    cq_put(cl, cq);
    return st;
}

void ferry_rpc_client_set_incarnation(ferry_rpc_client *c, uint64_t incarnation) {
    atomic_store(&c->incarnation, incarnation);
}

const char *ferry_rpc_client_target(const ferry_rpc_client *c) {
    return c->target;
}
