#include "cpu_load.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* This process's threads in state R (running or runnable), or -1. */
static int own_running(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int running = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[64], line[512];
        snprintf(path, sizeof path, "/proc/self/task/%.32s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue; /* the thread ended */
        size_t n = fread(line, 1, sizeof line - 1, f);
        fclose(f);
        line[n] = '\0';
        /* "tid (comm) S ...": comm may hold spaces and parentheses, so the state follows the last ')'. */
        const char *close = strrchr(line, ')');
        if (close && close[1] == ' ' && close[2] == 'R') running++;
    }
    closedir(d);
    return running;
}

int qlm_cpu_others_running(void) {
    int fewest = -1;
    for (int i = 0; i < 5; i++) {
        int own = own_running();
        FILE *f = fopen("/proc/loadavg", "r");
        int running = 0;
        int ok = f && fscanf(f, "%*f %*f %*f %d/", &running) == 1;
        if (f) fclose(f);
        if (!ok || own < 0) return -1;
        /* The reading thread is runnable in both counts. */
        int others = running - (own > 0 ? own : 1);
        if (others < 0) others = 0;
        if (fewest < 0 || others < fewest) fewest = others;
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
    return fewest;
}
