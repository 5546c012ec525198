/* libtgs.so: compute sharing (ARCHITECTURE.md, "Compute sharing").
 *
 * Cost unit: one thread block. Production launches are counted (relaxed atomic adds in
 * the control block) and mark the GPU's production activity byte busy until it is found
 * idle (a synchronisation or query after which its streams have no work: docs/shim.md).
 * Opportunistic launches wait while production has unfinished work on the GPU, keep at
 * most `inflight_max` kernels' worth of work in flight (tracked with events; a kernel
 * shorter than TGS_INFLIGHT_QUANTUM_NS counts as the part of it it runs), and spend
 * tokens from the container's shared bucket (GCRA: one CAS on the control block). Work
 * launched on a capturing stream is neither counted nor throttled; a graph
 * launch costs the thread blocks of its kernel nodes, counted at instantiate. Only the
 * launching thread ever waits, by sleeping; while tokens remain no system call is made.
 * It counts what it waited for: behind production (per GPU), and for its own kernels in
 * flight, anticipation or tokens (per container: tgs_shim_part).
 *
 * Anticipation: a production process that goes idle says when it expects to launch again
 * (from its recent gaps between idle and launch); an opportunistic launch that would still
 * be running then waits for production instead of delaying it. Each opportunistic process
 * whose launches are bounded or anticipate learns how long its kernels run by timing one
 * launch in 32 with events (one in up to 256 while the readings confirm the lengths it
 * knows).
 */
#define _GNU_SOURCE
#include "tgs.h"
#include "kernel_length.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------- production activity ---------- */

/* An iteration starts (the first launch since production was found idle): tell tgsd
 * when, and how many blocks, pauses and busy time came before it. Timed from one iteration start to another,
 * production's progress is exact; a window's block count is off by up to an iteration.
 * A writer that finds another one writing leaves the mark to it. */
static void mark_iteration(struct tgs_gpu *g, uint64_t now) {
    struct tgs_gpu_counters *c = g->ctr;
    uint64_t seq = __atomic_load_n(&c->mark_seq, __ATOMIC_RELAXED);
    if ((seq & 1) || !__atomic_compare_exchange_n(&c->mark_seq, &seq, seq + 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        return;
    __atomic_store_n(&c->mark_ns, now, __ATOMIC_RELAXED);
    __atomic_store_n(&c->mark_blocks, __atomic_load_n(&c->blocks, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
    __atomic_store_n(&g->pauses->mark_paused_ns, __atomic_load_n(&g->pauses->paused_ns, __ATOMIC_RELAXED),
                     __ATOMIC_RELAXED);
    __atomic_store_n(g->mark_busy_ns, __atomic_load_n(&c->busy_ns, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
    __atomic_store_n(&c->mark_seq, seq + 2, __ATOMIC_RELEASE);
}

/* This production process's expectation (its activity slot's), or NULL: none for slots
 * from TGS_EXPECT_SLOTS on. */
static volatile struct tgs_expectation *own_expectation(struct tgs_gpu *g, uint32_t slot) {
    return g->expect && slot < TGS_EXPECT_SLOTS ? &g->expect[slot] : NULL;
}

/* ---------- production: its steps ----------
 *
 * A job may go idle inside a step as well as between steps: PyTorch's event queries find
 * the GPU caught up with the launching thread for 0.1-0.4 ms while a ResNet-50 on an
 * H200 had a data loader keep it on its host 2 s a step. Taken for its gaps, such spells
 * made the rhythm 1 ms, each 2 s spell a pause, and each return one from idle. A spell at
 * least TGS_STEP_SPELL times the shortest of its gaps may end a step; where the last
 * TGS_STEPS such steps did the same work (their blocks within 1/TGS_STEP_SAME) and each was busy at
 * least TGS_STEP_INSIDE times its spells inside, the job knows its steps (spell_between_steps
 * says how long it goes on knowing them): a spell that
 * starts once a step's work is done is expected as long as those between steps, the
 * others as inside ones; only the launch after a spell between steps starts an
 * iteration, and only the part of such a spell beyond twice the shortest of them is a
 * pause. A job whose spells are all alike, or whose long spells come after work that
 * varies (a data loader's stall every few iterations) or end stretches of many spells
 * of their own (a stall every 25 iterations of 10 ms gaps), is expected from all its
 * spells, as before. */

/* Whether a figure moved by more than 1/32 from the one last logged (production's debug
 * logs of what it expects say only what changed). */
static int moved_from_logged(uint64_t now, uint64_t logged) {
    return now > logged + logged / 32 || now < logged - logged / 32;
}

/* The shortest of production's last TGS_GAPS gaps, or of those it has had (0: none yet);
 * `hi` gets the longest. */
static uint64_t gaps_range(const struct tgs_gpu *g, uint64_t *hi) {
    unsigned seen = g->ngaps < TGS_GAPS ? g->ngaps : TGS_GAPS;
    uint64_t lo = seen ? UINT64_MAX : 0;
    *hi = 0;
    for (unsigned i = 0; i < seen; i++) {
        lo = g->gaps[i] < lo ? g->gaps[i] : lo;
        *hi = g->gaps[i] > *hi ? g->gaps[i] : *hi;
    }
    return lo;
}

/* The blocks this production process's container has launched on the GPU so far. */
static uint64_t production_blocks(struct tgs_gpu *g) {
    return g->ctr ? __atomic_load_n(&g->ctr->blocks, __ATOMIC_RELAXED) : 0;
}

/* Whether `blocks` reaches a step's `work` (work_reached) or is that work (same_work),
 * within 1/TGS_STEP_SAME of it, as steps that do the same work are. */
static int work_reached(uint64_t blocks, uint64_t work) { return blocks + work / TGS_STEP_SAME >= work; }

static int same_work(uint64_t blocks, uint64_t work) {
    return work_reached(blocks, work) && blocks <= work + work / TGS_STEP_SAME;
}

/* Whether the last TGS_STEPS steps did the same work: then it is step_work, and the
 * spells after them are expected between steps. A job that knows its steps goes on
 * knowing them while one of the last did their work: an odd step (a long spell inside,
 * a stall held back mid-step, counted where its work was not done yet) is forgotten, not
 * its steps. */
static void steps_known(struct tgs_gpu *g) {
    if (g->nsteps < TGS_STEPS) {
        g->step_work = 0;
        return;
    }
    uint64_t lo = UINT64_MAX, hi = 0, spell_lo = UINT64_MAX, spell_hi = 0;
    int kept = 0;
    for (unsigned i = 0; i < TGS_STEPS; i++) {
        const struct tgs_step *st = &g->steps[i];
        lo = st->blocks < lo ? st->blocks : lo;
        hi = st->blocks > hi ? st->blocks : hi;
        spell_lo = st->spell_ns < spell_lo ? st->spell_ns : spell_lo;
        spell_hi = st->spell_ns > spell_hi ? st->spell_ns : spell_hi;
        kept |= g->step_work && same_work(st->blocks, g->step_work);
    }
    if (!lo || hi - lo > lo / TGS_STEP_SAME) {
        if (!kept)
            g->step_work = 0;
        return;
    }
    int news = tgs_log_level >= TGS_LOG_DEBUG &&
               (lo != g->logged_step_work || moved_from_logged(spell_lo, g->logged_step_spell));
    g->step_work = lo;
    g->step_spell_lo = spell_lo;
    g->step_spell_hi = spell_hi < 2 * spell_lo ? spell_hi : 2 * spell_lo;
    if (news) {
        tgs_log(TGS_LOG_DEBUG, "knows its steps: %llu blocks each, then %.1f-%.1f ms idle", (unsigned long long)lo,
                (double)g->step_spell_lo / 1e6, (double)g->step_spell_hi / 1e6);
        g->logged_step_work = lo;
        g->logged_step_spell = spell_lo;
    }
}

/* Whether, where the job knows its steps, the one under way has done a step's work
 * (`blocks`: production's so far). */
static int step_done(const struct tgs_gpu *g, uint64_t blocks) {
    return work_reached(blocks - g->step_blocks, g->step_work);
}

/* A spell of `spell` ns from `idle` to the launch at `now` ended, `blocks` launched before
 * it: whether it came between two steps (then the next starts now). Once the job knows its
 * steps, a spell at least a quarter of the shortest between them is one where the step's
 * work is done (its spells inside may stop: a ResNet-50's did after 20 s on an H200, and
 * its 2 s spells were then the shortest), and any spell before that is one inside, however
 * long (a collector's pause, a host thread held back); a job that does two steps' work
 * without a spell between them knows its steps no more. */
static int spell_between_steps(struct tgs_gpu *g, uint64_t spell, uint64_t idle, uint64_t now, uint64_t blocks) {
    uint64_t shortest = g->usual_gap_ns / 2, longest;
    if (!shortest) /* its first spells, before it expects any */
        shortest = gaps_range(g, &longest);
    int between = g->step_work ? step_done(g, blocks) && 4 * spell >= g->step_spell_lo
                               : shortest && spell >= TGS_STEP_SPELL * shortest;
    if (!between) {
        g->step_inside_ns += spell;
        if (g->step_work && blocks - g->step_blocks > 2 * g->step_work) {
            tgs_log(TGS_LOG_DEBUG, "knows its steps no more: %llu blocks without a spell between them",
                    (unsigned long long)(blocks - g->step_blocks));
            g->step_work = g->logged_step_work = 0; /* learnt again, they are logged again */
        }
        return 0;
    }
    uint64_t span = idle > g->step_ns ? idle - g->step_ns : 0;
    int clean = g->step_ns && (TGS_STEP_INSIDE + 1) * g->step_inside_ns <= span;
    g->steps[g->nsteps++ % TGS_STEPS] = (struct tgs_step){spell, clean ? blocks - g->step_blocks : 0};
    g->step_ns = now;
    g->step_blocks = blocks;
    g->step_inside_ns = 0;
    steps_known(g);
    return 1;
}

/* The launch after an idle spell: remember how long the spell was (where it `happened`),
 * count its part beyond the usual gap (of a spell between steps, where the job knows
 * them) as a pause of production's own (tgs_proto.h, tgs_gpu_pauses: a data loader's
 * stall, which tgsd leaves out of production's progress), and withdraw the expectation it
 * raised (the GPU's gate now holds opportunistic work back). Returns whether the launch
 * starts an iteration: after any spell, or where the job knows its steps, one between them. */
static int note_gap(struct tgs_gpu *g, uint32_t slot, uint64_t now, int happened) {
    uint64_t idle = g->idle_ns;
    if (!idle) {
        if (happened && !g->step_ns) { /* its first launch starts its first step */
            g->step_ns = now;
            g->step_blocks = production_blocks(g);
        }
        return happened;
    }
    g->idle_ns = 0;
    int starts = happened;
    if (happened) {
        uint64_t gap = now > idle ? now - idle : 0; /* idle: another thread's clock */
        int between = spell_between_steps(g, gap, idle, now, production_blocks(g));
        uint64_t usual = g->step_work && between ? 2 * g->step_spell_lo : g->usual_gap_ns;
        starts = !g->step_work || between;
        g->gaps[g->ngaps++ % TGS_GAPS] = gap;
        if (usual && gap > usual)
            __atomic_fetch_add(&g->pauses->paused_ns, gap - usual, __ATOMIC_RELAXED);
    }
    volatile struct tgs_expectation *e = own_expectation(g, slot);
    if (e)
        __atomic_store_n(&e->due_until_ns, 0, __ATOMIC_RELAXED);
    return starts;
}

/* Production went idle at `now`: it expects to launch again after the shortest of its
 * recent gaps (the last TGS_GAPS, once it has seen TGS_GAPS_TO_EXPECT) and before the
 * longest (at most twice the shortest: a job whose gaps vary more is expected only around
 * its shortest), and a gap longer than twice the shortest is in part a pause (note_gap);
 * where it knows its steps and this one's work is done, as the spells between them, and
 * where this one's work is not done, it says how long the spell after it will be (a
 * kernel that fits that waits for it: runs_into). Each production process writes its
 * own slot's expectation, and makes sure opportunistic shims read that far. */
static void expect_next(struct tgs_gpu *g, uint64_t now) {
    g->idle_ns = now;
    if (g->ngaps < TGS_GAPS_TO_EXPECT)
        return;
    uint64_t hi, lo = gaps_range(g, &hi);
    g->usual_gap_ns = 2 * lo;
    if (hi > g->usual_gap_ns)
        hi = g->usual_gap_ns;
    uint32_t slot = __atomic_load_n(&g_tgs.activity_slot, __ATOMIC_RELAXED);
    volatile struct tgs_expectation *e = own_expectation(g, slot);
    if (!e)
        return;
    if (tgs_log_level >= TGS_LOG_DEBUG && moved_from_logged(lo, g->logged_gap)) {
        tgs_log(TGS_LOG_DEBUG, "expects to launch again %.1f-%.1f us after going idle", (double)lo / 1e3, (double)hi / 1e3);
        g->logged_gap = lo;
    }
    uint64_t later = 0; /* inside a step: the spell after it (0: none known) */
    if (g->step_work && step_done(g, production_blocks(g))) {
        lo = g->step_spell_lo;
        hi = g->step_spell_hi;
    } else if (g->step_work) {
        later = g->step_spell_lo;
    }
    __atomic_store_n(&e->due_until_ns, 0, __ATOMIC_RELAXED); /* no window while it is written */
    __atomic_store_n(&g->step_spell[slot], later, __ATOMIC_RELAXED);
    __atomic_store_n(&e->idle_ns, now, __ATOMIC_RELAXED);
    __atomic_store_n(&e->due_ns, now + lo, __ATOMIC_RELAXED);
    __atomic_store_n(&e->due_until_ns, now + hi, __ATOMIC_RELEASE);
    uint32_t n = __atomic_load_n(g->expect_slots, __ATOMIC_RELAXED);
    while (n <= slot && !__atomic_compare_exchange_n(g->expect_slots, &n, slot + 1, 1, __ATOMIC_RELEASE,
                                                      __ATOMIC_RELAXED))
        ;
}

/* Production busy from now. `iteration`: it starts one, after an idle spell. */
static inline void set_busy(struct tgs_gpu *g, int iteration) {
    uint32_t slot = __atomic_load_n(&g_tgs.activity_slot, __ATOMIC_RELAXED);
    if (slot >= TGS_ACTIVITY_SLOTS || !g->activity_rw)
        return;
    g->activity_rw[slot] = 1;
    uint64_t now = tgs_now();
    g->busy_since_ns = now;
    __atomic_store_n(&g->busy_marked, 1, __ATOMIC_RELAXED);
    if (note_gap(g, slot, now, iteration)) /* first: the mark counts the pause it ends */
        mark_iteration(g, now);
}

/* The first launch since production went idle (once per iteration: out of line). */
__attribute__((noinline)) static void mark_busy_now(struct tgs_gpu *g) { set_busy(g, 1); }

static inline void mark_busy(struct tgs_gpu *g) {
    if (likely(__atomic_load_n(&g->busy_marked, __ATOMIC_RELAXED)) || !g->activity_rw)
        return;
    mark_busy_now(g);
}

/* A launch was under way while another thread found production idle (its streams drained
 * before the kernel reached one; a TensorFlow poller beside the launching thread meets
 * this whenever the GPU has caught up): busy again, as that launch had marked it. Not an
 * iteration start, and no gap: the idle spell did not happen. */
__attribute__((noinline)) static void mark_busy_again(struct tgs_gpu *g) { set_busy(g, 0); }

/* Production's work is done (found idle: work_done, below; or the process leaves TGS):
 * its byte is cleared and the time it was set is counted (busy_ns). Returns when (0: it
 * was not busy). */
uint64_t tgs_production_idle(struct tgs_gpu *g) {
    if (!__atomic_exchange_n(&g->busy_marked, 0, __ATOMIC_RELAXED) || !g->activity_rw)
        return 0;
    uint32_t slot = __atomic_load_n(&g_tgs.activity_slot, __ATOMIC_RELAXED);
    if (slot < TGS_ACTIVITY_SLOTS)
        g->activity_rw[slot] = 0;
    uint64_t now = tgs_now(), since = g->busy_since_ns;
    if (since && now > since)
        __atomic_fetch_add(&g->ctr->busy_ns, now - since, __ATOMIC_RELAXED);
    return now;
}

/* Any production process's byte set. Read on every opportunistic launch behind production,
 * as one OR over all the bytes, 16 at a time (a test per 8 cost about 200 instructions a
 * launch). Plain loads of memory other processes write: the barrier makes every call
 * read it afresh. */
typedef uint64_t tgs_u64x2 __attribute__((vector_size(16), aligned(8), may_alias));
_Static_assert(TGS_ACTIVITY_SLOTS % 16 == 0, "the activity bytes are read 16 at a time");
static int production_busy(const struct tgs_gpu *g) {
    __asm__ __volatile__("" ::: "memory");
    const tgs_u64x2 *v = (const tgs_u64x2 *)(const void *)g->activity;
    tgs_u64x2 any = {0, 0};
#pragma GCC unroll 16
    for (unsigned i = 0; i < TGS_ACTIVITY_SLOTS / 16; i++)
        any |= v[i];
    return (any[0] | any[1]) != 0;
}

/* ---------- production: its streams, asked whether their work is done ---------- */

/* One stream or event done says nothing of the rest of production's work: an inference
 * server's threads each synchronise their own stream, PyTorch's caching allocator queries
 * events in mid-iteration, TensorFlow's event manager polls events and never synchronises.
 * So the shim notes each stream production launches on and asks them all (cuStreamQuery,
 * without waiting) when a stream or event synchronisation completes (idle unless one has
 * work) or a query succeeds (idle only if every one is known to be done). A stream is
 * noted at a thread's first launch on it (each thread caches the last TGS_NOTED it noted);
 * the set is the GPU's, under one lock, taken only to note a new stream and to ask. What
 * cannot be asked (more than TGS_STREAMS streams; a stream of another context, or the
 * per-thread default stream of another thread; the set after a context was destroyed,
 * until its next launches note theirs again; all of them while the process captures a
 * graph, as asking a capturing stream, or the legacy stream beside one, would invalidate
 * the capture) is unknown: done to a synchronisation, busy to a query. */
static pthread_mutex_t g_streams_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned g_streams_dropped; /* streams destroyed: a thread notes its stream again */
/* The streams a thread noted last (most recent first), as of one epoch: a thread that
 * launches on a few streams in turn does not take the lock for each launch. */
#define TGS_NOTED 4
struct streams_noted {
    CUstream s[TGS_NOTED];
    CUcontext ctx[TGS_NOTED];
    unsigned epoch;
};
static __thread struct streams_noted t_noted __attribute__((tls_model("initial-exec")));

static unsigned streams_epoch(void) {
    return tgs_context_generation() + __atomic_load_n(&g_streams_dropped, __ATOMIC_RELAXED);
}

static int stream_matches(const struct tgs_stream_seen *e, CUstream s, CUcontext ctx, pthread_t self) {
    if (e->s != s)
        return 0;
    if (s == CU_STREAM_PER_THREAD)
        return e->ctx == ctx && pthread_equal(e->thread, self);
    return !s || s == CU_STREAM_LEGACY ? e->ctx == ctx : 1;
}

/* The set of a GPU, emptied when a context was destroyed since it was noted (its streams
 * may be gone). Under g_streams_lock. */
static void streams_current(struct tgs_gpu *g) {
    unsigned gen = tgs_context_generation();
    if (g->streams_gen != gen) {
        g->nstreams = 0;
        g->streams_full = 0;
        g->streams_gen = gen;
    }
}

__attribute__((noinline)) static void note_stream_now(struct tgs_gpu *g, CUstream s, CUcontext ctx) {
    unsigned epoch = streams_epoch();
    pthread_t self = pthread_self();
    pthread_mutex_lock(&g_streams_lock);
    streams_current(g);
    unsigned i = 0;
    while (i < g->nstreams && !stream_matches(&g->streams[i], s, ctx, self))
        i++;
    if (i == g->nstreams) {
        if (i < TGS_STREAMS)
            g->streams[g->nstreams++] = (struct tgs_stream_seen){s, ctx, self};
        else
            g->streams_full = 1;
    }
    pthread_mutex_unlock(&g_streams_lock);
    if (t_noted.epoch != epoch)
        t_noted = (struct streams_noted){.epoch = epoch};
    memmove(&t_noted.s[1], &t_noted.s[0], sizeof t_noted.s[0] * (TGS_NOTED - 1));
    memmove(&t_noted.ctx[1], &t_noted.ctx[0], sizeof t_noted.ctx[0] * (TGS_NOTED - 1));
    t_noted.s[0] = s;
    t_noted.ctx[0] = ctx;
}

/* Production launches on `s` in `ctx` (before it marks its GPU busy). */
static inline void note_stream(struct tgs_gpu *g, CUstream s, CUcontext ctx) {
    if (likely(t_noted.epoch == streams_epoch()))
        for (unsigned i = 0; i < TGS_NOTED; i++)
            if (t_noted.s[i] == s && t_noted.ctx[i] == ctx) /* ctx is never NULL: an empty entry never matches */
                return;
    note_stream_now(g, s, ctx);
}

/* What production's streams say, asked without waiting. */
enum streams_state {
    STREAMS_DRAINED, /* every stream it launched on has its work done */
    STREAMS_BUSY,    /* one of them has not (it is asked first next time) */
    STREAMS_UNKNOWN, /* none said busy, but not all could be asked */
};

/* The streams are asked under the lock: cuStreamDestroy's wrapper forgets a stream under
 * it before destroying it, so none is destroyed (and its handle reused) while it is asked.
 * A few streams' queries, each without waiting, are what another thread may wait for. */
static enum streams_state streams_state(struct tgs_gpu *g, CUcontext ctx) {
    if (__atomic_load_n(&g_tgs.captures, __ATOMIC_RELAXED))
        return STREAMS_UNKNOWN; /* asking a capturing stream would invalidate its capture */
    pthread_t self = pthread_self();
    enum streams_state st = STREAMS_DRAINED;
    pthread_mutex_lock(&g_streams_lock);
    streams_current(g);
    if (g->streams_full || !g->nstreams)
        st = STREAMS_UNKNOWN;
    for (unsigned i = 0; i < g->nstreams; i++) {
        struct tgs_stream_seen *e = &g->streams[i];
        int askable = e->ctx == ctx && (e->s != CU_STREAM_PER_THREAD || pthread_equal(e->thread, self));
        CUresult q = askable ? REAL(cuStreamQuery)(e->s) : CUDA_ERROR_INVALID_CONTEXT;
        if (q == CUDA_ERROR_NOT_READY) {
            struct tgs_stream_seen first = g->streams[0];
            g->streams[0] = *e;
            *e = first;
            st = STREAMS_BUSY;
            break;
        }
        if (q != CUDA_SUCCESS)
            st = STREAMS_UNKNOWN;
    }
    pthread_mutex_unlock(&g_streams_lock);
    return st;
}

/* A destroyed stream leaves every GPU's set (its handle may be reused). */
static void forget_stream(CUstream s) {
    if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
        return;
    pthread_mutex_lock(&g_streams_lock);
    for (unsigned k = 0; k < TGS_MAX_GPUS; k++) {
        struct tgs_gpu *g = &g_tgs.gpu[k];
        for (unsigned i = 0; i < g->nstreams; i++)
            if (g->streams[i].s == s)
                g->streams[i--] = g->streams[--g->nstreams];
    }
    pthread_mutex_unlock(&g_streams_lock);
    __atomic_add_fetch(&g_streams_dropped, 1, __ATOMIC_RELAXED);
}

/* ---------- opportunistic: the shim's own events ---------- */

/* Whether an event the shim made (in context `made_in`, context generation `made_gen`)
 * serves the calling thread's context `ctx` now (generation `gen`). One that does not is
 * destroyed if no context has been destroyed since it was made (its context lives:
 * dropping it would leak it, once per switch between two contexts on one GPU), else
 * forgotten (it may have died with its context; its handle may be reused). */
static int event_serves(CUevent *e, CUcontext made_in, unsigned made_gen, CUcontext ctx, unsigned gen) {
    if (*e && made_in == ctx && made_gen == gen)
        return 1;
    if (*e && made_gen == gen)
        REAL(cuEventDestroy_v2)(*e);
    *e = NULL;
    return 0;
}

/* ---------- opportunistic: each kernel's length ---------- */

/* Each kernel's length, remembered by what was launched (a function or a graph) and its
 * grid's size, from the launches timed (the timer, below, fills it in); and per function
 * (or graph) its lengths on the last TGS_FN_GRIDS grid sizes timed, for the kernels of it
 * not timed yet (a framework's dynamic shapes bring new grid sizes all the time). Only
 * the thread that owns the timer inserts or updates (one at a time), storing the key
 * before the length; a reader that finds the key without a length takes the kernel as
 * not timed yet. A full table remembers no more. */
static struct tgs_kernel_length g_kernel_lengths[TGS_MAX_GPUS][TGS_KERNEL_KEYS]; /* by GPU slot (in bss) */
static struct tgs_fn_lengths g_fn_lengths[TGS_MAX_GPUS][TGS_FNS];

static struct tgs_kernel_length *kernel_slot(struct tgs_gpu *g, uintptr_t fn, uint64_t blocks, int insert) {
    uint64_t h = ((uint64_t)fn ^ blocks * 0x9E3779B97F4A7C15ull) * 0xC2B2AE3D27D4EB4Full;
    unsigned base = (unsigned)(h >> (64 - TGS_KERNEL_KEY_BITS)); /* the product's top bits */
    for (unsigned i = 0; i < 4; i++) { /* a short linear probe */
        struct tgs_kernel_length *k = &g_kernel_lengths[g->slot][(base + i) % TGS_KERNEL_KEYS];
        uintptr_t f = __atomic_load_n(&k->fn, __ATOMIC_ACQUIRE);
        if (f == fn && __atomic_load_n(&k->blocks, __ATOMIC_RELAXED) == blocks)
            return k;
        if (!f) {
            if (!insert)
                return NULL;
            __atomic_store_n(&k->blocks, blocks, __ATOMIC_RELAXED);
            __atomic_store_n(&k->fn, fn, __ATOMIC_RELEASE);
            return k;
        }
    }
    return NULL;
}

static struct tgs_fn_lengths *fn_slot(struct tgs_gpu *g, uintptr_t fn, int insert) {
    uint64_t h = (uint64_t)fn * 0x9E3779B97F4A7C15ull;
    unsigned base = (unsigned)(h >> (64 - TGS_FN_BITS));
    for (unsigned i = 0; i < 4; i++) {
        struct tgs_fn_lengths *f = &g_fn_lengths[g->slot][(base + i) % TGS_FNS];
        uintptr_t have = __atomic_load_n(&f->fn, __ATOMIC_ACQUIRE);
        if (have == fn)
            return f;
        if (!have) {
            if (!insert)
                return NULL;
            __atomic_store_n(&f->fn, fn, __ATOMIC_RELEASE);
            return f;
        }
    }
    return NULL;
}

/* The timer's owner notes `fn`'s length on `blocks`, in the place tgs_fn_place
 * (kernel_length.h) picks. A place being rewritten is emptied first, so that no reader
 * pairs one grid size with another's length. */
static void fn_length_note(struct tgs_gpu *g, uintptr_t fn, uint64_t blocks, uint64_t ns) {
    struct tgs_fn_lengths *f = fn_slot(g, fn, 1);
    if (!f || !blocks)
        return;
    uint64_t b[TGS_FN_GRIDS];
    for (unsigned i = 0; i < TGS_FN_GRIDS; i++)
        b[i] = __atomic_load_n(&f->blocks[i], __ATOMIC_RELAXED);
    unsigned at = tgs_fn_place(b, TGS_FN_GRIDS, blocks);
    if (b[at] != blocks)
        __atomic_store_n(&f->blocks[at], 0, __ATOMIC_RELEASE);
    __atomic_store_n(&f->ns[at], ns, __ATOMIC_RELEASE);
    __atomic_store_n(&f->blocks[at], blocks, __ATOMIC_RELEASE);
}

/* How long `fn` runs on `blocks`, for a kernel not timed on that grid: its length on the
 * grid size tgs_fn_nearest (kernel_length.h) picks among those timed lately, or 0 when
 * none is near enough (or it was never timed). */
static uint64_t fn_length_near(struct tgs_gpu *g, uintptr_t fn, uint64_t blocks) {
    struct tgs_fn_lengths *f = fn_slot(g, fn, 0);
    if (!f)
        return 0;
    uint64_t b[TGS_FN_GRIDS], ns[TGS_FN_GRIDS];
    for (unsigned i = 0; i < TGS_FN_GRIDS; i++) {
        b[i] = __atomic_load_n(&f->blocks[i], __ATOMIC_ACQUIRE);
        ns[i] = __atomic_load_n(&f->ns[i], __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&f->blocks[i], __ATOMIC_ACQUIRE) != b[i]) /* being rewritten */
            b[i] = 0;
    }
    unsigned at = tgs_fn_nearest(b, TGS_FN_GRIDS, blocks);
    return at < TGS_FN_GRIDS ? ns[at] : 0;
}

/* What the shim knows of the kernel one launch is about to start, looked up once per
 * launch: its own length (0: not timed on its grid), whether that was timed twice,
 * whether its last reading waits to be confirmed (kernel_length.h), and, for a kernel
 * timed fewer than twice, its function's length on the nearest grid size timed (0: the
 * function never was timed on a grid near enough: fn_length_near). */
struct kernel_known {
    uint64_t own, near;
    int twice, recheck;
};

/* Inlined: called on every timed-or-bounded launch (and once per reading), where a call
 * returning the struct through memory cost a launch about 25 instructions. */
static inline __attribute__((always_inline)) struct kernel_known kernel_known(struct tgs_gpu *g, uintptr_t fn,
                                                                              uint64_t blocks) {
    struct kernel_known kn = {0, 0, 0, 0};
    const struct tgs_kernel_length *k = kernel_slot(g, fn, blocks, 0);
    if (k) {
        kn.twice = __atomic_load_n(&k->readings, __ATOMIC_ACQUIRE) >= 2;
        kn.own = __atomic_load_n(&k->ns, __ATOMIC_ACQUIRE);
        kn.recheck = __atomic_load_n(&k->recheck, __ATOMIC_RELAXED) != 0;
    }
    if (!kn.twice)
        kn.near = fn_length_near(g, fn, blocks);
    return kn;
}

/* How long anticipation takes a kernel to run: its own length once it has been timed
 * twice, else its function's on the nearest grid timed (near enough), else the median of the
 * process's last five timed kernels. Taking every kernel for the median let a 2 ms kernel
 * among 10 us ones start just before production was due; with dynamic shapes, where most
 * kernels are new, so did taking new ones for it (production 0.975 of solo beside such a
 * job on simgpu). */
static uint64_t kernel_expected(const struct tgs_gpu *g, struct kernel_known kn) {
    return kn.twice ? kn.own : kn.near ? kn.near : g->kernel_ns;
}

/* ---------- opportunistic: kernels in flight ---------- */

/* The in-flight bound is work: `inflight_max` kernels of TGS_INFLIGHT_QUANTUM_NS or
 * longer, a shorter kernel counting as the part of that it runs (by its own length, once
 * timed; until then by its function's on the nearest grid size timed, or as a whole one
 * if the function never was timed on a grid near enough), and at most TGS_INFLIGHT_RING
 * kernels. Counted in kernels alone, a job of 10-20 us kernels kept the GPU busy only a
 * third to half of the time production left idle on simgpu, and of the time it had
 * alone: its launching thread woke to launch the next kernel long after the last one had
 * ended. Costed by an average of the job's kernels, a job of short kernels with a run of
 * long ones at the end of each iteration queued the whole run behind production (under
 * tgsd on simgpu, 0.952 of solo at 50 % duty against 0.992 counting kernels). Costed
 * kernel by kernel, with the long ones on another grid: 0.980 (0.994 counting kernels),
 * and 0.805 of the idle time to the job against 0.46. */
static uint64_t kernel_cost(struct kernel_known kn) {
    uint64_t ns = kn.own ? kn.own : kn.near; /* not timed on this grid: its function's on the nearest */
    return ns && ns < TGS_INFLIGHT_QUANTUM_NS ? ns : TGS_INFLIGHT_QUANTUM_NS;
}

/* Kernels are tracked in batches: an event is recorded once a quarter of the bound's work
 * (or half of TGS_INFLIGHT_RING kernels) has been launched since the last one, and covers
 * those, so that a job of short kernels does not pay an event record per launch (with one
 * per launch and a query of the oldest, tgsd's default bound added 1,378 instructions to
 * a zero-length launch on simgpu; 555 with batches). Each batch costs a record and, at
 * the bound, a query (about 240 ns together on simgpu, more on a real driver): batches of
 * a quarter of the ring's kernels cost a zero-length launch 7-19 ns more than halves, and
 * the count decides only for kernels under 1/128 of the bound (8 us under tgsd's
 * default). A batch's event is on the stream of its last launch: where one process
 * launches on several streams, a batch may end before all its kernels do. */
static int inflight_batch_done(uint64_t work, unsigned kernels, uint64_t bound) {
    return work >= bound / 4 || kernels >= TGS_INFLIGHT_RING / 2;
}

/* What a debug line sums up over a second: `n` events since `since`, and a figure of them
 * (a total or the largest). */
struct per_second {
    uint64_t since, n, ns;
};

/* Counts one event at `now`; 1 when a second has passed since the first counted (then the
 * caller logs p's sums, and starts them again with per_second_restart). */
static int per_second_count(struct per_second *p, uint64_t now) {
    p->n++;
    if (!p->since)
        p->since = now;
    return now >= p->since + 1000000000ull;
}

static void per_second_restart(struct per_second *p, uint64_t now) {
    p->since = now;
    p->n = p->ns = 0;
}

/* At debug level, once a second at most per process: how far its expected queue end moved
 * back since the last such line. */
__attribute__((noinline)) static void queue_end_log(uint64_t by, uint64_t now) {
    static struct per_second moved;
    moved.ns += by;
    if (!per_second_count(&moved, now))
        return;
    tgs_log(TGS_LOG_DEBUG, "in %.2f s its queue's expected end moved back %.2f ms in all: %llu batches of its kernels "
            "were done before they were expected to end", (double)(now - moved.since) / 1e9, (double)moved.ns / 1e6,
            (unsigned long long)moved.n);
    per_second_restart(&moved, now);
}

/* The kernels launched since the last event and their cost share one word (the count in
 * its top bits), so that a launch counts both with one atomic add: two cost a bounded
 * launch about 6 ns more on simgpu. A batch's cost stays far below 2^40 ns, and its count
 * below 2^24. */
#define UNTRACKED_KERNEL (1ull << 40)
static inline unsigned untracked_kernels(uint64_t u) { return (unsigned)(u / UNTRACKED_KERNEL); }
static inline uint64_t untracked_ns(uint64_t u) { return u % UNTRACKED_KERNEL; }

static int inflight_full(struct tgs_gpu *g, uint64_t bound, uint64_t cost) {
    uint64_t u = __atomic_load_n(&g->untracked, __ATOMIC_RELAXED);
    uint64_t w = __atomic_load_n(&g->ev_work_ns, __ATOMIC_RELAXED) + untracked_ns(u);
    unsigned n = __atomic_load_n(&g->ev_kernels, __ATOMIC_RELAXED) + untracked_kernels(u);
    return n >= TGS_INFLIGHT_RING || (w && w + cost > bound);
}

/* Batch h of its kernels was done by `now`. The process's expected queue end
 * (queue_end_ns: each launch adds its kernel's expected length, from when the queue before
 * it was expected to end, until a synchronisation finds the queue done) moves back by as
 * much as the batch was done before it was expected to end, and so do the later batches'
 * expected ends (each is kept as recorded plus the moves made before it was, and read less
 * the moves made since: one subtraction, however many are in flight): each kernel behind
 * it was launched before now, so they were expected to run back to back from the batch's
 * end, and the move is exact. Lengths read too long
 * (an event timing that took in another context's time slice, say) ran the expectation
 * ahead of the GPU by the error of every kernel launched since the last synchronisation,
 * and anticipation held kernels back for work long done: on simgpu, with every timing
 * read four times too long, a job of 20 us kernels synchronising every 40 ms had 0.26 of
 * production's idle time at 40 % duty, 0.89 with the move (0.99 with timings read right).
 * It does not move on where a batch was waited for past its expected end: with every
 * timing read four times too short, that made production wait 0.58 ms per 20 ms
 * iteration against 0.11 without (tgsd then left the job a higher rate; 2 runs each).
 * Where a process launches on several streams, a batch may be done before kernels of it
 * on other streams: those are taken as done too, as after a synchronisation of one
 * stream. Under the in-flight lock; the expected end itself is written by launching
 * threads without it (a lost update is corrected by the next batch). */
static void queue_end_seen(struct tgs_gpu *g, unsigned h, uint64_t now) {
    uint64_t end = g->ev_end[h], moved = g->queue_moved_ns, q = g->queue_end_ns;
    if (end <= moved + now || !q || g->ev_queue[h] != __atomic_load_n(&g->queue_starts, __ATOMIC_RELAXED))
        return;
    uint64_t by = end - moved - now;
    g->queue_end_ns = q > by ? q - by : 0;
    g->queue_moved_ns = moved + by;
    if (tgs_log_level >= TGS_LOG_DEBUG)
        queue_end_log(by, now);
}

/* The oldest batch is done by `now`: out of the ring. Under the in-flight lock. */
static void batch_done(struct tgs_gpu *g, uint64_t now) {
    unsigned h = g->ev_head;
    queue_end_seen(g, h, now);
    __atomic_store_n(&g->ev_kernels, g->ev_kernels - g->ev_covers[h], __ATOMIC_RELAXED);
    __atomic_store_n(&g->ev_work_ns, g->ev_work_ns - g->ev_work[h], __ATOMIC_RELAXED);
    g->ev_head = (h + 1) % TGS_INFLIGHT_RING;
    g->ev_count--;
}

/* Waits until a kernel of `cost` fits in the bound (one always fits when nothing is in
 * flight); 1 if it waited. Below the bound it takes no lock (threads of one process that
 * launch at once may each take the last place, as they could with the lock: the bound is
 * per process, not exact between its threads). At the bound the oldest batch is queried,
 * and waited for only while it still runs. */
static int inflight_wait(struct tgs_gpu *g, uint64_t bound, uint64_t cost) {
    if (!inflight_full(g, bound, cost))
        return 0;
    int waited = 0;
    pthread_mutex_lock(&g->inflight_lock);
    while (g->ev_count && inflight_full(g, bound, cost)) {
        if (REAL(cuEventQuery)(g->ev[g->ev_head]) == CUDA_ERROR_NOT_READY) {
            REAL(cuEventSynchronize)(g->ev[g->ev_head]);
            waited = 1;
        }
        batch_done(g, tgs_now());
    }
    pthread_mutex_unlock(&g->inflight_lock);
    return waited;
}

/* Before anticipation holds a launch back for its own queue's expected end: the batches
 * done by now are taken out of the ring, each moving that end back (queue_end_seen), so
 * that the hold is decided on what the GPU has done, not on the lengths expected when
 * they were launched. Batches are otherwise found done only at the bound, which a process
 * held back by anticipation does not reach: on an H200, a GPT-2-sized job's queue was
 * expected to end 75-81 ms ahead of its work while it waited 0.24 s/s anticipating
 * production beside ResNet-50 (2026-11-29). One event query per batch; none where
 * another thread holds the lock. */
__attribute__((noinline)) static void queue_end_refresh(struct tgs_gpu *g) {
    if (!g->ev_count || pthread_mutex_trylock(&g->inflight_lock))
        return;
    while (g->ev_count && REAL(cuEventQuery)(g->ev[g->ev_head]) != CUDA_ERROR_NOT_READY)
        batch_done(g, tgs_now());
    pthread_mutex_unlock(&g->inflight_lock);
}

/* A launch of `cost` is counted; the one that completes a batch records its event. */
static void inflight_record(struct tgs_gpu *g, CUstream s, uint64_t bound, uint64_t cost) {
    uint64_t u = __atomic_add_fetch(&g->untracked, UNTRACKED_KERNEL + cost, __ATOMIC_RELAXED);
    if (!inflight_batch_done(untracked_ns(u), untracked_kernels(u), bound))
        return;
    pthread_mutex_lock(&g->inflight_lock);
    u = __atomic_load_n(&g->untracked, __ATOMIC_RELAXED); /* another thread may have taken them */
    uint64_t w = untracked_ns(u);
    unsigned n = untracked_kernels(u);
    if (!n || !inflight_batch_done(w, n, bound) || g->ev_count >= TGS_INFLIGHT_RING) {
        pthread_mutex_unlock(&g->inflight_lock);
        return;
    }
    CUcontext ctx = NULL;
    REAL(cuCtxGetCurrent)(&ctx);
    unsigned gen = tgs_context_generation();
    unsigned i = (g->ev_head + g->ev_count) % TGS_INFLIGHT_RING;
    if (!event_serves(&g->ev[i], g->ev_ctx[i], g->ev_gen[i], ctx, gen)) {
        if (REAL(cuEventCreate)(&g->ev[i], CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS) {
            g->ev_ctx[i] = ctx;
            g->ev_gen[i] = gen;
        } else {
            g->ev[i] = NULL;
        }
    }
    if (g->ev[i] && REAL(cuEventRecord)(g->ev[i], s) == CUDA_SUCCESS) {
        g->ev_covers[i] = n;
        g->ev_work[i] = w;
        uint64_t q = g->queue_end_ns;
        g->ev_end[i] = q ? q + g->queue_moved_ns : 0;
        g->ev_queue[i] = __atomic_load_n(&g->queue_starts, __ATOMIC_RELAXED);
        __atomic_store_n(&g->ev_kernels, g->ev_kernels + n, __ATOMIC_RELAXED);
        __atomic_store_n(&g->ev_work_ns, g->ev_work_ns + w, __ATOMIC_RELAXED);
        g->ev_count++;
    }
    /* tracked now, or never (no event) */
    __atomic_sub_fetch(&g->untracked, u, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g->inflight_lock);
}

void tgs_compute_after_fork(void) {
    for (unsigned i = 0; i < TGS_MAX_GPUS; i++) {
        struct tgs_gpu *g = &g_tgs.gpu[i];
        pthread_mutex_init(&g->inflight_lock, NULL);
        memset(g->ev, 0, sizeof g->ev);
        g->ev_head = g->ev_count = g->ev_kernels = 0;
        g->ev_work_ns = g->untracked = 0;
        g->busy_marked = 0;
        g->timer[0] = g->timer[1] = NULL;
        g->timer_ctx = NULL;
        g->timing = TGS_TIMER_IDLE;
        g->time_every = TGS_TIME_EVERY;
        g->queue_end_ns = g->idle_ns = 0;
        g->drain = NULL;
        g->drain_state = TGS_DRAIN_NONE;
        g->ngaps = 0;
        g->usual_gap_ns = 0;
        g->nsteps = 0;
        g->step_ns = g->step_inside_ns = g->step_work = 0;
    }
    g_tgs.captures = 0;
    pthread_mutex_init(&g_streams_lock, NULL);
}

/* ---------- opportunistic: how long its kernels run ---------- */

/* About one launch in time_every (TGS_TIME_EVERY, more while the readings confirm the
 * lengths known: kernel_length.h) goes between two timing events, after a random 1/2
 * to 3/2 of that many (a job repeating a sequence of kernels whose length divides a fixed
 * interval would have the same one timed over and over), and at least one of the first
 * 1-8 launches (at random) once TGS_TIME_GAP_NS have passed since the last (a process that
 * launches little, perhaps because its estimate holds its launches back, still corrects
 * it within a few of those; not the very next launch, which behind busy production is
 * probably most often the first of production's gap: timing that one cost a job 1.5-3 %
 * of its share of production's idle time on simgpu); the estimate is the median of the
 * last TGS_TIMED timed, so that one slow kernel (the first touch of its memory, or
 * one queued behind another context's work: it times its wait too) does not hold all the
 * others back. Until TGS_TIMED are timed every launch is, and the median of an even
 * number is the lower middle one: a process whose first kernel waited behind other work
 * would otherwise take it for its kernels' length, hold most of its launches back as too
 * long for production's gaps, and, launching few, time enough to correct it only after
 * seconds (behind production, one of three opportunistic containers taking turns got a
 * tenth of its share for 1.5 s with a first kernel timed at 9.8 ms against 1 ms).
 * g->timing says where the timer is (enum tgs_timer); a thread that moves it to
 * TGS_TIMER_BUSY owns it until it sets it again. */
__attribute__((noinline)) static int timer_start_now(struct tgs_gpu *g, CUstream s, uint64_t now, uintptr_t fn,
                                                      uint64_t blocks) {
    int expected = TGS_TIMER_IDLE;
    if (!real_cuEventElapsedTime ||
        !__atomic_compare_exchange_n(&g->timing, &expected, TGS_TIMER_BUSY, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        return 0; /* another thread times one */
    g->timed_fn = fn;
    g->timed_blocks = blocks;
    g->timed_overlap_ns = __atomic_load_n(&g->ctr->overlap_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&g->untimed, 0, __ATOMIC_RELAXED);
    g->time_by_ns = now + TGS_TIME_GAP_NS;
    g->timer_read_by_ns = now + TGS_TIMER_READ_NS;
    uint32_t x = g->timer_rng ? g->timer_rng : (uint32_t)now | 1u; /* xorshift32 */
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    g->timer_rng = x;
    __atomic_store_n(&g->time_after, g->time_every / 2 + x % g->time_every, __ATOMIC_RELAXED);
    CUcontext ctx = NULL;
    REAL(cuCtxGetCurrent)(&ctx);
    unsigned gen = tgs_context_generation();
    int serves = event_serves(&g->timer[0], g->timer_ctx, g->timer_gen, ctx, gen);
    serves &= event_serves(&g->timer[1], g->timer_ctx, g->timer_gen, ctx, gen); /* both looked at */
    if (!serves) {
        CUevent a = NULL, b = NULL;
        int made = REAL(cuEventCreate)(&a, CU_EVENT_DEFAULT) == CUDA_SUCCESS;
        if (!made || REAL(cuEventCreate)(&b, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
            if (made)
                REAL(cuEventDestroy_v2)(a);
            __atomic_store_n(&g->timing, TGS_TIMER_IDLE, __ATOMIC_RELEASE);
            return 0;
        }
        g->timer[0] = a;
        g->timer[1] = b;
        g->timer_ctx = ctx;
        g->timer_gen = gen;
    }
    if (REAL(cuEventRecord)(g->timer[0], s) != CUDA_SUCCESS) {
        __atomic_store_n(&g->timing, TGS_TIMER_IDLE, __ATOMIC_RELEASE);
        return 0;
    }
    return 1;
}

/* Whether this launch is the one to time (the count needs no atomicity: a lost increment
 * only times a launch later). A kernel timed fewer than twice, or whose last reading is
 * to be confirmed (`new_kernel`), is timed whenever the timer is free. */
static inline int timer_start(struct tgs_gpu *g, CUstream s, uint64_t now, uintptr_t fn, uint64_t blocks,
                              int new_kernel) {
    if (__atomic_load_n(&g->timing, __ATOMIC_RELAXED) != TGS_TIMER_IDLE)
        return 0;
    unsigned n = __atomic_load_n(&g->untimed, __ATOMIC_RELAXED) + 1;
    __atomic_store_n(&g->untimed, n, __ATOMIC_RELAXED);
    unsigned after = __atomic_load_n(&g->time_after, __ATOMIC_RELAXED);
    if (n < after && g->ntimed >= TGS_TIMED && !new_kernel) {
        if (now < g->time_by_ns)
            return 0;
        g->time_by_ns = UINT64_MAX; /* until the one timed soon sets it again */
        unsigned soon = n + 1 + g->timer_rng % 8;
        if (soon < after)
            __atomic_store_n(&g->time_after, soon, __ATOMIC_RELAXED);
        return 0;
    }
    return timer_start_now(g, s, now, fn, blocks);
}

__attribute__((noinline)) static void timer_stop(struct tgs_gpu *g, CUstream s, int launched) {
    int ok = launched && REAL(cuEventRecord)(g->timer[1], s) == CUDA_SUCCESS;
    uint64_t end = g->queue_end_ns; /* this kernel's expected end */
    __atomic_store_n(&g->timer_ready_ns, end < g->timer_read_by_ns ? end : g->timer_read_by_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&g->timing, ok ? TGS_TIMER_RUNNING : TGS_TIMER_IDLE, __ATOMIC_RELEASE);
}

/* A reading of t ns for `fn` on `blocks` moves its length (kernel_length.h). Its
 * function notes that length on that grid size (or the reading, for a kernel the full
 * table cannot take: it stays new, and is timed whenever the timer is free). The reading
 * of a kernel known before (timed twice or more) confirms what was known, or does not:
 * the timer then samples fewer launches, or as many as at first. */
static void kernel_length_note(struct tgs_gpu *g, uintptr_t fn, uint64_t blocks, uint64_t t) {
    uint64_t ns = t ? t : 1; /* the reading, for a kernel the full table cannot take */
    struct tgs_kernel_length *k = kernel_slot(g, fn, blocks, 1);
    if (k) {
        uint32_t readings = k->readings;
        struct tgs_kernel_reading r =
            tgs_kernel_length_next(__atomic_load_n(&k->ns, __ATOMIC_RELAXED), k->last, readings, t);
        ns = r.len;
        k->last = t;
        __atomic_store_n(&k->ns, ns, __ATOMIC_RELEASE);
        __atomic_store_n(&k->recheck, (uint32_t)r.recheck, __ATOMIC_RELAXED);
        __atomic_store_n(&k->readings, readings + 1, __ATOMIC_RELEASE);
        unsigned was = g->time_every;
        g->time_every = tgs_time_every_next(was, readings >= 2, r.confirms);
        if (g->time_every < was) { /* the next timing not after the old interval's count */
            unsigned soon = g->time_every / 2 + g->timer_rng % g->time_every;
            if (soon < __atomic_load_n(&g->time_after, __ATOMIC_RELAXED))
                __atomic_store_n(&g->time_after, soon, __ATOMIC_RELAXED);
        }
        if (tgs_log_level >= TGS_LOG_DEBUG && g->time_every != was &&
            (g->time_every == TGS_TIME_EVERY_MAX || was == TGS_TIME_EVERY_MAX))
            tgs_log(TGS_LOG_DEBUG, "times one launch in %u (its kernels' lengths %s)", g->time_every,
                    r.confirms ? "confirmed" : "changed");
    }
    fn_length_note(g, fn, blocks, ns);
}

/* At debug level, once a second at most per process: how many readings were left out
 * (shared_and_longer), and the longest. */
__attribute__((noinline)) static void left_out_log(uint64_t ns, uint64_t now) {
    static struct per_second left;
    left.ns = ns > left.ns ? ns : left.ns;
    if (!per_second_count(&left, now))
        return;
    tgs_log(TGS_LOG_DEBUG, "in %.2f s %llu timings of its kernels were left out as longer than known, production's work having "
            "perhaps run while they were timed (the longest %.1f us)", (double)(now - left.since) / 1e9,
            (unsigned long long)left.n, (double)left.ns / 1e3);
    per_second_restart(&left, now);
}

/* Whether a reading of t ns may have production's time in it and is longer than what
 * anticipation takes the kernel to run (when anything is known of it). The GPU shares its
 * engine between contexts in time slices, so a kernel in flight when production's work
 * arrives is timed with production's slices in it: on an H200 beside a ResNet-50 of 25 ms
 * bursts, kernels of a GPT-2-sized job read up to 26.5 ms, its queue was expected to end
 * 62 ms ahead, and anticipation held its launches back 0.21 s/s (2026-11-29). It may have:
 * a launch of this process waited behind production while work it had queued still ran,
 * since the timer started (overlap_ns moved: drain_overlap), or production is busy now.
 * Such a reading only bounds the length from above, so it is left out when longer than
 * the length known, and kept when shorter: leaving out every such reading, a job of 1 ms
 * kernels beside two production processes of 25 % duty kept the 12.3 ms its first reading
 * (queued behind production) had made its length, and got 0.06 of the idle time on
 * simgpu against 0.9. */
static int shared_and_longer(struct tgs_gpu *g, uint64_t t) {
    if (__atomic_load_n(&g->ctr->overlap_ns, __ATOMIC_RELAXED) == g->timed_overlap_ns &&
        !(g->activity && production_busy(g)))
        return 0;
    uint64_t known = kernel_expected(g, kernel_known(g, g->timed_fn, g->timed_blocks));
    return known && t > known;
}

/* A timed kernel that has finished updates the estimate, unless its reading may have
 * production's time in it and is too long (shared_and_longer: the kernel is timed again
 * when the timer is free). */
__attribute__((noinline)) static void timer_read_now(struct tgs_gpu *g, uint64_t now) {
    int expected = TGS_TIMER_RUNNING;
    if (REAL(cuEventQuery)(g->timer[1]) == CUDA_ERROR_NOT_READY) {
        __atomic_store_n(&g->timer_ready_ns, now + TGS_TIMER_RETRY_NS, __ATOMIC_RELAXED);
        return;
    }
    if (!__atomic_compare_exchange_n(&g->timing, &expected, TGS_TIMER_BUSY, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        return;
    float ms = 0;
    int read = REAL(cuEventElapsedTime)(&ms, g->timer[0], g->timer[1]) == CUDA_SUCCESS && ms >= 0;
    uint64_t t = read ? (uint64_t)((double)ms * 1e6) : 0;
    if (read && shared_and_longer(g, t)) {
        if (tgs_log_level >= TGS_LOG_DEBUG)
            left_out_log(t, now);
    } else if (read) {
        g->timed_ns[g->ntimed++ % TGS_TIMED] = t;
        unsigned n = g->ntimed < TGS_TIMED ? g->ntimed : TGS_TIMED;
        uint64_t v[TGS_TIMED];
        for (unsigned i = 0; i < n; i++) { /* insertion sort of at most five */
            uint64_t x = g->timed_ns[i];
            unsigned j = i;
            for (; j && v[j - 1] > x; j--)
                v[j] = v[j - 1];
            v[j] = x;
        }
        uint64_t was = g->kernel_ns;
        g->kernel_ns = v[(n - 1) / 2];
        kernel_length_note(g, g->timed_fn, g->timed_blocks, t);
        if (tgs_log_level >= TGS_LOG_DEBUG && (g->kernel_ns > was + was / 16 || g->kernel_ns < was - was / 16))
            tgs_log(TGS_LOG_DEBUG, "its kernels run %.1f us (the median of %u timed)", (double)g->kernel_ns / 1e3, n);
    }
    __atomic_store_n(&g->timing, TGS_TIMER_IDLE, __ATOMIC_RELEASE);
}

/* Its end event is not queried before the timed kernel is expected to be done (queried on
 * every launch, it cost the launches queued behind a long kernel a driver call each), nor
 * more than once in TGS_TIMER_RETRY_NS after that; and at the latest TGS_TIMER_READ_NS
 * after it was launched: an estimate far too long must not keep the reading that corrects
 * it from being read. (Read only at its expected end, one reading of 134 ms among 20 us
 * kernels on simgpu put that end seconds ahead, and the estimate stayed there: the job,
 * alone, kept the GPU busy half the time.) */
static inline void timer_read(struct tgs_gpu *g, uint64_t now) {
    if (unlikely(__atomic_load_n(&g->timing, __ATOMIC_RELAXED) == TGS_TIMER_RUNNING) &&
        now >= __atomic_load_n(&g->timer_ready_ns, __ATOMIC_RELAXED))
        timer_read_now(g, now);
}

/* ---------- opportunistic: tokens ---------- */

#define GATE_POLL_NS 100000ull   /* production-busy re-check while waiting */
#define OVERRUN_KERNEL 8         /* a kernel may end this part of itself late, */
#define OVERRUN_GAP 32           /* or this part of production's gap if that is less */
#define SLIGHT_GAP 128           /* a wait of production's for this part of its gap is slight, */
#define SLIGHT_WINDOW 16         /* or of the window it is expected back in if that is less */
#define PAUSE_POLL_NS 1000000ull /* a paused budget is re-read this often */
#define DECAY_MS 5000ull         /* a stale budget slides to the floor over this long */
#define BACKLOG_NS 200000000ull  /* a bucket this far ahead came from an older, slower rate */
#define RATE_POLL_NS 10000000ull /* a launch waiting for tokens re-reads the budget this often */

static uint64_t fp_of(uint64_t rate) { return rate ? (uint64_t)((1000000000.0 * 65536.0) / (double)rate) : 0; }

/* The rate to spend at now: the budget's, or when tgsd's heartbeat is stale, sliding from
 * it to the floor. Sets *fp to ns per block in fixed point. */
static uint64_t effective_rate(const volatile struct tgs_gpu_budget *b, uint64_t now, uint64_t *fp) {
    uint64_t rate = b->rate_blocks_per_s, age;
    *fp = b->ns_per_block_fp;
    if (likely(!tgs_heartbeat_age_ms(now, &age)))
        return rate;
    uint64_t floor = b->floor_blocks_per_s, over = age - g_tgs.daemon->stale_ms;
    if (age == UINT64_MAX || over >= DECAY_MS || rate == TGS_RATE_UNLIMITED || rate <= floor) {
        if (rate != TGS_RATE_UNLIMITED && rate <= floor && age != UINT64_MAX && over < DECAY_MS)
            return rate;
        *fp = fp_of(floor);
        return floor;
    }
    uint64_t r = rate - (uint64_t)((double)(rate - floor) * (double)over / (double)DECAY_MS);
    *fp = fp_of(r);
    return r;
}

/* Waits for a launch's tokens. The wait is slept in slices of RATE_POLL_NS, the budget read
 * again after each: a launch of many blocks under a low rate may owe seconds, and slept in
 * one piece it kept its thread asleep long after tgsd had lifted the limit (on an H100, an
 * opportunistic PyTorch job launched 2.8 million blocks/s in the second after a cut to
 * 68,000 was undone, against 39 million or more later, and tgsd based its next cut on
 * that). */
static void take_tokens(struct tgs_gpu *g, uint64_t blocks, uint64_t *now) {
    const volatile struct tgs_gpu_budget *b = g->budget;
    for (;;) {
        uint64_t fp, rate = effective_rate(b, *now, &fp);
        if (rate == TGS_RATE_UNLIMITED)
            return;
        if (rate == 0 || fp == 0) { /* paused */
            tgs_sleep_until(*now + PAUSE_POLL_NS);
            *now = tgs_now();
            continue;
        }
        uint64_t cost = (uint64_t)(((unsigned __int128)blocks * fp) >> TGS_NS_PER_BLOCK_SHIFT);
        uint64_t tau = (uint64_t)(((unsigned __int128)b->burst_blocks * fp) >> TGS_NS_PER_BLOCK_SHIFT);
        uint64_t tat = __atomic_load_n(&g->ctr->gcra_tat_ns, __ATOMIC_RELAXED);
        uint64_t base = tat > *now ? tat : *now;
        if (base > *now + tau + cost + BACKLOG_NS)
            base = *now;
        if (base - *now > tau) {
            tgs_sleep_until(base - tau < *now + RATE_POLL_NS ? base - tau : *now + RATE_POLL_NS);
            *now = tgs_now();
            continue;
        }
        if (__atomic_compare_exchange_n(&g->ctr->gcra_tat_ns, &tat, base + cost, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
            return;
    }
}

static int must_wait_for_production(struct tgs_gpu *g, uint64_t now) {
    uint64_t age;
    /* While tgsd is gone a dead production process may never clear its byte: then the
     * floor rate alone decides. */
    return (g->budget->flags & TGS_GPU_GATE) && g->activity && production_busy(g) && !tgs_heartbeat_age_ms(now, &age);
}

/* ---------- opportunistic: what of its work runs beside production ---------- */

/* Whether work on s is being captured into a graph (then it does not run). */
static int capturing(CUstream s) {
    if (likely(!__atomic_load_n(&g_tgs.captures, __ATOMIC_RELAXED)))
        return 0;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    return real_cuStreamIsCapturing && REAL(cuStreamIsCapturing)(s, &st) == CUDA_SUCCESS &&
           st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* The launching thread waited `ns` for a cause other than production (tgs_shim_part). */
static void count_wait(uint64_t *counter, uint64_t ns) {
    if (ns)
        __atomic_fetch_add(counter, ns, __ATOMIC_RELAXED);
}

/* The launching thread waited behind busy production for `gated` ns, `overlap` of which its
 * own queued work was running (tgs_proto.h: gated_ns, overlap_ns). */
static void count_gated(struct tgs_gpu *g, uint64_t gated, uint64_t overlap) {
    __atomic_fetch_add(&g->ctr->gated_ns, gated, __ATOMIC_RELAXED);
    if (overlap)
        __atomic_fetch_add(&g->ctr->overlap_ns, overlap, __ATOMIC_RELAXED);
}

/* The first wait behind production after a launch records an event behind the queued
 * work (on the stream the waiting launch is for: the one the process is using, and live;
 * work it queued on other streams is not covered), and the waits after it query that
 * event: its work still runs beside production, or is done. A launch is seen in the
 * container's launch count (drain_launches: the count the event was recorded at), so the
 * launch path does nothing for this. One thread at a time records or queries
 * (TGS_DRAIN_BUSY); another finds the work taken as running. */
static void drain_record(struct tgs_gpu *g, CUstream s) {
    uint64_t launches = __atomic_load_n(&g->ctr->launches, __ATOMIC_RELAXED);
    int st = __atomic_load_n(&g->drain_state, __ATOMIC_ACQUIRE);
    if (st == TGS_DRAIN_BUSY ||
        (st != TGS_DRAIN_NONE && __atomic_load_n(&g->drain_launches, __ATOMIC_RELAXED) == launches) ||
        !__atomic_compare_exchange_n(&g->drain_state, &st, TGS_DRAIN_BUSY, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        return;
    __atomic_store_n(&g->drain_launches, launches, __ATOMIC_RELAXED);
    CUcontext ctx = NULL;
    REAL(cuCtxGetCurrent)(&ctx);
    unsigned gen = tgs_context_generation();
    st = TGS_DRAIN_UNKNOWN;
    if (!event_serves(&g->drain, g->drain_ctx, g->drain_gen, ctx, gen) &&
        REAL(cuEventCreate)(&g->drain, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS) {
        g->drain_ctx = ctx;
        g->drain_gen = gen;
    }
    if (g->drain && !capturing(s) && REAL(cuEventRecord)(g->drain, s) == CUDA_SUCCESS)
        st = TGS_DRAIN_RUNNING;
    __atomic_store_n(&g->drain_state, st, __ATOMIC_RELEASE);
}

/* How much of a wait of `ns` the queued work ran beside production: all of it while its
 * event is not done (or none could be recorded), half of it when it was done at the end
 * (it ended somewhere in the wait), none once it was done before. */
static uint64_t drain_overlap(struct tgs_gpu *g, uint64_t ns) {
    int st = TGS_DRAIN_RUNNING;
    if (!__atomic_compare_exchange_n(&g->drain_state, &st, TGS_DRAIN_BUSY, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        return st == TGS_DRAIN_DONE ? 0 : ns;
    int running = REAL(cuEventQuery)(g->drain) == CUDA_ERROR_NOT_READY;
    __atomic_store_n(&g->drain_state, running ? TGS_DRAIN_RUNNING : TGS_DRAIN_DONE, __ATOMIC_RELEASE);
    return running ? ns : ns / 2;
}

/* Sleeps one gate poll behind busy production, and counts the wait and the part of it in
 * which the process's own queued work still ran: production beside or behind
 * opportunistic work, the way this one can slow it down while the gate holds its launches
 * back. tgsd reads the two against production's busy time: a fall of production's
 * progress with next to no overlap seen is production's own. */
static void wait_for_production(struct tgs_gpu *g, uint64_t now, CUstream s) {
    drain_record(g, s);
    tgs_sleep_until(now + GATE_POLL_NS);
    uint64_t ns = tgs_now() - now;
    count_gated(g, ns, drain_overlap(g, ns));
}

/* Whether a kernel of k ns starting at `start` (its queue ahead of it) and launched `now`
 * runs into one production process's next launch (e: its expectation, live until
 * `until`): it may end a little after production is due (this process's own start in the
 * gap lags production's idle moment by up to a gate poll); kernels too long for that
 * process's gaps are not held back (the gate and the controller alone decide, as without
 * anticipation), but where the process has gone idle inside a step and the spell after
 * the step (`later`) is long enough for them: they wait for that (let go, they held
 * production back at its spells inside: 3.2-3.3 ms of each 1.05 s iteration on simgpu
 * beside 1 ms kernels). Nor is one held back that, with its queue, would hold
 * production's return back by no more than 1/SLIGHT_GAP of its gap and 1/SLIGHT_WINDOW of
 * the window it is expected back in. Production comes back anywhere in that window: a job
 * whose spells vary (a window as wide as a third of its spell) gives opportunistic work
 * about half of it each iteration, and waits behind it about half the slight part, at
 * most a sixteenth of what it gives (held back from the shortest spell on, beside spells
 * drawn within +-33 % of 1 s, 1 ms kernels left opportunistic work 0.69-0.71 of the idle
 * time on simgpu, to spare production 2 ms or so an iteration of 1.2 s). A regular job (a
 * window of its jitter) gives nothing, and waits next to nothing (with 1/SLIGHT_GAP of
 * its gap alone, 2.3 ms of each 0.8 s iteration beside 0.6 s spells, for no gain). */
static int runs_into(const volatile struct tgs_expectation *e, uint64_t later, uint64_t now, uint64_t until,
                     uint64_t start, uint64_t k) {
    uint64_t due = __atomic_load_n(&e->due_ns, __ATOMIC_RELAXED);
    uint64_t idle = __atomic_load_n(&e->idle_ns, __ATOMIC_RELAXED);
    uint64_t gap = due > idle ? due - idle : 0, window = until > due ? until - due : 0;
    uint64_t overrun = k / OVERRUN_KERNEL < gap / OVERRUN_GAP ? k / OVERRUN_KERNEL : gap / OVERRUN_GAP;
    uint64_t slight = gap / SLIGHT_GAP < window / SLIGHT_WINDOW ? gap / SLIGHT_GAP : window / SLIGHT_WINDOW;
    return start + k > due + overrun && (k <= gap || k <= later) && start + k - now > slight;
}

/* Called only when the budget says TGS_GPU_ANTICIPATE.
 * 0 when a kernel of k ns launched now would be done before each production process that has
 * gone idle is next expected (or has let its expected window pass without launching);
 * else when to look again. */
__attribute__((noinline)) static uint64_t hold_back_until(struct tgs_gpu *g, uint64_t now, uint64_t k) {
    if (!g->expect || !k)
        return 0;
    uint32_t n = __atomic_load_n(g->expect_slots, __ATOMIC_ACQUIRE);
    n = n < TGS_EXPECT_SLOTS ? n : TGS_EXPECT_SLOTS;
    uint64_t start = g->queue_end_ns > now ? g->queue_end_ns : now, look = 0;
    for (uint32_t i = 0; i < n; i++) {
        const volatile struct tgs_expectation *e = &g->expect[i];
        uint64_t until = __atomic_load_n(&e->due_until_ns, __ATOMIC_ACQUIRE);
        if (now >= until || !runs_into(e, __atomic_load_n(&g->step_spell[i], __ATOMIC_RELAXED), now, until, start, k))
            continue;
        uint64_t again = until < now + GATE_POLL_NS ? until : now + GATE_POLL_NS;
        look = look && look < again ? look : again;
    }
    return look;
}

/* What a launch held back by anticipation saw when it was first held: for the debug log
 * that says why (the kernel's expected length, how far ahead its process's queue was
 * expected to end, and when production was next due). */
struct held {
    uint64_t from, ns;    /* held from then (0: not held), for this long in all */
    uint64_t ahead, due;  /* its queue's expected end, production's soonest due time: from `from` */
};

__attribute__((noinline)) static void held_first(struct tgs_gpu *g, struct held *h, uint64_t now) {
    h->from = now;
    h->ns = 0;
    h->ahead = g->queue_end_ns > now ? g->queue_end_ns - now : 0;
    h->due = UINT64_MAX;
    uint32_t n = __atomic_load_n(g->expect_slots, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < n && i < TGS_EXPECT_SLOTS; i++) {
        uint64_t due = __atomic_load_n(&g->expect[i].due_ns, __ATOMIC_RELAXED);
        if (now < __atomic_load_n(&g->expect[i].due_until_ns, __ATOMIC_ACQUIRE) && due < h->due)
            h->due = due;
    }
}

/* At debug level, a launch held back half a millisecond or more says why, once a second
 * at most per process. */
#define HELD_LOG_NS 500000ull
__attribute__((noinline)) static void held_log(const struct held *h, uint64_t k) {
    static uint64_t last;
    if (h->ns < HELD_LOG_NS || (last && h->from < last + 1000000000ull))
        return;
    last = h->from;
    char due[48] = "not known";
    if (h->due != UINT64_MAX)
        snprintf(due, sizeof due, "in %.2f ms", ((double)h->due - (double)h->from) / 1e6); /* < 0: overdue */
    tgs_log(TGS_LOG_DEBUG, "held a launch back %.2f ms anticipating production: the kernel expected to run %.1f us, "
            "its queue to end %.2f ms ahead, production due %s", (double)h->ns / 1e6, (double)k / 1e3,
            (double)h->ahead / 1e6, due);
}

/* When anticipation holds a kernel of k ns back until (0: it goes now). Where its own
 * queue is expected to end ahead, the hold is decided again on the batches done by now
 * (queue_end_refresh). */
__attribute__((noinline)) static uint64_t anticipation_holds(struct tgs_gpu *g, uint64_t now, uint64_t k) {
    uint64_t until = hold_back_until(g, now, k);
    if (until && g->queue_end_ns > now) {
        queue_end_refresh(g);
        until = hold_back_until(g, now, k);
    }
    return until;
}

static int must_hold_back(struct tgs_gpu *g, uint64_t now, int anticipate, uint64_t k) {
    return must_wait_for_production(g, now) || (anticipate && anticipation_holds(g, now, k));
}

struct launch {
    struct tgs_gpu *g;
    uint64_t blocks;
    int timed;         /* between the timer's events */
    uint64_t bound_ns; /* opportunistic: the work it may have in flight (0: unbounded), */
    uint64_t cost_ns;  /* and what this launch counts for */
    int new_kernel;    /* timed fewer than twice, or its last reading to be confirmed */
};

/* Admits one launch of `fn` (what is launched) on `blocks`; returns when, if it
 * anticipates production or its kernels in flight are bounded (then it may be timed),
 * else 0. Sets L->bound_ns (the work it may have in flight, 0: unbounded) and L->cost_ns. */
static uint64_t opportunistic_admit(struct tgs_gpu *g, struct launch *L, CUstream s, uintptr_t fn, uint64_t blocks) {
    const volatile struct tgs_gpu_budget *b = g->budget;
    uint64_t age;
    if (!(b->flags & (TGS_GPU_GATE | TGS_GPU_ANTICIPATE)) && !b->inflight_max &&
        b->rate_blocks_per_s == TGS_RATE_UNLIMITED && !tgs_heartbeat_age_ms(tgs_now_coarse(), &age)) {
        /* free (no production on the GPU): nothing to wait for, and nothing that needs the
         * time closer than the heartbeat's age does (the coarse clock costs a launch 6.5 ns
         * on an Intel Xeon VM, tgs_now 9 scaling the TSC and 22 where it is clock_gettime) */
        L->new_kernel = 0;
        L->bound_ns = L->cost_ns = 0;
        return 0;
    }
    uint64_t now = tgs_now(), start = now, until;
    int anticipate = (b->flags & TGS_GPU_ANTICIPATE) != 0;
    int timing = anticipate || b->inflight_max;
    struct kernel_known kn = {0, 0, 0, 0};
    if (timing) {
        timer_read(g, now);
        kn = kernel_known(g, fn, blocks);
    }
    L->new_kernel = timing && (!kn.twice || kn.recheck);
    uint64_t k = timing ? kernel_expected(g, kn) : 0; /* read only when timing */
    uint64_t cost = kernel_cost(kn);
    int paid = 0; /* tokens are spent once per launch, however often production makes it wait */
    struct held held;
    held.from = 0; /* the rest is set when it is first held, at debug level */
    for (;;) {
        for (;;) {
            if (must_wait_for_production(g, now)) {
                wait_for_production(g, now, s);
            } else if (anticipate && (until = anticipation_holds(g, now, k))) {
                if (!held.from && tgs_log_level >= TGS_LOG_DEBUG)
                    held_first(g, &held, now);
                tgs_sleep_until(until);
                uint64_t slept = tgs_now() - now;
                if (held.from)
                    held.ns += slept;
                count_wait(&g_tgs.shim->anticipation_wait_ns, slept);
            } else {
                break;
            }
            now = tgs_now();
        }
        unsigned max = b->inflight_max;
        uint64_t before = now;
        L->bound_ns = (uint64_t)(max < TGS_INFLIGHT_RING ? max : TGS_INFLIGHT_RING) * TGS_INFLIGHT_QUANTUM_NS;
        L->cost_ns = max ? cost : 0;
        if (max && inflight_wait(g, L->bound_ns, L->cost_ns)) {
            now = tgs_now();
            count_wait(&g_tgs.shim->inflight_wait_ns, now - before);
        }
        if (!paid) {
            uint64_t was = now;
            take_tokens(g, blocks, &now);
            count_wait(&g_tgs.shim->token_wait_ns, now - was);
            paid = 1;
        }
        /* production may have started, or come due, while this thread waited: look again
         * (the tokens stay spent: paying at each look, a launch beside a busy production
         * could wait for ever while its budget went unused) */
        if (now == before || !must_hold_back(g, now, anticipate, k))
            break;
        /* it waited for its own kernels or for tokens and finds production busy, which may
         * have started at any moment of that wait: the whole wait counts as one behind
         * production (overstated, towards harm: the safe side) */
        if (must_wait_for_production(g, now))
            count_gated(g, now - before, now - before);
    }
    if (held.from)
        held_log(&held, k);
    if (timing) {
        uint64_t q = g->queue_end_ns;
        g->queue_end_ns = (q > now ? q : now) + k;
    }
    if (now != start) {
        __atomic_fetch_add(&g->ctr->throttled_ns, now - start, __ATOMIC_RELAXED);
        __atomic_fetch_add(&g->ctr->waits, 1, __ATOMIC_RELAXED);
    }
    return timing ? now : 0;
}

/* ---------- the launch path ---------- */

/* The stream a per-thread entry point means by NULL. */
static inline CUstream pt_stream(CUstream s, int per_thread) { return per_thread && !s ? CU_STREAM_PER_THREAD : s; }

/* Inlined into each wrapper: called, it cost production's launch about 20 instructions. */
static inline __attribute__((always_inline)) void launch_begin(struct launch *L, CUstream s, const void *what,
                                                               uint64_t blocks) {
    L->g = NULL;
    if (!tgs_ready() || capturing(s))
        return;
    CUcontext ctx = NULL;
    struct tgs_gpu *g = tgs_current_gpu_in(&ctx);
    if (!g)
        return;
    L->g = g;
    L->blocks = blocks;
    L->timed = 0;
    L->bound_ns = 0;
    if (g_tgs.cls == TGS_CLASS_OPPORTUNISTIC) {
        uint64_t now = opportunistic_admit(g, L, s, (uintptr_t)what, blocks);
        if (now)
            L->timed = timer_start(g, s, now, (uintptr_t)what, blocks, L->new_kernel);
    } else {
        note_stream(g, s, ctx);
        mark_busy(g); /* before the launch: no opportunistic launch slips in between */
    }
}

static inline void launch_end(struct launch *L, CUresult r, CUstream s, uint64_t kernels) {
    if (!L->g)
        return;
    struct tgs_gpu *g = L->g;
    if (unlikely(L->timed))
        timer_stop(g, s, r == CUDA_SUCCESS);
    if (r != CUDA_SUCCESS)
        return;
    __atomic_fetch_add(&g->ctr->launches, kernels, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&g->ctr->blocks, L->blocks, __ATOMIC_RELAXED);
    if (g_tgs.cls == TGS_CLASS_OPPORTUNISTIC) {
        if (L->bound_ns)
            inflight_record(g, s, L->bound_ns, L->cost_ns);
    } else if (unlikely(!__atomic_load_n(&g->busy_marked, __ATOMIC_SEQ_CST))) {
        /* found idle during the launch (queried, synced): after the count, which a query
         * reads after its check, so that one of the two sees the other */
        mark_busy_again(g);
    }
}

static inline uint64_t grid(unsigned x, unsigned y, unsigned z) { return (uint64_t)x * y * z; }

#define LAUNCH_WRAPPER(NAME, PT)                                                                            \
    TGS_API CUresult CUDAAPI NAME(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,               \
                                  unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,    \
                                  unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,    \
                                  void **kernelParams, void **extra) {                                      \
        struct launch L;                                                                                    \
        CUstream s = pt_stream(hStream, PT);                                                                \
        launch_begin(&L, s, f, grid(gridDimX, gridDimY, gridDimZ));                                         \
        CUresult r = real_##NAME(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,          \
                                 sharedMemBytes, hStream, kernelParams, extra);                             \
        launch_end(&L, r, s, 1);                                                                            \
        return r;                                                                                           \
    }
LAUNCH_WRAPPER(cuLaunchKernel, 0)
LAUNCH_WRAPPER(cuLaunchKernel_ptsz, 1)

#define LAUNCH_EX_WRAPPER(NAME, PT)                                                                        \
    TGS_API CUresult CUDAAPI NAME(const CUlaunchConfig *config, CUfunction f, void **kernelParams,         \
                                  void **extra) {                                                          \
        struct launch L = {0};                                                                             \
        CUstream s = config ? pt_stream(config->hStream, PT) : NULL;                                       \
        if (config)                                                                                        \
            launch_begin(&L, s, f, grid(config->gridDimX, config->gridDimY, config->gridDimZ));           \
        CUresult r = real_##NAME(config, f, kernelParams, extra);                                          \
        launch_end(&L, r, s, 1);                                                                           \
        return r;                                                                                          \
    }
LAUNCH_EX_WRAPPER(cuLaunchKernelEx, 0)
LAUNCH_EX_WRAPPER(cuLaunchKernelEx_ptsz, 1)

#define LAUNCH_COOP_WRAPPER(NAME, PT)                                                                       \
    TGS_API CUresult CUDAAPI NAME(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,               \
                                  unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,    \
                                  unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,    \
                                  void **kernelParams) {                                                    \
        struct launch L;                                                                                    \
        CUstream s = pt_stream(hStream, PT);                                                                \
        launch_begin(&L, s, f, grid(gridDimX, gridDimY, gridDimZ));                                         \
        CUresult r = real_##NAME(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,          \
                                 sharedMemBytes, hStream, kernelParams);                                    \
        launch_end(&L, r, s, 1);                                                                            \
        return r;                                                                                           \
    }
LAUNCH_COOP_WRAPPER(cuLaunchCooperativeKernel, 0)
LAUNCH_COOP_WRAPPER(cuLaunchCooperativeKernel_ptsz, 1)

/* ---------- graphs: their cost is counted once, at instantiate ---------- */

struct graph_cost {
    CUgraphExec exec;
    uint64_t blocks, kernels;
};
static pthread_mutex_t g_graph_lock = PTHREAD_MUTEX_INITIALIZER;
static struct graph_cost *g_graphs;
static size_t g_ngraphs, g_graph_cap;

static void graph_measure(CUgraphExec exec, CUgraph graph) {
    size_t n = 0;
    if (!real_cuGraphGetNodes || REAL(cuGraphGetNodes)(graph, NULL, &n) != CUDA_SUCCESS)
        return;
    CUgraphNode *nodes = calloc(n ? n : 1, sizeof *nodes);
    if (!nodes || REAL(cuGraphGetNodes)(graph, nodes, &n) != CUDA_SUCCESS) {
        free(nodes);
        return;
    }
    struct graph_cost c = {exec, 0, 0};
    for (size_t i = 0; i < n; i++) {
        CUgraphNodeType t;
        CUDA_KERNEL_NODE_PARAMS p;
        if (REAL(cuGraphNodeGetType)(nodes[i], &t) == CUDA_SUCCESS && t == CU_GRAPH_NODE_TYPE_KERNEL &&
            real_cuGraphKernelNodeGetParams_v2 && REAL(cuGraphKernelNodeGetParams_v2)(nodes[i], &p) == CUDA_SUCCESS) {
            c.blocks += grid(p.gridDimX, p.gridDimY, p.gridDimZ);
            c.kernels++;
        }
    }
    free(nodes);
    pthread_mutex_lock(&g_graph_lock);
    if (g_ngraphs == g_graph_cap) {
        size_t cap = g_graph_cap ? g_graph_cap * 2 : 16;
        struct graph_cost *m = realloc(g_graphs, cap * sizeof *m);
        if (m) {
            g_graphs = m;
            g_graph_cap = cap;
        }
    }
    if (g_ngraphs < g_graph_cap)
        g_graphs[g_ngraphs++] = c;
    pthread_mutex_unlock(&g_graph_lock);
}

static struct graph_cost graph_cost_of(CUgraphExec exec, int remove) {
    struct graph_cost c = {exec, 0, 0};
    pthread_mutex_lock(&g_graph_lock);
    for (size_t i = 0; i < g_ngraphs; i++) {
        if (g_graphs[i].exec == exec) {
            c = g_graphs[i];
            if (remove)
                g_graphs[i] = g_graphs[--g_ngraphs];
            break;
        }
    }
    pthread_mutex_unlock(&g_graph_lock);
    return c;
}

static CUresult instantiated(CUresult r, CUgraphExec *exec, CUgraph graph) {
    if (r == CUDA_SUCCESS && exec && tgs_ready())
        graph_measure(*exec, graph);
    return r;
}

TGS_API CUresult CUDAAPI cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                            char *logBuffer, size_t bufferSize) {
    return instantiated(REAL(cuGraphInstantiate)(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize), phGraphExec,
                        hGraph);
}
TGS_API CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                               char *logBuffer, size_t bufferSize) {
    return instantiated(REAL(cuGraphInstantiate_v2)(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize),
                        phGraphExec, hGraph);
}
TGS_API CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                     unsigned long long flags) {
    return instantiated(REAL(cuGraphInstantiateWithFlags)(phGraphExec, hGraph, flags), phGraphExec, hGraph);
}
TGS_API CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                      CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
    return instantiated(REAL(cuGraphInstantiateWithParams)(phGraphExec, hGraph, instantiateParams), phGraphExec,
                        hGraph);
}
TGS_API CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                           CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
    return instantiated(REAL(cuGraphInstantiateWithParams_ptsz)(phGraphExec, hGraph, instantiateParams), phGraphExec,
                        hGraph);
}

TGS_API CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec) {
    graph_cost_of(hGraphExec, 1);
    return REAL(cuGraphExecDestroy)(hGraphExec);
}

#define GRAPH_LAUNCH_WRAPPER(NAME, PT)                                                      \
    TGS_API CUresult CUDAAPI NAME(CUgraphExec hGraphExec, CUstream hStream) {               \
        struct launch L;                                                                    \
        CUstream s = pt_stream(hStream, PT);                                                \
        struct graph_cost c = graph_cost_of(hGraphExec, 0);                                 \
        launch_begin(&L, s, hGraphExec, c.blocks);                                          \
        CUresult r = real_##NAME(hGraphExec, hStream);                                      \
        launch_end(&L, r, s, c.kernels);                                                    \
        return r;                                                                           \
    }
GRAPH_LAUNCH_WRAPPER(cuGraphLaunch, 0)
GRAPH_LAUNCH_WRAPPER(cuGraphLaunch_ptsz, 1)

/* ---------- stream capture: work on a capturing stream is not counted ---------- */

static CUresult capture_began(CUresult r) {
    if (r == CUDA_SUCCESS)
        __atomic_add_fetch(&g_tgs.captures, 1, __ATOMIC_RELAXED);
    return r;
}

static CUresult capture_ended(CUresult r) {
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED || r == CUDA_ERROR_STREAM_CAPTURE_UNJOINED ||
        r == CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) {
        int n = __atomic_load_n(&g_tgs.captures, __ATOMIC_RELAXED);
        while (n > 0 && !__atomic_compare_exchange_n(&g_tgs.captures, &n, n - 1, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        }
    }
    return r;
}

TGS_API CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream) { return capture_began(REAL(cuStreamBeginCapture)(hStream)); }
TGS_API CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream hStream) {
    return capture_began(REAL(cuStreamBeginCapture_ptsz)(hStream));
}
TGS_API CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
    return capture_began(REAL(cuStreamBeginCapture_v2)(hStream, mode));
}
TGS_API CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
    return capture_began(REAL(cuStreamBeginCapture_v2_ptsz)(hStream, mode));
}
TGS_API CUresult CUDAAPI cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,
                                                     const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                                     CUstreamCaptureMode mode) {
    return capture_began(
        REAL(cuStreamBeginCaptureToGraph)(hStream, hGraph, dependencies, dependencyData, numDependencies, mode));
}
TGS_API CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                          const CUgraphNode *dependencies,
                                                          const CUgraphEdgeData *dependencyData,
                                                          size_t numDependencies, CUstreamCaptureMode mode) {
    return capture_began(
        REAL(cuStreamBeginCaptureToGraph_ptsz)(hStream, hGraph, dependencies, dependencyData, numDependencies, mode));
}
TGS_API CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
    return capture_ended(REAL(cuStreamEndCapture)(hStream, phGraph));
}
TGS_API CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph) {
    return capture_ended(REAL(cuStreamEndCapture_ptsz)(hStream, phGraph));
}

/* ---------- synchronisations and queries: production found idle ---------- */

/* What the process launched on `g` is done: a completed synchronisation, or a query that
 * found every stream drained. */
static void work_done(struct tgs_gpu *g) {
    __atomic_fetch_add(&g->ctr->syncs, 1, __ATOMIC_RELAXED);
    if (g_tgs.cls == TGS_CLASS_PRODUCTION) {
        uint64_t idle = tgs_production_idle(g);
        if (idle)
            expect_next(g, idle);
    } else { /* what it launched is done (on this stream at least): a new queue */
        __atomic_add_fetch(&g->queue_starts, 1, __ATOMIC_RELAXED);
        g->queue_end_ns = 0;
    }
}

/* What a completed synchronisation waited for. */
enum sync_scope {
    SYNC_ELSEWHERE, /* another context than the current one: says nothing of this one */
    SYNC_CONTEXT,   /* all the current context's work */
    SYNC_PART,      /* one stream's or one event's: production stays busy where another of
                     * its streams still has work (an inference server's threads, each
                     * synchronising its own stream); what cannot be asked is taken as done */
};

static CUresult synced(CUresult r, enum sync_scope scope) {
    if (r != CUDA_SUCCESS || scope == SYNC_ELSEWHERE || !tgs_ready())
        return r;
    CUcontext ctx = NULL;
    struct tgs_gpu *g = tgs_current_gpu_in(&ctx);
    if (!g)
        return r;
    if (scope == SYNC_PART && g_tgs.cls == TGS_CLASS_PRODUCTION && __atomic_load_n(&g->busy_marked, __ATOMIC_RELAXED) &&
        streams_state(g, ctx) == STREAMS_BUSY)
        return r;
    work_done(g);
    return r;
}

/* A query that succeeded, in a busy production process: idle if every stream it launched
 * on is drained, and it launched nothing meanwhile. (So is a unified copy: it may or may
 * not have waited, and the streams say which.) A launch under way when the streams
 * were asked (its kernel not yet on a stream) finds production idle when it has been
 * counted, and marks it busy again (launch_end); only a launch counted between the
 * second reading of the count here and the byte's clearing, a few instructions, can
 * still run unmarked until the process's next launch. */
static CUresult queried(CUresult r) {
    if (r != CUDA_SUCCESS || g_tgs.cls != TGS_CLASS_PRODUCTION || !tgs_ready())
        return r;
    CUcontext ctx = NULL;
    struct tgs_gpu *g = tgs_current_gpu_in(&ctx);
    if (!g || !__atomic_load_n(&g->busy_marked, __ATOMIC_RELAXED))
        return r;
    uint64_t launches = __atomic_load_n(&g->ctr->launches, __ATOMIC_RELAXED);
    if (streams_state(g, ctx) == STREAMS_DRAINED && __atomic_load_n(&g->ctr->launches, __ATOMIC_SEQ_CST) == launches)
        work_done(g);
    return r;
}

TGS_API CUresult CUDAAPI cuEventQuery(CUevent hEvent) { return queried(REAL(cuEventQuery)(hEvent)); }
TGS_API CUresult CUDAAPI cuStreamQuery(CUstream hStream) { return queried(REAL(cuStreamQuery)(hStream)); }
TGS_API CUresult CUDAAPI cuStreamQuery_ptsz(CUstream hStream) { return queried(REAL(cuStreamQuery_ptsz)(hStream)); }

TGS_API CUresult CUDAAPI cuStreamDestroy(CUstream hStream) {
    forget_stream(hStream);
    return REAL(cuStreamDestroy)(hStream);
}
TGS_API CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream) {
    forget_stream(hStream);
    return REAL(cuStreamDestroy_v2)(hStream);
}

TGS_API CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
    return synced(REAL(cuStreamSynchronize)(hStream), SYNC_PART);
}
/* A synchronous copy to the host returns once the work queued before it on its stream is
 * done: a completed synchronisation, for programs that end their iterations with one
 * instead of a stream or context synchronisation. */
TGS_API CUresult CUDAAPI cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
    return synced(REAL(cuMemcpyDtoH_v2)(dstHost, srcDevice, ByteCount), SYNC_PART);
}
TGS_API CUresult CUDAAPI cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
    return synced(REAL(cuMemcpyDtoH_v2_ptds)(dstHost, srcDevice, ByteCount), SYNC_PART);
}
/* The unified synchronous copy (cudaMemcpy may make its copies to the host with it) waits
 * for its stream's work only where it copies to the host: between device buffers it may
 * return before that work is done. Not a synchronisation, then, but a question: production
 * is idle after it where every stream it launched on is drained (as after a query). */
TGS_API CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
    return queried(REAL(cuMemcpy)(dst, src, ByteCount));
}
TGS_API CUresult CUDAAPI cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
    return queried(REAL(cuMemcpy_ptds)(dst, src, ByteCount));
}
TGS_API CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream) {
    return synced(REAL(cuStreamSynchronize_ptsz)(hStream), SYNC_PART);
}
TGS_API CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
    return synced(REAL(cuEventSynchronize)(hEvent), SYNC_PART);
}
TGS_API CUresult CUDAAPI cuCtxSynchronize(void) { return synced(REAL(cuCtxSynchronize)(), SYNC_CONTEXT); }
TGS_API CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
    CUcontext cur = NULL;
    if (ctx && real_cuCtxGetCurrent)
        REAL(cuCtxGetCurrent)(&cur);
    return synced(REAL(cuCtxSynchronize_v2)(ctx), !ctx || ctx == cur ? SYNC_CONTEXT : SYNC_ELSEWHERE);
}

/* ---------- contexts that end: what the shim cached for them goes ---------- */

TGS_API CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) {
    CUresult r = REAL(cuCtxDestroy_v2)(ctx);
    if (r == CUDA_SUCCESS)
        tgs_forget_contexts();
    return r;
}
/* the last release of a primary context destroys it (cudart's teardown) */
TGS_API CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    CUresult r = REAL(cuDevicePrimaryCtxRelease_v2)(dev);
    if (r == CUDA_SUCCESS)
        tgs_forget_contexts();
    return r;
}
/* cudaDeviceReset: the primary context's handle stays, its events do not */
TGS_API CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    CUresult r = REAL(cuDevicePrimaryCtxReset_v2)(dev);
    if (r == CUDA_SUCCESS)
        tgs_forget_contexts();
    return r;
}
