/* A stand-in for libcuda that lets the GPU suite run on a machine without a GPU, so that every
 * kernel the suite builds is compiled there and cached (scripts/gpu/prepare.sh's compile-only pass;
 * issue 44: compile on the CPU, run on the GPU). It reports one Hopper GPU with an H100's facts
 * (sm_90, 132 SMs, 227 KiB of opt-in shared memory, 80 GiB), keeps "device" memory in host memory,
 * and launches nothing: every result the tests read back is wrong, so the tests fail; only the
 * kernel cache they leave behind is of use.
 *
 *   KJIT_LIBCUDA_PATH=build/tests/libkjit_stand_in_driver.so KJIT_CACHE_DIR=/tmp/kernels \
 *     build/tests/kjit_gpu_tests > /dev/null   # then /tmp/kernels holds the suite's programs
 *
 * Device memory beyond KJIT_STAND_IN_MEMORY_MIB (default 8192) in all is refused as out of memory,
 * so that the suite's largest tests cannot exhaust this machine. cuda.h's macros give each entry
 * point the versioned name the real driver exports (cuMemAlloc is cuMemAlloc_v2). */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */
#include <cuda.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static const char kName[] = "NVIDIA H100 80GB HBM3 (kjit stand-in driver, no GPU)";
static const size_t kTotalMemory = 80ull << 30;
static _Atomic size_t allocated;

static size_t memory_cap(void) {
  const char* mib = getenv("KJIT_STAND_IN_MEMORY_MIB");
  return (mib ? strtoull(mib, NULL, 10) : 8192) << 20;
}

/* Allocations carry their size in a 64-byte header, so that cuMemFree can unmap them. */
enum { kHeader = 64 };

CUresult cuMemAlloc(CUdeviceptr* ptr, size_t bytes) {
  if (!ptr) return CUDA_ERROR_INVALID_VALUE;
  size_t total = atomic_fetch_add(&allocated, bytes) + bytes;
  if (total > memory_cap()) {
    atomic_fetch_sub(&allocated, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  void* base = mmap(NULL, bytes + kHeader, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    atomic_fetch_sub(&allocated, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  memcpy(base, &bytes, sizeof bytes);
  *ptr = (CUdeviceptr)((char*)base + kHeader);
  return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr ptr) {
  if (!ptr) return CUDA_SUCCESS;
  char* base = (char*)ptr - kHeader;
  size_t bytes;
  memcpy(&bytes, base, sizeof bytes);
  atomic_fetch_sub(&allocated, bytes);
  munmap(base, bytes + kHeader);
  return CUDA_SUCCESS;
}

CUresult cuMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (total_bytes) *total_bytes = kTotalMemory;
  if (free_bytes) *free_bytes = kTotalMemory - (1ull << 30) - atomic_load(&allocated);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t bytes) {
  memcpy((void*)dst, src, bytes);
  return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t bytes) {
  memcpy(dst, (const void*)src, bytes);
  return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s) {
  (void)s;
  memmove((void*)dst, (const void*)src, bytes);
  return CUDA_SUCCESS;
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream s) {
  (void)s;
  memset((void*)dst, value, n);
  return CUDA_SUCCESS;
}
CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short value, size_t n, CUstream s) {
  (void)s;
  for (size_t i = 0; i < n; ++i) ((unsigned short*)dst)[i] = value;
  return CUDA_SUCCESS;
}
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t n, CUstream s) {
  (void)s;
  for (size_t i = 0; i < n; ++i) ((unsigned int*)dst)[i] = value;
  return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char** name) {
  if (name) *name = error == CUDA_SUCCESS ? "CUDA_SUCCESS" : "CUDA_ERROR (stand-in driver)";
  return CUDA_SUCCESS;
}
CUresult cuGetErrorString(CUresult error, const char** text) {
  if (text)
    *text = error == CUDA_ERROR_OUT_OF_MEMORY ? "out of the stand-in's memory cap"
                                              : "kjit's stand-in driver has no GPU";
  return CUDA_SUCCESS;
}

CUresult cuInit(unsigned int flags) {
  (void)flags;
  return CUDA_SUCCESS;
}
CUresult cuDriverGetVersion(int* version) {
  *version = 13000;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetCount(int* count) {
  *count = 1;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *device = 0;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetName(char* name, int length, CUdevice device) {
  (void)device;
  if (length <= 0) return CUDA_ERROR_INVALID_VALUE;
  strncpy(name, kName, (size_t)length - 1);
  name[length - 1] = '\0';
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  (void)device;
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = 132; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *value = 232448; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *value = 32; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *value = 50 << 20; break;
    default: return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}
CUresult cuDeviceTotalMem(size_t* bytes, CUdevice device) {
  (void)device;
  *bytes = kTotalMemory;
  return CUDA_SUCCESS;
}

/* One context, one dummy handle for every module, function, stream, event and graph. */
static char handle;
CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
  (void)device;
  *ctx = (CUcontext)&handle;
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease(CUdevice device) {
  (void)device;
  return CUDA_SUCCESS;
}
CUresult cuCtxGetCurrent(CUcontext* ctx) {
  *ctx = (CUcontext)&handle;
  return CUDA_SUCCESS;
}
CUresult cuCtxSetCurrent(CUcontext ctx) {
  (void)ctx;
  return CUDA_SUCCESS;
}
CUresult cuCtxGetDevice(CUdevice* device) {
  *device = 0;
  return CUDA_SUCCESS;
}
CUresult cuCtxSynchronize(void) { return CUDA_SUCCESS; }

CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  (void)image;
  *module = (CUmodule)&handle;
  return CUDA_SUCCESS;
}
CUresult cuModuleUnload(CUmodule module) {
  (void)module;
  return CUDA_SUCCESS;
}
CUresult cuModuleGetFunction(CUfunction* function, CUmodule module, const char* name) {
  (void)module;
  (void)name;
  *function = (CUfunction)&handle;
  return CUDA_SUCCESS;
}
CUresult cuFuncGetAttribute(int* value, CUfunction_attribute attribute, CUfunction function) {
  (void)function;
  switch (attribute) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *value = 32; break;
    default: *value = 0; break;
  }
  return CUDA_SUCCESS;
}
CUresult cuFuncSetAttribute(CUfunction function, CUfunction_attribute attribute, int value) {
  (void)function;
  (void)attribute;
  (void)value;
  return CUDA_SUCCESS;
}
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, CUfunction function,
                                                     int block_size, size_t shared_bytes) {
  (void)function;
  (void)shared_bytes;
  *blocks = block_size > 0 ? 2048 / block_size : 1;
  if (*blocks < 1) *blocks = 1;
  return CUDA_SUCCESS;
}
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                        CUstream stream, void** params, void** extra) {
  (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared;
  (void)stream, (void)params, (void)extra;
  return CUDA_SUCCESS;
}
CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  (void)config, (void)f, (void)params, (void)extra;
  return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream* stream, unsigned int flags) {
  (void)flags;
  *stream = (CUstream)&handle;
  return CUDA_SUCCESS;
}
CUresult cuStreamDestroy(CUstream stream) {
  (void)stream;
  return CUDA_SUCCESS;
}
CUresult cuStreamSynchronize(CUstream stream) {
  (void)stream;
  return CUDA_SUCCESS;
}
CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus* status) {
  (void)stream;
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}
CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  (void)stream, (void)event, (void)flags;
  return CUDA_SUCCESS;
}
CUresult cuStreamBeginCapture(CUstream stream, CUstreamCaptureMode mode) {
  (void)stream, (void)mode;
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  (void)stream, (void)graph;
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  (void)exec, (void)graph, (void)flags;
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  (void)exec, (void)stream;
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult cuGraphExecDestroy(CUgraphExec exec) {
  (void)exec;
  return CUDA_SUCCESS;
}
CUresult cuGraphDestroy(CUgraph graph) {
  (void)graph;
  return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent* event, unsigned int flags) {
  (void)flags;
  *event = (CUevent)&handle;
  return CUDA_SUCCESS;
}
CUresult cuEventDestroy(CUevent event) {
  (void)event;
  return CUDA_SUCCESS;
}
CUresult cuEventRecord(CUevent event, CUstream stream) {
  (void)event, (void)stream;
  return CUDA_SUCCESS;
}
CUresult cuEventSynchronize(CUevent event) {
  (void)event;
  return CUDA_SUCCESS;
}
CUresult cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  (void)start, (void)end;
  *ms = 1.0f;
  return CUDA_SUCCESS;
}

CUresult cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank,
                                void* address, const cuuint64_t* dims, const cuuint64_t* strides,
                                const cuuint32_t* box, const cuuint32_t* element_strides,
                                CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill fill) {
  (void)type, (void)rank, (void)address, (void)dims, (void)strides, (void)box;
  (void)element_strides, (void)interleave, (void)swizzle, (void)l2, (void)fill;
  memset(map, 0, sizeof *map);
  return CUDA_SUCCESS;
}
