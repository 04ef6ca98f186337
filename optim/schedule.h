/* schedule.h - learning-rate schedules applied at the end of each epoch: none; step
 * decay (Zaremba et al.'s "after epoch E multiply by gamma every epoch", and torch's
 * StepLR "every N epochs"); and decay on a validation plateau (torch's
 * ReduceLROnPlateau, mode "min", relative threshold). The state is a plain struct the
 * caller owns and may checkpoint as is.
 *
 *     ferry_lr_schedule_config sc = ferry_lr_schedule_defaults(FERRY_LR_SCHEDULE_STEP);
 *     sc.gamma = 0.5;  sc.start = 4;              // --lr-decay 0.5 --lr-decay-start 4
 *     ferry_lr_schedule s;  ferry_lr_schedule_init(&s, &sc);
 *     for (int epoch = 1; epoch <= epochs; epoch++) {
 *         ... train, validate ...
 *         ferry_optim_set_lr(opt, ferry_lr_schedule_epoch_end(&s, epoch, val_loss,
 *                                                             ferry_optim_get_lr(opt)));
 *     }
 */
#ifndef FERRY_SCHEDULE_H
#define FERRY_SCHEDULE_H

#include "ferry/status.h"

typedef enum ferry_lr_schedule_kind {
    FERRY_LR_SCHEDULE_NONE = 0,
    FERRY_LR_SCHEDULE_STEP = 1,
    FERRY_LR_SCHEDULE_PLATEAU = 2,
} ferry_lr_schedule_kind;

typedef struct ferry_lr_schedule_config {
    ferry_lr_schedule_kind kind;
    double gamma; /* step: factor per decay; plateau: factor (torch "factor"); in (0, 1] */
    /* step: the lr is multiplied by gamma at the end of epoch e (1-based) when e >= start
     * and (e - start) % every == 0. start = E, every = 1 is Zaremba's schedule (epoch E+1
     * is the first with the decayed lr); start = every = N is torch StepLR(step_size=N).
     * start = 0 means start = every. */
    int start, every;
    /* plateau: an epoch improves when val_loss < best * (1 - threshold); after more than
     * `patience` epochs without improvement lr becomes max(lr * gamma, lr_min) (skipped if
     * that changes it by 1e-8 or less), and `cooldown` epochs follow in which bad epochs
     * are not counted. */
    int patience, cooldown;
    double threshold, lr_min;
} ferry_lr_schedule_config;

typedef struct ferry_lr_schedule {
    ferry_lr_schedule_config cfg;
    double best;       /* plateau: best validation loss so far (+inf at start) */
    int bad_epochs;    /* plateau: epochs since the last improvement */
    int cooldown_left; /* plateau */
} ferry_lr_schedule;

/* torch's defaults: step: gamma 0.1, every 1, start = every; plateau: factor 0.1,
 * patience 10, threshold 1e-4, cooldown 0, lr_min 0. */
ferry_lr_schedule_config ferry_lr_schedule_defaults(ferry_lr_schedule_kind kind);
/* "none", "step" or "plateau"; FERRY_ERR_INVALID listing them otherwise. */
ferry_status ferry_lr_schedule_parse_kind(const char *name, ferry_lr_schedule_kind *out);
const char *ferry_lr_schedule_kind_name(ferry_lr_schedule_kind kind);

/* Validates cfg into the caller's *s (FERRY_ERR_INVALID naming the bad field: gamma
 * outside (0, 1], every < 1, start < 0, negative patience, cooldown, threshold or
 * lr_min, an unknown kind). */
ferry_status ferry_lr_schedule_init(ferry_lr_schedule *s, const ferry_lr_schedule_config *cfg);
/* Called once at the end of every epoch (1-based) with that epoch's validation loss
 * (ignored by step decay; NaN counts as no improvement) and the lr it ran with; returns
 * the lr for the next epoch and logs a change at INFO level. */
double ferry_lr_schedule_epoch_end(ferry_lr_schedule *s, int epoch, double val_loss, double lr);

#endif /* FERRY_SCHEDULE_H */
