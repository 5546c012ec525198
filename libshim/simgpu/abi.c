/* simgpu: cuGetProcAddress over the generated ABI table, error names, and the
 * NOT_SUPPORTED answer for everything simgpu does not simulate. */
#define _GNU_SOURCE
#include "driver.h"

#include <string.h>

#define CU_ABI_DECLARE_FOREIGN
#include "cu_abi.h"

struct abi_row {
    const char *base;
    int version;
    int variant;
    const char *symbol;
    void *fn;
};

#define ROW(base, ver, variant, symbol, pfn) {#base, ver, variant, #symbol, (void *)&symbol},
static const struct abi_row g_rows[] = {CU_ABI_TABLE(ROW)};
#undef ROW

/* Picks the row for (symbol, cudaVersion, flags): the newest default row not above the
 * version, replaced by its per-thread twin when asked for and one exists. */
static const struct abi_row *lookup(const char *symbol, int version, int per_thread, int *found_any) {
    const struct abi_row *best = NULL, *pt = NULL;
    *found_any = 0;
    for (size_t i = 0; i < sizeof g_rows / sizeof *g_rows; i++) {
        const struct abi_row *r = &g_rows[i];
        if (strcmp(r->base, symbol))
            continue;
        *found_any = 1;
        if (r->version > version)
            continue;
        if (r->variant == CU_ABI_DEFAULT) {
            if (!best || r->version > best->version)
                best = r;
        } else if (!pt || r->version > pt->version) {
            pt = r;
        }
    }
    if (best && per_thread && pt) {
        size_t n = strlen(best->symbol);
        if (!strncmp(pt->symbol, best->symbol, n) && (!strcmp(pt->symbol + n, "_ptds") || !strcmp(pt->symbol + n, "_ptsz")))
            return pt;
    }
    return best;
}

static CUresult get_proc(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                         CUdriverProcAddressQueryResult *status) {
    if (status)
        *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    if (cudaVersion > SIM_DRIVER_VERSION)
        return CUDA_ERROR_INVALID_VALUE;
    int any;
    const struct abi_row *r = lookup(symbol, cudaVersion, (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0, &any);
    if (!r) {
        if (any && status)
            *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = r->fn;
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
