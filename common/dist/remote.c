/* remote.c - remote modules: the placement of a module's shards over the cluster
 * (row ranges for embedding and decoder, one server for linear), CreateModule on
 * every shard concurrently, and reading or writing parameter rows across shards. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dist/dist.h"
#include "ferry.pb-c.h"
#include "common/core/log.h"
#include "ferry/backend.h"
#include "ferry/nn.h"
#include "ferry/optim.h"

/* The public kinds are the contract's, in its order, and each has the client's side. */
#define KIND_(id, name, dims, rows, place, bias, stiefel, local_rows)                              \
    _Static_assert(FERRY_REMOTE_##id == (int)FERRY_WIRE_KIND_##id, "ferry_remote_kind " #id);
FERRY_WIRE_KIND_MAP(KIND_)
#undef KIND_
const ferry__dist_kind *const ferry__dist_kinds[FERRY_WIRE_KIND_COUNT] = {
#define KIND_(id, name, dims, rows, place, bias, stiefel, local_rows) &ferry__dist_kind_##name,
    FERRY_WIRE_KIND_MAP(KIND_)
#undef KIND_
};
#define kind_name(k) (ferry_wire_kinds[k].name)

void ferry_remote_config_default(ferry_remote_config *cfg, ferry_remote_kind kind, const char *name,
                                 int64_t dim0, int64_t dim1) {
    memset(cfg, 0, sizeof *cfg);
    cfg->name = name;
    cfg->kind = kind;
    cfg->dims[0] = dim0;
    cfg->dims[1] = dim1;
    cfg->bias = 1;
    cfg->server = -1;
    cfg->init_scale = 0.1f;
    cfg->weight_offset = cfg->bias_offset = -1;
    cfg->optim = ferry_optim_defaults(FERRY_OPTIM_SGD);
}

static ferry_status config_check(const ferry_cluster *c, const ferry_remote_config *cfg) {
    if (cfg->name == NULL || cfg->name[0] == '\0' || strlen(cfg->name) >= FERRY_RPC_NAME_MAX)
        return ferry_errorf(FERRY_ERR_INVALID, "remote module needs a name of 1..%d bytes",
                            FERRY_RPC_NAME_MAX - 1);
    if ((int)cfg->kind < 0 || (int)cfg->kind >= FERRY_WIRE_KIND_COUNT)
        return ferry_errorf(FERRY_ERR_INVALID, "module '%s': unknown kind %d", cfg->name,
                            (int)cfg->kind);
    if (cfg->dims[0] < 1 || cfg->dims[1] < 1 || cfg->dims[0] > INT32_MAX ||
        cfg->dims[1] > INT32_MAX)
        return ferry_errorf(FERRY_ERR_INVALID, "module '%s': dims [%lld, %lld] out of range",
                            cfg->name, (long long)cfg->dims[0], (long long)cfg->dims[1]);
    const ferry_wire_kind_info *ki = &ferry_wire_kinds[cfg->kind];
    int one = ki->one_server;
    if (cfg->local_rows != 0 &&
        (!ki->local_rows || cfg->local_rows < 0 || cfg->local_rows > cfg->dims[0] - c->n))
        return ferry_errorf(FERRY_ERR_INVALID,
                            "module '%s': %lld local rows: a decoder may keep 1..%lld of its "
                            "%lld rows here (every server needs one)",
                            cfg->name, (long long)cfg->local_rows, (long long)(cfg->dims[0] - c->n),
                            (long long)cfg->dims[0]);
    if (!one && cfg->dims[0] < c->n)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "module '%s': %lld rows cannot be split over %d "
                            "servers",
                            cfg->name, (long long)cfg->dims[0], c->n);
    const ferry__dist_kind *dk = ferry__dist_kinds[cfg->kind];
    ferry_status st;
    if (dk->check != NULL && (st = dk->check(cfg)) != FERRY_OK)
        return st;
    if (one && (cfg->server < -1 || cfg->server >= c->n))
        return ferry_errorf(FERRY_ERR_INVALID, "module '%s': server %d outside [0, %d)", cfg->name,
                            cfg->server, c->n);
    if (!(cfg->init_scale >= 0.0f))
        return ferry_errorf(FERRY_ERR_INVALID, "module '%s': init_scale %g", cfg->name,
                            (double)cfg->init_scale);
    /* The server owns the rest of the constraint's checks (D >= C); what cannot travel
     * on the wire is refused here: only linear and lstm configs carry a constraint. */
    const ferry_remote_constraint *k = &cfg->constraint;
    if ((int)k->kind < 0 || k->kind > FERRY_REMOTE_CONSTRAINT_STIEFEL)
        return ferry_errorf(FERRY_ERR_INVALID, "module '%s': unknown constraint kind %d", cfg->name,
                            (int)k->kind);
    if (k->kind != FERRY_REMOTE_CONSTRAINT_NONE && !ki->stiefel)
        return ferry_errorf(FERRY_ERR_UNSUPPORTED,
                            "module '%s': kind %s takes no constraint (a Stiefel constraint is "
                            "implemented for the weight of a linear module and the weight_hh of "
                            "an lstm module's layers)",
                            cfg->name, kind_name(cfg->kind));
    if (k->kind == FERRY_REMOTE_CONSTRAINT_NONE && k->polar_init)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "module '%s': constraint.polar_init needs a Stiefel constraint",
                            cfg->name);
    if (k->kind != FERRY_REMOTE_CONSTRAINT_NONE && !(k->beta >= 0.0 && k->beta <= 1e6))
        return ferry_errorf(FERRY_ERR_INVALID,
                            "module '%s': constraint penalty weight beta %g must be in [0, 1e6]",
                            cfg->name, k->beta);
    if (k->polar_init != 0 && k->polar_init != 1)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "module '%s': constraint.polar_init %d is not 0 or 1", cfg->name,
                            k->polar_init);
    return FERRY_OK;
}

/* Row ranges: shard s of k owns [s*R/k, (s+1)*R/k). */
static ferry_status place(ferry_remote *m, const ferry_remote_config *cfg) {
    ferry_cluster *c = m->c;
    int one = ferry_wire_kinds[m->kind].one_server;
    m->nshards = one ? 1 : c->n;
    m->shards = calloc((size_t)m->nshards, sizeof *m->shards);
    if (m->shards == NULL)
        return FERRY_NOMEM();
    if (one) {
        uint64_t h = 1469598103934665603ull; /* FNV-1a of the name */
        for (const char *p = m->name; *p != '\0'; p++)
            h = (h ^ (unsigned char)*p) * 1099511628211ull;
        m->shards[0].server = cfg->server >= 0 ? cfg->server : (int)(h % (uint64_t)c->n);
        m->shards[0].row_begin = 0;
        m->shards[0].row_count = m->rows;
        return FERRY_OK;
    }
    int64_t R = m->rows - m->local_rows; /* a decoder's local slice is the last rows */
    for (int s = 0; s < m->nshards; s++) {
        m->shards[s].server = s;
        m->shards[s].row_begin = (int64_t)s * R / m->nshards;
        m->shards[s].row_count = (int64_t)(s + 1) * R / m->nshards - m->shards[s].row_begin;
    }
    return FERRY_OK;
}

/* Fills the optimizer message from FERRY_OPTIM_FIELD_MAP: every field that has a proto
 * field of its name there too (for readers of the message), and every value again as
 * an exact "extra" (the server gives 0-valued proto fields the kind's default). */
static void optim_message(const ferry_optim_config *o, Ferry__V1__OptimizerConfig *msg,
                          Ferry__V1__Metric *extra, Ferry__V1__Metric **ptrs) {
    ferry__v1__optimizer_config__init(msg);
    msg->name = (char *)(uintptr_t)ferry_optim_kind_name(o->kind);
    for (int i = 0; i < FERRY_OPTIM_FIELD_COUNT; i++) {
        double v = ferry_optim_field_get(o, i);
        (void)ferry__proto_set_number(&msg->base, ferry_optim_fields[i].name, v);
        ferry__v1__metric__init(&extra[i]);
        extra[i].name = (char *)(uintptr_t)ferry_optim_fields[i].name;
        extra[i].value = v;
        ptrs[i] = &extra[i];
    }
    msg->n_extra = FERRY_OPTIM_FIELD_COUNT;
    msg->extra = ptrs;
}

/* The CreateModule request of shard s into *req. */
static ferry_status create_request(const ferry_remote *m, const ferry_remote_config *cfg, int s,
                                   ferry_rpc_msg *req) {
    const ferry__dist_shard *sh = &m->shards[s];
    Ferry__V1__OptimizerConfig opt;
    Ferry__V1__Metric extra[FERRY_OPTIM_FIELD_COUNT], *ptrs[FERRY_OPTIM_FIELD_COUNT];
    optim_message(&cfg->optim, &opt, extra, ptrs);
    /* The kind's own config message, written through the contract (fields the kind's
     * message lacks are not written). */
    ferry_wire_kind_config kc = {
        .kind = (ferry_wire_kind)m->kind,
        .dims = {cfg->dims[0], cfg->dims[1]},
        .no_bias = !m->bias,
        .layers = (uint32_t)(cfg->layers > 0 ? cfg->layers : 1),
        .first_layer = (uint32_t)cfg->first_layer,
        .dropout_ppm = (uint32_t)lrint((double)cfg->dropout * 1e6),
        .stiefel = cfg->constraint.kind == FERRY_REMOTE_CONSTRAINT_STIEFEL,
        .beta = cfg->constraint.beta,
        .polar = cfg->constraint.polar_init != 0,
    };
    Ferry__V1__ModuleConfig mc;
    ferry__v1__module_config__init(&mc);
    ferry_status st = ferry__wire_kind_config_write(&kc, &mc.base);
    if (st != FERRY_OK)
        return st;
    Ferry__V1__Offset woff, boff;
    ferry__v1__offset__init(&woff);
    ferry__v1__offset__init(&boff);
    woff.value = cfg->weight_offset;
    boff.value = cfg->bias_offset;
    Ferry__V1__Init init;
    ferry__v1__init__init(&init);
    init.seed = cfg->init_seed;
    init.scale = cfg->init_scale > 0.0f ? (double)cfg->init_scale : 0.1;
    init.weight_offset = cfg->weight_offset >= 0 ? &woff : NULL;
    init.bias_offset = cfg->bias_offset >= 0 ? &boff : NULL;
    int one = ferry_wire_kinds[m->kind].one_server;
    mc.row_begin = one ? 0 : sh->row_begin;
    mc.row_count = one ? 0 : sh->row_count;
    mc.init = &init;
    mc.optimizer = &opt;
    Ferry__V1__CreateModuleRequest q;
    ferry__v1__create_module_request__init(&q);
    q.name = (char *)(uintptr_t)m->name;
    q.config = &mc;
    st = ferry_rpc_msg_set_head(req, &q.base);
    ferry__wire_kind_config_clear(&mc.base);
    if (st == FERRY_OK && cfg->init_weight != NULL) {
        int64_t dim[2] = {sh->row_count, m->cols};
        ferry_rpc_tensor t =
            ferry__dist_tensor_as(FERRY_WIRE_PARAM_NAME(WEIGHT), FERRY_RPC_DTYPE_F32, 2, dim,
                                  cfg->init_weight + sh->row_begin * m->cols);
        st = ferry_rpc_msg_add(req, &t);
    }
    if (st == FERRY_OK && cfg->init_bias != NULL && m->bias) {
        int64_t dim[1] = {sh->row_count};
        ferry_rpc_tensor t = ferry__dist_tensor_as(FERRY_WIRE_PARAM_NAME(BIAS), FERRY_RPC_DTYPE_F32,
                                                   1, dim, cfg->init_bias + sh->row_begin);
        st = ferry_rpc_msg_add(req, &t);
    }
    return st;
}

/* A create that failed on some server leaves nothing behind: the shards this call
 * made on the others (the replies that say "created") are deleted again. Shards that
 * were there before stay. The first error is the one reported. */
static void undo_created(ferry_cluster *c, const char *name, int k, const int *servers,
                         const ferry_rpc_msg *replies, ferry_status failed) {
    char why[1024];
    (void)snprintf(why, sizeof why, "%s", ferry_error_last());
    for (int s = 0; s < k; s++) {
        const Ferry__V1__CreateModuleReply *r = replies[s].head;
        if (r == NULL || !r->created)
            continue;
        if (ferry__dist_delete_module_on(c, servers[s], name) == FERRY_OK)
            FERRY_LOG_INFO("module '%s': the shard made on %s deleted again (the create failed "
                           "elsewhere)",
                           name, ferry_cluster_target(c, servers[s]));
        else
            FERRY_LOG_WARN("module '%s': the shard made on %s stays (%s): ferry-ctl drop %s "
                           "removes it",
                           name, ferry_cluster_target(c, servers[s]), ferry_error_last(), name);
    }
    (void)ferry_errorf(failed, "%s", why);
}

ferry_status ferry_remote_create(ferry_cluster *c, const ferry_remote_config *cfg,
                                 ferry_remote **out) {
    ferry_status st = config_check(c, cfg);
    if (st != FERRY_OK)
        return st;
    ferry_remote *m = calloc(1, sizeof *m);
    if (m == NULL)
        return FERRY_NOMEM();
    m->c = c;
    atomic_init(&m->wide, 0);
    (void)snprintf(m->name, sizeof m->name, "%s", cfg->name);
    m->kind = cfg->kind;
    m->dims[0] = cfg->dims[0];
    m->dims[1] = cfg->dims[1];
    const ferry_wire_kind_info *ki = &ferry_wire_kinds[cfg->kind];
    m->bias = ki->bias == FERRY_WIRE_BIAS_ALWAYS     ? 1
              : ki->bias == FERRY_WIRE_BIAS_OPTIONAL ? cfg->bias != 0
                                                     : 0;
    m->rows = ferry_wire_kind_rows((ferry_wire_kind)cfg->kind, cfg->dims);
    m->cols = ferry_wire_kind_cols((ferry_wire_kind)cfg->kind, cfg->dims);
    const ferry__dist_kind *dk = ferry__dist_kinds[cfg->kind];
    if (dk->shape != NULL && (st = dk->shape(m, cfg)) != FERRY_OK) {
        free(m);
        return st;
    }
    m->local_rows = cfg->local_rows;
    if ((st = place(m, cfg)) != FERRY_OK) {
        ferry_remote_destroy(m);
        return st;
    }
    int k = m->nshards, *servers = calloc((size_t)k, sizeof *servers);
    ferry_rpc_msg *reqs = calloc((size_t)k, sizeof *reqs),
                  *replies = calloc((size_t)k, sizeof *replies);
    st = servers && reqs && replies ? FERRY_OK : FERRY_NOMEM();
    for (int s = 0; st == FERRY_OK && s < k; s++) {
        ferry_rpc_msg_init(&reqs[s]);
        ferry_rpc_msg_init(&replies[s]);
        servers[s] = m->shards[s].server;
    }
    for (int s = 0; st == FERRY_OK && s < k; s++)
        st = create_request(m, cfg, s, &reqs[s]);
    if (st == FERRY_OK)
        st = ferry__dist_fanout(c, FERRY_RPC_CREATE_MODULE, k, servers, reqs, 0, replies);
    for (int s = 0; st == FERRY_OK && s < k; s++)
        m->created += ((const Ferry__V1__CreateModuleReply *)replies[s].head)->created ? 1 : 0;
    if (st != FERRY_OK && replies != NULL)
        undo_created(c, m->name, k, servers, replies, st);
    for (int s = 0; reqs != NULL && replies != NULL && s < k; s++) {
        ferry_rpc_msg_deinit(&reqs[s]);
        ferry_rpc_msg_deinit(&replies[s]);
    }
    free(servers);
    free(reqs);
    free(replies);
    if (st != FERRY_OK) {
        ferry_remote_destroy(m);
        return st;
    }
    FERRY_LOG_DEBUG("remote %s '%s' on %d shards (%d new)", kind_name(m->kind), m->name, k,
                    m->created);
    *out = m;
    return FERRY_OK;
}

ferry_status ferry_remote_replace(ferry_remote *m) {
    if (ferry_wire_kinds[m->kind].one_server)
        return ferry_errorf(FERRY_ERR_UNSUPPORTED,
                            "module '%s' (%s) lives whole on one server: its place does not "
                            "follow the servers",
                            m->name, kind_name(m->kind));
    if (m->rows - m->local_rows < m->c->n)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "module '%s': %lld rows cannot be split over %d "
                            "servers",
                            m->name, (long long)(m->rows - m->local_rows), m->c->n);
    /* bf16 wire: the images held from each shard start over from the new shards */
    uint64_t *ids = NULL;
    if (m->image_id != NULL && (ids = calloc((size_t)m->c->n + 1, sizeof *m->image_id)) == NULL)
        return FERRY_NOMEM();
    ferry__dist_shard *old = m->shards;
    int oldn = m->nshards;
    ferry_remote_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.server = -1;
    ferry_status st = place(m, &cfg);
    if (st != FERRY_OK) {
        free(ids);
        m->shards = old;
        m->nshards = oldn;
        return st;
    }
    free(old);
    if (ids != NULL) {
        free(m->image_id);
        m->image_id = ids;
    }
    return FERRY_OK;
}

void ferry_remote_destroy(ferry_remote *m) {
    if (m == NULL)
        return;
    free(m->shards);
    free(m->image);
    free(m->image_id);
    free(m);
}

int ferry_remote_created(const ferry_remote *m) {
    return m->created;
}

void ferry_remote_set_wide(ferry_remote *m, int on) {
    atomic_store(&m->wide, on != 0);
}

const char *ferry_remote_name(const ferry_remote *m) {
    return m->name;
}

int ferry_remote_shards(const ferry_remote *m) {
    return m->nshards;
}

void ferry_remote_shard(const ferry_remote *m, int shard, int64_t *row_begin, int64_t *row_count,
                        int *server) {
    FERRY_ASSERT(shard >= 0 && shard < m->nshards);
    if (row_begin != NULL)
        *row_begin = m->shards[shard].row_begin;
    if (row_count != NULL)
        *row_count = m->shards[shard].row_count;
    if (server != NULL)
        *server = m->shards[shard].server;
}

/* ---- parameters ---- */

/* The part of rows [lo, lo + count) that lies in a decoder's local slice, read from
 * or written to the caller's tensors. */
static ferry_status local_io(ferry_remote *m, int is_weight, int64_t lo, int64_t count, float *dst,
                             const float *src) {
    if (m->local_be == NULL)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "decoder '%s': its local rows are not set "
                            "(ferry_remote_decoder_set_local)",
                            m->name);
    int64_t first = m->rows - m->local_rows, a = lo > first ? lo : first,
            width = is_weight ? m->cols : 1;
    size_t nbytes = (size_t)((lo + count - a) * width) * sizeof(float);
    float *local = (float *)(uintptr_t)(is_weight ? m->local_w : m->local_b) + (a - first) * width;
    if (src != NULL) {
        for (int64_t i = 0; i < (lo + count - a) * width; i++) {
            if (!isfinite(src[(a - lo) * width + i]))
                return ferry_errorf(FERRY_ERR_NUMERIC,
                                    "decoder '%s': non-finite value for row "
                                    "%lld",
                                    m->name, (long long)(a + i / width));
        }
        return ferry_backend_copy(m->local_be, local, src + (a - lo) * width, nbytes,
                                  FERRY_COPY_HOST_TO_DEVICE);
    }
    return ferry_backend_copy(m->local_be, dst + (a - lo) * width, local, nbytes,
                              FERRY_COPY_DEVICE_TO_HOST);
}

ferry_status ferry_remote_decoder_set_local(ferry_remote *dec, ferry_backend *be,
                                            const float *weight, const float *bias,
                                            float *grad_weight, float *grad_bias) {
    if (dec == NULL || !ferry_wire_kinds[dec->kind].local_rows || dec->local_rows <= 0)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "ferry_remote_decoder_set_local: '%s' is no "
                            "decoder with local rows",
                            dec != NULL ? dec->name : "(null)");
    if (be == NULL || !ferry_backend_is_host(be) || weight == NULL || bias == NULL ||
        (grad_weight == NULL) != (grad_bias == NULL))
        return ferry_errorf(FERRY_ERR_UNSUPPORTED,
                            "decoder '%s': a local slice needs its "
                            "weight, bias and their gradients in host-addressable memory",
                            dec->name);
    dec->local_be = be;
    dec->local_w = weight;
    dec->local_b = bias;
    dec->local_gw = grad_weight;
    dec->local_gb = grad_bias;
    return FERRY_OK;
}

/* Reads or writes rows [lo, lo + count) of param over the shards they span. */
static ferry_status params_io(ferry_remote *m, const char *param, int64_t lo, int64_t count,
                              float *dst, const float *src) {
    int write = src != NULL;
    if (param == NULL || (strcmp(param, FERRY_WIRE_PARAM_NAME(WEIGHT)) != 0 &&
                          (strcmp(param, FERRY_WIRE_PARAM_NAME(BIAS)) != 0 || !m->bias)))
        return ferry_errorf(FERRY_ERR_NOT_FOUND, "module '%s' has no parameter '%s'", m->name,
                            param != NULL ? param : "(null)");
    if (count == 0)
        count = m->rows - lo;
    if (lo < 0 || count < 1 || lo + count > m->rows)
        return ferry_errorf(FERRY_ERR_RANGE, "module '%s': rows [%lld, %lld) outside [0, %lld)",
                            m->name, (long long)lo, (long long)(lo + count), (long long)m->rows);
    int is_weight = strcmp(param, FERRY_WIRE_PARAM_NAME(WEIGHT)) == 0;
    int64_t width = is_weight ? m->cols : 1;
    int k = 0, servers[FERRY_DIST_MAX_SERVERS];
    int64_t first[FERRY_DIST_MAX_SERVERS], rows[FERRY_DIST_MAX_SERVERS];
    ferry_rpc_msg reqs[FERRY_DIST_MAX_SERVERS], replies[FERRY_DIST_MAX_SERVERS];
    ferry_status st = FERRY_OK;
    for (int s = 0; s < m->nshards && st == FERRY_OK; s++) {
        const ferry__dist_shard *sh = &m->shards[s];
        int64_t a = lo > sh->row_begin ? lo : sh->row_begin;
        int64_t b =
            lo + count < sh->row_begin + sh->row_count ? lo + count : sh->row_begin + sh->row_count;
        if (a >= b)
            continue;
        servers[k] = sh->server;
        first[k] = a;
        rows[k] = b - a;
        ferry_rpc_msg_init(&reqs[k]);
        ferry_rpc_msg_init(&replies[k]);
        if (write) {
            Ferry__V1__SetParamsRequest q;
            ferry__v1__set_params_request__init(&q);
            q.module = m->name;
            q.row_begin = a;
            int64_t dim[2] = {b - a, width};
            ferry_rpc_tensor t = ferry__dist_tensor_as(
                param, FERRY_RPC_DTYPE_F32, is_weight ? 2 : 1, dim, src + (a - lo) * width);
            st = ferry_rpc_msg_set_head(&reqs[k], &q.base);
            if (st == FERRY_OK)
                st = ferry_rpc_msg_add(&reqs[k], &t);
        } else {
            Ferry__V1__GetParamsRequest q;
            ferry__v1__get_params_request__init(&q);
            char *names[1] = {(char *)(uintptr_t)param};
            q.module = m->name;
            q.n_names = 1;
            q.names = names;
            q.row_begin = a;
            q.row_count = b - a;
            st = ferry_rpc_msg_set_head(&reqs[k], &q.base);
        }
        k++;
    }
    if (st == FERRY_OK && lo + count > m->rows - m->local_rows) /* the local slice's rows */
        st = local_io(m, is_weight, lo, count, dst, src);
    if (st == FERRY_OK)
        st = ferry__dist_fanout(m->c, write ? FERRY_RPC_SET_PARAMS : FERRY_RPC_GET_PARAMS, k,
                                servers, reqs, 0, replies);
    for (int i = 0; st == FERRY_OK && !write && i < k; i++) {
        int64_t want[2] = {rows[i], width};
        const ferry_rpc_tensor *t;
        st = ferry__dist_output_as(m->c, servers[i], &replies[i], param, FERRY_RPC_DTYPE_F32,
                                   is_weight ? 2 : 1, want, &t);
        if (st == FERRY_OK)
            memcpy(dst + (first[i] - lo) * width, t->data, t->nbytes);
    }
    for (int i = 0; i < k; i++) {
        ferry_rpc_msg_deinit(&reqs[i]);
        ferry_rpc_msg_deinit(&replies[i]);
    }
    return st;
}

ferry_status ferry_remote_get_params(ferry_remote *m, const char *param, int64_t row_begin,
                                     int64_t row_count, float *out) {
    return params_io(m, param, row_begin, row_count, out, NULL);
}

ferry_status ferry_remote_set_params(ferry_remote *m, const char *param, int64_t row_begin,
                                     int64_t row_count, const float *src) {
    return params_io(m, param, row_begin, row_count, NULL, src);
}

/* ---- attaching to a module by name ---- */

/* The optimizer of a module config as the server reads it: the kind's defaults, the
 * non-zero fields, then the exact `extra` values (server/registry.c does the same). */
static ferry_status optim_from_message(const Ferry__V1__OptimizerConfig *o,
                                       ferry_optim_config *out) {
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
        if (i >= 0)
            ferry_optim_field_set(&c, i, o->extra[k]->value);
    }
    *out = c;
    return FERRY_OK;
}

/* A ferry_remote_config from a module config the server reported (name not set). */
static ferry_status config_from_message(const Ferry__V1__ModuleConfig *mc,
                                        ferry_remote_config *cfg) {
    ferry_wire_kind_config k;
    ferry_status st = ferry__wire_kind_config_read(&mc->base, &k);
    if (st != FERRY_OK)
        return ferry_errorf(FERRY_ERR_FORMAT, "the server reported a module of no known kind");
    ferry_remote_config_default(cfg, (ferry_remote_kind)k.kind, NULL, k.dims[0], k.dims[1]);
    if (ferry_wire_kinds[k.kind].bias == FERRY_WIRE_BIAS_OPTIONAL)
        cfg->bias = !k.no_bias;
    cfg->layers = (int)k.layers;
    cfg->first_layer = (int)k.first_layer;
    cfg->dropout = (float)((double)k.dropout_ppm / 1e6);
    if (k.stiefel) {
        cfg->constraint.kind = FERRY_REMOTE_CONSTRAINT_STIEFEL;
        cfg->constraint.beta = k.beta;
        cfg->constraint.polar_init = k.polar;
    }
    if (mc->init != NULL) {
        cfg->init_seed = mc->init->seed;
        cfg->init_scale = (float)mc->init->scale;
        cfg->weight_offset = mc->init->weight_offset != NULL ? mc->init->weight_offset->value : -1;
        cfg->bias_offset = mc->init->bias_offset != NULL ? mc->init->bias_offset->value : -1;
    } else {
        cfg->init_seed = 0;
    }
    return optim_from_message(mc->optimizer, &cfg->optim);
}

ferry_status ferry_remote_attach(ferry_cluster *c, const char *name, ferry_remote_config *out_cfg,
                                 ferry_remote **out) {
    if (name == NULL || name[0] == '\0' || strlen(name) >= FERRY_RPC_NAME_MAX)
        return ferry_errorf(FERRY_ERR_INVALID, "attach: a module name of 1..%d bytes",
                            FERRY_RPC_NAME_MAX - 1);
    ferry_remote_config cfg;
    int have = 0, one = 0;
    ferry_status st = FERRY_OK;
    for (int s = 0; s < c->n && st == FERRY_OK; s++) {
        ferry_rpc_msg reply;
        ferry_rpc_msg_init(&reply);
        st = ferry__dist_list_modules(c, s, name, &reply);
        const Ferry__V1__ModuleConfig *mc = NULL;
        for (size_t i = 0;
             st == FERRY_OK && i < ((const Ferry__V1__ListModulesReply *)reply.head)->n_modules;
             i++) {
            const Ferry__V1__ModuleInfo *m =
                ((const Ferry__V1__ListModulesReply *)reply.head)->modules[i];
            if (strcmp(m->name, name) == 0)
                mc = m->config;
        }
        if (st == FERRY_OK && mc != NULL && !have) {
            st = config_from_message(mc, &cfg);
            have = st == FERRY_OK;
            one = have && ferry_wire_kinds[cfg.kind].one_server; /* a kind it knows */
            if (one)
                cfg.server = s;
        }
        if (st == FERRY_OK && mc != NULL && !one) {
            /* Shard s must hold the rows this client's placement gives server s. */
            int64_t R = cfg.dims[0], lo = (int64_t)s * R / c->n, hi = (int64_t)(s + 1) * R / c->n;
            int64_t rc = mc->row_count != 0 ? mc->row_count : R - mc->row_begin;
            if (mc->row_begin != lo || rc != hi - lo)
                st = ferry_errorf(FERRY_ERR_INVALID,
                                  "attach '%s': %s holds rows [%lld, %lld), this client would "
                                  "place [%lld, %lld) there (another number of servers, or a "
                                  "decoder with a local slice)",
                                  name, ferry_rpc_client_target(c->clients[s]),
                                  (long long)mc->row_begin, (long long)(mc->row_begin + rc),
                                  (long long)lo, (long long)hi);
        } else if (st == FERRY_OK && mc == NULL && !one) {
            st = ferry_errorf(FERRY_ERR_NOT_FOUND, "attach '%s': %s hosts no module of that name",
                              name, ferry_rpc_client_target(c->clients[s]));
        }
        ferry_rpc_msg_deinit(&reply);
    }
    if (st == FERRY_OK && !have)
        st = ferry_errorf(FERRY_ERR_NOT_FOUND, "attach '%s': no server hosts a module of that name",
                          name);
    if (st != FERRY_OK)
        return st;
    cfg.name = name;
    if ((st = ferry_remote_create(c, &cfg, out)) != FERRY_OK)
        return st;
    if (ferry_remote_created(*out) != 0) { /* a shard vanished meanwhile: do not keep it */
        ferry_remote_destroy(*out);
        *out = NULL;
        return ferry_errorf(FERRY_ERR_NOT_FOUND, "attach '%s': a shard was deleted meanwhile",
                            name);
    }
    cfg.name = (*out)->name;
    if (out_cfg != NULL)
        *out_cfg = cfg;
    return FERRY_OK;
}
