/* dist.h - internals of the remote-module client (include/ferry/ferry.h) shared by
 * cluster.c (servers, Hello, admin calls), remote.c (module creation, parameters),
 * context.c (context ids, GradNorm/Step/Release) and calls.c (Forward/Backward of
 * each module kind). A context remembers, per Forward, what its Backward needs on
 * this side: the distinct-id grouping of an embedding call, the softmax factors of a
 * sharded softmax. */
#ifndef FERRY_DIST_H
#define FERRY_DIST_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ferry/ferry.h"
#include "common/rpc/contract.h"
#include "common/rpc/rpc.h"

#define FERRY_DIST_MAX_SERVERS 256

struct ferry_cluster {
    ferry_cluster_config cfg;
    char client_id[128];
    char identity[FERRY_RPC_IDENTITY_MAX]; /* who the servers take this client for */
    pthread_mutex_t hello_mu;              /* Hello's bookkeeping: incarnation, session */
    int n;                                 /* shards: the servers a caller indexes */
    ferry_rpc_client *_Atomic *clients;    /* (n) each shard's first live replica */
    int R;                                 /* replicas per shard (cfg.replicas, at least 1) */
    ferry_rpc_client **all;                /* (n·R) replica r of shard s at s·R + r */
    unsigned char *live;                   /* (n·R) 0: dropped (hello_mu) */
    uint64_t *incarnation;                 /* (n·R) as of the last Hello; 0 before the first */
    atomic_uint_fast64_t dropped;          /* replicas dropped */
    char last_drop[320];                   /* the latest drop, as logged (hello_mu) */
    atomic_uint_fast64_t next_ctx; /* low 48 bits of the next context id */
    atomic_int retry_ms;           /* ferry_cluster_set_retry */
    atomic_uint_fast64_t retries;  /* calls sent again */
    int tls; /* how the clients connect: 0 plaintext, 1 TLS, 2 TLS with a certificate */
    /* Primary-backup (ferry__dist_set_passive: a bsp job's contexts with R > 1):
     * Forward, Backward, GradNorm and ReleaseContext go to each shard's primary only;
     * a shard's calls inside the open context since its last Step are kept (log, under
     * log_mu) to replay on the next replica when the primary fails. */
    atomic_int passive;
    pthread_mutex_t log_mu;
    struct ferry__dist_replay *log; /* (n) */
    int min_minor;                  /* the lowest contract minor a Hello answered (hello_mu) */
    /* tests (ferry__dist_lose_reply): the next answer of this method from replica
     * lose_p is dropped as if lost in transit, and the loss noticed lose_ms later */
    atomic_int lose_method, lose_p, lose_ms;
    atomic_int wait_ready;          /* ferry_cluster_set_wait_for_ready's, as last set */
    /* bytes moved with servers a retarget left behind (ferry_cluster_bytes) */
    atomic_uint_fast64_t gone_sent, gone_received;
};

/* Turns primary-backup on for c's job contexts (R > 1; see struct ferry_cluster). */
void ferry__dist_set_passive(ferry_cluster *c, int on);
int ferry__dist_passive(ferry_cluster *c);
/* The lowest contract minor version the cluster's servers answered Hello with. */
int ferry__dist_min_minor(ferry_cluster *c);
/* The live replicas of shard g other than its primary. */
int ferry__dist_backups(ferry_cluster *c, int g);
/* Forgets the calls kept for a replay of context ctx (abandoned: no Step or release
 * will end it). */
void ferry__dist_forget_context(ferry_cluster *c, uint64_t ctx);

/* The client's side of a module kind beyond its contract row: the file that holds
 * the kind's calls (calls.c: embedding, dense; decoder.c: decoder, linear; lstm.c)
 * defines ferry__dist_kind_<name> for each row of FERRY_WIRE_KIND_MAP. */
typedef struct ferry__dist_kind {
    ferry_wire_kind wire;
    /* Optional. Checks the config's fields that only this kind reads. */
    ferry_status (*check)(const ferry_remote_config *cfg);
    /* Optional. Sets what only this kind keeps in m (an lstm's layers, dropout and
     * the packed size of its one row) from a checked cfg. */
    ferry_status (*shape)(ferry_remote *m, const ferry_remote_config *cfg);
} ferry__dist_kind;

#define FERRY__DIST_KIND_DECLARE_(id, name, dims, rows, place, bias, stiefel, local_rows)          \
    extern const ferry__dist_kind ferry__dist_kind_##name;
FERRY_WIRE_KIND_MAP(FERRY__DIST_KIND_DECLARE_)
#undef FERRY__DIST_KIND_DECLARE_
/* The client's kinds, indexed by ferry_wire_kind (remote.c). */
extern const ferry__dist_kind *const ferry__dist_kinds[FERRY_WIRE_KIND_COUNT];

typedef struct ferry__dist_shard {
    int server;
    int64_t row_begin, row_count;
} ferry__dist_shard;

struct ferry_remote {
    ferry_cluster *c;
    char name[FERRY_RPC_NAME_MAX];
    ferry_remote_kind kind;
    int64_t dims[2];
    int bias;
    int64_t rows; /* global rows: V (embedding, decoder) or D (linear) */
    int64_t cols; /* weight columns: E, H or C */
    int nshards;
    ferry__dist_shard *shards; /* (nshards), by ascending rows */
    int created;               /* shards this create made new */
    int layers;                /* lstm: K */
    float dropout;             /* lstm: between its layers */
    /* decoder: rows [rows - local_rows, rows) are this process's slice (not on any
     * server): its weight, bias and their gradient accumulators, in local_be's memory
     * (ferry_remote_decoder_set_local). */
    int64_t local_rows;
    ferry_backend *local_be;
    const float *local_w, *local_b;
    float *local_gw, *local_gb;
    /* dense, bf16 wire: the image of the rows each shard keeps too (R, C), and the id of
     * the one held from each shard (0: none); server/dense.c says how they advance. */
    float *image;
    uint64_t *image_id;
    atomic_int wide; /* ferry_remote_set_wide: its calls carry the hint */
};

enum {
    FERRY__DIST_EMBEDDING = 1,
    FERRY__DIST_XENT,
    FERRY__DIST_LOGITS,
    FERRY__DIST_LINEAR,
    FERRY__DIST_DENSE,
    FERRY__DIST_LSTM
};

/* A job this process is a rank of (ferry_job_join). */
struct ferry_job {
    ferry_cluster *c;
    ferry_job_config cfg;
    char name[FERRY_RPC_NAME_MAX];
    char model[1024];
    atomic_int ck_request; /* ferry_job_request_checkpoint, sent with the next GradNorm */
    atomic_uint_fast64_t readmit_request; /* ferry_job_offer_readmit, with the next GradNorm */
    uint64_t last_step;    /* ferry_job_set_last_step */
    /* elastic: the membership this rank's GradNorms and Steps carry, and its columns */
    uint64_t el_epoch;
    uint32_t *el_members;
    size_t el_n;
    int el_col0, el_col1, el_batch;
    int el_creator; /* it took rank 0 of a job not yet ready: it makes the modules */
    int el_rank_cols; /* > 0: the per-rank batch policy (ferry_job_set_rank_columns) */
    /* elastic: the servers as the coordinator last said (ferry_job_servers) */
    uint64_t srv_epoch, srv_step;
    int srv_moving;
    char *srv_list; /* "" or targets joined by ',' */
};

/* One Forward inside a context, awaiting its Backward. */
typedef struct ferry__dist_call {
    uint64_t call_id;
    const ferry_remote *m;
    int op;               /* FERRY__DIST_* */
    int64_t n;            /* ids (embedding) or rows N */
    int64_t nuniq;        /* embedding: distinct ids */
    int64_t *shard_count; /* embedding: (nshards) distinct ids per shard, grouped by shard */
    int32_t *slot;        /* embedding: (n) position of ids[i] in the grouped distinct list */
    float *factor;        /* xent: (k, N) softmax factor per shard and row (the local
                             slice, if any, last) */
    float *loc_h, *loc_e; /* xent with a local slice: its input (N, H) and saved
                             exp(z - max) (N, local_rows) */
    int32_t *loc_t;       /* xent with a local slice: targets in the slice (N), -1 outside */
    int64_t T, B;         /* lstm: the call's steps and columns */
    int explicit_state;   /* lstm: h0 and c0 were sent */
    struct ferry__dist_call *next;
} ferry__dist_call;

struct ferry_dist_ctx {
    ferry_cluster *c;
    uint64_t id; /* 0: no context open */
    uint64_t next_call;
    uint8_t *touched; /* (servers) 1 once a saving Forward went there */
    ferry__dist_call *calls;
    /* Forward/Backward of different modules may run from two threads at once (the
     * pipeline's decoder thread beside the trainer's remote LSTM stages): the call
     * list, the call counter and touched are guarded by this. */
    pthread_mutex_t mu;
    ferry_dist_metric *metrics; /* the last Step's metrics; names live in the same block */
    int nmetrics;
    /* A Step started by ferry_dist_ctx_step_start, awaiting ferry_dist_ctx_step_wait. */
    int step_pending; /* 0 none; 1 on step_thread; 2 done already (no thread) */
    pthread_t step_thread;
    float step_coef;
    double step_lr;
    ferry_status step_st;
    char step_err[512]; /* the step thread's ferry_error_last */
    /* The job step of the open context (ferry_dist_ctx_set_job), and the job's loss
     * of the step as GradNorm returned it. */
    ferry_job *job;
    uint64_t job_step;
    double job_loss, job_tokens;
    double job_loss_out, job_tokens_out;
    int job_ck_out; /* the GradNorm's answer: checkpoint after this step */
    uint64_t job_readmit_out; /* the GradNorm's answer: replicas re-admitted after it */
    /* Primary-backup: the summed gradient of each shard this rank installs on the
     * shard's backups with its Step (GradNormReply.sum; empty: none), and the replica
     * that summed it (it needs no install). (servers) each. */
    ferry_rpc_msg *sums;
    int *sum_src;
};

/* A new call record in dc (call id assigned, linked); NULL when out of memory. */
ferry__dist_call *ferry__dist_call_new(ferry_dist_ctx *dc, const ferry_remote *m, int op);
/* The pending call of m with that id and op, or NULL with FERRY_ERR_NOT_FOUND set. */
ferry__dist_call *ferry__dist_call_find(ferry_dist_ctx *dc, const ferry_remote *m, uint64_t call_id,
                                        int op);
void ferry__dist_call_drop(ferry_dist_ctx *dc, ferry__dist_call *call);
/* Marks server as joined by this context (dc may be NULL: nothing to mark). */
void ferry__dist_touch(ferry_dist_ctx *dc, int server);

/* DeleteModule of `name` on one server (the shard there). */
ferry_status ferry__dist_delete_module_on(ferry_cluster *c, int server, const char *name);
/* Runs n calls of one method concurrently with the cluster's deadline: call i goes
 * to servers[i] with reqs[shared ? 0 : i] and answers into replies[i] (initialized
 * by the caller, who deinitializes them). Returns the first failure's status with
 * its detail naming the peer. With replicas, call i goes to every live replica of
 * shard servers[i] and replies[i] holds the first one's answer (cluster.c). shared
 * FERRY__DIST_PER_REPLICA: reqs has one request per replica, reqs[s·R + r]. */
#define FERRY__DIST_PER_REPLICA 2

/* Replicas one by one (a re-admission, job.c): replica p is server p of the --ps
 * list, of shard p / R. */
int ferry__dist_replica_live(ferry_cluster *c, int p);
/* The replica whose answers count for shard g (its first live one). */
int ferry__dist_replica_primary(ferry_cluster *c, int g);
/* One call to replica p alone, live or not; no retries. */
ferry_status ferry__dist_replica_call(ferry_cluster *c, int p, ferry_rpc_method m,
                                      const ferry_rpc_msg *req, ferry_rpc_msg *reply,
                                      int deadline_ms);
/* Hello to replica p alone: a new session there, its incarnation recorded. */
ferry_status ferry__dist_replica_hello(ferry_cluster *c, int p, int deadline_ms);
/* Replica p is not called any more (logged with why). */
void ferry__dist_replica_drop(ferry_cluster *c, int p, const char *why);
/* Tests, primary-backup: the next answer of `method` that replica p gives is dropped as
 * if lost in transit (the call ran there), and the loss noticed after ms milliseconds;
 * the usual failover follows. method -1 disarms. */
void ferry__dist_lose_reply(ferry_cluster *c, int method, int p, int ms);
/* Replica p is called again from the next call on, first in its shard if it comes
 * first in the list. */
void ferry__dist_replica_readmit(ferry_cluster *c, int p);
ferry_status ferry__dist_fanout(ferry_cluster *c, ferry_rpc_method method, int n,
                                const int *servers, const ferry_rpc_msg *reqs, int shared,
                                ferry_rpc_msg *replies);
/* The same, sending again what failed in transit (within the cluster's retry window)
 * whatever the method: for calls the server answers alike when repeated. */
ferry_status ferry__dist_fanout_retry(ferry_cluster *c, ferry_rpc_method method, int n,
                                      const int *servers, const ferry_rpc_msg *reqs, int shared,
                                      ferry_rpc_msg *replies);
/* ferry__dist_fanout_retry with its own deadline, and sending again only within
 * window_ms when that is > 0 and shorter than the cluster's retry window. */
ferry_status ferry__dist_fanout_retry_deadline(ferry_cluster *c, ferry_rpc_method method, int n,
                                               const int *servers, const ferry_rpc_msg *reqs,
                                               int shared, ferry_rpc_msg *replies, int deadline_ms,
                                               int window_ms);
/* The same with its own deadline (calls that may wait in a job barrier). */
ferry_status ferry__dist_fanout_deadline(ferry_cluster *c, ferry_rpc_method method, int n,
                                         const int *servers, const ferry_rpc_msg *reqs, int shared,
                                         ferry_rpc_msg *replies, int deadline_ms);
/* The same, running during(arg) on this thread while the first attempt's calls are in
 * flight (the caller's share of the work: a decoder's local slice). during runs once,
 * also when n is 0; deadline_ms <= 0 is the cluster's. */
ferry_status ferry__dist_fanout_during(ferry_cluster *c, ferry_rpc_method method, int n,
                                       const int *servers, const ferry_rpc_msg *reqs, int shared,
                                       ferry_rpc_msg *replies, int deadline_ms,
                                       void (*during)(void *arg), void *arg);

/* ListModules of one server (prefix NULL: all) into reply (initialized by the caller,
 * who deinitializes it). */
ferry_status ferry__dist_list_modules(ferry_cluster *c, int server, const char *prefix,
                                      ferry_rpc_msg *reply);

/* The reply tensor `name` of a call to server, checked to have the dtype and the
 * shape want (entries < 0 match anything); FERRY_ERR_FORMAT naming the peer. */
ferry_status ferry__dist_output_as(ferry_cluster *c, int server, const ferry_rpc_msg *reply,
                                   const char *name, int dtype, int ndim, const int64_t *want,
                                   const ferry_rpc_tensor **out);
/* The same for the reply tensor of contract entry id (common/rpc/contract.h). */
ferry_status ferry__dist_output(ferry_cluster *c, int server, const ferry_rpc_msg *reply,
                                ferry_wire_tensor_id id, const int64_t *want,
                                const ferry_rpc_tensor **out);

/* FERRY_ERR_INVALID unless m is of kind and dc is an open context (or NULL where
 * need_ctx is 0); what names the operation in the message. */
ferry_status ferry__dist_check(const ferry_remote *m, ferry_remote_kind kind, const char *what,
                               const ferry_dist_ctx *dc, int need_ctx);
/* The cluster's wire dtype (ferry_cluster_config.wire_bf16) on req, and the
 * reply_dtype (ferry.v1.DType) its Forward or Backward header asks for. */
int ferry__dist_reply_dtype(const ferry_cluster *c, ferry_rpc_msg *req);
/* Request headers of Forward and Backward in a mode of the contract (scale:
 * fparams[0], or none for NULL). */
ferry_status ferry__dist_forward_head(ferry_rpc_msg *req, const ferry_remote *m, uint64_t ctx,
                                      uint64_t call_id, ferry_wire_mode mode);
ferry_status ferry__dist_backward_head(ferry_rpc_msg *req, const ferry__dist_call *call,
                                       uint64_t ctx, ferry_wire_mode mode, double *scale);

/* Tape nodes (tape.c, lstm.c): FERRY_ERR_INVALID when a training ctx records m without
 * an open dc, or when the node's context (ctx_id) is no longer dc's at backward. */
ferry_status ferry__dist_check_open(const ferry_remote *m, ferry_dist_ctx *dc, ferry_ctx *ctx);
ferry_status ferry__dist_check_same(const ferry_remote *m, ferry_dist_ctx *dc, uint64_t ctx_id);
/* Tape nodes (tape.c, lstm.c): t's floats in host memory (its own storage on a host
 * backend, else a copy in ctx scratch), and grad (n floats, any backend) += host src. */
ferry_status ferry__dist_host_floats(ferry_ctx *ctx, const ferry_tensor *t, const float **out);
ferry_status ferry__dist_add_host(ferry_ctx *ctx, ferry_tensor *grad, const float *src, int64_t n);

/* A borrowed tensor descriptor over host data: the request tensor of contract entry id,
 * or (_as) one named freely (parameters). */
ferry_rpc_tensor ferry__dist_tensor(ferry_wire_tensor_id id, const int64_t *dim, const void *data);
ferry_rpc_tensor ferry__dist_tensor_as(const char *name, int dtype, int ndim, const int64_t *dim,
                                       const void *data);

#endif /* FERRY_DIST_H */
