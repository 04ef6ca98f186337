/* ops.cuh - the CUDA backend's op entries, one group per .cu file; each has the
 * contract of the ferry_backend_* op of the same name in common/tensor/backend.h. */
#ifndef FERRY_CUDA_OPS_CUH
#define FERRY_CUDA_OPS_CUH

#include "common/backend/cuda/common.cuh"

/* ferry__cuda_<op> for every op of FERRY_BACKEND_OP_MAP (common/tensor/backend.h),
 * one group per file: gemm.cu, math.cu, sumsq.cu, lstm.cu, xent.cu, rows.cu, optim.cu. */
#define FERRY_CUDA_OP_DECLARE_(op, params, args, empty, check) ferry_status ferry__cuda_##op params;
FERRY_BACKEND_OP_MAP(FERRY_CUDA_OP_DECLARE_)
#undef FERRY_CUDA_OP_DECLARE_

#endif /* FERRY_CUDA_OPS_CUH */
