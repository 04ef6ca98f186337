/* resize.c - ferry-ctl resize: servers join or leave a running elastic job at a step
 * boundary. The coordinator holds the members after their next step; every old server
 * exports the job's modules (parameters and optimizer state, a checkpoint file of
 * that step, every section CRC-checked), they are cut for the new list here as
 * `ferry-ctl reshard` cuts files, every new server adopts its part, and the commit
 * lets the members go on against the new list (proto/ferry.proto, JobReshard). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/core/flags.h"
#include "common/core/log.h"
#include "common/dist/dist.h"
#include "ferry.pb-c.h"
#include "server/ctl/ctl.h"
#include "server/ps-impl.h"

#define RESIZE_MAX 64 /* servers in either list */

/* One Job request to server `server` of c; *reply initialised here (deinit it). */
static ferry_status job_on(ferry_cluster *c, int server, Ferry__V1__JobRequest *q, int deadline_ms,
                           ferry_rpc_msg *reply) {
    ferry_rpc_msg req;
    ferry_rpc_msg_init(&req);
    ferry_rpc_msg_init(reply);
    ferry_status st = ferry_rpc_msg_set_head(&req, &q->base);
    if (st == FERRY_OK)
        st = ferry__dist_fanout_deadline(c, FERRY_RPC_JOB, 1, &server, &req, 1, reply, deadline_ms);
    ferry_rpc_msg_deinit(&req);
    return st;
}

typedef struct resize {
    ferry_cluster *c; /* the old servers, then the new ones not among them */
    const char *job;
    int deadline_ms;
    double limit_s; /* each wait */
    char *from[RESIZE_MAX], *to[RESIZE_MAX];
    int k, k2;
    int to_at[RESIZE_MAX]; /* new server t is server to_at[t] of c */
    uint64_t step;
} resize;

static ferry_status reshard_on(resize *r, int server, Ferry__V1__JobReshard__Op op,
                               const uint8_t *data, size_t len, uint64_t bytes, double seconds,
                               ferry_rpc_msg *reply) {
    Ferry__V1__JobReshard m;
    ferry__v1__job_reshard__init(&m);
    m.op = op;
    m.step = r->step;
    if (op == FERRY__V1__JOB_RESHARD__OP__BEGIN || op == FERRY__V1__JOB_RESHARD__OP__COMMIT) {
        m.servers = r->to;
        m.n_servers = (size_t)r->k2;
    }
    m.data.data = (uint8_t *)(uintptr_t)data;
    m.data.len = len;
    m.bytes = bytes;
    m.seconds = seconds;
    Ferry__V1__JobRequest q;
    ferry__v1__job_request__init(&q);
    q.job = (char *)(uintptr_t)r->job;
    q.action_case = FERRY__V1__JOB_REQUEST__ACTION_RESHARD;
    q.reshard = &m;
    /* a module file may be large: its own deadline */
    int deadline = data != NULL || op == FERRY__V1__JOB_RESHARD__OP__EXPORT
                       ? (int)(r->limit_s * 1000.0)
                       : r->deadline_ms;
    return job_on(r->c, server, &q, deadline, reply);
}

/* Tells the coordinator the move is alive (its hold counts from now): before each
 * transfer, so that the sync timeout bounds one transfer, not the whole move. */
static void keep_alive(resize *r) {
    ferry_rpc_msg reply;
    (void)reshard_on(r, 0, FERRY__V1__JOB_RESHARD__OP__STATUS, NULL, 0, 0, 0.0, &reply);
    ferry_rpc_msg_deinit(&reply);
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits until the coordinator holds the members at a boundary: r->step, *members. */
static ferry_status wait_hold(resize *r, size_t *members) {
    double t0 = ferry_now();
    for (;;) {
        ferry_rpc_msg reply;
        ferry_status st =
            reshard_on(r, 0, FERRY__V1__JOB_RESHARD__OP__STATUS, NULL, 0, 0, 0.0, &reply);
        const Ferry__V1__JobReply *a = reply.head;
        int held = st == FERRY_OK && a->moving;
        if (held) {
            r->step = a->move_step;
            *members = a->n_members;
        }
        ferry_rpc_msg_deinit(&reply);
        if (st != FERRY_OK || held)
            return st;
        if (ferry_now() - t0 > r->limit_s)
            return ferry_errorf(FERRY_ERR_TIMEOUT,
                                "job '%s' reached no step boundary within %.0f s (is it "
                                "training?)",
                                r->job, r->limit_s);
        sleep_ms(20);
    }
}

/* Waits until every new server holds the job with its members' ranks joined. */
static ferry_status wait_joined(resize *r, size_t members) {
    double t0 = ferry_now();
    for (int t = 0; t < r->k2; t++) {
        for (;;) {
            ferry_rpc_msg reply;
            ferry_status st = reshard_on(r, r->to_at[t], FERRY__V1__JOB_RESHARD__OP__STATUS, NULL,
                                         0, 0, 0.0, &reply);
            uint32_t joined =
                st == FERRY_OK ? ((const Ferry__V1__JobReply *)reply.head)->joined : 0;
            ferry_rpc_msg_deinit(&reply);
            if (st != FERRY_OK && st != FERRY_ERR_NOT_FOUND)
                return st;
            if (joined >= members)
                break;
            if (ferry_now() - t0 > r->limit_s)
                return ferry_errorf(FERRY_ERR_TIMEOUT,
                                    "the members did not join job '%s' on %s within %.0f s "
                                    "(%u of %zu ranks there)",
                                    r->job, r->to[t], r->limit_s, joined, members);
            keep_alive(r);
            sleep_ms(20);
        }
    }
    return FERRY_OK;
}

static ferry_status write_file(const char *path, const uint8_t *data, size_t len) {
    FILE *f = fopen(path, "wb");
    int ok = f != NULL && fwrite(data, 1, len, f) == len;
    if (f != NULL)
        ok &= fclose(f) == 0;
    return ok ? FERRY_OK : ferry_errorf(FERRY_ERR_IO, "cannot write %s", path);
}

static ferry_status read_file(const char *path, uint8_t **data, size_t *len) {
    FILE *f = fopen(path, "rb");
    long end = -1;
    *data = NULL;
    if (f != NULL && fseek(f, 0, SEEK_END) == 0 && (end = ftell(f)) > 0 &&
        fseek(f, 0, SEEK_SET) == 0 && (*data = malloc((size_t)end)) != NULL &&
        fread(*data, 1, (size_t)end, f) == (size_t)end) {
        *len = (size_t)end;
        fclose(f);
        return FERRY_OK;
    }
    if (f != NULL)
        fclose(f);
    free(*data);
    *data = NULL;
    return ferry_errorf(FERRY_ERR_IO, "cannot read %s", path);
}

/* Every old server's modules of the step, into dir/s<i>.ckpt (a server still applying
 * the step answers BUSY for a moment). *bytes: their sizes. */
static ferry_status export_all(resize *r, const char *dir, char **paths, uint64_t *bytes) {
    double t0 = ferry_now();
    for (int s = 0; s < r->k; s++) {
        ferry_rpc_msg reply;
        ferry_status st;
        keep_alive(r);
        for (;;) {
            st = reshard_on(r, s, FERRY__V1__JOB_RESHARD__OP__EXPORT, NULL, 0, 0, 0.0, &reply);
            if (st != FERRY_ERR_BUSY || ferry_now() - t0 > r->limit_s)
                break;
            ferry_rpc_msg_deinit(&reply);
            sleep_ms(10);
        }
        const Ferry__V1__JobReply *a = reply.head;
        if (st == FERRY_OK) {
            (void)snprintf(paths[s], 4200, "%s/s%d.ckpt", dir, s);
            st = write_file(paths[s], a->checkpoint_data.data, a->checkpoint_data.len);
            *bytes += a->checkpoint_data.len;
        }
        ferry_rpc_msg_deinit(&reply);
        if (st != FERRY_OK)
            return ferry_errorf(st, "%s: export: %s", r->from[s], ferry_error_last());
    }
    return FERRY_OK;
}

/* The old servers' files cut for the new list, each adopted by its server (the
 * coordinator first); *adopted counts the servers that took theirs. */
static ferry_status cut_and_adopt(resize *r, const char *dir, char **paths, uint64_t *bytes,
                                  int *adopted) {
    ferry__ps_reshard_src *src = NULL;
    ferry_status st = ferry__ps_reshard_open((const char *const *)paths, r->k, &src);
    if (st == FERRY_OK && ferry__ps_reshard_step(src) != r->step)
        st = ferry_errorf(FERRY_ERR_FORMAT, "the servers exported step %llu, not %llu",
                          (unsigned long long)ferry__ps_reshard_step(src),
                          (unsigned long long)r->step);
    for (int t = 0; t < r->k2 && st == FERRY_OK; t++) {
        char name[32], path[4200];
        uint64_t n = 0;
        (void)snprintf(name, sizeof name, "t%d.ckpt", t);
        (void)snprintf(path, sizeof path, "%s/%s", dir, name);
        uint8_t *data = NULL;
        size_t len = 0;
        keep_alive(r);
        st = ferry__ps_reshard_write(src, r->k2, t, dir, name, &n);
        if (st == FERRY_OK)
            st = read_file(path, &data, &len);
        (void)unlink(path);
        ferry_rpc_msg reply;
        if (st == FERRY_OK) {
            st = reshard_on(r, r->to_at[t], FERRY__V1__JOB_RESHARD__OP__ADOPT, data, len, 0, 0.0,
                            &reply);
            ferry_rpc_msg_deinit(&reply);
            if (st != FERRY_OK)
                st = ferry_errorf(st, "%s: adopt: %s", r->to[t], ferry_error_last());
        }
        free(data);
        *adopted += st == FERRY_OK;
        *bytes += len;
    }
    ferry__ps_reshard_close(src);
    return st;
}

/* A server the job left (or, after a move called off, one it was to go to): the job
 * and its modules go there. s: an index of c. */
static void leave_behind(resize *r, int s) {
    Ferry__V1__JobDrop d;
    ferry__v1__job_drop__init(&d);
    Ferry__V1__JobRequest q;
    ferry__v1__job_request__init(&q);
    q.job = (char *)(uintptr_t)r->job;
    q.action_case = FERRY__V1__JOB_REQUEST__ACTION_DROP;
    q.drop = &d;
    ferry_rpc_msg reply;
    ferry_status st = job_on(r->c, s, &q, r->deadline_ms, &reply);
    if (st != FERRY_OK && st != FERRY_ERR_NOT_FOUND)
        FERRY_LOG_WARN("%s: dropping the job there: %s", ferry_cluster_target(r->c, s),
                       ferry_error_last());
    ferry_rpc_msg_deinit(&reply);
    char prefix[FERRY_RPC_NAME_MAX + 2];
    (void)snprintf(prefix, sizeof prefix, "%s/", r->job);
    st = ferry__dist_list_modules(r->c, s, prefix, &reply);
    const Ferry__V1__ListModulesReply *l = st == FERRY_OK ? reply.head : NULL;
    for (size_t i = 0; l != NULL && i < l->n_modules; i++) {
        const char *name = l->modules[i]->name;
        if (strchr(name + strlen(prefix), '/') != NULL) /* job "<job>/x"'s, not this one's */
            continue;
        if (ferry__dist_delete_module_on(r->c, s, name) != FERRY_OK)
            FERRY_LOG_WARN("%s: deleting %s: %s", ferry_cluster_target(r->c, s), name,
                           ferry_error_last());
    }
    ferry_rpc_msg_deinit(&reply);
}

static int split(char *list, char **out) {
    int n = 0;
    char *save = NULL;
    for (char *t = strtok_r(list, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        if (n == RESIZE_MAX)
            return -1;
        out[n++] = t;
    }
    return n;
}

int ferry__ctl_resize(const ferry_cluster_config *cc, const char *from, const char *to,
                      const char *job, double timeout_s) {
    resize r = {.job = job, .deadline_ms = cc->deadline_ms, .limit_s = timeout_s};
    char *a = strdup(from), *b = strdup(to);
    char *all = malloc(strlen(from) + strlen(to) + 2);
    if (a == NULL || b == NULL || all == NULL) {
        free(a);
        free(b);
        free(all);
        ferry_log_fatal("resize: out of memory");
        return FERRY_EXIT_RUNTIME;
    }
    r.k = split(a, r.from);
    r.k2 = split(b, r.to);
    const char *bad = r.k < 1 || r.k2 < 1 ? "--ps and --to each name 1..64 servers"
                      : strcmp(r.from[0], r.to[0]) != 0
                          ? "the first server of --ps is the job's coordinator, and stays first "
                            "in --to"
                          : NULL;
    /* c: the old servers in --ps order, then the new ones not among them. */
    (void)strcpy(all, from);
    int n = r.k;
    for (int t = 0; t < r.k2 && bad == NULL; t++) {
        r.to_at[t] = -1;
        for (int s = 0; s < r.k; s++)
            r.to_at[t] = strcmp(r.to[t], r.from[s]) == 0 ? s : r.to_at[t];
        for (int u = 0; u < t; u++)
            bad = strcmp(r.to[t], r.to[u]) == 0 ? "--to lists a server twice" : bad;
        if (r.to_at[t] < 0) {
            r.to_at[t] = n++;
            (void)strcat(all, ",");
            (void)strcat(all, r.to[t]);
        }
    }
    if (bad != NULL) {
        free(a);
        free(b);
        free(all);
        ferry_log_fatal("resize: %s", bad);
        return FERRY_EXIT_USAGE;
    }
    ferry_status st = ferry_ps_connect(all, cc, &r.c);
    free(all);
    if (st != FERRY_OK) {
        free(a);
        free(b);
        ferry_log_fatal("resize: connect: %s", ferry_error_last());
        return FERRY_EXIT_RUNTIME;
    }
    double t0 = ferry_now(), t_hold = 0.0, t_export = 0.0, t_adopt = 0.0;
    uint64_t exported = 0, cut = 0;
    int adopted = 0, begun = 0;
    size_t members = 0;
    char dir[4096] = "", *paths[RESIZE_MAX], pathbuf[RESIZE_MAX][4200];
    for (int s = 0; s < RESIZE_MAX; s++) {
        paths[s] = pathbuf[s];
        pathbuf[s][0] = '\0'; /* written: not yet */
    }
    ferry_rpc_msg reply;
    /* --ps must be where the job runs: after a move, the coordinator knows the list */
    st = reshard_on(&r, 0, FERRY__V1__JOB_RESHARD__OP__STATUS, NULL, 0, 0, 0.0, &reply);
    if (st == FERRY_OK) {
        const Ferry__V1__JobReply *now = reply.head;
        int same = now->n_servers == (size_t)r.k;
        for (size_t i = 0; same && i < now->n_servers; i++)
            same = strcmp(now->servers[i], r.from[i]) == 0;
        if (now->servers_epoch > 0 && !same)
            st = ferry_errorf(FERRY_ERR_INVALID,
                              "job '%s' runs on other servers than --ps says (ferry-ctl job %s "
                              "shows them): name them as its last move did",
                              job, job);
    }
    ferry_rpc_msg_deinit(&reply);
    if (st == FERRY_OK)
        st = reshard_on(&r, 0, FERRY__V1__JOB_RESHARD__OP__BEGIN, NULL, 0, 0, 0.0, &reply);
    ferry_rpc_msg_deinit(&reply);
    begun = st == FERRY_OK;
    if (st == FERRY_OK && (st = wait_hold(&r, &members)) == FERRY_OK) {
        t_hold = ferry_now();
        (void)printf("job %s: the members wait after step %llu; moving its servers %s -> %s\n", job,
                     (unsigned long long)r.step, from, to);
        (void)fflush(stdout);
        st = wait_joined(&r, members);
    }
    const char *tmp = getenv("TMPDIR");
    if (st == FERRY_OK &&
        (snprintf(dir, sizeof dir, "%s/ferry-resize.XXXXXX", tmp != NULL && tmp[0] ? tmp : "/tmp"),
         mkdtemp(dir) == NULL)) {
        st = ferry_errorf(FERRY_ERR_IO, "cannot make a directory in %s", dir);
        dir[0] = '\0';
    }
    double t1 = ferry_now();
    if (st == FERRY_OK)
        st = export_all(&r, dir, paths, &exported);
    t_export = ferry_now() - t1;
    t1 = ferry_now();
    if (st == FERRY_OK)
        st = cut_and_adopt(&r, dir, paths, &cut, &adopted);
    t_adopt = ferry_now() - t1;
    for (int s = 0; dir[0] != '\0' && s < r.k; s++) {
        if (paths[s][0] != '\0')
            (void)unlink(paths[s]);
    }
    if (dir[0] != '\0')
        (void)rmdir(dir);
    double seconds = ferry_now() - (t_hold > 0.0 ? t_hold : t0);
    int rc = 0;
    if (st == FERRY_OK) {
        st = reshard_on(&r, 0, FERRY__V1__JOB_RESHARD__OP__COMMIT, NULL, 0, exported + cut, seconds,
                        &reply);
        ferry_rpc_msg_deinit(&reply);
    }
    if (st == FERRY_OK) {
        for (int s = 0; s < r.k; s++) {
            int kept = 0;
            for (int t = 0; t < r.k2; t++)
                kept |= r.to_at[t] == s;
            if (!kept)
                leave_behind(&r, s);
        }
        (void)printf("job %s: servers %s from step %llu: %d -> %d servers, %.2f MiB exported and "
                     "%.2f MiB adopted in %.2f s (export %.2f s, cut and adopt %.2f s); the "
                     "members waited %.2f s\n",
                     job, to, (unsigned long long)r.step + 1, r.k, r.k2,
                     (double)exported / 1048576.0, (double)cut / 1048576.0, seconds, t_export,
                     t_adopt, ferry_now() - t_hold);
    } else {
        char why[1024];
        (void)snprintf(why, sizeof why, "%s", ferry_error_last());
        if (begun) { /* the coordinator calls it off (and fails the job if a server adopted) */
            ferry_status ab =
                reshard_on(&r, 0, FERRY__V1__JOB_RESHARD__OP__ABORT, NULL, 0, 0, 0.0, &reply);
            ferry_rpc_msg_deinit(&reply);
            /* the servers the job was to go to hold nothing of it (nothing adopted):
             * where the job is new (it applied no step there), it goes */
            for (int t = 0; ab == FERRY_OK && adopted == 0 && t < r.k2; t++) {
                ferry_rpc_msg st_reply;
                ferry_rpc_msg_init(&st_reply);
                if (r.to_at[t] < r.k ||
                    reshard_on(&r, r.to_at[t], FERRY__V1__JOB_RESHARD__OP__STATUS, NULL, 0, 0, 0.0,
                               &st_reply) != FERRY_OK) {
                    ferry_rpc_msg_deinit(&st_reply);
                    continue;
                }
                int fresh = ((const Ferry__V1__JobReply *)st_reply.head)->applied == 0;
                ferry_rpc_msg_deinit(&st_reply);
                if (fresh)
                    leave_behind(&r, r.to_at[t]);
            }
            ferry_log_fatal("resize: %s; %s", why,
                            adopted > 0 ? "servers had taken their rows: the job fails"
                            : ab == FERRY_OK
                                ? "the move is called off, the job goes on where it was"
                                : "and calling the move off failed too");
        } else {
            ferry_log_fatal("resize: %s", why);
        }
        rc = FERRY_EXIT_RUNTIME;
    }
    ferry_cluster_destroy(r.c);
    free(a);
    free(b);
    return rc;
}

void ferry__ctl_print_servers(ferry_cluster *c, const char *job) {
    resize r = {.c = c, .job = job, .deadline_ms = 5000, .limit_s = 5.0};
    ferry_rpc_msg reply;
    if (reshard_on(&r, 0, FERRY__V1__JOB_RESHARD__OP__STATUS, NULL, 0, 0, 0.0, &reply) ==
        FERRY_OK) {
        const Ferry__V1__JobReply *a = reply.head;
        char list[RESIZE_MAX * 80] = "";
        size_t k = 0;
        for (size_t i = 0; i < a->n_servers && k + 1 < sizeof list; i++) {
            int w = snprintf(list + k, sizeof list - k, "%s%s", i ? "," : "", a->servers[i]);
            k = w < 0 || (size_t)w >= sizeof list - k ? sizeof list : k + (size_t)w;
        }
        if (a->moving)
            (void)printf("servers: moving to %s after step %llu\n", list,
                         (unsigned long long)a->move_step);
        else if (a->servers_epoch > 0)
            (void)printf("servers: %s (after %llu moves)\n", list,
                         (unsigned long long)a->servers_epoch);
    }
    ferry_rpc_msg_deinit(&reply);
}
