/* reshard.c - ferry-ctl reshard: a job's checkpoint of one step, written by k
 * ferry-ps, cut again for another number of servers, offline (no server is called):
 *
 *   ferry-ctl reshard --into DIR[,DIR...] FILE...
 *
 * FILEs are the job's server files of one step (<job>-step<N>.ckpt), one per server,
 * in the order of the trainers' --ps; each DIR is a new server's --checkpoint-dir, in
 * the order of the new --ps, and receives its own file of the same name. The job then
 * resumes on the new servers with its ranks' --load as it would on the old ones
 * (server/reshard.c has the rules). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/core/flags.h"
#include "common/core/log.h"
#include "server/ctl/ctl.h"
#include "server/ps-impl.h"

#define MAX_SERVERS 1024
#define RESHARD_PATH_MAX 4096

/* "a,b,c" -> up to max pointers into a copy (*copy: free it); the count, or -1. */
static int split(const char *list, char **copy, char **out, int max) {
    *copy = strdup(list);
    if (*copy == NULL)
        return -1;
    int n = 0;
    for (char *save = NULL, *p = strtok_r(*copy, ",", &save); p != NULL;
         p = strtok_r(NULL, ",", &save)) {
        if (n == max)
            return -1;
        out[n++] = p;
    }
    return n;
}

int ferry__ctl_reshard(const char *into, int nfiles, char **files) {
    static char *dirs[MAX_SERVERS];
    char *copy = NULL;
    int k2 = into != NULL ? split(into, &copy, dirs, MAX_SERVERS) : 0;
    if (k2 <= 0 || nfiles < 1 || nfiles > MAX_SERVERS) {
        free(copy);
        ferry_log_fatal("reshard: want --into DIR[,DIR...] (one per new server, 1..%d) and the "
                        "job's server files of one step, in server order",
                        MAX_SERVERS);
        return FERRY_EXIT_USAGE;
    }
    /* Each new server's directory once; none of them the home of a source file (a
     * failure part way would leave that file replaced). */
    int bad = strstr(into, ",,") != NULL || into[0] == ',' || into[strlen(into) - 1] == ',';
    for (int t = 0; t < k2 && !bad; t++) {
        struct stat a, b;
        if (stat(dirs[t], &a) != 0 || !S_ISDIR(a.st_mode)) {
            ferry_log_fatal("reshard: --into %s is not a directory", dirs[t]);
            free(copy);
            return FERRY_EXIT_USAGE;
        }
        for (int u = 0; u < t && !bad; u++)
            bad = stat(dirs[u], &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
        for (int s = 0; s < nfiles && !bad; s++) {
            char *dup = strdup(files[s]);
            char *slash = dup != NULL ? strrchr(dup, '/') : NULL;
            if (slash != NULL)
                *slash = '\0';
            const char *home = dup == NULL ? "." : slash != NULL ? (dup[0] ? dup : "/") : ".";
            bad = stat(home, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
            free(dup);
            if (bad) {
                ferry_log_fatal("reshard: --into %s holds the source %s: write the new "
                                "servers' files into other directories",
                                dirs[t], files[s]);
                free(copy);
                return FERRY_EXIT_USAGE;
            }
        }
    }
    if (bad) {
        free(copy);
        ferry_log_fatal("reshard: --into %s lists a directory twice or an empty one", into);
        return FERRY_EXIT_USAGE;
    }
    const char *base = strrchr(files[0], '/');
    base = base != NULL ? base + 1 : files[0];
    for (int s = 1; s < nfiles; s++) {
        const char *b = strrchr(files[s], '/');
        if (strcmp(b != NULL ? b + 1 : files[s], base) != 0) {
            free(copy);
            ferry_log_fatal("reshard: %s and %s are not the same step's files of one job", files[0],
                            files[s]);
            return FERRY_EXIT_USAGE;
        }
    }
    /* What a rename into place would refuse, before anything is read or written. */
    for (int t = 0; t < k2; t++) {
        char to[RESHARD_PATH_MAX];
        struct stat sb;
        int len = snprintf(to, sizeof to, "%s/%s", dirs[t], base);
        if (len >= (int)sizeof to || (lstat(to, &sb) == 0 && !S_ISREG(sb.st_mode))) {
            ferry_log_fatal("reshard: %s %s", to,
                            len >= (int)sizeof to ? "is too long a path"
                                                  : "exists and is not a file");
            free(copy);
            return FERRY_EXIT_USAGE;
        }
    }
    double t0 = ferry_now();
    ferry__ps_reshard_src *src = NULL;
    ferry_status st = ferry__ps_reshard_open((const char *const *)files, nfiles, &src);
    /* Every new file is written whole under a temporary name first, and renamed into
     * place only once all of them are: a failure part way (no room on the third
     * server's disk) leaves no new server with a file of the step and the others
     * without one. The temporary name starts with a dot, so a ferry-ps never takes it
     * for a checkpoint (a kill between the writes and the renames leaves it for its
     * start-up sweep of temporary files). */
    char part[RESHARD_PATH_MAX];
    int written = 0;
    (void)snprintf(part, sizeof part, ".%s.reshard-part", base);
    uint64_t total = 0;
    for (int t = 0; t < k2 && st == FERRY_OK; t++) {
        uint64_t bytes = 0;
        st = ferry__ps_reshard_write(src, k2, t, dirs[t], part, &bytes);
        written += st == FERRY_OK;
        total += bytes;
    }
    for (int t = 0; t < written; t++) {
        char from[RESHARD_PATH_MAX], to[RESHARD_PATH_MAX];
        if (snprintf(from, sizeof from, "%s/%s", dirs[t], part) >= (int)sizeof from ||
            snprintf(to, sizeof to, "%s/%s", dirs[t], base) >= (int)sizeof to) {
            st = ferry_errorf(FERRY_ERR_INVALID, "--into %s: path too long", dirs[t]);
            from[0] = '\0';
        }
        if (st != FERRY_OK) {
            (void)unlink(from);
        } else if (rename(from, to) != 0) {
            /* Within one directory, after the check above, only a failing file system
             * gets here; the servers' files already renamed stay. */
            st = ferry_errorf(FERRY_ERR_IO, "rename %s to %s: %s", from, to, strerror(errno));
            for (int u = t; u < written; u++) /* the ones not yet in place */
                if (snprintf(from, sizeof from, "%s/%s", dirs[u], part) < (int)sizeof from)
                    (void)unlink(from);
            break;
        } else {
            struct stat sb;
            int dfd = open(dirs[t], O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* the rename, durable */
            if (dfd < 0 || fsync(dfd) != 0)
                st = ferry_errorf(FERRY_ERR_IO, "fsync %s: %s", dirs[t], strerror(errno));
            if (dfd >= 0)
                (void)close(dfd);
            (void)printf("server %d of %d: %s (%.2f MB)\n", t + 1, k2, to,
                         stat(to, &sb) == 0 ? (double)sb.st_size / 1e6 : 0.0);
        }
    }
    if (st == FERRY_OK)
        (void)printf("step %llu of %d servers cut for %d: %.2f MB read, %.2f MB written in "
                     "%.2f s\n",
                     (unsigned long long)ferry__ps_reshard_step(src), nfiles, k2,
                     (double)ferry__ps_reshard_bytes(src) / 1e6, (double)total / 1e6,
                     ferry_now() - t0);
    ferry__ps_reshard_close(src);
    free(copy);
    if (st != FERRY_OK) {
        ferry_log_fatal("reshard: %s", ferry_error_last());
        return FERRY_EXIT_RUNTIME;
    }
    return 0;
}
