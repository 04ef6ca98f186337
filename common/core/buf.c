/* buf.c - recycled 64-byte-aligned buffers (buf.h). Each buffer starts with a 64-byte
 * header holding its capacity, which keeps the payload 64-byte aligned. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/core/buf.h"

#define BUF_HEADER      64
#define BUF_CACHE_MIN   (1u << 20) /* smaller buffers: malloc's free lists do fine */
#define BUF_CACHE_SLOTS 8
#define BUF_CACHE_BYTES (512u << 20) /* at most this much kept idle */
#ifdef FERRY_SANITIZE
#define BUF_RECYCLE 0
#else
#define BUF_RECYCLE 1
#endif

#if BUF_RECYCLE
static struct {
    pthread_mutex_t mu;
    void *buf[BUF_CACHE_SLOTS]; /* oldest first */
    int n;
    size_t bytes;
} buf_cache = {.mu = PTHREAD_MUTEX_INITIALIZER};

static size_t buf_capacity(void *p) {
    size_t cap;
    memcpy(&cap, (char *)p - BUF_HEADER, sizeof cap);
    return cap;
}

/* The smallest cached buffer holding n bytes without wasting more than a quarter of n:
 * a block that outlives a step (a module's weights) keeps what it was given, and the
 * budgets count n. */
static void *buf_cache_get(size_t n) {
    void *p = NULL;
    pthread_mutex_lock(&buf_cache.mu);
    int best = -1;
    size_t best_cap = 0;
    for (int i = 0; i < buf_cache.n; i++) {
        size_t cap = buf_capacity(buf_cache.buf[i]);
        if (cap >= n && cap - n <= n / 4 && (best < 0 || cap < best_cap)) {
            best = i;
            best_cap = cap;
        }
    }
    if (best >= 0) {
        p = buf_cache.buf[best];
        buf_cache.bytes -= best_cap;
        memmove(&buf_cache.buf[best], &buf_cache.buf[best + 1],
                (size_t)(buf_cache.n - best - 1) * sizeof(void *));
        buf_cache.n--;
    }
    pthread_mutex_unlock(&buf_cache.mu);
    return p;
}

/* Keeps p (at most BUF_CACHE_BYTES), evicting the oldest buffers while the
 * cache would exceed its limits. */
static void buf_cache_put(void *p) {
    size_t cap = buf_capacity(p);
    void *evicted[BUF_CACHE_SLOTS];
    int ne = 0;
    pthread_mutex_lock(&buf_cache.mu);
    while (buf_cache.n > 0 &&
           (buf_cache.n == BUF_CACHE_SLOTS || buf_cache.bytes + cap > BUF_CACHE_BYTES)) {
        evicted[ne++] = buf_cache.buf[0];
        buf_cache.bytes -= buf_capacity(buf_cache.buf[0]);
        memmove(&buf_cache.buf[0], &buf_cache.buf[1], (size_t)(buf_cache.n - 1) * sizeof(void *));
        buf_cache.n--;
    }
    buf_cache.buf[buf_cache.n++] = p;
    buf_cache.bytes += cap;
    pthread_mutex_unlock(&buf_cache.mu);
    for (int i = 0; i < ne; i++)
        free((char *)evicted[i] - BUF_HEADER);
}

/* A new buffer of n bytes, its capacity in the header in front. */
static void *buf_new(size_t n) {
    void *raw = NULL;
    if (posix_memalign(&raw, 64, BUF_HEADER + n) != 0)
        return NULL;
    memcpy(raw, &n, sizeof n);
    return (char *)raw + BUF_HEADER;
}

void ferry_buf_free(void *p) {
    if (p == NULL)
        return;
    size_t cap = buf_capacity(p);
    if (cap >= BUF_CACHE_MIN && cap <= BUF_CACHE_BYTES) {
        buf_cache_put(p);
        return;
    }
    free((char *)p - BUF_HEADER);
}

void ferry_buf_release_idle(void) {
    void *idle[BUF_CACHE_SLOTS];
    pthread_mutex_lock(&buf_cache.mu);
    int n = buf_cache.n;
    memcpy(idle, buf_cache.buf, (size_t)n * sizeof *idle);
    buf_cache.n = 0;
    buf_cache.bytes = 0;
    pthread_mutex_unlock(&buf_cache.mu);
    for (int i = 0; i < n; i++)
        free((char *)idle[i] - BUF_HEADER);
}
#else
/* Sanitized: plain aligned blocks with no header in front, so ASan sees an underflow
 * and a use after free of every buffer; nothing is kept. */
static void *buf_new(size_t n) {
    void *p = NULL;
    return posix_memalign(&p, 64, n > 0 ? n : 1) == 0 ? p : NULL;
}

void ferry_buf_free(void *p) {
    free(p);
}

void ferry_buf_release_idle(void) {}
#endif

void *ferry_buf_alloc(size_t n) {
    if (n > SIZE_MAX - BUF_HEADER) /* both builds refuse the same sizes */
        return NULL;
#if BUF_RECYCLE
    if (n >= BUF_CACHE_MIN) {
        void *p = buf_cache_get(n);
        if (p != NULL)
            return p;
    }
#endif
    return buf_new(n);
}
