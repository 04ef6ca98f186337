/* test_log.c - what a host program sees of ferry's logging and version: lines routed
 * to its sink (message only, with the level) and dropped below the level; a program's
 * last line (ferry_log_fatal) as plain text or as a JSON object; the version macros
 * agree with ferry_version(). */
#define _POSIX_C_SOURCE 200809L /* dup, fileno */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "common/core/log.h"
#include "ferry/log.h"
#include "ferry/version.h"

typedef struct captured {
    int n;
    ferry_log_level level[8];
    char line[8][128];
} captured;

static void sink(void *user, ferry_log_level level, const char *message) {
    captured *c = user;
    if (c->n < 8) {
        c->level[c->n] = level;
        (void)snprintf(c->line[c->n], sizeof c->line[c->n], "%s", message);
    }
    c->n++;
}

TEST(lines_go_to_the_sink_at_its_level) {
    captured c = {0};
    ferry_log_set_sink(sink, &c);
    ferry_log_set_level(FERRY_LOG_LEVEL_WARN);
    FERRY_LOG_INFO("below the level %d", 1);
    FERRY_LOG_WARN("disk %s is %d%% full", "/data", 93);
    ferry_log(FERRY_LOG_LEVEL_ERROR, "an error");
    ferry_log_set_level(FERRY_LOG_LEVEL_DEBUG);
    FERRY_LOG_DEBUG("debug now shown");
    ferry_log_set_sink(NULL, NULL); /* back to stderr */
    FERRY_LOG_WARN("this line goes to stderr, not the sink");
    ferry_log_set_level(FERRY_LOG_LEVEL_INFO);
    CHECK_EQ(c.n, 3);
    CHECK(c.level[0] == FERRY_LOG_LEVEL_WARN && strcmp(c.line[0], "disk /data is 93% full") == 0);
    CHECK(c.level[1] == FERRY_LOG_LEVEL_ERROR && strcmp(c.line[1], "an error") == 0);
    CHECK(c.level[2] == FERRY_LOG_LEVEL_DEBUG && strcmp(c.line[2], "debug now shown") == 0);
    ferry_log_level lv;
    CHECK_OK(ferry_log_parse_level("warn", &lv));
    CHECK(lv == FERRY_LOG_LEVEL_WARN);
    CHECK_STATUS(ferry_log_parse_level("loud", &lv), FERRY_ERR_INVALID);
}

/* What fn writes to stderr (at most cap - 1 bytes). */
static void stderr_of(void (*fn)(void), char *out, size_t cap) {
    (void)fflush(stderr);
    FILE *f = tmpfile();
    CHECK(f != NULL);
    int saved = dup(STDERR_FILENO);
    CHECK(saved >= 0 && dup2(fileno(f), STDERR_FILENO) >= 0);
    fn();
    (void)fflush(stderr);
    CHECK(dup2(saved, STDERR_FILENO) >= 0 && close(saved) == 0);
    rewind(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    CHECK(fclose(f) == 0);
}

static void fatal_line(void) {
    ferry_log_fatal("cannot open \"%s\": %s", "a\\b", "gone");
}

TEST(the_last_line_as_text_or_json) {
    char text[512];
    ferry_log_init("ferry-test");
    ferry_log_set_level(FERRY_LOG_LEVEL_ERROR);
    ferry_log_set_json(0);
    stderr_of(fatal_line, text, sizeof text);
    CHECK(strcmp(text, "ferry-test: cannot open \"a\\b\": gone\n") == 0);
    ferry_log_set_json(1);
    stderr_of(fatal_line, text, sizeof text);
    fprintf(stderr, "%s", text);
    CHECK(strncmp(text, "{\"ts\":\"", 7) == 0);
    CHECK(strstr(text, "\",\"level\":\"error\",\"prog\":\"ferry-test\","
                       "\"msg\":\"cannot open \\\"a\\\\b\\\": gone\"}\n") != NULL);
    ferry_log_set_json(0);
    /* A host program's sink receives it like any error line. */
    captured c = {0};
    ferry_log_set_sink(sink, &c);
    fatal_line();
    ferry_log_set_sink(NULL, NULL);
    CHECK(c.n == 1 && c.level[0] == FERRY_LOG_LEVEL_ERROR);
    CHECK(strcmp(c.line[0], "cannot open \"a\\b\": gone") == 0);
    ferry_log_set_level(FERRY_LOG_LEVEL_INFO);
}

TEST(version_macros_match_the_library) {
    char want[32];
    (void)snprintf(want, sizeof want, "%d.%d.%d", FERRY_VERSION_MAJOR, FERRY_VERSION_MINOR,
                   FERRY_VERSION_PATCH);
    CHECK(strcmp(FERRY_VERSION, want) == 0);
    CHECK(strcmp(ferry_version(), FERRY_VERSION) == 0);
    CHECK_EQ(ferry_version_number(), FERRY_VERSION_NUMBER);
    CHECK_EQ(FERRY_VERSION_NUMBER,
             FERRY_VERSION_MAJOR * 10000 + FERRY_VERSION_MINOR * 100 + FERRY_VERSION_PATCH);
}

FERRY_TEST_MAIN(T(lines_go_to_the_sink_at_its_level) T(the_last_line_as_text_or_json)
                    T(version_macros_match_the_library))
