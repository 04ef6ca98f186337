/* trainer.c - the training loop of ferry-trainer, read top down: ferry_trainer_run
 * sets the run up (setup.c), runs its epochs, and each epoch its steps: a BPTT window
 * through the model on an autograd context, the global-norm clip, the optimizer step,
 * then progress and checkpoints as due; evaluation at each epoch's end and the
 * learning rate's schedule. A failure a job can survive goes to recovery.c and the
 * loop resumes where the roll-back left it. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/core/log.h"
#include "worker/trainer-impl.h"

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

ferry_status ferry__trainer_make_batches(const ferry_trainer_config *cfg, const ferry_corpus *c,
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
    if (cfg->elastic_max > 0 && !t->el_async) { /* its columns' state, then GradNorm */
        a.before_sync = ferry__trainer_elastic_put;
        a.user = t;
    }
    ferry_lm_step_result r;
    /* Rank 0 offers the dropped replicas that answer again, before a step the job
     * checkpoints after: the copy it restores them from is that checkpoint. */
    if (t->job != NULL && cfg->rank == 0 && cfg->replicas > 1 && cfg->checkpoint_every > 0 &&
        (t->step + 1) % cfg->checkpoint_every == 0 &&
        ferry_cluster_replicas_dropped(t->cluster, NULL, 0) > 0) {
        uint64_t offer = 0;
        int probe_ms = cfg->deadline_ms < 1000 ? (int)cfg->deadline_ms : 1000;
        (void)ferry_job_offer_readmit(t->job, probe_ms, &offer);
        if (offer != 0)
            FERRY_LOG_INFO("step %lld: dropped replicas answer again; offering to re-admit them "
                           "after this step's checkpoint",
                           (long long)t->step + 1);
    }
    int asked = checkpoint_requested != 0;
    if (asked) {
        checkpoint_requested = 0;
        if (t->job != NULL) /* every rank learns of it in this step's answer */
            ferry_job_request_checkpoint(t->job);
        FERRY_LOG_INFO("checkpoint requested (SIGUSR1): after step %lld", (long long)t->step + 1);
    }
    ferry_status st;
    for (;;) { /* an elastic job redoes a step a member will not finish, without it */
        ferry_window w = t->job != NULL ? rank_window(t, gw) : *gw;
        window_tensors(&w, &in, &tg);
        if (t->job != NULL) { /* its columns of the global batch's dropout masks (a redo */
            a.batch = gw->B;  /* may have moved them) */
            a.col0 = t->c0;
        }
        a.owner_set = cfg->elastic_max > 0 && !t->el_async;
        a.owner = t->el_first;
        st = ferry_lm_train_step(t->lm, t->ctx, t->dc, t->opt, &in, &tg, &a, &r);
        if (st == FERRY_OK || !ferry__trainer_elastic_retry(t, st) ||
            ferry__trainer_elastic_lost(t, st))
            break;
        if ((st = ferry__trainer_elastic_redo(t, gw->start == 0)) != FERRY_OK)
            return st;
    }
    if (st != FERRY_OK)
        return ferry_errorf(st, "step %lld: %s", (long long)t->step + 1, ferry_error_last());
    t->ck_asked = t->job != NULL ? r.checkpoint : asked;
    t->readmit = r.readmit;
    *loss_sum = r.job_loss_sum;
    *tokens = r.job_tokens;
    *grad_norm = r.grad_norm;
    t->sync_s += r.sync_s;
    t->xfer_s += r.xfer_s;
    t->penalty_sum += r.penalty;
    t->step++;
    return t->cluster != NULL ? ferry__trainer_note_failover(t) : FERRY_OK;
}

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
    ferry__trainer_job_window(t);
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
        t->el_window = i;
        if ((st = train_step(t, &w, &sum, &ntok, &gn)) != FERRY_OK)
            break;
        if (cfg->elastic_max > 0 && !t->el_async &&
            (st = ferry__trainer_elastic_sync(t, start + cfg->bptt >= nsteps - 1)) != FERRY_OK)
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
            st = ferry__trainer_log_train(t, win_steps, win_loss / (double)win_tokens,
                                          ps.tokens_per_s, ferry_now() - t_win);
            if (st == FERRY_OK && t->el_async)
                st = ferry__trainer_elastic_watch(t);
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
            st = ferry__trainer_save_checkpoint(t, t->epoch, i + 1);
        }
        t->ck_asked = 0;
        if (st == FERRY_OK && t->readmit != 0)
            st = ferry__trainer_readmit(t);
        if (st == FERRY_OK)
            t->op_t0 = 0.0; /* the step and its checkpoint are done */
        /* A rank of an elastic job asked to stop takes one more step, which tells the
         * coordinator it leaves after it: the others go on without a redo. */
        int stop_now = stop_requested && (cfg->elastic_max == 0 || t->el_left || t->el_async);
        if ((cfg->max_steps > 0 && t->step >= cfg->max_steps) || stop_now) {
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
        if (*stop && !stop_requested &&
            (st = ferry__trainer_save_checkpoint(t, t->epoch, windows)) != FERRY_OK)
            break;
        if (stop_requested) {
            /* Keep what was trained: where the epoch stopped, to resume exactly there. */
            FERRY_LOG_INFO("stopping on signal after step %lld", (long long)t->step);
            st = ferry__trainer_save_checkpoint(t, t->epoch, windows);
            return st;
        }
        if ((st = eval_and_report(t, "valid", t->valid, short_run, &val)) != FERRY_OK)
            break;
        t->lr = (float)ferry_lr_schedule_epoch_end(&t->sched, t->epoch, val, t->lr);
        if ((st = ferry_optim_set_lr(t->opt, t->lr)) != FERRY_OK)
            break;
        if (t->el_async && !*stop && t->epoch < cfg->epochs &&
            (st = ferry__trainer_elastic_progress(t)) != FERRY_OK)
            break;
        if (!*stop && (st = ferry__trainer_save_checkpoint(t, t->epoch + 1, 0)) != FERRY_OK)
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
    pthread_mutex_init(&t.route_mu, NULL);
    t.cfg = cfg;
    t.t_start = ferry_now();
    t.ck_base = cfg->save != NULL ? cfg->save : cfg->load;
    ferry_status st = ferry__trainer_setup(&t);
    int stop = 0;
    while (st == FERRY_OK && !t.complete) {
        st = run_epochs(&t, &stop);
        if (st != FERRY_OK && cfg->elastic_max > 0 && !stop_requested) {
            /* Dropped from an elastic job's membership while alive (its connection
             * broke): admitted again at a step boundary, it goes on where the members
             * are. Any other failure stands. */
            char why[1024];
            (void)snprintf(why, sizeof why, "%s", ferry_error_last());
            if (t.el_lost || !ferry__trainer_elastic_dropped(&t, st)) {
                st = ferry_errorf(st, "%s", why);
                break;
            }
            if ((st = ferry__trainer_elastic_readmit(&t, why)) != FERRY_OK)
                break;
            stop = 0;
            continue;
        }
        if (st == FERRY_OK || !t.recover || stop_requested || !ferry__trainer_recoverable(st))
            break;
        char why[1024];
        (void)snprintf(why, sizeof why, "%s", ferry_error_last());
        int64_t at = t.step;
        if ((st = ferry__trainer_recover(&t, why)) != FERRY_OK)
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
    ferry__trainer_teardown(&t, st);
    pthread_mutex_destroy(&t.live_mu);
    pthread_mutex_destroy(&t.route_mu);
    return st;
}
