/* backend.h - where tensors live and ops run: "cpu" (OpenBLAS plus vectorised loops)
 * or, in a build with the CUDA backend (ferry/cuda.h), "cuda[:N]". A backend owns
 * memory; tensors (ferry/tensor.h), parameter blocks (ferry/params.h) and autograd
 * contexts (ferry/autograd.h) are made on one.
 *
 *     ferry_backend *be;
 *     ferry_backend_create("cpu", &be);       // or ferry_backend_cpu()
 *     ...
 *     ferry_backend_destroy(be);
 *
 * Thread-safety: a backend may be used by one thread at a time per stream; the CPU
 * backend is reentrant. */
#ifndef FERRY_BACKEND_PUBLIC_H
#define FERRY_BACKEND_PUBLIC_H

#include "ferry/export.h"

#include <stddef.h>
#include <stdint.h>

#include "ferry/status.h"
#include "ferry/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ferry_copy_kind {
    FERRY_COPY_HOST_TO_DEVICE = 0,
    FERRY_COPY_DEVICE_TO_HOST = 1,
    FERRY_COPY_DEVICE_TO_DEVICE = 2,
} ferry_copy_kind;

/* Optimizer kinds, shared by the backend update kernels and optim/. */
typedef enum ferry_optim_kind {
    FERRY_OPTIM_SGD = 0,
    FERRY_OPTIM_ADAGRAD = 1,
    FERRY_OPTIM_ADADELTA = 2,
    FERRY_OPTIM_ADAM = 3,
    FERRY_OPTIM_ADAMW = 4,
} ferry_optim_kind;

/* ---- lifetime ---- */

/* Creates the backend named by device: "cpu", or "cuda" / "cuda:N" once the CUDA
 * backend is registered (ferry_cuda_register, ferry/cuda.h). FERRY_ERR_UNSUPPORTED
 * (with a message) when no such backend is registered, FERRY_ERR_INVALID for a name
 * that is neither. */
FERRY_API ferry_status ferry_backend_create(const char *device, ferry_backend **out);
FERRY_API void ferry_backend_destroy(ferry_backend *be); /* NULL is a no-op */
FERRY_API const char *ferry_backend_name(const ferry_backend *be);
/* 1 if the backend's memory is directly addressable by the host (CPU). */
FERRY_API int ferry_backend_is_host(const ferry_backend *be);
/* The process-wide CPU backend (created on first use, never destroyed). */
FERRY_API ferry_backend *ferry_backend_cpu(void);

/* ---- memory ---- */

FERRY_API ferry_status ferry_backend_alloc(ferry_backend *be, size_t nbytes, void **out);
FERRY_API void ferry_backend_free(ferry_backend *be, void *ptr);
FERRY_API ferry_status ferry_backend_copy(ferry_backend *be, void *dst, const void *src,
                                          size_t nbytes, ferry_copy_kind kind);
FERRY_API ferry_status ferry_backend_sync(ferry_backend *be);

/* ---- the CPU backend's OpenBLAS ---- */

/* OpenBLAS picks its kernels from the CPU model; a hypervisor that hides it makes it
 * fall back to kernels 5-9x slower, and on AMD CPUs with AVX-512 it picks Haswell's,
 * about 1.7x slower. A program sets OPENBLAS_CORETYPE (Haswell, SkylakeX, Cooperlake)
 * before it starts to choose; ferry's daemons re-execute themselves with the strongest
 * the CPU runs (their policy, not the library's: a library never re-executes its
 * host). */
/* The kernels OpenBLAS runs and who chose them, for a log line: "SkylakeX (ferry's pick
 * for this CPU; OpenBLAS chose Haswell)", "Haswell (OPENBLAS_CORETYPE=Haswell)", ... */
FERRY_API const char *ferry_cpu_blas_kernels(void);
/* Sets OpenBLAS's thread count (1 = single-threaded GEMMs). */
FERRY_API void ferry_cpu_set_threads(int n);
/* OpenBLAS's thread count now. */
FERRY_API int ferry_cpu_threads(void);
/* The calling thread's GEMMs on up to n threads (1 or 2; 1 is every thread's
 * default), for a thread that has an idle core for a while: a GEMM of 96 rows or more
 * whose halves hold 8M multiply-adds each has its rows split between this thread and a
 * helper thread (one GEMM at a time). The result is the one-thread GEMM's bit for bit:
 * the cut falls on a multiple of 48 rows, of OpenBLAS's row blocks, and a probe checks
 * once per process that such a cut changes no bit (where it would, and while OpenBLAS
 * runs more than one thread, nothing is split). Returns the previous width. */
FERRY_API int ferry_cpu_set_gemm_width(int n);
/* GEMMs split so far, process-wide. */
FERRY_API uint64_t ferry_cpu_gemm_splits(void);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_BACKEND_PUBLIC_H */
