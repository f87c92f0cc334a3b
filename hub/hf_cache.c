#include "hf_cache.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/error.h"
#include "../core/atomic_file.h"
#include "hf_download.h"

static int repo_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
           c == '.';
}

/* One half of ORG/NAME, by the hub's rules: [A-Za-z0-9._-], not starting or ending with '.'
 * or '-', no ".." or "--" (which the cache folder name uses as separator). */
static int valid_part(const char *s, size_t n) {
    if (n == 0 || n > 96 || s[0] == '.' || s[0] == '-' || s[n - 1] == '.' || s[n - 1] == '-') return 0;
    for (size_t i = 0; i < n; i++) {
        if (!repo_char(s[i])) return 0;
        if (i && (s[i] == '.' || s[i] == '-') && s[i - 1] == s[i]) return 0;
    }
    return 1;
}

int qlm_hf_valid_rev(const char *rev) {
    size_t n = strlen(rev);
    if (n == 0 || n >= QLM_HF_REV_MAX || rev[0] == '/' || rev[n - 1] == '/' || strstr(rev, "..") ||
        strstr(rev, "//"))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!repo_char(rev[i]) && rev[i] != '/') return 0;
    return 1;
}

int qlm_hf_parse_repo(const char *spec, char repo[QLM_HF_REPO_MAX], char rev[QLM_HF_REV_MAX]) {
    const char *at = strchr(spec, '@'), *end = at ? at : spec + strlen(spec);
    const char *slash = memchr(spec, '/', (size_t)(end - spec));
    if (!slash || memchr(slash + 1, '/', (size_t)(end - slash - 1))) return 0;
    if (!valid_part(spec, (size_t)(slash - spec)) || !valid_part(slash + 1, (size_t)(end - slash - 1))) return 0;
    const char *r = at ? at + 1 : "main";
    if (!qlm_hf_valid_rev(r)) return 0;
    snprintf(repo, QLM_HF_REPO_MAX, "%.*s", (int)(end - spec), spec);
    snprintf(rev, QLM_HF_REV_MAX, "%s", r);
    return 1;
}

int qlm_hf_valid_rfilename(const char *path) {
    size_t n = strlen(path);
    if (n == 0 || n > 1024 || path[0] == '/') return 0;
    for (const char *p = path; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == '\\' || *p == 0x7f) return 0;
    for (const char *seg = path;;) {
        const char *e = strchr(seg, '/');
        size_t len = e ? (size_t)(e - seg) : strlen(seg);
        if (len == 0 || (len == 1 && seg[0] == '.') || (len == 2 && seg[0] == '.' && seg[1] == '.')) return 0;
        if (!e) return 1;
        seg = e + 1;
    }
}

int qlm_hf_is_commit(const char *s) {
    for (int i = 0; i < 40; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return s[40] == 0;
}

int qlm_hf_offline(void) {
    const char *v = getenv("HF_HUB_OFFLINE");
    return v && (!strcmp(v, "1") || !strcasecmp(v, "on") || !strcasecmp(v, "yes") || !strcasecmp(v, "true"));
}

int qlm_hf_repo_dir(const char *repo, char *buf, size_t cap) {
    const char *cache = getenv("HF_HUB_CACHE"), *home = getenv("HF_HOME"), *user = getenv("HOME");
    const char *slash = strchr(repo, '/');
    int n;
    if (!slash) return qlm_errorf("%s: not a repository id ORG/NAME", repo);
    if (cache && *cache)
        n = snprintf(buf, cap, "%s/models--%.*s--%s", cache, (int)(slash - repo), repo, slash + 1);
    else if (home && *home)
        n = snprintf(buf, cap, "%s/hub/models--%.*s--%s", home, (int)(slash - repo), repo, slash + 1);
    else if (user && *user)
        n = snprintf(buf, cap, "%s/.cache/huggingface/hub/models--%.*s--%s", user, (int)(slash - repo), repo,
                     slash + 1);
    else
        return qlm_errorf("neither HF_HOME nor HOME is set: no place for the Hugging Face cache");
    if (n < 0 || (size_t)n >= cap) return qlm_errorf("%s: cache path too long", repo);
    return 0;
}

int qlm_hf_mkdirs(const char *path) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return qlm_errorf("%s: path too long", path);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p) continue;
        char c = *p;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return qlm_errorf("%s: cannot create: %s", buf, strerror(errno));
        if (!c) return 0;
        *p = c;
    }
}

int qlm_hf_read_ref(const char *repo_dir, const char *rev, char commit[41]) {
    if (qlm_hf_is_commit(rev)) {
        memcpy(commit, rev, 41);
        return 1;
    }
    char path[4400];
    snprintf(path, sizeof path, "%s/refs/%s", repo_dir, rev);
    FILE *f = fopen(path, "rb");
    if (!f) return errno == ENOENT || errno == ENOTDIR ? 0 : qlm_errorf("%s: %s", path, strerror(errno));
    char buf[64] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = 0;
    if (!qlm_hf_is_commit(buf)) return qlm_errorf("%s: not a commit hash", path);
    memcpy(commit, buf, 41);
    return 1;
}

int qlm_hf_write_ref(const char *repo_dir, const char *rev, const char *commit) {
    if (qlm_hf_is_commit(rev)) return 0; /* a commit needs no ref, as huggingface_hub does */
    char path[4400], dir[4400];
    snprintf(path, sizeof path, "%s/refs/%s", repo_dir, rev);
    snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(path, '/') - path), path);
    if (qlm_hf_mkdirs(dir) != 0) return -1;
    qlm_atomic_file af;
    if (qlm_atomic_open(&af, path) != 0) return -1;
    if (qlm_atomic_write(&af, commit, strlen(commit)) != 0) {
        qlm_atomic_abort(&af);
        return -1;
    }
    return qlm_atomic_commit(&af);
}

int qlm_hf_link_snapshot(const char *repo_dir, const char *commit, const char *rfilename, const char *blob) {
    char path[4400], dir[4400], target[2048] = "", tmp[4500];
    int n = snprintf(path, sizeof path, "%s/snapshots/%s/%s", repo_dir, commit, rfilename);
    if (n < 0 || (size_t)n >= sizeof path) return qlm_errorf("%s: path too long", rfilename);
    snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(path, '/') - path), path);
    if (qlm_hf_mkdirs(dir) != 0) return -1;
    /* snapshots/<commit>/a/b/file -> ../../../blobs/<blob>: one ".." per folder below the repo. */
    strcat(target, "../../");
    for (const char *p = rfilename; (p = strchr(p, '/')); p++) strcat(target, "../");
    strncat(target, "blobs/", sizeof target - strlen(target) - 1);
    strncat(target, blob, sizeof target - strlen(target) - 1);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    unlink(tmp);
    if (symlink(target, tmp) != 0) return qlm_errorf("%s: cannot create symlink: %s", tmp, strerror(errno));
    if (rename(tmp, path) != 0) {
        int err = errno;
        unlink(tmp);
        return qlm_errorf("%s: %s", path, strerror(err));
    }
    return 0;
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

int qlm_hf_resolve_model(const char *spec, char *out, size_t cap) {
    char repo[QLM_HF_REPO_MAX], rev[QLM_HF_REV_MAX], dir[4096], commit[41];
    struct stat st;
    if (stat(spec, &st) == 0 || !qlm_hf_parse_repo(spec, repo, rev)) return 0;
    if (qlm_hf_repo_dir(repo, dir, sizeof dir) != 0) return -1;
    int known = qlm_hf_read_ref(dir, rev, commit);
    if (known < 0) return -1;
    if (known) {
        int n = snprintf(out, cap, "%s/snapshots/%s", dir, commit);
        if (n < 0 || (size_t)n >= cap) return qlm_errorf("%s: cache path too long", spec);
        if (is_dir(out)) return 1;
    }
    if (qlm_hf_offline())
        return qlm_errorf("%s is not a local path and %s@%s is not in the Hugging Face cache (%s), and "
                          "HF_HUB_OFFLINE is set; get it with `qlm pull %s` while online",
                          spec, repo, rev, dir, spec);
    qlm_hf_pull_opts o = {.repo = repo, .rev = rev, .progress = 1};
    if (qlm_hf_pull(&o, out, cap) == 0) return 1;
    return qlm_error_context("%s is not a local file or folder, so it was taken as a Hugging Face repo id", spec);
}
