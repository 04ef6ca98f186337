/* ctl.h - ferry-ctl's commands that live in files of their own. */
#ifndef FERRY_CTL_H
#define FERRY_CTL_H

/* ferry-ctl reshard (reshard.c): the exit code. */
int ferry__ctl_reshard(const char *into, int nfiles, char **files);

#endif
