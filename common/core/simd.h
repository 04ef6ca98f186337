/* simd.h - FERRY_HOT_LOOP marks a function whose loops GCC vectorises (the CPU ops'
 * element-wise kernels, the optimizer spans, the bf16 codec). In a portable build
 * (FERRY_NATIVE=OFF: the docker image, an installed library, the sanitizer build) each
 * such function is compiled twice, for x86-64-v3 (AVX2 and FMA: Intel Haswell and
 * later, every AMD Zen) and for the x86-64 baseline, and the loader picks the one the
 * CPU runs (GCC's target_clones, an ifunc). Without it a portable binary ran the
 * baseline's 4-wide SSE2 loops and called libm's fmaf for every multiply-add of
 * vmath.h's exp: the local step 2.2x slower than the native build's, and the compose
 * job half the speed of the same job run natively (docs/benchmarks.md).
 *
 * Both versions compute the same bits: fmaf is exact in either, the build does not
 * contract a*b+c (-std=c11), and the vectorised loops keep the source's order of
 * additions (no -ffast-math). A native build (-march=native) compiles one version. */
#ifndef FERRY_CORE_SIMD_H
#define FERRY_CORE_SIMD_H

/* Not under ThreadSanitizer: an ifunc's resolver runs while the loader relocates, before
 * TSan's runtime is up, and the instrumented resolver crashes there. */
#if defined(FERRY_SIMD_CLONES) && defined(__GNUC__) && !defined(__clang__) &&                      \
    defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define FERRY_HOT_LOOP __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define FERRY_HOT_LOOP
#endif

#endif /* FERRY_CORE_SIMD_H */
