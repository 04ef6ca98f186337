/* checkpoint.h - trainer checkpoints: model shape, vocabulary hash, progress
 * (epoch, step, lr), the parameter block and the optimizer state, in one file
 * written atomically (temporary file, fsync, rename). */
#ifndef FERRY_CHECKPOINT_H
#define FERRY_CHECKPOINT_H

#include <stdint.h>

#include "worker/model.h"
#include "ferry/optim.h"

typedef struct ferry_checkpoint_info {
    int epoch;    /* epochs completed */
    int64_t step; /* optimizer steps completed */
    float lr;
} ferry_checkpoint_info;

ferry_status ferry_checkpoint_save(const char *path, const ferry_lm *lm, const ferry_optim *opt,
                                   uint64_t vocab_hash, int epoch, int64_t step, float lr);
/* Loads into an already-built model and optimizer. A file of another model shape,
 * vocabulary or optimizer is refused with a message naming both sides
 * (FERRY_ERR_INVALID); a truncated or foreign file gives FERRY_ERR_FORMAT. */
ferry_status ferry_checkpoint_load(const char *path, ferry_lm *lm, ferry_optim *opt,
                                   uint64_t vocab_hash, ferry_checkpoint_info *info);

#endif /* FERRY_CHECKPOINT_H */
