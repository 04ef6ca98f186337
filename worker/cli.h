/* cli.h - ferry-trainer's command line (cli.c): the flag table and the environment
 * variables --help lists. */
#ifndef FERRY_TRAINER_CLI_H
#define FERRY_TRAINER_CLI_H

#include <stdbool.h>

#include "common/core/flags.h"
#include "ferry/optim.h"
#include "worker/trainer.h"

#define FERRY_TRAINER_MAX_FLAGS 128

/* The flags over one configuration, and the values that are the command line's own. */
typedef struct ferry_trainer_cli {
    bool local;         /* --local */
    const char *preset; /* --preset (also peeked before parsing: presets apply first) */
    int log_level, log_format;
    int world, rank; /* -1: from the environment (ferry_trainer_membership) */
    const char *elastic; /* --elastic MIN:MAX, or NULL */
    int elastic_batch;   /* --elastic-batch: 0 global, 1 per-rank, -1 not given */
    ferry_flag flags[FERRY_TRAINER_MAX_FLAGS];
    int nflags;
    char optim_help[FERRY_OPTIM_FIELD_COUNT][160];
} ferry_trainer_cli;

/* Fills cli's table with every flag, each pointing into cfg or cli; the defaults of
 * cli's own values (log level info, world and rank from the environment). */
void ferry_trainer_cli_init(ferry_trainer_cli *cli, ferry_trainer_config *cfg);

/* NULL-terminated "NAME", "what it does" pairs (ferry_flags.env). */
extern const char *const ferry_trainer_env[];

#endif /* FERRY_TRAINER_CLI_H */
