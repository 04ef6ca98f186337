/* autograd.h - autograd contexts and the module-granularity tape (docs/architecture.md §3).
 * A context holds everything one training step creates: activations from an arena,
 * the tape of module calls in order, and the gradients of every parameter block the
 * step touched. Modules record a backward closure when they run in a context with
 * recording on; ferry_ctx_backward walks the tape in reverse. Gradients never go to
 * a shared .grad: they accumulate in the context, which the optimizer then consumes.
 *
 *     ferry_ctx_reset(ctx, id);                         // new step, arena emptied
 *     ferry_embedding_forward(&emb, ctx, ids, &x);      // records a node
 *     ...
 *     ferry_xent_forward(ctx, logits, targets, 1.0f, &loss, &sum);
 *     ferry_ctx_backward(ctx, loss);                    // grads in ferry_ctx_grads()
 *
 * A context is used by one thread at a time. */
#ifndef FERRY_CTX_H
#define FERRY_CTX_H

#include "ferry/export.h"

#include <stdint.h>

#include "ferry/backend.h"
#include "ferry/tensor.h"
#include "ferry/params.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_NODE_MAX_IO 4

typedef struct ferry_ctx ferry_ctx;

/* A node's backward: grad_out[k] is the gradient of out[k] (NULL when nothing
 * reached that output: treat as zero); grad_in[k] is NULL when in[k] needs no
 * gradient, else a tensor to ACCUMULATE (+=) into (zero-filled on first use). */
typedef ferry_status (*ferry_backward_fn)(ferry_ctx *ctx, void *saved,
                                          ferry_tensor *const *grad_out, ferry_tensor **grad_in);

FERRY_API ferry_status ferry_ctx_create(ferry_backend *be, ferry_ctx **out);
FERRY_API void ferry_ctx_destroy(ferry_ctx *ctx);
/* Starts a new step: empties the arena and the tape, zeroes gradients (keeps
 * their storage), and sets the context id. */
FERRY_API void ferry_ctx_reset(ferry_ctx *ctx, uint64_t id);
FERRY_API uint64_t ferry_ctx_id(const ferry_ctx *ctx);
FERRY_API ferry_backend *ferry_ctx_backend(const ferry_ctx *ctx);

/* Training mode: dropout active and nodes recorded. Eval mode records nothing. */
FERRY_API void ferry_ctx_set_training(ferry_ctx *ctx, int training);
FERRY_API int ferry_ctx_training(const ferry_ctx *ctx);
/* Dropout masks come from (seed, a per-context counter) so a step is replayable. */
FERRY_API void ferry_ctx_set_seed(ferry_ctx *ctx, uint64_t seed);
/* Reserves n draws of the context's random stream; returns (seed, offset). */
FERRY_API void ferry_ctx_draw(ferry_ctx *ctx, int64_t n, uint64_t *seed, uint64_t *offset);
/* Micro-batches: the context computes time steps [t0, t0 + steps) and batch columns
 * [col0, col0 + cols) of a window of T steps and `batch` columns, on tensors shaped
 * (steps, cols, ...) that are blocks of the window's (T, batch, ...). Dropout masks
 * drawn in it then hold exactly the values the whole window's masks have there, and
 * the stream advances as for the whole window, so a step's masks do not depend on
 * how its window is split. Until the next ferry_ctx_reset; batch 0 turns it off. */
FERRY_API void ferry_ctx_set_window(ferry_ctx *ctx, int64_t T, int64_t batch, int64_t t0,
                                    int64_t steps, int64_t col0, int64_t cols);
/* The window ferry_ctx_set_window set (*batch 0: none). A remote stage that draws
 * masks for this context's step reads it to draw the same ones. */
FERRY_API void ferry_ctx_get_window(const ferry_ctx *ctx, int64_t *T, int64_t *batch, int64_t *t0,
                                    int64_t *steps);
/* The window's columns the context computes, [*col0, *col0 + *cols) of its batch. */
FERRY_API void ferry_ctx_get_window_cols(const ferry_ctx *ctx, int64_t *col0, int64_t *cols);
/* n floats (backend memory) of a dropout mask, 1/(1-p) with probability 1-p and 0
 * otherwise, drawn from the context's stream (honouring ferry_ctx_set_window). */
FERRY_API ferry_status ferry_ctx_dropout_mask(ferry_ctx *ctx, int64_t n, float p, float *mask);

/* Arena memory, valid until the next reset. ferry_ctx_tensor's contents are
 * undefined; ferry_ctx_zeros' are zero. Host scratch is for saved-state structs. */
FERRY_API ferry_status ferry_ctx_tensor(ferry_ctx *ctx, ferry_dtype dt, ferry_shape shape,
                                        ferry_tensor **out);
FERRY_API ferry_status ferry_ctx_zeros(ferry_ctx *ctx, ferry_dtype dt, ferry_shape shape,
                                       ferry_tensor **out);
FERRY_API void *ferry_ctx_host_alloc(ferry_ctx *ctx, size_t nbytes); /* NULL on OOM; zeroed */

/* The gradients this context accumulates for block P (created on first use). */
FERRY_API ferry_grads *ferry_ctx_grads(ferry_ctx *ctx, const ferry_params *P);
/* Every block the context touched, for clipping and stepping. */
FERRY_API int ferry_ctx_grads_count(const ferry_ctx *ctx);
FERRY_API ferry_grads *ferry_ctx_grads_at(ferry_ctx *ctx, int i);

/* ---- the tape ---- */

/* Appends a node (no-op in eval mode). in/out are tensors of this context (their
 * addresses identify them); `saved` is what backward needs, usually host scratch. */
FERRY_API ferry_status ferry_ctx_record(ferry_ctx *ctx, ferry_backward_fn fn, void *saved, int nin,
                                        ferry_tensor *const *in, int nout,
                                        ferry_tensor *const *out);
/* Asks for the gradient of a leaf input (a test's x or h0); outputs of recorded
 * nodes need no asking. */
FERRY_API ferry_status ferry_ctx_require_grad(ferry_ctx *ctx, const ferry_tensor *t);
FERRY_API int ferry_ctx_tape_length(const ferry_ctx *ctx);
/* Runs the tape backward from a scalar (numel 1) `loss` seeded with 1. */
FERRY_API ferry_status ferry_ctx_backward(ferry_ctx *ctx, const ferry_tensor *loss);
/* Runs it from arbitrary seeds: grads[k] is the gradient of outputs[k]. */
FERRY_API ferry_status ferry_ctx_backward_from(ferry_ctx *ctx, int n,
                                               const ferry_tensor *const *outputs,
                                               const ferry_tensor *const *grads);
/* ferry_ctx_backward_from over the tape's nodes [first, end) only: the seeds are
 * added to their tensors' gradients and those nodes run in reverse; gradients they
 * pass to earlier nodes stay in the context for a later call over an earlier range.
 * A pipeline runs its micro-batches' backward this way, last recorded first, each
 * when its seed arrives. FERRY_ERR_RANGE unless 0 <= first <= end <= tape length. */
FERRY_API ferry_status ferry_ctx_backward_range(ferry_ctx *ctx, int n,
                                                const ferry_tensor *const *outputs,
                                                const ferry_tensor *const *grads, int first,
                                                int end);
/* Deferred weight gradients: with on, layers that can (the LSTM) hand the GEMMs that
 * form their weight gradients to a helper thread of this context and go on with the
 * gradients earlier nodes wait for, so a second core takes that work while this
 * thread walks the recurrence. Results are bit-identical (the jobs run in the order
 * they were made). The gradients are complete after ferry_ctx_sync, which
 * ferry_ctx_backward/_from call at their end and ferry_ctx_reset and
 * ferry_ctx_destroy call first; a caller of ferry_ctx_backward_range calls it before
 * reading gradients. Off by default; for host backends. */
FERRY_API void ferry_ctx_set_deferred(ferry_ctx *ctx, int on);
/* Waits for the deferred work; the first failed job's status and message. */
FERRY_API ferry_status ferry_ctx_sync(ferry_ctx *ctx);
/* After backward: the gradient of t, or NULL if none reached it. */
FERRY_API ferry_tensor *ferry_ctx_grad_of(ferry_ctx *ctx, const ferry_tensor *t);
/* For a backward fn that records t as no input: adds g into t's gradient, or, when
 * t has no gradient yet, makes g itself that gradient (no zero-fill, no copy; g is
 * handed over and must stay untouched afterwards). A no-op when t needs none.
 * The softmax loss uses it to turn its (N, V) probabilities into the logits'
 * gradient in place. */
FERRY_API ferry_status ferry_ctx_grad_accumulate(ferry_ctx *ctx, const ferry_tensor *t,
                                                 ferry_tensor *g);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_CTX_H */
