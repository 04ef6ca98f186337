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
        return FERRY_NOMEM();
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

/* One field of a table line: [p, end) without blanks, advanced past it. */
static char *next_field(char **p) {
    char *s = *p;
    while (*s == ' ' || *s == '\t')
        s++;
    if (*s == '\0')
        return NULL;
    char *b = s;
    while (*s != '\0' && *s != ' ' && *s != '\t')
        s++;
    if (*s != '\0')
        *s++ = '\0';
    *p = s;
    return b;
}

static int name_ok(const char *s) {
    size_t n = strlen(s);
    return n > 0 && n < 64 &&
           strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:@-") == n;
}

ferry_status ferry_token_table_read(const char *path, const char *env, ferry_token_table *out) {
    memset(out, 0, sizeof *out);
    if (path == NULL && env != NULL)
        path = getenv(env);
    if (path == NULL || path[0] == '\0')
        return FERRY_OK;
    char *text;
    ferry_status st = ferry_file_read_text(path, 1 << 20, &text);
    if (st != FERRY_OK)
        return st;
    out->text = text;
    out->text_len = strlen(text);
    /* A single token: one field on the only line that is not blank or a comment. */
    int lines = 0, fields1 = 1;
    for (char *p = text; *p != '\0';) {
        char *eol = strchr(p, '\n');
        size_t len = eol != NULL ? (size_t)(eol - p) : strlen(p);
        size_t b = strspn(p, " \t\r");
        if (b < len && p[b] != '#') {
            lines++;
            for (size_t i = b; i < len; i++)
                if ((p[i] == ' ' || p[i] == '\t') && i + 1 < len && p[i + 1] != ' ' &&
                    p[i + 1] != '\t' && p[i + 1] != '\r')
                    fields1 = 0;
        }
        p += len + (eol != NULL);
    }
    if (lines == 1 && fields1) {
        out->text = NULL;
        ferry_secret_free(text);
        char *tok;
        if ((st = ferry_token_read(path, NULL, &tok)) != FERRY_OK)
            return st;
        if ((out->entries = calloc(1, sizeof *out->entries)) == NULL) {
            ferry_secret_free(tok);
            return FERRY_NOMEM();
        }
        out->text = tok;
        out->text_len = strlen(tok);
        out->n = 1;
        (void)snprintf(out->entries[0].name, sizeof out->entries[0].name, "trainer");
        (void)snprintf(out->entries[0].role, sizeof out->entries[0].role, "trainer");
        out->entries[0].token = tok;
        return FERRY_OK;
    }
    if ((out->entries = calloc((size_t)(lines > 0 ? lines : 1), sizeof *out->entries)) == NULL) {
        ferry_token_table_free(out);
        return FERRY_NOMEM();
    }
    int lineno = 0;
    for (char *p = text; *p != '\0' && st == FERRY_OK;) {
        lineno++;
        char *eol = strchr(p, '\n');
        if (eol != NULL)
            *eol = '\0';
        char *next = eol != NULL ? eol + 1 : p + strlen(p);
        for (char *c = p; *c != '\0'; c++) /* \r\n files */
            if (*c == '\r')
                *c = ' ';
        char *cur = p;
        char *name = next_field(&cur);
        if (name == NULL || name[0] == '#') {
            p = next;
            continue;
        }
        char *role = next_field(&cur), *tok = next_field(&cur), *extra = next_field(&cur);
        size_t tl = tok != NULL ? strlen(tok) : 0;
        int ok = role != NULL && tok != NULL && extra == NULL && name_ok(name) &&
                 (strcmp(role, "reader") == 0 || strcmp(role, "trainer") == 0 ||
                  strcmp(role, "admin") == 0) &&
                 tl >= 16 && tl <= 4096;
        for (size_t i = 0; ok && i < tl; i++)
            ok = isgraph((unsigned char)tok[i]);
        for (int k = 0; ok && k < out->n; k++)
            ok = strcmp(out->entries[k].name, name) != 0 && strcmp(out->entries[k].token, tok) != 0;
        if (!ok) {
            st = ferry_errorf(FERRY_ERR_FORMAT,
                              "token file %s, line %d: want '<name> <role> <token>' with a name "
                              "of 1..63 bytes of [A-Za-z0-9_.:@-], a role reader | trainer | "
                              "admin and a token of 16..4096 printable bytes, names and tokens "
                              "each used once",
                              path, lineno);
            break;
        }
        ferry_token_entry *e = &out->entries[out->n++];
        (void)snprintf(e->name, sizeof e->name, "%s", name);
        (void)snprintf(e->role, sizeof e->role, "%s", role);
        e->token = tok;
        p = next;
    }
    if (st == FERRY_OK && out->n == 0)
        st = ferry_errorf(FERRY_ERR_FORMAT, "token file %s holds no token", path);
    if (st != FERRY_OK) {
        ferry_token_table_free(out);
        return st;
    }
    struct stat sb;
    if (stat(path, &sb) == 0 && (sb.st_mode & 077) != 0)
        FERRY_LOG_WARN("token file %s can be read by other users (mode %03o): chmod 600 it", path,
                       (unsigned)(sb.st_mode & 0777));
    return FERRY_OK;
}

void ferry_token_table_free(ferry_token_table *t) {
    if (t->text != NULL) { /* NULs now split the buffer: wipe it to its length */
        explicit_bzero(t->text, t->text_len);
        free(t->text);
    }
    free(t->entries);
    memset(t, 0, sizeof *t);
}

void ferry_secret_free(char *s) {
    if (s == NULL)
        return;
    explicit_bzero(s, strlen(s));
    free(s);
}
