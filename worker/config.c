/* config.c - ferry-trainer's configuration: defaults, the PTB presets (Zaremba et
 * al.'s small, medium and large), the optimizer's settings, names, and a rank's
 * membership from the flags or a launcher's environment (Slurm, a Kubernetes indexed Job). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/core/log.h"
#include "ferry/optim.h"
#include "optim/schedule.h"
#include "worker/trainer.h"

ferry_optim_config ferry_trainer_optim(const ferry_trainer_config *cfg) {
    ferry_optim_config oc = ferry_optim_defaults((ferry_optim_kind)cfg->optimizer);
    for (int i = 0; i < FERRY_OPTIM_FIELD_COUNT; i++) {
        if (ferry_optim_fields[i].is_int)
            ferry_optim_field_set(&oc, i, cfg->optim_switch[i] ? 1.0 : 0.0);
        else if (!isnan(cfg->optim[i])) /* at float precision, as the learning rate the
                                             trainer schedules and sends the shards is */
            ferry_optim_field_set(&oc, i, (double)(float)cfg->optim[i]);
    }
    return oc;
}

void ferry_trainer_config_default(ferry_trainer_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->data = "data/ptb";
    cfg->device = "cpu";
    cfg->decoder_mode = 1; /* sharded-softmax */
    cfg->emsize = 200;
    cfg->nhid = 200;
    cfg->nlayers = 2;
    cfg->dropout = 0.0f;
    cfg->init_scale = 0.1f;
    cfg->batch_size = 20;
    cfg->bptt = 20;
    cfg->eval_batch_size = 10;
    cfg->epochs = 13;
    cfg->optimizer = FERRY_OPTIM_SGD;
    for (int i = 0; i < FERRY_OPTIM_FIELD_COUNT; i++)
        cfg->optim[i] = NAN; /* the optimizer's default (lr 1.0 for SGD) */
    cfg->clip = 5.0f;
    cfg->loss_scale = FERRY_LOSS_SCALE_SUM_TIME;
    cfg->schedule = FERRY_LR_SCHEDULE_STEP;
    cfg->lr_decay = 0.5f;
    cfg->lr_decay_start = 4;
    cfg->lr_decay_every = 1;
    cfg->patience = 0;
    cfg->seed = 1;
    cfg->progress = 0;
    cfg->log_interval = 200;
    cfg->threads = 1;
    cfg->micro_batches = 1;
    cfg->deadline_ms = 10000;
    cfg->world = 1;
    cfg->rank = 0;
    cfg->job = "ferry";
    cfg->sync = NULL;
    cfg->sync_timeout_s = 60.0;
    cfg->membership = "default";
    cfg->checkpoint_every = 0;
    cfg->keep_checkpoints = 4;
    cfg->recovery_timeout_s = 300.0;
    cfg->connect_timeout_s = 30.0;
    cfg->resolve_timeout_s = 0.0;
    cfg->eval_batches = -1;
}

/* An environment variable as a non-negative int: 1 and *out set, 0 when unset,
 * -1 (with an error naming it) when it is not a number. */
static int env_int(const char *(*get)(const char *), const char *name, int *out) {
    const char *v = get(name);
    if (v == NULL || v[0] == '\0')
        return 0;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end != '\0' || x < 0 || x > 65536) {
        (void)ferry_errorf(FERRY_ERR_INVALID, "%s='%.32s' is not a number in [0, 65536]", name, v);
        return -1;
    }
    *out = (int)x;
    return 1;
}

ferry_status ferry_trainer_check_name(const char *flag, const char *name, const char *what) {
    size_t n = strlen(name);
    if (n == 0 || n > 48 ||
        strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") != n)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "%s '%.64s': 1..48 characters of [A-Za-z0-9_.-] (it prefixes the "
                            "%s's module names)",
                            flag, name, what);
    return FERRY_OK;
}

int ferry_trainer_is_job(const ferry_trainer_config *cfg) {
    return cfg->ps != NULL && (cfg->world > 1 || cfg->sync != NULL || cfg->elastic_max > 0 ||
                               cfg->checkpoint_every > 0 ||
                               cfg->save != NULL || cfg->load != NULL);
}

ferry_status ferry_trainer_membership(ferry_trainer_config *cfg, int world_flag, int rank_flag,
                                      const char *(*get)(const char *), char *why, size_t cap) {
    static const char *const world_vars[] = {"FERRY_WORLD", "SLURM_NTASKS"};
    static const char *const rank_vars[] = {"FERRY_RANK", "SLURM_PROCID", "JOB_COMPLETION_INDEX"};
    const char *wsrc = "--world", *rsrc = "--rank";
    int world = world_flag, rank = rank_flag, r = 0;
    if (world < 0) {
        wsrc = "default";
        world = 1;
        for (size_t i = 0; i < sizeof world_vars / sizeof *world_vars && r == 0; i++) {
            if ((r = env_int(get, world_vars[i], &world)) > 0)
                wsrc = world_vars[i];
        }
        if (r < 0)
            return FERRY_ERR_INVALID;
    }
    if (rank < 0) {
        rsrc = "default";
        rank = 0;
        r = 0;
        for (size_t i = 0; i < sizeof rank_vars / sizeof *rank_vars && r == 0; i++) {
            if ((r = env_int(get, rank_vars[i], &rank)) > 0)
                rsrc = rank_vars[i];
        }
        if (r < 0)
            return FERRY_ERR_INVALID;
    }
    if (world < 1)
        return ferry_errorf(FERRY_ERR_INVALID, "world %d (from %s) must be at least 1", world,
                            wsrc);
    if (rank >= world)
        return ferry_errorf(FERRY_ERR_INVALID, "rank %d (from %s) outside [0, %d) (world from %s)",
                            rank, rsrc, world, wsrc);
    cfg->world = world;
    cfg->rank = rank;
    const char *job = get("FERRY_JOB");
    if (job != NULL && job[0] != '\0' && strcmp(cfg->job, "ferry") == 0)
        cfg->job = job;
    (void)snprintf(why, cap, "rank %d from %s, world %d from %s", rank, rsrc, world, wsrc);
    cfg->membership = why;
    return FERRY_OK;
}

int ferry_trainer_config_preset(ferry_trainer_config *cfg, const char *name) {
    if (strcmp(name, "small") == 0) {
        cfg->emsize = cfg->nhid = 200;
        cfg->bptt = 20;
        cfg->dropout = 0.0f;
        cfg->init_scale = 0.1f;
        cfg->epochs = 13;
        cfg->lr_decay = 0.5f;
        cfg->lr_decay_start = 4;
        cfg->clip = 5.0f;
    } else if (strcmp(name, "medium") == 0) {
        cfg->emsize = cfg->nhid = 650;
        cfg->bptt = 35;
        cfg->dropout = 0.5f;
        cfg->init_scale = 0.05f;
        cfg->epochs = 39;
        cfg->lr_decay = 0.8f;
        cfg->lr_decay_start = 6;
        cfg->clip = 5.0f;
    } else if (strcmp(name, "large") == 0) {
        cfg->emsize = cfg->nhid = 1500;
        cfg->bptt = 35;
        cfg->dropout = 0.65f;
        cfg->init_scale = 0.04f;
        cfg->epochs = 55;
        cfg->lr_decay = 1.0f / 1.15f;
        cfg->lr_decay_start = 14;
        cfg->clip = 10.0f;
    } else {
        return 0;
    }
    cfg->nlayers = 2;
    cfg->batch_size = 20;
    return 1;
}
