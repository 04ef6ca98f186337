/* ckfile.c - see ckfile.h. CRC-32 is zlib's (the same polynomial as gzip and PNG,
 * so `crc32` tools can check a section by hand). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/core/ckfile.h"
#include "common/core/log.h"

struct ferry_ckw {
    FILE *f;
    char path[4096], tmp[4096], dir[4096];
    uint64_t written;
    uint64_t sec_left; /* bytes the open section still expects */
    int in_section;
    uint32_t crc;
    int err; /* errno of the first failed write */
};

static int host_is_le(void) {
    const uint16_t one = 1;
    return *(const uint8_t *)&one == 1;
}

static uint32_t crc_update(uint32_t crc, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n > 0) { /* zlib takes uInt lengths */
        uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
        crc = (uint32_t)crc32(crc, b, chunk);
        b += chunk;
        n -= chunk;
    }
    return crc;
}

static void raw(ferry_ckw *w, const void *p, size_t n) {
    if (w->err == 0 && n > 0 && fwrite(p, 1, n, w->f) != n)
        w->err = errno ? errno : EIO;
    w->written += n;
}

static void le_bytes(uint8_t *b, uint64_t v, int n) {
    for (int i = 0; i < n; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}

ferry_status ferry_ckw_open(const char *path, const char magic[8], uint32_t format,
                            uint32_t nsections, ferry_ckw **out) {
    ferry_ckw *w = calloc(1, sizeof *w);
    if (w == NULL)
        return FERRY_NOMEM();
    const char *slash = strrchr(path, '/');
    const char *base = slash != NULL ? slash + 1 : path;
    int dl = slash != NULL ? (int)(slash - path) : 1;
    if (base[0] == '\0' ||
        snprintf(w->path, sizeof w->path, "%s", path) >= (int)sizeof w->path ||
        snprintf(w->dir, sizeof w->dir, "%.*s", dl == 0 ? 1 : dl,
                 slash != NULL ? path : ".") >= (int)sizeof w->dir ||
        snprintf(w->tmp, sizeof w->tmp, "%s/.%s.XXXXXX", w->dir, base) >= (int)sizeof w->tmp) {
        free(w);
        return ferry_errorf(FERRY_ERR_INVALID, "checkpoint path '%.200s' is not a file name",
                            path);
    }
    int fd = mkostemp(w->tmp, O_CLOEXEC); /* O_EXCL: never opens what is already there */
    if (fd < 0 || (w->f = fdopen(fd, "wb")) == NULL) {
        int e = errno;
        if (fd >= 0) {
            (void)close(fd);
            (void)unlink(w->tmp);
        }
        free(w);
        return ferry_errorf(FERRY_ERR_IO, "cannot create a temporary file beside %s: %s", path,
                            strerror(e));
    }
    (void)setvbuf(w->f, NULL, _IOFBF, 1 << 20);
    uint8_t head[16];
    memcpy(head, magic, 8);
    le_bytes(head + 8, format, 4);
    le_bytes(head + 12, nsections, 4);
    raw(w, head, sizeof head);
    *out = w;
    return FERRY_OK;
}

ferry_status ferry_ckw_begin(ferry_ckw *w, uint32_t tag, uint64_t len) {
    if (w->in_section)
        return ferry_errorf(FERRY_ERR_INVALID, "checkpoint %s: section still open", w->path);
    uint8_t h[12];
    le_bytes(h, tag, 4);
    le_bytes(h + 4, len, 8);
    raw(w, h, sizeof h);
    w->in_section = 1;
    w->sec_left = len;
    w->crc = (uint32_t)crc32(0L, Z_NULL, 0);
    return FERRY_OK;
}

void ferry_ckw_bytes(ferry_ckw *w, const void *p, size_t n) {
    if (n > w->sec_left) {
        w->err = w->err ? w->err : ERANGE;
        return;
    }
    w->sec_left -= n;
    w->crc = crc_update(w->crc, p, n);
    raw(w, p, n);
}

void ferry_ckw_u32(ferry_ckw *w, uint32_t v) {
    uint8_t b[4];
    le_bytes(b, v, 4);
    ferry_ckw_bytes(w, b, 4);
}

void ferry_ckw_u64(ferry_ckw *w, uint64_t v) {
    uint8_t b[8];
    le_bytes(b, v, 8);
    ferry_ckw_bytes(w, b, 8);
}

void ferry_ckw_f64(ferry_ckw *w, double v) {
    uint64_t bits;
    memcpy(&bits, &v, 8);
    ferry_ckw_u64(w, bits);
}

void ferry_ckw_f32s(ferry_ckw *w, const float *p, size_t n) {
    if (host_is_le()) {
        ferry_ckw_bytes(w, p, n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &p[i], 4);
        ferry_ckw_u32(w, bits);
    }
}

ferry_status ferry_ckw_end(ferry_ckw *w) {
    if (!w->in_section || w->sec_left != 0)
        return ferry_errorf(FERRY_ERR_INVALID, "checkpoint %s: section length mismatch (%llu "
                                               "bytes short)",
                            w->path, (unsigned long long)w->sec_left);
    w->in_section = 0;
    uint8_t b[4];
    le_bytes(b, w->crc, 4);
    raw(w, b, 4);
    return w->err == 0 ? FERRY_OK
                       : ferry_errorf(FERRY_ERR_IO, "cannot write %s: %s", w->tmp,
                                      strerror(w->err));
}

ferry_status ferry_ckw_section(ferry_ckw *w, uint32_t tag, const void *p, uint64_t len) {
    ferry_status st = ferry_ckw_begin(w, tag, len);
    if (st == FERRY_OK) {
        ferry_ckw_bytes(w, p, (size_t)len);
        st = ferry_ckw_end(w);
    }
    return st;
}

uint64_t ferry_ckw_size(const ferry_ckw *w) {
    return w->written;
}

void ferry_ckw_abort(ferry_ckw *w) {
    if (w == NULL)
        return;
    (void)fclose(w->f);
    (void)unlink(w->tmp);
    free(w);
}

ferry_status ferry_ckw_commit(ferry_ckw *w) {
    ferry_status st = FERRY_OK;
    if (w->in_section)
        st = ferry_errorf(FERRY_ERR_INVALID, "checkpoint %s: a section was left open", w->path);
    if (st == FERRY_OK && w->err != 0)
        st = ferry_errorf(FERRY_ERR_IO, "cannot write %s: %s", w->tmp, strerror(w->err));
    if (st == FERRY_OK && (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0))
        st = ferry_errorf(FERRY_ERR_IO, "cannot flush %s: %s", w->tmp, strerror(errno));
    if (fclose(w->f) != 0 && st == FERRY_OK)
        st = ferry_errorf(FERRY_ERR_IO, "cannot close %s: %s", w->tmp, strerror(errno));
    if (st == FERRY_OK && rename(w->tmp, w->path) != 0)
        st = ferry_errorf(FERRY_ERR_IO, "cannot rename %s to %s: %s", w->tmp, w->path,
                          strerror(errno));
    if (st != FERRY_OK) {
        (void)unlink(w->tmp);
    } else {
        int dfd = open(w->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) { /* the rename itself survives a crash */
            (void)fsync(dfd);
            (void)close(dfd);
        }
    }
    free(w);
    return st;
}

/* ---- reading ---- */

static uint64_t le_get(const uint8_t *b, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)b[i] << (8 * i);
    return v;
}

void ferry_ck_tag_name(uint32_t tag, char out[5]) {
    for (int i = 0; i < 4; i++) {
        char ch = (char)(tag >> (8 * i));
        out[i] = ch >= 0x20 && ch < 0x7f ? ch : '?';
    }
    out[4] = '\0';
}

int ferry_ck_has_magic(const char *path, const char magic[8]) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char m[8];
    int ok = read(fd, m, 8) == 8 && memcmp(m, magic, 8) == 0;
    (void)close(fd);
    return ok;
}

/* The <name> of a temporary file name ".<name>.XXXXXX" (*len its length), else NULL. */
static const char *temp_name(const char *file, size_t *len) {
    size_t n = strlen(file);
    if (n < 9 || file[0] != '.' || file[n - 7] != '.')
        return NULL;
    for (size_t i = n - 6; i < n; i++) {
        char c = file[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
            return NULL;
    }
    *len = n - 8;
    return file + 1;
}

/* 1 when the regular file name in dirfd begins with magic, or is a prefix of it. */
static int starts_as(int dirfd, const char *name, const char magic[8], uint64_t *size) {
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
        st.st_uid != geteuid())
        return 0;
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char head[8];
    ssize_t n = read(fd, head, sizeof head);
    (void)close(fd);
    *size = (uint64_t)st.st_size;
    return n >= 0 && (n == 8 || (uint64_t)n == *size) && memcmp(head, magic, (size_t)n) == 0;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

ferry_status ferry_ck_list_steps(const char *dir,
                                 int (*step_of)(const char *name, void *user, uint64_t *step),
                                 void *user, uint64_t **steps, size_t *n) {
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (d == NULL)
        return ferry_errorf(FERRY_ERR_IO, "cannot list checkpoint directory %s: %s", dir,
                            strerror(errno));
    size_t cap = 0;
    ferry_status st = FERRY_OK;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        uint64_t s;
        if (!step_of(e->d_name, user, &s))
            continue;
        if (*n == cap) {
            size_t nc = cap ? 2 * cap : 16;
            uint64_t *p = realloc(*steps, nc * sizeof *p);
            if (p == NULL) {
                st = FERRY_NOMEM();
                break;
            }
            *steps = p;
            cap = nc;
        }
        (*steps)[(*n)++] = s;
    }
    (void)closedir(d);
    if (*n > 1)
        qsort(*steps, *n, sizeof **steps, cmp_u64);
    return st;
}

int ferry_ck_sweep_temps(const char *dir, const char magic[8],
                         int (*match)(const char *name, size_t len, const void *user),
                         const void *user, uint64_t *bytes) {
    int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dirfd >= 0 ? fdopendir(dirfd) : NULL;
    if (d == NULL) {
        if (dirfd >= 0)
            (void)close(dirfd);
        return -1;
    }
    int removed = 0;
    uint64_t total = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        size_t len;
        uint64_t size = 0;
        const char *name = temp_name(e->d_name, &len);
        if (name == NULL || (match != NULL && !match(name, len, user)) ||
            !starts_as(dirfd, e->d_name, magic, &size) || unlinkat(dirfd, e->d_name, 0) != 0)
            continue;
        removed++;
        total += size;
    }
    (void)closedir(d); /* closes dirfd */
    if (bytes != NULL)
        *bytes = total;
    return removed;
}

void ferry_ckr_free(ferry_ckr *r) {
    free(r->data);
    free(r->sec);
    r->data = NULL;
    r->sec = NULL;
}

static ferry_status slurp(const char *path, ferry_ckr *r) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ferry_errorf(FERRY_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    ferry_status st = FERRY_OK;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        st = ferry_errorf(FERRY_ERR_IO, "%s is not a regular file", path);
    size_t size = st == FERRY_OK ? (size_t)sb.st_size : 0;
    if (st == FERRY_OK && (r->data = malloc(size ? size : 1)) == NULL)
        st = FERRY_NOMEM();
    size_t got = 0;
    while (st == FERRY_OK && got < size) {
        ssize_t k = read(fd, r->data + got, size - got);
        if (k <= 0) {
            st = ferry_errorf(FERRY_ERR_IO, "cannot read %s: %s", path,
                              k < 0 ? strerror(errno) : "short read");
            break;
        }
        got += (size_t)k;
    }
    (void)close(fd);
    r->size = got;
    return st;
}

ferry_status ferry_ckr_read(const char *path, const char magic[8], uint32_t format,
                            ferry_ckr *r) {
    memset(r, 0, sizeof *r);
    (void)snprintf(r->path, sizeof r->path, "%s", path);
    ferry_status st = slurp(path, r);
    if (st != FERRY_OK) {
        ferry_ckr_free(r);
        return st;
    }
    const uint8_t *b = r->data, *end = r->data + r->size;
    if (r->size < 16 || memcmp(b, magic, 8) != 0) {
        ferry_ckr_free(r);
        return ferry_errorf(FERRY_ERR_FORMAT, "%s is not a %.8s file (bad magic)", path, magic);
    }
    r->format = (uint32_t)le_get(b + 8, 4);
    r->n = (uint32_t)le_get(b + 12, 4);
    if (r->format != format) {
        ferry_ckr_free(r);
        return ferry_errorf(FERRY_ERR_FORMAT, "%s: format %u, this build reads format %u", path,
                            r->format, format);
    }
    if (r->n > (uint32_t)(r->size / 16) || (r->sec = calloc(r->n ? r->n : 1, sizeof *r->sec)) ==
                                                 NULL) {
        uint32_t n = r->n;
        ferry_ckr_free(r);
        return ferry_errorf(FERRY_ERR_FORMAT, "%s is truncated: %u sections cannot fit in %zu bytes", path, n,
                            r->size);
    }
    b += 16;
    for (uint32_t i = 0; i < r->n; i++) {
        char name[5] = "?";
        if ((size_t)(end - b) < 12) {
            st = ferry_errorf(FERRY_ERR_FORMAT, "%s: truncated before section %u of %u", path,
                              i + 1, r->n);
            break;
        }
        uint32_t tag = (uint32_t)le_get(b, 4);
        uint64_t len = le_get(b + 4, 8);
        ferry_ck_tag_name(tag, name);
        b += 12;
        if ((uint64_t)(end - b) < len || (uint64_t)(end - b) - len < 4) {
            st = ferry_errorf(FERRY_ERR_FORMAT,
                              "%s: truncated in section %u of %u (%s: %llu bytes, %zu left)", path,
                              i + 1, r->n, name, (unsigned long long)len, (size_t)(end - b));
            break;
        }
        uint32_t want = (uint32_t)le_get(b + len, 4);
        uint32_t have = crc_update((uint32_t)crc32(0L, Z_NULL, 0), b, (size_t)len);
        if (want != have) {
            st = ferry_errorf(FERRY_ERR_FORMAT,
                              "%s: section %u of %u (%s, %llu bytes) fails its CRC-32 (file "
                              "%08x, data %08x): the file is damaged",
                              path, i + 1, r->n, name, (unsigned long long)len, want, have);
            break;
        }
        r->sec[i] = (ferry_cksec){tag, len, b};
        b += len + 4;
    }
    if (st == FERRY_OK && b != end)
        st = ferry_errorf(FERRY_ERR_FORMAT, "%s: %zu bytes after the last section", path,
                          (size_t)(end - b));
    if (st != FERRY_OK)
        ferry_ckr_free(r);
    return st;
}

#define VERIFY_CHUNK ((size_t)1 << 20)

/* n bytes of f into buf (NULL: skipped), their CRC into *crc when crc is not NULL;
 * 0 when the file ends first. */
static int stream_read(FILE *f, uint8_t *chunk, uint8_t *buf, uint64_t n, uint32_t *crc) {
    while (n > 0) {
        size_t k = n < VERIFY_CHUNK ? (size_t)n : VERIFY_CHUNK;
        uint8_t *dst = buf != NULL ? buf : chunk;
        if (fread(dst, 1, k, f) != k)
            return 0;
        if (crc != NULL)
            *crc = crc_update(*crc, dst, k);
        if (buf != NULL)
            buf += k;
        n -= k;
    }
    return 1;
}

ferry_status ferry_ck_verify(const char *path, const char magic[8], uint32_t format,
                             uint32_t keep_tag, uint8_t *keep, size_t keep_cap, size_t *keep_len,
                             uint32_t *nsections) {
    *keep_len = 0;
    *nsections = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return ferry_errorf(FERRY_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    uint8_t *chunk = malloc(VERIFY_CHUNK), head[16];
    ferry_status st = FERRY_OK;
    if (chunk == NULL || fstat(fileno(f), &sb) != 0) {
        st = chunk == NULL ? FERRY_NOMEM() : ferry_errorf(FERRY_ERR_IO, "cannot stat %s", path);
        goto done;
    }
    uint64_t size = (uint64_t)sb.st_size, left = size;
    if (size < 16 || fread(head, 1, 16, f) != 16 || memcmp(head, magic, 8) != 0) {
        st = ferry_errorf(FERRY_ERR_FORMAT, "%s is not a %.8s file (bad magic)", path, magic);
        goto done;
    }
    left -= 16;
    uint32_t fmt = (uint32_t)le_get(head + 8, 4), n = (uint32_t)le_get(head + 12, 4);
    if (fmt != format) {
        st = ferry_errorf(FERRY_ERR_FORMAT, "%s: format %u, this build reads format %u", path, fmt,
                          format);
        goto done;
    }
    if (n > size / 16) {
        st = ferry_errorf(FERRY_ERR_FORMAT, "%s is truncated: %u sections cannot fit in %llu bytes",
                          path, n, (unsigned long long)size);
        goto done;
    }
    int kept = 0;
    for (uint32_t i = 0; i < n && st == FERRY_OK; i++) {
        char name[5] = "?";
        uint8_t sh[12], tail[4];
        if (left < 12 || fread(sh, 1, 12, f) != 12) {
            st = ferry_errorf(FERRY_ERR_FORMAT, "%s: truncated before section %u of %u", path,
                              i + 1, n);
            break;
        }
        left -= 12;
        uint32_t tag = (uint32_t)le_get(sh, 4);
        uint64_t len = le_get(sh + 4, 8);
        ferry_ck_tag_name(tag, name);
        if (left < len || left - len < 4) {
            st = ferry_errorf(FERRY_ERR_FORMAT,
                              "%s: truncated in section %u of %u (%s: %llu bytes, %llu left)", path,
                              i + 1, n, name, (unsigned long long)len, (unsigned long long)left);
            break;
        }
        int keep_it = !kept && tag == keep_tag;
        if (keep_it && len > keep_cap) {
            st = ferry_errorf(FERRY_ERR_FORMAT, "%s: section %u (%s) has %llu bytes, at most %zu",
                              path, i + 1, name, (unsigned long long)len, keep_cap);
            break;
        }
        uint32_t have = (uint32_t)crc32(0L, Z_NULL, 0);
        if (!stream_read(f, chunk, keep_it ? keep : NULL, len, &have) ||
            fread(tail, 1, 4, f) != 4) {
            st = ferry_errorf(FERRY_ERR_IO, "%s: read failed in section %u", path, i + 1);
            break;
        }
        left -= len + 4;
        uint32_t want = (uint32_t)le_get(tail, 4);
        if (want != have) {
            st = ferry_errorf(FERRY_ERR_FORMAT,
                              "%s: section %u of %u (%s, %llu bytes) fails its CRC-32 (file "
                              "%08x, data %08x): the file is damaged",
                              path, i + 1, n, name, (unsigned long long)len, want, have);
            break;
        }
        if (keep_it) {
            kept = 1;
            *keep_len = (size_t)len;
        }
    }
    if (st == FERRY_OK && left != 0)
        st = ferry_errorf(FERRY_ERR_FORMAT, "%s: %llu bytes after the last section", path,
                          (unsigned long long)left);
    if (st == FERRY_OK)
        *nsections = n;
done:
    free(chunk);
    (void)fclose(f);
    return st;
}

ferry_ckcur ferry_ckcur_of(const ferry_cksec *s) {
    ferry_ckcur c = {s->p, s->p + s->len, 0};
    return c;
}

ferry_ckcur ferry_ckr_section(const ferry_ckr *r, uint32_t tag) {
    for (uint32_t i = 0; i < r->n; i++) {
        if (r->sec[i].tag == tag)
            return ferry_ckcur_of(&r->sec[i]);
    }
    ferry_ckcur none = {NULL, NULL, 1};
    return none;
}

const void *ferry_ckcur_bytes(ferry_ckcur *c, size_t n) {
    if (c->bad || (size_t)(c->end - c->p) < n) {
        c->bad = 1;
        return NULL;
    }
    const void *p = c->p;
    c->p += n;
    return p;
}

size_t ferry_ckcur_left(const ferry_ckcur *c) {
    return c->bad ? 0 : (size_t)(c->end - c->p);
}

uint32_t ferry_ckcur_u32(ferry_ckcur *c) {
    const uint8_t *b = ferry_ckcur_bytes(c, 4);
    return b != NULL ? (uint32_t)le_get(b, 4) : 0;
}

uint64_t ferry_ckcur_u64(ferry_ckcur *c) {
    const uint8_t *b = ferry_ckcur_bytes(c, 8);
    return b != NULL ? le_get(b, 8) : 0;
}

double ferry_ckcur_f64(ferry_ckcur *c) {
    uint64_t bits = ferry_ckcur_u64(c);
    double v;
    memcpy(&v, &bits, 8);
    return v;
}

void ferry_ckcur_f32s(ferry_ckcur *c, float *dst, size_t n) {
    const uint8_t *b = ferry_ckcur_bytes(c, n * sizeof(float));
    if (b == NULL)
        return;
    if (host_is_le()) {
        memcpy(dst, b, n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)le_get(b + 4 * i, 4);
        memcpy(&dst[i], &bits, 4);
    }
}
