/* report.c - what a run of ferry-trainer says: the training log line and its
 * metrics event (with the job's and the pipeline's figures), the parameters' summary,
 * and the /metrics page (--metrics-listen). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/core/log.h"
#include "common/ops/http.h"
#include "worker/trainer-impl.h"

void ferry__trainer_job_window(trainer *t) {
    uint64_t sent = 0, received = 0;
    if (t->cluster != NULL)
        ferry_cluster_bytes(t->cluster, &sent, &received);
    t->wire_last = sent + received;
    t->sync_s = 0.0;
    t->xfer_s = 0.0;
}

/* A job's line every log interval: the job's tokens/s (bsp: the global batch's),
 * where the slowest rank is (the servers' count of its steps) and how far ahead this
 * rank is, the bytes this rank moved per step, and the shares of the time it spent
 * pulling the job's dense block and pushing its gradient (the serial transfer a
 * one-trainer step does not have) and in GradNorm/Step (waiting for the others, and
 * the servers' update). */
static ferry_status log_job(trainer *t, int64_t nsteps, double tok_s, double elapsed) {
    uint64_t min_step = 0, sent, received;
    ferry_status st = ferry_job_min_step(t->job, &min_step);
    if (st != FERRY_OK) {
        (void)ferry__trainer_elastic_lost(t, st);
        return st;
    }
    ferry_cluster_bytes(t->cluster, &sent, &received);
    double wire = (double)(sent + received - t->wire_last) / (double)(nsteps ? nsteps : 1);
    double sync = elapsed > 0.0 ? t->sync_s / elapsed : 0.0;
    double xfer = elapsed > 0.0 ? t->xfer_s / elapsed : 0.0;
    ferry__trainer_job_window(t);
    int64_t lead = t->step - (int64_t)min_step;
    int rank = ferry_job_get_config(t->job)->rank; /* an elastic job's: picked at join */
    char members[48] = "";
    if (t->cfg->elastic_max > 0)
        (void)snprintf(members, sizeof members, " (epoch %llu, %d columns)",
                       (unsigned long long)t->el_epoch, t->c1 - t->c0);
    FERRY_LOG_INFO("job '%s' rank %d/%d%s: step %lld | job %.0f tok/s | slowest rank at step %llu "
                   "(lead %lld) | %.2f MB/step on the wire | %.0f%% in pull/push, %.0f%% in "
                   "GradNorm/Step",
                   t->cfg->job, rank, t->cfg->world, members, (long long)t->step, tok_s,
                   (unsigned long long)min_step, (long long)lead, wire / 1e6, 100.0 * xfer,
                   100.0 * sync);
    if (t->metrics == NULL)
        return FERRY_OK;
    const char *keys[] = {"step",
                          "rank",
                          "world",
                          "job_tokens_per_s",
                          "min_step",
                          "lead",
                          "wire_bytes_per_step",
                          "sync_fraction",
                          "pull_push_fraction"};
    double vals[] = {(double)t->step, rank, t->cfg->world, tok_s, (double)min_step,
                     (double)lead,    wire, sync,          xfer};
    return ferry_metrics_write_kv(t->metrics, "job", 9, keys, vals);
}

/* The pipeline's line every log interval: how busy each stage was (the trainer's LSTM,
 * the servers' decoder calls) and the bubble, the share of both stages' time idle. */
static ferry_status log_pipeline(trainer *t) {
    ferry_lm_pipe_stats ps;
    ferry_lm_pipe_take_stats(ferry_lm_pipeline(t->lm), &ps);
    if (ps.steps == 0 || !(ps.wall_s > 0.0))
        return FERRY_OK;
    double tb = ps.trainer_busy_s / ps.wall_s, sb = ps.servers_busy_s / ps.wall_s;
    double bubble = 1.0 - 0.5 * (tb + sb);
    (void)snprintf(t->pipe_note, sizeof t->pipe_note, "trainer %.0f%% ps %.0f%% bubble %.0f%%",
                   100.0 * tb, 100.0 * sb, 100.0 * bubble);
    FERRY_LOG_INFO("pipeline: step %lld | %d micro-batches | trainer busy %.0f%% | decoder calls "
                   "%.0f%% | bubble %.0f%% | %.1f ms/step",
                   (long long)t->step, ferry_lm_pipe_micro(ferry_lm_pipeline(t->lm)), 100.0 * tb,
                   100.0 * sb, 100.0 * bubble, 1e3 * ps.wall_s / (double)ps.steps);
    if (t->metrics == NULL)
        return FERRY_OK;
    const char *keys[] = {"step",         "micro_batches", "trainer_busy",
                          "servers_busy", "bubble",        "ms_per_step"};
    double vals[] = {(double)t->step,
                     ferry_lm_pipe_micro(ferry_lm_pipeline(t->lm)),
                     tb,
                     sb,
                     bubble,
                     1e3 * ps.wall_s / (double)ps.steps};
    return ferry_metrics_write_kv(t->metrics, "pipeline", 6, keys, vals);
}

ferry_status ferry__trainer_note_failover(trainer *t) {
    uint64_t n = ferry_cluster_replicas_dropped(t->cluster, NULL, 0);
    if (n == t->drops_seen)
        return FERRY_OK;
    t->drops_seen = n;
    int degraded = 0, shards = ferry_cluster_size(t->cluster);
    for (int s = 0; s < shards; s++) {
        int live, R = ferry_cluster_replicas(t->cluster, s, &live);
        degraded += live < R;
    }
    FERRY_LOG_INFO("step %lld: %llu replica%s dropped so far; %d of %d shards run degraded; no "
                   "roll-back",
                   (long long)t->step, (unsigned long long)n, n == 1 ? "" : "s", degraded, shards);
    if (t->metrics == NULL)
        return FERRY_OK;
    const char *keys[] = {"step", "dropped", "degraded_shards"};
    double vals[] = {(double)t->step, (double)n, degraded};
    return ferry_metrics_write_kv(t->metrics, "failover", 3, keys, vals);
}

ferry_status ferry__trainer_readmit(trainer *t) {
    double t0 = ferry_now();
    int back = 0;
    uint64_t bytes = 0, mask = t->readmit;
    t->readmit = 0;
    ferry_status st = ferry_job_readmit(t->job, mask, (uint64_t)t->step, &back, &bytes);
    if (st != FERRY_OK || t->metrics == NULL)
        return st;
    int offered = 0;
    for (uint64_t m = mask; m != 0; m &= m - 1)
        offered++;
    const char *keys[] = {"step", "offered", "readmitted", "bytes", "seconds"};
    double vals[] = {(double)t->step, offered, back, (double)bytes, ferry_now() - t0};
    return ferry_metrics_write_kv(t->metrics, "readmit", 5, keys, vals);
}

/* A metrics record (and, with a constraint, the penalty and per-layer feasibility)
 * every log interval. `loss` is the mean cross-entropy per token, without penalty. */
ferry_status ferry__trainer_log_train(trainer *t, int64_t nsteps, double loss, double tok_s,
                                      double elapsed) {
    ferry_status st = FERRY_OK;
    pthread_mutex_lock(&t->live_mu);
    t->live.step = t->step;
    t->live.epoch = t->epoch;
    t->live.loss = loss;
    t->live.tok_s = tok_s;
    t->live.lr = t->lr;
    t->live.t = ferry_now();
    pthread_mutex_unlock(&t->live_mu);
    if (t->metrics != NULL)
        st = ferry_metrics_train(t->metrics, t->epoch, t->step, loss, exp(loss), t->lr, tok_s,
                                 ferry_now() - t->t_start);
    if (st == FERRY_OK && t->job != NULL)
        st = log_job(t, nsteps, tok_s, elapsed);
    if (st == FERRY_OK && ferry_lm_pipeline(t->lm) != NULL)
        st = log_pipeline(t);
    if (st != FERRY_OK || t->cfg->stiefel <= 0.0f)
        return st;
    double feas[FERRY_LSTM_MAX_LAYERS], penalty = t->penalty_sum / (double)nsteps;
    t->penalty_sum = 0.0;
    if ((st = ferry_lm_feasibility(t->lm, feas)) != FERRY_OK)
        return st;
    char line[512];
    int n = snprintf(line, sizeof line, "stiefel: step %lld | ce %.4f | penalty %.3e | feasibility",
                     (long long)t->step, loss, penalty);
    const char *keys[2 + FERRY_LSTM_MAX_LAYERS];
    char names[FERRY_LSTM_MAX_LAYERS][32];
    double vals[2 + FERRY_LSTM_MAX_LAYERS] = {(double)t->step, penalty};
    keys[0] = "step";
    keys[1] = "penalty";
    for (int l = 0; l < ferry_lm_get_config(t->lm)->L; l++) {
        (void)snprintf(names[l], sizeof names[l], "feasibility_l%d", l);
        keys[2 + l] = names[l];
        vals[2 + l] = feas[l];
        if (n > 0 && (size_t)n < sizeof line)
            n += snprintf(line + n, sizeof line - (size_t)n, " l%d %.3e", l, feas[l]);
    }
    FERRY_LOG_INFO("%s", line);
    if (t->metrics != NULL)
        st = ferry_metrics_write_kv(t->metrics, "stiefel", 2 + ferry_lm_get_config(t->lm)->L, keys,
                                    vals);
    return st;
}

/* "N parameters", and for a distributed model where they are: the whole model's
 * count (embedding, every LSTM layer, decoder; exact, without the block's alignment
 * padding) whatever the placement, and the share in this trainer's own block. */
void ferry__trainer_describe_params(const trainer *t, char *buf, size_t cap) {
    const ferry_lm_config *m = ferry_lm_get_config(t->lm);
    int64_t total = m->V * m->E + m->V * m->H + m->V, here = 0;
    for (int l = 0; l < m->L; l++)
        total += 4 * m->H * ((l == 0 ? m->E : m->H) + m->H) + 8 * m->H;
    for (int i = 0; i < ferry_lm_params_const(t->lm)->count; i++)
        here += ferry_lm_params_const(t->lm)->items[i].numel;
    if (!ferry_lm_is_remote(t->lm))
        (void)snprintf(buf, cap, "%lld parameters", (long long)total);
    else if (t->job != NULL)
        (void)snprintf(buf, cap,
                       "%lld parameters, all on the servers (this rank computes with "
                       "a copy of %lld of them)",
                       (long long)total, (long long)here);
    else
        (void)snprintf(buf, cap,
                       "%lld parameters, %lld (%.0f%%) in this trainer and the rest on "
                       "the servers",
                       (long long)total, (long long)here, 100.0 * (double)here / (double)total);
}

/* The trainer's /metrics page (--metrics-listen). */
void ferry__trainer_metrics_page(void *user, ferry_prom *p) {
    trainer *t = user;
    pthread_mutex_lock(&t->live_mu);
    trainer_live live = t->live;
    pthread_mutex_unlock(&t->live_mu);
    ferry_prom_family(p, "ferry_build_info", "gauge", "ferry version of this daemon");
    const char *info[] = {"version", FERRY_VERSION, "daemon", "ferry-trainer", NULL};
    ferry_prom_sample(p, "ferry_build_info", info, 1);
    static const struct {
        const char *name, *help;
    } g[] = {{"ferry_trainer_step", "optimizer steps done"},
             {"ferry_trainer_epoch", "current epoch"},
             {"ferry_trainer_loss", "mean training loss of the last log interval (nats/token)"},
             {"ferry_trainer_tokens_per_second", "training throughput of the last log interval"},
             {"ferry_trainer_learning_rate", "current learning rate"},
             {"ferry_trainer_uptime_seconds", "seconds since the trainer started"}};
    double v[] = {(double)live.step, live.epoch, live.loss,
                  live.tok_s,        live.lr,    ferry_now() - t->t_start};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        ferry_prom_family(p, g[i].name, "gauge", g[i].help);
        ferry_prom_sample(p, g[i].name, NULL, v[i]);
    }
    ferry_prom_family(p, "process_resident_memory_bytes", "gauge", "resident memory");
    ferry_prom_sample(p, "process_resident_memory_bytes", NULL, (double)ferry_process_rss_bytes());
    if (t->cfg->elastic_max > 0) {
        ferry_prom_family(p, "ferry_trainer_elastic_epoch", "gauge",
                          "the elastic job's membership epoch this rank runs under");
        ferry_prom_sample(p, "ferry_trainer_elastic_epoch", NULL, (double)live.el_epoch);
        ferry_prom_family(p, "ferry_trainer_elastic_members", "gauge",
                          "members of the elastic job under that epoch");
        ferry_prom_sample(p, "ferry_trainer_elastic_members", NULL, (double)live.el_members);
        ferry_prom_family(p, "ferry_trainer_elastic_redos_total", "counter",
                          "steps redone because a member would not finish them");
        ferry_prom_sample(p, "ferry_trainer_elastic_redos_total", NULL, (double)live.el_redos);
        ferry_prom_family(p, "ferry_trainer_elastic_servers_moves_total", "counter",
                          "moves of the job's servers this rank followed (ferry-ctl resize)");
        ferry_prom_sample(p, "ferry_trainer_elastic_servers_moves_total", NULL,
                          (double)live.srv_epoch);
        ferry_prom_family(p, "ferry_trainer_elastic_servers", "gauge",
                          "the servers this rank runs on");
        ferry_prom_sample(p, "ferry_trainer_elastic_servers", NULL, (double)live.servers);
    }
    if (t->cluster == NULL)
        return;
    /* The servers stay as they are while the page reads them; during a move of the
     * job's servers (which may wait on a new server's Hello) this part is left out
     * rather than hold up the page. */
    if (pthread_mutex_trylock(&t->route_mu) != 0)
        return;
    ferry_prom_family(p, "ferry_trainer_retries_total", "counter",
                      "calls sent again after a stall or a lost connection");
    ferry_prom_sample(p, "ferry_trainer_retries_total", NULL,
                      (double)ferry_cluster_retries(t->cluster));
    ferry_prom_family(p, "ferry_trainer_replicas_dropped_total", "counter",
                      "replicas dropped: a call its siblings answered failed (--replicas)");
    ferry_prom_sample(p, "ferry_trainer_replicas_dropped_total", NULL,
                      (double)ferry_cluster_replicas_dropped(t->cluster, NULL, 0));
    ferry_prom_family(p, "ferry_trainer_shard_replicas_live", "gauge",
                      "replicas of each shard still called; the first one's answers count");
    for (int s = 0; s < ferry_cluster_size(t->cluster); s++) {
        int nlive;
        (void)ferry_cluster_replicas(t->cluster, s, &nlive);
        char shard[16];
        (void)snprintf(shard, sizeof shard, "%d", s);
        const char *l[] = {"shard", shard, "primary", ferry_cluster_target(t->cluster, s), NULL};
        ferry_prom_sample(p, "ferry_trainer_shard_replicas_live", l, nlive);
    }
    static const char *const methods[] = {"Forward", "Backward", "GradNorm", "Step"};
    ferry_prom_family(p, "ferry_trainer_call_latency_seconds", "histogram",
                      "calls to each ferry-ps, by method: sending to the fan-out's last answer");
    for (int s = 0; s < ferry_cluster_size(t->cluster); s++) {
        for (int m = 0; m < 4; m++) {
            ferry_call_stats cs;
            if (ferry_cluster_call_stats(t->cluster, s, methods[m], &cs) != FERRY_OK)
                continue;
            const char *l[] = {"server", ferry_cluster_target(t->cluster, s), "method", methods[m],
                               NULL};
            ferry_prom_histogram(p, "ferry_trainer_call_latency_seconds", l,
                                 ferry_call_latency_bounds, cs.buckets, FERRY_CALL_LATENCY_BUCKETS,
                                 cs.over, cs.sum_s);
        }
    }
    pthread_mutex_unlock(&t->route_mu);
}
