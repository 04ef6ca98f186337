/* batch.h - batchify a token stream and cut it into truncated-BPTT windows, as
 * pytorch/examples word_language_model main.py does (batchify + get_batch).
 * The stream is trimmed to a multiple of B and laid out as (nstep, B) row-major, where
 * column b is the b-th contiguous slice of the stream:
 *     data[t*B + b] = stream[b*nstep + t],   nstep = n / B.
 * Window i covers rows [i*bptt, min(i*bptt + bptt, nstep - 1)); its targets are the same
 * rows shifted down by one, so a window's inputs and targets are both (T, B) views into
 * the one array and nothing is copied per step.
 *
 *     ferry_batches *tb;
 *     ferry_status st = ferry_batch_create(train_ids, n_train, 20, &tb);    B = 20
 *     for (int64_t start = 0; start < ferry_batch_nstep(tb) - 1; start += bptt) {
 *         ferry_window w;
 *         ferry_batch_window(tb, start, bptt, &w);   w.inputs, w.targets: (w.T, w.B)
 *         ...
 *     }
 *     ferry_batch_destroy(tb);
 * Evaluation uses the same object with its own B (10 for PTB valid/test in the
 * literature). */
#ifndef FERRY_WORKER_BATCH_H
#define FERRY_WORKER_BATCH_H

#include <stdint.h>

#include "ferry/status.h"

typedef struct ferry_batches ferry_batches; /* opaque: one split laid out as (nstep, B) */

/* One BPTT window: both arrays point into the ferry_batches and stay valid until it is
 * destroyed. targets[t*B + b] is the token that follows inputs[t*B + b] in column b. */
typedef struct ferry_window {
    int64_t start;          /* first row of the window */
    int T;                  /* rows in the window, 1 <= T <= bptt */
    int B;                  /* columns (batch size) */
    const int32_t *inputs;  /* (T, B) token ids */
    const int32_t *targets; /* (T, B) next-token ids */
} ferry_window;

/* Lays out the first (n / B) * B tokens of stream as (n / B, B) in a new object stored
 * in *out (the stream is copied; the caller keeps it). Release with
 * ferry_batch_destroy(). FERRY_ERR_INVALID (one line naming n and B) if B < 1 or the
 * stream is too short to give any window (n / B < 2); FERRY_ERR_NOMEM. *out is
 * unchanged on failure. */
ferry_status ferry_batch_create(const int32_t *stream, int64_t n, int B, ferry_batches **out);
void ferry_batch_destroy(ferry_batches *b); /* NULL is a no-op */

/* Rows (nstep = n / B) and columns (B) of the layout. */
int64_t ferry_batch_nstep(const ferry_batches *b);
int ferry_batch_size(const ferry_batches *b);

/* The whole (nstep, B) row-major array. */
const int32_t *ferry_batch_data(const ferry_batches *b);

/* Windows per epoch for a fixed bptt >= 1: ceil((nstep - 1) / bptt). */
int64_t ferry_batch_nwindows(const ferry_batches *b, int bptt);

/* Target tokens per epoch: (nstep - 1) * B, whatever the bptt. */
int64_t ferry_batch_tokens(const ferry_batches *b);

/* Fills *w with the window starting at row start (0 <= start < nstep - 1) of at most
 * bptt rows (bptt >= 1). Taking the start row rather than a window index lets a caller
 * vary the length per window. FERRY_ERR_RANGE for a start outside [0, nstep - 1),
 * FERRY_ERR_INVALID for bptt < 1; *w is unchanged on failure. */
ferry_status ferry_batch_window(const ferry_batches *b, int64_t start, int bptt, ferry_window *w);

#endif /* FERRY_WORKER_BATCH_H */
