/* pipe_bench.c - the distributed step with and without micro-batch pipelining, against
 * the local trainer and the machine's compute ceiling, all measured in one run.
 *
 * For each configuration (PTB small and medium) it steps, window by window in turn
 * on the same PTB windows:
 *   local, 1 and 2 OpenBLAS threads          the single-process trainer (1 thread also
 *                                            with its LSTM weight gradients on a
 *                                            helper thread: --grad-thread on)
 *   relay (M = 1), trainer 1 and 2 threads   embedding and decoder on one ferry-ps
 *   pipelined (M micro-batches), 1 thread    the same, micro-batches in flight
 *   + a local vocabulary slice, M = 1 and M   the decoder's last N rows in the trainer
 *                                            (--local-vocab; per configuration, 0: skip)
 * Each distributed placement has a ferry-ps of its own (the real binary, a child
 * process on 127.0.0.1, --blas-threads 1: its default). The ceiling is the step's
 * GEMM flops (ferry_lm_step_flops) at the rate single-threaded sgemm reaches on
 * exactly the step's shapes, times the machine's cores: what the cores could do if
 * every one of them ran the step's GEMMs without pause. Figures are medians.
 *
 *     pipe_bench [--config small|medium|all] [--steps N] [--warmup N] [--micro M]
 *                [--local-vocab SMALL,MEDIUM] [--data DIR] [--ps-bin PATH] */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

#include "bench/bench_gemm.h"
#include "bench/bench_ps.h"
#include "bench/bench_util.h"
#include "common/backend/cpu/cpu.h"
#include "common/core/log.h"
#include "common/rpc/rpc.h"
#include "worker/batch.h"
#include "worker/corpus.h"
#include "worker/model-impl.h" /* the model's fields */

static void die(const char *what) {
    bench_die("pipe_bench", what);
}

static void check_ok(ferry_status st, const char *what) {
    if (st != FERRY_OK)
        die(what);
}

enum { LOCAL1, LOCAL1G, LOCAL2, RELAY1, RELAY2, PIPE1, RELAY_LV, PIPE_LV, NRUN };

typedef struct runner {
    const char *label;
    int threads, micro; /* trainer OpenBLAS threads; micro-batches (0: local) */
    int64_t local_vocab; /* decoder rows computed in the trainer (--local-vocab) */
    int skip;            /* not run (a local-slice placement with no slice) */
    int grad_thread;     /* local: weight gradients on a helper thread (--grad-thread on) */
    ps_child ps;
    ferry_cluster *cl;
    ferry_dist_ctx *dc;
    ferry_lm *lm;
    ferry_optim *opt;
    ferry_ctx *ctx;
    double *t;
    double step_s, p10_s, p90_s, last_loss;
    ferry_lm_pipe_stats pipe;
} runner;

static void runner_init(runner *r, const bench_config *c, int steps) {
    ferry_backend *be = ferry_backend_cpu();
    if (r->micro > 0) {
        ferry_cluster_config cc;
        ferry_cluster_config_default(&cc);
        cc.wait_for_ready = 1;
        check_ok(ferry_ps_connect(r->ps.target, &cc, &r->cl), "connecting to ferry-ps");
        check_ok(ferry_dist_ctx_create(r->cl, &r->dc), "distributed context");
    }
    ferry_lm_config mc = {c->V, c->E, c->H, c->L, 0.0f, 0.1f, 0.0f, 1};
    ferry_optim_config oc = ferry_optim_defaults(FERRY_OPTIM_SGD);
    oc.lr = 0.1;
    ferry_lm_placement pl = {.cluster = r->cl,
                             .decoder_mode = FERRY_DECODER_SHARDED,
                             .optim = oc,
                             .job = NULL,
                             .resume = 0,
                             .stages = NULL,
                             .local_vocab = r->local_vocab};
    check_ok(ferry_lm_create_placed(be, &mc, r->cl != NULL ? &pl : NULL, &r->lm), "model");
    if (r->micro > 1)
        check_ok(ferry_lm_set_micro_batches(r->lm, r->micro), "micro-batches");
    if (r->grad_thread)
        ferry_lm_set_grad_thread(r->lm, FERRY_LM_GRAD_THREAD_ON);
    check_ok(ferry_optim_create(&r->lm->P, &oc, &r->opt), "optimizer");
    check_ok(ferry_ctx_create(be, &r->ctx), "context");
    if ((r->t = malloc((size_t)steps * sizeof *r->t)) == NULL)
        die("out of memory");
}

static void runner_step(runner *r, const ferry_batches *b, const bench_config *c, int i,
                        int warmup) {
    ferry_backend *be = ferry_backend_cpu();
    ferry_window w;
    check_ok(ferry_batch_window(b, (int64_t)i * c->T, c->T, &w), "window");
    ferry_shape s = ferry_shape_2d(w.T, w.B);
    ferry_tensor in = ferry_tensor_wrap(be, FERRY_DTYPE_I32, s, (void *)(uintptr_t)w.inputs);
    ferry_tensor tg = ferry_tensor_wrap(be, FERRY_DTYPE_I32, s, (void *)(uintptr_t)w.targets);
    /* lr 0.1: at lr 1 the medium model is chaotic in its first steps, and runs whose
     * sums round differently (thread counts, micro-batches) part visibly by step 30. */
    ferry_lm_step_args a = {.loss_scale = 1.0f / (float)c->B, .clip = 5.0f, .lr = 0.1, .ctx_id = (uint64_t)i + 1, .seed = (uint64_t)i, .job_step = 0};
    ferry_lm_step_result res;
    /* After a 2-thread step, OpenBLAS's idle worker spins for 2^28 cycles (~0.1 s here)
     * before it sleeps: it would take the core a 1-thread placement's ferry-ps needs. */
    static int last_threads = 1;
    if (last_threads > 1 && r->threads == 1)
        (void)nanosleep(&(struct timespec){0, 150 * 1000 * 1000}, NULL);
    last_threads = r->threads;
    ferry_cpu_set_threads(r->threads);
    if (i == warmup && r->lm->pipe != NULL)
        ferry_lm_pipe_take_stats(r->lm->pipe, &r->pipe); /* drop the warm-up's */
    double t0 = ferry_now();
    check_ok(ferry_lm_train_step(r->lm, r->ctx, r->dc, r->opt, &in, &tg, &a, &res),
             "training step");
    double dt = ferry_now() - t0;
    r->last_loss = res.loss_sum / (double)(w.T * w.B);
    if (i >= warmup)
        r->t[i - warmup] = dt;
}

static void runner_finish(runner *r, int steps) {
    if (r->lm->pipe != NULL)
        ferry_lm_pipe_take_stats(r->lm->pipe, &r->pipe);
    r->step_s = bench_median(r->t, steps);
    r->p10_s = bench_quantile(r->t, steps, 0.1);
    r->p90_s = bench_quantile(r->t, steps, 0.9);
    free(r->t);
    ferry_dist_ctx_destroy(r->dc);
    ferry_ctx_destroy(r->ctx);
    ferry_optim_destroy(r->opt);
    ferry_lm_destroy(r->lm);
    ferry_cluster_destroy(r->cl);
}

static void usage(void) {
    fprintf(stderr, "usage: pipe_bench [--config small|medium|all] [--steps N] [--warmup N] "
                    "[--micro M] [--local-vocab SMALL,MEDIUM] [--data DIR] [--ps-bin PATH]\n");
    exit(2);
}

int main(int argc, char **argv) {
    ferry_cpu_ensure_blas_kernels(argv);
    int steps = 20, warmup = 3, micro = 4;
    /* Decoder rows the trainer computes in the "local vocabulary slice" placements,
     * per configuration: small's decoder holds 3/4 of the FLOPs and its server is the
     * bottleneck, so about half the vocabulary goes to the trainer; medium's trainer
     * (the LSTM, 60% of the FLOPs) is already the busier side, so none. */
    long long lv[2] = {5000, 0};
    const char *which = "all", *data = FERRY_BENCH_DATA, *ps_bin = FERRY_BENCH_PS_BIN;
    for (int i = 1; i < argc; i += 2) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL)
            usage();
        if (strcmp(argv[i], "--config") == 0)
            which = v;
        else if (strcmp(argv[i], "--steps") == 0)
            steps = atoi(v);
        else if (strcmp(argv[i], "--warmup") == 0)
            warmup = atoi(v);
        else if (strcmp(argv[i], "--micro") == 0)
            micro = atoi(v);
        else if (strcmp(argv[i], "--data") == 0)
            data = v;
        else if (strcmp(argv[i], "--local-vocab") == 0) {
            if (sscanf(v, "%lld,%lld", &lv[0], &lv[1]) != 2 || lv[0] < 0 || lv[1] < 0)
                usage();
        } else if (strcmp(argv[i], "--ps-bin") == 0)
            ps_bin = v;
        else
            usage();
    }
    if (steps < 5 || warmup < 1 || micro < 2 || micro > FERRY_LM_MAX_MICRO)
        usage();
    ferry_log_init("pipe_bench");
    check_ok(ferry_rpc_tune_malloc(0), "tuning malloc (as ferry-trainer does)");
    ferry_log_set_level(FERRY_LOG_LEVEL_WARN);
    static const bench_config configs[] = {
        {"small", 10000, 200, 200, 2, 20, 20},
        {"medium", 10000, 650, 650, 2, 35, 20},
    };
    enum { NCONF = 2 };
    static const char *labels[NRUN] = {"local, 1 thread",
                                       "local, 1 thread + gradient thread",
                                       "local, 2 threads",
                                       "ferry-ps + trainer, M=1, 1 thread",
                                       "ferry-ps + trainer, M=1, 2 threads",
                                       "ferry-ps + trainer, pipelined, 1 thread",
                                       "+ local vocab slice, M=1",
                                       "+ local vocab slice, pipelined"};
    static const int threads[NRUN] = {1, 1, 2, 1, 2, 1, 1, 1};
    runner run[NCONF][NRUN];
    memset(run, 0, sizeof run);
    /* Every ferry-ps starts before this process touches gRPC. */
    for (int k = 0; k < NCONF; k++) {
        if (strcmp(which, "all") != 0 && strcmp(which, configs[k].name) != 0)
            continue;
        for (int r = 0; r < NRUN; r++) {
            run[k][r].label = labels[r];
            run[k][r].threads = threads[r];
            run[k][r].micro = r == PIPE1 || r == PIPE_LV ? micro : r >= RELAY1 ? 1 : 0;
            run[k][r].local_vocab = r >= RELAY_LV ? lv[k] : 0;
            run[k][r].skip = r >= RELAY_LV && lv[k] == 0; /* no slice for this config */
            run[k][r].grad_thread = r == LOCAL1G;
            if (run[k][r].micro > 0 && !run[k][r].skip)
                bench_ps_spawn(&run[k][r].ps, ps_bin, 2, 1);
        }
    }
    ferry_corpus *corpus;
    check_ok(ferry_corpus_load(data, &corpus), "loading the corpus (--data)");
    int64_t nids;
    const int32_t *ids = ferry_corpus_ids(corpus, FERRY_SPLIT_TRAIN, &nids);
    char machine[512];
    bench_machine(machine, sizeof machine);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    printf("machine: %s; OpenBLAS %s\n", machine, ferry_cpu_blas_kernels());
    printf("%d warm-up + %d timed steps per placement, placements interleaved window by window "
           "on PTB; figures are medians (p10-p90 of the step time in brackets)\n",
           warmup, steps);
    printf("ferry-ps: %s, one per distributed placement, --threads 2 --blas-threads 1\n\n",
           ps_bin);
    for (int k = 0; k < NCONF; k++) {
        const bench_config *c = &configs[k];
        if (strcmp(which, "all") != 0 && strcmp(which, c->name) != 0)
            continue;
        ferry_batches *b;
        int64_t need = c->B * ((int64_t)(warmup + steps) * c->T + 1);
        if (need > nids)
            die("the corpus is too short");
        check_ok(ferry_batch_create(ids, need, (int)c->B, &b), "batches");
        for (int r = 0; r < NRUN; r++)
            if (!run[k][r].skip)
                runner_init(&run[k][r], c, steps);
        for (int i = 0; i < warmup + steps; i++)
            for (int r = 0; r < NRUN; r++)
                if (!run[k][r].skip)
                    runner_step(&run[k][r], b, c, i, warmup);
        for (int r = 0; r < NRUN; r++)
            if (!run[k][r].skip)
                runner_finish(&run[k][r], steps);
        /* The ceiling: the step's GEMMs, single-threaded sgemm, times the cores. */
        ferry_cpu_set_threads(1);
        gemm_shape g[64];
        int ng = step_gemms(c, g);
        double gemm_flops, gemm_s = time_gemms(g, ng, steps, &gemm_flops);
        ferry_lm_config mc = {c->V, c->E, c->H, c->L, 0.0f, 0.1f, 0.0f, 1};
        double tokens = (double)(c->T * c->B), flops = ferry_lm_step_flops(&mc, c->T, c->B);
        double core_gf = gemm_flops / gemm_s * 1e-9;
        double ceiling = (double)cores * core_gf * 1e9 / flops * tokens;
        double local2 = tokens / run[k][LOCAL2].step_s;
        printf("%s: V=%lld E=%lld H=%lld L=%d, B=%lld T=%lld; %.2f GFLOP per step; sgemm on its "
               "shapes %.1f GFLOP/s per core\n", c->name, (long long)c->V, (long long)c->E,
               (long long)c->H, c->L, (long long)c->B, (long long)c->T, flops * 1e-9, core_gf);
        printf("  %-40s %9s %17s %9s %9s\n", "placement", "tokens/s", "step ms", "vs local2",
               "of ceiling");
        for (int r = 0; r < NRUN; r++) {
            const runner *x = &run[k][r];
            if (x->skip)
                continue;
            double tps = tokens / x->step_s;
            char label[64];
            if (r == PIPE1)
                snprintf(label, sizeof label, "ferry-ps + trainer, M=%d, 1 thread", micro);
            else if (r >= RELAY_LV)
                snprintf(label, sizeof label, "  + %lld vocab rows here, M=%d",
                         (long long)x->local_vocab, r == PIPE_LV ? micro : 1);
            else
                snprintf(label, sizeof label, "%s", x->label);
            printf("  %-40s %9.0f %6.1f [%4.1f-%4.1f] %8.2fx %8.0f%%", label, tps, 1e3 * x->step_s,
                   1e3 * x->p10_s, 1e3 * x->p90_s, tps / local2, 100.0 * tps / ceiling);
            if (x->pipe.steps > 0 && x->pipe.wall_s > 0) {
                double tb = x->pipe.trainer_busy_s / x->pipe.wall_s;
                double sb = x->pipe.servers_busy_s / x->pipe.wall_s;
                printf("   (trainer busy %.0f%%, decoder calls %.0f%%, bubble %.0f%%)", 100 * tb,
                       100 * sb, 100 * (1 - 0.5 * (tb + sb)));
            }
            printf("\n");
        }
        printf("  %-40s %9.0f\n", "ceiling: cores x sgemm on these shapes", ceiling);
        printf("  last losses:");
        for (int r = 0; r < NRUN; r++)
            if (!run[k][r].skip)
                printf(" %.4f", run[k][r].last_loss);
        printf(" (same windows, same start)\n\n");
        ferry_batch_destroy(b);
    }
    ferry_corpus_destroy(corpus);
    int rc = 0;
    for (int k = 0; k < NCONF; k++)
        for (int r = 0; r < NRUN; r++)
            if (run[k][r].ps.pid > 0 && bench_ps_stop(&run[k][r].ps) != 0)
                rc = 1;
    return rc;
}
