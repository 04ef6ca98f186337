/* test_stiefel_lstm.c - the Stiefel-constrained LSTM (cdopt's LSTM_cdopt) end to end:
 * every LSTM case of tests/data/cdopt_vectors.json run through the constrained layer
 * with the RAW weights (outputs, the effective weight, the penalty and every gradient
 * of sum(output) + penalty), finite differences of whole constrained LSTMs plus the
 * penalty, the polar initialisation being a fixed point of the map, and the layer's
 * extra memory coming from the context arena (steady state allocates nothing). */
#include <malloc.h> /* mallinfo2: heap in use, for the steady-state check */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gradcheck.h" /* ferry_gradcheck, ferry_gradcheck_fill, ferry_gradcheck_dot */
#include "json.h"      /* ferry_json_* */
#include "ferry/nn.h"
#include "optim/stiefel.h"

#define ATOL 1e-5
#define RTOL 1e-4

static ferry_json *root;

static void release_root(void) {
    ferry_json_destroy(root);
    root = NULL;
}

static const ferry_json *lstm_vectors(const char *name) {
    if (root == NULL) {
        CHECK_OK(ferry_json_parse_file(ferry_test_path("tests/data/cdopt_vectors.json"), &root));
        CHECK(atexit(release_root) == 0);
    }
    const ferry_json *cases = ferry_json_get(root, "lstm");
    for (size_t i = 0; i < ferry_json_len(cases); i++)
        if (strcmp(ferry_json_str(ferry_json_get(ferry_json_at(cases, i), "name")), name) == 0)
            return ferry_json_at(cases, i);
    fprintf(stderr, "  no LSTM case '%s' in cdopt_vectors.json\n", name);
    CHECK(0);
    return NULL;
}

/* The float data of the tensor at path (caller frees); checks the element count. */
static float *jf(const ferry_json *node, const char *path, long want) {
    long n = -1;
    float *p = ferry_json_tensor_f32(ferry_json_path(node, path), &n);
    if (p == NULL || n != want) {
        fprintf(stderr, "  %s: missing or %ld elements, want %ld\n", path, n, want);
        CHECK(0);
    }
    return p;
}

static double jnum(const ferry_json *node, const char *path) {
    double v = ferry_json_num(ferry_json_path(node, path));
    CHECK(v == v); /* present and a number */
    return v;
}

/* n floats against the float64 tensor at path, |a - b| <= ATOL + RTOL |b|. */
static void expect(const ferry_json *node, const char *path, const float *got, long n) {
    CHECK(ferry_check_json(node, path, got, n, ATOL, RTOL));
}

static void expect_num(const char *what, double got, double want) {
    if (!(fabs(got - want) <= ATOL + RTOL * fabs(want))) {
        fprintf(stderr, "  %s: got %.9g want %.9g\n", what, got, want);
        CHECK(0);
    }
}

static ferry_tensor host_f32(ferry_shape s, float *data) {
    return ferry_tensor_wrap(ferry_backend_cpu(), FERRY_DTYPE_F32, s, data);
}

static const float *dense_grad(ferry_ctx *ctx, ferry_params *P, int idx) {
    ferry_grads *G = ferry_ctx_grads(ctx, P);
    CHECK(G != NULL && G->touched[idx]);
    return G->dense + P->items[idx].offset;
}

static float *dup_floats(const float *src, int64_t n) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    CHECK(p != NULL);
    memcpy(p, src, (size_t)n * sizeof *p);
    return p;
}

/* ---- the cdopt reference cases ---- */

/* One LSTM over a params block loaded from a case (weight_hh_l{k} from w_hh_fmt). */
typedef struct cdopt_net {
    ferry_ctx *ctx;
    ferry_params P;
    ferry_lstm rnn;
} cdopt_net;

static void net_load(cdopt_net *n, const ferry_json *c, int64_t C, int64_t H, int L, float p) {
    char path[96];
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &n->ctx));
    ferry_params_init(&n->P, ferry_backend_cpu());
    CHECK_OK(ferry_lstm_init(&n->rnn, &n->P, "rnn", C, H, L, p));
    CHECK_OK(ferry_params_alloc(&n->P));
    const char *what[4] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
    for (int l = 0; l < L; l++) {
        int idx[4] = {n->rnn.w_ih[l], n->rnn.w_hh[l], n->rnn.b_ih[l], n->rnn.b_hh[l]};
        for (int k = 0; k < 4; k++) {
            (void)snprintf(path, sizeof path, "params.%s_l%d", what[k], l);
            float *v = jf(c, path, (long)n->P.items[idx[k]].numel);
            memcpy(ferry_params_data(&n->P, idx[k]), v, (size_t)n->P.items[idx[k]].numel * 4);
            free(v);
        }
    }
}

static void net_free(cdopt_net *n) {
    ferry_ctx_destroy(n->ctx);
    ferry_params_deinit(&n->P);
}

/* Runs case `name` through the constrained LSTM with the raw weights; a plain LSTM fed
 * A(W) as its weight_hh (same inputs, masks and seed) must agree to float round-off. */
static void run_cdopt(const char *name) {
    const ferry_json *c = lstm_vectors(name);
    int L = (int)jnum(c, "num_layers");
    int64_t C = (int64_t)jnum(c, "input_size"), H = (int64_t)jnum(c, "hidden_size");
    int64_t T = (int64_t)jnum(c, "seq_len"), B = (int64_t)jnum(c, "batch");
    float beta = (float)jnum(c, "beta");
    long TBH = (long)(T * B * H), LBH = (long)(L * B * H), TBC = (long)(T * B * C);
    long n_hh = (long)(4 * H * H);
    ferry_backend *cpu = ferry_backend_cpu();
    char path[96];

    cdopt_net con, plain; /* constrained on raw W; plain on A(W) */
    net_load(&con, c, C, H, L, (float)jnum(c, "dropout"));
    net_load(&plain, c, C, H, L, (float)jnum(c, "dropout"));
    float *raw[FERRY_LSTM_MAX_LAYERS] = {0};
    for (int l = 0; l < L; l++) {
        int i = con.rnn.w_hh[l];
        CHECK_OK(ferry_params_set_constraint(&con.P, i, FERRY_CONSTRAINT_STIEFEL, beta));
        raw[l] = dup_floats(ferry_params_data(&con.P, i), n_hh);
        /* The effective weight: the map on the raw W matches the recorded A(W_hh). */
        CHECK_OK(ferry_stiefel_map(cpu, 4 * H, H, raw[l], ferry_params_data(&plain.P, i), NULL));
        (void)snprintf(path, sizeof path, "A_weight_hh.l%d", l);
        expect(c, path, ferry_params_data(&plain.P, i), n_hh);
    }
    float *x = jf(c, "inputs.x", TBC), *h0 = jf(c, "inputs.h0", LBH);
    float *c0 = jf(c, "inputs.c0", LBH);
    float *masks[FERRY_LSTM_MAX_LAYERS] = {0};
    int has_masks = ferry_json_get(c, "dropout_masks") != NULL;
    for (int l = 0; has_masks && l < L - 1; l++) {
        (void)snprintf(path, sizeof path, "dropout_masks.after_l%d", l);
        masks[l] = jf(c, path, TBH);
    }
    ferry_lstm_opts opts = {(const float *const *)masks};
    ferry_tensor tx = host_f32(ferry_shape_3d(T, B, C), x);
    ferry_tensor th0 = host_f32(ferry_shape_3d(L, B, H), h0);
    ferry_tensor tc0 = host_f32(ferry_shape_3d(L, B, H), c0);
    float *ones = malloc((size_t)TBH * sizeof *ones);
    CHECK(ones != NULL);
    for (long i = 0; i < TBH; i++)
        ones[i] = 1.0f;
    ferry_tensor tones = host_f32(ferry_shape_3d(T, B, H), ones);
    const ferry_tensor *seed = &tones;

    ferry_tensor *y[2], *hn[2], *cn[2];
    cdopt_net *nets[2] = {&con, &plain};
    for (int k = 0; k < 2; k++) {
        ferry_ctx *ctx = nets[k]->ctx;
        CHECK_OK(ferry_ctx_require_grad(ctx, &tx));
        CHECK_OK(ferry_ctx_require_grad(ctx, &th0));
        CHECK_OK(ferry_ctx_require_grad(ctx, &tc0));
        CHECK_OK(ferry_lstm_forward(&nets[k]->rnn, ctx, &tx, &th0, &tc0, has_masks ? &opts : NULL,
                                    &y[k], &hn[k], &cn[k]));
        const ferry_tensor *outs[1] = {y[k]};
        CHECK_OK(ferry_ctx_backward_from(ctx, 1, outs, &seed));
    }
    expect(c, "output", ferry_tensor_f32(y[0]), TBH);
    expect(c, "h_n", ferry_tensor_f32(hn[0]), LBH);
    expect(c, "c_n", ferry_tensor_f32(cn[0]), LBH);
    /* The constrained layer ran with exactly A(W): the plain run agrees to round-off. */
    CHECK_CLOSE_F("y vs plain(A)", ferry_tensor_f32(y[0]), ferry_tensor_f32(y[1]), TBH, 1e-7, 1e-6);
    CHECK_CLOSE_F("cn vs plain(A)", ferry_tensor_f32(cn[0]), ferry_tensor_f32(cn[1]), LBH, 1e-7,
                  1e-6);

    /* Penalty and loss, on the raw weights, which forward and backward left unchanged. */
    double pen = 0.0, sum_y = 0.0;
    for (int l = 0; l < L; l++) {
        const float *W = ferry_params_data(&con.P, con.rnn.w_hh[l]);
        CHECK(memcmp(W, raw[l], (size_t)n_hh * sizeof *W) == 0);
        double p = 0.0, sq = 0.0;
        CHECK_OK(ferry_stiefel_penalty(cpu, 4 * H, H, W, beta, &p, &sq, NULL));
        (void)snprintf(path, sizeof path, "sqnorm_C.l%d", l);
        expect_num(path, sq, jnum(c, path));
        pen += p;
    }
    for (long i = 0; i < TBH; i++)
        sum_y += (double)ferry_tensor_f32(y[0])[i];
    expect_num("penalty", pen, jnum(c, "penalty"));
    expect_num("loss", sum_y + pen, jnum(c, "loss"));

    /* Before the penalty pass: dW = map backward of dL/dA, both of the recorded dA and of
     * the plain LSTM's dW_hh (which is dL/dA there). */
    float *want = malloc((size_t)n_hh * sizeof *want);
    CHECK(want != NULL);
    for (int l = 0; l < L; l++) {
        int i = con.rnn.w_hh[l];
        const float *dW = dense_grad(con.ctx, &con.P, i);
        (void)snprintf(path, sizeof path, "grad_A_weight_hh.l%d", l);
        expect(c, path, dense_grad(plain.ctx, &plain.P, i), n_hh);
        float *gA = jf(c, path, n_hh);
        CHECK_OK(ferry_stiefel_map_backward(cpu, 4 * H, H, raw[l], gA, want, NULL));
        CHECK_CLOSE_F("dW vs map backward(recorded dA)", dW, want, n_hh, ATOL, RTOL);
        CHECK_OK(ferry_stiefel_map_backward(cpu, 4 * H, H, raw[l],
                                            dense_grad(plain.ctx, &plain.P, i), want, NULL));
        CHECK_CLOSE_F("dW vs map backward(plain dA)", dW, want, n_hh, 1e-7, 1e-6);
        free(gA);
    }
    free(want);

    /* The owner's step adds 4 beta W C once; then every gradient of the loss matches. */
    double pen2 = 0.0, drift = 0.0, sq_total = 0.0;
    CHECK_OK(
        ferry_stiefel_add_penalty_grads(&con.P, ferry_ctx_grads(con.ctx, &con.P), &pen2, &drift));
    expect_num("penalty pass", pen2, jnum(c, "penalty"));
    for (int l = 0; l < L; l++) {
        (void)snprintf(path, sizeof path, "sqnorm_C.l%d", l);
        sq_total += jnum(c, path);
    }
    expect_num("drift", drift, sqrt(sq_total));
    const char *what[4] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
    for (int l = 0; l < L; l++) {
        int idx[4] = {con.rnn.w_ih[l], con.rnn.w_hh[l], con.rnn.b_ih[l], con.rnn.b_hh[l]};
        for (int k = 0; k < 4; k++) {
            (void)snprintf(path, sizeof path, "grads.%s_l%d", what[k], l);
            expect(c, path, dense_grad(con.ctx, &con.P, idx[k]), (long)con.P.items[idx[k]].numel);
        }
    }
    expect(c, "grad_inputs.x", ferry_tensor_f32(ferry_ctx_grad_of(con.ctx, &tx)), TBC);
    expect(c, "grad_inputs.h0", ferry_tensor_f32(ferry_ctx_grad_of(con.ctx, &th0)), LBH);
    expect(c, "grad_inputs.c0", ferry_tensor_f32(ferry_ctx_grad_of(con.ctx, &tc0)), LBH);

    /* Eval mode uses A(W) too (cdopt maps on every forward); without dropout the
     * output is the recorded one. */
    if (!has_masks) {
        ferry_ctx_reset(con.ctx, 2);
        ferry_ctx_set_training(con.ctx, 0);
        CHECK_OK(
            ferry_lstm_forward(&con.rnn, con.ctx, &tx, &th0, &tc0, NULL, &y[0], &hn[0], &cn[0]));
        CHECK_EQ(ferry_ctx_tape_length(con.ctx), 0);
        expect(c, "output", ferry_tensor_f32(y[0]), TBH);
        expect(c, "c_n", ferry_tensor_f32(cn[0]), LBH);
    }
    free(x), free(h0), free(c0), free(ones);
    for (int l = 0; l < FERRY_LSTM_MAX_LAYERS; l++)
        free(masks[l]), free(raw[l]);
    net_free(&con);
    net_free(&plain);
}

TEST(cdopt_lstm_1layer) {
    run_cdopt("lstm_1layer");
}

TEST(cdopt_lstm_2layer) {
    run_cdopt("lstm_2layer");
}

TEST(cdopt_lstm_2layer_dropout) {
    run_cdopt("lstm_2layer_dropout");
}

/* ---- finite differences of the whole constrained LSTM plus the penalty ---- */

typedef struct fd_case {
    ferry_ctx *ctx;
    ferry_params P;
    ferry_lstm rnn;
    int64_t T, B, C, H;
    int L;
    float *x, *h0, *c0, *R, *Rh, *Rc;
    float *masks[FERRY_LSTM_MAX_LAYERS];
    ferry_tensor tx, th0, tc0;
} fd_case;

static float *rand_floats(int64_t n, float lo, float hi, uint64_t seed) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    CHECK(p != NULL);
    ferry_gradcheck_fill(p, n, lo, hi, seed);
    return p;
}

/* Uniform(-scale, scale) parameters. Layers whose bit is set in `constrained` get a
 * Stiefel W_hh with penalty weight beta; with drift > 0 it starts from its polar factor
 * plus U(-drift, drift) noise (a trained weight off the manifold), else it stays a raw
 * uniform matrix (far off). Fixed dropout masks (p = 0.4) between layers. */
static void fd_init(fd_case *c, int64_t T, int64_t B, int64_t C, int64_t H, int L, float scale,
                    unsigned constrained, float beta, float drift, uint64_t seed) {
    memset(c, 0, sizeof *c);
    c->T = T, c->B = B, c->C = C, c->H = H, c->L = L;
    ferry_backend *cpu = ferry_backend_cpu();
    CHECK_OK(ferry_ctx_create(cpu, &c->ctx));
    ferry_params_init(&c->P, cpu);
    CHECK_OK(ferry_lstm_init(&c->rnn, &c->P, "rnn", C, H, L, 0.4f));
    CHECK_OK(ferry_params_alloc(&c->P));
    for (int i = 0; i < c->P.count; i++)
        CHECK_OK(ferry_params_init_uniform(&c->P, i, scale, seed));
    for (int l = 0; l < L; l++) {
        if (!(constrained & (1u << l)))
            continue;
        int i = c->rnn.w_hh[l];
        float *W = ferry_params_data(&c->P, i);
        if (drift > 0.0f) {
            float *noise = rand_floats(4 * H * H, -drift, drift, seed + 50 + (uint64_t)l);
            CHECK_OK(ferry_stiefel_polar(4 * H, H, W));
            for (int64_t k = 0; k < 4 * H * H; k++)
                W[k] += noise[k];
            free(noise);
        }
        CHECK_OK(ferry_params_set_constraint(&c->P, i, FERRY_CONSTRAINT_STIEFEL, beta));
    }
    c->x = rand_floats(T * B * C, -1.0f, 1.0f, seed + 1);
    c->h0 = rand_floats(L * B * H, -0.8f, 0.8f, seed + 2);
    c->c0 = rand_floats(L * B * H, -0.8f, 0.8f, seed + 3);
    c->R = rand_floats(T * B * H, -1.0f, 1.0f, seed + 4);
    c->Rh = rand_floats(L * B * H, -1.0f, 1.0f, seed + 5);
    c->Rc = rand_floats(L * B * H, -1.0f, 1.0f, seed + 6);
    for (int l = 0; l < L - 1; l++) {
        c->masks[l] = rand_floats(T * B * H, 0.0f, 1.0f, seed + 10 + (uint64_t)l);
        for (int64_t i = 0; i < T * B * H; i++)
            c->masks[l][i] = c->masks[l][i] < 0.4f ? 0.0f : 1.0f / 0.6f;
    }
    c->tx = host_f32(ferry_shape_3d(T, B, C), c->x);
    c->th0 = host_f32(ferry_shape_3d(L, B, H), c->h0);
    c->tc0 = host_f32(ferry_shape_3d(L, B, H), c->c0);
}

static void fd_free(fd_case *c) {
    free(c->x), free(c->h0), free(c->c0), free(c->R), free(c->Rh), free(c->Rc);
    for (int l = 0; l < FERRY_LSTM_MAX_LAYERS; l++)
        free(c->masks[l]);
    ferry_ctx_destroy(c->ctx);
    ferry_params_deinit(&c->P);
}

static void fd_forward(fd_case *c, ferry_tensor **y, ferry_tensor **hn, ferry_tensor **cn) {
    ferry_lstm_opts opts = {(const float *const *)c->masks};
    CHECK_OK(ferry_lstm_forward(&c->rnn, c->ctx, &c->tx, &c->th0, &c->tc0, &opts, y, hn, cn));
}

/* sum_k beta_k ||W_k^T W_k - I||^2 over the constrained W_hh. */
static double fd_penalty(fd_case *c) {
    double total = 0.0;
    for (int l = 0; l < c->L; l++) {
        const ferry_param *p = &c->P.items[c->rnn.w_hh[l]];
        double pen = 0.0;
        if (p->constraint != FERRY_CONSTRAINT_STIEFEL)
            continue;
        CHECK_OK(ferry_stiefel_penalty(ferry_backend_cpu(), 4 * c->H, c->H,
                                       ferry_params_data(&c->P, c->rnn.w_hh[l]), p->beta, &pen,
                                       NULL, NULL));
        total += pen;
    }
    return total;
}

/* sum(y R) + sum(hn Rh) + sum(cn Rc) + penalty. */
static double fd_loss(void *u) {
    fd_case *c = u;
    ferry_tensor *y, *hn, *cn;
    int64_t LBH = c->L * c->B * c->H;
    ferry_ctx_reset(c->ctx, 0);
    fd_forward(c, &y, &hn, &cn);
    return ferry_gradcheck_dot(ferry_tensor_f32(y), c->R, c->T * c->B * c->H) +
           ferry_gradcheck_dot(ferry_tensor_f32(hn), c->Rh, LBH) +
           ferry_gradcheck_dot(ferry_tensor_f32(cn), c->Rc, LBH) + fd_penalty(c);
}

/* Backward from the three seeds, the owner's penalty pass, then FD on every raw
 * parameter and on x, h0, c0. */
static void fd_check(fd_case *c, const char *tag) {
    int64_t LBH = c->L * c->B * c->H;
    ferry_tensor *y, *hn, *cn;
    ferry_ctx_reset(c->ctx, 1);
    CHECK_OK(ferry_ctx_require_grad(c->ctx, &c->tx));
    CHECK_OK(ferry_ctx_require_grad(c->ctx, &c->th0));
    CHECK_OK(ferry_ctx_require_grad(c->ctx, &c->tc0));
    fd_forward(c, &y, &hn, &cn);
    ferry_tensor R = host_f32(y->shape, c->R), Rh = host_f32(hn->shape, c->Rh);
    ferry_tensor Rc = host_f32(cn->shape, c->Rc);
    const ferry_tensor *outs[3] = {y, hn, cn}, *seeds[3] = {&R, &Rh, &Rc};
    CHECK_OK(ferry_ctx_backward_from(c->ctx, 3, outs, seeds));
    ferry_grads *G = ferry_ctx_grads(c->ctx, &c->P);
    double pen = 0.0;
    CHECK_OK(ferry_stiefel_add_penalty_grads(&c->P, G, &pen, NULL));
    CHECK(pen > 0.0);
    CHECK_NEAR(pen, fd_penalty(c), 1e-9 * (1.0 + pen));

    float **dp = calloc((size_t)c->P.count, sizeof *dp);
    CHECK(dp != NULL);
    for (int i = 0; i < c->P.count; i++)
        dp[i] = dup_floats(dense_grad(c->ctx, &c->P, i), c->P.items[i].numel);
    float *dx = dup_floats(ferry_tensor_f32(ferry_ctx_grad_of(c->ctx, &c->tx)), c->T * c->B * c->C);
    float *dh0 = dup_floats(ferry_tensor_f32(ferry_ctx_grad_of(c->ctx, &c->th0)), LBH);
    float *dc0 = dup_floats(ferry_tensor_f32(ferry_ctx_grad_of(c->ctx, &c->tc0)), LBH);
    ferry_gradcheck_opts o = {1e-2, 1e-6, 2e-3, 2e-3, 0};
    char what[96];
    for (int i = 0; i < c->P.count; i++) {
        (void)snprintf(what, sizeof what, "%s %s", tag, c->P.items[i].name);
        CHECK(ferry_gradcheck(what, fd_loss, c, ferry_params_data(&c->P, i), c->P.items[i].numel,
                              dp[i], &o));
        free(dp[i]);
    }
    free(dp);
    (void)snprintf(what, sizeof what, "%s x", tag);
    CHECK(ferry_gradcheck(what, fd_loss, c, c->x, c->T * c->B * c->C, dx, &o));
    (void)snprintf(what, sizeof what, "%s h0", tag);
    CHECK(ferry_gradcheck(what, fd_loss, c, c->h0, LBH, dh0, &o));
    (void)snprintf(what, sizeof what, "%s c0", tag);
    CHECK(ferry_gradcheck(what, fd_loss, c, c->c0, LBH, dc0, &o));
    free(dx), free(dh0), free(dc0);
}

/* Three constrained layers near the manifold (polar factor plus drift), T = 5. */
TEST(gradcheck_3_layers_near_manifold) {
    fd_case c;
    fd_init(&c, 5, 3, 4, 5, 3, 0.6f, 0x7u, 0.1f, 0.15f, 901);
    fd_check(&c, "near");
    fd_free(&c);
}

/* Far off the manifold (raw uniform weights, W^T W about 1.3 I), a larger beta, and
 * a constrained layer next to an unconstrained one. */
TEST(gradcheck_far_off_mixed_layers) {
    fd_case c;
    fd_init(&c, 4, 2, 3, 4, 2, 0.5f, 0x1u, 0.3f, 0.0f, 902);
    fd_check(&c, "far");
    fd_free(&c);
}

/* ---- polar initialisation ---- */

/* cdopt's init: uniform W_hh, then its polar factor. There A(W) = W, the penalty
 * vanishes, and the constrained LSTM computes what the plain one does. */
TEST(polar_init_is_a_fixed_point) {
    fd_case c;
    int64_t H = 8, n = 4 * H * H;
    ferry_backend *cpu = ferry_backend_cpu();
    fd_init(&c, 4, 3, 5, H, 2, 1.0f / sqrtf((float)H), 0x0u, 0.0f, 0.0f, 903);
    float *A = malloc((size_t)n * sizeof *A);
    CHECK(A != NULL);
    for (int l = 0; l < c.L; l++) {
        int i = c.rnn.w_hh[l];
        float *W = ferry_params_data(&c.P, i);
        double before = 0.0, after = 0.0, pen = 0.0;
        CHECK_OK(ferry_stiefel_feasibility(cpu, 4 * H, H, W, &before, NULL));
        CHECK(before > 0.1); /* a uniform matrix is far from orthonormal columns */
        CHECK_OK(ferry_stiefel_polar(4 * H, H, W));
        CHECK_OK(ferry_params_set_constraint(&c.P, i, FERRY_CONSTRAINT_STIEFEL, 0.1f));
        CHECK_OK(ferry_stiefel_map(cpu, 4 * H, H, W, A, NULL));
        CHECK_CLOSE_F("A(polar W) vs W", A, W, (long)n, 1e-6, 0.0);
        CHECK_OK(ferry_stiefel_feasibility(cpu, 4 * H, H, W, &after, NULL));
        CHECK_OK(ferry_stiefel_penalty(cpu, 4 * H, H, W, 0.1f, &pen, NULL, NULL));
        CHECK(after < 1e-5);
        CHECK(pen < 1e-11);
    }
    int64_t TBH = c.T * c.B * c.H, LBH = c.L * c.B * c.H;
    ferry_tensor *y, *hn, *cn;
    ferry_ctx_reset(c.ctx, 1);
    fd_forward(&c, &y, &hn, &cn);
    float *y_con = dup_floats(ferry_tensor_f32(y), TBH);
    float *cn_con = dup_floats(ferry_tensor_f32(cn), LBH);
    for (int l = 0; l < c.L; l++)
        CHECK_OK(ferry_params_set_constraint(&c.P, c.rnn.w_hh[l], FERRY_CONSTRAINT_NONE, 0.0f));
    ferry_ctx_reset(c.ctx, 2);
    fd_forward(&c, &y, &hn, &cn);
    CHECK_CLOSE_F("y constrained vs plain", y_con, ferry_tensor_f32(y), (long)TBH, 1e-6, 0.0);
    CHECK_CLOSE_F("cn constrained vs plain", cn_con, ferry_tensor_f32(cn), (long)LBH, 1e-6, 0.0);
    free(A), free(y_con), free(cn_con);
    fd_free(&c);
}

/* ---- memory ---- */

/* One training step: reset, forward, backward, the owner's penalty pass. */
static void memory_step(fd_case *c, uint64_t id) {
    ferry_tensor *y, *hn, *cn;
    ferry_ctx_reset(c->ctx, id);
    fd_forward(c, &y, &hn, &cn);
    ferry_tensor R = host_f32(y->shape, c->R);
    const ferry_tensor *outs[1] = {y}, *seeds[1] = {&R};
    CHECK_OK(ferry_ctx_backward_from(c->ctx, 1, outs, seeds));
    CHECK_OK(ferry_stiefel_add_penalty_grads(&c->P, ferry_ctx_grads(c->ctx, &c->P), NULL, NULL));
}

/* A(W), dL/dA and the map's scratch live in the context arena: after a warm-up the
 * arena holds its high-water mark and a step takes no heap memory, so the heap in use
 * is the same after 5 and after 40 steps (a per-step malloc that is never freed would
 * grow it). Under FERRY_SANITIZE the arena makes one exact-size block per allocation,
 * so ASan checks every buffer's bounds and LeakSanitizer any leak at exit; glibc's
 * counters do not see ASan's heap there. */
TEST(constrained_steps_use_the_arena) {
    fd_case c;
    fd_init(&c, 6, 4, 5, 16, 2, 0.25f, 0x3u, 0.1f, 0.05f, 904);
    size_t in_use = 0;
    for (int step = 1; step <= 40; step++) {
        memory_step(&c, (uint64_t)step);
        if (step == 5)
            in_use = mallinfo2().uordblks;
    }
#ifndef FERRY_SANITIZE
    CHECK_EQ(mallinfo2().uordblks, in_use);
#else
    (void)in_use;
#endif
    /* The raw weights are still the ones set at init: forward never wrote A(W) back. */
    fd_case ref;
    fd_init(&ref, 6, 4, 5, 16, 2, 0.25f, 0x3u, 0.1f, 0.05f, 904);
    CHECK(memcmp(c.P.data, ref.P.data, (size_t)c.P.numel * sizeof(float)) == 0);
    fd_free(&ref);
    fd_free(&c);
}

/* A constraint kind the LSTM does not know is refused, naming the parameter. */
TEST(unknown_constraint_kind_is_refused) {
    fd_case c;
    fd_init(&c, 2, 2, 3, 4, 2, 0.5f, 0x0u, 0.0f, 0.0f, 905);
    c.P.items[c.rnn.w_hh[1]].constraint = (ferry_constraint_kind)7;
    ferry_tensor *y, *hn, *cn;
    ferry_ctx_reset(c.ctx, 1);
    CHECK_STATUS(ferry_lstm_forward(&c.rnn, c.ctx, &c.tx, NULL, NULL, NULL, &y, &hn, &cn),
                 FERRY_ERR_UNSUPPORTED);
    CHECK(strstr(ferry_error_last(), "rnn.weight_hh_l1") != NULL);
    fd_free(&c);
}

FERRY_TEST_MAIN(T(cdopt_lstm_1layer) T(cdopt_lstm_2layer) T(cdopt_lstm_2layer_dropout)
                    T(gradcheck_3_layers_near_manifold) T(gradcheck_far_off_mixed_layers)
                        T(polar_init_is_a_fixed_point) T(constrained_steps_use_the_arena)
                            T(unknown_constraint_kind_is_refused))
