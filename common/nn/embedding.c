/* embedding.c - the lookup table layer: forward gathers rows of the (V, E) table
 * for host int32 ids; backward maps the ids to row slots of the context's
 * row-sparse gradient and scatter-adds the incoming rows there, so a step
 * touches only the rows it looked up (repeated ids accumulate). */
#include <stdio.h>
#include <string.h>

#include "common/tensor/backend.h"
#include "common/core/log.h"
#include "ferry/nn.h"

typedef struct embedding_saved {
    ferry_embedding *m;
    int64_t count;
    int32_t *ids; /* host copy: the caller may reuse its ids tensor before backward */
} embedding_saved;

ferry_status ferry_embedding_init(ferry_embedding *m, ferry_params *P, const char *prefix,
                                  int64_t V, int64_t E) {
    char name[FERRY_PARAM_NAME_MAX + 16];
    memset(m, 0, sizeof *m);
    if (V <= 0 || E <= 0)
        return ferry_errorf(FERRY_ERR_SHAPE,
                            "embedding %s: sizes must be positive (V=%lld, E=%lld)", prefix,
                            (long long)V, (long long)E);
    m->P = P;
    m->V = V;
    m->E = E;
    (void)snprintf(name, sizeof name, "%s.weight", prefix);
    return ferry_params_add(P, name, ferry_shape_2d(V, E), FERRY_PARAM_ROW_SPARSE, &m->weight);
}

/* A backend copy of count host int32s when the backend is not the host; else the
 * host pointer itself. */
static ferry_status ids_on_backend(ferry_ctx *ctx, int64_t count, const int32_t *host,
                                   const int32_t **out) {
    ferry_backend *be = ferry_ctx_backend(ctx);
    if (ferry_backend_is_host(be)) {
        *out = host;
        return FERRY_OK;
    }
    ferry_tensor *t;
    ferry_status st = ferry_ctx_tensor(ctx, FERRY_DTYPE_I32, ferry_shape_1d(count), &t);
    if (st == FERRY_OK)
        st = ferry_tensor_from_host(t, host);
    if (st == FERRY_OK)
        *out = ferry_tensor_i32(t);
    return st;
}

static ferry_status embedding_backward(ferry_ctx *ctx, void *saved, ferry_tensor *const *grad_out,
                                       ferry_tensor **grad_in) {
    (void)grad_in;
    embedding_saved *s = saved;
    ferry_embedding *m = s->m;
    ferry_grads *G = ferry_ctx_grads(ctx, m->P);
    if (G == NULL)
        return FERRY_NOMEM();
    int32_t *slots = ferry_ctx_host_alloc(ctx, (size_t)(s->count ? s->count : 1) * 4);
    if (slots == NULL)
        return FERRY_NOMEM();
    ferry_status st = ferry_grads_row_slots(G, m->weight, s->count, s->ids, slots);
    const int32_t *dslots = NULL;
    if (st == FERRY_OK)
        st = ids_on_backend(ctx, s->count, slots, &dslots);
    if (st != FERRY_OK)
        return st;
    /* rows[slot[n], :] += g[n, :] over the (count, E) incoming gradient. */
    return ferry_backend_scatter_add_rows(ferry_ctx_backend(ctx), s->count, m->E, dslots,
                                          ferry_tensor_f32(grad_out[0]),
                                          ferry_grads_rows(G, m->weight)->values);
}

ferry_status ferry_embedding_forward(ferry_embedding *m, ferry_ctx *ctx, const ferry_tensor *ids,
                                     ferry_tensor **out) {
    const char *name = m->P->items[m->weight].name; /* "<prefix>.weight" */
    int plen = (int)strlen(name) - 7;
    char is[64];
    if (m->P->data == NULL)
        return ferry_errorf(FERRY_ERR_INVALID, "embedding %.*s: parameters are not allocated", plen,
                            name);
    if (ids->dtype != FERRY_DTYPE_I32 || ids->shape.ndim >= FERRY_MAX_DIMS ||
        (ids->be != NULL && !ferry_backend_is_host(ids->be)))
        return ferry_errorf(FERRY_ERR_SHAPE,
                            "embedding %.*s: ids %s must be a host int32 tensor of at most %d "
                            "dims (table (%lld, %lld))",
                            plen, name, ferry_shape_str(ids->shape, is, sizeof is),
                            FERRY_MAX_DIMS - 1, (long long)m->V, (long long)m->E);
    int64_t count = ferry_tensor_numel(ids);
    const int32_t *hid = ferry_tensor_i32(ids);
    for (int64_t n = 0; n < count; n++)
        if (hid[n] < 0 || hid[n] >= m->V)
            return ferry_errorf(FERRY_ERR_RANGE,
                                "embedding %.*s: id %d at position %lld outside [0, %lld)", plen,
                                name, (int)hid[n], (long long)n, (long long)m->V);
    ferry_shape os = ids->shape;
    os.dim[os.ndim++] = m->E;
    ferry_tensor *y;
    const int32_t *did = NULL;
    ferry_status st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, os, &y);
    if (st == FERRY_OK)
        st = ids_on_backend(ctx, count, hid, &did);
    if (st == FERRY_OK) /* y(count, E) = weight[ids, :] */
        st = ferry_backend_gather_rows(ferry_ctx_backend(ctx), count, m->E, did,
                                       ferry_params_data(m->P, m->weight), ferry_tensor_f32(y));
    if (st != FERRY_OK)
        return st;
    if (ferry_ctx_training(ctx)) {
        embedding_saved *s = ferry_ctx_host_alloc(ctx, sizeof *s);
        int32_t *copy = ferry_ctx_host_alloc(ctx, (size_t)(count ? count : 1) * sizeof *copy);
        if (s == NULL || copy == NULL)
            return FERRY_NOMEM();
        memcpy(copy, hid, (size_t)count * sizeof *copy);
        s->m = m;
        s->count = count;
        s->ids = copy;
        if ((st = ferry_ctx_record(ctx, embedding_backward, s, 0, NULL, 1, &y)) != FERRY_OK)
            return st;
    }
    *out = y;
    return FERRY_OK;
}
