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
#include "server/cli.h"
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
    static ferry_ps_cli cli;
    ferry_ps_cli_init(&cli, &cfg);
    ferry_flags fs = {.prog = "ferry-ps",
                      .summary = "hosts model shards and their optimizers for ferry trainers",
                      .flags = cli.flags,
                      .nflags = cli.nflags,
                      .env = ferry_ps_env};
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
    ferry_log_set_level((ferry_log_level)cli.log_level);
    if (cli.log_format == 1)
        ferry_log_set_json(1);
    cfg.max_message_bytes = (size_t)cli.max_message_mb << 20;
    cfg.max_module_bytes = (size_t)cli.max_module_mb << 20;
    cfg.max_model_bytes = (size_t)cli.max_model_mb << 20;
    cfg.max_context_bytes = (size_t)cli.max_context_mb << 20;
    cfg.max_contexts_bytes = (size_t)cli.max_contexts_mb << 20;
    cfg.max_contexts_bytes_per_identity = (size_t)cli.id_contexts_mb << 20;
    cfg.max_model_bytes_per_identity = (size_t)cli.id_model_mb << 20;
    cfg.max_pending_reply_bytes = (size_t)cli.pending_reply_mb << 20;
    if (check_listen(cfg.listen) != FERRY_OK) {
        ferry_log_fatal("%s", ferry_error_last());
        return FERRY_EXIT_USAGE;
    }
    char *pem[3] = {NULL, NULL, NULL}, *admin = NULL;
    ferry_token_table tab;
    ferry_rpc_identity *ids = NULL;
    ferry_status st = security(&cfg, cli.token_file, cli.admin_token_file, cli.tls_cert,
                               cli.tls_key, cli.tls_ca, cli.insecure, pem, &tab, &admin, &ids);
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
    if (cli.port_file != NULL && write_port_file(cli.port_file, ferry_ps_server_port(s)) != 0) {
        ferry_log_fatal("cannot write --port-file %s", cli.port_file);
        ferry_ps_server_destroy(s);
        return FERRY_EXIT_RUNTIME;
    }
    ferry_http *http = NULL;
    if (cli.metrics_listen != NULL) {
        char *mtoken = NULL;
        ferry_http_options hopt = {0};
        st = metrics_security(cli.metrics_listen, cli.metrics_token_file, cli.insecure, &mtoken);
        if (st != FERRY_OK) {
            fprintf(stderr, "ferry-ps: %s\n", ferry_error_last());
            ferry_ps_server_destroy(s);
            return 2;
        }
        hopt.token = mtoken;
        st = ferry_http_start_ex(cli.metrics_listen, metrics_page, healthz, s, &hopt, &http);
        ferry_secret_free(mtoken); /* the HTTP side keeps its own copy */
        if (st != FERRY_OK) {
            ferry_log_fatal("%s", ferry_error_last());
            ferry_ps_server_destroy(s);
            return FERRY_EXIT_RUNTIME;
        }
        const char *colon = strrchr(cli.metrics_listen, ':');
        FERRY_LOG_INFO("metrics on http://%.*s:%d (/metrics, /healthz)",
                       (int)(colon - cli.metrics_listen), cli.metrics_listen,
                       ferry_http_port(http));
    }
    st = ferry_ps_server_run(s);
    ferry_http_stop(http);
    if (st != FERRY_OK)
        ferry_log_fatal("%s (%s)", ferry_status_str(st), ferry_error_last());
    ferry_ps_server_destroy(s);
    return st == FERRY_OK ? 0 : FERRY_EXIT_RUNTIME;
}
