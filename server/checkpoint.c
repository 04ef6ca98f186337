/* checkpoint.c - a ferry-ps checkpoint: every module's configuration (the packed
 * ModuleConfig it was created with), parameter version, parameter block and
 * optimizer state, in one file written atomically (temporary file, then rename).
 * Layout, host byte order:
 *   "FERRYPS1" | u32 format (1) | u32 module count
 *   per module: u32 name length | name | u32 config length | packed ModuleConfig |
 *               u64 version | u64 floats | the parameter block | optimizer state
 *
 * Safety: the temporary file is created with O_EXCL under a random name (a planted
 * file or symlink makes the create fail, never redirects it), renamed over the
 * target (a symlink there is replaced, not followed), and both file and directory
 * are fsynced. A write that would not fit on the file system is refused before it
 * starts, and only the newest `keep` checkpoints stay in the directory, so a client
 * calling Checkpoint in a loop cannot fill the disk. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/core/log.h"
#include "server/ps-impl.h"

#define CKPT_MAGIC      "FERRYPS1"
#define CKPT_FORMAT     1u
#define CKPT_MAX_CONFIG (1u << 20)
#define CKPT_RESERVE    ((uint64_t)64 << 20) /* left free on the file system */

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

/* An upper bound of the file's size: headers, parameters and optimizer slots. */
static uint64_t size_bound(ferry__ps_module **mods, int n) {
    uint64_t total = 16;
    for (int i = 0; i < n; i++)
        total += 64 + FERRY_RPC_NAME_MAX + mods[i]->config_len + (uint64_t)mods[i]->bytes + 4096;
    return total;
}

/* 1 when dir/name is a regular file (not a symlink) starting with the magic. */
static int is_checkpoint(int dirfd, const char *name, struct timespec *mtime) {
    struct stat st;
    if (name[0] == '.' || fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(st.st_mode))
        return 0;
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char magic[8];
    int ok = read(fd, magic, 8) == 8 && memcmp(magic, CKPT_MAGIC, 8) == 0;
    (void)close(fd);
    *mtime = st.st_mtim;
    return ok;
}

typedef struct ckpt_file {
    struct timespec mtime;
    char name[256];
} ckpt_file;

static int newer_first(const void *a, const void *b) {
    const ckpt_file *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec)
        return x->mtime.tv_sec > y->mtime.tv_sec ? -1 : 1;
    if (x->mtime.tv_nsec != y->mtime.tv_nsec)
        return x->mtime.tv_nsec > y->mtime.tv_nsec ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Deletes all but the newest `keep` checkpoints in dir; `current` (just written)
 * always stays. */
static void retain(int dirfd, const char *dir, const char *current, int keep) {
    int fd = dup(dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (d == NULL) {
        if (fd >= 0)
            (void)close(fd);
        return;
    }
    ckpt_file *files = NULL;
    size_t n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        struct timespec mt;
        if (strcmp(e->d_name, current) == 0 || strlen(e->d_name) >= sizeof files->name ||
            !is_checkpoint(dirfd, e->d_name, &mt))
            continue;
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 16;
            ckpt_file *f = realloc(files, nc * sizeof *f);
            if (f == NULL)
                break;
            files = f;
            cap = nc;
        }
        files[n].mtime = mt;
        (void)snprintf(files[n].name, sizeof files[n].name, "%s", e->d_name);
        n++;
    }
    (void)closedir(d);
    if (n > 1)
        qsort(files, n, sizeof *files, newer_first);
    for (size_t i = keep > 1 ? (size_t)keep - 1 : 0; keep > 0 && i < n; i++) {
        if (unlinkat(dirfd, files[i].name, 0) == 0)
            FERRY_LOG_INFO("checkpoint %s/%s deleted (--checkpoint-keep %d)", dir, files[i].name,
                           keep);
    }
    free(files);
}

ferry_status ferry__ps_checkpoint_write(ferry__ps_registry *r, const char *dir, const char *name,
                                        int keep, uint64_t *bytes) {
    char tmp[4096], path[4096];
    if (snprintf(tmp, sizeof tmp, "%s/.%s.XXXXXX", dir, name) >= (int)sizeof tmp ||
        snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return ferry_errorf(FERRY_ERR_INVALID, "checkpoint path too long");
    int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0)
        return ferry_errorf(FERRY_ERR_IO, "cannot open checkpoint directory %s", dir);
    int count;
    ferry__ps_module **mods = ferry__ps_registry_list(r, &count);
    if (mods == NULL && count > 0) {
        (void)close(dirfd);
        return FERRY_ERR_NOMEM;
    }
    uint32_t n = (uint32_t)count;
    struct statvfs vfs;
    uint64_t need = size_bound(mods, count);
    if (fstatvfs(dirfd, &vfs) == 0) {
        uint64_t avail = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
        if (avail < need + CKPT_RESERVE) {
            free(mods);
            (void)close(dirfd);
            return ferry_errorf(FERRY_ERR_RESOURCE,
                                "checkpoint %s needs up to %.1f MiB and %.0f MiB must stay free, "
                                "but the file system has %.1f MiB",
                                path, (double)need / 1048576.0, (double)CKPT_RESERVE / 1048576.0,
                                (double)avail / 1048576.0);
        }
    }
    int fd = mkostemp(tmp, O_CLOEXEC); /* O_EXCL: never opens what is already there */
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (f == NULL) {
        if (fd >= 0) {
            (void)close(fd);
            (void)unlink(tmp);
        }
        free(mods);
        (void)close(dirfd);
        return ferry_errorf(FERRY_ERR_IO, "cannot create a temporary file in %s", dir);
    }
    uint32_t format = CKPT_FORMAT;
    ferry_status st =
        put(f, CKPT_MAGIC, 8) && put(f, &format, 4) && put(f, &n, 4) ? FERRY_OK : FERRY_ERR_IO;
    for (uint32_t i = 0; i < n && st == FERRY_OK; i++)
        st = write_module(mods[i], f);
    free(mods);
    long size = ftell(f);
    if (st == FERRY_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0))
        st = FERRY_ERR_IO;
    if (fclose(f) != 0 && st == FERRY_OK)
        st = FERRY_ERR_IO;
    if (st == FERRY_OK && rename(tmp, path) != 0)
        st = FERRY_ERR_IO;
    if (st != FERRY_OK) {
        (void)unlink(tmp);
        (void)close(dirfd);
        return ferry_errorf(st, "cannot write checkpoint %s", path);
    }
    (void)fsync(dirfd); /* the rename itself survives a crash */
    *bytes = size > 0 ? (uint64_t)size : 0;
    FERRY_LOG_INFO("checkpoint %s: %u modules, %llu bytes", path, (unsigned)n,
                   (unsigned long long)*bytes);
    retain(dirfd, dir, name, keep);
    (void)close(dirfd);
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
    uint64_t version = 0, numel = 0;
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
    uint32_t format = 0, n = 0;
    ferry_status st = FERRY_OK;
    if (!get(f, magic, 8) || memcmp(magic, CKPT_MAGIC, 8) != 0 || !get(f, &format, 4) ||
        format != CKPT_FORMAT || !get(f, &n, 4))
        st = ferry_errorf(FERRY_ERR_FORMAT, "%s is not a ferry-ps checkpoint (format %u)", path,
                          CKPT_FORMAT);
    for (uint32_t i = 0; i < n && st == FERRY_OK; i++)
        st = read_module(r, f, path);
    (void)fclose(f);
    if (st == FERRY_OK)
        FERRY_LOG_INFO("restored %u modules from %s", (unsigned)n, path);
    return st;
}
