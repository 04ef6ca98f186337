/* schedule.c - learning-rate schedules at epoch boundaries: step decay and decay on a
 * validation-loss plateau (torch's StepLR and ReduceLROnPlateau semantics). */
#include <math.h>
#include <string.h>

#include "common/core/log.h"
#include "optim/schedule.h"

static const char *const schedule_names[] = {"none", "step", "plateau"};
#define SCHEDULE_COUNT ((int)(sizeof schedule_names / sizeof schedule_names[0]))

const char *ferry_lr_schedule_kind_name(ferry_lr_schedule_kind kind) {
    return (int)kind >= 0 && (int)kind < SCHEDULE_COUNT ? schedule_names[kind] : "unknown";
}

ferry_status ferry_lr_schedule_parse_kind(const char *name, ferry_lr_schedule_kind *out) {
    for (int k = 0; name != NULL && k < SCHEDULE_COUNT; k++) {
        if (strcmp(name, schedule_names[k]) == 0) {
            *out = (ferry_lr_schedule_kind)k;
            return FERRY_OK;
        }
    }
    return ferry_errorf(FERRY_ERR_INVALID, "unknown lr schedule '%s' (expected none|step|plateau)",
                        name ? name : "(null)");
}

ferry_lr_schedule_config ferry_lr_schedule_defaults(ferry_lr_schedule_kind kind) {
    ferry_lr_schedule_config c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.gamma = 0.1;
    c.every = 1;
    c.start = 0;
    c.patience = 10;
    c.threshold = 1e-4;
    return c;
}

ferry_status ferry_lr_schedule_init(ferry_lr_schedule *s, const ferry_lr_schedule_config *cfg) {
    if ((int)cfg->kind < 0 || (int)cfg->kind >= SCHEDULE_COUNT)
        return ferry_errorf(FERRY_ERR_INVALID, "lr schedule: unknown kind %d", (int)cfg->kind);
    if (cfg->kind != FERRY_LR_SCHEDULE_NONE && !(cfg->gamma > 0.0 && cfg->gamma <= 1.0))
        return ferry_errorf(FERRY_ERR_INVALID, "lr schedule: decay factor %g outside (0, 1]",
                            cfg->gamma);
    if (cfg->kind == FERRY_LR_SCHEDULE_STEP && (cfg->every < 1 || cfg->start < 0))
        return ferry_errorf(FERRY_ERR_INVALID,
                            "lr schedule: step decay needs every >= 1 and start >= 0 (got %d, %d)",
                            cfg->every, cfg->start);
    if (cfg->kind == FERRY_LR_SCHEDULE_PLATEAU &&
        (cfg->patience < 0 || cfg->cooldown < 0 || !(cfg->threshold >= 0.0) ||
         !(cfg->lr_min >= 0.0) || !isfinite(cfg->threshold) || !isfinite(cfg->lr_min)))
        return ferry_errorf(FERRY_ERR_INVALID,
                            "lr schedule: plateau needs patience, cooldown, threshold and lr_min "
                            ">= 0 (got %d, %d, %g, %g)",
                            cfg->patience, cfg->cooldown, cfg->threshold, cfg->lr_min);
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    if (s->cfg.kind == FERRY_LR_SCHEDULE_STEP && s->cfg.start == 0)
        s->cfg.start = s->cfg.every;
    s->best = HUGE_VAL;
    return FERRY_OK;
}

/* ReduceLROnPlateau.step (mode min, threshold_mode rel, eps 1e-8). */
static double plateau_epoch_end(ferry_lr_schedule *s, double val_loss, double lr) {
    const ferry_lr_schedule_config *c = &s->cfg;
    if (val_loss < s->best * (1.0 - c->threshold)) {
        s->best = val_loss;
        s->bad_epochs = 0;
    } else {
        s->bad_epochs++;
    }
    if (s->cooldown_left > 0) {
        s->cooldown_left--;
        s->bad_epochs = 0; /* bad epochs are ignored during cooldown */
    }
    if (s->bad_epochs > c->patience) {
        double next = fmax(lr * c->gamma, c->lr_min);
        s->cooldown_left = c->cooldown;
        s->bad_epochs = 0;
        if (lr - next > 1e-8)
            return next;
    }
    return lr;
}

double ferry_lr_schedule_epoch_end(ferry_lr_schedule *s, int epoch, double val_loss, double lr) {
    double next = lr;
    const ferry_lr_schedule_config *c = &s->cfg;
    if (c->kind == FERRY_LR_SCHEDULE_STEP) {
        if (epoch >= c->start && (epoch - c->start) % c->every == 0)
            next = lr * c->gamma;
    } else if (c->kind == FERRY_LR_SCHEDULE_PLATEAU) {
        next = plateau_epoch_end(s, val_loss, lr);
    }
    if (next != lr)
        FERRY_LOG_INFO("epoch %d: learning rate %g -> %g (%s schedule)", epoch, lr, next,
                       ferry_lr_schedule_kind_name(c->kind));
    return next;
}
