/* qlm rouge: mean ROUGE-1/2/L/Lsum of predictions against references, two JSONL files, scored as
 * Python's rouge_score (use_stemmer=True) scores them. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../eval/rouge.h"
#include "commands.h"
#include "common.h"
#include "jsonl.h"

static const char *k_usage =
    "usage: qlm rouge --pred PRED.jsonl --ref REF.jsonl [options]\n"
    "Scores every prediction against its reference(s) with ROUGE-1, ROUGE-2, ROUGE-L and ROUGE-Lsum as\n"
    "Python's rouge_score does with use_stemmer=True, and prints the mean precision, recall and F1 over\n"
    "the pairs. With several reference fields each metric takes the reference with the best F (as\n"
    "rouge_score's score_multi). The means are plain means; rouge_score's BootstrapAggregator reports\n"
    "bootstrap medians, which are random and close to them. ROUGE-Lsum splits texts into sentences at\n"
    "newlines. Each non-blank line of both files must be a JSON object.\n\n"
    "      --pred PATH          predictions, one JSON object per line ('-' = stdin)\n"
    "      --ref PATH           references, one JSON object per line ('-' = stdin)\n"
    "      --pred-field NAME    field holding the prediction (default summary)\n"
    "      --ref-field A[,B..]  field(s) holding the reference(s) (default summary)\n"
    "      --id-field NAME      pair the lines by this field (string or number); default: by fname when\n"
    "                           the first object of both files has one, else by line order. Paired by\n"
    "                           id, a partial prediction file is scored against its references only\n"
    "                           (the output says how many of the references were scored)\n"
    "      --json               print one JSON object instead of the table\n";

enum { OPT_PRED = 512, OPT_REF, OPT_PRED_FIELD, OPT_REF_FIELD, OPT_ID_FIELD };

#define MAX_REF_FIELDS 64


typedef struct {
    char *id;
    int rec;
} keyed;

static int cmp_keyed(const void *a, const void *b) { return strcmp(((const keyed *)a)->id, ((const keyed *)b)->id); }

/* Each record's id (a string, or a number as text), sorted by id; a repeated id is an error. */
static keyed *sorted_ids(const cli_jsonl *f, const char *field) {
    keyed *k = calloc((size_t)f->n, sizeof *k);
    if (!k) {
        qlm_errorf("out of memory");
        return NULL;
    }
    for (int i = 0; i < f->n; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(f->rec[i], field);
        char num[32];
        if (cJSON_IsNumber(v)) snprintf(num, sizeof num, "%.17g", v->valuedouble);
        k[i].rec = i;
        k[i].id = cJSON_IsString(v) ? strdup(v->valuestring) : cJSON_IsNumber(v) ? strdup(num) : NULL;
        if (!k[i].id) {
            if (!v) qlm_errorf("%s:%d: missing id field \"%s\"", f->path, f->line[i], field);
            else if (!cJSON_IsString(v) && !cJSON_IsNumber(v))
                qlm_errorf("%s:%d: id field \"%s\" is not a string or number", f->path, f->line[i], field);
            else qlm_errorf("out of memory");
            goto fail;
        }
    }
    qsort(k, (size_t)f->n, sizeof *k, cmp_keyed);
    for (int i = 1; i < f->n; i++)
        if (strcmp(k[i].id, k[i - 1].id) == 0) {
            int a = f->line[k[i - 1].rec], b = f->line[k[i].rec];
            qlm_errorf("%s:%d: id \"%s\" repeats line %d", f->path, a > b ? a : b, k[i].id, a < b ? a : b);
            goto fail;
        }
    return k;
fail:
    for (int i = 0; i < f->n; i++) free(k[i].id);
    free(k);
    return NULL;
}

/* ref_of[i]: the reference record paired with prediction i. */
static int pair_by_id(const cli_jsonl *pred, const cli_jsonl *ref, const char *field, int *ref_of) {
    int rc = -1;
    keyed *kp = sorted_ids(pred, field), *kr = kp ? sorted_ids(ref, field) : NULL;
    if (!kr) goto out;
    for (int i = 0; i < pred->n; i++) {
        keyed *hit = bsearch(&kp[i], kr, (size_t)ref->n, sizeof *kr, cmp_keyed);
        if (!hit) {
            qlm_errorf("%s:%d: %s \"%s\" is not in %s", pred->path, pred->line[kp[i].rec], field, kp[i].id, ref->path);
            goto out;
        }
        ref_of[kp[i].rec] = hit->rec;
    }
    rc = 0;
out:
    for (int i = 0; kp && i < pred->n; i++) free(kp[i].id);
    for (int i = 0; kr && i < ref->n; i++) free(kr[i].id);
    free(kp);
    free(kr);
    return rc;
}

/* Splits "a,b,c" in place; 0 on success, -1 on an empty name or too many names (message printed). */
static int split_fields(char *list, const char **names, int *n) {
    *n = 0;
    for (char *s = list;;) {
        char *comma = strchr(s, ',');
        if (comma) *comma = 0;
        if (!*s || *n == MAX_REF_FIELDS) {
            fprintf(stderr, "qlm rouge: --ref-field expects 1 to %d non-empty names separated by commas\n",
                    MAX_REF_FIELDS);
            return -1;
        }
        names[(*n)++] = s;
        if (!comma) return 0;
        s = comma + 1;
    }
}

static int print_json(const qlm_rouge_scores *mean, int n_pairs, int n_refs, const char *paired_by,
                      const char *pred_field, const char *const *ref_fields, int n_ref_fields) {
    cJSON *o = cJSON_CreateObject(), *fields = cJSON_CreateStringArray(ref_fields, n_ref_fields);
    cJSON_AddItemToObject(o, "ref_fields", fields);
    cJSON_AddNumberToObject(o, "pairs", n_pairs);
    cJSON_AddNumberToObject(o, "references", n_refs);
    if (paired_by) cJSON_AddStringToObject(o, "paired_by", paired_by);
    else cJSON_AddNullToObject(o, "paired_by");
    cJSON_AddStringToObject(o, "pred_field", pred_field);
    for (int m = 0; m < QLM_ROUGE_N_METRICS; m++) {
        cJSON *s = cJSON_AddObjectToObject(o, qlm_rouge_metric_key(m));
        cJSON_AddNumberToObject(s, "precision", mean->m[m].precision);
        cJSON_AddNumberToObject(s, "recall", mean->m[m].recall);
        cJSON_AddNumberToObject(s, "fmeasure", mean->m[m].fmeasure);
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!text) return qlm_errorf("out of memory");
    puts(text);
    free(text);
    return 0;
}

int cmd_rouge(int argc, char **argv) {
    const char *pred_path = NULL, *ref_path = NULL, *pred_field = "summary", *id_field = NULL;
    char *ref_list = NULL;
    int json = 0;
    static const struct option opts[] = {
        {"pred", required_argument, 0, OPT_PRED},           {"ref", required_argument, 0, OPT_REF},
        {"pred-field", required_argument, 0, OPT_PRED_FIELD}, {"ref-field", required_argument, 0, OPT_REF_FIELD},
        {"id-field", required_argument, 0, OPT_ID_FIELD},   {"json", no_argument, 0, OPT_JSON},
        {"help", no_argument, 0, 'h'},                       {0, 0, 0, 0}};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case OPT_PRED: pred_path = optarg; break;
        case OPT_REF: ref_path = optarg; break;
        case OPT_PRED_FIELD: pred_field = optarg; break;
        case OPT_REF_FIELD: ref_list = optarg; break;
        case OPT_ID_FIELD: id_field = optarg; break;
        case OPT_JSON: json = 1; break;
        case 'h': fputs(k_usage, stdout); return 0;
        default: return cli_usage_error("rouge", k_usage);
        }
    }
    if (!pred_path || !ref_path || optind < argc) {
        fprintf(stderr, "qlm rouge: need --pred FILE and --ref FILE (and no other arguments)\n");
        return cli_usage_error("rouge", k_usage);
    }
    if (strcmp(pred_path, "-") == 0 && strcmp(ref_path, "-") == 0) {
        fprintf(stderr, "qlm rouge: only one of --pred and --ref can be '-' (stdin)\n");
        return cli_usage_error("rouge", k_usage);
    }
    if (!*pred_field || (id_field && !*id_field)) {
        fprintf(stderr, "qlm rouge: --pred-field and --id-field need a name\n");
        return cli_usage_error("rouge", k_usage);
    }
    const char *ref_fields[MAX_REF_FIELDS] = {"summary"};
    int n_ref_fields = 1;
    if (ref_list && split_fields(ref_list, ref_fields, &n_ref_fields) != 0) return cli_usage_error("rouge", k_usage);

    cli_jsonl pred = {0}, ref = {0};
    int rc = 1, *ref_of = NULL;
    qlm_rouge_scores *scores = NULL;
    if (cli_jsonl_load(&pred, pred_path) != 0 || cli_jsonl_load(&ref, ref_path) != 0) goto out;
    if (pred.n == 0) {
        qlm_errorf("%s: no predictions", pred_path);
        goto out;
    }
    if (!id_field && cJSON_GetObjectItemCaseSensitive(pred.rec[0], "fname") &&
        cJSON_GetObjectItemCaseSensitive(ref.rec[0], "fname"))
        id_field = "fname";
    /* By line order the pairs are only known when the files are as long; by id a prediction file
     * cut short (an interrupted batch) scores the records it has. */
    if (pred.n != ref.n && (!id_field || pred.n > ref.n)) {
        qlm_errorf("%s has %d records but %s has %d; %s", pred_path, pred.n, ref_path, ref.n,
                   id_field ? "each prediction needs its own reference record"
                            : "pair them by an id field (--id-field) to score part of the references");
        goto out;
    }
    ref_of = malloc((size_t)pred.n * sizeof *ref_of);
    scores = malloc((size_t)pred.n * sizeof *scores);
    if (!ref_of || !scores) {
        qlm_errorf("out of memory");
        goto out;
    }
    if (id_field) {
        if (pair_by_id(&pred, &ref, id_field, ref_of) != 0) goto out;
    } else {
        for (int i = 0; i < pred.n; i++) ref_of[i] = i;
    }
    for (int i = 0; i < pred.n; i++) {
        const char *text = cli_jsonl_text(&pred, i, pred_field), *refs[MAX_REF_FIELDS];
        if (!text) goto out;
        for (int k = 0; k < n_ref_fields; k++)
            if (!(refs[k] = cli_jsonl_text(&ref, ref_of[i], ref_fields[k]))) goto out;
        if (qlm_rouge_score(text, refs, n_ref_fields, &scores[i]) != 0) {
            qlm_error_context("%s:%d", pred_path, pred.line[i]);
            goto out;
        }
    }
    qlm_rouge_scores mean;
    qlm_rouge_mean(scores, (size_t)pred.n, &mean);
    if (json) {
        if (print_json(&mean, pred.n, ref.n, id_field, pred_field, ref_fields, n_ref_fields) != 0) goto out;
    } else {
        printf("%d pairs, paired by %s", pred.n, id_field ? id_field : "line order");
        if (pred.n < ref.n) printf(" (a partial prediction file: %d of the %d references scored)", pred.n, ref.n);
        if (n_ref_fields > 1) printf(", best of %d references per metric", n_ref_fields);
        printf("; means over pairs (rouge_score, use_stemmer=True)\n");
        qlm_rouge_print_table(stdout, &mean);
    }
    rc = 0;
out:
    if (rc) cli_fail("rouge");
    free(scores);
    free(ref_of);
    cli_jsonl_free(&pred);
    cli_jsonl_free(&ref);
    return rc;
}
