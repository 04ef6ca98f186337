/* test_ps_sessions.c - a session's life in ferry-ps (server/session.c): it lives while
 * its client calls within the TTL and while one of its calls is in flight, however
 * long that call queues or runs (a Step queued behind a flood of Forwards longer than
 * --session-ttl once lost its session mid-call); idle past the TTL with nothing in
 * flight, the sweep ends it, its job rank is no longer held, and its id is refused. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <string.h>
#include <time.h>

#include "check.h"
#include "server/ps-impl.h"

static void pause_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    (void)nanosleep(&ts, NULL);
}

TEST(in_flight_call_keeps_its_session) {
    ferry__ps_quotas Q;
    ferry__ps_quotas_init(&Q);
    ferry__ps_sessions S;
    CHECK_OK(ferry__ps_sessions_init(&S, 0.05, 16, 16, &Q));
    ferry_rpc_caller_info who;
    memset(&who, 0, sizeof who);
    (void)snprintf(who.identity, sizeof who.identity, "alice");
    ferry__ps_session *s, *call;
    CHECK_OK(ferry__ps_session_open(&S, &who, &s)); /* Hello */
    uint64_t serial = s->serial, ended[4];
    (void)snprintf(who.session, sizeof who.session, "%s", s->id);
    ferry__ps_session_leave(&S, s);
    /* A call enters and stays in flight past the TTL: the sweep leaves the session. */
    CHECK_OK(ferry__ps_session_enter(&S, &who, "Step", &call));
    pause_s(0.15);
    CHECK_EQ(ferry__ps_sessions_sweep(&S, ended, 4), 0);
    CHECK_EQ(ferry__ps_session_holds(&S, serial), 1);
    ferry__ps_session_leave(&S, call);
    /* Its next call, right after, finds it. */
    CHECK_OK(ferry__ps_session_enter(&S, &who, "Forward", &call));
    ferry__ps_session_leave(&S, call);
    /* Idle past the TTL with nothing in flight: ended, not held, refused. */
    pause_s(0.15);
    CHECK_EQ(ferry__ps_session_holds(&S, serial), 0);
    CHECK_EQ(ferry__ps_sessions_sweep(&S, ended, 4), 1);
    CHECK_EQ(ended[0], serial);
    CHECK_EQ(ferry__ps_session_enter(&S, &who, "Forward", &call), FERRY_ERR_SESSION);
    CHECK(strstr(ferry_error_last(), "unknown or expired session") != NULL);
    ferry__ps_sessions_deinit(&S);
    ferry__ps_quotas_deinit(&Q);
}

FERRY_TEST_MAIN(T(in_flight_call_keeps_its_session))
