/* tensor.h - dense row-major tensors living on a backend.
 * A tensor either owns its storage (ferry_tensor_create) or is a view into other
 * storage (ferry_tensor_view, or arena tensors of a context); a view must not outlive
 * its storage. The struct is public so numeric code can read shape and data directly,
 * as llm.c does; treat the fields as read-only. Not thread-safe per object. */
#ifndef FERRY_TENSOR_H
#define FERRY_TENSOR_H

#include "ferry/export.h"

#include <stddef.h>
#include <stdint.h>

#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_MAX_DIMS 4

typedef enum ferry_dtype {
    FERRY_DTYPE_F32 = 0,
    FERRY_DTYPE_I32 = 1,
    FERRY_DTYPE_I64 = 2,
} ferry_dtype;

typedef struct ferry_shape {
    int ndim;
    int64_t dim[FERRY_MAX_DIMS];
} ferry_shape;

typedef struct ferry_backend ferry_backend;

typedef struct ferry_tensor {
    ferry_dtype dtype;
    ferry_shape shape;
    void *data;        /* backend memory; host memory on the CPU backend */
    ferry_backend *be; /* where data lives */
    int owns;          /* 1: ferry_tensor_destroy frees data */
} ferry_tensor;

FERRY_API ferry_shape ferry_shape_1d(int64_t d0);
FERRY_API ferry_shape ferry_shape_2d(int64_t d0, int64_t d1);
FERRY_API ferry_shape ferry_shape_3d(int64_t d0, int64_t d1, int64_t d2);
FERRY_API int64_t ferry_shape_numel(ferry_shape s);
FERRY_API int ferry_shape_eq(ferry_shape a, ferry_shape b);
/* Writes "(2, 3, 4)" into buf; returns buf. */
FERRY_API const char *ferry_shape_str(ferry_shape s, char *buf, size_t cap);
FERRY_API size_t ferry_dtype_size(ferry_dtype dt);

/* Allocates a zero-filled tensor on be and stores it in *out; release it with
 * ferry_tensor_destroy. FERRY_ERR_INVALID for a bad shape, FERRY_ERR_NOMEM when
 * the backend is full; *out is unchanged on failure. */
FERRY_API ferry_status ferry_tensor_create(ferry_backend *be, ferry_dtype dt, ferry_shape shape,
                                           ferry_tensor **out);
FERRY_API void ferry_tensor_destroy(ferry_tensor *t); /* NULL is a no-op */

/* A non-owning tensor over `data` (which must hold the shape). */
FERRY_API ferry_tensor ferry_tensor_wrap(ferry_backend *be, ferry_dtype dt, ferry_shape shape,
                                         void *data);
/* A view of numel(shape) elements of base starting at element `offset`. Asserts
 * the range fits. */
FERRY_API ferry_tensor ferry_tensor_view(const ferry_tensor *base, int64_t offset,
                                         ferry_shape shape);

FERRY_API int64_t ferry_tensor_numel(const ferry_tensor *t);
FERRY_API size_t ferry_tensor_nbytes(const ferry_tensor *t);
/* Typed data pointers; assert the dtype. */
FERRY_API float *ferry_tensor_f32(const ferry_tensor *t);
FERRY_API int32_t *ferry_tensor_i32(const ferry_tensor *t);

/* Copies between a tensor and host memory of ferry_tensor_nbytes(t) bytes. */
FERRY_API ferry_status ferry_tensor_from_host(ferry_tensor *t, const void *src);
FERRY_API ferry_status ferry_tensor_to_host(const ferry_tensor *t, void *dst);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_TENSOR_H */
