/* optim.c - CPU optimizer update kernel: SGD (momentum, dampening, Nesterov), Adagrad,
 * Adadelta, Adam and AdamW over a dense range or over the touched rows of a table.
 * Each rule is torch 1.13's single-tensor (foreach=False) update in float32, with the
 * float constants derived from the double hyper-parameters as torch derives them from
 * Python floats. One "span" function per rule updates n contiguous floats; the dense
 * form is one span, the row form one span per touched row. */
#include <math.h>

#include "common/backend/cpu/cpu.h"
#include "common/core/simd.h"
#include "common/tensor/optim-consts.h"

/* The update streams over 3-5 arrays; let GCC vectorise loops of unknown length at -O2
 * (its default "very cheap" cost model refuses). The sqrtf loops also need
 * -fno-math-errno, which a pragma cannot switch on; without it they run scalar. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("vect-cost-model=dynamic")
#endif

/* ---- per-rule constants ---- */

/* ---- update rules over n contiguous floats ---- */

/* SGD: d = g*s (+ wd p); buf = fresh ? d : m buf + (1-damp) d;
 * d = nesterov ? d + m buf : buf; p += -lr d. Without momentum buf is absent. */
FERRY_HOT_LOOP static void sgd_span(const ferry_optim_consts *c, int64_t n, float *restrict p,
                                    const float *restrict g, float *restrict buf, int fresh) {
    const float s = c->scale, wd = c->wd, m = c->a, damp1 = c->a1, nlr = c->neg_lr;
    if (buf == NULL) {
        if (wd != 0.0f)
            for (int64_t i = 0; i < n; i++)
                p[i] = p[i] + nlr * (g[i] * s + wd * p[i]);
        else
            for (int64_t i = 0; i < n; i++)
                p[i] = p[i] + nlr * (g[i] * s);
        return;
    }
    /* The branches below are loop-invariant; each loop body stays straight-line. */
    if (fresh) {
        for (int64_t i = 0; i < n; i++)
            buf[i] = wd != 0.0f ? g[i] * s + wd * p[i] : g[i] * s;
    } else if (wd != 0.0f) {
        for (int64_t i = 0; i < n; i++)
            buf[i] = buf[i] * m + damp1 * (g[i] * s + wd * p[i]);
    } else {
        for (int64_t i = 0; i < n; i++)
            buf[i] = buf[i] * m + damp1 * (g[i] * s);
    }
    if (!c->nesterov) {
        for (int64_t i = 0; i < n; i++)
            p[i] = p[i] + nlr * buf[i];
    } else if (wd != 0.0f) {
        for (int64_t i = 0; i < n; i++)
            p[i] = p[i] + nlr * ((g[i] * s + wd * p[i]) + m * buf[i]);
    } else {
        for (int64_t i = 0; i < n; i++)
            p[i] = p[i] + nlr * (g[i] * s + m * buf[i]);
    }
}

/* Adagrad: d = g*s (+ wd p); sum += d*d; p += -clr d / (sqrt(sum) + eps). */
FERRY_HOT_LOOP static void adagrad_span(const ferry_optim_consts *c, int64_t n, float *restrict p,
                                        const float *restrict g, float *restrict sum) {
    const float s = c->scale, wd = c->wd, nclr = c->neg_lr, eps = c->eps;
    for (int64_t i = 0; i < n; i++) {
        float d = g[i] * s;
        if (wd != 0.0f)
            d = d + wd * p[i];
        float acc = sum[i] + d * d;
        sum[i] = acc;
        p[i] = p[i] + (nclr * d) / (sqrtf(acc) + eps);
    }
}

/* Adadelta: d = g*s (+ wd p); sq = rho sq + (1-rho) d^2;
 * delta = sqrt(acc + eps) / sqrt(sq + eps) * d; acc = rho acc + (1-rho) delta^2;
 * p += -lr delta. */
FERRY_HOT_LOOP static void adadelta_span(const ferry_optim_consts *c, int64_t n, float *restrict p,
                                         const float *restrict g, float *restrict sq,
                                         float *restrict acc) {
    const float s = c->scale, wd = c->wd, rho = c->a, rho1 = c->a1, eps = c->eps;
    const float nlr = c->neg_lr;
    for (int64_t i = 0; i < n; i++) {
        float d = g[i] * s;
        if (wd != 0.0f)
            d = d + wd * p[i];
        float v = sq[i] * rho + (rho1 * d) * d;
        sq[i] = v;
        float delta = sqrtf(acc[i] + eps) / sqrtf(v + eps) * d;
        acc[i] = acc[i] * rho + (rho1 * delta) * delta;
        p[i] = p[i] + nlr * delta;
    }
}

/* Adam(W): p *= 1 - lr wd (AdamW only); d = g*s (+ wd p, Adam only);
 * m = b1 m + (1-b1) d; v = b2 v + (1-b2) d^2;
 * p += (-lr/bc1) m / (sqrt(v)/sqrt(bc2) + eps). */
FERRY_HOT_LOOP static void adam_span(const ferry_optim_consts *c, int64_t n, float *restrict p,
                                     const float *restrict g, float *restrict m,
                                     float *restrict v) {
    const float s = c->scale, wd = c->wd, b1 = c->a, b11 = c->a1, b2 = c->b, b21 = c->b1;
    const float nss = c->neg_lr, bc2s = c->bc2_sqrt, eps = c->eps, decay = c->decay;
    for (int64_t i = 0; i < n; i++) {
        float w = p[i] * decay;
        float d = g[i] * s;
        if (wd != 0.0f)
            d = d + wd * w;
        float mi = m[i] * b1 + b11 * d;
        float vi = v[i] * b2 + (b21 * d) * d;
        m[i] = mi;
        v[i] = vi;
        p[i] = w + (nss * mi) / (sqrtf(vi) / bc2s + eps);
    }
}

/* One span of any rule: n floats of param/slots at p/s0/s1 with gradient g. */
static void update_span(const ferry_optim_update *u, const ferry_optim_consts *c, int64_t n, float *p,
                        const float *g, float *s0, float *s1, int fresh) {
    switch (u->kind) {
    case FERRY_OPTIM_SGD:
        sgd_span(c, n, p, g, u->momentum != 0.0 ? s0 : NULL, fresh);
        break;
    case FERRY_OPTIM_ADAGRAD:
        adagrad_span(c, n, p, g, s0);
        break;
    case FERRY_OPTIM_ADADELTA:
        adadelta_span(c, n, p, g, s0, s1);
        break;
    case FERRY_OPTIM_ADAM:
    case FERRY_OPTIM_ADAMW:
        adam_span(c, n, p, g, s0, s1);
        break;
    }
}

/* ---- entry point ---- */

ferry_status ferry__cpu_optim_update(ferry_backend *be, const ferry_optim_update *u) {
    (void)be; /* arguments checked by the dispatcher (ferry__backend_check_optim) */
    ferry_optim_consts c;
    ferry__optim_consts_init(u, &c);
    if (u->rows == NULL) {
        update_span(u, &c, u->n, u->param, u->grad, u->slot0, u->slot1, u->buf_fresh);
        return FERRY_OK;
    }
    /* Row form: param/slot rows are rows[k] of the (R, D) table, grad rows are k. */
    const int64_t D = u->D;
    for (int64_t k = 0; k < u->nrows; k++) {
        int64_t off = u->rows[k] * D;
        int fresh = 0;
        if (u->kind == FERRY_OPTIM_SGD && u->row_seen != NULL) {
            fresh = !u->row_seen[u->rows[k]];
            u->row_seen[u->rows[k]] = 1;
        }
        update_span(u, &c, D, u->param + off, u->grad + k * D, u->slot0 ? u->slot0 + off : NULL,
                    u->slot1 ? u->slot1 + off : NULL, fresh);
    }
    return FERRY_OK;
}
