/* common.cuh - what every CUDA backend file shares: the backend's private state,
 * FERRY_CUDA_CHECK / FERRY_CUDA_LAUNCHED for turning CUDA errors into ferry_status,
 * and the launch geometry helper. Internal to common/backend/cuda/. */
#ifndef FERRY_CUDA_COMMON_CUH
#define FERRY_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <pthread.h>

extern "C" {
#include "common/tensor/backend-impl.h"
#include "common/core/log.h"
}

#define FERRY_CUDA_NCLASS 48 /* size classes 2^8 .. 2^55 bytes */

typedef struct ferry__cuda_block ferry__cuda_block;

/* Backend-private state, be->impl. */
typedef struct ferry__cuda {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    pthread_mutex_t mu;                         /* allocator and staging buffer */
    ferry__cuda_block *free_list[FERRY_CUDA_NCLASS]; /* cached blocks per size class */
    ferry__cuda_block **live;                   /* hash of live blocks by pointer */
    size_t live_buckets;
    size_t cached_bytes, live_bytes;
    void *staging;                              /* pinned host buffer, staging_bytes */
    size_t staging_bytes;
} ferry__cuda;

/* The state of be, with be's device made current for the calling thread (cheap when it
 * already is): every op starts here, so any thread may drive a cuda:N backend. */
static inline ferry__cuda *ferry__cuda_of(ferry_backend *be) {
    ferry__cuda *cu = (ferry__cuda *)be->impl;
    (void)cudaSetDevice(cu->device);
    return cu;
}

/* An error status with the CUDA message attached; cudaErrorMemoryAllocation is NOMEM. */
ferry_status ferry__cuda_error(cudaError_t err, const char *what);

/* Evaluates a CUDA runtime call and returns its error as a ferry_status. */
#define FERRY_CUDA_CHECK(call)                                                   \
    do {                                                                         \
        cudaError_t ferry_err_ = (call);                                         \
        if (ferry_err_ != cudaSuccess)                                           \
            return ferry__cuda_error(ferry_err_, #call);                         \
    } while (0)

/* After every kernel launch: reports a bad launch configuration or a sticky error. */
#define FERRY_CUDA_LAUNCHED(kernel) FERRY_CUDA_CHECK(cudaGetLastError())

/* Blocks of 256 threads covering n elements, capped (kernels use grid-stride loops). */
static inline unsigned ferry__cuda_blocks(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

#define FERRY_CUDA_THREADS 256

/* Grid-stride loop over [0, n) with 64-bit indices. */
#define FERRY_CUDA_FOR(i, n)                                                               \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);              \
         i += (int64_t)blockDim.x * gridDim.x)

/* Device scratch from the caching allocator (freed with ferry_backend_free). */
ferry_status ferry__cuda_alloc(ferry_backend *be, size_t nbytes, void **out);
void ferry__cuda_free(ferry_backend *be, void *ptr);
/* Host → device copy on the backend's stream, synchronous on return. */
ferry_status ferry__cuda_copy(ferry_backend *be, void *dst, const void *src, size_t n,
                              ferry_copy_kind kind);

#endif /* FERRY_CUDA_COMMON_CUH */
