/* test_rpc_codec.c - the tensor codec without sockets: message building rules,
 * encode/decode round trips over arbitrary chunkings, byte compatibility with
 * protobuf-c in both directions, and malformed or truncated input, which must
 * give FERRY_ERR_FORMAT and never crash (run it under ASan). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ferry.pb-c.h"
#include "common/rpc/rpc.h"
#include "common/rpc/codec.h"

static const ferry__rpc_limits limits = {.max_message_bytes = 64u << 20, .max_tensors = 64};

/* ---- Helpers -------------------------------------------------------------------- */

static int releases;
static void count_release(void *user) {
    (void)user;
    releases++;
}

/* Deterministic bytes that differ per tensor and position. */
static void fill(void *p, size_t n, unsigned seed) {
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(seed * 131u + i * 7u + (i >> 8));
}

/* A message with a Forward header and tensors of the given byte sizes (f32
 * vectors, except that sizes not divisible by 4 are impossible: callers pass
 * multiples of 4; 0 gives shape [0]). Payloads are borrowed from bufs[i]. */
static void build(ferry_rpc_msg *m, const size_t *sizes, int n, void **bufs) {
    Ferry__V1__ForwardRequest q;
    ferry__v1__forward_request__init(&q);
    Ferry__V1__LstmForwardArgs args; /* a nested message of the header */
    ferry__v1__lstm_forward_args__init(&args);
    args.stream = 7;
    args.seed = 1ULL << 40;
    args.t0 = 9;
    args.carry = 1;
    q.ctx_id = 0x1234567890abcdefULL;
    q.call_id = 42;
    q.module = "dec0";
    q.mode = "partials";
    q.args_case = FERRY__V1__FORWARD_REQUEST__ARGS_LSTM;
    q.lstm = &args;
    ferry_rpc_msg_init(m);
    CHECK_OK(ferry_rpc_msg_set_head(m, &q.base));
    for (int i = 0; i < n; i++) {
        ferry_rpc_tensor t = {.dtype = FERRY_RPC_DTYPE_F32, .ndim = 1};
        t.dim[0] = (int64_t)(sizes[i] / 4);
        t.nbytes = sizes[i];
        bufs[i] = sizes[i] > 0 ? malloc(sizes[i]) : NULL;
        fill(bufs[i], sizes[i], (unsigned)i + 1);
        t.data = bufs[i];
        (void)snprintf(t.name, sizeof t.name, "t%d", i);
        CHECK_OK(ferry_rpc_msg_add(m, &t));
    }
}

/* An F32 tensor of shape (d0) or, with d1 > 0, (d0, d1), borrowing data. */
static ferry_rpc_tensor f32_tensor(const char *name, int64_t d0, int64_t d1, float *data) {
    ferry_rpc_tensor t = {.dtype = FERRY_RPC_DTYPE_F32, .ndim = d1 > 0 ? 2 : 1, .data = data};
    t.dim[0] = d0;
    t.dim[1] = d1;
    t.nbytes = (size_t)(d0 * (d1 > 0 ? d1 : 1)) * sizeof(float);
    (void)snprintf(t.name, sizeof t.name, "%s", name);
    return t;
}

static uint8_t *encode_flat(const ferry_rpc_msg *m, size_t inline_max, size_t *n) {
    ferry__rpc_wire w;
    ferry__rpc_wire_init(&w);
    CHECK_OK(ferry__rpc_encode(m, &ferry__v1__forward_request__descriptor, inline_max, &w));
    uint8_t *buf = malloc(w.total + 1);
    ferry__rpc_wire_flatten(&w, m, buf);
    *n = w.total;
    ferry__rpc_wire_deinit(&w);
    return buf;
}

/* A source that cuts a buffer into pseudo-random chunks, empty ones included. */
typedef struct chunker {
    const uint8_t *p;
    size_t n, off;
    unsigned state;
} chunker;

static int chunk_next(void *user, const uint8_t **p, size_t *n) {
    chunker *c = user;
    if (c->off >= c->n)
        return 0;
    c->state = c->state * 1103515245u + 12345u;
    size_t k = (c->state >> 16) % 37; /* 0..36 bytes: header fields split anywhere */
    if ((c->state & 7) == 0)
        k *= 997; /* now and then a long chunk */
    if (k > c->n - c->off)
        k = c->n - c->off;
    *p = c->p + c->off;
    *n = k;
    c->off += k;
    return 1;
}

static ferry_status decode_chunked(const uint8_t *buf, size_t n, unsigned seed,
                                   ferry_rpc_msg *out) {
    chunker c = {.p = buf, .n = n, .state = seed};
    ferry__rpc_source src = {.next = chunk_next, .user = &c, .total = n};
    return ferry__rpc_decode(&src, &ferry__v1__forward_request__descriptor, &limits, out);
}

static void check_same(const ferry_rpc_msg *got, const size_t *sizes, int n, void **bufs) {
    const Ferry__V1__ForwardRequest *q = got->head;
    CHECK(q != NULL);
    CHECK(q->ctx_id == 0x1234567890abcdefULL);
    CHECK_EQ(q->call_id, 42);
    CHECK(strcmp(q->module, "dec0") == 0 && strcmp(q->mode, "partials") == 0);
    CHECK(q->args_case == FERRY__V1__FORWARD_REQUEST__ARGS_LSTM && q->lstm != NULL);
    CHECK(q->lstm->seed == 1ULL << 40 && q->lstm->stream == 7 && q->lstm->t0 == 9);
    CHECK(q->lstm->carry && !q->lstm->reset);
    CHECK_EQ(q->n_tensors, 0);
    CHECK_EQ(got->ntensors, n);
    for (int i = 0; i < n; i++) {
        const ferry_rpc_tensor *t = &got->tensors[i];
        char name[16];
        (void)snprintf(name, sizeof name, "t%d", i);
        CHECK(strcmp(t->name, name) == 0);
        CHECK_EQ(t->dtype, FERRY_RPC_DTYPE_F32);
        CHECK_EQ(t->ndim, 1);
        CHECK_EQ(t->dim[0], (int64_t)(sizes[i] / 4));
        CHECK_EQ(t->nbytes, sizes[i]);
        if (sizes[i] > 0) {
            CHECK(((uintptr_t)t->data & 63) == 0);
            CHECK(memcmp(t->data, bufs[i], sizes[i]) == 0);
        }
    }
}

/* ---- Message rules ---------------------------------------------------------------- */

TEST(method_table) {
    CHECK(strcmp(ferry_rpc_method_name(FERRY_RPC_FORWARD), "Forward") == 0);
    CHECK(strcmp(ferry_rpc_method_name(FERRY_RPC_RELEASE_CONTEXT), "ReleaseContext") == 0);
    CHECK(strcmp(ferry_rpc_method_name(FERRY_RPC_METHOD_COUNT), "?") == 0);
    for (int m = 0; m < FERRY_RPC_METHOD_COUNT; m++) {
        const ferry__rpc_method_info *mi = ferry__rpc_method((ferry_rpc_method)m);
        char path[64];
        (void)snprintf(path, sizeof path, "/ferry.v1.Ferry/%s", mi->name);
        CHECK(strcmp(mi->path, path) == 0);
        CHECK(strstr(mi->request->name, mi->name) != NULL);
        CHECK(strstr(mi->reply->name, mi->name) != NULL);
    }
}

TEST(msg_rules) {
    ferry_rpc_msg m;
    ferry_rpc_msg_init(&m);
    float x[6] = {0};
    ferry_rpc_tensor t = {
        .dtype = FERRY_RPC_DTYPE_F32, .ndim = 2, .dim = {2, 3}, .data = x, .nbytes = sizeof x};
    ferry_rpc_tensor bad = t;
    bad.dtype = 9;
    CHECK_STATUS(ferry_rpc_msg_add(&m, &bad), FERRY_ERR_INVALID);
    bad = t;
    bad.ndim = 5;
    CHECK_STATUS(ferry_rpc_msg_add(&m, &bad), FERRY_ERR_INVALID);
    bad = t;
    bad.dim[1] = -3;
    CHECK_STATUS(ferry_rpc_msg_add(&m, &bad), FERRY_ERR_INVALID);
    bad = t;
    bad.nbytes = 20;
    CHECK_STATUS(ferry_rpc_msg_add(&m, &bad), FERRY_ERR_SHAPE);
    bad = t;
    bad.data = NULL;
    CHECK_STATUS(ferry_rpc_msg_add(&m, &bad), FERRY_ERR_INVALID);
    bad = t;
    memset(bad.name, 'a', sizeof bad.name);
    CHECK_STATUS(ferry_rpc_msg_add(&m, &bad), FERRY_ERR_INVALID);
    CHECK_EQ(m.ntensors, 0);

    /* Owned tensors are released exactly once, by deinit or by the taker. */
    releases = 0;
    t.release = count_release;
    CHECK_OK(ferry_rpc_msg_add(&m, &t));
    CHECK_OK(ferry_rpc_msg_add_copy(&m, &t)); /* copies: t's release is not involved */
    strcpy(t.name, "third");
    CHECK_OK(ferry_rpc_msg_add(&m, &t));
    CHECK(ferry_rpc_msg_find(&m, "third") == &m.tensors[2]);
    CHECK(ferry_rpc_msg_find(&m, "nope") == NULL);
    CHECK(m.tensors[1].data != x && ((uintptr_t)m.tensors[1].data & 63) == 0);
    ferry_rpc_tensor taken;
    CHECK_OK(ferry_rpc_msg_take(&m, 2, &taken));
    CHECK_STATUS(ferry_rpc_msg_take(&m, 3, &taken), FERRY_ERR_INVALID);
    ferry_rpc_msg_deinit(&m);
    CHECK_EQ(releases, 1);
    taken.release(taken.release_user);
    CHECK_EQ(releases, 2);

    void *data = NULL;
    int64_t dims[2] = {0, 5};
    CHECK_OK(ferry_rpc_msg_alloc(&m, FERRY_RPC_DTYPE_I64, 2, dims, "empty", &data));
    CHECK(data == NULL && m.tensors[0].nbytes == 0);
    dims[0] = 3;
    CHECK_OK(ferry_rpc_msg_alloc(&m, FERRY_RPC_DTYPE_I64, 2, dims, NULL, &data));
    CHECK(data != NULL && m.tensors[1].nbytes == 120 && ((uintptr_t)data & 63) == 0);
    memset(data, 1, 120);
    CHECK_STATUS(ferry_rpc_msg_alloc(&m, 7, 1, dims, NULL, &data), FERRY_ERR_INVALID);
    ferry_rpc_msg_deinit(&m);
    ferry_rpc_msg_deinit(&m); /* twice is fine */

    size_t nb;
    int64_t huge[4] = {1LL << 40, 1LL << 40, 1LL << 40, 0};
    CHECK_OK(ferry_rpc_tensor_nbytes(FERRY_RPC_DTYPE_F32, 4, huge, &nb));
    CHECK_EQ(nb, 0);
    CHECK_STATUS(ferry_rpc_tensor_nbytes(FERRY_RPC_DTYPE_F32, 3, huge, &nb), FERRY_ERR_RANGE);
}

TEST(head_rules) {
    ferry_rpc_msg m;
    ferry_rpc_msg_init(&m);
    Ferry__V1__StatsRequest s;
    ferry__v1__stats_request__init(&s);
    s.prefix = "rpc.";
    CHECK_OK(ferry_rpc_msg_set_head(&m, &s.base));
    ferry__rpc_wire w;
    ferry__rpc_wire_init(&w);
    CHECK_STATUS(ferry__rpc_encode(&m, &ferry__v1__forward_request__descriptor, 0, &w),
                 FERRY_ERR_INVALID);
    CHECK(strstr(ferry_error_last(), "ferry.v1.StatsRequest") != NULL);
    CHECK_OK(ferry__rpc_encode(&m, &ferry__v1__stats_request__descriptor, 0, &w));
    ferry__rpc_wire_deinit(&w);

    Ferry__V1__SetParamsRequest p;
    ferry__v1__set_params_request__init(&p);
    Ferry__V1__Tensor pt;
    ferry__v1__tensor__init(&pt);
    Ferry__V1__Tensor *pts[1] = {&pt};
    p.n_tensors = 1;
    p.tensors = pts;
    CHECK_STATUS(ferry_rpc_msg_set_head(&m, &p.base), FERRY_ERR_INVALID);
    CHECK(m.head_desc == &ferry__v1__stats_request__descriptor); /* unchanged */
    ferry_rpc_msg_deinit(&m);
}

/* Large buffers are recycled (outside sanitizer builds) when they fit without
 * wasting more than a quarter of the request; all are 64-byte aligned. */
TEST(buffers) {
    uint8_t *p = ferry_buf_alloc(3u << 20);
    CHECK(p != NULL && ((uintptr_t)p & 63) == 0);
    memset(p, 7, 3u << 20);
    ferry_buf_free(p);
    uint8_t *r = ferry_buf_alloc(2u << 20); /* too small to take a 3 MiB buffer */
    uint8_t *q = ferry_buf_alloc(5u << 19); /* 2.5 MiB: takes it */
    CHECK(q != NULL && r != NULL && ((uintptr_t)q & 63) == 0 && ((uintptr_t)r & 63) == 0);
#ifndef FERRY_SANITIZE
    CHECK(q == p);
#endif
    CHECK(r != q);
    memset(q, 1, 5u << 19);
    memset(r, 2, 2u << 20);
    ferry_buf_free(q);
    ferry_buf_free(r);
    uint8_t *z = ferry_buf_alloc(0);
    CHECK(z != NULL);
    ferry_buf_free(z);
    ferry_buf_free(NULL);
    CHECK(ferry_buf_alloc(SIZE_MAX - 8) == NULL);
}

/* ---- Round trips ----------------------------------------------------------------------- */

TEST(roundtrip_chunked) {
    const size_t sizes[] = {0, 4, 16, 1024, 1028, 4096, 100000, 3u << 20};
    enum { N = sizeof sizes / sizeof sizes[0] };
    void *bufs[N];
    ferry_rpc_msg m, got;
    build(&m, sizes, N, bufs);
    ferry_rpc_msg_init(&got);

    ferry__rpc_wire w;
    ferry__rpc_wire_init(&w);
    CHECK_OK(ferry__rpc_encode(&m, &ferry__v1__forward_request__descriptor, 1024, &w));
    /* Payloads above the inline size are segments pointing at the caller's
     * memory (zero copy); the rest sits in the small header buffer. */
    size_t by_ref = 0;
    int refs = 0;
    for (int i = 0; i < w.nseg; i++) {
        if (w.segs[i].tensor >= 0) {
            CHECK(sizes[w.segs[i].tensor] > 1024);
            by_ref += w.segs[i].len;
            refs++;
        }
    }
    CHECK_EQ(refs, 4);
    CHECK_EQ(by_ref, 1028 + 4096 + 100000 + (3u << 20));
    CHECK(w.len < 2048 + 200);
    ferry__rpc_wire_deinit(&w);

    size_t n;
    uint8_t *flat = encode_flat(&m, 1024, &n);
    CHECK_OK(ferry__rpc_decode_flat(flat, n, &ferry__v1__forward_request__descriptor, &limits, &got));
    check_same(&got, sizes, N, bufs);
    for (unsigned seed = 1; seed <= 20; seed++) {
        CHECK_OK(decode_chunked(flat, n, seed, &got));
        check_same(&got, sizes, N, bufs);
    }
    /* Inline threshold 0 (every payload by reference) gives the same bytes. */
    size_t n0;
    uint8_t *flat0 = encode_flat(&m, 0, &n0);
    CHECK(n0 == n && memcmp(flat0, flat, n) == 0);
    free(flat0);
    free(flat);
    ferry_rpc_msg_deinit(&got);
    ferry_rpc_msg_deinit(&m);
    for (int i = 0; i < N; i++)
        free(bufs[i]);
}

/* Our framing is plain protobuf: protobuf-c reads what we write, and we read
 * what protobuf-c writes. */
TEST(protobuf_c_compat) {
    const size_t sizes[] = {8, 2000, 0};
    void *bufs[3];
    ferry_rpc_msg m;
    build(&m, sizes, 3, bufs);
    m.tensors[1].dtype = FERRY_RPC_DTYPE_I64;
    m.tensors[1].ndim = 2;
    m.tensors[1].dim[0] = 25;
    m.tensors[1].dim[1] = 10;
    size_t n;
    uint8_t *flat = encode_flat(&m, 16, &n);
    Ferry__V1__ForwardRequest *q = ferry__v1__forward_request__unpack(NULL, n, flat);
    CHECK(q != NULL);
    CHECK(q->ctx_id == 0x1234567890abcdefULL && strcmp(q->module, "dec0") == 0);
    CHECK_EQ(q->n_tensors, 3);
    CHECK(q->tensors[1]->dtype == FERRY__V1__DTYPE__I64 && q->tensors[1]->n_shape == 2);
    CHECK(q->tensors[1]->shape[1] == 10 && strcmp(q->tensors[1]->name, "t1") == 0);
    CHECK(q->tensors[1]->data.len == 2000 && memcmp(q->tensors[1]->data.data, bufs[1], 2000) == 0);
    CHECK(q->tensors[2]->data.len == 0 && q->tensors[2]->n_shape == 1);

    /* Re-pack with protobuf-c (its own field order) and decode with ours. */
    size_t n2 = ferry__v1__forward_request__get_packed_size(q);
    uint8_t *flat2 = malloc(n2);
    CHECK_EQ(ferry__v1__forward_request__pack(q, flat2), n2);
    ferry_rpc_msg got;
    ferry_rpc_msg_init(&got);
    CHECK_OK(decode_chunked(flat2, n2, 5, &got));
    CHECK_EQ(got.ntensors, 3);
    CHECK(got.tensors[1].dtype == FERRY_RPC_DTYPE_I64 && got.tensors[1].dim[0] == 25);
    CHECK(memcmp(got.tensors[1].data, bufs[1], 2000) == 0);
    CHECK(memcmp(got.tensors[0].data, bufs[0], 8) == 0);
    const Ferry__V1__ForwardRequest *h = got.head;
    CHECK(h->args_case == FERRY__V1__FORWARD_REQUEST__ARGS_LSTM && h->lstm->stream == 7);

    ferry__v1__forward_request__free_unpacked(q, NULL);
    free(flat2);
    free(flat);
    ferry_rpc_msg_deinit(&got);
    ferry_rpc_msg_deinit(&m);
    for (int i = 0; i < 3; i++)
        free(bufs[i]);
}

/* A decoded message can be forwarded as is: its unpacked header is re-packed. */
TEST(forward_decoded) {
    const size_t sizes[] = {64};
    void *bufs[1];
    ferry_rpc_msg m, got, again;
    build(&m, sizes, 1, bufs);
    ferry_rpc_msg_init(&got);
    ferry_rpc_msg_init(&again);
    size_t n, n2;
    uint8_t *flat = encode_flat(&m, 0, &n);
    CHECK_OK(ferry__rpc_decode_flat(flat, n, &ferry__v1__forward_request__descriptor, &limits, &got));
    uint8_t *flat2 = encode_flat(&got, 0, &n2);
    CHECK_OK(
        ferry__rpc_decode_flat(flat2, n2, &ferry__v1__forward_request__descriptor, &limits, &again));
    check_same(&again, sizes, 1, bufs);
    free(flat);
    free(flat2);
    ferry_rpc_msg_deinit(&again);
    ferry_rpc_msg_deinit(&got);
    ferry_rpc_msg_deinit(&m);
    free(bufs[0]);
}

/* ---- Bad input ---------------------------------------------------------------------------- */

static ferry_status decode_bytes(const void *p, size_t n) {
    ferry_rpc_msg got;
    ferry_rpc_msg_init(&got);
    ferry_status st =
        ferry__rpc_decode_flat(p, n, &ferry__v1__forward_request__descriptor, &limits, &got);
    if (st != FERRY_OK)
        CHECK(got.ntensors == 0 && got.head == NULL); /* nothing leaks out of a failure */
    ferry_rpc_msg_deinit(&got);
    return st;
}

TEST(malformed_cases) {
    /* key 0x7a = field 15 (tensors), length-delimited */
    static const uint8_t overlong_varint[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff,
                                              0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    static const uint8_t field_zero[] = {0x00, 0x01};
    static const uint8_t group[] = {0x0b, 0x0c};
    static const uint8_t tensors_as_varint[] = {0x78, 0x01};
    static const uint8_t past_end[] = {0x7a, 0x05, 0x08, 0x01};
    static const uint8_t two_data[] = {0x7a, 0x0f, 0x12, 0x01, 0x01, 0x7a, 0x04, 1, 2,
                                       3,    4,    0x7a, 0x04, 1,    2,    3,    4};
    static const uint8_t bad_dtype[] = {0x7a, 0x02, 0x08, 0x07};
    static const uint8_t rank5[] = {0x7a, 0x07, 0x12, 0x05, 0, 0, 0, 0, 0};
    static const uint8_t size_mismatch[] = {0x7a, 0x09, 0x12, 0x01, 0x02, 0x7a, 0x04, 1, 2, 3, 4};
    static const uint8_t name_nul[] = {0x7a, 0x09, 0x12, 0x01, 0x00, 0x1a,
                                       0x02, 'a',  0x00, 0x08, 0x00};
    static const uint8_t cut_string[] = {0x1a, 0x02, 0x08}; /* module: 2 bytes announced, 1 sent */
    static const uint8_t bad_header[] = {0x0a, 0x01, 0x05}; /* ctx_id sent length-delimited */
    static const uint8_t huge_dim[] = {0x7a, 0x08, 0x12, 0x06, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01};
    static const uint8_t empty_scalar[] = {0x7a, 0x00}; /* scalar f32 needs 4 bytes */
    CHECK_STATUS(decode_bytes(overlong_varint, sizeof overlong_varint), FERRY_ERR_FORMAT);
    CHECK_STATUS(decode_bytes(field_zero, sizeof field_zero), FERRY_ERR_FORMAT);
    CHECK_STATUS(decode_bytes(group, sizeof group), FERRY_ERR_FORMAT);
    CHECK_STATUS(decode_bytes(tensors_as_varint, sizeof tensors_as_varint), FERRY_ERR_FORMAT);
    CHECK_STATUS(decode_bytes(past_end, sizeof past_end), FERRY_ERR_FORMAT);
    CHECK_STATUS(decode_bytes(two_data, sizeof two_data), FERRY_ERR_FORMAT);
    CHECK(strstr(ferry_error_last(), "two data fields") != NULL);
    CHECK_STATUS(decode_bytes(bad_dtype, sizeof bad_dtype), FERRY_ERR_FORMAT);
    CHECK_STATUS(decode_bytes(rank5, sizeof rank5), FERRY_ERR_FORMAT);
    CHECK_STATUS(decode_bytes(size_mismatch, sizeof size_mismatch), FERRY_ERR_FORMAT);
    CHECK(strstr(ferry_error_last(), "shape needs 8") != NULL);
    CHECK_STATUS(decode_bytes(name_nul, sizeof name_nul), FERRY_ERR_FORMAT);
    CHECK_STATUS(decode_bytes(cut_string, sizeof cut_string), FERRY_ERR_FORMAT);
    CHECK_STATUS(decode_bytes(bad_header, sizeof bad_header), FERRY_ERR_FORMAT);
    CHECK(strstr(ferry_error_last(), "header fields do not parse") != NULL);
    CHECK_STATUS(decode_bytes(huge_dim, sizeof huge_dim), FERRY_ERR_FORMAT);
    CHECK_STATUS(decode_bytes(empty_scalar, sizeof empty_scalar), FERRY_ERR_FORMAT);

    /* Accepted: an empty message, unpacked shape entries (0x10), unknown tensor
     * fields (0x28: field 5, skipped). Shape [2, 1] needs 8 bytes, [1, 1] 4. */
    static const uint8_t unpacked[] = {0x7a, 0x0c, 0x10, 0x02, 0x10, 0x01, 0x28,
                                       0x09, 0x7a, 0x04, 9,    9,    9,    9};
    CHECK_OK(decode_bytes("", 0));
    CHECK_STATUS(decode_bytes(unpacked, sizeof unpacked), FERRY_ERR_FORMAT);
    static const uint8_t unpacked_ok[] = {0x7a, 0x0c, 0x10, 0x01, 0x10, 0x01, 0x28,
                                          0x09, 0x7a, 0x04, 9,    9,    9,    9};
    CHECK_OK(decode_bytes(unpacked_ok, sizeof unpacked_ok));
}

TEST(limits) {
    const size_t sizes[] = {400, 400, 400};
    void *bufs[3];
    ferry_rpc_msg m, got;
    build(&m, sizes, 3, bufs);
    ferry_rpc_msg_init(&got);
    size_t n;
    uint8_t *flat = encode_flat(&m, 1024, &n);
    ferry__rpc_limits small = {.max_message_bytes = n - 1, .max_tensors = 64};
    CHECK_STATUS(ferry__rpc_decode_flat(flat, n, &ferry__v1__forward_request__descriptor, &small, &got),
                 FERRY_ERR_RANGE);
    small = (ferry__rpc_limits){.max_message_bytes = n, .max_tensors = 2};
    CHECK_STATUS(ferry__rpc_decode_flat(flat, n, &ferry__v1__forward_request__descriptor, &small, &got),
                 FERRY_ERR_RANGE);
    CHECK(got.ntensors == 0);
    small.max_tensors = 3;
    CHECK_OK(ferry__rpc_decode_flat(flat, n, &ferry__v1__forward_request__descriptor, &small, &got));
    free(flat);
    ferry_rpc_msg_deinit(&got);
    ferry_rpc_msg_deinit(&m);
    for (int i = 0; i < 3; i++)
        free(bufs[i]);
}

/* Every truncation and many random corruptions of a valid message: the decoder
 * answers OK or FERRY_ERR_FORMAT, never reads out of bounds, and whatever it
 * accepts is self-consistent. A cut inside the last tensor is always an error. */
TEST(fuzz_truncate_corrupt) {
    const size_t sizes[] = {12, 2048, 40};
    void *bufs[3];
    ferry_rpc_msg m, got;
    build(&m, sizes, 3, bufs);
    ferry_rpc_msg_init(&got);
    size_t n;
    uint8_t *flat = encode_flat(&m, 16, &n);
    size_t last_tensor_start; /* = the length of the same message without it */
    m.ntensors = 2;
    free(encode_flat(&m, 16, &last_tensor_start));
    m.ntensors = 3;
    for (size_t cut = 0; cut < n; cut++) {
        uint8_t *copy = malloc(cut + 1); /* exact size: ASan sees any overread */
        memcpy(copy, flat, cut);
        ferry_status st = decode_chunked(copy, cut, (unsigned)cut, &got);
        CHECK(st == FERRY_OK || st == FERRY_ERR_FORMAT);
        if (cut > last_tensor_start)
            CHECK_STATUS(st, FERRY_ERR_FORMAT);
        free(copy);
    }
    unsigned rng = 99;
    uint8_t *copy = malloc(n);
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(copy, flat, n);
        for (int k = 0; k < 1 + iter % 4; k++) {
            rng = rng * 1664525u + 1013904223u;
            copy[(rng >> 8) % n] ^= (uint8_t)(1u << (rng % 8));
        }
        ferry_status st = decode_chunked(copy, n, rng, &got);
        CHECK(st == FERRY_OK || st == FERRY_ERR_FORMAT);
        for (int i = 0; st == FERRY_OK && i < got.ntensors; i++) {
            size_t want;
            const ferry_rpc_tensor *t = &got.tensors[i];
            CHECK_OK(ferry_rpc_tensor_nbytes(t->dtype, t->ndim, t->dim, &want));
            CHECK_EQ(want, t->nbytes);
            CHECK(t->nbytes == 0 || ((uintptr_t)t->data & 63) == 0);
        }
    }
    free(copy);
    free(flat);
    ferry_rpc_msg_deinit(&got);
    ferry_rpc_msg_deinit(&m);
    for (int i = 0; i < 3; i++)
        free(bufs[i]);
}

/* bfloat16 rounding: to nearest, ties to even, NaN kept a (quiet) NaN, infinities
 * and signed zeros kept, the largest floats round to infinity; widening is exact. */
TEST(bf16_rounding) {
    static const struct {
        uint32_t in;
        uint16_t out;
    } cases[] = {
        {0x3f800000u, 0x3f80}, /* 1.0 */
        {0x3f808000u, 0x3f80}, /* halfway, even below: down */
        {0x3f818000u, 0x3f82}, /* halfway, odd below: up */
        {0x3f808001u, 0x3f81}, /* above halfway: up */
        {0x3f807fffu, 0x3f80}, /* below halfway: down */
        {0x80000000u, 0x8000}, /* -0 */
        {0x7f800000u, 0x7f80}, /* +inf */
        {0xff800000u, 0xff80}, /* -inf */
        {0x7f7fffffu, 0x7f80}, /* FLT_MAX rounds to inf */
        {0x00000001u, 0x0000}, /* smallest subnormal rounds to 0 */
        {0x7f800001u, 0x7fc0}, /* signalling NaN: quiet, not inf */
        {0xffc00000u, 0xffc0}, /* negative quiet NaN */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float f;
        memcpy(&f, &cases[i].in, sizeof f);
        uint16_t h = ferry_rpc_f32_to_bf16(f);
        if (h != cases[i].out)
            fprintf(stderr, "bf16(0x%08x) = 0x%04x, want 0x%04x\n", (unsigned)cases[i].in,
                    (unsigned)h, (unsigned)cases[i].out);
        CHECK(h == cases[i].out);
        uint32_t back;
        float w = ferry_rpc_bf16_to_f32(h);
        memcpy(&back, &w, sizeof back);
        CHECK(back == (uint32_t)h << 16);
    }
}

/* The array conversions agree with the element ones bit for bit: every case above,
 * NaNs of both signs and payloads, and random bit patterns, over lengths that end
 * inside and across the 512-element blocks, written at an odd (unaligned) address. */
TEST(bf16_arrays) {
    enum { N = 1301 };
    uint32_t *u = malloc(N * sizeof *u);
    uint8_t *h = malloc(2 * N + 2);
    float *back = malloc(N * sizeof *back);
    CHECK(u != NULL && h != NULL && back != NULL);
    static const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x7f800001u, 0xffc00000u,
                                       0x7fffffffu, 0xff800001u, 0x7f7fffffu, 0x80000000u,
                                       0x00000001u, 0x7f800000u, 0x007fffffu, 0x3f807fffu};
    uint64_t x = 0x9e3779b97f4a7c15u;
    for (int i = 0; i < N; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        u[i] = i < (int)(sizeof special / sizeof special[0]) ? special[i] : (uint32_t)x;
    }
    static const size_t lens[] = {0, 1, 511, 512, 513, 1024, N};
    for (size_t c = 0; c < sizeof lens / sizeof lens[0]; c++) {
        size_t n = lens[c];
        memset(h, 0xab, 2 * N + 2);
        ferry_rpc_bf16_narrow(h + 1, (const float *)(const void *)u, n);
        int bad = 0;
        for (size_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, &u[i], sizeof f);
            uint16_t want = ferry_rpc_f32_to_bf16(f);
            bad += h[1 + 2 * i] != (uint8_t)want || h[2 + 2 * i] != (uint8_t)(want >> 8);
        }
        CHECK(bad == 0);
        CHECK(h[0] == 0xab && h[1 + 2 * n] == 0xab); /* nothing written outside */
        ferry_rpc_bf16_widen(back, h + 1, n);
        for (size_t i = 0; i < n; i++) {
            uint16_t w = (uint16_t)(h[1 + 2 * i] | (uint16_t)h[2 + 2 * i] << 8);
            uint32_t b;
            memcpy(&b, &back[i], sizeof b);
            bad += b != (uint32_t)w << 16;
        }
        CHECK(bad == 0);
    }
    free(u);
    free(h);
    free(back);
}

/* A message whose wire dtype is BF16 sends its F32 tensors of rank >= 2 in half the
 * bytes and the receiver reads F32 values rounded to bf16 (relative error <= 2^-8, half a unit in
 * the 8th bit); rank-1 F32 and integer tensors travel exactly; chunked decoding agrees; an F32
 * message is unchanged. */
TEST(bf16_wire) {
    enum { R = 300, C = 129 }; /* 38,700 floats: a 2-D tensor above the inline size */
    float *a = malloc(R * C * sizeof *a), v[7] = {1.0f, 1.00390625f, -3.14159f, 0, 1e-30f, 7, 8};
    int64_t ids[3] = {5, 6, 7};
    CHECK(a != NULL);
    for (int i = 0; i < R * C; i++)
        a[i] = (float)((i * 2654435761u) % 100003u) / 977.0f - 50.0f;
    ferry_rpc_msg m, got;
    ferry_rpc_msg_init(&m);
    ferry_rpc_msg_init(&got);
    ferry_rpc_tensor t2 = f32_tensor("hidden", R, C, a), t1 = f32_tensor("scale", 7, 0, v);
    ferry_rpc_tensor ti = {.dtype = FERRY_RPC_DTYPE_I64,
                           .ndim = 1,
                           .dim = {3},
                           .data = ids,
                           .nbytes = sizeof ids,
                           .name = "ids"};
    CHECK_OK(ferry_rpc_msg_add(&m, &t2));
    CHECK_OK(ferry_rpc_msg_add(&m, &t1));
    CHECK_OK(ferry_rpc_msg_add(&m, &ti));
    CHECK_STATUS(ferry_rpc_msg_set_wire_dtype(&m, FERRY_RPC_DTYPE_F64), FERRY_ERR_INVALID);
    size_t n32, n16;
    uint8_t *f32 = encode_flat(&m, 1024, &n32);
    CHECK_OK(ferry_rpc_msg_set_wire_dtype(&m, FERRY_RPC_DTYPE_BF16));
    uint8_t *f16 = encode_flat(&m, 1024, &n16);
    /* The 2-D payload is half; everything else is as it was, but for its dtype field
     * (2 bytes; F32 is protobuf's default, 0, and not written). */
    CHECK(n16 == n32 - R * C * 2 + 2);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 0)
            CHECK_OK(ferry__rpc_decode_flat(f16, n16, &ferry__v1__forward_request__descriptor,
                                            &limits, &got));
        else
            CHECK_OK(decode_chunked(f16, n16, 7, &got));
        CHECK(got.ntensors == 3);
        const ferry_rpc_tensor *g = &got.tensors[0];
        CHECK(g->dtype == FERRY_RPC_DTYPE_F32 && g->ndim == 2 && g->dim[0] == R && g->dim[1] == C &&
              g->nbytes == R * C * sizeof(float));
        const float *gf = g->data;
        for (int i = 0; i < R * C; i++) {
            CHECK(gf[i] == ferry_rpc_bf16_to_f32(ferry_rpc_f32_to_bf16(a[i])));
            CHECK(fabsf(gf[i] - a[i]) <= fabsf(a[i]) * 0x1p-8f);
        }
        CHECK(got.tensors[1].dtype == FERRY_RPC_DTYPE_F32 &&
              memcmp(got.tensors[1].data, v, sizeof v) == 0);
        CHECK(got.tensors[2].dtype == FERRY_RPC_DTYPE_I64 &&
              memcmp(got.tensors[2].data, ids, sizeof ids) == 0);
    }
    /* Widened on arrival, the message goes on as F32: re-encoded it is the F32 form. */
    ferry_rpc_msg_deinit(&got);
    CHECK_OK(
        ferry__rpc_decode_flat(f32, n32, &ferry__v1__forward_request__descriptor, &limits, &got));
    CHECK(memcmp(got.tensors[0].data, a, R * C * sizeof *a) == 0);
    free(f16);
    free(f32);
    ferry_rpc_msg_deinit(&got);
    ferry_rpc_msg_deinit(&m);
    free(a);
}

/* ferry_rpc_msg_land: the named F32 tensor of the landing's size is written to the
 * caller's buffer and borrowed from it; everything else is received as usual. */
TEST(landing) {
    enum { R = 300, C = 129 };
    float *a = malloc(R * C * sizeof *a), *dst = malloc(R * C * sizeof *dst);
    float v[7] = {1, 2, 3, 4, 5, 6, 7};
    CHECK(a != NULL && dst != NULL);
    for (int i = 0; i < R * C; i++)
        a[i] = (float)i * 0.5f - 3.0f;
    ferry_rpc_msg m, got;
    ferry_rpc_msg_init(&m);
    ferry_rpc_msg_init(&got);
    ferry_rpc_tensor t2 = f32_tensor("weight", R, C, a), t1 = f32_tensor("weight", 7, 0, v);
    CHECK_OK(ferry_rpc_msg_add(&m, &t1)); /* the same name, another size: not landed */
    CHECK_OK(ferry_rpc_msg_add(&m, &t2));
    CHECK_OK(ferry_rpc_msg_add(&m, &t2)); /* a second match: only the first lands */
    size_t n32, n16;
    uint8_t *f32 = encode_flat(&m, 1024, &n32);
    CHECK_OK(ferry_rpc_msg_set_wire_dtype(&m, FERRY_RPC_DTYPE_BF16));
    uint8_t *f16 = encode_flat(&m, 1024, &n16);
    ferry_rpc_msg_land(&got, "weight", dst, R * C * sizeof *dst);
    for (unsigned seed = 0; seed <= 5; seed++) {
        memset(dst, 0, R * C * sizeof *dst);
        if (seed == 0)
            CHECK_OK(ferry__rpc_decode_flat(f32, n32, &ferry__v1__forward_request__descriptor,
                                            &limits, &got));
        else
            CHECK_OK(decode_chunked(f32, n32, seed, &got)); /* decode deinits: kept */
        CHECK(got.ntensors == 3);
        CHECK(got.tensors[0].data != dst && memcmp(got.tensors[0].data, v, sizeof v) == 0);
        CHECK(got.tensors[1].data == dst && got.tensors[1].release == NULL);
        CHECK(memcmp(dst, a, R * C * sizeof *a) == 0);
        CHECK(got.tensors[2].data != dst && got.tensors[2].release != NULL);
        CHECK(memcmp(got.tensors[2].data, a, R * C * sizeof *a) == 0);
    }
    /* bf16 on the wire is widened into a buffer of its own; dst is not touched */
    memset(dst, 0, R * C * sizeof *dst);
    CHECK_OK(decode_chunked(f16, n16, 3, &got));
    CHECK(got.tensors[1].data != dst && dst[1] == 0.0f);
    /* another name, or no landing (init, or dst NULL), lands nothing */
    ferry_rpc_msg_land(&got, "grad", dst, R * C * sizeof *dst);
    CHECK_OK(decode_chunked(f32, n32, 4, &got));
    CHECK(got.tensors[1].data != dst && dst[1] == 0.0f);
    ferry_rpc_msg_land(&got, "weight", NULL, 0);
    CHECK(got.land == NULL);
    CHECK_OK(decode_chunked(f32, n32, 5, &got));
    CHECK(got.tensors[1].data != dst && dst[1] == 0.0f);
    /* a message cut short inside the landed payload fails and releases what it owns */
    ferry_rpc_msg_land(&got, "weight", dst, R * C * sizeof *dst);
    CHECK_STATUS(ferry__rpc_decode_flat(f32, n32 / 2, &ferry__v1__forward_request__descriptor,
                                        &limits, &got),
                 FERRY_ERR_FORMAT);
    CHECK(got.ntensors == 0 && got.land == dst);
    ferry_rpc_msg_init(&got);
    CHECK(got.land == NULL);
    free(f16);
    free(f32);
    ferry_rpc_msg_deinit(&got);
    ferry_rpc_msg_deinit(&m);
    free(a);
    free(dst);
}

/* clang-format off */
FERRY_TEST_MAIN(T(method_table) T(msg_rules) T(head_rules) T(buffers) T(roundtrip_chunked)
                T(protobuf_c_compat) T(forward_decoded) T(malformed_cases) T(limits)
                T(fuzz_truncate_corrupt) T(bf16_rounding) T(bf16_arrays) T(bf16_wire) T(landing))
/* clang-format on */
