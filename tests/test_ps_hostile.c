/* test_ps_hostile.c - a ferry-ps psd (the real binary, its own process) under
 * requests an attacker would send with a stock gRPC client: raw bytes, truncated and
 * inconsistent messages, numbers chosen to overflow, sizes chosen to exhaust memory,
 * paths chosen to escape, calls out of order. Each case gets its precise status; the
 * server answers Hello after every one; once the contexts are swept its resident
 * memory is back within 10% of where it started. Also the regression test of each
 * bug class of issue 8 (overflowing row ranges, oversized modules and replies,
 * per-context gradient storage, Checkpoint in a loop, > 4096 modules, a symlink in
 * the checkpoint directory). */
#define _GNU_SOURCE /* mkdtemp, popen, symlink, kill, nanosleep */
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "session.h"
#include "ferry.pb-c.h"
#include "common/core/log.h" /* ferry_now */
#include "common/rpc/rpc.h"
#include "common/rpc/testing.h"
#include "server/ps.h"

/* protobuf-c's string fields are char *: a literal goes in through this. */
#define STR(x) ((char *)(uintptr_t)(x))

/* ---- the daemon ---- */

typedef struct psd {
    pid_t pid;
    int port;
    char addr[64];
    char dir[128]; /* its temp dir: port file, log, checkpoints */
    ferry_rpc_client *c;
} psd;

static void daemon_start(psd *d, const char *restore) {
    (void)snprintf(d->dir, sizeof d->dir, "/tmp/ferry-hostile.XXXXXX");
    CHECK(mkdtemp(d->dir) != NULL);
    char bin[512], port_file[256], ckpt[256], log[256];
    (void)snprintf(bin, sizeof bin, "%s/server/ferry-ps", FERRY_BINARY_DIR);
    (void)snprintf(port_file, sizeof port_file, "%s/port", d->dir);
    (void)snprintf(ckpt, sizeof ckpt, "%s/ckpt", d->dir);
    (void)snprintf(log, sizeof log, "%s/log", d->dir);
    CHECK(mkdir(ckpt, 0700) == 0);
    d->pid = fork();
    CHECK(d->pid >= 0);
    if (d->pid == 0) {
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed test takes its daemon along */
        /* Under ASan freed memory sits in its quarantine and its own allocator, not
         * malloc's: let it go back to the system so the RSS check measures ferry,
         * whether or not the caller set ASAN_OPTIONS (other builds ignore them). */
        const char *asan = getenv("ASAN_OPTIONS");
        static char opts[1024];
        (void)snprintf(opts, sizeof opts,
                       "%s%squarantine_size_mb=0:allocator_release_to_os_interval_ms=50",
                       asan != NULL ? asan : "", asan != NULL && asan[0] != '\0' ? ":" : "");
        (void)setenv("ASAN_OPTIONS", opts, 1);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            (void)dup2(fd, 2);
            (void)close(fd);
        }
        const char *argv[32] = {bin,       "--listen",          "127.0.0.1:0", "--port-file",
                                port_file, "--threads",         "2",           "--context-ttl",
                                "1",       "--max-message-mb",  "8",           "--max-module-mb",
                                "64",      "--max-model-mb",    "100",         "--max-context-mb",
                                "16",      "--max-contexts-mb", "128",         "--max-contexts",
                                "4000",    "--checkpoint-dir",  ckpt,          "--checkpoint-keep",
                                "2",       "--log-level",       "warn"};
        int argc = 27;
        if (restore != NULL) {
            argv[argc++] = "--restore";
            argv[argc++] = restore;
        }
        argv[argc] = NULL;
        execv(bin, (char *const *)(uintptr_t)argv);
        _exit(127);
    }
    for (int i = 0; i < 3000; i++) { /* up to 30 s (a sanitizer build starts slowly) */
        FILE *f = fopen(port_file, "r");
        if (f != NULL) {
            int ok = fscanf(f, "%d", &d->port) == 1;
            (void)fclose(f);
            if (ok)
                break;
        }
        CHECK(waitpid(d->pid, NULL, WNOHANG) == 0); /* still alive */
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECK(d->port > 0);
    (void)snprintf(d->addr, sizeof d->addr, "127.0.0.1:%d", d->port);
    /* The client may send more than the server takes (the server must refuse). */
    ferry_rpc_client_config cc = {.max_message_bytes = 64u << 20, .deadline_ms = 10000, .wait_for_ready = 1};
    CHECK_OK(ferry_rpc_client_create(d->addr, &cc, &d->c));
    CHECK_OK(ferry_test_hello(d->c, 0, NULL)); /* calls run in a session */
}

/* SIGTERM: the psd must exit 0 (it never crashed, it shut down cleanly). */
static void daemon_stop(psd *d) {
    ferry_rpc_client_destroy(d->c);
    CHECK(kill(d->pid, SIGTERM) == 0);
    int status = 0;
    CHECK(waitpid(d->pid, &status, 0) == d->pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char cmd[300];
        (void)snprintf(cmd, sizeof cmd, "tail -n 30 %s/log >&2", d->dir);
        (void)system(cmd);
        fprintf(stderr, "ferry-ps exited with status %#x\n", status);
        CHECK(0);
    }
    char cmd[300];
    (void)snprintf(cmd, sizeof cmd, "grep -l 'Sanitizer\\|runtime error' %s/log >&2", d->dir);
    CHECK(system(cmd) != 0); /* no sanitizer report in its log */
    (void)snprintf(cmd, sizeof cmd, "rm -rf %s", d->dir);
    CHECK(system(cmd) == 0);
}

/* Resident (or, with virt, virtual) memory of a process, from /proc. */
static int64_t mem_bytes(pid_t pid, int virt) {
    char path[64];
    (void)snprintf(path, sizeof path, "/proc/%d/statm", (int)pid);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    long long size, resident;
    CHECK(fscanf(f, "%lld %lld", &size, &resident) == 2);
    (void)fclose(f);
    return (int64_t)(virt ? size : resident) * sysconf(_SC_PAGESIZE);
}

static int64_t rss_bytes(pid_t pid) {
    return mem_bytes(pid, 0);
}

/* ---- building requests, well-formed or not ---- */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *p, size_t n) {
    if (n == 0)
        return;
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        CHECK(b->p != NULL);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

static void put_varint(buf *b, uint64_t v) {
    uint8_t tmp[10];
    size_t n = 0;
    while (v >= 0x80) {
        tmp[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    tmp[n++] = (uint8_t)v;
    put(b, tmp, n);
}

/* Field 15 (a Tensor), written by hand so that it can lie: dtype, shape, name and
 * `nbytes` of payload whatever the shape says. */
static void put_tensor_n(buf *b, uint64_t dtype, const uint64_t *dims, int ndim, const char *name,
                         size_t name_len, const void *data, size_t nbytes) {
    buf t = {0};
    put_varint(&t, 1 << 3);
    put_varint(&t, dtype);
    for (int i = 0; i < ndim; i++) {
        put_varint(&t, 2 << 3);
        put_varint(&t, dims[i]);
    }
    if (name != NULL) {
        put_varint(&t, (3 << 3) | 2);
        put_varint(&t, name_len);
        put(&t, name, name_len);
    }
    if (nbytes > 0) {
        put_varint(&t, (15 << 3) | 2);
        put_varint(&t, nbytes);
        put(&t, data, nbytes);
    }
    put_varint(b, (15 << 3) | 2);
    put_varint(b, t.n);
    put(b, t.p, t.n);
    free(t.p);
}

static void put_tensor(buf *b, uint64_t dtype, const uint64_t *dims, int ndim, const char *name,
                       const void *data, size_t nbytes) {
    put_tensor_n(b, dtype, dims, ndim, name, strlen(name), data, nbytes);
}

static void put_head(buf *b, const ProtobufCMessage *m) {
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *p = malloc(n + 1);
    CHECK(p != NULL);
    (void)protobuf_c_message_pack(m, p);
    put(b, p, n);
    free(p);
}

/* One buffer per method: the rpc layer keeps the path's pointer (a static slice)
 * for the life of the call. */
static const char *path_of(ferry_rpc_method m) {
    static char p[FERRY_RPC_METHOD_COUNT][64];
    (void)snprintf(p[m], sizeof p[m], "/ferry.v1.Ferry/%s", ferry_rpc_method_name(m));
    return p[m];
}

/* The deadline of send_raw's calls. */
static int raw_deadline_ms = 10000;

/* Sends raw bytes; returns the status, prints the server's message. */
static ferry_status send_raw(psd *d, ferry_rpc_method m, const buf *b, ferry_rpc_msg *reply) {
    ferry_rpc_msg tmp;
    ferry_rpc_msg_init(&tmp);
    ferry_status st = ferry__rpc_call_raw(d->c, path_of(m), b->p != NULL ? b->p : (uint8_t *)"",
                                          b->n, m, reply != NULL ? reply : &tmp, raw_deadline_ms);
    if (st != FERRY_OK)
        fprintf(stderr, "  %s -> %s\n", ferry_rpc_method_name(m), ferry_error_last());
    ferry_rpc_msg_deinit(&tmp);
    return st;
}

/* A well-formed header of method m, then `extra` (hand-written tensors; may be NULL),
 * sent raw; returns the status. */
static ferry_status send_head(psd *d, ferry_rpc_method m, const ProtobufCMessage *head,
                              const buf *extra) {
    buf b = {0};
    put_head(&b, head);
    if (extra != NULL)
        put(&b, extra->p, extra->n);
    ferry_status st = send_raw(d, m, &b, NULL);
    free(b.p);
    return st;
}

/* The case's expected status, and the error naming `phrase`; then Hello answers. */
static int ncases;
static void expect(psd *d, const char *what, ferry_status got, ferry_status want,
                   const char *phrase) {
    ncases++;
    if (got != want || (phrase != NULL && strstr(ferry_error_last(), phrase) == NULL)) {
        fprintf(stderr, "case '%s': got %s (%s), want %s with '%s'\n", what, ferry_status_str(got),
                ferry_error_last(), ferry_status_str(want), phrase ? phrase : "");
        CHECK(0);
    }
    buf b = {0};
    Ferry__V1__HelloRequest q;
    ferry__v1__hello_request__init(&q);
    put_head(&b, &q.base);
    ferry_rpc_msg reply;
    ferry_rpc_msg_init(&reply);
    CHECK_OK(send_raw(d, FERRY_RPC_HELLO, &b, &reply));
    CHECK(((const Ferry__V1__HelloReply *)reply.head)->incarnation != 0);
    ferry_rpc_msg_deinit(&reply);
    free(b.p);
}

static double stat_value(psd *d, const char *name) {
    buf b = {0};
    Ferry__V1__StatsRequest q;
    ferry__v1__stats_request__init(&q);
    q.prefix = STR(name);
    put_head(&b, &q.base);
    ferry_rpc_msg reply;
    ferry_rpc_msg_init(&reply);
    CHECK_OK(send_raw(d, FERRY_RPC_STATS, &b, &reply));
    const Ferry__V1__StatsReply *r = reply.head;
    double v = -1.0;
    for (size_t i = 0; i < r->n_metrics; i++)
        if (strcmp(r->metrics[i]->name, name) == 0)
            v = r->metrics[i]->value;
    ferry_rpc_msg_deinit(&reply);
    free(b.p);
    CHECK(v >= 0.0);
    return v;
}

/* ---- well-formed calls ---- */

/* CreateModule; `init` (may be NULL) is appended: initial tensors written by hand. */
static const char *optimizer_name = "sgd"; /* of the next create */

/* CreateModule of kind (its two sizes d0, d1 as the kind orders them; "transformer"
 * sends no kind) with an optional weight offset. */
static ferry_status create_init(psd *d, const char *name, const char *kind, int64_t d0, int64_t d1,
                                int64_t row_begin, int64_t row_count, const int64_t *weight_offset,
                                const buf *init) {
    Ferry__V1__CreateModuleRequest q;
    ferry__v1__create_module_request__init(&q);
    Ferry__V1__ModuleConfig mc;
    ferry__v1__module_config__init(&mc);
    Ferry__V1__OptimizerConfig oc;
    ferry__v1__optimizer_config__init(&oc);
    oc.name = STR(optimizer_name);
    oc.lr = 0.1;
    Ferry__V1__EmbeddingConfig ec;
    Ferry__V1__DecoderConfig dc;
    Ferry__V1__LinearConfig lc;
    ferry__v1__embedding_config__init(&ec);
    ferry__v1__decoder_config__init(&dc);
    ferry__v1__linear_config__init(&lc);
    if (strcmp(kind, "embedding") == 0) {
        ec.vocab = d0, ec.width = d1;
        mc.kind_case = FERRY__V1__MODULE_CONFIG__KIND_EMBEDDING;
        mc.embedding = &ec;
    } else if (strcmp(kind, "decoder") == 0) {
        dc.vocab = d0, dc.hidden = d1;
        mc.kind_case = FERRY__V1__MODULE_CONFIG__KIND_DECODER;
        mc.decoder = &dc;
    } else if (strcmp(kind, "linear") == 0) {
        lc.input = d0, lc.output = d1;
        mc.kind_case = FERRY__V1__MODULE_CONFIG__KIND_LINEAR;
        mc.linear = &lc;
    }
    Ferry__V1__Offset wo;
    ferry__v1__offset__init(&wo);
    Ferry__V1__Init in;
    ferry__v1__init__init(&in);
    if (weight_offset != NULL) {
        wo.value = *weight_offset;
        in.weight_offset = &wo;
        mc.init = &in;
    }
    mc.row_begin = row_begin;
    mc.row_count = row_count;
    mc.optimizer = &oc;
    q.name = STR(name);
    q.config = &mc;
    return send_head(d, FERRY_RPC_CREATE_MODULE, &q.base, init);
}

static ferry_status create(psd *d, const char *name, const char *kind, int64_t d0, int64_t d1,
                           int64_t row_begin, int64_t row_count, const int64_t *weight_offset) {
    return create_init(d, name, kind, d0, d1, row_begin, row_count, weight_offset, NULL);
}

static void fwd_head(buf *b, uint64_t ctx, uint64_t call, const char *module, const char *mode) {
    Ferry__V1__ForwardRequest q;
    ferry__v1__forward_request__init(&q);
    q.ctx_id = ctx;
    q.call_id = call;
    q.module = STR(module);
    q.mode = STR(mode ? mode : "");
    put_head(b, &q.base);
}

static void bwd_head(buf *b, uint64_t ctx, uint64_t call, const char *module) {
    Ferry__V1__BackwardRequest q;
    ferry__v1__backward_request__init(&q);
    q.ctx_id = ctx;
    q.call_id = call;
    q.module = STR(module);
    put_head(b, &q.base);
}

static ferry_status emb_forward(psd *d, uint64_t ctx, uint64_t call, const int32_t *ids,
                                int64_t n) {
    buf b = {0};
    fwd_head(&b, ctx, call, "emb", NULL);
    uint64_t dims[1] = {(uint64_t)n};
    put_tensor(&b, FERRY_RPC_DTYPE_I32, dims, 1, "ids", ids, (size_t)n * 4);
    ferry_status st = send_raw(d, FERRY_RPC_FORWARD, &b, NULL);
    free(b.p);
    return st;
}

static ferry_status emb_backward(psd *d, uint64_t ctx, uint64_t call, const float *g, int64_t n,
                                 int64_t E) {
    buf b = {0};
    bwd_head(&b, ctx, call, "emb");
    uint64_t dims[2] = {(uint64_t)n, (uint64_t)E};
    put_tensor(&b, FERRY_RPC_DTYPE_F32, dims, 2, "grad", g, (size_t)(n * E) * 4);
    ferry_status st = send_raw(d, FERRY_RPC_BACKWARD, &b, NULL);
    free(b.p);
    return st;
}

static ferry_status step(psd *d, uint64_t ctx, double scale) {
    Ferry__V1__StepRequest q;
    ferry__v1__step_request__init(&q);
    q.ctx_id = ctx;
    q.scale = scale;
    return send_head(d, FERRY_RPC_STEP, &q.base, NULL);
}

static ferry_status get_params(psd *d, const char *module, int64_t row_begin, int64_t row_count) {
    Ferry__V1__GetParamsRequest q;
    ferry__v1__get_params_request__init(&q);
    q.module = STR(module);
    q.row_begin = row_begin;
    q.row_count = row_count;
    return send_head(d, FERRY_RPC_GET_PARAMS, &q.base, NULL);
}

static ferry_status set_params(psd *d, const char *module, int64_t row_begin, int64_t rows,
                               int64_t cols, float value) {
    Ferry__V1__SetParamsRequest q;
    ferry__v1__set_params_request__init(&q);
    q.module = STR(module);
    q.row_begin = row_begin;
    buf b = {0};
    put_head(&b, &q.base);
    float *w = malloc((size_t)(rows * cols) * sizeof *w);
    CHECK(w != NULL);
    for (int64_t i = 0; i < rows * cols; i++)
        w[i] = value;
    uint64_t dims[2] = {(uint64_t)rows, (uint64_t)cols};
    put_tensor(&b, FERRY_RPC_DTYPE_F32, dims, 2, "weight", w, (size_t)(rows * cols) * 4);
    ferry_status st = send_raw(d, FERRY_RPC_SET_PARAMS, &b, NULL);
    free(w);
    free(b.p);
    return st;
}

static ferry_status checkpoint(psd *d, const char *name) {
    Ferry__V1__CheckpointRequest q;
    ferry__v1__checkpoint_request__init(&q);
    q.path = STR(name);
    return send_head(d, FERRY_RPC_CHECKPOINT, &q.base, NULL);
}

static int count_files(const char *dir) {
    char cmd[300];
    (void)snprintf(cmd, sizeof cmd, "ls -A %s | wc -l", dir);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    int n = -1;
    CHECK(fscanf(p, "%d", &n) == 1);
    (void)pclose(p);
    return n;
}

static void wait_swept(psd *d) {
    for (int i = 0; i < 600 && stat_value(d, "contexts_live") > 0; i++) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECK_BITS_EQ(stat_value(d, "contexts_live"), 0.0);
}

#define E_DIM 16
#define V_EMB 1000

TEST(hostile_requests) {
    psd d;
    daemon_start(&d, NULL);
    /* The modules every case runs against, and one normal step, so that the
     * baseline memory includes what ordinary serving needs. */
    CHECK_OK(create(&d, "emb", "embedding", V_EMB, E_DIM, 0, 0, NULL));
    CHECK_OK(create(&d, "big", "embedding", 400000, 32, 0, 0, NULL)); /* 51 MB weights */
    CHECK_OK(create(&d, "dec", "decoder", 1000000, 1, 0, 0, NULL));   /* V = 1M, H = 1 */
    CHECK_OK(create(&d, "lin", "linear", 4, 8, 0, 0, NULL));
    int32_t ids[4] = {1, 2, 3, 999};
    float g[4 * E_DIM];
    for (int i = 0; i < 4 * E_DIM; i++)
        g[i] = 0.01f;
    for (uint64_t ctx = 1; ctx <= 3; ctx++) {
        CHECK_OK(emb_forward(&d, ctx, 1, ids, 4));
        CHECK_OK(emb_backward(&d, ctx, 1, g, 4, E_DIM));
        CHECK_OK(step(&d, ctx, 1.0));
    }
    CHECK_OK(get_params(&d, "emb", 0, 10));
    wait_swept(&d);
    int64_t rss0 = rss_bytes(d.pid);
    double heap0 = stat_value(&d, "heap_in_use_bytes");
    buf b = {0};
#define RESET() (free(b.p), b = (buf){0})

    /* -- the codec: bytes that are not a message -- */
    uint8_t junk[64];
    for (int i = 0; i < 64; i++)
        junk[i] = (uint8_t)(0xff - i * 7);
    put(&b, junk, sizeof junk);
    expect(&d, "random bytes", send_raw(&d, FERRY_RPC_FORWARD, &b, NULL), FERRY_ERR_FORMAT, NULL);
    RESET();
    memset(junk, 0xff, sizeof junk);
    put(&b, junk, 12);
    expect(&d, "varint longer than 10 bytes", send_raw(&d, FERRY_RPC_STEP, &b, NULL),
           FERRY_ERR_FORMAT, "varint");
    RESET();
    fwd_head(&b, 7, 1, "emb", NULL);
    uint64_t dims1[1] = {4};
    put_tensor(&b, FERRY_RPC_DTYPE_I32, dims1, 1, "ids", ids, 16);
    b.n -= 9; /* truncated inside the payload */
    expect(&d, "truncated message", send_raw(&d, FERRY_RPC_FORWARD, &b, NULL), FERRY_ERR_FORMAT,
           "past the end");
    RESET();
    fwd_head(&b, 7, 1, "emb", NULL);
    uint64_t huge4[4] = {1u << 22, 1u << 22, 1u << 22, 1u << 22};
    put_tensor(&b, FERRY_RPC_DTYPE_F32, huge4, 4, "ids", NULL, 0);
    expect(&d, "shape product overflows", send_raw(&d, FERRY_RPC_FORWARD, &b, NULL),
           FERRY_ERR_FORMAT, "bad shape");
    RESET();
    fwd_head(&b, 7, 1, "emb", NULL);
    put_tensor(&b, FERRY_RPC_DTYPE_I32, dims1, 1, "ids", ids, 12);
    expect(&d, "data length not matching shape", send_raw(&d, FERRY_RPC_FORWARD, &b, NULL),
           FERRY_ERR_FORMAT, "its shape needs 16");
    RESET();
    fwd_head(&b, 7, 1, "emb", NULL);
    uint64_t neg[1] = {(uint64_t)-4};
    put_tensor(&b, FERRY_RPC_DTYPE_I32, neg, 1, "ids", ids, 16);
    expect(&d, "negative dimension", send_raw(&d, FERRY_RPC_FORWARD, &b, NULL), FERRY_ERR_FORMAT,
           "dimension");
    RESET();
    fwd_head(&b, 7, 1, "emb", NULL);
    uint64_t rank5[5] = {1, 1, 1, 1, 4};
    put_tensor(&b, FERRY_RPC_DTYPE_I32, rank5, 5, "ids", ids, 16);
    expect(&d, "rank above 4", send_raw(&d, FERRY_RPC_FORWARD, &b, NULL), FERRY_ERR_FORMAT, "rank");
    RESET();
    fwd_head(&b, 7, 1, "emb", NULL);
    put_tensor(&b, 99, dims1, 1, "ids", ids, 16);
    expect(&d, "unknown dtype", send_raw(&d, FERRY_RPC_FORWARD, &b, NULL), FERRY_ERR_FORMAT,
           "unknown dtype 99");
    RESET();
    fwd_head(&b, 7, 1, "emb", NULL);
    put_tensor_n(&b, FERRY_RPC_DTYPE_I32, dims1, 1, "id\0s", 4, ids, 16);
    expect(&d, "NUL inside a tensor name", send_raw(&d, FERRY_RPC_FORWARD, &b, NULL),
           FERRY_ERR_FORMAT, "NUL");
    RESET();
    put_varint(&b, (3 << 3) | 0); /* ForwardRequest.module (a string) as a varint */
    put_varint(&b, 5);
    expect(&d, "header field of the wrong wire type", send_raw(&d, FERRY_RPC_FORWARD, &b, NULL),
           FERRY_ERR_FORMAT, "do not parse");
    RESET();
    expect(&d, "empty request", send_raw(&d, FERRY_RPC_FORWARD, &b, NULL), FERRY_ERR_NOT_FOUND,
           "unknown module ''");
    {
        ferry_rpc_msg reply;
        ferry_rpc_msg_init(&reply);
        put(&b, "x", 1);
        ferry_status st = ferry__rpc_call_raw(d.c, "/ferry.v1.Ferry/DropTables", b.p, b.n,
                                              FERRY_RPC_HELLO, &reply, 5000);
        ferry_rpc_msg_deinit(&reply);
        expect(&d, "unknown method", st, FERRY_ERR_UNSUPPORTED, "unknown method");
        RESET();
    }
    {
        fwd_head(&b, 7, 1, "emb", NULL);
        size_t n = (9u << 20) / 4;
        int32_t *many = calloc(n, 4);
        CHECK(many != NULL);
        uint64_t dn[1] = {n};
        put_tensor(&b, FERRY_RPC_DTYPE_I32, dn, 1, "ids", many, n * 4);
        free(many);
        expect(&d, "message over the 8 MiB limit", send_raw(&d, FERRY_RPC_FORWARD, &b, NULL),
               FERRY_ERR_RANGE, "RESOURCE_EXHAUSTED");
        RESET();
    }

    /* -- overflowing row ranges (issue 8: heap read and write) -- */
    expect(&d, "SetParams row_begin near 2^63", set_params(&d, "emb", INT64_MAX - 1, 4, E_DIM, 1.f),
           FERRY_ERR_RANGE, "outside this shard's rows");
    expect(&d, "SetParams row_begin = INT64_MIN", set_params(&d, "emb", INT64_MIN, 4, E_DIM, 1.f),
           FERRY_ERR_RANGE, "outside this shard's rows");
    expect(&d, "GetParams row_begin near 2^63", get_params(&d, "emb", INT64_MAX - 2, 10),
           FERRY_ERR_RANGE, "outside this shard's rows");
    expect(&d, "GetParams negative count", get_params(&d, "emb", 5, -3), FERRY_ERR_RANGE,
           "outside this shard's rows");
    expect(&d, "GetParams count overflowing the sum", get_params(&d, "emb", 10, INT64_MAX),
           FERRY_ERR_RANGE, "outside this shard's rows");
    expect(&d, "CreateModule overflowing row range",
           create(&d, "ovf", "embedding", 100, 4, INT64_MAX - 10, 100, NULL), FERRY_ERR_RANGE,
           "outside [0, 100)");
    expect(&d, "CreateModule row_begin = INT64_MIN",
           create(&d, "ovf", "embedding", 100, 4, INT64_MIN, 0, NULL), FERRY_ERR_RANGE,
           "outside [0, 100)");
    {
        /* A second "weight" much larger than the shard: only the first is checked by
         * name, so the second must be refused, not copied into the block. */
        static float w_ok[4 * 8], w_big[4 * 1024];
        uint64_t d_ok[2] = {4, 8}, d_big[2] = {4, 1024};
        buf init = {0};
        put_tensor(&init, 0, d_ok, 2, "weight", w_ok, sizeof w_ok);
        put_tensor(&init, 0, d_big, 2, "weight", w_big, sizeof w_big);
        expect(&d, "CreateModule with two initial 'weight' tensors",
               create_init(&d, "dup", "embedding", 4, 8, 0, 0, NULL, &init), FERRY_ERR_INVALID,
               "sent twice");
        free(init.p);
    }
    optimizer_name = "rmsprop";
    expect(&d, "CreateModule with an unknown optimizer",
           create(&d, "rms", "embedding", 4, 8, 0, 0, NULL), FERRY_ERR_INVALID, "'rmsprop'");
    optimizer_name = "sgd";
    int64_t off_big = INT64_MAX, off_neg = -1;
    expect(&d, "CreateModule weight_offset near 2^63",
           create(&d, "wo", "linear", 2, 2, 0, 0, &off_big), FERRY_OK, NULL);
    expect(&d, "CreateModule with a negative weight offset",
           create(&d, "wo2", "linear", 2, 2, 0, 0, &off_neg), FERRY_ERR_INVALID,
           "offsets must be >= 0");

    /* -- sizes chosen to exhaust memory -- */
    expect(&d, "CreateModule [2^31-1, 1] (8 GiB)",
           create(&d, "huge", "embedding", 2147483647, 1, 0, 0, NULL), FERRY_ERR_RESOURCE,
           "--max-module-mb");
    expect(&d, "CreateModule over the all-modules budget",
           create(&d, "m5", "embedding", 500000, 32, 0, 0, NULL), FERRY_ERR_RESOURCE,
           "--max-model-mb");
    expect(&d, "CreateModule dims above 2^31", create(&d, "d", "linear", 1LL << 40, 1, 0, 0, NULL),
           FERRY_ERR_INVALID, "[1, 2^31)");
    {
        float h[2048];
        int32_t tg[2048];
        for (int i = 0; i < 2048; i++)
            h[i] = 0.5f, tg[i] = i;
        uint64_t dh[2] = {2048, 1}, dt[1] = {2048};
        fwd_head(&b, 8, 1, "dec", NULL);
        put_tensor(&b, FERRY_RPC_DTYPE_F32, dh, 2, "hidden", h, sizeof h);
        put_tensor(&b, FERRY_RPC_DTYPE_I32, dt, 1, "targets", tg, sizeof tg);
        expect(&d, "8 KB decoder Forward asking for N x V = 8 GiB (context)",
               send_raw(&d, FERRY_RPC_FORWARD, &b, NULL), FERRY_ERR_RESOURCE, "--max-context-mb");
        RESET();
        fwd_head(&b, 0, 1, "dec", NULL);
        put_tensor(&b, FERRY_RPC_DTYPE_F32, dh, 2, "hidden", h, sizeof h);
        put_tensor(&b, FERRY_RPC_DTYPE_I32, dt, 1, "targets", tg, sizeof tg);
        expect(&d, "the same without a context (call scratch)",
               send_raw(&d, FERRY_RPC_FORWARD, &b, NULL), FERRY_ERR_RESOURCE, "per-call budget");
        RESET();
        fwd_head(&b, 0, 1, "dec", "logits");
        put_tensor(&b, FERRY_RPC_DTYPE_F32, dh, 2, "hidden", h, sizeof h);
        expect(&d, "decoder logits reply of 8 GiB", send_raw(&d, FERRY_RPC_FORWARD, &b, NULL),
               FERRY_ERR_RESOURCE, "--max-message-mb");
        RESET();
    }
    {
        size_t n = 1000000;
        int32_t *many = calloc(n, 4);
        CHECK(many != NULL);
        expect(&d, "embedding Forward of 1M ids (64 MB reply)", emb_forward(&d, 9, 1, many, n),
               FERRY_ERR_RESOURCE, "--max-message-mb");
        free(many);
    }
    {
        /* One context saving Forward after Forward: each keeps 480 KB of row
         * indices, so about 34 fit the 16 MiB per-context budget. */
        size_t n = 120000;
        int32_t *many = calloc(n, 4);
        CHECK(many != NULL);
        ferry_status st = FERRY_OK;
        int calls = 0;
        for (uint64_t call = 1; call <= 64 && st == FERRY_OK; call++) {
            /* Each 7.3 MiB reply counts against the connection's 8 MiB of unread
             * replies until the server sees its send complete, which may come just
             * after the client has it: that refusal is back-pressure, tried again. */
            for (int again = 0; again < 200; again++) {
                st = emb_forward(&d, 10, call, many, (int64_t)n);
                if (st == FERRY_OK || strstr(ferry_error_last(), "replies not yet read") == NULL)
                    break;
                struct timespec ts = {0, 5000000L};
                nanosleep(&ts, NULL);
            }
            calls += st == FERRY_OK;
        }
        free(many);
        CHECK(calls >= 25 && calls <= 35);
        expect(&d, "one context over its 16 MiB budget", st, FERRY_ERR_RESOURCE,
               "--max-context-mb");
    }

    /* -- per-context gradient storage grows with the rows touched -- */
    {
        /* 16 contexts each touch one row of the 400000 x 32 table (51 MB): the server
         * used to reserve a gradient block of the whole table per context (16 x 51 MB
         * of address space, reported as a few KB); now each holds a few KB. */
        int32_t one[1] = {123456};
        float g1[32] = {0.5f};
        uint64_t d1[1] = {1}, dims_g[2] = {1, 32};
        double held0 = stat_value(&d, "context_bytes");
        int64_t vm0 = mem_bytes(d.pid, 1);
        for (uint64_t ctx = 20; ctx < 36; ctx++) {
            fwd_head(&b, ctx, 1, "big", NULL);
            put_tensor(&b, FERRY_RPC_DTYPE_I32, d1, 1, "ids", one, 4);
            CHECK_OK(send_raw(&d, FERRY_RPC_FORWARD, &b, NULL));
            RESET();
            bwd_head(&b, ctx, 1, "big");
            put_tensor(&b, FERRY_RPC_DTYPE_F32, dims_g, 2, "grad", g1, sizeof g1);
            CHECK_OK(send_raw(&d, FERRY_RPC_BACKWARD, &b, NULL));
            RESET();
        }
        double held = stat_value(&d, "context_bytes") - held0;
        int64_t vm = mem_bytes(d.pid, 1) - vm0;
        fprintf(stderr,
                "  16 contexts with one touched row of a 51 MB table: %.0f bytes held "
                "(Stats), address space +%.1f MiB\n",
                held, (double)vm / 1048576.0);
        CHECK(held > 0.0 && held < 16 * 64.0 * 1024.0);
        CHECK(vm < (int64_t)64 << 20);
        expect(&d, "gradient storage grows with rows touched", step(&d, 20, 1.0), FERRY_OK, NULL);
    }

    /* -- bad values -- */
    {
        int32_t bad[2] = {5, V_EMB};
        expect(&d, "ids out of range", emb_forward(&d, 13, 1, bad, 2), FERRY_ERR_RANGE,
               "outside this shard's rows");
        int32_t negid[1] = {-1};
        expect(&d, "negative id", emb_forward(&d, 13, 1, negid, 1), FERRY_ERR_RANGE, "= -1");
        CHECK_OK(emb_forward(&d, 13, 1, ids, 4));
        float gn[4 * E_DIM];
        for (int i = 0; i < 4 * E_DIM; i++)
            gn[i] = i == 17 ? NAN : 0.0f;
        expect(&d, "NaN gradient", emb_backward(&d, 13, 1, gn, 4, E_DIM), FERRY_ERR_NUMERIC,
               "grad[17]");
        gn[17] = INFINITY;
        expect(&d, "Inf gradient", emb_backward(&d, 13, 1, gn, 4, E_DIM), FERRY_ERR_NUMERIC,
               "grad[17]");
        expect(&d, "Backward for a call never made", emb_backward(&d, 13, 99, g, 4, E_DIM),
               FERRY_ERR_NOT_FOUND, "no pending Forward");
        /* The same call again is a retry: answered, applied once (test_ps_errors
         * checks the parameters). */
        expect(&d, "Forward with a call id already used", emb_forward(&d, 13, 1, ids, 4),
               FERRY_OK, NULL);
        CHECK_OK(emb_backward(&d, 13, 1, g, 4, E_DIM));
        expect(&d, "Backward twice", emb_backward(&d, 13, 1, g, 4, E_DIM), FERRY_OK, NULL);
        expect(&d, "Forward again after its Backward", emb_forward(&d, 13, 1, ids, 4), FERRY_OK,
               NULL);
        expect(&d, "Step with a NaN scale", step(&d, 13, NAN), FERRY_ERR_NUMERIC, "scale");
        CHECK_OK(step(&d, 13, 1.0));
        expect(&d, "double Step", step(&d, 13, 1.0), FERRY_OK, NULL);
        expect(&d, "Step of a context never opened", step(&d, 14, 1.0), FERRY_ERR_NOT_FOUND,
               "unknown context");
        expect(&d, "Backward in context 0", emb_backward(&d, 0, 1, g, 4, E_DIM), FERRY_ERR_INVALID,
               "context id 0");
        expect(&d, "SetParams with NaN", set_params(&d, "emb", 0, 1, E_DIM, NAN), FERRY_ERR_NUMERIC,
               "weight[0]");
        expect(&d, "SetParams of the wrong width", set_params(&d, "emb", 0, 1, E_DIM + 1, 1.f),
               FERRY_ERR_SHAPE, "must be");
        expect(&d, "unknown module", get_params(&d, "nope", 0, 0), FERRY_ERR_NOT_FOUND,
               "unknown module 'nope'");
        expect(&d, "a config without a kind", create(&d, "k", "transformer", 4, 4, 0, 0, NULL),
               FERRY_ERR_INVALID, "names no kind");
        expect(&d, "module name with a path", create(&d, "a b", "linear", 2, 2, 0, 0, NULL),
               FERRY_ERR_INVALID, "character outside");
    }

    /* -- jobs: membership and the job fields of GradNorm and Step -- */
    {
        Ferry__V1__JobMember mb;
        ferry__v1__job_member__init(&mb);
        mb.world = 2;
        mb.sync = FERRY__V1__SYNC_MODE__BSP;
        Ferry__V1__JobJoin jj;
        ferry__v1__job_join__init(&jj);
        jj.member = &mb;
        Ferry__V1__JobRequest j;
        ferry__v1__job_request__init(&j);
        j.job = "hj";
        j.action_case = FERRY__V1__JOB_REQUEST__ACTION_JOIN;
        j.join = &jj;
        mb.world = 0;
        expect(&d, "Join with world 0", send_head(&d, FERRY_RPC_JOB, &j.base, NULL),
               FERRY_ERR_INVALID, "world 0 outside");
        mb.world = 70000;
        expect(&d, "Join with world 70000", send_head(&d, FERRY_RPC_JOB, &j.base, NULL),
               FERRY_ERR_INVALID, "outside [1, 65536]");
        mb.world = 2;
        mb.rank = 2;
        expect(&d, "Join with rank = world", send_head(&d, FERRY_RPC_JOB, &j.base, NULL),
               FERRY_ERR_INVALID, "rank 2 outside [0, 2)");
        mb.rank = 0;
        mb.sync = (Ferry__V1__SyncMode)9;
        expect(&d, "Join with an unknown sync mode", send_head(&d, FERRY_RPC_JOB, &j.base, NULL),
               FERRY_ERR_INVALID, "unknown sync mode");
        mb.sync = FERRY__V1__SYNC_MODE__BSP;
        Ferry__V1__ModelKey mk = FERRY__V1__MODEL_KEY__INIT, *mkp = &mk;
        mk.key = "H";
        mk.value = "two words";
        mb.n_model = 1;
        mb.model = &mkp;
        expect(&d, "Join with a model value holding a space",
               send_head(&d, FERRY_RPC_JOB, &j.base, NULL), FERRY_ERR_INVALID, "model key 0");
        mb.n_model = 0;
        j.job = "a job";
        expect(&d, "Join with a bad job name", send_head(&d, FERRY_RPC_JOB, &j.base, NULL),
               FERRY_ERR_INVALID, "job name");
        j.job = "hj";
        j.action_case = FERRY__V1__JOB_REQUEST__ACTION__NOT_SET;
        expect(&d, "Job without an action", send_head(&d, FERRY_RPC_JOB, &j.base, NULL),
               FERRY_ERR_INVALID, "no action");
        Ferry__V1__JobReady jr;
        ferry__v1__job_ready__init(&jr);
        j.action_case = FERRY__V1__JOB_REQUEST__ACTION_READY;
        j.ready = &jr;
        expect(&d, "ready before joining", send_head(&d, FERRY_RPC_JOB, &j.base, NULL),
               FERRY_ERR_NOT_FOUND, "unknown here");
        j.action_case = FERRY__V1__JOB_REQUEST__ACTION_JOIN;
        j.join = &jj; /* the oneof's members share their storage */
        CHECK_OK(send_head(&d, FERRY_RPC_JOB, &j.base, NULL));
        CHECK_OK(send_head(&d, FERRY_RPC_JOB, &j.base, NULL)); /* the same session again */
        /* A second session of the same identity: rank 0 stays with the first one. */
        psd thief = d;
        ferry_rpc_client_config tc = {.deadline_ms = 10000, .wait_for_ready = 1};
        CHECK_OK(ferry_rpc_client_create(d.addr, &tc, &thief.c));
        CHECK_OK(ferry_test_hello(thief.c, 0, NULL));
        expect(&thief, "a second session on rank 0",
               send_head(&thief, FERRY_RPC_JOB, &j.base, NULL), FERRY_ERR_EXISTS,
               "held by another live session");
        CHECK(strstr(ferry_error_last(), "hostile") == NULL); /* names nobody */
        Ferry__V1__JobLeave jl;
        ferry__v1__job_leave__init(&jl);
        j.action_case = FERRY__V1__JOB_REQUEST__ACTION_LEAVE;
        j.leave = &jl;
        expect(&thief, "another session's leave", send_head(&thief, FERRY_RPC_JOB, &j.base, NULL),
               FERRY_ERR_DENIED, "this session holds no rank");
        Ferry__V1__JobStep js;
        ferry__v1__job_step__init(&js);
        js.job = "nojob";
        js.step = 1;
        Ferry__V1__GradNormRequest gn;
        ferry__v1__grad_norm_request__init(&gn);
        gn.ctx_id = 77;
        gn.job = &js;
        expect(&d, "GradNorm of an unknown job", send_head(&d, FERRY_RPC_GRAD_NORM, &gn.base, NULL),
               FERRY_ERR_NOT_FOUND, "unknown here");
        js.job = "hj";
        js.rank = 1;
        expect(&d, "GradNorm of a rank that never joined (the answer of another's rank)",
               send_head(&d, FERRY_RPC_GRAD_NORM, &gn.base, NULL), FERRY_ERR_DENIED,
               "this session holds no rank 1");
        js.rank = 0;
        js.step = 0;
        expect(&d, "GradNorm of job step 0", send_head(&d, FERRY_RPC_GRAD_NORM, &gn.base, NULL),
               FERRY_ERR_INVALID, "steps count from 1");
        js.step = 5;
        expect(&d, "GradNorm skipping to step 5", send_head(&d, FERRY_RPC_GRAD_NORM, &gn.base, NULL),
               FERRY_ERR_INVALID, "is at step 0");
        Ferry__V1__StepRequest sq;
        ferry__v1__step_request__init(&sq);
        sq.ctx_id = 77;
        sq.job = &js;
        js.step = 1;
        /* A backup's Step before the primary's sum arrives waits for it (primary-backup
         * replicas): here nobody sends it, so the caller's deadline ends the wait. */
        raw_deadline_ms = 300;
        expect(&d, "Step of a bsp step never summed: waits for its install",
               send_head(&d, FERRY_RPC_STEP, &sq.base, NULL), FERRY_ERR_TIMEOUT, NULL);
        raw_deadline_ms = 10000;
        js.step = 2;
        expect(&d, "Step two steps ahead", send_head(&d, FERRY_RPC_STEP, &sq.base, NULL),
               FERRY_ERR_INVALID, "has applied step 0");
        js.step = 1;
        /* The sum a Step installs (StepRequest.install): checked whole before the job
         * is touched, and only in modules this identity may use. */
        Ferry__V1__SummedModule sm, *smp = &sm;
        ferry__v1__summed_module__init(&sm);
        sq.install = 1;
        sq.n_summed = 1;
        sq.summed = &smp;
        sm.module = "nosuch";
        expect(&d, "install into a module that does not exist",
               send_head(&d, FERRY_RPC_STEP, &sq.base, NULL), FERRY_ERR_NOT_FOUND,
               "install: no module 'nosuch'");
        sm.module = "emb";
        sm.tensors = 2;
        expect(&d, "install naming tensors it does not carry",
               send_head(&d, FERRY_RPC_STEP, &sq.base, NULL), FERRY_ERR_INVALID,
               "has 2 tensors, 0 left");
        {
            buf t = {0};
            int64_t rows[2] = {1, 1};
            float vals[2 * E_DIM] = {0};
            uint64_t rd[1] = {2}, vd[2] = {2, E_DIM};
            put_tensor(&t, FERRY_RPC_DTYPE_I64, rd, 1, "weight", rows, sizeof rows);
            put_tensor(&t, FERRY_RPC_DTYPE_F32, vd, 2, "weight", vals, sizeof vals);
            expect(&d, "install with a row id twice", send_head(&d, FERRY_RPC_STEP, &sq.base, &t),
                   FERRY_ERR_INVALID, "a row id repeats");
            free(t.p);
            t = (buf){0};
            rows[0] = V_EMB + 5;
            rd[0] = vd[0] = 1;
            put_tensor(&t, FERRY_RPC_DTYPE_I64, rd, 1, "weight", rows, sizeof rows[0]);
            put_tensor(&t, FERRY_RPC_DTYPE_F32, vd, 2, "weight", vals, E_DIM * sizeof(float));
            expect(&d, "install of a row past the table",
                   send_head(&d, FERRY_RPC_STEP, &sq.base, &t), FERRY_ERR_RANGE, NULL);
            free(t.p);
            t = (buf){0};
            vd[1] = E_DIM + 1;
            put_tensor(&t, FERRY_RPC_DTYPE_I64, rd, 1, "weight", rows, sizeof rows[0]);
            put_tensor(&t, FERRY_RPC_DTYPE_F32, vd, 2, "weight", vals, (E_DIM + 1) * sizeof(float));
            expect(&d, "install of rows of the wrong width",
                   send_head(&d, FERRY_RPC_STEP, &sq.base, &t), FERRY_ERR_SHAPE, "row-sparse");
            free(t.p);
            t = (buf){0};
            sm.tensors = 1;
            uint64_t two[1] = {2};
            put_tensor(&t, FERRY_RPC_DTYPE_F32, two, 1, "nope", vals, sizeof(float) * 2);
            expect(&d, "install of a parameter the module lacks",
                   send_head(&d, FERRY_RPC_STEP, &sq.base, &t), FERRY_ERR_INVALID,
                   "no parameter 'nope'");
            sm.tensors = 0;
            expect(&d, "install with tensors beyond its modules",
                   send_head(&d, FERRY_RPC_STEP, &sq.base, &t), FERRY_ERR_INVALID,
                   "beyond the modules'");
            free(t.p);
            /* A well-formed one applies step 1 here, as the step's first Step: the
             * Step that waited above (its caller gone) is answered with it. */
            t = (buf){0};
            sm.tensors = 2;
            rows[0] = 3;
            vd[1] = E_DIM;
            put_tensor(&t, FERRY_RPC_DTYPE_I64, rd, 1, "weight", rows, sizeof rows[0]);
            put_tensor(&t, FERRY_RPC_DTYPE_F32, vd, 2, "weight", vals, E_DIM * sizeof(float));
            expect(&d, "install of step 1's sum", send_head(&d, FERRY_RPC_STEP, &sq.base, &t),
                   FERRY_OK, NULL);
            expect(&d, "install of a step applied already: acknowledged",
                   send_head(&d, FERRY_RPC_STEP, &sq.base, &t), FERRY_OK, NULL);
            free(t.p);
        }
        sq.install = 0;
        sq.n_summed = 0;
        sq.summed = NULL;
        expect(&thief, "GradNorm as a rank another session holds",
               send_head(&thief, FERRY_RPC_GRAD_NORM, &gn.base, NULL), FERRY_ERR_DENIED,
               "this session holds no rank");
        expect(&thief, "Step as a rank another session holds",
               send_head(&thief, FERRY_RPC_STEP, &sq.base, NULL), FERRY_ERR_DENIED,
               "this session holds no rank");
        /* Step 2 with rank 1 on the second session: a GradNorm held past its hold_ms
         * answers `pending` (a live server waiting for ranks), one rank per step takes
         * the sum, and the rank answered `pending` gets the completed barrier's reply,
         * sum included, when it asks again. */
        j.action_case = FERRY__V1__JOB_REQUEST__ACTION_JOIN;
        j.join = &jj;
        mb.rank = 1;
        CHECK_OK(send_head(&thief, FERRY_RPC_JOB, &j.base, NULL));
        mb.rank = 0;
        float g1[4 * E_DIM];
        for (int i = 0; i < 4 * E_DIM; i++)
            g1[i] = 0.25f;
        CHECK_OK(emb_forward(&d, 78, 1, ids, 4));
        CHECK_OK(emb_backward(&d, 78, 1, g1, 4, E_DIM));
        CHECK_OK(emb_forward(&thief, 79, 1, ids, 4));
        CHECK_OK(emb_backward(&thief, 79, 1, g1, 4, E_DIM));
        js.step = 2;
        js.rank = 0;
        js.want_sum = 1;
        js.hold_ms = 200;
        gn.ctx_id = 78;
        ferry_rpc_msg rep;
        ferry_rpc_msg_init(&rep);
        buf hb = {0};
        put_head(&hb, &gn.base);
        double t0 = ferry_now();
        CHECK_OK(send_raw(&d, FERRY_RPC_GRAD_NORM, &hb, &rep));
        double held = ferry_now() - t0;
        expect(&d, "GradNorm held past its hold_ms: pending",
               ((const Ferry__V1__GradNormReply *)rep.head)->pending && held >= 0.19 && held < 2.0
                   ? FERRY_OK
                   : FERRY_ERR_INVALID,
               FERRY_OK, NULL);
        ferry_rpc_msg_deinit(&rep);
        js.rank = 1;
        gn.ctx_id = 79;
        expect(&thief, "a second rank asks for the step's sum",
               send_head(&thief, FERRY_RPC_GRAD_NORM, &gn.base, NULL), FERRY_ERR_INVALID,
               "rank 0 already does");
        js.want_sum = 0;
        js.hold_ms = 0;
        CHECK_OK(send_head(&thief, FERRY_RPC_GRAD_NORM, &gn.base, NULL)); /* the last rank */
        CHECK_OK(send_raw(&d, FERRY_RPC_GRAD_NORM, &hb, &rep));           /* rank 0 again */
        const Ferry__V1__GradNormReply *gr = rep.head;
        expect(&d, "the pending rank's GradNorm again: the barrier's reply, with the sum",
               !gr->pending && gr->n_sum == 1 && strcmp(gr->sum[0]->module, "emb") == 0 &&
                       gr->sum[0]->tensors == 2 && rep.ntensors == 2 && gr->sum_squares > 0.0
                   ? FERRY_OK
                   : FERRY_ERR_INVALID,
               FERRY_OK, NULL);
        ferry_rpc_msg_deinit(&rep);
        free(hb.p);
        js.rank = 0;
        sq.ctx_id = 78;
        js.step = 2;
        CHECK_OK(send_head(&d, FERRY_RPC_STEP, &sq.base, NULL));
        js.rank = 1;
        sq.ctx_id = 79;
        CHECK_OK(send_head(&thief, FERRY_RPC_STEP, &sq.base, NULL));
        js.rank = 0;
        /* A recover barrier whose first arrival was given up by its caller (a replica's
         * re-admission that one rank could not reach): a newer roll-back that meets none
         * of its steps replaces it instead of failing against the stale offer. */
        {
            Ferry__V1__JobRecover rc;
            ferry__v1__job_recover__init(&rc);
            rc.member = &mb;
            uint64_t old_step = 5, new_step = 10;
            rc.n_checkpoints = 1;
            rc.checkpoints = &old_step;
            j.action_case = FERRY__V1__JOB_REQUEST__ACTION_RECOVER;
            j.recover = &rc;
            raw_deadline_ms = 300;
            expect(&d, "rank 0 recovers to step 5; nobody else comes",
                   send_head(&d, FERRY_RPC_JOB, &j.base, NULL), FERRY_ERR_TIMEOUT, NULL);
            mb.rank = 1;
            rc.checkpoints = &new_step;
            expect(&thief, "rank 1 recovers to step 10: the stale offer is replaced",
                   send_head(&thief, FERRY_RPC_JOB, &j.base, NULL), FERRY_ERR_TIMEOUT, NULL);
            raw_deadline_ms = 10000;
            mb.rank = 0;
            expect(&d, "rank 0 recovers to step 10: they meet (no such file here)",
                   send_head(&d, FERRY_RPC_JOB, &j.base, NULL), FERRY_ERR_NOT_FOUND,
                   "the ranks offer steps 10;");
        }
        ferry_rpc_client_destroy(thief.c);
    }

    /* -- elastic jobs: JobElastic, and the membership an elastic GradNorm names -- */
    {
        Ferry__V1__JobMember mb;
        ferry__v1__job_member__init(&mb);
        mb.world = 2;
        mb.sync = FERRY__V1__SYNC_MODE__BSP;
        mb.elastic_min = 3;
        Ferry__V1__JobJoin jj;
        ferry__v1__job_join__init(&jj);
        jj.member = &mb;
        Ferry__V1__JobRequest j;
        ferry__v1__job_request__init(&j);
        j.job = "ej";
        j.action_case = FERRY__V1__JOB_REQUEST__ACTION_JOIN;
        j.join = &jj;
        expect(&d, "elastic job with elastic_min above world",
               send_head(&d, FERRY_RPC_JOB, &j.base, NULL), FERRY_ERR_INVALID,
               "elastic_min (3) <= world (2)");
        mb.elastic_min = 1;
        Ferry__V1__JobElastic e;
        ferry__v1__job_elastic__init(&e);
        e.batch = 4;
        { /* an elastic async job (contract 1.7): per-rank only, no redo, the progress alone */
            mb.sync = FERRY__V1__SYNC_MODE__ASYNC;
            j.job = "ea";
            CHECK_OK(send_head(&d, FERRY_RPC_JOB, &j.base, NULL));
            j.action_case = FERRY__V1__JOB_REQUEST__ACTION_ELASTIC;
            j.elastic = &e;
            e.op = FERRY__V1__JOB_ELASTIC__OP__ADMIT;
            expect(&d, "async admit without a per-rank batch",
                   send_head(&d, FERRY_RPC_JOB, &j.base, NULL), FERRY_ERR_INVALID,
                   "keeps each rank's batch");
            e.rank_columns = 2;
            e.op = FERRY__V1__JOB_ELASTIC__OP__REDO;
            expect(&d, "async redo", send_head(&d, FERRY_RPC_JOB, &j.base, NULL), FERRY_ERR_INVALID,
                   "no common step to redo");
            e.op = FERRY__V1__JOB_ELASTIC__OP__PUT;
            e.step = 1;
            expect(&d, "async put before admission", send_head(&d, FERRY_RPC_JOB, &j.base, NULL),
                   FERRY_ERR_ABORTED, "is not a member");
            e.op = FERRY__V1__JOB_ELASTIC__OP__ADMIT;
            CHECK_OK(send_head(&d, FERRY_RPC_JOB, &j.base, NULL)); /* 1 of 1..2, at once */
            e.op = FERRY__V1__JOB_ELASTIC__OP__START;
            expect(&d, "start on the coordinator", send_head(&d, FERRY_RPC_JOB, &j.base, NULL),
                   FERRY_ERR_INVALID, "other than its coordinator");
            uint8_t c8[8] = {0}, prog[16] = {0};
            ProtobufCBinaryData one = {8, c8};
            e.op = FERRY__V1__JOB_ELASTIC__OP__PUT;
            e.columns = &one;
            e.n_columns = 1;
            expect(&d, "async put of columns", send_head(&d, FERRY_RPC_JOB, &j.base, NULL),
                   FERRY_ERR_INVALID, "puts its progress alone");
            e.columns = NULL;
            e.n_columns = 0;
            expect(&d, "async put of no progress", send_head(&d, FERRY_RPC_JOB, &j.base, NULL),
                   FERRY_ERR_INVALID, "progress of 0 bytes");
            e.progress.data = prog;
            e.progress.len = sizeof prog;
            CHECK_OK(send_head(&d, FERRY_RPC_JOB, &j.base, NULL));
            e.progress.len = 0;
            e.progress.data = NULL;
            e.rank_columns = 0;
            e.step = 0;
            mb.sync = FERRY__V1__SYNC_MODE__BSP;
            j.job = "ej";
            j.action_case = FERRY__V1__JOB_REQUEST__ACTION_JOIN;
            j.join = &jj; /* a oneof: elastic took its place */
        }
        CHECK_OK(send_head(&d, FERRY_RPC_JOB, &j.base, NULL));
        j.action_case = FERRY__V1__JOB_REQUEST__ACTION_ELASTIC;
        j.elastic = &e;
        e.op = (Ferry__V1__JobElastic__Op)9;
        expect(&d, "elastic op 9", send_head(&d, FERRY_RPC_JOB, &j.base, NULL), FERRY_ERR_INVALID,
               "elastic op 9");
        e.op = FERRY__V1__JOB_ELASTIC__OP__PUT;
        e.batch = 0;
        expect(&d, "elastic call with a global batch of 0",
               send_head(&d, FERRY_RPC_JOB, &j.base, NULL), FERRY_ERR_INVALID, "global batch 0");
        e.batch = 4;
        e.rank = 1;
        expect(&d, "elastic call for a rank this session does not hold",
               send_head(&d, FERRY_RPC_JOB, &j.base, NULL), FERRY_ERR_DENIED,
               "this session holds no rank 1");
        e.rank = 0;
        e.epoch = 1;
        e.step = 1;
        expect(&d, "put before the job started", send_head(&d, FERRY_RPC_JOB, &j.base, NULL),
               FERRY_ERR_ABORTED, "the membership is epoch 0 without it");
        e.op = FERRY__V1__JOB_ELASTIC__OP__ADMIT;
        CHECK_OK(send_head(&d, FERRY_RPC_JOB, &j.base, NULL)); /* 1 of 1..2: epoch 1 */
        e.batch = 5;
        expect(&d, "elastic call with another global batch",
               send_head(&d, FERRY_RPC_JOB, &j.base, NULL), FERRY_ERR_INVALID,
               "global batch 5 columns; the job's is 4");
        e.batch = 4;
        e.op = FERRY__V1__JOB_ELASTIC__OP__PUT;
        uint8_t col[8] = {0}, big[5000] = {0};
        ProtobufCBinaryData cols[4] = {{8, col}, {8, col}, {8, col}, {4, col}};
        e.columns = cols;
        e.n_columns = 4;
        e.col0 = 1;
        expect(&d, "put of columns the rank does not hold",
               send_head(&d, FERRY_RPC_JOB, &j.base, NULL), FERRY_ERR_INVALID,
               "holds columns [0, 4)");
        e.col0 = 0;
        expect(&d, "put of columns of unequal sizes", send_head(&d, FERRY_RPC_JOB, &j.base, NULL),
               FERRY_ERR_INVALID, "every column has the same");
        cols[3].len = 8;
        e.progress.data = big;
        e.progress.len = sizeof big;
        expect(&d, "put of 5000 bytes of progress", send_head(&d, FERRY_RPC_JOB, &j.base, NULL),
               FERRY_ERR_INVALID, "progress of 5000 bytes");
        e.progress.len = 16;
        e.step = 3;
        expect(&d, "put of a step that is not open", send_head(&d, FERRY_RPC_JOB, &j.base, NULL),
               FERRY_ERR_INVALID, "the open step is 1");
        e.step = 1;
        e.epoch = 2;
        expect(&d, "put under a newer epoch than the job's",
               send_head(&d, FERRY_RPC_JOB, &j.base, NULL), FERRY_ERR_ABORTED,
               "membership is epoch 1");
        e.epoch = 1;
        CHECK_OK(send_head(&d, FERRY_RPC_JOB, &j.base, NULL));
        e.op = FERRY__V1__JOB_ELASTIC__OP__SYNC;
        expect(&d, "sync of a step not applied", send_head(&d, FERRY_RPC_JOB, &j.base, NULL),
               FERRY_ERR_INVALID, "step 1 is not applied here");
        e.op = FERRY__V1__JOB_ELASTIC__OP__REDO;
        CHECK_OK(send_head(&d, FERRY_RPC_JOB, &j.base, NULL)); /* nobody gone: unchanged */
        j.job = "hj";
        expect(&d, "elastic call on a fixed job", send_head(&d, FERRY_RPC_JOB, &j.base, NULL),
               FERRY_ERR_INVALID, "is not elastic");
        Ferry__V1__JobStep js;
        ferry__v1__job_step__init(&js);
        js.job = "ej";
        js.step = 1;
        Ferry__V1__GradNormRequest gn;
        ferry__v1__grad_norm_request__init(&gn);
        gn.ctx_id = 78;
        gn.job = &js;
        expect(&d, "elastic GradNorm naming no membership",
               send_head(&d, FERRY_RPC_GRAD_NORM, &gn.base, NULL), FERRY_ERR_INVALID,
               "names its membership");
        uint32_t members[2] = {1, 0};
        js.epoch = 1;
        js.members = members;
        js.n_members = 2;
        expect(&d, "elastic GradNorm with members out of order",
               send_head(&d, FERRY_RPC_GRAD_NORM, &gn.base, NULL), FERRY_ERR_INVALID,
               "ascending ranks below 2");
        js.members = &members[0];
        js.n_members = 1;
        expect(&d, "elastic GradNorm of a rank not among its members",
               send_head(&d, FERRY_RPC_GRAD_NORM, &gn.base, NULL), FERRY_ERR_INVALID,
               "rank 0 is not among the members");
        Ferry__V1__StepRequest sq;
        ferry__v1__step_request__init(&sq);
        sq.ctx_id = 78;
        sq.job = &js;
        js.epoch = 7;
        expect(&d, "elastic Step under another epoch", send_head(&d, FERRY_RPC_STEP, &sq.base, NULL),
               FERRY_ERR_ABORTED, "steps under membership epoch 7");
    }

    /* -- checkpoint paths and disk -- */
    expect(&d, "checkpoint path escape ../", checkpoint(&d, "../escape.ckpt"), FERRY_ERR_INVALID,
           "file name inside");
    expect(&d, "checkpoint absolute path", checkpoint(&d, "/etc/passwd"), FERRY_ERR_INVALID,
           "file name inside");
    expect(&d, "checkpoint hidden name", checkpoint(&d, ".bashrc"), FERRY_ERR_INVALID,
           "file name inside");
    {
        char dir[256];
        (void)snprintf(dir, sizeof dir, "%s/ckpt", d.dir);
        for (int i = 0; i < 6; i++) {
            char name[32];
            (void)snprintf(name, sizeof name, "loop%d.ckpt", i);
            CHECK_OK(checkpoint(&d, name));
        }
        expect(&d, "Checkpoint in a loop keeps 2 files",
               count_files(dir) == 2 ? FERRY_OK : FERRY_ERR_IO, FERRY_OK, NULL);
        /* A symlink planted where the checkpoint goes: replaced, never followed. */
        char victim[512], link[512];
        (void)snprintf(victim, sizeof victim, "%s/victim", d.dir);
        (void)snprintf(link, sizeof link, "%s/planted.ckpt", dir);
        FILE *f = fopen(victim, "w");
        CHECK(f != NULL);
        fputs("precious\n", f);
        (void)fclose(f);
        CHECK(symlink(victim, link) == 0);
        CHECK_OK(checkpoint(&d, "planted.ckpt"));
        struct stat st;
        CHECK(lstat(link, &st) == 0 && S_ISREG(st.st_mode));
        CHECK(stat(victim, &st) == 0 && st.st_size == 9);
        expect(&d, "symlink planted in the checkpoint directory", FERRY_OK, FERRY_OK, NULL);
    }

    /* -- thousands of contexts never released (the count limit itself is tested
     * in-process below, where no sweep races the loop) -- */
    {
        int opened = 0;
        for (uint64_t ctx = 1000; ctx < 4000; ctx++)
            opened += emb_forward(&d, ctx, 1, ids, 4) == FERRY_OK;
        fprintf(stderr, "  opened %d contexts, %.0f live\n", opened,
                stat_value(&d, "contexts_live"));
        /* One identity gets its share (--max-contexts-per-identity: half of 4000); more
         * only as the sweep frees its oldest. */
        expect(&d, "3000 contexts never released (one identity: its share of 2000)",
               opened >= 2000 ? FERRY_OK : FERRY_ERR_RESOURCE, FERRY_OK, NULL);
    }
    free(b.p);

    /* Every context is swept; the memory the attack made the server take is back. */
    wait_swept(&d);
    /* What the cases' sessions and connections held is freed as they lapse. The bytes
     * the server's allocations hold (heap_in_use_bytes) must come back within 10% (or
     * 4 MiB) of the start: what state left held would grow. Its resident memory, within
     * 50%: up to 1,509 of the 3,000 contexts are live at once, and glibc's per-thread
     * arenas stay fragmented by that peak after every context is freed (+6.5% to +11%
     * seen, the same after three of the sweep's trims). The attacks this test replays
     * grew the server by gigabytes. Up to 16 s for both. */
    struct timespec settle = {0, 500 * 1000 * 1000};
    int64_t rss1 = rss_bytes(d.pid);
    double heap1 = stat_value(&d, "heap_in_use_bytes");
#define HEAP_BACK_(h) ((h) <= heap0 * 1.10 || (h) <= heap0 + 4.0 * 1048576.0)
#define RSS_BACK_(r)  ((r) <= rss0 + rss0 / 2)
    for (int i = 0; i < 32 && !(HEAP_BACK_(heap1) && RSS_BACK_(rss1)); i++) {
        nanosleep(&settle, NULL);
        rss1 = rss_bytes(d.pid);
        heap1 = stat_value(&d, "heap_in_use_bytes");
    }
    fprintf(stderr,
            "%d hostile cases; ferry-ps in use %.1f MiB before, %.1f MiB after the sweep; RSS "
            "%.1f MiB, %.1f MiB\n",
            ncases, heap0 / 1048576.0, heap1 / 1048576.0, (double)rss0 / 1048576.0,
            (double)rss1 / 1048576.0);
    CHECK(ncases >= 30);
    CHECK(heap0 > 0.0);
    CHECK(HEAP_BACK_(heap1));
    CHECK(RSS_BACK_(rss1));
#undef HEAP_BACK_
#undef RSS_BACK_
    CHECK_BITS_EQ(stat_value(&d, "context_bytes"), 0.0);
    daemon_stop(&d);
}

/* Module `name`'s 6 weights (a 3 x 2 linear) into w, through GetParams. */
static void get_weight6(psd *d, const char *name, float w[6]) {
    ferry_rpc_msg reply;
    ferry_rpc_msg_init(&reply);
    Ferry__V1__GetParamsRequest q;
    ferry__v1__get_params_request__init(&q);
    q.module = STR(name);
    buf b = {0};
    put_head(&b, &q.base);
    CHECK_OK(send_raw(d, FERRY_RPC_GET_PARAMS, &b, &reply));
    const ferry_rpc_tensor *t = ferry_rpc_msg_find(&reply, "weight");
    CHECK(t != NULL && t->nbytes == 6 * sizeof(float));
    memcpy(w, t->data, 6 * sizeof(float));
    ferry_rpc_msg_deinit(&reply);
    free(b.p);
}

/* A checkpoint holds any number of modules: 4200 (the old format stopped at 4096
 * and said OK), restored by a second psd. Modules on both sides of 4096 get weights
 * of their own (0.25 + their index) and must come back with exactly those bits; one
 * left at its initial values must come back bit-identical too. */
TEST(checkpoint_of_4200_modules) {
    static const int marked[] = {0, 4095, 4096, 4097, 4150, 4199};
    const int nmarked = (int)(sizeof marked / sizeof marked[0]);
    psd d;
    daemon_start(&d, NULL);
    for (int i = 0; i < 4200; i++) {
        char name[32];
        (void)snprintf(name, sizeof name, "m%04d", i);
        CHECK_OK(create(&d, name, "linear", 2, 3, 0, 0, NULL));
    }
    for (int k = 0; k < nmarked; k++) {
        char name[32];
        (void)snprintf(name, sizeof name, "m%04d", marked[k]);
        CHECK_OK(set_params(&d, name, 0, 3, 2, 0.25f + (float)marked[k]));
    }
    float init[6];
    get_weight6(&d, "m4123", init);
    CHECK_OK(checkpoint(&d, "all.ckpt"));
    char path[256], keep[256];
    (void)snprintf(path, sizeof path, "%s/ckpt/all.ckpt", d.dir);
    (void)snprintf(keep, sizeof keep, "/tmp/ferry-hostile-all-%d.ckpt", (int)getpid());
    char cmd[600];
    (void)snprintf(cmd, sizeof cmd, "cp %s %s", path, keep);
    CHECK(system(cmd) == 0);
    daemon_stop(&d);

    psd r;
    daemon_start(&r, keep);
    CHECK_BITS_EQ(stat_value(&r, "modules"), 4200.0);
    float w[6];
    for (int k = 0; k < nmarked; k++) {
        char name[32];
        (void)snprintf(name, sizeof name, "m%04d", marked[k]);
        get_weight6(&r, name, w);
        for (int i = 0; i < 6; i++)
            CHECK_BITS_EQ(w[i], 0.25f + (float)marked[k]);
    }
    get_weight6(&r, "m4123", w);
    CHECK(memcmp(w, init, sizeof w) == 0);
    daemon_stop(&r);
    CHECK(unlink(keep) == 0);
}

/* The live-context limit, on an in-process server whose TTL is long enough that no
 * sweep frees a context while the test counts. */
TEST(context_count_limit) {
    ferry_ps_config cfg;
    ferry_ps_config_default(&cfg);
    cfg.listen = "127.0.0.1:0";
    cfg.context_ttl_s = 3600.0;
    cfg.max_contexts = 100;
    cfg.max_contexts_per_identity = 100; /* one identity: the server's limit, not its share */
    ferry_ps_server *s;
    CHECK_OK(ferry_ps_server_create(&cfg, &s));
    CHECK_OK(ferry_ps_server_start(s));
    psd d = {0};
    ferry_rpc_client_config cc = {.deadline_ms = 10000, .wait_for_ready = 1};
    CHECK_OK(ferry_rpc_client_create(ferry_ps_server_address(s), &cc, &d.c));
    CHECK_OK(ferry_test_hello(d.c, 0, NULL));
    CHECK_OK(create(&d, "emb", "embedding", V_EMB, E_DIM, 0, 0, NULL));
    int32_t ids[2] = {1, 2};
    for (uint64_t ctx = 1; ctx <= 100; ctx++)
        CHECK_OK(emb_forward(&d, ctx, 1, ids, 2));
    CHECK_STATUS(emb_forward(&d, 101, 1, ids, 2), FERRY_ERR_RESOURCE);
    CHECK(strstr(ferry_error_last(), "100 contexts are live") != NULL);
    CHECK(strstr(ferry_error_last(), "--max-contexts") != NULL);
    CHECK_OK(emb_forward(&d, 100, 2, ids, 2)); /* a live context goes on working */
    CHECK_OK(step(&d, 1, 1.0));                /* retired: room for one more */
    CHECK_OK(emb_forward(&d, 101, 1, ids, 2));
    CHECK_STATUS(emb_forward(&d, 102, 1, ids, 2), FERRY_ERR_RESOURCE);
    ferry_rpc_client_destroy(d.c);
    ferry_ps_server_destroy(s);
}

FERRY_TEST_MAIN(T(hostile_requests) T(context_count_limit) T(checkpoint_of_4200_modules))
