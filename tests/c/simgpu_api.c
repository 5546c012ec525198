/* Driver-API checks run by tests/test_simgpu_api.py: `simgpu_api NAME` runs one check,
 * prints "ok NAME" and exits 0, or prints what went wrong and exits 1. Linked directly
 * against libcuda.so.1 (simgpu here), the way programs that skip the runtime are. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../libshim/workloads/kernels.h"

static const char *g_check;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL %s: ", g_check);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    exit(1);
}

static const char *ename(CUresult r) {
    const char *s = NULL;
    cuGetErrorName(r, &s);
    return s ? s : "?";
}

#define EXPECT(call, want)                                                                        \
    do {                                                                                          \
        CUresult _r = (call);                                                                     \
        if (_r != (want))                                                                         \
            die("%s:%d %s returned %s, expected %s", __FILE__, __LINE__, #call, ename(_r), #want); \
    } while (0)
#define OK(call) EXPECT(call, CUDA_SUCCESS)
#define ASSERT(cond, ...)      \
    do {                       \
        if (!(cond))           \
            die(__VA_ARGS__);  \
    } while (0)

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static CUcontext setup(void) {
    OK(cuInit(0));
    CUdevice d;
    OK(cuDeviceGet(&d, 0));
    CUcontext c;
    OK(cuDevicePrimaryCtxRetain(&c, d));
    OK(cuCtxSetCurrent(c));
    return c;
}

static CUfunction kernel(const char *name) {
    CUmodule m;
    OK(cuModuleLoadData(&m, tgs_workload_ptx));
    CUfunction f;
    OK(cuModuleGetFunction(&f, m, name));
    return f;
}

static void spin(CUfunction f, CUstream s, unsigned long long ns) {
    void *args[] = {&ns};
    OK(cuLaunchKernel(f, 4, 1, 1, 32, 1, 1, 0, s, args, NULL));
}

static void check_init(void) {
    EXPECT(cuDeviceGetCount(&(int){0}), CUDA_ERROR_NOT_INITIALIZED);
    OK(cuInit(0));
    int n, v;
    OK(cuDeviceGetCount(&n));
    ASSERT(n >= 1, "no devices");
    OK(cuDriverGetVersion(&v));
    ASSERT(v == 13000, "driver version %d", v);
    CUdevice d;
    OK(cuDeviceGet(&d, 0));
    EXPECT(cuDeviceGet(&d, n), CUDA_ERROR_INVALID_DEVICE);
    char name[128];
    OK(cuDeviceGetName(name, sizeof name, d));
    ASSERT(strstr(name, "simgpu"), "name %s", name);
    CUuuid u;
    OK(cuDeviceGetUuid(&u, d));
    size_t total;
    OK(cuDeviceTotalMem(&total, d));
    ASSERT(total > 0, "total");
    int sms, major, minor;
    OK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d));
    OK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d));
    OK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d));
    EXPECT(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MAX, d), CUDA_ERROR_INVALID_VALUE);
    printf("device %s uuid %02x%02x sms %d cc %d.%d total %zu\n", name, (unsigned char)u.bytes[0],
           (unsigned char)u.bytes[1], sms, major, minor, total);
}

static void check_contexts(void) {
    OK(cuInit(0));
    CUcontext cur = (CUcontext)1;
    OK(cuCtxGetCurrent(&cur));
    ASSERT(cur == NULL, "a fresh thread has no context");
    EXPECT(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
    CUcontext p1, p2;
    OK(cuDevicePrimaryCtxRetain(&p1, 0));
    OK(cuDevicePrimaryCtxRetain(&p2, 0));
    ASSERT(p1 == p2, "the primary context is one per device");
    unsigned flags;
    int active;
    OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    ASSERT(active, "retained primary context is active");
    OK(cuCtxSetCurrent(p1));
    CUcontext c;
    OK(cuCtxCreate(&c, NULL, 0, 0)); /* pushed */
    OK(cuCtxGetCurrent(&cur));
    ASSERT(cur == c && c != p1, "created context is current");
    CUcontext popped;
    OK(cuCtxPopCurrent(&popped));
    ASSERT(popped == c, "pop");
    OK(cuCtxGetCurrent(&cur));
    ASSERT(cur == p1, "previous context back");
    OK(cuCtxPushCurrent(c));
    CUdevice dev;
    OK(cuCtxGetDevice(&dev));
    ASSERT(dev == 0, "device");
    OK(cuCtxDestroy(c));
    OK(cuCtxGetCurrent(&cur));
    ASSERT(cur == p1, "destroyed context left the stack");
    OK(cuDevicePrimaryCtxRelease(0));
    OK(cuDevicePrimaryCtxRelease(0));
    OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    ASSERT(!active, "released primary context is inactive");
}

static void check_memory(void) {
    setup();
    size_t free0, total;
    OK(cuMemGetInfo(&free0, &total));
    CUdeviceptr p;
    size_t n = 8 << 20;
    OK(cuMemAlloc(&p, n));
    size_t free1;
    OK(cuMemGetInfo(&free1, &total));
    ASSERT(free0 - free1 >= n, "cuMemGetInfo sees the allocation (%zu -> %zu)", free0, free1);
    unsigned char *h = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++)
        h[i] = (unsigned char)(i * 131 + 7);
    OK(cuMemcpyHtoD(p, h, n));
    CUdeviceptr q;
    OK(cuMemAlloc(&q, n));
    OK(cuMemcpyDtoD(q, p, n));
    OK(cuMemcpyDtoH(back, q, n));
    ASSERT(!memcmp(h, back, n), "bytes round-trip exactly");
    OK(cuMemsetD32(q, 0xdeadbeef, n / 4));
    OK(cuMemcpyDtoH(back, q, 16));
    ASSERT(((uint32_t *)back)[3] == 0xdeadbeef, "memset D32");
    OK(cuMemsetD8(q + 1, 0x5a, 2));
    OK(cuMemcpyDtoH(back, q, 4));
    ASSERT(back[1] == 0x5a && back[2] == 0x5a && back[3] == 0xde, "memset D8");
    EXPECT(cuMemcpyDtoH(back, p + n - 8, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)h, h, 16), CUDA_ERROR_INVALID_VALUE);
    /* generic cuMemcpy infers host and device sides */
    OK(cuMemcpy((CUdeviceptr)(uintptr_t)back, p, 64));
    ASSERT(!memcmp(back, h, 64), "cuMemcpy device to host");
    size_t pitch;
    CUdeviceptr pp;
    OK(cuMemAllocPitch(&pp, &pitch, 1000, 10, 4));
    ASSERT(pitch >= 1000 && pitch % 256 == 0, "pitch %zu", pitch);
    /* pointer attributes */
    unsigned type = 0, managed = 7;
    CUcontext ctx = NULL;
    OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p + 100));
    OK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p));
    OK(cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, p));
    ASSERT(type == CU_MEMORYTYPE_DEVICE && managed == 0 && ctx != NULL, "attributes of device memory");
    CUdeviceptr base;
    size_t size;
    OK(cuMemGetAddressRange(&base, &size, p + 100));
    ASSERT(base == p && size == n, "address range");
    EXPECT(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)h),
           CUDA_ERROR_INVALID_VALUE);
    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_CONTEXT};
    void *data[] = {&type, &ctx};
    OK(cuPointerGetAttributes(2, attrs, data, (CUdeviceptr)(uintptr_t)h));
    ASSERT(type == 0 && ctx == NULL, "unknown pointers get null attributes, not an error");
    void *pinned;
    OK(cuMemAllocHost(&pinned, 4096));
    OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)pinned));
    ASSERT(type == CU_MEMORYTYPE_HOST, "pinned host memory");
    OK(cuMemFreeHost(pinned));
    OK(cuMemFree(p));
    OK(cuMemFree(q));
    OK(cuMemFree(pp));
    EXPECT(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
    size_t free2;
    OK(cuMemGetInfo(&free2, &total));
    ASSERT(free2 == free0, "freed memory comes back (%zu vs %zu)", free2, free0);
}

static void check_oom(void) {
    setup();
    size_t free_b, total;
    OK(cuMemGetInfo(&free_b, &total));
    CUdeviceptr p, q;
    EXPECT(cuMemAlloc(&p, total + (2 << 20)), CUDA_ERROR_OUT_OF_MEMORY);
    OK(cuMemAlloc(&p, free_b / 2));
    EXPECT(cuMemAlloc(&q, free_b / 2 + (64 << 20)), CUDA_ERROR_OUT_OF_MEMORY);
    OK(cuMemFree(p));
    OK(cuMemAlloc(&q, free_b / 2 + (64 << 20)));
    OK(cuMemFree(q));
}

static void check_managed(void) {
    setup();
    size_t n = 16 << 20;
    CUdeviceptr m;
    OK(cuMemAllocManaged(&m, n, CU_MEM_ATTACH_GLOBAL));
    unsigned managed = 0;
    OK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, m));
    ASSERT(managed == 1, "managed memory says so");
    uint32_t *h = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n / 4; i++)
        h[i] = (uint32_t)i * 2654435761u;
    OK(cuMemcpyHtoD(m, h, n));
    /* the CUDA 8 entry points (a device ordinal, CU_DEVICE_CPU for the host) */
    CUresult (*prefetch_v1)(CUdeviceptr, size_t, CUdevice, CUstream);
    CUresult (*advise_v1)(CUdeviceptr, size_t, CUmem_advise, CUdevice);
    OK(cuGetProcAddress("cuMemPrefetchAsync", (void **)&prefetch_v1, 8000, 0, NULL));
    OK(cuGetProcAddress("cuMemAdvise", (void **)&advise_v1, 8000, 0, NULL));
    OK(prefetch_v1(m, n, 0, NULL)); /* to the device */
    OK(cuStreamSynchronize(NULL));
    CUmemLocation host = {.type = CU_MEM_LOCATION_TYPE_HOST, .id = 0};
    CUmemLocation dev0 = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0};
    OK(cuMemAdvise(m, n, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host));
    OK(cuMemPrefetchAsync(m, n, host, 0, NULL)); /* back to the host */
    OK(advise_v1(m, n, CU_MEM_ADVISE_SET_ACCESSED_BY, 0));
    OK(advise_v1(m, n, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, 0));
    OK(cuMemPrefetchAsync(m, n, dev0, 0, NULL));
    OK(prefetch_v1(m, n / 2, CU_DEVICE_CPU, NULL));
    OK(cuMemcpyDtoH(back, m, n));
    ASSERT(!memcmp(h, back, n), "managed data survives moving to the device and back");
    int pref = 99;
    OK(cuMemRangeGetAttribute(&pref, 4, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, m, n));
    ASSERT(pref == 0, "preferred location %d", pref);
    EXPECT(advise_v1(m, n, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, 42), CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuMemAdvise(m + n + (4 << 20), 16, CU_MEM_ADVISE_SET_READ_MOSTLY, dev0), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemFree(m));
}

static void check_events(void) {
    setup();
    CUfunction f = kernel("tgs_spin");
    CUevent a, b;
    OK(cuEventCreate(&a, 0));
    OK(cuEventCreate(&b, 0));
    OK(cuEventRecord(a, NULL));
    spin(f, NULL, 20000000);
    OK(cuEventRecord(b, NULL));
    EXPECT(cuEventQuery(b), CUDA_ERROR_NOT_READY);
    float ms;
    EXPECT(cuEventElapsedTime(&ms, a, b), CUDA_ERROR_NOT_READY);
    OK(cuEventSynchronize(b));
    OK(cuEventQuery(b));
    OK(cuEventElapsedTime(&ms, a, b));
    ASSERT(ms > 19.0f && ms < 60.0f, "a 20 ms kernel took %.2f ms", ms);
    CUevent nt;
    OK(cuEventCreate(&nt, CU_EVENT_DISABLE_TIMING));
    OK(cuEventRecord(nt, NULL));
    EXPECT(cuEventElapsedTime(&ms, a, nt), CUDA_ERROR_INVALID_HANDLE);
    /* Read late: events around a 2 ms kernel queued behind another, read only after 3,000
     * more kernels went through the context's queue (a ring of 1,024): still 2 ms. One is
     * destroyed and one recorded again while they wait for their times. */
    CUevent c, d, gone;
    OK(cuEventCreate(&c, 0));
    OK(cuEventCreate(&d, 0));
    OK(cuEventCreate(&gone, 0));
    spin(f, NULL, 1000000);
    OK(cuEventRecord(c, NULL));
    OK(cuEventRecord(gone, NULL));
    spin(f, NULL, 2000000);
    OK(cuEventRecord(d, NULL));
    OK(cuEventDestroy(gone)); /* destroyed while it waits for its time */
    OK(cuEventRecord(b, NULL));
    OK(cuEventRecord(a, NULL));
    for (int i = 0; i < 3000; i++) /* queued faster than they run: no gap between them */
        spin(f, NULL, i == 0 ? 3000000 : 10000);
    OK(cuEventRecord(b, NULL));
    OK(cuCtxSynchronize());
    OK(cuEventElapsedTime(&ms, c, d));
    ASSERT(ms > 1.99f && ms < 2.01f, "a 2 ms kernel read after 3,000 more kernels took %.3f ms", ms);
    OK(cuEventElapsedTime(&ms, a, b));
    ASSERT(ms > 32.9f && ms < 33.1f, "a 3 ms kernel and 2,999 of 10 us took %.3f ms", ms);
    OK(cuEventDestroy(a));
    OK(cuEventDestroy(b));
    OK(cuEventDestroy(c));
    OK(cuEventDestroy(d));
}

static void check_streams(void) {
    setup();
    CUfunction f = kernel("tgs_spin");
    CUstream s;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    double t0 = now_ms();
    spin(f, s, 30000000);
    double launch_ms = now_ms() - t0;
    ASSERT(launch_ms < 10, "a launch returns at once (%.1f ms)", launch_ms);
    EXPECT(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
    OK(cuStreamSynchronize(s));
    double took = now_ms() - t0;
    ASSERT(took >= 29 && took < 120, "stream sync waited %.1f ms for a 30 ms kernel", took);
    OK(cuStreamQuery(s));
    /* per-thread default stream entry points */
    unsigned long long ns = 1000000;
    void *args[] = {&ns};
    CUresult (*launch_ptsz)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            CUstream, void **, void **);
    CUresult (*sync_ptsz)(CUstream);
    OK(cuGetProcAddress("cuLaunchKernel", (void **)&launch_ptsz, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL));
    OK(cuGetProcAddress("cuStreamSynchronize", (void **)&sync_ptsz, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL));
    OK(launch_ptsz(f, 1, 1, 1, 1, 1, 1, 0, CU_STREAM_PER_THREAD, args, NULL));
    OK(sync_ptsz(CU_STREAM_PER_THREAD));
    /* cuLaunchKernelEx and the packed-parameter form */
    CUlaunchConfig cfg = {.gridDimX = 2, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 64, .blockDimY = 1, .blockDimZ = 1, .hStream = s};
    OK(cuLaunchKernelEx(&cfg, f, args, NULL));
    size_t sz = sizeof ns;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &ns, CU_LAUNCH_PARAM_BUFFER_SIZE, &sz, CU_LAUNCH_PARAM_END};
    OK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, extra));
    OK(cuLaunchCooperativeKernel(f, 1, 1, 1, 1, 1, 1, 0, s, args));
    EXPECT(cuLaunchKernel(f, 0, 1, 1, 1, 1, 1, 0, s, args, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuLaunchKernel(f, 1, 1, 1, 2048, 1, 1, 0, s, args, NULL), CUDA_ERROR_INVALID_VALUE);
    OK(cuCtxSynchronize());
    OK(cuStreamDestroy(s));
}

static void check_graphs(void) {
    setup();
    CUfunction f = kernel("tgs_spin");
    CUstream s;
    OK(cuStreamCreate(&s, 0));
    EXPECT(cuStreamBeginCapture(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUstreamCaptureStatus st;
    OK(cuStreamIsCapturing(s, &st));
    ASSERT(st == CU_STREAM_CAPTURE_STATUS_ACTIVE, "capturing");
    double t0 = now_ms();
    for (int i = 0; i < 3; i++)
        spin(f, s, 10000000);
    OK(cuStreamQuery(NULL));
    CUgraph g;
    OK(cuStreamEndCapture(s, &g));
    ASSERT(now_ms() - t0 < 5, "captured work does not run");
    size_t nn = 0;
    OK(cuGraphGetNodes(g, NULL, &nn));
    ASSERT(nn == 3, "captured %zu nodes", nn);
    CUgraphExec x;
    OK(cuGraphInstantiate(&x, g, 0));
    t0 = now_ms();
    OK(cuGraphLaunch(x, s));
    OK(cuStreamSynchronize(s));
    double took = now_ms() - t0;
    ASSERT(took >= 29 && took < 150, "a graph of three 10 ms kernels took %.1f ms", took);
    /* a graph built by hand */
    CUgraph h;
    OK(cuGraphCreate(&h, 0));
    unsigned long long ns = 5000000;
    void *args[] = {&ns};
    CUDA_KERNEL_NODE_PARAMS p = {.func = f, .gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 1,
                                 .blockDimY = 1, .blockDimZ = 1, .kernelParams = args};
    CUgraphNode n1, n2;
    OK(cuGraphAddKernelNode(&n1, h, NULL, 0, &p));
    OK(cuGraphAddKernelNode(&n2, h, &n1, 1, &p));
    CUgraphExec y;
    OK(cuGraphInstantiateWithFlags(&y, h, 0));
    t0 = now_ms();
    OK(cuGraphLaunch(y, NULL));
    OK(cuCtxSynchronize());
    took = now_ms() - t0;
    ASSERT(took >= 9.5 && took < 100, "two 5 ms nodes took %.1f ms", took);
    OK(cuGraphExecDestroy(x));
    OK(cuGraphExecDestroy(y));
    OK(cuGraphDestroy(g));
    OK(cuGraphDestroy(h));
}

static void check_vmm(void) {
    setup();
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    size_t gran;
    OK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    size_t n = 4 * gran, free0, free1, total;
    OK(cuMemGetInfo(&free0, &total));
    CUmemGenericAllocationHandle hd;
    OK(cuMemCreate(&hd, n, &prop, 0));
    OK(cuMemGetInfo(&free1, &total));
    ASSERT(free0 - free1 == n, "cuMemCreate is charged to the device");
    CUdeviceptr va;
    OK(cuMemAddressReserve(&va, 2 * n, 0, 0, 0));
    OK(cuMemMap(va, n, 0, hd, 0));
    CUmemAccessDesc acc = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    OK(cuMemSetAccess(va, n, &acc, 1));
    EXPECT(cuMemSetAccess(va + n, n, &acc, 1), CUDA_ERROR_INVALID_VALUE);
    char msg[] = "virtual memory round trip", back[sizeof msg];
    OK(cuMemcpyHtoD(va + gran, msg, sizeof msg));
    OK(cuMemcpyDtoH(back, va + gran, sizeof msg));
    ASSERT(!strcmp(back, msg), "VMM bytes round-trip");
    EXPECT(cuMemcpyHtoD(va + n, msg, 4), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemUnmap(va, n));
    OK(cuMemRelease(hd));
    OK(cuMemAddressFree(va, 2 * n));
    OK(cuMemGetInfo(&free1, &total));
    ASSERT(free1 == free0, "released VMM memory comes back");
}

static void check_pools(void) {
    setup();
    CUmemoryPool pool;
    OK(cuDeviceGetDefaultMemPool(&pool, 0));
    cuuint64_t thr = 1 << 30;
    OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr));
    CUstream s;
    OK(cuStreamCreate(&s, 0));
    CUdeviceptr a, b;
    OK(cuMemAllocAsync(&a, 1 << 20, s));
    OK(cuMemAllocFromPoolAsync(&b, 1 << 20, pool, s));
    OK(cuMemsetD8Async(a, 1, 1 << 20, s));
    OK(cuMemFreeAsync(a, s));
    OK(cuMemFreeAsync(b, s));
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUmemoryPool mine;
    OK(cuMemPoolCreate(&mine, &props));
    OK(cuMemPoolDestroy(mine));
    OK(cuStreamSynchronize(s));
}

static void check_getproc(void) {
    void *self = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    ASSERT(self, "libcuda.so.1 is loaded");
    void *fn;
    CUdriverProcAddressQueryResult st;
    OK(cuGetProcAddress("cuMemAlloc", &fn, 13000, 0, &st));
    ASSERT(fn == dlsym(self, "cuMemAlloc_v2") && st == CU_GET_PROC_ADDRESS_SUCCESS, "cuMemAlloc at 13000 is _v2");
    OK(cuGetProcAddress("cuMemAlloc", &fn, 3000, 0, &st));
    ASSERT(fn == dlsym(self, "cuMemAlloc"), "cuMemAlloc at 3000 is the 32-bit one");
    OK(cuGetProcAddress("cuLaunchKernel", &fn, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st));
    ASSERT(fn == dlsym(self, "cuLaunchKernel_ptsz"), "per-thread launch");
    OK(cuGetProcAddress("cuLaunchKernel", &fn, 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &st));
    ASSERT(fn == dlsym(self, "cuLaunchKernel"), "legacy launch");
    OK(cuGetProcAddress("cuMemcpyHtoD", &fn, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st));
    ASSERT(fn == dlsym(self, "cuMemcpyHtoD_v2_ptds"), "per-thread copy");
    OK(cuGetProcAddress("cuCtxSynchronize", &fn, 13000, 0, &st));
    ASSERT(fn == dlsym(self, "cuCtxSynchronize_v2"), "CUDA 13 ABI");
    EXPECT(cuGetProcAddress("cuMemAllocAsync", &fn, 11000, 0, &st), CUDA_ERROR_NOT_FOUND);
    ASSERT(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT && fn == NULL, "too old a version");
    EXPECT(cuGetProcAddress("cuNoSuchThing", &fn, 13000, 0, &st), CUDA_ERROR_NOT_FOUND);
    ASSERT(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, "unknown symbol");
    EXPECT(cuGetProcAddress("cuInit", &fn, 99000, 0, &st), CUDA_ERROR_INVALID_VALUE);
    /* the old 4-argument entry point */
    CUresult (*old)(const char *, void **, int, cuuint64_t) = dlsym(self, "cuGetProcAddress");
    OK(old("cuInit", &fn, 12000, 0));
    ASSERT(fn == dlsym(self, "cuInit"), "cuGetProcAddress v1");
}

static void check_replay(const char *file) {
    FILE *f = fopen(file, "r");
    ASSERT(f, "cannot open %s", file);
    char line[256];
    int n = 0, found = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#')
            continue;
        char sym[128];
        int ver;
        unsigned long long flags;
        if (sscanf(line, "%127s %d %llu", sym, &ver, &flags) != 3)
            continue;
        if (!strcmp(sym, "\"\""))
            sym[0] = 0;
        void *fn = NULL;
        CUdriverProcAddressQueryResult st = 99;
        CUresult r = cuGetProcAddress(sym, &fn, ver, flags, &st);
        n++;
        if (!sym[0]) {
            ASSERT(r == CUDA_ERROR_NOT_FOUND && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, "empty probe");
            continue;
        }
        ASSERT(r == CUDA_SUCCESS && fn && st == CU_GET_PROC_ADDRESS_SUCCESS, "%s %d %llu: %s status %d", sym, ver,
               flags, ename(r), (int)st);
        found++;
    }
    fclose(f);
    printf("replayed %d requests, %d found\n", n, found);
    ASSERT(n == 440, "expected the 440 requests of cudart 13.0, read %d", n);
}

static void check_unsupported(void) {
    setup();
    CUarray a;
    CUDA_ARRAY_DESCRIPTOR d = {.Width = 16, .Height = 16, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    EXPECT(cuArrayCreate(&a, &d), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuArrayCreate(&a, &d), CUDA_ERROR_NOT_SUPPORTED);
}

static void check_errors(void) {
    const char *s;
    OK(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s));
    ASSERT(!strcmp(s, "CUDA_ERROR_OUT_OF_MEMORY"), "name %s", s);
    OK(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
    ASSERT(strstr(s, "memory"), "string %s", s);
    EXPECT(cuGetErrorName((CUresult)123456, &s), CUDA_ERROR_INVALID_VALUE);
}

static void check_fork(void) {
    setup();
    CUdeviceptr p;
    OK(cuMemAlloc(&p, 1 << 20));
    pid_t pid = fork();
    if (pid == 0) {
        int n;
        if (cuInit(0) != CUDA_ERROR_NOT_INITIALIZED || cuDeviceGetCount(&n) != CUDA_ERROR_NOT_INITIALIZED ||
            cuMemAlloc(&p, 16) != CUDA_ERROR_NOT_INITIALIZED)
            _exit(3);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the forked child must get CUDA_ERROR_NOT_INITIALIZED");
    OK(cuMemFree(p)); /* the parent goes on */
    CUfunction f = kernel("tgs_spin");
    spin(f, NULL, 1000);
    OK(cuCtxSynchronize());
}

static void check_timeslice(void) {
    /* Two kernels of one context run back to back; the engine is one timeline. */
    setup();
    CUfunction f = kernel("tgs_spin");
    CUstream a, b;
    OK(cuStreamCreate(&a, 0));
    OK(cuStreamCreate(&b, 0));
    double t0 = now_ms();
    spin(f, a, 20000000);
    spin(f, b, 20000000);
    OK(cuStreamSynchronize(a));
    double first = now_ms() - t0;
    OK(cuStreamSynchronize(b));
    double both = now_ms() - t0;
    ASSERT(first >= 19 && first < 35, "first kernel done at %.1f ms", first);
    ASSERT(both >= 39 && both < 80, "second kernel done at %.1f ms", both);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: simgpu_api CHECK [ARG]\n");
        return 2;
    }
    g_check = argv[1];
    if (!strcmp(g_check, "init")) check_init();
    else if (!strcmp(g_check, "contexts")) check_contexts();
    else if (!strcmp(g_check, "memory")) check_memory();
    else if (!strcmp(g_check, "oom")) check_oom();
    else if (!strcmp(g_check, "managed")) check_managed();
    else if (!strcmp(g_check, "events")) check_events();
    else if (!strcmp(g_check, "streams")) check_streams();
    else if (!strcmp(g_check, "graphs")) check_graphs();
    else if (!strcmp(g_check, "vmm")) check_vmm();
    else if (!strcmp(g_check, "pools")) check_pools();
    else if (!strcmp(g_check, "getproc")) check_getproc();
    else if (!strcmp(g_check, "replay")) check_replay(argc > 2 ? argv[2] : "");
    else if (!strcmp(g_check, "unsupported")) check_unsupported();
    else if (!strcmp(g_check, "errors")) check_errors();
    else if (!strcmp(g_check, "fork")) check_fork();
    else if (!strcmp(g_check, "timeslice")) check_timeslice();
    else {
        fprintf(stderr, "unknown check %s\n", g_check);
        return 2;
    }
    printf("ok %s\n", g_check);
    return 0;
}
