/* test_ps_lm.c - the distributed language model against the local one: the same
 * embedding -> LSTM -> decoder -> cross-entropy model, once as worker/model.c's
 * single block and once with the embedding and decoder on two in-process ferry-ps
 * servers (remote nodes on the local tape, include/ferry/ferry.h), trained side by side
 * with SGD and global-norm clipping. Losses, clipping coefficients and every
 * parameter must stay equal. This is the recipe ferry-trainer's distributed mode
 * follows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ferry/ferry.h"
#include "ferry/optim.h"
#include "server/ps.h"
#include "worker/model-impl.h" /* the model's fields */

enum { V = 29, E = 6, H = 8, L = 2, T = 5, B = 3 };
#define CLIP 0.2f

TEST(distributed_lm_matches_local_lm) {
    /* ---- servers and cluster ---- */
    ferry_ps_server *srv[2];
    char targets[128];
    for (int i = 0; i < 2; i++) {
        ferry_ps_config cfg;
        ferry_ps_config_default(&cfg);
        cfg.listen = "127.0.0.1:0";
        CHECK_OK(ferry_ps_server_create(&cfg, &srv[i]));
        CHECK_OK(ferry_ps_server_start(srv[i]));
    }
    (void)snprintf(targets, sizeof targets, "%s,%s", ferry_ps_server_address(srv[0]),
                   ferry_ps_server_address(srv[1]));
    ferry_cluster *cl;
    ferry_dist_ctx *dc;
    CHECK_OK(ferry_ps_connect(targets, NULL, &cl));
    CHECK_OK(ferry_dist_ctx_create(cl, &dc));

    /* ---- the local reference model ---- */
    ferry_backend *be = ferry_backend_cpu();
    ferry_lm_config mc = {V, E, H, L, 0.0f, 0.1f, 0.0f, 7};
    ferry_lm *lm;
    CHECK_OK(ferry_lm_create(be, &mc, &lm));
    ferry_optim_config oc = ferry_optim_defaults(FERRY_OPTIM_SGD);
    ferry_optim *opt_local;
    CHECK_OK(ferry_optim_create(&lm->P, &oc, &opt_local));

    /* ---- the distributed model: LSTM here, embedding and decoder remote ---- */
    ferry_params Q;
    ferry_lstm rnn;
    ferry_params_init(&Q, be);
    CHECK_OK(ferry_lstm_init(&rnn, &Q, "lstm", E, H, L, 0.0f));
    CHECK_OK(ferry_params_alloc(&Q));
    for (int i = 0; i < Q.count; i++) { /* the LSTM's starting values, by name */
        int j = ferry_params_find(&lm->P, Q.items[i].name);
        CHECK(j >= 0);
        memcpy(ferry_params_data(&Q, i), ferry_params_data(&lm->P, j),
               (size_t)Q.items[i].numel * sizeof(float));
    }
    ferry_optim *opt_q;
    CHECK_OK(ferry_optim_create(&Q, &oc, &opt_q));
    ferry_remote_config rc;
    ferry_remote *emb, *dec;
    ferry_remote_config_default(&rc, FERRY_REMOTE_EMBEDDING, "encoder", V, E);
    rc.init_seed = mc.seed;
    rc.init_scale = mc.init_scale;
    rc.weight_offset = lm->P.items[lm->emb.weight].offset;
    CHECK_OK(ferry_remote_create(cl, &rc, &emb));
    ferry_remote_config_default(&rc, FERRY_REMOTE_DECODER, "decoder", V, H);
    rc.init_seed = mc.seed;
    rc.init_scale = mc.init_scale;
    rc.weight_offset = lm->P.items[lm->dec.weight].offset;
    rc.bias_offset = lm->P.items[lm->dec.bias].offset;
    CHECK_OK(ferry_remote_create(cl, &rc, &dec));

    ferry_ctx *ctx_l, *ctx_d;
    CHECK_OK(ferry_ctx_create(be, &ctx_l));
    CHECK_OK(ferry_ctx_create(be, &ctx_d));
    ferry_tensor *h0, *c0; /* the distributed side's carried state (L, B, H) */
    CHECK_OK(ferry_tensor_create(be, FERRY_DTYPE_F32, ferry_shape_3d(L, B, H), &h0));
    CHECK_OK(ferry_tensor_create(be, FERRY_DTYPE_F32, ferry_shape_3d(L, B, H), &c0));
    int32_t in[T * B], tg[T * B];
    uint64_t seed = 12345;
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < T * B; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            in[i] = (int32_t)((seed >> 33) % V);
            tg[i] = (int32_t)((seed >> 17) % V);
        }
        ferry_tensor tin = ferry_tensor_wrap(be, FERRY_DTYPE_I32, ferry_shape_2d(T, B), in);
        ferry_tensor ttg = ferry_tensor_wrap(be, FERRY_DTYPE_I32, ferry_shape_2d(T, B), tg);
        float scale = 1.0f / (T * B);

        /* Local step. */
        ferry_tensor *loss;
        double sum_l, ss_l, norm_l;
        float coef_l;
        ferry_ctx_reset(ctx_l, (uint64_t)step + 1);
        CHECK_OK(ferry_lm_forward(lm, ctx_l, NULL, &tin, &ttg, scale, &loss, &sum_l));
        CHECK_OK(ferry_ctx_backward(ctx_l, loss));
        ferry_grads *G = ferry_ctx_grads(ctx_l, &lm->P);
        CHECK_OK(ferry_grads_sumsq(G, &ss_l));
        CHECK_OK(ferry_clip_coef(ss_l, CLIP, &coef_l, &norm_l));
        CHECK_OK(ferry_optim_step(opt_local, &lm->P, G, coef_l));

        /* Distributed step. */
        ferry_tensor *x, *y, *hn, *cn;
        double sum_d, ss_q, norm_d;
        float coef_d;
        ferry_ctx_reset(ctx_d, (uint64_t)step + 1);
        (void)ferry_dist_ctx_begin(dc);
        CHECK_OK(ferry_dist_embedding_forward(emb, dc, ctx_d, &tin, &x));
        CHECK_OK(ferry_lstm_forward(&rnn, ctx_d, x, h0, c0, NULL, &y, &hn, &cn));
        CHECK_OK(ferry_dist_xent_forward(dec, dc, ctx_d, y, &ttg, scale, &loss, &sum_d));
        CHECK_NEAR(sum_d, sum_l, 1e-5 * sum_l);
        CHECK_OK(ferry_ctx_backward(ctx_d, loss));
        ferry_grads *GQ = ferry_ctx_grads(ctx_d, &Q);
        CHECK_OK(ferry_grads_sumsq(GQ, &ss_q));
        CHECK_OK(ferry_dist_ctx_clip_step(dc, ss_q, CLIP, 0.0, &coef_d, &norm_d));
        CHECK_NEAR(norm_d, norm_l, 1e-5 * norm_l);
        CHECK_NEAR(coef_d, coef_l, 1e-5);
        CHECK(coef_l < 1.0f); /* the clip is active */
        CHECK_OK(ferry_optim_step(opt_q, &Q, GQ, coef_d));
        CHECK_OK(ferry_backend_copy(be, h0->data, hn->data, ferry_tensor_nbytes(h0),
                                    FERRY_COPY_DEVICE_TO_DEVICE));
        CHECK_OK(ferry_backend_copy(be, c0->data, cn->data, ferry_tensor_nbytes(c0),
                                    FERRY_COPY_DEVICE_TO_DEVICE));
        CHECK_CLOSE_F("carried h", ferry_tensor_f32(h0), ferry_tensor_f32(lm->h), L * B * H, 1e-6,
                      1e-5);
    }
    /* Every parameter, wherever it lives, equals the local model's. */
    static float w[V * H], b[V];
    CHECK_OK(ferry_remote_get_params(emb, "weight", 0, 0, w));
    CHECK_CLOSE_F("encoder", w, ferry_params_data(&lm->P, lm->emb.weight), V * E, 1e-6, 1e-5);
    CHECK_OK(ferry_remote_get_params(dec, "weight", 0, 0, w));
    CHECK_CLOSE_F("decoder.weight", w, ferry_params_data(&lm->P, lm->dec.weight), V * H, 1e-6,
                  1e-5);
    CHECK_OK(ferry_remote_get_params(dec, "bias", 0, 0, b));
    CHECK_CLOSE_F("decoder.bias", b, ferry_params_data(&lm->P, lm->dec.bias), V, 1e-6, 1e-5);
    for (int i = 0; i < Q.count; i++) {
        int j = ferry_params_find(&lm->P, Q.items[i].name);
        CHECK_CLOSE_F(Q.items[i].name, ferry_params_data(&Q, i), ferry_params_data(&lm->P, j),
                      Q.items[i].numel, 1e-6, 1e-5);
    }

    /* Evaluation: no context on the servers, the same loss as the local model. */
    ferry_ctx_set_training(ctx_l, 0);
    ferry_ctx_set_training(ctx_d, 0);
    ferry_tensor tin = ferry_tensor_wrap(be, FERRY_DTYPE_I32, ferry_shape_2d(T, B), in);
    ferry_tensor ttg = ferry_tensor_wrap(be, FERRY_DTYPE_I32, ferry_shape_2d(T, B), tg);
    ferry_tensor *loss, *x, *y, *hn, *cn;
    double sum_l, sum_d;
    ferry_ctx_reset(ctx_l, 100);
    ferry_ctx_reset(ctx_d, 100);
    CHECK_OK(ferry_lm_forward(lm, ctx_l, NULL, &tin, &ttg, 1.0f, &loss, &sum_l));
    CHECK_OK(ferry_dist_embedding_forward(emb, NULL, ctx_d, &tin, &x));
    CHECK_OK(ferry_lstm_forward(&rnn, ctx_d, x, h0, c0, NULL, &y, &hn, &cn));
    CHECK_OK(ferry_dist_xent_forward(dec, NULL, ctx_d, y, &ttg, 1.0f, &loss, &sum_d));
    CHECK_NEAR(sum_d, sum_l, 1e-5 * sum_l);
    ferry_ps_stats stats;
    CHECK_OK(ferry_cluster_stats(cl, 0, &stats));
    CHECK_EQ(stats.contexts_live, 0);
    CHECK_EQ(stats.contexts_stepped, 3);

    ferry_tensor_destroy(h0);
    ferry_tensor_destroy(c0);
    ferry_ctx_destroy(ctx_l);
    ferry_ctx_destroy(ctx_d);
    ferry_optim_destroy(opt_q);
    ferry_optim_destroy(opt_local);
    ferry_params_deinit(&Q);
    ferry_lm_destroy(lm);
    ferry_remote_destroy(emb);
    ferry_remote_destroy(dec);
    ferry_dist_ctx_destroy(dc);
    ferry_cluster_destroy(cl);
    for (int i = 0; i < 2; i++)
        ferry_ps_server_destroy(srv[i]);
}

FERRY_TEST_MAIN(T(distributed_lm_matches_local_lm))
