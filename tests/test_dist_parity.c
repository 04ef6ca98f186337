/* test_dist_parity.c - the distributed model against the local one: with dropout
 * off and the same seed, 1 ferry-ps + this trainer process must reproduce the local
 * trainer bit for bit (README), in both decoder modes: the loss of each of 50 steps
 * of PTB, and afterwards every parameter (the embedding and decoder pulled back with
 * GetParams, the LSTM in the trainer) compared by their bits. The server runs
 * in-process on 127.0.0.1 (an ephemeral port), over real gRPC, with one OpenBLAS
 * thread (ferry-ps's default). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "server/ps.h"
#include "worker/batch.h"
#include "worker/corpus.h"
#include "worker/model-impl.h" /* the model's fields */

#define STEPS 50

typedef struct run {
    ferry_lm *lm;
    ferry_optim *opt;
    ferry_ctx *ctx;
} run;

static void run_init(run *r, ferry_backend *be, const ferry_lm_config *mc,
                     const ferry_lm_placement *pl) {
    ferry_optim_config oc = ferry_optim_defaults(FERRY_OPTIM_SGD);
    oc.lr = 1.0;
    CHECK_OK(ferry_lm_create_placed(be, mc, pl, &r->lm));
    CHECK_OK(ferry_optim_create(&r->lm->P, &oc, &r->opt));
    CHECK_OK(ferry_ctx_create(be, &r->ctx));
}

static void run_deinit(run *r) {
    ferry_ctx_destroy(r->ctx);
    ferry_optim_destroy(r->opt);
    ferry_lm_destroy(r->lm);
}

/* A remote module's parameter against the local model's, bit for bit. */
static void compare_remote(ferry_remote *m, const char *param, const ferry_lm *local,
                           const char *local_name) {
    int idx = ferry_params_find(&local->P, local_name);
    CHECK(idx >= 0);
    const ferry_param *p = &local->P.items[idx];
    float *buf = malloc((size_t)p->numel * sizeof *buf);
    CHECK(buf != NULL);
    CHECK_OK(ferry_remote_get_params(m, param, 0, p->shape.dim[0], buf));
    CHECK_SAME_BITS(local_name, buf, ferry_params_data(&local->P, idx), p->numel);
    free(buf);
}

static void parity(ferry_decoder_mode mode) {
    ferry_backend *be = ferry_backend_cpu();
    ferry_corpus *corpus;
    CHECK_OK(ferry_corpus_load(ferry_test_path("data/ptb"), &corpus));
    int64_t n;
    const int32_t *ids = ferry_corpus_ids(corpus, FERRY_SPLIT_TRAIN, &n);
    ferry_batches *b;
    CHECK_OK(ferry_batch_create(ids, 20 * (STEPS * 20 + 1), 20, &b));

    ferry_ps_config pc;
    ferry_ps_config_default(&pc);
    pc.listen = "127.0.0.1:0";
    ferry_ps_server *srv;
    CHECK_OK(ferry_ps_server_create(&pc, &srv));
    CHECK_OK(ferry_ps_server_start(srv));
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", ferry_ps_server_port(srv));
    ferry_cluster *cl;
    ferry_dist_ctx *dc;
    CHECK_OK(ferry_ps_connect(target, NULL, &cl));
    CHECK_OK(ferry_dist_ctx_create(cl, &dc));

    ferry_lm_config mc = {ferry_vocab_size(ferry_corpus_vocab(corpus)), 64, 64, 2, 0.0f, 0.1f,
                          0.0f, 7};
    ferry_optim_config oc = ferry_optim_defaults(FERRY_OPTIM_SGD);
    oc.lr = 1.0;
    ferry_lm_placement pl = {.cluster = cl,
                             .decoder_mode = mode,
                             .optim = oc,
                             .job = NULL,
                             .resume = 0,
                             .stages = NULL,
                             .local_vocab = 0};
    run loc, dist;
    run_init(&loc, be, &mc, NULL);
    run_init(&dist, be, &mc, &pl);

    double first = 0.0, last = 0.0;
    for (int s = 0; s < STEPS; s++) {
        ferry_window w;
        CHECK_OK(ferry_batch_window(b, (int64_t)s * 20, 20, &w));
        ferry_shape sh = ferry_shape_2d(w.T, w.B);
        ferry_tensor in = ferry_tensor_wrap(be, FERRY_DTYPE_I32, sh, (void *)(uintptr_t)w.inputs);
        ferry_tensor tg = ferry_tensor_wrap(be, FERRY_DTYPE_I32, sh, (void *)(uintptr_t)w.targets);
        ferry_lm_step_args a = {.loss_scale = 1.0f / 20.0f, .clip = 5.0f, .lr = 1.0, .ctx_id = (uint64_t)s + 1, .seed = 11, .job_step = 0};
        ferry_lm_step_result rl, rd;
        CHECK_OK(ferry_lm_train_step(loc.lm, loc.ctx, NULL, loc.opt, &in, &tg, &a, &rl));
        CHECK_OK(ferry_lm_train_step(dist.lm, dist.ctx, dc, dist.opt, &in, &tg, &a, &rd));
        if (memcmp(&rd.loss_sum, &rl.loss_sum, sizeof rl.loss_sum) != 0)
            fprintf(stderr, "  step %d: local %.17g distributed %.17g\n", s + 1, rl.loss_sum,
                    rd.loss_sum);
        CHECK_BITS_EQ(rd.loss_sum, rl.loss_sum);
        if (getenv("PARITY_VERBOSE"))
            fprintf(stderr, "  step %d: grad norm local %.9g distributed %.9g\n", s + 1,
                    rl.grad_norm, rd.grad_norm);
        if (s == 0)
            first = rl.loss_sum;
        last = rl.loss_sum;
    }
    fprintf(stderr, "  %s: 50 steps, loss %.4f -> %.4f per token, every loss bit-identical\n",
            mode == FERRY_DECODER_SHARDED ? "sharded-softmax" : "logits", first / 400.0,
            last / 400.0);
    CHECK(last < first); /* it trained */

    /* Parameters: the remote shards against the local model's encoder and decoder,
     * and the two local LSTMs against each other. */
    compare_remote(dist.lm->emb_remote, "weight", loc.lm, "encoder.weight");
    compare_remote(dist.lm->dec_remote, "weight", loc.lm, "decoder.weight");
    compare_remote(dist.lm->dec_remote, "bias", loc.lm, "decoder.bias");
    for (int i = 0; i < dist.lm->P.count; i++) {
        const ferry_param *p = &dist.lm->P.items[i];
        int j = ferry_params_find(&loc.lm->P, p->name);
        CHECK(j >= 0);
        CHECK_SAME_BITS(p->name, ferry_params_data(&dist.lm->P, i),
                        ferry_params_data(&loc.lm->P, j), p->numel);
    }

    ferry_ps_stats stats;
    CHECK_OK(ferry_cluster_stats(cl, 0, &stats));
    CHECK_EQ(stats.contexts_live, 0); /* every step freed its context */
    CHECK_EQ(stats.contexts_stepped, STEPS);

    run_deinit(&dist);
    run_deinit(&loc);
    ferry_dist_ctx_destroy(dc);
    ferry_cluster_destroy(cl);
    ferry_ps_server_destroy(srv);
    ferry_batch_destroy(b);
    ferry_corpus_destroy(corpus);
}

TEST(sharded_softmax_matches_local) {
    parity(FERRY_DECODER_SHARDED);
}

TEST(logits_matches_local) {
    parity(FERRY_DECODER_LOGITS);
}

FERRY_TEST_MAIN(T(sharded_softmax_matches_local) T(logits_matches_local))
