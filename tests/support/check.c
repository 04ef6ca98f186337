/* check.c - the test runner and the numeric comparison helpers of check.h. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tests/support/check.h"
#include "tests/support/json.h"

int ferry_check_close(const char *what, const float *a, const double *b, long n, double atol,
                      double rtol) {
    long worst = -1;
    double worst_excess = 0.0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        double lim = atol + rtol * fabs(b[i]);
        if (!(d <= lim) && (worst < 0 || d - lim > worst_excess)) {
            worst = i;
            worst_excess = d - lim;
        }
    }
    if (worst >= 0) {
        fprintf(stderr, "  %s: element %ld: got %.9g want %.9g (|diff| %.3g > %.3g)\n", what,
                worst, (double)a[worst], b[worst], fabs((double)a[worst] - b[worst]),
                atol + rtol * fabs(b[worst]));
        return 0;
    }
    return 1;
}

int ferry_check_close_f(const char *what, const float *a, const float *b, long n, double atol,
                        double rtol) {
    long worst = -1;
    double worst_excess = 0.0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        double lim = atol + rtol * fabs((double)b[i]);
        if (!(d <= lim) && (worst < 0 || d - lim > worst_excess)) {
            worst = i;
            worst_excess = d - lim;
        }
    }
    if (worst >= 0) {
        fprintf(stderr, "  %s: element %ld: got %.9g want %.9g\n", what, worst, (double)a[worst],
                (double)b[worst]);
        return 0;
    }
    return 1;
}

int ferry_check_bits_f(const char *what, const float *a, const float *b, long n) {
    long first = -1, count = 0;
    for (long i = 0; i < n; i++) {
        if (memcmp(&a[i], &b[i], sizeof *a) != 0) {
            first = first < 0 ? i : first;
            count++;
        }
    }
    if (count > 0)
        fprintf(stderr, "  %s: %ld of %ld elements differ, the first %ld: %a != %a\n", what, count,
                n, first, (double)a[first], (double)b[first]);
    return count == 0;
}

int ferry_check_json(const struct ferry_json *node, const char *path, const float *got, long n,
                     double atol, double rtol) {
    double *want = NULL;
    long m = ferry_json_tensor(ferry_json_path(node, path), &want, NULL, NULL);
    int ok = m == n;
    if (!ok)
        fprintf(stderr, "  %s: %ld elements, want %ld\n", path, m, n);
    else
        ok = ferry_check_close(path, got, want, n, atol, rtol);
    free(want);
    return ok;
}

const char *ferry_test_path(const char *rel) {
    static _Thread_local char buf[4096];
    (void)snprintf(buf, sizeof buf, "%s/%s", FERRY_SOURCE_DIR, rel);
    return buf;
}

int ferry_test_run(int argc, char **argv, const ferry_test_case *cases, int n) {
    int ran = 0;
    for (int i = 0; i < n; i++) {
        if (argc > 1 && strcmp(argv[1], cases[i].name) != 0)
            continue;
        fprintf(stderr, "[ RUN  ] %s\n", cases[i].name);
        cases[i].fn();
        fprintf(stderr, "[  OK  ] %s\n", cases[i].name);
        ran++;
    }
    if (ran == 0) {
        fprintf(stderr, "no test named '%s'\n", argc > 1 ? argv[1] : "");
        return 1;
    }
    fprintf(stderr, "%d passed, 0 failed\n", ran);
    return 0;
}

double ferry_norm_rel(const float *a, const float *b, long n) {
    double d = 0.0, ref = 0.0;
    for (long i = 0; i < n; i++) {
        double x = (double)a[i] - (double)b[i];
        d += x * x;
        ref += (double)b[i] * (double)b[i];
    }
    return sqrt(d) / (sqrt(ref) + 1e-30);
}
