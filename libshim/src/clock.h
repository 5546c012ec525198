/* libtgs.so's clock: CLOCK_MONOTONIC in ns, the clock tgsd and the other processes read
 * (tgs_now; the coarse clock and sleeping until a time are here too).
 *
 * Where the kernel keeps that clock by the TSC itself (its clocksource is "tsc": it found
 * the TSC invariant and in step on every CPU), a thread reads the TSC and scales it from
 * an anchor: a (TSC, CLOCK_MONOTONIC) pair it took at most TGS_CLOCK_SPAN ticks before
 * (a few milliseconds), by the process's ns per tick measured over its life. That costs
 * a launch about 9 ns against 22 for clock_gettime on an Intel Xeon VM (the vDSO orders
 * its TSC read with a fence and loops on the kernel's sequence count); an opportunistic
 * launch under the in-flight bound or anticipation reads it once.
 * Elsewhere, and until the ticks are measured (the process's first millisecond), it is
 * clock_gettime. Scaled time stays within a microsecond or so of CLOCK_MONOTONIC (the
 * anchor's pair is read within a few hundred ns; the measured rate's error over a span);
 * each thread's readings never go back (a new anchor starts no lower than the old one's
 * reading). Standalone (tests/c/clock.c builds it alone). */
#ifndef TGS_CLOCK_H
#define TGS_CLOCK_H

#include <stdint.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#define TGS_CLOCK_HIDDEN __attribute__((visibility("hidden")))
#define TGS_CLOCK_SPAN (1ull << 24) /* ticks an anchor serves: 5.6 ms at 3 GHz */

struct tgs_clock_anchor {
    uint64_t tsc;   /* the pair: the TSC, */
    uint64_t ns;    /* and CLOCK_MONOTONIC then */
    uint64_t fp;    /* ns per tick, 32.32 fixed point (0: not scaling the TSC) */
    uint64_t floor; /* the old anchor's reading then: this thread's clock goes no lower */
};
TGS_CLOCK_HIDDEN extern __thread struct tgs_clock_anchor tgs_clock_at __attribute__((tls_model("initial-exec")));
TGS_CLOCK_HIDDEN uint64_t tgs_clock_anchor(void); /* clock_gettime, and a new anchor where the TSC is scaled */
TGS_CLOCK_HIDDEN const char *tgs_clock_source(void); /* "tsc", or why it is clock_gettime */
/* Which source, by the kernel's clocksource name (NULL: read it from /sys); once, before
 * the first reading, else on it. */
TGS_CLOCK_HIDDEN void tgs_clock_setup(const char *clocksource);
/* CLOCK_MONOTONIC to within its tick (a few milliseconds), for what needs no more: 6.5 ns
 * on an Intel Xeon VM, against 9 for tgs_now scaling the TSC and 22 for clock_gettime. */
TGS_CLOCK_HIDDEN uint64_t tgs_now_coarse(void);
TGS_CLOCK_HIDDEN void tgs_sleep_until(uint64_t t_ns); /* a CLOCK_MONOTONIC time, through signals */

static inline uint64_t tgs_now(void) {
#if defined(__x86_64__)
    if (__builtin_expect(tgs_clock_at.fp != 0, 1)) { /* no TSC read where it is not scaled */
        uint64_t d = __rdtsc() - tgs_clock_at.tsc;
        if (__builtin_expect(d < TGS_CLOCK_SPAN, 1)) {
            uint64_t t = tgs_clock_at.ns + ((d * tgs_clock_at.fp) >> 32), floor = tgs_clock_at.floor;
            return t > floor ? t : floor;
        }
    }
#endif
    return tgs_clock_anchor();
}

#endif
