/* coretype.c - makes OpenBLAS use the strongest kernels the CPU supports.
 * OpenBLAS 0.3.21 picks its kernels from the CPU model when the library loads. Under
 * hypervisors that hide the model ("Intel(R) Xeon(R) Processor") it falls back to
 * Prescott (SSE3), 5-9x slower than the AVX-512 kernels; on AMD CPUs with AVX-512
 * (Zen 4) it picks Haswell (AVX2), about 1.7x slower than SkylakeX on the LSTM's
 * shapes. The choice can only be steered through OPENBLAS_CORETYPE before the library
 * loads, so a process whose OpenBLAS chose a weaker core than the CPU runs re-executes
 * itself once with the variable set (from the CPU's feature flags, read once at
 * start), and logs the choice. A user's OPENBLAS_CORETYPE always wins. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include "common/backend/cpu/cpu.h"
#include "common/core/log.h"

/* OpenBLAS's x86-64 cores that ferry may ask for, weakest first. */
static const char *const ladder[] = {"Haswell", "SkylakeX", "Cooperlake"};

/* The strongest core of the ladder this CPU can run: AVX-512 (F, BW, VL) with BF16 is
 * Cooperlake, without it SkylakeX, AVX2 with FMA Haswell. -1: none. */
static int best_core(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl");
    if (avx512) {
        unsigned a, b, c, d;
        /* CPUID leaf 7 subleaf 1, EAX bit 5: AVX512_BF16 (GCC 12 cannot ask by name). */
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
        return (a >> 5) & 1u ? 2 : 1;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return 0;
#endif
    return -1;
}

/* The rank of an OpenBLAS core name on the ladder; -1 for any other (older, generic). */
static int core_rank(const char *name) {
    for (int i = 0; name != NULL && i < (int)(sizeof ladder / sizeof ladder[0]); i++)
        if (strcasecmp(name, ladder[i]) == 0)
            return i;
    return -1;
}

static char kernels_note[160];

const char *ferry_cpu_blas_kernels(void) {
    if (kernels_note[0] != '\0')
        return kernels_note;
    const char *have = openblas_get_corename(), *picked = getenv("FERRY_BLAS_PICKED");
    const char *user = getenv("OPENBLAS_CORETYPE");
    if (have == NULL)
        have = "unknown";
    if (picked != NULL)
        (void)snprintf(kernels_note, sizeof kernels_note,
                       "%s (ferry's pick for this CPU; OpenBLAS chose %s)", have, picked);
    else if (user != NULL && best_core() > core_rank(have))
        (void)snprintf(kernels_note, sizeof kernels_note,
                       "%s (OPENBLAS_CORETYPE=%s; this CPU runs %s: unset it for full speed)",
                       have, user, ladder[best_core()]);
    else if (user != NULL)
        (void)snprintf(kernels_note, sizeof kernels_note, "%s (OPENBLAS_CORETYPE=%s)", have,
                       user);
    else if (best_core() >= 0 && core_rank(have) < best_core())
        (void)snprintf(kernels_note, sizeof kernels_note,
                       "%s (FERRY_NO_REEXEC: OpenBLAS's own choice; this CPU runs %s)", have,
                       ladder[best_core()]);
    else
        (void)snprintf(kernels_note, sizeof kernels_note, "%s (the strongest this CPU runs)",
                       have);
    return kernels_note;
}

void ferry_cpu_ensure_blas_kernels(char **argv) {
    if (getenv("OPENBLAS_CORETYPE") != NULL || getenv("FERRY_NO_REEXEC") != NULL)
        return;
    const char *have = openblas_get_corename();
    int want = best_core();
    /* Never step down: a core OpenBLAS chose above the ladder, or the best already. */
    if (want < 0 || have == NULL || core_rank(have) >= want)
        return;
    if (setenv("OPENBLAS_CORETYPE", ladder[want], 1) != 0 ||
        setenv("FERRY_BLAS_PICKED", have, 1) != 0 || setenv("FERRY_NO_REEXEC", "1", 1) != 0)
        return;
    FERRY_LOG_DEBUG("OpenBLAS chose %s kernels on a CPU that runs %s: re-executing", have,
                    ladder[want]);
    execv("/proc/self/exe", argv);
    /* execv failed: go on with the slower kernels. */
    FERRY_LOG_WARN("OpenBLAS uses %s kernels; set OPENBLAS_CORETYPE=%s for full speed", have,
                   ladder[want]);
}
