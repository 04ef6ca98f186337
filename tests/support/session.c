/* session.c - see session.h. */
#include <stdio.h>

#include "ferry.pb-c.h"
#include "session.h"

ferry_status ferry_test_hello(ferry_rpc_client *c, int lease, char *identity) {
    Ferry__V1__HelloRequest q;
    ferry__v1__hello_request__init(&q);
    q.label = "test";
    q.contract_major = FERRY_CONTRACT_MAJOR;
    ferry_rpc_msg req, reply;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(&reply);
    ferry_status st = ferry_rpc_msg_set_head(&req, &q.base);
    if (st == FERRY_OK)
        st = ferry_rpc_call(c, FERRY_RPC_HELLO, &req, &reply, 0);
    if (st == FERRY_OK) {
        const Ferry__V1__HelloReply *r = reply.head;
        if (identity != NULL)
            (void)snprintf(identity, FERRY_RPC_IDENTITY_MAX, "%s", r->identity);
        st = ferry_rpc_client_set_session(c, r->session, lease);
    }
    ferry_rpc_msg_deinit(&reply);
    ferry_rpc_msg_deinit(&req);
    return st;
}
