/* codec.h - ferry messages on the wire, independent of gRPC. The encoder turns a
 * ferry_rpc_msg into segments: runs of small header bytes it owns, and the
 * tensors' own memory, which the transport wraps as zero-copy slices. The
 * decoder reads a message from any sequence of chunks (gRPC hands us a chain of
 * slices), copies each tensor payload once into an aligned buffer, and checks
 * every length before allocating. Wire format: proto/ferry.proto. */
#ifndef FERRY_RPC_CODEC_H
#define FERRY_RPC_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "common/rpc/rpc.h"

/* Field number of `repeated Tensor tensors` in every message, and of
 * `bytes data` inside Tensor: both are written last. */
#define FERRY_RPC_TENSORS_FIELD 15
#define FERRY_RPC_DATA_FIELD    15

/* Tensors up to this many bytes are copied next to the header instead of being
 * sent as their own slice: a slice costs an allocation, a refcount and a
 * callback, more than copying a few hundred bytes. */
#define FERRY_RPC_INLINE_MAX 1024

/* ---- Methods --------------------------------------------------------------- */

typedef struct ferry__rpc_method_info {
    const char *name; /* "Forward" */
    const char *path; /* "/ferry.v1.Ferry/Forward" */
    const ProtobufCMessageDescriptor *request;
    const ProtobufCMessageDescriptor *reply;
} ferry__rpc_method_info;

/* The table entry of a method; NULL if out of range. */
const ferry__rpc_method_info *ferry__rpc_method(ferry_rpc_method m);

/* ---- Encoding -------------------------------------------------------------- */

/* One piece of an encoded message: bytes [off, off+len) of the wire's buffer
 * (tensor < 0), or the whole payload of msg->tensors[tensor]. */
typedef struct ferry__rpc_seg {
    size_t off;
    size_t len;
    int tensor;
} ferry__rpc_seg;

typedef struct ferry__rpc_wire {
    uint8_t *buf; /* header bytes and inlined small payloads */
    size_t len, cap;
    ferry__rpc_seg *segs; /* in wire order */
    int nseg, segcap;
    size_t total; /* length of the whole encoded message */
} ferry__rpc_wire;

void ferry__rpc_wire_init(ferry__rpc_wire *w);
void ferry__rpc_wire_deinit(ferry__rpc_wire *w);

/* Encodes m as a message of type desc into *w (which must be initialized; it is
 * reset first). Tensor payloads larger than inline_max become their own
 * segments, pointing at the tensors' memory: m must outlive the use of *w.
 * Returns FERRY_ERR_INVALID if m's header has another type than desc or a
 * tensor descriptor is bad, FERRY_ERR_SHAPE for a size/shape mismatch,
 * FERRY_ERR_NOMEM. */
ferry_status ferry__rpc_encode(const ferry_rpc_msg *m, const ProtobufCMessageDescriptor *desc,
                               size_t inline_max, ferry__rpc_wire *w);

/* Copies the whole encoded message into dst (w->total bytes); for tests. */
void ferry__rpc_wire_flatten(const ferry__rpc_wire *w, const ferry_rpc_msg *m, uint8_t *dst);

/* ---- Decoding -------------------------------------------------------------- */

/* A message of `total` bytes delivered as chunks: next() stores the next chunk
 * (possibly empty) and returns 1, or returns 0 when there are no more. */
typedef struct ferry__rpc_source {
    int (*next)(void *user, const uint8_t **p, size_t *n);
    void *user;
    size_t total;
} ferry__rpc_source;

typedef struct ferry__rpc_limits {
    size_t max_message_bytes; /* messages (and so every length) above this fail */
    int max_tensors;          /* tensors per message */
} ferry__rpc_limits;

/* Decodes a message of type desc into *out, which must be initialized and is
 * reset first. Tensor payloads land in owned 64-byte-aligned buffers; the
 * header is unpacked by protobuf-c into out->head. Returns FERRY_ERR_FORMAT with
 * a detail naming the problem and its byte offset for any malformed, truncated
 * or inconsistent input, FERRY_ERR_RANGE for a message over the limits,
 * FERRY_ERR_NOMEM; *out is empty on failure. */
ferry_status ferry__rpc_decode(const ferry__rpc_source *src, const ProtobufCMessageDescriptor *desc,
                               const ferry__rpc_limits *lim, ferry_rpc_msg *out);

/* ferry__rpc_decode over one contiguous buffer. */
ferry_status ferry__rpc_decode_flat(const void *buf, size_t n,
                                    const ProtobufCMessageDescriptor *desc,
                                    const ferry__rpc_limits *lim, ferry_rpc_msg *out);

/* ---- Shared with msg.c ------------------------------------------------------- */

/* Validates a tensor descriptor (dtype, rank, dims, nbytes, name, data). */
ferry_status ferry__rpc_tensor_check(const ferry_rpc_tensor *t);

/* Makes room for one more tensor (respecting FERRY_RPC_MAX_TENSORS). */
ferry_status ferry__rpc_msg_reserve(ferry_rpc_msg *m, int max_tensors);

/* Forgets the tensors without releasing them, after their ownership moved to
 * the transport. */
void ferry__rpc_msg_disown(ferry_rpc_msg *m);

#endif /* FERRY_RPC_CODEC_H */
