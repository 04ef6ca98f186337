/* main.c - ferry-ps: parses flags into a ferry_ps_config, then create, run (until
 * SIGINT, SIGTERM or a Shutdown call has drained the calls in flight), destroy.
 * Exit codes: 0 clean shutdown, 1 the server failed, 2 bad command line; the last
 * line says why (JSON with --log-format json). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FERRY_WITH_CUDA
#include "ferry/cuda.h"
#endif
#include "common/backend/cpu/cpu.h"
#include "common/rpc/rpc.h"
#include "common/core/flags.h"
#include "common/core/log.h"
#include "common/core/secret.h"
#include "common/ops/http.h"
#include "server/ps.h"

/* Writes the bound port for scripts that started the server on port 0. */
static int write_port_file(const char *path, int port) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return -1;
    FILE *f = fopen(tmp, "w");
    if (f == NULL)
        return -1;
    int ok = fprintf(f, "%d\n", port) > 0;
    ok = fclose(f) == 0 && ok;
    /* The rename makes the file appear complete or not at all. */
    return ok && rename(tmp, path) == 0 ? 0 : -1;
}

static void metrics_page(void *user, ferry_prom *p) {
    ferry_ps_server_prometheus(user, p);
}

static int healthz(void *user) {
    return ferry_ps_server_serving(user);
}

/* A --listen value gRPC would take: HOST:PORT with a port in 0..65535 (gRPC itself
 * wraps 99999 silently to another port), or unix:PATH. */
static ferry_status check_listen(const char *listen) {
    if (strncmp(listen, "unix:", 5) == 0)
        return FERRY_OK;
    const char *colon = strrchr(listen, ':');
    if (colon == NULL || colon == listen)
        return ferry_errorf(FERRY_ERR_INVALID, "--listen '%s': want HOST:PORT (e.g. 0.0.0.0:7000)",
                            listen);
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (colon[1] == '\0' || *end != '\0' || port < 0 || port > 65535)
        return ferry_errorf(FERRY_ERR_INVALID, "--listen '%s': port '%s' is not a number in 0..65535",
                            listen, colon + 1);
    return FERRY_OK;
}

/* Whether a --listen host is this machine only. */
static int loopback(const char *listen) {
    static const char *const local[] = {"127.", "localhost:", "[::1]:", "unix:", "ip6-localhost:"};
    for (size_t i = 0; i < sizeof local / sizeof local[0]; i++) {
        if (strncmp(listen, local[i], strlen(local[i])) == 0)
            return 1;
    }
    return 0;
}

/* The metrics bearer token (NULL: /metrics open), refusing an open /metrics on a
 * non-loopback address unless told --insecure. */
static ferry_status metrics_security(const char *listen, const char *token_file, bool insecure,
                                     char **token) {
    *token = NULL;
    if (token_file != NULL) {
        ferry_status st = ferry_token_read(token_file, NULL, token);
        if (st != FERRY_OK)
            return st;
    }
    if (*token == NULL && !loopback(listen) && !insecure)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "--metrics-listen %s is not loopback: give --metrics-token-file (or "
                            "--insecure on a network you trust)",
                            listen);
    return FERRY_OK;
}

/* The token files and TLS files into cfg (their buffers in pem, the table in ids and
 * tab), refusing a network address without TLS and a token unless told --insecure.
 * The token file is one token (identity "trainer") or a table of identities; the
 * admin token file one token (identity "admin"). */
static ferry_status security(ferry_ps_config *cfg, const char *token_file,
                             const char *admin_token_file, const char *tls_cert,
                             const char *tls_key, const char *tls_ca, bool insecure, char **pem,
                             ferry_token_table *tab, char **admin, ferry_rpc_identity **ids) {
    ferry_status st;
    if ((st = ferry_token_table_read(token_file, "FERRY_TOKEN_FILE", tab)) != FERRY_OK ||
        (st = ferry_token_read(admin_token_file, "FERRY_ADMIN_TOKEN_FILE", admin)) != FERRY_OK)
        return st;
    if ((tls_cert != NULL) != (tls_key != NULL))
        return ferry_errorf(FERRY_ERR_INVALID, "--tls-cert and --tls-key go together");
    if (tls_ca != NULL && tls_cert == NULL)
        return ferry_errorf(FERRY_ERR_INVALID, "--tls-ca needs --tls-cert and --tls-key");
    const char *files[3] = {tls_cert, tls_key, tls_ca};
    for (int i = 0; i < 3; i++) {
        if (files[i] != NULL && (st = ferry_file_read_text(files[i], 1 << 20, &pem[i])) != FERRY_OK)
            return st;
    }
    int n = tab->n + (*admin != NULL);
    if (n > 0 && (*ids = calloc((size_t)n, sizeof **ids)) == NULL)
        return FERRY_NOMEM();
    for (int i = 0; i < tab->n; i++) {
        (*ids)[i].name = tab->entries[i].name;
        (*ids)[i].token = tab->entries[i].token;
        if ((st = ferry_rpc_role_parse(tab->entries[i].role, &(*ids)[i].role)) != FERRY_OK)
            return st;
        if (*admin != NULL && strcmp(tab->entries[i].token, *admin) == 0)
            return ferry_errorf(FERRY_ERR_INVALID,
                                "the admin token is also in the token file "
                                "(identity '%s')",
                                tab->entries[i].name);
        if (*admin != NULL && strcmp(tab->entries[i].name, "admin") == 0)
            return ferry_errorf(FERRY_ERR_INVALID,
                                "the token file names an identity 'admin', the name of "
                                "--admin-token-file's token: rename it, or drop that flag");
    }
    if (*admin != NULL) {
        (*ids)[tab->n].name = "admin";
        (*ids)[tab->n].role = FERRY_RPC_ROLE_ADMIN;
        (*ids)[tab->n].token = *admin;
    }
    cfg->identities = *ids;
    cfg->nidentities = n;
    cfg->tls_cert_pem = pem[0];
    cfg->tls_key_pem = pem[1];
    cfg->tls_ca_pem = pem[2];
    int secured = pem[0] != NULL && n > 0;
    if (!loopback(cfg->listen) && !secured && !insecure)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "refusing to serve %s without TLS and a token: anyone who reaches it "
                            "could stop it or overwrite the model (give --tls-cert/--tls-key and "
                            "--token-file, or --insecure on a network you trust)",
                            cfg->listen);
    if (!loopback(cfg->listen) && !secured)
        FERRY_LOG_WARN("serving %s %s (--insecure)", cfg->listen,
                       pem[0] == NULL ? "in plaintext" : "without a token");
    return FERRY_OK;
}

int main(int argc, char **argv) {
    ferry_cpu_ensure_blas_kernels(argv);
#ifdef FERRY_WITH_CUDA
    ferry_cuda_register(); /* --device cuda[:N] */
#endif
    ferry_log_init("ferry-ps");
    /* Large RPC payloads: keep freed pages instead of faulting them in again. */
    (void)ferry_rpc_tune_malloc(0);
    ferry_ps_config cfg;
    ferry_ps_config_default(&cfg);
    cfg.max_sessions = 4096; /* the server's own defaults, shown by --help */
    cfg.max_sessions_per_identity = 1024;
    cfg.handle_signals = 1;
    int log_level = FERRY_LOG_LEVEL_INFO, max_message_mb = 256;
    int max_module_mb = 0, max_model_mb = 0, max_context_mb = 0, max_contexts_mb = 0;
    int id_contexts_mb = 0, id_model_mb = 0, pending_reply_mb = 0;
    const char *port_file = NULL;
    const char *token_file = NULL, *admin_token_file = NULL;
    const char *tls_cert = NULL, *tls_key = NULL, *tls_ca = NULL;
    bool insecure = false;
    const char *metrics_listen = NULL, *metrics_token_file = NULL;
    int log_format = 0;
    const ferry_flag flags[] = {
        {.name = "listen",
         .type = FERRY_FLAG_STRING,
         .ptr = &cfg.listen,
         .metavar = "HOST:PORT",
         .help = "address to serve on (port 0: an ephemeral port, see --port-file)"},
        {.name = "port-file",
         .type = FERRY_FLAG_STRING,
         .ptr = &port_file,
         .metavar = "FILE",
         .help = "write the bound port to FILE once listening"},
        {.name = "threads",
         .type = FERRY_FLAG_INT,
         .ptr = &cfg.threads,
         .min = 1,
         .max = 64,
         .help = "threads running calls"},
        {.name = "blas-threads",
         .type = FERRY_FLAG_INT,
         .ptr = &cfg.blas_threads,
         .min = 1,
         .max = 64,
         .defval = "1, or OPENBLAS_NUM_THREADS",
         .help = "OpenBLAS threads per GEMM (give more on a machine of its own)"},
        {.name = "context-ttl",
         .type = FERRY_FLAG_DOUBLE,
         .ptr = &cfg.context_ttl_s,
         .min = 0.001,
         .max = 1e7,
         .metavar = "SECONDS",
         .help = "free a context after this long without a call (its trainer died)"},
        {.name = "session-ttl",
         .type = FERRY_FLAG_DOUBLE,
         .ptr = &cfg.session_ttl_s,
         .min = 0.001,
         .max = 1e7,
         .metavar = "SECONDS",
         .help = "end a session this long after its last call unless its client holds a "
                 "Session stream; its contexts go, its job ranks can be taken over"},
        {.name = "max-sessions",
         .type = FERRY_FLAG_INT,
         .ptr = &cfg.max_sessions,
         .min = 1,
         .max = 1000000,
         .help = "live sessions, all identities"},
        {.name = "max-calls-per-identity",
         .type = FERRY_FLAG_INT,
         .ptr = &cfg.max_calls_per_identity,
         .min = 0,
         .max = 64,
         .help = "calls of one identity running at once (0: its fair share of --threads "
                 "while other identities have work; Hello, Stats and health never wait)"},
        {.name = "max-sessions-per-identity",
         .type = FERRY_FLAG_INT,
         .ptr = &cfg.max_sessions_per_identity,
         .min = 1,
         .max = 1000000,
         .help = "live sessions of one identity"},
        {.name = "max-message-mb",
         .type = FERRY_FLAG_INT,
         .ptr = &max_message_mb,
         .min = 1,
         .max = 2047,
         .help = "largest request or reply, in MiB"},
        {.name = "max-module-mb",
         .type = FERRY_FLAG_INT,
         .ptr = &max_module_mb,
         .min = 0,
         .max = 1 << 30,
         .help = "largest module (weights + optimizer state), in MiB (0: 2048)"},
        {.name = "max-model-mb",
         .type = FERRY_FLAG_INT,
         .ptr = &max_model_mb,
         .min = 0,
         .max = 1 << 30,
         .help = "all modules together, in MiB (0: half the physical memory)"},
        {.name = "max-context-mb",
         .type = FERRY_FLAG_INT,
         .ptr = &max_context_mb,
         .min = 0,
         .max = 1 << 30,
         .help = "one context's saved inputs and gradients, and one call's scratch, in MiB "
                 "(0: 1024)"},
        {.name = "max-contexts-mb",
         .type = FERRY_FLAG_INT,
         .ptr = &max_contexts_mb,
         .min = 0,
         .max = 1 << 30,
         .help = "all contexts together, in MiB (0: a quarter of the physical memory)"},
        {.name = "max-contexts",
         .type = FERRY_FLAG_INT,
         .ptr = &cfg.max_contexts,
         .min = 0,
         .max = 1 << 24,
         .help = "contexts alive at once (0: 16384)"},
        {.name = "max-contexts-per-identity",
         .type = FERRY_FLAG_INT,
         .ptr = &cfg.max_contexts_per_identity,
         .min = 0,
         .max = 1 << 24,
         .help = "live contexts of one identity, all its sessions (0: half of --max-contexts)"},
        {.name = "max-contexts-mb-per-identity",
         .type = FERRY_FLAG_INT,
         .ptr = &id_contexts_mb,
         .min = 0,
         .max = 1 << 30,
         .help = "their memory, in MiB (0: half of --max-contexts-mb)"},
        {.name = "max-modules-per-identity",
         .type = FERRY_FLAG_INT,
         .ptr = &cfg.max_modules_per_identity,
         .min = 0,
         .max = 1 << 24,
         .help = "modules one identity may create (0: 65536)"},
        {.name = "max-model-mb-per-identity",
         .type = FERRY_FLAG_INT,
         .ptr = &id_model_mb,
         .min = 0,
         .max = 1 << 30,
         .help = "their memory, in MiB (0: all of --max-model-mb)"},
        {.name = "max-jobs",
         .type = FERRY_FLAG_INT,
         .ptr = &cfg.max_jobs,
         .min = 0,
         .max = 1 << 20,
         .help = "jobs held, all identities (0: 1024)"},
        {.name = "max-jobs-per-identity",
         .type = FERRY_FLAG_INT,
         .ptr = &cfg.max_jobs_per_identity,
         .min = 0,
         .max = 1 << 20,
         .help = "jobs of one identity (0: 64)"},
        {.name = "max-pending-reply-mb",
         .type = FERRY_FLAG_INT,
         .ptr = &pending_reply_mb,
         .min = 0,
         .max = 1 << 30,
         .help = "replies sent but not yet read by their clients, in MiB (0: 1024; each "
                 "connection holds at most one --max-message-mb reply unread)"},
        {.name = "reply-timeout",
         .type = FERRY_FLAG_DOUBLE,
         .ptr = &cfg.reply_timeout_s,
         .min = 0.0,
         .max = 1e6,
         .metavar = "SECONDS",
         .help = "cancel a reply its client has not read after this long (0: 60)"},
        {.name = "job-ttl",
         .type = FERRY_FLAG_DOUBLE,
         .ptr = &cfg.job_ttl_s,
         .min = 0.0,
         .max = 1e7,
         .metavar = "SECONDS",
         .help = "free a job this long after it finished or failed, or after its last live "
                 "trainer went (0: 600)"},
        {.name = "checkpoint-keep",
         .type = FERRY_FLAG_INT,
         .ptr = &cfg.checkpoint_keep,
         .min = 0,
         .max = 1 << 20,
         .help = "checkpoints kept in --checkpoint-dir, older ones deleted (0: 4)"},
        {.name = "drain-ms",
         .type = FERRY_FLAG_INT,
         .ptr = &cfg.drain_ms,
         .min = 0,
         .max = 600000,
         .help = "on SIGTERM/Shutdown, report NOT_SERVING to health checks this long "
                 "before refusing new calls (for load balancers and probes)"},
        {.name = "checkpoint-rate",
         .type = FERRY_FLAG_INT,
         .ptr = &cfg.checkpoint_rate,
         .min = 0,
         .max = 1000000,
         .help = "Checkpoint calls allowed per minute, in bursts of as many (0: 60)"},
        {.name = "checkpoint-dir",
         .type = FERRY_FLAG_STRING,
         .ptr = &cfg.checkpoint_dir,
         .metavar = "DIR",
         .help = "where Checkpoint calls write (none: checkpoints refused)"},
        {.name = "restore",
         .type = FERRY_FLAG_STRING,
         .ptr = &cfg.restore,
         .metavar = "FILE",
         .help = "recreate the modules of this checkpoint before serving"},
        {.name = "server-id",
         .type = FERRY_FLAG_STRING,
         .ptr = &cfg.server_id,
         .help = "name reported by Hello (default ferry-ps@HOST:PORT)"},
        {.name = "shutdown-grace-ms",
         .type = FERRY_FLAG_INT,
         .ptr = &cfg.shutdown_grace_ms,
         .min = 0,
         .max = 600000,
         .help = "time calls in flight get on SIGINT/SIGTERM"},
        {.name = "token-file",
         .type = FERRY_FLAG_STRING,
         .ptr = &token_file,
         .metavar = "FILE",
         .help = "the callers: one token (identity 'trainer'), or a table, one "
                 "'<name> <role> <token>' per line, role reader | trainer | admin; calls carry "
                 "'authorization: Bearer <token>' (env FERRY_TOKEN_FILE)"},
        {.name = "admin-token-file",
         .type = FERRY_FLAG_STRING,
         .ptr = &admin_token_file,
         .metavar = "FILE",
         .help = "one admin token (identity 'admin'): also SetParams, Checkpoint, Shutdown, "
                 "and power over every identity's modules and jobs (env FERRY_ADMIN_TOKEN_FILE)"},
        {.name = "tls-cert",
         .type = FERRY_FLAG_STRING,
         .ptr = &tls_cert,
         .metavar = "PEM",
         .help = "serve TLS with this certificate (chain) ..."},
        {.name = "tls-key",
         .type = FERRY_FLAG_STRING,
         .ptr = &tls_key,
         .metavar = "PEM",
         .help = "... and this private key"},
        {.name = "tls-ca",
         .type = FERRY_FLAG_STRING,
         .ptr = &tls_ca,
         .metavar = "PEM",
         .help = "mutual TLS: clients must present a certificate this CA signed"},
        {.name = "metrics-listen",
         .type = FERRY_FLAG_STRING,
         .ptr = &metrics_listen,
         .metavar = "HOST:PORT",
         .help = "serve Prometheus /metrics and /healthz over HTTP here; a non-loopback "
                 "address needs --metrics-token-file or --insecure. At most 256 connections, "
                 "16 per client address, each ended 10 s after it opened"},
        {.name = "metrics-token-file",
         .type = FERRY_FLAG_STRING,
         .ptr = &metrics_token_file,
         .metavar = "FILE",
         .help = "/metrics wants 'Authorization: Bearer <token>' with this token (Prometheus: "
                 "authorization.credentials_file); /healthz stays open"},
        {.name = "insecure",
         .type = FERRY_FLAG_BOOL,
         .ptr = &insecure,
         .help = "allow a non-loopback --listen without TLS and a token, and a non-loopback "
                 "--metrics-listen without --metrics-token-file"},
        {.name = "log-level",
         .type = FERRY_FLAG_ENUM,
         .ptr = &log_level,
         .choices = "error|warn|info|debug",
         .help = "log verbosity"},
        {.name = "log-format",
         .type = FERRY_FLAG_ENUM,
         .ptr = &log_format,
         .choices = "text|json",
         .help = "log lines as text or as JSON objects"},
    };
    static const char *const env[] = {
        "FERRY_TOKEN_FILE", "a file with the trainer token (--token-file wins)",
        "FERRY_ADMIN_TOKEN_FILE", "a file with the admin token (--admin-token-file wins)",
        "FERRY_LOG", "error | warn | info | debug: the log level",
        "FERRY_LOG_FORMAT", "json: log lines as JSON (--log-format wins)",
        "FERRY_RPC_RECORD", "a directory: record the first requests of each method (fuzz seeds)",
        "OPENBLAS_CORETYPE", "OpenBLAS kernels to use (else ferry picks the strongest)",
        "OPENBLAS_NUM_THREADS", "OpenBLAS threads per GEMM when --blas-threads is not given",
        "FERRY_NO_REEXEC", "set: never re-execute to choose OpenBLAS kernels",
        "FERRY_RPC_SPIN_US", "microseconds a waiting call spins before it sleeps",
        NULL};
    ferry_flags fs = {.prog = "ferry-ps",
                      .summary = "hosts model shards and their optimizers for ferry trainers",
                      .flags = flags,
                      .nflags = (int)(sizeof flags / sizeof flags[0]),
                      .env = env};
    const char *lf = ferry_flags_peek(argc, argv, "log-format");
    if (lf != NULL)
        ferry_log_set_json(strcmp(lf, "json") == 0); /* a bad command line's line too */
    bool help = false;
    if (ferry_flags_parse(&fs, argc, argv, &help) != FERRY_OK) {
        ferry_log_fatal("%s", ferry_error_last());
        return FERRY_EXIT_USAGE;
    }
    if (help)
        return 0;
    ferry_log_set_level((ferry_log_level)log_level);
    if (log_format == 1)
        ferry_log_set_json(1);
    cfg.max_message_bytes = (size_t)max_message_mb << 20;
    cfg.max_module_bytes = (size_t)max_module_mb << 20;
    cfg.max_model_bytes = (size_t)max_model_mb << 20;
    cfg.max_context_bytes = (size_t)max_context_mb << 20;
    cfg.max_contexts_bytes = (size_t)max_contexts_mb << 20;
    cfg.max_contexts_bytes_per_identity = (size_t)id_contexts_mb << 20;
    cfg.max_model_bytes_per_identity = (size_t)id_model_mb << 20;
    cfg.max_pending_reply_bytes = (size_t)pending_reply_mb << 20;
    if (check_listen(cfg.listen) != FERRY_OK) {
        ferry_log_fatal("%s", ferry_error_last());
        return FERRY_EXIT_USAGE;
    }
    char *pem[3] = {NULL, NULL, NULL}, *admin = NULL;
    ferry_token_table tab;
    ferry_rpc_identity *ids = NULL;
    ferry_status st = security(&cfg, token_file, admin_token_file, tls_cert, tls_key, tls_ca,
                               insecure, pem, &tab, &admin, &ids);
    ferry_ps_server *s = NULL;
    int usage = st != FERRY_OK;
    if (st == FERRY_OK)
        st = ferry_ps_server_create(&cfg, &s);
    for (int i = 0; i < 3; i++)
        ferry_secret_free(pem[i]); /* the rpc layer keeps its own copies */
    ferry_token_table_free(&tab);
    ferry_secret_free(admin);
    free(ids);
    if (usage) {
        ferry_log_fatal("%s", ferry_error_last());
        return FERRY_EXIT_USAGE;
    }
    if (st != FERRY_OK) {
        ferry_log_fatal("%s", ferry_error_last()[0] ? ferry_error_last() : ferry_status_str(st));
        return FERRY_EXIT_RUNTIME;
    }
    if (port_file != NULL && write_port_file(port_file, ferry_ps_server_port(s)) != 0) {
        ferry_log_fatal("cannot write --port-file %s", port_file);
        ferry_ps_server_destroy(s);
        return FERRY_EXIT_RUNTIME;
    }
    ferry_http *http = NULL;
    if (metrics_listen != NULL) {
        char *mtoken = NULL;
        ferry_http_options hopt = {0};
        st = metrics_security(metrics_listen, metrics_token_file, insecure, &mtoken);
        if (st != FERRY_OK) {
            fprintf(stderr, "ferry-ps: %s\n", ferry_error_last());
            ferry_ps_server_destroy(s);
            return 2;
        }
        hopt.token = mtoken;
        st = ferry_http_start_ex(metrics_listen, metrics_page, healthz, s, &hopt, &http);
        ferry_secret_free(mtoken); /* the HTTP side keeps its own copy */
        if (st != FERRY_OK) {
            ferry_log_fatal("%s", ferry_error_last());
            ferry_ps_server_destroy(s);
            return FERRY_EXIT_RUNTIME;
        }
        const char *colon = strrchr(metrics_listen, ':');
        FERRY_LOG_INFO("metrics on http://%.*s:%d (/metrics, /healthz)",
                       (int)(colon - metrics_listen), metrics_listen, ferry_http_port(http));
    }
    st = ferry_ps_server_run(s);
    ferry_http_stop(http);
    if (st != FERRY_OK)
        ferry_log_fatal("%s (%s)", ferry_status_str(st), ferry_error_last());
    ferry_ps_server_destroy(s);
    return st == FERRY_OK ? 0 : FERRY_EXIT_RUNTIME;
}
