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

/* ---------- a function's lengths on the grid sizes timed ----------
 * compute.c keeps, per function (or graph), its lengths on up to TGS_FN_GRIDS grid sizes
 * timed, for its kernels on grids not timed yet (a framework's dynamic shapes). These are
 * the rules for which place a reading goes in and which place a kernel not timed on its
 * grid takes its length from; tests/c/fn_places.c runs them. */

/* A kernel not timed on its grid runs as its function on a grid at most this many times
 * larger or smaller; farther, it is taken as never timed. Kernels of one function on
 * nearby grids run alike more often than kernels of different ones; a function's kernels
 * on grids of their own may not: a job's 2 ms kernels on twice the blocks of its 10 us
 * ones, taken for 10 us, were queued ten at a time beside production, which kept
 * 0.90-0.92 of its kernels for the job's first 1.5 s in half the runs on simgpu. */
#define TGS_FN_NEAR_RATIO 2.0

static inline double tgs_grid_ratio(uint64_t a, uint64_t b) {
    return a > b ? (double)a / (double)(b ? b : 1) : (double)b / (double)(a ? a : 1);
}

/* The place of `n` (0: empty) whose grid size lies nearest `blocks` by ratio, the first
 * of equals (n: all empty), and that ratio in *ratio. */
static inline unsigned tgs_fn_closest(const uint64_t *b, unsigned n, uint64_t blocks, double *ratio) {
    unsigned best = n;
    *ratio = 0;
    for (unsigned i = 0; i < n; i++) {
        if (!b[i])
            continue;
        double r = tgs_grid_ratio(b[i], blocks);
        if (best == n || r < *ratio) {
            best = i;
            *ratio = r;
        }
    }
    return best;
}

/* The place of `n` (grid sizes `b`, 0: empty; they fill in order) a reading on `blocks`
 * goes in: that grid size's own, else an empty one, else the place of the grid size
 * nearest it (by ratio) if no two places lie nearer each other than that, else the place
 * of whichever of the two nearest each other lies nearer it. So the places keep the
 * spread of grid sizes timed: a function launched on small grids all the time and on a
 * large one now and then (a job's short kernels and its long ones, on grids of their own)
 * keeps the large one. Always taking the nearest place, a reading on a small grid nearer
 * the large one than any other place took the large one's. */
static inline unsigned tgs_fn_place(const uint64_t *b, unsigned n, uint64_t blocks) {
    for (unsigned i = 0; i < n; i++)
        if (b[i] == blocks || !b[i])
            return i;
    double nearest_ratio;
    unsigned nearest = tgs_fn_closest(b, n, blocks, &nearest_ratio), p = 0, q = 0;
    double pair_ratio = 0;
    for (unsigned i = 0; i < n; i++) {
        for (unsigned j = i + 1; j < n; j++) {
            double rp = tgs_grid_ratio(b[i], b[j]);
            if (!pair_ratio || rp < pair_ratio) {
                p = i;
                q = j;
                pair_ratio = rp;
            }
        }
    }
    if (nearest_ratio <= pair_ratio)
        return nearest;
    return tgs_grid_ratio(b[p], blocks) < tgs_grid_ratio(b[q], blocks) ? p : q;
}

/* The place of `n` (0: empty) whose length a kernel on `blocks` is taken to run: the grid
 * size nearest it (by ratio), if within TGS_FN_NEAR_RATIO; else n. */
static inline unsigned tgs_fn_nearest(const uint64_t *b, unsigned n, uint64_t blocks) {
    double r;
    unsigned at = tgs_fn_closest(b, n, blocks, &r);
    return at < n && r <= TGS_FN_NEAR_RATIO ? at : n;
}

#endif
