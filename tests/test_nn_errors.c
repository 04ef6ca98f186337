/* test_nn_errors.c - bad input to the layers: wrong shapes give FERRY_ERR_SHAPE
 * with a message naming the layer and both shapes, out-of-range ids and targets
 * give FERRY_ERR_RANGE naming the value, bad hyper-parameters FERRY_ERR_INVALID;
 * nothing crashes and a failed call leaves no node on the tape. */
#include <string.h>

#include "check.h"
#include "ferry/nn.h"

/* The last error message must contain every one of the given fragments. */
static void expect_msg(const char *a, const char *b, const char *c) {
    const char *msg = ferry_error_last();
    const char *want[3] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        if (want[i] != NULL && strstr(msg, want[i]) == NULL) {
            fprintf(stderr, "  message '%s' lacks '%s'\n", msg, want[i]);
            CHECK(0);
        }
    }
    fprintf(stderr, "  ok: %s\n", msg);
}

static ferry_tensor f32(ferry_shape s, float *d) {
    return ferry_tensor_wrap(ferry_backend_cpu(), FERRY_DTYPE_F32, s, d);
}

static ferry_tensor i32(ferry_shape s, int32_t *d) {
    return ferry_tensor_wrap(ferry_backend_cpu(), FERRY_DTYPE_I32, s, d);
}

static float zeros[4096];
static int32_t izeros[256];

TEST(linear_shapes) {
    ferry_ctx *ctx;
    ferry_params P;
    ferry_linear lin;
    ferry_tensor *y = NULL;
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &ctx));
    ferry_params_init(&P, ferry_backend_cpu());
    CHECK_OK(ferry_linear_init(&lin, &P, "dec", 3, 4, 1));
    ferry_tensor x = f32(ferry_shape_2d(2, 3), zeros);
    CHECK_STATUS(ferry_linear_forward(&lin, ctx, &x, &y), FERRY_ERR_INVALID); /* not allocated */
    expect_msg("linear dec", "not allocated", NULL);
    CHECK_OK(ferry_params_alloc(&P));
    ferry_tensor bad = f32(ferry_shape_2d(2, 7), zeros);
    CHECK_STATUS(ferry_linear_forward(&lin, ctx, &bad, &y), FERRY_ERR_SHAPE);
    expect_msg("linear dec", "(2, 7)", "(4, 3)");
    ferry_tensor ints = i32(ferry_shape_2d(2, 3), izeros);
    CHECK_STATUS(ferry_linear_forward(&lin, ctx, &ints, &y), FERRY_ERR_SHAPE);
    expect_msg("linear dec", "(2, 3)", "float32");
    CHECK(y == NULL);
    CHECK_EQ(ferry_ctx_tape_length(ctx), 0);
    CHECK_OK(ferry_linear_forward(&lin, ctx, &x, &y)); /* still usable */
    CHECK_EQ(ferry_ctx_tape_length(ctx), 1);
    CHECK_STATUS(ferry_linear_init(&lin, &P, "late", 3, 4, 0), FERRY_ERR_BUSY);
    ferry_linear other;
    ferry_params Q;
    ferry_params_init(&Q, ferry_backend_cpu());
    CHECK_STATUS(ferry_linear_init(&other, &Q, "zero", 0, 4, 1), FERRY_ERR_SHAPE);
    ferry_params_deinit(&Q);
    ferry_ctx_destroy(ctx);
    ferry_params_deinit(&P);
}

TEST(embedding_ids) {
    ferry_ctx *ctx;
    ferry_params P;
    ferry_embedding emb;
    ferry_tensor *y = NULL;
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &ctx));
    ferry_params_init(&P, ferry_backend_cpu());
    CHECK_OK(ferry_embedding_init(&emb, &P, "enc", 10, 3));
    CHECK_OK(ferry_params_alloc(&P));
    int32_t ids[6] = {1, 2, 10, 3, 4, 5};
    ferry_tensor t = i32(ferry_shape_2d(2, 3), ids);
    CHECK_STATUS(ferry_embedding_forward(&emb, ctx, &t, &y), FERRY_ERR_RANGE);
    expect_msg("embedding enc:", "id 10 at position 2", "[0, 10)");
    ids[2] = -1;
    CHECK_STATUS(ferry_embedding_forward(&emb, ctx, &t, &y), FERRY_ERR_RANGE);
    expect_msg("embedding enc:", "id -1", NULL);
    ferry_tensor fl = f32(ferry_shape_1d(6), zeros);
    CHECK_STATUS(ferry_embedding_forward(&emb, ctx, &fl, &y), FERRY_ERR_SHAPE);
    expect_msg("embedding enc:", "(6)", "int32");
    ferry_shape four = {4, {1, 1, 2, 3}};
    ferry_tensor t4 = i32(four, izeros);
    CHECK_STATUS(ferry_embedding_forward(&emb, ctx, &t4, &y), FERRY_ERR_SHAPE);
    expect_msg("embedding enc:", "(1, 1, 2, 3)", "(10, 3)");
    CHECK(y == NULL);
    CHECK_EQ(ferry_ctx_tape_length(ctx), 0);
    ferry_ctx_destroy(ctx);
    ferry_params_deinit(&P);
}

TEST(lstm_shapes) {
    ferry_ctx *ctx;
    ferry_params P;
    ferry_lstm rnn;
    ferry_tensor *y = NULL, *hn = NULL, *cn = NULL;
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &ctx));
    ferry_params_init(&P, ferry_backend_cpu());
    CHECK_STATUS(ferry_lstm_init(&rnn, &P, "rnn", 3, 4, 0, 0.0f), FERRY_ERR_SHAPE);
    CHECK_STATUS(ferry_lstm_init(&rnn, &P, "rnn", 3, 4, FERRY_LSTM_MAX_LAYERS + 1, 0.0f),
                 FERRY_ERR_SHAPE);
    CHECK_STATUS(ferry_lstm_init(&rnn, &P, "rnn", 3, 4, 2, 1.0f), FERRY_ERR_INVALID);
    CHECK_OK(ferry_lstm_init(&rnn, &P, "rnn", 3, 4, 2, 0.0f));
    CHECK_OK(ferry_params_alloc(&P));
    ferry_tensor x = f32(ferry_shape_3d(5, 2, 3), zeros);
    ferry_tensor xc = f32(ferry_shape_3d(5, 2, 6), zeros);
    CHECK_STATUS(ferry_lstm_forward(&rnn, ctx, &xc, NULL, NULL, NULL, &y, &hn, &cn),
                 FERRY_ERR_SHAPE);
    expect_msg("lstm rnn", "(5, 2, 6)", "(16, 3)");
    ferry_tensor x2 = f32(ferry_shape_2d(10, 3), zeros);
    CHECK_STATUS(ferry_lstm_forward(&rnn, ctx, &x2, NULL, NULL, NULL, &y, &hn, &cn),
                 FERRY_ERR_SHAPE);
    expect_msg("lstm rnn", "(10, 3)", "(T, B, 3)");
    ferry_tensor h_bad = f32(ferry_shape_3d(2, 3, 4), zeros); /* B = 3, not 2 */
    ferry_tensor h_ok = f32(ferry_shape_3d(2, 2, 4), zeros);
    CHECK_STATUS(ferry_lstm_forward(&rnn, ctx, &x, &h_bad, &h_ok, NULL, &y, &hn, &cn),
                 FERRY_ERR_SHAPE);
    expect_msg("h0 is (2, 3, 4)", "(2, 2, 4)", "lstm rnn");
    CHECK_STATUS(ferry_lstm_forward(&rnn, ctx, &x, &h_ok, &h_bad, NULL, &y, &hn, &cn),
                 FERRY_ERR_SHAPE);
    expect_msg("c0 is (2, 3, 4)", "(2, 2, 4)", NULL);
    ferry_tensor h_int = i32(ferry_shape_3d(2, 2, 4), izeros);
    CHECK_STATUS(ferry_lstm_forward(&rnn, ctx, &x, &h_int, NULL, NULL, &y, &hn, &cn),
                 FERRY_ERR_SHAPE);
    const float *no_masks[1] = {NULL};
    ferry_lstm_opts opts = {no_masks};
    CHECK_STATUS(ferry_lstm_forward(&rnn, ctx, &x, NULL, NULL, &opts, &y, &hn, &cn),
                 FERRY_ERR_INVALID);
    expect_msg("masks[0]", NULL, NULL);
    CHECK(y == NULL && hn == NULL && cn == NULL);
    CHECK_EQ(ferry_ctx_tape_length(ctx), 0);
    CHECK_OK(ferry_lstm_forward(&rnn, ctx, &x, &h_ok, &h_ok, NULL, &y, &hn, &cn));
    CHECK_EQ(ferry_ctx_tape_length(ctx), 1);
    ferry_ctx_destroy(ctx);
    ferry_params_deinit(&P);
}

TEST(xent_targets) {
    ferry_ctx *ctx;
    ferry_tensor *loss = NULL;
    float z[12] = {0};
    int32_t tg[3] = {0, 4, 5};
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &ctx));
    ferry_tensor logits = f32(ferry_shape_2d(3, 4), z);
    ferry_tensor t = i32(ferry_shape_1d(3), tg);
    CHECK_STATUS(ferry_xent_forward(ctx, &logits, &t, 1.0f, &loss, NULL), FERRY_ERR_RANGE);
    expect_msg("xent", "target 4 at position 1", "[0, 4)");
    tg[1] = -2;
    CHECK_STATUS(ferry_xent_forward(ctx, &logits, &t, 1.0f, &loss, NULL), FERRY_ERR_RANGE);
    expect_msg("target -2", NULL, NULL);
    ferry_tensor t2 = i32(ferry_shape_1d(2), tg);
    CHECK_STATUS(ferry_xent_forward(ctx, &logits, &t2, 1.0f, &loss, NULL), FERRY_ERR_SHAPE);
    expect_msg("xent", "(3, 4)", "(2)");
    ferry_tensor tf = f32(ferry_shape_1d(3), z);
    CHECK_STATUS(ferry_xent_forward(ctx, &logits, &tf, 1.0f, &loss, NULL), FERRY_ERR_SHAPE);
    CHECK(loss == NULL);
    CHECK_EQ(ferry_ctx_tape_length(ctx), 0);
    ferry_ctx_destroy(ctx);
}

TEST(dropout_args) {
    ferry_ctx *ctx;
    ferry_tensor *y = NULL;
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &ctx));
    ferry_tensor x = f32(ferry_shape_1d(8), zeros);
    CHECK_STATUS(ferry_dropout_forward(ctx, 1.0f, &x, &y), FERRY_ERR_INVALID);
    expect_msg("dropout", "p = 1", NULL);
    CHECK_STATUS(ferry_dropout_forward(ctx, -0.1f, &x, &y), FERRY_ERR_INVALID);
    CHECK_STATUS(ferry_dropout_forward(ctx, NAN, &x, &y), FERRY_ERR_INVALID);
    CHECK_STATUS(ferry_dropout_forward_mask(ctx, &x, NULL, &y), FERRY_ERR_INVALID);
    ferry_tensor xi = i32(ferry_shape_1d(8), izeros);
    CHECK_STATUS(ferry_dropout_forward(ctx, 0.5f, &xi, &y), FERRY_ERR_SHAPE);
    expect_msg("dropout", "(8)", "float32");
    CHECK(y == NULL);
    CHECK_EQ(ferry_ctx_tape_length(ctx), 0);
    ferry_ctx_destroy(ctx);
}

FERRY_TEST_MAIN(T(linear_shapes) T(embedding_ids) T(lstm_shapes) T(xent_targets) T(dropout_args))
