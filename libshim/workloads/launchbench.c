/* tgs-launchbench: what one kernel launch costs. Launches zero-length kernels from one
 * thread and reports the nanoseconds spent inside cuLaunchKernel per launch (synchronising
 * every 256 launches, outside the timed part). Reaches the driver as tgs-workload does
 * (dlopen + cuGetProcAddress_v2), so under libtgs.so it measures the wrappers cudart gets.
 *   tgs-launchbench LAUNCHES        prints {"launches": N, "ns_per_launch": X} */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels.h"

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

#define CHECK(x)                                                     \
    do {                                                             \
        CUresult _r = (x);                                           \
        if (_r != CUDA_SUCCESS) {                                    \
            fprintf(stderr, "tgs-launchbench: %s failed: %d\n", #x, (int)_r); \
            return 1;                                                \
        }                                                            \
    } while (0)

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100000;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "tgs-launchbench: no CUDA driver: %s\n", dlerror());
        return 2;
    }
    PFN_cuGetProcAddress_v12000 gpa = (PFN_cuGetProcAddress_v12000)dlsym(h, "cuGetProcAddress_v2");
    PFN_cuInit_v2000 init;
    PFN_cuDevicePrimaryCtxRetain_v7000 retain;
    PFN_cuCtxSetCurrent_v4000 set_current;
    PFN_cuModuleLoadData_v2000 load;
    PFN_cuModuleGetFunction_v2000 get_function;
    PFN_cuLaunchKernel_v4000 launch;
    PFN_cuCtxSynchronize_v2000 sync;
    CUdriverProcAddressQueryResult st;
    CHECK(gpa("cuInit", (void **)&init, 2000, 0, &st));
    CHECK(gpa("cuDevicePrimaryCtxRetain", (void **)&retain, 7000, 0, &st));
    CHECK(gpa("cuCtxSetCurrent", (void **)&set_current, 4000, 0, &st));
    CHECK(gpa("cuModuleLoadData", (void **)&load, 2000, 0, &st));
    CHECK(gpa("cuModuleGetFunction", (void **)&get_function, 2000, 0, &st));
    CHECK(gpa("cuLaunchKernel", (void **)&launch, 4000, 0, &st));
    CHECK(gpa("cuCtxSynchronize", (void **)&sync, 2000, 0, &st));
    CHECK(init(0));
    CUcontext ctx;
    CHECK(retain(&ctx, 0));
    CHECK(set_current(ctx));
    CUmodule m;
    CHECK(load(&m, tgs_workload_ptx));
    CUfunction f;
    CHECK(get_function(&f, m, "tgs_spin"));
    unsigned long long zero = 0;
    void *args[] = {&zero};
    CHECK(launch(f, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL)); /* warm: the first launch initialises things */
    CHECK(sync());
    double in_launch = 0;
    for (long done = 0; done < n;) {
        long batch = n - done < 256 ? n - done : 256;
        double t0 = now_ns();
        for (long i = 0; i < batch; i++)
            launch(f, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL);
        in_launch += now_ns() - t0;
        CHECK(sync());
        done += batch;
    }
    printf("{\"launches\": %ld, \"ns_per_launch\": %.2f}\n", n, in_launch / (double)n);
    return 0;
}
