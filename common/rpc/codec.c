/* codec.c - ferry messages as protobuf bytes, with tensors framed so that no
 * payload is copied on the way out and each is copied once on the way in.
 * Outgoing: protobuf-c packs the header; each tensor follows as field 15, its
 * small header written by hand and its payload referenced in place. Incoming:
 * a streaming scanner walks the chunks, copies payloads straight into aligned
 * buffers and hands only the remaining header bytes to protobuf-c. */
#include <stdlib.h>
#include <string.h>

#include "common/core/log.h"
#include "common/rpc/codec.h"

#define WIRE_LEN       2 /* protobuf wire type of length-delimited fields */
#define KEY(field, wt) ((uint8_t)(((field) << 3) | (wt)))

/* ---- Varints --------------------------------------------------------------- */

static size_t varint_size(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static size_t put_varint(uint8_t *p, uint64_t v) {
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

/* ---- Encoding -------------------------------------------------------------- */

void ferry__rpc_wire_init(ferry__rpc_wire *w) {
    memset(w, 0, sizeof *w);
}

void ferry__rpc_wire_deinit(ferry__rpc_wire *w) {
    if (w == NULL)
        return;
    free(w->buf);
    free(w->segs);
    ferry__rpc_wire_init(w);
}

static ferry_status wire_reserve(ferry__rpc_wire *w, size_t extra) {
    if (w->cap - w->len >= extra)
        return FERRY_OK;
    size_t cap = w->cap > 0 ? w->cap : 256;
    while (cap - w->len < extra) {
        if (cap > SIZE_MAX / 2)
            return ferry_errorf(FERRY_ERR_NOMEM, "encoded message too large");
        cap *= 2;
    }
    uint8_t *buf = realloc(w->buf, cap);
    if (buf == NULL)
        return ferry_errorf(FERRY_ERR_NOMEM, "no memory for a %zu-byte message header", cap);
    w->buf = buf;
    w->cap = cap;
    return FERRY_OK;
}

static ferry_status wire_seg(ferry__rpc_wire *w, size_t off, size_t len, int tensor) {
    if (w->nseg == w->segcap) {
        int cap = w->segcap > 0 ? 2 * w->segcap : 8;
        ferry__rpc_seg *s = realloc(w->segs, (size_t)cap * sizeof *s);
        if (s == NULL)
            return ferry_errorf(FERRY_ERR_NOMEM, "no memory for %d message segments", cap);
        w->segs = s;
        w->segcap = cap;
    }
    w->segs[w->nseg++] = (ferry__rpc_seg){.off = off, .len = len, .tensor = tensor};
    return FERRY_OK;
}

/* Size of a Tensor submessage up to its payload: dtype, shape, name and the
 * data field's key and length. *shape_len receives the packed shape's size. */
static size_t tensor_head_size(const ferry_rpc_tensor *t, size_t *shape_len) {
    size_t n = 0, sl = 0;
    if (t->dtype != 0)
        n += 1 + varint_size((uint64_t)t->dtype);
    for (int i = 0; i < t->ndim; i++)
        sl += varint_size((uint64_t)t->dim[i]);
    if (t->ndim > 0)
        n += 1 + varint_size(sl) + sl;
    size_t name_len = strlen(t->name);
    if (name_len > 0)
        n += 1 + varint_size(name_len) + name_len;
    if (t->nbytes > 0)
        n += 1 + varint_size(t->nbytes);
    *shape_len = sl;
    return n;
}

static size_t put_tensor_head(uint8_t *p, const ferry_rpc_tensor *t, size_t shape_len) {
    size_t n = 0;
    if (t->dtype != 0) {
        p[n++] = KEY(1, 0);
        n += put_varint(p + n, (uint64_t)t->dtype);
    }
    if (t->ndim > 0) {
        p[n++] = KEY(2, WIRE_LEN);
        n += put_varint(p + n, shape_len);
        for (int i = 0; i < t->ndim; i++)
            n += put_varint(p + n, (uint64_t)t->dim[i]);
    }
    size_t name_len = strlen(t->name);
    if (name_len > 0) {
        p[n++] = KEY(3, WIRE_LEN);
        n += put_varint(p + n, name_len);
        memcpy(p + n, t->name, name_len);
        n += name_len;
    }
    if (t->nbytes > 0) {
        p[n++] = KEY(FERRY_RPC_DATA_FIELD, WIRE_LEN);
        n += put_varint(p + n, t->nbytes);
    }
    return n;
}

/* Appends the protobuf-c header of m (packed earlier, or a decoded message
 * being forwarded) to the wire buffer. */
static ferry_status encode_head(const ferry_rpc_msg *m, const ProtobufCMessageDescriptor *desc,
                                ferry__rpc_wire *w) {
    if (m->head_desc != NULL && m->head_desc != desc) {
        const ProtobufCMessageDescriptor *have = m->head_desc;
        return ferry_errorf(FERRY_ERR_INVALID, "message header is %s, the method sends %s",
                            have->name, desc->name);
    }
    const ProtobufCMessage *head = m->head;
    size_t n = m->head_bytes != NULL ? m->head_len
               : head != NULL        ? protobuf_c_message_get_packed_size(head)
                                     : 0;
    ferry_status st = wire_reserve(w, n);
    if (st != FERRY_OK)
        return st;
    if (n > 0 && m->head_bytes != NULL) {
        memcpy(w->buf, m->head_bytes, n);
    } else if (n > 0) {
        size_t packed = protobuf_c_message_pack(head, w->buf);
        FERRY_ASSERT(packed == n);
    }
    w->len = n;
    return FERRY_OK;
}

/* Whether m sends tensor t narrowed to BF16. */
static int narrowed(const ferry_rpc_msg *m, const ferry_rpc_tensor *t) {
    return m->wire_dtype == FERRY_RPC_DTYPE_BF16 && t->dtype == FERRY_RPC_DTYPE_F32 && t->ndim >= 2;
}

ferry_status ferry__rpc_encode(const ferry_rpc_msg *m, const ProtobufCMessageDescriptor *desc,
                               size_t inline_max, ferry__rpc_wire *w) {
    w->len = 0;
    w->nseg = 0;
    w->total = 0;
    ferry_status st = encode_head(m, desc, w);
    if (st != FERRY_OK)
        return st;
    size_t run = 0;    /* start of the header run not yet emitted as a segment */
    size_t by_ref = 0; /* payload bytes sent in place */
    for (int i = 0; i < m->ntensors; i++) {
        const ferry_rpc_tensor *t = &m->tensors[i];
        if ((st = ferry__rpc_tensor_check(t)) != FERRY_OK)
            return st;
        /* A narrowed tensor is written converted, next to the header. */
        ferry_rpc_tensor bf;
        const float *src = NULL;
        if (narrowed(m, t)) {
            bf = *t;
            bf.dtype = FERRY_RPC_DTYPE_BF16;
            bf.nbytes = t->nbytes / 2;
            src = t->data;
            t = &bf;
        }
        size_t shape_len, th = tensor_head_size(t, &shape_len);
        size_t sub = th + t->nbytes;
        int inline_data = t->nbytes <= inline_max || src != NULL;
        if ((st = wire_reserve(w, 1 + varint_size(sub) + th + (inline_data ? t->nbytes : 0))) !=
            FERRY_OK)
            return st;
        w->buf[w->len++] = KEY(FERRY_RPC_TENSORS_FIELD, WIRE_LEN);
        w->len += put_varint(w->buf + w->len, sub);
        w->len += put_tensor_head(w->buf + w->len, t, shape_len);
        if (t->nbytes == 0)
            continue;
        if (src != NULL) {
            ferry_rpc_bf16_narrow(w->buf + w->len, src, t->nbytes / 2);
            w->len += t->nbytes;
            continue;
        }
        if (inline_data) {
            memcpy(w->buf + w->len, t->data, t->nbytes);
            w->len += t->nbytes;
            continue;
        }
        if ((st = wire_seg(w, run, w->len - run, -1)) != FERRY_OK ||
            (st = wire_seg(w, 0, t->nbytes, i)) != FERRY_OK)
            return st;
        run = w->len;
        by_ref += t->nbytes;
    }
    if (w->len > run && (st = wire_seg(w, run, w->len - run, -1)) != FERRY_OK)
        return st;
    w->total = w->len + by_ref;
    return FERRY_OK;
}

void ferry__rpc_wire_flatten(const ferry__rpc_wire *w, const ferry_rpc_msg *m, uint8_t *dst) {
    for (int i = 0; i < w->nseg; i++) {
        const ferry__rpc_seg *s = &w->segs[i];
        if (s->len == 0)
            continue;
        memcpy(dst, s->tensor < 0 ? w->buf + s->off : m->tensors[s->tensor].data, s->len);
        dst += s->len;
    }
}

/* ---- Decoding: a cursor over the chunks ---------------------------------------- */

typedef struct cursor {
    const ferry__rpc_source *src;
    const uint8_t *p; /* unread bytes of the current chunk */
    size_t n;
    size_t pos; /* bytes consumed from the start of the message */
} cursor;

static ferry_status bad(const cursor *c, const char *what) {
    return ferry_errorf(FERRY_ERR_FORMAT, "%s at byte %zu", what, c->pos);
}

static int cur_fill(cursor *c) {
    while (c->n == 0) {
        if (!c->src->next(c->src->user, &c->p, &c->n))
            return 0;
    }
    return 1;
}

/* Reads a varint that must end before `end`; its raw bytes go to raw[] (room
 * for 10) when raw is not NULL, their count to *rawn. */
static ferry_status cur_varint(cursor *c, size_t end, uint64_t *v, uint8_t *raw, size_t *rawn) {
    uint64_t r = 0;
    for (int i = 0; i < 10; i++) {
        if (c->pos >= end || !cur_fill(c))
            return bad(c, "truncated varint");
        uint8_t b = *c->p++;
        c->n--;
        c->pos++;
        if (raw != NULL)
            raw[i] = b;
        if (i == 9 && b > 1)
            return bad(c, "varint overflows 64 bits");
        r |= (uint64_t)(b & 0x7f) << (7 * i);
        if ((b & 0x80) == 0) {
            *v = r;
            if (rawn != NULL)
                *rawn = (size_t)i + 1;
            return FERRY_OK;
        }
    }
    return bad(c, "varint longer than 10 bytes");
}

/* Copies n bytes that must end before `end` into dst, or skips them (dst NULL). */
static ferry_status cur_copy(cursor *c, size_t end, uint8_t *dst, size_t n) {
    if (n > end - c->pos)
        return bad(c, "length runs past the end of its message");
    while (n > 0) {
        if (!cur_fill(c))
            return bad(c, "message shorter than announced");
        size_t k = n < c->n ? n : c->n;
        if (dst != NULL) {
            memcpy(dst, c->p, k);
            dst += k;
        }
        c->p += k;
        c->n -= k;
        c->pos += k;
        n -= k;
    }
    return FERRY_OK;
}

/* Reads a length prefix and checks that the field fits before `end`. */
static ferry_status cur_len(cursor *c, size_t end, uint64_t *len, uint8_t *raw, size_t *rawn) {
    ferry_status st = cur_varint(c, end, len, raw, rawn);
    if (st == FERRY_OK && *len > end - c->pos)
        return bad(c, "length runs past the end of its message");
    return st;
}

static ferry_status cur_skip(cursor *c, size_t end, unsigned wt) {
    uint64_t v;
    switch (wt) {
    case 0:
        return cur_varint(c, end, &v, NULL, NULL);
    case 1:
        return cur_copy(c, end, NULL, 8);
    case 5:
        return cur_copy(c, end, NULL, 4);
    case WIRE_LEN: {
        ferry_status st = cur_len(c, end, &v, NULL, NULL);
        return st != FERRY_OK ? st : cur_copy(c, end, NULL, (size_t)v);
    }
    default:
        return bad(c, "unsupported wire type");
    }
}

/* ---- Decoding: one Tensor submessage ----------------------------------------------- */

static ferry_status tensor_dim(cursor *c, const ferry__rpc_limits *lim, ferry_rpc_tensor *t,
                               uint64_t v) {
    if (t->ndim == FERRY_RPC_MAX_DIMS)
        return bad(c, "tensor rank above 4");
    if (v > lim->max_message_bytes)
        return bad(c, "tensor dimension larger than the message limit");
    t->dim[t->ndim++] = (int64_t)v;
    return FERRY_OK;
}

/* Where one received tensor may land instead of a buffer of its own (ferry_rpc_msg_land);
 * dst becomes NULL once a tensor took it. */
typedef struct landing {
    const char *name;
    void *dst;
    size_t nbytes;
} landing;

static ferry_status tensor_field(cursor *c, size_t end, const ferry__rpc_limits *lim,
                                 ferry_rpc_tensor *t, uint64_t *dtype, landing *land) {
    uint64_t key, v;
    ferry_status st = cur_varint(c, end, &key, NULL, NULL);
    if (st != FERRY_OK)
        return st;
    uint64_t field = key >> 3;
    unsigned wt = (unsigned)(key & 7);
    if (field == 0)
        return bad(c, "field number 0");
    if (field > 3 && field != FERRY_RPC_DATA_FIELD)
        return cur_skip(c, end, wt); /* a newer sender's field */
    if (field == 1 && wt == 0)
        return cur_varint(c, end, dtype, NULL, NULL);
    if (field == 2 && wt == 0) {
        if ((st = cur_varint(c, end, &v, NULL, NULL)) != FERRY_OK)
            return st;
        return tensor_dim(c, lim, t, v);
    }
    if (wt != WIRE_LEN)
        return bad(c, "tensor field with the wrong wire type");
    if ((st = cur_len(c, end, &v, NULL, NULL)) != FERRY_OK)
        return st;
    if (field == 2) { /* packed shape */
        size_t pend = c->pos + (size_t)v;
        while (st == FERRY_OK && c->pos < pend) {
            uint64_t d;
            if ((st = cur_varint(c, pend, &d, NULL, NULL)) == FERRY_OK)
                st = tensor_dim(c, lim, t, d);
        }
        return st;
    }
    if (field == 3) {
        if (v >= sizeof t->name)
            return bad(c, "tensor name longer than 63 bytes");
        memset(t->name, 0, sizeof t->name);
        if ((st = cur_copy(c, end, (uint8_t *)t->name, (size_t)v)) != FERRY_OK)
            return st;
        if (strlen(t->name) != v)
            return bad(c, "tensor name contains a NUL byte");
        return FERRY_OK;
    }
    if (t->data != NULL || t->nbytes != 0)
        return bad(c, "tensor with two data fields");
    if (v == 0)
        return FERRY_OK;
    if (land->dst != NULL && *dtype == FERRY_RPC_DTYPE_F32 && v == land->nbytes &&
        strcmp(t->name, land->name) == 0) {
        t->data = land->dst; /* borrowed: written once, here, and never past nbytes */
        t->nbytes = (size_t)v;
        land->dst = NULL;
        return cur_copy(c, end, t->data, (size_t)v);
    }
    /* v is bounded by the bytes that arrived (checked by cur_len), so this
     * allocation never exceeds the message itself. */
    if ((t->data = ferry_buf_alloc((size_t)v)) == NULL)
        return ferry_errorf(FERRY_ERR_NOMEM, "no memory for a %llu-byte tensor",
                            (unsigned long long)v);
    t->nbytes = (size_t)v;
    t->release = ferry_buf_free;
    t->release_user = t->data;
    return cur_copy(c, end, t->data, (size_t)v); /* the one copy */
}

/* A received BF16 tensor as the F32 tensor it stands for (exact: bf16 is a float's
 * top half), in a new aligned buffer that replaces the received one. */
static ferry_status widen_bf16(ferry_rpc_tensor *t) {
    size_t n = t->nbytes / 2;
    float *f = n > 0 ? ferry_buf_alloc(n * sizeof *f) : NULL;
    if (n > 0 && f == NULL)
        return ferry_errorf(FERRY_ERR_NOMEM, "no memory to widen a %zu-element bf16 tensor", n);
    ferry_rpc_bf16_widen(f, t->data, n);
    if (t->release != NULL)
        t->release(t->release_user);
    t->data = f;
    t->nbytes = n * sizeof *f;
    t->dtype = FERRY_RPC_DTYPE_F32;
    t->release = n > 0 ? ferry_buf_free : NULL;
    t->release_user = f;
    return FERRY_OK;
}

static ferry_status decode_tensor(cursor *c, size_t end, const ferry__rpc_limits *lim,
                                  ferry_rpc_tensor *t, landing *land) {
    memset(t, 0, sizeof *t);
    size_t start = c->pos;
    uint64_t dtype = 0;
    ferry_status st = FERRY_OK;
    while (st == FERRY_OK && c->pos < end)
        st = tensor_field(c, end, lim, t, &dtype, land);
    if (st == FERRY_OK && (dtype > FERRY_RPC_DTYPE_BF16))
        st = ferry_errorf(FERRY_ERR_FORMAT, "tensor at byte %zu has unknown dtype %llu", start,
                          (unsigned long long)dtype);
    if (st == FERRY_OK) {
        size_t want;
        t->dtype = (int)dtype;
        st = ferry_rpc_tensor_nbytes(t->dtype, t->ndim, t->dim, &want);
        if (st == FERRY_OK && want != t->nbytes)
            st = ferry_errorf(FERRY_ERR_FORMAT,
                              "tensor '%s' at byte %zu has %zu payload bytes, its shape needs %zu",
                              t->name, start, t->nbytes, want);
        else if (st != FERRY_OK)
            st = ferry_errorf(FERRY_ERR_FORMAT, "tensor at byte %zu: bad shape", start);
    }
    if (st == FERRY_OK && t->dtype == FERRY_RPC_DTYPE_BF16)
        st = widen_bf16(t);
    if (st != FERRY_OK && t->release != NULL) {
        t->release(t->release_user);
        t->release = NULL;
    }
    return st;
}

/* ---- Decoding: the message ------------------------------------------------------- */

typedef struct hbuf {
    uint8_t *p;
    size_t len, cap;
} hbuf;

/* Room for n more header bytes; the header is part of the message, so its size
 * is bounded by the message length checked on entry. */
static ferry_status hbuf_reserve(hbuf *h, size_t n) {
    if (h->cap - h->len >= n)
        return FERRY_OK;
    size_t cap = h->cap > 0 ? h->cap : 128;
    while (cap - h->len < n)
        cap *= 2;
    uint8_t *p = realloc(h->p, cap);
    if (p == NULL)
        return ferry_errorf(FERRY_ERR_NOMEM, "no memory for %zu header bytes", cap);
    h->p = p;
    h->cap = cap;
    return FERRY_OK;
}

static ferry_status hbuf_put(hbuf *h, const uint8_t *src, size_t n) {
    ferry_status st = hbuf_reserve(h, n);
    if (st == FERRY_OK) {
        memcpy(h->p + h->len, src, n);
        h->len += n;
    }
    return st;
}

/* Copies one non-tensor field, key included, into the header buffer. */
static ferry_status header_field(cursor *c, size_t end, unsigned wt, hbuf *h) {
    uint8_t raw[10];
    size_t rawn;
    uint64_t v;
    ferry_status st;
    switch (wt) {
    case 0:
        if ((st = cur_varint(c, end, &v, raw, &rawn)) != FERRY_OK)
            return st;
        return hbuf_put(h, raw, rawn);
    case 1:
    case 5:
    case WIRE_LEN:
        if (wt == WIRE_LEN) {
            if ((st = cur_len(c, end, &v, raw, &rawn)) != FERRY_OK ||
                (st = hbuf_put(h, raw, rawn)) != FERRY_OK)
                return st;
        } else {
            v = wt == 1 ? 8 : 4;
        }
        if ((st = hbuf_reserve(h, (size_t)v)) != FERRY_OK ||
            (st = cur_copy(c, end, h->p + h->len, (size_t)v)) != FERRY_OK)
            return st;
        h->len += (size_t)v;
        return FERRY_OK;
    default:
        return bad(c, "unsupported wire type");
    }
}

static ferry_status decode_field(cursor *c, size_t total, const ferry__rpc_limits *lim,
                                 ferry_rpc_msg *out, hbuf *h, landing *land) {
    uint8_t raw[10];
    size_t rawn;
    uint64_t key, len;
    ferry_status st = cur_varint(c, total, &key, raw, &rawn);
    if (st != FERRY_OK)
        return st;
    if ((key >> 3) == 0)
        return bad(c, "field number 0");
    if ((key >> 3) != FERRY_RPC_TENSORS_FIELD) {
        if ((st = hbuf_put(h, raw, rawn)) != FERRY_OK)
            return st;
        return header_field(c, total, (unsigned)(key & 7), h);
    }
    if ((key & 7) != WIRE_LEN)
        return bad(c, "tensors field with the wrong wire type");
    if ((st = cur_len(c, total, &len, NULL, NULL)) != FERRY_OK ||
        (st = ferry__rpc_msg_reserve(out, lim->max_tensors)) != FERRY_OK)
        return st;
    ferry_rpc_tensor *t = &out->tensors[out->ntensors];
    if ((st = decode_tensor(c, c->pos + (size_t)len, lim, t, land)) != FERRY_OK)
        return st;
    out->ntensors++;
    return FERRY_OK;
}

/* protobuf-c takes a tag of field number 0 when its varint is overlong (81 00), keeps it
 * as an unknown field and packs it back in one byte, which it then refuses to unpack:
 * a header with such a field, at any depth, is refused here, so that every header that
 * decodes encodes to one that decodes (fuzz_codec found it). */
static int has_field_zero(const ProtobufCMessage *m, int depth) {
    if (depth > 100)
        return 1;
    for (unsigned i = 0; i < m->n_unknown_fields; i++)
        if (m->unknown_fields[i].tag == 0)
            return 1;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    for (unsigned f = 0; f < d->n_fields; f++) {
        const ProtobufCFieldDescriptor *fd = &d->fields[f];
        if (fd->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n;
            ProtobufCMessage **v;
            memcpy(&n, base + fd->quantifier_offset, sizeof n);
            memcpy(&v, base + fd->offset, sizeof v);
            for (size_t k = 0; k < n; k++)
                if (v[k] != NULL && has_field_zero(v[k], depth + 1))
                    return 1;
            continue;
        }
        if (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            uint32_t which;
            memcpy(&which, base + fd->quantifier_offset, sizeof which);
            if (which != fd->id)
                continue; /* another member of the oneof holds the storage */
        }
        ProtobufCMessage *sub;
        memcpy(&sub, base + fd->offset, sizeof sub);
        if (sub != NULL && has_field_zero(sub, depth + 1))
            return 1;
    }
    return 0;
}

ferry_status ferry__rpc_decode(const ferry__rpc_source *src, const ProtobufCMessageDescriptor *desc,
                               const ferry__rpc_limits *lim, ferry_rpc_msg *out) {
    ferry_rpc_msg_deinit(out);
    if (src->total > lim->max_message_bytes)
        return ferry_errorf(FERRY_ERR_RANGE, "message of %zu bytes exceeds the %zu-byte limit",
                            src->total, lim->max_message_bytes);
    cursor c = {.src = src};
    hbuf h = {0};
    landing land = {out->land_name, out->land, out->land_bytes};
    ferry_status st = FERRY_OK;
    while (st == FERRY_OK && c.pos < src->total)
        st = decode_field(&c, src->total, lim, out, &h, &land);
    if (st == FERRY_OK) {
        static const uint8_t empty[1];
        ProtobufCMessage *head =
            protobuf_c_message_unpack(desc, NULL, h.len, h.len > 0 ? h.p : empty);
        if (head == NULL) {
            st = ferry_errorf(FERRY_ERR_FORMAT, "%s header fields do not parse", desc->name);
        } else if (has_field_zero(head, 0)) {
            protobuf_c_message_free_unpacked(head, NULL);
            head = NULL;
            st = ferry_errorf(FERRY_ERR_FORMAT, "%s header has a field numbered 0", desc->name);
        }
        out->head = head;
        out->head_desc = head != NULL ? desc : NULL;
    }
    free(h.p);
    if (st != FERRY_OK)
        ferry_rpc_msg_deinit(out);
    return st;
}

typedef struct flat_source {
    const uint8_t *p;
    size_t n;
    int done;
} flat_source;

static int flat_next(void *user, const uint8_t **p, size_t *n) {
    flat_source *f = user;
    if (f->done)
        return 0;
    f->done = 1;
    *p = f->p;
    *n = f->n;
    return 1;
}

ferry_status ferry__rpc_decode_flat(const void *buf, size_t n,
                                    const ProtobufCMessageDescriptor *desc,
                                    const ferry__rpc_limits *lim, ferry_rpc_msg *out) {
    flat_source f = {.p = buf, .n = n};
    ferry__rpc_source src = {.next = flat_next, .user = &f, .total = n};
    return ferry__rpc_decode(&src, desc, lim, out);
}
