/* backend.c - the backend registry and the thin dispatchers layers call. Each
 * dispatcher asserts its pointers, returns early on empty work, and forwards to
 * the backend's table; a missing op is FERRY_ERR_UNSUPPORTED. This is the only
 * file that knows which backends exist (CUDA's registers itself). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/tensor/backend-impl.h"
#include "common/core/log.h"

/* The CUDA backend lives in its own library (libferry-cuda); it registers its factory
 * here (ferry_cuda_register), so a CPU-only libferry links no CUDA library. */
static _Atomic(ferry__backend_factory) cuda_factory;

void ferry__backend_register_cuda(ferry__backend_factory create) {
    atomic_store(&cuda_factory, create);
}

ferry_status ferry_backend_create(const char *device, ferry_backend **out) {
    if (device == NULL || strcmp(device, "cpu") == 0)
        return ferry__backend_cpu_create(out);
    if (strncmp(device, "cuda", 4) == 0 && (device[4] == '\0' || device[4] == ':')) {
        int ordinal = 0;
        if (device[4] == ':') {
            char *end = NULL;
            long v = strtol(device + 5, &end, 10);
            if (end == device + 5 || *end != '\0' || v < 0 || v > 255)
                return ferry_errorf(FERRY_ERR_INVALID, "bad device '%s' (cpu|cuda[:N])", device);
            ordinal = (int)v;
        }
        ferry__backend_factory create = atomic_load(&cuda_factory);
        if (create != NULL)
            return create(ordinal, out);
        return ferry_errorf(FERRY_ERR_UNSUPPORTED,
                            "device '%s': no CUDA backend in this program (build with "
                            "-DFERRY_CUDA=ON on a machine with nvcc, link libferry-cuda and "
                            "call ferry_cuda_register)",
                            device);
    }
    return ferry_errorf(FERRY_ERR_INVALID, "unknown device '%s' (cpu|cuda[:N])", device);
}

void ferry_backend_destroy(ferry_backend *be) {
    if (be == NULL || be == ferry_backend_cpu())
        return;
    be->ops->destroy(be);
}

static ferry_backend *cpu_singleton;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static void cpu_singleton_init(void) {
    ferry_status st = ferry__backend_cpu_create(&cpu_singleton);
    FERRY_ASSERT(st == FERRY_OK);
}

ferry_backend *ferry_backend_cpu(void) {
    pthread_once(&cpu_once, cpu_singleton_init);
    return cpu_singleton;
}

const char *ferry_backend_name(const ferry_backend *be) {
    return be->ops->name;
}

int ferry_backend_is_host(const ferry_backend *be) {
    return be->ops->is_host;
}

#define FERRY_DISPATCH_(be, op, ...)                                             \
    do {                                                                         \
        FERRY_ASSERT((be) != NULL);                                              \
        if ((be)->ops->op == NULL)                                               \
            return ferry_errorf(FERRY_ERR_UNSUPPORTED, "backend %s lacks op %s", \
                                (be)->ops->name, #op);                           \
        return (be)->ops->op((be), __VA_ARGS__);                                 \
    } while (0)

/* ---- memory ---- */

ferry_status ferry_backend_alloc(ferry_backend *be, size_t nbytes, void **out) {
    FERRY_DISPATCH_(be, alloc, nbytes, out);
}

void ferry_backend_free(ferry_backend *be, void *ptr) {
    if (ptr != NULL)
        be->ops->free(be, ptr);
}

ferry_status ferry_backend_copy(ferry_backend *be, void *dst, const void *src, size_t nbytes,
                                ferry_copy_kind kind) {
    if (nbytes == 0)
        return FERRY_OK;
    FERRY_DISPATCH_(be, copy, dst, src, nbytes, kind);
}

ferry_status ferry_backend_sync(ferry_backend *be) {
    FERRY_ASSERT(be != NULL);
    return be->ops->sync ? be->ops->sync(be) : FERRY_OK;
}

/* ---- dense math ---- */

ferry_status ferry_backend_gemm(ferry_backend *be, int trans_a, int trans_b, int64_t M,
                                int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                                const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M == 0 || N == 0)
        return FERRY_OK;
    FERRY_DISPATCH_(be, gemm, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

ferry_status ferry_backend_fill(ferry_backend *be, float *x, int64_t n, float v) {
    if (n == 0)
        return FERRY_OK;
    FERRY_DISPATCH_(be, fill, x, n, v);
}

ferry_status ferry_backend_axpy(ferry_backend *be, int64_t n, float alpha, const float *x,
                                float *y) {
    if (n == 0)
        return FERRY_OK;
    FERRY_DISPATCH_(be, axpy, n, alpha, x, y);
}

ferry_status ferry_backend_scale(ferry_backend *be, int64_t n, float alpha, float *x) {
    if (n == 0)
        return FERRY_OK;
    FERRY_DISPATCH_(be, scale, n, alpha, x);
}

ferry_status ferry_backend_mul(ferry_backend *be, int64_t n, const float *x, const float *y,
                               float *out) {
    if (n == 0)
        return FERRY_OK;
    FERRY_DISPATCH_(be, mul, n, x, y, out);
}

ferry_status ferry_backend_sumsq(ferry_backend *be, int64_t n, const float *x, double *out) {
    *out = 0.0;
    if (n == 0)
        return FERRY_OK;
    FERRY_DISPATCH_(be, sumsq, n, x, out);
}

ferry_status ferry_backend_add_bias(ferry_backend *be, int64_t N, int64_t D, const float *b,
                                    float *y) {
    if (N == 0 || D == 0)
        return FERRY_OK;
    FERRY_DISPATCH_(be, add_bias, N, D, b, y);
}

ferry_status ferry_backend_sum_rows(ferry_backend *be, int64_t N, int64_t D, const float *x,
                                    float *out) {
    if (N == 0 || D == 0)
        return FERRY_OK;
    FERRY_DISPATCH_(be, sum_rows, N, D, x, out);
}

/* ---- fused layer ops ---- */

ferry_status ferry_backend_lstm_cell_forward(ferry_backend *be, int64_t N, int64_t H, float *gates,
                                             const float *c_prev, float *c, float *h) {
    if (N == 0)
        return FERRY_OK;
    FERRY_DISPATCH_(be, lstm_cell_forward, N, H, gates, c_prev, c, h);
}

ferry_status ferry_backend_lstm_cell_backward(ferry_backend *be, int64_t N, int64_t H,
                                              const float *gates, const float *c_prev,
                                              const float *c, const float *dh, float *dc,
                                              float *dgates) {
    if (N == 0)
        return FERRY_OK;
    FERRY_DISPATCH_(be, lstm_cell_backward, N, H, gates, c_prev, c, dh, dc, dgates);
}

ferry_status ferry_backend_xent_forward(ferry_backend *be, int64_t N, int64_t V, float *logits,
                                        const int32_t *targets, float *loss_rows) {
    if (N == 0)
        return FERRY_OK;
    FERRY_DISPATCH_(be, xent_forward, N, V, logits, targets, loss_rows);
}

ferry_status ferry_backend_xent_backward(ferry_backend *be, int64_t N, int64_t V, float *probs,
                                         const int32_t *targets, float scale) {
    if (N == 0)
        return FERRY_OK;
    FERRY_DISPATCH_(be, xent_backward, N, V, probs, targets, scale);
}

ferry_status ferry_backend_softmax_partials(ferry_backend *be, int64_t N, int64_t V, float *z,
                                            const int32_t *targets, float *row_max,
                                            double *row_sumexp, float *target_logit) {
    if (N == 0)
        return FERRY_OK;
    FERRY_DISPATCH_(be, softmax_partials, N, V, z, targets, row_max, row_sumexp, target_logit);
}

ferry_status ferry_backend_softmax_grad(ferry_backend *be, int64_t N, int64_t V, float *e,
                                        const float *factor, const int32_t *targets,
                                        const float *row_scale, float scale) {
    if (N == 0)
        return FERRY_OK;
    FERRY_DISPATCH_(be, softmax_grad, N, V, e, factor, targets, row_scale, scale);
}

ferry_status ferry_backend_gather_rows(ferry_backend *be, int64_t count, int64_t D,
                                       const int32_t *idx, const float *src, float *dst) {
    if (count == 0 || D == 0)
        return FERRY_OK;
    FERRY_DISPATCH_(be, gather_rows, count, D, idx, src, dst);
}

ferry_status ferry_backend_scatter_add_rows(ferry_backend *be, int64_t count, int64_t D,
                                            const int32_t *idx, const float *src, float *dst) {
    if (count == 0 || D == 0)
        return FERRY_OK;
    FERRY_DISPATCH_(be, scatter_add_rows, count, D, idx, src, dst);
}

ferry_status ferry_backend_dropout_mask(ferry_backend *be, int64_t n, float p, uint64_t seed,
                                        uint64_t offset, float *mask) {
    FERRY_ASSERT(p >= 0.0f && p < 1.0f);
    if (n == 0)
        return FERRY_OK;
    FERRY_DISPATCH_(be, dropout_mask, n, p, seed, offset, mask);
}

ferry_status ferry_backend_optim_update(ferry_backend *be, const ferry_optim_update *u) {
    if ((u->rows == NULL && u->n == 0) || (u->rows != NULL && u->nrows == 0))
        return FERRY_OK;
    FERRY_DISPATCH_(be, optim_update, u);
}

/* ---- counter-based random numbers ---- */

/* splitmix64 finaliser: a bijective mix of (seed, index), so a mask element
 * depends only on its coordinates and never on thread scheduling. */
float ferry_rand_uniform(uint64_t seed, uint64_t index) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f); /* 24 bits: exact in float */
}
