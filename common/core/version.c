/* version.c - the library's version at run time (include/ferry/version.h). */
#include "ferry/version.h"

const char *ferry_version(void) {
    return FERRY_VERSION;
}

int ferry_version_number(void) {
    return FERRY_VERSION_NUMBER;
}
