#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char g_error[1024];

int qlm_errorf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_error, sizeof g_error, fmt, ap);
    va_end(ap);
    return -1;
}

int qlm_error_context(const char *fmt, ...) {
    char old[sizeof g_error];
    memcpy(old, g_error, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(g_error, sizeof g_error, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n + 2 < sizeof g_error) {
        size_t used = (size_t)n;
        memcpy(g_error + used, ": ", 2);
        used += 2;
        size_t room = sizeof g_error - used - 1, len = strnlen(old, room);
        memcpy(g_error + used, old, len);
        g_error[used + len] = 0;
    }
    return -1;
}

const char *qlm_last_error(void) { return g_error[0] ? g_error : "unknown error"; }

void qlm_clear_error(void) { g_error[0] = 0; }
