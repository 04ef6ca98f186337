/* test_progress.c - the progress reporter's exact plain log lines, the redrawn terminal
 * line (forced TTY mode into a file, so the 100-column fallback applies), the ETA of a
 * resumed epoch, mode choice from FERRY_PROGRESS, and h:mm:ss formatting. stderr is
 * captured through a temp file. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "worker/progress.h" /* ferry_progress_* */

/* ---- stderr capture ------------------------------------------------------------------ */

static FILE *cap_file;
static int cap_saved = -1;

static void capture_begin(void) {
    (void)fflush(stderr);
    cap_file = tmpfile();
    CHECK(cap_file != NULL);
    cap_saved = dup(STDERR_FILENO);
    CHECK(cap_saved >= 0 && dup2(fileno(cap_file), STDERR_FILENO) >= 0);
}

/* Restores stderr and returns what was written meanwhile (static buffer). */
static const char *capture_end(void) {
    static char text[16384];
    (void)fflush(stderr);
    CHECK(dup2(cap_saved, STDERR_FILENO) >= 0 && close(cap_saved) == 0);
    rewind(cap_file);
    size_t n = fread(text, 1, sizeof text - 1, cap_file);
    text[n] = '\0';
    CHECK(fclose(cap_file) == 0);
    return text;
}

static size_t count(const char *s, const char *needle) {
    size_t k = 0;
    for (const char *p = s; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        k++;
    return k;
}

/* ---- tests --------------------------------------------------------------------------- */

TEST(plain_lines) {
    ferry_progress_config cfg = {.mode = FERRY_PROGRESS_PLAIN, .steps = 2323, .log_interval = 200};
    ferry_progress *p;
    CHECK_OK(ferry_progress_create(&cfg, &p));
    CHECK_EQ(ferry_progress_get_mode(p), FERRY_PROGRESS_PLAIN);
    capture_begin();
    ferry_progress_stats s = {
        .epoch = 1, .step = 199, .loss = 6.0, .lr = 1.0, .tokens_per_s = 12000, .elapsed_s = 80};
    ferry_progress_update(p, &s); /* not on the interval: silent */
    s = (ferry_progress_stats){.epoch = 1,
                               .step = 200,
                               .loss = 5.43,
                               .lr = 1.0,
                               .tokens_per_s = 12345.4,
                               .elapsed_s = 83.2};
    ferry_progress_update(p, &s);
    s = (ferry_progress_stats){.epoch = 3,
                               .step = 400,
                               .loss = NAN,
                               .lr = 0.0003,
                               .tokens_per_s = 9999.6,
                               .elapsed_s = -1};
    ferry_progress_update(p, &s);
    ferry_progress_finish(p); /* plain mode: adds nothing */
    ferry_progress_destroy(p);
    const char *out = capture_end();
    fprintf(stderr, "%s", out);
    CHECK_EQ(count(out, "\n"), 2);
    CHECK(count(out, " I ") == 2); /* INFO level lines from ferry_log */
    CHECK(strstr(out, ": epoch 1 step 200/2323 | lr 1.000 | 12345 tok/s | loss 5.43 | "
                      "ppl 228.1 | elapsed 0:01:23 | eta 0:14:43\n") != NULL);
    CHECK(strstr(out, ": epoch 3 step 400/2323 | lr 0.0003 | 10000 tok/s | loss nan | "
                      "ppl nan | elapsed -:--:-- | eta -:--:--\n") != NULL);
}

TEST(tty_line) {
    ferry_progress_config cfg = {.mode = FERRY_PROGRESS_TTY, .steps = 1323, .redraw_s = 1000};
    ferry_progress *p;
    CHECK_OK(ferry_progress_create(&cfg, &p));
    capture_begin();
    ferry_progress_stats s = {
        .epoch = 2, .step = 1000, .loss = 4.2, .lr = 20, .tokens_per_s = 54321, .elapsed_s = 40};
    ferry_progress_update(p, &s); /* first update of an epoch: drawn */
    s.step = 1001;
    ferry_progress_update(p, &s); /* within redraw_s: not drawn until finish */
    ferry_progress_finish(p);
    ferry_progress_finish(p); /* twice is harmless */
    s = (ferry_progress_stats){
        .epoch = 3, .step = 1323, .loss = 4.0, .lr = 5, .tokens_per_s = 50000, .elapsed_s = 60};
    ferry_progress_update(p, &s); /* the last step: drawn at once */
    ferry_progress_destroy(p);    /* ends the open line */
    const char *out = capture_end();
    fprintf(stderr, "%s", out);
    CHECK_EQ(count(out, "\r"), 3);
    CHECK_EQ(count(out, "\n"), 2);
    CHECK(out[0] == '\r');
    CHECK(strstr(out, "\repoch 2 [") == out);
    CHECK(strstr(out, "] 1000/1323 | 54321 tok/s | loss 4.20 | ppl 66.7 | lr 20.000 | "
                      "eta 0:00:12\033[K\r") != NULL);
    CHECK(strstr(out, "] 1001/1323 |") != NULL);
    CHECK(strstr(out, "] 1323/1323 | 50000 tok/s | loss 4.00 | ppl 54.6 | lr 5.000 | "
                      "eta 0:00:00\033[K\n") != NULL);
    /* Every drawn line fits the 100-column fallback (99 visible columns), and the bar is
     * proportional: 1000/1323 of it filled, with a '>' head; full at the last step. */
    for (const char *l = out; (l = strchr(l, '\r')) != NULL; l++) {
        const char *end = strstr(l, "\033[K");
        CHECK(end != NULL && end - (l + 1) <= 99);
        const char *open = strchr(l, '['), *close = strchr(l, ']');
        CHECK(open != NULL && close != NULL && close > open);
        long bar = close - open - 1, fill = (long)strspn(open + 1, "=");
        CHECK(bar >= 10 && bar <= 40);
        if (strncmp(close + 2, "1323/", 5) == 0) {
            CHECK_EQ(fill, bar);
        } else {
            CHECK_EQ(fill + 1, (long)(1000.0 / 1323 * (double)bar));
            CHECK(open[1 + fill] == '>');
        }
    }
}

TEST(mode_from_env) {
    ferry_progress_config cfg = {.steps = 10};
    static const char *env[] = {"plain", "tty", "off"};
    static const ferry_progress_mode want[] = {FERRY_PROGRESS_PLAIN, FERRY_PROGRESS_TTY,
                                               FERRY_PROGRESS_OFF};
    for (int i = 0; i < 3; i++) {
        CHECK(setenv("FERRY_PROGRESS", env[i], 1) == 0);
        ferry_progress *p;
        CHECK_OK(ferry_progress_create(&cfg, &p));
        CHECK_EQ(ferry_progress_get_mode(p), want[i]);
        ferry_progress_destroy(p);
    }
    /* An explicit mode wins over the environment. */
    cfg.mode = FERRY_PROGRESS_PLAIN;
    ferry_progress *p;
    CHECK_OK(ferry_progress_create(&cfg, &p));
    CHECK_EQ(ferry_progress_get_mode(p), FERRY_PROGRESS_PLAIN);
    ferry_progress_destroy(p);
    /* Without the variable, AUTO follows isatty(stderr); a capture file is no TTY. */
    CHECK(unsetenv("FERRY_PROGRESS") == 0);
    cfg.mode = FERRY_PROGRESS_AUTO;
    capture_begin();
    ferry_status st = ferry_progress_create(&cfg, &p);
    (void)capture_end();
    CHECK_OK(st);
    CHECK_EQ(ferry_progress_get_mode(p), FERRY_PROGRESS_PLAIN);
    ferry_progress_destroy(p);
    /* OFF prints nothing at all. */
    cfg.mode = FERRY_PROGRESS_OFF;
    CHECK_OK(ferry_progress_create(&cfg, &p));
    capture_begin();
    ferry_progress_update(p, &(ferry_progress_stats){.epoch = 1, .step = 10});
    ferry_progress_destroy(p);
    CHECK(strcmp(capture_end(), "") == 0);
    /* Bad configurations. */
    cfg = (ferry_progress_config){.steps = 0};
    p = NULL;
    CHECK_STATUS(ferry_progress_create(&cfg, &p), FERRY_ERR_INVALID);
    CHECK(strstr(ferry_error_last(), "steps must be >= 1 (got 0)") != NULL && p == NULL);
    cfg = (ferry_progress_config){.steps = 5, .log_interval = -1};
    CHECK_STATUS(ferry_progress_create(&cfg, &p), FERRY_ERR_INVALID);
    ferry_progress_destroy(NULL);
}

/* A resumed epoch (first = 1000) that --max-steps ends at window 1100: the bar's 100%
 * is 1100, and the ETA extrapolates from the 50 windows this process took in 10 s
 * (50 left: 10 s), not from all 1050 (0.5 s). */
TEST(eta_of_a_resumed_short_epoch) {
    ferry_progress_config cfg = {
        .mode = FERRY_PROGRESS_PLAIN, .steps = 1100, .first = 1000, .log_interval = 50};
    ferry_progress *p;
    CHECK_OK(ferry_progress_create(&cfg, &p));
    capture_begin();
    ferry_progress_update(
        p,
        &(ferry_progress_stats){
            .epoch = 2, .step = 1050, .loss = 5, .lr = 1, .tokens_per_s = 2000, .elapsed_s = 10});
    ferry_progress_update(
        p,
        &(ferry_progress_stats){
            .epoch = 2, .step = 1100, .loss = 5, .lr = 1, .tokens_per_s = 2000, .elapsed_s = 20});
    ferry_progress_destroy(p);
    const char *out = capture_end();
    fprintf(stderr, "%s", out);
    CHECK(strstr(out, "epoch 2 step 1050/1100 | ") != NULL);
    CHECK(strstr(out, "| elapsed 0:00:10 | eta 0:00:10\n") != NULL);
    CHECK(strstr(out, "epoch 2 step 1100/1100 | ") != NULL);
    CHECK(strstr(out, "| elapsed 0:00:20 | eta 0:00:00\n") != NULL);
    /* The first step must lie in [0, steps]. */
    cfg.first = 1101;
    p = NULL;
    CHECK_STATUS(ferry_progress_create(&cfg, &p), FERRY_ERR_INVALID);
    CHECK(p == NULL);
}

TEST(hms) {
    char buf[32];
    CHECK(strcmp(ferry_progress_hms(0, buf, sizeof buf), "0:00:00") == 0);
    CHECK(strcmp(ferry_progress_hms(83.9, buf, sizeof buf), "0:01:23") == 0);
    CHECK(strcmp(ferry_progress_hms(3725, buf, sizeof buf), "1:02:05") == 0);
    CHECK(strcmp(ferry_progress_hms(100 * 3600.0 + 59, buf, sizeof buf), "100:00:59") == 0);
    CHECK(strcmp(ferry_progress_hms(-1, buf, sizeof buf), "-:--:--") == 0);
    CHECK(strcmp(ferry_progress_hms(NAN, buf, sizeof buf), "-:--:--") == 0);
    CHECK(strcmp(ferry_progress_hms(INFINITY, buf, sizeof buf), "-:--:--") == 0);
}

FERRY_TEST_MAIN(T(plain_lines) T(tty_line) T(eta_of_a_resumed_short_epoch) T(mode_from_env) T(hms))
