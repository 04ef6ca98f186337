/* metrics.c - JSON Lines writer of metrics.h. Each line is built in a growable buffer
 * and written with one fwrite + fflush, so a reader never sees a partial object unless
 * the disk fills mid-write. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/metrics.h"
#include "common/core/log.h" /* FERRY_ASSERT */

struct ferry_metrics {
    FILE *f;
    bool is_stdout;
    char *path;
    char *buf; /* the line being built */
    size_t len;
    size_t cap;
    bool nomem; /* a growth of buf failed; the line is dropped with FERRY_ERR_NOMEM */
};

/* ---- line building ------------------------------------------------------------------- */

static void put(ferry_metrics *m, const char *s, size_t n) {
    if (m->nomem)
        return;
    if (n + 1 > m->cap - m->len) {
        size_t cap = m->cap * 2;
        while (n + 1 > cap - m->len)
            cap *= 2;
        char *buf = realloc(m->buf, cap);
        if (buf == NULL) {
            m->nomem = true;
            return;
        }
        m->buf = buf;
        m->cap = cap;
    }
    memcpy(m->buf + m->len, s, n);
    m->len += n;
}

static void put_str(ferry_metrics *m, const char *s) {
    put(m, s, strlen(s));
}

/* A JSON string literal: quotes, backslashes and control bytes escaped; other bytes
 * (UTF-8 included) pass through. */
static void put_json_string(ferry_metrics *m, const char *s) {
    put(m, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*p;
            put(m, esc, 2);
        } else if (*p < 0x20) {
            (void)snprintf(esc, sizeof esc, "\\u%04x", *p);
            put(m, esc, 6);
        } else {
            put(m, (const char *)p, 1);
        }
    }
    put(m, "\"", 1);
}

/* A JSON number: integral values below 1e15 exactly (steps, epochs, lr 1), others with
 * nine significant digits; null for NaN and infinities. */
static void put_number(ferry_metrics *m, double v) {
    char num[40];
    if (!isfinite(v))
        (void)snprintf(num, sizeof num, "null");
    else if (v == floor(v) && fabs(v) < 1e15)
        (void)snprintf(num, sizeof num, "%.0f", v == 0 ? 0.0 : v); /* no "-0" */
    else
        (void)snprintf(num, sizeof num, "%.9g", v);
    put_str(m, num);
}

/* ,"key":value */
static void put_field(ferry_metrics *m, const char *key, double v) {
    put(m, ",", 1);
    put_json_string(m, key);
    put(m, ":", 1);
    put_number(m, v);
}

static void line_begin(ferry_metrics *m, const char *event) {
    m->len = 0;
    m->nomem = false;
    put_str(m, "{\"event\":");
    put_json_string(m, event);
}

/* Closes the object and writes the line. */
static ferry_status line_end(ferry_metrics *m) {
    put(m, "}\n", 2);
    if (m->nomem)
        return ferry_errorf(FERRY_ERR_NOMEM, "out of memory writing metrics to %s", m->path);
    errno = 0;
    if (fwrite(m->buf, 1, m->len, m->f) != m->len || fflush(m->f) != 0)
        return ferry_errorf(FERRY_ERR_IO, "cannot write metrics to %s: %s", m->path,
                            strerror(errno != 0 ? errno : EIO));
    return FERRY_OK;
}

/* ---- public -------------------------------------------------------------------------- */

ferry_status ferry_metrics_open(const char *path, ferry_metrics **out) {
    return ferry_metrics_open_mode(path, 0, out);
}

ferry_status ferry_metrics_open_mode(const char *path, int append, ferry_metrics **out) {
    FERRY_ASSERT(path != NULL && out != NULL);
    ferry_metrics *m = calloc(1, sizeof *m);
    if (m == NULL || (m->path = strdup(path)) == NULL || (m->buf = malloc(256)) == NULL) {
        if (m != NULL)
            free(m->path);
        free(m);
        return ferry_errorf(FERRY_ERR_NOMEM, "out of memory opening metrics file %s", path);
    }
    m->cap = 256;
    m->is_stdout = strcmp(path, "-") == 0;
    m->f = m->is_stdout ? stdout : fopen(path, append ? "a" : "w");
    if (m->f == NULL) {
        ferry_status st =
            ferry_errorf(FERRY_ERR_IO, "cannot open metrics file %s: %s", path, strerror(errno));
        free(m->buf);
        free(m->path);
        free(m);
        return st;
    }
    *out = m;
    return FERRY_OK;
}

ferry_status ferry_metrics_close(ferry_metrics *m) {
    if (m == NULL)
        return FERRY_OK;
    ferry_status st = FERRY_OK;
    errno = 0;
    int rc = m->is_stdout ? fflush(m->f) : fclose(m->f);
    if (rc != 0)
        st = ferry_errorf(FERRY_ERR_IO, "cannot write metrics to %s: %s", m->path,
                          strerror(errno != 0 ? errno : EIO));
    free(m->buf);
    free(m->path);
    free(m);
    return st;
}

ferry_status ferry_metrics_train(ferry_metrics *m, int epoch, int64_t step, double loss, double ppl,
                                 double lr, double tokens_per_s, double elapsed_s) {
    FERRY_ASSERT(m != NULL);
    line_begin(m, "train");
    put_field(m, "epoch", (double)epoch);
    put_field(m, "step", (double)step);
    put_field(m, "loss", loss);
    put_field(m, "ppl", ppl);
    put_field(m, "lr", lr);
    put_field(m, "tokens_per_s", tokens_per_s);
    put_field(m, "elapsed_s", elapsed_s);
    return line_end(m);
}

ferry_status ferry_metrics_eval(ferry_metrics *m, const char *split, int epoch, int64_t step,
                                double loss, double ppl) {
    FERRY_ASSERT(m != NULL && split != NULL);
    line_begin(m, "eval");
    put(m, ",\"split\":", 9);
    put_json_string(m, split);
    put_field(m, "epoch", (double)epoch);
    put_field(m, "step", (double)step);
    put_field(m, "loss", loss);
    put_field(m, "ppl", ppl);
    return line_end(m);
}

ferry_status ferry_metrics_write_kv(ferry_metrics *m, const char *event, int n,
                                    const char *const keys[], const double values[]) {
    FERRY_ASSERT(m != NULL && event != NULL && n >= 0 && (n == 0 || (keys && values)));
    line_begin(m, event);
    for (int i = 0; i < n; i++) {
        FERRY_ASSERT(keys[i] != NULL);
        put_field(m, keys[i], values[i]);
    }
    return line_end(m);
}
