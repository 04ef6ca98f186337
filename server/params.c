/* params.c - GetParams and SetParams: named parameters of a module, read or written
 * over a range of global rows (dim 0 of every parameter is the shard's row
 * dimension: embedding and decoder rows, a linear module's output units). A write
 * bumps the module's version like a step does. */
#include <stdio.h>
#include <string.h>

#include "common/core/checked.h"
#include "common/core/log.h"
#include "server/ps-impl.h"

/* Resolves [row_begin, row_begin + row_count) to local rows; row_count 0 means the
 * whole shard. Both numbers come from the wire: the check never forms an
 * overflowing sum. */
static ferry_status resolve_rows(const ferry__ps_module *m, int64_t row_begin, int64_t row_count,
                                 int64_t *lo, int64_t *n) {
    int64_t first = m->cfg.row_begin, end = m->cfg.row_begin + m->rows;
    if (row_count == 0) {
        *lo = 0;
        *n = m->rows;
        return FERRY_OK;
    }
    if (!ferry_checked_range(row_begin, row_count, first, end))
        return ferry_errorf(FERRY_ERR_RANGE,
                            "%s '%s': rows (begin %lld, count %lld) outside this shard's "
                            "rows [%lld, %lld)",
                            ferry__ps_kind_name(m->kind), m->name, (long long)row_begin,
                            (long long)row_count, (long long)first, (long long)end);
    *lo = row_begin - first;
    *n = row_count;
    return FERRY_OK;
}

static ferry_status unknown_param(const ferry__ps_module *m, const char *name) {
    return ferry_errorf(FERRY_ERR_NOT_FOUND, "%s '%s' has no parameter '%s' (%s%s)",
                        ferry__ps_kind_name(m->kind), m->name, name, FERRY_WIRE_PARAM_NAME(WEIGHT),
                        m->b >= 0 ? ", bias" : "");
}

static ferry_status get_params(ferry__ps_module *m, const Ferry__V1__GetParamsRequest *q,
                               ferry_rpc_msg *reply) {
    int64_t lo, n;
    ferry_status st = resolve_rows(m, q->row_begin, q->row_count, &lo, &n);
    if (st != FERRY_OK)
        return st;
    int idx[8], count = 0;
    if (q->n_names == 0) {
        for (int p = 0; p < m->P.count; p++)
            idx[count++] = p;
    }
    for (size_t i = 0; i < q->n_names; i++) {
        int p = ferry_params_find(&m->P, q->names[i]);
        if (p < 0)
            return unknown_param(m, q->names[i]);
        if (count == (int)(sizeof idx / sizeof idx[0]))
            return ferry_errorf(FERRY_ERR_INVALID, "GetParams: too many names");
        idx[count++] = p;
    }
    pthread_rwlock_rdlock(&m->lock);
    for (int k = 0; k < count && st == FERRY_OK; k++) {
        const ferry_param *pp = &m->P.items[idx[k]];
        int64_t row = pp->numel / pp->shape.dim[0]; /* floats per row */
        int64_t dim[2] = {n, row};
        float *dst;
        st = ferry_rpc_msg_alloc(reply, FERRY_RPC_DTYPE_F32, pp->shape.ndim, dim, pp->name,
                                 (void **)&dst);
        if (st == FERRY_OK)
            memcpy(dst, ferry_params_data(&m->P, idx[k]) + lo * row,
                   (size_t)(n * row) * sizeof(float));
    }
    Ferry__V1__GetParamsReply r;
    ferry__v1__get_params_reply__init(&r);
    r.version = m->version;
    pthread_rwlock_unlock(&m->lock);
    if (st != FERRY_OK)
        return st;
    return ferry_rpc_msg_set_head(reply, &r.base);
}

static ferry_status set_params(ferry__ps_module *m, const Ferry__V1__SetParamsRequest *q,
                               ferry_rpc_msg *req, ferry_rpc_msg *reply) {
    if (req->ntensors == 0)
        return ferry_errorf(FERRY_ERR_INVALID, "SetParams of '%s' carries no tensors", m->name);
    /* Check everything first: a rejected call changes nothing. */
    for (int i = 0; i < req->ntensors; i++) {
        const ferry_rpc_tensor *t = &req->tensors[i];
        int p = ferry_params_find(&m->P, t->name);
        if (p < 0)
            return unknown_param(m, t->name);
        const ferry_param *pp = &m->P.items[p];
        int64_t want[2] = {-1, pp->shape.ndim > 1 ? pp->shape.dim[1] : 0};
        int64_t lo, n;
        int ix;
        ferry_status st =
            ferry__ps_input_as(m, req, t->name, FERRY_RPC_DTYPE_F32, pp->shape.ndim, want, &ix);
        if (st == FERRY_OK && ix != i)
            st = ferry_errorf(FERRY_ERR_INVALID, "SetParams: parameter '%s' given twice", t->name);
        if (st == FERRY_OK && t->dim[0] == 0)
            st = ferry_errorf(FERRY_ERR_INVALID, "SetParams: '%s' has no rows", t->name);
        if (st == FERRY_OK)
            st = resolve_rows(m, q->row_begin, t->dim[0], &lo, &n);
        if (st == FERRY_OK)
            st = ferry__ps_check_finite(m, t->name, t->data, (int64_t)(t->nbytes / 4));
        if (st != FERRY_OK)
            return st;
    }
    pthread_rwlock_wrlock(&m->lock);
    for (int i = 0; i < req->ntensors; i++) {
        const ferry_rpc_tensor *t = &req->tensors[i];
        int p = ferry_params_find(&m->P, t->name);
        const ferry_param *pp = &m->P.items[p];
        int64_t row = pp->numel / pp->shape.dim[0];
        int64_t lo = q->row_begin - m->cfg.row_begin;
        memcpy(ferry_params_data(&m->P, p) + lo * row, t->data, t->nbytes);
    }
    Ferry__V1__SetParamsReply r;
    ferry__v1__set_params_reply__init(&r);
    r.version = ++m->version;
    pthread_rwlock_unlock(&m->lock);
    return ferry_rpc_msg_set_head(reply, &r.base);
}

/* The module is held (referenced) while the call runs. */
ferry_status ferry__ps_on_get_params(ferry__ps_state *ps, ferry__ps_session *sess,
                                     const Ferry__V1__GetParamsRequest *q, ferry_rpc_msg *req,
                                     ferry_rpc_msg *reply) {
    (void)req; /* the header says it all */
    ferry__ps_module *m = ferry__ps_module_find(ps, sess, q->module);
    if (m == NULL)
        return FERRY_ERR_NOT_FOUND;
    ferry_status st = get_params(m, q, reply);
    ferry__ps_module_put(m);
    return st;
}

ferry_status ferry__ps_on_set_params(ferry__ps_state *ps, ferry__ps_session *sess,
                                     const Ferry__V1__SetParamsRequest *q, ferry_rpc_msg *req,
                                     ferry_rpc_msg *reply) {
    ferry__ps_module *m = ferry__ps_module_find(ps, sess, q->module);
    if (m == NULL)
        return FERRY_ERR_NOT_FOUND;
    ferry_status st = set_params(m, q, req, reply);
    ferry__ps_module_put(m);
    return st;
}
