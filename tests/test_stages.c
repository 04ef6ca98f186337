/* test_stages.c - model parallelism: the LSTM's layers in groups placed on ferry-ps
 * servers (lstm modules) and in the trainer, against the same model with every layer
 * in the trainer. Each pair of runs starts from the same seed against its own two
 * in-process servers over real gRPC (embedding and decoder sharded over both), for 50
 * PTB steps. Two stages (the whole LSTM on a server) and three (layer 0 on a server,
 * Stiefel-constrained, layer 1 here) must be bit-identical to the whole stack in the
 * trainer with dropout off and on (README): every step's loss and afterwards every
 * parameter, read back from wherever it lives, compared by their bits. With
 * micro-batches (whose pipe must have run every step in M chunks) the losses must
 * agree within 1e-5 relative and every parameter element within 1e-5 (|a - b| <= 1e-5
 * (1 + |b|)); so must a 4-layer stack split over both servers and the trainer against
 * the local trainer itself. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "server/ps.h"
#include "worker/batch.h"
#include "worker/corpus.h"
#include "worker/model-impl.h" /* the model's fields */
#include "worker/pipeline.h"

/* 50 steps; 20 under the sanitizers (several times slower there), which look for
 * memory and undefined-behaviour errors, not for drift: the release build checks that. */
#ifdef FERRY_SANITIZE
#define STEPS 20
#else
#define STEPS 50
#endif
#define LR 0.1 /* as test_pipeline.c: lr 1 amplifies rounding past 1e-5 in ~25 steps */
#define NSERVERS 2

typedef struct run {
    ferry_ps_server *srv[NSERVERS];
    ferry_cluster *cl;
    ferry_dist_ctx *dc;
    ferry_lm *lm;
    ferry_optim *opt;
    ferry_ctx *ctx;
} run;

/* stages NULL with local set: the local trainer, no servers. */
static void run_init(run *r, const ferry_lm_config *mc, const char *stages, int M, int local) {
    ferry_backend *be = ferry_backend_cpu();
    memset(r, 0, sizeof *r);
    ferry_optim_config oc = ferry_optim_defaults(FERRY_OPTIM_SGD);
    oc.lr = LR;
    if (local) {
        CHECK_OK(ferry_lm_create(be, mc, &r->lm));
    } else {
        char targets[256] = "";
        for (int i = 0; i < NSERVERS; i++) {
            ferry_ps_config pc;
            ferry_ps_config_default(&pc);
            pc.listen = "127.0.0.1:0";
            CHECK_OK(ferry_ps_server_create(&pc, &r->srv[i]));
            CHECK_OK(ferry_ps_server_start(r->srv[i]));
            size_t n = strlen(targets);
            snprintf(targets + n, sizeof targets - n, "%s127.0.0.1:%d", i ? "," : "",
                     ferry_ps_server_port(r->srv[i]));
        }
        CHECK_OK(ferry_ps_connect(targets, NULL, &r->cl));
        CHECK_OK(ferry_dist_ctx_create(r->cl, &r->dc));
        ferry_lm_placement pl = {.cluster = r->cl,
                                 .decoder_mode = FERRY_DECODER_SHARDED,
                                 .optim = oc,
                                 .job = NULL,
                                 .resume = 0,
                                 .stages = stages,
                                 .local_vocab = 0};
        CHECK_OK(ferry_lm_create_placed(be, mc, &pl, &r->lm));
        CHECK_OK(ferry_lm_set_micro_batches(r->lm, M));
    }
    CHECK_OK(ferry_optim_create(&r->lm->P, &oc, &r->opt));
    CHECK_OK(ferry_ctx_create(be, &r->ctx));
}

static void run_deinit(run *r) {
    ferry_ctx_destroy(r->ctx);
    ferry_optim_destroy(r->opt);
    ferry_lm_destroy(r->lm);
    ferry_dist_ctx_destroy(r->dc);
    ferry_cluster_destroy(r->cl);
    for (int i = 0; i < NSERVERS; i++)
        ferry_ps_server_destroy(r->srv[i]);
}

/* A copy of the model parameter `name` (as the local layout names it), wherever the
 * run keeps it: its own block, an lstm module (packed), the embedding or decoder. */
static float *param_of(run *r, const char *name, int64_t numel) {
    float *out = malloc((size_t)numel * sizeof *out);
    CHECK(out != NULL);
    int i = ferry_params_find(&r->lm->P, name);
    if (i >= 0) {
        memcpy(out, ferry_params_data(&r->lm->P, i), (size_t)numel * sizeof *out);
        return out;
    }
    for (int g = 0; g < r->lm->ngroups; g++) {
        ferry_lm_group *G = &r->lm->groups[g];
        int j = G->server >= 0 ? ferry_params_find(&G->view, name) : -1;
        if (j < 0)
            continue;
        float *w = malloc((size_t)G->view.numel * sizeof *w);
        CHECK(w != NULL);
        CHECK_OK(ferry_remote_get_params(G->remote, "weight", 0, 1, w));
        memcpy(out, w + G->view.items[j].offset, (size_t)numel * sizeof *out);
        free(w);
        return out;
    }
    int64_t V = r->lm->cfg.V;
    if (strcmp(name, "encoder.weight") == 0)
        CHECK_OK(ferry_remote_get_params(r->lm->emb_remote, "weight", 0, V, out));
    else if (strcmp(name, "decoder.weight") == 0)
        CHECK_OK(ferry_remote_get_params(r->lm->dec_remote, "weight", 0, V, out));
    else if (strcmp(name, "decoder.bias") == 0)
        CHECK_OK(ferry_remote_get_params(r->lm->dec_remote, "bias", 0, V, out));
    else
        CHECK(!"parameter not found anywhere");
    return out;
}

/* `stages` with M micro-batches against the reference: every layer in the trainer,
 * distributed (embedding and decoder on the servers) or, with ref_local, the local
 * trainer. tol 0: every loss and parameter bit-identical; else losses within tol
 * relative and every parameter element within tol (|a - b| <= tol (1 + |b|)).
 * Returns the worst relative difference (losses, and parameters in norm). */
static double stages_case(int L, float dropout, float stiefel, const char *stages, int M,
                          int ref_local, double tol) {
    ferry_backend *be = ferry_backend_cpu();
    ferry_corpus *corpus;
    CHECK_OK(ferry_corpus_load(ferry_test_path("data/ptb"), &corpus));
    int64_t n;
    const int32_t *ids = ferry_corpus_ids(corpus, FERRY_SPLIT_TRAIN, &n);
    ferry_batches *b;
    CHECK_OK(ferry_batch_create(ids, 20 * (STEPS * 20 + 1), 20, &b));
    int64_t V = ferry_vocab_size(ferry_corpus_vocab(corpus));
    ferry_lm_config mc = {V, 64, 64, L, dropout, 0.1f, stiefel, 7};
    run ref, st;
    run_init(&ref, &mc, NULL, 1, ref_local);
    run_init(&st, &mc, stages, M, 0);
    CHECK(st.lm->ngroups > 1 || st.lm->groups[0].server >= 0);

    double worst = 0.0, first = 0.0, last = 0.0;
    for (int s = 0; s < STEPS; s++) {
        ferry_window w;
        CHECK_OK(ferry_batch_window(b, (int64_t)s * 20, 20, &w));
        ferry_shape sh = ferry_shape_2d(w.T, w.B);
        ferry_tensor in = ferry_tensor_wrap(be, FERRY_DTYPE_I32, sh, (void *)(uintptr_t)w.inputs);
        ferry_tensor tg = ferry_tensor_wrap(be, FERRY_DTYPE_I32, sh, (void *)(uintptr_t)w.targets);
        ferry_lm_step_args a = {.loss_scale = 1.0f / 20.0f, .clip = 5.0f, .lr = LR, .ctx_id = (uint64_t)s + 1, .seed = 1000 + (uint64_t)s, .job_step = 0};
        ferry_lm_step_result rr, rs;
        CHECK_OK(ferry_lm_train_step(ref.lm, ref.ctx, ref.dc, ref.opt, &in, &tg, &a, &rr));
        CHECK_OK(ferry_lm_train_step(st.lm, st.ctx, st.dc, st.opt, &in, &tg, &a, &rs));
        double rel = fabs(rs.loss_sum - rr.loss_sum) / fabs(rr.loss_sum);
        worst = rel > worst ? rel : worst;
        if (rel > tol)
            fprintf(stderr, "  step %d: reference %.9g staged %.9g (rel %.3g)\n", s + 1,
                    rr.loss_sum, rs.loss_sum, rel);
        CHECK(rel <= tol);
        if (tol == 0.0)
            CHECK_BITS_EQ(rs.loss_sum, rr.loss_sum);
        if (s == 0)
            first = rr.loss_sum;
        last = rr.loss_sum;
    }
    CHECK(last < first); /* it trained */

    /* Every parameter of the whole model, by its local name. */
    ferry_params full;
    ferry_lm *shape;
    CHECK_OK(ferry_lm_create(be, &mc, &shape));
    full = shape->P;
    double wp = 0.0;
    const char *worst_name = "";
    for (int i = 0; i < full.count; i++) {
        const ferry_param *p = &full.items[i];
        float *x = param_of(&st, p->name, p->numel), *y = param_of(&ref, p->name, p->numel);
        if (tol == 0.0)
            CHECK_SAME_BITS(p->name, x, y, p->numel);
        else
            CHECK_CLOSE_F(p->name, x, y, p->numel, tol, tol);
        double rel = ferry_norm_rel(x, y, p->numel);
        if (rel > wp) {
            wp = rel;
            worst_name = p->name;
        }
        free(x);
        free(y);
    }
    fprintf(stderr,
            "  %-22s L=%d dropout %.1f stiefel %.1f M=%d vs %s: loss %.4f -> %.4f, "
            "worst loss rel %.3g, worst param rel %.3g (%s)\n",
            stages, L, (double)dropout, (double)stiefel, M, ref_local ? "local" : "all-local stack",
            first / 400.0, last / 400.0, worst, wp, worst_name);
    ferry_lm_destroy(shape);
    /* With M > 1 the staged run ran its pipe every step, M chunks each. */
    if (M > 1) {
        ferry_lm_pipe_stats ps;
        CHECK(st.lm->pipe != NULL);
        ferry_lm_pipe_take_stats(st.lm->pipe, &ps);
        CHECK_EQ(ps.steps, STEPS);
        CHECK_EQ(ferry_lm_pipe_micro(st.lm->pipe), M);
    }
    /* Every step freed its contexts on both servers. */
    for (int i = 0; i < NSERVERS; i++) {
        ferry_ps_stats ps;
        CHECK_OK(ferry_cluster_stats(st.cl, i, &ps));
        CHECK_EQ(ps.contexts_live, 0);
    }
    run_deinit(&st);
    run_deinit(&ref);
    ferry_batch_destroy(b);
    ferry_corpus_destroy(corpus);
    return fmax(worst, wp);
}

TEST(two_stages_dropout_off) {
    stages_case(2, 0.0f, 0.0f, "ps1:2", 1, 0, 0.0);
}

TEST(two_stages_dropout_on_pipelined) {
    stages_case(2, 0.5f, 0.0f, "ps1:2", 4, 0, 1e-5);
}

TEST(three_stages_stiefel_dropout_off) {
    stages_case(2, 0.0f, 0.1f, "ps1:1,local:1", 1, 0, 0.0);
}

TEST(three_stages_dropout_on_are_the_whole_stack_bit_for_bit) {
    /* One micro-batch: the same masks, the same arithmetic, on other processes. */
    CHECK(stages_case(2, 0.5f, 0.1f, "ps1:1,local:1", 1, 0, 0.0) == 0.0);
}

TEST(three_stages_stiefel_dropout_on_pipelined) {
    stages_case(2, 0.3f, 0.1f, "ps1:1,local:1", 3, 0, 1e-5); /* chunks of 6, 7, 7 steps */
}

TEST(four_layers_over_two_servers_and_the_trainer_match_the_local_trainer) {
    stages_case(4, 0.0f, 0.0f, "ps0:1,ps1:1,local:2", 1, 1, 1e-5);
}

TEST(stages_are_checked) {
    ferry_ps_config pc;
    ferry_ps_server *srv;
    ferry_ps_config_default(&pc);
    pc.listen = "127.0.0.1:0";
    CHECK_OK(ferry_ps_server_create(&pc, &srv));
    CHECK_OK(ferry_ps_server_start(srv));
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", ferry_ps_server_port(srv));
    ferry_cluster *cl;
    CHECK_OK(ferry_ps_connect(target, NULL, &cl));
    ferry_lm_config mc = {100, 8, 8, 3, 0.0f, 0.1f, 0.0f, 1};
    ferry_optim_config oc = ferry_optim_defaults(FERRY_OPTIM_SGD);
    struct {
        const char *spec, *msg;
    } bad[] = {
        {"ps0:2", "places 2 of the 3 layers"},
        {"ps0:2,local:2", "1 of the 3 layers are left"},
        {"ps1:3", "ps1, but --ps names 1 server"},
        {"gpu:3", "neither 'local' nor psI"},
        {"ps0", "not WHERE:LAYERS"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ferry_lm_placement pl = {.cluster = cl,
                                 .decoder_mode = FERRY_DECODER_SHARDED,
                                 .optim = oc,
                                 .job = NULL,
                                 .resume = 0,
                                 .stages = bad[i].spec,
                                 .local_vocab = 0};
        ferry_lm *lm;
        CHECK_EQ(ferry_lm_create_placed(ferry_backend_cpu(), &mc, &pl, &lm), FERRY_ERR_INVALID);
        if (strstr(ferry_error_last(), bad[i].msg) == NULL)
            fprintf(stderr, "  --stages %s: '%s'\n", bad[i].spec, ferry_error_last());
        CHECK(strstr(ferry_error_last(), bad[i].msg) != NULL);
    }
    /* A bad lstm module request is refused with a reason. */
    ferry_remote_config rc;
    ferry_remote *m;
    ferry_remote_config_default(&rc, FERRY_REMOTE_LSTM, "lstm_bad", 8, 8);
    rc.layers = 9;
    CHECK_EQ(ferry_remote_create(cl, &rc, &m), FERRY_ERR_INVALID);
    /* Bad calls to a good one: clear errors, and the server keeps serving. */
    ferry_remote_config_default(&rc, FERRY_REMOTE_LSTM, "lstm_ok", 3, 4);
    rc.layers = 2;
    rc.dropout = 0.5f;
    CHECK_OK(ferry_remote_create(cl, &rc, &m));
    float x[2 * 2 * 3] = {0}, y[2 * 2 * 4], h[2 * 2 * 4], c[2 * 2 * 4];
    ferry_remote_lstm_args a = {.stream = 42};
    CHECK_EQ(ferry_remote_lstm_forward(m, NULL, &a, x, 2, 2, NULL, NULL, y, h, c, NULL),
             FERRY_ERR_NOT_FOUND); /* a stream with no state, and no reset */
    CHECK(strstr(ferry_error_last(), "has no carried state") != NULL);
    a.reset = a.carry = 1;
    CHECK_OK(ferry_remote_lstm_forward(m, NULL, &a, x, 2, 2, NULL, NULL, y, h, c, NULL));
    a.reset = 0; /* now it has one */
    CHECK_OK(ferry_remote_lstm_forward(m, NULL, &a, x, 2, 2, NULL, NULL, y, h, c, NULL));
    CHECK_EQ(ferry_remote_lstm_forward(m, NULL, &a, x, 2, 1, NULL, NULL, y, h, c, NULL),
             FERRY_ERR_NOT_FOUND); /* ... for another batch size */
    CHECK(strstr(ferry_error_last(), "for this batch size") != NULL);
    a.window_T = 3;
    a.t0 = 2; /* steps [2, 4) of a window of 3 */
    CHECK_EQ(ferry_remote_lstm_forward(m, NULL, &a, x, 2, 2, NULL, NULL, y, h, c, NULL),
             FERRY_ERR_RANGE);
    a.window_T = a.t0 = 0;
    x[5] = NAN;
    CHECK_EQ(ferry_remote_lstm_forward(m, NULL, &a, x, 2, 2, NULL, NULL, y, h, c, NULL),
             FERRY_ERR_NUMERIC);
    x[5] = 0.0f;
    CHECK_EQ(ferry_remote_lstm_forward(m, NULL, &a, x, 2, 2, h, NULL, y, h, c, NULL),
             FERRY_ERR_INVALID); /* h0 without c0 */
    int serving = 0;
    CHECK_OK(ferry_cluster_health(cl, 0, &serving));
    CHECK(serving);
    ferry_remote_destroy(m);
    ferry_cluster_destroy(cl);
    ferry_ps_server_destroy(srv);
}

FERRY_TEST_MAIN(T(two_stages_dropout_off) T(two_stages_dropout_on_pipelined)
                    T(three_stages_stiefel_dropout_off)
                        T(three_stages_dropout_on_are_the_whole_stack_bit_for_bit)
                        T(three_stages_stiefel_dropout_on_pipelined)
                            T(four_layers_over_two_servers_and_the_trainer_match_the_local_trainer)
                                T(stages_are_checked))
