/* quota.c - what each identity holds on a ferry-ps: its live contexts and their bytes,
 * its modules and their bytes, its jobs. Each is charged before it is allocated
 * against the identity's share of the server's budgets (--max-contexts-per-identity
 * and the like), so that one client, however many sessions it opens, cannot take the
 * whole server from the others. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/ps-impl.h"

#define MIB (1024.0 * 1024.0)

void ferry__ps_quotas_init(ferry__ps_quotas *Q) {
    memset(Q, 0, sizeof *Q);
    pthread_mutex_init(&Q->mu, NULL);
}

void ferry__ps_quotas_deinit(ferry__ps_quotas *Q) {
    for (int i = 0; i < Q->n; i++)
        free(Q->q[i]);
    free(Q->q);
    pthread_mutex_destroy(&Q->mu);
    memset(Q, 0, sizeof *Q);
}

ferry__ps_quota *ferry__ps_quota_of(ferry__ps_quotas *Q, const char *identity) {
    pthread_mutex_lock(&Q->mu);
    ferry__ps_quota *e = NULL;
    for (int i = 0; i < Q->n && e == NULL; i++)
        if (strcmp(Q->q[i]->identity, identity) == 0)
            e = Q->q[i];
    if (e == NULL && Q->n == Q->cap) {
        int cap = Q->cap ? 2 * Q->cap : 16;
        ferry__ps_quota **q = realloc(Q->q, (size_t)cap * sizeof *q);
        if (q != NULL)
            Q->q = q, Q->cap = cap;
    }
    if (e == NULL && Q->n < Q->cap && (e = calloc(1, sizeof *e)) != NULL) {
        (void)snprintf(e->identity, sizeof e->identity, "%s", identity);
        Q->q[Q->n++] = e;
    }
    pthread_mutex_unlock(&Q->mu);
    return e;
}

ferry_status ferry__ps_quota_take(atomic_llong *held, int64_t limit, const char *what,
                                  const char *identity, const char *flag) {
    long long n = atomic_fetch_add(held, 1);
    if (n < limit)
        return FERRY_OK;
    atomic_fetch_sub(held, 1);
    return ferry_errorf(FERRY_ERR_RESOURCE,
                        "identity '%s' holds %lld %s, its most (%s): free some first", identity, n,
                        what, flag);
}

ferry_status ferry__ps_quota_charge(atomic_llong *held, int64_t bytes, int64_t limit,
                                    const char *what, const char *identity, const char *flag) {
    if (bytes <= 0)
        return FERRY_OK;
    long long used = atomic_fetch_add(held, bytes);
    if (used + bytes <= limit && used + bytes >= used)
        return FERRY_OK;
    atomic_fetch_sub(held, bytes);
    return ferry_errorf(FERRY_ERR_RESOURCE,
                        "%s needs %.1f MiB, over identity '%s''s share (%.1f MiB, %.1f MiB in "
                        "use; %s)",
                        what, (double)bytes / MIB, identity, (double)limit / MIB,
                        (double)used / MIB, flag);
}
