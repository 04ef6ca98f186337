/* model-impl.h - the fields of the LSTM language model (model.h), private to the
 * files that are the model: model.c (placement, the step) and pipeline.c (its
 * micro-batch pipeline), and to their tests. The rest of the trainer reads a model
 * through model.h's accessors. */
#ifndef FERRY_MODEL_IMPL_H
#define FERRY_MODEL_IMPL_H

#include "worker/model.h"

#include <pthread.h>

/* A data-parallel step's transfer of the decoder slice's block (lm->slice_remote) on a
 * thread of its own: its pull runs while the LSTM's forward does, its push while the
 * LSTM's backward does (model.c, "the slice's overlap"). */
typedef struct ferry_lm_slice_io {
    int want;    /* this training step overlaps the slice's pull and push */
    int started; /* a pull or push is out (its outcome not yet taken) */
    int running; /* ... on thread (else it ran inline) */
    int pushed;  /* this step's push went out on the thread */
    pthread_t thread;
    ferry_dist_ctx *dc;
    uint64_t call;     /* the step's pull of the slice (its push refers to it) */
    const float *grad; /* NULL: pull; else push this gradient block */
    ferry_status st;
    char err[512];
    double wait_s; /* the step's time blocked on the transfer */
} ferry_lm_slice_io;

/* A group of consecutive LSTM layers, run here or on a server. */
typedef struct ferry_lm_group {
    int first, count;     /* layers [first, first + count) of the stack */
    int server;           /* -1: this trainer; else the cluster's server index */
    ferry_lstm rnn;       /* its layers: in ferry_lm.P (local) or in view (remote) */
    ferry_remote *remote; /* remote: the lstm module */
    ferry_params view;    /* remote: its packed block on the host (initial values, reads) */
} ferry_lm_group;

typedef struct ferry_lm {
    ferry_lm_config cfg;
    ferry_backend *be;
    ferry_params P;      /* local parameters: everything, or the LSTM alone */
    ferry_embedding emb; /* local placement */
    ferry_lstm rnn;      /* the whole stack's layout (local: group 0's layers are these) */
    ferry_lm_group groups[FERRY_LSTM_MAX_LAYERS];
    int ngroups;
    /* Remote groups carry their state on the servers, in stream `stream` (training)
     * or stream + 1 (evaluation); synced is the stream whose state equals h, c (0:
     * none, so the next window sends h and c with the call). */
    uint64_t stream, synced;
    ferry_linear dec;                      /* local placement */
    ferry_remote *emb_remote, *dec_remote; /* distributed placement */
    /* Distributed with a local slice of the decoder: its rows (the vocabulary's last
     * local_vocab) as "decoder.weight" (local_vocab, H) and "decoder.bias" in P. */
    int64_t local_vocab;
    int dec_w, dec_b;           /* their indices in P */
    ferry_remote *dense_remote; /* data-parallel job: the LSTM block, P[0, split) */
    ferry_remote *slice_remote; /* ... with a decoder slice: its block, P[split, numel) */
    int64_t split;
    int slice_overlap; /* the slice's transfer may overlap the step (no replicas) */
    ferry_lm_slice_io slice;
    ferry_job *job;
    float *stage; /* host (P.numel): pulled weights, pushed grads */
    ferry_decoder_mode decoder_mode;
    ferry_lm_pipe *pipe; /* micro-batches (ferry_lm_set_micro_batches), or NULL */
    int grad_thread;     /* ferry_lm_grad_thread: where the LSTM's weight gradients form */
    int64_t B;           /* batch size of the carried state */
    ferry_tensor *h, *c; /* (L, B, H) carried state, owned */
} ferry_lm;

#endif /* FERRY_MODEL_IMPL_H */
