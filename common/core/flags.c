/* flags.c - the table-driven command-line parser of flags.h: lookup by name (with a
 * "did you mean" for a near miss), strict number parsing (the whole value must be
 * consumed, ranges checked), enum and bool words, and aligned --help output. */
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/core/flags.h"
#include "ferry/version.h"
#include "common/core/log.h" /* FERRY_ASSERT */

/* ---- lookup -------------------------------------------------------------------------- */

static const ferry_flag *flag_find(const ferry_flags *fs, const char *name, size_t len) {
    for (int i = 0; i < fs->nflags; i++) {
        const char *n = fs->flags[i].name;
        if (strlen(n) == len && memcmp(n, name, len) == 0)
            return &fs->flags[i];
    }
    return NULL;
}

/* Optimal-string-alignment distance between a (la bytes) and b: insertions,
 * deletions, substitutions and transpositions of neighbours each cost 1. Names are
 * short; longer inputs are cut to 63 bytes. */
static int edit_distance(const char *a, size_t la, const char *b) {
    enum { N = 64 };
    size_t lb = strlen(b);
    la = la < N - 1 ? la : N - 1;
    lb = lb < N - 1 ? lb : N - 1;
    int d[N][N];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            int cost = a[i - 1] != b[j - 1];
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v)
                v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v)
                v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    }
    return d[la][lb];
}

/* The flag name closest to name[0..len) ("help" and "version" included), or NULL when
 * none is close enough to be a likely typo: at most 1 edit for names of up to 4
 * bytes, 2 up to 8, 3 beyond. The first of equally close names wins. */
static const char *flag_suggest(const ferry_flags *fs, const char *name, size_t len) {
    static const char *const builtin[] = {"help", "version"};
    int limit = len <= 4 ? 1 : len <= 8 ? 2 : 3, best_d = limit + 1;
    const char *best = NULL;
    for (int i = 0; i < fs->nflags + 2; i++) {
        const char *n = i < fs->nflags ? fs->flags[i].name : builtin[i - fs->nflags];
        int d = edit_distance(name, len, n);
        if (d < best_d) {
            best_d = d;
            best = n;
        }
    }
    return best;
}

/* "unknown flag --foo (see --help)", or with a suggestion for a near miss. */
static ferry_status unknown_flag(const ferry_flags *fs, const char *dashes, const char *name,
                                 size_t len) {
    const char *near = flag_suggest(fs, name, len);
    if (near != NULL)
        return ferry_errorf(FERRY_ERR_INVALID, "unknown flag %s%.*s (did you mean --%s?)", dashes,
                            (int)len, name, near);
    return ferry_errorf(FERRY_ERR_INVALID, "unknown flag %s%.*s (see --help)", dashes, (int)len,
                        name);
}

/* The idx-th of the '|'-separated choices: its start, and its length in *len; NULL if
 * there are fewer choices. */
static const char *choice_at(const char *choices, int idx, size_t *len) {
    const char *p = choices;
    for (int k = 0; k < idx && p != NULL; k++) {
        p = strchr(p, '|');
        if (p != NULL)
            p++;
    }
    if (p != NULL)
        *len = strcspn(p, "|");
    return p;
}

/* Index of value in the '|'-separated choices, or -1. */
static int choice_index(const char *choices, const char *value) {
    size_t len, vlen = strlen(value);
    const char *p;
    for (int idx = 0; (p = choice_at(choices, idx, &len)) != NULL; idx++) {
        if (len == vlen && memcmp(p, value, len) == 0)
            return idx;
    }
    return -1;
}

/* Table mistakes are programming errors, caught on first use. */
static void flags_check_table(const ferry_flags *fs) {
    FERRY_ASSERT(fs->nflags == 0 || fs->flags != NULL);
    for (int i = 0; i < fs->nflags; i++) {
        const ferry_flag *f = &fs->flags[i];
        FERRY_ASSERT(f->name != NULL && f->name[0] != '\0' && f->ptr != NULL);
        FERRY_ASSERT(f->type >= FERRY_FLAG_INT && f->type <= FERRY_FLAG_ENUM);
        FERRY_ASSERT(f->type != FERRY_FLAG_ENUM || f->choices != NULL);
    }
}

/* ---- values -------------------------------------------------------------------------- */

static bool has_range(const ferry_flag *f) {
    return f->min < f->max;
}

static ferry_status out_of_range(const ferry_flag *f, const char *value) {
    if (has_range(f))
        return ferry_errorf(FERRY_ERR_RANGE, "--%s: '%s' is out of range [%.15g, %.15g]", f->name,
                            value, f->min, f->max);
    return ferry_errorf(FERRY_ERR_RANGE, "--%s: '%s' is out of range", f->name, value);
}

/* Decimal integer into [lo, hi] and the flag's own range. strtoll alone would accept
 * leading spaces, "+", "0x10" with base 0, or trailing junk; this accepts an optional
 * '-' or '+' and digits only. */
static ferry_status parse_int(const ferry_flag *f, const char *value, long long lo, long long hi,
                              long long *out) {
    const char *p = value + (value[0] == '-' || value[0] == '+');
    if (*p < '0' || *p > '9' || p[strspn(p, "0123456789")] != '\0')
        return ferry_errorf(FERRY_ERR_INVALID, "--%s: '%s' is not an integer", f->name, value);
    errno = 0;
    long long v = strtoll(value, NULL, 10);
    if (errno == ERANGE || v < lo || v > hi ||
        (has_range(f) && ((double)v < f->min || (double)v > f->max)))
        return out_of_range(f, value);
    *out = v;
    return FERRY_OK;
}

/* A real number; finite and within float range for FLOAT unless the flag allows nan/inf. */
static ferry_status parse_real(const ferry_flag *f, const char *value, double *out) {
    char *end;
    errno = 0;
    double v = strtod(value, &end);
    if (value[0] == '\0' || isspace((unsigned char)value[0]) || *end != '\0')
        return ferry_errorf(FERRY_ERR_INVALID, "--%s: '%s' is not a number", f->name, value);
    if (!isfinite(v)) {
        /* "inf" and "nan" spelled out; an overflow ("1e999") is a range error. */
        bool spelled = errno != ERANGE;
        if (!spelled || !f->nonfinite)
            return spelled ? ferry_errorf(FERRY_ERR_INVALID, "--%s: '%s' is not a finite number",
                                          f->name, value)
                           : out_of_range(f, value);
        *out = v;
        return FERRY_OK;
    }
    if ((f->type == FERRY_FLAG_FLOAT && fabs(v) > (double)FLT_MAX) ||
        (has_range(f) && (v < f->min || v > f->max)))
        return out_of_range(f, value);
    *out = v;
    return FERRY_OK;
}

static ferry_status parse_bool(const ferry_flag *f, const char *value, bool *out) {
    static const char *yes[] = {"true", "1", "yes", "on"};
    static const char *no[] = {"false", "0", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcmp(value, yes[i]) == 0 || strcmp(value, no[i]) == 0) {
            *out = strcmp(value, yes[i]) == 0;
            return FERRY_OK;
        }
    }
    return ferry_errorf(FERRY_ERR_INVALID, "--%s: '%s' is not a boolean (true|false)", f->name,
                        value);
}

/* Parses value into the flag's field. */
static ferry_status flag_set(const ferry_flag *f, const char *value) {
    ferry_status st = FERRY_OK;
    long long i = 0;
    double d = 0;
    switch (f->type) {
    case FERRY_FLAG_INT:
        if ((st = parse_int(f, value, INT_MIN, INT_MAX, &i)) == FERRY_OK)
            *(int *)f->ptr = (int)i;
        break;
    case FERRY_FLAG_INT64:
        if ((st = parse_int(f, value, INT64_MIN, INT64_MAX, &i)) == FERRY_OK)
            *(int64_t *)f->ptr = (int64_t)i;
        break;
    case FERRY_FLAG_FLOAT:
        if ((st = parse_real(f, value, &d)) == FERRY_OK)
            *(float *)f->ptr = (float)d;
        break;
    case FERRY_FLAG_DOUBLE:
        if ((st = parse_real(f, value, &d)) == FERRY_OK)
            *(double *)f->ptr = d;
        break;
    case FERRY_FLAG_STRING:
        *(const char **)f->ptr = value;
        break;
    case FERRY_FLAG_BOOL:
        st = parse_bool(f, value, (bool *)f->ptr);
        break;
    case FERRY_FLAG_ENUM: {
        int idx = choice_index(f->choices, value);
        if (idx < 0)
            return ferry_errorf(FERRY_ERR_INVALID, "--%s: '%s' is not one of %s", f->name, value,
                                f->choices);
        *(int *)f->ptr = idx;
        break;
    }
    }
    return st;
}

/* ---- parsing ------------------------------------------------------------------------- */

/* Handles argv[*i] (a "--name[=value]" word), consuming argv[*i + 1] when it is the
 * value. seen[k] records that flag k was given. */
static ferry_status parse_one(const ferry_flags *fs, int argc, char *const argv[], int *i,
                              bool *seen) {
    const char *arg = argv[*i] + 2;
    const char *eq = strchr(arg, '=');
    size_t len = eq != NULL ? (size_t)(eq - arg) : strlen(arg);
    const ferry_flag *f = flag_find(fs, arg, len);
    if (f == NULL && eq == NULL && len > 3 && memcmp(arg, "no-", 3) == 0) {
        /* "--no-name" clears a bool flag. */
        const ferry_flag *neg = flag_find(fs, arg + 3, len - 3);
        if (neg != NULL && neg->type == FERRY_FLAG_BOOL) {
            *(bool *)neg->ptr = false;
            seen[neg - fs->flags] = true;
            return FERRY_OK;
        }
    }
    if (f == NULL)
        return unknown_flag(fs, "--", arg, len);
    seen[f - fs->flags] = true;
    if (eq != NULL)
        return flag_set(f, eq + 1);
    if (f->type == FERRY_FLAG_BOOL) {
        *(bool *)f->ptr = true;
        return FERRY_OK;
    }
    /* A following "--word" is taken as the next flag, not as this one's value; a value
     * that really starts with "--" can be given as --name=--value. */
    if (*i + 1 >= argc || strncmp(argv[*i + 1], "--", 2) == 0)
        return ferry_errorf(FERRY_ERR_INVALID, "missing value for --%s", f->name);
    *i += 1;
    return flag_set(f, argv[*i]);
}

ferry_status ferry_flags_parse(const ferry_flags *fs, int argc, char *const argv[], bool *help) {
    FERRY_ASSERT(fs != NULL && help != NULL && (argc == 0 || argv != NULL));
    flags_check_table(fs);
    *help = false;
    bool *seen = calloc((size_t)fs->nflags + 1, sizeof *seen);
    if (seen == NULL)
        return ferry_errorf(FERRY_ERR_NOMEM, "out of memory parsing flags");
    ferry_status st = FERRY_OK;
    for (int i = 1; i < argc && st == FERRY_OK; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--version") == 0) {
            (void)printf("%s %s\n", fs->prog != NULL ? fs->prog : "ferry", ferry_version());
            *help = true;
            free(seen);
            return FERRY_OK;
        }
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            ferry_flags_usage(fs, stdout);
            *help = true;
            free(seen);
            return FERRY_OK;
        }
        if (strncmp(arg, "--", 2) == 0 && arg[2] != '\0' && arg[2] != '=')
            st = parse_one(fs, argc, argv, &i, seen);
        else if (arg[0] == '-' && arg[1] != '\0')
            st = unknown_flag(fs, "-", arg + 1, strlen(arg + 1));
        else
            st = ferry_errorf(FERRY_ERR_INVALID, "unexpected argument '%s' (see --help)", arg);
    }
    for (int k = 0; k < fs->nflags && st == FERRY_OK; k++) {
        if (fs->flags[k].required && !seen[k])
            st = ferry_errorf(FERRY_ERR_INVALID, "missing required flag --%s", fs->flags[k].name);
    }
    free(seen);
    return st;
}

/* ---- usage --------------------------------------------------------------------------- */

/* v in the fewest significant digits that read back as the same value: as a float
 * when is_float (so 0.99f prints 0.99, not 0.99000001), else as a double (0.99, not
 * 0.98999999999999999). */
static void format_number(double v, bool is_float, char *buf, size_t cap) {
    /* Whole digits stay digits below 1e15 ("1000000", not "1e+06"). */
    int whole = fabs(v) >= 1 && fabs(v) < 1e15 ? (int)floor(log10(fabs(v))) + 1 : 1;
    for (int prec = whole; prec <= 17; prec++) {
        (void)snprintf(buf, cap, "%.*g", prec, v);
        if (is_float ? strtof(buf, NULL) == (float)v : strtod(buf, NULL) == v)
            return;
    }
}

/* Whether the field's value lies in the flag's range (always, without a range). */
static bool value_in_range(const ferry_flag *f) {
    double v;
    switch (f->type) {
    case FERRY_FLAG_INT:
        v = *(const int *)f->ptr;
        break;
    case FERRY_FLAG_INT64:
        v = (double)*(const int64_t *)f->ptr;
        break;
    case FERRY_FLAG_FLOAT: { /* compared as floats: 0.99f lies above the double 0.99 */
        float x = *(const float *)f->ptr;
        return !has_range(f) || (x >= (float)f->min && x <= (float)f->max);
    }
    case FERRY_FLAG_DOUBLE:
        v = *(const double *)f->ptr;
        if (isnan(v)) /* unset: the program's default, shown nowhere */
            return true;
        break;
    default:
        return true;
    }
    return !has_range(f) || (v >= f->min && v <= f->max);
}

static const char *flag_metavar(const ferry_flag *f) {
    static const char *by_type[] = {"INT", "INT", "NUM", "NUM", "STR", "", "NAME"};
    return f->metavar != NULL ? f->metavar : by_type[f->type];
}

/* The field's current value as text, or "" when there is none worth showing. */
static void flag_value(const ferry_flag *f, char *buf, size_t cap) {
    const char *s;
    switch (f->type) {
    case FERRY_FLAG_INT:
        (void)snprintf(buf, cap, "%d", *(const int *)f->ptr);
        return;
    case FERRY_FLAG_INT64:
        (void)snprintf(buf, cap, "%" PRId64, *(const int64_t *)f->ptr);
        return;
    case FERRY_FLAG_FLOAT:
        format_number((double)*(const float *)f->ptr, true, buf, cap);
        return;
    case FERRY_FLAG_DOUBLE: /* NaN: unset, the default is the program's to say */
        if (!isnan(*(const double *)f->ptr))
            format_number(*(const double *)f->ptr, false, buf, cap);
        else
            buf[0] = '\0';
        return;
    case FERRY_FLAG_STRING:
        s = *(const char *const *)f->ptr;
        (void)snprintf(buf, cap, "%s", s != NULL ? s : "");
        return;
    case FERRY_FLAG_BOOL:
        (void)snprintf(buf, cap, "%s", *(const bool *)f->ptr ? "true" : "false");
        return;
    case FERRY_FLAG_ENUM: {
        size_t len = 0;
        const char *p = choice_at(f->choices, *(const int *)f->ptr, &len);
        (void)snprintf(buf, cap, "%.*s", (int)len, p != NULL ? p : "");
        return;
    }
    }
    buf[0] = '\0';
}

void ferry_flags_usage(const ferry_flags *fs, FILE *out) {
    FERRY_ASSERT(fs != NULL && out != NULL);
    flags_check_table(fs);
    (void)fprintf(out, "usage: %s [flags]\n", fs->prog != NULL ? fs->prog : "");
    if (fs->summary != NULL)
        (void)fprintf(out, "%s\n", fs->summary);
    (void)fprintf(out, "\nflags:\n");
    /* The left column is "  --name METAVAR"; help texts start at one common column. */
    int width = (int)strlen("--help");
    for (int i = 0; i < fs->nflags; i++) {
        const char *mv = flag_metavar(&fs->flags[i]);
        int w = 2 + (int)strlen(fs->flags[i].name) + (mv[0] != '\0' ? 1 + (int)strlen(mv) : 0);
        if (w > width)
            width = w;
    }
    if (width > 40)
        width = 40; /* a longer left column gets its help on the same line, unaligned */
    for (int i = 0; i < fs->nflags; i++) {
        const ferry_flag *f = &fs->flags[i];
        const char *mv = flag_metavar(f);
        char left[256], val[256], lo[32], hi[32];
        (void)snprintf(left, sizeof left, "--%s%s%s", f->name, mv[0] != '\0' ? " " : "", mv);
        /* A sentinel default outside the range would read as a contradiction. */
        FERRY_ASSERT(f->defval != NULL || value_in_range(f));
        if (f->defval != NULL)
            (void)snprintf(val, sizeof val, "%s", f->defval);
        else
            flag_value(f, val, sizeof val);
        (void)fprintf(out, "  %-*s  %s", width, left, f->help != NULL ? f->help : "");
        if (f->type == FERRY_FLAG_ENUM)
            (void)fprintf(out, ": %s", f->choices);
        /* Then "(default 40, range [1, 1000000])", "(required)" or nothing. */
        char note[160] = "";
        if (f->required)
            (void)snprintf(note, sizeof note, "required");
        else if (val[0] != '\0' && !(f->type == FERRY_FLAG_BOOL && strcmp(val, "false") == 0))
            (void)snprintf(note, sizeof note, "default %.100s", val); /* a switch: when on */
        if (has_range(f)) {
            bool is_float = f->type == FERRY_FLAG_FLOAT;
            format_number(f->min, is_float, lo, sizeof lo);
            format_number(f->max, is_float, hi, sizeof hi);
            (void)snprintf(note + strlen(note), sizeof note - strlen(note), "%srange [%s, %s]",
                           note[0] != '\0' ? ", " : "", lo, hi);
        }
        if (note[0] != '\0')
            (void)fprintf(out, " (%s)", note);
        (void)fprintf(out, "\n");
    }
    (void)fprintf(out, "  %-*s  %s\n", width, "--help", "print this help and exit");
    (void)fprintf(out, "  %-*s  %s\n", width, "--version", "print the version and exit");
    if (fs->env != NULL && fs->env[0] != NULL) {
        (void)fprintf(out, "\nenvironment:\n");
        for (int i = 0; fs->env[i] != NULL && fs->env[i + 1] != NULL; i += 2)
            (void)fprintf(out, "  %-*s  %s\n", width, fs->env[i], fs->env[i + 1]);
    }
    (void)fprintf(out, "\nexit status: %s\n",
                  fs->exit_status != NULL ? fs->exit_status : FERRY_FLAGS_EXIT_STATUS);
}

const char *ferry_flags_peek(int argc, char *const argv[], const char *name) {
    const char *value = NULL;
    size_t len = strlen(name);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0 || strncmp(a + 2, name, len) != 0)
            continue;
        if (a[2 + len] == '=')
            value = a + 3 + len;
        else if (a[2 + len] == '\0' && i + 1 < argc)
            value = argv[++i];
    }
    return value;
}

int ferry_env_int(const char *name, int lo, int hi, int fallback) {
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return fallback;
    char *end = NULL;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno != 0 || *end != '\0' || n < lo || n > hi)
        return fallback;
    return (int)n;
}
