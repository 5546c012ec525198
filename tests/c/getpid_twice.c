#define _GNU_SOURCE
#include <cuda.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(void) {
    int ok = getpid() == (pid_t)syscall(SYS_getpid);
    CUresult r = cuInit(0); /* and CUDA still reaches the driver through the shim */
    int n = -1;
    cuDeviceGetCount(&n);
    printf("getpid %s, cuInit %d, devices %d\n", ok ? "ok" : "WRONG", (int)r, n);
    return ok && r == CUDA_SUCCESS && n > 0 ? 0 : 1;
}
