#include "jit/loaded_module.h"

#include <charconv>
#include <string>

#include <fmt/format.h>

namespace kjit::jit {

absl::Status ModuleLoadError(CUresult r, const char* error_name, int driver_version,
                             const Binary& binary, absl::Status otherwise) {
  const std::string driver =
      fmt::format("CUDA {}.{}", driver_version / 1000, driver_version % 1000 / 10);
  const std::string code =
      error_name != nullptr ? fmt::format("{}, {}", error_name, int{r}) : std::to_string(int{r});
  int nvrtc_major = 0;
  std::from_chars(binary.nvrtc_version.data(),
                  binary.nvrtc_version.data() + binary.nvrtc_version.size(), nvrtc_major);
  const bool refused_image = r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION ||
                             r == CUDA_ERROR_NO_BINARY_FOR_GPU || r == CUDA_ERROR_INVALID_IMAGE ||
                             r == CUDA_ERROR_INVALID_PTX;
  if (refused_image && driver_version > 0 && driver_version / 1000 < nvrtc_major) {
    // Issue 34, defect 10: not the arch's fault, though NO_BINARY_FOR_GPU reads so.
    return absl::FailedPreconditionError(fmt::format(
        "the driver ({}) is older than the NVRTC {} that built this code for {} (program '{}'), "
        "and loads neither CUBIN nor PTX from a newer CUDA major version ({})\nfix: upgrade the "
        "NVIDIA driver to one for CUDA {}.x, or point KJIT_NVRTC_PATH at a CUDA {}.x NVRTC (run "
        "`kjit doctor`)",
        driver, binary.nvrtc_version, binary.target.ToString(), binary.program_name, code,
        nvrtc_major, driver_version / 1000));
  }
  if (r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION) {
    return absl::FailedPreconditionError(fmt::format(
        "the driver ({}) refused PTX from NVRTC {} for {} "
        "(CUDA_ERROR_UNSUPPORTED_PTX_VERSION)\nfix: upgrade the driver, or use an NVRTC that can "
        "build CUBIN for this GPU (run `kjit doctor`)",
        driver, binary.nvrtc_version, binary.target.ToString()));
  }
  if (r == CUDA_ERROR_NO_BINARY_FOR_GPU || r == CUDA_ERROR_INVALID_IMAGE) {
    return absl::FailedPreconditionError(fmt::format(
        "the GPU cannot run code built for {} (program '{}', {}); fix: compile for the device's "
        "own arch (run `kjit doctor`)",
        binary.target.ToString(), binary.program_name, code));
  }
  return otherwise;
}

absl::StatusOr<std::shared_ptr<LoadedModule>> LoadedModule::Load(const Driver& cu,
                                                                 const Binary& binary,
                                                                 CUcontext ctx) {
  KJIT_RETURN_IF_ERROR(cu.Check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent"));
  CUmodule module = nullptr;
  const CUresult r = cu.cuModuleLoadData(&module, binary.code.data());
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    if (cu.cuGetErrorName == nullptr || cu.cuGetErrorName(r, &name) != CUDA_SUCCESS) name = nullptr;
    return ModuleLoadError(r, name, cu.version(), binary, cu.Check(r, "cuModuleLoadData"));
  }
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
