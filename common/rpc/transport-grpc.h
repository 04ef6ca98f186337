/* transport-grpc.h - the gRPC glue shared by server.c and client.c: library
 * lifetime, byte buffers built from encoded messages (payloads as zero-copy
 * slices), decoding by walking a byte buffer's slices, status-code mapping and
 * channel arguments. Only files in common/rpc/ include this header. */
#ifndef FERRY_RPC_TRANSPORT_GRPC_H
#define FERRY_RPC_TRANSPORT_GRPC_H

#include <pthread.h>
#include <stdatomic.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>

#include "common/rpc/codec.h"

/* Trailing-metadata key carrying the exact ferry_status of a failed call. */
#define FERRY_RPC_STATUS_KEY "ferry-status"
/* Request metadata: the server incarnation (16 hex digits) a context call expects. */
#define FERRY_RPC_INCARNATION_KEY "ferry-incarnation"
#define FERRY_RPC_SESSION_KEY     "ferry-session"
#define FERRY_RPC_CLIENT_KEY      "ferry-client"

/* grpc_init/grpc_shutdown, plus routing gRPC's own log lines into ferry_log. */
void ferry__grpc_init(void);
void ferry__grpc_shutdown(void);

/* Counts the payload slices gRPC still references, so that a synchronous call
 * can promise its caller that borrowed tensor memory is free again. */
typedef struct ferry__rpc_pending {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
} ferry__rpc_pending;

void ferry__rpc_pending_init(ferry__rpc_pending *p);
void ferry__rpc_pending_wait(ferry__rpc_pending *p); /* until n == 0; then destroys p */

/* A byte buffer for an encoded message whose tensors stay the caller's: each
 * large payload becomes a slice over the tensor's memory, counted in *pend. */
grpc_byte_buffer *ferry__grpc_bb_borrowed(const ferry__rpc_wire *w, const ferry_rpc_msg *m,
                                          ferry__rpc_pending *pend);

/* A byte buffer for an encoded message whose owned tensors pass to gRPC: each
 * large payload's slice calls the tensor's release when gRPC drops it; inlined
 * payloads are released at once. The message is deinitialized. */
grpc_byte_buffer *ferry__grpc_bb_owned(const ferry__rpc_wire *w, ferry_rpc_msg *m);

/* ferry__rpc_decode over the slices of bb, read in place with reader_peek. */
ferry_status ferry__grpc_decode(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                                const ferry__rpc_limits *lim, ferry_rpc_msg *out);

/* grpc_completion_queue_next that first polls without blocking for the process's
 * spin window (ferry_rpc_set_spin_us) before it blocks until `until`. On VMs whose
 * idle cores sleep deeply, each blocking wait costs a wake-up of 50-100 us; a reply
 * or the next request that arrives inside the window skips it. */
grpc_event ferry__grpc_cq_next(grpc_completion_queue *cq, gpr_timespec until);

/* Status mapping (see rpc.h, ferry_rpc_handler). */
grpc_status_code ferry__grpc_code_from_status(ferry_status st);
ferry_status ferry__grpc_status_from_code(grpc_status_code code);
const char *ferry__grpc_code_name(grpc_status_code code); /* "DEADLINE_EXCEEDED" */

/* Set on a thread while gRPC's errors there are reported by ferry itself (a bind
 * that fails): they are logged at debug level instead of as warnings. */
extern _Thread_local int ferry__grpc_quiet;

/* Counts and latency of one method's calls (ferry_rpc_method_stats), lock-free. */
typedef struct ferry__rpc_meter {
    atomic_uint_fast64_t calls[FERRY_RPC_CODES];
    atomic_uint_fast64_t buckets[FERRY_RPC_LATENCY_BUCKETS], over;
    atomic_uint_fast64_t sum_ns;
} ferry__rpc_meter;
void ferry__rpc_meter_add(ferry__rpc_meter *m, int code, double seconds);
void ferry__rpc_meter_read(ferry__rpc_meter *m, ferry_rpc_method_stats *out);

/* Parses the FERRY_RPC_STATUS_KEY value; FERRY_OK if absent or not a ferry error. */
ferry_status ferry__grpc_status_from_metadata(const grpc_metadata_array *md);

/* Channel arguments for a message limit; `client` adds the client-only ones.
 * Writes at most 6 entries into a and returns the count. */
size_t ferry__grpc_fill_args(grpc_arg *a, size_t max_message_bytes, int client);

/* A deadline ms milliseconds from now (monotonic clock). */
gpr_timespec ferry__grpc_deadline_in(int ms);

/* Writes the whole message bb holds to path (a recorded request). */
ferry_status ferry__grpc_bb_save(grpc_byte_buffer *bb, const char *path);

#endif /* FERRY_RPC_TRANSPORT_GRPC_H */
