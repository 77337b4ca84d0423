#include "jit/loaded_module.h"

#include <fmt/format.h>

namespace kjit::jit {

absl::StatusOr<std::shared_ptr<LoadedModule>> LoadedModule::Load(const Driver& cu,
                                                                 const Binary& binary,
                                                                 CUcontext ctx) {
  KJIT_RETURN_IF_ERROR(cu.Check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent"));
  CUmodule module = nullptr;
  CUresult r = cu.cuModuleLoadData(&module, binary.code.data());
  if (r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION) {
    return absl::FailedPreconditionError(fmt::format(
        "the driver (CUDA {}.{}) refused PTX from NVRTC {} for {} "
        "(CUDA_ERROR_UNSUPPORTED_PTX_VERSION)\nfix: upgrade the driver, or use an NVRTC that can "
        "build CUBIN for this GPU (run `kjit doctor`)",
        cu.version() / 1000, cu.version() % 1000 / 10, binary.nvrtc_version,
        binary.target.ToString()));
  }
  if (r == CUDA_ERROR_NO_BINARY_FOR_GPU || r == CUDA_ERROR_INVALID_IMAGE) {
    return absl::FailedPreconditionError(fmt::format(
        "the GPU cannot run code built for {} (program '{}'); fix: compile for the device's own "
        "arch (run `kjit doctor`)",
        binary.target.ToString(), binary.program_name));
  }
  KJIT_RETURN_IF_ERROR(cu.Check(r, "cuModuleLoadData"));
  std::shared_ptr<LoadedModule> loaded(new LoadedModule(cu, module, ctx));
  for (const auto& [expr, lowered] : binary.lowered_names) {
    CUfunction fn = nullptr;
    KJIT_RETURN_IF_ERROR(
        cu.Check(cu.cuModuleGetFunction(&fn, module, lowered.c_str()), "cuModuleGetFunction"));
    loaded->functions_[expr] = fn;
  }
  return loaded;
}

LoadedModule::~LoadedModule() {
  if (module_ != nullptr) cu_.cuModuleUnload(module_);
}

absl::StatusOr<CUfunction> LoadedModule::Function(const std::string& name_expression) const {
  auto it = functions_.find(name_expression);
  if (it == functions_.end()) {
    return absl::NotFoundError(fmt::format("no kernel '{}' in this module", name_expression));
  }
  return it->second;
}

}  // namespace kjit::jit
