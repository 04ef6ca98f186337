/* test_schedule.c - learning-rate schedules: Zaremba's step decay, torch StepLR's
 * "every N epochs", and ReduceLROnPlateau (mode min, relative threshold, cooldown,
 * floor), as sequences of epoch-end decisions. */
#include <string.h>

#include "check.h"
#include "optim/schedule.h"

/* Runs epochs 1..n with the given validation losses and checks the lr after each. */
static void run(const ferry_lr_schedule_config *cfg, double lr, const double *losses,
                const double *want, int n) {
    ferry_lr_schedule s;
    CHECK_OK(ferry_lr_schedule_init(&s, cfg));
    for (int e = 1; e <= n; e++) {
        lr = ferry_lr_schedule_epoch_end(&s, e, losses ? losses[e - 1] : 0.0, lr);
        if (fabs(lr - want[e - 1]) > 1e-12 * want[e - 1]) {
            fprintf(stderr, "  epoch %d: lr %.17g, want %.17g\n", e, lr, want[e - 1]);
            CHECK(0);
        }
    }
}

TEST(step_decay_zaremba) {
    /* --lr-decay 0.5 --lr-decay-start 4: epochs 1-4 run at 1, epoch 5 at 0.5, ... */
    ferry_lr_schedule_config c = ferry_lr_schedule_defaults(FERRY_LR_SCHEDULE_STEP);
    c.gamma = 0.5;
    c.start = 4;
    const double want[8] = {1, 1, 1, 0.5, 0.25, 0.125, 0.0625, 0.03125};
    run(&c, 1.0, NULL, want, 8);
}

TEST(step_decay_every_n_like_steplr) {
    /* StepLR(step_size=3, gamma=0.1): lr = lr0 * 0.1^floor(k/3) after k epochs. */
    ferry_lr_schedule_config c = ferry_lr_schedule_defaults(FERRY_LR_SCHEDULE_STEP);
    c.every = 3;
    const double want[7] = {2, 2, 0.2, 0.2, 0.2, 0.02, 0.02};
    run(&c, 2.0, NULL, want, 7);
    /* Start and period together: decay after epochs 2, 4, 6. */
    c.start = 2;
    c.every = 2;
    c.gamma = 0.5;
    const double want2[6] = {1, 0.5, 0.5, 0.25, 0.25, 0.125};
    run(&c, 1.0, NULL, want2, 6);
}

TEST(plateau_like_reduce_lr_on_plateau) {
    ferry_lr_schedule_config c = ferry_lr_schedule_defaults(FERRY_LR_SCHEDULE_PLATEAU);
    c.gamma = 0.5;
    c.patience = 2;
    c.cooldown = 1;
    c.lr_min = 0.2;
    /* 8.9995 is not below 9 * (1 - 1e-4): no improvement. Epoch 5 is the third bad
     * epoch (> patience): halve, then one cooldown epoch. The floor stops the decay at
     * 0.2, and a real improvement (epoch 18) resets the count. */
    const double losses[20] = {10,  9,   8.9995, 9.5, 9.2, 9.1, 9.1, 9.1, 9.1, 9.1,
                               9.1, 9.1, 9.1,    9.1, 9.1, 9.1, 9.1, 5,   5,   NAN};
    const double want[20] = {1,    1,    1,   1,   0.5, 0.5, 0.5, 0.5, 0.25, 0.25,
                             0.25, 0.25, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2,  0.2};
    run(&c, 1.0, losses, want, 20);
    /* torch's defaults: patience 10, so ten flat epochs change nothing, the 11th does. */
    ferry_lr_schedule_config d = ferry_lr_schedule_defaults(FERRY_LR_SCHEDULE_PLATEAU);
    const double flat[12] = {3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3};
    const double want_d[12] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0.1};
    run(&d, 1.0, flat, want_d, 12);
    /* NaN losses are never an improvement. */
    d.patience = 0;
    const double nans[3] = {NAN, NAN, NAN};
    const double want_n[3] = {0.1, 0.01, 0.001};
    run(&d, 1.0, nans, want_n, 3);
}

TEST(none_keeps_lr) {
    ferry_lr_schedule_config c = ferry_lr_schedule_defaults(FERRY_LR_SCHEDULE_NONE);
    const double losses[3] = {5, 6, 7}, want[3] = {0.3, 0.3, 0.3};
    run(&c, 0.3, losses, want, 3);
}

TEST(config_errors) {
    ferry_lr_schedule s;
    ferry_lr_schedule_kind k;
    CHECK_OK(ferry_lr_schedule_parse_kind("plateau", &k));
    CHECK_EQ(k, FERRY_LR_SCHEDULE_PLATEAU);
    CHECK(strcmp(ferry_lr_schedule_kind_name(FERRY_LR_SCHEDULE_STEP), "step") == 0);
    CHECK_STATUS(ferry_lr_schedule_parse_kind("cosine", &k), FERRY_ERR_INVALID);
    CHECK(strstr(ferry_error_last(), "none|step|plateau") != NULL);
    ferry_lr_schedule_config c = ferry_lr_schedule_defaults(FERRY_LR_SCHEDULE_STEP);
    c.gamma = 1.5;
    CHECK_STATUS(ferry_lr_schedule_init(&s, &c), FERRY_ERR_INVALID);
    c.gamma = 0.5;
    c.every = 0;
    CHECK_STATUS(ferry_lr_schedule_init(&s, &c), FERRY_ERR_INVALID);
    c = ferry_lr_schedule_defaults(FERRY_LR_SCHEDULE_PLATEAU);
    c.patience = -1;
    CHECK_STATUS(ferry_lr_schedule_init(&s, &c), FERRY_ERR_INVALID);
    c = ferry_lr_schedule_defaults(FERRY_LR_SCHEDULE_PLATEAU);
    c.lr_min = NAN;
    CHECK_STATUS(ferry_lr_schedule_init(&s, &c), FERRY_ERR_INVALID);
    c.kind = (ferry_lr_schedule_kind)7;
    CHECK_STATUS(ferry_lr_schedule_init(&s, &c), FERRY_ERR_INVALID);
}

FERRY_TEST_MAIN(T(step_decay_zaremba) T(step_decay_every_n_like_steplr)
                    T(plateau_like_reduce_lr_on_plateau) T(none_keeps_lr) T(config_errors))
