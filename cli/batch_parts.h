/* A JSONL batch job (qlm summarize --batch) split over the ranks of a job. Each rank writes every
 * record it finishes to its own OUT.part-R, one durable line each (the output record plus
 * "qlm_index", its input line), so a crash loses nothing written; when every rank is done, rank 0
 * appends the records to OUT in input order and removes the parts. A resumed run, with any
 * number of ranks, skips the records any part already holds. */
#ifndef QLM_CLI_BATCH_PARTS_H
#define QLM_CLI_BATCH_PARTS_H

#include <cjson/cJSON.h>
#include <stdio.h>

typedef struct {
    char path[4200];
    FILE *f;
    int *todo, n_todo; /* this rank's records, in input order */
} cli_batch_part;

/* This rank's share of records first..n-1: those no part file holds yet, every size-th from the
 * rank-th; opens OUT.part-RANK for appending (a torn last line from a crash cut off). */
int cli_batch_part_open(cli_batch_part *p, const char *out, int first, int n, int rank, int size);
/* Appends rec (which gains "qlm_index": index) as one line, flushed to disk. */
int cli_batch_part_write(cli_batch_part *p, cJSON *rec, int index);
void cli_batch_part_close(cli_batch_part *p);
/* After every rank is done: records first..n-1 from the parts appended to out_f (OUT, open for
 * appending) in input order and synced, then the parts removed. An index missing from every part
 * is an error naming it. */
int cli_batch_part_merge(FILE *out_f, const char *out, int first, int n);

#endif
