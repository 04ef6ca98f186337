/* classic_lm.c - tutorial: the classic parameter-server language model, built on
 * ferry's remote-module API (<ferry/ferry.h>) and libferry's nn layers, using only the
 * installed public headers. The
 * embedding table and the output layer live on ferry-ps, which also runs their
 * optimizer; only the LSTM lives in this process. Every step the (N, V) logits come
 * back from the server and their gradient goes out again: the design ferry-trainer's
 * sharded softmax (--decoder-mode sharded-softmax) improves on.
 *
 *     ferry-ps --listen 127.0.0.1:7000 &
 *     classic_lm 127.0.0.1:7000 [STEPS]
 *
 * The data are synthetic: in every column each word fixes the next one, so the loss
 * falls from ln V = 4.16 (a uniform guess) to about 0.2 in the default 60 steps. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <ferry/backend.h> /* ferry_backend_cpu */
#include <ferry/ferry.h>   /* clusters, remote modules, remote calls on the local tape */
#include <ferry/nn.h>      /* ferry_lstm_*, parameter blocks, autograd contexts */
#include <ferry/optim.h>   /* the local optimizer and global-norm clipping */

enum { V = 64, E = 32, H = 64, T = 12, B = 8 }; /* vocabulary, sizes, window (T, B) */

/* Tool code: any failure ends the program with ferry's one-line detail message. */
static void check(ferry_status st, const char *what) {
    if (st != FERRY_OK) {
        fprintf(stderr, "classic_lm: %s: %s (%s)\n", what, ferry_status_str(st),
                ferry_error_last());
        exit(1);
    }
}

/* One (T, B) window of inputs and targets. The next word is w -> (5 w + 3) mod 64,
 * a permutation of the vocabulary, so the targets are exactly predictable. */
static void make_window(int step, int32_t *in, int32_t *tg) {
    for (int b = 0; b < B; b++) {
        int32_t w = (int32_t)((step * 31 + b * 17) % V); /* where column b starts */
        for (int t = 0; t < T; t++) {
            in[t * B + b] = w;
            w = (5 * w + 3) % V;
            tg[t * B + b] = w;
        }
    }
}

int main(int argc, char **argv) {
    int steps = argc == 3 ? atoi(argv[2]) : 60;
    if (argc < 2 || argc > 3 || steps < 1) {
        fprintf(stderr, "usage: classic_lm HOST:PORT[,HOST:PORT...] [STEPS]\n");
        return 2;
    }

    /* 1. Connect. Each server of the list hosts one shard of every module. With
     *    wait_for_ready a server that is still starting is waited for (up to the
     *    call deadline) instead of failing at once. */
    ferry_cluster_config cc;
    ferry_cluster_config_default(&cc);
    cc.wait_for_ready = 1;
    ferry_cluster *cl;
    check(ferry_ps_connect(argv[1], &cc, &cl), "connect");

    /* 2. Create the remote modules: an embedding (V, E), rows split over the servers,
     *    and a decoder W (V, H), b (V), vocabulary slices over the servers. The
     *    defaults give each shard an SGD optimizer with lr 1. Creation is idempotent:
     *    run this twice against one server and the second run continues training. */
    ferry_remote_config rc;
    ferry_remote *emb, *dec;
    ferry_remote_config_default(&rc, FERRY_REMOTE_EMBEDDING, "classic_lm.encoder", V, E);
    check(ferry_remote_create(cl, &rc, &emb), "create the embedding");
    ferry_remote_config_default(&rc, FERRY_REMOTE_DECODER, "classic_lm.decoder", V, H);
    check(ferry_remote_create(cl, &rc, &dec), "create the decoder");

    /* 3. The local part: a one-layer LSTM whose weights live in a parameter block P,
     *    an SGD optimizer over P, an autograd context (its tape records local layers
     *    and remote calls alike) and a distributed context (the servers' side). */
    ferry_backend *be = ferry_backend_cpu();
    ferry_params P;
    ferry_lstm rnn;
    ferry_params_init(&P, be);
    check(ferry_lstm_init(&rnn, &P, "lstm", E, H, 1, 0.0f), "declare the LSTM");
    check(ferry_params_alloc(&P), "allocate the LSTM");
    for (int i = 0; i < P.count; i++)
        check(ferry_params_init_uniform(&P, i, 0.1f, 1), "initialise the LSTM");
    ferry_optim_config oc = ferry_optim_defaults(FERRY_OPTIM_SGD); /* lr 1 */
    ferry_optim *opt;
    ferry_ctx *ctx;
    ferry_dist_ctx *dc;
    check(ferry_optim_create(&P, &oc, &opt), "optimizer");
    check(ferry_ctx_create(be, &ctx), "autograd context");
    check(ferry_dist_ctx_create(cl, &dc), "distributed context");

    int32_t in[T * B], tg[T * B]; /* (T, B) host ids, wrapped as tensors once */
    ferry_tensor t_in = ferry_tensor_wrap(be, FERRY_DTYPE_I32, ferry_shape_2d(T, B), in);
    ferry_tensor t_tg = ferry_tensor_wrap(be, FERRY_DTYPE_I32, ferry_shape_2d(T, B), tg);
    for (int step = 0; step < steps; step++) {
        make_window(step, in, tg);
        /* 4. Open both contexts. The servers keep what each Backward will need
         *    under the distributed context's id until this step's Step. */
        ferry_ctx_reset(ctx, (uint64_t)step + 1);
        (void)ferry_dist_ctx_begin(dc);

        /* 5. Forward: ids (T, B) -> remote rows x (T, B, E) -> LSTM y (T, B, H) from a
         *    zero state -> remote logits (T, B, V) -> softmax cross-entropy here,
         *    summed over time and averaged over the batch (the PTB convention). */
        ferry_tensor *x, *y, *hn, *cn, *logits, *loss;
        double loss_sum = 0.0;
        check(ferry_dist_embedding_forward(emb, dc, ctx, &t_in, &x), "embedding forward");
        check(ferry_lstm_forward(&rnn, ctx, x, NULL, NULL, NULL, &y, &hn, &cn), "LSTM forward");
        check(ferry_dist_logits_forward(dec, dc, ctx, y, &logits), "decoder forward");
        check(ferry_xent_forward(ctx, logits, &t_tg, 1.0f / B, &loss, &loss_sum), "loss");

        /* 6. Backward walks the tape in reverse: the loss here, the decoder's
         *    Backward RPC (dlogits out, dh back; the server keeps dW, db), the LSTM,
         *    then the embedding's Backward RPC (one gradient row per distinct id). */
        check(ferry_ctx_backward(ctx, loss), "backward");

        /* 7. Clip by the global norm over local and remote gradients, and step every
         *    optimizer with the same coefficient: the servers' (GradNorm, then Step,
         *    which also closes the context) and this process's. */
        ferry_grads *G = ferry_ctx_grads(ctx, &P);
        double sumsq = 0.0;
        float coef = 1.0f;
        if (G == NULL)
            check(FERRY_ERR_NOMEM, "gradients");
        check(ferry_grads_sumsq(G, &sumsq), "local gradient norm");
        check(ferry_dist_ctx_clip_step(dc, sumsq, 5.0f, 0.0, &coef, NULL), "remote step");
        check(ferry_optim_step(opt, &P, G, coef), "local step");
        printf("step %3d loss %.4f\n", step + 1, loss_sum / (T * B)); /* per token */
        fflush(stdout);
    }

    /* 8. Clean up, local objects first. The modules stay on the servers. */
    ferry_dist_ctx_destroy(dc);
    ferry_ctx_destroy(ctx);
    ferry_optim_destroy(opt);
    ferry_params_deinit(&P);
    ferry_remote_destroy(emb);
    ferry_remote_destroy(dec);
    ferry_cluster_destroy(cl);
    return 0;
}
