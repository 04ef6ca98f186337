/* test_ps_stiefel.c - a Stiefel-constrained Linear hosted on an in-process ferry-ps
 * against the same constrained layer held locally (ferry_linear with its weight
 * constrained, the penalty added once per step by the owner): losses, gradients,
 * clipping, parameters and the penalty/feasibility metrics over several steps; two
 * contexts stepping one remote module (one penalty per Step each); configuration
 * conflicts and refusals; and finite differences of the constrained local layer. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h> /* rmdir */

#include "check.h"
#include "session.h"
#include "ferry.pb-c.h" /* Ferry__V1__StatsRequest: Stats read over a raw client */
#include "ferry/ferry.h"
#include "common/rpc/rpc.h"
#include "gradcheck.h" /* ferry_gradcheck, ferry_gradcheck_fill, ferry_gradcheck_dot */
#include "ferry/nn.h"
#include "ferry/optim.h"
#include "optim/stiefel.h"
#include "server/ps.h"

#define SEED 7u
#define BETA 0.1f
#define ATOL 1e-5
#define RTOL 1e-4

enum { C = 4, D = 16, N = 8 };

typedef struct harness {
    ferry_ps_server *srv;
    ferry_cluster *cl;
} harness;

/* One in-process server (with a checkpoint directory, or restored from a checkpoint,
 * where given) and a cluster of it. */
static void harness_up_with(harness *h, const char *ckpt_dir, const char *restore) {
    ferry_ps_config cfg;
    ferry_ps_config_default(&cfg);
    cfg.listen = "127.0.0.1:0";
    cfg.checkpoint_dir = ckpt_dir;
    cfg.restore = restore;
    CHECK_OK(ferry_ps_server_create(&cfg, &h->srv));
    CHECK_OK(ferry_ps_server_start(h->srv));
    CHECK_OK(ferry_ps_connect(ferry_ps_server_address(h->srv), NULL, &h->cl));
}

static void harness_up(harness *h) {
    harness_up_with(h, NULL, NULL);
}

static void harness_down(harness *h) {
    ferry_cluster_destroy(h->cl);
    ferry_ps_server_destroy(h->srv);
}

/* The local twin: a block holding only the layer, so that the remote module's default
 * offsets (weight at 0, bias after it) draw the same initial values. */
typedef struct local {
    ferry_params P;
    ferry_linear lin;
    ferry_optim *opt;
    ferry_ctx *ctx;
} local;

static void local_up(local *l, float scale, int polar, const ferry_optim_config *oc) {
    ferry_params_init(&l->P, ferry_backend_cpu());
    CHECK_OK(ferry_linear_init(&l->lin, &l->P, "lin", C, D, 1));
    CHECK_OK(ferry_params_set_constraint(&l->P, l->lin.weight, FERRY_CONSTRAINT_STIEFEL, BETA));
    CHECK_OK(ferry_params_alloc(&l->P));
    for (int i = 0; i < l->P.count; i++)
        CHECK_OK(ferry_params_init_uniform(&l->P, i, scale, SEED));
    if (polar)
        CHECK_OK(ferry_stiefel_polar(D, C, ferry_params_data(&l->P, l->lin.weight)));
    CHECK_OK(ferry_optim_create(&l->P, oc, &l->opt));
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &l->ctx));
}

static void local_down(local *l) {
    ferry_ctx_destroy(l->ctx);
    ferry_optim_destroy(l->opt);
    ferry_params_deinit(&l->P);
}

/* Local forward and backward of sum(y * R) in ctx: *loss, y (N, D), dx (N, C); the
 * gradients stay in ctx. */
static void local_pass(local *l, ferry_ctx *ctx, float *x, float *R, double *loss, float *y,
                       float *dx) {
    ferry_tensor tx =
        ferry_tensor_wrap(ferry_backend_cpu(), FERRY_DTYPE_F32, ferry_shape_2d(N, C), x);
    ferry_tensor tr =
        ferry_tensor_wrap(ferry_backend_cpu(), FERRY_DTYPE_F32, ferry_shape_2d(N, D), R);
    ferry_tensor *ty;
    CHECK_OK(ferry_ctx_require_grad(ctx, &tx));
    CHECK_OK(ferry_linear_forward(&l->lin, ctx, &tx, &ty));
    const ferry_tensor *outs[1] = {ty}, *seeds[1] = {&tr};
    CHECK_OK(ferry_ctx_backward_from(ctx, 1, outs, seeds));
    memcpy(y, ferry_tensor_f32(ty), sizeof(float) * N * D);
    memcpy(dx, ferry_tensor_f32(ferry_ctx_grad_of(ctx, &tx)), sizeof(float) * N * C);
    *loss = ferry_gradcheck_dot(y, R, N * D);
}

/* The owner's part of a local step: penalty gradient once, sum of squares, clipping
 * coefficient (1 for max_norm <= 0), optimizer step. */
static void local_step(local *l, ferry_grads *G, float max_norm, double *penalty,
                       double *feasibility, double *sumsq, float *coef) {
    CHECK_OK(ferry_stiefel_add_penalty_grads(&l->P, G, penalty, feasibility));
    CHECK_OK(ferry_grads_sumsq(G, sumsq));
    *coef = 1.0f;
    if (max_norm > 0.0f)
        CHECK_OK(ferry_clip_coef(*sumsq, max_norm, coef, NULL));
    CHECK_OK(ferry_optim_step(l->opt, &l->P, G, *coef));
}

static void expect_num(const char *what, double got, double want, double atol, double rtol) {
    if (!(fabs(got - want) <= atol + rtol * fabs(want))) {
        fprintf(stderr, "  %s: got %.9g want %.9g\n", what, got, want);
        CHECK(0);
    }
}

/* GetParams of the remote weight and bias against the local block. */
static void expect_params(ferry_remote *rem, local *l, const char *when) {
    static float w[D * C], b[D];
    char what[96];
    CHECK_OK(ferry_remote_get_params(rem, "weight", 0, 0, w));
    CHECK_OK(ferry_remote_get_params(rem, "bias", 0, 0, b));
    (void)snprintf(what, sizeof what, "weight %s", when);
    CHECK_CLOSE_F(what, w, ferry_params_data(&l->P, l->lin.weight), D * C, ATOL, RTOL);
    (void)snprintf(what, sizeof what, "bias %s", when);
    CHECK_CLOSE_F(what, b, ferry_params_data(&l->P, l->lin.bias), D, ATOL, RTOL);
}

static double metric(ferry_dist_ctx *dc, const char *name) {
    double v = NAN;
    CHECK_OK(ferry_dist_ctx_metric(dc, name, &v));
    return v;
}

static void remote_config(ferry_remote_config *rc, const char *name, float scale) {
    ferry_remote_config_default(rc, FERRY_REMOTE_LINEAR, name, C, D);
    rc->init_seed = SEED;
    rc->init_scale = scale;
    rc->constraint.kind = FERRY_REMOTE_CONSTRAINT_STIEFEL;
    rc->constraint.beta = BETA;
}

/* ---- one trainer: several clipped steps ---- */

TEST(remote_constrained_linear_matches_local) {
    harness h;
    harness_up(&h);
    ferry_optim_config oc = ferry_optim_defaults(FERRY_OPTIM_SGD);
    oc.lr = 0.05;
    oc.momentum = 0.9;
    local l;
    local_up(&l, 0.5f, 1, &oc);
    ferry_remote_config rc;
    remote_config(&rc, "lin", 0.5f);
    rc.constraint.polar_init = 1;
    CHECK_OK(ferry_optim_config_named("sgd", &rc.optim));
    rc.optim.lr = oc.lr;
    rc.optim.momentum = oc.momentum;
    ferry_remote *rem;
    CHECK_OK(ferry_remote_create(h.cl, &rc, &rem));
    CHECK_EQ(ferry_remote_created(rem), 1);
    /* Both start from the polar factor of the same draw: on the manifold. */
    expect_params(rem, &l, "after polar init");
    double feas0 = 0.0;
    CHECK_OK(ferry_stiefel_feasibility(ferry_backend_cpu(), D, C,
                                       ferry_params_data(&l.P, l.lin.weight), &feas0, NULL));
    CHECK(feas0 < 1e-5);
    ferry_dist_ctx *dc;
    CHECK_OK(ferry_dist_ctx_create(h.cl, &dc));
    static float x[N * C], R[N * D], y[N * D], yr[N * D], dx[N * C], dxr[N * C];
    const float max_norm = 9.0f;
    int clipped = 0;
    double feas_last = 0.0;
    for (int step = 0; step < 6; step++) {
        ferry_gradcheck_fill(x, N * C, -1.0f, 1.0f, 100 + (uint64_t)step);
        ferry_gradcheck_fill(R, N * D, -1.0f, 1.0f, 200 + (uint64_t)step);
        double loss, loss_r, pen, feas, sumsq, norm_r;
        float coef, coef_r;
        ferry_ctx_reset(l.ctx, (uint64_t)step + 1);
        local_pass(&l, l.ctx, x, R, &loss, y, dx);
        uint64_t call;
        (void)ferry_dist_ctx_begin(dc);
        CHECK_OK(ferry_remote_linear_forward(rem, dc, x, N, yr, &call));
        CHECK_OK(ferry_remote_linear_backward(rem, dc, call, R, dxr));
        loss_r = ferry_gradcheck_dot(yr, R, N * D);
        CHECK_CLOSE_F("y", yr, y, N * D, ATOL, RTOL);
        CHECK_CLOSE_F("dx", dxr, dx, N * C, ATOL, RTOL);
        local_step(&l, ferry_ctx_grads(l.ctx, &l.P), max_norm, &pen, &feas, &sumsq, &coef);
        CHECK_OK(ferry_dist_ctx_clip_step(dc, 0.0, max_norm, 0.0, &coef_r, &norm_r));
        /* The loss the owner optimises: data term plus the penalty, once. */
        expect_num("loss", loss_r + metric(dc, "penalty/lin"), loss + pen, 0.0, 1e-5);
        expect_num("data loss", loss_r, loss, 1e-6, 1e-5);
        expect_num("penalty", metric(dc, "penalty/lin"), pen, 1e-7, RTOL);
        expect_num("feasibility", metric(dc, "feasibility/lin"), feas, 1e-6, RTOL);
        expect_num("gradient norm (penalty included)", norm_r, sqrt(sumsq), ATOL, RTOL);
        expect_num("clip coefficient", (double)coef_r, (double)coef, 1e-6, RTOL);
        CHECK_EQ((long long)metric(dc, "version/lin"), (long long)step + 1);
        clipped += coef < 1.0f;
        feas_last = feas;
        expect_params(rem, &l, "after a step");
    }
    /* Not vacuous: clipping acted, and the weight left the manifold. */
    CHECK(clipped > 0 && clipped < 6);
    CHECK(feas_last > 1e-3);
    ferry_dist_ctx_destroy(dc);
    ferry_remote_destroy(rem);
    local_down(&l);
    harness_down(&h);
}

/* ---- two trainers' contexts on one module ---- */

/* The server's Stats value `name`, over a client of its own. */
static double stats_value(harness *h, const char *name) {
    ferry_rpc_client *cli;
    CHECK_OK(ferry_rpc_client_create(ferry_ps_server_address(h->srv), NULL, &cli));
    CHECK_OK(ferry_test_hello(cli, 0, NULL));
    Ferry__V1__StatsRequest q;
    ferry__v1__stats_request__init(&q);
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    CHECK_OK(ferry_rpc_msg_set_head(&req, &q.base));
    CHECK_OK(ferry_rpc_call(cli, FERRY_RPC_STATS, &req, &reply, 0));
    const Ferry__V1__StatsReply *r = reply.head;
    double v = NAN;
    for (size_t i = 0; i < r->n_metrics; i++)
        if (strcmp(r->metrics[i]->name, name) == 0)
            v = r->metrics[i]->value;
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
    ferry_rpc_client_destroy(cli);
    if (isnan(v))
        fprintf(stderr, "  Stats has no metric '%s'\n", name);
    CHECK(!isnan(v));
    return v;
}

TEST(two_contexts_add_the_penalty_once_per_step_each) {
    harness h;
    harness_up(&h);
    ferry_optim_config oc = ferry_optim_defaults(FERRY_OPTIM_SGD);
    oc.lr = 0.05;
    local l;
    local_up(&l, 0.5f, 0, &oc); /* far from the manifold: a large penalty */
    /* Explicit initial values are used as given, polar_init notwithstanding. */
    static float w0[D * C], b0[D], got[D * C];
    memcpy(w0, ferry_params_data(&l.P, l.lin.weight), sizeof w0);
    memcpy(b0, ferry_params_data(&l.P, l.lin.bias), sizeof b0);
    ferry_remote_config rc;
    remote_config(&rc, "shared", 0.5f);
    rc.constraint.polar_init = 1;
    rc.init_weight = w0;
    rc.init_bias = b0;
    rc.optim.lr = oc.lr;
    ferry_remote *rem;
    CHECK_OK(ferry_remote_create(h.cl, &rc, &rem));
    CHECK_OK(ferry_remote_get_params(rem, "weight", 0, 0, got));
    CHECK(memcmp(got, w0, sizeof got) == 0);
    ferry_dist_ctx *dca, *dcb;
    CHECK_OK(ferry_dist_ctx_create(h.cl, &dca));
    CHECK_OK(ferry_dist_ctx_create(h.cl, &dcb));
    ferry_ctx *ctxb;
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &ctxb));
    static float xa[N * C], ra[N * D], xb[N * C], rb[N * D];
    static float ya[N * D], dxa[N * C], yb[N * D], dxb[N * C], y[N * D], dx[N * C];
    ferry_gradcheck_fill(xa, N * C, -1.0f, 1.0f, 11);
    ferry_gradcheck_fill(ra, N * D, -1.0f, 1.0f, 12);
    ferry_gradcheck_fill(xb, N * C, -1.0f, 1.0f, 13);
    ferry_gradcheck_fill(rb, N * D, -1.0f, 1.0f, 14);
    /* Both trainers run forward and backward at W0. */
    double loss;
    uint64_t ca, cb;
    ferry_ctx_reset(l.ctx, 1);
    ferry_ctx_reset(ctxb, 2);
    local_pass(&l, l.ctx, xa, ra, &loss, ya, dxa);
    local_pass(&l, ctxb, xb, rb, &loss, yb, dxb);
    (void)ferry_dist_ctx_begin(dca);
    (void)ferry_dist_ctx_begin(dcb);
    CHECK_OK(ferry_remote_linear_forward(rem, dca, xa, N, y, &ca));
    CHECK_CLOSE_F("y of context A", y, ya, N * D, ATOL, RTOL);
    CHECK_OK(ferry_remote_linear_forward(rem, dcb, xb, N, y, &cb));
    CHECK_CLOSE_F("y of context B", y, yb, N * D, ATOL, RTOL);
    CHECK_OK(ferry_remote_linear_backward(rem, dca, ca, ra, dx));
    CHECK_CLOSE_F("dx of context A", dx, dxa, N * C, ATOL, RTOL);
    CHECK_OK(ferry_remote_linear_backward(rem, dcb, cb, rb, dx));
    CHECK_CLOSE_F("dx of context B", dx, dxb, N * C, ATOL, RTOL);
    /* Trainer A: GradNorm twice (the penalty joins once), then Step from W0. */
    double pen1, feas1, ss1, pen2, feas2, ss2, ssa, ssa2;
    float coef;
    ferry_grads *ga = ferry_ctx_grads(l.ctx, &l.P), *gb = ferry_ctx_grads(ctxb, &l.P);
    CHECK_OK(ferry_dist_ctx_grad_sumsq(dca, &ssa));
    CHECK_OK(ferry_dist_ctx_grad_sumsq(dca, &ssa2));
    CHECK(ssa == ssa2);
    local_step(&l, ga, 0.0f, &pen1, &feas1, &ss1, &coef);
    expect_num("context A gradient sum of squares", ssa, ss1, ATOL, RTOL);
    CHECK_OK(ferry_dist_ctx_step(dca, 1.0f, 0.0));
    expect_num("penalty of step 1", metric(dca, "penalty/shared"), pen1, 1e-7, RTOL);
    expect_num("feasibility of step 1", metric(dca, "feasibility/shared"), feas1, 1e-6, RTOL);
    CHECK(pen1 > 0.1); /* the penalty gradient matters */
    expect_params(rem, &l, "after context A's step");
    /* Trainer B steps without GradNorm: its penalty comes from W1, once. */
    local_step(&l, gb, 0.0f, &pen2, &feas2, &ss2, &coef);
    CHECK_OK(ferry_dist_ctx_step(dcb, 1.0f, 0.0));
    expect_num("penalty of step 2", metric(dcb, "penalty/shared"), pen2, 1e-7, RTOL);
    expect_num("feasibility of step 2", metric(dcb, "feasibility/shared"), feas2, 1e-6, RTOL);
    CHECK(fabs(pen2 - pen1) > 1e-4 * pen1); /* W moved between the two steps */
    CHECK_EQ((long long)metric(dcb, "version/shared"), 2LL);
    expect_params(rem, &l, "after context B's step");
    /* Stats: both values at the current W. */
    double pen_now, sq_now;
    CHECK_OK(ferry_stiefel_penalty(ferry_backend_cpu(), D, C, ferry_params_data(&l.P, l.lin.weight),
                                   BETA, &pen_now, &sq_now, NULL));
    expect_num("Stats penalty", stats_value(&h, "penalty/shared"), pen_now, 1e-7, RTOL);
    expect_num("Stats feasibility", stats_value(&h, "feasibility/shared"), sqrt(sq_now), 1e-6,
               RTOL);
    /* A context that never reached GradNorm or Step adds nothing. */
    (void)ferry_dist_ctx_begin(dca);
    CHECK_OK(ferry_remote_linear_forward(rem, dca, xa, N, y, &ca));
    CHECK_OK(ferry_dist_ctx_release(dca));
    expect_params(rem, &l, "after a released context");
    const ferry_dist_metric *ms;
    CHECK_EQ(ferry_dist_ctx_metrics(dcb, &ms), 3);
    CHECK_STATUS(ferry_dist_ctx_metric(dcb, "penalty/nothing", &pen_now), FERRY_ERR_NOT_FOUND);
    ferry_ctx_destroy(ctxb);
    ferry_dist_ctx_destroy(dca);
    ferry_dist_ctx_destroy(dcb);
    ferry_remote_destroy(rem);
    local_down(&l);
    harness_down(&h);
}

/* ---- configuration ---- */

static void expect_create_fails(harness *h, const ferry_remote_config *rc, ferry_status want,
                                const char *needle) {
    ferry_remote *rem = NULL;
    CHECK_STATUS(ferry_remote_create(h->cl, rc, &rem), want);
    CHECK(rem == NULL);
    if (strstr(ferry_error_last(), needle) == NULL) {
        fprintf(stderr, "  error '%s' does not mention '%s'\n", ferry_error_last(), needle);
        CHECK(0);
    }
}

TEST(conflicting_constraint_is_already_exists) {
    harness h;
    harness_up(&h);
    ferry_remote_config rc;
    remote_config(&rc, "proj", 0.1f);
    ferry_remote *a, *b;
    CHECK_OK(ferry_remote_create(h.cl, &rc, &a));
    CHECK_OK(ferry_remote_create(h.cl, &rc, &b)); /* the same config: reused */
    CHECK_EQ(ferry_remote_created(b), 0);
    ferry_remote_config other = rc;
    other.constraint.beta = 0.2;
    expect_create_fails(&h, &other, FERRY_ERR_EXISTS, "constraint.beta");
    other = rc;
    other.constraint.kind = FERRY_REMOTE_CONSTRAINT_NONE;
    expect_create_fails(&h, &other, FERRY_ERR_EXISTS, "constraint.kind");
    other = rc;
    other.constraint.polar_init = 1;
    expect_create_fails(&h, &other, FERRY_ERR_EXISTS, "polar");
    ferry_remote_destroy(a);
    ferry_remote_destroy(b);
    harness_down(&h);
}

TEST(refusals) {
    harness h;
    harness_up(&h);
    ferry_remote_config rc;
    /* A wide weight (D < C) has no orthonormal columns. */
    ferry_remote_config_default(&rc, FERRY_REMOTE_LINEAR, "wide", D, C);
    rc.constraint.kind = FERRY_REMOTE_CONSTRAINT_STIEFEL;
    rc.constraint.beta = BETA;
    expect_create_fails(&h, &rc, FERRY_ERR_INVALID, "D >= C");
    ferry_params P;
    ferry_linear lin;
    ferry_params_init(&P, ferry_backend_cpu());
    CHECK_OK(ferry_linear_init(&lin, &P, "wide", D, C, 1));
    CHECK_STATUS(ferry_params_set_constraint(&P, lin.weight, FERRY_CONSTRAINT_STIEFEL, BETA),
                 FERRY_ERR_SHAPE);
    ferry_params_deinit(&P);
    /* Embedding and decoder take no constraint. */
    ferry_remote_config_default(&rc, FERRY_REMOTE_EMBEDDING, "emb", 10, 4);
    rc.constraint.kind = FERRY_REMOTE_CONSTRAINT_STIEFEL;
    rc.constraint.beta = BETA;
    expect_create_fails(&h, &rc, FERRY_ERR_UNSUPPORTED, "no constraint");
    rc.kind = FERRY_REMOTE_DECODER;
    expect_create_fails(&h, &rc, FERRY_ERR_UNSUPPORTED, "no constraint");
    /* polar_init without a constraint, a bad beta, an unknown kind. */
    remote_config(&rc, "lin", 0.1f);
    rc.constraint.kind = FERRY_REMOTE_CONSTRAINT_NONE;
    rc.constraint.polar_init = 1;
    expect_create_fails(&h, &rc, FERRY_ERR_INVALID, "polar_init needs a Stiefel constraint");
    remote_config(&rc, "lin", 0.1f);
    rc.constraint.beta = -1.0;
    expect_create_fails(&h, &rc, FERRY_ERR_INVALID, "beta");
    rc.constraint.beta = NAN;
    expect_create_fails(&h, &rc, FERRY_ERR_INVALID, "beta");
    rc.constraint.beta = BETA;
    rc.constraint.kind = (ferry_remote_constraint_kind)7;
    expect_create_fails(&h, &rc, FERRY_ERR_INVALID, "constraint kind");
    ferry_ps_stats st;
    CHECK_OK(ferry_cluster_stats(h.cl, 0, &st));
    CHECK_EQ(st.modules, 0);
    harness_down(&h);
}

/* One forward, backward and Step of m with fixed data; the Step's penalty metric. */
static double remote_step(ferry_remote *m, ferry_dist_ctx *dc, const char *metric_name) {
    static float x[N * C], R[N * D], y[N * D], dx[N * C];
    ferry_gradcheck_fill(x, N * C, -1.0f, 1.0f, 41);
    ferry_gradcheck_fill(R, N * D, -1.0f, 1.0f, 42);
    uint64_t call;
    (void)ferry_dist_ctx_begin(dc);
    CHECK_OK(ferry_remote_linear_forward(m, dc, x, N, y, &call));
    CHECK_OK(ferry_remote_linear_backward(m, dc, call, R, dx));
    CHECK_OK(ferry_dist_ctx_step(dc, 1.0f, 0.0));
    return metric(dc, metric_name);
}

TEST(constraint_survives_a_checkpoint) {
    char dir[] = "/tmp/ferry-stiefel-ckpt-XXXXXX", path[256];
    CHECK(mkdtemp(dir) != NULL);
    harness a, b;
    harness_up_with(&a, dir, NULL);
    ferry_remote_config rc;
    remote_config(&rc, "lin", 0.5f);
    rc.constraint.polar_init = 1;
    rc.optim.lr = 0.3;
    ferry_remote *ma, *mb;
    ferry_dist_ctx *da, *db;
    CHECK_OK(ferry_remote_create(a.cl, &rc, &ma));
    CHECK_OK(ferry_dist_ctx_create(a.cl, &da));
    CHECK(remote_step(ma, da, "penalty/lin") < 1e-9); /* from the polar factor */
    CHECK_OK(ferry_cluster_checkpoint(a.cl, "s.ckpt", 1));
    (void)snprintf(path, sizeof path, "%s/s.ckpt", dir);
    /* The restored module is the same constrained module: same config, same W. */
    harness_up_with(&b, NULL, path);
    CHECK_OK(ferry_remote_create(b.cl, &rc, &mb));
    CHECK_EQ(ferry_remote_created(mb), 0);
    ferry_remote_config other = rc;
    other.constraint.beta = 0.3;
    expect_create_fails(&b, &other, FERRY_ERR_EXISTS, "constraint.beta");
    static float wa[D * C], wb[D * C];
    CHECK_OK(ferry_remote_get_params(ma, "weight", 0, 0, wa));
    CHECK_OK(ferry_remote_get_params(mb, "weight", 0, 0, wb));
    CHECK(memcmp(wa, wb, sizeof wa) == 0);
    expect_num("restored Stats penalty", stats_value(&b, "penalty/lin"),
               stats_value(&a, "penalty/lin"), 0.0, 0.0);
    CHECK(stats_value(&b, "penalty/lin") > 1e-6);
    /* The next step applies A(W) and the penalty on both alike. */
    CHECK_OK(ferry_dist_ctx_create(b.cl, &db));
    double pa = remote_step(ma, da, "penalty/lin"), pb = remote_step(mb, db, "penalty/lin");
    CHECK(pa == pb && pa > 1e-6);
    CHECK_OK(ferry_remote_get_params(ma, "weight", 0, 0, wa));
    CHECK_OK(ferry_remote_get_params(mb, "weight", 0, 0, wb));
    CHECK(memcmp(wa, wb, sizeof wa) == 0);
    ferry_dist_ctx_destroy(da);
    ferry_dist_ctx_destroy(db);
    ferry_remote_destroy(ma);
    ferry_remote_destroy(mb);
    harness_down(&a);
    harness_down(&b);
    CHECK(remove(path) == 0);
    CHECK(rmdir(dir) == 0);
}

/* ---- the constrained local layer by finite differences ---- */

typedef struct fd_state {
    local *l;
    float *x, *R;
} fd_state;

static double fd_loss(void *user) {
    fd_state *s = user;
    ferry_ctx *ctx = s->l->ctx;
    ferry_ctx_reset(ctx, 99);
    ferry_ctx_set_training(ctx, 0);
    ferry_tensor tx =
        ferry_tensor_wrap(ferry_backend_cpu(), FERRY_DTYPE_F32, ferry_shape_2d(N, C), s->x);
    ferry_tensor *ty;
    CHECK_OK(ferry_linear_forward(&s->l->lin, ctx, &tx, &ty));
    double v = ferry_gradcheck_dot(ferry_tensor_f32(ty), s->R, N * D);
    ferry_ctx_set_training(ctx, 1);
    return v;
}

TEST(local_constrained_linear_gradcheck) {
    ferry_optim_config oc = ferry_optim_defaults(FERRY_OPTIM_SGD);
    local l;
    local_up(&l, 0.5f, 0, &oc);
    static float x[N * C], R[N * D], y[N * D], dx[N * C], dW[D * C], db[D], A[D * C];
    ferry_gradcheck_fill(x, N * C, -1.0f, 1.0f, 31);
    ferry_gradcheck_fill(R, N * D, -1.0f, 1.0f, 32);
    float *W = ferry_params_data(&l.P, l.lin.weight), *b = ferry_params_data(&l.P, l.lin.bias);
    /* Forward is x A(W)^T + b, in evaluation too; W itself is left alone. */
    static float wcopy[D * C];
    memcpy(wcopy, W, sizeof wcopy);
    CHECK_OK(ferry_stiefel_map(ferry_backend_cpu(), D, C, W, A, NULL));
    double want[N * D];
    for (int n = 0; n < N; n++)
        for (int d = 0; d < D; d++) {
            double acc = (double)b[d];
            for (int c = 0; c < C; c++)
                acc += (double)x[n * C + c] * (double)A[d * C + c];
            want[n * D + d] = acc;
        }
    double loss;
    ferry_ctx_reset(l.ctx, 1);
    local_pass(&l, l.ctx, x, R, &loss, y, dx);
    CHECK_CLOSE("y = x A(W)^T + b", y, want, N * D, ATOL, RTOL);
    CHECK(memcmp(wcopy, W, sizeof wcopy) == 0);
    ferry_grads *G = ferry_ctx_grads(l.ctx, &l.P);
    memcpy(dW, ferry_grads_dense(G, l.lin.weight), sizeof dW);
    memcpy(db, ferry_grads_dense(G, l.lin.bias), sizeof db);
    fd_state s = {&l, x, R};
    expect_num("loss in evaluation mode", fd_loss(&s), loss, 1e-9, 1e-9);
    ferry_gradcheck_opts o = ferry_gradcheck_defaults();
    o.eps = 1e-3;
    CHECK(ferry_gradcheck("constrained linear dW (raw)", fd_loss, &s, W, D * C, dW, &o));
    CHECK(ferry_gradcheck("constrained linear db", fd_loss, &s, b, D, db, &o));
    CHECK(ferry_gradcheck("constrained linear dx", fd_loss, &s, x, N * C, dx, &o));
    /* The raw gradient is not dL/dA: the map's Jacobian was applied. */
    static float dA[D * C];
    for (int d = 0; d < D; d++)
        for (int c = 0; c < C; c++) {
            double acc = 0.0;
            for (int n = 0; n < N; n++)
                acc += (double)R[n * D + d] * (double)x[n * C + c];
            dA[d * C + c] = (float)acc;
        }
    double gap = 0.0;
    for (int i = 0; i < D * C; i++)
        gap = fmax(gap, fabs((double)dW[i] - (double)dA[i]));
    CHECK(gap > 1e-2);
    local_down(&l);
}

FERRY_TEST_MAIN(T(remote_constrained_linear_matches_local)
                    T(two_contexts_add_the_penalty_once_per_step_each)
                        T(conflicting_constraint_is_already_exists) T(refusals)
                            T(constraint_survives_a_checkpoint)
                                T(local_constrained_linear_gradcheck))
