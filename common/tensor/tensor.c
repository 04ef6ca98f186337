/* tensor.c - shapes and tensors. Storage comes from the tensor's backend; views
 * and wrapped tensors borrow it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tensor/backend.h"
#include "common/core/log.h"

ferry_shape ferry_shape_1d(int64_t d0) {
    ferry_shape s = {1, {d0, 0, 0, 0}};
    return s;
}

ferry_shape ferry_shape_2d(int64_t d0, int64_t d1) {
    ferry_shape s = {2, {d0, d1, 0, 0}};
    return s;
}

ferry_shape ferry_shape_3d(int64_t d0, int64_t d1, int64_t d2) {
    ferry_shape s = {3, {d0, d1, d2, 0}};
    return s;
}

int64_t ferry_shape_numel(ferry_shape s) {
    int64_t n = 1;
    for (int i = 0; i < s.ndim; i++)
        n *= s.dim[i];
    return n;
}

int ferry_shape_eq(ferry_shape a, ferry_shape b) {
    if (a.ndim != b.ndim)
        return 0;
    for (int i = 0; i < a.ndim; i++)
        if (a.dim[i] != b.dim[i])
            return 0;
    return 1;
}

const char *ferry_shape_str(ferry_shape s, char *buf, size_t cap) {
    size_t used = 0;
    int n = snprintf(buf, cap, "(");
    used = n > 0 ? (size_t)n : 0;
    for (int i = 0; i < s.ndim && used < cap; i++) {
        n = snprintf(buf + used, cap - used, i ? ", %lld" : "%lld", (long long)s.dim[i]);
        used += n > 0 ? (size_t)n : 0;
    }
    if (used < cap)
        (void)snprintf(buf + used, cap - used, ")");
    return buf;
}

size_t ferry_dtype_size(ferry_dtype dt) {
    switch (dt) {
    case FERRY_DTYPE_F32:
    case FERRY_DTYPE_I32:
        return 4;
    case FERRY_DTYPE_I64:
        return 8;
    }
    return 0;
}

static int shape_valid(ferry_shape s) {
    if (s.ndim < 0 || s.ndim > FERRY_MAX_DIMS)
        return 0;
    int64_t n = 1;
    for (int i = 0; i < s.ndim; i++) {
        if (s.dim[i] < 0 || (s.dim[i] > 0 && n > INT64_MAX / 8 / s.dim[i]))
            return 0;
        n *= s.dim[i];
    }
    return 1;
}

ferry_status ferry_tensor_create(ferry_backend *be, ferry_dtype dt, ferry_shape shape,
                                 ferry_tensor **out) {
    if (!shape_valid(shape) || ferry_dtype_size(dt) == 0)
        return ferry_errorf(FERRY_ERR_INVALID, "invalid tensor shape or dtype");
    ferry_tensor *t = calloc(1, sizeof *t);
    if (t == NULL)
        return FERRY_NOMEM();
    *t = ferry_tensor_wrap(be, dt, shape, NULL);
    size_t nbytes = ferry_tensor_nbytes(t);
    ferry_status st = ferry_backend_alloc(be, nbytes ? nbytes : 1, &t->data);
    if (st != FERRY_OK) {
        free(t);
        return st;
    }
    t->owns = 1;
    if (nbytes > 0 && dt == FERRY_DTYPE_F32) {
        st = ferry_backend_fill(be, t->data, ferry_shape_numel(shape), 0.0f);
    } else if (nbytes > 0) {
        /* Integer tensors: zero through a host buffer so any backend works. */
        void *zeros = calloc(1, nbytes);
        st = zeros ? ferry_backend_copy(be, t->data, zeros, nbytes, FERRY_COPY_HOST_TO_DEVICE)
                   : FERRY_NOMEM();
        free(zeros);
    }
    if (st != FERRY_OK) {
        ferry_tensor_destroy(t);
        return st;
    }
    *out = t;
    return FERRY_OK;
}

void ferry_tensor_destroy(ferry_tensor *t) {
    if (t == NULL)
        return;
    if (t->owns)
        ferry_backend_free(t->be, t->data);
    free(t);
}

ferry_tensor ferry_tensor_wrap(ferry_backend *be, ferry_dtype dt, ferry_shape shape, void *data) {
    ferry_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.shape = shape;
    t.data = data;
    t.be = be;
    t.owns = 0;
    return t;
}

ferry_tensor ferry_tensor_view(const ferry_tensor *base, int64_t offset, ferry_shape shape) {
    FERRY_ASSERT(offset >= 0 && offset + ferry_shape_numel(shape) <= ferry_tensor_numel(base));
    char *p = (char *)base->data + (size_t)offset * ferry_dtype_size(base->dtype);
    return ferry_tensor_wrap(base->be, base->dtype, shape, p);
}

int64_t ferry_tensor_numel(const ferry_tensor *t) {
    return ferry_shape_numel(t->shape);
}

size_t ferry_tensor_nbytes(const ferry_tensor *t) {
    return (size_t)ferry_tensor_numel(t) * ferry_dtype_size(t->dtype);
}

float *ferry_tensor_f32(const ferry_tensor *t) {
    FERRY_ASSERT(t->dtype == FERRY_DTYPE_F32);
    return (float *)t->data;
}

int32_t *ferry_tensor_i32(const ferry_tensor *t) {
    FERRY_ASSERT(t->dtype == FERRY_DTYPE_I32);
    return (int32_t *)t->data;
}

ferry_status ferry_tensor_from_host(ferry_tensor *t, const void *src) {
    return ferry_backend_copy(t->be, t->data, src, ferry_tensor_nbytes(t),
                              FERRY_COPY_HOST_TO_DEVICE);
}

ferry_status ferry_tensor_to_host(const ferry_tensor *t, void *dst) {
    return ferry_backend_copy(t->be, dst, t->data, ferry_tensor_nbytes(t),
                              FERRY_COPY_DEVICE_TO_HOST);
}
