/* model.c - assembles the language model from nn layers (and, when distributed,
 * remote modules on ferry-ps), runs BPTT windows through it on an autograd context,
 * and performs the training step: backward across processes, Stiefel penalty,
 * global-norm clipping and the local and remote optimizer steps. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tensor/backend.h"
#include "ferry/ferry.h"
#include "common/core/log.h"
#include "worker/model.h"
#include "ferry/optim.h"
#include "optim/stiefel.h"

/* ---- construction ---- */

/* Declares the full local layout into P: encoder, LSTM, decoder, in this order.
 * A distributed model builds it too (without allocating) to learn the offsets
 * its parameters have in the local layout, from which their initial values come. */
static ferry_status lm_declare_full(ferry_lm *lm, ferry_params *P) {
    const ferry_lm_config *cfg = &lm->cfg;
    ferry_status st;
    if ((st = ferry_embedding_init(&lm->emb, P, "encoder", cfg->V, cfg->E)) != FERRY_OK)
        return st;
    if ((st = ferry_lstm_init(&lm->rnn, P, "lstm", cfg->E, cfg->H, cfg->L, cfg->dropout)) !=
        FERRY_OK)
        return st;
    return ferry_linear_init(&lm->dec, P, "decoder", cfg->H, cfg->V, 1);
}

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

/* Uniform init of every local parameter at its offset in the full layout, the
 * Stiefel constraint and its polar initialisation. */
static ferry_status lm_init_local(ferry_lm *lm, const ferry_params *full) {
    const ferry_lm_config *cfg = &lm->cfg;
    ferry_status st = FERRY_OK;
    for (int i = 0; i < lm->P.count && st == FERRY_OK; i++) {
        int j = ferry_params_find(full, lm->P.items[i].name);
        FERRY_ASSERT(j >= 0);
        st = ferry_params_init_uniform_at(&lm->P, i, cfg->init_scale, cfg->seed,
                                          full->items[j].offset);
    }
    for (int l = 0; l < cfg->L && st == FERRY_OK && cfg->stiefel_beta > 0.0f; l++)
        st = lm_polar_init(lm, lm->rnn.w_hh[l]);
    return st;
}

/* The job's dense module "lstm": the whole local block (alignment padding too, so
 * pulls and pushes are one copy), rows split over the servers. Rank 0 sends its
 * initial values (polar-initialised where constrained); the others must find it. */
static ferry_status lm_create_dense(ferry_lm *lm, const ferry_lm_placement *pl) {
    ferry_remote_config rc;
    char name[FERRY_PARAM_NAME_MAX];
    (void)snprintf(name, sizeof name, "%s/lstm", ferry_job_get_config(pl->job)->name);
    ferry_remote_config_default(&rc, FERRY_REMOTE_DENSE, name, lm->P.numel, 1);
    rc.bias = 0;
    rc.optim = pl->optim;
    ferry_status st = FERRY_OK;
    if ((lm->stage = malloc((size_t)lm->P.numel * sizeof(float))) == NULL)
        return FERRY_ERR_NOMEM;
    if ((st = ferry_backend_copy(lm->be, lm->stage, lm->P.data, (size_t)lm->P.numel * sizeof(float),
                                 FERRY_COPY_DEVICE_TO_HOST)) != FERRY_OK)
        return st;
    rc.init_weight = lm->stage;
    return ferry_remote_create(pl->cluster, &rc, &lm->dense_remote);
}

static ferry_status lm_create_remote(ferry_lm *lm, const ferry_params *full,
                                     const ferry_lm_placement *pl) {
    const ferry_lm_config *cfg = &lm->cfg;
    ferry_remote_config rc;
    ferry_status st;
    int rank = pl->job != NULL ? ferry_job_get_config(pl->job)->rank : 0;
    if (rank != 0 && !pl->resume && (st = ferry_job_wait_ready(pl->job)) != FERRY_OK)
        return st; /* rank 0 makes the modules; the others find them (same config) */
    /* A job's modules are its own: "<job>/encoder", so jobs sharing servers never
     * share parameters. */
    char enc[FERRY_PARAM_NAME_MAX] = "encoder", dec[FERRY_PARAM_NAME_MAX] = "decoder";
    if (pl->job != NULL) {
        (void)snprintf(enc, sizeof enc, "%s/encoder", ferry_job_get_config(pl->job)->name);
        (void)snprintf(dec, sizeof dec, "%s/decoder", ferry_job_get_config(pl->job)->name);
    }
    ferry_remote_config_default(&rc, FERRY_REMOTE_EMBEDDING, enc, cfg->V, cfg->E);
    rc.init_seed = cfg->seed;
    rc.init_scale = cfg->init_scale;
    rc.weight_offset = full->items[ferry_params_find(full, "encoder.weight")].offset;
    rc.optim = pl->optim;
    if ((st = ferry_remote_create(pl->cluster, &rc, &lm->emb_remote)) != FERRY_OK)
        return st;
    ferry_remote_config_default(&rc, FERRY_REMOTE_DECODER, dec, cfg->V, cfg->H);
    rc.init_seed = cfg->seed;
    rc.init_scale = cfg->init_scale;
    rc.weight_offset = full->items[ferry_params_find(full, "decoder.weight")].offset;
    rc.bias_offset = full->items[ferry_params_find(full, "decoder.bias")].offset;
    rc.optim = pl->optim;
    if ((st = ferry_remote_create(pl->cluster, &rc, &lm->dec_remote)) != FERRY_OK)
        return st;
    if (pl->job == NULL)
        return FERRY_OK;
    lm->job = pl->job;
    if ((st = lm_create_dense(lm, pl)) != FERRY_OK)
        return st;
    if (pl->resume)
        return FERRY_OK; /* the roll-back sets the values; the trainer pulls then */
    if (rank == 0)
        return ferry_job_ready(pl->job);
    return ferry_lm_pull_dense(lm); /* start from the job's weights */
}

ferry_status ferry_lm_pull_dense(ferry_lm *lm) {
    if (lm->dense_remote == NULL)
        return FERRY_OK;
    ferry_status st = ferry_remote_dense_pull(lm->dense_remote, NULL, lm->stage, NULL);
    if (st == FERRY_OK)
        st = ferry_backend_copy(lm->be, lm->P.data, lm->stage, (size_t)lm->P.numel * sizeof(float),
                                FERRY_COPY_HOST_TO_DEVICE);
    return st;
}

ferry_status ferry_lm_create_placed(ferry_backend *be, const ferry_lm_config *cfg,
                                    const ferry_lm_placement *placement, ferry_lm **out) {
    if (cfg->V < 2 || cfg->E < 1 || cfg->H < 1 || cfg->L < 1 || cfg->L > FERRY_LSTM_MAX_LAYERS)
        return ferry_errorf(FERRY_ERR_INVALID, "bad model shape V=%lld E=%lld H=%lld L=%d",
                            (long long)cfg->V, (long long)cfg->E, (long long)cfg->H, cfg->L);
    if (cfg->dropout < 0.0f || cfg->dropout >= 1.0f)
        return ferry_errorf(FERRY_ERR_RANGE, "dropout %g outside [0, 1)", (double)cfg->dropout);
    ferry_status st = FERRY_ERR_NOMEM;
    ferry_params full;
    ferry_params_init(&full, be);
    ferry_lm *lm = calloc(1, sizeof *lm);
    if (lm == NULL)
        return st;
    lm->cfg = *cfg;
    lm->be = be;
    ferry_params_init(&lm->P, be);
    if ((st = lm_declare_full(lm, &full)) != FERRY_OK)
        goto fail;
    if (placement == NULL) {
        if ((st = lm_declare_full(lm, &lm->P)) != FERRY_OK)
            goto fail;
    } else {
        /* The local embedding and decoder only served to learn the full layout. */
        memset(&lm->emb, 0, sizeof lm->emb);
        memset(&lm->dec, 0, sizeof lm->dec);
        if ((st = ferry_lstm_init(&lm->rnn, &lm->P, "lstm", cfg->E, cfg->H, cfg->L,
                                  cfg->dropout)) != FERRY_OK)
            goto fail;
    }
    for (int l = 0; l < cfg->L && cfg->stiefel_beta > 0.0f; l++) {
        st = ferry_params_set_constraint(&lm->P, lm->rnn.w_hh[l], FERRY_CONSTRAINT_STIEFEL,
                                         cfg->stiefel_beta);
        if (st != FERRY_OK)
            goto fail;
    }
    if ((st = ferry_params_alloc(&lm->P)) != FERRY_OK || (st = lm_init_local(lm, &full)) != FERRY_OK)
        goto fail;
    if (placement != NULL) {
        lm->decoder_mode = placement->decoder_mode;
        if ((st = lm_create_remote(lm, &full, placement)) != FERRY_OK)
            goto fail;
    }
    ferry_params_deinit(&full);
    *out = lm;
    return FERRY_OK;
fail:
    ferry_params_deinit(&full);
    ferry_lm_destroy(lm);
    return st;
}

ferry_status ferry_lm_create(ferry_backend *be, const ferry_lm_config *cfg, ferry_lm **out) {
    return ferry_lm_create_placed(be, cfg, NULL, out);
}

void ferry_lm_destroy(ferry_lm *lm) {
    if (lm == NULL)
        return;
    ferry_remote_destroy(lm->emb_remote);
    ferry_remote_destroy(lm->dec_remote);
    ferry_remote_destroy(lm->dense_remote);
    ferry_lm_pipe_destroy(lm->pipe);
    free(lm->stage);
    ferry_tensor_destroy(lm->h);
    ferry_tensor_destroy(lm->c);
    ferry_params_deinit(&lm->P);
    free(lm);
}

int ferry_lm_is_remote(const ferry_lm *lm) {
    return lm->emb_remote != NULL;
}

ferry_status ferry_lm_set_micro_batches(ferry_lm *lm, int M) {
    if (M < 1 || M > FERRY_LM_MAX_MICRO)
        return ferry_errorf(FERRY_ERR_RANGE, "micro-batches %d outside 1..%d", M,
                            FERRY_LM_MAX_MICRO);
    ferry_lm_pipe_destroy(lm->pipe);
    lm->pipe = NULL;
    return M == 1 ? FERRY_OK : ferry_lm_pipe_create(M, &lm->pipe);
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

/* ---- forward ---- */

/* Decoder and loss, local or remote in either decoder mode. */
static ferry_status lm_decode(ferry_lm *lm, ferry_ctx *ctx, ferry_dist_ctx *dc,
                              const ferry_tensor *y, const ferry_tensor *targets, float scale,
                              ferry_tensor **loss, double *loss_sum) {
    ferry_tensor *logits; /* (T, B, V) */
    ferry_status st;
    if (lm->dec_remote != NULL && lm->decoder_mode == FERRY_DECODER_SHARDED)
        return ferry_dist_xent_forward(lm->dec_remote, dc, ctx, y, targets, scale, loss, loss_sum);
    if (lm->dec_remote != NULL)
        st = ferry_dist_logits_forward(lm->dec_remote, dc, ctx, y, &logits);
    else
        st = ferry_linear_forward(&lm->dec, ctx, y, &logits);
    if (st != FERRY_OK)
        return st;
    return ferry_xent_forward(ctx, logits, targets, scale, loss, loss_sum);
}

ferry_status ferry_lm_forward(ferry_lm *lm, ferry_ctx *ctx, ferry_dist_ctx *dc,
                              const ferry_tensor *inputs, const ferry_tensor *targets,
                              float loss_scale, ferry_tensor **loss, double *loss_sum) {
    ferry_status st;
    if (inputs->shape.ndim != 2 || !ferry_shape_eq(inputs->shape, targets->shape))
        return ferry_errorf(FERRY_ERR_SHAPE, "model: inputs and targets must both be (T, B)");
    int64_t B = inputs->shape.dim[1];
    if (lm->h == NULL || lm->B != B) {
        if ((st = ferry_lm_reset_state(lm, B)) != FERRY_OK)
            return st;
    }
    float p = ferry_ctx_training(ctx) ? lm->cfg.dropout : 0.0f;
    ferry_tensor *x, *xd, *y, *yd, *hn, *cn;
    if (lm->emb_remote != NULL)
        st = ferry_dist_embedding_forward(lm->emb_remote, dc, ctx, inputs, &x);
    else
        st = ferry_embedding_forward(&lm->emb, ctx, inputs, &x);
    if (st != FERRY_OK)
        return st; /* (T, B, E) */
    if ((st = ferry_dropout_forward(ctx, p, x, &xd)) != FERRY_OK)
        return st;
    if ((st = ferry_lstm_forward(&lm->rnn, ctx, xd, lm->h, lm->c, NULL, &y, &hn, &cn)) !=
        FERRY_OK)
        return st; /* y (T, B, H); hn, cn (L, B, H) */
    if ((st = ferry_dropout_forward(ctx, p, y, &yd)) != FERRY_OK)
        return st;
    if ((st = lm_decode(lm, ctx, dc, yd, targets, loss_scale, loss, loss_sum)) != FERRY_OK)
        return st;
    /* Truncated BPTT: the next window starts from these values, detached. */
    size_t nbytes = ferry_tensor_nbytes(lm->h);
    if ((st = ferry_backend_copy(lm->be, lm->h->data, hn->data, nbytes,
                                 FERRY_COPY_DEVICE_TO_DEVICE)) != FERRY_OK)
        return st;
    return ferry_backend_copy(lm->be, lm->c->data, cn->data, nbytes, FERRY_COPY_DEVICE_TO_DEVICE);
}

/* ---- the training step ---- */

/* Clips by the norm over local and remote gradients, then steps the shards and the
 * local block at the same time: the shards' Step goes out (ferry_dist_ctx_step_start)
 * and the local update runs while it is in flight. */
static ferry_status lm_dist_step(ferry_lm *lm, ferry_dist_ctx *dc, ferry_optim *opt,
                                 ferry_grads *G, double local_sumsq, const ferry_lm_step_args *a,
                                 ferry_lm_step_result *res) {
    ferry_status st = ferry_dist_ctx_step_start(dc, local_sumsq, a->clip, a->lr, &res->coef,
                                                &res->grad_norm);
    if (st != FERRY_OK)
        return st;
    ferry_status local = ferry_optim_step(opt, &lm->P, G, res->coef);
    char err[256] = "";
    if (local != FERRY_OK)
        (void)snprintf(err, sizeof err, "%s", ferry_error_last());
    st = ferry_dist_ctx_step_wait(dc);
    if (st == FERRY_OK && local != FERRY_OK)
        st = ferry_errorf(local, "%s", err);
    return st;
}

/* The data-parallel step: push the LSTM's gradient (its rows to each server), tie
 * the context to the job step, then the servers' clipped step: GradNorm (bsp: of
 * every rank's summed gradient) and Step. Nothing is stepped here. */
static ferry_status lm_job_step(ferry_lm *lm, ferry_dist_ctx *dc, ferry_grads *G,
                                uint64_t pull_call, const ferry_tensor *inputs,
                                const ferry_lm_step_args *a, ferry_lm_step_result *res) {
    ferry_status st;
    memset(lm->stage, 0, (size_t)lm->P.numel * sizeof(float));
    for (int i = 0; i < lm->P.count; i++) {
        if (!G->touched[i])
            continue;
        const ferry_param *p = &lm->P.items[i];
        if ((st = ferry_backend_copy(lm->be, lm->stage + p->offset, G->dense + p->offset,
                                     (size_t)p->numel * sizeof(float),
                                     FERRY_COPY_DEVICE_TO_HOST)) != FERRY_OK)
            return st;
    }
    if ((st = ferry_remote_dense_push(lm->dense_remote, dc, pull_call, lm->stage)) != FERRY_OK)
        return st;
    double tokens = (double)ferry_tensor_numel(inputs);
    if ((st = ferry_dist_ctx_set_job(dc, lm->job, a->job_step, res->loss_sum, tokens)) != FERRY_OK)
        return st;
    double t0 = ferry_now();
    st = ferry_dist_ctx_clip_step(dc, 0.0, a->clip, a->lr, &res->coef, &res->grad_norm);
    res->sync_s = ferry_now() - t0;
    if (st != FERRY_OK)
        return st;
    ferry_dist_ctx_job_loss(dc, &res->job_loss_sum, &res->job_tokens);
    res->checkpoint = ferry_dist_ctx_job_checkpoint(dc);
    return FERRY_OK;
}

static ferry_status lm_step_body(ferry_lm *lm, ferry_ctx *ctx, ferry_dist_ctx *dc,
                                 ferry_optim *opt, const ferry_tensor *inputs,
                                 const ferry_tensor *targets, const ferry_lm_step_args *a,
                                 ferry_lm_step_result *res) {
    ferry_tensor *loss;
    ferry_status st;
    uint64_t pull_call = 0;
    res->job_tokens = (double)ferry_tensor_numel(inputs);
    if (lm->dense_remote != NULL) { /* this step starts from the job's weights */
        if ((st = ferry_remote_dense_pull(lm->dense_remote, dc, lm->stage, &pull_call)) !=
                FERRY_OK ||
            (st = ferry_backend_copy(lm->be, lm->P.data, lm->stage,
                                     (size_t)lm->P.numel * sizeof(float),
                                     FERRY_COPY_HOST_TO_DEVICE)) != FERRY_OK)
            return st;
    }
    if (lm->pipe != NULL && ferry_lm_is_remote(lm)) {
        if (lm->h == NULL || lm->B != inputs->shape.dim[1]) {
            if ((st = ferry_lm_reset_state(lm, inputs->shape.dim[1])) != FERRY_OK)
                return st;
        }
        if ((st = ferry_lm_pipe_forward_backward(lm, lm->pipe, ctx, dc, inputs, targets,
                                                 a->loss_scale, a->seed, &res->loss_sum)) !=
            FERRY_OK)
            return st;
        if (!isfinite(res->loss_sum))
            return ferry_errorf(FERRY_ERR_NUMERIC, "loss is %g: training diverged (lower --lr "
                                "or set --clip)", res->loss_sum);
    } else {
        if (lm->pipe != NULL)
            return ferry_errorf(FERRY_ERR_UNSUPPORTED, "micro-batches need the decoder on "
                                "ferry-ps (--ps)");
        if ((st = ferry_lm_forward(lm, ctx, dc, inputs, targets, a->loss_scale, &loss,
                                   &res->loss_sum)) != FERRY_OK)
            return st;
        if (!isfinite(res->loss_sum))
            return ferry_errorf(FERRY_ERR_NUMERIC, "loss is %g: training diverged (lower --lr "
                                "or set --clip)", res->loss_sum);
        if ((st = ferry_ctx_backward(ctx, loss)) != FERRY_OK)
            return st;
    }
    ferry_grads *G = ferry_ctx_grads(ctx, &lm->P);
    if (G == NULL)
        return FERRY_ERR_NOMEM;
    /* The owner adds the Stiefel penalty's gradient once per step, before clipping,
     * as loss = CE + beta sum ||W^T W - I||^2 would through autograd. In a job every
     * rank holds the same W, and rank 0 alone adds it: the summed gradient of a bsp
     * step then holds it once. */
    int owner = lm->job == NULL || ferry_job_get_config(lm->job)->rank == 0;
    if (lm->cfg.stiefel_beta > 0.0f && owner &&
        (st = ferry_stiefel_add_penalty_grads(&lm->P, G, &res->penalty, NULL)) != FERRY_OK)
        return st;
    res->job_loss_sum = res->loss_sum;
    if (lm->dense_remote != NULL)
        return lm_job_step(lm, dc, G, pull_call, inputs, a, res);
    double sumsq = 0.0;
    if ((st = ferry_grads_sumsq(G, &sumsq)) != FERRY_OK)
        return st;
    if (ferry_lm_is_remote(lm))
        st = lm_dist_step(lm, dc, opt, G, sumsq, a, res);
    else {
        res->coef = 1.0f;
        res->grad_norm = sqrt(sumsq);
        if (a->clip > 0.0f)
            st = ferry_clip_coef(sumsq, a->clip, &res->coef, &res->grad_norm);
        if (st == FERRY_OK)
            st = ferry_optim_step(opt, &lm->P, G, res->coef);
    }
    if (st == FERRY_OK && !isfinite(res->grad_norm))
        st = ferry_errorf(FERRY_ERR_NUMERIC, "gradient norm is %g", res->grad_norm);
    return st;
}

ferry_status ferry_lm_train_step(ferry_lm *lm, ferry_ctx *ctx, ferry_dist_ctx *dc, ferry_optim *opt,
                                 const ferry_tensor *inputs, const ferry_tensor *targets,
                                 const ferry_lm_step_args *args, ferry_lm_step_result *res) {
    memset(res, 0, sizeof *res);
    ferry_ctx_reset(ctx, args->ctx_id);
    ferry_ctx_set_training(ctx, 1);
    ferry_ctx_set_seed(ctx, args->seed);
    if (ferry_lm_is_remote(lm)) {
        if (dc == NULL)
            return ferry_errorf(FERRY_ERR_INVALID, "a distributed model needs a ferry_dist_ctx");
        (void)ferry_dist_ctx_begin(dc);
    }
    ferry_status st = lm_step_body(lm, ctx, dc, opt, inputs, targets, args, res);
    if (st != FERRY_OK && dc != NULL && ferry_dist_ctx_id(dc) != 0) {
        /* Keep the error message of the step, not of the release. */
        char err[512];
        (void)snprintf(err, sizeof err, "%s", ferry_error_last());
        /* A server that did not answer gets no cleanup call (it would cost another
         * deadline): it sweeps the context by itself. */
        if (st == FERRY_ERR_TIMEOUT || st == FERRY_ERR_UNAVAILABLE)
            ferry_dist_ctx_abandon(dc);
        else if (ferry_dist_ctx_release(dc) != FERRY_OK)
            FERRY_LOG_WARN("releasing context after a failed step: %s", ferry_error_last());
        (void)ferry_errorf(st, "%s", err);
    }
    return st;
}

/* ---- metrics ---- */

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
