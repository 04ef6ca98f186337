/* step_bench.c - the local trainer's speed against the machine's GEMM limit.
 * For each configuration (PTB small and medium by default) it times full training
 * steps (forward, backward, clip, SGD step) of ferry's LM on PTB-sized random
 * windows, and, in the same run, OpenBLAS sgemm alone on exactly the GEMM shapes
 * one step performs. It reports tokens/s, the step's achieved GFLOP/s (FLOPs
 * counted analytically) and that as a fraction of the sgemm rate on those shapes.
 * Usage: step_bench [--threads N] [--steps N] [--config small|medium|all] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "common/backend/cpu/cpu.h"
#include "bench/bench_gemm.h"
#include "bench/bench_util.h"
#include "common/core/log.h"
#include "ferry/optim.h"
#include "worker/model-impl.h" /* the model's fields */

/* Median seconds per full training step of the model. */
static int time_steps(const bench_config *c, int steps, double *sec) {
    ferry_backend *be = ferry_backend_cpu();
    ferry_lm_config mc = {c->V, c->E, c->H, c->L, 0.0f, 0.1f, 0.0f, 1};
    ferry_lm *lm = NULL;
    ferry_optim *opt = NULL;
    ferry_ctx *ctx = NULL;
    ferry_optim_config oc = ferry_optim_defaults(FERRY_OPTIM_SGD);
    oc.lr = 0.1;
    if (ferry_lm_create(be, &mc, &lm) != FERRY_OK || ferry_optim_create(&lm->P, &oc, &opt) ||
        ferry_ctx_create(be, &ctx) != FERRY_OK) {
        fprintf(stderr, "step_bench: setup failed: %s\n", ferry_error_last());
        return 1;
    }
    int64_t n = c->T * c->B;
    int32_t *ids = malloc((size_t)(n + c->B) * sizeof *ids);
    for (int64_t i = 0; i < n + c->B; i++)
        ids[i] = (int32_t)(ferry_rand_uniform(11, (uint64_t)i) * (float)c->V) % (int32_t)c->V;
    ferry_shape s = ferry_shape_2d(c->T, c->B);
    ferry_tensor in = ferry_tensor_wrap(be, FERRY_DTYPE_I32, s, ids);
    ferry_tensor tg = ferry_tensor_wrap(be, FERRY_DTYPE_I32, s, ids + c->B);
    double *t = malloc((size_t)steps * sizeof *t);
    int rc = 0;
    for (int r = -3; r < steps && rc == 0; r++) {
        double t0 = ferry_now(), sum = 0.0, sumsq = 0.0, norm = 0.0;
        ferry_tensor *loss;
        float coef = 1.0f;
        ferry_ctx_reset(ctx, (uint64_t)(r + 10));
        ferry_status st = ferry_lm_forward(lm, ctx, NULL, &in, &tg, 1.0f / (float)c->B, &loss, &sum);
        if (st == FERRY_OK)
            st = ferry_ctx_backward(ctx, loss);
        ferry_grads *G = ferry_ctx_grads(ctx, &lm->P);
        if (st == FERRY_OK)
            st = ferry_grads_sumsq(G, &sumsq);
        ferry_clip_coef(sumsq, 5.0f, &coef, &norm);
        if (st == FERRY_OK)
            st = ferry_optim_step(opt, &lm->P, G, coef);
        if (st != FERRY_OK) {
            fprintf(stderr, "step_bench: step failed: %s\n", ferry_error_last());
            rc = 1;
        }
        if (r >= 0)
            t[r] = ferry_now() - t0;
    }
    *sec = rc ? 0.0 : bench_median(t, steps);
    free(t);
    free(ids);
    ferry_ctx_destroy(ctx);
    ferry_optim_destroy(opt);
    ferry_lm_destroy(lm);
    return rc;
}

int main(int argc, char **argv) {
    ferry_cpu_ensure_blas_kernels(argv);
    int threads = 1, steps = 20;
    const char *which = "all";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--threads") == 0)
            threads = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--steps") == 0)
            steps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--config") == 0)
            which = argv[i + 1];
        else {
            fprintf(stderr, "usage: step_bench [--threads N] [--steps N] [--config "
                            "small|medium|all]\n");
            return 2;
        }
    }
    if (threads < 1 || steps < 3) {
        fprintf(stderr, "step_bench: --threads >= 1 and --steps >= 3\n");
        return 2;
    }
    ferry_log_init("step_bench");
    ferry_cpu_set_threads(threads);
    static const bench_config configs[] = {
        {"small", 10000, 200, 200, 2, 20, 20},
        {"medium", 10000, 650, 650, 2, 35, 20},
    };
    char machine[512];
    bench_machine(machine, sizeof machine);
    printf("machine: %s; OpenBLAS %s kernels, %d thread(s); step: median of %d; sgemm on "
           "the step's shapes: best of %d\n",
           machine, openblas_get_corename(), threads, steps, steps);
    printf("%-7s %10s %10s %12s %12s %9s\n", "config", "step ms", "tokens/s", "step GF/s",
           "sgemm GF/s", "fraction");
    int rc = 0;
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        const bench_config *c = &configs[i];
        if (strcmp(which, "all") != 0 && strcmp(which, c->name) != 0)
            continue;
        gemm_shape g[64];
        int n = step_gemms(c, g);
        double gemm_flops, gemm_s, step_s;
        gemm_s = time_gemms(g, n, steps, &gemm_flops);
        if (time_steps(c, steps, &step_s) != 0) {
            rc = 1;
            continue;
        }
        ferry_lm_config mc = {c->V, c->E, c->H, c->L, 0.0f, 0.1f, 0.0f, 1};
        double flops = ferry_lm_step_flops(&mc, c->T, c->B);
        double step_gf = flops / step_s * 1e-9, gemm_gf = gemm_flops / gemm_s * 1e-9;
        printf("%-7s %10.2f %10.0f %12.2f %12.2f %8.1f%%\n", c->name, step_s * 1e3,
               (double)(c->T * c->B) / step_s, step_gf, gemm_gf, 100.0 * step_gf / gemm_gf);
    }
    return rc;
}
