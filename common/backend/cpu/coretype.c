/* coretype.c - makes OpenBLAS use the kernels the CPU actually supports.
 * OpenBLAS 0.3.21 picks its kernels from the CPU model when the library loads; under
 * hypervisors that hide the model ("Intel(R) Xeon(R) Processor") it falls back to
 * Prescott (SSE3), 5-9x slower than the AVX-512 kernels on the same machine. The
 * choice can only be steered through OPENBLAS_CORETYPE before the library loads, so a
 * daemon whose OpenBLAS chose a weaker core than the CPU offers re-executes itself
 * once with the variable set. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include "common/backend/cpu/cpu.h"
#include "common/core/log.h"

static const char *best_coretype(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return "Haswell";
#endif
    return NULL;
}

void ferry_cpu_ensure_blas_kernels(char **argv) {
    if (getenv("OPENBLAS_CORETYPE") != NULL || getenv("FERRY_NO_REEXEC") != NULL)
        return;
    const char *want = best_coretype();
    const char *have = openblas_get_corename();
    if (want == NULL || have == NULL || strcasecmp(have, want) == 0)
        return;
    /* Only replace the generic fallbacks, never a specific choice OpenBLAS made. */
    static const char *generic[] = {"prescott", "core2", "nehalem", "atom", "katmai",
                                    "coppermine", "northwood", "banias", "unknown"};
    int is_generic = 0;
    for (size_t i = 0; i < sizeof generic / sizeof generic[0]; i++)
        is_generic |= strcasecmp(have, generic[i]) == 0;
    if (!is_generic)
        return;
    if (setenv("OPENBLAS_CORETYPE", want, 1) != 0 || setenv("FERRY_NO_REEXEC", "1", 1) != 0)
        return;
    FERRY_LOG_DEBUG("OpenBLAS chose %s kernels on a CPU with %s features: re-executing", have,
                    want);
    execv("/proc/self/exe", argv);
    /* execv failed: go on with the slow kernels. */
    FERRY_LOG_WARN("OpenBLAS uses %s kernels; set OPENBLAS_CORETYPE=%s for full speed", have,
                   want);
}
