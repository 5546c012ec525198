/* tgs-workload: a program shaped like a training job, for tests, the demo and bench.
 *
 * It allocates "parameters" and "activations", then iterates: K kernels of a given
 * duration, each touching its slice of both buffers, a synchronisation, then a CPU gap
 * (data loading, the host side of a step). Throughput is iterations per second.
 * With --verify it writes a pattern first and checks at the end that every touch the
 * kernels made is there (checksum_ok).
 *
 * It reaches the driver the way the CUDA runtime does: dlopen("libcuda.so.1"), then
 * every entry point through cuGetProcAddress_v2 at the ABI version it was written
 * against. So it runs unchanged on a real GPU, on simgpu, and under libtgs.so.
 *
 * Flags and JSON output are a contract (ARCHITECTURE.md, "Workload"). */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"

#define STRIDE (64u << 10) /* one touched word per 64 KiB */

static struct {
    PFN_cuInit_v2000 Init;
    PFN_cuDeviceGetCount_v2000 DeviceGetCount;
    PFN_cuDeviceGet_v2000 DeviceGet;
    PFN_cuDeviceGetAttribute_v2000 DeviceGetAttribute;
    PFN_cuDeviceGetName_v2000 DeviceGetName;
    PFN_cuDevicePrimaryCtxRetain_v7000 PrimaryCtxRetain;
    PFN_cuCtxSetCurrent_v4000 CtxSetCurrent;
    PFN_cuCtxSynchronize_v2000 CtxSynchronize;
    PFN_cuModuleLoadData_v2000 ModuleLoadData;
    PFN_cuModuleGetFunction_v2000 ModuleGetFunction;
    PFN_cuMemAlloc_v3020 MemAlloc;
    PFN_cuMemAllocManaged_v6000 MemAllocManaged;
    PFN_cuMemFree_v3020 MemFree;
    PFN_cuMemcpyHtoD_v3020 MemcpyHtoD;
    PFN_cuMemcpyDtoH_v3020 MemcpyDtoH;
    PFN_cuLaunchKernel_v4000 LaunchKernel;
    PFN_cuGetErrorName_v6000 GetErrorName;
    PFN_cuGetErrorString_v6000 GetErrorString;
} cu;

static struct {
    double kernel_us, gap_us, seconds, report_s, warmup_s;
    long kernels;
    double param_mb, act_mb;
    int device, verify, managed, json;
    long iterations; /* stop after this many (0: run for --seconds) */
    long long_kernels; /* the last this many kernels of each iteration run long_us */
    double long_us;    /* -1: --kernel-us */
    long shapes;       /* kernel i of the run is on grid size i % shapes */
    double host_us;    /* host work after the first half of each iteration's kernels */
    int host_sync;     /* the GPU caught up before that host work (an idle spell inside the iteration) */
    double host_sync_s; /* ... for this long into the run (0: throughout) */
    double stall_us;   /* more CPU time after every stall_every-th iteration */
    long stall_every;
    double phase_s;    /* from this far into the run ... */
    long phase_kernels; /* ... this many kernels per iteration (0: --kernels throughout) */
    double phase_gap_us; /* ... and this much CPU time between iterations (-1: --gap-us throughout) */
    double gap_spread;   /* each gap drawn within gap * (1 +- this) */
    int stall_inside;    /* each stall with the host work inside its iteration instead (a collector's pause) */
} opt = {1000, 0, 10, 1, -1, 10, 16, 16, 0, 0, 0, 0, 0, 0, -1, 1, 0, 0, 0, 0, 0, 0, 0, -1, 0, 0};

/* Whether iteration n (counted from 1) has a stall (--stall-us, --stall-every). */
static int stalls(uint64_t n) { return opt.stall_every && n % (uint64_t)opt.stall_every == 0; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void fail(const char *what, CUresult r) {
    const char *name = "?", *desc = "";
    if (cu.GetErrorName)
        cu.GetErrorName(r, &name);
    if (cu.GetErrorString)
        cu.GetErrorString(r, &desc);
    if (!name)
        name = "unknown CUresult";
    if (opt.json)
        printf("{\"error\": \"%s failed\", \"cuda_error\": \"%s\", \"code\": %d}\n", what, name, (int)r);
    fprintf(stderr, "tgs-workload: %s failed: %s (%d)%s%s\n", what, name, (int)r, desc && *desc ? ": " : "",
            desc ? desc : "");
    fflush(stdout);
    exit(r == CUDA_ERROR_OUT_OF_MEMORY ? 3 : 1);
}

#define CHECK(call, what)                 \
    do {                                  \
        CUresult _r = (call);             \
        if (_r != CUDA_SUCCESS)           \
            fail(what, _r);               \
    } while (0)

static void load_driver(void) {
    const char *path = getenv("TGS_WORKLOAD_LIBCUDA");
    void *h = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        fprintf(stderr, "tgs-workload: cannot load the CUDA driver: %s\n"
                        "  (no GPU driver here? run it on simgpu: tgs sim run -- tgs-workload ...)\n",
                dlerror());
        exit(2);
    }
    PFN_cuGetProcAddress_v12000 gpa = (PFN_cuGetProcAddress_v12000)dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) {
        fprintf(stderr, "tgs-workload: the CUDA driver is older than 12.0 (no cuGetProcAddress_v2)\n");
        exit(2);
    }
#define LOAD(field, name, ver)                                                                            \
    do {                                                                                                  \
        CUdriverProcAddressQueryResult st;                                                                \
        CUresult _r = gpa(#name, (void **)&cu.field, ver, CU_GET_PROC_ADDRESS_DEFAULT, &st);              \
        if (_r != CUDA_SUCCESS || !cu.field) {                                                            \
            fprintf(stderr, "tgs-workload: the driver has no %s (ABI %d): error %d, status %d\n", #name, \
                    ver, (int)_r, (int)st);                                                               \
            exit(2);                                                                                      \
        }                                                                                                 \
    } while (0)
    LOAD(GetErrorName, cuGetErrorName, 6000);
    LOAD(GetErrorString, cuGetErrorString, 6000);
    LOAD(Init, cuInit, 2000);
    LOAD(DeviceGetCount, cuDeviceGetCount, 2000);
    LOAD(DeviceGet, cuDeviceGet, 2000);
    LOAD(DeviceGetAttribute, cuDeviceGetAttribute, 2000);
    LOAD(DeviceGetName, cuDeviceGetName, 2000);
    LOAD(PrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000);
    LOAD(CtxSetCurrent, cuCtxSetCurrent, 4000);
    LOAD(CtxSynchronize, cuCtxSynchronize, 2000);
    LOAD(ModuleLoadData, cuModuleLoadData, 2000);
    LOAD(ModuleGetFunction, cuModuleGetFunction, 2000);
    LOAD(MemAlloc, cuMemAlloc, 3020);
    LOAD(MemAllocManaged, cuMemAllocManaged, 6000);
    LOAD(MemFree, cuMemFree, 3020);
    LOAD(MemcpyHtoD, cuMemcpyHtoD, 3020);
    LOAD(MemcpyDtoH, cuMemcpyDtoH, 3020);
    LOAD(LaunchKernel, cuLaunchKernel, 4000);
#undef LOAD
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: tgs-workload [options]\n"
            "A GPU job shaped like training: K kernels per iteration, a sync, a CPU gap.\n\n"
            "  --kernel-us US   duration of each kernel (default 1000)\n"
            "  --kernels K      kernels per iteration (default 10)\n"
            "  --long-kernels N the last N of them run --long-us instead, one after another, on grids\n"
            "                   of their own (as a backward pass's matmuls; default 0)\n"
            "  --long-us US     duration of those (default: --kernel-us)\n"
            "  --shapes N       kernel i of the run is on grid size i %% N: SMs + that many blocks (the long\n"
            "                   ones: twice (SMs + N-1), plus that many); N kernels of each kind to\n"
            "                   whoever tells kernels apart by their grid, as dynamic shapes (default 1)\n"
            "  --gap-us US      CPU time between iterations (default 0: GPU-bound)\n"
            "  --gap-spread F   each gap drawn uniformly within US * (1 +- F), the same draws every run\n"
            "                   (a data loader whose batches take more or less time; 0 <= F < 1;\n"
            "                   needs --gap-us; default 0)\n"
            "  --host-us US     host work in each iteration once the first half of its kernels is queued,\n"
            "                   while the GPU runs them (a framework's work between launches; the\n"
            "                   thread sleeps; default 0)\n"
            "  --host-sync      synchronise before that host work, so that the GPU idles through it: an\n"
            "                   idle spell inside each iteration, as a framework's event query that finds\n"
            "                   the GPU caught up (needs --host-us)\n"
            "  --host-sync-s S  only for the first S seconds of the run (needs --host-sync; default 0:\n"
            "                   throughout), as a job whose steps stop idling once it has warmed up\n"
            "  --stall-us US    more CPU time after every --stall-every-th iteration: a pause of the job's\n"
            "                   own, as a data loader's stall (the thread sleeps; default 0)\n"
            "  --stall-every N  (default 0: no stalls; give both or neither)\n"
            "  --stall-inside   each stall inside its iteration instead, with the host work after the\n"
            "                   first half of its kernels (after the synchronisation of --host-sync: the\n"
            "                   GPU idles through it), as a garbage collector's pause mid-step (needs\n"
            "                   --stall-us and --stall-every)\n"
            "  --phase-s S      from S seconds into the run, --phase-kernels K kernels per iteration: the\n"
            "  --phase-kernels K  same process's load moving, with no idle moment and no process starting\n"
            "                   or ending to tell (not with --verify)\n"
            "  --phase-gap-us US  and/or US of CPU time between iterations from then on, as a data loader\n"
            "                   whose first epoch read from disk (--phase-s needs one of the two, and\n"
            "                   each of them --phase-s)\n"
            "  --seconds S      how long to run (default 10); SIGINT or SIGTERM ends the run sooner, as\n"
            "                   if its time were up (it still verifies and reports)\n"
            "  --iterations N   stop after N iterations instead (a job of fixed work; --seconds still caps it)\n"
            "  --param-mb MB    parameter memory, touched every iteration (default 16)\n"
            "  --act-mb MB      activation memory, touched every iteration (default 16)\n"
            "  --device N       CUDA device ordinal (default 0)\n"
            "  --report-s S     progress line every S seconds (default 1)\n"
            "  --warmup-s S     excluded from the summary throughput (default min(1, seconds/4))\n"
            "  --verify         write a pattern first, check every kernel's writes at the end\n"
            "  --managed        allocate with cuMemAllocManaged instead of cuMemAlloc\n"
            "  --json           one JSON object per line (the last is the summary)\n"
            "  --print-ptx      print the kernels' PTX and exit\n");
}

static double parse_num(const char *flag, const char *v, double lo, double hi) {
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (errno || end == v || *end || !(d >= lo && d <= hi)) {
        fprintf(stderr, "tgs-workload: %s %s: expected a number from %g to %g\n", flag, v, lo, hi);
        exit(2);
    }
    return d;
}

/* Two flags that mean nothing apart (`a_is` and `b_is` say what each gives): one without the
 * other is refused, saying what is missing, rather than run without. */
static void give_both(const char *a, double av, const char *a_is, const char *b, double bv, const char *b_is) {
    if ((av > 0) == (bv > 0))
        return;
    if (av > 0)
        fprintf(stderr, "tgs-workload: %s %g without %s: give both (%s)\n", a, av, b, b_is);
    else
        fprintf(stderr, "tgs-workload: %s %g without %s: give both (%s)\n", b, bv, a, a_is);
    exit(2);
}

static void parse(int argc, char **argv) {
    static const struct option longs[] = {
        {"kernel-us", 1, 0, 'k'}, {"kernels", 1, 0, 'K'}, {"gap-us", 1, 0, 'g'},   {"seconds", 1, 0, 's'},
        {"param-mb", 1, 0, 'p'},  {"act-mb", 1, 0, 'a'},  {"device", 1, 0, 'd'},   {"report-s", 1, 0, 'r'},
        {"warmup-s", 1, 0, 'w'},  {"verify", 0, 0, 'v'},  {"managed", 0, 0, 'm'},  {"json", 0, 0, 'j'},
        {"print-ptx", 0, 0, 'P'}, {"help", 0, 0, 'h'},    {"iterations", 1, 0, 'n'}, {"long-kernels", 1, 0, 'L'},
        {"long-us", 1, 0, 'U'},   {"shapes", 1, 0, 'S'},    {"host-us", 1, 0, 'H'},   {"stall-us", 1, 0, 'T'},
        {"stall-every", 1, 0, 'E'}, {"phase-s", 1, 0, 'A'}, {"phase-kernels", 1, 0, 'B'}, {"host-sync", 0, 0, 'Y'},
        {"host-sync-s", 1, 0, 'Z'}, {"phase-gap-us", 1, 0, 'G'}, {"gap-spread", 1, 0, 'F'},
        {"stall-inside", 0, 0, 'I'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        switch (c) {
        case 'k': opt.kernel_us = parse_num("--kernel-us", optarg, 0, 60e6); break;
        case 'K': opt.kernels = (long)parse_num("--kernels", optarg, 1, 100000); break;
        case 'g': opt.gap_us = parse_num("--gap-us", optarg, 0, 60e6); break;
        case 's': opt.seconds = parse_num("--seconds", optarg, 0.01, 1e7); break;
        case 'p': opt.param_mb = parse_num("--param-mb", optarg, 0, 1 << 22); break;
        case 'a': opt.act_mb = parse_num("--act-mb", optarg, 0, 1 << 22); break;
        case 'd': opt.device = (int)parse_num("--device", optarg, 0, 1024); break;
        case 'r': opt.report_s = parse_num("--report-s", optarg, 0.01, 1e7); break;
        case 'w': opt.warmup_s = parse_num("--warmup-s", optarg, 0, 1e7); break;
        case 'n': opt.iterations = (long)parse_num("--iterations", optarg, 1, 1e12); break;
        case 'L': opt.long_kernels = (long)parse_num("--long-kernels", optarg, 0, 100000); break;
        case 'U': opt.long_us = parse_num("--long-us", optarg, 0, 60e6); break;
        case 'S': opt.shapes = (long)parse_num("--shapes", optarg, 1, 100000); break;
        case 'H': opt.host_us = parse_num("--host-us", optarg, 0, 60e6); break;
        case 'T': opt.stall_us = parse_num("--stall-us", optarg, 0, 60e6); break;
        case 'E': opt.stall_every = (long)parse_num("--stall-every", optarg, 0, 1e12); break;
        case 'A': opt.phase_s = parse_num("--phase-s", optarg, 0, 1e7); break;
        case 'B': opt.phase_kernels = (long)parse_num("--phase-kernels", optarg, 1, 100000); break;
        case 'G': opt.phase_gap_us = parse_num("--phase-gap-us", optarg, 0, 60e6); break;
        case 'F': opt.gap_spread = parse_num("--gap-spread", optarg, 0, 0.99); break;
        case 'Y': opt.host_sync = 1; break;
        case 'I': opt.stall_inside = 1; break;
        case 'Z': opt.host_sync_s = parse_num("--host-sync-s", optarg, 0, 1e7); break;
        case 'v': opt.verify = 1; break;
        case 'm': opt.managed = 1; break;
        case 'j': opt.json = 1; break;
        case 'P': fputs(tgs_workload_ptx, stdout); exit(0);
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); exit(2);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "tgs-workload: unexpected argument %s\n", argv[optind]);
        usage(stderr);
        exit(2);
    }
    if (opt.long_kernels > opt.kernels) {
        fprintf(stderr, "tgs-workload: --long-kernels %ld: more than the %ld kernels per iteration (--kernels)\n",
                opt.long_kernels, opt.kernels);
        exit(2);
    }
    if (opt.gap_spread && !opt.gap_us) {
        fprintf(stderr, "tgs-workload: --gap-spread without --gap-us: give the gap it spreads\n");
        exit(2);
    }
    if (opt.host_sync && !opt.host_us) {
        fprintf(stderr, "tgs-workload: --host-sync without --host-us: give the host work it waits for the GPU before\n");
        exit(2);
    }
    if (opt.host_sync_s && !opt.host_sync) {
        fprintf(stderr, "tgs-workload: --host-sync-s without --host-sync: give the synchronisation it limits\n");
        exit(2);
    }
    if (opt.phase_s && !opt.phase_kernels && opt.phase_gap_us < 0) {
        fprintf(stderr, "tgs-workload: --phase-s %g without --phase-kernels or --phase-gap-us: give what changes "
                        "then\n", opt.phase_s);
        exit(2);
    }
    if (!opt.phase_s && (opt.phase_kernels || opt.phase_gap_us >= 0)) {
        fprintf(stderr, "tgs-workload: %s without --phase-s: give how far into the run the phase starts\n",
                opt.phase_kernels ? "--phase-kernels" : "--phase-gap-us");
        exit(2);
    }
    if (opt.phase_kernels && opt.long_kernels > opt.phase_kernels) {
        fprintf(stderr, "tgs-workload: --long-kernels %ld: more than the %ld kernels per iteration of the phase "
                        "(--phase-kernels)\n", opt.long_kernels, opt.phase_kernels);
        exit(2);
    }
    if (opt.phase_kernels && opt.verify) {
        /* --verify expects every slice touched once an iteration */
        fprintf(stderr, "tgs-workload: --verify with --phase-kernels: a phase of other kernels leaves some memory "
                        "touched fewer times than the check expects; give one or the other\n");
        exit(2);
    }
    give_both("--stall-us", opt.stall_us, "--stall-us US: how long each stall is", "--stall-every",
              (double)opt.stall_every, "--stall-every N: a stall after every N-th iteration");
    if (opt.stall_inside && !opt.stall_every) {
        fprintf(stderr, "tgs-workload: --stall-inside without --stall-us and --stall-every: give the stalls it "
                        "moves\n");
        exit(2);
    }
    if (opt.long_us < 0)
        opt.long_us = opt.kernel_us;
    if (opt.warmup_s < 0)
        opt.warmup_s = opt.seconds / 4 < 1 ? opt.seconds / 4 : 1;
    if (opt.warmup_s >= opt.seconds)
        opt.warmup_s = 0;
}

static uint32_t pattern(uint64_t word, uint32_t salt) { return (uint32_t)(word * 2654435761u) ^ salt; }

struct buffer {
    CUdeviceptr ptr;
    size_t bytes;
    uint32_t salt;
};

static void alloc_buffer(struct buffer *b, double mb, uint32_t salt, const char *what) {
    b->bytes = (size_t)(mb * 1048576.0) / 4 * 4;
    b->salt = salt;
    b->ptr = 0;
    if (!b->bytes)
        return;
    if (opt.managed)
        CHECK(cu.MemAllocManaged(&b->ptr, b->bytes, CU_MEM_ATTACH_GLOBAL), what);
    else
        CHECK(cu.MemAlloc(&b->ptr, b->bytes), what);
}

static void write_pattern(struct buffer *b) {
    if (!b->bytes)
        return;
    uint32_t *h = malloc(b->bytes);
    if (!h) {
        fprintf(stderr, "tgs-workload: out of host memory for --verify\n");
        exit(2);
    }
    for (size_t i = 0; i < b->bytes / 4; i++)
        h[i] = pattern(i, b->salt);
    CHECK(cu.MemcpyHtoD(b->ptr, h, b->bytes), "cuMemcpyHtoD_v2");
    free(h);
}

/* Every word the kernels touched got +1 per iteration; every other word is unchanged. */
static int check_pattern(struct buffer *b, uint64_t iterations, uint64_t *bad) {
    if (!b->bytes)
        return 1;
    uint32_t *h = malloc(b->bytes);
    if (!h) {
        fprintf(stderr, "tgs-workload: out of host memory for --verify\n");
        exit(2);
    }
    CHECK(cu.MemcpyDtoH(h, b->ptr, b->bytes), "cuMemcpyDtoH_v2");
    int ok = 1;
    for (size_t i = 0; i < b->bytes / 4; i++) {
        uint64_t addr = (uint64_t)b->ptr + i * 4;
        uint32_t want = pattern(i, b->salt) + (addr % STRIDE == 0 ? (uint32_t)iterations : 0);
        if (h[i] != want) {
            if (ok && !opt.json)
                fprintf(stderr, "tgs-workload: verify: word %zu of buffer %#llx is %#x, expected %#x\n", i,
                        (unsigned long long)b->ptr, h[i], want);
            ok = 0;
            (*bad)++;
        }
    }
    free(h);
    return ok;
}

/* The next of a fixed sequence of draws, uniform in [0, 1) (xorshift64*: the same every run). */
static double draw(void) {
    static uint64_t x = 0x9e3779b97f4a7c15ull;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    return (double)((x * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0;
}

static void sleep_us(double us) {
    if (us <= 0)
        return;
    struct timespec ts = {.tv_sec = (time_t)(us / 1e6), .tv_nsec = (long)((us - (double)(time_t)(us / 1e6) * 1e6) * 1000)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

/* SIGINT or SIGTERM: the run ends after the iteration in progress, as if its time were up */
static volatile sig_atomic_t stop_asked;

static void ask_stop(int sig) {
    (void)sig;
    stop_asked = 1;
}

static void stop_on_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = ask_stop;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

static void report(int summary, double ips, uint64_t it, uint64_t kernels, double elapsed, int have_check, int ok,
                   uint64_t bad) {
    if (opt.json) {
        printf("{\"iterations_per_s\": %.4f, \"iterations\": %llu, \"kernels\": %llu, \"elapsed_s\": %.4f", ips,
               (unsigned long long)it, (unsigned long long)kernels, elapsed);
        if (summary) {
            printf(", \"summary\": true, \"warmup_s\": %.3f", opt.warmup_s);
            if (have_check)
                printf(", \"checksum_ok\": %s, \"bad_words\": %llu", ok ? "true" : "false", (unsigned long long)bad);
        }
        printf("}\n");
    } else if (summary) {
        printf("summary: %.2f iterations/s after %.1f s warm-up, %llu iterations, %llu kernels in %.2f s%s\n", ips,
               opt.warmup_s, (unsigned long long)it, (unsigned long long)kernels, elapsed,
               have_check ? (ok ? ", checksum ok" : ", CHECKSUM MISMATCH") : "");
    } else {
        printf("%8.2f s  %10.2f iterations/s  %llu iterations\n", elapsed, ips, (unsigned long long)it);
    }
    fflush(stdout);
}

int main(int argc, char **argv) {
    parse(argc, argv);
    stop_on_signals();
    load_driver();
    CHECK(cu.Init(0), "cuInit");
    int count = 0;
    CHECK(cu.DeviceGetCount(&count), "cuDeviceGetCount");
    if (opt.device >= count) {
        fprintf(stderr, "tgs-workload: --device %d, but only %d device(s) are visible\n", opt.device, count);
        return 2;
    }
    CUdevice dev;
    CHECK(cu.DeviceGet(&dev, opt.device), "cuDeviceGet");
    int sms = 1;
    CHECK(cu.DeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "cuDeviceGetAttribute");
    CUcontext ctx;
    CHECK(cu.PrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    CHECK(cu.CtxSetCurrent(ctx), "cuCtxSetCurrent");
    CUmodule mod;
    CHECK(cu.ModuleLoadData(&mod, tgs_workload_ptx), "cuModuleLoadData");
    CUfunction step;
    CHECK(cu.ModuleGetFunction(&step, mod, "tgs_step"), "cuModuleGetFunction");

    struct buffer params, acts;
    alloc_buffer(&params, opt.param_mb, 0x5eed1234u, "cuMemAlloc_v2 (parameters)");
    alloc_buffer(&acts, opt.act_mb, 0x0a11ce55u, "cuMemAlloc_v2 (activations)");
    if (opt.verify) {
        write_pattern(&params);
        write_pattern(&acts);
    }
    size_t K = (size_t)opt.kernels; /* each kernel touches a slice of both buffers: as many as either phase has */
    size_t slices = K > (size_t)opt.phase_kernels ? K : (size_t)opt.phase_kernels;
    size_t ps = (params.bytes / slices + STRIDE - 1) / STRIDE * STRIDE;
    size_t as = (acts.bytes / slices + STRIDE - 1) / STRIDE * STRIDE;
    unsigned long long short_ns = (unsigned long long)(opt.kernel_us * 1000.0);
    unsigned long long long_ns = (unsigned long long)(opt.long_us * 1000.0);
    unsigned stride = STRIDE, delta = 1;

    double start = now_s(), last_t = start, next = start + opt.report_s, warm_t = -1, gap_us = opt.gap_us;
    uint64_t it = 0, kernels = 0, last_it = 0, warm_it = 0;
    for (;;) {
        double t = now_s();
        if (t - start >= opt.seconds || (opt.iterations && (long)it >= opt.iterations) || stop_asked)
            break;
        if (opt.phase_s && t - start >= opt.phase_s) {
            K = opt.phase_kernels ? (size_t)opt.phase_kernels : K;
            gap_us = opt.phase_gap_us >= 0 ? opt.phase_gap_us : gap_us;
        }
        for (size_t k = 0; k < K; k++) {
            size_t po = k * ps < params.bytes ? k * ps : params.bytes;
            size_t ao = k * as < acts.bytes ? k * as : acts.bytes;
            unsigned long long a = params.ptr + po, ab = (po + ps <= params.bytes ? ps : params.bytes - po);
            unsigned long long b = acts.ptr + ao, bb = (ao + as <= acts.bytes ? as : acts.bytes - ao);
            int is_long = k + (size_t)opt.long_kernels >= K;
            unsigned long long ns = is_long ? long_ns : short_ns;
            void *args[] = {&ns, &a, &ab, &b, &bb, &stride, &delta};
            /* kernel i of the run is on shape i % shapes: the others on SMs + that many blocks,
             * the long ones on twice the others' largest grid plus that many */
            unsigned shape = (unsigned)((kernels + k) % (uint64_t)opt.shapes);
            unsigned widest = (unsigned)sms + (unsigned)opt.shapes - 1;
            unsigned blocks = is_long ? 2 * widest + shape : (unsigned)sms + shape;
            CHECK(cu.LaunchKernel(step, blocks, 1, 1, 128, 1, 1, 0, NULL, args, NULL), "cuLaunchKernel");
            if (k + 1 == (K + 1) / 2) {
                if (opt.host_sync && (!opt.host_sync_s || t - start < opt.host_sync_s))
                    CHECK(cu.CtxSynchronize(), "cuCtxSynchronize");
                sleep_us(opt.host_us);
                if (opt.stall_inside && stalls(it + 1))
                    sleep_us(opt.stall_us);
            }
        }
        CHECK(cu.CtxSynchronize(), "cuCtxSynchronize");
        it++;
        kernels += K;
        sleep_us(opt.gap_spread ? gap_us * (1 + opt.gap_spread * (2 * draw() - 1)) : gap_us);
        if (!opt.stall_inside && stalls(it))
            sleep_us(opt.stall_us);
        t = now_s();
        if (warm_t < 0 && t - start >= opt.warmup_s) {
            warm_t = t;
            warm_it = it;
        }
        if (t >= next) {
            report(0, (double)(it - last_it) / (t - last_t), it, kernels, t - start, 0, 0, 0);
            last_it = it;
            last_t = t;
            while (next <= t)
                next += opt.report_s;
        }
    }
    double end = now_s();
    int ok = 1;
    uint64_t bad = 0;
    if (opt.verify) {
        ok &= check_pattern(&params, it, &bad);
        ok &= check_pattern(&acts, it, &bad);
    }
    if (warm_t < 0 || end <= warm_t) {
        warm_t = start;
        warm_it = 0;
    }
    report(1, (double)(it - warm_it) / (end - warm_t), it, kernels, end - start, opt.verify, ok, bad);
    if (params.ptr)
        cu.MemFree(params.ptr);
    if (acts.ptr)
        cu.MemFree(acts.ptr);
    return ok ? 0 : 4;
}
