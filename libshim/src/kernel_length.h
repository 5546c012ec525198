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
 * one timing to the next). Why, with figures: docs/shim.md. The length is never 0. */
struct tgs_kernel_reading {
    uint64_t len;
    int recheck;
};

static inline struct tgs_kernel_reading tgs_kernel_length_next(uint64_t len, uint64_t last, uint64_t readings,
                                                               uint64_t t) {
    struct tgs_kernel_reading r = {t ? t : 1, 0};
    if (readings == 1)
        r.len = t && t < len ? t : len;
    if (readings < 2)
        return r;
    uint64_t reach = last > len ? last : len; /* as far as a reading counts */
    if (reach > 4 * len)
        reach = 4 * len;
    r.len = len - len / 4 + (t < reach ? t : reach) / 4;
    r.recheck = t > reach + reach / 4 && t - reach > TGS_RECHECK_NS;
    return r;
}

#endif
