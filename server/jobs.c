/* jobs.c - training jobs on a server: who belongs to a job (the Job method: join,
 * ready, leave, probe, recover, checkpoint, status), and the consistency its ranks
 * chose. A job belongs to the identity that made it, and each rank to the session
 * that holds it: every action and every GradNorm/Step of a job is checked against
 * both (an admin may act for anyone). bsp sums the ranks' gradients of a step into one
 * and applies it once; ssp lets a rank run at most K steps ahead of the slowest;
 * async applies each rank's step on arrival. Calls that must wait are deferred
 * replies (ferry_rpc_defer), finished by the call that ends the wait or by the
 * sweep timer when the job's sync timeout passes: no server thread ever blocks.
 *
 * Locking: jobs->mu first, then a context's mutex, then a module's lock. A Step of
 * ssp or async runs without jobs->mu (it takes only its context and modules). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/core/log.h"
#include "server/ps-impl.h"

#define JOB_MAX_WORLD      65536
#define JOB_DEFAULT_WAIT_S 60.0
#define JOB_MODEL_KEYS     64
#define JOB_MODEL_MAX      4096 /* the model signature as "k=v k=v ...", with the NUL */
#define JOB_CHUNK          64   /* ranks per chunk of a job's rank table */
#define INST_REPLY_MAX     (1 << 20) /* StepRequest.installed kept, packed, at most */
#define JOB_METRICS_MAX    32   /* jobs whose own metrics a Stats or /metrics page lists */
#define MV_TARGETS         64   /* servers of a move's list (JobReshard) */
#define MV_TARGET          256  /* bytes of one server's target, with the NUL */
enum { MV_NONE, MV_PENDING, MV_HOLD }; /* a move: none; begun; holding the members */

/* How a rank left the job (job_rank.left) or went away (job_rank.gone). */
enum { RANK_IN = 0, RANK_COMPLETED = 1, RANK_LEFT_EARLY = 2 };
enum { RANK_HELD = 0, RANK_STREAM_CLOSED = 1, RANK_SESSION_ENDED = 2 };

typedef struct job_rank {
    uint64_t sess; /* the session holding the rank (ferry__ps_session.serial); 0: none */
    int joined;
    int left;       /* RANK_IN, or RANK_COMPLETED (its run's end) or RANK_LEFT_EARLY */
    int gone;       /* its holder lost its Session stream or ended (RANK_*): its trainer died */
    uint64_t steps; /* Steps done */
    /* bsp: its arrival at the open barrier */
    int arrived;
    uint64_t ctx_id, ctx_sess; /* its context of the step: id, and the session it is in */
    double loss_sum, tokens;
    int ck; /* asked for a checkpoint after this step */
    uint64_t readmit;      /* JobStep.readmit */
    ferry_rpc_pending *gn; /* its GradNorm, waiting for the barrier */
    int want_sum;          /* JobStep.want_sum of its GradNorm */
    double hold_until;     /* JobStep.hold_ms: answer gn `pending` then (0: never) */
    /* Its GradNorm reply, built when the barrier completed while the rank had been
     * answered `pending` (no call to answer): its next GradNorm gets it. */
    ferry_rpc_msg gn_kept;
    int has_kept;
    /* ssp: its Step's reply, built and waiting for the bound; bsp: its Step of the
     * step after the last applied, waiting for the Step that installs the sum (sp_step;
     * sp_reply unused) */
    ferry_rpc_pending *sp;
    ferry_rpc_msg sp_reply;
    uint64_t sp_step;
    double sp_scale; /* bsp: the waiting Step's gradient scale */
    double wait_since;
    double waited_s; /* seconds its calls waited, in all */
    /* recovery: its recover call, waiting for the other ranks */
    ferry_rpc_pending *rec;
    int rec_arrived;
    uint64_t rec_sess; /* the session whose recover arrived (0: an admin's, for it) */
    /* elastic */
    int member;              /* in the open barrier's membership (JobStep.members) */
    ferry_rpc_pending *admit; /* coordinator: its ADMIT, waiting for a step boundary */
    double admit_since;
    uint64_t leave_after; /* coordinator: it said it leaves after this step (0: not) */
} job_rank;

/* Coordinator of an elastic job: one column's carried state, as last applied
 * (`step`) and as put for the open step (`p_*`, under epoch p_epoch). */
typedef struct el_col {
    uint64_t step;
    ProtobufCBinaryData data;
    uint64_t p_step, p_epoch;
    ProtobufCBinaryData p_data;
} el_col;

/* One Step reply's metrics, kept to answer the later ranks of a bsp step alike. */
typedef struct job_metric {
    char name[FERRY_RPC_NAME_MAX + 16];
    double value;
} job_metric;

struct ferry__ps_job {
    char name[FERRY_RPC_NAME_MAX];
    char owner[FERRY_RPC_IDENTITY_MAX]; /* the identity that made it */
    ferry__ps_quota *quota;             /* its account (the job counts against it) */
    uint32_t world;
    ferry__ps_sync sync;
    uint32_t K;
    double wait_s;
    char model[JOB_MODEL_MAX];
    int ready, finished;
    char failed[512]; /* "" or why the job failed */
    /* The ranks, in chunks of JOB_CHUNK made when a rank of the chunk first joins: a
     * job's memory follows the ranks that joined, not the world it declares. */
    job_rank **chunks;
    int64_t bytes;     /* what the job holds: itself, the chunk table and the chunks */
    double idle_since; /* when it finished, failed or was last held by a live session */
    uint32_t joined;
    /* bsp */
    uint64_t bsp_step; /* the step whose barrier is open or was last completed */
    int bsp_complete;  /* its gradients are summed (agg) */
    uint32_t arrived;
    ferry__ps_ctx_mod *agg; /* the summed gradients of bsp_step, until applied */
    double *agg_ss;         /* their sums of squares */
    int nagg;
    double agg_sumsq, agg_loss, agg_tokens;
    int agg_ck; /* some rank asked for a checkpoint after bsp_step */
    uint64_t agg_readmit; /* the replicas the ranks re-admit after bsp_step (OR) */
    uint32_t sum_rank;    /* 1 + the rank of bsp_step that asked for the sum (0: none):
                             one per step, so the copies a step keeps are bounded */
    /* primary-backup: the primary's GradNorm answer of bsp_step that an installing Step
     * brought (StepRequest.installed, packed; NULL: none), for a rank whose own answer
     * from the primary was lost */
    uint8_t *inst_reply;
    size_t inst_len;
    uint64_t inst_step;
    uint64_t applied; /* the last step applied */
    double applied_scale;
    uint64_t applied_version;
    job_metric *applied_metrics;
    int napplied_metrics;
    /* ssp */
    uint64_t max_lead; /* the most steps a rank was ahead of the slowest when answered */
    uint64_t held;     /* Step replies that had to wait */
    /* recovery: a recover barrier is open (GradNorm/Step refused until it completes) */
    int recovering;
    uint32_t rec_arrived;
    double rec_since;
    uint64_t *rec_set; /* the steps every rank that arrived offered */
    size_t rec_n;
    uint64_t rec_last;   /* the last step of the recovering ranks' runs (0: not said) */
    uint64_t recoveries; /* completed roll-backs */
    /* The first rank that left early, and why (JobLeave.reason). */
    uint32_t early_rank;
    char early_why[256];
    /* elastic (JobMember.elastic_min > 0; world is the most members) */
    uint32_t el_min;
    uint64_t bar_epoch; /* every server: the open barrier's epoch and member count */
    uint32_t bar_n;
    /* the coordinator's membership (epoch 0: none yet), from step ep_step */
    uint64_t epoch, ep_step;
    uint32_t *members;
    uint32_t nmembers;
    uint32_t el_batch; /* columns (the global batch B) */
    uint32_t el_rank_cols; /* > 0: the per-rank policy, rank r's columns (JobElastic) */
    el_col *cols;
    int64_t col_bytes; /* their bytes, in job->bytes too */
    ProtobufCBinaryData prog, p_prog; /* the trainers' progress: applied, put */
    uint64_t prog_step, p_prog_step;
    /* the coordinator's server moves (JobReshard): the committed --ps list (NULL: the
     * trainers' own) and the moves committed; a move under way (mv_state), the list it
     * moves to, its boundary step, since when, and whether a server adopted (the
     * coordinator adopts first); the last move's cost as ferry-ctl measured it */
    char *srv_list, *mv_list; /* targets joined by ',' */
    uint64_t srv_epoch, mv_step;
    int mv_state, mv_adopting, mv_took; /* ADOPTs here under way; one changed modules */
    double mv_since, mv_seconds;
    uint64_t mv_bytes;
    struct ferry__ps_job *next;
};

/* ---- the rank table ---- */

static const job_rank absent_rank; /* what a rank of a chunk never made reads as */

/* Rank r for reading: a rank nobody joined reads as all zero. */
static const job_rank *rank_peek(const ferry__ps_job *job, uint32_t r) {
    const job_rank *c = r < job->world ? job->chunks[r / JOB_CHUNK] : NULL;
    return c != NULL ? &c[r % JOB_CHUNK] : &absent_rank;
}

/* Rank r for writing, or NULL when its chunk was never made (nobody joined it). */
static job_rank *rank_get(ferry__ps_job *job, uint32_t r) {
    job_rank *c = r < job->world ? job->chunks[r / JOB_CHUNK] : NULL;
    return c != NULL ? &c[r % JOB_CHUNK] : NULL;
}

/* Rank r, its chunk made (and charged to the jobs' bytes) if need be; NULL when out of
 * memory. */
/* The first rank >= r whose chunk exists (job->world: none): loops over the ranks
 * that ever joined cost what those ranks do, not the declared world. */
static uint32_t rank_skip(const ferry__ps_job *job, uint32_t r) {
    while (r < job->world && job->chunks[r / JOB_CHUNK] == NULL)
        r = (r / JOB_CHUNK + 1) * JOB_CHUNK;
    return r < job->world ? r : job->world;
}

static job_rank *rank_make(ferry__ps_jobs *j, ferry__ps_job *job, uint32_t r) {
    job_rank **c = &job->chunks[r / JOB_CHUNK];
    if (*c == NULL) {
        if ((*c = calloc(JOB_CHUNK, sizeof **c)) == NULL)
            return NULL;
        job->bytes += JOB_CHUNK * (int64_t)sizeof **c;
        j->bytes += JOB_CHUNK * (int64_t)sizeof **c;
    }
    return &(*c)[r % JOB_CHUNK];
}

static void job_free(ferry__ps_jobs *j, ferry__ps_job *job);
static void el_free(ferry__ps_job *job);
static int el_index(const ferry__ps_job *job, uint32_t r);
static void el_fail_admits(ferry__ps_job *job, ferry_status st, const char *why);
static void el_depart(ferry__ps_job *job, uint32_t r, const char *why, int completed);
static ferry_status el_put_progress(ferry__ps_job *job, const Ferry__V1__JobElastic *e, int idx);

/* An elastic ssp or async job: no common step, so no boundary (el_admit_now). */
static int el_async(const ferry__ps_job *job) {
    return job->el_min > 0 && job->sync != FERRY__PS_BSP;
}

static const char *sync_name(ferry__ps_sync s) {
    return s == FERRY__PS_BSP ? "bsp" : s == FERRY__PS_SSP ? "ssp" : "async";
}

static void sync_text(const ferry__ps_job *job, char *buf, size_t cap) {
    if (job->sync == FERRY__PS_SSP)
        (void)snprintf(buf, cap, "ssp:%u", job->K);
    else
        (void)snprintf(buf, cap, "%s", sync_name(job->sync));
}

void ferry__ps_jobs_init(ferry__ps_jobs *j) {
    memset(j, 0, sizeof *j);
    pthread_mutex_init(&j->mu, NULL);
}

static void agg_free(ferry__ps_job *job) {
    for (int i = 0; i < job->nagg; i++) {
        ferry_grads_deinit(&job->agg[i].G);
        ferry__ps_module_put(job->agg[i].mod);
    }
    free(job->agg);
    free(job->agg_ss);
    job->agg = NULL;
    job->agg_ss = NULL;
    job->nagg = 0;
}

/* Finishes every waiting call of job with st and the current error detail. */
static void job_fail_waiters(ferry__ps_job *job, ferry_status st, const char *why) {
    for (uint32_t r = rank_skip(job, 0); r < job->world; r = rank_skip(job, r + 1)) {
        job_rank *k = rank_get(job, r);
        if (k == NULL)
            continue;
        if (k->gn != NULL) {
            (void)ferry_errorf(st, "%s", why);
            ferry_rpc_pending_finish(k->gn, st, NULL);
            k->gn = NULL;
            if (k->arrived && !job->bsp_complete) { /* withdrawn: its GradNorm failed */
                k->arrived = 0;
                job->arrived--;
                if (job->sum_rank == r + 1)
                    job->sum_rank = 0;
            }
        }
        if (k->sp != NULL) {
            (void)ferry_errorf(st, "%s", why);
            ferry_rpc_msg_deinit(&k->sp_reply);
            ferry_rpc_pending_finish(k->sp, st, NULL);
            k->sp = NULL;
        }
    }
}

/* Fails the open recover barrier's calls (they retry) and closes it. */
static void rec_fail(ferry__ps_job *job, ferry_status st, const char *why) {
    for (uint32_t r = rank_skip(job, 0); r < job->world; r = rank_skip(job, r + 1)) {
        job_rank *k = rank_get(job, r);
        if (k == NULL)
            continue;
        if (k->rec != NULL) {
            (void)ferry_errorf(st, "%s", why);
            ferry_rpc_pending_finish(k->rec, st, NULL);
            k->rec = NULL;
        }
        k->rec_arrived = 0;
    }
    job->recovering = 0;
    job->rec_arrived = 0;
    free(job->rec_set);
    job->rec_set = NULL;
    job->rec_n = 0;
}

/* The job cannot go on: every wait fails now, and so does every later job call. */
static void job_fail(ferry__ps_job *job, const char *why) {
    if (job->failed[0] == '\0') {
        (void)snprintf(job->failed, sizeof job->failed, "%s", why);
        FERRY_LOG_WARN("job '%s' failed: %s", job->name, why);
    }
    job_fail_waiters(job, FERRY_ERR_TIMEOUT, job->failed);
    el_fail_admits(job, FERRY_ERR_TIMEOUT, job->failed);
}

void ferry__ps_jobs_stop(ferry__ps_jobs *j) {
    pthread_mutex_lock(&j->mu);
    j->stopped = 1;
    for (ferry__ps_job *job = j->list; job != NULL; job = job->next) {
        job_fail_waiters(job, FERRY_ERR_UNAVAILABLE, "ferry-ps is shutting down");
        el_fail_admits(job, FERRY_ERR_UNAVAILABLE, "ferry-ps is shutting down");
        rec_fail(job, FERRY_ERR_UNAVAILABLE, "ferry-ps is shutting down");
    }
    pthread_mutex_unlock(&j->mu);
}

/* Frees a job (unlinked already, no call waiting on it) and gives its memory, its place
 * in the jobs' count and its owner's back. */
/* Drops every rank's kept GradNorm reply (a new step opens, a roll-back, the end). */
static void kept_clear(ferry__ps_job *job) {
    for (uint32_t r = rank_skip(job, 0); r < job->world; r = rank_skip(job, r + 1)) {
        job_rank *k = rank_get(job, r);
        if (k != NULL && k->has_kept) {
            ferry_rpc_msg_deinit(&k->gn_kept);
            k->has_kept = 0;
        }
    }
}

/* Forgets the installed step's answer (a new step opens, or the job ends). */
static void inst_clear(ferry__ps_jobs *j, ferry__ps_job *job) {
    if (job->inst_reply == NULL)
        return;
    job->bytes -= (int64_t)job->inst_len;
    j->bytes -= (int64_t)job->inst_len;
    free(job->inst_reply);
    job->inst_reply = NULL;
    job->inst_len = 0;
}

static void job_free(ferry__ps_jobs *j, ferry__ps_job *job) {
    free(job->srv_list);
    free(job->mv_list);
    inst_clear(j, job);
    agg_free(job);
    el_free(job);
    kept_clear(job);
    free(job->applied_metrics);
    free(job->rec_set);
    for (uint32_t c = 0; c < (job->world + JOB_CHUNK - 1) / JOB_CHUNK; c++)
        free(job->chunks[c]);
    free(job->chunks);
    j->bytes -= job->bytes;
    j->count--;
    if (job->quota != NULL)
        atomic_fetch_sub(&job->quota->jobs, 1);
    free(job);
}

/* Takes job out of the list and frees it: its waiting calls fail with st and why
 * first. jobs->mu held. */
static void job_drop(ferry__ps_jobs *j, ferry__ps_job *job, ferry_status st, const char *why) {
    job_fail_waiters(job, st, why);
    el_fail_admits(job, st, why);
    rec_fail(job, st, why);
    ferry__ps_job **pp = &j->list;
    while (*pp != job)
        pp = &(*pp)->next;
    *pp = job->next;
    job_free(j, job);
}

void ferry__ps_jobs_deinit(ferry__ps_jobs *j) {
    ferry__ps_jobs_stop(j);
    while (j->list != NULL) {
        ferry__ps_job *next = j->list->next;
        job_free(j, j->list);
        j->list = next;
    }
    pthread_mutex_destroy(&j->mu);
}

static ferry__ps_job *job_find(ferry__ps_jobs *j, const char *name) {
    for (ferry__ps_job *job = j->list; job != NULL; job = job->next) {
        if (strcmp(job->name, name) == 0)
            return job;
    }
    return NULL;
}

/* The fewest steps of a rank still in the job (joined and not left); the job's own
 * count when every rank has left. */
static uint64_t job_min_steps(const ferry__ps_job *job, uint32_t *slowest) {
    uint64_t min = UINT64_MAX;
    for (uint32_t r = 0; r < job->world; r++) {
        const job_rank *k = rank_peek(job, r);
        if (k->left || (job->el_min > 0 && !k->member)) /* elastic: the step's members */
            continue;
        uint64_t s = k->joined ? k->steps : 0;
        if (s < min) {
            min = s;
            if (slowest != NULL)
                *slowest = r;
        }
    }
    return min == UINT64_MAX ? 0 : min;
}

/* 1 when session sess may act as rank r of job: it holds the rank, or it is an admin. */
static int acts_as(const ferry__ps_session *sess, const ferry__ps_job *job, uint32_t r) {
    const job_rank *k = rank_peek(job, r);
    return sess->authority || (r < job->world && k->joined && k->sess == sess->serial);
}

/* The refusal of a job that the caller's identity does not own. It says neither who
 * owns it nor anything else about it. */
static ferry_status not_yours(const char *name) {
    return ferry_errorf(FERRY_ERR_DENIED,
                        "job '%.63s' belongs to another identity: choose another job name", name);
}

/* The refusal of a rank the calling session does not hold, whether another session
 * holds it or nobody does (no oracle). */
static ferry_status not_held(const ferry__ps_job *job, uint32_t r) {
    return ferry_errorf(FERRY_ERR_DENIED,
                        "job '%s': this session holds no rank %u (a session acts only as the "
                        "ranks it joined)",
                        job->name, r);
}

/* ---- departures: ranks that left, and ranks whose trainer went away ----
 * A wait that needs such a rank ends at once instead of at the sync timeout: with
 * FERRY_ERR_ABORTED for a rank that left (it is not coming back), with
 * FERRY_ERR_UNAVAILABLE for one whose trainer went away (a restarted trainer may take
 * the rank over and roll the job back, so the others recover rather than stop). */

/* Why rank r will not take part in a wait, into buf ("rank 1's trainer went away (its
 * connection closed)"), and the status the wait fails with; FERRY_OK for a rank that
 * is in. */
static ferry_status rank_absent(const ferry__ps_job *job, uint32_t r, char *buf, size_t cap) {
    const job_rank *k = rank_peek(job, r);
    unsigned long long steps = (unsigned long long)k->steps;
    if (k->left == RANK_COMPLETED) {
        (void)snprintf(buf, cap, "rank %u completed its run at step %llu and left the job", r,
                       steps);
        return FERRY_ERR_ABORTED;
    }
    if (k->left == RANK_LEFT_EARLY) {
        (void)snprintf(buf, cap, "rank %u left the job after step %llu (%s)", r, steps,
                       r == job->early_rank && job->early_why[0] != '\0' ? job->early_why
                                                                         : "it stopped early");
        return FERRY_ERR_ABORTED;
    }
    if (k->joined && k->gone != RANK_HELD) {
        (void)snprintf(buf, cap, "rank %u's trainer went away (%s)", r,
                       k->gone == RANK_STREAM_CLOSED ? "its connection closed"
                                                     : "its session ended");
        return FERRY_ERR_UNAVAILABLE;
    }
    return FERRY_OK;
}

/* The first rank other than `except` that bsp step `step` waits for and that will not
 * come (one that left before one that went away), as "bsp step 12 of job 'x': rank 1
 * ..." into buf; FERRY_OK when every rank it waits for is in. */
static ferry_status bsp_blocker(const ferry__ps_job *job, uint32_t except, uint64_t step, char *buf,
                                size_t cap) {
    ferry_status found = FERRY_OK;
    for (uint32_t r = rank_skip(job, 0); r < job->world && found != FERRY_ERR_ABORTED;
         r = rank_skip(job, r + 1)) {
        char why[400];
        if (r == except || rank_peek(job, r)->arrived ||
            (job->el_min > 0 && !rank_peek(job, r)->member))
            continue;
        ferry_status st = rank_absent(job, r, why, sizeof why);
        if (st == FERRY_OK || (found != FERRY_OK && st != FERRY_ERR_ABORTED))
            continue;
        found = st;
        (void)snprintf(buf, cap, "bsp step %llu of job '%s': %s", (unsigned long long)step,
                       job->name, why);
    }
    return found;
}

/* Rank r's trainer went away (how: RANK_STREAM_CLOSED or RANK_SESSION_ENDED): the waits
 * that need it fail now, a bsp barrier it has not reached and ssp Steps held while it
 * is the slowest. jobs->mu held. */
static void rank_gone(ferry__ps_job *job, uint32_t r, int how) {
    job_rank *k = rank_get(job, r);
    if (k == NULL || !k->joined || k->left != RANK_IN || k->gone != RANK_HELD)
        return;
    k->gone = how;
    char why[400], msg[512];
    ferry_status st = rank_absent(job, r, why, sizeof why);
    FERRY_LOG_WARN("job '%s': %s after step %llu", job->name, why, (unsigned long long)k->steps);
    if (job->sync == FERRY__PS_BSP && job->arrived > 0 && !job->bsp_complete && !k->arrived &&
        (job->el_min == 0 || k->member)) {
        (void)snprintf(msg, sizeof msg, "bsp step %llu of job '%s': %s",
                       (unsigned long long)job->bsp_step, job->name, why);
        job_fail_waiters(job, st, msg);
    }
    if (el_async(job)) {
        el_depart(job, r, why, 0);
        return;
    }
    if (job->sync == FERRY__PS_SSP && k->steps == job_min_steps(job, NULL)) {
        (void)snprintf(msg, sizeof msg, "ssp:%u of job '%s': the slowest rank is gone: %s", job->K,
                       job->name, why);
        job_fail_waiters(job, st, msg);
    }
}

void ferry__ps_jobs_holder_gone(ferry__ps_jobs *j, uint64_t serial) {
    pthread_mutex_lock(&j->mu);
    for (ferry__ps_job *job = j->list; job != NULL && !j->stopped; job = job->next) {
        for (uint32_t r = rank_skip(job, 0); r < job->world; r = rank_skip(job, r + 1))
            if (rank_peek(job, r)->sess == serial)
                rank_gone(job, r, RANK_STREAM_CLOSED);
    }
    pthread_mutex_unlock(&j->mu);
}

/* The job and rank of a GradNorm or Step: FERRY_ERR_NOT_FOUND for an unknown job,
 * FERRY_ERR_DENIED for another identity's job or a rank this session does not hold
 * (joined or not), the failure of a failed job. */
static ferry_status job_of(ferry__ps_jobs *j, const ferry__ps_session *sess,
                           const Ferry__V1__JobStep *js, ferry__ps_job **out) {
    ferry__ps_job *job = job_find(j, js->job);
    if (job == NULL)
        return ferry_errorf(FERRY_ERR_NOT_FOUND, "job '%.63s' is unknown here (Join it first)",
                            js->job);
    if (!ferry__ps_may_use(sess, job->owner))
        return not_yours(job->name);
    if (js->rank >= job->world)
        return ferry_errorf(FERRY_ERR_INVALID, "job '%s': rank %u outside [0, %u)", job->name,
                            js->rank, job->world);
    /* A rank nobody joined and one another session holds get the same answer. */
    if (!acts_as(sess, job, js->rank))
        return not_held(job, js->rank);
    if (!rank_peek(job, js->rank)->joined) /* an admin acting for a rank */
        return ferry_errorf(FERRY_ERR_INVALID, "job '%s': rank %u has not joined (world %u)",
                            job->name, js->rank, job->world);
    /* Its holder calls: it is here. An elastic job's member whose connection broke is
     * dropped instead (the others' barrier failed at once, and the coordinator drops
     * it at their redo): it joins its rank again first, which marks it back. Taking
     * it back on any call would race with that drop. */
    job_rank *k = rank_get(job, js->rank); /* joined: it exists */
    if (k->sess == sess->serial && job->el_min > 0 && k->gone == RANK_STREAM_CLOSED)
        return ferry_errorf(FERRY_ERR_ABORTED,
                            "job '%s': rank %u's connection to this ferry-ps broke, and the "
                            "membership drops it: join the rank again and be admitted",
                            job->name, js->rank);
    if (k->sess == sess->serial)
        k->gone = RANK_HELD;
    if (job->recovering)
        return ferry_errorf(FERRY_ERR_BUSY,
                            "job '%s' is rolling back to a checkpoint (a rank or server "
                            "restarted): recover too",
                            job->name);
    if (job->failed[0] != '\0')
        return ferry_errorf(FERRY_ERR_TIMEOUT, "%s", job->failed);
    if (js->step == 0)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "job '%s': rank %u sent job step 0 (steps count "
                            "from 1)",
                            job->name, js->rank);
    if (j->stopped)
        return ferry_errorf(FERRY_ERR_UNAVAILABLE, "ferry-ps is shutting down");
    *out = job;
    return FERRY_OK;
}

/* ---- Job: membership ---- */

static int job_name_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n >= FERRY_RPC_NAME_MAX)
        return 0;
    for (; *s != '\0'; s++) {
        if (!isalnum((unsigned char)*s) && strchr("_.:/-", *s) == NULL)
            return 0;
    }
    return 1;
}

/* The value of `key` in a "k=v k=v" string into val (cap bytes); 0 if absent. */
static int model_value(const char *model, const char *key, char *val, size_t cap) {
    size_t kl = strlen(key);
    for (const char *p = model; *p != '\0';) {
        while (*p == ' ')
            p++;
        const char *end = strchr(p, ' ');
        size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        if (len > kl && strncmp(p, key, kl) == 0 && p[kl] == '=') {
            size_t vl = len - kl - 1 < cap - 1 ? len - kl - 1 : cap - 1;
            memcpy(val, p + kl + 1, vl);
            val[vl] = '\0';
            return 1;
        }
        p += len;
    }
    return 0;
}

/* The first key whose values differ between the job's model and a joiner's, as
 * "H=650 here, H=200 in the job"; 0 when they agree. */
static int model_diff(const char *job, const char *mine, char *buf, size_t cap) {
    const char *sides[2] = {mine, job};
    for (int side = 0; side < 2; side++) {
        for (const char *p = sides[side]; *p != '\0';) {
            while (*p == ' ')
                p++;
            const char *end = strchr(p, ' ');
            size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
            const char *eq = memchr(p, '=', len);
            if (eq != NULL && len > 0) {
                char key[64], a[128] = "(none)", b[128] = "(none)";
                size_t kl = (size_t)(eq - p) < sizeof key - 1 ? (size_t)(eq - p) : sizeof key - 1;
                memcpy(key, p, kl);
                key[kl] = '\0';
                int ha = model_value(mine, key, a, sizeof a);
                int hb = model_value(job, key, b, sizeof b);
                if (ha != hb || strcmp(a, b) != 0) {
                    (void)snprintf(buf, cap, "%s=%s here, %s=%s in the job", key, a, key, b);
                    return 1;
                }
            }
            p += len;
        }
    }
    return 0;
}

/* The model keys as one "k=v k=v" string, each key and value checked: keys of
 * [A-Za-z0-9_.-] up to 63 bytes, each once, values of printable non-space bytes up to
 * 127, at most JOB_MODEL_KEYS. */
static ferry_status model_text(const Ferry__V1__JobMember *mb, char *out, size_t cap) {
    size_t n = 0;
    out[0] = '\0';
    if (mb->n_model > JOB_MODEL_KEYS)
        return ferry_errorf(FERRY_ERR_INVALID, "Job: a model of %zu keys (at most %d)", mb->n_model,
                            JOB_MODEL_KEYS);
    for (size_t i = 0; i < mb->n_model; i++) {
        const char *k = mb->model[i]->key, *v = mb->model[i]->value;
        size_t kl = strlen(k), vl = strlen(v);
        int ok = kl > 0 && kl < 64 && vl < 128 &&
                 strspn(k, "abcdefghijklmnopqrstuvwxyz"
                           "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                           "0123456789_.-") == kl;
        for (size_t c = 0; ok && c < vl; c++)
            ok = v[c] > ' ' && v[c] <= '~';
        for (size_t x = 0; ok && x < i; x++)
            ok = strcmp(mb->model[x]->key, k) != 0;
        if (!ok)
            return ferry_errorf(FERRY_ERR_INVALID,
                                "Job: model key %zu ('%.63s'): keys of 1..63 bytes of "
                                "[A-Za-z0-9_.-], each once, values of up to 127 printable bytes "
                                "without spaces",
                                i, k);
        int w = snprintf(out + n, cap - n, "%s%s=%s", n ? " " : "", k, v);
        if (w < 0 || (size_t)w >= cap - n)
            return ferry_errorf(FERRY_ERR_INVALID, "Job: the model signature is over %zu bytes",
                                cap - 1);
        n += (size_t)w;
    }
    return FERRY_OK;
}

static const char *sync_mode_name(Ferry__V1__SyncMode m) {
    return m == FERRY__V1__SYNC_MODE__BSP   ? "bsp"
           : m == FERRY__V1__SYNC_MODE__SSP ? "ssp"
                                            : "async";
}

static ferry_status parse_sync(Ferry__V1__SyncMode m, ferry__ps_sync *out) {
    switch (m) {
    case FERRY__V1__SYNC_MODE__BSP:
        *out = FERRY__PS_BSP;
        return FERRY_OK;
    case FERRY__V1__SYNC_MODE__SSP:
        *out = FERRY__PS_SSP;
        return FERRY_OK;
    case FERRY__V1__SYNC_MODE__ASYNC:
        *out = FERRY__PS_ASYNC;
        return FERRY_OK;
    default:
        return ferry_errorf(FERRY_ERR_INVALID, "Job: unknown sync mode %d (BSP | SSP | ASYNC)",
                            (int)m);
    }
}

/* A member description, checked: world, rank, sync mode, model. */
static ferry_status member_check(const Ferry__V1__JobMember *mb, ferry__ps_sync *sync, char *model,
                                 size_t cap) {
    if (mb == NULL)
        return ferry_errorf(FERRY_ERR_INVALID, "Job: join and recover need `member`");
    if (mb->world < 1 || mb->world > JOB_MAX_WORLD)
        return ferry_errorf(FERRY_ERR_INVALID, "Job: world %u outside [1, %d]", mb->world,
                            JOB_MAX_WORLD);
    if (mb->rank >= mb->world)
        return ferry_errorf(FERRY_ERR_INVALID, "Job: rank %u outside [0, %u) (world %u)", mb->rank,
                            mb->world, mb->world);
    ferry_status st = parse_sync(mb->sync, sync);
    if (st == FERRY_OK && mb->elastic_min > mb->world)
        st = ferry_errorf(FERRY_ERR_INVALID,
                          "Job: an elastic job has 1 <= elastic_min (%u) <= world (%u)",
                          mb->elastic_min, mb->world);
    return st == FERRY_OK ? model_text(mb, model, cap) : st;
}

static ferry_status job_create(ferry__ps_jobs *j, const ferry__ps_session *sess, const char *name,
                               const Ferry__V1__JobMember *mb, ferry__ps_sync sync,
                               const char *model, ferry__ps_job **out) {
    const char *owner = sess->identity;
    if (j->count >= j->lim->jobs)
        return ferry_errorf(FERRY_ERR_RESOURCE,
                            "job '%s': %d jobs are held, the most this server holds (--max-jobs); "
                            "finished and abandoned ones are freed after %g s",
                            name, j->count, j->ttl_s);
    ferry_status st = sess->quota == NULL
                          ? FERRY_OK
                          : ferry__ps_quota_take(&sess->quota->jobs, j->lim->id_jobs, "jobs", owner,
                                                 "--max-jobs-per-identity");
    if (st != FERRY_OK)
        return st;
    size_t nchunks = (mb->world + JOB_CHUNK - 1) / JOB_CHUNK;
    ferry__ps_job *job = calloc(1, sizeof *job);
    if (job == NULL || (job->chunks = calloc(nchunks, sizeof *job->chunks)) == NULL) {
        free(job);
        if (sess->quota != NULL)
            atomic_fetch_sub(&sess->quota->jobs, 1);
        return FERRY_NOMEM();
    }
    job->quota = sess->quota;
    job->bytes = (int64_t)(sizeof *job + nchunks * sizeof *job->chunks);
    j->bytes += job->bytes;
    j->count++;
    job->idle_since = ferry_now();
    (void)snprintf(job->name, sizeof job->name, "%s", name);
    (void)snprintf(job->owner, sizeof job->owner, "%s", owner);
    job->world = mb->world;
    job->el_min = mb->elastic_min;
    job->sync = sync;
    job->K = sync == FERRY__PS_SSP ? mb->staleness : 0;
    job->wait_s = mb->sync_timeout_ms > 0 ? mb->sync_timeout_ms / 1000.0 : JOB_DEFAULT_WAIT_S;
    (void)snprintf(job->model, sizeof job->model, "%s", model);
    job->next = j->list;
    j->list = job;
    char mode[32];
    sync_text(job, mode, sizeof mode);
    if (job->el_min > 0)
        FERRY_LOG_INFO("job '%s' of '%s': elastic, %u..%u members, %s, sync timeout %.1f s",
                       job->name, job->owner, job->el_min, job->world, mode, job->wait_s);
    else
        FERRY_LOG_INFO("job '%s' of '%s': world %u, %s, sync timeout %.1f s", job->name,
                       job->owner, job->world, mode, job->wait_s);
    *out = job;
    return FERRY_OK;
}

/* The job as a member describes it agrees with the job here: world, sync mode, model. */
static ferry_status member_agrees(const ferry__ps_job *job, const Ferry__V1__JobMember *mb,
                                  ferry__ps_sync sync, const char *model) {
    char why[512];
    if (job->world != mb->world)
        return ferry_errorf(FERRY_ERR_EXISTS,
                            "job '%s' has world %u; this trainer says world %u (--world)",
                            job->name, job->world, mb->world);
    if (job->el_min != mb->elastic_min)
        return ferry_errorf(FERRY_ERR_EXISTS, "job '%s' is %s; this trainer's is %s (--elastic)",
                            job->name, job->el_min > 0 ? "elastic" : "not elastic",
                            mb->elastic_min > 0 ? "elastic" : "not elastic");
    if (job->sync != sync || job->K != (sync == FERRY__PS_SSP ? mb->staleness : 0)) {
        char have[32];
        sync_text(job, have, sizeof have);
        return ferry_errorf(FERRY_ERR_EXISTS, "job '%s' runs --sync %s; this trainer asks %s%s%.0u",
                            job->name, have, sync_mode_name(mb->sync),
                            sync == FERRY__PS_SSP ? ":" : "",
                            sync == FERRY__PS_SSP ? mb->staleness : 0u);
    }
    if (model_diff(job->model, model, why, sizeof why))
        return ferry_errorf(FERRY_ERR_EXISTS, "model differs from job '%s': %s", job->name, why);
    return FERRY_OK;
}

/* Rank r for session sess: free, its own already, or held by a session that has ended
 * or lost its Session stream (its trainer died: the rank is taken over). A rank held by
 * a live session stays with it. An admin's session never takes a rank over (it acts
 * for a rank without holding it). jobs->mu held. */
static ferry_status rank_claim(ferry__ps_state *ps, ferry__ps_job *job, uint32_t r,
                               const ferry__ps_session *sess, int *taken) {
    const job_rank *k = rank_peek(job, r);
    *taken = 0;
    if (k->joined && k->sess == sess->serial)
        return FERRY_OK;
    /* A session is one trainer: it holds at most one rank of a job (so a job's ranks,
     * and its memory, cost as many sessions as there are ranks). */
    for (uint32_t x = rank_skip(job, 0); x < job->world && !sess->authority;
         x = rank_skip(job, x + 1)) {
        const job_rank *o = rank_peek(job, x);
        if (x != r && o->joined && o->sess == sess->serial)
            return ferry_errorf(FERRY_ERR_INVALID,
                                "job '%s': this session holds rank %u already (a session holds "
                                "one rank of a job)",
                                job->name, x);
    }
    if (!k->joined)
        return FERRY_OK;
    if (k->sess != 0 && ferry__ps_session_holds(&ps->sessions, k->sess)) {
        if (sess->authority && strcmp(sess->identity, job->owner) != 0)
            return FERRY_OK; /* an admin acting for the rank: the holder keeps it */
        return ferry_errorf(FERRY_ERR_EXISTS,
                            "rank %u of job '%s' is held by another live session (two trainers "
                            "with one --rank?)",
                            r, job->name);
    }
    if (job->el_min > 0 && el_index(job, r) >= 0)
        return ferry_errorf(FERRY_ERR_EXISTS,
                            "rank %u of elastic job '%s' is a member whose trainer is gone; the "
                            "job drops it first",
                            r, job->name);
    *taken = 1;
    return FERRY_OK;
}

/* A leave of rank r by a session that does not hold it: allowed when nobody holds the
 * rank any more (its trainer died, or this server restarted and never saw it join),
 * so that a trainer restarted after its run's end can say it is done. The caller
 * checked that the session's identity owns the job. jobs->mu held. */
static int leave_unheld(ferry__ps_state *ps, const ferry__ps_job *job, uint32_t r) {
    const job_rank *k = rank_peek(job, r);
    return r < job->world && k->left == RANK_IN &&
           (!k->joined || k->sess == 0 || !ferry__ps_session_holds(&ps->sessions, k->sess));
}

/* ---- recovery ---- */

/* The file prefix of a job's checkpoints: its name with '/' and ':' as '_'. */
static void job_file_prefix(const char *job, char *out, size_t cap) {
    (void)snprintf(out, cap, "%s", job);
    for (char *p = out; *p != '\0'; p++)
        if (*p == '/' || *p == ':')
            *p = '_';
}

/* probe: this server's complete checkpoints of the job, and where its copy is. A job
 * unknown here is probed among the caller's identity's checkpoint files. */
static ferry_status job_probe(ferry__ps_state *ps, const ferry__ps_session *sess, const char *name,
                              ferry_rpc_msg *reply) {
    uint64_t *steps = NULL;
    size_t n = 0;
    char prefix[FERRY_RPC_NAME_MAX], owner[FERRY_RPC_IDENTITY_MAX];
    job_file_prefix(name, prefix, sizeof prefix);
    pthread_mutex_lock(&ps->jobs.mu);
    ferry__ps_job *job = job_find(&ps->jobs, name);
    int mine = job == NULL || ferry__ps_may_use(sess, job->owner);
    (void)snprintf(owner, sizeof owner, "%s", job != NULL ? job->owner : sess->identity);
    pthread_mutex_unlock(&ps->jobs.mu);
    if (!mine)
        return not_yours(name);
    ferry_status st = FERRY_OK;
    if (ps->checkpoint_dir[0] != '\0')
        st = ferry__ps_checkpoint_job_steps(ps->checkpoint_dir, &ps->manifest, prefix,
                                            job == NULL && sess->authority ? NULL : owner, &steps,
                                            &n);
    if (st != FERRY_OK)
        return st;
    Ferry__V1__JobReply r;
    ferry__v1__job_reply__init(&r);
    r.checkpoints = steps;
    r.n_checkpoints = n;
    r.can_checkpoint = ps->checkpoint_dir[0] != '\0';
    pthread_mutex_lock(&ps->jobs.mu);
    job = job_find(&ps->jobs, name); /* looked up again: it may have been made meanwhile */
    if (job != NULL && !ferry__ps_may_use(sess, job->owner)) {
        pthread_mutex_unlock(&ps->jobs.mu);
        free(steps);
        return not_yours(name);
    }
    if (job != NULL && job->sync == FERRY__PS_BSP && job->applied > 0) {
        r.has_state = 1;
        r.state_step = job->applied;
    } else if (job != NULL && job->sync != FERRY__PS_BSP && job_min_steps(job, NULL) > 0) {
        r.has_state = 1;
        r.state_step = job_min_steps(job, NULL);
    } else if (ps->restored[0] != '\0') {
        r.has_state = 1;
        r.state_step = ps->restored_step;
    } else if (job != NULL) {
        r.has_state = job->ready;
    }
    if (job != NULL) {
        r.rolling_back = job->recovering;
        r.finished = job->finished;
        for (uint32_t x = rank_skip(job, 0); x < job->world; x = rank_skip(job, x + 1)) {
            const job_rank *k = rank_peek(job, x);
            if (k->left == RANK_COMPLETED && k->steps > r.completed_step)
                r.completed_step = k->steps;
        }
    }
    pthread_mutex_unlock(&ps->jobs.mu);
    st = ferry_rpc_msg_set_head(reply, &r.base);
    free(steps);
    return st;
}

static void steps_text(const uint64_t *s, size_t n, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && k + 24 < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%llu", i ? "," : "", (unsigned long long)s[i]);
    if (n == 0)
        (void)snprintf(buf, cap, "none");
}

/* The intersection of the steps the ranks offered so far with a newly arrived rank's
 * offer, in place: sorted, then merged, n log n in what was sent. */
static int cmp_step(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static ferry_status rec_offer(ferry__ps_job *job, const uint64_t *offer, size_t n) {
    uint64_t *mine = malloc((n ? n : 1) * sizeof *mine);
    if (mine == NULL)
        return FERRY_NOMEM();
    if (n > 0) /* an empty repeated field is a NULL array */
        memcpy(mine, offer, n * sizeof *mine);
    qsort(mine, n, sizeof *mine, cmp_step);
    if (job->rec_arrived == 0) {
        free(job->rec_set);
        job->rec_set = mine;
        job->rec_n = n;
        return FERRY_OK;
    }
    size_t a = 0, b = 0, m = 0;
    while (a < job->rec_n && b < n) {
        if (job->rec_set[a] < mine[b])
            a++;
        else if (mine[b] < job->rec_set[a])
            b++;
        else {
            job->rec_set[m++] = job->rec_set[a];
            a++, b++;
        }
    }
    job->rec_n = m;
    free(mine);
    return FERRY_OK;
}

/* 1 when rank r, which did not send recover, completed a run that ends where the
 * recovering ranks' runs end: it takes part in the barrier as arrived, offering that
 * step alone. jobs->mu held. */
static int rec_completed(const ferry__ps_job *job, uint32_t r) {
    const job_rank *k = rank_peek(job, r);
    return !k->rec_arrived && k->left == RANK_COMPLETED && job->rec_last != 0 &&
           k->steps == job->rec_last;
}

/* The ranks that take part in the open barrier: arrived, or completed as above. */
static uint32_t rec_present(const ferry__ps_job *job) {
    uint32_t n = job->rec_arrived;
    for (uint32_t r = rank_skip(job, 0); r < job->world; r = rank_skip(job, r + 1))
        n += rec_completed(job, r);
    return n;
}

/* A recover by `rank` cannot succeed when another rank left the job early and the
 * job is still running (a finished job may be resumed by all its ranks): it is not
 * coming back. Fails the open barrier too; FERRY_ERR_ABORTED naming the rank and its
 * reason, FERRY_OK otherwise. jobs->mu held. */
static ferry_status rec_refused(ferry__ps_job *job, uint32_t rank) {
    if (job->finished)
        return FERRY_OK;
    for (uint32_t r = rank_skip(job, 0); r < job->world; r = rank_skip(job, r + 1)) {
        char why[400], msg[512];
        if (r == rank || rank_peek(job, r)->left != RANK_LEFT_EARLY)
            continue;
        (void)rank_absent(job, r, why, sizeof why);
        (void)snprintf(msg, sizeof msg, "job '%s' cannot roll back: %s", job->name, why);
        if (job->recovering)
            rec_fail(job, FERRY_ERR_ABORTED, msg);
        return ferry_errorf(FERRY_ERR_ABORTED, "%s", msg);
    }
    return FERRY_OK;
}

/* recover: a barrier of all ranks; the last one rolls the job back. Called with
 * jobs->mu held. */
static ferry_status job_recover(ferry__ps_state *ps, ferry__ps_job *job,
                                const ferry__ps_session *sess, const Ferry__V1__JobRecover *q,
                                int taken, ferry_rpc_msg *reply) {
    uint32_t rank = q->member->rank;
    ferry_status gone = rec_refused(job, rank);
    if (gone != FERRY_OK)
        return gone;
    job_rank *k = rank_make(&ps->jobs, job, rank);
    if (k == NULL)
        return FERRY_NOMEM();
    if (!job->recovering) {
        char why[256];
        (void)snprintf(why, sizeof why,
                       "job '%s' is rolling back to a checkpoint (rank %u recovers): recover too",
                       job->name, rank);
        FERRY_LOG_WARN("job '%s': rank %u asks to roll back; waiting for all %u ranks", job->name,
                       rank, job->world);
        job_fail_waiters(job, FERRY_ERR_BUSY, why);
        agg_free(job);
        job->recovering = 1;
        job->rec_since = ferry_now();
        job->rec_last = q->last_step;
    }
    if (k->rec != NULL) { /* a retry from the same rank replaces its first call */
        (void)ferry_errorf(FERRY_ERR_BUSY, "replaced by a newer recover call of rank %u", rank);
        ferry_rpc_pending_finish(k->rec, FERRY_ERR_BUSY, NULL);
        k->rec = NULL;
    }
    /* An offer newer than every step offered so far that meets none of them is a newer
     * roll-back (a replica's re-admission after the one its ranks gave up on: a rank
     * could not reach it): the arrivals of the older one are withdrawn, so that their
     * ranks, who went on, do not hold this one. */
    uint64_t newest = 0;
    int meets = 0;
    for (size_t i = 0; i < q->n_checkpoints; i++) {
        newest = q->checkpoints[i] > newest ? q->checkpoints[i] : newest;
        meets |= job->rec_n > 0 && bsearch(&q->checkpoints[i], job->rec_set, job->rec_n,
                                           sizeof *job->rec_set, cmp_step) != NULL;
    }
    if (job->rec_arrived > 0 && !meets && q->n_checkpoints > 0 && job->rec_n > 0 &&
        newest > job->rec_set[job->rec_n - 1]) {
        char why[160];
        (void)snprintf(why, sizeof why,
                       "job '%s': a newer roll-back (to step %llu, rank %u) replaced this one",
                       job->name, (unsigned long long)newest, rank);
        FERRY_LOG_WARN("%s", why);
        for (uint32_t r = rank_skip(job, 0); r < job->world; r = rank_skip(job, r + 1)) {
            job_rank *w = rank_get(job, r);
            if (w != NULL && w->rec != NULL && w != k) {
                (void)ferry_errorf(FERRY_ERR_BUSY, "%s", why);
                ferry_rpc_pending_finish(w->rec, FERRY_ERR_BUSY, NULL);
                w->rec = NULL;
            }
            if (w != NULL)
                w->rec_arrived = 0;
        }
        job->rec_arrived = 0;
        job->rec_n = 0;
        job->rec_since = ferry_now();
        job->rec_last = q->last_step;
    }
    /* The steps every rank offered: the intersection. */
    if (!k->rec_arrived) {
        ferry_status st = rec_offer(job, q->checkpoints, q->n_checkpoints);
        if (st != FERRY_OK)
            return st;
        k->rec_arrived = 1;
        job->rec_arrived++;
    }
    /* Who holds the rank after the roll-back: this session, unless an admin acts for
     * a rank that a live session of the owner holds. */
    k->rec_sess =
        taken || !k->joined || k->sess == sess->serial || !sess->authority ? sess->serial : k->sess;
    if (rec_present(job) < job->world) {
        ferry_rpc_pending *p = ferry_rpc_defer(reply);
        if (p == NULL)
            return ferry_errorf(FERRY_ERR_UNSUPPORTED, "recover must wait, and this call cannot");
        k->rec = p;
        return FERRY_OK;
    }
    if (rec_present(job) > job->rec_arrived) { /* ranks that completed offer their end only */
        int has = bsearch(&job->rec_last, job->rec_set, job->rec_n, sizeof job->rec_last,
                          cmp_step) != NULL;
        job->rec_n = has ? 1 : 0;
        if (has)
            job->rec_set[0] = job->rec_last;
    }
    /* The last rank: the newest step everyone offered that this server holds. */
    uint64_t *mine = NULL;
    size_t nmine = 0;
    char prefix[FERRY_RPC_NAME_MAX], why[600], a[200], b[200];
    job_file_prefix(job->name, prefix, sizeof prefix);
    ferry_status st = ferry__ps_checkpoint_job_steps(ps->checkpoint_dir, &ps->manifest, prefix,
                                                     job->owner, &mine, &nmine);
    uint64_t best = 0;
    int have = 0;
    for (size_t i = 0; st == FERRY_OK && i < nmine; i++) { /* both ascending: merge */
        uint64_t s = mine[i];
        if (bsearch(&s, job->rec_set, job->rec_n, sizeof s, cmp_step) != NULL) {
            best = s;
            have = 1;
        }
    }
    char file[FERRY_RPC_NAME_MAX + 48], path[1024 + FERRY_RPC_NAME_MAX + 64];
    if (st == FERRY_OK && !have) {
        steps_text(job->rec_set, job->rec_n, a, sizeof a);
        steps_text(mine, nmine, b, sizeof b);
        st = ferry_errorf(FERRY_ERR_NOT_FOUND,
                          "job '%s' cannot roll back: no checkpoint every process has (the ranks "
                          "offer steps %s; this server holds %s in %s)",
                          job->name, a, b, ps->checkpoint_dir);
    }
    free(mine);
    if (st == FERRY_OK) {
        (void)snprintf(file, sizeof file, "%s-step%llu.ckpt", prefix, (unsigned long long)best);
        (void)snprintf(path, sizeof path, "%s/%s", ps->checkpoint_dir, file);
        pthread_mutex_lock(&ps->checkpoint_mu);
        st = ferry__ps_checkpoint_read(&ps->reg, &ps->quotas, path, job->owner, NULL);
        ps->ck_done[0] = '\0'; /* parameters rolled back: no Checkpoint is a repeat now */
        (void)ferry__ps_checkpoint_sweep_temps(ps->checkpoint_dir, prefix);
        pthread_mutex_unlock(&ps->checkpoint_mu);
    }
    if (st != FERRY_OK) {
        (void)snprintf(why, sizeof why, "%s", ferry_error_last());
        FERRY_LOG_ERROR("%s", why);
        rec_fail(job, st, why);
        return ferry_errorf(st, "%s", why);
    }
    /* Every rank is a member again, at step `best`, held by the session that recovered
     * it. */
    for (uint32_t r = 0; r < job->world; r++) {
        job_rank *w = rank_get(job, r); /* every rank took part: its chunk exists */
        int done = rec_completed(job, r); /* it stays out, done at `best` */
        w->joined = 1;
        w->left = done ? RANK_COMPLETED : RANK_IN;
        w->gone = RANK_HELD;
        w->steps = best;
        w->arrived = 0;
        w->sess = done ? 0 : w->rec_sess;
    }
    job->joined = job->world;
    job->ready = 1;
    job->finished = 0;
    job->failed[0] = '\0';
    job->early_why[0] = '\0';
    job->bsp_step = best;
    job->bsp_complete = 0;
    job->arrived = 0;
    job->sum_rank = 0;
    kept_clear(job);
    job->applied = best;
    job->applied_scale = 0.0;
    job->recoveries++;
    (void)snprintf(ps->restored, sizeof ps->restored, "%s", path);
    ps->restored_step = best;
    FERRY_LOG_WARN("job '%s' rolled back to step %llu (%s) after %.1f s; all %u ranks resume",
                   job->name, (unsigned long long)best, path, ferry_now() - job->rec_since,
                   job->world);
    Ferry__V1__JobReply r;
    ferry__v1__job_reply__init(&r);
    r.ready = 1;
    r.joined = job->world;
    r.world = job->world;
    r.min_step = best;
    r.resume_step = best;
    r.resume_file = file;
    for (uint32_t x = 0; x < job->world; x++) {
        job_rank *w = rank_get(job, x);
        if (w->rec == NULL)
            continue;
        ferry_rpc_msg m;
        ferry_rpc_msg_init(&m);
        ferry_status ws = ferry_rpc_msg_set_head(&m, &r.base);
        ferry_rpc_pending_finish(w->rec, ws, &m);
        w->rec = NULL;
    }
    st = ferry_rpc_msg_set_head(reply, &r.base);
    for (uint32_t x = 0; x < job->world; x++)
        rank_get(job, x)->rec_arrived = 0;
    job->recovering = 0;
    job->rec_arrived = 0;
    free(job->rec_set);
    job->rec_set = NULL;
    job->rec_n = 0;
    return st;
}

/* A rank leaves (reason "" : it completed its run; step: its last step, 0 for the
 * count here): bsp cannot complete a step it has not reached, so waiting ranks fail
 * now rather than at the timeout, and so does an open recover barrier if it left
 * early; ssp stops counting it. */
static void job_leave(ferry__ps_job *job, uint32_t rank, const char *reason, uint64_t step);
static void ssp_release(ferry__ps_job *job);

/* The coordinator's servers into a reply: the list a move holds the members for, else
 * the committed one; targets[MV_TARGETS] point into *copy (free it after packing). */
static ferry_status servers_reply(const ferry__ps_job *job, Ferry__V1__JobReply *r, char **targets,
                                  char **copy) {
    r->servers_epoch = job->srv_epoch;
    r->moving = job->mv_state == MV_HOLD;
    r->move_step = r->moving ? job->mv_step : 0;
    const char *from = r->moving ? job->mv_list : job->srv_list;
    *copy = NULL;
    if (from != NULL && (*copy = strdup(from)) == NULL)
        return FERRY_NOMEM();
    char *save = NULL;
    r->n_servers = 0;
    for (char *t = *copy != NULL ? strtok_r(*copy, ",", &save) : NULL;
         t != NULL && r->n_servers < MV_TARGETS; t = strtok_r(NULL, ",", &save))
        targets[r->n_servers++] = t;
    r->servers = targets;
    return FERRY_OK;
}

/* The job's state into a reply (join, ready, leave, status). jobs->mu held. */
static void state_reply(const ferry__ps_job *job, Ferry__V1__JobReply *r) {
    r->ready = job->ready;
    r->joined = job->joined;
    r->world = job->world;
    r->finished = job->finished;
    r->min_step = job_min_steps(job, NULL);
    if (job->sync == FERRY__PS_BSP) {
        r->bsp_step = job->bsp_step;
        r->bsp_arrived = job->bsp_complete ? 0 : job->arrived;
    }
    r->elastic_min = job->el_min;
    r->applied = job->applied;
    r->epoch = job->epoch > 0 ? job->epoch : job->bar_epoch;
    r->members = job->members; /* the coordinator's */
    r->n_members = job->nmembers;
    r->epoch_step = job->ep_step;
}

/* checkpoint: the job's checkpoint of a step, written outside the jobs lock. */
static ferry_status job_checkpoint(ferry__ps_state *ps, const ferry__ps_session *sess,
                                   const char *name, const Ferry__V1__JobCheckpoint *q,
                                   ferry_rpc_msg *reply) {
    char owner[FERRY_RPC_IDENTITY_MAX], file[FERRY_RPC_NAME_MAX + 48];
    pthread_mutex_lock(&ps->jobs.mu);
    ferry__ps_job *job = job_find(&ps->jobs, name);
    ferry_status st = FERRY_OK;
    if (job == NULL)
        st = ferry_errorf(FERRY_ERR_NOT_FOUND, "job '%.63s' is unknown here (Join it first)", name);
    else if (!ferry__ps_may_use(sess, job->owner))
        st = not_yours(name);
    else if (q->rank >= job->world || !acts_as(sess, job, q->rank))
        st = not_held(job, q->rank);
    else if (q->incarnation != 0 && q->incarnation != ps->incarnation)
        st = ferry_errorf(FERRY_ERR_NOT_FOUND,
                          "this ferry-ps restarted: it is incarnation %016llx, the caller's "
                          "step ran against %016llx (its state is a restored one)",
                          (unsigned long long)ps->incarnation, (unsigned long long)q->incarnation);
    if (st == FERRY_OK) {
        (void)snprintf(owner, sizeof owner, "%s", job->owner);
        char prefix[FERRY_RPC_NAME_MAX];
        job_file_prefix(name, prefix, sizeof prefix);
        (void)snprintf(file, sizeof file, "%s-step%llu.ckpt", prefix, (unsigned long long)q->step);
    }
    pthread_mutex_unlock(&ps->jobs.mu);
    if (st != FERRY_OK)
        return st;
    char path[1280];
    uint64_t bytes = 0;
    if ((st = ferry__ps_checkpoint_named(ps, file, owner, q->step, path, sizeof path, &bytes)) !=
        FERRY_OK)
        return st;
    Ferry__V1__JobReply r;
    ferry__v1__job_reply__init(&r);
    r.checkpoint_path = path;
    r.checkpoint_bytes = bytes;
    return ferry_rpc_msg_set_head(reply, &r.base);
}

/* join, ready, leave, status and recover: under the jobs lock. */
static ferry_status job_member_call(ferry__ps_state *ps, const ferry__ps_session *sess,
                                    const Ferry__V1__JobRequest *q, ferry_rpc_msg *reply) {
    const Ferry__V1__JobMember *mb = q->action_case == FERRY__V1__JOB_REQUEST__ACTION_JOIN
                                         ? (q->join != NULL ? q->join->member : NULL)
                                     : q->action_case == FERRY__V1__JOB_REQUEST__ACTION_RECOVER
                                         ? (q->recover != NULL ? q->recover->member : NULL)
                                         : NULL;
    int joining = q->action_case == FERRY__V1__JOB_REQUEST__ACTION_JOIN;
    int recovering = q->action_case == FERRY__V1__JOB_REQUEST__ACTION_RECOVER;
    int leaving = q->action_case == FERRY__V1__JOB_REQUEST__ACTION_LEAVE;
    ferry__ps_sync sync = FERRY__PS_BSP;
    char *model = NULL;
    ferry_status st = FERRY_OK;
    if (joining || recovering) {
        if ((model = malloc(JOB_MODEL_MAX)) == NULL)
            return FERRY_NOMEM();
        st = member_check(mb, &sync, model, JOB_MODEL_MAX);
    }
    if (st != FERRY_OK) {
        free(model);
        return st;
    }
    ferry__ps_jobs *j = &ps->jobs;
    pthread_mutex_lock(&j->mu);
    ferry__ps_job *job = job_find(j, q->job);
    if (job == NULL && !joining && !recovering)
        st = ferry_errorf(FERRY_ERR_NOT_FOUND, "job '%s' is unknown here (Join it first)", q->job);
    else if (job == NULL && j->stopped)
        st = ferry_errorf(FERRY_ERR_UNAVAILABLE, "ferry-ps is shutting down");
    else if (job == NULL && recovering && ps->checkpoint_dir[0] == '\0') /* nothing made */
        st = ferry_errorf(FERRY_ERR_UNSUPPORTED,
                          "job '%s' cannot roll back here: this ferry-ps has no --checkpoint-dir",
                          q->job);
    else if (job == NULL)
        st = job_create(j, sess, q->job, mb, sync, model, &job);
    else if (!ferry__ps_may_use(sess, job->owner))
        st = not_yours(q->job);
    else if (joining && job->finished) { /* a new run of the name (e.g. --load): anew */
        FERRY_LOG_INFO("job '%s' of '%s': finished earlier (all %u ranks left); a join starts "
                       "it anew",
                       job->name, job->owner, job->world);
        job_drop(j, job, FERRY_ERR_NOT_FOUND, "the job finished");
        st = job_create(j, sess, q->job, mb, sync, model, &job);
    }
    if (st == FERRY_OK && recovering && j->stopped)
        st = ferry_errorf(FERRY_ERR_UNAVAILABLE, "ferry-ps is shutting down");

    if (st == FERRY_OK && mb != NULL)
        st = member_agrees(job, mb, sync, model);
    free(model);
    if (st == FERRY_OK && job->finished && !recovering &&
        q->action_case != FERRY__V1__JOB_REQUEST__ACTION_STATUS &&
        q->action_case != FERRY__V1__JOB_REQUEST__ACTION_LEAVE) /* (sent again: a no-op) */
        st = ferry_errorf(FERRY_ERR_INVALID,
                          "job '%s' has finished (all %u ranks left); a join starts it anew",
                          job->name, job->world);
    if (st == FERRY_OK && job->failed[0] != '\0' && !recovering &&
        q->action_case != FERRY__V1__JOB_REQUEST__ACTION_LEAVE &&
        q->action_case != FERRY__V1__JOB_REQUEST__ACTION_STATUS)
        /* a failed job's ranks leave, or roll it back */
        st = ferry_errorf(FERRY_ERR_TIMEOUT, "%s", job->failed);
    uint32_t rank = mb != NULL                                               ? mb->rank
                    : q->action_case == FERRY__V1__JOB_REQUEST__ACTION_READY ? q->ready->rank
                    : q->action_case == FERRY__V1__JOB_REQUEST__ACTION_LEAVE ? q->leave->rank
                                                                             : 0;
    int taken = 0;
    if (st == FERRY_OK && (joining || recovering))
        st = rank_claim(ps, job, rank, sess, &taken);
    if (st == FERRY_OK && recovering && ps->checkpoint_dir[0] == '\0')
        st = ferry_errorf(FERRY_ERR_UNSUPPORTED,
                          "job '%s' cannot roll back here: this ferry-ps has no --checkpoint-dir",
                          q->job);
    if (st == FERRY_OK && recovering) {
        if (taken)
            FERRY_LOG_WARN("job '%s': rank %u taken over by a new session of '%s' (its last "
                           "holder is gone)",
                           job->name, rank, sess->identity);
        st = job_recover(ps, job, sess, q->recover, taken, reply);
        pthread_mutex_unlock(&j->mu);
        return st;
    }
    job_rank *k = st == FERRY_OK && rank < job->world
                      ? (joining || leaving ? rank_make(j, job, rank) : rank_get(job, rank))
                      : NULL;
    if (st == FERRY_OK && (joining || leaving) && k == NULL && rank < job->world)
        st = FERRY_NOMEM();
    if (st == FERRY_OK && joining) {
        if (k->joined && k->left && job->el_min > 0 && el_index(job, rank) < 0) {
            k->left = RANK_IN; /* an elastic job's rank that left is free again */
            taken = 1;
        }
        if (k->joined && k->left)
            st = ferry_errorf(FERRY_ERR_EXISTS, "rank %u of job '%s' has already finished", rank,
                              job->name);
        else if (!k->joined || taken) {
            if (!k->joined)
                job->joined++;
            k->joined = 1;
            if (!sess->authority || strcmp(sess->identity, job->owner) == 0 || taken)
                k->sess = sess->serial;
            k->gone = RANK_HELD;
            k->leave_after = 0;
            FERRY_LOG_INFO("job '%s': rank %u %s (session #%llu), %u of %u", job->name, rank,
                           taken ? "taken over by a new session" : "joined",
                           (unsigned long long)sess->serial, job->joined, job->world);
        } else if (k->sess == sess->serial && k->gone == RANK_STREAM_CLOSED) {
            /* Its holder joins again after its connection broke: it is here. */
            k->gone = RANK_HELD;
            FERRY_LOG_INFO("job '%s': rank %u is back (session #%llu: its connection broke "
                           "and came back)",
                           job->name, rank, (unsigned long long)sess->serial);
        }
    } else if (st == FERRY_OK && q->action_case != FERRY__V1__JOB_REQUEST__ACTION_STATUS) {
        if (rank >= job->world)
            st = ferry_errorf(FERRY_ERR_INVALID, "job '%s': rank %u outside [0, %u)", job->name,
                              rank, job->world);
        else if (leaving && leave_unheld(ps, job, rank))
            job_leave(job, rank, q->leave->reason, q->leave->step);
        else if (!acts_as(sess, job, rank))
            st = not_held(job, rank);
        else if (k == NULL || !k->joined) /* an admin acting for a rank */
            st = ferry_errorf(FERRY_ERR_INVALID, "job '%s': rank %u has not joined", job->name,
                              rank);
        else if (q->action_case == FERRY__V1__JOB_REQUEST__ACTION_READY && rank != 0)
            st = ferry_errorf(FERRY_ERR_INVALID, "job '%s': only rank 0 says ready", job->name);
        else if (q->action_case == FERRY__V1__JOB_REQUEST__ACTION_READY)
            job->ready = 1;
        else if (!k->left)
            job_leave(job, rank, q->leave->reason, q->leave->step);
    }
    Ferry__V1__JobReply r;
    ferry__v1__job_reply__init(&r);
    if (st == FERRY_OK) { /* packed under the lock: it points into the job */
        char *targets[MV_TARGETS], *copy = NULL;
        state_reply(job, &r);
        if ((st = servers_reply(job, &r, targets, &copy)) == FERRY_OK)
            st = ferry_rpc_msg_set_head(reply, &r.base);
        free(copy);
    }
    pthread_mutex_unlock(&j->mu);
    return st;
}

/* drop: the owner (or an admin) ends the job here at once; its waiting calls fail. */
static ferry_status job_drop_call(ferry__ps_state *ps, const ferry__ps_session *sess,
                                  const char *name, ferry_rpc_msg *reply) {
    ferry__ps_jobs *j = &ps->jobs;
    pthread_mutex_lock(&j->mu);
    ferry__ps_job *job = job_find(j, name);
    ferry_status st = job == NULL
                          ? ferry_errorf(FERRY_ERR_NOT_FOUND, "job '%s' is unknown here", name)
                      : !ferry__ps_may_use(sess, job->owner) ? not_yours(name)
                                                             : FERRY_OK;
    Ferry__V1__JobReply r;
    ferry__v1__job_reply__init(&r);
    if (st == FERRY_OK) {
        char why[FERRY_RPC_NAME_MAX + 64];
        (void)snprintf(why, sizeof why, "job '%s' was dropped", job->name);
        FERRY_LOG_WARN("job '%s' of '%s' dropped by '%s' (%u of %u ranks joined)", job->name,
                       job->owner, sess->identity, job->joined, job->world);
        r.world = job->world;
        r.joined = job->joined;
        job_drop(j, job, FERRY_ERR_BUSY, why);
    }
    pthread_mutex_unlock(&j->mu);
    return st != FERRY_OK ? st : ferry_rpc_msg_set_head(reply, &r.base);
}

/* The member check of fetch and install: the job known here is the caller's and the
 * session holds `rank`; a job unknown here (a fresh replica) is the caller's own.
 * Fills the job's checkpoint file name of `step` and the owner its file must name. */
static ferry_status replica_call_check(ferry__ps_state *ps, const ferry__ps_session *sess,
                                       const char *name, uint32_t rank, uint64_t step, int known,
                                       char *file, size_t cap, char *owner) {
    pthread_mutex_lock(&ps->jobs.mu);
    ferry__ps_job *job = job_find(&ps->jobs, name);
    ferry_status st = FERRY_OK;
    if (job == NULL && known)
        st = ferry_errorf(FERRY_ERR_NOT_FOUND, "job '%.63s' is unknown here (Join it first)", name);
    else if (job != NULL && !ferry__ps_may_use(sess, job->owner))
        st = not_yours(name);
    else if (job != NULL && known && (rank >= job->world || !acts_as(sess, job, rank)))
        st = not_held(job, rank);
    else if (ps->checkpoint_dir[0] == '\0') /* who asks is checked first */
        st = ferry_errorf(FERRY_ERR_UNSUPPORTED,
                          "job '%s': this ferry-ps has no --checkpoint-dir to hold a replica's "
                          "checkpoint",
                          name);
    if (st == FERRY_OK) {
        (void)snprintf(owner, FERRY_RPC_IDENTITY_MAX, "%s",
                       job != NULL ? job->owner : sess->identity);
        char prefix[FERRY_RPC_NAME_MAX];
        job_file_prefix(name, prefix, sizeof prefix);
        (void)snprintf(file, cap, "%s/%s-step%llu.ckpt", ps->checkpoint_dir, prefix,
                       (unsigned long long)step);
    }
    pthread_mutex_unlock(&ps->jobs.mu);
    return st;
}

/* fetch: a checkpoint file's bytes, verified first, for a replica that re-joins. */
static ferry_status job_fetch(ferry__ps_state *ps, const ferry__ps_session *sess, const char *name,
                              const Ferry__V1__JobFetch *q, ferry_rpc_msg *reply) {
    char path[1280], owner[FERRY_RPC_IDENTITY_MAX], fowner[FERRY_RPC_IDENTITY_MAX];
    ferry_status st =
        replica_call_check(ps, sess, name, q->rank, q->step, 1, path, sizeof path, owner);
    uint64_t step = 0;
    pthread_mutex_lock(&ps->checkpoint_mu); /* not while one is written */
    if (st == FERRY_OK && (st = ferry__ps_checkpoint_verify(path, &step, fowner)) == FERRY_OK &&
        (step != q->step || strcmp(fowner, owner) != 0))
        st = ferry_errorf(FERRY_ERR_FORMAT, "%s holds step %llu of '%s', not step %llu of '%s'",
                          path, (unsigned long long)step, fowner, (unsigned long long)q->step,
                          owner);
    uint8_t *data = NULL;
    size_t len = 0;
    if (st == FERRY_OK) {
        FILE *f = fopen(path, "rb");
        long end = -1;
        if (f != NULL && fseek(f, 0, SEEK_END) == 0 && (end = ftell(f)) > 0 &&
            fseek(f, 0, SEEK_SET) == 0 && (data = malloc((size_t)end)) != NULL &&
            fread(data, 1, (size_t)end, f) == (size_t)end)
            len = (size_t)end;
        else
            st = data == NULL && end > 0 ? FERRY_NOMEM()
                                         : ferry_errorf(FERRY_ERR_IO, "%s: cannot read it", path);
        if (f != NULL)
            fclose(f);
    }
    pthread_mutex_unlock(&ps->checkpoint_mu);
    if (st == FERRY_OK) {
        Ferry__V1__JobReply r;
        ferry__v1__job_reply__init(&r);
        r.checkpoint_data.data = data;
        r.checkpoint_data.len = len;
        r.checkpoint_path = path;
        r.checkpoint_bytes = len;
        st = ferry_rpc_msg_set_head(reply, &r.base);
        FERRY_LOG_INFO("job '%s': sent %s (%zu bytes) for a replica that re-joins", name, path,
                       len);
    }
    free(data);
    return st;
}

/* install: a sibling replica's checkpoint becomes this server's file of that step. The
 * bytes are the caller's, so the file is taken only when it and every module in it
 * belong to the job's owner (the caller's identity for a job unknown here), and it
 * replaces only a file of that owner's; the recover that restores it checks the owner
 * again. It takes a token of --checkpoint-rate, as a written checkpoint does. */
static ferry_status job_install(ferry__ps_state *ps, const ferry__ps_session *sess,
                                const char *name, const Ferry__V1__JobInstall *q,
                                ferry_rpc_msg *reply) {
    char path[1280], tmp[1300], owner[FERRY_RPC_IDENTITY_MAX], fowner[FERRY_RPC_IDENTITY_MAX];
    ferry_status st =
        replica_call_check(ps, sess, name, q->rank, q->step, 0, path, sizeof path, owner);
    if (st != FERRY_OK)
        return st;
    const char *base = strrchr(path, '/');
    (void)snprintf(tmp, sizeof tmp, "%.*s/.%s.XXXXXX", (int)(base - path), path, base + 1);
    pthread_mutex_lock(&ps->checkpoint_mu);
    uint64_t step = 0;
    struct stat sb;
    if (stat(path, &sb) == 0 && ferry__ps_checkpoint_verify(path, &step, fowner) == FERRY_OK &&
        strcmp(fowner, owner) != 0)
        st = ferry_errorf(FERRY_ERR_DENIED, "job '%s': %s is another identity's checkpoint", name,
                          path);
    if (st == FERRY_OK)
        st = ferry__ps_checkpoint_take_token(ps);
    int fd = -1;
    if (st == FERRY_OK && (fd = mkostemp(tmp, O_CLOEXEC)) < 0)
        st = ferry_errorf(errno == ENOSPC ? FERRY_ERR_RESOURCE : FERRY_ERR_IO, "%s: %s", tmp,
                          strerror(errno));
    for (size_t off = 0; st == FERRY_OK && off < q->data.len;) {
        ssize_t w = write(fd, q->data.data + off, q->data.len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            st = ferry_errorf(errno == ENOSPC ? FERRY_ERR_RESOURCE : FERRY_ERR_IO, "%s: %s", tmp,
                              strerror(errno));
        else
            off += (size_t)w;
    }
    if (st == FERRY_OK && fsync(fd) != 0)
        st = ferry_errorf(FERRY_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
    if (fd >= 0)
        close(fd);
    if (st == FERRY_OK && (st = ferry__ps_checkpoint_check_owner(tmp, owner, &step)) == FERRY_OK &&
        step != q->step)
        st = ferry_errorf(FERRY_ERR_FORMAT, "the checkpoint sent holds step %llu, not %llu",
                          (unsigned long long)step, (unsigned long long)q->step);
    if (st == FERRY_OK && rename(tmp, path) != 0)
        st = ferry_errorf(FERRY_ERR_IO, "%s: rename: %s", path, strerror(errno));
    if (st != FERRY_OK && fd >= 0)
        (void)unlink(tmp);
    if (st == FERRY_OK) {
        ps->ck_done[0] = '\0'; /* no Checkpoint of that name is a repeat now */
        int dfd = open(ps->checkpoint_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            (void)fsync(dfd);
            close(dfd);
        }
        /* Installed files count against --checkpoint-keep as written ones do: no
         * client grows the directory past it. */
        ferry__ps_checkpoint_retain(ps->checkpoint_dir, base + 1, ps->checkpoint_keep);
    }
    pthread_mutex_unlock(&ps->checkpoint_mu);
    if (st != FERRY_OK)
        return st;
    FERRY_LOG_INFO("job '%s': installed %s (%zu bytes, verified) from a sibling replica", name,
                   path, q->data.len);
    Ferry__V1__JobReply r;
    ferry__v1__job_reply__init(&r);
    r.checkpoint_path = path;
    r.checkpoint_bytes = q->data.len;
    return ferry_rpc_msg_set_head(reply, &r.base);
}

/* ---- elastic jobs (JobMember.elastic_min > 0; proto: JobElastic) ----
 * Every server's bsp barrier waits for the members a step's GradNorms name (its
 * epoch); the coordinator (the server the trainers' JobElastic calls go to) keeps
 * the membership, each column's carried state and the trainers' progress, and moves
 * the membership on at a step boundary (joins, leaves) or for a step that a member
 * will not finish (REDO). */

#define EL_COL_MAX   (1u << 20)   /* bytes of one column's carried state */
#define EL_STATE_MAX (256ll << 20) /* of a job's columns, applied and put */
#define EL_PROG_MAX  4096          /* bytes of the trainers' progress */
#define EL_BATCH_MAX (1u << 20)    /* columns */

static void bin_free(ProtobufCBinaryData *b) {
    free(b->data);
    b->data = NULL;
    b->len = 0;
}

/* Charges (or gives back) delta bytes of the job's columns: its bytes and the jobs'. */
static void el_charge(ferry__ps_jobs *j, ferry__ps_job *job, int64_t delta) {
    job->col_bytes += delta;
    job->bytes += delta;
    j->bytes += delta;
}

/* *dst becomes a copy of src (freed first); *dst is unchanged when out of memory. */
static ferry_status bin_copy(ProtobufCBinaryData *dst, const ProtobufCBinaryData *src) {
    uint8_t *p = malloc(src->len);
    if (p == NULL)
        return FERRY_NOMEM();
    memcpy(p, src->data, src->len);
    free(dst->data);
    dst->data = p;
    dst->len = src->len;
    return FERRY_OK;
}

/* The put value *put becomes the applied one *applied (freed first), at step s. */
static void bin_apply(ProtobufCBinaryData *applied, uint64_t *applied_step,
                      ProtobufCBinaryData *put, uint64_t *put_step, uint64_t s) {
    free(applied->data);
    *applied = *put;
    *applied_step = s;
    put->data = NULL;
    put->len = 0;
    *put_step = 0;
}

static void el_free(ferry__ps_job *job) {
    for (uint32_t c = 0; job->cols != NULL && c < job->el_batch; c++) {
        bin_free(&job->cols[c].data);
        bin_free(&job->cols[c].p_data);
    }
    free(job->cols);
    free(job->members);
    bin_free(&job->prog);
    bin_free(&job->p_prog);
    job->cols = NULL;
    job->members = NULL;
}

/* The index of rank r in the coordinator's members, or -1. */
static int el_index(const ferry__ps_job *job, uint32_t r) {
    for (uint32_t i = 0; i < job->nmembers; i++)
        if (job->members[i] == r)
            return (int)i;
    return -1;
}

/* Rank r still takes part: joined, not left, its trainer's session not gone. */
static int el_alive(const ferry__ps_job *job, uint32_t r) {
    const job_rank *k = rank_peek(job, r);
    return k->joined && k->left == RANK_IN && k->gone == RANK_HELD && k->sess != 0;
}

static void el_members_text(const uint32_t *m, uint32_t n, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < n && k + 16 < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%u", i ? "," : "", m[i]);
}

/* The coordinator's membership becomes m[n] (ascending) from step `from`. */
static void el_set(ferry__ps_job *job, uint32_t *m, uint32_t n, uint64_t from, const char *why) {
    free(job->members);
    job->members = m;
    job->nmembers = n;
    job->epoch++;
    job->ep_step = from;
    char text[256];
    el_members_text(m, n, text, sizeof text);
    FERRY_LOG_INFO("job '%s': membership epoch %llu from step %llu: ranks %s (%u of %u..%u)%s%s",
                   job->name, (unsigned long long)job->epoch, (unsigned long long)from, text, n,
                   job->el_min, job->world, why[0] != '\0' ? "; " : "", why);
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The columns [*c0, *c1) of the global batch that rank r, member idx (>= 0), holds. */
static void el_cols(const ferry__ps_job *job, int idx, uint32_t r, uint32_t *c0, uint32_t *c1) {
    if (job->el_rank_cols > 0) { /* per-rank: the rank's own, whatever the membership */
        *c0 = r * job->el_rank_cols;
        *c1 = *c0 + job->el_rank_cols;
        return;
    }
    uint32_t n = job->nmembers, B = job->el_batch;
    *c0 = (uint32_t)((uint64_t)idx * B / n);
    *c1 = (uint32_t)((uint64_t)(idx + 1) * B / n);
}

/* The JobReply of the membership to rank r: with its columns' carried state of step
 * ep_step - 1 (and the progress) when `cols`. */
static ferry_status el_reply(const ferry__ps_job *job, uint32_t r, int cols, ferry_rpc_msg *reply) {
    Ferry__V1__JobReply rep;
    ferry__v1__job_reply__init(&rep);
    rep.ready = job->ready;
    rep.joined = job->joined;
    rep.world = job->world;
    rep.epoch = job->epoch;
    rep.members = job->members;
    rep.n_members = job->nmembers;
    rep.epoch_step = job->ep_step;
    rep.elastic_min = job->el_min;
    rep.applied = job->applied;
    char *list = NULL, *targets[MV_TARGETS];
    if (servers_reply(job, &rep, targets, &list) != FERRY_OK)
        return FERRY_NOMEM();
    int idx = el_index(job, r);
    ProtobufCBinaryData *data = NULL;
    uint64_t want = job->ep_step - 1;
    uint32_t c0 = 0, c1 = 0;
    if (idx >= 0)
        el_cols(job, idx, r, &c0, &c1);
    /* per-rank: columns whose rank was away at step want start from zero */
    int state = cols && job->cols != NULL; /* ssp, async: none */
    for (uint32_t c = c0; state && idx >= 0 && job->el_rank_cols > 0 && c < c1; c++)
        state = job->cols[c].step == want && job->cols[c].data.len > 0;
    if (cols && idx >= 0 && job->prog.len > 0 &&
        (job->sync != FERRY__PS_BSP || (want > 0 && job->prog_step == want)))
        rep.progress = job->prog; /* ssp, async: the members' latest */
    if (state && idx >= 0 && want > 0) {
        if ((data = calloc((size_t)(c1 - c0) + 1, sizeof *data)) == NULL) {
            free(list);
            return FERRY_NOMEM();
        }
        for (uint32_t c = c0; c < c1; c++) {
            const el_col *e = &job->cols[c];
            if (e->step != want || e->data.len == 0) {
                free(data);
                free(list);
                return ferry_errorf(FERRY_ERR_NOT_FOUND,
                                    "job '%s': column %u's carried state of step %llu is not "
                                    "here (its member did not put it)",
                                    job->name, c, (unsigned long long)want);
            }
            data[c - c0] = e->data;
        }
        rep.col0 = c0;
        rep.columns = data;
        rep.n_columns = c1 - c0;
    }
    ferry_status st = ferry_rpc_msg_set_head(reply, &rep.base);
    free(data);
    free(list);
    return st;
}

/* Answers every waiting ADMIT whose rank is a member now. */
static void el_answer_admits(ferry__ps_job *job) {
    for (uint32_t r = rank_skip(job, 0); r < job->world; r = rank_skip(job, r + 1)) {
        job_rank *k = rank_get(job, r);
        if (k->admit == NULL || el_index(job, r) < 0)
            continue;
        ferry_rpc_msg m;
        ferry_rpc_msg_init(&m);
        ferry_status st = el_reply(job, r, 1, &m);
        ferry_rpc_pending_finish(k->admit, st, st == FERRY_OK ? &m : NULL);
        if (st != FERRY_OK)
            ferry_rpc_msg_deinit(&m);
        k->admit = NULL;
    }
}

/* Fails the waiting ADMITs. */
static void el_fail_admits(ferry__ps_job *job, ferry_status st, const char *why) {
    for (uint32_t r = rank_skip(job, 0); r < job->world; r = rank_skip(job, r + 1)) {
        job_rank *k = rank_get(job, r);
        if (k->admit != NULL) {
            (void)ferry_errorf(st, "%s", why);
            ferry_rpc_pending_finish(k->admit, st, NULL);
            k->admit = NULL;
        }
    }
}

/* The members still alive, plus (with `admits`) the ranks waiting to be admitted and
 * `extra` (UINT32_MAX: none), less those that said they leave after step `after` (0:
 * none): into *out (malloc'd, ascending). */
static ferry_status el_next(const ferry__ps_job *job, int admits, uint64_t after, uint32_t extra,
                            uint32_t **out, uint32_t *n) {
    uint32_t cap = job->nmembers + 2, k = 0;
    for (uint32_t r = rank_skip(job, 0); admits && r < job->world; r = rank_skip(job, r + 1))
        cap += rank_peek(job, r)->admit != NULL;
    uint32_t *m = malloc(cap * sizeof *m);
    if (m == NULL)
        return FERRY_NOMEM();
    for (uint32_t i = 0; i < job->nmembers; i++) {
        uint32_t r = job->members[i];
        uint64_t la = rank_peek(job, r)->leave_after;
        if (el_alive(job, r) && !(after > 0 && la != 0 && la <= after))
            m[k++] = r;
    }
    for (uint32_t r = rank_skip(job, 0); admits && r < job->world; r = rank_skip(job, r + 1))
        if ((rank_peek(job, r)->admit != NULL || r == extra) && el_alive(job, r) &&
            el_index(job, r) < 0)
            m[k++] = r;
    qsort(m, k, sizeof *m, cmp_u32);
    *out = m;
    *n = k;
    return FERRY_OK;
}

/* Fewer than MIN members would remain after step s: the job fails (its waits too). */
static ferry_status el_too_few(ferry__ps_job *job, uint32_t n, uint64_t s) {
    char why[256];
    (void)snprintf(why, sizeof why,
                   "elastic job '%s': %u members at step %llu, fewer than its minimum %u",
                   job->name, n, (unsigned long long)s, job->el_min);
    job_fail(job, why);
    el_fail_admits(job, FERRY_ERR_ABORTED, why);
    return ferry_errorf(FERRY_ERR_ABORTED, "%s", why);
}

/* ---- elastic ssp and async: no common step, so no boundary ----
 * A rank is admitted at once and starts at the least step of the members (it is the
 * slowest, so the bound holds); one that leaves or whose trainer goes away stops
 * counting at once, on every server, and the Steps the bound held for it go on. The
 * coordinator's membership (its epoch, members) is what ferry-ctl and the metrics
 * show; the other servers count a rank from its first Step there. */

/* The least step of the coordinator's live members other than `except`, or, with none,
 * the most steps the job took (where it stood when its last member went). */
static uint64_t el_start(const ferry__ps_job *job, uint32_t except) {
    uint64_t min = UINT64_MAX;
    for (uint32_t i = 0; i < job->nmembers; i++) {
        uint32_t r = job->members[i];
        if (r != except && el_alive(job, r) && rank_peek(job, r)->steps < min)
            min = rank_peek(job, r)->steps;
    }
    return min == UINT64_MAX ? job->applied : min;
}

/* The coordinator's live members other than `except` (UINT32_MAX: none left out). */
static uint32_t el_live(const ferry__ps_job *job, uint32_t except) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < job->nmembers; i++)
        n += job->members[i] != except && el_alive(job, job->members[i]);
    return n;
}

/* Rank r and the other live ranks waiting to be admitted (ADMIT deferred). */
static uint32_t el_asking(const ferry__ps_job *job, uint32_t r) {
    uint32_t n = 1;
    for (uint32_t x = rank_skip(job, 0); x < job->world; x = rank_skip(job, x + 1))
        n += x != r && rank_peek(job, x)->admit != NULL && el_alive(job, x);
    return n;
}

/* Admits rank r now (with the ranks waiting, when the job starts): the members gain
 * it in a new epoch from step start + 1; it counts as having taken `start` steps. */
static ferry_status el_admit_now(ferry__ps_job *job, uint32_t r, const char *why) {
    uint64_t start = el_start(job, r);
    uint32_t *m = NULL, n = 0;
    int idx = el_index(job, r);
    if (idx >= 0) /* a member admitted again (its connection broke): out first */
        job->members[idx] = UINT32_MAX;
    ferry_status st = el_next(job, 1, 0, r, &m, &n);
    if (idx >= 0)
        job->members[idx] = r;
    if (st != FERRY_OK)
        return st;
    for (uint32_t i = 0; i < n; i++) {
        job_rank *k = rank_get(job, m[i]);
        if (el_index(job, m[i]) < 0 || m[i] == r) {
            k->member = 1;
            k->steps = start;
        }
    }
    el_set(job, m, n, start + 1, why);
    el_answer_admits(job);
    if (job->sync == FERRY__PS_SSP) /* a rank admitted again may have been the slowest */
        ssp_release(job);
    return FERRY_OK;
}

/* Rank r left (`completed`: at its run's end) or its trainer went away: it stops
 * counting now, and a Step of its that the bound held fails (nobody waits for it); the
 * coordinator drops it from the members (a departure other than a completed run fails
 * the job when fewer than MIN are left; with none left the next ADMIT starts it again),
 * and Steps the bound held for it go on. jobs->mu held. */
static void el_depart(ferry__ps_job *job, uint32_t r, const char *why, int completed) {
    job_rank *k = rank_get(job, r);
    if (k != NULL)
        k->member = 0;
    if (k != NULL && k->sp != NULL) {
        (void)ferry_errorf(FERRY_ERR_ABORTED, "job '%s': %s", job->name, why);
        ferry_rpc_msg_deinit(&k->sp_reply);
        ferry_rpc_pending_finish(k->sp, FERRY_ERR_ABORTED, NULL);
        k->sp = NULL;
    }
    if (el_index(job, r) >= 0) {
        uint32_t *m = NULL, n = 0;
        if (el_next(job, 0, 0, UINT32_MAX, &m, &n) != FERRY_OK) {
            job_fail(job, "out of memory moving an elastic job's membership on");
            return;
        }
        uint64_t from = el_start(job, UINT32_MAX) + 1;
        if (n > 0 && n < job->el_min && !completed) {
            free(m);
            (void)el_too_few(job, n, from);
            return;
        }
        el_set(job, m, n, from, why);
    }
    if (job->sync == FERRY__PS_SSP)
        ssp_release(job);
}

static int el_same(const ferry__ps_job *job, const uint32_t *m, uint32_t n) {
    return n == job->nmembers && (n == 0 || memcmp(m, job->members, n * sizeof *m) == 0);
}

/* The coordinator applied step s: the columns and progress put for it become the
 * applied ones, and the ranks waiting to be admitted or leaving after s change the
 * membership of step s + 1. jobs->mu held. */
static void el_boundary(ferry__ps_jobs *j, ferry__ps_job *job, uint64_t s) {
    for (uint32_t c = 0; job->cols != NULL && c < job->el_batch; c++) {
        el_col *e = &job->cols[c];
        if (e->p_step != s || e->p_epoch != job->bar_epoch || e->p_data.data == NULL)
            continue;
        el_charge(j, job, -(int64_t)e->data.len);
        bin_apply(&e->data, &e->step, &e->p_data, &e->p_step, s);
    }
    if (job->p_prog_step == s && job->p_prog.data != NULL)
        bin_apply(&job->prog, &job->prog_step, &job->p_prog, &job->p_prog_step, s);
    uint32_t *m = NULL, n = 0;
    if (el_next(job, 1, s, UINT32_MAX, &m, &n) != FERRY_OK) {
        job_fail(job, "out of memory moving an elastic job's membership on");
        return;
    }
    /* A step applied under an older epoch than the coordinator's (a redo was asked for
     * a step that completed anyway): the current epoch's first step is past, so a new
     * one starts at s + 1 even with the same members. */
    /* A move of the job's servers holds the members at this boundary: a new epoch
     * (the same members) sends each of them to SYNC, whose answer says `moving`. */
    int hold = job->mv_state == MV_PENDING;
    if (hold) {
        job->mv_state = MV_HOLD;
        job->mv_step = s;
        job->mv_since = ferry_now();
        FERRY_LOG_INFO("job '%s': the servers move to %s after step %llu; the members wait",
                       job->name, job->mv_list, (unsigned long long)s);
    }
    if (el_same(job, m, n) && job->bar_epoch == job->epoch && !hold) {
        free(m);
        return;
    }
    if (n > 0 && n < job->el_min) {
        free(m);
        (void)el_too_few(job, n, s + 1);
        return;
    }
    el_set(job, m, n, s + 1, hold ? "the servers move" : "");
    el_answer_admits(job);
}

/* A GradNorm of an elastic job names its membership (JobStep.epoch, members): the
 * barrier of its step waits for those ranks. A newer epoch for a step not yet applied
 * re-opens the barrier; an older one is refused. jobs->mu held. */
static ferry_status el_barrier(ferry__ps_jobs *j, ferry__ps_job *job, const Ferry__V1__JobStep *js) {
    uint64_t s = js->step;
    if (js->epoch == 0 || js->n_members == 0 || js->n_members > job->world)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "elastic job '%s': a GradNorm names its membership (JobStep.epoch > "
                            "0, 1..%u members)",
                            job->name, job->world);
    int in = 0;
    for (size_t i = 0; i < js->n_members; i++) {
        if (js->members[i] >= job->world || (i > 0 && js->members[i] <= js->members[i - 1]))
            return ferry_errorf(FERRY_ERR_INVALID,
                                "elastic job '%s': members must be ascending ranks below %u",
                                job->name, job->world);
        in |= js->members[i] == js->rank;
    }
    if (!in)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "elastic job '%s': rank %u is not among the members it names",
                            job->name, js->rank);
    int open_s = s == job->bsp_step && job->applied < s;
    int opens = s == job->bsp_step + 1 && job->applied == job->bsp_step;
    if (!open_s && !opens)
        return FERRY_OK; /* the caller's checks answer */
    if (open_s && js->epoch < job->bar_epoch)
        return ferry_errorf(FERRY_ERR_ABORTED,
                            "bsp step %llu of job '%s': the membership changed (epoch %llu, not "
                            "%llu): ask the coordinator",
                            (unsigned long long)s, job->name, (unsigned long long)job->bar_epoch,
                            (unsigned long long)js->epoch);
    if (opens && js->epoch < job->bar_epoch) /* epochs only grow from step to step */
        return ferry_errorf(FERRY_ERR_ABORTED,
                            "bsp step %llu of job '%s': epoch %llu is older than the last step's "
                            "(%llu): ask the coordinator",
                            (unsigned long long)s, job->name, (unsigned long long)js->epoch,
                            (unsigned long long)job->bar_epoch);
    if (open_s && js->epoch == job->bar_epoch) {
        int same = js->n_members == job->bar_n;
        for (size_t i = 0; same && i < js->n_members; i++)
            same = rank_peek(job, js->members[i])->member;
        if (!same)
            return ferry_errorf(FERRY_ERR_INVALID,
                                "bsp step %llu of job '%s': epoch %llu names other members",
                                (unsigned long long)s, job->name, (unsigned long long)js->epoch);
        return FERRY_OK;
    }
    if (open_s) { /* a newer membership redoes the step: the old one's arrivals go */
        char why[256];
        (void)snprintf(why, sizeof why,
                       "bsp step %llu of job '%s': the membership changed to epoch %llu: ask the "
                       "coordinator",
                       (unsigned long long)s, job->name, (unsigned long long)js->epoch);
        job_fail_waiters(job, FERRY_ERR_ABORTED, why);
        for (uint32_t r = rank_skip(job, 0); r < job->world; r = rank_skip(job, r + 1))
            rank_get(job, r)->arrived = 0;
        agg_free(job);
        kept_clear(job);
        job->bsp_complete = 0;
        job->arrived = 0;
        job->sum_rank = 0;
    }
    for (size_t i = 0; i < js->n_members; i++)
        if (rank_make(j, job, js->members[i]) == NULL)
            return FERRY_NOMEM();
    for (uint32_t r = rank_skip(job, 0); r < job->world; r = rank_skip(job, r + 1))
        rank_get(job, r)->member = 0;
    for (size_t i = 0; i < js->n_members; i++)
        rank_get(job, js->members[i])->member = 1;
    job->bar_epoch = js->epoch;
    job->bar_n = (uint32_t)js->n_members;
    return FERRY_OK;
}

/* PUT: a member's columns' carried state at the end of the open step. */
static ferry_status el_put(ferry__ps_jobs *j, ferry__ps_job *job, const Ferry__V1__JobElastic *e) {
    int idx = el_index(job, e->rank);
    if (job->sync != FERRY__PS_BSP) /* ssp, async: the progress alone */
        return el_put_progress(job, e, idx);
    if (e->epoch != job->epoch || idx < 0)
        return ferry_errorf(FERRY_ERR_ABORTED,
                            "job '%s': rank %u puts under epoch %llu, but the membership is epoch "
                            "%llu%s",
                            job->name, e->rank, (unsigned long long)e->epoch,
                            (unsigned long long)job->epoch, idx < 0 ? " without it" : "");
    if (e->step != job->applied + 1 || e->step < job->ep_step)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "job '%s': rank %u puts the state of step %llu, but the open step is "
                            "%llu",
                            job->name, e->rank, (unsigned long long)e->step,
                            (unsigned long long)job->applied + 1);
    uint32_t c0, c1;
    el_cols(job, idx, e->rank, &c0, &c1);
    if (e->col0 != c0 || e->n_columns != c1 - c0)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "job '%s': rank %u holds columns [%u, %u) under epoch %llu; it put "
                            "%zu from %u",
                            job->name, e->rank, c0, c1, (unsigned long long)job->epoch,
                            e->n_columns, e->col0);
    if (e->progress.len > EL_PROG_MAX)
        return ferry_errorf(FERRY_ERR_INVALID, "job '%s': progress of %zu bytes (at most %d)",
                            job->name, e->progress.len, EL_PROG_MAX);
    size_t len = e->n_columns > 0 ? e->columns[0].len : 0;
    int64_t grow = 0;
    for (size_t i = 0; i < e->n_columns; i++) {
        const el_col *c = &job->cols[c0 + i];
        if (e->columns[i].len != len || len == 0 || len > EL_COL_MAX ||
            (c->data.len != 0 && c->data.len != len))
            return ferry_errorf(FERRY_ERR_INVALID,
                                "job '%s': column %zu's state has %zu bytes (every column has the "
                                "same, 1..%u)",
                                job->name, c0 + i, e->columns[i].len, EL_COL_MAX);
        grow += (int64_t)len - (int64_t)c->p_data.len;
    }
    if (job->col_bytes + grow > EL_STATE_MAX)
        return ferry_errorf(FERRY_ERR_RESOURCE,
                            "job '%s': the columns' carried state would pass %lld MiB", job->name,
                            EL_STATE_MAX >> 20);
    for (size_t i = 0; i < e->n_columns; i++) {
        el_col *c = &job->cols[c0 + i];
        if (c->p_data.len != len) {
            uint8_t *p = realloc(c->p_data.data, len);
            if (p == NULL)
                return FERRY_NOMEM(); /* the columns before are charged already */
            el_charge(j, job, (int64_t)len - (int64_t)c->p_data.len);
            c->p_data.data = p;
            c->p_data.len = len;
        }
        memcpy(c->p_data.data, e->columns[i].data, len);
        c->p_step = e->step;
        c->p_epoch = e->epoch;
    }
    if (e->progress.len > 0) {
        ferry_status st = bin_copy(&job->p_prog, &e->progress);
        if (st != FERRY_OK)
            return st;
        job->p_prog_step = e->step;
    }
    rank_get(job, e->rank)->leave_after = e->leaving ? e->step : 0;
    return FERRY_OK;
}

/* PUT of an elastic ssp or async job: a member's progress (its learning rate and
 * schedule after an epoch), the latest of which a rank admitted later starts from. Each
 * rank's carried state stays with it: no columns. */
static ferry_status el_put_progress(ferry__ps_job *job, const Ferry__V1__JobElastic *e, int idx) {
    if (idx < 0)
        return ferry_errorf(FERRY_ERR_ABORTED, "job '%s': rank %u is not a member (admit first)",
                            job->name, e->rank);
    if (e->n_columns != 0 || e->leaving)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "job '%s' runs %s: a rank puts its progress alone (each keeps its "
                            "columns' state, and leaves with Leave)",
                            job->name, sync_name(job->sync));
    if (e->progress.len == 0 || e->progress.len > EL_PROG_MAX)
        return ferry_errorf(FERRY_ERR_INVALID, "job '%s': progress of %zu bytes (1..%d)", job->name,
                            e->progress.len, EL_PROG_MAX);
    if (e->step < job->prog_step) /* an older one than the members' latest */
        return FERRY_OK;
    ferry_status st = bin_copy(&job->prog, &e->progress);
    if (st == FERRY_OK)
        job->prog_step = e->step;
    return st;
}

/* REDO: step s failed under epoch e for want of a member: drop the members gone. */
static ferry_status el_redo(ferry__ps_job *job, const Ferry__V1__JobElastic *e, int *cols) {
    uint64_t s = e->step;
    *cols = 0;
    if (s <= job->applied)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "job '%s': step %llu was applied here; it is not redone", job->name,
                            (unsigned long long)s);
    if (s != job->applied + 1)
        return ferry_errorf(FERRY_ERR_INVALID, "job '%s': step %llu is not the open step (%llu)",
                            job->name, (unsigned long long)s, (unsigned long long)job->applied + 1);
    if (job->epoch > e->epoch) { /* another member asked first */
        *cols = 1;
        return FERRY_OK;
    }
    uint32_t *m = NULL, n = 0;
    if (el_next(job, 0, 0, UINT32_MAX, &m, &n) != FERRY_OK)
        return FERRY_NOMEM();
    if (el_same(job, m, n)) { /* nobody is gone here yet: the rank asks again */
        free(m);
        return FERRY_OK;
    }
    if (n < job->el_min) {
        free(m);
        return el_too_few(job, n, s);
    }
    char why[128];
    (void)snprintf(why, sizeof why, "step %llu redone without the members gone (rank %u asked)",
                   (unsigned long long)s, e->rank);
    el_set(job, m, n, s, why);
    *cols = 1;
    return FERRY_OK;
}

/* elastic: the coordinator's membership calls. */
static ferry_status job_elastic_call(ferry__ps_state *ps, const ferry__ps_session *sess,
                                     const Ferry__V1__JobRequest *q, ferry_rpc_msg *reply) {
    const Ferry__V1__JobElastic *e = q->elastic;
    if (e == NULL)
        return ferry_errorf(FERRY_ERR_INVALID, "Job: elastic needs its message");
    ferry__ps_jobs *j = &ps->jobs;
    pthread_mutex_lock(&j->mu);
    ferry__ps_job *job = job_find(j, q->job);
    ferry_status st = FERRY_OK;
    if (job == NULL)
        st = ferry_errorf(FERRY_ERR_NOT_FOUND, "job '%s' is unknown here (Join it first)", q->job);
    else if (!ferry__ps_may_use(sess, job->owner))
        st = not_yours(q->job);
    else if (job->el_min == 0)
        st = ferry_errorf(FERRY_ERR_INVALID, "job '%s' is not elastic (JobMember.elastic_min)",
                          job->name);
    else if (job->failed[0] != '\0')
        st = ferry_errorf(FERRY_ERR_TIMEOUT, "%s", job->failed);
    else if (j->stopped)
        st = ferry_errorf(FERRY_ERR_UNAVAILABLE, "ferry-ps is shutting down");
    else if (e->rank >= job->world)
        st = ferry_errorf(FERRY_ERR_INVALID, "job '%s': rank %u outside [0, %u)", job->name,
                          e->rank, job->world);
    else if (!acts_as(sess, job, e->rank) || !rank_peek(job, e->rank)->joined)
        st = not_held(job, e->rank);
    else if (e->batch == 0 || e->batch > EL_BATCH_MAX || e->batch < job->world ||
             (job->el_batch != 0 && e->batch != job->el_batch))
        st = ferry_errorf(FERRY_ERR_INVALID,
                          "job '%s': global batch %u columns; the job's is %u (0: not set yet), "
                          "at least its largest membership, %u",
                          job->name, e->batch, job->el_batch, job->world);
    else if ((e->rank_columns != 0 && (uint64_t)e->rank_columns * job->world != e->batch) ||
             (job->el_batch != 0 && e->rank_columns != job->el_rank_cols))
        st = ferry_errorf(FERRY_ERR_INVALID,
                          "job '%s': %u columns per rank; the job's batch policy is %s (%u "
                          "columns per rank times %u ranks is the global batch)",
                          job->name, e->rank_columns,
                          job->el_batch == 0      ? "not set yet"
                          : job->el_rank_cols > 0 ? "per rank"
                                                  : "a global batch split over the members",
                          job->el_rank_cols, job->world);
    if (st == FERRY_OK && job->sync != FERRY__PS_BSP && e->rank_columns == 0)
        st = ferry_errorf(FERRY_ERR_INVALID,
                          "job '%s' runs %s: an elastic ssp or async job keeps each rank's batch "
                          "(rank_columns > 0); only bsp splits a global batch over the members "
                          "of a step",
                          job->name, sync_name(job->sync));
    if (st == FERRY_OK && job->el_batch == 0 && job->sync != FERRY__PS_BSP) {
        job->el_rank_cols = e->rank_columns; /* ssp, async: no columns' state here */
        job->el_batch = e->batch;
    } else if (st == FERRY_OK && job->cols == NULL) {
        if ((job->cols = calloc(e->batch, sizeof *job->cols)) == NULL) {
            st = FERRY_NOMEM();
        } else {
            job->el_rank_cols = e->rank_columns;
            job->el_batch = e->batch;
            job->bytes += (int64_t)(e->batch * sizeof *job->cols);
            j->bytes += (int64_t)(e->batch * sizeof *job->cols);
        }
    }
    int cols = 0;
    job_rank *k = st == FERRY_OK ? rank_get(job, e->rank) : NULL;
    if (st == FERRY_OK) {
        switch (e->op) {
        case FERRY__V1__JOB_ELASTIC__OP__ADMIT:
            if (job->sync != FERRY__PS_BSP && !el_alive(job, e->rank)) {
                st = ferry_errorf(FERRY_ERR_ABORTED,
                                  "job '%s': rank %u's trainer is gone here (join the rank again "
                                  "first)",
                                  job->name, e->rank);
                break;
            }
            if (job->sync != FERRY__PS_BSP) { /* no boundary to wait for */
                uint32_t others = el_live(job, e->rank);
                if (others > 0 || el_asking(job, e->rank) >= job->el_min) {
                    char why[64];
                    (void)snprintf(why, sizeof why, others > 0 ? "rank %u admitted" : "started",
                                   e->rank);
                    st = el_admit_now(job, e->rank, why);
                    cols = 1;
                    break;
                }
            }
            if (el_index(job, e->rank) >= 0 && job->sync == FERRY__PS_BSP) {
                cols = 1; /* a member already (a retry) */
                break;
            }
            /* not started, or every member went: from here */
            if (el_live(job, UINT32_MAX) == 0 && el_asking(job, e->rank) >= job->el_min) {
                uint32_t *m = NULL, n = 0;
                st = el_next(job, 1, 0, e->rank, &m, &n);
                if (st == FERRY_OK) {
                    el_set(job, m, n, job->applied + 1, "started");
                    el_answer_admits(job);
                    cols = 1;
                }
                break;
            }
            ferry_rpc_pending *p = ferry_rpc_defer(reply);
            if (p == NULL) {
                st = ferry_errorf(FERRY_ERR_UNSUPPORTED, "an elastic admit must wait, and this "
                                                         "call cannot");
                break;
            }
            if (k->admit != NULL) {
                (void)ferry_errorf(FERRY_ERR_TIMEOUT, "elastic admit: superseded by a retry");
                ferry_rpc_pending_finish(k->admit, FERRY_ERR_TIMEOUT, NULL);
            }
            k->admit = p;
            k->admit_since = ferry_now();
            FERRY_LOG_INFO("job '%s': rank %u asks to join; it is admitted at the next step "
                           "boundary",
                           job->name, e->rank);
            pthread_mutex_unlock(&j->mu);
            return FERRY_OK;
        case FERRY__V1__JOB_ELASTIC__OP__PUT:
            st = el_put(j, job, e);
            break;
        case FERRY__V1__JOB_ELASTIC__OP__SYNC:
            if (e->step > job->applied && job->sync == FERRY__PS_BSP)
                st = ferry_errorf(FERRY_ERR_INVALID,
                                  "job '%s': step %llu is not applied here (at %llu)", job->name,
                                  (unsigned long long)e->step, (unsigned long long)job->applied);
            cols = e->epoch != job->epoch;
            break;
        case FERRY__V1__JOB_ELASTIC__OP__START:
            /* ssp, async: the rank is about to be admitted at the coordinator; here it
             * counts from now as a rank at step 0 (its step unknown yet), holding the
             * others' ssp Steps until its first Step tells where it is. */
            if (job->sync == FERRY__PS_BSP || job->epoch > 0)
                st = ferry_errorf(FERRY_ERR_INVALID,
                                  "job '%s': start is for an elastic ssp or async job, on a "
                                  "server other than its coordinator",
                                  job->name);
            else if (!el_alive(job, e->rank))
                st = ferry_errorf(FERRY_ERR_ABORTED, "job '%s': rank %u is not held here",
                                  job->name, e->rank);
            else {
                k->member = 1;
                k->steps = 0;
            }
            break;
        case FERRY__V1__JOB_ELASTIC__OP__REDO:
            if (job->sync != FERRY__PS_BSP)
                st = ferry_errorf(FERRY_ERR_INVALID,
                                  "job '%s' runs %s: its ranks have no common step to redo",
                                  job->name, sync_name(job->sync));
            else
                st = el_redo(job, e, &cols);
            break;
        default:
            st = ferry_errorf(FERRY_ERR_INVALID,
                              "Job '%s': elastic op %d (admit | put | sync | "
                              "redo | start)",
                              job->name, (int)e->op);
        }
    }
    if (st == FERRY_OK)
        st = el_reply(job, e->rank, cols, reply);
    pthread_mutex_unlock(&j->mu);
    return st;
}

/* ---- servers joining and leaving a running elastic job (JobReshard) ---- */

/* A move's list: 1..MV_TARGETS targets of 1..MV_TARGET-1 printable bytes without ','
 * or spaces, none twice, joined by ',' into *out (malloc'd). */
static ferry_status mv_list_of(const Ferry__V1__JobReshard *q, char **out) {
    if (q->n_servers < 1 || q->n_servers > MV_TARGETS)
        return ferry_errorf(FERRY_ERR_INVALID, "reshard: 1..%d servers, not %zu", MV_TARGETS,
                            q->n_servers);
    size_t len = 1;
    for (size_t i = 0; i < q->n_servers; i++) {
        const char *t = q->servers[i];
        size_t n = strlen(t);
        int ok = n > 0 && n < MV_TARGET;
        for (size_t k = 0; ok && k < n; k++)
            ok = t[k] > ' ' && t[k] < 127 && t[k] != ',';
        for (size_t k = 0; ok && k < i; k++)
            ok = strcmp(t, q->servers[k]) != 0;
        if (!ok)
            return ferry_errorf(FERRY_ERR_INVALID,
                                "reshard: server %zu is empty, too long, not printable or listed "
                                "twice",
                                i);
        len += n + 1;
    }
    char *list = malloc(len);
    if (list == NULL)
        return FERRY_NOMEM();
    size_t k = 0;
    for (size_t i = 0; i < q->n_servers; i++)
        k += (size_t)snprintf(list + k, len - k, "%s%s", i ? "," : "", q->servers[i]);
    *out = list;
    return FERRY_OK;
}

/* A move whose servers may hold new rows: an abort cannot go back (the coordinator
 * adopts first). */
static int mv_touched(const ferry__ps_job *job) {
    return job->mv_adopting > 0 || job->mv_took;
}

/* A move ends: back to no move (the committed list stays as it is). */
static void mv_end(ferry__ps_job *job) {
    free(job->mv_list);
    job->mv_list = NULL;
    job->mv_state = MV_NONE;
    job->mv_step = 0;
    job->mv_adopting = job->mv_took = 0;
}

/* BEGIN, COMMIT, ABORT on the coordinator, and STATUS anywhere. jobs->mu held. */
static ferry_status mv_coordinate(ferry__ps_job *job, const Ferry__V1__JobReshard *q,
                                  const ferry__ps_session *sess) {
    char *list = NULL;
    ferry_status st = FERRY_OK;
    if (q->op == FERRY__V1__JOB_RESHARD__OP__STATUS) {
        /* ferry-ctl's own STATUS naming the held step: the move is alive, its hold
         * counts again from now */
        if (job->mv_state == MV_HOLD && q->step != 0 && q->step == job->mv_step)
            job->mv_since = ferry_now();
        return FERRY_OK;
    }
    if (job->epoch == 0)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "job '%s': this ferry-ps is not its coordinator (the first server of "
                            "the trainers' --ps list), or the job has not started",
                            job->name);
    switch (q->op) {
    case FERRY__V1__JOB_RESHARD__OP__BEGIN:
        if (job->sync != FERRY__PS_BSP)
            return ferry_errorf(FERRY_ERR_UNSUPPORTED,
                                "job '%s' runs %s: a move holds the members at a common step "
                                "boundary, which only an elastic bsp job has",
                                job->name, sync_name(job->sync));
        if (job->mv_state != MV_NONE)
            return ferry_errorf(FERRY_ERR_BUSY, "job '%s': a move of its servers is under way",
                                job->name);
        if ((st = mv_list_of(q, &list)) != FERRY_OK)
            return st;
        job->mv_list = list;
        job->mv_state = MV_PENDING;
        job->mv_since = ferry_now();
        FERRY_LOG_INFO("job '%s': '%s' moves its servers to %s at the next step boundary",
                       job->name, sess->identity, list);
        return FERRY_OK;
    case FERRY__V1__JOB_RESHARD__OP__COMMIT:
        if (job->mv_state != MV_HOLD || q->step != job->mv_step)
            return ferry_errorf(FERRY_ERR_INVALID, "job '%s': no move holds it after step %llu",
                                job->name, (unsigned long long)q->step);
        if ((st = mv_list_of(q, &list)) != FERRY_OK)
            return st;
        if (strcmp(list, job->mv_list) != 0) {
            free(list);
            return ferry_errorf(FERRY_ERR_INVALID, "job '%s': the move began for %s", job->name,
                                job->mv_list);
        }
        free(job->srv_list);
        job->srv_list = list;
        job->srv_epoch++;
        job->mv_bytes = q->bytes;
        job->mv_seconds = q->seconds;
        FERRY_LOG_INFO("job '%s': servers %s from step %llu (move %llu: %.1f MiB in %.2f s; the "
                       "members held %.2f s)",
                       job->name, list, (unsigned long long)job->mv_step + 1,
                       (unsigned long long)job->srv_epoch, (double)q->bytes / 1048576.0, q->seconds,
                       ferry_now() - job->mv_since);
        mv_end(job);
        return FERRY_OK;
    case FERRY__V1__JOB_RESHARD__OP__ABORT:
        if (job->mv_state == MV_NONE || (job->mv_state == MV_HOLD && q->step != job->mv_step))
            return ferry_errorf(FERRY_ERR_INVALID, "job '%s': no such move under way", job->name);
        if (mv_touched(job)) {
            char why[256];
            (void)snprintf(why, sizeof why,
                           "job '%s': its move after step %llu was called off after servers took "
                           "their rows: no consistent state is left",
                           job->name, (unsigned long long)job->mv_step);
            job_fail(job, why);
            mv_end(job);
            return ferry_errorf(FERRY_ERR_ABORTED, "%s", why);
        }
        FERRY_LOG_WARN("job '%s': the move of its servers to %s is called off", job->name,
                       job->mv_list);
        mv_end(job);
        return FERRY_OK;
    default:
        return ferry_errorf(FERRY_ERR_INVALID, "Job '%s': reshard op %d", job->name, (int)q->op);
    }
}

/* The job's name prefix of its modules: "<job>/". */
static void mv_prefix(const char *job, char *out, size_t cap) {
    (void)snprintf(out, cap, "%s/", job);
}

/* EXPORT and ADOPT: the job's modules here at step `step`, outside the jobs lock (the
 * members wait at the boundary, so nothing steps them meanwhile). */
static ferry_status mv_modules(ferry__ps_state *ps, const ferry__ps_session *sess, const char *name,
                               const Ferry__V1__JobReshard *q, ferry_rpc_msg *reply) {
    ferry__ps_jobs *j = &ps->jobs;
    int adopt = q->op == FERRY__V1__JOB_RESHARD__OP__ADOPT;
    char owner[FERRY_RPC_IDENTITY_MAX], prefix[FERRY_RPC_NAME_MAX + 2];
    pthread_mutex_lock(&j->mu);
    ferry__ps_job *job = job_find(j, name);
    ferry_status st = FERRY_OK;
    int fresh = 0;
    if (job == NULL)
        st = ferry_errorf(FERRY_ERR_NOT_FOUND, "job '%.63s' is unknown here (Join it first)", name);
    else if (!ferry__ps_may_use(sess, job->owner))
        st = not_yours(name);
    else if (job->el_min == 0)
        st = ferry_errorf(FERRY_ERR_INVALID, "job '%s' is not elastic", name);
    else if (job->failed[0] != '\0')
        st = ferry_errorf(FERRY_ERR_ABORTED, "%s", job->failed);
    else if (q->step == 0)
        st = ferry_errorf(FERRY_ERR_INVALID, "job '%s': reshard at step 0", name);
    else if (adopt && job->epoch > 0 && (job->mv_state != MV_HOLD || q->step != job->mv_step))
        st = ferry_errorf(FERRY_ERR_INVALID, "job '%s': no move holds it after step %llu", name,
                          (unsigned long long)q->step);
    else if (adopt && job->applied == 0 && job->bsp_step == 0)
        fresh = 1; /* a server new to the job */
    else if (job->applied < q->step || job->bsp_step != job->applied)
        st = ferry_errorf(FERRY_ERR_BUSY, "job '%s': step %llu is not applied here yet (at %llu)",
                          name, (unsigned long long)q->step, (unsigned long long)job->applied);
    else if (job->applied > q->step)
        st = ferry_errorf(FERRY_ERR_INVALID, "job '%s' is at step %llu here, past %llu", name,
                          (unsigned long long)job->applied, (unsigned long long)q->step);
    if (st == FERRY_OK) {
        (void)snprintf(owner, sizeof owner, "%s", job->owner);
        mv_prefix(job->name, prefix, sizeof prefix);
        if (adopt && job->epoch > 0)
            job->mv_adopting++; /* from here an abort waits to know */
    }
    pthread_mutex_unlock(&j->mu);
    if (st != FERRY_OK)
        return st;
    double t0 = ferry_now();
    Ferry__V1__JobReply r;
    ferry__v1__job_reply__init(&r);
    uint8_t *data = NULL;
    size_t len = 0;
    uint32_t n = 0;
    int changed = 0;
    pthread_mutex_lock(&ps->checkpoint_mu);
    if (adopt) {
        st = ferry__ps_checkpoint_adopt(&ps->reg, &ps->quotas, ps->checkpoint_dir, q->data.data,
                                        q->data.len, owner, prefix, q->step, &n, &changed);
        ps->ck_done[0] = '\0'; /* the modules changed: no Checkpoint is a repeat now */
    } else {
        st = ferry__ps_checkpoint_export(&ps->reg, ps->checkpoint_dir, owner, prefix, q->step,
                                         &data, &len);
    }
    pthread_mutex_unlock(&ps->checkpoint_mu);
    if (adopt) { /* the coordinator: whether its rows changed (a refusal changed nothing) */
        pthread_mutex_lock(&j->mu);
        ferry__ps_job *c = job_find(j, name);
        if (c != NULL && c->epoch > 0 && c->mv_adopting > 0) {
            c->mv_adopting--;
            c->mv_took |= changed;
        }
        pthread_mutex_unlock(&j->mu);
    }
    if (st != FERRY_OK) {
        char why[512];
        (void)snprintf(why, sizeof why, "%s", ferry_error_last());
        return ferry_errorf(st, "job '%s': %s the modules of step %llu: %s", name,
                            adopt ? "adopting" : "exporting", (unsigned long long)q->step, why);
    }
    if (adopt) {
        pthread_mutex_lock(&j->mu);
        job = job_find(j, name);
        if (job != NULL && fresh && job->applied == 0 && job->bsp_step == 0) {
            job->applied = job->bsp_step = q->step; /* its first step is the next */
            job->ready = 1;
        }
        if (job != NULL) { /* packed under the lock: it points into the job */
            state_reply(job, &r);
            st = ferry_rpc_msg_set_head(reply, &r.base);
        }
        pthread_mutex_unlock(&j->mu);
        FERRY_LOG_INFO("job '%s': took %u modules of step %llu (%zu bytes, %.2f s)%s", name,
                       (unsigned)n, (unsigned long long)q->step, q->data.len, ferry_now() - t0,
                       fresh ? "; the job starts here at the next step" : "");
        return job != NULL
                   ? st
                   : ferry_errorf(FERRY_ERR_NOT_FOUND, "job '%s' was dropped meanwhile", name);
    }
    r.checkpoint_data.data = data;
    r.checkpoint_data.len = len;
    r.checkpoint_bytes = len;
    st = ferry_rpc_msg_set_head(reply, &r.base);
    FERRY_LOG_INFO("job '%s': sent its modules of step %llu (%zu bytes, %.2f s) to move them", name,
                   (unsigned long long)q->step, len, ferry_now() - t0);
    free(data);
    return st;
}

static ferry_status job_reshard_call(ferry__ps_state *ps, const ferry__ps_session *sess,
                                     const Ferry__V1__JobRequest *q, ferry_rpc_msg *reply) {
    const Ferry__V1__JobReshard *m = q->reshard;
    if (m == NULL)
        return ferry_errorf(FERRY_ERR_INVALID, "Job: reshard needs its message");
    if (m->op == FERRY__V1__JOB_RESHARD__OP__EXPORT || m->op == FERRY__V1__JOB_RESHARD__OP__ADOPT)
        return mv_modules(ps, sess, q->job, m, reply);
    ferry__ps_jobs *j = &ps->jobs;
    pthread_mutex_lock(&j->mu);
    ferry__ps_job *job = job_find(j, q->job);
    ferry_status st = FERRY_OK;
    if (job == NULL)
        st = ferry_errorf(FERRY_ERR_NOT_FOUND, "job '%s' is unknown here", q->job);
    else if (!ferry__ps_may_use(sess, job->owner))
        st = not_yours(q->job);
    else if (job->el_min == 0)
        st = ferry_errorf(FERRY_ERR_INVALID, "job '%s' is not elastic", job->name);
    else if (job->failed[0] != '\0' && m->op != FERRY__V1__JOB_RESHARD__OP__STATUS)
        st = ferry_errorf(FERRY_ERR_ABORTED, "%s", job->failed);
    if (st == FERRY_OK)
        st = mv_coordinate(job, m, sess);
    if (st == FERRY_OK)
        st = el_reply(job, UINT32_MAX, 0, reply);
    if (st == FERRY_OK && job->failed[0] != '\0') /* STATUS of a failed job says why */
        st = ferry_errorf(FERRY_ERR_ABORTED, "%s", job->failed);
    pthread_mutex_unlock(&j->mu);
    return st;
}

ferry_status ferry__ps_on_job(ferry__ps_state *ps, ferry__ps_session *sess,
                              const Ferry__V1__JobRequest *q, ferry_rpc_msg *req,
                              ferry_rpc_msg *reply) {
    (void)req;
    if (!job_name_ok(q->job))
        return ferry_errorf(FERRY_ERR_INVALID,
                            "Job: job name must be 1..%d bytes of [A-Za-z0-9_.:/-]",
                            FERRY_RPC_NAME_MAX - 1);
    switch (q->action_case) {
    case FERRY__V1__JOB_REQUEST__ACTION_PROBE: {
        ferry_status st = ferry__ps_session_probe_rate(&ps->sessions, sess);
        return st != FERRY_OK ? st : job_probe(ps, sess, q->job, reply);
    }
    case FERRY__V1__JOB_REQUEST__ACTION_CHECKPOINT:
        return job_checkpoint(ps, sess, q->job, q->checkpoint, reply);
    case FERRY__V1__JOB_REQUEST__ACTION_DROP:
        return job_drop_call(ps, sess, q->job, reply);
    case FERRY__V1__JOB_REQUEST__ACTION_FETCH:
        return job_fetch(ps, sess, q->job, q->fetch, reply);
    case FERRY__V1__JOB_REQUEST__ACTION_INSTALL:
        return job_install(ps, sess, q->job, q->install, reply);
    case FERRY__V1__JOB_REQUEST__ACTION_ELASTIC:
        return job_elastic_call(ps, sess, q, reply);
    case FERRY__V1__JOB_REQUEST__ACTION_RESHARD:
        return job_reshard_call(ps, sess, q, reply);
    case FERRY__V1__JOB_REQUEST__ACTION_JOIN:
    case FERRY__V1__JOB_REQUEST__ACTION_READY:
    case FERRY__V1__JOB_REQUEST__ACTION_LEAVE:
    case FERRY__V1__JOB_REQUEST__ACTION_RECOVER:
    case FERRY__V1__JOB_REQUEST__ACTION_STATUS:
        return job_member_call(ps, sess, q, reply);
    default:
        return ferry_errorf(FERRY_ERR_INVALID,
                            "Job '%s': no action (join | ready | leave | probe | recover | "
                            "checkpoint | status | drop | fetch | install | elastic | "
                            "reshard)",
                            q->job);
    }
}

void ferry__ps_jobs_session_ended(ferry__ps_jobs *j, uint64_t serial) {
    pthread_mutex_lock(&j->mu);
    for (ferry__ps_job *job = j->list; job != NULL; job = job->next) {
        for (uint32_t r = rank_skip(job, 0); r < job->world; r = rank_skip(job, r + 1)) {
            job_rank *k = rank_get(job, r);
            if (k->sess != serial)
                continue;
            rank_gone(job, r, RANK_SESSION_ENDED); /* the waits of the others on it end */
            k->sess = 0; /* the rank waits for a new session of the owner */
            FERRY_LOG_INFO("job '%s': the session holding rank %u ended", job->name, r);
            (void)ferry_errorf(FERRY_ERR_UNAVAILABLE, "the session of rank %u ended", r);
            if (k->gn != NULL) {
                ferry_rpc_pending_finish(k->gn, FERRY_ERR_UNAVAILABLE, NULL);
                k->gn = NULL;
            }
            if (k->sp != NULL) {
                ferry_rpc_msg_deinit(&k->sp_reply);
                ferry_rpc_pending_finish(k->sp, FERRY_ERR_UNAVAILABLE, NULL);
                k->sp = NULL;
            }
            if (k->rec != NULL) {
                ferry_rpc_pending_finish(k->rec, FERRY_ERR_UNAVAILABLE, NULL);
                k->rec = NULL;
            }
            if (k->admit != NULL) {
                ferry_rpc_pending_finish(k->admit, FERRY_ERR_UNAVAILABLE, NULL);
                k->admit = NULL;
            }
        }
    }
    pthread_mutex_unlock(&j->mu);
}

static void job_leave(ferry__ps_job *job, uint32_t rank, const char *reason, uint64_t step) {
    job_rank *k = rank_get(job, rank); /* made by the caller */
    int early = reason != NULL && reason[0] != '\0';
    if (!k->joined) { /* a restarted server's copy of the job: it learns the rank here */
        k->joined = 1;
        job->joined++;
    }
    k->left = early ? RANK_LEFT_EARLY : RANK_COMPLETED;
    k->steps = step > k->steps ? step : k->steps;
    if (early && job->early_why[0] == '\0') {
        job->early_rank = rank;
        (void)snprintf(job->early_why, sizeof job->early_why, "%.255s", reason);
    }
    uint32_t left = 0;
    for (uint32_t r = rank_skip(job, 0); r < job->world; r = rank_skip(job, r + 1))
        left += rank_peek(job, r)->left != RANK_IN;
    FERRY_LOG_INFO("job '%s': rank %u left after %llu steps, %s%s (%u of %u left)", job->name, rank,
                   (unsigned long long)k->steps, early ? "early: " : "its run completed",
                   early ? reason : "", left, job->el_min > 0 ? job->joined : job->world);
    /* An elastic job is never finished by its leaves: its members come and go, and the
     * next trainer takes it on where it stood (it ends idle, or by drop). */
    if (job->el_min == 0 && left == job->world) {
        job->finished = 1;
        agg_free(job);
        return;
    }
    char why[400], msg[512];
    ferry_status st = rank_absent(job, rank, why, sizeof why);
    if (el_async(job)) {
        el_depart(job, rank, why, !early);
        return;
    }
    if (job->sync == FERRY__PS_BSP && job->arrived > 0 && !job->bsp_complete && !k->arrived &&
        (job->el_min == 0 || k->member)) {
        (void)snprintf(msg, sizeof msg, "bsp step %llu of job '%s': %s",
                       (unsigned long long)job->bsp_step, job->name, why);
        job_fail_waiters(job, st, msg);
    }
    if (job->recovering && !k->rec_arrived) {
        if (early) {
            (void)snprintf(msg, sizeof msg, "job '%s' cannot roll back: %s", job->name, why);
            FERRY_LOG_WARN("%s", msg);
            rec_fail(job, FERRY_ERR_ABORTED, msg);
        } else if (job->rec_last != 0 && k->steps == job->rec_last) {
            /* It takes part as having arrived: the waiting ranks send recover again. */
            (void)snprintf(msg, sizeof msg, "job '%s': %s; recover again", job->name, why);
            rec_fail(job, FERRY_ERR_BUSY, msg);
        }
    }
    if (job->sync == FERRY__PS_SSP)
        ssp_release(job);
}

/* ---- bsp ---- */

static ferry__ps_ctx_mod *agg_entry(ferry__ps_job *job, ferry__ps_module *m) {
    for (int i = 0; i < job->nagg; i++) {
        if (job->agg[i].mod == m)
            return &job->agg[i];
    }
    ferry__ps_ctx_mod *a = realloc(job->agg, (size_t)(job->nagg + 1) * sizeof *a);
    if (a == NULL)
        return NULL;
    job->agg = a;
    ferry__ps_ctx_mod *e = &a[job->nagg];
    memset(e, 0, sizeof *e);
    e->mod = m;
    if (ferry_grads_init(&e->G, &m->P) != FERRY_OK)
        return NULL;
    ferry__ps_module_ref(m); /* held until the step is applied */
    job->nagg++;
    return e;
}

/* Sums the ranks' contexts of the open step in rank order into job->agg (the
 * contexts end here), adds constrained modules' penalty gradients once, and the
 * sums of squares, loss and tokens every rank receives. */
static ferry_status bsp_sum(ferry__ps_state *ps, ferry__ps_job *job) {
    ferry__ps_ctx_table *t = &ps->ctxs;
    ferry_status st = FERRY_OK;
    agg_free(job);
    job->agg_loss = job->agg_tokens = job->agg_sumsq = 0.0;
    job->agg_ck = 0;
    job->agg_readmit = 0;
    for (uint32_t r = rank_skip(job, 0); r < job->world && st == FERRY_OK;
         r = rank_skip(job, r + 1)) {
        job_rank *k = rank_get(job, r); /* every rank (elastic: member) arrived */
        if (!k->arrived)
            continue;
        job->agg_ck |= k->ck;
        job->agg_readmit |= k->readmit;
        job->agg_loss += k->loss_sum;
        job->agg_tokens += k->tokens;
        ferry__ps_ctx *c;
        if ((st = ferry__ps_ctx_acquire(t, k->ctx_sess, k->ctx_id, 0, &c)) != FERRY_OK) {
            char why[256];
            (void)snprintf(why, sizeof why, "%s", ferry_error_last());
            return ferry_errorf(st, "bsp step %llu: rank %u's context: %s",
                                (unsigned long long)job->bsp_step, r, why);
        }
        for (int i = 0; i < c->nmods && st == FERRY_OK; i++) {
            int had = job->nagg;
            ferry__ps_ctx_mod *e = agg_entry(job, c->mods[i].mod);
            if (e != NULL && job->nagg > had) {
                /* The module's first gradient of the step: moved into the sum, not added
                 * to zeros (a one-rank job sums nothing). The context ends with the
                 * empty one. */
                ferry_grads g = e->G;
                e->G = c->mods[i].G;
                c->mods[i].G = g;
            } else {
                st = e != NULL ? ferry_grads_add(&e->G, &c->mods[i].G) : FERRY_NOMEM();
            }
        }
        ferry__ps_ctx_retire(t, c, 1);
        ferry__ps_ctx_release(t, c);
    }
    if (st == FERRY_OK && (job->agg_ss = calloc((size_t)job->nagg + 1, sizeof(double))) == NULL)
        st = FERRY_NOMEM();
    for (int i = 0; i < job->nagg && st == FERRY_OK; i++) {
        if ((st = ferry__ps_ctx_mod_penalty(NULL, NULL, &job->agg[i], 0)) == FERRY_OK &&
            (st = ferry_grads_sumsq(&job->agg[i].G, &job->agg_ss[i])) == FERRY_OK)
            job->agg_sumsq += job->agg_ss[i];
    }
    if (st == FERRY_OK)
        job->bsp_complete = 1;
    return st;
}

/* Appends module entry e's summed gradient to reply as SummedModule *sm and its
 * tensors (proto: SummedModule): copies, so the reply outlives the sum. */
static ferry_status sum_encode(const ferry__ps_ctx_mod *e, Ferry__V1__SummedModule *sm,
                               ferry_rpc_msg *reply) {
    const ferry_params *P = e->G.P;
    int before = reply->ntensors;
    ferry_status st = FERRY_OK;
    ferry__v1__summed_module__init(sm);
    sm->module = (char *)(uintptr_t)e->mod->name;
    sm->penalty_done = e->penalty_done != 0;
    sm->penalty = e->penalty;
    sm->feasibility = e->feasibility;
    for (int i = 0; i < P->count && st == FERRY_OK; i++) {
        const ferry_param *p = &P->items[i];
        if (!e->G.touched[i])
            continue;
        ferry_rpc_tensor t;
        memset(&t, 0, sizeof t);
        (void)snprintf(t.name, sizeof t.name, "%s", p->name);
        if (p->flags & FERRY_PARAM_ROW_SPARSE) {
            const ferry_rowgrad *rg = &e->G.rows[i];
            t.dtype = FERRY_RPC_DTYPE_I64;
            t.ndim = 1;
            t.dim[0] = rg->count;
            t.data = rg->rows;
            t.nbytes = (size_t)rg->count * sizeof(int64_t);
            if ((st = ferry_rpc_msg_add_copy(reply, &t)) != FERRY_OK)
                break;
            t.dtype = FERRY_RPC_DTYPE_F32;
            t.ndim = 2;
            t.dim[1] = rg->D;
            t.data = rg->values;
            t.nbytes = (size_t)(rg->count * rg->D) * sizeof(float);
        } else {
            t.dtype = FERRY_RPC_DTYPE_F32;
            t.ndim = 1;
            t.dim[0] = p->numel;
            t.data = e->G.dense + p->offset;
            t.nbytes = (size_t)p->numel * sizeof(float);
        }
        void *dst; /* the gradients are the backend's memory (a device's, with --device) */
        if ((st = ferry_rpc_msg_alloc(reply, t.dtype, t.ndim, t.dim, t.name, &dst)) == FERRY_OK &&
            t.nbytes > 0)
            st = ferry_backend_copy(P->be, dst, t.data, t.nbytes, FERRY_COPY_DEVICE_TO_HOST);
    }
    sm->tensors = (uint32_t)(reply->ntensors - before);
    return st;
}

/* The GradNorm reply every rank of a summed bsp step receives; with want_sum, the
 * summed gradient too (JobStep.want_sum). */
static ferry_status bsp_reply(const ferry__ps_job *job, ferry_rpc_msg *reply, int want_sum) {
    Ferry__V1__GradNormReply r;
    ferry__v1__grad_norm_reply__init(&r);
    Ferry__V1__Metric *metrics = calloc((size_t)job->nagg + 1, sizeof *metrics);
    Ferry__V1__Metric **ptrs = calloc((size_t)job->nagg + 1, sizeof *ptrs);
    Ferry__V1__SummedModule *sums = want_sum ? calloc((size_t)job->nagg + 1, sizeof *sums) : NULL;
    Ferry__V1__SummedModule **sptrs =
        want_sum ? calloc((size_t)job->nagg + 1, sizeof *sptrs) : NULL;
    ferry_status st =
        metrics != NULL && ptrs != NULL && (!want_sum || (sums != NULL && sptrs != NULL))
            ? FERRY_OK
            : FERRY_NOMEM();
    for (int i = 0; i < job->nagg && want_sum && st == FERRY_OK; i++) {
        st = sum_encode(&job->agg[i], &sums[i], reply);
        sptrs[i] = &sums[i];
        r.n_sum = (size_t)i + 1;
    }
    r.sum = sptrs;
    if (st == FERRY_OK) {
        for (int i = 0; i < job->nagg; i++) {
            ferry__v1__metric__init(&metrics[i]);
            metrics[i].name = job->agg[i].mod->name;
            metrics[i].value = job->agg_ss[i];
            ptrs[i] = &metrics[i];
        }
        r.per_module = ptrs;
        r.n_per_module = (size_t)job->nagg;
        r.sum_squares = job->agg_sumsq;
        r.loss_sum = job->agg_loss;
        r.tokens = job->agg_tokens;
        r.checkpoint = job->agg_ck;
        r.readmit = job->agg_readmit;
        st = ferry_rpc_msg_set_head(reply, &r.base);
    }
    free(metrics);
    free(ptrs);
    free(sums);
    free(sptrs);
    return st;
}

/* The answer to a GradNorm held past its JobStep.hold_ms: the barrier is still open. */
static ferry_status pending_reply(ferry_rpc_msg *reply) {
    Ferry__V1__GradNormReply r;
    ferry__v1__grad_norm_reply__init(&r);
    r.pending = 1;
    return ferry_rpc_msg_set_head(reply, &r.base);
}

/* Holds rank k's GradNorm p until the barrier completes, or until its hold_ms; want:
 * its reply carries the sum (the rank's first arrival of the step decides). */
static void gn_hold(job_rank *k, ferry_rpc_pending *p, const Ferry__V1__JobStep *js, int want) {
    unsigned hold = js->hold_ms > 60000 ? 60000 : js->hold_ms;
    k->gn = p;
    k->want_sum = want;
    k->hold_until = hold > 0 ? ferry_now() + hold / 1000.0 : 0.0;
}

void ferry__ps_jobs_release_holds(ferry__ps_jobs *j) {
    pthread_mutex_lock(&j->mu);
    double now = ferry_now();
    for (ferry__ps_job *job = j->list; job != NULL; job = job->next) {
        if (job->sync != FERRY__PS_BSP || job->arrived == 0 || job->bsp_complete)
            continue;
        for (uint32_t r = rank_skip(job, 0); r < job->world; r = rank_skip(job, r + 1)) {
            job_rank *k = rank_get(job, r);
            if (k->gn == NULL || k->hold_until == 0.0 || now < k->hold_until)
                continue;
            ferry_rpc_msg m;
            ferry_rpc_msg_init(&m);
            ferry_status st = pending_reply(&m);
            ferry_rpc_pending_finish(k->gn, st, &m); /* the arrival stays */
            k->gn = NULL;
        }
    }
    pthread_mutex_unlock(&j->mu);
}

static void waiter_names(const ferry__ps_job *job, int arrived, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (uint32_t r = 0; r < job->world && n + 24 < cap; r++) {
        if ((rank_peek(job, r)->arrived != 0) == arrived &&
            (job->el_min == 0 || rank_peek(job, r)->member))
            n += (size_t)snprintf(buf + n, cap - n, "%s%u", n ? ", " : "", r);
    }
    if (n == 0)
        (void)snprintf(buf, cap, "none");
}

static ferry_status rejoin_error(const ferry__ps_job *job, uint64_t s, uint32_t rank);

ferry_status ferry__ps_job_grad_norm(ferry__ps_state *ps, ferry__ps_session *sess,
                                     const Ferry__V1__GradNormRequest *q, ferry_rpc_msg *reply) {
    ferry__ps_jobs *j = &ps->jobs;
    const Ferry__V1__JobStep *js = q->job;
    pthread_mutex_lock(&j->mu);
    ferry__ps_job *job = NULL;
    ferry_status st = job_of(j, sess, js, &job);
    if (st == FERRY_OK && job->sync != FERRY__PS_BSP) {
        pthread_mutex_unlock(&j->mu);
        return ferry__ps_grad_norm_context(ps, sess->serial, q, reply);
    }
    uint64_t s = js->step;
    if (st == FERRY_OK && s == job->bsp_step && rank_peek(job, js->rank)->arrived &&
        rank_peek(job, js->rank)->ctx_id == q->ctx_id &&
        rank_peek(job, js->rank)->ctx_sess == sess->serial) {
        /* The same GradNorm again: a retry after its reply was lost or late, or after
         * `pending`. */
        job_rank *k = rank_get(job, js->rank);
        char why[512];
        if (job->bsp_complete && k->has_kept) { /* built when the barrier completed */
            *reply = k->gn_kept;
            ferry_rpc_msg_init(&k->gn_kept);
            k->has_kept = 0;
        } else if (job->bsp_complete) {
            st = bsp_reply(job, reply, k->want_sum);
        } else if ((st = bsp_blocker(job, js->rank, s, why, sizeof why)) != FERRY_OK) {
            (void)ferry_errorf(st, "%s", why); /* a rank it waits for is not coming */
        } else {
            ferry_rpc_pending *p = ferry_rpc_defer(reply);
            if (p == NULL) {
                st = ferry_errorf(FERRY_ERR_UNSUPPORTED, "bsp GradNorm must wait, and this call "
                                                         "cannot (no network call to answer later)");
            } else {
                if (k->gn != NULL) { /* its first attempt's caller gave up on it */
                    (void)ferry_errorf(FERRY_ERR_TIMEOUT, "bsp step %llu: superseded by a retry",
                                       (unsigned long long)s);
                    ferry_rpc_pending_finish(k->gn, FERRY_ERR_TIMEOUT, NULL);
                }
                gn_hold(k, p, js, k->want_sum);
            }
        }
        pthread_mutex_unlock(&j->mu);
        return st;
    }
    if (st == FERRY_OK && s == job->bsp_step && job->bsp_complete && job->inst_reply != NULL &&
        job->inst_step == s && !js->want_sum && !rank_peek(job, js->rank)->arrived) {
        /* Primary-backup: this step came installed from the primary's sum, and this
         * rank's answer from the primary was lost (the primary stalled after answering
         * the installer): the answer the primary gave, which the installer brought. */
        Ferry__V1__GradNormReply *r =
            ferry__v1__grad_norm_reply__unpack(NULL, job->inst_len, job->inst_reply);
        st = r != NULL ? ferry_rpc_msg_set_head(reply, &r->base) : FERRY_NOMEM();
        if (r != NULL)
            ferry__v1__grad_norm_reply__free_unpacked(r, NULL);
        if (st == FERRY_OK)
            FERRY_LOG_INFO("bsp step %llu of job '%s': rank %u's GradNorm answered as the "
                           "shard's primary answered it (the step came installed here)",
                           (unsigned long long)s, job->name, js->rank);
        /* Its calls of the step, replayed here, made a context whose gradient the
         * installed sum already holds: it ends now. */
        ferry__ps_ctx *c = NULL;
        if (st == FERRY_OK &&
            ferry__ps_ctx_acquire(&ps->ctxs, sess->serial, q->ctx_id, 0, &c) == FERRY_OK) {
            ferry__ps_ctx_retire(&ps->ctxs, c, 0);
            ferry__ps_ctx_release(&ps->ctxs, c);
        }
        pthread_mutex_unlock(&j->mu);
        return st;
    }
    if (st == FERRY_OK && q->n_modules != 0)
        st = ferry_errorf(FERRY_ERR_INVALID, "bsp GradNorm covers every module (modules must be "
                                             "empty)");
    if (st == FERRY_OK && job->el_min > 0)
        st = el_barrier(j, job, js);
    if (st == FERRY_OK && !(s == job->bsp_step && !job->bsp_complete)) {
        if (s == job->bsp_step + 1 && job->applied == job->bsp_step) { /* opens step s */
            for (uint32_t r = 0; r < job->world; r++) {
                job_rank *w = rank_get(job, r);
                if (w != NULL)
                    w->arrived = 0;
            }
            job->bsp_step = s;
            job->bsp_complete = 0;
            job->arrived = 0;
            job->sum_rank = 0;
            kept_clear(job);
            inst_clear(j, job);
            for (uint32_t r = rank_skip(job, 0); r < job->world; r = rank_skip(job, r + 1)) {
                job_rank *w = rank_get(job, r); /* Steps waiting for an install of s */
                if (w->sp != NULL && w->sp_step == s) {
                    ferry_status es = rejoin_error(job, s, r);
                    ferry_rpc_pending_finish(w->sp, es, NULL);
                    w->sp = NULL;
                }
            }
        } else {
            st = ferry_errorf(FERRY_ERR_INVALID,
                              "bsp: rank %u sent GradNorm of step %llu, but job '%s' is at step "
                              "%llu (%s)",
                              js->rank, (unsigned long long)s, job->name,
                              (unsigned long long)job->bsp_step,
                              !job->bsp_complete              ? "collecting"
                              : job->applied == job->bsp_step ? "summed and applied"
                                                              : "summed, not applied yet");
        }
    }
    job_rank *k = st == FERRY_OK ? rank_get(job, js->rank) : NULL; /* joined: it exists */
    if (st == FERRY_OK && k->arrived)
        st = ferry_errorf(FERRY_ERR_EXISTS, "bsp step %llu: rank %u sent GradNorm twice",
                          (unsigned long long)s, js->rank);
    if (st == FERRY_OK && js->want_sum && job->sum_rank != 0)
        st = ferry_errorf(FERRY_ERR_INVALID,
                          "bsp step %llu: rank %u asks for the summed gradient, but rank %u "
                          "already does (one rank per step ships it)",
                          (unsigned long long)s, js->rank, job->sum_rank - 1);
    char absent[512];
    if (st == FERRY_OK && (st = bsp_blocker(job, js->rank, s, absent, sizeof absent)) != FERRY_OK) {
        job_fail_waiters(job, st, absent); /* they wait for the same rank */
        (void)ferry_errorf(st, "%s", absent);
    }
    if (st != FERRY_OK) {
        pthread_mutex_unlock(&j->mu);
        return st;
    }
    k->arrived = 1;
    if (js->want_sum)
        job->sum_rank = js->rank + 1;
    k->ctx_id = q->ctx_id;
    k->ctx_sess = sess->serial;
    k->loss_sum = js->loss_sum;
    k->tokens = js->tokens;
    k->ck = js->checkpoint;
    k->readmit = js->readmit;
    job->arrived++;
    if (job->arrived < (job->el_min > 0 ? job->bar_n : job->world)) {
        ferry_rpc_pending *p = ferry_rpc_defer(reply);
        if (p == NULL) {
            k->arrived = 0;
            job->arrived--;
            if (job->sum_rank == js->rank + 1)
                job->sum_rank = 0;
            st = ferry_errorf(FERRY_ERR_UNSUPPORTED, "bsp GradNorm must wait, and this call "
                                                     "cannot (no network call to answer later)");
        } else {
            gn_hold(k, p, js, js->want_sum);
            k->wait_since = ferry_now();
        }
        pthread_mutex_unlock(&j->mu);
        return st;
    }
    /* The last rank: sum, answer everyone. */
    if ((st = bsp_sum(ps, job)) != FERRY_OK) {
        char why[512];
        (void)snprintf(why, sizeof why, "%s", ferry_error_last());
        job_fail_waiters(job, st, why);
        (void)ferry_errorf(st, "%s", why);
        pthread_mutex_unlock(&j->mu);
        return st;
    }
    double now = ferry_now();
    for (uint32_t r = 0; r < job->world; r++) {
        job_rank *w = rank_get(job, r);
        if (w == NULL || r == js->rank || !w->arrived) /* elastic: a rank not a member */
            continue;
        if (w->gn == NULL) { /* answered `pending`: its next GradNorm gets this */
            ferry_rpc_msg_init(&w->gn_kept);
            w->has_kept = bsp_reply(job, &w->gn_kept, w->want_sum) == FERRY_OK;
            if (!w->has_kept)
                ferry_rpc_msg_deinit(&w->gn_kept);
            continue;
        }
        ferry_rpc_msg m;
        ferry_rpc_msg_init(&m);
        ferry_status ws = bsp_reply(job, &m, w->want_sum);
        ferry_rpc_pending_finish(w->gn, ws, &m);
        w->gn = NULL;
        w->waited_s += now - w->wait_since;
    }
    st = bsp_reply(job, reply, js->want_sum);
    pthread_mutex_unlock(&j->mu);
    return st;
}

/* A Step's installed sum (StepRequest.install): the modules, found as session sess may
 * use them, with their gradients, read whole before the job is touched. */
typedef struct install {
    ferry__ps_ctx_mod *mods;
    int n;
} install;

static void install_free(install *in) {
    for (int i = 0; i < in->n; i++) {
        ferry_grads_deinit(&in->mods[i].G);
        ferry__ps_module_put(in->mods[i].mod);
    }
    free(in->mods);
    in->mods = NULL;
    in->n = 0;
}

static ferry_status install_param(ferry_grads *G, int idx, const ferry_rpc_msg *req, size_t *t,
                                  size_t end) {
    const ferry_param *p = &G->P->items[idx];
    const ferry_rpc_tensor *a = &req->tensors[*t];
    if (!(p->flags & FERRY_PARAM_ROW_SPARSE)) {
        if (a->dtype != FERRY_RPC_DTYPE_F32 || a->ndim != 1 || a->dim[0] != p->numel)
            return ferry_errorf(FERRY_ERR_SHAPE, "'%s' needs %lld float32 values", p->name,
                                (long long)p->numel);
        float *dst = ferry_grads_dense(G, idx);
        if (dst == NULL)
            return FERRY_NOMEM();
        *t += 1;
        return ferry_backend_copy(G->P->be, dst, a->data, a->nbytes, FERRY_COPY_HOST_TO_DEVICE);
    }
    const ferry_rpc_tensor *v = *t + 1 < end ? &req->tensors[*t + 1] : NULL;
    int64_t D = G->rows[idx].D;
    if (a->dtype != FERRY_RPC_DTYPE_I64 || a->ndim != 1 || v == NULL ||
        v->dtype != FERRY_RPC_DTYPE_F32 || v->ndim != 2 || v->dim[0] != a->dim[0] ||
        v->dim[1] != D || a->dim[0] > INT32_MAX)
        return ferry_errorf(FERRY_ERR_SHAPE,
                            "row-sparse '%s' needs int64 row ids (count) then "
                            "float32 rows (count, %lld)",
                            p->name, (long long)D);
    int64_t count = a->dim[0];
    int32_t *ids = malloc((size_t)(count > 0 ? count : 1) * 2 * sizeof *ids);
    if (ids == NULL)
        return FERRY_NOMEM();
    int32_t *slots = ids + count;
    const int64_t *rows = a->data;
    ferry_status st = FERRY_OK;
    for (int64_t i = 0; i < count && st == FERRY_OK; i++) {
        if (rows[i] < 0 || rows[i] > INT32_MAX)
            st = ferry_errorf(FERRY_ERR_RANGE, "'%s': row %lld", p->name, (long long)rows[i]);
        ids[i] = (int32_t)rows[i];
    }
    if (st == FERRY_OK)
        st = ferry_grads_row_slots(G, idx, count, ids, slots);
    if (st == FERRY_OK && G->rows[idx].count != count)
        st = ferry_errorf(FERRY_ERR_INVALID, "'%s': a row id repeats", p->name);
    const float *src = v->data;
    for (int64_t i = 0; i < count && st == FERRY_OK; i++) /* the backend's memory */
        st = ferry_backend_copy(G->P->be, G->rows[idx].values + (int64_t)slots[i] * D, src + i * D,
                                (size_t)D * sizeof *src, FERRY_COPY_HOST_TO_DEVICE);
    free(ids);
    *t += 2;
    return st;
}

/* Reads StepRequest.install (proto: SummedModule) into *in. */
static ferry_status install_read(ferry__ps_state *ps, const ferry__ps_session *sess,
                                 const Ferry__V1__StepRequest *q, const ferry_rpc_msg *req,
                                 install *in) {
    memset(in, 0, sizeof *in);
    if (q->n_summed == 0 || q->n_summed > 4096)
        return ferry_errorf(FERRY_ERR_INVALID, "install: %zu modules (1 to 4096)", q->n_summed);
    if ((in->mods = calloc(q->n_summed + 1, sizeof *in->mods)) == NULL)
        return FERRY_NOMEM();
    size_t t = 0, ntensors = (size_t)req->ntensors;
    ferry_status st = FERRY_OK;
    for (size_t i = 0; i < q->n_summed && st == FERRY_OK; i++) {
        const Ferry__V1__SummedModule *sm = q->summed[i];
        ferry__ps_module *m = ferry__ps_module_find(ps, sess, sm->module);
        if (m == NULL)
            return ferry_errorf(FERRY_ERR_NOT_FOUND, "install: no module '%s'", sm->module);
        for (int k = 0; k < in->n; k++) {
            if (in->mods[k].mod == m) {
                ferry__ps_module_put(m);
                return ferry_errorf(FERRY_ERR_INVALID, "install: module '%s' twice", sm->module);
            }
        }
        ferry__ps_ctx_mod *e = &in->mods[in->n];
        e->mod = m;
        if ((st = ferry_grads_init(&e->G, &m->P)) != FERRY_OK) {
            ferry__ps_module_put(m);
            break;
        }
        in->n++;
        e->penalty_done = sm->penalty_done;
        e->penalty = sm->penalty;
        e->feasibility = sm->feasibility;
        if (sm->tensors > ntensors - t) {
            st = ferry_errorf(FERRY_ERR_INVALID, "install: module '%s' has %u tensors, %zu left",
                              sm->module, sm->tensors, ntensors - t);
            break;
        }
        size_t end = t + sm->tensors;
        pthread_rwlock_rdlock(&m->lock); /* its parameter table */
        while (t < end && st == FERRY_OK) {
            int idx = ferry_params_find(&m->P, req->tensors[t].name);
            if (idx < 0 || e->G.touched[idx])
                st = ferry_errorf(FERRY_ERR_INVALID, "install: module '%s': %s parameter '%s'",
                                  sm->module, idx < 0 ? "no" : "repeated", req->tensors[t].name);
            else
                st = install_param(&e->G, idx, req, &t, end);
        }
        pthread_rwlock_unlock(&m->lock);
    }
    if (st == FERRY_OK && t != ntensors)
        st = ferry_errorf(FERRY_ERR_INVALID, "install: %zu tensors beyond the modules'",
                          ntensors - t);
    return st;
}

/* Answers rank k's Step of the last applied step (the step's reply: version, metrics). */
static ferry_status applied_reply(const ferry__ps_job *job, ferry_rpc_msg *reply);

/* The answer to a Step of step s that waits for, or arrives at, a barrier of s opened
 * here: the shard's primary that summed it is gone, and a rank that failed over
 * re-sums it here. The rank replays its calls of the step here (its GradNorm too) and
 * steps again (the client knows this error by its words). */
static ferry_status rejoin_error(const ferry__ps_job *job, uint64_t s, uint32_t rank) {
    return ferry_errorf(FERRY_ERR_BUSY,
                        "bsp step %llu of job '%s': its barrier opened here without rank %u: "
                        "replay the step here",
                        (unsigned long long)s, job->name, rank);
}

/* bsp Step: the first Step of a summed step applies it; later ones acknowledge. A
 * Step that installs the sum (in != NULL) on a server that did not sum the step
 * applies the installed one; a plain Step that arrives first waits for it. */
static ferry_status bsp_step(ferry__ps_jobs *j, ferry__ps_job *job, const Ferry__V1__StepRequest *q,
                             install *in, ferry_rpc_msg *reply) {
    const Ferry__V1__JobStep *js = q->job;
    uint64_t s = js->step;
    double scale = q->scale != 0.0 ? q->scale : 1.0;
    ferry_status st = FERRY_OK;
    /* An elastic Step applies under the barrier's epoch; a late one of a step applied
     * already is only acknowledged (the next step's barrier may run a newer epoch). */
    if (job->el_min > 0 && s > job->applied && js->epoch != job->bar_epoch)
        return ferry_errorf(FERRY_ERR_ABORTED,
                            "bsp step %llu of job '%s': rank %u steps under membership epoch %llu, "
                            "but the step runs under epoch %llu: ask the coordinator",
                            (unsigned long long)s, job->name, js->rank,
                            (unsigned long long)js->epoch, (unsigned long long)job->bar_epoch);
    int unsummed = s == job->applied + 1 && job->bsp_step + 1 == s && !job->recovering;
    if (unsummed && job->el_min > 0) /* no replicas: nothing installs it */
        return ferry_errorf(FERRY_ERR_INVALID,
                            "bsp step %llu of elastic job '%s' has no barrier here yet (GradNorm "
                            "first)",
                            (unsigned long long)s, job->name);
    if (s == job->applied + 1 && job->bsp_step == s && !job->bsp_complete && !job->recovering &&
        !rank_peek(job, js->rank)->arrived)
        return rejoin_error(job, s, js->rank);
    if (in != NULL && unsummed) { /* the primary's sum becomes this step's */
        agg_free(job);
        kept_clear(job);
        inst_clear(j, job);
        const Ferry__V1__GradNormReply *ans = q->installed;
        size_t n = ans != NULL ? ferry__v1__grad_norm_reply__get_packed_size(ans) : 0;
        if (n > 0 && n <= INST_REPLY_MAX && ans->n_sum == 0 && ans->n_tensors == 0 &&
            !ans->pending && (job->inst_reply = malloc(n)) != NULL) {
            job->inst_len = ferry__v1__grad_norm_reply__pack(ans, job->inst_reply);
            job->inst_step = s;
            job->bytes += (int64_t)job->inst_len;
            j->bytes += (int64_t)job->inst_len;
        }
        for (uint32_t r = rank_skip(job, 0); r < job->world; r = rank_skip(job, r + 1))
            rank_get(job, r)->arrived = 0;
        job->agg = in->mods;
        job->nagg = in->n;
        in->mods = NULL;
        in->n = 0;
        job->bsp_step = s;
        job->bsp_complete = 1;
        job->arrived = 0;
    } else if (in == NULL && unsummed && job->failed[0] == '\0') {
        job_rank *k = rank_get(job, js->rank); /* joined: it exists */
        ferry_rpc_pending *p = ferry_rpc_defer(reply);
        if (p == NULL)
            return ferry_errorf(FERRY_ERR_UNSUPPORTED, "bsp Step must wait, and this call "
                                                       "cannot (no network call to answer later)");
        if (k->sp != NULL) { /* a retry of the waiting Step replaces it */
            (void)ferry_errorf(FERRY_ERR_TIMEOUT, "bsp: superseded by a retry");
            ferry_rpc_pending_finish(k->sp, FERRY_ERR_TIMEOUT, NULL);
        }
        k->sp = p;
        k->sp_step = s;
        k->sp_scale = scale;
        k->wait_since = ferry_now();
        return FERRY_OK;
    }
    if (s == job->bsp_step && job->bsp_complete && job->applied + 1 == s) {
        job_metric *mt = calloc(3 * (size_t)job->nagg + 1, sizeof *mt);
        if (mt == NULL)
            return FERRY_NOMEM();
        int nm = 0;
        uint64_t vmax = 0;
        for (int i = 0; i < job->nagg && st == FERRY_OK; i++) {
            ferry__ps_ctx_mod *e = &job->agg[i];
            uint64_t v = 0;
            if ((st = ferry__ps_step_module(NULL, NULL, e, scale, q->lr, &v)) != FERRY_OK)
                break;
            vmax = v > vmax ? v : vmax;
            (void)snprintf(mt[nm].name, sizeof mt[nm].name, "version/%s", e->mod->name);
            mt[nm++].value = (double)v;
            if (ferry__ps_constrained(e->mod)) {
                (void)snprintf(mt[nm].name, sizeof mt[nm].name, "penalty/%s", e->mod->name);
                mt[nm++].value = e->penalty;
                (void)snprintf(mt[nm].name, sizeof mt[nm].name, "feasibility/%s", e->mod->name);
                mt[nm++].value = e->feasibility;
            }
        }
        agg_free(job);
        /* Applied or not, this step's gradients are spent: a retry must not apply
         * them again. A failure fails the job (its replicas would differ). */
        job->applied = s;
        job->applied_scale = scale;
        job->applied_version = vmax;
        free(job->applied_metrics);
        job->applied_metrics = mt;
        job->napplied_metrics = nm;
        if (st != FERRY_OK) {
            char why[512];
            (void)snprintf(why, sizeof why, "bsp step %llu: %s", (unsigned long long)s,
                           ferry_error_last());
            job_fail(job, why);
            return ferry_errorf(st, "%s", why);
        }
        if (job->epoch > 0) /* the coordinator of an elastic job: a step boundary */
            el_boundary(j, job, s);
    } else if (s == job->applied && s > 0) {
        if (scale != job->applied_scale)
            return ferry_errorf(FERRY_ERR_INVALID,
                                "bsp step %llu of job '%s': rank %u steps with gradient scale "
                                "%.9g, but the step was applied with %.9g",
                                (unsigned long long)s, job->name, js->rank, scale,
                                job->applied_scale);
    } else {
        return ferry_errorf(
            FERRY_ERR_INVALID,
            "bsp: rank %u sent Step of step %llu, but job '%s' has applied step "
            "%llu and %s step %llu",
            js->rank, (unsigned long long)s, job->name, (unsigned long long)job->applied,
            job->bsp_complete ? "summed" : "is collecting", (unsigned long long)job->bsp_step);
    }
    job_rank *k = rank_get(job, js->rank); /* joined: it exists */
    k->steps = s > k->steps ? s : k->steps;
    for (uint32_t w = rank_skip(job, 0); w < job->world; w = rank_skip(job, w + 1)) {
        job_rank *o = rank_get(job, w);       /* Steps that waited for this one */
        if (o->sp == NULL || o->sp_step != s) /* (its own: an attempt its caller left) */
            continue;
        ferry_rpc_msg m;
        ferry_rpc_msg_init(&m);
        ferry_status ws = o->sp_scale == job->applied_scale
                              ? applied_reply(job, &m)
                              : ferry_errorf(FERRY_ERR_INVALID,
                                             "bsp step %llu of job '%s': rank %u steps with "
                                             "gradient scale %.9g, but the step was applied "
                                             "with %.9g",
                                             (unsigned long long)s, job->name, w, o->sp_scale,
                                             job->applied_scale);
        ferry_rpc_pending_finish(o->sp, ws, ws == FERRY_OK ? &m : NULL);
        o->sp = NULL;
        if (ws == FERRY_OK)
            o->steps = s > o->steps ? s : o->steps;
    }
    return applied_reply(job, reply);
}

static ferry_status applied_reply(const ferry__ps_job *job, ferry_rpc_msg *reply) {
    ferry_status st;
    Ferry__V1__StepReply r;
    ferry__v1__step_reply__init(&r);
    r.version = job->applied_version;
    Ferry__V1__Metric *metrics = calloc((size_t)job->napplied_metrics + 2, sizeof *metrics);
    Ferry__V1__Metric **ptrs = calloc((size_t)job->napplied_metrics + 2, sizeof *ptrs);
    if (metrics == NULL || ptrs == NULL) {
        st = FERRY_NOMEM();
    } else {
        int n = job->napplied_metrics;
        for (int i = 0; i < n; i++) {
            ferry__v1__metric__init(&metrics[i]);
            metrics[i].name = job->applied_metrics[i].name;
            metrics[i].value = job->applied_metrics[i].value;
            ptrs[i] = &metrics[i];
        }
        if (job->epoch > 0) { /* the coordinator: the membership the next step runs under */
            ferry__v1__metric__init(&metrics[n]);
            metrics[n].name = (char *)(uintptr_t) "elastic/epoch";
            metrics[n].value = (double)job->epoch;
            ptrs[n] = &metrics[n];
            n++;
        }
        r.metrics = ptrs;
        r.n_metrics = (size_t)n;
        st = ferry_rpc_msg_set_head(reply, &r.base);
    }
    free(metrics);
    free(ptrs);
    return st;
}

/* ---- ssp ---- */

/* Answers every held Step whose rank is now within the bound. */
static void ssp_release(ferry__ps_job *job) {
    uint64_t min = job_min_steps(job, NULL);
    double now = ferry_now();
    for (uint32_t r = 0; r < job->world; r++) {
        job_rank *k = rank_get(job, r);
        if (k == NULL || k->sp == NULL || k->sp_step - min > job->K)
            continue;
        uint64_t lead = k->sp_step - min;
        job->max_lead = lead > job->max_lead ? lead : job->max_lead;
        ferry_rpc_pending_finish(k->sp, FERRY_OK, &k->sp_reply);
        k->sp = NULL;
        k->waited_s += now - k->wait_since;
    }
}

ferry_status ferry__ps_job_step(ferry__ps_state *ps, ferry__ps_session *sess,
                                const Ferry__V1__StepRequest *q, const ferry_rpc_msg *req,
                                ferry_rpc_msg *reply) {
    ferry__ps_jobs *j = &ps->jobs;
    const Ferry__V1__JobStep *js = q->job;
    install in = {NULL, 0};
    ferry__ps_job *job = NULL;
    ferry_status st = FERRY_OK;
    if (q->install) { /* the rank is the session's before its bytes are read */
        pthread_mutex_lock(&j->mu);
        st = job_of(j, sess, js, &job);
        pthread_mutex_unlock(&j->mu);
        if (st == FERRY_OK)
            st = install_read(ps, sess, q, req, &in);
    }
    if (st != FERRY_OK) {
        char why[512];
        (void)snprintf(why, sizeof why, "%s", ferry_error_last());
        install_free(&in);
        return ferry_errorf(st, "bsp Step of step %llu: %s", (unsigned long long)js->step, why);
    }
    pthread_mutex_lock(&j->mu);
    st = job_of(j, sess, js, &job);
    if (st == FERRY_OK && q->install && job->sync != FERRY__PS_BSP)
        st = ferry_errorf(FERRY_ERR_INVALID, "Step: install is for bsp jobs");
    /* An elastic ssp or async job: the coordinator takes Steps of its members only;
     * another server counts a rank from its first Step there. */
    if (st == FERRY_OK && el_async(job)) {
        job_rank *k = rank_get(job, js->rank); /* joined: it exists */
        if (job->epoch > 0 && el_index(job, js->rank) < 0)
            st = ferry_errorf(FERRY_ERR_ABORTED,
                              "job '%s': rank %u is not a member of the elastic job (it left, "
                              "or the membership dropped it): be admitted first",
                              job->name, js->rank);
        else if (!k->member && js->step > 0) {
            k->member = 1;
            k->steps = js->step - 1;
        }
    }
    if (st == FERRY_OK && job->sync == FERRY__PS_BSP)
        st = bsp_step(j, job, q, q->install ? &in : NULL, reply);
    install_free(&in);
    if (st != FERRY_OK || job->sync == FERRY__PS_BSP) {
        pthread_mutex_unlock(&j->mu);
        return st;
    }
    pthread_mutex_unlock(&j->mu);
    /* ssp, async: the rank's own gradients, now (jobs never go away while serving). */
    if ((st = ferry__ps_step_context(ps, sess->serial, q, reply)) != FERRY_OK)
        return st;
    pthread_mutex_lock(&j->mu);
    job_rank *k = rank_get(job, js->rank); /* joined: it exists */
    k->steps = js->step > k->steps ? js->step : k->steps;
    if (job->el_min > 0 && js->step > job->applied) /* elastic: the most steps taken */
        job->applied = js->step;
    if (job->sync == FERRY__PS_SSP) {
        uint64_t min = job_min_steps(job, NULL);
        uint64_t lead = js->step > min ? js->step - min : 0;
        uint32_t slow = 0;
        (void)job_min_steps(job, &slow);
        char why[400];
        ferry_status gone = lead > job->K ? rank_absent(job, slow, why, sizeof why) : FERRY_OK;
        if (gone != FERRY_OK) { /* the rank it would wait for is not coming: now, not later */
            pthread_mutex_unlock(&j->mu);
            return ferry_errorf(gone, "ssp:%u of job '%s': step %llu applied, but %s", job->K,
                                job->name, (unsigned long long)js->step, why);
        }
        if (lead > job->K && !j->stopped && job->failed[0] == '\0') {
            ferry_rpc_pending *p = ferry_rpc_defer(reply);
            if (p != NULL && k->sp != NULL) { /* a retry of the held Step replaces it */
                (void)ferry_errorf(FERRY_ERR_TIMEOUT, "ssp: superseded by a retry");
                ferry_rpc_pending_finish(k->sp, FERRY_ERR_TIMEOUT, NULL);
                ferry_rpc_msg_deinit(&k->sp_reply);
                k->sp = NULL;
                job->held--;
            }
            if (p != NULL) { /* held until the slowest catches up */
                k->sp = p;
                k->sp_reply = *reply; /* moved: the built reply waits here */
                ferry_rpc_msg_init(reply);
                k->sp_step = js->step;
                k->wait_since = ferry_now();
                job->held++;
            }
        } else if (lead <= job->K) {
            job->max_lead = lead > job->max_lead ? lead : job->max_lead;
        }
        ssp_release(job);
    }
    pthread_mutex_unlock(&j->mu);
    return FERRY_OK;
}

/* ---- time-outs, metrics ---- */

/* 1 when nothing keeps the job: finished or failed, or no live session holds a rank of
 * it and no call waits on it. jobs->mu held. */
static int job_idle(ferry__ps_jobs *j, ferry__ps_sessions *S, const ferry__ps_job *job) {
    if (job->finished || job->failed[0] != '\0')
        return 1;
    if (job->recovering)
        return 0;
    for (uint32_t r = rank_skip(job, 0); r < job->world; r = rank_skip(job, r + 1)) {
        const job_rank *k = rank_peek(job, r);
        if (k->gn != NULL || k->sp != NULL || k->rec != NULL || k->admit != NULL ||
            (k->joined && k->sess != 0 && ferry__ps_session_holds(S, k->sess)))
            return 0;
    }
    (void)j;
    return 1;
}

/* Frees the jobs idle (job_idle) for longer than the jobs' TTL; jobs->mu held. */
static void jobs_collect(ferry__ps_jobs *j, ferry__ps_sessions *S, double now) {
    for (ferry__ps_job **pp = &j->list; *pp != NULL;) {
        ferry__ps_job *job = *pp;
        if (!job_idle(j, S, job)) {
            job->idle_since = now;
        } else if (now - job->idle_since > j->ttl_s) {
            FERRY_LOG_INFO("job '%s' of '%s' freed: %s for %.0f s (--job-ttl)", job->name,
                           job->owner,
                           job->finished            ? "finished"
                           : job->failed[0] != '\0' ? "failed"
                                                    : "no live trainer held a rank",
                           now - job->idle_since);
            *pp = job->next;
            job_free(j, job);
            continue;
        }
        pp = &job->next;
    }
}

void ferry__ps_jobs_expire(ferry__ps_jobs *j, ferry__ps_sessions *S) {
    pthread_mutex_lock(&j->mu);
    double now = ferry_now();
    jobs_collect(j, S, now);
    for (ferry__ps_job *job = j->list; job != NULL; job = job->next) {
        if (job->mv_state != MV_NONE && now - job->mv_since > job->wait_s) {
            char why[320];
            (void)snprintf(why, sizeof why,
                           "job '%s': the move of its servers to %s was not %s within %.1f s "
                           "(--sync-timeout)",
                           job->name, job->mv_list,
                           job->mv_state == MV_PENDING ? "reached at a step boundary" : "committed",
                           now - job->mv_since);
            FERRY_LOG_WARN("%s%s", why,
                           mv_touched(job) ? ": servers took their rows, the job fails"
                                           : ": called off, the members go on where they are");
            if (mv_touched(job))
                job_fail(job, why);
            mv_end(job);
        }
        if (job->recovering && now - job->rec_since > job->wait_s) {
            char missing[128], why[400];
            size_t n = 0;
            missing[0] = '\0';
            for (uint32_t r = 0; r < job->world && n + 24 < sizeof missing; r++) {
                if (!rank_peek(job, r)->rec_arrived && !rec_completed(job, r))
                    n += (size_t)snprintf(missing + n, sizeof missing - n, "%s%u", n ? ", " : "",
                                          r);
            }
            (void)snprintf(why, sizeof why,
                           "job '%s' could not roll back: rank %s did not come back within %.1f s "
                           "(--sync-timeout)",
                           job->name, missing, now - job->rec_since);
            FERRY_LOG_WARN("%s", why);
            rec_fail(job, FERRY_ERR_TIMEOUT, why);
        }
        for (uint32_t r = rank_skip(job, 0); r < job->world; r = rank_skip(job, r + 1)) {
            job_rank *k = rank_get(job, r);
            if (k->admit != NULL && now - k->admit_since > job->wait_s) {
                (void)ferry_errorf(FERRY_ERR_TIMEOUT,
                                   "elastic job '%s': rank %u was not admitted within %.1f s (no "
                                   "step boundary; --sync-timeout)",
                                   job->name, r, now - k->admit_since);
                ferry_rpc_pending_finish(k->admit, FERRY_ERR_TIMEOUT, NULL);
                k->admit = NULL;
            }
            if (k->gn != NULL && now - k->wait_since > job->wait_s) {
                char missing[128], arrived[128], why[400];
                waiter_names(job, 0, missing, sizeof missing);
                waiter_names(job, 1, arrived, sizeof arrived);
                (void)snprintf(why, sizeof why,
                               "bsp step %llu of job '%s': rank %s missing after %.1f s "
                               "(--sync-timeout; arrived: %s)",
                               (unsigned long long)job->bsp_step, job->name, missing,
                               now - k->wait_since, arrived);
                job_fail(job, why);
                break;
            }
            if (k->sp != NULL && job->sync == FERRY__PS_BSP && now - k->wait_since > job->wait_s) {
                (void)ferry_errorf(FERRY_ERR_TIMEOUT,
                                   "bsp step %llu of job '%s': rank %u's Step waited %.1f s for "
                                   "the Step that installs the step's sum (--sync-timeout)",
                                   (unsigned long long)k->sp_step, job->name, r,
                                   now - k->wait_since);
                ferry_rpc_pending_finish(k->sp, FERRY_ERR_TIMEOUT, NULL);
                k->sp = NULL;
                continue;
            }
            if (k->sp != NULL && now - k->wait_since > job->wait_s) {
                uint32_t slow = 0;
                uint64_t min = job_min_steps(job, &slow);
                char why[512];
                (void)snprintf(why, sizeof why,
                               "ssp:%u of job '%s': rank %u at step %llu waited %.1f s for rank "
                               "%u, still at step %llu (--sync-timeout)",
                               job->K, job->name, r, (unsigned long long)k->sp_step,
                               now - k->wait_since, slow, (unsigned long long)min);
                job_fail(job, why);
                break;
            }
        }
    }
    pthread_mutex_unlock(&j->mu);
}

void ferry__ps_jobs_metrics(ferry__ps_jobs *j, const char *owner, ferry__ps_metric_fn add,
                            void *user) {
    char name[FERRY_RPC_NAME_MAX + 32];
    pthread_mutex_lock(&j->mu);
    add(user, "jobs", (double)j->count);
    add(user, "job_bytes", (double)j->bytes);
    int listed = 0, unlisted = 0;
    for (ferry__ps_job *job = j->list; job != NULL; job = job->next) {
        if (owner != NULL && strcmp(job->owner, owner) != 0)
            continue;
        if (listed == JOB_METRICS_MAX) { /* the page stays bounded whatever the count */
            unlisted++;
            continue;
        }
        listed++;
#define JOB_METRIC(fmt, ...)                                                                       \
    do {                                                                                           \
        (void)snprintf(name, sizeof name, "job/%s/" fmt, job->name, __VA_ARGS__);                  \
    } while (0)
        JOB_METRIC("%s", "world");
        add(user, name, (double)job->world);
        JOB_METRIC("%s", "joined");
        add(user, name, (double)job->joined);
        JOB_METRIC("%s", "finished");
        add(user, name, (double)job->finished);
        JOB_METRIC("%s", "recoveries");
        add(user, name, (double)job->recoveries);
        JOB_METRIC("%s", "failed");
        add(user, name, job->failed[0] != '\0');
        JOB_METRIC("%s", "min_step");
        add(user, name, (double)job_min_steps(job, NULL));
        if (job->sync == FERRY__PS_BSP) {
            JOB_METRIC("%s", "applied");
            add(user, name, (double)job->applied);
            JOB_METRIC("%s", "arrived"); /* at the open barrier, waiting for the others */
            add(user, name, job->bsp_complete ? 0.0 : (double)job->arrived);
        }
        if (job->el_min > 0) { /* the coordinator's membership, else the open barrier's */
            JOB_METRIC("%s", "elastic_epoch");
            add(user, name, (double)(job->epoch > 0 ? job->epoch : job->bar_epoch));
            JOB_METRIC("%s", "elastic_members");
            add(user, name, (double)(job->epoch > 0 ? job->nmembers : job->bar_n));
        }
        if (job->epoch > 0) { /* the coordinator: moves of the job's servers */
            JOB_METRIC("%s", "servers_epoch");
            add(user, name, (double)job->srv_epoch);
            JOB_METRIC("%s", "servers_moving");
            add(user, name, job->mv_state == MV_HOLD);
            JOB_METRIC("%s", "last_move_bytes");
            add(user, name, (double)job->mv_bytes);
            JOB_METRIC("%s", "last_move_seconds");
            add(user, name, job->mv_seconds);
        }
        if (job->sync == FERRY__PS_SSP) {
            JOB_METRIC("%s", "max_lead");
            add(user, name, (double)job->max_lead);
            JOB_METRIC("%s", "held");
            add(user, name, (double)job->held);
        }
        for (uint32_t r = 0; r < job->world && r < 64; r++) {
            JOB_METRIC("step/%u", r);
            add(user, name, (double)rank_peek(job, r)->steps);
            JOB_METRIC("waited_s/%u", r);
            add(user, name, rank_peek(job, r)->waited_s);
        }
#undef JOB_METRIC
    }
    if (unlisted > 0)
        add(user, "jobs_unlisted", (double)unlisted);
    pthread_mutex_unlock(&j->mu);
}

void ferry__ps_jobs_totals(ferry__ps_jobs *j, int64_t *count, int64_t *bytes) {
    pthread_mutex_lock(&j->mu);
    *count = j->count;
    *bytes = j->bytes;
    pthread_mutex_unlock(&j->mu);
}
