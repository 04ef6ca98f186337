/* http.c - /metrics and /healthz over libmicrohttpd (see http.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>
#include <pthread.h>
#include <time.h>

#include "common/core/log.h"
#include "common/ops/http.h"

/* ---- Prometheus text ---------------------------------------------------------------- */

static void prom_put(ferry_prom *p, const char *s, size_t n) {
    if (p->failed)
        return;
    if (p->len + n + 1 > p->cap) {
        size_t cap = p->cap ? p->cap : 4096;
        while (cap < p->len + n + 1)
            cap *= 2;
        char *b = realloc(p->buf, cap);
        if (b == NULL) {
            p->failed = 1;
            return;
        }
        p->buf = b;
        p->cap = cap;
    }
    memcpy(p->buf + p->len, s, n);
    p->len += n;
    p->buf[p->len] = '\0';
}

FERRY_PRINTF(2, 3) static void prom_printf(ferry_prom *p, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n > 0)
        prom_put(p, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

void ferry_prom_family(ferry_prom *p, const char *name, const char *type, const char *help) {
    prom_printf(p, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void prom_label(ferry_prom *p, int *any, const char *k, const char *v) {
    prom_put(p, *any ? "," : "{", 1);
    *any = 1;
    prom_printf(p, "%s=\"", k);
    for (const char *c = v; *c != '\0'; c++) {
        if (*c == '\n')
            prom_put(p, "\\n", 2);
        else if (*c == '\\' || *c == '"') {
            prom_put(p, "\\", 1);
            prom_put(p, c, 1);
        } else
            prom_put(p, c, 1);
    }
    prom_put(p, "\"", 1);
}

/* {k="v",...[,ek="ev"]}, values escaped (backslash, quote, newline). */
static void prom_labels(ferry_prom *p, const char *const *labels, const char *ek, const char *ev) {
    int any = 0;
    for (int i = 0; labels != NULL && labels[i] != NULL; i += 2)
        prom_label(p, &any, labels[i], labels[i + 1]);
    if (ek != NULL)
        prom_label(p, &any, ek, ev);
    if (any)
        prom_put(p, "}", 1);
}

static void prom_value(ferry_prom *p, double v) {
    if (isnan(v))
        prom_put(p, " NaN\n", 5);
    else if (isinf(v))
        prom_put(p, v > 0 ? " +Inf\n" : " -Inf\n", 6);
    else
        prom_printf(p, " %.17g\n", v);
}

void ferry_prom_sample(ferry_prom *p, const char *name, const char *const *labels, double value) {
    prom_put(p, name, strlen(name));
    prom_labels(p, labels, NULL, NULL);
    prom_value(p, value);
}

void ferry_prom_histogram(ferry_prom *p, const char *name, const char *const *labels,
                          const double *bounds, const uint64_t *counts, int nbounds,
                          uint64_t overflow, double sum) {
    uint64_t cum = 0;
    char le[32];
    for (int i = 0; i <= nbounds; i++) {
        cum += i < nbounds ? counts[i] : overflow;
        if (i < nbounds)
            (void)snprintf(le, sizeof le, "%g", bounds[i]);
        else
            (void)snprintf(le, sizeof le, "+Inf");
        prom_printf(p, "%s_bucket", name);
        prom_labels(p, labels, "le", le);
        prom_value(p, (double)cum);
    }
    prom_printf(p, "%s_sum", name);
    prom_labels(p, labels, NULL, NULL);
    prom_value(p, sum);
    prom_printf(p, "%s_count", name);
    prom_labels(p, labels, NULL, NULL);
    prom_value(p, (double)cum);
}

int64_t ferry_process_rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == NULL)
        return 0;
    long long size = 0, rss = 0;
    int n = fscanf(f, "%lld %lld", &size, &rss);
    fclose(f);
    return n == 2 ? (int64_t)rss * sysconf(_SC_PAGESIZE) : 0;
}

/* ---- The server --------------------------------------------------------------------------- */

/* A connection open now, for the absolute request deadline. */
typedef struct http_conn {
    int fd;
    double since;
    struct http_conn *next, **prev;
} http_conn;

struct ferry_http {
    struct MHD_Daemon *d;
    ferry_http_metrics_fn metrics;
    ferry_http_health_fn health;
    void *user;
    int port;
    char *token; /* /metrics wants "Authorization: Bearer <it>"; NULL: open */
    double deadline_s;
    /* Open connections (mu), and the thread that ends those older than the deadline: a
     * client that trickles a byte at a time resets libmicrohttpd's idle timeout, not
     * this one. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    http_conn *conns;
    int stop;
    pthread_t reaper;
    int reaper_started;
    uint64_t ended; /* connections ended at the deadline */
};

/* Connection start and end (MHD_OPTION_NOTIFY_CONNECTION). */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    ferry_http *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        http_conn *c = calloc(1, sizeof *c);
        const union MHD_ConnectionInfo *info =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (c == NULL || info == NULL) {
            free(c);
            *socket_context = NULL;
            return;
        }
        c->fd = info->connect_fd;
        c->since = ferry_now();
        pthread_mutex_lock(&h->mu);
        c->next = h->conns;
        if (h->conns != NULL)
            h->conns->prev = &c->next;
        c->prev = &h->conns;
        h->conns = c;
        pthread_mutex_unlock(&h->mu);
        *socket_context = c;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context != NULL) {
        http_conn *c = *socket_context;
        pthread_mutex_lock(&h->mu);
        *c->prev = c->next;
        if (c->next != NULL)
            c->next->prev = c->prev;
        pthread_mutex_unlock(&h->mu);
        free(c);
        *socket_context = NULL;
    }
}

/* Every 250 ms: connections open longer than the deadline are shut down (libmicrohttpd
 * sees the end of the stream and closes them). */
static void *reaper_main(void *arg) {
    ferry_http *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 250000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        (void)pthread_cond_timedwait(&h->cv, &h->mu, &until);
        double now = ferry_now();
        for (http_conn *c = h->conns; c != NULL; c = c->next) {
            if (c->fd >= 0 && now - c->since > h->deadline_s) {
                (void)shutdown(c->fd, SHUT_RDWR);
                c->fd = -1; /* once */
                h->ended++;
            }
        }
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* The request's bearer token equals h->token (in time that depends on the lengths only). */
static int token_ok(const ferry_http *h, struct MHD_Connection *conn) {
    if (h->token == NULL)
        return 1;
    const char *a = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (a == NULL || strncmp(a, "Bearer ", 7) != 0)
        return 0;
    a += 7;
    size_t na = strlen(a), nb = strlen(h->token);
    unsigned char diff = (unsigned char)(na != nb);
    for (size_t i = 0; i < na; i++)
        diff |= (unsigned char)(a[i] ^ h->token[i % (nb ? nb : 1)]);
    return diff == 0;
}

static enum MHD_Result answer(struct MHD_Connection *conn, unsigned code, const char *type,
                              char *body, size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (r == NULL) {
        free(body);
        return MHD_NO;
    }
    (void)MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ok = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **state) {
    (void)version;
    (void)upload_data;
    ferry_http *h = cls;
    if (*state == NULL) { /* the headers are in: answer on the next call */
        *state = h;
        return MHD_YES;
    }
    if (*upload_size != 0) { /* no endpoint takes a body: drop it */
        *upload_size = 0;
        return MHD_YES;
    }
    const char *text = "text/plain; charset=utf-8";
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return answer(conn, MHD_HTTP_METHOD_NOT_ALLOWED, text, strdup("GET only\n"), 9);
    if (strcmp(url, "/metrics") == 0) {
        if (!token_ok(h, conn))
            return answer(conn, MHD_HTTP_UNAUTHORIZED, text,
                          strdup("/metrics wants Authorization: Bearer <the metrics token>\n"), 57);
        ferry_prom p = {0};
        h->metrics(h->user, &p);
        if (p.failed || p.buf == NULL) {
            free(p.buf);
            return answer(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, text, strdup("out of memory\n"),
                          14);
        }
        return answer(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", p.buf, p.len);
    }
    if (strcmp(url, "/healthz") == 0) {
        int ok = h->health == NULL || h->health(h->user);
        return ok ? answer(conn, MHD_HTTP_OK, text, strdup("ok\n"), 3)
                  : answer(conn, MHD_HTTP_SERVICE_UNAVAILABLE, text, strdup("not serving\n"), 12);
    }
    return answer(conn, MHD_HTTP_NOT_FOUND, text, strdup("not found: /metrics or /healthz\n"), 32);
}

/* libmicrohttpd's own complaints (a refused connection, a malformed request) go to
 * the daemon's log. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    (void)vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n > 0 && line[n - 1] == '\n')
        line[--n] = '\0';
    FERRY_LOG_DEBUG("http: %s", line);
}

ferry_status ferry_http_start(const char *listen, ferry_http_metrics_fn metrics,
                              ferry_http_health_fn health, void *user, ferry_http **out) {
    return ferry_http_start_ex(listen, metrics, health, user, NULL, out);
}

ferry_status ferry_http_start_ex(const char *listen, ferry_http_metrics_fn metrics,
                                 ferry_http_health_fn health, void *user,
                                 const ferry_http_options *opt, ferry_http **out) {
    static const ferry_http_options defaults;
    if (opt == NULL)
        opt = &defaults;
    const char *colon = listen != NULL ? strrchr(listen, ':') : NULL;
    if (colon == NULL || colon == listen || colon[1] == '\0')
        return ferry_errorf(FERRY_ERR_INVALID, "--metrics-listen '%s': want HOST:PORT",
                            listen != NULL ? listen : "");
    char host[256], *end;
    size_t hl = (size_t)(colon - listen);
    if (listen[0] == '[' && hl >= 2 && listen[hl - 1] == ']') { /* [v6]:port */
        listen++;
        hl -= 2;
    }
    if (hl >= sizeof host)
        return ferry_errorf(FERRY_ERR_INVALID, "--metrics-listen '%s': host too long", listen);
    memcpy(host, listen, hl);
    host[hl] = '\0';
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (*end != '\0' || errno != 0 || port < 0 || port > 65535)
        return ferry_errorf(FERRY_ERR_INVALID, "--metrics-listen: port '%s' is not in 0..65535",
                            colon + 1);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *ai = NULL;
    char ps[8];
    (void)snprintf(ps, sizeof ps, "%ld", port);
    int e = getaddrinfo(host, ps, &hints, &ai);
    if (e != 0)
        return ferry_errorf(FERRY_ERR_INVALID, "--metrics-listen: cannot resolve '%s': %s", host,
                            gai_strerror(e));
    ferry_http *h = calloc(1, sizeof *h);
    if (h == NULL) {
        freeaddrinfo(ai);
        return FERRY_NOMEM();
    }
    h->metrics = metrics;
    h->health = health;
    h->user = user;
    h->deadline_s = opt->request_deadline_s > 0.0 ? opt->request_deadline_s : 10.0;
    if (opt->token != NULL && (h->token = strdup(opt->token)) == NULL) {
        free(h);
        freeaddrinfo(ai);
        return FERRY_NOMEM();
    }
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    unsigned per_ip = opt->per_address_limit > 0 ? (unsigned)opt->per_address_limit : 16u;
    unsigned total = opt->connection_limit > 0 ? (unsigned)opt->connection_limit : 256u;
    unsigned flags = MHD_USE_AUTO | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR,
                            ai->ai_addr, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                            MHD_OPTION_CONNECTION_LIMIT, total, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            per_ip, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, h, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (h->d != NULL && pthread_create(&h->reaper, NULL, reaper_main, h) == 0)
        h->reaper_started = 1;
    else if (h->d != NULL) {
        MHD_stop_daemon(h->d);
        h->d = NULL;
    }
    if (h->d == NULL) {
        free(h->token);
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
        free(h);
        return ferry_errorf(FERRY_ERR_IO, "--metrics-listen %s:%ld: cannot listen (port in use, "
                                          "or not an address of this machine)",
                            host, port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info != NULL ? info->port : (int)port;
    *out = h;
    return FERRY_OK;
}

int ferry_http_port(const ferry_http *h) {
    return h->port;
}

void ferry_http_stop(ferry_http *h) {
    if (h == NULL)
        return;
    pthread_mutex_lock(&h->mu);
    h->stop = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    if (h->reaper_started)
        pthread_join(h->reaper, NULL);
    MHD_stop_daemon(h->d); /* closes the rest (their records go in on_connection) */
    if (h->token != NULL)
        explicit_bzero(h->token, strlen(h->token));
    free(h->token);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

uint64_t ferry_http_deadline_ended(ferry_http *h) {
    pthread_mutex_lock(&h->mu);
    uint64_t n = h->ended;
    pthread_mutex_unlock(&h->mu);
    return n;
}
