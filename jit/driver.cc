#include "jit/driver.h"

#include <cstdlib>

#include <fmt/format.h>

namespace kjit::jit {

// Two levels so that cuda.h's aliases (cuMemAlloc -> cuMemAlloc_v2) reach the symbol name.
#define KJIT_STR_INNER(x) #x
#define KJIT_STR(x) KJIT_STR_INNER(x)

// What the loader says when no candidate loads.
constexpr DynLib::Missing kNoDriver{
    absl::StatusCode::kFailedPrecondition,
    "no CUDA driver: libcuda.so.1 could not be loaded ({})\nfix: install the NVIDIA driver; in a "
    "container, run it with the NVIDIA Container Toolkit (docker run --gpus all ...). Compiling "
    "for an explicit --arch works without a driver."};

std::vector<std::string> DefaultDriverCandidates() {
  return CandidatesFor("KJIT_LIBCUDA_PATH", {"libcuda.so.1", "libcuda.so"});
}

absl::StatusOr<Driver> Driver::Load(const std::vector<std::string>& candidates) {
  KJIT_ASSIGN_OR_RETURN(DynLib lib, DynLib::Open(candidates, kNoDriver));
  Driver d(std::move(lib));
  SymbolResolver symbols(d.lib_);
#define KJIT_CU_LOAD(name) symbols.Resolve(d.name, KJIT_STR(name))
  KJIT_CU_LOAD(cuGetErrorName);
  KJIT_CU_LOAD(cuGetErrorString);
  KJIT_CU_LOAD(cuInit);
  KJIT_CU_LOAD(cuDriverGetVersion);
  KJIT_CU_LOAD(cuDeviceGetCount);
  KJIT_CU_LOAD(cuDeviceGet);
  KJIT_CU_LOAD(cuDeviceGetName);
  KJIT_CU_LOAD(cuDeviceGetAttribute);
  KJIT_CU_LOAD(cuDeviceTotalMem);
  KJIT_CU_LOAD(cuDevicePrimaryCtxRetain);
  KJIT_CU_LOAD(cuDevicePrimaryCtxRelease);
  KJIT_CU_LOAD(cuCtxGetCurrent);
  KJIT_CU_LOAD(cuCtxSetCurrent);
  KJIT_CU_LOAD(cuCtxGetDevice);
  KJIT_CU_LOAD(cuCtxSynchronize);
  KJIT_CU_LOAD(cuModuleLoadData);
  KJIT_CU_LOAD(cuModuleUnload);
  KJIT_CU_LOAD(cuModuleGetFunction);
  KJIT_CU_LOAD(cuFuncGetAttribute);
  KJIT_CU_LOAD(cuFuncSetAttribute);
  KJIT_CU_LOAD(cuLaunchKernel);
  KJIT_CU_LOAD(cuLaunchKernelEx);
  KJIT_CU_LOAD(cuOccupancyMaxActiveBlocksPerMultiprocessor);
  KJIT_CU_LOAD(cuMemGetInfo);
  KJIT_CU_LOAD(cuMemAlloc);
  KJIT_CU_LOAD(cuMemFree);
  KJIT_CU_LOAD(cuMemcpyHtoD);
  KJIT_CU_LOAD(cuMemcpyDtoH);
  KJIT_CU_LOAD(cuMemcpyDtoDAsync);
  KJIT_CU_LOAD(cuMemsetD8Async);
  KJIT_CU_LOAD(cuMemsetD16Async);
  KJIT_CU_LOAD(cuMemsetD32Async);
  KJIT_CU_LOAD(cuStreamCreate);
  KJIT_CU_LOAD(cuStreamDestroy);
  KJIT_CU_LOAD(cuStreamSynchronize);
  KJIT_CU_LOAD(cuStreamIsCapturing);
  KJIT_CU_LOAD(cuStreamWaitEvent);
  KJIT_CU_LOAD(cuStreamBeginCapture);
  KJIT_CU_LOAD(cuStreamEndCapture);
  KJIT_CU_LOAD(cuGraphInstantiateWithFlags);
  KJIT_CU_LOAD(cuGraphLaunch);
  KJIT_CU_LOAD(cuGraphExecDestroy);
  KJIT_CU_LOAD(cuGraphDestroy);
  KJIT_CU_LOAD(cuEventCreate);
  KJIT_CU_LOAD(cuEventDestroy);
  KJIT_CU_LOAD(cuEventRecord);
  KJIT_CU_LOAD(cuEventSynchronize);
  KJIT_CU_LOAD(cuEventElapsedTime);
  KJIT_CU_LOAD(cuTensorMapEncodeTiled);
#undef KJIT_CU_LOAD
  KJIT_RETURN_IF_ERROR(symbols.Check(
      "the driver is too old for kjit; fix: install a driver for CUDA 12.0 or newer"));
  CUresult init = d.cuInit(0);
  if (init == CUDA_ERROR_STUB_LIBRARY) {
    return absl::FailedPreconditionError(fmt::format(
        "{} is the CUDA toolkit's stub driver (CUDA_ERROR_STUB_LIBRARY, 34), not a real driver\n"
        "fix: remove the toolkit's stubs/ directory from LD_LIBRARY_PATH and install the NVIDIA "
        "driver (in a container: run with --gpus all and the NVIDIA Container Toolkit)",
        d.path()));
  }
  if (init == CUDA_ERROR_NO_DEVICE) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return absl::FailedPreconditionError(fmt::format(
        "the CUDA driver ({}) sees no GPU (CUDA_ERROR_NO_DEVICE); CUDA_VISIBLE_DEVICES={}\nfix: "
        "check nvidia-smi, unset CUDA_VISIBLE_DEVICES, or in a container pass --gpus all",
        d.path(), visible ? visible : "(unset)"));
  }
  KJIT_RETURN_IF_ERROR(d.Check(init, "cuInit"));
  KJIT_RETURN_IF_ERROR(d.Check(d.cuDriverGetVersion(&d.version_), "cuDriverGetVersion"));
  return d;
}

absl::StatusOr<const Driver*> Driver::Get() {
  return LoadedOnce<Driver>(+[] { return Load(DefaultDriverCandidates()); });
}

absl::Status Driver::Check(CUresult result, const char* call) const {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  const char* name = nullptr;
  const char* text = nullptr;
  cuGetErrorName(result, &name);
  cuGetErrorString(result, &text);
  return absl::InternalError(fmt::format("{} failed: {} ({}): {}", call, name ? name : "?",
                                         static_cast<int>(result), text ? text : ""));
}

absl::StatusOr<DeviceInfo> QueryDevice(const Driver& cu, int ordinal) {
  int count = 0;
  KJIT_RETURN_IF_ERROR(cu.Check(cu.cuDeviceGetCount(&count), "cuDeviceGetCount"));
  if (ordinal < 0 || ordinal >= count) {
    return absl::InvalidArgumentError(
        fmt::format("device: ordinal {} is out of range, {} device(s) visible", ordinal, count));
  }
  CUdevice dev;
  KJIT_RETURN_IF_ERROR(cu.Check(cu.cuDeviceGet(&dev, ordinal), "cuDeviceGet"));
  DeviceInfo info;
  info.ordinal = ordinal;
  char name[256] = {};
  KJIT_RETURN_IF_ERROR(cu.Check(cu.cuDeviceGetName(name, sizeof(name), dev), "cuDeviceGetName"));
  info.name = name;
  auto attr = [&](CUdevice_attribute a, int* out) {
    return cu.Check(cu.cuDeviceGetAttribute(out, a, dev), "cuDeviceGetAttribute");
  };
  KJIT_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &info.cc_major));
  KJIT_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &info.cc_minor));
  KJIT_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, &info.sm_count));
  KJIT_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                            &info.max_shared_per_block_optin));
  KJIT_RETURN_IF_ERROR(cu.Check(cu.cuDeviceTotalMem(&info.total_memory, dev), "cuDeviceTotalMem"));
  return info;
}

}  // namespace kjit::jit
