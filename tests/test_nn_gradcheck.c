/* test_nn_gradcheck.c - finite-difference checks of every layer's backward except
 * the LSTM's (test_nn_lstm.c): linear, embedding (row-sparse, repeated ids),
 * softmax cross-entropy, dropout with a fixed and a drawn mask, and a whole
 * embedding -> dropout -> LSTM -> linear -> xent chain through the tape. First of
 * all, the checker itself must catch a slightly wrong gradient. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gradcheck.h" /* ferry_gradcheck, ferry_gradcheck_fill, ferry_gradcheck_dot */
#include "ferry/nn.h"

/* Tolerances for float32 layers with the loss summed in double: the FD noise is
 * about 1e-6 and the truncation error about 1e-5 at eps = 1e-2. */
static ferry_gradcheck_opts tight(void) {
    ferry_gradcheck_opts o = {1e-2, 1e-6, 2e-3, 2e-3, 0};
    return o;
}

static void init_all_params(ferry_params *P, float scale, uint64_t seed) {
    CHECK_OK(ferry_params_alloc(P));
    for (int i = 0; i < P->count; i++)
        CHECK_OK(ferry_params_init_uniform(P, i, scale, seed));
}

/* A host float tensor wrapping caller storage. */
static ferry_tensor host_f32(ferry_shape s, float *data) {
    return ferry_tensor_wrap(ferry_backend_cpu(), FERRY_DTYPE_F32, s, data);
}

static ferry_tensor host_i32(ferry_shape s, int32_t *data) {
    return ferry_tensor_wrap(ferry_backend_cpu(), FERRY_DTYPE_I32, s, data);
}

/* Copies the dense gradient of parameter idx (zeros if untouched). */
static float *dense_grad(ferry_ctx *ctx, ferry_params *P, int idx) {
    int64_t n = P->items[idx].numel;
    float *out = calloc((size_t)n, sizeof *out);
    CHECK(out != NULL);
    ferry_grads *G = ferry_ctx_grads(ctx, P);
    CHECK(G != NULL);
    if (P->items[idx].flags & FERRY_PARAM_ROW_SPARSE) {
        ferry_rowgrad *rg = ferry_grads_rows(G, idx);
        for (int64_t s = 0; G->touched[idx] && s < rg->count; s++)
            for (int64_t d = 0; d < rg->D; d++)
                out[rg->rows[s] * rg->D + d] += rg->values[s * rg->D + d];
    } else if (G->touched[idx]) {
        memcpy(out, G->dense + P->items[idx].offset, (size_t)n * sizeof *out);
    }
    return out;
}

static float *copy_of(const ferry_tensor *t) {
    CHECK(t != NULL);
    float *out = malloc(ferry_tensor_nbytes(t));
    CHECK(out != NULL);
    CHECK_OK(ferry_tensor_to_host(t, out));
    return out;
}

/* ---- linear ---- */

typedef struct linear_case {
    ferry_ctx *ctx;
    ferry_params P;
    ferry_linear lin;
    ferry_tensor x;
    float xd[2 * 3 * 5], R[2 * 3 * 4];
} linear_case;

static double linear_loss(void *u) {
    linear_case *c = u;
    ferry_tensor *y;
    ferry_ctx_reset(c->ctx, 0);
    CHECK_OK(ferry_linear_forward(&c->lin, c->ctx, &c->x, &y));
    return ferry_gradcheck_dot(ferry_tensor_f32(y), c->R, 24);
}

static void run_linear(int bias) {
    linear_case c;
    ferry_gradcheck_opts o = tight();
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &c.ctx));
    ferry_params_init(&c.P, ferry_backend_cpu());
    CHECK_OK(ferry_linear_init(&c.lin, &c.P, "lin", 5, 4, bias));
    init_all_params(&c.P, 0.5f, 11);
    ferry_gradcheck_fill(c.xd, 30, -1.0f, 1.0f, 12);
    ferry_gradcheck_fill(c.R, 24, -1.0f, 1.0f, 13);
    c.x = host_f32(ferry_shape_3d(2, 3, 5), c.xd);

    ferry_tensor *y, R = host_f32(ferry_shape_3d(2, 3, 4), c.R);
    const ferry_tensor *seed = &R;
    ferry_ctx_reset(c.ctx, 1);
    CHECK_OK(ferry_ctx_require_grad(c.ctx, &c.x));
    CHECK_OK(ferry_linear_forward(&c.lin, c.ctx, &c.x, &y));
    CHECK_EQ(ferry_ctx_tape_length(c.ctx), 1);
    const ferry_tensor *outs[1] = {y};
    CHECK_OK(ferry_ctx_backward_from(c.ctx, 1, outs, &seed));
    float *dW = dense_grad(c.ctx, &c.P, c.lin.weight);
    float *db = bias ? dense_grad(c.ctx, &c.P, c.lin.bias) : NULL;
    float *dx = copy_of(ferry_ctx_grad_of(c.ctx, &c.x));

    CHECK(ferry_gradcheck("linear dW", linear_loss, &c, ferry_params_data(&c.P, c.lin.weight), 20,
                          dW, &o));
    if (bias)
        CHECK(ferry_gradcheck("linear db", linear_loss, &c, ferry_params_data(&c.P, c.lin.bias), 4,
                              db, &o));
    CHECK(ferry_gradcheck("linear dx", linear_loss, &c, c.xd, 30, dx, &o));
    free(dW);
    free(db);
    free(dx);
    ferry_ctx_destroy(c.ctx);
    ferry_params_deinit(&c.P);
}

TEST(linear) {
    run_linear(1);
}

TEST(linear_no_bias) {
    run_linear(0);
}

/* The checker must reject a gradient that is off by 5% in one element, or
 * whose sign is flipped, and accept the true one. */
TEST(gradcheck_catches_wrong_gradient) {
    linear_case c;
    ferry_gradcheck_opts o = tight();
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &c.ctx));
    ferry_params_init(&c.P, ferry_backend_cpu());
    CHECK_OK(ferry_linear_init(&c.lin, &c.P, "lin", 5, 4, 1));
    init_all_params(&c.P, 0.5f, 11);
    ferry_gradcheck_fill(c.xd, 30, -1.0f, 1.0f, 12);
    ferry_gradcheck_fill(c.R, 24, -1.0f, 1.0f, 13);
    c.x = host_f32(ferry_shape_3d(2, 3, 5), c.xd);
    /* dW = sum over rows of R^T x, computed directly. */
    float dW[20] = {0};
    for (int n = 0; n < 6; n++)
        for (int d = 0; d < 4; d++)
            for (int k = 0; k < 5; k++)
                dW[d * 5 + k] += c.R[n * 4 + d] * c.xd[n * 5 + k];
    float *W = ferry_params_data(&c.P, c.lin.weight);
    CHECK(ferry_gradcheck("true dW", linear_loss, &c, W, 20, dW, &o));
    int big = 0;
    for (int i = 1; i < 20; i++)
        big = fabsf(dW[i]) > fabsf(dW[big]) ? i : big;
    dW[big] *= 1.05f;
    fprintf(stderr, "  (the next check must fail)\n");
    CHECK(!ferry_gradcheck("dW off by 5%", linear_loss, &c, W, 20, dW, &o));
    dW[big] = -dW[big] / 1.05f;
    fprintf(stderr, "  (the next check must fail)\n");
    CHECK(!ferry_gradcheck("dW sign flipped", linear_loss, &c, W, 20, dW, &o));
    ferry_ctx_destroy(c.ctx);
    ferry_params_deinit(&c.P);
}

/* ---- embedding ---- */

typedef struct emb_case {
    ferry_ctx *ctx;
    ferry_params P;
    ferry_embedding emb;
    ferry_tensor ids;
    int32_t idd[8];
    float R[8 * 3];
} emb_case;

static double emb_loss(void *u) {
    emb_case *c = u;
    ferry_tensor *y;
    ferry_ctx_reset(c->ctx, 0);
    CHECK_OK(ferry_embedding_forward(&c->emb, c->ctx, &c->ids, &y));
    return ferry_gradcheck_dot(ferry_tensor_f32(y), c->R, 24);
}

TEST(embedding_sparse_repeated_ids) {
    emb_case c;
    const int32_t ids[8] = {3, 7, 3, 0, 9, 7, 3, 1}; /* 3 three times, 7 twice */
    memcpy(c.idd, ids, sizeof ids);
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &c.ctx));
    ferry_params_init(&c.P, ferry_backend_cpu());
    CHECK_OK(ferry_embedding_init(&c.emb, &c.P, "emb", 10, 3));
    init_all_params(&c.P, 1.0f, 21);
    c.ids = host_i32(ferry_shape_2d(4, 2), c.idd);
    ferry_gradcheck_fill(c.R, 24, -1.0f, 1.0f, 22);

    ferry_tensor *y, R = host_f32(ferry_shape_3d(4, 2, 3), c.R);
    const ferry_tensor *seed = &R;
    ferry_ctx_reset(c.ctx, 1);
    CHECK_OK(ferry_embedding_forward(&c.emb, c.ctx, &c.ids, &y));
    CHECK_EQ(y->shape.ndim, 3);
    CHECK_EQ(y->shape.dim[2], 3);
    const float *W = ferry_params_data(&c.P, c.emb.weight);
    for (int n = 0; n < 8; n++) /* the forward is an exact row copy */
        CHECK(memcmp(ferry_tensor_f32(y) + n * 3, W + ids[n] * 3, 12) == 0);
    const ferry_tensor *outs[1] = {y};
    CHECK_OK(ferry_ctx_backward_from(c.ctx, 1, outs, &seed));
    ferry_rowgrad *rg = ferry_grads_rows(ferry_ctx_grads(c.ctx, &c.P), c.emb.weight);
    CHECK_EQ(rg->count, 5); /* distinct rows 3, 7, 0, 9, 1 */
    float *dW = dense_grad(c.ctx, &c.P, c.emb.weight);
    ferry_gradcheck_opts o = tight();
    CHECK(ferry_gradcheck("embedding dW", emb_loss, &c, ferry_params_data(&c.P, c.emb.weight), 30,
                          dW, &o));
    free(dW);
    ferry_ctx_destroy(c.ctx);
    ferry_params_deinit(&c.P);
}

/* ---- softmax cross-entropy ---- */

typedef struct xent_case {
    ferry_ctx *ctx;
    float z[6 * 7]; /* the logits the loss sees; each evaluation copies them */
    int32_t tg[6];
    float scale;
} xent_case;

/* The loss overwrites its logits, so each evaluation works on a fresh copy. */
static double xent_eval(xent_case *c, ferry_tensor **logits, ferry_tensor **loss) {
    double sum;
    ferry_tensor t = host_i32(ferry_shape_2d(2, 3), c->tg);
    CHECK_OK(ferry_ctx_tensor(c->ctx, FERRY_DTYPE_F32, ferry_shape_3d(2, 3, 7), logits));
    memcpy(ferry_tensor_f32(*logits), c->z, sizeof c->z);
    CHECK_OK(ferry_xent_forward(c->ctx, *logits, &t, c->scale, loss, &sum));
    CHECK_NEAR(*ferry_tensor_f32(*loss), (double)c->scale * sum, 1e-6 * fabs(sum) + 1e-30);
    return (double)c->scale * sum;
}

static double xent_loss(void *u) {
    ferry_tensor *logits, *loss;
    ferry_ctx_reset(((xent_case *)u)->ctx, 0);
    return xent_eval(u, &logits, &loss);
}

static void run_xent(float scale) {
    xent_case c = {.scale = scale};
    const int32_t tg[6] = {1, 0, 6, 2, 6, 3};
    memcpy(c.tg, tg, sizeof tg);
    ferry_gradcheck_fill(c.z, 42, -3.0f, 3.0f, 31);
    for (int v = 0; v < 7; v++)
        c.z[3 * 7 + v] += 50.0f; /* a shifted row: the max subtraction must hold */
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &c.ctx));
    ferry_tensor *logits, *loss;
    ferry_ctx_reset(c.ctx, 1);
    xent_eval(&c, &logits, &loss);
    CHECK_OK(ferry_ctx_require_grad(c.ctx, logits));
    CHECK_OK(ferry_ctx_backward(c.ctx, loss));
    float *dz = copy_of(ferry_ctx_grad_of(c.ctx, logits));
    for (int n = 0; n < 6; n++) { /* each row of (p - onehot) sums to zero */
        double s = 0.0;
        for (int v = 0; v < 7; v++)
            s += (double)dz[n * 7 + v];
        CHECK_NEAR(s, 0.0, 1e-6);
    }
    ferry_gradcheck_opts o = tight();
    CHECK(ferry_gradcheck("xent dlogits", xent_loss, &c, c.z, 42, dz, &o));
    /* An upstream gradient g other than 1 scales the whole gradient. */
    float g = -1.75f;
    ferry_tensor tgs = host_f32(ferry_shape_1d(1), &g);
    const ferry_tensor *seed = &tgs;
    ferry_ctx_reset(c.ctx, 2);
    xent_eval(&c, &logits, &loss);
    CHECK_OK(ferry_ctx_require_grad(c.ctx, logits));
    const ferry_tensor *outs[1] = {loss};
    CHECK_OK(ferry_ctx_backward_from(c.ctx, 1, outs, &seed));
    const float *dzg = ferry_tensor_f32(ferry_ctx_grad_of(c.ctx, logits));
    for (int i = 0; i < 42; i++)
        CHECK_NEAR(dzg[i], (double)g * (double)dz[i], 1e-6 * fabs((double)dz[i]) + 1e-9);
    free(dz);
    ferry_ctx_destroy(c.ctx);
}

TEST(xent_sum) {
    run_xent(1.0f);
}

TEST(xent_mean) {
    run_xent(1.0f / 6.0f);
}

/* ---- dropout ---- */

typedef struct dropout_case {
    ferry_ctx *ctx;
    float xd[24], mask[24], R[24];
    float p; /* > 0: drawn mask with this rate; 0: the fixed mask */
} dropout_case;

static ferry_tensor *dropout_eval(dropout_case *c, ferry_tensor *x) {
    ferry_tensor *y;
    if (c->p > 0.0f)
        CHECK_OK(ferry_dropout_forward(c->ctx, c->p, x, &y));
    else
        CHECK_OK(ferry_dropout_forward_mask(c->ctx, x, c->mask, &y));
    return y;
}

static double dropout_loss(void *u) {
    dropout_case *c = u;
    ferry_tensor x = host_f32(ferry_shape_2d(4, 6), c->xd);
    ferry_ctx_reset(c->ctx, 0); /* the drawn mask restarts at the same offset */
    return ferry_gradcheck_dot(ferry_tensor_f32(dropout_eval(c, &x)), c->R, 24);
}

static void run_dropout(float p) {
    dropout_case c = {.p = p};
    ferry_gradcheck_fill(c.xd, 24, -1.0f, 1.0f, 41);
    ferry_gradcheck_fill(c.R, 24, -1.0f, 1.0f, 42);
    for (int i = 0; i < 24; i++)
        c.mask[i] = (i % 3 == 1) ? 0.0f : 1.5f;
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &c.ctx));
    ferry_ctx_set_seed(c.ctx, 7);
    ferry_tensor x = host_f32(ferry_shape_2d(4, 6), c.xd), R = host_f32(ferry_shape_2d(4, 6), c.R);
    const ferry_tensor *seed = &R;
    ferry_ctx_reset(c.ctx, 1);
    CHECK_OK(ferry_ctx_require_grad(c.ctx, &x));
    ferry_tensor *y = dropout_eval(&c, &x);
    int zeros = 0;
    for (int i = 0; i < 24; i++) {
        float yi = ferry_tensor_f32(y)[i];
        zeros += yi == 0.0f;
        CHECK(yi == 0.0f || fabsf(yi - c.xd[i] / (1.0f - (p > 0.0f ? p : 1.0f / 3.0f))) < 1e-6f);
    }
    CHECK(zeros > 0 && zeros < 24);
    const ferry_tensor *outs[1] = {y};
    CHECK_OK(ferry_ctx_backward_from(c.ctx, 1, outs, &seed));
    float *dx = copy_of(ferry_ctx_grad_of(c.ctx, &x));
    ferry_gradcheck_opts o = tight();
    CHECK(ferry_gradcheck(p > 0.0f ? "dropout dx (drawn)" : "dropout dx (fixed)", dropout_loss, &c,
                          c.xd, 24, dx, &o));
    free(dx);
    ferry_ctx_destroy(c.ctx);
}

TEST(dropout_fixed_mask) {
    run_dropout(0.0f);
}

TEST(dropout_drawn_mask) {
    run_dropout(0.4f);
}

/* Eval mode: identity without a copy or a node; p = 0 the same in training. */
TEST(dropout_identity) {
    ferry_ctx *ctx;
    float xd[6] = {1, 2, 3, 4, 5, 6};
    ferry_tensor x = host_f32(ferry_shape_1d(6), xd), *y;
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &ctx));
    CHECK_OK(ferry_dropout_forward(ctx, 0.0f, &x, &y));
    CHECK(y == &x);
    ferry_ctx_set_training(ctx, 0);
    CHECK_OK(ferry_dropout_forward(ctx, 0.5f, &x, &y));
    CHECK(y == &x);
    CHECK_EQ(ferry_ctx_tape_length(ctx), 0);
    ferry_ctx_destroy(ctx);
}

/* ---- the whole model through the tape ---- */

typedef struct chain_case {
    ferry_ctx *ctx;
    ferry_params P;
    ferry_embedding emb;
    ferry_lstm rnn;
    ferry_linear dec;
    int32_t in[12], tg[12]; /* (T=4, B=3) */
    float h0[2 * 3 * 5], c0[2 * 3 * 5];
} chain_case;

/* embedding -> dropout -> LSTM (inter-layer dropout) -> dropout -> linear -> xent,
 * every mask drawn from the context (the same after each reset). */
static ferry_tensor *chain_forward(chain_case *c, double *value) {
    ferry_tensor ids = host_i32(ferry_shape_2d(4, 3), c->in),
                 tg = host_i32(ferry_shape_2d(4, 3), c->tg);
    ferry_tensor h0 = host_f32(ferry_shape_3d(2, 3, 5), c->h0);
    ferry_tensor c0 = host_f32(ferry_shape_3d(2, 3, 5), c->c0);
    ferry_tensor *x, *xd, *y, *yd, *hn, *cn, *logits, *loss;
    double sum;
    CHECK_OK(ferry_embedding_forward(&c->emb, c->ctx, &ids, &x));
    CHECK_OK(ferry_dropout_forward(c->ctx, 0.25f, x, &xd));
    CHECK_OK(ferry_lstm_forward(&c->rnn, c->ctx, xd, &h0, &c0, NULL, &y, &hn, &cn));
    CHECK_OK(ferry_dropout_forward(c->ctx, 0.25f, y, &yd));
    CHECK_OK(ferry_linear_forward(&c->dec, c->ctx, yd, &logits));
    CHECK_OK(ferry_xent_forward(c->ctx, logits, &tg, 1.0f / 12.0f, &loss, &sum));
    *value = sum / 12.0;
    return loss;
}

static double chain_loss(void *u) {
    chain_case *c = u;
    double value;
    ferry_ctx_reset(c->ctx, 0);
    chain_forward(c, &value);
    return value;
}

TEST(whole_model_chain) {
    chain_case c;
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &c.ctx));
    ferry_ctx_set_seed(c.ctx, 99);
    ferry_params_init(&c.P, ferry_backend_cpu());
    CHECK_OK(ferry_embedding_init(&c.emb, &c.P, "encoder", 11, 4));
    CHECK_OK(ferry_lstm_init(&c.rnn, &c.P, "lstm", 4, 5, 2, 0.3f));
    CHECK_OK(ferry_linear_init(&c.dec, &c.P, "decoder", 5, 11, 1));
    init_all_params(&c.P, 0.6f, 51);
    for (int i = 0; i < 12; i++) {
        c.in[i] = (i * 7 + 2) % 11; /* every id appears at most twice */
        c.tg[i] = (i * 5 + 1) % 11;
    }
    c.in[5] = c.in[0]; /* a repeat */
    ferry_gradcheck_fill(c.h0, 30, -0.5f, 0.5f, 52);
    ferry_gradcheck_fill(c.c0, 30, -0.5f, 0.5f, 53);

    double value;
    ferry_ctx_reset(c.ctx, 1);
    ferry_tensor *loss = chain_forward(&c, &value);
    CHECK_EQ(ferry_ctx_tape_length(c.ctx), 6);
    CHECK_OK(ferry_ctx_backward(c.ctx, loss));
    CHECK_EQ(ferry_ctx_grads_count(c.ctx), 1);
    ferry_gradcheck_opts o = tight();
    char what[80];
    float **an = calloc((size_t)c.P.count, sizeof *an);
    CHECK(an != NULL);
    for (int i = 0; i < c.P.count; i++)
        an[i] = dense_grad(c.ctx, &c.P, i);
    for (int i = 0; i < c.P.count; i++) {
        (void)snprintf(what, sizeof what, "chain %s", c.P.items[i].name);
        CHECK(ferry_gradcheck(what, chain_loss, &c, ferry_params_data(&c.P, i), c.P.items[i].numel,
                              an[i], &o));
        free(an[i]);
    }
    free(an);
    ferry_ctx_destroy(c.ctx);
    ferry_params_deinit(&c.P);
}

FERRY_TEST_MAIN(T(gradcheck_catches_wrong_gradient) T(linear) T(linear_no_bias)
                    T(embedding_sparse_repeated_ids) T(xent_sum) T(xent_mean) T(dropout_fixed_mask)
                        T(dropout_drawn_mask) T(dropout_identity) T(whole_model_chain))
