/* trainer-impl.h - what the files of ferry-trainer's run share: the state of one run
 * (`trainer`) and the functions one file of the run calls in another. The run reads
 * top down from trainer.c (the loop: batches, steps, evaluation, epochs) into setup.c
 * (connecting, the model, the job, BLAS threads; teardown), recovery.c (checkpoints,
 * roll-back and recovery after a failure) and report.c (log lines, metrics events, the
 * /metrics page); config.c holds the configuration (defaults, presets, a launcher's
 * environment). Private to worker/. */
#ifndef FERRY_TRAINER_IMPL_H
#define FERRY_TRAINER_IMPL_H

#include <pthread.h>
#include <stdint.h>

#include "common/ops/http.h"
#include "ferry/ferry.h"
#include "ferry/optim.h"
#include "optim/schedule.h"
#include "worker/batch.h"
#include "worker/checkpoint.h"
#include "worker/corpus.h"
#include "worker/metrics.h"
#include "worker/model.h"
#include "worker/progress.h"
#include "worker/trainer.h"

/* What /metrics shows, as of the last log line. */
typedef struct trainer_live {
    int64_t step;
    int epoch;
    double loss, tok_s, lr, t;
    /* elastic: the membership epoch, its size, steps redone */
    uint64_t el_epoch, el_redos, srv_epoch;
    size_t el_members;
    int servers;
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
    ferry_job *job;           /* a data-parallel job */
    int c0, c1;               /* this rank's batch columns [c0, c1) */
    int32_t *in_buf, *tg_buf; /* (bptt, c1 - c0): its slice of a window */
    double sync_s;            /* time in the job's GradNorm/Step since the last log line */
    double xfer_s;            /* time pulling and pushing the job's dense block, the same */
    char pipe_note[64];       /* the pipeline's busy fractions, for the progress line */
    uint64_t wire_last;       /* bytes on the wire at the last log line */
    uint64_t drops_seen;      /* replicas dropped, as of the last failover event */
    uint64_t readmit;         /* replicas to re-admit after this step's checkpoint */
    ferry_lr_schedule sched;
    ferry_metrics *metrics;
    ferry_progress *progress;
    int epoch;               /* current epoch, 1-based */
    int64_t step;            /* optimizer steps done in total */
    int64_t win0;            /* the window of `epoch` to start at (a resume) */
    int carried;             /* the carried state was restored: do not zero it at win0 */
    int recover;             /* a job that recovers from crashes (checkpoint_every > 0) */
    int64_t last_step;       /* the run's last step: --max-steps, or every epoch's windows */
    int complete;            /* the job completed while this rank was down: nothing left to do */
    double op_t0;            /* when the server work under way began (a step with its checkpoint,
                                an evaluation); 0 between them: a recovery counts from there */
    ferry_http *http;        /* --metrics-listen */
    pthread_mutex_t live_mu; /* guards live: what /metrics shows */
    /* held by /metrics while it reads the cluster, and by a move of the job's servers
     * while it changes it (ferry_cluster_retarget) */
    pthread_mutex_t route_mu;
    trainer_live live;
    int ck_asked;     /* a checkpoint was requested after the last step */
    int64_t rec_step; /* the step of the last roll-back, and how many in a row */
    int rec_repeat;
    const char *ck_base; /* --save, else --load: the checkpoints a recovery looks at */
    float lr;
    /* elastic: the membership epoch this rank runs under, whether it is the first
     * member, and the window of the step under way */
    uint64_t el_epoch;
    int el_first;
    int el_left; /* out of the membership after a SIGTERM: the run stops */
    /* dropped from the membership while alive (its connection broke): the run asks to
     * be admitted again; readmits counts those admissions, last_readmit their step */
    int el_dropped, el_readmits;
    int64_t el_readmit_step;
    int64_t el_window;
    /* elastic: the job's servers this rank runs on ("--ps", or as the last move of
     * them said) and the count of moves it took (ferry_job_servers) */
    char *srv_now;
    uint64_t srv_epoch;
    int srv_unjoined;   /* connected to srv_now, the rank not yet joined everywhere */
    int srv_fatal;      /* the model could not be placed over srv_now: the run stops */
    int el_lost;        /* a server of the elastic job is gone (its state with it) */
    int el_async;       /* an elastic ssp or async job: no common step, no boundary */
    double penalty_sum; /* summed over the steps since the last log line */
    double t_start;
} trainer;

/* ---- trainer.c: the loop ---- */

ferry_status ferry__trainer_make_batches(const ferry_trainer_config *cfg, const ferry_corpus *c,
                                         ferry_split s, int B, int64_t limit, ferry_batches **out);

/* ---- setup.c: connecting and building the run, and ending it ---- */

ferry_status ferry__trainer_setup(trainer *t);
/* The cluster configuration of --ps from the flags; *token (the token file's, or
 * NULL) is the caller's to free with ferry_secret_free. */
ferry_status ferry__trainer_cluster_config(const trainer *t, ferry_cluster_config *cc,
                                           char **token);
void ferry__trainer_teardown(trainer *t, ferry_status run);

/* ---- recovery.c: checkpoints and recovery ---- */

ferry_status ferry__trainer_save_checkpoint(trainer *t, int epoch, int64_t window);
ferry_status ferry__trainer_apply_progress(trainer *t, const ferry_ck_progress *pr);
ferry_status ferry__trainer_recover(trainer *t, const char *why);
int ferry__trainer_recoverable(ferry_status st);

/* ---- elastic.c: a rank of an elastic job (--elastic) ---- */

/* Asks to be admitted and takes the membership, and for a rank that joins a running
 * job the members' progress and its columns' carried state. */
ferry_status ferry__trainer_elastic_admit(trainer *t);
/* Asks the coordinator where the job runs and follows it there: the servers a move of
 * them (ferry-ctl resize) committed, or those a move under way holds the members for
 * (waiting until it ends). */
ferry_status ferry__trainer_elastic_where(trainer *t);
/* After the run failed because this rank was dropped from the membership while it
 * lived (t->el_dropped): asks to be admitted again, with the rank it holds, and takes
 * the members' progress and its new columns, as a joining rank does; the run then goes
 * on from there. Gives up, saying why, when a drop follows the last admission before
 * any step, three times. */
ferry_status ferry__trainer_elastic_readmit(trainer *t, const char *why);
/* After the run of an elastic job's rank failed with st: 1 when the coordinator no
 * longer counts this rank among the members (asked for up to a second, while it learns
 * of the broken connection; ssp and async: also when a server refused its Step as not
 * a member's), else 0 (the failure stands; the error message is then not kept). */
int ferry__trainer_elastic_dropped(trainer *t, ferry_status st);
/* An elastic ssp or async job's rank at each log line: the coordinator's membership,
 * logged and written as a `membership` event when its epoch changed (the members are
 * admitted and leave without this rank taking part). */
ferry_status ferry__trainer_elastic_watch(trainer *t);
/* After an epoch's evaluation of an elastic ssp or async job: its learning rate and
 * schedule on the coordinator, for ranks admitted later. */
ferry_status ferry__trainer_elastic_progress(trainer *t);
/* ferry_lm_step_args.before_sync (user: the trainer): its columns' state on the
 * coordinator. */
ferry_status ferry__trainer_elastic_put(void *user);
/* After a call of an elastic job's rank failed with st: 1, the error (its message
 * first) now saying so, when a server no longer answers: its state is gone with it
 * (an elastic job keeps no copy), so no redo can finish the step. 0 otherwise, the
 * error as it was. */
int ferry__trainer_elastic_lost(trainer *t, ferry_status st);
/* 1 when a failed step of an elastic job may be redone (a member will not come). */
int ferry__trainer_elastic_retry(const trainer *t, ferry_status st);
/* The membership that redoes the failed step (first_window: it is an epoch's first). */
ferry_status ferry__trainer_elastic_redo(trainer *t, int first_window);
/* After a step: the next step's membership, asked of the coordinator when its Step
 * reply names another epoch (a rank that asked to leave is out of it, and stops). */
ferry_status ferry__trainer_elastic_sync(trainer *t, int next_first_window);

/* ---- report.c: what the run reports ---- */

/* After a step: a replica dropped since the last call (ferry_cluster_replicas_dropped)
 * becomes a "failover" event in --metrics-out (the log has its line already). */
ferry_status ferry__trainer_note_failover(trainer *t);
/* Starts a log interval's job figures: the wire bytes so far, no time in
 * pull/push or GradNorm/Step yet. At each job line and at each epoch's start, so an
 * interval never counts the steps of one a failure cut short, nor an evaluation's
 * calls. */
void ferry__trainer_job_window(trainer *t);

/* After a step whose answer offered dropped replicas back (t->readmit) and its
 * checkpoint: ferry_job_readmit, and a "readmit" event in --metrics-out. */
ferry_status ferry__trainer_readmit(trainer *t);
ferry_status ferry__trainer_log_train(trainer *t, int64_t nsteps, double loss, double tok_s,
                                      double elapsed);
void ferry__trainer_describe_params(const trainer *t, char *buf, size_t cap);
void ferry__trainer_metrics_page(void *user, ferry_prom *p);

#endif /* FERRY_TRAINER_IMPL_H */
