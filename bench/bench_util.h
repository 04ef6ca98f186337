/* bench_util.h - shared helpers of the benchmark programs: the machine's
 * description, medians, and a monotonic clock. Header-only (static inline). */
#ifndef FERRY_BENCH_UTIL_H
#define FERRY_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of n values (sorts them in place). */
static inline double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Quantile q in [0,1] of n sorted values. */
static inline double bench_quantile(const double *sorted, int n, double q) {
    int i = (int)(q * (n - 1) + 0.5);
    return sorted[i < 0 ? 0 : (i >= n ? n - 1 : i)];
}

/* "AMD EPYC 7B13, 2 cores" from /proc/cpuinfo and sysconf. */
static inline void bench_machine(char *buf, size_t cap) {
    char model[256] = "unknown CPU";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f != NULL) {
        char line[512];
        while (fgets(line, sizeof line, f) != NULL) {
            if (strncmp(line, "model name", 10) == 0) {
                char *c = strchr(line, ':');
                if (c != NULL) {
                    c += 2;
                    c[strcspn(c, "\n")] = '\0';
                    snprintf(model, sizeof model, "%s", c);
                }
                break;
            }
        }
        fclose(f);
    }
    snprintf(buf, cap, "%s, %ld cores", model, sysconf(_SC_NPROCESSORS_ONLN));
}

#endif /* FERRY_BENCH_UTIL_H */
