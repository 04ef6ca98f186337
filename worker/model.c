/* model.c - assembles the language model from nn layers (and, when distributed,
 * remote modules on ferry-ps), runs BPTT windows through it on an autograd context,
 * and performs the training step: backward across processes, Stiefel penalty,
 * global-norm clipping and the local and remote optimizer steps. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/tensor/backend.h"
#include "ferry/ferry.h"
#include "common/core/log.h"
#include "worker/model-impl.h"
#include "ferry/optim.h"
#include "optim/stiefel.h"

/* ---- construction ---- */

/* Declares the full local layout into P: encoder, LSTM, decoder, in this order.
 * A distributed model builds it too (without allocating) to learn the offsets
 * its parameters have in the local layout, from which their initial values come. */
static ferry_status lm_declare_full(ferry_lm *lm, ferry_params *P) {
    const ferry_lm_config *cfg = &lm->cfg;
    ferry_status st;
    if ((st = ferry_embedding_init(&lm->emb, P, "encoder", cfg->V, cfg->E)) != FERRY_OK)
        return st;
    if ((st = ferry_lstm_init(&lm->rnn, P, "lstm", cfg->E, cfg->H, cfg->L, cfg->dropout)) !=
        FERRY_OK)
        return st;
    return ferry_linear_init(&lm->dec, P, "decoder", cfg->H, cfg->V, 1);
}

/* ---- model parallelism: the stack's layers in groups ---- */

/* "local:2,ps0:1,ps1:1" -> groups; every layer once, in order. */
static ferry_status parse_stages(ferry_lm *lm, const char *spec, int nservers) {
    int L = lm->cfg.L, next = 0;
    lm->ngroups = 0;
    if (spec == NULL || spec[0] == '\0') {
        lm->groups[0] = (ferry_lm_group){.first = 0, .count = L, .server = -1};
        lm->ngroups = 1;
        return FERRY_OK;
    }
    char buf[256];
    if (strlen(spec) >= sizeof buf)
        return ferry_errorf(FERRY_ERR_INVALID, "--stages '%.40s...' is too long", spec);
    memcpy(buf, spec, strlen(spec) + 1);
    for (char *save = NULL, *it = strtok_r(buf, ",", &save); it != NULL;
         it = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(it, ':'), *end;
        if (colon == NULL)
            return ferry_errorf(FERRY_ERR_INVALID, "--stages: '%s' is not WHERE:LAYERS "
                                "(e.g. ps0:2,local:1)", it);
        *colon = '\0';
        long k = strtol(colon + 1, &end, 10);
        int server = -1;
        if (strcmp(it, "local") != 0) {
            char *e2;
            long sv = strncmp(it, "ps", 2) == 0 ? strtol(it + 2, &e2, 10) : -1;
            if (sv < 0 || it[2] == '\0' || *e2 != '\0')
                return ferry_errorf(FERRY_ERR_INVALID, "--stages: '%s' is neither 'local' nor "
                                    "psI (a server of --ps, from ps0)", it);
            if (sv >= nservers)
                return ferry_errorf(FERRY_ERR_INVALID, "--stages: ps%ld, but --ps names %d "
                                    "server%s", sv, nservers, nservers == 1 ? "" : "s");
            server = (int)sv;
        }
        if (*end != '\0' || k < 1 || k > L - next)
            return ferry_errorf(FERRY_ERR_INVALID, "--stages: %s:%s — %d of the %d layers are "
                                "left for it", it, colon + 1, L - next, L);
        if (lm->ngroups == FERRY_NODE_MAX_IO)
            return ferry_errorf(FERRY_ERR_INVALID, "--stages: at most %d groups",
                                FERRY_NODE_MAX_IO);
        lm->groups[lm->ngroups++] = (ferry_lm_group){.first = next, .count = (int)k,
                                                     .server = server};
        next += (int)k;
    }
    if (next != L)
        return ferry_errorf(FERRY_ERR_INVALID, "--stages places %d of the %d layers (--nlayers)",
                            next, L);
    return FERRY_OK;
}

ferry_status ferry_lm_check_stages(const char *spec, int nlayers, int nservers) {
    ferry_lm *lm = calloc(1, sizeof *lm);
    if (lm == NULL)
        return ferry_errorf(FERRY_ERR_NOMEM, "out of memory checking --stages");
    lm->cfg.L = nlayers;
    ferry_status st = parse_stages(lm, spec, nservers);
    free(lm);
    return st;
}

static int lm_all_local(const ferry_lm *lm) {
    return lm->ngroups == 1 && lm->groups[0].server < 0;
}

/* Rows [first, first + count) of t (L, B, H) as a tensor of ctx, and a node that
 * hands the gradient back to those rows. */
typedef struct rows_node {
    int64_t first, count, BH;
} rows_node;

static ferry_status slice_backward(ferry_ctx *ctx, void *saved, ferry_tensor *const *grad_out,
                                   ferry_tensor **grad_in) {
    rows_node *r = saved;
    if (grad_in[0] == NULL || grad_out[0] == NULL)
        return FERRY_OK;
    return ferry_backend_axpy(ferry_ctx_backend(ctx), r->count * r->BH, 1.0f,
                              ferry_tensor_f32(grad_out[0]),
                              ferry_tensor_f32(grad_in[0]) + r->first * r->BH);
}

static ferry_status rows_of(ferry_ctx *ctx, const ferry_tensor *t, int first, int count,
                            ferry_tensor **out) {
    int64_t BH = t->shape.dim[1] * t->shape.dim[2];
    ferry_status st = ferry_ctx_tensor(
        ctx, FERRY_DTYPE_F32, ferry_shape_3d(count, t->shape.dim[1], t->shape.dim[2]), out);
    if (st == FERRY_OK)
        st = ferry_backend_copy(ferry_ctx_backend(ctx), (*out)->data,
                                ferry_tensor_f32(t) + first * BH,
                                (size_t)(count * BH) * sizeof(float), FERRY_COPY_DEVICE_TO_DEVICE);
    if (st != FERRY_OK || !ferry_ctx_training(ctx))
        return st;
    rows_node *r = ferry_ctx_host_alloc(ctx, sizeof *r);
    if (r == NULL)
        return FERRY_NOMEM();
    *r = (rows_node){first, count, BH};
    ferry_tensor *in = (ferry_tensor *)(uintptr_t)t;
    return ferry_ctx_record(ctx, slice_backward, r, 1, &in, 1, out);
}

/* The groups' final states (count_g, B, H) stacked into (L, B, H). */
typedef struct stack_node {
    int n;
    int64_t rows[FERRY_NODE_MAX_IO], BH;
} stack_node;

static ferry_status stack_backward(ferry_ctx *ctx, void *saved, ferry_tensor *const *grad_out,
                                   ferry_tensor **grad_in) {
    stack_node *k = saved;
    ferry_status st = FERRY_OK;
    for (int i = 0, at = 0; i < k->n && st == FERRY_OK; at += (int)k->rows[i], i++) {
        if (grad_in[i] != NULL)
            st = ferry_backend_axpy(ferry_ctx_backend(ctx), k->rows[i] * k->BH, 1.0f,
                                    ferry_tensor_f32(grad_out[0]) + at * k->BH,
                                    ferry_tensor_f32(grad_in[i]));
    }
    return st;
}

static ferry_status stack_rows(ferry_ctx *ctx, int n, ferry_tensor *const *parts, int64_t L,
                               ferry_tensor **out) {
    int64_t B = parts[0]->shape.dim[1], H = parts[0]->shape.dim[2], BH = B * H;
    ferry_status st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, ferry_shape_3d(L, B, H), out);
    stack_node *k = ferry_ctx_host_alloc(ctx, sizeof *k);
    if (st == FERRY_OK && k == NULL)
        st = FERRY_NOMEM();
    for (int i = 0, at = 0; i < n && st == FERRY_OK; at += (int)parts[i]->shape.dim[0], i++) {
        k->rows[i] = parts[i]->shape.dim[0];
        st = ferry_backend_copy(ferry_ctx_backend(ctx), ferry_tensor_f32(*out) + at * BH,
                                parts[i]->data, ferry_tensor_nbytes(parts[i]),
                                FERRY_COPY_DEVICE_TO_DEVICE);
    }
    if (st != FERRY_OK || !ferry_ctx_training(ctx))
        return st;
    k->n = n;
    k->BH = BH;
    return ferry_ctx_record(ctx, stack_backward, k, n, parts, 1, out);
}

ferry_status ferry_lm_stack_forward(ferry_lm *lm, ferry_ctx *ctx, ferry_dist_ctx *dc,
                                    const ferry_tensor *x, const ferry_tensor *h_in,
                                    const ferry_tensor *c_in, int flags, ferry_tensor **y,
                                    ferry_tensor **hn, ferry_tensor **cn) {
    int carry = (flags & FERRY_LM_CARRY) != 0;
    if (lm_all_local(lm)) /* the plain stack, exactly as before groups */
        return ferry_lstm_forward(&lm->groups[0].rnn, ctx, x, h_in, c_in, NULL, y, hn, cn);
    float p = ferry_ctx_training(ctx) ? lm->cfg.dropout : 0.0f;
    uint64_t stream = lm->stream + (ferry_ctx_training(ctx) ? 0 : 1);
    ferry_tensor *hs[FERRY_NODE_MAX_IO], *cs[FERRY_NODE_MAX_IO];
    const ferry_tensor *in = x;
    ferry_status st = FERRY_OK;
    for (int g = 0; g < lm->ngroups && st == FERRY_OK; g++) {
        ferry_lm_group *G = &lm->groups[g];
        ferry_tensor *h0 = NULL, *c0 = NULL, *out;
        /* A remote group whose server holds this very state starts from it there. */
        int from_stream = G->server >= 0 && (flags & FERRY_LM_CARRIED) && lm->synced == stream;
        if (!from_stream &&
            ((st = rows_of(ctx, h_in, G->first, G->count, &h0)) != FERRY_OK ||
             (st = rows_of(ctx, c_in, G->first, G->count, &c0)) != FERRY_OK))
            break;
        if (G->server < 0)
            st = ferry_lstm_forward(&G->rnn, ctx, in, h0, c0, NULL, &out, &hs[g], &cs[g]);
        else
            st = ferry_dist_lstm_forward(G->remote, dc, ctx, stream,
                                         carry ? FERRY_DIST_LSTM_CARRY : 0, in, h0, c0, &out,
                                         &hs[g], &cs[g]);
        if (st == FERRY_OK && g + 1 < lm->ngroups) /* the last layer's dropout is the model's */
            st = ferry_dropout_forward(ctx, p, out, &out);
        in = out;
    }
    if (st != FERRY_OK)
        return st;
    *y = (ferry_tensor *)(uintptr_t)in;
    if ((st = stack_rows(ctx, lm->ngroups, hs, lm->cfg.L, hn)) != FERRY_OK)
        return st;
    if (carry)
        lm->synced = stream;
    return stack_rows(ctx, lm->ngroups, cs, lm->cfg.L, cn);
}

/* Replaces a constrained weight_hh by its orthogonal polar factor, as cdopt does
 * at initialisation (the penalty then starts at zero and A(W) = W). */
static ferry_status lm_polar_init(ferry_lm *lm, int idx) {
    const ferry_param *p = &lm->P.items[idx];
    size_t nbytes = (size_t)p->numel * sizeof(float);
    float *host = malloc(nbytes);
    if (host == NULL)
        return FERRY_NOMEM();
    float *W = ferry_params_data(&lm->P, idx);
    ferry_status st = ferry_backend_copy(lm->be, host, W, nbytes, FERRY_COPY_DEVICE_TO_HOST);
    if (st == FERRY_OK)
        st = ferry_stiefel_polar(p->shape.dim[0], p->shape.dim[1], host);
    if (st == FERRY_OK)
        st = ferry_backend_copy(lm->be, W, host, nbytes, FERRY_COPY_HOST_TO_DEVICE);
    free(host);
    return st;
}

/* Every parameter of P drawn as its namesake in the full layout is. */
static ferry_status init_at_full(ferry_params *P, const ferry_params *full,
                                 const ferry_lm_config *cfg) {
    ferry_status st = FERRY_OK;
    for (int i = 0; i < P->count && st == FERRY_OK; i++) {
        int j = ferry_params_find(full, P->items[i].name);
        FERRY_ASSERT(j >= 0 && P->items[i].numel <= full->items[j].numel);
        /* A smaller namesake is the full one's last rows (the decoder's local slice). */
        int64_t at = full->items[j].offset + full->items[j].numel - P->items[i].numel;
        st = ferry_params_init_uniform_at(P, i, cfg->init_scale, cfg->seed, at);
    }
    return st;
}

/* Uniform init of every local parameter at its offset in the full layout, the
 * Stiefel constraint and its polar initialisation. */
static ferry_status lm_init_local(ferry_lm *lm, const ferry_params *full) {
    const ferry_lm_config *cfg = &lm->cfg;
    ferry_status st = init_at_full(&lm->P, full, cfg);
    for (int g = 0; g < lm->ngroups && st == FERRY_OK && cfg->stiefel_beta > 0.0f; g++) {
        for (int l = 0; l < lm->groups[g].count && st == FERRY_OK && lm->groups[g].server < 0; l++)
            st = lm_polar_init(lm, lm->groups[g].rnn.w_hh[l]);
    }
    return st;
}

/* The prefix of this model's module names: the job's name, else --model, else none. */
static const char *lm_prefix(const ferry_lm_placement *pl) {
    if (pl->job != NULL)
        return ferry_job_get_config(pl->job)->name;
    return pl->model != NULL ? pl->model : "";
}

/* A remote group: its lstm module on its server, starting from the values its
 * layers have in the whole model (drawn at their offsets in the full layout, the
 * constrained weight_hh at their polar factor), sent as its packed block. */
static ferry_status lm_create_group(ferry_lm *lm, ferry_lm_group *G, const ferry_params *full,
                                    const ferry_lm_placement *pl) {
    const ferry_lm_config *cfg = &lm->cfg;
    /* The group's layout in a host block of its own: its initial values now, later
     * a place to read its weights back into (ferry_lm_feasibility). */
    ferry_params_init(&G->view, ferry_backend_cpu());
    int64_t C = G->first == 0 ? cfg->E : cfg->H;
    ferry_status st = ferry_lstm_init_from(&G->rnn, &G->view, "lstm", C, cfg->H, G->count,
                                           cfg->dropout, G->first);
    if (st == FERRY_OK && (st = ferry_params_alloc(&G->view)) == FERRY_OK)
        st = init_at_full(&G->view, full, cfg);
    for (int l = 0; l < G->count && st == FERRY_OK && cfg->stiefel_beta > 0.0f; l++) {
        const ferry_param *p = &G->view.items[G->rnn.w_hh[l]];
        st = ferry_stiefel_polar(p->shape.dim[0], p->shape.dim[1], G->view.data + p->offset);
    }
    if (st != FERRY_OK)
        return st;
    char name[FERRY_PARAM_NAME_MAX];
    const char *prefix = lm_prefix(pl);
    (void)snprintf(name, sizeof name, "%s%slstm_l%d-%d", prefix, prefix[0] != '\0' ? "/" : "",
                   G->first, G->first + G->count - 1);
    ferry_remote_config rc;
    ferry_remote_config_default(&rc, FERRY_REMOTE_LSTM, name, C, cfg->H);
    rc.server = G->server;
    rc.layers = G->count;
    rc.first_layer = G->first;
    rc.dropout = cfg->dropout;
    rc.optim = pl->optim;
    rc.init_weight = G->view.data;
    if (cfg->stiefel_beta > 0.0f) {
        rc.constraint.kind = FERRY_REMOTE_CONSTRAINT_STIEFEL;
        rc.constraint.beta = cfg->stiefel_beta;
    }
    return ferry_remote_create(pl->cluster, &rc, &G->remote);
}

/* A dense module "<job>/<suffix>" of P[begin, end), rows split over the servers,
 * starting from the stage's copy of those values. */
static ferry_status lm_create_block(ferry_lm *lm, const ferry_lm_placement *pl, const char *suffix,
                                    int64_t begin, int64_t end, ferry_remote **out) {
    ferry_remote_config rc;
    char name[FERRY_PARAM_NAME_MAX];
    (void)snprintf(name, sizeof name, "%s/%s", ferry_job_get_config(pl->job)->name, suffix);
    ferry_remote_config_default(&rc, FERRY_REMOTE_DENSE, name, end - begin, 1);
    rc.bias = 0;
    rc.optim = pl->optim;
    rc.init_weight = lm->stage + begin;
    return ferry_remote_create(pl->cluster, &rc, out);
}

/* The job's dense modules: "lstm", the local block up to the decoder slice (alignment
 * padding too, so pulls and pushes are one copy), and with a slice (--local-vocab)
 * "dec-slice", its rows in P after the LSTM's: a block of its own so that a step pulls
 * it while the LSTM runs and pushes it while the LSTM's backward does. Rank 0 sends
 * the initial values (polar-initialised where constrained); the others must find
 * them. */
static ferry_status lm_create_dense(ferry_lm *lm, const ferry_lm_placement *pl) {
    lm->split = lm->local_vocab > 0 ? lm->P.items[lm->dec_w].offset : lm->P.numel;
    ferry_status st = FERRY_OK;
    if ((lm->stage = malloc((size_t)lm->P.numel * sizeof(float))) == NULL)
        return FERRY_NOMEM();
    if ((st = ferry_backend_copy(lm->be, lm->stage, lm->P.data, (size_t)lm->P.numel * sizeof(float),
                                 FERRY_COPY_DEVICE_TO_HOST)) != FERRY_OK ||
        (st = lm_create_block(lm, pl, "lstm", 0, lm->split, &lm->dense_remote)) != FERRY_OK ||
        lm->split == lm->P.numel)
        return st;
    /* With replicated shards a context's calls are logged as each returns, to replay
     * on a backup if the primary dies: a call on another thread could return unlogged
     * when the main thread fails over, so there the blocks move in turn. */
    lm->slice_overlap = ferry_cluster_replicas(pl->cluster, 0, NULL) <= 1;
    return lm_create_block(lm, pl, "dec-slice", lm->split, lm->P.numel, &lm->slice_remote);
}

/* Hands the decoder module the trainer's slice of it (--local-vocab): its rows in P
 * and where its gradient goes (NULL until a training step gives the step's block). */
static ferry_status lm_attach_slice(ferry_lm *lm, float *gw, float *gb) {
    return ferry_remote_decoder_set_local(lm->dec_remote, lm->be,
                                          ferry_params_data(&lm->P, lm->dec_w),
                                          ferry_params_data(&lm->P, lm->dec_b), gw, gb);
}

/* A new run must have made every shard of its modules: one that ferry-ps already held
 * carries an earlier run's parameters, and training them is a decision. */
static ferry_status lm_check_fresh(const ferry_lm *lm, const ferry_lm_placement *pl) {
    const ferry_remote *mods[4 + FERRY_LSTM_MAX_LAYERS];
    int n = 0;
    mods[n++] = lm->emb_remote;
    mods[n++] = lm->dec_remote;
    mods[n++] = lm->dense_remote;
    mods[n++] = lm->slice_remote;
    for (int g = 0; g < lm->ngroups; g++)
        mods[n++] = lm->groups[g].remote;
    for (int i = 0; i < n; i++) {
        const ferry_remote *m = mods[i];
        if (m == NULL || ferry_remote_created(m) == ferry_remote_shards(m))
            continue;
        const char *prefix = lm_prefix(pl);
        if (pl->job != NULL)
            return ferry_errorf(FERRY_ERR_EXISTS,
                                "ferry-ps already holds '%s' of job '%s' (an earlier run's "
                                "parameters): --load DIR continues a saved run, --continue "
                                "trains from what the servers hold, `ferry-ctl drop-job %s` "
                                "starts the job over, or name another --job",
                                ferry_remote_name(m), prefix, prefix);
        return ferry_errorf(FERRY_ERR_EXISTS,
                            "ferry-ps already holds '%s' (an earlier run's parameters): "
                            "--continue trains from what the servers hold, `ferry-ctl drop %s` "
                            "starts over, or give this model its own --model NAME",
                            ferry_remote_name(m), ferry_remote_name(m));
    }
    return FERRY_OK;
}

static ferry_status lm_create_remote(ferry_lm *lm, const ferry_params *full,
                                     const ferry_lm_placement *pl) {
    const ferry_lm_config *cfg = &lm->cfg;
    ferry_remote_config rc;
    ferry_status st;
    int maker = pl->job == NULL || ferry_job_makes_modules(pl->job);
    if (!maker && !pl->resume && (st = ferry_job_wait_ready(pl->job)) != FERRY_OK)
        return st; /* rank 0 makes the modules; the others find them (same config) */
    /* A job's modules are its own: "<job>/encoder", so jobs sharing servers never
     * share parameters. */
    char enc[FERRY_PARAM_NAME_MAX] = "encoder", dec[FERRY_PARAM_NAME_MAX] = "decoder";
    const char *prefix = lm_prefix(pl);
    if (prefix[0] != '\0') {
        (void)snprintf(enc, sizeof enc, "%s/encoder", prefix);
        (void)snprintf(dec, sizeof dec, "%s/decoder", prefix);
    }
    ferry_remote_config_default(&rc, FERRY_REMOTE_EMBEDDING, enc, cfg->V, cfg->E);
    rc.init_seed = cfg->seed;
    rc.init_scale = cfg->init_scale;
    rc.weight_offset = full->items[ferry_params_find(full, "encoder.weight")].offset;
    rc.optim = pl->optim;
    if ((st = ferry_remote_create(pl->cluster, &rc, &lm->emb_remote)) != FERRY_OK)
        return st;
    ferry_remote_config_default(&rc, FERRY_REMOTE_DECODER, dec, cfg->V, cfg->H);
    rc.init_seed = cfg->seed;
    rc.init_scale = cfg->init_scale;
    rc.weight_offset = full->items[ferry_params_find(full, "decoder.weight")].offset;
    rc.bias_offset = full->items[ferry_params_find(full, "decoder.bias")].offset;
    rc.optim = pl->optim;
    rc.local_rows = lm->local_vocab;
    if ((st = ferry_remote_create(pl->cluster, &rc, &lm->dec_remote)) != FERRY_OK)
        return st;
    if (lm->local_vocab > 0 && (st = lm_attach_slice(lm, NULL, NULL)) != FERRY_OK)
        return st;
    for (int g = 0; g < lm->ngroups; g++) {
        if (lm->groups[g].server >= 0 &&
            (st = lm_create_group(lm, &lm->groups[g], full, pl)) != FERRY_OK)
            return st;
    }
    if (pl->job == NULL)
        return maker && pl->fresh ? lm_check_fresh(lm, pl) : FERRY_OK;
    lm->job = pl->job;
    if ((st = lm_create_dense(lm, pl)) != FERRY_OK)
        return st;
    if (maker && pl->fresh && !pl->resume && (st = lm_check_fresh(lm, pl)) != FERRY_OK)
        return st;
    if (pl->resume)
        return FERRY_OK; /* the roll-back sets the values; the trainer pulls then */
    if (maker)
        return ferry_job_ready(pl->job);
    return ferry_lm_pull_dense(lm); /* start from the job's weights */
}

/* The job's weights into P: straight from the transport where P is host memory,
 * through the stage where it is a device's; the LSTM's block, and the slice's too
 * unless slice_call is NULL (the step pulls that one on the slice's thread). A
 * failed pull may leave P partly written; every step pulls again before it
 * computes. */
static ferry_status lm_pull(ferry_lm *lm, ferry_dist_ctx *dc, uint64_t *call,
                            uint64_t *slice_call) {
    ferry_status st;
    if (ferry_backend_is_host(lm->be)) {
        st = ferry_remote_dense_pull(lm->dense_remote, dc, lm->P.data, call);
        if (st == FERRY_OK && lm->slice_remote != NULL && slice_call != NULL)
            st = ferry_remote_dense_pull(lm->slice_remote, dc, lm->P.data + lm->split, slice_call);
        return st;
    }
    /* A decoder slice needs the host backend: the block is the LSTM's alone. */
    st = ferry_remote_dense_pull(lm->dense_remote, dc, lm->stage, call);
    if (st == FERRY_OK)
        st = ferry_backend_copy(lm->be, lm->P.data, lm->stage, (size_t)lm->P.numel * sizeof(float),
                                FERRY_COPY_HOST_TO_DEVICE);
    return st;
}

ferry_status ferry_lm_pull_dense(ferry_lm *lm) {
    uint64_t call = 0, slice_call = 0;
    return lm->dense_remote != NULL ? lm_pull(lm, NULL, &call, &slice_call) : FERRY_OK;
}

/* ---- the slice's overlap ----
 * In a data-parallel step with a decoder slice (lm->slice_remote), the slice's block
 * (most of what a rank moves with --local-vocab) is pulled on a thread while the
 * LSTM's forward runs, and its gradient pushed on one while the LSTM's backward runs:
 * - ferry_lm_forward starts the pull once the embedding's Forward returned and joins
 *   it before the decoder's, so every server sees the step's modules in the same
 *   order (the LSTM's block, the embedding, the slice, the decoder) and sums their
 *   gradients' norms in that order, run after run;
 * - a tape node recorded before the decoder runs right after the decoder's backward,
 *   which has then written the slice's whole gradient, and starts its push;
 * - lm_job_step joins the push once it pushed the LSTM's block, before GradNorm; a
 *   failed step joins whatever is out (ferry_lm_train_step).
 */
static void *slice_run(void *arg) {
    ferry_lm *lm = arg;
    ferry_lm_slice_io *io = &lm->slice;
    if (io->grad == NULL)
        io->st =
            ferry_remote_dense_pull(lm->slice_remote, io->dc, lm->P.data + lm->split, &io->call);
    else
        io->st = ferry_remote_dense_push(lm->slice_remote, io->dc, io->call, io->grad);
    if (io->st != FERRY_OK)
        (void)snprintf(io->err, sizeof io->err, "%s", ferry_error_last());
    return NULL;
}

/* Starts the slice's pull (grad NULL) or the push of grad; inline if no thread. */
static void slice_start(ferry_lm *lm, const float *grad) {
    ferry_lm_slice_io *io = &lm->slice;
    FERRY_ASSERT(!io->started);
    io->grad = grad;
    io->st = FERRY_OK;
    io->started = 1;
    io->running = pthread_create(&io->thread, NULL, slice_run, lm) == 0;
    if (!io->running)
        (void)slice_run(lm);
}

/* Waits for the slice's transfer, if one is out, and returns its outcome. */
static ferry_status slice_join(ferry_lm *lm) {
    ferry_lm_slice_io *io = &lm->slice;
    if (!io->started)
        return FERRY_OK;
    double t0 = ferry_now();
    if (io->running)
        (void)pthread_join(io->thread, NULL);
    io->wait_s += ferry_now() - t0;
    io->started = io->running = 0;
    return io->st == FERRY_OK ? FERRY_OK : ferry_errorf(io->st, "%s", io->err);
}

/* The step's gradient of P[begin, end) (a dense module's block) in P's layout, zeros
 * where no gradient came, in *out (its first float): G's dense block itself where it
 * is host memory and every parameter there (all dense) was touched, with only the
 * alignment gaps between parameters cleared; else the stage, cleared and filled from
 * G. Parameters lie in P in offset order, each within one block. */
static ferry_status lm_push_block(ferry_lm *lm, ferry_grads *G, int64_t begin, int64_t end,
                                  const float **out) {
    int direct = G->dense != NULL && ferry_backend_is_host(lm->be);
    for (int i = 0; i < lm->P.count && direct; i++) {
        const ferry_param *p = &lm->P.items[i];
        if (p->offset >= begin && p->offset < end)
            direct = G->touched[i] && !(p->flags & FERRY_PARAM_ROW_SPARSE);
    }
    if (direct) {
        int64_t at = begin;
        for (int i = 0; i < lm->P.count; i++) {
            const ferry_param *p = &lm->P.items[i];
            if (p->offset < begin || p->offset >= end)
                continue;
            memset(G->dense + at, 0, (size_t)(p->offset - at) * sizeof(float));
            at = p->offset + p->numel;
        }
        memset(G->dense + at, 0, (size_t)(end - at) * sizeof(float));
        *out = G->dense + begin;
        return FERRY_OK;
    }
    memset(lm->stage + begin, 0, (size_t)(end - begin) * sizeof(float));
    for (int i = 0; i < lm->P.count; i++) {
        const ferry_param *p = &lm->P.items[i];
        if (!G->touched[i] || p->offset < begin || p->offset >= end)
            continue;
        ferry_status st =
            ferry_backend_copy(lm->be, lm->stage + p->offset, G->dense + p->offset,
                               (size_t)p->numel * sizeof(float), FERRY_COPY_DEVICE_TO_HOST);
        if (st != FERRY_OK)
            return st;
    }
    *out = lm->stage + begin;
    return FERRY_OK;
}

/* Starts the push of the step's slice gradient (G's rows P[split, numel)). */
static ferry_status slice_push(ferry_lm *lm, ferry_grads *G) {
    const float *grad;
    ferry_status st = lm_push_block(lm, G, lm->split, lm->P.numel, &grad);
    if (st == FERRY_OK)
        slice_start(lm, grad);
    return st;
}

/* The tape node recorded before the decoder (ferry_lm_forward): the decoder's backward
 * has just written the slice's gradient, so its push starts while the LSTM's runs. */
static ferry_status slice_push_node(ferry_ctx *ctx, void *saved, ferry_tensor *const *grad_out,
                                    ferry_tensor **grad_in) {
    (void)grad_out;
    (void)grad_in;
    ferry_lm *lm = *(ferry_lm **)saved;
    ferry_grads *G = ferry_ctx_grads(ctx, &lm->P);
    if (G == NULL)
        return FERRY_NOMEM();
    ferry_status st = slice_push(lm, G);
    lm->slice.pushed = st == FERRY_OK;
    return st;
}

ferry_status ferry_lm_create_placed(ferry_backend *be, const ferry_lm_config *cfg,
                                    const ferry_lm_placement *placement, ferry_lm **out) {
    if (cfg->V < 2 || cfg->E < 1 || cfg->H < 1 || cfg->L < 1 || cfg->L > FERRY_LSTM_MAX_LAYERS)
        return ferry_errorf(FERRY_ERR_INVALID, "bad model shape V=%lld E=%lld H=%lld L=%d",
                            (long long)cfg->V, (long long)cfg->E, (long long)cfg->H, cfg->L);
    if (cfg->dropout < 0.0f || cfg->dropout >= 1.0f)
        return ferry_errorf(FERRY_ERR_RANGE, "dropout %g outside [0, 1)", (double)cfg->dropout);
    ferry_status st;
    ferry_params full;
    ferry_params_init(&full, be);
    ferry_lm *lm = calloc(1, sizeof *lm);
    if (lm == NULL)
        return FERRY_NOMEM();
    lm->cfg = *cfg;
    lm->be = be;
    ferry_params_init(&lm->P, be);
    if ((st = lm_declare_full(lm, &full)) != FERRY_OK)
        goto fail;
    if ((st = parse_stages(lm, placement != NULL ? placement->stages : NULL,
                           placement != NULL ? ferry_cluster_size(placement->cluster) : 0)) !=
        FERRY_OK)
        goto fail;
    int local_layers = 0;
    for (int g = 0; g < lm->ngroups; g++)
        local_layers += lm->groups[g].server < 0 ? lm->groups[g].count : 0;
    if (placement != NULL && placement->job != NULL && local_layers == 0) {
        st = ferry_errorf(FERRY_ERR_UNSUPPORTED, "--stages with every layer on the servers in a "
                          "job (--save, --checkpoint-every, --world): keep at least one layer "
                          "local (e.g. ...,local:1)");
        goto fail;
    }
    if (placement == NULL) {
        if ((st = lm_declare_full(lm, &lm->P)) != FERRY_OK)
            goto fail;
        lm->groups[0].rnn = lm->rnn;
    } else {
        /* The local embedding and decoder only served to learn the full layout. */
        memset(&lm->emb, 0, sizeof lm->emb);
        memset(&lm->dec, 0, sizeof lm->dec);
        memset(&lm->rnn, 0, sizeof lm->rnn);
        for (int g = 0; g < lm->ngroups; g++) {
            ferry_lm_group *G = &lm->groups[g];
            if (G->server >= 0)
                continue;
            if ((st = ferry_lstm_init_from(&G->rnn, &lm->P, "lstm", G->first == 0 ? cfg->E : cfg->H,
                                           cfg->H, G->count, cfg->dropout, G->first)) != FERRY_OK)
                goto fail;
        }
        if (lm_all_local(lm))
            lm->rnn = lm->groups[0].rnn;
        if (placement->local_vocab != 0) {
            if (placement->local_vocab < 0 || placement->local_vocab >= cfg->V ||
                placement->decoder_mode != FERRY_DECODER_SHARDED || !ferry_backend_is_host(be)) {
                st = ferry_errorf(FERRY_ERR_INVALID,
                                  "--local-vocab %lld: a slice of 1..%lld "
                                  "rows of the vocabulary, with --decoder-mode sharded-softmax "
                                  "and the CPU backend",
                                  (long long)placement->local_vocab, (long long)cfg->V - 1);
                goto fail;
            }
            lm->local_vocab = placement->local_vocab;
            if ((st = ferry_params_add(&lm->P, "decoder.weight",
                                       ferry_shape_2d(lm->local_vocab, cfg->H), 0, &lm->dec_w)) !=
                    FERRY_OK ||
                (st = ferry_params_add(&lm->P, "decoder.bias", ferry_shape_1d(lm->local_vocab), 0,
                                       &lm->dec_b)) != FERRY_OK)
                goto fail;
        }
    }
    for (int g = 0; g < lm->ngroups && cfg->stiefel_beta > 0.0f; g++) {
        for (int l = 0; l < lm->groups[g].count && lm->groups[g].server < 0; l++) {
            st = ferry_params_set_constraint(&lm->P, lm->groups[g].rnn.w_hh[l],
                                             FERRY_CONSTRAINT_STIEFEL, cfg->stiefel_beta);
            if (st != FERRY_OK)
                goto fail;
        }
    }
    /* The servers' carried states: even keys for training, the next for evaluation;
     * each rank of a job has its own (ranks may share a process and a nanosecond). */
    uint64_t rank = placement != NULL && placement->job != NULL
                        ? (uint64_t)ferry_job_get_config(placement->job)->rank
                        : 0;
    lm->stream = (((uint64_t)(ferry_now() * 1e9) * 0x9E3779B97F4A7C15ull) ^ (uint64_t)getpid() ^
                  (rank + 1) * 0xC2B2AE3D27D4EB4Full) &
                 ~1ull;
    if ((st = ferry_params_alloc(&lm->P)) != FERRY_OK || (st = lm_init_local(lm, &full)) != FERRY_OK)
        goto fail;
    if (placement != NULL) {
        lm->decoder_mode = placement->decoder_mode;
        if ((st = lm_create_remote(lm, &full, placement)) != FERRY_OK)
            goto fail;
    }
    ferry_params_deinit(&full);
    *out = lm;
    return FERRY_OK;
fail:
    ferry_params_deinit(&full);
    ferry_lm_destroy(lm);
    return st;
}

ferry_status ferry_lm_create(ferry_backend *be, const ferry_lm_config *cfg, ferry_lm **out) {
    return ferry_lm_create_placed(be, cfg, NULL, out);
}

void ferry_lm_destroy(ferry_lm *lm) {
    if (lm == NULL)
        return;
    ferry_remote_destroy(lm->emb_remote);
    ferry_remote_destroy(lm->dec_remote);
    ferry_remote_destroy(lm->dense_remote);
    ferry_remote_destroy(lm->slice_remote);
    for (int g = 0; g < lm->ngroups; g++) {
        ferry_remote_destroy(lm->groups[g].remote);
        ferry_params_deinit(&lm->groups[g].view);
    }
    ferry_lm_pipe_destroy(lm->pipe);
    free(lm->stage);
    ferry_tensor_destroy(lm->h);
    ferry_tensor_destroy(lm->c);
    ferry_params_deinit(&lm->P);
    free(lm);
}

int ferry_lm_is_remote(const ferry_lm *lm) {
    return lm->emb_remote != NULL;
}

ferry_status ferry_lm_set_micro_batches(ferry_lm *lm, int M) {
    if (M < 1 || M > FERRY_LM_MAX_MICRO)
        return ferry_errorf(FERRY_ERR_RANGE, "micro-batches %d outside 1..%d", M,
                            FERRY_LM_MAX_MICRO);
    ferry_lm_pipe_destroy(lm->pipe);
    lm->pipe = NULL;
    return M == 1 ? FERRY_OK : ferry_lm_pipe_create(M, &lm->pipe);
}

void ferry_lm_set_grad_thread(ferry_lm *lm, ferry_lm_grad_thread mode) {
    lm->grad_thread = (int)mode;
}

int ferry_lm_uses_grad_thread(const ferry_lm *lm) {
    int want = lm->grad_thread == FERRY_LM_GRAD_THREAD_ON ||
               (lm->grad_thread == FERRY_LM_GRAD_THREAD_AUTO && ferry_lm_is_remote(lm));
    return want && ferry_backend_is_host(lm->be);
}

ferry_status ferry_lm_reset_state(ferry_lm *lm, int64_t B) {
    ferry_shape s = ferry_shape_3d(lm->cfg.L, B, lm->cfg.H);
    lm->synced = 0; /* the servers' streams no longer hold this state */
    if (lm->h == NULL || lm->B != B) {
        ferry_tensor_destroy(lm->h);
        ferry_tensor_destroy(lm->c);
        lm->h = lm->c = NULL;
        ferry_status st = ferry_tensor_create(lm->be, FERRY_DTYPE_F32, s, &lm->h);
        if (st == FERRY_OK)
            st = ferry_tensor_create(lm->be, FERRY_DTYPE_F32, s, &lm->c);
        if (st != FERRY_OK)
            return st;
        lm->B = B;
        return FERRY_OK;
    }
    ferry_status st = ferry_backend_fill(lm->be, lm->h->data, ferry_tensor_numel(lm->h), 0.0f);
    if (st == FERRY_OK)
        st = ferry_backend_fill(lm->be, lm->c->data, ferry_tensor_numel(lm->c), 0.0f);
    return st;
}

/* ---- forward ---- */

/* Decoder and loss, local or remote in either decoder mode. */
static ferry_status lm_decode(ferry_lm *lm, ferry_ctx *ctx, ferry_dist_ctx *dc,
                              const ferry_tensor *y, const ferry_tensor *targets, float scale,
                              ferry_tensor **loss, double *loss_sum) {
    ferry_tensor *logits; /* (T, B, V) */
    ferry_status st;
    if (lm->dec_remote != NULL && lm->decoder_mode == FERRY_DECODER_SHARDED)
        return ferry_dist_xent_forward(lm->dec_remote, dc, ctx, y, targets, scale, loss, loss_sum);
    if (lm->dec_remote != NULL)
        st = ferry_dist_logits_forward(lm->dec_remote, dc, ctx, y, &logits);
    else
        st = ferry_linear_forward(&lm->dec, ctx, y, &logits);
    if (st != FERRY_OK)
        return st;
    return ferry_xent_forward(ctx, logits, targets, scale, loss, loss_sum);
}

ferry_status ferry_lm_forward(ferry_lm *lm, ferry_ctx *ctx, ferry_dist_ctx *dc,
                              const ferry_tensor *inputs, const ferry_tensor *targets,
                              float loss_scale, ferry_tensor **loss, double *loss_sum) {
    ferry_status st;
    if (inputs->shape.ndim != 2 || !ferry_shape_eq(inputs->shape, targets->shape))
        return ferry_errorf(FERRY_ERR_SHAPE, "model: inputs and targets must both be (T, B)");
    int64_t B = inputs->shape.dim[1];
    if (lm->h == NULL || lm->B != B) {
        if ((st = ferry_lm_reset_state(lm, B)) != FERRY_OK)
            return st;
    }
    float p = ferry_ctx_training(ctx) ? lm->cfg.dropout : 0.0f;
    ferry_tensor *x, *xd, *y, *yd, *hn, *cn;
    if (lm->emb_remote != NULL)
        st = ferry_dist_embedding_forward(lm->emb_remote, dc, ctx, inputs, &x);
    else
        st = ferry_embedding_forward(&lm->emb, ctx, inputs, &x);
    if (st != FERRY_OK)
        return st; /* (T, B, E) */
    int overlap = lm->slice.want; /* the slice's pull meanwhile (a training step) */
    lm->slice.want = 0;
    if (overlap)
        slice_start(lm, NULL);
    if ((st = ferry_dropout_forward(ctx, p, x, &xd)) != FERRY_OK)
        return st;
    if ((st = ferry_lm_stack_forward(lm, ctx, dc, xd, lm->h, lm->c,
                                     FERRY_LM_CARRIED | FERRY_LM_CARRY, &y, &hn, &cn)) != FERRY_OK)
        return st; /* y (T, B, H); hn, cn (L, B, H) */
    if ((st = ferry_dropout_forward(ctx, p, y, &yd)) != FERRY_OK)
        return st;
    if (overlap) { /* the slice's rows are in P; its push goes out after its backward */
        if ((st = slice_join(lm)) != FERRY_OK)
            return st;
        ferry_lm **saved = ferry_ctx_host_alloc(ctx, sizeof *saved);
        if (saved == NULL)
            return FERRY_NOMEM();
        *saved = lm;
        if ((st = ferry_ctx_record(ctx, slice_push_node, saved, 0, NULL, 1, &yd)) != FERRY_OK)
            return st;
    }
    if ((st = lm_decode(lm, ctx, dc, yd, targets, loss_scale, loss, loss_sum)) != FERRY_OK)
        return st;
    /* Truncated BPTT: the next window starts from these values, detached. */
    size_t nbytes = ferry_tensor_nbytes(lm->h);
    if ((st = ferry_backend_copy(lm->be, lm->h->data, hn->data, nbytes,
                                 FERRY_COPY_DEVICE_TO_DEVICE)) != FERRY_OK)
        return st;
    return ferry_backend_copy(lm->be, lm->c->data, cn->data, nbytes, FERRY_COPY_DEVICE_TO_DEVICE);
}

/* ---- the training step ---- */

/* Clips by the norm over local and remote gradients, then steps the shards and the
 * local block at the same time: the shards' Step goes out (ferry_dist_ctx_step_start)
 * and the local update runs while it is in flight. */
static ferry_status lm_dist_step(ferry_lm *lm, ferry_dist_ctx *dc, ferry_optim *opt,
                                 ferry_grads *G, double local_sumsq, const ferry_lm_step_args *a,
                                 ferry_lm_step_result *res) {
    ferry_status st = ferry_dist_ctx_step_start(dc, local_sumsq, a->clip, a->lr, &res->coef,
                                                &res->grad_norm);
    if (st != FERRY_OK)
        return st;
    ferry_status local = ferry_optim_step(opt, &lm->P, G, res->coef);
    char err[256] = "";
    if (local != FERRY_OK)
        (void)snprintf(err, sizeof err, "%s", ferry_error_last());
    st = ferry_dist_ctx_step_wait(dc);
    if (st == FERRY_OK && local != FERRY_OK)
        st = ferry_errorf(local, "%s", err);
    return st;
}

/* The data-parallel step: push the LSTM's gradient (its rows to each server), tie
 * the context to the job step, then the servers' clipped step: GradNorm (bsp: of
 * every rank's summed gradient) and Step. Nothing is stepped here. */
static ferry_status lm_job_step(ferry_lm *lm, ferry_dist_ctx *dc, ferry_grads *G,
                                uint64_t pull_call, const ferry_tensor *inputs,
                                const ferry_lm_step_args *a, ferry_lm_step_result *res) {
    ferry_status st;
    const float *grad;
    double t0 = ferry_now();
    if ((st = lm_push_block(lm, G, 0, lm->split, &grad)) != FERRY_OK ||
        (st = ferry_remote_dense_push(lm->dense_remote, dc, pull_call, grad)) != FERRY_OK)
        return st;
    res->xfer_s += ferry_now() - t0;
    /* The slice's push: out on its thread since the decoder's backward, or now. */
    if (lm->slice_remote != NULL && ((!lm->slice.pushed && (st = slice_push(lm, G)) != FERRY_OK) ||
                                     (st = slice_join(lm)) != FERRY_OK))
        return st;
    res->xfer_s += lm->slice.wait_s; /* the slice's transfer where this step waited for it */
    double tokens = (double)ferry_tensor_numel(inputs);
    if ((st = ferry_dist_ctx_set_job(dc, lm->job, a->job_step, res->loss_sum, tokens)) != FERRY_OK)
        return st;
    t0 = ferry_now();
    st = ferry_dist_ctx_clip_step(dc, 0.0, a->clip, a->lr, &res->coef, &res->grad_norm);
    res->sync_s = ferry_now() - t0;
    if (st != FERRY_OK)
        return st;
    ferry_dist_ctx_job_loss(dc, &res->job_loss_sum, &res->job_tokens);
    res->checkpoint = ferry_dist_ctx_job_checkpoint(dc);
    res->readmit = ferry_dist_ctx_job_readmit(dc);
    return FERRY_OK;
}

static ferry_status lm_step_body(ferry_lm *lm, ferry_ctx *ctx, ferry_dist_ctx *dc,
                                 ferry_optim *opt, const ferry_tensor *inputs,
                                 const ferry_tensor *targets, const ferry_lm_step_args *a,
                                 ferry_lm_step_result *res) {
    ferry_tensor *loss;
    ferry_status st;
    uint64_t pull_call = 0;
    res->job_tokens = (double)ferry_tensor_numel(inputs);
    /* The LSTM's weight-gradient GEMMs on the context's helper thread (distributed by
     * default): they fill a core left idle while this thread walks the recurrence and
     * waits for the decoder. */
    ferry_ctx_set_deferred(ctx, ferry_lm_uses_grad_thread(lm));
    if (lm->local_vocab > 0) {
        /* The decoder's local slice adds its gradient straight into the step's
         * (zeroed here, before the pipeline's threads start: the decoder thread then
         * writes only these rows of the block). */
        ferry_grads *G0 = ferry_ctx_grads(ctx, &lm->P);
        float *gw = G0 != NULL ? ferry_grads_dense(G0, lm->dec_w) : NULL;
        float *gb = G0 != NULL ? ferry_grads_dense(G0, lm->dec_b) : NULL;
        if (gw == NULL || gb == NULL)
            return FERRY_NOMEM_SAID;
        if ((st = lm_attach_slice(lm, gw, gb)) != FERRY_OK)
            return st;
    }
    if (lm->dense_remote != NULL) { /* this step starts from the job's weights */
        lm->slice.dc = dc;
        lm->slice.want =
            lm->slice_remote != NULL && lm->slice_overlap && lm->pipe == NULL && lm_all_local(lm);
        double t0 = ferry_now();
        if ((st = lm_pull(lm, dc, &pull_call, lm->slice.want ? NULL : &lm->slice.call)) != FERRY_OK)
            return st;
        res->xfer_s = ferry_now() - t0;
    }
    if (lm->pipe != NULL && ferry_lm_is_remote(lm)) {
        if (lm->h == NULL || lm->B != inputs->shape.dim[1]) {
            if ((st = ferry_lm_reset_state(lm, inputs->shape.dim[1])) != FERRY_OK)
                return st;
        }
        if ((st = ferry_lm_pipe_forward_backward(lm, lm->pipe, ctx, dc, inputs, targets,
                                                 a->loss_scale, a->seed, a->batch, a->col0,
                                                 &res->loss_sum)) != FERRY_OK)
            return st;
        if (!isfinite(res->loss_sum))
            return ferry_errorf(FERRY_ERR_NUMERIC, "loss is %g: training diverged (lower --lr "
                                "or set --clip)", res->loss_sum);
    } else {
        if (lm->pipe != NULL)
            return ferry_errorf(FERRY_ERR_UNSUPPORTED, "micro-batches need the decoder on "
                                "ferry-ps (--ps)");
        if ((st = ferry_lm_forward(lm, ctx, dc, inputs, targets, a->loss_scale, &loss,
                                   &res->loss_sum)) != FERRY_OK)
            return st;
        if (!isfinite(res->loss_sum))
            return ferry_errorf(FERRY_ERR_NUMERIC, "loss is %g: training diverged (lower --lr "
                                "or set --clip)", res->loss_sum);
        if ((st = ferry_ctx_backward(ctx, loss)) != FERRY_OK)
            return st;
    }
    ferry_grads *G = ferry_ctx_grads(ctx, &lm->P);
    if (G == NULL)
        return FERRY_NOMEM();
    /* The owner adds the Stiefel penalty's gradient once per step, before clipping,
     * as loss = CE + beta sum ||W^T W - I||^2 would through autograd. In a job every
     * rank holds the same W, and rank 0 alone adds it: the summed gradient of a bsp
     * step then holds it once. */
    int owner = lm->job == NULL ||
                (a->owner_set ? a->owner != 0 : ferry_job_get_config(lm->job)->rank == 0);
    if (lm->cfg.stiefel_beta > 0.0f && owner &&
        (st = ferry_stiefel_add_penalty_grads(&lm->P, G, &res->penalty, NULL)) != FERRY_OK)
        return st;
    res->job_loss_sum = res->loss_sum;
    if (a->before_sync != NULL && (st = a->before_sync(a->user)) != FERRY_OK)
        return st;
    if (lm->dense_remote != NULL)
        return lm_job_step(lm, dc, G, pull_call, inputs, a, res);
    double sumsq = 0.0;
    if ((st = ferry_grads_sumsq(G, &sumsq)) != FERRY_OK)
        return st;
    if (ferry_lm_is_remote(lm))
        st = lm_dist_step(lm, dc, opt, G, sumsq, a, res);
    else {
        res->coef = 1.0f;
        res->grad_norm = sqrt(sumsq);
        if (a->clip > 0.0f)
            st = ferry_clip_coef(sumsq, a->clip, &res->coef, &res->grad_norm);
        if (st == FERRY_OK)
            st = ferry_optim_step(opt, &lm->P, G, res->coef);
    }
    if (st == FERRY_OK && !isfinite(res->grad_norm))
        st = ferry_errorf(FERRY_ERR_NUMERIC, "gradient norm is %g", res->grad_norm);
    return st;
}

ferry_status ferry_lm_train_step(ferry_lm *lm, ferry_ctx *ctx, ferry_dist_ctx *dc, ferry_optim *opt,
                                 const ferry_tensor *inputs, const ferry_tensor *targets,
                                 const ferry_lm_step_args *args, ferry_lm_step_result *res) {
    memset(res, 0, sizeof *res);
    ferry_ctx_reset(ctx, args->ctx_id);
    ferry_ctx_set_training(ctx, 1);
    ferry_ctx_set_seed(ctx, args->seed);
    if (args->batch > 0 && inputs->shape.ndim == 2) {
        int64_t T = inputs->shape.dim[0], B = inputs->shape.dim[1];
        ferry_ctx_set_window(ctx, T, args->batch, 0, T, args->col0, B);
    }
    if (ferry_lm_is_remote(lm)) {
        if (dc == NULL)
            return ferry_errorf(FERRY_ERR_INVALID, "a distributed model needs a ferry_dist_ctx");
        (void)ferry_dist_ctx_begin(dc);
    }
    lm->slice.wait_s = 0.0;
    ferry_status st = lm_step_body(lm, ctx, dc, opt, inputs, targets, args, res);
    if (lm->slice.started) { /* a failed step's transfer of the slice */
        char err[512];
        (void)snprintf(err, sizeof err, "%s", ferry_error_last());
        ferry_status sj = slice_join(lm);
        st = st != FERRY_OK ? ferry_errorf(st, "%s", err) : sj;
    }
    lm->slice.want = lm->slice.pushed = 0; /* every step's path ends here */
    if (st != FERRY_OK && dc != NULL && ferry_dist_ctx_id(dc) != 0) {
        /* Keep the error message of the step, not of the release. */
        char err[512];
        (void)snprintf(err, sizeof err, "%s", ferry_error_last());
        /* A server that did not answer gets no cleanup call (it would cost another
         * deadline): it sweeps the context by itself. */
        if (st == FERRY_ERR_TIMEOUT || st == FERRY_ERR_UNAVAILABLE)
            ferry_dist_ctx_abandon(dc);
        else if (ferry_dist_ctx_release(dc) != FERRY_OK)
            FERRY_LOG_WARN("releasing context after a failed step: %s", ferry_error_last());
        (void)ferry_errorf(st, "%s", err);
    }
    return st;
}

/* ---- metrics ---- */

ferry_status ferry_lm_feasibility(const ferry_lm *lm, double *out) {
    for (int g = 0; g < lm->ngroups; g++) {
        const ferry_lm_group *G = &lm->groups[g];
        const ferry_params *P = G->server < 0 ? &lm->P : &G->view;
        ferry_status st = FERRY_OK;
        if (G->server >= 0) /* a remote group's weights, as its server holds them now */
            st = ferry_remote_get_params(G->remote, "weight", 0, 1, G->view.data);
        for (int l = 0; l < G->count && st == FERRY_OK; l++) {
            const ferry_param *p = &P->items[G->rnn.w_hh[l]];
            st = ferry_stiefel_feasibility(P->be, p->shape.dim[0], p->shape.dim[1],
                                           ferry_params_data(P, G->rnn.w_hh[l]),
                                           &out[G->first + l], NULL);
        }
        if (st != FERRY_OK)
            return st;
    }
    return FERRY_OK;
}

double ferry_lm_step_flops(const ferry_lm_config *cfg, int64_t T, int64_t B) {
    double N = (double)T * (double)B, H = (double)cfg->H, fwd = 0.0;
    for (int l = 0; l < cfg->L; l++) {
        double C = l == 0 ? (double)cfg->E : H;
        fwd += 2.0 * N * C * 4.0 * H; /* input projection */
        fwd += 2.0 * N * H * 4.0 * H; /* recurrent projection */
    }
    fwd += 2.0 * N * H * (double)cfg->V; /* decoder */
    /* Backward runs two GEMMs of the same size per forward GEMM (dX and dW);
     * the first layer's dX feeds only the embedding but is computed too. */
    return 3.0 * fwd;
}

const ferry_lm_config *ferry_lm_get_config(const ferry_lm *lm) {
    return &lm->cfg;
}

ferry_backend *ferry_lm_backend(const ferry_lm *lm) {
    return lm->be;
}

ferry_params *ferry_lm_params(ferry_lm *lm) {
    return &lm->P;
}

const ferry_params *ferry_lm_params_const(const ferry_lm *lm) {
    return &lm->P;
}

ferry_tensor *ferry_lm_state_h(const ferry_lm *lm) {
    return lm->h;
}

ferry_tensor *ferry_lm_state_c(const ferry_lm *lm) {
    return lm->c;
}

int64_t ferry_lm_state_batch(const ferry_lm *lm) {
    return lm->B;
}

ferry_lm_pipe *ferry_lm_pipeline(const ferry_lm *lm) {
    return lm->pipe;
}

ferry_status ferry_lm_replace(ferry_lm *lm) {
    ferry_remote *mods[4] = {lm->emb_remote, lm->dec_remote, lm->dense_remote, lm->slice_remote};
    for (int g = 0; g < lm->ngroups; g++) {
        if (lm->groups[g].remote != NULL)
            return ferry_errorf(FERRY_ERR_UNSUPPORTED,
                                "layers placed on a server (--stages) do not follow its servers");
    }
    ferry_status st = FERRY_OK;
    for (int i = 0; i < 4 && st == FERRY_OK; i++) {
        if (mods[i] != NULL)
            st = ferry_remote_replace(mods[i]);
    }
    return st;
}

ferry_remote *ferry_lm_embedding_remote(const ferry_lm *lm) {
    return lm->emb_remote;
}

int ferry_lm_ngroups(const ferry_lm *lm) {
    return lm->ngroups;
}

void ferry_lm_group_info(const ferry_lm *lm, int g, int *first, int *count, int *server) {
    FERRY_ASSERT(g >= 0 && g < lm->ngroups);
    *first = lm->groups[g].first;
    *count = lm->groups[g].count;
    *server = lm->groups[g].server;
}
