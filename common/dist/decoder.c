/* decoder.c - calls of the dense remote modules. The decoder's sharded softmax:
 * every vocabulary shard returns, per row, the max of its logits, the sum of their
 * exp relative to it and the target's logit when the target is in its slice; the
 * log-sum-exp over the whole vocabulary follows exactly (in double) as
 * M + log sum_s sumexp_s exp(max_s - M), so logits never cross the wire. Its
 * Backward sends each shard the factor exp(max_s - M) / S that normalises its saved
 * exponentials, and sums the shards' dh. Also the classic
 * logits mode and the linear module. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/dist/dist.h"
#include "common/nn/affine.h"
#include "common/tensor/backend.h"
#include "ferry.pb-c.h"
#include "common/core/log.h"

/* The state of one fan-out over a module's shards. */
typedef struct fan {
    int k;
    int servers[FERRY_DIST_MAX_SERVERS];
    ferry_rpc_msg reqs[FERRY_DIST_MAX_SERVERS];
    ferry_rpc_msg replies[FERRY_DIST_MAX_SERVERS];
} fan;

static fan *fan_create(const ferry_remote *m, ferry_dist_ctx *dc) {
    fan *f = malloc(sizeof *f);
    if (f == NULL)
        return NULL;
    f->k = m->nshards;
    for (int s = 0; s < f->k; s++) {
        f->servers[s] = m->shards[s].server;
        if (dc != NULL)
            ferry__dist_touch(dc, f->servers[s]);
        ferry_rpc_msg_init(&f->reqs[s]);
        ferry_rpc_msg_init(&f->replies[s]);
    }
    return f;
}

static void fan_destroy(fan *f) {
    if (f == NULL)
        return;
    for (int s = 0; s < f->k; s++) {
        ferry_rpc_msg_deinit(&f->reqs[s]);
        ferry_rpc_msg_deinit(&f->replies[s]);
    }
    free(f);
}

/* Sums the (N, H) "dh" of every reply into dh in shard order. */
static ferry_status fan_sum_dh(const ferry_remote *m, const fan *f, ferry_wire_tensor_id id,
                               int64_t N, float *dh) {
    int64_t H = m->cols, want[2] = {N, H};
    for (int s = 0; s < f->k; s++) {
        const ferry_rpc_tensor *t;
        ferry_status st = ferry__dist_output(m->c, f->servers[s], &f->replies[s], id, want, &t);
        if (st != FERRY_OK)
            return st;
        const float *src = t->data;
        if (s == 0) {
            memcpy(dh, src, (size_t)(N * H) * sizeof *dh);
            continue;
        }
        for (int64_t i = 0; i < N * H; i++)
            dh[i] += src[i];
    }
    return FERRY_OK;
}

/* A record for a saving call (dc != NULL), or none. */
static ferry_status record(ferry_dist_ctx *dc, const ferry_remote *m, int op, int64_t N,
                           ferry__dist_call **out) {
    *out = NULL;
    if (dc == NULL)
        return FERRY_OK;
    if ((*out = ferry__dist_call_new(dc, m, op)) == NULL)
        return FERRY_NOMEM();
    (*out)->n = N;
    return FERRY_OK;
}

/* ---- sharded softmax cross-entropy ---- */

const ferry__dist_kind ferry__dist_kind_decoder = {.wire = FERRY_WIRE_KIND_DECODER};

/* The local slice's share of one xent call (ferry_remote_decoder_set_local), computed
 * on the calling thread while the servers compute theirs: forward, its logits and
 * partials (e keeps exp(z - max) for the Backward); backward, its gradient into the
 * accumulators and its dh. */
typedef struct local_part {
    const ferry_remote *m;
    int64_t N;
    const float *h;                  /* (N, H) */
    const int32_t *targets;          /* (N) global ids (forward) */
    float *e;                        /* (N, NL) */
    int32_t *lt;                     /* (N) row in the slice or -1 */
    float *mx, *tl;                  /* forward: (N) partials */
    double *se;                      /* forward: (N) */
    const float *factor, *row_scale; /* backward: (N) its factors; (N) or NULL */
    float scale;
    float *dh; /* backward: (N, H) its share */
    ferry_status st;
} local_part;

static void local_forward(void *arg) {
    local_part *p = arg;
    const ferry_remote *m = p->m;
    int64_t NL = m->local_rows, first = m->rows - NL;
    for (int64_t n = 0; n < p->N; n++) {
        int64_t r = (int64_t)p->targets[n] - first;
        p->lt[n] = r >= 0 && r < NL ? (int32_t)r : -1;
    }
    p->st =
        ferry_affine_forward(m->local_be, p->N, m->cols, NL, p->h, m->local_w, m->local_b, p->e);
    if (p->st == FERRY_OK)
        p->st =
            ferry_backend_softmax_partials(m->local_be, p->N, NL, p->e, p->lt, p->mx, p->se, p->tl);
}

static void local_backward(void *arg) {
    local_part *p = arg;
    const ferry_remote *m = p->m;
    int64_t NL = m->local_rows;
    p->st = ferry_backend_softmax_grad(m->local_be, p->N, NL, p->e, p->factor, p->lt, p->row_scale,
                                       p->scale);
    if (p->st == FERRY_OK)
        p->st = ferry_affine_backward(m->local_be, p->N, m->cols, NL, p->h, p->e, m->local_w,
                                      m->local_w, 0, m->local_gw, m->local_gb, p->dh, 0, NULL);
}

/* Combines the shards' partials (and the local slice's, lp != NULL, last) into the
 * loss per row and, for each part s and row n, factor[s*N + n] = exp(max_s - M) / S
 * with M the global max and S the global sum of exp(z - M): the multiplier that turns
 * part s's saved exp(z - max_s) into the exact softmax. With one shard this is the
 * local cross-entropy's arithmetic. */
static ferry_status combine_partials(const ferry_remote *m, const fan *f, const local_part *lp,
                                     int64_t N, float *factor, float *loss_rows, double *loss_sum) {
    const float *mx[FERRY_DIST_MAX_SERVERS + 1], *tl[FERRY_DIST_MAX_SERVERS + 1];
    const double *se[FERRY_DIST_MAX_SERVERS + 1];
    const int32_t *has[FERRY_DIST_MAX_SERVERS], *lt = NULL;
    int64_t want[1] = {N};
    int k = f->k;
    for (int s = 0; s < f->k; s++) {
        const ferry_rpc_tensor *a, *b, *c, *d;
        ferry_status st;
        if ((st = ferry__dist_output(m->c, f->servers[s], &f->replies[s],
                                     FERRY_WIRE_DECODER_FWD_MAX, want, &a)) != FERRY_OK ||
            (st = ferry__dist_output(m->c, f->servers[s], &f->replies[s],
                                     FERRY_WIRE_DECODER_FWD_SUMEXP, want, &b)) != FERRY_OK ||
            (st = ferry__dist_output(m->c, f->servers[s], &f->replies[s],
                                     FERRY_WIRE_DECODER_FWD_TARGET_LOGIT, want, &c)) != FERRY_OK ||
            (st = ferry__dist_output(m->c, f->servers[s], &f->replies[s],
                                     FERRY_WIRE_DECODER_FWD_HAS_TARGET, want, &d)) != FERRY_OK)
            return st;
        mx[s] = a->data;
        se[s] = b->data;
        tl[s] = c->data;
        has[s] = d->data;
    }
    if (lp != NULL) {
        mx[k] = lp->mx;
        se[k] = lp->se;
        tl[k] = lp->tl;
        lt = lp->lt;
        k++;
    }
    double total = 0.0;
    for (int64_t n = 0; n < N; n++) {
        float M = mx[0][n];
        double S = 0.0;
        float target = 0.0f;
        int found = 0;
        for (int s = 1; s < k; s++)
            M = mx[s][n] > M ? mx[s][n] : M;
        for (int s = 0; s < k; s++) {
            S += se[s][n] * exp((double)mx[s][n] - (double)M);
            if (s < f->k ? has[s][n] != 0 : lt[n] >= 0) {
                target = tl[s][n];
                found++;
            }
        }
        if (found != 1 || !(S > 0.0) || !isfinite(S))
            return ferry_errorf(FERRY_ERR_FORMAT,
                                "decoder '%s': row %lld: target on %d shards (want 1), sum %g",
                                m->name, (long long)n, found, S);
        for (int s = 0; s < k; s++)
            factor[(int64_t)s * N + n] = (float)(exp((double)mx[s][n] - (double)M) / S);
        float row = (float)(log(S) + (double)M - (double)target);
        if (loss_rows != NULL)
            loss_rows[n] = row;
        total += (double)row;
    }
    if (loss_sum != NULL)
        *loss_sum = total;
    return FERRY_OK;
}

/* Buffers of the local slice's forward over N rows of hidden (h copied: the Backward
 * needs it after the caller's buffer is gone). */
static ferry_status local_alloc(const ferry_remote *m, int64_t N, const float *hidden,
                                const int32_t *targets, local_part *p) {
    memset(p, 0, sizeof *p);
    if (m->local_rows == 0)
        return FERRY_OK;
    if (m->local_be == NULL)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "decoder '%s': %lld local rows but no local slice "
                            "set (ferry_remote_decoder_set_local)",
                            m->name, (long long)m->local_rows);
    size_t n1 = (size_t)(N > 0 ? N : 1);
    p->m = m;
    p->N = N;
    p->targets = targets;
    float *h = malloc(n1 * (size_t)m->cols * sizeof *h);
    p->e = malloc(n1 * (size_t)m->local_rows * sizeof *p->e);
    p->lt = malloc(n1 * sizeof *p->lt);
    p->mx = malloc(n1 * sizeof *p->mx);
    p->tl = malloc(n1 * sizeof *p->tl);
    p->se = malloc(n1 * sizeof *p->se);
    p->h = h;
    if (h == NULL || p->e == NULL || p->lt == NULL || p->mx == NULL || p->tl == NULL ||
        p->se == NULL)
        return FERRY_NOMEM();
    memcpy(h, hidden, (size_t)(N * m->cols) * sizeof *h);
    return FERRY_OK;
}

static void local_free(local_part *p) {
    free((void *)(uintptr_t)p->h);
    free(p->e);
    free(p->lt);
    free(p->mx);
    free(p->tl);
    free(p->se);
}

ferry_status ferry_remote_xent_forward(ferry_remote *dec, ferry_dist_ctx *dc, const float *hidden,
                                       const int32_t *targets, int64_t N, float *loss_rows,
                                       double *loss_sum, uint64_t *call_id) {
    ferry_status st = ferry__dist_check(dec, FERRY_REMOTE_DECODER, "xent forward", dc, 0);
    if (st != FERRY_OK)
        return st;
    if (N < 0 || N > INT32_MAX)
        return ferry_errorf(FERRY_ERR_INVALID, "decoder '%s': %lld rows", dec->name, (long long)N);
    for (int64_t n = 0; n < N; n++) {
        if (targets[n] < 0 || targets[n] >= dec->rows)
            return ferry_errorf(FERRY_ERR_RANGE,
                                "decoder '%s': targets[%lld] = %d outside [0, %lld)", dec->name,
                                (long long)n, targets[n], (long long)dec->rows);
    }
    ferry__dist_call *rec;
    if ((st = record(dc, dec, FERRY__DIST_XENT, N, &rec)) != FERRY_OK)
        return st;
    fan *f = fan_create(dec, dc);
    int parts = dec->nshards + (dec->local_rows > 0);
    float *factor = malloc((size_t)(N * parts + 1) * sizeof *factor); /* factors (parts, N) */
    local_part lp = {0}; /* local_alloc fills it (freed on every path) */
    if (f == NULL || factor == NULL)
        st = FERRY_NOMEM();
    if (st == FERRY_OK)
        st = local_alloc(dec, N, hidden, targets, &lp);
    int64_t hdim[2] = {N, dec->cols}, tdim[1] = {N};
    ferry_rpc_tensor h = ferry__dist_tensor(FERRY_WIRE_DECODER_FWD_HIDDEN, hdim, hidden);
    ferry_rpc_tensor t = ferry__dist_tensor(FERRY_WIRE_DECODER_FWD_TARGETS, tdim, targets);
    /* One request for every shard: the same hidden state and targets. */
    if (st == FERRY_OK)
        st = ferry__dist_forward_head(&f->reqs[0], dec, dc != NULL ? dc->id : 0,
                                      rec != NULL ? rec->call_id : 0,
                                      FERRY_WIRE_MODE_DECODER_PARTIALS);
    if (st == FERRY_OK && (st = ferry_rpc_msg_add(&f->reqs[0], &h)) == FERRY_OK)
        st = ferry_rpc_msg_add(&f->reqs[0], &t);
    if (st == FERRY_OK)
        st = ferry__dist_fanout_during(dec->c, FERRY_RPC_FORWARD, f->k, f->servers, f->reqs, 1,
                                       f->replies, 0, lp.m != NULL ? local_forward : NULL, &lp);
    if (st == FERRY_OK)
        st = lp.st;
    if (st == FERRY_OK)
        st = combine_partials(dec, f, lp.m != NULL ? &lp : NULL, N, factor, loss_rows, loss_sum);
    fan_destroy(f);
    if (rec != NULL && st == FERRY_OK) {
        rec->factor = factor;
        factor = NULL;
        /* The Backward of the local slice needs its input, exponentials and targets. */
        rec->loc_h = (float *)(uintptr_t)lp.h;
        rec->loc_e = lp.e;
        rec->loc_t = lp.lt;
        lp.h = lp.e = NULL;
        lp.lt = NULL;
        if (call_id != NULL)
            *call_id = rec->call_id;
    } else if (rec != NULL) {
        ferry__dist_call_drop(dc, rec);
    }
    local_free(&lp);
    free(factor);
    return st;
}

/* The pending Forward a decoder Backward answers, or a status. */
static ferry_status backward_call(ferry_remote *dec, ferry_dist_ctx *dc, uint64_t call_id, int op,
                                  const char *what, ferry__dist_call **rec) {
    ferry_status st = ferry__dist_check(dec, FERRY_REMOTE_DECODER, what, dc, 1);
    if (st != FERRY_OK)
        return st;
    *rec = ferry__dist_call_find(dc, dec, call_id, op);
    return *rec != NULL ? FERRY_OK : FERRY_ERR_NOT_FOUND;
}

/* Sends the per-shard Backward requests built in f (when st is FERRY_OK), runs the
 * local slice's part (lp != NULL) meanwhile, sums the shards' dh (dh_id) into dh in
 * shard order, the local slice's last, and ends the call. */
static ferry_status backward_finish(ferry_remote *dec, ferry_dist_ctx *dc, ferry__dist_call *rec,
                                    fan *f, local_part *lp, ferry_wire_tensor_id dh_id, float *dh,
                                    ferry_status st) {
    if (st == FERRY_OK)
        st = ferry__dist_fanout_during(dec->c, FERRY_RPC_BACKWARD, f->k, f->servers, f->reqs, 0,
                                       f->replies, 0, lp != NULL ? local_backward : NULL, lp);
    if (st == FERRY_OK && lp != NULL)
        st = lp->st;
    if (st == FERRY_OK)
        st = fan_sum_dh(dec, f, dh_id, rec->n, dh);
    for (int64_t i = 0; st == FERRY_OK && lp != NULL && i < rec->n * dec->cols; i++)
        dh[i] += lp->dh[i];
    fan_destroy(f);
    ferry__dist_call_drop(dc, rec);
    return st;
}

ferry_status ferry_remote_xent_backward(ferry_remote *dec, ferry_dist_ctx *dc, uint64_t call_id,
                                        const float *row_scale, float scale, float *dh) {
    ferry__dist_call *rec;
    ferry_status st = backward_call(dec, dc, call_id, FERRY__DIST_XENT, "xent backward", &rec);
    if (st != FERRY_OK)
        return st;
    fan *f = fan_create(dec, NULL);
    if (f == NULL)
        return FERRY_NOMEM();
    int64_t N = rec->n, dim[1] = {N};
    double s = (double)scale;
    ferry_rpc_tensor r = ferry__dist_tensor(FERRY_WIRE_DECODER_BWD_SCALE, dim, row_scale);
    local_part lp = {.m = dec,
                     .N = N,
                     .h = rec->loc_h,
                     .e = rec->loc_e,
                     .lt = rec->loc_t,
                     .factor = rec->factor + (int64_t)f->k * N,
                     .row_scale = row_scale,
                     .scale = scale};
    if (dec->local_rows > 0 && dec->local_gw == NULL)
        st = ferry_errorf(FERRY_ERR_INVALID,
                          "decoder '%s': Backward of the local slice without "
                          "gradient accumulators (ferry_remote_decoder_set_local)",
                          dec->name);
    else if (dec->local_rows > 0 &&
             (lp.dh = malloc((size_t)(N * dec->cols + 1) * sizeof *lp.dh)) == NULL)
        st = FERRY_NOMEM();
    /* One request per shard: each gets its own softmax factors (rec->factor holds (k, N)). */
    for (int k = 0; st == FERRY_OK && k < f->k; k++) {
        ferry_rpc_tensor l =
            ferry__dist_tensor(FERRY_WIRE_DECODER_BWD_FACTOR, dim, rec->factor + (int64_t)k * N);
        if ((st = ferry__dist_backward_head(&f->reqs[k], rec, dc->id,
                                            FERRY_WIRE_MODE_DECODER_PARTIALS, &s)) == FERRY_OK &&
            (st = ferry_rpc_msg_add(&f->reqs[k], &l)) == FERRY_OK && row_scale != NULL)
            st = ferry_rpc_msg_add(&f->reqs[k], &r);
    }
    st = backward_finish(dec, dc, rec, f, lp.dh != NULL ? &lp : NULL, FERRY_WIRE_DECODER_BWD_DH, dh,
                         st);
    free(lp.dh);
    return st;
}

/* ---- classic logits ---- */

ferry_status ferry_remote_logits_forward(ferry_remote *dec, ferry_dist_ctx *dc, const float *hidden,
                                         int64_t N, float *logits, uint64_t *call_id) {
    ferry_status st = ferry__dist_check(dec, FERRY_REMOTE_DECODER, "logits forward", dc, 0);
    if (st != FERRY_OK)
        return st;
    if (dec->local_rows > 0)
        return ferry_errorf(FERRY_ERR_UNSUPPORTED,
                            "decoder '%s': a local slice of the vocabulary "
                            "needs the sharded softmax (the xent calls), not logits",
                            dec->name);
    ferry__dist_call *rec;
    if ((st = record(dc, dec, FERRY__DIST_LOGITS, N, &rec)) != FERRY_OK)
        return st;
    fan *f = fan_create(dec, dc);
    int64_t hdim[2] = {N, dec->cols}, V = dec->rows;
    ferry_rpc_tensor h = ferry__dist_tensor(FERRY_WIRE_DECODER_LOGITS_FWD_HIDDEN, hdim, hidden);
    st = f != NULL ? ferry__dist_forward_head(&f->reqs[0], dec, dc != NULL ? dc->id : 0,
                                              rec != NULL ? rec->call_id : 0,
                                              FERRY_WIRE_MODE_DECODER_LOGITS)
                   : FERRY_NOMEM();
    if (st == FERRY_OK && (st = ferry_rpc_msg_add(&f->reqs[0], &h)) == FERRY_OK)
        st =
            ferry__dist_fanout(dec->c, FERRY_RPC_FORWARD, f->k, f->servers, f->reqs, 1, f->replies);
    for (int s = 0; st == FERRY_OK && s < f->k; s++) {
        const ferry__dist_shard *sh = &dec->shards[s];
        int64_t want[2] = {N, sh->row_count};
        const ferry_rpc_tensor *t;
        st = ferry__dist_output(dec->c, f->servers[s], &f->replies[s],
                                FERRY_WIRE_DECODER_LOGITS_FWD_LOGITS, want, &t);
        for (int64_t n = 0; st == FERRY_OK && n < N; n++) /* columns of logits (N, V) */
            memcpy(logits + n * V + sh->row_begin, (const float *)t->data + n * sh->row_count,
                   (size_t)sh->row_count * sizeof *logits);
    }
    fan_destroy(f);
    if (rec != NULL && st != FERRY_OK)
        ferry__dist_call_drop(dc, rec);
    else if (rec != NULL && call_id != NULL)
        *call_id = rec->call_id;
    return st;
}

ferry_status ferry_remote_logits_backward(ferry_remote *dec, ferry_dist_ctx *dc, uint64_t call_id,
                                          const float *dlogits, float *dh) {
    ferry__dist_call *rec;
    ferry_status st = backward_call(dec, dc, call_id, FERRY__DIST_LOGITS, "logits backward", &rec);
    if (st != FERRY_OK)
        return st;
    int64_t N = rec->n, V = dec->rows;
    fan *f = fan_create(dec, NULL);
    float *slices = malloc((size_t)(N * V + 1) * sizeof *slices); /* per shard (N, V_s) */
    st = f != NULL && slices != NULL ? FERRY_OK : FERRY_NOMEM();
    for (int s = 0; st == FERRY_OK && s < f->k; s++) {
        const ferry__dist_shard *sh = &dec->shards[s];
        float *dst = slices + N * sh->row_begin;
        for (int64_t n = 0; n < N; n++)
            memcpy(dst + n * sh->row_count, dlogits + n * V + sh->row_begin,
                   (size_t)sh->row_count * sizeof *dst);
        int64_t dim[2] = {N, sh->row_count};
        ferry_rpc_tensor t = ferry__dist_tensor(FERRY_WIRE_DECODER_LOGITS_BWD_DLOGITS, dim, dst);
        if ((st = ferry__dist_backward_head(&f->reqs[s], rec, dc->id,
                                            FERRY_WIRE_MODE_DECODER_LOGITS, NULL)) == FERRY_OK)
            st = ferry_rpc_msg_add(&f->reqs[s], &t);
    }
    st = backward_finish(dec, dc, rec, f, NULL, FERRY_WIRE_DECODER_LOGITS_BWD_DH, dh, st);
    free(slices); /* the requests borrowed it until they were sent */
    return st;
}

/* ---- linear ---- */

const ferry__dist_kind ferry__dist_kind_linear = {.wire = FERRY_WIRE_KIND_LINEAR};

ferry_status ferry_remote_linear_forward(ferry_remote *m, ferry_dist_ctx *dc, const float *x,
                                         int64_t N, float *y, uint64_t *call_id) {
    ferry_status st = ferry__dist_check(m, FERRY_REMOTE_LINEAR, "linear forward", dc, 0);
    if (st != FERRY_OK)
        return st;
    ferry__dist_call *rec;
    if ((st = record(dc, m, FERRY__DIST_LINEAR, N, &rec)) != FERRY_OK)
        return st;
    fan *f = fan_create(m, dc);
    int64_t dim[2] = {N, m->cols}, want[2] = {N, m->rows};
    ferry_rpc_tensor t = ferry__dist_tensor(FERRY_WIRE_LINEAR_FWD_X, dim, x);
    const ferry_rpc_tensor *out;
    st = f != NULL
             ? ferry__dist_forward_head(&f->reqs[0], m, dc != NULL ? dc->id : 0,
                                        rec != NULL ? rec->call_id : 0, FERRY_WIRE_MODE_LINEAR)
             : FERRY_NOMEM();
    if (st == FERRY_OK && (st = ferry_rpc_msg_add(&f->reqs[0], &t)) == FERRY_OK)
        st = ferry__dist_fanout(m->c, FERRY_RPC_FORWARD, 1, f->servers, f->reqs, 1, f->replies);
    if (st == FERRY_OK &&
        (st = ferry__dist_output(m->c, f->servers[0], &f->replies[0], FERRY_WIRE_LINEAR_FWD_Y, want,
                                 &out)) == FERRY_OK)
        memcpy(y, out->data, out->nbytes);
    fan_destroy(f);
    if (rec != NULL && st != FERRY_OK)
        ferry__dist_call_drop(dc, rec);
    else if (rec != NULL && call_id != NULL)
        *call_id = rec->call_id;
    return st;
}

ferry_status ferry_remote_linear_backward(ferry_remote *m, ferry_dist_ctx *dc, uint64_t call_id,
                                          const float *dy, float *dx) {
    ferry_status st = ferry__dist_check(m, FERRY_REMOTE_LINEAR, "linear backward", dc, 1);
    if (st != FERRY_OK)
        return st;
    ferry__dist_call *rec = ferry__dist_call_find(dc, m, call_id, FERRY__DIST_LINEAR);
    if (rec == NULL)
        return FERRY_ERR_NOT_FOUND;
    fan *f = fan_create(m, NULL);
    int64_t N = rec->n, dim[2] = {N, m->rows}, want[2] = {N, m->cols};
    ferry_rpc_tensor t = ferry__dist_tensor(FERRY_WIRE_LINEAR_BWD_DY, dim, dy);
    const ferry_rpc_tensor *out;
    st = f != NULL
             ? ferry__dist_backward_head(&f->reqs[0], rec, dc->id, FERRY_WIRE_MODE_LINEAR, NULL)
             : FERRY_NOMEM();
    if (st == FERRY_OK && (st = ferry_rpc_msg_add(&f->reqs[0], &t)) == FERRY_OK)
        st = ferry__dist_fanout(m->c, FERRY_RPC_BACKWARD, 1, f->servers, f->reqs, 1, f->replies);
    if (st == FERRY_OK &&
        (st = ferry__dist_output(m->c, f->servers[0], &f->replies[0], FERRY_WIRE_LINEAR_BWD_DX,
                                 want, &out)) == FERRY_OK)
        memcpy(dx, out->data, out->nbytes);
    fan_destroy(f);
    ferry__dist_call_drop(dc, rec);
    return st;
}
