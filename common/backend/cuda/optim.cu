/* optim.cu - the optimizer update on the device: SGD (momentum, dampening,
 * Nesterov), Adagrad, Adadelta, Adam and AdamW, dense or over the touched rows of a
 * table. The float32 constants come from the double hyper-parameters exactly as in
 * common/backend/cpu/optim.c, and the per-element formulas are that file's, in the
 * same operation order; this folder builds with --fmad=false, so results match the
 * CPU bit for bit. Row ids arrive in host memory and are staged to the device. */
#include <math.h>

#include "common/backend/cuda/ops.cuh"
#include "common/tensor/optim-consts.h"

/* The update's float32 constants come from ferry__optim_consts_init (optim-consts.h),
 * shared with the CPU backend. */
typedef ferry_optim_consts consts;

/* One element of any rule: p, gradient g, state s0/s1 (NULL where unused). */
__device__ static void update_one(const consts &c, float *p, float g, float *s0, float *s1,
                                  int fresh) {
    const float s = c.scale, wd = c.wd;
    switch (c.kind) {
    case FERRY_OPTIM_SGD: {
        const float m = c.a, damp1 = c.a1, nlr = c.neg_lr;
        float pv = *p;
        if (!c.has_buf) {
            *p = wd != 0.0f ? pv + nlr * (g * s + wd * pv) : pv + nlr * (g * s);
            return;
        }
        float buf;
        if (fresh)
            buf = wd != 0.0f ? g * s + wd * pv : g * s;
        else if (wd != 0.0f)
            buf = *s0 * m + damp1 * (g * s + wd * pv);
        else
            buf = *s0 * m + damp1 * (g * s);
        *s0 = buf;
        if (!c.nesterov)
            *p = pv + nlr * buf;
        else if (wd != 0.0f)
            *p = pv + nlr * ((g * s + wd * pv) + m * buf);
        else
            *p = pv + nlr * (g * s + m * buf);
        return;
    }
    case FERRY_OPTIM_ADAGRAD: {
        float d = g * s;
        if (wd != 0.0f)
            d = d + wd * *p;
        float acc = *s0 + d * d;
        *s0 = acc;
        *p = *p + (c.neg_lr * d) / (sqrtf(acc) + c.eps);
        return;
    }
    case FERRY_OPTIM_ADADELTA: {
        float d = g * s;
        if (wd != 0.0f)
            d = d + wd * *p;
        float v = *s0 * c.a + (c.a1 * d) * d;
        *s0 = v;
        float delta = sqrtf(*s1 + c.eps) / sqrtf(v + c.eps) * d;
        *s1 = *s1 * c.a + (c.a1 * delta) * delta;
        *p = *p + c.neg_lr * delta;
        return;
    }
    default: { /* Adam, AdamW */
        float w = *p * c.decay;
        float d = g * s;
        if (wd != 0.0f)
            d = d + wd * w;
        float mi = *s0 * c.a + c.a1 * d;
        float vi = *s1 * c.b + (c.b1 * d) * d;
        *s0 = mi;
        *s1 = vi;
        *p = w + (c.neg_lr * mi) / (sqrtf(vi) / c.bc2_sqrt + c.eps);
        return;
    }
    }
}

__global__ static void k_dense(consts c, int64_t n, float *p, const float *g, float *s0,
                               float *s1, int fresh) {
    FERRY_CUDA_FOR(i, n) update_one(c, p + i, g[i], s0 ? s0 + i : NULL, s1 ? s1 + i : NULL, fresh);
}

/* Row form, first pass: fresh[k] = the row's momentum buffer does not exist yet. */
__global__ static void k_seen(int64_t U, const int64_t *rows, uint8_t *row_seen, uint8_t *fresh) {
    FERRY_CUDA_FOR(k, U) {
        fresh[k] = row_seen[rows[k]] == 0;
        row_seen[rows[k]] = 1;
    }
}

/* Row form: param/slot rows are rows[k] of the (R, D) table, gradient rows are k. */
__global__ static void k_rows(consts c, int64_t U, int64_t D, const int64_t *rows, float *p,
                              const float *g, float *s0, float *s1, const uint8_t *fresh) {
    FERRY_CUDA_FOR(i, U * D) {
        int64_t k = i / D, off = rows[k] * D + i % D;
        update_one(c, p + off, g[i], s0 ? s0 + off : NULL, s1 ? s1 + off : NULL,
                   fresh ? fresh[k] : 0);
    }
}

ferry_status ferry__cuda_optim_update(ferry_backend *be, const ferry_optim_update *u) {
    ferry__cuda *cu = ferry__cuda_of(be);
    /* The dispatcher checked the kind, the slots and the step (ferry__backend_check_optim). */
    int slots = ferry__optim_slots(u);
    consts c;
    ferry__optim_consts_init(u, &c);
    float *s0 = slots >= 1 ? u->slot0 : NULL, *s1 = slots >= 2 ? u->slot1 : NULL;
    if (u->rows == NULL) {
        k_dense<<<ferry__cuda_blocks(u->n), FERRY_CUDA_THREADS, 0, cu->stream>>>(
            c, u->n, u->param, u->grad, s0, s1, u->buf_fresh);
        FERRY_CUDA_LAUNCHED(k_dense);
        return FERRY_OK;
    }
    const int64_t U = u->nrows;
    int64_t *drows; /* (U) row ids, then (U) fresh flags */
    size_t nb = (size_t)U * sizeof(int64_t);
    ferry_status st = ferry__cuda_alloc(be, nb + (size_t)U, (void **)&drows);
    if (st != FERRY_OK)
        return st;
    uint8_t *fresh = NULL;
    st = ferry__cuda_copy(be, drows, u->rows, nb, FERRY_COPY_HOST_TO_DEVICE);
    if (st == FERRY_OK && u->kind == FERRY_OPTIM_SGD && u->row_seen != NULL) {
        fresh = (uint8_t *)drows + nb;
        k_seen<<<ferry__cuda_blocks(U), FERRY_CUDA_THREADS, 0, cu->stream>>>(U, drows,
                                                                             u->row_seen, fresh);
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess)
            st = ferry__cuda_error(err, "optim k_seen launch");
    }
    if (st == FERRY_OK) {
        k_rows<<<ferry__cuda_blocks(U * u->D), FERRY_CUDA_THREADS, 0, cu->stream>>>(
            c, U, u->D, drows, u->param, u->grad, s0, s1, fresh);
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess)
            st = ferry__cuda_error(err, "optim k_rows launch");
    }
    ferry__cuda_free(be, drows); /* stream order keeps it alive for the kernels */
    return st;
}
