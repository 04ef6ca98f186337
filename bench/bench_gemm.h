/* bench_gemm.h - the GEMMs of one LM training step and OpenBLAS sgemm timed on
 * exactly those shapes: the compute limit the benchmarks measure a step against.
 * Header-only (static functions), shared by step_bench and pipe_bench. */
#ifndef FERRY_BENCH_GEMM_H
#define FERRY_BENCH_GEMM_H

#include <stdint.h>
#include <stdlib.h>

#include <cblas.h>

#include "common/core/log.h"
#include "common/tensor/backend.h"
#include "ferry/tensor.h"

typedef struct bench_config {
    const char *name;
    int64_t V, E, H;
    int L;
    int64_t T, B;
} bench_config;

typedef struct gemm_shape {
    int ta, tb;
    int64_t M, N, K;
    int reps; /* times per step */
} gemm_shape;

/* The GEMMs of one training step, as common/nn/{lstm,linear}.c issue them. */
static inline int step_gemms(const bench_config *c, gemm_shape *g) {
    int n = 0;
    int64_t N = c->T * c->B, H = c->H;
    for (int l = 0; l < c->L; l++) {
        int64_t C = l == 0 ? c->E : H;
        g[n++] = (gemm_shape){0, 1, N, 4 * H, C, 1};          /* x W_ih^T, all steps */
        g[n++] = (gemm_shape){0, 1, c->B, 4 * H, H, (int)c->T}; /* h W_hh^T per step */
        g[n++] = (gemm_shape){0, 0, c->B, H, 4 * H, (int)c->T}; /* dgates W_hh per step */
        g[n++] = (gemm_shape){1, 0, 4 * H, C, N, 1};          /* dW_ih = dG^T X */
        g[n++] = (gemm_shape){1, 0, 4 * H, H, N, 1};          /* dW_hh = dG^T H_prev */
        g[n++] = (gemm_shape){0, 0, N, C, 4 * H, 1};          /* dX = dG W_ih */
    }
    g[n++] = (gemm_shape){0, 1, N, c->V, H, 1}; /* logits = y W^T */
    g[n++] = (gemm_shape){1, 0, c->V, H, N, 1}; /* dW = dz^T y */
    g[n++] = (gemm_shape){0, 0, N, H, c->V, 1}; /* dy = dz W */
    return n;
}

static inline float *rand_buf(int64_t n) {
    float *p = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        p[i] = ferry_rand_uniform(7, (uint64_t)i) - 0.5f;
    return p;
}

/* Seconds for one step's worth of sgemm calls: the best of `trials`, since this is
 * the limit the step is measured against (the step itself is a median). */
static inline double time_gemms(const gemm_shape *g, int n, int trials, double *flops) {
    int64_t maxa = 0, maxb = 0, maxc = 0;
    *flops = 0.0;
    for (int i = 0; i < n; i++) {
        int64_t a = g[i].M * g[i].K, b = g[i].K * g[i].N, c = g[i].M * g[i].N;
        maxa = a > maxa ? a : maxa;
        maxb = b > maxb ? b : maxb;
        maxc = c > maxc ? c : maxc;
        *flops += 2.0 * (double)g[i].M * (double)g[i].N * (double)g[i].K * g[i].reps;
    }
    float *A = rand_buf(maxa), *B = rand_buf(maxb), *C = rand_buf(maxc);
    double *t = malloc((size_t)trials * sizeof *t);
    for (int r = -2; r < trials; r++) {
        double t0 = ferry_now();
        for (int i = 0; i < n; i++) {
            const gemm_shape *s = &g[i];
            for (int k = 0; k < s->reps; k++)
                cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans,
                            s->tb ? CblasTrans : CblasNoTrans, (blasint)s->M, (blasint)s->N,
                            (blasint)s->K, 1.0f, A, (blasint)(s->ta ? s->M : s->K), B,
                            (blasint)(s->tb ? s->K : s->N), 0.0f, C, (blasint)s->N);
        }
        if (r >= 0)
            t[r] = ferry_now() - t0;
    }
    double best = t[0];
    for (int r = 1; r < trials; r++)
        best = t[r] < best ? t[r] : best;
    free(t);
    free(A);
    free(B);
    free(C);
    return best;
}

#endif /* FERRY_BENCH_GEMM_H */
