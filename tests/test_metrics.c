/* test_metrics.c - the JSON Lines metrics writer: exact lines, every line parsed back
 * with the test JSON reader, null for non-finite numbers, escaping, and I/O errors. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "json.h"           /* ferry_json_parse, to read the lines back */
#include "worker/metrics.h" /* ferry_metrics_* */

static char path[64];

static const char *tmp_path(void) {
    (void)snprintf(path, sizeof path, "/tmp/ferry-metrics-XXXXXX");
    int fd = mkstemp(path);
    CHECK(fd >= 0 && close(fd) == 0);
    return path;
}

/* The file's text (static buffer). */
static const char *slurp(const char *p) {
    static char text[8192];
    FILE *f = fopen(p, "rb");
    CHECK(f != NULL);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    CHECK(fclose(f) == 0);
    return text;
}

/* Parses each line as one JSON object; returns the number of lines. */
static int parse_lines(const char *text, ferry_json **objs, int max) {
    int n = 0;
    for (const char *l = text; *l != '\0'; n++) {
        const char *eol = strchr(l, '\n');
        CHECK(eol != NULL && n < max);
        CHECK_OK(ferry_json_parse(l, (size_t)(eol - l), &objs[n]));
        CHECK(ferry_json_type_of(objs[n]) == FERRY_JSON_OBJECT);
        l = eol + 1;
    }
    return n;
}

TEST(lines) {
    const char *p = tmp_path();
    ferry_metrics *m;
    CHECK_OK(ferry_metrics_open(p, &m));
    CHECK_OK(ferry_metrics_train(m, 1, 200, 5.43, 228.1492, 1.0, 12345.6, 83.2));
    CHECK(strcmp(slurp(p), "{\"event\":\"train\",\"epoch\":1,\"step\":200,\"loss\":5.43,"
                           "\"ppl\":228.1492,\"lr\":1,\"tokens_per_s\":12345.6,"
                           "\"elapsed_s\":83.2}\n") == 0); /* flushed at once */
    CHECK_OK(ferry_metrics_eval(m, "valid", 1, 1327, 4.9, 134.28978));
    CHECK_OK(ferry_metrics_train(m, 2, 3000000000LL, NAN, INFINITY, 1.0 / 3, -0.0, 1e300));
    static const char *keys[] = {"stiefel_penalty_l0", "feasibility_l0", "odd \"key\"\n"};
    static const double vals[] = {0.000123456789123, -2.5, 7};
    CHECK_OK(ferry_metrics_write_kv(m, "stiefel", 3, keys, vals));
    CHECK_OK(ferry_metrics_write_kv(m, "marker", 0, NULL, NULL));
    CHECK_OK(ferry_metrics_close(m));
    const char *text = slurp(p);
    fprintf(stderr, "%s", text);
    static const char *want =
        "{\"event\":\"train\",\"epoch\":1,\"step\":200,\"loss\":5.43,\"ppl\":228.1492,\"lr\":1,"
        "\"tokens_per_s\":12345.6,\"elapsed_s\":83.2}\n"
        "{\"event\":\"eval\",\"split\":\"valid\",\"epoch\":1,\"step\":1327,\"loss\":4.9,"
        "\"ppl\":134.28978}\n"
        "{\"event\":\"train\",\"epoch\":2,\"step\":3000000000,\"loss\":null,\"ppl\":null,"
        "\"lr\":0.333333333,\"tokens_per_s\":0,\"elapsed_s\":1e+300}\n"
        "{\"event\":\"stiefel\",\"stiefel_penalty_l0\":0.000123456789,\"feasibility_l0\":-2.5,"
        "\"odd \\\"key\\\"\\u000a\":7}\n"
        "{\"event\":\"marker\"}\n";
    if (strcmp(text, want) != 0) {
        fprintf(stderr, "want:\n%s", want);
        CHECK(0);
    }
    /* Every line is valid JSON and reads back to the values written. */
    ferry_json *o[8];
    CHECK_EQ(parse_lines(text, o, 8), 5);
    CHECK(strcmp(ferry_json_str(ferry_json_get(o[0], "event")), "train") == 0);
    CHECK_NEAR(ferry_json_num(ferry_json_get(o[0], "loss")), 5.43, 0);
    CHECK(strcmp(ferry_json_str(ferry_json_get(o[1], "split")), "valid") == 0);
    CHECK_BITS_EQ(ferry_json_num(ferry_json_get(o[2], "step")), 3000000000.0);
    CHECK(ferry_json_type_of(ferry_json_get(o[2], "loss")) == FERRY_JSON_NULL);
    CHECK(ferry_json_type_of(ferry_json_get(o[2], "ppl")) == FERRY_JSON_NULL);
    CHECK_NEAR(ferry_json_num(ferry_json_get(o[3], "stiefel_penalty_l0")), 1.23456789e-4, 1e-15);
    CHECK_NEAR(ferry_json_num(ferry_json_get(o[3], "odd \"key\"\n")), 7, 0);
    CHECK_EQ(ferry_json_len(o[4]), 1);
    for (int i = 0; i < 5; i++)
        ferry_json_destroy(o[i]);
    CHECK(unlink(p) == 0);
}

TEST(io_errors) {
    ferry_metrics *m = NULL;
    CHECK_STATUS(ferry_metrics_open("/nonexistent/dir/metrics.jsonl", &m), FERRY_ERR_IO);
    CHECK(strcmp(ferry_error_last(), "cannot open metrics file /nonexistent/dir/metrics.jsonl: "
                                     "No such file or directory") == 0);
    CHECK(m == NULL);
    CHECK_STATUS(ferry_metrics_open("/tmp", &m), FERRY_ERR_IO); /* a directory */
    CHECK(strstr(ferry_error_last(), "Is a directory") != NULL);
    /* /dev/full accepts the open and fails every write: the flush reports it. */
    if (access("/dev/full", W_OK) == 0) {
        CHECK_OK(ferry_metrics_open("/dev/full", &m));
        CHECK_STATUS(ferry_metrics_eval(m, "test", 1, 1, 4.5, 90), FERRY_ERR_IO);
        CHECK(strcmp(ferry_error_last(),
                     "cannot write metrics to /dev/full: No space left on device") == 0);
        (void)ferry_metrics_close(m);
    }
    CHECK_OK(ferry_metrics_close(NULL));
}

TEST(to_stdout) {
    /* "-" writes to standard output, captured here through a temp file. */
    FILE *cap = tmpfile();
    CHECK(cap != NULL && fflush(stdout) == 0);
    int saved = dup(STDOUT_FILENO);
    CHECK(saved >= 0 && dup2(fileno(cap), STDOUT_FILENO) >= 0);
    ferry_metrics *m;
    CHECK_OK(ferry_metrics_open("-", &m));
    CHECK_OK(ferry_metrics_eval(m, "test", 40, 53120, 4.6, 99.5));
    CHECK_OK(ferry_metrics_close(m)); /* flushes, but leaves stdout open */
    CHECK(fprintf(stdout, "after\n") == 6 && fflush(stdout) == 0);
    CHECK(dup2(saved, STDOUT_FILENO) >= 0 && close(saved) == 0);
    char text[256];
    rewind(cap);
    size_t n = fread(text, 1, sizeof text - 1, cap);
    text[n] = '\0';
    CHECK(fclose(cap) == 0);
    CHECK(strcmp(text, "{\"event\":\"eval\",\"split\":\"test\",\"epoch\":40,\"step\":53120,"
                       "\"loss\":4.6,\"ppl\":99.5}\nafter\n") == 0);
}

FERRY_TEST_MAIN(T(lines) T(io_errors) T(to_stdout))
