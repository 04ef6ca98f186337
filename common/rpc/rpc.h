/* rpc.h - ferry's RPC layer: tensor messages, a gRPC server that dispatches the
 * methods of ferry.v1.Ferry (proto/ferry.proto) to a handler table, and clients with
 * synchronous and concurrent fan-out calls. Tensors travel without a copy on the
 * sending side and with exactly one copy, into a 64-byte-aligned buffer, on the
 * receiving side. Only common/rpc/ sees gRPC; callers see these types.
 *
 * A message is a protobuf-c header of the method's type (Ferry__V1__ForwardRequest
 * for a Forward request, from the generated "ferry.pb-c.h") plus tensors:
 *
 *     Ferry__V1__ForwardRequest q;
 *     ferry__v1__forward_request__init(&q);
 *     q.ctx_id = ctx;
 *     q.module = "dec0";
 *     ferry_rpc_msg req, reply;
 *     ferry_rpc_msg_init(&req);
 *     ferry_rpc_msg_init(&reply);
 *     ferry_rpc_tensor h = {.dtype = FERRY_RPC_DTYPE_F32, .ndim = 2, .dim = {N, H},
 *                           .data = hidden, .nbytes = N * H * sizeof(float)};
 *     st = ferry_rpc_msg_set_head(&req, &q.base);          // packs a copy of q
 *     if (st == FERRY_OK) st = ferry_rpc_msg_add(&req, &h);  // borrows hidden
 *     if (st == FERRY_OK) st = ferry_rpc_call(client, FERRY_RPC_FORWARD, &req, &reply, 0);
 *     const Ferry__V1__ForwardReply *r = reply.head;            // decoded on arrival
 *     ... reply.tensors[i] ...
 *     ferry_rpc_msg_deinit(&req);
 *     ferry_rpc_msg_deinit(&reply);
 *
 * Handlers run on the server's completion-queue threads, concurrently. */
#ifndef FERRY_RPC_H
#define FERRY_RPC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/core/buf.h" /* ferry_buf_alloc, ferry_buf_free: what tensors live in */
#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ProtobufCMessage; /* protobuf-c; the concrete types come from ferry.pb-c.h */

/* The wire contract's version (proto/ferry.proto section 1): major 1 = package ferry.v1;
 * a minor only adds. */
#define FERRY_CONTRACT_MAJOR 1
#define FERRY_CONTRACT_MINOR 8

#define FERRY_RPC_MAX_DIMS                  4
#define FERRY_RPC_NAME_MAX                  64   /* bytes, with the terminating NUL */
#define FERRY_RPC_MAX_TENSORS               1024 /* per message */
#define FERRY_RPC_DEFAULT_MAX_MESSAGE_BYTES (256u << 20)
#define FERRY_RPC_DEFAULT_DEADLINE_MS       10000

/* The methods of service ferry.v1.Ferry, in proto order:
 * X(ENUM_SUFFIX, ProtoName, snake_name); snake_name names the generated
 * protobuf-c types (ferry__v1__forward_request__descriptor). */
#define FERRY_RPC_METHOD_MAP(X)                                                                    \
    X(HELLO, Hello, hello)                                                                         \
    X(CREATE_MODULE, CreateModule, create_module)                                                  \
    X(FORWARD, Forward, forward)                                                                   \
    X(BACKWARD, Backward, backward)                                                                \
    X(GRAD_NORM, GradNorm, grad_norm)                                                              \
    X(STEP, Step, step)                                                                            \
    X(RELEASE_CONTEXT, ReleaseContext, release_context)                                            \
    X(GET_PARAMS, GetParams, get_params)                                                           \
    X(SET_PARAMS, SetParams, set_params)                                                           \
    X(CHECKPOINT, Checkpoint, checkpoint)                                                          \
    X(STATS, Stats, stats)                                                                         \
    X(SHUTDOWN, Shutdown, shutdown)                                                                \
    X(JOB, Job, job)                                                                               \
    X(LIST_MODULES, ListModules, list_modules)                                                     \
    X(DELETE_MODULE, DeleteModule, delete_module)

/* clang-format off */
typedef enum ferry_rpc_method {
#define FERRY_RPC_METHOD_ENUM_(id, name, snake) FERRY_RPC_##id,
    FERRY_RPC_METHOD_MAP(FERRY_RPC_METHOD_ENUM_)
#undef FERRY_RPC_METHOD_ENUM_
    FERRY_RPC_METHOD_COUNT
} ferry_rpc_method;
/* clang-format on */

/* The proto name of a method ("Forward"), or "?" for a value out of range. */
const char *ferry_rpc_method_name(ferry_rpc_method method);

/* Element types; the values are those of ferry.DType on the wire. */
typedef enum ferry_rpc_dtype {
    FERRY_RPC_DTYPE_F32 = 0,
    FERRY_RPC_DTYPE_I32 = 1,
    FERRY_RPC_DTYPE_I64 = 2,
    FERRY_RPC_DTYPE_F64 = 3,
    /* bfloat16 (the top half of a float32), a wire form only: a message whose wire
     * dtype is BF16 (ferry_rpc_msg_set_wire_dtype) sends its F32 tensors of rank 2 or
     * more as BF16, rounded to nearest even, and every received BF16 tensor is
     * widened back to F32 before anyone sees it. */
    FERRY_RPC_DTYPE_BF16 = 4,
} ferry_rpc_dtype;

/* Size in bytes of one element, or 0 for an unknown dtype. */
size_t ferry_rpc_dtype_size(int dtype);

/* Called exactly once, possibly on another thread, when the bytes it guards are
 * no longer needed. ferry_buf_free (common/core/buf.h: the 64-byte-aligned, recycled
 * buffers received tensors live in) fits this type. */
typedef void (*ferry_rpc_release_fn)(void *user);

/* One tensor of a message. The descriptor is a plain value; `release` says who
 * owns `data`:
 *   - release == NULL: borrowed. The caller keeps the bytes valid and unchanged
 *     until the message is deinitialized (client requests: until the call that
 *     sends it returns, which ferry guarantees is after gRPC let go of them).
 *   - release != NULL: owned by the message; release(release_user) runs once
 *     when the message and the transport are both done with it.
 * Received tensors are owned, 64-byte aligned, and released with ferry_buf_free,
 * except one that landed in the caller's memory (ferry_rpc_msg_land): borrowed. */
typedef struct ferry_rpc_tensor {
    int dtype; /* FERRY_RPC_DTYPE_* */
    int ndim;  /* 0 (scalar) .. FERRY_RPC_MAX_DIMS */
    int64_t dim[FERRY_RPC_MAX_DIMS];
    void *data;                    /* row-major, little-endian; NULL when nbytes == 0 */
    size_t nbytes;                 /* == prod(dim[0..ndim)) * ferry_rpc_dtype_size(dtype) */
    char name[FERRY_RPC_NAME_MAX]; /* "" or a role label such as "ids" */
    ferry_rpc_release_fn release;
    void *release_user;
} ferry_rpc_tensor;

/* Bytes a tensor of this type and shape needs, in *out. FERRY_ERR_INVALID for an
 * unknown dtype, a rank outside 0..FERRY_RPC_MAX_DIMS or a negative dimension;
 * FERRY_ERR_RANGE if the size overflows size_t. */
ferry_status ferry_rpc_tensor_nbytes(int dtype, int ndim, const int64_t *dim, size_t *out);

/* Process-wide: lets glibc keep up to keep_bytes (0: 1 GiB) of freed heap
 * instead of returning it to the kernel after every large message, which
 * otherwise page-faults gRPC's receive buffers in again for each one (+30 to
 * +60% one-way throughput at 16 MiB on the 2-core dev VM). For daemons' main()
 * and benchmarks; a library does not change malloc behind its host's back.
 * FERRY_ERR_UNSUPPORTED without glibc. */
ferry_status ferry_rpc_tune_malloc(size_t keep_bytes);

/* Returns idle memory to the system: the recycled buffers (ferry_buf_release_idle)
 * and malloc's free pages (malloc_trim). For after a burst, such as freeing dead trainers'
 * state; the next large message pays the page faults again. */
void ferry_rpc_release_idle_memory(void);

/* A header plus tensors. Read the public fields; change them only through the
 * ferry_rpc_msg_* functions. Not thread-safe per object. */
typedef struct ferry_rpc_msg {
    /* Decoded header of a received message, a protobuf-c message of the method's
     * type (e.g. const Ferry__V1__ForwardReply *); NULL for a message built locally.
     * Its n_tensors is always 0: the tensors are below. */
    const void *head;
    ferry_rpc_tensor *tensors; /* ntensors entries */
    int ntensors;
    /* Private to common/rpc. */
    int cap;
    const void *head_desc; /* ProtobufCMessageDescriptor of head or head_bytes */
    uint8_t *head_bytes;   /* header packed by ferry_rpc_msg_set_head */
    size_t head_len;
    size_t max_bytes; /* 0, or the most tensor bytes this message may carry (a server
                         sets it on every reply to the message limit, so a reply
                         too large to send is refused before it is built) */
    void *call;       /* a server's reply: the call it answers (ferry_rpc_defer) */
    int wire_dtype;   /* FERRY_RPC_DTYPE_F32 (as they are) or _BF16: see ferry_rpc_dtype */
    const char *land_name; /* ferry_rpc_msg_land: kept by deinit, cleared by init */
    void *land;
    size_t land_bytes;
} ferry_rpc_msg;

/* Makes *m an empty message. No allocation; cannot fail. */
void ferry_rpc_msg_init(ferry_rpc_msg *m);

/* How m's F32 tensors of rank >= 2 travel: FERRY_RPC_DTYPE_F32 (exactly; the
 * default) or FERRY_RPC_DTYPE_BF16 (half the bytes, rounded to nearest even; the
 * receiver gets F32 back). FERRY_ERR_INVALID for another dtype. */
ferry_status ferry_rpc_msg_set_wire_dtype(ferry_rpc_msg *m, int dtype);

/* bfloat16 conversions: round to nearest even (a NaN stays a NaN), and exact widening. */
static inline uint16_t ferry_rpc_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN, sign kept */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float ferry_rpc_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* n floats as bfloat16 at dst (2n bytes, little-endian pairs), and back: element by
 * element as the two functions above, vectorised (common/rpc/bf16.c). */
void ferry_rpc_bf16_narrow(void *dst, const float *src, size_t n);
void ferry_rpc_bf16_widen(float *dst, const void *src, size_t n);

/* Asks that the next messages received into *m (a client's reply) write a tensor
 * named `name`, of dtype F32 and exactly nbytes bytes, straight to dst instead of a
 * buffer of its own: the copy out of the transport's buffers is then the only one,
 * and the tensor in m->tensors borrows dst (release NULL). Only the first such tensor
 * of a message lands; one that differs in name, dtype or size, or that travels as
 * BF16, is received as usual, so a caller copies from t->data when it is not dst.
 * A decode that fails may leave part of a tensor in dst. The landing stays set across
 * calls and ferry_rpc_msg_deinit (fan-out calls deinit their replies first), until
 * ferry_rpc_msg_init or ferry_rpc_msg_land(m, NULL, NULL, 0); dst and name must
 * outlive it. */
void ferry_rpc_msg_land(ferry_rpc_msg *m, const char *name, void *dst, size_t nbytes);

/* Releases every owned tensor and the header, leaving *m empty and reusable
 * (deinit twice is fine; a landing stays set: ferry_rpc_msg_land). */
void ferry_rpc_msg_deinit(ferry_rpc_msg *m);

/* Sets the header from a protobuf-c message of the method's type. A packed copy
 * is kept, so `head` and everything it points to may go away on return; m->head
 * becomes NULL. head == NULL sends an all-defaults header. Returns
 * FERRY_ERR_INVALID if head carries tensors (n_tensors != 0: add them with
 * ferry_rpc_msg_add instead), FERRY_ERR_NOMEM; *m is unchanged on failure. The
 * method is checked when the message is sent. */
ferry_status ferry_rpc_msg_set_head(ferry_rpc_msg *m, const struct ProtobufCMessage *head);

/* Appends a copy of the descriptor *t (ownership of t->data as documented at
 * ferry_rpc_tensor). Returns FERRY_ERR_INVALID for a bad dtype, rank,
 * dimension, a name of FERRY_RPC_NAME_MAX bytes or more, or data == NULL with
 * nbytes > 0; FERRY_ERR_SHAPE if nbytes does not match dtype and shape;
 * FERRY_ERR_RANGE past FERRY_RPC_MAX_TENSORS; FERRY_ERR_NOMEM. On failure the
 * message is unchanged and the caller still owns the data. */
ferry_status ferry_rpc_msg_add(ferry_rpc_msg *m, const ferry_rpc_tensor *t);

/* Like ferry_rpc_msg_add, but copies t->data into an owned aligned buffer, so
 * the caller's bytes are free again on return (t->release is not called). */
ferry_status ferry_rpc_msg_add_copy(ferry_rpc_msg *m, const ferry_rpc_tensor *t);

/* Makes *dst (empty: initialized or deinitialized) a request that sends what src
 * sends, owning copies of its header and tensors, so src's borrowed bytes may go
 * away (a call kept to send again elsewhere). src must be a message built locally
 * (its header set with ferry_rpc_msg_set_head or none). FERRY_ERR_NOMEM, with *dst
 * left empty. */
ferry_status ferry_rpc_msg_clone(ferry_rpc_msg *dst, const ferry_rpc_msg *src);

/* Appends an owned, uninitialized, 64-byte-aligned tensor of the given type and
 * shape and returns its storage in *data (NULL for 0 bytes), for a handler to
 * compute its result into without a further copy. name may be NULL. Errors as
 * ferry_rpc_msg_add; *data is unchanged on failure. */
ferry_status ferry_rpc_msg_alloc(ferry_rpc_msg *m, int dtype, int ndim, const int64_t *dim,
                                 const char *name, void **data);

/* Moves tensor i out of the message: *out receives its descriptor, including
 * release and release_user, and the message keeps only a borrowed view of it.
 * The caller now owns the data (call out->release(out->release_user) when done,
 * or hand *out to ferry_rpc_msg_add of another message). FERRY_ERR_INVALID for
 * an index out of range. */
ferry_status ferry_rpc_msg_take(ferry_rpc_msg *m, int i, ferry_rpc_tensor *out);

/* The first tensor named `name`, or NULL. */
const ferry_rpc_tensor *ferry_rpc_msg_find(const ferry_rpc_msg *m, const char *name);

/* Completion-queue waits (clients awaiting replies, server threads after a call)
 * poll without blocking for this many microseconds before they sleep, which saves
 * the 50-100 us wake-up of an idle core on VMs with deep idle states. Default
 * FERRY_RPC_DEFAULT_SPIN_US, or the FERRY_RPC_SPIN_US environment variable; 0 turns
 * spinning off. Process-wide; thread-safe. */
#define FERRY_RPC_DEFAULT_SPIN_US 100
void ferry_rpc_set_spin_us(int us);
int ferry_rpc_get_spin_us(void);

/* ---- Server -------------------------------------------------------------- */

typedef struct ferry_rpc_server ferry_rpc_server;

/* Serves one call. `req` is the decoded request (the handler may take its
 * tensors); `reply` is empty, and the handler fills it with
 * ferry_rpc_msg_set_head and owned tensors (ferry_rpc_msg_alloc, _add_copy, or
 * _add with a release function; a borrowed reply tensor fails the call with
 * INTERNAL). Return FERRY_OK, or an error with its detail set through
 * ferry_errorf: the client then receives the matching gRPC status (INVALID,
 * SHAPE, FORMAT, NUMERIC -> INVALID_ARGUMENT, NOT_FOUND -> NOT_FOUND, RANGE ->
 * OUT_OF_RANGE, EXISTS -> ALREADY_EXISTS, UNSUPPORTED -> UNIMPLEMENTED, TIMEOUT
 * -> DEADLINE_EXCEEDED, BUSY -> ABORTED, UNAVAILABLE -> UNAVAILABLE, NOMEM ->
 * RESOURCE_EXHAUSTED, others -> INTERNAL), the detail as its message, and the
 * exact ferry_status in trailing metadata, so ferry clients get it back
 * unchanged. On error the reply is discarded. Handlers run concurrently on the
 * server's threads and should not block for long. */
typedef ferry_status (*ferry_rpc_handler)(void *user, ferry_rpc_method method, ferry_rpc_msg *req,
                                          ferry_rpc_msg *reply);

/* A reply sent later. A handler that must wait for something other calls bring
 * (a barrier) calls ferry_rpc_defer(reply) and returns FERRY_OK; the server then
 * sends nothing when the handler returns, and whoever completes the wait, on any
 * thread, calls ferry_rpc_pending_finish exactly once with the status and a reply
 * message (filled like a handler's, or NULL on error; it is deinitialized). The
 * call keeps the server from finishing its shutdown until then, so the owner of
 * pending calls finishes them (with an error) when it stops. ferry_rpc_defer
 * returns NULL for a reply that belongs to no network call (an in-process
 * dispatch): the handler must then answer at once. A handler that deferred must
 * return FERRY_OK: the answer is the pending's, and an error returned after
 * ferry_rpc_defer is logged as a bug (an assertion in debug builds), not sent (a
 * pending that nobody then finishes holds its call, and the server's shutdown, for
 * ever: finish every pending handed out). */
typedef struct ferry_rpc_pending ferry_rpc_pending;
ferry_rpc_pending *ferry_rpc_defer(ferry_rpc_msg *reply);
void ferry_rpc_pending_finish(ferry_rpc_pending *p, ferry_status st, ferry_rpc_msg *reply);

/* An answer before the work is done: a handler whose caller needs only part of
 * its work (a Backward's input gradient, not the weight gradient it accumulates)
 * fills reply, calls ferry_rpc_reply_now(reply), goes on with the rest and returns.
 * The reply goes out now, with status OK; the handler must not touch it again, and
 * what it returns afterwards is logged, not sent. FERRY_OK once sent; an error
 * (nothing sent, the reply untouched) when the reply cannot be encoded, and
 * FERRY_ERR_UNSUPPORTED for a reply that belongs to no network call or was
 * deferred: the handler then answers by returning, as usual.
 * ferry_rpc_can_reply_now tells beforehand whether the reply could go early. */
int ferry_rpc_can_reply_now(const ferry_rpc_msg *reply);
ferry_status ferry_rpc_reply_now(ferry_rpc_msg *reply);

/* Roles, weakest first: a role may call every method the roles before it may. */
typedef enum ferry_rpc_role {
    FERRY_RPC_ROLE_READER = 1,
    FERRY_RPC_ROLE_TRAINER = 2,
    FERRY_RPC_ROLE_ADMIN = 3,
} ferry_rpc_role;

/* "reader", "trainer", "admin" ("?" for another value); ferry_rpc_role_parse the
 * reverse (FERRY_ERR_INVALID for another name). */
const char *ferry_rpc_role_name(ferry_rpc_role role);
ferry_status ferry_rpc_role_parse(const char *name, ferry_rpc_role *out);

#define FERRY_RPC_IDENTITY_MAX 64 /* bytes of an identity name, with the NUL */
#define FERRY_RPC_SESSION_LEN  32 /* hex digits of a session id */
#define FERRY_RPC_TOKEN_MAX    4096

/* One entry of the server's token table: whoever sends the token is this identity
 * with this role. */
typedef struct ferry_rpc_identity {
    const char *name; /* 1..63 bytes of [A-Za-z0-9_.:@-] */
    ferry_rpc_role role;
    const char *token; /* 1..FERRY_RPC_TOKEN_MAX bytes */
} ferry_rpc_identity;

/* Who made a call, as the server established it before the handler runs
 * (ferry_rpc_caller). Nothing here comes from what the client says about itself but
 * `session` (checked by the application against its own table) and `label`. */
typedef struct ferry_rpc_caller_info {
    /* The token's identity, or with mutual TLS the certificate's subject (CN, else its
     * first DNS/URI SAN); "anonymous" without either. */
    char identity[FERRY_RPC_IDENTITY_MAX];
    ferry_rpc_role role; /* the token's; FERRY_RPC_ROLE_ADMIN when no tokens are set */
    /* 1 when the role comes from an admin token: may act on other identities' objects. */
    int authority;
    char session[FERRY_RPC_SESSION_LEN + 1]; /* metadata "ferry-session"; "" if absent/bad */
    char label[64];                          /* metadata "ferry-client": logs only */
} ferry_rpc_caller_info;

/* A lease: a client's open Session stream (proto/ferry.proto section 2). */
typedef struct ferry_rpc_lease_ops {
    /* Checks the caller's session and records the open stream: FERRY_OK with *handle
     * set, or an error (its detail from ferry_errorf) that refuses the stream. */
    ferry_status (*open)(void *user, const ferry_rpc_caller_info *who, void **handle);
    /* The stream ended (the client went away, or the server stops): exactly once per
     * successful open, on a server thread. */
    void (*close)(void *user, void *handle);
} ferry_rpc_lease_ops;

typedef struct ferry_rpc_server_config {
    const char *listen;       /* "127.0.0.1:0" (port 0: an ephemeral port), "[::]:7000" */
    int threads;              /* completion-queue threads running handlers; 0: 2 */
    size_t max_message_bytes; /* both directions; 0: FERRY_RPC_DEFAULT_MAX_MESSAGE_BYTES */
    int slots;                /* calls kept posted per method; 0: 4 */
    /* Non-zero: this server's incarnation. A call whose request metadata names
     * another (a client that spoke to an earlier process on this address) is refused
     * with FERRY_ERR_NOT_FOUND before its handler runs: whatever it refers to is gone. */
    uint64_t incarnation;
    /* The token table (nidentities entries, copied). With entries, every call but the
     * health service must carry metadata "authorization: Bearer <token>" (compared in
     * constant time): none or an unknown one is refused with FERRY_ERR_AUTH
     * (UNAUTHENTICATED), a role below method_role[m] with FERRY_ERR_DENIED
     * (PERMISSION_DENIED), before the handler runs. Without entries every caller has
     * role admin (but no authority). */
    const ferry_rpc_identity *identities;
    int nidentities;
    ferry_rpc_role method_role[FERRY_RPC_METHOD_COUNT]; /* 0: reader */
    /* TLS, PEM text (NULL: plaintext). cert and key: serve TLS; ca as well: clients
     * must present a certificate that ca signed (mutual TLS); a certificate without a
     * CN or a DNS/URI subject alternative name is refused (UNAUTHENTICATED). */
    const char *tls_cert_pem, *tls_key_pem, *tls_ca_pem;
    ferry_rpc_handler handlers[FERRY_RPC_METHOD_COUNT]; /* NULL: UNIMPLEMENTED */
    /* Methods answered at once on the threads polling gRPC (cheap, never waiting:
     * Hello, Stats). Every other method goes through a fair work queue: `workers`
     * threads (0: `threads`) take the callers' identities in turn, one identity may run
     * at most max_calls_per_identity calls at once (0: its fair share of the workers
     * while others have work), and a call over max_queued_calls waiting (0: 4096), or
     * max_queued_calls_per_identity of its identity (0: 1024), is refused with
     * FERRY_ERR_RESOURCE. Health checks never queue. */
    unsigned char cheap[FERRY_RPC_METHOD_COUNT];
    int workers, max_calls_per_identity, max_queued_calls, max_queued_calls_per_identity;
    /* Replies sent but not yet taken by their clients (a client that stops reading
     * holds them in the server): at most max_pending_bytes in all (0: 1 GiB) and
     * max_pending_bytes_per_connection per connection (0: max_message_bytes; a
     * connection may always hold one reply); a reply past either is refused with
     * FERRY_ERR_RESOURCE, and one unread after reply_timeout_s (0: 60) is cancelled by
     * ferry_rpc_server_reap. */
    int64_t max_pending_bytes, max_pending_bytes_per_connection;
    double reply_timeout_s;
    /* Session streams ("/ferry.v1.Ferry/Session"); NULL open: UNIMPLEMENTED. A stream
     * needs role reader. */
    ferry_rpc_lease_ops lease;
    void *user; /* first argument of every handler and lease op */
} ferry_rpc_server_config;

/* Binds, starts the threads and serves until shutdown. Unknown methods and
 * methods without a handler get UNIMPLEMENTED, requests over max_message_bytes
 * RESOURCE_EXHAUSTED, undecodable requests INVALID_ARGUMENT; the server goes
 * on serving. Returns FERRY_ERR_INVALID for a bad config (no listen address,
 * threads or slots out of 1..64, max_message_bytes above INT_MAX), FERRY_ERR_IO
 * if the address cannot be bound, FERRY_ERR_NOMEM; *out is unchanged then. */
ferry_status ferry_rpc_server_create(const ferry_rpc_server_config *cfg, ferry_rpc_server **out);

/* The bound TCP port (the ephemeral one for ":0"). */
int ferry_rpc_server_port(const ferry_rpc_server *s);

/* Who made the call a handler is answering (reply->call), or NULL outside a network
 * call (an in-process dispatch). Valid until the handler returns. */
const ferry_rpc_caller_info *ferry_rpc_caller(const ferry_rpc_msg *reply);

/* Per-method call counts and latency, for metrics. Latency buckets are upper bounds
 * in seconds (ferry_rpc_latency_bounds); a server measures from the call's arrival
 * to its answer being queued, a client from sending to the fan-out's last answer. */
#define FERRY_RPC_LATENCY_BUCKETS 14
#define FERRY_RPC_CODES           17 /* gRPC status codes 0..16 */
extern const double ferry_rpc_latency_bounds[FERRY_RPC_LATENCY_BUCKETS];
typedef struct ferry_rpc_method_stats {
    uint64_t calls[FERRY_RPC_CODES]; /* answered, by gRPC status code */
    uint64_t buckets[FERRY_RPC_LATENCY_BUCKETS], over; /* per bucket, not cumulative */
    double sum_s;
} ferry_rpc_method_stats;
/* Method slots: ferry's unary methods 0..FERRY_RPC_METHOD_COUNT-1, then
 * FERRY_RPC_STATS_HEALTH (grpc.health.v1.Health), FERRY_RPC_STATS_OTHER (unknown
 * paths) and FERRY_RPC_STATS_SESSION (Session streams, counted when they end). */
#define FERRY_RPC_STATS_HEALTH  FERRY_RPC_METHOD_COUNT
#define FERRY_RPC_STATS_OTHER   (FERRY_RPC_METHOD_COUNT + 1)
#define FERRY_RPC_STATS_SESSION (FERRY_RPC_METHOD_COUNT + 2)
#define FERRY_RPC_STATS_SLOTS   (FERRY_RPC_METHOD_COUNT + 3)
/* The path of the Session stream method. */
#define FERRY_RPC_SESSION_PATH "/ferry.v1.Ferry/Session"
/* The label of a slot: "Forward", ..., "grpc.health.v1.Health", "unknown", "Session". */
const char *ferry_rpc_stats_slot_name(int slot);
/* The name of a gRPC status code ("OK", "NOT_FOUND", ...). */
const char *ferry_rpc_code_name(int code);
void ferry_rpc_server_method_stats(ferry_rpc_server *s, int slot, ferry_rpc_method_stats *out);

/* The fair work queue: calls waiting and running (of its workers), served, refused,
 * and how long the served ones waited (mean, worst). */
typedef struct ferry_rpc_queue_stats {
    int queued, running, workers;
    uint64_t served, refused;
    double wait_mean_s, wait_max_s;
} ferry_rpc_queue_stats;
void ferry_rpc_server_queue_stats(ferry_rpc_server *s, ferry_rpc_queue_stats *out);

/* Cancels the replies older than the reply timeout that their clients have not read;
 * returns how many (for a daemon's periodic timer). Thread-safe. */
int ferry_rpc_server_reap(ferry_rpc_server *s);
typedef struct ferry_rpc_pending_stats {
    int64_t bytes, worst_connection_bytes; /* unread reply bytes held: in all, the most one
                                              connection holds */
    int64_t max_bytes, max_bytes_per_connection;
    uint64_t refused, cancelled; /* replies refused over a limit, cancelled unread */
} ferry_rpc_pending_stats;
void ferry_rpc_server_pending_stats(ferry_rpc_server *s, ferry_rpc_pending_stats *out);

/* The grpc.health.v1 status the server reports: 1 SERVING (from the start), 0
 * NOT_SERVING (a daemon draining). Thread-safe. */
void ferry_rpc_server_set_serving(ferry_rpc_server *s, int serving);

/* Starts a graceful shutdown and returns at once: stop accepting calls, let
 * in-flight calls finish, and cancel those still running grace_ms later
 * (grace_ms <= 0: cancel at once). Idempotent; thread-safe; may be called from
 * a handler or a libuv callback. */
void ferry_rpc_server_shutdown(ferry_rpc_server *s, int grace_ms);

/* Waits until a shutdown has drained every call and stopped the threads.
 * timeout_ms < 0 waits forever. FERRY_ERR_TIMEOUT if still running. Must not be
 * called from a handler. */
ferry_status ferry_rpc_server_wait(ferry_rpc_server *s, int timeout_ms);

/* Shuts down (grace 0 if no shutdown was started), waits for the threads and
 * frees the server. NULL is a no-op. Must not be called from a handler. */
void ferry_rpc_server_destroy(ferry_rpc_server *s);

typedef struct ferry_rpc_server_stats {
    uint64_t calls;     /* calls answered (reply sent), any status */
    uint64_t errors;    /* calls answered with a non-OK status */
    uint64_t bytes_in;  /* request message bytes */
    uint64_t bytes_out; /* reply message bytes */
    int64_t in_flight;  /* calls received but not yet answered */
} ferry_rpc_server_stats;

/* A snapshot of the counters; thread-safe. */
void ferry_rpc_server_get_stats(const ferry_rpc_server *s, ferry_rpc_server_stats *out);

/* ---- Client -------------------------------------------------------------- */

typedef struct ferry_rpc_client ferry_rpc_client;

typedef struct ferry_rpc_client_config {
    size_t max_message_bytes; /* both directions; 0: FERRY_RPC_DEFAULT_MAX_MESSAGE_BYTES */
    int deadline_ms;          /* for calls that pass deadline_ms <= 0; 0: 10000 */
    int wait_for_ready;       /* 1: calls wait up to their deadline for the server to
                                 come up; 0: fail fast with FERRY_ERR_UNAVAILABLE */
    const char *token;        /* sent as "authorization: Bearer <token>"; NULL: none */
    const char *client_name;  /* sent as "ferry-client" metadata (a label for the
                                 server's logs); NULL: none */
    /* TLS, PEM text: ca set: connect with TLS and verify the server's certificate
     * against it; cert and key as well: present them (mutual TLS). */
    const char *tls_ca_pem, *tls_cert_pem, *tls_key_pem;
} ferry_rpc_client_config;

/* Creates a client for target ("127.0.0.1:7000", "host:port", "unix:/path").
 * Connecting is lazy: a dead server shows up as FERRY_ERR_UNAVAILABLE on the
 * first call. cfg may be NULL for defaults. Returns FERRY_ERR_INVALID for an
 * empty target or bad config, FERRY_ERR_NOMEM; *out is unchanged then. */
ferry_status ferry_rpc_client_create(const char *target, const ferry_rpc_client_config *cfg,
                                     ferry_rpc_client **out);

/* Frees the client; no call may be in flight on it. NULL is a no-op. */
void ferry_rpc_client_destroy(ferry_rpc_client *c);

/* The target string given at creation. */
const char *ferry_rpc_client_target(const ferry_rpc_client *c);
/* Whether later calls wait for a server that is not up (up to their deadline). */
void ferry_rpc_client_set_wait_for_ready(ferry_rpc_client *c, int on);
/* Non-zero: the server incarnation this client expects (from Hello). Forward,
 * Backward, GradNorm, Step and Checkpoint then carry it, and a server of another
 * incarnation (it restarted: the contexts these calls refer to are gone, its state is
 * a restored one) refuses them with FERRY_ERR_NOT_FOUND instead of serving them from
 * its new state. 0: not sent. */
void ferry_rpc_client_set_incarnation(ferry_rpc_client *c, uint64_t incarnation);
/* The session this client's later calls run in (HelloReply.session): every call but
 * Hello then carries it as metadata "ferry-session", and Hello too (which renews it
 * instead of opening another). With `lease`, the client also holds the server's
 * Session stream open (opened now, and again by a later call once it ended), so that
 * the server keeps the session while this process lives and learns at once when it
 * goes away. NULL or "" forgets the session (and closes the stream). Thread-safe;
 * FERRY_ERR_INVALID for an id that is not FERRY_RPC_SESSION_LEN hex digits. */
ferry_status ferry_rpc_client_set_session(ferry_rpc_client *c, const char *session, int lease);
/* 1 while the client's Session stream is open (the server holds it). */
int ferry_rpc_client_lease_open(ferry_rpc_client *c);
/* This client's calls of method slot (see ferry_rpc_server_method_stats). */
void ferry_rpc_client_method_stats(ferry_rpc_client *c, int slot, ferry_rpc_method_stats *out);
/* grpc.health.v1.Health/Check of service "" on this client's server: *serving is 1
 * for SERVING, 0 for anything else. Errors as ferry_rpc_call. */
ferry_status ferry_rpc_health_check(ferry_rpc_client *c, int deadline_ms, int *serving);
/* Message bytes this client has sent and received so far (as encoded, headers and
 * tensors; gRPC's framing not counted). Thread-safe. */
void ferry_rpc_client_bytes(ferry_rpc_client *c, uint64_t *sent, uint64_t *received);

/* One synchronous call with a deadline (deadline_ms <= 0: the client's default).
 * req is only read: its borrowed tensors may be reused or freed once this
 * returns, and the same req may be sent again or to several peers. *reply must
 * be initialized; its old content is released first, and on success it holds the
 * decoded reply (caller deinitializes it). On failure the reply is empty and the
 * detail (ferry_error_last) names peer, method, gRPC code and message, e.g.
 * "127.0.0.1:5000 Forward: DEADLINE_EXCEEDED (deadline 2000 ms)". Errors: the
 * server's own ferry_status when it sent one; otherwise FERRY_ERR_TIMEOUT
 * (deadline), FERRY_ERR_UNAVAILABLE (cannot connect, connection lost),
 * FERRY_ERR_RANGE (a message over a size limit, either end),
 * FERRY_ERR_UNSUPPORTED (UNIMPLEMENTED), FERRY_ERR_FORMAT (undecodable reply),
 * FERRY_ERR_INVALID (bad request: header of another method's type),
 * FERRY_ERR_RPC (anything else). Thread-safe: many threads may call at once. */
ferry_status ferry_rpc_call(ferry_rpc_client *c, ferry_rpc_method method, const ferry_rpc_msg *req,
                            ferry_rpc_msg *reply, int deadline_ms);

/* One call of a fan-out. The caller fills the first four fields. */
typedef struct ferry_rpc_fanout {
    ferry_rpc_client *client;
    ferry_rpc_method method;
    const ferry_rpc_msg *req; /* may be shared by several entries */
    ferry_rpc_msg *reply;     /* initialized by the caller, as for ferry_rpc_call */
    ferry_status status;      /* out: this call's result */
    int transport;            /* out: 1 if it failed in transit (deadline, no connection),
                                 not by the server's answer: the server may or may not
                                 have run it */
    char error[256];          /* out: its detail message, "" on success */
    /* Replicas (ferry_rpc_call_many_grace): entries with the same group > 0 are one
     * call to the replicas of a shard. 0: on its own. */
    int group;
} ferry_rpc_fanout;

/* Starts all n calls at once, each with the deadline (<= 0: its client's
 * default), and waits for all of them. Each entry gets its own status and error;
 * the return value is FERRY_OK if every call succeeded, else the status of the
 * first failed entry (with its detail in ferry_error_last). Thread-safe. */
ferry_status ferry_rpc_call_many(ferry_rpc_fanout *calls, int n, int deadline_ms);
/* The same, running during(arg) on the calling thread once every call is on its way
 * and before waiting for their answers: work of the caller's own that overlaps with
 * the servers'. during may be NULL. The client's latency figures for these calls
 * (ferry_rpc_client_method_stats) then span the caller's work too. */
/* The same, where a group's laggards are cut short: once one entry of a group has
 * been answered OK (or ABORTED: a server's BUSY), the others of that group get grace_ms more, then
 * are cancelled and fail in transit (DEADLINE_EXCEEDED). A replica that a peer trainer stopped
 * calling holds a bsp GradNorm in its barrier until the sync timeout; its siblings answered long
 * before. */
ferry_status ferry_rpc_call_many_grace(ferry_rpc_fanout *calls, int n, int deadline_ms,
                                       int grace_ms, void (*during)(void *arg), void *arg);
ferry_status ferry_rpc_call_many_during(ferry_rpc_fanout *calls, int n, int deadline_ms,
                                        void (*during)(void *arg), void *arg);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_RPC_H */
