/* hooks.h: the one table of what libtgs.so intercepts. Each X(symbol) names a driver
 * entry point by the symbol it is exported as (its ABI: cuMemAlloc_v2, cuLaunchKernel_ptsz);
 * the wrapper of that name is defined, with cuda.h's prototype, in one of the shim's
 * files, exported for programs linked to libcuda, and handed out by the dlsym and
 * cuGetProcAddress hooks. tests/test_shim_abi.py checks that table, wrappers and exports
 * agree. */
#ifndef TGS_HOOKS_H
#define TGS_HOOKS_H

#define TGS_HOOKS(X)                                                                         \
    /* initialisation and entry points (intercept.c) */                                   \
    X(cuInit) X(cuGetProcAddress) X(cuGetProcAddress_v2)                                     \
    /* compute (compute.c) */                                                               \
    X(cuLaunchKernel) X(cuLaunchKernel_ptsz) X(cuLaunchKernelEx) X(cuLaunchKernelEx_ptsz)    \
    X(cuLaunchCooperativeKernel) X(cuLaunchCooperativeKernel_ptsz)                           \
    X(cuGraphInstantiate) X(cuGraphInstantiate_v2) X(cuGraphInstantiateWithFlags)            \
    X(cuGraphInstantiateWithParams) X(cuGraphInstantiateWithParams_ptsz) X(cuGraphExecDestroy) \
    X(cuGraphLaunch) X(cuGraphLaunch_ptsz)                                                   \
    X(cuStreamBeginCapture) X(cuStreamBeginCapture_ptsz) X(cuStreamBeginCapture_v2)          \
    X(cuStreamBeginCapture_v2_ptsz) X(cuStreamBeginCaptureToGraph)                           \
    X(cuStreamBeginCaptureToGraph_ptsz) X(cuStreamEndCapture) X(cuStreamEndCapture_ptsz)     \
    X(cuStreamSynchronize) X(cuStreamSynchronize_ptsz) X(cuCtxSynchronize)                   \
    X(cuCtxSynchronize_v2) X(cuEventSynchronize) X(cuMemcpyDtoH_v2) X(cuMemcpyDtoH_v2_ptds)   \
    X(cuEventQuery) X(cuStreamQuery) X(cuStreamQuery_ptsz) X(cuStreamDestroy)                \
    X(cuStreamDestroy_v2) X(cuCtxDestroy_v2) X(cuMemcpy) X(cuMemcpy_ptds)                    \
    X(cuDevicePrimaryCtxRelease_v2) X(cuDevicePrimaryCtxReset_v2)                            \
    /* memory (memory.c) */                                                                 \
    X(cuMemAlloc_v2) X(cuMemAllocPitch_v2) X(cuMemAllocManaged) X(cuMemFree_v2)             \
    X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz) X(cuMemAllocFromPoolAsync)                    \
    X(cuMemAllocFromPoolAsync_ptsz) X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz)                 \
    X(cuMemCreate) X(cuMemRelease) X(cuMemGetInfo_v2) X(cuDeviceTotalMem_v2)                 \
    X(cuPointerGetAttribute) X(cuPointerGetAttributes) X(cuIpcGetMemHandle)

/* Driver entry points the shim calls itself but does not intercept. */
#define TGS_NEEDS(X)                                                                         \
    X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxGetDevice) X(cuDeviceGetUuid_v2)            \
    X(cuDeviceGetUuid) X(cuDriverGetVersion) X(cuStreamCreate) X(cuStreamIsCapturing)        \
    X(cuEventCreate) X(cuEventDestroy_v2) X(cuEventRecord)                                   \
    X(cuEventElapsedTime)                                                                    \
    X(cuGraphGetNodes) X(cuGraphNodeGetType) X(cuGraphKernelNodeGetParams_v2)               \
    X(cuMemAdvise) X(cuMemAdvise_v2) X(cuMemPrefetchAsync) X(cuMemPrefetchAsync_v2)          \
    X(cuGetErrorName)

/* NVML entry points the shim intercepts (nvml.c). */
#define TGS_NVML_HOOKS(X) X(nvmlDeviceGetMemoryInfo) X(nvmlDeviceGetMemoryInfo_v2)

#endif
