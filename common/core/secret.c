/* secret.c - reading certificates, keys and tokens (see secret.h). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/core/log.h"
#include "common/core/secret.h"

ferry_status ferry_file_read_text(const char *path, size_t max_bytes, char **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return ferry_errorf(FERRY_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    char *buf = malloc(max_bytes + 1);
    if (buf == NULL) {
        fclose(f);
        return FERRY_ERR_NOMEM;
    }
    size_t n = fread(buf, 1, max_bytes + 1, f);
    int err = ferror(f);
    fclose(f);
    ferry_status st = FERRY_OK;
    if (err)
        st = ferry_errorf(FERRY_ERR_IO, "cannot read %s", path);
    else if (n > max_bytes)
        st = ferry_errorf(FERRY_ERR_RANGE, "%s is larger than %zu bytes", path, max_bytes);
    else if (memchr(buf, '\0', n) != NULL)
        st = ferry_errorf(FERRY_ERR_FORMAT, "%s holds a NUL byte: not a text file", path);
    if (st != FERRY_OK) {
        memset(buf, 0, n < max_bytes + 1 ? n : max_bytes + 1);
        free(buf);
        return st;
    }
    buf[n] = '\0';
    *out = buf;
    return FERRY_OK;
}

ferry_status ferry_token_read(const char *path, const char *env, char **out) {
    *out = NULL;
    const char *from = path != NULL ? "file" : env;
    if (path == NULL && env != NULL)
        path = getenv(env);
    if (path == NULL || path[0] == '\0')
        return FERRY_OK;
    char *text;
    ferry_status st = ferry_file_read_text(path, 8192, &text);
    if (st != FERRY_OK)
        return st;
    char *b = text, *e = text + strlen(text);
    while (b < e && isspace((unsigned char)*b))
        b++;
    while (e > b && isspace((unsigned char)e[-1]))
        e--;
    size_t n = (size_t)(e - b);
    for (const char *p = b; p < e && st == FERRY_OK; p++) {
        if (!isgraph((unsigned char)*p))
            st = ferry_errorf(FERRY_ERR_FORMAT,
                              "token file %s%s%s: the token has a space or a non-ASCII byte", path,
                              from != NULL && strcmp(from, "file") != 0 ? " (from $" : "",
                              from != NULL && strcmp(from, "file") != 0 ? from : "");
    }
    if (st == FERRY_OK && (n < 16 || n > 4096))
        st = ferry_errorf(FERRY_ERR_FORMAT, "token file %s: the token has %zu bytes; use 16 to 4096 "
                                            "(e.g. openssl rand -hex 32)", path, n);
    if (st == FERRY_OK) {
        memmove(text, b, n);
        memset(text + n, 0, strlen(text + n));
        struct stat sb;
        if (stat(path, &sb) == 0 && (sb.st_mode & 077) != 0)
            FERRY_LOG_WARN("token file %s can be read by other users (mode %03o): chmod 600 it",
                           path, (unsigned)(sb.st_mode & 0777));
        *out = text;
        return FERRY_OK;
    }
    ferry_secret_free(text);
    return st;
}

void ferry_secret_free(char *s) {
    if (s == NULL)
        return;
    explicit_bzero(s, strlen(s));
    free(s);
}
