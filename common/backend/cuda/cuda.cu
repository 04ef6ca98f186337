/* cuda.cu - the CUDA backend's lifetime and memory: create/destroy for device N
 * (a stream and a cuBLAS handle), a caching allocator over cudaMalloc (power-of-two
 * size classes, freed blocks go back to per-class lists, destroy releases all),
 * host<->device copies (large ones through a pinned staging buffer) and sync. The
 * op table points at the kernels in the other .cu files of this folder. */
#include <cudnn.h>
#include <stdlib.h>
#include <string.h>

#include "common/backend/cuda/common.cuh"
#include "common/backend/cuda/ops.cuh"

#define MIN_CLASS 8                   /* 256-byte blocks at least */
#define STAGE_THRESHOLD (256u << 10)  /* copies above this go through the staging buffer */
#define STAGE_BYTES ((size_t)8 << 20) /* pinned staging buffer size */

struct ferry__cuda_block {
    void *ptr;
    int cls;
    ferry__cuda_block *next;
};

ferry_status ferry__cuda_error(cudaError_t err, const char *what) {
    ferry_status st = err == cudaErrorMemoryAllocation ? FERRY_ERR_NOMEM : FERRY_ERR_BACKEND;
    (void)cudaGetLastError(); /* clear a non-sticky error so later calls are not blamed */
    return ferry_errorf(st, "CUDA: %s: %s", what, cudaGetErrorString(err));
}

/* ---- caching allocator ---- */

static int size_class(size_t nbytes) {
    int c = MIN_CLASS;
    while (c < MIN_CLASS + FERRY_CUDA_NCLASS - 1 && ((size_t)1 << c) < nbytes)
        c++;
    return c;
}

static size_t bucket_of(const ferry__cuda *cu, const void *ptr) {
    uintptr_t h = (uintptr_t)ptr >> 8;
    h ^= h >> 17;
    return (size_t)(h * 0x9E3779B97F4A7C15ull) & (cu->live_buckets - 1);
}

/* Returns every cached (free) block to the driver. Caller holds mu. */
static void release_cached(ferry__cuda *cu) {
    for (int c = 0; c < FERRY_CUDA_NCLASS; c++) {
        while (cu->free_list[c] != NULL) {
            ferry__cuda_block *b = cu->free_list[c];
            cu->free_list[c] = b->next;
            (void)cudaFree(b->ptr);
            free(b);
        }
    }
    cu->cached_bytes = 0;
}

ferry_status ferry__cuda_alloc(ferry_backend *be, size_t nbytes, void **out) {
    ferry__cuda *cu = ferry__cuda_of(be);
    int cls = size_class(nbytes);
    size_t size = (size_t)1 << cls;
    if (size < nbytes)
        return ferry_errorf(FERRY_ERR_NOMEM, "CUDA: cannot allocate %zu bytes", nbytes);
    pthread_mutex_lock(&cu->mu);
    ferry__cuda_block *b = cu->free_list[cls - MIN_CLASS];
    if (b != NULL) {
        cu->free_list[cls - MIN_CLASS] = b->next;
        cu->cached_bytes -= size;
    } else {
        b = (ferry__cuda_block *)malloc(sizeof *b);
        void *p = NULL;
        cudaError_t err = b ? cudaMalloc(&p, size) : cudaErrorMemoryAllocation;
        if (err == cudaErrorMemoryAllocation && b != NULL) {
            (void)cudaGetLastError();
            release_cached(cu); /* give the cache back and try once more */
            err = cudaMalloc(&p, size);
        }
        if (err != cudaSuccess) {
            free(b);
            pthread_mutex_unlock(&cu->mu);
            (void)cudaGetLastError();
            return ferry_errorf(err == cudaErrorMemoryAllocation ? FERRY_ERR_NOMEM
                                                                 : FERRY_ERR_BACKEND,
                                "CUDA: cannot allocate %zu bytes on device %d: %s", nbytes,
                                cu->device, cudaGetErrorString(err));
        }
        b->ptr = p;
        b->cls = cls;
    }
    size_t h = bucket_of(cu, b->ptr);
    b->next = cu->live[h];
    cu->live[h] = b;
    cu->live_bytes += size;
    pthread_mutex_unlock(&cu->mu);
    *out = b->ptr;
    return FERRY_OK;
}

void ferry__cuda_free(ferry_backend *be, void *ptr) {
    ferry__cuda *cu = ferry__cuda_of(be);
    pthread_mutex_lock(&cu->mu);
    ferry__cuda_block **pp = &cu->live[bucket_of(cu, ptr)];
    while (*pp != NULL && (*pp)->ptr != ptr)
        pp = &(*pp)->next;
    FERRY_ASSERT(*pp != NULL); /* freeing memory this backend did not allocate */
    ferry__cuda_block *b = *pp;
    *pp = b->next;
    /* Stream order makes reuse safe: a later op on this stream runs after earlier ones. */
    b->next = cu->free_list[b->cls - MIN_CLASS];
    cu->free_list[b->cls - MIN_CLASS] = b;
    cu->live_bytes -= (size_t)1 << b->cls;
    cu->cached_bytes += (size_t)1 << b->cls;
    pthread_mutex_unlock(&cu->mu);
}

/* ---- copies ---- */

/* One host<->device copy of n bytes through the pinned buffer, chunk by chunk. */
static ferry_status staged_copy(ferry__cuda *cu, void *dst, const void *src, size_t n,
                                ferry_copy_kind kind) {
    for (size_t off = 0; off < n; off += cu->staging_bytes) {
        size_t len = n - off < cu->staging_bytes ? n - off : cu->staging_bytes;
        if (kind == FERRY_COPY_HOST_TO_DEVICE) {
            memcpy(cu->staging, (const char *)src + off, len);
            FERRY_CUDA_CHECK(cudaMemcpyAsync((char *)dst + off, cu->staging, len,
                                             cudaMemcpyHostToDevice, cu->stream));
            FERRY_CUDA_CHECK(cudaStreamSynchronize(cu->stream));
        } else {
            FERRY_CUDA_CHECK(cudaMemcpyAsync(cu->staging, (const char *)src + off, len,
                                             cudaMemcpyDeviceToHost, cu->stream));
            FERRY_CUDA_CHECK(cudaStreamSynchronize(cu->stream));
            memcpy((char *)dst + off, cu->staging, len);
        }
    }
    return FERRY_OK;
}

ferry_status ferry__cuda_copy(ferry_backend *be, void *dst, const void *src, size_t n,
                              ferry_copy_kind kind) {
    ferry__cuda *cu = ferry__cuda_of(be);
    if (kind == FERRY_COPY_DEVICE_TO_DEVICE) { /* stream-ordered, no host wait */
        FERRY_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, cu->stream));
        return FERRY_OK;
    }
    if (kind != FERRY_COPY_HOST_TO_DEVICE && kind != FERRY_COPY_DEVICE_TO_HOST)
        return ferry_errorf(FERRY_ERR_INVALID, "CUDA copy: unknown kind %d", (int)kind);
    if (n > STAGE_THRESHOLD) {
        pthread_mutex_lock(&cu->mu);
        ferry_status st = FERRY_OK;
        if (cu->staging == NULL) {
            cudaError_t err = cudaMallocHost(&cu->staging, STAGE_BYTES);
            if (err == cudaSuccess)
                cu->staging_bytes = STAGE_BYTES;
            else
                st = ferry__cuda_error(err, "cudaMallocHost(staging)");
        }
        if (st == FERRY_OK)
            st = staged_copy(cu, dst, src, n, kind);
        pthread_mutex_unlock(&cu->mu);
        return st;
    }
    FERRY_CUDA_CHECK(cudaMemcpyAsync(dst, src, n,
                                     kind == FERRY_COPY_HOST_TO_DEVICE ? cudaMemcpyHostToDevice
                                                                       : cudaMemcpyDeviceToHost,
                                     cu->stream));
    FERRY_CUDA_CHECK(cudaStreamSynchronize(cu->stream));
    return FERRY_OK;
}

static ferry_status cuda_sync(ferry_backend *be) {
    FERRY_CUDA_CHECK(cudaStreamSynchronize(ferry__cuda_of(be)->stream));
    return FERRY_OK;
}

/* ---- lifetime ---- */

static void cuda_destroy(ferry_backend *be) {
    ferry__cuda *cu = ferry__cuda_of(be);
    if (cu != NULL) {
        (void)cudaSetDevice(cu->device);
        if (cu->stream != NULL)
            (void)cudaStreamSynchronize(cu->stream);
        release_cached(cu);
        for (size_t h = 0; cu->live != NULL && h < cu->live_buckets; h++) {
            while (cu->live[h] != NULL) { /* leaked by the caller; reclaim anyway */
                ferry__cuda_block *b = cu->live[h];
                cu->live[h] = b->next;
                (void)cudaFree(b->ptr);
                free(b);
            }
        }
        free(cu->live);
        if (cu->staging != NULL)
            (void)cudaFreeHost(cu->staging);
        if (cu->blas != NULL)
            (void)cublasDestroy(cu->blas);
        if (cu->stream != NULL)
            (void)cudaStreamDestroy(cu->stream);
        pthread_mutex_destroy(&cu->mu);
        free(cu);
    }
    free(be);
}

/* Filled by name: the compute ops from FERRY_BACKEND_OP_MAP, whatever their order. */
static ferry_backend_ops cuda_ops_make(void) {
    ferry_backend_ops o = {};
    o.name = "cuda";
    o.is_host = 0;
    o.alloc = ferry__cuda_alloc;
    o.free = ferry__cuda_free;
    o.copy = ferry__cuda_copy;
    o.sync = cuda_sync;
    o.destroy = cuda_destroy;
#define FERRY_CUDA_OP_ENTRY_(op, params, args, empty, check) o.op = ferry__cuda_##op;
    FERRY_BACKEND_OP_MAP(FERRY_CUDA_OP_ENTRY_)
#undef FERRY_CUDA_OP_ENTRY_
    return o;
}

static const ferry_backend_ops cuda_ops = cuda_ops_make();

/* Creates the backend on device ordinal `device`. FERRY_ERR_UNSUPPORTED when the
 * machine has no such device (no driver, no GPU, ordinal out of range). */
extern "C" ferry_status ferry__backend_cuda_create(int device, ferry_backend **out) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return ferry_errorf(FERRY_ERR_UNSUPPORTED, "cuda:%d: no usable CUDA device (%s)", device,
                            cudaGetErrorString(err));
    }
    if (device >= count)
        return ferry_errorf(FERRY_ERR_UNSUPPORTED, "cuda:%d: this machine has %d CUDA device%s",
                            device, count, count == 1 ? "" : "s");
    ferry_backend *be = (ferry_backend *)calloc(1, sizeof *be);
    ferry__cuda *cu = (ferry__cuda *)calloc(1, sizeof *cu);
    if (be == NULL || cu == NULL) {
        free(be);
        free(cu);
        return FERRY_NOMEM();
    }
    be->ops = &cuda_ops;
    be->device = device;
    be->impl = cu;
    cu->device = device;
    pthread_mutex_init(&cu->mu, NULL);
    cu->live_buckets = 4096;
    cu->live = (ferry__cuda_block **)calloc(cu->live_buckets, sizeof *cu->live);
    ferry_status st = cu->live != NULL ? FERRY_OK : FERRY_NOMEM();
    if (st == FERRY_OK && (err = cudaSetDevice(device)) != cudaSuccess)
        st = ferry__cuda_error(err, "cudaSetDevice");
    if (st == FERRY_OK &&
        (err = cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking)) != cudaSuccess)
        st = ferry__cuda_error(err, "cudaStreamCreate");
    if (st == FERRY_OK) {
        cublasStatus_t bs = cublasCreate(&cu->blas);
        if (bs == CUBLAS_STATUS_SUCCESS)
            bs = cublasSetStream(cu->blas, cu->stream);
        if (bs != CUBLAS_STATUS_SUCCESS)
            st = ferry_errorf(bs == CUBLAS_STATUS_ALLOC_FAILED ? FERRY_ERR_NOMEM
                                                               : FERRY_ERR_BACKEND,
                              "cuBLAS: cannot create a handle on device %d: %s", device,
                              cublasGetStatusString(bs));
    }
    if (st != FERRY_OK) {
        cuda_destroy(be);
        return st;
    }
    cudaDeviceProp prop;
    int rt = 0, blas_ver = 0;
    (void)cudaGetDeviceProperties(&prop, device);
    (void)cudaRuntimeGetVersion(&rt);
    (void)cublasGetVersion(cu->blas, &blas_ver);
    FERRY_LOG_INFO("backend cuda:%d: %s (sm_%d%d, %.1f GiB), CUDA runtime %d, cuBLAS %d, "
                   "cuDNN %zu (LSTM runs on cuBLAS + fused kernels)",
                   device, prop.name, prop.major, prop.minor,
                   (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), rt, blas_ver,
                   (size_t)cudnnGetVersion());
    *out = be;
    return FERRY_OK;
}
