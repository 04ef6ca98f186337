/* test_pipeline.c - the micro-batched (pipelined) distributed step against the
 * unpipelined one. Two runs from the same seed, each against its own in-process
 * ferry-ps servers over real gRPC: the unpipelined step (no pipe) and M micro-batches.
 * Over 50 steps of PTB their losses must agree within 1e-5 relative, and afterwards
 * every parameter element (the trainer's LSTM, the servers' embedding and decoder)
 * within 1e-5 (|a - b| <= 1e-5 (1 + |b|)): with dropout off and on (the masks of a
 * micro-batch are the whole window's at its time steps), with a Stiefel-constrained
 * LSTM, uneven micro-batches and two shards. That the pipelined run was pipelined is
 * read off its counters: its pipe ran every step, and each server got M decoder
 * Forwards and Backwards per step where the unpipelined run sent one. The pipeline
 * with one micro-batch (the pipe forced on with M = 1) must be the unpipelined step
 * bit for bit: every loss and every parameter, compared by their bits; and
 * ferry_lm_set_micro_batches(lm, 1) leaves no pipe (the trainer's default is the
 * unpipelined step). The same holds with a slice of the decoder's vocabulary in the
 * trainer (--local-vocab), pipelined or not, against the run with every decoder row on
 * the servers. The last micro-batch's decoder calls are marked wide, and the servers
 * ran their GEMMs on two threads (their counters say so) with no bit changed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/backend/cpu/cpu.h" /* ferry__cpu_gemm_split_ok */
#include "server/ps.h"
#include "worker/batch.h"
#include "worker/corpus.h"
#include "worker/model-impl.h" /* the model's fields */
#include "worker/pipeline.h"

/* 50 steps; 20 under the sanitizers (several times slower there), which look for
 * memory and undefined-behaviour errors, not for drift: the release build checks that. */
#ifdef FERRY_SANITIZE
#define STEPS 20
#else
#define STEPS 50
#endif
/* At lr 1 any two summation orders drift apart past 1e-5 after ~25 steps (rounding
 * amplified by the step, docs/architecture.md section 11); 0.1 keeps 50 steps of
 * honest comparison. */
#define LR 0.1
#define MAX_SERVERS 2

typedef struct run {
    ferry_ps_server *srv[MAX_SERVERS];
    ferry_cluster *cl;
    ferry_dist_ctx *dc;
    ferry_lm *lm;
    ferry_optim *opt;
    ferry_ctx *ctx;
} run;

/* An in-process ferry-ps on an ephemeral port of 127.0.0.1. */
static ferry_ps_server *server_up(void) {
    ferry_ps_config pc;
    ferry_ps_server *srv;
    ferry_ps_config_default(&pc);
    pc.listen = "127.0.0.1:0";
    CHECK_OK(ferry_ps_server_create(&pc, &srv));
    CHECK_OK(ferry_ps_server_start(srv));
    return srv;
}

/* M micro-batches; M = 1 is the unpipelined step (no pipe), M = 0 the pipe forced on
 * with one micro-batch. */
static void run_init(run *r, int nservers, const ferry_lm_config *mc, int M, int64_t local_vocab) {
    ferry_backend *be = ferry_backend_cpu();
    char targets[256] = "";
    for (int i = 0; i < nservers; i++) {
        r->srv[i] = server_up();
        size_t n = strlen(targets);
        snprintf(targets + n, sizeof targets - n, "%s127.0.0.1:%d", i ? "," : "",
                 ferry_ps_server_port(r->srv[i]));
    }
    CHECK_OK(ferry_ps_connect(targets, NULL, &r->cl));
    CHECK_OK(ferry_dist_ctx_create(r->cl, &r->dc));
    ferry_optim_config oc = ferry_optim_defaults(FERRY_OPTIM_SGD);
    oc.lr = LR;
    ferry_lm_placement pl = {.cluster = r->cl,
                             .decoder_mode = FERRY_DECODER_SHARDED,
                             .optim = oc,
                             .job = NULL,
                             .resume = 0,
                             .stages = NULL,
                             .local_vocab = local_vocab};
    CHECK_OK(ferry_lm_create_placed(be, mc, &pl, &r->lm));
    CHECK_OK(ferry_lm_set_micro_batches(r->lm, M > 0 ? M : 1));
    CHECK(r->lm->pipe == NULL || M > 1); /* one micro-batch is the unpipelined step */
    if (M == 0)                          /* the pipelined code path with a single micro-batch */
        CHECK_OK(ferry_lm_pipe_create(1, &r->lm->pipe));
    CHECK_OK(ferry_optim_create(&r->lm->P, &oc, &r->opt));
    CHECK_OK(ferry_ctx_create(be, &r->ctx));
}

static void run_deinit(run *r, int nservers) {
    ferry_ctx_destroy(r->ctx);
    ferry_optim_destroy(r->opt);
    ferry_lm_destroy(r->lm);
    ferry_dist_ctx_destroy(r->dc);
    ferry_cluster_destroy(r->cl);
    for (int i = 0; i < nservers; i++)
        ferry_ps_server_destroy(r->srv[i]);
}

/* A copy of rows x cols of a module's parameter, read from its servers. */
static float *remote_read(ferry_remote *m, const char *param, int64_t rows, int64_t cols) {
    float *x = malloc((size_t)(rows * cols) * sizeof *x);
    CHECK(x != NULL);
    CHECK_OK(ferry_remote_get_params(m, param, 0, rows, x));
    return x;
}

/* Two runs' copies of one parameter: with tol 0 they must be bit-identical, else every
 * element within tol (|a - b| <= tol (1 + |b|)). Returns ||a - b|| / ||b||. */
static double compare(const char *what, const float *a, const float *b, int64_t n, double tol) {
    if (tol == 0.0)
        CHECK_SAME_BITS(what, a, b, n);
    else
        CHECK_CLOSE_F(what, a, b, n, tol, tol);
    return ferry_norm_rel(a, b, n);
}

/* compare() of a module's parameter in two runs, read from their servers. */
static double remote_compare(ferry_remote *a, ferry_remote *b, const char *param, int64_t rows,
                             int64_t cols, double tol) {
    float *x = remote_read(a, param, rows, cols), *y = remote_read(b, param, rows, cols);
    double rel = compare(param, x, y, rows * cols, tol);
    free(x);
    free(y);
    return rel;
}

/* Calls of `method` this run's client sent to server i. */
static uint64_t calls_to(run *r, int i, const char *method) {
    ferry_call_stats cs;
    CHECK_OK(ferry_cluster_call_stats(r->cl, i, method, &cs));
    return cs.calls;
}

static void add_value(void *user, const char *name, double value) {
    (void)name;
    *(double *)user += value;
}

/* Server i's count of calls marked wide that found a worker idle (hints taken). */
static double wide_calls(run *r, int i) {
    double n = 0.0;
    CHECK_OK(ferry_cluster_metrics(r->cl, i, "wide_calls", add_value, &n));
    return n;
}

/* Runs the reference (unpipelined) and a run with M micro-batches (M = 0: the pipe
 * forced on with one; M = 1: unpipelined too, to compare a local vocabulary slice)
 * for STEPS steps. tol > 0: every step's loss within tol relative, every parameter
 * element within tol (compare()); tol = 0: every loss and parameter bit-identical.
 * Returns the worst relative difference seen (losses, and parameters in norm). */
static double pipeline_case(int nservers, float dropout, float stiefel, int M, int64_t local_vocab,
                            double tol) {
    ferry_backend *be = ferry_backend_cpu();
    ferry_corpus *corpus;
    CHECK_OK(ferry_corpus_load(ferry_test_path("data/ptb"), &corpus));
    int64_t n;
    const int32_t *ids = ferry_corpus_ids(corpus, FERRY_SPLIT_TRAIN, &n);
    ferry_batches *b;
    CHECK_OK(ferry_batch_create(ids, 20 * (STEPS * 20 + 1), 20, &b));
    int64_t V = ferry_vocab_size(ferry_corpus_vocab(corpus));
    ferry_lm_config mc = {V, 64, 64, 2, dropout, 0.1f, stiefel, 7};
    run ref, pipe;
    uint64_t splits0 = ferry_cpu_gemm_splits();
    run_init(&ref, nservers, &mc, 1, 0);
    run_init(&pipe, nservers, &mc, M, local_vocab);
    CHECK(ref.lm->pipe == NULL && (pipe.lm->pipe != NULL) == (M != 1));

    double worst = 0.0, first = 0.0, last = 0.0;
    for (int s = 0; s < STEPS; s++) {
        ferry_window w;
        CHECK_OK(ferry_batch_window(b, (int64_t)s * 20, 20, &w));
        ferry_shape sh = ferry_shape_2d(w.T, w.B);
        ferry_tensor in = ferry_tensor_wrap(be, FERRY_DTYPE_I32, sh, (void *)(uintptr_t)w.inputs);
        ferry_tensor tg = ferry_tensor_wrap(be, FERRY_DTYPE_I32, sh, (void *)(uintptr_t)w.targets);
        ferry_lm_step_args a = {.loss_scale = 1.0f / 20.0f, .clip = 5.0f, .lr = LR, .ctx_id = (uint64_t)s + 1, .seed = 1000 + (uint64_t)s, .job_step = 0};
        ferry_lm_step_result rr, rp;
        CHECK_OK(ferry_lm_train_step(ref.lm, ref.ctx, ref.dc, ref.opt, &in, &tg, &a, &rr));
        CHECK_OK(ferry_lm_train_step(pipe.lm, pipe.ctx, pipe.dc, pipe.opt, &in, &tg, &a, &rp));
        double rel = fabs(rp.loss_sum - rr.loss_sum) / fabs(rr.loss_sum);
        worst = rel > worst ? rel : worst;
        if (rel > tol)
            fprintf(stderr, "  step %d: unpipelined %.9g M=%d %.9g (rel %.3g)\n", s + 1,
                    rr.loss_sum, M, rp.loss_sum, rel);
        CHECK(rel <= tol);
        if (tol == 0.0)
            CHECK_BITS_EQ(rp.loss_sum, rr.loss_sum);
        if (s == 0)
            first = rr.loss_sum;
        last = rr.loss_sum;
    }
    CHECK(last < first); /* it trained */
    /* The trainer's block: the LSTM (first), then a local decoder slice if any (read
     * back with the servers' rows below). */
    double lstm = compare("lstm", pipe.lm->P.data, ref.lm->P.data, ref.lm->P.numel, tol);
    double enc = remote_compare(pipe.lm->emb_remote, ref.lm->emb_remote, "weight", V, 64, tol);
    double decw = remote_compare(pipe.lm->dec_remote, ref.lm->dec_remote, "weight", V, 64, tol);
    double decb = remote_compare(pipe.lm->dec_remote, ref.lm->dec_remote, "bias", V, 1, tol);
    fprintf(stderr,
            "  %d server%s, dropout %.1f, stiefel %.1f, M=%d%s, local vocab %lld: loss "
            "%.4f -> %.4f, worst loss rel %.3g; params rel lstm %.3g encoder %.3g decoder "
            "%.3g/%.3g\n",
            nservers, nservers > 1 ? "s" : "", (double)dropout, (double)stiefel, M > 0 ? M : 1,
            pipe.lm->pipe != NULL ? " (pipelined)" : "", (long long)local_vocab, first / 400.0,
            last / 400.0, worst, lstm, enc, decw, decb);
    worst = fmax(worst, fmax(fmax(lstm, enc), fmax(decw, decb)));

    /* A pipelined run ran its pipe every step, and it was cut into micro-batches:
     * each server got M decoder Forwards and Backwards per step where the unpipelined
     * run sent one of each (the embedding's calls are the same in both runs). */
    int micro = M > 0 ? M : 1;
    if (pipe.lm->pipe != NULL) {
        ferry_lm_pipe_stats ps;
        ferry_lm_pipe_take_stats(pipe.lm->pipe, &ps);
        CHECK_EQ(ps.steps, STEPS);
        CHECK_EQ(ferry_lm_pipe_micro(pipe.lm->pipe), micro);
    }
    for (int i = 0; i < nservers; i++) {
        CHECK_EQ(calls_to(&pipe, i, "Forward") - calls_to(&ref, i, "Forward"),
                 (uint64_t)(micro - 1) * STEPS);
        CHECK_EQ(calls_to(&pipe, i, "Backward") - calls_to(&ref, i, "Backward"),
                 (uint64_t)(micro - 1) * STEPS);
    }
    /* The last micro-batch's decoder Forward and Backward are marked wide (without a
     * local vocabulary slice): a server with a worker idle ran their GEMMs on two
     * threads, which changed no bit above. Its other calls, and the unpipelined run's,
     * are not marked. How many found a worker idle depends on timing (a call that
     * found both busy ran on one thread): at most two per step, and some. */
    int wide = pipe.lm->pipe != NULL && local_vocab == 0;
    for (int i = 0; i < nservers; i++) {
        CHECK(wide_calls(&ref, i) == 0.0);
        if (wide) {
            double w = wide_calls(&pipe, i);
            fprintf(stderr, "  server %d: %.0f wide calls in %d steps\n", i, w, STEPS);
            CHECK(w >= 1 && w <= 2 * STEPS);
        } else {
            CHECK(wide_calls(&pipe, i) == 0.0);
        }
    }
    /* ... and their GEMMs were split (this process's servers share one helper thread,
     * so two shards' calls at once split one of them), unless OpenBLAS's kernels here
     * round a 48-row cut differently, when nothing is. */
    uint64_t splits = ferry_cpu_gemm_splits() - splits0;
    if (wide && ferry__cpu_gemm_split_ok())
        CHECK(splits >= 1);
    else
        CHECK(splits == 0);
    /* Every step freed its context. */
    for (int i = 0; i < nservers; i++) {
        ferry_ps_stats st;
        CHECK_OK(ferry_cluster_stats(pipe.cl, i, &st));
        CHECK_EQ(st.contexts_live, 0);
        CHECK_EQ(st.contexts_stepped, STEPS);
    }
    run_deinit(&pipe, nservers);
    run_deinit(&ref, nservers);
    ferry_batch_destroy(b);
    ferry_corpus_destroy(corpus);
    return worst;
}

/* The pipeline's code path with one micro-batch against the unpipelined step. */
TEST(one_micro_batch_is_the_unpipelined_step) {
    CHECK(pipeline_case(1, 0.5f, 0.0f, 0, 0, 0.0) == 0.0); /* bit for bit */
}

TEST(dropout_off_matches) {
    pipeline_case(1, 0.0f, 0.0f, 4, 0, 1e-5);
}

TEST(dropout_on_matches) {
    pipeline_case(1, 0.5f, 0.0f, 4, 0, 1e-5);
}

TEST(uneven_micro_batches_with_stiefel) {
    pipeline_case(1, 0.3f, 0.1f, 3, 0, 1e-5); /* 20 steps: 6, 7, 7 */
}

TEST(two_shards) {
    pipeline_case(2, 0.5f, 0.0f, 2, 0, 1e-5);
}

/* The vocabulary's last rows in the trainer: its partials join the servers' in the
 * sharded softmax, its dh is summed with theirs, its rows train in the local step. */
TEST(local_vocab_slice_unpipelined) {
    pipeline_case(1, 0.0f, 0.0f, 1, 3000, 1e-5);
}

TEST(local_vocab_slice_pipelined_dropout_stiefel) {
    pipeline_case(1, 0.5f, 0.1f, 4, 5000, 1e-5);
}

TEST(local_vocab_slice_two_shards) {
    pipeline_case(2, 0.3f, 0.0f, 3, 1234, 1e-5);
}

TEST(local_vocab_is_checked) {
    ferry_ps_server *srv = server_up();
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", ferry_ps_server_port(srv));
    ferry_cluster *cl;
    CHECK_OK(ferry_ps_connect(target, NULL, &cl));
    ferry_lm_config mc = {100, 8, 8, 1, 0.0f, 0.1f, 0.0f, 1};
    ferry_optim_config oc = ferry_optim_defaults(FERRY_OPTIM_SGD);
    ferry_lm *lm;
    /* The whole vocabulary, a negative count, or the logits decoder: one line each. */
    int64_t bad[2] = {100, -1};
    for (int i = 0; i < 2; i++) {
        ferry_lm_placement pl = {.cluster = cl,
                                 .decoder_mode = FERRY_DECODER_SHARDED,
                                 .optim = oc,
                                 .job = NULL,
                                 .resume = 0,
                                 .stages = NULL,
                                 .local_vocab = bad[i]};
        CHECK_EQ(ferry_lm_create_placed(ferry_backend_cpu(), &mc, &pl, &lm), FERRY_ERR_INVALID);
        CHECK(strstr(ferry_error_last(), "--local-vocab") != NULL);
    }
    ferry_lm_placement pl = {.cluster = cl,
                             .decoder_mode = FERRY_DECODER_LOGITS,
                             .optim = oc,
                             .job = NULL,
                             .resume = 0,
                             .stages = NULL,
                             .local_vocab = 10};
    CHECK_EQ(ferry_lm_create_placed(ferry_backend_cpu(), &mc, &pl, &lm), FERRY_ERR_INVALID);
    CHECK(strstr(ferry_error_last(), "sharded-softmax") != NULL);
    /* The C API: local rows on a module that is no decoder, or leaving no row to a
     * server; the logits calls of a decoder with a local slice; a Backward without
     * gradient accumulators. */
    ferry_remote_config rc;
    ferry_remote *m;
    ferry_remote_config_default(&rc, FERRY_REMOTE_EMBEDDING, "lv-emb", 100, 8);
    rc.local_rows = 10;
    CHECK_EQ(ferry_remote_create(cl, &rc, &m), FERRY_ERR_INVALID);
    CHECK(strstr(ferry_error_last(), "local rows") != NULL);
    ferry_remote_config_default(&rc, FERRY_REMOTE_DECODER, "lv-dec", 100, 8);
    rc.local_rows = 100;
    CHECK_EQ(ferry_remote_create(cl, &rc, &m), FERRY_ERR_INVALID);
    rc.local_rows = 40;
    CHECK_OK(ferry_remote_create(cl, &rc, &m));
    float w[40 * 8] = {0}, bias[40] = {0}, h[2 * 8] = {0}, logits[2 * 100], dh[2 * 8];
    int32_t tg[2] = {3, 97};
    double loss;
    uint64_t call;
    ferry_dist_ctx *dc;
    CHECK_OK(ferry_dist_ctx_create(cl, &dc));
    CHECK(ferry_dist_ctx_begin(dc) != 0);
    CHECK_EQ(ferry_remote_xent_forward(m, dc, h, tg, 2, NULL, &loss, &call), FERRY_ERR_INVALID);
    CHECK(strstr(ferry_error_last(), "ferry_remote_decoder_set_local") != NULL);
    CHECK_OK(ferry_remote_decoder_set_local(m, ferry_backend_cpu(), w, bias, NULL, NULL));
    CHECK_EQ(ferry_remote_logits_forward(m, dc, h, 2, logits, &call), FERRY_ERR_UNSUPPORTED);
    /* All-zero weights: every row's softmax is uniform, the loss ln 100 each. */
    float zeros[100 * 8] = {0};
    w[5] = bias[7] = 1.0f; /* overwritten below: the local rows are written too */
    CHECK_OK(ferry_remote_set_params(m, "weight", 0, 100, zeros));
    CHECK_OK(ferry_remote_set_params(m, "bias", 0, 100, zeros));
    CHECK(w[5] == 0.0f && bias[7] == 0.0f);
    CHECK_OK(ferry_remote_xent_forward(m, dc, h, tg, 2, NULL, &loss, &call));
    CHECK(fabs(loss - 2.0 * log(100.0)) < 1e-5);
    CHECK_EQ(ferry_remote_xent_backward(m, dc, call, NULL, 1.0f, dh), FERRY_ERR_INVALID);
    CHECK(strstr(ferry_error_last(), "accumulators") != NULL);
    /* The slice's rows read and written through the module like the servers'. */
    float rows[100];
    for (int i = 0; i < 100; i++)
        rows[i] = 0.01f * (float)i;
    CHECK_OK(ferry_remote_set_params(m, "bias", 0, 100, rows));
    CHECK(bias[39] == rows[99] && bias[0] == rows[60]);
    float back[100];
    CHECK_OK(ferry_remote_get_params(m, "bias", 50, 0, back));
    CHECK(memcmp(back, rows + 50, 50 * sizeof *back) == 0);
    ferry_dist_ctx_destroy(dc);
    ferry_remote_destroy(m);
    ferry_cluster_destroy(cl);
    ferry_ps_server_destroy(srv);
}

TEST(micro_batches_are_checked) {
    ferry_lm_config mc = {100, 8, 8, 1, 0.0f, 0.1f, 0.0f, 1};
    ferry_lm *lm;
    CHECK_OK(ferry_lm_create(ferry_backend_cpu(), &mc, &lm));
    CHECK_EQ(ferry_lm_set_micro_batches(lm, 0), FERRY_ERR_RANGE);
    CHECK_EQ(ferry_lm_set_micro_batches(lm, FERRY_LM_MAX_MICRO + 1), FERRY_ERR_RANGE);
    CHECK_OK(ferry_lm_set_micro_batches(lm, 2));
    /* A local model has no servers to overlap with: the step says so. */
    ferry_ctx *ctx;
    ferry_optim *opt;
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &ctx));
    ferry_optim_config oc = ferry_optim_defaults(FERRY_OPTIM_SGD);
    CHECK_OK(ferry_optim_create(&lm->P, &oc, &opt));
    int32_t x[4] = {1, 2, 3, 4};
    ferry_tensor in = ferry_tensor_wrap(ferry_backend_cpu(), FERRY_DTYPE_I32, ferry_shape_2d(2, 2), x);
    ferry_lm_step_args a = {.loss_scale = 0.5f, .clip = 0.0f, .lr = 1.0, .ctx_id = 1, .seed = 1, .job_step = 0};
    ferry_lm_step_result r;
    CHECK_EQ(ferry_lm_train_step(lm, ctx, NULL, opt, &in, &in, &a, &r), FERRY_ERR_UNSUPPORTED);
    CHECK(strstr(ferry_error_last(), "micro-batches") != NULL);
    ferry_optim_destroy(opt);
    ferry_ctx_destroy(ctx);
    ferry_lm_destroy(lm);
}

FERRY_TEST_MAIN(T(one_micro_batch_is_the_unpipelined_step) T(dropout_off_matches)
                    T(dropout_on_matches) T(uneven_micro_batches_with_stiefel) T(two_shards)
                        T(local_vocab_slice_unpipelined)
                            T(local_vocab_slice_pipelined_dropout_stiefel)
                                T(local_vocab_slice_two_shards) T(local_vocab_is_checked)
                                    T(micro_batches_are_checked))
