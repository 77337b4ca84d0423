// LoadedModule: a Binary loaded into one CUDA context, the last pipeline stage before launch.
//
// Owns the CUmodule and unloads it on destruction; kernels are looked up by the name expression
// the Source declared, not by mangled name.
//
//   KJIT_ASSIGN_OR_RETURN(auto module, LoadedModule::Load(*driver, binary, ctx));
//   KJIT_ASSIGN_OR_RETURN(CUfunction fn, module->Function("kjit::rms_norm_forward<...>"));
#pragma once

#include <cuda.h>

#include <map>
#include <memory>
#include <string>

#include "jit/binary.h"
#include "jit/driver.h"

namespace kjit::jit {

// The error for cuModuleLoadData's `r` (not CUDA_SUCCESS) on `binary` under a driver of
// `driver_version` (cuDriverGetVersion). A driver older than the major version of the NVRTC that
// built the code (driver 12.2, NVRTC 13) refuses it whatever the arch, and is named as the cause;
// CUDA_ERROR_UNSUPPORTED_PTX_VERSION and an image the GPU cannot run are explained; other codes get
// `otherwise` (the driver's own message). Public for tests: no GPU needed.
absl::Status ModuleLoadError(CUresult r, const char* error_name, int driver_version,
                             const Binary& binary, absl::Status otherwise);

class LoadedModule {
 public:
  // Loads into `ctx` (made current for the call). A PTX binary is JIT-compiled by the driver; the
  // error then explains CUDA_ERROR_UNSUPPORTED_PTX_VERSION.
  static absl::StatusOr<std::shared_ptr<LoadedModule>> Load(const Driver& cu, const Binary& binary,
                                                            CUcontext ctx);
  ~LoadedModule();
  LoadedModule(const LoadedModule&) = delete;
  LoadedModule& operator=(const LoadedModule&) = delete;

  absl::StatusOr<CUfunction> Function(const std::string& name_expression) const;
  CUcontext context() const { return ctx_; }

 private:
  LoadedModule(const Driver& cu, CUmodule module, CUcontext ctx)
      : cu_(cu), module_(module), ctx_(ctx) {}
  const Driver& cu_;
  CUmodule module_;
  CUcontext ctx_;
  std::map<std::string, CUfunction> functions_;
};

}  // namespace kjit::jit
