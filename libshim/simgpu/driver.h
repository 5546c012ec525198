/* simgpu driver: process-local objects behind the CUDA handles. */
#ifndef SIMGPU_DRIVER_H
#define SIMGPU_DRIVER_H

#include "sim.h"

#define OBJ_CTX 0x43545831u    /* "CTX1" */
#define OBJ_STREAM 0x53545231u /* "STR1" */
#define OBJ_EVENT 0x45564e31u
#define OBJ_MODULE 0x4d4f4431u
#define OBJ_FUNC 0x46554e31u
#define OBJ_GRAPH 0x47524131u
#define OBJ_GEXEC 0x47455831u
#define OBJ_GNODE 0x474e4f31u
#define OBJ_POOL 0x504f4f31u
#define OBJ_DEAD 0xdeadbeefu

struct sim_graph;

struct sim_stream {
    uint32_t magic;
    struct sim_context *ctx;
    unsigned flags;
    int priority;
    uint64_t last_head; /* context queue position after this stream's last work */
    struct sim_graph *capture; /* non-NULL while capturing */
    CUstreamCaptureMode capture_mode;
    unsigned long long capture_id;
    int capture_invalid; /* a query or synchronisation of the capturing stream invalidated it */
};

struct sim_context {
    uint32_t magic;
    int dev;     /* index into the shared devices */
    int ordinal; /* CUdevice as the application sees it */
    uint32_t slot, gen;
    unsigned flags;
    int primary;
    int refs; /* primary: retain count */
    struct sim_stream null_stream;
    uint64_t limits[16];
    struct sim_context *next;
    pthread_mutex_t ev_lock;                 /* guards waiting and the events in it */
    struct sim_event *waiting[SIM_QCAP];     /* events waiting on a queue item's end, by its slot */
};

struct sim_event {
    uint32_t magic;
    unsigned flags;
    struct sim_context *ctx;
    int recorded;
    uint64_t head;    /* complete once the context's queue head reaches this */
    uint64_t time_ns; /* completion time once known, else 0 */
    int waiting;      /* in ctx->waiting until time_ns is known */
    struct sim_event *next_waiting;
};

enum kernel_kind { K_OTHER = 0, K_SPIN, K_STEP };

struct sim_module {
    uint32_t magic;
    struct sim_context *ctx;
    char *ptx; /* NUL-terminated copy when the image is PTX text, else NULL */
};

struct sim_function {
    uint32_t magic;
    struct sim_module *mod;
    enum kernel_kind kind;
    char name[128];
    int nparams;
    size_t param_size[8];
    size_t param_offset[8];
    size_t param_bytes;
};

struct sim_launch { /* one kernel launch, also a graph kernel node */
    struct sim_function *fn;
    unsigned grid[3], block[3];
    unsigned shmem;
    unsigned char params[64]; /* packed as the kernel's parameter buffer */
};

struct sim_gnode {
    uint32_t magic;
    struct sim_graph *graph;
    struct sim_launch launch;
    int is_kernel;
};

struct sim_graph {
    uint32_t magic;
    int n, cap;
    struct sim_gnode **nodes;
};

struct sim_graph_exec {
    uint32_t magic;
    int n;
    struct sim_launch *launches;
};

/* driver.c */
SIM_HIDDEN CUresult drv_check(void); /* initialised and not a fork child */
SIM_HIDDEN CUresult drv_current(struct sim_context **out);
SIM_HIDDEN struct sim_device *drv_device(struct sim_context *c);
SIM_HIDDEN CUresult drv_stream(CUstream s, struct sim_stream **out);
SIM_HIDDEN CUresult drv_submit(struct sim_context *c, struct sim_stream *s, int64_t ns, int64_t bus_ns,
                               uint32_t blocks);
SIM_HIDDEN void drv_wait_context(struct sim_context *c);

/* memory.c */
SIM_HIDDEN void mem_init(void);
SIM_HIDDEN CUresult mem_alloc_device(struct sim_context *c, size_t size, CUdeviceptr *out);
SIM_HIDDEN CUresult mem_alloc_managed(struct sim_context *c, size_t size, CUdeviceptr *out);
SIM_HIDDEN CUresult mem_free(CUdeviceptr p);
/* Device-side access by a kernel of context c: adds `delta` to the u32 at every `stride`
 * bytes of [p, p+bytes), migrating managed pages as the model says; returns the extra
 * time in ns that migrations and remote accesses cost the kernel. */
SIM_HIDDEN CUresult mem_kernel_touch(struct sim_context *c, CUdeviceptr p, uint64_t bytes, uint32_t stride,
                                     uint32_t delta, uint64_t stamp, int64_t *extra_ns);
SIM_HIDDEN uint64_t mem_new_stamp(struct sim_device *d);
SIM_HIDDEN CUresult mem_copy(void *dst_host, CUdeviceptr dst_dev, const void *src_host, CUdeviceptr src_dev,
                             size_t n, uint64_t *bytes_bus);
SIM_HIDDEN CUresult mem_set(CUdeviceptr p, unsigned value, size_t elem, size_t count);
SIM_HIDDEN CUresult mem_advise(CUdeviceptr p, size_t n, CUmem_advise advice, CUmemLocation loc);
SIM_HIDDEN CUresult mem_prefetch(struct sim_context *c, CUdeviceptr p, size_t n, CUmemLocation loc,
                                 int64_t *cost_ns);
SIM_HIDDEN CUresult mem_get_info(struct sim_context *c, size_t *free_b, size_t *total_b);
SIM_HIDDEN CUresult mem_pointer_attr(void *data, CUpointer_attribute attr, CUdeviceptr p);
SIM_HIDDEN CUresult mem_range_attr(CUdeviceptr p, size_t n, CUmem_range_attribute attr, void *data, size_t size);
SIM_HIDDEN void mem_release_context(struct sim_context *c);
/* VMM */
SIM_HIDDEN CUresult mem_vmm_create(struct sim_context *c, size_t size, const CUmemAllocationProp *prop,
                                   CUmemGenericAllocationHandle *h);
SIM_HIDDEN CUresult mem_vmm_release(CUmemGenericAllocationHandle h);
SIM_HIDDEN CUresult mem_vmm_reserve(size_t size, size_t align, CUdeviceptr addr, CUdeviceptr *out);
SIM_HIDDEN CUresult mem_vmm_free(CUdeviceptr p, size_t size);
SIM_HIDDEN CUresult mem_vmm_map(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h);
SIM_HIDDEN CUresult mem_vmm_unmap(CUdeviceptr p, size_t size);
SIM_HIDDEN CUresult mem_vmm_set_access(CUdeviceptr p, size_t size);

/* model constants (docs/simgpu.md, "Constants") */
#define SIM_FAULT_GBPS 8.0      /* fault-driven managed page migration and eviction */
#define SIM_PREFETCH_GBPS 16.0  /* explicit prefetch */
#define SIM_REMOTE_GBPS 16.0    /* GPU reading host-resident managed memory it has mapped */
#define SIM_COPY_GBPS 16.0      /* cuMemcpy host<->device */
#define SIM_DTOD_GBPS 1000.0    /* cuMemcpy device<->device */
#define SIM_DEFAULT_KERNEL_NS 5000 /* a kernel simgpu does not know */
#define SIM_MIN_SLEEP_NS 20000  /* copies shorter than this are not waited for */

static inline int64_t sim_bytes_ns(uint64_t bytes, double gbps) { return (int64_t)((double)bytes / gbps); }

#endif
