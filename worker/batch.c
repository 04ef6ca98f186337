/* batch.c - the (nstep, B) layout of a split and its BPTT windows. The transpose from
 * the stream's column-slices into row-major rows is done once at creation, so every
 * window is two pointers into one array. */
#include <stdlib.h>

#include "worker/batch.h"
#include "common/core/log.h" /* FERRY_ASSERT */

struct ferry_batches {
    int32_t *data; /* (nstep, B): data[t*B + b] = stream[b*nstep + t] */
    int64_t nstep;
    int B;
};

ferry_status ferry_batch_create(const int32_t *stream, int64_t n, int B, ferry_batches **out) {
    FERRY_ASSERT(out != NULL && (stream != NULL || n == 0));
    if (B < 1)
        return ferry_errorf(FERRY_ERR_INVALID, "batch size must be at least 1, got %d", B);
    if (n < 0 || n / B < 2)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "a split of %lld tokens is too short for batch size %d "
                            "(it needs at least %lld tokens: two rows of %d)",
                            (long long)n, B, 2LL * B, B);
    ferry_batches *b = calloc(1, sizeof *b);
    if (b == NULL)
        return ferry_errorf(FERRY_ERR_NOMEM, "out of memory batchifying %lld tokens", (long long)n);
    b->nstep = n / B;
    b->B = B;
    b->data = malloc((size_t)(b->nstep * B) * sizeof *b->data);
    if (b->data == NULL) {
        free(b);
        return ferry_errorf(FERRY_ERR_NOMEM, "out of memory batchifying %lld tokens", (long long)n);
    }
    /* Column by column: each reads one contiguous slice of the stream. The trailing
     * n mod B tokens are dropped, as batchify's narrow() does. */
    for (int col = 0; col < B; col++) {
        const int32_t *src = stream + (int64_t)col * b->nstep; /* (nstep,) slice */
        for (int64_t t = 0; t < b->nstep; t++)
            b->data[t * B + col] = src[t];
    }
    *out = b;
    return FERRY_OK;
}

void ferry_batch_destroy(ferry_batches *b) {
    if (b == NULL)
        return;
    free(b->data);
    free(b);
}

int64_t ferry_batch_nstep(const ferry_batches *b) {
    FERRY_ASSERT(b != NULL);
    return b->nstep;
}

int ferry_batch_size(const ferry_batches *b) {
    FERRY_ASSERT(b != NULL);
    return b->B;
}

const int32_t *ferry_batch_data(const ferry_batches *b) {
    FERRY_ASSERT(b != NULL);
    return b->data;
}

int64_t ferry_batch_nwindows(const ferry_batches *b, int bptt) {
    FERRY_ASSERT(b != NULL && bptt >= 1);
    return (b->nstep - 1 + bptt - 1) / bptt;
}

int64_t ferry_batch_tokens(const ferry_batches *b) {
    FERRY_ASSERT(b != NULL);
    return (b->nstep - 1) * b->B;
}

ferry_status ferry_batch_window(const ferry_batches *b, int64_t start, int bptt, ferry_window *w) {
    FERRY_ASSERT(b != NULL && w != NULL);
    if (bptt < 1)
        return ferry_errorf(FERRY_ERR_INVALID, "bptt must be at least 1, got %d", bptt);
    if (start < 0 || start >= b->nstep - 1)
        return ferry_errorf(FERRY_ERR_RANGE, "window start %lld is outside [0, %lld)",
                            (long long)start, (long long)(b->nstep - 1));
    /* The last row has no successor, so a window ends at row nstep - 1 at the latest. */
    int64_t T = b->nstep - 1 - start;
    if (T > bptt)
        T = bptt;
    w->start = start;
    w->T = (int)T;
    w->B = b->B;
    w->inputs = b->data + start * b->B;        /* rows [start, start + T) */
    w->targets = b->data + (start + 1) * b->B; /* rows [start + 1, start + T + 1) */
    return FERRY_OK;
}
