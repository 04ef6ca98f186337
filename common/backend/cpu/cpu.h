/* cpu.h - the CPU backend's ops, one file per group (gemm.c, math.c, lstm.c,
 * xent.c, rows.c, optim.c); cpu.c assembles them into the backend table. */
#ifndef FERRY_CPU_H
#define FERRY_CPU_H

#include "common/tensor/backend-impl.h"

/* The daemons' policy (ferry-ps, ferry-trainer, the benchmarks), not the library's. */
/* Call first thing in main() with main's argv: re-executes the process once with
 * OPENBLAS_CORETYPE set when OpenBLAS chose weaker kernels than the CPU runs: the
 * strongest of Haswell (AVX2+FMA), SkylakeX (AVX-512) and Cooperlake (AVX-512 with
 * BF16), from the CPU's feature flags. Hypervisors hiding the CPU model make OpenBLAS
 * fall back to kernels 5-9x slower; on AMD CPUs with AVX-512 it picks Haswell, about
 * 1.7x slower. Returns if nothing needs doing, or when OPENBLAS_CORETYPE (the user's
 * choice always wins) or FERRY_NO_REEXEC is set. Logs nothing: see
 * ferry_cpu_blas_kernels. */
void ferry_cpu_ensure_blas_kernels(char **argv);

/* Whether this process splits GEMMs (ferry_cpu_set_gemm_width): its probe found a cut
 * at 48 rows exact on OpenBLAS's kernels here and the helper thread runs (gemm.c). */
int ferry__cpu_gemm_split_ok(void);

/* ferry__cpu_<op> for every op of FERRY_BACKEND_OP_MAP (common/tensor/backend.h). */
#define FERRY_CPU_OP_DECLARE_(op, params, args, empty, check) ferry_status ferry__cpu_##op params;
FERRY_BACKEND_OP_MAP(FERRY_CPU_OP_DECLARE_)
#undef FERRY_CPU_OP_DECLARE_

#endif /* FERRY_CPU_H */
