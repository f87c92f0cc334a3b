#include "atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "error.h"

int qlm_atomic_open(qlm_atomic_file *af, const char *path) {
    af->f = NULL;
    int n = snprintf(af->path, sizeof af->path, "%s", path);
    int m = snprintf(af->tmp, sizeof af->tmp, "%s.tmp.%ld", path, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof af->path || m < 0 || (size_t)m >= sizeof af->tmp)
        return qlm_errorf("%s: path too long", path);
    af->f = fopen(af->tmp, "wb");
    if (!af->f) return qlm_errorf("%s: cannot create: %s", af->tmp, strerror(errno));
    return 0;
}

int qlm_atomic_write(qlm_atomic_file *af, const void *data, size_t n) {
    if (n == 0 || fwrite(data, 1, n, af->f) == n) return 0;
    return qlm_errorf("%s: write failed: %s", af->tmp, strerror(errno));
}

void qlm_atomic_abort(qlm_atomic_file *af) {
    if (af->f) fclose(af->f);
    af->f = NULL;
    unlink(af->tmp);
}

/* The rename is only durable once the folder entry is on disk. */
static int fsync_parent(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return qlm_errorf("%s: cannot open folder to sync: %s", dir, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    return rc == 0 ? 0 : qlm_errorf("%s: fsync failed: %s", dir, strerror(err));
}

int qlm_atomic_commit(qlm_atomic_file *af) {
    const char *step = NULL;
    if (fflush(af->f) != 0) step = "flush";
    else if (fsync(fileno(af->f)) != 0) step = "fsync";
    int err = errno;
    if (fclose(af->f) != 0 && !step) {
        step = "close";
        err = errno;
    }
    af->f = NULL;
    if (!step && rename(af->tmp, af->path) != 0) {
        step = "rename";
        err = errno;
    }
    if (step) {
        unlink(af->tmp);
        return qlm_errorf("%s: %s failed: %s", af->path, step, strerror(err));
    }
    return fsync_parent(af->path);
}

int qlm_atomic_write_text(const char *path, const char *text) {
    qlm_atomic_file af;
    if (qlm_atomic_open(&af, path) != 0) return -1;
    if (qlm_atomic_write(&af, text, strlen(text)) != 0 || qlm_atomic_write(&af, "\n", 1) != 0) {
        qlm_atomic_abort(&af);
        return -1;
    }
    return qlm_atomic_commit(&af);
}
