/* A long job's progress line on stderr. On a terminal it is redrawn in place (\r) at every update;
 * in a log (stderr a file or pipe) it is a whole line at most every PROGRESS_LOG_S seconds and at
 * the end, so logs hold no carriage returns and do not grow by a line per step. */
#ifndef QLM_CLI_PROGRESS_H
#define QLM_CLI_PROGRESS_H

typedef struct {
    int tty, quiet, open; /* open: a redrawn line is on the terminal without its newline */
    double last;          /* when the last log line was written */
} cli_progress;

void cli_progress_init(cli_progress *p, int quiet);
/* One update (printf-style); final ends the line. */
void cli_progress_update(cli_progress *p, int final, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Ends a redrawn line before other output (nothing in a log). */
void cli_progress_break(cli_progress *p);

#endif
