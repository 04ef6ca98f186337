/* xent.cu - softmax cross-entropy and the sharded-softmax partials: one block per
 * row reduces the max (float) and the sum of exp(z - max) (double) in shared memory,
 * the same arithmetic as common/backend/cpu/xent.c up to expf rounding and the order
 * of the double sum. The gradients are elementwise kernels. Targets, factors and
 * row scales are device arrays, as every pointer of a backend op. */
#include <limits.h>

#include "common/backend/cuda/ops.cuh"

/* Block-wide max; every thread gets the result. */
__device__ static float block_max(float v) {
    __shared__ float sh[FERRY_CUDA_THREADS];
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads(); /* the next reduction may overwrite sh */
    return r;
}

/* Block-wide double sum; every thread gets the result. */
__device__ static double block_sum(double v) {
    __shared__ double sh[FERRY_CUDA_THREADS];
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

/* Row z(V) -> e = exp(z - max) in place; returns max through *mx, the sum of e. */
__device__ static double row_max_exp(float *z, int64_t V, float *mx) {
    float m = -INFINITY;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
        m = fmaxf(m, z[v]);
    m = block_max(m);
    double s = 0.0;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
        float e = expf(z[v] - m);
        z[v] = e;
        s += (double)e;
    }
    *mx = m;
    return block_sum(s);
}

__global__ static void k_xent_forward(int64_t V, float *logits, const int32_t *targets,
                                      float *loss_rows) {
    float *z = logits + (int64_t)blockIdx.x * V; /* (V) logits in, probabilities out */
    float zt = z[targets[blockIdx.x]];           /* read before any thread overwrites */
    float mx;
    double sum = row_max_exp(z, V, &mx);
    float inv = (float)(1.0 / sum);
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
        z[v] *= inv;
    if (threadIdx.x == 0)
        loss_rows[blockIdx.x] = (float)(log(sum) + (double)mx - (double)zt);
}

__global__ static void k_xent_backward(int64_t N, int64_t V, float *p, const int32_t *targets,
                                       float scale) {
    FERRY_CUDA_FOR(i, N * V) {
        float g = p[i];
        if (i % V == targets[i / V])
            g -= 1.0f;
        p[i] = g * scale;
    }
}

__global__ static void k_softmax_partials(int64_t V, float *z, const int32_t *targets,
                                          float *row_max, double *row_sumexp,
                                          float *target_logit) {
    float *zr = z + (int64_t)blockIdx.x * V; /* (V) logits in, exp(z - max) out */
    int32_t t = targets[blockIdx.x];
    float zt = t >= 0 ? zr[t] : 0.0f;
    float mx;
    double sum = row_max_exp(zr, V, &mx);
    if (threadIdx.x == 0) {
        target_logit[blockIdx.x] = zt;
        row_max[blockIdx.x] = mx;
        row_sumexp[blockIdx.x] = sum;
    }
}

__global__ static void k_softmax_grad(int64_t N, int64_t V, float *e, const float *factor,
                                      const int32_t *targets, const float *row_scale,
                                      float scale) {
    FERRY_CUDA_FOR(i, N * V) {
        int64_t n = i / V;
        float p = e[i] * factor[n];
        if (targets[n] >= 0 && i % V == targets[n])
            p -= 1.0f;
        p *= row_scale != NULL ? row_scale[n] * scale : scale;
        e[i] = p;
    }
}

static ferry_status check_rows(int64_t N) {
    if (N > INT_MAX)
        return ferry_errorf(FERRY_ERR_RANGE, "CUDA softmax: %lld rows exceed the grid",
                            (long long)N);
    return FERRY_OK;
}

ferry_status ferry__cuda_xent_forward(ferry_backend *be, int64_t N, int64_t V, float *logits,
                                      const int32_t *targets, float *loss_rows) {
    ferry_status st = check_rows(N);
    if (st != FERRY_OK)
        return st;
    k_xent_forward<<<(unsigned)N, FERRY_CUDA_THREADS, 0, ferry__cuda_of(be)->stream>>>(
        V, logits, targets, loss_rows);
    FERRY_CUDA_LAUNCHED(k_xent_forward);
    return FERRY_OK;
}

ferry_status ferry__cuda_xent_backward(ferry_backend *be, int64_t N, int64_t V, float *probs,
                                       const int32_t *targets, float scale) {
    k_xent_backward<<<ferry__cuda_blocks(N * V), FERRY_CUDA_THREADS, 0,
                      ferry__cuda_of(be)->stream>>>(N, V, probs, targets, scale);
    FERRY_CUDA_LAUNCHED(k_xent_backward);
    return FERRY_OK;
}

ferry_status ferry__cuda_softmax_partials(ferry_backend *be, int64_t N, int64_t V, float *z,
                                          const int32_t *targets, float *row_max,
                                          double *row_sumexp, float *target_logit) {
    ferry_status st = check_rows(N);
    if (st != FERRY_OK)
        return st;
    k_softmax_partials<<<(unsigned)N, FERRY_CUDA_THREADS, 0, ferry__cuda_of(be)->stream>>>(
        V, z, targets, row_max, row_sumexp, target_logit);
    FERRY_CUDA_LAUNCHED(k_softmax_partials);
    return FERRY_OK;
}

ferry_status ferry__cuda_softmax_grad(ferry_backend *be, int64_t N, int64_t V, float *e,
                                      const float *factor, const int32_t *targets,
                                      const float *row_scale, float scale) {
    k_softmax_grad<<<ferry__cuda_blocks(N * V), FERRY_CUDA_THREADS, 0,
                     ferry__cuda_of(be)->stream>>>(N, V, e, factor, targets, row_scale, scale);
    FERRY_CUDA_LAUNCHED(k_softmax_grad);
    return FERRY_OK;
}
