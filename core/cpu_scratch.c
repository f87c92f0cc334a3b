/* The per-thread lists behind qlm_cpu_scratch: one pthread key whose destructor, run as a thread
 * ends, frees the regions of that thread. */
#include "cpu_scratch.h"

#include <pthread.h>

static pthread_key_t g_key;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_key_made;
static _Thread_local qlm_cpu_scratch *t_last; /* the thread's latest tracked region */

static void free_regions(void *last) {
    for (qlm_cpu_scratch *s = last, *next; s; s = next) {
        next = s->next;
        free(s->p);
        *s = (qlm_cpu_scratch){0};
    }
}

static void make_key(void) {
    g_key_made = pthread_key_create(&g_key, free_regions) == 0;
}

int qlm_cpu_scratch_track(qlm_cpu_scratch *s) {
    if (pthread_once(&g_once, make_key) != 0 || !g_key_made || pthread_setspecific(g_key, s) != 0) return -1;
    s->next = t_last;
    t_last = s;
    return 0;
}
