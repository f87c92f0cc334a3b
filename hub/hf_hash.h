/* SHA-256 and SHA-1 of a file, as lowercase hex: the hub names LFS blobs by the sha256 of their
 * content and other files by their git blob id, sha1("blob <size>\0" + content). */
#ifndef QLM_HF_HASH_H
#define QLM_HF_HASH_H

/* hex needs 65 bytes. Returns 0, or -1 with the error set. */
int qlm_file_sha256(const char *path, char hex[65]);
/* The git blob id of a file; hex needs 41 bytes. */
int qlm_file_git_sha1(const char *path, char hex[41]);

#endif
