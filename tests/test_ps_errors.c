/* test_ps_errors.c - ferry-ps under bad calls: unknown contexts, modules, modes,
 * kinds and methods, wrong shapes, ids out of range, NaN gradients, oversized
 * messages and conflicting CreateModule configs each get their precise status and
 * message, and the server goes on answering. Also: a dead server fails a client
 * within its deadline, naming the peer; connecting tells a refused connection from a
 * host that does not resolve, in words that name no program's flag. Servers run
 * in-process on 127.0.0.1:0. */
#define _POSIX_C_SOURCE 200809L /* getaddrinfo */
#include <float.h>
#include <math.h>
#include <netdb.h>
#include <string.h>

#include "check.h"
#include "session.h"
#include "ferry.pb-c.h"
#include "ferry/ferry.h"
#include "common/rpc/rpc.h"
#include "common/core/log.h"
#include "common/rpc/testing.h"
#include "server/ps.h"

static ferry_ps_server *server_up(size_t max_message_bytes) {
    ferry_ps_config cfg;
    ferry_ps_config_default(&cfg);
    cfg.listen = "127.0.0.1:0";
    cfg.max_message_bytes = max_message_bytes;
    ferry_ps_server *s;
    CHECK_OK(ferry_ps_server_create(&cfg, &s));
    CHECK_OK(ferry_ps_server_start(s));
    return s;
}

/* A raw client; it waits for the connection (within each call's deadline) rather
 * than failing on a transient connect error. */
static ferry_rpc_client *raw_client(ferry_ps_server *s) {
    ferry_rpc_client_config cc = {.deadline_ms = 5000, .wait_for_ready = 1};
    ferry_rpc_client *c;
    CHECK_OK(ferry_rpc_client_create(ferry_ps_server_address(s), &cc, &c));
    CHECK_OK(ferry_test_hello(c, 0, NULL)); /* every call but Hello runs in a session */
    return c;
}

/* The last error mentions every one of the given fragments. */
static void check_message(const char *a, const char *b) {
    const char *msg = ferry_error_last();
    if (strstr(msg, a) == NULL || (b != NULL && strstr(msg, b) == NULL)) {
        fprintf(stderr, "message '%s' lacks '%s' or '%s'\n", msg, a, b ? b : "");
        CHECK(0);
    }
}

static void check_alive(ferry_rpc_client *c) {
    Ferry__V1__HelloRequest q;
    ferry__v1__hello_request__init(&q);
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    CHECK_OK(ferry_rpc_msg_set_head(&req, &q.base));
    CHECK_OK(ferry_rpc_call(c, FERRY_RPC_HELLO, &req, &reply, 5000));
    CHECK(((const Ferry__V1__HelloReply *)reply.head)->incarnation != 0);
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
}

/* One call with a header and up to two tensors; the reply is discarded. */
static ferry_status call(ferry_rpc_client *c, ferry_rpc_method method, const ProtobufCMessage *head,
                         const ferry_rpc_tensor *t0, const ferry_rpc_tensor *t1) {
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    CHECK_OK(ferry_rpc_msg_set_head(&req, head));
    if (t0 != NULL)
        CHECK_OK(ferry_rpc_msg_add(&req, t0));
    if (t1 != NULL)
        CHECK_OK(ferry_rpc_msg_add(&req, t1));
    ferry_status st = ferry_rpc_call(c, method, &req, &reply, 5000);
    if (st != FERRY_OK) /* the expected rejections, for the log */
        fprintf(stderr, "%s -> %s\n", ferry_rpc_method_name(method), ferry_error_last());
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
    return st;
}

static ferry_status forward(ferry_rpc_client *c, uint64_t ctx, uint64_t call_id, const char *module,
                            const char *mode, const ferry_rpc_tensor *t0,
                            const ferry_rpc_tensor *t1) {
    Ferry__V1__ForwardRequest q;
    ferry__v1__forward_request__init(&q);
    q.ctx_id = ctx;
    q.call_id = call_id;
    q.module = (char *)(uintptr_t)module;
    q.mode = (char *)(uintptr_t)mode;
    return call(c, FERRY_RPC_FORWARD, &q.base, t0, t1);
}

static ferry_status backward(ferry_rpc_client *c, uint64_t ctx, uint64_t call_id,
                             const char *module, const ferry_rpc_tensor *t0) {
    Ferry__V1__BackwardRequest q;
    ferry__v1__backward_request__init(&q);
    q.ctx_id = ctx;
    q.call_id = call_id;
    q.module = (char *)(uintptr_t)module;
    return call(c, FERRY_RPC_BACKWARD, &q.base, t0, NULL);
}

static ferry_rpc_tensor tensor(const char *name, int dtype, int ndim, int64_t d0, int64_t d1,
                               void *data) {
    ferry_rpc_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dtype;
    t.ndim = ndim;
    t.dim[0] = d0;
    t.dim[1] = d1;
    t.nbytes = (size_t)(d0 * (ndim > 1 ? d1 : 1)) * 4;
    t.data = data;
    (void)snprintf(t.name, sizeof t.name, "%s", name);
    return t;
}

/* An embedding [10, 4] and a decoder [12, 8], each on one unsharded server. */
static void create_modules(ferry_ps_server *s, ferry_cluster **cl, ferry_remote **emb,
                           ferry_remote **dec) {
    ferry_remote_config rc;
    CHECK_OK(ferry_ps_connect(ferry_ps_server_address(s), NULL, cl));
    ferry_remote_config_default(&rc, FERRY_REMOTE_EMBEDDING, "emb", 10, 4);
    CHECK_OK(ferry_remote_create(*cl, &rc, emb));
    ferry_remote_config_default(&rc, FERRY_REMOTE_DECODER, "dec", 12, 8);
    CHECK_OK(ferry_remote_create(*cl, &rc, dec));
}

TEST(unknown_context_module_mode_kind_method) {
    ferry_ps_server *s = server_up(0);
    ferry_cluster *cl;
    ferry_remote *emb, *dec;
    create_modules(s, &cl, &emb, &dec);
    ferry_rpc_client *c = raw_client(s);
    float g[4] = {0};
    ferry_rpc_tensor tg = tensor("grad", FERRY_RPC_DTYPE_F32, 2, 1, 4, g);

    CHECK_STATUS(backward(c, 0x1234, 1, "emb", &tg), FERRY_ERR_NOT_FOUND);
    check_message("NOT_FOUND", "unknown context 0x1234");
    Ferry__V1__GradNormRequest gq;
    ferry__v1__grad_norm_request__init(&gq);
    gq.ctx_id = 0x1234;
    CHECK_STATUS(call(c, FERRY_RPC_GRAD_NORM, &gq.base, NULL, NULL), FERRY_ERR_NOT_FOUND);
    Ferry__V1__StepRequest sq;
    ferry__v1__step_request__init(&sq);
    sq.ctx_id = 0x1234;
    CHECK_STATUS(call(c, FERRY_RPC_STEP, &sq.base, NULL, NULL), FERRY_ERR_NOT_FOUND);
    check_message("unknown context", NULL);
    check_alive(c);

    int32_t ids[1] = {3};
    ferry_rpc_tensor ti = tensor("ids", FERRY_RPC_DTYPE_I32, 1, 1, 0, ids);
    CHECK_STATUS(forward(c, 7, 1, "nope", "", &ti, NULL), FERRY_ERR_NOT_FOUND);
    check_message("NOT_FOUND", "unknown module 'nope'");
    CHECK_STATUS(forward(c, 7, 1, "emb", "bogus", &ti, NULL), FERRY_ERR_UNSUPPORTED);
    check_message("UNIMPLEMENTED", "unknown Forward mode 'bogus'");
    Ferry__V1__ModuleConfig mc; /* no kind in the oneof */
    ferry__v1__module_config__init(&mc);
    Ferry__V1__CreateModuleRequest cq;
    ferry__v1__create_module_request__init(&cq);
    cq.name = "conv0";
    cq.config = &mc;
    CHECK_STATUS(call(c, FERRY_RPC_CREATE_MODULE, &cq.base, NULL, NULL), FERRY_ERR_INVALID);
    check_message("the config names no kind", NULL);
    ferry_rpc_msg reply;
    ferry_rpc_msg_init(&reply);
    CHECK_STATUS(ferry__rpc_call_raw(c, "/ferry.v1.Ferry/Nope", "", 0, FERRY_RPC_HELLO, &reply, 5000),
                 FERRY_ERR_UNSUPPORTED);
    check_message("UNIMPLEMENTED", NULL);
    check_alive(c);

    /* ReleaseContext is acknowledged, known or not; the forward above left ctx 7 unused,
     * so open one properly first. */
    CHECK_OK(forward(c, 9, 1, "emb", "", &ti, NULL));
    Ferry__V1__ReleaseContextRequest rq;
    ferry__v1__release_context_request__init(&rq);
    rq.ctx_id = 9;
    ferry_rpc_msg req;
    ferry_rpc_msg_init(&req);
    CHECK_OK(ferry_rpc_msg_set_head(&req, &rq.base));
    CHECK_OK(ferry_rpc_call(c, FERRY_RPC_RELEASE_CONTEXT, &req, &reply, 5000));
    CHECK(((const Ferry__V1__ReleaseContextReply *)reply.head)->found);
    CHECK_OK(ferry_rpc_call(c, FERRY_RPC_RELEASE_CONTEXT, &req, &reply, 5000));
    CHECK(!((const Ferry__V1__ReleaseContextReply *)reply.head)->found);
    CHECK_STATUS(backward(c, 9, 1, "emb", &tg), FERRY_ERR_NOT_FOUND);
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
    check_alive(c);

    ferry_rpc_client_destroy(c);
    ferry_remote_destroy(emb);
    ferry_remote_destroy(dec);
    ferry_cluster_destroy(cl);
    ferry_ps_server_destroy(s);
}

/* One call whose reply is kept (the caller deinitializes it). */
static ferry_status call_reply(ferry_rpc_client *c, ferry_rpc_method method,
                               const ProtobufCMessage *head, const ferry_rpc_tensor *t0,
                               ferry_rpc_msg *reply) {
    ferry_rpc_msg req;
    ferry_rpc_msg_init(&req);
    CHECK_OK(ferry_rpc_msg_set_head(&req, head));
    if (t0 != NULL)
        CHECK_OK(ferry_rpc_msg_add(&req, t0));
    ferry_status st = ferry_rpc_call(c, method, &req, reply, 5000);
    ferry_rpc_msg_deinit(&req);
    return st;
}

/* One training step of the decoder in logits mode inside context ctx, every call
 * sent `times` times (a client retrying after lost replies); dh and the Step's
 * version of the last copy are returned. */
static void logits_step(ferry_rpc_client *c, uint64_t ctx, int times, const float *h,
                        const float *dl, float *dh, uint64_t *version) {
    ferry_rpc_tensor th = tensor("hidden", FERRY_RPC_DTYPE_F32, 2, 4, 8, (void *)(uintptr_t)h);
    ferry_rpc_tensor td = tensor("dlogits", FERRY_RPC_DTYPE_F32, 2, 4, 12, (void *)(uintptr_t)dl);
    ferry_rpc_msg reply;
    ferry_rpc_msg_init(&reply);
    for (int k = 0; k < times; k++) {
        Ferry__V1__ForwardRequest f;
        ferry__v1__forward_request__init(&f);
        f.ctx_id = ctx;
        f.call_id = 1;
        f.module = "dec";
        f.mode = "logits";
        CHECK_OK(call_reply(c, FERRY_RPC_FORWARD, &f.base, &th, &reply));
        CHECK_EQ(reply.ntensors, 1);
    }
    for (int k = 0; k < times; k++) {
        Ferry__V1__BackwardRequest b;
        ferry__v1__backward_request__init(&b);
        b.ctx_id = ctx;
        b.call_id = 1;
        b.module = "dec";
        CHECK_OK(call_reply(c, FERRY_RPC_BACKWARD, &b.base, &td, &reply));
        CHECK_EQ(reply.ntensors, 1);
        CHECK_EQ(reply.tensors[0].nbytes, 4 * 8 * sizeof(float));
        if (k > 0) /* the same answer every time */
            CHECK(memcmp(dh, reply.tensors[0].data, reply.tensors[0].nbytes) == 0);
        memcpy(dh, reply.tensors[0].data, reply.tensors[0].nbytes);
    }
    for (int k = 0; k < times; k++) {
        Ferry__V1__StepRequest q;
        ferry__v1__step_request__init(&q);
        q.ctx_id = ctx;
        q.scale = 1.0;
        CHECK_OK(call_reply(c, FERRY_RPC_STEP, &q.base, NULL, &reply));
        uint64_t v = ((const Ferry__V1__StepReply *)reply.head)->version;
        if (k > 0)
            CHECK_EQ(v, *version);
        *version = v;
    }
    ferry_rpc_msg_deinit(&reply);
}

/* A call sent again after its reply was lost (a client's retry, same context and
 * call ids) is applied once and answered alike: a Forward replaces its pending
 * state, a Backward answers with the reply it kept and adds no gradient, a Step
 * answers from what it kept and steps nothing. Checked against a second server that
 * gets every call once: parameters and replies bit-identical. */
TEST(retried_calls_are_applied_once) {
    ferry_ps_server *s[2];
    ferry_cluster *cl[2];
    ferry_remote *emb[2], *dec[2];
    ferry_rpc_client *c[2];
    for (int i = 0; i < 2; i++) {
        s[i] = server_up(0);
        create_modules(s[i], &cl[i], &emb[i], &dec[i]);
        c[i] = raw_client(s[i]);
    }
    static float h[4 * 8], dl[4 * 12], dh[2][4 * 8], w[2][12 * 8];
    for (int i = 0; i < 4 * 8; i++)
        h[i] = 0.1f * (float)(i % 7) - 0.3f;
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < 4 * 12; i++)
            dl[i] = 0.01f * (float)((i * (step + 3)) % 11) - 0.05f;
        uint64_t v[2] = {0, 0};
        logits_step(c[0], 40 + (uint64_t)step, 1, h, dl, dh[0], &v[0]);
        logits_step(c[1], 40 + (uint64_t)step, 3, h, dl, dh[1], &v[1]);
        CHECK_EQ(v[0], v[1]);
        CHECK_EQ(v[1], (uint64_t)step + 1);
        CHECK(memcmp(dh[0], dh[1], sizeof dh[0]) == 0);
        for (int i = 0; i < 2; i++)
            CHECK_OK(ferry_remote_get_params(dec[i], "weight", 0, 12, w[i]));
        CHECK(memcmp(w[0], w[1], sizeof w[0]) == 0);
    }
    ferry_ps_stats st;
    CHECK_OK(ferry_cluster_stats(cl[1], 0, &st));
    CHECK_EQ(st.contexts_live, 0);
    for (int i = 0; i < 2; i++) {
        ferry_rpc_client_destroy(c[i]);
        ferry_remote_destroy(emb[i]);
        ferry_remote_destroy(dec[i]);
        ferry_cluster_destroy(cl[i]);
        ferry_ps_server_destroy(s[i]);
    }
}

/* A context call that names another incarnation (its client spoke to an earlier
 * process on this address) is refused before it touches anything: the contexts it
 * refers to are gone. */
TEST(calls_to_a_restarted_server_are_refused) {
    ferry_ps_server *s = server_up(0);
    ferry_cluster *cl;
    ferry_remote *emb, *dec;
    create_modules(s, &cl, &emb, &dec);
    ferry_rpc_client *c = raw_client(s);
    int32_t ids[2] = {1, 2};
    ferry_rpc_tensor ti = tensor("ids", FERRY_RPC_DTYPE_I32, 1, 2, 0, ids);
    ferry_rpc_client_set_incarnation(c, ferry_cluster_incarnation(cl, 0));
    CHECK_OK(forward(c, 7, 1, "emb", "", &ti, NULL));
    ferry_rpc_client_set_incarnation(c, ferry_cluster_incarnation(cl, 0) ^ 1);
    CHECK_STATUS(forward(c, 8, 1, "emb", "", &ti, NULL), FERRY_ERR_NOT_FOUND);
    check_message("this ferry-ps restarted", NULL);
    ferry_ps_stats st;
    CHECK_OK(ferry_cluster_stats(cl, 0, &st));
    CHECK_EQ(st.contexts_live, 1); /* context 8 was never opened */
    ferry_rpc_client_set_incarnation(c, 0); /* not named: served */
    CHECK_OK(forward(c, 8, 1, "emb", "", &ti, NULL));
    ferry_rpc_client_destroy(c);
    ferry_remote_destroy(emb);
    ferry_remote_destroy(dec);
    ferry_cluster_destroy(cl);
    ferry_ps_server_destroy(s);
}

TEST(bad_inputs_get_precise_statuses) {
    ferry_ps_server *s = server_up(1u << 20);
    ferry_cluster *cl;
    ferry_remote *emb, *dec;
    create_modules(s, &cl, &emb, &dec);
    ferry_rpc_client *c = raw_client(s);

    /* Wrong shapes name the expected and the received shape. */
    static float hid[4 * 8];
    int32_t tgt[4] = {0, 1, 2, 11};
    ferry_rpc_tensor th = tensor("hidden", FERRY_RPC_DTYPE_F32, 2, 4, 7, hid);
    ferry_rpc_tensor tt = tensor("targets", FERRY_RPC_DTYPE_I32, 1, 4, 0, tgt);
    CHECK_STATUS(forward(c, 0, 0, "dec", "partials", &th, &tt), FERRY_ERR_SHAPE);
    check_message("INVALID_ARGUMENT", "'hidden' must be (*, 8), got (4, 7)");
    th = tensor("hidden", FERRY_RPC_DTYPE_F32, 2, 4, 8, hid);
    CHECK_STATUS(forward(c, 0, 0, "dec", "partials", &th, NULL), FERRY_ERR_INVALID);
    check_message("missing input tensor 'targets'", NULL);
    CHECK_OK(forward(c, 0, 0, "dec", "partials", &th, &tt));
    /* A non-finite input is named by its first index, wherever it lies: in the first or
     * a later full block of the scan (4,096 floats), at a block's edge, or in the tail
     * (1100 x 8 = two blocks and 608 floats); -0, a denormal and FLT_MAX pass. */
    static float hbig[1100 * 8];
    static int32_t tbig[1100];
    ferry_rpc_tensor thb = tensor("hidden", FERRY_RPC_DTYPE_F32, 2, 1100, 8, hbig);
    ferry_rpc_tensor ttb = tensor("targets", FERRY_RPC_DTYPE_I32, 1, 1100, 0, tbig);
    const struct {
        int at, later; /* the first bad element, and a later one (0: none) */
        float v;
        const char *msg;
    } bad[] = {{0, 8700, NAN, "hidden[0] is nan"},
               {100, 4500, INFINITY, "hidden[100] is inf"},
               {4095, 4096, NAN, "hidden[4095] is nan"},
               {4096, 4799, -INFINITY, "hidden[4096] is -inf"},
               {5000, 8200, INFINITY, "hidden[5000] is inf"},
               {8799, 0, NAN, "hidden[8799] is nan"}};
    const struct {
        int at;
        float v;
    } edge[] = {{1, -0.0f}, {4097, 1e-40f}, {8199, FLT_MAX}, {8700, -FLT_MAX}};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
        hbig[edge[i].at] = edge[i].v;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        float keep = hbig[bad[i].later];
        hbig[bad[i].at] = bad[i].v;
        if (bad[i].later > 0)
            hbig[bad[i].later] = NAN;
        CHECK_STATUS(forward(c, 0, 0, "dec", "partials", &thb, &ttb), FERRY_ERR_NUMERIC);
        check_message(bad[i].msg, NULL);
        hbig[bad[i].at] = 0.0f;
        if (bad[i].later > 0)
            hbig[bad[i].later] = keep;
    }
    CHECK_OK(forward(c, 0, 0, "dec", "partials", &thb, &ttb));
    /* Targets and ids out of range. */
    tgt[3] = 12;
    CHECK_STATUS(forward(c, 0, 0, "dec", "partials", &th, &tt), FERRY_ERR_RANGE);
    check_message("OUT_OF_RANGE", "targets[3] = 12 outside the vocabulary [0, 12)");
    int32_t ids[2] = {3, 10};
    ferry_rpc_tensor ti = tensor("ids", FERRY_RPC_DTYPE_I32, 1, 2, 0, ids);
    CHECK_STATUS(forward(c, 5, 1, "emb", "", &ti, NULL), FERRY_ERR_RANGE);
    check_message("ids[1] = 10 outside this shard's rows [0, 10)", NULL);
    check_alive(c);

    /* A NaN gradient is refused and leaves the context usable. */
    ids[1] = 4;
    CHECK_OK(forward(c, 5, 1, "emb", "", &ti, NULL));
    float g[2 * 4] = {0.5f, 0, 0, 0, 0, 0, 0, 0};
    g[6] = nanf("");
    ferry_rpc_tensor tg = tensor("grad", FERRY_RPC_DTYPE_F32, 2, 2, 4, g);
    CHECK_STATUS(backward(c, 5, 1, "emb", &tg), FERRY_ERR_NUMERIC);
    check_message("INVALID_ARGUMENT", "grad[6] is nan");
    ferry_rpc_tensor tw = tensor("grad", FERRY_RPC_DTYPE_F32, 2, 3, 4, hid);
    CHECK_STATUS(backward(c, 5, 1, "emb", &tw), FERRY_ERR_SHAPE);
    check_message("must be (2, 4), got (3, 4)", NULL);
    g[6] = 0.0f;
    CHECK_OK(backward(c, 5, 1, "emb", &tg));
    CHECK_OK(backward(c, 5, 1, "emb", &tg)); /* a retry: answered, applied once */
    Ferry__V1__StepRequest sq;
    ferry__v1__step_request__init(&sq);
    sq.ctx_id = 5;
    sq.scale = -1.0;
    CHECK_STATUS(call(c, FERRY_RPC_STEP, &sq.base, NULL, NULL), FERRY_ERR_NUMERIC);
    sq.scale = 1.0;
    CHECK_OK(call(c, FERRY_RPC_STEP, &sq.base, NULL, NULL));
    static float row[4];
    CHECK_OK(ferry_remote_get_params(emb, "weight", 3, 1, row));

    /* A request over the server's 1 MiB limit. */
    static float big[512 * 1024];
    ferry_rpc_tensor tb = tensor("hidden", FERRY_RPC_DTYPE_F32, 2, 64 * 1024, 8, big);
    CHECK_STATUS(forward(c, 0, 0, "dec", "logits", &tb, NULL), FERRY_ERR_RANGE);
    check_message("RESOURCE_EXHAUSTED", NULL);
    check_alive(c);

    ferry_ps_stats st;
    CHECK_OK(ferry_cluster_stats(cl, 0, &st));
    CHECK(st.errors >= 7);
    CHECK_EQ(st.modules, 2);
    ferry_rpc_client_destroy(c);
    ferry_remote_destroy(emb);
    ferry_remote_destroy(dec);
    ferry_cluster_destroy(cl);
    ferry_ps_server_destroy(s);
}

TEST(create_module_is_idempotent_and_names_the_difference) {
    ferry_ps_server *s = server_up(0);
    ferry_cluster *cl;
    ferry_remote *a, *b;
    CHECK_OK(ferry_ps_connect(ferry_ps_server_address(s), NULL, &cl));
    ferry_remote_config rc;
    ferry_remote_config_default(&rc, FERRY_REMOTE_DECODER, "dec", 20, 6);
    rc.init_seed = 3;
    CHECK_OK(ferry_remote_create(cl, &rc, &a));
    CHECK_EQ(ferry_remote_created(a), 1);
    float w0[6], w1[6];
    CHECK_OK(ferry_remote_get_params(a, "weight", 0, 1, w0));
    /* The same config again: reused as is, even with initial values offered. */
    static float init[20 * 6];
    rc.init_weight = init;
    CHECK_OK(ferry_remote_create(cl, &rc, &b));
    CHECK_EQ(ferry_remote_created(b), 0);
    CHECK_OK(ferry_remote_get_params(b, "weight", 0, 1, w1));
    CHECK(memcmp(w0, w1, sizeof w0) == 0);
    ferry_remote_destroy(b);
    rc.init_weight = NULL;
    rc.dims[1] = 7;
    CHECK_STATUS(ferry_remote_create(cl, &rc, &b), FERRY_ERR_EXISTS);
    check_message("ALREADY_EXISTS", "dims[1] 6 (existing) vs 7 (requested)");
    rc.dims[1] = 6;
    rc.optim.lr = 0.5;
    CHECK_STATUS(ferry_remote_create(cl, &rc, &b), FERRY_ERR_EXISTS);
    check_message("optimizer.lr 1 (existing) vs 0.5 (requested)", NULL);
    /* Bad configurations. */
    ferry_remote_config_default(&rc, FERRY_REMOTE_EMBEDDING, "bad name!", 20, 6);
    CHECK_STATUS(ferry_remote_create(cl, &rc, &b), FERRY_ERR_INVALID);
    check_message("outside [A-Za-z0-9_.:/-]", NULL);
    ferry_remote_config_default(&rc, FERRY_REMOTE_EMBEDDING, "e", 20, 6);
    rc.optim.kind = (ferry_optim_kind)99; /* goes out as the name "unknown" */
    CHECK_STATUS(ferry_remote_create(cl, &rc, &b), FERRY_ERR_INVALID);
    check_message("module 'e': ", "'unknown'");
    ferry_remote_config_default(&rc, FERRY_REMOTE_EMBEDDING, "e", 20, 6);
    rc.optim.momentum = -1.0;
    CHECK_STATUS(ferry_remote_create(cl, &rc, &b), FERRY_ERR_INVALID);
    check_message("momentum", NULL);
    ferry_ps_stats st;
    CHECK_OK(ferry_cluster_stats(cl, 0, &st));
    CHECK_EQ(st.modules, 1);
    ferry_remote_destroy(a);
    ferry_cluster_destroy(cl);
    ferry_ps_server_destroy(s);
}

TEST(dead_server_fails_within_the_deadline) {
    ferry_ps_server *s0 = server_up(0), *s1 = server_up(0);
    char targets[128], dead[64];
    (void)snprintf(targets, sizeof targets, "%s,%s", ferry_ps_server_address(s0),
                   ferry_ps_server_address(s1));
    (void)snprintf(dead, sizeof dead, "%s", ferry_ps_server_address(s1));
    ferry_cluster_config cc;
    ferry_cluster_config_default(&cc);
    cc.deadline_ms = 2000;
    ferry_cluster *cl;
    ferry_remote *emb;
    ferry_dist_ctx *dc;
    CHECK_OK(ferry_ps_connect(targets, &cc, &cl));
    ferry_remote_config rc;
    ferry_remote_config_default(&rc, FERRY_REMOTE_EMBEDDING, "emb", 10, 4);
    CHECK_OK(ferry_remote_create(cl, &rc, &emb));
    CHECK_OK(ferry_dist_ctx_create(cl, &dc));
    ferry_ps_server_destroy(s1);

    int32_t ids[3] = {1, 7, 9};
    float out[3 * 4];
    (void)ferry_dist_ctx_begin(dc);
    /* It fails (no hang: a missed deadline would meet ctest's timeout), naming the
     * dead server. */
    ferry_status st = ferry_remote_embedding_forward(emb, dc, ids, 3, out, NULL);
    CHECK(st == FERRY_ERR_UNAVAILABLE || st == FERRY_ERR_TIMEOUT);
    check_message(dead, NULL);
    fprintf(stderr, "dead server: %s (%s)\n", ferry_status_str(st), ferry_error_last());
    /* Releasing reaches the live server; the dead one is reported. */
    CHECK(ferry_dist_ctx_release(dc) != FERRY_OK);
    check_message(dead, NULL);
    ferry_ps_stats stats;
    CHECK_OK(ferry_cluster_stats(cl, 0, &stats));
    CHECK_EQ(stats.contexts_live, 0);

    /* Connecting to it fails at once, saying the connection was refused (also with
     * wait_for_ready, which is for later calls: UNAVAILABLE, not a deadline), or
     * after connect_timeout_ms (a lower bound: load only makes the wait longer). */
    ferry_cluster *none;
    CHECK_STATUS(ferry_ps_connect(dead, &cc, &none), FERRY_ERR_UNAVAILABLE);
    check_message(dead, "connection refused");
    cc.wait_for_ready = 1;
    cc.deadline_ms = 500;
    CHECK_STATUS(ferry_ps_connect(dead, &cc, &none), FERRY_ERR_UNAVAILABLE);
    check_message(dead, "connection refused");
    cc.connect_timeout_ms = 600;
    double t0 = ferry_now();
    CHECK_STATUS(ferry_ps_connect(dead, &cc, &none), FERRY_ERR_UNAVAILABLE);
    check_message("connection refused", "(still, after waiting 0.6 s for the servers)");
    CHECK(strstr(ferry_error_last(), "--") == NULL); /* libferry names no program's flag */
    CHECK(ferry_now() - t0 >= 0.6);
    CHECK_STATUS(ferry_ps_connect("", &cc, &none), FERRY_ERR_INVALID);
    CHECK_STATUS(ferry_ps_connect("a:1,,b:2", &cc, &none), FERRY_ERR_INVALID);

    /* Without any call, a cluster opens whether its servers are up or not; its health
     * check of the dead one fails at once, of the live one answers (no Hello first). */
    CHECK_OK(ferry_ps_open(targets, &cc, &none));
    int serving = 0;
    CHECK_OK(ferry_cluster_health(none, 0, &serving));
    CHECK(serving);
    cc.wait_for_ready = 0;
    ferry_cluster_destroy(none);
    CHECK_OK(ferry_ps_open(targets, &cc, &none));
    CHECK_STATUS(ferry_cluster_health(none, 1, &serving), FERRY_ERR_UNAVAILABLE);
    check_message(dead, "onnection refused"); /* refused, not a deadline waited out */
    ferry_cluster_destroy(none);

    /* A host that does not resolve fails at once, however long connect_timeout_ms is
     * (where the resolver can tell: without DNS it only says "try again"): the message
     * says it did not wait (no wall-clock bound: load only makes calls slower). */
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    int e = getaddrinfo("nosuchhost.invalid", NULL, &hints, &ai);
    if (ai != NULL)
        freeaddrinfo(ai);
    if (e == EAI_NONAME) {
        cc.connect_timeout_ms = 30000;
        CHECK_STATUS(ferry_ps_connect("nosuchhost.invalid:7000", &cc, &none), FERRY_ERR_NOT_FOUND);
        check_message("cannot resolve host 'nosuchhost.invalid'", NULL);
        CHECK(strstr(ferry_error_last(), "still, after waiting") == NULL);
        CHECK_STATUS(ferry_ps_open("nosuchhost.invalid:7000", &cc, &none), FERRY_ERR_NOT_FOUND);
        /* resolve_timeout_ms waits for the name, and then says how long it waited. */
        cc.resolve_timeout_ms = 600;
        t0 = ferry_now();
        CHECK_STATUS(ferry_ps_connect("nosuchhost.invalid:7000", &cc, &none), FERRY_ERR_NOT_FOUND);
        check_message("cannot resolve host", "(still, after waiting 0.6 s for the servers)");
        CHECK(ferry_now() - t0 >= 0.6); /* a lower bound: load only adds */
    } else {
        fprintf(stderr, "skipped the unknown-host checks: the resolver says '%s'\n",
                gai_strerror(e));
    }

    ferry_dist_ctx_destroy(dc);
    ferry_remote_destroy(emb);
    ferry_cluster_destroy(cl);
    ferry_ps_server_destroy(s0);
}

FERRY_TEST_MAIN(T(unknown_context_module_mode_kind_method) T(bad_inputs_get_precise_statuses)
                    T(create_module_is_idempotent_and_names_the_difference)
                        T(dead_server_fails_within_the_deadline)
                            T(retried_calls_are_applied_once)
                                T(calls_to_a_restarted_server_are_refused))
