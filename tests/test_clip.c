/* test_clip.c - global-norm clipping as torch.nn.utils.clip_grad_norm_: the coefficient,
 * the sum of squares over several gradient sets (dense and row-sparse, untouched
 * parameters ignored), and the scale applied by the optimizer step. */
#include <string.h>

#include "check.h"
#include "ferry/optim.h"

TEST(coef_matches_torch_formula) {
    float scale = 0.0f;
    double norm = 0.0;
    /* norm 13 > 6.5: coef = 6.5 / (13 + 1e-6) in float32, as torch computes it. */
    CHECK_OK(ferry_clip_coef(169.0, 6.5f, &scale, &norm));
    CHECK(norm == 13.0);
    CHECK(scale == 6.5f / (13.0f + 1e-6f));
    CHECK_NEAR(scale, 0.5, 1e-7);
    CHECK(scale < 0.5f); /* the 1e-6 is there */
    /* Below the threshold the scale is exactly 1; at it, the 1e-6 leaves it just under. */
    CHECK_OK(ferry_clip_coef(169.0, 20.0f, &scale, &norm));
    CHECK(scale == 1.0f);
    CHECK_OK(ferry_clip_coef(169.0, 13.0f, &scale, NULL));
    CHECK(scale < 1.0f && scale > 0.9999f);
    CHECK_OK(ferry_clip_coef(0.0, 1.0f, &scale, &norm));
    CHECK(scale == 1.0f && norm == 0.0);
}

TEST(coef_errors) {
    float scale = 0.0f;
    double norm = 0.0;
    CHECK_STATUS(ferry_clip_coef(4.0, 0.0f, &scale, &norm), FERRY_ERR_INVALID);
    CHECK(scale == 1.0f);
    CHECK_STATUS(ferry_clip_coef(4.0, -1.0f, &scale, &norm), FERRY_ERR_INVALID);
    CHECK_STATUS(ferry_clip_coef(4.0, NAN, &scale, &norm), FERRY_ERR_INVALID);
    scale = 0.0f;
    CHECK_STATUS(ferry_clip_coef(NAN, 1.0f, &scale, &norm), FERRY_ERR_NUMERIC);
    CHECK(scale == 1.0f && isnan(norm));
    CHECK(strstr(ferry_error_last(), "gradient norm") != NULL);
    CHECK_STATUS(ferry_clip_coef(INFINITY, 1.0f, &scale, &norm), FERRY_ERR_NUMERIC);
    CHECK(isinf(norm));
}

/* Two blocks, as a context touching the trainer's LSTM and a shard's embedding:
 * block A: w (2, 2) = [3 0; 0 4] (25), table (5, 2) rows 1, 3 = [1 2], [2 0] (9);
 * block B: v (4) = [9 6 3 3] (135), u (3) untouched with junk in its buffer.
 * Total 169, norm 13. */
typedef struct two_blocks {
    ferry_params A, B;
    ferry_grads GA, GB;
} two_blocks;

static void two_blocks_init(two_blocks *t) {
    int i;
    ferry_params_init(&t->A, ferry_backend_cpu());
    ferry_params_init(&t->B, ferry_backend_cpu());
    CHECK_OK(ferry_params_add(&t->A, "w", ferry_shape_2d(2, 2), 0, &i));
    CHECK_OK(ferry_params_add(&t->A, "table", ferry_shape_2d(5, 2), FERRY_PARAM_ROW_SPARSE, &i));
    CHECK_OK(ferry_params_add(&t->B, "v", ferry_shape_1d(4), 0, &i));
    CHECK_OK(ferry_params_add(&t->B, "u", ferry_shape_1d(3), 0, &i));
    CHECK_OK(ferry_params_alloc(&t->A));
    CHECK_OK(ferry_params_alloc(&t->B));
    for (int k = 0; k < 4; k++)
        t->A.data[k] = 1.0f + (float)k;
    for (int k = 0; k < 10; k++)
        ferry_params_data(&t->A, 1)[k] = -1.0f - 0.5f * (float)k;
    CHECK_OK(ferry_grads_init(&t->GA, &t->A));
    CHECK_OK(ferry_grads_init(&t->GB, &t->B));

    float *w = ferry_grads_dense(&t->GA, 0);
    const float wv[4] = {3, 0, 0, 4};
    memcpy(w, wv, sizeof wv);
    int32_t ids[2] = {3, 1}, slots[2];
    CHECK_OK(ferry_grads_row_slots(&t->GA, 1, 2, ids, slots));
    ferry_rowgrad *rg = ferry_grads_rows(&t->GA, 1);
    const float r3[2] = {2, 0}, r1[2] = {1, 2};
    memcpy(rg->values + slots[0] * 2, r3, sizeof r3);
    memcpy(rg->values + slots[1] * 2, r1, sizeof r1);
    float *v = ferry_grads_dense(&t->GB, 0);
    const float vv[4] = {9, 6, 3, 3};
    memcpy(v, vv, sizeof vv);
    /* u never got a gradient: whatever its buffer holds must not count. */
    float *u = t->GB.dense + t->B.items[1].offset;
    for (int k = 0; k < 3; k++)
        u[k] = 100.0f;
}

static void two_blocks_deinit(two_blocks *t) {
    ferry_grads_deinit(&t->GA);
    ferry_grads_deinit(&t->GB);
    ferry_params_deinit(&t->A);
    ferry_params_deinit(&t->B);
}

TEST(sumsq_over_several_grads) {
    two_blocks t;
    two_blocks_init(&t);
    const ferry_grads *all[3] = {&t.GA, NULL, &t.GB};
    double ss = 0.0;
    CHECK_OK(ferry_clip_sumsq(all, 3, &ss));
    CHECK(ss == 169.0);
    CHECK_OK(ferry_clip_sumsq(all, 1, &ss));
    CHECK(ss == 34.0);
    CHECK_OK(ferry_clip_sumsq(all, 0, &ss));
    CHECK(ss == 0.0);
    two_blocks_deinit(&t);
}

TEST(step_applies_the_scale) {
    /* SGD lr 1: p <- p - coef * g on every gradient, dense and row-sparse alike. */
    two_blocks t;
    two_blocks_init(&t);
    const ferry_grads *all[2] = {&t.GA, &t.GB};
    double ss = 0.0, norm = 0.0;
    float coef = 0.0f;
    CHECK_OK(ferry_clip_sumsq(all, 2, &ss));
    CHECK_OK(ferry_clip_coef(ss, 6.5f, &coef, &norm));
    float before[32];
    memcpy(before, t.A.data, (size_t)t.A.numel * sizeof(float));
    ferry_optim_config cfg = ferry_optim_defaults(FERRY_OPTIM_SGD);
    ferry_optim *o;
    CHECK_OK(ferry_optim_create(&t.A, &cfg, &o));
    CHECK_OK(ferry_optim_step(o, &t.A, &t.GA, coef));
    const float gw[4] = {3, 0, 0, 4};
    for (int k = 0; k < 4; k++)
        CHECK(t.A.data[k] == before[k] + -1.0f * (gw[k] * coef));
    const float *tab = ferry_params_data(&t.A, 1), *tab0 = before + t.A.items[1].offset;
    const float gt[10] = {0, 0, 1, 2, 0, 0, 2, 0, 0, 0};
    for (int k = 0; k < 10; k++)
        CHECK(tab[k] == tab0[k] + -1.0f * (gt[k] * coef));
    CHECK_NEAR(tab[2], (double)tab0[2] - 0.5, 1e-6);
    ferry_optim_destroy(o);
    two_blocks_deinit(&t);
}

/* ferry_grads_add_dense: the first gradient since a zero is copied over whatever the
 * buffer held, the next ones added; a row-sparse parameter is refused. */
TEST(add_dense_copies_then_adds) {
    two_blocks t;
    two_blocks_init(&t);
    const float a[3] = {1, 2, 3}, b[3] = {0.5f, -2, 4};
    CHECK(!t.GB.touched[1]); /* u: junk (100) in its buffer */
    CHECK_OK(ferry_grads_add_dense(&t.GB, 1, a));
    const float *u = t.GB.dense + t.B.items[1].offset;
    CHECK(t.GB.touched[1] && u[0] == 1 && u[1] == 2 && u[2] == 3);
    CHECK_OK(ferry_grads_add_dense(&t.GB, 1, b));
    CHECK(u[0] == 1.5f && u[1] == 0 && u[2] == 7);
    ferry_grads_zero(&t.GB);
    CHECK_OK(ferry_grads_add_dense(&t.GB, 1, b));
    CHECK(u[0] == 0.5f && u[1] == -2 && u[2] == 4);
    CHECK_STATUS(ferry_grads_add_dense(&t.GA, 1, a), FERRY_ERR_INVALID);
    two_blocks_deinit(&t);
}

FERRY_TEST_MAIN(T(coef_matches_torch_formula) T(coef_errors) T(sumsq_over_several_grads)
                    T(step_applies_the_scale) T(add_dense_copies_then_adds))
