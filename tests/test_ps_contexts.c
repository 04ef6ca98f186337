/* test_ps_contexts.c - the lifetime of ferry-ps state: a context nobody steps is
 * swept after its TTL and its memory freed (Stats shows it), stepped and released
 * contexts free theirs at once, concurrent trainers keep separate contexts, a
 * checkpoint restores modules and optimizer state into a new server, and a Shutdown
 * call stops a running server. Servers run in-process on 127.0.0.1:0. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, nanosleep */
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "ferry/ferry.h"
#include "common/core/log.h"
#include "server/ps.h"

static ferry_ps_server *server_up(double ttl_s, const char *ckpt_dir, const char *restore) {
    ferry_ps_config cfg;
    ferry_ps_config_default(&cfg);
    cfg.listen = "127.0.0.1:0";
    cfg.context_ttl_s = ttl_s;
    cfg.checkpoint_dir = ckpt_dir;
    cfg.restore = restore;
    ferry_ps_server *s;
    CHECK_OK(ferry_ps_server_create(&cfg, &s));
    CHECK_OK(ferry_ps_server_start(s));
    return s;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    (void)nanosleep(&ts, NULL);
}

static ferry_remote *make_decoder(ferry_cluster *cl, const char *optim) {
    ferry_remote_config rc;
    ferry_remote_config_default(&rc, FERRY_REMOTE_DECODER, "dec", 40, 16);
    rc.init_seed = 11;
    CHECK_OK(ferry_optim_config_named(optim, &rc.optim));
    ferry_remote *m;
    CHECK_OK(ferry_remote_create(cl, &rc, &m));
    return m;
}

/* One server on 127.0.0.1, a trainer's cluster and context, and a decoder on it. */
typedef struct one_trainer {
    ferry_ps_server *s;
    ferry_cluster *cl;
    ferry_dist_ctx *dc;
    ferry_remote *dec;
} one_trainer;

static one_trainer one_trainer_up(double ttl_s) {
    one_trainer t;
    t.s = server_up(ttl_s, NULL, NULL);
    CHECK_OK(ferry_ps_connect(ferry_ps_server_address(t.s), NULL, &t.cl));
    CHECK_OK(ferry_dist_ctx_create(t.cl, &t.dc));
    t.dec = make_decoder(t.cl, "sgd");
    return t;
}

static void one_trainer_down(one_trainer *t) {
    ferry_remote_destroy(t->dec);
    ferry_dist_ctx_destroy(t->dc);
    ferry_cluster_destroy(t->cl);
    ferry_ps_server_destroy(t->s);
}

enum { N = 24, H = 16 };

/* One training step's Forward and Backward (no Step) with fixed data. */
static void forward_backward(ferry_remote *dec, ferry_dist_ctx *dc, float shift) {
    float hid[N * H], dh[N * H]; /* per call: trainers run it on several threads at once */
    int32_t tg[N];
    for (int i = 0; i < N * H; i++)
        hid[i] = (float)((i * 7) % 13) * 0.1f - 0.6f + shift;
    for (int n = 0; n < N; n++)
        tg[n] = (n * 5) % 40;
    uint64_t call;
    CHECK_OK(ferry_remote_xent_forward(dec, dc, hid, tg, N, NULL, NULL, &call));
    CHECK_OK(ferry_remote_xent_backward(dec, dc, call, NULL, 1.0f / N, dh));
}

TEST(idle_context_is_swept_and_its_memory_freed) {
    one_trainer tr = one_trainer_up(1.0);
    ferry_ps_stats st;

    /* A context that is stepped frees its memory at once. */
    (void)ferry_dist_ctx_begin(tr.dc);
    forward_backward(tr.dec, tr.dc, 0.0f);
    CHECK_OK(ferry_cluster_stats(tr.cl, 0, &st));
    CHECK_EQ(st.contexts_live, 1);
    int64_t held = st.context_bytes;
    CHECK(held >= (int64_t)((40 * 16 + 40) * sizeof(float))); /* at least dW and db */
    CHECK_OK(ferry_dist_ctx_step(tr.dc, 1.0f, 0.0));
    CHECK_OK(ferry_cluster_stats(tr.cl, 0, &st));
    CHECK_EQ(st.contexts_live, 0);
    CHECK_EQ(st.context_bytes, 0);
    /* A refused step releases the context instead of leaving it to the sweep. */
    (void)ferry_dist_ctx_begin(tr.dc);
    forward_backward(tr.dec, tr.dc, 0.0f);
    CHECK_STATUS(ferry_dist_ctx_step(tr.dc, 0.0f, 0.0), FERRY_ERR_INVALID);
    CHECK_EQ(ferry_dist_ctx_id(tr.dc), 0);
    CHECK_OK(ferry_cluster_stats(tr.cl, 0, &st));
    CHECK_EQ(st.contexts_live, 0);
    CHECK_EQ(st.contexts_released, 1);
    CHECK_EQ(st.context_bytes, 0);

    /* A trainer that dies after Forward: the context holds the saved logits... */
    uint64_t id = ferry_dist_ctx_begin(tr.dc);
    static float hid[N * H];
    int32_t tg[N] = {0};
    uint64_t call;
    CHECK_OK(ferry_remote_xent_forward(tr.dec, tr.dc, hid, tg, N, NULL, NULL, &call));
    CHECK_OK(ferry_cluster_stats(tr.cl, 0, &st));
    CHECK_EQ(st.contexts_live, 1);
    CHECK(st.context_bytes >= (int64_t)(N * 40 * sizeof(float)));
    /* ... until the sweep frees it, after the 1 s TTL (a lower bound; the wait for the
     * sweep gives up after 60 s). */
    double t0 = ferry_now();
    do {
        sleep_ms(100);
        CHECK_OK(ferry_cluster_stats(tr.cl, 0, &st));
    } while (st.contexts_live != 0 && ferry_now() - t0 < 60.0);
    CHECK(ferry_now() - t0 > 0.9);
    CHECK_EQ(st.contexts_live, 0);
    CHECK_EQ(st.context_bytes, 0);
    CHECK_EQ(st.contexts_swept, 1);
    /* Its trainer coming back gets a clear NOT_FOUND. */
    CHECK(ferry_dist_ctx_id(tr.dc) == id);
    static float dh[N * H];
    CHECK_STATUS(ferry_remote_xent_backward(tr.dec, tr.dc, call, NULL, 1.0f, dh),
                 FERRY_ERR_NOT_FOUND);
    CHECK(strstr(ferry_error_last(), "swept") != NULL);

    one_trainer_down(&tr);
}

typedef struct worker_arg {
    ferry_cluster *cl;
    ferry_remote *dec;
    int index;
    ferry_status st;
} worker_arg;

static void *worker(void *p) {
    worker_arg *w = p;
    ferry_dist_ctx *dc;
    w->st = ferry_dist_ctx_create(w->cl, &dc);
    for (int step = 0; step < 5 && w->st == FERRY_OK; step++) {
        (void)ferry_dist_ctx_begin(dc);
        forward_backward(w->dec, dc, 0.01f * (float)w->index);
        double ss;
        w->st = ferry_dist_ctx_grad_sumsq(dc, &ss);
        if (w->st == FERRY_OK)
            w->st = ferry_dist_ctx_step(dc, 0.5f, 0.0);
    }
    ferry_dist_ctx_destroy(dc);
    return NULL;
}

TEST(concurrent_trainers_keep_separate_contexts) {
    ferry_ps_server *s0 = server_up(60.0, NULL, NULL), *s1 = server_up(60.0, NULL, NULL);
    char targets[128];
    (void)snprintf(targets, sizeof targets, "%s,%s", ferry_ps_server_address(s0),
                   ferry_ps_server_address(s1));
    ferry_cluster *cl;
    CHECK_OK(ferry_ps_connect(targets, NULL, &cl));
    ferry_remote *dec = make_decoder(cl, "adam");
    pthread_t th[4];
    worker_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (worker_arg){cl, dec, i, FERRY_OK};
        CHECK(pthread_create(&th[i], NULL, worker, &args[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        CHECK(pthread_join(th[i], NULL) == 0);
        CHECK_OK(args[i].st);
    }
    for (int s = 0; s < 2; s++) {
        ferry_ps_stats st;
        CHECK_OK(ferry_cluster_stats(cl, s, &st));
        CHECK_EQ(st.contexts_stepped, 20);
        CHECK_EQ(st.contexts_live, 0);
        CHECK_EQ(st.context_bytes, 0);
        CHECK_EQ(st.errors, 0);
    }
    ferry_remote_destroy(dec);
    ferry_cluster_destroy(cl);
    ferry_ps_server_destroy(s0);
    ferry_ps_server_destroy(s1);
}

TEST(checkpoint_restores_parameters_and_optimizer_state) {
    char dir[] = "/tmp/ferry-ps-ckpt-XXXXXX", path[256];
    CHECK(mkdtemp(dir) != NULL);
    ferry_ps_server *a = server_up(60.0, dir, NULL);
    ferry_cluster *ca, *cb;
    ferry_dist_ctx *da, *db;
    CHECK_OK(ferry_ps_connect(ferry_ps_server_address(a), NULL, &ca));
    CHECK_OK(ferry_dist_ctx_create(ca, &da));
    ferry_remote *ma = make_decoder(ca, "adam");
    for (int step = 0; step < 2; step++) {
        (void)ferry_dist_ctx_begin(da);
        forward_backward(ma, da, 0.1f * (float)step);
        CHECK_OK(ferry_dist_ctx_step(da, 1.0f, 0.0));
    }
    CHECK_STATUS(ferry_cluster_checkpoint(ca, "../escape", 2), FERRY_ERR_INVALID);
    CHECK_OK(ferry_cluster_checkpoint(ca, "a.ckpt", 2));
    (void)snprintf(path, sizeof path, "%s/a.ckpt", dir);
    /* The same request again (a job's retry after a stall or a lost reply) is
     * answered with the file written: not written again (a new write renames a new
     * file into place); another step of that name is. */
    struct stat st1, st2;
    CHECK(stat(path, &st1) == 0);
    CHECK_OK(ferry_cluster_checkpoint(ca, "a.ckpt", 2));
    CHECK(stat(path, &st2) == 0);
    CHECK(st1.st_ino == st2.st_ino);
    CHECK_OK(ferry_cluster_checkpoint(ca, "a.ckpt", 3));
    CHECK(stat(path, &st2) == 0);
    CHECK(st1.st_ino != st2.st_ino);
    /* After a SetParams (a version bump) the same request writes again: the file
     * must hold the parameters as they are. */
    static float w0[40 * 16];
    CHECK_OK(ferry_remote_get_params(ma, "weight", 0, 0, w0));
    CHECK_OK(ferry_remote_set_params(ma, "weight", 0, 0, w0));
    CHECK(stat(path, &st1) == 0);
    CHECK_OK(ferry_cluster_checkpoint(ca, "a.ckpt", 3));
    CHECK(stat(path, &st2) == 0);
    CHECK(st1.st_ino != st2.st_ino);

    /* A new server restored from it hosts the same module, with the same state. */
    ferry_ps_server *b = server_up(60.0, NULL, path);
    CHECK_OK(ferry_ps_connect(ferry_ps_server_address(b), NULL, &cb));
    CHECK_OK(ferry_dist_ctx_create(cb, &db));
    ferry_remote *mb = make_decoder(cb, "adam");
    CHECK_EQ(ferry_remote_created(mb), 0);
    CHECK_STATUS(ferry_cluster_checkpoint(cb, NULL, 0), FERRY_ERR_UNSUPPORTED);
    static float wa[40 * 16], wb[40 * 16];
    CHECK_OK(ferry_remote_get_params(ma, "weight", 0, 0, wa));
    CHECK_OK(ferry_remote_get_params(mb, "weight", 0, 0, wb));
    CHECK(memcmp(wa, wb, sizeof wa) == 0);
    /* One more identical step on both: Adam's moments and step count came along. */
    (void)ferry_dist_ctx_begin(da);
    (void)ferry_dist_ctx_begin(db);
    forward_backward(ma, da, 0.3f);
    forward_backward(mb, db, 0.3f);
    CHECK_OK(ferry_dist_ctx_step(da, 1.0f, 0.0));
    CHECK_OK(ferry_dist_ctx_step(db, 1.0f, 0.0));
    CHECK_OK(ferry_remote_get_params(ma, "weight", 0, 0, wa));
    CHECK_OK(ferry_remote_get_params(mb, "weight", 0, 0, wb));
    CHECK(memcmp(wa, wb, sizeof wa) == 0);

    ferry_remote_destroy(ma);
    ferry_remote_destroy(mb);
    ferry_dist_ctx_destroy(da);
    ferry_dist_ctx_destroy(db);
    ferry_cluster_destroy(ca);
    ferry_cluster_destroy(cb);
    ferry_ps_server_destroy(a);
    ferry_ps_server_destroy(b);
    CHECK(remove(path) == 0);
    CHECK(rmdir(dir) == 0);
}

/* ferry_dist_ctx_step_start + _wait is ferry_dist_ctx_clip_step in two halves: the same
 * coefficient, norm, metrics and parameters; misuse is refused. */
TEST(split_step_is_the_clipped_step) {
    ferry_ps_server *s0 = server_up(60.0, NULL, NULL), *s1 = server_up(60.0, NULL, NULL);
    ferry_cluster *c0, *c1;
    CHECK_OK(ferry_ps_connect(ferry_ps_server_address(s0), NULL, &c0));
    CHECK_OK(ferry_ps_connect(ferry_ps_server_address(s1), NULL, &c1));
    ferry_remote *d0 = make_decoder(c0, "adam"), *d1 = make_decoder(c1, "adam");
    ferry_dist_ctx *x0, *x1;
    CHECK_OK(ferry_dist_ctx_create(c0, &x0));
    CHECK_OK(ferry_dist_ctx_create(c1, &x1));
    CHECK_STATUS(ferry_dist_ctx_step_wait(x1), FERRY_ERR_INVALID); /* nothing started */
    for (int step = 0; step < 3; step++) {
        (void)ferry_dist_ctx_begin(x0);
        (void)ferry_dist_ctx_begin(x1);
        forward_backward(d0, x0, 0.1f * (float)step);
        forward_backward(d1, x1, 0.1f * (float)step);
        float k0, k1;
        double n0, n1, v0, v1;
        CHECK_OK(ferry_dist_ctx_clip_step(x0, 0.25, 0.5f, 0.0, &k0, &n0));
        CHECK_OK(ferry_dist_ctx_step_start(x1, 0.25, 0.5f, 0.0, &k1, &n1));
        CHECK_EQ(k0 == k1 && n0 == n1, 1);
        CHECK(k1 < 1.0f); /* the clip was active */
        if (step == 0) { /* while the Step is in flight, the context is not to be used */
            float kk;
            double nn;
            CHECK_STATUS(ferry_dist_ctx_step_start(x1, 0.25, 0.5f, 0.0, &kk, &nn), FERRY_ERR_BUSY);
            static float hid[N * H];
            int32_t tg[N] = {0};
            CHECK_STATUS(ferry_remote_xent_forward(d1, x1, hid, tg, N, NULL, NULL, NULL),
                         FERRY_ERR_BUSY);
        }
        CHECK_OK(ferry_dist_ctx_step_wait(x1));
        CHECK_STATUS(ferry_dist_ctx_step_wait(x1), FERRY_ERR_INVALID); /* waited already */
        CHECK_OK(ferry_dist_ctx_metric(x0, "version/dec", &v0));
        CHECK_OK(ferry_dist_ctx_metric(x1, "version/dec", &v1));
        CHECK_EQ((long long)v0, (long long)v1);
    }
    static float w0[40 * 16], w1[40 * 16];
    CHECK_OK(ferry_remote_get_params(d0, "weight", 0, 0, w0));
    CHECK_OK(ferry_remote_get_params(d1, "weight", 0, 0, w1));
    CHECK(memcmp(w0, w1, sizeof w0) == 0);
    ferry_dist_ctx_destroy(x0);
    ferry_dist_ctx_destroy(x1);
    ferry_remote_destroy(d0);
    ferry_remote_destroy(d1);
    ferry_cluster_destroy(c0);
    ferry_cluster_destroy(c1);
    ferry_ps_server_destroy(s0);
    ferry_ps_server_destroy(s1);
}

/* One of server 0's Stats values, by name (-1 if it has none). */
typedef struct stat_want {
    const char *name;
    double value;
} stat_want;

static void stat_match(void *user, const char *name, double value) {
    stat_want *w = user;
    if (strcmp(name, w->name) == 0)
        w->value = value;
}

static double server_stat(ferry_cluster *cl, const char *name) {
    stat_want w = {name, -1};
    CHECK_OK(ferry_cluster_metrics(cl, 0, name, stat_match, &w));
    return w.value;
}

/* A Step waits for the Backward's late weight gradient; the Backward's handler must
 * drop its hold on the context before that Step can reply, or a Stats right after
 * the Step sees the context gone from the count with its bytes still charged (a race
 * CI once lost). Many steps, each checked at once. */
TEST(stepped_context_is_uncharged_before_its_reply) {
    one_trainer tr = one_trainer_up(60.0);
    ferry_ps_stats st;
    enum { STEPS = 300 };
    for (int i = 0; i < STEPS; i++) {
        (void)ferry_dist_ctx_begin(tr.dc);
        forward_backward(tr.dec, tr.dc, 0.001f * (float)i);
        CHECK_OK(ferry_dist_ctx_step(tr.dc, 0.01f, 0.0));
        CHECK_OK(ferry_cluster_stats(tr.cl, 0, &st));
        CHECK_EQ(st.contexts_live, 0);
        CHECK_EQ(st.context_bytes, 0);
    }
    CHECK_EQ(st.contexts_stepped, STEPS);
    CHECK(server_stat(tr.cl, "backward_early_replies") >= 1); /* the late path ran */
    one_trainer_down(&tr);
}

/* One step of a pipeline's decoder calls: the Forwards of MB chunks, then their
 * Backwards last chunk first, each sent when the one before has answered (dh into
 * dh_out). `settle`: a GradNorm after each Backward, so that no Backward starts before
 * the previous weight gradient is whole. Returns the context's sum of squares. */
enum { MB = 4, MN = 128, MH = 256, MV = 8000 };
static double pipelined_step(ferry_remote *dec, ferry_dist_ctx *dc, int step, int settle,
                             float *dh_out) {
    static float hid[MB][MN * MH];
    int32_t tg[MB][MN];
    uint64_t call[MB];
    (void)ferry_dist_ctx_begin(dc);
    for (int c = 0; c < MB; c++) {
        for (int i = 0; i < MN * MH; i++)
            hid[c][i] = (float)((i * 7 + c * 3 + step) % 17) * 0.05f - 0.4f;
        for (int n = 0; n < MN; n++)
            tg[c][n] = (n * 131 + c * 17 + step) % MV;
        CHECK_OK(ferry_remote_xent_forward(dec, dc, hid[c], tg[c], MN, NULL, NULL, &call[c]));
    }
    double ss;
    for (int c = MB - 1; c >= 0; c--) {
        CHECK_OK(ferry_remote_xent_backward(dec, dc, call[c], NULL, 1.0f / (MB * MN),
                                            dh_out + (size_t)c * MN * MH));
        if (settle)
            CHECK_OK(ferry_dist_ctx_grad_sumsq(dc, &ss));
    }
    CHECK_OK(ferry_dist_ctx_grad_sumsq(dc, &ss));
    return ss;
}

/* A Backward forms its input gradient while the previous Backward's weight gradient
 * still accumulates (the server's counter says it happened), and the gradients, the
 * input gradients and the stepped weights are bit for bit those of calls that never
 * overlap. */
TEST(backward_overlaps_the_previous_weight_gradient) {
    ferry_ps_server *s = server_up(60.0, NULL, NULL);
    ferry_cluster *cl;
    CHECK_OK(ferry_ps_connect(ferry_ps_server_address(s), NULL, &cl));
    ferry_remote *dec[2];
    ferry_dist_ctx *dc[2];
    for (int k = 0; k < 2; k++) {
        ferry_remote_config rc;
        ferry_remote_config_default(&rc, FERRY_REMOTE_DECODER, k == 0 ? "dec_a" : "dec_b", MV, MH);
        rc.init_seed = 5; /* the same weights */
        CHECK_OK(ferry_optim_config_named("sgd", &rc.optim));
        CHECK_OK(ferry_remote_create(cl, &rc, &dec[k]));
        CHECK_OK(ferry_dist_ctx_create(cl, &dc[k]));
    }
    static float dh[2][MB * MN * MH], w[2][MV * MH];
    CHECK(server_stat(cl, "backward_overlapped") == 0);
    for (int step = 0; step < 3; step++) {
        double ss0 = pipelined_step(dec[0], dc[0], step, 0, dh[0]);
        double ss1 = pipelined_step(dec[1], dc[1], step, 1, dh[1]);
        CHECK(ss0 == ss1 && ss0 > 0);
        CHECK(memcmp(dh[0], dh[1], sizeof dh[0]) == 0);
        CHECK_OK(ferry_dist_ctx_step(dc[0], 1.0f, 0.5));
        CHECK_OK(ferry_dist_ctx_step(dc[1], 1.0f, 0.5));
    }
    CHECK_OK(ferry_remote_get_params(dec[0], "weight", 0, 0, w[0]));
    CHECK_OK(ferry_remote_get_params(dec[1], "weight", 0, 0, w[1]));
    CHECK(memcmp(w[0], w[1], sizeof w[0]) == 0);
    /* 3 steps of 3 Backwards sent while a weight gradient of 8000 x 256 x 128 forms:
     * at least one of them ran meanwhile, and only those count (not the settled
     * pipeline's, nor a step's first). The operands a queued weight gradient holds were
     * charged to its context and are uncharged with it (context_bytes back to 0). */
    double overlapped = server_stat(cl, "backward_overlapped");
    CHECK(overlapped >= 1 && overlapped <= 3 * (MB - 1));
    ferry_ps_stats st;
    CHECK_OK(ferry_cluster_stats(cl, 0, &st));
    CHECK_EQ(st.contexts_live, 0);
    CHECK_EQ(st.context_bytes, 0);
    CHECK_EQ(st.errors, 0);
    for (int k = 0; k < 2; k++) {
        ferry_dist_ctx_destroy(dc[k]);
        ferry_remote_destroy(dec[k]);
    }
    ferry_cluster_destroy(cl);
    ferry_ps_server_destroy(s);
}

static double memory_trims(ferry_cluster *cl) {
    double v = server_stat(cl, "memory_trims");
    CHECK(v >= 0);
    return v;
}

/* While contexts keep coming (a job training), ferry-ps keeps the pages its steps free
 * for the next step; once none has come for 2 s it hands free memory back (every 5 s
 * at most). The sweep runs every second here (ttl 60 s). */
TEST(free_memory_goes_back_when_idle_not_between_steps) {
    one_trainer tr = one_trainer_up(60.0);
    double t0 = ferry_now(), before = -1;
    int steps = 0;
    while (ferry_now() - t0 < 8.5) { /* over a trim period, after a second's start */
        if (before < 0 && ferry_now() - t0 > 1.5)
            before = memory_trims(tr.cl);
        (void)ferry_dist_ctx_begin(tr.dc);
        forward_backward(tr.dec, tr.dc, 0.0f);
        CHECK_OK(ferry_dist_ctx_step(tr.dc, 1.0f, 0.0));
        steps++;
    }
    double during = memory_trims(tr.cl);
    CHECK(steps > 20);
    CHECK(during == before);
    double idle0 = ferry_now(), after = during;
    while (after == during && ferry_now() - idle0 < 15.0) {
        sleep_ms(250);
        after = memory_trims(tr.cl);
    }
    CHECK(after > during);
    CHECK(ferry_now() - idle0 >= 1.9); /* not before 2 s without a context */
    one_trainer_down(&tr);
}

TEST(shutdown_call_stops_the_server) {
    ferry_ps_server *s = server_up(60.0, NULL, NULL);
    ferry_cluster *cl;
    CHECK_OK(ferry_ps_connect(ferry_ps_server_address(s), NULL, &cl));
    CHECK(!ferry_ps_server_stopping(s));
    CHECK_OK(ferry_cluster_shutdown(cl, 0, 100));
    CHECK(ferry_ps_server_stopping(s));
    ferry_ps_stats st;
    double t0 = ferry_now();
    ferry_status r;
    while ((r = ferry_cluster_stats(cl, 0, &st)) == FERRY_OK && ferry_now() - t0 < 60.0)
        sleep_ms(50);
    CHECK(r == FERRY_ERR_UNAVAILABLE || r == FERRY_ERR_TIMEOUT);
    ferry_cluster_destroy(cl);
    ferry_ps_server_destroy(s);
}

FERRY_TEST_MAIN(T(idle_context_is_swept_and_its_memory_freed)
                    T(stepped_context_is_uncharged_before_its_reply)
                        T(concurrent_trainers_keep_separate_contexts)
                            T(checkpoint_restores_parameters_and_optimizer_state)
                                T(split_step_is_the_clipped_step)
                                    T(backward_overlaps_the_previous_weight_gradient)
                                        T(free_memory_goes_back_when_idle_not_between_steps)
                                            T(shutdown_call_stops_the_server))
