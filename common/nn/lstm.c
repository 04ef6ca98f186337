/* lstm.c - multi-layer LSTM with PyTorch's nn.LSTM layout and semantics (gates
 * i, f, g, o; spec/stiefel.md §2), forward and full backpropagation through time.
 * Per layer, forward runs the input projection of all T steps as one GEMM into a
 * (T, B, 4H) gates buffer, then per step one GEMM h_{t-1} W_hh^T onto gates[t]
 * and the fused cell op. Backward walks the steps in reverse with the cell
 * backward and one GEMM per step for dh_{t-1}, then finishes the weight, bias and
 * input gradients with three GEMMs over all steps at once. A Stiefel-constrained
 * W_hh runs through cdopt's dissolving map A(W) (see the hook section below). */
#include <stdio.h>
#include <string.h>

#include "common/core/log.h"
#include "common/nn/nn-impl.h"
#include "ferry/nn.h"
#include "common/nn/constraint.h" /* ferry_stiefel_map, ferry_stiefel_map_backward */

typedef struct lstm_layer_saved {
    const float *x;    /* (T, B, C_l) input of the layer (after inter-layer dropout) */
    const float *w_hh; /* (4H, H) effective recurrent weight used by forward */
    float *gates;      /* (T, B, 4H) activations i, f, g, o */
    float *h;          /* (T+1, B, H) h_0, then h_1 .. h_T */
    float *c;          /* (T+1, B, H) c_0, then c_1 .. c_T */
    const float *mask; /* (T, B, H) dropout mask on this layer's output, or NULL */
    int constrained;   /* 1: w_hh is A(W) of a Stiefel-constrained raw W (arena copy) */
} lstm_layer_saved;

typedef struct lstm_saved {
    ferry_lstm *m;
    int64_t T, B;
    lstm_layer_saved layer[FERRY_LSTM_MAX_LAYERS];
} lstm_saved;

ferry_status ferry_lstm_init(ferry_lstm *m, ferry_params *P, const char *prefix, int64_t C,
                             int64_t H, int L, float dropout) {
    return ferry_lstm_init_from(m, P, prefix, C, H, L, dropout, 0);
}

ferry_status ferry_lstm_init_from(ferry_lstm *m, ferry_params *P, const char *prefix, int64_t C,
                                  int64_t H, int L, float dropout, int first) {
    char name[FERRY_PARAM_NAME_MAX + 32];
    ferry_status st;
    memset(m, 0, sizeof *m);
    if (C <= 0 || H <= 0 || L < 1 || L > FERRY_LSTM_MAX_LAYERS)
        return ferry_errorf(FERRY_ERR_SHAPE,
                            "lstm %s: need C, H > 0 and 1 <= L <= %d (C=%lld, "
                            "H=%lld, L=%d)",
                            prefix, FERRY_LSTM_MAX_LAYERS, (long long)C, (long long)H, L);
    if (!(dropout >= 0.0f && dropout < 1.0f))
        return ferry_errorf(FERRY_ERR_INVALID, "lstm %s: dropout %g outside [0, 1)", prefix,
                            (double)dropout);
    if (first < 0 || first > FERRY_LSTM_MAX_LAYERS - L)
        return ferry_errorf(FERRY_ERR_INVALID, "lstm %s: layers %d..%d outside 0..%d", prefix,
                            first, first + L - 1, FERRY_LSTM_MAX_LAYERS - 1);
    m->P = P;
    m->C = C;
    m->H = H;
    m->L = L;
    m->dropout = dropout;
    for (int l = 0; l < L; l++) {
        struct {
            const char *what;
            ferry_shape shape;
            int *index;
        } decl[4] = {
            {"weight_ih", ferry_shape_2d(4 * H, l == 0 ? C : H), &m->w_ih[l]},
            {"weight_hh", ferry_shape_2d(4 * H, H), &m->w_hh[l]},
            {"bias_ih", ferry_shape_1d(4 * H), &m->b_ih[l]},
            {"bias_hh", ferry_shape_1d(4 * H), &m->b_hh[l]},
        };
        for (int k = 0; k < 4; k++) {
            (void)snprintf(name, sizeof name, "%s.%s_l%d", prefix, decl[k].what, first + l);
            if ((st = ferry_params_add(P, name, decl[k].shape, 0, decl[k].index)) != FERRY_OK)
                return st;
        }
    }
    return FERRY_OK;
}

/* ---- the effective recurrent weight (Stiefel-constrained W_hh) ----
 * The cell multiplies h_{t-1} by an *effective* W_hh, never by the parameter
 * directly. For an unconstrained parameter the effective weight is the raw one
 * and its gradient accumulates straight into the raw gradient: no copies, no
 * extra work. A parameter with constraint == FERRY_CONSTRAINT_STIEFEL is used as
 * cdopt's LSTM_cdopt does (spec/stiefel.md §2, §4):
 *   forward   A(W) = W (1.5 I - 0.5 W^T W), computed from the current raw W into
 *             arena memory of the context once per layer and forward call (train
 *             and eval alike); W itself is never written;
 *   backward  dL/dA (4H, H) accumulates over the whole BPTT window in an arena
 *             buffer, then the map's vector-Jacobian product
 *             dW = G K - W sym(W^T G), K = I - 0.5 (W^T W - I), adds into the raw
 *             gradient. W is read again at backward time, like W_ih: parameters
 *             must not change between a forward and its backward.
 * The penalty beta ||W^T W - I||_F^2 and its gradient 4 beta W C are NOT added
 * here. They do not depend on the data, and a step may run several forwards (or
 * several trainers may push into one sum), so adding them per forward would count
 * them more than once: the owner of the parameters adds them once per optimizer
 * step with ferry_stiefel_add_penalty_grads (optim/stiefel.h).
 * The functions of this section are the only ones that know about constraints. */

static const char *lstm_name(const ferry_lstm *m, int l) {
    return m->P->items[m->w_hh[l]].name;
}

static ferry_status ctx_floats(ferry_ctx *ctx, int64_t n, float **out) {
    ferry_tensor *t;
    ferry_status st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, ferry_shape_1d(n), &t);
    if (st == FERRY_OK)
        *out = ferry_tensor_f32(t);
    return st;
}

/* The (4H, H) weight the cell uses in layer l's forward (and backward): the raw
 * parameter, or A(W) in arena memory with *constrained = 1. FERRY_ERR_UNSUPPORTED
 * for a constraint kind this LSTM does not know. */
static ferry_status lstm_w_hh_effective(const ferry_lstm *m, ferry_ctx *ctx, int l, const float **w,
                                        int *constrained) {
    const ferry_param *p = &m->P->items[m->w_hh[l]];
    const float *W = ferry_params_data(m->P, m->w_hh[l]); /* (4H, H) raw */
    *constrained = 0;
    if (p->constraint == FERRY_CONSTRAINT_NONE) {
        *w = W;
        return FERRY_OK;
    }
    if (p->constraint != FERRY_CONSTRAINT_STIEFEL)
        return ferry_errorf(FERRY_ERR_UNSUPPORTED, "%s: the LSTM supports no constraint kind %d",
                            lstm_name(m, l), (int)p->constraint);
    int64_t H = m->H;
    float *A; /* (4H, H) A(W), then the map's scratch */
    ferry_status st = ctx_floats(ctx, 4 * H * H + ferry_stiefel_scratch_floats(H), &A);
    if (st == FERRY_OK)
        st = ferry_stiefel_map(ferry_ctx_backend(ctx), 4 * H, H, W, A, A + 4 * H * H);
    if (st != FERRY_OK)
        return st;
    *w = A;
    *constrained = 1;
    return FERRY_OK;
}

/* Arena buffers of one backward call, shared by its constrained layers (NULL when
 * no layer is constrained). */
typedef struct lstm_stiefel_work {
    float *dA;      /* (4H, H) dL/dA(W) of the layer being finished */
    float *dW;      /* (4H, H) its map backward, before adding into the raw gradient */
    float *scratch; /* ferry_stiefel_scratch_floats(H) */
} lstm_stiefel_work;

static ferry_status lstm_stiefel_work_alloc(const ferry_lstm *m, const lstm_layer_saved *layer,
                                            ferry_ctx *ctx, lstm_stiefel_work *work) {
    int64_t H = m->H, n = 4 * H * H;
    int any = 0;
    memset(work, 0, sizeof *work);
    for (int l = 0; l < m->L; l++)
        any |= layer[l].constrained;
    if (!any)
        return FERRY_OK;
    float *buf;
    ferry_status st = ctx_floats(ctx, 2 * n + ferry_stiefel_scratch_floats(H), &buf);
    if (st != FERRY_OK)
        return st;
    work->dA = buf;
    work->dW = buf + n;
    work->scratch = buf + 2 * n;
    return FERRY_OK;
}

/* Where layer l's backward accumulates dL/dW_eff (4H, H): the raw gradient itself
 * when W_eff is the raw parameter, else the zeroed work->dA. */
static ferry_status lstm_w_hh_grad_eff(const ferry_lstm *m, ferry_ctx *ctx, ferry_grads *G,
                                       const lstm_layer_saved *ls, const lstm_stiefel_work *work,
                                       int l, float **out) {
    if (!ls->constrained) {
        *out = ferry_grads_dense(G, m->w_hh[l]);
        return *out != NULL ? FERRY_OK : FERRY_NOMEM_SAID;
    }
    *out = work->dA;
    return ferry_backend_fill(ferry_ctx_backend(ctx), work->dA, 4 * m->H * m->H, 0.0f);
}

/* Maps the accumulated dL/dW_eff of layer l to the raw parameter's gradient: the
 * identity (nothing to do) for an unconstrained W_hh, else
 * dW_raw += G K - W sym(W^T G) with G = work->dA. */
static ferry_status lstm_w_hh_grad_to_raw(const ferry_lstm *m, ferry_ctx *ctx, ferry_grads *G,
                                          const lstm_layer_saved *ls, const lstm_stiefel_work *work,
                                          int l) {
    if (!ls->constrained)
        return FERRY_OK;
    ferry_backend *be = ferry_ctx_backend(ctx);
    int64_t H = m->H;
    float *dw_raw = ferry_grads_dense(G, m->w_hh[l]); /* (4H, H) */
    if (dw_raw == NULL)
        return FERRY_NOMEM_SAID;
    ferry_status st = ferry_stiefel_map_backward(be, 4 * H, H, ferry_params_data(m->P, m->w_hh[l]),
                                                 work->dA, work->dW, work->scratch);
    return st != FERRY_OK ? st : ferry_backend_axpy(be, 4 * H * H, 1.0f, work->dW, dw_raw);
}

/* ---- forward ---- */

/* dst(n) = src, or zeros when src is NULL. */
static ferry_status copy_or_zero(ferry_backend *be, float *dst, const float *src, int64_t n) {
    if (src == NULL)
        return ferry_backend_fill(be, dst, n, 0.0f);
    return ferry_backend_copy(be, dst, src, (size_t)n * sizeof(float), FERRY_COPY_DEVICE_TO_DEVICE);
}

/* Runs layer l over T steps from input x (T, B, C_l) and initial states h0, c0
 * (B, H) or NULL; fills ls with its buffers. */
static ferry_status lstm_layer_forward(ferry_lstm *m, ferry_ctx *ctx, int l, int64_t T, int64_t B,
                                       const float *x, const float *h0, const float *c0,
                                       lstm_layer_saved *ls) {
    ferry_backend *be = ferry_ctx_backend(ctx);
    int64_t H = m->H, G4 = 4 * H, C = l == 0 ? m->C : H, BH = B * H;
    float *bias = NULL, *gates = NULL, *h = NULL, *c = NULL;
    const float *w_hh = NULL;
    int constrained = 0;
    ferry_status st = lstm_w_hh_effective(m, ctx, l, &w_hh, &constrained);
    if (st == FERRY_OK)
        st = ctx_floats(ctx, G4, &bias); /* (4H) */
    if (st == FERRY_OK)
        st = ctx_floats(ctx, T * B * G4, &gates); /* (T, B, 4H) */
    if (st == FERRY_OK)
        st = ctx_floats(ctx, (T + 1) * BH, &h); /* (T+1, B, H) */
    if (st == FERRY_OK)
        st = ctx_floats(ctx, (T + 1) * BH, &c); /* (T+1, B, H) */
    /* bias = b_ih + b_hh; gates(T*B, 4H) = bias + x W_ih^T for every step at once. */
    if (st == FERRY_OK)
        st = copy_or_zero(be, bias, ferry_params_data(m->P, m->b_ih[l]), G4);
    if (st == FERRY_OK)
        st = ferry_backend_axpy(be, G4, 1.0f, ferry_params_data(m->P, m->b_hh[l]), bias);
    if (st == FERRY_OK)
        st = ferry__nn_broadcast_rows(be, T * B, G4, bias, gates);
    if (st == FERRY_OK)
        st = ferry_backend_gemm(be, 0, 1, T * B, G4, C, 1.0f, x, C,
                                ferry_params_data(m->P, m->w_ih[l]), C, 1.0f, gates, G4);
    if (st == FERRY_OK)
        st = copy_or_zero(be, h, h0, BH);
    if (st == FERRY_OK)
        st = copy_or_zero(be, c, c0, BH);
    for (int64_t t = 0; t < T && st == FERRY_OK; t++) {
        float *gt = gates + t * B * G4; /* (B, 4H) */
        /* gates[t] += h_{t-1} W_hh^T, then the cell: c_t, h_t and the activations. */
        st = ferry_backend_gemm(be, 0, 1, B, G4, H, 1.0f, h + t * BH, H, w_hh, H, 1.0f, gt, G4);
        if (st == FERRY_OK)
            st = ferry_backend_lstm_cell_forward(be, B, H, gt, c + t * BH, c + (t + 1) * BH,
                                                 h + (t + 1) * BH);
    }
    if (st != FERRY_OK)
        return st;
    ls->x = x;
    ls->w_hh = w_hh;
    ls->constrained = constrained;
    ls->gates = gates;
    ls->h = h;
    ls->c = c;
    return FERRY_OK;
}

static ferry_status lstm_check(const ferry_lstm *m, const ferry_tensor *x, const ferry_tensor *h0,
                               const ferry_tensor *c0, const ferry_lstm_opts *opts) {
    char a[64], b[64];
    const char *name = lstm_name(m, 0);
    int plen = (int)(strrchr(name, '.') - name);
    if (m->P->data == NULL)
        return ferry_errorf(FERRY_ERR_INVALID, "lstm %.*s: parameters are not allocated", plen,
                            name);
    if (x->dtype != FERRY_DTYPE_F32 || x->shape.ndim != 3 || x->shape.dim[2] != m->C ||
        x->shape.dim[0] < 1 || x->shape.dim[1] < 1)
        return ferry_errorf(FERRY_ERR_SHAPE,
                            "lstm %.*s: input %s does not match weight_ih_l0 (%lld, %lld): want "
                            "float32 (T, B, %lld) with T, B >= 1",
                            plen, name, ferry_shape_str(x->shape, a, sizeof a),
                            (long long)(4 * m->H), (long long)m->C, (long long)m->C);
    ferry_shape want = ferry_shape_3d(m->L, x->shape.dim[1], m->H);
    const ferry_tensor *states[2] = {h0, c0};
    for (int k = 0; k < 2; k++)
        if (states[k] != NULL &&
            (states[k]->dtype != FERRY_DTYPE_F32 || !ferry_shape_eq(states[k]->shape, want)))
            return ferry_errorf(FERRY_ERR_SHAPE, "lstm %.*s: %s is %s, want float32 %s (L, B, H)",
                                plen, name, k ? "c0" : "h0",
                                ferry_shape_str(states[k]->shape, a, sizeof a),
                                ferry_shape_str(want, b, sizeof b));
    for (int l = 0; opts != NULL && opts->masks != NULL && l < m->L - 1; l++)
        if (opts->masks[l] == NULL)
            return ferry_errorf(FERRY_ERR_INVALID, "lstm %.*s: opts->masks[%d] is NULL", plen, name,
                                l);
    return FERRY_OK;
}

/* The dropout mask on layer l's output (T*B*H floats on the backend), or NULL
 * when there is none: training only, from opts->masks or drawn from the ctx. */
static ferry_status lstm_mask(ferry_lstm *m, ferry_ctx *ctx, int l, int64_t n,
                              const ferry_lstm_opts *opts, const float **out) {
    *out = NULL;
    int given = opts != NULL && opts->masks != NULL;
    if (l == m->L - 1 || !ferry_ctx_training(ctx) || (!given && m->dropout == 0.0f))
        return FERRY_OK;
    ferry_backend *be = ferry_ctx_backend(ctx);
    float *mask;
    ferry_status st = ctx_floats(ctx, n, &mask);
    if (st != FERRY_OK)
        return st;
    if (given) {
        st = ferry_backend_copy(be, mask, opts->masks[l], (size_t)n * sizeof(float),
                                FERRY_COPY_HOST_TO_DEVICE);
    } else {
        st = ferry_ctx_dropout_mask(ctx, n, m->dropout, mask);
    }
    if (st == FERRY_OK)
        *out = mask;
    return st;
}

static ferry_status lstm_backward(ferry_ctx *ctx, void *saved, ferry_tensor *const *grad_out,
                                  ferry_tensor **grad_in);

ferry_status ferry_lstm_forward(ferry_lstm *m, ferry_ctx *ctx, const ferry_tensor *x,
                                const ferry_tensor *h0, const ferry_tensor *c0,
                                const ferry_lstm_opts *opts, ferry_tensor **y, ferry_tensor **hn,
                                ferry_tensor **cn) {
    ferry_status st = lstm_check(m, x, h0, c0, opts);
    if (st != FERRY_OK)
        return st;
    ferry_backend *be = ferry_ctx_backend(ctx);
    int64_t T = x->shape.dim[0], B = x->shape.dim[1], H = m->H, BH = B * H;
    lstm_saved local, *s = &local;
    if (ferry_ctx_training(ctx) && (s = ferry_ctx_host_alloc(ctx, sizeof *s)) == NULL)
        return FERRY_NOMEM();
    s->m = m;
    s->T = T;
    s->B = B;
    ferry_tensor *out[3]; /* y (T, B, H), hn (L, B, H), cn (L, B, H) */
    st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, ferry_shape_3d(m->L, B, H), &out[1]);
    if (st == FERRY_OK)
        st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, ferry_shape_3d(m->L, B, H), &out[2]);
    if (st != FERRY_OK)
        return st;
    const float *in = ferry_tensor_f32(x);
    for (int l = 0; l < m->L; l++) {
        lstm_layer_saved *ls = &s->layer[l];
        const float *h0l = h0 ? ferry_tensor_f32(h0) + l * BH : NULL;
        const float *c0l = c0 ? ferry_tensor_f32(c0) + l * BH : NULL;
        st = lstm_layer_forward(m, ctx, l, T, B, in, h0l, c0l, ls);
        if (st == FERRY_OK)
            st = lstm_mask(m, ctx, l, T * BH, opts, &ls->mask);
        if (st == FERRY_OK) /* hn[l] = h_T */
            st = copy_or_zero(be, ferry_tensor_f32(out[1]) + l * BH, ls->h + T * BH, BH);
        if (st == FERRY_OK) /* cn[l] = c_T */
            st = copy_or_zero(be, ferry_tensor_f32(out[2]) + l * BH, ls->c + T * BH, BH);
        if (st != FERRY_OK)
            return st;
        in = ls->h + BH; /* (T, B, H): h_1 .. h_T, the next layer's input */
        if (ls->mask != NULL) {
            float *dropped;
            if ((st = ctx_floats(ctx, T * BH, &dropped)) != FERRY_OK ||
                (st = ferry_backend_mul(be, T * BH, in, ls->mask, dropped)) != FERRY_OK)
                return st;
            in = dropped;
        }
    }
    /* y is a view of the last layer's h_1 .. h_T: no copy. */
    if ((out[0] = ferry_ctx_host_alloc(ctx, sizeof *out[0])) == NULL)
        return FERRY_NOMEM();
    float *y_data = s->layer[m->L - 1].h + BH;
    *out[0] = ferry_tensor_wrap(be, FERRY_DTYPE_F32, ferry_shape_3d(T, B, H), y_data);
    if (ferry_ctx_training(ctx)) {
        ferry_tensor *ins[3] = {(ferry_tensor *)(uintptr_t)x, (ferry_tensor *)(uintptr_t)h0,
                                (ferry_tensor *)(uintptr_t)c0};
        if ((st = ferry_ctx_record(ctx, lstm_backward, s, 3, ins, 3, out)) != FERRY_OK)
            return st;
    }
    *y = out[0];
    *hn = out[1];
    *cn = out[2];
    return FERRY_OK;
}

/* ---- backward ---- */

typedef struct lstm_bwd {
    ferry_grads *G;
    float *dy;     /* (T, B, H) gradient reaching the layer's h_1 .. h_T */
    float *dgates; /* (T, B, 4H) pre-activation gradients */
    float *dc;     /* (B, H) gradient reaching c_t */
    /* Buffers for the constrained layers (NULLs when there are none). */
    lstm_stiefel_work stiefel;
} lstm_bwd;

/* The reverse walk over layer l's steps: on entry w->dy holds the gradient
 * reaching h_1 .. h_T from above (output sequence, plus hn); fills w->dgates and
 * accumulates the gradients of h0[l] and c0[l] when they are wanted. */
static ferry_status lstm_layer_bptt(const lstm_saved *s, ferry_ctx *ctx, int l, lstm_bwd *w,
                                    const float *gcn, ferry_tensor *const *grad_in) {
    const lstm_layer_saved *ls = &s->layer[l];
    ferry_backend *be = ferry_ctx_backend(ctx);
    int64_t T = s->T, B = s->B, H = s->m->H, G4 = 4 * H, BH = B * H;
    ferry_status st = copy_or_zero(be, w->dc, gcn ? gcn + l * BH : NULL, BH);
    for (int64_t t = T - 1; t >= 0 && st == FERRY_OK; t--) {
        float *dg = w->dgates + t * B * G4; /* (B, 4H) */
        st = ferry_backend_lstm_cell_backward(be, B, H, ls->gates + t * B * G4, ls->c + t * BH,
                                              ls->c + (t + 1) * BH, w->dy + t * BH, w->dc, dg);
        /* dh_{t-1} += dgates_t W_hh, straight into the gradient reaching h_{t-1}:
         * the previous step's slot of dy, or h0's gradient at t = 0. */
        float *dh_prev = NULL;
        if (t > 0)
            dh_prev = w->dy + (t - 1) * BH;
        else if (grad_in[1] != NULL)
            dh_prev = ferry_tensor_f32(grad_in[1]) + l * BH;
        if (st == FERRY_OK && dh_prev != NULL)
            st =
                ferry_backend_gemm(be, 0, 0, B, H, G4, 1.0f, dg, G4, ls->w_hh, H, 1.0f, dh_prev, H);
    }
    if (st == FERRY_OK && grad_in[2] != NULL) /* dc0[l] += dc */
        st = ferry_backend_axpy(be, BH, 1.0f, w->dc, ferry_tensor_f32(grad_in[2]) + l * BH);
    return st;
}

/* The weight and bias gradients of one layer from its dgates: two GEMMs over all
 * steps at once and a column sum. Run in place or, deferred, on the context's
 * helper thread (everything it reads lives in the context until the step ends). */
typedef struct lstm_wgrad {
    ferry_backend *be;
    int64_t TB, G4, C, H;
    const float *dgates, *x, *h;  /* (TB, 4H), (TB, C), h_0 .. h_{T-1} (TB, H) */
    float *dw_ih, *dw_hh;         /* (4H, C), (4H, H) dL/dW_eff */
    float *db_ih, *db_hh, *dbias; /* (4H) each; dbias scratch */
} lstm_wgrad;

static ferry_status lstm_wgrad_run(void *arg) {
    const lstm_wgrad *j = arg;
    ferry_backend *be = j->be;
    int64_t TB = j->TB, G4 = j->G4, C = j->C, H = j->H;
    /* dW_ih += dgates^T x; dW_hh += dgates^T h_{0..T-1} (the h sequence shifted by h0). */
    ferry_status st =
        ferry_backend_gemm(be, 1, 0, G4, C, TB, 1.0f, j->dgates, G4, j->x, C, 1.0f, j->dw_ih, C);
    if (st == FERRY_OK)
        st = ferry_backend_gemm(be, 1, 0, G4, H, TB, 1.0f, j->dgates, G4, j->h, H, 1.0f, j->dw_hh,
                                H);
    /* Both biases enter the pre-activations the same way: one column sum, added twice. */
    if (st == FERRY_OK)
        st = ferry_backend_fill(be, j->dbias, G4, 0.0f);
    if (st == FERRY_OK)
        st = ferry_backend_sum_rows(be, TB, G4, j->dgates, j->dbias);
    if (st == FERRY_OK)
        st = ferry_backend_axpy(be, G4, 1.0f, j->dbias, j->db_ih);
    if (st == FERRY_OK)
        st = ferry_backend_axpy(be, G4, 1.0f, j->dbias, j->db_hh);
    return st;
}

/* From layer l's w->dgates: the weight and bias gradients (lstm_wgrad_run: deferred
 * to the context's helper thread when it has one, unless W_hh is constrained, whose
 * map backward follows at once), then dX = dgates W_ih, which becomes layer l-1's
 * w->dy (through its dropout mask) or x's gradient for l = 0. */
static ferry_status lstm_layer_grads(const lstm_saved *s, ferry_ctx *ctx, int l, lstm_bwd *w,
                                     ferry_tensor *const *grad_in) {
    const ferry_lstm *m = s->m;
    const lstm_layer_saved *ls = &s->layer[l];
    ferry_backend *be = ferry_ctx_backend(ctx);
    int64_t TB = s->T * s->B, H = m->H, G4 = 4 * H, C = l == 0 ? m->C : H;
    lstm_wgrad *j = ferry_ctx_host_alloc(ctx, sizeof *j);
    if (j == NULL)
        return FERRY_NOMEM();
    *j = (lstm_wgrad){be, TB, G4, C, H, w->dgates, ls->x, ls->h, NULL, NULL, NULL, NULL, NULL};
    j->dw_ih = ferry_grads_dense(w->G, m->w_ih[l]); /* (4H, C) */
    j->db_ih = ferry_grads_dense(w->G, m->b_ih[l]); /* (4H) */
    j->db_hh = ferry_grads_dense(w->G, m->b_hh[l]); /* (4H) */
    if (j->dw_ih == NULL || j->db_ih == NULL || j->db_hh == NULL)
        return FERRY_NOMEM_SAID;
    ferry_status st = lstm_w_hh_grad_eff(m, ctx, w->G, ls, &w->stiefel, l, &j->dw_hh);
    if (st == FERRY_OK)
        st = ctx_floats(ctx, G4, &j->dbias);
    if (st == FERRY_OK && ls->constrained)
        st = lstm_wgrad_run(j);
    else if (st == FERRY_OK)
        st = ferry__ctx_defer(ctx, (ferry__ctx_job){lstm_wgrad_run, j});
    if (st == FERRY_OK)
        st = lstm_w_hh_grad_to_raw(m, ctx, w->G, ls, &w->stiefel, l);
    const float *w_ih = ferry_params_data(m->P, m->w_ih[l]);
    if (st == FERRY_OK && l > 0) { /* overwrite dy: layer l's is spent */
        st = ferry_backend_gemm(be, 0, 0, TB, C, G4, 1.0f, w->dgates, G4, w_ih, C, 0.0f, w->dy, C);
        if (st == FERRY_OK && s->layer[l - 1].mask != NULL)
            st = ferry_backend_mul(be, TB * H, w->dy, s->layer[l - 1].mask, w->dy);
    } else if (st == FERRY_OK && grad_in[0] != NULL) {
        st = ferry_backend_gemm(be, 0, 0, TB, C, G4, 1.0f, w->dgates, G4, w_ih, C, 1.0f,
                                ferry_tensor_f32(grad_in[0]), C);
    }
    return st;
}

static ferry_status lstm_backward(ferry_ctx *ctx, void *saved, ferry_tensor *const *grad_out,
                                  ferry_tensor **grad_in) {
    const lstm_saved *s = saved;
    const ferry_lstm *m = s->m;
    ferry_backend *be = ferry_ctx_backend(ctx);
    int64_t T = s->T, B = s->B, H = m->H, BH = B * H;
    const float *gy = grad_out[0] ? ferry_tensor_f32(grad_out[0]) : NULL;  /* (T, B, H) */
    const float *ghn = grad_out[1] ? ferry_tensor_f32(grad_out[1]) : NULL; /* (L, B, H) */
    const float *gcn = grad_out[2] ? ferry_tensor_f32(grad_out[2]) : NULL; /* (L, B, H) */
    lstm_bwd w;
    if ((w.G = ferry_ctx_grads(ctx, m->P)) == NULL)
        return FERRY_NOMEM();
    ferry_status st = ctx_floats(ctx, T * BH, &w.dy);
    if (st == FERRY_OK)
        st = ctx_floats(ctx, T * B * 4 * H, &w.dgates);
    if (st == FERRY_OK)
        st = ctx_floats(ctx, BH, &w.dc);
    if (st == FERRY_OK)
        st = lstm_stiefel_work_alloc(m, s->layer, ctx, &w.stiefel);
    /* Our own copy of dy: the per-step GEMMs accumulate dh_{t-1} into it. */
    if (st == FERRY_OK)
        st = copy_or_zero(be, w.dy, gy, T * BH);
    for (int l = m->L - 1; l >= 0 && st == FERRY_OK; l--) {
        /* A deferred layer's weight gradients read its dgates later: each layer then
         * has its own. */
        if (l < m->L - 1 && ferry__ctx_deferred(ctx))
            st = ctx_floats(ctx, T * B * 4 * H, &w.dgates);
        if (st == FERRY_OK && ghn != NULL) /* hn[l] is h_T of layer l */
            st = ferry_backend_axpy(be, BH, 1.0f, ghn + l * BH, w.dy + (T - 1) * BH);
        if (st == FERRY_OK)
            st = lstm_layer_bptt(s, ctx, l, &w, gcn, grad_in);
        if (st == FERRY_OK)
            st = lstm_layer_grads(s, ctx, l, &w, grad_in);
    }
    return st;
}
