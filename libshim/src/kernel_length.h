/* libtgs.so: how a reading moves a kernel's remembered length (compute.c keeps one per
 * kernel: function and grid size). Arithmetic alone, so that tests/c/kernel_length.c
 * checks the very rule the shim runs. */
#ifndef TGS_KERNEL_LENGTH_H
#define TGS_KERNEL_LENGTH_H

#include <stdint.h>

/* A kernel's length after a reading of t ns, from its length `len` after `readings`
 * readings, the last of them `last`. The first reading is the length; the shorter of the
 * first two then (one that waited behind other work does not last); after that the length
 * moves a quarter of the way to each new reading. A reading longer than the length counts
 * only as far as the reading before it was long too, and as at most four times the
 * length: a kernel that has really grown longer is caught up with from its second long
 * reading on, and one reading that waited (a kernel preempted by another context's time
 * slice, say) moves nothing. (Each such reading used to: on simgpu a 1 ms kernel timed
 * across production's 2 ms slice read 3 ms and made the length 1.5 ms; anticipation then
 * fitted three kernels into production's 5 ms gaps instead of four or five, and the job
 * had about 0.8 of the idle time for a second, until a dozen more readings had brought
 * the length back within 1 %.) Never 0 (not timed). */
static inline uint64_t tgs_kernel_length_next(uint64_t len, uint64_t last, uint64_t readings, uint64_t t) {
    if (readings == 0)
        return t ? t : 1;
    if (readings == 1)
        return t && t < len ? t : len;
    uint64_t reach = last > len ? last : len; /* as far as a reading counts */
    if (reach > 4 * len)
        reach = 4 * len;
    return len - len / 4 + (t < reach ? t : reach) / 4;
}

#endif
