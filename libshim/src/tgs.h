/* libtgs.so: the interception library loaded into every process of a TGS container.
 * Internal header. The design is ARCHITECTURE.md ("Interception", "Compute sharing",
 * "Memory sharing"); the contract with tgsd is include/tgs_proto.h. */
#ifndef TGS_SHIM_H
#define TGS_SHIM_H

#include "glibc_compat.h"

#define __CUDA_API_VERSION_INTERNAL 1 /* cuda.h declares every ABI, so wrappers are checked */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>

#include "clock.h"
#include "hooks.h"
#include "log_line.h"
#include "tgs_proto.h"

#define TGS_API __attribute__((visibility("default")))
#define TGS_HIDDEN __attribute__((visibility("hidden")))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

/* ---- real entry points (intercept.c resolves them) ---- */
#define TGS_REAL_DECL(sym) extern TGS_HIDDEN __typeof__(&sym) real_##sym;
TGS_HOOKS(TGS_REAL_DECL)
TGS_NEEDS(TGS_REAL_DECL)
#undef TGS_REAL_DECL

/* ---- logging (control.c) ---- */
enum { TGS_LOG_ERROR = LOG_LINE_ERROR, TGS_LOG_WARN = LOG_LINE_WARN, TGS_LOG_INFO = LOG_LINE_INFO, TGS_LOG_DEBUG = LOG_LINE_DEBUG };
TGS_HIDDEN extern int tgs_log_level;
TGS_HIDDEN void tgs_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- process state ---- */
enum tgs_mode { TGS_MODE_UNKNOWN = 0, TGS_MODE_PASS = 1, TGS_MODE_ACTIVE = 2 };

#define TGS_INFLIGHT_RING 64 /* kernels in flight per process, at most */
#define TGS_INFLIGHT_QUANTUM_NS 500000ull /* the in-flight bound counts shorter kernels as this part of one */
#define TGS_KERNEL_KEY_BITS 10 /* 1,024 kernels (function and grid size) whose length is remembered, per GPU */
#define TGS_KERNEL_KEYS (1u << TGS_KERNEL_KEY_BITS)
struct tgs_kernel_length {
    uintptr_t fn;    /* what was launched (a function or a graph), 0: free */
    uint64_t blocks; /* its grid's thread blocks */
    uint64_t ns;     /* how long it runs (0: not timed yet) */
    uint32_t readings; /* how many times it was timed */
    uint32_t recheck;  /* 1: its last reading is to be confirmed (timed whenever the timer is free) */
    uint64_t last;     /* its last reading */
};
#define TGS_FN_BITS 9 /* 512 functions (or graphs) whose lengths on their last grid sizes are remembered, per GPU */
#define TGS_FNS (1u << TGS_FN_BITS)
#define TGS_FN_GRIDS 8 /* grid sizes remembered per function */
struct tgs_fn_lengths {
    uintptr_t fn; /* 0: free */
    uint64_t blocks[TGS_FN_GRIDS]; /* 0: empty */
    uint64_t ns[TGS_FN_GRIDS];
};
enum tgs_timer {
    TGS_TIMER_IDLE = 0,    /* free to time a launch */
    TGS_TIMER_RUNNING = 1, /* its events are recorded around a kernel not yet read */
    TGS_TIMER_BUSY = 2,    /* a thread is recording or reading it */
};
enum tgs_drain { /* an opportunistic process's queued work, behind busy production */
    TGS_DRAIN_NONE = 0,    /* never recorded */
    TGS_DRAIN_RUNNING = 1, /* an event is recorded behind it and was not done when last queried */
    TGS_DRAIN_DONE = 2,    /* that event was done: nothing of it runs beside production */
    TGS_DRAIN_UNKNOWN = 3, /* no event could be recorded: taken as running */
    TGS_DRAIN_BUSY = 4,    /* a thread is recording or querying it */
};
#define TGS_STREAMS 32    /* production: streams launched on, per GPU, asked whether their work is done */
struct tgs_stream_seen {
    CUstream s;
    CUcontext ctx;    /* the context it was launched in (a default stream is that context's) */
    pthread_t thread; /* the launching thread (a per-thread default stream is that thread's) */
};
#define TGS_GAPS 8        /* production gaps remembered to expect the next launch */
#define TGS_GAPS_TO_EXPECT 3 /* ... and how many it must have seen to expect one: the shortest of
                          * three leaves out a first spell of setting up (loading data, the
                          * model), and a job on its host 1.5 s every iteration has the first three
                          * of its returns taken for ones from idle, not eight (tgsd profiles each) */
#define TGS_STEPS 3        /* production: the steps that must have done the same work for it to know its
                          * steps (compute.c, "Steps") ... */
#define TGS_STEP_SAME 64   /* ... the same within 1/this of it ... */
#define TGS_STEP_SPELL 16  /* ... each ended by a spell this many times the shortest of its gaps ... */
#define TGS_STEP_INSIDE 2  /* ... and busy at least this many times its spells inside (a job of 10 ms
                          * gaps stalling every 25 iterations is busy about as long as those) */
#define TGS_TIME_GAP_NS 50000000ull /* ... or fewer, when the last timed one is this long ago */
#define TGS_TIMED 5       /* timed kernels remembered */
#define TGS_TIMER_READ_NS 10000000ull /* a timed kernel is read this long after its launch at the latest, */
#define TGS_TIMER_RETRY_NS 1000000ull /* and, not done yet, queried again this long after */

struct tgs_gpu { /* one control-block GPU slot, as this process sees it */
    int slot;
    const volatile struct tgs_gpu_budget *budget;
    struct tgs_gpu_counters *ctr;
    const volatile uint8_t *activity;      /* all production processes' busy bytes */
    volatile uint8_t *activity_rw;         /* production: mapped read-write */
    int busy_marked;                       /* production: our byte is set */
    volatile struct tgs_expectation *expect; /* tgs_activity.expect[] (production writes its slot's) */
    volatile uint64_t *step_spell;         /* tgs_activity.step_spell_ns[] (likewise) */
    volatile uint32_t *expect_slots;       /* tgs_activity.expect_slots */
    uint64_t idle_ns;                      /* production: when it last went idle (0: busy or never) */
    uint64_t busy_since_ns;                /* production: when its byte was set */
    uint64_t gaps[TGS_GAPS];               /* production: its last gaps from idle to the next launch */
    unsigned ngaps;
    uint64_t usual_gap_ns;                 /* production: twice the shortest of them (0: fewer than
                                            * TGS_GAPS_TO_EXPECT yet), the longest gap it is expected to take: the part of a
                                            * gap beyond it is a pause of its own */
    struct tgs_step { uint64_t spell_ns, blocks; } steps[TGS_STEPS]; /* production: its last steps (the blocks
                                            * of each, 0 where not clean) and the spells that ended them */
    unsigned nsteps;
    uint64_t step_ns, step_blocks;         /* production: when its step under way started, its blocks before it */
    uint64_t step_inside_ns;               /* production: the spells inside that step so far */
    uint64_t step_work;                    /* production: the blocks of each of its steps, where it knows them (0: not) */
    uint64_t step_spell_lo, step_spell_hi; /* production: then, the spells between them: the shortest, the longest
                                            * up to twice that */
    struct tgs_gpu_pauses *pauses;         /* production: its pauses (tgs_proto.h), in the control block */
    uint64_t *mark_busy_ns;                /* production: its busy time at its latest mark (tgs_proto.h), likewise */
    uint64_t logged_gap;                   /* production: the shortest gap it last logged */
    uint64_t logged_step_work, logged_step_spell; /* production: the steps it last logged */
    struct tgs_stream_seen streams[TGS_STREAMS]; /* production: the streams it launched on */
    unsigned nstreams;
    unsigned streams_gen;                  /* the context generation they were noted in */
    int streams_full;                      /* more streams than that: they cannot all be asked */
    pthread_mutex_t inflight_lock;         /* opportunistic: kernels in flight */
    CUevent ev[TGS_INFLIGHT_RING];
    CUcontext ev_ctx[TGS_INFLIGHT_RING];   /* the context each was made in, */
    unsigned ev_gen[TGS_INFLIGHT_RING];    /* and the context generation then */
    unsigned ev_covers[TGS_INFLIGHT_RING]; /* the kernels each covers (launched since the one before) */
    uint64_t ev_work[TGS_INFLIGHT_RING];   /* and their cost, ns */
    uint64_t ev_end[TGS_INFLIGHT_RING];    /* its queue's expected end when each was recorded, plus
                                              queue_moved_ns then (0: not known), */
    unsigned ev_queue[TGS_INFLIGHT_RING];  /* in which of its queues (queue_starts then) */
    unsigned ev_head, ev_count;
    unsigned ev_kernels;                   /* kernels the events in the ring cover */
    uint64_t ev_work_ns;                   /* and their cost */
    uint64_t untracked;                    /* kernels launched since the last event, and their cost (ns):
                                              one word, one atomic add a launch (compute.c) */
    uintptr_t timed_fn;                    /* the kernel being timed */
    uint64_t timed_blocks;
    uint64_t timed_overlap_ns;             /* its process's overlap_ns when its timer started */
    CUevent timer[2];                      /* opportunistic: times one kernel in time_every */
    CUcontext timer_ctx;
    unsigned timer_gen;
    int timing;                            /* enum tgs_timer */
    uint64_t timer_ready_ns;               /* the timed kernel's expected end: not queried before */
    uint64_t timer_read_by_ns;             /* its launch + TGS_TIMER_READ_NS: queried from then at the latest */
    unsigned untimed;                      /* launches since the last timed one */
    unsigned time_after;                   /* the next is timed after this many */
    unsigned time_every;                   /* launches per timed one, on average (kernel_length.h) */
    uint64_t time_by_ns;                   /* or one of the first few launches from then on */
    uint32_t timer_rng;                    /* picks time_after, and which of the first few after time_by_ns */
    uint64_t timed_ns[TGS_TIMED];          /* the last kernels timed */
    unsigned ntimed;
    uint64_t kernel_ns;                    /* how long its kernels run: their median (0: not known yet) */
    uint64_t queue_end_ns;                 /* when what it launched is expected to be done */
    unsigned queue_starts;                 /* synchronisations that found it done: each starts a new queue */
    uint64_t queue_moved_ns;               /* how far batches found done moved its expected end back, in all
                                              (under inflight_lock; compute.c: queue_end_seen) */
    CUevent drain;                         /* recorded behind its queued work when production is found busy */
    CUcontext drain_ctx;
    unsigned drain_gen;
    int drain_state;                       /* enum tgs_drain */
    uint64_t drain_launches;               /* the container's launches when it was recorded */
};

struct tgs_state {
    int mode;                 /* enum tgs_mode, read on every call */
    int cls;                  /* enum tgs_class */
    char dir[512];
    const volatile struct tgs_control_header *header;
    const volatile struct tgs_daemon_part *daemon; /* read-only mapping */
    struct tgs_shim_part *shim;                    /* read-write mapping */
    struct tgs_gpu gpu[TGS_MAX_GPUS];
    uint32_t activity_slot; /* from tgsd's hello acknowledgement */
    uint32_t cuda_version;  /* highest cudaVersion asked for through cuGetProcAddress */
    int captures;           /* stream captures in progress in this process */
};
TGS_HIDDEN extern struct tgs_state g_tgs;

/* intercept.c */
TGS_HIDDEN extern int g_tgs_inited;
TGS_HIDDEN void tgs_init_slow(void);
/* The real driver is loaded (once, on the first call of any wrapper). */
static inline void tgs_load(void) {
    if (unlikely(!__atomic_load_n(&g_tgs_inited, __ATOMIC_ACQUIRE)))
        tgs_init_slow();
}
#define REAL(sym) (tgs_load(), real_##sym)
TGS_HIDDEN int tgs_probe_mode(void);   /* PASS or ACTIVE, from the environment alone (cheap) */
TGS_HIDDEN int tgs_ready(void);        /* loads the driver and sets TGS up once; 1 when active */
TGS_HIDDEN void *tgs_real_nvml(const char *name);

/* control.c */
TGS_HIDDEN int tgs_control_open(void); /* maps the control block; 0, or -1 (logged) */
TGS_HIDDEN struct tgs_gpu *tgs_gpu_of_uuid(const CUuuid *uuid);
TGS_HIDDEN struct tgs_gpu *tgs_gpu_of_device(CUdevice dev);
TGS_HIDDEN struct tgs_gpu *tgs_current_gpu_in(CUcontext *ctx); /* and the current context, where it has a GPU */
static inline struct tgs_gpu *tgs_current_gpu(void) { return tgs_current_gpu_in(NULL); }
TGS_HIDDEN void tgs_forget_contexts(void);
TGS_HIDDEN extern unsigned tgs_ctx_generation;
/* Unchanged since a context was seen: that context still lives. */
static inline unsigned tgs_context_generation(void) { return __atomic_load_n(&tgs_ctx_generation, __ATOMIC_RELAXED); }
TGS_HIDDEN void tgs_format_uuid(const unsigned char b[16], char out[TGS_UUID_LEN]);
TGS_HIDDEN int tgs_heartbeat_age_ms(uint64_t now, uint64_t *age_ms); /* 1 when stale */
TGS_HIDDEN void tgs_map_activity(struct tgs_gpu *g);
TGS_HIDDEN void tgs_fall_back(const char *why); /* pass-through from now on, said once */

/* agent.c */
TGS_HIDDEN void tgs_agent_start(void);
TGS_HIDDEN void tgs_agent_after_fork(void);
TGS_HIDDEN void tgs_agent_send(const void *msg, uint32_t size);
TGS_HIDDEN void tgs_msg_init(struct tgs_msg_header *h, uint16_t type, uint32_t size);

/* compute.c */
TGS_HIDDEN uint64_t tgs_production_idle(struct tgs_gpu *g); /* when it went idle; 0: it was not busy */
TGS_HIDDEN void tgs_compute_after_fork(void);

/* memory.c */
TGS_HIDDEN void tgs_memory_resend(void);
TGS_HIDDEN int tgs_memory_order(const struct tgs_msg_order *o, uint64_t *bytes);

#endif
