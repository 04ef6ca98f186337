/* ferry-ctl - an operator's CLI for ferry-ps, over libferry's public API:
 *
 *   ferry-ctl --ps HOST:PORT[,...] health | stats | modules [PREFIX] | drop NAME |
 *                                  drop-job JOB | checkpoint [NAME] | shutdown | job JOB
 *   ferry-ctl --into DIR[,DIR...] reshard FILE...   (offline: reshard.c)
 *
 * with the same token and TLS flags as ferry-trainer (checkpoint and shutdown need the
 * admin token; modules, drop and drop-job act on the caller's identity's modules and
 * jobs, with the admin token on everyone's; health needs none: it is the standard
 * grpc.health.v1 Check, sent without Hello). Exit codes: 0 done (health: every server
 * SERVING), 1 a server refused, did not answer or is not SERVING, 2 bad command line. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/core/flags.h"
#include "common/core/log.h"
#include "common/core/secret.h"
#include "ferry/ferry.h"
#include "server/ctl/ctl.h"

static void print_metric(void *user, const char *name, double value) {
    const char *prefix = user;
    if (prefix != NULL && strncmp(name, prefix, strlen(prefix)) != 0)
        return;
    (void)printf("  %-40s %.17g\n", prefix != NULL ? name + strlen(prefix) : name, value);
}

/* One line per module: name, kind, shape, the shard's rows, size, version, owner. */
static void print_module(void *user, const ferry_module_info *m) {
    (void)user;
    (void)printf("  %-32s %-9s [%lld x %lld] rows %lld..%lld %10.1f MiB  version %llu%s%s\n",
                 m->name, m->kind, (long long)m->dims[0], (long long)m->dims[1],
                 (long long)m->row_begin, (long long)(m->row_begin + m->row_count),
                 (double)m->bytes / 1048576.0, (unsigned long long)m->version,
                 m->owner[0] != '\0' ? "  owner " : "", m->owner);
}

static int fail(const char *what) {
    ferry_log_fatal("%s: %s", what, ferry_error_last());
    return FERRY_EXIT_RUNTIME;
}

/* job JOB: where each server's copy of the job stands (its step, its newest
 * checkpoint, a roll-back under way), and with --replicas R which replica of each
 * shard the trainers take answers from: the first one at the shard's newest step (a
 * replica behind it was dropped; it is re-admitted at a checkpoint step). */
static int show_job(ferry_cluster *c, const char *name, int replicas) {
    int n = ferry_cluster_size(c), rc = 0;
    ferry_job_config jc = {.name = name, .world = 1, .rank = 0};
    ferry_job *job = NULL;
    if (ferry_job_create(c, &jc, &job) != FERRY_OK)
        return fail("job");
    ferry_job_probe_result *pr = calloc((size_t)n, sizeof *pr);
    int *ok = calloc((size_t)n, sizeof *ok);
    if (pr == NULL || ok == NULL) {
        free(pr);
        free(ok);
        ferry_job_destroy(job);
        return fail("job");
    }
    for (int s = 0; s < n; s++) {
        ok[s] = ferry_job_probe(job, s, &pr[s]) == FERRY_OK;
        if (!ok[s])
            rc = fail("job"); /* names the server */
    }
    for (int g = 0; g * replicas < n; g++) {
        uint64_t top = 0;
        int primary = -1;
        for (int s = g * replicas; s < (g + 1) * replicas && s < n; s++)
            top = ok[s] && pr[s].has_state && pr[s].state_step > top ? pr[s].state_step : top;
        if (replicas > 1)
            (void)printf("shard %d:\n", g);
        for (int s = g * replicas; s < (g + 1) * replicas && s < n; s++) {
            const char *role = "";
            if (replicas > 1 && ok[s] && pr[s].has_state && pr[s].state_step == top) {
                role = primary < 0 ? "  primary" : "  replica, in step";
                primary = primary < 0 ? s : primary;
            } else if (replicas > 1 && ok[s] && pr[s].has_state) {
                role = "  replica, behind: dropped until re-admitted at a checkpoint step";
            }
            if (!ok[s]) {
                (void)printf("  %-24s unreachable\n", ferry_cluster_target(c, s));
                continue;
            }
            char ck[48] = "none";
            if (pr[s].n > 0)
                (void)snprintf(ck, sizeof ck, "step %llu",
                               (unsigned long long)pr[s].steps[pr[s].n - 1]);
            if (pr[s].has_state)
                (void)printf("  %-24s at step %-8llu newest checkpoint %s%s%s\n",
                             ferry_cluster_target(c, s), (unsigned long long)pr[s].state_step, ck,
                             pr[s].rolling_back ? "  (rolling back)" : "", role);
            else
                (void)printf("  %-24s does not hold the job (newest checkpoint %s)\n",
                             ferry_cluster_target(c, s), ck);
            ferry_job_probe_free(&pr[s]);
        }
    }
    ferry_job_membership m;
    if (ferry_job_members(job, &m) == FERRY_OK && m.epoch > 0) { /* an elastic job */
        char text[256] = "";
        size_t k = 0;
        for (size_t i = 0; i < m.n && k + 16 < sizeof text; i++)
            k += (size_t)snprintf(text + k, sizeof text - k, "%s%u", i ? "," : "", m.members[i]);
        (void)printf("elastic: membership epoch %llu from step %llu: ranks %s (%zu members)\n",
                     (unsigned long long)m.epoch, (unsigned long long)m.first_step,
                     m.n > 0 ? text : "none", m.n);
        ferry__ctl_print_servers(c, name);
    }
    ferry_job_membership_free(&m);
    free(pr);
    free(ok);
    ferry_job_destroy(job);
    return rc;
}

/* How ferry-ctl connects: its flags' deadline, token and TLS files. */
static void ctl_config(ferry_cluster_config *cc, int deadline_ms, const char *token,
                       const char *tls_ca, const char *tls_cert, const char *tls_key) {
    ferry_cluster_config_default(cc);
    cc->deadline_ms = deadline_ms;
    cc->client_id = "ferry-ctl";
    cc->token = token;
    cc->tls_ca_file = tls_ca;
    cc->tls_cert_file = tls_cert;
    cc->tls_key_file = tls_key;
}

static int usage_error(const char *msg) {
    ferry_log_fatal("%s", msg);
    return FERRY_EXIT_USAGE;
}

int main(int argc, char **argv) {
    ferry_log_init("ferry-ctl");
    if (getenv("FERRY_LOG") == NULL)
        ferry_log_set_level(FERRY_LOG_LEVEL_WARN); /* a tool's output is its answer */
    const char *ps = NULL, *into = NULL, *to = NULL, *token_file = NULL, *tls_ca = NULL,
               *tls_cert = NULL, *tls_key = NULL;
    double timeout_s = 60.0;
    int deadline_ms = 5000, grace_ms = 5000, log_format = 0, replicas = 1;
    /* The command and its argument come after the flags. */
    int nflags = argc;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] != '-') {
            nflags = i;
            break;
        }
        const char *a = argv[i];
        if (strchr(a, '=') == NULL && strcmp(a, "--help") != 0 && strcmp(a, "-h") != 0 &&
            strcmp(a, "--version") != 0)
            i++; /* its value */
    }
    /* clang-format off */
    const ferry_flag flags[] = {
        {.name = "ps", .type = FERRY_FLAG_STRING, .ptr = &ps, .metavar = "HOST:PORT[,...]",
         .help = "the ferry-ps servers (every command but reshard)"},
        {.name = "into", .type = FERRY_FLAG_STRING, .ptr = &into, .metavar = "DIR[,DIR...]",
         .help = "reshard: the new servers' --checkpoint-dir, in their --ps order"},
        {.name = "to", .type = FERRY_FLAG_STRING, .ptr = &to, .metavar = "HOST:PORT[,...]",
         .help = "resize: the job's servers after the move (the first of --ps stays first)"},
        {.name = "timeout", .type = FERRY_FLAG_DOUBLE, .ptr = &timeout_s, .min = 1, .max = 3600,
         .defval = "60", .help = "resize: the longest wait for the job's next step boundary, "
                                 "for its members to join the new servers, and for each transfer"},
        {.name = "token-file", .type = FERRY_FLAG_STRING, .ptr = &token_file, .metavar = "FILE",
         .help = "bearer token (the admin token for checkpoint and shutdown)"},
        {.name = "tls-ca", .type = FERRY_FLAG_STRING, .ptr = &tls_ca, .metavar = "PEM",
         .help = "connect with TLS, verifying the servers against this CA"},
        {.name = "tls-cert", .type = FERRY_FLAG_STRING, .ptr = &tls_cert, .metavar = "PEM",
         .help = "mutual TLS: this client's certificate ..."},
        {.name = "tls-key", .type = FERRY_FLAG_STRING, .ptr = &tls_key, .metavar = "PEM",
         .help = "... and its key"},
        {.name = "deadline-ms", .type = FERRY_FLAG_INT, .ptr = &deadline_ms, .min = 1,
         .max = 3600000, .help = "deadline of every call"},
        {.name = "grace-ms", .type = FERRY_FLAG_INT, .ptr = &grace_ms, .min = 0, .max = 600000,
         .help = "shutdown: time the server's calls in flight get"},
        {.name = "replicas", .type = FERRY_FLAG_INT, .ptr = &replicas, .min = 1, .max = 16,
         .defval = "1",
         .help = "job: --ps lists each shard's R replicas side by side, as the trainers' --ps"},
        {.name = "log-format", .type = FERRY_FLAG_ENUM, .ptr = &log_format,
         .choices = "text|json", .help = "log lines, and the error line, as text or as JSON"},
    };
    /* clang-format on */
    /* clang-format off */
    static const char *const env[] = {
        "FERRY_TOKEN_FILE", "a file with the token (--token-file wins)",
        "FERRY_LOG", "error | warn | info | debug: the log level (default warn)",
        "FERRY_LOG_FORMAT", "json: log lines, and the error line, as JSON (--log-format wins)",
        NULL};
    /* clang-format on */
    ferry_flags fs = {.prog = "ferry-ctl",
                      .summary = "operates ferry-ps: ferry-ctl [flags] health | stats | "
                                 "modules [PREFIX] | drop NAME | drop-job JOB | "
                                 "checkpoint [NAME] | shutdown | job JOB\n"
                                 "       ferry-ctl --ps OLD --to NEW resize JOB (a running "
                                 "elastic job's servers move from OLD to NEW at its next step "
                                 "boundary: rows and optimizer state move, the trainers follow)\n"
                                 "       ferry-ctl --ps SERVERS drain JOB SERVER (resize to "
                                 "SERVERS less SERVER: its rows move to the others first)\n"
                                 "       ferry-ctl --into DIR[,DIR...] reshard FILE... (a "
                                 "job's server files of one step, in server order, cut for "
                                 "the servers whose --checkpoint-dir DIRs are; offline)\n"
                                 "(health is the grpc.health.v1 Check: no token needed)",
                      .flags = flags,
                      .nflags = (int)(sizeof flags / sizeof flags[0]),
                      .env = env,
                      .exit_status = "0 done (health: every server SERVING); 1 a server "
                                     "refused, did not answer or is not SERVING; 2 bad command "
                                     "line"};
    const char *lf = ferry_flags_peek(nflags, argv, "log-format");
    if (lf != NULL)
        ferry_log_set_json(strcmp(lf, "json") == 0); /* the error line below included */
    bool help = false;
    if (ferry_flags_parse(&fs, nflags, argv, &help) != FERRY_OK)
        return usage_error(ferry_error_last());
    if (help)
        return 0;
    const char *cmd = nflags < argc ? argv[nflags] : NULL;
    if (cmd != NULL && strcmp(cmd, "reshard") == 0)
        return ferry__ctl_reshard(into, argc - nflags - 1, argv + nflags + 1);
    if (ps == NULL)
        return usage_error("--ps HOST:PORT[,...] is required (see --help)");
    const char *arg = nflags + 1 < argc ? argv[nflags + 1] : NULL;
    const char *arg2 = nflags + 2 < argc ? argv[nflags + 2] : NULL;
    char drained[4096];
    if (cmd != NULL && strcmp(cmd, "drain") == 0) { /* resize to --ps less SERVER */
        if (to != NULL || arg == NULL || arg2 == NULL || nflags + 3 < argc)
            return usage_error("drain: ferry-ctl --ps SERVERS drain JOB SERVER");
        size_t k = 0, n = strlen(arg2);
        int found = 0, first = 1;
        drained[0] = '\0';
        for (const char *p = ps; *p != '\0';) {
            const char *e = strchr(p, ',');
            size_t len = e != NULL ? (size_t)(e - p) : strlen(p);
            if (len == n && strncmp(p, arg2, n) == 0 && !first) {
                found = 1;
            } else if (k + len + 2 < sizeof drained) {
                k += (size_t)snprintf(drained + k, sizeof drained - k, "%s%.*s", k ? "," : "",
                                      (int)len, p);
            } else {
                return usage_error("drain: --ps is too long");
            }
            first = 0;
            p = e != NULL ? e + 1 : p + len;
        }
        if (!found) {
            char why[600];
            (void)snprintf(why, sizeof why,
                           "drain: %.300s is not among --ps after its first server (the job's "
                           "coordinator stays)",
                           arg2);
            return usage_error(why);
        }
        to = drained;
    }
    int draining = cmd != NULL && strcmp(cmd, "drain") == 0;
    if (cmd != NULL && (draining || strcmp(cmd, "resize") == 0)) {
        if (to == NULL || arg == NULL || nflags + 2 + draining < argc)
            return usage_error("resize: ferry-ctl --ps OLD --to NEW resize JOB");
        char *token = NULL;
        if (ferry_token_read(token_file, "FERRY_TOKEN_FILE", &token) != FERRY_OK)
            return usage_error(ferry_error_last());
        ferry_cluster_config cc;
        ctl_config(&cc, deadline_ms, token, tls_ca, tls_cert, tls_key);
        int rc = ferry__ctl_resize(&cc, ps, to, arg, timeout_s);
        ferry_secret_free(token);
        return rc;
    }
    static const char *const cmds[] = {"health",   "stats", "modules",  "checkpoint",
                                       "shutdown", "drop",  "drop-job", "job"};
    int which = -1;
    for (int i = 0; cmd != NULL && i < 8; i++)
        which = strcmp(cmd, cmds[i]) == 0 ? i : which;
    if (which < 0 || (arg != NULL && which != 2 && which != 3 && which < 5) ||
        (arg == NULL && which >= 5) || nflags + 2 < argc)
        return usage_error("want one of health, stats, modules [PREFIX], drop NAME, drop-job JOB, "
                           "checkpoint [NAME], shutdown, job JOB (see --help)");
    char *token = NULL;
    if (which != 0 && ferry_token_read(token_file, "FERRY_TOKEN_FILE", &token) != FERRY_OK)
        return usage_error(ferry_error_last());
    ferry_cluster_config cc;
    ctl_config(&cc, deadline_ms, token, tls_ca, tls_cert, tls_key);
    ferry_cluster *c = NULL;
    /* Health sends the standard Check alone: no Hello, so no token. */
    ferry_status st = which == 0 ? ferry_ps_open(ps, &cc, &c) : ferry_ps_connect(ps, &cc, &c);
    ferry_secret_free(token);
    if (st != FERRY_OK)
        return fail("connect");
    int rc = 0;
    for (int s = 0; s < ferry_cluster_size(c) && which <= 2; s++) {
        const char *target = ferry_cluster_target(c, s);
        if (which == 0) {
            int serving = 0;
            if (ferry_cluster_health(c, s, &serving) != FERRY_OK) {
                rc = fail(cmd); /* the message names the server */
                continue;
            }
            (void)printf("%s %s\n", target, serving ? "SERVING" : "NOT_SERVING");
            rc |= !serving;
        } else {
            (void)printf("%s (incarnation %016llx)\n", target,
                         (unsigned long long)ferry_cluster_incarnation(c, s));
            if (which == 2 ? ferry_cluster_list_modules(c, s, arg, print_module, NULL) != FERRY_OK
                           : ferry_cluster_metrics(c, s, "", print_metric, NULL) != FERRY_OK)
                rc = fail(cmd);
        }
    }
    if (which == 3) {
        if ((st = ferry_cluster_checkpoint(c, arg, 0)) != FERRY_OK)
            rc = fail("checkpoint");
        else
            (void)printf("checkpoint written on %d servers\n", ferry_cluster_size(c));
    } else if (which == 7) {
        rc = show_job(c, arg, replicas);
    } else if (which >= 5) {
        int on = 0;
        if ((st = which == 5 ? ferry_cluster_delete_module(c, arg, &on)
                             : ferry_cluster_drop_job(c, arg, &on)) != FERRY_OK)
            rc = fail(cmd);
        else
            (void)printf("%s %s dropped on %d server%s\n", which == 5 ? "module" : "job", arg, on,
                         on == 1 ? "" : "s");
    } else if (which == 4) {
        if ((st = ferry_cluster_shutdown(c, -1, grace_ms)) != FERRY_OK)
            rc = fail("shutdown");
        else
            (void)printf("shutdown accepted by %d servers\n", ferry_cluster_size(c));
    }
    ferry_cluster_destroy(c);
    return rc;
}
