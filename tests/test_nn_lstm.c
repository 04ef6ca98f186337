/* test_nn_lstm.c - the multi-layer LSTM: finite-difference checks of every
 * gradient (parameters, x, h0, c0, with loss terms on y, hn and cn) over several
 * steps and layers, with fixed inter-layer dropout masks, with zero initial
 * states and partial upstream gradients, and across the vectorised cell's block
 * boundary (H > 16); a float64 reference forward; eval mode; drawn masks. */
#include <stdlib.h>
#include <string.h>

#include "common/tensor/backend.h"
#include "check.h"
#include "gradcheck.h" /* ferry_gradcheck, ferry_gradcheck_fill, ferry_gradcheck_dot */
#include "ferry/nn.h"

typedef struct lstm_case {
    ferry_ctx *ctx;
    ferry_params P;
    ferry_lstm rnn;
    int64_t T, B, C, H;
    int L;
    int states; /* 1: pass h0, c0; 0: NULL (zeros) */
    int terms;  /* bit 0: y, bit 1: hn, bit 2: cn */
    float *x, *h0, *c0, *R, *Rh, *Rc;
    float *masks[FERRY_LSTM_MAX_LAYERS];
    int use_masks;
    ferry_tensor tx, th0, tc0;
} lstm_case;

static float *rand_floats(int64_t n, float lo, float hi, uint64_t seed) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    CHECK(p != NULL);
    ferry_gradcheck_fill(p, n, lo, hi, seed);
    return p;
}

static void case_init(lstm_case *c, int64_t T, int64_t B, int64_t C, int64_t H, int L,
                      uint64_t seed) {
    memset(c, 0, sizeof *c);
    c->T = T, c->B = B, c->C = C, c->H = H, c->L = L;
    c->states = 1;
    c->terms = 7;
    ferry_backend *cpu = ferry_backend_cpu();
    CHECK_OK(ferry_ctx_create(cpu, &c->ctx));
    ferry_params_init(&c->P, cpu);
    CHECK_OK(ferry_lstm_init(&c->rnn, &c->P, "rnn", C, H, L, 0.0f));
    CHECK_OK(ferry_params_alloc(&c->P));
    for (int i = 0; i < c->P.count; i++)
        CHECK_OK(ferry_params_init_uniform(&c->P, i, 0.6f, seed));
    c->x = rand_floats(T * B * C, -1.0f, 1.0f, seed + 1);
    c->h0 = rand_floats(L * B * H, -0.8f, 0.8f, seed + 2);
    c->c0 = rand_floats(L * B * H, -0.8f, 0.8f, seed + 3);
    c->R = rand_floats(T * B * H, -1.0f, 1.0f, seed + 4);
    c->Rh = rand_floats(L * B * H, -1.0f, 1.0f, seed + 5);
    c->Rc = rand_floats(L * B * H, -1.0f, 1.0f, seed + 6);
    for (int l = 0; l < L - 1; l++) { /* p = 0.4: kept entries scaled by 1/0.6 */
        c->masks[l] = rand_floats(T * B * H, 0.0f, 1.0f, seed + 10 + (uint64_t)l);
        for (int64_t i = 0; i < T * B * H; i++)
            c->masks[l][i] = c->masks[l][i] < 0.4f ? 0.0f : 1.0f / 0.6f;
    }
    c->tx = ferry_tensor_wrap(cpu, FERRY_DTYPE_F32, ferry_shape_3d(T, B, C), c->x);
    c->th0 = ferry_tensor_wrap(cpu, FERRY_DTYPE_F32, ferry_shape_3d(L, B, H), c->h0);
    c->tc0 = ferry_tensor_wrap(cpu, FERRY_DTYPE_F32, ferry_shape_3d(L, B, H), c->c0);
}

static void case_free(lstm_case *c) {
    free(c->x), free(c->h0), free(c->c0), free(c->R), free(c->Rh), free(c->Rc);
    for (int l = 0; l < FERRY_LSTM_MAX_LAYERS; l++)
        free(c->masks[l]);
    ferry_ctx_destroy(c->ctx);
    ferry_params_deinit(&c->P);
}

static void case_forward(lstm_case *c, ferry_tensor **y, ferry_tensor **hn, ferry_tensor **cn) {
    ferry_lstm_opts opts = {(const float *const *)c->masks};
    CHECK_OK(ferry_lstm_forward(&c->rnn, c->ctx, &c->tx, c->states ? &c->th0 : NULL,
                                c->states ? &c->tc0 : NULL, c->use_masks ? &opts : NULL, y, hn,
                                cn));
}

/* sum(y R) + sum(hn Rh) + sum(cn Rc), the terms selected by c->terms. */
static double case_loss(void *u) {
    lstm_case *c = u;
    ferry_tensor *y, *hn, *cn;
    ferry_ctx_reset(c->ctx, 0);
    case_forward(c, &y, &hn, &cn);
    int64_t LBH = c->L * c->B * c->H;
    double s = 0.0;
    if (c->terms & 1)
        s += ferry_gradcheck_dot(ferry_tensor_f32(y), c->R, c->T * c->B * c->H);
    if (c->terms & 2)
        s += ferry_gradcheck_dot(ferry_tensor_f32(hn), c->Rh, LBH);
    if (c->terms & 4)
        s += ferry_gradcheck_dot(ferry_tensor_f32(cn), c->Rc, LBH);
    return s;
}

static float *grad_copy(const ferry_tensor *g, int64_t n) {
    float *out = calloc((size_t)n, sizeof *out); /* zeros if no gradient arrived */
    CHECK(out != NULL);
    if (g != NULL)
        memcpy(out, ferry_tensor_f32(g), (size_t)n * sizeof *out);
    return out;
}

/* Runs forward + backward from the selected seeds, then FD-checks every
 * parameter and, when they exist, x, h0 and c0. */
static void case_gradcheck(lstm_case *c, const char *tag, int64_t max_elem) {
    ferry_backend *cpu = ferry_backend_cpu();
    int64_t TBH = c->T * c->B * c->H, LBH = c->L * c->B * c->H;
    ferry_tensor *y, *hn, *cn;
    ferry_ctx_reset(c->ctx, 1);
    CHECK_OK(ferry_ctx_require_grad(c->ctx, &c->tx));
    CHECK_OK(ferry_ctx_require_grad(c->ctx, &c->th0));
    CHECK_OK(ferry_ctx_require_grad(c->ctx, &c->tc0));
    case_forward(c, &y, &hn, &cn);
    CHECK_EQ(ferry_ctx_tape_length(c->ctx), 1);
    ferry_tensor R = ferry_tensor_wrap(cpu, FERRY_DTYPE_F32, y->shape, c->R);
    ferry_tensor Rh = ferry_tensor_wrap(cpu, FERRY_DTYPE_F32, hn->shape, c->Rh);
    ferry_tensor Rc = ferry_tensor_wrap(cpu, FERRY_DTYPE_F32, cn->shape, c->Rc);
    const ferry_tensor *outs[3], *seeds[3];
    int n = 0;
    if (c->terms & 1)
        outs[n] = y, seeds[n++] = &R;
    if (c->terms & 2)
        outs[n] = hn, seeds[n++] = &Rh;
    if (c->terms & 4)
        outs[n] = cn, seeds[n++] = &Rc;
    CHECK_OK(ferry_ctx_backward_from(c->ctx, n, outs, seeds));

    ferry_grads *G = ferry_ctx_grads(c->ctx, &c->P);
    float *dx = grad_copy(ferry_ctx_grad_of(c->ctx, &c->tx), c->T * c->B * c->C);
    float *dh0 = grad_copy(c->states ? ferry_ctx_grad_of(c->ctx, &c->th0) : NULL, LBH);
    float *dc0 = grad_copy(c->states ? ferry_ctx_grad_of(c->ctx, &c->tc0) : NULL, LBH);
    float **dp = calloc((size_t)c->P.count, sizeof *dp);
    CHECK(dp != NULL);
    for (int i = 0; i < c->P.count; i++) {
        CHECK(G->touched[i]);
        dp[i] = grad_copy(NULL, c->P.items[i].numel);
        memcpy(dp[i], G->dense + c->P.items[i].offset, (size_t)c->P.items[i].numel * 4);
    }
    (void)TBH;
    ferry_gradcheck_opts o = {1e-2, 1e-6, 2e-3, 2e-3, max_elem};
    char what[96];
    for (int i = 0; i < c->P.count; i++) {
        (void)snprintf(what, sizeof what, "%s %s", tag, c->P.items[i].name);
        CHECK(ferry_gradcheck(what, case_loss, c, ferry_params_data(&c->P, i), c->P.items[i].numel,
                              dp[i], &o));
        free(dp[i]);
    }
    free(dp);
    (void)snprintf(what, sizeof what, "%s x", tag);
    CHECK(ferry_gradcheck(what, case_loss, c, c->x, c->T * c->B * c->C, dx, &o));
    if (c->states) {
        (void)snprintf(what, sizeof what, "%s h0", tag);
        CHECK(ferry_gradcheck(what, case_loss, c, c->h0, LBH, dh0, &o));
        (void)snprintf(what, sizeof what, "%s c0", tag);
        CHECK(ferry_gradcheck(what, case_loss, c, c->c0, LBH, dc0, &o));
    }
    free(dx), free(dh0), free(dc0);
}

TEST(gradcheck_3_layers) {
    lstm_case c;
    case_init(&c, 5, 3, 4, 5, 3, 101);
    case_gradcheck(&c, "L3", 0);
    case_free(&c);
}

TEST(gradcheck_fixed_dropout_masks) {
    lstm_case c;
    case_init(&c, 4, 2, 3, 5, 3, 202);
    c.use_masks = 1;
    case_gradcheck(&c, "L3 masks", 0);
    case_free(&c);
}

/* Zero initial states, and upstream gradients on only some outputs: the
 * backward must treat the missing ones as zero. */
TEST(gradcheck_zero_states_partial_outputs) {
    lstm_case c;
    case_init(&c, 4, 2, 3, 4, 2, 303);
    c.states = 0;
    c.terms = 2; /* hn only */
    case_gradcheck(&c, "hn only", 0);
    c.terms = 4; /* cn only */
    case_gradcheck(&c, "cn only", 0);
    c.terms = 1; /* y only */
    case_gradcheck(&c, "y only", 0);
    case_free(&c);
}

/* H = 21 crosses the cell's 16-unit vector block (16 vectorised + 5 scalar). */
TEST(gradcheck_wide_hidden) {
    lstm_case c;
    case_init(&c, 4, 2, 3, 21, 2, 404);
    case_gradcheck(&c, "H21", 300);
    case_free(&c);
}

/* ---- float64 reference forward ---- */

static double sigmoid(double x) {
    return 1.0 / (1.0 + exp(-x));
}

/* PyTorch's LSTM in double on the same float parameters: y (T,B,H), hn, cn (L,B,H). */
static void reference_forward(const lstm_case *c, const float *masks_on, double *y, double *hn,
                              double *cn) {
    int64_t T = c->T, B = c->B, H = c->H;
    double *in = malloc((size_t)(T * B * (c->C > H ? c->C : H)) * sizeof *in);
    double *out = malloc((size_t)(T * B * H) * sizeof *out);
    double *h = malloc((size_t)(B * H) * sizeof *h), *cs = malloc((size_t)(B * H) * sizeof *cs);
    CHECK(in && out && h && cs);
    for (int64_t i = 0; i < T * B * c->C; i++)
        in[i] = (double)c->x[i];
    for (int l = 0; l < c->L; l++) {
        int64_t C = l == 0 ? c->C : H;
        const float *wih = ferry_params_data(&c->P, c->rnn.w_ih[l]);
        const float *whh = ferry_params_data(&c->P, c->rnn.w_hh[l]);
        const float *bih = ferry_params_data(&c->P, c->rnn.b_ih[l]);
        const float *bhh = ferry_params_data(&c->P, c->rnn.b_hh[l]);
        for (int64_t i = 0; i < B * H; i++) {
            h[i] = c->states ? (double)c->h0[l * B * H + i] : 0.0;
            cs[i] = c->states ? (double)c->c0[l * B * H + i] : 0.0;
        }
        for (int64_t t = 0; t < T; t++) {
            double *hnew = out + t * B * H;
            for (int64_t b = 0; b < B; b++) {
                for (int64_t j = 0; j < H; j++) {
                    double z[4];
                    for (int k = 0; k < 4; k++) {
                        int64_t r = k * H + j;
                        double s = (double)bih[r] + (double)bhh[r];
                        for (int64_t q = 0; q < C; q++)
                            s += (double)wih[r * C + q] * in[(t * B + b) * C + q];
                        for (int64_t q = 0; q < H; q++)
                            s += (double)whh[r * H + q] * h[b * H + q];
                        z[k] = s;
                    }
                    double cc = sigmoid(z[1]) * cs[b * H + j] + sigmoid(z[0]) * tanh(z[2]);
                    hnew[b * H + j] = sigmoid(z[3]) * tanh(cc);
                    cn[(l * B + b) * H + j] = cc;
                }
            }
            for (int64_t i = 0; i < B * H; i++) {
                h[i] = hnew[i];
                cs[i] = cn[l * B * H + i];
            }
        }
        for (int64_t i = 0; i < B * H; i++)
            hn[l * B * H + i] = h[i];
        for (int64_t i = 0; i < T * B * H; i++) /* next layer's input, through the mask */
            in[i] = out[i] * (masks_on && l < c->L - 1 ? (double)c->masks[l][i] : 1.0);
    }
    memcpy(y, out, (size_t)(T * B * H) * sizeof *y);
    free(in), free(out), free(h), free(cs);
}

TEST(forward_matches_float64_reference) {
    lstm_case c;
    case_init(&c, 6, 4, 7, 37, 3, 505); /* H = 37: two vector blocks and a tail */
    c.use_masks = 1;
    int64_t TBH = c.T * c.B * c.H, LBH = c.L * c.B * c.H;
    double *y = malloc((size_t)TBH * sizeof *y), *hn = malloc((size_t)LBH * sizeof *hn);
    double *cn = malloc((size_t)LBH * sizeof *cn);
    CHECK(y && hn && cn);
    reference_forward(&c, c.masks[0], y, hn, cn);
    ferry_tensor *ty, *thn, *tcn;
    ferry_ctx_reset(c.ctx, 1);
    case_forward(&c, &ty, &thn, &tcn);
    CHECK_CLOSE("y", ferry_tensor_f32(ty), y, (long)TBH, 2e-6, 2e-5);
    CHECK_CLOSE("hn", ferry_tensor_f32(thn), hn, (long)LBH, 2e-6, 2e-5);
    CHECK_CLOSE("cn", ferry_tensor_f32(tcn), cn, (long)LBH, 2e-6, 2e-5);
    /* Eval mode ignores the masks (dropout is training-only) and records nothing. */
    reference_forward(&c, NULL, y, hn, cn);
    ferry_ctx_reset(c.ctx, 2);
    ferry_ctx_set_training(c.ctx, 0);
    case_forward(&c, &ty, &thn, &tcn);
    CHECK_EQ(ferry_ctx_tape_length(c.ctx), 0);
    CHECK_CLOSE("y eval", ferry_tensor_f32(ty), y, (long)TBH, 2e-6, 2e-5);
    CHECK_CLOSE("cn eval", ferry_tensor_f32(tcn), cn, (long)LBH, 2e-6, 2e-5);
    free(y), free(hn), free(cn);
    case_free(&c);
}

/* Masks drawn from the context equal ferry_backend_dropout_mask over the
 * context's stream (layer 0's mask first), and replay after a reset. */
TEST(drawn_masks_follow_the_context_stream) {
    lstm_case c;
    case_init(&c, 3, 2, 3, 6, 3, 606);
    c.rnn.dropout = 0.5f;
    int64_t n = c.T * c.B * c.H;
    ferry_ctx_set_seed(c.ctx, 4242);
    ferry_tensor *y1, *y2, *hn, *cn;
    ferry_ctx_reset(c.ctx, 1);
    case_forward(&c, &y1, &hn, &cn);
    float *first = grad_copy(y1, n);
    ferry_ctx_reset(c.ctx, 2);
    case_forward(&c, &y2, &hn, &cn);
    CHECK(memcmp(first, ferry_tensor_f32(y2), (size_t)n * sizeof(float)) == 0);
    for (int l = 0; l < 2; l++)
        CHECK_OK(ferry_backend_dropout_mask(ferry_backend_cpu(), n, 0.5f, 4242, (uint64_t)(l * n),
                                            c.masks[l]));
    c.use_masks = 1;
    ferry_ctx_reset(c.ctx, 3);
    case_forward(&c, &y2, &hn, &cn);
    CHECK(memcmp(first, ferry_tensor_f32(y2), (size_t)n * sizeof(float)) == 0);
    c.use_masks = 0;
    c.rnn.dropout = 0.0f;
    ferry_ctx_reset(c.ctx, 4);
    case_forward(&c, &y2, &hn, &cn);
    CHECK(memcmp(first, ferry_tensor_f32(y2), (size_t)n * sizeof(float)) != 0);
    free(first);
    case_free(&c);
}

/* A Stiefel-constrained W_hh (layer 1 only) runs through A(W) = 1.5 W - 0.5 W W^T W:
 * the result equals the float64 reference LSTM given A(W) as its plain weight, and
 * the raw W is left as it was. (test_stiefel_lstm.c covers the rest.) */
TEST(stiefel_constraint_runs_through_the_map) {
    lstm_case c;
    case_init(&c, 4, 3, 3, 6, 2, 707);
    int64_t H = c.H, n = 4 * H * H, TBH = c.T * c.B * H, LBH = c.L * c.B * H;
    int w = c.rnn.w_hh[1];
    CHECK_OK(ferry_params_set_constraint(&c.P, w, FERRY_CONSTRAINT_STIEFEL, 0.1f));
    float *W = ferry_params_data(&c.P, w);
    float *raw = malloc((size_t)n * sizeof *raw), *y = malloc((size_t)TBH * sizeof *y);
    float *cn = malloc((size_t)LBH * sizeof *cn);
    double *ry = malloc((size_t)TBH * sizeof *ry), *rhn = malloc((size_t)LBH * sizeof *rhn);
    double *rcn = malloc((size_t)LBH * sizeof *rcn);
    CHECK(raw && y && cn && ry && rhn && rcn);
    memcpy(raw, W, (size_t)n * sizeof *raw);
    ferry_tensor *ty, *thn, *tcn;
    ferry_ctx_reset(c.ctx, 1);
    case_forward(&c, &ty, &thn, &tcn);
    CHECK(memcmp(raw, W, (size_t)n * sizeof *raw) == 0);
    memcpy(y, ferry_tensor_f32(ty), (size_t)TBH * sizeof *y);
    memcpy(cn, ferry_tensor_f32(tcn), (size_t)LBH * sizeof *cn);
    /* W <- A(raw W) in double, unconstrained, for the reference. */
    for (int64_t r = 0; r < 4 * H; r++)
        for (int64_t j = 0; j < H; j++) {
            double s = 0.0; /* (W (W^T W))[r, j] */
            for (int64_t i = 0; i < H; i++) {
                double g = 0.0;
                for (int64_t k = 0; k < 4 * H; k++)
                    g += (double)raw[k * H + i] * (double)raw[k * H + j];
                s += (double)raw[r * H + i] * g;
            }
            W[r * H + j] = (float)(1.5 * (double)raw[r * H + j] - 0.5 * s);
        }
    CHECK(memcmp(raw, W, (size_t)n * sizeof *raw) != 0); /* raw W is off the manifold */
    CHECK_OK(ferry_params_set_constraint(&c.P, w, FERRY_CONSTRAINT_NONE, 0.0f));
    reference_forward(&c, NULL, ry, rhn, rcn);
    CHECK_CLOSE("y", y, ry, (long)TBH, 2e-6, 2e-5);
    CHECK_CLOSE("cn", cn, rcn, (long)LBH, 2e-6, 2e-5);
    free(raw), free(y), free(cn), free(ry), free(rhn), free(rcn);
    case_free(&c);
}

/* Every gradient of a backward: the parameters' dense block, then x, h0, c0. */
static float *all_grads(lstm_case *c) {
    int64_t LBH = c->L * c->B * c->H, nx = c->T * c->B * c->C, np = c->P.numel;
    float *out = calloc((size_t)(np + nx + 2 * LBH), sizeof *out);
    CHECK(out != NULL);
    ferry_grads *G = ferry_ctx_grads(c->ctx, &c->P);
    for (int i = 0; i < c->P.count; i++) {
        CHECK(G->touched[i]);
        memcpy(out + c->P.items[i].offset, G->dense + c->P.items[i].offset,
               (size_t)c->P.items[i].numel * sizeof *out);
    }
    const ferry_tensor *g[3] = {ferry_ctx_grad_of(c->ctx, &c->tx),
                                ferry_ctx_grad_of(c->ctx, &c->th0),
                                ferry_ctx_grad_of(c->ctx, &c->tc0)};
    int64_t at[3] = {np, np + nx, np + nx + LBH}, n[3] = {nx, LBH, LBH};
    for (int k = 0; k < 3; k++) {
        CHECK(g[k] != NULL);
        memcpy(out + at[k], ferry_tensor_f32(g[k]), (size_t)n[k] * sizeof *out);
    }
    return out;
}

/* Forward in `chunks` stretches of time (each from the previous one's final state),
 * then backward from the last stretch to the first, each over its own nodes. */
static float *chunked_grads(lstm_case *c, int chunks, int deferred) {
    ferry_backend *cpu = ferry_backend_cpu();
    int64_t T = c->T, BH = c->B * c->H, BC = c->B * c->C;
    ferry_ctx_reset(c->ctx, 1);
    ferry_ctx_set_deferred(c->ctx, deferred);
    CHECK_OK(ferry_ctx_require_grad(c->ctx, &c->tx));
    CHECK_OK(ferry_ctx_require_grad(c->ctx, &c->th0));
    CHECK_OK(ferry_ctx_require_grad(c->ctx, &c->tc0));
    ferry_tensor *y[8], *hn = &c->th0, *cn = &c->tc0, xs[8], R[8];
    for (int k = 0; k < chunks; k++) {
        int64_t t0 = k * T / chunks, t1 = (k + 1) * T / chunks;
        xs[k] = ferry_tensor_wrap(cpu, FERRY_DTYPE_F32, ferry_shape_3d(t1 - t0, c->B, c->C),
                                  c->x + t0 * BC);
        R[k] = ferry_tensor_wrap(cpu, FERRY_DTYPE_F32, ferry_shape_3d(t1 - t0, c->B, c->H),
                                 c->R + t0 * BH);
        CHECK_OK(ferry_ctx_require_grad(c->ctx, &xs[k]));
        CHECK_OK(ferry_lstm_forward(&c->rnn, c->ctx, &xs[k], hn, cn, NULL, &y[k], &hn, &cn));
    }
    for (int k = chunks - 1; k >= 0; k--) {
        const ferry_tensor *outs[1] = {y[k]}, *seeds[1] = {&R[k]};
        CHECK_OK(ferry_ctx_backward_range(c->ctx, 1, outs, seeds, k, k + 1));
    }
    CHECK_OK(ferry_ctx_sync(c->ctx));
    int64_t LBH = c->L * BH, np = c->P.numel;
    float *out = calloc((size_t)(np + T * BC + 2 * LBH), sizeof *out);
    CHECK(out != NULL);
    ferry_grads *G = ferry_ctx_grads(c->ctx, &c->P);
    memcpy(out, G->dense, (size_t)np * sizeof *out);
    for (int k = 0; k < chunks; k++) {
        const ferry_tensor *g = ferry_ctx_grad_of(c->ctx, &xs[k]);
        CHECK(g != NULL);
        memcpy(out + np + (k * T / chunks) * BC, ferry_tensor_f32(g), ferry_tensor_nbytes(g));
    }
    memcpy(out + np + T * BC, ferry_tensor_f32(ferry_ctx_grad_of(c->ctx, &c->th0)),
           (size_t)LBH * sizeof *out);
    memcpy(out + np + T * BC + LBH, ferry_tensor_f32(ferry_ctx_grad_of(c->ctx, &c->tc0)),
           (size_t)LBH * sizeof *out);
    ferry_ctx_set_deferred(c->ctx, 0);
    return out;
}

/* Weight gradients formed on the context's helper thread (ferry_ctx_set_deferred)
 * are those formed in place, bit for bit: whole-sequence backward, and a backward
 * in three stretches with no sync between them (as the pipeline runs it), with a
 * Stiefel-constrained middle layer (formed in place) among deferred ones; and the
 * finite-difference check passes with deferral on. */
TEST(deferred_weight_gradients_are_bit_identical) {
    lstm_case c;
    case_init(&c, 7, 3, 4, 6, 3, 808);
    int64_t n = c.P.numel + c.T * c.B * c.C + 2 * c.L * c.B * c.H;
    float *ref[2], *got[2];
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            CHECK_OK(
                ferry_params_set_constraint(&c.P, c.rnn.w_hh[1], FERRY_CONSTRAINT_STIEFEL, 0.1f));
        for (int deferred = 0; deferred < 2; deferred++) {
            ferry_tensor *y, *hn, *cn;
            ferry_ctx_reset(c.ctx, 1);
            ferry_ctx_set_deferred(c.ctx, deferred);
            CHECK_OK(ferry_ctx_require_grad(c.ctx, &c.tx));
            CHECK_OK(ferry_ctx_require_grad(c.ctx, &c.th0));
            CHECK_OK(ferry_ctx_require_grad(c.ctx, &c.tc0));
            case_forward(&c, &y, &hn, &cn);
            ferry_tensor R = ferry_tensor_wrap(ferry_backend_cpu(), FERRY_DTYPE_F32, y->shape, c.R);
            const ferry_tensor *outs[1] = {y}, *seeds[1] = {&R};
            CHECK_OK(ferry_ctx_backward_from(c.ctx, 1, outs, seeds)); /* syncs */
            (deferred ? got : ref)[0] = all_grads(&c);
            (deferred ? got : ref)[1] = chunked_grads(&c, 3, deferred);
        }
        CHECK(memcmp(ref[0], got[0], (size_t)n * sizeof(float)) == 0);
        CHECK(memcmp(ref[1], got[1], (size_t)n * sizeof(float)) == 0);
        for (int k = 0; k < 2; k++)
            free(ref[k]), free(got[k]);
    }
    CHECK_OK(ferry_params_set_constraint(&c.P, c.rnn.w_hh[1], FERRY_CONSTRAINT_NONE, 0.0f));
    ferry_ctx_set_deferred(c.ctx, 1);
    case_gradcheck(&c, "deferred", 0);
    case_free(&c);
}

FERRY_TEST_MAIN(T(gradcheck_3_layers) T(gradcheck_fixed_dropout_masks)
                    T(gradcheck_zero_states_partial_outputs) T(gradcheck_wide_hidden)
                        T(forward_matches_float64_reference)
                            T(drawn_masks_follow_the_context_stream)
                                T(stiefel_constraint_runs_through_the_map)
                                    T(deferred_weight_gradients_are_bit_identical))
