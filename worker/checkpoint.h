/* checkpoint.h - ferry-trainer checkpoints: the training configuration, where the
 * run is (epoch, next window, step, learning rate, schedule state), the carried
 * LSTM state, the parameter block and the optimizer state, and the list of server
 * files of the same checkpoint id, in one ckfile (common/core/ckfile.h: sections
 * with lengths and CRC-32s, committed by an atomic rename).
 *
 * Names: `--save BASE` writes BASE.<step> (one trainer) or BASE.r<rank>.<step> (a
 * rank of a job), keeps the newest K, and `--load BASE` takes the newest complete
 * one (falling back past damaged ones, each named in the log); `--load FILE` of an
 * existing file takes exactly that file. Dropout masks are a function of (seed,
 * step), so the step is the random-number state. */
#ifndef FERRY_CHECKPOINT_H
#define FERRY_CHECKPOINT_H

#include <stdint.h>

#include "ferry/optim.h"
#include "optim/schedule.h"
#include "worker/model.h"
#include "worker/trainer.h"

typedef struct ferry_ck_progress {
    int epoch;        /* the epoch to continue (1-based) */
    int64_t window;   /* its next window; 0: the epoch starts afresh (state zeroed) */
    int64_t step;     /* optimizer steps done */
    float lr;
    ferry_lr_schedule sched;
    uint64_t vocab_hash;
    int has_state;    /* the carried LSTM state was saved (window > 0) */
} ferry_ck_progress;

/* Writes path (atomically). manifest: "server i host:port file" lines, or NULL. */
ferry_status ferry_checkpoint_save(const char *path, const ferry_trainer_config *cfg,
                                   const ferry_lm *lm, const ferry_optim *opt,
                                   const ferry_ck_progress *pr, const char *manifest);
/* Loads into an already-built model and optimizer (and the carried state when one
 * was saved). A file of another model shape or vocabulary is refused with a
 * message naming both sides (FERRY_ERR_INVALID); a damaged or foreign file gives
 * FERRY_ERR_FORMAT naming the file and what is wrong. */
ferry_status ferry_checkpoint_load(const char *path, ferry_lm *lm, ferry_optim *opt,
                                   uint64_t vocab_hash, ferry_ck_progress *pr);

/* Sets every field the checkpoint carries in cfg (strings are copied into
 * strings[cap], which must outlive cfg). */
ferry_status ferry_checkpoint_read_config(const char *path, ferry_trainer_config *cfg,
                                          char *strings, size_t cap);
/* FERRY_ERR_INVALID naming the flag and both values when `now` changes a field the
 * checkpoint fixes (the model, data layout, optimizer, schedule, seed, job). */
ferry_status ferry_checkpoint_check_config(const char *path, const ferry_trainer_config *file,
                                           const ferry_trainer_config *now);

/* BASE.<step> (rank < 0) or BASE.r<rank>.<step>. */
void ferry_checkpoint_part(const char *base, int rank, int64_t step, char *out, size_t cap);
/* The steps of the complete (verified) checkpoints of base, ascending; damaged ones
 * are logged by name and left out. *steps is malloc'd. */
ferry_status ferry_checkpoint_steps(const char *base, int rank, int64_t **steps, size_t *n);
/* The file --load means: base itself when it is a file, else the newest complete
 * BASE.<step>; *found 0 when there is none. */
ferry_status ferry_checkpoint_resolve(const char *base, int rank, char *out, size_t cap,
                                      int *found);
/* Deletes all but the newest `keep` BASE.<step> files. */
void ferry_checkpoint_retain(const char *base, int rank, int keep);
/* Removes this rank's temporary files of part writes a kill interrupted in base's
 * directory (".<base>.r<rank>.<step>.XXXXXX", or ".<base>.<step>.XXXXXX" for rank -1,
 * holding a FERRYCK2 file or a prefix of one); other ranks' are theirs. Logs what it
 * removed. Call it when this process is not writing a part. base NULL: nothing. */
void ferry_checkpoint_sweep_temps(const char *base, int rank);

#endif /* FERRY_CHECKPOINT_H */
