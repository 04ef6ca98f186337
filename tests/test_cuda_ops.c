/* test_cuda_ops.c - the CUDA backend against the CPU oracle: every op of the backend
 * table on fresh random inputs, run on both backends and compared within 1e-4
 * relative (the dropout mask bit for bit), then 20 training steps of the LSTM language
 * model created on cuda:0 against the same model on the CPU. Without a CUDA build or
 * without a device the test prints why and skips (exit 77). Label: cuda. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef FERRY_WITH_CUDA
#include "common/tensor/backend.h"
#include "ferry/cuda.h"
#endif
#include "check.h"
#include "ferry/ferry.h"
#include "ferry/optim.h"
#include "worker/model-impl.h" /* the model's fields */

#define RTOL 1e-4

static ferry_backend *cpu_be, *gpu_be;
static uint64_t rng = 0x2545F4914F6CDD1Dull;

/* The CUDA backend, or a skip with the reason. */
static ferry_backend *gpu(void) {
    if (gpu_be != NULL)
        return gpu_be;
#ifdef FERRY_WITH_CUDA
    ferry_cuda_register();
#endif
    ferry_status st = ferry_backend_create("cuda:0", &gpu_be);
    if (st != FERRY_OK) {
        char why[512];
        (void)snprintf(why, sizeof why, "no CUDA backend here: %s (%s)", ferry_status_str(st),
                       ferry_error_last());
        SKIP(why);
    }
    cpu_be = ferry_backend_cpu();
    return gpu_be;
}

static double urand(void) { /* uniform in [0, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}

/* n floats uniform in [lo, hi), host memory (caller frees). */
static float *hrand(int64_t n, double lo, double hi) {
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    CHECK(x != NULL);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(lo + (hi - lo) * urand());
    return x;
}

static void *dev_copy(const void *h, size_t nbytes) {
    void *d;
    CHECK_OK(ferry_backend_alloc(gpu_be, nbytes, &d));
    CHECK_OK(ferry_backend_copy(gpu_be, d, h, nbytes, FERRY_COPY_HOST_TO_DEVICE));
    return d;
}

/* Device array → fresh host array (caller frees). */
static void *host_copy(const void *d, size_t nbytes) {
    void *h = malloc(nbytes ? nbytes : 1);
    CHECK(h != NULL);
    CHECK_OK(ferry_backend_copy(gpu_be, h, d, nbytes, FERRY_COPY_DEVICE_TO_HOST));
    return h;
}

/* got (device, n floats) against want (host): |got - want| <= RTOL |want| + floor,
 * with the floor 1e-6 of the largest |want| (sums that cancel to ~0). Never on all-zero. */
static void expect_close(const char *what, const float *dgot, const float *want, int64_t n) {
    double mx = 0.0;
    for (int64_t i = 0; i < n; i++)
        mx = fabs((double)want[i]) > mx ? fabs((double)want[i]) : mx;
    CHECK(mx > 0.0);
    float *got = host_copy(dgot, (size_t)n * sizeof(float));
    CHECK_CLOSE_F(what, got, want, n, 1e-6 * mx, RTOL);
    free(got);
}

/* ---- dense math ---- */

TEST(gemm_all_transposes) {
    ferry_backend *g = gpu();
    enum { M = 37, N = 29, K = 53, PAD = 3 };
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int64_t lda = (ta ? M : K) + PAD, ldb = (tb ? K : N) + PAD, ldc = N + PAD;
            int64_t na = (ta ? K : M) * lda, nb = (tb ? N : K) * ldb, nc = M * ldc;
            float *A = hrand(na, -1, 1), *B = hrand(nb, -1, 1), *C = hrand(nc, -1, 1);
            float *dA = dev_copy(A, (size_t)na * 4), *dB = dev_copy(B, (size_t)nb * 4);
            float *dC = dev_copy(C, (size_t)nc * 4);
            CHECK_OK(ferry_backend_gemm(cpu_be, ta, tb, M, N, K, 0.7f, A, lda, B, ldb, 0.3f, C,
                                        ldc));
            CHECK_OK(ferry_backend_gemm(g, ta, tb, M, N, K, 0.7f, dA, lda, dB, ldb, 0.3f, dC,
                                        ldc));
            expect_close("gemm C", dC, C, nc);
            /* K = 0: C = beta C. */
            CHECK_OK(ferry_backend_gemm(cpu_be, ta, tb, M, N, 0, 1.0f, A, lda, B, ldb, 0.5f, C,
                                        ldc));
            CHECK_OK(ferry_backend_gemm(g, ta, tb, M, N, 0, 1.0f, dA, lda, dB, ldb, 0.5f, dC,
                                        ldc));
            expect_close("gemm K=0", dC, C, nc);
            ferry_backend_free(g, dA);
            ferry_backend_free(g, dB);
            ferry_backend_free(g, dC);
            free(A);
            free(B);
            free(C);
        }
}

TEST(elementwise_and_bias) {
    ferry_backend *g = gpu();
    enum { n = 100003, R = 61, D = 173 };
    float *x = hrand(n, -2, 2), *y = hrand(n, -2, 2), *o = hrand(n, -1, 1);
    float *dx = dev_copy(x, sizeof(float) * n), *dy = dev_copy(y, sizeof(float) * n);
    float *dout = dev_copy(o, sizeof(float) * n);
    CHECK_OK(ferry_backend_axpy(cpu_be, n, -0.37f, x, y));
    CHECK_OK(ferry_backend_axpy(g, n, -0.37f, dx, dy));
    expect_close("axpy", dy, y, n);
    CHECK_OK(ferry_backend_scale(cpu_be, n, 1.7f, y));
    CHECK_OK(ferry_backend_scale(g, n, 1.7f, dy));
    expect_close("scale", dy, y, n);
    CHECK_OK(ferry_backend_mul(cpu_be, n, x, y, o));
    CHECK_OK(ferry_backend_mul(g, n, dx, dy, dout));
    expect_close("mul", dout, o, n);
    CHECK_OK(ferry_backend_fill(cpu_be, o, n - 5, 2.5f));
    CHECK_OK(ferry_backend_fill(g, dout, n - 5, 2.5f));
    expect_close("fill", dout, o, n);
    double s_cpu, s_gpu;
    CHECK_OK(ferry_backend_sumsq(cpu_be, n, x, &s_cpu));
    CHECK_OK(ferry_backend_sumsq(g, n, dx, &s_gpu));
    CHECK(s_cpu > 0.0);
    CHECK_NEAR(s_gpu, s_cpu, 1e-10 * s_cpu);
    /* add_bias and sum_rows over (R, D) views of x and y. */
    float *b = hrand(D, -1, 1), *db = dev_copy(b, sizeof(float) * D);
    CHECK_OK(ferry_backend_add_bias(cpu_be, R, D, b, y));
    CHECK_OK(ferry_backend_add_bias(g, R, D, db, dy));
    expect_close("add_bias", dy, y, R * D);
    CHECK_OK(ferry_backend_sum_rows(cpu_be, R, D, x, b));
    CHECK_OK(ferry_backend_sum_rows(g, R, D, dx, db));
    expect_close("sum_rows", db, b, D);
    ferry_backend_free(g, dx);
    ferry_backend_free(g, dy);
    ferry_backend_free(g, dout);
    ferry_backend_free(g, db);
    free(x);
    free(y);
    free(o);
    free(b);
}

/* ---- fused layer ops ---- */

TEST(lstm_cell_forward_backward) {
    ferry_backend *g = gpu();
    enum { N = 7, H = 45 };
    float *z = hrand(4 * N * H, -3, 3), *cp = hrand(N * H, -1, 1);
    float *c = hrand(N * H, 0, 1), *h = hrand(N * H, 0, 1);
    float *dh = hrand(N * H, -1, 1), *dc = hrand(N * H, -1, 1), *dz = hrand(4 * N * H, 0, 1);
    float *d_z = dev_copy(z, 16 * N * H), *d_cp = dev_copy(cp, 4 * N * H);
    float *d_c = dev_copy(c, 4 * N * H), *d_h = dev_copy(h, 4 * N * H);
    float *d_dh = dev_copy(dh, 4 * N * H), *d_dc = dev_copy(dc, 4 * N * H);
    float *d_dz = dev_copy(dz, 16 * N * H);
    CHECK_OK(ferry_backend_lstm_cell_forward(cpu_be, N, H, z, cp, c, h));
    CHECK_OK(ferry_backend_lstm_cell_forward(g, N, H, d_z, d_cp, d_c, d_h));
    expect_close("lstm gates", d_z, z, 4 * N * H);
    expect_close("lstm c", d_c, c, N * H);
    expect_close("lstm h", d_h, h, N * H);
    CHECK_OK(ferry_backend_lstm_cell_backward(cpu_be, N, H, z, cp, c, dh, dc, dz));
    CHECK_OK(ferry_backend_lstm_cell_backward(g, N, H, d_z, d_cp, d_c, d_dh, d_dc, d_dz));
    expect_close("lstm dgates", d_dz, dz, 4 * N * H);
    expect_close("lstm dc_prev", d_dc, dc, N * H);
    float *ds[] = {d_z, d_cp, d_c, d_h, d_dh, d_dc, d_dz}, *hs[] = {z, cp, c, h, dh, dc, dz};
    for (int i = 0; i < 7; i++) {
        ferry_backend_free(g, ds[i]);
        free(hs[i]);
    }
}

TEST(xent_and_sharded_softmax) {
    ferry_backend *g = gpu();
    enum { N = 13, V = 1001 };
    int32_t tg[N], tg_slice[N];
    for (int n = 0; n < N; n++) {
        tg[n] = (int32_t)(urand() * V);
        tg_slice[n] = n % 3 == 0 ? -1 : tg[n]; /* some targets in another slice */
    }
    float *z = hrand(N * V, -8, 8), *loss = hrand(N, 0, 1);
    float *dz = dev_copy(z, sizeof(float) * N * V), *dloss = dev_copy(loss, sizeof(float) * N);
    int32_t *dtg = dev_copy(tg, sizeof tg), *dts = dev_copy(tg_slice, sizeof tg_slice);
    CHECK_OK(ferry_backend_xent_forward(cpu_be, N, V, z, tg, loss));
    CHECK_OK(ferry_backend_xent_forward(g, N, V, dz, dtg, dloss));
    expect_close("xent probs", dz, z, N * V);
    expect_close("xent loss rows", dloss, loss, N);
    CHECK_OK(ferry_backend_xent_backward(cpu_be, N, V, z, tg, 0.25f));
    CHECK_OK(ferry_backend_xent_backward(g, N, V, dz, dtg, 0.25f));
    expect_close("xent grad", dz, z, N * V);

    /* Partials and the gradient over one slice, with and without row scales. */
    float *z2 = hrand(N * V, -8, 8), mx[N], tl[N], fac[N];
    double se[N];
    float *dz2 = dev_copy(z2, sizeof(float) * N * V), *dmx, *dtl;
    double *dse;
    CHECK_OK(ferry_backend_alloc(g, sizeof mx, (void **)&dmx));
    CHECK_OK(ferry_backend_alloc(g, sizeof tl, (void **)&dtl));
    CHECK_OK(ferry_backend_alloc(g, sizeof se, (void **)&dse));
    CHECK_OK(ferry_backend_softmax_partials(cpu_be, N, V, z2, tg_slice, mx, se, tl));
    CHECK_OK(ferry_backend_softmax_partials(g, N, V, dz2, dts, dmx, dse, dtl));
    expect_close("partials e", dz2, z2, N * V);
    expect_close("partials max", dmx, mx, N);
    expect_close("partials target logit", dtl, tl, N);
    double *se_g = host_copy(dse, sizeof se);
    for (int n = 0; n < N; n++) {
        CHECK_NEAR(se_g[n], se[n], 1e-6 * se[n]);
        fac[n] = (float)(1.0 / se[n]) * (float)(0.5 + urand());
    }
    float *rs = hrand(N, 0.5, 2), *drs = dev_copy(rs, sizeof(float) * N);
    float *dfac = dev_copy(fac, sizeof fac);
    float *z3 = malloc(sizeof(float) * N * V);
    CHECK(z3 != NULL);
    memcpy(z3, z2, sizeof(float) * N * V);
    float *dz3 = dev_copy(z3, sizeof(float) * N * V);
    CHECK_OK(ferry_backend_softmax_grad(cpu_be, N, V, z2, fac, tg_slice, rs, 0.3f));
    CHECK_OK(ferry_backend_softmax_grad(g, N, V, dz2, dfac, dts, drs, 0.3f));
    expect_close("softmax grad (row scale)", dz2, z2, N * V);
    CHECK_OK(ferry_backend_softmax_grad(cpu_be, N, V, z3, fac, tg_slice, NULL, 0.3f));
    CHECK_OK(ferry_backend_softmax_grad(g, N, V, dz3, dfac, dts, NULL, 0.3f));
    expect_close("softmax grad", dz3, z3, N * V);
    void *dev[] = {dz, dloss, dtg, dts, dz2, dmx, dtl, dse, drs, dfac, dz3};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        ferry_backend_free(g, dev[i]);
    free(z);
    free(loss);
    free(z2);
    free(z3);
    free(rs);
    free(se_g);
}

TEST(rows_and_dropout) {
    ferry_backend *g = gpu();
    enum { R = 50, D = 37, C = 200 };
    int32_t idx[C];
    for (int i = 0; i < C; i++)
        idx[i] = (int32_t)(urand() * R); /* repeats: scatter must accumulate */
    float *tab = hrand(R * D, -1, 1), *rows = hrand(C * D, -1, 1);
    float *dtab = dev_copy(tab, sizeof(float) * R * D), *drows = dev_copy(rows, 4 * C * D);
    int32_t *didx = dev_copy(idx, sizeof idx);
    CHECK_OK(ferry_backend_gather_rows(cpu_be, C, D, idx, tab, rows));
    CHECK_OK(ferry_backend_gather_rows(g, C, D, didx, dtab, drows));
    expect_close("gather", drows, rows, C * D);
    float *src = hrand(C * D, -1, 1), *dsrc = dev_copy(src, sizeof(float) * C * D);
    CHECK_OK(ferry_backend_scatter_add_rows(cpu_be, C, D, idx, src, tab));
    CHECK_OK(ferry_backend_scatter_add_rows(g, C, D, didx, dsrc, dtab));
    expect_close("scatter_add", dtab, tab, R * D);

    enum { n = 100003 };
    float *m = hrand(n, 0, 1), *dm;
    CHECK_OK(ferry_backend_alloc(g, sizeof(float) * n, (void **)&dm));
    CHECK_OK(ferry_backend_dropout_mask(cpu_be, n, 0.3f, 99, 12345, m));
    CHECK_OK(ferry_backend_dropout_mask(g, n, 0.3f, 99, 12345, dm));
    float *mg = host_copy(dm, sizeof(float) * n);
    CHECK(memcmp(mg, m, sizeof(float) * n) == 0); /* the same generator, bit for bit */
    ferry_backend_free(g, dtab);
    ferry_backend_free(g, drows);
    ferry_backend_free(g, didx);
    ferry_backend_free(g, dsrc);
    ferry_backend_free(g, dm);
    free(tab);
    free(rows);
    free(src);
    free(m);
    free(mg);
}

/* ---- optimizer updates ---- */

/* Three steps of one configuration, dense (rows == 0) or over `rows` touched rows of
 * an (R, D) table, on both backends; parameters and state compared after each. */
static void optim_case(const char *name, ferry_optim_kind kind, double momentum, int nesterov,
                       double wd, int nrows) {
    ferry_backend *g = gpu();
    enum { R = 40, D = 33 };
    const int64_t n = R * D, U = nrows;
    float *p = hrand(n, -1, 1), *s0 = hrand(n, 0, 0.5), *s1 = hrand(n, 0, 0.5);
    float *dp = dev_copy(p, sizeof(float) * n), *ds0 = dev_copy(s0, sizeof(float) * n);
    float *ds1 = dev_copy(s1, sizeof(float) * n);
    uint8_t seen[R] = {0}, *dseen = dev_copy(seen, sizeof seen);
    int64_t ids[R];
    ferry_optim_update u = {0};
    u.kind = kind;
    u.lr = kind == FERRY_OPTIM_ADADELTA ? 1.0 : 0.01;
    u.weight_decay = wd;
    u.grad_scale = 0.8f;
    u.momentum = momentum;
    u.dampening = nesterov ? 0.0 : 0.1;
    u.nesterov = nesterov;
    u.lr_decay = 0.01;
    u.rho = 0.9;
    u.beta1 = 0.9;
    u.beta2 = 0.999;
    u.eps = 1e-8;
    for (int step = 1; step <= 3; step++) {
        int64_t gn = U ? U * D : n;
        float *gr = hrand(gn, -1, 1), *dg = dev_copy(gr, sizeof(float) * (size_t)gn);
        for (int64_t k = 0; k < U; k++) /* distinct rows, a different set each step */
            ids[k] = (k * 7 + step * 3) % R;
        u.step = step;
        u.buf_fresh = step == 1;
        u.rows = U ? ids : NULL;
        u.nrows = U;
        u.D = U ? D : 0;
        u.n = U ? 0 : n;
        u.param = p, u.grad = gr, u.slot0 = s0, u.slot1 = s1;
        u.row_seen = U ? seen : NULL;
        CHECK_OK(ferry_backend_optim_update(cpu_be, &u));
        u.param = dp, u.grad = dg, u.slot0 = ds0, u.slot1 = ds1;
        u.row_seen = U ? dseen : NULL;
        CHECK_OK(ferry_backend_optim_update(g, &u));
        fprintf(stderr, "  %s step %d\n", name, step);
        expect_close("param", dp, p, n);
        expect_close("slot0", ds0, s0, n);
        expect_close("slot1", ds1, s1, n);
        ferry_backend_free(g, dg);
        free(gr);
    }
    uint8_t *seen_g = host_copy(dseen, sizeof seen);
    CHECK(memcmp(seen_g, seen, sizeof seen) == 0);
    free(seen_g);
    ferry_backend_free(g, dp);
    ferry_backend_free(g, ds0);
    ferry_backend_free(g, ds1);
    ferry_backend_free(g, dseen);
    free(p);
    free(s0);
    free(s1);
}

TEST(optim_dense_and_rows_all_kinds) {
    for (int rows = 0; rows <= 11; rows += 11) {
        optim_case("sgd", FERRY_OPTIM_SGD, 0.0, 0, 0.0, rows);
        optim_case("sgd momentum wd", FERRY_OPTIM_SGD, 0.9, 0, 1e-2, rows);
        optim_case("sgd nesterov wd", FERRY_OPTIM_SGD, 0.9, 1, 1e-2, rows);
        optim_case("adagrad wd", FERRY_OPTIM_ADAGRAD, 0.0, 0, 1e-2, rows);
        optim_case("adadelta wd", FERRY_OPTIM_ADADELTA, 0.0, 0, 1e-2, rows);
        optim_case("adam wd", FERRY_OPTIM_ADAM, 0.0, 0, 1e-2, rows);
        optim_case("adamw", FERRY_OPTIM_ADAMW, 0.0, 0, 1e-2, rows);
    }
}

/* ---- the language model, 20 training steps ---- */

typedef struct lm_run {
    ferry_lm *lm;
    ferry_optim *opt;
    ferry_ctx *ctx;
} lm_run;

static void lm_run_init(lm_run *r, ferry_backend *be, const ferry_lm_config *mc) {
    ferry_optim_config oc = ferry_optim_defaults(FERRY_OPTIM_ADAM);
    oc.lr = 3e-3;
    CHECK_OK(ferry_lm_create(be, mc, &r->lm));
    CHECK_OK(ferry_optim_create(&r->lm->P, &oc, &r->opt));
    CHECK_OK(ferry_ctx_create(be, &r->ctx));
}

TEST(lm_20_training_steps_match_cpu) {
    ferry_backend *g = gpu();
    enum { V = 97, T = 12, B = 5, STEPS = 20 };
    ferry_lm_config mc = {V, 24, 32, 2, 0.25f, 0.1f, 0.0f, 7}; /* dropout on: masks match */
    lm_run c, d;
    lm_run_init(&c, cpu_be, &mc);
    lm_run_init(&d, g, &mc);
    CHECK(c.lm->P.numel == d.lm->P.numel);
    int32_t in[T * B], tg[T * B];
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < T * B; i++) {
            in[i] = (int32_t)(urand() * V);
            tg[i] = (int32_t)(urand() * V);
        }
        ferry_shape sh = ferry_shape_2d(T, B);
        ferry_tensor tin = ferry_tensor_wrap(cpu_be, FERRY_DTYPE_I32, sh, in);
        ferry_tensor ttg = ferry_tensor_wrap(cpu_be, FERRY_DTYPE_I32, sh, tg);
        ferry_lm_step_args a = {.loss_scale = 1.0f / (T * B), .clip = 0.5f, .lr = 3e-3, .ctx_id = (uint64_t)s + 1, .seed = 1000 + (uint64_t)s, .job_step = 0};
        ferry_lm_step_result rc, rd;
        CHECK_OK(ferry_lm_train_step(c.lm, c.ctx, NULL, c.opt, &tin, &ttg, &a, &rc));
        CHECK_OK(ferry_lm_train_step(d.lm, d.ctx, NULL, d.opt, &tin, &ttg, &a, &rd));
        fprintf(stderr, "  step %2d: loss cpu %.7f cuda %.7f, grad norm %.6g / %.6g\n", s + 1,
                rc.loss_sum, rd.loss_sum, rc.grad_norm, rd.grad_norm);
        CHECK_NEAR(rd.loss_sum, rc.loss_sum, RTOL * rc.loss_sum);
        CHECK_NEAR(rd.grad_norm, rc.grad_norm, 1e-3 * rc.grad_norm);
    }
    /* 20 Adam steps amplify rounding differences slightly: parameters within 1e-3. */
    float *pg = host_copy(d.lm->P.data, (size_t)d.lm->P.numel * sizeof(float));
    CHECK_CLOSE_F("lm parameters", pg, c.lm->P.data, (long)c.lm->P.numel, 1e-5, 1e-3);
    free(pg);
    lm_run *rs[] = {&c, &d};
    for (int i = 0; i < 2; i++) {
        ferry_ctx_destroy(rs[i]->ctx);
        ferry_optim_destroy(rs[i]->opt);
        ferry_lm_destroy(rs[i]->lm);
    }
}

FERRY_TEST_MAIN(T(gemm_all_transposes) T(elementwise_and_bias) T(lstm_cell_forward_backward)
                    T(xent_and_sharded_softmax) T(rows_and_dropout)
                        T(optim_dense_and_rows_all_kinds) T(lm_20_training_steps_match_cpu))
