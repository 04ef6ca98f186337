/* fuzz_ps.c - libFuzzer target for one ferry-ps method's request handling, built
 * once per method (FUZZ_METHOD, see CMakeLists.txt). Each input runs against a fresh
 * in-process server (no network) that hosts one module of every kind (a sharded
 * embedding, a decoder slice, a linear layer, a Stiefel-constrained one, a dense
 * block, a 2-layer Stiefel-constrained lstm group) and a job of each consistency mode under small
 * budgets, with context 1 holding a saved Forward (call id 1) of each, so that
 * Backward, GradNorm, Step and ReleaseContext have state to work on. The input is
 * decoded as the method's request, exactly as the rpc layer does, dispatched, and
 * the reply encoded under the message limit. The server must never crash, leak or
 * touch memory it does not own (ASan/UBSan), and must still answer Hello. The server
 * has a --checkpoint-dir (a directory of this process's, emptied before and after
 * every input, so that no input restores another's checkpoint) and no checkpoint
 * rate limit, so Checkpoint requests get past the directory check and write; after
 * one that was answered OK, a server started on that directory must restore what it
 * wrote. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ferry.pb-c.h"
#include "common/rpc/rpc.h"
#include "common/core/log.h"
#include "common/rpc/codec.h"
#include "server/ps-impl.h"

#ifndef FUZZ_METHOD
#error "build with -DFUZZ_METHOD=FERRY_RPC_<METHOD>"
#endif

#define FUZZ_ASSERT(c)                                                                             \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_ps: %s failed: %s\n", #c, ferry_error_last());                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#define MESSAGE_LIMIT (1u << 20)

/* ---- the checkpoint directory ---- */

static char ck_dir[64];

/* Removes every file in ck_dir (the server writes plain files only). */
static void ck_dir_empty(void) {
    DIR *d = opendir(ck_dir);
    FUZZ_ASSERT(d != NULL);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char path[400];
        (void)snprintf(path, sizeof path, "%s/%s", ck_dir, e->d_name);
        (void)unlink(path);
    }
    (void)closedir(d);
}

static void ck_dir_remove(void) {
    ck_dir_empty();
    (void)rmdir(ck_dir);
}

/* The process's checkpoint directory, made on first use and removed at exit. */
static const char *ck_dir_get(void) {
    if (ck_dir[0] == '\0') {
        (void)snprintf(ck_dir, sizeof ck_dir, "/tmp/ferry-fuzz-ck-XXXXXX");
        FUZZ_ASSERT(mkdtemp(ck_dir) != NULL);
        FUZZ_ASSERT(atexit(ck_dir_remove) == 0);
    }
    return ck_dir;
}

static ferry_status call(ferry_ps_server *s, ferry_rpc_method m, ferry_rpc_msg *req) {
    ferry_rpc_msg reply;
    ferry_rpc_msg_init(&reply);
    reply.max_bytes = MESSAGE_LIMIT;
    ferry_status st = ferry__ps_dispatch(s, m, req, &reply);
    if (st == FERRY_OK) { /* as the rpc layer sends it */
        ferry__rpc_wire w;
        ferry__rpc_wire_init(&w);
        FUZZ_ASSERT(ferry__rpc_encode(&reply, ferry__rpc_method(m)->reply, FERRY_RPC_INLINE_MAX,
                                      &w) == FERRY_OK);
        ferry__rpc_wire_deinit(&w);
    }
    ferry_rpc_msg_deinit(&reply);
    return st;
}

/* A request built from a protobuf-c header and up to two tensors, decoded from its
 * wire form as the server receives it. */
static ferry_status call_built(ferry_ps_server *s, ferry_rpc_method m, const ProtobufCMessage *head,
                               const ferry_rpc_tensor *t0, const ferry_rpc_tensor *t1) {
    ferry_rpc_msg out, in;
    ferry_rpc_msg_init(&out);
    ferry_rpc_msg_init(&in);
    FUZZ_ASSERT(ferry_rpc_msg_set_head(&out, head) == FERRY_OK);
    if (t0 != NULL)
        FUZZ_ASSERT(ferry_rpc_msg_add(&out, t0) == FERRY_OK);
    if (t1 != NULL)
        FUZZ_ASSERT(ferry_rpc_msg_add(&out, t1) == FERRY_OK);
    ferry__rpc_wire w;
    ferry__rpc_wire_init(&w);
    FUZZ_ASSERT(ferry__rpc_encode(&out, ferry__rpc_method(m)->request, 64, &w) == FERRY_OK);
    uint8_t *buf = malloc(w.total + 1);
    FUZZ_ASSERT(buf != NULL);
    ferry__rpc_wire_flatten(&w, &out, buf);
    ferry__rpc_limits lim = {.max_message_bytes = MESSAGE_LIMIT, .max_tensors = 64};
    FUZZ_ASSERT(ferry__rpc_decode_flat(buf, w.total, ferry__rpc_method(m)->request, &lim, &in) ==
                FERRY_OK);
    ferry_status st = call(s, m, &in);
    ferry_rpc_msg_deinit(&in);
    ferry_rpc_msg_deinit(&out);
    ferry__rpc_wire_deinit(&w);
    free(buf);
    return st;
}

/* CreateModule of kind (its two sizes as the kind orders them), optionally
 * Stiefel-constrained (from its polar factor); an lstm group of `layers` with dropout. */
static void create_opts(ferry_ps_server *s, const char *name, const char *kind, int64_t d0,
                        int64_t d1, int64_t row_begin, int64_t row_count, int stiefel,
                        uint32_t layers) {
    Ferry__V1__CreateModuleRequest q;
    ferry__v1__create_module_request__init(&q);
    Ferry__V1__ModuleConfig mc;
    ferry__v1__module_config__init(&mc);
    Ferry__V1__OptimizerConfig oc;
    ferry__v1__optimizer_config__init(&oc);
    Ferry__V1__Stiefel k;
    ferry__v1__stiefel__init(&k);
    k.beta = 0.1;
    k.polar = 1;
    Ferry__V1__EmbeddingConfig ec;
    Ferry__V1__DecoderConfig dc;
    Ferry__V1__LinearConfig lc;
    Ferry__V1__DenseConfig nc;
    Ferry__V1__LstmConfig rc;
    ferry__v1__embedding_config__init(&ec);
    ferry__v1__decoder_config__init(&dc);
    ferry__v1__linear_config__init(&lc);
    ferry__v1__dense_config__init(&nc);
    ferry__v1__lstm_config__init(&rc);
    if (strcmp(kind, "embedding") == 0) {
        ec.vocab = d0, ec.width = d1;
        mc.kind_case = FERRY__V1__MODULE_CONFIG__KIND_EMBEDDING, mc.embedding = &ec;
    } else if (strcmp(kind, "decoder") == 0) {
        dc.vocab = d0, dc.hidden = d1;
        mc.kind_case = FERRY__V1__MODULE_CONFIG__KIND_DECODER, mc.decoder = &dc;
    } else if (strcmp(kind, "linear") == 0) {
        lc.input = d0, lc.output = d1, lc.stiefel = stiefel ? &k : NULL;
        mc.kind_case = FERRY__V1__MODULE_CONFIG__KIND_LINEAR, mc.linear = &lc;
    } else if (strcmp(kind, "dense") == 0) {
        nc.rows = d0, nc.cols = d1;
        mc.kind_case = FERRY__V1__MODULE_CONFIG__KIND_DENSE, mc.dense = &nc;
    } else {
        rc.input = d0, rc.hidden = d1, rc.layers = layers, rc.dropout_ppm = 300000;
        rc.stiefel = stiefel ? &k : NULL;
        mc.kind_case = FERRY__V1__MODULE_CONFIG__KIND_LSTM, mc.lstm = &rc;
    }
    oc.name = (char *)(uintptr_t) "sgd";
    oc.lr = 0.1;
    oc.momentum = 0.9;
    mc.row_begin = row_begin;
    mc.row_count = row_count;
    mc.optimizer = &oc;
    q.name = (char *)(uintptr_t)name;
    q.config = &mc;
    FUZZ_ASSERT(call_built(s, FERRY_RPC_CREATE_MODULE, &q.base, NULL, NULL) == FERRY_OK);
}

static void create(ferry_ps_server *s, const char *name, const char *kind, int64_t d0, int64_t d1,
                   int64_t row_begin, int64_t row_count, int stiefel) {
    create_opts(s, name, kind, d0, d1, row_begin, row_count, stiefel, 1);
}

/* An lstm group's Forward over x (2, 2, 4) from zeros, carrying into stream 7, with
 * dropout drawn from seed 1. */
static void forward_lstm(ferry_ps_server *s, const char *module) {
    Ferry__V1__ForwardRequest q;
    ferry__v1__forward_request__init(&q);
    q.ctx_id = 1;
    q.call_id = 1;
    q.module = (char *)(uintptr_t)module;
    Ferry__V1__LstmForwardArgs a;
    ferry__v1__lstm_forward_args__init(&a);
    a.stream = 7;
    a.reset = 1;
    a.carry = 1;
    a.seed = 1;
    q.args_case = FERRY__V1__FORWARD_REQUEST__ARGS_LSTM;
    q.lstm = &a;
    float x[16];
    for (int i = 0; i < 16; i++)
        x[i] = 0.05f * (float)(i % 7);
    ferry_rpc_tensor t0 = {.dtype = FERRY_RPC_DTYPE_F32, .ndim = 3, .dim = {2, 2, 4}, .data = x,
                           .nbytes = sizeof x};
    (void)snprintf(t0.name, sizeof t0.name, "x");
    FUZZ_ASSERT(call_built(s, FERRY_RPC_FORWARD, &q.base, &t0, NULL) == FERRY_OK);
}

static void forward(ferry_ps_server *s, const char *module, const char *in_name, int dtype,
                    int64_t n, int64_t width, const char *in2) {
    Ferry__V1__ForwardRequest q;
    ferry__v1__forward_request__init(&q);
    q.ctx_id = 1;
    q.call_id = 1;
    q.module = (char *)(uintptr_t)module;
    float x[64] = {0};
    int32_t ids[16];
    for (int i = 0; i < 64; i++)
        x[i] = 0.01f * (float)(i % 13);
    for (int i = 0; i < 16; i++)
        ids[i] = 8 + i;
    ferry_rpc_tensor t0 = {.dtype = dtype, .ndim = width > 0 ? 2 : 1, .dim = {n, width}};
    t0.data = dtype == FERRY_RPC_DTYPE_F32 ? (void *)x : (void *)ids;
    t0.nbytes = (size_t)(n * (width > 0 ? width : 1)) * 4;
    (void)snprintf(t0.name, sizeof t0.name, "%s", in_name);
    ferry_rpc_tensor t1 = {.dtype = FERRY_RPC_DTYPE_I32, .ndim = 1, .dim = {n}, .data = ids};
    t1.nbytes = (size_t)n * 4;
    if (in2 != NULL)
        (void)snprintf(t1.name, sizeof t1.name, "%s", in2);
    FUZZ_ASSERT(call_built(s, FERRY_RPC_FORWARD, &q.base, &t0, in2 ? &t1 : NULL) == FERRY_OK);
}

/* Rank 0 of a 2-rank job (elastic_min > 0: an elastic job of 1..2 members, rank 0
 * admitted over a global batch of 4, 2 columns per rank when not bsp); an in-process server cannot
 * hold a call, so a bsp or ssp wait is refused at once rather than waited for. */
static void join(ferry_ps_server *s, const char *job, Ferry__V1__SyncMode sync,
                 uint32_t elastic_min) {
    Ferry__V1__ModelKey k;
    ferry__v1__model_key__init(&k);
    k.key = (char *)(uintptr_t) "H";
    k.value = (char *)(uintptr_t) "4";
    Ferry__V1__ModelKey *kp = &k;
    Ferry__V1__JobMember mb;
    ferry__v1__job_member__init(&mb);
    mb.world = 2;
    mb.sync = sync;
    mb.staleness = 1;
    mb.n_model = 1;
    mb.model = &kp;
    mb.elastic_min = elastic_min;
    Ferry__V1__JobJoin jj;
    ferry__v1__job_join__init(&jj);
    jj.member = &mb;
    Ferry__V1__JobRequest q;
    ferry__v1__job_request__init(&q);
    q.job = (char *)(uintptr_t)job;
    q.action_case = FERRY__V1__JOB_REQUEST__ACTION_JOIN;
    q.join = &jj;
    FUZZ_ASSERT(call_built(s, FERRY_RPC_JOB, &q.base, NULL, NULL) == FERRY_OK);
    if (elastic_min == 0)
        return;
    Ferry__V1__JobElastic e;
    ferry__v1__job_elastic__init(&e);
    e.op = FERRY__V1__JOB_ELASTIC__OP__ADMIT;
    e.batch = 4;
    e.rank_columns = sync == FERRY__V1__SYNC_MODE__BSP ? 0 : 2; /* ssp, async: per rank */
    q.action_case = FERRY__V1__JOB_REQUEST__ACTION_ELASTIC;
    q.elastic = &e;
    FUZZ_ASSERT(call_built(s, FERRY_RPC_JOB, &q.base, NULL, NULL) == FERRY_OK);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int quiet;
    if (!quiet) {
        ferry_log_set_level(FERRY_LOG_LEVEL_ERROR); /* every rejection logs a warning */
        quiet = 1;
    }
    ferry_ps_config cfg;
    ferry_ps_config_default(&cfg);
    cfg.context_ttl_s = 3600.0;
    cfg.max_module_bytes = 1u << 20;
    cfg.max_model_bytes = 4u << 20;
    cfg.max_context_bytes = 8u << 20; /* an lstm call holds an autograd context (4.3 MiB) */
    cfg.max_contexts_bytes = 16u << 20;
    cfg.max_contexts = 64;
    cfg.checkpoint_dir = ck_dir_get();
    cfg.checkpoint_rate = 1 << 30; /* per minute: never the reason for a refusal */
    ck_dir_empty();
    ferry_ps_server *s;
    FUZZ_ASSERT(ferry__ps_server_create_local(&cfg, &s) == FERRY_OK);
    create(s, "emb", "embedding", 64, 4, 8, 16, 0); /* rows [8, 24) */
    create(s, "dec", "decoder", 64, 4, 0, 32, 0);   /* vocabulary [0, 32) */
    create(s, "lin", "linear", 4, 6, 0, 0, 0);
    create(s, "st", "linear", 4, 6, 0, 0, 1);
    forward(s, "emb", "ids", FERRY_RPC_DTYPE_I32, 4, 0, NULL);
    forward(s, "dec", "hidden", FERRY_RPC_DTYPE_F32, 4, 4, "targets");
    forward(s, "lin", "x", FERRY_RPC_DTYPE_F32, 3, 4, NULL);
    forward(s, "st", "x", FERRY_RPC_DTYPE_F32, 3, 4, NULL);
    create(s, "den", "dense", 16, 4, 0, 16, 0);
    forward(s, "den", "unused", FERRY_RPC_DTYPE_F32, 1, 4, NULL); /* a pull reads no input */
    create_opts(s, "rnn", "lstm", 4, 4, 0, 0, 1, 2);
    forward_lstm(s, "rnn");
    join(s, "j", FERRY__V1__SYNC_MODE__BSP, 0); /* jobs for GradNorm and Step: each mode */
    join(s, "k", FERRY__V1__SYNC_MODE__SSP, 0);
    join(s, "a", FERRY__V1__SYNC_MODE__ASYNC, 0);
    join(s, "e", FERRY__V1__SYNC_MODE__BSP, 1); /* elastic, rank 0 admitted */
    join(s, "f", FERRY__V1__SYNC_MODE__ASYNC, 1);

    ferry_rpc_method m = FUZZ_METHOD;
    ferry__rpc_limits lim = {.max_message_bytes = MESSAGE_LIMIT, .max_tensors = 64};
    ferry_rpc_msg req;
    ferry_rpc_msg_init(&req);
    ferry_status st = FERRY_ERR_INVALID;
    if (ferry__rpc_decode_flat(data, size, ferry__rpc_method(m)->request, &lim, &req) == FERRY_OK)
        st = call(s, m, &req); /* any status: what matters is that nothing breaks */
    ferry_rpc_msg_deinit(&req);

    Ferry__V1__HelloRequest h;
    ferry__v1__hello_request__init(&h);
    FUZZ_ASSERT(call_built(s, FERRY_RPC_HELLO, &h.base, NULL, NULL) == FERRY_OK);
    FUZZ_ASSERT(atomic_load(&ferry__ps_server_contexts(s)->bytes) >= 0);
    ferry_ps_server_destroy(s);
    if (m == FERRY_RPC_CHECKPOINT && st == FERRY_OK) {
        /* What was written and answered OK is what a restart restores. */
        ferry_ps_server *r;
        FUZZ_ASSERT(ferry__ps_server_create_local(&cfg, &r) == FERRY_OK);
        ferry_ps_server_destroy(r);
    }
    ck_dir_empty();
    return 0;
}
