/* register.c - libferry-cuda's one C entry point: it hands the CUDA backend's factory
 * to the backend registry of libferry (common/tensor/backend.c). */
#include "common/tensor/backend-impl.h"
#include "ferry/cuda.h"

ferry_status ferry__backend_cuda_create(int device, ferry_backend **out); /* cuda.cu */

void ferry_cuda_register(void) {
    ferry__backend_register_cuda(ferry__backend_cuda_create);
}
