/* sched.h - the RPC server's fair work queue: items (calls) queued per key (the
 * caller's identity), run by a pool of worker threads that take the keys in turn and
 * let no key hold more than its share of the workers while others wait
 * (common/rpc/sched.c). Internal to common/rpc. */
#ifndef FERRY_RPC_SCHED_H
#define FERRY_RPC_SCHED_H

#include <stdint.h>

#include "common/rpc/rpc.h"

typedef void (*ferry__rpc_sched_fn)(void *user, void *item);

typedef struct ferry__rpc_sched_config {
    int workers;        /* threads running items, 1..256 */
    int per_key;        /* most items of one key running at once; 0: a fair share of the
                           workers among the keys with work now or within the last
                           0.25 s (all of them while only one key has) */
    int max_queued;     /* items waiting, all keys (0: 4096); more are refused */
    int max_queued_key; /* items waiting for one key (0: 1024) */
    ferry__rpc_sched_fn run;
    void *user;
} ferry__rpc_sched_config;

typedef struct ferry__rpc_sched ferry__rpc_sched;

typedef struct ferry__rpc_sched_stats_t {
    int queued, running, workers;
    uint64_t served, refused;
    double wait_max_s, wait_mean_s; /* time items waited in the queue */
} ferry__rpc_sched_stats_t;

enum {
    FERRY__RPC_SCHED_QUEUED = 0,  /* a worker will run it */
    FERRY__RPC_SCHED_FULL = -1,   /* refused: the queue (or the key's) is full */
    FERRY__RPC_SCHED_STOPPED = -2 /* the workers are gone: the caller runs it itself */
};

ferry_status ferry__rpc_sched_create(const ferry__rpc_sched_config *cfg, ferry__rpc_sched **out);
/* Queues item under key (FERRY__RPC_SCHED_*). Thread-safe. */
int ferry__rpc_sched_push(ferry__rpc_sched *s, const char *key, void *item);
void ferry__rpc_sched_stats(ferry__rpc_sched *s, ferry__rpc_sched_stats_t *out);
/* Lets the workers run what is queued, then stops them; later pushes get
 * FERRY__RPC_SCHED_STOPPED. NULL is a no-op. */
void ferry__rpc_sched_stop(ferry__rpc_sched *s);
/* Stops (if not yet) and frees. No push may follow. NULL is a no-op. */
void ferry__rpc_sched_destroy(ferry__rpc_sched *s);

#endif /* FERRY_RPC_SCHED_H */
