/* fuzz_codec.c - libFuzzer target for the message codec (common/rpc/codec.c).
 * The first byte picks a method and a direction (request or reply type); the rest
 * is decoded twice, once as one buffer and once streamed in chunks whose sizes come
 * from the input, and the two results must agree. A message that decodes is then
 * encoded again and decoded a third time: header and tensors must survive the
 * round trip byte for byte. Any disagreement aborts (a finding). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/rpc/rpc.h"
#include "common/rpc/codec.h"

#define FUZZ_ASSERT(c)                                                                             \
    do {                                                                                           \
        if (!(c))                                                                                  \
            abort();                                                                               \
    } while (0)

typedef struct chunks {
    const uint8_t *p;
    size_t n, pos;
    const uint8_t *sizes; /* chunk sizes, cycled */
    size_t nsizes, k;
    int last_empty;
} chunks;

static int chunk_next(void *user, const uint8_t **p, size_t *n) {
    chunks *c = user;
    if (c->pos >= c->n)
        return 0;
    size_t want = c->nsizes ? (size_t)c->sizes[c->k++ % c->nsizes] : c->n;
    /* 0 is an empty chunk (gRPC may hand one over), but never two in a row: a real
     * source always makes progress. */
    if (want == 0 && c->last_empty)
        want = 1;
    c->last_empty = want == 0;
    if (want > c->n - c->pos)
        want = c->n - c->pos;
    *p = c->p + c->pos;
    *n = want;
    c->pos += want;
    return 1;
}

static void same(const ferry_rpc_msg *a, const ferry_rpc_msg *b) {
    FUZZ_ASSERT(a->ntensors == b->ntensors);
    for (int i = 0; i < a->ntensors; i++) {
        const ferry_rpc_tensor *x = &a->tensors[i], *y = &b->tensors[i];
        FUZZ_ASSERT(x->dtype == y->dtype && x->ndim == y->ndim && x->nbytes == y->nbytes);
        FUZZ_ASSERT(strcmp(x->name, y->name) == 0);
        FUZZ_ASSERT(memcmp(x->dim, y->dim, (size_t)x->ndim * sizeof x->dim[0]) == 0);
        FUZZ_ASSERT(x->nbytes == 0 || memcmp(x->data, y->data, x->nbytes) == 0);
    }
    const ProtobufCMessage *ha = a->head, *hb = b->head;
    size_t na = protobuf_c_message_get_packed_size(ha), nb = protobuf_c_message_get_packed_size(hb);
    FUZZ_ASSERT(na == nb);
    uint8_t *pa = malloc(na + 1), *pb = malloc(nb + 1);
    FUZZ_ASSERT(pa != NULL && pb != NULL);
    (void)protobuf_c_message_pack(ha, pa);
    (void)protobuf_c_message_pack(hb, pb);
    FUZZ_ASSERT(memcmp(pa, pb, na) == 0);
    free(pa);
    free(pb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2)
        return 0;
    ferry_rpc_method method = (ferry_rpc_method)(data[0] % FERRY_RPC_METHOD_COUNT);
    int reply_type = (data[0] / FERRY_RPC_METHOD_COUNT) & 1;
    size_t nsizes = data[1] % 8;
    data += 2;
    size -= 2;
    if (nsizes > size)
        nsizes = size;
    const uint8_t *sizes = data;
    const ferry__rpc_method_info *mi = ferry__rpc_method(method);
    const ProtobufCMessageDescriptor *desc = reply_type ? mi->reply : mi->request;
    ferry__rpc_limits lim = {.max_message_bytes = 1u << 20, .max_tensors = 64};

    ferry_rpc_msg flat, streamed;
    ferry_rpc_msg_init(&flat);
    ferry_rpc_msg_init(&streamed);
    ferry_status st1 = ferry__rpc_decode_flat(data, size, desc, &lim, &flat);
    chunks c = {.p = data, .n = size, .sizes = sizes, .nsizes = nsizes};
    ferry__rpc_source src = {.next = chunk_next, .user = &c, .total = size};
    ferry_status st2 = ferry__rpc_decode(&src, desc, &lim, &streamed);
    FUZZ_ASSERT(st1 == st2);
    if (st1 == FERRY_OK) {
        same(&flat, &streamed);
        /* Encode what was decoded (the header packed again) and decode it back. */
        ferry__rpc_wire w;
        ferry__rpc_wire_init(&w);
        FUZZ_ASSERT(ferry__rpc_encode(&flat, desc, 64, &w) == FERRY_OK);
        uint8_t *buf = malloc(w.total + 1);
        FUZZ_ASSERT(buf != NULL);
        ferry__rpc_wire_flatten(&w, &flat, buf);
        ferry_rpc_msg again;
        ferry_rpc_msg_init(&again);
        ferry__rpc_limits big = {.max_message_bytes = 2u << 20, .max_tensors = 64};
        FUZZ_ASSERT(ferry__rpc_decode_flat(buf, w.total, desc, &big, &again) == FERRY_OK);
        same(&flat, &again);
        ferry_rpc_msg_deinit(&again);
        free(buf);
        ferry__rpc_wire_deinit(&w);
    } else {
        FUZZ_ASSERT(flat.ntensors == 0 && flat.head == NULL);
    }
    ferry_rpc_msg_deinit(&flat);
    ferry_rpc_msg_deinit(&streamed);
    return 0;
}
