/* test_stiefel.c - the Stiefel kernels against tests/data/cdopt_vectors.json (every
 * "matrices" case and the polar "init"), finite differences of the two gradients on a
 * double-precision reference, the feasibility identity A^T A - I = -0.75 E^2 + 0.25 E^3,
 * the polar factor of random uniform-init matrices (characterised by U^T U = I and
 * U^T W symmetric positive definite), and the per-block penalty pass. */
#include <stdint.h>
#include <string.h>

#include "common/tensor/backend.h"
#include "check.h"
#include "json.h"
#include "optim/stiefel.h"

#define ATOL 1e-5
#define RTOL 1e-4

static ferry_json *root;

static void release_root(void) {
    ferry_json_destroy(root);
    root = NULL;
}

static const ferry_json *vectors(const char *path) {
    if (root == NULL) {
        CHECK_OK(ferry_json_parse_file(ferry_test_path("tests/data/cdopt_vectors.json"), &root));
        CHECK(atexit(release_root) == 0);
    }
    const ferry_json *n = ferry_json_path(root, path);
    CHECK(n != NULL);
    return n;
}

static double *f64(const ferry_json *t, long *count, long dims[4]) {
    double *d = NULL;
    int nd = 0;
    long n = ferry_json_tensor(t, &d, &nd, dims);
    CHECK(n >= 0);
    if (count != NULL)
        *count = n;
    return d;
}

static float *f32(const ferry_json *t, long *count) {
    float *f = ferry_json_tensor_f32(t, count);
    CHECK(f != NULL);
    return f;
}

/* ---- double-precision references ---- */

/* M (k, k) = X^T Y for X, Y (n, k). */
static void ref_xty(int n, int k, const double *X, const double *Y, double *M) {
    for (int i = 0; i < k; i++)
        for (int j = 0; j < k; j++) {
            double s = 0.0;
            for (int r = 0; r < n; r++)
                s += X[r * k + i] * Y[r * k + j];
            M[i * k + j] = s;
        }
}

/* A(W) = 1.5 W - 0.5 W (W^T W) for W (n, p). */
static void ref_map(int n, int p, const double *W, double *A) {
    double S[64 * 64];
    CHECK(p <= 64);
    ref_xty(n, p, W, W, S);
    for (int r = 0; r < n; r++)
        for (int j = 0; j < p; j++) {
            double s = 0.0;
            for (int i = 0; i < p; i++)
                s += W[r * p + i] * S[i * p + j];
            A[r * p + j] = 1.5 * W[r * p + j] - 0.5 * s;
        }
}

/* beta ||W^T W - I||_F^2. */
static double ref_penalty(int n, int p, const double *W, double beta) {
    double S[64 * 64], s = 0.0;
    ref_xty(n, p, W, W, S);
    for (int i = 0; i < p; i++)
        for (int j = 0; j < p; j++) {
            double c = S[i * p + j] - (i == j);
            s += c * c;
        }
    return beta * s;
}

/* ---- the reference vectors ---- */

TEST(matrices_match_cdopt_vectors) {
    ferry_backend *be = ferry_backend_cpu();
    const ferry_json *cases = vectors("matrices");
    CHECK(ferry_json_len(cases) == 6);
    for (size_t c = 0; c < ferry_json_len(cases); c++) {
        const ferry_json *cj = ferry_json_at(cases, c);
        const char *name = ferry_json_str(ferry_json_get(cj, "name"));
        int rows = strcmp(ferry_json_str(ferry_json_get(cj, "convention")), "rows") == 0;
        float beta = (float)ferry_json_num(ferry_json_get(cj, "beta"));
        long dims[4], nx, nc;
        double *Xd = f64(ferry_json_get(cj, "X"), &nx, dims);
        double *A = f64(ferry_json_get(cj, "A"), NULL, NULL);
        double *C = f64(ferry_json_get(cj, "C"), &nc, NULL);
        double *gp = f64(ferry_json_get(cj, "grad_penalty"), NULL, NULL);
        double *vjp = f64(ferry_json_get(cj, "vjp_A"), NULL, NULL);
        float *W = f32(ferry_json_get(cj, "X"), NULL);
        float *G = f32(ferry_json_get(cj, "G"), NULL);
        int64_t n = dims[0], p = dims[1], k = rows ? n : p;
        float *out = calloc((size_t)nx, sizeof(float));
        float *Cf = calloc((size_t)nc, sizeof(float));
        /* Exactly the documented scratch size, so ASan sees any overrun. */
        float *scratch = malloc((size_t)ferry_stiefel_scratch_floats(k) * sizeof(float));
        CHECK(out != NULL && Cf != NULL && scratch != NULL);
        fprintf(stderr, "  %s (%lld x %lld, %s)\n", name, (long long)n, (long long)p,
                rows ? "rows" : "cols");

        CHECK_OK(ferry_stiefel_map(be, n, p, W, out, scratch));
        CHECK_CLOSE("A", out, A, nx, ATOL, RTOL);
        CHECK_OK(ferry_stiefel_map_backward(be, n, p, W, G, out, c % 2 ? NULL : scratch));
        CHECK_CLOSE("vjp_A", out, vjp, nx, ATOL, RTOL);
        double pen = 0.0, sq = 0.0;
        memset(out, 0, (size_t)nx * sizeof(float));
        if (rows) {
            CHECK_OK(ferry_stiefel_constraint_rows(be, n, p, W, Cf, scratch));
            CHECK_OK(ferry_stiefel_penalty_rows(be, n, p, W, beta, &pen, &sq, scratch));
            CHECK_OK(ferry_stiefel_penalty_grad_rows(be, n, p, W, beta, out, NULL));
        } else {
            CHECK_OK(ferry_stiefel_constraint(be, n, p, W, Cf, NULL));
            CHECK_OK(ferry_stiefel_penalty(be, n, p, W, beta, &pen, &sq, scratch));
            CHECK_OK(ferry_stiefel_penalty_grad(be, n, p, W, beta, out, scratch));
            double feas = 0.0;
            CHECK_OK(ferry_stiefel_feasibility(be, n, p, W, &feas, scratch));
            CHECK_NEAR(feas * feas, sq, 1e-12 + 1e-12 * sq);
        }
        CHECK_CLOSE("C", Cf, C, nc, ATOL, RTOL);
        double want_sq = ferry_json_num(ferry_json_get(cj, "sqnorm_C"));
        double want_pen = ferry_json_num(ferry_json_get(cj, "penalty"));
        CHECK_NEAR(sq, want_sq, ATOL + RTOL * fabs(want_sq));
        CHECK_NEAR(pen, want_pen, ATOL + RTOL * fabs(want_pen));
        CHECK_CLOSE("grad_penalty", out, gp, nx, ATOL, RTOL);
        /* The penalty gradient accumulates. */
        CHECK_OK(rows ? ferry_stiefel_penalty_grad_rows(be, n, p, W, beta, out, scratch)
                      : ferry_stiefel_penalty_grad(be, n, p, W, beta, out, scratch));
        for (long i = 0; i < nx; i++)
            gp[i] *= 2.0;
        CHECK_CLOSE("2 x grad_penalty", out, gp, nx, ATOL, RTOL);
        free(Xd);
        free(A);
        free(C);
        free(gp);
        free(vjp);
        free(W);
        free(G);
        free(out);
        free(Cf);
        free(scratch);
    }
}

TEST(polar_init_matches_svd) {
    long dims[4], n;
    float *W = f32(vectors("init.X"), &n);
    double *want = f64(vectors("init.polar"), NULL, dims);
    CHECK(dims[0] == 16 && dims[1] == 4);
    CHECK_OK(ferry_stiefel_polar(16, 4, W));
    CHECK_CLOSE("polar", W, want, n, ATOL, RTOL);
    free(W);
    free(want);
}

/* ---- finite differences on a double reference ---- */

TEST(map_backward_matches_finite_differences) {
    /* L(W) = <G, A(W)>: dL/dW from the float kernel vs central differences of L. */
    enum { N = 7, P = 3 };
    double Wd[N * P], Gd[N * P], A[N * P];
    float W[N * P], G[N * P], dW[N * P];
    for (int i = 0; i < N * P; i++) {
        W[i] = 0.6f * (2.0f * ferry_rand_uniform(21, (uint64_t)i) - 1.0f);
        G[i] = 2.0f * ferry_rand_uniform(22, (uint64_t)i) - 1.0f;
        Wd[i] = (double)W[i];
        Gd[i] = (double)G[i];
    }
    CHECK_OK(ferry_stiefel_map_backward(ferry_backend_cpu(), N, P, W, G, dW, NULL));
    const double h = 1e-6;
    for (int i = 0; i < N * P; i++) {
        double keep = Wd[i], lp = 0.0, lm = 0.0;
        Wd[i] = keep + h;
        ref_map(N, P, Wd, A);
        for (int j = 0; j < N * P; j++)
            lp += Gd[j] * A[j];
        Wd[i] = keep - h;
        ref_map(N, P, Wd, A);
        for (int j = 0; j < N * P; j++)
            lm += Gd[j] * A[j];
        Wd[i] = keep;
        double fd = (lp - lm) / (2.0 * h);
        CHECK_NEAR(dW[i], fd, 1e-5 + 1e-4 * fabs(fd));
    }
}

TEST(penalty_grad_matches_finite_differences) {
    enum { N = 6, P = 4 };
    const float beta = 0.1f;
    double Wd[N * P];
    float W[N * P], dW[N * P];
    memset(dW, 0, sizeof dW);
    for (int i = 0; i < N * P; i++) {
        W[i] = 0.8f * (2.0f * ferry_rand_uniform(31, (uint64_t)i) - 1.0f);
        Wd[i] = (double)W[i];
    }
    CHECK_OK(ferry_stiefel_penalty_grad(ferry_backend_cpu(), N, P, W, beta, dW, NULL));
    double pen = 0.0;
    CHECK_OK(ferry_stiefel_penalty(ferry_backend_cpu(), N, P, W, beta, &pen, NULL, NULL));
    CHECK_NEAR(pen, ref_penalty(N, P, Wd, (double)beta), 1e-6);
    const double h = 1e-6;
    for (int i = 0; i < N * P; i++) {
        double keep = Wd[i];
        Wd[i] = keep + h;
        double lp = ref_penalty(N, P, Wd, (double)beta);
        Wd[i] = keep - h;
        double lm = ref_penalty(N, P, Wd, (double)beta);
        Wd[i] = keep;
        double fd = (lp - lm) / (2.0 * h);
        CHECK_NEAR(dW[i], fd, 1e-5 + 1e-4 * fabs(fd));
    }
}

/* ---- the feasibility identity ---- */

TEST(dissolved_weight_is_feasible_to_second_order) {
    /* With E = W^T W - I: A^T A - I = -0.75 E^2 + 0.25 E^3, for near and far W. */
    const char *names[2] = {"matrices.0.X", "matrices.1.X"}; /* tall_5x3 near / generic */
    for (int c = 0; c < 2; c++) {
        long dims[4], nx;
        double *Wd = f64(vectors(names[c]), &nx, dims);
        float *W = f32(vectors(names[c]), NULL);
        int n = (int)dims[0], p = (int)dims[1];
        float *Af = malloc((size_t)nx * sizeof(float));
        double *A = malloc((size_t)nx * sizeof(double));
        double E[9], E2[9], E3[9], AtA[9];
        CHECK(Af != NULL && A != NULL && p == 3);
        CHECK_OK(ferry_stiefel_map(ferry_backend_cpu(), n, p, W, Af, NULL));
        for (long i = 0; i < nx; i++)
            A[i] = (double)Af[i];
        ref_xty(n, p, A, A, AtA);
        ref_xty(n, p, Wd, Wd, E);
        for (int i = 0; i < p; i++)
            E[i * p + i] -= 1.0;
        for (int i = 0; i < p; i++)
            for (int j = 0; j < p; j++) {
                double s2 = 0.0;
                for (int r = 0; r < p; r++)
                    s2 += E[i * p + r] * E[r * p + j];
                E2[i * p + j] = s2;
            }
        for (int i = 0; i < p; i++)
            for (int j = 0; j < p; j++) {
                double s3 = 0.0;
                for (int r = 0; r < p; r++)
                    s3 += E2[i * p + r] * E[r * p + j];
                E3[i * p + j] = s3;
            }
        for (int i = 0; i < p * p; i++) {
            double lhs = AtA[i] - (i / p == i % p), rhs = -0.75 * E2[i] + 0.25 * E3[i];
            CHECK_NEAR(lhs, rhs, 1e-5 + 1e-4 * fabs(rhs));
        }
        free(Wd);
        free(W);
        free(Af);
        free(A);
    }
}

/* ---- polar factor of random matrices ---- */

/* 1 if the symmetric M (m, m) is positive definite (Cholesky succeeds). */
static int spd(int m, const double *M) {
    double *L = calloc((size_t)(m * m), sizeof *L);
    int ok = L != NULL;
    for (int j = 0; ok && j < m; j++) {
        double d = M[j * m + j];
        for (int k = 0; k < j; k++)
            d -= L[j * m + k] * L[j * m + k];
        if (!(d > 0.0)) {
            ok = 0;
            break;
        }
        L[j * m + j] = sqrt(d);
        for (int i = j + 1; i < m; i++) {
            double s = M[i * m + j];
            for (int k = 0; k < j; k++)
                s -= L[i * m + k] * L[j * m + k];
            L[i * m + j] = s / L[j * m + j];
        }
    }
    free(L);
    return ok;
}

/* Checks that U (n, p) is the polar factor of W0: U^T U = I and H = U^T W0 symmetric
 * positive definite (for full-rank W0 exactly one such U exists). */
static void check_polar(int n, int p, const float *W0, const float *U) {
    double *Ud = malloc((size_t)(n * p) * sizeof *Ud), *Wd = malloc((size_t)(n * p) * sizeof *Wd);
    double *M = malloc((size_t)(p * p) * sizeof *M);
    CHECK(Ud != NULL && Wd != NULL && M != NULL);
    for (int i = 0; i < n * p; i++) {
        Ud[i] = (double)U[i];
        Wd[i] = (double)W0[i];
    }
    ref_xty(n, p, Ud, Ud, M);
    for (int i = 0; i < p; i++)
        for (int j = 0; j < p; j++)
            CHECK_NEAR(M[i * p + j], i == j ? 1.0 : 0.0, 2e-6);
    ref_xty(n, p, Ud, Wd, M);
    double hmax = 0.0;
    for (int i = 0; i < p * p; i++)
        hmax = fmax(hmax, fabs(M[i]));
    for (int i = 0; i < p; i++)
        for (int j = 0; j < i; j++)
            CHECK_NEAR(M[i * p + j], M[j * p + i], 1e-5 * hmax);
    CHECK(spd(p, M));
    free(Ud);
    free(Wd);
    free(M);
}

TEST(polar_of_random_uniform_init) {
    /* weight_hh-shaped (4H, H) draws from U(-1/sqrt(H), 1/sqrt(H)), a square one, and an
     * ill-conditioned one (columns scaled over six orders of magnitude). */
    const int shapes[5][2] = {{16, 4}, {64, 16}, {200, 50}, {40, 40}, {30, 6}};
    for (int c = 0; c < 5; c++) {
        int n = shapes[c][0], p = shapes[c][1];
        float *W = malloc((size_t)(n * p) * sizeof *W), *W0 = malloc((size_t)(n * p) * sizeof *W0);
        CHECK(W != NULL && W0 != NULL);
        float a = 1.0f / sqrtf((float)p);
        for (int i = 0; i < n * p; i++) {
            W[i] = a * (2.0f * ferry_rand_uniform(40 + (uint64_t)c, (uint64_t)i) - 1.0f);
            if (c == 4)
                W[i] *= powf(10.0f, -(float)(i % p));
        }
        memcpy(W0, W, (size_t)(n * p) * sizeof *W);
        CHECK_OK(ferry_stiefel_polar(n, p, W));
        check_polar(n, p, W0, W);
        /* Already feasible: left exactly as is. */
        memcpy(W0, W, (size_t)(n * p) * sizeof *W);
        double feas = 0.0;
        CHECK_OK(ferry_stiefel_feasibility(ferry_backend_cpu(), n, p, W, &feas, NULL));
        if (feas <= 1e-6) {
            CHECK_OK(ferry_stiefel_polar(n, p, W));
            CHECK(memcmp(W, W0, (size_t)(n * p) * sizeof *W) == 0);
        }
        free(W);
        free(W0);
    }
}

TEST(polar_errors) {
    float W[12] = {1, 2, 1, 2, 3, 6, 0.5f, 1, -1, -2, 4, 8}; /* (6, 2), column 2 = 2 column 1 */
    float Z[6] = {0};
    float bad[4] = {1, 0, 0, NAN};
    CHECK_STATUS(ferry_stiefel_polar(6, 2, W), FERRY_ERR_NUMERIC);
    CHECK(strstr(ferry_error_last(), "rank-deficient") != NULL);
    CHECK_STATUS(ferry_stiefel_polar(3, 2, Z), FERRY_ERR_NUMERIC);
    CHECK_STATUS(ferry_stiefel_polar(2, 2, bad), FERRY_ERR_NUMERIC);
    CHECK_STATUS(ferry_stiefel_polar(2, 3, W), FERRY_ERR_SHAPE);
    float A[4];
    CHECK_STATUS(ferry_stiefel_map(ferry_backend_cpu(), 2, 2, W, W, NULL), FERRY_ERR_INVALID);
    CHECK_STATUS(ferry_stiefel_map(ferry_backend_cpu(), 0, 2, W, A, NULL), FERRY_ERR_INVALID);
}

/* ---- the per-block penalty pass ---- */

TEST(block_penalty_pass) {
    ferry_params P;
    ferry_grads G;
    int w, b;
    const float beta = 0.1f;
    ferry_params_init(&P, ferry_backend_cpu());
    CHECK_OK(ferry_params_add(&P, "weight_hh", ferry_shape_2d(16, 4), 0, &w));
    CHECK_OK(ferry_params_add(&P, "bias", ferry_shape_1d(16), 0, &b));
    CHECK_OK(ferry_params_alloc(&P));
    CHECK_OK(ferry_params_set_constraint(&P, w, FERRY_CONSTRAINT_STIEFEL, beta));
    float *W = ferry_params_data(&P, w);
    long n;
    float *X = f32(vectors("matrices.3.X"), &n); /* lstm_hh_16x4_near */
    CHECK(n == 64);
    memcpy(W, X, sizeof(float) * 64);
    CHECK_OK(ferry_grads_init(&G, &P));
    double pen = 0.0, drift = 0.0, sq = 0.0, want_pen = 0.0;
    CHECK_OK(ferry_stiefel_add_penalty_grads(&P, &G, &pen, &drift));
    CHECK(G.touched[w] && !G.touched[b]);
    float want[64] = {0};
    CHECK_OK(ferry_stiefel_penalty_grad(ferry_backend_cpu(), 16, 4, W, beta, want, NULL));
    CHECK(memcmp(ferry_grads_dense(&G, w), want, sizeof want) == 0);
    CHECK_OK(ferry_stiefel_penalty(ferry_backend_cpu(), 16, 4, W, beta, &want_pen, &sq, NULL));
    CHECK(pen == want_pen);
    CHECK(drift == sqrt(sq));
    CHECK_NEAR(pen, ferry_json_num(vectors("matrices.3.penalty")), 1e-6);
    /* A second pass adds on top of the existing gradient. */
    CHECK_OK(ferry_stiefel_add_penalty_grads(&P, &G, NULL, NULL));
    for (int i = 0; i < 64; i++)
        CHECK(ferry_grads_dense(&G, w)[i] == 2.0f * want[i]);
    free(X);
    ferry_grads_deinit(&G);
    ferry_params_deinit(&P);
}

FERRY_TEST_MAIN(T(matrices_match_cdopt_vectors) T(polar_init_matches_svd)
                    T(map_backward_matches_finite_differences)
                        T(penalty_grad_matches_finite_differences)
                            T(dissolved_weight_is_feasible_to_second_order)
                                T(polar_of_random_uniform_init) T(polar_errors)
                                    T(block_penalty_pass))
