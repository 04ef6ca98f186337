/* contract.c - the tables of contract.h, expanded from its maps. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/rpc/contract.h"

/* clang-format off */
const ferry_wire_kind_info ferry_wire_kinds[FERRY_WIRE_KIND_COUNT] = {
#define KIND_(id, name, dims, rows, place, bias, stiefel, local_rows) \
    {name, dims, rows, FERRY_WIRE_PLACE_##place, FERRY_WIRE_BIAS_##bias, stiefel, local_rows},
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
