/* model.c - assembles the language model from nn layers over one parameter
 * block, and runs one BPTT window through it on an autograd context. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "model.h"
#include "optim/stiefel.h"

/* Replaces a constrained weight_hh by its orthogonal polar factor, as cdopt does
 * at initialisation (the penalty then starts at zero and A(W) = W). */
static ferry_status lm_polar_init(ferry_lm *lm, int idx) {
    const ferry_param *p = &lm->P.items[idx];
    size_t nbytes = (size_t)p->numel * sizeof(float);
    float *host = malloc(nbytes);
    if (host == NULL)
        return FERRY_ERR_NOMEM;
    float *W = ferry_params_data(&lm->P, idx);
    ferry_status st = ferry_backend_copy(lm->be, host, W, nbytes, FERRY_COPY_DEVICE_TO_HOST);
    if (st == FERRY_OK)
        st = ferry_stiefel_polar(p->shape.dim[0], p->shape.dim[1], host);
    if (st == FERRY_OK)
        st = ferry_backend_copy(lm->be, W, host, nbytes, FERRY_COPY_HOST_TO_DEVICE);
    free(host);
    return st;
}

static ferry_status lm_init_params(ferry_lm *lm) {
    const ferry_lm_config *cfg = &lm->cfg;
    ferry_status st = FERRY_OK;
    for (int i = 0; i < lm->P.count && st == FERRY_OK; i++)
        st = ferry_params_init_uniform(&lm->P, i, cfg->init_scale, cfg->seed);
    for (int l = 0; l < cfg->L && st == FERRY_OK && cfg->stiefel_beta > 0.0f; l++)
        st = lm_polar_init(lm, lm->rnn.w_hh[l]);
    return st;
}

ferry_status ferry_lm_create(ferry_backend *be, const ferry_lm_config *cfg, ferry_lm **out) {
    if (cfg->V < 2 || cfg->E < 1 || cfg->H < 1 || cfg->L < 1 || cfg->L > FERRY_LSTM_MAX_LAYERS)
        return ferry_errorf(FERRY_ERR_INVALID, "bad model shape V=%lld E=%lld H=%lld L=%d",
                            (long long)cfg->V, (long long)cfg->E, (long long)cfg->H, cfg->L);
    if (cfg->dropout < 0.0f || cfg->dropout >= 1.0f)
        return ferry_errorf(FERRY_ERR_RANGE, "dropout %g outside [0, 1)", (double)cfg->dropout);
    ferry_status st = FERRY_ERR_NOMEM;
    ferry_lm *lm = calloc(1, sizeof *lm);
    if (lm == NULL)
        return st;
    lm->cfg = *cfg;
    lm->be = be;
    ferry_params_init(&lm->P, be);
    if ((st = ferry_embedding_init(&lm->emb, &lm->P, "encoder", cfg->V, cfg->E)) != FERRY_OK)
        goto fail;
    if ((st = ferry_lstm_init(&lm->rnn, &lm->P, "lstm", cfg->E, cfg->H, cfg->L, cfg->dropout)) !=
        FERRY_OK)
        goto fail;
    if ((st = ferry_linear_init(&lm->dec, &lm->P, "decoder", cfg->H, cfg->V, 1)) != FERRY_OK)
        goto fail;
    for (int l = 0; l < cfg->L && cfg->stiefel_beta > 0.0f; l++) {
        st = ferry_params_set_constraint(&lm->P, lm->rnn.w_hh[l], FERRY_CONSTRAINT_STIEFEL,
                                         cfg->stiefel_beta);
        if (st != FERRY_OK)
            goto fail;
    }
    if ((st = ferry_params_alloc(&lm->P)) != FERRY_OK)
        goto fail;
    if ((st = lm_init_params(lm)) != FERRY_OK)
        goto fail;
    *out = lm;
    return FERRY_OK;
fail:
    ferry_lm_destroy(lm);
    return st;
}

void ferry_lm_destroy(ferry_lm *lm) {
    if (lm == NULL)
        return;
    ferry_tensor_destroy(lm->h);
    ferry_tensor_destroy(lm->c);
    ferry_params_deinit(&lm->P);
    free(lm);
}

ferry_status ferry_lm_reset_state(ferry_lm *lm, int64_t B) {
    ferry_shape s = ferry_shape_3d(lm->cfg.L, B, lm->cfg.H);
    if (lm->h == NULL || lm->B != B) {
        ferry_tensor_destroy(lm->h);
        ferry_tensor_destroy(lm->c);
        lm->h = lm->c = NULL;
        ferry_status st = ferry_tensor_create(lm->be, FERRY_DTYPE_F32, s, &lm->h);
        if (st == FERRY_OK)
            st = ferry_tensor_create(lm->be, FERRY_DTYPE_F32, s, &lm->c);
        if (st != FERRY_OK)
            return st;
        lm->B = B;
        return FERRY_OK;
    }
    ferry_status st = ferry_backend_fill(lm->be, lm->h->data, ferry_tensor_numel(lm->h), 0.0f);
    if (st == FERRY_OK)
        st = ferry_backend_fill(lm->be, lm->c->data, ferry_tensor_numel(lm->c), 0.0f);
    return st;
}

ferry_status ferry_lm_forward(ferry_lm *lm, ferry_ctx *ctx, const ferry_tensor *inputs,
                              const ferry_tensor *targets, float loss_scale, ferry_tensor **loss,
                              double *loss_sum) {
    ferry_status st;
    if (inputs->shape.ndim != 2 || !ferry_shape_eq(inputs->shape, targets->shape))
        return ferry_errorf(FERRY_ERR_SHAPE, "model: inputs and targets must both be (T, B)");
    int64_t B = inputs->shape.dim[1];
    if (lm->h == NULL || lm->B != B) {
        if ((st = ferry_lm_reset_state(lm, B)) != FERRY_OK)
            return st;
    }
    float p = ferry_ctx_training(ctx) ? lm->cfg.dropout : 0.0f;
    ferry_tensor *x, *xd, *y, *yd, *hn, *cn, *logits;
    if ((st = ferry_embedding_forward(&lm->emb, ctx, inputs, &x)) != FERRY_OK)
        return st; /* (T, B, E) */
    if ((st = ferry_dropout_forward(ctx, p, x, &xd)) != FERRY_OK)
        return st;
    if ((st = ferry_lstm_forward(&lm->rnn, ctx, xd, lm->h, lm->c, NULL, &y, &hn, &cn)) !=
        FERRY_OK)
        return st; /* y (T, B, H); hn, cn (L, B, H) */
    if ((st = ferry_dropout_forward(ctx, p, y, &yd)) != FERRY_OK)
        return st;
    if ((st = ferry_linear_forward(&lm->dec, ctx, yd, &logits)) != FERRY_OK)
        return st; /* (T, B, V) */
    if ((st = ferry_xent_forward(ctx, logits, targets, loss_scale, loss, loss_sum)) != FERRY_OK)
        return st;
    /* Truncated BPTT: the next window starts from these values, detached. */
    size_t nbytes = ferry_tensor_nbytes(lm->h);
    if ((st = ferry_backend_copy(lm->be, lm->h->data, hn->data, nbytes,
                                 FERRY_COPY_DEVICE_TO_DEVICE)) != FERRY_OK)
        return st;
    return ferry_backend_copy(lm->be, lm->c->data, cn->data, nbytes, FERRY_COPY_DEVICE_TO_DEVICE);
}

ferry_status ferry_lm_feasibility(const ferry_lm *lm, double *out) {
    for (int l = 0; l < lm->cfg.L; l++) {
        const ferry_param *p = &lm->P.items[lm->rnn.w_hh[l]];
        ferry_status st = ferry_stiefel_feasibility(lm->be, p->shape.dim[0], p->shape.dim[1],
                                                    ferry_params_data(&lm->P, lm->rnn.w_hh[l]),
                                                    &out[l], NULL);
        if (st != FERRY_OK)
            return st;
    }
    return FERRY_OK;
}

double ferry_lm_step_flops(const ferry_lm_config *cfg, int64_t T, int64_t B) {
    double N = (double)T * (double)B, H = (double)cfg->H, fwd = 0.0;
    for (int l = 0; l < cfg->L; l++) {
        double C = l == 0 ? (double)cfg->E : H;
        fwd += 2.0 * N * C * 4.0 * H; /* input projection */
        fwd += 2.0 * N * H * 4.0 * H; /* recurrent projection */
    }
    fwd += 2.0 * N * H * (double)cfg->V; /* decoder */
    /* Backward runs two GEMMs of the same size per forward GEMM (dX and dW);
     * the first layer's dX feeds only the embedding but is computed too. */
    return 3.0 * fwd;
}
