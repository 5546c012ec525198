/* Programs the libtgs.so tests run inside a (simulated) TGS container. Linked directly to
 * libcuda.so.1, so calls reach the shim through its exported symbols.
 *   shim_checks convert            device memory comes back as managed memory, and is truthful
 *   shim_checks quota MB           allocate 64 MB blocks until refused; print how many
 *   shim_checks meminfo            print cuMemGetInfo and cuDeviceTotalMem as JSON
 *   shim_checks vmm MB             cuMemCreate MB and hold it 1 s
 *   shim_checks graph N            instantiate a 3-kernel graph, launch it N times
 *   shim_checks capturequery       a kernel on one stream, its event polled until done while a
 *                                  second stream, launched on before, captures a graph (relaxed
 *                                  mode); the capture must still end, and its graph run
 *   shim_checks capture N          launch N kernels on a capturing stream, then the graph once
 *   shim_checks threads T S        T threads launching 1 ms kernels for S seconds; print kernels/s
 *   shim_checks fork               fork while another thread launches; both sides go on
 *   shim_checks hold MB S          allocate MB with cuMemAlloc, print the pointer, sleep S seconds
 *   shim_checks ipc                cuIpcGetMemHandle twice on cuMemAlloc memory; print both results
 *   shim_checks copyloop S         for S seconds: iterations of ten 1 ms kernels ended by a
 *                                  synchronous cuMemcpyDtoH (no other synchronisation), then
 *                                  10 ms on the CPU; print iterations/s
 *   shim_checks unifiedcopy S      as copyloop, the copy made by the unified cuMemcpy (a host
 *                                  pointer as its destination), which cudart may use instead
 *   shim_checks pollloop S         for S seconds: iterations as TensorFlow runs them, waited for by
 *                                  polling events and never synchronised: a 1 ms kernel on one
 *                                  stream, then nine on another (the first's event is polled until
 *                                  done, as its event manager frees memory in mid-iteration), the result
 *                                  copied on a second stream behind them, that copy's event polled
 *                                  until done; then 10 ms on the CPU; print iterations/s
 *   shim_checks pollfresh S        as pollloop, but each iteration on a stream of its own: ten
 *                                  1 ms kernels on a stream made for it, its event polled until
 *                                  done, the stream destroyed, then 10 ms on the CPU
 *   shim_checks pollthread S       for S seconds: iterations of one 20 ms kernel, waited for by
 *                                  another thread that polls events all along (the last
 *                                  iteration's, done, while the launch is under way), then 20 ms on
 *                                  the CPU; print iterations/s (with SIMGPU_FAULT=slow-launch, the
 *                                  poller finds every stream drained in the middle of each launch)
 *   shim_checks sidestream S       for S seconds: two threads, each synchronising its own stream:
 *                                  one runs a 15 ms kernel then 25 ms on the CPU, the other every
 *                                  4 ms synchronises its stream, which has no work (as a thread
 *                                  whose input upload is done: simgpu runs copies in the context's
 *                                  order, a GPU on its copy engines), so its synchronisations
 *                                  return while the first's kernel runs; print the first's
 *                                  iterations/s
 *   shim_checks contexts N         N rounds of kernels in each of two contexts of GPU 0, then the
 *                                  same after destroying and making them again; print the heap
 *                                  bytes (mallinfo2) the rounds left in use
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../libshim/workloads/kernels.h"

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    exit(1);
}

static const char *ename(CUresult r) {
    const char *s = NULL;
    cuGetErrorName(r, &s);
    return s ? s : "?";
}

#define OK(call)                                                                            \
    do {                                                                                    \
        CUresult _r = (call);                                                               \
        if (_r != CUDA_SUCCESS)                                                             \
            die("%s:%d %s returned %s", __FILE__, __LINE__, #call, ename(_r));              \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static CUcontext g_ctx;
static CUfunction g_spin;

static void setup(void) {
    OK(cuInit(0));
    OK(cuDevicePrimaryCtxRetain(&g_ctx, 0));
    OK(cuCtxSetCurrent(g_ctx));
    CUmodule m;
    OK(cuModuleLoadData(&m, tgs_workload_ptx));
    OK(cuModuleGetFunction(&g_spin, m, "tgs_spin"));
}

static CUresult spin(CUstream s, unsigned long long ns) {
    void *args[] = {&ns};
    return cuLaunchKernel(g_spin, 108, 1, 1, 128, 1, 1, 0, s, args, NULL);
}

static void check_convert(void) {
    setup();
    CUdeviceptr p;
    OK(cuMemAlloc(&p, 8 << 20));
    unsigned managed = 9, type = 9;
    OK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p));
    OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p));
    char msg[] = "converted bytes round-trip", back[sizeof msg];
    OK(cuMemcpyHtoD(p, msg, sizeof msg));
    OK(cuMemcpyDtoH(back, p, sizeof msg));
    if (strcmp(msg, back))
        die("bytes did not round-trip");
    size_t pitch;
    CUdeviceptr pp;
    OK(cuMemAllocPitch(&pp, &pitch, 1000, 4, 4));
    CUstream s;
    OK(cuStreamCreate(&s, 0));
    CUdeviceptr a;
    OK(cuMemAllocAsync(&a, 1 << 20, s));
    unsigned amanaged = 9;
    OK(cuPointerGetAttribute(&amanaged, CU_POINTER_ATTRIBUTE_IS_MANAGED, a));
    OK(spin(s, 1000000));
    OK(cuMemFreeAsync(a, s));
    OK(cuMemFree(pp));
    printf("{\"managed\": %u, \"memory_type\": %u, \"pitch\": %zu, \"async_managed\": %u}\n", managed, type, pitch,
           amanaged);
    OK(cuMemFree(p));
}

static void check_ipc(void) {
    setup();
    CUdeviceptr p;
    OK(cuMemAlloc(&p, 4 << 20));
    CUipcMemHandle h;
    CUresult first = cuIpcGetMemHandle(&h, p + 4096), second = cuIpcGetMemHandle(&h, p);
    printf("{\"first\": \"%s\", \"second\": \"%s\"}\n", ename(first), ename(second));
    OK(cuMemFree(p));
}

static void check_quota(int mb) {
    setup();
    int n = 0;
    CUdeviceptr p;
    CUresult r;
    while ((r = cuMemAlloc(&p, (size_t)mb << 20)) == CUDA_SUCCESS && n < 1000)
        n++;
    printf("{\"blocks\": %d, \"error\": \"%s\"}\n", n, ename(r));
}

static void check_meminfo(void) {
    setup();
    size_t free_b, total, dev_total;
    OK(cuMemGetInfo(&free_b, &total));
    OK(cuDeviceTotalMem(&dev_total, 0));
    printf("{\"free\": %zu, \"total\": %zu, \"device_total\": %zu}\n", free_b, total, dev_total);
}

/* cuMemCreate of `mb`, held for `seconds` (at least 1). */
static void check_vmm(int mb, double seconds) {
    setup();
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUmemGenericAllocationHandle h;
    CUresult r = cuMemCreate(&h, (size_t)mb << 20, &prop, 0);
    printf("{\"create\": \"%s\"}\n", ename(r));
    fflush(stdout);
    if (r == CUDA_SUCCESS) {
        usleep((useconds_t)((seconds > 1 ? seconds : 1) * 1e6));
        OK(cuMemRelease(h));
    }
}

static void check_graph(int n) {
    setup();
    CUstream s;
    OK(cuStreamCreate(&s, 0));
    OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    for (int i = 0; i < 3; i++)
        OK(spin(s, 100000));
    CUgraph g;
    OK(cuStreamEndCapture(s, &g));
    CUgraphExec x;
    OK(cuGraphInstantiate(&x, g, 0));
    for (int i = 0; i < n; i++)
        OK(cuGraphLaunch(x, s));
    OK(cuStreamSynchronize(s));
    printf("{\"launched\": %d}\n", n);
}

static void check_capture(int n) {
    setup();
    CUstream s;
    OK(cuStreamCreate(&s, 0));
    OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    for (int i = 0; i < n; i++)
        OK(spin(s, 100000));
    CUgraph g;
    OK(cuStreamEndCapture(s, &g));
    printf("{\"captured\": %d}\n", n);
}

static void poll_until_done(CUevent e);

static void check_capturequery(void) {
    setup();
    CUstream y, x;
    OK(cuStreamCreate(&y, CU_STREAM_NON_BLOCKING));
    OK(cuStreamCreate(&x, CU_STREAM_NON_BLOCKING));
    CUevent ev;
    OK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    OK(spin(x, 1000));
    OK(cuStreamSynchronize(x));
    OK(spin(y, 2000000));
    OK(cuEventRecord(ev, y));
    OK(cuStreamBeginCapture(x, CU_STREAM_CAPTURE_MODE_RELAXED));
    OK(spin(x, 100000));
    poll_until_done(ev);
    OK(spin(x, 100000));
    CUgraph g;
    OK(cuStreamEndCapture(x, &g));
    CUgraphExec ge;
    OK(cuGraphInstantiate(&ge, g, 0));
    OK(cuGraphLaunch(ge, x));
    OK(cuStreamSynchronize(x));
    printf("{\"captured\": 2}\n");
}

/* A thread launching on a stream of its own, for `seconds`: a kernel of kernel_ns (none
 * where 0), a synchronisation of its stream every sync_every of those, host_us on the CPU
 * after each. */
struct worker {
    double seconds;
    unsigned long long kernel_ns;
    long sync_every;
    useconds_t host_us;
    long iterations;
};

static void *launcher(void *arg) {
    struct worker *w = arg;
    OK(cuCtxSetCurrent(g_ctx));
    CUstream s;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    double end = now_s() + w->seconds;
    while (now_s() < end) {
        if (w->kernel_ns)
            OK(spin(s, w->kernel_ns));
        w->iterations++;
        if (w->iterations % w->sync_every == 0)
            OK(cuStreamSynchronize(s));
        if (w->host_us)
            usleep(w->host_us);
    }
    OK(cuStreamSynchronize(s));
    return NULL;
}

/* A thread of check_threads: 1 ms kernels, its stream synchronised every fourth. */
static struct worker busy_launcher(double seconds) {
    return (struct worker){.seconds = seconds, .kernel_ns = 1000000, .sync_every = 4};
}

static void check_threads(int n, double seconds) {
    setup();
    pthread_t t[64];
    struct worker w[64];
    double start = now_s();
    for (int i = 0; i < n; i++) {
        w[i] = busy_launcher(seconds);
        pthread_create(&t[i], NULL, launcher, &w[i]);
    }
    long total = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(t[i], NULL);
        total += w[i].iterations;
    }
    printf("{\"threads\": %d, \"kernels\": %ld, \"kernels_per_s\": %.2f}\n", n, total, (double)total / (now_s() - start));
}

static void check_fork(void) {
    setup();
    struct worker w = busy_launcher(1.0);
    pthread_t t;
    pthread_create(&t, NULL, launcher, &w);
    usleep(200000);
    pid_t pid = fork();
    if (pid == 0) {
        /* the child of an initialised process: the driver refuses, the shim must not hang */
        CUresult r = cuInit(0);
        CUdeviceptr p;
        CUresult a = cuMemAlloc(&p, 4096);
        printf("{\"child_init\": \"%s\", \"child_alloc\": \"%s\"}\n", ename(r), ename(a));
        fflush(stdout);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    pthread_join(t, NULL);
    OK(spin(NULL, 1000));
    OK(cuCtxSynchronize());
    printf("{\"parent_kernels\": %ld, \"child_exit\": %d}\n", w.iterations,
           WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

static void check_hold(int mb, double seconds) {
    setup();
    CUdeviceptr p;
    CUresult r = cuMemAlloc(&p, (size_t)mb << 20);
    printf("{\"alloc\": \"%s\", \"ptr\": %llu}\n", ename(r), (unsigned long long)p);
    fflush(stdout);
    usleep((useconds_t)(seconds * 1e6));
}

struct two { CUcontext ctx[2]; CUfunction spin[2]; };

/* Three short kernels in each context, then a wait (three: the shim's event ring and
 * its one-in-eight timing then meet both contexts in each of their slots). */
static void round_in(struct two *t, int n) {
    unsigned long long ns = 20000;
    void *args[] = {&ns};
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 2; k++) {
            OK(cuCtxSetCurrent(t->ctx[k]));
            for (int j = 0; j < 3; j++)
                OK(cuLaunchKernel(t->spin[k], 108, 1, 1, 128, 1, 1, 0, NULL, args, NULL));
            OK(cuCtxSynchronize());
        }
    }
}

static void make_two(struct two *t) {
    for (int k = 0; k < 2; k++) {
        OK(cuCtxCreate(&t->ctx[k], NULL, 0, 0));
        CUmodule m;
        OK(cuModuleLoadData(&m, tgs_workload_ptx));
        OK(cuModuleGetFunction(&t->spin[k], m, "tgs_spin"));
    }
}

static void check_contexts(int n) {
    OK(cuInit(0));
    struct two t;
    make_two(&t);
    round_in(&t, 16); /* what is made once (per-thread caches, the first events) */
    size_t before = mallinfo2().uordblks;
    round_in(&t, n);
    size_t grown = mallinfo2().uordblks - before;
    for (int k = 0; k < 2; k++)
        OK(cuCtxDestroy(t.ctx[k]));
    make_two(&t); /* handles of destroyed contexts may come back */
    round_in(&t, n);
    printf("{\"rounds\": %d, \"heap_growth_bytes\": %zu}\n", n, grown);
}

/* Runs iteration `one` (given its number) over and over for `seconds`; prints iterations/s. */
static void iterate(double seconds, void (*one)(int n)) {
    double start = now_s();
    int n = 0;
    while (now_s() - start < seconds)
        one(n++);
    printf("{\"iterations_per_s\": %.1f}\n", n / (now_s() - start));
}

static CUdeviceptr g_result; /* 4 bytes an iteration copies to the host */
static int g_copy_unified;    /* ... by cuMemcpy, not cuMemcpyDtoH */

static void copyloop_one(int n) {
    (void)n;
    unsigned x;
    for (int k = 0; k < 10; k++)
        OK(spin(NULL, 1000000));
    if (g_copy_unified)
        OK(cuMemcpy((CUdeviceptr)(uintptr_t)&x, g_result, sizeof x));
    else
        OK(cuMemcpyDtoH(&x, g_result, sizeof x));
    usleep(10000);
}

static void check_copyloop(double seconds, int unified) {
    setup();
    OK(cuMemAlloc(&g_result, 4));
    g_copy_unified = unified;
    iterate(seconds, copyloop_one);
}

static void poll_until_done(CUevent e) {
    CUresult r;
    while ((r = cuEventQuery(e)) == CUDA_ERROR_NOT_READY)
        usleep(50);
    if (r != CUDA_SUCCESS)
        die("cuEventQuery returned %s", ename(r));
}

static struct {
    CUstream first, compute, copy;
    CUevent early, computed, copied;
} g_pl;

static void pollloop_one(int n) {
    (void)n;
    static unsigned x;
    OK(spin(g_pl.first, 1000000));
    OK(cuEventRecord(g_pl.early, g_pl.first));
    for (int k = 1; k < 10; k++)
        OK(spin(g_pl.compute, 1000000));
    poll_until_done(g_pl.early); /* its stream is done, the other not */
    OK(cuEventRecord(g_pl.computed, g_pl.compute));
    OK(cuStreamWaitEvent(g_pl.copy, g_pl.computed, 0));
    OK(cuStreamWaitEvent(g_pl.copy, g_pl.early, 0));
    OK(cuMemcpyDtoHAsync(&x, g_result, sizeof x, g_pl.copy));
    OK(cuEventRecord(g_pl.copied, g_pl.copy));
    poll_until_done(g_pl.copied);
    usleep(10000);
}

static void check_pollloop(double seconds) {
    setup();
    CUstream *streams[] = {&g_pl.first, &g_pl.compute, &g_pl.copy};
    CUevent *events[] = {&g_pl.early, &g_pl.computed, &g_pl.copied};
    for (int i = 0; i < 3; i++) {
        OK(cuStreamCreate(streams[i], CU_STREAM_NON_BLOCKING));
        OK(cuEventCreate(events[i], CU_EVENT_DISABLE_TIMING));
    }
    OK(cuMemAlloc(&g_result, 4));
    iterate(seconds, pollloop_one);
}

static CUevent g_fresh_done;

static void pollfresh_one(int n) {
    (void)n;
    CUstream s;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    for (int k = 0; k < 10; k++)
        OK(spin(s, 1000000));
    OK(cuEventRecord(g_fresh_done, s));
    poll_until_done(g_fresh_done);
    OK(cuStreamDestroy(s));
    usleep(10000);
}

static void check_pollfresh(double seconds) {
    setup();
    OK(cuEventCreate(&g_fresh_done, CU_EVENT_DISABLE_TIMING));
    iterate(seconds, pollfresh_one);
}

static struct {
    CUstream compute;
    CUevent ev[2];   /* recorded by turns, one per iteration */
    CUevent watched; /* the event the poller polls */
    CUevent done;    /* the last event it found done */
    int stop;
} g_poll;

static void *poller(void *arg) {
    (void)arg;
    OK(cuCtxSetCurrent(g_ctx));
    while (!__atomic_load_n(&g_poll.stop, __ATOMIC_ACQUIRE)) {
        CUevent e = __atomic_load_n(&g_poll.watched, __ATOMIC_ACQUIRE);
        CUresult r = cuEventQuery(e);
        if (r == CUDA_SUCCESS)
            __atomic_store_n(&g_poll.done, e, __ATOMIC_RELEASE);
        else if (r != CUDA_ERROR_NOT_READY)
            die("cuEventQuery returned %s", ename(r));
        usleep(50);
    }
    return NULL;
}

static void pollthread_one(int n) {
    OK(spin(g_poll.compute, 20000000)); /* the poller polls the last iteration's event meanwhile */
    CUevent e = g_poll.ev[n % 2];
    OK(cuEventRecord(e, g_poll.compute));
    __atomic_store_n(&g_poll.watched, e, __ATOMIC_RELEASE);
    while (__atomic_load_n(&g_poll.done, __ATOMIC_ACQUIRE) != e)
        usleep(50);
    usleep(20000);
}

static void check_pollthread(double seconds) {
    setup();
    OK(cuStreamCreate(&g_poll.compute, CU_STREAM_NON_BLOCKING));
    for (int i = 0; i < 2; i++)
        OK(cuEventCreate(&g_poll.ev[i], CU_EVENT_DISABLE_TIMING));
    OK(cuEventRecord(g_poll.ev[1], g_poll.compute));
    g_poll.watched = g_poll.ev[1];
    pthread_t t;
    if (pthread_create(&t, NULL, poller, NULL))
        die("pthread_create failed");
    iterate(seconds, pollthread_one);
    __atomic_store_n(&g_poll.stop, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
}

static void check_sidestream(double seconds) {
    setup();
    struct worker w[2] = {{.seconds = seconds, .kernel_ns = 15000000, .sync_every = 1, .host_us = 25000},
                          {.seconds = seconds, .sync_every = 1, .host_us = 4000}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        if (pthread_create(&t[i], NULL, launcher, &w[i]))
            die("pthread_create failed");
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    printf("{\"iterations_per_s\": %.1f}\n", (double)w[0].iterations / seconds);
}

int main(int argc, char **argv) {
    if (argc < 2)
        return 2;
    const char *c = argv[1];
    int a = argc > 2 ? atoi(argv[2]) : 0;
    double b = argc > 3 ? atof(argv[3]) : 0;
    if (!strcmp(c, "convert")) check_convert();
    else if (!strcmp(c, "quota")) check_quota(a);
    else if (!strcmp(c, "meminfo")) check_meminfo();
    else if (!strcmp(c, "vmm")) check_vmm(a, b);
    else if (!strcmp(c, "graph")) check_graph(a);
    else if (!strcmp(c, "capture")) check_capture(a);
    else if (!strcmp(c, "threads")) check_threads(a, b);
    else if (!strcmp(c, "fork")) check_fork();
    else if (!strcmp(c, "hold")) check_hold(a, b);
    else if (!strcmp(c, "contexts")) check_contexts(a);
    else if (!strcmp(c, "ipc")) check_ipc();
    else if (!strcmp(c, "copyloop")) check_copyloop(a, 0);
    else if (!strcmp(c, "unifiedcopy")) check_copyloop(a, 1);
    else if (!strcmp(c, "pollloop")) check_pollloop(a);
    else if (!strcmp(c, "capturequery")) check_capturequery();
    else if (!strcmp(c, "pollfresh")) check_pollfresh(a);
    else if (!strcmp(c, "pollthread")) check_pollthread(a);
    else if (!strcmp(c, "sidestream")) check_sidestream(a);
    else return 2;
    return 0;
}
