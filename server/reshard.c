/* reshard.c - a job's checkpoint of one step, written by k servers, cut again for k2
 * servers: the files a job on k2 servers restores to go on exactly where the k
 * servers stood.
 *
 * The placement is the client's (proto/ferry.proto section 4): a sharded module
 * (embedding, decoder, dense) of R server rows puts rows [s*R/k, (s+1)*R/k) on server
 * s. A one-server module (linear, lstm: --stages layers) is refused: its client may
 * have placed it by hand, so its server among k2 is not known. Each
 * source file is restored into a registry of its own (every CRC verified first, the
 * same code as a server's restore), so the new shards are built by the modules' own
 * kinds: a new shard's module is created from its source's configuration with the
 * new row range, and each of its parameters takes its rows, with their optimizer
 * state (ferry_optim_copy_rows), from the source shards that held them. Values are
 * copied, never recomputed: the new files hold the same floats, and the job's next
 * step differs from the undisturbed one only in the order the servers' partial sums
 * are added up.
 *
 * Refused, each in one line naming the file and module: sources of different steps
 * or owners, a sharded module missing from a source or whose row ranges do not tile
 * [0, R) in server order or not all of R (a file left out), shards of other
 * configurations or at other parameter versions or optimizer steps, a one-server
 * module, and more servers than a module has rows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/core/log.h"
#include "server/ps-impl.h"

struct ferry__ps_reshard_src {
    int k;
    ferry__ps_limits lim;
    ferry__ps_registry *reg; /* (k) server s's file, restored */
    uint64_t step;
    char owner[FERRY_RPC_IDENTITY_MAX];
    uint64_t bytes; /* the sources' sizes */
    char **path;    /* (k) the source files, for messages */
};

static const ferry_wire_kind_info *kind_of(const ferry__ps_module *m) {
    return &ferry_wire_kinds[m->kind->wire];
}

void ferry__ps_reshard_close(ferry__ps_reshard_src *src) {
    if (src == NULL)
        return;
    for (int s = 0; src->reg != NULL && s < src->k; s++)
        ferry__ps_registry_deinit(&src->reg[s]);
    free(src->reg);
    for (int s = 0; src->path != NULL && s < src->k; s++)
        free(src->path[s]);
    free(src->path);
    free(src);
}

ferry_status ferry__ps_reshard_open(const char *const *in, int k, ferry__ps_reshard_src **out) {
    *out = NULL;
    if (k < 1 || k > 4096)
        return ferry_errorf(FERRY_ERR_INVALID, "%d source files (1..4096)", k);
    ferry__ps_reshard_src *src = calloc(1, sizeof *src);
    if (src == NULL || (src->reg = calloc((size_t)k, sizeof *src->reg)) == NULL ||
        (src->path = calloc((size_t)k, sizeof *src->path)) == NULL) {
        if (src != NULL)
            free(src->reg);
        free(src);
        return FERRY_NOMEM();
    }
    src->k = k;
    src->lim = (ferry__ps_limits){.module_bytes = INT64_MAX / 4, .model_bytes = INT64_MAX / 4};
    for (int s = 0; s < k; s++)
        ferry__ps_registry_init(&src->reg[s], &src->lim);
    for (int s = 0; s < k; s++) {
        if ((src->path[s] = strdup(in[s])) == NULL) {
            ferry__ps_reshard_close(src);
            return FERRY_NOMEM();
        }
    }
    ferry_status st = FERRY_OK;
    for (int s = 0; s < k && st == FERRY_OK; s++) {
        uint64_t step = 0;
        char owner[FERRY_RPC_IDENTITY_MAX];
        FILE *f = fopen(in[s], "rb");
        if (f != NULL && fseek(f, 0, SEEK_END) == 0)
            src->bytes += (uint64_t)ftell(f);
        if (f != NULL)
            (void)fclose(f);
        st = ferry__ps_checkpoint_verify(in[s], &step, owner);
        if (st == FERRY_OK && s == 0) {
            src->step = step;
            memcpy(src->owner, owner, sizeof owner);
        } else if (st == FERRY_OK && step != src->step) {
            st =
                ferry_errorf(FERRY_ERR_INVALID,
                             "%s is step %llu, %s step %llu: the sources must be one "
                             "step's files",
                             in[s], (unsigned long long)step, in[0], (unsigned long long)src->step);
        } else if (st == FERRY_OK && strcmp(owner, src->owner) != 0) {
            st = ferry_errorf(FERRY_ERR_INVALID, "%s belongs to '%s', %s to '%s'", in[s], owner,
                              in[0], src->owner);
        }
        if (st == FERRY_OK)
            st = ferry__ps_checkpoint_read(&src->reg[s], NULL, in[s],
                                           src->owner[0] != '\0' ? src->owner : NULL, NULL);
    }
    if (st != FERRY_OK) {
        ferry__ps_reshard_close(src);
        return st;
    }
    *out = src;
    return FERRY_OK;
}

uint64_t ferry__ps_reshard_step(const ferry__ps_reshard_src *src) {
    return src->step;
}

uint64_t ferry__ps_reshard_bytes(const ferry__ps_reshard_src *src) {
    return src->bytes;
}

/* Creates, in out, module `name` from m's configuration with rows [begin, begin +
 * count) (a one-server module: count < 0, its own). */
static ferry_status create_like(ferry__ps_registry *out, const ferry__ps_module *m, int64_t begin,
                                int64_t count, ferry__ps_module **made) {
    Ferry__V1__ModuleConfig *cfg =
        ferry__v1__module_config__unpack(NULL, m->config_len, m->config_packed);
    if (cfg == NULL)
        return ferry_errorf(FERRY_ERR_FORMAT, "module '%s' has a bad config", m->name);
    if (count >= 0) {
        cfg->row_begin = begin;
        cfg->row_count = count;
    }
    ferry_rpc_msg none;
    ferry_rpc_msg_init(&none);
    int created = 0;
    ferry_status st =
        ferry__ps_registry_create(out, m->owner, NULL, m->name, cfg, &none, &created, made);
    ferry__v1__module_config__free_unpacked(cfg, NULL);
    if (st == FERRY_OK && !created) {
        ferry__ps_module_put(*made);
        *made = NULL;
        st = ferry_errorf(FERRY_ERR_EXISTS, "module '%s' twice", m->name);
    }
    return st;
}

/* Rows [a, b) of the sharded module `name` (its shards: src->reg[s]'s, tiling [0, R))
 * into d, whose rows start at global row a. */
static ferry_status copy_rows(ferry__ps_module *d, ferry__ps_module *const *shard, int k, int64_t a,
                              int64_t b) {
    ferry_status st = FERRY_OK;
    for (int s = 0; s < k && st == FERRY_OK; s++) {
        const ferry__ps_module *m = shard[s];
        int64_t lo = m->cfg.row_begin > a ? m->cfg.row_begin : a;
        int64_t hi =
            m->cfg.row_begin + m->cfg.row_count < b ? m->cfg.row_begin + m->cfg.row_count : b;
        if (lo >= hi)
            continue;
        for (int i = 0; i < d->P.count && st == FERRY_OK; i++) {
            const ferry_param *pd = &d->P.items[i], *ps = &m->P.items[i];
            int64_t width = pd->numel / d->rows;
            memcpy(d->P.data + pd->offset + (lo - a) * width,
                   m->P.data + ps->offset + (lo - m->cfg.row_begin) * width,
                   (size_t)((hi - lo) * width) * sizeof(float));
            st = ferry_optim_copy_rows(d->opt, &d->P, m->opt, &m->P, i, lo - a,
                                       lo - m->cfg.row_begin, hi - lo);
        }
    }
    return st;
}

/* 1 when every parameter of a and b has the same name and row width. */
static int same_layout(const ferry__ps_module *a, const ferry__ps_module *b) {
    if (a->P.count != b->P.count || a->rows <= 0 || b->rows <= 0)
        return 0;
    for (int i = 0; i < a->P.count; i++)
        if (strcmp(a->P.items[i].name, b->P.items[i].name) != 0 ||
            a->P.items[i].numel / a->rows != b->P.items[i].numel / b->rows ||
            a->P.items[i].numel % a->rows != 0 || b->P.items[i].numel % b->rows != 0)
            return 0;
    return 1;
}

/* The shards of sharded module m0 (found in source 0) in every source, in server
 * order, checked to be one module's: the same configuration but for the rows, the same
 * layout, version and optimizer step, rows tiling [0, R) (R: all of the module's rows
 * unless its kind lets a client keep some); *R the server rows. */
static ferry_status find_shards(ferry__ps_reshard_src *src, const ferry__ps_module *m0,
                                ferry__ps_module **shard, int64_t *R) {
    int64_t next = 0;
    for (int s = 0; s < src->k; s++) {
        shard[s] = ferry__ps_registry_find(&src->reg[s], m0->name);
        if (shard[s] == NULL)
            return ferry_errorf(FERRY_ERR_INVALID,
                                "sharded module '%s' is missing from %s: every server of the "
                                "job holds a slice of it",
                                m0->name, src->path[s]);
        const ferry__ps_module *m = shard[s];
        ferry__ps_module_config c = m->cfg; /* but for its rows */
        c.row_begin = m0->cfg.row_begin;
        c.row_count = m0->cfg.row_count;
        char diff[256] = "its parameters' layout differs";
        if (ferry__ps_config_diff(&m0->cfg, &c, diff, sizeof diff) || !same_layout(m, m0))
            return ferry_errorf(FERRY_ERR_INVALID,
                                "module '%s' has another configuration in %s than in %s (%s): "
                                "the sources are not one job's",
                                m->name, src->path[s], src->path[0], diff);
        if (m->cfg.row_begin != next)
            return ferry_errorf(FERRY_ERR_INVALID,
                                "module '%s' of %s holds rows [%lld, %lld), expected to start "
                                "at row %lld: give the sources in the job's server order",
                                m->name, src->path[s], (long long)m->cfg.row_begin,
                                (long long)(m->cfg.row_begin + m->cfg.row_count), (long long)next);
        if (m->version != m0->version ||
            ferry_optim_step_count(m->opt) != ferry_optim_step_count(m0->opt))
            return ferry_errorf(FERRY_ERR_INVALID,
                                "module '%s' is at version %llu (optimizer step %lld) in %s and "
                                "%llu (%lld) in %s",
                                m->name, (unsigned long long)m->version,
                                (long long)ferry_optim_step_count(m->opt), src->path[s],
                                (unsigned long long)m0->version,
                                (long long)ferry_optim_step_count(m0->opt), src->path[0]);
        next += m->cfg.row_count;
    }
    int64_t rows = ferry_wire_kind_rows(m0->kind->wire, m0->cfg.dims);
    if (kind_of(m0)->local_rows ? next > rows : next != rows)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "module '%s' has %lld rows; the files given hold %lld of them: "
                            "give every server's file of the step",
                            m0->name, (long long)rows, (long long)next);
    *R = next;
    return FERRY_OK;
}

ferry_status ferry__ps_reshard_write(ferry__ps_reshard_src *src, int k2, int t, const char *dir,
                                     const char *name, uint64_t *bytes) {
    if (k2 < 1 || t < 0 || t >= k2)
        return ferry_errorf(FERRY_ERR_INVALID, "shard %d of %d", t, k2);
    ferry__ps_registry out;
    ferry__ps_registry_init(&out, &src->lim);
    ferry__ps_module **shard = calloc((size_t)src->k, sizeof *shard);
    ferry_status st = shard != NULL ? FERRY_OK : FERRY_NOMEM();
    int made = 0;
    for (int s = 0; s < src->k && st == FERRY_OK; s++) {
        int n = 0;
        ferry__ps_module **mods = ferry__ps_registry_list(&src->reg[s], &n);
        if (n == 0 && ferry__ps_registry_count(&src->reg[s]) > 0) {
            st = FERRY_NOMEM();
            break;
        }
        for (int i = 0; i < n && st == FERRY_OK; i++) {
            ferry__ps_module *m = mods[i], *d = NULL;
            if (kind_of(m)->one_server) {
                st = ferry_errorf(FERRY_ERR_UNSUPPORTED,
                                  "module '%s' (%s) of %s lives whole on one server: where it "
                                  "goes among %d servers is its client's choice (--stages, "
                                  "ferry_remote_config.server), so only row-sharded modules "
                                  "(embedding, decoder, dense) are cut again",
                                  m->name, m->cfg.kind, src->path[s], k2);
                break;
            } else if (s == 0) {
                int64_t R = 0;
                st = find_shards(src, m, shard, &R);
                if (st == FERRY_OK && R < k2)
                    st = ferry_errorf(FERRY_ERR_INVALID,
                                      "module '%s' has %lld server rows, fewer than %d "
                                      "servers",
                                      m->name, (long long)R, k2);
                int64_t a = (int64_t)t * R / k2, b = (int64_t)(t + 1) * R / k2;
                if (st == FERRY_OK)
                    st = create_like(&out, m, a, b - a, &d);
                if (st == FERRY_OK)
                    st = copy_rows(d, shard, src->k, a, b);
                for (int q = 0; q < src->k; q++) {
                    if (shard[q] != NULL)
                        ferry__ps_module_put(shard[q]);
                    shard[q] = NULL;
                }
            }
            if (!kind_of(m)->one_server && s > 0) { /* found in source 0 too, else refused */
                ferry__ps_module *m0 = ferry__ps_registry_find(&src->reg[0], m->name);
                if (m0 == NULL)
                    st = ferry_errorf(FERRY_ERR_INVALID,
                                      "sharded module '%s' of %s is missing from %s: every "
                                      "server of the job holds a slice of it",
                                      m->name, src->path[s], src->path[0]);
                else
                    ferry__ps_module_put(m0);
            }
            if (d != NULL) {
                d->version = m->version;
                ferry__ps_module_put(d);
                made++;
            }
        }
        ferry__ps_registry_list_free(mods, n);
    }
    free(shard);
    if (st == FERRY_OK)
        st = ferry__ps_checkpoint_write(&out, dir, name, src->owner[0] != '\0' ? src->owner : NULL,
                                        src->step, 0, bytes);
    ferry__ps_registry_deinit(&out);
    if (st == FERRY_OK)
        FERRY_LOG_INFO("server %d of %d: %d modules of step %llu into %s/%s", t + 1, k2, made,
                       (unsigned long long)src->step, dir, name);
    return st;
}
