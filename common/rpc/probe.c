/* probe.c - see probe.h. One TCP connection, one hand-built TLS 1.2 ClientHello (the
 * cipher suites, groups and signature algorithms of any current OpenSSL or BoringSSL
 * server, and ALPN "h2" as gRPC offers it), and a look at the first record header
 * of the answer: TLS servers answer a ClientHello with a handshake record (22) or an
 * alert (21), both version 3.x; nothing else starts that way. */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/rpc/probe.h"

#define TLS_RECORD_HANDSHAKE 22
#define TLS_RECORD_ALERT     21

/* ---- the ClientHello ------------------------------------------------------------- */

typedef struct hello_buf {
    uint8_t b[512];
    size_t n;
} hello_buf;

static void put8(hello_buf *h, unsigned v) {
    h->b[h->n++] = (uint8_t)v;
}

static void put16(hello_buf *h, unsigned v) {
    put8(h, v >> 8);
    put8(h, v & 0xff);
}

static void put_bytes(hello_buf *h, const uint8_t *p, size_t n) {
    memcpy(h->b + h->n, p, n);
    h->n += n;
}

/* Writes the length of everything after a 2-byte (or 3-byte) field at `at`. */
static void patch16(hello_buf *h, size_t at) {
    size_t len = h->n - at - 2;
    h->b[at] = (uint8_t)(len >> 8);
    h->b[at + 1] = (uint8_t)(len & 0xff);
}

static void patch24(hello_buf *h, size_t at) {
    size_t len = h->n - at - 3;
    h->b[at] = (uint8_t)(len >> 16);
    h->b[at + 1] = (uint8_t)((len >> 8) & 0xff);
    h->b[at + 2] = (uint8_t)(len & 0xff);
}

/* An extension: its type, then its body with a 2-byte length. */
static void put_ext(hello_buf *h, unsigned type, const uint8_t *body, size_t n) {
    put16(h, type);
    put16(h, (unsigned)n);
    put_bytes(h, body, n);
}

static size_t client_hello(uint8_t *out, size_t cap) {
    static const uint8_t suites[] = {
        0x13, 0x01, 0x13, 0x02, 0x13, 0x03,             /* TLS 1.3 AES-GCM, ChaCha20 */
        0xc0, 0x2b, 0xc0, 0x2f, 0xc0, 0x2c, 0xc0, 0x30, /* ECDHE ECDSA/RSA AES-GCM */
        0xcc, 0xa9, 0xcc, 0xa8, 0x00, 0x9c, 0x00, 0x9d, 0x00, 0x2f, 0x00, 0x35};
    static const uint8_t groups[] = {0x00, 0x08, 0x00, 0x1d, 0x00, 0x17, 0x00, 0x18, 0x00, 0x19};
    static const uint8_t points[] = {0x01, 0x00};
    static const uint8_t sigalgs[] = {0x00, 0x10, 0x04, 0x03, 0x08, 0x04, 0x04, 0x01, 0x05,
                                      0x03, 0x08, 0x05, 0x05, 0x01, 0x08, 0x06, 0x06, 0x01};
    static const uint8_t alpn[] = {0x00, 0x03, 0x02, 'h', '2'};
    hello_buf h = {.n = 0};
    put8(&h, TLS_RECORD_HANDSHAKE);
    put16(&h, 0x0301); /* record version, as clients send it */
    size_t rec = h.n;
    put16(&h, 0);
    put8(&h, 1); /* ClientHello */
    size_t hs = h.n;
    put8(&h, 0);
    put16(&h, 0);
    put16(&h, 0x0303); /* TLS 1.2 */
    /* The random: its value does not matter for a probe that never finishes. */
    uint64_t r = (uint64_t)time(NULL) * 6364136223846793005ull + (uint64_t)getpid();
    for (int i = 0; i < 32; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        put8(&h, (unsigned)(r >> 56));
    }
    put8(&h, 0); /* no session id */
    put16(&h, sizeof suites);
    put_bytes(&h, suites, sizeof suites);
    put8(&h, 1); /* one compression method: none */
    put8(&h, 0);
    size_t ext = h.n;
    put16(&h, 0);
    put_ext(&h, 0x000a, groups, sizeof groups);   /* supported_groups */
    put_ext(&h, 0x000b, points, sizeof points);   /* ec_point_formats */
    put_ext(&h, 0x000d, sigalgs, sizeof sigalgs); /* signature_algorithms */
    put_ext(&h, 0x0010, alpn, sizeof alpn);       /* ALPN: h2 */
    patch16(&h, ext);
    patch24(&h, hs);
    patch16(&h, rec);
    if (h.n > cap)
        return 0;
    memcpy(out, h.b, h.n);
    return h.n;
}

/* ---- the connection -------------------------------------------------------------- */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Waits for events on fd until deadline (ms, now_ms clock); 1 ready, 0 not. */
static int wait_fd(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - now_ms();
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, (int)left + 1);
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return 0;
    }
}

/* A connected, non-blocking socket to one of host's addresses, or -1. */
static int connect_any(const char *host, const char *port, double deadline, char *why, size_t cap) {
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    int e = getaddrinfo(host, port, &hints, &ai);
    if (e != 0) {
        (void)snprintf(why, cap, "cannot resolve '%s': %s", host, gai_strerror(e));
        return -1;
    }
    int fd = -1;
    (void)snprintf(why, cap, "no address of '%s' accepted a connection", host);
    for (const struct addrinfo *a = ai; a != NULL && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        int err = 0;
        socklen_t len = sizeof err;
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 &&
            (errno != EINPROGRESS || !wait_fd(fd, POLLOUT, deadline) ||
             getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)) {
            (void)snprintf(why, cap, "connect: %s", strerror(err != 0 ? err : errno));
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    return fd;
}

ferry_status ferry_rpc_probe_tls(const char *host, const char *port, int timeout_ms, int *tls) {
    uint8_t hello[512], got[8];
    size_t n = client_hello(hello, sizeof hello);
    char why[256];
    double deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 1000);
    int fd = connect_any(host, port, deadline, why, sizeof why);
    if (fd < 0)
        return ferry_errorf(FERRY_ERR_UNAVAILABLE, "probing %s:%s: %s", host, port, why);
    size_t sent = 0, have = 0;
    while (sent < n && wait_fd(fd, POLLOUT, deadline)) {
        ssize_t k = send(fd, hello + sent, n - sent, MSG_NOSIGNAL);
        if (k <= 0 && errno != EAGAIN && errno != EINTR)
            break;
        sent += k > 0 ? (size_t)k : 0;
    }
    /* Three bytes tell: the record type and the major and minor version. */
    while (sent == n && have < 3 && wait_fd(fd, POLLIN, deadline)) {
        ssize_t k = recv(fd, got + have, 3 - have, 0);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
            break; /* closed (or reset) without a TLS answer */
        have += k > 0 ? (size_t)k : 0;
    }
    close(fd);
    *tls =
        have >= 2 && (got[0] == TLS_RECORD_HANDSHAKE || got[0] == TLS_RECORD_ALERT) && got[1] == 3;
    return FERRY_OK;
}
