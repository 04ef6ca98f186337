/* dense.c - the `dense` module kind: rows [row_begin, row_begin + R_s) of a global
 * (R, C) block of parameters that a trainer computes with itself, as ps-lite's and
 * MXNet's kvstore keep a model's dense weights: the master copy and its optimizer
 * state live here, split over the servers by rows. Forward ("pull") returns the
 * shard's rows as they are now; its Backward ("push") takes their gradient and
 * keeps it, dense, in the context, so Step updates them with the dense optimizer.
 * ferry-trainer keeps the LSTM of a data-parallel job in one such module. */
#include <string.h>

#include "common/tensor/backend.h"
#include "server/ps-impl.h"
#include "common/core/log.h"

static ferry_status dense_declare(ferry__ps_module *m) {
    m->rows = m->cfg.row_count;
    m->cols = m->cfg.dims[1];
    m->b = -1;
    return ferry_params_add(&m->P, FERRY_WIRE_PARAM_NAME(WEIGHT), ferry_shape_2d(m->rows, m->cols),
                            0, &m->w);
}

/* No input -> "weight" (R_s, C). Nothing is saved: the push needs only the shape. */
static ferry_status dense_forward(ferry__ps_module *m, ferry_wire_mode mode, ferry_rpc_msg *req,
                                  ferry_rpc_msg *reply, ferry__ps_saved *save) {
    (void)mode; /* one mode */
    (void)req;
    int64_t dim[2] = {m->rows, m->cols};
    float *w;
    ferry_status st = ferry__ps_output(reply, FERRY_WIRE_DENSE_FWD_WEIGHT, dim, (void **)&w);
    if (st != FERRY_OK)
        return st;
    if (save != NULL)
        save->N = m->rows;
    return ferry_backend_copy(m->P.be, w, ferry_params_data(&m->P, m->w),
                              (size_t)(m->rows * m->cols) * sizeof(float),
                              FERRY_COPY_DEVICE_TO_HOST);
}

/* "grad" (R_s, C), added to the context's dense gradient. */
static ferry_status dense_backward(ferry__ps_module *m, const Ferry__V1__BackwardRequest *q,
                                   ferry__ps_saved *saved, ferry_rpc_msg *req, ferry_grads *G,
                                   ferry_rpc_msg *reply) {
    (void)q;
    (void)saved;
    (void)reply;
    int64_t want[2] = {m->rows, m->cols};
    int ig;
    ferry_status st = ferry__ps_input(m, req, FERRY_WIRE_DENSE_BWD_GRAD, want, &ig);
    if (st != FERRY_OK)
        return st;
    const float *grad = req->tensors[ig].data;
    int64_t n = m->rows * m->cols;
    if ((st = ferry__ps_check_finite(m, ferry_wire_tensors[FERRY_WIRE_DENSE_BWD_GRAD].name, grad,
                                     n)) != FERRY_OK)
        return st;
    float *g = ferry_grads_dense(G, m->w);
    if (g == NULL)
        return FERRY_NOMEM_SAID;
    return ferry_backend_axpy(m->P.be, n, 1.0f, grad, g);
}

const ferry__ps_kind ferry__ps_kind_dense = {
    .wire = FERRY_WIRE_KIND_DENSE,
    .declare = dense_declare,
    .forward = dense_forward,
    .backward = dense_backward,
};
