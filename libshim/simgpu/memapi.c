/* simgpu: the memory entry points of the driver API (allocation, copies, advice,
 * prefetch, pools, VMM, pointer queries). The model is in memory.c. */
#define _GNU_SOURCE
#include "driver.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

SIM_HIDDEN CUresult mem_alloc_host(struct sim_context *c, size_t size, void **out);
SIM_HIDDEN CUresult mem_free_host(void *p);
SIM_HIDDEN int mem_known(CUdeviceptr p);

#define CURRENT(c)                        \
    struct sim_context *c;                \
    do {                                  \
        CUresult _r = drv_current(&c);    \
        if (_r != CUDA_SUCCESS)           \
            return _r;                    \
    } while (0)

/* ---------- allocation ---------- */

SIM_API CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    CURRENT(c);
    return mem_alloc_device(c, bytesize, dptr);
}

SIM_API CUresult CUDAAPI cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) {
    (void)dptr;
    (void)bytesize;
    return CUDA_ERROR_NOT_SUPPORTED; /* 32-bit device pointers cannot hold a 64-bit address */
}

SIM_API CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                            unsigned int ElementSizeBytes) {
    CURRENT(c);
    if (!pPitch || !WidthInBytes || !Height ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = (WidthInBytes + 511) / 512 * 512;
    CUresult r = mem_alloc_device(c, pitch * Height, dptr);
    if (r == CUDA_SUCCESS)
        *pPitch = pitch;
    return r;
}

SIM_API CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    CURRENT(c);
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    return mem_alloc_managed(c, bytesize, dptr);
}

SIM_API CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
    CUresult r = drv_check();
    if (r)
        return r;
    return mem_free(dptr);
}

SIM_API CUresult CUDAAPI cuMemFree(CUdeviceptr_v1 dptr) { return cuMemFree_v2((CUdeviceptr)dptr); }

SIM_API CUresult CUDAAPI cuMemGetInfo_v2(size_t *free, size_t *total) {
    CURRENT(c);
    return mem_get_info(c, free, total);
}

SIM_API CUresult CUDAAPI cuMemGetInfo(unsigned int *free, unsigned int *total) {
    size_t f, t;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    if (r == CUDA_SUCCESS) {
        if (free)
            *free = f > 0xffffffffu ? 0xffffffffu : (unsigned)f;
        if (total)
            *total = t > 0xffffffffu ? 0xffffffffu : (unsigned)t;
    }
    return r;
}

SIM_API CUresult CUDAAPI cuMemAllocHost_v2(void **pp, size_t bytesize) {
    CURRENT(c);
    return mem_alloc_host(c, bytesize, pp);
}

SIM_API CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
    (void)Flags;
    CURRENT(c);
    return mem_alloc_host(c, bytesize, pp);
}

SIM_API CUresult CUDAAPI cuMemFreeHost(void *p) {
    CUresult r = drv_check();
    if (r)
        return r;
    return mem_free_host(p);
}

SIM_API CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags) {
    CUresult r = drv_check();
    if (r)
        return r;
    if (!pdptr || !p || Flags)
        return CUDA_ERROR_INVALID_VALUE;
    *pdptr = (CUdeviceptr)p; /* unified addressing */
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags) {
    (void)Flags;
    CUresult r = drv_check();
    if (r)
        return r;
    return p && bytesize ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_API CUresult CUDAAPI cuMemHostUnregister(void *p) {
    CUresult r = drv_check();
    if (r)
        return r;
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_API CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
    CUresult r = drv_check();
    if (r)
        return r;
    CUdeviceptr base;
    size_t size;
    if ((r = mem_pointer_attr(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, dptr)) != CUDA_SUCCESS ||
        (r = mem_pointer_attr(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, dptr)) != CUDA_SUCCESS)
        return CUDA_ERROR_NOT_FOUND;
    if (pbase)
        *pbase = base;
    if (psize)
        *psize = size;
    return CUDA_SUCCESS;
}

/* ---------- copies and sets ---------- */

/* Copies keep stream order (they wait for the context's earlier work), move the bytes,
 * and take as long as the modelled bus would. */
static CUresult copy(struct sim_context *c, void *dst_host, CUdeviceptr dst_dev, const void *src_host,
                     CUdeviceptr src_dev, size_t n) {
    if (n == 0)
        return CUDA_SUCCESS;
    drv_wait_context(c);
    uint64_t start = sim_now(), bus = 0;
    CUresult r = mem_copy(dst_host, dst_dev, src_host, src_dev, n, &bus);
    if (r != CUDA_SUCCESS)
        return r;
    int64_t ns = sim_bytes_ns(bus, SIM_COPY_GBPS) + sim_bytes_ns(n - bus, SIM_DTOD_GBPS);
    if (ns > SIM_MIN_SLEEP_NS)
        sim_sleep_until(start + (uint64_t)ns);
    return CUDA_SUCCESS;
}

static CUresult copy_on(CUstream hStream, void *dh, CUdeviceptr dd, const void *sh, CUdeviceptr sd, size_t n) {
    struct sim_stream *s;
    CUresult r = drv_stream(hStream, &s);
    if (r)
        return r;
    if (s->capture)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return copy(s->ctx, dh, dd, sh, sd, n);
}

static CUresult copy_sync(void *dh, CUdeviceptr dd, const void *sh, CUdeviceptr sd, size_t n) {
    return copy_on(NULL, dh, dd, sh, sd, n);
}

SIM_API CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) {
    if (!srcHost)
        return CUDA_ERROR_INVALID_VALUE;
    return copy_sync(NULL, dstDevice, srcHost, 0, ByteCount);
}
SIM_TWIN(cuMemcpyHtoD_v2_ptds, cuMemcpyHtoD_v2,
         (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount), (dstDevice, srcHost, ByteCount));
SIM_API CUresult CUDAAPI cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
    if (!dstHost)
        return CUDA_ERROR_INVALID_VALUE;
    return copy_sync(dstHost, 0, NULL, srcDevice, ByteCount);
}
SIM_TWIN(cuMemcpyDtoH_v2_ptds, cuMemcpyDtoH_v2,
         (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount), (dstHost, srcDevice, ByteCount));
SIM_API CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
    return copy_sync(NULL, dstDevice, NULL, srcDevice, ByteCount);
}
SIM_TWIN(cuMemcpyDtoD_v2_ptds, cuMemcpyDtoD_v2,
         (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount), (dstDevice, srcDevice, ByteCount));

SIM_API CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                                              CUstream hStream) {
    if (!srcHost)
        return CUDA_ERROR_INVALID_VALUE;
    return copy_on(hStream, NULL, dstDevice, srcHost, 0, ByteCount);
}
SIM_TWIN(cuMemcpyHtoDAsync_v2_ptsz, cuMemcpyHtoDAsync_v2,
         (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream),
         (dstDevice, srcHost, ByteCount, hStream));
SIM_API CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                              CUstream hStream) {
    if (!dstHost)
        return CUDA_ERROR_INVALID_VALUE;
    return copy_on(hStream, dstHost, 0, NULL, srcDevice, ByteCount);
}
SIM_TWIN(cuMemcpyDtoHAsync_v2_ptsz, cuMemcpyDtoHAsync_v2,
         (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream),
         (dstHost, srcDevice, ByteCount, hStream));
SIM_API CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                              CUstream hStream) {
    return copy_on(hStream, NULL, dstDevice, NULL, srcDevice, ByteCount);
}
SIM_TWIN(cuMemcpyDtoDAsync_v2_ptsz, cuMemcpyDtoDAsync_v2,
         (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream),
         (dstDevice, srcDevice, ByteCount, hStream));

/* Unified addressing: either side may be host memory. */
static CUresult copy_any(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hStream) {
    int dd = mem_known(dst), sd = mem_known(src);
    if (!dst || !src)
        return CUDA_ERROR_INVALID_VALUE;
    return copy_on(hStream, dd ? NULL : (void *)dst, dd ? dst : 0, sd ? NULL : (const void *)src, sd ? src : 0, n);
}
SIM_API CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
    return copy_any(dst, src, ByteCount, NULL);
}
SIM_TWIN(cuMemcpy_ptds, cuMemcpy, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount), (dst, src, ByteCount));
SIM_API CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
    return copy_any(dst, src, ByteCount, hStream);
}
SIM_TWIN(cuMemcpyAsync_ptsz, cuMemcpyAsync,
         (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream), (dst, src, ByteCount, hStream));

static CUresult set_on(CUstream hStream, CUdeviceptr p, unsigned v, size_t elem, size_t n) {
    struct sim_stream *s;
    CUresult r = drv_stream(hStream, &s);
    if (r)
        return r;
    if (s->capture)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (n == 0)
        return CUDA_SUCCESS;
    drv_wait_context(s->ctx);
    return mem_set(p, v, elem, n);
}
SIM_API CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
    return set_on(NULL, dstDevice, uc, 1, N);
}
SIM_TWIN(cuMemsetD8_v2_ptds, cuMemsetD8_v2, (CUdeviceptr dstDevice, unsigned char uc, size_t N), (dstDevice, uc, N));
SIM_API CUresult CUDAAPI cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N) {
    return set_on(NULL, dstDevice, us, 2, N);
}
SIM_TWIN(cuMemsetD16_v2_ptds, cuMemsetD16_v2, (CUdeviceptr dstDevice, unsigned short us, size_t N), (dstDevice, us, N));
SIM_API CUresult CUDAAPI cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
    return set_on(NULL, dstDevice, ui, 4, N);
}
SIM_TWIN(cuMemsetD32_v2_ptds, cuMemsetD32_v2, (CUdeviceptr dstDevice, unsigned int ui, size_t N), (dstDevice, ui, N));
SIM_API CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
    return set_on(hStream, dstDevice, uc, 1, N);
}
SIM_TWIN(cuMemsetD8Async_ptsz, cuMemsetD8Async,
         (CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream), (dstDevice, uc, N, hStream));
SIM_API CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
    return set_on(hStream, dstDevice, ui, 4, N);
}
SIM_TWIN(cuMemsetD32Async_ptsz, cuMemsetD32Async,
         (CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream), (dstDevice, ui, N, hStream));

/* ---------- advice and prefetch ---------- */

static CUmemLocation location_of(CUdevice device) {
    CUmemLocation loc;
    memset(&loc, 0, sizeof loc);
    if (device == CU_DEVICE_CPU) {
        loc.type = CU_MEM_LOCATION_TYPE_HOST;
    } else {
        loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
        loc.id = device;
    }
    return loc;
}

SIM_API CUresult CUDAAPI cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                                        CUmemLocation location) {
    CUresult r = drv_check();
    if (r)
        return r;
    return mem_advise(devPtr, count, advice, location);
}

SIM_API CUresult CUDAAPI cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUdevice device) {
    return cuMemAdvise_v2(devPtr, count, advice, location_of(device));
}

static CUresult prefetch(CUdeviceptr p, size_t n, CUmemLocation loc, CUstream hStream) {
    struct sim_stream *s;
    CUresult r = drv_stream(hStream, &s);
    if (r)
        return r;
    if (s->capture)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    struct sim_device *d = drv_device(s->ctx);
    eng_wait(d, s->ctx->slot, s->ctx->gen, s->last_head); /* stream order */
    uint64_t start = sim_now();
    int64_t cost = 0;
    r = mem_prefetch(s->ctx, p, n, loc, &cost);
    if (r == CUDA_SUCCESS && cost > SIM_MIN_SLEEP_NS)
        sim_sleep_until(start + (uint64_t)cost);
    return r;
}

SIM_API CUresult CUDAAPI cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream) {
    return prefetch(devPtr, count, location_of(dstDevice), hStream);
}
SIM_TWIN(cuMemPrefetchAsync_ptsz, cuMemPrefetchAsync,
         (CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream), (devPtr, count, dstDevice, hStream));
SIM_API CUresult CUDAAPI cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, CUmemLocation location,
                                               unsigned int flags, CUstream hStream) {
    (void)flags;
    return prefetch(devPtr, count, location, hStream);
}
SIM_TWIN(cuMemPrefetchAsync_v2_ptsz, cuMemPrefetchAsync_v2,
         (CUdeviceptr devPtr, size_t count, CUmemLocation location, unsigned int flags, CUstream hStream),
         (devPtr, count, location, flags, hStream));

SIM_API CUresult CUDAAPI cuMemRangeGetAttribute(void *data, size_t dataSize, CUmem_range_attribute attribute,
                                                CUdeviceptr devPtr, size_t count) {
    CUresult r = drv_check();
    if (r)
        return r;
    return mem_range_attr(devPtr, count, attribute, data, dataSize);
}

/* ---------- pointer attributes ---------- */

SIM_API CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
    CUresult r = drv_check();
    if (r)
        return r;
    return mem_pointer_attr(data, attribute, ptr);
}

SIM_API CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes,
                                                void **data, CUdeviceptr ptr) {
    CUresult r = drv_check();
    if (r)
        return r;
    if (!attributes || !data)
        return CUDA_ERROR_INVALID_VALUE;
    int known = mem_known(ptr);
    for (unsigned i = 0; i < numAttributes; i++) {
        if (!data[i])
            continue;
        if (known && mem_pointer_attr(data[i], attributes[i], ptr) == CUDA_SUCCESS)
            continue;
        /* not a CUDA pointer: the documented "null" values, not an error */
        switch (attributes[i]) {
        case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data[i] = NULL; break;
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data[i] = 0; break;
        case CU_POINTER_ATTRIBUTE_HOST_POINTER: *(void **)data[i] = NULL; break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data[i] = -2; break;
        case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: *(unsigned long long *)data[i] = 0; break;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data[i] = 0; break;
        case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: *(void **)data[i] = NULL; break;
        default: *(unsigned *)data[i] = 0; break;
        }
    }
    return CUDA_SUCCESS;
}

/* ---------- stream-ordered allocation and pools ---------- */

struct sim_pool {
    uint32_t magic;
    int ordinal;
    uint64_t release_threshold;
    int reuse[3];
};

static struct sim_pool g_default_pool[SIM_MAX_DEVICES];
static struct sim_pool *g_current_pool[SIM_MAX_DEVICES];

static struct sim_pool *pool_of(CUmemoryPool h) {
    struct sim_pool *p = (struct sim_pool *)h;
    return p && p->magic == OBJ_POOL ? p : NULL;
}

SIM_API CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev) {
    CUresult r = drv_check();
    if (r)
        return r;
    if (!pool_out)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= g_sim.nvisible)
        return CUDA_ERROR_INVALID_DEVICE;
    g_default_pool[dev].magic = OBJ_POOL;
    g_default_pool[dev].ordinal = dev;
    *pool_out = (CUmemoryPool)&g_default_pool[dev];
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
    if (dev >= 0 && dev < SIM_MAX_DEVICES && g_current_pool[dev] && pool) {
        *pool = (CUmemoryPool)g_current_pool[dev];
        return drv_check();
    }
    return cuDeviceGetDefaultMemPool(pool, dev);
}

SIM_API CUresult CUDAAPI cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
    CUresult r = drv_check();
    if (r)
        return r;
    if (dev < 0 || dev >= g_sim.nvisible)
        return CUDA_ERROR_INVALID_DEVICE;
    struct sim_pool *p = pool_of(pool);
    if (!p || p->ordinal != dev)
        return CUDA_ERROR_INVALID_VALUE;
    g_current_pool[dev] = p;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps) {
    CUresult r = drv_check();
    if (r)
        return r;
    if (!pool || !poolProps || poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        poolProps->location.type != CU_MEM_LOCATION_TYPE_DEVICE || poolProps->location.id < 0 ||
        poolProps->location.id >= g_sim.nvisible)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_pool *p = calloc(1, sizeof *p);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->magic = OBJ_POOL;
    p->ordinal = poolProps->location.id;
    *pool = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool) {
    struct sim_pool *p = pool_of(pool);
    if (!p || (p >= g_default_pool && p < g_default_pool + SIM_MAX_DEVICES))
        return CUDA_ERROR_INVALID_VALUE;
    p->magic = OBJ_DEAD;
    free(p);
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    struct sim_pool *p = pool_of(pool);
    if (!p || !value)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: p->release_threshold = *(cuuint64_t *)value; break;
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: p->reuse[0] = *(int *)value; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: p->reuse[1] = *(int *)value; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: p->reuse[2] = *(int *)value; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: break; /* resetting a watermark */
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    struct sim_pool *p = pool_of(pool);
    if (!p || !value)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = p->release_threshold; break;
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: *(int *)value = p->reuse[0]; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: *(int *)value = p->reuse[1]; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: *(int *)value = p->reuse[2]; break;
    default: *(cuuint64_t *)value = 0; break; /* the pool keeps nothing cached */
    }
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
    (void)minBytesToKeep;
    return pool_of(pool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    struct sim_stream *s;
    CUresult r = drv_stream(hStream, &s);
    if (r)
        return r;
    return mem_alloc_device(s->ctx, bytesize, dptr);
}
SIM_API CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    return alloc_async(dptr, bytesize, hStream);
}
SIM_TWIN(cuMemAllocAsync_ptsz, cuMemAllocAsync,
         (CUdeviceptr *dptr, size_t bytesize, CUstream hStream), (dptr, bytesize, hStream));
SIM_API CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                 CUstream hStream) {
    if (!pool_of(pool))
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(dptr, bytesize, hStream);
}
SIM_TWIN(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync,
         (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream), (dptr, bytesize, pool, hStream));

static CUresult free_async(CUdeviceptr dptr, CUstream hStream) {
    struct sim_stream *s;
    CUresult r = drv_stream(hStream, &s);
    if (r)
        return r;
    return mem_free(dptr); /* kernels' data effects are applied at launch, so freeing now is safe */
}
SIM_API CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { return free_async(dptr, hStream); }
SIM_TWIN(cuMemFreeAsync_ptsz, cuMemFreeAsync, (CUdeviceptr dptr, CUstream hStream), (dptr, hStream));

/* ---------- virtual memory management ---------- */

SIM_API CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                                       CUmemAllocationGranularity_flags option) {
    (void)option;
    CUresult r = drv_check();
    if (r)
        return r;
    if (!granularity || !prop)
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = SIM_PAGE;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                     const CUmemAllocationProp *prop, unsigned long long flags) {
    (void)flags;
    CURRENT(c);
    return mem_vmm_create(c, size, prop, handle);
}

SIM_API CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
    CUresult r = drv_check();
    if (r)
        return r;
    return mem_vmm_release(handle);
}

SIM_API CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                             unsigned long long flags) {
    (void)flags;
    CUresult r = drv_check();
    if (r)
        return r;
    return mem_vmm_reserve(size, alignment, addr, ptr);
}

SIM_API CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    CUresult r = drv_check();
    if (r)
        return r;
    return mem_vmm_free(ptr, size);
}

SIM_API CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                                  unsigned long long flags) {
    CUresult r = drv_check();
    if (r)
        return r;
    if (flags)
        return CUDA_ERROR_INVALID_VALUE;
    return mem_vmm_map(ptr, size, offset, handle);
}

SIM_API CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
    CUresult r = drv_check();
    if (r)
        return r;
    return mem_vmm_unmap(ptr, size);
}

SIM_API CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    CUresult r = drv_check();
    if (r)
        return r;
    if (!desc || !count)
        return CUDA_ERROR_INVALID_VALUE;
    return mem_vmm_set_access(ptr, size);
}

/* ---------- CUDA IPC ---------- */

/* A handle for device memory (the driver's legacy IPC); managed memory, and anything else
 * the driver would not export, fails with CUDA_ERROR_INVALID_VALUE as on the driver.
 * Opening a handle is not simulated (its stub says so): simgpu's device memory is the
 * allocating process's own bytes. */
SIM_API CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr) {
    CUresult r = drv_check();
    if (r)
        return r;
    unsigned capable = 0;
    CUdeviceptr base = 0;
    if (!pHandle || mem_pointer_attr(&capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, dptr) != CUDA_SUCCESS ||
        !capable || mem_pointer_attr(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, dptr) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_VALUE;
    struct {
        char magic[8];
        uint64_t pid, base;
    } h = {"simgpu", (uint64_t)getpid(), (uint64_t)base};
    _Static_assert(sizeof h <= sizeof pHandle->reserved, "the handle fits");
    memset(pHandle, 0, sizeof *pHandle);
    memcpy(pHandle->reserved, &h, sizeof h);
    return CUDA_SUCCESS;
}
