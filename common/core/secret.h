/* secret.h - small files a daemon reads at start: PEM certificates and keys, bearer
 * tokens. Both are read whole and bounded in size; a token file's value is its text
 * with surrounding whitespace removed, and may also be named by an environment
 * variable (the flag wins). Errors name the file (never the secret). */
#ifndef FERRY_CORE_SECRET_H
#define FERRY_CORE_SECRET_H

#include <stddef.h>

#include "ferry/status.h"

/* The whole file as a NUL-terminated string in *out (free() it); FERRY_ERR_IO naming
 * the file when it cannot be read, FERRY_ERR_RANGE over max_bytes, FERRY_ERR_FORMAT
 * for a NUL byte inside. */
ferry_status ferry_file_read_text(const char *path, size_t max_bytes, char **out);

/* A bearer token from `path`, or, with path NULL, from the file named by the
 * environment variable `env` (NULL or unset: *out = NULL, FERRY_OK). The token is
 * the file's text without surrounding whitespace: 16 to 4096 printable ASCII bytes
 * without spaces (FERRY_ERR_FORMAT otherwise). A file that others may read is
 * logged as a warning. Free with ferry_secret_free. */
ferry_status ferry_token_read(const char *path, const char *env, char **out);

/* Overwrites and frees a secret (NULL is fine). */
void ferry_secret_free(char *s);

#endif /* FERRY_CORE_SECRET_H */
