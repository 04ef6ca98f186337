/* test_log.c - what a host program sees of ferry's logging and version: lines routed
 * to its sink (message only, with the level) and dropped below the level; the
 * version macros agree with ferry_version(). */
#include <stdio.h>
#include <string.h>

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

FERRY_TEST_MAIN(T(lines_go_to_the_sink_at_its_level) T(version_macros_match_the_library))
