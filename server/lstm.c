/* lstm.c - the `lstm` module kind: a group of K consecutive layers of a stacked LSTM,
 * a pipeline stage a trainer places on this server (ferry-trainer --stages). The
 * layers are the local LSTM's own (common/nn/lstm.c: PyTorch's layout and gate order,
 * a Stiefel-constrained weight_hh used through cdopt's map), run on an autograd
 * context of the server's for each Forward and kept for its Backward.
 *
 * Parameters: the K layers' weight_ih, weight_hh, bias_ih and bias_hh are laid out as
 * ferry_lstm_init lays them out in a block of their own, and that block, alignment
 * padding included, is the module's one parameter "weight" (1, N). GetParams,
 * checkpoints and the optimizer see one dense parameter; the layer view below reads
 * and writes the same memory.
 *
 * State: a call starts from h0/c0 when the request sends them (a chunk continuing the
 * previous chunk of a window, whose gradient then flows back as dh0/dc0), else from
 * the carried state of its stream (a 64-bit key of the caller's: one per trainer and
 * purpose), or from zeros with the reset flag. With the carry flag the call's final
 * state becomes the stream's, detached, as truncated BPTT carries it from window to
 * window. A retried Forward (same context and call id) starts from the state the first
 * attempt started from.
 *
 * Dropout between the group's layers draws from the trainer's stream (seed, offset,
 * window in the request), so its masks are those the trainer's own LSTM would draw at
 * these layers: a model split over processes trains as the whole model does. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/core/log.h"
#include "common/nn/constraint.h" /* ferry_stiefel_polar */
#include "common/tensor/backend.h"
#include "ferry/autograd.h"
#include "ferry/nn.h"
#include "optim/stiefel.h"
#include "server/ps-impl.h"

#define LSTM_STREAMS 64 /* carried states per module; the least recently used goes */
/* What an autograd context holds before anything is computed: its two arenas' first
 * chunks (common/nn/ctx.c). */
#define LSTM_CTX_BYTES ((int64_t)(4u << 20) + (int64_t)(256u << 10))

typedef struct lstm_stream {
    uint64_t key;
    int64_t B;
    float *h, *c;           /* (K, B, H): the state the next call starts from */
    float *h_prev, *c_prev; /* the state the last carrying call started from */
    uint64_t last_ctx, last_call;
    uint64_t used; /* clock of the last use; 0: free slot */
} lstm_stream;

typedef struct lstm_impl {
    ferry_params view; /* the layers' parameters over the module's "weight" */
    ferry_lstm rnn;
    pthread_mutex_t mu; /* streams */
    lstm_stream streams[LSTM_STREAMS];
    uint64_t clock;
} lstm_impl;

/* What a Forward keeps for its Backward: its context, on which the layers ran. */
typedef struct lstm_call {
    ferry_ctx *ctx;
    ferry_tensor *x, *h0, *c0, *y, *hn, *cn;
    int explicit_state; /* h0/c0 came with the request: dh0/dc0 go back */
} lstm_call;

static void lstm_call_free(void *p) {
    lstm_call *k = p;
    if (k == NULL)
        return;
    ferry_ctx_destroy(k->ctx);
    free(k);
}

static void stream_free(lstm_stream *s) {
    free(s->h);
    free(s->c);
    free(s->h_prev);
    free(s->c_prev);
    memset(s, 0, sizeof *s);
}

static void lstm_destroy(ferry__ps_module *m) {
    lstm_impl *im = m->impl;
    if (im == NULL)
        return;
    for (int i = 0; i < LSTM_STREAMS; i++)
        stream_free(&im->streams[i]);
    im->view.data = NULL; /* the module's block: not the view's to free */
    ferry_params_deinit(&im->view);
    pthread_mutex_destroy(&im->mu);
    free(im);
    m->impl = NULL;
}

static ferry_status lstm_declare(ferry__ps_module *m) {
    const ferry__ps_module_config *c = &m->cfg;
    int K = c->layers > 0 ? c->layers : 1;
    lstm_impl *im = calloc(1, sizeof *im);
    if (im == NULL)
        return FERRY_NOMEM();
    pthread_mutex_init(&im->mu, NULL);
    m->impl = im;
    ferry_params_init(&im->view, m->P.be);
    ferry_status st = ferry_lstm_init_from(&im->rnn, &im->view, "lstm", c->dims[0], c->dims[1], K,
                                           (float)((double)c->dropout_ppm * 1e-6), c->first_layer);
    for (int l = 0; l < K && st == FERRY_OK && c->constraint == FERRY_CONSTRAINT_STIEFEL; l++)
        st = ferry_params_set_constraint(&im->view, im->rnn.w_hh[l], FERRY_CONSTRAINT_STIEFEL,
                                         (float)c->beta);
    if (st != FERRY_OK) {
        char why[256];
        (void)snprintf(why, sizeof why, "%s", ferry_error_last());
        return ferry_errorf(st, "lstm '%s': %s", m->name, why);
    }
    m->rows = 1;
    m->cols = im->view.numel;
    m->b = -1;
    return ferry_params_add(&m->P, FERRY_WIRE_PARAM_NAME(WEIGHT), ferry_shape_2d(1, m->cols), 0,
                            &m->w);
}

/* Points the layer view at the module's block, the first time it is used (the block
 * is allocated after declare and never moves). Calls run side by side under the
 * module's read lock: the pointer is set under the streams' mutex. */
static lstm_impl *bind(const ferry__ps_module *m) {
    lstm_impl *im = m->impl;
    pthread_mutex_lock(&im->mu);
    if (im->view.data == NULL)
        im->view.data = ferry_params_data(&m->P, m->w);
    pthread_mutex_unlock(&im->mu);
    return im;
}

static ferry_status lstm_polar(ferry__ps_module *m) {
    lstm_impl *im = bind(m);
    for (int l = 0; l < im->rnn.L; l++) {
        const ferry_param *p = &im->view.items[im->rnn.w_hh[l]];
        ferry_status st =
            ferry_stiefel_polar(p->shape.dim[0], p->shape.dim[1], im->view.data + p->offset);
        if (st != FERRY_OK)
            return st;
    }
    return FERRY_OK;
}

static ferry_status lstm_penalty(const ferry__ps_module *m, float *grad, double *penalty,
                                 double *feasibility) {
    lstm_impl *im = bind(m);
    return ferry_stiefel_add_penalty_block(&im->view, im->view.data, grad, penalty, feasibility);
}

/* ---- carried state ---- */

/* The stream of key (locked); NULL when there is none. */
static lstm_stream *stream_find(lstm_impl *im, uint64_t key) {
    for (int i = 0; i < LSTM_STREAMS; i++)
        if (im->streams[i].used != 0 && im->streams[i].key == key)
            return &im->streams[i];
    return NULL;
}

/* Copies the state a call of (ctx, call) on stream key starts from into h0, c0
 * (K*B*H floats each). */
static ferry_status stream_start(const ferry__ps_module *m, lstm_impl *im, uint64_t key,
                                 uint64_t ctx, uint64_t call, int64_t B, float *h0, float *c0) {
    size_t n = (size_t)(im->rnn.L * B * im->rnn.H) * sizeof(float);
    pthread_mutex_lock(&im->mu);
    lstm_stream *s = stream_find(im, key);
    ferry_status st = FERRY_OK;
    if (s == NULL || s->B != B) {
        st =
            ferry_errorf(FERRY_ERR_NOT_FOUND,
                         "lstm '%s': stream %#llx has no carried state%s (send h0 and c0, or "
                         "the reset flag)",
                         m->name, (unsigned long long)key, s != NULL ? " for this batch size" : "");
    } else {
        /* A retry of the call that carried last starts where that call started. */
        int retry = ctx != 0 && s->last_ctx == ctx && s->last_call == call && s->h_prev != NULL;
        memcpy(h0, retry ? s->h_prev : s->h, n);
        memcpy(c0, retry ? s->c_prev : s->c, n);
    }
    pthread_mutex_unlock(&im->mu);
    return st;
}

/* Makes (hn, cn) the state of stream key after a call that started from (h0, c0). */
static ferry_status stream_carry(lstm_impl *im, uint64_t key, uint64_t ctx, uint64_t call,
                                 int64_t B, const float *h0, const float *c0, const float *hn,
                                 const float *cn) {
    size_t n = (size_t)(im->rnn.L * B * im->rnn.H) * sizeof(float);
    pthread_mutex_lock(&im->mu);
    lstm_stream *s = stream_find(im, key);
    if (s == NULL) { /* a free slot, or the least recently used */
        s = &im->streams[0];
        for (int i = 0; i < LSTM_STREAMS; i++) {
            if (im->streams[i].used < s->used)
                s = &im->streams[i];
        }
    }
    ferry_status st = FERRY_OK;
    if (s->key != key || s->B != B || s->h == NULL) {
        stream_free(s);
        s->h = malloc(n);
        s->c = malloc(n);
        s->h_prev = malloc(n);
        s->c_prev = malloc(n);
        if (s->h == NULL || s->c == NULL || s->h_prev == NULL || s->c_prev == NULL) {
            stream_free(s);
            st = FERRY_NOMEM();
        }
    }
    if (st == FERRY_OK) {
        s->key = key;
        s->B = B;
        memcpy(s->h_prev, h0, n);
        memcpy(s->c_prev, c0, n);
        memcpy(s->h, hn, n);
        memcpy(s->c, cn, n);
        s->last_ctx = ctx;
        s->last_call = call;
        s->used = ++im->clock;
    }
    pthread_mutex_unlock(&im->mu);
    return st;
}

/* ---- Forward and Backward ---- */

/* The call's arguments (ForwardRequest.lstm; absent: all zero). */
static Ferry__V1__LstmForwardArgs lstm_args(const Ferry__V1__ForwardRequest *q) {
    Ferry__V1__LstmForwardArgs a;
    ferry__v1__lstm_forward_args__init(&a);
    if (q != NULL && q->args_case == FERRY__V1__FORWARD_REQUEST__ARGS_LSTM && q->lstm != NULL)
        a = *q->lstm;
    return a;
}

static ferry_status state_input(const ferry__ps_module *m, ferry_rpc_msg *req, ferry_ctx *ctx,
                                ferry_wire_tensor_id id, const int64_t *want, int grad,
                                ferry_tensor **out) {
    int i;
    ferry_status st = ferry__ps_input(m, req, id, want, &i);
    if (st != FERRY_OK || i < 0)
        return st;
    int64_t n = want[0] * want[1] * want[2];
    if ((st = ferry__ps_check_finite(m, ferry_wire_tensors[id].name, req->tensors[i].data, n)) !=
            FERRY_OK ||
        (st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, ferry_shape_3d(want[0], want[1], want[2]),
                               out)) != FERRY_OK)
        return st;
    memcpy((*out)->data, req->tensors[i].data, (size_t)n * sizeof(float));
    return grad ? ferry_ctx_require_grad(ctx, *out) : FERRY_OK;
}

static ferry_status put(ferry_rpc_msg *reply, ferry_wire_tensor_id id, const ferry_tensor *t) {
    int64_t dim[3] = {t->shape.dim[0], t->shape.dim[1], t->shape.dim[2]};
    void *dst;
    ferry_status st = ferry__ps_output(reply, id, dim, &dst);
    if (st == FERRY_OK)
        memcpy(dst, t->data, ferry_tensor_nbytes(t));
    return st;
}

static ferry_status lstm_forward(ferry__ps_module *m, ferry_wire_mode mode, ferry_rpc_msg *req,
                                 ferry_rpc_msg *reply, ferry__ps_saved *save) {
    (void)mode; /* one mode */
    const Ferry__V1__ForwardRequest *q = req->head;
    lstm_impl *im = bind(m);
    int64_t K = im->rnn.L, C = im->rnn.C, H = im->rnn.H;
    int64_t want_x[3] = {-1, -1, C};
    int ix;
    ferry_status st = ferry__ps_input(m, req, FERRY_WIRE_LSTM_FWD_X, want_x, &ix);
    if (st != FERRY_OK)
        return st;
    int64_t T = req->tensors[ix].dim[0], B = req->tensors[ix].dim[1];
    if (T < 1 || B < 1)
        return ferry_errorf(FERRY_ERR_SHAPE, "lstm '%s': x has no steps or columns", m->name);
    if ((st = ferry__ps_check_finite(m, "x", req->tensors[ix].data, T * B * C)) != FERRY_OK)
        return st;
    /* The context holds the layers' activations and, in Backward, their gradients:
     * charged to the caller's budget before the call computes. Per step, column,
     * layer and hidden unit: gates 4, h, c, mask, dropped 4, and dy, dgates 5 in
     * Backward; per layer A(W) and its scratch; the layers' gradient block; and the
     * arenas' first chunks, which even a one-step call holds. */
    int64_t scratch =
        (T * B * (C + 14 * K * H) + K * (4 * H * H + ferry_stiefel_scratch_floats(H)) + m->cols) *
            (int64_t)sizeof(float) +
        LSTM_CTX_BYTES;
    if ((st = ferry__ps_scratch_check(m, scratch, "lstm activations")) != FERRY_OK)
        return st;
    if (q != NULL && q->args_case != FERRY__V1__FORWARD_REQUEST__ARGS__NOT_SET &&
        q->args_case != FERRY__V1__FORWARD_REQUEST__ARGS_LSTM)
        return ferry_errorf(FERRY_ERR_INVALID, "lstm '%s': Forward arguments of another kind",
                            m->name);
    Ferry__V1__LstmForwardArgs a = lstm_args(q);
    uint64_t key = a.stream;
    /* Window, start and offset come from the wire as uint64: kept below 2^62, so the
     * sums below cannot wrap. */
    const uint64_t lim = (uint64_t)1 << 62;
    int64_t win_T = a.window_t < lim ? (int64_t)a.window_t : -1,
            t0 = a.t0 < lim ? (int64_t)a.t0 : -1,
            off = a.rng_offset < lim ? (int64_t)a.rng_offset : -1;
    if (win_T < 0 || t0 < 0 || off < 0 || (win_T > 0 && t0 + T > win_T))
        return ferry_errorf(FERRY_ERR_RANGE,
                            "lstm '%s': steps [%lld, %lld) outside the window of %lld, or a "
                            "negative offset",
                            m->name, (long long)t0, (long long)(t0 + T), (long long)win_T);
    /* The window's batch and the call's first column in it (0: the call's own B). */
    int64_t wb = a.batch == 0    ? B
                 : a.batch < lim ? (int64_t)a.batch
                                 : -1,
            c0 = a.col0 < lim ? (int64_t)a.col0 : -1;
    /* The masks' offsets reach (win_T * wb) * H: kept below 2^62 too. */
    if (wb < B || c0 < 0 || c0 > wb - B || (a.batch != 0 && win_T == 0) ||
        (win_T > 0 && (uint64_t)wb > lim / (uint64_t)win_T / (uint64_t)H))
        return ferry_errorf(FERRY_ERR_RANGE,
                            "lstm '%s': columns [%lld, %lld) outside a window batch of %lld (a "
                            "batch needs a window_t; window_t x batch x H below 2^62)",
                            m->name, (long long)c0, (long long)(c0 + B), (long long)wb);
    int training = save != NULL;
    lstm_call *k = calloc(1, sizeof *k);
    if (k == NULL)
        return FERRY_NOMEM();
    if ((st = ferry_ctx_create(m->P.be, &k->ctx)) != FERRY_OK) {
        free(k);
        return st;
    }
    ferry_ctx *ctx = k->ctx;
    ferry_ctx_reset(ctx, q->ctx_id);
    ferry_ctx_set_training(ctx, training);
    ferry_ctx_set_seed(ctx, a.seed);
    uint64_t s_seed, s_off;
    ferry_ctx_draw(ctx, off, &s_seed, &s_off); /* the group's masks start at off */
    if (win_T > 0)
        ferry_ctx_set_window(ctx, win_T, wb, t0, T, c0, B);
    int64_t want_s[3] = {K, B, H};
    if ((st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, ferry_shape_3d(T, B, C), &k->x)) == FERRY_OK) {
        memcpy(k->x->data, req->tensors[ix].data, (size_t)(T * B * C) * sizeof(float));
        if (training)
            st = ferry_ctx_require_grad(ctx, k->x);
    }
    if (st == FERRY_OK)
        st = state_input(m, req, ctx, FERRY_WIRE_LSTM_FWD_H0, want_s, training, &k->h0);
    if (st == FERRY_OK)
        st = state_input(m, req, ctx, FERRY_WIRE_LSTM_FWD_C0, want_s, training, &k->c0);
    if (st == FERRY_OK && (k->h0 == NULL) != (k->c0 == NULL))
        st = ferry_errorf(FERRY_ERR_INVALID, "lstm '%s': h0 and c0 go together", m->name);
    k->explicit_state = k->h0 != NULL;
    if (st == FERRY_OK && !k->explicit_state) {
        if ((st = ferry_ctx_zeros(ctx, FERRY_DTYPE_F32, ferry_shape_3d(K, B, H), &k->h0)) ==
            FERRY_OK)
            st = ferry_ctx_zeros(ctx, FERRY_DTYPE_F32, ferry_shape_3d(K, B, H), &k->c0);
        if (st == FERRY_OK && !a.reset)
            st = stream_start(m, im, key, q->ctx_id, q->call_id, B, k->h0->data, k->c0->data);
    }
    if (st == FERRY_OK)
        st = ferry_lstm_forward(&im->rnn, ctx, k->x, k->h0, k->c0, NULL, &k->y, &k->hn, &k->cn);
    if (st == FERRY_OK && (st = put(reply, FERRY_WIRE_LSTM_FWD_Y, k->y)) == FERRY_OK &&
        (st = put(reply, FERRY_WIRE_LSTM_FWD_HN, k->hn)) == FERRY_OK)
        st = put(reply, FERRY_WIRE_LSTM_FWD_CN, k->cn);
    if (st == FERRY_OK && a.carry)
        st = stream_carry(im, key, q->ctx_id, q->call_id, B, k->h0->data, k->c0->data, k->hn->data,
                          k->cn->data);
    if (st != FERRY_OK || !training) {
        lstm_call_free(k);
        return st;
    }
    save->N = T * B;
    return ferry__ps_saved_keep(save, k, lstm_call_free, (size_t)scratch, "lstm activations");
}

static ferry_status lstm_backward(ferry__ps_module *m, const Ferry__V1__BackwardRequest *q,
                                  ferry__ps_saved *saved, ferry_rpc_msg *req, ferry_grads *G,
                                  ferry_rpc_msg *reply) {
    (void)q;
    lstm_impl *im = bind(m);
    lstm_call *k = saved->obj;
    if (k == NULL)
        return ferry_errorf(FERRY_ERR_INVALID, "lstm '%s': nothing saved for this Backward",
                            m->name);
    ferry_ctx *ctx = k->ctx;
    int64_t T = k->y->shape.dim[0], B = k->y->shape.dim[1], H = im->rnn.H, K = im->rnn.L;
    int64_t want_y[3] = {T, B, H}, want_s[3] = {K, B, H};
    int iy;
    ferry_status st = ferry__ps_input(m, req, FERRY_WIRE_LSTM_BWD_DY, want_y, &iy);
    if (st == FERRY_OK)
        st = ferry__ps_check_finite(m, "dy", req->tensors[iy].data, T * B * H);
    ferry_tensor *seeds[3] = {NULL, NULL, NULL};
    const ferry_tensor *roots[3];
    int n = 0;
    if (st == FERRY_OK &&
        (st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, k->y->shape, &seeds[0])) == FERRY_OK) {
        memcpy(seeds[0]->data, req->tensors[iy].data, ferry_tensor_nbytes(k->y));
        roots[n++] = k->y;
    }
    ferry_tensor *dhn = NULL, *dcn = NULL;
    if (st == FERRY_OK)
        st = state_input(m, req, ctx, FERRY_WIRE_LSTM_BWD_DHN, want_s, 0, &dhn);
    if (st == FERRY_OK)
        st = state_input(m, req, ctx, FERRY_WIRE_LSTM_BWD_DCN, want_s, 0, &dcn);
    if (st != FERRY_OK)
        return st;
    if (dhn != NULL) {
        roots[n] = k->hn;
        seeds[n++] = dhn;
    }
    if (dcn != NULL) {
        roots[n] = k->cn;
        seeds[n++] = dcn;
    }
    if ((st = ferry_ctx_backward_from(ctx, n, roots, (const ferry_tensor *const *)seeds)) !=
        FERRY_OK)
        return st;
    /* The layers' gradients, in the view's layout, into the context's dense block. */
    ferry_grads *Gv = ferry_ctx_grads(ctx, &im->view);
    float *g = ferry_grads_dense(G, m->w);
    if (Gv == NULL || g == NULL)
        return FERRY_NOMEM_SAID; /* both say why */
    for (int i = 0; i < im->view.count && st == FERRY_OK; i++) {
        if (!Gv->touched[i])
            continue;
        const ferry_param *p = &im->view.items[i];
        st = ferry_backend_axpy(m->P.be, p->numel, 1.0f, Gv->dense + p->offset, g + p->offset);
    }
    const ferry_tensor *gx = ferry_ctx_grad_of(ctx, k->x);
    int64_t dim_x[3] = {T, B, k->x->shape.dim[2]};
    void *dst;
    if (st == FERRY_OK &&
        (st = ferry__ps_output(reply, FERRY_WIRE_LSTM_BWD_DX, dim_x, &dst)) == FERRY_OK) {
        if (gx != NULL)
            memcpy(dst, gx->data, ferry_tensor_nbytes(k->x));
        else
            memset(dst, 0, ferry_tensor_nbytes(k->x));
    }
    for (int s = 0; s < 2 && st == FERRY_OK && k->explicit_state; s++) {
        const ferry_tensor *src = ferry_ctx_grad_of(ctx, s == 0 ? k->h0 : k->c0);
        ferry_wire_tensor_id id = s == 0 ? FERRY_WIRE_LSTM_BWD_DH0 : FERRY_WIRE_LSTM_BWD_DC0;
        if ((st = ferry__ps_output(reply, id, want_s, &dst)) != FERRY_OK)
            break;
        if (src != NULL)
            memcpy(dst, src->data, (size_t)(K * B * H) * sizeof(float));
        else
            memset(dst, 0, (size_t)(K * B * H) * sizeof(float));
    }
    return st;
}

const ferry__ps_kind ferry__ps_kind_lstm = {
    .wire = FERRY_WIRE_KIND_LSTM,
    .declare = lstm_declare,
    .forward = lstm_forward,
    .backward = lstm_backward,
    .destroy = lstm_destroy,
    .polar = lstm_polar,
    .penalty = lstm_penalty,
};
