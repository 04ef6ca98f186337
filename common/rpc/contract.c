/* contract.c - the tables of contract.h, expanded from its maps. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/core/log.h"
#include "common/rpc/contract.h"
#include "ferry.pb-c.h"

/* clang-format off */
const ferry_wire_kind_info ferry_wire_kinds[FERRY_WIRE_KIND_COUNT] = {
#define KIND_(id, name, dims, rows, place, bias, stiefel, local_rows) \
    {#name, dims, rows, FERRY_WIRE_PLACE_##place, FERRY_WIRE_BIAS_##bias, stiefel, local_rows},
    FERRY_WIRE_KIND_MAP(KIND_)
#undef KIND_
};

const ferry_wire_mode_info ferry_wire_modes[FERRY_WIRE_MODE_COUNT] = {
#define MODE_(id, kind, name, dflt) {FERRY_WIRE_KIND_##kind, name, dflt},
    FERRY_WIRE_MODE_MAP(MODE_)
#undef MODE_
};

#define DT_F32   FERRY_RPC_DTYPE_F32
#define DT_F64   FERRY_RPC_DTYPE_F64
#define DT_I32   FERRY_RPC_DTYPE_I32
#define DT_I64   FERRY_RPC_DTYPE_I64
#define DT_INDEX FERRY_WIRE_DTYPE_INDEX
const ferry_wire_tensor ferry_wire_tensors[FERRY_WIRE_TENSOR_COUNT] = {
#define TENSOR_(id, mode, dir, name, dt, rank, shape, opt)                                        \
    {FERRY_WIRE_MODE_##mode, FERRY_WIRE_##dir, name, DT_##dt, rank, shape, opt},
    FERRY_WIRE_TENSOR_MAP(TENSOR_)
#undef TENSOR_
};

const ferry_wire_param_info ferry_wire_params[FERRY_WIRE_PARAM_COUNT] = {
#define PARAM_(id, name, rank, shape) {name, rank, shape},
    FERRY_WIRE_PARAM_MAP(PARAM_)
#undef PARAM_
};
/* clang-format on */

int ferry_wire_kind_find(const char *name) {
    for (int k = 0; k < FERRY_WIRE_KIND_COUNT; k++)
        if (strcmp(ferry_wire_kinds[k].name, name) == 0)
            return k;
    return -1;
}

const char *ferry_wire_mode_list(ferry_wire_kind kind, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < FERRY_WIRE_MODE_COUNT; i++) {
        if (ferry_wire_modes[i].kind != kind)
            continue;
        int w = snprintf(buf + n, cap - n, "%s%s", n > 0 ? " | " : "", ferry_wire_modes[i].name);
        if (w < 0 || (size_t)w >= cap - n)
            break;
        n += (size_t)w;
    }
    return buf;
}

ferry_status ferry_wire_mode_find(ferry_wire_kind kind, const char *mode, ferry_wire_mode *out) {
    for (int i = 0; i < FERRY_WIRE_MODE_COUNT; i++) {
        const ferry_wire_mode_info *m = &ferry_wire_modes[i];
        if (m->kind == kind && (mode[0] == '\0' ? m->is_default : strcmp(m->name, mode) == 0)) {
            *out = (ferry_wire_mode)i;
            return FERRY_OK;
        }
    }
    char list[128];
    return ferry_errorf(FERRY_ERR_UNSUPPORTED, "%s: unknown mode '%s' (%s)",
                        ferry_wire_kinds[kind].name, mode,
                        ferry_wire_mode_list(kind, list, sizeof list));
}

const char *ferry_wire_dtype_name(int dtype) {
    switch (dtype) {
    case FERRY_RPC_DTYPE_F32:
        return "f32";
    case FERRY_RPC_DTYPE_I32:
        return "i32";
    case FERRY_RPC_DTYPE_I64:
        return "i64";
    case FERRY_RPC_DTYPE_F64:
        return "f64";
    case FERRY_RPC_DTYPE_BF16:
        return "bf16";
    case FERRY_WIRE_DTYPE_INDEX:
        return "integer";
    default:
        return "?";
    }
}

int ferry_wire_dtype_ok(const ferry_wire_tensor *w, int dtype) {
    if (w->dtype == FERRY_WIRE_DTYPE_INDEX)
        return dtype == FERRY_RPC_DTYPE_I32 || dtype == FERRY_RPC_DTYPE_I64;
    return dtype == w->dtype;
}

/* The field, when it is a singular number; NULL otherwise. */
static const ProtobufCFieldDescriptor *number_field(const ProtobufCMessage *m, const char *name) {
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field_by_name(m->descriptor, name);
    if (f == NULL || f->label == PROTOBUF_C_LABEL_REPEATED)
        return NULL;
    switch (f->type) {
    case PROTOBUF_C_TYPE_DOUBLE:
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_BOOL:
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_UINT64:
        return f;
    default:
        return NULL;
    }
}

/* Reads (write 0) or writes (write 1) the number at p of protobuf-c type `type` as a
 * double. */
static void number_rw(void *p, ProtobufCType type, double *v, int write) {
#define NUMBER_RW_(ctype)                                                                          \
    do {                                                                                           \
        if (write)                                                                                 \
            *(ctype *)p = (ctype)*v;                                                               \
        else                                                                                       \
            *v = (double)*(ctype *)p;                                                              \
    } while (0)
    switch (type) {
    case PROTOBUF_C_TYPE_DOUBLE:
        NUMBER_RW_(double);
        break;
    case PROTOBUF_C_TYPE_FLOAT:
        NUMBER_RW_(float);
        break;
    case PROTOBUF_C_TYPE_INT32:
        NUMBER_RW_(int32_t);
        break;
    case PROTOBUF_C_TYPE_UINT32:
        NUMBER_RW_(uint32_t);
        break;
    case PROTOBUF_C_TYPE_INT64:
        NUMBER_RW_(int64_t);
        break;
    case PROTOBUF_C_TYPE_UINT64:
        NUMBER_RW_(uint64_t);
        break;
    default: /* bool */
        if (write)
            *(protobuf_c_boolean *)p = *v != 0.0;
        else
            *v = *(protobuf_c_boolean *)p ? 1.0 : 0.0;
        break;
    }
#undef NUMBER_RW_
}

int ferry__proto_get_number(const ProtobufCMessage *m, const char *name, double *out) {
    const ProtobufCFieldDescriptor *f = number_field(m, name);
    if (f == NULL)
        return 0;
    number_rw((char *)(uintptr_t)m + f->offset, f->type, out, 0);
    return 1;
}

int ferry__proto_set_number(ProtobufCMessage *m, const char *name, double v) {
    const ProtobufCFieldDescriptor *f = number_field(m, name);
    if (f == NULL)
        return 0;
    number_rw((char *)m + f->offset, f->type, &v, 1);
    return 1;
}

/* ---- a module config's kind, through the descriptors ---- */

/* The named fields beside dims, with their FERRY_WIRE_CFG_ bit. */
static const struct {
    const char *name;
    unsigned bit;
} kind_fields[] = {
    {"no_bias", FERRY_WIRE_CFG_NO_BIAS},         {"layers", FERRY_WIRE_CFG_LAYERS},
    {"first_layer", FERRY_WIRE_CFG_FIRST_LAYER}, {"dropout_ppm", FERRY_WIRE_CFG_DROPOUT_PPM},
    {"stiefel", FERRY_WIRE_CFG_STIEFEL},
};

/* The oneof member of ModuleConfig named after kind (NULL: none). */
static const ProtobufCFieldDescriptor *kind_member(const ProtobufCMessageDescriptor *mcd,
                                                   ferry_wire_kind kind) {
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field_by_name(mcd, ferry_wire_kinds[kind].name);
    return f != NULL && (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
                   f->type == PROTOBUF_C_TYPE_MESSAGE
               ? f
               : NULL;
}

/* The FERRY_WIRE_CFG_ bits of the named fields a kind's message (descriptor d) has. */
static unsigned fields_of(const ProtobufCMessageDescriptor *d) {
    unsigned has = 0;
    for (size_t i = 0; i < sizeof kind_fields / sizeof kind_fields[0]; i++)
        if (protobuf_c_message_descriptor_get_field_by_name(d, kind_fields[i].name))
            has |= kind_fields[i].bit;
    return has;
}

unsigned ferry__wire_kind_config_fields(ferry_wire_kind kind) {
    const ProtobufCFieldDescriptor *f = kind_member(&ferry__v1__module_config__descriptor, kind);
    return f != NULL ? fields_of(f->descriptor) : 0;
}

static ferry_status no_kind(void) {
    char list[128];
    size_t n = 0;
    list[0] = '\0';
    for (int k = 0; k < FERRY_WIRE_KIND_COUNT && n < sizeof list; k++) {
        int w =
            snprintf(list + n, sizeof list - n, "%s%s", k ? " | " : "", ferry_wire_kinds[k].name);
        n += w > 0 ? (size_t)w : 0;
    }
    return ferry_errorf(FERRY_ERR_INVALID, "the config names no kind (%s)", list);
}

/* A non-negative numeric field of m; 0 when m has none of that name. */
static uint32_t u32_field(const ProtobufCMessage *m, const char *name) {
    double v = 0.0;
    (void)ferry__proto_get_number(m, name, &v);
    return (uint32_t)v;
}

ferry_status ferry__wire_kind_config_read(const ProtobufCMessage *mc, ferry_wire_kind_config *out) {
    memset(out, 0, sizeof *out);
    for (int k = 0; k < FERRY_WIRE_KIND_COUNT; k++) {
        const ProtobufCFieldDescriptor *f = kind_member(mc->descriptor, (ferry_wire_kind)k);
        if (f == NULL)
            continue;
        const char *base = (const char *)mc;
        if (*(const uint32_t *)(base + f->quantifier_offset) != f->id)
            continue;
        const ProtobufCMessage *km = *(ProtobufCMessage *const *)(base + f->offset);
        if (km == NULL)
            break;
        out->kind = (ferry_wire_kind)k;
        for (unsigned d = 0; d < 2; d++) {
            const ProtobufCFieldDescriptor *df =
                protobuf_c_message_descriptor_get_field(km->descriptor, d + 1);
            if (df == NULL || df->type != PROTOBUF_C_TYPE_INT64 ||
                df->label == PROTOBUF_C_LABEL_REPEATED)
                return ferry_errorf(FERRY_ERR_INVALID, "kind %s: field %u is not a size",
                                    ferry_wire_kinds[k].name, d + 1);
            out->dims[d] = *(const int64_t *)((const char *)km + df->offset);
        }
        out->has = fields_of(km->descriptor);
        out->no_bias = u32_field(km, "no_bias") != 0;
        out->layers = u32_field(km, "layers");
        out->first_layer = u32_field(km, "first_layer");
        out->dropout_ppm = u32_field(km, "dropout_ppm");
        const ProtobufCFieldDescriptor *sf =
            protobuf_c_message_descriptor_get_field_by_name(km->descriptor, "stiefel");
        if (sf != NULL && sf->type == PROTOBUF_C_TYPE_MESSAGE) {
            const ProtobufCMessage *s = *(ProtobufCMessage *const *)((const char *)km + sf->offset);
            if (s != NULL) {
                out->stiefel = 1;
                (void)ferry__proto_get_number(s, "beta", &out->beta);
                out->polar = u32_field(s, "polar") != 0;
            }
        }
        return FERRY_OK;
    }
    return no_kind();
}

/* A new message of descriptor d, zero-initialised as protobuf-c does. */
static ProtobufCMessage *message_new(const ProtobufCMessageDescriptor *d) {
    ProtobufCMessage *m = malloc(d->sizeof_message);
    if (m != NULL)
        d->message_init(m);
    return m;
}

ferry_status ferry__wire_kind_config_write(const ferry_wire_kind_config *in, ProtobufCMessage *mc) {
    if ((int)in->kind < 0 || in->kind >= FERRY_WIRE_KIND_COUNT)
        return ferry_errorf(FERRY_ERR_INVALID, "unknown kind %d", (int)in->kind);
    const ProtobufCFieldDescriptor *f = kind_member(mc->descriptor, in->kind);
    if (f == NULL)
        return ferry_errorf(FERRY_ERR_UNSUPPORTED, "ModuleConfig has no member for kind %s",
                            ferry_wire_kinds[in->kind].name);
    ProtobufCMessage *km = message_new(f->descriptor);
    if (km == NULL)
        return FERRY_NOMEM();
    for (unsigned d = 0; d < 2; d++) {
        const ProtobufCFieldDescriptor *df =
            protobuf_c_message_descriptor_get_field(km->descriptor, d + 1);
        if (df != NULL && df->type == PROTOBUF_C_TYPE_INT64)
            *(int64_t *)((char *)km + df->offset) = in->dims[d];
    }
    (void)ferry__proto_set_number(km, "no_bias", in->no_bias);
    (void)ferry__proto_set_number(km, "layers", in->layers);
    (void)ferry__proto_set_number(km, "first_layer", in->first_layer);
    (void)ferry__proto_set_number(km, "dropout_ppm", in->dropout_ppm);
    const ProtobufCFieldDescriptor *sf =
        protobuf_c_message_descriptor_get_field_by_name(km->descriptor, "stiefel");
    if (in->stiefel && sf != NULL && sf->type == PROTOBUF_C_TYPE_MESSAGE) {
        ProtobufCMessage *s = message_new(sf->descriptor);
        if (s == NULL) {
            free(km);
            return FERRY_NOMEM();
        }
        (void)ferry__proto_set_number(s, "beta", in->beta);
        (void)ferry__proto_set_number(s, "polar", in->polar);
        *(ProtobufCMessage **)((char *)km + sf->offset) = s;
    }
    ferry__wire_kind_config_clear(mc);
    *(uint32_t *)((char *)mc + f->quantifier_offset) = f->id;
    *(ProtobufCMessage **)((char *)mc + f->offset) = km;
    return FERRY_OK;
}

void ferry__wire_kind_config_clear(ProtobufCMessage *mc) {
    for (int k = 0; k < FERRY_WIRE_KIND_COUNT; k++) {
        const ProtobufCFieldDescriptor *f = kind_member(mc->descriptor, (ferry_wire_kind)k);
        if (f == NULL || *(uint32_t *)((char *)mc + f->quantifier_offset) != f->id)
            continue;
        ProtobufCMessage **slot = (ProtobufCMessage **)((char *)mc + f->offset);
        if (*slot != NULL)
            protobuf_c_message_free_unpacked(*slot, NULL);
        *slot = NULL;
        *(uint32_t *)((char *)mc + f->quantifier_offset) = 0;
    }
}
