/* ps-impl.h - internals shared by the files of ferry-ps: hosted modules and their
 * kinds (embedding.c, linear.c, decoder.c), the registry (registry.c), the context
 * table with leases (ctx-table.c), the request handlers (handlers.c, params.c),
 * checkpoints (checkpoint.c) and the server object (server.c).
 *
 * Locking: the registry's mutex guards its list only; a module's rwlock guards its
 * parameters and optimizer (Forward/Backward/GetParams read, Step/SetParams write);
 * a context's mutex serialises the calls of one context. Order: context mutex, then
 * module lock; the table lock is never held while taking either. */
#ifndef FERRY_PS_IMPL_H
#define FERRY_PS_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "ferry.pb-c.h" /* Ferry__*Request, Ferry__*Reply */
#include "common/rpc/contract.h"
#include "common/rpc/rpc.h"
#include "ferry/params.h"
#include "ferry/optim.h"
#include "server/ps.h"

/* ---- budgets ---------------------------------------------------------------- */

/* A server's budgets in bytes (ferry_ps_config's with defaults applied). */
typedef struct ferry__ps_limits {
    int64_t module_bytes;   /* one module: weights + optimizer slots */
    int64_t model_bytes;    /* all modules */
    int64_t context_bytes;  /* one context; one call's scratch */
    int64_t contexts_bytes; /* all contexts */
    int64_t contexts;       /* live contexts */
    /* One identity's share (proto/ferry.proto section 5): */
    int64_t id_contexts, id_contexts_bytes, id_modules, id_model_bytes, id_jobs;
    int64_t jobs; /* jobs, all identities */
} ferry__ps_limits;

/* What one identity holds, charged against its share of the budgets (quota.c). An
 * entry lives as long as the server (identities are the token table's or the CA's
 * certificates: a bounded set). */
typedef struct ferry__ps_quota {
    char identity[FERRY_RPC_IDENTITY_MAX];
    atomic_llong contexts, context_bytes, modules, model_bytes, jobs;
} ferry__ps_quota;

typedef struct ferry__ps_quotas {
    pthread_mutex_t mu;
    ferry__ps_quota **q;
    int n, cap;
} ferry__ps_quotas;

void ferry__ps_quotas_init(ferry__ps_quotas *Q);
void ferry__ps_quotas_deinit(ferry__ps_quotas *Q);
/* The entry of identity (made on first use); NULL when out of memory. */
ferry__ps_quota *ferry__ps_quota_of(ferry__ps_quotas *Q, const char *identity);
/* Takes one more of a counted thing (contexts, modules, jobs) if the identity stays
 * within limit: FERRY_ERR_RESOURCE naming it, the flag and the identity otherwise. */
ferry_status ferry__ps_quota_take(atomic_llong *held, int64_t limit, const char *what,
                                  const char *identity, const char *flag);
/* Charges bytes to an identity's byte count within limit (FERRY_ERR_RESOURCE otherwise;
 * nothing is charged then). */
ferry_status ferry__ps_quota_charge(atomic_llong *held, int64_t bytes, int64_t limit,
                                    const char *what, const char *identity, const char *flag);

/* Resolves cfg's budgets (0: the defaults, from the machine's physical memory). */
void ferry__ps_limits_resolve(const ferry_ps_config *cfg, ferry__ps_limits *out);
/* FERRY_ERR_RESOURCE: "<what> needs N MiB, over <budget> (M MiB, U MiB in use; <flag>)". */
ferry_status ferry__ps_over_budget(const char *what, int64_t need, const char *budget,
                                   int64_t limit, int64_t used, const char *flag);

/* ---- modules ---------------------------------------------------------------- */

/* A module's configuration after defaults are applied; two CreateModule calls
 * agree when these agree field by field. */
typedef struct ferry__ps_module_config {
    char kind[16];
    int64_t dims[2];
    int64_t row_begin, row_count; /* global rows this shard owns (dim 0 of every param) */
    uint64_t init_seed;
    double init_scale;
    ferry_optim_config optim;
    int bias;                           /* linear: has a bias (decoder: always) */
    int64_t weight_offset, bias_offset; /* init: element index of global (0, 0) / (0) */
    ferry_constraint_kind constraint;   /* linear weight: NONE or STIEFEL */
    double beta;                        /* Stiefel penalty weight (0 without a constraint) */
    int polar;                          /* option polar=1: polar factor of the drawn weight */
    int layers, first_layer;            /* lstm: K layers, the first one's index in the stack */
    int64_t dropout_ppm;                /* lstm: dropout between its layers, in millionths */
} ferry__ps_module_config;

struct ferry__ps_ctx_table;
struct ferry__ps_ctx;

/* What a Forward keeps for its Backward: up to three owned buffers, each charged
 * to the context's budget before it is allocated (or kept, when taken). */
typedef struct ferry__ps_saved {
    int mode;
    int64_t N;
    ferry_rpc_tensor t[3]; /* owned: release(release_user) frees each */
    int nt;
    void *obj; /* a kind's own saved state (lstm: its autograd context), obj_free'd */
    void (*obj_free)(void *obj);
    size_t bytes;
    struct ferry__ps_ctx_table *table; /* the context charged, set by the handler */
    struct ferry__ps_ctx *ctx;
    /* Set by the Backward handler when the reply may go before the weight gradient
     * is formed; an unconstrained affine kind's backward then writes the input
     * gradient only and leaves its operands in `late` for
     * ferry__ps_affine_grad_weights, which the handler runs after the reply. */
    int late_ok;
    struct {
        int pending;
        int64_t N;
        const float *x, *dy; /* in saved buffers or the request: valid until the
                              * handler returns */
    } late;
} ferry__ps_saved;

void ferry__ps_saved_free(ferry__ps_saved *sv); /* frees the buffers; NULL is a no-op */
/* Moves tensor i of req into the next slot of sv. */
ferry_status ferry__ps_saved_take(ferry__ps_saved *sv, ferry_rpc_msg *req, int i);
/* A new owned uninitialised buffer of n bytes in the next slot (`name` for the
 * budget's message); *data receives it. */
ferry_status ferry__ps_saved_alloc(ferry__ps_saved *sv, size_t n, const char *name, void **data);
/* Keeps obj (freed by obj_free) holding n bytes, charged first; on failure obj is
 * freed here. */
ferry_status ferry__ps_saved_keep(ferry__ps_saved *sv, void *obj, void (*obj_free)(void *),
                                  size_t n, const char *name);

typedef struct ferry__ps_module ferry__ps_module;

/* One module kind. forward and backward run under the module's read lock. */
typedef struct ferry__ps_kind {
    ferry_wire_kind wire; /* its entry in the wire contract (common/rpc/contract.h) */
    /* Validates m->cfg (dims, rows) and declares the parameters in m->P. */
    ferry_status (*declare)(ferry__ps_module *m);
    /* Reads req's tensors (it may take them), writes reply's. save != NULL: keep
     * what backward needs in *save (which is zeroed). */
    ferry_status (*forward)(ferry__ps_module *m, ferry_wire_mode mode, ferry_rpc_msg *req,
                            ferry_rpc_msg *reply, ferry__ps_saved *save);
    /* Checks every input before touching G, then accumulates the parameter
     * gradients into G and writes the input gradients to reply. With saved->late_ok
     * it may leave the weight gradient in saved->late (the affine kinds do): the
     * handler sends the reply, then forms it. */
    ferry_status (*backward)(ferry__ps_module *m, const Ferry__V1__BackwardRequest *q,
                             ferry__ps_saved *saved, ferry_rpc_msg *req, ferry_grads *G,
                             ferry_rpc_msg *reply);
    /* 1: with saved->late_ok on an unconstrained module, backward adds nothing into G
     * (it may make G's zeroed blocks; a late weight gradient of this module has made
     * them already): it may then run while an earlier weight gradient still forms. */
    int late_dw;
    /* Optional. Frees m->impl. */
    void (*destroy)(ferry__ps_module *m);
    /* Optional. Option polar=1 on the drawn initial values (default: the weight's
     * polar factor). */
    ferry_status (*polar)(ferry__ps_module *m);
    /* Optional. The Stiefel penalty of a constrained module whose constrained weights
     * are not its one weight (default: the block's weight m->w): *penalty and
     * *feasibility as ferry__ps_constraint_penalty, its gradient added into grad (the
     * dense gradient of m->w; NULL: measure only). */
    ferry_status (*penalty)(const ferry__ps_module *m, float *grad, double *penalty,
                            double *feasibility);
} ferry__ps_kind;

/* "embedding", "decoder", "linear": the contract's name of the kind. */
static inline const char *ferry__ps_kind_name(const ferry__ps_kind *k) {
    return ferry_wire_kinds[k->wire].name;
}

/* server/<name>.c defines each kind of the contract's map as ferry__ps_kind_<name>. */
#define FERRY__PS_KIND_DECLARE_(id, name, dims, rows, place, bias, stiefel, local_rows)            \
    extern const ferry__ps_kind ferry__ps_kind_##name;
FERRY_WIRE_KIND_MAP(FERRY__PS_KIND_DECLARE_)
#undef FERRY__PS_KIND_DECLARE_

struct ferry__ps_module {
    char name[FERRY_RPC_NAME_MAX];
    char owner[FERRY_RPC_IDENTITY_MAX]; /* the identity that created it */
    ferry__ps_module_config cfg;
    const ferry__ps_kind *kind;
    uint8_t *config_packed; /* the request's ModuleConfig, packed (checkpoints) */
    size_t config_len;
    ferry_params P;
    int w, b;     /* parameter indices ("weight", "bias"); b = -1 without bias */
    int64_t rows; /* shard rows: dim 0 of every parameter */
    int64_t cols; /* weight columns */
    ferry_optim *opt;
    pthread_rwlock_t lock;
    uint64_t version;            /* bumped by Step and SetParams, under the write lock */
    uint64_t loads;              /* bumped when a checkpoint's values replace the weights */
    int64_t bytes;               /* weights + optimizer slots, as charged to the model budget */
    const ferry__ps_limits *lim; /* the server's budgets */
    void *impl;                  /* the kind's own state (lstm) */
    /* References: the registry's (until DeleteModule), each call using it, each context
     * and bsp sum holding its gradient. Freed, its bytes given back to the model budget,
     * when the last goes (ferry__ps_module_put). */
    atomic_int refs;
    struct ferry__ps_registry *reg;
    ferry__ps_quota *quota; /* its owner's account: its count and bytes */
};

/* FERRY_ERR_RESOURCE unless `bytes` of one call's scratch fit the per-context budget. */
ferry_status ferry__ps_scratch_check(const ferry__ps_module *m, int64_t bytes, const char *what);

/* ---- module helpers (linear.c) ---- */

/* The single input tensor named `name` of req, checked to have dtype (or any integer
 * type for FERRY_WIRE_DTYPE_INDEX) and rank ndim with dim[k] == want[k] wherever
 * want[k] >= 0; index in *i. Errors name the module, the tensor and both shapes. */
ferry_status ferry__ps_input_as(const ferry__ps_module *m, const ferry_rpc_msg *req,
                                const char *name, int dtype, int ndim, const int64_t *want, int *i);
/* The request tensor of contract entry id, checked against the entry's dtype and rank
 * and against want (entries < 0 match anything); *i = -1 for an optional entry that
 * is absent. */
ferry_status ferry__ps_input(const ferry__ps_module *m, const ferry_rpc_msg *req,
                             ferry_wire_tensor_id id, const int64_t *want, int *i);
/* Allocates the reply tensor of contract entry id with shape dim. */
ferry_status ferry__ps_output(ferry_rpc_msg *reply, ferry_wire_tensor_id id, const int64_t *dim,
                              void **data);
/* FERRY_ERR_NUMERIC naming the first non-finite element, or FERRY_OK. */
ferry_status ferry__ps_check_finite(const ferry__ps_module *m, const char *what, const float *x,
                                    int64_t n);
/* Reads an integer tensor (I32 or I64) of n ids into int64 dst. */
void ferry__ps_read_ids(const ferry_rpc_tensor *t, int64_t n, int64_t *dst);

/* y (N, D) = x (N, C) W^T + b over the module's weight (D, C) and bias. */
ferry_status ferry__ps_affine_apply(const ferry__ps_module *m, int64_t N, const float *x, float *y);
/* dW += dy^T x, db += column sums of dy (into G), dx (N, C) = dy W. With sv's
 * late_ok set and an unconstrained weight, dx only: dW and db are left in sv->late
 * for ferry__ps_affine_grad_weights (x and dy must outlive that call). */
ferry_status ferry__ps_affine_grad(const ferry__ps_module *m, int64_t N, const float *x,
                                   const float *dy, ferry_grads *G, float *dx,
                                   ferry__ps_saved *sv);
/* The weight gradient an affine backward left for after the reply; no-op when none
 * is pending. */
ferry_status ferry__ps_affine_grad_weights(const ferry__ps_module *m, ferry__ps_saved *sv,
                                           ferry_grads *G);
/* The affine map y (N, D) = x (N, C) W^T + b of linear and decoder-logits modules.
 * Forward reads `in_name` (N, C), writes `out_name` (N, D) and, with save, keeps x;
 * backward reads `grad_name` (N, D), accumulates dW, db and writes `out_name` (N, C). */
ferry_status ferry__ps_affine_forward(ferry__ps_module *m, ferry_wire_tensor_id in,
                                      ferry_wire_tensor_id out, ferry_rpc_msg *req,
                                      ferry_rpc_msg *reply, ferry__ps_saved *save);
ferry_status ferry__ps_affine_backward(ferry__ps_module *m, ferry_wire_tensor_id grad,
                                       ferry_wire_tensor_id out, ferry__ps_saved *saved,
                                       ferry_rpc_msg *req, ferry_grads *G, ferry_rpc_msg *reply);

/* ---- constraints (linear.c) ----
 * A Stiefel-constrained weight (linear only) is used through A(W) by the affine
 * helpers above; its penalty beta ||W^T W - I||_F^2 belongs to the optimizer step. */

/* 1 when the module has a constrained parameter. */
int ferry__ps_constrained(const ferry__ps_module *m);
/* G += 4 beta W C(W) for the constrained weight, *penalty = beta ||C||_F^2 and
 * *feasibility = ||C||_F of the current W. The caller holds the module lock (read or
 * write) and calls it once per context (ferry__ps_ctx_mod.penalty_done). */
ferry_status ferry__ps_constraint_penalty(const ferry__ps_module *m, ferry_grads *G,
                                          double *penalty, double *feasibility);
/* The same two values without a gradient (Stats); module lock held. */
ferry_status ferry__ps_constraint_metrics(const ferry__ps_module *m, double *penalty,
                                          double *feasibility);

/* ---- registry (registry.c) ---- */

typedef struct ferry__ps_registry {
    pthread_mutex_t mu;
    ferry__ps_module **mods;
    int count, cap;
    int64_t bytes;               /* sum of the modules' bytes */
    const ferry__ps_limits *lim; /* the server's, which outlives the registry */
} ferry__ps_registry;

/* Writes a's and b's first differing field ("row_count 5000 (existing) vs 10000
 * (requested)") into buf; 0 when the two configurations agree. */
int ferry__ps_config_diff(const ferry__ps_module_config *a, const ferry__ps_module_config *b,
                          char *buf, size_t cap);
void ferry__ps_registry_init(ferry__ps_registry *r, const ferry__ps_limits *lim);
void ferry__ps_registry_deinit(ferry__ps_registry *r);
/* CreateModule: idempotent by name. *created = 1 for a new module (owned by `owner`),
 * 0 when owner's module of that name has the same configuration (its parameters are
 * left alone). FERRY_ERR_EXISTS naming the first differing field otherwise, or saying
 * that the name is another identity's. */
ferry_status ferry__ps_registry_create(ferry__ps_registry *r, const char *owner,
                                       ferry__ps_quota *quota, const char *name,
                                       const Ferry__V1__ModuleConfig *cfg, ferry_rpc_msg *req,
                                       int *created, ferry__ps_module **out);
/* (*out is referenced: ferry__ps_module_put it.) */
/* The module named `name`, referenced (ferry__ps_module_put when done), or NULL with
 * FERRY_ERR_NOT_FOUND set through ferry_errorf. */
ferry__ps_module *ferry__ps_registry_find(ferry__ps_registry *r, const char *name);
/* A snapshot of the whole module list in a new array, each referenced: release it with
 * ferry__ps_registry_list_free. NULL with *n = 0 when empty or out of memory. */
ferry__ps_module **ferry__ps_registry_list(ferry__ps_registry *r, int *n);
void ferry__ps_registry_list_free(ferry__ps_module **mods, int n);
int ferry__ps_registry_count(ferry__ps_registry *r);
/* Takes module m out of the registry (later lookups do not find it; a new module may
 * take the name) and drops the registry's reference: it is freed, and its bytes given
 * back, once the calls and contexts using it are done. *bytes receives its size.
 * FERRY_ERR_NOT_FOUND when m is no longer registered. */
ferry_status ferry__ps_registry_delete(ferry__ps_registry *r, ferry__ps_module *m, int64_t *bytes);
/* One more reference to m; ferry__ps_module_put drops one (freeing m at the last). */
void ferry__ps_module_ref(ferry__ps_module *m);
void ferry__ps_module_put(ferry__ps_module *m);
/* Charges `bytes` more of m's own state (`what`, for the error) to the model budget and
 * its owner's share, as its weights were: FERRY_ERR_RESOURCE, nothing charged, when
 * either is short. They are given back with the module's. */
ferry_status ferry__ps_module_charge(ferry__ps_module *m, int64_t bytes, const char *what);

/* ---- contexts (ctx-table.c) ---- */

typedef struct ferry__ps_ctx_mod {
    ferry__ps_module *mod;
    ferry_grads G;
    /* A constrained module's penalty gradient goes into G exactly once per context,
     * when GradNorm or Step first needs it; the values are Step's metrics. */
    int penalty_done;
    double penalty, feasibility;
} ferry__ps_ctx_mod;

typedef struct ferry__ps_call {
    uint64_t call_id;
    ferry__ps_module *mod;
    ferry__ps_saved saved;
    /* Backpropagated: the saved state is gone, and the reply's tensors are kept (owned
     * copies, release NULL) to answer a retry of the same Backward alike. */
    int done;
    ferry_rpc_tensor *reply;
    int nreply;
    int64_t reply_bytes;
    struct ferry__ps_call *next;
} ferry__ps_call;

/* A context that Step ended, remembered (its packed StepReply) so that a retried
 * Step of it is answered alike instead of stepping again. */
typedef struct ferry__ps_stepped {
    uint64_t sess, id;
    uint8_t *head;
    size_t len;
} ferry__ps_stepped;

#define FERRY__PS_STEPPED_KEEP 1024

typedef struct ferry__ps_ctx {
    uint64_t id;
    pthread_mutex_t mu;      /* held by the call working on the context */
    int refs;                /* table lock */
    int dead;                /* table lock: stepped or released; freed at refs == 0 */
    double last_used;        /* table lock */
    uint64_t sess;           /* the session that opened it (ferry__ps_session.serial) */
    ferry__ps_quota *quota;  /* its identity's account; NULL: not charged */
    ferry__ps_ctx_mod *mods; /* modules touched, in order */
    int nmods, cap;
    ferry__ps_call *calls;      /* saved Forwards awaiting Backward */
    /* Weight gradients formed after their Backward's reply, without mu: each takes a
     * ticket (late_next++) under mu and runs once late_done reaches it, so they
     * accumulate in the order their Backwards came. A call that reads or writes the
     * gradients waits until late_done == late_next (ferry__ps_ctx_settle). */
    uint64_t late_next, late_done; /* mu */
    pthread_cond_t late_cv;        /* with mu: late_done moved */
    int64_t late_bytes;            /* mu: operands the late gradients still hold */
    int64_t bytes;              /* memory held: as last measured, plus charges since */
    struct ferry__ps_ctx *next; /* hash chain */
} ferry__ps_ctx;

typedef struct ferry__ps_ctx_table {
    pthread_mutex_t mu;
    ferry__ps_ctx **buckets;
    int64_t nbuckets, count;
    double ttl_s;
    const ferry__ps_limits *lim; /* the server's, which outlives the table */
    atomic_llong bytes;          /* sum of every context's bytes */
    atomic_llong created, swept, stepped, released;
    ferry__ps_stepped stepped_ring[FERRY__PS_STEPPED_KEEP]; /* table lock */
    int stepped_next;
    atomic_llong replayed; /* retried calls answered from what was kept */
    atomic_llong early;    /* Backward replies sent before their weight gradient */
    atomic_llong overlapped; /* Backwards that ran while an earlier weight gradient had
                              * not yet been formed */
} ferry__ps_ctx_table;

ferry_status ferry__ps_ctx_table_init(ferry__ps_ctx_table *t, double ttl_s,
                                      const ferry__ps_limits *lim);
void ferry__ps_ctx_table_deinit(ferry__ps_ctx_table *t);
/* ferry__ps_ctx_acquire's flags. */
enum {
    FERRY__PS_CTX_CREATE = 1,   /* make the context if there is none */
    FERRY__PS_CTX_UNSETTLED = 2 /* do not wait for late weight gradients (a Backward, which
                                 * waits itself where it must: ferry__ps_ctx_settle) */
};
/* Finds (or with FERRY__PS_CTX_CREATE, makes) session sess's context id, refreshes its
 * lease, and returns it locked, every late weight gradient of it formed (unless
 * FERRY__PS_CTX_UNSETTLED). Contexts of other sessions are not seen: FERRY_ERR_NOT_FOUND
 * with the same message as for an unknown, stepped, released or swept context;
 * FERRY_ERR_INVALID for id 0. */
ferry_status ferry__ps_ctx_acquire(ferry__ps_ctx_table *t, uint64_t sess, uint64_t id, int flags,
                                   ferry__ps_ctx **out);
/* The same, a new context charged to the session's identity (quota: its count and
 * bytes against the identity's share; NULL: not charged). */
ferry_status ferry__ps_ctx_acquire_q(ferry__ps_ctx_table *t, uint64_t sess, ferry__ps_quota *quota,
                                     uint64_t id, int flags, ferry__ps_ctx **out);
/* Waits (c locked; the lock is let go meanwhile) until every late weight gradient of c
 * is formed. FERRY_ERR_NOT_FOUND, c released, if c was stepped or released meanwhile. */
ferry_status ferry__ps_ctx_settle(ferry__ps_ctx_table *t, ferry__ps_ctx *c);
/* A late weight gradient's turn, taken (c locked) in the order the Backwards hold c:
 * waits until every earlier one is formed, then lets c's lock go (c stays referenced)
 * while the caller forms it; ferry__ps_ctx_late_end locks c again and ends the turn. */
void ferry__ps_ctx_late_begin(ferry__ps_ctx *c);
void ferry__ps_ctx_late_end(ferry__ps_ctx *c);
/* Drops every context of session sess (it ended); returns how many. */
int ferry__ps_ctx_drop_session(ferry__ps_ctx_table *t, uint64_t sess);
/* Re-accounts its memory, unlocks, and drops the reference (freeing a retired one). */
void ferry__ps_ctx_release(ferry__ps_ctx_table *t, ferry__ps_ctx *c);
/* Marks a locked context stepped/released: later calls get NOT_FOUND, and it is
 * freed once the last holder releases it. */
void ferry__ps_ctx_retire(ferry__ps_ctx_table *t, ferry__ps_ctx *c, int stepped);
/* Charges `bytes` more to context c (locked) before they are allocated:
 * FERRY_ERR_RESOURCE naming the per-context or the all-contexts budget when either
 * would be exceeded (nothing is charged then); the message says "<what> '<name>'"
 * (name may be NULL), formatted only on refusal. */
ferry_status ferry__ps_ctx_charge(ferry__ps_ctx_table *t, ferry__ps_ctx *c, int64_t bytes,
                                  const char *what, const char *name);
/* Charges the most that G can grow by when row-sparse parameters receive up to
 * new_rows more rows and dense ones are first touched. */
ferry_status ferry__ps_ctx_charge_grads(ferry__ps_ctx_table *t, ferry__ps_ctx *c,
                                        const ferry_grads *G, int64_t new_rows);
/* The gradients of module m in context c, or NULL while it has none (nothing made). */
ferry_grads *ferry__ps_ctx_find_grads(ferry__ps_ctx *c, const ferry__ps_module *m);
/* The gradients of module m in context c, created (zero) on first use. */
ferry_status ferry__ps_ctx_grads(ferry__ps_ctx_table *t, ferry__ps_ctx *c, ferry__ps_module *m,
                                 ferry_grads **out);
/* Stores a saved Forward (moved from *sv, which is zeroed). FERRY_ERR_EXISTS if
 * that call id already has one for m. */
ferry_status ferry__ps_ctx_save(ferry__ps_ctx *c, ferry__ps_module *m, uint64_t call_id,
                                ferry__ps_saved *sv);
/* The saved Forward of (m, call_id), or NULL. */
ferry__ps_call *ferry__ps_ctx_find_call(ferry__ps_ctx *c, const ferry__ps_module *m,
                                        uint64_t call_id);
void ferry__ps_ctx_drop_call(ferry__ps_ctx *c, ferry__ps_call *call);
/* Marks a Backward's call done: frees its saved state and keeps copies of the
 * reply's tensors for a retry (FERRY_ERR_NOMEM leaves the call pending). */
ferry_status ferry__ps_ctx_finish_call(ferry__ps_ctx *c, ferry__ps_call *call,
                                       const ferry_rpc_msg *reply);
/* Answers a retried Backward of a done call with the kept tensors. */
ferry_status ferry__ps_ctx_replay_call(ferry__ps_ctx_table *t, const ferry__ps_call *call,
                                       ferry_rpc_msg *reply);
/* Remembers the Step reply of session sess's context id (its packed header). */
void ferry__ps_ctx_remember_step(ferry__ps_ctx_table *t, uint64_t sess, uint64_t id,
                                 const ferry_rpc_msg *reply);
/* The remembered Step reply of session sess's context id into *reply: FERRY_OK, or
 * FERRY_ERR_NOT_FOUND when none is kept (for that session). */
ferry_status ferry__ps_ctx_stepped_reply(ferry__ps_ctx_table *t, uint64_t sess, uint64_t id,
                                         ferry_rpc_msg *reply);
/* Frees contexts idle longer than the TTL (and not in use); returns the count. */
int ferry__ps_ctx_sweep(ferry__ps_ctx_table *t);
/* Contexts in the table and, if bytes is not NULL, the bytes charged to them, read
 * together: a context that left the count no longer counts in the bytes. */
int64_t ferry__ps_ctx_live(ferry__ps_ctx_table *t, int64_t *bytes);

/* ---- sessions (session.c) ----
 * Hello opens a session bound to the caller's identity; every other call names it and
 * runs in it (the handler adapter looks it up). Contexts, job ranks and remembered
 * replies belong to a session by its serial. */

#define FERRY__PS_LOCAL_SESSION                                                                    \
    UINT64_MAX                     /* the serial of in-process calls (ferry__ps_dispatch)          \
                                    */
#define FERRY__PS_SESSION_LEASES 4 /* open Session streams one session may hold */

typedef struct ferry__ps_session {
    char id[FERRY_RPC_SESSION_LEN + 1]; /* 32 hex digits, the secret the client sends */
    uint64_t serial;                    /* 1, 2, ... in this process; never reused */
    char identity[FERRY_RPC_IDENTITY_MAX];
    ferry_rpc_role role;
    int authority; /* an admin by token: may act on other identities' objects */
    char label[64];
    ferry__ps_quota *quota;          /* its identity's account (ferry__ps_session_open sets it) */
    double probe_tokens, probe_last; /* Job probes: a token bucket (table lock) */
    /* table lock: */
    double created, last_used;
    int leases, had_lease; /* open Session streams; whether it ever opened one */
    int refs;              /* the table's, each call's and each lease's */
    int dead;
    struct ferry__ps_session *next;
} ferry__ps_session;

typedef struct ferry__ps_sessions {
    pthread_mutex_t mu;
    ferry__ps_session **buckets;
    int count;
    uint64_t next_serial, opened, expired;
    double ttl_s;
    int max, max_per_identity;
    ferry__ps_session local; /* in-process calls: identity "local", admin */
    ferry__ps_quotas *quotas; /* each session's identity's account */
} ferry__ps_sessions;

ferry_status ferry__ps_sessions_init(ferry__ps_sessions *S, double ttl_s, int max, int max_per_id,
                                     ferry__ps_quotas *quotas);
void ferry__ps_sessions_deinit(ferry__ps_sessions *S);
/* Hello: renews the caller's live session when it names one with its own
 * credentials, else opens a new one (FERRY_ERR_RESOURCE over --max-sessions or the
 * per-identity limit). The caller holds a reference: ferry__ps_session_leave. */
ferry_status ferry__ps_session_open(ferry__ps_sessions *S, const ferry_rpc_caller_info *who,
                                    ferry__ps_session **out);
/* Every other call: the session the caller names, checked against its credentials,
 * referenced until ferry__ps_session_leave; FERRY_ERR_SESSION otherwise. who NULL (an
 * in-process call): the local session. */
ferry_status ferry__ps_session_enter(ferry__ps_sessions *S, const ferry_rpc_caller_info *who,
                                     const char *method, ferry__ps_session **out);
void ferry__ps_session_leave(ferry__ps_sessions *S, ferry__ps_session *s);
/* One probe of the session's allowance (10 a second, in bursts of 20):
 * FERRY_ERR_BUSY when spent. */
ferry_status ferry__ps_session_probe_rate(ferry__ps_sessions *S, ferry__ps_session *s);
/* 1 while session `serial` may hold a job rank: a Session stream open, or, for a
 * client that never opened one, a call in flight or within the TTL. */
int ferry__ps_session_holds(ferry__ps_sessions *S, uint64_t serial);
/* The lease ops of the RPC layer: a Session stream opened and closed. */
ferry_status ferry__ps_session_lease_open(ferry__ps_sessions *S, const ferry_rpc_caller_info *who,
                                          ferry__ps_session **out);
/* A Session stream ended; returns the session's serial when that was its last one
 * (its client process or connection went away), else 0. */
uint64_t ferry__ps_session_lease_close(ferry__ps_sessions *S, ferry__ps_session *s);
/* Ends the sessions idle past the TTL, without a lease or a call in flight; their
 * serials into ended (at most cap), for the caller to drop what they held. Returns
 * the count. */
int ferry__ps_sessions_sweep(ferry__ps_sessions *S, uint64_t *ended, int cap);
void ferry__ps_sessions_counts(ferry__ps_sessions *S, int64_t *live, int64_t *opened,
                               int64_t *expired, int64_t *leases);
/* 1 when session s may use an object of identity owner: its own, or s is an admin
 * by token. */
static inline int ferry__ps_may_use(const ferry__ps_session *s, const char *owner) {
    return s->authority || strcmp(s->identity, owner) == 0;
}

/* ---- jobs (jobs.c) ----
 * A training job's membership and its consistency: N ranks join by name (Job join), and
 * their GradNorm and Step calls carry (job, rank, step). bsp: GradNorm waits until
 * every rank's context of the step has arrived, then the N contexts' gradients are
 * summed in rank order into the job's gradient of the step, which the first Step of
 * the step applies once. ssp:K: Step applies the rank's gradient at once, and its
 * reply waits until the rank is at most K steps ahead of the slowest. Waiting calls
 * are deferred replies (ferry_rpc_defer), so no server thread blocks; the sweep
 * timer fails waits past the job's sync timeout, naming the missing ranks. */

typedef enum ferry__ps_sync { FERRY__PS_BSP, FERRY__PS_SSP, FERRY__PS_ASYNC } ferry__ps_sync;

typedef struct ferry__ps_job ferry__ps_job;

typedef struct ferry__ps_jobs {
    pthread_mutex_t mu; /* guards every job; taken before a context or module lock */
    ferry__ps_job *list;
    int count;     /* jobs held */
    int64_t bytes; /* their memory: the job records and their rank tables */
    int stopped; /* the server stops: waits are refused */
    const ferry__ps_limits *lim; /* the server's */
    double ttl_s; /* a finished or failed job, or one nobody holds, is freed this long after */
} ferry__ps_jobs;

void ferry__ps_jobs_init(ferry__ps_jobs *j);
/* Fails every waiting call (UNAVAILABLE, "ferry-ps is shutting down") and refuses
 * later waits; then frees everything (deinit). */
void ferry__ps_jobs_stop(ferry__ps_jobs *j);
void ferry__ps_jobs_deinit(ferry__ps_jobs *j);
/* Fails the waits that passed their job's sync timeout, and frees the jobs that
 * finished, failed or were held by no live session for the jobs' TTL (the sweep
 * timer). */
struct ferry__ps_sessions;
void ferry__ps_jobs_expire(ferry__ps_jobs *j, struct ferry__ps_sessions *S);
/* Answers `pending` to every bsp GradNorm held past its JobStep.hold_ms (the sweep's
 * hold timer, every 50 ms). */
void ferry__ps_jobs_release_holds(ferry__ps_jobs *j);

/* ---- the server's state and its request handlers ---- */

/* Writes every module (owner NULL) or those of identity owner (a job's checkpoint:
 * the file records the owner) with config, version, parameters and optimizer state,
 * and the job step it belongs to, into file `name` in directory `dir` (a ckfile, see
 * checkpoint.c) atomically: a new temporary file (O_EXCL, never a symlink's target),
 * fsync, rename over the name (which replaces a symlink, never follows it), fsync of
 * the directory. Refused with FERRY_ERR_RESOURCE when the file system lacks the
 * room. *bytes receives the size. Afterwards only the newest `keep` ferry-ps
 * checkpoints in dir are kept (keep <= 0: all). */
ferry_status ferry__ps_checkpoint_write(ferry__ps_registry *r, const char *dir, const char *name,
                                        const char *owner, uint64_t step, int keep,
                                        uint64_t *bytes);
/* Verifies a whole checkpoint (every section's CRC) and only then recreates its
 * modules (charged to their owners' accounts in Q; NULL: uncharged), or loads them into
 * the existing ones of the same configuration. *step
 * (may be NULL) receives the job step it belongs to. FERRY_ERR_FORMAT naming the
 * file and what is wrong; nothing is changed then. `only` (NULL: any): the identity
 * the file and every module in it must belong to, else FERRY_ERR_DENIED, nothing
 * changed (a job's checkpoint holds only its owner's modules). */
ferry_status ferry__ps_checkpoint_read(ferry__ps_registry *r, ferry__ps_quotas *Q, const char *path,
                                       const char *only, uint64_t *step);
/* A job's modules (owner's, named prefix...) with their optimizer state as the bytes of
 * a checkpoint file of `step` (*data malloc'd), written through a private directory
 * under dir (NULL or "": $TMPDIR or /tmp). */
ferry_status ferry__ps_checkpoint_export(ferry__ps_registry *r, const char *dir, const char *owner,
                                         const char *prefix, uint64_t step, uint8_t **data,
                                         size_t *len);
/* The bytes of such a file replace owner's modules named prefix... in r: the file is
 * verified whole first (CRCs, step `step`, its and every module's owner `owner`,
 * every module named prefix...), so a refusal changes nothing; a failure while
 * restoring leaves none of the job's modules here. *nmods: the modules it held;
 * *changed: 1 once the job's modules here were touched (0: a refusal). */
ferry_status ferry__ps_checkpoint_adopt(ferry__ps_registry *r, ferry__ps_quotas *Q, const char *dir,
                                        const uint8_t *data, size_t len, const char *owner,
                                        const char *prefix, uint64_t step, uint32_t *nmods,
                                        int *changed);
/* Deletes all but the newest `keep` checkpoints of dir (--checkpoint-keep); the file
 * `current` stays. */
void ferry__ps_checkpoint_retain(const char *dir, const char *current, int keep);
/* Verifies path whole, like ferry__ps_checkpoint_read, and that it and every module in
 * it belong to `owner` (FERRY_ERR_DENIED); *step: its job step. Changes nothing. */
ferry_status ferry__ps_checkpoint_check_owner(const char *path, const char *owner, uint64_t *step);
/* ---- resharding (reshard.c) ---- */

/* A job's checkpoint of one step as k servers wrote it (in[s]: server s's file, in
 * the job's server order), each file verified whole and restored into a registry of
 * its own. FERRY_ERR_INVALID for files of different steps or owners. */
typedef struct ferry__ps_reshard_src ferry__ps_reshard_src;
ferry_status ferry__ps_reshard_open(const char *const *in, int k, ferry__ps_reshard_src **out);
/* Writes server t's file of the same checkpoint cut for k2 servers (the client's
 * placement) to dir/name; *bytes its size. Errors name the module. */
ferry_status ferry__ps_reshard_write(ferry__ps_reshard_src *src, int k2, int t, const char *dir,
                                     const char *name, uint64_t *bytes);
uint64_t ferry__ps_reshard_step(const ferry__ps_reshard_src *src);
uint64_t ferry__ps_reshard_bytes(const ferry__ps_reshard_src *src); /* the sources' sizes */
void ferry__ps_reshard_close(ferry__ps_reshard_src *src);

/* What a probe knows of a directory's checkpoint files: name, size, modification time
 * and inode, and what verifying the file found (its step and owner, or that it is
 * damaged). A file is read and CRC-checked once; later probes trust this while its
 * size, time and inode stay. */
typedef struct ferry__ps_manifest_entry {
    char name[256];
    int64_t size, mtime_ns;
    uint64_t ino;
    uint64_t step;
    char owner[FERRY_RPC_IDENTITY_MAX];
    int ok;
} ferry__ps_manifest_entry;

typedef struct ferry__ps_manifest {
    pthread_mutex_t mu;
    ferry__ps_manifest_entry *e;
    size_t n, cap;
    uint64_t verified, reused; /* files read whole, answers from the manifest */
    uint64_t bytes_read;       /* what verifying read */
} ferry__ps_manifest;

/* What every request handler works on: the server's state without its loop. server.c
 * makes it at start-up and registers each method's handler with the RPC server with
 * this state as the handler's user pointer; handlers never call into server.c. */
typedef struct ferry__ps_state {
    ferry__ps_registry reg;
    ferry__ps_quotas quotas;
    ferry__ps_manifest manifest; /* the checkpoint files probes have verified */
    ferry__ps_sessions sessions;
    ferry__ps_ctx_table ctxs;
    ferry__ps_jobs jobs;
    ferry__ps_limits lim;
    char checkpoint_dir[1024]; /* "" without --checkpoint-dir */
    int checkpoint_keep;
    double ck_rate;           /* Checkpoint calls allowed per minute (a burst of as many) */
    double ck_tokens, ck_last; /* the token bucket, under checkpoint_mu */
    size_t max_message_bytes;
    pthread_mutex_t checkpoint_mu; /* one checkpoint written at a time */
    /* The last named checkpoint written whole (under checkpoint_mu), and the modules'
     * versions then (ck_done_fp): the same request again with nothing stepped or set
     * since, a client's retry after a lost reply or a stall, is answered with it. */
    char ck_done[160];
    uint64_t ck_done_step, ck_done_bytes, ck_done_fp;
    uint64_t incarnation;
    /* The checkpoint this server restored at start (--restore, or the newest in
     * --checkpoint-dir), and its job step: what a recovering job compares. */
    char restored[1024 + 256];
    uint64_t restored_step;
    double t_start;
    atomic_llong memory_trims; /* free memory handed back to the system (server.c) */
    atomic_llong wide_calls;   /* calls marked wide that found a worker idle, their GEMMs
                                  then two-threaded where large enough (handlers.c) */
    pthread_mutex_t id_mu; /* guards server_id, completed once the port is known */
    char server_id[192];
    _Atomic(ferry_rpc_server *) rpc; /* its port and counters; NULL without the network */
    void (*stop)(void *stop_user, int grace_ms); /* Shutdown: stop the server */
    void *stop_user;
} ferry__ps_state;

/* The handler of each method, in ferry_rpc_method order: context calls (handlers.c),
 * parameters (params.c), whole-server calls (admin.c), each registered with the RPC
 * server as ferry__ps_handlers[method] (user: the ferry__ps_state). q is req's header. */
#define FERRY__PS_HANDLER_DECL_(id, Name, snake)                                                   \
    ferry_status ferry__ps_on_##snake(ferry__ps_state *ps, ferry__ps_session *sess,                \
                                      const Ferry__V1__##Name##Request *q, ferry_rpc_msg *req,     \
                                      ferry_rpc_msg *reply);
FERRY_RPC_METHOD_MAP(FERRY__PS_HANDLER_DECL_)
#undef FERRY__PS_HANDLER_DECL_
extern const ferry_rpc_handler ferry__ps_handlers[FERRY_RPC_METHOD_COUNT];

struct ferry_ps_server;
/* One call through the handler table, as the RPC server makes it (fuzz targets). */
ferry_status ferry__ps_dispatch(ferry_ps_server *s, ferry_rpc_method method, ferry_rpc_msg *req,
                                ferry_rpc_msg *reply);
/* A server without the network, answering only ferry__ps_dispatch (fuzz targets);
 * cfg->listen is ignored. Destroy with ferry_ps_server_destroy. */
ferry_status ferry__ps_server_create_local(const ferry_ps_config *cfg, ferry_ps_server **out);
ferry__ps_ctx_table *ferry__ps_server_contexts(ferry_ps_server *s); /* tests */
/* Resident memory of this process (VmRSS), or 0 when unknown. */
int64_t ferry__ps_rss_bytes(void);
/* Bytes the process's allocations hold now (malloc's in-use bytes, all arenas; ASan's
 * allocated bytes under ASan), or -1 when unknown. Unlike the resident memory, it does
 * not count what the allocator keeps after a burst (free pages it has not returned,
 * fragmented arenas): what a leak grows and a burst leaves the same. */
int64_t ferry__ps_heap_bytes(void);

/* The /metrics page (metrics.c). */
struct ferry_prom;
void ferry__ps_prometheus(ferry__ps_state *s, struct ferry_prom *p);

/* The job calls of GradNorm and Step (jobs.c): q->job is set; the session must hold
 * the rank. */
ferry_status ferry__ps_job_grad_norm(ferry__ps_state *ps, ferry__ps_session *sess,
                                     const Ferry__V1__GradNormRequest *q, ferry_rpc_msg *reply);
ferry_status ferry__ps_job_step(ferry__ps_state *ps, ferry__ps_session *sess,
                                const Ferry__V1__StepRequest *q, const ferry_rpc_msg *req,
                                ferry_rpc_msg *reply);
/* The context's own GradNorm (handlers.c), into reply. */
ferry_status ferry__ps_grad_norm_context(ferry__ps_state *ps, uint64_t sess,
                                         const Ferry__V1__GradNormRequest *q, ferry_rpc_msg *reply);
/* The context's own Step (handlers.c), into reply. */
ferry_status ferry__ps_step_context(ferry__ps_state *ps, uint64_t sess,
                                    const Ferry__V1__StepRequest *q, ferry_rpc_msg *reply);
/* The role a method needs (server.c). */
ferry_rpc_role ferry__ps_method_role(ferry_rpc_method m);
/* What a session held, dropped when it ends (server.c's sweep): its contexts, its
 * job ranks and their waiting calls. */
void ferry__ps_session_ended(ferry__ps_state *ps, uint64_t serial);
/* Releases the job ranks session serial holds (jobs.c): their waiting calls fail. */
void ferry__ps_jobs_session_ended(ferry__ps_jobs *j, uint64_t serial);
/* Session serial lost its last Session stream (its trainer died or its connection
 * closed): the waits of other ranks on the ranks it holds end now (jobs.c). */
void ferry__ps_jobs_holder_gone(ferry__ps_jobs *j, uint64_t serial);
/* The module `name` if session sess may use it (its identity's, or any for an admin),
 * referenced (ferry__ps_module_put); NULL with FERRY_ERR_NOT_FOUND set otherwise, the
 * same answer for a name that does not exist and for another identity's module. */
ferry__ps_module *ferry__ps_module_find(ferry__ps_state *ps, const ferry__ps_session *sess,
                                        const char *name);
/* One optimizer step of a module from cm's gradients: lr (> 0 sets it), the penalty
 * gradient if not yet added (charged to context c of table t when both are given),
 * gradients times scale, version + 1; *version receives it. Takes the write lock. */
ferry_status ferry__ps_step_module(ferry__ps_ctx_table *t, ferry__ps_ctx *c,
                                   ferry__ps_ctx_mod *cm, double scale, double lr,
                                   uint64_t *version);
/* Adds a constrained module's penalty gradient to cm->G once (penalty_done), charged
 * to context c of table t when both are given; `locked`: the caller holds the
 * module's lock (handlers.c). */
ferry_status ferry__ps_ctx_mod_penalty(ferry__ps_ctx_table *t, ferry__ps_ctx *c,
                                      ferry__ps_ctx_mod *cm, int locked);
/* The jobs held and their memory (jobs.c). */
void ferry__ps_jobs_totals(ferry__ps_jobs *j, int64_t *count, int64_t *bytes);
/* Appends the per-job metrics to a Stats reply: "jobs", "job_bytes", then job/<name>/...
 * of identity owner's jobs (NULL: all), at most 32 jobs ("jobs_unlisted": the rest)
 * (jobs.c). */
typedef void (*ferry__ps_metric_fn)(void *user, const char *name, double value);
void ferry__ps_jobs_metrics(ferry__ps_jobs *j, const char *owner, ferry__ps_metric_fn add,
                            void *user);

/* ---- checkpoints (checkpoint.c) ---- */

void ferry__ps_manifest_init(ferry__ps_manifest *M);
void ferry__ps_manifest_deinit(ferry__ps_manifest *M);

/* Verifies a checkpoint without loading it; *step its job step, owner (NULL, or
 * FERRY_RPC_IDENTITY_MAX bytes) the identity it holds the modules of ("" for all). */
ferry_status ferry__ps_checkpoint_verify(const char *path, uint64_t *step, char *owner);
/* The steps N of job's complete checkpoints "<job>-step<N>.ckpt" in dir that belong
 * to identity owner (NULL: any), ascending (*steps malloc'd); damaged ones are logged
 * and left out. */
ferry_status ferry__ps_checkpoint_job_steps(const char *dir, ferry__ps_manifest *M, const char *job,
                                            const char *owner, uint64_t **steps, size_t *n);
/* A checkpoint written on request (admin.c): file `name` in --checkpoint-dir ("" the
 * default name of `step`), of identity owner's modules (NULL: all), one at a time and
 * within --checkpoint-rate; a named request repeating the last one written, with no
 * module changed since, is answered with that file. path receives its path. */
struct ferry__ps_state;
/* One checkpoint written (or installed) out of --checkpoint-rate's token bucket:
 * FERRY_ERR_BUSY saying when to try again. checkpoint_mu held. */
ferry_status ferry__ps_checkpoint_take_token(struct ferry__ps_state *s);
ferry_status ferry__ps_checkpoint_named(struct ferry__ps_state *s, const char *name,
                                        const char *owner, uint64_t step, char *path, size_t cap,
                                        uint64_t *bytes);
/* The newest (by mtime) complete ferry-ps checkpoint in dir into path; *found 0 when
 * there is none. Damaged ones are logged and skipped. */
ferry_status ferry__ps_checkpoint_newest(const char *dir, char *path, size_t cap, int *found);
/* Removes the temporary files of checkpoint writes a kill interrupted in dir
 * (".<name>.XXXXXX" holding a FERRYPS3 file or a prefix of one): of job's checkpoints
 * (its file prefix), or of any (job NULL). No checkpoint of this process may be in
 * writing (checkpoint_mu held, or at start-up). Logs and returns how many. */
int ferry__ps_checkpoint_sweep_temps(const char *dir, const char *job);
/* Removes the private directories of job moves (ferry__ps_checkpoint_export and _adopt)
 * that a kill left under dir (NULL or "": $TMPDIR or /tmp): this user's
 * ".ferry-move.XXXXXX" directories untouched for min_age_s seconds or more (a live move
 * keeps its directory for the length of one call), with the files a move writes there
 * (a directory holding anything else is left, and logged). For start-up. Logs and
 * returns how many. */
int ferry__ps_checkpoint_sweep_moves(const char *dir, double min_age_s);

#endif /* FERRY_PS_IMPL_H */
