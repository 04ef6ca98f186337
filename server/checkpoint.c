/* checkpoint.c - a ferry-ps checkpoint: every module's configuration (the packed
 * ModuleConfig it was created with), parameter version, parameter block and
 * optimizer state, in one ckfile (common/core/ckfile.h: explicit little-endian
 * sections, each with its length and CRC-32, committed by rename):
 *   "FERRYPS3" format 3: section META (u64 job step | u32 module count | u32 owner
 *   length | owner: the identity whose modules a job checkpoint holds, "" for a whole
 *   server's), then one section MODL per module: u32 name length | name | u32 owner
 *   length | owner | u32 config length | packed ferry.v1.ModuleConfig | u64 version |
 *   u64 floats | f32 parameters | u64 optimizer bytes | optimizer state
 *   (ferry_optim_state_save's bytes). Format 2 (before ferry.v1) is refused by name.
 * A file is verified whole (every CRC) before any module is touched, so a damaged
 * checkpoint is refused, never half-restored.
 *
 * Safety: the temporary file is created with O_EXCL under a random name (a planted
 * file or symlink makes the create fail, never redirects it), renamed over the
 * target (a symlink there is replaced, not followed), and both file and directory
 * are fsynced. A write that would not fit on the file system is refused before it
 * starts, and only the newest `keep` checkpoints stay in the directory, so a client
 * calling Checkpoint in a loop cannot fill the disk. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "common/core/ckfile.h"
#include "common/core/log.h"
#include "server/ps-impl.h"

#define CKPT_MAGIC      "FERRYPS3"
#define CKPT_FORMAT     3u
#define CKPT_MAX_CONFIG (1u << 20)
#define CKPT_RESERVE    ((uint64_t)64 << 20) /* left free on the file system */

/* A module's optimizer state as bytes (ferry_optim_state_save writes a FILE). */
static ferry_status optim_bytes(const ferry_optim *o, char **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    FILE *f = open_memstream(buf, len);
    if (f == NULL)
        return FERRY_NOMEM();
    ferry_status st = ferry_optim_state_save(o, f);
    if (fclose(f) != 0 && st == FERRY_OK)
        st = FERRY_NOMEM();
    return st;
}

static ferry_status write_module(ferry__ps_module *m, ferry_ckw *w) {
    uint32_t name_len = (uint32_t)strlen(m->name), config_len = (uint32_t)m->config_len;
    uint32_t owner_len = (uint32_t)strlen(m->owner);
    pthread_rwlock_rdlock(&m->lock);
    uint64_t version = m->version, numel = (uint64_t)m->P.numel;
    char *ob = NULL;
    size_t olen = 0;
    ferry_status st = optim_bytes(m->opt, &ob, &olen);
    uint64_t len = 4 + name_len + 4 + owner_len + 4 + config_len + 8 + 8 + numel * 4 + 8 + olen;
    if (st == FERRY_OK)
        st = ferry_ckw_begin(w, FERRY_CK_TAG("MODL"), len);
    if (st == FERRY_OK) {
        ferry_ckw_u32(w, name_len);
        ferry_ckw_bytes(w, m->name, name_len);
        ferry_ckw_u32(w, owner_len);
        ferry_ckw_bytes(w, m->owner, owner_len);
        ferry_ckw_u32(w, config_len);
        ferry_ckw_bytes(w, m->config_packed, config_len);
        ferry_ckw_u64(w, version);
        ferry_ckw_u64(w, numel);
        ferry_ckw_f32s(w, m->P.data, (size_t)numel);
        ferry_ckw_u64(w, olen);
        ferry_ckw_bytes(w, ob, olen);
        st = ferry_ckw_end(w);
    }
    pthread_rwlock_unlock(&m->lock);
    free(ob);
    return st;
}
/* An upper bound of the file's size: headers, parameters and optimizer slots. */
static uint64_t size_bound(ferry__ps_module **mods, int n) {
    uint64_t total = 16;
    for (int i = 0; i < n; i++)
        total += 64 + FERRY_RPC_NAME_MAX + FERRY_RPC_IDENTITY_MAX + mods[i]->config_len +
                 (uint64_t)mods[i]->bytes + 4096;
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

/* The ferry-ps checkpoints in dirfd other than `skip` (may be NULL), newest first;
 * *n receives the count (a failed allocation lists what was read so far). */
static ckpt_file *list_newest_first(int dirfd, const char *skip, size_t *n) {
    *n = 0;
    int fd = dup(dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (d == NULL) {
        if (fd >= 0)
            (void)close(fd);
        return NULL;
    }
    ckpt_file *files = NULL;
    size_t cap = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        struct timespec mt;
        if ((skip != NULL && strcmp(e->d_name, skip) == 0) ||
            strlen(e->d_name) >= sizeof files->name || !is_checkpoint(dirfd, e->d_name, &mt))
            continue;
        if (*n == cap) {
            size_t nc = cap ? 2 * cap : 16;
            ckpt_file *f = realloc(files, nc * sizeof *f);
            if (f == NULL)
                break;
            files = f;
            cap = nc;
        }
        files[*n].mtime = mt;
        (void)snprintf(files[*n].name, sizeof files[*n].name, "%s", e->d_name);
        (*n)++;
    }
    (void)closedir(d);
    if (*n > 1)
        qsort(files, *n, sizeof *files, newer_first);
    return files;
}

/* Deletes all but the newest `keep` checkpoints in dir; `current` (just written)
 * always stays. */
static void retain(int dirfd, const char *dir, const char *current, int keep) {
    size_t n;
    ckpt_file *files = list_newest_first(dirfd, current, &n);
    for (size_t i = keep > 1 ? (size_t)keep - 1 : 0; keep > 0 && i < n; i++) {
        if (unlinkat(dirfd, files[i].name, 0) == 0)
            FERRY_LOG_INFO("checkpoint %s/%s deleted (--checkpoint-keep %d)", dir, files[i].name,
                           keep);
    }
    free(files);
}

void ferry__ps_checkpoint_retain(const char *dir, const char *current, int keep) {
    int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0)
        return;
    retain(dirfd, dir, current, keep);
    (void)close(dirfd);
}

/* A module a job's file holds: owner's (any with owner NULL) named prefix + a name
 * without '/' (any with prefix NULL): job "a"'s "a/encoder", not job "a/b"'s. */
static int named_in(const char *name, const char *prefix) {
    size_t n = strlen(prefix);
    return strncmp(name, prefix, n) == 0 && name[n] != '\0' && strchr(name + n, '/') == NULL;
}
static int of_job(const ferry__ps_module *m, const char *owner, const char *prefix) {
    return (owner == NULL || strcmp(m->owner, owner) == 0) &&
           (prefix == NULL || named_in(m->name, prefix));
}

static ferry_status write_file(ferry__ps_registry *r, const char *dir, const char *name,
                               const char *owner, const char *prefix, uint64_t step, int keep,
                               uint64_t *bytes);

ferry_status ferry__ps_checkpoint_write(ferry__ps_registry *r, const char *dir, const char *name,
                                        const char *owner, uint64_t step, int keep,
                                        uint64_t *bytes) {
    return write_file(r, dir, name, owner, NULL, step, keep, bytes);
}

static ferry_status write_file(ferry__ps_registry *r, const char *dir, const char *name,
                               const char *owner, const char *prefix, uint64_t step, int keep,
                               uint64_t *bytes) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return ferry_errorf(FERRY_ERR_INVALID, "checkpoint path too long");
    int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0)
        return ferry_errorf(FERRY_ERR_IO, "cannot open checkpoint directory %s", dir);
    int count;
    ferry__ps_module **mods = ferry__ps_registry_list(r, &count);
    if (owner != NULL || prefix != NULL) { /* a job's checkpoint: its owner's modules only */
        int k = 0;
        for (int i = 0; i < count; i++) {
            if (of_job(mods[i], owner, prefix))
                mods[k++] = mods[i];
            else
                ferry__ps_module_put(mods[i]);
        }
        count = k;
    }
    uint32_t n = (uint32_t)count;
    struct statvfs vfs;
    uint64_t need = size_bound(mods, count);
    if (fstatvfs(dirfd, &vfs) == 0) {
        uint64_t avail = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
        if (avail < need + CKPT_RESERVE) {
            ferry__ps_registry_list_free(mods, count);
            (void)close(dirfd);
            return ferry_errorf(FERRY_ERR_RESOURCE,
                                "checkpoint %s needs up to %.1f MiB and %.0f MiB must stay free, "
                                "but the file system has %.1f MiB",
                                path, (double)need / 1048576.0, (double)CKPT_RESERVE / 1048576.0,
                                (double)avail / 1048576.0);
        }
    }
    ferry_ckw *w = NULL;
    ferry_status st = ferry_ckw_open(path, CKPT_MAGIC, CKPT_FORMAT, 1 + n, &w);
    if (st == FERRY_OK) {
        uint8_t meta[16 + FERRY_RPC_IDENTITY_MAX];
        uint32_t ol = owner != NULL ? (uint32_t)strlen(owner) : 0;
        for (int i = 0; i < 8; i++)
            meta[i] = (uint8_t)(step >> (8 * i));
        for (int i = 0; i < 4; i++) {
            meta[8 + i] = (uint8_t)(n >> (8 * i));
            meta[12 + i] = (uint8_t)(ol >> (8 * i));
        }
        if (ol > 0)
            memcpy(meta + 16, owner, ol);
        st = ferry_ckw_section(w, FERRY_CK_TAG("META"), meta, 16 + ol);
    }
    for (uint32_t i = 0; i < n && st == FERRY_OK; i++)
        st = write_module(mods[i], w);
    ferry__ps_registry_list_free(mods, count);
    uint64_t size = w != NULL ? ferry_ckw_size(w) : 0;
    if (st == FERRY_OK)
        st = ferry_ckw_commit(w);
    else
        ferry_ckw_abort(w);
    if (st != FERRY_OK) {
        (void)close(dirfd);
        return ferry_errorf(st, "cannot write checkpoint %s: %s", path, ferry_error_last());
    }
    *bytes = size;
    FERRY_LOG_INFO("checkpoint %s: %u modules at step %llu, %llu bytes", path, (unsigned)n,
                   (unsigned long long)step, (unsigned long long)*bytes);
    retain(dirfd, dir, name, keep);
    (void)close(dirfd);
    return FERRY_OK;
}

/* Recreates (or finds) one module and loads a MODL section into it. */
static ferry_status read_module(ferry__ps_registry *r, ferry__ps_quotas *Q, const ferry_cksec *sec,
                                const char *path) {
    ferry_ckcur c = ferry_ckcur_of(sec);
    uint32_t name_len = ferry_ckcur_u32(&c);
    char name[FERRY_RPC_NAME_MAX], owner[FERRY_RPC_IDENTITY_MAX];
    const char *np = name_len > 0 && name_len < sizeof name ? ferry_ckcur_bytes(&c, name_len) : NULL;
    uint32_t owner_len = np != NULL ? ferry_ckcur_u32(&c) : 0;
    const char *op =
        np != NULL && owner_len < sizeof owner ? ferry_ckcur_bytes(&c, owner_len) : NULL;
    uint32_t config_len = op != NULL ? ferry_ckcur_u32(&c) : 0;
    const uint8_t *packed =
        op != NULL && config_len <= CKPT_MAX_CONFIG ? ferry_ckcur_bytes(&c, config_len) : NULL;
    if (np == NULL || op == NULL || packed == NULL || c.bad)
        return ferry_errorf(FERRY_ERR_FORMAT, "%s: bad module header", path);
    memcpy(name, np, name_len);
    name[name_len] = '\0';
    memcpy(owner, op, owner_len);
    owner[owner_len] = '\0';
    Ferry__V1__ModuleConfig *cfg = ferry__v1__module_config__unpack(NULL, config_len, packed);
    if (cfg == NULL)
        return ferry_errorf(FERRY_ERR_FORMAT, "%s: module '%s' has a bad config", path, name);
    ferry_rpc_msg none;
    ferry_rpc_msg_init(&none);
    ferry__ps_module *m = NULL;
    int created = 0;
    ferry_status st = ferry__ps_registry_create(
        r, owner, Q != NULL ? ferry__ps_quota_of(Q, owner) : NULL, name, cfg, &none, &created, &m);
    ferry__v1__module_config__free_unpacked(cfg, NULL);
    if (st != FERRY_OK)
        return st;
    uint64_t version = ferry_ckcur_u64(&c), numel = ferry_ckcur_u64(&c);
    if (c.bad || numel != (uint64_t)m->P.numel || ferry_ckcur_left(&c) < numel * 4 + 8) {
        st = ferry_errorf(FERRY_ERR_FORMAT, "%s: module '%s' has %llu floats, expected %lld", path,
                          name, (unsigned long long)numel, (long long)m->P.numel);
        ferry__ps_module_put(m);
        return st;
    }
    pthread_rwlock_wrlock(&m->lock);
    ferry_ckcur_f32s(&c, m->P.data, (size_t)numel);
    uint64_t olen = ferry_ckcur_u64(&c);
    const void *ob = olen <= ferry_ckcur_left(&c) ? ferry_ckcur_bytes(&c, (size_t)olen) : NULL;
    FILE *f = ob != NULL && olen > 0 ? fmemopen((void *)(uintptr_t)ob, (size_t)olen, "rb") : NULL;
    st = f != NULL ? ferry_optim_state_load(m->opt, f)
                   : ferry_errorf(FERRY_ERR_FORMAT, "%s: module '%s': no optimizer state", path,
                                  name);
    if (f != NULL)
        (void)fclose(f);
    if (st == FERRY_OK && ferry_ckcur_left(&c) != 0)
        st = ferry_errorf(FERRY_ERR_FORMAT, "%s: module '%s': %zu stray bytes", path, name,
                          ferry_ckcur_left(&c));
    m->version = version;
    m->loads++;
    pthread_rwlock_unlock(&m->lock);
    ferry__ps_module_put(m);
    return st;
}

/* META: the job step, the module count and the owner (cap >= FERRY_RPC_IDENTITY_MAX). */
static ferry_status read_meta(const ferry_ckr *ck, uint64_t *step, uint32_t *n, char *owner) {
    ferry_ckcur c = ferry_ckr_section(ck, FERRY_CK_TAG("META"));
    *step = ferry_ckcur_u64(&c);
    *n = ferry_ckcur_u32(&c);
    uint32_t ol = ferry_ckcur_u32(&c);
    const char *o = !c.bad && ol < FERRY_RPC_IDENTITY_MAX ? ferry_ckcur_bytes(&c, ol) : NULL;
    if (c.bad || o == NULL || ck->n != *n + 1)
        return ferry_errorf(FERRY_ERR_FORMAT, "%s: META says %u modules, the file has %u sections",
                            ck->path, *n, ck->n);
    memcpy(owner, o, ol);
    owner[ol] = '\0';
    return FERRY_OK;
}

/* A reader's FERRY_ERR_FORMAT for path, saying plainly when the file is a checkpoint of
 * format 2 (before ferry.v1). */
static ferry_status old_format(const char *path, ferry_status st) {
    if (st == FERRY_ERR_FORMAT) {
        char why[512];
        (void)snprintf(why, sizeof why, "%s", ferry_error_last());
        FILE *f = fopen(path, "rb");
        char magic[8] = {0};
        int old = f != NULL && fread(magic, 1, 8, f) == 8 && memcmp(magic, "FERRYPS2", 8) == 0;
        if (f != NULL)
            (void)fclose(f);
        if (old)
            return ferry_errorf(FERRY_ERR_FORMAT,
                                "%s is a ferry-ps checkpoint of format 2, written before the "
                                "ferry.v1 contract: this ferry-ps reads format 3 only",
                                path);
        return ferry_errorf(st, "%s", why);
    }
    return st;
}

/* ferry_ckr_read, saying plainly what a checkpoint of format 2 is. */
static ferry_status ck_open(const char *path, ferry_ckr *ck) {
    return old_format(path, ferry_ckr_read(path, CKPT_MAGIC, CKPT_FORMAT, ck));
}

ferry_status ferry__ps_checkpoint_verify(const char *path, uint64_t *step, char *owner) {
    /* Streamed: a probe checks a checkpoint of any size in 1 MiB of memory. */
    uint8_t meta[16 + FERRY_RPC_IDENTITY_MAX];
    size_t len;
    uint32_t nsec;
    ferry_status st =
        old_format(path, ferry_ck_verify(path, CKPT_MAGIC, CKPT_FORMAT, FERRY_CK_TAG("META"), meta,
                                         sizeof meta, &len, &nsec));
    if (st != FERRY_OK)
        return st;
    ferry_ckcur c = {meta, meta + len, len == 0};
    char o[FERRY_RPC_IDENTITY_MAX];
    *step = ferry_ckcur_u64(&c);
    uint32_t n = ferry_ckcur_u32(&c), ol = ferry_ckcur_u32(&c);
    const char *ob = !c.bad && ol < FERRY_RPC_IDENTITY_MAX ? ferry_ckcur_bytes(&c, ol) : NULL;
    if (c.bad || ob == NULL || nsec != n + 1)
        return ferry_errorf(FERRY_ERR_FORMAT, "%s: META says %u modules, the file has %u sections",
                            path, n, nsec);
    char *out = owner != NULL ? owner : o;
    memcpy(out, ob, ol);
    out[ol] = '\0';
    return FERRY_OK;
}

/* A module section's owner (cap >= FERRY_RPC_IDENTITY_MAX); FERRY_ERR_FORMAT if its
 * header is bad. */
static ferry_status module_head(const ferry_cksec *sec, const char *path, char *name, char *owner);
static ferry_status module_owner(const ferry_cksec *sec, const char *path, char *owner) {
    return module_head(sec, path, NULL, owner);
}

/* A MODL section's name (cap FERRY_RPC_NAME_MAX; NULL: not wanted) and owner. */
static ferry_status module_head(const ferry_cksec *sec, const char *path, char *name, char *owner) {
    ferry_ckcur c = ferry_ckcur_of(sec);
    uint32_t name_len = ferry_ckcur_u32(&c);
    const char *np =
        name_len > 0 && name_len < FERRY_RPC_NAME_MAX ? ferry_ckcur_bytes(&c, name_len) : NULL;
    uint32_t owner_len = np != NULL ? ferry_ckcur_u32(&c) : 0;
    const char *op =
        np != NULL && owner_len < FERRY_RPC_IDENTITY_MAX ? ferry_ckcur_bytes(&c, owner_len) : NULL;
    if (np == NULL || op == NULL || c.bad)
        return ferry_errorf(FERRY_ERR_FORMAT, "%s: bad module header", path);
    memcpy(owner, op, owner_len);
    owner[owner_len] = '\0';
    if (name != NULL) {
        memcpy(name, np, name_len);
        name[name_len] = '\0';
    }
    return FERRY_OK;
}

/* Every module of ck, and its META, belong to `owner`: FERRY_ERR_DENIED naming the first
 * that does not. */
static ferry_status owned_by(const ferry_ckr *ck, const char *meta_owner, const char *owner) {
    if (strcmp(meta_owner, owner) != 0)
        return ferry_errorf(FERRY_ERR_DENIED, "%s is a checkpoint of '%s', not of '%s'", ck->path,
                            meta_owner, owner);
    for (uint32_t i = 1; i < ck->n; i++) {
        char o[FERRY_RPC_IDENTITY_MAX];
        ferry_status st = module_owner(&ck->sec[i], ck->path, o);
        if (st != FERRY_OK)
            return st;
        if (strcmp(o, owner) != 0)
            return ferry_errorf(FERRY_ERR_DENIED,
                                "%s: module section %u belongs to '%s', not to '%s'", ck->path, i,
                                o, owner);
    }
    return FERRY_OK;
}

ferry_status ferry__ps_checkpoint_check_owner(const char *path, const char *owner, uint64_t *step) {
    ferry_ckr ck;
    ferry_status st = ck_open(path, &ck);
    if (st != FERRY_OK)
        return st;
    uint32_t n = 0;
    char meta_owner[FERRY_RPC_IDENTITY_MAX];
    if ((st = read_meta(&ck, step, &n, meta_owner)) == FERRY_OK)
        st = owned_by(&ck, meta_owner, owner);
    ferry_ckr_free(&ck);
    return st;
}

ferry_status ferry__ps_checkpoint_read(ferry__ps_registry *r, ferry__ps_quotas *Q, const char *path,
                                       const char *only, uint64_t *step) {
    ferry_ckr ck;
    ferry_status st = ck_open(path, &ck);
    if (st != FERRY_OK)
        return st;
    uint32_t n = 0;
    uint64_t s = 0;
    char owner[FERRY_RPC_IDENTITY_MAX];
    st = read_meta(&ck, &s, &n, owner);
    if (st == FERRY_OK && only != NULL) /* before anything is changed */
        st = owned_by(&ck, owner, only);
    for (uint32_t i = 1; i < ck.n && st == FERRY_OK; i++) {
        if (ck.sec[i].tag != FERRY_CK_TAG("MODL"))
            st = ferry_errorf(FERRY_ERR_FORMAT, "%s: section %u is not a module", path, i + 1);
        else
            st = read_module(r, Q, &ck.sec[i], path);
    }
    ferry_ckr_free(&ck);
    if (st == FERRY_OK) {
        FERRY_LOG_INFO("restored %u modules at step %llu from %s", (unsigned)n,
                       (unsigned long long)s, path);
        if (step != NULL)
            *step = s;
    }
    return st;
}

/* "<job>-step<N>.ckpt" -> N; 0 when name is not one of job's. */
static int job_file_step(const char *name, const char *job, uint64_t *step) {
    size_t jl = strlen(job);
    if (strncmp(name, job, jl) != 0 || strncmp(name + jl, "-step", 5) != 0)
        return 0;
    const char *p = name + jl + 5;
    char *end;
    if (*p < '0' || *p > '9')
        return 0;
    unsigned long long v = strtoull(p, &end, 10);
    if (strcmp(end, ".ckpt") != 0)
        return 0;
    *step = v;
    return 1;
}

/* A temporary name's <name> (len bytes) is "<job>-step<N>.ckpt". */
static int job_temp(const char *name, size_t len, const void *user) {
    char file[512];
    uint64_t step;
    if (len >= sizeof file)
        return 0;
    memcpy(file, name, len);
    file[len] = '\0';
    return job_file_step(file, user, &step);
}

int ferry__ps_checkpoint_sweep_temps(const char *dir, const char *job) {
    uint64_t bytes = 0;
    int n = ferry_ck_sweep_temps(dir, CKPT_MAGIC, job != NULL ? job_temp : NULL, job, &bytes);
    if (n > 0)
        FERRY_LOG_INFO("removed %d temporary file%s of checkpoint writes a kill interrupted "
                       "(%s/.%s%s.XXXXXX, %.1f MB)",
                       n, n > 1 ? "s" : "", dir, job != NULL ? job : "*",
                       job != NULL ? "-step<N>.ckpt" : "", (double)bytes / 1e6);
    return n;
}

void ferry__ps_manifest_init(ferry__ps_manifest *M) {
    memset(M, 0, sizeof *M);
    pthread_mutex_init(&M->mu, NULL);
}

void ferry__ps_manifest_deinit(ferry__ps_manifest *M) {
    free(M->e);
    pthread_mutex_destroy(&M->mu);
    memset(M, 0, sizeof *M);
}

/* The entry of dir/name as it is now: from the manifest while the file's size, time and
 * inode match, else verified (read whole) and recorded. *e receives a copy. M's lock
 * held. */
static void manifest_look(ferry__ps_manifest *M, const char *path, const char *name,
                          const struct stat *sb, ferry__ps_manifest_entry *e) {
    int64_t mt = (int64_t)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec;
    for (size_t i = 0; i < M->n; i++) {
        ferry__ps_manifest_entry *x = &M->e[i];
        if (strcmp(x->name, name) == 0 && x->size == (int64_t)sb->st_size && x->mtime_ns == mt &&
            x->ino == (uint64_t)sb->st_ino) {
            *e = *x;
            M->reused++;
            return;
        }
    }
    memset(e, 0, sizeof *e);
    (void)snprintf(e->name, sizeof e->name, "%s", name);
    e->size = (int64_t)sb->st_size;
    e->mtime_ns = mt;
    e->ino = (uint64_t)sb->st_ino;
    e->ok = ferry__ps_checkpoint_verify(path, &e->step, e->owner) == FERRY_OK;
    if (!e->ok)
        FERRY_LOG_WARN("checkpoint %s is not usable: %s", path, ferry_error_last());
    M->verified++;
    M->bytes_read += (uint64_t)sb->st_size;
    for (size_t i = 0; i < M->n; i++) { /* the file changed: replace its entry */
        if (strcmp(M->e[i].name, name) == 0) {
            M->e[i] = *e;
            return;
        }
    }
    if (M->n == M->cap) {
        size_t cap = M->cap ? 2 * M->cap : 16;
        ferry__ps_manifest_entry *p = realloc(M->e, cap * sizeof *p);
        if (p == NULL)
            return; /* not remembered: verified again next time */
        M->e = p;
        M->cap = cap;
    }
    M->e[M->n++] = *e;
}

/* What ferry__ps_checkpoint_job_steps's scan needs to judge one entry. */
typedef struct job_scan {
    const char *dir, *job, *owner;
    ferry__ps_manifest *M;
} job_scan;

/* A job checkpoint of the scan's job and owner that verifies (the manifest
 * remembers files already read), named after the step it holds. */
static int job_step_of(const char *name, void *user, uint64_t *step) {
    const job_scan *js = user;
    char path[4096];
    struct stat sb;
    if (!job_file_step(name, js->job, step) ||
        snprintf(path, sizeof path, "%s/%s", js->dir, name) >= (int)sizeof path ||
        lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
        return 0;
    ferry__ps_manifest_entry m;
    manifest_look(js->M, path, name, &sb, &m);
    if (!m.ok)
        return 0;
    if (m.step != *step) {
        FERRY_LOG_WARN("checkpoint %s is not usable: its step differs from its name", path);
        return 0;
    }
    /* Another identity's job of the same name is not this one's. */
    return js->owner == NULL || strcmp(m.owner, js->owner) == 0;
}

ferry_status ferry__ps_checkpoint_job_steps(const char *dir, ferry__ps_manifest *M, const char *job,
                                            const char *owner, uint64_t **steps, size_t *n) {
    job_scan js = {dir, job, owner, M};
    pthread_mutex_lock(&M->mu);
    ferry_status st = ferry_ck_list_steps(dir, job_step_of, &js, steps, n);
    pthread_mutex_unlock(&M->mu);
    return st;
}

ferry_status ferry__ps_checkpoint_newest(const char *dir, char *path, size_t cap, int *found) {
    *found = 0;
    int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0)
        return ferry_errorf(FERRY_ERR_IO, "cannot list checkpoint directory %s", dir);
    size_t n;
    ckpt_file *files = list_newest_first(dirfd, NULL, &n);
    (void)close(dirfd);
    for (size_t i = 0; i < n && !*found; i++) {
        uint64_t step;
        (void)snprintf(path, cap, "%s/%s", dir, files[i].name);
        if (ferry__ps_checkpoint_verify(path, &step, NULL) == FERRY_OK)
            *found = 1;
        else
            FERRY_LOG_WARN("skipping checkpoint %s: %s", path, ferry_error_last());
    }
    free(files);
    return FERRY_OK;
}

/* ---- a job's modules between servers (JobReshard EXPORT and ADOPT) ---- */

#define MOVE_DIR_PREFIX ".ferry-move."

/* Where moves write: dir (--checkpoint-dir), else $TMPDIR or /tmp. */
static const char *move_base(const char *dir) {
    const char *base = dir != NULL && dir[0] != '\0' ? dir : getenv("TMPDIR");
    return base != NULL && base[0] != '\0' ? base : "/tmp";
}

/* A private directory for one file under move_base(dir). */
static ferry_status move_dir(const char *dir, char *out, size_t cap) {
    const char *base = move_base(dir);
    if (snprintf(out, cap, "%s/" MOVE_DIR_PREFIX "XXXXXX", base) >= (int)cap)
        return ferry_errorf(FERRY_ERR_INVALID, "%s: path too long", base);
    if (mkdtemp(out) == NULL)
        return ferry_errorf(FERRY_ERR_IO, "cannot make a directory in %s to move a job's modules",
                            base);
    return FERRY_OK;
}

ferry_status ferry__ps_checkpoint_export(ferry__ps_registry *r, const char *dir, const char *owner,
                                         const char *prefix, uint64_t step, uint8_t **data,
                                         size_t *len) {
    char tmp[4096], path[4200];
    *data = NULL;
    *len = 0;
    ferry_status st = move_dir(dir, tmp, sizeof tmp - 16);
    if (st != FERRY_OK)
        return st;
    (void)snprintf(path, sizeof path, "%s/export.ckpt", tmp);
    uint64_t bytes = 0;
    st = write_file(r, tmp, "export.ckpt", owner, prefix, step, 0, &bytes);
    FILE *f = st == FERRY_OK ? fopen(path, "rb") : NULL;
    if (st == FERRY_OK && (f == NULL || bytes == 0 || (*data = malloc(bytes)) == NULL ||
                           fread(*data, 1, bytes, f) != bytes))
        st = *data == NULL && f != NULL && bytes > 0
                 ? FERRY_NOMEM()
                 : ferry_errorf(FERRY_ERR_IO, "%s: cannot read it back", path);
    if (f != NULL)
        (void)fclose(f);
    if (st == FERRY_OK) {
        *len = (size_t)bytes;
    } else {
        free(*data);
        *data = NULL;
    }
    (void)unlink(path);
    (void)rmdir(tmp);
    return st;
}

/* 1 for a name a move writes in its directory: export.ckpt and adopt.ckpt, and the
 * temporary an export is written to before its rename (.export.ckpt.XXXXXX). */
static int move_file(const char *name) {
    return strcmp(name, "export.ckpt") == 0 || strcmp(name, "adopt.ckpt") == 0 ||
           strncmp(name, ".export.ckpt.", 13) == 0;
}

int ferry__ps_checkpoint_sweep_moves(const char *dir, double min_age_s) {
    const char *base = move_base(dir);
    int dirfd = open(base, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dirfd >= 0 ? fdopendir(dirfd) : NULL;
    if (d == NULL) {
        if (dirfd >= 0)
            (void)close(dirfd);
        return 0;
    }
    int removed = 0;
    double now = (double)time(NULL);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        struct stat sb, sub_sb;
        if (strncmp(e->d_name, MOVE_DIR_PREFIX, strlen(MOVE_DIR_PREFIX)) != 0 ||
            fstatat(dirfd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(sb.st_mode) ||
            sb.st_uid != geteuid() || now - (double)sb.st_mtime < min_age_s)
            continue;
        int sub = openat(dirfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        DIR *sd = NULL;
        const char *why = NULL;
        if (sub < 0)
            why = strerror(errno);
        else if (fstat(sub, &sub_sb) != 0 || sub_sb.st_dev != sb.st_dev ||
                 sub_sb.st_ino != sb.st_ino)
            why = "it was replaced while it was looked at";
        else if ((sd = fdopendir(sub)) == NULL)
            why = strerror(errno);
        if (why != NULL) {
            if (sub >= 0)
                (void)close(sub);
            FERRY_LOG_WARN("left %s/%s, the directory of a job move a kill interrupted: %s", base,
                           e->d_name, why);
            continue;
        }
        for (struct dirent *f; (f = readdir(sd)) != NULL;)
            if (move_file(f->d_name)) /* a link itself, never what it points to */
                (void)unlinkat(sub, f->d_name, 0);
        (void)closedir(sd); /* closes sub */
        if (unlinkat(dirfd, e->d_name, AT_REMOVEDIR) == 0)
            removed++;
        else
            FERRY_LOG_WARN(
                "left %s/%s, the directory of a job move a kill interrupted: %s", base, e->d_name,
                errno == ENOTEMPTY || errno == EEXIST ? "it holds files a move does not write"
                                                      : strerror(errno));
    }
    (void)closedir(d); /* closes dirfd */
    if (removed > 0)
        FERRY_LOG_INFO("removed %d director%s of job moves a kill interrupted (%s/" MOVE_DIR_PREFIX
                       "XXXXXX)",
                       removed, removed > 1 ? "ies" : "y", base);
    return removed;
}

/* Deletes owner's modules named prefix... from r. */
static void drop_job_modules(ferry__ps_registry *r, const char *owner, const char *prefix) {
    int n = 0;
    ferry__ps_module **mods = ferry__ps_registry_list(r, &n);
    for (int i = 0; i < n; i++) {
        int64_t bytes = 0;
        if (of_job(mods[i], owner, prefix))
            (void)ferry__ps_registry_delete(r, mods[i], &bytes);
    }
    ferry__ps_registry_list_free(mods, n);
}

ferry_status ferry__ps_checkpoint_adopt(ferry__ps_registry *r, ferry__ps_quotas *Q, const char *dir,
                                        const uint8_t *data, size_t len, const char *owner,
                                        const char *prefix, uint64_t step, uint32_t *nmods,
                                        int *changed) {
    char tmp[4096], path[4200];
    *changed = 0;
    ferry_status st = move_dir(dir, tmp, sizeof tmp - 16);
    if (st != FERRY_OK)
        return st;
    (void)snprintf(path, sizeof path, "%s/adopt.ckpt", tmp);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    size_t done = 0;
    while (fd >= 0 && done < len) {
        ssize_t w = write(fd, data + done, len - done);
        if (w <= 0)
            break;
        done += (size_t)w;
    }
    if (fd < 0 || done != len)
        st = ferry_errorf(FERRY_ERR_IO, "%s: cannot write the job's modules there", path);
    if (fd >= 0)
        (void)close(fd);
    /* Everything is checked before anything here changes: the whole file (format,
     * every section's CRC), its step, its owner and every module's owner and name. */
    ferry_ckr ck;
    int open_ck = 0;
    uint64_t s = 0;
    uint32_t n = 0;
    char meta_owner[FERRY_RPC_IDENTITY_MAX];
    if (st == FERRY_OK && (st = ck_open(path, &ck)) == FERRY_OK)
        open_ck = 1;
    if (st == FERRY_OK && (st = read_meta(&ck, &s, &n, meta_owner)) == FERRY_OK &&
        (st = owned_by(&ck, meta_owner, owner)) == FERRY_OK && s != step)
        st = ferry_errorf(FERRY_ERR_FORMAT, "the modules sent are of step %llu, not %llu",
                          (unsigned long long)s, (unsigned long long)step);
    for (uint32_t i = 1; open_ck && st == FERRY_OK && i < ck.n; i++) {
        char name[FERRY_RPC_NAME_MAX], o[FERRY_RPC_IDENTITY_MAX];
        if (ck.sec[i].tag != FERRY_CK_TAG("MODL"))
            st = ferry_errorf(FERRY_ERR_FORMAT, "section %u is not a module", i + 1);
        else if ((st = module_head(&ck.sec[i], path, name, o)) == FERRY_OK &&
                 !named_in(name, prefix))
            st = ferry_errorf(FERRY_ERR_DENIED, "module '%s' is not one of the job's (%s...)", name,
                              prefix);
    }
    if (st == FERRY_OK) {
        *changed = 1;
        drop_job_modules(r, owner, prefix);
        for (uint32_t i = 1; i < ck.n && st == FERRY_OK; i++)
            st = read_module(r, Q, &ck.sec[i], path);
        if (st != FERRY_OK)
            drop_job_modules(r, owner, prefix); /* none half-restored */
    }
    if (open_ck)
        ferry_ckr_free(&ck);
    if (st == FERRY_OK)
        *nmods = n;
    (void)unlink(path);
    (void)rmdir(tmp);
    return st;
}
