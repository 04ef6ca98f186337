/* ferry.h - the remote-module API: connect to ferry-ps servers, create modules they
 * host (an embedding sharded by rows, a decoder sharded by vocabulary slices, a
 * linear layer on one server), call them inside a distributed-autograd context,
 * send the gradients back, and step every owner's optimizer with one global
 * clipping scale. Plain C; every call has a deadline; ferry-trainer is a client of
 * exactly this API.
 *
 *     ferry_cluster_config cc;
 *     ferry_cluster_config_default(&cc);
 *     cc.worker_id = 3;
 *     ferry_cluster *cl;
 *     ferry_ps_connect("10.0.0.1:7000,10.0.0.2:7000", &cc, &cl);   // Hello to each
 *
 *     ferry_remote_config ec;
 *     ferry_remote_config_default(&ec, FERRY_REMOTE_EMBEDDING, "encoder", V, E);
 *     ec.optim = ferry_optim_defaults(FERRY_OPTIM_SGD);
 *     ferry_remote *emb, *dec;
 *     ferry_remote_create(cl, &ec, &emb);                          // rows split over both
 *     ... the same with FERRY_REMOTE_DECODER, "decoder", V, H for dec ...
 *
 *     ferry_dist_ctx *dc;
 *     ferry_dist_ctx_create(cl, &dc);
 *     for (each step) {
 *         ferry_dist_ctx_begin(dc);                                // new context id
 *         uint64_t ce, cd;
 *         ferry_remote_embedding_forward(emb, dc, ids, T * B, x, &ce);       // x (T*B, E)
 *         ... local model: x -> h (N, H) ...
 *         ferry_remote_xent_forward(dec, dc, h, targets, N, NULL, &loss_sum, &cd);
 *         ferry_remote_xent_backward(dec, dc, cd, NULL, 1.0f / N, dh);       // dh (N, H)
 *         ... local backward: dh -> dx (T*B, E) ...
 *         ferry_remote_embedding_backward(emb, dc, ce, dx);
 *         ferry_dist_ctx_clip_step(dc, local_sumsq, 5.0f, lr, &coef, &norm); // GradNorm+Step
 *         ... local optimizer step with coef ...
 *     }
 *
 * Errors: every function returns a ferry_status and sets a one-line detail
 * (ferry_error_last) that names the peer for remote failures, e.g.
 * "127.0.0.1:7001 Forward: UNAVAILABLE (failed to connect)". A dead server gives
 * FERRY_ERR_UNAVAILABLE (or FERRY_ERR_TIMEOUT once the deadline passes) within the
 * deadline; the server's own checks arrive as FERRY_ERR_NOT_FOUND (unknown module or
 * context), FERRY_ERR_SHAPE / FERRY_ERR_INVALID / FERRY_ERR_NUMERIC (bad input),
 * FERRY_ERR_RANGE (ids or rows out of range, a request over the size limit),
 * FERRY_ERR_RESOURCE (a request that would take the server past one of its memory
 * budgets, or a reply over the message limit; the message names the budget and its
 * flag), FERRY_ERR_EXISTS (a module of that name with another configuration).
 *
 * Threads: a cluster and its remote modules may be used from several threads at
 * once; a distributed context by one thread at a time, except that Forward and
 * Backward calls of different modules may run from two threads at once (a pipeline's
 * stages). */
#ifndef FERRY_FERRY_H
#define FERRY_FERRY_H

#include "ferry/export.h"

#include <stddef.h>
#include <stdint.h>

#include "ferry/autograd.h" /* ferry_ctx: remote calls as tape nodes */
#include "ferry/optim.h"    /* ferry_optim_config: the shards' optimizer */
#include "ferry/status.h"
#include "ferry/tensor.h"
#include "ferry/version.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Cluster: the ferry-ps servers a program talks to ------------------------ */

typedef struct ferry_cluster ferry_cluster;

enum { FERRY_REPLICATION_PRIMARY_BACKUP = 0, FERRY_REPLICATION_ACTIVE = 1 };

typedef struct ferry_cluster_config {
    uint16_t worker_id;       /* high 16 bits of every context id this process makes */
    int deadline_ms;          /* deadline of every call; 0: 10000 */
    size_t max_message_bytes; /* both directions; 0: 256 MiB (match the servers') */
    int wait_for_ready;       /* 1: calls after connecting wait (up to their deadline) for a
                                 server that is not up, and fail with FERRY_ERR_TIMEOUT; 0:
                                 fail at once with FERRY_ERR_UNAVAILABLE. Connecting itself
                                 follows connect_timeout_ms. */
    const char *client_id;    /* sent in Hello; NULL: "ferry@<host>:<pid>" */
    int retry_ms;             /* see ferry_cluster_set_retry; 0: no retries */
    /* Connecting: a malformed HOST:PORT fails at once (FERRY_ERR_INVALID), and so does
     * a host the resolver says does not exist (FERRY_ERR_NOT_FOUND), unless
     * resolve_timeout_ms allows it to appear (a Kubernetes headless Service names a pod
     * only once it is ready). A port nobody listens on, or a resolver that does not
     * answer (FERRY_ERR_UNAVAILABLE), is retried for up to connect_timeout_ms (0: one
     * try), with a log line saying what it waits for. TLS on one side only, or a
     * certificate either side refuses, fails at once (FERRY_ERR_AUTH, saying which);
     * a server that accepts but does not answer Hello in deadline_ms is
     * FERRY_ERR_TIMEOUT. Each message names the server and which of these it was. */
    int connect_timeout_ms;
    /* Security (NULL: none). token: sent on every call as "authorization: Bearer
     * <token>" (a ferry-ps started with --token-file/--admin-token-file needs it).
     * tls_ca_file: connect with TLS, verifying the servers against this CA (PEM);
     * tls_cert_file + tls_key_file: present this certificate (mutual TLS). */
    const char *token;
    const char *tls_ca_file, *tls_cert_file, *tls_key_file;
    int resolve_timeout_ms; /* see connect_timeout_ms; 0: an unknown host fails at once */
    /* 1: Forward and Backward send their float tensors of rank 2 or more (activations,
     * dense pulls and pushes) as bfloat16 and ask for replies so: half the bytes, each
     * value rounded to nearest even; the servers' parameters and optimizer state stay
     * float32. 0: float32, exact. CreateModule, Get/SetParams are always exact. */
    int wire_bf16;
    /* Replicated shards: targets lists R servers per shard, each shard's replicas side
     * by side ("a0,a1,b0,b1" with R = 2: shard 0 on a0 and a1, shard 1 on b0 and b1),
     * so ferry_cluster_size is the target count / R. Every call goes to every live
     * replica of its shard and the first one's answer is taken; a replica that fails a
     * call its siblings answered (dies, stalls past the deadline, restarted) is dropped
     * and the shard goes on with the others, no roll-back. The replicas stay identical
     * only where their calls are deterministic: one trainer, or a bsp job. 0 or 1: one
     * server per shard. */
    int replicas;
    /* How a bsp job's contexts use the replicas (replicas > 1, once a bsp job of this
     * cluster is made: ferry_job_create or _join):
     * FERRY_REPLICATION_PRIMARY_BACKUP (0, the default): Forward, Backward and GradNorm
     * go to each shard's first live replica (its primary) alone; the ranks, dealt the
     * shards round robin, ship the primary's summed gradient of each step to the
     * backups with their Step, which applies it there too, so a backup spends a Step's
     * work, not the step's. A primary that fails a call is dropped, and this process
     * replays the context's calls of the step on the next replica, which takes over.
     * FERRY_REPLICATION_ACTIVE (1): every call to every live replica, as above. */
    int replication;
    /* Room to grow (ferry_cluster_config_default zeroes it): a later release of the same soname
     * takes new fields from it, each meaning its default at zero, so a caller built against this
     * header keeps its behaviour and the struct its size. */
    unsigned char reserved[52];
} ferry_cluster_config;

/* worker_id 0, deadline 10 s, default message limit, fail fast. */
FERRY_API void ferry_cluster_config_default(ferry_cluster_config *cfg);

/* Connects to the comma-separated servers in targets ("h1:7000,h2:7000"), in that
 * order (server index 0, 1, ...), and says Hello to all of them concurrently,
 * recording each one's incarnation. cfg may be NULL for the defaults. Errors:
 * FERRY_ERR_INVALID for an empty or malformed list (or more than 256 servers),
 * FERRY_ERR_NOT_FOUND for a host that does not resolve, the first failed Hello's
 * status (FERRY_ERR_UNAVAILABLE, FERRY_ERR_TIMEOUT, FERRY_ERR_AUTH for a token or TLS
 * problem, ...) naming that server, FERRY_ERR_NOMEM; *out is unchanged on failure.
 * See connect_timeout_ms for what is retried. */
FERRY_API ferry_status ferry_ps_connect(const char *targets, const ferry_cluster_config *cfg,
                                        ferry_cluster **out);

/* The clients of ferry_ps_connect without any call: no Hello, so no token is needed
 * and a server that is down or refuses is not an error here. For health checks
 * (ferry_cluster_health, which needs no token) and tools; the other calls work too,
 * but without the incarnations Hello records. Errors: FERRY_ERR_INVALID for a
 * malformed list, FERRY_ERR_NOT_FOUND for a host that does not resolve,
 * FERRY_ERR_NOMEM, TLS files that cannot be read; *out is unchanged on failure. */
FERRY_API ferry_status ferry_ps_open(const char *targets, const ferry_cluster_config *cfg,
                                     ferry_cluster **out);

/* Closes the connections. Remote modules and contexts made from the cluster must
 * be destroyed first. Server state (modules, open contexts) is left as it is. NULL
 * is a no-op. */
FERRY_API void ferry_cluster_destroy(ferry_cluster *c);

FERRY_API int ferry_cluster_size(const ferry_cluster *c);                       /* servers */
/* Points c at `targets` in place of its servers (an elastic job's servers moved,
 * ferry_job_servers): a server of both lists keeps its connection and session, a new
 * one is connected (Hello, with cfg's token and TLS files), one left out is closed.
 * Server indexes follow the new list. No call may be in flight on c; modules placed
 * over it are placed again with ferry_remote_replace. Not with replicas (R > 1). On
 * failure c keeps its servers. */
FERRY_API ferry_status ferry_cluster_retarget(ferry_cluster *c, const char *targets,
                                              const ferry_cluster_config *cfg);
FERRY_API const char *ferry_cluster_target(const ferry_cluster *c, int server); /* "h:p" */
/* 0: later calls to a server that is down fail at once (UNAVAILABLE) instead of
 * waiting for it up to their deadline. Call while no call is in flight. */
FERRY_API void ferry_cluster_set_wait_for_ready(ferry_cluster *c, int on);
/* retry_ms > 0: a Forward, Backward, GradNorm, Step, ReleaseContext, GetParams or
 * Stats that fails in transit (its deadline passed, or the server could not be
 * reached) is sent again, with the same context and call ids, after a short pause
 * (50 ms doubling to 250 ms), until it is answered or retry_ms have passed since the
 * first failure (no attempt runs past that). The server applies each such call once however often
 * it arrives (proto/ferry.proto section 6), so a stall or a lost connection costs time, not the
 * step. A server that restarted meanwhile refuses the retry (NOT_FOUND: its contexts are gone). 0
 * (the default): no retries. Thread-safe. */
FERRY_API void ferry_cluster_set_retry(ferry_cluster *c, int retry_ms);
/* Calls sent again so far (see ferry_cluster_set_retry). */
FERRY_API uint64_t ferry_cluster_retries(const ferry_cluster *c);
/* Replicated shards (ferry_cluster_config.replicas): the replicas per shard, and in
 * *live (may be NULL) how many of shard `server`'s are still called. */
FERRY_API int ferry_cluster_replicas(const ferry_cluster *c, int server, int *live);
/* Replicas dropped so far, and the latest drop's log line in last (cap bytes, may be
 * NULL): which server, the call it failed and why, who serves its shard now. */
FERRY_API uint64_t ferry_cluster_replicas_dropped(ferry_cluster *c, char *last, size_t cap);

/* This process's calls of one method ("Forward", ...) to one server: how many, how
 * many failed, and their latency (from sending to the fan-out's last answer) per
 * bucket of ferry_call_latency_bounds (seconds, upper bounds; not cumulative). */
#define FERRY_CALL_LATENCY_BUCKETS 14
FERRY_API extern const double ferry_call_latency_bounds[FERRY_CALL_LATENCY_BUCKETS];
typedef struct ferry_call_stats {
    uint64_t calls, errors;
    uint64_t buckets[FERRY_CALL_LATENCY_BUCKETS], over;
    double sum_s;
} ferry_call_stats;
FERRY_API ferry_status ferry_cluster_call_stats(ferry_cluster *c, int server, const char *method,
                                                ferry_call_stats *out);
/* grpc.health.v1 Check of one server: *serving 1 when it reports SERVING. Needs no
 * token; a TLS mismatch or refused certificate is FERRY_ERR_AUTH saying which. */
FERRY_API ferry_status ferry_cluster_health(ferry_cluster *c, int server, int *serving);
/* The server's incarnation as of the last Hello (a new random value per start). */
FERRY_API uint64_t ferry_cluster_incarnation(const ferry_cluster *c, int server);

/* Says Hello to every server again. *restarted (may be NULL) receives how many
 * servers report a new incarnation since the previous Hello: they restarted and
 * lost whatever was not checkpointed. Errors as ferry_ps_connect. It updates the
 * incarnations: do not run it while another thread reads them. */
FERRY_API ferry_status ferry_cluster_hello(ferry_cluster *c, int *restarted);

typedef struct ferry_ps_stats {
    int64_t contexts_live; /* contexts held now */
    int64_t context_bytes; /* memory they hold (gradients, saved activations) */
    int64_t contexts_created, contexts_stepped, contexts_released, contexts_swept;
    int64_t modules;
    int64_t calls, errors; /* calls answered so far, and those with an error status */
} ferry_ps_stats;

/* The counters of one server. FERRY_ERR_INVALID for a bad index; call errors. */
FERRY_API ferry_status ferry_cluster_stats(ferry_cluster *c, int server, ferry_ps_stats *out);

/* Message bytes sent to and received from all servers so far (headers and tensors as
 * encoded; gRPC's own framing not counted). */
FERRY_API void ferry_cluster_bytes(ferry_cluster *c, uint64_t *sent, uint64_t *received);

/* Every counter of one server's Stats whose name starts with prefix (NULL or "":
 * all), as fn(user, name, value) in the server's order: the fields above, "version/
 * <module>", and per job "job/<name>/step/<rank>" (steps each rank has done),
 * "job/<name>/min_step", "job/<name>/applied" (bsp), "job/<name>/max_lead" (ssp: the
 * most steps a rank was ahead of the slowest when its Step returned),
 * "job/<name>/waited_s/<rank>". FERRY_ERR_INVALID for a bad index; call errors. */
FERRY_API ferry_status ferry_cluster_metrics(ferry_cluster *c, int server, const char *prefix,
                                             void (*fn)(void *user, const char *name, double value),
                                             void *user);

/* Asks every server to write a checkpoint (all modules, parameters and optimizer
 * state) into its --checkpoint-dir, concurrently. name: a file name, or NULL/"" for
 * the server's default ("ferry-ps-<port>-step<step>.ckpt"). FERRY_ERR_UNSUPPORTED
 * from a server started without --checkpoint-dir. */
FERRY_API ferry_status ferry_cluster_checkpoint(ferry_cluster *c, const char *name, uint64_t step);

/* Asks server (or every server, for -1) to shut down: it stops accepting calls and
 * gives those in flight grace_ms. */
FERRY_API ferry_status ferry_cluster_shutdown(ferry_cluster *c, int server, int grace_ms);

/* Who the servers take this client for (its identity, from its token or certificate;
 * "anonymous" without either), as the last Hello said. */
FERRY_API const char *ferry_cluster_identity(const ferry_cluster *c);

/* One module a server hosts, as it reports it (ListModules). */
typedef struct ferry_module_info {
    const char *name;
    const char *kind;             /* "embedding", "decoder", "linear", "dense", "lstm" */
    const char *owner;            /* its identity; "" unless this client is an admin */
    int64_t dims[2];              /* as ferry_remote_config.dims */
    int64_t row_begin, row_count; /* the rows this server's shard holds */
    uint64_t version, num_params, bytes;
} ferry_module_info;

/* The modules server hosts that this client may use (its identity's; an admin: every
 * one), whose names start with prefix (NULL or "": all), as fn(user, &info) in creation
 * order; info's strings live until fn returns. FERRY_ERR_INVALID for a bad index; call
 * errors. */
FERRY_API ferry_status ferry_cluster_list_modules(ferry_cluster *c, int server, const char *prefix,
                                                  void (*fn)(void *user,
                                                             const ferry_module_info *m),
                                                  void *user);

/* Deletes module `name` from every server that hosts it (a module of this client's
 * identity; with the admin token, anyone's): later calls do not find it, and each
 * server gives its memory and budget back once the calls and contexts using it are
 * done. *servers (may be NULL) receives how many servers had it. FERRY_ERR_NOT_FOUND
 * when none had it (or only another identity's); call errors. */
FERRY_API ferry_status ferry_cluster_delete_module(ferry_cluster *c, const char *name,
                                                   int *servers);

/* Ends job `job` on every server that has it (a job of this client's identity; with the
 * admin token, anyone's): calls waiting in it fail with FERRY_ERR_BUSY, its ranks and
 * memory are freed, and a later join starts a new job of the name. Its modules and
 * checkpoints stay. *servers and errors as ferry_cluster_delete_module. */
FERRY_API ferry_status ferry_cluster_drop_job(ferry_cluster *c, const char *job, int *servers);

/* ---- Remote modules ---------------------------------------------------------- */

typedef struct ferry_remote ferry_remote;

typedef enum ferry_remote_kind {
    FERRY_REMOTE_EMBEDDING = 0, /* dims [V, E]: rows split over every server */
    FERRY_REMOTE_DECODER = 1,   /* dims [V, H]: output layer W (V, H), b (V), vocabulary
                                   slices over every server; sharded softmax */
    FERRY_REMOTE_LINEAR = 2,    /* dims [C, D]: y = x W^T + b, W (D, C), on one server */
    FERRY_REMOTE_DENSE = 3,     /* dims [R, C]: a block of parameters the caller computes with
                                   (pull the rows, push their gradient), rows split over every
                                   server: a data-parallel job's replicated dense weights */
    FERRY_REMOTE_LSTM = 4,      /* dims [C, H]: `layers` consecutive layers of a stacked LSTM
                                   (input C, hidden H) on one server, a pipeline stage */
} ferry_remote_kind;

typedef enum ferry_remote_constraint_kind {
    FERRY_REMOTE_CONSTRAINT_NONE = 0,
    FERRY_REMOTE_CONSTRAINT_STIEFEL = 1, /* cdopt's constraint dissolving, spec/stiefel.md */
} ferry_remote_constraint_kind;

/* A constraint on a remote module's weight, a property of the parameter declared at
 * creation; the server that owns the module applies it. Implemented for
 * FERRY_REMOTE_LINEAR only (an embedding or decoder server answers
 * FERRY_ERR_UNSUPPORTED).
 * STIEFEL on a linear module of dims [C, D]: the weight W (D, C), as stored and as
 * GetParams returns it, is the manifold variable with n = D rows >= p = C columns
 * (orthonormal columns, W^T W = I_C; D < C gives FERRY_ERR_INVALID). Forward computes
 * y = x A(W)^T + b with A(W) = W (1.5 I - 0.5 W^T W) formed from the current W on every
 * call; Backward maps dL/dA to W's gradient. The penalty beta ||W^T W - I||_F^2 is the
 * owner's: the server adds its gradient 4 beta W (W^T W - I) to the context once, when
 * the context's GradNorm or Step first needs it, so ferry_dist_ctx_grad_sumsq and the
 * clipping of ferry_dist_ctx_clip_step include it, and Step applies it (scaled by
 * grad_scale like every gradient). Each Step of a context is one optimizer step and
 * adds it once: two trainers stepping the same module add it twice, once per step,
 * each from W as it is at that moment. The client adds nothing to its own loss or
 * gradients; the values come back as Step metrics "penalty/<module>" and
 * "feasibility/<module>" (||W^T W - I||_F, before the step; see ferry_dist_ctx_metrics)
 * and in the server's Stats at the current W. */
typedef struct ferry_remote_constraint {
    ferry_remote_constraint_kind kind;
    double beta;    /* penalty weight >= 0 (cdopt's penalty_param, e.g. 0.1) */
    int polar_init; /* 1: the generated initial weight is replaced by its orthogonal polar
                       factor (thin SVD W = U S V^T, W <- U V^T), so the module starts on
                       the manifold as cdopt's layers do; explicit init_weight values are
                       always used as given. STIEFEL only */
} ferry_remote_constraint;

typedef struct ferry_remote_config {
    const char *name; /* the module's name on every server (1..63 of [A-Za-z0-9_.:/-]) */
    ferry_remote_kind kind;
    int64_t dims[2]; /* embedding [V, E]; decoder [V, H]; linear [C, D] */
    int bias;        /* linear: 1 for a bias (the decoder always has one) */
    int server;      /* linear: the server hosting it; -1: chosen by a hash of name */
    /* Initial values: U(-init_scale, init_scale) drawn from (init_seed, element index),
     * the generator of ferry_params_init_uniform. weight_offset and bias_offset give the
     * element index of the global weight's (0, 0) and the bias's (0) in the block whose
     * values are to be reproduced (-1: a block holding only this module: weight at 0,
     * bias after it, 16-float aligned). See "Parity" below. */
    uint64_t init_seed;
    float init_scale; /* 0: 0.1 */
    int64_t weight_offset, bias_offset;
    /* Or explicit initial values in global layout: weight (V, E) | (V, H) | (D, C),
     * bias (V) | (D); each shard receives its rows. NULL: use the generator. */
    const float *init_weight, *init_bias;
    /* The optimizer each shard runs on its own rows (ferry/optim.h). Every field is sent
     * as is (the server applies no defaults to a config built here), so remote and
     * local steps follow the same numbers. */
    ferry_optim_config optim;
    ferry_remote_constraint constraint; /* on the weight; default none */
    /* lstm: its layers (1 when 0), the first one's index in the whole stack (the
     * parameters' names), and dropout between them. Its one parameter "weight" is
     * (1, N): the layers' parameters laid out as ferry_lstm_init_from lays them out
     * in a block of their own (ferry_remote_lstm_numel); init_weight, if given, is
     * that block, and the generator otherwise draws the block's elements in order. A
     * Stiefel constraint applies to every layer's weight_hh. */
    int layers, first_layer;
    float dropout;
    /* decoder: the last local_rows rows of the vocabulary are this process's own slice,
     * computed here (ferry_remote_decoder_set_local) while the servers compute theirs:
     * the shards split rows [0, V - local_rows) only. Sharded softmax only (the xent
     * calls); 0: every row on the servers. */
    int64_t local_rows;
    /* Room to grow (ferry_remote_config_default zeroes it): a later release of the same soname
     * takes new fields from it, each meaning its default at zero, so a caller built against this
     * header keeps its behaviour and the struct its size. */
    unsigned char reserved[64];
} ferry_remote_config;

/* Zeroes *cfg (no constraint) and sets kind, name, dims, bias 1, server -1,
 * init_scale 0.1, offsets -1 and SGD's defaults. */
FERRY_API void ferry_remote_config_default(ferry_remote_config *cfg, ferry_remote_kind kind,
                                           const char *name, int64_t dim0, int64_t dim1);

/* Creates the module on its servers concurrently (CreateModule, idempotent by
 * name). Shard s of k (k = cluster size) owns global rows [s*R/k, (s+1)*R/k) of
 * R = V (R = V - local_rows for a decoder with a local slice). If a server already hosts the name
 * with the same configuration it is reused as is: its current parameters and optimizer state are
 * kept and initial values are not sent again (see ferry_remote_created). Errors: FERRY_ERR_INVALID
 * for a bad config (or V smaller than the cluster), FERRY_ERR_EXISTS when a server has the name
 * with another configuration (the message names the differing field), call errors; shards created
 * on other servers before the failure stay there. */
FERRY_API ferry_status ferry_remote_create(ferry_cluster *c, const ferry_remote_config *cfg,
                                           ferry_remote **out);
/* A handle on a module that exists on the servers already, by name: its configuration
 * (kind, sizes, initial-value generator, optimizer, constraint, lstm layers) is read
 * from the servers (ListModules) and checked to be placed as ferry_remote_create
 * places it, then the module is found as ferry_remote_create finds it. *cfg (may be
 * NULL) receives the configuration; its name points into the handle. Errors:
 * FERRY_ERR_NOT_FOUND when a server lacks it (another identity's module is not seen),
 * FERRY_ERR_INVALID when its shards are not where this client would put them (another
 * number of servers) or a decoder keeps a local slice, call errors. */
FERRY_API ferry_status ferry_remote_attach(ferry_cluster *c, const char *name,
                                           ferry_remote_config *cfg, ferry_remote **out);
/* Frees the handle; the module stays on its servers. NULL is a no-op. */
FERRY_API void ferry_remote_destroy(ferry_remote *m);
/* Places a row-sharded module's shards again over its cluster's servers as they are
 * now (after ferry_cluster_retarget): shard s of n holds rows [s*R/n, (s+1)*R/n).
 * The servers must hold those rows already (an elastic job's move puts them there).
 * FERRY_ERR_UNSUPPORTED for a module that lives on one server. */
FERRY_API ferry_status ferry_remote_replace(ferry_remote *m);

/* A decoder's local slice (config local_rows > 0): its weight (local_rows, H) and
 * bias (local_rows), global rows [V - local_rows, V), and the accumulators that every
 * xent Backward adds their gradient to (same shapes), all in be's memory, which must
 * be host-addressable; they stay the caller's, who reads and zeroes the accumulators
 * around its steps. Each xent Forward computes the slice's logits and partials on the
 * calling thread while the servers compute theirs, and each Backward the slice's
 * gradient and its share of dh, so the caller's cores take a part of the decoder.
 * The accumulators may be NULL (forward only) and set again (e.g. every step, to a
 * context's gradients); a Backward needs them. ferry_remote_get_params/set_params
 * reach the slice's rows too. Set it before the first call; FERRY_ERR_INVALID for a
 * module without local rows. */
FERRY_API ferry_status ferry_remote_decoder_set_local(ferry_remote *dec, ferry_backend *be,
                                                      const float *weight, const float *bias,
                                                      float *grad_weight, float *grad_bias);

/* Marks the module's Forward and Backward calls from now on (on 1; off 0) as ones
 * whose caller waits idle for the reply: a pipeline's last micro-batch, whose decoder
 * calls nothing else overlaps. A server with an idle worker then runs the call's GEMMs
 * on two threads (ferry_cpu_set_gemm_width); the reply is the same bit for bit. A hint
 * only: any thread may set it, and it applies to the calls sent after. */
FERRY_API void ferry_remote_set_wide(ferry_remote *m, int on);

/* How many of the module's shards this create made new (the rest existed). */
FERRY_API int ferry_remote_created(const ferry_remote *m);
FERRY_API int ferry_remote_shards(const ferry_remote *m);
/* The module's name on the servers. */
FERRY_API const char *ferry_remote_name(const ferry_remote *m);
/* Shard i's global rows and its server index. */
FERRY_API void ferry_remote_shard(const ferry_remote *m, int shard, int64_t *row_begin,
                                  int64_t *row_count, int *server);

/* Reads (get) or overwrites (set) global rows [row_begin, row_begin + row_count) of
 * parameter "weight" or "bias" across shards, concurrently. Rows are dim 0 of the
 * parameter (V for embedding and decoder, D for linear); row_count 0 means every
 * row from row_begin on. buf holds row_count rows in global layout: (rows, E|H|C) for the weight,
 * (rows) for the bias. set bumps each touched shard's version. Errors:
 * FERRY_ERR_RANGE for rows outside [0, R), FERRY_ERR_NOT_FOUND for an unknown
 * parameter, FERRY_ERR_NUMERIC for a non-finite value (set), call errors. */
FERRY_API ferry_status ferry_remote_get_params(ferry_remote *m, const char *param,
                                               int64_t row_begin, int64_t row_count, float *out);
FERRY_API ferry_status ferry_remote_set_params(ferry_remote *m, const char *param,
                                               int64_t row_begin, int64_t row_count,
                                               const float *src);

/* ---- Distributed-autograd contexts -------------------------------------------- */

typedef struct ferry_dist_ctx ferry_dist_ctx;

FERRY_API ferry_status ferry_dist_ctx_create(ferry_cluster *c, ferry_dist_ctx **out);
/* Releases a context still open (best effort) and frees the object. NULL: no-op. */
FERRY_API void ferry_dist_ctx_destroy(ferry_dist_ctx *dc);

/* Opens a new context and returns its id: worker_id << 48 | a per-process counter.
 * A previous context that was neither stepped nor released is released first
 * (best effort: a failure is logged, and the servers' TTL sweep frees it anyway). */
FERRY_API uint64_t ferry_dist_ctx_begin(ferry_dist_ctx *dc);
/* The open context's id, or 0 when none is open. */
FERRY_API uint64_t ferry_dist_ctx_id(const ferry_dist_ctx *dc);

/* Sum of squares of every gradient the servers hold for this context (GradNorm on
 * every server the context touched, concurrently). FERRY_ERR_INVALID when no context
 * is open; call errors (FERRY_ERR_NOT_FOUND if a server swept the context). */
FERRY_API ferry_status ferry_dist_ctx_grad_sumsq(ferry_dist_ctx *dc, double *sumsq);

/* Steps every module the context touched, on every server concurrently: gradients
 * times grad_scale (the clipping coefficient; 1 for none), learning rate lr (0: the
 * module's current rate; > 0 sets it, for schedules). The servers free the context;
 * so does this object, whatever the outcome. FERRY_ERR_INVALID (the context is
 * released instead) for grad_scale <= 0 or a negative lr; FERRY_ERR_INVALID when no
 * context is open; call errors. */
FERRY_API ferry_status ferry_dist_ctx_step(ferry_dist_ctx *dc, float grad_scale, double lr);

/* The distributed step with global clipping: GradNorm on every touched server, plus
 * local_sumsq (the caller's own gradients), gives the global norm; the clipping
 * coefficient is min(1, max_norm / (norm + 1e-6)) exactly as ferry_clip_coef (and
 * torch.nn.utils.clip_grad_norm_) computes it, max_norm <= 0 meaning no clipping
 * (coefficient 1). Then Step with it. *coef and *norm (either may be NULL) receive
 * the coefficient, for the caller's local step, and the global norm. A non-finite
 * norm gives FERRY_ERR_NUMERIC and releases the context without stepping. */
FERRY_API ferry_status ferry_dist_ctx_clip_step(ferry_dist_ctx *dc, double local_sumsq,
                                                float max_norm, double lr, float *coef,
                                                double *norm);

/* ferry_dist_ctx_clip_step in two halves, so that the caller's own optimizer step
 * runs while the servers step:
 *
 *     ferry_dist_ctx_step_start(dc, local_sumsq, clip, lr, &coef, &norm);  // GradNorm; Step sent
 *     ferry_optim_step(opt, &P, G, coef);                                  // local, meanwhile
 *     ferry_dist_ctx_step_wait(dc);                                        // the Step replies
 *
 * start computes the global norm and coefficient exactly as ferry_dist_ctx_clip_step,
 * sends Step to every touched server from a thread of its own, and returns. Its errors
 * are clip_step's (GradNorm failures; a non-finite norm releases the context): then no
 * Step was sent and wait must not be called; and FERRY_ERR_BUSY when a started Step
 * was not waited for yet. wait returns the Step's status (its detail naming the peer)
 * and is called once after each successful start. Meanwhile calls with dc get
 * FERRY_ERR_BUSY, and begin, release, step and grad_sumsq wait for the Step first
 * (logging a failure nobody asked for); the cluster must outlive it. */
FERRY_API ferry_status ferry_dist_ctx_step_start(ferry_dist_ctx *dc, double local_sumsq,
                                                 float max_norm, double lr, float *coef,
                                                 double *norm);
FERRY_API ferry_status ferry_dist_ctx_step_wait(ferry_dist_ctx *dc);

/* Drops the context on every touched server without stepping (evaluation, an
 * abandoned step). Servers that no longer know it are fine. */
FERRY_API ferry_status ferry_dist_ctx_release(ferry_dist_ctx *dc);

/* One value a server reported with a Step. */
typedef struct ferry_dist_metric {
    const char *name; /* "version/<module>" (parameter version after the step), and for a
                         constrained module "penalty/<module>" (beta ||W^T W - I||_F^2)
                         and "feasibility/<module>" (||W^T W - I||_F), both of the W the
                         step started from */
    double value;
} ferry_dist_metric;

/* The metrics every server returned with this object's last Step (ferry_dist_ctx_step,
 * ferry_dist_ctx_clip_step, or a split step once waited for), in server order; *out points into dc
 * and stays valid until dc's next Step or ferry_dist_ctx_destroy (ferry_dist_ctx_begin keeps it).
 * Returns their count: 0 before any Step, and after a Step that failed or was not
 * sent. */
FERRY_API int ferry_dist_ctx_metrics(const ferry_dist_ctx *dc, const ferry_dist_metric **out);
/* *value = the metric `name` of the last Step. FERRY_ERR_NOT_FOUND (with a message)
 * when that Step reported none of that name. */
FERRY_API ferry_status ferry_dist_ctx_metric(const ferry_dist_ctx *dc, const char *name,
                                             double *value);

/* ---- Calls -------------------------------------------------------------------- *
 * dc is the open context, or NULL for evaluation (nothing is saved and there is no
 * Backward). Each Forward inside a context returns a call id for its Backward; a
 * Forward has exactly one Backward. Buffers are host memory, row-major float32. */

/* Embedding rows of n global ids (ids in [0, V), else FERRY_ERR_RANGE): out (n, E).
 * Only the distinct ids cross the wire, each to the shard that owns it; inside a
 * context every shard is called (so that every shard steps), outside only those
 * owning some id. */
FERRY_API ferry_status ferry_remote_embedding_forward(ferry_remote *m, ferry_dist_ctx *dc,
                                                      const int32_t *ids, int64_t n, float *out,
                                                      uint64_t *call_id);
/* grad (n, E): the gradient of out. Summed per distinct id here (in the order of
 * ids, as a local embedding's backward sums) and sent to the owning shards, which
 * keep a row-sparse gradient in the context. */
FERRY_API ferry_status ferry_remote_embedding_backward(ferry_remote *m, ferry_dist_ctx *dc,
                                                       uint64_t call_id, const float *grad);

/* Softmax cross-entropy of the decoder's logits h W^T + b against targets, without
 * the (N, V) logits crossing the wire: every shard returns per-row partials of its
 * slice and they are combined here in double. hidden (N, H), targets (N) in [0, V).
 * loss_rows (N, may be NULL) receives -log softmax(target) per row; *loss_sum (may
 * be NULL) their sum in double. */
FERRY_API ferry_status ferry_remote_xent_forward(ferry_remote *dec, ferry_dist_ctx *dc,
                                                 const float *hidden, const int32_t *targets,
                                                 int64_t N, float *loss_rows, double *loss_sum,
                                                 uint64_t *call_id);
/* The gradient of L = sum_n scale * row_scale[n] * loss_rows[n] (row_scale NULL: all
 * 1) with respect to hidden: dh (N, H), summed over the shards; the shards keep dW,
 * db of their slices in the context. scale = 1/N gives the mean loss. */
FERRY_API ferry_status ferry_remote_xent_backward(ferry_remote *dec, ferry_dist_ctx *dc,
                                                  uint64_t call_id, const float *row_scale,
                                                  float scale, float *dh);

/* The classic decoder: logits (N, V) = hidden W^T + b gathered from the shards. */
FERRY_API ferry_status ferry_remote_logits_forward(ferry_remote *dec, ferry_dist_ctx *dc,
                                                   const float *hidden, int64_t N, float *logits,
                                                   uint64_t *call_id);
/* dlogits (N, V) -> dh (N, H). */
FERRY_API ferry_status ferry_remote_logits_backward(ferry_remote *dec, ferry_dist_ctx *dc,
                                                    uint64_t call_id, const float *dlogits,
                                                    float *dh);

/* Dense: pull copies the module's current rows, out (R, C) in global layout; inside a
 * context it is a Forward whose Backward, push, hands the servers the gradient of
 * those rows, grad (R, C), which Step then applies with the module's (dense)
 * optimizer, as ps-lite's pull and push. A data-parallel trainer pulls its dense
 * weights at the start of every step and pushes their gradient before the step. */
FERRY_API ferry_status ferry_remote_dense_pull(ferry_remote *m, ferry_dist_ctx *dc, float *out,
                                               uint64_t *call_id);
FERRY_API ferry_status ferry_remote_dense_push(ferry_remote *m, ferry_dist_ctx *dc,
                                               uint64_t call_id, const float *grad);

/* Linear: x (N, C) -> y (N, D); dy (N, D) -> dx (N, C). */
FERRY_API ferry_status ferry_remote_linear_forward(ferry_remote *m, ferry_dist_ctx *dc,
                                                   const float *x, int64_t N, float *y,
                                                   uint64_t *call_id);
FERRY_API ferry_status ferry_remote_linear_backward(ferry_remote *m, ferry_dist_ctx *dc,
                                                    uint64_t call_id, const float *dy, float *dx);

/* LSTM group (FERRY_REMOTE_LSTM): x (T, B, C) -> y (T, B, H), hn, cn (K, B, H).
 * h0, c0 (K, B, H) start the layers when given (both or neither); otherwise they start
 * from the carried state of `stream` (zeros with reset), and with carry the final
 * state becomes the stream's for its next call. The dropout between the group's
 * layers draws from (seed, rng_offset) in a window of window_T steps of which this
 * call is steps [t0, t0 + T) (window_T 0: the call is the window), as
 * ferry_ctx_set_window, so the masks are those the caller's own stack would draw. */
typedef struct ferry_remote_lstm_args {
    uint64_t stream;
    int reset, carry;
    uint64_t seed, rng_offset;
    int64_t window_T, t0;
} ferry_remote_lstm_args;

FERRY_API ferry_status ferry_remote_lstm_forward(ferry_remote *m, ferry_dist_ctx *dc,
                                                 const ferry_remote_lstm_args *a, const float *x,
                                                 int64_t T, int64_t B, const float *h0,
                                                 const float *c0, float *y, float *hn, float *cn,
                                                 uint64_t *call_id);
/* dy (T, B, H), dhn and dcn (K, B, H) or NULL -> dx (T, B, C); dh0, dc0 (K, B, H) when
 * the Forward sent h0 and c0 (else untouched; may be NULL). */
FERRY_API ferry_status ferry_remote_lstm_backward(ferry_remote *m, ferry_dist_ctx *dc,
                                                  uint64_t call_id, const float *dy,
                                                  const float *dhn, const float *dcn, float *dx,
                                                  float *dh0, float *dc0);
/* The floats of an lstm module's packed parameter block, the layout of
 * ferry_lstm_init_from(..., "lstm", C, H, layers, ..., first_layer) in a block alone. */
FERRY_API int64_t ferry_remote_lstm_numel(int64_t C, int64_t H, int layers);

/* ---- Jobs: many trainers, one model -------------------------------------------
 * N processes (ranks 0..N-1) train one model on the same servers. Each joins the
 * job on every server (the servers hold the membership and compare what every rank
 * says about the model); rank 0 creates the modules and says ready, the others wait
 * for it. A context tied to a job step (ferry_dist_ctx_set_job) carries (job, rank,
 * step) with its GradNorm and Step, and the servers apply the job's consistency:
 *
 *   FERRY_SYNC_BSP    GradNorm waits for every rank's context of the step and
 *                     returns the norm of the summed gradient (and the job's loss);
 *                     the step's first Step applies the sum once, every rank then
 *                     pulls identical weights. Scale each rank's loss by the global
 *                     batch (1/B, not 1/(B/N)) and the sum is the global gradient.
 *   FERRY_SYNC_SSP    each rank's gradient is applied at once; a rank's Step returns
 *                     only when it is at most `staleness` steps ahead of the slowest.
 *   FERRY_SYNC_ASYNC  each rank's gradient is applied at once.
 *
 * A wait longer than sync_timeout_ms fails with FERRY_ERR_TIMEOUT naming the
 * missing rank, on every waiting rank; the job is then failed on that server. */

typedef enum ferry_sync_mode {
    FERRY_SYNC_BSP = 0,
    FERRY_SYNC_SSP = 1,
    FERRY_SYNC_ASYNC = 2,
} ferry_sync_mode;

typedef struct ferry_job_config {
    const char *name;    /* 1..63 bytes of [A-Za-z0-9_.:/-] */
    int world, rank;     /* N >= 1 and 0 <= rank < N */
    ferry_sync_mode sync;
    int staleness;       /* ssp's K >= 0 */
    int sync_timeout_ms; /* how long a barrier may wait; 0: 60000 */
    const char *model;   /* "key=value key=value": the model as this rank builds it; the
                            servers refuse a rank whose values differ from the job's,
                            naming the key */
    /* > 0: an elastic job (bsp; ferry_job_join_elastic): world is the most members it
     * may have and elastic_min the fewest it runs with; the rank is picked at join. */
    int elastic_min;
    /* Room to grow (zero it: = {...}): a later release of the same soname takes new fields
     * from it, each meaning its default at zero, so a caller built against this
     * header keeps its behaviour and the struct its size. */
    unsigned char reserved[60];
} ferry_job_config;

typedef struct ferry_job ferry_job;

/* Parses "bsp", "ssp:K" or "async" into *mode and *staleness. FERRY_ERR_INVALID. */
FERRY_API ferry_status ferry_sync_parse(const char *text, ferry_sync_mode *mode, int *staleness);

/* Joins the job on every server of c: the first join makes it (the job then belongs to
 * this client's identity), and this client's session holds the rank. Errors (one
 * line, naming the server and what differs): FERRY_ERR_INVALID for a bad config, a
 * finished job; FERRY_ERR_EXISTS for a job with another world, sync mode or model, or a
 * rank another live session holds; FERRY_ERR_DENIED for another identity's job;
 * FERRY_ERR_TIMEOUT for a failed job; call errors. */
FERRY_API ferry_status ferry_job_join(ferry_cluster *c, const ferry_job_config *cfg,
                                      ferry_job **out);
/* A handle without joining (a restarted rank recovers instead of joining). */
FERRY_API ferry_status ferry_job_create(ferry_cluster *c, const ferry_job_config *cfg,
                                        ferry_job **out);
/* Joins again with a handle of ferry_job_create: the rank is taken over from a session
 * that is gone (a restarted rank that needs no roll-back). Errors as ferry_job_join. */
FERRY_API ferry_status ferry_job_rejoin(ferry_job *job);
/* The last step of this rank's run (0, the default: not said), sent with its recover:
 * in a roll-back, ranks that left after completing a run that ends there count as
 * present, offering that step, so that a rank restarted after the end rolls back alone. */
FERRY_API void ferry_job_set_last_step(ferry_job *job, uint64_t step);

/* Recovery. ferry_job_probe asks one server which complete checkpoints of the job it
 * holds ("<job>-step<N>.ckpt" in its --checkpoint-dir, verified) and where its copy
 * of the job stands. ferry_job_recover is a barrier of all ranks on every server:
 * `offer` lists the steps this rank can resume from (its own checkpoints that every
 * server holds); when every rank has called it, each server restores the newest step
 * all ranks offered and resets the job to it, and *resume_step receives that step.
 * Its first caller makes the others' waiting GradNorm/Step fail with FERRY_ERR_BUSY,
 * so every rank still running comes to recover too. Errors: FERRY_ERR_NOT_FOUND (no
 * common step, naming what each side holds), FERRY_ERR_TIMEOUT (a rank did not come
 * within the sync timeout, naming it), call errors (retry while the time allows). */
typedef struct ferry_job_probe_result {
    uint64_t *steps; /* ascending */
    size_t n;
    int has_state;       /* the server holds the job's parameters (else: fresh) */
    uint64_t state_step; /* at this step */
    int rolling_back;    /* a recover barrier is open there */
    int finished;        /* every rank has left the job there */
    uint64_t completed_step; /* the highest step at which a rank left, its run completed */
    int can_checkpoint;      /* the server writes checkpoints (it has a --checkpoint-dir) */
} ferry_job_probe_result;
FERRY_API ferry_status ferry_job_probe(ferry_job *job, int server, ferry_job_probe_result *out);
FERRY_API void ferry_job_probe_free(ferry_job_probe_result *p);
FERRY_API ferry_status ferry_job_recover(ferry_job *job, const uint64_t *offer, size_t n,
                                         int deadline_ms, uint64_t *resume_step);

/* Rank 0: the modules exist and hold their initial values. */
FERRY_API ferry_status ferry_job_ready(ferry_job *job);
/* Other ranks: waits (polling the job's status) until rank 0 said ready on every
 * server, at most the sync timeout: FERRY_ERR_TIMEOUT then. A server's error ends the
 * wait at once, and so does a failure in transit unless the cluster has a retry window
 * (ferry_cluster_set_retry); with one, the polls go on, each (its retries included)
 * within what is left of the sync timeout. A session re-established on the way (a
 * restarted server) may add one Hello's deadline. */
FERRY_API ferry_status ferry_job_wait_ready(ferry_job *job);
/* This rank is done: its run completed (bsp ranks still waiting for it fail at once). */
FERRY_API ferry_status ferry_job_leave(ferry_job *job);
/* This rank leaves after step `step` (0: as the servers counted): `reason` NULL or ""
 * when its run completed, else why it stops early (at most 255 bytes). The ranks
 * waiting for it, and any roll-back that needs it, fail at once with
 * FERRY_ERR_ABORTED naming it and the reason. */
FERRY_API ferry_status ferry_job_leave_after(ferry_job *job, uint64_t step, const char *reason);
/* Frees the handle (no Leave). NULL is a no-op. */
FERRY_API void ferry_job_destroy(ferry_job *job);
FERRY_API const ferry_job_config *ferry_job_get_config(const ferry_job *job);
/* The fewest steps any rank of the job has done (the smallest the servers report). */
FERRY_API ferry_status ferry_job_min_step(ferry_job *job, uint64_t *min_step);
/* Writes the job's checkpoint of job step `step` on every server
 * ("<job>-step<N>.ckpt" in each --checkpoint-dir: the modules of the job's owner). A
 * server restarted since the step refuses (FERRY_ERR_NOT_FOUND); sent again after a
 * failure in transit within the cluster's retry window. Errors: FERRY_ERR_UNSUPPORTED
 * (a server without --checkpoint-dir), FERRY_ERR_BUSY (--checkpoint-rate),
 * FERRY_ERR_RESOURCE (no room), FERRY_ERR_IO, call errors. */
FERRY_API ferry_status ferry_job_checkpoint(ferry_job *job, uint64_t step);

/* Ties the open context to step `step` (1, 2, ...) of job: its GradNorm and Step
 * carry (job, rank, step) and this rank's loss_sum and tokens of the step, and wait
 * as the job's mode says (their deadline grows by the sync timeout). job NULL unties
 * it. After the GradNorm (ferry_dist_ctx_grad_sumsq, clip_step or step_start),
 * ferry_dist_ctx_job_loss gives the loss the servers returned: bsp, the sum over
 * every rank of the step; else this rank's own. */
FERRY_API ferry_status ferry_dist_ctx_set_job(ferry_dist_ctx *dc, ferry_job *job, uint64_t step,
                                              double loss_sum, double tokens);
FERRY_API void ferry_dist_ctx_job_loss(const ferry_dist_ctx *dc, double *loss_sum, double *tokens);
/* Asks for a job-wide checkpoint: the request goes with this rank's next GradNorm,
 * and under bsp the answer of that step tells every rank (thread-safe; for a signal
 * handler's flag to pass on). */
FERRY_API void ferry_job_request_checkpoint(ferry_job *job);
/* After the GradNorm of a job step: 1 when a rank asked for a checkpoint in it (bsp:
 * any rank, the same answer on every rank; else this rank's own request), so that
 * every rank checkpoints after this same step. */
FERRY_API int ferry_dist_ctx_job_checkpoint(const ferry_dist_ctx *dc);
/* Re-admitting dropped replicas (ferry_cluster_config.replicas, bsp): rank 0, before a
 * step after which the job checkpoints, calls ferry_job_offer_readmit: each dropped
 * replica that answers a Hello within probe_ms is offered, in this rank's next
 * GradNorm (a bit per server of the --ps list, p < 64); *mask (may be NULL) receives
 * the offer. After that GradNorm, ferry_dist_ctx_job_readmit gives every rank the
 * same offer, and after the job's checkpoint of that step every rank calls
 * ferry_job_readmit with it: rank 0 copies the shard's checkpoint of `step` from a
 * live replica to each offered one (JobFetch, JobInstall: verified there), then
 * every rank takes its rank back on it through a recover barrier that restores that
 * checkpoint, and calls it again from the next step on. *readmitted (may be NULL):
 * how many came back; *bytes (may be NULL): the bytes copied (rank 0). A replica
 * that fails any of this stays out (logged); the job goes on. */
FERRY_API ferry_status ferry_job_offer_readmit(ferry_job *job, int probe_ms, uint64_t *mask);
FERRY_API uint64_t ferry_dist_ctx_job_readmit(const ferry_dist_ctx *dc);
FERRY_API ferry_status ferry_job_readmit(ferry_job *job, uint64_t mask, uint64_t step,
                                         int *readmitted, uint64_t *bytes);
/* ---- Elastic jobs (docs/architecture.md §11b) -------------------------------------
 * Members come and go between steps, without a roll-back. The first server of the
 * cluster (the coordinator) keeps the membership: an epoch, its members (ranks,
 * ascending) and the first step it runs. Member i of n takes columns [i*B/n,
 * (i+1)*B/n) of the fixed global batch B, and before each step's GradNorm puts each
 * column's carried state at the end of the step there (ferry_job_put_state), so that
 * whoever holds the columns next starts from it; the GradNorm and Step of a step carry
 * the membership it ran under. An elastic ssp or async job has no common step: each
 * rank keeps its own columns (the per-rank policy) and their state, is admitted at
 * once at the members' least step (first_step - 1 steps taken), and a rank that leaves
 * or goes away stops counting for the staleness bound at once. */
typedef struct ferry_job_membership {
    uint64_t epoch;      /* 0: none yet */
    uint64_t first_step; /* the first step it runs */
    uint32_t *members;   /* ascending ranks (malloc'd) */
    size_t n;
    int index;      /* this rank's place among them; -1: not a member */
    int col0, col1; /* its columns [col0, col1) of the global batch */
    /* The carried state of those columns at the end of step first_step - 1, column
     * after column, col_bytes each; NULL when this rank keeps its own (its columns did
     * not change) or first_step is 1. */
    unsigned char *state;
    size_t col_bytes;
    unsigned char *progress; /* what the members put with it (NULL: nothing) */
    size_t progress_len;
} ferry_job_membership;

/* Joins elastic job cfg->name (cfg->elastic_min > 0, cfg->world its most members,
 * any sync mode): takes the lowest free rank on the coordinator, then the same rank on every
 * other server. The taker of rank 0 while the job is not ready yet makes the job's
 * modules and says ready (ferry_job_makes_modules); a later taker of rank 0 does not.
 * `batch`: the global batch in columns (at least world). Errors as ferry_job_join;
 * FERRY_ERR_EXISTS when every rank is held. */
FERRY_API ferry_status ferry_job_join_elastic(ferry_cluster *c, const ferry_job_config *cfg,
                                              int batch, ferry_job **out);
/* Asks to become a member and waits (at most the sync timeout) until admitted: before
 * the job's first step once elastic_min ranks ask, else at the next step boundary,
 * and then until every server applied the step before it (so that this rank's first
 * pull sees it). ssp and async: at once (once elastic_min ranks ask), at the least step
 * of the members; set the per-rank policy first (ferry_job_set_rank_columns). *m receives the
 * membership (free it with ferry_job_membership_free); the job's GradNorms and Steps carry it from
 * now on. */
FERRY_API ferry_status ferry_job_admit(ferry_job *job, ferry_job_membership *m);
/* Before the GradNorm of step `step`: this rank's columns' carried state at its end
 * (col1 - col0 columns of col_bytes each, at most 1 MiB each), the progress the
 * members share (at most 4096 bytes; NULL: none) and whether it leaves after the
 * step. FERRY_ERR_ABORTED: the membership changed (ferry_job_redo). ssp and async:
 * state NULL and the progress alone (the latest a member put is what a rank admitted
 * later receives). */
FERRY_API ferry_status ferry_job_put_state(ferry_job *job, uint64_t step, const void *state,
                                           size_t col_bytes, const void *progress,
                                           size_t progress_len, int leaving);
/* After step `step` was applied: the membership of step step + 1 into *m (its state
 * when this rank's columns changed). */
FERRY_API ferry_status ferry_job_sync_membership(ferry_job *job, uint64_t step,
                                                 ferry_job_membership *m);
/* Step `step` failed for want of a member (its GradNorm or Step failed with
 * FERRY_ERR_ABORTED or FERRY_ERR_UNAVAILABLE): asks the coordinator to drop the members
 * that are gone, polling until it has (at most `wait_ms`): *m receives the membership
 * that redoes the step, with this rank's columns' state of step step - 1.
 * FERRY_ERR_TIMEOUT: nobody was dropped (the failure was something else). */
FERRY_API ferry_status ferry_job_redo(ferry_job *job, uint64_t step, int wait_ms,
                                      ferry_job_membership *m);
/* 1 when this rank makes the job's modules and says ready: rank 0, or for an elastic
 * job the rank that took rank 0 before the job was ready. */
FERRY_API int ferry_job_makes_modules(const ferry_job *job);
/* The coordinator's membership of the job now (epoch 0: not elastic, or not
 * started), as ferry-ctl job shows it; *m as above, without state. The job's own
 * membership (what its calls carry) is left as it was. */
FERRY_API ferry_status ferry_job_members(ferry_job *job, ferry_job_membership *m);
/* The per-rank batch policy of an elastic job (before ferry_job_admit; 0: the default,
 * the global batch split over the members): rank r takes columns [r*columns,
 * (r+1)*columns) of the global batch whatever the membership (columns * world must be
 * the batch given at join); a column whose rank was away takes no state from the
 * coordinator (its carried state starts from zero). With the loss scaled by the whole
 * batch, the step is then the mean gradient over the members' columns times
 * members/world: the learning rate scales linearly with the members. */
FERRY_API ferry_status ferry_job_set_rank_columns(ferry_job *job, int columns);
/* Where an elastic job's servers stand as the coordinator's last answer to this rank
 * said (admit, sync, redo, ferry_job_members): *epoch counts the moves committed (ferry-ctl
 * resize), *list is the --ps list to use ("" until a move: the one the trainers started with; valid
 * until the next call on job), and the result is 1 while a move holds the members at
 * step *step's boundary (the list is then the one moved to). */
FERRY_API int ferry_job_servers(const ferry_job *job, uint64_t *epoch, uint64_t *step,
                                const char **list);
FERRY_API void ferry_job_membership_free(ferry_job_membership *m);

/* Forgets the open context without telling the servers (they sweep it after their
 * --context-ttl): after a peer failed, no cleanup call waits on a dead server. */
FERRY_API void ferry_dist_ctx_abandon(ferry_dist_ctx *dc);

/* ---- Remote calls on the local autograd tape ---------------------------------
 * Remote modules as nodes of a local autograd tape (docs/architecture.md §3):
 * a remote Forward runs now and records a node whose backward is the Backward RPC
 * with the same (context, call id), so ferry_ctx_backward walks local layers and
 * remote calls alike. This is how ferry-trainer runs embedding -> LSTM -> decoder
 * with the embedding and decoder on ferry-ps:
 *
 *     ferry_ctx_reset(ctx, step);  ferry_dist_ctx_begin(dc);
 *     ferry_dist_embedding_forward(emb, dc, ctx, inputs, &x);        // (T, B) -> (T, B, E)
 *     ferry_lstm_forward(&rnn, ctx, x, h0, c0, NULL, &y, &hn, &cn);  // local
 *     ferry_dist_xent_forward(dec, dc, ctx, y, targets, 1.0f / N, &loss, &sum);
 *     ferry_ctx_backward(ctx, loss);          // Backward RPCs to the decoder, then embedding
 *     ferry_dist_ctx_clip_step(dc, local_sumsq, clip, lr, &coef, &norm);
 *     ferry_optim_step(opt, &P, G, coef);      // the local block with the same coefficient
 *
 * In eval mode (ferry_ctx_set_training(ctx, 0)) the calls carry no context and
 * nothing is recorded or saved; dc may then be NULL. */

/* Embedding lookup: ids is a HOST int32 tensor of any shape with ids in [0, V);
 * *out is (ids shape..., E) on ctx's backend (arena memory of ctx). Training mode
 * needs an open dc. Errors as ferry_remote_embedding_forward; FERRY_ERR_INVALID
 * for a rank above 3 or a training ctx without an open dc. */
FERRY_API ferry_status ferry_dist_embedding_forward(ferry_remote *emb, ferry_dist_ctx *dc,
                                                    ferry_ctx *ctx, const ferry_tensor *ids,
                                                    ferry_tensor **out);

/* Sharded softmax cross-entropy of the remote decoder: hidden (..., H) on ctx's
 * backend; targets a HOST int32 tensor of hidden's leading shape. *loss is a
 * scalar (1) tensor holding scale * the summed per-row loss (like ferry_xent_forward);
 * *loss_sum (may be NULL) the unscaled sum in double. The node's backward sends
 * the loss gradient times scale to the shards and accumulates dh into hidden's
 * gradient when hidden requires one. */
/* An lstm group as a node of ctx's tape: x (T, B, C) -> y (T, B, H), hn, cn (K, B, H),
 * on ctx's backend. h0 and c0 (K, B, H) or NULL as ferry_remote_lstm_forward (flags:
 * FERRY_DIST_LSTM_RESET, FERRY_DIST_LSTM_CARRY for the stream's state); in training
 * mode the dropout between its layers draws from ctx's stream and window (which
 * advance as the same layers' masks would here), and the node's backward returns the
 * gradient of x and, when given, of h0 and c0. */
enum { FERRY_DIST_LSTM_RESET = 1, FERRY_DIST_LSTM_CARRY = 2 };
FERRY_API ferry_status ferry_dist_lstm_forward(ferry_remote *m, ferry_dist_ctx *dc, ferry_ctx *ctx,
                                               uint64_t stream, int flags, const ferry_tensor *x,
                                               const ferry_tensor *h0, const ferry_tensor *c0,
                                               ferry_tensor **y, ferry_tensor **hn,
                                               ferry_tensor **cn);

FERRY_API ferry_status ferry_dist_xent_forward(ferry_remote *dec, ferry_dist_ctx *dc,
                                               ferry_ctx *ctx, const ferry_tensor *hidden,
                                               const ferry_tensor *targets, float scale,
                                               ferry_tensor **loss, double *loss_sum);

/* The classic decoder: logits (..., V) of the remote decoder come back to the trainer
 * (N x V floats on the wire each way); the node's backward sends dlogits and
 * accumulates the returned dh into hidden's gradient. Pair it with a local
 * ferry_xent_forward. */
FERRY_API ferry_status ferry_dist_logits_forward(ferry_remote *dec, ferry_dist_ctx *dc,
                                                 ferry_ctx *ctx, const ferry_tensor *hidden,
                                                 ferry_tensor **logits);

/* ---- Parity with a local model --------------------------------------------------
 * A local model keeps all parameters in one block and draws parameter element i of
 * the block from (seed, i) (ferry_params_init_uniform). To give remote shards the
 * very values the local model would start from, create each module with
 * init_seed = the model's seed, init_scale = its scale, and weight_offset /
 * bias_offset = the block offsets (ferry_param.offset) of the local "encoder.weight",
 * "decoder.weight" and "decoder.bias": shard rows are then drawn from the same
 * indices. Alternatively send the values (init_weight/init_bias, or
 * ferry_remote_set_params after creation). With the same optimizer settings and one
 * Step per local step (every shard is touched in every context, so each shard's
 * step counter advances with the trainer's), parameters stay equal to the local
 * run's up to float summation order. */

#ifdef __cplusplus
}
#endif
#endif /* FERRY_FERRY_H */
