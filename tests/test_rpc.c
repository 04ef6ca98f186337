/* test_rpc.c - the gRPC transport end to end: in-process servers on
 * 127.0.0.1:0 with a test handler table, ferry clients, and every failure the
 * layer promises to report precisely (unknown methods, oversize and malformed
 * messages, handler errors, deadlines, dead peers, shutdown with calls in
 * flight), plus concurrent fan-out and concurrent callers. No check depends on how
 * fast the machine is: a call is held in its handler by a gate the test opens, and
 * concurrency is shown by handlers that wait for each other (lower bounds on a
 * deadline's wait are kept: load only makes a wait longer). */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "ferry.pb-c.h"
#include "common/rpc/rpc.h"
#include "common/core/log.h"
#include "common/rpc/testing.h"

/* ---- Test server ------------------------------------------------------------------- */

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Forward: echo. Tensors move from request to reply without a copy; the reply
 * header returns ctx_id as version. Misaligned input fails. */
static ferry_status handle_forward(ferry_rpc_msg *req, ferry_rpc_msg *reply) {
    const Ferry__V1__ForwardRequest *q = req->head;
    Ferry__V1__ForwardReply r;
    ferry__v1__forward_reply__init(&r);
    r.version = q->ctx_id;
    ferry_status st = ferry_rpc_msg_set_head(reply, &r.base);
    for (int i = 0; st == FERRY_OK && i < req->ntensors; i++) {
        if (((uintptr_t)req->tensors[i].data & 63) != 0)
            return ferry_errorf(FERRY_ERR_INVALID, "tensor %d is not 64-byte aligned", i);
        ferry_rpc_tensor t;
        if ((st = ferry_rpc_msg_take(req, i, &t)) == FERRY_OK &&
            (st = ferry_rpc_msg_add(reply, &t)) != FERRY_OK && t.release != NULL)
            t.release(t.release_user);
    }
    return st;
}

/* The test server's Backward takes its orders from the request's two numbers:
 * call_id is how many ms it sleeps, or GATE to be held in its handler until the test
 * opens the gate; a ctx_id N > 0 sends it to the rendezvous of N handlers first.
 * in_backward counts the Backward handlers running; arrived counts those that came
 * to the rendezvous since the test zeroed it. */
#define GATE UINT64_MAX
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_open;
static atomic_int in_backward, arrived;

static void gate_set(int open) {
    pthread_mutex_lock(&gate_mu);
    gate_open = open;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

/* Waits (polling, at most 60 s) until *count >= n. */
static int await_count(atomic_int *count, int n) {
    for (int i = 0; i < 12000; i++) {
        if (atomic_load(count) >= n)
            return 1;
        sleep_ms(5);
    }
    return 0;
}

/* Waits until at least n Backward handlers are running. */
static int await_in_backward(int n) {
    return await_count(&in_backward, n);
}

/* Backward: with ctx_id = N > 0, first comes to the rendezvous and waits there until
 * N handlers have come (at most 60 s, then fails): none leaves before all N are in,
 * so they ran at once; then sleeps call_id ms, or with call_id = GATE waits for the
 * gate (at most 120 s, then fails); then answers with an empty reply. */
static ferry_status handle_backward(ferry_rpc_msg *req) {
    const Ferry__V1__BackwardRequest *q = req->head;
    ferry_status st = FERRY_OK;
    atomic_fetch_add(&in_backward, 1);
    if (q->ctx_id > 0) {
        atomic_fetch_add(&arrived, 1);
        if (!await_count(&arrived, (int)q->ctx_id))
            st = ferry_errorf(FERRY_ERR_TIMEOUT, "never %d Backward handlers at once",
                              (int)q->ctx_id);
    }
    if (st == FERRY_OK && q->call_id == GATE) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 120;
        pthread_mutex_lock(&gate_mu);
        int rc = 0;
        while (!gate_open && rc == 0)
            rc = pthread_cond_timedwait(&gate_cv, &gate_mu, &until);
        if (!gate_open)
            st = ferry_errorf(FERRY_ERR_TIMEOUT, "the test never opened the gate");
        pthread_mutex_unlock(&gate_mu);
    } else if (st == FERRY_OK && q->call_id > 0) {
        sleep_ms((int)q->call_id);
    }
    atomic_fetch_sub(&in_backward, 1);
    return st;
}

/* GradNorm: modules[0] picks an error; otherwise sum_squares = 2.5. */
static ferry_status handle_grad_norm(ferry_rpc_msg *req, ferry_rpc_msg *reply) {
    const Ferry__V1__GradNormRequest *q = req->head;
    const char *mode = q->n_modules > 0 ? q->modules[0] : "";
    if (strcmp(mode, "nope") == 0)
        return ferry_errorf(FERRY_ERR_NOT_FOUND, "module 'nope' not found");
    if (strcmp(mode, "shape") == 0)
        return ferry_errorf(FERRY_ERR_SHAPE, "grad (3, 4) does not match param (4, 3)");
    if (strcmp(mode, "silent") == 0)
        return FERRY_ERR_NUMERIC; /* no detail: the status text is sent */
    Ferry__V1__GradNormReply r;
    ferry__v1__grad_norm_reply__init(&r);
    r.sum_squares = 2.5;
    return ferry_rpc_msg_set_head(reply, &r.base);
}

/* Hello: replies with a payload of worker_id bytes. Step: a borrowed tensor,
 * which the server must refuse to send. */
static ferry_status handle_other(ferry_rpc_method method, ferry_rpc_msg *req,
                                 ferry_rpc_msg *reply) {
    static float borrowed[4];
    if (method == FERRY_RPC_STEP) {
        ferry_rpc_tensor t = {.dtype = FERRY_RPC_DTYPE_F32,
                              .ndim = 1,
                              .dim = {4},
                              .data = borrowed,
                              .nbytes = sizeof borrowed,
                              .name = "w"};
        return ferry_rpc_msg_add(reply, &t);
    }
    const Ferry__V1__HelloRequest *q = req->head;
    int64_t dim = q->worker_id / 4;
    void *data;
    ferry_status st = ferry_rpc_msg_alloc(reply, FERRY_RPC_DTYPE_F32, 1, &dim, "blob", &data);
    if (st == FERRY_OK)
        memset(data, 0x3c, (size_t)dim * 4);
    return st;
}

static ferry_status test_handler(void *user, ferry_rpc_method method, ferry_rpc_msg *req,
                                 ferry_rpc_msg *reply) {
    atomic_fetch_add((atomic_int *)user, 1);
    switch (method) {
    case FERRY_RPC_FORWARD:
        return handle_forward(req, reply);
    case FERRY_RPC_BACKWARD:
        return handle_backward(req);
    case FERRY_RPC_GRAD_NORM:
        return handle_grad_norm(req, reply);
    default:
        return handle_other(method, req, reply);
    }
}

static atomic_int handled;

/* A server on an ephemeral port serving everything but Stats; *port gets it. */
static ferry_rpc_server *start_server(size_t max_bytes, int threads, char *target, size_t cap) {
    ferry_rpc_server_config cfg = {.listen = "127.0.0.1:0",
                                   .threads = threads,
                                   .max_message_bytes = max_bytes,
                                   .user = &handled};
    for (int m = 0; m < FERRY_RPC_METHOD_COUNT; m++)
        cfg.handlers[m] = m == FERRY_RPC_STATS ? NULL : test_handler;
    ferry_rpc_server *srv;
    CHECK_OK(ferry_rpc_server_create(&cfg, &srv));
    CHECK(ferry_rpc_server_port(srv) > 0);
    (void)snprintf(target, cap, "127.0.0.1:%d", ferry_rpc_server_port(srv));
    return srv;
}

static ferry_rpc_client *connect_to(const char *target, size_t max_bytes) {
    ferry_rpc_client_config cfg = {.max_message_bytes = max_bytes, .deadline_ms = 5000};
    ferry_rpc_client *c;
    CHECK_OK(ferry_rpc_client_create(target, &cfg, &c));
    return c;
}

static ferry_status call_backward(ferry_rpc_client *c, int sleep, int deadline_ms) {
    Ferry__V1__BackwardRequest q;
    ferry__v1__backward_request__init(&q);
    q.call_id = sleep < 0 ? GATE : (uint64_t)sleep; /* ms the test server sleeps; -1: the gate */
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    CHECK_OK(ferry_rpc_msg_set_head(&req, &q.base));
    ferry_status st = ferry_rpc_call(c, FERRY_RPC_BACKWARD, &req, &reply, deadline_ms);
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
    return st;
}

static ferry_status call_grad_norm(ferry_rpc_client *c, const char *mode) {
    Ferry__V1__GradNormRequest q;
    ferry__v1__grad_norm_request__init(&q);
    char *modules[1] = {(char *)(uintptr_t)mode};
    q.n_modules = 1;
    q.modules = modules;
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    CHECK_OK(ferry_rpc_msg_set_head(&req, &q.base));
    ferry_status st = ferry_rpc_call(c, FERRY_RPC_GRAD_NORM, &req, &reply, 0);
    if (st == FERRY_OK)
        CHECK(((const Ferry__V1__GradNormReply *)reply.head)->sum_squares == 2.5);
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
    return st;
}

/* Echoes one f32 tensor of n bytes (n % 4 == 0) and checks it bit for bit. */
static ferry_status echo_bytes(ferry_rpc_client *c, size_t n) {
    float *x = malloc(n > 0 ? n : 1);
    for (size_t i = 0; i < n / 4; i++)
        x[i] = (float)i * 0.25f - 3.0f;
    ferry_rpc_tensor t = {.dtype = FERRY_RPC_DTYPE_F32,
                          .ndim = 1,
                          .dim = {(int64_t)(n / 4)},
                          .data = x,
                          .nbytes = n,
                          .name = "x"};
    Ferry__V1__ForwardRequest q;
    ferry__v1__forward_request__init(&q);
    q.ctx_id = 77;
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    CHECK_OK(ferry_rpc_msg_set_head(&req, &q.base));
    CHECK_OK(ferry_rpc_msg_add(&req, &t));
    ferry_status st = ferry_rpc_call(c, FERRY_RPC_FORWARD, &req, &reply, 0);
    if (st == FERRY_OK) {
        CHECK_EQ(((const Ferry__V1__ForwardReply *)reply.head)->version, 77);
        CHECK_EQ(reply.ntensors, 1);
        CHECK_EQ(reply.tensors[0].nbytes, n);
        CHECK(strcmp(reply.tensors[0].name, "x") == 0);
        CHECK(n == 0 || ((uintptr_t)reply.tensors[0].data & 63) == 0);
        CHECK(n == 0 || memcmp(reply.tensors[0].data, x, n) == 0);
    }
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
    free(x);
    return st;
}

/* ---- Data paths -------------------------------------------------------------------------- */

TEST(echo_sizes) {
    char target[64];
    ferry_rpc_server *srv = start_server(64u << 20, 2, target, sizeof target);
    ferry_rpc_client *c = connect_to(target, 64u << 20);
    const size_t sizes[] = {0, 4, 16, 1024, 1028, 65540, 1u << 20, (8u << 20) + 12};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        CHECK_OK(echo_bytes(c, sizes[i]));
    ferry_rpc_server_stats stats;
    ferry_rpc_server_get_stats(srv, &stats);
    CHECK_EQ(stats.calls, 8);
    CHECK_EQ(stats.errors, 0);
    CHECK(stats.bytes_in > (9u << 20) && stats.bytes_out > (9u << 20));
    for (int i = 0; i < 6000 && stats.in_flight != 0; i++) { /* the last close may lag */
        sleep_ms(10);
        ferry_rpc_server_get_stats(srv, &stats);
    }
    CHECK_EQ(stats.in_flight, 0);
    ferry_rpc_client_destroy(c);
    ferry_rpc_server_destroy(srv);
}

/* Several tensors of all dtypes in one message, some owned by the request. */
TEST(echo_multi) {
    char target[64];
    ferry_rpc_server *srv = start_server(0, 1, target, sizeof target);
    ferry_rpc_client *c = connect_to(target, 0);
    int32_t ids[5] = {3, 1, 4, 1, 5};
    int64_t big[3000];
    for (int i = 0; i < 3000; i++)
        big[i] = (int64_t)i * 1000003 - (1LL << 50);
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    ferry_rpc_tensor a = {.dtype = FERRY_RPC_DTYPE_I32,
                          .ndim = 1,
                          .dim = {5},
                          .data = ids,
                          .nbytes = sizeof ids,
                          .name = "ids"};
    ferry_rpc_tensor b = {.dtype = FERRY_RPC_DTYPE_I64,
                          .ndim = 3,
                          .dim = {10, 30, 10},
                          .data = big,
                          .nbytes = sizeof big,
                          .name = "big"};
    CHECK_OK(ferry_rpc_msg_add(&req, &a));
    CHECK_OK(ferry_rpc_msg_add(&req, &b));
    float *h;
    int64_t hd[2] = {64, 33};
    CHECK_OK(ferry_rpc_msg_alloc(&req, FERRY_RPC_DTYPE_F32, 2, hd, "hidden", (void **)&h));
    for (int i = 0; i < 64 * 33; i++)
        h[i] = (float)i / 7.0f;
    float one = 1.5f;
    ferry_rpc_tensor s = {.dtype = FERRY_RPC_DTYPE_F32, .ndim = 0, .data = &one, .nbytes = 4};
    CHECK_OK(ferry_rpc_msg_add(&req, &s));
    for (int round = 0; round < 2; round++) { /* the request is not consumed */
        CHECK_OK(ferry_rpc_call(c, FERRY_RPC_FORWARD, &req, &reply, 0));
        CHECK_EQ(reply.ntensors, 4);
        for (int i = 0; i < 4; i++) {
            const ferry_rpc_tensor *x = &reply.tensors[i], *y = &req.tensors[i];
            CHECK(strcmp(x->name, y->name) == 0 && x->dtype == y->dtype && x->ndim == y->ndim);
            CHECK(memcmp(x->dim, y->dim, sizeof x->dim) == 0 && x->nbytes == y->nbytes);
            CHECK(memcmp(x->data, y->data, x->nbytes) == 0);
        }
        CHECK(ferry_rpc_msg_find(&reply, "big")->dim[1] == 30);
    }
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
    ferry_rpc_client_destroy(c);
    ferry_rpc_server_destroy(srv);
}

/* Many threads share one client. */
typedef struct hammer_arg {
    ferry_rpc_client *c;
    int ok;
} hammer_arg;

static void *hammer(void *p) {
    hammer_arg *a = p;
    for (int i = 0; i < 40; i++)
        a->ok += echo_bytes(a->c, (size_t)(i % 5) * 3000) == FERRY_OK;
    return NULL;
}

TEST(concurrent_callers) {
    char target[64];
    ferry_rpc_server *srv = start_server(0, 2, target, sizeof target);
    ferry_rpc_client *c = connect_to(target, 0);
    pthread_t th[4];
    hammer_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (hammer_arg){.c = c};
        CHECK(pthread_create(&th[i], NULL, hammer, &args[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(args[i].ok, 40);
    }
    ferry_rpc_client_destroy(c);
    ferry_rpc_server_destroy(srv);
}

TEST(server_config) {
    char target[64];
    ferry_rpc_server *srv = start_server(0, 1, target, sizeof target), *other;
    ferry_rpc_server_config cfg = {.listen = target, .threads = 1};
    cfg.handlers[FERRY_RPC_FORWARD] = test_handler;
    CHECK_STATUS(ferry_rpc_server_create(&cfg, &other), FERRY_ERR_IO); /* port in use */
    CHECK(strstr(ferry_error_last(), target) != NULL);
    cfg.listen = "not an address";
    CHECK_STATUS(ferry_rpc_server_create(&cfg, &other), FERRY_ERR_IO);
    cfg.listen = "";
    CHECK_STATUS(ferry_rpc_server_create(&cfg, &other), FERRY_ERR_INVALID);
    cfg.listen = "127.0.0.1:0";
    cfg.threads = 65;
    CHECK_STATUS(ferry_rpc_server_create(&cfg, &other), FERRY_ERR_INVALID);
    cfg.threads = 1;
    cfg.max_message_bytes = (size_t)3 << 30;
    CHECK_STATUS(ferry_rpc_server_create(&cfg, &other), FERRY_ERR_INVALID);
    ferry_rpc_client *c;
    ferry_rpc_client_config cc = {.max_message_bytes = (size_t)3 << 30};
    CHECK_STATUS(ferry_rpc_client_create(target, &cc, &c), FERRY_ERR_INVALID);
    CHECK_STATUS(ferry_rpc_client_create("", NULL, &c), FERRY_ERR_INVALID);
    ferry_rpc_server_destroy(NULL);
    ferry_rpc_client_destroy(NULL);
    c = connect_to(target, 0); /* the first server is unharmed */
    CHECK_OK(echo_bytes(c, 16));
    ferry_rpc_client_destroy(c);
    ferry_rpc_server_destroy(srv);
}

/* ---- Errors reported precisely ------------------------------------------------------------- */

TEST(unimplemented) {
    char target[64];
    ferry_rpc_server *srv = start_server(0, 1, target, sizeof target);
    ferry_rpc_client *c = connect_to(target, 0);
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    /* Stats has no handler on this server; the catch-all answers. */
    CHECK_STATUS(ferry_rpc_call(c, FERRY_RPC_STATS, &req, &reply, 0), FERRY_ERR_UNSUPPORTED);
    CHECK(strstr(ferry_error_last(), " Stats: UNIMPLEMENTED: method /ferry.v1.Ferry/Stats has no") !=
          NULL);
    CHECK(strncmp(ferry_error_last(), target, strlen(target)) == 0);
    CHECK_STATUS(ferry__rpc_call_raw(c, "/ferry.v1.Ferry/Nope", "", 0, FERRY_RPC_FORWARD, &reply, 0),
                 FERRY_ERR_UNSUPPORTED);
    CHECK(strstr(ferry_error_last(), "unknown method /ferry.v1.Ferry/Nope") != NULL);
    CHECK_OK(echo_bytes(c, 64)); /* still serving */
    ferry_rpc_msg_deinit(&reply);
    ferry_rpc_client_destroy(c);
    ferry_rpc_server_destroy(srv);
}

TEST(oversize) {
    char target[64];
    ferry_rpc_server *srv = start_server(1u << 20, 1, target, sizeof target);
    /* The server's limit: RESOURCE_EXHAUSTED from gRPC, then business as usual. */
    ferry_rpc_client *c = connect_to(target, 64u << 20);
    CHECK_STATUS(echo_bytes(c, 2u << 20), FERRY_ERR_RANGE);
    CHECK(strstr(ferry_error_last(), "Forward: RESOURCE_EXHAUSTED") != NULL);
    CHECK_OK(echo_bytes(c, 1000));
    CHECK_OK(echo_bytes(c, (1u << 20) - 64));
    ferry_rpc_client_destroy(c);

    /* The client's own limit: refused before anything is sent. */
    c = connect_to(target, 1u << 20);
    ferry_rpc_server_stats before, after;
    ferry_rpc_server_get_stats(srv, &before);
    CHECK_STATUS(echo_bytes(c, 2u << 20), FERRY_ERR_RANGE);
    CHECK(strstr(ferry_error_last(), "exceeds the 1048576-byte limit") != NULL);
    ferry_rpc_server_get_stats(srv, &after);
    CHECK_EQ(after.bytes_in, before.bytes_in);

    /* A reply over the client's receive limit. */
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    Ferry__V1__HelloRequest q;
    ferry__v1__hello_request__init(&q);
    q.worker_id = (1u << 20) - 4096;
    CHECK_OK(ferry_rpc_msg_set_head(&req, &q.base));
    ferry_rpc_client *small = connect_to(target, 512u << 10);
    CHECK_STATUS(ferry_rpc_call(small, FERRY_RPC_HELLO, &req, &reply, 0), FERRY_ERR_RANGE);
    CHECK(strstr(ferry_error_last(), "RESOURCE_EXHAUSTED") != NULL);
    CHECK_OK(ferry_rpc_call(c, FERRY_RPC_HELLO, &req, &reply, 0));
    CHECK_EQ(reply.tensors[0].nbytes, (1u << 20) - 4096);
    /* A reply over the server's own send limit: refused while the handler builds it,
     * before its memory is allocated, with the budget named. */
    q.worker_id = 2u << 20;
    CHECK_OK(ferry_rpc_msg_set_head(&req, &q.base));
    CHECK_STATUS(ferry_rpc_call(c, FERRY_RPC_HELLO, &req, &reply, 0), FERRY_ERR_RESOURCE);
    CHECK(strstr(ferry_error_last(), "RESOURCE_EXHAUSTED") != NULL);
    CHECK(strstr(ferry_error_last(), "message limit") != NULL);
    CHECK(strstr(ferry_error_last(), "--max-message-mb") != NULL);
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
    ferry_rpc_client_destroy(small);
    ferry_rpc_client_destroy(c);
    ferry_rpc_server_destroy(srv);
}

TEST(malformed_request) {
    char target[64];
    ferry_rpc_server *srv = start_server(0, 1, target, sizeof target);
    ferry_rpc_client *c = connect_to(target, 0);
    ferry_rpc_msg reply;
    ferry_rpc_msg_init(&reply);
    static const uint8_t garbage[] = {0x7a, 0x05, 0x08, 0x01, 0xff};
    CHECK_STATUS(ferry__rpc_call_raw(c, "/ferry.v1.Ferry/Forward", garbage, sizeof garbage,
                                     FERRY_RPC_FORWARD, &reply, 0),
                 FERRY_ERR_FORMAT);
    CHECK(strstr(ferry_error_last(), "INVALID_ARGUMENT: malformed Forward request:") != NULL);
    /* An empty message is a valid all-defaults request. */
    CHECK_OK(ferry__rpc_call_raw(c, "/ferry.v1.Ferry/Forward", "", 0, FERRY_RPC_FORWARD, &reply, 0));
    CHECK(reply.head != NULL && reply.ntensors == 0);
    CHECK_OK(echo_bytes(c, 4096));
    ferry_rpc_msg_deinit(&reply);
    ferry_rpc_client_destroy(c);
    ferry_rpc_server_destroy(srv);
}

TEST(handler_errors) {
    char target[64], want[160];
    ferry_rpc_server *srv = start_server(0, 1, target, sizeof target);
    ferry_rpc_client *c = connect_to(target, 0);
    CHECK_OK(call_grad_norm(c, "ok"));
    CHECK_STATUS(call_grad_norm(c, "nope"), FERRY_ERR_NOT_FOUND);
    (void)snprintf(want, sizeof want, "%s GradNorm: NOT_FOUND: module 'nope' not found", target);
    CHECK(strcmp(ferry_error_last(), want) == 0);
    /* SHAPE travels as INVALID_ARGUMENT and comes back exact. */
    CHECK_STATUS(call_grad_norm(c, "shape"), FERRY_ERR_SHAPE);
    CHECK(strstr(ferry_error_last(), "INVALID_ARGUMENT: grad (3, 4) does not match") != NULL);
    CHECK_STATUS(call_grad_norm(c, "silent"), FERRY_ERR_NUMERIC);
    CHECK(strstr(ferry_error_last(), "non-finite value") != NULL);
    /* A handler bug (a borrowed reply tensor) is refused, not sent. */
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    CHECK_STATUS(ferry_rpc_call(c, FERRY_RPC_STEP, &req, &reply, 0), FERRY_ERR_INVALID);
    CHECK(strstr(ferry_error_last(), "Step: INTERNAL: Step handler returned borrowed") != NULL);
    /* A request header of another method's type never leaves the client. */
    Ferry__V1__StepRequest q;
    ferry__v1__step_request__init(&q);
    CHECK_OK(ferry_rpc_msg_set_head(&req, &q.base));
    CHECK_STATUS(ferry_rpc_call(c, FERRY_RPC_FORWARD, &req, &reply, 0), FERRY_ERR_INVALID);
    CHECK(strstr(ferry_error_last(), "bad request: message header is ferry.v1.StepRequest") != NULL);
    ferry_rpc_server_stats stats;
    ferry_rpc_server_get_stats(srv, &stats);
    CHECK_EQ(stats.calls, 5);
    CHECK_EQ(stats.errors, 4);
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
    ferry_rpc_client_destroy(c);
    ferry_rpc_server_destroy(srv);
}

TEST(deadline) {
    char target[64];
    ferry_rpc_server *srv = start_server(0, 1, target, sizeof target);
    ferry_rpc_client *c = connect_to(target, 0);
    CHECK_OK(call_backward(c, 0, 0)); /* connected */
    /* The handler is held at the gate: only the deadline can end the call. */
    gate_set(0);
    double t0 = ferry_now();
    CHECK_STATUS(call_backward(c, -1, 200), FERRY_ERR_TIMEOUT);
    double dt = ferry_now() - t0;
    CHECK(dt >= 0.19); /* it waited out its deadline (a lower bound: load only adds) */
    char want[128];
    (void)snprintf(want, sizeof want, "%s Backward: DEADLINE_EXCEEDED (deadline 200 ms)", target);
    CHECK(strcmp(ferry_error_last(), want) == 0);
    gate_set(1);
    ferry_rpc_client_destroy(c);
    ferry_rpc_server_destroy(srv); /* waits for the handler */
}

/* A port nobody listens on: bound once, then closed. */
static int dead_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

TEST(unavailable) {
    char target[64];
    (void)snprintf(target, sizeof target, "127.0.0.1:%d", dead_port());
    ferry_rpc_client *c = connect_to(target, 0);
    for (int i = 0; i < 2; i++) {
        /* UNAVAILABLE, not DEADLINE_EXCEEDED: it failed on the refused connection, not
         * by waiting out the 60 s deadline. */
        CHECK_STATUS(call_backward(c, 0, 60000), FERRY_ERR_UNAVAILABLE);
        CHECK(strstr(ferry_error_last(), "Backward: UNAVAILABLE: ") != NULL);
        CHECK(strncmp(ferry_error_last(), target, strlen(target)) == 0);
    }
    ferry_rpc_client_destroy(c);
}

/* ---- Fan-out ------------------------------------------------------------------------------------
 */

TEST(fanout) {
    enum { N = 3 };
    char targets[N][64];
    ferry_rpc_server *srv[N];
    ferry_rpc_client *cl[N];
    for (int i = 0; i < N; i++) {
        srv[i] = start_server(0, 1, targets[i], sizeof targets[i]);
        cl[i] = connect_to(targets[i], 0);
        CHECK_OK(call_backward(cl[i], 0, 0));
    }
    /* Each handler waits until all N run at once: only concurrent calls get past it
     * (sequential ones would meet the 60 s deadline). */
    Ferry__V1__BackwardRequest q;
    ferry__v1__backward_request__init(&q);
    q.ctx_id = N; /* the rendezvous: each handler waits for the other two */
    ferry_rpc_msg req, replies[N];
    ferry_rpc_msg_init(&req);
    CHECK_OK(ferry_rpc_msg_set_head(&req, &q.base)); /* one request, shared by all three */
    ferry_rpc_fanout calls[N];
    for (int i = 0; i < N; i++) {
        ferry_rpc_msg_init(&replies[i]);
        calls[i] = (ferry_rpc_fanout){
            .client = cl[i], .method = FERRY_RPC_BACKWARD, .req = &req, .reply = &replies[i]};
    }
    atomic_store(&arrived, 0);
    CHECK_OK(ferry_rpc_call_many(calls, N, 60000)); /* concurrent: all three at once */
    for (int i = 0; i < N; i++)
        CHECK(calls[i].status == FERRY_OK && calls[i].error[0] == '\0' && replies[i].head != NULL);

    /* Mixed outcomes: each entry gets its own status and message. The Backward no
     * longer waits for company. */
    ferry_rpc_msg plain;
    ferry_rpc_msg_init(&plain);
    q.ctx_id = 0;
    CHECK_OK(ferry_rpc_msg_set_head(&plain, &q.base));
    calls[0].req = &plain;
    Ferry__V1__GradNormRequest g;
    ferry__v1__grad_norm_request__init(&g);
    char *nope[1] = {(char *)(uintptr_t) "nope"};
    ferry_rpc_msg bad;
    ferry_rpc_msg_init(&bad);
    g.n_modules = 1;
    g.modules = nope;
    CHECK_OK(ferry_rpc_msg_set_head(&bad, &g.base));
    calls[1].method = FERRY_RPC_GRAD_NORM;
    calls[1].req = &bad;
    calls[2].method = FERRY_RPC_STATS;
    calls[2].req = NULL; /* an all-defaults request */
    CHECK_STATUS(ferry_rpc_call_many(calls, N, 2000), FERRY_ERR_NOT_FOUND);
    CHECK(strstr(ferry_error_last(), "GradNorm: NOT_FOUND") != NULL);
    CHECK_STATUS(calls[0].status, FERRY_OK);
    CHECK_STATUS(calls[1].status, FERRY_ERR_NOT_FOUND);
    CHECK(strstr(calls[1].error, targets[1]) != NULL);
    CHECK_STATUS(calls[2].status, FERRY_ERR_UNSUPPORTED);
    CHECK(strstr(calls[2].error, "Stats: UNIMPLEMENTED") != NULL);
    CHECK(replies[1].head == NULL && replies[1].ntensors == 0);

    ferry_rpc_msg_deinit(&bad);
    ferry_rpc_msg_deinit(&plain);
    ferry_rpc_msg_deinit(&req);
    for (int i = 0; i < N; i++) {
        ferry_rpc_msg_deinit(&replies[i]);
        ferry_rpc_client_destroy(cl[i]);
        ferry_rpc_server_destroy(srv[i]);
    }
}

/* ---- Shutdown
 * ------------------------------------------------------------------------------------- */

typedef struct slow_call {
    ferry_rpc_client *c;
    int sleep_ms;
    ferry_status st;
    char error[256];
} slow_call;

static void *run_slow(void *p) {
    slow_call *s = p;
    s->st = call_backward(s->c, s->sleep_ms, 60000);
    (void)snprintf(s->error, sizeof s->error, "%s", ferry_error_last());
    return NULL;
}

TEST(shutdown_drains) {
    char target[64];
    ferry_rpc_server *srv = start_server(0, 2, target, sizeof target);
    ferry_rpc_client *c = connect_to(target, 0);
    CHECK_OK(call_backward(c, 0, 0));
    gate_set(0);
    slow_call s = {.c = c, .sleep_ms = -1}; /* held at the gate */
    pthread_t th;
    CHECK(pthread_create(&th, NULL, run_slow, &s) == 0);
    CHECK(await_in_backward(1)); /* the call is in its handler */
    ferry_rpc_server_shutdown(srv, 600000);
    ferry_rpc_server_shutdown(srv, 600000);                          /* idempotent */
    CHECK_STATUS(ferry_rpc_server_wait(srv, 10), FERRY_ERR_TIMEOUT); /* the call holds it */
    gate_set(1);
    /* Done when the call is: a server that waited out its 10-minute grace would not
     * be done within the minute. */
    CHECK_OK(ferry_rpc_server_wait(srv, 60000));
    pthread_join(th, NULL);
    CHECK_OK(s.st);
    ferry_rpc_server_destroy(srv);
    CHECK_STATUS(call_backward(c, 0, 1000), FERRY_ERR_UNAVAILABLE); /* gone */
    ferry_rpc_client_destroy(c);
}

TEST(shutdown_cancels_after_grace) {
    char target[64];
    ferry_rpc_server *srv = start_server(0, 2, target, sizeof target);
    ferry_rpc_client *c = connect_to(target, 0);
    CHECK_OK(call_backward(c, 0, 0));
    gate_set(0);
    slow_call s = {.c = c, .sleep_ms = -1}; /* held at the gate */
    pthread_t th;
    CHECK(pthread_create(&th, NULL, run_slow, &s) == 0);
    CHECK(await_in_backward(1)); /* the call is in its handler */
    ferry_rpc_server_shutdown(srv, 150);
    pthread_join(th, NULL);
    /* The call ended while its handler was still held: cancelled after the grace
     * period, not after the handler. The peer went away mid-call: UNAVAILABLE (or
     * CANCELLED, as FERRY_ERR_RPC). */
    CHECK_EQ(atomic_load(&in_backward), 1);
    CHECK(s.st == FERRY_ERR_UNAVAILABLE || s.st == FERRY_ERR_RPC);
    CHECK(strstr(s.error, "Backward: ") != NULL);
    gate_set(1);
    ferry_rpc_server_destroy(srv); /* returns once the handler is done */
    ferry_rpc_client_destroy(c);
}

/* clang-format off */
FERRY_TEST_MAIN(T(echo_sizes) T(echo_multi) T(concurrent_callers) T(server_config)
                T(unimplemented) T(oversize) T(malformed_request) T(handler_errors) T(deadline)
                T(unavailable) T(fanout) T(shutdown_drains) T(shutdown_cancels_after_grace))
/* clang-format on */
