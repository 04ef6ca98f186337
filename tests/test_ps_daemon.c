/* test_ps_daemon.c - the ferry-ps executable: started on port 0 it writes the bound
 * port to --port-file and logs "listening on HOST:PORT", serves a client, and on
 * SIGTERM stops accepting, finishes and exits 0; a bad command line exits 2. */
#define _POSIX_C_SOURCE 200809L /* kill, mkdtemp, mkstemp, nanosleep */
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "ferry/ferry.h"

extern char **environ;

static const char *daemon_path(void) {
    static char path[4096];
    (void)snprintf(path, sizeof path, "%s/server/ferry-ps", FERRY_BINARY_DIR);
    if (access(path, X_OK) != 0)
        SKIP("ferry-ps is not built");
    return path;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    (void)nanosleep(&ts, NULL);
}

/* Starts ferry-ps with argv (after the program name), stderr into log. */
static pid_t spawn(char *const *args, int nargs, const char *log) {
    char *argv[16];
    argv[0] = (char *)(uintptr_t)daemon_path();
    for (int i = 0; i < nargs; i++)
        argv[i + 1] = args[i];
    argv[nargs + 1] = NULL;
    posix_spawn_file_actions_t fa;
    CHECK(posix_spawn_file_actions_init(&fa) == 0);
    CHECK(posix_spawn_file_actions_addopen(&fa, 2, log, O_WRONLY | O_CREAT | O_TRUNC, 0644) == 0);
    pid_t pid;
    CHECK(posix_spawn(&pid, argv[0], &fa, NULL, argv, environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    return pid;
}

static int wait_exit(pid_t pid) {
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static int file_contains(const char *path, const char *needle) {
    static char buf[1 << 16];
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    (void)fclose(f);
    return strstr(buf, needle) != NULL;
}

TEST(serves_and_exits_cleanly_on_sigterm) {
    char dir[] = "/tmp/ferry-ps-daemon-XXXXXX", port_file[128], log[128], addr[64];
    CHECK(mkdtemp(dir) != NULL);
    (void)snprintf(port_file, sizeof port_file, "%s/port", dir);
    (void)snprintf(log, sizeof log, "%s/log", dir);
    /* A short grace: gRPC holds the shutdown until the connected client goes away or
     * the grace ends. */
    char *args[] = {
        "--listen",  "127.0.0.1:0", "--port-file",         port_file, "--context-ttl", "5",
        "--threads", "2",           "--shutdown-grace-ms", "300"};
    pid_t pid = spawn(args, 10, log);
    int port = 0;
    for (int i = 0; i < 1200 && port == 0; i++) { /* up to 60 s (ASan, a loaded machine) */
        FILE *f = fopen(port_file, "r");
        if (f != NULL) {
            if (fscanf(f, "%d", &port) != 1)
                port = 0;
            (void)fclose(f);
        }
        if (port == 0)
            sleep_ms(50);
    }
    CHECK(port > 0);
    (void)snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    char line[96];
    (void)snprintf(line, sizeof line, "listening on %s", addr);
    CHECK(file_contains(log, line));

    ferry_cluster *cl;
    ferry_remote *emb;
    CHECK_OK(ferry_ps_connect(addr, NULL, &cl));
    ferry_remote_config rc;
    ferry_remote_config_default(&rc, FERRY_REMOTE_EMBEDDING, "emb", 100, 8);
    CHECK_OK(ferry_remote_create(cl, &rc, &emb));
    float row[8];
    CHECK_OK(ferry_remote_get_params(emb, "weight", 42, 1, row));

    CHECK(kill(pid, SIGTERM) == 0);
    CHECK_EQ(wait_exit(pid), 0);
    CHECK(file_contains(log, "created embedding 'emb'"));
    CHECK(file_contains(log, "received SIGTERM"));
    CHECK(file_contains(log, "stopped after"));
    CHECK(ferry_remote_get_params(emb, "weight", 42, 1, row) != FERRY_OK);

    ferry_remote_destroy(emb);
    ferry_cluster_destroy(cl);
    CHECK(remove(port_file) == 0 && remove(log) == 0 && rmdir(dir) == 0);
}

TEST(bad_command_lines_exit_2) {
    char log[] = "/tmp/ferry-ps-flags-XXXXXX";
    int fd = mkstemp(log);
    CHECK(fd >= 0);
    (void)close(fd);
    char *a1[] = {"--no-such-flag"};
    CHECK_EQ(wait_exit(spawn(a1, 1, log)), 2);
    CHECK(file_contains(log, "unknown flag --no-such-flag"));
    char *a2[] = {"--threads", "0"};
    CHECK_EQ(wait_exit(spawn(a2, 2, log)), 2);
    char *a3[] = {"--listen", "256.1.1.1:bad"};
    CHECK_EQ(wait_exit(spawn(a3, 2, log)), 2);
    CHECK(file_contains(log, "port 'bad' is not a number in 0..65535"));
    char *a4[] = {"--listen", "localhost:99999"}; /* gRPC would bind another port */
    CHECK_EQ(wait_exit(spawn(a4, 2, log)), 2);
    CHECK(file_contains(log, "port '99999' is not a number in 0..65535"));
    char *a5[] = {"--listen", "256.1.1.1:7000", "--insecure"}; /* well formed, not ours */
    CHECK_EQ(wait_exit(spawn(a5, 3, log)), 1);
    CHECK(remove(log) == 0);
}

FERRY_TEST_MAIN(T(serves_and_exits_cleanly_on_sigterm) T(bad_command_lines_exit_2))
