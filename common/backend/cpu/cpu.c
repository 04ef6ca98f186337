/* cpu.c - the CPU backend: 64-byte-aligned host memory (recycled when large), memcpy copies, and
 * the op table assembled from gemm.c, math.c, lstm.c, xent.c, rows.c and optim.c. */
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "common/backend/cpu/cpu.h"
#include "common/core/buf.h"
#include "common/core/log.h"

/* ferry_buf_alloc's buffers: 64-byte aligned, and the large ones (a server's gradient
 * blocks and context tensors, the same sizes every step) recycled instead of
 * page-faulted in afresh on whichever thread runs the next call (common/core/buf.h). */
static ferry_status cpu_alloc(ferry_backend *be, size_t nbytes, void **out) {
    (void)be;
    /* Round up so vector loops may read whole 64-byte lines. */
    size_t rounded = (nbytes + 63) & ~(size_t)63;
    void *p = rounded >= nbytes ? ferry_buf_alloc(rounded ? rounded : 64) : NULL;
    if (p == NULL)
        return ferry_errorf(FERRY_ERR_NOMEM, "cannot allocate %zu bytes", nbytes);
    *out = p;
    return FERRY_OK;
}

static void cpu_free(ferry_backend *be, void *ptr) {
    (void)be;
    ferry_buf_free(ptr);
}

static ferry_status cpu_copy(ferry_backend *be, void *dst, const void *src, size_t n,
                             ferry_copy_kind kind) {
    (void)be;
    (void)kind;
    memmove(dst, src, n);
    return FERRY_OK;
}

static void cpu_destroy(ferry_backend *be) {
    free(be);
}

static const ferry_backend_ops cpu_ops = {.name = "cpu",
                                          .is_host = 1,
                                          .alloc = cpu_alloc,
                                          .free = cpu_free,
                                          .copy = cpu_copy,
                                          .sync = NULL,
                                          .destroy = cpu_destroy,
#define FERRY_CPU_OP_ENTRY_(op, params, args, empty, check) .op = ferry__cpu_##op,
                                          FERRY_BACKEND_OP_MAP(FERRY_CPU_OP_ENTRY_)
#undef FERRY_CPU_OP_ENTRY_
};

ferry_status ferry__backend_cpu_create(ferry_backend **out) {
    ferry_backend *be = calloc(1, sizeof *be);
    if (be == NULL)
        return FERRY_NOMEM();
    be->ops = &cpu_ops;
    *out = be;
    return FERRY_OK;
}

void ferry_cpu_set_threads(int n) {
    openblas_set_num_threads(n < 1 ? 1 : n);
}

int ferry_cpu_threads(void) {
    return openblas_get_num_threads();
}
