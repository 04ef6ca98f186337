/* metrics.h - the trainer's --metrics-out file: one JSON object per line (JSON Lines),
 * flushed as written so that a crashed or running job can be plotted. Lines look like
 *     {"event":"train","epoch":1,"step":200,"loss":5.43,"ppl":228.7,"lr":1,
 *      "tokens_per_s":12345.6,"elapsed_s":83.2}                        (one line)
 *     {"event":"eval","split":"valid","epoch":1,"step":2323,"loss":4.9,"ppl":134.3}
 * Numbers are written with %.9g (integral values below 1e15 in full); NaN and
 * infinities, which JSON cannot express, are written as null. */
#ifndef FERRY_WORKER_METRICS_H
#define FERRY_WORKER_METRICS_H

#include <stdint.h>

#include "ferry/status.h"

typedef struct ferry_metrics ferry_metrics; /* opaque: an open metrics file */

/* Creates (or truncates) the file at path, or uses standard output for "-", and stores
 * the writer in *out; release it with ferry_metrics_close(). FERRY_ERR_IO naming the
 * path and the system's reason if it cannot be opened for writing; FERRY_ERR_NOMEM.
 * *out is unchanged on failure. */
ferry_status ferry_metrics_open(const char *path, ferry_metrics **out);
/* append 1: adds to an existing file (a resumed run keeps both parts). */
ferry_status ferry_metrics_open_mode(const char *path, int append, ferry_metrics **out);

/* Flushes, closes the file (not standard output) and frees m. FERRY_ERR_IO if the final
 * flush or close failed (the data may be lost); m is freed either way. NULL is a no-op
 * returning FERRY_OK. */
ferry_status ferry_metrics_close(ferry_metrics *m);

/* Writes a "train" line with the fields shown above. */
ferry_status ferry_metrics_train(ferry_metrics *m, int epoch, int64_t step, double loss, double ppl,
                                 double lr, double tokens_per_s, double elapsed_s);

/* Writes an "eval" line; split is "valid" or "test" (any string; it is JSON-escaped). */
ferry_status ferry_metrics_eval(ferry_metrics *m, const char *split, int epoch, int64_t step,
                                double loss, double ppl);

/* Writes {"event":<event>,<keys[0]>:<values[0]>,...} for n >= 0 pairs, for fields that
 * later features add (e.g. "stiefel_penalty_l0", "feasibility_l0"). Keys are escaped,
 * not checked for repeats. */
ferry_status ferry_metrics_write_kv(ferry_metrics *m, const char *event, int n,
                                    const char *const keys[], const double values[]);

/* All writers: one whole line per call, flushed; FERRY_ERR_IO naming the path if the
 * write or flush fails (disk full, closed pipe); FERRY_ERR_NOMEM. Not thread-safe per
 * writer; lines written by one thread never interleave. */

#endif /* FERRY_WORKER_METRICS_H */
