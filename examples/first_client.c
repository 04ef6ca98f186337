/* first_client.c - a complete client of ferry's remote-module API: a bigram model
 * whose embedding and decoder both live on ferry-ps, which also runs their optimizer.
 * The README's "Your first client" shows this file as it is.
 *
 *     ferry-ps --listen 127.0.0.1:7000 &
 *     first_client 127.0.0.1:7000
 */
#include <stdio.h>
#include <stdlib.h>

#include <ferry/ferry.h>

enum { V = 32, E = 16, N = 64 }; /* vocabulary, embedding size, tokens per step */

static void check(ferry_status st, const char *what) {
    if (st != FERRY_OK) {
        fprintf(stderr, "first_client: %s: %s\n", what, ferry_error_last());
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: first_client HOST:PORT[,HOST:PORT...]\n");
        return 2;
    }
    ferry_cluster_config cc;
    ferry_cluster_config_default(&cc);
    cc.connect_timeout_ms = 10000; /* a server that is still starting is waited for */
    ferry_cluster *cl;
    check(ferry_ps_connect(argv[1], &cc, &cl), "connect");

    /* Two modules, their rows split over the servers: an embedding (V, E) and a
     * decoder W (V, E), b (V) whose softmax each server computes for its rows.
     * Each shard steps with SGD, lr 1. Creating a module that exists reuses it. */
    ferry_remote_config rc;
    ferry_remote *emb, *dec;
    ferry_remote_config_default(&rc, FERRY_REMOTE_EMBEDDING, "first.embedding", V, E);
    check(ferry_remote_create(cl, &rc, &emb), "create the embedding");
    ferry_remote_config_default(&rc, FERRY_REMOTE_DECODER, "first.decoder", V, E);
    check(ferry_remote_create(cl, &rc, &dec), "create the decoder");

    ferry_dist_ctx *dc;
    check(ferry_dist_ctx_create(cl, &dc), "create a distributed context");
    int32_t ids[N], next[N];
    float x[N * E], dx[N * E];
    for (int step = 1; step <= 100; step++) {
        for (int i = 0; i < N; i++) { /* the word after w is always (3 w + 1) mod V */
            ids[i] = (step * 7 + i) % V;
            next[i] = (3 * ids[i] + 1) % V;
        }
        uint64_t ce, cd; /* call ids: each Forward has one Backward */
        double loss = 0.0;
        (void)ferry_dist_ctx_begin(dc); /* the servers keep what Backward needs under it */
        check(ferry_remote_embedding_forward(emb, dc, ids, N, x, &ce), "embedding forward");
        check(ferry_remote_xent_forward(dec, dc, x, next, N, NULL, &loss, &cd), "decoder forward");
        check(ferry_remote_xent_backward(dec, dc, cd, NULL, 1.0f / N, dx), "decoder backward");
        check(ferry_remote_embedding_backward(emb, dc, ce, dx), "embedding backward");
        check(ferry_dist_ctx_step(dc, 1.0f, 0.0), "step"); /* every touched server steps */
        if (step % 20 == 0)
            printf("step %3d loss %.3f\n", step, loss / N);
    }
    ferry_dist_ctx_destroy(dc);
    ferry_remote_destroy(emb);
    ferry_remote_destroy(dec);
    ferry_cluster_destroy(cl); /* the modules stay on the servers */
    return 0;
}
