/* progress.c - the terminal bar and the plain log lines of progress.h. Each redraw
 * builds the whole line in a buffer and writes it with one fwrite, so a line is never
 * torn; the bar takes whatever width the numbers leave. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "worker/progress.h"
#include "common/core/log.h" /* ferry_log, ferry_now, FERRY_ASSERT */

#define PROGRESS_LINE_MAX 512
#define PROGRESS_BAR_MIN  10 /* narrower than this, the bar is left out */
#define PROGRESS_BAR_MAX  40

struct ferry_progress {
    ferry_progress_mode mode;
    int64_t steps;
    int64_t first; /* steps done before elapsed_s began counting */
    int64_t log_interval;
    double redraw_s;
    ferry_progress_stats last; /* the latest stats given */
    bool have_last;            /* last holds stats of the current epoch */
    bool drawn;                /* last is what the terminal shows */
    bool line_open;            /* a TTY line was drawn and not yet ended */
    double drawn_at;           /* ferry_now() of the last redraw */
};

/* ---- formatting ---------------------------------------------------------------------- */

char *ferry_progress_hms(double seconds, char *buf, size_t cap) {
    if (!isfinite(seconds) || seconds < 0 || seconds > 3.6e9)
        (void)snprintf(buf, cap, "-:--:--");
    else {
        long long t = (long long)seconds;
        (void)snprintf(buf, cap, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
    }
    return buf;
}

/* Learning rates span 1 to 1e-5: three decimals for the large ones (SGD's 20.000,
 * 1.000), three significant digits for the small ones (Adam's 0.001, 0.0003, 3e-05). */
static void format_lr(double lr, char *buf, size_t cap) {
    (void)snprintf(buf, cap, fabs(lr) >= 0.1 || lr == 0 ? "%.3f" : "%.3g", lr);
}

/* Seconds left until the last step, extrapolated from the pace of the steps this
 * process took; -1 when unknown. */
static double eta_s(const ferry_progress *p, const ferry_progress_stats *s) {
    int64_t done = s->step - p->first, left = p->steps - s->step;
    if (done <= 0 || !(s->elapsed_s >= 0))
        return -1;
    return left <= 0 ? 0 : s->elapsed_s / (double)done * (double)left;
}

/* The PLAIN log line: "epoch 1 step 200/2323 | lr 1.000 | ... | eta 0:14:02". */
static int format_plain(const ferry_progress *p, const ferry_progress_stats *s, char *buf,
                        size_t cap) {
    char lr[32], el[32], eta[32];
    format_lr(s->lr, lr, sizeof lr);
    return snprintf(buf, cap,
                    "epoch %d step %lld/%lld | lr %s | %.0f tok/s | loss %.2f | ppl %.1f | "
                    "%s%selapsed %s | eta %s",
                    s->epoch, (long long)s->step, (long long)p->steps, lr, s->tokens_per_s, s->loss,
                    exp(s->loss), s->note != NULL ? s->note : "", s->note != NULL ? " | " : "",
                    ferry_progress_hms(s->elapsed_s, el, sizeof el),
                    ferry_progress_hms(eta_s(p, s), eta, sizeof eta));
}

static int terminal_width(void) {
    struct winsize ws;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    return 100;
}

/* Builds "epoch E [====>   ] step/steps | ... | eta h:mm:ss" in at most width - 1
 * visible columns (writing into the last column would wrap on many terminals). */
static void format_tty(const ferry_progress *p, const ferry_progress_stats *s, int width, char *buf,
                       size_t cap) {
    char lr[32], eta[32], right[256];
    format_lr(s->lr, lr, sizeof lr);
    int rlen = snprintf(right, sizeof right,
                        " %lld/%lld | %.0f tok/s | loss %.2f | ppl %.1f | lr %s | %s%seta %s",
                        (long long)s->step, (long long)p->steps, s->tokens_per_s, s->loss,
                        exp(s->loss), lr, s->note != NULL ? s->note : "",
                        s->note != NULL ? " | " : "",
                        ferry_progress_hms(eta_s(p, s), eta, sizeof eta));
    int n = snprintf(buf, cap, "epoch %d ", s->epoch);
    int room = width - 1 - n - rlen - 2; /* 2 for the brackets */
    if (room >= PROGRESS_BAR_MIN) {
        int bar = room < PROGRESS_BAR_MAX ? room : PROGRESS_BAR_MAX;
        double frac = (double)s->step / (double)p->steps;
        int fill = frac >= 1 ? bar : frac <= 0 ? 0 : (int)(frac * bar);
        buf[n++] = '[';
        for (int i = 0; i < bar; i++)
            buf[n + i] = i < fill ? '=' : ' ';
        if (fill > 0 && fill < bar)
            buf[n + fill - 1] = '>'; /* the head of an unfinished bar */
        n += bar;
        buf[n++] = ']';
        (void)snprintf(buf + n, cap - (size_t)n, "%s", right);
    } else {
        (void)snprintf(buf + n, cap - (size_t)n, "%s", right + 1); /* "epoch 1 200/..." */
    }
    size_t vis = strlen(buf);
    if (width > 1 && vis > (size_t)width - 1)
        buf[width - 1] = '\0'; /* a very narrow terminal: cut, never wrap */
}

/* ---- drawing ------------------------------------------------------------------------- */

static void draw_tty(ferry_progress *p) {
    char line[PROGRESS_LINE_MAX + 8];
    line[0] = '\r';
    int width = terminal_width();
    if (width > PROGRESS_LINE_MAX)
        width = PROGRESS_LINE_MAX;
    format_tty(p, &p->last, width, line + 1, PROGRESS_LINE_MAX);
    /* "\033[K" clears what a longer previous line left to the right. */
    size_t len = strlen(line);
    memcpy(line + len, "\033[K", 4);
    (void)fwrite(line, 1, len + 3, stderr);
    (void)fflush(stderr);
    p->drawn = true;
    p->line_open = true;
    p->drawn_at = ferry_now();
}

static void end_line(ferry_progress *p) {
    if (p->line_open) {
        (void)fputc('\n', stderr);
        (void)fflush(stderr);
    }
    p->line_open = false;
}

/* ---- lifecycle ----------------------------------------------------------------------- */

static ferry_progress_mode resolve_mode(ferry_progress_mode mode) {
    if (mode != FERRY_PROGRESS_AUTO)
        return mode;
    const char *env = getenv("FERRY_PROGRESS");
    if (env != NULL && strcmp(env, "plain") == 0)
        return FERRY_PROGRESS_PLAIN;
    if (env != NULL && strcmp(env, "tty") == 0)
        return FERRY_PROGRESS_TTY;
    if (env != NULL && strcmp(env, "off") == 0)
        return FERRY_PROGRESS_OFF;
    if (env != NULL && env[0] != '\0' && strcmp(env, "auto") != 0)
        FERRY_LOG_WARN("ignoring FERRY_PROGRESS=%s (expected plain, tty, off or auto)", env);
    return isatty(STDERR_FILENO) ? FERRY_PROGRESS_TTY : FERRY_PROGRESS_PLAIN;
}

ferry_status ferry_progress_create(const ferry_progress_config *cfg, ferry_progress **out) {
    FERRY_ASSERT(cfg != NULL && out != NULL);
    if (cfg->steps < 1 || cfg->first < 0 || cfg->first > cfg->steps || cfg->log_interval < 0 ||
        !(cfg->redraw_s >= 0))
        return ferry_errorf(
            FERRY_ERR_INVALID,
            "progress: steps must be >= 1 (got %lld) and at least the first (%lld), "
            "log interval and redraw time >= 0",
            (long long)cfg->steps, (long long)cfg->first);
    if (cfg->mode < FERRY_PROGRESS_AUTO || cfg->mode > FERRY_PROGRESS_OFF)
        return ferry_errorf(FERRY_ERR_INVALID, "progress: unknown mode %d", (int)cfg->mode);
    ferry_progress *p = calloc(1, sizeof *p);
    if (p == NULL)
        return ferry_errorf(FERRY_ERR_NOMEM, "out of memory creating a progress reporter");
    p->mode = resolve_mode(cfg->mode);
    p->steps = cfg->steps;
    p->first = cfg->first;
    p->log_interval = cfg->log_interval > 0 ? cfg->log_interval : 200;
    p->redraw_s = cfg->redraw_s > 0 ? cfg->redraw_s : 0.1;
    *out = p;
    return FERRY_OK;
}

void ferry_progress_destroy(ferry_progress *p) {
    if (p == NULL)
        return;
    ferry_progress_finish(p);
    free(p);
}

ferry_progress_mode ferry_progress_get_mode(const ferry_progress *p) {
    FERRY_ASSERT(p != NULL);
    return p->mode;
}

void ferry_progress_update(ferry_progress *p, const ferry_progress_stats *s) {
    FERRY_ASSERT(p != NULL && s != NULL);
    bool new_epoch = !p->have_last || s->epoch != p->last.epoch;
    p->last = *s;
    p->have_last = true;
    p->drawn = false;
    if (p->mode == FERRY_PROGRESS_PLAIN) {
        if (s->step > 0 && s->step % p->log_interval == 0) {
            char line[PROGRESS_LINE_MAX];
            (void)format_plain(p, s, line, sizeof line);
            FERRY_LOG_INFO("%s", line);
        }
    } else if (p->mode == FERRY_PROGRESS_TTY) {
        if (new_epoch)
            end_line(p);
        if (new_epoch || s->step >= p->steps || ferry_now() - p->drawn_at >= p->redraw_s)
            draw_tty(p);
    }
}

void ferry_progress_finish(ferry_progress *p) {
    FERRY_ASSERT(p != NULL);
    if (p->mode != FERRY_PROGRESS_TTY)
        return;
    if (p->have_last && !p->drawn)
        draw_tty(p);
    end_line(p);
    p->have_last = false; /* the next update starts a new line even in the same epoch */
}
