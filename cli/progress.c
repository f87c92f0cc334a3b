#include "progress.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "../core/clock.h"

enum { PROGRESS_LOG_S = 5 };


void cli_progress_init(cli_progress *p, int quiet) {
    *p = (cli_progress){.tty = isatty(STDERR_FILENO), .quiet = quiet, .last = qlm_now_s()};
}

void cli_progress_update(cli_progress *p, int final, const char *fmt, ...) {
    if (p->quiet) return;
    double t = qlm_now_s();
    if (!p->tty && !final && t - p->last < PROGRESS_LOG_S) return;
    p->last = t;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* Trailing spaces wipe what a longer earlier line left on the terminal. */
    if (p->tty) fprintf(stderr, "\r%s   %s", line, final ? "\n" : "");
    else fprintf(stderr, "%s\n", line);
    p->open = p->tty && !final;
    fflush(stderr);
}

void cli_progress_break(cli_progress *p) {
    if (!p->open) return;
    fputc('\n', stderr);
    p->open = 0;
}
