/* Reads libtgs.so's clock (libshim/src/clock.c, built in) from several threads against
 * clock_gettime(CLOCK_MONOTONIC) read just before and just after each reading, pausing
 * now and then (up to 8 ms: past an anchor's span), and prints one JSON line:
 *   {"source": ..., "reads": N, "backwards": N, "max_behind_ns": N, "max_ahead_ns": N,
 *    "max_ahead_late_ns": N}
 * behind: below the clock_gettime before; ahead: above the one after; late: in the run's
 * last third; backwards: readings below the thread's previous one.
 *   clock CLOCKSOURCE MS THREADS [jump]
 * CLOCKSOURCE is taken for the kernel's ("-": read from /sys). jump: 50 ms in, the main
 * thread's anchor is moved 5 ms ahead, as a TSC that jumped would move it. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../libshim/src/clock.c"

static long g_ms;
static int g_jump;
static uint64_t g_start;
static void *g_main; /* the main thread's */

struct seen {
    unsigned long reads, backwards;
    uint64_t behind, ahead, ahead_late;
};

static void *reader(void *arg) {
    struct seen *s = arg;
    uint64_t last = 0, end = g_start + (uint64_t)g_ms * 1000000ull, late = end - (end - g_start) / 3;
    unsigned x = (unsigned)(uintptr_t)arg | 1u;
    int jumped = 0;
    for (;;) {
        uint64_t before = mono_ns();
        if (before >= end)
            break;
        if (g_jump && !jumped && arg == g_main && before >= g_start + 50000000ull && tgs_clock_at.fp) {
            tgs_clock_at.ns += 5000000ull;
            jumped = 1;
        }
        uint64_t t = tgs_now();
        uint64_t after = mono_ns();
        s->reads++;
        if (t < last)
            s->backwards++;
        last = t;
        if (before > t && before - t > s->behind)
            s->behind = before - t;
        if (t > after && t - after > s->ahead)
            s->ahead = t - after;
        if (t > after && after >= late && t - after > s->ahead_late)
            s->ahead_late = t - after;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        if (x % 4096 == 0) {
            struct timespec ts = {0, (long)(x % 8000000u)};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: clock CLOCKSOURCE MS THREADS [jump]\n");
        return 2;
    }
    tgs_clock_setup(strcmp(argv[1], "-") ? argv[1] : NULL);
    g_ms = atol(argv[2]);
    int n = atoi(argv[3]);
    g_jump = argc > 4 && !strcmp(argv[4], "jump");
    struct seen *seen = calloc((size_t)n, sizeof *seen);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    g_main = &seen[0];
    g_start = mono_ns();
    for (int i = 1; i < n; i++)
        pthread_create(&th[i], NULL, reader, &seen[i]);
    reader(&seen[0]);
    struct seen all = {0};
    for (int i = 0; i < n; i++) {
        if (i)
            pthread_join(th[i], NULL);
        all.reads += seen[i].reads;
        all.backwards += seen[i].backwards;
        all.behind = seen[i].behind > all.behind ? seen[i].behind : all.behind;
        all.ahead = seen[i].ahead > all.ahead ? seen[i].ahead : all.ahead;
        all.ahead_late = seen[i].ahead_late > all.ahead_late ? seen[i].ahead_late : all.ahead_late;
    }
    printf("{\"source\": \"%s\", \"reads\": %lu, \"backwards\": %lu, \"max_behind_ns\": %llu, \"max_ahead_ns\": %llu, "
           "\"max_ahead_late_ns\": %llu}\n",
           tgs_clock_source(), all.reads, all.backwards, (unsigned long long)all.behind, (unsigned long long)all.ahead,
           (unsigned long long)all.ahead_late);
    return 0;
}
