/* http.h - the daemons' HTTP side door, for what scrapes and probes speak HTTP:
 * GET /metrics (Prometheus text exposition format 0.0.4) and GET /healthz ("ok" or
 * 503), served by libmicrohttpd (Debian's libmicrohttpd-dev; no hand-written HTTP
 * parsing) on a thread of its own. Layer "ops": on core only, linked into ferry-ps
 * and ferry-trainer, not into libferry. */
#ifndef FERRY_OPS_HTTP_H
#define FERRY_OPS_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/status.h"

/* Prometheus text, built in a growing buffer. Names follow the exposition format
 * ([a-zA-Z_:][a-zA-Z0-9_:]*); label values are escaped here. */
typedef struct ferry_prom {
    char *buf;
    size_t len, cap;
    int failed; /* out of memory: the scrape gets a 500 */
} ferry_prom;

/* "# HELP name help" and "# TYPE name type" (type: counter, gauge, histogram). */
void ferry_prom_family(ferry_prom *p, const char *name, const char *type, const char *help);
/* One sample: name{k1="v1",...} value. labels: NULL or a NULL-terminated list of
 * key, value pairs. */
void ferry_prom_sample(ferry_prom *p, const char *name, const char *const *labels, double value);
/* A histogram's samples: name_bucket{...,le="b"} for each bound (cumulative counts
 * given per bucket, not cumulative), le="+Inf", name_sum, name_count. */
void ferry_prom_histogram(ferry_prom *p, const char *name, const char *const *labels,
                          const double *bounds, const uint64_t *counts, int nbounds,
                          uint64_t overflow, double sum);

typedef struct ferry_http ferry_http;
/* Fills *p with the /metrics page (called on the HTTP thread, concurrently with the
 * daemon's own threads). */
typedef void (*ferry_http_metrics_fn)(void *user, ferry_prom *p);
/* 1 when /healthz should answer 200 "ok", 0 for 503 "not serving". */
typedef int (*ferry_http_health_fn)(void *user);

/* How the side door defends itself. 0/NULL fields take the defaults. */
typedef struct ferry_http_options {
    const char *token;         /* /metrics wants "Authorization: Bearer <token>"; NULL: open
                                  (/healthz is always open) */
    int connection_limit;      /* connections at once (256) */
    int per_address_limit;     /* connections from one client address (16) */
    double request_deadline_s; /* a connection older than this is ended, however slowly
                                  it keeps sending (10 s) */
} ferry_http_options;

/* Serves on listen ("HOST:PORT", port 0: an ephemeral one). FERRY_ERR_INVALID for a
 * malformed address, FERRY_ERR_IO naming it when it cannot be bound. */
ferry_status ferry_http_start(const char *listen, ferry_http_metrics_fn metrics,
                              ferry_http_health_fn health, void *user, ferry_http **out);
ferry_status ferry_http_start_ex(const char *listen, ferry_http_metrics_fn metrics,
                                 ferry_http_health_fn health, void *user,
                                 const ferry_http_options *opt, ferry_http **out);
/* Connections ended so far at the request deadline. */
uint64_t ferry_http_deadline_ended(ferry_http *h);
int ferry_http_port(const ferry_http *h);
/* Stops serving and frees; NULL is fine. */
void ferry_http_stop(ferry_http *h);

/* The process's resident memory in bytes (from /proc/self/statm), 0 if unknown. */
int64_t ferry_process_rss_bytes(void);

#endif /* FERRY_OPS_HTTP_H */
