/* ferry_stats.c - prints one ferry-ps's Stats counters as "name value" lines, for
 * the shell tests (they read each rank's step from the servers):
 *     ferry_stats HOST:PORT [PREFIX]
 * with the token of $FERRY_TOKEN_FILE if set. */
#include <stdio.h>

#include "common/core/secret.h"
#include "ferry/ferry.h"

static void print_metric(void *user, const char *name, double value) {
    (void)user;
    printf("%s %.17g\n", name, value);
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: ferry_stats HOST:PORT [PREFIX]\n");
        return 2;
    }
    ferry_cluster_config cc;
    ferry_cluster_config_default(&cc);
    cc.deadline_ms = 5000;
    char *token = NULL;
    ferry_cluster *c;
    ferry_status st = ferry_token_read(NULL, "FERRY_TOKEN_FILE", &token);
    cc.token = token;
    if (st == FERRY_OK)
        st = ferry_ps_connect(argv[1], &cc, &c);
    ferry_secret_free(token);
    if (st == FERRY_OK)
        st = ferry_cluster_metrics(c, 0, argc == 3 ? argv[2] : "", print_metric, NULL);
    if (st != FERRY_OK) {
        fprintf(stderr, "ferry_stats: %s\n", ferry_error_last());
        return 1;
    }
    ferry_cluster_destroy(c);
    return 0;
}
