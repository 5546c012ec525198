/* simgpu: the compute engine as a timeline.
 *
 * Each device has one engine. Contexts queue kernels (in order within a context);
 * the engine runs one context at a time and, when another context has work, switches
 * round-robin at the end of each time slice, preempting a longer kernel and resuming
 * it later (compute preemption). Nothing sleeps under a lock: the timeline is settled
 * lazily, up to "now", by whichever process touches the device next, and a waiter
 * sleeps until the moment its work is predicted to finish (re-predicting if new work
 * arrived in between). Because every kernel arrives at "now" after the timeline has
 * been settled to "now", the result does not depend on how often anyone settles it.
 */
#include "sim.h"

#include <string.h>

struct eng_view {
    uint64_t t;
    int32_t cur, last;
    uint64_t slice_end;
    uint64_t head[SIM_MAX_CTX];
    int64_t rem[SIM_MAX_CTX];
};

#define FOR_LIVE(d, i) for (uint64_t _m = (d)->live_mask, i; _m && ((i = (uint64_t)__builtin_ctzll(_m)), 1); _m &= _m - 1)

static void view_load(struct sim_device *d, struct eng_view *v) {
    v->t = d->sim_ns;
    v->cur = d->cur;
    v->last = d->last;
    v->slice_end = d->slice_end_ns;
    FOR_LIVE(d, i) {
        struct sim_ctx *c = &d->ctx[i];
        v->head[i] = c->head;
        v->rem[i] = c->head < c->tail ? c->q[c->head % SIM_QCAP].remaining_ns : 0;
    }
}

static void view_store(struct sim_device *d, const struct eng_view *v) {
    d->sim_ns = v->t;
    d->cur = v->cur;
    d->last = v->last;
    d->slice_end_ns = v->slice_end;
    FOR_LIVE(d, i) {
        struct sim_ctx *c = &d->ctx[i];
        c->head = v->head[i];
        if (c->head < c->tail)
            c->q[c->head % SIM_QCAP].remaining_ns = v->rem[i];
    }
}

static inline int ready(struct sim_device *d, const struct eng_view *v, int32_t i) {
    return (d->live_mask >> i & 1) && v->head[i] < d->ctx[i].tail;
}

/* The next ready context after `after`, round-robin over the live ones. */
static int32_t next_ready(struct sim_device *d, const struct eng_view *v, int32_t after) {
    int32_t first = -1;
    FOR_LIVE(d, i) {
        if (!ready(d, v, (int32_t)i))
            continue;
        if ((int32_t)i > after)
            return (int32_t)i;
        if (first < 0)
            first = (int32_t)i;
    }
    return first;
}

static int other_ready(struct sim_device *d, const struct eng_view *v, int32_t cur) {
    FOR_LIVE(d, i)
        if ((int32_t)i != cur && ready(d, v, (int32_t)i))
            return 1;
    return 0;
}

/* Of a kernel's run from `was` to `now` ns before its end, the part on the bus (its last
 * `bus` ns): migrate_ns grows with busy_ns, so that no window of a context's accounting
 * has more time on the bus than on the engine. */
static uint64_t bus_part(int64_t bus, int64_t was, int64_t now) {
    int64_t a = was < bus ? was : bus, b = now <= 0 ? 0 : now < bus ? now : bus;
    return a > b ? (uint64_t)(a - b) : 0;
}

/* Runs the timeline in v from v->t up to `until`, or until context `tgt` has completed
 * everything below `tgt_head` (tgt < 0: no target). Returns the time the target was
 * reached, or UINT64_MAX. With commit set, completions and busy time are accounted
 * in the shared state as they happen. */
static uint64_t run(struct sim_device *d, struct eng_view *v, uint64_t until, int32_t tgt, uint64_t tgt_head,
                    int commit) {
    const uint64_t slice = g_sim.st->set.timeslice_ns;
    if (d->live_mask == 0) {
        if (v->t < until)
            v->t = until;
        return UINT64_MAX;
    }
    for (;;) {
        if (tgt >= 0 && v->head[tgt] >= tgt_head)
            return v->t;
        if (v->t >= until)
            return UINT64_MAX;
        if (v->cur < 0 || !ready(d, v, v->cur)) {
            int32_t n = next_ready(d, v, v->cur >= 0 ? v->cur : v->last);
            if (n < 0) { /* idle until something arrives */
                v->cur = -1;
                v->t = until;
                continue;
            }
            if (n != v->cur && commit)
                d->switches++;
            v->cur = n;
            v->last = n;
            v->slice_end = v->t + slice;
        }
        int32_t c = v->cur;
        int others = other_ready(d, v, c);
        uint64_t end = v->t + (uint64_t)v->rem[c];
        if (others && v->slice_end < end)
            end = v->slice_end;
        if (end > until)
            end = until;
        uint64_t dt = end - v->t;
        struct sim_ctx *cx = &d->ctx[c];
        int64_t was = v->rem[c];
        v->rem[c] -= (int64_t)dt;
        v->t = end;
        if (commit) {
            cx->busy_ns += dt;
            d->busy_ns += dt;
            cx->migrate_ns += bus_part(cx->q[v->head[c] % SIM_QCAP].bus_ns, was, v->rem[c]);
            if (others)
                FOR_LIVE(d, i)
                    if ((int32_t)i != c && ready(d, v, (int32_t)i))
                        d->ctx[i].waited_ns += dt;
        }
        if (v->rem[c] <= 0) {
            struct sim_item *it = &cx->q[v->head[c] % SIM_QCAP];
            if (commit) {
                it->remaining_ns = 0;
                it->end_ns = v->t;
                cx->kernels++;
                cx->blocks += it->blocks;
            }
            v->head[c]++;
            v->rem[c] = v->head[c] < cx->tail ? cx->q[v->head[c] % SIM_QCAP].remaining_ns : 0;
        }
        if (v->t >= v->slice_end) {
            if (others) {
                int32_t n = next_ready(d, v, c);
                if (n != c && commit)
                    d->switches++;
                v->cur = n;
                v->last = n;
                v->slice_end = v->t + slice;
            } else {
                /* alone on the engine: slices keep their cadence */
                v->slice_end += ((v->t - v->slice_end) / slice + 1) * slice;
            }
        }
    }
}

void eng_advance(struct sim_device *d, uint64_t now) {
    if (now > d->live_check_ns + 100000000ull)
        sim_reclaim_dead(d, now);
    if (now <= d->sim_ns)
        return;
    struct eng_view v;
    view_load(d, &v);
    run(d, &v, now, -1, 0, 1);
    view_store(d, &v);
    sim_sample_util(d, now);
}

uint64_t eng_predict(struct sim_device *d, uint32_t slot, uint64_t head) {
    if (d->ctx[slot].state != CTX_LIVE || d->ctx[slot].head >= head)
        return d->sim_ns;
    struct eng_view v;
    view_load(d, &v);
    uint64_t t = run(d, &v, UINT64_MAX, (int32_t)slot, head, 0);
    return t == UINT64_MAX ? d->sim_ns : t;
}

static int still_mine(struct sim_device *d, uint32_t slot, uint32_t gen) {
    return d->ctx[slot].state == CTX_LIVE && d->ctx[slot].gen == gen;
}

CUresult eng_submit(struct sim_device *d, uint32_t slot, uint32_t gen, int64_t dur_ns, int64_t bus_ns, uint32_t blocks,
                    uint64_t *done_head, uint64_t *gone_seq, uint64_t *gone_end_ns) {
    *gone_seq = UINT64_MAX;
    for (;;) {
        sim_lock_device(d);
        uint64_t now = sim_now();
        eng_advance(d, now);
        struct sim_ctx *c = &d->ctx[slot];
        if (!still_mine(d, slot, gen)) {
            sim_unlock_device(d);
            return CUDA_ERROR_CONTEXT_IS_DESTROYED;
        }
        if (c->tail - c->head < SIM_QCAP) {
            struct sim_item *it = &c->q[c->tail % SIM_QCAP];
            if (c->tail >= SIM_QCAP && it->seq == c->tail - SIM_QCAP) { /* done: its end time goes now */
                *gone_seq = it->seq;
                *gone_end_ns = it->end_ns;
            }
            it->seq = c->tail;
            it->remaining_ns = dur_ns > 0 ? dur_ns : 0;
            it->bus_ns = bus_ns > 0 ? bus_ns : 0;
            it->end_ns = 0;
            it->blocks = blocks;
            it->flags = 0;
            c->tail++;
            *done_head = c->tail;
            sim_unlock_device(d);
            return CUDA_SUCCESS;
        }
        /* the launch queue is full: wait for the oldest kernel, as a real launch does */
        uint64_t t = eng_predict(d, slot, c->head + 1);
        sim_unlock_device(d);
        uint64_t cap = now + 20000000ull;
        sim_sleep_until(t < cap ? t : cap);
    }
}

int eng_done(struct sim_device *d, uint32_t slot, uint32_t gen, uint64_t head) {
    sim_lock_device(d);
    eng_advance(d, sim_now());
    int done = !still_mine(d, slot, gen) || d->ctx[slot].head >= head;
    sim_unlock_device(d);
    return done;
}

void eng_wait(struct sim_device *d, uint32_t slot, uint32_t gen, uint64_t head) {
    for (;;) {
        sim_lock_device(d);
        uint64_t now = sim_now();
        eng_advance(d, now);
        if (!still_mine(d, slot, gen) || d->ctx[slot].head >= head) {
            sim_unlock_device(d);
            return;
        }
        uint64_t t = eng_predict(d, slot, head);
        sim_unlock_device(d);
        /* Re-check at least every 20 ms: a dead context's work may be dropped meanwhile. */
        uint64_t cap = now + 20000000ull;
        sim_sleep_until(t < cap ? t : cap);
    }
}

/* Completion time of the item just below `head` (0 if no longer known). Lock held. */
uint64_t eng_end_time(struct sim_device *d, uint32_t slot, uint64_t head) {
    if (head == 0)
        return 0;
    struct sim_item *it = &d->ctx[slot].q[(head - 1) % SIM_QCAP];
    return it->seq == head - 1 ? it->end_ns : 0;
}
