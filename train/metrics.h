/* A training run's metrics log (DIR/metrics.jsonl) and its loss-curve picture (DIR/loss_curve.svg).
 *
 * metrics.jsonl holds one JSON object per line, appended as the run goes:
 *   {"step":12,"loss":2.31,"lr":0.0002,"grad_norm":1.3,"tokens_per_s":812.5,"loss_scale":65536,"elapsed_s":33.2}
 *   {"step":50,"eval_loss":2.1}
 * Each line goes out in one write() of the whole line on an O_APPEND descriptor, so after a crash a
 * reader sees whole lines plus at most one torn last line; the file is fsync'ed every
 * qlm_train_log_set_sync_every() lines (default QLM_TRAIN_LOG_SYNC_EVERY) and on
 * qlm_train_log_sync() (call it at each checkpoint) and qlm_train_log_close().
 *
 * JSON has no NaN or infinity: a non-finite "loss" / "eval_loss" is written as null (and kept as NaN
 * in the history, which the plot skips); an optional field (lr, grad_norm, tokens_per_s, loss_scale,
 * elapsed_s) that is NaN means "not applicable" and is left out, and one that is +-inf is null.
 * Numbers are printed with printf's %g, so the process must be in the "C" numeric locale.
 *
 * On resume at step S, qlm_train_log_open() keeps the lines with step <= S (rewriting the file
 * atomically, temp file + rename, only when something is dropped), drops a torn last line (no
 * newline and not a whole JSON object) and any trailing garbage (unparseable lines, NUL bytes) after
 * the last good line, and rebuilds the in-memory history from what it kept. An unparseable line
 * followed by good lines is not crash damage: that is an error naming the file and line.
 *
 * loss_curve.svg (rewritten atomically by qlm_train_log_plot()) shows the training loss per step as a
 * thin line (min/max-downsampled to at most QLM_TRAIN_PLOT_MAX_POINTS points), its exponential moving
 * average as a thicker line, eval losses as markers joined by a line in another colour, 1-2-5 ticks
 * with labels, axis titles, the caller's title (XML-escaped) and a legend.
 *
 * Not thread-safe: one trainer thread owns a qlm_train_log. */
#ifndef QLM_TRAIN_METRICS_H
#define QLM_TRAIN_METRICS_H

#include <stddef.h>

/* Smoothed line: ema_i = BETA * ema_{i-1} + (1 - BETA) * loss_i over the finite losses in order,
 * bias-corrected (divided by 1 - BETA^i, as TensorBoard does) so it starts at the first loss instead
 * of at 0. BETA 0.9 averages over roughly the last 10 logged steps. */
#define QLM_TRAIN_EMA_BETA 0.9
/* The raw loss line is downsampled (min and max of each bucket) to at most this many points. */
#define QLM_TRAIN_PLOT_MAX_POINTS 2000
/* Default number of appended lines between fsyncs of metrics.jsonl. */
#define QLM_TRAIN_LOG_SYNC_EVERY 50

typedef struct qlm_train_log qlm_train_log;

/* One point of the history: a step and its training or eval loss (NaN when it was not finite). */
typedef struct {
    long step;
    double value;
} qlm_train_point;

/* Opens DIR/metrics.jsonl (creating DIR, one level, when missing). resume_step < 0: a new run, the
 * log is emptied. resume_step >= 0: the log is cut back to the lines with step <= resume_step (a
 * missing log is an empty one) and the history is loaded from it. title (NULL: "qlm train") is the
 * plot's title. Returns NULL with the error set on failure. */
qlm_train_log *qlm_train_log_open(const char *dir, long resume_step, const char *title);

/* Appends a training step's line and adds (step, loss) to the history. */
int qlm_train_log_step(qlm_train_log *g, long step, double loss, double lr, double grad_norm, double tokens_per_s,
                       double loss_scale, double elapsed_s);
/* Appends an eval line and adds (step, eval_loss) to the history. */
int qlm_train_log_eval(qlm_train_log *g, long step, double eval_loss);

/* fsync's metrics.jsonl (call at checkpoints). */
int qlm_train_log_sync(qlm_train_log *g);
/* Lines between automatic fsyncs; 0 or 1: after every line. */
void qlm_train_log_set_sync_every(qlm_train_log *g, int n_lines);

/* Writes DIR/loss_curve.svg atomically from the in-memory history. */
int qlm_train_log_plot(qlm_train_log *g);
/* The same picture from any history, written atomically to path (title NULL: "qlm train"). */
int qlm_train_plot_svg(const char *path, const char *title, const qlm_train_point *train, size_t n_train,
                       const qlm_train_point *eval, size_t n_eval);

/* The history, in logging order (valid until the next log call or close). */
const qlm_train_point *qlm_train_log_losses(const qlm_train_log *g, size_t *n);
const qlm_train_point *qlm_train_log_evals(const qlm_train_log *g, size_t *n);

/* fsync's (best effort), closes and frees; NULL is a no-op. */
void qlm_train_log_close(qlm_train_log *g);

#endif
