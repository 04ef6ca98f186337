/* checkpoint.c - a ferry-ps checkpoint: every module's configuration (the packed
 * ModuleConfig it was created with), parameter version, parameter block and
 * optimizer state, in one file written atomically (temporary file, then rename).
 * Layout, host byte order:
 *   "FERRYPS1" | u32 format (1) | u32 module count
 *   per module: u32 name length | name | u32 config length | packed ModuleConfig |
 *               u64 version | u64 floats | the parameter block | optimizer state */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "server/ps-impl.h"

#define CKPT_MAGIC       "FERRYPS1"
#define CKPT_FORMAT      1u
#define CKPT_MAX_MODULES 4096
#define CKPT_MAX_CONFIG  (1u << 20)

static int put(FILE *f, const void *p, size_t n) {
    return fwrite(p, 1, n, f) == n;
}

static ferry_status write_module(ferry__ps_module *m, FILE *f) {
    uint32_t name_len = (uint32_t)strlen(m->name), config_len = (uint32_t)m->config_len;
    pthread_rwlock_rdlock(&m->lock);
    uint64_t version = m->version, numel = (uint64_t)m->P.numel;
    int ok = put(f, &name_len, 4) && put(f, m->name, name_len) && put(f, &config_len, 4) &&
             put(f, m->config_packed, config_len) && put(f, &version, 8) && put(f, &numel, 8) &&
             put(f, m->P.data, (size_t)numel * sizeof(float));
    ferry_status st = ok ? ferry_optim_state_save(m->opt, f) : FERRY_ERR_IO;
    pthread_rwlock_unlock(&m->lock);
    return st;
}

ferry_status ferry__ps_checkpoint_write(ferry__ps_registry *r, const char *path, uint64_t *bytes) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return ferry_errorf(FERRY_ERR_INVALID, "checkpoint path too long");
    ferry__ps_module *mods[CKPT_MAX_MODULES];
    uint32_t n = (uint32_t)ferry__ps_registry_list(r, mods, CKPT_MAX_MODULES);
    FILE *f = fopen(tmp, "wb");
    if (f == NULL)
        return ferry_errorf(FERRY_ERR_IO, "cannot create %s", tmp);
    uint32_t format = CKPT_FORMAT;
    ferry_status st =
        put(f, CKPT_MAGIC, 8) && put(f, &format, 4) && put(f, &n, 4) ? FERRY_OK : FERRY_ERR_IO;
    for (uint32_t i = 0; i < n && st == FERRY_OK; i++)
        st = write_module(mods[i], f);
    long size = ftell(f);
    if (fclose(f) != 0 && st == FERRY_OK)
        st = FERRY_ERR_IO;
    if (st == FERRY_OK && rename(tmp, path) != 0)
        st = FERRY_ERR_IO;
    if (st != FERRY_OK) {
        (void)remove(tmp);
        return ferry_errorf(st, "cannot write checkpoint %s", path);
    }
    *bytes = size > 0 ? (uint64_t)size : 0;
    FERRY_LOG_INFO("checkpoint %s: %u modules, %llu bytes", path, (unsigned)n,
                   (unsigned long long)*bytes);
    return FERRY_OK;
}

static int get(FILE *f, void *p, size_t n) {
    return fread(p, 1, n, f) == n;
}

static ferry_status read_module(ferry__ps_registry *r, FILE *f, const char *path) {
    uint32_t name_len, config_len;
    char name[FERRY_RPC_NAME_MAX];
    if (!get(f, &name_len, 4) || name_len == 0 || name_len >= sizeof name ||
        !get(f, name, name_len) || !get(f, &config_len, 4) || config_len > CKPT_MAX_CONFIG)
        return ferry_errorf(FERRY_ERR_FORMAT, "%s: bad module header", path);
    name[name_len] = '\0';
    uint8_t *packed = malloc(config_len ? config_len : 1);
    if (packed == NULL)
        return FERRY_ERR_NOMEM;
    Ferry__ModuleConfig *cfg = NULL;
    if (get(f, packed, config_len))
        cfg = ferry__module_config__unpack(NULL, config_len, packed);
    free(packed);
    if (cfg == NULL)
        return ferry_errorf(FERRY_ERR_FORMAT, "%s: module '%s' has a bad config", path, name);
    ferry_rpc_msg none;
    ferry_rpc_msg_init(&none);
    ferry__ps_module *m = NULL;
    int created = 0;
    ferry_status st = ferry__ps_registry_create(r, name, cfg, &none, &created, &m);
    ferry__module_config__free_unpacked(cfg, NULL);
    if (st != FERRY_OK)
        return st;
    uint64_t version, numel;
    if (!get(f, &version, 8) || !get(f, &numel, 8) || numel != (uint64_t)m->P.numel)
        return ferry_errorf(FERRY_ERR_FORMAT, "%s: module '%s' has %llu floats, expected %lld",
                            path, name, (unsigned long long)numel, (long long)m->P.numel);
    pthread_rwlock_wrlock(&m->lock);
    st = get(f, m->P.data, (size_t)numel * sizeof(float))
             ? ferry_optim_state_load(m->opt, f)
             : ferry_errorf(FERRY_ERR_FORMAT, "%s: module '%s' is truncated", path, name);
    m->version = version;
    pthread_rwlock_unlock(&m->lock);
    return st;
}

ferry_status ferry__ps_checkpoint_read(ferry__ps_registry *r, const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return ferry_errorf(FERRY_ERR_IO, "cannot open checkpoint %s", path);
    char magic[8];
    uint32_t format, n;
    ferry_status st = FERRY_OK;
    if (!get(f, magic, 8) || memcmp(magic, CKPT_MAGIC, 8) != 0 || !get(f, &format, 4) ||
        format != CKPT_FORMAT || !get(f, &n, 4) || n > CKPT_MAX_MODULES)
        st = ferry_errorf(FERRY_ERR_FORMAT, "%s is not a ferry-ps checkpoint (format %u)", path,
                          CKPT_FORMAT);
    for (uint32_t i = 0; i < n && st == FERRY_OK; i++)
        st = read_module(r, f, path);
    (void)fclose(f);
    if (st == FERRY_OK)
        FERRY_LOG_INFO("restored %u modules from %s", (unsigned)n, path);
    return st;
}
