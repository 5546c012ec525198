/* libtgs.so: memory sharing (ARCHITECTURE.md, "Memory sharing").
 *
 * Device allocations (cuMemAlloc, pitch, stream-ordered and pool allocations) become
 * managed memory with the advice for the container's class: production prefers the GPU,
 * opportunistic memory is mapped ACCESSED_BY the GPU (production conversion can be
 * switched off). cuMemCreate memory is charged to the quota, never converted or evicted.
 * Every allocation is charged to the container's footprint on its GPU (shared by all its
 * processes, in the control block) and told to tgsd; an opportunistic container past
 * its quota gets CUDA_ERROR_OUT_OF_MEMORY. Memory queries report the container's view.
 * tgsd's eviction and restore orders run here, on the agent thread, on a stream of its
 * own. Pointer queries are passed through: they are truthful as they are (converted
 * memory is managed memory and says so). So is cuIpcGetMemHandle, which fails on converted
 * memory: the shim then says why. */
#define _GNU_SOURCE
#include "tgs.h"

#include <stdlib.h>
#include <string.h>

struct range {
    uint64_t ptr, size; /* for TGS_MEM_VMM, ptr is the allocation handle */
    struct tgs_gpu *g;
    CUcontext ctx;
    CUdevice dev;
    uint32_t kind;
    uint32_t flags; /* TGS_MEM_EVICTED */
};

static pthread_mutex_t g_range_lock = PTHREAD_MUTEX_INITIALIZER;
static struct range *g_ranges;
static size_t g_nranges, g_range_cap;

static void notify(uint16_t type, const struct range *r) {
    struct tgs_msg_mem m;
    memset(&m, 0, sizeof m);
    tgs_msg_init(&m.h, type, sizeof m);
    m.gpu = (uint32_t)r->g->slot;
    m.kind = r->kind;
    m.flags = r->flags;
    m.device = (uint32_t)r->dev;
    m.ptr = r->ptr;
    m.size = r->size;
    tgs_agent_send(&m, sizeof m);
}

static void track(struct tgs_gpu *g, uint64_t ptr, uint64_t size, uint32_t kind) {
    struct range r = {.ptr = ptr, .size = size, .g = g, .kind = kind};
    real_cuCtxGetCurrent(&r.ctx);
    real_cuCtxGetDevice(&r.dev);
    if (kind == TGS_MEM_VMM)
        __atomic_fetch_add(&g->ctr->vmm_bytes, size, __ATOMIC_RELAXED);
    pthread_mutex_lock(&g_range_lock);
    if (g_nranges == g_range_cap) {
        size_t cap = g_range_cap ? g_range_cap * 2 : 64;
        struct range *n = realloc(g_ranges, cap * sizeof *n);
        if (n) {
            g_ranges = n;
            g_range_cap = cap;
        }
    }
    if (g_nranges < g_range_cap)
        g_ranges[g_nranges++] = r;
    pthread_mutex_unlock(&g_range_lock);
    notify(TGS_MSG_ALLOC, &r);
}

static int find(uint64_t ptr, int vmm, struct range *out) {
    int found = 0;
    pthread_mutex_lock(&g_range_lock);
    for (size_t i = 0; i < g_nranges; i++) {
        if (g_ranges[i].ptr == ptr && (g_ranges[i].kind == TGS_MEM_VMM) == vmm) {
            *out = g_ranges[i];
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&g_range_lock);
    return found;
}

/* The tracked, non-VMM range that holds [ptr, ptr + size). */
static int find_holding(uint64_t ptr, uint64_t size, struct range *out) {
    int found = 0;
    pthread_mutex_lock(&g_range_lock);
    for (size_t i = 0; i < g_nranges; i++) {
        const struct range *r = &g_ranges[i];
        if (r->kind != TGS_MEM_VMM && ptr >= r->ptr && size <= r->size && ptr - r->ptr <= r->size - size) {
            *out = *r;
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&g_range_lock);
    return found;
}

static void untrack(uint64_t ptr, int vmm) {
    struct range r;
    int found = 0;
    pthread_mutex_lock(&g_range_lock);
    for (size_t i = 0; i < g_nranges; i++) {
        if (g_ranges[i].ptr == ptr && (g_ranges[i].kind == TGS_MEM_VMM) == vmm) {
            r = g_ranges[i];
            g_ranges[i] = g_ranges[--g_nranges];
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&g_range_lock);
    if (!found)
        return;
    __atomic_fetch_sub(&r.g->ctr->footprint_bytes, r.size, __ATOMIC_RELAXED);
    if (r.kind == TGS_MEM_VMM)
        __atomic_fetch_sub(&r.g->ctr->vmm_bytes, r.size, __ATOMIC_RELAXED);
    notify(TGS_MSG_FREE, &r);
}

void tgs_memory_resend(void) {
    pthread_mutex_lock(&g_range_lock);
    size_t n = g_nranges;
    struct range *copy = n ? malloc(n * sizeof *copy) : NULL;
    if (copy)
        memcpy(copy, g_ranges, n * sizeof *copy);
    pthread_mutex_unlock(&g_range_lock);
    for (size_t i = 0; copy && i < n; i++)
        notify(TGS_MSG_ALLOC, &copy[i]);
    free(copy);
}

/* ---------- quota ---------- */

/* The container's footprint: what its shims added, less what tgsd says died with
 * processes that never freed it. */
static uint64_t footprint(struct tgs_gpu *g, uint64_t counted) {
    uint64_t released = g->budget->released_bytes;
    return counted > released ? counted - released : 0;
}

static int quota_reserve(struct tgs_gpu *g, uint64_t size) {
    uint64_t quota = g->budget->mem_quota_bytes;
    uint64_t now = footprint(g, __atomic_add_fetch(&g->ctr->footprint_bytes, size, __ATOMIC_RELAXED));
    if (quota && g_tgs.cls == TGS_CLASS_OPPORTUNISTIC && now > quota) {
        __atomic_fetch_sub(&g->ctr->footprint_bytes, size, __ATOMIC_RELAXED);
        tgs_log(TGS_LOG_DEBUG, "allocation of %llu bytes refused: past the quota of %llu", (unsigned long long)size,
                (unsigned long long)quota);
        return -1;
    }
    return 0;
}

static void quota_release(struct tgs_gpu *g, uint64_t size) {
    __atomic_fetch_sub(&g->ctr->footprint_bytes, size, __ATOMIC_RELAXED);
}

/* ---------- advice and moves (v2 entry points when the driver has them) ---------- */

static CUmemLocation location(CUdevice dev) {
    CUmemLocation l;
    memset(&l, 0, sizeof l);
    l.type = dev == CU_DEVICE_CPU ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
    l.id = dev == CU_DEVICE_CPU ? 0 : dev;
    return l;
}

static CUresult advise(uint64_t ptr, uint64_t size, CUmem_advise a, CUdevice dev) {
    if (real_cuMemAdvise_v2)
        return real_cuMemAdvise_v2(ptr, size, a, location(dev));
    return real_cuMemAdvise ? real_cuMemAdvise(ptr, size, a, dev) : CUDA_ERROR_NOT_SUPPORTED;
}

static CUresult prefetch(uint64_t ptr, uint64_t size, CUdevice dev, CUstream s) {
    if (real_cuMemPrefetchAsync_v2)
        return real_cuMemPrefetchAsync_v2(ptr, size, location(dev), 0, s);
    return real_cuMemPrefetchAsync ? real_cuMemPrefetchAsync(ptr, size, dev, s) : CUDA_ERROR_NOT_SUPPORTED;
}

static int converting(void) { return g_tgs.cls == TGS_CLASS_OPPORTUNISTIC || g_tgs.daemon->convert; }

/* A device allocation as managed memory, with the class's advice. */
static CUresult managed(CUdeviceptr *dptr, size_t size) {
    CUresult r = REAL(cuMemAllocManaged)(dptr, size, CU_MEM_ATTACH_GLOBAL);
    if (r != CUDA_SUCCESS)
        return r;
    CUdevice dev;
    if (real_cuCtxGetDevice(&dev) == CUDA_SUCCESS) {
        if (g_tgs.cls == TGS_CLASS_PRODUCTION)
            advise(*dptr, size, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, dev);
        else
            advise(*dptr, size, CU_MEM_ADVISE_SET_ACCESSED_BY, dev);
    }
    return CUDA_SUCCESS;
}

static struct tgs_gpu *alloc_gpu(void) { return tgs_ready() ? tgs_current_gpu() : NULL; }

/* ---------- allocation wrappers ---------- */

TGS_API CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    struct tgs_gpu *g = alloc_gpu();
    if (!g || !dptr || !bytesize)
        return REAL(cuMemAlloc_v2)(dptr, bytesize);
    if (quota_reserve(g, bytesize) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    int conv = converting();
    CUresult r = conv ? managed(dptr, bytesize) : real_cuMemAlloc_v2(dptr, bytesize);
    if (r != CUDA_SUCCESS) {
        quota_release(g, bytesize);
        return r;
    }
    track(g, *dptr, bytesize, conv ? TGS_MEM_MANAGED : TGS_MEM_DEVICE);
    return r;
}

TGS_API CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                            unsigned int ElementSizeBytes) {
    struct tgs_gpu *g = alloc_gpu();
    if (!g || !dptr || !pPitch || !WidthInBytes || !Height)
        return REAL(cuMemAllocPitch_v2)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16)
        return CUDA_ERROR_INVALID_VALUE;
    int conv = converting();
    size_t pitch = (WidthInBytes + 511) / 512 * 512, size = pitch * Height;
    if (quota_reserve(g, size) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = conv ? managed(dptr, size) : real_cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (r != CUDA_SUCCESS) {
        quota_release(g, size);
        return r;
    }
    if (conv)
        *pPitch = pitch;
    else if (*pPitch * Height != size) { /* the driver chose another pitch: charge what it gave */
        quota_release(g, size);
        size = *pPitch * Height;
        __atomic_fetch_add(&g->ctr->footprint_bytes, size, __ATOMIC_RELAXED);
    }
    track(g, *dptr, size, conv ? TGS_MEM_MANAGED : TGS_MEM_DEVICE);
    return r;
}

TGS_API CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    struct tgs_gpu *g = alloc_gpu();
    if (!g || !dptr || !bytesize)
        return REAL(cuMemAllocManaged)(dptr, bytesize, flags);
    if (quota_reserve(g, bytesize) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = real_cuMemAllocManaged(dptr, bytesize, flags);
    if (r != CUDA_SUCCESS) {
        quota_release(g, bytesize);
        return r;
    }
    track(g, *dptr, bytesize, TGS_MEM_APP_MANAGED);
    return r;
}

static CUresult alloc_async(CUdeviceptr *dptr, size_t size, CUresult (*plain)(CUdeviceptr *, size_t, void *),
                            void *arg) {
    struct tgs_gpu *g = alloc_gpu();
    if (!g || !dptr || !size)
        return plain(dptr, size, arg);
    if (quota_reserve(g, size) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* converted memory is valid at once: the stream order of the allocation is kept trivially */
    int conv = converting();
    CUresult r = conv ? managed(dptr, size) : plain(dptr, size, arg);
    if (r != CUDA_SUCCESS) {
        quota_release(g, size);
        return r;
    }
    track(g, *dptr, size, conv ? TGS_MEM_MANAGED : TGS_MEM_DEVICE);
    return r;
}

struct pool_call {
    CUmemoryPool pool;
    CUstream stream;
    int pt;
};
static CUresult plain_async(CUdeviceptr *p, size_t n, void *a) {
    struct pool_call *c = a;
    return c->pt ? REAL(cuMemAllocAsync_ptsz)(p, n, c->stream) : REAL(cuMemAllocAsync)(p, n, c->stream);
}
static CUresult plain_pool(CUdeviceptr *p, size_t n, void *a) {
    struct pool_call *c = a;
    return c->pt ? REAL(cuMemAllocFromPoolAsync_ptsz)(p, n, c->pool, c->stream)
                 : REAL(cuMemAllocFromPoolAsync)(p, n, c->pool, c->stream);
}

TGS_API CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    struct pool_call c = {NULL, hStream, 0};
    return alloc_async(dptr, bytesize, plain_async, &c);
}
TGS_API CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    struct pool_call c = {NULL, hStream, 1};
    return alloc_async(dptr, bytesize, plain_async, &c);
}
TGS_API CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                 CUstream hStream) {
    struct pool_call c = {pool, hStream, 0};
    return alloc_async(dptr, bytesize, plain_pool, &c);
}
TGS_API CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                      CUstream hStream) {
    struct pool_call c = {pool, hStream, 1};
    return alloc_async(dptr, bytesize, plain_pool, &c);
}

/* Untracked before the real free, so that an address reused at once by another thread's
 * allocation is never mistaken for this one. */
TGS_API CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
    tgs_load();
    if (dptr && g_tgs.daemon)
        untrack(dptr, 0);
    return real_cuMemFree_v2(dptr);
}

static CUresult free_async(CUdeviceptr dptr, CUstream hStream, int pt) {
    struct range r;
    if (dptr && g_tgs.daemon && find(dptr, 0, &r) && r.kind == TGS_MEM_MANAGED) {
        /* converted memory has no stream-ordered free: wait for the stream, then free */
        CUstream s = pt && !hStream ? CU_STREAM_PER_THREAD : hStream;
        CUresult e = REAL(cuStreamSynchronize)(s);
        if (e != CUDA_SUCCESS)
            return e;
        untrack(dptr, 0);
        return real_cuMemFree_v2(dptr);
    }
    if (dptr && g_tgs.daemon)
        untrack(dptr, 0);
    return pt ? REAL(cuMemFreeAsync_ptsz)(dptr, hStream) : REAL(cuMemFreeAsync)(dptr, hStream);
}
TGS_API CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { return free_async(dptr, hStream, 0); }
TGS_API CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) { return free_async(dptr, hStream, 1); }

TGS_API CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                     const CUmemAllocationProp *prop, unsigned long long flags) {
    struct tgs_gpu *g = NULL;
    if (tgs_ready() && prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        g = tgs_gpu_of_device(prop->location.id);
    if (!g || !handle)
        return REAL(cuMemCreate)(handle, size, prop, flags);
    if (quota_reserve(g, size) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = real_cuMemCreate(handle, size, prop, flags);
    if (r != CUDA_SUCCESS) {
        quota_release(g, size);
        return r;
    }
    track(g, (uint64_t)*handle, size, TGS_MEM_VMM);
    return r;
}

TGS_API CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
    tgs_load();
    if (g_tgs.daemon)
        untrack((uint64_t)handle, 1);
    return real_cuMemRelease(handle);
}

/* ---------- CUDA IPC: passed through, explained where TGS is why it fails ---------- */

/* Legacy CUDA IPC cannot share managed memory. Where the memory is a device allocation
 * the shim turned into managed memory, the driver's error stands (the call is not
 * changed), and the shim says once per process why, and what to do. */
TGS_API CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr) {
    CUresult r = REAL(cuIpcGetMemHandle)(pHandle, dptr);
    static int said;
    struct range rg;
    if (r != CUDA_SUCCESS && g_tgs.daemon && find_holding(dptr, 1, &rg) && rg.kind == TGS_MEM_MANAGED &&
        !__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED)) {
        if (g_tgs.cls == TGS_CLASS_PRODUCTION)
            tgs_log(TGS_LOG_WARN,
                    "cuIpcGetMemHandle failed: TGS made this device allocation managed memory, which CUDA IPC "
                    "cannot share. Start this production container again with TGS_CONVERT_MEMORY=false (or the "
                    "annotation tgs.convert-memory=false); for every production container, set convert_production "
                    "= false in the [memory] section of tgsd's config (/etc/tgs/config.toml)");
        else
            tgs_log(TGS_LOG_WARN,
                    "cuIpcGetMemHandle failed: an opportunistic container's GPU memory is managed memory (so that "
                    "tgsd can move it to the host), which CUDA IPC cannot share. A job that shares GPU memory "
                    "between processes cannot run as opportunistic: run it as production with "
                    "TGS_CONVERT_MEMORY=false");
    }
    return r;
}

/* ---------- what memory queries report ---------- */

/* The container's view of a GPU: total is what tgsd says the container may count on
 * (production: the GPU's budget; opportunistic: its quota), used is its footprint. */
TGS_HIDDEN int tgs_memory_view(struct tgs_gpu *g, uint64_t *total, uint64_t *used) {
    uint64_t view = g->budget->mem_view_total_bytes;
    if (!view)
        return 0;
    uint64_t foot = footprint(g, __atomic_load_n(&g->ctr->footprint_bytes, __ATOMIC_RELAXED));
    *total = view;
    *used = foot < view ? foot : view; /* never negative, never wrapped */
    return 1;
}

TGS_API CUresult CUDAAPI cuMemGetInfo_v2(size_t *free, size_t *total) {
    CUresult r = REAL(cuMemGetInfo_v2)(free, total);
    struct tgs_gpu *g;
    uint64_t t, u;
    if (r == CUDA_SUCCESS && tgs_ready() && (g = tgs_current_gpu()) && tgs_memory_view(g, &t, &u)) {
        if (free)
            *free = (size_t)(t - u);
        if (total)
            *total = (size_t)t;
    }
    return r;
}

TGS_API CUresult CUDAAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    CUresult r = REAL(cuDeviceTotalMem_v2)(bytes, dev);
    struct tgs_gpu *g;
    uint64_t t, u;
    if (r == CUDA_SUCCESS && bytes && tgs_ready() && (g = tgs_gpu_of_device(dev)) && tgs_memory_view(g, &t, &u))
        *bytes = (size_t)t;
    return r;
}

TGS_API CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
    return REAL(cuPointerGetAttribute)(data, attribute, ptr);
}

TGS_API CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes,
                                                void **data, CUdeviceptr ptr) {
    return REAL(cuPointerGetAttributes)(numAttributes, attributes, data, ptr);
}

/* ---------- tgsd's orders (agent thread) ---------- */

struct own_stream {
    CUcontext ctx;
    CUstream stream;
};
static struct own_stream g_streams[16];

static CUstream stream_for(CUcontext ctx) {
    for (int i = 0; i < 16; i++)
        if (g_streams[i].ctx == ctx && g_streams[i].stream)
            return g_streams[i].stream;
    for (int i = 0; i < 16; i++) {
        if (!g_streams[i].ctx) {
            CUstream s;
            if (real_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
                return NULL;
            g_streams[i].ctx = ctx;
            g_streams[i].stream = s;
            return s;
        }
    }
    return NULL;
}

/* An order moves a part of one range: tgsd keeps each range's evicted part at its tail,
 * so an eviction sets the range's EVICTED flag and a restore that reaches the range's end
 * clears it (the flag tells a restarted tgsd; it takes a flagged range as all evicted). */
int tgs_memory_order(const struct tgs_msg_order *o, uint64_t *bytes) {
    struct range r;
    *bytes = 0;
    if (!o->size || !find_holding(o->ptr, o->size, &r))
        return CUDA_ERROR_INVALID_VALUE; /* freed meanwhile, or not a range tgsd was told of */
    if (r.kind != TGS_MEM_MANAGED && r.kind != TGS_MEM_APP_MANAGED)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult e = real_cuCtxSetCurrent(r.ctx);
    CUstream s = e == CUDA_SUCCESS ? stream_for(r.ctx) : NULL;
    if (!s)
        return e != CUDA_SUCCESS ? (int)e : CUDA_ERROR_OUT_OF_MEMORY;
    if (o->op == TGS_ORDER_EVICT) {
        e = advise(o->ptr, o->size, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, CU_DEVICE_CPU);
        if (e == CUDA_SUCCESS)
            e = prefetch(o->ptr, o->size, CU_DEVICE_CPU, s);
    } else if (o->op == TGS_ORDER_RESTORE) {
        e = advise(o->ptr, o->size, CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION, r.dev);
        if (e == CUDA_SUCCESS && g_tgs.cls == TGS_CLASS_PRODUCTION)
            e = advise(o->ptr, o->size, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, r.dev);
        if (e == CUDA_SUCCESS)
            e = prefetch(o->ptr, o->size, r.dev, s);
    } else {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (e == CUDA_SUCCESS)
        e = real_cuStreamSynchronize(s);
    if (e != CUDA_SUCCESS)
        return (int)e;
    pthread_mutex_lock(&g_range_lock);
    for (size_t i = 0; i < g_nranges; i++)
        if (g_ranges[i].ptr == r.ptr && g_ranges[i].kind == r.kind) {
            if (o->op == TGS_ORDER_EVICT)
                g_ranges[i].flags |= TGS_MEM_EVICTED;
            else if (o->ptr + o->size == r.ptr + r.size)
                g_ranges[i].flags &= ~TGS_MEM_EVICTED;
        }
    pthread_mutex_unlock(&g_range_lock);
    __atomic_fetch_add(o->op == TGS_ORDER_EVICT ? &r.g->ctr->evicted_bytes : &r.g->ctr->restored_bytes, o->size,
                       __ATOMIC_RELAXED);
    *bytes = o->size;
    return CUDA_SUCCESS;
}
