/* gemm_limit.c - the compute limit of a server's part of a training step: OpenBLAS
 * sgemm on one thread, timed on exactly the decoder GEMMs ferry-ps runs per rank-step
 * for a vocabulary slice of V_s rows (forward logits, then dW and dh in backward),
 * best of 7. bench/cpu_bench.sh sets the servers' CPU per rank-step beside it.
 * Prints one line: "ms GFLOP GFLOP/s".
 *   gemm_limit N H V_s      (N = batch x bptt rows, H the hidden size) */
#include <stdio.h>
#include <stdlib.h>

#include "bench/bench_gemm.h"
#include "ferry/backend.h" /* ferry_cpu_set_threads */

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: gemm_limit N H V_s\n");
        return 2;
    }
    int64_t N = atoll(argv[1]), H = atoll(argv[2]), V = atoll(argv[3]);
    if (N < 1 || H < 1 || V < 1) {
        fprintf(stderr, "gemm_limit: N, H and V_s must be positive\n");
        return 2;
    }
    ferry_cpu_set_threads(1); /* as ferry-ps computes: one BLAS thread per call */
    gemm_shape g[3] = {
        {0, 1, N, V, H, 1}, /* logits = h W_s^T */
        {1, 0, V, H, N, 1}, /* dW_s = dz^T h */
        {0, 0, N, H, V, 1}, /* dh = dz W_s */
    };
    double flops, sec = time_gemms(g, 3, 7, &flops);
    printf("%.2f %.3f %.1f\n", sec * 1e3, flops / 1e9, flops / sec / 1e9);
    return 0;
}
