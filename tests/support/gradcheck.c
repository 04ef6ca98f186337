/* gradcheck.c - central differences in double over float inputs; see gradcheck.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/support/gradcheck.h"

ferry_gradcheck_opts ferry_gradcheck_defaults(void) {
    ferry_gradcheck_opts o = {1e-2, 1e-3, 0.0, 1e-2, 0};
    return o;
}

int ferry_gradcheck(const char *what, ferry_gradcheck_loss loss, void *user, float *x, int64_t n,
                    const float *analytic, const ferry_gradcheck_opts *opts) {
    ferry_gradcheck_opts o = opts ? *opts : ferry_gradcheck_defaults();
    int64_t stride = o.max_elem > 0 && n > o.max_elem ? (n + o.max_elem - 1) / o.max_elem : 1;
    if (n <= 0)
        return 1;
    double *fd = calloc((size_t)n, sizeof *fd);
    if (fd == NULL) {
        fprintf(stderr, "  gradcheck %s: out of memory\n", what);
        return 0;
    }
    double fd_max = 0.0;
    for (int64_t i = 0; i < n; i += stride) {
        float x0 = x[i];
        /* The float neighbours actually evaluated, so the step is exact. */
        float xp = (float)((double)x0 + o.eps), xm = (float)((double)x0 - o.eps);
        x[i] = xp;
        double fp = loss(user);
        x[i] = xm;
        double fm = loss(user);
        x[i] = x0;
        fd[i] = (fp - fm) / ((double)xp - (double)xm);
        fd_max = fabs(fd[i]) > fd_max ? fabs(fd[i]) : fd_max;
    }
    double floor = o.atol + o.satol * fd_max;
    int64_t worst = -1, checked = 0;
    double worst_excess = 0.0;
    for (int64_t i = 0; i < n; i += stride, checked++) {
        double excess = fabs(fd[i] - (double)analytic[i]) - (floor + o.rtol * fabs(fd[i]));
        if (isnan(excess))
            excess = HUGE_VAL; /* NaN counts as the worst */
        if (worst < 0 || excess > worst_excess) {
            worst = i;
            worst_excess = excess;
        }
    }
    int ok = worst_excess <= 0.0;
    double a = (double)analytic[worst];
    fprintf(stderr,
            "  gradcheck %-24s %s: %lld elems, max|fd| %.3g, worst [%lld] fd %.7g "
            "analytic %.7g (|diff| %.3g, limit %.3g)\n",
            what, ok ? "ok" : "FAILED", (long long)checked, fd_max, (long long)worst, fd[worst], a,
            fabs(fd[worst] - a), floor + o.rtol * fabs(fd[worst]));
    free(fd);
    return ok;
}

void ferry_gradcheck_fill(float *x, int64_t n, float lo, float hi, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        uint64_t z = seed * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xD1B54A32D192ED03ull + 1;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        double u = (double)(z >> 11) * (1.0 / 9007199254740992.0); /* [0, 1) */
        x[i] = (float)((double)lo + ((double)hi - (double)lo) * u);
    }
}

double ferry_gradcheck_dot(const float *a, const float *r, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)a[i] * (double)r[i];
    return s;
}
