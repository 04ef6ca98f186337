/* cpu.c - the CPU backend: 64-byte-aligned host memory, memcpy copies, and the
 * op table assembled from math.c, lstm.c, xent.c, rows.c and optim.c. */
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "common/backend/cpu/cpu.h"
#include "common/core/log.h"

static ferry_status cpu_alloc(ferry_backend *be, size_t nbytes, void **out) {
    (void)be;
    void *p = NULL;
    /* Round up so vector loops may read whole 64-byte lines. */
    size_t rounded = (nbytes + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0)
        return ferry_errorf(FERRY_ERR_NOMEM, "cannot allocate %zu bytes", nbytes);
    *out = p;
    return FERRY_OK;
}

static void cpu_free(ferry_backend *be, void *ptr) {
    (void)be;
    free(ptr);
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

static const ferry_backend_ops cpu_ops = {
    .name = "cpu",
    .is_host = 1,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .sync = NULL,
    .destroy = cpu_destroy,
    .gemm = ferry__cpu_gemm,
    .fill = ferry__cpu_fill,
    .axpy = ferry__cpu_axpy,
    .scale = ferry__cpu_scale,
    .mul = ferry__cpu_mul,
    .sumsq = ferry__cpu_sumsq,
    .add_bias = ferry__cpu_add_bias,
    .sum_rows = ferry__cpu_sum_rows,
    .lstm_cell_forward = ferry__cpu_lstm_cell_forward,
    .lstm_cell_backward = ferry__cpu_lstm_cell_backward,
    .xent_forward = ferry__cpu_xent_forward,
    .xent_backward = ferry__cpu_xent_backward,
    .softmax_partials = ferry__cpu_softmax_partials,
    .softmax_grad = ferry__cpu_softmax_grad,
    .gather_rows = ferry__cpu_gather_rows,
    .scatter_add_rows = ferry__cpu_scatter_add_rows,
    .dropout_mask = ferry__cpu_dropout_mask,
    .optim_update = ferry__cpu_optim_update,
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
