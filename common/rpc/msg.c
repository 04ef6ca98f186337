/* msg.c - ferry_rpc_msg: a protobuf-c header plus tensors, with the ownership
 * rules of rpc.h (borrowed or owned payloads), the method table, and the
 * aligned buffers received tensors live in. */
#include <malloc.h> /* mallopt (glibc) */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ferry.pb-c.h" /* ferry__*_descriptor */
#include "common/core/buf.h"
#include "common/core/log.h"
#include "common/rpc/codec.h"

/* ---- Methods -------------------------------------------------------------- */

/* Generated from FERRY_RPC_METHOD_MAP, so names, paths and protobuf-c types
 * cannot drift apart from the enum. */
#define FERRY_RPC_METHOD_INFO_(id, name, snake)                                                    \
    {#name, "/ferry.v1.Ferry/" #name, &ferry__v1__##snake##_request__descriptor,                          \
     &ferry__v1__##snake##_reply__descriptor},
static const ferry__rpc_method_info rpc_methods[] = {FERRY_RPC_METHOD_MAP(FERRY_RPC_METHOD_INFO_)};
#undef FERRY_RPC_METHOD_INFO_
_Static_assert(sizeof rpc_methods / sizeof rpc_methods[0] == FERRY_RPC_METHOD_COUNT,
               "one table entry per method");

const ferry__rpc_method_info *ferry__rpc_method(ferry_rpc_method m) {
    if ((int)m < 0 || m >= FERRY_RPC_METHOD_COUNT)
        return NULL;
    return &rpc_methods[m];
}

const char *ferry_rpc_method_name(ferry_rpc_method method) {
    const ferry__rpc_method_info *mi = ferry__rpc_method(method);
    return mi != NULL ? mi->name : "?";
}

/* ---- Tensors and buffers ----------------------------------------------------- */

size_t ferry_rpc_dtype_size(int dtype) {
    switch (dtype) {
    case FERRY_RPC_DTYPE_F32:
    case FERRY_RPC_DTYPE_I32:
        return 4;
    case FERRY_RPC_DTYPE_I64:
    case FERRY_RPC_DTYPE_F64:
        return 8;
    case FERRY_RPC_DTYPE_BF16:
        return 2;
    default:
        return 0;
    }
}

ferry_status ferry_rpc_tensor_nbytes(int dtype, int ndim, const int64_t *dim, size_t *out) {
    size_t n = ferry_rpc_dtype_size(dtype);
    if (n == 0)
        return ferry_errorf(FERRY_ERR_INVALID, "unknown tensor dtype %d", dtype);
    if (ndim < 0 || ndim > FERRY_RPC_MAX_DIMS)
        return ferry_errorf(FERRY_ERR_INVALID, "tensor rank %d outside 0..%d", ndim,
                            FERRY_RPC_MAX_DIMS);
    for (int i = 0; i < ndim; i++) {
        if (dim[i] < 0)
            return ferry_errorf(FERRY_ERR_INVALID, "negative tensor dimension %lld",
                                (long long)dim[i]);
    }
    /* Overflow is only an error if no dimension is zero: check them all first. */
    for (int i = 0; i < ndim; i++) {
        if (dim[i] == 0) {
            *out = 0;
            return FERRY_OK;
        }
    }
    for (int i = 0; i < ndim; i++) {
        if ((uint64_t)dim[i] > SIZE_MAX / n)
            return ferry_errorf(FERRY_ERR_RANGE, "tensor size overflows");
        n *= (size_t)dim[i];
    }
    *out = n;
    return FERRY_OK;
}

void ferry_rpc_release_idle_memory(void) {
    ferry_buf_release_idle();
#if defined(__GLIBC__)
    (void)malloc_trim(0);
#endif
}

ferry_status ferry_rpc_tune_malloc(size_t keep_bytes) {
#if defined(__GLIBC__)
    if (keep_bytes == 0)
        keep_bytes = (size_t)1 << 30;
    if (keep_bytes > INT32_MAX)
        keep_bytes = INT32_MAX;
    /* gRPC reads a large message into freshly allocated slices; with glibc's
     * default trim threshold the freed heap top goes back to the kernel after
     * every message and is page-faulted in again for the next one. */
    if (mallopt(M_TRIM_THRESHOLD, (int)keep_bytes) != 1)
        return ferry_errorf(FERRY_ERR_UNSUPPORTED, "mallopt(M_TRIM_THRESHOLD) failed");
    /* Setting a threshold turns off glibc's dynamic mmap threshold, which would
     * otherwise have risen to the size of the buffers a step frees: every block over
     * the default 128 KiB (a decoder's logits, a message) would then be a fresh mmap,
     * page-faulted in on every call and unmapped after it. Blocks up to glibc's
     * largest threshold (32 MiB on 64-bit) come from the kept heap instead. */
    if (mallopt(M_MMAP_THRESHOLD, 32 << 20) != 1)
        return ferry_errorf(FERRY_ERR_UNSUPPORTED, "mallopt(M_MMAP_THRESHOLD) failed");
    return FERRY_OK;
#else
    (void)keep_bytes;
    return ferry_errorf(FERRY_ERR_UNSUPPORTED, "not glibc: malloc tuning unavailable");
#endif
}

ferry_status ferry__rpc_tensor_check(const ferry_rpc_tensor *t) {
    size_t want;
    ferry_status st = ferry_rpc_tensor_nbytes(t->dtype, t->ndim, t->dim, &want);
    if (st != FERRY_OK)
        return st;
    if (want != t->nbytes)
        return ferry_errorf(FERRY_ERR_SHAPE, "tensor '%s' has %zu bytes, its shape needs %zu",
                            t->name, t->nbytes, want);
    if (t->nbytes > 0 && t->data == NULL)
        return ferry_errorf(FERRY_ERR_INVALID, "tensor '%s' has no data", t->name);
    if (memchr(t->name, '\0', sizeof t->name) == NULL)
        return ferry_errorf(FERRY_ERR_INVALID, "tensor name is not NUL-terminated within %d bytes",
                            FERRY_RPC_NAME_MAX);
    return FERRY_OK;
}

/* ---- Messages ------------------------------------------------------------------ */

void ferry_rpc_msg_init(ferry_rpc_msg *m) {
    memset(m, 0, sizeof *m);
}

ferry_status ferry_rpc_msg_set_wire_dtype(ferry_rpc_msg *m, int dtype) {
    if (dtype != FERRY_RPC_DTYPE_F32 && dtype != FERRY_RPC_DTYPE_BF16)
        return ferry_errorf(FERRY_ERR_INVALID, "a message's wire dtype is f32 or bf16, not %d",
                            dtype);
    m->wire_dtype = dtype;
    return FERRY_OK;
}

static void msg_clear_head(ferry_rpc_msg *m) {
    if (m->head != NULL) {
        /* protobuf-c frees through the non-const pointer it allocated. */
        ProtobufCMessage *h = (ProtobufCMessage *)(uintptr_t)m->head;
        protobuf_c_message_free_unpacked(h, NULL);
    }
    free(m->head_bytes);
    m->head = NULL;
    m->head_bytes = NULL;
    m->head_len = 0;
    m->head_desc = NULL;
}

void ferry_rpc_msg_deinit(ferry_rpc_msg *m) {
    if (m == NULL)
        return;
    for (int i = 0; i < m->ntensors; i++) {
        ferry_rpc_tensor *t = &m->tensors[i];
        if (t->release != NULL)
            t->release(t->release_user);
    }
    free(m->tensors);
    msg_clear_head(m);
    const char *land_name = m->land_name;
    void *land = m->land;
    size_t land_bytes = m->land_bytes;
    ferry_rpc_msg_init(m);
    ferry_rpc_msg_land(m, land_name, land, land_bytes);
}

void ferry_rpc_msg_land(ferry_rpc_msg *m, const char *name, void *dst, size_t nbytes) {
    int on = name != NULL && dst != NULL && nbytes > 0;
    m->land_name = on ? name : NULL;
    m->land = on ? dst : NULL;
    m->land_bytes = on ? nbytes : 0;
}

void ferry__rpc_msg_disown(ferry_rpc_msg *m) {
    m->ntensors = 0;
}

ferry_status ferry__rpc_msg_reserve(ferry_rpc_msg *m, int max_tensors) {
    if (m->ntensors >= max_tensors)
        return ferry_errorf(FERRY_ERR_RANGE, "more than %d tensors in one message", max_tensors);
    if (m->ntensors < m->cap)
        return FERRY_OK;
    int cap = m->cap > 0 ? 2 * m->cap : 4;
    if (cap > max_tensors)
        cap = max_tensors;
    ferry_rpc_tensor *t = realloc(m->tensors, (size_t)cap * sizeof *t);
    if (t == NULL)
        return ferry_errorf(FERRY_ERR_NOMEM, "no memory for %d tensor descriptors", cap);
    m->tensors = t;
    m->cap = cap;
    return FERRY_OK;
}

/* The quantifier (n_tensors) of field 15 in a protobuf-c message, found through
 * its descriptor so that one function serves every message type. */
static size_t head_tensor_count(const ProtobufCMessage *head) {
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field(head->descriptor, FERRY_RPC_TENSORS_FIELD);
    if (f == NULL || f->label != PROTOBUF_C_LABEL_REPEATED)
        return 0;
    size_t n;
    memcpy(&n, (const char *)head + f->quantifier_offset, sizeof n);
    return n;
}

ferry_status ferry_rpc_msg_set_head(ferry_rpc_msg *m, const struct ProtobufCMessage *head) {
    if (head == NULL) {
        msg_clear_head(m);
        return FERRY_OK;
    }
    if (head_tensor_count(head) != 0)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "%s header carries tensors; add them with ferry_rpc_msg_add",
                            head->descriptor->name);
    size_t n = protobuf_c_message_get_packed_size(head);
    uint8_t *bytes = malloc(n > 0 ? n : 1);
    if (bytes == NULL)
        return ferry_errorf(FERRY_ERR_NOMEM, "no memory for a %zu-byte header", n);
    size_t packed = protobuf_c_message_pack(head, bytes);
    FERRY_ASSERT(packed == n);
    msg_clear_head(m);
    m->head_bytes = bytes;
    m->head_len = n;
    m->head_desc = head->descriptor;
    return FERRY_OK;
}

/* Refuses a tensor that would take the message past its byte budget, before any
 * memory is allocated for it. */
static ferry_status msg_budget(const ferry_rpc_msg *m, const char *name, size_t nbytes) {
    if (m->max_bytes == 0)
        return FERRY_OK;
    size_t payload = 0; /* a reply holds a handful of tensors */
    for (int i = 0; i < m->ntensors; i++)
        payload += m->tensors[i].nbytes;
    if (nbytes <= m->max_bytes && payload <= m->max_bytes - nbytes)
        return FERRY_OK;
    return ferry_errorf(FERRY_ERR_RESOURCE,
                        "tensor '%s' of %zu bytes does not fit the %zu-byte message limit (%zu "
                        "bytes already in the message; --max-message-mb)",
                        name, nbytes, m->max_bytes, payload);
}

ferry_status ferry_rpc_msg_add(ferry_rpc_msg *m, const ferry_rpc_tensor *t) {
    ferry_status st = ferry__rpc_tensor_check(t);
    if (st != FERRY_OK)
        return st;
    if ((st = msg_budget(m, t->name, t->nbytes)) != FERRY_OK)
        return st;
    if ((st = ferry__rpc_msg_reserve(m, FERRY_RPC_MAX_TENSORS)) != FERRY_OK)
        return st;
    m->tensors[m->ntensors++] = *t;
    return FERRY_OK;
}

ferry_status ferry_rpc_msg_alloc(ferry_rpc_msg *m, int dtype, int ndim, const int64_t *dim,
                                 const char *name, void **data) {
    ferry_rpc_tensor t = {.dtype = dtype, .ndim = ndim};
    if (ndim < 0 || ndim > FERRY_RPC_MAX_DIMS)
        return ferry_errorf(FERRY_ERR_INVALID, "tensor rank %d outside 0..%d", ndim,
                            FERRY_RPC_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        t.dim[i] = dim[i];
    if (name != NULL) {
        if (strlen(name) >= sizeof t.name)
            return ferry_errorf(FERRY_ERR_INVALID, "tensor name '%.16s...' is %zu bytes, max %d",
                                name, strlen(name), FERRY_RPC_NAME_MAX - 1);
        memcpy(t.name, name, strlen(name) + 1);
    }
    ferry_status st = ferry_rpc_tensor_nbytes(dtype, ndim, t.dim, &t.nbytes);
    if (st != FERRY_OK)
        return st;
    if ((st = msg_budget(m, t.name, t.nbytes)) != FERRY_OK ||
        (st = ferry__rpc_msg_reserve(m, FERRY_RPC_MAX_TENSORS)) != FERRY_OK)
        return st;
    if (t.nbytes > 0) {
        if ((t.data = ferry_buf_alloc(t.nbytes)) == NULL)
            return ferry_errorf(FERRY_ERR_NOMEM, "no memory for a %zu-byte tensor", t.nbytes);
        t.release = ferry_buf_free;
        t.release_user = t.data;
    }
    m->tensors[m->ntensors++] = t;
    *data = t.data;
    return FERRY_OK;
}

ferry_status ferry_rpc_msg_add_copy(ferry_rpc_msg *m, const ferry_rpc_tensor *t) {
    ferry_status st = ferry__rpc_tensor_check(t);
    if (st != FERRY_OK)
        return st;
    void *data;
    if ((st = ferry_rpc_msg_alloc(m, t->dtype, t->ndim, t->dim, t->name, &data)) != FERRY_OK)
        return st;
    if (t->nbytes > 0)
        memcpy(data, t->data, t->nbytes);
    return FERRY_OK;
}

ferry_status ferry_rpc_msg_clone(ferry_rpc_msg *dst, const ferry_rpc_msg *src) {
    ferry_rpc_msg_init(dst);
    if (src->head != NULL)
        return ferry_errorf(FERRY_ERR_INVALID, "ferry_rpc_msg_clone: a received message");
    if (src->head_bytes != NULL) {
        if ((dst->head_bytes = malloc(src->head_len > 0 ? src->head_len : 1)) == NULL)
            return FERRY_NOMEM();
        memcpy(dst->head_bytes, src->head_bytes, src->head_len);
        dst->head_len = src->head_len;
        dst->head_desc = src->head_desc;
    }
    dst->wire_dtype = src->wire_dtype;
    ferry_status st = FERRY_OK;
    for (int i = 0; i < src->ntensors && st == FERRY_OK; i++)
        st = ferry_rpc_msg_add_copy(dst, &src->tensors[i]);
    if (st != FERRY_OK)
        ferry_rpc_msg_deinit(dst);
    return st;
}

ferry_status ferry_rpc_msg_take(ferry_rpc_msg *m, int i, ferry_rpc_tensor *out) {
    if (i < 0 || i >= m->ntensors)
        return ferry_errorf(FERRY_ERR_INVALID, "tensor index %d outside 0..%d", i, m->ntensors - 1);
    *out = m->tensors[i];
    m->tensors[i].release = NULL;
    m->tensors[i].release_user = NULL;
    return FERRY_OK;
}

const ferry_rpc_tensor *ferry_rpc_msg_find(const ferry_rpc_msg *m, const char *name) {
    for (int i = 0; i < m->ntensors; i++) {
        if (strcmp(m->tensors[i].name, name) == 0)
            return &m->tensors[i];
    }
    return NULL;
}
