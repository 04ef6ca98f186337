/* embedding.c - the `embedding` module kind: rows [row_begin, row_begin + R) of a
 * global (V, E) table (row sharding). Forward takes the unique global ids a
 * trainer needs from this shard and returns their rows; Backward takes the summed
 * gradient of each of those rows and keeps it as a row-sparse gradient in the
 * context, so the optimizer updates only the touched rows (lazily). */
#include <stdlib.h>
#include <string.h>

#include "common/tensor/backend.h"
#include "common/core/log.h"
#include "server/ps-impl.h"

static ferry_status embedding_declare(ferry__ps_module *m) {
    m->rows = m->cfg.row_count;
    m->cols = m->cfg.dims[1];
    m->b = -1;
    return ferry_params_add(&m->P, FERRY_WIRE_PARAM_NAME(WEIGHT), ferry_shape_2d(m->rows, m->cols),
                            FERRY_PARAM_ROW_SPARSE, &m->w);
}

/* ids "ids" (U) global, I32 or I64 -> "rows" (U, E). Saves the local row indices. */
static ferry_status embedding_forward(ferry__ps_module *m, ferry_wire_mode mode, ferry_rpc_msg *req,
                                      ferry_rpc_msg *reply, ferry__ps_saved *save) {
    (void)mode; /* one mode */
    int64_t want[1] = {-1};
    int ii;
    ferry_status st = ferry__ps_input(m, req, FERRY_WIRE_EMBEDDING_FWD_IDS, want, &ii);
    if (st != FERRY_OK)
        return st;
    int64_t U = req->tensors[ii].dim[0], E = m->cols;
    int64_t lo = m->cfg.row_begin, hi = m->cfg.row_begin + m->rows;
    /* The reply first: one too large to send is refused before anything else is
     * allocated for it. */
    int64_t dim[2] = {U, E};
    float *rows; /* (U, E) */
    if ((st = ferry__ps_output(reply, FERRY_WIRE_EMBEDDING_FWD_ROWS, dim, (void **)&rows)) !=
        FERRY_OK)
        return st;
    int64_t *ids = malloc((size_t)(U > 0 ? U : 1) * sizeof *ids);
    int32_t *local = NULL;
    if (ids == NULL)
        return FERRY_NOMEM();
    ferry__ps_read_ids(&req->tensors[ii], U, ids);
    for (int64_t u = 0; u < U; u++) {
        if (ids[u] < lo || ids[u] >= hi) {
            st = ferry_errorf(FERRY_ERR_RANGE,
                              "embedding '%s': ids[%lld] = %lld outside this shard's rows "
                              "[%lld, %lld)",
                              m->name, (long long)u, (long long)ids[u], (long long)lo,
                              (long long)hi);
            goto done;
        }
    }
    if (save != NULL) {
        save->N = U;
        st = ferry__ps_saved_alloc(save, (size_t)(U > 0 ? U : 1) * sizeof *local, "row indices",
                                   (void **)&local);
    } else if ((local = malloc((size_t)(U > 0 ? U : 1) * sizeof *local)) == NULL) {
        st = FERRY_NOMEM();
    }
    if (st != FERRY_OK)
        goto done;
    for (int64_t u = 0; u < U; u++)
        local[u] = (int32_t)(ids[u] - lo);
    if (U > 0)
        st = ferry_backend_gather_rows(m->P.be, U, E, local, ferry_params_data(&m->P, m->w), rows);
done:
    free(ids);
    if (save == NULL)
        free(local);
    return st;
}

/* "grad" (U, E): the summed gradient of each row the Forward returned. */
static ferry_status embedding_backward(ferry__ps_module *m, const Ferry__V1__BackwardRequest *q,
                                       ferry__ps_saved *saved, ferry_rpc_msg *req, ferry_grads *G,
                                       ferry_rpc_msg *reply) {
    (void)q;
    (void)reply;
    int64_t U = saved->N, E = m->cols;
    int64_t want[2] = {U, E};
    int ig;
    ferry_status st = ferry__ps_input(m, req, FERRY_WIRE_EMBEDDING_BWD_GRAD, want, &ig);
    if (st != FERRY_OK)
        return st;
    const float *grad = req->tensors[ig].data; /* (U, E) */
    if ((st = ferry__ps_check_finite(m, ferry_wire_tensors[FERRY_WIRE_EMBEDDING_BWD_GRAD].name,
                                     grad, U * E)) != FERRY_OK)
        return st;
    if (U == 0)
        return FERRY_OK;
    int32_t *slots = malloc((size_t)U * sizeof *slots);
    if (slots == NULL)
        return FERRY_NOMEM();
    st = ferry_grads_row_slots(G, m->w, U, saved->t[0].data, slots);
    if (st == FERRY_OK)
        st = ferry_backend_scatter_add_rows(m->P.be, U, E, slots, grad,
                                            ferry_grads_rows(G, m->w)->values);
    free(slots);
    return st;
}

const ferry__ps_kind ferry__ps_kind_embedding = {
    .wire = FERRY_WIRE_KIND_EMBEDDING,
    .declare = embedding_declare,
    .forward = embedding_forward,
    .backward = embedding_backward,
};
