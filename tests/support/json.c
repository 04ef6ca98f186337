/* json.c - the JSON DOM reader of json.h: a recursive-descent parser that builds a tree
 * of malloc'd nodes, the NULL-tolerant accessors, and the {shape, data} tensor decoder
 * the tests use to read reference vectors. Errors carry line and column through
 * ferry_errorf so a broken data file is diagnosed in one line. */
#include "tests/support/json.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ferry_json {
    ferry_json_type type;
    size_t n, cap; /* array elements or object members */
    union {
        double num;
        int boolean;
        char *str;
        struct {
            ferry_json **kids; /* (cap) values in document order */
            char **keys;       /* (cap) member names; NULL for arrays */
        } c;
    } u;
};

typedef struct parser {
    const char *base; /* start of the text, for line/column in messages */
    const char *p;    /* next unread byte */
    const char *end;
    int depth;
} parser;

/* ---- nodes ---- */

static void node_free(ferry_json *n) {
    if (n == NULL)
        return;
    if (n->type == FERRY_JSON_STRING) {
        free(n->u.str);
    } else if (n->type == FERRY_JSON_ARRAY || n->type == FERRY_JSON_OBJECT) {
        for (size_t i = 0; i < n->n; i++) {
            node_free(n->u.c.kids[i]);
            if (n->u.c.keys != NULL)
                free(n->u.c.keys[i]);
        }
        free(n->u.c.kids);
        free(n->u.c.keys);
    }
    free(n);
}

void ferry_json_destroy(ferry_json *root) {
    node_free(root);
}

static ferry_status nomem(void) {
    return ferry_errorf(FERRY_ERR_NOMEM, "json: out of memory");
}

/* Appends kid (and key, for objects) to a container, taking ownership of both only on
 * success. */
static ferry_status node_append(ferry_json *c, char *key, ferry_json *kid) {
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 4;
        ferry_json **kids = realloc(c->u.c.kids, cap * sizeof *kids);
        if (kids == NULL)
            return nomem();
        c->u.c.kids = kids;
        if (c->type == FERRY_JSON_OBJECT) {
            char **keys = realloc(c->u.c.keys, cap * sizeof *keys);
            if (keys == NULL)
                return nomem();
            c->u.c.keys = keys;
        }
        c->cap = cap;
    }
    c->u.c.kids[c->n] = kid;
    if (c->type == FERRY_JSON_OBJECT)
        c->u.c.keys[c->n] = key;
    c->n++;
    return FERRY_OK;
}

/* ---- lexing helpers ---- */

/* Reports a syntax error at the parser's position: "json: line 3, column 7: expected
 * ',' or ']' (found 'x')". */
static ferry_status syntax(const parser *ps, const char *what) {
    int line = 1, col = 1;
    for (const char *q = ps->base; q < ps->p; q++) {
        if (*q == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    char found[32];
    if (ps->p >= ps->end) {
        (void)snprintf(found, sizeof found, "end of input");
    } else {
        unsigned char ch = (unsigned char)*ps->p;
        if (ch >= 0x20 && ch < 0x7f)
            (void)snprintf(found, sizeof found, "'%c'", ch);
        else
            (void)snprintf(found, sizeof found, "byte 0x%02x", ch);
    }
    return ferry_errorf(FERRY_ERR_FORMAT, "json: line %d, column %d: %s (found %s)", line, col,
                        what, found);
}

static void skip_ws(parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

/* True (and consumes it) if the text continues with the literal word. */
static int eat_word(parser *ps, const char *word) {
    size_t k = strlen(word);
    if ((size_t)(ps->end - ps->p) < k || memcmp(ps->p, word, k) != 0)
        return 0;
    ps->p += k;
    return 1;
}

static int hex4(const char *s, unsigned *out) {
    static const char digits[] = "0123456789abcdef";
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char ch = (char)(s[i] >= 'A' && s[i] <= 'F' ? s[i] - 'A' + 'a' : s[i]);
        const char *hit = ch ? strchr(digits, ch) : NULL;
        if (hit == NULL)
            return 0;
        v = (v << 4) | (unsigned)(hit - digits);
    }
    *out = v;
    return 1;
}

/* Writes code point cp (< 0x110000) as 1-4 bytes of UTF-8; returns the byte count. */
static size_t put_utf8(char *dst, unsigned cp) {
    if (cp < 0x80) {
        dst[0] = (char)cp;
        return 1;
    }
    size_t n = cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    static const unsigned char lead[5] = {0, 0, 0xc0, 0xe0, 0xf0};
    for (size_t k = n - 1; k > 0; k--, cp >>= 6)
        dst[k] = (char)(0x80 | (cp & 0x3f));
    dst[0] = (char)(lead[n] | cp);
    return n;
}

/* Decodes one \u escape (ps->p at the 'u'), joining a surrogate pair, into dst. */
static ferry_status read_uescape(parser *ps, char *dst, size_t *used) {
    unsigned cp, lo;
    if (ps->end - ps->p < 5 || !hex4(ps->p + 1, &cp))
        return syntax(ps, "\\u must be followed by 4 hex digits");
    if (cp >= 0xdc00 && cp <= 0xdfff)
        return syntax(ps, "unpaired low surrogate in \\u escape");
    if (cp >= 0xd800 && cp <= 0xdbff) {
        const char *q = ps->p + 5;
        if (ps->end - q < 6 || q[0] != '\\' || q[1] != 'u' || !hex4(q + 2, &lo) || lo < 0xdc00 ||
            lo > 0xdfff)
            return syntax(ps, "high surrogate in \\u escape without a low surrogate");
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        ps->p += 6;
    }
    if (cp == 0)
        return syntax(ps, "\\u0000 (NUL) in strings is not supported");
    ps->p += 5;
    *used = put_utf8(dst, cp);
    return FERRY_OK;
}

/* Reads a string literal (ps->p at the opening quote) into a malloc'd C string. The
 * decoded text is never longer than the raw text, so one allocation suffices. */
static ferry_status read_string(parser *ps, char **out) {
    const char *q = ps->p + 1;
    while (q < ps->end && *q != '"')
        q += (*q == '\\' && ps->end - q > 1) ? 2 : 1;
    if (q >= ps->end) {
        ps->p = ps->end;
        return syntax(ps, "unterminated string");
    }
    char *s = malloc((size_t)(q - ps->p));
    if (s == NULL)
        return nomem();
    size_t k = 0;
    ps->p++;
    while (*ps->p != '"') {
        unsigned char ch = (unsigned char)*ps->p;
        if (ch < 0x20) {
            free(s);
            return syntax(ps, "control character in string (must be escaped)");
        }
        if (ch != '\\') {
            s[k++] = (char)ch;
            ps->p++;
            continue;
        }
        ps->p++; /* at the escape letter */
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
        const char *hit = strchr(from, *ps->p);
        if (*ps->p != '\0' && hit != NULL) {
            s[k++] = to[hit - from];
            ps->p++;
        } else if (*ps->p == 'u') {
            size_t used = 0;
            ferry_status st = read_uescape(ps, s + k, &used);
            if (st != FERRY_OK) {
                free(s);
                return st;
            }
            k += used;
        } else {
            free(s);
            return syntax(ps, "invalid escape in string");
        }
    }
    ps->p++; /* closing quote */
    s[k] = '\0';
    *out = s;
    return FERRY_OK;
}

/* Reads a number: RFC 8259 grammar checked by hand, then strtod on a NUL-terminated
 * copy (the input need not be terminated). Also accepts NaN, Infinity, -Infinity. */
static ferry_status read_number(parser *ps, double *out) {
    const char *s = ps->p, *q = ps->p;
    int neg = (q < ps->end && *q == '-');
    q += neg;
    ps->p = q;
    if (eat_word(ps, "Infinity")) {
        *out = neg ? -(double)INFINITY : (double)INFINITY;
        return FERRY_OK;
    }
    if (!neg && eat_word(ps, "NaN")) {
        *out = (double)NAN;
        return FERRY_OK;
    }
#define DIGIT_AT(x) ((x) < ps->end && *(x) >= '0' && *(x) <= '9')
    if (!DIGIT_AT(q))
        return syntax(ps, "expected a digit");
    if (*q == '0' && DIGIT_AT(q + 1)) {
        ps->p = q + 1;
        return syntax(ps, "leading zeros are not allowed in numbers");
    }
    while (DIGIT_AT(q))
        q++;
    if (q < ps->end && *q == '.') {
        ps->p = ++q;
        if (!DIGIT_AT(q))
            return syntax(ps, "expected a digit after the decimal point");
        while (DIGIT_AT(q))
            q++;
    }
    if (q < ps->end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < ps->end && (*q == '+' || *q == '-'))
            q++;
        ps->p = q;
        if (!DIGIT_AT(q))
            return syntax(ps, "expected a digit in the exponent");
        while (DIGIT_AT(q))
            q++;
    }
#undef DIGIT_AT
    char small[64], *buf = small;
    size_t len = (size_t)(q - s);
    if (len >= sizeof small && (buf = malloc(len + 1)) == NULL)
        return nomem();
    memcpy(buf, s, len);
    buf[len] = '\0';
    errno = 0;
    double v = strtod(buf, NULL);
    int overflow = (errno == ERANGE && isinf(v));
    if (buf != small)
        free(buf);
    ps->p = s;
    if (overflow)
        return syntax(ps, "number out of double range");
    ps->p = q;
    *out = v;
    return FERRY_OK;
}

/* ---- recursive descent ---- */

static ferry_status parse_value(parser *ps, ferry_json **out);

/* Parses the members of an object or the elements of an array (ps->p past the opening
 * bracket) into c. */
static ferry_status parse_container(parser *ps, ferry_json *c) {
    int is_obj = (c->type == FERRY_JSON_OBJECT);
    char close = is_obj ? '}' : ']';
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return FERRY_OK;
    }
    for (;;) {
        char *key = NULL;
        ferry_json *kid = NULL;
        ferry_status st;
        skip_ws(ps);
        if (is_obj) {
            if (ps->p >= ps->end || *ps->p != '"')
                return syntax(ps, "expected a string key");
            if ((st = read_string(ps, &key)) != FERRY_OK)
                return st;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') {
                free(key);
                return syntax(ps, "expected ':' after the key");
            }
            ps->p++;
        }
        if ((st = parse_value(ps, &kid)) != FERRY_OK ||
            (st = node_append(c, key, kid)) != FERRY_OK) {
            free(key);
            node_free(kid);
            return st;
        }
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            return FERRY_OK;
        }
        return syntax(ps, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

/* Parses one value at ps->p into a new node; on failure nothing is left allocated. */
static ferry_status parse_value(parser *ps, ferry_json **out) {
    skip_ws(ps);
    if (ps->p >= ps->end)
        return syntax(ps, "expected a value");
    ferry_json *n = calloc(1, sizeof *n);
    if (n == NULL)
        return nomem();
    ferry_status st = FERRY_OK;
    char ch = *ps->p;
    if (ch == '{' || ch == '[') {
        n->type = (ch == '{') ? FERRY_JSON_OBJECT : FERRY_JSON_ARRAY;
        if (ps->depth >= FERRY_JSON_MAX_DEPTH) {
            st = syntax(ps, "nesting deeper than FERRY_JSON_MAX_DEPTH");
        } else {
            ps->p++;
            ps->depth++;
            st = parse_container(ps, n);
            ps->depth--;
        }
    } else if (ch == '"') {
        n->type = FERRY_JSON_STRING;
        st = read_string(ps, &n->u.str);
    } else if (ch == '-' || (ch >= '0' && ch <= '9') || ch == 'N' || ch == 'I') {
        n->type = FERRY_JSON_NUMBER;
        st = read_number(ps, &n->u.num);
    } else if (eat_word(ps, "true") || eat_word(ps, "false")) {
        n->type = FERRY_JSON_BOOL;
        n->u.boolean = (ch == 't');
    } else if (eat_word(ps, "null")) {
        n->type = FERRY_JSON_NULL;
    } else {
        st = syntax(ps, "expected a value");
    }
    if (st != FERRY_OK) {
        node_free(n);
        return st;
    }
    *out = n;
    return FERRY_OK;
}

ferry_status ferry_json_parse(const char *text, size_t len, ferry_json **out) {
    if ((text == NULL && len > 0) || out == NULL)
        return ferry_errorf(FERRY_ERR_INVALID, "json: NULL text or output pointer");
    parser ps = {text, text, text + len, 0};
    if (text == NULL)
        ps.base = ps.p = ps.end = "";
    if (len >= 3 && memcmp(ps.p, "\xef\xbb\xbf", 3) == 0)
        ps.p += 3; /* UTF-8 byte-order mark */
    ferry_json *root = NULL;
    ferry_status st = parse_value(&ps, &root);
    if (st != FERRY_OK)
        return st;
    skip_ws(&ps);
    if (ps.p != ps.end) {
        node_free(root);
        return syntax(&ps, "trailing characters after the document");
    }
    *out = root;
    return FERRY_OK;
}

ferry_status ferry_json_parse_file(const char *path, ferry_json **out) {
    if (path == NULL || out == NULL)
        return ferry_errorf(FERRY_ERR_INVALID, "json: NULL path or output pointer");
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return ferry_errorf(FERRY_ERR_IO, "json: cannot open %s: %s", path, strerror(errno));
    size_t len = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    ferry_status st = FERRY_OK;
    while (buf != NULL) {
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap)
            break;
        char *bigger = (cap > SIZE_MAX / 2) ? NULL : realloc(buf, cap * 2);
        if (bigger == NULL) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = bigger;
        cap *= 2;
    }
    if (buf == NULL)
        st = nomem();
    else if (ferror(f))
        st = ferry_errorf(FERRY_ERR_IO, "json: error reading %s", path);
    (void)fclose(f);
    if (st == FERRY_OK) {
        st = ferry_json_parse(buf, len, out);
        if (st != FERRY_OK) { /* prefix the file name; the message buffer is reused */
            char msg[400];
            (void)snprintf(msg, sizeof msg, "%s", ferry_error_last());
            st = ferry_errorf(st, "%s: %s", path, msg);
        }
    }
    free(buf);
    return st;
}

/* ---- accessors ---- */

ferry_json_type ferry_json_type_of(const ferry_json *n) {
    return n ? n->type : FERRY_JSON_NONE;
}

/* The last member of obj whose key is the len bytes at key (not NUL-terminated). */
static const ferry_json *get_n(const ferry_json *obj, const char *key, size_t len) {
    if (obj == NULL || obj->type != FERRY_JSON_OBJECT)
        return NULL;
    for (size_t i = obj->n; i-- > 0;) {
        const char *k = obj->u.c.keys[i];
        if (strncmp(k, key, len) == 0 && k[len] == '\0')
            return obj->u.c.kids[i];
    }
    return NULL;
}

const ferry_json *ferry_json_get(const ferry_json *obj, const char *key) {
    return key ? get_n(obj, key, strlen(key)) : NULL;
}

const ferry_json *ferry_json_at(const ferry_json *arr, size_t i) {
    if (arr == NULL || (arr->type != FERRY_JSON_ARRAY && arr->type != FERRY_JSON_OBJECT) ||
        i >= arr->n)
        return NULL;
    return arr->u.c.kids[i];
}

const char *ferry_json_key(const ferry_json *obj, size_t i) {
    if (obj == NULL || obj->type != FERRY_JSON_OBJECT || i >= obj->n)
        return NULL;
    return obj->u.c.keys[i];
}

size_t ferry_json_len(const ferry_json *arr_or_obj) {
    if (arr_or_obj == NULL ||
        (arr_or_obj->type != FERRY_JSON_ARRAY && arr_or_obj->type != FERRY_JSON_OBJECT))
        return 0;
    return arr_or_obj->n;
}

double ferry_json_num(const ferry_json *n) {
    return (n && n->type == FERRY_JSON_NUMBER) ? n->u.num : (double)NAN;
}

int ferry_json_bool(const ferry_json *n) {
    return (n && n->type == FERRY_JSON_BOOL) ? n->u.boolean : -1;
}

const char *ferry_json_str(const ferry_json *s) {
    return (s && s->type == FERRY_JSON_STRING) ? s->u.str : NULL;
}

const ferry_json *ferry_json_path(const ferry_json *root, const char *dotted) {
    if (dotted == NULL)
        return NULL;
    const ferry_json *cur = root;
    const char *s = dotted;
    while (cur != NULL && *s != '\0') {
        const char *dot = strchr(s, '.');
        size_t len = dot ? (size_t)(dot - s) : strlen(s);
        if (len == 0)
            return NULL;
        if (cur->type == FERRY_JSON_OBJECT) {
            cur = get_n(cur, s, len);
        } else if (cur->type == FERRY_JSON_ARRAY) {
            size_t idx = 0;
            for (size_t k = 0; k < len; k++) {
                if (s[k] < '0' || s[k] > '9' || idx > (SIZE_MAX - 9) / 10)
                    return NULL;
                idx = idx * 10 + (size_t)(s[k] - '0');
            }
            cur = ferry_json_at(cur, idx);
        } else {
            return NULL;
        }
        if (dot == NULL)
            break;
        s = dot + 1;
        if (*s == '\0')
            return NULL; /* trailing dot: an empty last component */
    }
    return cur;
}

/* ---- tensors ---- */

long ferry_json_tensor(const ferry_json *t, double **data, int *ndim, long dims[4]) {
    long d[4] = {1, 1, 1, 1}, count = 1;
    int nd = 0;
    const ferry_json *vals = NULL;
    if (t == NULL) {
        (void)ferry_errorf(FERRY_ERR_INVALID, "json tensor: node is missing");
        return -1;
    }
    if (t->type != FERRY_JSON_NUMBER) {
        const ferry_json *shape = ferry_json_get(t, "shape");
        vals = ferry_json_get(t, "data");
        if (shape == NULL || shape->type != FERRY_JSON_ARRAY || vals == NULL ||
            vals->type != FERRY_JSON_ARRAY) {
            (void)ferry_errorf(FERRY_ERR_FORMAT, "json tensor: expected {shape: [...], data: "
                                                 "[...]} or a number");
            return -1;
        }
        if (shape->n > 4) {
            (void)ferry_errorf(FERRY_ERR_FORMAT, "json tensor: %zu dims (at most 4)", shape->n);
            return -1;
        }
        nd = (int)shape->n;
        for (int k = 0; k < nd; k++) {
            double v = ferry_json_num(shape->u.c.kids[k]);
            if (!(v >= 0 && v <= (double)INT32_MAX && v == floor(v))) {
                (void)ferry_errorf(FERRY_ERR_FORMAT,
                                   "json tensor: shape[%d] is not a non-negative integer", k);
                return -1;
            }
            d[k] = (long)v;
            if (d[k] != 0 && count > LONG_MAX / d[k]) {
                (void)ferry_errorf(FERRY_ERR_FORMAT, "json tensor: shape too large");
                return -1;
            }
            count *= d[k];
        }
        if ((size_t)count != vals->n) {
            (void)ferry_errorf(FERRY_ERR_FORMAT, "json tensor: shape holds %ld elements, data %zu",
                               count, vals->n);
            return -1;
        }
        for (long i = 0; i < count; i++) {
            if (vals->u.c.kids[i]->type != FERRY_JSON_NUMBER) {
                (void)ferry_errorf(FERRY_ERR_FORMAT, "json tensor: data[%ld] is not a number", i);
                return -1;
            }
        }
    }
    if (data != NULL) {
        double *buf = malloc((size_t)(count > 0 ? count : 1) * sizeof *buf);
        if (buf == NULL) {
            (void)nomem();
            return -1;
        }
        if (vals == NULL)
            buf[0] = t->u.num;
        for (long i = 0; vals != NULL && i < count; i++)
            buf[i] = vals->u.c.kids[i]->u.num;
        *data = buf;
    }
    if (ndim != NULL)
        *ndim = nd;
    if (dims != NULL)
        memcpy(dims, d, sizeof d);
    return count;
}

float *ferry_json_tensor_f32(const ferry_json *t, long *n) {
    double *d = NULL;
    long count = ferry_json_tensor(t, &d, NULL, NULL);
    if (count < 0)
        return NULL;
    float *f = malloc((size_t)(count > 0 ? count : 1) * sizeof *f);
    if (f == NULL) {
        free(d);
        (void)nomem();
        return NULL;
    }
    for (long i = 0; i < count; i++)
        f[i] = (float)d[i];
    free(d);
    if (n != NULL)
        *n = count;
    return f;
}
