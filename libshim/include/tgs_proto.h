/* tgs_proto.h: the contract between libtgs.so (in containers) and tgsd (on the host).
 *
 * Defined once here and mirrored once in tgs_runtime/proto.py; tests/test_proto.py
 * compiles a program against this header and checks that every size, offset and
 * constant agrees with the mirror. Change both, and ARCHITECTURE.md, together.
 *
 * Files (ARCHITECTURE.md, "Paths"), under the daemon's state_dir (default /run/tgs):
 *   tgsd.sock                      admin socket (root only; JSON bodies)
 *   activity/<uuid>                per-GPU production activity (struct tgs_activity)
 *   c/<id>/tgs.sock                the container's socket (struct bodies below)
 *   c/<id>/control                 the container's control block (struct tgs_control)
 *   c/<id>/registration.json       what tgsd knows of the container (daemon-private)
 *   c/<id>/activity/<uuid>         hard link to activity/<uuid>, for plain processes
 * Inside a container c/<id>/ is mounted at /run/tgs; a plain process finds it via TGS_DIR.
 *
 * Every socket carries frames: a u32 little-endian length, then a body of at most
 * TGS_MAX_FRAME bytes. A malformed or oversized frame closes that connection only.
 * All integers are little-endian; every struct is naturally aligned with no implicit
 * padding (checked by the test).
 * Times (*_ns of a moment) are CLOCK_MONOTONIC in ns; libtgs.so's readings of it keep
 * within a microsecond or so (libshim/src/clock.h).
 */
#ifndef TGS_PROTO_H
#define TGS_PROTO_H

#include <stdint.h>

#define TGS_PROTO_VERSION 1u
#define TGS_CONTROL_MAGIC 0x4c525443u  /* "CTRL" */
#define TGS_ACTIVITY_MAGIC 0x56544341u /* "ACTV" */
#define TGS_MSG_MAGIC 0x314d4754u      /* "TGM1" */

#define TGS_MAX_FRAME 65536u
#define TGS_MAX_GPUS 8u
#define TGS_UUID_LEN 48u
#define TGS_ACTIVITY_SLOTS 256u /* production processes per GPU that can mark activity */
#define TGS_NO_SLOT 0xffffffffu

#define TGS_DEFAULT_STATE_DIR "/run/tgs"
#define TGS_CONTAINER_DIR "/run/tgs" /* where a container sees its own directory */
#define TGS_SOCKET_NAME "tgs.sock"
#define TGS_CONTROL_NAME "control"
#define TGS_REGISTRATION_NAME "registration.json"
#define TGS_ACTIVITY_DIR "activity"
#define TGS_ADMIN_SOCKET_NAME "tgsd.sock"
#define TGS_DEFAULT_SHIM_PATH "/usr/lib/tgs/libtgs.so"

enum tgs_class {
    TGS_CLASS_NONE = 0,
    TGS_CLASS_PRODUCTION = 1,
    TGS_CLASS_OPPORTUNISTIC = 2,
};

/* ---------------------------------------------------------------------------------
 * The control block: one file per container, TGS_CONTROL_SIZE bytes, three pages.
 * Page 0 header and page 1 (daemon part) are written by tgsd and mapped read-only by the
 * shim; page 2 (shim part) is written by the container's shims with atomic operations.
 */
#define TGS_PAGE 4096u
#define TGS_CONTROL_SIZE (4u * TGS_PAGE)
#define TGS_DAEMON_OFFSET TGS_PAGE
#define TGS_SHIM_OFFSET (2u * TGS_PAGE)

#define TGS_RATE_UNLIMITED UINT64_MAX /* rate_blocks_per_s: no rate limit */
#define TGS_NS_PER_BLOCK_SHIFT 16     /* ns_per_block_fp is ns per thread block << 16 */

/* tgs_gpu_budget.flags */
#define TGS_GPU_GATE 1u      /* wait while production on this GPU has unfinished work */
#define TGS_GPU_ANTICIPATE 2u /* and do not start a kernel that would still run when production
                                 is next expected (tgs_activity.due_ns) */

struct tgs_control_header {
    uint32_t magic;
    uint32_t version;
    uint32_t size;          /* TGS_CONTROL_SIZE */
    uint32_t header_size;   /* sizeof(struct tgs_control_header) */
    uint32_t daemon_offset; /* TGS_DAEMON_OFFSET */
    uint32_t daemon_size;   /* sizeof(struct tgs_daemon_part) */
    uint32_t shim_offset;   /* TGS_SHIM_OFFSET */
    uint32_t shim_size;     /* sizeof(struct tgs_shim_part) */
    uint8_t reserved[32];
};

struct tgs_gpu_budget { /* written by tgsd every control period */
    char uuid[TGS_UUID_LEN];       /* "GPU-...", empty for an unused slot */
    uint64_t rate_blocks_per_s;    /* opportunistic token rate; TGS_RATE_UNLIMITED; 0 pauses */
    uint64_t ns_per_block_fp;      /* 1e9 / rate, fixed point (<< TGS_NS_PER_BLOCK_SHIFT) */
    uint64_t burst_blocks;         /* bucket depth */
    uint64_t floor_blocks_per_s;   /* rate to decay to when the heartbeat is stale */
    uint64_t mem_quota_bytes;      /* what the container may hold on this GPU (0: no quota) */
    uint64_t mem_view_total_bytes; /* what memory queries report as total (0: the real total) */
    uint32_t inflight_max;         /* opportunistic kernels in flight per process (0: unbounded); shorter than 0.5 ms: that much work */
    uint32_t flags;                /* TGS_GPU_* */
    uint64_t released_bytes;       /* of the shims' footprint, what processes that died still held:
                                      the container's footprint is footprint_bytes - released_bytes */
    uint64_t reserved[3];
};

struct tgs_daemon_part {
    uint32_t cls;         /* enum tgs_class */
    uint32_t ngpus;
    uint64_t heartbeat_ns; /* CLOCK_MONOTONIC of tgsd's last control period */
    uint64_t generation;   /* bumped on every write of the budgets */
    uint32_t stale_ms;     /* heartbeat older than this: the daemon is gone */
    uint32_t convert;      /* device allocations become managed memory */
    uint64_t reserved[6];
    struct tgs_gpu_budget gpu[TGS_MAX_GPUS];
};

struct tgs_gpu_counters { /* written by the shims, read by tgsd; one cache line pair */
    uint64_t launches;       /* kernels launched (graph launches count their kernel nodes) */
    uint64_t blocks;         /* thread blocks launched: the cost unit */
    uint64_t syncs;          /* times its work was found done (libshim/src/compute.c, work_done) */
    uint64_t gcra_tat_ns;    /* opportunistic token bucket: theoretical arrival time */
    uint64_t throttled_ns;   /* time launching threads waited for tokens or production */
    uint64_t waits;          /* launches that waited */
    uint64_t footprint_bytes;  /* device memory held (managed, device and cuMemCreate) */
    uint64_t vmm_bytes;      /* part of it from cuMemCreate (never evicted) */
    uint64_t evicted_bytes;  /* moved to the host on tgsd's orders */
    uint64_t restored_bytes; /* moved back */
    /* Production: its latest iteration start (the first launch since a completed
     * synchronisation), so that tgsd can time progress from one iteration to another
     * instead of counting a window's blocks. A seqlock: mark_seq is odd while a shim writes,
     * and 0 while nothing was marked. */
    uint64_t mark_seq;
    uint64_t mark_ns;        /* CLOCK_MONOTONIC of that launch */
    uint64_t mark_blocks;    /* `blocks` just before it */
    /* What sharing did to production, for tgsd to tell harm from production's own change.
     * Production: the time its processes had unfinished work (from an iteration start to
     * the synchronisation or query that finds it idle). Opportunistic: the time its launching
     * threads waited for production, and the part of that in which its own queued work
     * still ran (production ran beside it, or behind it). Zero from shims before these
     * counters (their place was reserved). */
    uint64_t busy_ns;
    uint64_t gated_ns;
    uint64_t overlap_ns;
};

struct tgs_shim_part {
    uint32_t processes; /* shims that said hello */
    uint32_t pad;
    /* Opportunistic: what its launching threads waited for other than busy production
     * (gated_ns), by cause, summed over its GPUs (in words that were reserved: 0 from older
     * shims). A wait after which production is found busy counts in gated_ns as well. */
    uint64_t inflight_wait_ns;     /* its own kernels in flight (the in-flight bound) */
    uint64_t anticipation_wait_ns; /* holding back a kernel that would meet production's next launch */
    uint64_t token_wait_ns;        /* tokens: tgsd's rate, or a paused budget */
    uint64_t reserved[4];
    struct tgs_gpu_counters gpu[TGS_MAX_GPUS];
};

/* Production's pauses of its own, per GPU, written by its shims in page 3 (outside the
 * shim part, whose size the header gives: older shims leave them zero, and a newer shim
 * in a container of an older daemon writes where nothing reads). A pause is the part of
 * an idle spell, from the moment production was found idle to its next launch, beyond
 * twice the shortest of its last TGS_GAPS (libshim/src/tgs.h) spells (where the shim knows the
 * job's steps, of a spell between steps beyond twice the shortest of those: compute.c), counted once it has had
 * TGS_GAPS_TO_EXPECT: a data loader's
 * stall, a log written synchronously, not the gap of each of its iterations. tgsd leaves
 * them out of production's progress (docs/daemon.md): timed from one iteration start to
 * another, production's progress is its blocks over the time between, less the pauses
 * that ended between. */
#define TGS_PAUSES_OFFSET (3u * TGS_PAGE)

struct tgs_gpu_pauses {
    uint64_t paused_ns;      /* the pauses so far, counted at the launch that ends each */
    uint64_t mark_paused_ns; /* paused_ns at the latest iteration start (under its mark_seq) */
};

/* After the pauses, in page 3 likewise: production's busy time (its counters' busy_ns) at
 * its latest iteration start, per GPU, under its mark_seq (0 from shims before it). With
 * mark_seq, which grows by 2 per iteration start, tgsd knows the busy time and the number
 * of iterations between two marks: it times production's progress by its busy time and a
 * host spell per iteration fixed when it measured production alone, where host spells
 * that vary from one iteration to the next would read as falls and rises of its progress
 * (docs/daemon.md, "Busy time"). */

struct tgs_control {
    struct tgs_control_header header;
    uint8_t pad0[TGS_DAEMON_OFFSET - sizeof(struct tgs_control_header)];
    struct tgs_daemon_part daemon;
    uint8_t pad1[TGS_SHIM_OFFSET - TGS_DAEMON_OFFSET - sizeof(struct tgs_daemon_part)];
    struct tgs_shim_part shim;
    uint8_t pad2[TGS_PAUSES_OFFSET - TGS_SHIM_OFFSET - sizeof(struct tgs_shim_part)];
    struct tgs_gpu_pauses pauses[TGS_MAX_GPUS];
    uint64_t mark_busy_ns[TGS_MAX_GPUS];
    uint8_t pad3[TGS_CONTROL_SIZE - TGS_PAUSES_OFFSET - TGS_MAX_GPUS * (sizeof(struct tgs_gpu_pauses) + sizeof(uint64_t))];
};

/* ---------------------------------------------------------------------------------
 * Production activity: one file per GPU (activity/<uuid>), one byte per production
 * process (the slot tgsd gave it in its hello acknowledgement): 1 while the process
 * has launched work on the GPU since it was last found idle (libshim/src/compute.c). Production
 * containers map it read-write, opportunistic ones read-only; tgsd clears the byte of
 * a process that died.
 *
 * When a production process goes idle it also says, in expect[its slot], when it expects
 * to launch again: between due_ns and due_until_ns (CLOCK_MONOTONIC), from the gaps between
 * its last idle moments and the launches that followed, or, where it knows its steps and a
 * step's work is done, from the spells between steps (compute.c; due_until_ns 0: no
 * expectation, as while it runs). Only the lowest TGS_EXPECT_SLOTS slots have one (tgsd gives the lowest
 * free slot); expect_slots is one more than the highest slot that has written one, so
 * opportunistic shims read that many.
 */
#define TGS_ACTIVITY_SIZE TGS_PAGE
#define TGS_EXPECT_SLOTS 64u

struct tgs_expectation {
    uint64_t idle_ns;      /* the process went idle then */
    uint64_t due_ns;       /* its next launch is expected from then */
    uint64_t due_until_ns; /* until then at the latest */
};

struct tgs_activity {
    uint32_t magic;
    uint32_t version;
    uint32_t nslots;       /* TGS_ACTIVITY_SLOTS */
    uint32_t expect_slots; /* expect[0 .. expect_slots) may hold expectations */
    uint64_t reserved[7];
    uint8_t busy[TGS_ACTIVITY_SLOTS];
    struct tgs_expectation expect[TGS_EXPECT_SLOTS];
    /* Beside expect[slot], written with it: where the process knows its steps and has gone
     * idle inside one, the shortest spell it expects between steps (0: it expects none
     * longer than this one). A kernel too long for a spell inside, but not for the spell
     * after the step, is held back for that (compute.c). Older shims leave it 0. */
    uint64_t step_spell_ns[TGS_EXPECT_SLOTS];
};
_Static_assert(sizeof(struct tgs_activity) <= TGS_ACTIVITY_SIZE, "the activity file is one page");

/* ---------------------------------------------------------------------------------
 * Messages on a container's socket. Every body starts with struct tgs_msg_header;
 * `size` is the body's length and must match the type's struct.
 */
enum tgs_msg_type {
    TGS_MSG_HELLO = 1,     /* shim -> tgsd, once per connection */
    TGS_MSG_HELLO_ACK = 2, /* tgsd -> shim */
    TGS_MSG_ALLOC = 3,     /* shim -> tgsd: a device allocation (also resent after reconnecting) */
    TGS_MSG_FREE = 4,      /* shim -> tgsd */
    TGS_MSG_ORDER = 5,     /* tgsd -> shim: evict or restore a range */
    TGS_MSG_ORDER_ACK = 6, /* shim -> tgsd: done (or why not) */
    TGS_MSG_BYE = 7,       /* shim -> tgsd: the process is exiting */
};

enum tgs_mem_kind {
    TGS_MEM_MANAGED = 1,   /* a device allocation turned into managed memory (evictable) */
    TGS_MEM_APP_MANAGED = 2, /* the application's own managed memory (evictable) */
    TGS_MEM_DEVICE = 3,    /* plain device memory (conversion off): counted, not evictable */
    TGS_MEM_VMM = 4,       /* cuMemCreate: counted against the quota, never evicted */
};

enum tgs_order_op {
    TGS_ORDER_EVICT = 1,   /* move the range to host memory and keep it there */
    TGS_ORDER_RESTORE = 2, /* bring it back to the GPU */
};

struct tgs_msg_header {
    uint32_t magic; /* TGS_MSG_MAGIC */
    uint16_t type;  /* enum tgs_msg_type */
    uint16_t version; /* TGS_PROTO_VERSION */
    uint32_t size;  /* of the whole body */
    uint32_t seq;
};

struct tgs_msg_hello {
    struct tgs_msg_header h;
    uint32_t pid;          /* in the container's pid namespace (informational only) */
    uint32_t cuda_version; /* highest cudaVersion the process asked cuGetProcAddress for */
    uint32_t driver_version;
    uint32_t activity_slot; /* the slot it held before reconnecting, or TGS_NO_SLOT */
    char comm[16];
};

struct tgs_msg_hello_ack {
    struct tgs_msg_header h;
    uint32_t status;        /* 0, or why the process is refused (it then runs at the floor) */
    uint32_t activity_slot; /* production: the byte to mark; else TGS_NO_SLOT */
    uint64_t process_id;    /* tgsd's name for this process */
};

#define TGS_MEM_EVICTED 1u /* tgs_msg_mem.flags: the range is held on the host by an order */

struct tgs_msg_mem {     /* TGS_MSG_ALLOC and TGS_MSG_FREE */
    struct tgs_msg_header h;
    uint32_t gpu;        /* slot in the control block */
    uint32_t kind;       /* enum tgs_mem_kind */
    uint32_t flags;      /* TGS_MEM_* */
    uint32_t device;     /* the CUDA device ordinal in the process (informational) */
    uint64_t ptr;        /* the address, or the cuMemCreate handle for TGS_MEM_VMM */
    uint64_t size;
};

struct tgs_msg_order {
    struct tgs_msg_header h;
    uint32_t gpu;
    uint32_t op;         /* enum tgs_order_op */
    uint64_t order_id;
    uint64_t ptr;
    uint64_t size;
};

struct tgs_msg_order_ack {
    struct tgs_msg_header h;
    uint32_t op;
    uint32_t status;     /* 0, or the CUresult that stopped the move */
    uint64_t order_id;
    uint64_t bytes;      /* bytes moved */
};

struct tgs_msg_bye {
    struct tgs_msg_header h;
};

#endif
