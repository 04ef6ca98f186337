/* metrics.c - ferry-ps's /metrics page (Prometheus text, served by common/ops/http.c
 * with --metrics-listen): calls by method and status, their latency, bytes in and
 * out, contexts and their memory, modules with their versions and bytes, steps
 * applied, retried calls answered again, job progress, process memory. Names are
 * prefixed ferry_ps_ (the server's own) or ferry_rpc_ (the transport's). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/core/log.h"
#include "ferry/version.h"
#include "common/ops/http.h"
#include "server/ps-impl.h"

static void gauge(ferry_prom *p, const char *name, const char *help, double v) {
    ferry_prom_family(p, name, "gauge", help);
    ferry_prom_sample(p, name, NULL, v);
}

static void counter(ferry_prom *p, const char *name, const char *help, double v) {
    ferry_prom_family(p, name, "counter", help);
    ferry_prom_sample(p, name, NULL, v);
}

/* Job metrics arrive as "job/<name>/<what>[/<rank>]": one gauge family per <what>. */
typedef struct job_line {
    char what[48], job[FERRY_RPC_NAME_MAX], rank[16];
    double value;
} job_line;

typedef struct job_lines {
    job_line *v;
    int n, cap;
} job_lines;

static void job_collect(void *user, const char *name, double value) {
    job_lines *jl = user;
    if (strncmp(name, "job/", 4) != 0)
        return;
    if (jl->n == jl->cap) {
        int cap = jl->cap ? 2 * jl->cap : 32;
        job_line *v = realloc(jl->v, (size_t)cap * sizeof *v);
        if (v == NULL)
            return;
        jl->v = v;
        jl->cap = cap;
    }
    job_line *l = &jl->v[jl->n];
    memset(l, 0, sizeof *l);
    const char *a = name + 4, *b = strchr(a, '/');
    if (b == NULL)
        return;
    (void)snprintf(l->job, sizeof l->job, "%.*s", (int)(b - a), a);
    const char *c = strchr(b + 1, '/');
    if (c != NULL) {
        (void)snprintf(l->what, sizeof l->what, "%.*s", (int)(c - b - 1), b + 1);
        (void)snprintf(l->rank, sizeof l->rank, "%s", c + 1);
    } else {
        (void)snprintf(l->what, sizeof l->what, "%s", b + 1);
    }
    for (char *q = l->what; *q != '\0'; q++) /* a metric name: [a-z0-9_] */
        if (!((*q >= 'a' && *q <= 'z') || (*q >= '0' && *q <= '9')))
            *q = '_';
    l->value = value;
    jl->n++;
}

void ferry__ps_prometheus(ferry__ps_state *s, ferry_prom *p) {
    ferry_rpc_server *rpc = atomic_load(&s->rpc);
    ferry_prom_family(p, "ferry_build_info", "gauge", "ferry version of this daemon");
    const char *info[] = {"version", FERRY_VERSION, "daemon", "ferry-ps", NULL};
    ferry_prom_sample(p, "ferry_build_info", info, 1);
    gauge(p, "ferry_ps_uptime_seconds", "seconds since ferry-ps started", ferry_now() - s->t_start);
    gauge(p, "process_resident_memory_bytes", "resident memory of the process",
          (double)ferry_process_rss_bytes());
    gauge(p, "ferry_ps_heap_in_use_bytes",
          "bytes the allocations hold (malloc's in-use bytes): a leak grows it, a burst that "
          "the allocator keeps does not",
          (double)ferry__ps_heap_bytes());
    counter(p, "ferry_ps_memory_trims_total",
            "times free memory went back to the system (only once no context was made for 2 s)",
            (double)atomic_load(&s->memory_trims));
    counter(p, "ferry_ps_wide_calls_total",
            "calls marked wide that found a worker idle and ran with two-thread GEMMs",
            (double)atomic_load(&s->wide_calls));
    counter(p, "ferry_ps_gemm_splits_total",
            "GEMMs whose rows ran on two threads (of the wide calls, those large enough)",
            (double)ferry_cpu_gemm_splits());
    if (rpc != NULL) {
        ferry_rpc_method_stats ms[FERRY_RPC_STATS_SLOTS];
        for (int m = 0; m < FERRY_RPC_STATS_SLOTS; m++)
            ferry_rpc_server_method_stats(rpc, m, &ms[m]);
        ferry_prom_family(p, "ferry_rpc_server_calls_total", "counter",
                          "calls answered, by method and gRPC status code");
        for (int m = 0; m < FERRY_RPC_STATS_SLOTS; m++) {
            for (int c = 0; c < FERRY_RPC_CODES; c++) {
                if (ms[m].calls[c] == 0 && c != 0)
                    continue;
                const char *l[] = {"method", ferry_rpc_stats_slot_name(m), "code",
                                   ferry_rpc_code_name(c), NULL};
                ferry_prom_sample(p, "ferry_rpc_server_calls_total", l, (double)ms[m].calls[c]);
            }
        }
        ferry_prom_family(p, "ferry_rpc_server_latency_seconds", "histogram",
                          "from a call's arrival to its answer, by method");
        for (int m = 0; m < FERRY_RPC_STATS_SLOTS; m++) {
            const char *l[] = {"method", ferry_rpc_stats_slot_name(m), NULL};
            ferry_prom_histogram(p, "ferry_rpc_server_latency_seconds", l, ferry_rpc_latency_bounds,
                                 ms[m].buckets, FERRY_RPC_LATENCY_BUCKETS, ms[m].over,
                                 ms[m].sum_s);
        }
        ferry_rpc_server_stats rs;
        ferry_rpc_server_get_stats(rpc, &rs);
        counter(p, "ferry_rpc_server_received_bytes_total", "request bytes received",
                (double)rs.bytes_in);
        counter(p, "ferry_rpc_server_sent_bytes_total", "reply bytes sent", (double)rs.bytes_out);
        gauge(p, "ferry_rpc_server_in_flight", "calls being served now", (double)rs.in_flight);
    }
    int64_t ctx_bytes = 0;
    int64_t ctx_live = ferry__ps_ctx_live(&s->ctxs, &ctx_bytes);
    gauge(p, "ferry_ps_contexts_live", "distributed-autograd contexts held", (double)ctx_live);
    gauge(p, "ferry_ps_context_bytes", "memory the live contexts hold", (double)ctx_bytes);
    ferry_prom_family(p, "ferry_ps_contexts_total", "counter", "contexts by how they ended");
    static const char *const ends[] = {"created", "stepped", "released", "swept"};
    double vals[] = {(double)atomic_load(&s->ctxs.created), (double)atomic_load(&s->ctxs.stepped),
                     (double)atomic_load(&s->ctxs.released), (double)atomic_load(&s->ctxs.swept)};
    for (int i = 0; i < 4; i++) {
        const char *l[] = {"event", ends[i], NULL};
        ferry_prom_sample(p, "ferry_ps_contexts_total", l, vals[i]);
    }
    counter(p, "ferry_ps_retries_answered_total",
            "retried Backward/Step calls answered from what the first one kept",
            (double)atomic_load(&s->ctxs.replayed));
    counter(p, "ferry_ps_backward_early_replies_total",
            "Backward calls answered before their weight gradient was formed",
            (double)atomic_load(&s->ctxs.early));
    counter(p, "ferry_ps_backward_overlapped_total",
            "Backward calls that ran while an earlier one's weight gradient still formed",
            (double)atomic_load(&s->ctxs.overlapped));
    int n = 0;
    ferry__ps_module **mods = ferry__ps_registry_list(&s->reg, &n);
    ferry_prom_family(p, "ferry_ps_module_version", "gauge",
                      "parameter version: +1 per Step or SetParams");
    double steps = 0;
    for (int i = 0; i < n; i++) {
        pthread_rwlock_rdlock(&mods[i]->lock);
        uint64_t v = mods[i]->version;
        pthread_rwlock_unlock(&mods[i]->lock);
        steps += (double)v;
        const char *l[] = {"module", mods[i]->name, "kind", ferry__ps_kind_name(mods[i]->kind), NULL};
        ferry_prom_sample(p, "ferry_ps_module_version", l, (double)v);
    }
    ferry_prom_family(p, "ferry_ps_module_bytes", "gauge", "weights and optimizer state");
    for (int i = 0; i < n; i++) {
        const char *l[] = {"module", mods[i]->name, "kind", ferry__ps_kind_name(mods[i]->kind), NULL};
        ferry_prom_sample(p, "ferry_ps_module_bytes", l, (double)mods[i]->bytes);
    }
    ferry__ps_registry_list_free(mods, n);
    counter(p, "ferry_ps_steps_applied_total", "optimizer steps applied, over all modules",
            steps);
    int64_t njobs, job_bytes;
    ferry__ps_jobs_totals(&s->jobs, &njobs, &job_bytes);
    ferry_prom_family(p, "ferry_ps_jobs", "gauge", "jobs held (--max-jobs)");
    ferry_prom_sample(p, "ferry_ps_jobs", NULL, (double)njobs);
    ferry_prom_family(p, "ferry_ps_job_bytes", "gauge", "memory the jobs hold");
    ferry_prom_sample(p, "ferry_ps_job_bytes", NULL, (double)job_bytes);
    /* The budgets in force, and the bounded queues of the RPC layer. */
    ferry_prom_family(p, "ferry_ps_budget", "gauge", "a budget in force (its flag: --help)");
    const struct {
        const char *name;
        int64_t v;
    } budgets[] = {{"module_bytes", s->lim.module_bytes},
                   {"model_bytes", s->lim.model_bytes},
                   {"context_bytes", s->lim.context_bytes},
                   {"contexts_bytes", s->lim.contexts_bytes},
                   {"contexts", s->lim.contexts},
                   {"contexts_per_identity", s->lim.id_contexts},
                   {"contexts_bytes_per_identity", s->lim.id_contexts_bytes},
                   {"modules_per_identity", s->lim.id_modules},
                   {"model_bytes_per_identity", s->lim.id_model_bytes},
                   {"jobs", s->lim.jobs},
                   {"jobs_per_identity", s->lim.id_jobs}};
    for (size_t i = 0; i < sizeof budgets / sizeof budgets[0]; i++) {
        const char *l[] = {"budget", budgets[i].name, NULL};
        ferry_prom_sample(p, "ferry_ps_budget", l, (double)budgets[i].v);
    }
    if (rpc != NULL) {
        ferry_rpc_pending_stats ps_;
        ferry_rpc_queue_stats qs;
        ferry_rpc_server_pending_stats(rpc, &ps_);
        ferry_rpc_server_queue_stats(rpc, &qs);
        gauge(p, "ferry_ps_unread_reply_bytes", "replies sent but not yet read by their clients",
              (double)ps_.bytes);
        gauge(p, "ferry_ps_unread_reply_budget_bytes", "--max-pending-reply-mb",
              (double)ps_.max_bytes);
        counter(p, "ferry_ps_replies_refused_unread_total",
                "replies refused: unread replies held their budget", (double)ps_.refused);
        counter(p, "ferry_ps_replies_cancelled_unread_total",
                "replies cancelled: not read within --reply-timeout", (double)ps_.cancelled);
        gauge(p, "ferry_ps_queue_waiting", "calls waiting for a worker", (double)qs.queued);
        gauge(p, "ferry_ps_queue_running", "calls running on the workers", (double)qs.running);
        counter(p, "ferry_ps_queue_refused_total", "calls refused: the work queue was full",
                (double)qs.refused);
        gauge(p, "ferry_ps_queue_wait_max_seconds", "the longest a call waited for a worker",
              qs.wait_max_s);
    }
    /* Each identity's account against its share of the budgets. */
    pthread_mutex_lock(&s->quotas.mu);
    static const char *const what[] = {"contexts", "context_bytes", "modules", "model_bytes",
                                       "jobs"};
    for (int w = 0; w < 5; w++) {
        char fam[64];
        (void)snprintf(fam, sizeof fam, "ferry_ps_identity_%s", what[w]);
        ferry_prom_family(p, fam, "gauge",
                          "held by one identity (its share: --max-*-per-identity)");
        for (int i = 0; i < s->quotas.n; i++) {
            const ferry__ps_quota *q = s->quotas.q[i];
            const atomic_llong *v[] = {&q->contexts, &q->context_bytes, &q->modules,
                                       &q->model_bytes, &q->jobs};
            const char *l[] = {"identity", q->identity, NULL};
            ferry_prom_sample(p, fam, l, (double)atomic_load(v[w]));
        }
    }
    pthread_mutex_unlock(&s->quotas.mu);
    job_lines jl = {0};
    ferry__ps_jobs_metrics(&s->jobs, NULL, job_collect, &jl);
    for (int i = 0; i < jl.n; i++) {
        int first = 1;
        for (int k = 0; k < i; k++)
            first &= strcmp(jl.v[k].what, jl.v[i].what) != 0;
        if (!first)
            continue;
        char name[96];
        (void)snprintf(name, sizeof name, "ferry_ps_job_%s", jl.v[i].what);
        ferry_prom_family(p, name, "gauge", "per job (and rank): Stats' job/<name>/... figures");
        for (int k = i; k < jl.n; k++) {
            if (strcmp(jl.v[k].what, jl.v[i].what) != 0)
                continue;
            const char *l[] = {"job", jl.v[k].job, jl.v[k].rank[0] ? "rank" : NULL,
                               jl.v[k].rank, NULL};
            ferry_prom_sample(p, name, l, jl.v[k].value);
        }
    }
    free(jl.v);
}
