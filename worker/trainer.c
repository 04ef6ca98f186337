/* trainer.c - the training loop of ferry-trainer: batches the corpus, runs BPTT
 * windows through the model on an autograd context, clips by the global norm,
 * steps the optimizer, evaluates at each epoch's end, adjusts the learning rate,
 * writes checkpoints, progress and metrics. */
#include <ifaddrs.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <unistd.h>
#include <signal.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/backend/cpu/cpu.h"
#include "worker/batch.h"
#include "worker/checkpoint.h"
#include "worker/corpus.h"
#include "common/core/log.h"
#include "worker/metrics.h"
#include "worker/model.h"
#include "ferry/optim.h"
#include "optim/schedule.h"
#include "worker/progress.h"
#include "worker/trainer.h"
#include "common/core/secret.h"
#include "common/ops/http.h"
#include "ferry/version.h"

/* The process's only globals: set from signal handlers, read between steps. */
static volatile sig_atomic_t stop_requested, checkpoint_requested;

void ferry_trainer_request_stop(void) {
    stop_requested = 1;
}

void ferry_trainer_request_checkpoint(void) {
    checkpoint_requested = 1;
}

int ferry_trainer_stop_requested(void) {
    return stop_requested != 0;
}

ferry_optim_config ferry_trainer_optim(const ferry_trainer_config *cfg) {
    ferry_optim_config oc = ferry_optim_defaults((ferry_optim_kind)cfg->optimizer);
    for (int i = 0; i < FERRY_OPTIM_FIELD_COUNT; i++) {
        if (ferry_optim_fields[i].is_int)
            ferry_optim_field_set(&oc, i, cfg->optim_switch[i] ? 1.0 : 0.0);
        else if (!isnan(cfg->optim[i])) /* at float precision, as the learning rate the
                                             trainer schedules and sends the shards is */
            ferry_optim_field_set(&oc, i, (double)(float)cfg->optim[i]);
    }
    return oc;
}

void ferry_trainer_config_default(ferry_trainer_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->data = "data/ptb";
    cfg->device = "cpu";
    cfg->decoder_mode = 1; /* sharded-softmax */
    cfg->emsize = 200;
    cfg->nhid = 200;
    cfg->nlayers = 2;
    cfg->dropout = 0.0f;
    cfg->init_scale = 0.1f;
    cfg->batch_size = 20;
    cfg->bptt = 20;
    cfg->eval_batch_size = 10;
    cfg->epochs = 13;
    cfg->optimizer = FERRY_OPTIM_SGD;
    for (int i = 0; i < FERRY_OPTIM_FIELD_COUNT; i++)
        cfg->optim[i] = NAN; /* the optimizer's default (lr 1.0 for SGD) */
    cfg->clip = 5.0f;
    cfg->loss_scale = FERRY_LOSS_SCALE_SUM_TIME;
    cfg->schedule = FERRY_LR_SCHEDULE_STEP;
    cfg->lr_decay = 0.5f;
    cfg->lr_decay_start = 4;
    cfg->lr_decay_every = 1;
    cfg->patience = 0;
    cfg->seed = 1;
    cfg->progress = 0;
    cfg->log_interval = 200;
    cfg->threads = 1;
    cfg->micro_batches = 1;
    cfg->deadline_ms = 10000;
    cfg->world = 1;
    cfg->rank = 0;
    cfg->job = "ferry";
    cfg->sync = NULL;
    cfg->sync_timeout_s = 60.0;
    cfg->membership = "default";
    cfg->checkpoint_every = 0;
    cfg->keep_checkpoints = 4;
    cfg->recovery_timeout_s = 300.0;
    cfg->connect_timeout_s = 30.0;
    cfg->resolve_timeout_s = 0.0;
    cfg->eval_batches = -1;
}

/* An environment variable as a non-negative int: 1 and *out set, 0 when unset,
 * -1 (with an error naming it) when it is not a number. */
static int env_int(const char *(*get)(const char *), const char *name, int *out) {
    const char *v = get(name);
    if (v == NULL || v[0] == '\0')
        return 0;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end != '\0' || x < 0 || x > 65536) {
        (void)ferry_errorf(FERRY_ERR_INVALID, "%s='%.32s' is not a number in [0, 65536]", name, v);
        return -1;
    }
    *out = (int)x;
    return 1;
}

ferry_status ferry_trainer_check_name(const char *flag, const char *name, const char *what) {
    size_t n = strlen(name);
    if (n == 0 || n > 48 ||
        strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") != n)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "%s '%.64s': 1..48 characters of [A-Za-z0-9_.-] (it prefixes the "
                            "%s's module names)",
                            flag, name, what);
    return FERRY_OK;
}

int ferry_trainer_is_job(const ferry_trainer_config *cfg) {
    return cfg->ps != NULL && (cfg->world > 1 || cfg->sync != NULL || cfg->checkpoint_every > 0 ||
                               cfg->save != NULL || cfg->load != NULL);
}

ferry_status ferry_trainer_membership(ferry_trainer_config *cfg, int world_flag, int rank_flag,
                                      const char *(*get)(const char *), char *why, size_t cap) {
    static const char *const world_vars[] = {"FERRY_WORLD", "SLURM_NTASKS"};
    static const char *const rank_vars[] = {"FERRY_RANK", "SLURM_PROCID", "JOB_COMPLETION_INDEX"};
    const char *wsrc = "--world", *rsrc = "--rank";
    int world = world_flag, rank = rank_flag, r = 0;
    if (world < 0) {
        wsrc = "default";
        world = 1;
        for (size_t i = 0; i < sizeof world_vars / sizeof *world_vars && r == 0; i++) {
            if ((r = env_int(get, world_vars[i], &world)) > 0)
                wsrc = world_vars[i];
        }
        if (r < 0)
            return FERRY_ERR_INVALID;
    }
    if (rank < 0) {
        rsrc = "default";
        rank = 0;
        r = 0;
        for (size_t i = 0; i < sizeof rank_vars / sizeof *rank_vars && r == 0; i++) {
            if ((r = env_int(get, rank_vars[i], &rank)) > 0)
                rsrc = rank_vars[i];
        }
        if (r < 0)
            return FERRY_ERR_INVALID;
    }
    if (world < 1)
        return ferry_errorf(FERRY_ERR_INVALID, "world %d (from %s) must be at least 1", world,
                            wsrc);
    if (rank >= world)
        return ferry_errorf(FERRY_ERR_INVALID, "rank %d (from %s) outside [0, %d) (world from %s)",
                            rank, rsrc, world, wsrc);
    cfg->world = world;
    cfg->rank = rank;
    const char *job = get("FERRY_JOB");
    if (job != NULL && job[0] != '\0' && strcmp(cfg->job, "ferry") == 0)
        cfg->job = job;
    (void)snprintf(why, cap, "rank %d from %s, world %d from %s", rank, rsrc, world, wsrc);
    cfg->membership = why;
    return FERRY_OK;
}

int ferry_trainer_config_preset(ferry_trainer_config *cfg, const char *name) {
    if (strcmp(name, "small") == 0) {
        cfg->emsize = cfg->nhid = 200;
        cfg->bptt = 20;
        cfg->dropout = 0.0f;
        cfg->init_scale = 0.1f;
        cfg->epochs = 13;
        cfg->lr_decay = 0.5f;
        cfg->lr_decay_start = 4;
        cfg->clip = 5.0f;
    } else if (strcmp(name, "medium") == 0) {
        cfg->emsize = cfg->nhid = 650;
        cfg->bptt = 35;
        cfg->dropout = 0.5f;
        cfg->init_scale = 0.05f;
        cfg->epochs = 39;
        cfg->lr_decay = 0.8f;
        cfg->lr_decay_start = 6;
        cfg->clip = 5.0f;
    } else if (strcmp(name, "large") == 0) {
        cfg->emsize = cfg->nhid = 1500;
        cfg->bptt = 35;
        cfg->dropout = 0.65f;
        cfg->init_scale = 0.04f;
        cfg->epochs = 55;
        cfg->lr_decay = 1.0f / 1.15f;
        cfg->lr_decay_start = 14;
        cfg->clip = 10.0f;
    } else {
        return 0;
    }
    cfg->nlayers = 2;
    cfg->batch_size = 20;
    return 1;
}

/* ---- state of one run ---- */

/* What /metrics shows, as of the last log line. */
typedef struct trainer_live {
    int64_t step;
    int epoch;
    double loss, tok_s, lr, t;
} trainer_live;

typedef struct trainer {
    const ferry_trainer_config *cfg;
    ferry_backend *be;
    ferry_corpus *corpus;
    ferry_batches *train, *valid, *test;
    ferry_lm *lm;
    ferry_optim *opt;
    ferry_ctx *ctx;
    ferry_cluster *cluster; /* distributed placement */
    ferry_dist_ctx *dc;
    ferry_job *job;          /* a data-parallel job */
    int c0, c1;              /* this rank's batch columns [c0, c1) */
    int32_t *in_buf, *tg_buf; /* (bptt, c1 - c0): its slice of a window */
    double sync_s;            /* time in the job's GradNorm/Step since the last log line */
    char pipe_note[64];       /* the pipeline's busy fractions, for the progress line */
    uint64_t wire_last;       /* bytes on the wire at the last log line */
    ferry_lr_schedule sched;
    ferry_metrics *metrics;
    ferry_progress *progress;
    int epoch;    /* current epoch, 1-based */
    int64_t step; /* optimizer steps done in total */
    int64_t win0; /* the window of `epoch` to start at (a resume) */
    int carried;  /* the carried state was restored: do not zero it at win0 */
    int recover;  /* a job that recovers from crashes (checkpoint_every > 0) */
    int64_t last_step; /* the run's last step: --max-steps, or every epoch's windows */
    int complete;      /* the job completed while this rank was down: nothing left to do */
    double op_t0;      /* when the server work under way began (a step with its checkpoint,
                          an evaluation); 0 between them: a recovery counts from there */
    ferry_http *http; /* --metrics-listen */
    pthread_mutex_t live_mu; /* guards live: what /metrics shows */
    trainer_live live;
    int ck_asked;     /* a checkpoint was requested after the last step */
    int64_t rec_step; /* the step of the last roll-back, and how many in a row */
    int rec_repeat;
    const char *ck_base; /* --save, else --load: the checkpoints a recovery looks at */
    float lr;
    double penalty_sum; /* summed over the steps since the last log line */
    double t_start;
} trainer;

static ferry_status make_batches(const ferry_trainer_config *cfg, const ferry_corpus *c,
                                 ferry_split s, int B, int64_t limit, ferry_batches **out) {
    int64_t n;
    const int32_t *ids = ferry_corpus_ids(c, s, &n);
    if (limit > 0 && limit < n)
        n = limit;
    if (n < 2 * (int64_t)B)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "%s split of %s has %lld tokens: too few for "
                            "batch size %d",
                            ferry_split_name(s), cfg->data, (long long)n, B);
    return ferry_batch_create(ids, n, B, out);
}

static void window_tensors(const ferry_window *w, ferry_tensor *in, ferry_tensor *tg) {
    ferry_backend *host = ferry_backend_cpu();
    ferry_shape s = ferry_shape_2d(w->T, w->B);
    *in = ferry_tensor_wrap(host, FERRY_DTYPE_I32, s, (void *)(uintptr_t)w->inputs);
    *tg = ferry_tensor_wrap(host, FERRY_DTYPE_I32, s, (void *)(uintptr_t)w->targets);
}

/* Perplexity of a split: exp(mean cross-entropy per token), no dropout, carried
 * state across windows from zero, as in the PTB literature; over the first
 * max_windows windows when max_windows > 0. */
static ferry_status evaluate(trainer *t, const ferry_batches *b, int64_t max_windows,
                             double *loss_out) {
    ferry_status st = ferry_lm_reset_state(t->lm, ferry_batch_size(b));
    if (st != FERRY_OK)
        return st;
    ferry_ctx_set_training(t->ctx, 0);
    double total = 0.0;
    int64_t tokens = 0, nsteps = ferry_batch_nstep(b), win = 0;
    for (int64_t start = 0; start < nsteps - 1 && (max_windows <= 0 || win < max_windows);
         start += t->cfg->bptt, win++) {
        ferry_window w;
        ferry_tensor in, tg, *loss;
        double sum = 0.0;
        if ((st = ferry_batch_window(b, start, t->cfg->bptt, &w)) != FERRY_OK)
            break;
        window_tensors(&w, &in, &tg);
        ferry_ctx_reset(t->ctx, 0);
        if ((st = ferry_lm_forward(t->lm, t->ctx, NULL, &in, &tg, 1.0f, &loss, &sum)) != FERRY_OK)
            break;
        total += sum;
        tokens += (int64_t)w.T * w.B;
    }
    ferry_ctx_set_training(t->ctx, 1);
    if (st == FERRY_OK)
        *loss_out = total / (double)(tokens ? tokens : 1);
    return st;
}

/* One optimizer step on one window; *loss_sum is the summed cross-entropy. */
/* A job rank's columns [c0, c1) of a window, copied into its own (T, c1 - c0). */
static ferry_window rank_window(trainer *t, const ferry_window *w) {
    ferry_window r = *w;
    int Br = t->c1 - t->c0;
    for (int i = 0; i < w->T; i++) {
        memcpy(t->in_buf + (size_t)i * Br, w->inputs + (size_t)i * w->B + t->c0,
               (size_t)Br * sizeof(int32_t));
        memcpy(t->tg_buf + (size_t)i * Br, w->targets + (size_t)i * w->B + t->c0,
               (size_t)Br * sizeof(int32_t));
    }
    r.B = Br;
    r.inputs = t->in_buf;
    r.targets = t->tg_buf;
    return r;
}

/* One optimizer step on one window; *loss_sum is the summed cross-entropy of
 * *tokens tokens: in a bsp job, of the whole job's step. */
static ferry_status train_step(trainer *t, const ferry_window *gw, double *loss_sum,
                               double *tokens, double *grad_norm) {
    const ferry_trainer_config *cfg = t->cfg;
    ferry_tensor in, tg;
    ferry_window w = t->job != NULL ? rank_window(t, gw) : *gw;
    window_tensors(&w, &in, &tg);
    /* The loss is scaled by the global batch, so a bsp job's summed gradient is the
     * gradient of one trainer's loss over the whole batch. */
    ferry_lm_step_args a = {
        .loss_scale = cfg->loss_scale == FERRY_LOSS_SCALE_MEAN ? 1.0f / (float)(gw->T * gw->B)
                                                               : 1.0f / (float)gw->B,
        .clip = cfg->clip,
        .lr = t->lr,
        .ctx_id = (uint64_t)t->step + 1,
        .seed = (uint64_t)cfg->seed * 1000003ull + (uint64_t)t->step,
        .job_step = (uint64_t)t->step + 1,
    };
    ferry_lm_step_result r;
    int asked = checkpoint_requested != 0;
    if (asked) {
        checkpoint_requested = 0;
        if (t->job != NULL) /* every rank learns of it in this step's answer */
            ferry_job_request_checkpoint(t->job);
        FERRY_LOG_INFO("checkpoint requested (SIGUSR1): after step %lld", (long long)t->step + 1);
    }
    ferry_status st = ferry_lm_train_step(t->lm, t->ctx, t->dc, t->opt, &in, &tg, &a, &r);
    if (st != FERRY_OK)
        return ferry_errorf(st, "step %lld: %s", (long long)t->step + 1, ferry_error_last());
    t->ck_asked = t->job != NULL ? r.checkpoint : asked;
    *loss_sum = r.job_loss_sum;
    *tokens = r.job_tokens;
    *grad_norm = r.grad_norm;
    t->sync_s += r.sync_s;
    t->penalty_sum += r.penalty;
    t->step++;
    return FERRY_OK;
}

/* A job's line every log interval: the job's tokens/s (bsp: the global batch's),
 * where the slowest rank is (the servers' count of its steps) and how far ahead this
 * rank is, the bytes this rank moved per step, and the share of the time it spent
 * in GradNorm/Step (waiting for the others, and the servers' update). */
static ferry_status log_job(trainer *t, int64_t nsteps, double tok_s, double elapsed) {
    uint64_t min_step = 0, sent, received;
    ferry_status st = ferry_job_min_step(t->job, &min_step);
    if (st != FERRY_OK)
        return st;
    ferry_cluster_bytes(t->cluster, &sent, &received);
    double wire = (double)(sent + received - t->wire_last) / (double)(nsteps ? nsteps : 1);
    double sync = elapsed > 0.0 ? t->sync_s / elapsed : 0.0;
    t->wire_last = sent + received;
    t->sync_s = 0.0;
    int64_t lead = t->step - (int64_t)min_step;
    FERRY_LOG_INFO("job '%s' rank %d/%d: step %lld | job %.0f tok/s | slowest rank at step %llu "
                   "(lead %lld) | %.2f MB/step on the wire | %.0f%% in GradNorm/Step",
                   t->cfg->job, t->cfg->rank, t->cfg->world, (long long)t->step,
                   tok_s, (unsigned long long)min_step, (long long)lead, wire / 1e6,
                   100.0 * sync);
    if (t->metrics == NULL)
        return FERRY_OK;
    const char *keys[] = {"step", "rank", "world", "job_tokens_per_s", "min_step", "lead",
                          "wire_bytes_per_step", "sync_fraction"};
    double vals[] = {(double)t->step, t->cfg->rank, t->cfg->world, tok_s, (double)min_step,
                     (double)lead, wire, sync};
    return ferry_metrics_write_kv(t->metrics, "job", 8, keys, vals);
}

/* The pipeline's line every log interval: how busy each stage was (the trainer's LSTM,
 * the servers' decoder calls) and the bubble, the share of both stages' time idle. */
static ferry_status log_pipeline(trainer *t) {
    ferry_lm_pipe_stats ps;
    ferry_lm_pipe_take_stats(t->lm->pipe, &ps);
    if (ps.steps == 0 || !(ps.wall_s > 0.0))
        return FERRY_OK;
    double tb = ps.trainer_busy_s / ps.wall_s, sb = ps.servers_busy_s / ps.wall_s;
    double bubble = 1.0 - 0.5 * (tb + sb);
    (void)snprintf(t->pipe_note, sizeof t->pipe_note, "trainer %.0f%% ps %.0f%% bubble %.0f%%",
                   100.0 * tb, 100.0 * sb, 100.0 * bubble);
    FERRY_LOG_INFO("pipeline: step %lld | %d micro-batches | trainer busy %.0f%% | decoder calls "
                   "%.0f%% | bubble %.0f%% | %.1f ms/step", (long long)t->step,
                   ferry_lm_pipe_micro(t->lm->pipe), 100.0 * tb, 100.0 * sb, 100.0 * bubble,
                   1e3 * ps.wall_s / (double)ps.steps);
    if (t->metrics == NULL)
        return FERRY_OK;
    const char *keys[] = {"step", "micro_batches", "trainer_busy", "servers_busy", "bubble",
                          "ms_per_step"};
    double vals[] = {(double)t->step, ferry_lm_pipe_micro(t->lm->pipe), tb, sb, bubble,
                     1e3 * ps.wall_s / (double)ps.steps};
    return ferry_metrics_write_kv(t->metrics, "pipeline", 6, keys, vals);
}

/* A metrics record (and, with a constraint, the penalty and per-layer feasibility)
 * every log interval. `loss` is the mean cross-entropy per token, without penalty. */
static ferry_status log_train(trainer *t, int64_t nsteps, double loss, double tok_s,
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
    if (st == FERRY_OK && t->lm->pipe != NULL)
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
    for (int l = 0; l < t->lm->cfg.L; l++) {
        (void)snprintf(names[l], sizeof names[l], "feasibility_l%d", l);
        keys[2 + l] = names[l];
        vals[2 + l] = feas[l];
        if (n > 0 && (size_t)n < sizeof line)
            n += snprintf(line + n, sizeof line - (size_t)n, " l%d %.3e", l, feas[l]);
    }
    FERRY_LOG_INFO("%s", line);
    if (t->metrics != NULL)
        st = ferry_metrics_write_kv(t->metrics, "stiefel", 2 + t->lm->cfg.L, keys, vals);
    return st;
}

/* One pass over the training split (or up to max_steps). */
static ferry_status save_checkpoint(trainer *t, int epoch, int64_t window);

static ferry_status train_epoch(trainer *t, int *stop, int64_t *windows_done) {
    const ferry_trainer_config *cfg = t->cfg;
    ferry_status st = t->carried ? FERRY_OK : ferry_lm_reset_state(t->lm, t->c1 - t->c0);
    t->carried = 0;
    if (st != FERRY_OK)
        return st;
    int64_t nwin = ferry_batch_nwindows(t->train, cfg->bptt), nsteps = ferry_batch_nstep(t->train);
    ferry_progress_config pc = {0};
    /* The bar's end: the epoch's last window, or the one --max-steps stops at (the
     * loop takes at least one step before it looks). */
    pc.first = t->win0 < nwin ? t->win0 : nwin;
    pc.steps = nwin;
    if (cfg->max_steps > 0) {
        int64_t left = cfg->max_steps - t->step, last = pc.first + (left > 1 ? left : 1);
        if (last < nwin)
            pc.steps = last;
    }
    pc.log_interval = cfg->log_interval;
    pc.mode = (ferry_progress_mode)cfg->progress;
    if ((st = ferry_progress_create(&pc, &t->progress)) != FERRY_OK)
        return st;
    double t0 = ferry_now(), t_win = t0, win_loss = 0.0, gn = 0.0;
    int64_t win_tokens = 0, tokens = 0, i = t->win0, win_steps = 0;
    t->win0 = 0;
    for (int64_t start = i * cfg->bptt; start < nsteps - 1 && st == FERRY_OK;
         start += cfg->bptt, i++) {
        ferry_window w;
        double sum = 0.0, ntok = 0.0;
        if (cfg->max_steps > 0 && t->step >= cfg->max_steps) { /* resumed at the run's end */
            *stop = 1;
            break;
        }
        if ((st = ferry_batch_window(t->train, start, cfg->bptt, &w)) != FERRY_OK)
            break;
        t->op_t0 = ferry_now();
        if ((st = train_step(t, &w, &sum, &ntok, &gn)) != FERRY_OK)
            break;
        win_loss += sum;
        win_tokens += (int64_t)ntok;
        win_steps++;
        tokens += (int64_t)ntok;
        double el = ferry_now() - t0;
        ferry_progress_stats ps = {t->epoch,
                                   i + 1,
                                   win_loss / (double)win_tokens,
                                   t->lr,
                                   (double)tokens / (el > 0 ? el : 1e-9),
                                   el,
                                   t->pipe_note[0] != '\0' ? t->pipe_note : NULL};
        ferry_progress_update(t->progress, &ps);
        int last =
            start + cfg->bptt >= nsteps - 1 || (cfg->max_steps > 0 && t->step >= cfg->max_steps);
        if ((i + 1) % cfg->log_interval == 0 || last) {
            st = log_train(t, win_steps, win_loss / (double)win_tokens, ps.tokens_per_s,
                           ferry_now() - t_win);
            t_win = ferry_now();
            win_loss = 0.0;
            win_tokens = 0;
            win_steps = 0;
        }
        int every = cfg->checkpoint_every > 0 && t->step % cfg->checkpoint_every == 0;
        if (st == FERRY_OK && t->ck_asked && cfg->save == NULL)
            FERRY_LOG_WARN("checkpoint requested, but there is nowhere to write it (--save)");
        if (st == FERRY_OK && (every || t->ck_asked)) {
            if (t->ck_asked && cfg->save != NULL)
                FERRY_LOG_INFO("checkpoint at step %lld (requested)", (long long)t->step);
            st = save_checkpoint(t, t->epoch, i + 1);
        }
        t->ck_asked = 0;
        if (st == FERRY_OK)
            t->op_t0 = 0.0; /* the step and its checkpoint are done */
        if ((cfg->max_steps > 0 && t->step >= cfg->max_steps) || stop_requested) {
            *stop = 1;
            i++;
            break;
        }
    }
    *windows_done = i;
    ferry_progress_finish(t->progress);
    ferry_progress_destroy(t->progress);
    t->progress = NULL;
    if (st == FERRY_OK)
        FERRY_LOG_INFO("epoch %d done: %lld steps, %.0f tokens/s, %.1f s", t->epoch, (long long)i,
                       (double)tokens / (ferry_now() - t0), ferry_now() - t0);
    return st;
}

/* Evaluates split b on cfg->eval_batches windows (< 0: all after a whole epoch, and
 * EVAL_BATCHES_SHORT when --max-steps ended the epoch early: `short_run`). */
#define EVAL_BATCHES_SHORT 10
static ferry_status eval_and_report(trainer *t, const char *split, const ferry_batches *b,
                                    int short_run, double *loss) {
    double t0 = ferry_now();
    if (t->op_t0 == 0.0)
        t->op_t0 = t0;
    int64_t all = ferry_batch_nwindows(b, t->cfg->bptt), max = t->cfg->eval_batches;
    if (max < 0)
        max = short_run ? EVAL_BATCHES_SHORT : 0;
    ferry_status st = ferry_lm_pull_dense(t->lm); /* the job's weights after the last step */
    if (st == FERRY_OK)
        st = evaluate(t, b, max, loss);
    if (st != FERRY_OK)
        return st;
    t->op_t0 = 0.0;
    char part[160] = "";
    if (max > 0 && max < all)
        (void)snprintf(part, sizeof part, ", on the first %lld of %lld windows: %s", (long long)max,
                       (long long)all,
                       t->cfg->eval_batches < 0 ? "--max-steps ended the epoch early, "
                                                  "--eval-batches 0 evaluates all"
                                                : "--eval-batches");
    FERRY_LOG_INFO("epoch %d %s: loss %.4f ppl %.2f (%.1f s%s)", t->epoch, split, *loss, exp(*loss),
                   ferry_now() - t0, part);
    if (t->metrics != NULL)
        st = ferry_metrics_eval(t->metrics, split, t->epoch, t->step, *loss, exp(*loss));
    return st;
}

/* Joins the data-parallel job: the model as this rank builds it goes to the servers,
 * which refuse a rank whose model differs from the job's; this rank's columns of the
 * global batch. */
/* --save with --ps makes the run a job: the embedding and decoder live on the
 * servers, so a checkpoint is the servers' files and this trainer's together. Said
 * once, and refused before any step when a server cannot write its part (a --load
 * would find nothing to restore). */
static ferry_status check_can_save(trainer *t) {
    const ferry_trainer_config *cfg = t->cfg;
    if (cfg->world == 1 && cfg->sync == NULL)
        FERRY_LOG_INFO("--save with --ps: this run is job '%s' of one rank; the LSTM's master "
                       "copy lives on the servers too (pulled and pushed every step), and each "
                       "checkpoint is every server's file in its --checkpoint-dir plus %s",
                       cfg->job, cfg->save);
    for (int i = 0; i < ferry_cluster_size(t->cluster); i++) {
        ferry_job_probe_result pr;
        ferry_status st = ferry_job_probe(t->job, i, &pr);
        int can = pr.can_checkpoint;
        ferry_job_probe_free(&pr);
        if (st != FERRY_OK)
            return st;
        if (!can)
            return ferry_errorf(FERRY_ERR_UNSUPPORTED,
                                "--save needs every ferry-ps to write its part of the "
                                "checkpoints, and %s has no --checkpoint-dir: start it with "
                                "--checkpoint-dir DIR (or train without --ps)",
                                ferry_cluster_target(t->cluster, i));
    }
    return FERRY_OK;
}

static ferry_status job_join(trainer *t, const ferry_lm_config *mc, const ferry_optim_config *oc,
                             int resume) {
    const ferry_trainer_config *cfg = t->cfg;
    ferry_job_config jc = {0};
    ferry_status st = ferry_sync_parse(cfg->sync != NULL ? cfg->sync : "bsp", &jc.sync,
                                       &jc.staleness);
    if (st != FERRY_OK)
        return st;
    if ((st = ferry_trainer_check_name("--job", cfg->job, "job")) != FERRY_OK)
        return st;
    if (!(cfg->sync_timeout_s > 0.0) || cfg->sync_timeout_s > 86400.0)
        return ferry_errorf(FERRY_ERR_INVALID, "--sync-timeout %g s outside (0, 86400]",
                            cfg->sync_timeout_s);
    t->c0 = (int)((int64_t)cfg->rank * cfg->batch_size / cfg->world);
    t->c1 = (int)((int64_t)(cfg->rank + 1) * cfg->batch_size / cfg->world);
    if (t->c1 <= t->c0)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "--batch-size %d gives rank %d of %d no column: the global batch "
                            "must be at least the world size",
                            cfg->batch_size, cfg->rank, cfg->world);
    size_t n = (size_t)cfg->bptt * (size_t)(t->c1 - t->c0);
    if ((t->in_buf = malloc(n * sizeof *t->in_buf)) == NULL ||
        (t->tg_buf = malloc(n * sizeof *t->tg_buf)) == NULL)
        return FERRY_NOMEM();
    char model[1024];
    (void)snprintf(model, sizeof model,
                   "vocab=%llx V=%lld E=%lld H=%lld L=%d batch=%d bptt=%d dropout=%g "
                   "init=%g stiefel=%g seed=%llu optimizer=%s lr=%g clip=%g loss=%s decoder=%s",
                   (unsigned long long)ferry_vocab_hash(ferry_corpus_vocab(t->corpus)),
                   (long long)mc->V, (long long)mc->E, (long long)mc->H, mc->L, cfg->batch_size,
                   cfg->bptt, (double)mc->dropout, (double)mc->init_scale,
                   (double)mc->stiefel_beta, (unsigned long long)mc->seed,
                   ferry_optim_kind_name(oc->kind), oc->lr, (double)cfg->clip,
                   cfg->loss_scale ? "sum-time" : "mean",
                   cfg->decoder_mode ? "sharded-softmax" : "logits");
    jc.name = cfg->job;
    jc.world = cfg->world;
    jc.rank = cfg->rank;
    jc.sync_timeout_ms = (int)(cfg->sync_timeout_s * 1000.0);
    jc.model = model;
    /* A resuming rank does not join: it recovers (the roll-back makes it a member). */
    if ((st = resume ? ferry_job_create(t->cluster, &jc, &t->job)
                     : ferry_job_join(t->cluster, &jc, &t->job)) != FERRY_OK)
        return st;
    ferry_job_set_last_step(t->job, (uint64_t)t->last_step);
    FERRY_LOG_INFO("job '%s': rank %d of %d (%s), --sync %s, batch columns [%d, %d) of %d",
                   cfg->job, cfg->rank, cfg->world, cfg->membership,
                   cfg->sync != NULL ? cfg->sync : "bsp", t->c0, t->c1, cfg->batch_size);
    return cfg->save != NULL && cfg->rank == 0 ? check_can_save(t) : FERRY_OK;
}

/* ---- BLAS threads beside servers on the same machine ---- */

/* 1 when the host of "HOST:PORT" (or "[v6]:PORT") is this machine: a loopback
 * address, or one of its interfaces' addresses. */
static int target_is_local(const char *target) {
    char host[256];
    const char *colon = strrchr(target, ':');
    size_t n = colon != NULL ? (size_t)(colon - target) : strlen(target);
    if (n >= 2 && target[0] == '[' && target[n - 1] == ']') {
        target++;
        n -= 2;
    }
    if (n == 0 || n >= sizeof host)
        return 0;
    memcpy(host, target, n);
    host[n] = '\0';
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return 0;
    struct ifaddrs *ifs = NULL;
    int local = 0;
    (void)getifaddrs(&ifs);
    for (struct addrinfo *a = res; a != NULL && !local; a = a->ai_next) {
        if (a->ai_family == AF_INET) {
            const struct sockaddr_in *in = (const void *)a->ai_addr;
            local = (ntohl(in->sin_addr.s_addr) >> 24) == 127;
        } else if (a->ai_family == AF_INET6) {
            const struct sockaddr_in6 *in = (const void *)a->ai_addr;
            local = IN6_IS_ADDR_LOOPBACK(&in->sin6_addr);
        }
        for (struct ifaddrs *i = ifs; i != NULL && !local; i = i->ifa_next) {
            if (i->ifa_addr == NULL || i->ifa_addr->sa_family != a->ai_family)
                continue;
            if (a->ai_family == AF_INET)
                local = ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr.s_addr ==
                        ((const struct sockaddr_in *)(const void *)a->ai_addr)->sin_addr.s_addr;
            else if (a->ai_family == AF_INET6)
                local = memcmp(&((const struct sockaddr_in6 *)(const void *)i->ifa_addr)->sin6_addr,
                               &((const struct sockaddr_in6 *)(const void *)a->ai_addr)->sin6_addr,
                               sizeof(struct in6_addr)) == 0;
        }
    }
    freeifaddrs(ifs);
    freeaddrinfo(res);
    return local;
}

static void blas_threads_fn(void *user, const char *name, double value) {
    if (strcmp(name, "blas_threads") == 0)
        *(double *)user = value;
}

/* The trainer's OpenBLAS threads: --threads, but never more than the cores the
 * ferry-ps processes on this machine leave free, so that trainer and servers, which
 * compute at the same time in a pipeline, never fight over a core (an OpenBLAS
 * thread spinning on a server's core slows both). Logs the choice. */
static void place_blas_threads(trainer *t) {
    const ferry_trainer_config *cfg = t->cfg;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int want = cfg->threads, servers = 0;
    double used = 0.0;
    for (int i = 0; t->cluster != NULL && i < ferry_cluster_size(t->cluster); i++) {
        if (!target_is_local(ferry_cluster_target(t->cluster, i)))
            continue;
        double n = 1.0; /* a server too old to say uses one */
        (void)ferry_cluster_metrics(t->cluster, i, "blas_threads", blas_threads_fn, &n);
        used += n;
        servers++;
    }
    int room = cores > 0 ? (int)cores - (int)used : want;
    int use = servers > 0 && want > room ? (room > 1 ? room : 1) : want;
    ferry_cpu_set_threads(use);
    if (use < want)
        FERRY_LOG_INFO("OpenBLAS: %s, %d thread%s (not the %d of --threads: %d ferry-ps on this "
                       "machine use%s %.0f of its %ld cores)", ferry_cpu_blas_kernels(), use,
                       use > 1 ? "s" : "", want, servers, servers == 1 ? "s" : "", used, cores);
    else
        FERRY_LOG_INFO("OpenBLAS: %s, %d thread%s", ferry_cpu_blas_kernels(), use,
                       use > 1 ? "s" : "");
}

static ferry_status recover(trainer *t, const char *why);
static void metrics_page(void *user, ferry_prom *p);
static ferry_status apply_progress(trainer *t, const ferry_ck_progress *pr);
static void describe_params(const trainer *t, char *buf, size_t cap);

/* libferry's connect errors name no flag; the trainer's add the flags that apply. */
static ferry_status connect_hint(ferry_status st) {
    const char *flags = st == FERRY_ERR_AUTH ? "--tls-ca, --tls-cert, --tls-key, --token-file"
                        : st == FERRY_ERR_NOT_FOUND   ? "--resolve-timeout to wait for the name"
                        : st == FERRY_ERR_UNAVAILABLE ? "--connect-timeout"
                                                      : NULL;
    if (flags == NULL)
        return st;
    char why[1024];
    (void)snprintf(why, sizeof why, "%s", ferry_error_last());
    return ferry_errorf(st, "%s [%s]", why, flags);
}

static ferry_status trainer_setup(trainer *t) {
    const ferry_trainer_config *cfg = t->cfg;
    ferry_status st;
    ferry_cpu_set_threads(cfg->threads);
    if ((st = ferry_backend_create(cfg->device, &t->be)) != FERRY_OK)
        return st;
    double t0 = ferry_now();
    if ((st = ferry_corpus_load(cfg->data, &t->corpus)) != FERRY_OK)
        return st;
    int64_t V = ferry_vocab_size(ferry_corpus_vocab(t->corpus));
    FERRY_LOG_INFO("corpus %s: vocabulary %lld, loaded in %.2f s", cfg->data, (long long)V,
                   ferry_now() - t0);
    if ((st = make_batches(cfg, t->corpus, FERRY_SPLIT_TRAIN, cfg->batch_size, cfg->train_tokens,
                           &t->train)) != FERRY_OK ||
        (st = make_batches(cfg, t->corpus, FERRY_SPLIT_VALID, cfg->eval_batch_size,
                           cfg->eval_tokens, &t->valid)) != FERRY_OK ||
        (st = make_batches(cfg, t->corpus, FERRY_SPLIT_TEST, cfg->eval_batch_size, cfg->eval_tokens,
                           &t->test)) != FERRY_OK)
        return st;
    /* Every window of every epoch is one step, unless --max-steps stops the run first. */
    int64_t total = (int64_t)cfg->epochs * ferry_batch_nwindows(t->train, cfg->bptt);
    t->last_step = cfg->max_steps > 0 && cfg->max_steps < total ? cfg->max_steps : total;
    ferry_lm_config mc = {V,
                          cfg->emsize,
                          cfg->nhid,
                          cfg->nlayers,
                          cfg->dropout,
                          cfg->init_scale,
                          cfg->stiefel,
                          (uint64_t)cfg->seed};
    ferry_optim_config oc = ferry_trainer_optim(cfg);
    t->lr = (float)oc.lr;
    ferry_lr_schedule_config sc = ferry_lr_schedule_defaults((ferry_lr_schedule_kind)cfg->schedule);
    sc.gamma = cfg->lr_decay;
    sc.start = cfg->lr_decay_start;
    sc.every = cfg->lr_decay_every;
    sc.patience = cfg->patience;
    if ((st = ferry_lr_schedule_init(&t->sched, &sc)) != FERRY_OK)
        return st;
    t->c0 = 0;
    t->c1 = cfg->batch_size;
    if (cfg->ps != NULL) {
        ferry_cluster_config cc;
        ferry_cluster_config_default(&cc);
        cc.deadline_ms = (int)cfg->deadline_ms;
        cc.wait_for_ready = 1; /* ride out daemons that are still starting */
        cc.connect_timeout_ms = (int)(cfg->connect_timeout_s * 1000.0);
        cc.resolve_timeout_ms = (int)(cfg->resolve_timeout_s * 1000.0);
        cc.worker_id = (uint16_t)cfg->rank; /* context ids carry the rank */
        char *token = NULL;
        if ((st = ferry_token_read(cfg->token_file, "FERRY_TOKEN_FILE", &token)) != FERRY_OK)
            return st;
        cc.token = token;
        cc.tls_ca_file = cfg->tls_ca;
        cc.tls_cert_file = cfg->tls_cert;
        cc.tls_key_file = cfg->tls_key;
        st = ferry_ps_connect(cfg->ps, &cc, &t->cluster);
        ferry_secret_free(token);
        if (st != FERRY_OK)
            return connect_hint(st);
        if ((st = ferry_dist_ctx_create(t->cluster, &t->dc)) != FERRY_OK)
            return st;
        /* A job: several ranks, a sync mode, or checkpoints (the job protocol is what
         * ties the servers' checkpoints to the trainers'). */
        int as_job = ferry_trainer_is_job(cfg);
        if (as_job && (st = job_join(t, &mc, &oc, cfg->load != NULL)) != FERRY_OK)
            return st;
        t->recover = as_job && cfg->checkpoint_every > 0;
        ferry_lm_placement pl = {.cluster = t->cluster,
                                 .decoder_mode = (ferry_decoder_mode)cfg->decoder_mode,
                                 .optim = oc,
                                 .job = t->job,
                                 .resume = t->job != NULL && cfg->load != NULL,
                                 .stages = cfg->stages,
                                 .local_vocab = cfg->local_vocab,
                                 .model = cfg->model,
                                 .fresh = !cfg->continue_run && cfg->load == NULL};
        st = ferry_lm_create_placed(t->be, &mc, &pl, &t->lm);
        if (st == FERRY_OK && cfg->continue_run &&
            ferry_remote_created(t->lm->emb_remote) < ferry_remote_shards(t->lm->emb_remote))
            FERRY_LOG_INFO("--continue: training from the parameters ferry-ps holds for '%s'",
                           ferry_remote_name(t->lm->emb_remote));
        FERRY_LOG_INFO("distributed: %d ferry-ps (%s), decoder %s", ferry_cluster_size(t->cluster),
                       cfg->ps, cfg->decoder_mode ? "sharded-softmax" : "logits");
        if (st == FERRY_OK && cfg->local_vocab > 0)
            FERRY_LOG_INFO("decoder: vocabulary rows %lld-%lld on the servers, %lld-%lld here "
                           "(--local-vocab %lld)",
                           0LL, (long long)(mc.V - cfg->local_vocab - 1),
                           (long long)(mc.V - cfg->local_vocab), (long long)(mc.V - 1),
                           (long long)cfg->local_vocab);
        if (st == FERRY_OK && (t->lm->ngroups > 1 || t->lm->groups[0].server >= 0)) {
            char line[512];
            int n = 0;
            for (int g = 0; g < t->lm->ngroups && n >= 0 && (size_t)n < sizeof line; g++) {
                const ferry_lm_group *G = &t->lm->groups[g];
                char layers[32];
                if (G->count == 1)
                    (void)snprintf(layers, sizeof layers, "layer %d", G->first);
                else
                    (void)snprintf(layers, sizeof layers, "layers %d-%d", G->first,
                                   G->first + G->count - 1);
                n += snprintf(line + n, sizeof line - (size_t)n, "%s%s %s", g ? ", " : "",
                              layers,
                              G->server < 0 ? "here"
                                            : ferry_cluster_target(t->cluster, G->server));
            }
            FERRY_LOG_INFO("stages: embedding and decoder on the servers, %s", line);
        }
    } else {
        st = ferry_lm_create(t->be, &mc, &t->lm);
    }
    if (st != FERRY_OK)
        return st;
    place_blas_threads(t);
    ferry_lm_set_grad_thread(t->lm, (ferry_lm_grad_thread)cfg->grad_thread);
    if (ferry_lm_uses_grad_thread(t->lm))
        FERRY_LOG_INFO("the LSTM's weight gradients form on a helper thread (--grad-thread %s)",
                       cfg->grad_thread == FERRY_LM_GRAD_THREAD_ON ? "on" : "auto");
    if (cfg->micro_batches > 1) {
        if (cfg->micro_batches > cfg->bptt)
            return ferry_errorf(FERRY_ERR_INVALID, "--micro-batches %d: a window has %d time "
                                "steps (--bptt), at most one micro-batch per step",
                                cfg->micro_batches, cfg->bptt);
        if ((st = ferry_lm_set_micro_batches(t->lm, cfg->micro_batches)) != FERRY_OK)
            return st;
        FERRY_LOG_INFO("pipeline: %d micro-batches of %d-%d time steps: the LSTM on one while "
                       "ferry-ps runs the decoder on another", cfg->micro_batches,
                       cfg->bptt / cfg->micro_batches,
                       (cfg->bptt + cfg->micro_batches - 1) / cfg->micro_batches);
    }
    if ((st = ferry_optim_create(&t->lm->P, &oc, &t->opt)) != FERRY_OK)
        return st;
    if ((st = ferry_ctx_create(t->be, &t->ctx)) != FERRY_OK)
        return st;
    if (cfg->metrics_out != NULL &&
        (st = ferry_metrics_open_mode(cfg->metrics_out, cfg->load != NULL, &t->metrics)) !=
            FERRY_OK)
        return st;
    if (cfg->metrics_listen != NULL) {
        if ((st = ferry_http_start(cfg->metrics_listen, metrics_page, NULL, t, &t->http)) !=
            FERRY_OK)
            return st;
        const char *colon = strrchr(cfg->metrics_listen, ':');
        FERRY_LOG_INFO("metrics on http://%.*s:%d (/metrics, /healthz)",
                       (int)(colon - cfg->metrics_listen), cfg->metrics_listen,
                       ferry_http_port(t->http));
    }
    t->epoch = 1;
    /* Temporary files of checkpoint writes a kill interrupted (this rank's only). */
    ferry_checkpoint_sweep_temps(cfg->save, t->job != NULL ? cfg->rank : -1);
    if (cfg->load != NULL && t->job != NULL) {
        /* The whole job goes back to the newest checkpoint every process has. */
        char why[1200];
        (void)snprintf(why, sizeof why, "resuming %s", cfg->load);
        if ((st = recover(t, why)) != FERRY_OK)
            return st;
    } else if (cfg->load != NULL) {
        char path[2048];
        int found = 0;
        ferry_ck_progress pr;
        if ((st = ferry_checkpoint_resolve(cfg->load, -1, path, sizeof path, &found)) != FERRY_OK)
            return st;
        if (!found)
            return ferry_errorf(FERRY_ERR_IO, "cannot open checkpoint %s: no such file, and no "
                                              "complete %s.<step>",
                                cfg->load, cfg->load);
        if ((st = ferry_checkpoint_load(path, t->lm, t->opt,
                                        ferry_vocab_hash(ferry_corpus_vocab(t->corpus)), &pr)) !=
                FERRY_OK ||
            (st = apply_progress(t, &pr)) != FERRY_OK)
            return st;
        FERRY_LOG_INFO("resumed from %s: epoch %d at window %lld, step %lld, lr %g", path,
                       t->epoch, (long long)t->win0, (long long)t->step, (double)t->lr);
    }
    if (cfg->load != NULL && t->metrics != NULL) {
        const char *keys[] = {"step", "epoch", "window"};
        double vals[] = {(double)t->step, t->epoch, (double)t->win0};
        if ((st = ferry_metrics_write_kv(t->metrics, "resume", 3, keys, vals)) != FERRY_OK)
            return st;
    }
    /* A recovering job starts with a checkpoint at step 0: a crash before the first
     * interval rolls back to the start. */
    if (cfg->load == NULL && t->recover && (st = save_checkpoint(t, 1, 0)) != FERRY_OK)
        return st;
    if (t->recover) {
        ferry_cluster_set_wait_for_ready(t->cluster, 0); /* a dead server fails at once */
        /* A call lost in a stall or a broken connection is sent again (the servers
         * apply it once); a restarted server refuses it, and the job rolls back. */
        ferry_cluster_set_retry(t->cluster, (int)(cfg->recovery_timeout_s * 1000.0));
    }
    char params[160];
    describe_params(t, params, sizeof params);
    FERRY_LOG_INFO("model: V=%lld E=%d H=%d L=%d, %s; %s lr %g, batch %d, bptt %d, clip %g, "
                   "loss %s, device %s",
                   (long long)V, cfg->emsize, cfg->nhid, cfg->nlayers, params,
                   ferry_optim_kind_name(oc.kind), (double)oc.lr, cfg->batch_size, cfg->bptt,
                   (double)cfg->clip, cfg->loss_scale ? "sum-time" : "mean",
                   ferry_backend_name(t->be));
    return FERRY_OK;
}

/* "N parameters", and for a distributed model where they are: the whole model's
 * count (embedding, every LSTM layer, decoder; exact, without the block's alignment
 * padding) whatever the placement, and the share in this trainer's own block. */
static void describe_params(const trainer *t, char *buf, size_t cap) {
    const ferry_lm_config *m = &t->lm->cfg;
    int64_t total = m->V * m->E + m->V * m->H + m->V, here = 0;
    for (int l = 0; l < m->L; l++)
        total += 4 * m->H * ((l == 0 ? m->E : m->H) + m->H) + 8 * m->H;
    for (int i = 0; i < t->lm->P.count; i++)
        here += t->lm->P.items[i].numel;
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
static void metrics_page(void *user, ferry_prom *p) {
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
    double v[] = {(double)live.step, live.epoch, live.loss, live.tok_s, live.lr,
                  ferry_now() - t->t_start};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        ferry_prom_family(p, g[i].name, "gauge", g[i].help);
        ferry_prom_sample(p, g[i].name, NULL, v[i]);
    }
    ferry_prom_family(p, "process_resident_memory_bytes", "gauge", "resident memory");
    ferry_prom_sample(p, "process_resident_memory_bytes", NULL, (double)ferry_process_rss_bytes());
    if (t->cluster == NULL)
        return;
    ferry_prom_family(p, "ferry_trainer_retries_total", "counter",
                      "calls sent again after a stall or a lost connection");
    ferry_prom_sample(p, "ferry_trainer_retries_total", NULL,
                      (double)ferry_cluster_retries(t->cluster));
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
}

/* Frees the run; ferry_error_last keeps the run's error (leaving the job or closing
 * files must not replace it). */
static void trainer_teardown(trainer *t, ferry_status run) {
    char err[1024];
    (void)snprintf(err, sizeof err, "%s", ferry_error_last());
    ferry_http_stop(t->http); /* before what its page reads */
    t->http = NULL;
    ferry_progress_destroy(t->progress);
    if (t->metrics != NULL && ferry_metrics_close(t->metrics) != FERRY_OK)
        FERRY_LOG_WARN("metrics: %s", ferry_error_last());
    ferry_ctx_destroy(t->ctx);
    ferry_optim_destroy(t->opt);
    ferry_lm_destroy(t->lm);
    /* After a peer failed, no cleanup call waits on it (the servers sweep). */
    int peer_failed = run == FERRY_ERR_UNAVAILABLE || run == FERRY_ERR_TIMEOUT ||
                      run == FERRY_ERR_RPC || run == FERRY_ERR_BUSY;
    if (peer_failed) {
        ferry_dist_ctx_abandon(t->dc);
        ferry_cluster_set_wait_for_ready(t->cluster, 0);
    }
    ferry_dist_ctx_destroy(t->dc);
    /* The others learn at once that this rank is done, and why when it stops early:
     * their waits for it end with that reason instead of at --sync-timeout. */
    if (t->job != NULL && !t->complete) {
        char reason[256] = "";
        if (run != FERRY_OK)
            (void)snprintf(reason, sizeof reason, "%.255s",
                           err[0] != '\0' ? err : ferry_status_str(run));
        else if (stop_requested)
            (void)snprintf(reason, sizeof reason, "stopped by a signal after step %lld",
                           (long long)t->step);
        if (ferry_job_leave_after(t->job, (uint64_t)t->step, reason) != FERRY_OK) {
            if (run == FERRY_OK)
                FERRY_LOG_WARN("leaving job '%s': %s", t->cfg->job, ferry_error_last());
            else
                FERRY_LOG_INFO("leaving job '%s': %s", t->cfg->job, ferry_error_last());
        }
    }
    ferry_job_destroy(t->job);
    ferry_cluster_destroy(t->cluster);
    free(t->in_buf);
    free(t->tg_buf);
    if (err[0] != '\0')
        (void)ferry_errorf(FERRY_ERR_INVALID, "%s", err); /* only the text is read */
    ferry_batch_destroy(t->train);
    ferry_batch_destroy(t->valid);
    ferry_batch_destroy(t->test);
    ferry_corpus_destroy(t->corpus);
    ferry_backend_destroy(t->be);
}

/* A checkpoint of the whole job at this step boundary, under one id (the step):
 * rank 0 (or the only trainer) asks every ferry-ps to write its modules as
 * "<job>-step<N>.ckpt"; then every rank writes its own part (configuration, where it
 * is, carried state, its parameter block and optimizer) with the list of server
 * files, which commits the checkpoint for this rank. (epoch, window): where to go
 * on, window 0 meaning the start of `epoch`. */
static ferry_status save_checkpoint(trainer *t, int epoch, int64_t window) {
    const ferry_trainer_config *cfg = t->cfg;
    if (cfg->save == NULL)
        return FERRY_OK;
    if (t->op_t0 == 0.0)
        t->op_t0 = ferry_now();
    ferry_status st = ferry_lm_pull_dense(t->lm);
    if (st != FERRY_OK)
        return st;
    char manifest[4096] = "", name[160] = "";
    if (t->job != NULL) {
        (void)snprintf(name, sizeof name, "%s-step%lld.ckpt", cfg->job, (long long)t->step);
        for (char *p = name; *p != '\0'; p++)
            if (*p == '/' || *p == ':')
                *p = '_';
    }
    if (t->cluster != NULL && (t->job == NULL || cfg->rank == 0)) {
        /* A job's checkpoint is the job's own (its owner's modules, by a member); a run
         * outside a job checkpoints the whole server, which takes the admin token. */
        st = t->job != NULL ? ferry_job_checkpoint(t->job, (uint64_t)t->step)
                            : ferry_cluster_checkpoint(t->cluster, NULL, (uint64_t)t->step);
        if (st == FERRY_ERR_UNSUPPORTED && !t->recover) {
            FERRY_LOG_WARN("ferry-ps shards were not checkpointed (%s): start them with "
                           "--checkpoint-dir DIR to keep the embedding and decoder too",
                           ferry_error_last());
            st = FERRY_OK;
        } else if (st == FERRY_ERR_DENIED) {
            char why[512];
            (void)snprintf(why, sizeof why, "%s", ferry_error_last());
            if (t->recover)
                return ferry_errorf(st, "%s: a job that checkpoints ferry-ps needs the admin token "
                                        "(--token-file)", why);
            FERRY_LOG_WARN("ferry-ps shards were not checkpointed (%s): give this trainer the "
                           "admin token to keep the embedding and decoder too", why);
            st = FERRY_OK;
        } else if (st != FERRY_OK) {
            return st;
        }
    }
    for (int i = 0; t->cluster != NULL && i < ferry_cluster_size(t->cluster); i++) {
        size_t n = strlen(manifest);
        /* by index, not address: a job may come back on other hosts */
        (void)snprintf(manifest + n, sizeof manifest - n, "server %d %s\n", i,
                       name[0] ? name : "(default name)");
    }
    ferry_ck_progress pr;
    memset(&pr, 0, sizeof pr);
    pr.epoch = epoch;
    pr.window = window;
    pr.step = t->step;
    pr.lr = t->lr;
    pr.sched = t->sched;
    pr.vocab_hash = ferry_vocab_hash(ferry_corpus_vocab(t->corpus));
    pr.has_state = window > 0;
    char path[2048];
    int rank = t->job != NULL ? cfg->rank : -1;
    ferry_checkpoint_part(cfg->save, rank, t->step, path, sizeof path);
    st = ferry_checkpoint_save(path, cfg, t->lm, t->opt, &pr, manifest);
    if (st == FERRY_OK) {
        ferry_checkpoint_retain(cfg->save, rank, cfg->keep_checkpoints);
        t->op_t0 = 0.0;
    }
    return st;
}

/* Takes a loaded part's progress. */
static ferry_status apply_progress(trainer *t, const ferry_ck_progress *pr) {
    t->epoch = pr->epoch;
    t->win0 = pr->window;
    t->carried = pr->has_state;
    t->step = pr->step;
    t->lr = pr->lr;
    t->sched.best = pr->sched.best;
    t->sched.bad_epochs = pr->sched.bad_epochs;
    t->sched.cooldown_left = pr->sched.cooldown_left;
    return ferry_optim_set_lr(t->opt, t->lr);
}

static void steps_text(const int64_t *s, size_t n, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && k + 24 < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? "," : "", (long long)s[i]);
    if (n == 0)
        (void)snprintf(buf, cap, "none");
}

/* What a roll-back found (rollback's *outcome). */
enum {
    ROLLED_BACK,  /* every rank went back to a common checkpoint */
    AT_LAST_STEP, /* every server and this rank's part are at the run's last step */
    JOB_COMPLETE  /* the job completed its run without this rank: nothing left to do */
};

/* The roll-back proper: the whole job goes back to the newest checkpoint every
 * process has. Probes (each server's complete files, and where its copy of the job
 * stands: fresh, older, newer) and the recover barrier, until every server answers
 * and agrees on a step (*resume), within the recovery timeout from t0. `all`: this
 * rank's complete checkpoints, ascending. At the run's last step no roll-back may be
 * needed (*outcome). Servers that are down are waited for. */
static ferry_status rollback(trainer *t, const int64_t *all, size_t nall, double t0,
                             uint64_t *resume, int *outcome) {
    const ferry_trainer_config *cfg = t->cfg;
    double limit = cfg->recovery_timeout_s;
    int n = ferry_cluster_size(t->cluster), waiting = -1;
    ferry_status st = FERRY_OK;
    char text[512], have[256];
    uint64_t last = (uint64_t)t->last_step;
    int have_last = nall > 0 && all[nall - 1] == t->last_step;
    int64_t *mine = malloc((nall ? nall : 1) * sizeof *mine);
    if (mine == NULL)
        return FERRY_NOMEM();
    *outcome = ROLLED_BACK;
    for (int attempt = 0;; attempt++) {
        if (attempt > 0) {
            if (ferry_now() - t0 > limit) {
                st = ferry_errorf(FERRY_ERR_TIMEOUT,
                                  "recovery failed after %.0f s (--recovery-timeout %g): %s",
                                  ferry_now() - t0, limit, text);
                break;
            }
            struct timespec ts = {0, 100000000L};
            nanosleep(&ts, NULL);
        }
        /* offer = this rank's ∩ every server's */
        memcpy(mine, all, nall * sizeof *mine);
        size_t nmine = nall;
        int down = -1, at_last = last > 0, rolling = 0, finished = 0;
        uint64_t completed = 0;
        for (int s = 0; s < n; s++) {
            ferry_job_probe_result pr;
            if (ferry_job_probe(t->job, s, &pr) != FERRY_OK) {
                down = s;
                (void)snprintf(text, sizeof text, "%s", ferry_error_last());
                break;
            }
            size_t m = 0;
            for (size_t i = 0; i < nmine; i++) {
                for (size_t k = 0; k < pr.n; k++) {
                    if ((uint64_t)mine[i] == pr.steps[k]) {
                        mine[m++] = mine[i];
                        break;
                    }
                }
            }
            nmine = m;
            at_last &= pr.has_state && pr.state_step == last;
            rolling |= pr.rolling_back;
            finished |= pr.finished;
            completed = pr.completed_step > completed ? pr.completed_step : completed;
            if (attempt == 0 || waiting == s) {
                if (!pr.has_state)
                    (void)snprintf(have, sizeof have, "fresh (no state of the job)");
                else
                    (void)snprintf(have, sizeof have, "at step %llu",
                                   (unsigned long long)pr.state_step);
                FERRY_LOG_INFO("recovery: server %d (%s) is %s, holds %zu complete checkpoints "
                               "of the job",
                               s, ferry_cluster_target(t->cluster, s), have, pr.n);
            }
            ferry_job_probe_free(&pr);
        }
        if (down >= 0) {
            if (waiting != down)
                FERRY_LOG_WARN("recovery: waiting for %s to come back (%s)",
                               ferry_cluster_target(t->cluster, down), text);
            waiting = down;
            continue;
        }
        /* Every server is at the run's last step: the job's training is done. Either
         * it completed without this rank (which stopped before writing its part of the
         * last step), or this rank's part of it is here and nothing needs to roll
         * back: it takes its rank again and finishes (unless a roll-back is under
         * way, which it joins). */
        if (at_last && (finished || (!have_last && completed == last))) {
            *outcome = JOB_COMPLETE;
            break;
        }
        if (at_last && have_last && !rolling) {
            if ((st = ferry_job_rejoin(t->job)) == FERRY_OK) {
                *resume = last;
                *outcome = AT_LAST_STEP;
                break;
            }
            FERRY_LOG_INFO("recovery: rank %d cannot take its place at the last step again "
                           "(%s): the job rolls back",
                           cfg->rank, ferry_error_last());
        }
        if (nmine == 0) {
            steps_text(all, nall, have, sizeof have);
            st = ferry_errorf(FERRY_ERR_NOT_FOUND,
                              "recovery impossible: no checkpoint that this rank (steps %s in "
                              "%s.r%d.*) and every ferry-ps hold (start the servers with the "
                              "same --checkpoint-dir they had)",
                              have, t->ck_base, cfg->rank);
            break;
        }
        uint64_t offer[1024];
        size_t no = nmine < 1024 ? nmine : 1024;
        for (size_t i = 0; i < no; i++)
            offer[i] = (uint64_t)mine[nmine - no + i];
        double left = limit - (ferry_now() - t0);
        st = ferry_job_recover(t->job, offer, no, (int)(left > 1.0 ? left * 1000.0 : 1000.0),
                               resume);
        if (st == FERRY_OK)
            break;
        (void)snprintf(text, sizeof text, "%s", ferry_error_last());
        if (st == FERRY_ERR_NOT_FOUND || st == FERRY_ERR_EXISTS || st == FERRY_ERR_INVALID ||
            st == FERRY_ERR_ABORTED) {
            st = ferry_errorf(st, "recovery failed: %s", text);
            break;
        }
        FERRY_LOG_INFO("recovery: retrying the roll-back (%s)", text);
    }
    free(mine);
    return st;
}

static ferry_status recover(trainer *t, const char *why) {
    const ferry_trainer_config *cfg = t->cfg;
    /* The recovery counts from the start of the server work that failed: its calls may
     * have spent part of the time being sent again. */
    double t0 = t->op_t0 > 0.0 ? t->op_t0 : ferry_now();
    t->op_t0 = 0.0;
    FERRY_LOG_WARN("recovering: %s; the job rolls back to its newest complete checkpoint "
                   "(waiting up to %.0f s more, --recovery-timeout %g)",
                   why, fmax(0.0, cfg->recovery_timeout_s - (ferry_now() - t0)),
                   cfg->recovery_timeout_s);
    ferry_dist_ctx_abandon(t->dc); /* no cleanup calls to a dead peer */
    ferry_cluster_set_wait_for_ready(t->cluster, 0);
    /* This rank's parts do not change while it waits: read and verify them once. */
    int64_t *all = NULL;
    size_t nall = 0;
    uint64_t resume = 0;
    int outcome = ROLLED_BACK;
    ferry_status st = ferry_checkpoint_steps(t->ck_base, cfg->rank, &all, &nall);
    if (st == FERRY_OK)
        st = rollback(t, all, nall, t0, &resume, &outcome);
    int64_t newest = nall > 0 ? all[nall - 1] : -1;
    free(all);
    if (st != FERRY_OK)
        return st;
    ferry_checkpoint_sweep_temps(t->ck_base, cfg->rank);
    if (outcome == JOB_COMPLETE) {
        t->complete = 1;
        FERRY_LOG_WARN("job '%s' is complete: every server is at its last step (%lld) and the "
                       "ranks that finished it have left; this rank's newest part is %s%lld: "
                       "nothing is left for it to do",
                       cfg->job, (long long)t->last_step,
                       newest == t->last_step ? "that step, " : "step ", (long long)newest);
        return FERRY_OK;
    }
    /* Learn the servers' incarnations anew: later context calls name them, so that a
     * server restarting again is noticed at once. */
    int restarted = 0;
    if ((st = ferry_cluster_hello(t->cluster, &restarted)) != FERRY_OK)
        return st;
    char path[2048];
    ferry_checkpoint_part(t->ck_base, cfg->rank, (int64_t)resume, path, sizeof path);
    ferry_ck_progress pr;
    if ((st = ferry_checkpoint_load(path, t->lm, t->opt,
                                    ferry_vocab_hash(ferry_corpus_vocab(t->corpus)), &pr)) !=
            FERRY_OK ||
        (st = apply_progress(t, &pr)) != FERRY_OK || (st = ferry_lm_pull_dense(t->lm)) != FERRY_OK)
        return st;
    if (outcome == AT_LAST_STEP)
        FERRY_LOG_WARN("recovered in %.1f s without a roll-back: every server is at the run's "
                       "last step (%llu) and this rank's part of it is complete (%s); epoch %d "
                       "finishes",
                       ferry_now() - t0, (unsigned long long)resume, path, t->epoch);
    else
        FERRY_LOG_WARN("recovered in %.1f s: the job rolled back to step %llu (%s); epoch %d "
                       "continues at window %lld",
                       ferry_now() - t0, (unsigned long long)resume, path, t->epoch,
                       (long long)t->win0);
    if (t->metrics != NULL) {
        const char *keys[] = {"step", "epoch", "window", "seconds"};
        double vals[] = {(double)t->step, t->epoch, (double)t->win0, ferry_now() - t0};
        st = ferry_metrics_write_kv(t->metrics, "recover", 4, keys, vals);
    }
    return st;
}

/* A failure recovery can repair: a peer died, stalled or restarted (its state is
 * gone: unknown contexts, modules or job), or the job is rolling back. */
static int recoverable(ferry_status st) {
    /* SESSION: a call sent again reached the server restarted (its sessions are gone);
     * the roll-back says Hello there anew. */
    return st == FERRY_ERR_UNAVAILABLE || st == FERRY_ERR_TIMEOUT || st == FERRY_ERR_BUSY ||
           st == FERRY_ERR_RPC || st == FERRY_ERR_NOT_FOUND || st == FERRY_ERR_INVALID ||
           st == FERRY_ERR_IO || st == FERRY_ERR_SESSION;
}

/* The epochs from where the run is; returns at the end, on a stop, or on an error. */
static ferry_status run_epochs(trainer *t, int *stop) {
    const ferry_trainer_config *cfg = t->cfg;
    ferry_status st = FERRY_OK;
    double val = 0.0;
    int short_run = 0; /* --max-steps ended an epoch early: a short evaluation */
    for (; st == FERRY_OK && t->epoch <= cfg->epochs && !*stop; t->epoch++) {
        int64_t windows = 0;
        if ((st = train_epoch(t, stop, &windows)) != FERRY_OK)
            break;
        short_run = *stop && windows < ferry_batch_nwindows(t->train, cfg->bptt);
        /* Stopped inside the epoch (--max-steps): a checkpoint of exactly where. */
        if (*stop && !stop_requested && (st = save_checkpoint(t, t->epoch, windows)) != FERRY_OK)
            break;
        if (stop_requested) {
            /* Keep what was trained: where the epoch stopped, to resume exactly there. */
            FERRY_LOG_INFO("stopping on signal after step %lld", (long long)t->step);
            st = save_checkpoint(t, t->epoch, windows);
            return st;
        }
        if ((st = eval_and_report(t, "valid", t->valid, short_run, &val)) != FERRY_OK)
            break;
        t->lr = (float)ferry_lr_schedule_epoch_end(&t->sched, t->epoch, val, t->lr);
        if ((st = ferry_optim_set_lr(t->opt, t->lr)) != FERRY_OK)
            break;
        if (!*stop && (st = save_checkpoint(t, t->epoch + 1, 0)) != FERRY_OK)
            break;
    }
    if (st == FERRY_OK && !stop_requested) {
        t->epoch--;
        st = eval_and_report(t, "test", t->test, short_run, &val);
    }
    return st;
}

ferry_status ferry_trainer_run(const ferry_trainer_config *cfg) {
    trainer t;
    memset(&t, 0, sizeof t);
    pthread_mutex_init(&t.live_mu, NULL);
    t.cfg = cfg;
    t.t_start = ferry_now();
    t.ck_base = cfg->save != NULL ? cfg->save : cfg->load;
    ferry_status st = trainer_setup(&t);
    int stop = 0;
    while (st == FERRY_OK && !t.complete) {
        st = run_epochs(&t, &stop);
        if (st == FERRY_OK || !t.recover || stop_requested || !recoverable(st))
            break;
        char why[1024];
        (void)snprintf(why, sizeof why, "%s", ferry_error_last());
        int64_t at = t.step;
        if ((st = recover(&t, why)) != FERRY_OK)
            break;
        stop = 0; /* where the run now stands decides (at its last step: evaluation) */
        /* The same failure at the same step again and again is not a crash. */
        t.rec_repeat = t.step == t.rec_step && at <= t.step + cfg->checkpoint_every
                           ? t.rec_repeat + 1
                           : 0;
        t.rec_step = t.step;
        if (t.rec_repeat >= 3) {
            st = ferry_errorf(FERRY_ERR_INVALID,
                              "recovery gave up: the job failed again after rolling back to "
                              "step %lld (3 times): %s",
                              (long long)t.step, why);
            break;
        }
    }
    if (st == FERRY_OK && t.complete)
        FERRY_LOG_INFO("done: the job had completed its %lld steps; nothing to do (%.1f s)",
                       (long long)t.last_step, ferry_now() - t.t_start);
    else if (st == FERRY_OK && !stop_requested)
        FERRY_LOG_INFO("done: %lld steps in %.1f s", (long long)t.step, ferry_now() - t.t_start);
    if (st == FERRY_OK && stop_requested)
        FERRY_LOG_INFO("stopped: %lld steps in %.1f s", (long long)t.step,
                       ferry_now() - t.t_start);
    trainer_teardown(&t, st);
    pthread_mutex_destroy(&t.live_mu);
    return st;
}
