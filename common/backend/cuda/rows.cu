/* rows.cu - row gathers (embedding lookup), scatter-adds (its gradient; atomicAdd,
 * so repeated ids accumulate in some order) and the inverted-dropout mask from the
 * same splitmix64 counter generator as ferry_rand_uniform, bit for bit. Index
 * arrays are device memory. */
#include "common/backend/cuda/ops.cuh"

__global__ static void k_gather(int64_t count, int64_t D, const int32_t *idx, const float *src,
                                float *dst) {
    FERRY_CUDA_FOR(i, count * D) dst[i] = src[(int64_t)idx[i / D] * D + i % D];
}

__global__ static void k_scatter_add(int64_t count, int64_t D, const int32_t *idx,
                                     const float *src, float *dst) {
    FERRY_CUDA_FOR(i, count * D) atomicAdd(&dst[(int64_t)idx[i / D] * D + i % D], src[i]);
}

/* ferry_rand_uniform (common/tensor/backend.c), the same integer steps. */
__device__ static inline float rand_uniform(uint64_t seed, uint64_t index) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

__global__ static void k_dropout(int64_t n, float p, float keep, uint64_t seed, uint64_t offset,
                                 float *mask) {
    FERRY_CUDA_FOR(i, n) mask[i] = rand_uniform(seed, offset + (uint64_t)i) >= p ? keep : 0.0f;
}

ferry_status ferry__cuda_gather_rows(ferry_backend *be, int64_t count, int64_t D,
                                     const int32_t *idx, const float *src, float *dst) {
    k_gather<<<ferry__cuda_blocks(count * D), FERRY_CUDA_THREADS, 0,
               ferry__cuda_of(be)->stream>>>(count, D, idx, src, dst);
    FERRY_CUDA_LAUNCHED(k_gather);
    return FERRY_OK;
}

ferry_status ferry__cuda_scatter_add_rows(ferry_backend *be, int64_t count, int64_t D,
                                          const int32_t *idx, const float *src, float *dst) {
    k_scatter_add<<<ferry__cuda_blocks(count * D), FERRY_CUDA_THREADS, 0,
                    ferry__cuda_of(be)->stream>>>(count, D, idx, src, dst);
    FERRY_CUDA_LAUNCHED(k_scatter_add);
    return FERRY_OK;
}

ferry_status ferry__cuda_dropout_mask(ferry_backend *be, int64_t n, float p, uint64_t seed,
                                      uint64_t offset, float *mask) {
    float keep = 1.0f / (1.0f - p); /* the CPU's float expression */
    k_dropout<<<ferry__cuda_blocks(n), FERRY_CUDA_THREADS, 0, ferry__cuda_of(be)->stream>>>(
        n, p, keep, seed, offset, mask);
    FERRY_CUDA_LAUNCHED(k_dropout);
    return FERRY_OK;
}
