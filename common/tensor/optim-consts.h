/* optim-consts.h - the float32 constants of one optimizer update, derived from the
 * double hyper-parameters once per call exactly as torch does (shared by the CPU and
 * CUDA update kernels, so both round the same way). */
#ifndef FERRY_OPTIM_CONSTS_H
#define FERRY_OPTIM_CONSTS_H

#include "common/tensor/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ferry_optim_consts {
    int kind;       /* ferry_optim_kind */
    int has_buf;    /* SGD with momentum: a momentum buffer exists */
    int nesterov;
    float scale;    /* gradient multiplier (clipping) */
    float wd;       /* L2 weight decay folded into the gradient (0 for AdamW) */
    float neg_lr;   /* -lr (SGD, Adadelta), -clr (Adagrad), -lr/bc1 (Adam) */
    float a, a1;    /* SGD: momentum, 1 - dampening; Adadelta: rho, 1 - rho;
                       Adam: beta1, 1 - beta1 */
    float b, b1;    /* Adam: beta2, 1 - beta2 */
    float bc2_sqrt; /* Adam: sqrt(1 - beta2^t) */
    float eps;
    float decay;    /* AdamW: 1 - lr * weight_decay */
} ferry_optim_consts;

void ferry__optim_consts_init(const ferry_optim_update *u, ferry_optim_consts *c);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_OPTIM_CONSTS_H */
