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

/* A token file's entries: either one token (the whole file, as ferry_token_read: one
 * entry named "trainer" with role "trainer") or a table, one identity per line,
 * "<name> <role> <token>" separated by spaces or tabs; blank lines and lines starting
 * with '#' are skipped. Names are 1..63 bytes of [A-Za-z0-9_.:@-], roles "reader",
 * "trainer" or "admin", tokens 16..4096 printable bytes; names and tokens unique.
 * path NULL: the file named by $env; neither: an empty table. Errors name the file and
 * line, never a token. */
typedef struct ferry_token_entry {
    char name[64];
    char role[16];
    char *token; /* in the table's own buffer */
} ferry_token_entry;
typedef struct ferry_token_table {
    ferry_token_entry *entries;
    int n;
    char *text; /* the file, holding the tokens */
    size_t text_len;
} ferry_token_table;
ferry_status ferry_token_table_read(const char *path, const char *env, ferry_token_table *out);
void ferry_token_table_free(ferry_token_table *t); /* overwrites the tokens */

/* Overwrites and frees a secret (NULL is fine). */
void ferry_secret_free(char *s);

#endif /* FERRY_CORE_SECRET_H */
