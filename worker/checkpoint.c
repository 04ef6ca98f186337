/* checkpoint.c - see checkpoint.h. A "FERRYCK2" ckfile, format 2, sections:
 *   CONF  the configuration, "key=value\n" lines (the keys are the flag names)
 *   PROG  u32 epoch | u64 window | u64 step | f64 lr | u64 vocab hash |
 *         f64 best | u32 bad_epochs | u32 cooldown_left     (the lr schedule)
 *   SHAP  u64 V, E, H | u32 L | u64 parameter count
 *   PARM  f32 parameters (the trainer's block: all of it locally, the LSTM remotely)
 *   OPTM  the optimizer state (ferry_optim_state_save's bytes)
 *   HIDN  u64 B | f32 h (L, B, H) | f32 c (L, B, H)   (B = 0: none carried)
 *   MANI  the server files of the same checkpoint id, text
 * The parameter block and state are copied through the host so any backend can
 * save. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/core/ckfile.h"
#include "common/core/log.h"
#include "worker/checkpoint.h"

#define CK_MAGIC  "FERRYCK2"
#define CK_FORMAT 2u

/* ---- the configuration a checkpoint carries ---- */

/* K_PATH: a string naming a directory, written as an absolute path so that a resume
 * from another working directory finds it. */
typedef enum { K_INT, K_I64, K_FLT, K_DBL, K_STR, K_ENUM, K_PATH } kind;

typedef struct cfg_key {
    const char *key; /* the flag's name */
    kind type;
    size_t off;
    int fixed; /* a flag that contradicts it is an error; else it is a default */
    const char *choices; /* K_ENUM: '|'-separated names */
    const char *absent;  /* the value of a checkpoint written before the key existed;
                            NULL: such a checkpoint is refused, unless optional */
    int optional;        /* absent: the field keeps the value it had (a default) */
} cfg_key;

#define F(name, t, field, fixed)                                                                   \
    { name, t, offsetof(ferry_trainer_config, field), fixed, NULL, NULL, 0 }
#define FA(name, t, field, fixed, absent)                                                          \
    { name, t, offsetof(ferry_trainer_config, field), fixed, NULL, absent, 0 }
#define FO(name, t, field, fixed)                                                                  \
    { name, t, offsetof(ferry_trainer_config, field), fixed, NULL, NULL, 1 }
#define E(name, field, fixed, ch)                                                                  \
    { name, K_ENUM, offsetof(ferry_trainer_config, field), fixed, ch, NULL, 0 }
static const cfg_key keys[] = {
    F("emsize", K_INT, emsize, 1),
    F("nhid", K_INT, nhid, 1),
    F("nlayers", K_INT, nlayers, 1),
    F("dropout", K_FLT, dropout, 1),
    F("init-scale", K_FLT, init_scale, 1),
    F("stiefel", K_FLT, stiefel, 1),
    F("batch-size", K_INT, batch_size, 1),
    F("bptt", K_INT, bptt, 1),
    F("train-tokens", K_I64, train_tokens, 1),
    E("optimizer", optimizer, 1, "sgd|adagrad|adadelta|adam|adamw"),
    F("clip", K_FLT, clip, 1),
    E("loss-scale", loss_scale, 1, "mean|sum-time"),
    E("schedule", schedule, 1, "none|step|plateau"),
    F("lr-decay", K_FLT, lr_decay, 1),
    F("lr-decay-start", K_INT, lr_decay_start, 1),
    F("lr-decay-every", K_INT, lr_decay_every, 1),
    F("patience", K_INT, patience, 1),
    F("seed", K_I64, seed, 1),
    E("decoder-mode", decoder_mode, 1, "logits|sharded-softmax"),
    {"wire-dtype", K_ENUM, offsetof(ferry_trainer_config, wire_dtype), 0, "f32|bf16", "f32", 0},
    F("stages", K_STR, stages, 1),
    FA("local-vocab", K_I64, local_vocab, 1, "0"),
    F("world", K_INT, world, 1),
    F("job", K_STR, job, 1),
    F("sync", K_STR, sync, 1),
    F("epochs", K_INT, epochs, 0),
    F("max-steps", K_I64, max_steps, 0),
    F("eval-batch-size", K_INT, eval_batch_size, 0),
    F("eval-tokens", K_I64, eval_tokens, 0),
    F("checkpoint-every", K_I64, checkpoint_every, 0),
    F("keep-checkpoints", K_INT, keep_checkpoints, 0),
    F("log-interval", K_INT, log_interval, 0),
    /* The corpus: a default (--data wins); the vocabulary hash in PROG checks it. */
    FO("data", K_PATH, data, 0),
};
#undef F
#undef FA
#undef FO
#undef E
enum { NKEYS = (int)(sizeof keys / sizeof keys[0]) };

static const char *enum_name(const char *choices, int i, char *buf, size_t cap) {
    const char *p = choices;
    for (int k = 0; k < i && p != NULL; k++) {
        p = strchr(p, '|');
        p = p != NULL ? p + 1 : NULL;
    }
    if (p == NULL) {
        (void)snprintf(buf, cap, "%d", i);
        return buf;
    }
    size_t n = strcspn(p, "|");
    (void)snprintf(buf, cap, "%.*s", (int)n, p);
    return buf;
}

/* One field as text (the form both the file and the error messages use). */
static void key_text(const cfg_key *k, const ferry_trainer_config *cfg, char *buf, size_t cap) {
    const char *base = (const char *)cfg + k->off;
    switch (k->type) {
    case K_INT: (void)snprintf(buf, cap, "%d", *(const int *)base); break;
    case K_I64: (void)snprintf(buf, cap, "%lld", (long long)*(const int64_t *)base); break;
    case K_FLT: (void)snprintf(buf, cap, "%.9g", (double)*(const float *)base); break;
    case K_DBL: (void)snprintf(buf, cap, "%.17g", *(const double *)base); break;
    case K_ENUM: (void)enum_name(k->choices, *(const int *)base, buf, cap); break;
    case K_STR:
    case K_PATH: {
        const char *s = *(const char *const *)base;
        (void)snprintf(buf, cap, "%s", s != NULL ? s : "");
        break;
    }
    }
}

/* The optimizer's fields are keys too: "lr", "momentum", ... (NaN: its default). */
static void optim_text(const ferry_trainer_config *cfg, int i, char *buf, size_t cap) {
    if (ferry_optim_fields[i].is_int)
        (void)snprintf(buf, cap, "%d", cfg->optim_switch[i] ? 1 : 0);
    else if (isnan(cfg->optim[i]))
        (void)snprintf(buf, cap, "default");
    else
        (void)snprintf(buf, cap, "%.17g", cfg->optim[i]);
}

static char *config_text(const ferry_trainer_config *cfg, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (f == NULL)
        return NULL;
    char v[PATH_MAX + 1];
    for (int i = 0; i < NKEYS; i++) {
        key_text(&keys[i], cfg, v, sizeof v);
        char abs[PATH_MAX];
        if (keys[i].type == K_PATH && v[0] != '\0' && realpath(v, abs) != NULL)
            (void)snprintf(v, sizeof v, "%s", abs);
        fprintf(f, "%s=%s\n", keys[i].key, v);
    }
    for (int i = 0; i < FERRY_OPTIM_FIELD_COUNT; i++) {
        optim_text(cfg, i, v, sizeof v);
        fprintf(f, "%s=%s\n", ferry_optim_fields[i].flag, v);
    }
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* The value of key in the CONF text, into v; 0 if absent. */
static int conf_value(const char *text, size_t len, const char *key, char *v, size_t cap) {
    size_t kl = strlen(key);
    for (const char *p = text, *end = text + len; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t ll = nl != NULL ? (size_t)(nl - p) : (size_t)(end - p);
        if (ll > kl && memcmp(p, key, kl) == 0 && p[kl] == '=') {
            (void)snprintf(v, cap, "%.*s", (int)(ll - kl - 1), p + kl + 1);
            return 1;
        }
        p += ll + 1;
    }
    return 0;
}

static ferry_status set_key(const cfg_key *k, ferry_trainer_config *cfg, const char *v,
                            char **strings, size_t *left, const char *path) {
    char *base = (char *)cfg + k->off, *end = NULL;
    errno = 0;
    switch (k->type) {
    case K_INT: *(int *)base = (int)strtol(v, &end, 10); break;
    case K_I64: *(int64_t *)base = strtoll(v, &end, 10); break;
    case K_FLT: *(float *)base = strtof(v, &end); break;
    case K_DBL: *(double *)base = strtod(v, &end); break;
    case K_ENUM: {
        char name[64];
        for (int i = 0; i < 16; i++) {
            if (strcmp(enum_name(k->choices, i, name, sizeof name), v) == 0) {
                *(int *)base = i;
                return FERRY_OK;
            }
        }
        return ferry_errorf(FERRY_ERR_FORMAT, "%s: %s=%s is not one of %s", path, k->key, v,
                            k->choices);
    }
    case K_STR:
    case K_PATH: {
        size_t n = strlen(v) + 1;
        if (n > *left)
            return ferry_errorf(FERRY_ERR_NOMEM, "%s: configuration strings too long", path);
        memcpy(*strings, v, n);
        *(const char **)base = n > 1 ? *strings : (strcmp(k->key, "sync") == 0 ? NULL : *strings);
        *strings += n;
        *left -= n;
        return FERRY_OK;
    }
    }
    if (end == v || *end != '\0' || errno != 0)
        return ferry_errorf(FERRY_ERR_FORMAT, "%s: %s='%s' is not a number", path, k->key, v);
    return FERRY_OK;
}

ferry_status ferry_checkpoint_read_config(const char *path, ferry_trainer_config *cfg,
                                          char *strings, size_t cap) {
    ferry_ckr ck;
    ferry_status st = ferry_ckr_read(path, CK_MAGIC, CK_FORMAT, &ck);
    if (st != FERRY_OK)
        return st;
    ferry_ckcur c = ferry_ckr_section(&ck, FERRY_CK_TAG("CONF"));
    size_t len = ferry_ckcur_left(&c);
    const char *text = ferry_ckcur_bytes(&c, len);
    if (c.bad || text == NULL)
        st = ferry_errorf(FERRY_ERR_FORMAT, "%s has no configuration section", path);
    char v[PATH_MAX + 1];
    for (int i = 0; i < NKEYS && st == FERRY_OK; i++) {
        const char *value = conf_value(text, len, keys[i].key, v, sizeof v) ? v : keys[i].absent;
        if (value == NULL && keys[i].optional)
            continue;
        if (value == NULL)
            st = ferry_errorf(FERRY_ERR_FORMAT, "%s: the configuration lacks %s", path,
                              keys[i].key);
        else
            st = set_key(&keys[i], cfg, value, &strings, &cap, path);
    }
    for (int i = 0; i < FERRY_OPTIM_FIELD_COUNT && st == FERRY_OK; i++) {
        const ferry_optim_field *f = &ferry_optim_fields[i];
        if (!conf_value(text, len, f->flag, v, sizeof v))
            st = ferry_errorf(FERRY_ERR_FORMAT, "%s: the configuration lacks %s", path, f->flag);
        else if (f->is_int)
            cfg->optim_switch[i] = strcmp(v, "1") == 0;
        else
            cfg->optim[i] = strcmp(v, "default") == 0 ? (double)NAN : strtod(v, NULL);
    }
    ferry_ckr_free(&ck);
    return st;
}

ferry_status ferry_checkpoint_check_config(const char *path, const ferry_trainer_config *file,
                                           const ferry_trainer_config *now) {
    char a[256], b[256];
    for (int i = 0; i < NKEYS; i++) {
        if (!keys[i].fixed)
            continue;
        key_text(&keys[i], file, a, sizeof a);
        key_text(&keys[i], now, b, sizeof b);
        if (strcmp(a, b) != 0)
            return ferry_errorf(FERRY_ERR_INVALID,
                                "--%s %s contradicts the checkpoint %s, which has --%s %s (leave "
                                "the flag out to resume it, or start a new run without --load)",
                                keys[i].key, b, path, keys[i].key, a);
    }
    for (int i = 0; i < FERRY_OPTIM_FIELD_COUNT; i++) {
        optim_text(file, i, a, sizeof a);
        optim_text(now, i, b, sizeof b);
        if (strcmp(a, b) != 0)
            return ferry_errorf(FERRY_ERR_INVALID,
                                "--%s %s contradicts the checkpoint %s, which has --%s %s (leave "
                                "the flag out to resume it)",
                                ferry_optim_fields[i].flag, b, path, ferry_optim_fields[i].flag, a);
    }
    return FERRY_OK;
}

/* ---- writing and reading ---- */

static ferry_status host_copy(const ferry_lm *lm, const ferry_tensor *t, float **out) {
    size_t n = t != NULL ? (size_t)ferry_tensor_numel(t) : 0;
    *out = malloc((n ? n : 1) * sizeof(float));
    if (*out == NULL)
        return FERRY_NOMEM();
    return n == 0 ? FERRY_OK
                  : ferry_backend_copy(ferry_lm_backend(lm), *out, t->data, n * sizeof(float),
                                       FERRY_COPY_DEVICE_TO_HOST);
}

ferry_status ferry_checkpoint_save(const char *path, const ferry_trainer_config *cfg,
                                   const ferry_lm *lm, const ferry_optim *opt,
                                   const ferry_ck_progress *pr, const char *manifest) {
    size_t clen = 0, olen = 0;
    char *conf = config_text(cfg, &clen), *ob = NULL;
    float *P = NULL, *h = NULL, *c = NULL;
    ferry_status st = conf != NULL ? FERRY_OK : FERRY_NOMEM();
    FILE *of = st == FERRY_OK ? open_memstream(&ob, &olen) : NULL;
    if (st == FERRY_OK && of == NULL)
        st = FERRY_NOMEM();
    if (of != NULL) {
        st = ferry_optim_state_save(opt, of);
        if (fclose(of) != 0 && st == FERRY_OK)
            st = FERRY_NOMEM();
    }
    size_t numel = (size_t)ferry_lm_params_const(lm)->numel;
    int64_t B = pr->has_state && ferry_lm_state_h(lm) != NULL ? ferry_lm_state_batch(lm) : 0;
    size_t hn = B > 0 ? (size_t)ferry_tensor_numel(ferry_lm_state_h(lm)) : 0;
    if (st == FERRY_OK)
        st = ferry_backend_copy(
            ferry_lm_backend(lm), (P = malloc(numel * sizeof(float))) != NULL ? P : NULL,
            ferry_lm_params_const(lm)->data, numel * sizeof(float), FERRY_COPY_DEVICE_TO_HOST);
    if (st == FERRY_OK && B > 0 && (st = host_copy(lm, ferry_lm_state_h(lm), &h)) == FERRY_OK)
        st = host_copy(lm, ferry_lm_state_c(lm), &c);
    ferry_ckw *w = NULL;
    if (st == FERRY_OK)
        st = ferry_ckw_open(path, CK_MAGIC, CK_FORMAT, 7, &w);
    if (st == FERRY_OK)
        st = ferry_ckw_section(w, FERRY_CK_TAG("CONF"), conf, clen);
    if (st == FERRY_OK && (st = ferry_ckw_begin(w, FERRY_CK_TAG("PROG"), 4 + 8 + 8 + 8 + 8 + 8 +
                                                                          4 + 4)) == FERRY_OK) {
        ferry_ckw_u32(w, (uint32_t)pr->epoch);
        ferry_ckw_u64(w, (uint64_t)pr->window);
        ferry_ckw_u64(w, (uint64_t)pr->step);
        ferry_ckw_f64(w, (double)pr->lr);
        ferry_ckw_u64(w, pr->vocab_hash);
        ferry_ckw_f64(w, pr->sched.best);
        ferry_ckw_u32(w, (uint32_t)pr->sched.bad_epochs);
        ferry_ckw_u32(w, (uint32_t)pr->sched.cooldown_left);
        st = ferry_ckw_end(w);
    }
    if (st == FERRY_OK && (st = ferry_ckw_begin(w, FERRY_CK_TAG("SHAP"), 8 * 3 + 4 + 8)) ==
                              FERRY_OK) {
        ferry_ckw_u64(w, (uint64_t)ferry_lm_get_config(lm)->V);
        ferry_ckw_u64(w, (uint64_t)ferry_lm_get_config(lm)->E);
        ferry_ckw_u64(w, (uint64_t)ferry_lm_get_config(lm)->H);
        ferry_ckw_u32(w, (uint32_t)ferry_lm_get_config(lm)->L);
        ferry_ckw_u64(w, (uint64_t)numel);
        st = ferry_ckw_end(w);
    }
    if (st == FERRY_OK &&
        (st = ferry_ckw_begin(w, FERRY_CK_TAG("PARM"), (uint64_t)numel * 4)) == FERRY_OK) {
        ferry_ckw_f32s(w, P, numel);
        st = ferry_ckw_end(w);
    }
    if (st == FERRY_OK)
        st = ferry_ckw_section(w, FERRY_CK_TAG("OPTM"), ob, olen);
    if (st == FERRY_OK &&
        (st = ferry_ckw_begin(w, FERRY_CK_TAG("HIDN"), 8 + (uint64_t)hn * 8)) == FERRY_OK) {
        ferry_ckw_u64(w, (uint64_t)B);
        ferry_ckw_f32s(w, h, hn);
        ferry_ckw_f32s(w, c, hn);
        st = ferry_ckw_end(w);
    }
    if (st == FERRY_OK)
        st = ferry_ckw_section(w, FERRY_CK_TAG("MANI"), manifest != NULL ? manifest : "",
                               manifest != NULL ? strlen(manifest) : 0);
    if (st == FERRY_OK)
        st = ferry_ckw_commit(w);
    else
        ferry_ckw_abort(w);
    free(conf);
    free(ob);
    free(P);
    free(h);
    free(c);
    if (st == FERRY_OK)
        FERRY_LOG_INFO("checkpoint written: %s (epoch %d window %lld, step %lld)", path,
                       pr->epoch, (long long)pr->window, (long long)pr->step);
    return st;
}

static ferry_status check_shape(const char *path, ferry_ckcur *c, const ferry_lm *lm) {
    int64_t V = (int64_t)ferry_ckcur_u64(c), E = (int64_t)ferry_ckcur_u64(c),
            H = (int64_t)ferry_ckcur_u64(c);
    int L = (int)ferry_ckcur_u32(c);
    int64_t numel = (int64_t)ferry_ckcur_u64(c);
    if (c->bad)
        return ferry_errorf(FERRY_ERR_FORMAT, "%s: bad shape section", path);
    int same = V == ferry_lm_get_config(lm)->V && E == ferry_lm_get_config(lm)->E &&
               H == ferry_lm_get_config(lm)->H && L == ferry_lm_get_config(lm)->L;
    if (!same)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "%s holds a model of shape V=%lld E=%lld H=%lld L=%d, this model is "
                            "V=%lld E=%lld H=%lld L=%d",
                            path, (long long)V, (long long)E, (long long)H, L,
                            (long long)ferry_lm_get_config(lm)->V,
                            (long long)ferry_lm_get_config(lm)->E,
                            (long long)ferry_lm_get_config(lm)->H, ferry_lm_get_config(lm)->L);
    if (numel != ferry_lm_params_const(lm)->numel)
        return ferry_errorf(FERRY_ERR_INVALID,
                            "%s was written by a %s trainer; this one is %s (the embedding and "
                            "decoder live on ferry-ps only in distributed runs)",
                            path, ferry_lm_is_remote(lm) ? "local" : "distributed",
                            ferry_lm_is_remote(lm) ? "distributed" : "local");
    return FERRY_OK;
}

ferry_status ferry_checkpoint_load(const char *path, ferry_lm *lm, ferry_optim *opt,
                                   uint64_t vocab_hash, ferry_ck_progress *pr) {
    ferry_ckr ck;
    ferry_status st = ferry_ckr_read(path, CK_MAGIC, CK_FORMAT, &ck);
    if (st != FERRY_OK)
        return st;
    ferry_ckcur c = ferry_ckr_section(&ck, FERRY_CK_TAG("SHAP"));
    st = check_shape(path, &c, lm);
    ferry_ck_progress p;
    memset(&p, 0, sizeof p);
    c = ferry_ckr_section(&ck, FERRY_CK_TAG("PROG"));
    p.epoch = (int)ferry_ckcur_u32(&c);
    p.window = (int64_t)ferry_ckcur_u64(&c);
    p.step = (int64_t)ferry_ckcur_u64(&c);
    p.lr = (float)ferry_ckcur_f64(&c);
    p.vocab_hash = ferry_ckcur_u64(&c);
    p.sched.best = ferry_ckcur_f64(&c);
    p.sched.bad_epochs = (int)ferry_ckcur_u32(&c);
    p.sched.cooldown_left = (int)ferry_ckcur_u32(&c);
    if (st == FERRY_OK && (c.bad || p.epoch < 1 || p.window < 0 || p.step < 0))
        st = ferry_errorf(FERRY_ERR_FORMAT, "%s: bad progress section", path);
    if (st == FERRY_OK && p.vocab_hash != vocab_hash)
        st = ferry_errorf(FERRY_ERR_INVALID,
                          "%s was trained on another vocabulary (hash %016llx, corpus %016llx)",
                          path, (unsigned long long)p.vocab_hash, (unsigned long long)vocab_hash);
    size_t numel = (size_t)ferry_lm_params_const(lm)->numel;
    float *host = st == FERRY_OK ? malloc((numel ? numel : 1) * sizeof(float)) : NULL;
    if (st == FERRY_OK && host == NULL)
        st = FERRY_NOMEM();
    c = ferry_ckr_section(&ck, FERRY_CK_TAG("PARM"));
    if (st == FERRY_OK) {
        ferry_ckcur_f32s(&c, host, numel);
        if (c.bad || ferry_ckcur_left(&c) != 0)
            st = ferry_errorf(FERRY_ERR_FORMAT, "%s: the parameter section has the wrong size",
                              path);
    }
    c = ferry_ckr_section(&ck, FERRY_CK_TAG("OPTM"));
    size_t olen = ferry_ckcur_left(&c);
    const void *ob = ferry_ckcur_bytes(&c, olen);
    FILE *of = st == FERRY_OK && ob != NULL && olen > 0
                   ? fmemopen((void *)(uintptr_t)ob, olen, "rb")
                   : NULL;
    if (st == FERRY_OK && of == NULL)
        st = ferry_errorf(FERRY_ERR_FORMAT, "%s: no optimizer state", path);
    if (st == FERRY_OK)
        st = ferry_optim_state_load(opt, of);
    if (of != NULL)
        (void)fclose(of);
    if (st == FERRY_OK)
        st = ferry_backend_copy(ferry_lm_backend(lm), ferry_lm_params(lm)->data, host,
                                numel * sizeof(float), FERRY_COPY_HOST_TO_DEVICE);
    free(host);
    c = ferry_ckr_section(&ck, FERRY_CK_TAG("HIDN"));
    int64_t B = (int64_t)ferry_ckcur_u64(&c);
    if (st == FERRY_OK && B > 0) {
        if ((st = ferry_lm_reset_state(lm, B)) == FERRY_OK) {
            size_t hn = (size_t)ferry_tensor_numel(ferry_lm_state_h(lm));
            float *hc = malloc(2 * hn * sizeof(float));
            if (hc == NULL)
                st = FERRY_NOMEM();
            else
                ferry_ckcur_f32s(&c, hc, 2 * hn);
            if (st == FERRY_OK && (c.bad || ferry_ckcur_left(&c) != 0))
                st = ferry_errorf(FERRY_ERR_FORMAT,
                                  "%s: the carried state has the wrong size for batch %lld", path,
                                  (long long)B);
            if (st == FERRY_OK)
                st = ferry_backend_copy(ferry_lm_backend(lm), ferry_lm_state_h(lm)->data, hc,
                                        hn * sizeof(float), FERRY_COPY_HOST_TO_DEVICE);
            if (st == FERRY_OK)
                st = ferry_backend_copy(ferry_lm_backend(lm), ferry_lm_state_c(lm)->data, hc + hn,
                                        hn * sizeof(float), FERRY_COPY_HOST_TO_DEVICE);
            free(hc);
        }
        p.has_state = 1;
    } else if (st == FERRY_OK && c.bad) {
        st = ferry_errorf(FERRY_ERR_FORMAT, "%s: no carried-state section", path);
    }
    ferry_ckr_free(&ck);
    if (st == FERRY_OK)
        *pr = p;
    return st;
}

/* ---- names ---- */

void ferry_checkpoint_part(const char *base, int rank, int64_t step, char *out, size_t cap) {
    if (rank < 0)
        (void)snprintf(out, cap, "%s.%lld", base, (long long)step);
    else
        (void)snprintf(out, cap, "%s.r%d.%lld", base, rank, (long long)step);
}

/* The step of a file name of base's set; 0 when it is not one. */
/* A part of the set whose file names start with the prefix (user): "<prefix><step>". */
static int part_step(const char *name, void *user, uint64_t *step) {
    const char *prefix = user;
    size_t pl = strlen(prefix);
    if (strncmp(name, prefix, pl) != 0)
        return 0;
    const char *p = name + pl;
    if (*p < '0' || *p > '9')
        return 0;
    char *end;
    long long v = strtoll(p, &end, 10); /* saturates: steps stay within int64 */
    if (*end != '\0')
        return 0;
    *step = (uint64_t)v;
    return 1;
}

/* Every step of base's set present in its directory, verified or not. */
static ferry_status list_parts(const char *base, int rank, int64_t **steps, size_t *n,
                               char *dir, size_t dcap) {
    *steps = NULL;
    *n = 0;
    const char *slash = strrchr(base, '/');
    char prefix[512];
    (void)snprintf(dir, dcap, "%.*s", slash != NULL ? (int)(slash - base) : 1,
                   slash != NULL ? base : ".");
    if (slash != NULL && slash == base)
        (void)snprintf(dir, dcap, "/");
    const char *file = slash != NULL ? slash + 1 : base;
    if (rank < 0)
        (void)snprintf(prefix, sizeof prefix, "%s.", file);
    else
        (void)snprintf(prefix, sizeof prefix, "%s.r%d.", file, rank);
    uint64_t *found;
    ferry_status st = ferry_ck_list_steps(dir, part_step, prefix, &found, n);
    if (st == FERRY_ERR_IO) {
        ferry_error_clear();
        return FERRY_OK; /* no directory: no checkpoints */
    }
    /* Steps at most INT64_MAX (part_step): the same values read as int64_t, the
     * signed type of the elements' own. */
    *steps = (int64_t *)found;
    return st;
}

ferry_status ferry_checkpoint_steps(const char *base, int rank, int64_t **steps, size_t *n) {
    char dir[1024], path[2048];
    ferry_status st = list_parts(base, rank, steps, n, dir, sizeof dir);
    size_t m = 0;
    for (size_t i = 0; st == FERRY_OK && i < *n; i++) {
        ferry_checkpoint_part(base, rank, (*steps)[i], path, sizeof path);
        ferry_ckr ck;
        if (ferry_ckr_read(path, CK_MAGIC, CK_FORMAT, &ck) != FERRY_OK) {
            FERRY_LOG_WARN("checkpoint %s is not usable: %s", path, ferry_error_last());
            continue;
        }
        ferry_ckr_free(&ck);
        (*steps)[m++] = (*steps)[i];
    }
    *n = m;
    return st;
}

ferry_status ferry_checkpoint_resolve(const char *base, int rank, char *out, size_t cap,
                                      int *found) {
    struct stat sb;
    *found = 0;
    if (stat(base, &sb) == 0 && S_ISREG(sb.st_mode)) {
        (void)snprintf(out, cap, "%s", base);
        *found = 1;
        return FERRY_OK;
    }
    int64_t *steps = NULL;
    size_t n = 0;
    ferry_status st = ferry_checkpoint_steps(base, rank, &steps, &n);
    if (st == FERRY_OK && n > 0) {
        ferry_checkpoint_part(base, rank, steps[n - 1], out, cap);
        *found = 1;
    }
    free(steps);
    return st;
}

/* A temporary name's <name> (len bytes) is "<prefix><digits>": a part of this rank. */
static int rank_temp(const char *name, size_t len, const void *user) {
    const char *prefix = user;
    size_t pl = strlen(prefix);
    if (len <= pl || strncmp(name, prefix, pl) != 0)
        return 0;
    for (size_t i = pl; i < len; i++)
        if (name[i] < '0' || name[i] > '9')
            return 0;
    return 1;
}

void ferry_checkpoint_sweep_temps(const char *base, int rank) {
    if (base == NULL)
        return;
    const char *slash = strrchr(base, '/');
    const char *file = slash != NULL ? slash + 1 : base;
    char dir[1024], prefix[512];
    (void)snprintf(dir, sizeof dir, "%.*s", slash != NULL ? (int)(slash - base) : 1,
                   slash != NULL ? base : ".");
    if (slash != NULL && slash == base)
        (void)snprintf(dir, sizeof dir, "/");
    if (rank < 0)
        (void)snprintf(prefix, sizeof prefix, "%s.", file);
    else
        (void)snprintf(prefix, sizeof prefix, "%s.r%d.", file, rank);
    uint64_t bytes = 0;
    int n = ferry_ck_sweep_temps(dir, CK_MAGIC, rank_temp, prefix, &bytes);
    if (n > 0)
        FERRY_LOG_INFO("removed %d temporary file%s of checkpoint writes a kill interrupted "
                       "(%s/.%s<step>.XXXXXX, %.1f MB)",
                       n, n > 1 ? "s" : "", dir, prefix, (double)bytes / 1e6);
}

void ferry_checkpoint_retain(const char *base, int rank, int keep) {
    int64_t *steps = NULL;
    size_t n = 0;
    char dir[1024], path[2048];
    if (keep <= 0 || list_parts(base, rank, &steps, &n, dir, sizeof dir) != FERRY_OK) {
        free(steps);
        return;
    }
    for (size_t i = 0; n > (size_t)keep && i < n - (size_t)keep; i++) {
        ferry_checkpoint_part(base, rank, steps[i], path, sizeof path);
        if (unlink(path) == 0)
            FERRY_LOG_DEBUG("checkpoint %s deleted (--keep-checkpoints %d)", path, keep);
    }
    free(steps);
}
