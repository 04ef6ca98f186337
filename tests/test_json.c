/* test_json.c - the JSON reader of tests/support/json.h: syntax, escapes, numbers,
 * error reporting, paths and the {shape, data} tensor decoder; then a sanity pass over
 * the reference vectors in tests/data/ (every shape the numerics tests rely on, and a few
 * identities the generators guarantee). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "json.h" /* ferry_json_* */

static ferry_json *parse_ok(const char *text) {
    ferry_json *root = NULL;
    CHECK_OK(ferry_json_parse(text, strlen(text), &root));
    CHECK(root != NULL);
    return root;
}

static ferry_json *load(const char *rel) {
    ferry_json *root = NULL;
    CHECK_OK(ferry_json_parse_file(ferry_test_path(rel), &root));
    return root;
}

/* Decodes the tensor at path and checks its shape; returns the data (caller frees). */
static double *tensor_at(const ferry_json *root, const char *path, int ndim, const long *want) {
    double *d = NULL;
    int nd = -1;
    long dims[4], n = ferry_json_tensor(ferry_json_path(root, path), &d, &nd, dims);
    if (n < 0 || nd != ndim || (nd > 0 && memcmp(dims, want, (size_t)nd * sizeof *dims) != 0)) {
        fprintf(stderr, "%s: n=%ld ndim=%d (want %d) dims=%ld,%ld,%ld,%ld: %s\n", path, n, nd, ndim,
                dims[0], dims[1], dims[2], dims[3], n < 0 ? ferry_error_last() : "");
        CHECK(!"tensor shape mismatch");
    }
    return d;
}

static void check_shape(const ferry_json *root, const char *path, int ndim, long d0, long d1,
                        long d2) {
    long want[3] = {d0, d1, d2};
    free(tensor_at(root, path, ndim, want));
}

/* ---- the reader ---- */

TEST(nesting) {
    ferry_json *r = parse_ok(" {\"a\": [1, {\"b\": [true, false, null]}, \"s\"],\n"
                             "  \"n\": -2.5e1, \"e\": {}, \"z\": []} ");
    CHECK_EQ(ferry_json_type_of(r), FERRY_JSON_OBJECT);
    CHECK_EQ(ferry_json_len(r), 4);
    CHECK(strcmp(ferry_json_key(r, 1), "n") == 0);
    CHECK(ferry_json_key(r, 4) == NULL);
    const ferry_json *a = ferry_json_get(r, "a");
    CHECK_EQ(ferry_json_type_of(a), FERRY_JSON_ARRAY);
    CHECK_EQ(ferry_json_len(a), 3);
    CHECK(ferry_json_num(ferry_json_at(a, 0)) == 1.0);
    CHECK(strcmp(ferry_json_str(ferry_json_at(a, 2)), "s") == 0);
    CHECK(ferry_json_at(a, 3) == NULL);
    const ferry_json *b = ferry_json_path(r, "a.1.b");
    CHECK_EQ(ferry_json_len(b), 3);
    CHECK_EQ(ferry_json_bool(ferry_json_at(b, 0)), 1);
    CHECK_EQ(ferry_json_bool(ferry_json_at(b, 1)), 0);
    CHECK_EQ(ferry_json_type_of(ferry_json_at(b, 2)), FERRY_JSON_NULL);
    CHECK_EQ(ferry_json_bool(ferry_json_at(b, 2)), -1);
    CHECK(ferry_json_num(ferry_json_get(r, "n")) == -25.0);
    CHECK(ferry_json_num(ferry_json_at(r, 1)) == -25.0); /* value i of an object */
    CHECK_EQ(ferry_json_len(ferry_json_get(r, "e")), 0);
    CHECK_EQ(ferry_json_type_of(ferry_json_get(r, "z")), FERRY_JSON_ARRAY);
    /* Mismatched accessors answer NULL / NAN / 0, never crash. */
    CHECK(ferry_json_get(a, "x") == NULL && ferry_json_get(r, "missing") == NULL);
    CHECK(isnan(ferry_json_num(a)) && isnan(ferry_json_num(NULL)));
    CHECK(ferry_json_str(ferry_json_get(r, "n")) == NULL && ferry_json_str(NULL) == NULL);
    CHECK(ferry_json_len(ferry_json_get(r, "n")) == 0 && ferry_json_len(NULL) == 0);
    CHECK(ferry_json_at(NULL, 0) == NULL && ferry_json_get(NULL, "a") == NULL);
    CHECK_EQ(ferry_json_type_of(NULL), FERRY_JSON_NONE);
    ferry_json_destroy(r);
    ferry_json_destroy(NULL);
}

TEST(escapes) {
    ferry_json *r = parse_ok("[\"q\\\"b\\\\s\\/\\b\\f\\n\\r\\t.\", \"\\u00e9\\u20AC\","
                             " \"\\ud83d\\ude00\", \"\", \"caf\xc3\xa9\"]");
    CHECK(strcmp(ferry_json_str(ferry_json_at(r, 0)), "q\"b\\s/\b\f\n\r\t.") == 0);
    CHECK(strcmp(ferry_json_str(ferry_json_at(r, 1)), "\xc3\xa9\xe2\x82\xac") == 0);
    CHECK(strcmp(ferry_json_str(ferry_json_at(r, 2)), "\xf0\x9f\x98\x80") == 0);
    CHECK(strcmp(ferry_json_str(ferry_json_at(r, 3)), "") == 0);
    CHECK(strcmp(ferry_json_str(ferry_json_at(r, 4)), "caf\xc3\xa9") == 0);
    ferry_json_destroy(r);
    /* Escaped keys are decoded before lookup. */
    r = parse_ok("{\"k\\u0031\": 7, \"a.b\": 8}");
    CHECK(ferry_json_num(ferry_json_get(r, "k1")) == 7.0);
    CHECK(ferry_json_num(ferry_json_get(r, "a.b")) == 8.0);
    ferry_json_destroy(r);
}

TEST(numbers) {
    ferry_json *r = parse_ok("[0, -0, 1.5e3, 1E-2, 2e+2, -12.75, 1e-400, NaN, Infinity, -Infinity,"
                             " 123456789012345678901234567890,"
                             " 0.1000000000000000055511151231257827021181583404541015625000000001,"
                             " 2.000960206279684e-05]");
    const double want[] = {0, -0.0, 1500, 0.01, 200, -12.75, 0};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK(ferry_json_num(ferry_json_at(r, i)) == want[i]);
    CHECK(signbit(ferry_json_num(ferry_json_at(r, 1))));
    CHECK(isnan(ferry_json_num(ferry_json_at(r, 7))));
    CHECK(isinf(ferry_json_num(ferry_json_at(r, 8))) && ferry_json_num(ferry_json_at(r, 8)) > 0);
    CHECK(isinf(ferry_json_num(ferry_json_at(r, 9))) && ferry_json_num(ferry_json_at(r, 9)) < 0);
    CHECK(ferry_json_num(ferry_json_at(r, 10)) == 1.2345678901234568e29);
    CHECK(ferry_json_num(ferry_json_at(r, 11)) == 0.1); /* long text, correctly rounded */
    CHECK(ferry_json_num(ferry_json_at(r, 12)) == 2.000960206279684e-05);
    ferry_json_destroy(r);

    /* The text need not be NUL-terminated: only len bytes are read. */
    ferry_json *s = NULL;
    CHECK_OK(ferry_json_parse("[1,2]garbage", 5, &s));
    CHECK_EQ(ferry_json_len(s), 2);
    ferry_json_destroy(s);
    CHECK_OK(ferry_json_parse("1234", 2, &s));
    CHECK(ferry_json_num(s) == 12.0);
    ferry_json_destroy(s);
    CHECK_OK(ferry_json_parse("\xef\xbb\xbf{}", 5, &s)); /* UTF-8 byte-order mark */
    ferry_json_destroy(s);
}

TEST(errors) {
    /* clang-format off */
    static const char *const bad[] = {
        "", "   ", "{", "[", "[1,]", "{\"a\":1,}", "[1 2]", "{\"a\" 1}", "{1:2}", "{\"a\"}",
        "\"abc", "\"a\\x\"", "\"\\u12\"", "\"\\u12G4\"", "\"\\ud800\"", "\"\\ud800x\"",
        "\"\\udc00\"", "\"\\u0000\"", "\"a\tb\"", "\"a\\", "01", "-01", "1.", ".5", "1e", "1e+",
        "-", "+1", "--1", "tru", "nul", "fals", "True", "nan", "-NaN", "[1]x", "{} {}", "1e999",
        "-1e999", "[1,,2]", "[,]", "{,}", "'a'", "\x01"};
    /* clang-format on */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ferry_json *out = (ferry_json *)&out; /* sentinel: must stay unchanged */
        ferry_status st = ferry_json_parse(bad[i], strlen(bad[i]), &out);
        if (st != FERRY_ERR_FORMAT || out != (ferry_json *)&out ||
            strstr(ferry_error_last(), "line 1, column") == NULL) {
            fprintf(stderr, "input #%zu '%s': %s (%s)\n", i, bad[i], ferry_status_str(st),
                    ferry_error_last());
            CHECK(!"bad JSON was not rejected cleanly");
        }
    }
    /* The message points at the offending spot. */
    ferry_json *out = NULL;
    const char *text = "{\n  \"a\": [1,\n   2 x]}";
    CHECK_STATUS(ferry_json_parse(text, strlen(text), &out), FERRY_ERR_FORMAT);
    CHECK(strstr(ferry_error_last(), "line 3, column 6") != NULL);
    CHECK(strstr(ferry_error_last(), "'x'") != NULL);
    /* Nesting is bounded so that hostile input cannot overflow the stack. */
    char deep[2 * FERRY_JSON_MAX_DEPTH + 8];
    size_t depth = FERRY_JSON_MAX_DEPTH + 1;
    memset(deep, '[', depth);
    memset(deep + depth, ']', depth);
    CHECK_STATUS(ferry_json_parse(deep, 2 * depth, &out), FERRY_ERR_FORMAT);
    CHECK_OK(ferry_json_parse(deep + 1, 2 * depth - 2, &out)); /* exactly at the limit */
    ferry_json_destroy(out);
    /* Bad arguments and missing files. */
    CHECK_STATUS(ferry_json_parse("1", 1, NULL), FERRY_ERR_INVALID);
    CHECK_STATUS(ferry_json_parse(NULL, 3, &out), FERRY_ERR_INVALID);
    CHECK_STATUS(ferry_json_parse_file(ferry_test_path("tests/data/no-such.json"), &out),
                 FERRY_ERR_IO);
    CHECK(strstr(ferry_error_last(), "no-such.json") != NULL);
}

TEST(duplicates_and_paths) {
    ferry_json *r = parse_ok("{\"k\": 1, \"k\": 2, \"l\": [[10, 11], {\"0\": \"zero\"}], "
                             "\"m\": {\"n\": {\"o\": 5}}}");
    CHECK(ferry_json_num(ferry_json_get(r, "k")) == 2.0); /* the last one wins */
    CHECK(ferry_json_num(ferry_json_path(r, "l.0.1")) == 11.0);
    CHECK(strcmp(ferry_json_str(ferry_json_path(r, "l.1.0")), "zero") == 0); /* key "0" */
    CHECK(ferry_json_num(ferry_json_path(r, "m.n.o")) == 5.0);
    CHECK(ferry_json_path(r, "") == r);
    const char *const missing[] = {"l.2",  "l.0.2",   "l.x",  "l.-1",
                                   "l.+1", "l.0.1.0", "m..n", "m.n.",
                                   ".m",   "m.n.o.p", "q",    "l.99999999999999999999999"};
    for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++) {
        if (ferry_json_path(r, missing[i]) != NULL) {
            fprintf(stderr, "path '%s' should be missing\n", missing[i]);
            CHECK(0);
        }
    }
    CHECK(ferry_json_path(NULL, "a") == NULL && ferry_json_path(r, NULL) == NULL);
    ferry_json_destroy(r);
}

TEST(tensors) {
    ferry_json *r = parse_ok("{\"m\": {\"shape\": [2, 3], \"data\": [1, 2, 3, 4, 5, 6.5]},"
                             " \"s\": 4.25, \"z\": {\"shape\": [], \"data\": [7]},"
                             " \"e\": {\"shape\": [0, 3], \"data\": []},"
                             " \"b1\": {\"shape\": [2, 2], \"data\": [1, 2, 3]},"
                             " \"b2\": {\"shape\": [2.5], \"data\": [1, 2]},"
                             " \"b3\": {\"shape\": [-1], \"data\": []},"
                             " \"b4\": {\"shape\": [1,1,1,1,1], \"data\": [1]},"
                             " \"b5\": {\"shape\": [2], \"data\": [1, \"x\"]},"
                             " \"b6\": {\"shape\": [1]}, \"b7\": [1, 2], \"b8\": \"str\","
                             " \"b9\": {\"shape\": 1, \"data\": [1]}}");
    double *d = NULL;
    int nd = -1;
    long dims[4];
    CHECK_EQ(ferry_json_tensor(ferry_json_get(r, "m"), &d, &nd, dims), 6);
    CHECK(nd == 2 && dims[0] == 2 && dims[1] == 3 && dims[2] == 1);
    CHECK(d[0] == 1.0 && d[5] == 6.5);
    free(d);
    CHECK_EQ(ferry_json_tensor(ferry_json_get(r, "s"), &d, &nd, dims), 1);
    CHECK(nd == 0 && d[0] == 4.25);
    free(d);
    CHECK_EQ(ferry_json_tensor(ferry_json_get(r, "z"), &d, &nd, NULL), 1);
    CHECK(nd == 0 && d[0] == 7.0);
    free(d);
    CHECK_EQ(ferry_json_tensor(ferry_json_get(r, "e"), &d, &nd, dims), 0);
    CHECK(nd == 2 && dims[0] == 0 && dims[1] == 3);
    free(d);
    CHECK_EQ(ferry_json_tensor(ferry_json_get(r, "m"), NULL, NULL, NULL), 6); /* count only */

    long n = -1;
    float *f = ferry_json_tensor_f32(ferry_json_get(r, "m"), &n);
    CHECK(f != NULL && n == 6 && f[5] == 6.5f);
    free(f);

    const char *const bad[] = {"b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8", "b9", "nope"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        double *sentinel = (double *)&d;
        d = sentinel;
        if (ferry_json_tensor(ferry_json_get(r, bad[i]), &d, &nd, dims) != -1 || d != sentinel) {
            fprintf(stderr, "tensor '%s' should be rejected\n", bad[i]);
            CHECK(0);
        }
        CHECK(strlen(ferry_error_last()) > 0);
        n = -7;
        CHECK(ferry_json_tensor_f32(ferry_json_get(r, bad[i]), &n) == NULL && n == -7);
    }
    ferry_json_destroy(r);
}

/* ---- the reference data files ---- */

TEST(cdopt_vectors) {
    ferry_json *r = load("tests/data/cdopt_vectors.json");
    CHECK(ferry_json_num(ferry_json_path(r, "meta.seed")) == 1234.0);
    CHECK(strcmp(ferry_json_str(ferry_json_path(r, "meta.dtype")), "float64") == 0);
    CHECK(strcmp(ferry_json_str(ferry_json_path(r, "matrices.0.name")), "tall_5x3_near") == 0);
    CHECK(ferry_json_num(ferry_json_path(r, "matrices.0.sqnorm_C")) == 0.01984290749409202);
    CHECK(ferry_json_num(ferry_json_path(r, "matrices.0.X.data.0")) == 2.000960206279684e-05);
    for (size_t i = 0; i < ferry_json_len(ferry_json_get(r, "matrices")); i++) {
        const ferry_json *m = ferry_json_at(ferry_json_get(r, "matrices"), i);
        double pen = ferry_json_num(ferry_json_get(m, "penalty"));
        double beta = ferry_json_num(ferry_json_get(m, "beta"));
        CHECK_NEAR(pen, beta * ferry_json_num(ferry_json_get(m, "sqnorm_C")), 1e-15);
    }
    CHECK_EQ(ferry_json_len(ferry_json_get(r, "lstm")), 3);
    check_shape(r, "lstm.0.params.weight_ih_l0", 2, 16, 3, 0);
    check_shape(r, "lstm.1.params.weight_hh_l1", 2, 16, 4, 0);
    check_shape(r, "lstm.1.grad_inputs.h0", 3, 2, 2, 4);
    check_shape(r, "init.polar", 2, 16, 4, 0);
    ferry_json_destroy(r);
}

static void check_lstm_case(const ferry_json *c) {
    long I = (long)ferry_json_num(ferry_json_get(c, "input_size"));
    long H = (long)ferry_json_num(ferry_json_get(c, "hidden_size"));
    long nl = (long)ferry_json_num(ferry_json_get(c, "num_layers"));
    long L = (long)ferry_json_num(ferry_json_get(c, "seq_len"));
    long N = (long)ferry_json_num(ferry_json_get(c, "batch"));
    CHECK(I > 0 && H > 0 && nl > 0 && L > 0 && N > 0);
    CHECK_EQ(ferry_json_len(ferry_json_get(c, "params")), 4 * nl);
    char path[64];
    for (long k = 0; k < nl; k++) {
        for (int g = 0; g < 2; g++) { /* params, then grads: same names and shapes */
            const char *sec = g ? "grads" : "params";
            (void)snprintf(path, sizeof path, "%s.weight_ih_l%ld", sec, k);
            check_shape(c, path, 2, 4 * H, k ? H : I, 0);
            (void)snprintf(path, sizeof path, "%s.weight_hh_l%ld", sec, k);
            check_shape(c, path, 2, 4 * H, H, 0);
            (void)snprintf(path, sizeof path, "%s.bias_ih_l%ld", sec, k);
            check_shape(c, path, 1, 4 * H, 0, 0);
            (void)snprintf(path, sizeof path, "%s.bias_hh_l%ld", sec, k);
            check_shape(c, path, 1, 4 * H, 0, 0);
        }
        (void)snprintf(path, sizeof path, "gates_preact.l%ld", k);
        check_shape(c, path, 3, L, N, 4 * H);
    }
    const char *const seq[] = {"inputs.x", "grad_inputs.x"};
    const char *const state[] = {
        "inputs.h0", "inputs.c0", "grad_inputs.h0", "grad_inputs.c0", "upstream.Rh", "upstream.Rc",
        "h_n",       "c_n"};
    for (int i = 0; i < 2; i++)
        check_shape(c, seq[i], 3, L, N, I);
    for (int i = 0; i < 8; i++)
        check_shape(c, state[i], 3, nl, N, H);
    check_shape(c, "upstream.R", 3, L, N, H);
    long oshape[3] = {L, N, H}, sshape[3] = {nl, N, H};
    double *out = tensor_at(c, "output", 3, oshape), *hn = tensor_at(c, "h_n", 3, sshape);
    /* The last step of the top layer's output is that layer's final h. */
    for (long i = 0; i < N * H; i++)
        CHECK(out[(L - 1) * N * H + i] == hn[(nl - 1) * N * H + i]);
    free(out);
    free(hn);
    CHECK(isfinite(ferry_json_num(ferry_json_get(c, "loss"))));
}

TEST(torch_nn_shapes) {
    ferry_json *r = load("tests/data/torch_nn.json");
    CHECK(ferry_json_num(ferry_json_path(r, "meta.seed")) == 1234.0);
    check_shape(r, "lstm_2layer.params.weight_ih_l0", 2, 16, 3, 0);
    check_shape(r, "lstm_2layer.params.weight_ih_l1", 2, 16, 4, 0);
    check_shape(r, "lstm_1layer_big.params.weight_hh_l0", 2, 64, 16, 0);
    check_lstm_case(ferry_json_get(r, "lstm_2layer"));
    check_lstm_case(ferry_json_get(r, "lstm_1layer_big"));

    /* linear: y = x W^T + b, and dloss/db is the column sum of R. */
    const ferry_json *lin = ferry_json_get(r, "linear");
    long xs[2] = {5, 3}, ws[2] = {4, 3}, bs[1] = {4}, ys[2] = {5, 4};
    double *x = tensor_at(lin, "inputs.x", 2, xs), *w = tensor_at(lin, "params.weight", 2, ws);
    double *b = tensor_at(lin, "params.bias", 1, bs), *y = tensor_at(lin, "output", 2, ys);
    double *R = tensor_at(lin, "upstream.R", 2, ys), *gb = tensor_at(lin, "grads.bias", 1, bs);
    check_shape(lin, "grads.weight", 2, 4, 3, 0);
    check_shape(lin, "grad_inputs.x", 2, 5, 3, 0);
    for (int j = 0; j < 4; j++) {
        double colsum = 0;
        for (int i = 0; i < 5; i++) {
            double acc = b[j];
            for (int k = 0; k < 3; k++)
                acc += x[i * 3 + k] * w[j * 3 + k];
            CHECK_NEAR(y[i * 4 + j], acc, 1e-12);
            colsum += R[i * 4 + j];
        }
        CHECK_NEAR(gb[j], colsum, 1e-12);
    }
    free(x), free(w), free(b), free(y), free(R), free(gb);

    /* embedding: out[k] = weight[ids[k]]; grad rows sum R over repeated ids. */
    const ferry_json *emb = ferry_json_get(r, "embedding");
    long is[1] = {7}, es[2] = {10, 3}, os[2] = {7, 3};
    double *ids = tensor_at(emb, "inputs.ids", 1, is), *ew = tensor_at(emb, "params.weight", 2, es);
    double *eo = tensor_at(emb, "output", 2, os), *eR = tensor_at(emb, "upstream.R", 2, os);
    double *eg = tensor_at(emb, "grads.weight", 2, es);
    double want[30] = {0};
    for (int k = 0; k < 7; k++) {
        int id = (int)ids[k];
        CHECK(id >= 0 && id < 10 && ids[k] == (double)id);
        for (int j = 0; j < 3; j++) {
            CHECK(eo[k * 3 + j] == ew[id * 3 + j]);
            want[id * 3 + j] += eR[k * 3 + j];
        }
    }
    for (int i = 0; i < 30; i++)
        CHECK_NEAR(eg[i], want[i], 1e-12);
    free(ids), free(ew), free(eo), free(eR), free(eg);

    /* cross-entropy: same logits for both reductions; softmax - onehot rows sum to 0. */
    long ls[2] = {6, 5};
    double *gm = tensor_at(r, "xent_mean.grad_inputs.logits", 2, ls);
    double *gs = tensor_at(r, "xent_sum.grad_inputs.logits", 2, ls);
    check_shape(r, "xent_mean.inputs.targets", 1, 6, 0, 0);
    CHECK_NEAR(ferry_json_num(ferry_json_path(r, "xent_sum.loss")),
               6 * ferry_json_num(ferry_json_path(r, "xent_mean.loss")), 1e-12);
    for (int i = 0; i < 6; i++) {
        double rowsum = 0;
        for (int j = 0; j < 5; j++) {
            CHECK_NEAR(gs[i * 5 + j], 6 * gm[i * 5 + j], 1e-14);
            rowsum += gm[i * 5 + j];
        }
        CHECK_NEAR(rowsum, 0.0, 1e-15);
    }
    free(gm), free(gs);
    ferry_json_destroy(r);
}

static void check_trajectories(const ferry_json *sec, long R, long C, long steps) {
    const ferry_json *cfgs = ferry_json_get(sec, "configs");
    long ts[3] = {steps, R, C};
    for (size_t i = 0; i < ferry_json_len(cfgs); i++) {
        const ferry_json *c = ferry_json_at(cfgs, i);
        CHECK(ferry_json_str(ferry_json_get(c, "name")) != NULL);
        CHECK(ferry_json_str(ferry_json_get(c, "class")) != NULL);
        CHECK(ferry_json_str(ferry_json_get(c, "source")) != NULL);
        CHECK(ferry_json_num(ferry_json_path(c, "hparams.lr")) > 0);
        free(tensor_at(c, "trajectory", 3, ts));
    }
}

TEST(torch_optim_shapes) {
    ferry_json *r = load("tests/data/torch_optim.json");
    const ferry_json *dense = ferry_json_get(r, "dense"), *sparse = ferry_json_get(r, "sparse");
    CHECK(ferry_json_num(ferry_json_get(dense, "steps")) == 6.0);
    CHECK_EQ(ferry_json_len(ferry_json_get(dense, "configs")), 12);
    check_trajectories(dense, 4, 3, 6);
    /* Plain SGD is p_t = p_{t-1} - 0.1 g_t. */
    long ps[2] = {4, 3}, gs[3] = {6, 4, 3};
    double *p = tensor_at(dense, "p0", 2, ps), *g = tensor_at(dense, "grads", 3, gs);
    CHECK(strcmp(ferry_json_str(ferry_json_path(dense, "configs.0.name")), "sgd") == 0);
    double *tr = tensor_at(dense, "configs.0.trajectory", 3, gs);
    for (int t = 0; t < 6; t++)
        for (int k = 0; k < 12; k++)
            CHECK_NEAR(tr[t * 12 + k], (t ? tr[(t - 1) * 12 + k] : p[k]) - 0.1 * g[t * 12 + k],
                       1e-15);
    free(p), free(g), free(tr);

    CHECK_EQ(ferry_json_len(ferry_json_get(sparse, "configs")), 6);
    check_trajectories(sparse, 6, 3, 6);
    long t0s[2] = {6, 3}, dgs[3] = {6, 6, 3};
    double *table = tensor_at(sparse, "table0", 2, t0s);
    double *dg = tensor_at(sparse, "dense_grads", 3, dgs);
    int touched[6][6] = {{0}};
    CHECK_EQ(ferry_json_len(ferry_json_get(sparse, "rows")), 6);
    for (int t = 0; t < 6; t++) {
        double *rows = NULL, *rg = NULL;
        int nd;
        long dims[4], k = ferry_json_tensor(ferry_json_at(ferry_json_get(sparse, "rows"), t), &rows,
                                            &nd, dims);
        CHECK(k > 0 && nd == 1);
        long rgs[2] = {k, 3};
        char path[32];
        (void)snprintf(path, sizeof path, "row_grads.%d", t);
        rg = tensor_at(sparse, path, 2, rgs);
        for (long j = 0; j < k; j++) {
            int row = (int)rows[j];
            CHECK(row >= 0 && row < 6);
            touched[t][row] = 1;
            for (int c = 0; c < 3; c++)
                CHECK(dg[(t * 6 + row) * 3 + c] == rg[j * 3 + c]);
        }
        free(rows), free(rg);
    }
    /* Lazy semantics: a row not touched at step t keeps its value from step t-1. */
    const ferry_json *cfgs = ferry_json_get(sparse, "configs");
    for (size_t i = 0; i < ferry_json_len(cfgs); i++) {
        const ferry_json *c = ferry_json_at(cfgs, i);
        double *traj = tensor_at(c, "trajectory", 3, dgs);
        int lazy = strncmp(ferry_json_str(ferry_json_get(c, "name")), "lazy_", 5) == 0;
        const char *src = ferry_json_str(ferry_json_get(c, "source"));
        CHECK(lazy == (strcmp(src, "reference implementation in gen_torch_vectors.py") == 0));
        for (int t = 0; t < 6; t++)
            for (int row = 0; row < 6; row++)
                for (int col = 0; col < 3; col++) {
                    double prev = t ? traj[((t - 1) * 6 + row) * 3 + col] : table[row * 3 + col];
                    double cur = traj[(t * 6 + row) * 3 + col];
                    CHECK(touched[t][row] ? cur != prev : cur == prev);
                }
        free(traj);
    }
    free(table), free(dg);
    ferry_json_destroy(r);
}

FERRY_TEST_MAIN(T(nesting) T(escapes) T(numbers) T(errors) T(duplicates_and_paths) T(tensors)
                    T(cdopt_vectors) T(torch_nn_shapes) T(torch_optim_shapes))
