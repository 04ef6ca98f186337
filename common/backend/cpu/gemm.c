/* gemm.c - the CPU backend's GEMM: OpenBLAS, on one thread or, where the calling
 * thread asked for two (ferry_cpu_set_gemm_width), its rows split between the caller
 * and a helper thread.
 *
 * Split where the bits stay. An OpenBLAS sgemm kernel computes C in blocks of a fixed
 * number of rows of row-major C (the column-major N side: 12 for the Haswell/Zen
 * kernels) and a block's last rows in other code; cut C anywhere else and the rows
 * near the cut come out rounded differently (measured: most cuts differ; a cut at a
 * multiple of the block reproduces the whole product bit for bit, each element being
 * the same dot product in the same order). SPLIT_ROWS is a multiple of every x86
 * sgemm kernel's block (4, 6, 8, 12, 16, 24), and a probe checks it once per process:
 * where a cut at SPLIT_ROWS changes a bit of a random product, nothing is split.
 * Each part is large (SPLIT_MIN_MACS), so that OpenBLAS runs it by the same code as
 * the whole. Nothing is split while OpenBLAS runs several threads of its own, nor in
 * a child forked after the helper started (it has no helper). */
#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "common/backend/cpu/cpu.h"
#include "common/core/log.h"

#define SPLIT_ROWS 48
/* Each part at least this many multiply-adds (~0.1 ms): smaller, a hand-over costs more
 * than it buys, and OpenBLAS may run a small product by other code (its direct and
 * small-matrix kernels, which sum K in one chain) than the whole. */
#define SPLIT_MIN_MACS ((int64_t)1 << 23)

typedef struct gemm_args {
    int ta, tb;
    int64_t M, N, K;
    float alpha;
    const float *A;
    int64_t lda;
    const float *B;
    int64_t ldb;
    float beta;
    float *C;
    int64_t ldc;
} gemm_args;

static void blas(const gemm_args *g) {
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
                (blasint)g->M, (blasint)g->N, (blasint)g->K, g->alpha, g->A, (blasint)g->lda, g->B,
                (blasint)g->ldb, g->beta, g->C, (blasint)g->ldc);
}

/* Rows [0, m1) of g's product as a GEMM of their own. */
static gemm_args rows_before(const gemm_args *g, int64_t m1) {
    gemm_args r = *g;
    r.M = m1;
    return r;
}

/* Rows [m1, M) of g's product as a GEMM of their own. */
static gemm_args rows_from(const gemm_args *g, int64_t m1) {
    gemm_args r = *g;
    r.M = g->M - m1;
    r.A = g->ta ? g->A + m1 : g->A + m1 * g->lda; /* A^T (K, M): columns m1.. */
    r.C = g->C + m1 * g->ldc;
    return r;
}

static _Thread_local int gemm_width = 1;
static atomic_ullong gemm_splits;

/* The helper: one thread for the process, started at the first split; it runs the
 * second part of one split GEMM at a time (a second caller meanwhile runs whole). */
static struct {
    pthread_once_t once;
    int ok;    /* the probe passed and the thread runs */
    pid_t pid; /* ... in this process (a fork's child has no helper) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int busy, posted, done;
    gemm_args work;
} helper = {
    .once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void *helper_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&helper.mu);
    for (;;) {
        while (!helper.posted)
            pthread_cond_wait(&helper.cv, &helper.mu);
        helper.posted = 0;
        gemm_args g = helper.work;
        pthread_mutex_unlock(&helper.mu);
        blas(&g);
        pthread_mutex_lock(&helper.mu);
        helper.done = 1;
        pthread_cond_broadcast(&helper.cv);
    }
    return NULL;
}

/* Does a cut at SPLIT_ROWS reproduce the whole product, for each transpose, with
 * alpha 1 and beta 0 and with alpha 0.75 and beta 1? Random operands of awkward sizes
 * (no dimension a multiple of 4), each part as large as a split one may be and K
 * longer than OpenBLAS's K blocks. */
static int probe(void) {
    enum { M = 2 * SPLIT_ROWS + 7, N = 131, K = 1399 };
    static float A[M * K], B[K * N], C1[M * N], C2[M * N];
    uint32_t s = 12345;
    for (int i = 0; i < M * K; i++)
        A[i] = (float)((s = s * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
    for (int i = 0; i < K * N; i++)
        B[i] = (float)((s = s * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
    for (int t = 0; t < 8; t++) {
        gemm_args g = {.ta = t & 1,
                       .tb = (t >> 1) & 1,
                       .M = M,
                       .N = N,
                       .K = K,
                       .alpha = (t >> 2) ? 0.75f : 1.0f,
                       .A = A,
                       .lda = (t & 1) ? M : K,
                       .B = B,
                       .ldb = ((t >> 1) & 1) ? K : N,
                       .beta = (t >> 2) ? 1.0f : 0.0f,
                       .ldc = N};
        for (int i = 0; i < M * N; i++)
            C1[i] = C2[i] = (float)i / (float)(M * N);
        g.C = C1;
        blas(&g);
        g.C = C2;
        gemm_args lo = rows_before(&g, SPLIT_ROWS), hi = rows_from(&g, SPLIT_ROWS);
        blas(&lo);
        blas(&hi);
        if (memcmp(C1, C2, sizeof C1) != 0)
            return 0;
    }
    return 1;
}

static void helper_start(void) {
    pthread_t t;
    pthread_attr_t attr;
    if (!probe()) {
        FERRY_LOG_INFO("GEMMs stay on one thread: OpenBLAS's %s kernels round a product cut "
                       "at row %d differently from the whole",
                       ferry_cpu_blas_kernels(), SPLIT_ROWS);
        return;
    }
    if (pthread_attr_init(&attr) != 0)
        return;
    (void)pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    helper.pid = getpid();
    helper.ok = pthread_create(&t, &attr, helper_main, NULL) == 0;
    (void)pthread_attr_destroy(&attr);
}

int ferry__cpu_gemm_split_ok(void) {
    (void)pthread_once(&helper.once, helper_start);
    return helper.ok && helper.pid == getpid();
}

/* Runs g with its rows split between this thread and the helper; 0 (nothing done)
 * where it should run whole. */
static int split(const gemm_args *g) {
    if (gemm_width < 2 || g->M < 2 * SPLIT_ROWS || openblas_get_num_threads() > 1)
        return 0;
    /* The cut: the multiple of SPLIT_ROWS nearest half, leaving both parts a whole
     * block or more; each part large enough. */
    int64_t m1 = (g->M + SPLIT_ROWS) / (2 * SPLIT_ROWS) * SPLIT_ROWS;
    if (m1 > g->M - SPLIT_ROWS)
        m1 -= SPLIT_ROWS;
    int64_t smaller = m1 < g->M - m1 ? m1 : g->M - m1;
    if (smaller * g->N * g->K < SPLIT_MIN_MACS)
        return 0;
    if (!ferry__cpu_gemm_split_ok())
        return 0;
    pthread_mutex_lock(&helper.mu);
    if (helper.busy) {
        pthread_mutex_unlock(&helper.mu);
        return 0;
    }
    helper.busy = 1;
    helper.done = 0;
    helper.work = rows_from(g, m1);
    helper.posted = 1;
    pthread_cond_broadcast(&helper.cv);
    pthread_mutex_unlock(&helper.mu);
    gemm_args lo = rows_before(g, m1);
    blas(&lo);
    pthread_mutex_lock(&helper.mu);
    while (!helper.done)
        pthread_cond_wait(&helper.cv, &helper.mu);
    helper.busy = 0;
    pthread_mutex_unlock(&helper.mu);
    atomic_fetch_add(&gemm_splits, 1);
    return 1;
}

int ferry_cpu_set_gemm_width(int n) {
    int prev = gemm_width;
    gemm_width = n < 1 ? 1 : n > 2 ? 2 : n;
    return prev;
}

uint64_t ferry_cpu_gemm_splits(void) {
    return atomic_load(&gemm_splits);
}

ferry_status ferry__cpu_gemm(ferry_backend *be, int ta, int tb, int64_t M, int64_t N, int64_t K,
                             float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                             float beta, float *C, int64_t ldc) {
    (void)be;
    if (K == 0) {
        /* BLAS leaves C untouched for K=0 only when beta=1; make it explicit. */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++)
                C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        return FERRY_OK;
    }
    gemm_args g = {ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc};
    if (!split(&g))
        blas(&g);
    return FERRY_OK;
}
