/* calls.c - Forward and Backward of remote modules, fanned out to their shards
 * concurrently: the embedding sends each shard only the distinct ids it owns and
 * sums row gradients here before they travel back; the decoder's sharded softmax
 * combines per-row partials (max, sum of exp, target logit) into the exact
 * cross-entropy; the classic logits mode and the linear module move dense tensors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/dist/dist.h"
#include "ferry.pb-c.h"
#include "common/core/log.h"

/* ---- shared with decoder.c ---- */

int ferry__dist_reply_dtype(const ferry_cluster *c, ferry_rpc_msg *req) {
    int bf16 = c->cfg.wire_bf16 != 0;
    (void)ferry_rpc_msg_set_wire_dtype(req, bf16 ? FERRY_RPC_DTYPE_BF16 : FERRY_RPC_DTYPE_F32);
    return bf16 ? FERRY__V1__DTYPE__BF16 : FERRY__V1__DTYPE__F32;
}

ferry_status ferry__dist_check(const ferry_remote *m, ferry_remote_kind kind, const char *what,
                               const ferry_dist_ctx *dc, int need_ctx) {
    if (m->kind != kind)
        return ferry_errorf(FERRY_ERR_INVALID, "%s: module '%s' is of kind %s, not %s", what,
                            m->name, ferry_wire_kinds[m->kind].name, ferry_wire_kinds[kind].name);
    if (dc != NULL && dc->step_pending)
        return ferry_errorf(FERRY_ERR_BUSY,
                            "%s of '%s': a Step is in flight (ferry_dist_ctx_step_wait first)",
                            what, m->name);
    if ((dc != NULL && dc->id == 0) || (need_ctx && dc == NULL))
        return ferry_errorf(FERRY_ERR_INVALID,
                            "%s of '%s': no distributed context is open (ferry_dist_ctx_begin)",
                            what, m->name);
    return FERRY_OK;
}

ferry_status ferry__dist_forward_head(ferry_rpc_msg *req, const ferry_remote *m, uint64_t ctx,
                                      uint64_t call_id, ferry_wire_mode mode) {
    Ferry__V1__ForwardRequest q;
    ferry__v1__forward_request__init(&q);
    q.ctx_id = ctx;
    q.call_id = call_id;
    q.module = (char *)(uintptr_t)m->name;
    q.mode = (char *)(uintptr_t)ferry_wire_modes[mode].name;
    q.reply_dtype = (Ferry__V1__DType)ferry__dist_reply_dtype(m->c, req);
    q.wide = atomic_load(&((ferry_remote *)(uintptr_t)m)->wide) != 0;
    return ferry_rpc_msg_set_head(req, &q.base);
}

ferry_status ferry__dist_backward_head(ferry_rpc_msg *req, const ferry__dist_call *call,
                                       uint64_t ctx, ferry_wire_mode mode, double *scale) {
    Ferry__V1__BackwardRequest q;
    ferry__v1__backward_request__init(&q);
    q.ctx_id = ctx;
    q.call_id = call->call_id;
    q.module = (char *)(uintptr_t)call->m->name;
    q.reply_dtype = (Ferry__V1__DType)ferry__dist_reply_dtype(call->m->c, req);
    q.wide = atomic_load(&((ferry_remote *)(uintptr_t)call->m)->wide) != 0;
    (void)mode; /* the Forward's mode applies */
    Ferry__V1__DecoderBackwardArgs args;
    ferry__v1__decoder_backward_args__init(&args);
    if (scale != NULL) {
        args.loss_scale = *scale;
        q.args_case = FERRY__V1__BACKWARD_REQUEST__ARGS_DECODER;
        q.decoder = &args;
    }
    return ferry_rpc_msg_set_head(req, &q.base);
}

/* Initializes (or deinitializes) n messages of each array. */
static void msgs_init(ferry_rpc_msg *a, ferry_rpc_msg *b, int n) {
    for (int i = 0; i < n; i++) {
        ferry_rpc_msg_init(&a[i]);
        ferry_rpc_msg_init(&b[i]);
    }
}

static void msgs_deinit(ferry_rpc_msg *a, ferry_rpc_msg *b, int n) {
    for (int i = 0; i < n; i++) {
        ferry_rpc_msg_deinit(&a[i]);
        ferry_rpc_msg_deinit(&b[i]);
    }
}

/* ---- embedding ---- */

const ferry__dist_kind ferry__dist_kind_embedding = {.wire = FERRY_WIRE_KIND_EMBEDDING};

static int shard_of(const ferry_remote *m, int64_t row) {
    int lo = 0, hi = m->nshards - 1;
    while (lo < hi) { /* last shard whose first row is <= row */
        int mid = (lo + hi + 1) / 2;
        if (m->shards[mid].row_begin <= row)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Groups the distinct ids of ids (n) by owning shard, each group in first-seen
 * order: uniq (nuniq) global ids, count and offset (nshards) per shard, slot (n)
 * the position of ids[i] in uniq. */
static ferry_status group_ids(const ferry_remote *m, const int32_t *ids, int64_t n,
                              ferry__dist_call *rec, int32_t **uniq_out, int64_t *offset) {
    int64_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    int32_t *key = malloc((size_t)cap * sizeof *key);         /* hash: id, -1 = empty */
    int32_t *val = malloc((size_t)cap * sizeof *val);         /* hash: first-seen index */
    int32_t *first = malloc((size_t)(n + 1) * sizeof *first); /* first-seen distinct ids */
    int32_t *which = malloc((size_t)(n + 1) * sizeof *which); /* ids[i] -> first-seen index */
    int32_t *pos = malloc((size_t)(n + 1) * sizeof *pos);     /* first-seen -> grouped */
    int32_t *uniq = malloc((size_t)(n + 1) * sizeof *uniq);
    rec->shard_count = calloc((size_t)m->nshards, sizeof *rec->shard_count);
    rec->slot = malloc((size_t)(n + 1) * sizeof *rec->slot);
    ferry_status st = FERRY_OK;
    if (!key || !val || !first || !which || !pos || !uniq || !rec->shard_count || !rec->slot) {
        st = FERRY_NOMEM();
        goto done;
    }
    memset(key, 0xff, (size_t)cap * sizeof *key);
    int64_t U = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t h = ((uint64_t)(uint32_t)ids[i] * 0x9E3779B97F4A7C15ull) >> 20;
        int64_t k = (int64_t)(h & (uint64_t)(cap - 1));
        while (key[k] != -1 && key[k] != ids[i])
            k = (k + 1) & (cap - 1);
        if (key[k] == -1) {
            key[k] = ids[i];
            val[k] = (int32_t)U;
            first[U++] = ids[i];
        }
        which[i] = val[k];
    }
    for (int64_t u = 0; u < U; u++)
        rec->shard_count[shard_of(m, first[u])]++;
    offset[0] = 0;
    for (int s = 0; s < m->nshards; s++)
        offset[s + 1] = offset[s] + rec->shard_count[s];
    int64_t fill[FERRY_DIST_MAX_SERVERS];
    memcpy(fill, offset, (size_t)m->nshards * sizeof *fill);
    for (int64_t u = 0; u < U; u++) {
        pos[u] = (int32_t)fill[shard_of(m, first[u])]++;
        uniq[pos[u]] = first[u];
    }
    for (int64_t i = 0; i < n; i++)
        rec->slot[i] = pos[which[i]];
    rec->nuniq = U;
    rec->n = n;
    *uniq_out = uniq;
    uniq = NULL;
done:
    free(key);
    free(val);
    free(first);
    free(which);
    free(pos);
    free(uniq);
    return st;
}

ferry_status ferry_remote_embedding_forward(ferry_remote *m, ferry_dist_ctx *dc, const int32_t *ids,
                                            int64_t n, float *out, uint64_t *call_id) {
    ferry_status st = ferry__dist_check(m, FERRY_REMOTE_EMBEDDING, "embedding forward", dc, 0);
    if (st != FERRY_OK)
        return st;
    if (n < 0 || n > INT32_MAX)
        return ferry_errorf(FERRY_ERR_INVALID, "embedding '%s': %lld ids", m->name, (long long)n);
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= m->rows)
            return ferry_errorf(FERRY_ERR_RANGE, "embedding '%s': ids[%lld] = %d outside [0, %lld)",
                                m->name, (long long)i, ids[i], (long long)m->rows);
    }
    ferry__dist_call local, *rec = &local;
    memset(&local, 0, sizeof local);
    if (dc != NULL && (rec = ferry__dist_call_new(dc, m, FERRY__DIST_EMBEDDING)) == NULL)
        return FERRY_NOMEM();
    int32_t *uniq = NULL;
    float *rows = NULL;
    int64_t offset[FERRY_DIST_MAX_SERVERS + 1];
    int k = 0, servers[FERRY_DIST_MAX_SERVERS], shard[FERRY_DIST_MAX_SERVERS];
    ferry_rpc_msg reqs[FERRY_DIST_MAX_SERVERS], replies[FERRY_DIST_MAX_SERVERS];
    if ((st = group_ids(m, ids, n, rec, &uniq, offset)) != FERRY_OK)
        goto done;
    if ((rows = malloc((size_t)(rec->nuniq * m->cols + 1) * sizeof *rows)) == NULL) {
        st = FERRY_NOMEM();
        goto done;
    }
    /* In a context every shard is called, so that every shard's optimizer steps. */
    for (int s = 0; s < m->nshards; s++) {
        if (rec->shard_count[s] == 0 && dc == NULL)
            continue;
        shard[k] = s;
        servers[k] = m->shards[s].server;
        if (dc != NULL)
            ferry__dist_touch(dc, servers[k]);
        k++;
    }
    msgs_init(reqs, replies, k);
    for (int i = 0; i < k && st == FERRY_OK; i++) {
        int64_t dim[1] = {rec->shard_count[shard[i]]};
        ferry_rpc_tensor t =
            ferry__dist_tensor(FERRY_WIRE_EMBEDDING_FWD_IDS, dim, uniq + offset[shard[i]]);
        st =
            ferry__dist_forward_head(&reqs[i], m, dc != NULL ? dc->id : 0,
                                     dc != NULL ? rec->call_id : 0, FERRY_WIRE_MODE_EMBEDDING_ROWS);
        if (st == FERRY_OK)
            st = ferry_rpc_msg_add(&reqs[i], &t);
    }
    if (st == FERRY_OK)
        st = ferry__dist_fanout(m->c, FERRY_RPC_FORWARD, k, servers, reqs, 0, replies);
    for (int i = 0; i < k && st == FERRY_OK; i++) {
        int64_t want[2] = {rec->shard_count[shard[i]], m->cols};
        const ferry_rpc_tensor *t;
        st = ferry__dist_output(m->c, servers[i], &replies[i], FERRY_WIRE_EMBEDDING_FWD_ROWS, want,
                                &t);
        if (st == FERRY_OK && t->nbytes > 0)
            memcpy(rows + offset[shard[i]] * m->cols, t->data, t->nbytes);
    }
    for (int64_t i = 0; i < n && st == FERRY_OK; i++) /* out (n, E) */
        memcpy(out + i * m->cols, rows + (int64_t)rec->slot[i] * m->cols,
               (size_t)m->cols * sizeof *out);
    msgs_deinit(reqs, replies, k);
done:
    free(uniq);
    free(rows);
    if (dc == NULL || st != FERRY_OK) {
        if (dc != NULL)
            ferry__dist_call_drop(dc, rec);
        else {
            free(local.shard_count);
            free(local.slot);
        }
    } else if (call_id != NULL) {
        *call_id = rec->call_id;
    }
    return st;
}

ferry_status ferry_remote_embedding_backward(ferry_remote *m, ferry_dist_ctx *dc, uint64_t call_id,
                                             const float *grad) {
    ferry_status st = ferry__dist_check(m, FERRY_REMOTE_EMBEDDING, "embedding backward", dc, 1);
    if (st != FERRY_OK)
        return st;
    ferry__dist_call *rec = ferry__dist_call_find(dc, m, call_id, FERRY__DIST_EMBEDDING);
    if (rec == NULL)
        return FERRY_ERR_NOT_FOUND;
    int64_t E = m->cols, offset = 0;
    /* Sum each distinct row's gradient in the order of ids, as a local embedding's
     * backward accumulates it. acc (nuniq, E) */
    float *acc = calloc((size_t)(rec->nuniq * E + 1), sizeof *acc);
    if (acc == NULL)
        return FERRY_NOMEM();
    for (int64_t i = 0; i < rec->n; i++) {
        float *dst = acc + (int64_t)rec->slot[i] * E;
        const float *src = grad + i * E;
        for (int64_t e = 0; e < E; e++)
            dst[e] += src[e];
    }
    int k = 0, servers[FERRY_DIST_MAX_SERVERS];
    ferry_rpc_msg reqs[FERRY_DIST_MAX_SERVERS], replies[FERRY_DIST_MAX_SERVERS];
    msgs_init(reqs, replies, m->nshards);
    for (int s = 0; s < m->nshards && st == FERRY_OK; s++) {
        int64_t dim[2] = {rec->shard_count[s], E};
        const float *g = acc + offset * E;
        offset += rec->shard_count[s];
        if (dim[0] == 0)
            continue; /* nothing to send: the shard keeps no gradient for this call */
        ferry_rpc_tensor t = ferry__dist_tensor(FERRY_WIRE_EMBEDDING_BWD_GRAD, dim, g);
        servers[k] = m->shards[s].server;
        st = ferry__dist_backward_head(&reqs[k], rec, dc->id, FERRY_WIRE_MODE_EMBEDDING_ROWS, NULL);
        if (st == FERRY_OK)
            st = ferry_rpc_msg_add(&reqs[k], &t);
        k++;
    }
    if (st == FERRY_OK)
        st = ferry__dist_fanout(m->c, FERRY_RPC_BACKWARD, k, servers, reqs, 0, replies);
    msgs_deinit(reqs, replies, m->nshards);
    free(acc);
    ferry__dist_call_drop(dc, rec);
    return st;
}

/* ---- dense: pull the rows, push their gradient ---- */

const ferry__dist_kind ferry__dist_kind_dense = {.wire = FERRY_WIRE_KIND_DENSE};

/* The bf16 pull's reply of shard s: "image" [id, base] says whether "weight" is the
 * shard's image (base 0) or a delta to the image this client holds (base). The rows
 * land in the client's image, then in out. */
static ferry_status dense_image_apply(ferry_remote *m, int s, const ferry_rpc_msg *reply,
                                      const ferry_rpc_tensor *t, float *out) {
    const ferry_rpc_tensor *ids = ferry_rpc_msg_find(reply, "image");
    int64_t n = m->shards[s].row_count * m->cols;
    float *rows = m->image + m->shards[s].row_begin * m->cols;
    uint64_t id = 0, base = 0;
    if (ids != NULL && (ids->dtype != FERRY_RPC_DTYPE_I64 || ids->ndim != 1 || ids->dim[0] != 2))
        return ferry_errorf(FERRY_ERR_FORMAT, "%s: dense pull of '%s': a bad \"image\" tensor",
                            ferry_rpc_client_target(m->c->clients[m->shards[s].server]), m->name);
    if (ids != NULL) {
        memcpy(&id, ids->data, sizeof id);
        memcpy(&base, (const uint8_t *)ids->data + sizeof id, sizeof base);
    }
    if (base != 0 && base != m->image_id[s]) {
        uint64_t held = m->image_id[s];
        m->image_id[s] = 0; /* the next pull asks for the whole image */
        return ferry_errorf(FERRY_ERR_FORMAT,
                            "%s: dense pull of '%s': a delta to image %016llx, this client holds "
                            "%016llx",
                            ferry_rpc_client_target(m->c->clients[m->shards[s].server]), m->name,
                            (unsigned long long)base, (unsigned long long)held);
    }
    const float *w = t->data;
    if (base == 0)
        memcpy(rows, w, (size_t)n * sizeof *rows);
    else if (id != base)
        for (int64_t i = 0; i < n; i++)
            rows[i] += w[i];
    m->image_id[s] = id;
    memcpy(out + m->shards[s].row_begin * m->cols, rows, (size_t)n * sizeof *out);
    return FERRY_OK;
}

ferry_status ferry_remote_dense_pull(ferry_remote *m, ferry_dist_ctx *dc, float *out,
                                     uint64_t *call_id) {
    ferry_status st = ferry__dist_check(m, FERRY_REMOTE_DENSE, "dense pull", dc, 0);
    if (st != FERRY_OK)
        return st;
    int bf16 = m->c->cfg.wire_bf16 != 0;
    if (bf16 && m->image == NULL) {
        m->image = malloc((size_t)(m->rows * m->cols) * sizeof *m->image);
        m->image_id = calloc((size_t)m->nshards, sizeof *m->image_id);
        if (m->image == NULL || m->image_id == NULL) {
            free(m->image);
            free(m->image_id);
            m->image = NULL;
            m->image_id = NULL;
            return FERRY_NOMEM();
        }
    }
    ferry__dist_call *rec = NULL;
    if (dc != NULL && (rec = ferry__dist_call_new(dc, m, FERRY__DIST_DENSE)) == NULL)
        return FERRY_NOMEM();
    int servers[FERRY_DIST_MAX_SERVERS];
    ferry_rpc_msg reqs[FERRY_DIST_MAX_SERVERS], replies[FERRY_DIST_MAX_SERVERS];
    msgs_init(reqs, replies, m->nshards);
    for (int s = 0; s < m->nshards && st == FERRY_OK; s++) {
        servers[s] = m->shards[s].server;
        if (dc != NULL)
            ferry__dist_touch(dc, servers[s]);
        st = ferry__dist_forward_head(&reqs[s], m, dc != NULL ? dc->id : 0,
                                      rec != NULL ? rec->call_id : 0, FERRY_WIRE_MODE_DENSE_PULL);
        if (st == FERRY_OK && bf16 && m->image_id[s] != 0) {
            int64_t dim[1] = {1};
            ferry_rpc_tensor t =
                ferry__dist_tensor(FERRY_WIRE_DENSE_FWD_HELD, dim, &m->image_id[s]);
            st = ferry_rpc_msg_add(&reqs[s], &t);
        }
    }
    /* f32: each shard's rows land in out straight from the transport's buffers */
    for (int s = 0; s < m->nshards && !bf16; s++)
        ferry_rpc_msg_land(&replies[s], ferry_wire_tensors[FERRY_WIRE_DENSE_FWD_WEIGHT].name,
                           out + m->shards[s].row_begin * m->cols,
                           (size_t)(m->shards[s].row_count * m->cols) * sizeof *out);
    if (st == FERRY_OK)
        st = ferry__dist_fanout(m->c, FERRY_RPC_FORWARD, m->nshards, servers, reqs, 0, replies);
    for (int s = 0; s < m->nshards && st == FERRY_OK; s++) {
        int64_t want[2] = {m->shards[s].row_count, m->cols};
        float *rows = out + m->shards[s].row_begin * m->cols;
        const ferry_rpc_tensor *t;
        st = ferry__dist_output(m->c, servers[s], &replies[s], FERRY_WIRE_DENSE_FWD_WEIGHT, want,
                                &t);
        if (st == FERRY_OK && bf16)
            st = dense_image_apply(m, s, &replies[s], t, out);
        else if (st == FERRY_OK && t->nbytes > 0 && t->data != rows)
            memcpy(rows, t->data, t->nbytes);
    }
    msgs_deinit(reqs, replies, m->nshards);
    if (rec != NULL && st != FERRY_OK)
        ferry__dist_call_drop(dc, rec);
    else if (rec != NULL && call_id != NULL)
        *call_id = rec->call_id;
    return st;
}

ferry_status ferry_remote_dense_push(ferry_remote *m, ferry_dist_ctx *dc, uint64_t call_id,
                                     const float *grad) {
    ferry_status st = ferry__dist_check(m, FERRY_REMOTE_DENSE, "dense push", dc, 1);
    if (st != FERRY_OK)
        return st;
    ferry__dist_call *rec = ferry__dist_call_find(dc, m, call_id, FERRY__DIST_DENSE);
    if (rec == NULL)
        return FERRY_ERR_NOT_FOUND;
    int servers[FERRY_DIST_MAX_SERVERS];
    ferry_rpc_msg reqs[FERRY_DIST_MAX_SERVERS], replies[FERRY_DIST_MAX_SERVERS];
    msgs_init(reqs, replies, m->nshards);
    for (int s = 0; s < m->nshards && st == FERRY_OK; s++) {
        int64_t dim[2] = {m->shards[s].row_count, m->cols};
        ferry_rpc_tensor t = ferry__dist_tensor(FERRY_WIRE_DENSE_BWD_GRAD, dim,
                                                grad + m->shards[s].row_begin * m->cols);
        servers[s] = m->shards[s].server;
        st = ferry__dist_backward_head(&reqs[s], rec, dc->id, FERRY_WIRE_MODE_DENSE_PULL, NULL);
        if (st == FERRY_OK)
            st = ferry_rpc_msg_add(&reqs[s], &t);
    }
    if (st == FERRY_OK)
        st = ferry__dist_fanout(m->c, FERRY_RPC_BACKWARD, m->nshards, servers, reqs, 0, replies);
    msgs_deinit(reqs, replies, m->nshards);
    ferry__dist_call_drop(dc, rec);
    return st;
}
