/* optim-consts.c - see optim-consts.h. */
#include <math.h>

#include "common/tensor/optim-consts.h"

void ferry__optim_consts_init(const ferry_optim_update *u, ferry_optim_consts *c) {
    c->kind = (int)u->kind;
    c->has_buf = u->kind == FERRY_OPTIM_SGD && u->momentum != 0.0;
    c->nesterov = u->nesterov;
    c->scale = u->grad_scale;
    c->wd = (float)u->weight_decay;
    c->eps = (float)u->eps;
    c->neg_lr = (float)(-u->lr);
    c->a = c->a1 = c->b = c->b1 = c->bc2_sqrt = 0.0f;
    c->decay = 1.0f;
    switch (u->kind) {
    case FERRY_OPTIM_SGD:
        c->a = (float)u->momentum;
        c->a1 = (float)(1.0 - u->dampening);
        break;
    case FERRY_OPTIM_ADAGRAD:
        /* clr = lr / (1 + (step - 1) * lr_decay), in double as torch does in Python. */
        c->neg_lr = (float)(-(u->lr / (1.0 + (double)(u->step - 1) * u->lr_decay)));
        break;
    case FERRY_OPTIM_ADADELTA:
        c->a = (float)u->rho;
        c->a1 = (float)(1.0 - u->rho);
        break;
    case FERRY_OPTIM_ADAM:
    case FERRY_OPTIM_ADAMW: {
        double bc1 = 1.0 - pow(u->beta1, (double)u->step);
        double bc2 = 1.0 - pow(u->beta2, (double)u->step);
        c->a = (float)u->beta1;
        c->a1 = (float)(1.0 - u->beta1);
        c->b = (float)u->beta2;
        c->b1 = (float)(1.0 - u->beta2);
        c->neg_lr = (float)(-(u->lr / bc1));
        c->bc2_sqrt = (float)sqrt(bc2);
        if (u->kind == FERRY_OPTIM_ADAMW) {
            c->decay = (float)(1.0 - u->lr * u->weight_decay);
            c->wd = 0.0f; /* decoupled: never folded into the gradient */
        }
        break;
    }
    }
}
