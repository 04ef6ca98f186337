/* test_optim.c - the optimizers against torch 1.13 trajectories (tests/data/torch_optim.json):
 * every dense config through ferry_optim_step, the lazy row-sparse configs, the row kernel
 * against the dense kernel, a block mixing dense, row-sparse and idle parameters, and
 * checkpoint round trips that must continue a run bit-exactly. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tensor/backend.h"
#include "check.h"
#include "json.h"
#include "ferry/optim.h"

#define ATOL 1e-6
#define RTOL 1e-5

static ferry_json *root;

static void release_root(void) {
    ferry_json_destroy(root);
    root = NULL;
}

static const ferry_json *ref(const char *path) {
    if (root == NULL) {
        CHECK_OK(ferry_json_parse_file(ferry_test_path("tests/data/torch_optim.json"), &root));
        CHECK(atexit(release_root) == 0);
    }
    const ferry_json *n = ferry_json_path(root, path);
    CHECK(n != NULL);
    return n;
}

/* A malloc'd double copy of tensor node t; *count receives its element count. */
static double *tensor_f64(const ferry_json *t, long *count) {
    double *d = NULL;
    long n = ferry_json_tensor(t, &d, NULL, NULL);
    CHECK(n >= 0);
    if (count != NULL)
        *count = n;
    return d;
}

static double hparam(const ferry_json *h, const char *key, double fallback) {
    const ferry_json *v = ferry_json_get(h, key);
    return v == NULL ? fallback : ferry_json_num(v);
}

/* The ferry configuration of a reference config (SparseAdam is Adam on rows). */
static ferry_optim_config config_of(const ferry_json *c) {
    const char *cls = ferry_json_str(ferry_json_get(c, "class"));
    ferry_optim_kind kind;
    CHECK(cls != NULL);
    if (strcmp(cls, "SparseAdam") == 0)
        kind = FERRY_OPTIM_ADAM;
    else if (strcmp(cls, "SGD") == 0)
        kind = FERRY_OPTIM_SGD;
    else if (strcmp(cls, "AdamW") == 0)
        kind = FERRY_OPTIM_ADAMW;
    else if (strcmp(cls, "Adam") == 0)
        kind = FERRY_OPTIM_ADAM;
    else if (strcmp(cls, "Adagrad") == 0)
        kind = FERRY_OPTIM_ADAGRAD;
    else {
        CHECK(strcmp(cls, "Adadelta") == 0);
        kind = FERRY_OPTIM_ADADELTA;
    }
    ferry_optim_config o = ferry_optim_defaults(kind);
    const ferry_json *h = ferry_json_get(c, "hparams");
    o.lr = hparam(h, "lr", o.lr);
    o.momentum = hparam(h, "momentum", o.momentum);
    o.dampening = hparam(h, "dampening", o.dampening);
    o.nesterov = ferry_json_bool(ferry_json_get(h, "nesterov")) == 1;
    o.weight_decay = hparam(h, "weight_decay", o.weight_decay);
    o.lr_decay = hparam(h, "lr_decay", o.lr_decay);
    o.initial_accumulator = hparam(h, "initial_accumulator_value", o.initial_accumulator);
    o.rho = hparam(h, "rho", o.rho);
    o.eps = hparam(h, "eps", o.eps);
    const ferry_json *betas = ferry_json_get(h, "betas");
    if (betas != NULL) {
        o.beta1 = ferry_json_num(ferry_json_at(betas, 0));
        o.beta2 = ferry_json_num(ferry_json_at(betas, 1));
    }
    CHECK_OK(ferry_optim_config_check(&o));
    return o;
}

/* ---- the problems: a dense (4, 3) parameter and a row-sparse (6, 3) table ---- */

typedef struct problem {
    double *p0, *grads;             /* dense: (4, 3), (6, 4, 3) */
    double *table0;                 /* sparse: (6, 3) */
    double *rows[6], *row_grads[6]; /* sparse step t: (k_t), (k_t, 3) */
    long nrows[6];
} problem;

static void problem_load(problem *pb) {
    memset(pb, 0, sizeof *pb);
    pb->p0 = tensor_f64(ref("dense.p0"), NULL);
    pb->grads = tensor_f64(ref("dense.grads"), NULL);
    pb->table0 = tensor_f64(ref("sparse.table0"), NULL);
    for (int t = 0; t < 6; t++) {
        pb->rows[t] = tensor_f64(ferry_json_at(ref("sparse.rows"), (size_t)t), &pb->nrows[t]);
        pb->row_grads[t] = tensor_f64(ferry_json_at(ref("sparse.row_grads"), (size_t)t), NULL);
    }
}

static void problem_free(problem *pb) {
    free(pb->p0);
    free(pb->grads);
    free(pb->table0);
    for (int t = 0; t < 6; t++) {
        free(pb->rows[t]);
        free(pb->row_grads[t]);
    }
}

/* Puts step t's gradients into G: parameter `dense` (if >= 0) gets grads[t], the
 * row-sparse `table` (if >= 0) rows[t] / row_grads[t]. */
static void fill_grads(const problem *pb, ferry_grads *G, int dense, int table, int t) {
    ferry_grads_zero(G);
    if (dense >= 0) {
        float *g = ferry_grads_dense(G, dense);
        CHECK(g != NULL);
        for (int i = 0; i < 12; i++)
            g[i] = (float)pb->grads[t * 12 + i];
    }
    if (table >= 0) {
        int32_t ids[6], slots[6];
        for (long k = 0; k < pb->nrows[t]; k++)
            ids[k] = (int32_t)pb->rows[t][k];
        CHECK_OK(ferry_grads_row_slots(G, table, pb->nrows[t], ids, slots));
        ferry_rowgrad *rg = ferry_grads_rows(G, table);
        for (long k = 0; k < pb->nrows[t]; k++)
            for (int d = 0; d < 3; d++)
                rg->values[slots[k] * 3 + d] += (float)pb->row_grads[t][k * 3 + d];
    }
}

static void set_param(ferry_params *P, int index, const double *v, long n) {
    float *w = ferry_params_data(P, index);
    for (long i = 0; i < n; i++)
        w[i] = (float)v[i];
}

/* Block with "w" (4, 3) dense, "emb" (6, 3) row-sparse and "idle" (5) that never gets a
 * gradient (filled with 1.0 so that a wrongly applied weight decay would show). */
static void mixed_block(ferry_params *P, const problem *pb) {
    int i;
    ferry_params_init(P, ferry_backend_cpu());
    CHECK_OK(ferry_params_add(P, "w", ferry_shape_2d(4, 3), 0, &i));
    CHECK_OK(ferry_params_add(P, "emb", ferry_shape_2d(6, 3), FERRY_PARAM_ROW_SPARSE, &i));
    CHECK_OK(ferry_params_add(P, "idle", ferry_shape_1d(5), 0, &i));
    CHECK_OK(ferry_params_alloc(P));
    set_param(P, 0, pb->p0, 12);
    set_param(P, 1, pb->table0, 18);
    for (int k = 0; k < 5; k++)
        ferry_params_data(P, 2)[k] = 1.0f;
}

/* ---- torch trajectories ---- */

TEST(dense_configs_match_torch) {
    problem pb;
    problem_load(&pb);
    const ferry_json *configs = ref("dense.configs");
    CHECK_EQ(ferry_json_len(configs), 12);
    for (size_t c = 0; c < ferry_json_len(configs); c++) {
        const ferry_json *cj = ferry_json_at(configs, c);
        const char *name = ferry_json_str(ferry_json_get(cj, "name"));
        ferry_optim_config cfg = config_of(cj);
        double *traj = tensor_f64(ferry_json_get(cj, "trajectory"), NULL);
        ferry_params P;
        ferry_grads G;
        ferry_optim *o;
        int w;
        ferry_params_init(&P, ferry_backend_cpu());
        CHECK_OK(ferry_params_add(&P, "w", ferry_shape_2d(4, 3), 0, &w));
        CHECK_OK(ferry_params_alloc(&P));
        set_param(&P, w, pb.p0, 12);
        CHECK_OK(ferry_grads_init(&G, &P));
        CHECK_OK(ferry_optim_create(&P, &cfg, &o));
        for (int t = 0; t < 6; t++) {
            fill_grads(&pb, &G, w, -1, t);
            CHECK_OK(ferry_optim_step(o, &P, &G, 1.0f));
            if (!ferry_check_close(name, ferry_params_data(&P, w), traj + t * 12, 12, ATOL, RTOL)) {
                fprintf(stderr, "  config %s, step %d\n", name, t + 1);
                CHECK(0);
            }
        }
        CHECK_EQ(ferry_optim_step_count(o), 6);
        ferry_optim_destroy(o);
        ferry_grads_deinit(&G);
        ferry_params_deinit(&P);
        free(traj);
    }
    problem_free(&pb);
}

TEST(sparse_configs_match_torch_and_stay_lazy) {
    problem pb;
    problem_load(&pb);
    const ferry_json *configs = ref("sparse.configs");
    CHECK_EQ(ferry_json_len(configs), 6);
    for (size_t c = 0; c < ferry_json_len(configs); c++) {
        const ferry_json *cj = ferry_json_at(configs, c);
        const char *name = ferry_json_str(ferry_json_get(cj, "name"));
        ferry_optim_config cfg = config_of(cj);
        double *traj = tensor_f64(ferry_json_get(cj, "trajectory"), NULL);
        ferry_params P;
        ferry_grads G;
        ferry_optim *o;
        int e;
        ferry_params_init(&P, ferry_backend_cpu());
        CHECK_OK(ferry_params_add(&P, "emb", ferry_shape_2d(6, 3), FERRY_PARAM_ROW_SPARSE, &e));
        CHECK_OK(ferry_params_alloc(&P));
        set_param(&P, e, pb.table0, 18);
        CHECK_OK(ferry_grads_init(&G, &P));
        CHECK_OK(ferry_optim_create(&P, &cfg, &o));
        for (int t = 0; t < 6; t++) {
            float before[18];
            const float *tab = ferry_params_data(&P, e);
            memcpy(before, tab, sizeof before);
            fill_grads(&pb, &G, -1, e, t);
            CHECK_OK(ferry_optim_step(o, &P, &G, 1.0f));
            if (!ferry_check_close(name, tab, traj + t * 18, 18, ATOL, RTOL)) {
                fprintf(stderr, "  config %s, step %d\n", name, t + 1);
                CHECK(0);
            }
            /* Rows without a gradient keep their exact bits. */
            for (int r = 0; r < 6; r++) {
                int touched = 0;
                for (long k = 0; k < pb.nrows[t]; k++)
                    touched |= (int)pb.rows[t][k] == r;
                if (!touched)
                    CHECK(memcmp(before + r * 3, tab + r * 3, 3 * sizeof(float)) == 0);
            }
        }
        ferry_optim_destroy(o);
        ferry_grads_deinit(&G);
        ferry_params_deinit(&P);
        free(traj);
    }
    problem_free(&pb);
}

/* ---- the kernel: row form against dense form, untouched state ---- */

/* Deterministic values in [-1, 1). */
static void fill_pattern(float *x, int n, uint64_t seed) {
    for (int i = 0; i < n; i++)
        x[i] = 2.0f * ferry_rand_uniform(seed, (uint64_t)i) - 1.0f;
}

TEST(row_kernel_equals_dense_kernel_and_is_lazy) {
    ferry_backend *be = ferry_backend_cpu();
    ferry_optim_kind kinds[] = {FERRY_OPTIM_SGD, FERRY_OPTIM_ADAGRAD, FERRY_OPTIM_ADADELTA,
                                FERRY_OPTIM_ADAM, FERRY_OPTIM_ADAMW};
    enum { R = 7, D = 5 };
    const int64_t rows[] = {5, 1, 3};
    for (int kk = 0; kk < 5; kk++) {
        float table[R * D], s0[R * D], s1[R * D], grad[3 * D];
        float table0[R * D], s00[R * D], s10[R * D];
        uint8_t seen[R] = {0, 1, 0, 1, 0, 0, 0};
        fill_pattern(table, R * D, 1);
        fill_pattern(grad, 3 * D, 2);
        fill_pattern(s1, R * D, 4);
        for (int i = 0; i < R * D; i++) {
            s0[i] = 0.5f + 0.25f * ferry_rand_uniform(3, (uint64_t)i); /* sums stay positive */
            s1[i] = fabsf(s1[i]);
        }
        memcpy(table0, table, sizeof table);
        memcpy(s00, s0, sizeof s0);
        memcpy(s10, s1, sizeof s1);
        ferry_optim_update u;
        memset(&u, 0, sizeof u);
        u.kind = kinds[kk];
        u.lr = 0.05;
        u.weight_decay = 0.02;
        u.grad_scale = 0.75f;
        u.momentum = 0.9;
        u.dampening = 0.1;
        u.lr_decay = 0.01;
        u.rho = 0.9;
        u.beta1 = 0.9;
        u.beta2 = 0.999;
        u.eps = 1e-8;
        u.step = 3;
        u.param = table;
        u.slot0 = s0;
        u.slot1 = s1;
        u.rows = rows;
        u.nrows = 3;
        u.D = D;
        u.grad = grad;
        u.row_seen = seen;
        CHECK_OK(ferry_backend_optim_update(be, &u));
        for (int r = 0; r < R; r++) {
            int k = r == 5 ? 0 : r == 1 ? 1 : r == 3 ? 2 : -1;
            if (k < 0) { /* untouched: param and state keep their bits */
                CHECK(memcmp(table + r * D, table0 + r * D, D * sizeof(float)) == 0);
                CHECK(memcmp(s0 + r * D, s00 + r * D, D * sizeof(float)) == 0);
                CHECK(memcmp(s1 + r * D, s10 + r * D, D * sizeof(float)) == 0);
                CHECK_EQ(seen[r], 0);
                continue;
            }
            /* Touched: the dense kernel on that row alone gives the same bits. */
            float p[D], a[D], b[D];
            memcpy(p, table0 + r * D, sizeof p);
            memcpy(a, s00 + r * D, sizeof a);
            memcpy(b, s10 + r * D, sizeof b);
            ferry_optim_update v = u;
            v.rows = NULL;
            v.row_seen = NULL;
            v.n = D;
            v.param = p;
            v.slot0 = a;
            v.slot1 = b;
            v.grad = grad + k * D;
            v.buf_fresh = r != 1 && r != 3; /* rows 1 and 3 already had a buffer */
            CHECK_OK(ferry_backend_optim_update(be, &v));
            CHECK(memcmp(p, table + r * D, sizeof p) == 0);
            CHECK(memcmp(a, s0 + r * D, sizeof a) == 0);
            CHECK(memcmp(b, s1 + r * D, sizeof b) == 0);
            CHECK(memcmp(p, table0 + r * D, sizeof p) != 0);
            if (kinds[kk] == FERRY_OPTIM_SGD)
                CHECK_EQ(seen[r], 1);
        }
    }
}

TEST(kernel_rejects_missing_state) {
    float p[4] = {0}, g[4] = {0};
    ferry_optim_update u;
    memset(&u, 0, sizeof u);
    u.kind = FERRY_OPTIM_ADAM;
    u.step = 1;
    u.param = p;
    u.grad = g;
    u.n = 4;
    CHECK_STATUS(ferry_backend_optim_update(ferry_backend_cpu(), &u), FERRY_ERR_INVALID);
    u.kind = FERRY_OPTIM_SGD; /* no momentum: no state needed */
    u.step = 0;
    CHECK_STATUS(ferry_backend_optim_update(ferry_backend_cpu(), &u), FERRY_ERR_INVALID);
    u.step = 1;
    CHECK_OK(ferry_backend_optim_update(ferry_backend_cpu(), &u));
}

/* ---- a real block: dense + row-sparse + idle, gradients over a copy's layout ---- */

TEST(mixed_block_step) {
    problem pb;
    problem_load(&pb);
    double *dense_ref = tensor_f64(ref("dense.configs.10.trajectory"), NULL); /* adamw */
    double *lazy_ref = tensor_f64(ref("sparse.configs.5.trajectory"), NULL);  /* lazy_adamw */
    CHECK(strcmp(ferry_json_str(ref("dense.configs.10.name")), "adamw") == 0);
    CHECK(strcmp(ferry_json_str(ref("sparse.configs.5.name")), "lazy_adamw") == 0);
    ferry_params P, Q;
    ferry_grads G;
    ferry_optim *o;
    mixed_block(&P, &pb);
    /* Q has P's layout but no storage: the gradients come "from elsewhere". */
    ferry_params_init(&Q, ferry_backend_cpu());
    int i;
    CHECK_OK(ferry_params_add(&Q, "w", ferry_shape_2d(4, 3), 0, &i));
    CHECK_OK(ferry_params_add(&Q, "emb", ferry_shape_2d(6, 3), FERRY_PARAM_ROW_SPARSE, &i));
    CHECK_OK(ferry_params_add(&Q, "idle", ferry_shape_1d(5), 0, &i));
    CHECK_OK(ferry_grads_init(&G, &Q));
    ferry_optim_config cfg = config_of(ref("dense.configs.10"));
    CHECK_OK(ferry_optim_create(&P, &cfg, &o));
    for (int t = 0; t < 6; t++) {
        fill_grads(&pb, &G, 0, 1, t);
        CHECK_OK(ferry_optim_step(o, &P, &G, 1.0f));
        CHECK_CLOSE("dense", ferry_params_data(&P, 0), dense_ref + t * 12, 12, ATOL, RTOL);
        CHECK_CLOSE("rows", ferry_params_data(&P, 1), lazy_ref + t * 18, 18, ATOL, RTOL);
        for (int k = 0; k < 5; k++)
            CHECK(ferry_params_data(&P, 2)[k] == 1.0f); /* no gradient: no decay */
    }
    /* A block of another layout is refused before anything changes. */
    ferry_params S;
    ferry_params_init(&S, ferry_backend_cpu());
    CHECK_OK(ferry_params_add(&S, "w", ferry_shape_2d(4, 3), 0, &i));
    CHECK_OK(ferry_params_alloc(&S));
    CHECK_STATUS(ferry_optim_step(o, &S, &G, 1.0f), FERRY_ERR_SHAPE);
    CHECK_STATUS(ferry_optim_step(o, &P, &G, NAN), FERRY_ERR_NUMERIC);
    CHECK_EQ(ferry_optim_step_count(o), 6);
    ferry_params_deinit(&S);
    ferry_optim_destroy(o);
    ferry_grads_deinit(&G);
    ferry_params_deinit(&Q);
    ferry_params_deinit(&P);
    free(dense_ref);
    free(lazy_ref);
    problem_free(&pb);
}

TEST(grad_scale_scales_the_gradient) {
    /* SGD with scale 0.5 must equal SGD on halved gradients (exact in float). */
    problem pb;
    problem_load(&pb);
    ferry_params P1, P2;
    ferry_grads G1, G2;
    ferry_optim *o1, *o2;
    ferry_optim_config cfg = ferry_optim_defaults(FERRY_OPTIM_SGD);
    cfg.lr = 0.1;
    cfg.momentum = 0.9;
    cfg.weight_decay = 0.01;
    mixed_block(&P1, &pb);
    mixed_block(&P2, &pb);
    CHECK_OK(ferry_grads_init(&G1, &P1));
    CHECK_OK(ferry_grads_init(&G2, &P2));
    CHECK_OK(ferry_optim_create(&P1, &cfg, &o1));
    CHECK_OK(ferry_optim_create(&P2, &cfg, &o2));
    for (int t = 0; t < 6; t++) {
        fill_grads(&pb, &G1, 0, 1, t);
        fill_grads(&pb, &G2, 0, 1, t);
        CHECK_OK(ferry_grads_scale(&G2, 0.5f));
        CHECK_OK(ferry_optim_step(o1, &P1, &G1, 0.5f));
        CHECK_OK(ferry_optim_step(o2, &P2, &G2, 1.0f));
        CHECK(memcmp(P1.data, P2.data, (size_t)P1.numel * sizeof(float)) == 0);
    }
    ferry_optim_destroy(o1);
    ferry_optim_destroy(o2);
    ferry_grads_deinit(&G1);
    ferry_grads_deinit(&G2);
    ferry_params_deinit(&P1);
    ferry_params_deinit(&P2);
    problem_free(&pb);
}

/* ---- checkpoints ---- */

TEST(state_round_trip_continues_bit_exactly) {
    problem pb;
    problem_load(&pb);
    ferry_optim_config cfgs[4] = {
        ferry_optim_defaults(FERRY_OPTIM_SGD), ferry_optim_defaults(FERRY_OPTIM_ADAGRAD),
        ferry_optim_defaults(FERRY_OPTIM_ADADELTA), ferry_optim_defaults(FERRY_OPTIM_ADAM)};
    cfgs[0].lr = 0.1;
    cfgs[0].momentum = 0.9;
    cfgs[0].nesterov = 1;
    cfgs[1].initial_accumulator = 0.1;
    cfgs[1].lr_decay = 0.01;
    cfgs[3].weight_decay = 0.01;
    for (int c = 0; c < 4; c++) {
        ferry_params A, B;
        ferry_grads GA, GB;
        ferry_optim *oa, *ob;
        mixed_block(&A, &pb);
        CHECK_OK(ferry_grads_init(&GA, &A));
        CHECK_OK(ferry_optim_create(&A, &cfgs[c], &oa));
        /* Step 1 touches no dense gradient so the dense momentum buffer is born later. */
        for (int t = 0; t < 3; t++) {
            fill_grads(&pb, &GA, t == 0 ? -1 : 0, 1, t);
            CHECK_OK(ferry_optim_step(oa, &A, &GA, 0.8f));
        }
        CHECK_OK(ferry_optim_set_lr(oa, ferry_optim_get_lr(oa) * 0.5));
        FILE *f = tmpfile();
        CHECK(f != NULL);
        CHECK_OK(ferry_optim_state_save(oa, f));
        CHECK_EQ(ftell(f), (long)ferry_optim_state_size(oa));
        mixed_block(&B, &pb);
        memcpy(B.data, A.data, (size_t)A.numel * sizeof(float));
        for (int t = 3; t < 6; t++) {
            fill_grads(&pb, &GA, 0, 1, t);
            CHECK_OK(ferry_optim_step(oa, &A, &GA, 0.8f));
        }
        /* A fresh optimizer with a different lr picks up step, lr and state. */
        CHECK_OK(ferry_grads_init(&GB, &B));
        ferry_optim_config other = cfgs[c];
        other.lr = 123.0;
        CHECK_OK(ferry_optim_create(&B, &other, &ob));
        rewind(f);
        CHECK_OK(ferry_optim_state_load(ob, f));
        CHECK_EQ(ferry_optim_step_count(ob), 3);
        CHECK(ferry_optim_get_lr(ob) == cfgs[c].lr * 0.5);
        for (int t = 3; t < 6; t++) {
            fill_grads(&pb, &GB, 0, 1, t);
            CHECK_OK(ferry_optim_step(ob, &B, &GB, 0.8f));
        }
        CHECK(memcmp(A.data, B.data, (size_t)A.numel * sizeof(float)) == 0);
        (void)fclose(f);
        ferry_optim_destroy(oa);
        ferry_optim_destroy(ob);
        ferry_grads_deinit(&GA);
        ferry_grads_deinit(&GB);
        ferry_params_deinit(&A);
        ferry_params_deinit(&B);
    }
    problem_free(&pb);
}

TEST(state_load_rejects_mismatch) {
    problem pb;
    problem_load(&pb);
    ferry_params A, B;
    ferry_optim *adam, *sgd, *sgdm;
    int i;
    mixed_block(&A, &pb); /* 16 + 32 + 16 = 64 floats with alignment padding */
    ferry_params_init(&B, ferry_backend_cpu());
    CHECK_OK(ferry_params_add(&B, "w", ferry_shape_2d(4, 3), 0, &i));
    CHECK_OK(ferry_params_alloc(&B));
    ferry_optim_config ca = ferry_optim_defaults(FERRY_OPTIM_ADAM);
    ferry_optim_config cs = ferry_optim_defaults(FERRY_OPTIM_SGD);
    CHECK_OK(ferry_optim_create(&A, &ca, &adam));
    CHECK_OK(ferry_optim_create(&B, &cs, &sgd));
    cs.momentum = 0.9;
    CHECK_OK(ferry_optim_create(&B, &cs, &sgdm));
    FILE *f = tmpfile();
    CHECK(f != NULL);
    CHECK_OK(ferry_optim_state_save(adam, f));
    rewind(f);
    CHECK_STATUS(ferry_optim_state_load(sgd, f), FERRY_ERR_EXISTS);
    char want[160];
    (void)snprintf(want, sizeof want,
                   "checkpoint optimizer is adam over %lld floats, this model needs sgd over %lld",
                   (long long)A.numel, (long long)B.numel);
    CHECK(strstr(ferry_error_last(), want) != NULL);
    /* Same kind, different state: SGD without vs with momentum. */
    rewind(f);
    CHECK_OK(ferry_optim_state_save(sgd, f));
    rewind(f);
    CHECK_STATUS(ferry_optim_state_load(sgdm, f), FERRY_ERR_EXISTS);
    CHECK(strstr(ferry_error_last(), "is sgd over") != NULL);
    CHECK(strstr(ferry_error_last(), "needs sgd with momentum") != NULL);
    /* Not a state at all, and a truncated one. */
    rewind(f);
    CHECK(fwrite("garbage-garbage-garbage", 1, 23, f) == 23);
    rewind(f);
    CHECK_STATUS(ferry_optim_state_load(sgd, f), FERRY_ERR_FORMAT);
    FILE *g = tmpfile();
    CHECK(g != NULL);
    CHECK_OK(ferry_optim_state_save(adam, g));
    long full = ftell(g);
    FILE *h = tmpfile();
    char *bytes = malloc((size_t)full);
    CHECK(h != NULL && bytes != NULL);
    rewind(g);
    CHECK(fread(bytes, 1, (size_t)full, g) == (size_t)full);
    CHECK(fwrite(bytes, 1, (size_t)full - 9, h) == (size_t)full - 9);
    rewind(h);
    CHECK_STATUS(ferry_optim_state_load(adam, h), FERRY_ERR_FORMAT);
    CHECK(strstr(ferry_error_last(), "truncated") != NULL);
    free(bytes);
    (void)fclose(f);
    (void)fclose(g);
    (void)fclose(h);
    ferry_optim_destroy(adam);
    ferry_optim_destroy(sgd);
    ferry_optim_destroy(sgdm);
    ferry_params_deinit(&A);
    ferry_params_deinit(&B);
    problem_free(&pb);
}

/* A row-sharded block: "emb" (rows, 3) row-sparse and "b" (rows) dense. */
static void table_block(ferry_params *P, int64_t rows) {
    int i;
    ferry_params_init(P, ferry_backend_cpu());
    CHECK_OK(ferry_params_add(P, "emb", ferry_shape_2d(rows, 3), FERRY_PARAM_ROW_SPARSE, &i));
    CHECK_OK(ferry_params_add(P, "b", ferry_shape_1d(rows), 0, &i));
    CHECK_OK(ferry_params_alloc(P));
}

/* The state's bytes (a malloc'd copy, *len its size). */
static char *state_bytes(const ferry_optim *o, size_t *len) {
    FILE *f = tmpfile();
    CHECK(f != NULL);
    CHECK_OK(ferry_optim_state_save(o, f));
    long n = ftell(f);
    CHECK(n > 0);
    char *buf = malloc((size_t)n);
    CHECK(buf != NULL);
    rewind(f);
    CHECK(fread(buf, 1, (size_t)n, f) == (size_t)n);
    (void)fclose(f);
    *len = (size_t)n;
    return buf;
}

/* A table's state cut in two (rows 0-1, 2-5) and joined again: the bytes of the
 * original, for adam and for SGD with momentum (its row flags and dense flag). */
TEST(copy_rows_splits_and_joins_state) {
    problem pb;
    problem_load(&pb);
    ferry_optim_config cfgs[2] = {ferry_optim_defaults(FERRY_OPTIM_ADAM),
                                  ferry_optim_defaults(FERRY_OPTIM_SGD)};
    cfgs[1].momentum = 0.9;
    for (int c = 0; c < 2; c++) {
        ferry_params A, S1, S2, C;
        ferry_grads G;
        ferry_optim *oa, *o1, *o2, *oc;
        table_block(&A, 6);
        table_block(&S1, 2);
        table_block(&S2, 4);
        table_block(&C, 6);
        set_param(&A, 0, pb.table0, 18);
        CHECK_OK(ferry_grads_init(&G, &A));
        CHECK_OK(ferry_optim_create(&A, &cfgs[c], &oa));
        for (int t = 0; t < 3; t++) {
            fill_grads(&pb, &G, -1, 0, t);
            float *gb = ferry_grads_dense(&G, 1);
            CHECK(gb != NULL);
            for (int k = 0; k < 6; k++)
                gb[k] = 0.25f * (float)(k + 1) - 0.1f * (float)t;
            CHECK_OK(ferry_optim_step(oa, &A, &G, 1.0f));
        }
        CHECK_OK(ferry_optim_create(&S1, &cfgs[c], &o1));
        CHECK_OK(ferry_optim_create(&S2, &cfgs[c], &o2));
        CHECK_OK(ferry_optim_create(&C, &cfgs[c], &oc));
        for (int i = 0; i < 2; i++) {
            CHECK_OK(ferry_optim_copy_rows(o1, &S1, oa, &A, i, 0, 0, 2));
            CHECK_OK(ferry_optim_copy_rows(o2, &S2, oa, &A, i, 0, 2, 4));
            CHECK_OK(ferry_optim_copy_rows(oc, &C, o2, &S2, i, 2, 0, 4));
            CHECK_OK(ferry_optim_copy_rows(oc, &C, o1, &S1, i, 0, 0, 2));
        }
        size_t la, lc;
        char *ba = state_bytes(oa, &la), *bc = state_bytes(oc, &lc);
        CHECK(la == lc && memcmp(ba, bc, la) == 0);
        free(ba);
        free(bc);
        /* Out of range, and another kind of state: refused, nothing copied. */
        size_t l1;
        char *b1 = state_bytes(o1, &l1);
        CHECK_STATUS(ferry_optim_copy_rows(o1, &S1, oa, &A, 0, 0, 0, 3), FERRY_ERR_RANGE);
        CHECK_STATUS(ferry_optim_copy_rows(o1, &S1, oa, &A, 0, 1, 5, 2), FERRY_ERR_RANGE);
        CHECK_STATUS(ferry_optim_copy_rows(o1, &S1, oa, &A, 2, 0, 0, 1), FERRY_ERR_SHAPE);
        ferry_optim *other;
        CHECK_OK(ferry_optim_create(&S1, &cfgs[1 - c], &other));
        CHECK_STATUS(ferry_optim_copy_rows(other, &S1, oa, &A, 0, 0, 0, 1), FERRY_ERR_SHAPE);
        size_t l2;
        char *b2 = state_bytes(o1, &l2);
        CHECK(l1 == l2 && memcmp(b1, b2, l1) == 0);
        free(b1);
        free(b2);
        ferry_optim_destroy(other);
        ferry_optim_destroy(oa);
        ferry_optim_destroy(o1);
        ferry_optim_destroy(o2);
        ferry_optim_destroy(oc);
        ferry_grads_deinit(&G);
        ferry_params_deinit(&A);
        ferry_params_deinit(&S1);
        ferry_params_deinit(&S2);
        ferry_params_deinit(&C);
    }
    problem_free(&pb);
}

/* ---- configuration ---- */

TEST(config_defaults_and_errors) {
    ferry_optim_kind k;
    CHECK_OK(ferry_optim_parse_kind("adamw", &k));
    CHECK_EQ(k, FERRY_OPTIM_ADAMW);
    CHECK_STATUS(ferry_optim_parse_kind("rmsprop", &k), FERRY_ERR_INVALID);
    CHECK(strstr(ferry_error_last(), "sgd|adagrad|adadelta|adam|adamw") != NULL);
    for (int i = 0; i < 5; i++) {
        CHECK_OK(ferry_optim_parse_kind(ferry_optim_kind_name((ferry_optim_kind)i), &k));
        CHECK_EQ(k, i);
        ferry_optim_config c = ferry_optim_defaults((ferry_optim_kind)i);
        CHECK_OK(ferry_optim_config_check(&c));
    }
    ferry_optim_config c = ferry_optim_defaults(FERRY_OPTIM_ADAGRAD);
    CHECK(c.lr == 0.01 && c.eps == 1e-10);
    c = ferry_optim_defaults(FERRY_OPTIM_ADADELTA);
    CHECK(c.lr == 1.0 && c.rho == 0.9 && c.eps == 1e-6);
    c = ferry_optim_defaults(FERRY_OPTIM_ADAMW);
    CHECK(c.lr == 1e-3 && c.beta1 == 0.9 && c.beta2 == 0.999 && c.eps == 1e-8);
    CHECK(c.weight_decay == 0.01);
    CHECK(ferry_optim_defaults(FERRY_OPTIM_ADAM).weight_decay == 0.0);
    CHECK(ferry_optim_defaults(FERRY_OPTIM_SGD).lr == 1.0);
    c = ferry_optim_defaults(FERRY_OPTIM_SGD);
    c.nesterov = 1;
    CHECK_STATUS(ferry_optim_config_check(&c), FERRY_ERR_INVALID);
    CHECK(strstr(ferry_error_last(), "Nesterov") != NULL);
    c = ferry_optim_defaults(FERRY_OPTIM_ADAM);
    c.beta2 = 1.0;
    CHECK_STATUS(ferry_optim_config_check(&c), FERRY_ERR_INVALID);
    CHECK(strstr(ferry_error_last(), "beta2") != NULL);
    c = ferry_optim_defaults(FERRY_OPTIM_SGD);
    c.lr = -1.0;
    CHECK_STATUS(ferry_optim_config_check(&c), FERRY_ERR_INVALID);
    c.lr = NAN;
    CHECK_STATUS(ferry_optim_config_check(&c), FERRY_ERR_INVALID);
    /* create refuses an unallocated block and a bad config; set_lr a bad lr. */
    ferry_params P;
    ferry_optim *o = NULL;
    int i;
    ferry_params_init(&P, ferry_backend_cpu());
    CHECK_OK(ferry_params_add(&P, "w", ferry_shape_1d(3), 0, &i));
    c = ferry_optim_defaults(FERRY_OPTIM_SGD);
    CHECK_STATUS(ferry_optim_create(&P, &c, &o), FERRY_ERR_INVALID);
    CHECK_OK(ferry_params_alloc(&P));
    CHECK_OK(ferry_optim_create(&P, &c, &o));
    CHECK_STATUS(ferry_optim_set_lr(o, -0.1), FERRY_ERR_INVALID);
    CHECK_OK(ferry_optim_set_lr(o, 0.25));
    CHECK(ferry_optim_get_lr(o) == 0.25);
    CHECK(ferry_optim_get_config(o).lr == 0.25);
    ferry_optim_destroy(o);
    ferry_optim_destroy(NULL);
    ferry_params_deinit(&P);
}

FERRY_TEST_MAIN(T(dense_configs_match_torch) T(sparse_configs_match_torch_and_stay_lazy)
                    T(row_kernel_equals_dense_kernel_and_is_lazy) T(kernel_rejects_missing_state)
                        T(mixed_block_step) T(grad_scale_scales_the_gradient)
                            T(state_round_trip_continues_bit_exactly) T(state_load_rejects_mismatch)
                                T(copy_rows_splits_and_joins_state) T(config_defaults_and_errors))
