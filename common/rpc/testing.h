/* testing.h - hooks that let tests drive the RPC layer below its public API,
 * without including gRPC: raw request bytes on any method path. */
#ifndef FERRY_RPC_TESTING_H
#define FERRY_RPC_TESTING_H

#include <stddef.h>

#include "common/rpc/rpc.h"

/* Sends n raw bytes as the request message of `path` ("/ferry.v1.Ferry/Forward",
 * or any other path) and decodes a successful reply as reply_method's reply.
 * Errors and messages as ferry_rpc_call, with the path in place of the method. */
ferry_status ferry__rpc_call_raw(ferry_rpc_client *cl, const char *path, const void *bytes,
                                 size_t n, ferry_rpc_method reply_method, ferry_rpc_msg *reply,
                                 int deadline_ms);

#endif /* FERRY_RPC_TESTING_H */
