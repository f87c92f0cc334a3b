/* The Hugging Face cache as huggingface_hub lays it out, so both share downloads:
 *   $HF_HOME/hub/models--ORG--NAME/blobs/<etag>           file contents, named by sha256 (LFS) or git sha1
 *   $HF_HOME/hub/models--ORG--NAME/refs/<revision>        the commit a branch or tag pointed at
 *   $HF_HOME/hub/models--ORG--NAME/snapshots/<commit>/<path>  relative symlinks to ../../blobs/<etag>
 * HF_HUB_CACHE overrides the hub folder; HF_HOME defaults to ~/.cache/huggingface. */
#ifndef QLM_HF_CACHE_H
#define QLM_HF_CACHE_H

#include <stddef.h>

enum { QLM_HF_REPO_MAX = 200, QLM_HF_REV_MAX = 256 };

/* Splits "ORG/NAME[@REV]" (exactly one '/', hub-valid characters) into repo and rev ("main" by
 * default). Returns 1 if spec is such a repo id, 0 if it is not (nothing set). */
int qlm_hf_parse_repo(const char *spec, char repo[QLM_HF_REPO_MAX], char rev[QLM_HF_REV_MAX]);
/* A revision is a branch, tag or commit: [A-Za-z0-9._-/] without "..", "//" or a leading '/'. */
int qlm_hf_valid_rev(const char *rev);
/* A path inside a repository from the API: relative, no "." or ".." components, no empty ones. */
int qlm_hf_valid_rfilename(const char *path);
/* 40 lowercase hex digits. */
int qlm_hf_is_commit(const char *s);
/* HF_HUB_OFFLINE set to 1/ON/YES/TRUE. */
int qlm_hf_offline(void);

/* <hub cache>/models--ORG--NAME. */
int qlm_hf_repo_dir(const char *repo, char *buf, size_t cap);
/* The commit rev names: rev itself when it is a commit, else the content of refs/<rev>.
 * Returns 1 if known, 0 if not cached, -1 on error. */
int qlm_hf_read_ref(const char *repo_dir, const char *rev, char commit[41]);
int qlm_hf_write_ref(const char *repo_dir, const char *rev, const char *commit);
/* Points snapshots/<commit>/<rfilename> at blobs/<blob> with a relative symlink (replaced
 * atomically if present). */
int qlm_hf_link_snapshot(const char *repo_dir, const char *commit, const char *rfilename, const char *blob);
/* mkdir -p. */
int qlm_hf_mkdirs(const char *path);

/* What -m accepts as a hub model: returns 0 if spec is not a repo id (or is an existing local
 * path); 1 with the snapshot folder in out when it is cached or has just been pulled (default file
 * selection); -1 with the error set (offline and not cached, or the pull failed). */
int qlm_hf_resolve_model(const char *spec, char *out, size_t cap);

#endif
