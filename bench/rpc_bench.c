/* rpc_bench.c - ferry's RPC layer against raw TCP on the same machine, in one
 * run: 16-byte TCP ping-pong, 128 KiB one-way TCP throughput and a TCP echo of each
 * bulk size (request whole, then reply: a unary call's pattern); ferry tiny-call
 * latency (16-byte tensor) against servers with 1 and 2 poll threads; one-way
 * (client -> server, tiny reply) and echo throughput at 1, 16 and 64 MiB.
 * Servers run in forked child processes, forked before the parent touches gRPC,
 * so client and server never share a gRPC instance.
 *
 *     rpc_bench [--quick] [--no-tune]
 *
 * --quick: 1 round and fewer iterations, a smoke test; --no-tune: leave glibc's
 * malloc trim threshold alone (see ferry_rpc_tune_malloc). */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ferry.pb-c.h"
#include "common/rpc/rpc.h"
#include "common/core/log.h"

#define MIB       (1u << 20)
#define TCP_CHUNK (128u << 10)

static int quick;

/* ---- Small helpers (tool code: failures exit) ------------------------------------------ */

static void die(const char *what) {
    fprintf(stderr, "rpc_bench: %s\n", what);
    exit(1);
}

static void check_ok(ferry_status st, const char *what) {
    if (st != FERRY_OK) {
        fprintf(stderr, "rpc_bench: %s: %s (%s)\n", what, ferry_status_str(st), ferry_error_last());
        exit(1);
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorts v and returns the q-quantile (0.5: median). */
static double quantile(double *v, int n, double q) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)(q * (n - 1) + 0.5);
    return v[i];
}

static void write_all(int fd, const void *p, size_t n) {
    const char *b = p;
    while (n > 0) {
        ssize_t w = write(fd, b, n);
        if (w <= 0)
            die("write failed");
        b += w;
        n -= (size_t)w;
    }
}

static void read_all(int fd, void *p, size_t n) {
    char *b = p;
    while (n > 0) {
        ssize_t r = read(fd, b, n);
        if (r <= 0)
            die("read failed");
        b += r;
        n -= (size_t)r;
    }
}

static void print_machine(void) {
    char line[256], model[200] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "model name", 10) == 0) {
            const char *v = strchr(line, ':');
            (void)snprintf(model, sizeof model, "%.199s", v != NULL ? v + 2 : line);
            model[strcspn(model, "\n")] = '\0';
            break;
        }
    }
    if (f != NULL)
        fclose(f);
    printf("machine: %s, %ld online CPUs\n", model, sysconf(_SC_NPROCESSORS_ONLN));
}

/* ---- Raw TCP baseline ---------------------------------------------------------------------- */

/* Child: serves connections until the control pipe closes. The first byte picks
 * the mode: 'S' reads to EOF and answers with the byte count, 'E' echoes
 * 16-byte messages until EOF, 'B' reads a message's length (8 bytes) and then the
 * whole message before it writes it back (a unary call's request and reply, in 128 KiB
 * writes), until EOF. */
static void tcp_child(int lfd, int ctl) {
    char *buf = malloc(TCP_CHUNK);
    for (;;) {
        struct pollfd p[2] = {{.fd = lfd, .events = POLLIN}, {.fd = ctl, .events = POLLIN}};
        if (poll(p, 2, -1) < 0 || p[1].revents != 0)
            break;
        int fd = accept(lfd, NULL, NULL);
        int one = 1;
        char mode;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        read_all(fd, &mode, 1);
        uint64_t total = 0, len = 0, cap = 0;
        char *msg = NULL; /* kept from message to message, as a server's buffers are */
        while (mode == 'B' && read(fd, &len, sizeof len) == (ssize_t)sizeof len && len > 0 &&
               len <= 256u * MIB) {
            if (len > cap) {
                free(msg);
                if ((msg = malloc(len)) == NULL)
                    break;
                memset(msg, 0, len);
                cap = len;
            }
            read_all(fd, msg, len);
            for (size_t off = 0; off < len; off += TCP_CHUNK)
                write_all(fd, msg + off, len - off < TCP_CHUNK ? len - off : TCP_CHUNK);
        }
        free(msg);
        for (; mode != 'B';) {
            ssize_t r = read(fd, buf, mode == 'E' ? 16 : TCP_CHUNK);
            if (r <= 0)
                break;
            total += (uint64_t)r;
            if (mode == 'E')
                write_all(fd, buf, (size_t)r);
        }
        if (mode == 'S')
            write_all(fd, &total, sizeof total);
        close(fd);
    }
    free(buf);
}

static int tcp_connect(int port, char mode) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        die("tcp connect failed");
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    write_all(fd, &mode, 1);
    return fd;
}

/* An in-process echo peer on its own thread: the PoC's baseline. On small VMs
 * the scheduler often keeps both threads on one CPU, which makes it much
 * faster than two processes; we print both and compare RPC with the latter. */
typedef struct tcp_thread_peer {
    int lfd, ctl[2];
    pthread_t th;
} tcp_thread_peer;

static void *tcp_thread_main(void *arg) {
    tcp_thread_peer *p = arg;
    tcp_child(p->lfd, p->ctl[0]);
    return NULL;
}

static int tcp_listen(int *port) {
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof a;
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(lfd, 8) != 0 ||
        getsockname(lfd, (struct sockaddr *)&a, &alen) != 0)
        die("tcp listen failed");
    *port = ntohs(a.sin_port);
    return lfd;
}

static void tcp_pingpong(int port, double *median, double *p99) {
    int n = quick ? 2000 : 20000, warm = 1000;
    double *lat = malloc((size_t)n * sizeof *lat);
    char msg[16] = "0123456789abcdef";
    int fd = tcp_connect(port, 'E');
    for (int i = 0; i < n + warm; i++) {
        double t0 = ferry_now();
        write_all(fd, msg, 16);
        read_all(fd, msg, 16);
        if (i >= warm)
            lat[i - warm] = ferry_now() - t0;
    }
    close(fd);
    *median = quantile(lat, n, 0.5);
    *p99 = quantile(lat, n, 0.99);
    free(lat);
}

/* A unary echo over raw TCP, the baseline for an RPC echo: `n` bytes out in 128 KiB writes,
 * the peer reads them all, then writes them back; bytes per second per direction (n
 * over the round trip), as rpc_throughput counts an echo. */
static double tcp_echo(int port, size_t n, int iters) {
    char *buf = malloc(n);
    memset(buf, 0x5a, n);
    int fd = tcp_connect(port, 'B');
    double t0 = 0.0;
    for (int i = -1; i < iters; i++) { /* one warm-up */
        if (i == 0)
            t0 = ferry_now();
        uint64_t len = n;
        write_all(fd, &len, sizeof len);
        for (size_t off = 0; off < n; off += TCP_CHUNK)
            write_all(fd, buf + off, n - off < TCP_CHUNK ? n - off : TCP_CHUNK);
        read_all(fd, buf, n);
    }
    double dt = ferry_now() - t0;
    close(fd);
    free(buf);
    return (double)n * iters / dt;
}

/* Bytes per second for `total` bytes in 128 KiB writes, until the peer has read them all. */
static double tcp_oneway(int port, size_t total) {
    char *buf = malloc(TCP_CHUNK);
    memset(buf, 0x5a, TCP_CHUNK);
    int fd = tcp_connect(port, 'S');
    double t0 = ferry_now();
    for (size_t sent = 0; sent < total; sent += TCP_CHUNK)
        write_all(fd, buf, TCP_CHUNK);
    shutdown(fd, SHUT_WR);
    uint64_t got;
    read_all(fd, &got, sizeof got);
    double dt = ferry_now() - t0;
    if (got != total)
        die("tcp sink lost bytes");
    close(fd);
    free(buf);
    return (double)total / dt;
}

/* ---- ferry RPC servers (children) ---------------------------------------------------------- */

/* Forward echoes its tensors (moved, not copied); SetParams swallows them. */
static ferry_status bench_handler(void *user, ferry_rpc_method method, ferry_rpc_msg *req,
                                  ferry_rpc_msg *reply) {
    (void)user;
    if (method == FERRY_RPC_SET_PARAMS) {
        Ferry__V1__SetParamsReply r;
        ferry__v1__set_params_reply__init(&r);
        r.version = (uint64_t)req->ntensors;
        return ferry_rpc_msg_set_head(reply, &r.base);
    }
    for (int i = 0; i < req->ntensors; i++) {
        ferry_rpc_tensor t;
        ferry_status st = ferry_rpc_msg_take(req, i, &t);
        if (st == FERRY_OK && (st = ferry_rpc_msg_add(reply, &t)) != FERRY_OK && t.release)
            t.release(t.release_user);
        if (st != FERRY_OK)
            return st;
    }
    return FERRY_OK;
}

/* Child: serve until the control pipe closes, after reporting the port. */
static void rpc_child(int threads, int report, int ctl) {
    ferry_rpc_server_config cfg = {
        .listen = "127.0.0.1:0", .threads = threads, .max_message_bytes = 128u * MIB};
    cfg.handlers[FERRY_RPC_FORWARD] = bench_handler;
    cfg.handlers[FERRY_RPC_SET_PARAMS] = bench_handler;
    ferry_rpc_server *srv;
    check_ok(ferry_rpc_server_create(&cfg, &srv), "server");
    int port = ferry_rpc_server_port(srv);
    write_all(report, &port, sizeof port);
    char b;
    while (read(ctl, &b, 1) > 0) {
    }
    ferry_rpc_server_shutdown(srv, 1000);
    ferry_rpc_server_destroy(srv);
}

/* Forks a child running fn-like work; returns its pid and, via *port, the port
 * it reports on a fresh pipe. */
static pid_t spawn(int kind, int threads, int lfd, int ctl[2], int *port) {
    int rep[2];
    if (pipe(rep) != 0)
        die("pipe");
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        close(ctl[1]);
        close(rep[0]);
        if (kind == 'T')
            tcp_child(lfd, ctl[0]);
        else
            rpc_child(threads, rep[1], ctl[0]);
        exit(0);
    }
    close(rep[1]);
    if (kind != 'T')
        read_all(rep[0], port, sizeof *port);
    close(rep[0]);
    return pid;
}

/* ---- ferry RPC measurements (parent) -------------------------------------------------------- */

static ferry_rpc_client *bench_client(int port) {
    char target[64];
    (void)snprintf(target, sizeof target, "127.0.0.1:%d", port);
    ferry_rpc_client_config cfg = {.max_message_bytes = 128u * MIB, .deadline_ms = 60000};
    ferry_rpc_client *c;
    check_ok(ferry_rpc_client_create(target, &cfg, &c), "client");
    return c;
}

/* A request carrying one borrowed f32 tensor over buf. */
static void bench_request(ferry_rpc_msg *m, void *buf, size_t n) {
    ferry_rpc_tensor t = {.dtype = FERRY_RPC_DTYPE_F32,
                          .ndim = 1,
                          .dim = {(int64_t)(n / 4)},
                          .data = buf,
                          .nbytes = n,
                          .name = "x"};
    ferry_rpc_msg_init(m);
    check_ok(ferry_rpc_msg_add(m, &t), "request");
}

static void rpc_latency(int port, double *median, double *p99) {
    int n = quick ? 300 : 2000, warm = 200;
    double *lat = malloc((size_t)n * sizeof *lat);
    float x[4] = {1, 2, 3, 4};
    ferry_rpc_client *c = bench_client(port);
    ferry_rpc_msg req, reply;
    bench_request(&req, x, sizeof x);
    ferry_rpc_msg_init(&reply);
    for (int i = 0; i < n + warm; i++) {
        double t0 = ferry_now();
        check_ok(ferry_rpc_call(c, FERRY_RPC_FORWARD, &req, &reply, 0), "tiny call");
        if (i >= warm)
            lat[i - warm] = ferry_now() - t0;
    }
    if (reply.ntensors != 1 || memcmp(reply.tensors[0].data, x, sizeof x) != 0)
        die("tiny echo returned wrong data");
    ferry_rpc_msg_deinit(&reply);
    ferry_rpc_msg_deinit(&req);
    ferry_rpc_client_destroy(c);
    *median = quantile(lat, n, 0.5);
    *p99 = quantile(lat, n, 0.99);
    free(lat);
}

/* Payload bytes per second per direction: SetParams is one-way, Forward echoes. */
static double rpc_throughput(ferry_rpc_client *c, ferry_rpc_method m, size_t n, int iters) {
    float *buf = ferry_buf_alloc(n);
    if (buf == NULL)
        die("out of memory");
    for (size_t i = 0; i < n / 4; i++)
        buf[i] = (float)i;
    ferry_rpc_msg req, reply;
    bench_request(&req, buf, n);
    ferry_rpc_msg_init(&reply);
    for (int i = 0; i < 2; i++)
        check_ok(ferry_rpc_call(c, m, &req, &reply, 0), "warm-up call");
    double t0 = ferry_now();
    for (int i = 0; i < iters; i++)
        check_ok(ferry_rpc_call(c, m, &req, &reply, 0), "bulk call");
    double dt = ferry_now() - t0;
    if (m == FERRY_RPC_FORWARD && (reply.ntensors != 1 || reply.tensors[0].nbytes != n ||
                                   memcmp(reply.tensors[0].data, buf, n) != 0))
        die("bulk echo returned wrong data");
    ferry_rpc_msg_deinit(&reply);
    ferry_rpc_msg_deinit(&req);
    ferry_buf_free(buf);
    return (double)n * iters / dt;
}

/* ---- Rounds and summary ---------------------------------------------------------------------- */

/* One round measures everything once, TCP and RPC back to back, so that the
 * ratios compare numbers taken under the same background load (this VM is
 * shared and noisy: see spec/grpc-core.md §7). */
#define ROUNDS_MAX 5

typedef struct bench_round {
    double tcp_bps, rtt, rtt99, thread_rtt, thread_rtt99;
    double lat[2], lat99[2]; /* tiny call, server with 1 and 2 CQ threads */
    double oneway[3], echo[3];
    double tcp_echo[3]; /* raw TCP request/reply of the same sizes */
} bench_round;

static const size_t bulk_sizes[3] = {1 * MIB, 16 * MIB, 64 * MIB};

static void run_round(bench_round *r, int tcp_port, int port1, int port2) {
    /* Bulk first: under the haltpoll cpuidle governor of small VMs, idle vCPUs
     * sleep deeper after a quiet spell, and a cold ping-pong measures wake-up
     * latency (about 100 us here) instead of the network stack (about 6 us). */
    r->tcp_bps = tcp_oneway(tcp_port, (quick ? 256u : 1024u) * MIB);
    const int iters[3] = {quick ? 20 : 200, quick ? 4 : 30, quick ? 2 : 8};
    for (int i = 0; i < 3; i++)
        r->tcp_echo[i] = tcp_echo(tcp_port, bulk_sizes[i], iters[i]);
    tcp_pingpong(tcp_port, &r->rtt, &r->rtt99);

    tcp_thread_peer peer;
    int thread_port;
    peer.lfd = tcp_listen(&thread_port);
    if (pipe(peer.ctl) != 0 || pthread_create(&peer.th, NULL, tcp_thread_main, &peer) != 0)
        die("tcp thread peer");
    tcp_pingpong(thread_port, &r->thread_rtt, &r->thread_rtt99);
    close(peer.ctl[1]);
    pthread_join(peer.th, NULL);
    close(peer.ctl[0]);
    close(peer.lfd);

    rpc_latency(port1, &r->lat[0], &r->lat99[0]);
    rpc_latency(port2, &r->lat[1], &r->lat99[1]);
    ferry_rpc_client *c = bench_client(port2);
    for (int i = 0; i < 3; i++)
        r->oneway[i] = rpc_throughput(c, FERRY_RPC_SET_PARAMS, bulk_sizes[i], iters[i]);
    for (int i = 0; i < 3; i++)
        r->echo[i] = rpc_throughput(c, FERRY_RPC_FORWARD, bulk_sizes[i], iters[i]);
    ferry_rpc_client_destroy(c);
}

typedef struct spread {
    double med, lo, hi;
} spread;

static double field(const bench_round *r, size_t off) {
    double v;
    memcpy(&v, (const char *)r + off, sizeof v);
    return v;
}

/* Median and range over the rounds of the field at offset num, divided by the
 * field at offset den of the same round (den == SIZE_MAX: no division). */
static spread across(const bench_round *rounds, int n, size_t num, size_t den) {
    double v[ROUNDS_MAX];
    for (int i = 0; i < n; i++)
        v[i] = field(&rounds[i], num) / (den == SIZE_MAX ? 1.0 : field(&rounds[i], den));
    spread sp;
    sp.med = quantile(v, n, 0.5); /* sorts v */
    sp.lo = v[0];
    sp.hi = v[n - 1];
    return sp;
}

#define AT(f) offsetof(bench_round, f)
#define ALONE SIZE_MAX

static void report(const bench_round *rr, int n) {
    spread a, b;
    printf("\n== raw TCP loopback ==\n");
    a = across(rr, n, AT(rtt), ALONE);
    b = across(rr, n, AT(rtt99), ALONE);
    printf("16 B ping-pong RTT, two processes: median %6.1f us [%.1f-%.1f], p99 %.1f us\n",
           a.med * 1e6, a.lo * 1e6, a.hi * 1e6, b.med * 1e6);
    a = across(rr, n, AT(thread_rtt), ALONE);
    b = across(rr, n, AT(thread_rtt99), ALONE);
    printf("16 B ping-pong RTT, two threads:   median %6.1f us [%.1f-%.1f], p99 %.1f us\n",
           a.med * 1e6, a.lo * 1e6, a.hi * 1e6, b.med * 1e6);
    a = across(rr, n, AT(tcp_bps), ALONE);
    printf("one-way, 128 KiB writes:           %6.0f MB/s [%.0f-%.0f]\n", a.med / 1e6, a.lo / 1e6,
           a.hi / 1e6);
    for (int i = 0; i < 3; i++) {
        a = across(rr, n, AT(tcp_echo[0]) + (size_t)i * sizeof(double), ALONE);
        printf("echo %2zu MiB (request, then reply): %6.0f MB/s per direction [%.0f-%.0f]\n",
               bulk_sizes[i] / MIB, a.med / 1e6, a.lo / 1e6, a.hi / 1e6);
    }

    printf("\n== ferry RPC (gRPC C core; zero-copy send, one-copy aligned receive) ==\n");
    for (int t = 0; t < 2; t++) {
        a = across(rr, n, AT(lat[0]) + (size_t)t * sizeof(double), ALONE);
        b = across(rr, n, AT(lat99[0]) + (size_t)t * sizeof(double), ALONE);
        spread x = across(rr, n, AT(lat[0]) + (size_t)t * sizeof(double), AT(rtt));
        printf("tiny call (16 B echo), %d CQ thread%s median %6.1f us [%.1f-%.1f], p99 %.1f us,"
               " %.1fx TCP RTT\n",
               t + 1, t == 0 ? ": " : "s:", a.med * 1e6, a.lo * 1e6, a.hi * 1e6, b.med * 1e6,
               x.med);
    }
    printf("throughput against the 2-thread server, payload MB/s per direction, and the share\n"
           "of the same round's raw TCP one-way rate (and, for echo, of raw TCP's echo of the\n"
           "same size: the request, then the reply, as a unary call does):\n");
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 3; i++) {
            size_t off = (k == 0 ? AT(oneway[0]) : AT(echo[0])) + (size_t)i * sizeof(double);
            a = across(rr, n, off, ALONE);
            b = across(rr, n, off, AT(tcp_bps));
            printf("%s %2zu MiB: %6.0f MB/s [%.0f-%.0f]  %3.0f%% of TCP [%.0f-%.0f]",
                   k == 0 ? "one-way" : "echo   ", bulk_sizes[i] / MIB, a.med / 1e6, a.lo / 1e6,
                   a.hi / 1e6, 100 * b.med, 100 * b.lo, 100 * b.hi);
            if (k == 1) {
                b = across(rr, n, off, AT(tcp_echo[0]) + (size_t)i * sizeof(double));
                printf("  %3.0f%% of TCP echo [%.0f-%.0f]", 100 * b.med, 100 * b.lo, 100 * b.hi);
            }
            printf("\n");
        }
    }

    printf("\n== targets (medians over the rounds) ==\n");
    a = across(rr, n, AT(lat[0]), ALONE);
    b = across(rr, n, AT(lat[1]), ALONE);
    double best = a.med < b.med ? a.med : b.med;
    printf("tiny-call median <= 150 us:    %.0f us (1 thread), %.0f us (2 threads) -> %s\n",
           a.med * 1e6, b.med * 1e6, best <= 150e-6 ? "met" : "MISSED");
    a = across(rr, n, AT(oneway[1]), AT(tcp_bps));
    printf("16 MiB one-way >= 90%% of TCP: %.0f%% -> %s\n", 100 * a.med,
           a.med >= 0.9 ? "met" : "MISSED");
    a = across(rr, n, AT(echo[1]), AT(tcp_echo[1]));
    printf("16 MiB echo >= 70%% of TCP echo: %.0f%% -> %s\n", 100 * a.med,
           a.med >= 0.7 ? "met" : "MISSED");
}

int main(int argc, char **argv) {
    int tune = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--no-tune") == 0) {
            tune = 0;
        } else {
            fprintf(stderr, "usage: rpc_bench [--quick] [--no-tune]\n");
            return 2;
        }
    }
    int rounds = quick ? 1 : 3;
    signal(SIGPIPE, SIG_IGN);
    ferry_log_init("rpc_bench");
    /* As the daemons should: freed receive buffers stay mapped (rpc.h). */
    if (tune)
        check_ok(ferry_rpc_tune_malloc(0), "tune malloc");
    print_machine();
    printf("%d round%s; each measures everything once; figures are medians [min-max] over rounds\n"
           "malloc trim threshold: %s\n",
           rounds, rounds > 1 ? "s" : "",
           tune ? "raised (ferry_rpc_tune_malloc)" : "glibc default");
    fflush(stdout); /* before fork, or every child prints it again */

    /* Every child is forked before the parent initializes gRPC. */
    int ctl[2];
    if (pipe(ctl) != 0)
        die("pipe");
    int tcp_port, port1, port2;
    int lfd = tcp_listen(&tcp_port);
    pid_t pids[3];
    pids[0] = spawn('T', 0, lfd, ctl, NULL);
    close(lfd);
    pids[1] = spawn('R', 1, -1, ctl, &port1);
    pids[2] = spawn('R', 2, -1, ctl, &port2);
    close(ctl[0]);

    bench_round rr[ROUNDS_MAX];
    for (int i = 0; i < rounds; i++)
        run_round(&rr[i], tcp_port, port1, port2);
    report(rr, rounds);

    close(ctl[1]); /* the children see EOF and shut down */
    for (int i = 0; i < 3; i++)
        waitpid(pids[i], NULL, 0);
    return 0;
}
