/* params.c - parameter blocks (one allocation, named ranges) and the gradients a
 * context accumulates for them: dense ranges zeroed lazily, row-sparse tables as
 * a slot map (row -> slot) over a growing (cap, D) value buffer. */
#include <stdlib.h>
#include <string.h>

#include "common/tensor/backend.h"
#include "common/core/log.h"
#include "ferry/params.h"

/* ---- blocks ---- */

void ferry_params_init(ferry_params *P, ferry_backend *be) {
    memset(P, 0, sizeof *P);
    P->be = be;
}

void ferry_params_deinit(ferry_params *P) {
    if (P == NULL)
        return;
    ferry_backend_free(P->be, P->data);
    free(P->items);
    memset(P, 0, sizeof *P);
}

int ferry_params_find(const ferry_params *P, const char *name) {
    for (int i = 0; i < P->count; i++)
        if (strcmp(P->items[i].name, name) == 0)
            return i;
    return -1;
}

ferry_status ferry_params_add(ferry_params *P, const char *name, ferry_shape shape, int flags,
                              int *index) {
    if (P->data != NULL)
        return ferry_errorf(FERRY_ERR_BUSY, "parameter '%s' added after allocation", name);
    if (strlen(name) >= FERRY_PARAM_NAME_MAX)
        return ferry_errorf(FERRY_ERR_INVALID, "parameter name too long: '%s'", name);
    if (ferry_params_find(P, name) >= 0)
        return ferry_errorf(FERRY_ERR_EXISTS, "duplicate parameter '%s'", name);
    if ((flags & FERRY_PARAM_ROW_SPARSE) && shape.ndim != 2)
        return ferry_errorf(FERRY_ERR_SHAPE, "row-sparse parameter '%s' must be 2-D", name);
    int64_t numel = ferry_shape_numel(shape);
    if (shape.ndim < 1 || numel <= 0)
        return ferry_errorf(FERRY_ERR_SHAPE, "parameter '%s' has an empty shape", name);
    if (P->count == P->cap) {
        int cap = P->cap ? 2 * P->cap : 16;
        ferry_param *items = realloc(P->items, (size_t)cap * sizeof *items);
        if (items == NULL)
            return FERRY_NOMEM();
        P->items = items;
        P->cap = cap;
    }
    ferry_param *p = &P->items[P->count];
    memset(p, 0, sizeof *p);
    memcpy(p->name, name, strlen(name) + 1);
    p->shape = shape;
    p->numel = numel;
    p->offset = P->numel;
    p->flags = flags;
    /* Keep every parameter 64-byte aligned so views vectorise cleanly. */
    P->numel += (numel + 15) & ~(int64_t)15;
    *index = P->count++;
    return FERRY_OK;
}

ferry_status ferry_params_alloc(ferry_params *P) {
    FERRY_ASSERT(P->data == NULL);
    size_t nbytes = (size_t)(P->numel ? P->numel : 16) * sizeof(float);
    ferry_status st = ferry_backend_alloc(P->be, nbytes, (void **)&P->data);
    if (st != FERRY_OK)
        return st;
    return ferry_backend_fill(P->be, P->data, P->numel, 0.0f);
}

float *ferry_params_data(const ferry_params *P, int index) {
    FERRY_ASSERT(index >= 0 && index < P->count && P->data != NULL);
    return P->data + P->items[index].offset;
}

ferry_tensor ferry_params_tensor(const ferry_params *P, int index) {
    return ferry_tensor_wrap(P->be, FERRY_DTYPE_F32, P->items[index].shape,
                             ferry_params_data(P, index));
}

ferry_status ferry_params_init_uniform(ferry_params *P, int index, float scale, uint64_t seed) {
    return ferry_params_init_uniform_at(P, index, scale, seed, P->items[index].offset);
}

ferry_status ferry_params_init_uniform_at(ferry_params *P, int index, float scale, uint64_t seed,
                                          int64_t base) {
    const ferry_param *p = &P->items[index];
    float *host = malloc((size_t)p->numel * sizeof(float));
    if (host == NULL)
        return FERRY_NOMEM();
    for (int64_t i = 0; i < p->numel; i++) {
        float u = ferry_rand_uniform(seed, (uint64_t)(base + i));
        host[i] = (2.0f * u - 1.0f) * scale;
    }
    ferry_status st = ferry_backend_copy(P->be, ferry_params_data(P, index), host,
                                         (size_t)p->numel * sizeof(float),
                                         FERRY_COPY_HOST_TO_DEVICE);
    free(host);
    return st;
}

ferry_status ferry_params_set_constraint(ferry_params *P, int index, ferry_constraint_kind kind,
                                         float beta) {
    ferry_param *p = &P->items[index];
    if (kind == FERRY_CONSTRAINT_STIEFEL &&
        (p->shape.ndim != 2 || p->shape.dim[0] < p->shape.dim[1]))
        return ferry_errorf(FERRY_ERR_SHAPE, "Stiefel parameter '%s' must be n x p with n >= p",
                            p->name);
    if (beta < 0.0f)
        return ferry_errorf(FERRY_ERR_INVALID, "negative penalty weight for '%s'", p->name);
    p->constraint = kind;
    p->beta = beta;
    return FERRY_OK;
}

/* ---- gradients ---- */

ferry_status ferry_grads_init(ferry_grads *G, const ferry_params *P) {
    memset(G, 0, sizeof *G);
    G->P = P;
    G->touched = calloc((size_t)(P->count ? P->count : 1), 1);
    G->rows = calloc((size_t)(P->count ? P->count : 1), sizeof *G->rows);
    if (G->touched == NULL || G->rows == NULL) {
        ferry_grads_deinit(G);
        return FERRY_NOMEM();
    }
    /* The dense block is allocated when a dense parameter first gets a gradient, so
     * the gradients of a row-sparse table take memory only for the rows touched. */
    for (int i = 0; i < P->count; i++)
        G->rows[i].D = P->items[i].shape.ndim == 2 ? P->items[i].shape.dim[1] : 1;
    return FERRY_OK;
}

void ferry_grads_deinit(ferry_grads *G) {
    if (G == NULL || G->P == NULL)
        return;
    if (G->rows != NULL) {
        for (int i = 0; i < G->P->count; i++) {
            free(G->rows[i].rows);
            free(G->rows[i].hash);
            ferry_backend_free(G->P->be, G->rows[i].values);
        }
    }
    ferry_backend_free(G->P->be, G->dense); /* NULL until a dense gradient came */
    free(G->rows);
    free(G->touched);
    memset(G, 0, sizeof *G);
}

void ferry_grads_zero(ferry_grads *G) {
    for (int i = 0; i < G->P->count; i++) {
        ferry_rowgrad *rg = &G->rows[i];
        if (rg->count > 0)
            memset(rg->hash, 0, (size_t)rg->hash_cap * sizeof *rg->hash);
        rg->count = 0;
        G->touched[i] = 0;
    }
}

/* Floats of the dense gradient block: the parameter block's layout. */
static int64_t dense_floats(const ferry_params *P) {
    return P->numel ? P->numel : 16;
}

/* The dense gradient block's storage for parameter `index` in *out, not cleared. */
static ferry_status dense_storage(ferry_grads *G, int index, float **out) {
    const ferry_param *p = &G->P->items[index];
    if (p->flags & FERRY_PARAM_ROW_SPARSE)
        return ferry_errorf(FERRY_ERR_INVALID, "parameter '%s' has a row-sparse gradient", p->name);
    if (G->dense == NULL) {
        ferry_status st = ferry_backend_alloc(G->P->be, (size_t)dense_floats(G->P) * sizeof(float),
                                              (void **)&G->dense);
        if (st != FERRY_OK)
            return st;
    }
    *out = G->dense + p->offset;
    return FERRY_OK;
}

float *ferry_grads_dense(ferry_grads *G, int index) {
    float *g = NULL;
    if (dense_storage(G, index, &g) != FERRY_OK)
        return NULL;
    if (!G->touched[index]) {
        if (ferry_backend_fill(G->P->be, g, G->P->items[index].numel, 0.0f) != FERRY_OK)
            return NULL;
        G->touched[index] = 1;
    }
    return g;
}

ferry_status ferry_grads_add_dense(ferry_grads *G, int index, const float *src) {
    float *g = NULL;
    ferry_status st = dense_storage(G, index, &g);
    if (st != FERRY_OK)
        return st;
    int64_t n = G->P->items[index].numel;
    if (G->touched[index])
        return ferry_backend_axpy(G->P->be, n, 1.0f, src, g);
    if ((st = ferry_backend_copy(G->P->be, g, src, (size_t)n * sizeof(float),
                                 FERRY_COPY_DEVICE_TO_DEVICE)) == FERRY_OK)
        G->touched[index] = 1;
    return st;
}

ferry_rowgrad *ferry_grads_rows(ferry_grads *G, int index) {
    return &G->rows[index];
}

static int64_t rowgrad_bytes(const ferry_rowgrad *rg, int64_t cap, int64_t hash_cap) {
    return cap * (rg->D * (int64_t)sizeof(float) + (int64_t)sizeof(int64_t)) +
           hash_cap * (int64_t)sizeof(int64_t);
}

int64_t ferry_grads_bytes(const ferry_grads *G) {
    int64_t n = G->P->count * (int64_t)(1 + sizeof(ferry_rowgrad));
    if (G->dense != NULL)
        n += dense_floats(G->P) * (int64_t)sizeof(float);
    for (int i = 0; i < G->P->count; i++)
        n += rowgrad_bytes(&G->rows[i], G->rows[i].cap, G->rows[i].hash_cap);
    return n;
}

int64_t ferry_grads_growth_bound(const ferry_grads *G, int64_t new_rows) {
    int64_t n = 0;
    int dense = 0;
    for (int i = 0; i < G->P->count; i++) {
        const ferry_rowgrad *rg = &G->rows[i];
        if (!(G->P->items[i].flags & FERRY_PARAM_ROW_SPARSE)) {
            dense = 1;
            continue;
        }
        /* As ferry_grads_row_slots grows it: capacity to the next power of two
         * (>= 64), the hash table to >= twice that, and during the copy the old
         * values are still held. */
        int64_t count = G->touched[i] ? rg->count : 0, want = count + new_rows, cap = rg->cap;
        if (want <= cap)
            continue;
        int64_t ncap = cap ? cap : 64, hcap = 64;
        while (ncap < want)
            ncap *= 2;
        while (hcap < 2 * ncap)
            hcap *= 2;
        n += rowgrad_bytes(rg, ncap, hcap) - rowgrad_bytes(rg, cap, rg->hash_cap) +
             cap * rg->D * (int64_t)sizeof(float);
    }
    if (dense && G->dense == NULL)
        n += dense_floats(G->P) * (int64_t)sizeof(float);
    return n;
}

static uint64_t row_hash(int64_t row) {
    uint64_t z = (uint64_t)row * 0x9E3779B97F4A7C15ull;
    return z ^ (z >> 29);
}

/* Grows the hash table to at least twice the slot capacity and rehashes. */
static ferry_status rowgrad_rehash(ferry_rowgrad *rg, int64_t want) {
    int64_t cap = 64;
    while (cap < 2 * want)
        cap *= 2;
    int64_t *h = calloc((size_t)cap, sizeof *h);
    if (h == NULL)
        return FERRY_NOMEM();
    for (int64_t s = 0; s < rg->count; s++) {
        uint64_t k = row_hash(rg->rows[s]) & (uint64_t)(cap - 1);
        while (h[k] != 0)
            k = (k + 1) & (uint64_t)(cap - 1);
        h[k] = s + 1;
    }
    free(rg->hash);
    rg->hash = h;
    rg->hash_cap = cap;
    return FERRY_OK;
}

static ferry_status rowgrad_reserve(ferry_rowgrad *rg, ferry_backend *be, int64_t want) {
    if (want <= rg->cap)
        return FERRY_OK;
    int64_t cap = rg->cap ? rg->cap : 64;
    while (cap < want)
        cap *= 2;
    int64_t *rows = realloc(rg->rows, (size_t)cap * sizeof *rows);
    if (rows == NULL)
        return FERRY_NOMEM();
    rg->rows = rows;
    float *values = NULL;
    ferry_status st = ferry_backend_alloc(be, (size_t)(cap * rg->D) * sizeof(float),
                                          (void **)&values);
    if (st != FERRY_OK)
        return st;
    if (rg->count > 0)
        st = ferry_backend_copy(be, values, rg->values, (size_t)(rg->count * rg->D) * 4,
                                FERRY_COPY_DEVICE_TO_DEVICE);
    ferry_backend_free(be, rg->values);
    rg->values = values;
    rg->cap = cap;
    return st;
}

ferry_status ferry_grads_row_slots(ferry_grads *G, int index, int64_t count, const int32_t *ids,
                                   int32_t *slots) {
    const ferry_param *p = &G->P->items[index];
    ferry_rowgrad *rg = &G->rows[index];
    ferry_backend *be = G->P->be;
    int64_t R = p->shape.dim[0];
    ferry_status st;
    if (!G->touched[index]) {
        rg->count = 0;
        if (rg->hash != NULL)
            memset(rg->hash, 0, (size_t)rg->hash_cap * sizeof *rg->hash);
        G->touched[index] = 1;
    }
    if ((st = rowgrad_reserve(rg, be, rg->count + count)) != FERRY_OK)
        return st;
    if (rg->hash_cap < 2 * rg->cap && (st = rowgrad_rehash(rg, rg->cap)) != FERRY_OK)
        return st;
    int64_t first_new = rg->count;
    for (int64_t n = 0; n < count; n++) {
        int64_t row = ids[n];
        if (row < 0 || row >= R)
            return ferry_errorf(FERRY_ERR_RANGE, "%s: row id %lld outside [0, %lld)", p->name,
                                (long long)row, (long long)R);
        uint64_t k = row_hash(row) & (uint64_t)(rg->hash_cap - 1);
        while (rg->hash[k] != 0 && rg->rows[rg->hash[k] - 1] != row)
            k = (k + 1) & (uint64_t)(rg->hash_cap - 1);
        if (rg->hash[k] == 0) {
            rg->rows[rg->count] = row;
            rg->hash[k] = ++rg->count;
        }
        slots[n] = (int32_t)(rg->hash[k] - 1);
    }
    /* New slots start at zero. */
    return ferry_backend_fill(be, rg->values + first_new * rg->D, (rg->count - first_new) * rg->D,
                              0.0f);
}

ferry_status ferry_grads_sumsq(const ferry_grads *G, double *out) {
    double total = 0.0, s;
    ferry_status st;
    for (int i = 0; i < G->P->count; i++) {
        if (!G->touched[i])
            continue;
        const ferry_param *p = &G->P->items[i];
        if (p->flags & FERRY_PARAM_ROW_SPARSE)
            st = ferry_backend_sumsq(G->P->be, G->rows[i].count * G->rows[i].D, G->rows[i].values,
                                     &s);
        else
            st = ferry_backend_sumsq(G->P->be, p->numel, G->dense + p->offset, &s);
        if (st != FERRY_OK)
            return st;
        total += s;
    }
    *out = total;
    return FERRY_OK;
}

ferry_status ferry_grads_scale(ferry_grads *G, float s) {
    ferry_status st = FERRY_OK;
    for (int i = 0; i < G->P->count && st == FERRY_OK; i++) {
        if (!G->touched[i])
            continue;
        const ferry_param *p = &G->P->items[i];
        if (p->flags & FERRY_PARAM_ROW_SPARSE)
            st = ferry_backend_scale(G->P->be, G->rows[i].count * G->rows[i].D, s,
                                     G->rows[i].values);
        else
            st = ferry_backend_scale(G->P->be, p->numel, s, G->dense + p->offset);
    }
    return st;
}

ferry_status ferry_grads_add(ferry_grads *dst, const ferry_grads *src) {
    FERRY_ASSERT(dst->P == src->P);
    ferry_backend *be = dst->P->be;
    ferry_status st = FERRY_OK;
    for (int i = 0; i < src->P->count && st == FERRY_OK; i++) {
        if (!src->touched[i])
            continue;
        const ferry_param *p = &src->P->items[i];
        if (p->flags & FERRY_PARAM_ROW_SPARSE) {
            const ferry_rowgrad *rg = &src->rows[i];
            int32_t *slots = malloc((size_t)(rg->count ? rg->count : 1) * sizeof *slots);
            int32_t *ids = malloc((size_t)(rg->count ? rg->count : 1) * sizeof *ids);
            if (slots == NULL || ids == NULL) {
                free(slots);
                free(ids);
                return FERRY_NOMEM();
            }
            for (int64_t s = 0; s < rg->count; s++)
                ids[s] = (int32_t)rg->rows[s];
            st = ferry_grads_row_slots(dst, i, rg->count, ids, slots);
            if (st == FERRY_OK)
                st = ferry_backend_scatter_add_rows(be, rg->count, rg->D, slots, rg->values,
                                                    dst->rows[i].values);
            free(slots);
            free(ids);
        } else {
            st = ferry_grads_add_dense(dst, i, src->dense + p->offset);
        }
    }
    return st;
}
