#include "read_file.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "error.h"

char *qlm_read_file(const char *path, size_t max, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        qlm_errorf("%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    char *buf = NULL;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0 || (uint64_t)st.st_size > max) {
        qlm_errorf("%s: not a regular file of at most %zu bytes", path, max);
    } else if (!(buf = malloc((size_t)st.st_size + 1))) {
        qlm_errorf("%s: out of memory", path);
    } else if (fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
        qlm_errorf("%s: read error", path);
        free(buf);
        buf = NULL;
    } else {
        buf[st.st_size] = 0;
        *size = (size_t)st.st_size;
    }
    fclose(f);
    return buf;
}
