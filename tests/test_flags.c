/* test_flags.c - the declarative flag parser: both value syntaxes, every type, the
 * exact one-line error for each kind of bad input (with "did you mean" for a near
 * miss), the aligned --help text (shortest numbers, sentinel defaults, exit status),
 * and peeking at one flag before parsing. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "common/core/flags.h" /* ferry_flags_parse, ferry_flags_usage */

typedef struct config {
    int epochs;
    int64_t seed;
    float lr;
    double clip;
    const char *data;
    bool tied;
    int optimizer;
} config;

enum { OPT_SGD, OPT_ADAGRAD, OPT_ADADELTA, OPT_ADAM, OPT_ADAMW };

static config cfg;
static ferry_flag table[7];
static ferry_flags fs;

/* Resets the defaults and the table; `required_data` marks --data required. */
static void setup(bool required_data) {
    cfg = (config){.epochs = 40,
                   .seed = 1111,
                   .lr = 20.0f,
                   .clip = 0.25,
                   .data = "data/ptb",
                   .tied = false,
                   .optimizer = OPT_SGD};
    ferry_flag t[7] = {
        {.name = "epochs",
         .type = FERRY_FLAG_INT,
         .ptr = &cfg.epochs,
         .help = "training epochs",
         .min = 1,
         .max = 1000000},
        {.name = "seed", .type = FERRY_FLAG_INT64, .ptr = &cfg.seed, .help = "random seed"},
        {.name = "lr", .type = FERRY_FLAG_FLOAT, .ptr = &cfg.lr, .help = "learning rate"},
        {.name = "clip",
         .type = FERRY_FLAG_DOUBLE,
         .ptr = &cfg.clip,
         .help = "gradient norm clip",
         .nonfinite = true},
        {.name = "data",
         .type = FERRY_FLAG_STRING,
         .ptr = &cfg.data,
         .metavar = "DIR",
         .help = "corpus directory",
         .required = required_data},
        {.name = "tied", .type = FERRY_FLAG_BOOL, .ptr = &cfg.tied, .help = "tie weights"},
        {.name = "optimizer",
         .type = FERRY_FLAG_ENUM,
         .ptr = &cfg.optimizer,
         .choices = "sgd|adagrad|adadelta|adam|adamw",
         .help = "update rule"},
    };
    memcpy(table, t, sizeof t);
    fs = (ferry_flags){"ferry-trainer", "trains a language model", table, 7, NULL, NULL};
}

/* Parses a NULL-terminated argument list (argv[0] supplied). */
static ferry_status parse(const char *const *args) {
    char *argv[32];
    int argc = 0;
    argv[argc++] = (char *)(uintptr_t) "ferry-trainer";
    for (; args[argc - 1] != NULL; argc++)
        argv[argc] = (char *)(uintptr_t)args[argc - 1];
    bool help = true;
    ferry_error_clear();
    ferry_status st = ferry_flags_parse(&fs, argc, argv, &help);
    CHECK(!help);
    return st;
}

/* Expects failure with exactly this message. */
static void expect_error(ferry_status want, const char *msg, const char *const *args) {
    CHECK_STATUS(parse(args), want);
    if (strcmp(ferry_error_last(), msg) != 0) {
        fprintf(stderr, "  got  '%s'\n  want '%s'\n", ferry_error_last(), msg);
        CHECK(0);
    }
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

TEST(values) {
    setup(false);
    CHECK_OK(parse(ARGS("--epochs", "6", "--seed=-9000000000", "--lr", "1e-3", "--clip=inf",
                        "--data", "data/wikitext-2", "--tied", "--optimizer=adamw")));
    CHECK_EQ(cfg.epochs, 6);
    CHECK_EQ(cfg.seed, -9000000000LL);
    CHECK_NEAR(cfg.lr, 1e-3, 1e-9);
    CHECK(cfg.clip > 1e308); /* inf, allowed on this flag */
    CHECK(strcmp(cfg.data, "data/wikitext-2") == 0);
    CHECK(cfg.tied);
    CHECK_EQ(cfg.optimizer, OPT_ADAMW);
    /* Bool spellings, --no-x, negative numbers as separate values, last one wins. */
    CHECK_OK(parse(ARGS("--no-tied", "--lr", "-0.5", "--epochs=2", "--epochs", "3")));
    CHECK(!cfg.tied && cfg.epochs == 3);
    CHECK_NEAR(cfg.lr, -0.5, 0);
    CHECK_OK(parse(ARGS("--tied=yes", "--optimizer", "sgd", "--data=")));
    CHECK(cfg.tied && cfg.optimizer == OPT_SGD && strcmp(cfg.data, "") == 0);
    CHECK_OK(parse(ARGS("--tied=off", "--epochs=1000000", "--epochs=+1")));
    CHECK(!cfg.tied && cfg.epochs == 1);
    /* No arguments keeps every default. */
    setup(false);
    CHECK_OK(parse(ARGS(NULL)));
    CHECK(cfg.epochs == 40 && cfg.seed == 1111 && cfg.optimizer == OPT_SGD);
}

TEST(errors) {
    setup(false);
    expect_error(FERRY_ERR_INVALID, "unknown flag --foo (see --help)", ARGS("--foo", "1"));
    expect_error(FERRY_ERR_INVALID, "unknown flag --foo (see --help)", ARGS("--foo=1"));
    expect_error(FERRY_ERR_INVALID, "unknown flag -x (see --help)", ARGS("-x"));
    expect_error(FERRY_ERR_INVALID, "unknown flag --no-lr (see --help)", ARGS("--no-lr"));
    expect_error(FERRY_ERR_INVALID, "unexpected argument 'train.txt' (see --help)",
                 ARGS("train.txt"));
    expect_error(FERRY_ERR_INVALID, "--lr: 'abc' is not a number", ARGS("--lr", "abc"));
    expect_error(FERRY_ERR_INVALID, "--lr: '1.5x' is not a number", ARGS("--lr=1.5x"));
    expect_error(FERRY_ERR_INVALID, "--lr: '' is not a number", ARGS("--lr="));
    expect_error(FERRY_ERR_INVALID, "--lr: ' 1' is not a number", ARGS("--lr", " 1"));
    expect_error(FERRY_ERR_INVALID, "--lr: 'nan' is not a finite number", ARGS("--lr", "nan"));
    expect_error(FERRY_ERR_INVALID, "--lr: '-inf' is not a finite number", ARGS("--lr=-inf"));
    expect_error(FERRY_ERR_RANGE, "--lr: '1e39' is out of range", ARGS("--lr", "1e39"));
    expect_error(FERRY_ERR_RANGE, "--clip: '1e999' is out of range", ARGS("--clip", "1e999"));
    expect_error(FERRY_ERR_INVALID, "--epochs: '2.5' is not an integer", ARGS("--epochs", "2.5"));
    expect_error(FERRY_ERR_INVALID, "--epochs: '0x10' is not an integer", ARGS("--epochs=0x10"));
    expect_error(FERRY_ERR_INVALID, "--epochs: '-' is not an integer", ARGS("--epochs", "-"));
    expect_error(FERRY_ERR_RANGE, "--epochs: '-3' is out of range [1, 1000000]",
                 ARGS("--epochs", "-3"));
    expect_error(FERRY_ERR_RANGE, "--epochs: '1000001' is out of range [1, 1000000]",
                 ARGS("--epochs=1000001"));
    expect_error(FERRY_ERR_RANGE, "--seed: '9223372036854775808' is out of range",
                 ARGS("--seed", "9223372036854775808"));
    expect_error(FERRY_ERR_INVALID,
                 "--optimizer: 'rmsprop' is not one of sgd|adagrad|adadelta|adam|adamw",
                 ARGS("--optimizer", "rmsprop"));
    expect_error(FERRY_ERR_INVALID,
                 "--optimizer: 'ada' is not one of sgd|adagrad|adadelta|adam|adamw",
                 ARGS("--optimizer", "ada"));
    expect_error(FERRY_ERR_INVALID, "--tied: 'maybe' is not a boolean (true|false)",
                 ARGS("--tied=maybe"));
    expect_error(FERRY_ERR_INVALID, "missing value for --lr", ARGS("--lr"));
    expect_error(FERRY_ERR_INVALID, "missing value for --data", ARGS("--data", "--lr", "1"));
    setup(true);
    expect_error(FERRY_ERR_INVALID, "missing required flag --data", ARGS("--lr", "1"));
    CHECK_OK(parse(ARGS("--data", "x")));
    /* A value for a flag of type int that does not fit in int. */
    expect_error(FERRY_ERR_RANGE, "--epochs: '4294967296' is out of range [1, 1000000]",
                 ARGS("--epochs", "4294967296"));
}

TEST(help) {
    setup(true);
    cfg.optimizer = OPT_ADAM;
    FILE *f = tmpfile();
    CHECK(f != NULL);
    ferry_flags_usage(&fs, f);
    char text[4096];
    rewind(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    CHECK(fclose(f) == 0);
    fprintf(stderr, "%s", text);
    static const char *want[] = {
        "usage: ferry-trainer [flags]\n",
        "trains a language model\n",
        "\nflags:\n",
        "  --epochs INT      training epochs (default 40, range [1, 1000000])\n",
        "  --seed INT        random seed (default 1111)\n",
        "  --lr NUM          learning rate (default 20)\n",
        "  --clip NUM        gradient norm clip (default 0.25)\n",
        "  --data DIR        corpus directory (required)\n",
        "  --tied            tie weights\n",
        "  --optimizer NAME  update rule: sgd|adagrad|adadelta|adam|adamw (default adam)\n",
        "  --help            print this help and exit\n",
        "  --version         print the version and exit\n",
        "\nexit status: " FERRY_FLAGS_EXIT_STATUS "\n",
    };
    const char *p = text;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        if (strncmp(p, want[i], strlen(want[i])) != 0) {
            fprintf(stderr, "line %zu differs:\n  want '%s'\n", i, want[i]);
            CHECK(0);
        }
        p += strlen(want[i]);
    }
    CHECK(*p == '\0');

    /* --help stops parsing (even before a bad flag) and reports it. */
    char *argv[] = {(char *)(uintptr_t) "ferry-trainer", (char *)(uintptr_t) "--help",
                    (char *)(uintptr_t) "--bogus"};
    bool help = false;
    CHECK_OK(ferry_flags_parse(&fs, 3, argv, &help));
    CHECK(help);
}

TEST(did_you_mean) {
    setup(false);
    expect_error(FERRY_ERR_INVALID, "unknown flag --epoch (did you mean --epochs?)",
                 ARGS("--epoch", "3"));
    expect_error(FERRY_ERR_INVALID, "unknown flag --optmizer (did you mean --optimizer?)",
                 ARGS("--optmizer=adam"));
    expect_error(FERRY_ERR_INVALID, "unknown flag --dtaa (did you mean --data?)",
                 ARGS("--dtaa", "x")); /* a transposition is one edit */
    expect_error(FERRY_ERR_INVALID, "unknown flag -lr (did you mean --lr?)", ARGS("-lr", "1"));
    expect_error(FERRY_ERR_INVALID, "unknown flag --hlep (did you mean --help?)", ARGS("--hlep"));
    /* Too far from every name: no guess. */
    expect_error(FERRY_ERR_INVALID, "unknown flag --bogus (see --help)", ARGS("--bogus"));
    expect_error(FERRY_ERR_INVALID, "unknown flag --xyz (see --help)", ARGS("--xyz"));
    expect_error(FERRY_ERR_INVALID, "unknown flag --learning-rate (see --help)",
                 ARGS("--learning-rate", "1"));
}

/* The usage text of one flag table, into text. */
static void usage_of(const ferry_flag *flags, int n, char *text, size_t cap) {
    ferry_flags f = {"prog", NULL, flags, n, NULL, "0 ok; 2 usage"};
    FILE *out = tmpfile();
    CHECK(out != NULL);
    ferry_flags_usage(&f, out);
    rewind(out);
    size_t len = fread(text, 1, cap - 1, out);
    text[len] = '\0';
    CHECK(fclose(out) == 0);
}

TEST(help_numbers) {
    float dropout = 0.99f, init = 0.1f;
    double decay = 0.98999999999999999, ttl = 1e-3;
    int world = -1;
    const ferry_flag flags[] = {
        {.name = "dropout", .type = FERRY_FLAG_FLOAT, .ptr = &dropout, .min = 0, .max = 0.99},
        {.name = "init", .type = FERRY_FLAG_FLOAT, .ptr = &init, .min = 0, .max = 10},
        {.name = "decay", .type = FERRY_FLAG_DOUBLE, .ptr = &decay, .min = 0, .max = 1},
        {.name = "ttl", .type = FERRY_FLAG_DOUBLE, .ptr = &ttl, .min = 0.001, .max = 1e7},
        {.name = "world",
         .type = FERRY_FLAG_INT,
         .ptr = &world,
         .min = 1,
         .max = 65536,
         .defval = "FERRY_WORLD, or 1",
         .help = "trainers"},
    };
    char text[2048];
    usage_of(flags, 5, text, sizeof text);
    fprintf(stderr, "%s", text);
    CHECK(strstr(text, "--dropout NUM   (default 0.99, range [0, 0.99])\n") != NULL);
    CHECK(strstr(text, "--init NUM      (default 0.1, range [0, 10])\n") != NULL);
    CHECK(strstr(text, "--decay NUM     (default 0.99, range [0, 1])\n") != NULL);
    CHECK(strstr(text, "--ttl NUM       (default 0.001, range [0.001, 10000000])\n") != NULL);
    CHECK(strstr(text, "--world INT    trainers (default FERRY_WORLD, or 1, range [1, 65536])\n") !=
          NULL);
    CHECK(strstr(text, "\nexit status: 0 ok; 2 usage\n") != NULL);
    CHECK(strstr(text, "999999") == NULL && strstr(text, "000001") == NULL);
}

TEST(peek) {
    char *argv[] = {(char *)(uintptr_t) "prog",           (char *)(uintptr_t) "--preset",
                    (char *)(uintptr_t) "medium",         (char *)(uintptr_t) "--log-format=json",
                    (char *)(uintptr_t) "--preset=large", (char *)(uintptr_t) "--log"};
    CHECK(strcmp(ferry_flags_peek(6, argv, "preset"), "large") == 0); /* the last one */
    CHECK(strcmp(ferry_flags_peek(6, argv, "log-format"), "json") == 0);
    CHECK(ferry_flags_peek(6, argv, "log") == NULL); /* no value follows */
    CHECK(ferry_flags_peek(3, argv, "log-format") == NULL);
    CHECK(ferry_flags_peek(6, argv, "pre") == NULL); /* names match whole */
}

FERRY_TEST_MAIN(T(values) T(errors) T(help) T(did_you_mean) T(help_numbers) T(peek))
