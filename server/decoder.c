/* decoder.c - the `decoder` module kind: a vocabulary slice W_s (V_s, H), b_s (V_s)
 * of the output layer, rows [row_begin, row_begin + V_s) of the global (V, H).
 * Mode "logits" returns z_s = h W_s^T + b_s (N, V_s) and takes dz_s back (the classic
 * design). Mode "partials" (the default) is the sharded softmax of docs/architecture.md
 * §2: it returns per-row max, sum of exp relative to it (float64) and the target's
 * logit, so only O(N) numbers cross the wire; its Backward takes a per-row factor
 * that turns the saved exp(z - max) into the exact softmax and forms
 * (softmax - onehot) * scale for the slice. Both run through the backend ops
 * softmax_partials / softmax_grad, the local cross-entropy's own kernels. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/tensor/backend.h"
#include "common/core/checked.h"
#include "common/core/log.h"
#include "server/ps-impl.h"

enum { DECODER_LOGITS = 1, DECODER_PARTIALS = 2 };

static ferry_status decoder_declare(ferry__ps_module *m) {
    const ferry__ps_module_config *c = &m->cfg;
    m->rows = c->row_count;
    m->cols = c->dims[1];
    ferry_status st = ferry_params_add(&m->P, FERRY_WIRE_PARAM_NAME(WEIGHT), ferry_shape_2d(m->rows, m->cols), 0, &m->w);
    if (st == FERRY_OK)
        st = ferry_params_add(&m->P, FERRY_WIRE_PARAM_NAME(BIAS), ferry_shape_1d(m->rows), 0, &m->b);
    return st;
}

static ferry_status partials_forward(ferry__ps_module *m, ferry_rpc_msg *req, ferry_rpc_msg *reply,
                                     ferry__ps_saved *save) {
    const ferry__ps_module_config *c = &m->cfg;
    int64_t Vs = m->rows, H = m->cols;
    int64_t want_h[2] = {-1, H};
    int ih, it;
    ferry_status st = ferry__ps_input(m, req, FERRY_WIRE_DECODER_FWD_HIDDEN, want_h, &ih);
    if (st != FERRY_OK)
        return st;
    int64_t N = req->tensors[ih].dim[0];
    int64_t want_t[1] = {N};
    if ((st = ferry__ps_input(m, req, FERRY_WIRE_DECODER_FWD_TARGETS, want_t, &it)) != FERRY_OK)
        return st;
    const float *h = req->tensors[ih].data; /* (N, H) */
    if ((st = ferry__ps_check_finite(m, "hidden", h, N * H)) != FERRY_OK)
        return st;
    /* The logits z (N, V_s) are the big buffer: kept for Backward they are charged to
     * the context, otherwise they are one call's scratch. */
    size_t zbytes;
    if (!ferry_checked_bytes(N, Vs, sizeof(float), &zbytes))
        zbytes = (size_t)INT64_MAX;
    if (save == NULL &&
        (st = ferry__ps_scratch_check(m, (int64_t)zbytes, "logits (N x V_s floats)")) != FERRY_OK)
        return st;
    /* Buffers: z (N, V_s) and local targets (N), kept for backward when saving. */
    float *z = NULL;
    int32_t *lt = NULL;
    int64_t *gt = malloc((size_t)(N > 0 ? N : 1) * sizeof *gt);
    if (gt == NULL)
        return FERRY_NOMEM();
    ferry__ps_read_ids(&req->tensors[it], N, gt);
    for (int64_t n = 0; n < N; n++) {
        if (gt[n] < 0 || gt[n] >= c->dims[0]) {
            st = ferry_errorf(FERRY_ERR_RANGE,
                              "decoder '%s': targets[%lld] = %lld outside the vocabulary "
                              "[0, %lld)",
                              m->name, (long long)n, (long long)gt[n], (long long)c->dims[0]);
            free(gt);
            return st;
        }
    }
    if (save != NULL) {
        save->mode = DECODER_PARTIALS;
        save->N = N;
        if ((st = ferry__ps_saved_take(save, req, ih)) != FERRY_OK || /* t[0]: h (N, H) */
            (st = ferry__ps_saved_alloc(save, zbytes, "logits (N x V_s)", (void **)&z)) !=
                FERRY_OK || /* t[1]: z (N, V_s) */
            (st = ferry__ps_saved_alloc(save, (size_t)N * sizeof *lt, "targets", (void **)&lt)) !=
                FERRY_OK) { /* t[2]: local targets (N) */
            free(gt);
            return st;
        }
        h = save->t[0].data;
    } else {
        z = malloc(zbytes > 0 ? zbytes : 1);
        lt = malloc((size_t)(N > 0 ? N : 1) * sizeof *lt);
        if (z == NULL || lt == NULL)
            st = FERRY_NOMEM();
    }
    for (int64_t n = 0; st == FERRY_OK && n < N; n++) {
        int64_t r = gt[n] - c->row_begin;
        lt[n] = r >= 0 && r < Vs ? (int32_t)r : -1;
    }
    free(gt);
    int64_t dim[1] = {N};
    float *mx, *tl;
    double *se;
    int32_t *has;
    if (st == FERRY_OK)
        st = ferry__ps_affine_apply(m, N, h, z);
    if (st == FERRY_OK)
        st = ferry__ps_output(reply, FERRY_WIRE_DECODER_FWD_MAX, dim, (void **)&mx);
    if (st == FERRY_OK)
        st = ferry__ps_output(reply, FERRY_WIRE_DECODER_FWD_SUMEXP, dim, (void **)&se);
    if (st == FERRY_OK)
        st = ferry__ps_output(reply, FERRY_WIRE_DECODER_FWD_TARGET_LOGIT, dim, (void **)&tl);
    if (st == FERRY_OK)
        st = ferry__ps_output(reply, FERRY_WIRE_DECODER_FWD_HAS_TARGET, dim, (void **)&has);
    /* z (N, V_s) becomes exp(z - max) in place: what Backward needs. */
    if (st == FERRY_OK)
        st = ferry_backend_softmax_partials(m->P.be, N, Vs, z, lt, mx, se, tl);
    for (int64_t n = 0; st == FERRY_OK && n < N; n++)
        has[n] = lt[n] >= 0;
    if (save == NULL) {
        free(z);
        free(lt);
    }
    return st;
}

static ferry_status decoder_forward(ferry__ps_module *m, ferry_wire_mode mode, ferry_rpc_msg *req,
                                    ferry_rpc_msg *reply, ferry__ps_saved *save) {
    if (mode == FERRY_WIRE_MODE_DECODER_PARTIALS)
        return partials_forward(m, req, reply, save);
    ferry_status st =
        ferry__ps_affine_forward(m, FERRY_WIRE_DECODER_LOGITS_FWD_HIDDEN,
                                 FERRY_WIRE_DECODER_LOGITS_FWD_LOGITS, req, reply, save);
    if (save != NULL)
        save->mode = DECODER_LOGITS;
    return st;
}

/* Backward of the sharded softmax: the trainer sends per row
 * factor = exp(max_slice - max_all) / sumexp_all, which turns the saved
 * e = exp(z - max_slice) into the exact softmax; dz = (softmax - onehot) * scale is
 * formed in place, then the affine gradients. */
static ferry_status partials_backward(ferry__ps_module *m, const Ferry__V1__BackwardRequest *q,
                                      ferry__ps_saved *sv, ferry_rpc_msg *req, ferry_grads *G,
                                      ferry_rpc_msg *reply) {
    int64_t N = sv->N, Vs = m->rows, H = m->cols;
    int64_t want[1] = {N};
    int il, isc = -1;
    ferry_status st = ferry__ps_input(m, req, FERRY_WIRE_DECODER_BWD_FACTOR, want, &il);
    if (st != FERRY_OK)
        return st;
    const float *factor = req->tensors[il].data; /* (N) */
    if ((st = ferry__ps_check_finite(m, ferry_wire_tensors[FERRY_WIRE_DECODER_BWD_FACTOR].name,
                                     factor, N)) != FERRY_OK)
        return st;
    const float *row_scale = NULL; /* (N) or none */
    if ((st = ferry__ps_input(m, req, FERRY_WIRE_DECODER_BWD_SCALE, want, &isc)) != FERRY_OK)
        return st;
    if (isc >= 0) { /* optional */
        row_scale = req->tensors[isc].data;
        if ((st = ferry__ps_check_finite(m, ferry_wire_tensors[FERRY_WIRE_DECODER_BWD_SCALE].name,
                                         row_scale, N)) != FERRY_OK)
            return st;
    }
    if (q->args_case != FERRY__V1__BACKWARD_REQUEST__ARGS__NOT_SET &&
        q->args_case != FERRY__V1__BACKWARD_REQUEST__ARGS_DECODER)
        return ferry_errorf(FERRY_ERR_INVALID, "decoder '%s': Backward arguments of another kind",
                            m->name);
    double ls = q->args_case == FERRY__V1__BACKWARD_REQUEST__ARGS_DECODER && q->decoder != NULL
                    ? q->decoder->loss_scale
                    : 0.0;
    float scale = ls != 0.0 ? (float)ls : 1.0f;
    if (!isfinite(scale))
        return ferry_errorf(FERRY_ERR_NUMERIC, "decoder '%s': Backward scale is %g", m->name,
                            (double)scale);
    int64_t dim[2] = {N, H};
    float *dh;
    if ((st = ferry__ps_output(reply, FERRY_WIRE_DECODER_BWD_DH, dim, (void **)&dh)) != FERRY_OK)
        return st;
    const float *h = sv->t[0].data;    /* (N, H) */
    float *z = sv->t[1].data;          /* (N, V_s): exp(z - max_slice), becomes dz */
    const int32_t *lt = sv->t[2].data; /* (N), -1: target outside the slice */
    if ((st = ferry_backend_softmax_grad(m->P.be, N, Vs, z, factor, lt, row_scale, scale)) !=
        FERRY_OK)
        return st;
    return ferry__ps_affine_grad(m, N, h, z, G, dh, sv);
}

static ferry_status decoder_backward(ferry__ps_module *m, const Ferry__V1__BackwardRequest *q,
                                     ferry__ps_saved *saved, ferry_rpc_msg *req, ferry_grads *G,
                                     ferry_rpc_msg *reply) {
    if (saved->mode == DECODER_LOGITS)
        return ferry__ps_affine_backward(m, FERRY_WIRE_DECODER_LOGITS_BWD_DLOGITS,
                                         FERRY_WIRE_DECODER_LOGITS_BWD_DH, saved, req, G, reply);
    return partials_backward(m, q, saved, req, G, reply);
}

const ferry__ps_kind ferry__ps_kind_decoder = {
    .wire = FERRY_WIRE_KIND_DECODER,
    .declare = decoder_declare,
    .forward = decoder_forward,
    .backward = decoder_backward,
    .late_dw = 1,
};
