/* lstm.c - a remote group of LSTM layers (the server's `lstm` kind): its Forward and
 * Backward, and the tape node that makes it one stage of a model whose other layers
 * run here or on other servers. The node passes the caller's dropout stream (seed,
 * offset, window) to the server, which draws the group's masks from it, and advances
 * the stream by what those masks take, so the layers after the group draw what they
 * would if the whole stack ran here. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/dist/dist.h"
#include "common/tensor/backend.h"
#include "ferry/nn.h"

/* ---- the kind ---- */

int64_t ferry_remote_lstm_numel(int64_t C, int64_t H, int layers) {
    ferry_params P;
    ferry_lstm rnn;
    ferry_params_init(&P, ferry_backend_cpu());
    int64_t n = ferry_lstm_init(&rnn, &P, "lstm", C, H, layers, 0.0f) == FERRY_OK ? P.numel : -1;
    ferry_params_deinit(&P);
    return n;
}

static ferry_status lstm_check(const ferry_remote_config *cfg) {
    if (cfg->layers < 0 || cfg->layers > FERRY_LSTM_MAX_LAYERS || cfg->first_layer < 0 ||
        cfg->first_layer + (cfg->layers ? cfg->layers : 1) > FERRY_LSTM_MAX_LAYERS ||
        !(cfg->dropout >= 0.0f && cfg->dropout < 1.0f))
        return ferry_errorf(FERRY_ERR_INVALID,
                            "module '%s': lstm layers %d from %d (1..%d in all) or dropout %g "
                            "out of range",
                            cfg->name, cfg->layers, cfg->first_layer, FERRY_LSTM_MAX_LAYERS,
                            (double)cfg->dropout);
    return FERRY_OK;
}

/* One row: the group's packed layers. */
static ferry_status lstm_shape(ferry_remote *m, const ferry_remote_config *cfg) {
    m->layers = cfg->layers > 0 ? cfg->layers : 1;
    m->dropout = cfg->dropout;
    m->cols = ferry_remote_lstm_numel(cfg->dims[0], cfg->dims[1], m->layers);
    if (m->cols <= 0)
        return ferry_errorf(FERRY_ERR_INVALID, "module '%s': lstm dims [%lld, %lld]", cfg->name,
                            (long long)cfg->dims[0], (long long)cfg->dims[1]);
    return FERRY_OK;
}

const ferry__dist_kind ferry__dist_kind_lstm = {
    .wire = FERRY_WIRE_KIND_LSTM,
    .check = lstm_check,
    .shape = lstm_shape,
};
#include "ferry.pb-c.h"
#include "common/core/log.h"

static ferry_status one_call(ferry_remote *m, ferry_dist_ctx *dc, ferry_rpc_method method,
                             ferry_rpc_msg *req, ferry_rpc_msg *reply) {
    int server = m->shards[0].server;
    if (method == FERRY_RPC_FORWARD)
        ferry__dist_touch(dc, server);
    return ferry__dist_fanout(m->c, method, 1, &server, req, 1, reply);
}

static ferry_status copy_out(ferry_remote *m, const ferry_rpc_msg *reply, ferry_wire_tensor_id id,
                             const int64_t *want, float *dst) {
    const ferry_rpc_tensor *t;
    ferry_status st = ferry__dist_output(m->c, m->shards[0].server, reply, id, want, &t);
    if (st == FERRY_OK && dst != NULL)
        memcpy(dst, t->data, t->nbytes);
    return st;
}

/* ferry_remote_lstm_forward, for the columns [col0, col0 + B) of a window of `batch`
 * columns (batch 0: the call's B is the window's batch). */
static ferry_status lstm_forward(ferry_remote *m, ferry_dist_ctx *dc,
                                 const ferry_remote_lstm_args *a, int64_t batch, int64_t col0,
                                 const float *x, int64_t T, int64_t B, const float *h0,
                                 const float *c0, float *y, float *hn, float *cn,
                                 uint64_t *call_id) {
    ferry_status st = ferry__dist_check(m, FERRY_REMOTE_LSTM, "lstm forward", dc, 0);
    if (st != FERRY_OK)
        return st;
    if (T < 1 || B < 1 || (h0 == NULL) != (c0 == NULL))
        return ferry_errorf(FERRY_ERR_INVALID,
                            "lstm forward of '%s': need T, B >= 1 and h0, c0 both or neither",
                            m->name);
    /* A rank's or micro-batch's columns of a bigger window, with masks between the
     * group's layers: they are the window's there, which a server before contract 1.5
     * cannot draw. */
    int cols_of_batch = m->dropout > 0.0f && m->layers > 1 && a->window_T > 0 && batch > 0 &&
                        (batch != B || col0 != 0);
    int minor = cols_of_batch ? ferry__dist_min_minor(m->c) : FERRY_CONTRACT_MINOR;
    if (minor < 5)
        return ferry_errorf(FERRY_ERR_UNSUPPORTED,
                            "lstm '%s': a ferry-ps of contract 1.%d (before 1.5) draws the "
                            "dropout masks of its layers over the call's own columns, not "
                            "columns [%lld, %lld) of the batch of %lld: upgrade the servers, or "
                            "keep the layers in the trainer",
                            m->name, minor, (long long)col0, (long long)(col0 + B),
                            (long long)batch);
    int64_t C = m->dims[0], H = m->dims[1], K = m->layers;
    ferry__dist_call *rec = NULL;
    if (dc != NULL) {
        if ((rec = ferry__dist_call_new(dc, m, FERRY__DIST_LSTM)) == NULL)
            return FERRY_NOMEM();
        rec->n = T * B;
        rec->T = T;
        rec->B = B;
        rec->explicit_state = h0 != NULL;
    }
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    Ferry__V1__LstmForwardArgs args;
    ferry__v1__lstm_forward_args__init(&args);
    args.stream = a->stream;
    args.reset = a->reset != 0;
    args.carry = a->carry != 0;
    args.seed = a->seed;
    args.rng_offset = a->rng_offset;
    args.window_t = (uint64_t)a->window_T;
    args.t0 = (uint64_t)a->t0;
    if (cols_of_batch) {
        args.batch = (uint64_t)batch;
        args.col0 = (uint64_t)col0;
    }
    Ferry__V1__ForwardRequest q;
    ferry__v1__forward_request__init(&q);
    q.ctx_id = dc != NULL ? dc->id : 0;
    q.call_id = rec != NULL ? rec->call_id : 0;
    q.module = m->name;
    q.mode = (char *)(uintptr_t)ferry_wire_modes[FERRY_WIRE_MODE_LSTM_SEQ].name;
    q.args_case = FERRY__V1__FORWARD_REQUEST__ARGS_LSTM;
    q.lstm = &args;
    q.reply_dtype = (Ferry__V1__DType)ferry__dist_reply_dtype(m->c, &req);
    int64_t dx[3] = {T, B, C}, ds[3] = {K, B, H}, dy[3] = {T, B, H};
    ferry_rpc_tensor tx = ferry__dist_tensor(FERRY_WIRE_LSTM_FWD_X, dx, x);
    st = ferry_rpc_msg_set_head(&req, &q.base);
    if (st == FERRY_OK)
        st = ferry_rpc_msg_add(&req, &tx);
    if (st == FERRY_OK && h0 != NULL) {
        ferry_rpc_tensor th = ferry__dist_tensor(FERRY_WIRE_LSTM_FWD_H0, ds, h0);
        ferry_rpc_tensor tc = ferry__dist_tensor(FERRY_WIRE_LSTM_FWD_C0, ds, c0);
        if ((st = ferry_rpc_msg_add(&req, &th)) == FERRY_OK)
            st = ferry_rpc_msg_add(&req, &tc);
    }
    if (st == FERRY_OK)
        st = one_call(m, dc, FERRY_RPC_FORWARD, &req, &reply);
    if (st == FERRY_OK)
        st = copy_out(m, &reply, FERRY_WIRE_LSTM_FWD_Y, dy, y);
    if (st == FERRY_OK)
        st = copy_out(m, &reply, FERRY_WIRE_LSTM_FWD_HN, ds, hn);
    if (st == FERRY_OK)
        st = copy_out(m, &reply, FERRY_WIRE_LSTM_FWD_CN, ds, cn);
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
    if (rec != NULL && st != FERRY_OK)
        ferry__dist_call_drop(dc, rec);
    else if (rec != NULL && call_id != NULL)
        *call_id = rec->call_id;
    return st;
}

ferry_status ferry_remote_lstm_forward(ferry_remote *m, ferry_dist_ctx *dc,
                                       const ferry_remote_lstm_args *a, const float *x, int64_t T,
                                       int64_t B, const float *h0, const float *c0, float *y,
                                       float *hn, float *cn, uint64_t *call_id) {
    return lstm_forward(m, dc, a, 0, 0, x, T, B, h0, c0, y, hn, cn, call_id);
}

ferry_status ferry_remote_lstm_backward(ferry_remote *m, ferry_dist_ctx *dc, uint64_t call_id,
                                        const float *dy, const float *dhn, const float *dcn,
                                        float *dx, float *dh0, float *dc0) {
    ferry_status st = ferry__dist_check(m, FERRY_REMOTE_LSTM, "lstm backward", dc, 1);
    if (st != FERRY_OK)
        return st;
    ferry__dist_call *rec = ferry__dist_call_find(dc, m, call_id, FERRY__DIST_LSTM);
    if (rec == NULL)
        return FERRY_ERR_NOT_FOUND;
    int64_t T = rec->T, B = rec->B, C = m->dims[0], H = m->dims[1], K = m->layers;
    int64_t dimx[3] = {T, B, C}, dimy[3] = {T, B, H}, ds[3] = {K, B, H};
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    st = ferry__dist_backward_head(&req, rec, dc->id, FERRY_WIRE_MODE_LSTM_SEQ, NULL);
    ferry_rpc_tensor t = ferry__dist_tensor(FERRY_WIRE_LSTM_BWD_DY, dimy, dy);
    if (st == FERRY_OK)
        st = ferry_rpc_msg_add(&req, &t);
    if (st == FERRY_OK && dhn != NULL) {
        t = ferry__dist_tensor(FERRY_WIRE_LSTM_BWD_DHN, ds, dhn);
        st = ferry_rpc_msg_add(&req, &t);
    }
    if (st == FERRY_OK && dcn != NULL) {
        t = ferry__dist_tensor(FERRY_WIRE_LSTM_BWD_DCN, ds, dcn);
        st = ferry_rpc_msg_add(&req, &t);
    }
    if (st == FERRY_OK)
        st = one_call(m, dc, FERRY_RPC_BACKWARD, &req, &reply);
    if (st == FERRY_OK)
        st = copy_out(m, &reply, FERRY_WIRE_LSTM_BWD_DX, dimx, dx);
    if (st == FERRY_OK && rec->explicit_state &&
        (st = copy_out(m, &reply, FERRY_WIRE_LSTM_BWD_DH0, ds, dh0)) == FERRY_OK)
        st = copy_out(m, &reply, FERRY_WIRE_LSTM_BWD_DC0, ds, dc0);
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
    ferry__dist_call_drop(dc, rec);
    return st;
}

/* ---- the tape node ---- */

typedef struct lstm_node {
    ferry_remote *m;
    ferry_dist_ctx *dc;
    uint64_t ctx_id, call;
    int64_t T, B;
    int explicit_state;
} lstm_node;

static ferry_status lstm_node_backward(ferry_ctx *ctx, void *saved, ferry_tensor *const *grad_out,
                                       ferry_tensor **grad_in) {
    lstm_node *s = saved;
    ferry_status st = ferry__dist_check_same(s->m, s->dc, s->ctx_id);
    if (st != FERRY_OK)
        return st;
    int64_t C = s->m->dims[0], H = s->m->dims[1], K = s->m->layers;
    int64_t ny = s->T * s->B * H, nx = s->T * s->B * C, ns = K * s->B * H;
    const float *dy = NULL, *dhn = NULL, *dcn = NULL;
    if (grad_out[0] != NULL)
        st = ferry__dist_host_floats(ctx, grad_out[0], &dy);
    else if ((dy = ferry_ctx_host_alloc(ctx, (size_t)ny * sizeof(float))) == NULL)
        st = FERRY_NOMEM(); /* zeroed: the layers' gradients still come from hn, cn */
    if (st == FERRY_OK && grad_out[1] != NULL)
        st = ferry__dist_host_floats(ctx, grad_out[1], &dhn);
    if (st == FERRY_OK && grad_out[2] != NULL)
        st = ferry__dist_host_floats(ctx, grad_out[2], &dcn);
    float *dx = ferry_ctx_host_alloc(ctx, (size_t)(nx + 2 * ns) * sizeof(float));
    if (st == FERRY_OK && dx == NULL)
        st = FERRY_NOMEM();
    if (st != FERRY_OK)
        return st;
    float *dh0 = dx + nx, *dc0 = dh0 + ns;
    if ((st = ferry_remote_lstm_backward(s->m, s->dc, s->call, dy, dhn, dcn, dx, dh0, dc0)) !=
        FERRY_OK)
        return st;
    if (grad_in[0] != NULL && (st = ferry__dist_add_host(ctx, grad_in[0], dx, nx)) != FERRY_OK)
        return st;
    if (s->explicit_state && grad_in[1] != NULL &&
        (st = ferry__dist_add_host(ctx, grad_in[1], dh0, ns)) != FERRY_OK)
        return st;
    if (s->explicit_state && grad_in[2] != NULL)
        st = ferry__dist_add_host(ctx, grad_in[2], dc0, ns);
    return st;
}

ferry_status ferry_dist_lstm_forward(ferry_remote *m, ferry_dist_ctx *dc, ferry_ctx *ctx,
                                     uint64_t stream, int flags, const ferry_tensor *x,
                                     const ferry_tensor *h0, const ferry_tensor *c0,
                                     ferry_tensor **y, ferry_tensor **hn, ferry_tensor **cn) {
    int training = ferry_ctx_training(ctx);
    ferry_status st = ferry__dist_check_open(m, dc, ctx);
    if (st != FERRY_OK)
        return st;
    int64_t C = m->dims[0], H = m->dims[1], K = m->layers;
    if (x->dtype != FERRY_DTYPE_F32 || x->shape.ndim != 3 || x->shape.dim[2] != C ||
        (h0 == NULL) != (c0 == NULL))
        return ferry_errorf(FERRY_ERR_SHAPE,
                            "remote lstm '%s': x must be float32 (T, B, %lld), h0 and c0 both "
                            "or neither",
                            m->name, (long long)C);
    int64_t T = x->shape.dim[0], B = x->shape.dim[1];
    ferry_shape ss = ferry_shape_3d(K, B, H);
    if ((h0 != NULL && !ferry_shape_eq(h0->shape, ss)) ||
        (c0 != NULL && !ferry_shape_eq(c0->shape, ss)))
        return ferry_errorf(FERRY_ERR_SHAPE,
                            "remote lstm '%s': h0 and c0 must be (%lld, %lld, %lld)", m->name,
                            (long long)K, (long long)B, (long long)H);
    /* The dropout stream: the group's masks start where this context's stream is,
     * and the context moves past them as the same layers would move it here. */
    ferry_remote_lstm_args a = {.stream = stream,
                                .reset = (flags & FERRY_DIST_LSTM_RESET) != 0,
                                .carry = (flags & FERRY_DIST_LSTM_CARRY) != 0};
    int64_t win_T, win_B, t0, steps;
    ferry_ctx_get_window(ctx, &win_T, &win_B, &t0, &steps);
    uint64_t seed, off;
    ferry_ctx_draw(ctx, 0, &seed, &off);
    a.seed = seed;
    a.rng_offset = off;
    if (win_B > 0) {
        a.window_T = win_T;
        a.t0 = t0;
    }
    if (training && m->dropout > 0.0f) {
        int64_t per = (win_B > 0 ? win_T * win_B : T * B) * H;
        ferry_ctx_draw(ctx, (K - 1) * per, &seed, &off);
    }
    ferry_tensor *out[3];
    if ((st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, ferry_shape_3d(T, B, H), &out[0])) !=
            FERRY_OK ||
        (st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, ss, &out[1])) != FERRY_OK ||
        (st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, ss, &out[2])) != FERRY_OK)
        return st;
    const float *hx, *hh0 = NULL, *hc0 = NULL;
    if ((st = ferry__dist_host_floats(ctx, x, &hx)) != FERRY_OK ||
        (h0 != NULL && (st = ferry__dist_host_floats(ctx, h0, &hh0)) != FERRY_OK) ||
        (c0 != NULL && (st = ferry__dist_host_floats(ctx, c0, &hc0)) != FERRY_OK))
        return st;
    float *host[3];
    for (int i = 0; i < 3; i++) {
        host[i] = ferry_backend_is_host(out[i]->be)
                      ? ferry_tensor_f32(out[i])
                      : ferry_ctx_host_alloc(ctx, ferry_tensor_nbytes(out[i]));
        if (host[i] == NULL)
            return FERRY_NOMEM();
    }
    uint64_t call = 0;
    int64_t col0 = 0, cols = 0;
    if (win_B > 0)
        ferry_ctx_get_window_cols(ctx, &col0, &cols);
    if ((st = lstm_forward(m, training ? dc : NULL, &a, win_B, col0, hx, T, B, hh0, hc0, host[0],
                           host[1], host[2], &call)) != FERRY_OK)
        return st;
    for (int i = 0; i < 3; i++) {
        if (!ferry_backend_is_host(out[i]->be) &&
            (st = ferry_tensor_from_host(out[i], host[i])) != FERRY_OK)
            return st;
    }
    if (training) {
        lstm_node *s = ferry_ctx_host_alloc(ctx, sizeof *s);
        if (s == NULL)
            return FERRY_NOMEM();
        *s = (lstm_node){m, dc, ferry_dist_ctx_id(dc), call, T, B, h0 != NULL};
        ferry_tensor *in[3] = {(ferry_tensor *)(uintptr_t)x, (ferry_tensor *)(uintptr_t)h0,
                               (ferry_tensor *)(uintptr_t)c0};
        if ((st = ferry_ctx_record(ctx, lstm_node_backward, s, h0 != NULL ? 3 : 1, in, 3, out)) !=
            FERRY_OK)
            return st;
    }
    *y = out[0];
    *hn = out[1];
    *cn = out[2];
    return FERRY_OK;
}
