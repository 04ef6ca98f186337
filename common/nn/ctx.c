/* ctx.c - autograd contexts: arena tensors, the tape of module calls, a map from
 * tensor address to its gradient, and the per-block gradient tables. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tensor/backend.h"
#include "common/core/arena.h"
#include "common/nn/nn-impl.h"
#include "ferry/autograd.h"
#include "common/core/log.h"

typedef struct tape_node {
    ferry_backward_fn fn;
    void *saved;
    int nin, nout;
    ferry_tensor *in[FERRY_NODE_MAX_IO];
    ferry_tensor *out[FERRY_NODE_MAX_IO];
} tape_node;

/* Open-addressing map: tensor address -> (requires grad, gradient tensor). */
typedef struct grad_slot {
    const ferry_tensor *key;
    ferry_tensor *grad;
} grad_slot;

struct ferry_ctx {
    ferry_backend *be;
    uint64_t id;
    int training;
    uint64_t seed, rng_offset;
    /* ferry_ctx_set_window: a block of steps x cols of a (T, batch, F) draw; batch 0: off */
    int64_t win_T, win_batch, win_t0, win_steps, win_col0, win_cols;
    ferry_arena *arena;      /* backend memory: tensors' data */
    ferry_arena *host_arena; /* host memory: tensor structs, saved state */
    tape_node *nodes;
    int nnodes, cap_nodes;
    grad_slot *map;
    int64_t map_cap, map_count;
    ferry_grads *grads; /* one per block touched */
    int ngrads, cap_grads;
    /* Deferred gradient work (ferry_ctx_set_deferred): jobs run in order by one
     * helper thread, started at the first job; mu guards the rest. */
    int deferred;
    pthread_t helper;
    int helper_started, helper_stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ferry__ctx_job *jobs; /* ring of cap_jobs */
    int cap_jobs, head, count;
    ferry_status job_st; /* the first failed job's status, until ferry_ctx_sync */
    char job_err[512];
};

/* ---- deferred gradient work ---- */

static void *helper_main(void *arg) {
    ferry_ctx *ctx = arg;
    pthread_mutex_lock(&ctx->mu);
    for (;;) {
        while (ctx->count == 0 && !ctx->helper_stop)
            pthread_cond_wait(&ctx->cv, &ctx->mu);
        if (ctx->count == 0)
            break; /* stopping, nothing left */
        ferry__ctx_job job = ctx->jobs[ctx->head];
        pthread_mutex_unlock(&ctx->mu);
        /* After a failure the rest of the step's jobs are skipped: the step fails. */
        ferry_status st = ctx->job_st == FERRY_OK ? job.fn(job.arg) : FERRY_OK;
        pthread_mutex_lock(&ctx->mu);
        if (st != FERRY_OK && ctx->job_st == FERRY_OK) {
            ctx->job_st = st;
            (void)snprintf(ctx->job_err, sizeof ctx->job_err, "%s", ferry_error_last());
        }
        ctx->head = (ctx->head + 1) % ctx->cap_jobs;
        ctx->count--;
        pthread_cond_broadcast(&ctx->cv);
    }
    pthread_mutex_unlock(&ctx->mu);
    return NULL;
}

void ferry_ctx_set_deferred(ferry_ctx *ctx, int on) {
    if (!on)
        (void)ferry_ctx_sync(ctx);
    ctx->deferred = on != 0;
}

int ferry__ctx_deferred(const ferry_ctx *ctx) {
    return ctx->deferred;
}

ferry_status ferry__ctx_defer(ferry_ctx *ctx, ferry__ctx_job job) {
    if (!ctx->deferred)
        return job.fn(job.arg);
    pthread_mutex_lock(&ctx->mu);
    ferry_status st = FERRY_OK;
    if (ctx->count == ctx->cap_jobs) { /* grow the ring, oldest first */
        int cap = ctx->cap_jobs ? 2 * ctx->cap_jobs : 16;
        ferry__ctx_job *n = malloc((size_t)cap * sizeof *n);
        if (n == NULL)
            st = FERRY_NOMEM();
        for (int i = 0; n != NULL && i < ctx->count; i++)
            n[i] = ctx->jobs[(ctx->head + i) % ctx->cap_jobs];
        if (n != NULL) {
            free(ctx->jobs);
            ctx->jobs = n;
            ctx->cap_jobs = cap;
            ctx->head = 0;
        }
    }
    if (st == FERRY_OK && !ctx->helper_started) {
        if (pthread_create(&ctx->helper, NULL, helper_main, ctx) != 0) {
            FERRY_LOG_WARN("cannot start the gradient helper thread: weight gradients form in "
                           "place");
            ctx->deferred = 0; /* nothing was queued: in place from now on */
            st = FERRY_ERR_RESOURCE;
        } else {
            ctx->helper_started = 1;
        }
    }
    if (st == FERRY_OK) {
        ctx->jobs[(ctx->head + ctx->count) % ctx->cap_jobs] = job;
        ctx->count++;
        pthread_cond_broadcast(&ctx->cv);
        pthread_mutex_unlock(&ctx->mu);
        return FERRY_OK;
    }
    /* Not queued: it runs here, after the jobs before it (they may add into the same
     * gradients, and the order of the sums is the in-place one). */
    while (ctx->count > 0)
        pthread_cond_wait(&ctx->cv, &ctx->mu);
    pthread_mutex_unlock(&ctx->mu);
    return job.fn(job.arg);
}

ferry_status ferry_ctx_sync(ferry_ctx *ctx) {
    pthread_mutex_lock(&ctx->mu);
    while (ctx->count > 0)
        pthread_cond_wait(&ctx->cv, &ctx->mu);
    ferry_status st = ctx->job_st;
    ctx->job_st = FERRY_OK;
    pthread_mutex_unlock(&ctx->mu);
    if (st != FERRY_OK)
        return ferry_errorf(st, "%s", ctx->job_err);
    return FERRY_OK;
}

/* Arena chunks come from the backend (the host arena's from the CPU backend). */
static void *backend_chunk_alloc(void *be, size_t nbytes) {
    void *p = NULL;
    return ferry_backend_alloc(be, nbytes, &p) == FERRY_OK ? p : NULL;
}

static void backend_chunk_free(void *be, void *p) {
    ferry_backend_free(be, p);
}

ferry_status ferry_ctx_create(ferry_backend *be, ferry_ctx **out) {
    ferry_status st;
    ferry_ctx *ctx = calloc(1, sizeof *ctx);
    if (ctx == NULL)
        return FERRY_NOMEM();
    ctx->be = be;
    ctx->training = 1;
    pthread_mutex_init(&ctx->mu, NULL);
    pthread_cond_init(&ctx->cv, NULL);
    ferry_arena_allocator dev = {backend_chunk_alloc, backend_chunk_free, be};
    ferry_arena_allocator host = {backend_chunk_alloc, backend_chunk_free, ferry_backend_cpu()};
    if ((st = ferry_arena_create(&dev, 4u << 20, &ctx->arena)) != FERRY_OK)
        goto fail;
    if ((st = ferry_arena_create(&host, 256u << 10, &ctx->host_arena)) != FERRY_OK)
        goto fail;
    *out = ctx;
    return FERRY_OK;
fail:
    ferry_ctx_destroy(ctx);
    return st;
}

void ferry_ctx_destroy(ferry_ctx *ctx) {
    if (ctx == NULL)
        return;
    (void)ferry_ctx_sync(ctx);
    if (ctx->helper_started) {
        pthread_mutex_lock(&ctx->mu);
        ctx->helper_stop = 1;
        pthread_cond_broadcast(&ctx->cv);
        pthread_mutex_unlock(&ctx->mu);
        pthread_join(ctx->helper, NULL);
    }
    free(ctx->jobs);
    pthread_mutex_destroy(&ctx->mu);
    pthread_cond_destroy(&ctx->cv);
    for (int i = 0; i < ctx->ngrads; i++)
        ferry_grads_deinit(&ctx->grads[i]);
    free(ctx->grads);
    free(ctx->nodes);
    free(ctx->map);
    ferry_arena_destroy(ctx->arena);
    ferry_arena_destroy(ctx->host_arena);
    free(ctx);
}

void ferry_ctx_reset(ferry_ctx *ctx, uint64_t id) {
    /* Jobs still read the arena and write the gradients: they end first (a failure
     * there belonged to the abandoned step). */
    (void)ferry_ctx_sync(ctx);
    ctx->id = id;
    ctx->nnodes = 0;
    ctx->rng_offset = 0;
    ctx->win_batch = 0;
    if (ctx->map_count > 0)
        memset(ctx->map, 0, (size_t)ctx->map_cap * sizeof *ctx->map);
    ctx->map_count = 0;
    for (int i = 0; i < ctx->ngrads; i++)
        ferry_grads_zero(&ctx->grads[i]);
    ferry_arena_reset(ctx->arena);
    ferry_arena_reset(ctx->host_arena);
}

uint64_t ferry_ctx_id(const ferry_ctx *ctx) {
    return ctx->id;
}

ferry_backend *ferry_ctx_backend(const ferry_ctx *ctx) {
    return ctx->be;
}

void ferry_ctx_set_training(ferry_ctx *ctx, int training) {
    ctx->training = training;
}

int ferry_ctx_training(const ferry_ctx *ctx) {
    return ctx->training;
}

void ferry_ctx_set_seed(ferry_ctx *ctx, uint64_t seed) {
    ctx->seed = seed;
    ctx->rng_offset = 0;
}

void ferry_ctx_draw(ferry_ctx *ctx, int64_t n, uint64_t *seed, uint64_t *offset) {
    *seed = ctx->seed;
    *offset = ctx->rng_offset;
    ctx->rng_offset += (uint64_t)n;
}

void ferry_ctx_set_window(ferry_ctx *ctx, int64_t T, int64_t batch, int64_t t0, int64_t steps,
                          int64_t col0, int64_t cols) {
    ctx->win_T = T;
    ctx->win_batch = batch;
    ctx->win_t0 = t0;
    ctx->win_steps = steps;
    ctx->win_col0 = col0;
    ctx->win_cols = cols;
}

void ferry_ctx_get_window(const ferry_ctx *ctx, int64_t *T, int64_t *batch, int64_t *t0,
                          int64_t *steps) {
    *T = ctx->win_T;
    *batch = ctx->win_batch;
    *t0 = ctx->win_t0;
    *steps = ctx->win_steps;
}

void ferry_ctx_get_window_cols(const ferry_ctx *ctx, int64_t *col0, int64_t *cols) {
    *col0 = ctx->win_col0;
    *cols = ctx->win_cols;
}

ferry_status ferry_ctx_dropout_mask(ferry_ctx *ctx, int64_t n, float p, float *mask) {
    uint64_t seed, offset;
    if (ctx->win_batch <= 0) {
        ferry_ctx_draw(ctx, n, &seed, &offset);
        return ferry_backend_dropout_mask(ctx->be, n, p, seed, offset, mask);
    }
    /* A (steps, cols, F) block of the whole window's (T, batch, F) draw: its row t
     * starts at element ((t0 + t) * batch + col0) * F of it. */
    int64_t T = ctx->win_T, B = ctx->win_batch, rows = ctx->win_steps * ctx->win_cols;
    if (ctx->win_t0 < 0 || ctx->win_steps < 1 || ctx->win_t0 + ctx->win_steps > T ||
        ctx->win_col0 < 0 || ctx->win_cols < 1 || ctx->win_col0 + ctx->win_cols > B ||
        n % rows != 0)
        return ferry_errorf(FERRY_ERR_SHAPE, "dropout: %lld values are not steps [%lld, %lld) x "
                            "columns [%lld, %lld) of a (%lld, %lld, F) window", (long long)n,
                            (long long)ctx->win_t0, (long long)(ctx->win_t0 + ctx->win_steps),
                            (long long)ctx->win_col0, (long long)(ctx->win_col0 + ctx->win_cols),
                            (long long)T, (long long)B);
    int64_t F = n / rows, run = ctx->win_cols * F;
    ferry_ctx_draw(ctx, T * B * F, &seed, &offset);
    for (int64_t t = 0; t < ctx->win_steps; t++) {
        uint64_t at = offset + (uint64_t)(((ctx->win_t0 + t) * B + ctx->win_col0) * F);
        ferry_status st = ferry_backend_dropout_mask(ctx->be, run, p, seed, at, mask + t * run);
        if (st != FERRY_OK)
            return st;
    }
    return FERRY_OK;
}

/* ---- memory ---- */

void *ferry_ctx_host_alloc(ferry_ctx *ctx, size_t nbytes) {
    void *p = ferry_arena_alloc(ctx->host_arena, nbytes);
    if (p != NULL)
        memset(p, 0, nbytes);
    return p;
}

ferry_status ferry_ctx_tensor(ferry_ctx *ctx, ferry_dtype dt, ferry_shape shape,
                              ferry_tensor **out) {
    ferry_tensor *t = ferry_ctx_host_alloc(ctx, sizeof *t);
    if (t == NULL)
        return FERRY_NOMEM();
    *t = ferry_tensor_wrap(ctx->be, dt, shape, NULL);
    t->data = ferry_arena_alloc(ctx->arena, ferry_tensor_nbytes(t));
    if (t->data == NULL)
        return FERRY_NOMEM_SAID;
    *out = t;
    return FERRY_OK;
}

ferry_status ferry_ctx_zeros(ferry_ctx *ctx, ferry_dtype dt, ferry_shape shape,
                             ferry_tensor **out) {
    ferry_status st = ferry_ctx_tensor(ctx, dt, shape, out);
    if (st != FERRY_OK)
        return st;
    if (dt == FERRY_DTYPE_F32)
        return ferry_backend_fill(ctx->be, (*out)->data, ferry_shape_numel(shape), 0.0f);
    size_t nbytes = ferry_tensor_nbytes(*out);
    void *zeros = calloc(1, nbytes ? nbytes : 1);
    if (zeros == NULL)
        return FERRY_NOMEM();
    st = ferry_backend_copy(ctx->be, (*out)->data, zeros, nbytes, FERRY_COPY_HOST_TO_DEVICE);
    free(zeros);
    return st;
}

/* ---- gradient tables ---- */

ferry_grads *ferry_ctx_grads(ferry_ctx *ctx, const ferry_params *P) {
    for (int i = 0; i < ctx->ngrads; i++)
        if (ctx->grads[i].P == P)
            return &ctx->grads[i];
    if (ctx->ngrads == ctx->cap_grads) {
        int cap = ctx->cap_grads ? 2 * ctx->cap_grads : 4;
        ferry_grads *g = realloc(ctx->grads, (size_t)cap * sizeof *g);
        if (g == NULL) {
            (void)FERRY_NOMEM(); /* the detail for the caller's FERRY_NOMEM_SAID */
            return NULL;
        }
        ctx->grads = g;
        ctx->cap_grads = cap;
    }
    if (ferry_grads_init(&ctx->grads[ctx->ngrads], P) != FERRY_OK)
        return NULL;
    return &ctx->grads[ctx->ngrads++];
}

int ferry_ctx_grads_count(const ferry_ctx *ctx) {
    return ctx->ngrads;
}

ferry_grads *ferry_ctx_grads_at(ferry_ctx *ctx, int i) {
    FERRY_ASSERT(i >= 0 && i < ctx->ngrads);
    return &ctx->grads[i];
}

/* ---- tensor -> gradient map ---- */

static uint64_t ptr_hash(const void *p) {
    uint64_t z = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull;
    return z ^ (z >> 31);
}

static grad_slot *map_find(ferry_ctx *ctx, const ferry_tensor *t, int insert) {
    if (insert && 2 * (ctx->map_count + 1) > ctx->map_cap) {
        int64_t cap = ctx->map_cap ? 2 * ctx->map_cap : 256;
        grad_slot *m = calloc((size_t)cap, sizeof *m);
        if (m == NULL) {
            (void)FERRY_NOMEM();
            return NULL;
        }
        for (int64_t i = 0; i < ctx->map_cap; i++) {
            if (ctx->map[i].key == NULL)
                continue;
            uint64_t k = ptr_hash(ctx->map[i].key) & (uint64_t)(cap - 1);
            while (m[k].key != NULL)
                k = (k + 1) & (uint64_t)(cap - 1);
            m[k] = ctx->map[i];
        }
        free(ctx->map);
        ctx->map = m;
        ctx->map_cap = cap;
    }
    if (ctx->map_cap == 0)
        return NULL;
    uint64_t k = ptr_hash(t) & (uint64_t)(ctx->map_cap - 1);
    while (ctx->map[k].key != NULL && ctx->map[k].key != t)
        k = (k + 1) & (uint64_t)(ctx->map_cap - 1);
    if (ctx->map[k].key == NULL) {
        if (!insert)
            return NULL;
        ctx->map[k].key = t;
        ctx->map_count++;
    }
    return &ctx->map[k];
}

ferry_status ferry_ctx_require_grad(ferry_ctx *ctx, const ferry_tensor *t) {
    return map_find(ctx, t, 1) ? FERRY_OK : FERRY_NOMEM();
}

ferry_tensor *ferry_ctx_grad_of(ferry_ctx *ctx, const ferry_tensor *t) {
    grad_slot *s = map_find(ctx, t, 0);
    return s ? s->grad : NULL;
}

ferry_status ferry_ctx_grad_accumulate(ferry_ctx *ctx, const ferry_tensor *t, ferry_tensor *g) {
    grad_slot *s = map_find(ctx, t, 0);
    if (s == NULL)
        return FERRY_OK;
    if (!ferry_shape_eq(g->shape, t->shape))
        return ferry_errorf(FERRY_ERR_SHAPE, "accumulated gradient has the wrong shape");
    if (s->grad == NULL) {
        s->grad = g;
        return FERRY_OK;
    }
    return ferry_backend_axpy(ctx->be, ferry_tensor_numel(g), 1.0f, g->data, s->grad->data);
}

/* ---- the tape ---- */

ferry_status ferry_ctx_record(ferry_ctx *ctx, ferry_backward_fn fn, void *saved, int nin,
                              ferry_tensor *const *in, int nout, ferry_tensor *const *out) {
    if (!ctx->training)
        return FERRY_OK;
    FERRY_ASSERT(nin <= FERRY_NODE_MAX_IO && nout <= FERRY_NODE_MAX_IO);
    if (ctx->nnodes == ctx->cap_nodes) {
        int cap = ctx->cap_nodes ? 2 * ctx->cap_nodes : 32;
        tape_node *n = realloc(ctx->nodes, (size_t)cap * sizeof *n);
        if (n == NULL)
            return FERRY_NOMEM();
        ctx->nodes = n;
        ctx->cap_nodes = cap;
    }
    tape_node *node = &ctx->nodes[ctx->nnodes++];
    memset(node, 0, sizeof *node);
    node->fn = fn;
    node->saved = saved;
    node->nin = nin;
    node->nout = nout;
    for (int i = 0; i < nin; i++)
        node->in[i] = in[i];
    for (int i = 0; i < nout; i++) {
        node->out[i] = out[i];
        /* Outputs of recorded nodes can carry gradients. */
        if (out[i] != NULL && map_find(ctx, out[i], 1) == NULL)
            return FERRY_NOMEM();
    }
    return FERRY_OK;
}

int ferry_ctx_tape_length(const ferry_ctx *ctx) {
    return ctx->nnodes;
}

/* The gradient tensor of t, created zero-filled on first use. */
static ferry_status grad_for(ferry_ctx *ctx, grad_slot *s, ferry_tensor **out) {
    if (s->grad == NULL) {
        ferry_status st = ferry_ctx_zeros(ctx, FERRY_DTYPE_F32, s->key->shape, &s->grad);
        if (st != FERRY_OK)
            return st;
    }
    *out = s->grad;
    return FERRY_OK;
}

ferry_status ferry_ctx_backward_from(ferry_ctx *ctx, int n, const ferry_tensor *const *outputs,
                                     const ferry_tensor *const *grads) {
    ferry_status st = ferry_ctx_backward_range(ctx, n, outputs, grads, 0, ctx->nnodes);
    ferry_status sy = ferry_ctx_sync(ctx); /* the whole tape: its gradients complete */
    return st != FERRY_OK ? st : sy;
}

ferry_status ferry_ctx_backward_range(ferry_ctx *ctx, int n, const ferry_tensor *const *outputs,
                                      const ferry_tensor *const *grads, int first, int end) {
    ferry_status st;
    if (first < 0 || end > ctx->nnodes || first > end)
        return ferry_errorf(FERRY_ERR_RANGE, "backward over nodes [%d, %d) of a tape of %d",
                            first, end, ctx->nnodes);
    for (int k = 0; k < n; k++) {
        grad_slot *s = map_find(ctx, outputs[k], 0);
        if (s == NULL)
            return ferry_errorf(FERRY_ERR_INVALID, "backward from a tensor no node produced");
        ferry_tensor *g;
        if ((st = grad_for(ctx, s, &g)) != FERRY_OK)
            return st;
        if (!ferry_shape_eq(g->shape, grads[k]->shape))
            return ferry_errorf(FERRY_ERR_SHAPE, "backward seed has the wrong shape");
        if ((st = ferry_backend_axpy(ctx->be, ferry_tensor_numel(g), 1.0f, grads[k]->data,
                                     g->data)) != FERRY_OK)
            return st;
    }
    for (int i = end - 1; i >= first; i--) {
        tape_node *node = &ctx->nodes[i];
        ferry_tensor *gout[FERRY_NODE_MAX_IO] = {0}, *gin[FERRY_NODE_MAX_IO] = {0};
        int any = 0;
        for (int k = 0; k < node->nout; k++) {
            grad_slot *s = node->out[k] ? map_find(ctx, node->out[k], 0) : NULL;
            gout[k] = s ? s->grad : NULL;
            any |= gout[k] != NULL;
        }
        if (!any)
            continue; /* nothing downstream depends on this node */
        for (int k = 0; k < node->nin; k++) {
            grad_slot *s = node->in[k] ? map_find(ctx, node->in[k], 0) : NULL;
            if (s != NULL && (st = grad_for(ctx, s, &gin[k])) != FERRY_OK)
                return st;
        }
        if ((st = node->fn(ctx, node->saved, gout, gin)) != FERRY_OK)
            return st;
    }
    return FERRY_OK;
}

ferry_status ferry_ctx_backward(ferry_ctx *ctx, const ferry_tensor *loss) {
    if (ferry_tensor_numel(loss) != 1)
        return ferry_errorf(FERRY_ERR_SHAPE, "backward needs a scalar loss");
    float one = 1.0f;
    ferry_tensor *seed;
    ferry_status st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, loss->shape, &seed);
    if (st != FERRY_OK)
        return st;
    if ((st = ferry_tensor_from_host(seed, &one)) != FERRY_OK)
        return st;
    const ferry_tensor *seed_c = seed;
    return ferry_ctx_backward_from(ctx, 1, &loss, &seed_c);
}
