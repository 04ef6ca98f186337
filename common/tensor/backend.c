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

/* ---- the compute ops: checks, then the backend's entry ---- */

void ferry__backend_check_p(float p) {
    FERRY_ASSERT(p >= 0.0f && p < 1.0f);
}

int ferry__optim_slots(const ferry_optim_update *u) {
    return ferry__optim_kind_slots(u->kind, u->momentum);
}

int ferry__optim_kind_slots(ferry_optim_kind kind, double momentum) {
    switch (kind) {
    case FERRY_OPTIM_SGD:
        return momentum != 0.0 ? 1 : 0;
    case FERRY_OPTIM_ADAGRAD:
        return 1;
    case FERRY_OPTIM_ADADELTA:
    case FERRY_OPTIM_ADAM:
    case FERRY_OPTIM_ADAMW:
        return 2;
    }
    return -1;
}

ferry_status ferry__backend_check_optim(const ferry_optim_update *u) {
    int slots = ferry__optim_slots(u);
    if (slots < 0)
        return ferry_errorf(FERRY_ERR_INVALID, "optimizer update: unknown kind %d", (int)u->kind);
    if ((slots >= 1 && u->slot0 == NULL) || (slots >= 2 && u->slot1 == NULL))
        return ferry_errorf(FERRY_ERR_INVALID, "optimizer update: kind %d needs %d state slots",
                            (int)u->kind, slots);
    if (u->step < 1)
        return ferry_errorf(FERRY_ERR_INVALID, "optimizer update: step %lld < 1",
                            (long long)u->step);
    return FERRY_OK;
}

/* ferry_backend_<op> for every row of FERRY_BACKEND_OP_MAP: empty work is done at
 * once; then the arguments' checks; then the backend's entry. */
#define FERRY_BACKEND_OP_DISPATCH_(op, params, args, empty, check)                                 \
    ferry_status ferry_backend_##op params {                                                       \
        if (empty)                                                                                 \
            return FERRY_OK;                                                                       \
        FERRY_ASSERT(be != NULL);                                                                  \
        ferry_status st_ = (check);                                                                \
        if (st_ != FERRY_OK)                                                                       \
            return st_;                                                                            \
        if (be->ops->op == NULL)                                                                   \
            return ferry_errorf(FERRY_ERR_UNSUPPORTED, "backend %s lacks op %s", be->ops->name,    \
                                #op);                                                              \
        return be->ops->op args;                                                                   \
    }
FERRY_BACKEND_OP_MAP(FERRY_BACKEND_OP_DISPATCH_)
#undef FERRY_BACKEND_OP_DISPATCH_

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
