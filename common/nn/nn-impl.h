/* nn-impl.h - helpers shared by the layers in common/nn/, not part of nn.h. */
#ifndef FERRY_NN_IMPL_H
#define FERRY_NN_IMPL_H

#include "common/tensor/backend.h"

/* y(N, D) = b broadcast over rows (the bias before a GEMM with beta = 1). */
ferry_status ferry__nn_broadcast_rows(ferry_backend *be, int64_t N, int64_t D, const float *b,
                                      float *y);

#endif /* FERRY_NN_IMPL_H */
