// The CUDA driver API, opened at run time.
//
// libcuda.so.1 comes with the GPU driver, not the toolkit, so kjit never links it: programs start
// without it and report its absence as an error with a fix. KJIT_LIBCUDA_PATH overrides the search.
//
//   KJIT_ASSIGN_OR_RETURN(const Driver* cu, Driver::Get());
//   KJIT_RETURN_IF_ERROR(cu->Check(cu->cuCtxSynchronize(), "cuCtxSynchronize"));
#pragma once

#include <cuda.h>

#include <string>
#include <vector>

#include "jit/dynlib.h"
#include "kjit/device_info.h"
#include "kjit/status.h"

namespace kjit::jit {

class Driver {
 public:
  // Loaded and cuInit()ed once per process; failures (no libcuda, stub library, no device) are
  // remembered and returned as FailedPrecondition with a fix.
  static absl::StatusOr<const Driver*> Get();
  // Loads and initializes from explicit candidates; for tests and `kjit doctor`.
  static absl::StatusOr<Driver> Load(const std::vector<std::string>& candidates);

  const std::string& path() const { return lib_.path(); }
  // e.g. 13000 for CUDA 13.0.
  int version() const { return version_; }

  // Converts a CUresult into a Status naming the call and the driver's error name.
  absl::Status Check(CUresult result, const char* call) const;

#define KJIT_CU_FN(name) decltype(&::name) name = nullptr
  KJIT_CU_FN(cuGetErrorName);
  KJIT_CU_FN(cuGetErrorString);
  KJIT_CU_FN(cuInit);
  KJIT_CU_FN(cuDriverGetVersion);
  KJIT_CU_FN(cuDeviceGetCount);
  KJIT_CU_FN(cuDeviceGet);
  KJIT_CU_FN(cuDeviceGetName);
  KJIT_CU_FN(cuDeviceGetAttribute);
  KJIT_CU_FN(cuDeviceTotalMem);
  KJIT_CU_FN(cuDevicePrimaryCtxRetain);
  KJIT_CU_FN(cuDevicePrimaryCtxRelease);
  KJIT_CU_FN(cuCtxGetCurrent);
  KJIT_CU_FN(cuCtxSetCurrent);
  KJIT_CU_FN(cuCtxGetDevice);
  KJIT_CU_FN(cuCtxSynchronize);
  KJIT_CU_FN(cuModuleLoadData);
  KJIT_CU_FN(cuModuleUnload);
  KJIT_CU_FN(cuModuleGetFunction);
  KJIT_CU_FN(cuFuncGetAttribute);
  KJIT_CU_FN(cuFuncSetAttribute);
  KJIT_CU_FN(cuLaunchKernel);
  KJIT_CU_FN(cuLaunchKernelEx);
  KJIT_CU_FN(cuOccupancyMaxActiveBlocksPerMultiprocessor);
  KJIT_CU_FN(cuMemGetInfo);
  KJIT_CU_FN(cuMemAlloc);
  KJIT_CU_FN(cuMemFree);
  KJIT_CU_FN(cuMemcpyHtoD);
  KJIT_CU_FN(cuMemcpyDtoH);
  KJIT_CU_FN(cuMemcpyDtoDAsync);
  KJIT_CU_FN(cuMemsetD8Async);
  KJIT_CU_FN(cuMemsetD16Async);
  KJIT_CU_FN(cuMemsetD32Async);
  KJIT_CU_FN(cuStreamCreate);
  KJIT_CU_FN(cuStreamDestroy);
  KJIT_CU_FN(cuStreamSynchronize);
  KJIT_CU_FN(cuStreamIsCapturing);
  KJIT_CU_FN(cuStreamWaitEvent);
  KJIT_CU_FN(cuStreamBeginCapture);
  KJIT_CU_FN(cuStreamEndCapture);
  KJIT_CU_FN(cuGraphInstantiateWithFlags);
  KJIT_CU_FN(cuGraphLaunch);
  KJIT_CU_FN(cuGraphExecDestroy);
  KJIT_CU_FN(cuGraphDestroy);
  KJIT_CU_FN(cuEventCreate);
  KJIT_CU_FN(cuEventDestroy);
  KJIT_CU_FN(cuEventRecord);
  KJIT_CU_FN(cuEventSynchronize);
  KJIT_CU_FN(cuEventElapsedTime);
  KJIT_CU_FN(cuTensorMapEncodeTiled);
#undef KJIT_CU_FN

 private:
  explicit Driver(DynLib lib) : lib_(std::move(lib)) {}
  DynLib lib_;
  int version_ = 0;
};

std::vector<std::string> DefaultDriverCandidates();

// The properties kjit specializes for, read once per device.
// The GPU facts kjit uses (kjit/runtime.h's public struct).
using DeviceInfo = kjit::DeviceInfo;
absl::StatusOr<DeviceInfo> QueryDevice(const Driver& cu, int ordinal);

}  // namespace kjit::jit
