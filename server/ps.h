/* ps.h - the ferry-ps server as a library: a module registry, a table of
 * distributed-autograd contexts with leases, and the handlers of every ferry.v1.Ferry
 * method, served over common/rpc. main.c wraps it in a daemon; tests start it
 * in-process on 127.0.0.1:0.
 *
 *     ferry_ps_config cfg;
 *     ferry_ps_config_default(&cfg);
 *     cfg.listen = "127.0.0.1:0";
 *     ferry_ps_server *s;
 *     ferry_ps_server_create(&cfg, &s);           // bound and answering calls
 *     ferry_ps_server_start(s);                   // lease sweeper on its own thread
 *     ... ferry_ps_server_port(s) ...
 *     ferry_ps_server_destroy(s);                 // stops, drains, frees
 *
 * or, in a daemon, ferry_ps_server_run(s) on the main thread (signals included).
 *
 * What each module kind reads and writes is the wire contract: common/rpc/contract.h
 * (names, dtypes, ranks, modes; the client's builders and these checks both use it)
 * and proto/ferry.proto (the same in prose, with shapes, options, defaults and errors,
 * for clients in any language). */
#ifndef FERRY_PS_H
#define FERRY_PS_H

#include <stddef.h>
#include <stdint.h>

#include "common/rpc/rpc.h" /* ferry_rpc_identity */
#include "ferry/status.h"

typedef struct ferry_ps_config {
    const char *listen;         /* "127.0.0.1:7000"; port 0 binds an ephemeral port */
    int threads;                /* completion-queue threads running handlers (1..64) */
    int blas_threads;           /* OpenBLAS threads per GEMM (1..64; 0: 1, or
                                   OPENBLAS_NUM_THREADS when set) */
    double context_ttl_s;       /* a context idle this long is swept (> 0) */
    double session_ttl_s;       /* a session without a call this long, and without an open
                                   Session stream, ends (> 0) */
    int max_sessions;           /* live sessions, all identities (0: 4096) */
    int max_sessions_per_identity; /* live sessions of one identity (0: 1024) */
    int max_calls_per_identity;    /* calls of one identity running at once (0: its fair share
                                      of the threads while other identities have work) */
    size_t max_pending_reply_bytes; /* replies sent but not yet read by their clients, in
                                       all (0: 1 GiB; one connection: one reply) */
    double reply_timeout_s;         /* a reply unread this long is cancelled (0: 60) */
    size_t max_message_bytes;   /* both directions; 0: the rpc layer's default (256 MiB) */
    const char *checkpoint_dir; /* where Checkpoint writes when the request has no path;
                                   NULL: Checkpoint needs an explicit path */
    const char *server_id;      /* Hello's server_id; NULL: "ferry-ps@<listen>" */
    int shutdown_grace_ms;      /* in-flight calls get this long on SIGTERM or stop */
    int handle_signals;         /* run(): SIGINT/SIGTERM stop the server */
    const char *restore;        /* a checkpoint file to recreate the modules from, or NULL */
    /* Budgets: every allocation a request can cause is bounded by one of these and
     * refused with FERRY_ERR_RESOURCE (RESOURCE_EXHAUSTED) naming it. 0 takes the
     * default. Replies are bounded by max_message_bytes before they are built. */
    size_t max_module_bytes;   /* one module: weights + optimizer state (2 GiB) */
    size_t max_model_bytes;    /* all modules together (half the physical memory) */
    size_t max_context_bytes;  /* one context's saved inputs and gradients; also one
                                  call's scratch (1 GiB) */
    size_t max_contexts_bytes; /* every context together (a quarter of physical memory) */
    int max_contexts;          /* contexts alive at once (16384) */
    /* One identity's share (all its sessions together); 0 takes the default: */
    int max_contexts_per_identity;          /* contexts (half of max_contexts) */
    size_t max_contexts_bytes_per_identity; /* their memory (half of max_contexts_bytes) */
    int max_modules_per_identity;           /* modules (65536) */
    size_t max_model_bytes_per_identity;    /* their memory (all of max_model_bytes) */
    int max_jobs;                           /* jobs held, all identities (1024) */
    int max_jobs_per_identity;              /* jobs of one identity (64) */
    double job_ttl_s;          /* a finished or failed job, or one no live session holds a rank of,
                                  is freed this long after (0: 600) */
    int checkpoint_keep;       /* ferry-ps checkpoints kept in checkpoint_dir; older ones
                                  are deleted after each write (4) */
    int drain_ms;              /* on stop: health reports NOT_SERVING (and calls are still
                                  served) this long before new calls are refused (0) */
    int checkpoint_rate;       /* Checkpoint calls allowed per minute, in bursts of as many;
                                  more are refused with FERRY_ERR_BUSY (60) */
    /* Security (all NULL/0: plaintext, no tokens). identities: the token table (name,
     * role, token; copied): callers are the identity of their token, roles as in
     * proto/ferry.proto section 2. TLS: PEM text; with tls_ca_pem, clients need a
     * certificate it signed, and their identity is its subject. Modules and jobs
     * belong to identities, contexts and job ranks to sessions. */
    const ferry_rpc_identity *identities;
    int nidentities;
    const char *tls_cert_pem, *tls_key_pem, *tls_ca_pem;
} ferry_ps_config;

typedef struct ferry_ps_server ferry_ps_server;
struct ferry_prom;
/* Writes the Prometheus page of the server (server/metrics.c). Thread-safe. */
void ferry_ps_server_prometheus(ferry_ps_server *s, struct ferry_prom *p);
/* 1 while the server serves (not stopping): /healthz and grpc.health.v1. */
int ferry_ps_server_serving(ferry_ps_server *s);

/* Defaults: listen 127.0.0.1:7000, 2 threads, TTL 60 s, grace 5000 ms, no signals;
 * budgets 0 (their defaults, see above). */
void ferry_ps_config_default(ferry_ps_config *cfg);

/* Binds the address and starts answering calls on cfg->threads threads; logs
 * "listening on HOST:PORT". Contexts are swept only while run() or start() is
 * active (or by ferry_ps_server_sweep). Errors: FERRY_ERR_INVALID for a bad
 * config, FERRY_ERR_IO when the address cannot be bound, FERRY_ERR_NOMEM; *out is
 * unchanged then. */
ferry_status ferry_ps_server_create(const ferry_ps_config *cfg, ferry_ps_server **out);

/* The bound TCP port, and "HOST:PORT" with it (valid while the server lives). */
int ferry_ps_server_port(const ferry_ps_server *s);
const char *ferry_ps_server_address(const ferry_ps_server *s);

/* Runs the server's libuv loop on the calling thread: the lease sweep timer and,
 * with cfg.handle_signals, SIGINT/SIGTERM. Returns once the server has stopped
 * (a signal, a Shutdown call or ferry_ps_server_stop) and every in-flight call
 * has finished or been cancelled after the grace period. FERRY_ERR_BUSY if the
 * loop already runs, FERRY_ERR_IO if libuv fails to start. */
ferry_status ferry_ps_server_run(ferry_ps_server *s);

/* run() on a background thread (signals are never handled there). */
ferry_status ferry_ps_server_start(ferry_ps_server *s);

/* Asks the server to stop: no new calls, in-flight ones get grace_ms (< 0: the
 * configured grace). Idempotent, thread-safe, async-signal-unsafe. */
void ferry_ps_server_stop(ferry_ps_server *s, int grace_ms);

/* 1 once a stop was asked for (by any route). */
int ferry_ps_server_stopping(ferry_ps_server *s);

/* Frees every context idle longer than the TTL now; returns how many. */
int ferry_ps_server_sweep(ferry_ps_server *s);

/* Stops (if still running), joins the start() thread, drains the RPC server and
 * frees everything. NULL is a no-op. Must not be called from a handler. */
void ferry_ps_server_destroy(ferry_ps_server *s);

#endif /* FERRY_PS_H */
