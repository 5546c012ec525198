/* simgpu: cuGetProcAddress over the generated ABI table, error names, and the
 * NOT_SUPPORTED answer for everything simgpu does not simulate. */
#define _GNU_SOURCE
#include "driver.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CU_ABI_DECLARE_FOREIGN
#include "cu_abi.h"

#include "cu_abi_lookup.h"

/* The function behind each row, in the table's order. */
#define FN(base, ver, variant, symbol, pfn) (void *)&symbol,
static void *const g_fns[] = {CU_ABI_TABLE(FN)};
#undef FN

/* SIMGPU_LOG_GETPROC=FILE: every request is appended to FILE (symbol cudaVersion flags),
 * the format of tests/data/cudart-13.0-getprocaddress.txt: simgpu as a logging driver. */
static void log_request(const char *symbol, int version, cuuint64_t flags) {
    static int fd = -2;
    if (fd == -2) {
        const char *path = getenv("SIMGPU_LOG_GETPROC");
        fd = path && *path ? open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
    }
    if (fd < 0)
        return;
    char line[256];
    int n = snprintf(line, sizeof line, "%s %d %llu\n", symbol && *symbol ? symbol : "\"\"", version,
                     (unsigned long long)flags);
    if (n > 0 && write(fd, line, (size_t)(n < (int)sizeof line ? n : (int)sizeof line - 1)) < 0)
        fd = -1;
}

static CUresult get_proc(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                         CUdriverProcAddressQueryResult *status) {
    log_request(symbol, cudaVersion, flags);
    if (status)
        *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    if (cudaVersion > SIM_DRIVER_VERSION)
        return CUDA_ERROR_INVALID_VALUE;
    int any;
    const struct cu_abi_row *r =
        cu_abi_lookup(symbol, cudaVersion, (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0, &any);
    if (!r) {
        if (any && status)
            *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = g_fns[r - cu_abi_rows];
    if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                             CUdriverProcAddressQueryResult *symbolStatus) {
    return get_proc(symbol, pfn, cudaVersion, flags, symbolStatus);
}

SIM_API CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return get_proc(symbol, pfn, cudaVersion, flags, NULL);
}

struct err_row {
    int code;
    const char *name, *desc;
};
#define ERR(code, name, desc) {code, name, desc},
static const struct err_row g_errors[] = {CU_ERROR_TABLE(ERR)};
#undef ERR

static const struct err_row *error_of(CUresult e) {
    for (size_t i = 0; i < sizeof g_errors / sizeof *g_errors; i++)
        if (g_errors[i].code == (int)e)
            return &g_errors[i];
    return NULL;
}

SIM_API CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr) {
    const struct err_row *r = error_of(error);
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    *pStr = r ? r->name : NULL;
    return r ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_API CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr) {
    const struct err_row *r = error_of(error);
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    *pStr = r ? r->desc : NULL;
    return r ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_HIDDEN CUresult sim_unsupported(const char *name);
CUresult sim_unsupported(const char *name) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static const char *seen[256];
    static int nseen;
    if (g_sim.forked)
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    int known = 0;
    for (int i = 0; i < nseen && !known; i++)
        known = seen[i] == name;
    if (!known && nseen < 256)
        seen[nseen++] = name;
    pthread_mutex_unlock(&lock);
    if (!known)
        sim_log(SIM_LOG_WARN, "%s is not simulated: returning CUDA_ERROR_NOT_SUPPORTED", name);
    return CUDA_ERROR_NOT_SUPPORTED;
}
