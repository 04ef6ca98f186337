/* test_batch.c - batchify layout and BPTT windows against a hand-computed example and
 * against pytorch/examples' get_batch() rules on the whole PTB stream. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "worker/batch.h"  /* ferry_batch_*, ferry_window */
#include "worker/corpus.h" /* ferry_corpus_load for the PTB check */

TEST(layout_by_hand) {
    /* 26 tokens 0..25 with B = 4: nstep = 6, the last two tokens are dropped, and
     * column b holds stream[6b .. 6b+5]. */
    int32_t stream[26];
    for (int i = 0; i < 26; i++)
        stream[i] = i;
    static const int32_t want[6][4] = {
        {0, 6, 12, 18}, {1, 7, 13, 19},  {2, 8, 14, 20},
        {3, 9, 15, 21}, {4, 10, 16, 22}, {5, 11, 17, 23},
    };
    ferry_batches *b;
    CHECK_OK(ferry_batch_create(stream, 26, 4, &b));
    stream[0] = 99; /* the layout is a copy */
    CHECK_EQ(ferry_batch_nstep(b), 6);
    CHECK_EQ(ferry_batch_size(b), 4);
    CHECK_EQ(ferry_batch_tokens(b), 20);
    const int32_t *d = ferry_batch_data(b);
    for (int t = 0; t < 6; t++)
        for (int c = 0; c < 4; c++)
            CHECK_EQ(d[t * 4 + c], want[t][c]);

    /* bptt 4: rows [0,4) -> targets rows [1,5); then rows [4,5) -> target row 5. */
    CHECK_EQ(ferry_batch_nwindows(b, 4), 2);
    ferry_window w;
    CHECK_OK(ferry_batch_window(b, 0, 4, &w));
    CHECK(w.start == 0 && w.T == 4 && w.B == 4);
    for (int t = 0; t < 4; t++)
        for (int c = 0; c < 4; c++) {
            CHECK_EQ(w.inputs[t * 4 + c], want[t][c]);
            CHECK_EQ(w.targets[t * 4 + c], want[t + 1][c]);
        }
    CHECK_OK(ferry_batch_window(b, 4, 4, &w));
    CHECK(w.start == 4 && w.T == 1);
    static const int32_t in4[] = {4, 10, 16, 22}, tg4[] = {5, 11, 17, 23};
    CHECK(memcmp(w.inputs, in4, sizeof in4) == 0 && memcmp(w.targets, tg4, sizeof tg4) == 0);
    /* A window may start anywhere and be of any length (variable-length BPTT). */
    CHECK_OK(ferry_batch_window(b, 3, 100, &w));
    CHECK(w.T == 2 && w.inputs[0] == 3 && w.targets[4 * 2 - 1] == 23);
    CHECK_EQ(ferry_batch_nwindows(b, 1), 5);
    CHECK_EQ(ferry_batch_nwindows(b, 5), 1);
    CHECK_EQ(ferry_batch_nwindows(b, 6), 1);
    ferry_batch_destroy(b);
}

TEST(bad_arguments) {
    int32_t stream[8] = {0};
    ferry_batches *b = NULL;
    CHECK_STATUS(ferry_batch_create(stream, 8, 0, &b), FERRY_ERR_INVALID);
    CHECK(strstr(ferry_error_last(), "batch size must be at least 1, got 0"));
    CHECK_STATUS(ferry_batch_create(stream, 7, 4, &b), FERRY_ERR_INVALID);
    CHECK(strstr(ferry_error_last(), "a split of 7 tokens is too short for batch size 4"));
    CHECK(b == NULL);
    CHECK_OK(ferry_batch_create(stream, 8, 4, &b)); /* two rows: exactly one window */
    CHECK_EQ(ferry_batch_nwindows(b, 35), 1);
    ferry_window w = {.T = -7};
    CHECK_STATUS(ferry_batch_window(b, 1, 35, &w), FERRY_ERR_RANGE);
    CHECK(strstr(ferry_error_last(), "window start 1 is outside [0, 1)"));
    CHECK_STATUS(ferry_batch_window(b, -1, 35, &w), FERRY_ERR_RANGE);
    CHECK_STATUS(ferry_batch_window(b, 0, 0, &w), FERRY_ERR_INVALID);
    CHECK_EQ(w.T, -7); /* untouched on failure */
    CHECK_OK(ferry_batch_window(b, 0, 35, &w));
    CHECK_EQ(w.T, 1);
    ferry_batch_destroy(b);
    ferry_batch_destroy(NULL);
}

/* Walks every window as main.py's train() does (range(0, nstep - 1, bptt)) and checks
 * each input and target against the stream: column c, row t is stream[c*nstep + t]. */
static void check_epoch(const int32_t *stream, int64_t n, int B, int bptt, int64_t nwin) {
    ferry_batches *b;
    CHECK_OK(ferry_batch_create(stream, n, B, &b));
    int64_t nstep = n / B;
    CHECK_EQ(ferry_batch_nstep(b), nstep);
    CHECK_EQ(ferry_batch_nwindows(b, bptt), nwin);
    int64_t windows = 0, targets = 0;
    for (int64_t start = 0; start < nstep - 1; start += bptt) {
        ferry_window w;
        CHECK_OK(ferry_batch_window(b, start, bptt, &w));
        CHECK(w.T >= 1 && w.T <= bptt && w.B == B);
        for (int t = 0; t < w.T; t++)
            for (int c = 0; c < B; c++) {
                CHECK_EQ(w.inputs[t * B + c], stream[c * nstep + start + t]);
                CHECK_EQ(w.targets[t * B + c], stream[c * nstep + start + t + 1]);
            }
        windows++;
        targets += (int64_t)w.T * B;
    }
    CHECK_EQ(windows, nwin);
    CHECK_EQ(targets, ferry_batch_tokens(b));
    ferry_batch_destroy(b);
}

TEST(ptb_epochs) {
    ferry_corpus *c;
    CHECK_OK(ferry_corpus_load(ferry_test_path("data/ptb"), &c));
    int64_t n;
    const int32_t *train = ferry_corpus_ids(c, FERRY_SPLIT_TRAIN, &n);
    /* 929589 / 20 = 46479 rows; (46479 - 1) / 35 rounded up = 1328 windows. */
    check_epoch(train, n, 20, 35, 1328);
    const int32_t *valid = ferry_corpus_ids(c, FERRY_SPLIT_VALID, &n);
    /* 73760 / 10 = 7376 rows; ceil(7375 / 35) = 211 windows. */
    check_epoch(valid, n, 10, 35, 211);
    ferry_corpus_destroy(c);
}

FERRY_TEST_MAIN(T(layout_by_hand) T(bad_arguments) T(ptb_epochs))
