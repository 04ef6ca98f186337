/* backend-impl.h - what a backend implements. Each backend fills one
 * ferry_backend_ops table, its compute ops by name from FERRY_BACKEND_OP_MAP
 * (backend.h); backend.c's dispatchers check arguments (the same checks for every
 * backend: a backend's op may take them as done) and forward. A NULL entry marks an
 * op the backend lacks (the dispatcher reports FERRY_ERR_UNSUPPORTED). */
#ifndef FERRY_BACKEND_IMPL_H
#define FERRY_BACKEND_IMPL_H

#include "common/tensor/backend.h"

typedef struct ferry_backend_ops {
    const char *name;
    int is_host;
    ferry_status (*alloc)(ferry_backend *be, size_t nbytes, void **out);
    void (*free)(ferry_backend *be, void *ptr);
    ferry_status (*copy)(ferry_backend *be, void *dst, const void *src, size_t n,
                         ferry_copy_kind kind);
    ferry_status (*sync)(ferry_backend *be);
    void (*destroy)(ferry_backend *be);

    /* The compute ops, one entry per row of FERRY_BACKEND_OP_MAP (backend.h). */
#define FERRY_BACKEND_OP_ENTRY_(op, params, args, empty, check) ferry_status(*op) params;
    FERRY_BACKEND_OP_MAP(FERRY_BACKEND_OP_ENTRY_)
#undef FERRY_BACKEND_OP_ENTRY_
} ferry_backend_ops;

struct ferry_backend {
    const ferry_backend_ops *ops;
    int device;  /* device ordinal (CUDA); 0 on the CPU */
    void *impl;  /* backend-private state */
};

/* Constructors, one per backend; registry code in backend.c picks by name. */
ferry_status ferry__backend_cpu_create(ferry_backend **out);

/* Makes the backend for device ordinal N ("cuda:N"). */
typedef ferry_status (*ferry__backend_factory)(int ordinal, ferry_backend **out);
/* Called by libferry-cuda's ferry_cuda_register (include/ferry/cuda.h). */
void ferry__backend_register_cuda(ferry__backend_factory create);

#endif /* FERRY_BACKEND_IMPL_H */
