/* bench_ps.h - ferry-ps as a child process of a benchmark: the real binary,
 * fork+exec'd before the benchmark touches gRPC, listening on 127.0.0.1 port 0.
 * Tool code: a failure prints one line, stops every child and exits.
 * Header-only (static functions), shared by train_bench and pipe_bench; include it
 * after defining _POSIX_C_SOURCE 200809L (or _GNU_SOURCE). */
#ifndef FERRY_BENCH_PS_H
#define FERRY_BENCH_PS_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ferry/status.h"

typedef struct ps_child {
    pid_t pid;
    char dir[64];    /* holds the port file */
    char target[64]; /* "127.0.0.1:PORT" */
} ps_child;

#define BENCH_MAX_CHILDREN 8
static ps_child *bench_children[BENCH_MAX_CHILDREN];
static int bench_nchildren;

static inline void bench_sleep_ms(long ms) {
    nanosleep(&(struct timespec){ms / 1000, (ms % 1000) * 1000000L}, NULL);
}

static inline void bench_ps_cleanup_dir(ps_child *p) {
    char path[128];
    if (p->dir[0] == '\0')
        return;
    snprintf(path, sizeof path, "%s/port", p->dir);
    unlink(path);
    rmdir(p->dir);
    p->dir[0] = '\0';
}

/* SIGTERM, then up to 10 s for a clean exit (SIGKILL after). Returns the exit
 * status, 128 + signal, or -1 when there was no child. */
static inline int bench_ps_stop(ps_child *p) {
    int code = -1;
    if (p->pid > 0) {
        kill(p->pid, SIGTERM);
        for (int i = 0; i < 1000 && code < 0; i++) {
            int ws;
            if (waitpid(p->pid, &ws, WNOHANG) == p->pid)
                code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
            else
                bench_sleep_ms(10);
        }
        if (code < 0) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, NULL, 0);
            code = 128 + SIGKILL;
        }
        p->pid = -1;
    }
    bench_ps_cleanup_dir(p);
    return code;
}

static inline void bench_die(const char *prog, const char *what) {
    fprintf(stderr, "%s: %s%s%s\n", prog, what, ferry_error_last()[0] ? ": " : "",
            ferry_error_last());
    for (int i = 0; i < bench_nchildren; i++)
        bench_ps_stop(bench_children[i]);
    exit(1);
}

/* Starts `bin --listen 127.0.0.1:0 --port-file DIR/port --threads T [--blas-threads N]`
 * (blas_threads 0: ferry-ps's default) and waits for the port. Call before this
 * process initializes gRPC, so the fork copies no gRPC state. */
static inline void bench_ps_spawn(ps_child *p, const char *bin, int threads, int blas_threads) {
    p->pid = -1;
    snprintf(p->dir, sizeof p->dir, "/tmp/ferry-bench.XXXXXX");
    if (mkdtemp(p->dir) == NULL) {
        p->dir[0] = '\0';
        bench_die("bench", "mkdtemp failed");
    }
    if (bench_nchildren < BENCH_MAX_CHILDREN)
        bench_children[bench_nchildren++] = p;
    char port_file[128], th[16], blas[16];
    snprintf(port_file, sizeof port_file, "%s/port", p->dir);
    snprintf(th, sizeof th, "%d", threads);
    snprintf(blas, sizeof blas, "%d", blas_threads);
    fflush(stdout); /* the child must not inherit unwritten output */
    p->pid = fork();
    if (p->pid < 0)
        bench_die("bench", "fork failed");
    if (p->pid == 0) {
        if (blas_threads > 0)
            execl(bin, bin, "--listen", "127.0.0.1:0", "--port-file", port_file, "--threads", th,
                  "--blas-threads", blas, "--log-level", "warn", (char *)NULL);
        else
            execl(bin, bin, "--listen", "127.0.0.1:0", "--port-file", port_file, "--threads", th,
                  "--log-level", "warn", (char *)NULL);
        fprintf(stderr, "bench: cannot exec %s (build ferry-ps, or pass --ps-bin)\n", bin);
        _exit(127);
    }
    for (int i = 0; i < 1500; i++) { /* 15 s */
        int ws, port = 0;
        if (waitpid(p->pid, &ws, WNOHANG) == p->pid) {
            p->pid = -1;
            bench_die("bench", "ferry-ps exited before listening");
        }
        FILE *f = fopen(port_file, "r");
        if (f != NULL) {
            int got = fscanf(f, "%d", &port);
            fclose(f);
            if (got == 1 && port > 0) {
                snprintf(p->target, sizeof p->target, "127.0.0.1:%d", port);
                return;
            }
        }
        bench_sleep_ms(10);
    }
    bench_die("bench", "ferry-ps did not write its port file within 15 s");
}

#endif /* FERRY_BENCH_PS_H */
