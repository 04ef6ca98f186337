/* registry.c - the modules a ferry-ps hosts, by name. CreateModule is idempotent:
 * the request's ModuleConfig is normalised (defaults applied) and compared field by
 * field with the existing module's, so a trainer that reconnects finds its shards
 * untouched, and a conflicting one gets ALREADY_EXISTS naming the first differing
 * field. A new module gets its parameter block, initial values and optimizer here. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/core/checked.h"
#include "common/core/log.h"
#include "common/nn/constraint.h" /* ferry_stiefel_polar */
#include "ferry/nn.h" /* FERRY_LSTM_MAX_LAYERS */
#include "server/ps-impl.h"

/* ---- configuration ---- */

/* The server's implementation of each kind of the wire contract. */
static const ferry__ps_kind *kind_find(const char *name) {
    static const ferry__ps_kind *const kinds[FERRY_WIRE_KIND_COUNT] = {
#define KIND_(id, name, dims, rows, place, bias, stiefel, local_rows) &ferry__ps_kind_##name,
        FERRY_WIRE_KIND_MAP(KIND_)
#undef KIND_
    };
    int k = ferry_wire_kind_find(name);
    return k >= 0 ? kinds[k] : NULL;
}

/* The optimizer message, field by field from FERRY_OPTIM_FIELD_MAP: start from the
 * kind's defaults; a proto field of a config field's name overrides it when non-zero
 * (0 means "the default"); then `extra` entries named after config fields set exact
 * values (0 included). "momentum" as a name is SGD. */
static ferry_status optim_from_proto(const Ferry__V1__OptimizerConfig *o, ferry_optim_config *out) {
    const char *name = o != NULL && o->name[0] != '\0' ? o->name : "sgd";
    ferry_optim_kind kind;
    ferry_status st = ferry_optim_parse_kind(strcmp(name, "momentum") == 0 ? "sgd" : name, &kind);
    if (st != FERRY_OK)
        return st;
    ferry_optim_config c = ferry_optim_defaults(kind);
    for (int i = 0; o != NULL && i < FERRY_OPTIM_FIELD_COUNT; i++) {
        double v;
        if (ferry__proto_get_number(&o->base, ferry_optim_fields[i].name, &v) && v != 0.0)
            ferry_optim_field_set(&c, i, v);
    }
    for (size_t k = 0; o != NULL && k < o->n_extra; k++) {
        int i = ferry_optim_field_find(o->extra[k]->name);
        if (i < 0)
            return ferry_errorf(FERRY_ERR_INVALID, "optimizer: unknown extra '%s'",
                                o->extra[k]->name);
        ferry_optim_field_set(&c, i, o->extra[k]->value);
    }
    if ((st = ferry_optim_config_check(&c)) != FERRY_OK)
        return st;
    *out = c;
    return FERRY_OK;
}

/* The kind's own message (read through the contract, common/rpc/contract.h) into
 * c->kind, c->dims (in the order of the kind's row), bias by the row's rule, and the
 * fields a kind's message may carry: a Stiefel constraint, lstm's layers and dropout. */
static ferry_status kind_from_proto(const char *name, const Ferry__V1__ModuleConfig *p,
                                    ferry__ps_module_config *c) {
    ferry_wire_kind_config k;
    ferry_status st = ferry__wire_kind_config_read(&p->base, &k);
    if (st != FERRY_OK) {
        char why[256];
        (void)snprintf(why, sizeof why, "%s", ferry_error_last());
        return ferry_errorf(st, "module '%s': %s", name, why);
    }
    const char *kind = ferry_wire_kinds[k.kind].name;
    (void)snprintf(c->kind, sizeof c->kind, "%s", kind);
    c->dims[0] = k.dims[0];
    c->dims[1] = k.dims[1];
    int bias = ferry_wire_kinds[k.kind].bias;
    c->bias = bias == FERRY_WIRE_BIAS_ALWAYS || (bias == FERRY_WIRE_BIAS_OPTIONAL && !k.no_bias);
    if (k.has & FERRY_WIRE_CFG_LAYERS) {
        c->layers = k.layers > 0 ? (int)k.layers : 1;
        c->first_layer = k.first_layer <= FERRY_LSTM_MAX_LAYERS ? (int)k.first_layer : -1;
        c->dropout_ppm = k.dropout_ppm;
        if (k.layers > FERRY_LSTM_MAX_LAYERS || c->first_layer < 0 ||
            c->first_layer + c->layers > FERRY_LSTM_MAX_LAYERS)
            return ferry_errorf(FERRY_ERR_INVALID,
                                "module '%s': %s layers %u from layer %u outside 0..%d", name, kind,
                                k.layers, k.first_layer, FERRY_LSTM_MAX_LAYERS - 1);
        if (k.dropout_ppm >= 1000000)
            return ferry_errorf(FERRY_ERR_INVALID,
                                "module '%s': %s dropout_ppm %u outside [0, 10^6)", name, kind,
                                k.dropout_ppm);
    }
    if (k.stiefel) {
        if (!isfinite(k.beta) || k.beta < 0.0 || k.beta > 1e6)
            return ferry_errorf(FERRY_ERR_INVALID,
                                "module '%s': Stiefel penalty weight beta %g must be in [0, 1e6]",
                                name, k.beta);
        c->constraint = FERRY_CONSTRAINT_STIEFEL;
        c->beta = k.beta;
        c->polar = k.polar;
    }
    if (c->dims[0] < 1 || c->dims[1] < 1 || c->dims[0] > INT32_MAX || c->dims[1] > INT32_MAX)
        st = ferry_errorf(FERRY_ERR_INVALID, "module '%s': %s sizes %lld x %lld outside [1, 2^31)",
                          name, kind, (long long)c->dims[0], (long long)c->dims[1]);
    return st;
}

static ferry_status config_normalize(const char *name, const Ferry__V1__ModuleConfig *p,
                                     ferry__ps_module_config *c) {
    ferry_status st;
    memset(c, 0, sizeof *c);
    if (p == NULL)
        return ferry_errorf(FERRY_ERR_INVALID, "module '%s': CreateModule without a config", name);
    if ((st = kind_from_proto(name, p, c)) != FERRY_OK)
        return st;
    const ferry__ps_kind *kind = kind_find(c->kind);
    /* Global rows (the contract's row for the kind: an lstm module is one row, its
     * packed layers). */
    int64_t R = ferry_wire_kind_rows(kind->wire, c->dims);
    /* row_begin and row_count come from the wire: checked without forming a sum
     * that could overflow. row_count 0 means "to the end". */
    c->row_begin = p->row_begin;
    c->row_count = p->row_count;
    if (c->row_count == 0 && c->row_begin >= 0 && c->row_begin <= R)
        c->row_count = R - c->row_begin;
    if (c->row_count < 1 || !ferry_checked_range(c->row_begin, c->row_count, 0, R))
        return ferry_errorf(FERRY_ERR_RANGE,
                            "module '%s': rows (begin %lld, count %lld) outside [0, %lld)", name,
                            (long long)c->row_begin, (long long)c->row_count, (long long)R);
    const Ferry__V1__Init *in = p->init;
    c->init_seed = in != NULL ? in->seed : 0;
    double scale = in != NULL ? in->scale : 0.0;
    c->init_scale = scale != 0.0 ? scale : 0.1;
    if (!(c->init_scale > 0.0) || !isfinite(c->init_scale))
        return ferry_errorf(FERRY_ERR_INVALID, "module '%s': init.scale %g", name, scale);
    int64_t cols = ferry_wire_kind_cols(kind->wire, c->dims);
    c->bias_offset = (R * cols + 15) & ~(int64_t)15; /* as ferry_params_add lays it out */
    if (in != NULL && in->weight_offset != NULL)
        c->weight_offset = in->weight_offset->value;
    if (in != NULL && in->bias_offset != NULL)
        c->bias_offset = in->bias_offset->value;
    if (c->weight_offset < 0 || c->bias_offset < 0)
        return ferry_errorf(FERRY_ERR_INVALID, "module '%s': init offsets must be >= 0", name);
    st = optim_from_proto(p->optimizer, &c->optim);
    if (st != FERRY_OK) {
        char why[256]; /* ferry_error_last is the buffer ferry_errorf writes: copy it */
        (void)snprintf(why, sizeof why, "%s", ferry_error_last());
        return ferry_errorf(st, "module '%s': %s", name, why);
    }
    return FERRY_OK;
}

static int diff_str(char *buf, size_t cap, const char *label, const char *a, const char *b) {
    (void)snprintf(buf, cap, "%s '%s' (existing) vs '%s' (requested)", label, a, b);
    return 1;
}

static int diff_int(char *buf, size_t cap, const char *label, long long a, long long b) {
    (void)snprintf(buf, cap, "%s %lld (existing) vs %lld (requested)", label, a, b);
    return 1;
}

static int diff_num(char *buf, size_t cap, const char *label, double a, double b) {
    (void)snprintf(buf, cap, "%s %.9g (existing) vs %.9g (requested)", label, a, b);
    return 1;
}

int ferry__ps_config_diff(const ferry__ps_module_config *a, const ferry__ps_module_config *b,
                          char *buf, size_t cap) {
#define DIFF_S(f, label)                                                                           \
    if (strcmp(a->f, b->f) != 0)                                                                   \
        return diff_str(buf, cap, label, a->f, b->f);
#define DIFF_I(f, label)                                                                           \
    if (a->f != b->f)                                                                              \
        return diff_int(buf, cap, label, (long long)a->f, (long long)b->f);
#define DIFF_F(f, label)                                                                           \
    if (a->f != b->f)                                                                              \
        return diff_num(buf, cap, label, (double)a->f, (double)b->f);
    DIFF_S(kind, "kind")
    DIFF_I(dims[0], "dims[0]")
    DIFF_I(dims[1], "dims[1]")
    DIFF_I(row_begin, "row_begin")
    DIFF_I(row_count, "row_count")
    DIFF_I(init_seed, "init_seed")
    DIFF_F(init_scale, "init_scale")
    DIFF_I(bias, "bias")
    DIFF_I(weight_offset, "weight_offset")
    DIFF_I(bias_offset, "bias_offset")
    if (a->constraint != b->constraint)
        return diff_str(buf, cap, "constraint.kind",
                        a->constraint == FERRY_CONSTRAINT_STIEFEL ? "stiefel" : "none",
                        b->constraint == FERRY_CONSTRAINT_STIEFEL ? "stiefel" : "none");
    DIFF_F(beta, "constraint.beta")
    DIFF_I(polar, "polar")
    DIFF_I(layers, "layers")
    DIFF_I(first_layer, "first_layer")
    DIFF_I(dropout_ppm, "dropout_ppm")
    if (a->optim.kind != b->optim.kind)
        return diff_str(buf, cap, "optimizer", ferry_optim_kind_name(a->optim.kind),
                        ferry_optim_kind_name(b->optim.kind));
    for (int i = 0; i < FERRY_OPTIM_FIELD_COUNT; i++) {
        double x = ferry_optim_field_get(&a->optim, i), y = ferry_optim_field_get(&b->optim, i);
        if (x != y) {
            char label[64];
            (void)snprintf(label, sizeof label, "optimizer.%s", ferry_optim_fields[i].name);
            return diff_num(buf, cap, label, x, y);
        }
    }
#undef DIFF_S
#undef DIFF_I
#undef DIFF_F
    return 0;
}

/* ---- modules ---- */

static void module_destroy(ferry__ps_module *m) {
    if (m == NULL)
        return;
    if (m->reg != NULL) { /* its bytes go back to the model budget */
        pthread_mutex_lock(&m->reg->mu);
        m->reg->bytes -= m->bytes;
        pthread_mutex_unlock(&m->reg->mu);
    }
    if (m->quota != NULL) { /* and to its owner's share */
        atomic_fetch_sub(&m->quota->modules, 1);
        atomic_fetch_sub(&m->quota->model_bytes, m->bytes);
    }
    if (m->kind != NULL && m->kind->destroy != NULL)
        m->kind->destroy(m);
    ferry_optim_destroy(m->opt);
    ferry_params_deinit(&m->P);
    pthread_rwlock_destroy(&m->lock);
    free(m->config_packed);
    free(m);
}

/* U(-scale, scale) from (seed, element index), exactly as ferry_params_init_uniform
 * draws a block whose weight starts at weight_offset and bias at bias_offset: the
 * shard's rows get the values the unsharded parameter would have. */
static void module_init_uniform(ferry__ps_module *m) {
    const ferry__ps_module_config *c = &m->cfg;
    float scale = (float)c->init_scale;
    float *W = ferry_params_data(&m->P, m->w); /* (rows, cols) */
    /* Unsigned: any weight_offset/bias_offset a request gives wraps, never overflows. */
    for (int64_t r = 0; r < m->rows; r++) {
        uint64_t base =
            (uint64_t)c->weight_offset + (uint64_t)(c->row_begin + r) * (uint64_t)m->cols;
        for (int64_t j = 0; j < m->cols; j++)
            W[r * m->cols + j] =
                (2.0f * ferry_rand_uniform(c->init_seed, base + (uint64_t)j) - 1.0f) * scale;
    }
    if (m->b >= 0) {
        float *b = ferry_params_data(&m->P, m->b); /* (rows) */
        for (int64_t r = 0; r < m->rows; r++)
            b[r] = (2.0f * ferry_rand_uniform(c->init_seed, (uint64_t)c->bias_offset +
                                                                (uint64_t)(c->row_begin + r)) -
                    1.0f) *
                   scale;
    }
}

/* Initial values sent with CreateModule: tensors named after parameters, each of
 * the shard's exact shape. */
static ferry_status module_set_initial(ferry__ps_module *m, const ferry_rpc_msg *req) {
    for (int i = 0; i < req->ntensors; i++) {
        const ferry_rpc_tensor *t = &req->tensors[i];
        int p = ferry_params_find(&m->P, t->name);
        if (p < 0)
            return ferry_errorf(FERRY_ERR_NOT_FOUND, "%s '%s' has no parameter '%s'",
                                ferry__ps_kind_name(m->kind), m->name, t->name);
        const ferry_param *pp = &m->P.items[p];
        int64_t want[2] = {pp->shape.dim[0], pp->shape.ndim > 1 ? pp->shape.dim[1] : 0};
        int idx;
        ferry_status st =
            ferry__ps_input_as(m, req, t->name, FERRY_RPC_DTYPE_F32, pp->shape.ndim, want, &idx);
        /* The check found the first tensor of that name: a second one (perhaps of
         * another size) is refused, never copied unchecked. */
        if (st == FERRY_OK && idx != i)
            st = ferry_errorf(FERRY_ERR_INVALID, "%s '%s': initial tensor '%s' sent twice",
                              ferry__ps_kind_name(m->kind), m->name, t->name);
        if (st == FERRY_OK)
            st = ferry__ps_check_finite(m, t->name, t->data, pp->numel);
        if (st != FERRY_OK)
            return st;
        memcpy(ferry_params_data(&m->P, p), t->data, t->nbytes);
    }
    return FERRY_OK;
}

/* Weights and optimizer slots of a declared (not yet allocated) module, checked
 * against the per-module budget and what is left of the model budget. Registry
 * lock held. */
static ferry_status module_budget(ferry__ps_registry *r, ferry__ps_module *m) {
    int64_t per = (int64_t)(1 + ferry_optim_slots(&m->cfg.optim)) * (int64_t)sizeof(float), bytes;
    if (!ferry_checked_mul(m->P.numel, per, &bytes))
        bytes = INT64_MAX;
    int whole = bytes > r->lim->module_bytes;
    if (!whole && bytes <= r->lim->model_bytes - r->bytes) {
        m->bytes = bytes;
        return FERRY_OK;
    }
    char what[FERRY_RPC_NAME_MAX + 64];
    (void)snprintf(what, sizeof what, "%s '%s' (weights + optimizer state)",
                   ferry__ps_kind_name(m->kind), m->name);
    return whole ? ferry__ps_over_budget(what, bytes, "the per-module budget", r->lim->module_bytes,
                                         0, "--max-module-mb")
                 : ferry__ps_over_budget(what, bytes, "the budget of all modules",
                                         r->lim->model_bytes, r->bytes, "--max-model-mb");
}

static ferry_status module_build(ferry__ps_registry *r, const char *name,
                                 const ferry__ps_module_config *c, const Ferry__V1__ModuleConfig *proto,
                                 const ferry_rpc_msg *req, ferry__ps_module **out) {
    ferry__ps_module *m = calloc(1, sizeof *m);
    if (m == NULL)
        return FERRY_NOMEM();
    memcpy(m->name, name, strlen(name) + 1);
    m->cfg = *c;
    m->kind = kind_find(c->kind);
    ferry_params_init(&m->P, ferry_backend_cpu());
    /* Writer-preferring, so that a stream of Forward/Backward calls from many
     * trainers cannot starve Step (glibc's default prefers readers). */
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&m->lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    ferry_status st;
    m->config_len = protobuf_c_message_get_packed_size(&proto->base);
    if ((m->config_packed = malloc(m->config_len ? m->config_len : 1)) == NULL) {
        st = FERRY_NOMEM();
        goto fail;
    }
    (void)protobuf_c_message_pack(&proto->base, m->config_packed);
    m->lim = r->lim;
    if ((st = m->kind->declare(m)) != FERRY_OK || (st = module_budget(r, m)) != FERRY_OK ||
        (st = ferry_params_alloc(&m->P)) != FERRY_OK)
        goto fail;
    module_init_uniform(m);
    /* polar=1: start on the manifold as cdopt does (W <- U V^T of its thin SVD, so
     * A(W) = W and the penalty is 0), unless the request sends the weight, which is
     * then used exactly as given. */
    if (c->polar && ferry_rpc_msg_find(req, FERRY_WIRE_PARAM_NAME(WEIGHT)) == NULL &&
        (st = m->kind->polar != NULL
                  ? m->kind->polar(m)
                  : ferry_stiefel_polar(m->rows, m->cols, ferry_params_data(&m->P, m->w))) !=
            FERRY_OK)
        goto fail;
    if ((st = module_set_initial(m, req)) != FERRY_OK)
        goto fail;
    if ((st = ferry_optim_create(&m->P, &c->optim, &m->opt)) != FERRY_OK)
        goto fail;
    *out = m;
    return FERRY_OK;
fail:
    module_destroy(m);
    return st;
}

static ferry_status check_name(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n >= FERRY_RPC_NAME_MAX)
        return ferry_errorf(FERRY_ERR_INVALID, "module name must have 1..%d bytes",
                            FERRY_RPC_NAME_MAX - 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (!isalnum(ch) && ch != '_' && ch != '-' && ch != '.' && ch != ':' && ch != '/')
            return ferry_errorf(FERRY_ERR_INVALID,
                                "module name '%s' has a character outside [A-Za-z0-9_.:/-]", name);
    }
    return FERRY_OK;
}

/* ---- the registry ---- */

void ferry__ps_registry_init(ferry__ps_registry *r, const ferry__ps_limits *lim) {
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    r->lim = lim;
}

void ferry__ps_registry_deinit(ferry__ps_registry *r) {
    for (int i = 0; i < r->count; i++) {
        r->mods[i]->reg = NULL; /* the registry goes first: no budget to give back to */
        ferry__ps_module_put(r->mods[i]);
    }
    free(r->mods);
    pthread_mutex_destroy(&r->mu);
    memset(r, 0, sizeof *r);
}

static ferry__ps_module *find_locked(ferry__ps_registry *r, const char *name) {
    for (int i = 0; i < r->count; i++) {
        if (strcmp(r->mods[i]->name, name) == 0)
            return r->mods[i];
    }
    return NULL;
}

void ferry__ps_module_ref(ferry__ps_module *m) {
    atomic_fetch_add(&m->refs, 1);
}

void ferry__ps_module_put(ferry__ps_module *m) {
    if (m != NULL && atomic_fetch_sub(&m->refs, 1) == 1)
        module_destroy(m);
}

ferry__ps_module *ferry__ps_registry_find(ferry__ps_registry *r, const char *name) {
    pthread_mutex_lock(&r->mu);
    ferry__ps_module *m = find_locked(r, name);
    if (m != NULL)
        ferry__ps_module_ref(m);
    pthread_mutex_unlock(&r->mu);
    if (m == NULL)
        (void)ferry_errorf(FERRY_ERR_NOT_FOUND, "unknown module '%s'", name);
    return m;
}

ferry__ps_module **ferry__ps_registry_list(ferry__ps_registry *r, int *n) {
    pthread_mutex_lock(&r->mu);
    ferry__ps_module **out = r->count > 0 ? malloc((size_t)r->count * sizeof *out) : NULL;
    *n = out != NULL ? r->count : 0;
    for (int i = 0; i < *n; i++) {
        out[i] = r->mods[i];
        ferry__ps_module_ref(out[i]);
    }
    pthread_mutex_unlock(&r->mu);
    return out;
}

void ferry__ps_registry_list_free(ferry__ps_module **mods, int n) {
    for (int i = 0; i < n; i++)
        ferry__ps_module_put(mods[i]);
    free(mods);
}

ferry_status ferry__ps_registry_delete(ferry__ps_registry *r, ferry__ps_module *m, int64_t *bytes) {
    pthread_mutex_lock(&r->mu);
    int i = 0;
    while (i < r->count && r->mods[i] != m)
        i++;
    if (i == r->count) {
        pthread_mutex_unlock(&r->mu);
        return ferry_errorf(FERRY_ERR_NOT_FOUND, "module '%s' was deleted already", m->name);
    }
    memmove(&r->mods[i], &r->mods[i + 1], (size_t)(r->count - i - 1) * sizeof *r->mods);
    r->count--;
    *bytes = m->bytes;
    pthread_mutex_unlock(&r->mu);
    FERRY_LOG_INFO("deleted %s '%s' of '%s' (%.1f MiB once its last user is done)",
                   ferry__ps_kind_name(m->kind), m->name, m->owner, (double)m->bytes / 1048576.0);
    ferry__ps_module_put(m); /* the registry's reference */
    return FERRY_OK;
}

int ferry__ps_registry_count(ferry__ps_registry *r) {
    pthread_mutex_lock(&r->mu);
    int n = r->count;
    pthread_mutex_unlock(&r->mu);
    return n;
}

ferry_status ferry__ps_module_charge(ferry__ps_module *m, int64_t bytes, const char *what) {
    ferry__ps_registry *r = m->reg;
    if (r == NULL || bytes <= 0)
        return FERRY_OK;
    char name[FERRY_RPC_NAME_MAX + 96];
    (void)snprintf(name, sizeof name, "%s '%s' (%s)", ferry__ps_kind_name(m->kind), m->name, what);
    pthread_mutex_lock(&r->mu);
    if (bytes > r->lim->model_bytes - r->bytes) {
        ferry_status st = ferry__ps_over_budget(name, bytes, "the budget of all modules",
                                                r->lim->model_bytes, r->bytes, "--max-model-mb");
        pthread_mutex_unlock(&r->mu);
        return st;
    }
    ferry_status st =
        m->quota == NULL
            ? FERRY_OK
            : ferry__ps_quota_charge(&m->quota->model_bytes, bytes, r->lim->id_model_bytes, name,
                                     m->quota->identity, "--max-model-mb-per-identity");
    if (st == FERRY_OK) {
        r->bytes += bytes;
        m->bytes += bytes;
    }
    pthread_mutex_unlock(&r->mu);
    return st;
}

/* A new module into its owner's share: one more module, its bytes. */
static ferry_status module_quota(ferry__ps_registry *r, ferry__ps_quota *q, ferry__ps_module *m) {
    if (q == NULL)
        return FERRY_OK;
    ferry_status st = ferry__ps_quota_take(&q->modules, r->lim->id_modules, "modules", q->identity,
                                           "--max-modules-per-identity");
    if (st != FERRY_OK)
        return st;
    char what[FERRY_RPC_NAME_MAX + 48];
    (void)snprintf(what, sizeof what, "%s '%s'", ferry__ps_kind_name(m->kind), m->name);
    if ((st = ferry__ps_quota_charge(&q->model_bytes, m->bytes, r->lim->id_model_bytes, what,
                                     q->identity, "--max-model-mb-per-identity")) != FERRY_OK)
        atomic_fetch_sub(&q->modules, 1);
    else
        m->quota = q;
    return st;
}

ferry_status ferry__ps_registry_create(ferry__ps_registry *r, const char *owner,
                                       ferry__ps_quota *quota, const char *name,
                                       const Ferry__V1__ModuleConfig *cfg, ferry_rpc_msg *req,
                                       int *created, ferry__ps_module **out) {
    ferry__ps_module_config c;
    ferry_status st = check_name(name);
    if (st == FERRY_OK)
        st = config_normalize(name, cfg, &c);
    if (st != FERRY_OK)
        return st;
    pthread_mutex_lock(&r->mu);
    ferry__ps_module *m = find_locked(r, name);
    if (m != NULL && strcmp(m->owner, owner) != 0) {
        /* Module names are one namespace per server: a name stays with whoever created
         * it first (an admin can delete it). Who that is stays unsaid. */
        st = ferry_errorf(FERRY_ERR_EXISTS,
                          "module name '%s' is taken by another identity on this server: "
                          "choose another name",
                          name);
        *created = 0;
    } else if (m != NULL) {
        char diff[256];
        if (ferry__ps_config_diff(&m->cfg, &c, diff, sizeof diff))
            st = ferry_errorf(FERRY_ERR_EXISTS,
                              "module '%s' already exists with a different config: %s", name, diff);
        *created = 0;
    } else {
        if (r->count == r->cap) {
            int cap = r->cap ? 2 * r->cap : 8;
            ferry__ps_module **mods = realloc(r->mods, (size_t)cap * sizeof *mods);
            if (mods == NULL)
                st = FERRY_NOMEM();
            else
                r->mods = mods, r->cap = cap;
        }
        if (st == FERRY_OK && (st = module_build(r, name, &c, cfg, req, &m)) == FERRY_OK &&
            (st = module_quota(r, quota, m)) != FERRY_OK) {
            module_destroy(m);
            m = NULL;
        }
        if (st == FERRY_OK) {
            (void)snprintf(m->owner, sizeof m->owner, "%s", owner);
            atomic_init(&m->refs, 1); /* the registry's */
            m->reg = r;
            r->mods[r->count++] = m;
            r->bytes += m->bytes;
            *created = 1;
        }
    }
    if (st == FERRY_OK)
        ferry__ps_module_ref(m); /* the caller's */
    pthread_mutex_unlock(&r->mu);
    if (st == FERRY_OK && *created)
        FERRY_LOG_INFO(
            "created %s '%s' for '%s': rows [%lld, %lld) of (%lld, %lld), %lld "
            "floats, %s lr %g%s",
            c.kind, name, owner, (long long)c.row_begin, (long long)(c.row_begin + c.row_count),
            (long long)c.dims[0], (long long)c.dims[1], (long long)m->P.numel,
            ferry_optim_kind_name(c.optim.kind), c.optim.lr,
            c.constraint == FERRY_CONSTRAINT_STIEFEL ? ", Stiefel-constrained weight" : "");
    if (st == FERRY_OK)
        *out = m;
    return st;
}
