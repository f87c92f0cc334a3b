/* File digests with OpenSSL's EVP interface (libcrypto). */
#include "hf_hash.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/error.h"

/* Digest of prefix (may be empty) followed by the file's bytes, as lowercase hex. */
static int file_digest(const char *path, const EVP_MD *md, const char *prefix, size_t prefix_len, char *hex) {
    FILE *f = fopen(path, "rb");
    if (!f) return qlm_errorf("%s: cannot open: %s", path, strerror(errno));
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int ok = ctx && EVP_DigestInit_ex(ctx, md, NULL) && EVP_DigestUpdate(ctx, prefix, prefix_len);
    unsigned char buf[1 << 16];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, f)) > 0) ok = EVP_DigestUpdate(ctx, buf, n);
    int read_error = ferror(f);
    fclose(f);
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    ok = ok && !read_error && EVP_DigestFinal_ex(ctx, out, &len);
    EVP_MD_CTX_free(ctx);
    if (!ok) return qlm_errorf("%s: %s while hashing", path, read_error ? "read error" : "digest failure");
    for (unsigned i = 0; i < len; i++) snprintf(hex + 2 * i, 3, "%02x", out[i]);
    return 0;
}

int qlm_file_sha256(const char *path, char hex[65]) {
    return file_digest(path, EVP_sha256(), "", 0, hex);
}

int qlm_file_git_sha1(const char *path, char hex[41]) {
    struct stat st;
    if (stat(path, &st) != 0) return qlm_errorf("%s: %s", path, strerror(errno));
    char header[64];
    int n = snprintf(header, sizeof header, "blob %lld", (long long)st.st_size);
    return file_digest(path, EVP_sha1(), header, (size_t)n + 1, hex); /* the header's NUL is hashed too */
}
