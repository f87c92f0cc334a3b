/* metrics.jsonl (append-only, cut back on resume) and loss_curve.svg; see metrics.h. */
#include "metrics.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/error.h"
#include "../core/atomic_file.h"

#define PATH_CAP 4096

struct qlm_train_log {
    char log_path[PATH_CAP];
    char svg_path[PATH_CAP];
    char dir[PATH_CAP];
    char *title;
    int fd;
    int sync_every, unsynced;
    qlm_train_point *train, *eval;
    size_t n_train, cap_train, n_eval, cap_eval;
};

/* ---- growing text buffer ---- */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} strbuf;

static int sb_reserve(strbuf *b, size_t more) {
    if (b->oom) return -1;
    if (b->n + more + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + more + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static void sb_put(strbuf *b, const char *s, size_t n) {
    if (sb_reserve(b, n) != 0) return;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_puts(strbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_printf(strbuf *b, const char *fmt, ...) QLM_PRINTF(2, 3);
static void sb_printf(strbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = 1;
        return;
    }
    if ((size_t)n < sizeof tmp) {
        sb_put(b, tmp, (size_t)n);
        return;
    }
    if (sb_reserve(b, (size_t)n) != 0) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

/* Text content / attribute value: XML-escaped, control characters as spaces, invalid UTF-8 (and
 * U+FFFE / U+FFFF, which XML forbids) as U+FFFD, so any title gives a well-formed file. */
static void sb_xml(strbuf *b, const char *s) {
    static const char repl[] = "\xEF\xBF\xBD";
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, n = strlen(s);
    while (i < n) {
        unsigned c = u[i];
        if (c < 0x80) {
            switch (c) {
            case '&': sb_puts(b, "&amp;"); break;
            case '<': sb_puts(b, "&lt;"); break;
            case '>': sb_puts(b, "&gt;"); break;
            case '"': sb_puts(b, "&quot;"); break;
            case '\'': sb_puts(b, "&apos;"); break;
            default:
                if (c < 0x20 || c == 0x7f) sb_puts(b, " ");
                else sb_put(b, (const char *)u + i, 1);
            }
            i++;
            continue;
        }
        size_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        int ok = len > 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; k++) ok = (u[i + k] & 0xC0) == 0x80;
        if (ok && len >= 3) {
            unsigned c1 = u[i + 1];
            if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F) || (c == 0xF0 && c1 < 0x90) ||
                (c == 0xF4 && c1 > 0x8F))
                ok = 0;
            if (c == 0xEF && c1 == 0xBF && (u[i + 2] == 0xBE || u[i + 2] == 0xBF)) ok = 0;
        }
        if (ok) {
            sb_put(b, (const char *)u + i, len);
            i += len;
        } else {
            sb_put(b, repl, 3);
            i++;
        }
    }
}

/* ---- history ---- */

static int push_point(qlm_train_point **a, size_t *n, size_t *cap, long step, double v) {
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        qlm_train_point *p = realloc(*a, nc * sizeof *p);
        if (!p) return qlm_errorf("metrics history: out of memory");
        *a = p;
        *cap = nc;
    }
    (*a)[(*n)++] = (qlm_train_point){step, isfinite(v) ? v : NAN};
    return 0;
}

/* ---- metrics.jsonl ---- */

static int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return qlm_errorf("%s: cannot open folder to sync: %s", dir, strerror(errno));
    int rc = fsync(fd), err = errno;
    close(fd);
    return rc == 0 ? 0 : qlm_errorf("%s: fsync failed: %s", dir, strerror(err));
}

/* Opens the log for appending (creating it); truncate empties it first. */
static int open_append(qlm_train_log *g, int truncate) {
    int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0);
    g->fd = open(g->log_path, flags, 0644);
    if (g->fd < 0) return qlm_errorf("%s: cannot open for appending: %s", g->log_path, strerror(errno));
    if (fsync(g->fd) != 0) return qlm_errorf("%s: fsync failed: %s", g->log_path, strerror(errno));
    return fsync_dir(g->dir);
}

static int read_whole(const char *path, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return 0;
        return qlm_errorf("%s: cannot open: %s", path, strerror(errno));
    }
    size_t cap = 1 << 16, n = 0, r;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return qlm_errorf("%s: out of memory", path);
    }
    while ((r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                fclose(f);
                return qlm_errorf("%s: out of memory", path);
            }
            buf = nb;
            cap *= 2;
        }
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return qlm_errorf("%s: read failed", path);
    }
    *out = buf;
    *len = n;
    return 0;
}

/* A whole line's JSON object with an integer "step"; returns the parsed object or NULL. */
static cJSON *parse_line(const char *s, size_t len, long *step) {
    if (memchr(s, 0, len)) return NULL;
    char *tmp = malloc(len + 1);
    if (!tmp) return NULL;
    memcpy(tmp, s, len);
    tmp[len] = 0;
    cJSON *o = cJSON_ParseWithOpts(tmp, NULL, 1);
    free(tmp);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "step");
    if (!cJSON_IsObject(o) || !cJSON_IsNumber(st) || st->valuedouble != floor(st->valuedouble) ||
        fabs(st->valuedouble) > 9e18) {
        cJSON_Delete(o);
        return NULL;
    }
    *step = (long)st->valuedouble;
    return o;
}

static double json_loss(const cJSON *v) { return cJSON_IsNumber(v) ? v->valuedouble : NAN; }

static int blank(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
    return 1;
}

typedef struct {
    size_t start, len;
} span;

/* Reads the log, keeps the lines with step <= resume_step (and loads them into the history), drops
 * a torn tail, rewrites the file atomically when anything was dropped, then opens it for appending. */
static int load_and_cut(qlm_train_log *g, long resume_step) {
    char *data;
    size_t size;
    if (read_whole(g->log_path, &data, &size) != 0) return -1;
    span *keep = NULL;
    size_t n_keep = 0, cap_keep = 0;
    int changed = 0, rc = 0;
    long first_bad = 0, line_no = 0;
    for (size_t pos = 0; pos < size && rc == 0;) {
        const char *s = data + pos, *nl = memchr(s, '\n', size - pos);
        size_t len = nl ? (size_t)(nl - s) : size - pos;
        pos += len + (nl ? 1 : 0);
        line_no++;
        if (!nl) changed = 1; /* rewritten with its newline (or dropped if torn) */
        if (blank(s, len)) {
            changed = 1;
            continue;
        }
        long step;
        cJSON *o = parse_line(s, len, &step);
        if (!o) {
            changed = 1;
            if (!first_bad) first_bad = line_no;
            continue;
        }
        if (first_bad) {
            cJSON_Delete(o);
            rc = qlm_errorf("%s:%ld: not a JSON object with an integer \"step\" (and not a torn last line)",
                            g->log_path, first_bad);
            break;
        }
        if (step > resume_step) {
            changed = 1;
            cJSON_Delete(o);
            continue;
        }
        const cJSON *loss = cJSON_GetObjectItemCaseSensitive(o, "loss");
        const cJSON *ev = cJSON_GetObjectItemCaseSensitive(o, "eval_loss");
        if (loss) rc = push_point(&g->train, &g->n_train, &g->cap_train, step, json_loss(loss));
        if (ev && rc == 0) rc = push_point(&g->eval, &g->n_eval, &g->cap_eval, step, json_loss(ev));
        cJSON_Delete(o);
        if (rc == 0 && n_keep == cap_keep) {
            size_t nc = cap_keep ? cap_keep * 2 : 256;
            span *p = realloc(keep, nc * sizeof *p);
            if (!p) rc = qlm_errorf("%s: out of memory", g->log_path);
            else keep = p, cap_keep = nc;
        }
        if (rc == 0) keep[n_keep++] = (span){(size_t)(s - data), len};
    }
    if (rc == 0 && changed) {
        qlm_atomic_file af;
        rc = qlm_atomic_open(&af, g->log_path);
        for (size_t i = 0; rc == 0 && i < n_keep; i++) {
            rc = qlm_atomic_write(&af, data + keep[i].start, keep[i].len);
            if (rc == 0) rc = qlm_atomic_write(&af, "\n", 1);
        }
        if (rc == 0) rc = qlm_atomic_commit(&af);
        else if (af.f) qlm_atomic_abort(&af);
    }
    free(keep);
    free(data);
    if (rc != 0) return -1;
    return open_append(g, 0);
}

qlm_train_log *qlm_train_log_open(const char *dir, long resume_step, const char *title) {
    if (!dir || !*dir) {
        qlm_errorf("metrics log: no folder given");
        return NULL;
    }
    qlm_train_log *g = calloc(1, sizeof *g);
    if (!g) {
        qlm_errorf("metrics log: out of memory");
        return NULL;
    }
    g->fd = -1;
    g->sync_every = QLM_TRAIN_LOG_SYNC_EVERY;
    int a = snprintf(g->dir, sizeof g->dir, "%s", dir);
    int b = snprintf(g->log_path, sizeof g->log_path, "%s/metrics.jsonl", dir);
    int c = snprintf(g->svg_path, sizeof g->svg_path, "%s/loss_curve.svg", dir);
    g->title = strdup(title ? title : "qlm train");
    if (a < 0 || b < 0 || c < 0 || (size_t)b >= sizeof g->log_path || (size_t)c >= sizeof g->svg_path) {
        qlm_errorf("%s: path too long", dir);
        goto fail;
    }
    if (!g->title) {
        qlm_errorf("metrics log: out of memory");
        goto fail;
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        qlm_errorf("%s: cannot create folder: %s", dir, strerror(errno));
        goto fail;
    }
    if ((resume_step < 0 ? open_append(g, 1) : load_and_cut(g, resume_step)) != 0) goto fail;
    return g;
fail:
    qlm_train_log_close(g);
    return NULL;
}

/* Appends one whole line with one write(); a short write is cut back off so the file never keeps
 * a partial line that later lines would be glued onto. Returns 0, -1 when the line was not written,
 * or 1 when it was written but the periodic fsync failed (error set either way). */
static int append_line(qlm_train_log *g, const char *line, size_t len) {
    if (g->fd < 0) return qlm_errorf("%s: log is not open", g->log_path);
    off_t before = lseek(g->fd, 0, SEEK_END);
    ssize_t w;
    do w = write(g->fd, line, len);
    while (w < 0 && errno == EINTR);
    if (w != (ssize_t)len) {
        int err = w < 0 ? errno : ENOSPC;
        if (w > 0 && before >= 0 && ftruncate(g->fd, before) != 0) {
            /* nothing more to do: the resume loader drops the torn line */
        }
        return qlm_errorf("%s: append failed: %s", g->log_path, strerror(err));
    }
    if (++g->unsynced >= g->sync_every && qlm_train_log_sync(g) != 0) return 1;
    return 0;
}

/* ,"key":value -- NaN optional fields are left out, non-finite values are null. */
static void put_field(char *buf, size_t cap, size_t *off, const char *key, double v, int optional) {
    if (optional && isnan(v)) return;
    if (*off >= cap) return;
    int n = isfinite(v) ? snprintf(buf + *off, cap - *off, ",\"%s\":%.9g", key, v)
                        : snprintf(buf + *off, cap - *off, ",\"%s\":null", key);
    if (n > 0) *off += (size_t)n;
}

static int finish_line(qlm_train_log *g, char *buf, size_t cap, size_t off) {
    if (off + 2 > cap) return qlm_errorf("%s: metrics line too long", g->log_path);
    buf[off++] = '}';
    buf[off++] = '\n';
    return append_line(g, buf, off);
}

static int reserve_one(qlm_train_point **a, size_t n, size_t *cap) {
    if (n < *cap) return 0;
    size_t nc = *cap ? *cap * 2 : 256;
    qlm_train_point *p = realloc(*a, nc * sizeof *p);
    if (!p) return qlm_errorf("metrics history: out of memory");
    *a = p;
    *cap = nc;
    return 0;
}

int qlm_train_log_step(qlm_train_log *g, long step, double loss, double lr, double grad_norm, double tokens_per_s,
                       double loss_scale, double elapsed_s) {
    if (!g) return qlm_errorf("metrics log: not open");
    if (reserve_one(&g->train, g->n_train, &g->cap_train) != 0) return -1;
    char buf[512];
    size_t off = (size_t)snprintf(buf, sizeof buf, "{\"step\":%ld", step);
    put_field(buf, sizeof buf, &off, "loss", loss, 0);
    put_field(buf, sizeof buf, &off, "lr", lr, 1);
    put_field(buf, sizeof buf, &off, "grad_norm", grad_norm, 1);
    put_field(buf, sizeof buf, &off, "tokens_per_s", tokens_per_s, 1);
    put_field(buf, sizeof buf, &off, "loss_scale", loss_scale, 1);
    put_field(buf, sizeof buf, &off, "elapsed_s", elapsed_s, 1);
    int rc = finish_line(g, buf, sizeof buf, off);
    /* The line is in the file even when only the periodic fsync failed: keep the history in step. */
    if (rc >= 0) push_point(&g->train, &g->n_train, &g->cap_train, step, loss);
    return rc == 0 ? 0 : -1;
}

int qlm_train_log_eval(qlm_train_log *g, long step, double eval_loss) {
    if (!g) return qlm_errorf("metrics log: not open");
    if (reserve_one(&g->eval, g->n_eval, &g->cap_eval) != 0) return -1;
    char buf[128];
    size_t off = (size_t)snprintf(buf, sizeof buf, "{\"step\":%ld", step);
    put_field(buf, sizeof buf, &off, "eval_loss", eval_loss, 0);
    int rc = finish_line(g, buf, sizeof buf, off);
    if (rc >= 0) push_point(&g->eval, &g->n_eval, &g->cap_eval, step, eval_loss);
    return rc == 0 ? 0 : -1;
}

int qlm_train_log_sync(qlm_train_log *g) {
    if (!g || g->fd < 0) return qlm_errorf("metrics log: not open");
    g->unsynced = 0;
    if (fsync(g->fd) != 0) return qlm_errorf("%s: fsync failed: %s", g->log_path, strerror(errno));
    return 0;
}

void qlm_train_log_set_sync_every(qlm_train_log *g, int n_lines) {
    if (g) g->sync_every = n_lines < 1 ? 1 : n_lines;
}

const qlm_train_point *qlm_train_log_losses(const qlm_train_log *g, size_t *n) {
    *n = g ? g->n_train : 0;
    return g ? g->train : NULL;
}

const qlm_train_point *qlm_train_log_evals(const qlm_train_log *g, size_t *n) {
    *n = g ? g->n_eval : 0;
    return g ? g->eval : NULL;
}

void qlm_train_log_close(qlm_train_log *g) {
    if (!g) return;
    if (g->fd >= 0) {
        if (fsync(g->fd) != 0) {
            /* best effort: the lines are written, the caller has nothing to retry */
        }
        close(g->fd);
    }
    free(g->title);
    free(g->train);
    free(g->eval);
    free(g);
}

/* ---- loss_curve.svg ---- */

enum { SVG_W = 960, SVG_H = 540, PL = 80, PR = SVG_W - 30, PT = 56, PB = SVG_H - 64 };

/* Values beyond this are not plottable (a diverged run); they are skipped like NaN. */
#define PLOT_LIMIT 1e15

static int plottable(double v) { return isfinite(v) && fabs(v) < PLOT_LIMIT; }

/* 1, 2 or 5 times a power of ten, about range / target. */
static double nice_step(double range, int target) {
    double raw = range / target;
    if (!(raw > 0) || !isfinite(raw)) return 1;
    double mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

typedef struct {
    double lo, hi, step;
} axis;

static axis make_axis(double lo, double hi, int target, double min_step) {
    axis a;
    a.step = nice_step(hi - lo, target);
    if (a.step < min_step) a.step = min_step;
    a.lo = floor(lo / a.step) * a.step;
    a.hi = ceil(hi / a.step) * a.step;
    if (a.hi <= a.lo) a.hi = a.lo + a.step;
    return a;
}

static void tick_label(char *buf, size_t cap, double v, double step) {
    if (fabs(v) < step * 1e-6) v = 0;
    int dec = (int)-floor(log10(step) + 1e-9);
    if (dec < 0) dec = 0;
    if (fabs(v) >= 1e7 || dec > 6) snprintf(buf, cap, "%g", v);
    else snprintf(buf, cap, "%.*f", dec, v);
}

typedef struct {
    double x0, x1, y0, y1;
} frame;

static double px(const frame *f, double x) { return PL + (x - f->x0) / (f->x1 - f->x0) * (PR - PL); }
static double py(const frame *f, double y) { return PB - (y - f->y0) / (f->y1 - f->y0) * (PB - PT); }

typedef struct {
    double x, y;
} pt;

static void sb_polyline(strbuf *b, const frame *f, const pt *p, size_t n, const char *cls, const char *style) {
    sb_printf(b, "<polyline class=\"%s\" fill=\"none\" %s points=\"", cls, style);
    for (size_t i = 0; i < n; i++) sb_printf(b, "%s%.1f,%.1f", i ? " " : "", px(f, p[i].x), py(f, p[i].y));
    sb_puts(b, "\"/>\n");
}

/* At most max points: the min and the max of each of max/2 buckets, in order. */
static size_t downsample_minmax(const pt *in, size_t n, pt *out, size_t max) {
    if (n <= max) {
        memcpy(out, in, n * sizeof *in);
        return n;
    }
    size_t nb = max / 2, m = 0;
    for (size_t k = 0; k < nb; k++) {
        size_t s = k * n / nb, e = (k + 1) * n / nb, lo = s, hi = s;
        for (size_t i = s; i < e; i++) {
            if (in[i].y < in[lo].y) lo = i;
            if (in[i].y > in[hi].y) hi = i;
        }
        size_t a = lo < hi ? lo : hi, c = lo < hi ? hi : lo;
        out[m++] = in[a];
        if (c != a) out[m++] = in[c];
    }
    return m;
}

/* At most max points, evenly spaced by index, first and last kept. */
static size_t downsample_stride(const pt *in, size_t n, pt *out, size_t max) {
    if (n <= max) {
        memcpy(out, in, n * sizeof *in);
        return n;
    }
    for (size_t k = 0; k < max; k++) out[k] = in[k * (n - 1) / (max - 1)];
    return max;
}

static void legend_entry(strbuf *b, int x, int y, const char *color, double width, int marker, const char *text) {
    sb_printf(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"%.1f\"/>", x, y, x + 24,
              y, color, width);
    if (marker) sb_printf(b, "<circle class=\"key\" cx=\"%d\" cy=\"%d\" r=\"3.5\" fill=\"%s\"/>", x + 12, y, color);
    sb_printf(b, "<text x=\"%d\" y=\"%d\" dominant-baseline=\"middle\">%s</text>\n", x + 32, y, text);
}

static void build_svg(strbuf *b, const char *title, const pt *tr, size_t nt, const pt *ev, size_t ne, pt *scratch) {
    /* Data range over every plotted point. */
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    for (size_t i = 0; i < nt; i++) {
        xmin = fmin(xmin, tr[i].x), xmax = fmax(xmax, tr[i].x);
        ymin = fmin(ymin, tr[i].y), ymax = fmax(ymax, tr[i].y);
    }
    for (size_t i = 0; i < ne; i++) {
        xmin = fmin(xmin, ev[i].x), xmax = fmax(xmax, ev[i].x);
        ymin = fmin(ymin, ev[i].y), ymax = fmax(ymax, ev[i].y);
    }
    if (nt + ne == 0) xmin = 0, xmax = 1, ymin = 0, ymax = 1;
    if (xmax - xmin < 1) xmin -= 1, xmax += 1;
    if (ymax - ymin <= 1e-9 * fmax(1, fabs(ymax))) {
        double pad = fmax(fabs(ymax) * 0.05, 0.05);
        ymin -= pad, ymax += pad;
    } else {
        double pad = 0.02 * (ymax - ymin);
        ymin -= pad, ymax += pad;
    }
    axis ax = make_axis(xmin, xmax, 8, 1), ay = make_axis(ymin, ymax, 6, 0);
    frame f = {ax.lo, ax.hi, ay.lo, ay.hi};

    sb_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                 "font-family=\"sans-serif\" font-size=\"12\">\n",
              SVG_W, SVG_H, SVG_W, SVG_H);
    sb_puts(b, "<title>");
    sb_xml(b, title);
    sb_puts(b, "</title>\n");
    sb_printf(b, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", SVG_W, SVG_H);
    sb_printf(b, "<text class=\"title\" x=\"%d\" y=\"30\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">",
              SVG_W / 2);
    sb_xml(b, title);
    sb_puts(b, "</text>\n");

    /* Grid, ticks and labels. */
    char lab[64];
    sb_puts(b, "<g stroke=\"#e0e0e0\" stroke-width=\"1\">\n");
    for (int i = 0; i <= 64; i++) {
        double v = ax.lo + i * ax.step;
        if (v > ax.hi + ax.step * 1e-6) break;
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>", px(&f, v), PT, px(&f, v), PB);
    }
    for (int i = 0; i <= 64; i++) {
        double v = ay.lo + i * ay.step;
        if (v > ay.hi + ay.step * 1e-6) break;
        sb_printf(b, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>", PL, py(&f, v), PR, py(&f, v));
    }
    sb_puts(b, "\n</g>\n");
    sb_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#333\"/>\n", PL, PT,
              PR - PL, PB - PT);
    for (int i = 0; i <= 64; i++) {
        double v = ax.lo + i * ax.step;
        if (v > ax.hi + ax.step * 1e-6) break;
        tick_label(lab, sizeof lab, v, ax.step);
        double x = px(&f, v);
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#333\"/>", x, PB, x, PB + 5);
        sb_printf(b, "<text class=\"xtick\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", x, PB + 19, lab);
    }
    for (int i = 0; i <= 64; i++) {
        double v = ay.lo + i * ay.step;
        if (v > ay.hi + ay.step * 1e-6) break;
        tick_label(lab, sizeof lab, v, ay.step);
        double y = py(&f, v);
        sb_printf(b, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#333\"/>", PL - 5, y, PL, y);
        sb_printf(b, "<text class=\"ytick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\" dominant-baseline=\"middle\">%s</text>\n",
                  PL - 8, y, lab);
    }
    sb_printf(b, "<text class=\"xlabel\" x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"14\">step</text>\n",
              (PL + PR) / 2, SVG_H - 18);
    sb_printf(b, "<text class=\"ylabel\" x=\"22\" y=\"%d\" text-anchor=\"middle\" font-size=\"14\" "
                 "transform=\"rotate(-90 22 %d)\">loss</text>\n",
              (PT + PB) / 2, (PT + PB) / 2);

    /* Series. */
    static const char *raw_c = "#9ecae1", *ema_c = "#1f77b4", *eval_c = "#ff7f0e";
    if (nt > 0) {
        size_t m = downsample_minmax(tr, nt, scratch, QLM_TRAIN_PLOT_MAX_POINTS);
        sb_polyline(b, &f, scratch, m, "train", "stroke=\"#9ecae1\" stroke-width=\"1\"");
        if (nt == 1)
            sb_printf(b, "<circle class=\"train\" cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n", px(&f, tr[0].x),
                      py(&f, tr[0].y), raw_c);
    }
    if (nt > 1) {
        pt *ema = scratch + nt; /* scratch holds 2 * nt + ne points */
        double m = 0, corr = 1;
        for (size_t i = 0; i < nt; i++) {
            m = QLM_TRAIN_EMA_BETA * m + (1 - QLM_TRAIN_EMA_BETA) * tr[i].y;
            corr *= QLM_TRAIN_EMA_BETA;
            ema[i] = (pt){tr[i].x, m / (1 - corr)};
        }
        size_t k = downsample_stride(ema, nt, scratch, QLM_TRAIN_PLOT_MAX_POINTS);
        sb_polyline(b, &f, scratch, k, "ema", "stroke=\"#1f77b4\" stroke-width=\"2\"");
    }
    if (ne > 0) {
        size_t k = downsample_stride(ev, ne, scratch, QLM_TRAIN_PLOT_MAX_POINTS);
        if (k > 1) sb_polyline(b, &f, scratch, k, "eval", "stroke=\"#ff7f0e\" stroke-width=\"1.5\"");
        sb_printf(b, "<g class=\"eval-markers\" fill=\"%s\">", eval_c);
        for (size_t i = 0; i < k; i++)
            sb_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\"/>", px(&f, scratch[i].x), py(&f, scratch[i].y));
        sb_puts(b, "</g>\n");
    }

    /* Legend (top right inside the plot) or a note when there is nothing to show. */
    int entries = (nt > 0) + (nt > 1) + (ne > 0);
    if (entries == 0) {
        sb_printf(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#888\" font-size=\"14\">no data yet</text>\n",
                  (PL + PR) / 2, (PT + PB) / 2);
    } else {
        int lx = PR - 190, ly = PT + 10, y = ly + 12;
        sb_printf(b, "<g class=\"legend\"><rect x=\"%d\" y=\"%d\" width=\"180\" height=\"%d\" fill=\"white\" "
                     "fill-opacity=\"0.85\" stroke=\"#999\"/>\n",
                  lx, ly, 18 * entries + 6);
        char ema_label[64];
        snprintf(ema_label, sizeof ema_label, "loss, EMA (beta %.2g)", QLM_TRAIN_EMA_BETA);
        if (nt > 0) legend_entry(b, lx + 8, y, raw_c, 1, 0, "training loss"), y += 18;
        if (nt > 1) legend_entry(b, lx + 8, y, ema_c, 2, 0, ema_label), y += 18;
        if (ne > 0) legend_entry(b, lx + 8, y, eval_c, 1.5, 1, "eval loss");
        sb_puts(b, "</g>\n");
    }
    sb_puts(b, "</svg>\n");
}

int qlm_train_plot_svg(const char *path, const char *title, const qlm_train_point *train, size_t n_train,
                       const qlm_train_point *eval, size_t n_eval) {
    /* Plottable points, then room for the EMA and the downsampled copies. */
    size_t cap = 2 * n_train + n_eval + 1;
    pt *tr = malloc(cap * sizeof *tr), *ev = malloc((n_eval + 1) * sizeof *ev), *scratch = malloc(cap * sizeof *scratch);
    strbuf b = {0};
    int rc = 0;
    if (!tr || !ev || !scratch) {
        rc = qlm_errorf("%s: out of memory", path);
        goto done;
    }
    size_t nt = 0, ne = 0;
    for (size_t i = 0; i < n_train; i++)
        if (plottable(train[i].value)) tr[nt++] = (pt){(double)train[i].step, train[i].value};
    for (size_t i = 0; i < n_eval; i++)
        if (plottable(eval[i].value)) ev[ne++] = (pt){(double)eval[i].step, eval[i].value};
    build_svg(&b, title ? title : "qlm train", tr, nt, ev, ne, scratch);
    if (b.oom) {
        rc = qlm_errorf("%s: out of memory", path);
        goto done;
    }
    qlm_atomic_file af;
    if (qlm_atomic_open(&af, path) != 0) {
        rc = -1;
        goto done;
    }
    if (qlm_atomic_write(&af, b.p, b.n) != 0) {
        qlm_atomic_abort(&af);
        rc = -1;
        goto done;
    }
    rc = qlm_atomic_commit(&af);
done:
    free(tr);
    free(ev);
    free(scratch);
    free(b.p);
    return rc;
}

int qlm_train_log_plot(qlm_train_log *g) {
    if (!g) return qlm_errorf("metrics log: not open");
    return qlm_train_plot_svg(g->svg_path, g->title, g->train, g->n_train, g->eval, g->n_eval);
}
