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

static ferry_status rehello(ferry_cluster *c, int i);

/* Methods a caller may send again after a failure in transit: each is applied once
 * on the server however often it arrives (or changes nothing). */
static int retry_safe(ferry_rpc_method m) {
    return m == FERRY_RPC_FORWARD || m == FERRY_RPC_BACKWARD || m == FERRY_RPC_GRAD_NORM ||
           m == FERRY_RPC_STEP || m == FERRY_RPC_GET_PARAMS || m == FERRY_RPC_STATS;
}

/* The fan-out behind every ferry__dist_fanout*: calls that failed in transit go again
 * (within the cluster's retry window) when retry_ok. */
static ferry_status fanout(ferry_cluster *c, ferry_rpc_method method, int n, const int *servers,
                           const ferry_rpc_msg *reqs, int shared, ferry_rpc_msg *replies,
                           int deadline_ms, void (*during)(void *arg), void *arg, int retry_ok) {
    if (n == 0) {
        if (during != NULL)
            during(arg);
        return FERRY_OK;
    }
    ferry_rpc_fanout *calls = calloc((size_t)n, sizeof *calls);
    int *idx = calloc((size_t)n, sizeof *idx);
    if (calls == NULL || idx == NULL) {
        free(calls);
        free(idx);
        return FERRY_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++) {
        calls[i].client = c->clients[servers[i]];
        calls[i].method = method;
        calls[i].req = &reqs[shared ? 0 : i];
        calls[i].reply = &replies[i];
    }
    ferry_status st = ferry_rpc_call_many_during(calls, n, deadline_ms, during, arg);
    /* A server that no longer knows this client's session (it restarted, or the session
     * expired) refused the call before running it: say Hello there again and send the
     * call once more. What the old session held is gone; the server says so then. */
    if (st == FERRY_ERR_SESSION && method != FERRY_RPC_HELLO) {
        int m = 0;
        ferry_status hs = FERRY_OK;
        for (int i = 0; i < n && hs == FERRY_OK; i++) {
            if (calls[i].status != FERRY_ERR_SESSION)
                continue;
            int seen = 0;
            for (int k = 0; k < m; k++) /* one Hello per server */
                seen |= servers[idx[k]] == servers[i];
            if (!seen)
                hs = rehello(c, servers[i]);
            idx[m++] = i;
        }
        ferry_rpc_fanout *again = hs == FERRY_OK ? calloc((size_t)m, sizeof *again) : NULL;
        if (again != NULL) {
            for (int k = 0; k < m; k++)
                again[k] = calls[idx[k]];
            (void)ferry_rpc_call_many(again, m, deadline_ms);
            for (int k = 0; k < m; k++)
                calls[idx[k]] = again[k];
            free(again);
            st = FERRY_OK; /* the first entry that still failed, if any */
            for (int i = 0; i < n && st == FERRY_OK; i++)
                if (calls[i].status != FERRY_OK)
                    st = ferry_errorf(calls[i].status, "%s", calls[i].error);
        }
    }
    int retry_ms = atomic_load(&c->retry_ms);
    double t0 = ferry_now();
    long pause_ms = 50;
    for (int attempt = 1; st != FERRY_OK && retry_ms > 0 && retry_ok; attempt++) {
        /* Only the calls that failed in transit go again; an answer from a server
         * (even an error) is final. */
        int m = 0;
        for (int i = 0; i < n; i++) {
            if (calls[i].status == FERRY_OK)
                continue;
            if (!calls[i].transport)
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
        /* Compact the failed entries to the front, send them, put them back. */
        ferry_rpc_fanout *again = calloc((size_t)m, sizeof *again);
        if (again == NULL) {
            st = FERRY_ERR_NOMEM;
            break;
        }
        for (int k = 0; k < m; k++)
            again[k] = calls[idx[k]];
        atomic_fetch_add(&c->retries, (uint64_t)m);
        /* No attempt runs past the window. */
        int dl = deadline_ms > 0 ? deadline_ms : c->cfg.deadline_ms;
        double left_ms = retry_ms - (ferry_now() - t0) * 1000.0;
        if (left_ms < dl)
            dl = left_ms > 100.0 ? (int)left_ms : 100;
        st = ferry_rpc_call_many(again, m, dl);
        for (int k = 0; k < m; k++)
            calls[idx[k]] = again[k];
        free(again);
        if (st == FERRY_OK)
            FERRY_LOG_WARN("%s %s answered after %d %s (%.1f s)",
                           ferry_rpc_client_target(calls[idx[0]].client),
                           ferry_rpc_method_name(method), attempt,
                           attempt == 1 ? "retry" : "retries", ferry_now() - t0);
    }
    free(calls);
    free(idx);
    return st;
}

ferry_status ferry__dist_fanout_during(ferry_cluster *c, ferry_rpc_method method, int n,
                                       const int *servers, const ferry_rpc_msg *reqs, int shared,
                                       ferry_rpc_msg *replies, int deadline_ms,
                                       void (*during)(void *arg), void *arg) {
    return fanout(c, method, n, servers, reqs, shared, replies, deadline_ms, during, arg,
                  retry_safe(method));
}

ferry_status ferry__dist_fanout_retry(ferry_cluster *c, ferry_rpc_method method, int n,
                                      const int *servers, const ferry_rpc_msg *reqs, int shared,
                                      ferry_rpc_msg *replies) {
    return fanout(c, method, n, servers, reqs, shared, replies, c->cfg.deadline_ms, NULL, NULL, 1);
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
    const char *target = ferry_rpc_client_target(c->clients[i]);
    if (r->contract_major != FERRY_CONTRACT_MAJOR)
        return ferry_errorf(FERRY_ERR_UNSUPPORTED,
                            "%s speaks contract %u.%u; this client speaks %d.%d (ferry.v1)", target,
                            r->contract_major, r->contract_minor, FERRY_CONTRACT_MAJOR,
                            FERRY_CONTRACT_MINOR);
    if (c->incarnation[i] != 0 && c->incarnation[i] != r->incarnation) {
        FERRY_LOG_WARN("%s restarted: incarnation %016llx, was %016llx", target,
                       (unsigned long long)r->incarnation, (unsigned long long)c->incarnation[i]);
        ++*changed;
    }
    c->incarnation[i] = r->incarnation;
    (void)snprintf(c->identity, sizeof c->identity, "%s", r->identity);
    /* Context calls now name it: a later restart refuses them instead of serving them
     * from a new state. */
    ferry_rpc_client_set_incarnation(c->clients[i], r->incarnation);
    return ferry_rpc_client_set_session(c->clients[i], r->session, 1);
}

ferry_status ferry_cluster_hello(ferry_cluster *c, int *restarted) {
    Ferry__V1__HelloRequest q;
    hello_request(c, &q);
    ferry_rpc_msg req, *replies = calloc((size_t)c->n, sizeof *replies);
    int *servers = calloc((size_t)c->n, sizeof *servers);
    ferry_rpc_msg_init(&req);
    ferry_status st = replies && servers ? ferry_rpc_msg_set_head(&req, &q.base) : FERRY_ERR_NOMEM;
    for (int i = 0; i < c->n && replies != NULL && servers != NULL; i++) {
        ferry_rpc_msg_init(&replies[i]);
        servers[i] = i;
    }
    if (st == FERRY_OK)
        st = ferry__dist_fanout(c, FERRY_RPC_HELLO, c->n, servers, &req, 1, replies);
    int changed = 0;
    pthread_mutex_lock(&c->hello_mu);
    for (int i = 0; st == FERRY_OK && i < c->n; i++)
        st = hello_apply(c, i, replies[i].head, &changed);
    pthread_mutex_unlock(&c->hello_mu);
    for (int i = 0; replies != NULL && i < c->n; i++)
        ferry_rpc_msg_deinit(&replies[i]);
    ferry_rpc_msg_deinit(&req);
    free(replies);
    free(servers);
    if (st == FERRY_OK && restarted != NULL)
        *restarted = changed;
    return st;
}

/* Hello to server i alone, after a call found its session gone (the server restarted
 * or the session expired): a new session for the calls that follow. */
static ferry_status rehello(ferry_cluster *c, int i) {
    Ferry__V1__HelloRequest q;
    hello_request(c, &q);
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    ferry_status st = ferry_rpc_msg_set_head(&req, &q.base);
    if (st == FERRY_OK)
        st = ferry_rpc_call(c->clients[i], FERRY_RPC_HELLO, &req, &reply, c->cfg.deadline_ms);
    int changed = 0;
    pthread_mutex_lock(&c->hello_mu);
    if (st == FERRY_OK)
        st = hello_apply(c, i, reply.head, &changed);
    pthread_mutex_unlock(&c->hello_mu);
    ferry_rpc_msg_deinit(&reply);
    ferry_rpc_msg_deinit(&req);
    if (st == FERRY_OK)
        FERRY_LOG_INFO("%s: a new session (the last one was gone)",
                       ferry_rpc_client_target(c->clients[i]));
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
        return FERRY_ERR_NOMEM;
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
            return FERRY_ERR_NOMEM;
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

/* Resolves host: FERRY_OK, or FERRY_ERR_UNAVAILABLE with the resolver's reason. */
static ferry_status resolve(const char *target, const char *host) {
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    int e = getaddrinfo(host, NULL, &hints, &ai);
    if (ai != NULL)
        freeaddrinfo(ai);
    if (e == 0)
        return FERRY_OK;
    return ferry_errorf(FERRY_ERR_UNAVAILABLE, "server '%s': cannot resolve host '%s' (%s)", target,
                        host, gai_strerror(e));
}

/* Says Hello until every server answers or connect_timeout_ms passes, telling apart
 * a host that does not resolve, a refused connection and a server that does not
 * answer. */
static ferry_status connect_all(ferry_cluster *c, char **list) {
    double t0 = ferry_now(), limit = c->cfg.connect_timeout_ms / 1000.0;
    char waiting[600] = "";
    ferry_status st;
    for (;;) {
        st = FERRY_OK;
        char host[256];
        for (int i = 0; i < c->n && st == FERRY_OK; i++) {
            if ((st = check_target(list[i], host, sizeof host)) == FERRY_OK && host[0] != '\0')
                st = resolve(list[i], host);
        }
        if (st == FERRY_OK) {
            ferry_cluster_set_wait_for_ready(c, 0); /* a refusal comes back at once */
            st = ferry_cluster_hello(c, NULL);
            ferry_cluster_set_wait_for_ready(c, c->cfg.wait_for_ready);
        }
        if (st != FERRY_ERR_UNAVAILABLE)
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
        if (ferry_now() - t0 >= limit)
            return ferry_errorf(st, "%s%s", what,
                                limit > 0 ? " (still, at the end of --connect-timeout)" : "");
        if (strcmp(waiting, what) != 0) {
            FERRY_LOG_WARN("waiting for the servers: %s; trying again for up to %.0f s", what,
                           limit - (ferry_now() - t0));
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

ferry_status ferry_ps_connect(const char *targets, const ferry_cluster_config *cfg,
                              ferry_cluster **out) {
    char **list = NULL;
    int n = 0;
    ferry_status st = parse_targets(targets, &list, &n);
    if (st != FERRY_OK)
        return st;
    ferry_cluster *c = calloc(1, sizeof *c);
    if (c == NULL) {
        st = FERRY_ERR_NOMEM;
        goto done;
    }
    pthread_mutex_init(&c->hello_mu, NULL);
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
    c->clients = calloc((size_t)n, sizeof *c->clients);
    c->incarnation = calloc((size_t)n, sizeof *c->incarnation);
    if (c->clients == NULL || c->incarnation == NULL) {
        st = FERRY_ERR_NOMEM;
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
    rc.tls_ca_pem = pem[0];
    rc.tls_cert_pem = pem[1];
    rc.tls_key_pem = pem[2];
    for (c->n = 0; st == FERRY_OK && c->n < n; c->n++) {
        if ((st = ferry_rpc_client_create(list[c->n], &rc, &c->clients[c->n])) != FERRY_OK)
            break;
    }
    for (int i = 0; i < 3; i++)
        ferry_secret_free(pem[i]);
    c->cfg.token = NULL; /* the rpc clients keep their own copies */
    c->cfg.tls_ca_file = c->cfg.tls_cert_file = c->cfg.tls_key_file = NULL;
    if (st != FERRY_OK)
        goto done;
    if ((st = connect_all(c, list)) != FERRY_OK)
        goto done;
    FERRY_LOG_DEBUG("connected to %d ferry-ps servers (%s)", n, targets);
    *out = c;
    c = NULL;
done:
    ferry_cluster_destroy(c);
    free_list(list, n);
    return st;
}

void ferry_cluster_destroy(ferry_cluster *c) {
    if (c == NULL)
        return;
    for (int i = 0; c->clients != NULL && i < c->n; i++)
        ferry_rpc_client_destroy(c->clients[i]);
    free(c->clients);
    free(c->incarnation);
    pthread_mutex_destroy(&c->hello_mu);
    free(c);
}

int ferry_cluster_size(const ferry_cluster *c) {
    return c->n;
}

void ferry_cluster_set_retry(ferry_cluster *c, int retry_ms) {
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
    return ferry_rpc_health_check(c->clients[server], c->cfg.deadline_ms, serving);
}

uint64_t ferry_cluster_retries(const ferry_cluster *c) {
    return atomic_load(&((ferry_cluster *)(uintptr_t)c)->retries);
}

void ferry_cluster_set_wait_for_ready(ferry_cluster *c, int on) {
    for (int i = 0; c != NULL && i < c->n; i++) {
        if (c->clients[i] != NULL)
            ferry_rpc_client_set_wait_for_ready(c->clients[i], on);
    }
}

const char *ferry_cluster_target(const ferry_cluster *c, int server) {
    return server >= 0 && server < c->n ? ferry_rpc_client_target(c->clients[server]) : "?";
}

uint64_t ferry_cluster_incarnation(const ferry_cluster *c, int server) {
    return server >= 0 && server < c->n ? c->incarnation[server] : 0;
}

void ferry_cluster_bytes(ferry_cluster *c, uint64_t *sent, uint64_t *received) {
    uint64_t s = 0, r = 0;
    for (int i = 0; i < c->n; i++) {
        uint64_t a, b;
        ferry_rpc_client_bytes(c->clients[i], &a, &b);
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
    ferry_status st = servers && replies ? ferry_rpc_msg_set_head(&req, head) : FERRY_ERR_NOMEM;
    for (int i = 0; servers != NULL && replies != NULL && i < n; i++) {
        servers[i] = server < 0 ? i : server;
        ferry_rpc_msg_init(&replies[i]);
    }
    if (st == FERRY_OK)
        st = fanout(c, method, n, servers, &req, 1, replies, c->cfg.deadline_ms, NULL, NULL,
                    retry_ok);
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
