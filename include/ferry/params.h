/* params.h - parameter blocks and per-context gradients.
 * A block holds all parameters of a model (or of a shard) in one allocation;
 * each parameter is a named range of it (llm.c's malloc_and_point_parameters).
 * Gradients and optimizer slots share the layout, so an update is one flat loop
 * and a push or pull is one contiguous range.
 *
 *     ferry_params P;  ferry_params_init(&P, be);
 *     ferry_params_add(&P, "decoder.weight", ferry_shape_2d(V, H), 0, &w);   // build
 *     ferry_params_alloc(&P);                                                // then allocate
 *     float *W = ferry_params_data(&P, w);
 *
 * A row-sparse parameter (embedding table) gets its gradient as a set of rows. */
#ifndef FERRY_PARAMS_H
#define FERRY_PARAMS_H

#include "ferry/export.h"

#include <stdint.h>

#include "ferry/backend.h"
#include "ferry/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_PARAM_NAME_MAX 64

enum {
    FERRY_PARAM_ROW_SPARSE = 1 << 0, /* gradient arrives as rows; optimizer is lazy */
};

typedef enum ferry_constraint_kind {
    FERRY_CONSTRAINT_NONE = 0,
    FERRY_CONSTRAINT_STIEFEL = 1, /* W^T W = I via cdopt's dissolving map: see
                                     ferry_lstm_forward (ferry/nn.h) and, for the
                                     penalty, ferry_stiefel_add_penalty_grads */
} ferry_constraint_kind;

typedef struct ferry_param {
    char name[FERRY_PARAM_NAME_MAX];
    ferry_shape shape;
    int64_t offset; /* first element in the block (multiple of 16: 64-byte aligned) */
    int64_t numel;
    int flags;
    ferry_constraint_kind constraint;
    float beta; /* Stiefel penalty weight (cdopt penalty_param) */
} ferry_param;

typedef struct ferry_params {
    ferry_backend *be;
    float *data;   /* numel floats on be, NULL until ferry_params_alloc */
    int64_t numel; /* block size including alignment padding */
    int count, cap;
    ferry_param *items;
} ferry_params;

/* Caller-provided storage; deinit frees what init and alloc took. */
FERRY_API void ferry_params_init(ferry_params *P, ferry_backend *be);
FERRY_API void ferry_params_deinit(ferry_params *P);
/* Declares a parameter before ferry_params_alloc. FERRY_ERR_EXISTS for a
 * duplicate name, FERRY_ERR_BUSY once allocated. *index receives its index. */
FERRY_API ferry_status ferry_params_add(ferry_params *P, const char *name, ferry_shape shape,
                                        int flags, int *index);
/* Allocates the zero-filled block. */
FERRY_API ferry_status ferry_params_alloc(ferry_params *P);
/* Index of the named parameter, or -1. */
FERRY_API int ferry_params_find(const ferry_params *P, const char *name);
FERRY_API float *ferry_params_data(const ferry_params *P, int index);
FERRY_API ferry_tensor ferry_params_tensor(const ferry_params *P, int index);
/* Fills parameter `index` with U(-scale, scale) drawn from (seed, element index in
 * the block): the same values on every backend and independent of other params. */
FERRY_API ferry_status ferry_params_init_uniform(ferry_params *P, int index, float scale,
                                                 uint64_t seed);
/* The same, drawing element i from index base + i: reproduces the values a parameter
 * would get at offset `base` of another block (a model split across processes). */
FERRY_API ferry_status ferry_params_init_uniform_at(ferry_params *P, int index, float scale,
                                                    uint64_t seed, int64_t base);
/* Marks a parameter as Stiefel-constrained with penalty weight beta. */
FERRY_API ferry_status ferry_params_set_constraint(ferry_params *P, int index,
                                                   ferry_constraint_kind kind, float beta);

/* ---- gradients ---- */

/* Row-sparse gradient of one (R, D) parameter: `count` distinct rows, values
 * (count, D) in slot order. */
typedef struct ferry_rowgrad {
    int64_t D;
    int64_t count, cap;
    int64_t *rows;    /* host: row id of each slot */
    float *values;    /* backend: (cap, D) */
    int64_t *hash;    /* host: open-addressing table row -> slot+1 (0 = empty) */
    int64_t hash_cap; /* power of two */
} ferry_rowgrad;

typedef struct ferry_grads {
    const ferry_params *P;
    float *dense;        /* backend: P->numel floats, allocated at the first dense
                            gradient (NULL before); only touched params are valid */
    uint8_t *touched;    /* host: per parameter, 1 once it has a gradient */
    ferry_rowgrad *rows; /* host array, one per parameter (used for ROW_SPARSE ones) */
} ferry_grads;

FERRY_API ferry_status ferry_grads_init(ferry_grads *G, const ferry_params *P);
FERRY_API void ferry_grads_deinit(ferry_grads *G);
/* Forgets every gradient (touched flags cleared; storage kept for reuse). */
FERRY_API void ferry_grads_zero(ferry_grads *G);
/* Dense gradient of parameter `index` to accumulate into (+=). Zero-filled on the
 * first call after ferry_grads_zero. NULL (with an error set) for a row-sparse
 * parameter or an allocation failure. */
FERRY_API float *ferry_grads_dense(ferry_grads *G, int index);
/* Adds src (backend memory, the parameter's numel floats) to the dense gradient of
 * parameter `index`: the first gradient since ferry_grads_zero is copied, not added
 * to zeros (one pass over the block instead of three). Errors as ferry_grads_dense. */
FERRY_API ferry_status ferry_grads_add_dense(ferry_grads *G, int index, const float *src);
/* Maps `count` row ids of a row-sparse parameter to slots, creating zero-filled
 * slots for new rows; slots[n] receives the slot of ids[n]: add the gradient row of
 * ids[n] into row slots[n] of the parameter's row values (D floats each).
 * FERRY_ERR_RANGE if an id is outside [0, R). */
FERRY_API ferry_status ferry_grads_row_slots(ferry_grads *G, int index, int64_t count,
                                             const int32_t *ids, int32_t *slots);
FERRY_API ferry_rowgrad *ferry_grads_rows(ferry_grads *G, int index);
/* Host and backend bytes G holds now: the dense block once a dense parameter got a
 * gradient, and each row-sparse table's capacity. */
FERRY_API int64_t ferry_grads_bytes(const ferry_grads *G);
/* The most G can grow by when each row-sparse parameter receives up to new_rows
 * rows it does not hold yet and the dense parameters get gradients (for budgets
 * checked before the memory is taken). */
FERRY_API int64_t ferry_grads_growth_bound(const ferry_grads *G, int64_t new_rows);
/* Sum of squares of every gradient held (dense and row-sparse), in double. */
FERRY_API ferry_status ferry_grads_sumsq(const ferry_grads *G, double *out);
/* Multiplies every gradient held by s. */
FERRY_API ferry_status ferry_grads_scale(ferry_grads *G, float s);
/* Adds src's gradients into dst (same block); for tests and multi-trainer sums. */
FERRY_API ferry_status ferry_grads_add(ferry_grads *dst, const ferry_grads *src);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_PARAMS_H */
