/* sched.c - the fair work queue of the RPC server (sched.h). Calls that do real work
 * queue here per identity instead of running on the threads that poll gRPC, so those
 * stay free for the cheap calls (health, Hello, Stats) however busy the workers are.
 * Workers take the identities in turn (round robin over the keys with work), and while
 * several identities have work none may run more than its share of the workers: a
 * client that floods the server with expensive calls delays another identity's call by
 * at most the call already running, never by its whole backlog.
 *
 * Locking: one mutex guards every queue; the run callback is called without it. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/core/log.h"
#include "common/rpc/sched.h"

typedef struct sched_item {
    void *item;
    double queued_at;
    struct sched_item *next;
} sched_item;

typedef struct sched_key {
    char key[FERRY_RPC_IDENTITY_MAX];
    sched_item *head, *tail;
    int queued, running;
    double last_done; /* when its last item finished */
} sched_key;

/* A key stays active this long after its last item finished: a client that sends its
 * calls one after another (Forward, Backward, Step) keeps its share of the workers
 * between them instead of finding them all taken by a flood at each call. */
#define LINGER_S 0.25

struct ferry__rpc_sched {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ferry__rpc_sched_fn run;
    void *user;
    int workers, per_key, max_queued, max_queued_key;
    pthread_t *threads;
    int nthreads;
    sched_key *keys;
    int nkeys, capkeys, rr;
    int queued, running;
    int stopping, stopped;
    /* counters */
    uint64_t served, refused;
    double wait_max_s, wait_sum_s;
};

static int key_active(const sched_key *k, double now) {
    return k->queued > 0 || k->running > 0 || now - k->last_done < LINGER_S;
}

/* The key's queue, made on first use; NULL when out of memory. Lock held. */
static sched_key *key_get(ferry__rpc_sched *s, const char *key) {
    for (int i = 0; i < s->nkeys; i++)
        if (strcmp(s->keys[i].key, key) == 0)
            return &s->keys[i];
    /* Reuse an idle key's slot before growing: the number of slots stays that of the
     * identities with work at one time. */
    double now = ferry_now();
    for (int i = 0; i < s->nkeys; i++) {
        sched_key *k = &s->keys[i];
        if (!key_active(k, now)) {
            memset(k, 0, sizeof *k);
            (void)snprintf(k->key, sizeof k->key, "%s", key);
            return k;
        }
    }
    if (s->nkeys == s->capkeys) {
        int cap = s->capkeys ? 2 * s->capkeys : 16;
        sched_key *keys = realloc(s->keys, (size_t)cap * sizeof *keys);
        if (keys == NULL)
            return NULL;
        s->keys = keys;
        s->capkeys = cap;
    }
    sched_key *k = &s->keys[s->nkeys++];
    memset(k, 0, sizeof *k);
    (void)snprintf(k->key, sizeof k->key, "%s", key);
    return k;
}

/* How many workers one key may hold now: its share while others have work too. */
static int key_limit(const ferry__rpc_sched *s) {
    if (s->per_key > 0)
        return s->per_key;
    double now = ferry_now();
    int active = 0;
    for (int i = 0; i < s->nkeys; i++)
        active += key_active(&s->keys[i], now);
    if (active <= 1)
        return s->workers;
    return (s->workers + active - 1) / active;
}

/* The next key to serve, round robin from the cursor; NULL when none may run. */
static sched_key *key_next(ferry__rpc_sched *s) {
    int lim = key_limit(s);
    for (int n = 0; n < s->nkeys; n++) {
        int i = (s->rr + n) % s->nkeys;
        sched_key *k = &s->keys[i];
        if (k->queued > 0 && k->running < lim) {
            s->rr = (i + 1) % s->nkeys;
            return k;
        }
    }
    return NULL;
}

static void *worker_main(void *arg) {
    ferry__rpc_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        sched_key *k = key_next(s);
        if (k == NULL) {
            if (s->stopping && s->queued == 0)
                break;
            if (s->queued > 0) { /* held back by a share: shares change as keys linger out */
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += (long)(LINGER_S * 0.2e9);
                ts.tv_sec += ts.tv_nsec / 1000000000L;
                ts.tv_nsec %= 1000000000L;
                (void)pthread_cond_timedwait(&s->cv, &s->mu, &ts);
            } else {
                pthread_cond_wait(&s->cv, &s->mu);
            }
            continue;
        }
        sched_item *it = k->head;
        k->head = it->next;
        if (k->head == NULL)
            k->tail = NULL;
        k->queued--;
        s->queued--;
        k->running++;
        s->running++;
        double waited = ferry_now() - it->queued_at;
        s->wait_sum_s += waited;
        s->wait_max_s = waited > s->wait_max_s ? waited : s->wait_max_s;
        s->served++;
        char key[FERRY_RPC_IDENTITY_MAX];
        memcpy(key, k->key, sizeof key); /* k may move when another key is added */
        pthread_mutex_unlock(&s->mu);
        s->run(s->user, it->item);
        free(it);
        pthread_mutex_lock(&s->mu);
        sched_key *done = key_get(s, key);
        if (done != NULL) {
            done->running--;
            done->last_done = ferry_now();
        }
        s->running--;
        pthread_cond_broadcast(&s->cv); /* a slot of the key's share is free again */
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

ferry_status ferry__rpc_sched_create(const ferry__rpc_sched_config *cfg, ferry__rpc_sched **out) {
    if (cfg->workers < 1 || cfg->workers > 256 || cfg->per_key < 0 || cfg->run == NULL)
        return ferry_errorf(FERRY_ERR_INVALID, "rpc scheduler: %d workers, per-key limit %d",
                            cfg->workers, cfg->per_key);
    ferry__rpc_sched *s = calloc(1, sizeof *s);
    if (s == NULL || (s->threads = calloc((size_t)cfg->workers, sizeof *s->threads)) == NULL) {
        free(s);
        return FERRY_NOMEM();
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->run = cfg->run;
    s->user = cfg->user;
    s->workers = cfg->workers;
    s->per_key = cfg->per_key;
    s->max_queued = cfg->max_queued > 0 ? cfg->max_queued : 4096;
    s->max_queued_key = cfg->max_queued_key > 0 ? cfg->max_queued_key : 1024;
    for (; s->nthreads < s->workers; s->nthreads++) {
        if (pthread_create(&s->threads[s->nthreads], NULL, worker_main, s) != 0) {
            ferry__rpc_sched_destroy(s);
            return ferry_errorf(FERRY_ERR_NOMEM, "rpc scheduler: cannot start a worker");
        }
    }
    *out = s;
    return FERRY_OK;
}

int ferry__rpc_sched_push(ferry__rpc_sched *s, const char *key, void *item) {
    sched_item *it = malloc(sizeof *it);
    if (it == NULL)
        return FERRY__RPC_SCHED_FULL;
    it->item = item;
    it->queued_at = ferry_now();
    it->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->stopped) {
        pthread_mutex_unlock(&s->mu);
        free(it);
        return FERRY__RPC_SCHED_STOPPED;
    }
    sched_key *k = s->queued < s->max_queued ? key_get(s, key) : NULL;
    if (k == NULL || k->queued >= s->max_queued_key) {
        s->refused++;
        pthread_mutex_unlock(&s->mu);
        free(it);
        return FERRY__RPC_SCHED_FULL;
    }
    if (k->tail != NULL)
        k->tail->next = it;
    else
        k->head = it;
    k->tail = it;
    k->queued++;
    s->queued++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return FERRY__RPC_SCHED_QUEUED;
}

void ferry__rpc_sched_stats(ferry__rpc_sched *s, ferry__rpc_sched_stats_t *out) {
    pthread_mutex_lock(&s->mu);
    out->queued = s->queued;
    out->running = s->running;
    out->workers = s->workers;
    out->served = s->served;
    out->refused = s->refused;
    out->wait_max_s = s->wait_max_s;
    out->wait_mean_s = s->served > 0 ? s->wait_sum_s / (double)s->served : 0.0;
    pthread_mutex_unlock(&s->mu);
}

void ferry__rpc_sched_stop(ferry__rpc_sched *s) {
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1; /* workers drain the queue, then leave */
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->nthreads; i++)
        pthread_join(s->threads[i], NULL);
    s->nthreads = 0;
    pthread_mutex_lock(&s->mu);
    s->stopped = 1; /* later pushes are told to run in place (FERRY__RPC_SCHED_STOPPED) */
    pthread_mutex_unlock(&s->mu);
}

void ferry__rpc_sched_destroy(ferry__rpc_sched *s) {
    if (s == NULL)
        return;
    ferry__rpc_sched_stop(s);
    /* Nothing is queued: the workers drained it, and pushes since were refused. */
    free(s->keys);
    free(s->threads);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
