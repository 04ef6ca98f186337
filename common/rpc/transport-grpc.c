/* transport-grpc.c - glue between ferry's codec and gRPC's C core: byte buffers
 * whose payload slices point at tensor memory, decoding by walking slices in
 * place, ferry_status <-> grpc_status_code, channel arguments, and the library
 * lifetime. server.c and client.c build on it. */
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/support/log.h>

#include "common/core/flags.h" /* ferry_env_int */
#include "common/core/log.h"
#include "common/rpc/transport-grpc.h"

/* ---- Library lifetime -------------------------------------------------------- */

/* gRPC logs through gpr_log; its errors (bind failures, oversized messages)
 * become ferry warnings so that every line a daemon prints looks the same. A failed
 * TLS handshake is an information line: the side that made the connection reports
 * it as its error (a client says why, see cluster.c), and a server goes on serving. */
_Thread_local int ferry__grpc_quiet;

static void grpc_log_to_ferry(gpr_log_func_args *args) {
    const char *file = strrchr(args->file, '/');
    file = file != NULL ? file + 1 : args->file;
    if (args->severity == GPR_LOG_SEVERITY_ERROR && strstr(args->message, "andshake failed"))
        FERRY_LOG_INFO("grpc: a TLS handshake failed: %s (%s:%d)", args->message, file, args->line);
    else if (args->severity == GPR_LOG_SEVERITY_ERROR && !ferry__grpc_quiet)
        FERRY_LOG_WARN("grpc: %s (%s:%d)", args->message, file, args->line);
    else
        FERRY_LOG_DEBUG("grpc: %s (%s:%d)", args->message, file, args->line);
}

static pthread_once_t grpc_log_once = PTHREAD_ONCE_INIT;

/* Once per process, before the first grpc_init. Besides the log hook: a client
 * channel's connection attempt (a restarted server's port) completes only when some
 * thread polls its socket. Calls without wait-for-ready fail at once while it
 * reconnects, and a caller that pauses between retries polls nothing, so the attempt
 * waited for gRPC's backup poller, which runs every 5 s: the issue-25 campaign saw a
 * restarted ferry-ps reached 4.7-10.7 s after it listened. Every 100 ms instead (a
 * poll without waiting: negligible), unless the user set it. */
static void grpc_log_setup(void) {
    gpr_set_log_function(grpc_log_to_ferry);
    (void)setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "100", 0);
}

void ferry__grpc_init(void) {
    FERRY_ASSERT(pthread_once(&grpc_log_once, grpc_log_setup) == 0);
    grpc_init();
}

void ferry__grpc_shutdown(void) {
    grpc_shutdown();
}

/* ---- Borrowed payloads ------------------------------------------------------------ */

void ferry__rpc_pending_init(ferry__rpc_pending *p) {
    FERRY_ASSERT(pthread_mutex_init(&p->mu, NULL) == 0);
    FERRY_ASSERT(pthread_cond_init(&p->cv, NULL) == 0);
    p->n = 0;
}

void ferry__rpc_pending_wait(ferry__rpc_pending *p) {
    pthread_mutex_lock(&p->mu);
    while (p->n > 0)
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
}

/* Slice destructor of a borrowed payload: gRPC no longer reads that memory. */
static void pending_release(void *user) {
    ferry__rpc_pending *p = user;
    pthread_mutex_lock(&p->mu);
    if (--p->n == 0)
        pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* ---- Byte buffers -------------------------------------------------------------------- */

/* One slice per segment: header runs are copied (they are small and live in the
 * wire buffer, which is freed right after), payloads are wrapped in place. */
static grpc_byte_buffer *bb_build(const ferry__rpc_wire *w, const ferry_rpc_msg *m,
                                  ferry__rpc_pending *pend, unsigned char *sent) {
    grpc_slice stack[16];
    grpc_slice *s = w->nseg <= 16 ? stack : malloc((size_t)w->nseg * sizeof *s);
    FERRY_ASSERT(s != NULL);
    for (int i = 0; i < w->nseg; i++) {
        const ferry__rpc_seg *g = &w->segs[i];
        if (g->tensor < 0) {
            s[i] = grpc_slice_from_copied_buffer((const char *)w->buf + g->off, g->len);
            continue;
        }
        const ferry_rpc_tensor *t = &m->tensors[g->tensor];
        if (pend != NULL) {
            pthread_mutex_lock(&pend->mu);
            pend->n++;
            pthread_mutex_unlock(&pend->mu);
            s[i] = grpc_slice_new_with_user_data(t->data, t->nbytes, pending_release, pend);
        } else {
            sent[g->tensor] = 1;
            s[i] = grpc_slice_new_with_user_data(t->data, t->nbytes, t->release, t->release_user);
        }
    }
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(s, (size_t)w->nseg); /* refs each slice */
    for (int i = 0; i < w->nseg; i++)
        grpc_slice_unref(s[i]);
    if (s != stack)
        free(s);
    return bb;
}

grpc_byte_buffer *ferry__grpc_bb_borrowed(const ferry__rpc_wire *w, const ferry_rpc_msg *m,
                                          ferry__rpc_pending *pend) {
    return bb_build(w, m, pend, NULL);
}

grpc_byte_buffer *ferry__grpc_bb_owned(const ferry__rpc_wire *w, ferry_rpc_msg *m) {
    unsigned char sent[FERRY_RPC_MAX_TENSORS] = {0};
    for (int i = 0; i < w->nseg; i++)
        FERRY_ASSERT(w->segs[i].tensor < 0 || m->tensors[w->segs[i].tensor].release != NULL);
    grpc_byte_buffer *bb = bb_build(w, m, NULL, sent);
    /* Payloads that were copied into the header are free to go now. */
    for (int i = 0; i < m->ntensors; i++) {
        ferry_rpc_tensor *t = &m->tensors[i];
        if (!sent[i] && t->release != NULL)
            t->release(t->release_user);
    }
    ferry__rpc_msg_disown(m);
    ferry_rpc_msg_deinit(m);
    return bb;
}

/* ---- Decoding ------------------------------------------------------------------------- */

static int reader_next(void *user, const uint8_t **p, size_t *n) {
    grpc_slice *s;
    if (!grpc_byte_buffer_reader_peek(user, &s))
        return 0;
    *p = GRPC_SLICE_START_PTR(*s);
    *n = GRPC_SLICE_LENGTH(*s);
    return 1;
}

ferry_status ferry__grpc_decode(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                                const ferry__rpc_limits *lim, ferry_rpc_msg *out) {
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb))
        return ferry_errorf(FERRY_ERR_FORMAT, "cannot read the message (bad compression)");
    ferry__rpc_source src = {.next = reader_next, .user = &r, .total = grpc_byte_buffer_length(bb)};
    ferry_status st = ferry__rpc_decode(&src, desc, lim, out);
    grpc_byte_buffer_reader_destroy(&r);
    return st;
}

ferry_status ferry__grpc_bb_save(grpc_byte_buffer *bb, const char *path) {
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb))
        return FERRY_ERR_FORMAT;
    FILE *f = fopen(path, "wb");
    int ok = f != NULL;
    grpc_slice s;
    while (grpc_byte_buffer_reader_next(&r, &s)) {
        ok = ok && fwrite(GRPC_SLICE_START_PTR(s), 1, GRPC_SLICE_LENGTH(s), f) ==
                       GRPC_SLICE_LENGTH(s);
        grpc_slice_unref(s);
    }
    grpc_byte_buffer_reader_destroy(&r);
    if (f != NULL && fclose(f) != 0)
        ok = 0;
    return ok ? FERRY_OK : FERRY_ERR_IO;
}

/* ---- Status codes ---------------------------------------------------------------------- */

grpc_status_code ferry__grpc_code_from_status(ferry_status st) {
    switch (st) {
    case FERRY_OK:
        return GRPC_STATUS_OK;
    case FERRY_ERR_INVALID:
    case FERRY_ERR_SHAPE:
    case FERRY_ERR_FORMAT:
    case FERRY_ERR_NUMERIC:
        return GRPC_STATUS_INVALID_ARGUMENT;
    case FERRY_ERR_NOT_FOUND:
        return GRPC_STATUS_NOT_FOUND;
    case FERRY_ERR_RANGE:
        return GRPC_STATUS_OUT_OF_RANGE;
    case FERRY_ERR_EXISTS:
        return GRPC_STATUS_ALREADY_EXISTS;
    case FERRY_ERR_UNSUPPORTED:
        return GRPC_STATUS_UNIMPLEMENTED;
    case FERRY_ERR_TIMEOUT:
        return GRPC_STATUS_DEADLINE_EXCEEDED;
    case FERRY_ERR_BUSY:
        return GRPC_STATUS_ABORTED;
    case FERRY_ERR_UNAVAILABLE:
        return GRPC_STATUS_UNAVAILABLE;
    case FERRY_ERR_NOMEM:
    case FERRY_ERR_RESOURCE:
        return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case FERRY_ERR_AUTH:
    case FERRY_ERR_SESSION:
        return GRPC_STATUS_UNAUTHENTICATED;
    case FERRY_ERR_DENIED:
        return GRPC_STATUS_PERMISSION_DENIED;
    case FERRY_ERR_ABORTED: /* not to be retried until something changes */
        return GRPC_STATUS_FAILED_PRECONDITION;
    default:
        return GRPC_STATUS_INTERNAL;
    }
}

/* For codes that did not come from a ferry handler (the transport's own). */
ferry_status ferry__grpc_status_from_code(grpc_status_code code) {
    switch (code) {
    case GRPC_STATUS_OK:
        return FERRY_OK;
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_FAILED_PRECONDITION:
        return FERRY_ERR_INVALID;
    case GRPC_STATUS_DEADLINE_EXCEEDED:
        return FERRY_ERR_TIMEOUT;
    case GRPC_STATUS_NOT_FOUND:
        return FERRY_ERR_NOT_FOUND;
    case GRPC_STATUS_ALREADY_EXISTS:
        return FERRY_ERR_EXISTS;
    case GRPC_STATUS_RESOURCE_EXHAUSTED: /* in practice: a message over a size limit */
    case GRPC_STATUS_OUT_OF_RANGE:
        return FERRY_ERR_RANGE;
    case GRPC_STATUS_ABORTED:
        return FERRY_ERR_BUSY;
    case GRPC_STATUS_UNIMPLEMENTED:
        return FERRY_ERR_UNSUPPORTED;
    case GRPC_STATUS_UNAVAILABLE:
        return FERRY_ERR_UNAVAILABLE;
    case GRPC_STATUS_UNAUTHENTICATED:
        return FERRY_ERR_AUTH;
    case GRPC_STATUS_PERMISSION_DENIED:
        return FERRY_ERR_DENIED;
    default: /* CANCELLED, UNKNOWN, INTERNAL, DATA_LOSS, ... */
        return FERRY_ERR_RPC;
    }
}

const double ferry_rpc_latency_bounds[FERRY_RPC_LATENCY_BUCKETS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0};

void ferry__rpc_meter_add(ferry__rpc_meter *m, int code, double seconds) {
    if (code >= 0 && code < FERRY_RPC_CODES)
        atomic_fetch_add(&m->calls[code], 1);
    int b = 0;
    while (b < FERRY_RPC_LATENCY_BUCKETS && seconds > ferry_rpc_latency_bounds[b])
        b++;
    atomic_fetch_add(b < FERRY_RPC_LATENCY_BUCKETS ? &m->buckets[b] : &m->over, 1);
    atomic_fetch_add(&m->sum_ns, (uint64_t)(seconds > 0 ? seconds * 1e9 : 0));
}

void ferry__rpc_meter_read(ferry__rpc_meter *m, ferry_rpc_method_stats *out) {
    for (int i = 0; i < FERRY_RPC_CODES; i++)
        out->calls[i] = atomic_load(&m->calls[i]);
    for (int i = 0; i < FERRY_RPC_LATENCY_BUCKETS; i++)
        out->buckets[i] = atomic_load(&m->buckets[i]);
    out->over = atomic_load(&m->over);
    out->sum_s = (double)atomic_load(&m->sum_ns) * 1e-9;
}

const char *ferry_rpc_stats_slot_name(int slot) {
    if (slot >= 0 && slot < FERRY_RPC_METHOD_COUNT)
        return ferry_rpc_method_name((ferry_rpc_method)slot);
    return slot == FERRY_RPC_STATS_HEALTH    ? "grpc.health.v1.Health"
           : slot == FERRY_RPC_STATS_SESSION ? "Session"
                                             : "unknown";
}

const char *ferry_rpc_code_name(int code) {
    return ferry__grpc_code_name((grpc_status_code)code);
}

const char *ferry__grpc_code_name(grpc_status_code code) {
    /* Indexed by code, so the table cannot slip out of step with grpc/status.h. */
    static const char *const names[] = {
        [GRPC_STATUS_OK] = "OK",
        [GRPC_STATUS_CANCELLED] = "CANCELLED",
        [GRPC_STATUS_UNKNOWN] = "UNKNOWN",
        [GRPC_STATUS_INVALID_ARGUMENT] = "INVALID_ARGUMENT",
        [GRPC_STATUS_DEADLINE_EXCEEDED] = "DEADLINE_EXCEEDED",
        [GRPC_STATUS_NOT_FOUND] = "NOT_FOUND",
        [GRPC_STATUS_ALREADY_EXISTS] = "ALREADY_EXISTS",
        [GRPC_STATUS_PERMISSION_DENIED] = "PERMISSION_DENIED",
        [GRPC_STATUS_RESOURCE_EXHAUSTED] = "RESOURCE_EXHAUSTED",
        [GRPC_STATUS_FAILED_PRECONDITION] = "FAILED_PRECONDITION",
        [GRPC_STATUS_ABORTED] = "ABORTED",
        [GRPC_STATUS_OUT_OF_RANGE] = "OUT_OF_RANGE",
        [GRPC_STATUS_UNIMPLEMENTED] = "UNIMPLEMENTED",
        [GRPC_STATUS_INTERNAL] = "INTERNAL",
        [GRPC_STATUS_UNAVAILABLE] = "UNAVAILABLE",
        [GRPC_STATUS_DATA_LOSS] = "DATA_LOSS",
        [GRPC_STATUS_UNAUTHENTICATED] = "UNAUTHENTICATED",
    };
    if ((int)code < 0 || (size_t)code >= sizeof names / sizeof names[0])
        return "UNKNOWN_CODE";
    return names[code];
}

ferry_status ferry__grpc_status_from_metadata(const grpc_metadata_array *md) {
    for (size_t i = 0; i < md->count; i++) {
        if (grpc_slice_str_cmp(md->metadata[i].key, FERRY_RPC_STATUS_KEY) != 0)
            continue;
        char buf[16];
        size_t n = GRPC_SLICE_LENGTH(md->metadata[i].value);
        if (n == 0 || n >= sizeof buf)
            return FERRY_OK;
        memcpy(buf, GRPC_SLICE_START_PTR(md->metadata[i].value), n);
        buf[n] = '\0';
        char *end;
        long v = strtol(buf, &end, 10);
        if (*end != '\0')
            return FERRY_OK;
        /* Only values the table knows; anything else falls back to the gRPC code. */
        switch (v) {
#define FERRY_STATUS_KNOWN_(name, code, text)                                                      \
    case code:                                                                                     \
        return (ferry_status)code;
            FERRY_STATUS_MAP(FERRY_STATUS_KNOWN_)
#undef FERRY_STATUS_KNOWN_
        default:
            return FERRY_OK;
        }
    }
    return FERRY_OK;
}

/* ---- Channel arguments and deadlines ---------------------------------------------------- */

size_t ferry__grpc_fill_args(grpc_arg *a, size_t max_message_bytes, int client) {
    size_t n = 0;
    FERRY_ASSERT(max_message_bytes <= INT_MAX);
    a[n].type = GRPC_ARG_INTEGER;
    a[n].key = (char *)(uintptr_t)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    a[n++].value.integer = (int)max_message_bytes;
    a[n].type = GRPC_ARG_INTEGER;
    a[n].key = (char *)(uintptr_t)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    a[n++].value.integer = (int)max_message_bytes;
    if (!client) {
        /* gRPC sets SO_REUSEPORT by default: a second daemon on the same port
         * would then share its traffic instead of failing to start. */
        a[n].type = GRPC_ARG_INTEGER;
        a[n].key = (char *)(uintptr_t)GRPC_ARG_ALLOW_REUSEPORT;
        a[n++].value.integer = 0;
    }
    if (client) {
        /* Ferry calls are not idempotent (Step) and never retried by gRPC; the
         * retry layer would also hold on to the request's payload slices. */
        a[n].type = GRPC_ARG_INTEGER;
        a[n].key = (char *)(uintptr_t)GRPC_ARG_ENABLE_RETRIES;
        a[n++].value.integer = 0;
        /* One connection per client object, not one shared by every channel to
         * the same address, so that clients are independent. */
        a[n].type = GRPC_ARG_INTEGER;
        a[n].key = (char *)(uintptr_t)GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
        a[n++].value.integer = 1;
        /* Shard traffic stays on the cluster network, never on an HTTP proxy. */
        a[n].type = GRPC_ARG_INTEGER;
        a[n].key = (char *)(uintptr_t)GRPC_ARG_ENABLE_HTTP_PROXY;
        a[n++].value.integer = 0;
        /* A restarted shard is found again within a second of listening. A lost
         * connection's subchannel reconnects by itself, pausing between attempts
         * 100 ms (gRPC's floor) growing by 1.6 to 250 ms, not 1 s growing to two
         * minutes; meanwhile calls without wait-for-ready fail at once, and the
         * cluster's retries (common/dist/cluster.c) send them again. The backup
         * poller (ferry__grpc_init) makes an attempt's completion seen within 100 ms.
         * GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, the time one attempt may take (its TCP
         * connect and TLS handshake), stays at gRPC's 20 s: a refused port fails at
         * once, and a slow handshake (TLS under a sanitizer, a far link) must not be
         * cut off and started again forever. */
        a[n].type = GRPC_ARG_INTEGER;
        a[n].key = (char *)(uintptr_t)GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS;
        a[n++].value.integer = 100;
        a[n].type = GRPC_ARG_INTEGER;
        a[n].key = (char *)(uintptr_t)GRPC_ARG_MAX_RECONNECT_BACKOFF_MS;
        a[n++].value.integer = 250;
    }
    FERRY_ASSERT(n <= FERRY__GRPC_MAX_ARGS);
    return n;
}

gpr_timespec ferry__grpc_deadline_in(int ms) {
    /* Relative: gpr_time_from_millis(ms, GPR_CLOCK_MONOTONIC) alone would be an
     * absolute instant shortly after boot. */
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

/* ---- Completion-queue waits with a short spin ------------------------------------- */

static _Atomic int spin_us = -1; /* -1: not yet read from FERRY_RPC_SPIN_US */

void ferry_rpc_set_spin_us(int us) {
    atomic_store(&spin_us, us < 0 ? 0 : us);
}

int ferry_rpc_get_spin_us(void) {
    int us = atomic_load(&spin_us);
    if (us < 0) {
        us = ferry_env_int("FERRY_RPC_SPIN_US", 0, 1000000, FERRY_RPC_DEFAULT_SPIN_US);
        atomic_store(&spin_us, us);
    }
    return us;
}

grpc_event ferry__grpc_cq_next(grpc_completion_queue *cq, gpr_timespec until) {
    int us = ferry_rpc_get_spin_us();
    if (us > 0) {
        gpr_timespec end =
            gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_micros(us, GPR_TIMESPAN));
        if (gpr_time_cmp(until, end) < 0)
            end = until;
        gpr_timespec now = gpr_inf_past(GPR_CLOCK_MONOTONIC);
        do {
            grpc_event ev = grpc_completion_queue_next(cq, now, NULL);
            if (ev.type != GRPC_QUEUE_TIMEOUT)
                return ev;
        } while (gpr_time_cmp(gpr_now(GPR_CLOCK_MONOTONIC), end) < 0);
    }
    return grpc_completion_queue_next(cq, until, NULL);
}
