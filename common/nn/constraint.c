/* constraint.c - the Stiefel constraint as the layers apply it (cdopt's constraint
 * dissolving approach, spec/stiefel.md): the dissolving map A(W) and its vector-Jacobian
 * product on any backend (products through ferry_backend_gemm), the constraint
 * C(W) and its feasibility metric, and the host polar-factor initialisation in double
 * precision. The penalty and its gradient, which the optimizer step adds, are in
 * optim/stiefel.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "common/core/log.h"
#include "common/nn/constraint.h"

int64_t ferry_stiefel_scratch_floats(int64_t k) {
    return 2 * k * k + k + 1;
}

/* ---- scratch and small helpers ---- */

/* Scratch of ferry_stiefel_scratch_floats(k): S (k, k), T (k, k), e (k + 1). */
typedef struct scratch {
    float *S, *T, *e;
    float *owned; /* non-NULL when allocated here */
} scratch;

static ferry_status scratch_get(ferry_backend *be, int64_t k, float *given, scratch *s) {
    s->owned = NULL;
    if (given == NULL) {
        ferry_status st = ferry_backend_alloc(
            be, (size_t)ferry_stiefel_scratch_floats(k) * sizeof(float), (void **)&s->owned);
        if (st != FERRY_OK)
            return st;
        given = s->owned;
    }
    s->S = given;
    s->T = given + k * k;
    s->e = given + 2 * k * k;
    return FERRY_OK;
}

static void scratch_put(ferry_backend *be, scratch *s) {
    ferry_backend_free(be, s->owned);
}

/* FERRY_ERR_INVALID for an empty shape, a NULL pointer or out == W (out may be NULL
 * only when the function has no matrix output). */
static ferry_status check_args(int64_t n, int64_t p, const void *W, const void *out, int out_needed,
                               const char *fn) {
    if (n < 1 || p < 1 || W == NULL || (out_needed && out == NULL))
        return ferry_errorf(FERRY_ERR_INVALID, "%s: bad arguments (n %lld, p %lld)", fn,
                            (long long)n, (long long)p);
    if (out != NULL && W == out)
        return ferry_errorf(FERRY_ERR_INVALID, "%s: output aliases the input", fn);
    return FERRY_OK;
}

/* S = W^T W (p, p) when !rows, else W W^T (n, n). */
static ferry_status gram(ferry_backend *be, int rows, int64_t n, int64_t p, const float *W,
                         float *S) {
    if (rows)
        return ferry_backend_gemm(be, 0, 1, n, n, p, 1.0f, W, p, W, p, 0.0f, S, n);
    return ferry_backend_gemm(be, 1, 0, p, p, n, 1.0f, W, p, W, p, 0.0f, S, p);
}

/* S (k, k) -= I with backend ops only: the diagonal S[i (k+1)] is column 0 of S viewed as
 * rows of width k + 1, so adding the bias e = (-1, 0, ..., 0) to the first k - 1 such rows
 * and -1 to the last element touches exactly the diagonal and stays inside S. */
static ferry_status sub_identity(ferry_backend *be, int64_t k, float *S, float *e) {
    ferry_status st;
    if ((st = ferry_backend_fill(be, e, k + 1, 0.0f)) != FERRY_OK ||
        (st = ferry_backend_fill(be, e, 1, -1.0f)) != FERRY_OK ||
        (st = ferry_backend_add_bias(be, k - 1, k + 1, e, S)) != FERRY_OK)
        return st;
    return ferry_backend_add_bias(be, 1, 1, e, S + k * k - 1);
}

/* C (k, k) = C(W) in the given convention, k = rows ? n : p. */
static ferry_status constraint(ferry_backend *be, int rows, int64_t n, int64_t p, const float *W,
                               float *C, float *e) {
    ferry_status st = gram(be, rows, n, p, W, C);
    return st != FERRY_OK ? st : sub_identity(be, rows ? n : p, C, e);
}

/* ---- the dissolving map ---- */

/* Both map functions start alike: scratch, the smaller Gram matrix of W into s->S, and
 * out (n, p) = src. On failure the scratch is given back. */
static ferry_status map_setup(ferry_backend *be, int rows, int64_t n, int64_t p, const float *W,
                              const float *src, float *out, float *scratch_mem, scratch *s) {
    ferry_status st = scratch_get(be, rows ? n : p, scratch_mem, s);
    if (st != FERRY_OK)
        return st;
    st = gram(be, rows, n, p, W, s->S);
    if (st == FERRY_OK)
        st = ferry_backend_copy(be, out, src, (size_t)(n * p) * sizeof(float),
                                FERRY_COPY_DEVICE_TO_DEVICE);
    if (st != FERRY_OK)
        scratch_put(be, s);
    return st;
}

ferry_status ferry_stiefel_map(ferry_backend *be, int64_t n, int64_t p, const float *W,
                               float *A_out, float *scratch_mem) {
    ferry_status st = check_args(n, p, W, A_out, 1, "stiefel map");
    if (st != FERRY_OK)
        return st;
    int rows = n < p; /* form the smaller Gram matrix; the polynomial is the same */
    scratch s;
    if ((st = map_setup(be, rows, n, p, W, W, A_out, scratch_mem, &s)) != FERRY_OK)
        return st;
    /* A = 1.5 W - 0.5 W (W^T W)   or   1.5 W - 0.5 (W W^T) W. */
    if (!rows)
        st = ferry_backend_gemm(be, 0, 0, n, p, p, -0.5f, W, p, s.S, p, 1.5f, A_out, p);
    else
        st = ferry_backend_gemm(be, 0, 0, n, p, n, -0.5f, s.S, n, W, p, 1.5f, A_out, p);
    scratch_put(be, &s);
    return st;
}

ferry_status ferry_stiefel_map_backward(ferry_backend *be, int64_t n, int64_t p, const float *W,
                                        const float *G, float *dW_out, float *scratch_mem) {
    ferry_status st = check_args(n, p, W, dW_out, 1, "stiefel map backward");
    if (st == FERRY_OK)
        st = check_args(n, p, G, dW_out, 1, "stiefel map backward");
    if (st != FERRY_OK)
        return st;
    int rows = n < p;
    scratch s;
    if ((st = map_setup(be, rows, n, p, W, G, dW_out, scratch_mem, &s)) != FERRY_OK)
        return st;
    if (!rows) {
        /* T = W^T G (p, p); dW = 1.5 G - 0.5 G S - 0.5 W T - 0.5 W T^T. */
        if (st == FERRY_OK)
            st = ferry_backend_gemm(be, 1, 0, p, p, n, 1.0f, W, p, G, p, 0.0f, s.T, p);
        if (st == FERRY_OK)
            st = ferry_backend_gemm(be, 0, 0, n, p, p, -0.5f, G, p, s.S, p, 1.5f, dW_out, p);
        if (st == FERRY_OK)
            st = ferry_backend_gemm(be, 0, 0, n, p, p, -0.5f, W, p, s.T, p, 1.0f, dW_out, p);
        if (st == FERRY_OK)
            st = ferry_backend_gemm(be, 0, 1, n, p, p, -0.5f, W, p, s.T, p, 1.0f, dW_out, p);
    } else {
        /* T = G W^T (n, n); G W^T W = T W, W W^T G = S G, W G^T W = T^T W. */
        if (st == FERRY_OK)
            st = ferry_backend_gemm(be, 0, 1, n, n, p, 1.0f, G, p, W, p, 0.0f, s.T, n);
        if (st == FERRY_OK)
            st = ferry_backend_gemm(be, 0, 0, n, p, n, -0.5f, s.S, n, G, p, 1.5f, dW_out, p);
        if (st == FERRY_OK)
            st = ferry_backend_gemm(be, 0, 0, n, p, n, -0.5f, s.T, n, W, p, 1.0f, dW_out, p);
        if (st == FERRY_OK)
            st = ferry_backend_gemm(be, 1, 0, n, p, n, -0.5f, s.T, n, W, p, 1.0f, dW_out, p);
    }
    scratch_put(be, &s);
    return st;
}

/* ---- the constraint and its metric ---- */

static ferry_status constraint_out(ferry_backend *be, int rows, int64_t n, int64_t p,
                                   const float *W, float *C_out, float *scratch_mem) {
    ferry_status st = check_args(n, p, W, C_out, 1, "stiefel constraint");
    scratch s;
    if (st != FERRY_OK || (st = scratch_get(be, rows ? n : p, scratch_mem, &s)) != FERRY_OK)
        return st;
    st = constraint(be, rows, n, p, W, C_out, s.e);
    scratch_put(be, &s);
    return st;
}

ferry_status ferry_stiefel_constraint(ferry_backend *be, int64_t n, int64_t p, const float *W,
                                      float *C_out, float *scratch_mem) {
    return constraint_out(be, 0, n, p, W, C_out, scratch_mem);
}

ferry_status ferry_stiefel_constraint_rows(ferry_backend *be, int64_t n, int64_t p, const float *W,
                                           float *C_out, float *scratch_mem) {
    return constraint_out(be, 1, n, p, W, C_out, scratch_mem);
}

ferry_status ferry_stiefel_feasibility(ferry_backend *be, int64_t n, int64_t p, const float *W,
                                       double *out, float *scratch_mem) {
    ferry_status st = check_args(n, p, W, NULL, 0, "stiefel feasibility");
    scratch s;
    double sq = 0.0;
    if (st != FERRY_OK || (st = scratch_get(be, p, scratch_mem, &s)) != FERRY_OK)
        return st;
    st = constraint(be, 0, n, p, W, s.S, s.e);
    if (st == FERRY_OK)
        st = ferry_backend_sumsq(be, p * p, s.S, &sq);
    scratch_put(be, &s);
    *out = sqrt(sq);
    return st;
}

/* ---- polar-factor initialisation (host, double) ---- */

/* C (m, m) = A B, row-major, through OpenBLAS. */
static void dmul(int64_t m, const double *A, const double *B, double *C) {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)m, (blasint)m, 1.0,
                A, (blasint)m, B, (blasint)m, 0.0, C, (blasint)m);
}

/* ||M - I||_F for M (m, m). */
static double dist_identity(int64_t m, const double *M) {
    double s = 0.0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < m; j++) {
            double d = M[i * m + j] - (i == j ? 1.0 : 0.0);
            s += d * d;
        }
    return sqrt(s);
}

/* Z = (S / c)^(-1/2) by the coupled Newton-Schulz iteration Y0 = S/c, Z0 = I,
 * T = (3I - Z Y)/2, Y <- Y T, Z <- T Z (Higham, Functions of Matrices, 6.3). It needs
 * the eigenvalues of S/c in (0, 3) (c = min(||S||_F, ||S||_inf) >= lambda_max gives
 * (0, 1]) and converges quadratically once ||I - Z Y|| < 1. Once ||Z Y - I||_F < 1e-4 a
 * last Z update brings it to about 1e-8 or round-off, enough for a float result.
 * FERRY_ERR_NUMERIC if it does not converge (S singular to working precision).
 * work: 3 m^2 doubles. */
static ferry_status inv_sqrt(int64_t m, const double *S, double c, double *Z, double *work) {
    double *Y = work, *T = work + m * m, *M = work + 2 * m * m;
    size_t bytes = (size_t)(m * m) * sizeof *Y;
    for (int64_t i = 0; i < m * m; i++) {
        Y[i] = S[i] / c;
        Z[i] = (i / m == i % m) ? 1.0 : 0.0;
    }
    for (int it = 0; it < 200; it++) {
        if (it == 0)
            memcpy(M, Y, bytes); /* Z0 Y0 = Y0 */
        else
            dmul(m, Z, Y, M);
        double err = dist_identity(m, M);
        if (!isfinite(err))
            break;
        for (int64_t i = 0; i < m * m; i++)
            T[i] = (i / m == i % m ? 1.5 : 0.0) - 0.5 * M[i];
        if (it == 0) { /* Z1 = T, Y1 = Y0 T */
            memcpy(Z, T, bytes);
            dmul(m, Y, T, M);
            memcpy(Y, M, bytes);
            continue;
        }
        dmul(m, T, Z, M);
        memcpy(Z, M, bytes);
        if (err < 1e-4)
            return FERRY_OK;
        dmul(m, Y, T, M);
        memcpy(Y, M, bytes);
    }
    return ferry_errorf(FERRY_ERR_NUMERIC,
                        "stiefel polar: W^T W is singular to working precision (rank-deficient "
                        "W has no unique polar factor)");
}

ferry_status ferry_stiefel_polar(int64_t n, int64_t p, float *W) {
    if (p < 1 || n < p)
        return ferry_errorf(FERRY_ERR_SHAPE, "stiefel polar: W is %lld x %lld, needs n >= p >= 1",
                            (long long)n, (long long)p);
    double *Wd = malloc((size_t)(n * p) * sizeof *Wd);
    double *buf = malloc((size_t)(5 * p * p) * sizeof *buf);
    ferry_status st = FERRY_OK;
    if (Wd == NULL || buf == NULL) {
        st = FERRY_NOMEM();
        goto done;
    }
    double *S = buf, *Z = buf + p * p, *work = buf + 2 * p * p;
    for (int64_t i = 0; i < n * p; i++) {
        Wd[i] = (double)W[i];
        if (!isfinite(Wd[i])) {
            st = ferry_errorf(FERRY_ERR_NUMERIC, "stiefel polar: W has a non-finite entry");
            goto done;
        }
    }
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)p, (blasint)p, (blasint)n, 1.0,
                Wd, (blasint)p, Wd, (blasint)p, 0.0, S, (blasint)p);
    if (dist_identity(p, S) <= 1e-6)
        goto done; /* already on the manifold: cdopt leaves it alone */
    double fro = 0.0, inf = 0.0;
    for (int64_t i = 0; i < p; i++) {
        double row = 0.0;
        for (int64_t j = 0; j < p; j++) {
            fro += S[i * p + j] * S[i * p + j];
            row += fabs(S[i * p + j]);
        }
        inf = row > inf ? row : inf;
    }
    double c = fmin(sqrt(fro), inf);
    if (!(c > 0.0)) {
        st = ferry_errorf(FERRY_ERR_NUMERIC, "stiefel polar: W is zero");
        goto done;
    }
    if ((st = inv_sqrt(p, S, c, Z, work)) != FERRY_OK)
        goto done;
    /* polar(W) = W S^(-1/2) = W Z / sqrt(c). */
    double *out = malloc((size_t)(n * p) * sizeof *out);
    if (out == NULL) {
        st = FERRY_NOMEM();
        goto done;
    }
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)n, (blasint)p, (blasint)p,
                1.0 / sqrt(c), Wd, (blasint)p, Z, (blasint)p, 0.0, out, (blasint)p);
    for (int64_t i = 0; i < n * p; i++)
        W[i] = (float)out[i];
    free(out);
done:
    free(Wd);
    free(buf);
    return st;
}
