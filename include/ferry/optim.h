/* optim.h - the optimizer over a parameter block: SGD (momentum, dampening, Nesterov),
 * Adagrad, Adadelta, Adam and AdamW, each exactly torch 1.13's single-tensor rule, dense
 * for ordinary parameters and lazy (touched rows only) for row-sparse ones. State slots
 * share the block's layout and live on its backend; the update runs there (the
 * backend's optimizer kernel).
 *
 *     ferry_optim_config cfg = ferry_optim_defaults(FERRY_OPTIM_ADAM);
 *     cfg.lr = 2e-3;
 *     ferry_optim *opt;
 *     ferry_optim_create(&P, &cfg, &opt);
 *     ... accumulate gradients into G (ferry_grads over P) ...
 *     ferry_optim_step(opt, &P, &G, clip_scale);   // 1.0f when not clipping
 *     ferry_optim_destroy(opt);
 *
 * Differences from torch, all deliberate: the step counter t is global (one per
 * ferry_optim_step, as torch.optim.SparseAdam counts for an embedding), so Adam's bias
 * correction and Adagrad's lr_decay use it even for a parameter that had no gradient in
 * some earlier step; a parameter without a gradient in a step is skipped entirely (no
 * weight decay, no momentum, state untouched), as torch skips params whose .grad is None;
 * row-sparse parameters update only the rows present in the gradient (their state
 * included), and an SGD momentum buffer of a row starts as that row's first gradient.
 * Not thread-safe per object. */
#ifndef FERRY_OPTIM_H
#define FERRY_OPTIM_H

#include "ferry/export.h"

#include <math.h> /* HUGE_VAL in FERRY_OPTIM_FIELD_MAP */
#include <stdint.h>
#include <stdio.h>

#include "ferry/backend.h" /* ferry_optim_kind */
#include "ferry/params.h"  /* ferry_params, ferry_grads */

#ifdef __cplusplus
extern "C" {
#endif

/* Every hyper-parameter, once. This list makes the struct below, the defaults, the
 * range checks, ferry-trainer's flags (--<flag>), the CreateModule message the client
 * sends and the server's parsing of it:
 *   X(field, flag, type, uses, lo, hi, hi_open, sgd, adagrad, adadelta, adam, adamw, help)
 * type is double or int (a 0/1 switch); uses, the kinds whose update reads the field;
 * a value must be finite, and for a kind that uses it in [lo, hi] (hi excluded when
 * hi_open); the five numbers are torch 1.13's defaults per kind (SGD has
 * no default lr in torch: ours is 1). Fields a kind does not use are ignored by its
 * update (but compared when a module is created again). */
#define FERRY_OPTIM_BIT(kind)  (1u << FERRY_OPTIM_##kind)
#define FERRY_OPTIM_ALL_KINDS  0x1fu
#define FERRY_OPTIM_ADAM_KINDS (FERRY_OPTIM_BIT(ADAM) | FERRY_OPTIM_BIT(ADAMW))
#define FERRY_OPTIM_EPS_KINDS  (FERRY_OPTIM_ALL_KINDS & ~FERRY_OPTIM_BIT(SGD))
#define FERRY_OPTIM_FIELD_MAP(X)                                                                   \
    X(lr, "lr", double, FERRY_OPTIM_ALL_KINDS, 0, HUGE_VAL, 0, 1.0, 0.01, 1.0, 1e-3, 1e-3,         \
      "learning rate")                                                                             \
    X(momentum, "momentum", double, FERRY_OPTIM_BIT(SGD), 0, HUGE_VAL, 0, 0, 0, 0, 0, 0,           \
      "SGD momentum")                                                                              \
    X(dampening, "dampening", double, FERRY_OPTIM_BIT(SGD), -HUGE_VAL, HUGE_VAL, 0, 0, 0, 0, 0, 0, \
      "SGD momentum dampening")                                                                    \
    X(nesterov, "nesterov", int, FERRY_OPTIM_BIT(SGD), 0, 1, 0, 0, 0, 0, 0, 0,                     \
      "SGD Nesterov momentum (needs momentum > 0 and dampening 0)")                                \
    X(weight_decay, "weight-decay", double, FERRY_OPTIM_ALL_KINDS, 0, HUGE_VAL, 0, 0, 0, 0, 0,     \
      0.01, "L2 penalty folded into the gradient (AdamW: decoupled decay)")                        \
    X(lr_decay, "adagrad-lr-decay", double, FERRY_OPTIM_BIT(ADAGRAD), 0, HUGE_VAL, 0, 0, 0, 0, 0,  \
      0, "Adagrad: lr / (1 + (t - 1) lr_decay)")                                                   \
    X(initial_accumulator, "initial-accumulator", double, FERRY_OPTIM_BIT(ADAGRAD), 0, HUGE_VAL,   \
      0, 0, 0, 0, 0, 0, "Adagrad: initial value of the squared-gradient sum")                      \
    X(rho, "rho", double, FERRY_OPTIM_BIT(ADADELTA), 0, 1, 0, 0, 0, 0.9, 0, 0,                     \
      "Adadelta decay of the running averages")                                                    \
    X(beta1, "beta1", double, FERRY_OPTIM_ADAM_KINDS, 0, 1, 1, 0, 0, 0, 0.9, 0.9,                  \
      "Adam(W) first-moment decay")                                                                \
    X(beta2, "beta2", double, FERRY_OPTIM_ADAM_KINDS, 0, 1, 1, 0, 0, 0, 0.999, 0.999,              \
      "Adam(W) second-moment decay")                                                               \
    X(eps, "eps", double, FERRY_OPTIM_EPS_KINDS, 0, HUGE_VAL, 0, 0, 1e-10, 1e-6, 1e-8, 1e-8,       \
      "term added to the denominator (Adagrad, Adadelta, Adam, AdamW)")

/* Hyper-parameters; doubles, as torch keeps them in Python floats; the kernel derives
 * float32 constants the way torch does. */
typedef struct ferry_optim_config {
    ferry_optim_kind kind;
#define FERRY_OPTIM_FIELD_(field, flag, type, uses, lo, hi, open, d0, d1, d2, d3, d4, help)        \
    type field;
    FERRY_OPTIM_FIELD_MAP(FERRY_OPTIM_FIELD_)
#undef FERRY_OPTIM_FIELD_
    /* Room to grow (ferry_optim_defaults zeroes it): a later release of the same soname takes new
     * fields from it, each meaning its default at zero, so a caller built against this header keeps
     * its behaviour and the struct its size. */
    unsigned char reserved[64];
} ferry_optim_config;

/* The list as a table, for code that handles every field alike (flags, messages). */
typedef struct ferry_optim_field {
    const char *name; /* the struct field: "weight_decay" */
    const char *flag; /* ferry-trainer's flag: "weight-decay" */
    int is_int;       /* a 0/1 switch (int field) rather than a double */
    unsigned kinds;   /* FERRY_OPTIM_BIT of each kind whose update reads it */
    double lo, hi;
    int hi_open;
    const char *help;
} ferry_optim_field;

enum {
#define FERRY_OPTIM_FIELD_(field, flag, type, uses, lo, hi, open, d0, d1, d2, d3, d4, help)        \
    FERRY_OPTIM_FIELD_##field,
    FERRY_OPTIM_FIELD_MAP(FERRY_OPTIM_FIELD_)
#undef FERRY_OPTIM_FIELD_
        FERRY_OPTIM_FIELD_COUNT
};

FERRY_API extern const ferry_optim_field ferry_optim_fields[FERRY_OPTIM_FIELD_COUNT];
/* The index of the field named name ("eps"), or -1. */
FERRY_API int ferry_optim_field_find(const char *name);
/* Field i of c as a double, and set from one (an int field takes v != 0). */
FERRY_API double ferry_optim_field_get(const ferry_optim_config *c, int i);
FERRY_API void ferry_optim_field_set(ferry_optim_config *c, int i, double v);

typedef struct ferry_optim ferry_optim; /* opaque */

/* PyTorch's defaults for kind. SGD has no default lr in torch; ours is 1.0.
 * sgd: lr 1, no momentum | adagrad: lr 0.01, eps 1e-10 | adadelta: lr 1, rho 0.9,
 * eps 1e-6 | adam: lr 1e-3, betas (0.9, 0.999), eps 1e-8 | adamw: as adam with
 * weight_decay 0.01. Every other field is 0. */
FERRY_API ferry_optim_config ferry_optim_defaults(ferry_optim_kind kind);
/* ferry_optim_defaults of the kind named name ("adam"); FERRY_ERR_INVALID as
 * ferry_optim_parse_kind. */
FERRY_API ferry_status ferry_optim_config_named(const char *name, ferry_optim_config *out);
/* "sgd", "adagrad", "adadelta", "adam" or "adamw" (case-sensitive) into *out;
 * FERRY_ERR_INVALID with the list of valid names otherwise. */
FERRY_API ferry_status ferry_optim_parse_kind(const char *name, ferry_optim_kind *out);
/* The name parse_kind accepts; "unknown" for a value outside the enum. */
FERRY_API const char *ferry_optim_kind_name(ferry_optim_kind kind);
/* Checks, from FERRY_OPTIM_FIELD_MAP, the range of every field the kind uses (the ones
 * torch checks: lr, eps, weight_decay, momentum >= 0; betas in [0, 1), rho in [0, 1]),
 * that every field is finite, that SGD's Nesterov has momentum > 0 and zero dampening,
 * and a known kind. FERRY_ERR_INVALID naming the offending field. */
FERRY_API ferry_status ferry_optim_config_check(const ferry_optim_config *cfg);

/* Per-element state slots the optimizer keeps (0, 1 or 2 floats per parameter
 * element): what ferry_optim_create will allocate, for budgets checked beforehand. */
FERRY_API int ferry_optim_slots(const ferry_optim_config *cfg);

/* Creates an optimizer for the allocated block P: the state slots the kind needs
 * (sgd: 1 with momentum, else 0; adagrad: 1, filled with initial_accumulator; adadelta,
 * adam, adamw: 2; zero-filled) are allocated on P->be with P's layout. P itself is not
 * kept: pass the same block (or one with the same layout) to every step. Errors:
 * FERRY_ERR_INVALID for a bad config or an unallocated block, FERRY_ERR_NOMEM. */
FERRY_API ferry_status ferry_optim_create(const ferry_params *P, const ferry_optim_config *cfg,
                                          ferry_optim **out);
FERRY_API void ferry_optim_destroy(ferry_optim *o); /* NULL is a no-op */

/* The learning rate used by later steps (schedules call this); FERRY_ERR_INVALID for a
 * negative or non-finite value. */
FERRY_API ferry_status ferry_optim_set_lr(ferry_optim *o, double lr);
FERRY_API double ferry_optim_get_lr(const ferry_optim *o);
/* The configuration (lr as currently set). */
FERRY_API ferry_optim_config ferry_optim_get_config(const ferry_optim *o);
/* Steps taken so far (t of the last step; 0 before the first). */
FERRY_API int64_t ferry_optim_step_count(const ferry_optim *o);

/* One step: t += 1, then every parameter of P with a gradient in G is updated: a dense
 * one over its range, a row-sparse one over the rows of its ferry_rowgrad (lazily).
 * Parameters without a gradient are skipped. The gradient is multiplied by grad_scale
 * first (the clipping scale from ferry_clip_coef; 1.0f for none). G is read only; it may
 * collect gradients from any number of modules or calls, and may have been built over
 * another ferry_params with the same layout (a copy of the block). Errors, all before
 * anything changes: FERRY_ERR_SHAPE if P or G does not have the optimizer's layout or a
 * row gradient has the wrong width, FERRY_ERR_RANGE for a row id outside its table,
 * FERRY_ERR_NUMERIC for a non-finite or negative grad_scale. */
FERRY_API ferry_status ferry_optim_step(ferry_optim *o, ferry_params *P, const ferry_grads *G,
                                        float grad_scale);

/* ---- checkpoints ---- */

/* Bytes ferry_optim_state_save writes. */
FERRY_API size_t ferry_optim_state_size(const ferry_optim *o);
/* Writes a header (kind, block size, parameter count, step, lr) and the state: the slots
 * and the SGD "buffer exists" flags, in host byte order. FERRY_ERR_IO on a write error. */
FERRY_API ferry_status ferry_optim_state_save(const ferry_optim *o, FILE *f);
/* Reads what state_save wrote and continues from it: step, lr and state are restored
 * (set the lr again afterwards to override it). The header must match this optimizer:
 * FERRY_ERR_EXISTS for another kind or layout, with a message such as "checkpoint
 * optimizer is adam over 123 floats, this model needs sgd over 456";
 * FERRY_ERR_FORMAT for a file that is not an optimizer state or is truncated (the state
 * may then be partly overwritten: do not step it). FERRY_ERR_IO on a read error. */
FERRY_API ferry_status ferry_optim_state_load(ferry_optim *o, FILE *f);

/* Re-cutting a row-sharded block (a table split over other servers): rows
 * [src_row, src_row + n) of parameter `item` of src's block P_src take the place of rows
 * [dst_row, dst_row + n) of the same parameter of dst's block P_dst, with their
 * optimizer state: every slot, and SGD momentum's "buffer exists" flags (the row flags
 * of a row-sparse table, the parameter's flag of a dense one). dst takes src's step
 * count and lr. P_src and P_dst must each have their optimizer's layout, and the
 * parameter the same kind of optimizer and the same row width in both (rows: its
 * shape's dim 0); FERRY_ERR_SHAPE or FERRY_ERR_RANGE otherwise, nothing changed.
 * The parameters' values are the caller's to copy. */
FERRY_API ferry_status ferry_optim_copy_rows(ferry_optim *dst, const ferry_params *P_dst,
                                             const ferry_optim *src, const ferry_params *P_src,
                                             int item, int64_t dst_row, int64_t src_row, int64_t n);

/* ---- Clipping ----
 * Global-norm gradient clipping, as torch.nn.utils.clip_grad_norm_ (norm type 2).
 * The scale is not applied here: pass it to ferry_optim_step (or each owner's Step), whose
 * kernel multiplies the gradient first. In the distributed step every owner reports the
 * sum of squares of the gradients it holds (ferry_clip_sumsq); the trainer adds them up
 * and computes one scale for all:
 *
 *     double ss;  float scale;  double norm;
 *     ferry_clip_sumsq(grads, n_grads, &ss);          // + remote owners' sums
 *     ferry_clip_coef(ss, max_norm, &scale, &norm);
 *     ferry_optim_step(opt, &P, G, scale); */

/* From the global sum of squares of all gradients: *norm_out = sqrt(total_sumsq) and
 * *scale_out = min(1, max_norm / (norm + 1e-6)), computed in float32 as torch does
 * (torch multiplies by the clamped coefficient even when it is 1; so may the caller).
 * FERRY_ERR_INVALID (scale 1) for max_norm <= 0 or non-finite; FERRY_ERR_NUMERIC (scale 1,
 * norm as computed) when the norm is NaN or infinite: the step should be skipped or the
 * run stopped. norm_out may be NULL. */
FERRY_API ferry_status ferry_clip_coef(double total_sumsq, float max_norm, float *scale_out,
                                       double *norm_out);

/* Sum of squares, in double, of every gradient held by the count gradient sets G[0..count)
 * (dense and row-sparse; a context may have touched several blocks, each with its own
 * ferry_grads). NULL entries are skipped. Errors from the backend pass through. */
FERRY_API ferry_status ferry_clip_sumsq(const ferry_grads *const *G, int count, double *out);

/* ---- the Stiefel penalty (cdopt's quadratic term; ferry/nn.h has the map) ---- */

/* For every Stiefel-constrained parameter of P (FERRY_CONSTRAINT_STIEFEL, with its
 * beta): adds the penalty's gradient 4 beta W (W^T W - I) to the parameter's dense
 * gradient in G (creating it if the parameter had none this step: the penalty always
 * contributes), and reports sum beta ||W^T W - I||_F^2 in *penalty and the drift
 * sqrt(sum ||W^T W - I||_F^2) in *drift (either may be NULL). Call it once per
 * optimizer step, after backward and before clipping, on the process that owns the
 * parameters; then clip and step as for any parameter. Errors from the backend or
 * FERRY_ERR_NOMEM. */
FERRY_API ferry_status ferry_stiefel_add_penalty_grads(const ferry_params *P, ferry_grads *G,
                                                       double *penalty, double *drift);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_OPTIM_H */
