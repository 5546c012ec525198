/* libtgs.so: NVML's memory queries report the container's view, as cuMemGetInfo does. */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include "tgs.h"

#include <nvml.h>
#include <string.h>

TGS_HIDDEN int tgs_memory_view(struct tgs_gpu *g, uint64_t *total, uint64_t *used);

static struct tgs_gpu *gpu_of_nvml(nvmlDevice_t dev) {
    static __typeof__(&nvmlDeviceGetUUID) get_uuid;
    if (!get_uuid)
        get_uuid = (__typeof__(get_uuid))tgs_real_nvml("nvmlDeviceGetUUID");
    char uuid[96];
    if (!get_uuid || get_uuid(dev, uuid, sizeof uuid) != NVML_SUCCESS || !tgs_ready())
        return NULL;
    for (unsigned i = 0; i < g_tgs.daemon->ngpus && i < TGS_MAX_GPUS; i++) {
        char have[TGS_UUID_LEN];
        for (unsigned k = 0; k < TGS_UUID_LEN; k++)
            have[k] = g_tgs.gpu[i].budget->uuid[k];
        have[TGS_UUID_LEN - 1] = 0;
        if (!strcmp(have, uuid))
            return &g_tgs.gpu[i];
    }
    return NULL;
}

/* The container's view of the device's memory, where the device is one of its GPUs. */
static int container_view(nvmlDevice_t dev, uint64_t *total, uint64_t *used) {
    struct tgs_gpu *g = gpu_of_nvml(dev);
    return g && tgs_memory_view(g, total, used);
}

TGS_API nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    static __typeof__(&nvmlDeviceGetMemoryInfo) real;
    if (!real && !(real = (__typeof__(real))tgs_real_nvml("nvmlDeviceGetMemoryInfo")))
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = real(device, memory);
    uint64_t t, u;
    if (r == NVML_SUCCESS && memory && container_view(device, &t, &u)) {
        memory->total = t;
        memory->used = u;
        memory->free = t - u;
    }
    return r;
}

TGS_API nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    static __typeof__(&nvmlDeviceGetMemoryInfo_v2) real;
    if (!real && !(real = (__typeof__(real))tgs_real_nvml("nvmlDeviceGetMemoryInfo_v2")))
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = real(device, memory);
    uint64_t t, u;
    if (r == NVML_SUCCESS && memory && container_view(device, &t, &u)) {
        memory->total = t;
        memory->used = u;
        memory->reserved = 0;
        memory->free = t - u;
    }
    return r;
}
