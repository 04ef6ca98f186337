/* flags.h - a small declarative command-line parser shared by ferry-ps and ferry-trainer.
 * A program describes its flags in a table that points at the fields of its config
 * struct; the values already there are the defaults that --help shows. Both "--name
 * value" and "--name=value" are accepted; bool flags take no separate value ("--name",
 * "--no-name", "--name=true|false|1|0|yes|no|on|off"). The last occurrence wins.
 * The parser never exits and never prints errors: it returns a status with a one-line
 * ferry_errorf message, and main decides.
 *
 *     static const ferry_flag flags[] = {
 *         {.name = "data", .type = FERRY_FLAG_STRING, .ptr = &cfg.data, .required = true,
 *          .help = "corpus directory (train.txt, valid.txt, test.txt)", .metavar = "DIR"},
 *         {.name = "lr", .type = FERRY_FLAG_FLOAT, .ptr = &cfg.lr, .help = "learning rate",
 *          .min = 0, .max = 1e6},
 *         {.name = "optimizer", .type = FERRY_FLAG_ENUM, .ptr = &cfg.optim,
 *          .choices = "sgd|adagrad|adadelta|adam|adamw", .help = "update rule"},
 *     };
 *     ferry_flags fs = {"ferry-trainer", "trains an LSTM language model", flags, 3};
 *     bool help;
 *     if (ferry_flags_parse(&fs, argc, argv, &help) != FERRY_OK) {
 *         fprintf(stderr, "ferry-trainer: %s\n", ferry_error_last());
 *         return 2;
 *     }
 *     if (help) return 0;
 */
#ifndef FERRY_FLAGS_H
#define FERRY_FLAGS_H

#include <stdbool.h>
#include <stdio.h>

#include "ferry/status.h"

typedef enum ferry_flag_type {
    FERRY_FLAG_INT,    /* ptr: int *; decimal */
    FERRY_FLAG_INT64,  /* ptr: int64_t *; decimal */
    FERRY_FLAG_FLOAT,  /* ptr: float *; anything strtod reads, finite unless .nonfinite */
    FERRY_FLAG_DOUBLE, /* ptr: double *; likewise */
    FERRY_FLAG_STRING, /* ptr: const char **; points into argv afterwards (not copied) */
    FERRY_FLAG_BOOL,   /* ptr: bool * */
    FERRY_FLAG_ENUM,   /* ptr: int *; set to the index of the value in .choices */
} ferry_flag_type;

typedef struct ferry_flag {
    const char *name; /* without the leading "--": "lr", "metrics-out" */
    ferry_flag_type type;
    void *ptr;           /* the config field, of the type named above */
    const char *help;    /* one line for --help */
    const char *choices; /* ENUM only: allowed values separated by '|' */
    const char *metavar; /* shown in --help after the name; NULL: derived from the type */
    double min, max;     /* numbers: the inclusive range, checked when min < max */
    bool nonfinite;      /* FLOAT/DOUBLE: accept nan, inf and -inf */
    bool required;       /* parsing fails unless the flag is given */
    /* --help's "(default ...)" text when the field's initial value is not what the
     * program uses (a sentinel such as -1 or 0 that it resolves later), e.g.
     * "1, or OPENBLAS_NUM_THREADS". NULL: the field's value. */
    const char *defval;
} ferry_flag;

typedef struct ferry_flags {
    const char *prog;        /* program name for the usage line */
    const char *summary;     /* one line printed under the usage line (may be NULL) */
    const ferry_flag *flags; /* (nflags,) */
    int nflags;
    /* NULL-terminated "NAME", "what it does" pairs: the environment variables the
     * program reads, listed at the end of --help (may be NULL). */
    const char *const *env;
    /* --help's last section, what the exit codes mean; NULL: FERRY_FLAGS_EXIT_STATUS. */
    const char *exit_status;
} ferry_flags;

/* The exit codes every ferry program uses: 2 when the command line is wrong (main
 * found it before doing anything), 1 when the work failed. */
#define FERRY_EXIT_RUNTIME 1
#define FERRY_EXIT_USAGE   2
#define FERRY_FLAGS_EXIT_STATUS                                                                    \
    "0 done; 1 the run failed; 2 bad command line (unknown flag, bad value, flags that "           \
    "exclude each other)"

/* "--version" prints "<prog> <FERRY_VERSION>" to stdout and stops like --help.
 * Parses argv[1..argc-1] into the fields the table points at. On "--help" or "-h" it
 * prints the usage to stdout, stops, sets *help (which must not be NULL) and returns
 * FERRY_OK; otherwise *help is false. Errors (FERRY_ERR_INVALID, or FERRY_ERR_RANGE for
 * a value outside the range), each one ferry_errorf line:
 *   "unknown flag --foo (see --help)",  "unexpected argument 'x' (see --help)",
 *   "missing value for --lr",  "--lr: 'abc' is not a number",
 *   "--epochs: '2.5' is not an integer",  "--epochs: '-3' is out of range [1, 1000000]",
 *   "--optimizer: 'rmsprop' is not one of sgd|adagrad|adadelta|adam|adamw",
 *   "--verbose: 'maybe' is not a boolean (true|false)",  "missing required flag --data".
 * Fields of flags parsed before an error keep their new values. Not thread-safe (it
 * writes the fields the table points at). */
ferry_status ferry_flags_parse(const ferry_flags *fs, int argc, char *const argv[], bool *help);

/* Writes "usage: prog [flags]", the summary, then one aligned line per flag with its
 * help text, its current value as the default (or .defval) and its range, numbers in
 * their shortest exact form (0.99, not 0.98999999999999999), the environment and the
 * exit status, to out. A numeric default outside the flag's range without a .defval is
 * a table mistake (asserted). */
void ferry_flags_usage(const ferry_flags *fs, FILE *out);

/* The value of the last "--name VALUE" or "--name=VALUE" in argv[1..argc-1], or NULL:
 * for the few flags a program must know before it parses the rest (--preset, whose
 * values the other flags override; --log-format, which the error of a bad command
 * line is written in). Does not validate anything. */
const char *ferry_flags_peek(int argc, char *const argv[], const char *name);

/* Environment variable `name` as a whole decimal number in [lo, hi]; `fallback` when
 * it is unset, empty, not such a number, or out of range (read anew on every call). */
int ferry_env_int(const char *name, int lo, int hi, int fallback);

#endif /* FERRY_FLAGS_H */
