/* lstm.cu - the fused LSTM cell, one thread per (row, hidden unit): activations and
 * the state update forward, the pre-activation gradients backward. The GEMMs around
 * it are cuBLAS calls made by common/nn/lstm.c. Same formulas as the CPU oracle
 * (common/backend/cpu/lstm.c) with the CUDA math library's expf/tanhf. */
#include "common/backend/cuda/ops.cuh"

__device__ static inline float sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}

/* gates (N,4H): pre-activations in, activations out; c_prev, c, h (N,H). */
__global__ static void k_cell_forward(int64_t N, int64_t H, float *gates, const float *c_prev,
                                      float *c, float *h) {
    FERRY_CUDA_FOR(idx, N * H) {
        int64_t n = idx / H, j = idx % H;
        float *z = gates + n * 4 * H;
        float i = sigmoid(z[j]);
        float f = sigmoid(z[H + j]);
        float g = tanhf(z[2 * H + j]);
        float o = sigmoid(z[3 * H + j]);
        float cc = f * c_prev[idx] + i * g;
        z[j] = i;
        z[H + j] = f;
        z[2 * H + j] = g;
        z[3 * H + j] = o;
        c[idx] = cc;
        h[idx] = o * tanhf(cc);
    }
}

/* dc (N,H): gradient reaching c_t in, gradient for c_{t-1} out; dgates (N,4H) written. */
__global__ static void k_cell_backward(int64_t N, int64_t H, const float *gates,
                                       const float *c_prev, const float *c, const float *dh,
                                       float *dc, float *dgates) {
    FERRY_CUDA_FOR(idx, N * H) {
        int64_t n = idx / H, j = idx % H;
        const float *a = gates + n * 4 * H;
        float *dz = dgates + n * 4 * H;
        float i = a[j], f = a[H + j], g = a[2 * H + j], o = a[3 * H + j];
        float tc = tanhf(c[idx]);
        float d_h = dh[idx];
        float dct = dc[idx] + d_h * o * (1.0f - tc * tc);
        dz[j] = dct * g * i * (1.0f - i);
        dz[H + j] = dct * c_prev[idx] * f * (1.0f - f);
        dz[2 * H + j] = dct * i * (1.0f - g * g);
        dz[3 * H + j] = d_h * tc * o * (1.0f - o);
        dc[idx] = dct * f;
    }
}

ferry_status ferry__cuda_lstm_cell_forward(ferry_backend *be, int64_t N, int64_t H, float *gates,
                                           const float *c_prev, float *c, float *h) {
    k_cell_forward<<<ferry__cuda_blocks(N * H), FERRY_CUDA_THREADS, 0,
                     ferry__cuda_of(be)->stream>>>(N, H, gates, c_prev, c, h);
    FERRY_CUDA_LAUNCHED(k_cell_forward);
    return FERRY_OK;
}

ferry_status ferry__cuda_lstm_cell_backward(ferry_backend *be, int64_t N, int64_t H,
                                            const float *gates, const float *c_prev,
                                            const float *c, const float *dh, float *dc,
                                            float *dgates) {
    k_cell_backward<<<ferry__cuda_blocks(N * H), FERRY_CUDA_THREADS, 0,
                      ferry__cuda_of(be)->stream>>>(N, H, gates, c_prev, c, dh, dc, dgates);
    FERRY_CUDA_LAUNCHED(k_cell_backward);
    return FERRY_OK;
}
