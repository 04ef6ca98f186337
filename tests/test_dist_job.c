/* test_dist_job.c - a bsp job against the local trainer: N ranks, each with batch
 * B/N (its columns of the global batch) and the loss scaled by B, against 2 in-process
 * ferry-ps over real gRPC, must reproduce one local trainer with batch B step for
 * step (same seed, dropout off, clipping on): the job's loss within 1e-7 relative of
 * the local loss at each of 50 steps (README: "2 x 10 reproduces 1 x 20 to 1e-7"),
 * every rank logging the same figure (bit for bit), and every parameter element
 * (embedding and decoder by GetParams, the LSTM pulled from the servers' dense module,
 * layers on the servers from their lstm module) within 1e-5 relative of the local
 * model's: |a - b| <= 1e-5 (|b| + 0.1), so elements smaller than the init scale 0.1
 * get 1e-6 absolute (a split batch sums the same gradient in another order, and an
 * element near 0 has no relative precision to keep). N = 2 and 4 with SGD, N = 2
 * with Stiefel-constrained recurrent weights (rank 0 adds the penalty's gradient
 * once), and with Adam. Then the job's membership rules, a missing rank, and a wait
 * for rank 0's ready that ends on time when its server goes.
 *
 * The learning rate is 0.1. At the trainer's default of 1 these first steps of PTB
 * amplify rounding: the local trainer against itself with 2 BLAS threads instead of
 * 1 differs by 1.6e-5 at step 40 and 7e-3 at step 50, and a job (which sums the same
 * gradient in another order) does the same; at 0.1 both stay below 1e-7. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/dist/dist.h" /* ferry__dist_replica_drop */
#include "common/core/log.h" /* ferry_now */
#include "common/rpc/rpc.h"  /* the bf16 conversions */
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
#define GB    20 /* the global batch */
#define BPTT  20
#ifndef HID
#define HID 200 /* the small configuration */
#endif
#ifndef LR
#define LR 0.1
#endif
#define SERVERS 2 /* shards */

/* Replicas per shard of the next setup (1: none; 2: the replicated tests). */
static int g_R = 1;
/* > 0: at this step rank 0 stops calling shard 0's primary (as if it had stalled for
 * rank 0 alone): the ranks split, and rank 1 must follow rank 0 to the backup. */
static int g_split_at = 0;
/* > 0: at this step rank 1's answer to its GradNorm from shard 0's primary is lost after
 * the primary summed the step and answered rank 0, which installs the sum on the backup
 * (ferry__dist_lose_reply; rank 1 notices 1 s later, after the install): rank 1 fails
 * over to the backup, which answers as the primary did. */
static int g_lose_at = 0;

typedef struct setup {
    ferry_backend *be;
    ferry_corpus *corpus;
    ferry_batches *b;
    ferry_lm_config mc;
    ferry_optim_config oc;
    float clip;
    const char *stages; /* --stages of every rank, or NULL */
    int micro;          /* --micro-batches of every rank (0, 1: none) */
    int R;              /* replicas per shard (g_R at setup_init) */
    ferry_ps_server *srv[SERVERS * 2]; /* shard g's replica r at g * R + r */
    char targets[256];
} setup;

typedef struct rank_run {
    const setup *s;
    const char *job;
    int world, rank;
    double loss[STEPS]; /* the job's loss per step, as this rank logs it */
    double tokens[STEPS];
    ferry_status st;
    char err[512];
    ferry_lm *lm; /* kept for the parameter check (rank 0) */
    ferry_cluster *cl;
    ferry_dist_ctx *dc;
    ferry_job *jb;
} rank_run;

static void window(const setup *s, int step, int c0, int c1, int32_t *in, int32_t *tg,
                   ferry_tensor *tin, ferry_tensor *ttg) {
    ferry_window w;
    CHECK_OK(ferry_batch_window(s->b, (int64_t)step * BPTT, BPTT, &w));
    int Br = c1 - c0;
    for (int t = 0; t < w.T; t++) {
        memcpy(in + t * Br, w.inputs + t * w.B + c0, (size_t)Br * sizeof *in);
        memcpy(tg + t * Br, w.targets + t * w.B + c0, (size_t)Br * sizeof *tg);
    }
    ferry_shape sh = ferry_shape_2d(w.T, Br);
    *tin = ferry_tensor_wrap(s->be, FERRY_DTYPE_I32, sh, in);
    *ttg = ferry_tensor_wrap(s->be, FERRY_DTYPE_I32, sh, tg);
}

static ferry_lm_step_args step_args(const setup *s, int step) {
    ferry_lm_step_args a = {.loss_scale = 1.0f / (float)GB, .clip = s->clip, .lr = s->oc.lr, .ctx_id = (uint64_t)step + 1, .seed = 11, .job_step = (uint64_t)step + 1};
    return a;
}

static void *rank_main(void *arg) {
    rank_run *r = arg;
    const setup *s = r->s;
    ferry_cluster_config cc;
    ferry_cluster_config_default(&cc);
    cc.worker_id = (uint16_t)r->rank;
    cc.replicas = s->R;
    ferry_ctx *ctx = NULL;
    ferry_optim *opt = NULL;
    int c0 = r->rank * GB / r->world, c1 = (r->rank + 1) * GB / r->world;
    int32_t in[BPTT * GB], tg[BPTT * GB];
    ferry_status st = ferry_ps_connect(s->targets, &cc, &r->cl);
    if (st == FERRY_OK)
        st = ferry_dist_ctx_create(r->cl, &r->dc);
    ferry_job_config jc = {.name = r->job,
                           .world = r->world,
                           .rank = r->rank,
                           .sync = FERRY_SYNC_BSP,
                           .staleness = 0,
                           .sync_timeout_ms = 20000,
                           .model = "test=1"};
    if (st == FERRY_OK)
        st = ferry_job_join(r->cl, &jc, &r->jb);
    ferry_lm_placement pl = {.cluster = r->cl,
                             .decoder_mode = FERRY_DECODER_SHARDED,
                             .optim = s->oc,
                             .job = r->jb,
                             .resume = 0,
                             .stages = s->stages,
                             .local_vocab = 0};
    if (st == FERRY_OK)
        st = ferry_lm_create_placed(s->be, &s->mc, &pl, &r->lm);
    if (st == FERRY_OK && s->micro > 1)
        st = ferry_lm_set_micro_batches(r->lm, s->micro);
    if (st == FERRY_OK)
        st = ferry_optim_create(&r->lm->P, &s->oc, &opt);
    if (st == FERRY_OK)
        st = ferry_ctx_create(s->be, &ctx);
    for (int step = 0; step < STEPS && st == FERRY_OK; step++) {
        ferry_tensor tin, ttg;
        if (g_split_at > 0 && step == g_split_at && r->rank == 0)
            ferry__dist_replica_drop(r->cl, 0, "the test's split");
        if (g_lose_at > 0 && step == g_lose_at && r->rank == 1)
            ferry__dist_lose_reply(r->cl, FERRY_RPC_GRAD_NORM, 0, 1000);
        window(s, step, c0, c1, in, tg, &tin, &ttg);
        ferry_lm_step_args a = step_args(s, step);
        ferry_lm_step_result res;
        st = ferry_lm_train_step(r->lm, ctx, r->dc, opt, &tin, &ttg, &a, &res);
        r->loss[step] = res.job_loss_sum;
        r->tokens[step] = res.job_tokens;
    }
    if (st == FERRY_OK)
        st = ferry_lm_pull_dense(r->lm); /* the weights after the last step */
    if (st != FERRY_OK)
        snprintf(r->err, sizeof r->err, "%s", ferry_error_last());
    r->st = st;
    ferry_ctx_destroy(ctx);
    ferry_optim_destroy(opt);
    return NULL;
}

static void rank_free(rank_run *r) {
    if (r->jb != NULL)
        CHECK_OK(ferry_job_leave(r->jb));
    ferry_job_destroy(r->jb);
    ferry_lm_destroy(r->lm);
    ferry_dist_ctx_destroy(r->dc);
    ferry_cluster_destroy(r->cl);
}

/* Largest |a-b| / max|b| over a tensor: reported, not checked. */
static double tensor_rel(const float *a, const float *b, int64_t n) {
    double d = 0.0, m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return d / (m > 0.0 ? m : 1.0);
}

/* Parameters start in U(-0.1, 0.1): an element's tolerance is tol relative to
 * max(|b|, ~0.1), see the header. */
#define PARAM_SCALE 0.1

/* Every element of a against b (the local model's) within tol (see PARAM_SCALE);
 * returns tensor_rel for the report. */
static double param_check(const char *name, const float *a, const float *b, int64_t n, double tol) {
    CHECK_CLOSE_F(name, a, b, n, tol * PARAM_SCALE, tol);
    return tensor_rel(a, b, n);
}

static double compare_remote(ferry_remote *m, const char *param, const ferry_lm *local,
                             const char *local_name, double tol) {
    int idx = ferry_params_find(&local->P, local_name);
    CHECK(idx >= 0);
    const ferry_param *p = &local->P.items[idx];
    float *buf = malloc((size_t)p->numel * sizeof *buf);
    CHECK(buf != NULL);
    CHECK_OK(ferry_remote_get_params(m, param, 0, p->shape.dim[0], buf));
    double rel = param_check(local_name, buf, ferry_params_data(&local->P, idx), p->numel, tol);
    free(buf);
    return rel;
}

static void setup_init(setup *s, float stiefel, ferry_optim_kind kind, double lr) {
    memset(s, 0, sizeof *s);
    s->be = ferry_backend_cpu();
    CHECK_OK(ferry_corpus_load(ferry_test_path("data/ptb"), &s->corpus));
    int64_t n;
    const int32_t *ids = ferry_corpus_ids(s->corpus, FERRY_SPLIT_TRAIN, &n);
    CHECK_OK(ferry_batch_create(ids, GB * (STEPS * BPTT + 1), GB, &s->b));
    ferry_lm_config mc = {
        ferry_vocab_size(ferry_corpus_vocab(s->corpus)), HID, HID, 2, 0.0f, 0.1f, stiefel, 7};
    s->mc = mc;
    s->oc = ferry_optim_defaults(kind);
    s->oc.lr = lr;
    s->clip = 5.0f;
    s->R = g_R;
    size_t len = 0;
    for (int i = 0; i < SERVERS * s->R; i++) {
        ferry_ps_config pc;
        ferry_ps_config_default(&pc);
        pc.listen = "127.0.0.1:0";
        CHECK_OK(ferry_ps_server_create(&pc, &s->srv[i]));
        CHECK_OK(ferry_ps_server_start(s->srv[i]));
        len += (size_t)snprintf(s->targets + len, sizeof s->targets - len, "%s127.0.0.1:%d",
                                i ? "," : "", ferry_ps_server_port(s->srv[i]));
    }
}

static void setup_deinit(setup *s) {
    for (int i = 0; i < SERVERS * s->R; i++)
        ferry_ps_server_destroy(s->srv[i]);
    ferry_batch_destroy(s->b);
    ferry_corpus_destroy(s->corpus);
}

/* N ranks of a bsp job against one local trainer of the global batch. */
static void bsp_matches_local_placed(int world, float stiefel, ferry_optim_kind kind, double lr,
                                     double param_tol, const char *job, int layers,
                                     const char *stages, int micro) {
    setup s;
    setup_init(&s, stiefel, kind, lr);
    s.mc.L = layers;
    s.stages = stages;
    s.micro = micro;
    /* The reference: one trainer, batch GB, everything local. */
    ferry_lm *loc;
    ferry_optim *lopt;
    ferry_ctx *lctx;
    CHECK_OK(ferry_lm_create(s.be, &s.mc, &loc));
    CHECK_OK(ferry_optim_create(&loc->P, &s.oc, &lopt));
    CHECK_OK(ferry_ctx_create(s.be, &lctx));
    double ref[STEPS];
    int32_t in[BPTT * GB], tg[BPTT * GB];
    for (int step = 0; step < STEPS; step++) {
        ferry_tensor tin, ttg;
        window(&s, step, 0, GB, in, tg, &tin, &ttg);
        ferry_lm_step_args a = step_args(&s, step);
        ferry_lm_step_result res;
        CHECK_OK(ferry_lm_train_step(loc, lctx, NULL, lopt, &tin, &ttg, &a, &res));
        ref[step] = res.loss_sum;
    }

    rank_run *runs = calloc((size_t)world, sizeof *runs);
    pthread_t *th = calloc((size_t)world, sizeof *th);
    CHECK(runs != NULL && th != NULL);
    for (int r = 0; r < world; r++) {
        runs[r] = (rank_run){.s = &s, .job = job, .world = world, .rank = r};
        CHECK(pthread_create(&th[r], NULL, rank_main, &runs[r]) == 0);
    }
    for (int r = 0; r < world; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < world; r++) {
        if (runs[r].st != FERRY_OK)
            fprintf(stderr, "  rank %d: %s\n", r, runs[r].err);
        CHECK_OK(runs[r].st);
    }
    double worst = 0.0;
    for (int step = 0; step < STEPS; step++) {
        for (int r = 1; r < world; r++) /* every rank logs the job's figure */
            CHECK_BITS_EQ(runs[r].loss[step], runs[0].loss[step]);
        CHECK_BITS_EQ(runs[0].tokens[step], (double)(BPTT * GB));
        double rel = fabs(runs[0].loss[step] - ref[step]) / fabs(ref[step]);
        if (rel > 1e-7 || getenv("JOB_VERBOSE") != NULL)
            fprintf(stderr, "  step %d: local %.9g job %.9g (rel %.3g)\n", step + 1, ref[step],
                    runs[0].loss[step], rel);
        worst = fmax(worst, rel);
    }
    CHECK(worst <= 1e-7);
    CHECK(ref[STEPS - 1] < ref[0]); /* it trained */

    /* Parameters: the servers' embedding and decoder, and every rank's LSTM as pulled
     * from the servers, against the local model; the ranks' LSTMs are one. */
    ferry_lm *lm0 = runs[0].lm;
    double pw = 0.0, rel;
    const char *pworst = "";
#define PARAM_REL(name, expr)                                                                      \
    do {                                                                                           \
        if ((rel = (expr)) > pw) {                                                                 \
            pw = rel;                                                                              \
            pworst = (name);                                                                       \
        }                                                                                          \
    } while (0)
    PARAM_REL("encoder.weight",
              compare_remote(lm0->emb_remote, "weight", loc, "encoder.weight", param_tol));
    PARAM_REL("decoder.weight",
              compare_remote(lm0->dec_remote, "weight", loc, "decoder.weight", param_tol));
    PARAM_REL("decoder.bias",
              compare_remote(lm0->dec_remote, "bias", loc, "decoder.bias", param_tol));
    for (int i = 0; i < lm0->P.count; i++) {
        const ferry_param *p = &lm0->P.items[i];
        int j = ferry_params_find(&loc->P, p->name);
        CHECK(j >= 0);
        PARAM_REL(p->name, param_check(p->name, ferry_params_data(&lm0->P, i),
                                       ferry_params_data(&loc->P, j), p->numel, param_tol));
        for (int r = 1; r < world; r++)
            CHECK(memcmp(ferry_params_data(&runs[r].lm->P, i), ferry_params_data(&lm0->P, i),
                         (size_t)p->numel * sizeof(float)) == 0);
    }
    /* Layers on the servers (--stages): read back from their lstm module. */
    for (int g = 0; g < lm0->ngroups; g++) {
        const ferry_lm_group *G = &lm0->groups[g];
        if (G->server < 0)
            continue;
        float *w = malloc((size_t)G->view.numel * sizeof *w);
        CHECK(w != NULL);
        CHECK_OK(ferry_remote_get_params(G->remote, "weight", 0, 1, w));
        for (int i = 0; i < G->view.count; i++) {
            const ferry_param *p = &G->view.items[i];
            int j = ferry_params_find(&loc->P, p->name);
            CHECK(j >= 0);
            PARAM_REL(p->name, param_check(p->name, w + p->offset, ferry_params_data(&loc->P, j),
                                           p->numel, param_tol));
        }
        free(w);
    }
    fprintf(stderr,
            "  %d ranks x batch %d (%s%s%s%s, M=%d): %d steps, loss %.4f -> %.4f, worst loss rel "
            "%.3g, worst parameter |a-b|/max|b| %.3g (%s)\n",
            world, GB / world, ferry_optim_kind_name(kind), stiefel > 0 ? ", Stiefel" : "",
            stages != NULL ? ", --stages " : "", stages != NULL ? stages : "",
            micro > 1 ? micro : 1, STEPS, ref[0] / (BPTT * GB), ref[STEPS - 1] / (BPTT * GB), worst,
            pw, pworst);

    /* Replicated (primary-backup): the backups applied the primaries' sums, so each
     * shard's replicas hold the same bytes. Read through a client of replica r of every
     * shard. */
    int split = g_split_at > 0 || g_lose_at > 0;
    for (int r = 1; r < s.R && split; r++) { /* both left shard 0's primary */
        for (int k = 0; k < world; k++)
            CHECK_EQ(ferry_cluster_replicas_dropped(runs[k].cl, NULL, 0), 1);
        fprintf(stderr, "  split at step %d: both ranks went on with shard 0's backup\n",
                g_split_at > 0 ? g_split_at : g_lose_at);
    }
    for (int r = 1; r < s.R && !split; r++) {
        ferry_cluster *cl[2];
        for (int k = 0; k < 2; k++) {
            char t[128];
            int rr = k == 0 ? 0 : r;
            (void)snprintf(t, sizeof t, "127.0.0.1:%d,127.0.0.1:%d",
                           ferry_ps_server_port(s.srv[0 * s.R + rr]),
                           ferry_ps_server_port(s.srv[1 * s.R + rr]));
            CHECK_OK(ferry_ps_connect(t, NULL, &cl[k]));
        }
        int checked = 0;
        for (int g = -4; g < lm0->ngroups; g++) {
            const char *name, *param = "weight";
            int64_t rows, numel;
            if (g == -4) { /* the job's dense blocks: the ranks' LSTM, one float per row */
                if (lm0->dense_remote == NULL)
                    continue;
                name = ferry_remote_name(lm0->dense_remote);
                rows = numel = lm0->split;
            } else if (g == -3) { /* ... and the decoder slice's, if any */
                if (lm0->slice_remote == NULL)
                    continue;
                name = ferry_remote_name(lm0->slice_remote);
                rows = numel = lm0->P.numel - lm0->split;
            } else if (g < 0) { /* the embedding and the decoder, shaped as the local model's */
                int idx = ferry_params_find(&loc->P, g == -2 ? "encoder.weight" : "decoder.weight");
                name = ferry_remote_name(g == -2 ? lm0->emb_remote : lm0->dec_remote);
                rows = loc->P.items[idx].shape.dim[0];
                numel = loc->P.items[idx].numel;
            } else if (lm0->groups[g].server >= 0) { /* a stage's layers: one packed row */
                name = ferry_remote_name(lm0->groups[g].remote);
                rows = 1;
                numel = lm0->groups[g].view.numel;
            } else {
                continue;
            }
            float *a = malloc((size_t)numel * sizeof *a), *b = malloc((size_t)numel * sizeof *b);
            CHECK(a != NULL && b != NULL);
            ferry_remote *ma, *mb;
            ferry_cluster *one[2] = {NULL, NULL}; /* a stage's server alone */
            for (int k = 0; k < 2 && g >= 0; k++) {
                char t[64];
                (void)snprintf(
                    t, sizeof t, "127.0.0.1:%d",
                    ferry_ps_server_port(s.srv[lm0->groups[g].server * s.R + (k == 0 ? 0 : r)]));
                CHECK_OK(ferry_ps_connect(t, NULL, &one[k]));
            }
            CHECK_OK(ferry_remote_attach(g >= 0 ? one[0] : cl[0], name, NULL, &ma));
            CHECK_OK(ferry_remote_attach(g >= 0 ? one[1] : cl[1], name, NULL, &mb));
            CHECK_OK(ferry_remote_get_params(ma, param, 0, rows, a));
            CHECK_OK(ferry_remote_get_params(mb, param, 0, rows, b));
            CHECK(memcmp(a, b, (size_t)numel * sizeof *a) == 0);
            checked++;
            ferry_remote_destroy(ma);
            ferry_remote_destroy(mb);
            ferry_cluster_destroy(one[0]);
            ferry_cluster_destroy(one[1]);
            free(a);
            free(b);
        }
        CHECK(checked >= 3);
        fprintf(stderr, "  replicas 0 and %d of each shard: %d modules bit-identical\n", r,
                checked);
        ferry_cluster_destroy(cl[0]);
        ferry_cluster_destroy(cl[1]);
        CHECK_EQ(ferry_cluster_replicas_dropped(runs[0].cl, NULL, 0), 0);
    }

    /* With micro-batches every rank ran its pipe every step, in that many chunks. */
    for (int r = 0; r < world && micro > 1; r++) {
        ferry_lm_pipe_stats ps;
        CHECK(runs[r].lm->pipe != NULL);
        ferry_lm_pipe_take_stats(runs[r].lm->pipe, &ps);
        CHECK_EQ(ps.steps, STEPS);
        CHECK_EQ(ferry_lm_pipe_micro(runs[r].lm->pipe), micro);
    }
    /* Every server applied each step once and holds no context. */
    ferry_ps_stats st;
    for (int i = 0; i < SERVERS; i++) { /* a shard's primary; its backups made none */
        CHECK_OK(ferry_cluster_stats(runs[0].cl, i, &st));
        CHECK_EQ(st.contexts_live, 0);
    }
    for (int r = 0; r < world; r++)
        rank_free(&runs[r]);
    free(runs);
    free(th);
    ferry_ctx_destroy(lctx);
    ferry_optim_destroy(lopt);
    ferry_lm_destroy(loc);
    setup_deinit(&s);
}

static void bsp_matches_local(int world, float stiefel, ferry_optim_kind kind, double lr,
                              double param_tol, const char *job) {
    bsp_matches_local_placed(world, stiefel, kind, lr, param_tol, job, 2, NULL, 1);
}

TEST(bsp_two_ranks_match_local) {
    bsp_matches_local(2, 0.0f, FERRY_OPTIM_SGD, LR, 1e-5, "bsp2");
}

TEST(bsp_four_ranks_match_local) {
    bsp_matches_local(4, 0.0f, FERRY_OPTIM_SGD, LR, 1e-5, "bsp4");
}

TEST(bsp_stiefel_matches_local) {
    bsp_matches_local(2, 0.1f, FERRY_OPTIM_SGD, LR, 1e-5, "bsp-stiefel");
}

/* Adam divides each update by sqrt(v): an element whose gradient is nearly zero moves
 * by about lr whatever its sign, so the last-bit differences of a split batch move a
 * few weights by a visible fraction of lr (measured: losses within 1e-8, parameter
 * elements within 1.9e-5 absolute, 1.9e-4 of max |W|, with or without the
 * constraint). The parameters are checked at 1e-3 here (|a - b| <= 1e-3 (|b| + 0.1));
 * SGD above at 1e-5. */
TEST(bsp_adam_stiefel_matches_local) {
    bsp_matches_local(2, 0.1f, FERRY_OPTIM_ADAM, 1e-3, 1e-3, "bsp-adam");
}

/* Model and pipeline parallel inside data parallel: each rank's pipeline (3
 * micro-batches) runs layer 0 on server 1 (Stiefel-constrained, shared by the ranks:
 * their contexts' gradients are summed there), layer 1 on server 0 and layer 2 in
 * the rank. */
TEST(bsp_stages_match_local) {
    bsp_matches_local_placed(2, 0.1f, FERRY_OPTIM_SGD, LR, 1e-5, "bsp-stages", 3,
                             "ps1:1,ps0:1,local:1", 3);
}

/* Replicated shards, primary-backup (2 shards x 2 replicas): the backups never see a
 * Forward, Backward or GradNorm; they apply the sum their primary made, shipped by the
 * ranks with the Step (the Stiefel penalty's gradient already in, and Adam's state
 * advanced by the same update), and end bit-identical to their primaries, while the
 * job matches the local trainer as the unreplicated one does. Also with layers on the
 * servers (lstm modules) and micro-batches. */
TEST(bsp_replicas_primary_backup) {
    g_R = 2;
    bsp_matches_local(2, 0.1f, FERRY_OPTIM_ADAM, 1e-3, 1e-3, "bsp-rep-adam");
    bsp_matches_local_placed(2, 0.1f, FERRY_OPTIM_SGD, LR, 1e-5, "bsp-rep-stages", 3,
                             "ps1:1,ps0:1,local:1", 3);
    /* Rank 0 alone leaves shard 0's primary at step 7: rank 1, waiting at the primary's
     * barrier (answered `pending`), finds rank 0 at the backup's and follows it, its
     * calls of the step replayed there; the job still matches the local trainer. */
    g_split_at = 7;
    bsp_matches_local(2, 0.0f, FERRY_OPTIM_SGD, LR, 1e-5, "bsp-rep-split");
    g_split_at = 0;
    /* Rank 1's answer from shard 0's primary at step 9 is lost after rank 0 got its own
     * and installed the step on the backup: rank 1 fails over there and is answered as
     * the primary answered (StepRequest.installed), no roll-back; rank 0 follows it at
     * the next step. The job still matches the local trainer. */
    g_lose_at = 9;
    bsp_matches_local(2, 0.0f, FERRY_OPTIM_SGD, LR, 1e-5, "bsp-rep-lost");
    g_lose_at = 0;
    g_R = 1;
}

/* Membership: rank out of range, a rank claimed twice, another world, another model;
 * each a clear error, and the servers go on serving. A job whose ranks all left is
 * started anew by the next join (a --load of a finished run). */
TEST(membership_errors) {
    setup s;
    setup_init(&s, 0.0f, FERRY_OPTIM_SGD, 1.0);
    ferry_cluster_config cc;
    ferry_cluster_config_default(&cc);
    cc.client_id = "trainer-a";
    ferry_cluster *a, *b2;
    CHECK_OK(ferry_ps_connect(s.targets, &cc, &a));
    cc.client_id = "trainer-b";
    CHECK_OK(ferry_ps_connect(s.targets, &cc, &b2));
    ferry_job *j0, *j1, *bad;
    ferry_job_config jc = {.name = "m",
                           .world = 2,
                           .rank = 0,
                           .sync = FERRY_SYNC_BSP,
                           .staleness = 0,
                           .sync_timeout_ms = 2000,
                           .model = "H=200 V=10000"};
    CHECK_OK(ferry_job_join(a, &jc, &j0));
    CHECK_OK(ferry_job_join(a, &jc, &bad)); /* the same client again: harmless */
    ferry_job_destroy(bad);
    CHECK_STATUS(ferry_job_join(b2, &jc, &bad), FERRY_ERR_EXISTS); /* rank 0 is a's */
    CHECK(strstr(ferry_error_last(), "held by another live session") != NULL);
    CHECK(strstr(ferry_error_last(), "trainer-a") == NULL); /* no holder is named */
    jc.rank = 2;
    CHECK_STATUS(ferry_job_join(b2, &jc, &bad), FERRY_ERR_INVALID);
    jc.rank = 1;
    jc.world = 3;
    CHECK_STATUS(ferry_job_join(b2, &jc, &bad), FERRY_ERR_EXISTS);
    CHECK(strstr(ferry_error_last(), "has world 2; this trainer says world 3") != NULL);
    jc.world = 2;
    jc.model = "H=650 V=10000";
    CHECK_STATUS(ferry_job_join(b2, &jc, &bad), FERRY_ERR_EXISTS);
    CHECK(strstr(ferry_error_last(), "H=650 here, H=200 in the job") != NULL);
    jc.model = "H=200 V=10000";
    jc.sync = FERRY_SYNC_ASYNC;
    CHECK_STATUS(ferry_job_join(b2, &jc, &bad), FERRY_ERR_EXISTS);
    CHECK(strstr(ferry_error_last(), "runs --sync bsp; this trainer asks async") != NULL);
    jc.sync = FERRY_SYNC_BSP;
    CHECK_OK(ferry_job_join(b2, &jc, &j1));
    CHECK_OK(ferry_job_leave(j0));
    CHECK_OK(ferry_job_leave(j1));
    jc.rank = 0;
    CHECK_OK(ferry_job_join(b2, &jc, &bad)); /* finished: a join starts the name anew */
    uint64_t min_step = 1;
    CHECK_OK(ferry_job_min_step(bad, &min_step));
    CHECK_EQ(min_step, 0);
    ferry_job_destroy(bad);
    ferry_job_destroy(j0);
    ferry_job_destroy(j1);
    /* The servers still serve. */
    int restarted = -1;
    CHECK_OK(ferry_cluster_hello(a, &restarted));
    CHECK_EQ(restarted, 0);
    ferry_cluster_destroy(a);
    ferry_cluster_destroy(b2);
    setup_deinit(&s);
}

/* A bsp rank that never arrives: the other's GradNorm fails after the sync timeout,
 * naming the missing rank; a later call of the failed job says so too. */
TEST(bsp_missing_rank_times_out) {
    setup s;
    setup_init(&s, 0.0f, FERRY_OPTIM_SGD, 1.0);
    ferry_cluster_config cc;
    ferry_cluster_config_default(&cc);
    cc.deadline_ms = 3000;
    ferry_cluster *cl;
    CHECK_OK(ferry_ps_connect(s.targets, &cc, &cl));
    ferry_job *jb;
    ferry_job_config jc = {.name = "lonely",
                           .world = 2,
                           .rank = 0,
                           .sync = FERRY_SYNC_BSP,
                           .staleness = 0,
                           .sync_timeout_ms = 1500,
                           .model = ""};
    CHECK_OK(ferry_job_join(cl, &jc, &jb));
    ferry_remote_config rc;
    ferry_remote_config_default(&rc, FERRY_REMOTE_DENSE, "w", 8, 4);
    rc.bias = 0;
    ferry_remote *w;
    CHECK_OK(ferry_remote_create(cl, &rc, &w));
    ferry_dist_ctx *dc;
    CHECK_OK(ferry_dist_ctx_create(cl, &dc));
    (void)ferry_dist_ctx_begin(dc);
    float buf[32];
    uint64_t call;
    CHECK_OK(ferry_remote_dense_pull(w, dc, buf, &call));
    for (int i = 0; i < 32; i++)
        buf[i] = 0.5f;
    CHECK_OK(ferry_remote_dense_push(w, dc, call, buf));
    CHECK_OK(ferry_dist_ctx_set_job(dc, jb, 1, 1.0, 1.0));
    double t0 = ferry_now(), ss = 0.0;
    CHECK_STATUS(ferry_dist_ctx_grad_sumsq(dc, &ss), FERRY_ERR_TIMEOUT);
    double waited = ferry_now() - t0;
    fprintf(stderr, "  after %.1f s: %s\n", waited, ferry_error_last());
    CHECK(strstr(ferry_error_last(), "rank 1 missing") != NULL);
    /* It waited for the missing rank (--sync-timeout 1.5 s) before failing. A lower
     * bound only: a loaded machine makes the wait longer, never shorter. */
    CHECK(waited >= 1.4);
    ferry_job *again = NULL;
    CHECK_STATUS(ferry_job_join(cl, &jc, &again), FERRY_ERR_TIMEOUT); /* the job failed */
    CHECK(again == NULL);
    ferry_dist_ctx_destroy(dc); /* before the job its context is tied to */
    ferry_job_destroy(jb);
    ferry_remote_destroy(w);
    ferry_cluster_destroy(cl);
    setup_deinit(&s);
}

/* A rank waiting for rank 0's ready whose server has gone, on a cluster with a 30 s
 * retry window: the wait still ends at its own limit (--sync-timeout 1.5 s), saying
 * why, rather than a retry window later. */
TEST(wait_ready_ends_on_time_when_a_server_goes) {
    ferry_ps_config pc;
    ferry_ps_config_default(&pc);
    pc.listen = "127.0.0.1:0";
    ferry_ps_server *srv;
    CHECK_OK(ferry_ps_server_create(&pc, &srv));
    CHECK_OK(ferry_ps_server_start(srv));
    char target[64];
    (void)snprintf(target, sizeof target, "127.0.0.1:%d", ferry_ps_server_port(srv));
    ferry_cluster_config cc;
    ferry_cluster_config_default(&cc);
    cc.deadline_ms = 10000;
    ferry_cluster *cl;
    CHECK_OK(ferry_ps_connect(target, &cc, &cl));
    ferry_cluster_set_retry(cl, 30000);
    ferry_job *jb;
    ferry_job_config jc = {.name = "waits",
                           .world = 2,
                           .rank = 1,
                           .sync = FERRY_SYNC_BSP,
                           .sync_timeout_ms = 1500,
                           .model = ""};
    CHECK_OK(ferry_job_join(cl, &jc, &jb));
    ferry_ps_server_destroy(srv);
    double t0 = ferry_now();
    ferry_status st = ferry_job_wait_ready(jb);
    double waited = ferry_now() - t0;
    if (st != FERRY_ERR_TIMEOUT)
        fprintf(stderr, "  %s\n", ferry_error_last());
    CHECK_EQ(st, FERRY_ERR_TIMEOUT);
    fprintf(stderr, "  after %.1f s: %s\n", waited, ferry_error_last());
    CHECK(strstr(ferry_error_last(), "within 1.5 s (--sync-timeout)") != NULL);
    CHECK(waited >= 1.4 && waited < 4.0); /* not the 30 s retry window */
    ferry_cluster_set_retry(cl, 0);
    ferry_job_destroy(jb);
    ferry_cluster_destroy(cl);
}

/* A client of `targets` (bf16 wire or not) and its handle on dense module `name` (R, C),
 * made on first use; dense_client_close undoes both. */
static void dense_client_open(const char *targets, int bf16, const char *name, int64_t R, int64_t C,
                              ferry_cluster **cl, ferry_remote **w) {
    ferry_cluster_config cc;
    ferry_cluster_config_default(&cc);
    cc.wire_bf16 = bf16;
    CHECK_OK(ferry_ps_connect(targets, &cc, cl));
    ferry_remote_config rc;
    ferry_remote_config_default(&rc, FERRY_REMOTE_DENSE, name, R, C);
    rc.bias = 0;
    CHECK_OK(ferry_remote_create(*cl, &rc, w));
}

static void dense_client_close(ferry_cluster *cl, ferry_remote *w) {
    ferry_remote_destroy(w);
    ferry_cluster_destroy(cl);
}

/* The dense pull in bf16 (proto section 3b), against 2 shards: two bf16 clients hold
 * the same image bit for bit; the first pull is W exactly, and each later one is within
 * 2^-8 of one step's change of W (16 times closer than W rounded to bf16 would be) in
 * at most 55% of the first pull's bytes; an f32 client still reads W exactly; a client
 * that skipped a step (its image is two versions old) gets the whole image, exact, and
 * is back on deltas after it. */
TEST(bf16_dense_images) {
    setup s;
    setup_init(&s, 0.0f, FERRY_OPTIM_SGD, 0.1);
    enum { R = 300, C = 129, N = R * C, CLIENTS = 3, PULLS = 7 };
    ferry_cluster *cl[CLIENTS];
    ferry_remote *w[CLIENTS];
    for (int i = 0; i < CLIENTS; i++) /* 0, 1: bf16; 2: f32 */
        dense_client_open(s.targets, i < 2, "img", R, C, &cl[i], &w[i]);
    float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b), *f = malloc(N * sizeof *f);
    float *prev = malloc(N * sizeof *prev), *g = malloc(N * sizeof *g);
    CHECK(a != NULL && b != NULL && f != NULL && prev != NULL && g != NULL);
    memset(prev, 0, N * sizeof *prev);
    for (int i = 0; i < N; i++)
        g[i] = 0.01f * sinf((float)i * 0.37f);
    ferry_dist_ctx *dc;
    CHECK_OK(ferry_dist_ctx_create(cl[0], &dc));
    uint64_t first = 0;
    for (int step = 0; step < PULLS; step++) {
        uint64_t sent, got0, got1, call;
        ferry_cluster_bytes(cl[0], &sent, &got0);
        (void)ferry_dist_ctx_begin(dc);
        CHECK_OK(ferry_remote_dense_pull(w[0], dc, a, &call));
        ferry_cluster_bytes(cl[0], &sent, &got1);
        uint64_t pulled = got1 - got0;
        CHECK_OK(ferry_remote_dense_pull(w[2], NULL, f, NULL)); /* W, exactly */
        int skip = step == 3;                                   /* client 1 misses a version */
        uint64_t b0, b1;
        ferry_cluster_bytes(cl[1], &sent, &b0);
        if (!skip)
            CHECK_OK(ferry_remote_dense_pull(w[1], NULL, b, NULL));
        ferry_cluster_bytes(cl[1], &sent, &b1);
        if (!skip)
            CHECK(memcmp(a, b, N * sizeof *a) == 0); /* one image */
        double err = 0.0, change = 0.0, rounded = 0.0;
        for (int i = 0; i < N; i++) {
            double wi = f[i], bf = ferry_rpc_bf16_to_f32(ferry_rpc_f32_to_bf16(f[i]));
            err = fmax(err, fabs((double)a[i] - wi));
            change = fmax(change, fabs(wi - (double)prev[i]));
            rounded = fmax(rounded, fabs(bf - wi));
        }
        if (step == 0) {
            CHECK(memcmp(a, f, N * sizeof *a) == 0);
            first = pulled;
        } else {
            CHECK(err <= change / 256.0 * 1.01 && err * 16.0 <= rounded);
            CHECK(pulled <= first * 55 / 100);
        }
        if (step == 4) /* after the skip: the whole image, then deltas again */
            CHECK(b1 - b0 >= first * 95 / 100);
        else if (step > 0 && !skip)
            CHECK(b1 - b0 <= first * 55 / 100);
        fprintf(stderr,
                "  pull %d: %llu bytes (client 1: %llu), |image - W| %.3g, one step %.3g, "
                "bf16(W) %.3g\n",
                step, (unsigned long long)pulled, (unsigned long long)(b1 - b0), err, change,
                rounded);
        memcpy(prev, f, N * sizeof *f);
        CHECK_OK(ferry_remote_dense_push(w[0], dc, call, g));
        CHECK_OK(ferry_dist_ctx_step(dc, 1.0f, 0.1));
    }
    ferry_dist_ctx_destroy(dc);
    for (int i = 0; i < CLIENTS; i++)
        dense_client_close(cl[i], w[i]);
    free(a);
    free(b);
    free(f);
    free(prev);
    free(g);
    setup_deinit(&s);
}

/* No room in the model budget for the image (1.5x the weights): bf16 pulls are W,
 * exact, in f32's bytes, and the server keeps serving. */
TEST(bf16_dense_no_room) {
    enum { R = 300, C = 129, N = R * C };
    ferry_ps_config pc;
    ferry_ps_config_default(&pc);
    pc.listen = "127.0.0.1:0";
    pc.max_model_bytes = 256 << 10; /* the weights (151 KiB), not their image too */
    ferry_ps_server *srv;
    CHECK_OK(ferry_ps_server_create(&pc, &srv));
    CHECK_OK(ferry_ps_server_start(srv));
    char target[64];
    (void)snprintf(target, sizeof target, "127.0.0.1:%d", ferry_ps_server_port(srv));
    ferry_cluster *cl[2];
    ferry_remote *w[2];
    for (int i = 0; i < 2; i++) /* 0: bf16; 1: f32 */
        dense_client_open(target, i == 0, "tight", R, C, &cl[i], &w[i]);
    float *a = malloc(N * sizeof *a), *f = malloc(N * sizeof *f), *g = malloc(N * sizeof *g);
    CHECK(a != NULL && f != NULL && g != NULL);
    for (int i = 0; i < N; i++)
        g[i] = 0.01f;
    ferry_dist_ctx *dc;
    CHECK_OK(ferry_dist_ctx_create(cl[0], &dc));
    for (int step = 0; step < 3; step++) {
        uint64_t sent, got0, got1, call;
        ferry_cluster_bytes(cl[0], &sent, &got0);
        (void)ferry_dist_ctx_begin(dc);
        CHECK_OK(ferry_remote_dense_pull(w[0], dc, a, &call));
        ferry_cluster_bytes(cl[0], &sent, &got1);
        CHECK_OK(ferry_remote_dense_pull(w[1], NULL, f, NULL));
        CHECK(memcmp(a, f, N * sizeof *a) == 0);
        CHECK(got1 - got0 >= (uint64_t)N * sizeof(float));
        CHECK_OK(ferry_remote_dense_push(w[0], dc, call, g));
        CHECK_OK(ferry_dist_ctx_step(dc, 1.0f, 0.1));
    }
    ferry_dist_ctx_destroy(dc);
    for (int i = 0; i < 2; i++)
        dense_client_close(cl[i], w[i]);
    free(a);
    free(f);
    free(g);
    ferry_ps_server_destroy(srv);
}

FERRY_TEST_MAIN(T(bsp_two_ranks_match_local) T(bsp_four_ranks_match_local)
                    T(bsp_stiefel_matches_local) T(bsp_adam_stiefel_matches_local)
                        T(bsp_stages_match_local) T(bsp_replicas_primary_backup)
                            T(membership_errors) T(bsp_missing_rank_times_out)
                                T(wait_ready_ends_on_time_when_a_server_goes) T(bf16_dense_images)
                                    T(bf16_dense_no_room))
