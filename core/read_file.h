/* Reading a whole (small) input file into memory, with its size capped. */
#ifndef QLM_READ_FILE_H
#define QLM_READ_FILE_H

#include <stddef.h>

/* The bytes of path, NUL-terminated (malloc'd), their count in *size. NULL with an error naming
 * the file when it cannot be opened, is not a regular file, is over max bytes, or fails to read. */
char *qlm_read_file(const char *path, size_t max, size_t *size);

#endif
