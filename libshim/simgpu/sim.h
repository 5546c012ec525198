/* simgpu: a simulated NVIDIA GPU behind the real CUDA driver API and NVML.
 *
 * Internal header shared by the driver (libcuda.so.1) and NVML (libnvidia-ml.so.1)
 * builds. The model, every constant and the reasoning behind it are documented in
 * docs/simgpu.md; keep the two in step.
 *
 * Layout of what lives where:
 *   - struct sim_state is one shared file (SIMGPU_STATE), mapped by every process
 *     of every container that uses the simulated card: devices, engine queues,
 *     accounting, the managed-memory frame table and process slots.
 *   - Everything a process owns (contexts, streams, events, modules, graphs,
 *     allocations and the bytes behind them) is process-local, found through the
 *     handles the API returns.
 */
#ifndef SIMGPU_SIM_H
#define SIMGPU_SIM_H

#define __CUDA_API_VERSION_INTERNAL 1 /* cuda.h declares every versioned entry point */
#include <cuda.h>

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "log_line.h"

#define SIM_API __attribute__((visibility("default")))
#define SIM_WEAK __attribute__((weak, visibility("default")))
#define SIM_HIDDEN __attribute__((visibility("hidden")))
/* The per-thread default stream's twin of an entry point (NAME_ptsz, NAME_ptds: what a
 * program built with --default-stream per-thread calls): simgpu has one default stream, so
 * the twin calls the entry point. A function of its own, not an alias: the address
 * cuGetProcAddress hands out says which of the two it was asked for. */
#define SIM_TWIN(TWIN, NAME, PARAMS, ARGS) \
    SIM_API CUresult CUDAAPI TWIN PARAMS { return NAME ARGS; }

/* ---- constants of the shared state (documented in docs/simgpu.md) ---- */
#define SIM_MAGIC 0x31305550474d4953ULL /* "SIMGPU01" */
#define SIM_STATE_VERSION 5u
#define SIM_SLOW_LAUNCH_US 5000 /* SIMGPU_FAULT=slow-launch: what a launch call takes */
#define SIM_LONG_TIMINGS 4 /* SIMGPU_FAULT=long-timings: what event timings are multiplied by */
#define SIM_MAX_DEVICES 8
#define SIM_MAX_PROCS 256
#define SIM_MAX_CTX 64        /* context slots per device (live and recently ended) */
#define SIM_QCAP 1024         /* queued kernels per context before a launch blocks */
#define SIM_PAGE (2ull << 20) /* managed-memory page: the driver's 2 MiB large page */
#define SIM_UTIL_SAMPLES 32   /* utilisation history, one sample per 100 ms */
#define SIM_LOCK_BASE (1ll << 40) /* byte offset of the per-process liveness lock bytes */
#define SIM_DRIVER_VERSION 13000
#define SIM_DEFAULT_STATE "/dev/shm/simgpu.state"

enum sim_proc_state { PROC_FREE = 0, PROC_LIVE = 1 };
enum sim_ctx_state { CTX_FREE = 0, CTX_LIVE = 1, CTX_ENDED = 2 };
enum sim_frame_state { FRAME_FREE = 0, FRAME_USED = 1 };

struct sim_item { /* one kernel (or graph node) in a context's queue */
    uint64_t seq;
    int64_t remaining_ns;
    int64_t bus_ns; /* of its time, moving or reading managed memory over the bus: its last part, as counted */
    uint64_t end_ns;
    uint32_t blocks;
    uint32_t flags;
};

struct sim_sample {
    uint64_t t_ns;
    uint64_t busy_ns;
};

struct sim_ctx { /* one CUDA context's slot on a device */
    uint32_t state;
    uint32_t proc, proc_gen; /* owning process slot */
    uint32_t gen;
    int32_t pid;
    char label[64];
    uint64_t created_ns, ended_ns;
    /* accounting */
    uint64_t busy_ns, kernels, blocks;
    uint64_t device_bytes;   /* non-managed allocations */
    uint64_t resident_pages; /* managed pages resident on this device */
    uint64_t pages_in, pages_out; /* migrations to / evictions from the device */
    uint64_t remote_bytes;   /* managed bytes the GPU read over the bus without migrating */
    uint64_t migrate_ns;     /* engine time its kernels spent moving or reading managed memory over the
                              * bus, counted as they run (never more than busy_ns) */
    uint64_t waited_ns;      /* time its kernels were queued while the engine ran another context's */
    struct sim_sample util[SIM_UTIL_SAMPLES];
    uint32_t util_head, pad;
    /* queue: items head..tail-1 are pending; head counts completed items */
    uint64_t head, tail;
    struct sim_item q[SIM_QCAP];
};

struct sim_frame { /* one 2 MiB page of device memory holding a managed page */
    uint32_t state;
    uint32_t proc, proc_gen;
    uint32_t ctx;       /* context slot charged for it */
    uint32_t gen;       /* bumped on every eviction, so the owner sees it */
    uint32_t pad;
    uint64_t resident;  /* stamp of the operation that brought the page in: the oldest is evicted */
    uint64_t touched;   /* stamp of the operation that touched it last: not evicted for that one */
};

struct sim_device {
    pthread_mutex_t lock;
    char name[96];
    char uuid[48]; /* "GPU-xxxxxxxx-..." */
    uint8_t uuid_bytes[16];
    uint32_t sm_count, cc_major, cc_minor;
    uint64_t total_mem;
    uint64_t device_bytes;   /* sum of non-managed allocations */
    uint64_t resident_pages; /* frames in use */
    uint32_t nframes, frame_hint;
    uint64_t frames_off; /* byte offset of struct sim_frame[nframes] in the state file */
    uint64_t op_clock;
    /* engine */
    uint64_t sim_ns;      /* the timeline is settled up to here */
    int32_t cur, last;    /* context on the engine, context that ran last */
    uint64_t slice_end_ns;
    uint64_t busy_ns, switches;
    uint64_t live_check_ns;
    uint32_t ctx_hi; /* slots in use are below this */
    uint64_t live_mask; /* bit i: context slot i is live (SIM_MAX_CTX <= 64) */
    uint32_t util_head;
    struct sim_sample util[SIM_UTIL_SAMPLES];
    struct sim_ctx ctx[SIM_MAX_CTX];
};

struct sim_proc {
    uint32_t state, gen;
    int32_t pid, pad;
    char label[64];
};

struct sim_settings { /* fixed when the state file is created */
    uint32_t devices;
    uint32_t sm_count;
    uint64_t memory;
    uint64_t timeslice_ns;
    double time_scale;
};

struct sim_state {
    uint64_t magic;
    uint32_t version, header_size;
    uint64_t file_size;
    uint64_t created_ns;
    struct sim_settings set;
    pthread_mutex_t proc_lock;
    struct sim_proc procs[SIM_MAX_PROCS];
    struct sim_device dev[SIM_MAX_DEVICES];
};

/* ---- process-wide globals (one copy per library) ---- */
struct sim_global {
    struct sim_state *st;
    int fd;
    char path[512]; /* the state file mapped */
    int initialised; /* state mapped */
    int forked;      /* a fork() child of an initialised process: everything fails */
    CUresult init_error;
    int my_slot;     /* process slot, -1 until cuInit */
    uint32_t my_gen;
    int log_level;
    int fault_drop_writeback;
    int fault_slow_launch; /* each launch call takes SIM_SLOW_LAUNCH_US before its kernel is queued */
    int fault_copy_pages;  /* managed pages are copied, as where the kernel cannot move them */
    int fault_long_timings; /* event timings read SIM_LONG_TIMINGS times the time between the events */
    /* CUDA_VISIBLE_DEVICES / SIMGPU_VISIBLE_DEVICES: ordinal -> state device */
    int nvisible;
    int visible[SIM_MAX_DEVICES];
    int nml_visible; /* devices NVML shows (SIMGPU_VISIBLE_DEVICES only) */
    int nml_map[SIM_MAX_DEVICES];
};
extern struct sim_global g_sim SIM_HIDDEN;

enum { SIM_LOG_ERROR = LOG_LINE_ERROR, SIM_LOG_WARN = LOG_LINE_WARN, SIM_LOG_INFO = LOG_LINE_INFO, SIM_LOG_DEBUG = LOG_LINE_DEBUG };

/* ---- state.c ---- */
SIM_HIDDEN void sim_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
SIM_HIDDEN uint64_t sim_now(void);
SIM_HIDDEN int sim_parse_size(const char *s, uint64_t *out);
SIM_HIDDEN int sim_open_state(void); /* 0, -1 bad setting, -2 other failure (logged) */
SIM_HIDDEN int sim_open_state_at(const char *path, int create);
SIM_HIDDEN int sim_register_process(void);        /* 0 or -1 */
SIM_HIDDEN void sim_lock_device(struct sim_device *d);
SIM_HIDDEN void sim_unlock_device(struct sim_device *d);
SIM_HIDDEN int sim_proc_alive(uint32_t slot, uint32_t gen);
SIM_HIDDEN void sim_reclaim_dead(struct sim_device *d, uint64_t now); /* device lock held */
SIM_HIDDEN void sim_end_ctx(struct sim_device *d, uint32_t slot, uint64_t now); /* device lock held */
SIM_HIDDEN struct sim_frame *sim_frames(struct sim_device *d);
SIM_HIDDEN const char *sim_label(void);
SIM_HIDDEN void sim_sleep_until(uint64_t t_ns);
SIM_HIDDEN void sim_sample_util(struct sim_device *d, uint64_t now);
SIM_HIDDEN uint64_t sim_busy_since(const struct sim_sample *ring, uint32_t head, uint64_t busy_now,
                                   uint64_t now, uint64_t window_ns, uint64_t *dt_out);

/* ---- engine.c (device lock held unless noted) ---- */
SIM_HIDDEN void eng_advance(struct sim_device *d, uint64_t now);
SIM_HIDDEN uint64_t eng_predict(struct sim_device *d, uint32_t slot, uint64_t head);
/* Both take the device lock themselves. */
SIM_HIDDEN CUresult eng_submit(struct sim_device *d, uint32_t slot, uint32_t gen, int64_t dur_ns,
                               int64_t bus_ns, uint32_t blocks, uint64_t *done_head, uint64_t *gone_seq, uint64_t *gone_end_ns);
SIM_HIDDEN void eng_wait(struct sim_device *d, uint32_t slot, uint32_t gen, uint64_t head);
SIM_HIDDEN int eng_done(struct sim_device *d, uint32_t slot, uint32_t gen, uint64_t head);
SIM_HIDDEN uint64_t eng_end_time(struct sim_device *d, uint32_t slot, uint64_t head);

/* ---- abi.c ---- */
SIM_HIDDEN CUresult sim_unsupported(const char *name);

/* ---- status.c ---- */
SIM_API int simgpu_status_json(const char *state_path, char *buf, size_t len);

#endif
