/* sumsq.cu - sum of squares accumulated in double: a fixed grid writes one double
 * partial per block, one block adds the partials in order, and the total comes back
 * to the host. No atomics, so the result is the same on every run. */
#include "common/backend/cuda/ops.cuh"

#define SUMSQ_BLOCKS 1024

/* Tree sum of one double per thread in shared memory; thread 0 gets the total. */
__device__ static double block_sum(double v) {
    __shared__ double sh[FERRY_CUDA_THREADS];
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    return sh[0];
}

__global__ static void k_sumsq_partial(int64_t n, const float *x, double *partial) {
    double s = 0.0;
    FERRY_CUDA_FOR(i, n) s += (double)x[i] * (double)x[i];
    s = block_sum(s);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = s;
}

__global__ static void k_sumsq_final(int nparts, const double *partial, double *out) {
    double s = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x)
        s += partial[i];
    s = block_sum(s);
    if (threadIdx.x == 0)
        *out = s;
}

ferry_status ferry__cuda_sumsq(ferry_backend *be, int64_t n, const float *x, double *out) {
    ferry__cuda *cu = ferry__cuda_of(be);
    unsigned blocks = ferry__cuda_blocks(n);
    blocks = blocks > SUMSQ_BLOCKS ? SUMSQ_BLOCKS : blocks;
    double *scratch; /* (blocks) partials, then the total */
    ferry_status st = ferry__cuda_alloc(be, (blocks + 1) * sizeof(double), (void **)&scratch);
    if (st != FERRY_OK)
        return st;
    k_sumsq_partial<<<blocks, FERRY_CUDA_THREADS, 0, cu->stream>>>(n, x, scratch);
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) {
        k_sumsq_final<<<1, FERRY_CUDA_THREADS, 0, cu->stream>>>((int)blocks, scratch,
                                                               scratch + blocks);
        err = cudaGetLastError();
    }
    st = err == cudaSuccess
             ? ferry__cuda_copy(be, out, scratch + blocks, sizeof(double),
                                FERRY_COPY_DEVICE_TO_HOST)
             : ferry__cuda_error(err, "sumsq kernel launch");
    ferry__cuda_free(be, scratch);
    return st;
}
