/* libtgs.so: how a reading moves a kernel's remembered length (compute.c keeps one per
 * kernel: function and grid size). Arithmetic alone, so that tests/c/kernel_length.c
 * checks the very rule the shim runs. */
#ifndef TGS_KERNEL_LENGTH_H
#define TGS_KERNEL_LENGTH_H

#include <stdint.h>

/* What a reading of t ns makes of a kernel's length `len` after `readings` readings, the
 * last of them `last`. The first reading is the length; the shorter of the first two then
 * (one that waited behind other work does not last); after that the length moves a
 * quarter of the way to each new reading. A reading longer than the length counts only as
 * far as the reading before it was long too, and as at most four times the length: one
 * reading that waited (a kernel preempted by another context's time slice, say) moves
 * nothing, and a kernel that has really grown longer is followed from its second long
 * reading on. A reading that counted for clearly less than itself (over a quarter and
 * over TGS_RECHECK_NS more than it counted for) asks for that second one at once
 * (`recheck`: the kernel is timed again whenever the timer is free), so that real growth
 * is followed from the kernel's next launch rather than its next sampled one, tens of
 * milliseconds later. Jitter asks for nothing: short kernels read a third either way from
 * one timing to the next (200-450 ns for an empty kernel on simgpu), and when every
 * reading above the last asked to be confirmed, a third of them did, which added about 70
 * instructions to each bounded opportunistic launch. (Each reading that waited used to move the length: on simgpu a
 * 1 ms kernel timed across production's 2 ms slice read 3 ms and made it 1.5 ms;
 * anticipation then fitted three kernels into production's 5 ms gaps instead of four or
 * five, and the job had about 0.8 of the idle time for a second, until a dozen more
 * readings had brought the length back within 1 %.) The length is never 0 (not timed). */
/* A microsecond: twice the resolution of the driver's event timings (about half a
 * microsecond, cuEventElapsedTime), and far below the gaps anticipation fits kernels into. */
#define TGS_RECHECK_NS 1000ull

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
