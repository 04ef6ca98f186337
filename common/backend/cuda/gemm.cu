/* gemm.cu - row-major GEMM through cuBLAS (column-major): a row-major (M,N) matrix
 * is the column-major (N,M) transpose, so C^T = op(B)^T op(A)^T is one cublasSgemm
 * with the operands swapped, the same op flags, and the row strides as leading
 * dimensions. FP32 math (no TF32), matching the CPU oracle within rounding. */
#include <limits.h>

#include "common/backend/cuda/ops.cuh"

/* C(M,N) = beta == 0 ? 0 : beta * C, the K = 0 case (BLAS leaves it to convention). */
__global__ static void k_scale_c(int64_t M, int64_t N, float beta, float *C, int64_t ldc) {
    FERRY_CUDA_FOR(i, M * N) {
        float *c = C + (i / N) * ldc + i % N;
        *c = beta == 0.0f ? 0.0f : beta * *c;
    }
}

ferry_status ferry__cuda_gemm(ferry_backend *be, int ta, int tb, int64_t M, int64_t N, int64_t K,
                              float alpha, const float *A, int64_t lda, const float *B,
                              int64_t ldb, float beta, float *C, int64_t ldc) {
    ferry__cuda *cu = ferry__cuda_of(be);
    if (K == 0) {
        k_scale_c<<<ferry__cuda_blocks(M * N), FERRY_CUDA_THREADS, 0, cu->stream>>>(M, N, beta,
                                                                                     C, ldc);
        FERRY_CUDA_LAUNCHED(k_scale_c);
        return FERRY_OK;
    }
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
        ldc > INT_MAX)
        return ferry_errorf(FERRY_ERR_RANGE, "CUDA gemm: %lldx%lldx%lld exceeds cuBLAS int sizes",
                            (long long)M, (long long)N, (long long)K);
    cublasStatus_t bs = cublasSgemm(cu->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M, (int)K, &alpha,
                                    B, (int)ldb, A, (int)lda, &beta, C, (int)ldc);
    if (bs != CUBLAS_STATUS_SUCCESS)
        return ferry_errorf(FERRY_ERR_BACKEND, "cuBLAS sgemm (M=%lld N=%lld K=%lld): %s",
                            (long long)M, (long long)N, (long long)K, cublasGetStatusString(bs));
    FERRY_CUDA_LAUNCHED(cublasSgemm);
    return FERRY_OK;
}
