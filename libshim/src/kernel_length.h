/* libtgs.so: how a reading moves a kernel's remembered length (compute.c keeps one per
 * kernel: function and grid size). Arithmetic alone, so that tests/c/kernel_length.c
 * checks the very rule the shim runs. */
#ifndef TGS_KERNEL_LENGTH_H
#define TGS_KERNEL_LENGTH_H

#include <stdint.h>

/* A microsecond: twice the resolution of the driver's event timings (about half a
 * microsecond, cuEventElapsedTime), and far below the gaps anticipation fits kernels into. */
#define TGS_RECHECK_NS 1000ull

/* What a reading of t ns makes of a kernel's length `len` after `readings` readings, the
 * last of them `last`. The first reading is the length; the shorter of the first two then
 * (one that waited behind other work does not last); after that the length moves a
 * quarter of the way to each new reading. A reading longer than the length counts only as
 * far as the reading before it was long too, and as at most four times the length: one
 * reading that waited (a kernel timed across another context's time slice) moves
 * nothing, and a kernel that has really grown longer is followed from its second long
 * reading on. A reading clearly longer than it counted for (by over a quarter and over
 * TGS_RECHECK_NS) asks for that second one at once (`recheck`: the kernel is timed again
 * whenever the timer is free) rather than at its next sampled timing, tens of
 * milliseconds later; jitter asks for nothing (short kernels read a third either way from
 * one timing to the next). Why, with figures: docs/shim.md. The length is never 0.
 * A reading `confirms` a length known from two readings or more when it lies within half
 * of it either way, or within TGS_RECHECK_NS (an empty kernel's readings jitter by a
 * third and more): the shim times fewer of its launches while its readings confirm what
 * it knows (tgs_time_every_next). */
struct tgs_kernel_reading {
    uint64_t len;
    int recheck;
    int confirms;
};

static inline struct tgs_kernel_reading tgs_kernel_length_next(uint64_t len, uint64_t last, uint64_t readings,
                                                               uint64_t t) {
    struct tgs_kernel_reading r = {t ? t : 1, 0, 0};
    if (readings == 1)
        r.len = t && t < len ? t : len;
    if (readings < 2)
        return r;
    uint64_t reach = last > len ? last : len; /* as far as a reading counts */
    if (reach > 4 * len)
        reach = 4 * len;
    r.len = len - len / 4 + (t < reach ? t : reach) / 4;
    r.recheck = t > reach + reach / 4 && t - reach > TGS_RECHECK_NS;
    r.confirms = (t <= len + len / 2 && t >= len - len / 2) || (t > len ? t - len : len - t) <= TGS_RECHECK_NS;
    return r;
}

/* How many launches the shim lets pass, on average, per one it times (`every`: so far)
 * after a reading of a kernel it knew (timed twice or more before): twice as many after
 * one that confirmed its length, up to TGS_TIME_EVERY_MAX, and TGS_TIME_EVERY again
 * after one that did not. Each timing costs two event records and a read of the time
 * between them; a job whose kernels keep their lengths needs few. A reading of a kernel
 * it did not know leaves it (those are timed whenever the timer is free anyway). */
#define TGS_TIME_EVERY 32      /* launches per timed one, on average: at first and after news */
#define TGS_TIME_EVERY_MAX 256 /* and at most, while its readings confirm the lengths it knows */

static inline unsigned tgs_time_every_next(unsigned every, int known, int confirms) {
    if (!known)
        return every;
    if (!confirms)
        return TGS_TIME_EVERY;
    return every >= TGS_TIME_EVERY_MAX / 2 ? TGS_TIME_EVERY_MAX : 2 * every;
}

#endif
