// NVRTC, opened at run time.
//
// libnvrtc is KJIT_NVRTC_PATH when set (only it: a path that does not load is an error naming the
// variable, never replaced by another NVRTC), else found on the loader's path, then in the
// toolkit's usual places; a missing NVRTC is an error that says how to install it, never a crash.
// The libnvrtc-builtins of its version is loaded from beside it (pip's nvidia-cuda-nvrtc puts both
// in a folder the loader does not search), so compiles work wherever libnvrtc was found.
//
//   KJIT_ASSIGN_OR_RETURN(const Nvrtc* nvrtc, Nvrtc::Get());
//   fmt::print("NVRTC {}.{} from {}\n", nvrtc->version().major, nvrtc->version().minor,
//              nvrtc->path());
#pragma once

#include <nvrtc.h>

#include <optional>
#include <string>
#include <vector>

#include "jit/dynlib.h"
#include "kjit/status.h"

namespace kjit::jit {

struct NvrtcVersion {
  int major = 0;
  int minor = 0;
  std::string ToString() const { return std::to_string(major) + "." + std::to_string(minor); }
};

class Nvrtc {
 public:
  // The process-wide instance, loaded on first use (LoadDefault). The error (NotFound) is
  // remembered too.
  static absl::StatusOr<const Nvrtc*> Get();
  // Loads from DefaultNvrtcCandidates(); a KJIT_NVRTC_PATH that does not load (missing, not a
  // library, not NVRTC) is an error that names the variable and its value.
  static absl::StatusOr<Nvrtc> LoadDefault();
  // Loads from explicit candidates; for tests and `kjit doctor`.
  static absl::StatusOr<Nvrtc> Load(const std::vector<std::string>& candidates);

  const std::string& path() const { return lib_.path(); }
  NvrtcVersion version() const { return version_; }
  // Real compute capabilities, e.g. {75, 80, ..., 120}, as nvrtcGetSupportedArchs reports them.
  const std::vector<int>& supported_archs() const { return archs_; }

  // Converts an nvrtcResult into a Status naming the call.
  absl::Status Check(nvrtcResult result, const char* call) const;

  KJIT_DYNLIB_FN(nvrtcGetErrorString);
  KJIT_DYNLIB_FN(nvrtcVersion);
  KJIT_DYNLIB_FN(nvrtcGetNumSupportedArchs);
  KJIT_DYNLIB_FN(nvrtcGetSupportedArchs);
  KJIT_DYNLIB_FN(nvrtcCreateProgram);
  KJIT_DYNLIB_FN(nvrtcDestroyProgram);
  KJIT_DYNLIB_FN(nvrtcCompileProgram);
  KJIT_DYNLIB_FN(nvrtcGetProgramLogSize);
  KJIT_DYNLIB_FN(nvrtcGetProgramLog);
  KJIT_DYNLIB_FN(nvrtcGetPTXSize);
  KJIT_DYNLIB_FN(nvrtcGetPTX);
  KJIT_DYNLIB_FN(nvrtcGetCUBINSize);
  KJIT_DYNLIB_FN(nvrtcGetCUBIN);
  KJIT_DYNLIB_FN(nvrtcAddNameExpression);
  KJIT_DYNLIB_FN(nvrtcGetLoweredName);

 private:
  explicit Nvrtc(DynLib lib) : lib_(std::move(lib)) {}
  DynLib lib_;
  // libnvrtc-builtins, loaded from beside lib_ so that lib_'s compiles find it (Load's comment).
  std::optional<DynLib> builtins_;
  NvrtcVersion version_;
  std::vector<int> archs_;
};

// Where Get() looks, in order: KJIT_NVRTC_PATH alone when set, else the usual places.
std::vector<std::string> DefaultNvrtcCandidates();

}  // namespace kjit::jit
