/* contract.h - the wire contract of every module kind, written once: the kinds, the
 * modes of their Forward and Backward, and each tensor a request or reply carries
 * (name, dtype, rank, and the shape it must have). The client's request builders
 * (common/dist) make their tensors from these entries and the server's kinds
 * (server/embedding.c, decoder.c, linear.c) check their inputs against them, so the two
 * sides cannot drift apart; proto/ferry.proto states the same contract in prose, and
 * tests/test_contract.c checks that it names every entry.
 *
 *     // client                                     // server
 *     ferry__dist_tensor(FERRY_WIRE_DECODER_FWD_HIDDEN, ...)   ferry__ps_input(m, req,
 * FERRY_WIRE_DECODER_FWD_HIDDEN, want, &i)
 */
#ifndef FERRY_RPC_CONTRACT_H
#define FERRY_RPC_CONTRACT_H

#include <protobuf-c/protobuf-c.h>

#include "common/rpc/rpc.h"

/* The module kinds and their rules, one row each, read by ferry-ps and the client:
 * X(ID, name (ModuleConfig's oneof member and the kind's file names: server/<name>.c
 * defines ferry__ps_kind_<name>, the client's ferry__dist_kind_<name>), dims as the
 * kind's config message gives them in its fields 1 and 2, ROWS: which of dims
 * counts the weight's rows (-1: the kind is one row, its packed parameters), PLACE:
 * SHARDED (rows split over every server) or ONE (the whole module on one server),
 * BIAS: NONE, ALWAYS or OPTIONAL (the config's bias flag), STIEFEL: 1 if its weight
 * may carry a Stiefel constraint, LOCAL_ROWS: 1 if a client may keep some of its
 * rows itself). */
#define FERRY_WIRE_KIND_MAP(X)                                                                     \
    X(EMBEDDING, embedding, "[V, E]", 0, SHARDED, NONE, 0, 0)                                      \
    X(DECODER, decoder, "[V, H]", 0, SHARDED, ALWAYS, 0, 1)                                        \
    X(LINEAR, linear, "[C, D]", 1, ONE, OPTIONAL, 1, 0)                                            \
    X(DENSE, dense, "[R, C]", 0, SHARDED, NONE, 0, 0)                                              \
    X(LSTM, lstm, "[C, H]", -1, ONE, NONE, 1, 0)

/* The Forward/Backward modes: X(ID, kind, mode string, 1 if "" selects it). A Backward
 * uses the mode its Forward used. */
#define FERRY_WIRE_MODE_MAP(X)                                                                     \
    X(EMBEDDING_ROWS, EMBEDDING, "rows", 1)                                                        \
    X(DECODER_PARTIALS, DECODER, "partials", 1)                                                    \
    X(DECODER_LOGITS, DECODER, "logits", 0)                                                        \
    X(LINEAR, LINEAR, "linear", 1)                                                                 \
    X(DENSE_PULL, DENSE, "pull", 1)                                                                \
    X(LSTM_SEQ, LSTM, "seq", 1)

/* Every tensor of every call: X(ID, mode, direction, name, dtype, rank, shape, optional).
 * dtype INDEX means I32 or I64. Shapes use the kind's dims (V, E, H, C, D), the rows a
 * shard owns (V_s: its slice of V, D for linear), N (rows of the batch) and U (the
 * distinct ids sent to one embedding shard). CreateModule's initial values and
 * Get/SetParams' tensors are the parameters ("weight", "bias"): see PARAM below. */
#define FERRY_WIRE_TENSOR_MAP(X)                                                                   \
    X(EMBEDDING_FWD_IDS, EMBEDDING_ROWS, FWD_IN, "ids", INDEX, 1,                                  \
      "(U) global ids this shard owns", 0)                                                         \
    X(EMBEDDING_FWD_ROWS, EMBEDDING_ROWS, FWD_OUT, "rows", F32, 2, "(U, E) their rows", 0)         \
    X(EMBEDDING_BWD_GRAD, EMBEDDING_ROWS, BWD_IN, "grad", F32, 2, "(U, E) gradient of rows", 0)    \
    X(DECODER_FWD_HIDDEN, DECODER_PARTIALS, FWD_IN, "hidden", F32, 2, "(N, H)", 0)                 \
    X(DECODER_FWD_TARGETS, DECODER_PARTIALS, FWD_IN, "targets", INDEX, 1,                          \
      "(N) global target ids in [0, V)", 0)                                                        \
    X(DECODER_FWD_MAX, DECODER_PARTIALS, FWD_OUT, "max", F32, 1, "(N) max logit of the slice", 0)  \
    X(DECODER_FWD_SUMEXP, DECODER_PARTIALS, FWD_OUT, "sumexp", F64, 1,                             \
      "(N) sum of exp(logit - max) over the slice", 0)                                             \
    X(DECODER_FWD_TARGET_LOGIT, DECODER_PARTIALS, FWD_OUT, "target_logit", F32, 1,                 \
      "(N) the target's logit where the slice holds it, else 0", 0)                                \
    X(DECODER_FWD_HAS_TARGET, DECODER_PARTIALS, FWD_OUT, "has_target", I32, 1,                     \
      "(N) 1 where the slice holds the target", 0)                                                 \
    X(DECODER_BWD_FACTOR, DECODER_PARTIALS, BWD_IN, "factor", F32, 1,                              \
      "(N) exp(max_slice - max_all) / sumexp_all", 0)                                              \
    X(DECODER_BWD_SCALE, DECODER_PARTIALS, BWD_IN, "scale", F32, 1, "(N) per-row loss weights", 1) \
    X(DECODER_BWD_DH, DECODER_PARTIALS, BWD_OUT, "dh", F32, 2, "(N, H) the slice's part of dL/dh", \
      0)                                                                                           \
    X(DECODER_LOGITS_FWD_HIDDEN, DECODER_LOGITS, FWD_IN, "hidden", F32, 2, "(N, H)", 0)            \
    X(DECODER_LOGITS_FWD_LOGITS, DECODER_LOGITS, FWD_OUT, "logits", F32, 2,                        \
      "(N, V_s) h W_s^T + b_s", 0)                                                                 \
    X(DECODER_LOGITS_BWD_DLOGITS, DECODER_LOGITS, BWD_IN, "dlogits", F32, 2, "(N, V_s)", 0)        \
    X(DECODER_LOGITS_BWD_DH, DECODER_LOGITS, BWD_OUT, "dh", F32, 2, "(N, H)", 0)                   \
    X(LINEAR_FWD_X, LINEAR, FWD_IN, "x", F32, 2, "(N, C)", 0)                                      \
    X(LINEAR_FWD_Y, LINEAR, FWD_OUT, "y", F32, 2, "(N, D) x A^T + b", 0)                           \
    X(LINEAR_BWD_DY, LINEAR, BWD_IN, "dy", F32, 2, "(N, D)", 0)                                    \
    X(LINEAR_BWD_DX, LINEAR, BWD_OUT, "dx", F32, 2, "(N, C)", 0)                                   \
    X(DENSE_FWD_HELD, DENSE_PULL, FWD_IN, "held_image", I64, 1,                                    \
      "(1) with reply_dtype BF16: the image the caller holds (an earlier reply's image[0])", 1)    \
    X(DENSE_FWD_WEIGHT, DENSE_PULL, FWD_OUT, "weight", F32, 2,                                     \
      "(R_s, C) the shard's rows, now; with reply_dtype BF16 their image or a delta to it", 0)     \
    X(DENSE_FWD_IMAGE, DENSE_PULL, FWD_OUT, "image", I64, 1,                                       \
      "(2) with reply_dtype BF16: [the image the caller holds after this reply, the image "        \
      "weight is a BF16 delta to (0: weight is the image, F32)]",                                  \
      1)                                                                                           \
    X(DENSE_BWD_GRAD, DENSE_PULL, BWD_IN, "grad", F32, 2, "(R_s, C) their gradient (the push)", 0) \
    X(LSTM_FWD_X, LSTM_SEQ, FWD_IN, "x", F32, 3, "(T, B, C) the group's input", 0)                 \
    X(LSTM_FWD_H0, LSTM_SEQ, FWD_IN, "h0", F32, 3,                                                 \
      "(K, B, H) start state; absent: the stream's carried state", 1)                              \
    X(LSTM_FWD_C0, LSTM_SEQ, FWD_IN, "c0", F32, 3, "(K, B, H) with h0", 1)                         \
    X(LSTM_FWD_Y, LSTM_SEQ, FWD_OUT, "y", F32, 3, "(T, B, H) the last layer's h", 0)               \
    X(LSTM_FWD_HN, LSTM_SEQ, FWD_OUT, "hn", F32, 3, "(K, B, H) final h per layer", 0)              \
    X(LSTM_FWD_CN, LSTM_SEQ, FWD_OUT, "cn", F32, 3, "(K, B, H) final c per layer", 0)              \
    X(LSTM_BWD_DY, LSTM_SEQ, BWD_IN, "dy", F32, 3, "(T, B, H)", 0)                                 \
    X(LSTM_BWD_DHN, LSTM_SEQ, BWD_IN, "dhn", F32, 3, "(K, B, H) gradient of hn", 1)                \
    X(LSTM_BWD_DCN, LSTM_SEQ, BWD_IN, "dcn", F32, 3, "(K, B, H) gradient of cn", 1)                \
    X(LSTM_BWD_DX, LSTM_SEQ, BWD_OUT, "dx", F32, 3, "(T, B, C)", 0)                                \
    X(LSTM_BWD_DH0, LSTM_SEQ, BWD_OUT, "dh0", F32, 3, "(K, B, H) when the Forward sent h0", 1)     \
    X(LSTM_BWD_DC0, LSTM_SEQ, BWD_OUT, "dc0", F32, 3, "(K, B, H) when the Forward sent c0", 1)

/* The parameters of each kind, as CreateModule's initial tensors, GetParams' reply and
 * SetParams' request name them: X(ID, name, rank, shape). Rows are the shard's. */
#define FERRY_WIRE_PARAM_MAP(X)                                                                    \
    X(WEIGHT, "weight", 2, "(rows, E | H | C); lstm: (1, N) the group's packed layers")            \
    X(BIAS, "bias", 1, "(rows); decoder always, linear unless no_bias, embedding and dense never")

/* The name of parameter ID on the wire: FERRY_WIRE_PARAM_NAME(WEIGHT) is "weight". */
#define FERRY_WIRE_PARAM_NAME(id) (ferry_wire_params[FERRY_WIRE_PARAM_##id].name)

/* clang-format off */
typedef enum ferry_wire_kind {
#define FERRY_WIRE_KIND_ENUM_(id, name, dims, rows, place, bias, stiefel, local_rows) \
    FERRY_WIRE_KIND_##id,
    FERRY_WIRE_KIND_MAP(FERRY_WIRE_KIND_ENUM_)
#undef FERRY_WIRE_KIND_ENUM_
    FERRY_WIRE_KIND_COUNT
} ferry_wire_kind;

typedef enum ferry_wire_mode {
#define FERRY_WIRE_MODE_ENUM_(id, kind, name, dflt) FERRY_WIRE_MODE_##id,
    FERRY_WIRE_MODE_MAP(FERRY_WIRE_MODE_ENUM_)
#undef FERRY_WIRE_MODE_ENUM_
    FERRY_WIRE_MODE_COUNT
} ferry_wire_mode;

typedef enum ferry_wire_tensor_id {
#define FERRY_WIRE_TENSOR_ENUM_(id, mode, dir, name, dt, rank, shape, opt) FERRY_WIRE_##id,
    FERRY_WIRE_TENSOR_MAP(FERRY_WIRE_TENSOR_ENUM_)
#undef FERRY_WIRE_TENSOR_ENUM_
    FERRY_WIRE_TENSOR_COUNT
} ferry_wire_tensor_id;

typedef enum ferry_wire_param {
#define FERRY_WIRE_PARAM_ENUM_(id, name, rank, shape) FERRY_WIRE_PARAM_##id,
    FERRY_WIRE_PARAM_MAP(FERRY_WIRE_PARAM_ENUM_)
#undef FERRY_WIRE_PARAM_ENUM_
    FERRY_WIRE_PARAM_COUNT
} ferry_wire_param;
/* clang-format on */

typedef enum ferry_wire_dir {
    FERRY_WIRE_FWD_IN,  /* Forward request */
    FERRY_WIRE_FWD_OUT, /* Forward reply */
    FERRY_WIRE_BWD_IN,  /* Backward request */
    FERRY_WIRE_BWD_OUT, /* Backward reply */
} ferry_wire_dir;

enum { FERRY_WIRE_DTYPE_INDEX = -1 }; /* I32 or I64 */

enum { FERRY_WIRE_PLACE_SHARDED, FERRY_WIRE_PLACE_ONE };
enum { FERRY_WIRE_BIAS_NONE, FERRY_WIRE_BIAS_ALWAYS, FERRY_WIRE_BIAS_OPTIONAL };

typedef struct ferry_wire_kind_info {
    const char *name; /* "embedding" */
    const char *dims; /* "[V, E]" */
    int rows_dim;     /* which of dims counts the rows; -1: one row */
    int one_server;   /* FERRY_WIRE_PLACE_ONE: the whole module on one server */
    int bias;         /* FERRY_WIRE_BIAS_* */
    int stiefel;      /* its weight may carry a Stiefel constraint */
    int local_rows;   /* a client may keep some of its rows */
} ferry_wire_kind_info;

typedef struct ferry_wire_mode_info {
    ferry_wire_kind kind;
    const char *name; /* "partials" */
    int is_default;   /* the kind's mode when a request's mode is "" */
} ferry_wire_mode_info;

typedef struct ferry_wire_tensor {
    ferry_wire_mode mode;
    ferry_wire_dir dir;
    const char *name; /* the Tensor.name on the wire */
    int dtype;        /* ferry_rpc_dtype, or FERRY_WIRE_DTYPE_INDEX */
    int rank;
    const char *shape; /* for messages and docs: "(N, H)" */
    int optional;      /* 1: may be absent */
} ferry_wire_tensor;

typedef struct ferry_wire_param_info {
    const char *name;
    int rank;
    const char *shape;
} ferry_wire_param_info;

extern const ferry_wire_kind_info ferry_wire_kinds[FERRY_WIRE_KIND_COUNT];

/* The weight's rows of a kind's module with dims (1 for a one-row kind) and its
 * columns (the dim that is not the rows'; a one-row kind's packed size is its own). */
static inline int64_t ferry_wire_kind_rows(ferry_wire_kind k, const int64_t dims[2]) {
    int d = ferry_wire_kinds[k].rows_dim;
    return d < 0 ? 1 : dims[d];
}
static inline int64_t ferry_wire_kind_cols(ferry_wire_kind k, const int64_t dims[2]) {
    return dims[ferry_wire_kinds[k].rows_dim == 1 ? 0 : 1];
}
extern const ferry_wire_mode_info ferry_wire_modes[FERRY_WIRE_MODE_COUNT];
extern const ferry_wire_tensor ferry_wire_tensors[FERRY_WIRE_TENSOR_COUNT];
extern const ferry_wire_param_info ferry_wire_params[FERRY_WIRE_PARAM_COUNT];

/* The kind named name, or -1. */
int ferry_wire_kind_find(const char *name);
/* The mode of kind named by a request's mode string ("" for the kind's default);
 * FERRY_ERR_UNSUPPORTED naming the kind's modes otherwise. */
ferry_status ferry_wire_mode_find(ferry_wire_kind kind, const char *mode, ferry_wire_mode *out);
/* "partials | logits": the modes of kind, for messages. */
const char *ferry_wire_mode_list(ferry_wire_kind kind, char *buf, size_t cap);
/* A dtype's name ("f32"; "integer" for FERRY_WIRE_DTYPE_INDEX). */
const char *ferry_wire_dtype_name(int dtype);
/* 1 if a tensor of dtype has the entry's type. */
int ferry_wire_dtype_ok(const ferry_wire_tensor *w, int dtype);

/* Reads or writes the singular numeric field `name` (double, float, bool or integer)
 * of a protobuf-c message through its descriptor, so that a table of names (the
 * optimizer's fields) maps onto a message without a hand-written converter. 0 when
 * the message has no such numeric field. */
int ferry__proto_get_number(const ProtobufCMessage *m, const char *name, double *out);
int ferry__proto_set_number(ProtobufCMessage *m, const char *name, double v);

/* The kind part of a ModuleConfig, flat, read and written through the descriptors so
 * that no code outside a kind's own files names a kind's message: the kind is the
 * oneof member of the kind's name, dims are its message's fields 1 and 2, and every
 * other field any kind's message may carry is read by its name (0 where the kind's
 * message has none; `has` says which it has). */
enum {
    FERRY_WIRE_CFG_NO_BIAS = 1 << 0,
    FERRY_WIRE_CFG_LAYERS = 1 << 1,
    FERRY_WIRE_CFG_FIRST_LAYER = 1 << 2,
    FERRY_WIRE_CFG_DROPOUT_PPM = 1 << 3,
    FERRY_WIRE_CFG_STIEFEL = 1 << 4, /* the message has the field (set: stiefel != 0) */
};
typedef struct ferry_wire_kind_config {
    ferry_wire_kind kind;
    int64_t dims[2];
    unsigned has; /* FERRY_WIRE_CFG_* fields the kind's message has */
    int no_bias;
    uint32_t layers, first_layer, dropout_ppm;
    int stiefel; /* a Stiefel message is present */
    double beta;
    int polar;
} ferry_wire_kind_config;

/* Reads the kind of a ModuleConfig `mc` into *out; FERRY_ERR_INVALID naming the
 * kinds when its oneof holds none (or one without a row here). */
ferry_status ferry__wire_kind_config_read(const ProtobufCMessage *mc, ferry_wire_kind_config *out);
/* Sets mc's kind to a new message of in->kind filled from in (the fields the kind's
 * message lacks are not written). Release it with ferry__wire_kind_config_clear. */
ferry_status ferry__wire_kind_config_write(const ferry_wire_kind_config *in, ProtobufCMessage *mc);
void ferry__wire_kind_config_clear(ProtobufCMessage *mc);
/* The FERRY_WIRE_CFG_* fields kind's config message has. */
unsigned ferry__wire_kind_config_fields(ferry_wire_kind kind);

#endif /* FERRY_RPC_CONTRACT_H */
