/* Who may make a request (see internal.h): a web page the user visits can make the browser send
 * requests to a server on the loopback, directly or through a DNS name rebound to 127.0.0.1, so
 * such requests are told apart by their Host, Origin and Content-Type headers. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

/* The name part of a Host header ("[::1]:8080" -> "[::1]", "localhost:80" -> "localhost"). */
static size_t host_name_len(const char *host) {
    if (host[0] == '[') {
        const char *end = strchr(host, ']');
        return end ? (size_t)(end - host) + 1 : strlen(host);
    }
    const char *colon = strchr(host, ':');
    return colon ? (size_t)(colon - host) : strlen(host);
}

static int name_is(const char *host, size_t n, const char *name) { return strlen(name) == n && !strncasecmp(host, name, n); }

static int is_loopback(const char *addr) {
    return !strncmp(addr, "127.", 4) || !strcasecmp(addr, "localhost") || !strcmp(addr, "::1");
}

int guard_host_ok(const qlm_server_config *cfg, const char *host) {
    const char *bound = cfg->host ? cfg->host : "127.0.0.1";
    if (!host || !is_loopback(bound)) return 1; /* a public address is reached under any name */
    size_t n = host_name_len(host);
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name - 1 ? n : sizeof name - 1), host);
    /* The loopback under its own names only: a DNS name rebound to it is what this refuses. */
    return name_is(host, n, "localhost") || name_is(host, n, "[::1]") || name_is(host, n, bound) ||
           (!strncmp(name, "127.", 4) && strspn(name, "0123456789.") == n);
}

int guard_origin(const qlm_server_config *cfg, const char *origin, const char *host) {
    if (!origin) return 0; /* not sent by a browser's cross-origin machinery */
    if (cfg->cors_origin && (!strcmp(cfg->cors_origin, "*") || !strcasecmp(cfg->cors_origin, origin))) return 1;
    /* The server's own pages: "http://" + the Host the request was sent to. */
    if (host && !strncasecmp(origin, "http://", 7) && !strcasecmp(origin + 7, host)) return 0;
    return -1;
}

int guard_json_type(const char *content_type) {
    static const char json[] = "application/json";
    if (!content_type || strncasecmp(content_type, json, sizeof json - 1) != 0) return 0;
    char next = content_type[sizeof json - 1];
    return next == 0 || next == ';' || next == ' ' || next == '\t';
}

int guard_adapter_path(const char *adapter_dir, const char *path, char **resolved) {
    *resolved = NULL;
    char dir[PATH_MAX], full[PATH_MAX], real[PATH_MAX];
    if (!adapter_dir || !realpath(adapter_dir, dir)) return -1;
    if (path[0] == '/') snprintf(full, sizeof full, "%s", path);
    else if ((size_t)snprintf(full, sizeof full, "%s/%s", dir, path) >= sizeof full) return -1;
    if (!realpath(full, real)) return -1;
    size_t n = strlen(dir);
    if (strncmp(real, dir, n) != 0 || real[n] != '/') return -1; /* the folder itself, or outside it */
    return (*resolved = strdup(real)) ? 0 : -1;
}
