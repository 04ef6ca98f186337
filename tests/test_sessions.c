/* test_sessions.c - ferry.v1 sessions and identities on an in-process ferry-ps: Hello
 * opens a session and renews it, a call without one or with an expired one is refused
 * (-19), an idle session ends after its TTL and takes its contexts with it while a
 * Session stream keeps one alive, a rank whose session lost its stream is taken over
 * at once by a new session of the same identity (a restarted trainer), a token of the
 * longest accepted length works, another contract major and the pre-v1 service get
 * one clear line each. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <string.h>
#include <time.h>

#include "check.h"
#include "session.h"
#include "ferry.pb-c.h"
#include "ferry/ferry.h"
#include "common/rpc/rpc.h"
#include "common/rpc/testing.h"
#include "common/core/log.h" /* ferry_now */
#include "server/ps.h"

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    (void)nanosleep(&ts, NULL);
}

static ferry_ps_server *server_up(double session_ttl_s, const ferry_rpc_identity *ids, int n) {
    ferry_ps_config cfg;
    ferry_ps_config_default(&cfg);
    cfg.listen = "127.0.0.1:0";
    cfg.session_ttl_s = session_ttl_s;
    cfg.identities = ids;
    cfg.nidentities = n;
    ferry_ps_server *s;
    CHECK_OK(ferry_ps_server_create(&cfg, &s));
    CHECK_OK(ferry_ps_server_start(s));
    return s;
}

static ferry_rpc_client *client(ferry_ps_server *s, const char *token) {
    ferry_rpc_client_config cc = {.deadline_ms = 5000, .wait_for_ready = 1, .token = token};
    ferry_rpc_client *c;
    CHECK_OK(ferry_rpc_client_create(ferry_ps_server_address(s), &cc, &c));
    return c;
}

/* Hello on c (its current session, if any, in metadata); the reply's session. */
static ferry_status hello(ferry_rpc_client *c, uint32_t major, char *session) {
    Ferry__V1__HelloRequest q;
    ferry__v1__hello_request__init(&q);
    q.contract_major = major;
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    CHECK_OK(ferry_rpc_msg_set_head(&req, &q.base));
    ferry_status st = ferry_rpc_call(c, FERRY_RPC_HELLO, &req, &reply, 0);
    if (st == FERRY_OK && session != NULL)
        (void)snprintf(session, FERRY_RPC_SESSION_LEN + 1, "%s",
                       ((const Ferry__V1__HelloReply *)reply.head)->session);
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
    return st;
}

static ferry_status stats(ferry_rpc_client *c) {
    Ferry__V1__StatsRequest q;
    ferry__v1__stats_request__init(&q);
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    CHECK_OK(ferry_rpc_msg_set_head(&req, &q.base));
    ferry_status st = ferry_rpc_call(c, FERRY_RPC_STATS, &req, &reply, 0);
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
    return st;
}

static void create_embedding(ferry_rpc_client *c) {
    Ferry__V1__EmbeddingConfig ec;
    ferry__v1__embedding_config__init(&ec);
    ec.vocab = 8;
    ec.width = 2;
    Ferry__V1__ModuleConfig mc;
    ferry__v1__module_config__init(&mc);
    mc.kind_case = FERRY__V1__MODULE_CONFIG__KIND_EMBEDDING;
    mc.embedding = &ec;
    Ferry__V1__CreateModuleRequest q;
    ferry__v1__create_module_request__init(&q);
    q.name = "e";
    q.config = &mc;
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    CHECK_OK(ferry_rpc_msg_set_head(&req, &q.base));
    CHECK_OK(ferry_rpc_call(c, FERRY_RPC_CREATE_MODULE, &req, &reply, 0));
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
}

/* A saving Forward of module "e" in context ctx. */
static ferry_status forward(ferry_rpc_client *c, uint64_t ctx) {
    Ferry__V1__ForwardRequest q;
    ferry__v1__forward_request__init(&q);
    q.ctx_id = ctx;
    q.call_id = 1;
    q.module = "e";
    int32_t ids[1] = {3};
    ferry_rpc_tensor t = {.dtype = FERRY_RPC_DTYPE_I32,
                          .ndim = 1,
                          .dim = {1},
                          .data = ids,
                          .nbytes = sizeof ids,
                          .name = "ids"};
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    CHECK_OK(ferry_rpc_msg_set_head(&req, &q.base));
    CHECK_OK(ferry_rpc_msg_add(&req, &t));
    ferry_status st = ferry_rpc_call(c, FERRY_RPC_FORWARD, &req, &reply, 0);
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
    return st;
}

static ferry_status release(ferry_rpc_client *c, uint64_t ctx, int *found) {
    Ferry__V1__ReleaseContextRequest q;
    ferry__v1__release_context_request__init(&q);
    q.ctx_id = ctx;
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    CHECK_OK(ferry_rpc_msg_set_head(&req, &q.base));
    ferry_status st = ferry_rpc_call(c, FERRY_RPC_RELEASE_CONTEXT, &req, &reply, 0);
    if (st == FERRY_OK)
        *found = ((const Ferry__V1__ReleaseContextReply *)reply.head)->found;
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
    return st;
}

/* Job join of rank 0 of a one-rank job "j". */
static ferry_status join_rank0(ferry_rpc_client *c) {
    Ferry__V1__JobMember mb;
    ferry__v1__job_member__init(&mb);
    mb.world = 1;
    Ferry__V1__JobJoin jj;
    ferry__v1__job_join__init(&jj);
    jj.member = &mb;
    Ferry__V1__JobRequest q;
    ferry__v1__job_request__init(&q);
    q.job = "j";
    q.action_case = FERRY__V1__JOB_REQUEST__ACTION_JOIN;
    q.join = &jj;
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    CHECK_OK(ferry_rpc_msg_set_head(&req, &q.base));
    ferry_status st = ferry_rpc_call(c, FERRY_RPC_JOB, &req, &reply, 0);
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_msg_deinit(&reply);
    return st;
}

TEST(hello_opens_and_renews_a_session) {
    ferry_ps_server *s = server_up(60.0, NULL, 0);
    ferry_rpc_client *c = client(s, NULL);
    CHECK_STATUS(stats(c), FERRY_ERR_SESSION); /* no Hello yet */
    CHECK(strstr(ferry_error_last(), "no session (say Hello first") != NULL);
    char a[FERRY_RPC_SESSION_LEN + 1], b[FERRY_RPC_SESSION_LEN + 1];
    CHECK_OK(hello(c, 1, a));
    CHECK_EQ(strlen(a), FERRY_RPC_SESSION_LEN);
    CHECK_OK(ferry_rpc_client_set_session(c, a, 0));
    CHECK_OK(stats(c));
    CHECK_OK(hello(c, 1, b)); /* sent with the session: the same one, renewed */
    CHECK(strcmp(a, b) == 0);
    ferry_rpc_client *d = client(s, NULL);
    CHECK_OK(hello(d, 0, b)); /* another client: another session (major 0: not said) */
    CHECK(strcmp(a, b) != 0);
    /* A forged id, and a malformed one, are refused alike. */
    char forged[FERRY_RPC_SESSION_LEN + 1];
    memcpy(forged, a, sizeof forged);
    forged[0] = forged[0] == '0' ? '1' : '0';
    CHECK_OK(ferry_rpc_client_set_session(d, forged, 0));
    CHECK_STATUS(stats(d), FERRY_ERR_SESSION);
    CHECK(strstr(ferry_error_last(), "unknown or expired session") != NULL);
    CHECK_STATUS(ferry_rpc_client_set_session(d, "xyz", 0), FERRY_ERR_INVALID);
    ferry_rpc_client_destroy(d);
    ferry_rpc_client_destroy(c);
    ferry_ps_server_destroy(s);
}

TEST(contract_versions) {
    ferry_ps_server *s = server_up(60.0, NULL, 0);
    ferry_rpc_client *c = client(s, NULL);
    CHECK_STATUS(hello(c, 2, NULL), FERRY_ERR_UNSUPPORTED);
    CHECK(strstr(ferry_error_last(),
                 "speaks contract 1.8 (ferry.v1); the client speaks contract 2") != NULL);
    /* A client of the pre-v1 service gets one line saying so. */
    ferry_rpc_msg reply;
    ferry_rpc_msg_init(&reply);
    CHECK_STATUS(ferry__rpc_call_raw(c, "/ferry.Ferry/Hello", "", 0, FERRY_RPC_HELLO, &reply, 5000),
                 FERRY_ERR_UNSUPPORTED);
    CHECK(strstr(ferry_error_last(), "the client speaks the pre-v1 service ferry.Ferry") != NULL);
    ferry_rpc_msg_deinit(&reply);
    ferry_rpc_client_destroy(c);
    ferry_ps_server_destroy(s);
}

TEST(an_idle_session_ends_with_its_contexts_a_leased_one_does_not) {
    ferry_ps_server *s = server_up(0.3, NULL, 0);
    ferry_rpc_client *idle = client(s, NULL), *leased = client(s, NULL);
    CHECK_OK(ferry_test_hello(idle, 0, NULL));
    CHECK_OK(ferry_test_hello(leased, 1, NULL));
    for (int i = 0; i < 6000 && !ferry_rpc_client_lease_open(leased); i++) /* up to 60 s */
        sleep_ms(10);
    CHECK(ferry_rpc_client_lease_open(leased));
    create_embedding(idle);
    CHECK_OK(forward(idle, 11));
    CHECK_OK(forward(leased, 11)); /* the same id: each session its own context */
    sleep_ms(600);                 /* two TTLs without a call */
    (void)ferry_ps_server_sweep(s);
    CHECK_STATUS(stats(idle), FERRY_ERR_SESSION);
    CHECK(strstr(ferry_error_last(), "unknown or expired session") != NULL);
    int found = 0;
    CHECK_OK(release(leased, 11, &found)); /* the stream kept it and its context */
    CHECK_EQ(found, 1);
    CHECK_OK(ferry_test_hello(idle, 0, NULL)); /* a new session ... */
    CHECK_OK(release(idle, 11, &found));       /* ... without the old one's context */
    CHECK_EQ(found, 0);
    ferry_rpc_client_destroy(idle);
    ferry_rpc_client_destroy(leased);
    ferry_ps_server_destroy(s);
}

TEST(a_rank_is_taken_over_once_its_session_lost_its_stream) {
    ferry_ps_server *s = server_up(60.0, NULL, 0);
    ferry_rpc_client *first = client(s, NULL), *second = client(s, NULL);
    CHECK_OK(ferry_test_hello(first, 1, NULL));
    for (int i = 0; i < 6000 && !ferry_rpc_client_lease_open(first); i++) /* up to 60 s */
        sleep_ms(10);
    CHECK(ferry_rpc_client_lease_open(first));
    CHECK_OK(join_rank0(first));
    CHECK_OK(ferry_test_hello(second, 1, NULL));
    CHECK_STATUS(join_rank0(second), FERRY_ERR_EXISTS); /* held by a live session */
    CHECK(strstr(ferry_error_last(), "held by another live session") != NULL);
    double t0 = ferry_now();
    ferry_rpc_client_destroy(first); /* its process dies: the stream closes */
    ferry_status st;
    while ((st = join_rank0(second)) == FERRY_ERR_EXISTS && ferry_now() - t0 < 60.0)
        sleep_ms(5);
    CHECK_OK(st);
    fprintf(stderr, "  rank taken over %.0f ms after the holder went away\n",
            (ferry_now() - t0) * 1000.0);
    ferry_rpc_client_destroy(second);
    ferry_ps_server_destroy(s);
}

TEST(a_token_of_the_longest_length_works) {
    static char tok[FERRY_RPC_TOKEN_MAX + 1], other[40];
    for (int i = 0; i < FERRY_RPC_TOKEN_MAX; i++)
        tok[i] = (char)('a' + i % 26);
    memcpy(other, tok, 39); /* the same first bytes: must not match */
    ferry_rpc_identity ids[2] = {{"long", FERRY_RPC_ROLE_TRAINER, tok},
                                 {"short", FERRY_RPC_ROLE_READER, "0123456789abcdef"}};
    ferry_ps_server *s = server_up(60.0, ids, 2);
    ferry_rpc_client *c = client(s, tok), *p = client(s, other);
    char who[FERRY_RPC_IDENTITY_MAX];
    CHECK_OK(ferry_test_hello(c, 0, who));
    CHECK(strcmp(who, "long") == 0);
    CHECK_STATUS(ferry_test_hello(p, 0, NULL), FERRY_ERR_AUTH);
    ferry_rpc_client_destroy(p);
    ferry_rpc_client_destroy(c);
    ferry_ps_server_destroy(s);
}

FERRY_TEST_MAIN(T(hello_opens_and_renews_a_session) T(contract_versions)
                    T(an_idle_session_ends_with_its_contexts_a_leased_one_does_not)
                        T(a_rank_is_taken_over_once_its_session_lost_its_stream)
                            T(a_token_of_the_longest_length_works))
