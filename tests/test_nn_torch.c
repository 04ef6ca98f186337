/* test_nn_torch.c - the layers against reference vectors computed by PyTorch in
 * float64: tests/data/torch_nn.json (linear, embedding, cross-entropy mean and
 * sum, a 2-layer and a wider 1-layer LSTM) and the constrained-LSTM cases of
 * tests/data/cdopt_vectors.json, where a plain LSTM fed the recorded effective
 * weight A(W_hh) must reproduce the outputs, dLoss/dA(W_hh) and every other
 * gradient (including the dropout case with its recorded mask). Every value
 * must satisfy |ours - theirs| <= 1e-5 + 1e-4 |theirs|. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "json.h" /* ferry_json_* */
#include "ferry/nn.h"

#define ATOL 1e-5
#define RTOL 1e-4

static ferry_json *load(const char *rel) {
    ferry_json *root = NULL;
    CHECK_OK(ferry_json_parse_file(ferry_test_path(rel), &root));
    return root;
}

/* The float data of the tensor at path (caller frees); checks the element count. */
static float *jf(const ferry_json *node, const char *path, long want) {
    long n = -1;
    float *p = ferry_json_tensor_f32(ferry_json_path(node, path), &n);
    if (p == NULL || n != want) {
        fprintf(stderr, "  %s: missing or %ld elements, want %ld (%s)\n", path, n, want,
                ferry_error_last());
        CHECK(0);
    }
    return p;
}

/* n floats against the float64 tensor at path, |a - b| <= ATOL + RTOL |b|. */
static void expect(const ferry_json *node, const char *path, const float *got, long n) {
    CHECK(ferry_check_json(node, path, got, n, ATOL, RTOL));
}

static ferry_tensor host_f32(ferry_shape s, float *data) {
    return ferry_tensor_wrap(ferry_backend_cpu(), FERRY_DTYPE_F32, s, data);
}

/* Loads the JSON tensor at path into parameter idx. */
static void set_param(ferry_params *P, int idx, const ferry_json *node, const char *path) {
    float *v = jf(node, path, (long)P->items[idx].numel);
    memcpy(ferry_params_data(P, idx), v, (size_t)P->items[idx].numel * sizeof *v);
    free(v);
}

static const float *dense_grad(ferry_ctx *ctx, ferry_params *P, int idx) {
    ferry_grads *G = ferry_ctx_grads(ctx, P);
    CHECK(G != NULL && G->touched[idx]);
    return G->dense + P->items[idx].offset;
}

TEST(linear) {
    ferry_json *root = load("tests/data/torch_nn.json");
    const ferry_json *c = ferry_json_get(root, "linear");
    ferry_ctx *ctx;
    ferry_params P;
    ferry_linear lin;
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &ctx));
    ferry_params_init(&P, ferry_backend_cpu());
    CHECK_OK(ferry_linear_init(&lin, &P, "linear", 3, 4, 1));
    CHECK_OK(ferry_params_alloc(&P));
    set_param(&P, lin.weight, c, "params.weight");
    set_param(&P, lin.bias, c, "params.bias");
    float *x = jf(c, "inputs.x", 15), *R = jf(c, "upstream.R", 20);
    ferry_tensor tx = host_f32(ferry_shape_2d(5, 3), x), tR = host_f32(ferry_shape_2d(5, 4), R);
    ferry_tensor *y;
    CHECK_OK(ferry_ctx_require_grad(ctx, &tx));
    CHECK_OK(ferry_linear_forward(&lin, ctx, &tx, &y));
    expect(c, "output", ferry_tensor_f32(y), 20);
    const ferry_tensor *outs[1] = {y}, *seeds[1] = {&tR};
    CHECK_OK(ferry_ctx_backward_from(ctx, 1, outs, seeds));
    expect(c, "grads.weight", dense_grad(ctx, &P, lin.weight), 12);
    expect(c, "grads.bias", dense_grad(ctx, &P, lin.bias), 4);
    expect(c, "grad_inputs.x", ferry_tensor_f32(ferry_ctx_grad_of(ctx, &tx)), 15);
    free(x), free(R);
    ferry_ctx_destroy(ctx);
    ferry_params_deinit(&P);
    ferry_json_destroy(root);
}

TEST(embedding) {
    ferry_json *root = load("tests/data/torch_nn.json");
    const ferry_json *c = ferry_json_get(root, "embedding");
    ferry_ctx *ctx;
    ferry_params P;
    ferry_embedding emb;
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &ctx));
    ferry_params_init(&P, ferry_backend_cpu());
    CHECK_OK(ferry_embedding_init(&emb, &P, "embedding", 10, 3));
    CHECK_OK(ferry_params_alloc(&P));
    set_param(&P, emb.weight, c, "params.weight");
    float *fid = jf(c, "inputs.ids", 7), *R = jf(c, "upstream.R", 21);
    int32_t ids[7];
    for (int i = 0; i < 7; i++)
        ids[i] = (int32_t)fid[i];
    ferry_tensor tid =
        ferry_tensor_wrap(ferry_backend_cpu(), FERRY_DTYPE_I32, ferry_shape_1d(7), ids);
    ferry_tensor tR = host_f32(ferry_shape_2d(7, 3), R), *y;
    CHECK_OK(ferry_embedding_forward(&emb, ctx, &tid, &y));
    expect(c, "output", ferry_tensor_f32(y), 21);
    const ferry_tensor *outs[1] = {y}, *seeds[1] = {&tR};
    CHECK_OK(ferry_ctx_backward_from(ctx, 1, outs, seeds));
    /* Expand the row-sparse gradient to the dense table torch reports. */
    ferry_rowgrad *rg = ferry_grads_rows(ferry_ctx_grads(ctx, &P), emb.weight);
    float dense[30] = {0};
    for (int64_t s = 0; s < rg->count; s++)
        for (int d = 0; d < 3; d++)
            dense[rg->rows[s] * 3 + d] += rg->values[s * 3 + d];
    expect(c, "grads.weight", dense, 30);
    free(fid), free(R);
    ferry_ctx_destroy(ctx);
    ferry_params_deinit(&P);
    ferry_json_destroy(root);
}

static void run_xent(const char *name, float scale) {
    ferry_json *root = load("tests/data/torch_nn.json");
    const ferry_json *c = ferry_json_get(root, name);
    ferry_ctx *ctx;
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &ctx));
    float *z = jf(c, "inputs.logits", 30), *ft = jf(c, "inputs.targets", 6);
    int32_t tg[6];
    for (int i = 0; i < 6; i++)
        tg[i] = (int32_t)ft[i];
    ferry_tensor tz = host_f32(ferry_shape_2d(6, 5), z), *loss;
    ferry_tensor tt =
        ferry_tensor_wrap(ferry_backend_cpu(), FERRY_DTYPE_I32, ferry_shape_1d(6), tg);
    double sum;
    CHECK_OK(ferry_ctx_require_grad(ctx, &tz));
    CHECK_OK(ferry_xent_forward(ctx, &tz, &tt, scale, &loss, &sum));
    double want = ferry_json_num(ferry_json_get(c, "loss"));
    CHECK_NEAR((double)scale * sum, want, ATOL + RTOL * fabs(want));
    CHECK_NEAR(ferry_tensor_f32(loss)[0], want, ATOL + RTOL * fabs(want));
    CHECK_OK(ferry_ctx_backward(ctx, loss));
    expect(c, "grad_inputs.logits", ferry_tensor_f32(ferry_ctx_grad_of(ctx, &tz)), 30);
    free(z), free(ft);
    ferry_ctx_destroy(ctx);
    ferry_json_destroy(root);
}

TEST(xent_mean) {
    run_xent("xent_mean", 1.0f / 6.0f);
}

TEST(xent_sum) {
    run_xent("xent_sum", 1.0f);
}

/* ---- LSTM cases (both files share the layout) ---- */

typedef struct lstm_ref {
    const char *file, *name; /* case name in the file */
    const char *w_hh_src;    /* where weight_hh_l%d comes from, a format with the layer */
    const char *dw_hh_want;  /* where its gradient is, a format with the layer */
    int ones_seed;           /* 1: loss = sum(output); 0: upstream R, Rh, Rc */
} lstm_ref;

static const ferry_json *find_case(const ferry_json *root, const char *name) {
    const ferry_json *lstm = ferry_json_get(root, "lstm");
    if (lstm == NULL)
        return ferry_json_get(root, name); /* torch_nn.json: cases by name at the top */
    for (size_t i = 0; i < ferry_json_len(lstm); i++) {
        const ferry_json *c = ferry_json_at(lstm, i);
        if (strcmp(ferry_json_str(ferry_json_get(c, "name")), name) == 0)
            return c;
    }
    return NULL;
}

static void run_lstm(const lstm_ref *ref) {
    ferry_json *root = load(ref->file);
    const ferry_json *c = find_case(root, ref->name);
    CHECK(c != NULL);
    int L = (int)ferry_json_num(ferry_json_get(c, "num_layers"));
    int64_t C = (int64_t)ferry_json_num(ferry_json_get(c, "input_size"));
    int64_t H = (int64_t)ferry_json_num(ferry_json_get(c, "hidden_size"));
    int64_t T = (int64_t)ferry_json_num(ferry_json_get(c, "seq_len"));
    int64_t B = (int64_t)ferry_json_num(ferry_json_get(c, "batch"));
    long TBC = (long)(T * B * C), TBH = (long)(T * B * H), LBH = (long)(L * B * H);
    fprintf(stderr, "  %s: L=%d C=%lld H=%lld T=%lld B=%lld\n", ref->name, L, (long long)C,
            (long long)H, (long long)T, (long long)B);
    ferry_ctx *ctx;
    ferry_params P;
    ferry_lstm rnn;
    char path[96], want[96];
    CHECK_OK(ferry_ctx_create(ferry_backend_cpu(), &ctx));
    ferry_params_init(&P, ferry_backend_cpu());
    CHECK_OK(ferry_lstm_init(&rnn, &P, "lstm", C, H, L, 0.0f));
    CHECK_OK(ferry_params_alloc(&P));
    for (int l = 0; l < L; l++) {
        (void)snprintf(path, sizeof path, "params.weight_ih_l%d", l);
        set_param(&P, rnn.w_ih[l], c, path);
        (void)snprintf(path, sizeof path, ref->w_hh_src, l);
        set_param(&P, rnn.w_hh[l], c, path);
        (void)snprintf(path, sizeof path, "params.bias_ih_l%d", l);
        set_param(&P, rnn.b_ih[l], c, path);
        (void)snprintf(path, sizeof path, "params.bias_hh_l%d", l);
        set_param(&P, rnn.b_hh[l], c, path);
    }
    float *x = jf(c, "inputs.x", TBC), *h0 = jf(c, "inputs.h0", LBH);
    float *c0 = jf(c, "inputs.c0", LBH);
    ferry_tensor tx = host_f32(ferry_shape_3d(T, B, C), x);
    ferry_tensor th0 = host_f32(ferry_shape_3d(L, B, H), h0);
    ferry_tensor tc0 = host_f32(ferry_shape_3d(L, B, H), c0);
    /* The dropout case's recorded masks (after_l{k}, k < L-1). */
    float *masks[FERRY_LSTM_MAX_LAYERS] = {0};
    int has_masks = ferry_json_get(c, "dropout_masks") != NULL;
    for (int l = 0; has_masks && l < L - 1; l++) {
        (void)snprintf(path, sizeof path, "dropout_masks.after_l%d", l);
        masks[l] = jf(c, path, TBH);
    }
    ferry_lstm_opts opts = {(const float *const *)masks};
    CHECK_OK(ferry_ctx_require_grad(ctx, &tx));
    CHECK_OK(ferry_ctx_require_grad(ctx, &th0));
    CHECK_OK(ferry_ctx_require_grad(ctx, &tc0));
    ferry_tensor *y, *hn, *cn;
    CHECK_OK(
        ferry_lstm_forward(&rnn, ctx, &tx, &th0, &tc0, has_masks ? &opts : NULL, &y, &hn, &cn));
    expect(c, "output", ferry_tensor_f32(y), TBH);
    expect(c, "h_n", ferry_tensor_f32(hn), LBH);
    expect(c, "c_n", ferry_tensor_f32(cn), LBH);

    float *R = NULL, *Rh = NULL, *Rc = NULL;
    if (ref->ones_seed) {
        R = malloc((size_t)TBH * sizeof *R);
        CHECK(R != NULL);
        for (long i = 0; i < TBH; i++)
            R[i] = 1.0f;
    } else {
        R = jf(c, "upstream.R", TBH), Rh = jf(c, "upstream.Rh", LBH),
        Rc = jf(c, "upstream.Rc", LBH);
    }
    ferry_tensor tR = host_f32(y->shape, R), tRh = host_f32(hn->shape, Rh);
    ferry_tensor tRc = host_f32(cn->shape, Rc);
    const ferry_tensor *outs[3] = {y, hn, cn}, *seeds[3] = {&tR, &tRh, &tRc};
    CHECK_OK(ferry_ctx_backward_from(ctx, ref->ones_seed ? 1 : 3, outs, seeds));
    for (int l = 0; l < L; l++) {
        (void)snprintf(want, sizeof want, "grads.weight_ih_l%d", l);
        expect(c, want, dense_grad(ctx, &P, rnn.w_ih[l]), (long)P.items[rnn.w_ih[l]].numel);
        (void)snprintf(want, sizeof want, ref->dw_hh_want, l);
        expect(c, want, dense_grad(ctx, &P, rnn.w_hh[l]), (long)(4 * H * H));
        (void)snprintf(want, sizeof want, "grads.bias_ih_l%d", l);
        expect(c, want, dense_grad(ctx, &P, rnn.b_ih[l]), (long)(4 * H));
        (void)snprintf(want, sizeof want, "grads.bias_hh_l%d", l);
        expect(c, want, dense_grad(ctx, &P, rnn.b_hh[l]), (long)(4 * H));
    }
    expect(c, "grad_inputs.x", ferry_tensor_f32(ferry_ctx_grad_of(ctx, &tx)), TBC);
    expect(c, "grad_inputs.h0", ferry_tensor_f32(ferry_ctx_grad_of(ctx, &th0)), LBH);
    expect(c, "grad_inputs.c0", ferry_tensor_f32(ferry_ctx_grad_of(ctx, &tc0)), LBH);
    free(x), free(h0), free(c0), free(R), free(Rh), free(Rc);
    for (int l = 0; l < FERRY_LSTM_MAX_LAYERS; l++)
        free(masks[l]);
    ferry_ctx_destroy(ctx);
    ferry_params_deinit(&P);
    ferry_json_destroy(root);
}

TEST(lstm_2layer) {
    lstm_ref r = {"tests/data/torch_nn.json", "lstm_2layer", "params.weight_hh_l%d",
                  "grads.weight_hh_l%d", 0};
    run_lstm(&r);
}

TEST(lstm_1layer_big) {
    lstm_ref r = {"tests/data/torch_nn.json", "lstm_1layer_big", "params.weight_hh_l%d",
                  "grads.weight_hh_l%d", 0};
    run_lstm(&r);
}

/* cdopt: loss = sum(output) + penalty(raw W_hh). The penalty touches neither x,
 * h0, c0, W_ih nor the biases, so those gradients compare directly; the LSTM run
 * with A(W_hh) as its weight yields d sum(output) / dA = grad_A_weight_hh. */
TEST(cdopt_lstm_1layer) {
    lstm_ref r = {"tests/data/cdopt_vectors.json", "lstm_1layer", "A_weight_hh.l%d",
                  "grad_A_weight_hh.l%d", 1};
    run_lstm(&r);
}

TEST(cdopt_lstm_2layer) {
    lstm_ref r = {"tests/data/cdopt_vectors.json", "lstm_2layer", "A_weight_hh.l%d",
                  "grad_A_weight_hh.l%d", 1};
    run_lstm(&r);
}

TEST(cdopt_lstm_2layer_dropout) {
    lstm_ref r = {"tests/data/cdopt_vectors.json", "lstm_2layer_dropout", "A_weight_hh.l%d",
                  "grad_A_weight_hh.l%d", 1};
    run_lstm(&r);
}

FERRY_TEST_MAIN(T(linear) T(embedding) T(xent_mean) T(xent_sum) T(lstm_2layer) T(lstm_1layer_big)
                    T(cdopt_lstm_1layer) T(cdopt_lstm_2layer) T(cdopt_lstm_2layer_dropout))
