/* ctl.h - ferry-ctl's commands that live in files of their own. */
#ifndef FERRY_CTL_H
#define FERRY_CTL_H

#include "ferry/ferry.h"

/* ferry-ctl reshard (reshard.c): the exit code. */
int ferry__ctl_reshard(const char *into, int nfiles, char **files);

/* ferry-ctl --ps FROM --to TO resize JOB (resize.c): elastic job JOB's servers move
 * from the list FROM to TO at its next step boundary, each wait at most timeout_s;
 * the exit code. */
int ferry__ctl_resize(const ferry_cluster_config *cc, const char *from, const char *to,
                      const char *job, double timeout_s);
/* ferry-ctl job JOB: a line for an elastic job whose servers moved or are moving, as
 * its coordinator (server 0 of c) says; nothing otherwise. */
void ferry__ctl_print_servers(ferry_cluster *c, const char *job);

#endif
