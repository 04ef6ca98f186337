/* test_ps_modules.c - remote modules against their local twins: two ferry-ps servers
 * run in this process on 127.0.0.1:0, and every remote forward, backward, gradient
 * norm and optimizer step is compared with the same computation on a local
 * parameter block (ferry_embedding, ferry_linear + ferry_xent, ferry_optim). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ferry/ferry.h"
#include "ferry/nn.h"
#include "ferry/optim.h"
#include "server/ps.h"

#define SEED  42u
#define SCALE 0.1f

typedef struct harness {
    ferry_ps_server *srv[2];
    ferry_cluster *cl;
    ferry_dist_ctx *dc;
} harness;

static void harness_up(harness *h) {
    char targets[128];
    for (int i = 0; i < 2; i++) {
        ferry_ps_config cfg;
        ferry_ps_config_default(&cfg);
        cfg.listen = "127.0.0.1:0";
        CHECK_OK(ferry_ps_server_create(&cfg, &h->srv[i]));
        CHECK_OK(ferry_ps_server_start(h->srv[i]));
    }
    (void)snprintf(targets, sizeof targets, "%s,%s", ferry_ps_server_address(h->srv[0]),
                   ferry_ps_server_address(h->srv[1]));
    CHECK_OK(ferry_ps_connect(targets, NULL, &h->cl));
    CHECK_OK(ferry_dist_ctx_create(h->cl, &h->dc));
}

static void harness_down(harness *h) {
    ferry_dist_ctx_destroy(h->dc);
    ferry_cluster_destroy(h->cl);
    for (int i = 0; i < 2; i++)
        ferry_ps_server_destroy(h->srv[i]);
}

static uint64_t rng_state = 88172645463325252ull;

static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int irand(int n) {
    return (int)((frand() + 1.0f) * 0.5f * (float)n) % n;
}

/* A local block with a leading pad parameter, so the module's offsets are not 0. */
static void local_block(ferry_params *P) {
    int pad;
    ferry_params_init(P, ferry_backend_cpu());
    CHECK_OK(ferry_params_add(P, "pad", ferry_shape_2d(3, 5), 0, &pad));
}

static void local_init(ferry_params *P) {
    CHECK_OK(ferry_params_alloc(P));
    for (int i = 0; i < P->count; i++)
        CHECK_OK(ferry_params_init_uniform(P, i, SCALE, SEED));
}

/* ---- embedding ---- */

TEST(embedding_matches_local) {
    harness h;
    harness_up(&h);
    enum { V = 37, E = 8, N = 40 };
    ferry_params P;
    ferry_embedding emb;
    local_block(&P);
    CHECK_OK(ferry_embedding_init(&emb, &P, "encoder", V, E));
    local_init(&P);
    ferry_optim_config oc = ferry_optim_defaults(FERRY_OPTIM_ADAM);
    oc.lr = 0.01;
    ferry_optim *opt;
    CHECK_OK(ferry_optim_create(&P, &oc, &opt));

    ferry_remote_config rc;
    ferry_remote_config_default(&rc, FERRY_REMOTE_EMBEDDING, "encoder", V, E);
    rc.init_seed = SEED;
    rc.init_scale = SCALE;
    rc.weight_offset = P.items[emb.weight].offset;
    CHECK_OK(ferry_optim_config_named("adam", &rc.optim));
    rc.optim.lr = 0.01;
    ferry_remote *rem;
    CHECK_OK(ferry_remote_create(h.cl, &rc, &rem));
    CHECK_EQ(ferry_remote_created(rem), 2);
    CHECK_EQ(ferry_remote_shards(rem), 2);

    /* The generator reproduces the local block's values exactly. */
    static float table[V * E];
    CHECK_OK(ferry_remote_get_params(rem, "weight", 0, 0, table));
    CHECK(memcmp(table, ferry_params_data(&P, emb.weight), sizeof table) == 0);

    ferry_ctx *ctx;
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &ctx));
    static int32_t ids[N];
    static float grad[N * E], out[N * E];
    for (int step = 0; step < 3; step++) {
        /* Step 1 looks up shard 0's rows only: shard 1 must still advance Adam's t. */
        for (int i = 0; i < N; i++)
            ids[i] = step == 1 ? irand(V / 2 - 1) : irand(V);
        for (int i = 0; i < N * E; i++)
            grad[i] = frand();
        ferry_ctx_reset(ctx, (uint64_t)step + 1);
        ferry_tensor tid =
            ferry_tensor_wrap(ferry_backend_cpu(), FERRY_DTYPE_I32, ferry_shape_1d(N), ids);
        ferry_tensor tg =
            ferry_tensor_wrap(ferry_backend_cpu(), FERRY_DTYPE_F32, ferry_shape_2d(N, E), grad);
        ferry_tensor *x;
        CHECK_OK(ferry_embedding_forward(&emb, ctx, &tid, &x));
        const ferry_tensor *outs[1] = {x}, *seeds[1] = {&tg};
        CHECK_OK(ferry_ctx_backward_from(ctx, 1, outs, seeds));
        ferry_grads *G = ferry_ctx_grads(ctx, &P);
        double local_ss;
        CHECK_OK(ferry_grads_sumsq(G, &local_ss));

        uint64_t id = ferry_dist_ctx_begin(h.dc), call;
        CHECK(id >> 48 == 0 && id != 0);
        CHECK_OK(ferry_remote_embedding_forward(rem, h.dc, ids, N, out, &call));
        CHECK(memcmp(out, ferry_tensor_f32(x), sizeof out) == 0);
        CHECK_OK(ferry_remote_embedding_backward(rem, h.dc, call, grad));
        double remote_ss;
        CHECK_OK(ferry_dist_ctx_grad_sumsq(h.dc, &remote_ss));
        CHECK_NEAR(remote_ss, local_ss, 1e-9 * local_ss);
        CHECK_OK(ferry_dist_ctx_step(h.dc, 0.7f, 0.0));
        CHECK_OK(ferry_optim_step(opt, &P, G, 0.7f));
        CHECK_OK(ferry_remote_get_params(rem, "weight", 0, 0, table));
        CHECK_CLOSE_F("embedding after step", table, ferry_params_data(&P, emb.weight), V * E, 1e-7,
                      1e-6);
    }
    /* Evaluation: no context, same rows, nothing saved. */
    CHECK_OK(ferry_remote_embedding_forward(rem, NULL, ids, N, out, NULL));
    for (int i = 0; i < N; i++)
        CHECK(memcmp(out + i * E, table + ids[i] * E, E * sizeof(float)) == 0);
    ferry_ps_stats stats;
    for (int s = 0; s < 2; s++) {
        CHECK_OK(ferry_cluster_stats(h.cl, s, &stats));
        CHECK_EQ(stats.contexts_live, 0);
        CHECK_EQ(stats.context_bytes, 0);
        CHECK_EQ(stats.contexts_stepped, 3);
    }
    ferry_ctx_destroy(ctx);
    ferry_optim_destroy(opt);
    ferry_params_deinit(&P);
    ferry_remote_destroy(rem);
    harness_down(&h);
}

/* ---- decoder ---- */

typedef struct dec_fixture {
    ferry_params P;
    ferry_linear lin;
    ferry_optim *opt;
    ferry_remote *rem;
} dec_fixture;

enum { DV = 51, DH = 12, DN = 30 }; /* V odd: shards of 25 and 26 rows */

static void dec_setup(harness *h, dec_fixture *f) {
    local_block(&f->P);
    CHECK_OK(ferry_linear_init(&f->lin, &f->P, "decoder", DH, DV, 1));
    local_init(&f->P);
    ferry_optim_config oc = ferry_optim_defaults(FERRY_OPTIM_SGD);
    oc.lr = 0.5;
    oc.momentum = 0.9;
    CHECK_OK(ferry_optim_create(&f->P, &oc, &f->opt));
    ferry_remote_config rc;
    ferry_remote_config_default(&rc, FERRY_REMOTE_DECODER, "decoder", DV, DH);
    rc.init_seed = SEED;
    rc.init_scale = SCALE;
    rc.weight_offset = f->P.items[f->lin.weight].offset;
    rc.bias_offset = f->P.items[f->lin.bias].offset;
    rc.optim.lr = 0.5;
    rc.optim.momentum = 0.9;
    CHECK_OK(ferry_remote_create(h->cl, &rc, &f->rem));
    static float w[DV * DH], b[DV];
    CHECK_OK(ferry_remote_get_params(f->rem, "weight", 0, 0, w));
    CHECK_OK(ferry_remote_get_params(f->rem, "bias", 0, 0, b));
    CHECK(memcmp(w, ferry_params_data(&f->P, f->lin.weight), sizeof w) == 0);
    CHECK(memcmp(b, ferry_params_data(&f->P, f->lin.bias), sizeof b) == 0);
}

static void dec_check_params(dec_fixture *f, const char *what) {
    static float w[DV * DH], b[DV];
    CHECK_OK(ferry_remote_get_params(f->rem, "weight", 0, 0, w));
    CHECK_OK(ferry_remote_get_params(f->rem, "bias", 0, 0, b));
    CHECK_CLOSE_F(what, w, ferry_params_data(&f->P, f->lin.weight), DV * DH, 1e-6, 1e-5);
    CHECK_CLOSE_F(what, b, ferry_params_data(&f->P, f->lin.bias), DV, 1e-6, 1e-5);
}

static void dec_teardown(dec_fixture *f) {
    ferry_remote_destroy(f->rem);
    ferry_optim_destroy(f->opt);
    ferry_params_deinit(&f->P);
}

TEST(decoder_partials_match_local_xent) {
    harness h;
    harness_up(&h);
    dec_fixture f;
    dec_setup(&h, &f);
    ferry_ctx *ctx;
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &ctx));
    static float hid[DN * DH], dh[DN * DH], rows[DN];
    static int32_t tg[DN];
    for (int step = 0; step < 2; step++) {
        for (int i = 0; i < DN * DH; i++)
            hid[i] = 2.0f * frand();
        for (int n = 0; n < DN; n++)
            tg[n] = irand(DV);
        /* Local: linear + xent with the mean loss, gradient of the hidden state. */
        ferry_ctx_reset(ctx, (uint64_t)step + 1);
        ferry_tensor th =
            ferry_tensor_wrap(ferry_backend_cpu(), FERRY_DTYPE_F32, ferry_shape_2d(DN, DH), hid);
        ferry_tensor tt =
            ferry_tensor_wrap(ferry_backend_cpu(), FERRY_DTYPE_I32, ferry_shape_1d(DN), tg);
        ferry_tensor *logits, *loss;
        double local_sum, remote_sum;
        CHECK_OK(ferry_ctx_require_grad(ctx, &th));
        CHECK_OK(ferry_linear_forward(&f.lin, ctx, &th, &logits));
        CHECK_OK(ferry_xent_forward(ctx, logits, &tt, 1.0f / DN, &loss, &local_sum));
        CHECK_OK(ferry_ctx_backward(ctx, loss));
        const float *local_dh = ferry_tensor_f32(ferry_ctx_grad_of(ctx, &th));
        ferry_grads *G = ferry_ctx_grads(ctx, &f.P);
        double local_ss, remote_ss;
        CHECK_OK(ferry_grads_sumsq(G, &local_ss));

        /* Remote: the sharded softmax over both vocabulary slices. */
        uint64_t call;
        (void)ferry_dist_ctx_begin(h.dc);
        CHECK_OK(ferry_remote_xent_forward(f.rem, h.dc, hid, tg, DN, rows, &remote_sum, &call));
        CHECK_NEAR(remote_sum, local_sum, 1e-5 * local_sum);
        double rows_sum = 0.0;
        for (int n = 0; n < DN; n++)
            rows_sum += (double)rows[n];
        CHECK_NEAR(rows_sum, remote_sum, 1e-4);
        CHECK_OK(ferry_remote_xent_backward(f.rem, h.dc, call, NULL, 1.0f / DN, dh));
        CHECK_CLOSE_F("dh", dh, local_dh, DN * DH, 1e-5, 1e-5);
        CHECK_OK(ferry_dist_ctx_grad_sumsq(h.dc, &remote_ss));
        CHECK_NEAR(remote_ss, local_ss, 1e-5 * local_ss);
        float coef_l, coef_r;
        double norm_r;
        /* Clip at half the norm so the coefficient matters. */
        float max_norm = (float)(0.5 * sqrt(local_ss));
        CHECK_OK(ferry_clip_coef(local_ss, max_norm, &coef_l, NULL));
        CHECK_OK(ferry_dist_ctx_clip_step(h.dc, 0.0, max_norm, 0.0, &coef_r, &norm_r));
        CHECK_NEAR(coef_r, coef_l, 1e-6);
        CHECK_OK(ferry_optim_step(f.opt, &f.P, G, coef_l));
        dec_check_params(&f, "decoder after step");
    }
    ferry_ctx_destroy(ctx);
    dec_teardown(&f);
    harness_down(&h);
}

TEST(decoder_logits_match_local_linear) {
    harness h;
    harness_up(&h);
    dec_fixture f;
    dec_setup(&h, &f);
    ferry_ctx *ctx;
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &ctx));
    static float hid[DN * DH], dh[DN * DH], logits[DN * DV], dz[DN * DV];
    for (int step = 0; step < 2; step++) {
        for (int i = 0; i < DN * DH; i++)
            hid[i] = frand();
        for (int i = 0; i < DN * DV; i++)
            dz[i] = 0.1f * frand();
        ferry_ctx_reset(ctx, (uint64_t)step + 1);
        ferry_tensor th =
            ferry_tensor_wrap(ferry_backend_cpu(), FERRY_DTYPE_F32, ferry_shape_2d(DN, DH), hid);
        ferry_tensor tz =
            ferry_tensor_wrap(ferry_backend_cpu(), FERRY_DTYPE_F32, ferry_shape_2d(DN, DV), dz);
        ferry_tensor *z;
        CHECK_OK(ferry_ctx_require_grad(ctx, &th));
        CHECK_OK(ferry_linear_forward(&f.lin, ctx, &th, &z));
        const ferry_tensor *outs[1] = {z}, *seeds[1] = {&tz};
        CHECK_OK(ferry_ctx_backward_from(ctx, 1, outs, seeds));

        uint64_t call;
        (void)ferry_dist_ctx_begin(h.dc);
        CHECK_OK(ferry_remote_logits_forward(f.rem, h.dc, hid, DN, logits, &call));
        CHECK_CLOSE_F("logits", logits, ferry_tensor_f32(z), DN * DV, 1e-6, 1e-5);
        CHECK_OK(ferry_remote_logits_backward(f.rem, h.dc, call, dz, dh));
        CHECK_CLOSE_F("dh", dh, ferry_tensor_f32(ferry_ctx_grad_of(ctx, &th)), DN * DH, 1e-6, 1e-5);
        /* A second Backward of the same call is refused: it was consumed. */
        CHECK_STATUS(ferry_remote_logits_backward(f.rem, h.dc, call, dz, dh), FERRY_ERR_NOT_FOUND);
        CHECK_OK(ferry_dist_ctx_step(h.dc, 1.0f, 0.0));
        CHECK_OK(ferry_optim_step(f.opt, &f.P, ferry_ctx_grads(ctx, &f.P), 1.0f));
        dec_check_params(&f, "decoder (logits mode) after step");
    }
    ferry_ctx_destroy(ctx);
    dec_teardown(&f);
    harness_down(&h);
}

TEST(linear_matches_local_and_params_roundtrip) {
    harness h;
    harness_up(&h);
    enum { C = 7, D = 5, N = 9 };
    ferry_params P;
    ferry_linear lin;
    ferry_params_init(&P, ferry_backend_cpu());
    CHECK_OK(ferry_linear_init(&lin, &P, "proj", C, D, 1));
    local_init(&P);
    ferry_optim_config oc = ferry_optim_defaults(FERRY_OPTIM_ADAGRAD);
    ferry_optim *opt;
    CHECK_OK(ferry_optim_create(&P, &oc, &opt));
    ferry_remote_config rc;
    ferry_remote_config_default(&rc, FERRY_REMOTE_LINEAR, "proj", C, D);
    rc.init_seed = SEED;
    rc.init_scale = SCALE;
    rc.server = 1;
    CHECK_OK(ferry_optim_config_named("adagrad", &rc.optim));
    ferry_remote *rem;
    CHECK_OK(ferry_remote_create(h.cl, &rc, &rem));
    int server;
    ferry_remote_shard(rem, 0, NULL, NULL, &server);
    CHECK_EQ(server, 1);
    /* The default offsets lay the module out as a block of its own: as P here. */
    static float w[D * C], b[D], x[N * C], y[N * D], dy[N * D], dx[N * C];
    CHECK_OK(ferry_remote_get_params(rem, "weight", 0, 0, w));
    CHECK(memcmp(w, ferry_params_data(&P, lin.weight), sizeof w) == 0);
    for (int i = 0; i < N * C; i++)
        x[i] = frand();
    for (int i = 0; i < N * D; i++)
        dy[i] = frand();
    ferry_ctx *ctx;
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &ctx));
    ferry_tensor tx =
        ferry_tensor_wrap(ferry_backend_cpu(), FERRY_DTYPE_F32, ferry_shape_2d(N, C), x);
    ferry_tensor tdy =
        ferry_tensor_wrap(ferry_backend_cpu(), FERRY_DTYPE_F32, ferry_shape_2d(N, D), dy);
    ferry_tensor *ty;
    CHECK_OK(ferry_ctx_require_grad(ctx, &tx));
    CHECK_OK(ferry_linear_forward(&lin, ctx, &tx, &ty));
    const ferry_tensor *outs[1] = {ty}, *seeds[1] = {&tdy};
    CHECK_OK(ferry_ctx_backward_from(ctx, 1, outs, seeds));
    uint64_t call;
    (void)ferry_dist_ctx_begin(h.dc);
    CHECK_OK(ferry_remote_linear_forward(rem, h.dc, x, N, y, &call));
    CHECK_CLOSE_F("y", y, ferry_tensor_f32(ty), N * D, 1e-6, 1e-5);
    CHECK_OK(ferry_remote_linear_backward(rem, h.dc, call, dy, dx));
    CHECK_CLOSE_F("dx", dx, ferry_tensor_f32(ferry_ctx_grad_of(ctx, &tx)), N * C, 1e-6, 1e-5);
    CHECK_OK(ferry_dist_ctx_step(h.dc, 1.0f, 0.0));
    CHECK_OK(ferry_optim_step(opt, &P, ferry_ctx_grads(ctx, &P), 1.0f));
    CHECK_OK(ferry_remote_get_params(rem, "weight", 0, 0, w));
    CHECK_OK(ferry_remote_get_params(rem, "bias", 0, 0, b));
    CHECK_CLOSE_F("weight", w, ferry_params_data(&P, lin.weight), D * C, 1e-6, 1e-5);
    CHECK_CLOSE_F("bias", b, ferry_params_data(&P, lin.bias), D, 1e-6, 1e-5);
    /* SetParams over a row range, then GetParams of a narrower one. */
    float rows[2 * C];
    for (int i = 0; i < 2 * C; i++)
        rows[i] = (float)i;
    CHECK_OK(ferry_remote_set_params(rem, "weight", 2, 2, rows));
    float back[C];
    CHECK_OK(ferry_remote_get_params(rem, "weight", 3, 1, back));
    CHECK(memcmp(back, rows + C, sizeof back) == 0);
    CHECK_STATUS(ferry_remote_get_params(rem, "weight", 4, 2, back), FERRY_ERR_RANGE);
    CHECK_STATUS(ferry_remote_get_params(rem, "gamma", 0, 1, back), FERRY_ERR_NOT_FOUND);
    ferry_ctx_destroy(ctx);
    ferry_optim_destroy(opt);
    ferry_params_deinit(&P);
    ferry_remote_destroy(rem);
    harness_down(&h);
}

TEST(explicit_initial_values_and_row_ranges_across_shards) {
    harness h;
    harness_up(&h);
    enum { V = 11, E = 3 };
    static float init[V * E], got[V * E], part[4 * E];
    for (int i = 0; i < V * E; i++)
        init[i] = (float)i * 0.25f;
    ferry_remote_config rc;
    ferry_remote_config_default(&rc, FERRY_REMOTE_EMBEDDING, "table", V, E);
    rc.init_weight = init;
    ferry_remote *rem;
    CHECK_OK(ferry_remote_create(h.cl, &rc, &rem));
    CHECK_OK(ferry_remote_get_params(rem, "weight", 0, 0, got));
    CHECK(memcmp(got, init, sizeof got) == 0);
    /* Rows 3..7 span the boundary between shard 0 [0, 5) and shard 1 [5, 11). */
    CHECK_OK(ferry_remote_get_params(rem, "weight", 3, 4, part));
    CHECK(memcmp(part, init + 3 * E, sizeof part) == 0);
    for (int i = 0; i < 4 * E; i++)
        part[i] = -1.0f;
    CHECK_OK(ferry_remote_set_params(rem, "weight", 3, 4, part));
    CHECK_OK(ferry_remote_get_params(rem, "weight", 0, 0, got));
    for (int r = 0; r < V; r++)
        for (int e = 0; e < E; e++)
            CHECK(got[r * E + e] == (r >= 3 && r < 7 ? -1.0f : init[r * E + e]));
    ferry_remote_destroy(rem);
    harness_down(&h);
}

FERRY_TEST_MAIN(T(embedding_matches_local) T(decoder_partials_match_local_xent)
                    T(decoder_logits_match_local_linear)
                        T(linear_matches_local_and_params_roundtrip)
                            T(explicit_initial_values_and_row_ranges_across_shards))
