/* session.h - a session for tests that drive ferry-ps through a bare RPC client: Hello,
 * then every later call of the client carries the session it opened. */
#ifndef FERRY_TEST_SESSION_H
#define FERRY_TEST_SESSION_H

#include "common/rpc/rpc.h"

/* Says Hello on c and makes its later calls run in the session the server opened
 * (lease: also hold the Session stream). identity, when not NULL, receives who the
 * server takes the caller for (FERRY_RPC_IDENTITY_MAX bytes). Returns the Hello's
 * status. */
ferry_status ferry_test_hello(ferry_rpc_client *c, int lease, char *identity);

#endif /* FERRY_TEST_SESSION_H */
