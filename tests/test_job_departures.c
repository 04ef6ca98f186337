/* test_job_departures.c - a rank that is not coming, on an in-process ferry-ps: the
 * waits that need it end at once, not at the job's sync timeout (10 minutes here, so
 * a wait that would last it hangs the test), with an error naming the rank and why.
 * A rank that left early (Leave with a reason) fails a waiting bsp GradNorm, a later
 * one and a recover with FERRY_ERR_ABORTED; a rank whose trainer went away (its
 * client, and so its Session stream, closed) fails them with FERRY_ERR_UNAVAILABLE,
 * and a new session takes the rank again. A rank that completed its run counts in a
 * recover barrier of ranks whose run ends at the same step: a rank restarted after
 * the end rolls back alone; the probe says where the job stands. Temporary files of
 * interrupted checkpoint writes are removed at a ferry-ps start, nothing else. */
#define _POSIX_C_SOURCE 200809L /* nanosleep, mkdtemp */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "ferry/ferry.h"
#include "server/ps.h"

#define JOB_WAIT_MS 600000 /* the jobs' sync timeout: a test that waits for it hangs */

static ferry_ps_server *server_up(const char *checkpoint_dir) {
    ferry_ps_config cfg;
    ferry_ps_config_default(&cfg);
    cfg.listen = "127.0.0.1:0";
    cfg.checkpoint_dir = checkpoint_dir;
    ferry_ps_server *s;
    CHECK_OK(ferry_ps_server_create(&cfg, &s));
    CHECK_OK(ferry_ps_server_start(s));
    return s;
}

static ferry_cluster *connect_to(ferry_ps_server *s, int rank) {
    char target[64];
    (void)snprintf(target, sizeof target, "127.0.0.1:%d", ferry_ps_server_port(s));
    ferry_cluster_config cc;
    ferry_cluster_config_default(&cc);
    cc.worker_id = (uint16_t)rank;
    ferry_cluster *c;
    CHECK_OK(ferry_ps_connect(target, &cc, &c));
    return c;
}

static ferry_job_config job_config(const char *name, int rank) {
    ferry_job_config jc = {.name = name,
                           .world = 2,
                           .rank = rank,
                           .sync = FERRY_SYNC_BSP,
                           .staleness = 0,
                           .sync_timeout_ms = JOB_WAIT_MS,
                           .model = "test=1"};
    return jc;
}

/* Rank 0's step 1 of a job: a dense module's gradient pushed, then GradNorm. */
typedef struct gradnorm_call {
    ferry_cluster *c;
    ferry_job *job;
    ferry_remote *w;
    ferry_dist_ctx *dc;
    ferry_status st;
    char err[512];
} gradnorm_call;

static void gradnorm_prepare(gradnorm_call *g, ferry_cluster *c, ferry_job *job, const char *mod) {
    memset(g, 0, sizeof *g);
    g->c = c;
    g->job = job;
    ferry_remote_config rc;
    ferry_remote_config_default(&rc, FERRY_REMOTE_DENSE, mod, 8, 4);
    rc.bias = 0;
    CHECK_OK(ferry_remote_create(c, &rc, &g->w));
    CHECK_OK(ferry_dist_ctx_create(c, &g->dc));
    (void)ferry_dist_ctx_begin(g->dc);
    float buf[32];
    uint64_t call;
    CHECK_OK(ferry_remote_dense_pull(g->w, g->dc, buf, &call));
    for (int i = 0; i < 32; i++)
        buf[i] = 0.5f;
    CHECK_OK(ferry_remote_dense_push(g->w, g->dc, call, buf));
    CHECK_OK(ferry_dist_ctx_set_job(g->dc, job, 1, 1.0, 1.0));
}

static void *gradnorm_run(void *arg) {
    gradnorm_call *g = arg;
    double ss = 0.0;
    g->st = ferry_dist_ctx_grad_sumsq(g->dc, &ss);
    (void)snprintf(g->err, sizeof g->err, "%s", ferry_error_last());
    return NULL;
}

static void gradnorm_deinit(gradnorm_call *g) {
    ferry_dist_ctx_abandon(g->dc);
    ferry_dist_ctx_destroy(g->dc); /* before the job its context is tied to */
    ferry_remote_destroy(g->w);
}

static void arrived_fn(void *user, const char *name, double value) {
    (void)name;
    *(double *)user = value;
}

/* Waits until `n` ranks of job `name` have arrived at its open bsp barrier. */
static void wait_arrived(ferry_cluster *c, const char *name, int n) {
    char metric[96];
    (void)snprintf(metric, sizeof metric, "job/%s/arrived", name);
    for (double v = -1.0; v != (double)n;) {
        struct timespec ts = {0, 5000000L};
        (void)nanosleep(&ts, NULL);
        CHECK_OK(ferry_cluster_metrics(c, 0, metric, arrived_fn, &v));
    }
}

/* Rank 0 waits in GradNorm; `depart` makes rank 1 go; the wait ends with want. */
static void wait_then_depart(const char *name, void (*depart)(ferry_cluster *b, ferry_job *j1),
                             ferry_status want, const char *phrase) {
    ferry_ps_server *s = server_up(NULL);
    ferry_cluster *a = connect_to(s, 0), *b = connect_to(s, 1);
    ferry_job_config j0c = job_config(name, 0), j1c = job_config(name, 1);
    ferry_job *j0, *j1;
    CHECK_OK(ferry_job_join(a, &j0c, &j0));
    CHECK_OK(ferry_job_join(b, &j1c, &j1));
    char mod[64];
    (void)snprintf(mod, sizeof mod, "%s/w", name);
    gradnorm_call g;
    gradnorm_prepare(&g, a, j0, mod);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, gradnorm_run, &g) == 0);
    wait_arrived(a, name, 1); /* rank 0 waits for rank 1 */
    depart(b, j1);
    CHECK(pthread_join(th, NULL) == 0);
    fprintf(stderr, "  rank 0's GradNorm: %s\n", g.err);
    CHECK_STATUS(g.st, want);
    CHECK(strstr(g.err, phrase) != NULL);
    CHECK(strstr(g.err, "missing after") == NULL); /* not the sync timeout's answer */
    gradnorm_deinit(&g);
    ferry_job_destroy(j0);
    ferry_cluster_destroy(a);
    ferry_ps_server_destroy(s);
}

static void leave_early(ferry_cluster *b, ferry_job *j1) {
    CHECK_OK(ferry_job_leave_after(j1, 0, "ferry-ps 127.0.0.1:1: checkpoint refused: disk full"));
    ferry_job_destroy(j1);
    ferry_cluster_destroy(b);
}

static void go_away(ferry_cluster *b, ferry_job *j1) {
    ferry_job_destroy(j1);    /* no Leave: the process "died" */
    ferry_cluster_destroy(b); /* its Session stream closes */
}

TEST(a_rank_that_left_early_ends_a_waiting_gradnorm) {
    wait_then_depart("left", leave_early, FERRY_ERR_ABORTED,
                     "bsp step 1 of job 'left': rank 1 left the job after step 0 (ferry-ps "
                     "127.0.0.1:1: checkpoint refused: disk full)");
}

TEST(a_rank_whose_trainer_went_away_ends_a_waiting_gradnorm) {
    wait_then_depart("gone", go_away, FERRY_ERR_UNAVAILABLE,
                     "bsp step 1 of job 'gone': rank 1's trainer went away (its connection "
                     "closed)");
}

/* After the departure: a GradNorm that arrives later fails at once too, and so does a
 * roll-back for a rank that left early; a rank that went away is taken again. */
TEST(later_calls_fail_at_once_and_a_restart_takes_the_rank) {
    char dir[] = "/tmp/ferry-departures.XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    ferry_ps_server *s = server_up(dir);
    ferry_cluster *a = connect_to(s, 0), *b = connect_to(s, 1);
    ferry_job_config j0c = job_config("later", 0), j1c = job_config("later", 1);
    ferry_job *j0, *j1;
    CHECK_OK(ferry_job_join(a, &j0c, &j0));
    CHECK_OK(ferry_job_join(b, &j1c, &j1));
    go_away(b, j1);
    gradnorm_call g;
    gradnorm_prepare(&g, a, j0, "later/w");
    gradnorm_run(&g); /* arrives after rank 1 went away */
    CHECK_STATUS(g.st, FERRY_ERR_UNAVAILABLE);
    CHECK(strstr(g.err, "rank 1's trainer went away") != NULL);
    gradnorm_deinit(&g);
    /* A restarted rank 1 takes its rank again at once; then it leaves early. */
    b = connect_to(s, 1);
    CHECK_OK(ferry_job_join(b, &j1c, &j1));
    CHECK_OK(ferry_job_leave_after(j1, 3, "stopped by a signal after step 3"));
    gradnorm_prepare(&g, a, j0, "later/w");
    gradnorm_run(&g);
    CHECK_STATUS(g.st, FERRY_ERR_ABORTED);
    CHECK(strstr(g.err, "rank 1 left the job after step 3 (stopped by a signal after step 3)") !=
          NULL);
    gradnorm_deinit(&g);
    uint64_t offer = 0, resume = 0;
    CHECK_STATUS(ferry_job_recover(j0, &offer, 1, 5000, &resume), FERRY_ERR_ABORTED);
    CHECK(strstr(ferry_error_last(), "job 'later' cannot roll back: rank 1 left the job") != NULL);
    ferry_job_destroy(j1);
    ferry_cluster_destroy(b);
    ferry_job_destroy(j0);
    ferry_cluster_destroy(a);
    ferry_ps_server_destroy(s);
    char cmd[128];
    (void)snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

/* Rank 0 completed a 40-step run and left; rank 1 died after its part of step 40. Its
 * restart (a new session, the same last step) rolls back to 40 alone. */
TEST(a_rank_restarted_after_the_end_rolls_back_alone) {
    char dir[] = "/tmp/ferry-departures.XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    ferry_ps_server *s = server_up(dir);
    ferry_cluster *a = connect_to(s, 0), *b = connect_to(s, 1);
    ferry_job_config j0c = job_config("end", 0), j1c = job_config("end", 1);
    ferry_job *j0, *j1;
    CHECK_OK(ferry_job_join(a, &j0c, &j0));
    CHECK_OK(ferry_job_join(b, &j1c, &j1));
    CHECK_OK(ferry_job_checkpoint(j0, 35));
    CHECK_OK(ferry_job_checkpoint(j0, 40));
    CHECK_OK(ferry_job_leave_after(j0, 40, NULL)); /* its run completed */
    go_away(b, j1);
    b = connect_to(s, 1);
    CHECK_OK(ferry_job_create(b, &j1c, &j1));
    ferry_job_set_last_step(j1, 40);
    ferry_job_probe_result pr;
    CHECK_OK(ferry_job_probe(j1, 0, &pr));
    CHECK_EQ(pr.n, 2);
    CHECK_EQ(pr.completed_step, 40);
    CHECK_EQ(pr.rolling_back, 0);
    CHECK_EQ(pr.finished, 0);
    ferry_job_probe_free(&pr);
    uint64_t offer[2] = {35, 40}, resume = 0;
    CHECK_OK(ferry_job_recover(j1, offer, 2, 5000, &resume)); /* rank 0 counts, at 40 */
    CHECK_EQ(resume, 40);
    CHECK_OK(ferry_job_leave_after(j1, 40, NULL));
    CHECK_OK(ferry_job_probe(j1, 0, &pr));
    CHECK_EQ(pr.finished, 1);
    ferry_job_probe_free(&pr);
    ferry_job_destroy(j1);
    ferry_cluster_destroy(b);
    ferry_job_destroy(j0);
    ferry_cluster_destroy(a);
    ferry_ps_server_destroy(s);
    char cmd[128];
    (void)snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

static void write_file(const char *dir, const char *name, const void *data, size_t n) {
    char path[256];
    (void)snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(data, 1, n, f) == n);
    CHECK(fclose(f) == 0);
}

static int exists(const char *dir, const char *name) {
    char path[256];
    (void)snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

/* What a ferry-ps removes at start: the temporary files of its checkpoint writes (the
 * name ".<name>.XXXXXX" with the magic, a prefix of it, or nothing), nothing else. */
TEST(a_starting_ferry_ps_removes_only_its_interrupted_writes) {
    char dir[] = "/tmp/ferry-departures.XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    write_file(dir, ".j-step5.ckpt.Ab12Cd", "FERRYPS3\3\0\0\0garbage", 20); /* cut off */
    write_file(dir, ".j-step10.ckpt.Ef34Gh", "FERR", 4);                    /* a prefix */
    write_file(dir, ".j-step15.ckpt.Ij56Kl", "", 0);                        /* empty */
    write_file(dir, ".j-step20.ckpt.Mn78Op", "FERRYCK2 a trainer's", 20);   /* other magic */
    write_file(dir, ".notes.Qr90St", "keep", 4);                            /* not ours */
    write_file(dir, ".j-step25.ckpt.Uv12", "FERRYPS3", 8);                  /* not mkostemp's */
    write_file(dir, "j-step30.ckpt.Wx34Yz", "FERRYPS3", 8);                 /* not hidden */
    ferry_ps_server *s = server_up(dir);
    ferry_ps_server_destroy(s);
    CHECK(!exists(dir, ".j-step5.ckpt.Ab12Cd"));
    CHECK(!exists(dir, ".j-step10.ckpt.Ef34Gh"));
    CHECK(!exists(dir, ".j-step15.ckpt.Ij56Kl"));
    CHECK(exists(dir, ".j-step20.ckpt.Mn78Op"));
    CHECK(exists(dir, ".notes.Qr90St"));
    CHECK(exists(dir, ".j-step25.ckpt.Uv12"));
    CHECK(exists(dir, "j-step30.ckpt.Wx34Yz"));
    char cmd[128];
    (void)snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

FERRY_TEST_MAIN(T(a_rank_that_left_early_ends_a_waiting_gradnorm)
                    T(a_rank_whose_trainer_went_away_ends_a_waiting_gradnorm)
                        T(later_calls_fail_at_once_and_a_restart_takes_the_rank)
                            T(a_rank_restarted_after_the_end_rolls_back_alone)
                                T(a_starting_ferry_ps_removes_only_its_interrupted_writes))
