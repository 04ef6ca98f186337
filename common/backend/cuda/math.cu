/* math.cu - elementwise kernels: fill, axpy, scale, mul, add_bias, and sum_rows
 * (one thread per column summing rows in order, so it rounds exactly like the CPU
 * loop). Grid-stride loops over 64-bit indices. */
#include "common/backend/cuda/ops.cuh"

__global__ static void k_fill(float *x, int64_t n, float v) {
    FERRY_CUDA_FOR(i, n) x[i] = v;
}

__global__ static void k_axpy(int64_t n, float alpha, const float *x, float *y) {
    FERRY_CUDA_FOR(i, n) y[i] = y[i] + alpha * x[i];
}

__global__ static void k_scale(int64_t n, float alpha, float *x) {
    FERRY_CUDA_FOR(i, n) x[i] *= alpha;
}

__global__ static void k_mul(int64_t n, const float *x, const float *y, float *out) {
    FERRY_CUDA_FOR(i, n) out[i] = x[i] * y[i];
}

/* y(N,D) += b(D). */
__global__ static void k_add_bias(int64_t N, int64_t D, const float *b, float *y) {
    FERRY_CUDA_FOR(i, N * D) y[i] += b[i % D];
}

/* out(D) += sum_n x(n, d), rows added in order. */
__global__ static void k_sum_rows(int64_t N, int64_t D, const float *x, float *out) {
    FERRY_CUDA_FOR(d, D) {
        float s = out[d];
        for (int64_t n = 0; n < N; n++)
            s += x[n * D + d];
        out[d] = s;
    }
}

#define LAUNCH_(kernel, n, ...)                                                                \
    do {                                                                                       \
        kernel<<<ferry__cuda_blocks(n), FERRY_CUDA_THREADS, 0, ferry__cuda_of(be)->stream>>>( \
            __VA_ARGS__);                                                                      \
        FERRY_CUDA_LAUNCHED(kernel);                                                           \
        return FERRY_OK;                                                                       \
    } while (0)

ferry_status ferry__cuda_fill(ferry_backend *be, float *x, int64_t n, float v) {
    LAUNCH_(k_fill, n, x, n, v);
}

ferry_status ferry__cuda_axpy(ferry_backend *be, int64_t n, float alpha, const float *x,
                              float *y) {
    LAUNCH_(k_axpy, n, n, alpha, x, y);
}

ferry_status ferry__cuda_scale(ferry_backend *be, int64_t n, float alpha, float *x) {
    LAUNCH_(k_scale, n, n, alpha, x);
}

ferry_status ferry__cuda_mul(ferry_backend *be, int64_t n, const float *x, const float *y,
                             float *out) {
    LAUNCH_(k_mul, n, n, x, y, out);
}

ferry_status ferry__cuda_add_bias(ferry_backend *be, int64_t N, int64_t D, const float *b,
                                  float *y) {
    LAUNCH_(k_add_bias, N * D, N, D, b, y);
}

ferry_status ferry__cuda_sum_rows(ferry_backend *be, int64_t N, int64_t D, const float *x,
                                  float *out) {
    LAUNCH_(k_sum_rows, D, N, D, x, out);
}
