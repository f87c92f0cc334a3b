/* Writing a file so that readers see either the old or the complete new version:
 * write "<path>.tmp.<pid>", fflush + fsync it, rename it over path, fsync the folder. */
#ifndef QLM_ATOMIC_FILE_H
#define QLM_ATOMIC_FILE_H

#include <stddef.h>
#include <stdio.h>

typedef struct {
    FILE *f;
    char tmp[4096];
    char path[4096];
} qlm_atomic_file;

/* Creates the temporary file; returns 0, or -1 with the error set. */
int qlm_atomic_open(qlm_atomic_file *af, const char *path);
/* fwrite that reports short writes; returns 0 or -1 (error set). */
int qlm_atomic_write(qlm_atomic_file *af, const void *data, size_t n);
/* Flushes, syncs and renames into place; on failure removes the temporary file. */
int qlm_atomic_commit(qlm_atomic_file *af);
/* Closes and removes the temporary file (after an error elsewhere). */
void qlm_atomic_abort(qlm_atomic_file *af);
/* The whole of a text file (text, then a newline) written atomically. */
int qlm_atomic_write_text(const char *path, const char *text);

#endif
