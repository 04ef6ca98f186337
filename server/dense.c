/* dense.c - the `dense` module kind: rows [row_begin, row_begin + R_s) of a global
 * (R, C) block of parameters that a trainer computes with itself, as ps-lite's and
 * MXNet's kvstore keep a model's dense weights: the master copy and its optimizer
 * state live here, split over the servers by rows. Forward ("pull") returns the
 * shard's rows as they are now; its Backward ("push") takes their gradient and
 * keeps it, dense, in the context, so Step updates them with the dense optimizer.
 * ferry-trainer keeps the LSTM of a data-parallel job in one such module.
 *
 * A pull asked for in bf16 (proto section 3b) does not round the weights: the shard
 * keeps an image I of its rows that its callers hold too, and advances it once per
 * parameter version, I <- I + bf16(W - I). A caller that holds the previous image
 * gets that bf16 delta (half the bytes) and adds it as the server did, so both hold
 * the same I bit for bit, within half a bf16 unit of one step's change of W; any
 * other caller gets I itself in f32. I is charged to the model budget like the
 * weights; without room for it, bf16 pulls are exact f32 ones. */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/tensor/backend.h"
#include "server/ps-impl.h"
#include "common/core/log.h"

typedef struct dense_image {
    pthread_mutex_t mu;
    float *image;            /* I (R_s, C); NULL until the first bf16 pull */
    uint8_t *delta;          /* the last advance, bf16(W - I_before), little-endian pairs */
    uint64_t id, base;       /* I's id; the id it advanced from (0: it is new) */
    uint64_t version, loads; /* m->version and m->loads that I stands for */
    int refused;             /* no room in the budget: pulls are exact f32 */
} dense_image;

static ferry_status dense_declare(ferry__ps_module *m) {
    m->rows = m->cfg.row_count;
    m->cols = m->cfg.dims[1];
    m->b = -1;
    dense_image *im = calloc(1, sizeof *im);
    if (im == NULL)
        return FERRY_NOMEM();
    pthread_mutex_init(&im->mu, NULL);
    m->impl = im;
    return ferry_params_add(&m->P, FERRY_WIRE_PARAM_NAME(WEIGHT), ferry_shape_2d(m->rows, m->cols),
                            0, &m->w);
}

static void dense_destroy(ferry__ps_module *m) {
    dense_image *im = m->impl;
    if (im == NULL)
        return;
    free(im->image);
    free(im->delta);
    pthread_mutex_destroy(&im->mu);
    free(im);
    m->impl = NULL;
}

/* A fresh image id: random, never 0 nor `not`. */
static ferry_status image_id(uint64_t not, uint64_t *out) {
    uint64_t x = 0;
    while (x == 0 || x == not )
        if (getrandom(&x, sizeof x, 0) != (ssize_t)sizeof x)
            return ferry_errorf(FERRY_ERR_IO, "dense pull: no randomness for an image id");
    *out = x;
    return FERRY_OK;
}

/* The weights in host memory: W itself on a host backend, else a copy in *tmp. */
static ferry_status host_weights(ferry__ps_module *m, float **tmp, const float **w) {
    const float *data = ferry_params_data(&m->P, m->w);
    size_t bytes = (size_t)(m->rows * m->cols) * sizeof(float);
    if (ferry_backend_is_host(m->P.be)) {
        *w = data;
        return FERRY_OK;
    }
    if ((*tmp = malloc(bytes)) == NULL)
        return FERRY_NOMEM();
    *w = *tmp;
    return ferry_backend_copy(m->P.be, *tmp, data, bytes, FERRY_COPY_DEVICE_TO_HOST);
}

/* I <- I + bf16(W - I), keeping the delta; in blocks, with the conversions the wire
 * uses, so that a caller adding the delta reproduces I exactly. */
static void image_advance(dense_image *im, const float *w, int64_t n) {
    float d[512];
    for (int64_t at = 0; at < n; at += 512) {
        size_t k = (size_t)(n - at < 512 ? n - at : 512);
        for (size_t i = 0; i < k; i++)
            d[i] = w[at + (int64_t)i] - im->image[at + (int64_t)i];
        ferry_rpc_bf16_narrow(im->delta + 2 * at, d, k);
        ferry_rpc_bf16_widen(d, im->delta + 2 * at, k);
        for (size_t i = 0; i < k; i++)
            im->image[at + (int64_t)i] += d[i];
    }
}

/* Brings the image up to the weights' version: made on the first bf16 pull (charged
 * to the budgets; refused for good when they are short), advanced once per version.
 * Image mutex held; the module's read lock keeps W still. */
static ferry_status image_update(ferry__ps_module *m, dense_image *im) {
    int64_t n = m->rows * m->cols;
    if (im->refused || (im->id != 0 && im->version == m->version && im->loads == m->loads))
        return FERRY_OK;
    if (im->image == NULL) {
        float *image = malloc((size_t)n * sizeof(float));
        uint8_t *delta = malloc((size_t)n * 2);
        if (image == NULL || delta == NULL) {
            free(image);
            free(delta);
            return FERRY_NOMEM();
        }
        if (ferry__ps_module_charge(m, n * 6, "its bf16 pull image") != FERRY_OK) {
            FERRY_LOG_WARN("%s; its bf16 pulls send exact f32 rows instead", ferry_error_last());
            free(image);
            free(delta);
            im->refused = 1;
            return FERRY_OK;
        }
        im->image = image;
        im->delta = delta;
    }
    float *tmp = NULL;
    const float *w = NULL;
    ferry_status st = host_weights(m, &tmp, &w);
    uint64_t id = 0;
    if (st == FERRY_OK)
        st = image_id(im->id, &id);
    if (st == FERRY_OK && im->id == 0) { /* new: I = W */
        memcpy(im->image, w, (size_t)n * sizeof(float));
        im->base = 0;
    } else if (st == FERRY_OK) {
        image_advance(im, w, n);
        im->base = im->id;
    }
    if (st == FERRY_OK) {
        im->id = id;
        im->version = m->version;
        im->loads = m->loads;
    }
    free(tmp);
    return st;
}

/* The bf16 pull: "weight" is the image (F32) or a BF16 delta to the caller's, and
 * "image" says which. The reply's other F32 tensors: none, so its wire dtype is F32
 * (the image must arrive exact). *exact = 1, nothing written: the module keeps no image
 * (no room in the budget), the caller sends W. */
static ferry_status dense_pull_image(ferry__ps_module *m, ferry_rpc_msg *req, ferry_rpc_msg *reply,
                                     int *exact) {
    int64_t one[1] = {1};
    int ih;
    ferry_status st = ferry__ps_input(m, req, FERRY_WIRE_DENSE_FWD_HELD, one, &ih);
    if (st != FERRY_OK)
        return st;
    uint64_t held = 0;
    if (ih >= 0)
        memcpy(&held, req->tensors[ih].data, sizeof held);
    dense_image *im = m->impl;
    pthread_mutex_lock(&im->mu);
    st = image_update(m, im);
    *exact = im->refused;
    pthread_mutex_unlock(&im->mu);
    if (st != FERRY_OK || *exact)
        return st;
    /* The image changes only when the version does, under the module's write lock: the
     * read lock this call holds keeps it as it is until the reply is built. */
    (void)ferry_rpc_msg_set_wire_dtype(reply, FERRY_RPC_DTYPE_F32);
    int64_t dim[2] = {m->rows, m->cols}, n = m->rows * m->cols, two[1] = {2};
    int delta = held != 0 && (held == im->base || held == im->id);
    void *w;
    if (delta) {
        const char *name = ferry_wire_tensors[FERRY_WIRE_DENSE_FWD_WEIGHT].name;
        if ((st = ferry_rpc_msg_alloc(reply, FERRY_RPC_DTYPE_BF16, 2, dim, name, &w)) != FERRY_OK)
            return st;
        if (held == im->base)
            memcpy(w, im->delta, (size_t)n * 2);
        else /* it holds this image already */
            memset(w, 0, (size_t)n * 2);
    } else {
        if ((st = ferry__ps_output(reply, FERRY_WIRE_DENSE_FWD_WEIGHT, dim, &w)) != FERRY_OK)
            return st;
        memcpy(w, im->image, (size_t)n * sizeof(float));
    }
    int64_t *ids;
    if ((st = ferry__ps_output(reply, FERRY_WIRE_DENSE_FWD_IMAGE, two, (void **)&ids)) != FERRY_OK)
        return st;
    ids[0] = (int64_t)im->id;
    ids[1] = delta ? (int64_t)held : 0;
    return FERRY_OK;
}

/* No input (bf16: the image held) -> "weight" (R_s, C). Nothing is saved: the push
 * needs only the shape. */
static ferry_status dense_forward(ferry__ps_module *m, ferry_wire_mode mode, ferry_rpc_msg *req,
                                  ferry_rpc_msg *reply, ferry__ps_saved *save) {
    (void)mode; /* one mode */
    if (save != NULL)
        save->N = m->rows;
    if (reply->wire_dtype == FERRY_RPC_DTYPE_BF16) {
        int exact = 0;
        ferry_status st = dense_pull_image(m, req, reply, &exact);
        if (st != FERRY_OK || !exact)
            return st;
        (void)ferry_rpc_msg_set_wire_dtype(reply, FERRY_RPC_DTYPE_F32); /* W, exact, below */
    }
    int64_t dim[2] = {m->rows, m->cols};
    float *w;
    ferry_status st = ferry__ps_output(reply, FERRY_WIRE_DENSE_FWD_WEIGHT, dim, (void **)&w);
    if (st != FERRY_OK)
        return st;
    return ferry_backend_copy(m->P.be, w, ferry_params_data(&m->P, m->w),
                              (size_t)(m->rows * m->cols) * sizeof(float),
                              FERRY_COPY_DEVICE_TO_HOST);
}

/* "grad" (R_s, C), added to the context's dense gradient. */
static ferry_status dense_backward(ferry__ps_module *m, const Ferry__V1__BackwardRequest *q,
                                   ferry__ps_saved *saved, ferry_rpc_msg *req, ferry_grads *G,
                                   ferry_rpc_msg *reply) {
    (void)q;
    (void)saved;
    (void)reply;
    int64_t want[2] = {m->rows, m->cols};
    int ig;
    ferry_status st = ferry__ps_input(m, req, FERRY_WIRE_DENSE_BWD_GRAD, want, &ig);
    if (st != FERRY_OK)
        return st;
    const float *grad = req->tensors[ig].data;
    int64_t n = m->rows * m->cols;
    if ((st = ferry__ps_check_finite(m, ferry_wire_tensors[FERRY_WIRE_DENSE_BWD_GRAD].name, grad,
                                     n)) != FERRY_OK)
        return st;
    return ferry_grads_add_dense(G, m->w, grad);
}

const ferry__ps_kind ferry__ps_kind_dense = {
    .wire = FERRY_WIRE_KIND_DENSE,
    .declare = dense_declare,
    .forward = dense_forward,
    .backward = dense_backward,
    .destroy = dense_destroy,
};
