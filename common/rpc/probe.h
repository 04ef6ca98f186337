/* probe.h - what a server's port speaks, asked without gRPC, for error messages that
 * say why a connection failed: gRPC reports a plaintext client on a TLS port (and a
 * client certificate the server refuses) only as "Socket closed". */
#ifndef FERRY_RPC_PROBE_H
#define FERRY_RPC_PROBE_H

#include "ferry/status.h"

/* Opens a TCP connection to host:port, sends a TLS 1.2 ClientHello and reads the
 * first bytes of the answer, each step within timeout_ms. *tls = 1 when the answer is
 * a TLS record (a ServerHello or an alert: the port speaks TLS), 0 when it is anything
 * else or the server closes or stays silent (a plaintext HTTP/2 server answers with
 * its SETTINGS frame). FERRY_ERR_UNAVAILABLE (with a message) when host does not
 * resolve or no connection opens; *tls is then unchanged. Blocking; thread-safe. */
ferry_status ferry_rpc_probe_tls(const char *host, const char *port, int timeout_ms, int *tls);

#endif /* FERRY_RPC_PROBE_H */
