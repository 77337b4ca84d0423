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

  KJIT_DYNLIB_FN(cuGetErrorName);
  KJIT_DYNLIB_FN(cuGetErrorString);
  KJIT_DYNLIB_FN(cuInit);
  KJIT_DYNLIB_FN(cuDriverGetVersion);
  KJIT_DYNLIB_FN(cuDeviceGetCount);
  KJIT_DYNLIB_FN(cuDeviceGet);
  KJIT_DYNLIB_FN(cuDeviceGetName);
  KJIT_DYNLIB_FN(cuDeviceGetAttribute);
  KJIT_DYNLIB_FN(cuDeviceTotalMem);
  KJIT_DYNLIB_FN(cuDevicePrimaryCtxRetain);
  KJIT_DYNLIB_FN(cuDevicePrimaryCtxRelease);
  KJIT_DYNLIB_FN(cuCtxGetCurrent);
  KJIT_DYNLIB_FN(cuCtxSetCurrent);
  KJIT_DYNLIB_FN(cuCtxGetDevice);
  KJIT_DYNLIB_FN(cuCtxSynchronize);
  KJIT_DYNLIB_FN(cuModuleLoadData);
  KJIT_DYNLIB_FN(cuModuleUnload);
  KJIT_DYNLIB_FN(cuModuleGetFunction);
  KJIT_DYNLIB_FN(cuFuncGetAttribute);
  KJIT_DYNLIB_FN(cuFuncSetAttribute);
  KJIT_DYNLIB_FN(cuLaunchKernel);
  KJIT_DYNLIB_FN(cuLaunchKernelEx);
  KJIT_DYNLIB_FN(cuOccupancyMaxActiveBlocksPerMultiprocessor);
  KJIT_DYNLIB_FN(cuMemGetInfo);
  KJIT_DYNLIB_FN(cuMemAlloc);
  KJIT_DYNLIB_FN(cuMemFree);
  KJIT_DYNLIB_FN(cuMemcpyHtoD);
  KJIT_DYNLIB_FN(cuMemcpyDtoH);
  KJIT_DYNLIB_FN(cuMemcpyDtoDAsync);
  KJIT_DYNLIB_FN(cuMemsetD8Async);
  KJIT_DYNLIB_FN(cuMemsetD16Async);
  KJIT_DYNLIB_FN(cuMemsetD32Async);
  KJIT_DYNLIB_FN(cuStreamCreate);
  KJIT_DYNLIB_FN(cuStreamDestroy);
  KJIT_DYNLIB_FN(cuStreamSynchronize);
  KJIT_DYNLIB_FN(cuStreamIsCapturing);
  KJIT_DYNLIB_FN(cuStreamWaitEvent);
  KJIT_DYNLIB_FN(cuStreamBeginCapture);
  KJIT_DYNLIB_FN(cuStreamEndCapture);
  KJIT_DYNLIB_FN(cuGraphInstantiateWithFlags);
  KJIT_DYNLIB_FN(cuGraphLaunch);
  KJIT_DYNLIB_FN(cuGraphExecDestroy);
  KJIT_DYNLIB_FN(cuGraphDestroy);
  KJIT_DYNLIB_FN(cuEventCreate);
  KJIT_DYNLIB_FN(cuEventDestroy);
  KJIT_DYNLIB_FN(cuEventRecord);
  KJIT_DYNLIB_FN(cuEventSynchronize);
  KJIT_DYNLIB_FN(cuEventElapsedTime);
  KJIT_DYNLIB_FN(cuTensorMapEncodeTiled);

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
