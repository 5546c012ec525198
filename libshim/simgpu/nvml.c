/* simgpu: NVML (libnvidia-ml.so.1) from the same shared state as the driver.
 *
 * Implements what monitoring and tgsd's GPU layer ask for; any other NVML function is
 * simply absent, as on drivers that lack it (pynvml reports it as not found). NVML sees
 * the devices SIMGPU_VISIBLE_DEVICES allows (what the container runtime would expose);
 * CUDA_VISIBLE_DEVICES does not apply to NVML, as with the real library. */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include "sim.h"

#include <nvml.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define NVML_API SIM_API

struct nvml_dev {
    int dev; /* index into the shared devices */
};
static struct nvml_dev g_handles[SIM_MAX_DEVICES];
static int g_refs;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

NVML_API nvmlReturn_t DECLDIR nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&g_lock);
    int r = sim_open_state();
    if (r == 0) {
        for (int i = 0; i < SIM_MAX_DEVICES; i++)
            g_handles[i].dev = g_sim.nml_map[i];
        g_refs++;
    }
    pthread_mutex_unlock(&g_lock);
    if (r == -1)
        return NVML_ERROR_INVALID_ARGUMENT;
    return r == 0 ? NVML_SUCCESS : NVML_ERROR_DRIVER_NOT_LOADED;
}

NVML_API nvmlReturn_t DECLDIR nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
NVML_API nvmlReturn_t DECLDIR nvmlInit(void) { return nvmlInitWithFlags(0); }

NVML_API nvmlReturn_t DECLDIR nvmlShutdown(void) {
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t r = g_refs > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (g_refs > 0)
        g_refs--;
    pthread_mutex_unlock(&g_lock);
    return r;
}

static int ready(void) { return g_refs > 0; }

static struct sim_device *dev_of(nvmlDevice_t h) {
    struct nvml_dev *n = (struct nvml_dev *)h;
    if (!ready() || n < g_handles || n >= g_handles + g_sim.nml_visible)
        return NULL;
    return &g_sim.st->dev[n->dev];
}

NVML_API const char *DECLDIR nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    default: return "Unknown Error";
    }
}

NVML_API nvmlReturn_t DECLDIR nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!version || length < 12)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(version, length, "simgpu-13.0");
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t DECLDIR nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    if (!version || length < 12)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(version, length, "13.simgpu");
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t DECLDIR nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = SIM_DRIVER_VERSION;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t DECLDIR nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

NVML_API nvmlReturn_t DECLDIR nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    if (!ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = (unsigned)g_sim.nml_visible;
    return NVML_SUCCESS;
}
NVML_API nvmlReturn_t DECLDIR nvmlDeviceGetCount(unsigned int *deviceCount) { return nvmlDeviceGetCount_v2(deviceCount); }

NVML_API nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= (unsigned)g_sim.nml_visible)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = (nvmlDevice_t)&g_handles[index];
    return NVML_SUCCESS;
}
NVML_API nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

NVML_API nvmlReturn_t DECLDIR nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < g_sim.nml_visible; i++) {
        if (!strcmp(g_sim.st->dev[g_handles[i].dev].uuid, uuid)) {
            *device = (nvmlDevice_t)&g_handles[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

NVML_API nvmlReturn_t DECLDIR nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    if (!dev_of(device) || !index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)((struct nvml_dev *)device - g_handles);
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t DECLDIR nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    struct sim_device *d = dev_of(device);
    if (!d || !minorNumber)
        return NVML_ERROR_INVALID_ARGUMENT;
    *minorNumber = (unsigned)(d - g_sim.st->dev);
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t DECLDIR nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    struct sim_device *d = dev_of(device);
    if (!d || !name)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (length <= strlen(d->name))
        return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(name, length, "%s", d->name);
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t DECLDIR nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    struct sim_device *d = dev_of(device);
    if (!d || !uuid)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (length <= strlen(d->uuid))
        return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(uuid, length, "%s", d->uuid);
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t DECLDIR nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    struct sim_device *d = dev_of(device);
    if (!d || !major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = (int)d->cc_major;
    *minor = (int)d->cc_minor;
    return NVML_SUCCESS;
}

static void memory(struct sim_device *d, unsigned long long *total, unsigned long long *used) {
    sim_lock_device(d);
    eng_advance(d, sim_now());
    *total = d->total_mem;
    *used = d->device_bytes + d->resident_pages * SIM_PAGE;
    if (*used > *total)
        *used = *total;
    sim_unlock_device(d);
}

NVML_API nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *mem) {
    struct sim_device *d = dev_of(device);
    if (!d || !mem)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory(d, &mem->total, &mem->used);
    mem->free = mem->total - mem->used;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *mem) {
    struct sim_device *d = dev_of(device);
    if (!d || !mem)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (mem->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory(d, &mem->total, &mem->used);
    mem->reserved = 0;
    mem->free = mem->total - mem->used;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t DECLDIR nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    struct sim_device *d = dev_of(device);
    if (!d || !utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    sim_lock_device(d);
    uint64_t now = sim_now();
    eng_advance(d, now);
    uint64_t dt, busy = sim_busy_since(d->util, d->util_head, d->busy_ns, now, 1000000000ull, &dt);
    sim_unlock_device(d);
    unsigned pct = dt ? (unsigned)(busy * 100 / dt) : 0;
    utilization->gpu = pct > 100 ? 100 : pct;
    utilization->memory = utilization->gpu / 2;
    return NVML_SUCCESS;
}

typedef struct {
    unsigned pid;
    unsigned long long used;
} proc_row;

static int processes(struct sim_device *d, proc_row *rows, int max) {
    int n = 0;
    sim_lock_device(d);
    eng_advance(d, sim_now());
    for (uint32_t i = 0; i < d->ctx_hi; i++) {
        struct sim_ctx *c = &d->ctx[i];
        if (c->state != CTX_LIVE)
            continue;
        if (n < max)
            rows[n] = (proc_row){(unsigned)c->pid, c->device_bytes + c->resident_pages * SIM_PAGE};
        n++;
    }
    sim_unlock_device(d);
    return n;
}

#define PROCESS_QUERY(NAME, TYPE, FILL)                                                               \
    NVML_API nvmlReturn_t DECLDIR NAME(nvmlDevice_t device, unsigned int *infoCount, TYPE *infos) {   \
        struct sim_device *d = dev_of(device);                                                        \
        if (!d || !infoCount)                                                                         \
            return NVML_ERROR_INVALID_ARGUMENT;                                                       \
        proc_row rows[SIM_MAX_CTX];                                                                   \
        int n = processes(d, rows, SIM_MAX_CTX);                                                      \
        if (!infos || *infoCount < (unsigned)n) {                                                     \
            unsigned had = *infoCount;                                                                \
            *infoCount = (unsigned)n;                                                                 \
            return n == 0 && had == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;                  \
        }                                                                                             \
        for (int i = 0; i < n; i++) {                                                                 \
            memset(&infos[i], 0, sizeof infos[i]);                                                    \
            infos[i].pid = rows[i].pid;                                                               \
            infos[i].usedGpuMemory = rows[i].used;                                                    \
            FILL;                                                                                     \
        }                                                                                             \
        *infoCount = (unsigned)n;                                                                     \
        return NVML_SUCCESS;                                                                          \
    }

PROCESS_QUERY(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t,
              (infos[i].gpuInstanceId = 0xffffffffu, infos[i].computeInstanceId = 0xffffffffu))
PROCESS_QUERY(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_v2_t,
              (infos[i].gpuInstanceId = 0xffffffffu, infos[i].computeInstanceId = 0xffffffffu))
PROCESS_QUERY(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t, (void)0)

NVML_API nvmlReturn_t DECLDIR nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                              nvmlProcessUtilizationSample_t *utilization,
                                                              unsigned int *processSamplesCount,
                                                              unsigned long long lastSeenTimeStamp) {
    struct sim_device *d = dev_of(device);
    if (!d || !processSamplesCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long long now_us = (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000;
    uint64_t window = 1000000000ull;
    if (lastSeenTimeStamp && lastSeenTimeStamp < now_us && (now_us - lastSeenTimeStamp) * 1000ull < window)
        window = (now_us - lastSeenTimeStamp) * 1000ull;
    nvmlProcessUtilizationSample_t rows[SIM_MAX_CTX];
    int n = 0;
    sim_lock_device(d);
    uint64_t now = sim_now();
    eng_advance(d, now);
    for (uint32_t i = 0; i < d->ctx_hi; i++) {
        struct sim_ctx *c = &d->ctx[i];
        if (c->state != CTX_LIVE)
            continue;
        uint64_t dt, busy = sim_busy_since(c->util, c->util_head, c->busy_ns, now, window, &dt);
        unsigned pct = dt ? (unsigned)(busy * 100 / dt) : 0;
        rows[n++] = (nvmlProcessUtilizationSample_t){.pid = (unsigned)c->pid, .timeStamp = now_us,
                                                     .smUtil = pct > 100 ? 100 : pct};
    }
    sim_unlock_device(d);
    if (!utilization || *processSamplesCount < (unsigned)n) {
        *processSamplesCount = (unsigned)n;
        return n == 0 ? NVML_ERROR_NOT_FOUND : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(utilization, rows, (size_t)n * sizeof *rows);
    *processSamplesCount = (unsigned)n;
    return NVML_SUCCESS;
}
