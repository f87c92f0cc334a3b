/* Part files of a batch job split over ranks (see batch_parts.h). */
#include "batch_parts.h"

#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/error.h"
#include "common.h"

static const char k_index[] = "qlm_index";

/* Calls fn(path, user) for every OUT.part-* beside OUT; stops at and returns fn's first non-zero. */
static int each_part(const char *out, int (*fn)(const char *path, void *user), void *user) {
    char dir_buf[4200], base_buf[4200];
    snprintf(dir_buf, sizeof dir_buf, "%s", out);
    snprintf(base_buf, sizeof base_buf, "%s", out);
    const char *dir = dirname(dir_buf), *base = basename(base_buf);
    char prefix[4300];
    snprintf(prefix, sizeof prefix, "%s.part-", base);
    DIR *d = opendir(dir);
    if (!d) return qlm_errorf("%s: %s", dir, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
        char path[8600];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        rc = fn(path, user);
    }
    closedir(d);
    return rc;
}

/* The records of one part: each complete line's index and record, in the order written. */
typedef struct {
    int n;            /* records of the job */
    cJSON **rec;      /* [n]: a record per index (NULL: none yet) */
} part_records;

static int read_part(const char *path, void *user) {
    part_records *pr = user;
    size_t len;
    char *text = cli_read_text(path, &len);
    if (!text) return -1;
    int line = 0;
    for (size_t at = 0; at < len;) {
        char *nl = memchr(text + at, '\n', len - at);
        if (!nl) break; /* a torn last line */
        *nl = 0;
        line++;
        cJSON *rec = cJSON_Parse(text + at);
        const cJSON *ix = cJSON_GetObjectItemCaseSensitive(rec, k_index);
        if (!cJSON_IsObject(rec) || !cJSON_IsNumber(ix) || ix->valuedouble < 0 || ix->valuedouble >= pr->n ||
            ix->valuedouble != (int)ix->valuedouble) {
            cJSON_Delete(rec);
            free(text);
            return qlm_errorf("%s:%d: not a record of this job (no valid \"%s\")", path, line, k_index);
        }
        int i = ix->valueint;
        cJSON_DeleteItemFromObjectCaseSensitive(rec, k_index);
        cJSON_Delete(pr->rec[i]);
        pr->rec[i] = rec;
        at = (size_t)(nl - text) + 1;
    }
    free(text);
    return 0;
}

static void records_free(part_records *pr) {
    for (int i = 0; pr->rec && i < pr->n; i++) cJSON_Delete(pr->rec[i]);
    free(pr->rec);
}

static int read_all(const char *out, int n, part_records *pr) {
    pr->n = n;
    pr->rec = calloc((size_t)(n ? n : 1), sizeof *pr->rec);
    if (!pr->rec) return qlm_errorf("out of memory");
    return each_part(out, read_part, pr);
}

/* Cuts a torn last line (an interrupted write) off this rank's own part. */
static int cut_torn(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0 || st.st_size == 0) return 0;
    size_t len;
    char *text = cli_read_text(path, &len);
    if (!text) return -1;
    size_t keep = len;
    while (keep > 0 && text[keep - 1] != '\n') keep--;
    free(text);
    if (keep < len && truncate(path, (off_t)keep) != 0)
        return qlm_errorf("%s: cannot cut the torn last line: %s", path, strerror(errno));
    return 0;
}

int cli_batch_part_open(cli_batch_part *p, const char *out, int first, int n, int rank, int size) {
    memset(p, 0, sizeof *p);
    snprintf(p->path, sizeof p->path, "%s.part-%d", out, rank);
    part_records pr = {0};
    int rc = cut_torn(p->path);
    if (rc == 0) rc = read_all(out, n, &pr);
    if (rc == 0 && !(p->todo = malloc((size_t)(n ? n : 1) * sizeof *p->todo))) rc = qlm_errorf("out of memory");
    for (int i = first, k = 0; rc == 0 && i < n; i++) {
        if (pr.rec[i]) continue;
        if (k++ % size == rank) p->todo[p->n_todo++] = i;
    }
    records_free(&pr);
    if (rc == 0 && !(p->f = fopen(p->path, "a"))) rc = qlm_errorf("%s: %s", p->path, strerror(errno));
    return rc;
}

int cli_batch_part_write(cli_batch_part *p, cJSON *rec, int index) {
    if (!cJSON_AddNumberToObject(rec, k_index, index)) return qlm_errorf("out of memory");
    char *line = cJSON_PrintUnformatted(rec);
    if (!line) return qlm_errorf("out of memory");
    int ok = fputs(line, p->f) >= 0 && fputc('\n', p->f) != EOF && fflush(p->f) == 0 && fdatasync(fileno(p->f)) == 0;
    free(line);
    return ok ? 0 : qlm_errorf("%s: write failed: %s", p->path, strerror(errno));
}

void cli_batch_part_close(cli_batch_part *p) {
    if (p->f) fclose(p->f);
    free(p->todo);
    memset(p, 0, sizeof *p);
}

static int remove_part(const char *path, void *user) {
    (void)user;
    return unlink(path) == 0 ? 0 : qlm_errorf("%s: %s", path, strerror(errno));
}

int cli_batch_part_merge(FILE *out_f, const char *out, int first, int n) {
    part_records pr = {0};
    int rc = read_all(out, n, &pr);
    for (int i = first; rc == 0 && i < n; i++)
        if (!pr.rec[i]) rc = qlm_errorf("record %d (input line %d) is in no part file of %s", i, i + 1, out);
    for (int i = first; rc == 0 && i < n; i++) {
        char *line = cJSON_PrintUnformatted(pr.rec[i]);
        if (!line) rc = qlm_errorf("out of memory");
        else if (fputs(line, out_f) < 0 || fputc('\n', out_f) == EOF) rc = qlm_errorf("%s: write failed: %s", out, strerror(errno));
        free(line);
    }
    if (rc == 0 && (fflush(out_f) != 0 || fdatasync(fileno(out_f)) != 0))
        rc = qlm_errorf("%s: write failed: %s", out, strerror(errno));
    records_free(&pr);
    /* Only once OUT holds every record durably do the parts go. */
    return rc == 0 ? each_part(out, remove_part, NULL) : rc;
}
