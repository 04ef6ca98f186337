/* cuda.h - the CUDA backend (cuBLAS, cuDNN and ferry's kernels), a library of its own:
 * libferry-cuda, installed when the build found a CUDA toolkit, which programs that
 * want GPUs link besides libferry (CMake: ferry::ferry-cuda; by hand: -lferry-cuda
 * -lcudart -lcublas -lcudnn). A CPU-only program never loads a CUDA library.
 *
 *     ferry_cuda_register();                 // once, before the first "cuda" backend
 *     ferry_backend *gpu;
 *     ferry_backend_create("cuda:0", &gpu);  // ferry/backend.h
 */
#ifndef FERRY_CUDA_PUBLIC_H
#define FERRY_CUDA_PUBLIC_H

#include "ferry/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Makes ferry_backend_create accept "cuda" and "cuda:N". Thread-safe; idempotent. */
FERRY_API void ferry_cuda_register(void);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_CUDA_PUBLIC_H */
