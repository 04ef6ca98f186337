/* version.h - the version of the ferry headers a program is compiled against, and of
 * the library it runs with. CMakeLists.txt reads the project version from the three
 * numbers below: change them here. A program can check that the two agree:
 *
 *     if (ferry_version_number() / 100 != FERRY_VERSION_NUMBER / 100)  // major.minor
 *         fprintf(stderr, "built for ferry %s, running %s\n", FERRY_VERSION, ferry_version());
 */
#ifndef FERRY_VERSION_H
#define FERRY_VERSION_H

#include "ferry/export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_VERSION_MAJOR 0
#define FERRY_VERSION_MINOR 2
#define FERRY_VERSION_PATCH 0

#define FERRY_VERSION_STR_(x) #x
#define FERRY_VERSION_STR(x)  FERRY_VERSION_STR_(x)
/* "0.2.0" */
#define FERRY_VERSION                                                                              \
    FERRY_VERSION_STR(FERRY_VERSION_MAJOR)                                                         \
    "." FERRY_VERSION_STR(FERRY_VERSION_MINOR) "." FERRY_VERSION_STR(FERRY_VERSION_PATCH)
/* major * 10000 + minor * 100 + patch: 200 for 0.2.0 */
#define FERRY_VERSION_NUMBER                                                                       \
    (FERRY_VERSION_MAJOR * 10000 + FERRY_VERSION_MINOR * 100 + FERRY_VERSION_PATCH)

/* The library's version at run time ("0.2.0") and as FERRY_VERSION_NUMBER. */
FERRY_API const char *ferry_version(void);
FERRY_API int ferry_version_number(void);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_VERSION_H */
