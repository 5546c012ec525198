/* simgpu: the CUDA driver API entry points (initialisation, devices, contexts, streams,
 * events, modules, launches, graphs and the memory calls). The model lives in engine.c
 * and memory.c; this file turns API calls into it. Every entry point has the real
 * prototype from cuda.h; what is not here answers CUDA_ERROR_NOT_SUPPORTED (cu_stubs.c). */
#define _GNU_SOURCE
#include "driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_drv_lock = PTHREAD_MUTEX_INITIALIZER; /* primary contexts, pools */
static struct sim_context *g_primary[SIM_MAX_DEVICES];
static __thread struct sim_context *t_stack[32];
static __thread int t_depth;

/* ---------- initialisation ---------- */

static void do_init(void) {
    int r = sim_open_state();
    if (r == -1) {
        g_sim.init_error = CUDA_ERROR_INVALID_VALUE;
        return;
    }
    if (r < 0) {
        g_sim.init_error = CUDA_ERROR_OPERATING_SYSTEM;
        return;
    }
    if (sim_register_process() < 0) {
        g_sim.init_error = CUDA_ERROR_OUT_OF_MEMORY;
        return;
    }
    mem_init();
    if (g_sim.nvisible == 0)
        g_sim.init_error = CUDA_ERROR_NO_DEVICE;
    sim_log(SIM_LOG_INFO, "initialised: %d visible device(s), process slot %d", g_sim.nvisible, g_sim.my_slot);
}

SIM_API CUresult CUDAAPI cuInit(unsigned int Flags) {
    if (g_sim.forked)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&g_once, do_init);
    return g_sim.init_error;
}

CUresult drv_check(void) {
    if (g_sim.forked || g_sim.my_slot < 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    return g_sim.init_error == CUDA_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

#define CHECK_INIT()                      \
    do {                                  \
        CUresult _r = drv_check();        \
        if (_r != CUDA_SUCCESS)           \
            return _r;                    \
    } while (0)

SIM_API CUresult CUDAAPI cuDriverGetVersion(int *driverVersion) {
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = SIM_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

/* ---------- devices ---------- */

static CUresult dev_of(CUdevice ord, struct sim_device **d) {
    if (ord < 0 || ord >= g_sim.nvisible)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = &g_sim.st->dev[g_sim.visible[ord]];
    return CUDA_SUCCESS;
}

/* The preamble of a device query: an initialised driver, and `d` the visible device `ord`,
 * else the query returns the error. */
#define DEVICE_OF(ord, d)                 \
    struct sim_device *d;                 \
    do {                                  \
        CHECK_INIT();                     \
        CUresult _r = dev_of((ord), &d);  \
        if (_r != CUDA_SUCCESS)           \
            return _r;                    \
    } while (0)

SIM_API CUresult CUDAAPI cuDeviceGetCount(int *count) {
    CHECK_INIT();
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = g_sim.nvisible;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal) {
    CHECK_INIT();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= g_sim.nvisible)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev) {
    DEVICE_OF(dev, d);
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", d->name);
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
    DEVICE_OF(dev, d);
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(uuid->bytes, d->uuid_bytes, 16);
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid(uuid, dev); }

SIM_API CUresult CUDAAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    DEVICE_OF(dev, d);
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = d->total_mem;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
    size_t b;
    CUresult r = cuDeviceTotalMem_v2(&b, dev);
    if (r == CUDA_SUCCESS) {
        if (!bytes)
            return CUDA_ERROR_INVALID_VALUE;
        *bytes = b > 0xffffffffu ? 0xffffffffu : (unsigned)b;
    }
    return r;
}

static int attribute(struct sim_device *d, CUdevice_attribute a) {
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 49152;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return 1410000;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: return 1;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return (int)d->sm_count;
    case CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT: return 0;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: return 0;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: return CU_COMPUTEMODE_DEFAULT;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return (int)(d - g_sim.st->dev) + 1;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: return 0;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return 1215000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return 40 << 20;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return 2048;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 3;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return (int)d->cc_major;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return (int)d->cc_minor;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: return 167936;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: return 65536;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD: return 0;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: return 1;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: return 0;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return 166912;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: return 32;
    default: return 0;
    }
}

SIM_API CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    DEVICE_OF(dev, d);
    if (!pi || attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    *pi = attribute(d, attrib);
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuDeviceComputeCapability(int *major, int *minor, CUdevice dev) {
    DEVICE_OF(dev, d);
    if (!major || !minor)
        return CUDA_ERROR_INVALID_VALUE;
    *major = (int)d->cc_major;
    *minor = (int)d->cc_minor;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev) {
    DEVICE_OF(dev, d);
    if (!pciBusId || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(pciBusId, (size_t)len, "00000000:%02X:00.0", (unsigned)(d - g_sim.st->dev) + 1);
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev) {
    CHECK_INIT();
    struct sim_device *d;
    if (dev_of(dev, &d) || dev_of(peerDev, &d))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!canAccessPeer)
        return CUDA_ERROR_INVALID_VALUE;
    *canAccessPeer = dev != peerDev;
    return CUDA_SUCCESS;
}

/* ---------- contexts ---------- */

struct sim_device *drv_device(struct sim_context *c) { return &g_sim.st->dev[c->dev]; }

static int ctx_ok(struct sim_context *c) { return c && c->magic == OBJ_CTX; }

static CUresult ctx_slot_alloc(struct sim_context *c) {
    struct sim_device *d = drv_device(c);
    sim_lock_device(d);
    uint64_t now = sim_now();
    eng_advance(d, now);
    int pick = -1;
    for (int pass = 0; pass < 2 && pick < 0; pass++) {
        for (uint32_t i = 0; i < SIM_MAX_CTX && pick < 0; i++)
            if (d->ctx[i].state == CTX_FREE)
                pick = (int)i;
        uint64_t oldest = UINT64_MAX;
        for (uint32_t i = 0; i < SIM_MAX_CTX && pick < 0; i++)
            if (d->ctx[i].state == CTX_ENDED && d->ctx[i].ended_ns < oldest)
                oldest = d->ctx[i].ended_ns;
        for (uint32_t i = 0; i < SIM_MAX_CTX && pick < 0 && oldest != UINT64_MAX; i++)
            if (d->ctx[i].state == CTX_ENDED && d->ctx[i].ended_ns == oldest)
                pick = (int)i;
        if (pick < 0)
            sim_reclaim_dead(d, now);
    }
    if (pick < 0) {
        sim_unlock_device(d);
        sim_log(SIM_LOG_ERROR, "no free context slot on %s (%d in use)", d->uuid, SIM_MAX_CTX);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct sim_ctx *x = &d->ctx[pick];
    uint32_t gen = x->gen + 1;
    memset(x, 0, offsetof(struct sim_ctx, q));
    x->gen = gen;
    x->state = CTX_LIVE;
    x->proc = (uint32_t)g_sim.my_slot;
    x->proc_gen = g_sim.my_gen;
    x->pid = (int32_t)getpid();
    snprintf(x->label, sizeof x->label, "%s", sim_label());
    x->created_ns = now;
    x->util[0] = (struct sim_sample){now, 0};
    if ((uint32_t)pick >= d->ctx_hi)
        d->ctx_hi = (uint32_t)pick + 1;
    d->live_mask |= 1ull << pick;
    c->slot = (uint32_t)pick;
    c->gen = gen;
    sim_unlock_device(d);
    return CUDA_SUCCESS;
}

static CUresult ctx_new(CUdevice ord, unsigned flags, int primary, struct sim_context **out) {
    struct sim_device *d;
    CUresult r = dev_of(ord, &d);
    if (r)
        return r;
    struct sim_context *c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->magic = OBJ_CTX;
    c->dev = g_sim.visible[ord];
    c->ordinal = ord;
    c->flags = flags;
    c->primary = primary;
    c->null_stream.magic = OBJ_STREAM;
    c->null_stream.ctx = c;
    c->limits[CU_LIMIT_STACK_SIZE] = 1024;
    c->limits[CU_LIMIT_PRINTF_FIFO_SIZE] = 1 << 20;
    c->limits[CU_LIMIT_MALLOC_HEAP_SIZE] = 8 << 20;
    pthread_mutex_init(&c->ev_lock, NULL);
    r = ctx_slot_alloc(c);
    if (r) {
        free(c);
        return r;
    }
    *out = c;
    return CUDA_SUCCESS;
}

static void events_settle_all(struct sim_context *c);

static void ctx_end(struct sim_context *c) {
    drv_wait_context(c);
    events_settle_all(c);
    mem_release_context(c);
    struct sim_device *d = drv_device(c);
    sim_lock_device(d);
    if (d->ctx[c->slot].gen == c->gen)
        sim_end_ctx(d, c->slot, sim_now());
    sim_unlock_device(d);
}

CUresult drv_current(struct sim_context **out) {
    CHECK_INIT();
    struct sim_context *c = t_depth ? t_stack[t_depth - 1] : NULL;
    if (!c || !ctx_ok(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = c;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    CHECK_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= g_sim.nvisible)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_drv_lock);
    struct sim_context *c = g_primary[dev];
    CUresult r = CUDA_SUCCESS;
    if (!c) {
        r = ctx_new(dev, 0, 1, &c);
        if (r == CUDA_SUCCESS)
            g_primary[dev] = c;
    } else if (c->refs == 0) {
        r = ctx_slot_alloc(c); /* re-activated after a full release */
    }
    if (r == CUDA_SUCCESS) {
        c->refs++;
        *pctx = (CUcontext)c;
    }
    pthread_mutex_unlock(&g_drv_lock);
    return r;
}

SIM_API CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    CHECK_INIT();
    if (dev < 0 || dev >= g_sim.nvisible)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_drv_lock);
    struct sim_context *c = g_primary[dev];
    CUresult r = CUDA_ERROR_INVALID_CONTEXT;
    if (c && c->refs > 0) {
        if (--c->refs == 0)
            ctx_end(c);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_drv_lock);
    return r;
}

SIM_API CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

SIM_API CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    CHECK_INIT();
    if (dev < 0 || dev >= g_sim.nvisible)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_drv_lock);
    struct sim_context *c = g_primary[dev];
    *flags = c ? c->flags : 0;
    *active = c && c->refs > 0;
    pthread_mutex_unlock(&g_drv_lock);
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
    CHECK_INIT();
    if (dev < 0 || dev >= g_sim.nvisible)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_drv_lock);
    if (g_primary[dev])
        g_primary[dev]->flags = flags;
    pthread_mutex_unlock(&g_drv_lock);
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
    return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}

SIM_API CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    CHECK_INIT();
    if (dev < 0 || dev >= g_sim.nvisible)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_drv_lock);
    struct sim_context *c = g_primary[dev];
    if (c && c->refs > 0) {
        ctx_end(c);
        c->refs = 0;
    }
    pthread_mutex_unlock(&g_drv_lock);
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

static CUresult push(struct sim_context *c) {
    if (t_depth >= (int)(sizeof t_stack / sizeof *t_stack))
        return CUDA_ERROR_INVALID_VALUE;
    t_stack[t_depth++] = c;
    return CUDA_SUCCESS;
}

static CUresult ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    CHECK_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_context *c;
    CUresult r = ctx_new(dev, flags, 0, &c);
    if (r)
        return r;
    push(c);
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice_v1 dev) {
    return ctx_create(pctx, flags, dev);
}
SIM_API CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    return ctx_create(pctx, flags, dev);
}
SIM_API CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                        unsigned int flags, CUdevice dev) {
    (void)paramsArray;
    (void)numParams;
    return ctx_create(pctx, flags, dev);
}
SIM_API CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                                        CUdevice dev) {
    (void)ctxCreateParams;
    return ctx_create(pctx, flags, dev);
}

SIM_API CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) {
    CHECK_INIT();
    struct sim_context *c = (struct sim_context *)ctx;
    if (!ctx_ok(c) || c->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    ctx_end(c);
    c->magic = OBJ_DEAD;
    for (int i = 0; i < t_depth; i++)
        if (t_stack[i] == c) {
            memmove(&t_stack[i], &t_stack[i + 1], (size_t)(t_depth - i - 1) * sizeof *t_stack);
            t_depth--;
            i--;
        }
    return CUDA_SUCCESS;
}
SIM_API CUresult CUDAAPI cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

SIM_API CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
    CHECK_INIT();
    if (!ctx_ok((struct sim_context *)ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    return push((struct sim_context *)ctx);
}
SIM_API CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }

SIM_API CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext *pctx) {
    CHECK_INIT();
    if (t_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct sim_context *c = t_stack[--t_depth];
    if (pctx)
        *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}
SIM_API CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx) { return cuCtxPopCurrent_v2(pctx); }

SIM_API CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
    CHECK_INIT();
    if (!ctx) {
        if (t_depth)
            t_depth--;
        return CUDA_SUCCESS;
    }
    if (!ctx_ok((struct sim_context *)ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth == 0)
        return push((struct sim_context *)ctx);
    t_stack[t_depth - 1] = (struct sim_context *)ctx;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx) {
    CHECK_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = t_depth ? (CUcontext)t_stack[t_depth - 1] : NULL;
    return CUDA_SUCCESS;
}

static CUresult ctx_or_current(CUcontext ctx, struct sim_context **out) {
    if (!ctx)
        return drv_current(out);
    CHECK_INIT();
    if (!ctx_ok((struct sim_context *)ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = (struct sim_context *)ctx;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuCtxGetDevice(CUdevice *device) {
    struct sim_context *c;
    CUresult r = drv_current(&c);
    if (r)
        return r;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    *device = c->ordinal;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx) {
    struct sim_context *c;
    CUresult r = ctx_or_current(ctx, &c);
    if (r)
        return r;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    *device = c->ordinal;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuCtxGetFlags(unsigned int *flags) {
    struct sim_context *c;
    CUresult r = drv_current(&c);
    if (r)
        return r;
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = c->flags;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuCtxGetApiVersion(CUcontext ctx, unsigned int *version) {
    struct sim_context *c;
    CUresult r = ctx_or_current(ctx, &c);
    if (r)
        return r;
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = 3020;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuCtxGetId(CUcontext ctx, unsigned long long *ctxId) {
    struct sim_context *c;
    CUresult r = ctx_or_current(ctx, &c);
    if (r)
        return r;
    if (!ctxId)
        return CUDA_ERROR_INVALID_VALUE;
    *ctxId = ((unsigned long long)c->dev << 40) | ((unsigned long long)c->slot << 32) | c->gen;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuCtxGetLimit(size_t *pvalue, CUlimit limit) {
    struct sim_context *c;
    CUresult r = drv_current(&c);
    if (r)
        return r;
    if (!pvalue || (unsigned)limit >= 16)
        return CUDA_ERROR_UNSUPPORTED_LIMIT;
    *pvalue = c->limits[limit];
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuCtxSetLimit(CUlimit limit, size_t value) {
    struct sim_context *c;
    CUresult r = drv_current(&c);
    if (r)
        return r;
    if ((unsigned)limit >= 16)
        return CUDA_ERROR_UNSUPPORTED_LIMIT;
    c->limits[limit] = value;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority) {
    CHECK_INIT();
    if (leastPriority)
        *leastPriority = 0;
    if (greatestPriority)
        *greatestPriority = -5;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuCtxGetCacheConfig(CUfunc_cache *pconfig) {
    CHECK_INIT();
    if (!pconfig)
        return CUDA_ERROR_INVALID_VALUE;
    *pconfig = CU_FUNC_CACHE_PREFER_NONE;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuCtxSetCacheConfig(CUfunc_cache config) {
    (void)config;
    CHECK_INIT();
    return CUDA_SUCCESS;
}

void drv_wait_context(struct sim_context *c) {
    struct sim_device *d = drv_device(c);
    sim_lock_device(d);
    uint64_t tail = d->ctx[c->slot].gen == c->gen ? d->ctx[c->slot].tail : 0;
    sim_unlock_device(d);
    eng_wait(d, c->slot, c->gen, tail);
}

SIM_API CUresult CUDAAPI cuCtxSynchronize(void) {
    struct sim_context *c;
    CUresult r = drv_current(&c);
    if (r)
        return r;
    drv_wait_context(c);
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
    struct sim_context *c;
    CUresult r = ctx_or_current(ctx, &c);
    if (r)
        return r;
    drv_wait_context(c);
    return CUDA_SUCCESS;
}

/* ---------- streams ---------- */

CUresult drv_stream(CUstream s, struct sim_stream **out) {
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
        struct sim_context *c;
        CUresult r = drv_current(&c);
        if (r)
            return r;
        *out = &c->null_stream;
        return CUDA_SUCCESS;
    }
    CHECK_INIT();
    struct sim_stream *st = (struct sim_stream *)s;
    if (st->magic != OBJ_STREAM || !ctx_ok(st->ctx))
        return CUDA_ERROR_INVALID_HANDLE;
    *out = st;
    return CUDA_SUCCESS;
}

static void events_item_gone(struct sim_context *c, uint64_t seq, uint64_t end_ns);

CUresult drv_submit(struct sim_context *c, struct sim_stream *s, int64_t ns, int64_t bus_ns, uint32_t blocks) {
    uint64_t head, gone_seq, gone_end = 0;
    CUresult r = eng_submit(drv_device(c), c->slot, c->gen, ns, bus_ns, blocks, &head, &gone_seq, &gone_end);
    if (r == CUDA_SUCCESS)
        s->last_head = head;
    if (gone_seq != UINT64_MAX)
        events_item_gone(c, gone_seq, gone_end);
    return r;
}

SIM_API CUresult CUDAAPI cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority) {
    struct sim_context *c;
    CUresult r = drv_current(&c);
    if (r)
        return r;
    if (!phStream)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_stream *s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->magic = OBJ_STREAM;
    s->ctx = c;
    s->flags = flags;
    s->priority = priority;
    *phStream = (CUstream)s;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags) {
    return cuStreamCreateWithPriority(phStream, Flags, 0);
}

SIM_API CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream) {
    struct sim_stream *s;
    CUresult r = drv_stream(hStream, &s);
    if (r)
        return r;
    if (s == &s->ctx->null_stream)
        return CUDA_ERROR_INVALID_HANDLE;
    s->magic = OBJ_DEAD;
    free(s);
    return CUDA_SUCCESS;
}
SIM_API CUresult CUDAAPI cuStreamDestroy(CUstream hStream) { return cuStreamDestroy_v2(hStream); }

/* Asking whether a capturing stream's work is done is not permitted, and invalidates the
 * capture, as CUDA does: its cuStreamEndCapture then fails. */
static CUresult capture_broken(struct sim_stream *s) {
    s->capture_invalid = 1;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

SIM_API CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
    struct sim_stream *s;
    CUresult r = drv_stream(hStream, &s);
    if (r)
        return r;
    if (s->capture)
        return capture_broken(s);
    eng_wait(drv_device(s->ctx), s->ctx->slot, s->ctx->gen, s->last_head);
    return CUDA_SUCCESS;
}
SIM_TWIN(cuStreamSynchronize_ptsz, cuStreamSynchronize, (CUstream hStream), (hStream));

SIM_API CUresult CUDAAPI cuStreamQuery(CUstream hStream) {
    struct sim_stream *s;
    CUresult r = drv_stream(hStream, &s);
    if (r)
        return r;
    if (s->capture)
        return capture_broken(s);
    return eng_done(drv_device(s->ctx), s->ctx->slot, s->ctx->gen, s->last_head) ? CUDA_SUCCESS
                                                                                 : CUDA_ERROR_NOT_READY;
}
SIM_TWIN(cuStreamQuery_ptsz, cuStreamQuery, (CUstream hStream), (hStream));

/* One engine queue per context runs its streams' work in submission order, so a wait
 * on an event recorded earlier is already satisfied. */
SIM_API CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
    (void)Flags;
    struct sim_stream *s;
    CUresult r = drv_stream(hStream, &s);
    if (r)
        return r;
    struct sim_event *e = (struct sim_event *)hEvent;
    if (!e || e->magic != OBJ_EVENT)
        return CUDA_ERROR_INVALID_HANDLE;
    if (e->recorded && e->ctx != s->ctx)
        eng_wait(drv_device(e->ctx), e->ctx->slot, e->ctx->gen, e->head);
    return CUDA_SUCCESS;
}
SIM_TWIN(cuStreamWaitEvent_ptsz, cuStreamWaitEvent,
         (CUstream hStream, CUevent hEvent, unsigned int Flags), (hStream, hEvent, Flags));

/* The stream a query is about, where its answer has somewhere to go (`out`). */
static CUresult stream_asked(CUstream hStream, const void *out, struct sim_stream **s) {
    CUresult r = drv_stream(hStream, s);
    return r ? r : out ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_API CUresult CUDAAPI cuStreamGetFlags(CUstream hStream, unsigned int *flags) {
    struct sim_stream *s;
    CUresult r = stream_asked(hStream, flags, &s);
    if (!r)
        *flags = s->flags;
    return r;
}
SIM_TWIN(cuStreamGetFlags_ptsz, cuStreamGetFlags, (CUstream hStream, unsigned int *flags), (hStream, flags));

SIM_API CUresult CUDAAPI cuStreamGetPriority(CUstream hStream, int *priority) {
    struct sim_stream *s;
    CUresult r = stream_asked(hStream, priority, &s);
    if (!r)
        *priority = s->priority;
    return r;
}
SIM_TWIN(cuStreamGetPriority_ptsz, cuStreamGetPriority, (CUstream hStream, int *priority), (hStream, priority));

SIM_API CUresult CUDAAPI cuStreamGetCtx(CUstream hStream, CUcontext *pctx) {
    struct sim_stream *s;
    CUresult r = stream_asked(hStream, pctx, &s);
    if (!r)
        *pctx = (CUcontext)s->ctx;
    return r;
}
SIM_TWIN(cuStreamGetCtx_ptsz, cuStreamGetCtx, (CUstream hStream, CUcontext *pctx), (hStream, pctx));

/* ---------- events ---------- */

/* An event recorded behind queued work takes its time from the queue item before it, when
 * first asked. The context's queue is a ring: an item is overwritten once SIM_QCAP more
 * kernels were queued after it, and an event asked after that had no time left but "now"
 * (one of 20 us kernels timed 134 ms). So each such event waits on its item in
 * ctx->waiting until its time is known, and the launch that overwrites the item gives it
 * the item's end: a GPU stamps an event when it completes, however late it is read. */
static void event_unwait(struct sim_event *e) { /* e->ctx->ev_lock held */
    struct sim_event **p = &e->ctx->waiting[(e->head - 1) % SIM_QCAP];
    while (*p && *p != e)
        p = &(*p)->next_waiting;
    if (*p)
        *p = e->next_waiting;
    e->next_waiting = NULL;
    e->waiting = 0;
}

/* Takes e out of its context's waiting list, if it is in one (it is recorded again, or
 * destroyed). */
static void event_stop_waiting(struct sim_event *e) {
    if (!e->waiting)
        return;
    pthread_mutex_lock(&e->ctx->ev_lock);
    if (e->waiting)
        event_unwait(e);
    pthread_mutex_unlock(&e->ctx->ev_lock);
}

/* A waiting event, already unlinked from its list, gets its place's end (ev_lock held). */
static void event_gets_time(struct sim_event *e, uint64_t end_ns) {
    if (!e->time_ns)
        e->time_ns = end_ns;
    e->next_waiting = NULL;
    e->waiting = 0;
}

static void events_item_gone(struct sim_context *c, uint64_t seq, uint64_t end_ns) {
    struct sim_event **slot = &c->waiting[seq % SIM_QCAP];
    if (!__atomic_load_n(slot, __ATOMIC_RELAXED)) /* no event ever waits on an item this old */
        return;
    pthread_mutex_lock(&c->ev_lock);
    for (struct sim_event **p = slot; *p;) {
        struct sim_event *e = *p;
        if (e->head - 1 != seq) {
            p = &e->next_waiting;
            continue;
        }
        *p = e->next_waiting;
        event_gets_time(e, end_ns);
    }
    pthread_mutex_unlock(&c->ev_lock);
}

/* The context ends: its waiting events take their times now (its work is done). */
static void events_settle_all(struct sim_context *c) {
    struct sim_device *d = drv_device(c);
    pthread_mutex_lock(&c->ev_lock);
    sim_lock_device(d);
    for (unsigned i = 0; i < SIM_QCAP; i++) {
        while (c->waiting[i]) {
            struct sim_event *e = c->waiting[i];
            uint64_t t = eng_end_time(d, c->slot, e->head);
            c->waiting[i] = e->next_waiting;
            event_gets_time(e, t ? t : d->sim_ns);
        }
    }
    sim_unlock_device(d);
    pthread_mutex_unlock(&c->ev_lock);
}

SIM_API CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags) {
    struct sim_context *c;
    CUresult r = drv_current(&c);
    if (r)
        return r;
    if (!phEvent)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_event *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = OBJ_EVENT;
    e->flags = Flags;
    e->ctx = c;
    *phEvent = (CUevent)e;
    return CUDA_SUCCESS;
}

static struct sim_event *event_of(CUevent h) {
    struct sim_event *e = (struct sim_event *)h;
    return e && e->magic == OBJ_EVENT ? e : NULL;
}

SIM_API CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent) {
    CHECK_INIT();
    struct sim_event *e = event_of(hEvent);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    event_stop_waiting(e);
    e->magic = OBJ_DEAD;
    free(e);
    return CUDA_SUCCESS;
}
SIM_API CUresult CUDAAPI cuEventDestroy(CUevent hEvent) { return cuEventDestroy_v2(hEvent); }

static CUresult event_record(CUevent hEvent, CUstream hStream) {
    struct sim_event *e = event_of(hEvent);
    struct sim_stream *s;
    CUresult r = drv_stream(hStream, &s);
    if (r)
        return r;
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    if (s->capture)
        return CUDA_SUCCESS; /* an event-record node: nothing to time in a simulated graph */
    struct sim_context *c = s->ctx;
    event_stop_waiting(e); /* recorded again: it waits on its new place only */
    struct sim_device *d = drv_device(c);
    pthread_mutex_lock(&c->ev_lock);
    sim_lock_device(d);
    uint64_t now = sim_now();
    eng_advance(d, now);
    struct sim_ctx *x = &d->ctx[c->slot];
    e->ctx = c;
    e->head = x->tail;
    e->time_ns = x->head >= x->tail ? now : 0;
    e->recorded = 1;
    sim_unlock_device(d);
    if (!e->time_ns) {
        struct sim_event **p = &c->waiting[(e->head - 1) % SIM_QCAP];
        e->next_waiting = *p;
        e->waiting = 1;
        __atomic_store_n(p, e, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&c->ev_lock);
    return CUDA_SUCCESS;
}
SIM_API CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) { return event_record(hEvent, hStream); }
SIM_TWIN(cuEventRecord_ptsz, cuEventRecord, (CUevent hEvent, CUstream hStream), (hEvent, hStream));
SIM_API CUresult CUDAAPI cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
    (void)flags;
    return event_record(hEvent, hStream);
}
SIM_TWIN(cuEventRecordWithFlags_ptsz, cuEventRecordWithFlags,
         (CUevent hEvent, CUstream hStream, unsigned int flags), (hEvent, hStream, flags));

static void event_settle_time(struct sim_event *e) {
    if (e->time_ns && !e->waiting) /* known: nothing to do (the query path's common case) */
        return;
    pthread_mutex_lock(&e->ctx->ev_lock);
    if (!e->time_ns) {
        struct sim_device *d = drv_device(e->ctx);
        sim_lock_device(d);
        uint64_t t = eng_end_time(d, e->ctx->slot, e->head);
        e->time_ns = t ? t : d->sim_ns;
        sim_unlock_device(d);
    }
    if (e->waiting)
        event_unwait(e);
    pthread_mutex_unlock(&e->ctx->ev_lock);
}

SIM_API CUresult CUDAAPI cuEventQuery(CUevent hEvent) {
    CHECK_INIT();
    struct sim_event *e = event_of(hEvent);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!e->recorded)
        return CUDA_SUCCESS;
    if (!eng_done(drv_device(e->ctx), e->ctx->slot, e->ctx->gen, e->head))
        return CUDA_ERROR_NOT_READY;
    event_settle_time(e);
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
    CHECK_INIT();
    struct sim_event *e = event_of(hEvent);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!e->recorded)
        return CUDA_SUCCESS;
    eng_wait(drv_device(e->ctx), e->ctx->slot, e->ctx->gen, e->head);
    event_settle_time(e);
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    CHECK_INIT();
    struct sim_event *a = event_of(hStart), *b = event_of(hEnd);
    if (!pMilliseconds)
        return CUDA_ERROR_INVALID_VALUE;
    if (!a || !b || !a->recorded || !b->recorded || (a->flags & CU_EVENT_DISABLE_TIMING) ||
        (b->flags & CU_EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r;
    if ((r = cuEventQuery(hStart)) != CUDA_SUCCESS || (r = cuEventQuery(hEnd)) != CUDA_SUCCESS)
        return r;
    *pMilliseconds = (float)(((double)b->time_ns - (double)a->time_ns) / 1e6);
    if (g_sim.fault_long_timings)
        *pMilliseconds *= SIM_LONG_TIMINGS;
    return CUDA_SUCCESS;
}
SIM_API CUresult CUDAAPI cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    return cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd);
}

/* ---------- modules and functions ---------- */

static int is_ptx(const char *image) {
    /* PTX is text: look for the directives every PTX file starts with */
    for (int i = 0; i < 4096 && image[i]; i++)
        if (!strncmp(image + i, ".version", 8) || !strncmp(image + i, ".target", 7))
            return 1;
    return 0;
}

static CUresult module_load(CUmodule *module, const void *image) {
    struct sim_context *c;
    CUresult r = drv_current(&c);
    if (r)
        return r;
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_module *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->magic = OBJ_MODULE;
    m->ctx = c;
    const unsigned char *b = image;
    int elf = b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F';
    int fatbin = b[0] == 0x50 && b[1] == 0xed && b[2] == 0x55 && b[3] == 0xba;
    if (!elf && !fatbin) {
        if (!is_ptx(image)) {
            free(m);
            return CUDA_ERROR_INVALID_IMAGE;
        }
        m->ptx = strdup(image);
    }
    *module = (CUmodule)m;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image) { return module_load(module, image); }
SIM_API CUresult CUDAAPI cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                            CUjit_option *options, void **optionValues) {
    (void)numOptions;
    (void)options;
    (void)optionValues;
    return module_load(module, image);
}
SIM_API CUresult CUDAAPI cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin) {
    return module_load(module, fatCubin);
}

SIM_API CUresult CUDAAPI cuModuleUnload(CUmodule hmod) {
    CHECK_INIT();
    struct sim_module *m = (struct sim_module *)hmod;
    if (!m || m->magic != OBJ_MODULE)
        return CUDA_ERROR_INVALID_HANDLE;
    m->magic = OBJ_DEAD;
    free(m->ptx);
    free(m);
    return CUDA_SUCCESS;
}

static int ptx_has_entry(const char *ptx, const char *name) {
    size_t n = strlen(name);
    for (const char *p = strstr(ptx, ".entry"); p; p = strstr(p + 6, ".entry")) {
        const char *q = p + 6;
        while (*q == ' ' || *q == '\t')
            q++;
        if (!strncmp(q, name, n) && (q[n] == '(' || q[n] == ' ' || q[n] == '\n' || q[n] == '\r' || q[n] == '\t'))
            return 1;
    }
    return 0;
}

/* The kernels simgpu knows by name (libshim/workloads/kernels.h has their PTX). */
static void describe(struct sim_function *f) {
    if (!strcmp(f->name, "tgs_spin")) {
        f->kind = K_SPIN;
        f->nparams = 1;
        f->param_size[0] = 8;
        f->param_bytes = 8;
    } else if (!strcmp(f->name, "tgs_step")) {
        static const size_t sz[] = {8, 8, 8, 8, 8, 4, 4};
        f->kind = K_STEP;
        f->nparams = 7;
        size_t off = 0;
        for (int i = 0; i < 7; i++) {
            f->param_size[i] = sz[i];
            f->param_offset[i] = off;
            off += sz[i];
        }
        f->param_bytes = off;
    } else {
        f->kind = K_OTHER;
    }
}

SIM_API CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    CHECK_INIT();
    struct sim_module *m = (struct sim_module *)hmod;
    if (!m || m->magic != OBJ_MODULE)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (m->ptx && !ptx_has_entry(m->ptx, name))
        return CUDA_ERROR_NOT_FOUND;
    struct sim_function *f = calloc(1, sizeof *f);
    if (!f)
        return CUDA_ERROR_OUT_OF_MEMORY;
    f->magic = OBJ_FUNC;
    f->mod = m;
    snprintf(f->name, sizeof f->name, "%s", name);
    describe(f);
    *hfunc = (CUfunction)f;
    return CUDA_SUCCESS;
}

/* Libraries and kernels (CUDA 12): a library is a module, a kernel is its function. */
SIM_API CUresult CUDAAPI cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                           void **jitOptionsValues, unsigned int numJitOptions,
                                           CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                           unsigned int numLibraryOptions) {
    (void)jitOptions;
    (void)jitOptionsValues;
    (void)numJitOptions;
    (void)libraryOptions;
    (void)libraryOptionValues;
    (void)numLibraryOptions;
    return module_load((CUmodule *)library, code);
}
SIM_API CUresult CUDAAPI cuLibraryUnload(CUlibrary library) { return cuModuleUnload((CUmodule)library); }
SIM_API CUresult CUDAAPI cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name) {
    return cuModuleGetFunction((CUfunction *)pKernel, (CUmodule)library, name);
}
SIM_API CUresult CUDAAPI cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel) {
    CHECK_INIT();
    struct sim_function *f = (struct sim_function *)kernel;
    if (!pFunc || !f || f->magic != OBJ_FUNC)
        return CUDA_ERROR_INVALID_HANDLE;
    *pFunc = (CUfunction)f;
    return CUDA_SUCCESS;
}

static struct sim_function *func_of(CUfunction h) {
    struct sim_function *f = (struct sim_function *)h;
    return f && f->magic == OBJ_FUNC ? f : NULL;
}

SIM_API CUresult CUDAAPI cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc) {
    CHECK_INIT();
    if (!pi || !func_of(hfunc))
        return CUDA_ERROR_INVALID_VALUE;
    switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = 16; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION: *pi = 70; break;
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *pi = 80; break;
    default: *pi = 0; break;
    }
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value) {
    (void)attrib;
    (void)value;
    CHECK_INIT();
    return func_of(hfunc) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

SIM_API CUresult CUDAAPI cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config) {
    (void)config;
    CHECK_INIT();
    return func_of(hfunc) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

SIM_API CUresult CUDAAPI cuFuncGetName(const char **name, CUfunction hfunc) {
    CHECK_INIT();
    struct sim_function *f = func_of(hfunc);
    if (!f || !name)
        return CUDA_ERROR_INVALID_VALUE;
    *name = f->name;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset,
                                            size_t *paramSize) {
    CHECK_INIT();
    struct sim_function *f = func_of(func);
    if (!f || (int)paramIndex >= f->nparams)
        return CUDA_ERROR_INVALID_VALUE;
    if (paramOffset)
        *paramOffset = f->param_offset[paramIndex];
    if (paramSize)
        *paramSize = f->param_size[paramIndex];
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func, int blockSize,
                                                                     size_t dynamicSMemSize) {
    (void)dynamicSMemSize;
    CHECK_INIT();
    if (!numBlocks || !func_of(func) || blockSize <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    *numBlocks = 2048 / blockSize > 32 ? 32 : 2048 / blockSize;
    return CUDA_SUCCESS;
}

/* ---------- launches ---------- */

static CUresult pack_params(struct sim_function *f, void **params, void **extra, unsigned char *buf) {
    memset(buf, 0, 64);
    if (f->param_bytes == 0)
        return CUDA_SUCCESS;
    if (params) {
        for (int i = 0; i < f->nparams; i++) {
            if (!params[i])
                return CUDA_ERROR_INVALID_VALUE;
            memcpy(buf + f->param_offset[i], params[i], f->param_size[i]);
        }
        return CUDA_SUCCESS;
    }
    if (extra) {
        void *ptr = NULL;
        size_t size = 0;
        for (int i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
            if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
                ptr = extra[i + 1];
            else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1])
                size = *(size_t *)extra[i + 1];
            else
                return CUDA_ERROR_INVALID_VALUE;
        }
        if (!ptr || size < f->param_bytes)
            return CUDA_ERROR_INVALID_VALUE;
        memcpy(buf, ptr, f->param_bytes);
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static uint64_t u64_at(const unsigned char *b, size_t off) {
    uint64_t v;
    memcpy(&v, b + off, 8);
    return v;
}

static uint32_t u32_at(const unsigned char *b, size_t off) {
    uint32_t v;
    memcpy(&v, b + off, 4);
    return v;
}

/* Runs one kernel: its data effects now, its time on the engine. */
static CUresult exec_launch(struct sim_context *c, struct sim_stream *s, const struct sim_launch *L) {
    double scale = g_sim.st->set.time_scale;
    int64_t ns = (int64_t)(SIM_DEFAULT_KERNEL_NS * scale), bus = 0; /* bus: its time moving memory */
    if (L->fn->kind == K_SPIN) {
        ns = (int64_t)((double)u64_at(L->params, 0) * scale);
    } else if (L->fn->kind == K_STEP) {
        const unsigned char *p = L->params;
        ns = (int64_t)((double)u64_at(p, 0) * scale);
        uint64_t stamp = mem_new_stamp(drv_device(c));
        int64_t extra = 0;
        uint32_t stride = u32_at(p, 40), delta = u32_at(p, 44);
        CUresult r = mem_kernel_touch(c, u64_at(p, 8), u64_at(p, 16), stride, delta, stamp, &extra);
        if (r == CUDA_SUCCESS)
            r = mem_kernel_touch(c, u64_at(p, 24), u64_at(p, 32), stride, delta, stamp, &extra);
        if (r != CUDA_SUCCESS)
            return r;
        ns += extra;
        bus = extra;
    }
    uint64_t blocks = (uint64_t)L->grid[0] * L->grid[1] * L->grid[2];
    return drv_submit(c, s, ns, bus, blocks > 0xffffffffu ? 0xffffffffu : (uint32_t)blocks);
}

static struct sim_gnode *graph_add(struct sim_graph *g, const struct sim_launch *L);

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned shmem, CUstream hStream, void **params, void **extra) {
    struct sim_stream *s;
    CUresult r = drv_stream(hStream, &s);
    if (r)
        return r;
    struct sim_function *fn = func_of(f);
    if (!fn)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_launch L = {.fn = fn, .grid = {gx, gy, gz}, .block = {bx, by, bz}, .shmem = shmem};
    if ((r = pack_params(fn, params, extra, L.params)) != CUDA_SUCCESS)
        return r;
    if (s->capture && s->capture_invalid)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (s->capture)
        return graph_add(s->capture, &L) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    if (g_sim.fault_slow_launch)
        usleep(SIM_SLOW_LAUNCH_US); /* injected: the call is slow to queue its kernel */
    return exec_launch(s->ctx, s, &L);
}

SIM_API CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams, void **extra) {
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                  kernelParams, extra);
}

SIM_TWIN(cuLaunchKernel_ptsz, cuLaunchKernel,
         (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX,
          unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
          void **kernelParams, void **extra),
         (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams,
          extra));

SIM_API CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                          void **extra) {
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX, config->blockDimY,
                  config->blockDimZ, config->sharedMemBytes, config->hStream, kernelParams, extra);
}

SIM_TWIN(cuLaunchKernelEx_ptsz, cuLaunchKernelEx,
         (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra),
         (config, f, kernelParams, extra));

SIM_API CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                                   unsigned int gridDimZ, unsigned int blockDimX,
                                                   unsigned int blockDimY, unsigned int blockDimZ,
                                                   unsigned int sharedMemBytes, CUstream hStream,
                                                   void **kernelParams) {
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                  kernelParams, NULL);
}

SIM_TWIN(cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel,
         (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX,
          unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
          void **kernelParams),
         (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams));

/* ---------- stream capture and graphs ---------- */

static struct sim_graph *graph_new(void) {
    struct sim_graph *g = calloc(1, sizeof *g);
    if (g)
        g->magic = OBJ_GRAPH;
    return g;
}

static struct sim_gnode *graph_add(struct sim_graph *g, const struct sim_launch *L) {
    if (g->n == g->cap) {
        int cap = g->cap ? g->cap * 2 : 16;
        struct sim_gnode **n = realloc(g->nodes, (size_t)cap * sizeof *n);
        if (!n)
            return NULL;
        g->nodes = n;
        g->cap = cap;
    }
    struct sim_gnode *node = calloc(1, sizeof *node);
    if (!node)
        return NULL;
    node->magic = OBJ_GNODE;
    node->graph = g;
    node->launch = *L;
    node->is_kernel = 1;
    g->nodes[g->n++] = node;
    return node;
}

static struct sim_graph *graph_of(CUgraph h) {
    struct sim_graph *g = (struct sim_graph *)h;
    return g && g->magic == OBJ_GRAPH ? g : NULL;
}

static unsigned long long g_capture_ids;

static CUresult begin_capture(CUstream hStream, CUstreamCaptureMode mode) {
    if (hStream == NULL || hStream == CU_STREAM_LEGACY)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    struct sim_stream *s;
    CUresult r = drv_stream(hStream, &s);
    if (r)
        return r;
    if (s->capture)
        return CUDA_ERROR_ILLEGAL_STATE;
    s->capture = graph_new();
    if (!s->capture)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->capture_mode = mode;
    s->capture_invalid = 0;
    s->capture_id = __atomic_add_fetch(&g_capture_ids, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}
SIM_API CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream) {
    return begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL);
}
SIM_TWIN(cuStreamBeginCapture_ptsz, cuStreamBeginCapture, (CUstream hStream), (hStream));
SIM_API CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
    return begin_capture(hStream, mode);
}
SIM_TWIN(cuStreamBeginCapture_v2_ptsz, cuStreamBeginCapture_v2,
         (CUstream hStream, CUstreamCaptureMode mode), (hStream, mode));

SIM_API CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
    struct sim_stream *s;
    CUresult r = drv_stream(hStream, &s);
    if (r)
        return r;
    if (!phGraph)
        return CUDA_ERROR_INVALID_VALUE;
    if (!s->capture)
        return CUDA_ERROR_ILLEGAL_STATE;
    *phGraph = (CUgraph)s->capture;
    s->capture = NULL;
    if (s->capture_invalid) {
        cuGraphDestroy(*phGraph);
        *phGraph = NULL;
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    return CUDA_SUCCESS;
}
SIM_TWIN(cuStreamEndCapture_ptsz, cuStreamEndCapture, (CUstream hStream, CUgraph *phGraph), (hStream, phGraph));

static CUstreamCaptureStatus capture_status(const struct sim_stream *s) {
    if (!s->capture)
        return CU_STREAM_CAPTURE_STATUS_NONE;
    return s->capture_invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

SIM_API CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *status) {
    struct sim_stream *s;
    CUresult r = stream_asked(hStream, status, &s);
    if (!r)
        *status = capture_status(s);
    return r;
}
SIM_TWIN(cuStreamIsCapturing_ptsz, cuStreamIsCapturing,
         (CUstream hStream, CUstreamCaptureStatus *status), (hStream, status));

static CUresult capture_info(CUstream hStream, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                             const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *ndeps) {
    struct sim_stream *s;
    CUresult r = stream_asked(hStream, status, &s);
    if (r)
        return r;
    *status = capture_status(s);
    if (id && s->capture)
        *id = s->capture_id;
    if (graph)
        *graph = (CUgraph)s->capture;
    if (deps)
        *deps = NULL;
    if (edges)
        *edges = NULL;
    if (ndeps)
        *ndeps = 0;
    return CUDA_SUCCESS;
}
SIM_API CUresult CUDAAPI cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                                cuuint64_t *id_out) {
    return capture_info(hStream, captureStatus_out, id_out, NULL, NULL, NULL, NULL);
}
SIM_TWIN(cuStreamGetCaptureInfo_ptsz, cuStreamGetCaptureInfo,
         (CUstream hStream, CUstreamCaptureStatus *captureStatus_out, cuuint64_t *id_out),
         (hStream, captureStatus_out, id_out));
SIM_API CUresult CUDAAPI cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                                   cuuint64_t *id_out, CUgraph *graph_out,
                                                   const CUgraphNode **dependencies_out, size_t *numDependencies_out) {
    return capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, NULL, numDependencies_out);
}
SIM_TWIN(cuStreamGetCaptureInfo_v2_ptsz, cuStreamGetCaptureInfo_v2,
         (CUstream hStream, CUstreamCaptureStatus *captureStatus_out, cuuint64_t *id_out, CUgraph *graph_out,
          const CUgraphNode **dependencies_out, size_t *numDependencies_out),
         (hStream, captureStatus_out, id_out, graph_out, dependencies_out, numDependencies_out));
SIM_API CUresult CUDAAPI cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                                   cuuint64_t *id_out, CUgraph *graph_out,
                                                   const CUgraphNode **dependencies_out,
                                                   const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out) {
    return capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                        numDependencies_out);
}
SIM_TWIN(cuStreamGetCaptureInfo_v3_ptsz, cuStreamGetCaptureInfo_v3,
         (CUstream hStream, CUstreamCaptureStatus *captureStatus_out, cuuint64_t *id_out, CUgraph *graph_out,
          const CUgraphNode **dependencies_out, const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out),
         (hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out, numDependencies_out));

SIM_API CUresult CUDAAPI cuGraphCreate(CUgraph *phGraph, unsigned int flags) {
    CHECK_INIT();
    if (!phGraph || flags)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_graph *g = graph_new();
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phGraph = (CUgraph)g;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph) {
    CHECK_INIT();
    struct sim_graph *g = graph_of(hGraph);
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < g->n; i++) {
        g->nodes[i]->magic = OBJ_DEAD;
        free(g->nodes[i]);
    }
    free(g->nodes);
    g->magic = OBJ_DEAD;
    free(g);
    return CUDA_SUCCESS;
}

static CUresult add_kernel_node(CUgraphNode *phGraphNode, CUgraph hGraph, CUfunction func, unsigned gx, unsigned gy,
                                unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                void **kernelParams, void **extra) {
    CHECK_INIT();
    struct sim_graph *g = graph_of(hGraph);
    struct sim_function *fn = func_of(func);
    if (!g || !fn || !phGraphNode)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_launch L = {.fn = fn, .grid = {gx, gy, gz}, .block = {bx, by, bz}, .shmem = shmem};
    CUresult r = pack_params(fn, kernelParams, extra, L.params);
    if (r)
        return r;
    struct sim_gnode *node = graph_add(g, &L);
    if (!node)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phGraphNode = (CUgraphNode)node;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                              const CUgraphNode *dependencies, size_t numDependencies,
                                              const CUDA_KERNEL_NODE_PARAMS_v1 *p) {
    (void)dependencies;
    (void)numDependencies;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return add_kernel_node(phGraphNode, hGraph, p->func, p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX,
                           p->blockDimY, p->blockDimZ, p->sharedMemBytes, p->kernelParams, p->extra);
}

SIM_API CUresult CUDAAPI cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                                 const CUgraphNode *dependencies, size_t numDependencies,
                                                 const CUDA_KERNEL_NODE_PARAMS *p) {
    (void)dependencies;
    (void)numDependencies;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    CUfunction f = p->func ? p->func : (CUfunction)p->kern;
    return add_kernel_node(phGraphNode, hGraph, f, p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX,
                           p->blockDimY, p->blockDimZ, p->sharedMemBytes, p->kernelParams, p->extra);
}

SIM_API CUresult CUDAAPI cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes) {
    CHECK_INIT();
    struct sim_graph *g = graph_of(hGraph);
    if (!g || !numNodes)
        return CUDA_ERROR_INVALID_VALUE;
    if (nodes)
        for (size_t i = 0; i < *numNodes && i < (size_t)g->n; i++)
            nodes[i] = (CUgraphNode)g->nodes[i];
    else
        *numNodes = (size_t)g->n;
    return CUDA_SUCCESS;
}

static CUresult instantiate(CUgraphExec *phGraphExec, CUgraph hGraph) {
    CHECK_INIT();
    struct sim_graph *g = graph_of(hGraph);
    if (!g || !phGraphExec)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_graph_exec *x = calloc(1, sizeof *x);
    if (!x)
        return CUDA_ERROR_OUT_OF_MEMORY;
    x->magic = OBJ_GEXEC;
    x->n = g->n;
    x->launches = calloc((size_t)(g->n ? g->n : 1), sizeof *x->launches);
    if (!x->launches) {
        free(x);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < g->n; i++)
        x->launches[i] = g->nodes[i]->launch;
    *phGraphExec = (CUgraphExec)x;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                            char *logBuffer, size_t bufferSize) {
    if (phErrorNode)
        *phErrorNode = NULL;
    if (logBuffer && bufferSize)
        logBuffer[0] = 0;
    return instantiate(phGraphExec, hGraph);
}
SIM_API CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                               char *logBuffer, size_t bufferSize) {
    return cuGraphInstantiate(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}
SIM_API CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                     unsigned long long flags) {
    (void)flags;
    return instantiate(phGraphExec, hGraph);
}
SIM_API CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                      CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
    CUresult r = instantiate(phGraphExec, hGraph);
    if (instantiateParams) {
        instantiateParams->result_out = r == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
        instantiateParams->hErrNode_out = NULL;
    }
    return r;
}
SIM_TWIN(cuGraphInstantiateWithParams_ptsz, cuGraphInstantiateWithParams,
         (CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams),
         (phGraphExec, hGraph, instantiateParams));

SIM_API CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec) {
    CHECK_INIT();
    struct sim_graph_exec *x = (struct sim_graph_exec *)hGraphExec;
    if (!x || x->magic != OBJ_GEXEC)
        return CUDA_ERROR_INVALID_VALUE;
    x->magic = OBJ_DEAD;
    free(x->launches);
    free(x);
    return CUDA_SUCCESS;
}

static CUresult graph_launch(CUgraphExec hGraphExec, CUstream hStream) {
    struct sim_stream *s;
    CUresult r = drv_stream(hStream, &s);
    if (r)
        return r;
    struct sim_graph_exec *x = (struct sim_graph_exec *)hGraphExec;
    if (!x || x->magic != OBJ_GEXEC)
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < x->n; i++) {
        if (s->capture) {
            if (!graph_add(s->capture, &x->launches[i]))
                return CUDA_ERROR_OUT_OF_MEMORY;
        } else if ((r = exec_launch(s->ctx, s, &x->launches[i])) != CUDA_SUCCESS) {
            return r;
        }
    }
    return CUDA_SUCCESS;
}
SIM_API CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    return graph_launch(hGraphExec, hStream);
}
SIM_TWIN(cuGraphLaunch_ptsz, cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream));

static struct sim_gnode *node_of(CUgraphNode h) {
    struct sim_gnode *n = (struct sim_gnode *)h;
    return n && n->magic == OBJ_GNODE ? n : NULL;
}

SIM_API CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type) {
    CHECK_INIT();
    struct sim_gnode *n = node_of(hNode);
    if (!n || !type)
        return CUDA_ERROR_INVALID_VALUE;
    *type = n->is_kernel ? CU_GRAPH_NODE_TYPE_KERNEL : CU_GRAPH_NODE_TYPE_EMPTY;
    return CUDA_SUCCESS;
}

static void node_params(struct sim_gnode *n, CUfunction *f, unsigned *g, unsigned *b, unsigned *shm) {
    *f = (CUfunction)n->launch.fn;
    memcpy(g, n->launch.grid, sizeof n->launch.grid);
    memcpy(b, n->launch.block, sizeof n->launch.block);
    *shm = n->launch.shmem;
}

SIM_API CUresult CUDAAPI cuGraphKernelNodeGetParams_v2(CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS *p) {
    CHECK_INIT();
    struct sim_gnode *n = node_of(hNode);
    if (!n || !p || !n->is_kernel)
        return CUDA_ERROR_INVALID_VALUE;
    memset(p, 0, sizeof *p);
    unsigned g[3], b[3];
    node_params(n, &p->func, g, b, &p->sharedMemBytes);
    p->gridDimX = g[0], p->gridDimY = g[1], p->gridDimZ = g[2];
    p->blockDimX = b[0], p->blockDimY = b[1], p->blockDimZ = b[2];
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuGraphKernelNodeGetParams(CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS_v1 *p) {
    CHECK_INIT();
    struct sim_gnode *n = node_of(hNode);
    if (!n || !p || !n->is_kernel)
        return CUDA_ERROR_INVALID_VALUE;
    memset(p, 0, sizeof *p);
    unsigned g[3], b[3];
    node_params(n, &p->func, g, b, &p->sharedMemBytes);
    p->gridDimX = g[0], p->gridDimY = g[1], p->gridDimZ = g[2];
    p->blockDimX = b[0], p->blockDimY = b[1], p->blockDimZ = b[2];
    return CUDA_SUCCESS;
}
