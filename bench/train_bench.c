/* train_bench.c - tokens/s of the distributed PTB LM (embedding and decoder on one
 * ferry-ps, the LSTM in this process) in both decoder modes, beside the local
 * trainer measured in the same run on the same windows, and the bytes each
 * distributed step puts on the wire (from the server's Stats counters) against
 * the analytic payload. ferry-ps runs as separate processes (one per decoder mode,
 * so both start from fresh modules): the real binary, fork+exec'd before this
 * process touches gRPC, on 127.0.0.1 port 0. The three placements step in turn on
 * the same windows, so load from other processes hits them alike; their losses show
 * how closely the distributed model tracks the local one.
 *
 *     train_bench [--steps N] [--warmup N] [--threads N] [--ps-threads N]
 *                 [--ps-blas-threads N] [--data DIR | --random] [--ps-bin PATH] [--no-tune]
 *
 * --threads: the trainer's OpenBLAS threads (1, as ferry-trainer); --ps-threads:
 * ferry-ps --threads; --ps-blas-threads: ferry-ps --blas-threads (0: its default, 1);
 * --no-tune: leave glibc's malloc trimming alone in this process (ferry-trainer tunes
 * it, see ferry_rpc_tune_malloc). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

#include "common/backend/cpu/cpu.h"
#include "bench/bench_ps.h"
#include "bench/bench_util.h"
#include "ferry.pb-c.h"
#include "common/rpc/rpc.h"
#include "common/core/log.h"
#include "worker/batch.h"
#include "worker/corpus.h"
#include "worker/model-impl.h" /* the model's fields */

/* The PTB small configuration. */
#define V_SMALL 10000
#define E_SMALL 200
#define H_SMALL 200
#define L_SMALL 2
#define B_SMALL 20
#define T_SMALL 20

/* One server per distributed mode, so that each starts from fresh modules. */
static ps_child ps[2] = {{-1, "", ""}, {-1, "", ""}};

static void die(const char *what) {
    bench_die("train_bench", what);
}

static void check_ok(ferry_status st, const char *what) {
    if (st != FERRY_OK)
        die(what);
}

/* ---- the server's wire counters ---- */

typedef struct wire {
    double in, out, calls; /* request bytes, reply bytes (gRPC messages), calls answered */
} wire;

/* One Stats call. ferry_ps_stats has no byte counters, so this asks the server
 * directly over the RPC layer and reads the "bytes_in"/"bytes_out" metrics. */
static wire ps_wire(ferry_rpc_client *c) {
    Ferry__V1__StatsRequest q;
    ferry__v1__stats_request__init(&q);
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    check_ok(ferry_rpc_msg_set_head(&req, &q.base), "Stats request");
    check_ok(ferry_rpc_call(c, FERRY_RPC_STATS, &req, &reply, 0), "Stats");
    const Ferry__V1__StatsReply *r = reply.head;
    wire w = {-1.0, -1.0, -1.0};
    for (size_t i = 0; i < r->n_metrics; i++) {
        if (strcmp(r->metrics[i]->name, "bytes_in") == 0)
            w.in = r->metrics[i]->value;
        else if (strcmp(r->metrics[i]->name, "bytes_out") == 0)
            w.out = r->metrics[i]->value;
        else if (strcmp(r->metrics[i]->name, "calls") == 0)
            w.calls = r->metrics[i]->value;
    }
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
    if (w.in < 0 || w.out < 0 || w.calls < 0)
        die("the server's Stats lack bytes_in, bytes_out or calls");
    return w;
}

/* Hello on the Stats client: its later calls run in the session it opens. */
static void stats_session(ferry_rpc_client *c) {
    Ferry__V1__HelloRequest q;
    ferry__v1__hello_request__init(&q);
    q.label = "train_bench";
    q.contract_major = FERRY_CONTRACT_MAJOR;
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    check_ok(ferry_rpc_msg_set_head(&req, &q.base), "Hello request");
    check_ok(ferry_rpc_call(c, FERRY_RPC_HELLO, &req, &reply, 0), "Hello");
    check_ok(
        ferry_rpc_client_set_session(c, ((const Ferry__V1__HelloReply *)reply.head)->session, 0),
        "session");
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
}

static wire wire_sub(wire a, wire b) {
    return (wire){a.in - b.in, a.out - b.out, a.calls - b.calls};
}

/* ---- the timed runs ---- */

/* One placement of the model, stepped window by window. */
typedef struct runner {
    ferry_cluster *cl;       /* NULL: local */
    ferry_rpc_client *stats; /* the same server, for Stats */
    ferry_lm *lm;
    ferry_optim *opt;
    ferry_ctx *ctx;
    ferry_dist_ctx *dc;
    double *t;                   /* (steps) seconds of each timed step */
    double *loss;                /* (steps) mean cross-entropy per token of each timed step */
    wire w0, overhead;           /* counters before the timed steps; one Stats call's own */
    wire per_step;               /* server traffic per timed step */
    double step_s, p10_s, p90_s; /* median and spread of the timed steps */
} runner;

/* target NULL: the local model; otherwise the embedding and decoder on that ferry-ps,
 * with the decoder in `mode`. Every runner starts from the same parameters. */
static void runner_init(runner *r, const char *target, ferry_decoder_mode mode, int steps) {
    ferry_backend *be = ferry_backend_cpu();
    memset(r, 0, sizeof *r);
    if (target != NULL) {
        ferry_cluster_config cc;
        ferry_cluster_config_default(&cc);
        cc.wait_for_ready = 1;
        check_ok(ferry_ps_connect(target, &cc, &r->cl), "connecting to ferry-ps");
        check_ok(ferry_rpc_client_create(target, NULL, &r->stats), "stats client");
        stats_session(r->stats);
        check_ok(ferry_dist_ctx_create(r->cl, &r->dc), "distributed context");
    }
    ferry_lm_config mc = {V_SMALL, E_SMALL, H_SMALL, L_SMALL, 0.0f, 0.1f, 0.0f, 1};
    ferry_optim_config oc = ferry_optim_defaults(FERRY_OPTIM_SGD); /* lr 1 */
    ferry_lm_placement pl = {.cluster = r->cl,
                             .decoder_mode = mode,
                             .optim = oc,
                             .job = NULL,
                             .resume = 0,
                             .stages = NULL,
                             .local_vocab = 0};
    check_ok(ferry_lm_create_placed(be, &mc, r->cl != NULL ? &pl : NULL, &r->lm), "model");
    check_ok(ferry_optim_create(&r->lm->P, &oc, &r->opt), "optimizer");
    check_ok(ferry_ctx_create(be, &r->ctx), "context");
    check_ok(ferry_lm_reset_state(r->lm, B_SMALL), "state");
    r->t = malloc((size_t)steps * sizeof *r->t);
    r->loss = malloc((size_t)steps * sizeof *r->loss);
    if (r->t == NULL || r->loss == NULL)
        die("out of memory");
}

/* Trains on window i; steps from `warmup` on are timed, and the server's counters
 * are read just before the first of them. */
static void runner_step(runner *r, const ferry_batches *b, int i, int warmup) {
    if (i == warmup && r->stats != NULL) {
        /* Two Stats calls back to back give one Stats call's own traffic, which the
         * bracket around the timed steps also contains. */
        wire a = ps_wire(r->stats);
        r->w0 = ps_wire(r->stats);
        r->overhead = wire_sub(r->w0, a);
    }
    ferry_backend *be = ferry_backend_cpu();
    ferry_window w;
    check_ok(ferry_batch_window(b, (int64_t)i * T_SMALL, T_SMALL, &w), "window");
    ferry_shape s = ferry_shape_2d(w.T, w.B); /* (T, B) */
    ferry_tensor in = ferry_tensor_wrap(be, FERRY_DTYPE_I32, s, (void *)(uintptr_t)w.inputs);
    ferry_tensor tg = ferry_tensor_wrap(be, FERRY_DTYPE_I32, s, (void *)(uintptr_t)w.targets);
    /* The trainer's defaults: loss summed over time, averaged over the batch. */
    ferry_lm_step_args a = {.loss_scale = 1.0f / (float)B_SMALL, .clip = 5.0f, .lr = 1.0, .ctx_id = (uint64_t)i + 1, .seed = 1000003ull + (uint64_t)i, .job_step = 0};
    ferry_lm_step_result res;
    double t0 = ferry_now();
    check_ok(ferry_lm_train_step(r->lm, r->ctx, r->dc, r->opt, &in, &tg, &a, &res),
             "training step");
    double dt = ferry_now() - t0, loss = res.loss_sum / (double)(w.T * w.B);
    if (i < warmup)
        return;
    r->t[i - warmup] = dt;
    r->loss[i - warmup] = loss;
}

static void runner_finish(runner *r, int steps) {
    if (r->stats != NULL) {
        wire d = wire_sub(wire_sub(ps_wire(r->stats), r->w0), r->overhead);
        r->per_step = (wire){d.in / steps, d.out / steps, d.calls / steps};
    }
    r->step_s = bench_median(r->t, steps); /* sorts t */
    r->p10_s = bench_quantile(r->t, steps, 0.1);
    r->p90_s = bench_quantile(r->t, steps, 0.9);
    free(r->t); /* r->loss stays for the report */
    ferry_dist_ctx_destroy(r->dc);
    ferry_ctx_destroy(r->ctx);
    ferry_optim_destroy(r->opt);
    ferry_lm_destroy(r->lm); /* before its cluster */
    ferry_rpc_client_destroy(r->stats);
    ferry_cluster_destroy(r->cl);
}

/* How closely r's losses follow ref's (the local model's) over the timed steps: the
 * largest |difference| over the first 10, and the first step where it exceeds 0.01
 * (-1: never). Both start from the same parameters and see the same windows. */
static void loss_parity(const runner *r, const runner *ref, int steps, double *early, int *apart) {
    *early = 0.0;
    *apart = -1;
    for (int i = 0; i < steps; i++) {
        double d = fabs(r->loss[i] - ref->loss[i]);
        if (i < 10 && d > *early)
            *early = d;
        if (d > 0.01 && *apart < 0)
            *apart = i;
    }
}

/* Mean number of distinct input ids per timed window (the embedding's traffic). */
static double mean_distinct_ids(const ferry_batches *b, int warmup, int steps) {
    unsigned char *seen = malloc(V_SMALL);
    double total = 0.0;
    for (int i = warmup; i < warmup + steps; i++) {
        ferry_window w;
        check_ok(ferry_batch_window(b, (int64_t)i * T_SMALL, T_SMALL, &w), "window");
        memset(seen, 0, V_SMALL);
        for (int64_t k = 0; k < (int64_t)w.T * w.B; k++) {
            total += !seen[w.inputs[k]];
            seen[w.inputs[k]] = 1;
        }
    }
    free(seen);
    return total / steps;
}

/* ---- main ---- */

static void usage(void) {
    fprintf(stderr, "usage: train_bench [--steps N] [--warmup N] [--threads N] [--ps-threads N]"
                    " [--ps-blas-threads N] [--data DIR | --random] [--ps-bin PATH] [--no-tune]\n");
    exit(2);
}

int main(int argc, char **argv) {
    ferry_cpu_ensure_blas_kernels(argv);
    int steps = 30, warmup = 5, threads = 1, ps_threads = 2, ps_blas = 0, random_ids = 0, tune = 1;
    const char *data = FERRY_BENCH_DATA, *ps_bin = FERRY_BENCH_PS_BIN;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--random") == 0 || strcmp(argv[i], "--no-tune") == 0) {
            random_ids |= strcmp(argv[i], "--random") == 0;
            tune &= strcmp(argv[i], "--no-tune") != 0;
            continue;
        }
        if (v == NULL)
            usage();
        if (strcmp(argv[i], "--steps") == 0)
            steps = atoi(v);
        else if (strcmp(argv[i], "--warmup") == 0)
            warmup = atoi(v);
        else if (strcmp(argv[i], "--threads") == 0)
            threads = atoi(v);
        else if (strcmp(argv[i], "--ps-threads") == 0)
            ps_threads = atoi(v);
        else if (strcmp(argv[i], "--ps-blas-threads") == 0)
            ps_blas = atoi(v);
        else if (strcmp(argv[i], "--data") == 0)
            data = v;
        else if (strcmp(argv[i], "--ps-bin") == 0)
            ps_bin = v;
        else
            usage();
        i++;
    }
    if (steps < 20 || warmup < 1 || threads < 1 || ps_threads < 1 || ps_threads > 64 ||
        ps_blas < 0) {
        fprintf(stderr, "train_bench: need --steps >= 20, --warmup >= 1, --threads >= 1, "
                        "--ps-threads in [1, 64], --ps-blas-threads >= 0\n");
        return 2;
    }
    ferry_log_init("train_bench");
    ferry_log_set_level(FERRY_LOG_LEVEL_WARN);
    /* The servers first: fork+exec before this process initializes gRPC. */
    bench_ps_spawn(&ps[0], ps_bin, ps_threads, ps_blas);
    bench_ps_spawn(&ps[1], ps_bin, ps_threads, ps_blas);
    ferry_cpu_set_threads(threads);
    /* As ferry-trainer does: keep freed pages of large RPC payloads (logits mode). */
    if (tune)
        (void)ferry_rpc_tune_malloc(0);

    /* The token stream: PTB's training split, or uniform random ids. */
    int64_t need = (int64_t)(warmup + steps) * T_SMALL * B_SMALL + B_SMALL;
    ferry_corpus *corpus = NULL;
    int32_t *ids = NULL;
    const int32_t *stream;
    int64_t n = need;
    if (!random_ids) {
        check_ok(ferry_corpus_load(data, &corpus), "loading the corpus (or pass --random)");
        if (ferry_vocab_size(ferry_corpus_vocab(corpus)) != V_SMALL)
            die("the corpus' vocabulary is not 10000 words (PTB's); pass --random");
        stream = ferry_corpus_ids(corpus, FERRY_SPLIT_TRAIN, &n);
        n = n < need ? n : need;
    } else {
        if ((ids = malloc((size_t)need * sizeof *ids)) == NULL)
            die("out of memory");
        for (int64_t i = 0; i < need; i++)
            ids[i] = (int32_t)(ferry_rand_uniform(11, (uint64_t)i) * V_SMALL) % V_SMALL;
        stream = ids;
    }
    /* The first `need` tokens: B columns of warmup + steps windows each. */
    ferry_batches *b = NULL;
    check_ok(ferry_batch_create(stream, n, B_SMALL, &b), "batching");
    if (ferry_batch_nwindows(b, T_SMALL) < warmup + steps)
        die("the corpus is too short for --warmup + --steps windows");

    char machine[512];
    bench_machine(machine, sizeof machine);
    printf("machine: %s; OpenBLAS %s kernels, %d trainer thread(s)\n", machine,
           openblas_get_corename(), threads);
    printf("model: PTB small, V=%d E=%d H=%d L=%d, B=%d T=%d (N=%d tokens/step), SGD lr 1, "
           "clip 5; data: %s\n",
           V_SMALL, E_SMALL, H_SMALL, L_SMALL, B_SMALL, T_SMALL, B_SMALL * T_SMALL,
           random_ids ? "uniform random ids" : data);
    char blas_desc[32] = "ferry-ps's default (1)";
    if (ps_blas > 0)
        snprintf(blas_desc, sizeof blas_desc, "%d", ps_blas);
    printf("ferry-ps: %s, separate processes with --threads %d and OpenBLAS threads: %s, one "
           "per decoder mode\n",
           ps_bin, ps_threads, blas_desc);
    printf("%d warm-up + %d timed steps per mode, the three modes interleaved window by window;"
           " figures are medians\n\n",
           warmup, steps);
    fflush(stdout);

    runner loc, shd, lgt;
    runner_init(&loc, NULL, FERRY_DECODER_LOGITS, steps);
    runner_init(&shd, ps[0].target, FERRY_DECODER_SHARDED, steps);
    runner_init(&lgt, ps[1].target, FERRY_DECODER_LOGITS, steps);
    runner *order[3] = {&loc, &shd, &lgt};
    for (int i = 0; i < warmup + steps; i++) {
        /* Rotating who goes first keeps any ordering effect out of the comparison. */
        for (int k = 0; k < 3; k++)
            runner_step(order[(i + k) % 3], b, i, warmup);
    }
    runner_finish(&loc, steps);
    runner_finish(&shd, steps);
    runner_finish(&lgt, steps);
    int exit_shd = bench_ps_stop(&ps[0]), exit_lgt = bench_ps_stop(&ps[1]);

    const double N = T_SMALL * B_SMALL, U = mean_distinct_ids(b, warmup, steps);
    /* Tensor payload per step, 4-byte elements (ids, targets and flags are int32):
     * embedding ids U, rows U*E and grad U*E both modes; sharded: hidden N*H and
     * targets N in, partials 3N + has_target N out, lse N in, dh N*H out; logits:
     * hidden N*H in, logits N*V out, dlogits N*V in, dh N*H out. */
    double emb_in = 4 * (U + U * E_SMALL), emb_out = 4 * U * E_SMALL;
    double shd_in = emb_in + 4 * (N * H_SMALL + 2 * N);
    double shd_out = emb_out + 4 * (4 * N + N * H_SMALL);
    double lgt_in = emb_in + 4 * (N * H_SMALL + N * V_SMALL);
    double lgt_out = emb_out + 4 * (N * V_SMALL + N * H_SMALL);

    printf("%-16s %9s %9s %9s %10s %9s %11s %11s %11s %11s %6s\n", "mode", "step ms", "p10 ms",
           "p90 ms", "tokens/s", "vs local", "wire in/st", "wire out/st", "expect in", "expect out",
           "RPCs");
    const struct {
        const char *name;
        const runner *r;
        double ein, eout;
    } rows[] = {{"local", &loc, 0, 0},
                {"dist sharded", &shd, shd_in, shd_out},
                {"dist logits", &lgt, lgt_in, lgt_out}};
    for (int i = 0; i < 3; i++) {
        const runner *r = rows[i].r;
        printf("%-16s %9.2f %9.2f %9.2f %10.0f %8.2fx", rows[i].name, r->step_s * 1e3,
               r->p10_s * 1e3, r->p90_s * 1e3, N / r->step_s, loc.step_s / r->step_s);
        if (i == 0)
            printf(" %11s %11s %11s %11s %6s\n", "-", "-", "-", "-", "-");
        else
            printf(" %9.1fKB %9.1fKB %9.1fKB %9.1fKB %6.1f\n", r->per_step.in / 1e3,
                   r->per_step.out / 1e3, rows[i].ein / 1e3, rows[i].eout / 1e3, r->per_step.calls);
    }
    printf("\nwire: gRPC message bytes per step counted by ferry-ps (Stats bytes_in/bytes_out; no"
           " HTTP/2 or TCP framing);\nexpect: tensor payload alone, with %.1f distinct ids per "
           "window; 'vs local' = distributed tokens/s / local tokens/s.\n",
           U);
    printf("logits mode moves N*V = %.0f floats each way per step; sharded moves %.0fx fewer "
           "bytes in total.\n",
           N * V_SMALL,
           (lgt.per_step.in + lgt.per_step.out) / (shd.per_step.in + shd.per_step.out));
    double early_s, early_l;
    int apart_s, apart_l;
    loss_parity(&shd, &loc, steps, &early_s, &apart_s);
    loss_parity(&lgt, &loc, steps, &early_l, &apart_l);
    printf("loss per token, first -> last timed step: local %.4f -> %.4f, sharded %.4f -> %.4f, "
           "logits %.4f -> %.4f\n",
           loc.loss[0], loc.loss[steps - 1], shd.loss[0], shd.loss[steps - 1], lgt.loss[0],
           lgt.loss[steps - 1]);
    printf("parity with local (same start, same windows): largest |loss difference| over the "
           "first 10 timed steps %.1e (sharded), %.1e (logits); first timed step where it "
           "exceeds 0.01: %d, %d (-1: never; float summation order differs, and lr-1 SGD "
           "amplifies it)\n",
           early_s, early_l, apart_s, apart_l);
    free(loc.loss);
    free(shd.loss);
    free(lgt.loss);

    ferry_batch_destroy(b);
    ferry_corpus_destroy(corpus);
    free(ids);
    printf("ferry-ps servers stopped with SIGTERM: exit %d and %d\n", exit_shd, exit_lgt);
    return exit_shd == 0 && exit_lgt == 0 ? 0 : 1;
}
