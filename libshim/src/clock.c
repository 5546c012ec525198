/* libtgs.so's clock (clock.h): anchors, the TSC's ns per tick, the coarse clock and sleeping. */
#include "glibc_compat.h"

#include "clock.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

__thread struct tgs_clock_anchor tgs_clock_at __attribute__((tls_model("initial-exec")));

#define PAIR_TICKS (1ull << 9)       /* a pair read further apart than this (170 ns at 3 GHz) is read again */
#define MEASURE_NS 1000000ull        /* ticks are first measured over this long, then over ever longer */
#define JUMP_NS 1000000ull           /* scaled time this far from CLOCK_MONOTONIC: the TSC jumped */
#define FP_ONE 4294967296.0

enum source { UNSET, TSC, NOT_TSC, NO_SYS, NO_PAIR, JUMPED, NOT_X86 };
static const char *const source_words[] = {
    [UNSET] = "clock_gettime (not set up yet)",
    [TSC] = "tsc",
    [NOT_TSC] = "clock_gettime (the kernel's clocksource is not the TSC)",
    [NO_SYS] = "clock_gettime (the kernel's clocksource could not be read)",
    [NO_PAIR] = "clock_gettime (the TSC and clock_gettime could not be read within 170 ns of each other: under valgrind, say)",
    [JUMPED] = "clock_gettime (the TSC jumped against CLOCK_MONOTONIC)",
    [NOT_X86] = "clock_gettime (no TSC on this architecture)",
};
static int g_source = UNSET;
static uint64_t g_fp;           /* ns per tick so far, 32.32 fixed point (0: not measured) */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static const char *g_asked; /* tgs_clock_setup's name */

static uint64_t ns_of(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t mono_ns(void) { return ns_of(CLOCK_MONOTONIC); }

uint64_t tgs_now_coarse(void) { return ns_of(CLOCK_MONOTONIC_COARSE); }

void tgs_sleep_until(uint64_t t_ns) {
    struct timespec ts = {.tv_sec = (time_t)(t_ns / 1000000000ull), .tv_nsec = (long)(t_ns % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

#if defined(__x86_64__)
static uint64_t g_tsc0, g_ns0; /* the first pair: ticks are measured from it */

/* A (TSC, CLOCK_MONOTONIC) pair read close together (the TSC at the middle); 0 where
 * none was in four tries (the thread was preempted or interrupted each time). */
static int pair(uint64_t *tsc, uint64_t *ns) {
    for (int i = 0; i < 4; i++) {
        uint64_t a = __rdtsc();
        *ns = mono_ns();
        uint64_t b = __rdtsc();
        if (b - a < PAIR_TICKS) {
            *tsc = a + (b - a) / 2;
            return 1;
        }
    }
    return 0;
}

/* The anchor's reading at `tsc`; 0 where it has none, or far from its span (2^32 ticks:
 * the product stays within 64 bits). */
static uint64_t scaled(const struct tgs_clock_anchor *at, uint64_t tsc) {
    uint64_t d = tsc - at->tsc;
    return at->fp && d < (1ull << 32) ? at->ns + ((d * at->fp) >> 32) : 0;
}
#endif

/* Where CLOCK_MONOTONIC comes from (enum source), by the kernel's clocksource's name. */
static int source(void) {
#if defined(__x86_64__)
    char name[32] = "";
    if (g_asked) {
        strncpy(name, g_asked, sizeof name - 1);
    } else {
        int fd = open("/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY | O_CLOEXEC);
        ssize_t n = fd < 0 ? -1 : read(fd, name, sizeof name - 1);
        if (fd >= 0)
            close(fd);
        if (n <= 0)
            return NO_SYS;
        name[n] = 0;
        name[strcspn(name, "\n")] = 0;
    }
    if (strcmp(name, "tsc") != 0)
        return NOT_TSC;
    return pair(&g_tsc0, &g_ns0) ? TSC : NO_PAIR;
#else
    return NOT_X86;
#endif
}

static void set_up(void) { __atomic_store_n(&g_source, source(), __ATOMIC_RELEASE); }

void tgs_clock_setup(const char *clocksource) {
    g_asked = clocksource;
    pthread_once(&g_once, set_up);
}

const char *tgs_clock_source(void) {
    int s = __atomic_load_n(&g_source, __ATOMIC_RELAXED);
    return s == TSC && !__atomic_load_n(&g_fp, __ATOMIC_RELAXED)
               ? "tsc (clock_gettime for a millisecond, while its ticks are measured)"
               : source_words[s];
}

uint64_t tgs_clock_anchor(void) {
    if (__builtin_expect(__atomic_load_n(&g_source, __ATOMIC_ACQUIRE) == UNSET, 0))
        pthread_once(&g_once, set_up);
    struct tgs_clock_anchor *at = &tgs_clock_at;
#if defined(__x86_64__)
    uint64_t tsc, ns;
    if (__atomic_load_n(&g_source, __ATOMIC_RELAXED) == TSC && pair(&tsc, &ns)) {
        uint64_t was = scaled(at, tsc), floor = was > at->floor ? was : at->floor;
        if (was && (was > ns + JUMP_NS || ns > was + JUMP_NS)) {
            /* the TSC moved against the kernel's clock (a VM moved to another host, say):
             * clock_gettime from now on, each thread from the end of its anchor's span */
            __atomic_store_n(&g_source, JUMPED, __ATOMIC_RELAXED);
        } else {
            if (ns - g_ns0 >= MEASURE_NS && tsc > g_tsc0) {
                /* over the process's life so far: a TSC of 1 GHz or more has under one ns a tick */
                double per = (double)(ns - g_ns0) / (double)(tsc - g_tsc0) * FP_ONE;
                if (per > 0 && per < FP_ONE)
                    __atomic_store_n(&g_fp, (uint64_t)per, __ATOMIC_RELAXED);
            }
            at->tsc = tsc;
            at->ns = ns;
            at->fp = __atomic_load_n(&g_fp, __ATOMIC_RELAXED);
            at->floor = floor;
            return ns > floor ? ns : floor;
        }
    }
    if (at->fp) { /* clock_gettime from here; this thread holds still until it catches up */
        uint64_t was = scaled(at, __rdtsc());
        if (was > at->floor)
            at->floor = was;
        at->fp = 0;
    }
#endif
    uint64_t ns_now = mono_ns();
    return ns_now > at->floor ? ns_now : at->floor;
}
