#include "panel_cache.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "../core/error.h"
#include "safetensors.h"

/* Bumped whenever the file's layout changes (quant/block_pack.h's panels; 2: the data on cache
 * lines, whose F32, F16 and BF16 matrices alone are read in place): older files are then stale. */
#define PANEL_LAYOUT_VERSION "2"

/* The file whose identity a cache entry records: model_path itself, or a folder's one weights file. */
static int weights_file(const char *model_path, char *out, size_t cap, struct stat *st) {
    if (stat(model_path, st) != 0) return 0;
    if (S_ISDIR(st->st_mode)) {
        char file[PATH_MAX + 32];
        if (snprintf(file, sizeof file, "%s/model.safetensors", model_path) >= (int)sizeof file) return 0;
        if (stat(file, st) != 0 || !S_ISREG(st->st_mode)) return 0;
        return realpath(file, out) && strlen(out) < cap;
    }
    return S_ISREG(st->st_mode) && realpath(model_path, out) && strlen(out) < cap;
}

/* FNV-1a, 64 bits: names the cache file after the source's real path and the format. */
static uint64_t fnv1a(uint64_t h, const char *s) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* The metadata values that make a cache file current: source, its size and mtime, format, layout. */
typedef struct {
    char source[PATH_MAX], size[32], mtime[48];
} identity;

static int identify(const char *model_path, identity *id) {
    struct stat st;
    if (!weights_file(model_path, id->source, sizeof id->source, &st)) return 0;
    snprintf(id->size, sizeof id->size, "%lld", (long long)st.st_size);
    snprintf(id->mtime, sizeof id->mtime, "%lld.%09ld", (long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec);
    return 1;
}

int qlm_panel_cache_path(const char *cache_dir, const char *model_path, const char *format, char *out, size_t cap) {
    identity id;
    if (!identify(model_path, &id)) return 0;
    const char *base = strrchr(id.source, '/');
    base = base ? base + 1 : id.source;
    uint64_t h = fnv1a(fnv1a(0xcbf29ce484222325ull, id.source), format);
    int n = snprintf(out, cap, "%s/panels/%.64s-%016llx.safetensors", cache_dir, base, (unsigned long long)h);
    if (n < 0 || (size_t)n >= cap) return qlm_errorf("%s: the panel cache path is too long", cache_dir);
    return 1;
}

qlm_tensor_store *qlm_panel_cache_open(const char *path, const char *model_path, const char *format,
                                       const char **why) {
    *why = NULL;
    struct stat st;
    if (stat(path, &st) != 0) return NULL;
    identity id;
    if (!identify(model_path, &id)) {
        *why = "the model's weights file cannot be read";
        return NULL;
    }
    const struct { const char *key, *want, *stale; } checks[] = {
        {"qlm.panels.layout", PANEL_LAYOUT_VERSION, "written for another panel layout"},
        {"qlm.panels.source", id.source, "written for another file"},
        {"qlm.panels.format", format, "written for another format"},
        {"qlm.panels.source_size", id.size, "the model file changed"},
        {"qlm.panels.source_mtime", id.mtime, "the model file changed"},
    };
    char value[PATH_MAX];
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
        int found = qlm_safetensors_metadata(path, checks[i].key, value, sizeof value);
        if (found != 1 || strcmp(value, checks[i].want) != 0) {
            *why = found < 0 ? qlm_last_error() : checks[i].stale;
            return NULL;
        }
    }
    qlm_tensor_store *s = qlm_store_new();
    if (!s) return NULL;
    if (qlm_safetensors_load(path, s) != 0) {
        *why = qlm_last_error();
        qlm_store_free(s);
        return NULL;
    }
    return s;
}

/* 1 if file (named name) is a cache file whose source file is gone, or a temporary file
 * (qlm_atomic_open's "<name>.tmp.<pid>") whose writer died: each is as large as a model. */
static int orphan(const char *file, const char *name) {
    const char *tmp = strstr(name, ".safetensors.tmp.");
    if (tmp) {
        char *end;
        long pid = strtol(tmp + strlen(".safetensors.tmp."), &end, 10);
        return pid > 0 && !*end && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
    }
    char source[PATH_MAX];
    size_t n = strlen(name);
    struct stat st;
    return n > 12 && !strcmp(name + n - 12, ".safetensors") &&
           qlm_safetensors_metadata(file, "qlm.panels.source", source, sizeof source) == 1 && stat(source, &st) != 0 &&
           errno == ENOENT;
}

/* Removes the orphans from the folder of path before another file joins them. */
static void remove_orphans(const char *path) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) return;
    *slash = 0;
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *de; (de = readdir(d));) {
        char file[PATH_MAX + 256];
        snprintf(file, sizeof file, "%s/%s", dir, de->d_name);
        if (orphan(file, de->d_name)) unlink(file);
    }
    closedir(d);
}

int qlm_panel_cache_save(const char *path, const char *model_path, const char *format,
                         const qlm_tensor_store *panels) {
    remove_orphans(path);
    identity id;
    if (!identify(model_path, &id)) return qlm_errorf("%s: cannot identify the model's weights file", model_path);
    const char *const meta[] = {"qlm.panels.layout", PANEL_LAYOUT_VERSION, "qlm.panels.source", id.source,
                                "qlm.panels.format", format, "qlm.panels.source_size", id.size,
                                "qlm.panels.source_mtime", id.mtime, NULL};
    return qlm_safetensors_save_on_lines(path, panels, meta);
}
