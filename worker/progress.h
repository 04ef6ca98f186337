/* progress.h - training progress on stderr. On a terminal, one line redrawn in place:
 *     epoch 1 [=========>          ] 200/2323 | 12345 tok/s | loss 5.43 | ppl 228.7 |
 *     lr 1.000 | eta 0:14:02                                  (one line, fitted to width)
 * elsewhere (a log file, a pipe, a test), an INFO log line every log interval:
 *     epoch 1 step 200/2323 | lr 1.000 | 12345 tok/s | loss 5.43 | ppl 228.7 |
 *     elapsed 0:01:23 | eta 0:14:02                          (one line)
 * The caller measures (loss, tokens/s, elapsed time); this module only presents, so its
 * output is a pure function of the stats it is given.
 *
 *     ferry_progress_config pc = {.steps = ferry_batch_nwindows(tb, bptt), .log_interval = 200};
 *     ferry_progress *p;
 *     if (ferry_progress_create(&pc, &p) != FERRY_OK) ...
 *     for each step: ferry_progress_update(p, &(ferry_progress_stats){epoch, step, ...});
 *     ferry_progress_finish(p);          before logging anything else, e.g. the eval line
 *     ferry_progress_destroy(p);
 */
#ifndef FERRY_WORKER_PROGRESS_H
#define FERRY_WORKER_PROGRESS_H

#include <stdint.h>

#include "ferry/status.h"

typedef enum ferry_progress_mode {
    FERRY_PROGRESS_AUTO = 0, /* TTY if stderr is a terminal, else PLAIN; see create */
    FERRY_PROGRESS_TTY,      /* the redrawn bar (forced: also when stderr is a file) */
    FERRY_PROGRESS_PLAIN,    /* log lines every log_interval steps */
    FERRY_PROGRESS_OFF,      /* nothing */
} ferry_progress_mode;

typedef struct ferry_progress_config {
    ferry_progress_mode mode;
    int64_t steps;        /* steps (BPTT windows) this epoch will take: the bar's 100% (the
                             epoch's windows, or fewer when --max-steps ends it); >= 1 */
    int64_t first;        /* steps of the epoch done before this process began it (a
                             resume): the ETA extrapolates from the pace of the others */
    int64_t log_interval; /* PLAIN: a line when step % log_interval == 0; 0 means 200 */
    double redraw_s;      /* TTY: least seconds between redraws; 0 means 0.1 */
} ferry_progress_config;

typedef struct ferry_progress_stats {
    int epoch;           /* 1-based */
    int64_t step;        /* steps done in this epoch, 1..steps */
    double loss;         /* mean cross-entropy (nats/token) over the recent steps */
    double lr;           /* current learning rate */
    double tokens_per_s; /* training throughput */
    double elapsed_s;    /* seconds since the epoch (or its resumed part) began; the ETA
                            extrapolates from it */
    const char *note;    /* NULL, or a short text shown after the loss (e.g. the pipeline's
                            busy and bubble fractions) */
} ferry_progress_stats;

typedef struct ferry_progress ferry_progress; /* opaque */

/* Creates a progress reporter in *out; release it with ferry_progress_destroy().
 * AUTO resolves once here: the environment variable FERRY_PROGRESS=plain|tty|off picks
 * that mode, otherwise TTY when isatty(stderr), else PLAIN. An explicit mode in cfg
 * wins over the environment. FERRY_ERR_INVALID for steps < 1, first outside
 * [0, steps], a negative log_interval or redraw_s; FERRY_ERR_NOMEM. *out is unchanged on failure.
 */
ferry_status ferry_progress_create(const ferry_progress_config *cfg, ferry_progress **out);

/* Ends an open TTY line (as ferry_progress_finish) and frees p. NULL is a no-op. */
void ferry_progress_destroy(ferry_progress *p);

/* The mode chosen at creation (never AUTO). */
ferry_progress_mode ferry_progress_get_mode(const ferry_progress *p);

/* Reports the state after a step. TTY: redraws the line if redraw_s has passed since the
 * last redraw, or at the last step, or when the epoch changed (the previous epoch's
 * line is ended first); the bar fits the terminal width (TIOCGWINSZ, 100 columns when
 * unknown). PLAIN: one ferry_log INFO line when step is a multiple of log_interval.
 * Non-finite numbers print as "nan"/"inf"; an ETA that cannot be known prints as
 * "-:--:--". Output errors are ignored (progress is advisory). Not thread-safe. */
void ferry_progress_update(ferry_progress *p, const ferry_progress_stats *s);

/* TTY: draws the last stats given, if not on screen yet, and ends the line, so that the
 * next output starts on a fresh line. PLAIN and OFF: nothing. Safe to call twice. */
void ferry_progress_finish(ferry_progress *p);

/* Formats h:mm:ss (seconds rounded down) into buf; "-:--:--" for a negative or
 * non-finite time. Returns buf. */
char *ferry_progress_hms(double seconds, char *buf, size_t cap);

#endif /* FERRY_WORKER_PROGRESS_H */
