/* Where a qlm run's threads wait for one another (dev time only): an LD_PRELOAD library that wraps
 * libgomp's GOMP_parallel, times each parallel region and the gap before it (the calling thread
 * working alone while the others wait), and prints at exit the totals per call site:
 *
 *   gcc -O2 -shared -fPIC tools/gomp_gaps.c -o /tmp/gomp_gaps.so -ldl
 *   OPENBLAS_NUM_THREADS=1 LD_PRELOAD=/tmp/gomp_gaps.so build/qlm summarize ... 2> gaps.txt
 *   addr2line -f -i -e build/qlm 0xOFFSET       # a site's function, from its "(+0xOFFSET)"
 *
 * OPENBLAS_NUM_THREADS=1 spares qlm its restart (cli/blas_core.c), which would print the first
 * process's empty table too. Regions from one thread only, as qlm opens them (no nesting). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef void (*gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);

enum { MAX_SITES = 128 };

static struct {
    void *at;
    long regions;
    double inside, gap_before;
} sites[MAX_SITES];
static double first_start, last_end;
static long overflowed;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The call site's slot, or -1 when every slot holds another. */
static int site_of(void *at) {
    for (int i = 0; i < MAX_SITES; i++) {
        if (sites[i].at == at) return i;
        if (!sites[i].at) {
            sites[i].at = at;
            return i;
        }
    }
    return -1;
}

void GOMP_parallel(void (*fn)(void *), void *data, unsigned threads, unsigned flags) {
    static gomp_parallel_fn real;
    if (!real && !(real = (gomp_parallel_fn)dlsym(RTLD_NEXT, "GOMP_parallel"))) {
        fprintf(stderr, "gomp_gaps: libgomp's GOMP_parallel not found\n");
        abort();
    }
    const double start = now_s();
    const int s = site_of(__builtin_return_address(0));
    real(fn, data, threads, flags);
    const double end = now_s();
    if (s < 0) {
        overflowed++;
    } else {
        sites[s].regions++;
        sites[s].inside += end - start;
        if (last_end > 0) sites[s].gap_before += start - last_end;
    }
    if (first_start == 0) first_start = start;
    last_end = end;
}

__attribute__((destructor)) static void report(void) {
    double inside = 0, gaps = 0;
    long regions = 0;
    for (int i = 0; i < MAX_SITES && sites[i].at; i++) {
        inside += sites[i].inside;
        gaps += sites[i].gap_before;
        regions += sites[i].regions;
    }
    fprintf(stderr, "gomp_gaps: %ld regions, %.3f s inside them, %.3f s in the gaps before them, %.3f s from the first to the last\n",
            regions, inside, gaps, last_end - first_start);
    for (int i = 0; i < MAX_SITES && sites[i].at; i++) {
        char **name = backtrace_symbols(&sites[i].at, 1);
        fprintf(stderr, "  %-56s %9ld regions %8.3f s inside %8.3f s gap before\n", name ? name[0] : "?",
                sites[i].regions, sites[i].inside, sites[i].gap_before);
        free(name);
    }
    if (overflowed) fprintf(stderr, "gomp_gaps: %ld regions from sites past the first %d not counted\n", overflowed, MAX_SITES);
}
