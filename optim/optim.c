/* optim.c - the optimizer object: configuration, state slots on the block's backend,
 * the step that walks a block's gradients (dense ranges and row-sparse tables) and
 * hands each to ferry_backend_optim_update, and the checkpoint format of the state. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/tensor/backend.h"
#include "common/core/log.h"
#include "ferry/optim.h"

struct ferry_optim {
    ferry_optim_config cfg;
    ferry_backend *be;
    int64_t numel;       /* block size (the slots' length) */
    int count;           /* parameters in the block */
    int64_t *table_rows; /* (count) R of each row-sparse parameter, else 0 */
    int64_t step;
    int nslots;
    float *slot[2]; /* backend: (numel) each, or NULL */
    /* SGD with momentum only: whether a momentum buffer exists yet. */
    uint8_t *seen;      /* host: (count), dense parameters */
    uint8_t **row_seen; /* (count) backend arrays of R bytes, row-sparse parameters */
};

/* ---- configuration ---- */

static const char *const kind_names[] = {"sgd", "adagrad", "adadelta", "adam", "adamw"};
#define KIND_COUNT ((int)(sizeof kind_names / sizeof kind_names[0]))

const char *ferry_optim_kind_name(ferry_optim_kind kind) {
    return (int)kind >= 0 && (int)kind < KIND_COUNT ? kind_names[kind] : "unknown";
}

ferry_status ferry_optim_parse_kind(const char *name, ferry_optim_kind *out) {
    for (int k = 0; name != NULL && k < KIND_COUNT; k++) {
        if (strcmp(name, kind_names[k]) == 0) {
            *out = (ferry_optim_kind)k;
            return FERRY_OK;
        }
    }
    return ferry_errorf(FERRY_ERR_INVALID,
                        "unknown optimizer '%s' (expected sgd|adagrad|adadelta|adam|adamw)",
                        name ? name : "(null)");
}

/* clang-format off */
const ferry_optim_field ferry_optim_fields[FERRY_OPTIM_FIELD_COUNT] = {
#define FIELD_(field, flag, type, uses, lo, hi, open, d0, d1, d2, d3, d4, help)                         \
    {#field, flag, sizeof(type) == sizeof(int), uses, lo, hi, open, help},
    FERRY_OPTIM_FIELD_MAP(FIELD_)
#undef FIELD_
};
/* clang-format on */

int ferry_optim_field_find(const char *name) {
    for (int i = 0; i < FERRY_OPTIM_FIELD_COUNT; i++)
        if (strcmp(ferry_optim_fields[i].name, name) == 0)
            return i;
    return -1;
}

double ferry_optim_field_get(const ferry_optim_config *c, int i) {
    switch (i) {
#define FIELD_(field, flag, type, uses, lo, hi, open, d0, d1, d2, d3, d4, help)                    \
    case FERRY_OPTIM_FIELD_##field:                                                                \
        return (double)c->field;
        FERRY_OPTIM_FIELD_MAP(FIELD_)
#undef FIELD_
    }
    FERRY_ASSERT(0 && "optimizer field index out of range");
    return 0.0;
}

void ferry_optim_field_set(ferry_optim_config *c, int i, double v) {
    switch (i) {
#define FIELD_(field, flag, type, uses, lo, hi, open, d0, d1, d2, d3, d4, help)                    \
    case FERRY_OPTIM_FIELD_##field:                                                                \
        c->field = sizeof(type) == sizeof(int) ? (type)(v != 0.0) : (type)v;                       \
        return;
        FERRY_OPTIM_FIELD_MAP(FIELD_)
#undef FIELD_
    }
    FERRY_ASSERT(0 && "optimizer field index out of range");
}

ferry_optim_config ferry_optim_defaults(ferry_optim_kind kind) {
    ferry_optim_config c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    if ((int)kind < 0 || (int)kind >= KIND_COUNT)
        return c; /* ferry_optim_config_check refuses it */
#define FIELD_(field, flag, type, uses, lo, hi, open, d0, d1, d2, d3, d4, help)                    \
    {                                                                                              \
        const double d[] = {d0, d1, d2, d3, d4};                                                   \
        c.field = (type)d[kind];                                                                   \
    }
    FERRY_OPTIM_FIELD_MAP(FIELD_)
#undef FIELD_
    return c;
}

ferry_status ferry_optim_config_named(const char *name, ferry_optim_config *out) {
    ferry_optim_kind kind;
    ferry_status st = ferry_optim_parse_kind(name, &kind);
    if (st == FERRY_OK)
        *out = ferry_optim_defaults(kind);
    return st;
}

ferry_status ferry_optim_config_check(const ferry_optim_config *c) {
    if ((int)c->kind < 0 || (int)c->kind >= KIND_COUNT)
        return ferry_errorf(FERRY_ERR_INVALID, "optimizer: unknown kind %d", (int)c->kind);
    for (int i = 0; i < FERRY_OPTIM_FIELD_COUNT; i++) {
        const ferry_optim_field *f = &ferry_optim_fields[i];
        double v = ferry_optim_field_get(c, i);
        int used = (f->kinds >> c->kind) & 1u;
        if (!isfinite(v) || (used && (v < f->lo || (f->hi_open ? v >= f->hi : v > f->hi))))
            return ferry_errorf(FERRY_ERR_INVALID, "optimizer: %s = %g is outside [%g, %g%s",
                                f->name, v, f->lo, f->hi, f->hi_open ? ")" : "]");
    }
    if (c->kind == FERRY_OPTIM_SGD && c->nesterov && (c->momentum <= 0.0 || c->dampening != 0.0))
        return ferry_errorf(FERRY_ERR_INVALID, "optimizer: Nesterov momentum requires a momentum "
                                               "and zero dampening");
    return FERRY_OK;
}

/* Slots the configuration needs (the backend's rule; an unknown kind, which
 * ferry_optim_config_check refuses, counts as 2 as it always has). */
int ferry_optim_slots(const ferry_optim_config *c) {
    int slots = ferry__optim_kind_slots(c->kind, c->momentum);
    return slots < 0 ? 2 : slots;
}

static int has_momentum_flags(const ferry_optim *o) {
    return o->cfg.kind == FERRY_OPTIM_SGD && o->nslots == 1;
}

/* ---- lifetime ---- */

void ferry_optim_destroy(ferry_optim *o) {
    if (o == NULL)
        return;
    for (int k = 0; k < 2; k++)
        ferry_backend_free(o->be, o->slot[k]);
    if (o->row_seen != NULL)
        for (int i = 0; i < o->count; i++)
            ferry_backend_free(o->be, o->row_seen[i]);
    free(o->row_seen);
    free(o->seen);
    free(o->table_rows);
    free(o);
}

/* Allocates the zeroed "buffer exists" flags of SGD momentum. */
static ferry_status create_flags(ferry_optim *o, const ferry_params *P) {
    o->seen = calloc((size_t)o->count + 1, 1);
    o->row_seen = calloc((size_t)o->count + 1, sizeof *o->row_seen);
    if (o->seen == NULL || o->row_seen == NULL)
        return FERRY_NOMEM();
    for (int i = 0; i < o->count; i++) {
        int64_t R = o->table_rows[i];
        if (R == 0)
            continue;
        uint8_t *zeros = calloc((size_t)R, 1);
        if (zeros == NULL)
            return FERRY_NOMEM();
        ferry_status st = ferry_backend_alloc(P->be, (size_t)R, (void **)&o->row_seen[i]);
        if (st == FERRY_OK)
            st = ferry_backend_copy(P->be, o->row_seen[i], zeros, (size_t)R,
                                    FERRY_COPY_HOST_TO_DEVICE);
        free(zeros);
        if (st != FERRY_OK)
            return st;
    }
    return FERRY_OK;
}

ferry_status ferry_optim_create(const ferry_params *P, const ferry_optim_config *cfg,
                                ferry_optim **out) {
    ferry_status st = ferry_optim_config_check(cfg);
    if (st != FERRY_OK)
        return st;
    if (P->data == NULL)
        return ferry_errorf(FERRY_ERR_INVALID, "optimizer: the parameter block is not allocated");
    ferry_optim *o = calloc(1, sizeof *o);
    if (o == NULL)
        return FERRY_NOMEM();
    o->cfg = *cfg;
    o->be = P->be;
    o->numel = P->numel;
    o->count = P->count;
    o->nslots = ferry_optim_slots(cfg);
    o->table_rows = calloc((size_t)P->count + 1, sizeof *o->table_rows);
    if (o->table_rows == NULL) {
        st = FERRY_NOMEM();
        goto fail;
    }
    for (int i = 0; i < P->count; i++)
        if (P->items[i].flags & FERRY_PARAM_ROW_SPARSE)
            o->table_rows[i] = P->items[i].shape.dim[0];
    for (int k = 0; k < o->nslots; k++) {
        float fill = cfg->kind == FERRY_OPTIM_ADAGRAD ? (float)cfg->initial_accumulator : 0.0f;
        if ((st = ferry_backend_alloc(o->be, (size_t)o->numel * sizeof(float),
                                      (void **)&o->slot[k])) != FERRY_OK ||
            (st = ferry_backend_fill(o->be, o->slot[k], o->numel, fill)) != FERRY_OK)
            goto fail;
    }
    if (has_momentum_flags(o) && (st = create_flags(o, P)) != FERRY_OK)
        goto fail;
    *out = o;
    return FERRY_OK;
fail:
    ferry_optim_destroy(o);
    return st;
}

ferry_status ferry_optim_set_lr(ferry_optim *o, double lr) {
    if (!isfinite(lr) || lr < 0.0)
        return ferry_errorf(FERRY_ERR_INVALID, "optimizer: lr = %g is outside [0, inf]", lr);
    o->cfg.lr = lr;
    return FERRY_OK;
}

double ferry_optim_get_lr(const ferry_optim *o) {
    return o->cfg.lr;
}

ferry_optim_config ferry_optim_get_config(const ferry_optim *o) {
    return o->cfg;
}

int64_t ferry_optim_step_count(const ferry_optim *o) {
    return o->step;
}

/* ---- step ---- */

/* FERRY_ERR_SHAPE unless B has the layout the optimizer was created for. */
static ferry_status check_layout(const ferry_optim *o, const ferry_params *B, const char *what) {
    if (B == NULL || B->numel != o->numel || B->count != o->count)
        return ferry_errorf(FERRY_ERR_SHAPE,
                            "optimizer step: %s has %d parameters over %lld floats, the optimizer "
                            "was created for %d over %lld",
                            what, B ? B->count : 0, B ? (long long)B->numel : 0LL, o->count,
                            (long long)o->numel);
    for (int i = 0; i < o->count; i++) {
        int64_t R = (B->items[i].flags & FERRY_PARAM_ROW_SPARSE) ? B->items[i].shape.dim[0] : 0;
        if (R != o->table_rows[i])
            return ferry_errorf(FERRY_ERR_SHAPE,
                                "optimizer step: %s parameter '%s' differs in "
                                "row sparsity or rows from the optimizer's block",
                                what, B->items[i].name);
    }
    return FERRY_OK;
}

/* Validates every row gradient of G before anything is updated. */
static ferry_status check_rows(const ferry_params *P, const ferry_grads *G) {
    for (int i = 0; i < P->count; i++) {
        const ferry_param *p = &P->items[i];
        if (!G->touched[i] || !(p->flags & FERRY_PARAM_ROW_SPARSE))
            continue;
        const ferry_rowgrad *rg = &G->rows[i];
        int64_t R = p->shape.dim[0], D = p->shape.dim[1];
        if (rg->count > 0 && rg->D != D)
            return ferry_errorf(FERRY_ERR_SHAPE,
                                "optimizer step: row gradient of '%s' is %lld wide, the table %lld",
                                p->name, (long long)rg->D, (long long)D);
        for (int64_t k = 0; k < rg->count; k++)
            if (rg->rows[k] < 0 || rg->rows[k] >= R)
                return ferry_errorf(FERRY_ERR_RANGE,
                                    "optimizer step: '%s' row %lld outside [0, %lld)", p->name,
                                    (long long)rg->rows[k], (long long)R);
    }
    return FERRY_OK;
}

ferry_status ferry_optim_step(ferry_optim *o, ferry_params *P, const ferry_grads *G,
                              float grad_scale) {
    ferry_status st;
    if (!isfinite(grad_scale) || grad_scale < 0.0f)
        return ferry_errorf(FERRY_ERR_NUMERIC, "optimizer step: gradient scale %g",
                            (double)grad_scale);
    if (P->be != o->be || P->data == NULL || G->P == NULL || G->P->be != o->be)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "optimizer step: block or gradients not allocated, or on another "
                            "backend");
    if ((st = check_layout(o, P, "the block")) != FERRY_OK ||
        (st = check_layout(o, G->P, "the gradient's block")) != FERRY_OK ||
        (st = check_rows(P, G)) != FERRY_OK)
        return st;

    o->step++;
    ferry_optim_update u;
    memset(&u, 0, sizeof u);
    u.kind = o->cfg.kind;
    u.lr = o->cfg.lr;
    u.weight_decay = o->cfg.weight_decay;
    u.grad_scale = grad_scale;
    u.momentum = o->cfg.momentum;
    u.dampening = o->cfg.dampening;
    u.nesterov = o->cfg.nesterov;
    u.lr_decay = o->cfg.lr_decay;
    u.rho = o->cfg.rho;
    u.beta1 = o->cfg.beta1;
    u.beta2 = o->cfg.beta2;
    u.eps = o->cfg.eps;
    u.step = o->step;
    for (int i = 0; i < P->count; i++) {
        if (!G->touched[i])
            continue;
        const ferry_param *p = &P->items[i];
        int64_t off = p->offset;
        u.param = P->data + off;
        u.slot0 = o->slot[0] ? o->slot[0] + off : NULL;
        u.slot1 = o->slot[1] ? o->slot[1] + off : NULL;
        if (p->flags & FERRY_PARAM_ROW_SPARSE) {
            const ferry_rowgrad *rg = &G->rows[i];
            u.rows = rg->rows;
            u.nrows = rg->count;
            u.D = p->shape.dim[1];
            u.grad = rg->values;
            u.row_seen = has_momentum_flags(o) ? o->row_seen[i] : NULL;
            u.n = 0;
            u.buf_fresh = 0;
        } else {
            u.rows = NULL;
            u.nrows = u.D = 0;
            u.row_seen = NULL;
            u.n = p->numel;
            u.grad = G->dense + off;
            u.buf_fresh = has_momentum_flags(o) && !o->seen[i];
        }
        if ((st = ferry_backend_optim_update(o->be, &u)) != FERRY_OK)
            return st;
        if (u.buf_fresh)
            o->seen[i] = 1;
    }
    return FERRY_OK;
}

/* ---- checkpoints ---- */

#define STATE_MAGIC   "FERRYOPT"
#define STATE_VERSION 1u
#define CHUNK_BYTES   ((size_t)1 << 20)

/* The header, written field by field in this order (host byte order). */
typedef struct state_header {
    char magic[8];
    uint32_t version, kind;
    int64_t numel, count, step;
    double lr;
    uint32_t nslots, flags; /* flags: 1 = SGD momentum flags follow the slots */
    int64_t flag_bytes;
} state_header;

#define HEADER_BYTES (8 + 2 * 4 + 3 * 8 + 8 + 2 * 4 + 8)

static int64_t flag_bytes(const ferry_optim *o) {
    if (!has_momentum_flags(o))
        return 0;
    int64_t n = o->count;
    for (int i = 0; i < o->count; i++)
        n += o->table_rows[i];
    return n;
}

size_t ferry_optim_state_size(const ferry_optim *o) {
    return HEADER_BYTES + (size_t)o->nslots * (size_t)o->numel * sizeof(float) +
           (size_t)flag_bytes(o);
}

static ferry_status write_all(FILE *f, const void *p, size_t n) {
    if (n > 0 && fwrite(p, 1, n, f) != n)
        return ferry_errorf(FERRY_ERR_IO, "optimizer state: write failed: %s", strerror(errno));
    return FERRY_OK;
}

static ferry_status read_all(FILE *f, void *p, size_t n, const char *what) {
    if (n > 0 && fread(p, 1, n, f) != n)
        return ferry_errorf(ferror(f) ? FERRY_ERR_IO : FERRY_ERR_FORMAT, "optimizer state: %s (%s)",
                            ferror(f) ? "read failed" : "file truncated", what);
    return FERRY_OK;
}

/* Copies n bytes of backend memory at src to the file, through a bounce buffer when
 * the backend is not host memory. */
static ferry_status save_backend(const ferry_optim *o, FILE *f, const void *src, size_t n) {
    if (ferry_backend_is_host(o->be))
        return write_all(f, src, n);
    char *buf = malloc(CHUNK_BYTES);
    if (buf == NULL)
        return FERRY_NOMEM();
    ferry_status st = FERRY_OK;
    for (size_t at = 0; at < n && st == FERRY_OK; at += CHUNK_BYTES) {
        size_t len = n - at < CHUNK_BYTES ? n - at : CHUNK_BYTES;
        st = ferry_backend_copy(o->be, buf, (const char *)src + at, len, FERRY_COPY_DEVICE_TO_HOST);
        if (st == FERRY_OK)
            st = write_all(f, buf, len);
    }
    free(buf);
    return st;
}

static ferry_status load_backend(ferry_optim *o, FILE *f, void *dst, size_t n, const char *what) {
    if (ferry_backend_is_host(o->be))
        return read_all(f, dst, n, what);
    char *buf = malloc(CHUNK_BYTES);
    if (buf == NULL)
        return FERRY_NOMEM();
    ferry_status st = FERRY_OK;
    for (size_t at = 0; at < n && st == FERRY_OK; at += CHUNK_BYTES) {
        size_t len = n - at < CHUNK_BYTES ? n - at : CHUNK_BYTES;
        st = read_all(f, buf, len, what);
        if (st == FERRY_OK)
            st = ferry_backend_copy(o->be, (char *)dst + at, buf, len, FERRY_COPY_HOST_TO_DEVICE);
    }
    free(buf);
    return st;
}

static void header_of(const ferry_optim *o, state_header *h) {
    memset(h, 0, sizeof *h);
    memcpy(h->magic, STATE_MAGIC, 8);
    h->version = STATE_VERSION;
    h->kind = (uint32_t)o->cfg.kind;
    h->numel = o->numel;
    h->count = o->count;
    h->step = o->step;
    h->lr = o->cfg.lr;
    h->nslots = (uint32_t)o->nslots;
    h->flags = has_momentum_flags(o) ? 1u : 0u;
    h->flag_bytes = flag_bytes(o);
}

ferry_status ferry_optim_state_save(const ferry_optim *o, FILE *f) {
    state_header h;
    header_of(o, &h);
    ferry_status st;
    if ((st = write_all(f, h.magic, 8)) != FERRY_OK ||
        (st = write_all(f, &h.version, 4)) != FERRY_OK ||
        (st = write_all(f, &h.kind, 4)) != FERRY_OK ||
        (st = write_all(f, &h.numel, 8)) != FERRY_OK ||
        (st = write_all(f, &h.count, 8)) != FERRY_OK ||
        (st = write_all(f, &h.step, 8)) != FERRY_OK || (st = write_all(f, &h.lr, 8)) != FERRY_OK ||
        (st = write_all(f, &h.nslots, 4)) != FERRY_OK ||
        (st = write_all(f, &h.flags, 4)) != FERRY_OK ||
        (st = write_all(f, &h.flag_bytes, 8)) != FERRY_OK)
        return st;
    for (int k = 0; k < o->nslots; k++)
        if ((st = save_backend(o, f, o->slot[k], (size_t)o->numel * sizeof(float))) != FERRY_OK)
            return st;
    if (!has_momentum_flags(o))
        return FERRY_OK;
    if ((st = write_all(f, o->seen, (size_t)o->count)) != FERRY_OK)
        return st;
    for (int i = 0; i < o->count; i++)
        if (o->table_rows[i] > 0 &&
            (st = save_backend(o, f, o->row_seen[i], (size_t)o->table_rows[i])) != FERRY_OK)
            return st;
    return FERRY_OK;
}

/* "adam", or "sgd with momentum" when the flags distinguish it. */
static const char *describe(uint32_t kind, uint32_t nslots) {
    if (kind == FERRY_OPTIM_SGD)
        return nslots ? "sgd with momentum" : "sgd";
    return ferry_optim_kind_name((ferry_optim_kind)kind);
}

ferry_status ferry_optim_copy_rows(ferry_optim *dst, const ferry_params *P_dst,
                                   const ferry_optim *src, const ferry_params *P_src, int item,
                                   int64_t dst_row, int64_t src_row, int64_t n) {
    if (dst->cfg.kind != src->cfg.kind || dst->nslots != src->nslots ||
        has_momentum_flags(dst) != has_momentum_flags(src))
        return ferry_errorf(FERRY_ERR_SHAPE, "optimizer rows: %s state into %s state",
                            describe((uint32_t)src->cfg.kind, (uint32_t)src->nslots),
                            describe((uint32_t)dst->cfg.kind, (uint32_t)dst->nslots));
    if (P_dst->numel != dst->numel || P_dst->count != dst->count || P_src->numel != src->numel ||
        P_src->count != src->count || item < 0 || item >= dst->count || item >= src->count)
        return ferry_errorf(FERRY_ERR_SHAPE,
                            "optimizer rows: parameter %d, or a block without its optimizer's "
                            "layout",
                            item);
    const ferry_param *pd = &P_dst->items[item], *ps = &P_src->items[item];
    int64_t rd = pd->shape.ndim > 0 ? pd->shape.dim[0] : 1;
    int64_t rs = ps->shape.ndim > 0 ? ps->shape.dim[0] : 1;
    int64_t width = rd > 0 ? pd->numel / rd : 0;
    if (rs <= 0 || rd <= 0 || ps->numel / rs != width ||
        (dst->table_rows[item] > 0) != (src->table_rows[item] > 0))
        return ferry_errorf(FERRY_ERR_SHAPE,
                            "optimizer rows: parameter '%s' is %lld x %lld here, %lld x %lld in "
                            "the source",
                            pd->name, (long long)rd, (long long)width, (long long)rs,
                            (long long)(ps->numel / rs));
    if (n < 0 || dst_row < 0 || src_row < 0 || dst_row > rd - n || src_row > rs - n)
        return ferry_errorf(FERRY_ERR_RANGE,
                            "optimizer rows: %lld rows from row %lld of %lld into row %lld of "
                            "%lld",
                            (long long)n, (long long)src_row, (long long)rs, (long long)dst_row,
                            (long long)rd);
    size_t bytes = (size_t)(n * width) * sizeof(float);
    ferry_status st = FERRY_OK;
    for (int k = 0; k < dst->nslots && st == FERRY_OK && n > 0; k++)
        st = ferry_backend_copy(dst->be, dst->slot[k] + pd->offset + dst_row * width,
                                src->slot[k] + ps->offset + src_row * width, bytes,
                                FERRY_COPY_DEVICE_TO_DEVICE);
    if (st == FERRY_OK && has_momentum_flags(dst)) {
        dst->seen[item] = src->seen[item];
        if (dst->table_rows[item] > 0 && n > 0)
            st = ferry_backend_copy(dst->be, dst->row_seen[item] + dst_row,
                                    src->row_seen[item] + src_row, (size_t)n,
                                    FERRY_COPY_DEVICE_TO_DEVICE);
    }
    if (st == FERRY_OK) {
        dst->step = src->step;
        dst->cfg.lr = src->cfg.lr;
    }
    return st;
}

static ferry_status read_header(FILE *f, state_header *h) {
    ferry_status st;
    if ((st = read_all(f, h->magic, 8, "header")) != FERRY_OK)
        return st;
    if (memcmp(h->magic, STATE_MAGIC, 8) != 0)
        return ferry_errorf(FERRY_ERR_FORMAT, "not an optimizer state (bad magic)");
    if ((st = read_all(f, &h->version, 4, "header")) != FERRY_OK ||
        (st = read_all(f, &h->kind, 4, "header")) != FERRY_OK ||
        (st = read_all(f, &h->numel, 8, "header")) != FERRY_OK ||
        (st = read_all(f, &h->count, 8, "header")) != FERRY_OK ||
        (st = read_all(f, &h->step, 8, "header")) != FERRY_OK ||
        (st = read_all(f, &h->lr, 8, "header")) != FERRY_OK ||
        (st = read_all(f, &h->nslots, 4, "header")) != FERRY_OK ||
        (st = read_all(f, &h->flags, 4, "header")) != FERRY_OK ||
        (st = read_all(f, &h->flag_bytes, 8, "header")) != FERRY_OK)
        return st;
    if (h->version != STATE_VERSION)
        return ferry_errorf(FERRY_ERR_FORMAT, "optimizer state version %u, this build reads %u",
                            h->version, STATE_VERSION);
    if (h->kind >= (uint32_t)KIND_COUNT || h->nslots > 2 || h->step < 0 || !isfinite(h->lr) ||
        h->lr < 0.0)
        return ferry_errorf(FERRY_ERR_FORMAT, "optimizer state: corrupt header");
    return FERRY_OK;
}

ferry_status ferry_optim_state_load(ferry_optim *o, FILE *f) {
    state_header h, want;
    ferry_status st = read_header(f, &h);
    if (st != FERRY_OK)
        return st;
    header_of(o, &want);
    if (h.kind != want.kind || h.numel != want.numel || h.nslots != want.nslots)
        return ferry_errorf(FERRY_ERR_EXISTS,
                            "checkpoint optimizer is %s over %lld floats, this model needs %s "
                            "over %lld",
                            describe(h.kind, h.nslots), (long long)h.numel,
                            describe(want.kind, want.nslots), (long long)want.numel);
    if (h.count != want.count || h.flags != want.flags || h.flag_bytes != want.flag_bytes)
        return ferry_errorf(FERRY_ERR_EXISTS,
                            "checkpoint optimizer state covers %lld parameters (%lld flag bytes), "
                            "this model has %lld (%lld)",
                            (long long)h.count, (long long)h.flag_bytes, (long long)want.count,
                            (long long)want.flag_bytes);
    for (int k = 0; k < o->nslots; k++)
        if ((st = load_backend(o, f, o->slot[k], (size_t)o->numel * sizeof(float), "slots")) !=
            FERRY_OK)
            return st;
    if (has_momentum_flags(o)) {
        if ((st = read_all(f, o->seen, (size_t)o->count, "momentum flags")) != FERRY_OK)
            return st;
        for (int i = 0; i < o->count; i++)
            if (o->table_rows[i] > 0 &&
                (st = load_backend(o, f, o->row_seen[i], (size_t)o->table_rows[i],
                                   "row momentum flags")) != FERRY_OK)
                return st;
    }
    o->step = h.step;
    o->cfg.lr = h.lr;
    return FERRY_OK;
}
