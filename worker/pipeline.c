/* pipeline.c - the micro-batched distributed step (--micro-batches M).
 *
 * The window's T time steps are split into M chunks of consecutive steps, the
 * micro-batches. The trainer runs the LSTM over one chunk while a thread of its own
 * has the servers run the decoder on another, in forward and in backward:
 *
 *   trainer  emb | F0 F1 F2 F3 .  B3 B2 B1 B0 | emb-bwd clip step
 *   thread   emb |    D0 D1 D2 D3 d3 d2 d1 d0 | emb-bwd clip step
 *
 * Fc/Bc: the LSTM's forward/backward over chunk c in the trainer; Dc/dc: the
 * decoder's Forward/Backward of chunk c on the servers. A chunk's LSTM starts from
 * the previous chunk's final state (and hands the gradient of that state back in
 * backward), so the LSTM runs at the full batch width, exactly the recurrence of the
 * unpipelined step; the backward goes from the last chunk to the first, and the
 * decoder's backward of chunk c-1 runs while the trainer takes the LSTM back through
 * chunk c. Splitting batch columns instead was measured slower: the recurrent GEMM
 * (B x H) x (H x 4H) streams W_hh once per time step whatever B is, so M column
 * micro-batches read it M times (docs/architecture.md §2a).
 *
 * The embedding is looked up and its gradient sent once for the whole window, as
 * without micro-batches; the decoder gets one Forward/Backward pair per chunk and
 * accumulates its gradient in the context. The chunks record on the step's autograd
 * context one after another, each with its window set (ferry_ctx_set_window), so its
 * dropout masks are the unpipelined step's at its steps; each chunk's backward runs
 * over its own stretch of the tape (ferry_ctx_backward_range), and the LSTM's
 * gradient accumulates in the one context. Clipping and the optimizer steps run
 * once, as without micro-batches. */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/core/flags.h" /* ferry_env_int */
#include "common/core/log.h"
#include "common/tensor/backend.h"
#include "worker/model-impl.h" /* the model's fields */
#include "worker/pipeline.h"

/* A timeline's spans: the trainer's LSTM forward of a chunk, the decoder thread's
 * Forward and Backward calls of it, the trainer waiting for its dh, its backward. */
enum { SPAN_F, SPAN_D, SPAN_DB, SPAN_WAIT, SPAN_B, SPAN_KINDS };

struct ferry_lm_pipe {
    int M;
    /* Host staging, grown as needed, all (T, B, .) with chunk c at rows [t0, t1): the
     * window's embedding rows and their gradient (E), the hidden states going to the
     * decoder and their gradient coming back (H). */
    float *x, *dx, *hid, *dh;
    size_t cap_x, cap_dx, cap_h, cap_dh;
    /* Between the trainer and the decoder thread (mu): chunks whose hidden states are
     * ready (0, 1, ... in order), and chunks whose dh came back (M-1, M-2, ...). */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int posted, back, abort;
    /* The decoder thread lives as long as the pipe (a thread created per step would
     * start late whenever both cores are busy): steps counts the steps handed to it,
     * finished those it is done with; quit ends it. */
    pthread_t thread;
    int started, quit;
    uint64_t steps, finished;
    ferry_status st;
    char err[512];
    /* The step being run (read by the thread). */
    ferry_remote *dec;
    int wide; /* the last chunk's calls marked wide (no decoder slice here: the trainer
                 is idle while they run) */
    ferry_dist_ctx *dc;
    const int32_t *targets;
    int64_t T, B, H;
    int64_t Bg, col0; /* the job's global batch and this rank's first column of it */
    float scale;
    uint64_t call[FERRY_LM_MAX_MICRO];
    double loss[FERRY_LM_MAX_MICRO];
    double remote_busy; /* seconds the thread spent in decoder calls this step */
    /* Totals since the last ferry_lm_pipe_take_stats. */
    ferry_lm_pipe_stats acc;
    /* The step's timeline (FERRY_PIPE_TRACE=N logs that of every Nth step this pipe
     * ran): per chunk, the start and end of each span in seconds from the step's start;
     * each thread writes its own spans, read once the thread finished the step. */
    int trace_every;
    double t_start;
    double span[FERRY_LM_MAX_MICRO][SPAN_KINDS][2];
    double sync[2]; /* the trainer waiting for the helper's weight gradients */
};

/* First step of chunk c of M over T steps. */
static int64_t t0_of(int64_t T, int M, int c) {
    return (int64_t)c * T / M;
}

ferry_status ferry_lm_pipe_create(int M, ferry_lm_pipe **out) {
    if (M < 1 || M > FERRY_LM_MAX_MICRO)
        return ferry_errorf(FERRY_ERR_RANGE, "--micro-batches %d outside 1..%d", M,
                            FERRY_LM_MAX_MICRO);
    ferry_lm_pipe *p = calloc(1, sizeof *p);
    if (p == NULL)
        return FERRY_NOMEM();
    p->M = M;
    p->trace_every = ferry_env_int("FERRY_PIPE_TRACE", 1, INT_MAX, 0); /* every Nth step */
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    *out = p;
    return FERRY_OK;
}

void ferry_lm_pipe_destroy(ferry_lm_pipe *p) {
    if (p == NULL)
        return;
    if (p->started) {
        pthread_mutex_lock(&p->mu);
        p->quit = 1;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->thread, NULL);
    }
    free(p->x);
    free(p->dx);
    free(p->hid);
    free(p->dh);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

int ferry_lm_pipe_micro(const ferry_lm_pipe *p) {
    return p->M;
}

void ferry_lm_pipe_take_stats(ferry_lm_pipe *p, ferry_lm_pipe_stats *out) {
    *out = p->acc;
    memset(&p->acc, 0, sizeof p->acc);
}

static ferry_status grow(float **buf, size_t *cap, size_t nbytes) {
    if (nbytes <= *cap)
        return FERRY_OK;
    float *n = realloc(*buf, nbytes);
    if (n == NULL)
        return FERRY_NOMEM();
    *buf = n;
    *cap = nbytes;
    return FERRY_OK;
}

/* Marks the start (end 0) or end (1) of chunk c's span of kind k, now, if traced. */
static void mark(ferry_lm_pipe *p, int c, int k, int end) {
    if (p->trace_every > 0)
        p->span[c][k][end] = ferry_now() - p->t_start;
}

/* ---- the decoder thread: Forward of every chunk in order, then Backward in reverse ---- */

static void thread_fail(ferry_lm_pipe *p, ferry_status st) {
    pthread_mutex_lock(&p->mu);
    p->st = st;
    (void)snprintf(p->err, sizeof p->err, "%s", ferry_error_last());
    p->abort = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static void decoder_step(ferry_lm_pipe *p) {
    int64_t BH = p->B * p->H;
    for (int c = 0; c < p->M; c++) {
        pthread_mutex_lock(&p->mu);
        while (p->posted <= c && !p->abort)
            pthread_cond_wait(&p->cv, &p->mu);
        int stop = p->abort;
        pthread_mutex_unlock(&p->mu);
        if (stop)
            return;
        int64_t t0 = t0_of(p->T, p->M, c), steps = t0_of(p->T, p->M, c + 1) - t0;
        double t = ferry_now();
        mark(p, c, SPAN_D, 0);
        /* The last chunk's Forward and Backward are the turn: the trainer has nothing
         * to run until its dh is back, so the server may use the core it leaves. */
        if (c == p->M - 1 && p->wide)
            ferry_remote_set_wide(p->dec, 1);
        ferry_status st = ferry_remote_xent_forward(p->dec, p->dc, p->hid + t0 * BH,
                                                    p->targets + t0 * p->B, steps * p->B, NULL,
                                                    &p->loss[c], &p->call[c]);
        mark(p, c, SPAN_D, 1);
        p->remote_busy += ferry_now() - t;
        if (st != FERRY_OK) {
            ferry_remote_set_wide(p->dec, 0);
            thread_fail(p, st);
            return;
        }
    }
    for (int c = p->M - 1; c >= 0; c--) {
        int64_t t0 = t0_of(p->T, p->M, c);
        double t = ferry_now();
        mark(p, c, SPAN_DB, 0);
        ferry_status st =
            ferry_remote_xent_backward(p->dec, p->dc, p->call[c], NULL, p->scale, p->dh + t0 * BH);
        ferry_remote_set_wide(p->dec, 0);
        mark(p, c, SPAN_DB, 1);
        p->remote_busy += ferry_now() - t;
        if (st != FERRY_OK) {
            thread_fail(p, st);
            return;
        }
        pthread_mutex_lock(&p->mu);
        p->back = p->M - c; /* chunks M-1 .. c are back */
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

/* The thread: one decoder_step per step handed to it, until quit. */
static void *decoder_thread(void *arg) {
    ferry_lm_pipe *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->finished == p->steps && !p->quit)
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->quit)
            break;
        pthread_mutex_unlock(&p->mu);
        decoder_step(p);
        pthread_mutex_lock(&p->mu);
        p->finished++;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void post(ferry_lm_pipe *p, int c) {
    pthread_mutex_lock(&p->mu);
    p->posted = c + 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Waits until chunk c's dh is back; the thread's error otherwise. */
static ferry_status wait_back(ferry_lm_pipe *p, int c) {
    int need = p->M - c;
    pthread_mutex_lock(&p->mu);
    while (p->back < need && p->st == FERRY_OK)
        pthread_cond_wait(&p->cv, &p->mu);
    ferry_status st = p->back >= need ? FERRY_OK : p->st;
    pthread_mutex_unlock(&p->mu);
    return st;
}

/* ---- the trainer's side ---- */

typedef struct chunk {
    int first, end;         /* its nodes on the step's tape */
    ferry_tensor *x;        /* its embedding rows: a leaf whose gradient goes to dx */
    ferry_tensor *y, *h, *c; /* its hidden states (to the decoder) and final state */
} chunk;

/* Chunk c's forward on the step's tape: embedding rows -> dropout -> LSTM from the
 * state (h_in, c_in) -> dropout; its hidden states go to the host for the thread.
 * The window is set and the random stream rewound, so its masks are the unpipelined
 * step's at its time steps. */
static ferry_status chunk_forward(ferry_lm *lm, ferry_lm_pipe *p, ferry_ctx *ctx, uint64_t seed,
                                  chunk *k, int c, const ferry_tensor *h_in,
                                  const ferry_tensor *c_in) {
    int64_t T = p->T, B = p->B, E = lm->cfg.E, H = lm->cfg.H;
    int64_t t0 = t0_of(T, p->M, c), steps = t0_of(T, p->M, c + 1) - t0;
    float pdrop = lm->cfg.dropout;
    ferry_tensor *xd, *y;
    ferry_status st;
    ferry_ctx_set_seed(ctx, seed);
    ferry_ctx_set_window(ctx, T, p->Bg, t0, steps, p->col0, B);
    k->first = ferry_ctx_tape_length(ctx);
    if ((st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, ferry_shape_3d(steps, B, E), &k->x)) !=
            FERRY_OK ||
        (st = ferry_tensor_from_host(k->x, p->x + t0 * B * E)) != FERRY_OK ||
        (st = ferry_ctx_require_grad(ctx, k->x)) != FERRY_OK)
        return st;
    if ((st = ferry_dropout_forward(ctx, pdrop, k->x, &xd)) != FERRY_OK ||
        (st = ferry_lm_stack_forward(lm, ctx, p->dc, xd, h_in, c_in,
                                     (c == 0 ? FERRY_LM_CARRIED : 0) |
                                         (c == p->M - 1 ? FERRY_LM_CARRY : 0),
                                     &y, &k->h, &k->c)) != FERRY_OK ||
        (st = ferry_dropout_forward(ctx, pdrop, y, &k->y)) != FERRY_OK)
        return st;
    k->end = ferry_ctx_tape_length(ctx);
    return ferry_backend_copy(lm->be, p->hid + t0 * B * H, k->y->data, ferry_tensor_nbytes(k->y),
                              FERRY_COPY_DEVICE_TO_HOST);
}

/* Chunk c's backward over its nodes, from its hidden states' gradient (back from the
 * decoder); the gradient of its final state is already in the context (chunk c+1's
 * backward put it there), and the one of its start state stays there for chunk c-1.
 * Its embedding rows' gradient goes to dx. */
static ferry_status chunk_backward(ferry_lm *lm, ferry_lm_pipe *p, ferry_ctx *ctx, chunk *k,
                                   int c) {
    int64_t T = p->T, B = p->B, E = lm->cfg.E, H = lm->cfg.H;
    int64_t t0 = t0_of(T, p->M, c);
    ferry_tensor *g;
    ferry_status st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, k->y->shape, &g);
    if (st == FERRY_OK)
        st = ferry_tensor_from_host(g, p->dh + t0 * B * H);
    const ferry_tensor *roots[1] = {k->y}, *seeds[1] = {g};
    if (st == FERRY_OK)
        st = ferry_ctx_backward_range(ctx, 1, roots, seeds, k->first, k->end);
    if (st != FERRY_OK)
        return st;
    ferry_tensor *gx = ferry_ctx_grad_of(ctx, k->x);
    float *dx = p->dx + t0 * B * E;
    if (gx == NULL) { /* nothing reached the rows: a zero gradient */
        memset(dx, 0, ferry_tensor_nbytes(k->x));
        return FERRY_OK;
    }
    return ferry_backend_copy(lm->be, dx, gx->data, ferry_tensor_nbytes(k->x),
                              FERRY_COPY_DEVICE_TO_HOST);
}

/* Logs the step's timeline, a line per chunk and one for the step: each span's start
 * and end in ms from the step's start (its embedding Forward). The decoder's calls are
 * timed on the trainer's decoder thread, wire included. */
static void log_timeline(const ferry_lm_pipe *p) {
    unsigned long long n = (unsigned long long)p->steps;
    for (int c = 0; c < p->M; c++) {
        const double(*s)[2] = p->span[c];
        FERRY_LOG_INFO("pipeline: timeline of pipelined step %llu, chunk %d/%d (ms): F %.1f-%.1f "
                       "D %.1f-%.1f d %.1f-%.1f wait %.1f-%.1f B %.1f-%.1f",
                       n, c, p->M, s[SPAN_F][0] * 1e3, s[SPAN_F][1] * 1e3, s[SPAN_D][0] * 1e3,
                       s[SPAN_D][1] * 1e3, s[SPAN_DB][0] * 1e3, s[SPAN_DB][1] * 1e3,
                       s[SPAN_WAIT][0] * 1e3, s[SPAN_WAIT][1] * 1e3, s[SPAN_B][0] * 1e3,
                       s[SPAN_B][1] * 1e3);
    }
    FERRY_LOG_INFO("pipeline: timeline of pipelined step %llu (ms): weight gradients joined "
                   "%.1f-%.1f",
                   n, p->sync[0] * 1e3, p->sync[1] * 1e3);
}

/* Every chunk forward, posting each to the thread; then every chunk backward as its
 * dh comes back, last chunk first. All on the step's context and tape. */
static ferry_status run_chunks(ferry_lm *lm, ferry_lm_pipe *p, ferry_ctx *ctx, uint64_t seed,
                               double *busy) {
    chunk k[FERRY_LM_MAX_MICRO];
    ferry_status st;
    double t = ferry_now();
    /* The carried state, copied: it is overwritten below, before backward. */
    ferry_tensor *h0, *c0;
    if ((st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, lm->h->shape, &h0)) != FERRY_OK ||
        (st = ferry_ctx_tensor(ctx, FERRY_DTYPE_F32, lm->c->shape, &c0)) != FERRY_OK ||
        (st = ferry_backend_copy(lm->be, h0->data, lm->h->data, ferry_tensor_nbytes(h0),
                                 FERRY_COPY_DEVICE_TO_DEVICE)) != FERRY_OK ||
        (st = ferry_backend_copy(lm->be, c0->data, lm->c->data, ferry_tensor_nbytes(c0),
                                 FERRY_COPY_DEVICE_TO_DEVICE)) != FERRY_OK)
        return st;
    for (int c = 0; c < p->M; c++) {
        mark(p, c, SPAN_F, 0);
        if ((st = chunk_forward(lm, p, ctx, seed, &k[c], c, c == 0 ? h0 : k[c - 1].h,
                                c == 0 ? c0 : k[c - 1].c)) != FERRY_OK)
            return st;
        mark(p, c, SPAN_F, 1);
        post(p, c);
    }
    /* Truncated BPTT: the next window starts from the last chunk's state, detached. */
    const chunk *last = &k[p->M - 1];
    if ((st = ferry_backend_copy(lm->be, lm->h->data, last->h->data, ferry_tensor_nbytes(lm->h),
                                 FERRY_COPY_DEVICE_TO_DEVICE)) != FERRY_OK ||
        (st = ferry_backend_copy(lm->be, lm->c->data, last->c->data, ferry_tensor_nbytes(lm->c),
                                 FERRY_COPY_DEVICE_TO_DEVICE)) != FERRY_OK)
        return st;
    *busy = ferry_now() - t;
    for (int c = p->M - 1; c >= 0; c--) {
        mark(p, c, SPAN_WAIT, 0);
        if ((st = wait_back(p, c)) != FERRY_OK)
            return st; /* the thread's error: its message is the step's */
        mark(p, c, SPAN_WAIT, 1);
        t = ferry_now();
        mark(p, c, SPAN_B, 0);
        st = chunk_backward(lm, p, ctx, &k[c], c);
        mark(p, c, SPAN_B, 1);
        *busy += ferry_now() - t;
        if (st != FERRY_OK)
            return st;
    }
    return FERRY_OK;
}

ferry_status ferry_lm_pipe_forward_backward(ferry_lm *lm, ferry_lm_pipe *p, ferry_ctx *ctx,
                                            ferry_dist_ctx *dc, const ferry_tensor *inputs,
                                            const ferry_tensor *targets, float loss_scale,
                                            uint64_t seed, int64_t batch, int64_t col0,
                                            double *loss_sum) {
    if (inputs->shape.ndim != 2 || !ferry_shape_eq(inputs->shape, targets->shape))
        return ferry_errorf(FERRY_ERR_SHAPE, "model: inputs and targets must both be (T, B)");
    int64_t T = inputs->shape.dim[0], B = inputs->shape.dim[1];
    int64_t E = lm->cfg.E, H = lm->cfg.H;
    ferry_status st;
    if (lm->dec_remote == NULL || lm->decoder_mode != FERRY_DECODER_SHARDED)
        return ferry_errorf(FERRY_ERR_UNSUPPORTED, "micro-batches need the decoder on ferry-ps "
                            "with --decoder-mode sharded-softmax");
    if (T < p->M)
        return ferry_errorf(FERRY_ERR_INVALID, "%d micro-batches of a window of %lld time steps:"
                            " at most one per step (lower --micro-batches or raise --bptt)",
                            p->M, (long long)T);
    double t_start = ferry_now();
    p->t_start = t_start;
    size_t nx = (size_t)(T * B * E) * sizeof(float), nh = (size_t)(T * B * H) * sizeof(float);
    if ((st = grow(&p->x, &p->cap_x, nx)) != FERRY_OK ||
        (st = grow(&p->dx, &p->cap_dx, nx)) != FERRY_OK ||
        (st = grow(&p->hid, &p->cap_h, nh)) != FERRY_OK ||
        (st = grow(&p->dh, &p->cap_dh, nh)) != FERRY_OK)
        return st;
    uint64_t emb_call = 0;
    if ((st = ferry_remote_embedding_forward(lm->emb_remote, dc, inputs->data, T * B, p->x,
                                             &emb_call)) != FERRY_OK)
        return st;
    p->dec = lm->dec_remote;
    p->wide = lm->local_vocab == 0;
    p->dc = dc;
    p->targets = targets->data;
    p->T = T;
    p->B = B;
    p->Bg = batch > 0 ? batch : B;
    p->col0 = batch > 0 ? col0 : 0;
    p->H = H;
    p->scale = loss_scale;
    p->posted = p->back = p->abort = 0;
    p->st = FERRY_OK;
    p->err[0] = '\0';
    p->remote_busy = 0.0;
    if (!p->started) {
        if (pthread_create(&p->thread, NULL, decoder_thread, p) != 0)
            return ferry_errorf(FERRY_ERR_RESOURCE, "cannot start the pipeline's decoder thread");
        p->started = 1;
    }
    pthread_mutex_lock(&p->mu);
    p->steps++;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    double busy = 0.0;
    st = run_chunks(lm, p, ctx, seed, &busy);
    pthread_mutex_lock(&p->mu);
    p->abort = 1; /* a thread still waiting for a chunk stops (after an error here) */
    pthread_cond_broadcast(&p->cv);
    while (p->finished != p->steps)
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    /* The LSTM's weight gradients, formed on the context's helper thread while the
     * chunks' recurrences ran (model.c turns deferral on), are complete now. */
    if (p->trace_every > 0)
        p->sync[0] = ferry_now() - t_start;
    ferry_status sy = ferry_ctx_sync(ctx);
    if (p->trace_every > 0)
        p->sync[1] = ferry_now() - t_start;
    if (st == FERRY_OK)
        st = sy;
    if (p->st != FERRY_OK) /* the thread failed first: its message names the call */
        return ferry_errorf(p->st, "%s", p->err);
    if (st != FERRY_OK)
        return st;
    if ((st = ferry_remote_embedding_backward(lm->emb_remote, dc, emb_call, p->dx)) != FERRY_OK)
        return st;
    *loss_sum = 0.0;
    for (int c = 0; c < p->M; c++)
        *loss_sum += p->loss[c];
    p->acc.steps++;
    p->acc.wall_s += ferry_now() - t_start;
    p->acc.trainer_busy_s += busy;
    p->acc.servers_busy_s += p->remote_busy;
    if (p->trace_every > 0 && p->steps % (uint64_t)p->trace_every == 0)
        log_timeline(p);
    return FERRY_OK;
}
