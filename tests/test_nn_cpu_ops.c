/* test_nn_cpu_ops.c - the CPU backend's vectorised kernels against plain float64
 * formulas: exp, sigmoid and tanh of vmath.h in ulps over their whole range; the
 * LSTM cell forward and backward, softmax cross-entropy, and the elementwise and
 * row ops at sizes that exercise both the 16-lane blocks and the scalar tails. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/tensor/backend.h"
#include "common/backend/cpu/cpu.h"   /* ferry__cpu_gemm_split_ok */
#include "common/backend/cpu/vmath.h" /* ferry__vexpf, ferry__vsigmoidf, ferry__vtanhf */
#include "check.h"
#include "gradcheck.h" /* ferry_gradcheck_fill */
#include "ferry/nn.h"

/* |a - ref| in units of the float spacing at ref (subnormal spacing below). */
static double ulps(float a, double ref) {
    double spacing =
        fabs(ref) < 1.1754943508222875e-38 ? ldexp(1.0, -149) : ldexp(1.0, ilogb(ref) - 23);
    return fabs((double)a - ref) / spacing;
}

static double sigmoid(double x) {
    return 1.0 / (1.0 + exp(-x));
}

TEST(vmath_within_3_ulp) {
    double we = 0.0, ws = 0.0, wt = 0.0;
    for (double xd = -87.0; xd <= 88.0; xd += 3.3e-4) {
        float x = (float)xd;
        double u = ulps(ferry__vexpf(x), exp((double)x));
        we = u > we ? u : we;
    }
    for (double xd = -30.0; xd <= 30.0; xd += 3.1e-5) {
        float x = (float)xd;
        double u = ulps(ferry__vsigmoidf(x), sigmoid((double)x));
        ws = u > ws ? u : ws;
        u = ulps(ferry__vtanhf(x), tanh((double)x));
        wt = u > wt ? u : wt;
    }
    for (float x = 1e-30f; x < 1.0f; x *= 1.7f) { /* tiny arguments keep full precision */
        wt = fmax(wt, ulps(ferry__vtanhf(x), tanh((double)x)));
        wt = fmax(wt, ulps(ferry__vtanhf(-x), tanh(-(double)x)));
    }
    fprintf(stderr, "  worst: exp %.2f ulp, sigmoid %.2f ulp, tanh %.2f ulp\n", we, ws, wt);
    CHECK(we <= 2.0 && ws <= 3.0 && wt <= 2.0);
    /* The documented edges: 0 below -87, finite at the top, exact at 0. */
    CHECK(ferry__vexpf(-100.0f) == 0.0f && ferry__vexpf(0.0f) == 1.0f);
    CHECK(isfinite(ferry__vexpf(1000.0f)) && ferry__vexpf(1000.0f) > 1e38f);
    CHECK(ferry__vsigmoidf(-200.0f) < 1e-37f && ferry__vsigmoidf(200.0f) == 1.0f);
    CHECK(ferry__vtanhf(50.0f) == 1.0f && ferry__vtanhf(-50.0f) == -1.0f);
}

TEST(lstm_cell_matches_float64) {
    ferry_backend *be = ferry_backend_cpu();
    enum { N = 3, H = 37 }; /* two 16-lane blocks and a tail of 5 */
    float z[N * 4 * H], cp[N * H], c[N * H], h[N * H], dh[N * H], dc[N * H], dz[N * 4 * H];
    float z0[N * 4 * H], dc0[N * H];
    ferry_gradcheck_fill(z0, N * 4 * H, -4.0f, 4.0f, 1);
    ferry_gradcheck_fill(cp, N * H, -2.0f, 2.0f, 2);
    ferry_gradcheck_fill(dh, N * H, -1.0f, 1.0f, 3);
    ferry_gradcheck_fill(dc0, N * H, -1.0f, 1.0f, 4);
    memcpy(z, z0, sizeof z);
    memcpy(dc, dc0, sizeof dc);
    CHECK_OK(ferry_backend_lstm_cell_forward(be, N, H, z, cp, c, h));
    CHECK_OK(ferry_backend_lstm_cell_backward(be, N, H, z, cp, c, dh, dc, dz));
    double act[N * 4 * H], cr[N * H], hr[N * H], dcr[N * H], dzr[N * 4 * H];
    for (int n = 0; n < N; n++) {
        for (int j = 0; j < H; j++) {
            const float *zz = z0 + n * 4 * H;
            double i = sigmoid(zz[j]), f = sigmoid(zz[H + j]), g = tanh(zz[2 * H + j]);
            double o = sigmoid(zz[3 * H + j]), cpv = cp[n * H + j];
            double cc = f * cpv + i * g, tc = tanh(cc), dhv = dh[n * H + j];
            double dct = (double)dc0[n * H + j] + dhv * o * (1.0 - tc * tc);
            double *a = act + n * 4 * H, *d = dzr + n * 4 * H;
            a[j] = i, a[H + j] = f, a[2 * H + j] = g, a[3 * H + j] = o;
            cr[n * H + j] = cc;
            hr[n * H + j] = o * tc;
            d[j] = dct * g * i * (1.0 - i);
            d[H + j] = dct * cpv * f * (1.0 - f);
            d[2 * H + j] = dct * i * (1.0 - g * g);
            d[3 * H + j] = dhv * tc * o * (1.0 - o);
            dcr[n * H + j] = dct * f;
        }
    }
    CHECK_CLOSE("activations", z, act, N * 4 * H, 1e-7, 1e-6);
    CHECK_CLOSE("c", c, cr, N * H, 1e-7, 1e-6);
    CHECK_CLOSE("h", h, hr, N * H, 1e-7, 1e-6);
    CHECK_CLOSE("dgates", dz, dzr, N * 4 * H, 1e-7, 1e-5);
    CHECK_CLOSE("dc_prev", dc, dcr, N * H, 1e-7, 1e-5);
}

TEST(xent_matches_float64) {
    ferry_backend *be = ferry_backend_cpu();
    enum { N = 4, V = 1000 + 7 };
    float *z = malloc(N * V * sizeof *z), *z0 = malloc(N * V * sizeof *z0), rows[N];
    double *p = malloc(N * V * sizeof *p);
    CHECK(z && z0 && p);
    ferry_gradcheck_fill(z0, N * V, -8.0f, 8.0f, 5);
    z0[2 * V + V - 1] = 60.0f; /* the max in the scalar tail */
    z0[3 * V + 5] = -300.0f;   /* an underflowing probability */
    int32_t tg[N] = {0, V - 1, V - 1, 5};
    memcpy(z, z0, N * V * sizeof *z);
    CHECK_OK(ferry_backend_xent_forward(be, N, V, z, tg, rows));
    double loss[N];
    for (int n = 0; n < N; n++) {
        double mx = -HUGE_VAL, s = 0.0;
        for (int v = 0; v < V; v++)
            mx = fmax(mx, (double)z0[n * V + v]);
        for (int v = 0; v < V; v++)
            s += exp((double)z0[n * V + v] - mx);
        for (int v = 0; v < V; v++)
            p[n * V + v] = exp((double)z0[n * V + v] - mx) / s;
        loss[n] = log(s) + mx - (double)z0[n * V + tg[n]];
    }
    CHECK_CLOSE("probabilities", z, p, N * V, 1e-9, 1e-6);
    CHECK_CLOSE("row losses", rows, loss, N, 1e-6, 1e-6);
    CHECK_OK(ferry_backend_xent_backward(be, N, V, z, tg, 0.25f));
    for (int n = 0; n < N; n++) {
        p[n * V + tg[n]] -= 1.0;
        for (int v = 0; v < V; v++)
            p[n * V + v] *= 0.25;
    }
    CHECK_CLOSE("gradient", z, p, N * V, 1e-9, 1e-6);
    free(z), free(z0), free(p);
}

/* Every blocked elementwise op at lengths around the 16-lane block. */
TEST(elementwise_ops_all_lengths) {
    ferry_backend *be = ferry_backend_cpu();
    float x[100], y[100], y0[100], out[100];
    double ref[100];
    ferry_gradcheck_fill(x, 100, -2.0f, 2.0f, 6);
    ferry_gradcheck_fill(y0, 100, -2.0f, 2.0f, 7);
    for (int n = 0; n <= 70; n += (n < 34 ? 1 : 9)) {
        memcpy(y, y0, sizeof y);
        CHECK_OK(ferry_backend_axpy(be, n, 0.5f, x, y));
        for (int i = 0; i < 100; i++)
            ref[i] = i < n ? (double)(y0[i] + 0.5f * x[i]) : (double)y0[i];
        CHECK_CLOSE("axpy", y, ref, 100, 0.0, 0.0);
        memcpy(out, y0, sizeof out);
        CHECK_OK(ferry_backend_mul(be, n, x, y0, out));
        for (int i = 0; i < 100; i++)
            ref[i] = i < n ? (double)(x[i] * y0[i]) : (double)y0[i];
        CHECK_CLOSE("mul", out, ref, 100, 0.0, 0.0);
        CHECK_OK(ferry_backend_mul(be, n, out, x, out)); /* in place */
        for (int i = 0; i < n; i++)
            ref[i] = (double)(x[i] * y0[i] * x[i]);
        CHECK_CLOSE("mul in place", out, ref, 100, 0.0, 0.0);
        memcpy(y, y0, sizeof y);
        CHECK_OK(ferry_backend_scale(be, n, -3.0f, y));
        CHECK_OK(ferry_backend_fill(be, y + n, 100 - n, 7.0f));
        for (int i = 0; i < 100; i++)
            ref[i] = i < n ? (double)(-3.0f * y0[i]) : 7.0;
        CHECK_CLOSE("scale, fill", y, ref, 100, 0.0, 0.0);
        double s, sr = 0.0;
        CHECK_OK(ferry_backend_sumsq(be, n, x, &s));
        for (int i = 0; i < n; i++)
            sr += (double)x[i] * (double)x[i];
        CHECK_NEAR(s, sr, 1e-12 * (1.0 + sr));
    }
}

/* add_bias, sum_rows, gather and scatter-add with D = 37 (block + tail). */
TEST(row_ops) {
    ferry_backend *be = ferry_backend_cpu();
    enum { N = 5, D = 37, R = 6 };
    float x[N * D], b[D], y[N * D], acc[D], table[R * D], g[N * D];
    double ref[R * D];
    int32_t idx[N] = {4, 1, 4, 0, 5};
    ferry_gradcheck_fill(x, N * D, -1.0f, 1.0f, 8);
    ferry_gradcheck_fill(b, D, -1.0f, 1.0f, 9);
    memcpy(y, x, sizeof y);
    CHECK_OK(ferry_backend_add_bias(be, N, D, b, y));
    for (int i = 0; i < N * D; i++)
        ref[i] = (double)(x[i] + b[i % D]);
    CHECK_CLOSE("add_bias", y, ref, N * D, 0.0, 0.0);
    memcpy(acc, b, sizeof acc);
    CHECK_OK(ferry_backend_sum_rows(be, N, D, x, acc));
    for (int d = 0; d < D; d++) {
        float s = b[d];
        for (int n = 0; n < N; n++)
            s += x[n * D + d];
        ref[d] = (double)s; /* the same order: rows in sequence */
    }
    CHECK_CLOSE("sum_rows", acc, ref, D, 0.0, 0.0);
    ferry_gradcheck_fill(table, R * D, -1.0f, 1.0f, 10);
    CHECK_OK(ferry_backend_gather_rows(be, N, D, idx, table, g));
    for (int n = 0; n < N; n++)
        CHECK(memcmp(g + n * D, table + idx[n] * D, D * sizeof(float)) == 0);
    for (int i = 0; i < R * D; i++)
        ref[i] = (double)table[i];
    for (int n = 0; n < N; n++)
        for (int d = 0; d < D; d++)
            ref[idx[n] * D + d] = (double)((float)ref[idx[n] * D + d] + x[n * D + d]);
    CHECK_OK(ferry_backend_scatter_add_rows(be, N, D, idx, x, table));
    CHECK_CLOSE("scatter_add_rows (repeats accumulate)", table, ref, R * D, 0.0, 0.0);
}

/* A GEMM on two threads (ferry_cpu_set_gemm_width) against the same GEMM on one, bit
 * for bit: every transpose, alpha 1 and beta 0, alpha 0.75 and beta 1, row counts
 * around the cut (the multiple of 48 nearest half) and the decoder's shapes (a chunk of
 * 175 rows against 10,000 x 650 in parts), with leading dimensions wider than the rows.
 * That the two-thread runs were split is read off ferry_cpu_gemm_splits. */
typedef struct split_shape {
    int64_t M, N, K;
} split_shape;

/* C (M, N + 3) of one shape, transpose t (bits: ta, tb, beta 1), at the given width. */
static void gemm_at(const split_shape *sh, int t, const float *A, const float *B, float *C,
                    int width) {
    int64_t M = sh->M, N = sh->N, K = sh->K, pad = 3;
    int ta = t & 1, tb = (t >> 1) & 1;
    float alpha = (t >> 2) ? 0.75f : 1.0f, beta = (t >> 2) ? 1.0f : 0.0f;
    int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad;
    ferry_gradcheck_fill(C, M * (N + pad), -1.0f, 1.0f, 60 + (uint64_t)t);
    int prev = ferry_cpu_set_gemm_width(width);
    CHECK_OK(ferry_backend_gemm(ferry_backend_cpu(), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta,
                                C, N + pad));
    (void)ferry_cpu_set_gemm_width(prev);
}

static const split_shape split_shapes[] = {{96, 211, 900},   {97, 160, 1200}, {143, 133, 1400},
                                           {175, 1000, 650}, {401, 64, 800},  {175, 650, 1000}};
enum { SPLIT_PAD = 3, SPLIT_MAX = 1000 * 1003 + 3 * 1003 };

/* Every shape and transpose at width 2 against width 1; returns the splits made. */
static uint64_t split_all_shapes(void) {
    float *A = malloc(sizeof(float) * SPLIT_MAX * 2), *B = malloc(sizeof(float) * SPLIT_MAX * 2);
    float *C1 = malloc(sizeof(float) * SPLIT_MAX), *C2 = malloc(sizeof(float) * SPLIT_MAX);
    CHECK(A != NULL && B != NULL && C1 != NULL && C2 != NULL);
    ferry_gradcheck_fill(A, SPLIT_MAX * 2, -1.0f, 1.0f, 20);
    ferry_gradcheck_fill(B, SPLIT_MAX * 2, -1.0f, 1.0f, 40);
    uint64_t splits = 0;
    for (size_t si = 0; si < sizeof split_shapes / sizeof split_shapes[0]; si++) {
        const split_shape *sh = &split_shapes[si];
        size_t n = sizeof(float) * (size_t)(sh->M * (sh->N + SPLIT_PAD));
        for (int t = 0; t < 8; t++) {
            gemm_at(sh, t, A, B, C1, 1);
            uint64_t before = ferry_cpu_gemm_splits();
            gemm_at(sh, t, A, B, C2, 2);
            splits += ferry_cpu_gemm_splits() > before;
            if (memcmp(C1, C2, n) != 0) {
                fprintf(stderr, "M=%lld N=%lld K=%lld t=%d: the split GEMM differs\n",
                        (long long)sh->M, (long long)sh->N, (long long)sh->K, t);
                CHECK(0);
            }
        }
    }
    free(A);
    free(B);
    free(C1);
    free(C2);
    return splits;
}

static void *split_thread(void *arg) {
    *(uint64_t *)arg = split_all_shapes();
    return NULL;
}

TEST(gemm_split_rows_bit_for_bit) {
    ferry_cpu_set_threads(1);
    int ok = ferry__cpu_gemm_split_ok();
    if (!ok) /* the probe refused: every GEMM must then run whole, with the same results */
        fprintf(stderr,
                "  OpenBLAS's %s kernels change bits at a 48-row cut here: no GEMM "
                "is split, and that is what is checked\n",
                ferry_cpu_blas_kernels());
    uint64_t before = ferry_cpu_gemm_splits();
    uint64_t n = split_all_shapes();
    CHECK_EQ(n, ok ? 48u : 0u); /* every one of them is large enough */
    CHECK_EQ(ferry_cpu_gemm_splits() - before, n);
    /* Two threads splitting at once: one helper, so a GEMM that finds it busy runs
     * whole; every result in both threads still the one-thread one. */
    uint64_t other = 0;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, split_thread, &other) == 0);
    uint64_t mine = split_all_shapes();
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(mine + other <= 96u && (ok ? mine + other >= 1u : mine + other == 0u));
    /* Not split: 95 rows; a part of too little work (48 x 40 x 4000); width 1. */
    const split_shape small[] = {{95, 400, 400}, {100, 40, 4000}, {175, 1000, 650}};
    static float a[100 * 4000], b[650 * 1000], c[175 * 1000];
    before = ferry_cpu_gemm_splits();
    for (int i = 0; i < 3; i++) {
        int prev = ferry_cpu_set_gemm_width(i < 2 ? 2 : 1);
        CHECK_OK(ferry_backend_gemm(ferry_backend_cpu(), 0, 0, small[i].M, small[i].N, small[i].K,
                                    1.0f, a, small[i].K, b, small[i].N, 0.0f, c, small[i].N));
        (void)ferry_cpu_set_gemm_width(prev);
    }
    CHECK_EQ(ferry_cpu_gemm_splits(), before);
}

FERRY_TEST_MAIN(T(vmath_within_3_ulp) T(lstm_cell_matches_float64) T(xent_matches_float64)
                    T(elementwise_ops_all_lengths) T(row_ops) T(gemm_split_rows_bit_for_bit))
